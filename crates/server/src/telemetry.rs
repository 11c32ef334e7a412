//! The HTTP side of telemetry: the span each request runs in, its count and time by its
//! route's template, and `GET /metrics`. What is counted, and the recorder, are the
//! engine's (`sandcall_engine::telemetry`).

use crate::error::ApiError;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sandcall_api::error_type;
pub use sandcall_engine::telemetry::*;
use std::time::Instant;

/// The middleware: each request runs in a span (method, route, and the session id once
/// a handler knows it: `tracing::Span::current().record("session_id", ..)`), and is
/// counted and timed by its route's template, never by its raw path.
pub async fn observe(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().as_str().to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| route_label(p.as_str()));
    let span = tracing::info_span!(
        "request",
        method = %method,
        route = %route,
        session_id = tracing::field::Empty,
    );
    let response = tracing::Instrument::instrument(next.run(req), span).await;
    let status = response.status().as_u16().to_string();
    let labels = [("method", method), ("route", route), ("status", status)];
    metrics::counter!(REQUESTS, &labels).increment(1);
    metrics::histogram!(REQUEST_SECONDS, &labels).record(started.elapsed().as_secs_f64());
    response
}

/// A route's template as a label: `/v1/files/:session_id` for `/v1/files/{session_id}`
/// (the form most dashboards use, and one without braces, which some text-format
/// readers take for the end of the labels).
fn route_label(template: &str) -> String {
    template
        .split('/')
        .map(|part| match part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
            Some(name) => format!(":{name}"),
            None => part.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// `GET /metrics`: every metric in Prometheus's text format, the gauges read now
/// (extension). The operator's: a scraper sends `metrics_token` (`authenticate`); no
/// tenant's API key or JWT opens it, for it shows every tenant's activity.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "health",
    responses(
        (status = 200, description = "The server's metrics in Prometheus's text exposition format (docs/metrics.md).", content_type = "text/plain", body = String),
        (status = 401, description = "`unauthorized`: not the operator's `metrics_token` (a tenant's API key or JWT is refused too); without `metrics_token` set, always on a server with credentials.", body = sandcall_api::ErrorBody),
    ),
)]
pub async fn scrape(State(state): State<crate::AppState>) -> Result<Response, ApiError> {
    for (language, preloaded, n) in state.pool.idle_by_set() {
        let name = sandcall_engine::runtime::languages::name(language, &state.config).to_owned();
        metrics::gauge!(WARM_IDLE, "language" => name, "preloaded" => preloaded.to_string()).set(n as f64);
    }
    let (live, paused) = state.sessions.counts();
    metrics::gauge!(SESSIONS_LIVE).set(live as f64);
    metrics::gauge!(SESSIONS_PAUSED).set(paused as f64);
    if let Some(dormant) = state.sessions.dormant_count().await {
        metrics::gauge!(SESSIONS_DORMANT).set(dormant as f64);
    }
    metrics::gauge!(SESSIONS_IN_MEMORY).set(state.sessions.entries() as f64);
    metrics::gauge!(ENDED_TRAIL_BYTES).set(state.sessions.ended_trail_bytes() as f64);
    let Some(text) = render() else {
        return Err(ApiError::internal(
            error_type::INTERNAL,
            "metrics recorder not installed",
        ));
    };
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn route_labels_name_parameters_with_a_colon() {
        assert_eq!(super::route_label("/v1/exec"), "/v1/exec");
        assert_eq!(
            super::route_label("/v1/download/{session_id}/{file_id}"),
            "/v1/download/:session_id/:file_id"
        );
    }
}
