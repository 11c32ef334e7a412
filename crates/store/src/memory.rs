//! Stores that keep everything in memory (feature `memory`): for tests that drive the
//! engine without a data directory, Redis or S3. Each operation is one step under one
//! lock, as the traits ask of every backend. Nothing survives the process.

use crate::{
    Dormancy, FileMeta, FileStore, Journal, JournalEntry, Quota, QuotaExceeded, SessionStart, SessionState,
    SessionStore, StoreError, Usage, Workspace, WorkspaceFile,
};
use async_trait::async_trait;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use tokio::io::AsyncRead;

/// Programmatic sessions' journals, in memory.
#[derive(Default)]
pub struct MemorySessionStore {
    inner: Mutex<Sessions>,
}

#[derive(Default)]
struct Sessions {
    journals: HashMap<String, Journal>,
    /// id → (owner, lease until).
    owners: HashMap<String, (String, u64)>,
    dormant: HashMap<String, Dormancy>,
    /// (due, id) of the dormant sessions.
    due: BTreeSet<(u64, String)>,
    /// "principal\0request id" → session id.
    requests: HashMap<String, String>,
    /// session id → its key in `requests`.
    request_of: HashMap<String, String>,
}

impl Sessions {
    fn wake(&mut self, id: &str) -> Option<Dormancy> {
        let dormancy = self.dormant.remove(id)?;
        self.due.remove(&(dormancy.due_ms, id.to_owned()));
        Some(dormancy)
    }

    fn name(&mut self, id: &str, key: String) {
        if let Some(old) = self.request_of.insert(id.to_owned(), key.clone()) {
            if old != key && self.requests.get(&old).is_some_and(|s| s == id) {
                self.requests.remove(&old);
            }
        }
        self.requests.insert(key, id.to_owned());
    }
}

fn request_key(principal: &str, request_id: &str) -> String {
    format!("{principal}\0{request_id}")
}

impl MemorySessionStore {
    pub fn new() -> MemorySessionStore {
        MemorySessionStore::default()
    }

    fn lock(&self) -> MutexGuard<'_, Sessions> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl SessionStore for MemorySessionStore {
    async fn create(&self, id: &str, start: &SessionStart, state: &SessionState) -> Result<(), StoreError> {
        let journal = Journal {
            start: start.clone(),
            state: state.clone(),
            entries: Vec::new(),
        };
        self.lock().journals.insert(id.to_owned(), journal);
        Ok(())
    }

