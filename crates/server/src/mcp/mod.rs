//! The Model Context Protocol, both ways (rmcp).
//!
//! As a server (this file): the tools `execute_code`, `upload_file`, `list_files` and
//! `download_file`, served over streamable HTTP at `/mcp` (behind `authenticate`, like
//! every route) and over stdio by `sandcall mcp`, which runs the server machinery in
//! process with no HTTP listener. Each tool parses its arguments into the same command
//! the HTTP routes build and calls the same domain (`AppState::execute`, the file store),
//! so limits, quotas, rate limits and ownership are the API's; an `ApiError` becomes a
//! tool error whose text is the API's error body.
//!
//!
//! A POST body larger than the API's JSON limit is taken in by `spool` first: only an
//! `upload_file` call may be that large, and its content is decoded to disk before rmcp
//! reads the rest.
//!
//! `sandcall mcp` answers before its engine has started (a first start installs the
//! managed runtimes, which takes minutes): the tools need the engine, `initialize` and
//! `tools/list` do not. A tool call waits for the start (`Start`), with progress
//! notifications when the client asked for them, and the first call after it is told
//! what the start installed (or could not), in its result's `notice`.
//!
//! As a client (`client.rs`): the MCP servers the config names, whose tools programs call.
//!
//! Must not: hold logic of its own about runs or files beyond mapping MCP to the API.

use crate::error::ApiError;
use crate::files::ops::{file_not_found, storage_error};
use crate::files::{guess_type, now_ms, upload_name, FileMeta, Quota};
use crate::rate_limit::Group;
use crate::{exec, AppState};
use base64::Engine;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, RoleServer, ServerHandler};
use sandcall_api::ids;
use sandcall_auth::Principal;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

pub mod spool;

/// The most `download_file` returns: larger files are fetched from their download path.
pub const MAX_DOWNLOAD_BYTES: u64 = 1 << 20;

/// An input file of `execute_code`: a stored file, by id and session.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputFile {
    /// The file's id (from `upload_file`, `list_files` or an earlier run's output).
    pub id: String,
    /// The file's `session_id` (its storage session).
    pub session_id: String,
    /// Its name in the program's working directory; the stored name when left out.
    #[serde(default)]
    pub name: Option<String>,
}

/// The arguments of `execute_code`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteCode {
    /// `python`, `bash`, `javascript`, `typescript`, `c`, `cpp`, `go`, `java`, `php`,
    /// `rust`, `r`, `fortran` or `d` (or an alias, or a language the operator declared).
    pub language: String,
    /// The program's source.
    pub code: String,
    /// Stored files to copy into the working directory (`/mnt/data`) first.
    #[serde(default)]
    pub files: Option<Vec<InputFile>>,
    /// The wall-clock budget in milliseconds, clamped to the server's maximum.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
    /// Fed to the program's standard input.
    #[serde(default)]
    pub stdin: Option<String>,
}

/// The arguments of `upload_file`: a name and exactly one of `text` or `base64`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UploadFile {
    /// The file's name, e.g. `data.csv`.
    pub name: String,
    /// The content as text (stored as UTF-8).
    #[serde(default)]
    pub text: Option<String>,
    /// The content as standard base64, for binary files.
    #[serde(default)]
    pub base64: Option<String>,
}

/// The arguments of `list_files`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFiles {
    /// The storage session whose files to list (an upload's or a run's `session_id`).
    pub session_id: String,
}

/// The arguments of `download_file`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DownloadFile {
    /// The file's `session_id`.
    pub session_id: String,
    /// The file's id.
    pub file_id: String,
}

/// A stored file as the tools describe it.
#[derive(Debug, Clone, Serialize)]
struct FileEntry {
    id: String,
    name: String,
    session_id: String,
    size: u64,
    /// `GET` this path of the HTTP API for the bytes.
    download_path: String,
}

fn download_path(session_id: &str, id: &str) -> String {
    format!("/v1/download/{session_id}/{id}")
}

/// Where the engine behind the tools is: starting (`sandcall mcp` answers meanwhile),
/// ready, or failed to start.
#[derive(Clone)]
pub enum Start {
    Pending,
    /// The server's state, and what its start did that the first tool call is told (the
    /// managed runtimes it installed, or could not).
    Ready(Box<AppState>, Option<Arc<str>>),
    /// Why the server could not start: every tool call answers it.
    Failed(Arc<str>),
}

/// A started engine as one tool call has it.
struct Ready {
    state: AppState,
    /// For the call's result: what the start did, and how long the call waited for it.
    notice: Option<String>,
}

