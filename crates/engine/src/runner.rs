//! Starts sandbox helpers and talks to them. The server never forks or enters
//! namespaces itself: each run is a fresh `sandcall sandbox-helper` process, forked by
//! the helper launcher (`crate::launcher`) once one runs, exec'd by the server otherwise.

use crate::gvisor::{Gvisor, RunView};
use crate::isolation::HelperChannel;
use crate::launcher::{ForkedHelper, Launcher};
pub use crate::run::{RunError, RunSpec};
use sandcall_sandbox::cgroup::{CgroupRoot, RunCgroup};
use sandcall_sandbox::priority;
use sandcall_sandbox::protocol::{Event, Launch, Limits, Prepare, Run, RunResult, ToolChannel, ToolReply};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader, Lines};
use tokio::net::unix::pipe;
use tokio::process::Command;
use tokio::sync::watch;

/// A template ("zygote") ready to fork: its id (its cgroup's name), the socket it
/// listens on, and the hash seed its runs share.
#[derive(Debug, Clone)]
pub struct Template {
    pub id: String,
    pub socket: PathBuf,
    pub seed: u32,
}

/// What the runner needs from the configuration.
#[derive(Debug, Clone)]
pub struct RunnerSettings {
    pub helper_exe: PathBuf,
    pub runs_dir: PathBuf,
    pub cgroups: CgroupRoot,
    pub extra_runtime_paths: Vec<PathBuf>,
    /// The npm packages for programs, bound at `/node_modules` (`npm_runtime`).
    pub node_modules: Option<PathBuf>,
    pub host_uid: u32,
    pub host_gid: u32,
    pub max_code_bytes: u64,
    /// The server's nice value, which runs run at (`Prepare::nice`).
    pub nice: i32,
    /// The `gvisor` tier: each helper runs in a gVisor sandbox of its own
    /// (`crate::gvisor`). None: helpers run on the host (the `namespace` tier).
    pub gvisor: Option<Arc<Gvisor>>,
}

impl RunnerSettings {
    /// The settings of a server (or `doctor`) with `config` on `host`: helpers are
    /// `helper_exe`, in the tier `config` names (`gvisor` for that one).
    pub fn new(
        config: &sandcall_config::Config,
        host: &crate::host::Host,
        helper_exe: PathBuf,
        gvisor: Option<Arc<Gvisor>>,
    ) -> RunnerSettings {
        let (extra_runtime_paths, node_modules) = crate::runtime::program_host_paths(config);
        RunnerSettings {
            helper_exe,
            runs_dir: host.runs_dir.clone(),
            cgroups: host.cgroups.clone(),
            extra_runtime_paths,
            node_modules,
            host_uid: host.host_uid,
            host_gid: host.host_gid,
            max_code_bytes: config.limits.max_code_bytes,
            nice: priority::nice_of(0).unwrap_or(0),
            gvisor,
        }
    }
}

#[derive(Clone)]
pub struct Runner {
    settings: Arc<RunnerSettings>,
    active: Arc<AtomicUsize>,
    shutdown: watch::Receiver<bool>,
    /// Why the most recent run could not get a sandbox, until a later run gets one.
    failing: Arc<Mutex<Option<String>>>,
    /// Forks helpers once `start_launcher` ran; until then (and while it is being
    /// replaced) helpers are exec'd.
    launcher: Arc<Launcher>,
}

/// Counts a helper as alive from spawn to reaped.
struct ActiveGuard(Arc<AtomicUsize>);

