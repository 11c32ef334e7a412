//! The S3 file store (`file_store = "s3://bucket/prefix"`): every node of a cluster
//! shares one bucket, through the `object_store` crate. What it keeps, under the prefix:
//!
//! - `objects/<session>/<id>`: a file's bytes, written once.
//! - `meta/<principal>/<session>/<id>`: its `FileMeta` as JSON, written once the bytes
//!   are in (a file is visible, to every node, from then on).
//! - `ledger/<principal>`: the principal's files with their sizes and expiry times. It is
//!   the usage that quotas check, and the index the sweep walks. Every change of it is a
//!   conditional put (`If-Match` its ETag, or `If-None-Match: *` for the first): an insert
//!   checks the quota and adds its file in one such put, so two nodes cannot both pass
//!   the quota; a delete removes its file in one, so a file's share is freed once.
//! - `workspaces/<principal>/<name>`: a workspace's files and its holder's lease, taken
//!   and given back with the same conditional puts.
//!
//! Principals and workspace names are base64url in keys. Every conditional object holds a
//! revision number that each write raises, so that no two versions have the same bytes
//! (an S3 ETag is the MD5 of the bytes) and a stale ETag never matches again.
//!
//! The sandbox helper copies inputs from a host path: `local_path` downloads a file once
//! into `<data_dir>/files/cache/<session>/<id>` (files are never changed once stored, so
//! a copy stays right), and an insert keeps its own bytes there. The cache is bounded by
//! `file_cache_mb`: past it, the copies least recently used go first, except those used
//! in the last `CACHE_GRACE` (a run that resolved its inputs may not have copied them yet).

use super::{FileMeta, FileStore, Quota, QuotaExceeded, StoreError, Usage, Workspace, WorkspaceFile};
use async_trait::async_trait;
use base64::Engine;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjPath;
use object_store::{
    ClientConfigKey, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig, UpdateVersion,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncRead, AsyncWriteExt};

/// A cached copy used this recently is never evicted.
const CACHE_GRACE: Duration = Duration::from_secs(300);
/// The part size of multipart uploads (S3's smallest), and the largest file sent in one put.
const UPLOAD_PART: usize = 5 << 20;
/// Conditional puts that lose to another writer are tried again this many times.
const CAS_ATTEMPTS: u32 = 64;

pub struct S3Store {
    store: Arc<dyn ObjectStore>,
    /// The key prefix, without a trailing `/` (may be empty).
    prefix: String,
    /// `<data_dir>/files`.
    root: PathBuf,
    cache_bytes: u64,
    evicting: Arc<AtomicBool>,
}

/// `s3://bucket/prefix` as (bucket, prefix); None if it is not such a URL.
pub fn parse_url(url: &str) -> Option<(String, String)> {
    let rest = url.strip_prefix("s3://")?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return None;
    }
    Some((bucket.to_owned(), prefix.trim_matches('/').to_owned()))
}

