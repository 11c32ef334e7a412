//! The wire types of sandcall's HTTP API, and its stable error codes.
//!
//! Only this crate decides field names and shapes; it has no I/O and no async. The
//! contract these types follow is the project's API reference (docs/api.md).

// Request paths answer errors, they do not panic (tests may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod ids;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Every error response on every route: `{"error": ..., "error_type": ...}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ErrorBody {
    pub error: String,
    pub error_type: String,
    /// A second, coarser code that some clients act on, present only where one applies:
    /// `unsupported_capability` (LibreChat's client then tells the model not to retry
    /// with that language).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// With a 429 or 503 that may pass later: how many seconds to wait before retrying,
    /// the same as the `Retry-After` header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
}

/// Values of `ErrorBody::code`.
pub mod error_code {
    /// The request asks for something this server does not do at all (a language it
    /// does not run): retrying it the same way cannot succeed.
    pub const UNSUPPORTED_CAPABILITY: &str = "unsupported_capability";
}

/// Stable, snake_case error codes clients can match on.
pub mod error_type {
    pub const INVALID_JSON: &str = "invalid_json";
    pub const INVALID_REQUEST: &str = "invalid_request";
    pub const UNSUPPORTED_MEDIA_TYPE: &str = "unsupported_media_type";
    pub const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
    pub const UNSUPPORTED_LANGUAGE: &str = "unsupported_language";
    pub const AT_CAPACITY: &str = "at_capacity";
    pub const SHUTTING_DOWN: &str = "shutting_down";
    pub const SANDBOX_FAILURE: &str = "sandbox_failure";
    pub const NOT_FOUND: &str = "not_found";
    pub const METHOD_NOT_ALLOWED: &str = "method_not_allowed";
    pub const INTERNAL: &str = "internal";
    pub const SESSION_NOT_FOUND: &str = "session_not_found";
    pub const UNAUTHORIZED: &str = "unauthorized";
    pub const FILE_NOT_FOUND: &str = "file_not_found";
    pub const INSUFFICIENT_STORAGE: &str = "insufficient_storage";
    pub const INVALID_CONTINUATION_TOKEN: &str = "invalid_continuation_token";
    pub const CONTINUATION_TOKEN_USED: &str = "continuation_token_used";
    pub const INVALID_TOOL_RESULTS: &str = "invalid_tool_results";
    pub const INVALID_TOOL_SCHEMA: &str = "invalid_tool_schema";
    /// In `error` responses of programmatic sessions.
    pub const TIMEOUT: &str = "timeout";
    pub const CANCELLED: &str = "cancelled";
    pub const SESSION_EXPIRED: &str = "session_expired";
    /// A session brought back by replay took another path than the journal's (another
    /// call, other arguments, or an end before a journalled call).
    pub const REPLAY_DIVERGED: &str = "replay_diverged";
    /// 507: the principal's stored files would go over its quota.
    pub const QUOTA_EXCEEDED: &str = "quota_exceeded";
    /// 429: the principal already holds as many sessions or runs as it may.
    pub const PRINCIPAL_AT_CAPACITY: &str = "principal_at_capacity";
    /// 429: the principal sent more requests of a route group than its rate allows
    /// (`rate_limit_*`).
    pub const RATE_LIMITED: &str = "rate_limited";
    /// (extension) 502: an MCP server a request's `mcp_servers` names could not be
    /// started or did not list its tools.
    pub const MCP_SERVER_FAILURE: &str = "mcp_server_failure";
    /// 408: the request's body did not arrive in time.
    pub const REQUEST_TIMEOUT: &str = "request_timeout";
    /// 403 (local mode): the request comes from a web page of another origin.
    pub const FORBIDDEN_ORIGIN: &str = "forbidden_origin";
    /// 421 (local mode): the request names a host that is not this machine's loopback.
    pub const MISDIRECTED_REQUEST: &str = "misdirected_request";
    /// 503: the session store (Redis) cannot be reached now; nothing was changed, retry.
    pub const STORE_UNAVAILABLE: &str = "store_unavailable";
    /// 503 (many nodes): the node that holds the session live cannot be reached now, and
    /// its lease has not run out yet; retry.
    pub const SESSION_OWNER_UNAVAILABLE: &str = "session_owner_unavailable";
    /// 409: the request's workspace is in use by another run.
    pub const WORKSPACE_BUSY: &str = "workspace_busy";
    /// 409: the request's `X-CodeAPI-Expected-Profile` is not this server's
    /// `execution_profile`. Also the body's `error`, which LibreChat's client reads.
    pub const EXECUTION_PROFILE_MISMATCH: &str = "execution_profile_mismatch";
}

/// A reference to an uploaded file, to stage into the working directory.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, ToSchema)]
pub struct FileRef {
    pub id: String,
    /// The upload's or run's `storage_session_id`. Required unless `session_id` is sent.
    pub storage_session_id: Option<String>,
    /// Accepted in place of `storage_session_id`, but not together with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The file's name in the working directory.
    pub name: String,
    /// The entity (an agent, a skill, ...) the caller ties the file to; echoed on the
    /// output entry of an input that comes back inherited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity_id: Option<String>,
}