impl ActiveGuard {
    fn new(active: Arc<AtomicUsize>) -> Self {
        active.fetch_add(1, Ordering::SeqCst);
        ActiveGuard(active)
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Runner {
    pub fn new(settings: RunnerSettings, shutdown: watch::Receiver<bool>) -> Self {
        Runner {
            launcher: Arc::new(Launcher::new(settings.helper_exe.clone())),
            settings: Arc::new(settings),
            active: Arc::new(AtomicUsize::new(0)),
            shutdown,
            failing: Arc::new(Mutex::new(None)),
        }
    }

    /// Starts the helper launcher: from now on helpers are forked from it. If it cannot
    /// start, helpers are exec'd as before (the reason is logged).
    pub async fn start_launcher(&self) {
        // A gVisor sandbox is started by `runsc`, never forked.
        if self.settings.gvisor.is_some() {
            return;
        }
        if let Err(e) = self.launcher.start().await {
            tracing::warn!("{e}; sandbox helpers are exec'd meanwhile");
        }
    }

    /// Helpers alive right now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// Set while sandboxes cannot be built: the reason, fit for clients (no host paths).
    pub fn failing(&self) -> Option<String> {
        self.failing
            .lock()
            .map(|g| g.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Notes a sandbox failure for the health route.
    pub fn record_failure(&self, error: &RunError) {
        let mut guard = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        *guard = Some(match error {
            RunError::Spawn(_) => "the sandbox helper cannot be started".to_string(),
            RunError::Protocol(_) | RunError::Sandbox(_) => "the last sandbox could not be built".to_string(),
        });
    }

    fn record(&self, result: &Result<RunResult, RunError>) {
        let reason = match result {
            Ok(_) => None,
            Err(RunError::Spawn(_)) => Some("the sandbox helper cannot be started".to_string()),
            Err(RunError::Protocol(_) | RunError::Sandbox(_)) => {
                Some("the last sandbox could not be built".to_string())
            }
        };
        let mut guard = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        *guard = reason;
    }

    pub fn settings(&self) -> &RunnerSettings {
        &self.settings
    }

    /// Runs one program to its end in a fresh sandbox. The work happens in its own task,
    /// so a client that goes away does not leave a half-reclaimed sandbox behind.
    /// `hold` (an admission slot, say) is kept until the run is over.
    pub async fn run<H: Send + 'static>(&self, spec: RunSpec, hold: H) -> Result<RunResult, RunError> {
        let this = self.clone();
        self.detached(async move { this.run_inner(spec).await }, hold).await
    }

    /// Runs `work` in a task of its own, keeping `hold` until it is done, and notes its
    /// outcome for the health route.
    async fn detached<H: Send + 'static>(
        &self,
        work: impl std::future::Future<Output = Result<RunResult, RunError>> + Send + 'static,
        hold: H,
    ) -> Result<RunResult, RunError> {
        let this = self.clone();
        let task = async move {
            let result = work.await;
            this.record(&result);
            drop(hold);
            result
        };
        match tokio::spawn(task).await {
            Ok(r) => r,
            Err(e) => Err(RunError::Protocol(format!("run task failed: {e}"))),
        }
    }

    /// Like `run`, in a sandbox that `start` starts (a warm one's `begin`, say).
    pub async fn run_started<H: Send + 'static>(
        &self,
        start: impl std::future::Future<Output = Result<Box<dyn HelperChannel>, RunError>> + Send + 'static,
        hold: H,
    ) -> Result<RunResult, RunError> {
        let this = self.clone();
        self.detached(async move { this.finish(start.await?).await }, hold)
            .await
    }

    async fn run_inner(&self, spec: RunSpec) -> Result<RunResult, RunError> {
        let helper = self.start(spec).await?;
        self.finish(Box::new(helper)).await
    }

    /// Waits for the program to end (or kills it at shutdown), then for the helper.
    async fn finish(&self, mut helper: Box<dyn HelperChannel>) -> Result<RunResult, RunError> {
        let mut shutdown = self.shutdown.clone();
        let outcome = loop {
            let event = tokio::select! {
                event = helper.next_event() => event,
                _ = async { let _ = shutdown.wait_for(|stop| *stop).await; }, if !helper.aborted() => {
                    helper.abort();
                    continue;
                }
            };
            match event {
                Ok(Event::Finished { result }) => break Ok(result),
                Ok(Event::Failed { message }) => break Err(RunError::Sandbox(message)),
                // A plain run in a warm sandbox (which has a tool socket) gets an answer
                // for any call it makes, so the helper never holds it.
                Ok(Event::ToolCall { key, .. }) => {
                    let reply = ToolReply::error("refused", "this run declared no tools");
                    let _ = helper
                        .send(&sandcall_sandbox::protocol::Command::Reply { key, reply })
                        .await;
                }
                Ok(_) => {}
                Err(e) => break Err(e),
            }
        };
        // The helper answers before it removes the cgroup and mounts; it is reaped (and
        // still counted as active) in the background.
        tokio::spawn(async move { helper.wait().await });
        outcome
    }

    /// Builds a sandbox and starts the program in it; the caller drives the rest.
    pub async fn start(&self, mut spec: RunSpec) -> Result<Helper, RunError> {
        let mut prepare = self.prepare_message(spec.run_id.clone(), spec.limits.clone(), None, spec.tools.clone());
        prepare.egress = spec.egress.is_some();
        // A gVisor sandbox reaches the run's proxy through a channel passed in at its
        // start (`gvisor::egress_channel`).
        let passed = match (&self.settings.gvisor, spec.egress.as_mut()) {
            (Some(_), Some(egress)) => Some(crate::gvisor::egress_channel(egress).map_err(RunError::Spawn)?),
            _ => None,
        };
        let mut helper = self.prepare_passing(&prepare, passed).await?;
        match helper.send_run(spec).await {
            Ok(()) => Ok(helper),
            Err(e) => Err(helper.reclaim(e).await),
        }
    }

    /// A warm sandbox: built, its program launched and waiting for `Helper::begin`.
    /// Built in the background (`Prepare::background`): it is for a later request.
    pub async fn prepare_warm(
        &self,
        run_id: String,
        limits: Limits,
        launch: Launch,
        tools: ToolChannel,
    ) -> Result<Helper, RunError> {
        let mut prepare = self.prepare_message(run_id, limits, Some(launch), Some(tools));
        prepare.background = true;
        self.prepare(&prepare).await
    }

    /// What a helper needs to build a sandbox for run `run_id`.
    fn prepare_message(
        &self,
        run_id: String,
        limits: Limits,
        launch: Option<Launch>,
        tools: Option<ToolChannel>,
    ) -> Prepare {
        let s = &self.settings;
        let cgroup = match s.gvisor {
            Some(_) => Gvisor::inner_cgroups().placement(&run_id),
            None => s.cgroups.placement(&run_id),
        };
        Prepare {
            staging_dir: s.runs_dir.join(&run_id),
            cgroup,
            run_id,
            limits,
            extra_runtime_paths: s.extra_runtime_paths.clone(),
            node_modules: s.node_modules.clone(),
            host_uid: s.host_uid,
            host_gid: s.host_gid,
            max_code_bytes: s.max_code_bytes,
            launch,
            tools,
            template: None,
            fork_from: None,
            background: false,
            nice: s.nice,
            helper_exe: Some(s.helper_exe.clone()),
            egress: false,
        }
    }

    /// A template ("zygote", `runtime/zygote.py`) started with `launch` and listening at
    /// `socket`: the helper answers once it is ready to fork. The returned helper's next
    /// event comes when the template exits.
    pub async fn prepare_template(
        &self,
        run_id: String,
        limits: Limits,
        launch: Launch,
        socket: PathBuf,
    ) -> Result<Helper, RunError> {
        let mut prepare = self.prepare_message(run_id, limits, Some(launch), None);
        prepare.cgroup = self.settings.cgroups.template_placement(&prepare.run_id);
        prepare.template = Some(socket);
        // Its forks are mostly refills; a run forked from it is raised at its `Run`.
        prepare.background = true;
        self.prepare(&prepare).await
    }

    /// A warm sandbox forked from `template`: like
    /// `prepare_warm`, its program is started and waits for `Helper::begin`.
    /// `background` for a refill, not for a request waiting on this fork.
    pub async fn prepare_forked(
        &self,
        run_id: String,
        limits: Limits,
        tools: ToolChannel,
        template: &Template,
        background: bool,
    ) -> Result<Helper, RunError> {
        let mut prepare = self.prepare_message(run_id, limits, None, Some(tools));
        prepare.cgroup = self.settings.cgroups.forked_placement(&template.id, &prepare.run_id);
        prepare.fork_from = Some(template.socket.clone());
        prepare.background = background;
        self.prepare(&prepare).await
    }

    /// Starts a helper: in a gVisor sandbox of its own for the `gvisor` tier (with the
    /// host cgroup it runs in), else forked by the launcher, or exec'd if there is none
    /// right now. Returns it with the server's ends of its stdin and stdout.
    async fn spawn_helper(
        &self,
        prepare: &Prepare,
        passed: Option<OwnedFd>,
    ) -> Result<(Process, OwnedFd, OwnedFd, Option<Outer>), RunError> {
        if let Some(gvisor) = &self.settings.gvisor {
            return spawn_in_gvisor(gvisor, prepare, passed).await;
        }
        let ends = HelperPipes::new().map_err(RunError::Spawn)?;
        if let Some(forked) = self.launcher.fork(&ends.helper_stdin, &ends.helper_stdout).await {
            return Ok((Process::Forked(forked), ends.stdin, ends.stdout, None));
        }
        // Fresh pipes: a fork the launcher answered too late for may hold the first ones.
        drop(ends);
        let ends = HelperPipes::new().map_err(RunError::Spawn)?;
        let mut command = Command::new(&self.settings.helper_exe);
        command.arg("sandbox-helper").env_clear();
        let child = spawn_with(command, ends.helper_stdin, ends.helper_stdout).map_err(RunError::Spawn)?;
        Ok((Process::Spawned(child), ends.stdin, ends.stdout, None))
    }

    /// Spawns a helper and has it build a sandbox.
    async fn prepare(&self, prepare: &Prepare) -> Result<Helper, RunError> {
        self.prepare_passing(prepare, None).await
    }

    /// `prepare`, with `passed` handed to a gVisor sandbox as its egress channel.
    async fn prepare_passing(&self, prepare: &Prepare, passed: Option<OwnedFd>) -> Result<Helper, RunError> {
        let started = std::time::Instant::now();
        let guard = ActiveGuard::new(self.active.clone());
        let (child, stdin, stdout, outer) = self.spawn_helper(prepare, passed).await?;
        // A gVisor sandbox waits at a low CPU weight instead (`spawn_in_gvisor`).
        let lowered = prepare.background && priority::can_restore() && outer.is_none();
        if lowered {
            // Lowered at once, for its own start too; the helper raises itself again at
            // its `Run` (`sandcall_sandbox::priority`).
            if let Some(pid) = child.id() {
                let _ = priority::set_nice(pid as i32, priority::BACKGROUND_NICE);
            }
        }
        let stdin = pipe::Sender::from_owned_fd(stdin).map_err(RunError::Spawn)?;
        let stdout = pipe::Receiver::from_owned_fd(stdout).map_err(RunError::Spawn)?;
        let mut helper = Helper {
            run_id: prepare.run_id.clone(),
            child,
            stdin: Some(spawn_writer(stdin)),
            events: BufReader::new(stdout).lines(),
            parsing: None,
            hash_seed: None,
            outer,
            collect: None,
            finishing: None,
            running: None,
            _guard: guard,
        };

        let ready = async {
            helper.send(prepare).await?;
            match helper.next_event().await? {
                Event::Ready { cloned_into_cgroup } => {
                    if let Some(cloned) = cloned_into_cgroup {
                        let how = if cloned { "cloned" } else { "moved" };
                        metrics::counter!(crate::telemetry::FORKED_RUNS, "cgroup" => how).increment(1);
                    }
                    Ok(())
                }
                Event::Failed { message } => Err(RunError::Sandbox(message)),
                other => Err(RunError::Protocol(format!("expected ready, got {other:?}"))),
            }
        }
        .await;
        match ready {
            Ok(()) => {
                let warm = prepare.launch.is_some().to_string();
                metrics::histogram!(crate::telemetry::BUILD_SECONDS, "warm" => warm)
                    .record(started.elapsed().as_secs_f64());
                Ok(helper)
            }
            Err(e) => Err(helper.reclaim(e).await),
        }
    }
}

/// Starts a helper in a gVisor sandbox of its own, in a host cgroup made for it, with
/// `passed` as its egress channel, at the lowest CPU weight when it is
/// `Prepare::background` work (`Helper::send_run` gives it the default back).
/// The server keeps no copy of `passed`: the channel closes when the sandbox ends.
async fn spawn_in_gvisor(
    gvisor: &Gvisor,
    prepare: &Prepare,
    passed: Option<OwnedFd>,
) -> Result<(Process, OwnedFd, OwnedFd, Option<Outer>), RunError> {
    let cgroup = gvisor
        .host_cgroup(&prepare.run_id, &prepare.limits)
        .map_err(RunError::Spawn)?;
    if prepare.background {
        if let Err(e) = cgroup.set_cpu_weight(true) {
            tracing::warn!("cannot lower a warm gVisor sandbox's CPU weight: {e}");
        }
    }
    let view = match gvisor.view(&prepare.run_id) {
        Ok(view) => std::sync::Arc::new(view),
        Err(e) => {
            let _ = tokio::task::spawn_blocking(move || cgroup.destroy()).await;
            return Err(RunError::Spawn(e));
        }
    };
    let outer = Outer { cgroup, view };
    let started = HelperPipes::new().and_then(|ends| {
        let command = gvisor.command(&prepare.run_id, &outer.view, &outer.cgroup, passed)?;
        let child = spawn_with(command, ends.helper_stdin, ends.helper_stdout)?;
        Ok((child, ends.stdin, ends.stdout))
    });
    match started {
        Ok((child, stdin, stdout)) => Ok((Process::Spawned(child), stdin, stdout, Some(outer))),
        Err(e) => {
            let _ = tokio::task::spawn_blocking(move || outer.remove()).await;
            Err(RunError::Spawn(e))
        }
    }
}

/// A helper's gVisor sandbox as the host holds it (the `gvisor` tier): its host cgroup,
/// and its bundle and own directories.
struct Outer {
    cgroup: RunCgroup,
    view: std::sync::Arc<RunView>,
}

impl Outer {
    /// Kills whatever of the sandbox is left, and removes its cgroup and directories.
    fn remove(self) {
        let _ = self.cgroup.destroy();
        self.view.remove();
    }
}

/// Spawns `command` as a helper with the given ends of its pipes as its stdin and
/// stdout.
fn spawn_with(mut command: Command, stdin: OwnedFd, stdout: OwnedFd) -> std::io::Result<tokio::process::Child> {
    command
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::inherit());
    // Spawned from an async worker, never from a blocking-pool thread: the helper's
    // parent-death signal fires when the *thread* that spawned it exits, and idle
    // blocking threads do exit.
    let child = command.spawn()?;
    // The command holds the helper's ends: the server must not, or it would never see
    // the helper's stdout close.
    drop(command);
    Ok(child)
}

