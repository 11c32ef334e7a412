//! The embedded file store: bytes in `<data_dir>/files/objects/<session>/<id>`, metadata
//! in a redb database `<data_dir>/files/meta.redb`. Nothing external is needed.

use super::{FileMeta, FileStore, StoreError};
use async_trait::async_trait;
use redb::{Database, TableDefinition};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::AsyncRead;

/// `principal \0 session \0 id` -> FileMeta as JSON.
const FILES: TableDefinition<&str, &[u8]> = TableDefinition::new("files");
/// (expires_ms, files key) -> (), for the sweeper.
const EXPIRY: TableDefinition<(u64, &str), ()> = TableDefinition::new("expiry");

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
        tx.open_table(FILES).map_err(db_err)?;
        tx.open_table(EXPIRY).map_err(db_err)?;
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

    async fn insert(&self, meta: FileMeta, temp: &Path) -> Result<(), StoreError> {
        let dest = self.object_path(&meta.session_id, &meta.id);
        if let Some(dir) = dest.parent() {
            tokio::fs::create_dir_all(dir).await?;
        }
        tokio::fs::rename(temp, &dest).await?;
        let record = serde_json::to_vec(&meta).map_err(db_err)?;
        let result = self
            .blocking(move |db| {
                let k = key(&meta.principal, &meta.session_id, &meta.id);
                let tx = db.begin_write().map_err(db_err)?;
                {
                    tx.open_table(FILES)
                        .map_err(db_err)?
                        .insert(k.as_str(), record.as_slice())
                        .map_err(db_err)?;
                    tx.open_table(EXPIRY)
                        .map_err(db_err)?
                        .insert((meta.expires_ms, k.as_str()), ())
                        .map_err(db_err)?;
                }
                tx.commit().map_err(db_err)
            })
            .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&dest).await;
        }
        result
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
    use super::*;

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
        }
    }

    #[tokio::test]
    async fn files_are_per_principal_and_swept_when_due() {
        let dir = std::env::temp_dir().join(format!("sandcall-store-test-{}", std::process::id()));
        let store = LocalStore::open(&dir).unwrap();
        let far = super::super::now_ms() + 3_600_000;
        for (p, id, exp) in [("alice", "f1", far), ("alice", "f2", 10), ("bob", "f3", far)] {
            let temp = store.incoming_dir().join(id);
            std::fs::write(&temp, b"hello").unwrap();
            store.insert(meta(p, "s1", id, exp), &temp).await.unwrap();
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
        assert_eq!(store.sweep(super::super::now_ms()).await.unwrap(), 1);
        assert!(!store.object_path("s1", "f2").exists());
        assert!(store.delete("alice", "s1", "f1").await.unwrap());
        assert!(!store.delete("alice", "s1", "f1").await.unwrap());
        assert!(store.object_path("s1", "f3").exists());
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
