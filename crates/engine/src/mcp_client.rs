//! sandcall as an MCP client: the MCP servers of the config (`mcp_servers`), whose tools
//! programs call as declared tools with `mcp_server`. A server runs as a process of its
//! own (speaking MCP on its stdin and stdout) per principal, or one for every principal
//! when its config says `shared`: a process is started on its principal's first call,
//! kept for the next ones, stopped after `mcp_idle_stop_s` without a call, and started
//! again by the next call when it went away. At most `max_mcp_processes` live at once: a
//! new one stops the one idle longest, and when every one has a call in flight the call
//! is refused. A process gets a cleared environment: its config's `env` and a minimal
//! `PATH`, never sandcall's own (API keys, token secrets, cloud credentials). The
//! session driver hands a call here and gives the answer to the program: the caller of
//! the session never sees the call.
//!
//! Must not: know sessions, journals or the audit trail (the driver records the call).

use crate::error::EngineError;
use crate::error::ErrorKind;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{Peer, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use sandcall_config::{McpServerConfig, SessionsConfig};
use sandcall_sandbox::protocol::ToolReply;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// The `PATH` a tool server gets when its config's `env` names none.
pub const MCP_DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The configured MCP servers and their processes. Cheap to clone.
#[derive(Clone)]
pub struct McpServers {
    inner: Arc<Inner>,
}

struct Inner {
    configs: Vec<McpServerConfig>,
    max_processes: usize,
    idle_stop: Duration,
    pool: Mutex<Pool>,
}

/// The processes, by server and principal; changed only under the lock.
#[derive(Default)]
struct Pool {
    entries: HashMap<Key, Entry>,
    /// A task stops idle processes while there are any.
    reaper: bool,
}

/// Which process: the server's index in the config, and the principal (none for a
/// `shared` server).
type Key = (usize, Option<String>);

struct Entry {
    process: Arc<Process>,
    /// Calls (and tool listings) using it now: one with any is never stopped.
    in_flight: usize,
    last_used: Instant,
}

/// One tool server process: started on first use; none again once it went away.
#[derive(Default)]
struct Process {
    running: tokio::sync::Mutex<Option<RunningService<RoleClient, ()>>>,
}

/// A call's hold on its process: while it lives the process is not stopped.
struct Lease {
    inner: Arc<Inner>,
    key: Key,
    process: Arc<Process>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(entry) = lock(&self.inner.pool).entries.get_mut(&self.key) {
            entry.in_flight -= 1;
            entry.last_used = Instant::now();
        }
    }
}

fn lock(pool: &Mutex<Pool>) -> MutexGuard<'_, Pool> {
    // A panic under the lock leaves counts that are still usable.
    pool.lock().unwrap_or_else(|e| e.into_inner())
}

impl Default for McpServers {
    fn default() -> Self {
        McpServers::new(&SessionsConfig::default())
    }
}

impl McpServers {
    pub fn new(config: &SessionsConfig) -> McpServers {
        McpServers {
            inner: Arc::new(Inner {
                configs: config.mcp_servers.clone(),
                max_processes: config.max_mcp_processes.max(1),
                idle_stop: Duration::from_secs(config.mcp_idle_stop_s),
                pool: Mutex::new(Pool::default()),
            }),
        }
    }