/// How often a gVisor sandbox's host cgroup is checked for its memory limit.
const MEMORY_WATCH: std::time::Duration = std::time::Duration::from_millis(50);

/// Ends a running gVisor sandbox once its host cgroup reaches its memory limit. gVisor's
/// kernel answers an allocation the host refuses with a failed allocation, which a
/// program may retry for ever; the host kernel ends the run there in the `namespace`
/// tier, and so does this in the `gvisor` tier (the run is reported out of memory:
/// `Helper::outer_end`). Stops when the cgroup is gone.
async fn end_at_memory_limit(watch: sandcall_sandbox::cgroup::CgroupWatch) {
    let mut tick = tokio::time::interval(MEMORY_WATCH);
    loop {
        tick.tick().await;
        if !watch.exists() {
            return;
        }
        if watch.memory_limit_hit() {
            let _ = tokio::task::spawn_blocking(move || watch.kill()).await;
            return;
        }
    }
}

/// The run message of a spec.
fn run_message(spec: RunSpec) -> Run {
    Run {
        code: spec.code,
        code_file: spec.code_file,
        support_files: spec.support_files,
        argv: spec.argv,
        go: spec.go,
        env: spec.env,
        stdin: spec.stdin,
        timeout_ms: spec.timeout_ms,
        inputs: spec.inputs,
        collect: spec.collect,
        egress: spec.egress,
    }
}