/// The MCP server of one connection (HTTP) or of the process (stdio).
#[derive(Clone)]
pub struct SandcallMcp {
    start: watch::Receiver<Start>,
    /// Set once a tool call has been given the start's notice.
    told: Arc<AtomicBool>,
    /// Who the calls act for over stdio; over HTTP, `authenticate`'s principal.
    principal: Option<Principal>,
    tool_router: ToolRouter<Self>,
}

/// An API error as a tool error: the API's error body as its text (with `notice`).
fn tool_error(e: ApiError, notice: Option<String>) -> CallToolResult {
    crate::telemetry::refused(e.error_type);
    let body = sandcall_api::ErrorBody {
        error: e.message,
        error_type: e.error_type.to_string(),
        code: e.code.map(str::to_owned),
        retry_after_seconds: e.retry_after_s,
    };
    let mut value = serde_json::to_value(&body).unwrap_or_default();
    if let Some(notice) = notice {
        value["notice"] = notice.into();
    }
    CallToolResult::structured_error(value)
}

/// A tool's answer, with the start's `notice` when this call is the one told.
fn answer(result: Result<serde_json::Value, ApiError>, notice: Option<String>) -> CallToolResult {
    match result {
        Ok(mut value) => {
            if let Some(notice) = notice {
                value["notice"] = notice.into();
            }
            CallToolResult::structured(value)
        }
        Err(e) => tool_error(e, notice),
    }
}

/// What a tool call answers when the server could not start.
fn not_started(why: &str) -> ApiError {
    sandcall_engine::error::EngineError::new(
        sandcall_engine::error::ErrorKind::Unavailable,
        sandcall_api::error_type::SANDBOX_FAILURE,
        format!("sandcall could not start, so no tool can run: {why}; fix that and restart `sandcall mcp`"),
    )
    .into()
}

/// A progress notification's message while a call waits for the start.
const STARTING: &str = "sandcall is starting; a first start installs the managed runtimes (the Python data \
                        stack, the npm packages), which takes a minute or more once; this call runs when it is ready";

#[tool_router]
impl SandcallMcp {
    /// Over stdio: every call acts for `principal`, once `start` is ready.
    pub fn stdio(start: watch::Receiver<Start>, principal: Principal) -> Self {
        SandcallMcp {
            start,
            told: Arc::default(),
            principal: Some(principal),
            tool_router: Self::tool_router(),
        }
    }

    /// Over HTTP: each call acts for the principal `authenticate` found.
    pub fn http(state: AppState) -> Self {
        SandcallMcp {
            start: watch::channel(Start::Ready(Box::new(state), None)).1,
            told: Arc::default(),
            principal: None,
            tool_router: Self::tool_router(),
        }
    }

    /// The started engine, once it is: a call made before waits, telling the client how
    /// long so far in a progress notification each second when it gave a progress token.
    async fn ready(&self, ctx: &RequestContext<RoleServer>) -> Result<Ready, ApiError> {
        let mut start = self.start.clone();
        let began = Instant::now();
        let waited = matches!(*start.borrow(), Start::Pending);
        if waited {
            let token = ctx.meta.get_progress_token();
            loop {
                if !matches!(*start.borrow(), Start::Pending) {
                    break;
                }
                if let Some(token) = &token {
                    let seconds = began.elapsed().as_secs_f64().floor();
                    let progress = rmcp::model::ProgressNotificationParam::new(token.clone(), seconds)
                        .with_message(format!("{STARTING} ({seconds:.0} s so far)"));
                    let _ = ctx.peer.notify_progress(progress).await;
                }
                if let Ok(Err(_)) = tokio::time::timeout(Duration::from_secs(1), start.changed()).await {
                    return Err(not_started("it is stopping"));
                }
            }
        }
        let current = start.borrow().clone();
        match current {
            Start::Ready(state, notice) => {
                let first = !self.told.swap(true, Ordering::SeqCst);
                let notice = notice.filter(|_| waited || first).map(|n| {
                    if waited {
                        format!(
                            "{n} This call waited {:.0} s for sandcall to start.",
                            began.elapsed().as_secs_f64()
                        )
                    } else {
                        n.to_string()
                    }
                });
                Ok(Ready { state: *state, notice })
            }
            Start::Failed(why) => Err(not_started(&why)),
            Start::Pending => Err(not_started("it is still starting")),
        }
    }

