//! One run as the engine asks for it (`RunSpec`: code, argv, limits, files, tools), and
//! how a run can fail (`RunError`): the vocabulary the runner and every isolation tier
//! share.

use sandcall_sandbox::protocol::{Collect, Egress, InputFile, Limits, ToolChannel};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot start the sandbox helper: {0}")]
    Spawn(std::io::Error),
    #[error("sandbox helper protocol: {0}")]
    Protocol(String),
    #[error("sandbox failed: {0}")]
    Sandbox(String),
}

/// One program to run, fully resolved (limits clamped, argv built).
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub run_id: String,
    pub code: String,
    pub code_file: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: String,
    pub timeout_ms: u64,
    pub limits: Limits,
    /// More files for the code directory (a runner, tool definitions).
    pub support_files: Vec<(String, String)>,
    /// The tool channel, for programmatic runs.
    pub tools: Option<ToolChannel>,
    /// Files staged into the working directory.
    pub inputs: Vec<InputFile>,
    /// Where the run's output files go, if they are collected.
    pub collect: Option<Collect>,
    /// For a warm sandbox: the line that starts its waiting program.
    pub go: Option<String>,
    /// The run's way out to the egress proxy (a cold sandbox only: its program's
    /// environment names the proxy).
    pub egress: Option<Egress>,
}

impl RunSpec {
    /// A run of `code` as `launch` says, with no stdin, inputs, outputs or tools.
    pub fn new(run_id: String, code: String, launch: crate::runtime::Launch, timeout_ms: u64, limits: Limits) -> Self {
        RunSpec {
            run_id,
            code,
            code_file: launch.code_file,
            argv: launch.argv,
            env: launch.env,
            stdin: String::new(),
            timeout_ms,
            limits,
            support_files: launch.support_files,
            tools: None,
            inputs: Vec::new(),
            collect: None,
            go: None,
            egress: None,
        }
    }
}
