//! The `gvisor` isolation tier's host side. Each sandbox of the tier is a gVisor sandbox
//! of its own (`runsc run`), whose one process is `sandcall sandbox-helper`: the helper
//! builds sandcall's own per-run sandbox (namespaces, limits, seccomp) inside gVisor's
//! kernel exactly as it does on the host's, and speaks the same protocol over the same
//! stdin and stdout, which `runsc` hands through. So everything a run does (files, tool
//! calls, warm starts, timeouts) works unchanged, with gVisor's kernel between the
//! program and the host's (ARCHITECTURE.md, "Isolation tiers").
//!
//! gVisor's kernel does not enforce a memory cgroup's limit, so each gVisor sandbox (its
//! kernel, its file proxy and `runsc` itself) runs in a host cgroup of its own with the
//! run's memory limit plus `KERNEL_MEMORY`: when the run reaches it, the runner ends the
//! sandbox and reports the run out of memory (`runner::end_at_memory_limit`).

use sandcall_sandbox::cgroup::{CgroupRoot, RunCgroup};
use sandcall_sandbox::mounts::HostView;
use sandcall_sandbox::protocol::Limits;
use sandcall_sandbox::protocol::EGRESS_CHANNEL_FD;
use std::ffi::CString;
use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// Memory a gVisor sandbox needs beside its program's: its kernel (the Sentry), its
/// file proxy (the Gofer) and `runsc`. Measured idle at about 52 MiB together
/// (ARCHITECTURE.md, "Isolation tiers").
pub const KERNEL_MEMORY: u64 = 96 << 20;
/// Host tasks a gVisor sandbox needs beside its program's count: the Go runtime's
/// threads of the Sentry, the Gofer and `runsc`. The program's own are held by the pids
/// limit inside (gVisor's); with the `systrap` platform each of its processes is also a
/// stub process on the host, with threads of its own: the host limit is a backstop of
/// four host tasks per allowed process.
const KERNEL_TASKS: u64 = 1024;
const HOST_TASKS_PER_PROCESS: u64 = 4;
/// The controllers gVisor's kernel has, where the helper makes its run cgroups inside.
const INNER_CGROUPS: &str = "/sys/fs/cgroup";
/// gVisor's own `/proc`, `/dev` and `/sys` in every gVisor sandbox (`oci_spec`).
const PROC: &str = "/proc";
const DEV: &str = "/dev";
const SYS: &str = "/sys";

/// Where every gVisor sandbox mounts something of gVisor's over the host's root it
/// otherwise sees, each with what it puts there: a runtime under one is hidden from
/// runs in this tier (`crate::visible::check_visible`).
pub const MOUNTED_OVER: [(&str, &str); 3] = [
    (PROC, "gVisor's own /proc"),
    (DEV, "a tmpfs of gVisor's"),
    (SYS, "gVisor's own sysfs"),
];

