//! Where sandcall keeps what must outlive a request: files (`FileStore`) and
//! programmatic sessions' journals (`SessionStore`). The routes and the session driver
//! see only these traits; each backend is one file: `embedded` (the data dir, with
//! redb) is the default; `redis` keeps sessions for many nodes (`session_store =
//! "redis://..."`) and `s3` keeps files in a bucket that many nodes share (`file_store =
//! "s3://..."`). The traits' operations are shaped so that each maps onto one atomic
//! step of every backend (see each operation's note).
//!
//! Every principal has a quota of stored bytes and files (`Quota`). The file store, not
//! the routes, enforces it: `insert` checks and records the principal's usage in one
//! step, so concurrent inserts cannot pass it together, and answers `StoreError::Quota`.

// Store failures are answered, not panicked on (tests may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

#[cfg(feature = "backends")]
pub mod embedded;
#[cfg(feature = "memory")]
pub mod memory;
#[cfg(feature = "backends")]
pub mod redis;
#[cfg(feature = "backends")]
pub mod s3;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tokio::io::AsyncRead;

/// Where the operator keeps something, as `file_store` or `session_store` writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// The data directory (unset, or `embedded`).
    Embedded,
    /// `redis://...`: sessions in Redis, shared by many nodes.
    Redis(String),
    /// `s3://bucket/prefix`: files in an S3 bucket, shared by many nodes.
    S3(String),
}

impl StoreUrl {
    /// The backend a setting names: unset or `embedded`, `redis://...` or `s3://...`;
    /// `None` for anything else, which its opener refuses.
    pub fn parse(setting: Option<&str>) -> Option<StoreUrl> {
        match setting {
            None | Some("embedded") => Some(StoreUrl::Embedded),
            Some(url) if url.starts_with("redis://") => Some(StoreUrl::Redis(url.to_owned())),
            Some(url) if url.starts_with("s3://") => Some(StoreUrl::S3(url.to_owned())),
            Some(_) => None,
        }
    }
}

#[cfg(feature = "backends")]
/// The file store `file_store` names: the embedded one (unset or `embedded`), or S3
/// (`s3://bucket/prefix`), checked with one request before the server starts.
pub async fn open_file_store(
    config: &sandcall_config::Config,
    data_dir: &Path,
) -> Result<std::sync::Arc<dyn FileStore>, StoreError> {
    let setting = config.files.file_store.as_deref();
    match StoreUrl::parse(setting) {
        Some(StoreUrl::Embedded) => Ok(std::sync::Arc::new(embedded::LocalStore::open(data_dir)?)),
        Some(StoreUrl::S3(url)) => {
            let store = s3::S3Store::open(
                data_dir,
                &url,
                config.files.s3_endpoint.as_deref(),
                config.files.file_cache_mb,
                std::time::Duration::from_millis(config.files.s3_timeout_ms),
            )?;
            store.check().await?;
            Ok(std::sync::Arc::new(store))
        }
        // Files are not kept in Redis, nor anywhere else.
        Some(StoreUrl::Redis(_)) | None => Err(StoreError::BadFileStoreUrl(setting.unwrap_or_default().to_owned())),
    }
}

#[cfg(feature = "backends")]
/// The session store `session_store` names: Redis (`redis://...`) or the embedded one.
/// A session's keys in Redis outlive its last write by `ttl_ms`.
pub fn open_session_store(
    config: &sandcall_config::Config,
    data_dir: &Path,
    ttl_ms: u64,
) -> Result<std::sync::Arc<dyn SessionStore>, StoreError> {
    Ok(match StoreUrl::parse(config.sessions.session_store.as_deref()) {
        Some(StoreUrl::Redis(url)) => std::sync::Arc::new(redis::RedisSessionStore::open(&url, ttl_ms)?),
        // `Config::validate` refuses every other value but `embedded`.
        _ => std::sync::Arc::new(embedded::EmbeddedSessionStore::open(data_dir)?),
    })
}