/// The two pipes of a helper, all four ends close-on-exec (a helper's ends lose that
/// flag only as its stdin and stdout).
struct HelperPipes {
    /// The server's ends.
    stdin: OwnedFd,
    stdout: OwnedFd,
    /// The helper's.
    helper_stdin: OwnedFd,
    helper_stdout: OwnedFd,
}

impl HelperPipes {
    fn new() -> std::io::Result<Self> {
        let cloexec = nix::fcntl::OFlag::O_CLOEXEC;
        let (helper_stdin, stdin) = nix::unistd::pipe2(cloexec)?;
        let (stdout, helper_stdout) = nix::unistd::pipe2(cloexec)?;
        Ok(HelperPipes {
            stdin,
            stdout,
            helper_stdin,
            helper_stdout,
        })
    }
}

/// A helper process: exec'd by the server (tokio waits for and reaps it), or forked by
/// the launcher as the server's child (`ForkedHelper` does).
enum Process {
    Spawned(tokio::process::Child),
    Forked(ForkedHelper),
}

impl Process {
    fn id(&self) -> Option<u32> {
        match self {
            Process::Spawned(child) => child.id(),
            Process::Forked(child) => Some(child.id()),
        }
    }

    /// Waits for the helper to exit, and reaps it.
    async fn wait(&mut self) {
        match self {
            Process::Spawned(child) => {
                let _ = child.wait().await;
            }
            Process::Forked(child) => child.wait().await,
        }
    }
}

