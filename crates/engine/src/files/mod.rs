//! Files: what callers upload and what runs produce, kept per principal and session.
//!
//! The operations on files (the routes are the server's); where bytes live is the store's
//! (`sandcall_store`: the `FileStore` trait and its backends).

pub mod ops;
pub mod workspace;

pub use sandcall_store::{now_ms, FileMeta, FileStore, Quota, QuotaExceeded, StoreError, Usage};

pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)).to_string()
}

pub fn guess_type(name: &str) -> String {
    mime_guess::from_path(name)
        .first_or_octet_stream()
        .essence_str()
        .to_owned()
}

/// Why a name is not one a file may be staged under. Each carries the name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileNameError {
    #[error("a file name must be 1 to 1024 bytes")]
    Length,
    #[error("file name {0:?} must be relative to the working directory")]
    Absolute(String),
    #[error("file name {0:?} contains control characters")]
    ControlCharacters(String),
    #[error("file name {0:?} must not contain empty, `.` or `..` parts")]
    BadPart(String),
    #[error("file name {0:?} has a part longer than 255 bytes")]
    LongPart(String),
}

/// A name a file may be staged under: a relative path of normal components, no `..`,
/// no control characters. Returns why not.
pub fn check_input_name(name: &str) -> Result<(), FileNameError> {
    if name.is_empty() || name.len() > 1024 {
        return Err(FileNameError::Length);
    }
    if name.starts_with('/') {
        return Err(FileNameError::Absolute(name.to_owned()));
    }
    if name.chars().any(char::is_control) {
        return Err(FileNameError::ControlCharacters(name.to_owned()));
    }
    for part in name.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(FileNameError::BadPart(name.to_owned()));
        }
        if part.len() > 255 {
            return Err(FileNameError::LongPart(name.to_owned()));
        }
    }
    Ok(())
}

/// An uploaded file's name: a relative path (`skill/scripts/run.py`) that keeps its
/// folders, with `\\` read as `/`; it must pass `check_input_name`.
pub fn upload_name(raw: &str) -> Result<String, FileNameError> {
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
