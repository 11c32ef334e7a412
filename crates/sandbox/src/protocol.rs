//! The messages between the server and the sandbox helper, one JSON object per line.
//!
//! The server writes a [`Prepare`] and later a [`Run`] to the helper's stdin; the helper
//! answers on its stdout with [`Event`]s. Closing the helper's stdin at any time means
//! "abort": the helper kills the sandbox, reclaims everything and exits.
//!
//! The split between `Prepare` and `Run` is the seam for warm sandboxes: everything that
//! does not depend on the request happens before `Run` arrives.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Which cgroup hierarchy the run's cgroup lives in, with the directories to create.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "version", rename_all = "snake_case")]
pub enum CgroupPlacement {
    /// cgroup v1: one directory per controller hierarchy.
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: Option<PathBuf>,
        cpuacct: Option<PathBuf>,
    },
    /// cgroup v2: one directory in the unified hierarchy.
    V2 { path: PathBuf },
}

/// Resource limits of one run. Every field is already clamped by the server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Limits {
    /// Memory of all the run's processes together, tmpfs pages included; no swap.
    pub memory_bytes: u64,
    /// Processes and threads together.
    pub max_processes: u64,
    /// RLIMIT_NOFILE of every process.
    pub max_open_files: u64,
    /// RLIMIT_FSIZE: the largest file a process may write.
    pub file_size_bytes: u64,
    /// Size of the working directory (`/mnt/data`), a tmpfs.
    pub workspace_bytes: u64,
    /// Size of `/tmp` and of `/dev/shm`, each a tmpfs.
    pub tmp_bytes: u64,
    /// CPU time of all processes together, in milliseconds.
    pub cpu_time_ms: u64,
    /// Share of one CPU the run may use at most (1.0 = one core).
    pub cpus: f64,
    /// Bytes kept of stdout and of stderr, each.
    pub max_output_bytes: u64,
}

/// Everything needed to build a sandbox before knowing which program it will run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Prepare {
    /// The run's id: names its cgroup and its staging directory.
    pub run_id: String,
    /// A directory that does not exist yet, on the host, that the helper creates and
    /// removes again; the run's private tmpfs mounts live on it inside the helper's own
    /// mount namespace and are never visible to the host.
    pub staging_dir: PathBuf,
    pub cgroup: CgroupPlacement,
    pub limits: Limits,
    /// Host directories bound read-only into the sandbox at the same path, besides the
    /// defaults (`/usr` and the merged-usr links `/bin`, `/lib`, ...).
    pub extra_runtime_paths: Vec<PathBuf>,
    /// A host `node_modules` directory (the npm packages for programs) bound read-only
    /// at `/node_modules`, where Node's module resolution looks from the code and the
    /// working directory. None: no such directory in the sandbox.
    #[serde(default)]
    pub node_modules: Option<PathBuf>,
    /// The host uid and gid that the sandbox's user (uid 1000 inside) maps to.
    pub host_uid: u32,
    pub host_gid: u32,
    /// The most bytes of code a run may bring.
    pub max_code_bytes: u64,
    /// Start the program now, before its code is known (a warm sandbox): it is launched
    /// with fd 3 open, and `Run::go` is written there when the run begins.
    #[serde(default)]
    pub launch: Option<Launch>,
    /// Programmatic runs: open the tool socket `/run/sandcall/tools.sock` and put the
    /// tool-call client at `/run/sandcall/bin/sandcall`. None for plain runs.
    #[serde(default)]
    pub tools: Option<ToolChannel>,
    /// Keep a template ("zygote", ARCHITECTURE.md "Forked runs"): the launched program
    /// gets a unix socket listening at this host path as its fd 4, keeps no seccomp
    /// filter (it never runs user code; each run it forks installs the filter), and
    /// forks a run per connection. The helper answers `Ready` once it is ready, and
    /// `Failed` when it exits; it never takes a `Run`.
    #[serde(default)]
    pub template: Option<PathBuf>,
    /// Fork the run from the template listening at this host path instead of building
    /// a sandbox (`launch` is then unused: the forked program is already running).
    #[serde(default)]
    pub fork_from: Option<PathBuf>,
    /// Built ahead of any request (a warm pool's refill, a template): the helper, and
    /// everything it starts, runs at the lowest CPU priority (nice 19) until the `Run`
    /// arrives, so that rebuilding never takes CPU from a run in flight. The helper puts
    /// itself and every thread of the run's cgroup back at `nice` before the program's
    /// go. Ignored where the helper could not raise the priority again (no
    /// `CAP_SYS_NICE`).
    #[serde(default)]
    pub background: bool,
    /// The nice value runs run at: the server's own (a server started under `nice`
    /// never has a run raised above itself).
    #[serde(default)]
    pub nice: i32,
    /// The run will have egress (`Run::egress`): the helper holds the run's network
    /// namespace from init's clone on (it makes the listener there at the `Run`).
    #[serde(default)]
    pub egress: bool,
    /// The helper's own binary, as the server started it: bound into a programmatic
    /// run's root as its tool client. None: the helper's `/proc/self/exe` (which gVisor
    /// names relative to its bind mount, so the `gvisor` tier always sends it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helper_exe: Option<PathBuf>,
}