/// Why the `gvisor` tier cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum GvisorError {
    #[error(
        "isolation = \"gvisor\" needs gVisor's runsc, and {0}: install it (on Debian and Ubuntu \
         the `runsc` package of the backports suite, runtimes/gvisor/install.sh; or a release of gVisor's own) \
         or set `runsc_path`"
    )]
    NotFound(String),
    #[error("{} --version: {source}", path.display())]
    Version {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("write the gVisor bundle {}: {source}", path.display())]
    Bundle {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The `gvisor` tier of a server with `config` on `host`: `runsc` found, its bundle
/// written, an earlier server's leftovers swept. None when `runsc` is not there and
/// nothing needs it; an error when something does (the server's `isolation`, a pinned
/// principal, or a `runsc_path`).
pub fn for_config(
    config: &sandcall_config::Config,
    host: &crate::host::Host,
    helper_exe: &Path,
) -> Result<Option<std::sync::Arc<Gvisor>>, GvisorError> {
    let runsc = match find_runsc(config.host.runsc_path.as_deref()) {
        Ok(runsc) => runsc,
        Err(e) if config.pins_gvisor() || config.host.runsc_path.is_some() => return Err(e),
        Err(_) => return Ok(None),
    };
    let view = sandbox_view(config, helper_exe);
    let own = OwnPaths {
        runs: host.runs_dir.clone(),
        outbox: host.outbox_dir.clone(),
        inputs: host.data_dir.join("gvisor").join("inputs"),
    };
    let gvisor = Gvisor::prepare(runsc, &host.data_dir, helper_exe, host.cgroups.clone(), own, view)?;
    Ok(Some(std::sync::Arc::new(gvisor)))
}

/// What of the host a gVisor sandbox of a server with `config` sees: what its programs'
/// roots are built from, and the binary alone, not its directory (which may hold the
/// data directory). Bound into the root (`RootBind`), not as a mount of gVisor's, the
/// binary is what `/proc/self/exe` names, which the helper binds into a programmatic
/// run's root as its tool client.
fn sandbox_view(config: &sandcall_config::Config, helper_exe: &Path) -> HostView {
    let (extra, node_modules) = crate::runtime::program_host_paths(config);
    let mut view = sandcall_sandbox::mounts::host_view(&extra, node_modules.as_deref());
    view.paths.push(helper_exe.to_path_buf());
    view
}

/// The `runsc` a configuration names (`runsc_path`) or PATH has.
pub fn find_runsc(configured: Option<&Path>) -> Result<PathBuf, GvisorError> {
    if let Some(path) = configured {
        return if is_executable(path) {
            Ok(path.to_path_buf())
        } else {
            Err(GvisorError::NotFound(format!(
                "runsc_path {} is not an executable",
                path.display()
            )))
        };
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("runsc"))
        .find(|p| is_executable(p))
        .ok_or_else(|| GvisorError::NotFound("no runsc is on PATH".into()))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// What `runsc --version` says: its version line, and the release date in it when the
/// version names one (gVisor's releases are named by date: `release-20240729.0`, Debian's
/// `0.0~20240729.0`).
#[derive(Debug, Clone, PartialEq)]
pub struct RunscVersion {
    pub line: String,
    /// (year, month, day)
    pub released: Option<(i32, u32, u32)>,
}

pub fn runsc_version(runsc: &Path) -> Result<RunscVersion, GvisorError> {
    let out = std::process::Command::new(runsc)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|source| GvisorError::Version {
            path: runsc.to_path_buf(),
            source,
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(parse_version(text.lines().next().unwrap_or("")))
}

fn parse_version(line: &str) -> RunscVersion {
    // The first run of eight digits that reads as a plausible date.
    let released = line
        .as_bytes()
        .windows(8)
        .filter(|w| w.iter().all(u8::is_ascii_digit))
        .find_map(|w| {
            let s = std::str::from_utf8(w).ok()?;
            let (y, m, d) = (s[..4].parse().ok()?, s[4..6].parse().ok()?, s[6..].parse().ok()?);
            ((2018..=2100).contains(&y) && (1..=12).contains(&m) && (1..=31).contains(&d)).then_some((y, m, d))
        });
    RunscVersion {
        line: line.trim().to_string(),
        released,
    }
}

/// Where, inside every gVisor sandbox, its helper finds what is its run's own: the
/// staging directories' parent and the outbox (the server's own paths, so that the
/// helper's messages need no translation), and the run's inputs. Each gVisor sandbox
/// has its own host directory bound at each (`Gvisor::view`), never the server's.
#[derive(Debug, Clone)]
pub struct OwnPaths {
    pub runs: PathBuf,
    pub outbox: PathBuf,
    pub inputs: PathBuf,
}

/// The `gvisor` tier's host side: one server's `runsc` state, the root every one of its
/// gVisor sandboxes starts from, each one's own bundle and directories, and where their
/// host cgroups go.
#[derive(Debug)]
pub struct Gvisor {
    runsc: PathBuf,
    /// `runsc --root`: the state of this server's gVisor sandboxes, and nobody else's.
    state: PathBuf,
    /// `<views>/<id>`: gVisor sandbox `id`'s bundle and own directories (`RunView`).
    views: PathBuf,
    root: PathBuf,
    helper_exe: PathBuf,
    /// What of the host every gVisor sandbox's root holds (`root_binds`), each bound
    /// read-only at its own path under `root` by `RootBind::mount_all`.
    binds: Vec<RootBind>,
    own: OwnPaths,
    host_cgroups: CgroupRoot,
}

impl Gvisor {
    /// Builds the root under `<data_dir>/gvisor` and sweeps whatever gVisor sandboxes
    /// an earlier server left there. Of the host, a sandbox sees only `view`, read-only
    /// (what its programs' roots are built from and the helper: `root_binds`), and the
    /// directories of its own run at `own` (`Gvisor::view`).
    pub fn prepare(
        runsc: PathBuf,
        data_dir: &Path,
        helper_exe: &Path,
        host_cgroups: CgroupRoot,
        own: OwnPaths,
        view: HostView,
    ) -> Result<Gvisor, GvisorError> {
        let dir = data_dir.join("gvisor");
        let root = dir.join("root");
        let paths = root_binds(&view);
        let binds = paths
            .iter()
            .map(|path| RootBind::new(path, &root))
            .collect::<std::io::Result<_>>()
            .map_err(|source| GvisorError::Bundle {
                path: root.clone(),
                source,
            })?;
        let gvisor = Gvisor {
            runsc,
            state: dir.join("state"),
            views: dir.join("runs"),
            root,
            helper_exe: helper_exe.to_path_buf(),
            binds,
            own,
            host_cgroups,
        };
        let swept = gvisor.sweep();
        if swept > 0 {
            tracing::warn!(swept, "removed gVisor sandboxes left by a previous server");
        }
        let bundle_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| GvisorError::Bundle { path, source }
        };
        for dir in [&gvisor.state, &gvisor.views] {
            fs::create_dir_all(dir).map_err(bundle_err(dir))?;
        }
        let own = [gvisor.own.runs.as_path(), &gvisor.own.outbox, &gvisor.own.inputs];
        build_skeleton(&gvisor.root, &view.symlinks, &paths, &own).map_err(bundle_err(&gvisor.root))?;
        Ok(gvisor)
    }

    /// Makes gVisor sandbox `id`'s bundle and the host directories that are its run's
    /// own: bound read-write at `OwnPaths::runs` (where the helper makes the run's
    /// staging directory) and `OwnPaths::outbox`, read-only at `OwnPaths::inputs`. No
    /// gVisor sandbox sees another's, nor the store's files.
    pub fn view(&self, id: &str) -> std::io::Result<RunView> {
        let view = RunView {
            dir: self.views.join(id),
            own: self.own.clone(),
        };
        view.remove();
        let binds = [
            (view.dir.join("runs"), self.own.runs.as_path(), true),
            (view.dir.join("outbox"), &self.own.outbox, true),
            (view.dir.join("inputs"), &self.own.inputs, false),
        ];
        let made = binds
            .iter()
            .try_for_each(|(dir, _, _)| fs::create_dir_all(dir))
            .and_then(|()| {
                let spec = oci_spec(&self.helper_exe, &self.root, &binds);
                fs::write(view.dir.join("config.json"), serde_json::to_vec(&spec)?)
            });
        match made {
            Ok(()) => Ok(view),
            Err(e) => {
                view.remove();
                Err(e)
            }
        }
    }

    /// Where the helper makes a run's cgroup inside gVisor: at the top of gVisor's own
    /// controllers (the gVisor sandbox holds that run alone).
    pub fn inner_cgroups() -> CgroupRoot {
        let at = |c: &str| Path::new(INNER_CGROUPS).join(c);
        CgroupRoot::V1 {
            memory: at("memory"),
            pids: at("pids"),
            cpu: Some(at("cpu")),
            cpuacct: Some(at("cpuacct")),
        }
    }

    /// The host cgroup of gVisor sandbox `id`, made with `limits` plus what gVisor itself
    /// needs (`KERNEL_MEMORY`, `KERNEL_TASKS`).
    pub fn host_cgroup(&self, id: &str, limits: &Limits) -> std::io::Result<RunCgroup> {
        let mut outer = limits.clone();
        outer.memory_bytes = limits.memory_bytes.saturating_add(KERNEL_MEMORY);
        outer.max_processes = limits
            .max_processes
            .saturating_mul(HOST_TASKS_PER_PROCESS)
            .saturating_add(KERNEL_TASKS);
        RunCgroup::create(&self.host_cgroups.placement(id), &outer).map_err(std::io::Error::other)
    }

    /// The command that starts the gVisor sandbox of run `id` with the helper in it, joined to
    /// `cgroup` before it execs (so that nothing of it ever runs outside), in a mount
    /// namespace of its own where the root's read-only binds are made (`RootBind`: they
    /// go when its last process does), and `channel`
    /// (`egress_channel`), if any, passed in as the helper's `EGRESS_CHANNEL_FD`. No gVisor
    /// sandbox may open host unix sockets (`--host-uds`): with the host's root visible
    /// read-only, that would reach every socket on the host, other sandboxes' control
    /// sockets included. Descriptors passed in reach only what the server connected them to.
    pub fn command(
        &self,
        id: &str,
        view: &RunView,
        cgroup: &RunCgroup,
        channel: Option<OwnedFd>,
    ) -> std::io::Result<tokio::process::Command> {
        let mut command = tokio::process::Command::new(&self.runsc);
        command.arg("--root").arg(&self.state).args(RUNSC_FLAGS);
        command.arg("run");
        if let Some(fd) = &channel {
            command.arg(format!("--pass-fd={}:{EGRESS_CHANNEL_FD}", fd.as_raw_fd()));
        }
        command.arg("--bundle").arg(&view.dir).arg(container_id(id)).env_clear();
        let procs: Vec<CString> = cgroup
            .procs_files()
            .into_iter()
            .map(|p| CString::new(p.into_os_string().into_encoded_bytes()).map_err(std::io::Error::other))
            .collect::<Result<_, _>>()?;
        let binds = self.binds.clone();
        // SAFETY: the closure runs in the forked child before exec, and only makes
        // async-signal-safe calls (open, write, close, fcntl, unshare, mount) on memory
        // prepared before the fork. The closure owns `channel`: the command's drop closes
        // the server's copy.
        unsafe {
            command.pre_exec(move || {
                // `runsc` inherits the channel (the server's descriptors are close-on-exec).
                if let Some(fd) = channel.as_ref().map(AsRawFd::as_raw_fd) {
                    if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                for path in &procs {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                    let error = std::io::Error::last_os_error();
                    libc::close(fd);
                    if written != 1 {
                        return Err(error);
                    }
                }
                RootBind::mount_all(&binds)
            });
        }
        Ok(command)
    }

    /// Removes the gVisor sandboxes an earlier server left (one that was killed): has
    /// `runsc` forget each, and empties the state directory. Returns how many it found.
    pub fn sweep(&self) -> usize {
        let Ok(entries) = fs::read_dir(&self.state) else {
            return 0;
        };
        let ids: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(state_file_id).map(str::to_owned))
            .collect();
        // Their processes are gone already: they ran in host cgroups under this server's
        // subtree, which `host::prepare` swept (killing what ran in them) before this.
        for id in &ids {
            let _ = std::process::Command::new(&self.runsc)
                .arg("--root")
                .arg(&self.state)
                .args(["delete", "--force", id])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = fs::remove_dir_all(&self.state);
        let _ = fs::remove_dir_all(&self.views);
        ids.len()
    }
}

/// One gVisor sandbox's bundle and the host directories that are its run's own
/// (`Gvisor::view`): what the sandbox may write of the host, and the only stored files it
/// sees, copies of its run's inputs.
#[derive(Debug, Clone)]
pub struct RunView {
    dir: PathBuf,
    own: OwnPaths,
}

impl RunView {
    /// Copies each of `inputs` into the sandbox's own inputs, and points it there as the
    /// helper sees it.
    pub fn stage_inputs(&self, inputs: &mut [sandcall_sandbox::protocol::InputFile]) -> std::io::Result<()> {
        for (i, input) in inputs.iter_mut().enumerate() {
            let name = i.to_string();
            fs::copy(&input.source, self.dir.join("inputs").join(&name))?;
            input.source = self.own.inputs.join(name);
        }
        Ok(())
    }

    /// Copies the files the helper collected into `outbox` (in the sandbox, under
    /// `OwnPaths::outbox`) out to the same path on the host, which no sandbox sees. Only
    /// regular files are copied, opened without following a link, at most `max_files`
    /// and `max_bytes` of them: the helper's directory is the sandbox's to write, and a
    /// program that broke out of its own sandbox could have put anything there.
    pub fn take_outbox(&self, outbox: &Path, max_files: usize, max_bytes: u64) -> std::io::Result<()> {
        let Some(name) = outbox
            .strip_prefix(&self.own.outbox)
            .ok()
            .filter(|rest| rest.components().count() == 1)
        else {
            return Err(std::io::Error::other("an outbox outside the outbox directory"));
        };
        let from = self.dir.join("outbox").join(name);
        let Ok(entries) = fs::read_dir(&from) else {
            return Ok(()); // no file was collected
        };
        fs::create_dir(outbox)?;
        let mut left = max_bytes;
        for entry in entries.flatten().take(max_files) {
            if left == 0 {
                break;
            }
            use std::os::unix::fs::OpenOptionsExt;
            let Ok(mut file) = fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(entry.path())
            else {
                continue;
            };
            if !file.metadata().is_ok_and(|m| m.is_file()) {
                continue;
            }
            let mut to = fs::File::create_new(outbox.join(entry.file_name()))?;
            left -= std::io::copy(&mut std::io::Read::take(&mut file, left), &mut to)?;
        }
        Ok(())
    }

    /// Removes the bundle and the directories (the sandbox has ended).
    pub fn remove(&self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The egress channel of a run with network (`egress`) in this tier: a unix socket pair,
/// whose one end the gVisor sandbox gets at its start (`Gvisor::command`), returned here,
/// and whose other the server serves until the sandbox closes its end. For each byte the
/// helper writes, the server connects to the run's proxy socket (`egress.socket`, which
/// no gVisor sandbox can open itself) and sends that connection back with SCM_RIGHTS, or
/// a byte alone when it cannot connect. `egress` is told where the helper finds it.
pub fn egress_channel(egress: &mut sandcall_sandbox::protocol::Egress) -> std::io::Result<OwnedFd> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    let ours = tokio::net::UnixStream::from_std(ours)?;
    tokio::spawn(serve_channel(ours, egress.socket.clone()));
    egress.channel = Some(EGRESS_CHANNEL_FD);
    Ok(theirs.into())
}

/// Answers the helper's questions on its egress channel (`egress_channel`) until it
/// closes it or stops reading.
async fn serve_channel(channel: tokio::net::UnixStream, proxy: PathBuf) {
    loop {
        let mut question = [0u8; 1];
        if !matches!(
            channel_io(&channel, tokio::io::Interest::READABLE, || {
                nix::unistd::read(channel.as_raw_fd(), &mut question)
            })
            .await,
            Ok(1)
        ) {
            return;
        }
        let conn = tokio::net::UnixStream::connect(&proxy).await.and_then(|c| c.into_std());
        if let Err(e) = &conn {
            tracing::warn!("egress: connecting the proxy socket for a gVisor sandbox: {e}");
        }
        let conn = conn.ok();
        let answered = channel_io(&channel, tokio::io::Interest::WRITABLE, || {
            let fds: Vec<i32> = conn.iter().map(AsRawFd::as_raw_fd).collect();
            let rights = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
            let cmsgs = if fds.is_empty() { &[][..] } else { &rights[..] };
            nix::sys::socket::sendmsg::<()>(
                channel.as_raw_fd(),
                &[std::io::IoSlice::new(if conn.is_some() { b"k" } else { b"e" })],
                cmsgs,
                nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
                None,
            )
        })
        .await;
        if answered.is_err() {
            return;
        }
    }
}

/// `op` on `channel` once it is ready for `interest`, retried while it would block.
async fn channel_io<T>(
    channel: &tokio::net::UnixStream,
    interest: tokio::io::Interest,
    mut op: impl FnMut() -> nix::Result<T>,
) -> std::io::Result<T> {
    loop {
        channel.ready(interest).await?;
        match channel.try_io(interest, || op().map_err(std::io::Error::from)) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            done => return done,
        }
    }
}

/// The flags every `runsc` call of a sandbox's start gets: the `systrap` platform (no
/// KVM needed), no network (the helper's namespaces have none either), exclusive file
/// access to the root (gVisor keeps what it has read of the runtimes and system files
/// there instead of asking the host again at each lookup: sandcall never changes them,
/// and a host change made while a warm sandbox waits may be seen stale by it until it is
/// replaced) and shared access to every other mount, a run's own directories (the
/// server writes a run's inputs after its warm sandbox started, and reads its outputs),
/// no overlay on the read-only root, and cgroups left alone (the server put `runsc` in
/// the sandbox's host cgroup already; by default `runsc` would move the sandbox to a
/// cgroup of its own at the top of each hierarchy).
const RUNSC_FLAGS: &[&str] = &[
    "--platform=systrap",
    "--network=none",
    "--file-access=exclusive",
    "--file-access-mounts=shared",
    "--overlay2=none",
    "--ignore-cgroups",
];

/// The `runsc` container of run `id`: run ids may begin with `-`, which `runsc` would
/// read as a flag.
fn container_id(id: &str) -> String {
    format!("run-{id}")
}

/// `runsc` keeps a container's state in `<sandbox id>_sandbox:<container id>.state`
/// (a lock file and the control socket beside it); here both are `container_id`'s.
fn state_file_id(name: &str) -> Option<&str> {
    let stem = name.strip_suffix(".state")?;
    let id = stem.rsplit_once(':').map_or(stem, |(_, id)| id);
    (!id.is_empty()).then_some(id)
}

/// The host paths a gVisor sandbox gets read-only: `view`'s, each once (one under a
/// top-level symlink, such as `/lib64/...` with a merged `/usr`, by the path it leads
/// to), none under another (that one's bind holds it).
fn root_binds(view: &HostView) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = view
        .paths
        .iter()
        .map(|p| {
            view.symlinks
                .iter()
                .find_map(|(link, target)| {
                    let rest = p.strip_prefix(link).ok()?;
                    Some(Path::new("/").join(target).join(rest))
                })
                .unwrap_or_else(|| p.clone())
        })
        .collect();
    paths.sort();
    let mut kept: Vec<PathBuf> = Vec::new();
    for path in paths {
        if !kept.iter().any(|k| path.starts_with(k)) {
            kept.push(path);
        }
    }
    kept
}

/// A host path bound read-only into the root of every gVisor sandbox, at its own path:
/// in the root itself rather than as a mount of the sandbox, so that gVisor's exclusive
/// file access covers it (`RUNSC_FLAGS`: `runsc` takes one mode for all mounts but the
/// root, and a run's own directories must stay shared; its per-mount hints would put an
/// overlay on them). Made by the child that execs `runsc` (`Gvisor::command`), in a
/// mount namespace of its own that `runsc` and its file proxy inherit.
#[derive(Debug, Clone)]
struct RootBind {
    source: CString,
    target: CString,
    /// The flags of its read-only remount (`mounts::read_only_remount`).
    remount: libc::c_ulong,
}

impl RootBind {
    fn new(path: &Path, root: &Path) -> std::io::Result<RootBind> {
        let c_path = |p: &Path| CString::new(p.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other);
        let existing = nix::sys::statvfs::statvfs(path)?.flags();
        let remount = sandcall_sandbox::mounts::read_only_remount(existing).bits();
        Ok(RootBind {
            source: c_path(path)?,
            target: c_path(&root.join(path.strip_prefix("/").unwrap_or(path)))?,
            remount,
        })
    }

    /// Takes a new mount namespace whose mounts reach no other, and makes `binds` in it.
    /// Only async-signal-safe calls: it runs between fork and exec.
    fn mount_all(binds: &[RootBind]) -> std::io::Result<()> {
        let none = std::ptr::null();
        let mount = |source: *const libc::c_char, target: *const libc::c_char, flags| {
            // SAFETY: a plain system call on NUL-terminated strings that outlive it.
            match unsafe { libc::mount(source, target, none, flags, none.cast()) } {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        };
        // SAFETY: a plain system call.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        mount(none, c"/".as_ptr(), libc::MS_REC | libc::MS_PRIVATE)?;
        for bind in binds {
            let target = bind.target.as_ptr();
            mount(bind.source.as_ptr(), target, libc::MS_BIND | libc::MS_REC)?;
            mount(none, target, bind.remount)?;
        }
        Ok(())
    }
}

/// The root every gVisor sandbox starts from, at `root` (made again at each start): an
/// otherwise empty tree with a mount point for each of `binds` (a directory, or a file
/// for a file) and of the directories `own`, gVisor's own `/proc`, `/dev` and `/sys`,
/// and the top-level `symlinks` of the host's (merged `/usr`).
fn build_skeleton(
    root: &Path,
    symlinks: &[(PathBuf, PathBuf)],
    binds: &[PathBuf],
    own: &[&Path],
) -> std::io::Result<()> {
    let _ = fs::remove_dir_all(root);
    fs::create_dir_all(root)?;
    let inside = |path: &Path| root.join(path.strip_prefix("/").unwrap_or(path));
    for (link, target) in symlinks {
        std::os::unix::fs::symlink(target, inside(link))?;
    }
    for dir in [PROC, DEV, SYS].iter().map(Path::new).chain(own.iter().copied()) {
        fs::create_dir_all(inside(dir))?;
    }
    for path in binds {
        let at = inside(path);
        if path.is_dir() {
            fs::create_dir_all(&at)?;
        } else {
            if let Some(parent) = at.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::File::create(&at)?;
        }
    }
    Ok(())
}

/// The OCI runtime spec of a gVisor sandbox: `root` (`build_skeleton`, with the host's
/// read-only binds in it: `RootBind`) read-only, each of `own` (host directory, where,
/// read-write) at its place, gVisor's own
/// `/proc`, `/dev`, `/sys` and cgroup controllers, and the helper as the one process,
/// root inside gVisor's kernel with the capabilities it builds sandboxes with. Nothing
/// else of the host is there: not its `/etc`, not the data directory's keys, not other
/// home directories.
fn oci_spec(helper_exe: &Path, root: &Path, own: &[(PathBuf, &Path, bool)]) -> serde_json::Value {
    let caps = [
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FOWNER",
        "CAP_KILL",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_SETPCAP",
        "CAP_SYS_ADMIN",
        "CAP_SYS_CHROOT",
        "CAP_SYS_NICE",
        "CAP_SYS_PTRACE",
        "CAP_SYS_RESOURCE",
    ];
    let mut mounts = vec![
        serde_json::json!({"destination": PROC, "type": "proc", "source": "proc"}),
        serde_json::json!({"destination": DEV, "type": "tmpfs", "source": "tmpfs"}),
        serde_json::json!({"destination": SYS, "type": "sysfs", "source": "sysfs", "options": ["ro", "nosuid", "nodev", "noexec"]}),
        serde_json::json!({"destination": INNER_CGROUPS, "type": "cgroup", "source": "cgroup"}),
    ];
    for (source, destination, writable) in own {
        let how = if *writable { "rw" } else { "ro" };
        mounts.push(serde_json::json!({
            "destination": destination, "type": "bind", "source": source, "options": ["rbind", how]
        }));
    }
    serde_json::json!({
        "ociVersion": "1.0.0",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": [helper_exe, "sandbox-helper"],
            "env": ["PATH=/usr/bin:/bin"],
            "cwd": "/",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
        },
        "root": {"path": root, "readonly": true},
        "hostname": "sandbox",
        "mounts": mounts,
        "linux": {"namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}]},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runsc_version_names_its_release_date() {
        let debian = parse_version("runsc version 0.0~20240729.0\n");
        assert_eq!(debian.released, Some((2024, 7, 29)));
        assert_eq!(debian.line, "runsc version 0.0~20240729.0");
        assert_eq!(
            parse_version("runsc version release-20251110.0").released,
            Some((2025, 11, 10))
        );
        assert_eq!(parse_version("runsc version 1.2.3-dev").released, None);
    }

    #[test]
    fn a_gvisor_sandbox_sees_only_what_runs_are_built_from_and_its_own_run() {
        let view = HostView {
            paths: [
                "/usr",
                "/lib64/ld-linux-x86-64.so.2",
                "/usr/lib/jvm",
                "/etc/fonts",
                "/etc/ld.so.cache",
                "/srv/data/runtimes/python-1",
            ]
            .map(PathBuf::from)
            .to_vec(),
            symlinks: vec![(PathBuf::from("/lib64"), PathBuf::from("usr/lib64"))],
        };
        let binds = root_binds(&view);
        // One under a top-level symlink, and one under another bind, are in `/usr`'s.
        assert_eq!(
            binds,
            ["/etc/fonts", "/etc/ld.so.cache", "/srv/data/runtimes/python-1", "/usr"]
                .map(PathBuf::from)
                .to_vec()
        );
        let own = Path::new("/srv/data/gvisor/runs/r1");
        let spec = oci_spec(
            Path::new("/opt/sandcall"),
            Path::new("/srv/data/gvisor/root"),
            &[
                (own.join("runs"), Path::new("/srv/data/runs"), true),
                (own.join("outbox"), Path::new("/srv/data/outbox"), true),
                (own.join("inputs"), Path::new("/srv/data/gvisor/inputs"), false),
            ],
        );
        assert_eq!(
            spec["root"],
            serde_json::json!({"path": "/srv/data/gvisor/root", "readonly": true})
        );
        let mounts = spec["mounts"].as_array().unwrap();
        let bound: Vec<(&str, &str, &str)> = mounts
            .iter()
            .filter(|m| m["type"] == "bind")
            .map(|m| {
                (
                    m["source"].as_str().unwrap(),
                    m["destination"].as_str().unwrap(),
                    m["options"][1].as_str().unwrap(),
                )
            })
            .collect();
        // The host's read-only paths are in the root (`RootBind`), not mounts of gVisor's.
        assert_eq!(bound.len(), 3, "{bound:?}");
        // What the sandbox may write is its own run's directories, at the server's paths.
        let writable: Vec<_> = bound.iter().filter(|(_, _, how)| *how == "rw").collect();
        assert_eq!(
            writable,
            [
                &("/srv/data/gvisor/runs/r1/runs", "/srv/data/runs", "rw"),
                &("/srv/data/gvisor/runs/r1/outbox", "/srv/data/outbox", "rw")
            ]
        );
        // Nothing of the host's /etc but what was asked for, nothing of the data directory
        // but its runtimes and this run's own directories: not the stored files, not the
        // other runs' staging directories or outboxes.
        for hidden in [
            "/",
            "/etc",
            "/root",
            "/srv/data",
            "/srv/data/token.key",
            "/srv/data/files/objects",
            "/srv/data/runs",
            "/srv/data/outbox",
        ] {
            assert!(
                !bound.iter().any(|(source, _, _)| *source == hidden),
                "{hidden} is bound"
            );
        }
    }

    #[test]
    fn a_gvisor_sandbox_sees_the_binary_but_not_its_directory() {
        // `./sandcall serve` keeps its data directory beside the binary by default.
        let dir = std::env::temp_dir().join(format!("sandcall-exe-test-{}", sandcall_api::ids::new_id()));
        let exe = dir.join("sandcall");
        let view = sandbox_view(&sandcall_config::Config::default(), &exe);
        let binds = root_binds(&view);
        assert!(binds.contains(&exe), "{binds:?}");
        assert!(!binds.iter().any(|b| dir.starts_with(b)), "{binds:?}");
    }

    #[test]
    fn a_run_view_copies_inputs_in_and_only_regular_files_out() {
        let dir = std::env::temp_dir().join(format!("sandcall-view-test-{}", sandcall_api::ids::new_id()));
        let own = OwnPaths {
            runs: dir.join("data/runs"),
            outbox: dir.join("data/outbox"),
            inputs: dir.join("data/gvisor/inputs"),
        };
        let view = RunView {
            dir: dir.join("data/gvisor/runs/r1"),
            own: own.clone(),
        };
        for sub in ["inputs", "outbox/r1"] {
            fs::create_dir_all(view.dir.join(sub)).unwrap();
        }
        fs::create_dir_all(&own.outbox).unwrap();
        // Inputs: copied into the view, named as the sandbox sees them.
        let object = dir.join("object");
        fs::write(&object, "input bytes").unwrap();
        let mut inputs = vec![sandcall_sandbox::protocol::InputFile {
            source: object.clone(),
            name: "data.csv".into(),
            read_only: false,
            tag: String::new(),
        }];
        view.stage_inputs(&mut inputs).unwrap();
        assert_eq!(inputs[0].source, own.inputs.join("0"));
        assert_eq!(fs::read_to_string(view.dir.join("inputs/0")).unwrap(), "input bytes");
        // Outputs: a regular file comes out; a link to a host file, a FIFO and a
        // directory do not, nor anything past the bound on bytes.
        let secret = dir.join("token.key");
        fs::write(&secret, "secret").unwrap();
        let theirs = view.dir.join("outbox/r1");
        fs::write(theirs.join("0"), "chart").unwrap();
        std::os::unix::fs::symlink(&secret, theirs.join("1")).unwrap();
        nix::unistd::mkfifo(&theirs.join("2"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        fs::create_dir(theirs.join("3")).unwrap();
        let outbox = own.outbox.join("r1");
        view.take_outbox(&outbox, 100, 1 << 20).unwrap();
        let mut out: Vec<String> = fs::read_dir(&outbox)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        out.sort();
        assert_eq!(out, ["0"]);
        assert_eq!(fs::read_to_string(outbox.join("0")).unwrap(), "chart");
        assert!(!fs::symlink_metadata(outbox.join("0")).unwrap().file_type().is_symlink());
        // Only the run's own outbox, and the bound on bytes holds.
        assert!(view.take_outbox(&dir.join("elsewhere/r1"), 100, 1 << 20).is_err());
        fs::remove_dir_all(&outbox).unwrap();
        view.take_outbox(&outbox, 100, 3).unwrap();
        assert_eq!(fs::read_to_string(outbox.join("0")).unwrap(), "cha");
        view.remove();
        assert!(!view.dir.exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_container_id_is_never_a_flag() {
        assert_eq!(container_id("-abc"), "run--abc");
    }

    #[test]
    fn only_state_files_name_sandboxes() {
        assert_eq!(state_file_id("abc_sandbox:abc.state"), Some("abc"));
        assert_eq!(state_file_id("abc.state"), Some("abc"));
        assert_eq!(state_file_id("abc.lock"), None);
        assert_eq!(state_file_id("runsc-abc.sock"), None);
        assert_eq!(state_file_id("x_sandbox:.state"), None);
    }
}
