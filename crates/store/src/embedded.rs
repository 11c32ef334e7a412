//! The embedded stores, the default: nothing external is needed.
//!
//! Files (`LocalStore`): bytes in `<data_dir>/files/objects/<session>/<id>`, metadata
//! in a redb database `<data_dir>/files/meta.redb`. Session journals
//! (`EmbeddedSessionStore`): `<data_dir>/sessions.redb`.
//!
//! Each principal's usage (bytes, files) is a row of its own, changed in the same write
//! transaction as the file's row: by `insert` (which checks the quota there first),
//! `delete` and so `sweep`. redb runs one write transaction at a time, so the check and
//! the change cannot interleave with another principal's or the same one's.

use super::{
    Dormancy, FileMeta, FileStore, Journal, JournalEntry, Quota, SessionStart, SessionState, SessionStore, StoreError,
    Usage, Workspace, WorkspaceFile,
};
use async_trait::async_trait;
use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle, WriteTransaction};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::AsyncRead;

/// `principal \0 session \0 id` -> FileMeta as JSON.
const FILES: TableDefinition<&str, &[u8]> = TableDefinition::new("files");
/// (expires_ms, files key) -> (), for the sweeper.
const EXPIRY: TableDefinition<(u64, &str), ()> = TableDefinition::new("expiry");
/// principal -> (bytes, files) of its stored files, expired ones not yet swept included.
const USAGE: TableDefinition<&str, (u64, u64)> = TableDefinition::new("usage");
/// `principal \0 workspace name` -> Workspace as JSON.
const WORKSPACES: TableDefinition<&str, &[u8]> = TableDefinition::new("workspaces");

pub struct LocalStore {
    root: PathBuf,
    db: Db,
}

fn key(principal: &str, session_id: &str, id: &str) -> String {
    format!("{principal}\0{session_id}\0{id}")
}

fn db_err(e: impl Into<crate::BoxedError>) -> StoreError {
    StoreError::Database(e.into())
}

/// A store's redb database. Its operations run on a blocking thread: redb's calls block,
/// and a commit waits for the disk.
struct Db(Arc<Database>);

/// How work in a write transaction ends (`Db::write_if_changed`).
enum Outcome<T> {
    /// Something was written: commit, then answer.
    Changed(T),
    /// Nothing was: drop the transaction (no commit, no fsync), then answer.
    Unchanged(T),
}
use Outcome::{Changed, Unchanged};

impl Db {
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.0.clone();
        tokio::task::spawn_blocking(move || f(&db)).await.map_err(db_err)?
    }

    /// Runs `f` in a write transaction, committed when `f` returns Ok. An Err drops the
    /// transaction, which undoes what `f` wrote.
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&WriteTransaction) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.write_if_changed(move |tx| f(tx).map(Changed)).await
    }

    /// `write` for work that may find nothing to change and says so: `Unchanged` is not
    /// committed, so it costs no fsync.
    async fn write_if_changed<T: Send + 'static>(
        &self,
        f: impl FnOnce(&WriteTransaction) -> Result<Outcome<T>, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.blocking(move |db| transaction(db, f)).await
    }
}

/// One write transaction on this thread: `Db::write_if_changed`'s, and the `open`s'.
fn transaction<T>(
    db: &Database,
    f: impl FnOnce(&WriteTransaction) -> Result<Outcome<T>, StoreError>,
) -> Result<T, StoreError> {
    let tx = db.begin_write().map_err(db_err)?;
    match f(&tx)? {
        Changed(out) => {
            tx.commit().map_err(db_err)?;
            Ok(out)
        }
        // Dropped, redb aborts it.
        Unchanged(out) => Ok(out),
    }
}

impl LocalStore {
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let root = data_dir.join("files");
        std::fs::create_dir_all(root.join("objects"))?;
        std::fs::create_dir_all(root.join("incoming"))?;
        // Half-received uploads of a previous process are garbage.
        if let Ok(entries) = std::fs::read_dir(root.join("incoming")) {
            for e in entries.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let db = Database::create(root.join("meta.redb")).map_err(db_err)?;
        transaction(&db, |tx| {
            let has_usage = tx.list_tables().map_err(db_err)?.any(|t| t.name() == USAGE.name());
            tx.open_table(FILES).map_err(db_err)?;
            tx.open_table(EXPIRY).map_err(db_err)?;
            tx.open_table(WORKSPACES).map_err(db_err)?;
            // A data dir from before quotas: count what it holds, once.
            if !has_usage {
                count_usage(tx)?;
            }
            Ok(Changed(()))
        })?;
        Ok(LocalStore {
            root,
            db: Db(Arc::new(db)),
        })
    }

