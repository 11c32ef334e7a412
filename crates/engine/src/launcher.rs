//! The server's side of the helper launcher (`sandcall_sandbox::launcher`): starting it,
//! asking it for a helper, and waiting for and reaping the helpers it forks.
//!
//! The launcher forks each helper as the server's own child (`CLONE_PARENT`), so a
//! helper's life does not depend on the launcher's: if the launcher dies, the helpers it
//! forked run on, the runs that wanted one meanwhile exec the binary as before, and a new
//! launcher is started (at most once a second). A launcher that does not answer in time
//! or answers out of turn is killed and replaced in the same way; whatever it still
//! forked is reaped.
//!
//! The launcher is started from a thread of its own that lives as long as the server
//! (`spawner`): every helper's parent-death signal fires when the *thread* that is its
//! parent exits, and the launcher's children have the launcher's parent thread as theirs.

use nix::errno::Errno;
use nix::sys::socket::{sendmsg, socketpair, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use sandcall_sandbox::launcher::Reply;
use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// How long the launcher may take to answer before it is replaced.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// The least time between two starts of a launcher.
const RESTART_EVERY: Duration = Duration::from_secs(1);
/// A launcher that fails to start this many times in a row (no pidfds, say) is given
/// up: helpers are exec'd from then on.
const MAX_FAILED_STARTS: u32 = 3;

/// Why a helper launcher could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    #[error("the helper launcher's spawner thread is gone")]
    SpawnerGone,
    #[error("cannot start the helper launcher: {0}")]
    Start(#[source] std::io::Error),
    #[error("cannot watch the helper launcher's socket: {0}")]
    WatchSocket(#[source] std::io::Error),
    #[error("cannot watch the helper launcher: {0}")]
    WatchProcess(#[source] std::io::Error),
    /// The last of `MAX_FAILED_STARTS` failures in a row: no more starts are tried.
    #[error("{0}; helpers are exec'd from now on")]
    GaveUp(#[source] Box<LauncherError>),
}

/// The helper launcher of one runner. Off until `start`.
pub struct Launcher {
    exe: PathBuf,
    slot: tokio::sync::Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    /// Whether the launcher is wanted at all (`start` was called).
    on: bool,
    conn: Option<Conn>,
    generation: u64,
    starting: bool,
    last_start: Option<Instant>,
    /// Starts that failed in a row: after `MAX_FAILED_STARTS`, no more are tried.
    failed_starts: u32,
}

/// A running launcher.
struct Conn {
    socket: AsyncFd<OwnedFd>,
    pidfd: Arc<AsyncFd<OwnedFd>>,
    generation: u64,
    /// A request was sent and its answer not yet read (its caller went away): the next
    /// answer would be that one, so the launcher is replaced instead.
    in_flight: bool,
}

impl Launcher {
    pub fn new(exe: PathBuf) -> Self {
        Launcher {
            exe,
            slot: tokio::sync::Mutex::new(Slot::default()),
        }
    }

    /// Starts the launcher and waits until it runs. Until it does (or if it cannot),
    /// helpers are exec'd.
    pub async fn start(self: &Arc<Self>) -> Result<(), LauncherError> {
        let mut slot = self.slot.lock().await;
        slot.on = true;
        slot.starting = true;
        slot.last_start = Some(Instant::now());
        drop(slot);
        self.install(spawn(self.exe.clone()).await).await
    }

    /// The launcher's pid, while one runs.
    pub async fn pid(&self) -> Option<u32> {
        let slot = self.slot.lock().await;
        let conn = slot.conn.as_ref()?;
        pidfd_pid(conn.pidfd.get_ref())
    }

    /// Has the launcher fork a helper with `stdin` and `stdout` (the helper's ends of
    /// its two pipes). `None`: there is no launcher right now, or it failed; the caller
    /// execs the helper instead, with pipes of its own (a late fork may hold these).
    pub async fn fork(self: &Arc<Self>, stdin: &OwnedFd, stdout: &OwnedFd) -> Option<ForkedHelper> {
        let mut slot = self.slot.lock().await;
        if !slot.on {
            return None;
        }
        let Some(conn) = slot.conn.as_mut() else {
            self.restart(&mut slot);
            return None;
        };
        let failure = if conn.in_flight {
            "an earlier request was left unanswered".to_string()
        } else {
            match tokio::time::timeout(REPLY_TIMEOUT, conn.ask(stdin, stdout)).await {
                Ok(Ok(Reply::Forked(pid))) => {
                    return match ForkedHelper::adopt(pid) {
                        Ok(helper) => Some(helper),
                        Err(e) => {
                            // Left with its pipes, which the caller drops: it exits at once.
                            tracing::warn!("the helper launcher forked {pid}, which cannot be adopted: {e}");
                            None
                        }
                    };
                }
                // A fork that failed for want of memory or processes says nothing against
                // the launcher; any other reason (a seccomp profile that refuses
                // CLONE_PARENT, say) would hold for every fork: helpers are exec'd.
                Ok(Ok(Reply::Failed(e @ (Errno::EAGAIN | Errno::ENOMEM)))) => {
                    tracing::warn!("the helper launcher could not fork: {e}");
                    return None;
                }
                Ok(Ok(Reply::Failed(e))) => {
                    tracing::warn!("the helper launcher cannot fork ({e}); helpers are exec'd from now on");
                    slot.on = false;
                    if let Some(conn) = slot.conn.take() {
                        conn.retire();
                    }
                    return None;
                }
                Ok(Err(e)) => e,
                Err(_) => format!("no answer within {REPLY_TIMEOUT:?}"),
            }
        };
        tracing::warn!("the helper launcher is replaced ({failure}); helpers are exec'd meanwhile");
        if let Some(conn) = slot.conn.take() {
            conn.retire();
        }
        self.restart(&mut slot);
        None
    }

    /// Starts a new launcher in the background, unless one runs or is starting: at once,
    /// or once `RESTART_EVERY` has passed since the last start. A start that fails is
    /// tried again the same way (until `install` gives up).
    fn restart(self: &Arc<Self>, slot: &mut Slot) {
        if !slot.on || slot.starting || slot.conn.is_some() {
            return;
        }
        let wait = slot
            .last_start
            .map(|t| RESTART_EVERY.saturating_sub(t.elapsed()))
            .unwrap_or_default();
        slot.starting = true;
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            {
                let mut slot = this.slot.lock().await;
                if !slot.on {
                    slot.starting = false;
                    return;
                }
                slot.last_start = Some(Instant::now());
            }
            if let Err(e) = this.install(spawn(this.exe.clone()).await).await {
                tracing::warn!("{e}");
                this.restart(&mut *this.slot.lock().await);
            }
        });
    }

    /// Takes a started launcher (or the failure to start one) into the slot, and watches
    /// for its exit.
    async fn install(
        self: &Arc<Self>,
        started: Result<(OwnedFd, OwnedFd), LauncherError>,
    ) -> Result<(), LauncherError> {
        let registered = started.and_then(|(socket, pidfd)| {
            let socket = watch(socket, Interest::READABLE | Interest::WRITABLE).map_err(LauncherError::WatchSocket)?;
            let pidfd = watch(pidfd, Interest::READABLE).map_err(LauncherError::WatchProcess)?;
            Ok((socket, Arc::new(pidfd)))
        });
        let mut slot = self.slot.lock().await;
        slot.starting = false;
        let (socket, pidfd) = match registered {
            Ok(started) => started,
            Err(e) => {
                slot.failed_starts += 1;
                if slot.failed_starts >= MAX_FAILED_STARTS {
                    slot.on = false;
                    return Err(LauncherError::GaveUp(Box::new(e)));
                }
                return Err(e);
            }
        };
        slot.failed_starts = 0;
        slot.generation += 1;
        let generation = slot.generation;
        slot.conn = Some(Conn {
            socket,
            pidfd: pidfd.clone(),
            generation,
            in_flight: false,
        });
        drop(slot);
        let this = self.clone();
        tokio::spawn(async move {
            reap(&pidfd).await;
            let mut slot = this.slot.lock().await;
            if slot.conn.as_ref().is_some_and(|c| c.generation == generation) {
                tracing::warn!("the helper launcher exited; helpers are exec'd until a new one runs");
                if let Some(conn) = slot.conn.take() {
                    conn.retire();
                }
                this.restart(&mut slot);
            }
        });
        Ok(())
    }
}

impl Conn {
    /// Sends one request and reads its answer.
    async fn ask(&mut self, stdin: &OwnedFd, stdout: &OwnedFd) -> Result<Reply, String> {
        self.in_flight = true;
        let fds = [stdin.as_raw_fd(), stdout.as_raw_fd()];
        loop {
            let mut ready = self
                .socket
                .writable()
                .await
                .map_err(|e| format!("waiting to write: {e}"))?;
            let sent = ready.try_io(|socket| {
                let cmsg = [ControlMessage::ScmRights(&fds)];
                sendmsg::<()>(
                    socket.get_ref().as_raw_fd(),
                    &[IoSlice::new(&[1])],
                    &cmsg,
                    MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
                    None,
                )
                .map_err(std::io::Error::from)
            });
            match sent {
                Ok(Ok(_)) => break,
                Ok(Err(e)) => return Err(format!("sending a request: {e}")),
                Err(_would_block) => continue,
            }
        }
        let reply = read_reply(&self.socket).await?;
        self.in_flight = false;
        reply.ok_or_else(|| "it closed its socket".to_string())
    }

    /// Ends a launcher that is no longer used: kills it, and reaps whatever it forked
    /// that is still to answer (such a helper's pipes are gone: it exits at once).
    fn retire(self) {
        // SAFETY: a plain system call on a pidfd this process owns.
        unsafe {
            nix::libc::syscall(
                nix::libc::SYS_pidfd_send_signal,
                self.pidfd.get_ref().as_raw_fd(),
                nix::libc::SIGKILL,
                std::ptr::null::<nix::libc::siginfo_t>(),
                0u32,
            )
        };
        let socket = self.socket;
        tokio::spawn(async move {
            while let Ok(Some(reply)) = read_reply(&socket).await {
                if let Reply::Forked(pid) = reply {
                    if let Ok(mut helper) = ForkedHelper::adopt(pid) {
                        helper.wait().await;
                    }
                }
            }
        });
    }
}

/// The next answer on `socket`; `None` once every holder of its other end closed it.
async fn read_reply(socket: &AsyncFd<OwnedFd>) -> Result<Option<Reply>, String> {
    loop {
        let mut ready = socket.readable().await.map_err(|e| format!("waiting to read: {e}"))?;
        let mut buf = [0u8; Reply::LEN + 1];
        let got = ready.try_io(|socket| {
            nix::sys::socket::recv(socket.get_ref().as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT)
                .map_err(std::io::Error::from)
        });
        match got {
            Ok(Ok(0)) => return Ok(None),
            Ok(Ok(n)) => {
                return Reply::decode(&buf[..n])
                    .map(Some)
                    .ok_or_else(|| format!("a malformed answer of {n} bytes"))
            }
            Ok(Err(e)) => return Err(format!("reading an answer: {e}")),
            Err(_would_block) => continue,
        }
    }
}

/// A helper the launcher forked: a child of the server, which waits for it and reaps it
/// through a pidfd (tokio knows only the children it spawned). Dropped unwaited, it is
/// reaped in the background, as a dropped `tokio::process::Child` is.
pub struct ForkedHelper {
    pid: u32,
    pidfd: Option<AsyncFd<OwnedFd>>,
}

impl ForkedHelper {
    /// Takes over the server's child `pid`. Race-free: until the server reaps it, no
    /// other process can have its pid.
    fn adopt(pid: i32) -> Result<Self, String> {
        let pidfd = pidfd_open(pid as u32).map_err(|e| format!("pidfd_open: {e}"))?;
        // Only a child of this process is waitable: anything else is not taken over.
        match waitid(
            Id::PIDFd(pidfd.as_fd()),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
        ) {
            Ok(_) => {}
            Err(e) => return Err(format!("{pid} is not a child of the server: {e}")),
        }
        let pidfd = watch(pidfd, Interest::READABLE).map_err(|e| format!("watching it: {e}"))?;
        Ok(ForkedHelper {
            pid: pid as u32,
            pidfd: Some(pidfd),
        })
    }

    pub fn id(&self) -> u32 {
        self.pid
    }

    /// Waits for the helper to exit, and reaps it.
    pub async fn wait(&mut self) {
        if let Some(pidfd) = &self.pidfd {
            reap(pidfd).await;
        }
        self.pidfd = None;
    }
}

impl Drop for ForkedHelper {
    fn drop(&mut self) {
        if let Some(pidfd) = self.pidfd.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move { reap(&pidfd).await });
            }
        }
    }
}