impl FileRef {
    pub fn session(&self) -> Option<&str> {
        self.storage_session_id.as_deref().or(self.session_id.as_deref())
    }
}

/// Per-request limits (an extension): each may only lower the server's ceiling.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestLimits {
    #[schema(minimum = 1)]
    pub memory_limit_mb: Option<u64>,
    #[schema(minimum = 1)]
    pub max_processes: Option<u64>,
    #[schema(minimum = 1)]
    pub max_open_files: Option<u64>,
    #[schema(minimum = 1)]
    pub max_output_bytes: Option<u64>,
    #[schema(minimum = 1)]
    pub cpu_time_limit_ms: Option<u64>,
    #[schema(minimum = 1)]
    pub workspace_limit_mb: Option<u64>,
    #[schema(minimum = 1)]
    pub file_size_limit_mb: Option<u64>,
}

/// POST /v1/exec. Unknown fields are ignored.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
pub struct ExecRequest {
    /// The program's source: not blank, no NUL, at most `max_code_bytes`.
    #[schema(
        required = true,
        nullable = false,
        min_length = 1,
        pattern = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"
    )]
    pub code: Option<String>,
    /// `python` (the default), `bash`, `javascript`, `typescript`, `c`, `cpp`, `go`,
    /// `java`, `php`, `rust`, `r`, `fortran` or `d`, or an alias; or a name the
    /// operator declared (docs/runtimes.md, "Languages an operator declares").
    #[schema(value_type = Option<LanguageName>)]
    pub language: Option<String>,
    /// Another name for `language`.
    #[schema(value_type = Option<LanguageName>)]
    pub lang: Option<String>,
    /// The program's arguments (no NUL).
    #[schema(inline, value_type = Option<Vec<Arg>>)]
    pub args: Option<Vec<String>>,
    /// Fed to the program's standard input, at most `max_stdin_bytes`.
    pub stdin: Option<String>,
    /// Uploaded files to copy into the working directory.
    pub files: Option<Vec<FileRef>>,
    /// The wall-clock budget in milliseconds, clamped to `max_run_timeout_ms`. Wins
    /// over `timeout` when both are sent.
    #[schema(minimum = 1)]
    pub run_timeout: Option<u64>,
    /// Another name for `run_timeout`.
    #[schema(minimum = 1)]
    pub timeout: Option<u64>,
    pub limits: Option<RequestLimits>,
    /// LibreChat's stateful-session hint (1 to 256 of `A-Z a-z 0-9 _ . : -`). With the
    /// server's `workspaces` on, the run starts in the working directory that the
    /// caller's previous run with the same hint left. With `workspaces` off it is
    /// ignored, whatever its value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub runtime_session_hint: Option<serde_json::Value>,
    /// (extension) The same as `runtime_session_hint`, and wins over it: the name of the
    /// caller's workspace. Refused (`400 invalid_request`) when `workspaces` is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
    /// (extension) The isolation tier to run in, `namespace` or `gvisor`
    /// (docs/isolation.md): at least the caller's own. A weaker one than the caller's is
    /// refused (`400 invalid_request`); one the server lacks is `400` with `code`
    /// `unsupported_capability`. Default: the caller's tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<IsolationName>)]
    pub isolation: Option<String>,
    /// (extension) Network for this run (docs/egress.md): the hosts it may reach through
    /// the server's egress proxy, each covered by the caller's policy. Absent: no network.
    /// A caller without egress, or a host outside its policy, is `400 invalid_request`
    /// naming the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkRequest>,
}

/// A run's request for network (`network` of `/v1/exec`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkRequest {
    /// Hosts to reach, as the policy writes them: `api.example.com`, `*.example.com`,
    /// `host:443` or `host:80,443`. Absent: everything the caller's policy allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
}

/// What a run with network did with it (`network` of `/v1/exec`'s answer).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, ToSchema)]
pub struct NetworkSummary {
    /// Connections the program asked the proxy for, refused ones included.
    pub connections: u64,
    /// Of those, the ones the proxy refused (policy, address, limits).
    pub refused: u64,
    /// Bytes sent upstream, and received from upstream.
    pub bytes_out: u64,
    pub bytes_in: u64,
}

/// An isolation tier's name.
#[derive(ToSchema)]
#[schema(as = IsolationName)]
#[allow(dead_code)] // Only its schema is used.
#[serde(rename_all = "lowercase")]
enum IsolationName {
    Namespace,
    Gvisor,
}

/// A language name the server accepts, in any case.
#[derive(ToSchema)]
#[schema(as = LanguageName)]
#[allow(dead_code)] // Only its schema is used.
#[serde(rename_all = "lowercase")]
enum LanguageName {
    Python,
    Py,
    Python3,
    Bash,
    Sh,
    Javascript,
    Js,
    Node,
    Typescript,
    Ts,
    C,
    Cpp,
    #[serde(rename = "c++")]
    CPlusPlus,
    Go,
    Golang,
    Java,
    Php,
    Rust,
    Rs,
    R,
    Fortran,
    F90,
    D,
}

