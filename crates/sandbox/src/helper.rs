//! The sandbox helper: a single-threaded process, started by the server for each run,
//! that builds the sandbox, runs one program in it and reclaims everything afterwards.
//!
//! Three processes take part:
//! - the helper (this file, `run_helper`; a run's poll loop in `run.rs`): host root or
//!   the invoking user, in its own mount namespace so that its staging mounts vanish
//!   with it; owns the run's cgroup;
//! - the sandbox's init (`init_main`, in `init.rs`): pid 1 of the new pid namespace,
//!   holding the capabilities of the new user namespace only; builds the root and reaps
//!   children;
//! - the program (`exec_program`, in `init.rs`): forked by init, stripped of every
//!   capability and filtered by seccomp before it execs the interpreter.
//!
//! Their errors are `HelperError`s (`error.rs`), whose text is what the server logs.
//!
//! When init exits the kernel kills every other process of its pid namespace, so a run
//! ends entirely when its program ends, is killed, or its helper dies.

use crate::cgroup::RunCgroup;
use crate::io::{read_some, timeout_of, wait_readable, write_all, Lines, MAX_CONTROL_LINE, MAX_SHORT_LINE};
use crate::protocol::{Event, Limits, Prepare, Run};
use crate::seccomp::Policy;
use crate::tools::ToolHub;
use nix::fcntl::OFlag;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::poll::{poll, PollFd, PollFlags};
use nix::sched::{clone, unshare, CloneFlags};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{pipe2, Pid};
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod egress;
mod error;
mod init;
mod run;
pub use error::{HelperError, MessageError};

/// The uid and gid of the program inside its user namespace.
const SANDBOX_ID: u32 = 1000;
/// How long init may take to build the root before the run is given up.
const SETUP_TIMEOUT: Duration = Duration::from_secs(20);
/// Stack of the init process created by clone(2); it runs plain Rust code.
const INIT_STACK_BYTES: usize = 8 << 20;

/// Entry point of `sandcall sandbox-helper`. Returns the process exit code.
pub fn run_helper() -> i32 {
    // SAFETY: fds 0 and 1 are the pipes the server set up; nothing else owns them.
    let control = unsafe { OwnedFd::from_raw_fd(0) };
    let mut control = Lines::new(control, MAX_CONTROL_LINE);
    let prepare: Prepare = match read_message(&mut control) {
        Ok(Some(p)) => p,
        Ok(None) => return 0,
        Err(e) => {
            emit(&Event::Failed {
                message: HelperError::BadPrepare(e).to_string(),
            });
            return 1;
        }
    };
    // If the server dies, so do we, and with us the sandbox's init (see init_main).
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    // Work done ahead of requests yields to the runs in flight (`crate::priority`);
    // init and the program inherit the helper's priority, and so do a template's forks.
    if prepare.background && crate::priority::can_restore() {
        let _ = crate::priority::set_nice(0, crate::priority::BACKGROUND_NICE);
    }
    if prepare.template.is_some() {
        return keep_template(&prepare, &mut control);
    }

    let built = match &prepare.fork_from {
        Some(socket) => Sandbox::fork(&prepare, socket),
        None => Sandbox::build(&prepare),
    };
    let mut sandbox = match built {
        Ok(sb) => sb,
        Err(failed) => {
            let (e, partial) = *failed;
            partial.teardown();
            emit(&Event::Failed { message: e.to_string() });
            return 1;
        }
    };
    if let Some(launch) = prepare.launch.as_ref().filter(|_| prepare.fork_from.is_none()) {
        if let Err(e) = sandbox.start_program(&InitRun::new(&launch.argv, &launch.env)) {
            sandbox.teardown();
            emit(&Event::Failed { message: e.to_string() });
            return 1;
        }
        if launch.wait_ready {
            let _ = sandbox.wait_program_ready(READY_WAIT);
        }
    }
    emit(&Event::Ready {
        cloned_into_cgroup: sandbox.forked.as_ref().map(|f| f.cloned_into_cgroup),
    });

    let run: Run = match read_message(&mut control) {
        Ok(Some(r)) => r,
        Ok(None) => {
            sandbox.teardown();
            return 0;
        }
        Err(e) => {
            sandbox.teardown();
            emit(&Event::Failed {
                message: HelperError::BadRun(e).to_string(),
            });
            return 1;
        }
    };
    // Back at the priority of a cold run before the program's go: the helper, and
    // every thread of the run (a run forked from a template inherits its priority).
    if (prepare.background || prepare.fork_from.is_some()) && crate::priority::can_restore() {
        let threads = || sandbox.cgroup.as_ref().map(|c| c.threads()).unwrap_or_default();
        for (tid, e) in crate::priority::restore(prepare.nice, threads) {
            eprintln!("sandcall helper: cannot restore the priority of thread {tid}: {e}");
        }
    }
    limit_own_memory(&prepare, run.egress.is_some());
    let outcome = sandbox.run(&run, &mut control);
    let mut usage = sandbox.cgroup.as_ref().map(|c| c.usage()).unwrap_or_default();
    // A launched program's start-up is not the run's.
    usage.cpu_time_ms = usage.cpu_time_ms.saturating_sub(sandbox.cpu_before_run);
    // Collect only once init is reaped: its exit waits for every process of the pid
    // namespace, so nothing of the program runs while the files are read. A run that
    // leaves an empty working directory has nothing to collect, and its answer need not
    // wait for the reaping (init is already killed; teardown reaps it).
    let nothing_to_collect = run.collect.is_none() || crate::workspace::is_empty(&sandbox.work_dir());
    if !nothing_to_collect {
        sandbox.reap_init();
    }
    let outcome = outcome.and_then(|mut result| {
        if let Some(opts) = run.collect.as_ref().filter(|_| !nothing_to_collect) {
            let found = crate::workspace::collect(&sandbox.work_dir(), opts, &sandbox.staged)?;
            result.outputs = found.files;
            result.skipped = found.skipped;
            result.skipped_total = found.skipped_total;
            result.inherited = found.inherited;
        } else if run.collect.is_some() {
            // An emptied workspace: its read-only inputs still come back as they were.
            result.inherited = crate::workspace::read_only_tags(&sandbox.staged);
        }
        Ok(result)
    });
    // The answer goes out first: every process of the run is gone and its files are
    // collected, so the rest (removing the cgroup, which can wait for an RCU grace
    // period, and the mounts) need not delay it. The server keeps counting this helper
    // until it exits.
    let code = match outcome {
        Ok(mut result) => {
            result.cpu_time_ms = usage.cpu_time_ms;
            result.memory_peak_bytes = usage.memory_peak_bytes;
            result.oom_killed = usage.oom_killed;
            emit(&Event::Finished { result });
            0
        }
        Err(e) => {
            emit(&Event::Failed { message: e.to_string() });
            1
        }
    };
    sandbox.teardown();
    code
}

