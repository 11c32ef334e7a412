//! `clone3(2)` with `CLONE_INTO_CGROUP`: a child born in its cgroup (cgroup v2 only),
//! so that no moment exists where it runs outside it, and no migration (and, on a memory
//! cgroup, no charge left behind in the parent's) is needed.
//!
//! Where the kernel cannot (no `clone3`: `ENOSYS`, before Linux 5.3 or under a seccomp
//! profile that hides it, as container runtimes' defaults do; no `CLONE_INTO_CGROUP`,
//! before 5.7: `E2BIG` or `EINVAL`), `fork_into_cgroup` says so and the caller forks the
//! usual way and moves the child before it lets it go on, as on cgroup v1.

use nix::errno::Errno;
use nix::unistd::Pid;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `struct clone_args` as of Linux 5.7 (`CLONE_ARGS_SIZE_VER2`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Which side of the fork this is.
#[derive(Debug, PartialEq, Eq)]
pub enum Forked {
    Child,
    Parent(Pid),
}

/// Forks, as fork(2) does (the child gets a copy of the caller's memory and returns from
/// here too), with the namespace `flags` (`CLONE_NEW*`), the child born in the cgroup v2
/// directory `cgroup` (a descriptor opened with `O_PATH` or `O_DIRECTORY`) and
/// `SIGCHLD` at its end. `Ok(None)`: this kernel cannot; nothing was forked.
///
/// # Safety
/// As for fork(2): in a multi-threaded caller, the child may only make
/// async-signal-safe calls (no allocation) until it execs or exits. The child's copy of
/// the C library's cached thread id is its parent's: it must not use pthread calls that
/// rely on it (pthread_kill, raise), which it would not do before exec anyway.
pub unsafe fn fork_into_cgroup(flags: libc::c_int, cgroup: BorrowedFd<'_>) -> Result<Option<Forked>, Errno> {
    let args = CloneArgs {
        flags: (flags as u32 as u64) | CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: the kernel reads `size_of::<CloneArgs>()` bytes of `args`, which lives
    // until the call returns; without CLONE_VM the child runs on its own copy of this
    // stack, as after fork(2) (the caller's contract above).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match ret {
        0 => Ok(Some(Forked::Child)),
        pid if pid > 0 => Ok(Some(Forked::Parent(Pid::from_raw(pid as i32)))),
        _ => match Errno::last() {
            Errno::ENOSYS | Errno::E2BIG | Errno::EINVAL => Ok(None),
            e => Err(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{fork_into_cgroup, Forked};
    use nix::sys::wait::{waitpid, WaitStatus};
    use std::os::fd::{AsFd, AsRawFd, OwnedFd};
    use std::path::PathBuf;

    /// A cgroup v2 hierarchy this host has mounted (this machine: `/sys/fs/cgroup/unified`,
    /// with no controllers, next to the v1 ones), if any, and whether we may use it.
    fn v2_mount() -> Option<PathBuf> {
        if !nix::unistd::geteuid().is_root() {
            return None;
        }
        let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
        mounts.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && f[2] == "cgroup2").then(|| PathBuf::from(f[1]))
        })
    }

    fn open_dir(path: &std::path::Path) -> OwnedFd {
        OwnedFd::from(std::fs::File::open(path).unwrap())
    }

    #[test]
    fn a_child_is_born_in_the_cgroup_v2_it_is_given() {
        let Some(root) = v2_mount() else {
            // Needs root and a cgroup v2 hierarchy: the sandbox tests run as root, and
            // this machine and CI have one. Say so rather than pass silently.
            panic!("no cgroup2 mount in /proc/mounts, or not root");
        };
        let dir = root.join(format!("sandcall-clone3-test-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap();
        let cg = open_dir(&dir);
        let (r, w) = nix::unistd::pipe().unwrap();
        // SAFETY: the child only closes, blocks on a read and exits (async-signal-safe
        // calls), until its parent has looked at it.
        match unsafe { fork_into_cgroup(0, cg.as_fd()) } {
            // SAFETY: raw system calls on descriptors this child owns, then _exit, which
            // runs no destructor of the forked copy.
            Ok(Some(Forked::Child)) => unsafe {
                libc::close(w.as_raw_fd());
                let mut b = [0u8; 1];
                libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), 1);
                libc::_exit(0);
            },
            Ok(Some(Forked::Parent(pid))) => {
                drop(r);
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
                let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
                drop(w);
                assert_eq!(waitpid(pid, None).unwrap(), WaitStatus::Exited(pid, 0));
                std::fs::remove_dir(&dir).unwrap();
                assert_eq!(procs.trim(), pid.to_string(), "the cgroup's processes");
                let name = dir.file_name().unwrap().to_string_lossy().into_owned();
                assert!(
                    own.lines()
                        .any(|l| l.starts_with("0::") && l.ends_with(&format!("/{name}"))),
                    "the child's cgroups: {own}"
                );
            }
            other => {
                let _ = std::fs::remove_dir(&dir);
                panic!(
                    "clone3 into a cgroup v2 on Linux {:?}: {other:?}",
                    nix::sys::utsname::uname().map(|u| u.release().to_owned())
                );
            }
        }
    }

    #[test]
    fn without_clone3_nothing_is_forked_and_the_caller_falls_back() {
        // A kernel (or seccomp profile) without clone3: make it answer ENOSYS, in a
        // child of this test so that nothing else is affected.
        let arch = seccompiler::TargetArch::try_from(std::env::consts::ARCH).unwrap();
        let filter = seccompiler::SeccompFilter::new(
            [(libc::SYS_clone3, vec![])].into_iter().collect(),
            seccompiler::SeccompAction::Allow,
            seccompiler::SeccompAction::Errno(libc::ENOSYS as u32),
            arch,
        )
        .unwrap();
        let program: seccompiler::BpfProgram = filter.try_into().unwrap();
        let cg = open_dir(std::path::Path::new("/"));
        // SAFETY: the child makes only system calls and exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            // SAFETY: the child makes system calls only (fork_into_cgroup's contract holds:
            // it is single-threaded and execs nothing), then _exits.
            nix::unistd::ForkResult::Child => unsafe {
                let _ = nix::sys::prctl::set_no_new_privs();
                if seccompiler::apply_filter(&program).is_err() {
                    libc::_exit(2);
                }
                let code = match fork_into_cgroup(0, cg.as_fd()) {
                    Ok(None) => 0,
                    Ok(Some(Forked::Child)) => libc::_exit(4),
                    _ => 3,
                };
                libc::_exit(code);
            },
            nix::unistd::ForkResult::Parent { child } => {
                assert_eq!(waitpid(child, None).unwrap(), WaitStatus::Exited(child, 0));
            }
        }
    }
}