/// A language name `/v1/exec/programmatic` accepts, in any case: those whose programs
/// can call tools.
#[derive(ToSchema)]
#[schema(as = ProgrammaticLanguageName)]
#[allow(dead_code)] // Only its schema is used.
#[serde(rename_all = "lowercase")]
enum ProgrammaticLanguageName {
    Python,
    Py,
    Python3,
    Bash,
    Sh,
    Javascript,
    Js,
    Node,
    Typescript,
    Ts,
}

/// A program argument: any string without NUL.
#[derive(ToSchema)]
#[schema(value_type = String, pattern = "^[^\\u0000]*$")]
#[allow(dead_code)] // Only its schema is used.
struct Arg(String);

/// A tool the program may call.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct ToolDecl {
    /// 1 to 128 characters, no control characters. The program calls the tool by a
    /// normalised name (docs/api.md, "Tools inside the program"); `tool_calls[].name`
    /// carries this one.
    #[schema(min_length = 1, max_length = 128)]
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// A JSON Schema for the arguments object; absent means any object. Kept as the
    /// text the caller sent: the order of its `properties` is the order of Python's
    /// positional arguments.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Box<serde_json::value::RawValue>>,
    /// (extension) The name of an MCP server of the server's config (`mcp_servers`)
    /// whose tool `name` this is: sandcall calls it and hands its result to the
    /// program, and the caller never sees the call (docs/mcp.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_server: Option<String>,
}

/// The caller's answer to one tool call.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct ToolResult {
    pub call_id: String,
    // Kept as the JSON text the caller sent: it only passes through to the program, and
    // parsed it could take 16 times its size (`[0,0,...]`).
    #[serde(default)]
    #[schema(value_type = serde_json::Value)]
    pub result: Box<serde_json::value::RawValue>,
    #[serde(default)]
    pub is_error: bool,
    #[serde(default)]
    pub error_message: Option<String>,
}

/// POST /v1/exec/programmatic: a first call (with `code`) or a resume (with
/// `continuation_token`); one of the two is required. Unknown fields are ignored.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
pub struct ProgrammaticRequest {
    /// First call: the program, as on /v1/exec.
    #[schema(min_length = 1, pattern = r"^[^\u0000]*[^\s\u0000][^\u0000]*$")]
    pub code: Option<String>,
    /// `python` (the default), `bash`, `javascript` or `typescript`, or an alias: the
    /// languages whose programs can call tools.
    #[schema(value_type = Option<ProgrammaticLanguageName>)]
    pub language: Option<String>,
    #[schema(value_type = Option<ProgrammaticLanguageName>)]
    pub lang: Option<String>,
    #[schema(inline, value_type = Option<Vec<Arg>>)]
    pub args: Option<Vec<String>>,
    pub files: Option<Vec<FileRef>>,
    /// First call: the tools the program may call (at most 100).
    pub tools: Option<Vec<ToolDecl>>,
    /// First call (extension): MCP servers of the server's config (`mcp_servers`) all of
    /// whose tools the program may call, declared as the server lists them (name,
    /// description, input schema) after `tools`; sandcall calls them (docs/mcp.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_servers: Option<Vec<String>>,
    /// First call: the program's own wall-clock budget in milliseconds: the time it
    /// runs, not the time it waits paused for the caller (unless the server's
    /// `programmatic_timeout_scope` is `loop`).
    #[schema(minimum = 1)]
    pub timeout: Option<u64>,
    /// First call (extension): a budget in milliseconds for the whole loop, the waits
    /// for the caller included.
    #[schema(minimum = 1)]
    pub loop_timeout: Option<u64>,
    /// Accepted as on /v1/exec; `timeout` wins.
    #[schema(minimum = 1)]
    pub run_timeout: Option<u64>,
    /// First call: at most this many tool calls (clamped to the server's ceiling).
    pub max_tool_calls: Option<u64>,
    pub limits: Option<RequestLimits>,
    /// First call (extension): the isolation tier to run in, as on /v1/exec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<IsolationName>)]
    pub isolation: Option<String>,
    /// First call: as on /v1/exec, the caller's workspace (LibreChat's stateful
    /// profile): the program starts with its files and, if it completes, leaves its own
    /// for the next run. The session holds the workspace from its start to its end,
    /// pauses included. Ignored when `workspaces` is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub runtime_session_hint: Option<serde_json::Value>,
    /// First call (extension): as on /v1/exec, wins over `runtime_session_hint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
    /// First call (extension): network for the session's program, as on /v1/exec, for the
    /// whole session. A session granted network is not replayed after a restart or an
    /// eviction: its resume then ends it with an error (docs/egress.md, "Replay").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkRequest>,
    /// Resume: the session the token belongs to (optional; must match it when sent).
    pub session_id: Option<String>,
    /// Resume: the token of the pause being answered.
    pub continuation_token: Option<String>,
    /// Resume: results for some or all of the pending calls; the calls left
    /// unanswered come back in the next pause.
    pub tool_results: Option<Vec<ToolResult>>,
}