/// Waits for the child behind `pidfd` to exit, and reaps it.
async fn reap(pidfd: &AsyncFd<OwnedFd>) {
    loop {
        match waitid(
            Id::PIDFd(pidfd.get_ref().as_fd()),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG,
        ) {
            Ok(WaitStatus::StillAlive) => {}
            Err(Errno::EINTR) => continue,
            // Reaped (or, ECHILD, not ours to reap).
            Ok(_) | Err(_) => return,
        }
        match pidfd.readable().await {
            Ok(mut ready) => ready.clear_ready(),
            Err(_) => return,
        }
    }
}

/// Registers `fd` with the runtime for `interest`.
fn watch(fd: OwnedFd, interest: Interest) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is an open descriptor it alone closes, and its `as_raw_fd`
    // is always the same one; the `AsyncFd` owns it (and nothing swaps it) until dropped.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(std::io::Error::from)
}

fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: a plain system call; on success it returns a new descriptor we own.
    let fd = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_pidfd_open,
            pid as nix::libc::pid_t,
            // Blocking (PIDFD_NONBLOCK needs Linux 5.10): it is only polled, and waited
            // on with WNOHANG.
            0u32,
        )
    };
    if fd < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        // SAFETY: the kernel just created this descriptor (close-on-exec) for us.
        Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd as i32) })
    }
}

