//! Routes, the JSON extractor and the fallbacks. Handlers parse, call the domain and map
//! the outcome; they hold no business logic.

use crate::auth::Principal;
use crate::error::ApiError;
use crate::exec;
use crate::files;
use crate::programmatic;
use crate::AppState;
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Extension;
use axum::{Json, Router};
use sandcall_api::{
    error_type, CancelRequest, ErrorBody, ExecRequest, ExecResponse, Health, ProgrammaticRequest, ProgrammaticResponse,
};
use serde::de::DeserializeOwned;

/// A JSON body whose every failure (content type, size, syntax, types) is an ApiError.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
            let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
            let mime = ct.split(';').next().unwrap_or("").trim();
            if !(mime == "application/json" || mime.ends_with("+json")) {
                return Err(ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    error_type::UNSUPPORTED_MEDIA_TYPE,
                    format!("expected Content-Type: application/json, got {mime:?}"),
                ));
            }
        }
        let bytes = read_body(req.into_body(), state.config.max_body_bytes()).await?;
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| {
            use serde_json::error::Category;
            match e.classify() {
                Category::Syntax | Category::Eof | Category::Io => ApiError::new(
                    StatusCode::BAD_REQUEST,
                    error_type::INVALID_JSON,
                    format!("malformed JSON: {e}"),
                ),
                Category::Data => ApiError::bad_request(format!("invalid request: {e}")),
            }
        })
    }
}

/// How long the rest of a refused body is read and thrown away before the answer.
pub const DRAIN_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// The whole body, at most `limit` bytes. A longer one is refused with 413, but read on
/// and thrown away first (for at most `DRAIN_FOR`): a client that sends its whole body
/// before it reads the answer, as most do, then gets the 413 rather than a connection
/// reset by the bytes the server never read.
async fn read_body(body: axum::body::Body, limit: usize) -> Result<axum::body::Bytes, ApiError> {
    use http_body_util::BodyExt;
    let mut body = body;
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::bad_request(format!("could not read the request body: {e}")))?;
        let Some(data) = frame.data_ref() else { continue };
        if bytes.len() + data.len() > limit {
            let drain = async { while let Some(Ok(_)) = body.frame().await {} };
            let _ = tokio::time::timeout(DRAIN_FOR, drain).await;
            return Err(ApiError::too_large(format!(
                "the request body is larger than the server accepts ({limit} bytes)"
            )));
        }
        bytes.extend_from_slice(data);
    }
    Ok(bytes.into())
}

/// Path parameters whose every failure (bad percent-encoding, bytes that are not UTF-8) is
/// an ApiError, like `JsonBody` for bodies.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(ApiPath(value)),
            Err(rejection) => Err(ApiError::bad_request(format!(
                "invalid path: {}",
                rejection.body_text()
            ))),
        }
    }
}

pub fn router(state: AppState) -> Router {
    let body_limit = state.config.max_body_bytes();
    let mut router = Router::new();
    if state.config.fault_injection {
        router = router.route("/v1/_fault/panic", get(injected_panic));
    }
    router
        .route("/v1/health", get(health))
        .route("/openapi.json", get(openapi_route))
        .route("/v1/exec", post(exec_route))
        .route("/v1/exec/programmatic", post(programmatic_route))
        .route("/v1/exec/programmatic/cancel", post(cancel_route))
        .route("/v1/exec/programmatic/{session_id}", get(session_route))
        .route(
            "/v1/upload",
            post(files::routes::upload).layer(axum::extract::DefaultBodyLimit::max(files::routes::upload_limit(
                &state.config,
            ))),
        )
        .route("/v1/download/{session_id}/{file_id}", get(files::routes::download))
        .route("/v1/files/{session_id}", get(files::routes::list))
        .route("/v1/files/{session_id}/{file_id}", delete(files::routes::remove))
        .route(
            "/v1/sessions/{session_id}/objects/{file_id}",
            get(files::routes::object),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::auth::authenticate,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panic_response))
        .with_state(state)
}

/// 200 while programs can run; 503 with the reason while sandboxes cannot be built.
#[utoipa::path(
    get,
    path = "/v1/health",
    operation_id = "health",
    tag = "health",
    responses(
        (status = 200, description = "Programs can run.", body = Health),
        (status = 503, description = "Sandboxes cannot be built now; `reason` says why.", body = Health),
    ),
)]
pub(crate) async fn health(State(state): State<AppState>) -> Response {
    let reason = state.sandbox_unavailable().await;
    let code = if reason.is_some() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let body = Json(Health {
        status: if reason.is_some() { "unavailable" } else { "ok" }.into(),
        reason,
        version: env!("CARGO_PKG_VERSION").into(),
        cgroup: state.runner.settings().cgroups.version().into(),
        active_runs: state.admission.active(),
        max_concurrent_runs: state.admission.capacity(),
        warm_idle: state.pool.idle(),
    });
    (code, body).into_response()
}