/// GET /v1/exec/programmatic/{session_id}/calls (extension): the session's tool calls,
/// oldest first (by `requested_at`), and its connections through the egress proxy, oldest
/// first (by `opened_at`): the two lists merge into one in time order by those times.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CallsResponse {
    pub session_id: String,
    pub calls: Vec<AuditCall>,
    /// Records that gave way to newer ones (a session keeps its latest 10,000, and at
    /// most 2 MiB of them), and those let go with a released trail.
    pub calls_dropped: u64,
    /// (extension) The session has ended and its trail was let go before its
    /// `session_expiry_s` was up: ended sessions held more than `max_ended_session_bytes`.
    /// `calls` is then empty; the log (target `sandcall::audit`) keeps the whole trail.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trail_released: bool,
    /// (extension) For a session granted network: every connection its program asked
    /// the proxy for, in the order it asked (`opened_at`), refused ones included. Kept
    /// while the session is dormant (evicted, or stopped with the server), as its calls are.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<AuditConnection>,
    /// (extension) Connections not listed: past the trail's bounds (its 10,000 records
    /// and 2 MiB, tool calls and connections together) or the proxy's 1,000 records.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub connections_dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One connection of a session's program through the egress proxy (docs/egress.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AuditConnection {
    pub host: String,
    pub port: u16,
    /// The address connected to, or the one refused; none when the name did not resolve
    /// or the host was refused before resolving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// `relayed`, `refused` (policy or address rules), `failed` (resolving or
    /// connecting) or `limited` (a bound of the run refused or cut it).
    pub outcome: String,
    /// Why it was refused, failed or limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the program asked the proxy for it (RFC 3339, ms), as `requested_at` of a call.
    pub opened_at: String,
    /// When it was over (RFC 3339, ms): when it was refused or failed, or when a relayed
    /// connection closed or was cut. Absent while it is open (and for one still open when
    /// its session went dormant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_at: Option<String>,
}

/// One tool call of a session, as the audit trail keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditCall {
    /// The id it was handed out under (the same in every retry of a resume, so a tool
    /// with side effects can use it as an idempotency key); none while it waits for its
    /// pause, and for a refused call.
    pub call_id: Option<String>,
    pub name: String,
    /// SHA-256 (hex) and size of the arguments as checked (the JSON text the caller
    /// receives); none for a refused call, whose arguments were not accepted.
    pub arguments_sha256: Option<String>,
    pub arguments_bytes: Option<u64>,
    /// When the program made the call (RFC 3339).
    pub requested_at: String,
    /// (extension) The MCP server sandcall called it on (`ToolDecl::mcp_server`); such
    /// a call is never handed out to the caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_server: Option<String>,
    /// Listed again by the replay of the session (docs/scaling.md): the record made
    /// when it was first handed out went with an earlier server.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
    pub outcome: AuditOutcome,
}

/// What became of a tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum AuditOutcome {
    /// Made, and not answered yet.
    Pending,
    /// The server refused it, and the program got the refusal; the caller never saw it.
    Refused { reason: String },
    /// The caller answered it: its result's size (or its error message's), whether it
    /// was an error, and how long after it was handed out.
    Answered {
        is_error: bool,
        result_bytes: u64,
        answered_at: String,
        latency_ms: u64,
    },
    /// No result within `tool_call_timeout_ms`: the program got a TimeoutError.
    TimedOut { answered_at: String, latency_ms: u64 },
}

impl AuditOutcome {
    /// Refused, answered or timed out: nothing more will happen to the call.
    pub fn is_settled(&self) -> bool {
        !matches!(self, AuditOutcome::Pending)
    }
}

/// POST /v1/exec/programmatic/cancel: names the session by its id, or by the
/// `X-LibreChat-Code-Request-ID` header of the request that started it.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
pub struct CancelRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// The header whose value names a programmatic start for `cancel` (`request_id`).
pub const REQUEST_ID_HEADER: &str = "x-librechat-code-request-id";

/// The execution profile a LibreChat client expects (`default` or `stateful`): a server
/// of the other profile answers 409 `execution_profile_mismatch` before running anything.
pub const EXPECTED_PROFILE_HEADER: &str = "x-codeapi-expected-profile";

/// The server's execution profile, on every response.
pub const EXECUTION_PROFILE_HEADER: &str = "x-codeapi-execution-profile";

/// A call the program made, as the caller receives it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    #[schema(value_type = serde_json::Value)]
    pub arguments: ToolArguments,
    /// The same object as `arguments` (LibreChat's client reads `input`).
    #[schema(value_type = serde_json::Value)]
    pub input: ToolArguments,
}

impl ToolCall {
    /// A call whose `arguments` and `input` are one shared text.
    pub fn new(id: String, name: String, arguments: ToolArguments) -> ToolCall {
        ToolCall {
            id,
            name,
            input: arguments.clone(),
            arguments,
        }
    }
}

