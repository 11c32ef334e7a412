//! The sandbox's init (pid 1 of the run's namespaces) and the program's last steps
//! before its exec, both in processes cloned or forked from the helper.

use super::{HelperError, InitContext, InitReport, InitRun, MessageError, SANDBOX_ID};
use crate::io::{write_all, Lines, MAX_CONTROL_LINE};
use crate::mounts::{build_root, RootSpec};
use crate::protocol::Limits;
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// The sandbox's init: pid 1 of the new pid namespace.
pub(super) fn init_main(ctx: &InitContext) -> isize {
    // SAFETY: these raw fds were inherited through clone(2) and belong to this process.
    let report_fd = unsafe { OwnedFd::from_raw_fd(ctx.from_init_w) };
    let report = |r: &InitReport| {
        let mut line = serde_json::to_vec(r).unwrap_or_default();
        line.push(b'\n');
        let _ = write_all(&report_fd, &line);
    };
    // SAFETY: as above.
    let mut commands = Lines::new(unsafe { OwnedFd::from_raw_fd(ctx.to_init_r) }, MAX_CONTROL_LINE);
    match init_setup(ctx, &mut commands) {
        Ok(Some(run)) => {
            let status = init_run(ctx, run);
            report(&status);
            if ctx.listener.is_some() {
                // A template's runs are this namespace's processes too: init lives, and
                // reaps, until the last of them has ended, so a template that dies
                // takes no run with it.
                while let Ok(_) | Err(nix::errno::Errno::EINTR) = waitpid(None, Some(WaitPidFlag::__WALL)) {}
            }
            0
        }
        Ok(None) => 0,
        Err(e) => {
            report(&InitReport::SetupFailed { message: e.to_string() });
            1
        }
    }
}

fn init_setup(ctx: &InitContext, commands: &mut Lines) -> Result<Option<InitRun>, HelperError> {
    // clone(2) copied every descriptor of the helper, its ends of the pipes included;
    // holding those would keep the program's stdin from ever reaching end of file.
    close_all_except(&[
        2,
        ctx.go_r.unwrap_or(ctx.to_init_r),
        ctx.listener.unwrap_or(ctx.to_init_r),
        ctx.to_init_r,
        ctx.from_init_w,
        ctx.stdin_r,
        ctx.stdout_w,
        ctx.stderr_w,
    ])?;
    // If the helper dies, init dies, and the kernel kills the rest of the namespace.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(HelperError::ParentDeathSignal)?;
    // Wait until the helper has written the id maps and placed us in the cgroup.
    match commands.read_line() {
        Ok(Some(_)) => {}
        _ => return Ok(None),
    }
    // Make the run's cgroup the root of our cgroup view: the helper has placed us in it.
    if ctx.cgroup_namespace {
        unshare(CloneFlags::CLONE_NEWCGROUP).map_err(HelperError::UnshareCgroupNamespace)?;
    }
    // The root is built while init still has the host uid it was cloned with, because the
    // staging directories sit in the data directory, which only that uid may enter.
    build_root(&RootSpec {
        new_root: &ctx.staging.join("root"),
        workspace: &ctx.staging.join("work"),
        code: &ctx.staging.join("code"),
        extra_runtime_paths: ctx.extra_runtime_paths,
        node_modules: ctx.node_modules,
        tmp_bytes: ctx.limits.tmp_bytes,
        tool_client: ctx.tool_client,
    })?;
    nix::unistd::sethostname("sandcall").map_err(HelperError::SetHostname)?;
    // Become the sandbox user: from here on the host sees only the mapped unprivileged
    // uid. The capabilities of the new user namespace are kept (uid 0 is not mapped, so
    // the kernel does not clear them) until the program drops them.
    let id = nix::unistd::Gid::from_raw(SANDBOX_ID);
    nix::unistd::setresgid(id, id, id).map_err(HelperError::SetGid)?;
    let id = nix::unistd::Uid::from_raw(SANDBOX_ID);
    nix::unistd::setresuid(id, id, id).map_err(HelperError::SetUid)?;
    // The kernel clears the parent-death signal when the uid changes: set it again, or
    // an init that does not watch the helper's pipes (a template's) outlives the helper.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(HelperError::ParentDeathSignal)?;
    // The program runs as the same uid: keep it from ptracing or reading init's memory.
    nix::sys::prctl::set_dumpable(false).map_err(HelperError::SetDumpable)?;

    // SAFETY: from_init_w is ours; borrowed only for this write.
    let report_fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(ctx.from_init_w) };
    let mut line = serde_json::to_vec(&InitReport::Ready).map_err(HelperError::Encode)?;
    line.push(b'\n');
    let mut written = 0;
    while written < line.len() {
        written += nix::unistd::write(report_fd, &line[written..]).map_err(HelperError::ReportReady)?;
    }

    // The warm-sandbox seam: everything above can happen before a request arrives.
    match commands.read_line() {
        Ok(Some(line)) => serde_json::from_slice(&line)
            .map(Some)
            .map_err(|e| HelperError::BadRun(MessageError::Parse(e))),
        _ => Ok(None),
    }
}

