//! Files: what callers upload and what runs produce, kept per principal and session.
//!
//! `FileStore` is the seam between the routes and where bytes live. The embedded
//! default (`local::LocalStore`) keeps bytes under the data dir and metadata in redb;
//! an object store would implement the same trait (its `local_path` downloading to a
//! temporary file for staging into a sandbox).
//!
//! Every principal has a quota of stored bytes and files (`Quota`). The store, not the
//! routes, enforces it: `insert` checks and records the principal's usage in one step,
//! so concurrent inserts cannot pass it together, and answers `StoreError::Quota`.

pub mod local;
pub mod ops;
pub mod routes;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tokio::io::AsyncRead;

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
    pub fn of(config: &crate::config::Config) -> Quota {
        Quota {
            max_bytes: config.max_stored_bytes_per_principal,
            max_files: config.max_stored_files_per_principal,
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
    #[error("storage: {0}")]
    Io(String),
}

impl From<std::io::Error> for StoreError {
    fn from(e: std::io::Error) -> Self {
        if e.raw_os_error() == Some(libc_enospc()) {
            StoreError::Full
        } else {
            StoreError::Io(e.to_string())
        }
    }
}

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
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)).to_string()
}

pub fn guess_type(name: &str) -> String {
    mime_guess::from_path(name)
        .first_or_octet_stream()
        .essence_str()
        .to_owned()
}

/// A name a file may be staged under: a relative path of normal components, no `..`,
/// no control characters. Returns why not.
pub fn check_input_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 1024 {
        return Err("a file name must be 1 to 1024 bytes".into());
    }
    if name.starts_with('/') {
        return Err(format!("file name {name:?} must be relative to the working directory"));
    }
    if name.chars().any(char::is_control) {
        return Err(format!("file name {name:?} contains control characters"));
    }
    for part in name.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(format!("file name {name:?} must not contain empty, `.` or `..` parts"));
        }
        if part.len() > 255 {
            return Err(format!("file name {name:?} has a part longer than 255 bytes"));
        }
    }
    Ok(())
}

/// An uploaded file's name: a relative path (`skill/scripts/run.py`) that keeps its
/// folders, with `\\` read as `/`; it must pass `check_input_name`.
pub fn upload_name(raw: &str) -> Result<String, String> {
    let name = raw.trim().replace('\\', "/");
    check_input_name(&name).map(|()| name)
}

/// The object name of a stored file, as the list route's `simple`, `summary` and `full`
/// levels give it: `{session_id}/{file_id}` plus the extension of its name, if any.
pub fn object_name(meta: &FileMeta) -> String {
    let base = meta.name.rsplit('/').next().unwrap_or("");
    match base.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() && !ext.is_empty() => {
            format!("{}/{}.{ext}", meta.session_id, meta.id)
        }
        _ => format!("{}/{}", meta.session_id, meta.id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_names_stay_inside_the_workspace() {
        for ok in ["a.csv", "data/x.csv", "a..b", "...", "über.txt"] {
            assert!(check_input_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "a/./b",
            "line\nbreak",
            "tab\there",
            "a/",
        ] {
            assert!(check_input_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn upload_names_keep_their_folders_and_stay_relative() {
        assert_eq!(upload_name("skill/scripts/run.py").unwrap(), "skill/scripts/run.py");
        assert_eq!(upload_name("docs\\a.txt").unwrap(), "docs/a.txt");
        assert_eq!(upload_name(" report.pdf ").unwrap(), "report.pdf");
        for bad in [
            "..",
            "../../etc/passwd",
            "/etc/passwd",
            "dir/",
            "a//b",
            "a/./b",
            "\\\\x",
            "",
        ] {
            assert!(upload_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn records_from_before_the_upload_fields_still_read() {
        let old = r#"{"principal":"p","session_id":"S","id":"F","name":"a.txt","size":1,
            "content_type":"text/plain","sha256":"00","created_ms":1,"expires_ms":2}"#;
        let m: FileMeta = serde_json::from_str(old).unwrap();
        assert_eq!((m.kind, m.entity_id, m.version, m.read_only), (None, None, None, false));
        // And a record with them round-trips.
        let new = FileMeta {
            kind: Some("skill".into()),
            entity_id: Some("e".into()),
            version: Some("2".into()),
            read_only: true,
            ..serde_json::from_str(old).unwrap()
        };
        let back: FileMeta = serde_json::from_slice(&serde_json::to_vec(&new).unwrap()).unwrap();
        assert_eq!(back, new);
    }

    #[test]
    fn object_names_keep_the_extension_only() {
        let mut m = FileMeta {
            principal: "p".into(),
            session_id: "S".into(),
            id: "F".into(),
            name: "skill/scripts/run.py".into(),
            size: 0,
            content_type: String::new(),
            sha256: String::new(),
            created_ms: 0,
            expires_ms: 0,
            kind: None,
            entity_id: None,
            version: None,
            read_only: false,
        };
        assert_eq!(object_name(&m), "S/F.py");
        for (name, want) in [
            ("Makefile", "S/F"),
            (".bashrc", "S/F"),
            ("a.tar.gz", "S/F.gz"),
            ("v1.0/x", "S/F"),
        ] {
            m.name = name.into();
            assert_eq!(object_name(&m), want, "{name}");
        }
    }
}