/// `sandcall sandbox-helper` for a template (`Prepare::template`): builds its sandbox,
/// starts it, answers `Ready` once it is ready to fork, then watches it. When the
/// template exits, the helper answers `Failed` and removes the socket, but its runs live
/// on (the template's init waits for them), and so does the helper until they end.
/// Closing the helper's stdin kills the template and every run still forked from it.
fn keep_template(prepare: &Prepare, control: &mut Lines) -> i32 {
    let mut sandbox = match Sandbox::build(prepare) {
        Ok(sb) => sb,
        Err(failed) => {
            let (e, partial) = *failed;
            partial.teardown();
            emit(&Event::Failed { message: e.to_string() });
            return 1;
        }
    };
    let started = match &prepare.launch {
        Some(launch) => sandbox.start_program(&InitRun::new(&launch.argv, &launch.env)),
        None => Err(HelperError::TemplateWithoutLaunch),
    };
    if let Err(e) = started.and_then(|()| {
        sandbox
            .wait_program_ready(READY_WAIT)
            .then_some(())
            .ok_or(HelperError::TemplateNotReady)
    }) {
        sandbox.teardown();
        emit(&Event::Failed { message: e.to_string() });
        return 1;
    }
    emit(&Event::Ready {
        cloned_into_cgroup: None,
    });
    let mut template_alive = true;
    let mut ended = false;
    loop {
        let mut fds = vec![PollFd::new(control.fd.as_fd(), PollFlags::POLLIN)];
        if let Some(l) = sandbox.from_init.as_ref().filter(|l| !l.eof) {
            fds.push(PollFd::new(l.fd.as_fd(), PollFlags::POLLIN));
        }
        let fired: Vec<bool> = match poll(&mut fds, timeout_of(Some(Duration::from_millis(200)))) {
            Ok(_) => fds.iter().map(|f| f.revents().is_some_and(|r| !r.is_empty())).collect(),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        };
        drop(fds);
        if fired.first() == Some(&true) {
            let _ = control.fill();
            if control.eof {
                break;
            }
        }
        if fired.get(1) == Some(&true) {
            if let Some(lines) = sandbox.from_init.as_mut() {
                let _ = lines.fill();
                // After `Ready`, init reports only the template's end.
                ended |= lines.take_line().is_some() || lines.eof;
            }
        }
        if template_alive && ended {
            // Init reported the template's end (or is gone): no more forks.
            template_alive = false;
            if let Some(path) = sandbox.template_socket.take() {
                let _ = fs::remove_file(path);
            }
            emit(&Event::Failed {
                message: "the template exited".into(),
            });
        }
        if !template_alive {
            if let Some(pid) = sandbox.init {
                match waitpid(pid, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::EINTR) => {}
                    _ => {
                        // Its last run has ended.
                        sandbox.init = None;
                        break;
                    }
                }
            }
        }
    }
    sandbox.teardown();
    0
}

/// Room for the helper's heap beyond what its buffers may legitimately hold: the
/// allocator's slack, collecting the output files, the final answer.
const OWN_MEMORY_MARGIN: u64 = 64 << 20;

/// Caps the helper's own memory (RLIMIT_DATA, soft only) once the run message is in.
/// The helper runs outside the run's cgroup, so this is what bounds it if a budget
/// below were ever wrong: an allocation over the limit fails and the helper, with its
/// one run, dies, instead of the host's memory filling up. Until the run message the
/// helper holds only what the server sent, which the server bounds; from here on it
/// holds what the program sends, bounded by the output caps and the tool channel's
/// budgets, which size the limit (with what it holds already, and a margin).
///
/// An rlimit rather than a cgroup of the helper's own: it is the same on cgroup v1 and
/// v2, needs no delegation and no cgroup to create and remove per run, and it fails an
/// allocation instead of OOM-killing the helper mid-teardown. Init was cloned before
/// this and the program is its child, so neither inherits it (and the program resets
/// the soft limit to the hard one anyway: its memory is the cgroup's business).
fn limit_own_memory(prepare: &Prepare, egress: bool) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Some(now) = vm_data_bytes() else { return };
    let output = prepare.limits.max_output_bytes.saturating_mul(10); // captures, text, answer
    let tools = prepare.tools.as_ref().map_or(0, |t| {
        let input = t.max_input_bytes + t.max_connections as u64 * crate::tools::SMALL_LINE_BYTES as u64;
        // Queued replies, plus the reply line being read and its copy.
        input + t.max_queued_reply_bytes.saturating_mul(3)
    });
    let relays = if egress { egress::MAX_RELAY_BYTES } else { 0 };
    let limit = now
        .saturating_add(output)
        .saturating_add(tools)
        .saturating_add(relays)
        .saturating_add(OWN_MEMORY_MARGIN);
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_DATA) {
        let _ = setrlimit(Resource::RLIMIT_DATA, limit.min(hard), hard);
    }
}

