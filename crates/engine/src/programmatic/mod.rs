//! POST /v1/exec/programmatic and its companions: programs that call the caller's tools.
//!
//! - `tools`: the declared tools and the check every call passes (schema, size);
//! - `token`: signed continuation tokens;
//! - `session`: the pause/resume state machine and the task that owns each sandbox.

pub mod audit;
pub mod session;
pub mod token;
pub mod tools;

use crate::error::EngineError;
use crate::error::ErrorKind;
use crate::exec;
use crate::runner::RunSpec;
use crate::runtime;
use sandcall_api::ids;
use sandcall_api::{error_type, ProgrammaticRequest};
use sandcall_config::{Config, TimeoutScope};
use sandcall_sandbox::protocol::ToolChannel;
use session::StartCommand;
use tools::ToolSet;

/// Connections the program may hold open on its tool socket at once.
const MAX_TOOL_CONNECTIONS: usize = 64;

/// Validates a first call into a command for `Sessions::start`.
pub fn parse_start(req: ProgrammaticRequest, config: &Config) -> Result<StartCommand, EngineError> {
    // What the session journal keeps of the request, to start the program again.
    let request = ProgrammaticRequest {
        session_id: None,
        continuation_token: None,
        tool_results: None,
        ..req.clone()
    };
    let language = exec::parse_language(req.language.as_deref(), req.lang.as_deref(), config)?;
    if runtime::languages::declaration(language).tools == runtime::languages::ToolStub::None {
        let name = runtime::languages::name(language, config);
        return Err(EngineError {
            code: Some(sandcall_api::error_code::UNSUPPORTED_CAPABILITY),
            ..EngineError::new(
                ErrorKind::Invalid,
                error_type::UNSUPPORTED_LANGUAGE,
                format!(
                    "{name} programs cannot call tools here: use python, bash, javascript or typescript \
                     on /v1/exec/programmatic, or run {name} on /v1/exec"
                ),
            )
        });
    }
    // A session's program is replayed after an eviction or a restart (docs/scaling.md);
    // what a replay should do with requests it already made is not settled, so sessions
    // have no network yet (docs/egress.md).
    if req.network.is_some() {
        return Err(EngineError {
            code: Some(sandcall_api::error_code::UNSUPPORTED_CAPABILITY),
            ..EngineError::bad_request(
                "`network` is not supported on /v1/exec/programmatic yet: use /v1/exec for a run with network",
            )
        });
    }
    let missing = "`code` is required (or `continuation_token` to resume)";
    let (code, args) = exec::check_code_and_args(req.code, req.args, config, missing)?;
    let tools = ToolSet::declare(req.tools.as_deref().unwrap_or_default())
        .map_err(|e| EngineError::new(ErrorKind::Invalid, error_type::INVALID_TOOL_SCHEMA, e.0))?;
    if let Some(unknown) = tools
        .mcp_servers()
        .into_iter()
        .find(|s| !config.sessions.mcp_servers.iter().any(|m| m.name == *s))
    {
        return Err(crate::mcp_client::unknown_server(unknown));
    }
    let timeout_ms = exec::timeout(req.timeout, req.run_timeout, config)?;
    if req.loop_timeout == Some(0) {
        return Err(EngineError::bad_request("`loop_timeout` must be at least 1 ms"));
    }
    // The helper's clock (`timeout_ms`) stops while the program waits for its caller;
    // the loop's bound, when there is one, is the driver's own timer.
    let loop_timeout_ms = match config.sessions.programmatic_timeout_scope {
        TimeoutScope::Run => req.loop_timeout,
        TimeoutScope::Loop => Some(req.loop_timeout.map_or(timeout_ms, |l| l.min(timeout_ms))),
    };
    let limits = exec::resolve_limits(config, req.limits.as_ref())?;
    let max_tool_calls = req
        .max_tool_calls
        .unwrap_or(config.sessions.max_tool_calls)
        .min(config.sessions.max_tool_calls);
    let interpreter = runtime::languages::interpreter(language, config);
    let mut launch = runtime::launch_with_tools(language, interpreter, &args, &tools.names());
    launch.env.extend(runtime::languages::config_env(language, config));
    let mut spec = RunSpec::new(ids::new_id(), code, launch, timeout_ms, limits);
    spec.tools = Some(tool_channel(config));
    let custom_limits = req
        .limits
        .as_ref()
        .is_some_and(|l| *l != sandcall_api::RequestLimits::default());
    let files = req.files.unwrap_or_default();
    Ok(StartCommand {
        spec,
        tools,
        max_tool_calls,
        files,
        language,
        args,
        custom_limits,
        loop_timeout_ms,
        request_id: None,
        isolation: crate::isolation::parse_isolation(request.isolation.as_deref())?,
        request,
    })
}

/// A first call's `mcp_servers`: each server's tools, as it lists them, become tool
/// declarations after the request's own `tools` (so the journal keeps them, and a replay
/// does not ask the server again).
pub async fn declare_mcp_servers(
    mut req: ProgrammaticRequest,
    mcp: &crate::mcp_client::McpServers,
    principal: &str,
) -> Result<ProgrammaticRequest, EngineError> {
    let Some(servers) = req.mcp_servers.take() else {
        return Ok(req);
    };
    let mut tools = req.tools.take().unwrap_or_default();
    for server in &servers {
        if tools.len() > tools::MAX_TOOLS {
            break;
        }
        tools.extend(mcp.declarations(principal, server).await?);
    }
    req.tools = Some(tools);
    Ok(req)
}

/// The longest `X-LibreChat-Code-Request-ID` kept, in bytes.
pub const MAX_REQUEST_ID_BYTES: usize = 256;

/// The start's `X-LibreChat-Code-Request-ID` (its value, if the request has one), by
/// which a cancel may name the session.
pub fn request_id(value: Option<&[u8]>) -> Result<Option<String>, EngineError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let id = std::str::from_utf8(value)
        .ok()
        .filter(|v| (1..=MAX_REQUEST_ID_BYTES).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| {
            EngineError::bad_request(format!(
                "the X-LibreChat-Code-Request-ID header must be 1 to {MAX_REQUEST_ID_BYTES} visible ASCII characters"
            ))
        })?;
    Ok(Some(id.to_owned()))
}

/// The tool channel every programmatic (and warm) sandbox gets.
pub fn tool_channel(config: &Config) -> ToolChannel {
    // A call's whole message may be somewhat over max_tool_call_bytes (names,
    // quoting); much larger than that and the connection is cut unread.
    let max_message_bytes = config.sessions.max_tool_call_bytes.saturating_mul(2) + (64 << 10);
    ToolChannel {
        max_message_bytes,
        max_connections: MAX_TOOL_CONNECTIONS,
        // Four long calls on their way at once (the Python runner sends one call at a
        // time on its one connection; Bash jobs past four wait their turn).
        max_input_bytes: max_message_bytes.saturating_mul(4),
        // All the replies of one resume arrive together, and a resume body is at most
        // max_programmatic_body_bytes; re-encoding can make a result somewhat longer (`-0` becomes
        // `-0.0`), hence twice that, and never less than 16 MiB.
        max_queued_reply_bytes: (config.max_programmatic_body_bytes() as u64)
            .saturating_mul(2)
            .max(16 << 20),
        max_calls: config.sessions.max_tool_calls,
    }
}