/// A tool call's arguments as compact JSON text, shared: cloning it (as `input` is a
/// clone of `arguments`) copies no bytes, and the text takes its length in memory, where
/// a parsed `Value` can take many times more. It serializes as the JSON it holds.
#[derive(Debug, Clone)]
pub struct ToolArguments(std::sync::Arc<serde_json::value::RawValue>);

impl ToolArguments {
    pub fn new(text: Box<serde_json::value::RawValue>) -> ToolArguments {
        ToolArguments(text.into())
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }
}

/// Equal when the texts are: the server always writes compact JSON, and a deserialized
/// one is written compact again.
impl PartialEq for ToolArguments {
    fn eq(&self, other: &ToolArguments) -> bool {
        self.get() == other.get()
    }
}

impl Serialize for ToolArguments {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// Through a `Value`, so that it also works inside `ProgrammaticResponse`, whose
/// `status` tag makes serde buffer the fields before they reach this.
impl<'de> Deserialize<'de> for ToolArguments {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<ToolArguments, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        serde_json::value::to_raw_value(&value)
            .map(ToolArguments::new)
            .map_err(serde::de::Error::custom)
    }
}

/// Every answer of the programmatic routes, told apart by `status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ProgrammaticResponse {
    ToolCallRequired {
        session_id: String,
        continuation_token: String,
        tool_calls: Vec<ToolCall>,
        partial_stdout: String,
        partial_stderr: String,
        /// RFC 3339: when the paused session is ended if not resumed.
        expires_at: String,
    },
    Completed {
        session_id: String,
        stdout: String,
        stderr: String,
        files: Vec<OutputFile>,
        files_skipped: Vec<SkippedFile>,
        files_skipped_total: usize,
        tool_calls_made: u64,
        execution_time: u64,
        exit_code: Option<i32>,
        signal: Option<String>,
        timed_out: bool,
        stdout_truncated: bool,
        stderr_truncated: bool,
        /// Input files the program deleted, as on /v1/exec; absent when none was.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        deleted_files: Vec<String>,
        /// As on /v1/exec: output files that could not be stored. (Boxed, as the next
        /// one: rare, and large beside the other variants.)
        #[serde(default, skip_serializing_if = "Option::is_none")]
        artifact_delivery: Option<Box<ArtifactDelivery>>,
        /// As on /v1/exec: what the working directory held that was not collected.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        artifact_truncation: Option<Box<ArtifactTruncation>>,
        /// With a workspace: its id, as on /v1/exec.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        runtime_session_id: Option<String>,
        /// With a workspace: `new` or `reused`, as on /v1/exec.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        runtime_status: Option<RuntimeStatus>,
        /// (extension) For a session granted network: its connections and bytes, as on
        /// /v1/exec.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        network: Option<Box<NetworkSummary>>,
    },
    Error {
        session_id: String,
        error: String,
        error_type: String,
        stdout: String,
        stderr: String,
    },
    /// (extension) The program is running; only GET answers this.
    Running { session_id: String },
}

/// How a run ended, as `status` says it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecStatus {
    Ok,
    Failed,
    TimedOut,
    Killed,
}

impl ExecStatus {
    /// The status as the wire writes it.
    pub fn label(self) -> &'static str {
        match self {
            ExecStatus::Ok => "ok",
            ExecStatus::Failed => "failed",
            ExecStatus::TimedOut => "timed_out",
            ExecStatus::Killed => "killed",
        }
    }
}

/// An output file of a run: a file it created, a changed input (a new file, with
/// `modified_from`), or an input it left as it was or that is read-only (the input's own
/// id and storage session, with `inherited: true`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct OutputFile {
    pub id: String,
    pub name: String,
    pub storage_session_id: String,
    pub size: u64,
    /// `true` for an input returned as it was (unchanged, or read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inherited: Option<bool>,
    /// On an inherited input: the `entity_id` the request gave for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity_id: Option<String>,
    /// On a changed input: the input it was staged from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_from: Option<FileOrigin>,
}

/// Names a stored file: its id and `storage_session_id`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct FileOrigin {
    pub id: String,
    pub storage_session_id: String,
}

/// Output files that could not be stored, as LibreChat's client reads them: `attempted`
/// is `delivered` + `failed`, `failed` is above 0, and `status` is `failed` when none was
/// delivered, else `partial`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ArtifactDelivery {
    /// `artifact_delivery_failed`.
    pub code: String,
    /// `partial` or `failed`.
    pub status: String,
    pub attempted: usize,
    pub delivered: usize,
    pub failed: usize,
}

impl ArtifactDelivery {
    /// `None` when nothing failed.
    pub fn of(delivered: usize, failed: usize) -> Option<Self> {
        (failed > 0).then(|| ArtifactDelivery {
            code: "artifact_delivery_failed".into(),
            status: if delivered == 0 { "failed" } else { "partial" }.into(),
            attempted: delivered + failed,
            delivered,
            failed,
        })
    }
}