/// The helper's data size (what RLIMIT_DATA counts), from /proc/self/status.
fn vm_data_bytes() -> Option<u64> {
    use std::io::Read;
    // Reads into room for the whole file (about 1.5 KiB): 4 system calls, where
    // fs::read_to_string makes 11 (a stat, then small reads that grow). This is on a
    // run's request path.
    let mut file = fs::File::open("/proc/self/status").ok()?;
    let mut buf = vec![0u8; 8192];
    let mut len = 0;
    loop {
        match file.read(&mut buf[len..]).ok()? {
            0 => break,
            n => len += n,
        }
        if len == buf.len() {
            buf.resize(len * 2, 0);
        }
    }
    let status = String::from_utf8_lossy(&buf[..len]);
    let kib = status.lines().find_map(|l| l.strip_prefix("VmData:"))?;
    kib.trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()
        .map(|k| k << 10)
}

fn read_message<T: for<'de> Deserialize<'de>>(lines: &mut Lines) -> Result<Option<T>, MessageError> {
    match lines.read_line().map_err(MessageError::Read)? {
        None => Ok(None),
        Some(line) => serde_json::from_slice(&line).map(Some).map_err(MessageError::Parse),
    }
}

fn emit(event: &Event) {
    let mut out = io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, event);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// An event already serialised (a tool call, relayed without parsing its arguments).
fn emit_line(line: &[u8]) {
    let mut out = io::stdout().lock();
    let _ = out.write_all(line);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// What init sends back to the helper, one JSON line each.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "init", rename_all = "snake_case")]
enum InitReport {
    Ready,
    SetupFailed { message: String },
    Exited { code: i32 },
    Signaled { signal: i32 },
}

/// The message init waits for before it forks the program.
#[derive(Debug, Serialize, Deserialize)]
struct InitRun {
    argv: Vec<String>,
    env: Vec<(String, String)>,
}

impl InitRun {
    fn new(argv: &[String], env: &[(String, String)]) -> Self {
        InitRun {
            argv: argv.to_vec(),
            env: env.to_vec(),
        }
    }
}

/// The helper's side of one sandbox.
struct Sandbox {
    staging: PathBuf,
    staging_mounted: bool,
    work_mounted: bool,
    cgroup: Option<RunCgroup>,
    init: Option<Pid>,
    to_init: Option<OwnedFd>,
    from_init: Option<Lines>,
    stdin_w: Option<OwnedFd>,
    stdout_r: Option<OwnedFd>,
    stderr_r: Option<OwnedFd>,
    limits: Limits,
    max_code_bytes: u64,
    tools: Option<ToolHub>,
    /// Owner of the workspace's files, as this process names it.
    owner: (u32, u32),
    /// Staged inputs and their SHA-256, to tell changed inputs from unchanged ones.
    staged: Vec<crate::workspace::Staged>,
    /// The helper's end of a launched program's fd 3.
    go_w: Option<OwnedFd>,
    /// CPU time spent before the run began (a launched program's start-up).
    cpu_before_run: u64,
    /// A run forked from a template (`Prepare::fork_from`) instead of built here.
    forked: Option<Forked>,
    /// A template's listening socket on the host, removed when the template is gone.
    template_socket: Option<PathBuf>,
    /// The run's egress listener and relays (`Run::egress`).
    egress: Option<egress::EgressRelays>,
    /// The run's network namespace, held from init's clone for a run that will have
    /// egress (`Prepare::egress`): once init makes itself non-dumpable, a helper without
    /// root may no longer open it.
    net_ns: Option<std::fs::File>,
}

/// The helper's handles on a run forked from a template (`Sandbox::fork`). Its init is
/// not our child: it is watched and killed through a pidfd, and its working directory
/// is reached through a descriptor opened while it lived, which keeps the tmpfs
/// mounted (detached from any namespace) until collection is done.
struct Forked {
    pidfd: OwnedFd,
    /// `/proc/<init>/root`: the run's root, while its init lives.
    root: PathBuf,
    /// The run's `/mnt/data`, once init has mounted it.
    work: Option<OwnedFd>,
    /// Whether the template cloned the run's first process into the run's cgroup
    /// (else the helper moved it there).
    cloned_into_cgroup: bool,
}

/// The longest a warm sandbox's program may take to say it is ready (`Launch::wait_ready`).
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Everything init and the program need, captured before clone(2).
struct InitContext<'a> {
    to_init_r: RawFd,
    from_init_w: RawFd,
    stdin_r: RawFd,
    /// A launched program's fd 3, where its go message arrives.
    go_r: Option<RawFd>,
    stdout_w: RawFd,
    stderr_w: RawFd,
    staging: &'a Path,
    policy: &'a Policy,
    limits: &'a Limits,
    extra_runtime_paths: &'a [PathBuf],
    node_modules: Option<&'a Path>,
    tool_client: Option<&'a Path>,
    /// A template's listening socket, the program's fd 4 (`Prepare::template`).
    listener: Option<RawFd>,
    /// Whether init makes its cgroup the root of a cgroup namespace of its own: every
    /// sandbox's but a template's on v2, which must see the cgroups of the runs it
    /// clones into (with `nsdelegate`, the kernel refuses a clone into a cgroup outside
    /// the caller's cgroup namespace). Each run makes its own (zygote.py, `_run_init`).
    cgroup_namespace: bool,
}