    async fn append(&self, id: &str, entries: &[JournalEntry], state: &SessionState) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let Some(journal) = inner.journals.get_mut(id) else {
            return Err(StoreError::NotJournalled(id.to_owned()));
        };
        journal.entries.extend_from_slice(entries);
        journal.state = state.clone();
        Ok(())
    }

    async fn consume(
        &self,
        id: &str,
        pause: u64,
        entries: &[JournalEntry],
        state: &SessionState,
    ) -> Result<bool, StoreError> {
        let mut inner = self.lock();
        let Some(journal) = inner
            .journals
            .get_mut(id)
            .filter(|j| j.state.open && j.state.pause == pause)
        else {
            return Ok(false);
        };
        journal.entries.extend_from_slice(entries);
        journal.state = state.clone();
        Ok(true)
    }

    async fn load(&self, id: &str) -> Result<Option<Journal>, StoreError> {
        Ok(self.lock().journals.get(id).cloned())
    }

    async fn state(&self, id: &str) -> Result<Option<SessionState>, StoreError> {
        Ok(self.lock().journals.get(id).map(|j| j.state.clone()))
    }

    async fn list(&self) -> Result<Vec<(String, String, SessionState)>, StoreError> {
        Ok(self
            .lock()
            .journals
            .iter()
            .map(|(id, j)| (id.clone(), j.start.principal.clone(), j.state.clone()))
            .collect())
    }

    async fn remove(&self, id: &str) -> Result<(), StoreError> {
        let mut inner = self.lock();
        inner.journals.remove(id);
        inner.owners.remove(id);
        // What it kept while dormant, and its request id, go with it.
        inner.wake(id);
        if let Some(key) = inner.request_of.remove(id) {
            if inner.requests.get(&key).is_some_and(|s| s == id) {
                inner.requests.remove(&key);
            }
        }
        Ok(())
    }

    async fn claim(&self, id: &str, owner: &str, now_ms: u64, until_ms: u64) -> Result<bool, StoreError> {
        let mut inner = self.lock();
        if inner
            .owners
            .get(id)
            .is_some_and(|(o, until)| o != owner && *until > now_ms)
        {
            return Ok(false);
        }
        inner.owners.insert(id.to_owned(), (owner.to_owned(), until_ms));
        Ok(true)
    }

    async fn entry(&self, id: &str) -> Result<Option<(String, SessionState)>, StoreError> {
        Ok(self
            .lock()
            .journals
            .get(id)
            .map(|j| (j.start.principal.clone(), j.state.clone())))
    }

    async fn owner(&self, id: &str, now_ms: u64) -> Result<Option<String>, StoreError> {
        Ok(self
            .lock()
            .owners
            .get(id)
            .filter(|(_, until)| *until > now_ms)
            .map(|(o, _)| o.clone()))
    }

    async fn release(&self, id: &str, owner: &str) -> Result<(), StoreError> {
        let mut inner = self.lock();
        if inner.owners.get(id).is_some_and(|(o, _)| o == owner) {
            inner.owners.remove(id);
        }
        Ok(())
    }

    async fn sleep(&self, id: &str, dormancy: &Dormancy) -> Result<bool, StoreError> {
        let mut inner = self.lock();
        if !inner.journals.contains_key(id) {
            return Ok(false);
        }
        // Marked again: its old deadline goes, and it is counted once.
        inner.wake(id);
        inner.due.insert((dormancy.due_ms, id.to_owned()));
        inner.dormant.insert(id.to_owned(), dormancy.clone());
        if let Some(request_id) = &dormancy.request_id {
            inner.name(id, request_key(&dormancy.principal, request_id));
        }
        Ok(true)
    }

    async fn wake(&self, id: &str) -> Result<Option<String>, StoreError> {
        Ok(self.lock().wake(id).map(|d| d.audit))
    }

    async fn due(&self, now_ms: u64, limit: usize) -> Result<Vec<String>, StoreError> {
        Ok(self
            .lock()
            .due
            .iter()
            .take_while(|(due, _)| *due <= now_ms)
            .take(limit)
            .map(|(_, id)| id.clone())
            .collect())
    }

    async fn dormant(&self, principal: Option<&str>) -> Result<u64, StoreError> {
        let inner = self.lock();
        Ok(inner
            .dormant
            .values()
            .filter(|d| principal.is_none_or(|p| d.principal == p))
            .count() as u64)
    }

    async fn dormant_audit(&self, id: &str) -> Result<Option<String>, StoreError> {
        Ok(self.lock().dormant.get(id).map(|d| d.audit.clone()))
    }

    async fn name_request(&self, principal: &str, request_id: &str, id: &str) -> Result<(), StoreError> {
        let mut inner = self.lock();
        if inner.journals.contains_key(id) {
            inner.name(id, request_key(principal, request_id));
        }
        Ok(())
    }

    async fn by_request(&self, principal: &str, request_id: &str) -> Result<Option<String>, StoreError> {
        Ok(self.lock().requests.get(&request_key(principal, request_id)).cloned())
    }
}

/// Stored files, in memory: their bytes are read in at `insert` (the file at `temp` is
/// removed), and written to `dir` only when a sandbox needs a host path (`local_path`).
pub struct MemoryFileStore {
    dir: PathBuf,
    inner: Mutex<Files>,
}

#[derive(Default)]
struct Files {
    /// (principal, session id, id) → the file.
    files: HashMap<(String, String, String), (FileMeta, Vec<u8>)>,
    /// (principal, name) → the workspace.
    workspaces: HashMap<(String, String), Workspace>,
}