/// Milliseconds since the Unix epoch, as the stores record times.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What is known about one stored file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileMeta {
    pub principal: String,
    pub session_id: String,
    pub id: String,
    /// The name the file had (a relative path for output files).
    pub name: String,
    pub size: u64,
    pub content_type: String,
    pub sha256: String,
    /// Milliseconds since the Unix epoch.
    pub created_ms: u64,
    pub expires_ms: u64,
    /// The upload's `kind` field (`user`, `skill`, ...), if it had one. Records of a data
    /// dir from before these fields read as none (`serde(default)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The upload's `id` field: the entity the file belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity_id: Option<String>,
    /// The upload's `version` field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Uploaded with `read_only=true`: staged, but never returned as an output.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// How much one principal may have stored at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub max_bytes: u64,
    pub max_files: u64,
}

impl Quota {
    /// The quota every principal has (`max_stored_bytes_per_principal`,
    /// `max_stored_files_per_principal`).
    pub fn of(config: &sandcall_config::Config) -> Quota {
        Quota {
            max_bytes: config.files.max_stored_bytes_per_principal,
            max_files: config.files.max_stored_files_per_principal,
        }
    }
}

/// What one principal has stored: the sizes of its files added up, and their number.
/// Expired files count until the sweep deletes them, since their bytes are still on disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub bytes: u64,
    pub files: u64,
}

impl Usage {
    /// Which quota `files` more files of `bytes` more bytes would go over, if any.
    pub fn check(&self, quota: Quota, bytes: u64, files: u64) -> Result<(), QuotaExceeded> {
        if self.files.saturating_add(files) > quota.max_files {
            return Err(QuotaExceeded::Files(quota.max_files));
        }
        if self.bytes.saturating_add(bytes) > quota.max_bytes {
            return Err(QuotaExceeded::Bytes(quota.max_bytes));
        }
        Ok(())
    }
}

