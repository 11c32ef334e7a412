//! Routes, the JSON extractor and the fallbacks. Handlers parse, call the domain and map
//! the outcome; they hold no business logic.

use crate::error::ApiError;
use crate::exec;
use crate::files;
use crate::programmatic;
use crate::AppState;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Extension;
use axum::{Json, Router};
use hyper::body::{Frame, SizeHint};
use sandcall_api::{
    error_type, CancelRequest, ErrorBody, ExecRequest, ExecResponse, Health, ProgrammaticRequest, ProgrammaticResponse,
};
use sandcall_auth::Principal;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt};
use utoipa_axum::routes;

/// A JSON body whose every failure (content type, size, syntax, types) is an ApiError.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + Send + 'static> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let unsupported = |message: String| {
            ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                error_type::UNSUPPORTED_MEDIA_TYPE,
                message,
            )
        };
        match req.headers().get(header::CONTENT_TYPE) {
            Some(ct) => {
                let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
                let mime = ct.split(';').next().unwrap_or("").trim();
                if !(mime == "application/json" || mime.ends_with("+json")) {
                    return Err(unsupported(format!(
                        "expected Content-Type: application/json, got {mime:?}"
                    )));
                }
            }
            // A web page can send a body without a Content-Type (or with one of the
            // CORS-safelisted types, refused above) without a preflight; in local
            // mode, where no key stands in its way, a JSON body must say it is JSON.
            None if state.auth.local_mode() => {
                return Err(unsupported(
                    "expected Content-Type: application/json (required in local mode)".into(),
                ))
            }
            None => {}
        }
        // A resume carries tool results of up to max_tool_result_bytes each.
        let limit = if req.uri().path() == "/v1/exec/programmatic" {
            state.config.max_programmatic_body_bytes()
        } else {
            state.config.max_body_bytes()
        };
        let bytes = read_body(req.into_body(), limit).await?;
        sandcall_engine::json::parse(bytes).await.map(JsonBody).map_err(|e| {
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
        let frame = frame.map_err(|e| {
            if body_timed_out(&e) {
                request_timeout()
            } else {
                ApiError::bad_request(format!("could not read the request body: {e}"))
            }
        })?;
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

/// The error a request body gives when it has not arrived whole by its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within body_read_timeout_ms")]
pub struct BodyTimeout;

/// Whether `error`, or an error it wraps, is a `BodyTimeout`. Body readers wrap the
/// body's errors in their own (multipart does, twice).
pub(crate) fn body_timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<BodyTimeout>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// 408: the body did not arrive in time.
pub(crate) fn request_timeout() -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        error_type::REQUEST_TIMEOUT,
        "the request body did not arrive in time (body_read_timeout_ms)",
    )
}

/// Middleware: every request's body must arrive whole within `body_read_timeout_ms` of
/// its headers, or reading it fails with `BodyTimeout` (answered 408 by the reader). A
/// client that sends half a body and stalls would otherwise hold its handler, and the
/// connection, for as long as it likes.
pub async fn body_deadline(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let body = if body.is_end_stream() {
        body
    } else {
        Body::new(DeadlineBody {
            body,
            deadline: tokio::time::Instant::now() + Duration::from_millis(state.config.listen.body_read_timeout_ms),
            timer: None,
        })
    };
    let mut response = next.run(Request::from_parts(parts, body)).await;
    if response.status() == StatusCode::REQUEST_TIMEOUT {
        // The rest of the body may still be on its way: the connection cannot carry
        // another request.
        response
            .headers_mut()
            .insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    }
    response
}

/// A request body that fails with `BodyTimeout` once its deadline has passed.
struct DeadlineBody {
    body: Body,
    deadline: tokio::time::Instant,
    /// Made the first time the body has nothing to give, so that a body that arrives
    /// at once costs no timer.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let late = || Poll::Ready(Some(Err(axum::Error::new(BodyTimeout))));
        match Pin::new(&mut this.body).poll_frame(cx) {
            // Bytes that trickle in steadily still count against the deadline.
            Poll::Ready(Some(Ok(_))) if tokio::time::Instant::now() >= this.deadline => late(),
            Poll::Ready(frame) => Poll::Ready(frame),
            Poll::Pending => {
                let deadline = this.deadline;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => late(),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
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

/// Every route the OpenAPI document describes, each built from its handler's
/// `#[utoipa::path]` (`routes!`): the one list from which both the router (`router`) and
/// the document's paths (`openapi::document`, with `Config::default()`, whose limits the
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
        .route_service("/mcp", crate::mcp::http_service(state.clone()))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Inside authentication: the rate is the principal's.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::rate_limit::limit,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::auth::authenticate,
        ))
        .layer(axum::middleware::from_fn(crate::telemetry::observe))
        .layer(axum::middleware::from_fn_with_state(state.clone(), body_deadline))
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panic_response))
        .with_state(state)
}