impl Sandbox {
    fn empty(prepare: &Prepare) -> Self {
        Sandbox {
            staging: prepare.staging_dir.clone(),
            staging_mounted: false,
            work_mounted: false,
            cgroup: None,
            init: None,
            to_init: None,
            from_init: None,
            stdin_w: None,
            stdout_r: None,
            stderr_r: None,
            limits: prepare.limits.clone(),
            max_code_bytes: prepare.max_code_bytes,
            tools: None,
            owner: (prepare.host_uid, prepare.host_gid),
            staged: Default::default(),
            go_w: None,
            cpu_before_run: 0,
            forked: None,
            template_socket: None,
            egress: None,
            net_ns: None,
        }
    }

    /// The run's working directory, as the helper reaches it.
    fn work_dir(&self) -> PathBuf {
        match &self.forked {
            // The trailing `.` makes the descriptor's magic link an inner component, so
            // an O_NOFOLLOW open of this path (collection's) still follows it.
            Some(Forked { work: Some(work), .. }) => PathBuf::from(format!("/proc/self/fd/{}/.", work.as_raw_fd())),
            Some(f) => f.root.join("mnt/data"),
            None => self.staging.join("work"),
        }
    }

    /// The run's code directory (`/run/sandcall` inside), as the helper reaches it.
    fn code_dir(&self) -> PathBuf {
        match &self.forked {
            Some(f) => f.root.join("run/sandcall"),
            None => self.staging.join("code"),
        }
    }

    /// Runs `f` creating files as the sandbox user's host ids when the run is forked
    /// (`workspace::as_ids`).
    fn as_owner<T>(&self, f: impl FnOnce() -> T) -> T {
        crate::workspace::as_ids(self.forked.is_some(), self.owner.0, self.owner.1, f)
    }

    /// The isolation sequence, in order. On failure, returns what was built so far so
    /// that it can be torn down.
    fn build(prepare: &Prepare) -> Result<Self, Box<(HelperError, Self)>> {
        let mut sb = Sandbox::empty(prepare);
        match sb.build_steps(prepare) {
            Ok(()) => Ok(sb),
            Err(e) => Err(Box::new((e, sb))),
        }
    }