/// Runs a program to its end and answers with its outcome.
#[utoipa::path(
    post,
    path = "/v1/exec",
    operation_id = "exec",
    tag = "exec",
    request_body = ExecRequest,
    responses(
        (status = 200, description = "The program ran; `status` says how it ended.", body = ExecResponse,
            headers(("sandcall-sandbox" = String, description = "`warm` or `cold`: which kind of sandbox ran it."))),
        (status = 400, description = "`invalid_json`, `invalid_request` or `unsupported_language`.", body = ErrorBody),
        (status = 404, description = "`file_not_found`: an input file does not exist.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: the body, `code`, `stdin` or the input files.", body = ErrorBody),
        (status = 503, description = "`at_capacity`: every run slot is busy and the queue is full.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
    ),
)]
pub(crate) async fn exec_route(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    JsonBody(req): JsonBody<ExecRequest>,
) -> Result<Response, ApiError> {
    let cmd = exec::parse_exec(req, &state.config)?;
    let (result, warm) = state.execute(&principal, cmd).await?;
    let mut response = Json(result).into_response();
    // (extension) Which kind of sandbox ran the program, for benchmarks and tests.
    let kind = if warm { "warm" } else { "cold" };
    response
        .headers_mut()
        .insert("sandcall-sandbox", axum::http::HeaderValue::from_static(kind));
    Ok(response)
}

/// Starts a program that may call tools (with `code`), or resumes one with the results of
/// its calls (with `continuation_token`).
#[utoipa::path(
    post,
    path = "/v1/exec/programmatic",
    operation_id = "exec_programmatic",
    tag = "programmatic",
    request_body = ProgrammaticRequest,
    responses(
        (status = 200, description = "The program paused on tool calls, completed, or ended in an error.", body = ProgrammaticResponse),
        (status = 400, description = "`invalid_json`, `invalid_request`, `unsupported_language`, `invalid_tool_schema` or `invalid_tool_results`.", body = ErrorBody),
        (status = 404, description = "`session_not_found` or `file_not_found`.", body = ErrorBody),
        (status = 409, description = "`continuation_token_used`: the token's pause is no longer open.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: the body, `code` or the input files.", body = ErrorBody),
        (status = 503, description = "`at_capacity`: too many sessions hold a sandbox.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
    ),
)]
pub(crate) async fn programmatic_route(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    JsonBody(req): JsonBody<ProgrammaticRequest>,
) -> Result<Json<ProgrammaticResponse>, ApiError> {
    let response = match req.continuation_token.as_deref() {
        Some(token) => {
            let results = req.tool_results.as_deref().unwrap_or_default();
            state
                .sessions
                .resume(&principal, token, req.session_id.as_deref(), results)
                .await?
        }
        None => {
            // Declaring the tools compiles up to 100 schemas: each is bounded
            // (programmatic::tools), together they are still milliseconds of work, done
            // off the async workers.
            let config = state.config.clone();
            let cmd = tokio::task::spawn_blocking(move || programmatic::parse_start(req, &config))
                .await
                .map_err(|e| ApiError::internal(error_type::INTERNAL, &format!("declaring tools: {e}")))??;
            state.sessions.start(&principal, cmd).await?
        }
    };
    Ok(Json(response))
}

/// Ends a session: its program is killed and its sandbox freed.
#[utoipa::path(
    post,
    path = "/v1/exec/programmatic/cancel",
    operation_id = "cancel_session",
    tag = "programmatic",
    request_body = CancelRequest,
    responses(
        (status = 200, description = "The session's outcome: `error` / `cancelled`, or how it had already ended.", body = ProgrammaticResponse),
        (status = 400, description = "`invalid_json` or `invalid_request`.", body = ErrorBody),
        (status = 404, description = "`session_not_found`.", body = ErrorBody),
    ),
)]
pub(crate) async fn cancel_route(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    JsonBody(req): JsonBody<CancelRequest>,
) -> Result<Json<ProgrammaticResponse>, ApiError> {
    Ok(Json(state.sessions.cancel(&principal, &req.session_id).await?))
}

/// A session's state: paused, running, or how it ended.
#[utoipa::path(
    get,
    path = "/v1/exec/programmatic/{session_id}",
    operation_id = "get_session",
    tag = "programmatic",
    params(("session_id" = String, Path, description = "The session's id.")),
    responses(
        (status = 200, description = "The session's state.", body = ProgrammaticResponse),
        (status = 404, description = "`session_not_found`.", body = ErrorBody),
    ),
)]
pub(crate) async fn session_route(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(session_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    // Already JSON: a paused session's answer is serialized once, not per GET.
    let json = state.sessions.status(&principal, &session_id)?;
    Ok(([(header::CONTENT_TYPE, "application/json")], json).into_response())
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
    let text = DOCUMENT.get_or_init(crate::openapi::document).clone();
    ([(header::CONTENT_TYPE, "application/json")], text).into_response()
}

/// Only with `fault_injection`: a handler that panics.
async fn injected_panic() -> Response {
    panic!("fault injection: a panic inside a request handler")
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, error_type::NOT_FOUND, "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        error_type::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
    )
}

fn panic_response(err: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let detail = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into());
    ApiError::internal(error_type::INTERNAL, &format!("handler panicked: {detail}")).into_response()
}
