//! The handlers of the run and session routes, health, the runtimes and the fallbacks.
//! Each parses its request into a command, calls the engine and maps the outcome; none
//! holds business logic. The route list is `router`'s.

use crate::error::ApiError;
use crate::exec;
use crate::extract::{ApiPath, JsonBody};
use crate::programmatic;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use sandcall_api::{
    error_type, CancelRequest, ErrorBody, ExecRequest, ExecResponse, Health, ProgrammaticRequest, ProgrammaticResponse,
};
use sandcall_auth::Principal;

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
        (status = 200, description = "Programs can run. Without credentials on a server with API keys, only `status` and `version`; with a tenant's credentials, its own runs and sessions; with `metrics_token` (or in local mode), the server's.", body = Health),
        (status = 503, description = "Sandboxes cannot be built now; `reason` says why.", body = Health),
        (status = 401, description = "`unauthorized`: credentials were sent and are not valid (none at all is fine).", body = ErrorBody),
    ),
)]
pub(crate) async fn health(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    operator: Option<Extension<sandcall_auth::Operator>>,
) -> Response {
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
    // What the server holds and how busy it is is the operator's (the metrics token, or
    // local mode's one principal); a tenant sees its own figures only, never what other
    // tenants are doing.
    // (Local mode, not the principal's name: an API key's principal may be called `local`.)
    if operator.is_some() || (principal.is_some() && state.auth.local_mode()) {
        server_figures(&state, &mut body).await;
    } else if let Some(Extension(principal)) = principal {
        body.cgroup = Some(state.runner.settings().cgroups.version().into());
        body.max_concurrent_runs = Some(state.admission.capacity());
        body.max_sessions = Some(state.config.sessions.max_sessions);
        body.active_runs = Some(state.admission.active_of(&principal.0));
        body.sessions = Some(state.sessions.held_by(&principal));
        body.dormant_sessions = state.sessions.dormant_count_of(Some(&principal.0)).await;
    }
    (code, Json(body)).into_response()
}

/// The server-wide figures of health, for the operator.
async fn server_figures(state: &AppState, body: &mut Health) {
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
        (status = 409, description = "`workspace_busy`: another run is using the request's workspace (`workspace_id` or `runtime_session_hint`, with `workspaces` on). `execution_profile_mismatch` (also in `error`): `X-CodeAPI-Expected-Profile` names the other execution profile than the server's; nothing ran.", body = ErrorBody),
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
    let (result, warm) = state.execute(&principal, state.auth.isolation(&principal), cmd).await?;
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
        (status = 400, description = "`invalid_json`, `invalid_request`, `unsupported_language`, `invalid_tool_schema`, `invalid_tool_results`, or `invalid_continuation_token` (the token does not parse or its signature does not verify).", body = ErrorBody),
        (status = 404, description = "`session_not_found` or `file_not_found`.", body = ErrorBody),
        (status = 409, description = "`continuation_token_used`: the token's pause is no longer open, and this is not a retry of its resume with the same results (a retry answers what the first use answered; a session that ended answers its ending). `execution_profile_mismatch` (also in `error`): `X-CodeAPI-Expected-Profile` names the other execution profile than the server's; nothing ran.", body = ErrorBody),
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
            let req = programmatic::declare_mcp_servers(req, state.sessions.mcp(), &principal.0).await?;
            let mut cmd = tokio::task::spawn_blocking(move || programmatic::parse_start(req, &config))
                .await
                .map_err(|e| ApiError::internal(error_type::INTERNAL, &format!("declaring tools: {e}")))??;
            cmd.request_id = request_id;
            state
                .sessions
                .start(&principal, state.auth.isolation(&principal), cmd)
                .await?
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
                match cluster
                    .forward(&owner, &principal.0, method.clone(), path, headers, bytes)
                    .await
                {
                    Ok(mut answer) => {
                        if !state.config.cluster.node_header {
                            answer.headers_mut().remove(crate::cluster::NODE_HEADER);
                        }
                        return Ok(Some(answer));
                    }
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

/// Many nodes, with `node_header = true`: names the node that served the answer
/// (`sandcall-node`). Off by default: node URLs are internal.
fn tag_node(state: &AppState, mut response: Response) -> Response {
    if !state.config.cluster.node_header {
        return response;
    }
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
pub(crate) async fn injected_panic() -> Response {
    panic!("fault injection: a panic inside a request handler")
}

pub(crate) async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, error_type::NOT_FOUND, "no such route")
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        error_type::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
    )
}

pub(crate) fn panic_response(err: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let detail = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into());
    ApiError::internal(error_type::INTERNAL, &format!("handler panicked: {detail}")).into_response()
}