/// 200 while programs can run; 503 with the reason while sandboxes cannot be built. It
/// needs no credentials, so that load balancers and container probes can call it; with
/// a valid key (or in local mode) it says more.
#[utoipa::path(
    get,
    path = "/v1/health",
    operation_id = "health",
    tag = "health",
    security(()),
    responses(
        (status = 200, description = "Programs can run. Without credentials on a server with API keys, only `status` and `version`.", body = Health),
        (status = 503, description = "Sandboxes cannot be built now; `reason` says why.", body = Health),
        (status = 401, description = "`unauthorized`: credentials were sent and are not valid (none at all is fine).", body = ErrorBody),
    ),
)]
pub(crate) async fn health(State(state): State<AppState>, principal: Option<Extension<Principal>>) -> Response {
    let reason = state.sandbox_unavailable().await;
    let code = if reason.is_some() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let mut body = Health {
        status: if reason.is_some() { "unavailable" } else { "ok" }.into(),
        reason,
        version: env!("CARGO_PKG_VERSION").into(),
        cgroup: None,
        active_runs: None,
        max_concurrent_runs: None,
        queued_runs: None,
        sessions: None,
        paused_sessions: None,
        dormant_sessions: None,
        max_sessions: None,
        warm_idle: None,
    };
    // What the server holds and how busy it is is for its callers only.
    if principal.is_some() {
        body.cgroup = Some(state.runner.settings().cgroups.version().into());
        body.active_runs = Some(state.admission.active());
        body.max_concurrent_runs = Some(state.admission.capacity());
        body.warm_idle = Some(state.pool.idle());
        body.queued_runs = Some(state.admission.queued());
        let (sessions, paused) = state.sessions.counts();
        body.sessions = Some(sessions);
        body.paused_sessions = Some(paused);
        body.dormant_sessions = state.sessions.dormant_count().await;
        body.max_sessions = Some(state.config.sessions.max_sessions);
    }
    (code, Json(body)).into_response()
}