/// A running sandbox helper: its events, and the commands it takes.
pub struct Helper {
    run_id: String,
    child: Process,
    /// Lines for the helper's stdin, written by a task of their own: a sender never
    /// waits on the helper, so the helper and the server can never block on each other.
    /// Dropping it closes the helper's stdin (abort).
    stdin: Option<tokio::sync::mpsc::UnboundedSender<Vec<u8>>>,
    events: Lines<BufReader<pipe::Receiver>>,
    /// A large event being parsed on a blocking thread. Kept here, not in the future of
    /// `next_event`, so that a caller that drops that future (a `select!` whose other
    /// branch won) loses nothing: the next call takes the same parse up again.
    parsing: Option<tokio::task::JoinHandle<serde_json::Result<Event>>>,
    /// The `PYTHONHASHSEED` a warm sandbox's program was started with, if it was set.
    hash_seed: Option<u32>,
    /// The helper's gVisor sandbox's host cgroup and own directories (the `gvisor` tier),
    /// removed once the helper is reaped.
    outer: Option<Outer>,
    /// Where the run's output files go (the `gvisor` tier): copied out of the sandbox's
    /// own outbox when it finishes (`RunView::take_outbox`).
    collect: Option<sandcall_sandbox::protocol::Collect>,
    /// A finished run's output files being copied out of its gVisor sandbox, then its
    /// `Finished`. Kept here for the same reason as `parsing`.
    finishing: Option<tokio::task::JoinHandle<Event>>,
    /// When the program was sent its `Run`.
    running: Option<std::time::Instant>,
    _guard: ActiveGuard,
}