    fn object_path(&self, session_id: &str, id: &str) -> PathBuf {
        // Both are ids of our own making ([A-Za-z0-9_-]), safe as path parts.
        self.root.join("objects").join(session_id).join(id)
    }
}

/// Fills the usage table from the files table.
fn count_usage(tx: &WriteTransaction) -> Result<(), StoreError> {
    let mut usage: HashMap<String, Usage> = HashMap::new();
    for entry in tx.open_table(FILES).map_err(db_err)?.iter().map_err(db_err)? {
        let (_, v) = entry.map_err(db_err)?;
        // Unreadable records are skipped here as `delete` skips them: counted by neither.
        if let Ok(meta) = serde_json::from_slice::<FileMeta>(v.value()) {
            let u = usage.entry(meta.principal).or_default();
            u.bytes += meta.size;
            u.files += 1;
        }
    }
    let mut table = tx.open_table(USAGE).map_err(db_err)?;
    for (principal, u) in usage {
        table.insert(principal.as_str(), (u.bytes, u.files)).map_err(db_err)?;
    }
    Ok(())
}

fn usage_in(table: &impl ReadableTable<&'static str, (u64, u64)>, principal: &str) -> Result<Usage, StoreError> {
    Ok(table.get(principal).map_err(db_err)?.map_or_else(Usage::default, |v| {
        let (bytes, files) = v.value();
        Usage { bytes, files }
    }))
}

fn read_meta(db: &Database, k: &str) -> Result<Option<FileMeta>, StoreError> {
    let tx = db.begin_read().map_err(db_err)?;
    let table = tx.open_table(FILES).map_err(db_err)?;
    match table.get(k).map_err(db_err)? {
        Some(v) => Ok(serde_json::from_slice(v.value()).ok()),
        None => Ok(None),
    }
}

#[async_trait]
impl FileStore for LocalStore {
    fn incoming_dir(&self) -> PathBuf {
        self.root.join("incoming")
    }