    fn principal(&self, ctx: &RequestContext<RoleServer>) -> Result<Principal, ApiError> {
        if let Some(p) = &self.principal {
            return Ok(p.clone());
        }
        ctx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Principal>())
            .cloned()
            .ok_or_else(|| ApiError::internal(sandcall_api::error_type::INTERNAL, "an MCP call without a principal"))
    }

    #[tool(
        description = "Run a program in a fresh sandbox (no network; working directory /mnt/data) and return its \
                       stdout, stderr, exit code and status, and the files it wrote there (each with an id, its \
                       session_id and a download path; pass them to `download_file` or as `files` of a later run)."
    )]
    async fn execute_code(
        &self,
        Parameters(args): Parameters<ExecuteCode>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let ready = match self.ready(&ctx).await {
            Ok(ready) => ready,
            Err(e) => return tool_error(e, None),
        };
        answer(self.run(&ready.state, args, &ctx).await, ready.notice)
    }

    #[tool(
        description = "Store a file for later runs: give `name` and exactly one of `text` or `base64`. Returns its id \
                       and session_id, to pass in `files` of `execute_code`."
    )]
    async fn upload_file(
        &self,
        Parameters(args): Parameters<UploadFile>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let ready = match self.ready(&ctx).await {
            Ok(ready) => ready,
            Err(e) => return tool_error(e, None),
        };
        answer(self.upload(&ready.state, args, &ctx).await, ready.notice)
    }

    #[tool(description = "List the stored files of a session (an upload's or a run's session_id).")]
    async fn list_files(
        &self,
        Parameters(args): Parameters<ListFiles>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let ready = match self.ready(&ctx).await {
            Ok(ready) => ready,
            Err(e) => return tool_error(e, None),
        };
        answer(self.list(&ready.state, args, &ctx).await, ready.notice)
    }

    #[tool(
        description = "Read a stored file (at most 1 MiB): its content as `text` when it is UTF-8, else as `base64`."
    )]
    async fn download_file(
        &self,
        Parameters(args): Parameters<DownloadFile>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let ready = match self.ready(&ctx).await {
            Ok(ready) => ready,
            Err(e) => return tool_error(e, None),
        };
        answer(self.download(&ready.state, args, &ctx).await, ready.notice)
    }
}