/// How to start a program ahead of its run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Launch {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Report `Ready` only once the program writes `ready` on fd 3 (it has finished
    /// warming up: a Python sandbox importing its preloads), or after
    /// `READY_WAIT`, whichever comes first; so that a run never pays for the warm-up.
    #[serde(default)]
    pub wait_ready: bool,
}

/// Settings of the tool-call channel between the program and the helper. The helper
/// runs outside the run's cgroup, so these bound what a program can make it hold.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolChannel {
    /// A program message longer than this closes its connection unread.
    pub max_message_bytes: u64,
    /// Connections open at once (each Bash tool command is one).
    pub max_connections: usize,
    /// Unfinished lines of all connections together. A line that grows past a small
    /// allowance takes `max_message_bytes` of this budget until it ends; while none is
    /// left, the connection is not read (it waits, it is not cut off).
    pub max_input_bytes: u64,
    /// Replies not yet taken by the program, all connections together; a reply that
    /// would go over closes the connection it is for.
    pub max_queued_reply_bytes: u64,
    /// The most calls the server accepts in one run (`max_tool_calls`): the refusal
    /// bucket holds this many tokens more than its burst, so accepted calls never wait.
    pub max_calls: u64,
}

/// The program to run in a prepared sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    /// Source text, written to `/run/sandcall/<code_file>` (read-only inside).
    pub code: String,
    pub code_file: String,
    /// More files for `/run/sandcall` (a language's runner, the tool definitions).
    #[serde(default)]
    pub support_files: Vec<(String, String)>,
    /// The full argv; `argv[0]` is the interpreter's absolute path. Unused when the
    /// sandbox was prepared with a `launch`.
    pub argv: Vec<String>,
    /// For a launched program: the line written to its fd 3 to start it.
    #[serde(default)]
    pub go: Option<String>,
    /// The program's whole environment.
    pub env: Vec<(String, String)>,
    /// Bytes fed to standard input, which is then closed.
    pub stdin: String,
    /// Wall-clock budget from the start of the program, in milliseconds.
    pub timeout_ms: u64,
    /// Files copied into the working directory before the program starts.
    #[serde(default)]
    pub inputs: Vec<InputFile>,
    /// Where to put the files the run created or changed, if anywhere.
    #[serde(default)]
    pub collect: Option<Collect>,
    /// The run's way out (docs/egress.md): a listener on the sandbox's loopback, relayed
    /// to the server's egress proxy. None: the sandbox's loopback stays down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Egress>,
}

/// A run's egress endpoint: the helper listens on 127.0.0.1:`port` inside the run's
/// network namespace, and relays each connection to the unix socket `socket` on the
/// host (outside the sandbox's root), where the server's proxy serves it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Egress {
    pub socket: PathBuf,
    pub port: u16,
    /// Set in the `gvisor` tier, where no host socket is open to the helper: the
    /// descriptor of the unix socket it was started with (`EGRESS_CHANNEL_FD`), over
    /// which it asks for each connection to `socket` (one byte) and gets it, already
    /// connected by the server, with SCM_RIGHTS (or, refused, a byte without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<i32>,
}

/// Where a helper started in a gVisor sandbox for a run with network finds its egress
/// channel (`Egress::channel`): `runsc run --pass-fd` puts it there.
pub const EGRESS_CHANNEL_FD: i32 = 3;

/// A file to stage: a host path the helper reads, and the relative name it gets.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InputFile {
    pub source: PathBuf,
    pub name: String,
    /// Never collected as an output, even if the run changed it; always reported in
    /// `RunResult.inherited`.
    #[serde(default)]
    pub read_only: bool,
    /// The server's label for this input. The helper does not read it: it only echoes
    /// it (in `RunResult.inherited`, or in `CollectedFile.input` for a changed input).
    #[serde(default)]
    pub tag: String,
}

