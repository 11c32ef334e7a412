//! LibreChat's execution profiles (`execution_profile`, docs/librechat.md): a client
//! that expects the other profile than this server's is refused before anything runs
//! (`check`), and every response names the server's (`announce`).

use crate::error::ApiError;
use crate::AppState;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sandcall_api::{error_type, EXECUTION_PROFILE_HEADER, EXPECTED_PROFILE_HEADER};
use sandcall_config::ExecutionProfile;

/// What a request's `X-CodeAPI-Expected-Profile` asks of a server of `profile`: `None`
/// when nothing (no header, or the server's own profile), else the refusal.
pub fn refusal(expected: Option<&[u8]>, profile: ExecutionProfile) -> Option<Response> {
    let expected = expected?;
    let Some(wanted) = std::str::from_utf8(expected).ok().and_then(ExecutionProfile::parse) else {
        return Some(
            ApiError::bad_request("`X-CodeAPI-Expected-Profile` must be `default` or `stateful`").into_response(),
        );
    };
    if wanted == profile {
        return None;
    }
    sandcall_engine::telemetry::refused(error_type::EXECUTION_PROFILE_MISMATCH);
    // LibreChat's client reads `error` (or `code`) as the reason's name, as the Code
    // Interpreter API sends it; `message` says it in words.
    let body = serde_json::json!({
        "error": error_type::EXECUTION_PROFILE_MISMATCH,
        "error_type": error_type::EXECUTION_PROFILE_MISMATCH,
        "message": format!(
            "this server's execution profile is `{}`, the request expects `{}`",
            profile.as_str(),
            wanted.as_str()
        ),
        "execution_profile": profile.as_str(),
        "expected_profile": wanted.as_str(),
    });
    Some((StatusCode::CONFLICT, axum::Json(body)).into_response())
}

/// Middleware, behind authentication: 409 `execution_profile_mismatch` for a request
/// that expects the other profile, 400 for a header that names none.
pub async fn check(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let expected = req.headers().get(EXPECTED_PROFILE_HEADER).map(|v| v.as_bytes());
    if let Some(refused) = refusal(expected, state.config.files.execution_profile) {
        return refused;
    }
    next.run(req).await
}

/// Middleware, outside everything else: `X-CodeAPI-Execution-Profile` on every response.
pub async fn announce(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let mut response = next.run(req).await;
    let profile = state.config.files.execution_profile.as_str();
    response
        .headers_mut()
        .insert(EXECUTION_PROFILE_HEADER, HeaderValue::from_static(profile));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_other_profile_is_refused() {
        use ExecutionProfile::{Default, Stateful};
        assert!(refusal(None, Default).is_none());
        assert!(refusal(None, Stateful).is_none());
        assert!(refusal(Some(b"default"), Default).is_none());
        assert!(refusal(Some(b"stateful"), Stateful).is_none());
        assert_eq!(
            refusal(Some(b"stateful"), Default).unwrap().status(),
            StatusCode::CONFLICT
        );
        assert_eq!(
            refusal(Some(b"default"), Stateful).unwrap().status(),
            StatusCode::CONFLICT
        );
        for bad in [&b"Stateful"[..], b"", b"\xff", b"warm"] {
            assert_eq!(refusal(Some(bad), Default).unwrap().status(), StatusCode::BAD_REQUEST);
        }
    }
}