impl Helper {
    /// Names the sandbox's cgroup and staging directory; a warm sandbox's run takes it
    /// as its session id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The `PYTHONHASHSEED` the warm program started with (`Pool`), if any: a
    /// programmatic session journals it, so that its replay hashes alike.
    pub fn hash_seed(&self) -> Option<u32> {
        self.hash_seed
    }

    pub fn set_hash_seed(&mut self, seed: u32) {
        self.hash_seed = Some(seed);
    }

    /// The helper's next event. Cancel-safe: reading a line is, and a large line's parse
    /// and a finished run's copy of its outputs outlive a dropped call (see `parsing`
    /// and `finishing`).
    pub async fn next_event(&mut self) -> Result<Event, RunError> {
        if self.finishing.is_none() {
            let event = self.read_event().await?;
            if !matches!(event, Event::Finished { .. }) {
                return Ok(event);
            }
            let (Some(collect), Some(outer)) = (self.collect.take(), &self.outer) else {
                return Ok(event);
            };
            let view = outer.view.clone();
            self.finishing = Some(tokio::task::spawn_blocking(move || {
                if let Err(e) = view.take_outbox(&collect.outbox, collect.max_files, collect.max_total_bytes) {
                    tracing::warn!("copying a run's output files out of its gVisor sandbox: {e}");
                }
                event
            }));
        }
        let Some(finishing) = self.finishing.as_mut() else {
            return Err(RunError::Protocol("no run finishing".into()));
        };
        let done = finishing.await;
        self.finishing = None;
        done.map_err(|e| RunError::Protocol(format!("copying a run's output files: {e}")))
    }