/// Whether plain http may be used for `endpoint`: only to this machine.
fn loopback_http(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split('/').next().unwrap_or("");
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The longest wait for a connection to S3 (at most `s3_timeout_ms`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// An object store error: `Unavailable` when S3 could not be reached or did not answer
/// (worth a retry later), `S3` for anything else (a refusal, a bad answer).
fn os_err(e: object_store::Error) -> StoreError {
    if unreachable(&e) {
        StoreError::Unavailable(format!("s3: {e}"))
    } else {
        StoreError::S3(Box::new(e))
    }
}

/// Whether a transport error (a connection refused, reset or timed out, a request cut
/// off) lies anywhere in `e`'s chain of causes, io::Error's wrapped errors included
/// (the multipart writer reports object store errors as io::Error).
fn unreachable(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if err.is::<object_store::client::HttpError>() {
            return true;
        }
        next = match err.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    false
}

fn json_err(e: serde_json::Error) -> StoreError {
    StoreError::S3(Box::new(e))
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
}

/// An object changed only by conditional puts, with the revision each write raises.
#[derive(Serialize, Deserialize, Default)]
struct Versioned<T> {
    rev: u64,
    #[serde(flatten)]
    value: T,
}

/// A principal's files: `session/id` -> (size, expires_ms).
#[derive(Serialize, Deserialize, Default)]
struct Ledger {
    #[serde(default)]
    files: BTreeMap<String, (u64, u64)>,
}

impl Ledger {
    fn usage(&self) -> Usage {
        Usage {
            bytes: self.files.values().map(|(size, _)| size).sum(),
            files: self.files.len() as u64,
        }
    }
}

impl S3Store {
    /// The store for `url` (`s3://bucket/prefix`), its cache under `data_dir`. Nothing
    /// is sent yet: `check` is the first request.
    /// `timeout` bounds each request to S3, and the retries of a failed one stop once
    /// that long has passed since its first try (`s3_timeout_ms`).
    pub fn open(
        data_dir: &Path,
        url: &str,
        endpoint: Option<&str>,
        cache_mb: u64,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let (bucket, prefix) = parse_url(url).ok_or_else(|| StoreError::BadFileStoreUrl(url.to_owned()))?;
        // Credentials and region from the standard AWS_* variables.
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::Timeout),
                format!("{}ms", timeout.as_millis()),
            )
            .with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                format!("{}ms", timeout.min(CONNECT_TIMEOUT).as_millis()),
            )
            .with_retry(RetryConfig {
                retry_timeout: timeout,
                ..RetryConfig::default()
            });
        if let Some(endpoint) = endpoint {
            if endpoint.starts_with("http://") && !loopback_http(endpoint) {
                return Err(StoreError::InsecureS3Endpoint(endpoint.to_owned()));
            }
            builder = builder.with_endpoint(endpoint).with_allow_http(loopback_http(endpoint));
        }
        let store = builder.build().map_err(os_err)?;
        let root = data_dir.join("files");
        std::fs::create_dir_all(root.join("incoming"))?;
        std::fs::create_dir_all(root.join("cache"))?;
        // Half-received uploads of a previous process are garbage; cached copies are not.
        for e in std::fs::read_dir(root.join("incoming"))?.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
        Ok(S3Store {
            store: Arc::new(store),
            prefix,
            root,
            cache_bytes: cache_mb.saturating_mul(1 << 20),
            evicting: Arc::new(AtomicBool::new(false)),
        })
    }

    /// One request to the bucket, so that a wrong bucket, endpoint or credential stops
    /// the start instead of every upload.
    /// A listing, not a HEAD: S3 answers a HEAD of a missing bucket like one of a
    /// missing key, 404, and a listing with `NoSuchBucket`.
    pub async fn check(&self) -> Result<(), StoreError> {
        self.store
            .list_with_delimiter(Some(&self.key("ledger")))
            .await
            .map(|_| ())
            .map_err(os_err)
    }

    fn key(&self, rest: &str) -> ObjPath {
        if self.prefix.is_empty() {
            ObjPath::from(rest)
        } else {
            ObjPath::from(format!("{}/{rest}", self.prefix))
        }
    }

    fn object_key(&self, session_id: &str, id: &str) -> ObjPath {
        // Both are ids of our own making ([A-Za-z0-9_-]), safe as key parts.
        self.key(&format!("objects/{session_id}/{id}"))
    }

    fn meta_key(&self, principal: &str, session_id: &str, id: &str) -> ObjPath {
        self.key(&format!("meta/{}/{session_id}/{id}", b64(principal)))
    }

    fn ledger_key(&self, principal: &str) -> ObjPath {
        self.key(&format!("ledger/{}", b64(principal)))
    }

    fn workspace_key(&self, principal: &str, name: &str) -> ObjPath {
        self.key(&format!("workspaces/{}/{}", b64(principal), b64(name)))
    }

    fn cache_path(&self, session_id: &str, id: &str) -> PathBuf {
        self.root.join("cache").join(session_id).join(id)
    }

    async fn read_json<T: DeserializeOwned>(&self, key: &ObjPath) -> Result<Option<(T, UpdateVersion)>, StoreError> {
        let got = match self.store.get(key).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(os_err(e)),
        };
        let version = UpdateVersion {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        let bytes = got.bytes().await.map_err(os_err)?;
        Ok(Some((serde_json::from_slice(&bytes).map_err(json_err)?, version)))
    }

    /// Reads the object at `key` (a default one if there is none), lets `f` change it,
    /// and writes it back, if `f` says so, only if nobody wrote it in between; else reads
    /// again and starts over. Returns what `f` returned the last time.
    async fn cas<T, R>(&self, key: &ObjPath, mut f: impl FnMut(&mut T) -> (bool, R)) -> Result<R, StoreError>
    where
        T: Serialize + DeserializeOwned + Default,
    {
        for attempt in 0..CAS_ATTEMPTS {
            let (mut current, mode) = match self.read_json::<Versioned<T>>(key).await? {
                Some((v, version)) => (v, PutMode::Update(version)),
                None => (Versioned::default(), PutMode::Create),
            };
            let (write, out) = f(&mut current.value);
            if !write {
                return Ok(out);
            }
            current.rev += 1;
            let body = serde_json::to_vec(&current).map_err(json_err)?;
            match self
                .store
                .put_opts(key, PutPayload::from(body), PutOptions::from(mode))
                .await
            {
                Ok(_) => return Ok(out),
                Err(object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. }) => {
                    // Another writer won: a short, growing, jittered wait, then again.
                    let ms = u64::from(attempt.min(8)) * 5 + rand::random::<u64>() % 10;
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                Err(e) => return Err(os_err(e)),
            }
        }
        Err(StoreError::S3Contended(key.to_string()))
    }

    /// Takes the files out of their principal's ledger; returns how many were there.
    async fn unledger(&self, principal: &str, entries: Vec<String>) -> Result<usize, StoreError> {
        self.cas::<Ledger, usize>(&self.ledger_key(principal), |l| {
            let n = entries.iter().filter(|e| l.files.remove(*e).is_some()).count();
            (n > 0, n)
        })
        .await
    }

    /// Takes those of the files that are still due at `now_ms` out of their principal's
    /// ledger; returns them.
    async fn unledger_due(
        &self,
        principal: &str,
        entries: Vec<String>,
        now_ms: u64,
    ) -> Result<Vec<String>, StoreError> {
        self.cas::<Ledger, Vec<String>>(&self.ledger_key(principal), |l| {
            let due: Vec<String> = entries
                .iter()
                .filter(|e| l.files.get(*e).is_some_and(|(_, expires)| *expires <= now_ms))
                .cloned()
                .collect();
            for e in &due {
                l.files.remove(e);
            }
            (!due.is_empty(), due)
        })
        .await
    }

    /// Removes a file's bytes, record and cached copy (each may be gone already).
    async fn remove_objects(&self, principal: &str, session_id: &str, id: &str) -> Result<(), StoreError> {
        for key in [
            self.meta_key(principal, session_id, id),
            self.object_key(session_id, id),
        ] {
            match self.store.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(os_err(e)),
            }
        }
        let path = self.cache_path(session_id, id);
        let _ = tokio::fs::remove_file(&path).await;
        if let Some(dir) = path.parent() {
            let _ = tokio::fs::remove_dir(dir).await; // only once empty
        }
        Ok(())
    }

    async fn upload(&self, from: &Path, to: &ObjPath) -> Result<(), StoreError> {
        let mut file = tokio::fs::File::open(from).await?;
        // Parts of 5 MiB (S3's smallest), two on their way at once: an upload holds at
        // most ~15 MiB of the server's memory, whatever the file's size.
        let mut writer = object_store::buffered::BufWriter::with_capacity(self.store.clone(), to.clone(), UPLOAD_PART)
            .with_max_concurrency(2);
        let copied = async {
            tokio::io::copy(&mut file, &mut writer).await?;
            writer.shutdown().await
        }
        .await;
        if let Err(e) = copied {
            let _ = writer.abort().await;
            return Err(if unreachable(&e) {
                StoreError::Unavailable(format!("s3: uploading: {e}"))
            } else {
                StoreError::S3Upload(e)
            });
        }
        Ok(())
    }

    /// Keeps `temp` (a file's bytes, already uploaded) as its cached copy.
    async fn keep_in_cache(&self, temp: &Path, session_id: &str, id: &str) {
        let path = self.cache_path(session_id, id);
        let kept = match path.parent() {
            Some(dir) => match tokio::fs::create_dir_all(dir).await {
                Ok(()) => tokio::fs::rename(temp, &path).await.is_ok(),
                Err(_) => false,
            },
            None => false,
        };
        if !kept {
            let _ = tokio::fs::remove_file(temp).await;
        }
        self.evict_soon();
    }

    /// Brings the cache back under its bound, in the background, one pass at a time.
    fn evict_soon(&self) {
        if self.evicting.swap(true, Ordering::SeqCst) {
            return;
        }
        let (cache, bound, flag) = (self.root.join("cache"), self.cache_bytes, self.evicting.clone());
        tokio::task::spawn_blocking(move || {
            evict(&cache, bound);
            flag.store(false, Ordering::SeqCst);
        });
    }
}