/// What was left out of a run's outputs: `skipped_count` entries in all, the first (at
/// most 100) named in `skipped`, and why, in `reasons` (each once): `max_files`, `depth`,
/// `size`, `path` (a name, symlink, hard link or special file) or `unreadable`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ArtifactTruncation {
    pub reasons: Vec<String>,
    pub skipped: Vec<String>,
    pub skipped_count: usize,
}

impl ArtifactTruncation {
    /// From `files_skipped` and `files_skipped_total`; `None` when nothing was skipped.
    /// Output files that could not be stored (`undelivered` of them) are
    /// `artifact_delivery`'s, not counted here.
    pub fn of(skipped: &[SkippedFile], total: usize, undelivered: usize) -> Option<Self> {
        let is_undelivered = |r: &str| {
            matches!(
                r,
                "quota_exceeded" | "storage_full" | "storage_unavailable" | "storage_error"
            )
        };
        let kept: Vec<&SkippedFile> = skipped.iter().filter(|s| !is_undelivered(&s.reason)).collect();
        let count = total.saturating_sub(undelivered);
        if count == 0 {
            return None;
        }
        let mut reasons: Vec<String> = Vec::new();
        for s in &kept {
            let reason = match s.reason.as_str() {
                "too_many_files" => "max_files",
                "too_deep" => "depth",
                "too_large" | "over_workspace_limit" => "size",
                "invalid_name" | "symlink" | "hard_link" | "not_regular_file" => "path",
                _ => "unreadable",
            };
            if !reasons.iter().any(|r| r == reason) {
                reasons.push(reason.into());
            }
        }
        Some(ArtifactTruncation {
            reasons,
            skipped: kept.iter().map(|s| s.name.clone()).collect(),
            skipped_count: count,
        })
    }
}

/// Whether a run in a workspace found files an earlier run left.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeStatus {
    New,
    Reused,
}

/// Something of the working directory that was not returned as an output file, and why.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct SkippedFile {
    pub name: String,
    pub reason: String,
}

/// POST /v1/upload's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct UploadResponse {
    pub message: String,
    pub storage_session_id: String,
    pub files: Vec<UploadedFile>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct UploadedFile {
    pub id: String,
    #[serde(rename = "fileId")]
    pub file_id: String,
    pub name: String,
    pub filename: String,
    pub storage_session_id: String,
    pub size: u64,
    pub content_type: String,
}

/// POST /v1/upload/batch's answer (also the body of its 400 when every file failed,
/// which then carries `error` and `error_type` too).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct BatchUploadResponse {
    /// `success`, `partial_success` or `error` (every file failed).
    pub message: String,
    pub storage_session_id: String,
    /// One entry per file part, in the order they were sent.
    pub files: Vec<BatchFileResult>,
    pub succeeded: usize,
    pub failed: usize,
    /// Only when every file failed: why, as in every error body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Only when every file failed: `invalid_request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
}

/// What became of one file of a batch upload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct BatchFileResult {
    /// `success` or `error`.
    pub status: String,
    /// The stored file's id (empty when it failed).
    #[serde(rename = "fileId")]
    pub file_id: String,
    /// The name as stored, or as sent when it failed.
    pub filename: String,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An entry of GET /v1/files/{session_id}?detail=summary (and the base of `full`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct FileSummary {
    /// The object name, `{session_id}/{file_id}` plus the file's extension, if any.
    pub name: String,
    pub size: u64,
    #[serde(rename = "lastModified")]
    pub last_modified: String,
    /// The hex SHA-256 of the content, in double quotes.
    pub etag: String,
}

/// An entry of GET /v1/files/{session_id}?detail=full.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct FileFull {
    pub name: String,
    pub size: u64,
    #[serde(rename = "lastModified")]
    pub last_modified: String,
    pub etag: String,
    pub metadata: FileObjectMetadata,
    #[serde(rename = "contentType")]
    pub content_type: String,
}

/// The object metadata of a `full` entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct FileObjectMetadata {
    #[serde(rename = "content-type")]
    pub content_type: String,
    /// The name the file was uploaded or collected under (a relative path).
    #[serde(rename = "original-filename")]
    pub original_filename: String,
    /// Always `none`: the name is given as it is.
    #[serde(rename = "original-filename-encoded")]
    pub original_filename_encoded: String,
}

/// An entry of GET /v1/files/{session_id}?detail=normalized.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct FileNormalized {
    pub id: String,
    /// The original filename (a relative path).
    pub name: String,
    pub storage_session_id: String,
    pub size: u64,
    #[serde(rename = "contentType")]
    pub content_type: String,
    #[serde(rename = "lastModified")]
    pub last_modified: String,
    /// Present (`true`) only for a file uploaded with `read_only=true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
}

/// DELETE /v1/files/{session_id}/{file_id}'s answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct DeleteFileResponse {
    /// `File deleted successfully`.
    pub message: String,
    pub session_id: String,
    #[serde(rename = "fileId")]
    pub file_id: String,
}