    /// `next_event`, before a finished run's outputs are copied out of its gVisor sandbox.
    async fn read_event(&mut self) -> Result<Event, RunError> {
        if self.parsing.is_none() {
            let line = match self.events.next_line().await {
                Ok(Some(line)) => line,
                Ok(None) => {
                    return match self.outer_end() {
                        Some(result) => Ok(Event::Finished { result }),
                        None => Err(RunError::Protocol("helper exited without an answer".into())),
                    }
                }
                Err(e) => return Err(RunError::Protocol(format!("reading from helper: {e}"))),
            };
            if !crate::json::is_large(line.as_bytes()) {
                return serde_json::from_str(&line)
                    .map_err(bad_event)
                    .map(|e| self.with_outer(e));
            }
            self.parsing = Some(tokio::task::spawn_blocking(move || serde_json::from_str(&line)));
        }
        let Some(parsing) = self.parsing.as_mut() else {
            return Err(RunError::Protocol("no event being parsed".into()));
        };
        let parsed = parsing.await;
        self.parsing = None;
        match parsed {
            Ok(event) => event.map_err(bad_event).map(|e| self.with_outer(e)),
            Err(e) => Err(RunError::Protocol(format!("parsing an event: {e}"))),
        }
    }

    pub async fn send<T: serde::Serialize>(&mut self, message: &T) -> Result<(), RunError> {
        send(&mut self.stdin, message).await
    }

    /// A run's end as its gVisor sandbox's host cgroup saw it (the `gvisor` tier): gVisor's
    /// kernel enforces no memory limit of its own and accounts no peak, so the sandbox's
    /// host cgroup says both. A run whose sandbox reached the limit ran out of memory,
    /// whatever its program made of the failed allocation.
    fn with_outer(&self, event: Event) -> Event {
        let Some(outer) = &self.outer else { return event };
        let Event::Finished { mut result } = event else {
            return event;
        };
        let usage = outer.cgroup.usage();
        result.memory_peak_bytes = result.memory_peak_bytes.max(usage.memory_peak_bytes);
        // Ended as the host kernel ends a run that outgrows its limit, whether gVisor's
        // kernel failed the allocation first (the program may have exited on its own) or
        // the host's ended the program (docs/isolation.md).
        if usage.memory_limit_hit && !result.timed_out && !result.aborted {
            result.oom_killed = true;
            result.signal = Some("SIGKILL".into());
            result.exit_code = None;
        }
        Event::Finished { result }
    }

    /// Sends the run's program its `Run`.
    async fn send_run(&mut self, mut spec: RunSpec) -> Result<(), RunError> {
        if let Some(outer) = &self.outer {
            // The run's inputs, copied where its gVisor sandbox alone sees them.
            let view = outer.view.clone();
            let mut inputs = std::mem::take(&mut spec.inputs);
            spec.inputs = tokio::task::spawn_blocking(move || view.stage_inputs(&mut inputs).map(|()| inputs))
                .await
                .map_err(|e| RunError::Sandbox(format!("staging the run's inputs: {e}")))?
                .map_err(|e| RunError::Sandbox(format!("staging the run's inputs: {e}")))?;
            self.collect = spec.collect.clone();
            // A sandbox built in the background waited at the lowest CPU weight: the
            // helper's priorities are gVisor's, which the host never sees, while the
            // weight holds for all that runs on the host (gVisor's kernel, the
            // program's stubs, the file proxy), started before or after.
            if let Err(e) = outer.cgroup.set_cpu_weight(false) {
                tracing::warn!("cannot give a gVisor sandbox its CPU weight back: {e}");
            }
        }
        self.send(&run_message(spec)).await?;
        self.running = Some(std::time::Instant::now());
        if let Some(outer) = &self.outer {
            tokio::spawn(end_at_memory_limit(outer.cgroup.watch()));
        }
        Ok(())
    }

