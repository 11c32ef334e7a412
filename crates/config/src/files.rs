//! Files: their sizes and lifetimes, each principal's quota, where they are kept, and workspaces.

use serde::{Deserialize, Serialize};

/// FilesConfig: the keys of docs/configuration.md this section holds. Each field's doc comment
/// gives its unit and default.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct FilesConfig {
    /// Largest uploaded or output file, in bytes. Default 26214400 (25 MiB).
    pub max_file_bytes: u64,
    /// Output files collected from one run. Default 100.
    pub max_output_files: usize,
    /// Files (uploads and outputs) are deleted this many seconds after they were
    /// stored. Default 86400 (24 h).
    pub file_ttl_s: u64,
    /// How often expired files are swept, in seconds. Default 60.
    pub file_sweep_interval_s: u64,
    /// Bytes of files (uploads and outputs) one principal may have stored at once;
    /// past it an upload gets 507 `quota_exceeded` and an output file is skipped.
    /// Default 2147483648 (2 GiB).
    pub max_stored_bytes_per_principal: u64,
    /// Files one principal may have stored at once. Default 10000.
    pub max_stored_files_per_principal: u64,
    /// Where stored files live: `embedded` (the data dir; the default, also when unset)
    /// or `s3://bucket/prefix`, an S3-compatible object store that every node of a
    /// cluster shares (credentials and region from the standard `AWS_*` variables).
    pub file_store: Option<String>,
    /// The S3 endpoint's URL, for S3-compatible servers (`http://127.0.0.1:9000`); plain
    /// http is allowed only for a loopback host. Default: AWS's own endpoint.
    pub s3_endpoint: Option<String>,
    /// With an S3 file store: the local cache of stored files (inputs are staged from
    /// it), in MiB; files older than a few minutes are evicted past it. Default 1024.
    pub file_cache_mb: u64,
    /// With an S3 file store: how long a request to S3 may take, in ms, and how long
    /// after its first try a failed one is still retried; S3 out of reach is answered
    /// `503 store_unavailable` within about twice this. Default 30000.
    pub s3_timeout_ms: u64,
    /// Workspaces: a `/v1/exec` request with `runtime_session_hint` or `workspace_id`
    /// starts in the working directory its principal's previous run with the same one
    /// left. Default false (the hint is then ignored, `workspace_id` refused).
    pub workspaces: bool,
    /// LibreChat's execution profile: `default` (each run starts from its input files
    /// alone) or `stateful` (runs of one conversation share their files: workspaces,
    /// which this turns on). A request whose `X-CodeAPI-Expected-Profile` names the
    /// other is answered 409. Default `default`.
    pub execution_profile: ExecutionProfile,
}

/// LibreChat's name for what a server keeps between runs (`execution_profile`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionProfile {
    #[default]
    Default,
    Stateful,
}

impl ExecutionProfile {
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionProfile::Default => "default",
            ExecutionProfile::Stateful => "stateful",
        }
    }

    /// The profile a header names; `None` for any other value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "default" => Some(ExecutionProfile::Default),
            "stateful" => Some(ExecutionProfile::Stateful),
            _ => None,
        }
    }
}

impl Default for FilesConfig {
    fn default() -> Self {
        FilesConfig {
            max_file_bytes: 26_214_400,
            max_output_files: 100,
            file_ttl_s: 86_400,
            file_sweep_interval_s: 60,
            max_stored_bytes_per_principal: 2 << 30,
            max_stored_files_per_principal: 10_000,
            file_store: None,
            s3_endpoint: None,
            file_cache_mb: 1024,
            s3_timeout_ms: 30_000,
            workspaces: false,
            execution_profile: ExecutionProfile::Default,
        }
    }
}

/// A file setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilesError {
    #[error("{0} must be above 0")]
    Zero(&'static str),
    #[error("max_file_bytes, max_output_files, file_ttl_s and file_sweep_interval_s must be above 0")]
    ZeroFileLimit,
}

impl FilesConfig {
    pub fn validate(&self) -> Result<(), FilesError> {
        for (name, value) in [
            ("max_stored_bytes_per_principal", self.max_stored_bytes_per_principal),
            ("max_stored_files_per_principal", self.max_stored_files_per_principal),
            ("file_cache_mb", self.file_cache_mb),
            ("s3_timeout_ms", self.s3_timeout_ms),
        ] {
            if value == 0 {
                return Err(FilesError::Zero(name));
            }
        }
        if self.max_file_bytes == 0
            || self.max_output_files == 0
            || self.file_ttl_s == 0
            || self.file_sweep_interval_s == 0
        {
            return Err(FilesError::ZeroFileLimit);
        }
        Ok(())
    }
}
