//! sandcall as an MCP client: the MCP servers of the config (`mcp_servers`), whose tools
//! programs call as declared tools with `mcp_server`. Each server is started on its
//! first call (stdio: its own process, speaking MCP on its stdin and stdout) and kept
//! for the next ones; one that went away is started again by the next call. The
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
use sandcall_config::McpServerConfig;
use sandcall_sandbox::protocol::ToolReply;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// The configured MCP servers and their connections. Cheap to clone.
#[derive(Clone, Default)]
pub struct McpServers {
    servers: Arc<[Server]>,
}

struct Server {
    config: McpServerConfig,
    /// Started on first use; none again once it went away.
    running: Mutex<Option<RunningService<RoleClient, ()>>>,
}

impl McpServers {
    pub fn new(configs: &[McpServerConfig]) -> McpServers {
        McpServers {
            servers: configs
                .iter()
                .map(|config| Server {
                    config: config.clone(),
                    running: Mutex::new(None),
                })
                .collect(),
        }
    }

    /// Calls tool `tool` of server `server` with `arguments` (a JSON object, as checked
    /// against the declaration), within `timeout`; every failure is a tool error the
    /// program gets, never a failure of the session.
    pub async fn call(&self, server: &str, tool: &str, arguments: &str, timeout: Duration) -> ToolReply {
        let Some(s) = self.servers.iter().find(|s| s.config.name == server) else {
            return ToolReply::error("refused", format!("no MCP server {server:?} in this server's config"));
        };
        let arguments = match serde_json::from_str::<serde_json::Value>(arguments) {
            Ok(serde_json::Value::Object(map)) => map,
            Ok(serde_json::Value::Null) => Default::default(),
            _ => return ToolReply::error("refused", format!("the arguments of {tool} must be an object")),
        };
        let call = async {
            let peer = s.peer().await?;
            let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
            match peer.call_tool(params).await {
                Ok(result) => Ok(result),
                Err(e) => {
                    // A server that went away is started again by the next call.
                    if peer.is_transport_closed() {
                        *s.running.lock().await = None;
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
        reply_of(tool, result)
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
    /// Tool declarations for every tool server `server` lists: its name, description
    /// and input schema, going to that server.
    pub async fn declarations(&self, server: &str) -> Result<Vec<sandcall_api::ToolDecl>, EngineError> {
        let Some(s) = self.servers.iter().find(|s| s.config.name == server) else {
            return Err(unknown_server(server));
        };
        let list = async {
            let peer = s.peer().await?;
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

impl Server {
    /// The connection, started when there is none.
    async fn peer(&self) -> Result<Peer<RoleClient>, String> {
        let mut running = self.running.lock().await;
        if let Some(service) = running.as_ref().filter(|s| !s.is_transport_closed()) {
            return Ok(service.peer().clone());
        }
        let name = &self.config.name;
        let mut command = tokio::process::Command::new(&self.config.command);
        command.args(&self.config.args).envs(&self.config.env);
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
        let servers = McpServers::new(&[McpServerConfig {
            name: "gone".into(),
            command: "/nonexistent/mcp-server".into(),
            ..Default::default()
        }]);
        let reply = servers.call("nope", "t", "{}", Duration::from_secs(5)).await;
        assert_eq!(reply.kind.as_deref(), Some("refused"));
        let reply = servers.call("gone", "t", "{}", Duration::from_secs(5)).await;
        assert_eq!(reply.kind.as_deref(), Some("tool_error"));
        assert!(reply.error.unwrap().contains("could not be started"));
        let e = servers.declarations("gone").await.unwrap_err();
        assert_eq!(e.error_type, sandcall_api::error_type::MCP_SERVER_FAILURE);
        assert!(!e.message.contains("/nonexistent"));
    }
}