    fn build_steps(&mut self, prepare: &Prepare) -> Result<(), HelperError> {
        // 1. A mount namespace of our own, private: the staging tmpfs mounts below are
        //    invisible to the host and disappear with this process, whatever happens.
        //    Without root, a user namespace of our own (where we are root, mapped to our
        //    own uid) comes with it and gives the right to mount; the sandbox's user
        //    namespace is then nested in it.
        let (uid, gid) = self.own_mount_namespace(prepare)?;

        // 2. Staging: a small tmpfs for the code, and a size-limited tmpfs that becomes the
        //    working directory. Owned by the host uid the sandbox user maps to.
        self.mount_staging(prepare, uid, gid)?;
        let code = self.staging.join("code");

        // 3. The cgroup, with its limits set before any process joins it. A template's,
        //    on v2, in a directory of its own that its runs' cgroups share.
        let cgroup = match prepare.template {
            Some(_) => RunCgroup::create_template(&prepare.cgroup, &prepare.limits, (uid, gid)),
            None => RunCgroup::create(&prepare.cgroup, &prepare.limits),
        };
        self.cgroup = Some(cgroup?);

        // 4. Pipes and directory handles that init inherits. All are close-on-exec: the
        //    program gets only its three stdio pipes, which init dup2()s into place.
        let cloexec = OFlag::O_CLOEXEC;
        let (to_init_r, to_init_w) = pipe2(cloexec).map_err(HelperError::Pipe)?;
        let (from_init_r, from_init_w) = pipe2(cloexec).map_err(HelperError::Pipe)?;
        let (stdin_r, stdin_w) = pipe2(cloexec).map_err(HelperError::Pipe)?;
        let (stdout_r, stdout_w) = pipe2(cloexec).map_err(HelperError::Pipe)?;
        let (stderr_r, stderr_w) = pipe2(cloexec).map_err(HelperError::Pipe)?;
        // A launched program's fd 3: a socket, so that the go goes one way and the
        // program's own report of its end (`exit N`) comes back the other.
        let (go_r, go_w) = match prepare.launch {
            Some(_) => {
                let (r, w) = std::os::unix::net::UnixStream::pair().map_err(HelperError::SocketPair)?;
                (Some(OwnedFd::from(r)), Some(OwnedFd::from(w)))
            }
            None => (None, None),
        };

        let tool_client = prepare.helper_exe.clone().or_else(|| std::env::current_exe().ok());
        // 5. The seccomp policy is compiled here, where errors can still be reported.
        let policy = Policy::compile()?;
        // A template installs no filter itself: each run it forks installs this one,
        // and the template's listening socket becomes its fd 4. Created after every
        // other descriptor, so its number is above the program's 0 to 3.
        let listener = match &prepare.template {
            Some(path) => {
                fs::write(code.join("seccomp.bpf"), policy.to_bytes()).map_err(HelperError::WriteSeccompFilter)?;
                let rules = crate::landlock_layer::rules(&prepare.extra_runtime_paths, prepare.node_modules.is_some());
                let plan = crate::landlock_layer::plan(&rules).to_string();
                fs::write(code.join("landlock.json"), plan).map_err(HelperError::WriteLandlockPlan)?;
                let _ = fs::remove_file(path);
                let l = std::os::unix::net::UnixListener::bind(path).map_err(HelperError::TemplateSocket)?;
                self.template_socket = Some(path.clone());
                Some(OwnedFd::from(l))
            }
            None => None,
        };

        // 6. clone(2) init straight into new user, pid, mount, network, IPC and UTS
        //    namespaces. The cgroup namespace comes later, from init itself, once the
        //    helper has moved it into the run's cgroup (so that cgroup is its root).
        let ctx = InitContext {
            to_init_r: to_init_r.as_raw_fd(),
            from_init_w: from_init_w.as_raw_fd(),
            stdin_r: stdin_r.as_raw_fd(),
            go_r: go_r.as_ref().map(|fd| fd.as_raw_fd()),
            stdout_w: stdout_w.as_raw_fd(),
            stderr_w: stderr_w.as_raw_fd(),
            staging: &self.staging,
            policy: &policy,
            limits: &prepare.limits,
            extra_runtime_paths: &prepare.extra_runtime_paths,
            node_modules: prepare.node_modules.as_deref(),
            tool_client: tool_client.as_deref().filter(|_| prepare.tools.is_some()),
            listener: listener.as_ref().map(|fd| fd.as_raw_fd()),
            cgroup_namespace: self.cgroup.as_ref().is_none_or(|c| c.v2_path().is_none()),
        };
        let flags = CloneFlags::CLONE_NEWUSER
            | CloneFlags::CLONE_NEWPID
            | CloneFlags::CLONE_NEWNS
            | CloneFlags::CLONE_NEWNET
            | CloneFlags::CLONE_NEWIPC
            | CloneFlags::CLONE_NEWUTS;
        let mut stack = vec![0u8; INIT_STACK_BYTES];
        // SAFETY: this process is single-threaded, so the child's copy of memory (heap
        // locks included) is consistent; the child runs init_main on its own stack.
        let pid = unsafe {
            clone(
                Box::new(|| init::init_main(&ctx)),
                &mut stack,
                flags,
                Some(libc::SIGCHLD),
            )
        }
        .map_err(HelperError::CloneInit)?;
        self.init = Some(pid);
        if prepare.egress {
            let path = format!("/proc/{pid}/ns/net");
            let ns = fs::File::open(&path).map_err(|source| HelperError::EgressNamespace { path, source })?;
            self.net_ns = Some(ns);
        }
        // The template alone holds its listener: once it is gone, a connection is
        // refused at once instead of waiting in the backlog.
        drop((to_init_r, from_init_w, stdin_r, stdout_w, stderr_w, go_r, listener));
        self.go_w = go_w;
        self.stdin_w = Some(stdin_w);
        self.stdout_r = Some(stdout_r);
        self.stderr_r = Some(stderr_r);
        self.from_init = Some(Lines::new(from_init_r, MAX_SHORT_LINE));

        // 7. Identity: uid and gid 1000 inside map to the configured host ids (as root),
        //    or to the server's own ids through the helper's namespace (without root).
        write_id_maps(&pid.to_string(), SANDBOX_ID, uid, gid)?;

        // 8. Into the cgroup before init starts anything: every later process inherits it.
        if let Some(cg) = &self.cgroup {
            cg.add(pid.as_raw())?;
        }

        // 9. Let init go on, and wait until it reports the root built.
        write_all(&to_init_w, b"go\n").map_err(HelperError::StartInit)?;
        self.to_init = Some(to_init_w);
        match self.read_init_report(SETUP_TIMEOUT)? {
            InitReport::Ready => Ok(()),
            InitReport::SetupFailed { message } => Err(HelperError::SetupFailed(message)),
            other => Err(HelperError::UnexpectedInitReport(format!("{other:?}"))),
        }
    }

    /// Step 1 of `build_steps`: enters a private mount namespace of the helper's own (with
    /// a user namespace, without root). Returns the host ids the workspace belongs to, as
    /// this process names them.
    fn own_mount_namespace(&mut self, prepare: &Prepare) -> Result<(u32, u32), HelperError> {
        let (uid, gid) = if nix::unistd::geteuid().is_root() {
            unshare(CloneFlags::CLONE_NEWNS).map_err(HelperError::UnshareMountNamespace)?;
            (prepare.host_uid, prepare.host_gid)
        } else {
            let (euid, egid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
            if (prepare.host_uid, prepare.host_gid) != (euid, egid) {
                return Err(HelperError::ForeignIdsWithoutRoot);
            }
            unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).map_err(HelperError::UnshareUserNamespace)?;
            write_id_maps("self", 0, euid, egid)?;
            (0, 0)
        };
        crate::mounts::make_root_private().map_err(HelperError::MakeRootPrivate)?;
        self.owner = (uid, gid);
        Ok((uid, gid))
    }