/// How to collect a run's output files.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Collect {
    /// A directory that does not exist yet; the helper creates it and writes each
    /// collected file there under a number.
    pub outbox: PathBuf,
    pub max_files: usize,
    pub max_file_bytes: u64,
    /// The most bytes all collected files together may hold, counted by their apparent
    /// size (`st_size`): the run's workspace limit. A sparse file costs the workspace
    /// nothing but its copy costs its whole size, so blocks would not bound the copies.
    pub max_total_bytes: u64,
}

/// One collected output file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CollectedFile {
    /// Relative to the working directory.
    pub name: String,
    pub size: u64,
    pub sha256: String,
    /// Where the helper put the bytes (in the outbox).
    pub path: PathBuf,
    /// The `tag` of the input staged under this name, which the run changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
}

/// Something in the working directory that was not collected, and why: `symlink`,
/// `not_regular_file`, `hard_link`, `invalid_name`, `too_large`, `too_many_files`,
/// `over_workspace_limit`, `too_deep`, `storage_full`, `unreadable`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SkippedFile {
    pub name: String,
    pub reason: String,
}

/// What happened to a run. Output is already decoded (invalid UTF-8 replaced).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub timed_out: bool,
    pub oom_killed: bool,
    /// The run's CPU time budget ran out.
    pub cpu_limit_exceeded: bool,
    /// The helper was told to abort (server shutting down, session cancelled).
    pub aborted: bool,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub cpu_time_ms: u64,
    pub memory_peak_bytes: u64,
    pub wall_time_ms: u64,
    #[serde(default)]
    pub outputs: Vec<CollectedFile>,
    /// At most 100 entries; `skipped_total` counts them all.
    #[serde(default)]
    pub skipped: Vec<SkippedFile>,
    #[serde(default)]
    pub skipped_total: usize,
    /// The `tag`s of the inputs to report as they were, in staging order: the ones the
    /// run left unchanged, and every read-only one.
    #[serde(default)]
    pub inherited: Vec<String>,
}

/// A message from the helper to the server.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The sandbox is built and waits for its program. For a run forked from a
    /// template, `cloned_into_cgroup` says whether the template cloned the run's first
    /// process straight into the run's cgroup (`clone3` with `CLONE_INTO_CGROUP`, on
    /// cgroup v2) or the helper moved it there after its hello (cgroup v1, or a kernel
    /// or seccomp profile without that call).
    Ready {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cloned_into_cgroup: Option<bool>,
    },
    /// The program ended; the sandbox is being reclaimed.
    Finished { result: RunResult },
    /// The sandbox could not be built or run. `message` is for the log, not the client.
    Failed { message: String },
    /// The program asked for a tool call. `key` names it until it is answered. Python
    /// sends `arguments`; the Bash tool command sends its command-line words as `argv`.
    ToolCall {
        key: u64,
        name: String,
        arguments: Option<serde_json::Value>,
        argv: Option<Vec<String>>,
    },
    /// The program waits for the calls it made: output produced since the previous
    /// `Blocked` comes with it.
    Blocked {
        partial_stdout: String,
        partial_stderr: String,
    },
}

/// A message from the server to the helper while the program runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Command {
    /// The answer to tool call `key`, passed to the program as it is (with its own id).
    Reply { key: u64, reply: ToolReply },
}

/// What the program receives for one tool call.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolReply {
    pub ok: bool,
    /// The caller's result as the JSON text it sent, passed through unparsed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub result: Option<Box<serde_json::value::RawValue>>,
    /// `tool_error` (the caller said is_error), `refused` (the server refused the call),
    /// or `timeout` (no result within tool_call_timeout).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
}

impl PartialEq for ToolReply {
    fn eq(&self, other: &Self) -> bool {
        self.ok == other.ok
            && self.result.as_ref().map(|r| r.get()) == other.result.as_ref().map(|r| r.get())
            && self.kind == other.kind
            && self.error == other.error
    }
}

impl ToolReply {
    pub fn result(value: Box<serde_json::value::RawValue>) -> Self {
        ToolReply {
            ok: true,
            result: Some(value),
            kind: None,
            error: None,
        }
    }

    pub fn error(kind: &str, message: impl Into<String>) -> Self {
        ToolReply {
            ok: false,
            result: None,
            kind: Some(kind.into()),
            error: Some(message.into()),
        }
    }
}