    /// The process of server `index` for `principal`, made when there is none (after
    /// stopping the one idle longest when the pool is full).
    fn lease(&self, index: usize, principal: &str) -> Result<Lease, String> {
        let shared = self.inner.configs[index].shared;
        let key: Key = (index, (!shared).then(|| principal.to_owned()));
        let mut pool = lock(&self.inner.pool);
        if !pool.entries.contains_key(&key) {
            if pool.entries.len() >= self.inner.max_processes {
                let idlest = pool
                    .entries
                    .iter()
                    .filter(|(_, e)| e.in_flight == 0)
                    .min_by_key(|(_, e)| e.last_used)
                    .map(|(k, _)| k.clone());
                let Some(idlest) = idlest else {
                    return Err(format!(
                        "every MCP server process (max_mcp_processes = {}) is answering a call; try again later",
                        self.inner.max_processes
                    ));
                };
                if let Some(entry) = pool.entries.remove(&idlest) {
                    stop(&self.inner.configs[idlest.0].name, entry.process, "to make room");
                }
            }
            pool.entries.insert(
                key.clone(),
                Entry {
                    process: Arc::default(),
                    in_flight: 0,
                    last_used: Instant::now(),
                },
            );
            if !pool.reaper {
                pool.reaper = true;
                tokio::spawn(reap(Arc::downgrade(&self.inner)));
            }
        }
        let Some(entry) = pool.entries.get_mut(&key) else {
            return Err("no MCP server process".to_owned());
        };
        entry.in_flight += 1;
        entry.last_used = Instant::now();
        Ok(Lease {
            inner: self.inner.clone(),
            process: entry.process.clone(),
            key,
        })
    }

    fn index(&self, server: &str) -> Option<usize> {
        self.inner.configs.iter().position(|c| c.name == server)
    }

    /// Calls tool `tool` of server `server`, in `principal`'s process of it, with
    /// `arguments` (a JSON object, as checked against the declaration), within
    /// `timeout`; every failure is a tool error the program gets, never a failure of
    /// the session.
    pub async fn call(
        &self,
        principal: &str,
        server: &str,
        tool: &str,
        arguments: &str,
        timeout: Duration,
    ) -> ToolReply {
        let Some(index) = self.index(server) else {
            return ToolReply::error("refused", format!("no MCP server {server:?} in this server's config"));
        };
        let arguments = match serde_json::from_str::<serde_json::Value>(arguments) {
            Ok(serde_json::Value::Object(map)) => map,
            Ok(serde_json::Value::Null) => Default::default(),
            _ => return ToolReply::error("refused", format!("the arguments of {tool} must be an object")),
        };
        let lease = match self.lease(index, principal) {
            Ok(lease) => lease,
            Err(message) => return ToolReply::error("refused", message),
        };
        let config = &self.inner.configs[index];
        let call = async {
            let peer = lease.process.peer(config).await?;
            let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
            match peer.call_tool(params).await {
                Ok(result) => Ok(result),
                Err(e) => {
                    // A server that went away is started again by the next call.
                    if peer.is_transport_closed() {
                        *lease.process.running.lock().await = None;
                    }
                    Err(format!("MCP server {server:?}: {e}"))
                }
            }
        };
        let result = match tokio::time::timeout(timeout, call).await {
            Ok(Ok(result)) => result,
            Ok(Err(message)) => {
                tracing::warn!(mcp_server = server, tool, error = %message, "an MCP tool call failed");
                return ToolReply::error("tool_error", message);
            }
            Err(_) => {
                return ToolReply::error(
                    "timeout",
                    format!(
                        "MCP server {server:?} did not answer {tool} within tool_call_timeout ({} ms)",
                        timeout.as_millis()
                    ),
                )
            }
        };
        drop(lease);
        reply_of(tool, result)
    }
}

/// Stops a process that left the pool (no call holds it), off the caller's path.
fn stop(name: &str, process: Arc<Process>, why: &'static str) {
    let name = name.to_owned();
    tokio::spawn(async move {
        let service = process.running.lock().await.take();
        if let Some(service) = service {
            tracing::info!(mcp_server = %name, why, "MCP server process stopped");
            // Closing its stdin, then SIGTERM, then SIGKILL (rmcp's child transport).
            let _ = service.cancel().await;
        }
    });
}