    async fn insert(&self, meta: FileMeta, temp: &Path, quota: Quota) -> Result<(), StoreError> {
        let dest = self.object_path(&meta.session_id, &meta.id);
        let record = serde_json::to_vec(&meta).map_err(StoreError::Codec)?;
        let temp = temp.to_path_buf();
        let moved = dest.clone();
        let result = self
            .db
            .write(move |tx| {
                let k = key(&meta.principal, &meta.session_id, &meta.id);
                // Checked inside the write transaction, which no other can overlap:
                // this is what keeps concurrent inserts from passing together.
                let mut usage = tx.open_table(USAGE).map_err(db_err)?;
                let mut now = usage_in(&usage, &meta.principal)?;
                now.check(quota, meta.size, 1)?;
                now.bytes += meta.size;
                now.files += 1;
                usage
                    .insert(meta.principal.as_str(), (now.bytes, now.files))
                    .map_err(db_err)?;
                tx.open_table(FILES)
                    .map_err(db_err)?
                    .insert(k.as_str(), record.as_slice())
                    .map_err(db_err)?;
                tx.open_table(EXPIRY)
                    .map_err(db_err)?
                    .insert((meta.expires_ms, k.as_str()), ())
                    .map_err(db_err)?;
                // The bytes move only once the quota has let them in, and before the
                // commit; an error from here on drops the transaction, which undoes the rows.
                if let Some(dir) = moved.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                std::fs::rename(&temp, &moved)?;
                Ok(())
            })
            .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&dest).await;
        }
        result
    }

    async fn usage(&self, principal: &str) -> Result<Usage, StoreError> {
        let principal = principal.to_owned();
        self.db
            .blocking(move |db| {
                let tx = db.begin_read().map_err(db_err)?;
                usage_in(&tx.open_table(USAGE).map_err(db_err)?, &principal)
            })
            .await
    }

    async fn get(&self, principal: &str, session_id: &str, id: &str) -> Result<Option<FileMeta>, StoreError> {
        let k = key(principal, session_id, id);
        let now = crate::now_ms();
        let meta = self.db.blocking(move |db| read_meta(db, &k)).await?;
        // Past its time, a file is gone even before the sweeper comes by.
        Ok(meta.filter(|m| m.expires_ms > now))
    }

    async fn open(&self, meta: &FileMeta) -> Result<Box<dyn AsyncRead + Send + Unpin>, StoreError> {
        let file = tokio::fs::File::open(self.object_path(&meta.session_id, &meta.id)).await?;
        Ok(Box::new(file))
    }

    async fn local_path(&self, meta: &FileMeta) -> Result<PathBuf, StoreError> {
        Ok(self.object_path(&meta.session_id, &meta.id))
    }

    async fn list(&self, principal: &str, session_id: &str) -> Result<Vec<FileMeta>, StoreError> {
        let prefix = format!("{principal}\0{session_id}\0");
        let now = crate::now_ms();
        self.db
            .blocking(move |db| {
                let tx = db.begin_read().map_err(db_err)?;
                let table = tx.open_table(FILES).map_err(db_err)?;
                let mut out = Vec::new();
                for entry in table.range(prefix.as_str()..).map_err(db_err)? {
                    let (k, v) = entry.map_err(db_err)?;
                    if !k.value().starts_with(prefix.as_str()) {
                        break;
                    }
                    if let Ok(meta) = serde_json::from_slice::<FileMeta>(v.value()) {
                        if meta.expires_ms > now {
                            out.push(meta);
                        }
                    }
                }
                out.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.name.cmp(&b.name)));
                Ok(out)
            })
            .await
    }

    async fn delete(&self, principal: &str, session_id: &str, id: &str) -> Result<bool, StoreError> {
        let k = key(principal, session_id, id);
        let removed = self
            .db
            .write(move |tx| {
                let meta = {
                    let mut files = tx.open_table(FILES).map_err(db_err)?;
                    let old = files.remove(k.as_str()).map_err(db_err)?;
                    old.and_then(|v| serde_json::from_slice::<FileMeta>(v.value()).ok())
                };
                if let Some(m) = &meta {
                    tx.open_table(EXPIRY)
                        .map_err(db_err)?
                        .remove((m.expires_ms, k.as_str()))
                        .map_err(db_err)?;
                    let mut usage = tx.open_table(USAGE).map_err(db_err)?;
                    let now = usage_in(&usage, &m.principal)?;
                    let left = Usage {
                        bytes: now.bytes.saturating_sub(m.size),
                        files: now.files.saturating_sub(1),
                    };
                    if left.files == 0 {
                        usage.remove(m.principal.as_str()).map_err(db_err)?;
                    } else {
                        usage
                            .insert(m.principal.as_str(), (left.bytes, left.files))
                            .map_err(db_err)?;
                    }
                }
                Ok(meta)
            })
            .await?;
        match removed {
            Some(meta) => {
                let path = self.object_path(&meta.session_id, &meta.id);
                let _ = tokio::fs::remove_file(&path).await;
                if let Some(dir) = path.parent() {
                    let _ = tokio::fs::remove_dir(dir).await; // only once empty
                }
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn sweep(&self, now_ms: u64) -> Result<usize, StoreError> {
        let expired: Vec<String> = self
            .db
            .blocking(move |db| {
                let tx = db.begin_read().map_err(db_err)?;
                let table = tx.open_table(EXPIRY).map_err(db_err)?;
                let mut keys = Vec::new();
                for entry in table.range((0u64, "")..(now_ms, "")).map_err(db_err)? {
                    let (k, _) = entry.map_err(db_err)?;
                    keys.push(k.value().1.to_owned());
                }
                Ok(keys)
            })
            .await?;
        let mut n = 0;
        for k in expired {
            let mut parts = k.splitn(3, '\0');
            if let (Some(p), Some(s), Some(i)) = (parts.next(), parts.next(), parts.next()) {
                if self.delete(p, s, i).await? {
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    async fn renew(
        &self,
        principal: &str,
        files: &[(String, String)],
        now_ms: u64,
        expires_ms: u64,
    ) -> Result<(), StoreError> {
        let keys: Vec<String> = files.iter().map(|(s, i)| key(principal, s, i)).collect();
        self.db
            .write(move |tx| {
                let mut table = tx.open_table(FILES).map_err(db_err)?;
                let mut expiry = tx.open_table(EXPIRY).map_err(db_err)?;
                for k in &keys {
                    let meta = table
                        .get(k.as_str())
                        .map_err(db_err)?
                        .and_then(|v| serde_json::from_slice::<FileMeta>(v.value()).ok());
                    let Some(mut meta) = meta.filter(|m| m.expires_ms > now_ms && m.expires_ms < expires_ms) else {
                        continue;
                    };
                    expiry.remove((meta.expires_ms, k.as_str())).map_err(db_err)?;
                    meta.expires_ms = expires_ms;
                    expiry.insert((expires_ms, k.as_str()), ()).map_err(db_err)?;
                    let record = serde_json::to_vec(&meta).map_err(StoreError::Codec)?;
                    table.insert(k.as_str(), record.as_slice()).map_err(db_err)?;
                }
                Ok(())
            })
            .await
    }

    async fn workspace_take(
        &self,
        principal: &str,
        name: &str,
        holder: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<Option<Vec<WorkspaceFile>>, StoreError> {
        let (k, holder) = (format!("{principal}\0{name}"), holder.to_owned());
        self.db
            .write(move |tx| {
                change_workspace(tx, &k, |ws| {
                    let taken = ws.take(&holder, now_ms, until_ms);
                    (taken, taken.then(|| ws.files.clone()))
                })
            })
            .await
    }

    async fn workspace_release(
        &self,
        principal: &str,
        name: &str,
        holder: &str,
        files: Option<Vec<WorkspaceFile>>,
    ) -> Result<(), StoreError> {
        let (k, holder) = (format!("{principal}\0{name}"), holder.to_owned());
        self.db
            .write(move |tx| change_workspace(tx, &k, |ws| (ws.release(&holder, files), ())))
            .await
    }
}

/// Reads the workspace at `k` in the write transaction, lets `f` change it, and writes it
/// back if `f` says so; returns what `f` returned.
fn change_workspace<T>(
    tx: &WriteTransaction,
    k: &str,
    f: impl FnOnce(&mut Workspace) -> (bool, T),
) -> Result<T, StoreError> {
    let mut table = tx.open_table(WORKSPACES).map_err(db_err)?;
    let mut ws: Workspace = match table.get(k).map_err(db_err)? {
        Some(v) => serde_json::from_slice(v.value()).unwrap_or_default(),
        None => Workspace::default(),
    };
    let (write, out) = f(&mut ws);
    if write {
        let json = serde_json::to_vec(&ws).map_err(StoreError::Codec)?;
        table.insert(k, json.as_slice()).map_err(db_err)?;
    }
    Ok(out)
}

/// The embedded session store: every session's journal in a redb database,
/// `<data_dir>/sessions.redb`. Each operation is one write transaction (redb runs one
/// at a time), committed before it returns: a session written here survives the
/// server's SIGKILL.
pub struct EmbeddedSessionStore {
    db: Db,
}

/// The session database's page cache.
const SESSION_CACHE_BYTES: usize = 4 << 20;

/// id -> SessionStart as JSON (written once).
const SESSION_STARTS: TableDefinition<&str, &[u8]> = TableDefinition::new("session_starts");
/// id -> SessionState as JSON (replaced by each write).
const SESSION_STATES: TableDefinition<&str, &[u8]> = TableDefinition::new("session_states");
/// (id, sequence number) -> JournalEntry as JSON.
const SESSION_ENTRIES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("session_entries");
/// id -> (owner, lease end in ms since the epoch).
const SESSION_OWNERS: TableDefinition<&str, (&str, u64)> = TableDefinition::new("session_owners");

/// id -> Dormancy as JSON: the dormant sessions (`sleep`).
const SESSION_DORMANT: TableDefinition<&str, &[u8]> = TableDefinition::new("session_dormant");
/// (deadline ms, id) -> (): the dormant sessions by their first timer (`due`).
const SESSION_DUE: TableDefinition<(u64, &str), ()> = TableDefinition::new("session_due");
/// principal -> its dormant sessions (`dormant`), kept by `sleep`, `wake` and `remove`.
const SESSION_DORMANT_COUNT: TableDefinition<&str, u64> = TableDefinition::new("session_dormant_count");
/// `principal \0 request id` -> session id (`by_request`).
const SESSION_REQUESTS: TableDefinition<&str, &str> = TableDefinition::new("session_requests");
/// session id -> its key in `SESSION_REQUESTS`: one request id per session.
const SESSION_REQUEST_OF: TableDefinition<&str, &str> = TableDefinition::new("session_request_of");

fn request_key(principal: &str, request_id: &str) -> String {
    format!("{principal}\0{request_id}")
}

/// Names session `id` by `key` in place of its earlier name, in the write transaction.
fn name_in(tx: &WriteTransaction, id: &str, key: &str) -> Result<(), StoreError> {
    let mut of = tx.open_table(SESSION_REQUEST_OF).map_err(db_err)?;
    let mut requests = tx.open_table(SESSION_REQUESTS).map_err(db_err)?;
    let old = of.insert(id, key).map_err(db_err)?.map(|v| v.value().to_owned());
    if let Some(old) = old.filter(|o| o != key) {
        let points_here = requests
            .get(old.as_str())
            .map_err(db_err)?
            .is_some_and(|v| v.value() == id);
        if points_here {
            requests.remove(old.as_str()).map_err(db_err)?;
        }
    }
    requests.insert(key, id).map_err(db_err)?;
    Ok(())
}

/// Takes session `id` out of the dormant ones, in the write transaction: its record.
fn wake_in(tx: &WriteTransaction, id: &str) -> Result<Option<Dormancy>, StoreError> {
    let record = tx
        .open_table(SESSION_DORMANT)
        .map_err(db_err)?
        .remove(id)
        .map_err(db_err)?
        .map(|v| v.value().to_vec());
    let Some(record) = record else {
        return Ok(None);
    };
    let dormancy: Dormancy = serde_json::from_slice(&record).map_err(StoreError::Codec)?;
    tx.open_table(SESSION_DUE)
        .map_err(db_err)?
        .remove((dormancy.due_ms, id))
        .map_err(db_err)?;
    let mut counts = tx.open_table(SESSION_DORMANT_COUNT).map_err(db_err)?;
    let n = counts
        .get(dormancy.principal.as_str())
        .map_err(db_err)?
        .map_or(0, |v| v.value());
    if n <= 1 {
        counts.remove(dormancy.principal.as_str()).map_err(db_err)?;
    } else {
        counts.insert(dormancy.principal.as_str(), n - 1).map_err(db_err)?;
    }
    Ok(Some(dormancy))
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(StoreError::Codec)
}

/// The state stored with the start: the start names the principal, which `list` gives.
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredState {
    principal: String,
    #[serde(flatten)]
    state: SessionState,
}

impl EmbeddedSessionStore {
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        // A small cache: a journal is read back only to bring a session back, and redb's
        // default cache (1 GiB) would keep every pause's arguments in the server's memory.
        let db = redb::Builder::new()
            .set_cache_size(SESSION_CACHE_BYTES)
            .create(data_dir.join("sessions.redb"))
            .map_err(db_err)?;
        transaction(&db, |tx| {
            tx.open_table(SESSION_STARTS).map_err(db_err)?;
            tx.open_table(SESSION_STATES).map_err(db_err)?;
            tx.open_table(SESSION_ENTRIES).map_err(db_err)?;
            tx.open_table(SESSION_OWNERS).map_err(db_err)?;
            tx.open_table(SESSION_DORMANT).map_err(db_err)?;
            tx.open_table(SESSION_DUE).map_err(db_err)?;
            tx.open_table(SESSION_DORMANT_COUNT).map_err(db_err)?;
            tx.open_table(SESSION_REQUESTS).map_err(db_err)?;
            tx.open_table(SESSION_REQUEST_OF).map_err(db_err)?;
            Ok(Changed(()))
        })?;
        Ok(EmbeddedSessionStore { db: Db(Arc::new(db)) })
    }
}

/// The session's stored state, read inside a write transaction.
fn state_in(tx: &WriteTransaction, id: &str) -> Result<Option<StoredState>, StoreError> {
    let states = tx.open_table(SESSION_STATES).map_err(db_err)?;
    let value = states.get(id).map_err(db_err)?;
    match value {
        Some(v) => Ok(Some(serde_json::from_slice(v.value()).map_err(StoreError::Codec)?)),
        None => Ok(None),
    }
}

/// Appends `entries` after the session's last one, and replaces its state (keeping
/// `principal`, read from the stored one).
fn write_step(
    tx: &WriteTransaction,
    id: &str,
    principal: String,
    entries: &[Vec<u8>],
    state: &SessionState,
) -> Result<(), StoreError> {
    let stored = to_json(&StoredState {
        principal,
        state: state.clone(),
    })?;
    tx.open_table(SESSION_STATES)
        .map_err(db_err)?
        .insert(id, stored.as_slice())
        .map_err(db_err)?;
    let mut table = tx.open_table(SESSION_ENTRIES).map_err(db_err)?;
    let next = match table.range((id, 0)..=(id, u64::MAX)).map_err(db_err)?.next_back() {
        Some(last) => last.map_err(db_err)?.0.value().1 + 1,
        None => 0,
    };
    for (seq, entry) in (next..).zip(entries) {
        table.insert((id, seq), entry.as_slice()).map_err(db_err)?;
    }
    Ok(())
}

fn stored_state(db: &Database, id: &str) -> Result<Option<StoredState>, StoreError> {
    let tx = db.begin_read().map_err(db_err)?;
    let table = tx.open_table(SESSION_STATES).map_err(db_err)?;
    match table.get(id).map_err(db_err)? {
        Some(v) => Ok(Some(serde_json::from_slice(v.value()).map_err(StoreError::Codec)?)),
        None => Ok(None),
    }
}

fn entries_json(entries: &[JournalEntry]) -> Result<Vec<Vec<u8>>, StoreError> {
    entries.iter().map(to_json).collect()
}

#[async_trait]
impl SessionStore for EmbeddedSessionStore {
    async fn create(&self, id: &str, start: &SessionStart, state: &SessionState) -> Result<(), StoreError> {
        let (id, start_json) = (id.to_owned(), to_json(start)?);
        let state_json = to_json(&StoredState {
            principal: start.principal.clone(),
            state: state.clone(),
        })?;
        self.db
            .write(move |tx| {
                tx.open_table(SESSION_STARTS)
                    .map_err(db_err)?
                    .insert(id.as_str(), start_json.as_slice())
                    .map_err(db_err)?;
                tx.open_table(SESSION_STATES)
                    .map_err(db_err)?
                    .insert(id.as_str(), state_json.as_slice())
                    .map_err(db_err)?;
                Ok(())
            })
            .await
    }

    async fn append(&self, id: &str, entries: &[JournalEntry], state: &SessionState) -> Result<(), StoreError> {
        let (id, entries, state) = (id.to_owned(), entries_json(entries)?, state.clone());
        self.db
            .write(move |tx| {
                let Some(stored) = state_in(tx, &id)? else {
                    return Err(StoreError::NotJournalled(id));
                };
                write_step(tx, &id, stored.principal, &entries, &state)
            })
            .await
    }

    async fn consume(
        &self,
        id: &str,
        pause: u64,
        entries: &[JournalEntry],
        state: &SessionState,
    ) -> Result<bool, StoreError> {
        let (id, entries, state) = (id.to_owned(), entries_json(entries)?, state.clone());
        self.db
            .write_if_changed(move |tx| {
                let Some(stored) = state_in(tx, &id)?.filter(|s| s.state.open && s.state.pause == pause) else {
                    return Ok(Unchanged(false));
                };
                write_step(tx, &id, stored.principal, &entries, &state)?;
                Ok(Changed(true))
            })
            .await
    }

    async fn load(&self, id: &str) -> Result<Option<Journal>, StoreError> {
        let id = id.to_owned();
        self.db
            .blocking(move |db| {
                let Some(stored) = stored_state(db, &id)? else {
                    return Ok(None);
                };
                let tx = db.begin_read().map_err(db_err)?;
                let starts = tx.open_table(SESSION_STARTS).map_err(db_err)?;
                let Some(start) = starts.get(id.as_str()).map_err(db_err)? else {
                    return Ok(None);
                };
                let start: SessionStart = serde_json::from_slice(start.value()).map_err(StoreError::Codec)?;
                let table = tx.open_table(SESSION_ENTRIES).map_err(db_err)?;
                let mut entries = Vec::new();
                for row in table
                    .range((id.as_str(), 0)..=(id.as_str(), u64::MAX))
                    .map_err(db_err)?
                {
                    let (_, v) = row.map_err(db_err)?;
                    entries.push(serde_json::from_slice(v.value()).map_err(StoreError::Codec)?);
                }
                Ok(Some(Journal {
                    start,
                    state: stored.state,
                    entries,
                }))
            })
            .await
    }

    async fn state(&self, id: &str) -> Result<Option<SessionState>, StoreError> {
        let id = id.to_owned();
        self.db
            .blocking(move |db| Ok(stored_state(db, &id)?.map(|s| s.state)))
            .await
    }

    async fn list(&self) -> Result<Vec<(String, String, SessionState)>, StoreError> {
        self.db
            .blocking(|db| {
                let tx = db.begin_read().map_err(db_err)?;
                let table = tx.open_table(SESSION_STATES).map_err(db_err)?;
                let mut all = Vec::new();
                for row in table.iter().map_err(db_err)? {
                    let (k, v) = row.map_err(db_err)?;
                    // An unreadable record is left out: it cannot be brought back.
                    if let Ok(stored) = serde_json::from_slice::<StoredState>(v.value()) {
                        all.push((k.value().to_owned(), stored.principal, stored.state));
                    }
                }
                Ok(all)
            })
            .await
    }

    async fn remove(&self, id: &str) -> Result<(), StoreError> {
        let id = id.to_owned();
        self.db
            .write(move |tx| {
                tx.open_table(SESSION_STARTS)
                    .map_err(db_err)?
                    .remove(id.as_str())
                    .map_err(db_err)?;
                tx.open_table(SESSION_STATES)
                    .map_err(db_err)?
                    .remove(id.as_str())
                    .map_err(db_err)?;
                tx.open_table(SESSION_OWNERS)
                    .map_err(db_err)?
                    .remove(id.as_str())
                    .map_err(db_err)?;
                {
                    let mut table = tx.open_table(SESSION_ENTRIES).map_err(db_err)?;
                    table
                        .retain_in((id.as_str(), 0)..=(id.as_str(), u64::MAX), |_, _| false)
                        .map_err(db_err)?;
                }
                // What it kept while dormant, and its request id, go with it.
                wake_in(tx, &id)?;
                let named = tx
                    .open_table(SESSION_REQUEST_OF)
                    .map_err(db_err)?
                    .remove(id.as_str())
                    .map_err(db_err)?
                    .map(|v| v.value().to_owned());
                if let Some(named) = named {
                    let mut requests = tx.open_table(SESSION_REQUESTS).map_err(db_err)?;
                    let points_here = requests
                        .get(named.as_str())
                        .map_err(db_err)?
                        .is_some_and(|v| v.value() == id);
                    if points_here {
                        requests.remove(named.as_str()).map_err(db_err)?;
                    }
                }
                Ok(())
            })
            .await
    }

    async fn claim(&self, id: &str, owner: &str, now_ms: u64, until_ms: u64) -> Result<bool, StoreError> {
        let (id, owner) = (id.to_owned(), owner.to_owned());
        self.db
            .write_if_changed(move |tx| {
                let mut table = tx.open_table(SESSION_OWNERS).map_err(db_err)?;
                let held = table.get(id.as_str()).map_err(db_err)?.map(|v| {
                    let (o, until) = v.value();
                    (o.to_owned(), until)
                });
                if held.is_some_and(|(o, until)| o != owner && until > now_ms) {
                    return Ok(Unchanged(false));
                }
                table.insert(id.as_str(), (owner.as_str(), until_ms)).map_err(db_err)?;
                Ok(Changed(true))
            })
            .await
    }

    async fn entry(&self, id: &str) -> Result<Option<(String, SessionState)>, StoreError> {
        let id = id.to_owned();
        self.db
            .blocking(move |db| Ok(stored_state(db, &id)?.map(|s| (s.principal, s.state))))
            .await
    }

    async fn owner(&self, id: &str, now_ms: u64) -> Result<Option<String>, StoreError> {
        let id = id.to_owned();
        self.db
            .blocking(move |db| {
                let tx = db.begin_read().map_err(db_err)?;
                let table = tx.open_table(SESSION_OWNERS).map_err(db_err)?;
                let held = table.get(id.as_str()).map_err(db_err)?.and_then(|v| {
                    let (owner, until) = v.value();
                    (until > now_ms).then(|| owner.to_owned())
                });
                Ok(held)
            })
            .await
    }

    async fn release(&self, id: &str, owner: &str) -> Result<(), StoreError> {
        let (id, owner) = (id.to_owned(), owner.to_owned());
        self.db
            .write(move |tx| {
                let mut table = tx.open_table(SESSION_OWNERS).map_err(db_err)?;
                let mine = table
                    .get(id.as_str())
                    .map_err(db_err)?
                    .is_some_and(|v| v.value().0 == owner);
                if mine {
                    table.remove(id.as_str()).map_err(db_err)?;
                }
                Ok(())
            })
            .await
    }

    async fn sleep(&self, id: &str, dormancy: &Dormancy) -> Result<bool, StoreError> {
        let (id, dormancy) = (id.to_owned(), dormancy.clone());
        let record = to_json(&dormancy)?;
        self.db
            .write_if_changed(move |tx| {
                if state_in(tx, &id)?.is_none() {
                    return Ok(Unchanged(false));
                }
                // Marked again: its old deadline goes, and it is counted once.
                wake_in(tx, &id)?;
                tx.open_table(SESSION_DORMANT)
                    .map_err(db_err)?
                    .insert(id.as_str(), record.as_slice())
                    .map_err(db_err)?;
                tx.open_table(SESSION_DUE)
                    .map_err(db_err)?
                    .insert((dormancy.due_ms, id.as_str()), ())
                    .map_err(db_err)?;
                {
                    let mut counts = tx.open_table(SESSION_DORMANT_COUNT).map_err(db_err)?;
                    let n = counts
                        .get(dormancy.principal.as_str())
                        .map_err(db_err)?
                        .map_or(0, |v| v.value());
                    counts.insert(dormancy.principal.as_str(), n + 1).map_err(db_err)?;
                }
                if let Some(request_id) = &dormancy.request_id {
                    name_in(tx, &id, &request_key(&dormancy.principal, request_id))?;
                }
                Ok(Changed(true))
            })
            .await
    }

    async fn wake(&self, id: &str) -> Result<Option<String>, StoreError> {
        let id = id.to_owned();
        self.db
            .write_if_changed(move |tx| {
                Ok(match wake_in(tx, &id)? {
                    Some(woken) => Changed(Some(woken.audit)),
                    None => Unchanged(None),
                })
            })
            .await
    }

    async fn due(&self, now_ms: u64, limit: usize) -> Result<Vec<String>, StoreError> {
        self.db
            .blocking(move |db| {
                let tx = db.begin_read().map_err(db_err)?;
                let table = tx.open_table(SESSION_DUE).map_err(db_err)?;
                let mut ids = Vec::new();
                for row in table
                    .range((0u64, "")..=(now_ms, "\u{10ffff}"))
                    .map_err(db_err)?
                    .take(limit)
                {
                    let (k, _) = row.map_err(db_err)?;
                    ids.push(k.value().1.to_owned());
                }
                Ok(ids)
            })
            .await
    }

    async fn dormant(&self, principal: Option<&str>) -> Result<u64, StoreError> {
        let principal = principal.map(str::to_owned);
        self.db
            .blocking(move |db| {
                let tx = db.begin_read().map_err(db_err)?;
                match principal {
                    Some(p) => Ok(tx
                        .open_table(SESSION_DORMANT_COUNT)
                        .map_err(db_err)?
                        .get(p.as_str())
                        .map_err(db_err)?
                        .map_or(0, |v| v.value())),
                    None => tx.open_table(SESSION_DORMANT).map_err(db_err)?.len().map_err(db_err),
                }
            })
            .await
    }

    async fn dormant_audit(&self, id: &str) -> Result<Option<String>, StoreError> {
        let id = id.to_owned();
        self.db
            .blocking(move |db| {
                let tx = db.begin_read().map_err(db_err)?;
                let table = tx.open_table(SESSION_DORMANT).map_err(db_err)?;
                let Some(v) = table.get(id.as_str()).map_err(db_err)? else {
                    return Ok(None);
                };
                let dormancy: Dormancy = serde_json::from_slice(v.value()).map_err(StoreError::Codec)?;
                Ok(Some(dormancy.audit))
            })
            .await
    }

    async fn name_request(&self, principal: &str, request_id: &str, id: &str) -> Result<(), StoreError> {
        let (key, id) = (request_key(principal, request_id), id.to_owned());
        self.db
            .write_if_changed(move |tx| {
                if state_in(tx, &id)?.is_none() {
                    return Ok(Unchanged(()));
                }
                name_in(tx, &id, &key)?;
                Ok(Changed(()))
            })
            .await
    }

    async fn by_request(&self, principal: &str, request_id: &str) -> Result<Option<String>, StoreError> {
        let key = request_key(principal, request_id);
        self.db
            .blocking(move |db| {
                let tx = db.begin_read().map_err(db_err)?;
                let table = tx.open_table(SESSION_REQUESTS).map_err(db_err)?;
                Ok(table.get(key.as_str()).map_err(db_err)?.map(|v| v.value().to_owned()))
            })
            .await
    }
}

#[cfg(test)]
mod tests;