/// GET /v1/sessions/{session_id}/objects/{file_id}.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ObjectInfo {
    #[serde(rename = "lastModified")]
    pub last_modified: String,
    pub size: u64,
    #[serde(rename = "contentType")]
    pub content_type: String,
    pub etag: String,
}

/// The 200 answer of POST /v1/exec, for every run that started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ExecResponse {
    pub session_id: String,
    pub status: ExecStatus,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub exit_code: Option<i32>,
    /// Alias of `exit_code`.
    pub code: Option<i32>,
    pub signal: Option<String>,
    pub timed_out: bool,
    pub oom_killed: bool,
    pub files: Vec<OutputFile>,
    /// (extension) What the working directory held that was not returned, at most 100.
    pub files_skipped: Vec<SkippedFile>,
    /// (extension) How many entries were skipped in all.
    pub files_skipped_total: usize,
    /// Input files (by the name they were staged under) that the run deleted; absent
    /// when none was.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted_files: Vec<String>,
    /// Output files that were collected but could not be stored (the principal's quota,
    /// a full disk); absent when every one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_delivery: Option<ArtifactDelivery>,
    /// What the working directory held that was not collected (`files_skipped`, in
    /// LibreChat's words); absent when nothing was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_truncation: Option<ArtifactTruncation>,
    /// With a workspace (`runtime_session_hint` or `workspace_id`): the workspace's id,
    /// a hash of the principal and its name, the same for every run in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_session_id: Option<String>,
    /// With a workspace: `reused` when the run started with files that an earlier run in
    /// it left, `new` when it started empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_status: Option<RuntimeStatus>,
    pub execution_time: u64,
    /// Alias of `execution_time`.
    pub wall_time: u64,
    pub cpu_time: u64,
    pub memory_peak: u64,
    /// (extension) For a run granted network: its connections and bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSummary>,
}

/// GET /v1/health: 200 with status `ok`, or 503 with status `unavailable` and the reason.
/// Without credentials on a server with API keys, only `status`, `version` and `reason`;
/// the other fields come with a valid key, or in local mode.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Health {
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
    pub version: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cgroup: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub active_runs: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub max_concurrent_runs: Option<usize>,
    /// Requests waiting for a run slot now (extension).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub queued_runs: Option<usize>,
    /// Programmatic sessions holding a sandbox now, paused ones included (extension).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub sessions: Option<usize>,
    /// Of those, the ones paused, waiting for their caller (extension).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub paused_sessions: Option<usize>,
    /// Paused sessions that hold no sandbox (evicted, or left paused by an earlier
    /// server), kept only in the session store (extension).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub dormant_sessions: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub max_sessions: Option<usize>,
    /// Warm sandboxes ready now (extension).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub warm_idle: Option<usize>,
}

/// GET /v1/runtimes (extension): the managed runtimes programs run on, with their
/// pinned packages. Empty when Python runs on the bare interpreter.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct RuntimesResponse {
    pub runtimes: Vec<RuntimeInfo>,
}

/// One managed runtime.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct RuntimeInfo {
    /// `python-` and 16 hex characters of its lock file's hash; `npm-` and 16 hex
    /// characters for the npm packages for programs.
    pub name: String,
    /// The language it serves (`python`; `javascript` for the npm set).
    pub language: String,
    /// Every package it holds (the npm set: its top-level packages), at its exact version.
    pub packages: Vec<RuntimePackage>,
}

/// A package of a runtime.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct RuntimePackage {
    pub name: String,
    pub version: String,
}

/// The languages sandcall runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    Python,
    Bash,
    #[serde(rename = "javascript")]
    JavaScript,
    #[serde(rename = "typescript")]
    TypeScript,
    C,
    Cpp,
    Go,
    Java,
    Php,
    Rust,
    R,
    Fortran,
    D,
    /// A language the operator declared in the server's config: the index of its
    /// `[[languages]]` entry. Its names live there, not here.
    Declared(u16),
}

impl Language {
    /// Every built-in language, in the order they are listed to clients.
    pub const ALL: [Language; 13] = [
        Language::Python,
        Language::Bash,
        Language::JavaScript,
        Language::TypeScript,
        Language::C,
        Language::Cpp,
        Language::Go,
        Language::Java,
        Language::Php,
        Language::Rust,
        Language::R,
        Language::Fortran,
        Language::D,
    ];