/// Forks the program, then reaps every process of the namespace until the program ends.
fn init_run(ctx: &InitContext, run: InitRun) -> InitReport {
    // SAFETY: init is single-threaded; the child only sets itself up and execs.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            let message = exec_program(ctx, &run);
            // SAFETY: fd 2 is the program's stderr (or init's), open for this process's
            // life; it is borrowed only for this write.
            let stderr = unsafe { std::os::fd::BorrowedFd::borrow_raw(2) };
            let _ = nix::unistd::write(
                stderr,
                format!("sandcall: cannot start the program: {message}\n").as_bytes(),
            );
            // SAFETY: _exit never returns and runs no destructors of the forked copy.
            unsafe { libc::_exit(126) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            for fd in [ctx.stdin_r, ctx.stdout_w, ctx.stderr_w]
                .into_iter()
                .chain(ctx.go_r)
                .chain(ctx.listener)
            {
                let _ = nix::unistd::close(fd);
            }
            loop {
                match waitpid(None, Some(WaitPidFlag::__WALL)) {
                    Ok(WaitStatus::Exited(pid, code)) if pid == child => return InitReport::Exited { code },
                    Ok(WaitStatus::Signaled(pid, sig, _)) if pid == child => {
                        return InitReport::Signaled { signal: sig as i32 }
                    }
                    Ok(_) => {}
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(_) => return InitReport::Signaled { signal: libc::SIGKILL },
                }
            }
        }
        Err(e) => InitReport::SetupFailed {
            message: HelperError::ForkProgram(e).to_string(),
        },
    }
}

/// The last steps before exec, in the program's own process. Returns only on failure.
fn exec_program(ctx: &InitContext, run: &InitRun) -> HelperError {
    match exec_program_steps(ctx, run) {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

enum Never {}

fn exec_program_steps(ctx: &InitContext, run: &InitRun) -> Result<Never, HelperError> {
    // Own session: job control and terminal signals of the helper never reach it.
    nix::unistd::setsid().map_err(HelperError::SetSid)?;
    for (from, to) in [(ctx.stdin_r, 0), (ctx.stdout_w, 1), (ctx.stderr_w, 2)] {
        nix::unistd::dup2(from, to).map_err(HelperError::Dup2)?;
    }
    // A launched program also keeps fd 3, where its go message will arrive.
    if let Some(go) = ctx.go_r {
        nix::unistd::dup2(go, 3).map_err(HelperError::Dup2)?;
        // dup2 onto itself would leave close-on-exec set.
        nix::fcntl::fcntl(3, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()))
            .map_err(HelperError::ClearCloseOnExec)?;
    }
    // A template also keeps its listening socket, as fd 4.
    if let Some(listener) = ctx.listener {
        nix::unistd::dup2(listener, 4).map_err(HelperError::Dup2)?;
        nix::fcntl::fcntl(4, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()))
            .map_err(HelperError::ClearCloseOnExec)?;
    }
    // Every other descriptor goes: the program gets stdio (and fd 3) and nothing else.
    let keep: &[RawFd] = match (ctx.go_r, ctx.listener) {
        (_, Some(_)) => &[0, 1, 2, 3, 4],
        (Some(_), None) => &[0, 1, 2, 3],
        (None, None) => &[0, 1, 2],
    };
    close_all_except(keep)?;
    reset_signals();
    set_rlimits(ctx.limits, ctx.listener.is_some())?;
    // Capabilities last among the privileged steps: the bounding set can only be
    // cleared while CAP_SETPCAP is still held.
    for set in [
        caps::CapSet::Bounding,
        caps::CapSet::Ambient,
        caps::CapSet::Inheritable,
        caps::CapSet::Effective,
        caps::CapSet::Permitted,
    ] {
        if matches!(set, caps::CapSet::Ambient) && !ambient_capabilities_exist() {
            continue;
        }
        caps::clear(None, set).map_err(|source| HelperError::DropCapabilities { set, source })?;
    }
    // no_new_privs: setuid binaries and file capabilities give nothing; it is also what
    // allows an unprivileged process to install a seccomp filter.
    nix::sys::prctl::set_no_new_privs().map_err(HelperError::NoNewPrivs)?;
    // seccomp is the very last step: from here on only execve and the program's own
    // calls happen, all of them under the filter. A template runs no user code and
    // needs unshare and mount to fork its runs, which install this same filter.
    if ctx.listener.is_none() {
        // Landlock just before: its own calls are then behind it. A template's runs
        // apply the same rules themselves (zygote.py, from `landlock.json`).
        let rules = crate::landlock_layer::rules(ctx.extra_runtime_paths, ctx.node_modules.is_some());
        crate::landlock_layer::apply(&rules).map_err(HelperError::Landlock)?;
        ctx.policy.apply()?;
    }
    let argv: Vec<CString> = run.argv.iter().map(|a| cstring(a)).collect::<Result<_, _>>()?;
    let env: Vec<CString> = run
        .env
        .iter()
        .map(|(k, v)| cstring(&format!("{k}={v}")))
        .collect::<Result<_, _>>()?;
    let path = argv.first().ok_or(HelperError::EmptyArgv)?;
    match nix::unistd::execve(path, &argv, &env) {
        Err(source) => Err(HelperError::Execve {
            program: run.argv[0].clone(),
            source,
        }),
        Ok(never) => match never {},
    }
}