/// Removes the cached copies least recently used until the cache holds at most `bound`
/// bytes, sparing those used within `CACHE_GRACE`; and stale partial downloads.
fn evict(cache: &Path, bound: u64) {
    let mut files: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
    for dir in std::fs::read_dir(cache).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(dir.path()).into_iter().flatten().flatten() {
            if let Ok(m) = f.metadata() {
                files.push((m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len(), f.path()));
            }
        }
        if dir.file_name().to_string_lossy().starts_with(".partial-") {
            let old = dir
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().unwrap_or_default() > CACHE_GRACE);
            if old {
                let _ = std::fs::remove_file(dir.path());
            }
        }
    }
    let mut total: u64 = files.iter().map(|(_, size, _)| size).sum();
    files.sort();
    for (used, size, path) in files {
        if total <= bound {
            break;
        }
        if used.elapsed().unwrap_or_default() < CACHE_GRACE {
            break; // sorted: every later one is more recent still
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= size;
            if let Some(dir) = path.parent() {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

#[async_trait]
impl FileStore for S3Store {
    fn incoming_dir(&self) -> PathBuf {
        self.root.join("incoming")
    }

    async fn insert(&self, meta: FileMeta, temp: &Path, quota: Quota) -> Result<(), StoreError> {
        let entry = format!("{}/{}", meta.session_id, meta.id);
        let (size, expires) = (meta.size, meta.expires_ms);
        // The quota is checked and the file counted in one conditional put of the ledger.
        self.cas::<Ledger, Result<(), QuotaExceeded>>(&self.ledger_key(&meta.principal), |l| {
            if l.files.contains_key(&entry) {
                return (false, Ok(()));
            }
            if let Err(q) = l.usage().check(quota, size, 1) {
                return (false, Err(q));
            }
            l.files.insert(entry.clone(), (size, expires));
            (true, Ok(()))
        })
        .await??;
        let stored = async {
            self.upload(temp, &self.object_key(&meta.session_id, &meta.id)).await?;
            let record = serde_json::to_vec(&meta).map_err(json_err)?;
            self.store
                .put(
                    &self.meta_key(&meta.principal, &meta.session_id, &meta.id),
                    PutPayload::from(record),
                )
                .await
                .map_err(os_err)?;
            Ok::<(), StoreError>(())
        }
        .await;
        if let Err(e) = stored {
            // Nothing is stored: the bytes and the ledger's entry go again (a failure
            // here leaves the entry until its expiry time, when the sweep drops it).
            let _ = self.remove_objects(&meta.principal, &meta.session_id, &meta.id).await;
            let _ = self.unledger(&meta.principal, vec![entry]).await;
            return Err(e);
        }
        self.keep_in_cache(temp, &meta.session_id, &meta.id).await;
        Ok(())
    }

    async fn usage(&self, principal: &str) -> Result<Usage, StoreError> {
        Ok(self
            .read_json::<Versioned<Ledger>>(&self.ledger_key(principal))
            .await?
            .map_or_else(Usage::default, |(l, _)| l.value.usage()))
    }

    async fn get(&self, principal: &str, session_id: &str, id: &str) -> Result<Option<FileMeta>, StoreError> {
        let now = crate::now_ms();
        let meta = self
            .read_json::<FileMeta>(&self.meta_key(principal, session_id, id))
            .await?;
        Ok(meta
            .map(|(m, _)| m)
            .filter(|m| m.expires_ms > now && m.principal == principal))
    }

    async fn open(&self, meta: &FileMeta) -> Result<Box<dyn AsyncRead + Send + Unpin>, StoreError> {
        if let Ok(file) = tokio::fs::File::open(self.cache_path(&meta.session_id, &meta.id)).await {
            return Ok(Box::new(file));
        }
        let got = self
            .store
            .get(&self.object_key(&meta.session_id, &meta.id))
            .await
            .map_err(os_err)?;
        let stream = got.into_stream().map_err(std::io::Error::other);
        Ok(Box::new(tokio_util::io::StreamReader::new(stream)))
    }

    async fn local_path(&self, meta: &FileMeta) -> Result<PathBuf, StoreError> {
        let path = self.cache_path(&meta.session_id, &meta.id);
        if let Ok(file) = std::fs::File::open(&path) {
            if file.metadata().is_ok_and(|m| m.len() == meta.size) {
                // Used now: the eviction spares it for a while.
                let _ = file.set_modified(SystemTime::now());
                return Ok(path);
            }
        }
        let partial = self
            .root
            .join("cache")
            .join(format!(".partial-{}", sandcall_api::ids::new_id()));
        let fetched = async {
            let got = self
                .store
                .get(&self.object_key(&meta.session_id, &meta.id))
                .await
                .map_err(os_err)?;
            let mut stream = got.into_stream();
            let mut out = tokio::fs::File::create(&partial).await?;
            let mut size = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(os_err)?;
                size += chunk.len() as u64;
                out.write_all(&chunk).await?;
            }
            out.flush().await?;
            if size != meta.size {
                return Err(StoreError::S3SizeMismatch {
                    object: format!("{}/{}", meta.session_id, meta.id),
                    size,
                    recorded: meta.size,
                });
            }
            if let Some(dir) = path.parent() {
                tokio::fs::create_dir_all(dir).await?;
            }
            tokio::fs::rename(&partial, &path).await?;
            Ok::<(), StoreError>(())
        }
        .await;
        if let Err(e) = fetched {
            let _ = tokio::fs::remove_file(&partial).await;
            return Err(e);
        }
        self.evict_soon();
        Ok(path)
    }

    async fn list(&self, principal: &str, session_id: &str) -> Result<Vec<FileMeta>, StoreError> {
        let prefix = self.key(&format!("meta/{}/{session_id}", b64(principal)));
        let keys: Vec<ObjPath> = self
            .store
            .list(Some(&prefix))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(os_err)?;
        let now = crate::now_ms();
        let found: Vec<Option<(FileMeta, UpdateVersion)>> = futures::stream::iter(keys)
            .map(|k| async move { self.read_json::<FileMeta>(&k).await })
            .buffer_unordered(16)
            .try_collect()
            .await?;
        let mut out: Vec<FileMeta> = found
            .into_iter()
            .flatten()
            .map(|(m, _)| m)
            .filter(|m| m.expires_ms > now && m.principal == principal && m.session_id == session_id)
            .collect();
        out.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.name.cmp(&b.name)));
        Ok(out)
    }

    async fn delete(&self, principal: &str, session_id: &str, id: &str) -> Result<bool, StoreError> {
        if self
            .read_json::<FileMeta>(&self.meta_key(principal, session_id, id))
            .await?
            .is_none()
        {
            return Ok(false);
        }
        self.remove_objects(principal, session_id, id).await?;
        // The ledger's put is conditional: of two nodes deleting one file, one frees it.
        self.unledger(principal, vec![format!("{session_id}/{id}")]).await?;
        Ok(true)
    }

    async fn sweep(&self, now_ms: u64) -> Result<usize, StoreError> {
        let ledgers: Vec<ObjPath> = self
            .store
            .list(Some(&self.key("ledger")))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(os_err)?;
        let mut n = 0;
        for key in ledgers {
            let Some(principal) = key
                .filename()
                .and_then(|f| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(f).ok())
                .and_then(|p| String::from_utf8(p).ok())
            else {
                continue;
            };
            let Some((ledger, _)) = self.read_json::<Versioned<Ledger>>(&key).await? else {
                continue;
            };
            let due: Vec<String> = ledger
                .value
                .files
                .iter()
                .filter(|(_, (_, expires))| *expires <= now_ms)
                .map(|(entry, _)| entry.clone())
                .collect();
            if due.is_empty() {
                continue;
            }
            // Each node that sweeps at once removes the same objects (deleting twice is
            // harmless); then one conditional put takes the entries that are still due
            // out of the ledger, so each file is counted once. A renewal moves only
            // entries not yet due (by its own, later clock), so it does not meet the
            // sweep on one file, unless nodes' clocks disagree at that very moment: then
            // the renewed entry outlives its objects until its new time, when it goes.
            for entry in &due {
                if let Some((session_id, id)) = entry.split_once('/') {
                    self.remove_objects(&principal, session_id, id).await?;
                }
            }
            n += self.unledger_due(&principal, due, now_ms).await?.len();
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
        // The ledger first, in one conditional put, then the records of the files it
        // renewed: an entry already due is the sweep's, and left to it.
        let renewed: Vec<(String, String)> = self
            .cas::<Ledger, Vec<(String, String)>>(&self.ledger_key(principal), |l| {
                let mut renewed = Vec::new();
                for (session_id, id) in files {
                    if let Some((_, expires)) = l.files.get_mut(&format!("{session_id}/{id}")) {
                        if *expires > now_ms && *expires < expires_ms {
                            *expires = expires_ms;
                            renewed.push((session_id.clone(), id.clone()));
                        }
                    }
                }
                (!renewed.is_empty(), renewed)
            })
            .await?;
        for (session_id, id) in renewed {
            let key = self.meta_key(principal, &session_id, &id);
            if let Some((mut meta, _)) = self.read_json::<FileMeta>(&key).await? {
                meta.expires_ms = expires_ms;
                let record = serde_json::to_vec(&meta).map_err(json_err)?;
                self.store.put(&key, PutPayload::from(record)).await.map_err(os_err)?;
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
        self.cas::<Workspace, _>(&self.workspace_key(principal, name), |ws| {
            let taken = ws.take(holder, now_ms, until_ms);
            (taken, taken.then(|| ws.files.clone()))
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
        self.cas::<Workspace, _>(&self.workspace_key(principal, name), |ws| {
            (ws.release(holder, files.clone()), ())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_loopback_endpoints() {
        assert_eq!(parse_url("s3://b/p/q/"), Some(("b".into(), "p/q".into())));
        assert_eq!(parse_url("s3://b"), Some(("b".into(), String::new())));
        assert_eq!(parse_url("s3:///p"), None);
        assert_eq!(parse_url("embedded"), None);
        assert!(loopback_http("http://127.0.0.1:9000"));
        assert!(loopback_http("http://localhost:9000/"));
        assert!(loopback_http("http://[::1]:9000"));
        assert!(!loopback_http("http://10.0.0.1:9000"));
        assert!(!loopback_http("https://127.0.0.1:9000"));
    }

    #[test]
    fn the_cache_keeps_to_its_bound_but_spares_recent_copies() {
        let cache = std::env::temp_dir().join(format!("sandcall-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&cache);
        let old = SystemTime::now() - Duration::from_secs(3600);
        let put = |session: &str, id: &str, age: Option<SystemTime>| {
            std::fs::create_dir_all(cache.join(session)).unwrap();
            let path = cache.join(session).join(id);
            std::fs::write(&path, [0u8; 1000]).unwrap();
            if let Some(t) = age {
                std::fs::File::options()
                    .write(true)
                    .open(&path)
                    .unwrap()
                    .set_modified(t)
                    .unwrap();
            }
            path
        };
        // Oldest first: a (2 h), b (1 h); c and d were used just now.
        let a = put("s1", "a", Some(old - Duration::from_secs(3600)));
        let b = put("s1", "b", Some(old));
        let c = put("s2", "c", None);
        let d = put("s2", "d", None);
        let partial = cache.join(".partial-x");
        std::fs::write(&partial, b"half").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&partial)
            .unwrap()
            .set_modified(old)
            .unwrap();
        evict(&cache, 3000);
        assert!(
            !a.exists() && b.exists(),
            "the oldest goes first, until under the bound"
        );
        assert!(!partial.exists(), "a stale partial download goes");
        evict(&cache, 0);
        assert!(!b.exists() && !cache.join("s1").exists(), "an emptied folder goes too");
        assert!(c.exists() && d.exists(), "copies used within CACHE_GRACE stay");
        std::fs::remove_dir_all(&cache).unwrap();
    }
}