    /// The end of a run whose gVisor sandbox ended without the helper's answer: the host
    /// kernel killed it for outgrowing its cgroup's memory, or the program brought it
    /// down. Either is the run's own doing once its program started, and the run ends
    /// killed (what it printed went with the sandbox). Before that, the sandbox failed.
    fn outer_end(&self) -> Option<RunResult> {
        let usage = self.outer.as_ref()?.cgroup.usage();
        (usage.memory_limit_hit || self.running.is_some()).then(|| RunResult {
            oom_killed: usage.memory_limit_hit,
            signal: Some("SIGKILL".into()),
            cpu_time_ms: usage.cpu_time_ms,
            memory_peak_bytes: usage.memory_peak_bytes,
            wall_time_ms: self.running.map_or(0, |t| t.elapsed().as_millis() as u64),
            ..RunResult::default()
        })
    }

    /// Tells the helper to kill the program and reclaim the sandbox; a `Finished` event
    /// (with `aborted`) follows.
    pub fn abort(&mut self) {
        self.stdin = None;
    }

    /// Starts the program of a warm sandbox (see `Runner::prepare_warm`); on failure the
    /// sandbox is reclaimed.
    pub async fn begin(mut self, spec: RunSpec) -> Result<Helper, RunError> {
        match self.send_run(spec).await {
            Ok(()) => Ok(self),
            Err(e) => Err(self.reclaim(e).await),
        }
    }

    /// Aborts, waits for the helper to reclaim everything, and hands back `error`.
    async fn reclaim(mut self, error: RunError) -> RunError {
        self.abort();
        self.wait().await;
        error
    }

    pub fn aborted(&self) -> bool {
        self.stdin.is_none()
    }

    /// Waits for the helper to exit on its own, its stdin kept open: a template's
    /// helper whose template exited stays until the runs forked from it have ended, and
    /// closing its stdin would kill them.
    pub async fn linger(mut self) {
        self.child.wait().await;
        self.remove_outer().await;
    }

    /// Waits for the helper to exit (it does once everything is reclaimed).
    pub async fn wait(mut self) {
        self.wait_in_place().await;
    }

    /// Closes the helper's stdin and waits for it to exit, keeping the handle.
    pub(crate) async fn wait_in_place(&mut self) {
        self.stdin = None;
        self.child.wait().await;
        self.remove_outer().await;
    }

    /// Removes the host cgroup of the helper's gVisor sandbox, killing whatever of the
    /// sandbox is left in it, and its directories.
    async fn remove_outer(&mut self) {
        if let Some(outer) = self.outer.take() {
            let _ = tokio::task::spawn_blocking(move || outer.remove()).await;
        }
    }
}

async fn send<T: serde::Serialize>(
    stdin: &mut Option<tokio::sync::mpsc::UnboundedSender<Vec<u8>>>,
    message: &T,
) -> Result<(), RunError> {
    let w = stdin
        .as_ref()
        .ok_or_else(|| RunError::Protocol("helper stdin closed".into()))?;
    let mut line = serde_json::to_vec(message).map_err(|e| RunError::Protocol(e.to_string()))?;
    line.push(b'\n');
    w.send(line)
        .map_err(|_| RunError::Protocol("helper stdin closed".into()))
}

/// The task that writes queued lines to a helper's stdin, and closes it when the queue's
/// sender is dropped.
fn spawn_writer(mut stdin: impl AsyncWrite + Unpin + Send + 'static) -> tokio::sync::mpsc::UnboundedSender<Vec<u8>> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            if stdin.write_all(&line).await.is_err() || stdin.flush().await.is_err() {
                break;
            }
        }
    });
    tx
}

fn bad_event(e: serde_json::Error) -> RunError {
    RunError::Protocol(format!("bad event: {e}"))
}