impl SandcallMcp {
    async fn run(
        &self,
        state: &AppState,
        args: ExecuteCode,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<serde_json::Value, ApiError> {
        let principal = self.principal(ctx)?;
        state.rate_limits.check(Group::Exec, &principal)?;
        let mut files = Vec::new();
        for f in args.files.unwrap_or_default() {
            // Without a name, the file keeps the one it was stored with.
            let name = match f.name {
                Some(name) => name,
                None => find(state, &principal, &f.session_id, &f.id)
                    .await?
                    .name
                    .rsplit('/')
                    .next()
                    .unwrap_or("file")
                    .to_owned(),
            };
            files.push(sandcall_api::FileRef {
                id: f.id,
                storage_session_id: Some(f.session_id),
                session_id: None,
                name,
                entity_id: None,
            });
        }
        let req = sandcall_api::ExecRequest {
            code: Some(args.code),
            language: Some(args.language),
            lang: None,
            args: None,
            stdin: args.stdin,
            files: Some(files),
            run_timeout: args.timeout_ms,
            ..Default::default()
        };
        let cmd = exec::parse_exec(req, &state.config)?;
        let (response, _warm) = state.execute(&principal, state.auth.isolation(&principal), cmd).await?;
        let files: Vec<FileEntry> = response
            .files
            .iter()
            .map(|f| FileEntry {
                id: f.id.clone(),
                name: f.name.clone(),
                session_id: f.storage_session_id.clone(),
                size: f.size,
                download_path: download_path(&f.storage_session_id, &f.id),
            })
            .collect();
        Ok(serde_json::json!({
            "session_id": response.session_id,
            "status": response.status,
            "stdout": response.stdout,
            "stderr": response.stderr,
            "exit_code": response.exit_code,
            "signal": response.signal,
            "timed_out": response.timed_out,
            "files": files,
        }))
    }

    async fn upload(
        &self,
        state: &AppState,
        args: UploadFile,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<serde_json::Value, ApiError> {
        let principal = self.principal(ctx)?;
        state.rate_limits.check(Group::Files, &principal)?;
        let name = upload_name(&args.name).map_err(|e| ApiError::bad_request(e.to_string()))?;
        // A large call's content is on disk already (`spool`); a small one's is here.
        let spooled = ctx
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<spool::SpooledUpload>())
            .cloned();
        let (temp, size, sha256) = match spooled {
            Some(spooled) => match spooled.0.as_ref() {
                Ok(s) => (s.path.clone(), s.size, s.sha256.clone()),
                Err(e) => return Err(e.clone()),
            },
            None => write_small(state, &args, &name).await?,
        };
        let id = temp.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        let session_id = ids::new_id();
        let created = now_ms();
        let meta = FileMeta {
            principal: principal.0.clone(),
            session_id: session_id.clone(),
            id: id.clone(),
            name: name.clone(),
            size,
            content_type: guess_type(&name),
            sha256,
            created_ms: created,
            expires_ms: created + state.config.files.file_ttl_s * 1000,
            kind: None,
            entity_id: None,
            version: None,
            read_only: false,
        };
        let inserted = state.files.insert(meta, &temp, Quota::of(&state.config)).await;
        // The store moved the bytes in, or they are of no more use.
        let _ = tokio::fs::remove_file(&temp).await;
        inserted.map_err(storage_error)?;
        crate::telemetry::stored(1, size);
        Ok(serde_json::to_value(FileEntry {
            download_path: download_path(&session_id, &id),
            id,
            name,
            session_id,
            size,
        })
        .unwrap_or_default())
    }

    async fn list(
        &self,
        state: &AppState,
        args: ListFiles,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<serde_json::Value, ApiError> {
        let principal = self.principal(ctx)?;
        state.rate_limits.check(Group::Files, &principal)?;
        let files = if ids::is_id(&args.session_id) {
            state
                .files
                .list(&principal.0, &args.session_id)
                .await
                .map_err(storage_error)?
        } else {
            Vec::new()
        };
        let entries: Vec<FileEntry> = files
            .into_iter()
            .map(|m| FileEntry {
                download_path: download_path(&m.session_id, &m.id),
                id: m.id,
                name: m.name,
                session_id: m.session_id,
                size: m.size,
            })
            .collect();
        Ok(serde_json::json!({ "files": entries }))
    }

    async fn download(
        &self,
        state: &AppState,
        args: DownloadFile,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<serde_json::Value, ApiError> {
        let principal = self.principal(ctx)?;
        state.rate_limits.check(Group::Files, &principal)?;
        let meta = find(state, &principal, &args.session_id, &args.file_id).await?;
        if meta.size > MAX_DOWNLOAD_BYTES {
            return Err(ApiError::too_large(format!(
                "{} is {} bytes, more than the {MAX_DOWNLOAD_BYTES} that download_file returns; GET {} instead",
                meta.name,
                meta.size,
                download_path(&meta.session_id, &meta.id)
            )));
        }
        let reader = state.files.open(&meta).await.map_err(storage_error)?;
        let mut bytes = Vec::with_capacity(meta.size as usize);
        reader
            .take(MAX_DOWNLOAD_BYTES + 1)
            .read_to_end(&mut bytes)
            .await
            .map_err(|e| storage_error(e.into()))?;
        let mut value = serde_json::json!({
            "id": meta.id,
            "name": meta.name,
            "session_id": meta.session_id,
            "size": meta.size,
            "content_type": meta.content_type,
        });
        match String::from_utf8(bytes) {
            Ok(text) => value["text"] = text.into(),
            Err(e) => value["base64"] = base64::engine::general_purpose::STANDARD.encode(e.into_bytes()).into(),
        }
        Ok(value)
    }
}

/// A file of `principal`'s, by session and id.
async fn find(state: &AppState, principal: &Principal, session_id: &str, id: &str) -> Result<FileMeta, ApiError> {
    let id = id.split_once('.').map_or(id, |(id, _)| id);
    if !ids::is_id(session_id) || !ids::is_id(id) {
        return Err(file_not_found().into());
    }
    state
        .files
        .get(&principal.0, session_id, id)
        .await
        .map_err(storage_error)?
        .ok_or_else(|| file_not_found().into())
}

/// A small call's content, decoded and written to `incoming/`: its path (named by
/// the new file's id), size and sha256.
async fn write_small(
    state: &AppState,
    args: &UploadFile,
    name: &str,
) -> Result<(std::path::PathBuf, u64, String), ApiError> {
    let bytes = match (&args.text, &args.base64) {
        (Some(text), None) => std::borrow::Cow::Borrowed(text.as_bytes()),
        (None, Some(b64)) => std::borrow::Cow::Owned(
            base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| ApiError::bad_request(format!("`base64` is not valid base64: {e}")))?,
        ),
        _ => return Err(ApiError::bad_request("give exactly one of `text` or `base64`")),
    };
    let max = state.config.files.max_file_bytes;
    if bytes.len() as u64 > max {
        return Err(ApiError::too_large(format!(
            "{name} is larger than {max} bytes (max_file_bytes)"
        )));
    }
    let temp = state.files.incoming_dir().join(ids::new_id());
    let write = async {
        let mut out = tokio::fs::File::create(&temp).await?;
        out.write_all(&bytes).await?;
        out.flush().await
    };
    if let Err(e) = write.await {
        let _ = tokio::fs::remove_file(&temp).await;
        return Err(storage_error(e.into()).into());
    }
    let sha256 = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    Ok((temp, bytes.len() as u64, sha256))
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandcallMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("sandcall", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Runs programs in isolated sandboxes. Use execute_code to run code; upload_file to give a \
                 program input files; list_files and download_file to read what programs wrote.",
            )
    }
}

/// The streamable HTTP service mounted at `/mcp`: stateless (every POST stands alone,
/// so no MCP session outlives its request), JSON answers, host checks left to
/// `authenticate`, which already guards every route.
pub fn http_service(
    state: AppState,
) -> rmcp::transport::streamable_http_server::StreamableHttpService<
    SandcallMcp,
    rmcp::transport::streamable_http_server::session::never::NeverSessionManager,
> {
    use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
    // Larger bodies are spooled (`spool`): only an upload's, and it comes without its
    // content.
    let body_limit = spool::in_memory_limit(&state);
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .disable_allowed_hosts()
        .with_max_request_body_bytes(body_limit);
    StreamableHttpService::new(move || Ok(SandcallMcp::http(state.clone())), Default::default(), config)
}

/// `/mcp`: rmcp's service, POST bodies taken in by `spool` first.
pub fn route(state: AppState) -> axum::routing::MethodRouter<AppState> {
    use tower::ServiceExt;
    let rmcp = http_service(state);
    axum::routing::any(
        move |axum::extract::State(state): axum::extract::State<AppState>, req: axum::extract::Request| {
            let rmcp = rmcp.clone();
            async move {
                let req = if req.method() == axum::http::Method::POST {
                    match spool::post(state, req).await {
                        Ok(req) => req,
                        Err(refused) => return refused,
                    }
                } else {
                    req
                };
                match rmcp.oneshot(req).await {
                    Ok(response) => response.map(axum::body::Body::new),
                    Err(never) => match never {},
                }
            }
        },
    )
}

/// Serves MCP over this process's stdin and stdout until the client closes stdin (or
/// `shutdown` fires). Every call acts for `principal`, on the engine `start` gives.
pub async fn serve_stdio(
    start: watch::Receiver<Start>,
    principal: Principal,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    use rmcp::ServiceExt;
    let server = SandcallMcp::stdio(start, principal)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(std::io::Error::other)?;
    let cancel = server.cancellation_token();
    tokio::select! {
        r = server.waiting() => { r.map_err(std::io::Error::other)?; }
        _ = shutdown.wait_for(|stop| *stop) => { cancel.cancel(); }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema_of(name: &str) -> serde_json::Value {
        let tool = SandcallMcp::tool_router()
            .list_all()
            .into_iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no tool {name}"));
        serde_json::Value::Object((*tool.input_schema).clone())
    }

    /// The schemas a client sees name each argument, its type, and which are required.
    #[test]
    fn tool_schemas_name_their_arguments() {
        let exec = schema_of("execute_code");
        assert_eq!(exec["type"], "object");
        let mut required: Vec<&str> = exec["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        required.sort();
        assert_eq!(required, ["code", "language"]);
        for key in ["language", "code", "files", "timeout_ms", "stdin"] {
            assert!(exec["properties"].get(key).is_some(), "{key} in {exec}");
        }
        assert_eq!(exec["properties"]["code"]["type"], "string");
        assert_eq!(exec["additionalProperties"], false);

        let upload = schema_of("upload_file");
        assert_eq!(upload["required"], serde_json::json!(["name"]));
        assert!(upload["properties"].get("text").is_some());
        assert!(upload["properties"].get("base64").is_some());
        assert_eq!(schema_of("list_files")["required"], serde_json::json!(["session_id"]));
        let mut required: Vec<String> = serde_json::from_value(schema_of("download_file")["required"].clone()).unwrap();
        required.sort();
        assert_eq!(required, ["file_id", "session_id"]);
    }

    /// The arguments parse as the schema says: unknown keys are refused.
    #[test]
    fn unknown_arguments_are_refused() {
        let ok: Result<ExecuteCode, _> = serde_json::from_value(serde_json::json!({"language": "python", "code": "1"}));
        assert!(ok.is_ok());
        let bad: Result<ExecuteCode, _> =
            serde_json::from_value(serde_json::json!({"language": "python", "code": "1", "lang": "x"}));
        assert!(bad.is_err());
    }
}
