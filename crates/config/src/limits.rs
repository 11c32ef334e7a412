//! What one run may use and how many run at once: the limits of each run and their ceilings, the queue, and each principal's share and request rates.

use crate::rate::{BadRate, Group, Rate};
use crate::Ceilings;
use serde::{Deserialize, Serialize};

/// LimitsConfig: the keys of docs/configuration.md this section holds. Each field's doc comment
/// gives its unit and default.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct LimitsConfig {
    /// Runs executing at once. Default: number of cores × 4.
    pub max_concurrent_runs: usize,
    /// Runs waiting for a slot; beyond this a request gets 503 `at_capacity`.
    /// Default: `max_concurrent_runs` × 4.
    pub max_queued_runs: Option<usize>,
    /// Longest wait for a slot, in ms, before 503 `at_capacity`. Default 10000.
    pub queue_timeout_ms: u64,
    /// Wall-clock budget of a run when the request names none, in ms. Default:
    /// `max_run_timeout_ms`.
    pub run_timeout_ms: Option<u64>,
    /// Most wall-clock time a request may ask for, in ms. Default 300000.
    pub max_run_timeout_ms: u64,
    /// Largest `code`, in bytes. Default 1048576 (1 MiB).
    pub max_code_bytes: u64,
    /// Largest `stdin`, in bytes. Default 1048576 (1 MiB).
    pub max_stdin_bytes: u64,
    /// Bytes kept of stdout and of stderr, each. Default 65536.
    pub max_output_bytes: u64,
    /// Memory of a run, tmpfs contents included, in MiB; no swap. Default 512.
    pub memory_limit_mb: u64,
    /// Processes and threads of a run. Default 128.
    pub max_processes: u64,
    /// Open files per process. Default 1024.
    pub max_open_files: u64,
    /// Largest file a process may write, in MiB. Default 256.
    pub file_size_limit_mb: u64,
    /// Size of the working directory `/mnt/data`, in MiB. Default 256.
    pub workspace_limit_mb: u64,
    /// Size of `/tmp` and of `/dev/shm`, each, in MiB. Default 128.
    pub tmp_limit_mb: u64,
    /// CPU time of a run, all processes together, in ms. Default 300000.
    pub cpu_time_limit_ms: u64,
    /// CPU share of a run (1.0 = one core). Default 1.0.
    pub cpus: f64,
    /// The most a request's `limits` may ask for; each defaults to the value above.
    pub ceilings: Ceilings,
    /// Runs (`/v1/exec` and running programmatic sessions) one principal may have
    /// running or queued at once; past it a request gets 429 `principal_at_capacity`.
    /// Default: `max_concurrent_runs` / 2 (at least 1) with credentials; no cap of its
    /// own in local mode.
    pub max_runs_per_principal: Option<usize>,
    /// Requests one principal may make to start programs (`POST /v1/exec`, programmatic
    /// starts), as `N/s`, `N/min` or `N/h`: a burst of N, then one more every period /
    /// N; past it 429 `rate_limited`. Default: none (not limited).
    pub rate_limit_exec: Option<String>,
    /// The same for driving sessions (resumes, `GET` of a session, cancels). Default:
    /// none.
    pub rate_limit_sessions: Option<String>,
    /// The same for the file routes (uploads, downloads, lists, deletes). Default: none.
    pub rate_limit_files: Option<String>,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_concurrent_runs: cores() * 4,
            max_queued_runs: None,
            queue_timeout_ms: 10_000,
            run_timeout_ms: None,
            max_run_timeout_ms: 300_000,
            max_code_bytes: 1 << 20,
            max_stdin_bytes: 1 << 20,
            max_output_bytes: 65_536,
            memory_limit_mb: 512,
            max_processes: 128,
            max_open_files: 1024,
            file_size_limit_mb: 256,
            workspace_limit_mb: 256,
            tmp_limit_mb: 128,
            cpu_time_limit_ms: 300_000,
            cpus: 1.0,
            ceilings: Ceilings::default(),
            max_runs_per_principal: None,
            rate_limit_exec: None,
            rate_limit_sessions: None,
            rate_limit_files: None,
        }
    }
}