/// Whether this kernel has an ambient capability set: gVisor's has none (its `prctl`
/// refuses `PR_CAP_AMBIENT` with EINVAL), so there is nothing to clear.
fn ambient_capabilities_exist() -> bool {
    // SAFETY: a query that changes nothing.
    let r = unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_IS_SET, 0, 0, 0) };
    !(r == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL))
}

/// Closes every descriptor of this process but `keep`.
fn close_all_except(keep: &[RawFd]) -> Result<(), HelperError> {
    let mut keep: Vec<u32> = keep.iter().map(|&fd| fd as u32).collect();
    keep.sort_unstable();
    // No descriptor is at or above the hard RLIMIT_NOFILE; gVisor's kernel refuses a
    // range that goes past it (Linux's clamps it).
    let ceiling = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(_, hard)| hard.min(u64::from(u32::MAX)) as u32)
        .unwrap_or(u32::MAX);
    let mut from = 0u32;
    for fd in keep.into_iter().chain(std::iter::once(ceiling)) {
        let last = fd.min(ceiling).saturating_sub(1);
        if fd > from && last >= from {
            // SAFETY: plain syscall on this process's own descriptor table.
            if unsafe { libc::syscall(libc::SYS_close_range, from, last, 0u32) } != 0 {
                return Err(HelperError::CloseRange(io::Error::last_os_error()));
            }
        }
        from = fd.saturating_add(1);
    }
    Ok(())
}

fn cstring(s: &str) -> Result<CString, HelperError> {
    CString::new(s).map_err(HelperError::NulByte)
}

/// The helper runs with Rust's SIGPIPE disposition (ignored); programs expect defaults.
fn reset_signals() {
    use nix::sys::signal::{sigaction, sigprocmask, SaFlags, SigAction, SigHandler, SigSet, SigmaskHow};
    let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for sig in Signal::iterator() {
        if sig != Signal::SIGKILL && sig != Signal::SIGSTOP {
            // SAFETY: installing the default disposition.
            let _ = unsafe { sigaction(sig, &dfl) };
        }
    }
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
}

/// A template (`template`) keeps the RLIMIT_NPROC it inherited: the kernel counts the
/// processes of every run forked from it against the template's user namespace too,
/// checked against the limit its creator had, so a limit here would be shared by all of
/// its runs (and the template's forks would fail once they held that many processes in
/// all). Each run's program sets the run's own limit in the run's user namespace; the
/// template's cgroup bounds the template's own processes.
fn set_rlimits(limits: &Limits, template: bool) -> Result<(), HelperError> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let cpu_s = limits.cpu_time_ms.div_ceil(1000).max(1) + 1;
    let nproc = if template {
        // The hard limit it inherited: raising it would need a privilege it lacks.
        getrlimit(Resource::RLIMIT_NPROC)
            .map_err(|source| HelperError::GetRlimit {
                resource: Resource::RLIMIT_NPROC,
                source,
            })?
            .1
    } else {
        limits.max_processes
    };
    for (res, value) in [
        (Resource::RLIMIT_NOFILE, limits.max_open_files),
        (Resource::RLIMIT_FSIZE, limits.file_size_bytes),
        (Resource::RLIMIT_NPROC, nproc),
        (Resource::RLIMIT_CORE, 0),
        // A backstop per process; the helper enforces the run's total CPU time.
        (Resource::RLIMIT_CPU, cpu_s),
    ] {
        setrlimit(res, value, value).map_err(|source| HelperError::SetRlimit { resource: res, source })?;
    }
    // The helper caps its own data size with a soft limit; the program's memory is the
    // cgroup's business, so it gets the hard limit whatever it inherited.
    let (_, hard) = getrlimit(Resource::RLIMIT_DATA).map_err(|source| HelperError::GetRlimit {
        resource: Resource::RLIMIT_DATA,
        source,
    })?;
    setrlimit(Resource::RLIMIT_DATA, hard, hard).map_err(|source| HelperError::SetRlimit {
        resource: Resource::RLIMIT_DATA,
        source,
    })?;
    Ok(())
}
