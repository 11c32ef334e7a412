//! Programmatic sessions: their tool calls and results, how long they wait and live, how many there are, where they are kept, and the MCP servers their tools may go to.

use serde::{Deserialize, Serialize};

/// SessionsConfig: the keys of docs/configuration.md this section holds. Each field's doc comment
/// gives its unit and default.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SessionsConfig {
    /// Programmatic runs: a pending tool call with no result after this many ms raises
    /// TimeoutError in the program. Default 300000.
    pub tool_call_timeout_ms: u64,
    /// Programmatic runs: a paused session not resumed within this many seconds is
    /// ended and its sandbox reclaimed. Default 600.
    pub session_expiry_s: u64,
    /// Programmatic runs: a paused session idle this many seconds is written out (its
    /// journal is already in the session store) and its sandbox freed; a resume brings it
    /// back by replay. 0: never. Default 120.
    pub session_idle_evict_s: u64,
    /// Tool calls one programmatic run may make: the default and the ceiling of the
    /// request's `max_tool_calls`. Default 100.
    pub max_tool_calls: u64,
    /// Largest tool call (its arguments as JSON), in bytes. Default 1048576.
    pub max_tool_call_bytes: u64,
    /// Programmatic sessions alive at once, paused ones included; beyond this a new one
    /// gets 503 `at_capacity`. Default: number of cores × 32.
    pub max_sessions: usize,
    /// Key that signs continuation tokens, as 64 hex characters. Default: generated on
    /// first start into `<data_dir>/token.key` (mode 0600) and kept there.
    pub token_secret: Option<String>,
    /// Where programmatic sessions are journalled: absent or `"embedded"`, the data dir
    /// (`<data_dir>/sessions.redb`); `"redis://host:port/db"`, a Redis that every node of
    /// a cluster shares (then `node_url` and `token_secret` are required). Default
    /// embedded.
    pub session_store: Option<String>,
    /// MCP servers whose tools programs may call (`[[mcp_servers]]`: name, command,
    /// args, env): a declared tool with `mcp_server` is called by sandcall, as an MCP
    /// client over stdio, and its result goes back to the program (docs/mcp.md).
    /// Default none.
    pub mcp_servers: Vec<McpServerConfig>,
    /// MCP server processes alive at once, every server and principal together (each
    /// principal has its own process of a server unless the server is `shared`). A
    /// first call past it stops the process idle longest (no call in flight); when every
    /// one is busy the call gets a tool error. Default 32.
    pub max_mcp_processes: usize,
    /// An MCP server process with no call for this many seconds is stopped; the next
    /// call starts it again. Default 300.
    pub mcp_idle_stop_s: u64,
    /// Programmatic runs: bytes of tool-call arguments (as JSON) handed out in one
    /// pause, all its calls together; a call that would go over is refused in the
    /// program. Default 4194304 (4 MiB).
    pub max_pause_bytes: u64,
    /// Programmatic runs: bytes of tool-call arguments one session may hand out over
    /// its whole life. Default 33554432 (32 MiB).
    pub max_session_tool_bytes: u64,
    /// Programmatic runs: the largest result of one tool call, as the JSON text the
    /// caller sends, in bytes; a resume's body may hold three results this size (see
    /// `max_programmatic_body_bytes`). Default 5242880 (5 MiB).
    pub max_tool_result_bytes: u64,
    /// Programmatic runs: what `timeout` bounds. `run` (the default): the program's own
    /// running time, the clock stopped while it waits for its caller; `loop`: the whole
    /// loop, the waits included.
    pub programmatic_timeout_scope: TimeoutScope,
    /// Programmatic sessions one principal may hold at once, paused ones included;
    /// past it a new one gets 429 `principal_at_capacity`. Default: `max_sessions` / 4
    /// (at least 1) with credentials, `max_sessions` in local mode.
    pub max_sessions_per_principal: Option<usize>,
    /// Programmatic sessions: bytes the audit trails of ended sessions (kept readable
    /// for `session_expiry_s` after their end) may hold in memory, all together; past it
    /// the trails of the sessions that ended first are let go (`GET .../calls` then says
    /// `trail_released`). 0: an ended session keeps no trail. Default 67108864 (64 MiB).
    pub max_ended_session_bytes: u64,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            tool_call_timeout_ms: 300_000,
            session_expiry_s: 600,
            session_idle_evict_s: 120,
            max_tool_calls: 100,
            max_tool_call_bytes: 1 << 20,
            max_sessions: cores() * 32,
            token_secret: None,
            session_store: None,
            mcp_servers: Vec::new(),
            max_mcp_processes: 32,
            mcp_idle_stop_s: 300,
            max_pause_bytes: 4 << 20,
            max_session_tool_bytes: 32 << 20,
            max_tool_result_bytes: 5 << 20,
            programmatic_timeout_scope: TimeoutScope::Run,
            max_sessions_per_principal: None,
            max_ended_session_bytes: 64 << 20,
        }
    }
}