/// The quota a store refused to go over, with its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuotaExceeded {
    #[error("storing this would take the caller over its quota of {0} bytes (max_stored_bytes_per_principal)")]
    Bytes(u64),
    #[error("storing this would take the caller over its quota of {0} files (max_stored_files_per_principal)")]
    Files(u64),
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage is full")]
    Full,
    #[error(transparent)]
    Quota(#[from] QuotaExceeded),
    /// A file or directory operation failed (other than for want of space: `Full`).
    #[error("storage: {0}")]
    Io(#[source] std::io::Error),
    /// A record could not be encoded or decoded.
    #[error("storage: {0}")]
    Codec(#[source] serde_json::Error),
    /// A session record in Redis does not decode.
    #[error("storage: a stored session record: {0}")]
    BadRecord(#[source] serde_json::Error),
    /// The embedded database (redb) failed, or the blocking task running its operation.
    #[error("storage: {0}")]
    Database(#[source] BoxedError),
    /// `session_store` is not a Redis URL the client accepts.
    #[error("storage: session_store: {0}")]
    SessionStoreUrl(#[source] BoxedError),
    /// S3 refused an operation or answered something unexpected (unreachable:
    /// `Unavailable`).
    #[error("storage: s3: {0}")]
    S3(#[source] BoxedError),
    /// Sending a file to S3 failed.
    #[error("storage: s3: uploading: {0}")]
    S3Upload(#[source] std::io::Error),
    /// An object in S3 is not the size its record says.
    #[error("storage: s3: {object} has {size} bytes, its record says {recorded}")]
    S3SizeMismatch { object: String, size: u64, recorded: u64 },
    /// An object changed by conditional puts lost every race of its retries.
    #[error("storage: s3: {0}: too many concurrent changes")]
    S3Contended(String),
    /// `file_store` is neither `embedded` nor `s3://bucket/prefix`.
    #[error("storage: file_store = {0:?} is not embedded or s3://bucket/prefix")]
    BadFileStoreUrl(String),
    /// `s3_endpoint` is plain http to a host that is not a loopback address.
    #[error("storage: s3_endpoint {0:?}: plain http is allowed only to a loopback address; use https")]
    InsecureS3Endpoint(String),
    /// The session (by id) has no journal to append to.
    #[error("storage: session {0} is not journalled")]
    NotJournalled(String),
    /// The session (by id) was journalled on by another node since this one's last step.
    #[error("storage: session {0} moved on elsewhere")]
    Moved(String),
    /// The store cannot be reached now (Redis is down or does not answer): nothing was
    /// written; the same operation may succeed later.
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
}

impl From<std::io::Error> for StoreError {
    fn from(e: std::io::Error) -> Self {
        if e.raw_os_error() == Some(libc_enospc()) {
            StoreError::Full
        } else {
            StoreError::Io(e)
        }
    }
}

/// The source of a backend's failure, whatever its type.
pub type BoxedError = Box<dyn std::error::Error + Send + Sync>;

const fn libc_enospc() -> i32 {
    28 // ENOSPC on Linux
}

#[async_trait]
pub trait FileStore: Send + Sync {
    /// A directory where files being received are written before `insert`.
    fn incoming_dir(&self) -> PathBuf;
    /// Takes ownership of the finished file at `temp` (moved, not copied), if the
    /// principal's usage with it stays within `quota`; otherwise `StoreError::Quota`.
    /// Checking and recording the usage are one step: concurrent inserts of a principal
    /// never pass the quota together. On any error nothing is stored.
    async fn insert(&self, meta: FileMeta, temp: &Path, quota: Quota) -> Result<(), StoreError>;
    /// What the principal has stored now.
    async fn usage(&self, principal: &str) -> Result<Usage, StoreError>;
    async fn get(&self, principal: &str, session_id: &str, id: &str) -> Result<Option<FileMeta>, StoreError>;
    async fn open(&self, meta: &FileMeta) -> Result<Box<dyn AsyncRead + Send + Unpin>, StoreError>;
    /// A host path holding the bytes, for the sandbox helper to copy from.
    async fn local_path(&self, meta: &FileMeta) -> Result<PathBuf, StoreError>;
    async fn list(&self, principal: &str, session_id: &str) -> Result<Vec<FileMeta>, StoreError>;
    /// Deletes one file and frees its share of its principal's usage; false if there
    /// was no such file.
    async fn delete(&self, principal: &str, session_id: &str, id: &str) -> Result<bool, StoreError>;
    /// Deletes every file whose time is up, and frees its part of its principal's usage;
    /// returns how many.
    async fn sweep(&self, now_ms: u64) -> Result<usize, StoreError>;
    /// Moves the expiry time of the principal's files `(session_id, id)` to `expires_ms`
    /// (a workspace's files live on while it is used). A file already due (or gone) is
    /// left to the sweep, so a renewal never races the sweep for one file.
    async fn renew(
        &self,
        principal: &str,
        files: &[(String, String)],
        now_ms: u64,
        expires_ms: u64,
    ) -> Result<(), StoreError>;
    /// Takes the principal's workspace `name` for `holder` until `until_ms` and returns
    /// the files its last run left (none for a new one); `None` while another holder's
    /// lease is good at `now_ms`. Checking and taking are one step (a write transaction,
    /// or a conditional put), so two nodes cannot both hold it.
    async fn workspace_take(
        &self,
        principal: &str,
        name: &str,
        holder: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<Option<Vec<WorkspaceFile>>, StoreError>;
    /// Gives the workspace back, with `files` as its new content (`None` keeps what it
    /// had), if `holder` still holds it; a lease taken over meanwhile is left alone.
    async fn workspace_release(
        &self,
        principal: &str,
        name: &str,
        holder: &str,
        files: Option<Vec<WorkspaceFile>>,
    ) -> Result<(), StoreError>;
}

/// One file of a workspace: a stored file of the principal, and the name it has in
/// the working directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WorkspaceFile {
    pub name: String,
    pub session_id: String,
    pub id: String,
}

/// A workspace as a store keeps it: its files, and who holds it until when.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Workspace {
    #[serde(default)]
    pub files: Vec<WorkspaceFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    #[serde(default)]
    pub until_ms: u64,
}

impl Workspace {
    /// Takes the workspace for `holder`, unless another's lease is good at `now_ms`.
    pub fn take(&mut self, holder: &str, now_ms: u64, until_ms: u64) -> bool {
        if self.holder.as_deref().is_some_and(|h| h != holder) && self.until_ms > now_ms {
            return false;
        }
        self.holder = Some(holder.to_owned());
        self.until_ms = until_ms;
        true
    }

    /// Gives it back if `holder` holds it; false (nothing changed) otherwise.
    pub fn release(&mut self, holder: &str, files: Option<Vec<WorkspaceFile>>) -> bool {
        if self.holder.as_deref() != Some(holder) {
            return false;
        }
        self.holder = None;
        self.until_ms = 0;
        if let Some(files) = files {
            self.files = files;
        }
        true
    }
}

/// What a programmatic session was started with: enough to start its program again,
/// the same way (`SessionStore::create`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionStart {
    pub principal: String,
    /// The first request as the caller sent it: code, language, args, tools, limits,
    /// timeouts, and the input files by id (their bytes stay in the file store).
    pub request: sandcall_api::ProgrammaticRequest,
    /// The seed of the program's random generators (Python's `random` and numpy's
    /// global generator, JavaScript's `Math.random`, Bash's `$RANDOM`).
    pub seed: u32,
    /// The `PYTHONHASHSEED` the program started with.
    pub hash_seed: u32,
    /// When the whole loop must have ended (`loop_timeout`), ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loop_deadline_ms: Option<u64>,
    pub created_ms: u64,
    /// The workspace the session holds from its start to its end, if any: a replay
    /// holds it again under the same holder. Its files at the start are in the
    /// request's `files`, after the caller's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<HeldWorkspace>,
}

/// A workspace a programmatic session holds (`SessionStart::workspace`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HeldWorkspace {
    /// The principal's workspace name (`workspace_id` or `runtime_session_hint`).
    pub name: String,
    /// The holder its lease is taken under.
    pub holder: String,
    /// It started with files an earlier run left (`runtime_status: reused`).
    pub reused: bool,
}

/// Where a session is, as the store knows it: small, replaced as a whole by each write.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SessionState {
    /// The number of the latest pause handed out (0: none yet). Its token is the only
    /// one that can still be good; every earlier one is used.
    pub pause: u64,
    /// The session waits for its caller: the token of `pause` is good.
    pub open: bool,
    /// Calls handed out and not answered yet, in the order they were handed out.
    #[serde(default)]
    pub outstanding: Vec<String>,
    /// Bytes of stdout and stderr the caller has been given (the pauses'
    /// `partial_stdout` and `partial_stderr`).
    pub stdout_sent: u64,
    pub stderr_sent: u64,
    /// Calls handed out so far (`tool_calls_made`).
    pub calls_made: u64,
    /// When the latest pause began, ms since the epoch.
    pub paused_ms: u64,
    /// The latest accepted resume: its pause and the digest of its results (hex), so
    /// that its retry is told from another use of the token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_resume: Option<(u64, String)>,
    /// The latest pause's output and end as the caller received them: with the
    /// outstanding calls of the journal, its answer (for GET while the session has no
    /// sandbox). Empty once the pause is over.
    #[serde(default)]
    pub partial_stdout: String,
    #[serde(default)]
    pub partial_stderr: String,
    #[serde(default)]
    pub expires_at: String,
}

/// One step of a session, in the order it happened.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JournalEntry {
    /// A call handed out to the caller: its id, the declared name, the arguments as
    /// checked (the JSON text the caller received).
    Call {
        /// The pause that handed it out.
        pause: u64,
        call_id: String,
        name: String,
        arguments: Box<serde_json::value::RawValue>,
    },
    /// What the program received for a call: the caller's result, or the server's
    /// `timeout`.
    Reply {
        call_id: String,
        reply: sandcall_sandbox::protocol::ToolReply,
    },
}

/// A session's whole journal.
#[derive(Debug, Clone)]
pub struct Journal {
    pub start: SessionStart,
    pub state: SessionState,
    pub entries: Vec<JournalEntry>,
}

/// The journals of programmatic sessions: a session is written here before any answer
/// that depends on it goes out, so that a caller never holds a token the store does
/// not know, and a session whose process is gone (a restart, an eviction) can be
/// brought back by replay (`programmatic::session`).
///
/// Each operation is one atomic step of the backend: one redb write transaction in the
/// embedded store; for Redis, `append` is a MULTI of RPUSH and SET, `consume` a script
/// that compares the state's pause before it writes, and `claim` a SET of the owner key
/// with NX and PX (or a script comparing the owner), so that two nodes cannot both
/// consume one token or both own one session.
#[async_trait]
pub trait SessionStore: Send + Sync {
    /// Records a new session; nothing of it is journalled before.
    async fn create(&self, id: &str, start: &SessionStart, state: &SessionState) -> Result<(), StoreError>;
    /// Appends `entries` and replaces the state, in one step.
    async fn append(&self, id: &str, entries: &[JournalEntry], state: &SessionState) -> Result<(), StoreError>;
    /// Consumes the token of pause `pause`: if, and only if, the stored state is at
    /// that pause and open, appends `entries` and replaces the state; true if it did.
    /// Of two uses of one token, one gets true.
    async fn consume(
        &self,
        id: &str,
        pause: u64,
        entries: &[JournalEntry],
        state: &SessionState,
    ) -> Result<bool, StoreError>;
    /// The session's journal, if it is journalled.
    async fn load(&self, id: &str) -> Result<Option<Journal>, StoreError>;
    /// The session's state alone, if it is journalled.
    async fn state(&self, id: &str) -> Result<Option<SessionState>, StoreError>;
    /// Every journalled session: its id, principal and state.
    async fn list(&self) -> Result<Vec<(String, String, SessionState)>, StoreError>;
    /// Forgets the session (it ended or expired).
    async fn remove(&self, id: &str) -> Result<(), StoreError>;
    /// Makes `owner` the session's owner until `until_ms`, unless another owner's lease
    /// is still good at `now_ms`; true if `owner` owns it now.
    async fn claim(&self, id: &str, owner: &str, now_ms: u64, until_ms: u64) -> Result<bool, StoreError>;
    /// The session's principal and state, if it is journalled (a node that does not hold
    /// the session looks it up by id).
    async fn entry(&self, id: &str) -> Result<Option<(String, SessionState)>, StoreError>;
    /// The session's owner, if its lease is still good at `now_ms`.
    async fn owner(&self, id: &str, now_ms: u64) -> Result<Option<String>, StoreError>;
    /// Ends `owner`'s lease on the session, if it holds it (its sandbox is gone); another
    /// owner's lease is left alone.
    async fn release(&self, id: &str, owner: &str) -> Result<(), StoreError>;
    /// True when every node shares this store (Redis): a session may be owned by another
    /// node, and is looked up by id rather than listed at start.
    fn shared(&self) -> bool {
        false
    }
    /// Marks the journalled session dormant (no node holds it live; its node keeps
    /// nothing of it in memory), in one step: it enters the deadline index at
    /// `dormancy.due_ms` (`due`), counts among its principal's dormant sessions
    /// (`dormant`), keeps its audit trail, and can be named by its latest request id
    /// (`by_request`). Marking a dormant session again moves its deadline and counts it
    /// once. False (nothing written) if the session is not journalled.
    async fn sleep(&self, id: &str, dormancy: &Dormancy) -> Result<bool, StoreError>;
    /// Takes the session out of the dormant ones (a node brings it back, or it ends), in
    /// one step: out of the deadline index, uncounted for its principal; answers the
    /// audit trail it kept, if it was dormant. Its request id still names it.
    async fn wake(&self, id: &str) -> Result<Option<String>, StoreError>;
    /// Dormant sessions whose deadline is at or before `now_ms`, earliest first, at most
    /// `limit`.
    async fn due(&self, now_ms: u64, limit: usize) -> Result<Vec<String>, StoreError>;
    /// How many sessions are dormant: the principal's, or all of them.
    async fn dormant(&self, principal: Option<&str>) -> Result<u64, StoreError>;
    /// The audit trail a dormant session keeps (JSON of `DormantAudit`), if it is dormant.
    async fn dormant_audit(&self, id: &str) -> Result<Option<String>, StoreError>;
    /// Lets the principal's `request_id` name session `id` (cancel by request id), in
    /// place of the id the session was named by before: one per session, removed with it.
    async fn name_request(&self, principal: &str, request_id: &str, id: &str) -> Result<(), StoreError>;
    /// The session the principal's `request_id` names, if any.
    async fn by_request(&self, principal: &str, request_id: &str) -> Result<Option<String>, StoreError>;
}

/// What a session keeps in the store while it is dormant, besides its journal
/// (`SessionStore::sleep`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Dormancy {
    pub principal: String,
    /// When a timer of its pause runs out (`tool_call_timeout_ms` or
    /// `session_expiry_s`, the earlier), ms since the epoch.
    pub due_ms: u64,
    /// Its audit trail (`GET .../calls`), as JSON of `DormantAudit`.
    pub audit: String,
    /// The latest `X-LibreChat-Code-Request-ID` of a request about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// A dormant session's audit trail, as `GET .../calls` lists it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DormantAudit {
    pub calls: Vec<sandcall_api::AuditCall>,
    pub dropped: u64,
    /// A session granted network: its connections as the trail listed them, and how
    /// many it did not list (`CallsResponse::connections`, `connections_dropped`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<sandcall_api::AuditConnection>,
    #[serde(default)]
    pub connections_dropped: u64,
}

/// What every `SessionStore` must do with dormant sessions and request ids; run against
/// each backend by its tests. `id` and `principal` are unique to the run.
#[cfg(test)]
pub(crate) async fn check_dormancy(store: &dyn SessionStore, id: &str, principal: &str) {
    let other = format!("{id}-other");
    let start = SessionStart {
        principal: principal.into(),
        request: serde_json::from_value(serde_json::json!({"code": "print(1)", "language": "py"})).unwrap(),
        seed: 1,
        hash_seed: 2,
        loop_deadline_ms: None,
        created_ms: 1,
        workspace: None,
    };
    let dormancy = |due_ms, request_id: Option<&str>| Dormancy {
        principal: principal.into(),
        due_ms,
        audit: format!("audit {due_ms}"),
        request_id: request_id.map(str::to_owned),
    };
    // Not journalled: nothing is written.
    assert!(!store.sleep(id, &dormancy(10, None)).await.unwrap());
    assert_eq!(store.dormant(Some(principal)).await.unwrap(), 0);
    store.create(id, &start, &SessionState::default()).await.unwrap();
    store.create(&other, &start, &SessionState::default()).await.unwrap();
    assert!(store.sleep(id, &dormancy(1_000, Some("r1"))).await.unwrap());
    assert!(store.sleep(&other, &dormancy(500, None)).await.unwrap());
    // Marked again: counted once, at its new deadline.
    assert!(store.sleep(id, &dormancy(2_000, Some("r2"))).await.unwrap());
    assert_eq!(store.dormant(Some(principal)).await.unwrap(), 2);
    assert!(store.dormant(None).await.unwrap() >= 2);
    assert_eq!(store.dormant_audit(id).await.unwrap().as_deref(), Some("audit 2000"));
    let due = store.due(1_500, 1000).await.unwrap();
    assert!(due.contains(&other) && !due.contains(&id.to_owned()), "{due:?}");
    let due = store.due(2_000, 1000).await.unwrap();
    assert!(due.contains(&other) && due.contains(&id.to_owned()), "{due:?}");
    // One request id per session: the latest.
    assert_eq!(store.by_request(principal, "r1").await.unwrap(), None);
    assert_eq!(store.by_request(principal, "r2").await.unwrap().as_deref(), Some(id));
    assert_eq!(store.by_request("someone else", "r2").await.unwrap(), None);
    store.name_request(principal, "r3", id).await.unwrap();
    assert_eq!(store.by_request(principal, "r2").await.unwrap(), None);
    assert_eq!(store.by_request(principal, "r3").await.unwrap().as_deref(), Some(id));
    // Woken: out of the index and the count, its audit handed back once.
    assert_eq!(store.wake(id).await.unwrap().as_deref(), Some("audit 2000"));
    assert_eq!(store.wake(id).await.unwrap(), None);
    assert_eq!(store.dormant(Some(principal)).await.unwrap(), 1);
    assert!(!store.due(u64::MAX / 2, 1000).await.unwrap().contains(&id.to_owned()));
    assert_eq!(store.dormant_audit(id).await.unwrap(), None);
    // Removed: everything of it goes, dormant or not.
    store.remove(&other).await.unwrap();
    assert_eq!(store.dormant(Some(principal)).await.unwrap(), 0);
    assert!(!store.due(u64::MAX / 2, 1000).await.unwrap().contains(&other));
    store.remove(id).await.unwrap();
    assert_eq!(store.by_request(principal, "r3").await.unwrap(), None);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_url_names_its_backend_or_nothing() {
        assert_eq!(StoreUrl::parse(None), Some(StoreUrl::Embedded));
        assert_eq!(StoreUrl::parse(Some("embedded")), Some(StoreUrl::Embedded));
        assert_eq!(
            StoreUrl::parse(Some("redis://h:6379/0")),
            Some(StoreUrl::Redis("redis://h:6379/0".into()))
        );
        assert_eq!(StoreUrl::parse(Some("s3://b/p")), Some(StoreUrl::S3("s3://b/p".into())));
        assert_eq!(StoreUrl::parse(Some("ftp://somewhere/x")), None);
        assert_eq!(StoreUrl::parse(Some("Embedded")), None);
    }
    use std::error::Error as _;

    #[test]
    fn store_errors_keep_their_source_and_read_as_before() {
        let io = StoreError::from(std::io::Error::other("disk on fire"));
        assert_eq!(io.to_string(), "storage: disk on fire");
        assert!(io.source().is_some());
        assert!(matches!(
            StoreError::from(std::io::Error::from_raw_os_error(28)),
            StoreError::Full
        ));
        let codec = StoreError::BadRecord(serde_json::from_str::<u8>("x").unwrap_err());
        assert!(codec.to_string().starts_with("storage: a stored session record: "));
        assert!(codec.source().is_some());
        assert_eq!(
            StoreError::NotJournalled("s1".into()).to_string(),
            "storage: session s1 is not journalled"
        );
        assert_eq!(
            StoreError::Moved("s1".into()).to_string(),
            "storage: session s1 moved on elsewhere"
        );
        assert_eq!(
            StoreError::BadFileStoreUrl("ftp://x".into()).to_string(),
            "storage: file_store = \"ftp://x\" is not embedded or s3://bucket/prefix"
        );
    }
}
