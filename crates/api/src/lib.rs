//! The wire types of sandcall's HTTP API, and its stable error codes.
//!
//! Only this crate decides field names and shapes; it has no I/O and no async. The
//! contract these types follow is the project's API reference (docs/api.md).

use serde::{Deserialize, Serialize};

/// Every error response on every route: `{"error": ..., "error_type": ...}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorBody {
    pub error: String,
    pub error_type: String,
}

/// Stable, snake_case error codes clients can match on.
pub mod error_type {
    pub const INVALID_JSON: &str = "invalid_json";
    pub const INVALID_REQUEST: &str = "invalid_request";
    pub const UNSUPPORTED_MEDIA_TYPE: &str = "unsupported_media_type";
    pub const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
    pub const UNSUPPORTED_LANGUAGE: &str = "unsupported_language";
    pub const AT_CAPACITY: &str = "at_capacity";
    pub const SHUTTING_DOWN: &str = "shutting_down";
    pub const SANDBOX_FAILURE: &str = "sandbox_failure";
    pub const NOT_FOUND: &str = "not_found";
    pub const METHOD_NOT_ALLOWED: &str = "method_not_allowed";
    pub const INTERNAL: &str = "internal";
}

/// A reference to an uploaded file, to stage into the working directory.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct FileRef {
    pub id: String,
    #[serde(alias = "session_id")]
    pub storage_session_id: Option<String>,
    pub name: String,
}

/// Per-request limits (an extension): each may only lower the server's ceiling.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RequestLimits {
    pub memory_limit_mb: Option<u64>,
    pub max_processes: Option<u64>,
    pub max_open_files: Option<u64>,
    pub max_output_bytes: Option<u64>,
    pub cpu_time_limit_ms: Option<u64>,
    pub workspace_limit_mb: Option<u64>,
    pub file_size_limit_mb: Option<u64>,
}

/// POST /v1/exec. Unknown fields are ignored.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct ExecRequest {
    pub code: Option<String>,
    pub language: Option<String>,
    pub lang: Option<String>,
    pub args: Option<Vec<String>>,
    pub stdin: Option<String>,
    pub files: Option<Vec<FileRef>>,
    pub run_timeout: Option<u64>,
    pub timeout: Option<u64>,
    pub limits: Option<RequestLimits>,
}

/// How a run ended, as `status` says it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExecStatus {
    Ok,
    Failed,
    TimedOut,
    Killed,
}

/// An output file of a run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OutputFile {
    pub id: String,
    pub name: String,
    pub storage_session_id: String,
    pub size: u64,
}

/// The 200 answer of POST /v1/exec, for every run that started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExecResponse {
    pub session_id: String,
    pub status: ExecStatus,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub exit_code: Option<i32>,
    /// Alias of `exit_code`.
    pub code: Option<i32>,
    pub signal: Option<String>,
    pub timed_out: bool,
    pub oom_killed: bool,
    pub files: Vec<OutputFile>,
    pub execution_time: u64,
    /// Alias of `execution_time`.
    pub wall_time: u64,
    pub cpu_time: u64,
    pub memory_peak: u64,
}

/// GET /v1/health: 200 with status `ok`, or 503 with status `unavailable` and the reason.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Health {
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
    pub version: String,
    pub cgroup: String,
    pub active_runs: usize,
    pub max_concurrent_runs: usize,
}

/// The languages sandcall runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    Python,
    Bash,
}

impl Language {
    /// Parses a language name or alias: `python`, `py`, `python3`, `bash`, `sh`.
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "python" | "py" | "python3" => Some(Language::Python),
            "bash" | "sh" => Some(Language::Bash),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn language_aliases() {
        assert_eq!(Language::parse("py"), Some(Language::Python));
        assert_eq!(Language::parse("Python3"), Some(Language::Python));
        assert_eq!(Language::parse("sh"), Some(Language::Bash));
        assert_eq!(Language::parse("ruby"), None);
    }

    #[test]
    fn file_ref_accepts_session_id() {
        let f: FileRef = serde_json::from_str(r#"{"id":"a","session_id":"b","name":"x.csv","kind":"user"}"#).unwrap();
        assert_eq!(f.storage_session_id.as_deref(), Some("b"));
    }

    #[test]
    fn status_is_snake_case() {
        assert_eq!(serde_json::to_string(&ExecStatus::TimedOut).unwrap(), "\"timed_out\"");
    }
}