    /// Step 2 of `build_steps`: the staging tmpfs mounts (code and workspace), the tool
    /// socket, and the skeleton of the root.
    fn mount_staging(&mut self, prepare: &Prepare, uid: u32, gid: u32) -> Result<(), HelperError> {
        fs::create_dir(&self.staging).map_err(HelperError::CreateStaging)?;
        fs::set_permissions(&self.staging, fs::Permissions::from_mode(0o700)).map_err(HelperError::ChmodStaging)?;
        let code_size = prepare.max_code_bytes + (1 << 20);
        mount(
            Some("tmpfs"),
            &self.staging,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(format!("size={code_size},mode=0755").as_str()),
        )
        .map_err(HelperError::MountStaging)?;
        self.staging_mounted = true;
        let work = self.staging.join("work");
        let code = self.staging.join("code");
        for dir in [&work, &code, &self.staging.join("root")] {
            fs::create_dir(dir).map_err(|source| HelperError::CreateStagingDir {
                path: dir.clone(),
                source,
            })?;
        }
        mount(
            Some("tmpfs"),
            &work,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(
                format!(
                    "size={},mode=0755,uid={},gid={}",
                    prepare.limits.workspace_bytes, uid, gid
                )
                .as_str(),
            ),
        )
        .map_err(HelperError::MountWorkspace)?;
        self.work_mounted = true;
        if let Some(channel) = &prepare.tools {
            // The tool socket, and the mount point of the tool-call client.
            fs::create_dir(code.join("bin")).map_err(HelperError::CreateToolBin)?;
            fs::write(code.join("bin/sandcall"), b"").map_err(HelperError::CreateToolClient)?;
            self.tools =
                Some(ToolHub::bind(&code.join("tools.sock"), channel.clone()).map_err(HelperError::ToolSocket)?);
        }
        crate::mounts::prepare_skeleton(
            &self.staging.join("root"),
            &prepare.extra_runtime_paths,
            prepare.node_modules.is_some(),
        )?;
        Ok(())
    }

    /// A run forked from the template listening at `socket` (`Prepare::fork_from`).
    /// On failure, returns what was built so far so that it can be torn down.
    fn fork(prepare: &Prepare, socket: &Path) -> Result<Self, Box<(HelperError, Self)>> {
        let mut sb = Sandbox::empty(prepare);
        match sb.fork_steps(prepare, socket) {
            Ok(()) => Ok(sb),
            Err(e) => Err(Box::new((e, sb))),
        }
    }

