//! The one route list (`routes`), from which both the router and the OpenAPI
//! document's paths are built, and the middleware every route runs behind.

use crate::extract::body_deadline;
use crate::files;
use crate::http::*;
use crate::AppState;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt};
use utoipa_axum::routes;

/// Every route the OpenAPI document describes, each built from its handler's
/// `#[utoipa::path]` (`routes!`): the one list from which both the router (`router`) and
/// the document's paths (`document`, with `Config::default()`, whose limits the
/// document does not show) are made. A route added here is served and described.
pub(crate) fn routes(config: &crate::config::Config) -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(health))
        .routes(routes!(crate::telemetry::scrape))
        .routes(routes!(openapi_route))
        .routes(routes!(runtimes_route))
        .routes(routes!(exec_route))
        .routes(routes!(programmatic_route).layer(axum::extract::DefaultBodyLimit::max(
            config.max_programmatic_body_bytes(),
        )))
        .routes(routes!(cancel_route))
        .routes(routes!(session_route))
        .routes(routes!(calls_route))
        .routes(
            routes!(files::routes::upload).layer(axum::extract::DefaultBodyLimit::max(files::routes::upload_limit(
                config,
            ))),
        )
        .routes(
            routes!(files::routes::upload_batch).layer(axum::extract::DefaultBodyLimit::max(
                files::routes::batch_upload_limit(config),
            )),
        )
        .routes(routes!(files::routes::download))
        .routes(routes!(files::routes::list))
        .routes(routes!(files::routes::remove))
        .routes(routes!(files::routes::object))
}

pub fn router(state: AppState) -> Router {
    let body_limit = state.config.max_body_bytes();
    let mut router = Router::new();
    if state.config.host.fault_injection {
        router = router.route("/v1/_fault/panic", get(injected_panic));
    }
    let (described, _) = routes(&state.config).split_for_parts();
    router
        .merge(described)
        // MCP over streamable HTTP (docs/mcp.md, not the OpenAPI document), behind
        // `authenticate` like every route.
        .route("/mcp", crate::mcp::route(state.clone()))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Inside authentication: the rate is the principal's.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::rate_limit::limit,
        ))
        // Inside authentication: only a caller learns the profile's refusal.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::profile::check,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::auth::authenticate,
        ))
        .layer(axum::middleware::from_fn(crate::telemetry::observe))
        .layer(axum::middleware::from_fn_with_state(state.clone(), body_deadline))
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panic_response))
        // Outside everything: every response names the execution profile.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::profile::announce,
        ))
        .with_state(state)
}

/// The document, as served and checked in: pretty JSON with a final newline.
pub fn document() -> String {
    crate::openapi::document(routes(&Default::default()).into_openapi())
}

/// This API's OpenAPI document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    tag = "health",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API.", content_type = "application/json", body = Object)),
)]
pub(crate) async fn openapi_route() -> Response {
    static DOCUMENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let text = DOCUMENT.get_or_init(document).clone();
    ([(header::CONTENT_TYPE, "application/json")], text).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checked-in copy must be what the code generates. To refresh it:
    /// `cargo run -- openapi > docs/openapi.json`.
    #[test]
    fn the_checked_in_document_matches_the_code() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            checked_in == document(),
            "docs/openapi.json differs from the generated document; \
             regenerate it with `cargo run -- openapi > docs/openapi.json`"
        );
    }

    /// `Common` adds the shared answers to the methods it knows: an operation of another
    /// method (a `head` or `options` route added to `routes`) would lack them.
    #[test]
    fn every_operation_has_the_shared_answers() {
        let doc: serde_json::Value = serde_json::from_str(&document()).unwrap();
        let paths = doc["paths"].as_object().unwrap();
        assert!(!paths.is_empty());
        for (path, item) in paths {
            let methods = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];
            for (method, op) in item.as_object().unwrap() {
                if !methods.contains(&method.as_str()) {
                    continue;
                }
                for status in ["401", "403", "421", "500"] {
                    assert!(op["responses"][status].is_object(), "{method} {path} lacks {status}");
                }
            }
        }
    }
}