/// Stops the processes idle `mcp_idle_stop_s`, until there are none (or the servers
/// are dropped).
async fn reap(inner: Weak<Inner>) {
    loop {
        let tick = match inner.upgrade() {
            Some(inner) => (inner.idle_stop / 4).clamp(Duration::from_millis(100), Duration::from_secs(10)),
            None => return,
        };
        tokio::time::sleep(tick).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let mut pool = lock(&inner.pool);
        let idle: Vec<Key> = pool
            .entries
            .iter()
            .filter(|(_, e)| e.in_flight == 0 && e.last_used.elapsed() >= inner.idle_stop)
            .map(|(k, _)| k.clone())
            .collect();
        for key in idle {
            if let Some(entry) = pool.entries.remove(&key) {
                stop(&inner.configs[key.0].name, entry.process, "idle");
            }
        }
        if pool.entries.is_empty() {
            pool.reaper = false;
            return;
        }
    }
}

/// What the program gets for an MCP tool's result: its error text as a tool error, else
/// its structured content, else its text (parsed when it is one JSON object or array).
fn reply_of(tool: &str, result: rmcp::model::CallToolResult) -> ToolReply {
    let text: Vec<&str> = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect();
    if result.is_error == Some(true) {
        let message = if text.is_empty() {
            format!("{tool} failed")
        } else {
            text.join("\n")
        };
        return ToolReply::error("tool_error", message);
    }
    // The structured result when the tool gives one; else its text, parsed when it
    // is one JSON object or array (what many servers send as text).
    let value = match result.structured_content {
        Some(value) => value,
        None => match text.as_slice() {
            [one] => serde_json::from_str::<serde_json::Value>(one)
                .ok()
                .filter(|v| v.is_object() || v.is_array())
                .unwrap_or_else(|| serde_json::Value::String((*one).to_owned())),
            _ => serde_json::Value::String(text.join("\n")),
        },
    };
    match serde_json::value::to_raw_value(&value) {
        Ok(raw) => ToolReply::result(raw),
        Err(e) => ToolReply::error("tool_error", format!("the result of {tool} cannot be encoded: {e}")),
    }
}

/// How long a server may take to start and list its tools for a first call.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);

impl McpServers {
    /// Tool declarations for every tool server `server` lists (in `principal`'s process
    /// of it): its name, description and input schema, going to that server.
    pub async fn declarations(
        &self,
        principal: &str,
        server: &str,
    ) -> Result<Vec<sandcall_api::ToolDecl>, EngineError> {
        let Some(index) = self.index(server) else {
            return Err(unknown_server(server));
        };
        let list = async {
            let lease = self.lease(index, principal)?;
            let peer = lease.process.peer(&self.inner.configs[index]).await?;
            peer.list_all_tools()
                .await
                .map_err(|e| format!("listing its tools: {e}"))
        };
        let tools = match tokio::time::timeout(LIST_TIMEOUT, list).await {
            Ok(Ok(tools)) => tools,
            failed => {
                let detail = match failed {
                    Ok(Err(e)) => e,
                    _ => format!("no tool list within {} s", LIST_TIMEOUT.as_secs()),
                };
                tracing::warn!(mcp_server = server, error = %detail, "an MCP server did not list its tools");
                return Err(EngineError::new(
                    ErrorKind::Upstream,
                    sandcall_api::error_type::MCP_SERVER_FAILURE,
                    format!("MCP server {server:?} is not available (it did not list its tools)"),
                ));
            }
        };
        tools
            .into_iter()
            .map(|t| {
                let schema = serde_json::Value::Object((*t.input_schema).clone());
                Ok(sandcall_api::ToolDecl {
                    name: t.name.into_owned(),
                    description: t.description.map(|d| d.into_owned()),
                    parameters: Some(serde_json::value::to_raw_value(&schema).map_err(|e| {
                        EngineError::internal(sandcall_api::error_type::INTERNAL, &format!("an MCP tool schema: {e}"))
                    })?),
                    mcp_server: Some(server.to_owned()),
                })
            })
            .collect()
    }
}