    /// The isolation sequence of a forked run, host side. The template's side is in
    /// `runtime/zygote.py`; ARCHITECTURE.md, "Forked runs", has both in order.
    fn fork_steps(&mut self, prepare: &Prepare, socket: &Path) -> Result<(), HelperError> {
        use nix::sys::socket::{sendmsg, setsockopt, sockopt, ControlMessage, MsgFlags};
        use std::os::unix::net::UnixStream;
        self.owner = (prepare.host_uid, prepare.host_gid);
        // 1. The cgroup, with its limits set before any process of the run joins it;
        //    on v2 beside the template's, and open for the template to clone into.
        let cgroup = RunCgroup::create_forked(&prepare.cgroup, &prepare.limits, self.owner)?;
        let into = cgroup
            .v2_path()
            .map(|path| {
                let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
                nix::fcntl::open(path, flags, nix::sys::stat::Mode::empty())
            })
            .transpose()
            .map_err(HelperError::OpenRunCgroup)?
            // SAFETY: open returned a fresh descriptor, owned from here on.
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
        self.cgroup = Some(cgroup);

        // 2. The run's channels, as for a built sandbox: stdio pipes, fd 3 (go and
        //    exit), and init's report socket, which also carries init's credentials.
        let cloexec = OFlag::O_CLOEXEC;
        let (stdin_r, stdin_w) = pipe2(cloexec).map_err(HelperError::Pipe)?;
        let (stdout_r, stdout_w) = pipe2(cloexec).map_err(HelperError::Pipe)?;
        let (stderr_r, stderr_w) = pipe2(cloexec).map_err(HelperError::Pipe)?;
        let (go_r, go_w) = UnixStream::pair().map_err(HelperError::SocketPair)?;
        let (report, report_init) = UnixStream::pair().map_err(HelperError::SocketPair)?;
        setsockopt(&report, sockopt::PassCred, &true).map_err(HelperError::PassCredentials)?;

        // 3. Ask the template for a fork. Its child C, which makes the run's namespaces,
        //    says hello first with its credentials (the kernel translates its pid into
        //    ours) and waits: into the run's cgroup with it before it writes or
        //    allocates anything of the run, so that the namespaces, init and every page
        //    they copy are charged to the run, not to the template. Init (G) is then
        //    born in the run's cgroup.
        //    On v2 the template is given the run's cgroup with the request for a fork,
        //    and clones C straight into it (`clone3` with `CLONE_INTO_CGROUP`); where
        //    it cannot, it forks, and C is moved here, as on v1.
        let conn = UnixStream::connect(socket).map_err(HelperError::ConnectTemplate)?;
        setsockopt(&conn, sockopt::PassCred, &true).map_err(HelperError::PassCredentials)?;
        let conn = OwnedFd::from(conn);
        let cgroup_fd = into.as_ref().map(|fd| [fd.as_raw_fd()]);
        let cmsgs: Vec<ControlMessage> = cgroup_fd.iter().map(|fd| ControlMessage::ScmRights(fd)).collect();
        sendmsg::<()>(
            conn.as_raw_fd(),
            &[io::IoSlice::new(b"fork\n")],
            &cmsgs,
            MsgFlags::empty(),
            None,
        )
        .map_err(HelperError::AskForFork)?;
        drop(into);
        let child = read_hello(&conn, "the template did not fork in time")?;
        let mut cloned_into_cgroup = false;
        if let Some(cg) = &self.cgroup {
            cloned_into_cgroup = cg.v2_path().is_some() && cg.holds(child);
            if !cloned_into_cgroup {
                cg.add(child)?;
            }
        }
        // The template waits at nice 19 (its forks are mostly refills); a fork a request
        // waits for is set up at the normal priority: its init and program inherit it.
        // (With the whole fork at nice 19, the 8-client throughput fell from 111 to 80
        // runs/s.)
        if !prepare.background && crate::priority::can_restore() {
            let _ = crate::priority::set_nice(child, prepare.nice);
        }

        // 4. Then the run's request: the limits its init needs for the mounts and its
        //    program for the rlimits, and the run's ends of the channels.
        let request = serde_json::json!({ "limits": &prepare.limits, "max_code_bytes": prepare.max_code_bytes });
        let line = serde_json::to_vec(&request).map_err(HelperError::Encode)?;
        let fds = [
            report_init.as_raw_fd(),
            stdin_r.as_raw_fd(),
            stdout_w.as_raw_fd(),
            stderr_w.as_raw_fd(),
            go_r.as_raw_fd(),
        ];
        sendmsg::<()>(
            conn.as_raw_fd(),
            &[io::IoSlice::new(&line)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .map_err(HelperError::SendForkRequest)?;
        drop((conn, report_init, stdin_r, stdout_w, stderr_w, go_r));
        let report = OwnedFd::from(report);

        // 5. The run's init says hello the same way once its mounts are made.
        let pid = read_hello(&report, "the run's init did not start in time")?;
        // SAFETY: a plain system call; it returns a new descriptor or -1.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
        if pidfd < 0 {
            return Err(HelperError::PidfdOpen(io::Error::last_os_error()));
        }
        // SAFETY: pidfd_open returned a fresh descriptor, owned from here on.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
        self.init = Some(Pid::from_raw(pid));
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        self.forked = Some(Forked {
            pidfd,
            root: root.clone(),
            work: None,
            cloned_into_cgroup,
        });
        let writer = report.try_clone().map_err(HelperError::DupReport)?;
        self.from_init = Some(Lines::new(report, MAX_SHORT_LINE));
        self.to_init = Some(writer);
        self.go_w = Some(OwnedFd::from(go_w));
        self.stdin_w = Some(stdin_w);
        self.stdout_r = Some(stdout_r);
        self.stderr_r = Some(stderr_r);
        match self.read_init_report(SETUP_TIMEOUT)? {
            InitReport::Ready => {}
            InitReport::SetupFailed { message } => return Err(HelperError::SetupFailed(message)),
            other => return Err(HelperError::UnexpectedInitReport(format!("{other:?}"))),
        }

        // 6. Hold the run's working directory: collection reads it after init is gone.
        let work = nix::fcntl::open(
            &root.join("mnt/data"),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(HelperError::OpenWorkDir)?;
        // SAFETY: open returned a fresh descriptor.
        let work = unsafe { OwnedFd::from_raw_fd(work) };
        if let Some(f) = self.forked.as_mut() {
            f.work = Some(work);
        }
        if let Some(channel) = &prepare.tools {
            let path = self.code_dir().join("tools.sock");
            let hub = self
                .as_owner(|| ToolHub::bind(&path, channel.clone()))
                .map_err(HelperError::ToolSocket)?;
            self.tools = Some(hub);
        }
        Ok(())
    }

    fn read_init_report(&mut self, wait: Duration) -> Result<InitReport, HelperError> {
        let lines = self.from_init.as_mut().ok_or(HelperError::InitPipeClosed)?;
        let deadline = Instant::now() + wait;
        loop {
            if let Some(line) = lines.take_line() {
                return serde_json::from_slice(&line).map_err(HelperError::BadInitReport);
            }
            if lines.eof {
                return Err(HelperError::InitExitedDuringSetup);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !wait_readable(&lines.fd, left).map_err(HelperError::InitChannel)? {
                return Err(HelperError::InitSetupTimedOut);
            }
            lines.fill().map_err(HelperError::InitChannel)?;
        }
    }

    /// Waits until the launched program writes `ready\n` on fd 3, at most `wait`. Anything
    /// else (EOF, other bytes, the wait running out) just ends the wait: the sandbox is
    /// then handed out as it is, and its run pays for what is left of the warm-up.
    fn wait_program_ready(&mut self, wait: std::time::Duration) -> bool {
        let Some(fd) = self.go_w.as_ref() else {
            return false;
        };
        let deadline = std::time::Instant::now() + wait;
        let mut got = Vec::new();
        // Exactly the bytes of `ready\n`: nothing after it may be consumed here.
        while got.len() < b"ready\n".len() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || !matches!(crate::io::wait_readable(fd, left), Ok(true)) {
                return false;
            }
            let mut buf = vec![0u8; b"ready\n".len() - got.len()];
            match crate::io::read_some(fd, &mut buf) {
                Ok(0) | Err(_) => return false,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            if !b"ready\n".starts_with(&got) {
                return false;
            }
        }
        true
    }

    /// Tells init to fork and exec the program.
    fn start_program(&mut self, program: &InitRun) -> Result<(), HelperError> {
        let message = serde_json::to_vec(program).map_err(HelperError::Encode)?;
        let to_init = self.to_init.take().ok_or(HelperError::InitPipeClosed)?;
        write_all(&to_init, &message)
            .and_then(|()| write_all(&to_init, b"\n"))
            .map_err(HelperError::StartProgram)
    }

    fn reap_init(&mut self) {
        self.kill_init();
        if let Some(f) = &self.forked {
            // Not our child: its pidfd turns readable once it has exited, which for the
            // init of a pid namespace is after every other process of it is gone.
            while let Ok(false) = wait_readable(&f.pidfd, Duration::from_secs(60)) {}
            self.init = None;
        }
        if let Some(pid) = self.init.take() {
            let _ = waitpid(pid, Some(WaitPidFlag::__WALL));
        }
    }

    fn kill_init(&self) {
        self.init_handle().kill();
    }

    /// What kills init: its pid (our child), or a forked run's pidfd.
    fn init_handle(&self) -> InitHandle<'_> {
        match &self.forked {
            Some(f) => InitHandle::Pidfd(f.pidfd.as_fd()),
            None => InitHandle::Pid(self.init),
        }
    }

    /// Kills what is left and removes every trace: processes, cgroup, mounts, directory.
    fn teardown(mut self) {
        if self.init.is_some() {
            self.reap_init();
        }
        self.to_init = None;
        self.egress = None;
        self.net_ns = None;
        // A forked run's tmpfs mounts go with the last descriptor on them.
        self.forked = None;
        if let Some(path) = self.template_socket.take() {
            let _ = fs::remove_file(path);
        }
        self.from_init = None;
        if let Some(cg) = self.cgroup.take() {
            if let Err(e) = cg.destroy() {
                eprintln!("sandcall helper: removing cgroup: {e}");
            }
        }
        if self.work_mounted {
            let _ = umount2(&self.staging.join("work"), MntFlags::MNT_DETACH);
        }
        if self.staging_mounted {
            let _ = umount2(&self.staging, MntFlags::MNT_DETACH);
        }
        // Only the empty host directory is left under the mounts; removing it
        // refuses if anything unexpected is in it.
        if let Err(e) = fs::remove_dir(&self.staging) {
            if e.kind() != io::ErrorKind::NotFound {
                eprintln!("sandcall helper: removing {}: {e}", self.staging.display());
            }
        }
    }
}

/// Reads the `hello` that a process of a forked run sends on its report socket with
/// its credentials (`SCM_CREDENTIALS`: the kernel translates its pid into ours), and
/// returns that pid. Reads no further than the hello, so that init's next report stays
/// in the socket. A setup failure reported instead becomes the error.
fn read_hello(report: &OwnedFd, late: &'static str) -> Result<i32, HelperError> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    const HELLO: &[u8] = b"hello\n";
    if !wait_readable(report, SETUP_TIMEOUT).map_err(HelperError::InitChannel)? {
        return Err(HelperError::HelloTimedOut(late));
    }
    let mut buf = [0u8; 512];
    let mut space = nix::cmsg_space!(nix::sys::socket::UnixCredentials);
    let (pid, text) = {
        let mut iov = [io::IoSliceMut::new(&mut buf[..HELLO.len()])];
        let msg = recvmsg::<()>(
            report.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(HelperError::ReadHello)?;
        let pid = msg.cmsgs().map_err(HelperError::ReadHello)?.find_map(|c| match c {
            ControlMessageOwned::ScmCredentials(creds) => Some(creds.pid()),
            _ => None,
        });
        (pid, msg.bytes)
    };
    match pid {
        Some(pid) if pid > 0 && &buf[..text] == HELLO => Ok(pid),
        _ => {
            // Anything else is a report of a failed setup, or nothing: read its line.
            let mut len = text;
            while text > 0 && len < buf.len() && !buf[..len].ends_with(b"\n") {
                match read_some(report, &mut buf[len..]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => len += n,
                }
            }
            Err(
                match serde_json::from_slice::<InitReport>(buf[..len].trim_ascii_end()) {
                    Ok(InitReport::SetupFailed { message }) => HelperError::SetupFailed(message),
                    _ => HelperError::NoHello,
                },
            )
        }
    }
}

/// Maps `inside` to `uid`/`gid` of the parent user namespace for process `pid` (or
/// "self"). setgroups is denied first: the kernel requires it before an unprivileged gid
/// map, and gVisor's kernel before either map.
fn write_id_maps(pid: &str, inside: u32, uid: u32, gid: u32) -> Result<(), HelperError> {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let write = |file: &'static str, content: String| {
        fs::write(proc_dir.join(file), content).map_err(|source| HelperError::WriteIdMap { file, source })
    };
    // gVisor's kernel has no setgroups file (and needs none written).
    if proc_dir.join("setgroups").exists() {
        write("setgroups", "deny".into())?;
    }
    write("uid_map", format!("{inside} {uid} 1\n"))?;
    write("gid_map", format!("{inside} {gid} 1\n"))
}

/// How the helper reaches a sandbox's init.
#[derive(Clone, Copy)]
enum InitHandle<'a> {
    /// Our child, cloned by `Sandbox::build`.
    Pid(Option<Pid>),
    /// A forked run's init, which is not our child; a pidfd cannot name a recycled pid.
    Pidfd(BorrowedFd<'a>),
}

impl InitHandle<'_> {
    /// SIGKILL to the sandbox's init: the kernel then kills every process of its pid
    /// namespace.
    fn kill(self) {
        match self {
            InitHandle::Pid(pid) => kill_pid(pid),
            InitHandle::Pidfd(fd) => {
                // SAFETY: a plain system call on a descriptor we hold.
                unsafe {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        fd.as_raw_fd(),
                        libc::SIGKILL,
                        std::ptr::null::<libc::siginfo_t>(),
                        0u32,
                    )
                };
            }
        }
    }
}

/// SIGKILL to the sandbox's init: the kernel then kills every process of its pid
/// namespace.
fn kill_pid(init: Option<Pid>) {
    if let Some(pid) = init {
        let _ = kill(pid, Signal::SIGKILL);
    }
}
