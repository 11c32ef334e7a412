//! The embedded file store: bytes in `<data_dir>/files/objects/<session>/<id>`, metadata
//! in a redb database `<data_dir>/files/meta.redb`. Nothing external is needed.
//!
//! Each principal's usage (bytes, files) is a row of its own, changed in the same write
//! transaction as the file's row: by `insert` (which checks the quota there first),
//! `delete` and so `sweep`. redb runs one write transaction at a time, so the check and
//! the change cannot interleave with another principal's or the same one's.

use super::{FileMeta, FileStore, Quota, StoreError, Usage};
use async_trait::async_trait;
use redb::{Database, ReadableTable, TableDefinition, TableHandle, WriteTransaction};
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

pub struct LocalStore {
    root: PathBuf,
    db: Arc<Database>,
}

fn key(principal: &str, session_id: &str, id: &str) -> String {
    format!("{principal}\0{session_id}\0{id}")
}

fn db_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(e.to_string())
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
        let tx = db.begin_write().map_err(db_err)?;
        let has_usage = tx.list_tables().map_err(db_err)?.any(|t| t.name() == USAGE.name());
        tx.open_table(FILES).map_err(db_err)?;
        tx.open_table(EXPIRY).map_err(db_err)?;
        // A data dir from before quotas: count what it holds, once.
        if !has_usage {
            count_usage(&tx)?;
        }
        tx.commit().map_err(db_err)?;
        Ok(LocalStore { root, db: Arc::new(db) })
    }

    fn object_path(&self, session_id: &str, id: &str) -> PathBuf {
        // Both are ids of our own making ([A-Za-z0-9_-]), safe as path parts.
        self.root.join("objects").join(session_id).join(id)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db)).await.map_err(db_err)?
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
        let record = serde_json::to_vec(&meta).map_err(db_err)?;
        let temp = temp.to_path_buf();
        let moved = dest.clone();
        let result = self
            .blocking(move |db| {
                let k = key(&meta.principal, &meta.session_id, &meta.id);
                let tx = db.begin_write().map_err(db_err)?;
                {
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
                }
                // The bytes move only once the quota has let them in; an error from here
                // on drops the transaction, which undoes the rows.
                if let Some(dir) = moved.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                std::fs::rename(&temp, &moved)?;
                tx.commit().map_err(db_err)
            })
            .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&dest).await;
        }
        result
    }

    async fn usage(&self, principal: &str) -> Result<Usage, StoreError> {
        let principal = principal.to_owned();
        self.blocking(move |db| {
            let tx = db.begin_read().map_err(db_err)?;
            usage_in(&tx.open_table(USAGE).map_err(db_err)?, &principal)
        })
        .await
    }

    async fn get(&self, principal: &str, session_id: &str, id: &str) -> Result<Option<FileMeta>, StoreError> {
        let k = key(principal, session_id, id);
        let now = super::now_ms();
        let meta = self.blocking(move |db| read_meta(db, &k)).await?;
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
        let now = super::now_ms();
        self.blocking(move |db| {
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
            .blocking(move |db| {
                let tx = db.begin_write().map_err(db_err)?;
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
                tx.commit().map_err(db_err)?;
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
}

#[cfg(test)]
mod tests {
    use super::super::{now_ms, QuotaExceeded};
    use super::*;

    const ROOMY: Quota = Quota {
        max_bytes: 1 << 30,
        max_files: 1000,
    };

    fn meta(principal: &str, session: &str, id: &str, expires_ms: u64) -> FileMeta {
        FileMeta {
            principal: principal.into(),
            session_id: session.into(),
            id: id.into(),
            name: format!("{id}.txt"),
            size: 5,
            content_type: "text/plain".into(),
            sha256: String::new(),
            created_ms: 1,
            expires_ms,
            kind: None,
            entity_id: None,
            version: None,
            read_only: false,
        }
    }

    fn test_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sandcall-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// Inserts a file of 5 bytes.
    async fn put(store: &LocalStore, m: FileMeta, quota: Quota) -> Result<(), StoreError> {
        let temp = store.incoming_dir().join(&m.id);
        std::fs::write(&temp, b"hello").unwrap();
        store.insert(m, &temp, quota).await
    }

    async fn usage(store: &LocalStore, principal: &str) -> (u64, u64) {
        let u = store.usage(principal).await.unwrap();
        (u.bytes, u.files)
    }

    #[tokio::test]
    async fn files_are_per_principal_and_swept_when_due() {
        let dir = test_dir("sweep");
        let store = LocalStore::open(&dir).unwrap();
        let far = now_ms() + 3_600_000;
        for (p, id, exp) in [("alice", "f1", far), ("alice", "f2", 10), ("bob", "f3", far)] {
            put(&store, meta(p, "s1", id, exp), ROOMY).await.unwrap();
        }
        let names = |v: Vec<FileMeta>| v.into_iter().map(|m| m.id).collect::<Vec<_>>();
        assert_eq!(
            names(store.list("alice", "s1").await.unwrap()),
            vec!["f1"],
            "expired f2 is hidden"
        );
        assert_eq!(names(store.list("bob", "s1").await.unwrap()), vec!["f3"]);
        assert!(
            store.get("bob", "s1", "f1").await.unwrap().is_none(),
            "another principal's file"
        );
        assert_eq!(store.sweep(now_ms()).await.unwrap(), 1);
        assert!(!store.object_path("s1", "f2").exists());
        assert!(store.delete("alice", "s1", "f1").await.unwrap());
        assert!(!store.delete("alice", "s1", "f1").await.unwrap());
        assert!(store.object_path("s1", "f3").exists());
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn usage_follows_inserts_deletes_and_sweeps_and_survives_a_reopen() {
        let dir = test_dir("usage");
        let store = LocalStore::open(&dir).unwrap();
        let far = now_ms() + 3_600_000;
        put(&store, meta("alice", "s1", "f1", far), ROOMY).await.unwrap();
        put(&store, meta("alice", "s1", "f2", 10), ROOMY).await.unwrap();
        put(&store, meta("bob", "s2", "f3", far), ROOMY).await.unwrap();
        assert_eq!(usage(&store, "alice").await, (10, 2));
        assert_eq!(usage(&store, "bob").await, (5, 1));
        assert_eq!(usage(&store, "carol").await, (0, 0));

        // Over either quota: refused with which one, nothing recorded or moved.
        let bytes = Quota {
            max_bytes: 14,
            max_files: 1000,
        };
        let err = put(&store, meta("alice", "s1", "f4", far), bytes).await.unwrap_err();
        assert!(matches!(err, StoreError::Quota(QuotaExceeded::Bytes(14))), "{err}");
        let files = Quota {
            max_bytes: 1 << 30,
            max_files: 2,
        };
        let err = put(&store, meta("alice", "s1", "f4", far), files).await.unwrap_err();
        assert!(matches!(err, StoreError::Quota(QuotaExceeded::Files(2))), "{err}");
        assert_eq!(usage(&store, "alice").await, (10, 2));
        assert!(store.get("alice", "s1", "f4").await.unwrap().is_none());
        assert!(!store.object_path("s1", "f4").exists());
        // Exactly at the quota is within it.
        let exact = Quota {
            max_bytes: 15,
            max_files: 3,
        };
        put(&store, meta("alice", "s1", "f4", far), exact).await.unwrap();
        assert_eq!(usage(&store, "alice").await, (15, 3));

        // A delete frees the file's share once; a sweep of an expired file frees it too.
        assert!(store.delete("alice", "s1", "f1").await.unwrap());
        assert!(!store.delete("alice", "s1", "f1").await.unwrap());
        assert_eq!(usage(&store, "alice").await, (10, 2));
        assert_eq!(store.sweep(now_ms()).await.unwrap(), 1);
        assert_eq!(usage(&store, "alice").await, (5, 1));
        assert_eq!(usage(&store, "bob").await, (5, 1));

        // Kept in the database: the same after a reopen.
        drop(store);
        let store = LocalStore::open(&dir).unwrap();
        assert_eq!(usage(&store, "alice").await, (5, 1));
        assert_eq!(usage(&store, "bob").await, (5, 1));
        assert!(store.delete("alice", "s1", "f4").await.unwrap());
        assert_eq!(usage(&store, "alice").await, (0, 0));
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_data_dir_from_before_quotas_has_its_usage_counted_at_open() {
        let dir = test_dir("legacy");
        let store = LocalStore::open(&dir).unwrap();
        let far = now_ms() + 3_600_000;
        for (p, id) in [("alice", "f1"), ("alice", "f2"), ("bob", "f3")] {
            put(&store, meta(p, "s1", id, far), ROOMY).await.unwrap();
        }
        drop(store);
        // What an older server left: the files and expiry tables, no usage table.
        let db = Database::create(dir.join("files/meta.redb")).unwrap();
        let tx = db.begin_write().unwrap();
        assert!(tx.delete_table(USAGE).unwrap());
        tx.commit().unwrap();
        drop(db);
        let store = LocalStore::open(&dir).unwrap();
        assert_eq!(usage(&store, "alice").await, (10, 2));
        assert_eq!(usage(&store, "bob").await, (5, 1));
        assert!(store.delete("bob", "s1", "f3").await.unwrap());
        assert_eq!(usage(&store, "bob").await, (0, 0));
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_inserts_never_pass_the_quota_together() {
        let dir = test_dir("race");
        let store = Arc::new(LocalStore::open(&dir).unwrap());
        let quota = Quota {
            max_bytes: 50,
            max_files: 1000,
        };
        let far = now_ms() + 3_600_000;
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move { put(&store, meta("alice", "s1", &format!("f{i}"), far), quota).await })
            })
            .collect();
        let mut ok = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(()) => ok += 1,
                Err(StoreError::Quota(_)) => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(ok, 10);
        assert_eq!(usage(&store, "alice").await, (50, 10));
        assert_eq!(store.list("alice", "s1").await.unwrap().len(), 10);
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