/// The pid a pidfd refers to (its `Pid:` line in fdinfo).
fn pidfd_pid(pidfd: &OwnedFd) -> Option<u32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|p| p.trim().parse::<i64>().ok())
        .filter(|p| *p > 0)
        .map(|p| p as u32)
}

/// Starts a launcher on the spawner thread: its socket and its pidfd.
async fn spawn(exe: PathBuf) -> Result<(OwnedFd, OwnedFd), LauncherError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(spawn_process(&exe));
    });
    spawner().send(job).map_err(|_| LauncherError::SpawnerGone)?;
    rx.await
        .map_err(|_| LauncherError::SpawnerGone)?
        .map_err(LauncherError::Start)
}

fn spawn_process(exe: &Path) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
    )?;
    // Its end is blocking: the launcher waits for requests.
    let flags = nix::fcntl::fcntl(theirs.as_raw_fd(), nix::fcntl::F_GETFL)?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) & !nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(theirs.as_raw_fd(), nix::fcntl::F_SETFL(flags))?;
    let mut command = std::process::Command::new(exe);
    command
        .arg("helper-launcher")
        // What the helpers it forks start with, as an exec'd helper does.
        .env_clear()
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let mut child = command.spawn()?;
    drop(command);
    // Its helpers are waited for through pidfds: without them (pidfd_open needs Linux
    // 5.3, waitid on one 5.4) there is no launcher.
    let usable = pidfd_open(child.id()).and_then(|pidfd| {
        waitid(
            Id::PIDFd(pidfd.as_fd()),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
        )
        .map_err(std::io::Error::from)?;
        Ok(pidfd)
    });
    match usable {
        Ok(pidfd) => Ok((ours, pidfd)),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The thread launchers are started from: it never exits, so no launcher (and no helper
/// it forks) gets its parent-death signal while the server lives.
fn spawner() -> &'static mpsc::Sender<Job> {
    static SPAWNER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let started = std::thread::Builder::new()
            .name("helper-launcher".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            });
        if let Err(e) = started {
            tracing::warn!("cannot start the helper launcher's spawner thread: {e}");
        }
        tx
    })
}