    /// The names a language answers to, its own name first (matched in any case). The
    /// rest of a language's declaration lives in the server (`runtime/languages.rs`).
    /// A declared language's names are in the server's config: empty here.
    pub fn names(self) -> &'static [&'static str] {
        match self {
            Language::Python => &["python", "py", "python3"],
            Language::Bash => &["bash", "sh"],
            Language::JavaScript => &["javascript", "js", "node"],
            Language::TypeScript => &["typescript", "ts"],
            Language::C => &["c"],
            Language::Cpp => &["cpp", "c++"],
            Language::Go => &["go", "golang"],
            Language::Java => &["java"],
            Language::Php => &["php"],
            Language::Rust => &["rust", "rs"],
            Language::R => &["r"],
            Language::Fortran => &["fortran", "f90"],
            Language::D => &["d"],
            Language::Declared(_) => &[],
        }
    }

    /// Parses a built-in language's name or alias (see `names`).
    pub fn parse(name: &str) -> Option<Self> {
        let name = name.trim().to_ascii_lowercase();
        Language::ALL.into_iter().find(|l| l.names().contains(&name.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifact_reports_follow_the_clients_rules() {
        assert_eq!(ArtifactDelivery::of(3, 0), None);
        let partial = ArtifactDelivery::of(2, 1).unwrap();
        assert_eq!(
            (
                partial.status.as_str(),
                partial.attempted,
                partial.delivered,
                partial.failed
            ),
            ("partial", 3, 2, 1)
        );
        assert_eq!(ArtifactDelivery::of(0, 2).unwrap().status, "failed");
        let skip = |name: &str, reason: &str| SkippedFile {
            name: name.into(),
            reason: reason.into(),
        };
        assert_eq!(ArtifactTruncation::of(&[], 0, 0), None);
        // Only undelivered files: artifact_delivery's, not truncation.
        assert_eq!(ArtifactTruncation::of(&[skip("a", "quota_exceeded")], 1, 1), None);
        let t = ArtifactTruncation::of(
            &[
                skip("big", "too_large"),
                skip("link", "symlink"),
                skip("q", "storage_error"),
                skip("huge", "over_workspace_limit"),
                skip("deep", "too_deep"),
                skip("n", "too_many_files"),
            ],
            150,
            1,
        )
        .unwrap();
        assert_eq!(t.reasons, ["size", "path", "depth", "max_files"]);
        assert_eq!(t.skipped, ["big", "link", "huge", "deep", "n"]);
        assert_eq!(t.skipped_count, 149, "the 100-entry list is not the count");
    }

    #[test]
    fn language_aliases() {
        assert_eq!(Language::parse("py"), Some(Language::Python));
        assert_eq!(Language::parse("Python3"), Some(Language::Python));
        assert_eq!(Language::parse("sh"), Some(Language::Bash));
        assert_eq!(Language::parse("ruby"), None);
        for js in ["js", "JavaScript", "node"] {
            assert_eq!(Language::parse(js), Some(Language::JavaScript));
        }
        for ts in ["ts", "TypeScript"] {
            assert_eq!(Language::parse(ts), Some(Language::TypeScript));
        }
        // LibreChat's names for the compiled languages.
        for (name, language) in [
            ("c", Language::C),
            ("cpp", Language::Cpp),
            ("C++", Language::Cpp),
            ("go", Language::Go),
            ("java", Language::Java),
            ("php", Language::Php),
            ("rs", Language::Rust),
            ("rust", Language::Rust),
            ("r", Language::R),
            ("f90", Language::Fortran),
            ("d", Language::D),
        ] {
            assert_eq!(Language::parse(name), Some(language), "{name}");
        }
    }

    #[test]
    fn file_ref_accepts_session_id() {
        let f: FileRef = serde_json::from_str(r#"{"id":"a","session_id":"b","name":"x.csv","kind":"user"}"#).unwrap();
        assert_eq!(f.session(), Some("b"));
        let both = r#"{"id":"a","session_id":"b","storage_session_id":"c","name":"x.csv"}"#;
        let f: FileRef = serde_json::from_str(both).unwrap();
        assert_eq!(f.session(), Some("c"));
    }

    #[test]
    fn tool_calls_write_one_text_under_both_keys_and_read_back() {
        let text = serde_json::value::to_raw_value(&serde_json::json!({"base": "USD", "n": [1, 2]})).unwrap();
        let call = ToolCall::new("c1".into(), "rate".into(), ToolArguments::new(text));
        assert!(std::sync::Arc::ptr_eq(&call.arguments.0, &call.input.0));
        let wire = serde_json::to_value(&call).unwrap();
        assert_eq!(
            wire,
            serde_json::json!({"id": "c1", "name": "rate", "arguments": {"base": "USD", "n": [1, 2]}, "input": {"base": "USD", "n": [1, 2]}})
        );
        let paused = serde_json::json!({"status": "tool_call_required", "session_id": "s", "continuation_token": "t",
            "tool_calls": [wire], "partial_stdout": "", "partial_stderr": "", "expires_at": "x"});
        let back: ProgrammaticResponse = serde_json::from_value(paused.clone()).unwrap();
        let ProgrammaticResponse::ToolCallRequired { tool_calls, .. } = &back else {
            panic!("{back:?}")
        };
        assert_eq!(tool_calls[0], call);
        assert_eq!(serde_json::to_value(&back).unwrap(), paused);
    }

    #[test]
    fn status_is_snake_case() {
        assert_eq!(serde_json::to_string(&ExecStatus::TimedOut).unwrap(), "\"timed_out\"");
    }
}