impl MemoryFileStore {
    /// A store whose incoming files and host copies go under `dir`.
    pub fn new(dir: PathBuf) -> MemoryFileStore {
        MemoryFileStore {
            dir,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Files> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn key(principal: &str, session_id: &str, id: &str) -> (String, String, String) {
    (principal.to_owned(), session_id.to_owned(), id.to_owned())
}

#[async_trait]
impl FileStore for MemoryFileStore {
    fn incoming_dir(&self) -> PathBuf {
        self.dir.join("incoming")
    }

    async fn insert(&self, meta: FileMeta, temp: &Path, quota: Quota) -> Result<(), StoreError> {
        let bytes = tokio::fs::read(temp).await?;
        {
            let mut inner = self.lock();
            let (mut used_bytes, mut used_files) = (0u64, 0u64);
            for (m, _) in inner.files.values().filter(|(m, _)| m.principal == meta.principal) {
                used_bytes += m.size;
                used_files += 1;
            }
            if used_bytes + meta.size > quota.max_bytes {
                return Err(QuotaExceeded::Bytes(quota.max_bytes).into());
            }
            if used_files + 1 > quota.max_files {
                return Err(QuotaExceeded::Files(quota.max_files).into());
            }
            inner
                .files
                .insert(key(&meta.principal, &meta.session_id, &meta.id), (meta, bytes));
        }
        let _ = tokio::fs::remove_file(temp).await;
        Ok(())
    }

    async fn usage(&self, principal: &str) -> Result<Usage, StoreError> {
        let inner = self.lock();
        let mut usage = Usage::default();
        for (m, _) in inner.files.values().filter(|(m, _)| m.principal == principal) {
            usage.bytes += m.size;
            usage.files += 1;
        }
        Ok(usage)
    }

    async fn get(&self, principal: &str, session_id: &str, id: &str) -> Result<Option<FileMeta>, StoreError> {
        let now = crate::now_ms();
        Ok(self
            .lock()
            .files
            .get(&key(principal, session_id, id))
            .filter(|(m, _)| m.expires_ms > now)
            .map(|(m, _)| m.clone()))
    }

    async fn open(&self, meta: &FileMeta) -> Result<Box<dyn AsyncRead + Send + Unpin>, StoreError> {
        let bytes = self
            .lock()
            .files
            .get(&key(&meta.principal, &meta.session_id, &meta.id))
            .map(|(_, b)| b.clone())
            .ok_or_else(|| StoreError::Io(std::io::Error::new(std::io::ErrorKind::NotFound, "no such file")))?;
        Ok(Box::new(std::io::Cursor::new(bytes)))
    }

    async fn local_path(&self, meta: &FileMeta) -> Result<PathBuf, StoreError> {
        let bytes = self
            .lock()
            .files
            .get(&key(&meta.principal, &meta.session_id, &meta.id))
            .map(|(_, b)| b.clone())
            .ok_or_else(|| StoreError::Io(std::io::Error::new(std::io::ErrorKind::NotFound, "no such file")))?;
        let path = self.dir.join("files").join(&meta.id);
        tokio::fs::create_dir_all(self.dir.join("files")).await?;
        tokio::fs::write(&path, bytes).await?;
        Ok(path)
    }

    async fn list(&self, principal: &str, session_id: &str) -> Result<Vec<FileMeta>, StoreError> {
        let now = crate::now_ms();
        let mut out: Vec<FileMeta> = self
            .lock()
            .files
            .values()
            .filter(|(m, _)| m.principal == principal && m.session_id == session_id && m.expires_ms > now)
            .map(|(m, _)| m.clone())
            .collect();
        out.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.name.cmp(&b.name)));
        Ok(out)
    }

    async fn delete(&self, principal: &str, session_id: &str, id: &str) -> Result<bool, StoreError> {
        Ok(self.lock().files.remove(&key(principal, session_id, id)).is_some())
    }

    async fn sweep(&self, now_ms: u64) -> Result<usize, StoreError> {
        let mut inner = self.lock();
        let before = inner.files.len();
        inner.files.retain(|_, (m, _)| m.expires_ms > now_ms);
        Ok(before - inner.files.len())
    }

    async fn renew(
        &self,
        principal: &str,
        files: &[(String, String)],
        now_ms: u64,
        expires_ms: u64,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock();
        for (session_id, id) in files {
            if let Some((m, _)) = inner.files.get_mut(&key(principal, session_id, id)) {
                if m.expires_ms > now_ms {
                    m.expires_ms = expires_ms;
                }
            }
        }
        Ok(())
    }

    async fn workspace_take(
        &self,
        principal: &str,
        name: &str,
        holder: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<Option<Vec<WorkspaceFile>>, StoreError> {
        let mut inner = self.lock();
        let workspace = inner
            .workspaces
            .entry((principal.to_owned(), name.to_owned()))
            .or_default();
        Ok(workspace
            .take(holder, now_ms, until_ms)
            .then(|| workspace.files.clone()))
    }

    async fn workspace_release(
        &self,
        principal: &str,
        name: &str,
        holder: &str,
        files: Option<Vec<WorkspaceFile>>,
    ) -> Result<(), StoreError> {
        if let Some(workspace) = self.lock().workspaces.get_mut(&(principal.to_owned(), name.to_owned())) {
            workspace.release(holder, files);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dormant_sessions_and_request_ids() {
        crate::check_dormancy(&MemorySessionStore::new(), "s1", "p1").await;
    }
}