/// A request names an MCP server the config does not have.
pub fn unknown_server(server: &str) -> EngineError {
    EngineError::bad_request(format!(
        "a tool names MCP server {server:?}, which this server's config (mcp_servers) does not"
    ))
}

impl Process {
    /// The connection, started when there is none.
    async fn peer(&self, config: &McpServerConfig) -> Result<Peer<RoleClient>, String> {
        let mut running = self.running.lock().await;
        if let Some(service) = running.as_ref().filter(|s| !s.is_transport_closed()) {
            return Ok(service.peer().clone());
        }
        let name = &config.name;
        let mut command = tokio::process::Command::new(&config.command);
        // Nothing of sandcall's environment: it holds the API keys, the token and JWT
        // secrets and the cloud credentials. Only what the config names, and a PATH.
        command.args(&config.args).env_clear();
        if !config.env.contains_key("PATH") {
            command.env("PATH", MCP_DEFAULT_PATH);
        }
        command.envs(&config.env);
        let transport =
            TokioChildProcess::new(command).map_err(|e| format!("MCP server {name:?} could not be started: {e}"))?;
        let service = ().serve(transport).await.map_err(|e| format!("MCP server {name:?} did not start MCP: {e}"))?;
        tracing::info!(mcp_server = %name, "MCP server started");
        let peer = service.peer().clone();
        *running = Some(service);
        Ok(peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{CallToolResult, ContentBlock};

    fn result_of(reply: &ToolReply) -> serde_json::Value {
        assert!(reply.ok, "{reply:?}");
        serde_json::from_str(reply.result.as_ref().unwrap().get()).unwrap()
    }

    #[test]
    fn structured_content_then_json_text_then_plain_text() {
        let structured = CallToolResult::structured(serde_json::json!({"t": [1, 2]}));
        assert_eq!(result_of(&reply_of("f", structured)), serde_json::json!({"t": [1, 2]}));
        let json_text = CallToolResult::success(vec![ContentBlock::text(r#"[1, {"a": 2}]"#)]);
        assert_eq!(result_of(&reply_of("f", json_text)), serde_json::json!([1, {"a": 2}]));
        // A number or a string in text stays text: only objects and arrays are parsed.
        let number = CallToolResult::success(vec![ContentBlock::text("42")]);
        assert_eq!(result_of(&reply_of("f", number)), serde_json::json!("42"));
        let two = CallToolResult::success(vec![ContentBlock::text("a"), ContentBlock::text("{}")]);
        assert_eq!(result_of(&reply_of("f", two)), serde_json::json!("a\n{}"));
    }

    #[test]
    fn a_tool_error_is_the_programs_tool_error() {
        let reply = reply_of("f", CallToolResult::error(vec![ContentBlock::text("no such city")]));
        assert!(!reply.ok);
        assert_eq!(reply.kind.as_deref(), Some("tool_error"));
        assert_eq!(reply.error.as_deref(), Some("no such city"));
        let bare = reply_of("f", CallToolResult::error(vec![]));
        assert_eq!(bare.error.as_deref(), Some("f failed"));
    }

    #[tokio::test]
    async fn an_unknown_server_or_one_that_cannot_start_is_a_tool_error() {
        let servers = McpServers::new(&SessionsConfig {
            mcp_servers: vec![McpServerConfig {
                name: "gone".into(),
                command: "/nonexistent/mcp-server".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        let reply = servers.call("p", "nope", "t", "{}", Duration::from_secs(5)).await;
        assert_eq!(reply.kind.as_deref(), Some("refused"));
        let reply = servers.call("p", "gone", "t", "{}", Duration::from_secs(5)).await;
        assert_eq!(reply.kind.as_deref(), Some("tool_error"));
        assert!(reply.error.unwrap().contains("could not be started"));
        let e = servers.declarations("p", "gone").await.unwrap_err();
        assert_eq!(e.error_type, sandcall_api::error_type::MCP_SERVER_FAILURE);
        assert!(!e.message.contains("/nonexistent"));
    }
}