/// A session setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionsError {
    #[error("{0} must be above 0")]
    Zero(&'static str),
    #[error("token_secret must be 64 hex characters (32 bytes)")]
    TokenSecret,
    #[error(
        "session_store = redis://... needs token_secret, the same on every node (a token made by one \
         node is checked by another)"
    )]
    RedisWithoutTokenSecret,
    #[error("session_store = {0:?}: expected \"embedded\" or \"redis://host:port/db\"")]
    SessionStore(String),
    #[error("mcp_servers[{0}] needs a name and a command")]
    McpServerIncomplete(usize),
    #[error("mcp_servers[{0}]: the name {1:?} is taken")]
    McpServerNameTaken(usize, String),
}

impl SessionsConfig {
    pub fn validate(&self) -> Result<(), SessionsError> {
        for (name, value) in [
            ("tool_call_timeout_ms", self.tool_call_timeout_ms),
            ("session_expiry_s", self.session_expiry_s),
            ("max_tool_call_bytes", self.max_tool_call_bytes),
            ("max_sessions", self.max_sessions as u64),
            ("max_pause_bytes", self.max_pause_bytes),
            ("max_session_tool_bytes", self.max_session_tool_bytes),
            ("max_tool_result_bytes", self.max_tool_result_bytes),
            ("max_mcp_processes", self.max_mcp_processes as u64),
            ("mcp_idle_stop_s", self.mcp_idle_stop_s),
            (
                "max_sessions_per_principal",
                self.max_sessions_per_principal.unwrap_or(1) as u64,
            ),
        ] {
            if value == 0 {
                return Err(SessionsError::Zero(name));
            }
        }
        if let Some(secret) = &self.token_secret {
            if secret.len() != 64 || !secret.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(SessionsError::TokenSecret);
            }
        }
        match self.session_store.as_deref() {
            None | Some("embedded") => {}
            Some(url) if url.starts_with("redis://") => {
                if self.token_secret.is_none() {
                    return Err(SessionsError::RedisWithoutTokenSecret);
                }
            }
            Some(other) => return Err(SessionsError::SessionStore(other.to_owned())),
        }
        for (i, m) in self.mcp_servers.iter().enumerate() {
            if m.name.is_empty() || m.name.chars().any(char::is_control) || m.command.is_empty() {
                return Err(SessionsError::McpServerIncomplete(i));
            }
            if self.mcp_servers[..i].iter().any(|o| o.name == m.name) {
                return Err(SessionsError::McpServerNameTaken(i, m.name.clone()));
            }
        }
        Ok(())
    }

    /// Sessions are kept in Redis, shared by many nodes.
    pub fn in_redis(&self) -> bool {
        self.session_store
            .as_deref()
            .is_some_and(|url| url.starts_with("redis://"))
    }
}

/// What a programmatic request's `timeout` bounds (`programmatic_timeout_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeoutScope {
    /// The program's own running time: the clock stops while it waits for its caller.
    Run,
    /// The whole loop, the waits for the caller included.
    Loop,
}

/// An MCP server programs' tools may go to (`[[mcp_servers]]`): sandcall starts
/// `command` with `args` on first use, in an environment holding only `env` and a
/// minimal `PATH` (none of sandcall's own: its keys and secrets stay out), and speaks
/// MCP to it over its stdin and stdout. Each principal gets its own process unless
/// `shared`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// What tool declarations name it by (`mcp_server`).
    pub name: String,
    /// The program to start: an absolute path, or a name looked up in PATH.
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// The tool server's whole environment, with `PATH` (default
    /// `/usr/local/bin:/usr/bin:/bin`) added unless named here.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// One process for every principal instead of one per principal: its state (files,
    /// caches, sessions it keeps) then crosses tenants. Default false.
    #[serde(default)]
    pub shared: bool,
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