/// A limit that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    #[error("{0} must be above 0")]
    Zero(&'static str),
    #[error("max_concurrent_runs must be at least 1")]
    NoRuns,
    #[error("max_run_timeout_ms must be above 0")]
    NoRunTime,
    #[error("run_timeout_ms must be between 1 and max_run_timeout_ms")]
    RunTimeout,
    #[error("cpus must be above 0 and at most 1024")]
    Cpus,
    #[error("ceilings.{0} is below the default {0}")]
    CeilingBelowDefault(&'static str),
    #[error("{key}: {source}")]
    Rate { key: &'static str, source: BadRate },
}

impl LimitsConfig {
    pub fn validate(&self) -> Result<(), LimitsError> {
        if self.max_concurrent_runs == 0 {
            return Err(LimitsError::NoRuns);
        }
        if self.max_run_timeout_ms == 0 {
            return Err(LimitsError::NoRunTime);
        }
        if self
            .run_timeout_ms
            .is_some_and(|t| t == 0 || t > self.max_run_timeout_ms)
        {
            return Err(LimitsError::RunTimeout);
        }
        if !(self.cpus > 0.0 && self.cpus <= 1024.0) {
            return Err(LimitsError::Cpus);
        }
        for (name, value) in [
            ("memory_limit_mb", self.memory_limit_mb),
            ("max_processes", self.max_processes),
            ("max_open_files", self.max_open_files),
            ("max_output_bytes", self.max_output_bytes),
            ("cpu_time_limit_ms", self.cpu_time_limit_ms),
            ("workspace_limit_mb", self.workspace_limit_mb),
            ("file_size_limit_mb", self.file_size_limit_mb),
            ("tmp_limit_mb", self.tmp_limit_mb),
            ("max_code_bytes", self.max_code_bytes),
            (
                "max_runs_per_principal",
                self.max_runs_per_principal.unwrap_or(1) as u64,
            ),
        ] {
            if value == 0 {
                return Err(LimitsError::Zero(name));
            }
        }
        let c = &self.ceilings;
        for (name, default, ceiling) in [
            ("memory_limit_mb", self.memory_limit_mb, c.memory_limit_mb),
            ("max_processes", self.max_processes, c.max_processes),
            ("max_open_files", self.max_open_files, c.max_open_files),
            ("max_output_bytes", self.max_output_bytes, c.max_output_bytes),
            ("cpu_time_limit_ms", self.cpu_time_limit_ms, c.cpu_time_limit_ms),
            ("workspace_limit_mb", self.workspace_limit_mb, c.workspace_limit_mb),
            ("file_size_limit_mb", self.file_size_limit_mb, c.file_size_limit_mb),
        ] {
            if ceiling.is_some_and(|c| c < default) {
                return Err(LimitsError::CeilingBelowDefault(name));
            }
        }
        for group in Group::ALL {
            if let Some(Err(source)) = self.rate_limit_text(group).map(str::parse::<Rate>) {
                return Err(LimitsError::Rate {
                    key: group.config_key(),
                    source,
                });
            }
        }
        Ok(())
    }

    /// The default wall-clock budget of a run, in ms.
    pub fn default_run_timeout_ms(&self) -> u64 {
        self.run_timeout_ms.unwrap_or(self.max_run_timeout_ms)
    }

    /// How many runs may wait for a slot.
    pub fn queue_length(&self) -> usize {
        self.max_queued_runs.unwrap_or(self.max_concurrent_runs * 4)
    }

    /// The rate of a group of routes, as written (`rate_limit_*`).
    fn rate_limit_text(&self, group: Group) -> Option<&str> {
        match group {
            Group::Exec => self.rate_limit_exec.as_deref(),
            Group::Sessions => self.rate_limit_sessions.as_deref(),
            Group::Files => self.rate_limit_files.as_deref(),
        }
    }

    /// The rate of a group of routes, if it has one (checked by `validate`).
    pub fn rate_limit(&self, group: Group) -> Option<Rate> {
        self.rate_limit_text(group)?.parse().ok()
    }

    /// The request body limit: code and stdin at their maxima, plus room for the rest.
    pub fn max_body_bytes(&self) -> usize {
        (self.max_code_bytes + self.max_stdin_bytes + (1 << 20)) as usize
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
