//! What can go wrong in the helper, in init and in the program before its exec, one
//! variant per step. The text of each is what the server logs: the helper reports it as
//! `Event::Failed { message }`, init as `InitReport::SetupFailed { message }`, and the
//! program writes it to its stderr before it exits with 126.

use crate::cgroup::CgroupError;
use crate::mounts::MountError;
use crate::seccomp::SeccompError;
use crate::workspace::WorkspaceError;
use nix::errno::Errno;
use nix::sys::resource::Resource;
use std::ffi::NulError;
use std::io;
use std::path::PathBuf;

/// A message from the server (or, in init, from the helper) that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    #[error("{0}")]
    Read(#[source] io::Error),
    #[error("{0}")]
    Parse(#[source] serde_json::Error),
}

/// Why the helper could not build, fork or run a sandbox, or init or the program could
/// not get as far as the program's exec.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    // The server's messages (`run_helper`, `keep_template`) and init's run message.
    #[error("bad prepare message: {0}")]
    BadPrepare(#[source] MessageError),
    #[error("bad run message: {0}")]
    BadRun(#[source] MessageError),
    #[error("a template needs a launch")]
    TemplateWithoutLaunch,
    #[error("the template did not get ready")]
    TemplateNotReady,

    // Building a sandbox (`Sandbox::build_steps`), in the order of its steps.
    #[error("unshare mount namespace: {0}")]
    UnshareMountNamespace(#[source] Errno),
    #[error("without root, the sandbox user can only map to the server's own uid and gid")]
    ForeignIdsWithoutRoot,
    #[error("unshare user and mount namespaces: {0}")]
    UnshareUserNamespace(#[source] Errno),
    /// Writing `/proc/<pid>/{file}` (`uid_map`, `setgroups` or `gid_map`).
    #[error("write {file}: {source}")]
    WriteIdMap {
        file: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("make / private: {0}")]
    MakeRootPrivate(#[source] Errno),
    #[error("create staging dir: {0}")]
    CreateStaging(#[source] io::Error),
    #[error("chmod staging: {0}")]
    ChmodStaging(#[source] io::Error),
    #[error("mount staging tmpfs: {0}")]
    MountStaging(#[source] Errno),
    /// Creating one of the staging directories (work, code, root).
    #[error("create {}: {source}", path.display())]
    CreateStagingDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("mount workspace tmpfs: {0}")]
    MountWorkspace(#[source] Errno),
    #[error("create bin: {0}")]
    CreateToolBin(#[source] io::Error),
    #[error("create client: {0}")]
    CreateToolClient(#[source] io::Error),
    #[error("tool socket: {0}")]
    ToolSocket(#[source] io::Error),
    /// Preparing the root's skeleton (helper) or building the root (init).
    #[error(transparent)]
    Mount(#[from] MountError),
    /// Creating the run's cgroup, or moving a process into it.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("pipe: {0}")]
    Pipe(#[source] Errno),
    #[error("socketpair: {0}")]
    SocketPair(#[source] io::Error),
    /// Compiling the seccomp policy (helper) or installing it (program).
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
    #[error("seccomp.bpf: {0}")]
    WriteSeccompFilter(#[source] io::Error),
    /// Restricting the program with Landlock (a kernel without it is no error).
    #[error("landlock: {0}")]
    Landlock(#[source] landlock::RulesetError),
    #[error("landlock.json: {0}")]
    WriteLandlockPlan(#[source] io::Error),
    #[error("template socket: {0}")]
    TemplateSocket(#[source] io::Error),
    #[error("clone into new namespaces: {0}")]
    CloneInit(#[source] Errno),
    #[error("start init: {0}")]
    StartInit(#[source] io::Error),

    // Init's reports (`Sandbox::read_init_report`, `read_hello`).
    #[error("init pipe closed")]
    InitPipeClosed,
    /// Waiting for, or reading, init's report.
    #[error("{0}")]
    InitChannel(#[source] io::Error),
    #[error("bad init report: {0}")]
    BadInitReport(#[source] serde_json::Error),
    #[error("sandbox init exited during setup")]
    InitExitedDuringSetup,
    #[error("sandbox init did not finish setup in time")]
    InitSetupTimedOut,
    /// Init (or the template's fork) reported that it could not set the sandbox up.
    #[error("sandbox setup: {0}")]
    SetupFailed(String),
    /// A report other than the one expected, as it was read (`{:?}`).
    #[error("sandbox init: unexpected report {0}")]
    UnexpectedInitReport(String),

    // Forking a run from a template (`Sandbox::fork_steps`), in the order of its steps.
    #[error("open the run's cgroup: {0}")]
    OpenRunCgroup(#[source] Errno),
    #[error("SO_PASSCRED: {0}")]
    PassCredentials(#[source] Errno),
    #[error("connect to the template: {0}")]
    ConnectTemplate(#[source] io::Error),
    #[error("ask the template for a fork: {0}")]
    AskForFork(#[source] Errno),
    /// No hello in time; says whose (`read_hello`'s `late`).
    #[error("{0}")]
    HelloTimedOut(&'static str),
    #[error("read a hello of the run: {0}")]
    ReadHello(#[source] Errno),
    #[error("the template's fork did not say hello")]
    NoHello,
    /// Serialising a message for init or the template.
    #[error(transparent)]
    Encode(serde_json::Error),
    #[error("send the fork request: {0}")]
    SendForkRequest(#[source] Errno),
    #[error("pidfd_open: {0}")]
    PidfdOpen(#[source] io::Error),
    #[error("dup: {0}")]
    DupReport(#[source] io::Error),
    #[error("open the run's working directory: {0}")]
    OpenWorkDir(#[source] Errno),

    // Running the program (`Sandbox::run`, `Sandbox::start_program`).
    #[error("code larger than max_code_bytes")]
    CodeTooLarge,
    /// Opening the run's network namespace (`Run::egress`).
    #[error("egress: open {path}: {source}")]
    EgressNamespace {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("egress: fork: {0}")]
    EgressFork(#[source] Errno),
    #[error("egress: the sandbox was not built for a run with egress (Prepare::egress)")]
    EgressWithoutNamespace,
    /// Bringing the run's loopback up, or listening on it.
    #[error("egress: listen in the run's network namespace: {0}")]
    EgressListen(#[source] io::Error),

    #[error("bad code file name {0:?}")]
    BadCodeFileName(String),
    #[error("write {name}: {source}")]
    WriteCodeFile {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("chmod {name}: {source}")]
    ChmodCodeFile {
        name: String,
        #[source]
        source: io::Error,
    },
    /// Staging the inputs, or collecting the outputs.
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    #[error("start program: {0}")]
    StartProgram(#[source] io::Error),
    #[error("{0}")]
    SetNonblocking(#[source] io::Error),
    #[error("init channel closed")]
    InitChannelClosed,
    #[error("seal the code: {0}")]
    SealCode(#[source] io::Error),
    #[error("poll: {0}")]
    Poll(#[source] Errno),

    // In init (`init_setup`, `init_run`), in the order of its steps.
    #[error("close_range: {0}")]
    CloseRange(#[source] io::Error),
    #[error("pdeathsig: {0}")]
    ParentDeathSignal(#[source] Errno),
    #[error("unshare cgroup namespace: {0}")]
    UnshareCgroupNamespace(#[source] Errno),
    #[error("sethostname: {0}")]
    SetHostname(#[source] Errno),
    #[error("setresgid: {0}")]
    SetGid(#[source] Errno),
    #[error("setresuid: {0}")]
    SetUid(#[source] Errno),
    #[error("set_dumpable: {0}")]
    SetDumpable(#[source] Errno),
    #[error("report ready: {0}")]
    ReportReady(#[source] Errno),
    #[error("fork: {0}")]
    ForkProgram(#[source] Errno),

    // In the program, before its exec (`exec_program_steps`), in the order of its steps.
    #[error("setsid: {0}")]
    SetSid(#[source] Errno),
    #[error("dup2: {0}")]
    Dup2(#[source] Errno),
    /// Clearing close-on-exec on fd 3 or 4.
    #[error("fcntl: {0}")]
    ClearCloseOnExec(#[source] Errno),
    #[error("getrlimit {resource:?}: {source}")]
    GetRlimit {
        resource: Resource,
        #[source]
        source: Errno,
    },
    #[error("setrlimit {resource:?}: {source}")]
    SetRlimit {
        resource: Resource,
        #[source]
        source: Errno,
    },
    #[error("drop capabilities ({set:?}): {source}")]
    DropCapabilities {
        set: caps::CapSet,
        #[source]
        source: caps::errors::CapsError,
    },
    #[error("no_new_privs: {0}")]
    NoNewPrivs(#[source] Errno),
    #[error("argument or environment contains a NUL byte")]
    NulByte(#[source] NulError),
    #[error("empty argv")]
    EmptyArgv,
    #[error("execve {program}: {source}")]
    Execve {
        program: String,
        #[source]
        source: Errno,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages read as the strings the helper built before it had typed errors.
    #[test]
    fn messages_read_as_before() {
        let e = Errno::EPERM;
        let cases: Vec<(HelperError, String)> = vec![
            (
                HelperError::UnshareMountNamespace(e),
                format!("unshare mount namespace: {e}"),
            ),
            (
                HelperError::WriteIdMap {
                    file: "setgroups",
                    source: io::Error::from_raw_os_error(libc::EACCES),
                },
                format!("write setgroups: {}", io::Error::from_raw_os_error(libc::EACCES)),
            ),
            (
                HelperError::CreateStagingDir {
                    path: PathBuf::from("/data/s/work"),
                    source: io::Error::from_raw_os_error(libc::EEXIST),
                },
                format!("create /data/s/work: {}", io::Error::from_raw_os_error(libc::EEXIST)),
            ),
            (
                HelperError::GetRlimit {
                    resource: Resource::RLIMIT_NPROC,
                    source: e,
                },
                format!("getrlimit RLIMIT_NPROC: {e}"),
            ),
            (
                HelperError::SetRlimit {
                    resource: Resource::RLIMIT_DATA,
                    source: e,
                },
                format!("setrlimit RLIMIT_DATA: {e}"),
            ),
            (
                HelperError::DropCapabilities {
                    set: caps::CapSet::Bounding,
                    source: "no".into(),
                },
                format!("drop capabilities (Bounding): {}", caps::errors::CapsError::from("no")),
            ),
            (
                HelperError::Execve {
                    program: "/usr/bin/python3".into(),
                    source: Errno::ENOENT,
                },
                format!("execve /usr/bin/python3: {}", Errno::ENOENT),
            ),
            (
                HelperError::HelloTimedOut("the template did not fork in time"),
                "the template did not fork in time".into(),
            ),
            (
                HelperError::SetupFailed("mount tmpfs on /tmp: EPERM".into()),
                "sandbox setup: mount tmpfs on /tmp: EPERM".into(),
            ),
            (
                HelperError::BadCodeFileName("a/b".into()),
                r#"bad code file name "a/b""#.into(),
            ),
            (
                HelperError::NulByte(std::ffi::CString::new("a\0b").unwrap_err()),
                "argument or environment contains a NUL byte".into(),
            ),
            (
                HelperError::Cgroup(CgroupError::NotFound),
                CgroupError::NotFound.to_string(),
            ),
        ];
        for (error, before) in cases {
            assert_eq!(error.to_string(), before);
        }
        let parse = serde_json::from_str::<u8>("x").unwrap_err();
        let text = parse.to_string();
        assert_eq!(
            HelperError::BadRun(MessageError::Parse(parse)).to_string(),
            format!("bad run message: {text}")
        );
    }
}