/// Runs a program to its end and answers with its outcome.
#[utoipa::path(
    post,
    path = "/v1/exec",
    operation_id = "exec",
    tag = "exec",
    request_body = ExecRequest,
    responses(
        (status = 429, description = "`principal_at_capacity`: the caller holds as many sessions or runs as it may; or `rate_limited`: over its rate (`rate_limit_*`).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 200, description = "The program ran; `status` says how it ended.", body = ExecResponse,
            headers(("sandcall-sandbox" = String, description = "`warm` or `cold`: which kind of sandbox ran it."))),
        (status = 400, description = "`invalid_json`, `invalid_request` or `unsupported_language`.", body = ErrorBody),
        (status = 404, description = "`file_not_found`: an input file does not exist.", body = ErrorBody),
        (status = 409, description = "`workspace_busy`: another run is using the request's workspace (`workspace_id` or `runtime_session_hint`, with `workspaces` on).", body = ErrorBody),
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
    params(("X-LibreChat-Code-Request-ID" = Option<String>, Header,
        description = "An id (1 to 256 visible ASCII characters) by which `POST /v1/exec/programmatic/cancel` can name this session as `request_id`: the latest one sent with a first call or a resume of the session.")),
    responses(
        (status = 429, description = "`principal_at_capacity`: the caller holds as many sessions or runs as it may; or `rate_limited`: over its rate (`rate_limit_*`).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 200, description = "The program paused on tool calls, completed, or ended in an error.", body = ProgrammaticResponse,
            headers(
                ("sandcall-resume" = String, description = "On a resume: `live` (the paused process went on) or `replay` (the session had no live process and was run again from its journal)."),
                ("sandcall-node" = String, description = "Many nodes: the `node_url` of the node that served the request."),
            )),
        (status = 400, description = "`invalid_json`, `invalid_request`, `unsupported_language`, `invalid_tool_schema` or `invalid_tool_results`.", body = ErrorBody),
        (status = 404, description = "`session_not_found` or `file_not_found`.", body = ErrorBody),
        (status = 409, description = "`continuation_token_used`: the token's pause is no longer open, and this is not a retry of its resume with the same results (a retry answers what the first use answered; a session that ended answers its ending).", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: the body, `code` or the input files.", body = ErrorBody),
        (status = 502, description = "`mcp_server_failure`: an MCP server that `mcp_servers` names could not be started or did not list its tools.", body = ErrorBody),
        (status = 503, description = "`at_capacity`: too many sessions hold a sandbox. `store_unavailable`: the session store (Redis) cannot be reached; nothing was changed and the token stays good. `session_owner_unavailable` (many nodes): the node that holds the session live did not answer.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
    ),
)]
pub(crate) async fn programmatic_route(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: axum::http::HeaderMap,
    JsonBody(req): JsonBody<ProgrammaticRequest>,
) -> Result<Response, ApiError> {
    let request_id = programmatic::request_id(headers.get(sandcall_api::REQUEST_ID_HEADER).map(|v| v.as_bytes()))?;
    let group = match req.continuation_token {
        Some(_) => crate::rate_limit::Group::Sessions,
        None => crate::rate_limit::Group::Exec,
    };
    state.rate_limits.check(group, &principal)?;
    if let Some(id) = req.session_id.as_deref() {
        tracing::Span::current().record("session_id", id);
    }
    let mut served = None;
    let json = match req.continuation_token.as_deref() {
        Some(token) => {
            // Many nodes: the resume goes to the node that holds the session live.
            if let Some(id) = state.sessions.token_session(token) {
                let body = || serde_json::to_vec(&req).map(Bytes::from);
                let path = "/v1/exec/programmatic";
                if let Some(answer) =
                    at_owner(&state, &principal, &id, &headers, true, Method::POST, path, body).await?
                {
                    return Ok(answer);
                }
            }
            let results = req.tool_results.unwrap_or_default();
            let (json, how) = state
                .sessions
                .resume(&principal, token, req.session_id.as_deref(), results, request_id)
                .await?;
            served = Some(how);
            json
        }
        None => {
            // Declaring the tools compiles up to 100 schemas: each is bounded
            // (programmatic::tools), together they are still milliseconds of work, done
            // off the async workers.
            let config = state.config.clone();
            let req = programmatic::declare_mcp_servers(req, state.sessions.mcp()).await?;
            let mut cmd = tokio::task::spawn_blocking(move || programmatic::parse_start(req, &config))
                .await
                .map_err(|e| ApiError::internal(error_type::INTERNAL, &format!("declaring tools: {e}")))??;
            cmd.request_id = request_id;
            state.sessions.start(&principal, cmd).await?
        }
    };
    // Already JSON: a pause's answer is serialized once, off the async workers.
    let mut response = ([(header::CONTENT_TYPE, "application/json")], json).into_response();
    if let Some(served) = served {
        // (extension) Whether the resume reached the live program or a replay of it.
        response
            .headers_mut()
            .insert("sandcall-resume", axum::http::HeaderValue::from_static(served.as_str()));
    }
    Ok(tag_node(&state, response))
}

/// Many nodes: the answer of the session's owner when that is another node (the same
/// request, forwarded there), or None to serve the request here (this node holds the
/// session, or has just taken it over). An owner that cannot be reached is waited out:
/// once its lease runs out, the session is taken over here.
#[allow(clippy::too_many_arguments)]
async fn at_owner(
    state: &AppState,
    principal: &Principal,
    id: &str,
    headers: &axum::http::HeaderMap,
    own: bool,
    method: Method,
    path: &str,
    body: impl Fn() -> Result<Bytes, serde_json::Error>,
) -> Result<Option<Response>, ApiError> {
    // One node or many: a session this node does not hold is looked up in the store.
    let forwarded = headers.contains_key(crate::cluster::FORWARDED_HEADER);
    for _ in 0..3 {
        match state.sessions.locate(id, principal, forwarded, own).await? {
            programmatic::session::Located::Here => return Ok(None),
            programmatic::session::Located::Owner(owner) => {
                let Some(cluster) = &state.cluster else {
                    return Ok(None);
                };
                let bytes = body().map_err(|e| ApiError::internal(error_type::INTERNAL, &e.to_string()))?;
                match cluster.forward(&owner, method.clone(), path, headers, bytes).await {
                    Ok(answer) => return Ok(Some(answer)),
                    Err(crate::cluster::ForwardError::Unreachable(e)) => {
                        tracing::info!(session = %id, %owner, error = %e, "the session's owner cannot be reached; waiting for its lease to run out");
                        state.sessions.wait_out_lease(id, &owner).await?;
                    }
                    Err(e) => return Err(crate::cluster::forward_failed(&e)),
                }
            }
        }
    }
    Err(crate::cluster::forward_failed(&crate::cluster::ForwardError::Failed(
        "the session's owner kept changing".into(),
    )))
}

/// `at_owner` for a GET, which only reads the session: it claims no lease (`own` false),
/// and a dormant session is answered from the store.
async fn read_at_owner(
    state: &AppState,
    principal: &Principal,
    id: &str,
    headers: &axum::http::HeaderMap,
    path: &str,
) -> Result<Option<Response>, ApiError> {
    at_owner(state, principal, id, headers, false, Method::GET, path, || {
        Ok(Bytes::new())
    })
    .await
}

/// Many nodes: names the node that served the answer (`sandcall-node`).
fn tag_node(state: &AppState, mut response: Response) -> Response {
    if let Some(node) = state.sessions.node() {
        if let Ok(value) = axum::http::HeaderValue::from_str(node) {
            response.headers_mut().insert(crate::cluster::NODE_HEADER, value);
        }
    }
    response
}

/// Ends a session: its program is killed and its sandbox freed.
#[utoipa::path(
    post,
    path = "/v1/exec/programmatic/cancel",
    operation_id = "cancel_session",
    tag = "programmatic",
    request_body = CancelRequest,
    responses(
        (status = 429, description = "`rate_limited`: the caller is over its rate for these routes (`rate_limit_*`).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 200, description = "The session's outcome: `error` / `cancelled`, or how it had already ended.", body = ProgrammaticResponse),
        (status = 400, description = "`invalid_json` or `invalid_request` (neither `session_id` nor `request_id`).", body = ErrorBody),
        (status = 404, description = "`session_not_found`: no such session, or no session started or resumed with this `request_id`, for this caller.", body = ErrorBody),
        (status = 503, description = "Many nodes: `store_unavailable` (the session store cannot be reached) or `session_owner_unavailable` (the node that holds the session did not answer).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
    ),
)]
pub(crate) async fn cancel_route(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: axum::http::HeaderMap,
    JsonBody(req): JsonBody<CancelRequest>,
) -> Result<Response, ApiError> {
    let id = match (req.session_id, req.request_id) {
        (Some(id), _) => id,
        (None, Some(request_id)) => state.sessions.by_request_id(&principal, &request_id).await?,
        (None, None) => return Err(ApiError::bad_request("`session_id` or `request_id` is required")),
    };
    tracing::Span::current().record("session_id", id.as_str());
    let body = || {
        serde_json::to_vec(&CancelRequest {
            session_id: Some(id.clone()),
            ..Default::default()
        })
        .map(Bytes::from)
    };
    let path = "/v1/exec/programmatic/cancel";
    if let Some(answer) = at_owner(&state, &principal, &id, &headers, true, Method::POST, path, body).await? {
        return Ok(answer);
    }
    Ok(tag_node(
        &state,
        Json(state.sessions.cancel(&principal, &id).await?).into_response(),
    ))
}

/// A session's state: paused, running, or how it ended.
#[utoipa::path(
    get,
    path = "/v1/exec/programmatic/{session_id}",
    operation_id = "get_session",
    tag = "programmatic",
    params(("session_id" = String, Path, description = "The session's id.")),
    responses(
        (status = 429, description = "`rate_limited`: the caller is over its rate for these routes (`rate_limit_*`).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 200, description = "The session's state.", body = ProgrammaticResponse),
        (status = 404, description = "`session_not_found`.", body = ErrorBody),
        (status = 503, description = "Many nodes: `store_unavailable` (the session store cannot be reached) or `session_owner_unavailable` (the node that holds the session did not answer).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
    ),
)]
pub(crate) async fn session_route(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: axum::http::HeaderMap,
    ApiPath(session_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    tracing::Span::current().record("session_id", session_id.as_str());
    let path = format!("/v1/exec/programmatic/{session_id}");
    if let Some(answer) = read_at_owner(&state, &principal, &session_id, &headers, &path).await? {
        return Ok(answer);
    }
    // Already JSON: a paused session's answer is serialized once, not per GET.
    let json = state.sessions.status(&principal, &session_id).await?;
    Ok(tag_node(
        &state,
        ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
    ))
}

/// A session's tool calls, oldest first: each as requested, refused or answered
/// (extension). Kept as long as the session is (its ending stays readable for
/// `session_expiry_s`).
#[utoipa::path(
    get,
    path = "/v1/exec/programmatic/{session_id}/calls",
    operation_id = "get_session_calls",
    tag = "programmatic",
    params(("session_id" = String, Path, description = "The session's id.")),
    responses(
        (status = 200, description = "The session's tool calls.", body = sandcall_api::CallsResponse),
        (status = 404, description = "`session_not_found`.", body = ErrorBody),
        (status = 429, description = "`rate_limited`: the caller is over its rate for these routes (`rate_limit_*`).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait."))),
    ),
)]
pub(crate) async fn calls_route(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: axum::http::HeaderMap,
    ApiPath(session_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    tracing::Span::current().record("session_id", session_id.as_str());
    // Many nodes: the audit trail is kept by the node that holds the session.
    let path = format!("/v1/exec/programmatic/{session_id}/calls");
    if let Some(answer) = read_at_owner(&state, &principal, &session_id, &headers, &path).await? {
        return Ok(answer);
    }
    let calls = state.sessions.calls(&principal, &session_id).await?;
    Ok(tag_node(&state, Json(calls).into_response()))
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

/// The managed runtimes programs run on, with their packages (extension).
#[utoipa::path(
    get,
    path = "/v1/runtimes",
    operation_id = "runtimes",
    tag = "health",
    responses(
        (status = 200, description = "The runtimes in use, each with every package at its exact version: the Python runtime and the npm set for JavaScript and TypeScript programs; empty when Python runs on the bare interpreter and no npm set is installed.", body = sandcall_api::RuntimesResponse),
        (status = 401, description = "`unauthorized`: no valid credentials.", body = ErrorBody),
    ),
)]
pub(crate) async fn runtimes_route(State(state): State<AppState>) -> Response {
    static RUNTIMES: std::sync::OnceLock<sandcall_api::RuntimesResponse> = std::sync::OnceLock::new();
    let body = RUNTIMES
        .get_or_init(|| {
            let mut body = crate::python_runtime::describe(&state.config);
            // The npm set the sandboxes of this server see (found when it started).
            if state.runner.settings().node_modules.is_some() {
                body.runtimes
                    .extend(crate::npm_runtime::for_config(&state.config).map(|n| crate::npm_runtime::describe(&n)));
            }
            body
        })
        .clone();
    Json(body).into_response()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A body whose client has gone quiet.
    struct Stalled;

    impl HttpBody for Stalled {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn a_stalled_body_is_a_timeout_at_its_deadline() {
        let body = Body::new(DeadlineBody {
            body: Body::new(Stalled),
            deadline: tokio::time::Instant::now() + Duration::from_millis(50),
            timer: None,
        });
        let e = read_body(body, 1024).await.unwrap_err();
        assert_eq!(e.status, StatusCode::REQUEST_TIMEOUT);
        assert_eq!(e.error_type, error_type::REQUEST_TIMEOUT);
    }

    #[tokio::test]
    async fn a_body_in_time_is_read_whole() {
        let body = Body::new(DeadlineBody {
            body: Body::from("{}"),
            deadline: tokio::time::Instant::now() + Duration::from_secs(60),
            timer: None,
        });
        assert_eq!(&read_body(body, 1024).await.unwrap()[..], b"{}");
    }

    #[test]
    fn a_timeout_is_found_inside_wrapping_errors() {
        let wrapped = axum::Error::new(axum::Error::new(BodyTimeout));
        assert!(body_timed_out(&wrapped));
        assert!(!body_timed_out(&axum::Error::new(std::io::Error::other("reset"))));
    }
}
