//! The helper launcher (`sandcall helper-launcher`): a small, single-threaded
//! process the server starts once, which forks each sandbox's helper from itself instead
//! of the server exec'ing the binary for each one. An exec of the release binary costs
//! about 1.4 ms of CPU (the dynamic loader's relocations, the copy-on-write faults they
//! take, the process start); a fork of this process, which did all of that once, costs a
//! fraction of it.
//!
//! The protocol, on a `SOCK_SEQPACKET` socket that is the launcher's fd 0:
//! - the server sends one byte with two descriptors (`SCM_RIGHTS`): the read end of the
//!   helper's stdin and the write end of its stdout;
//! - the launcher forks with `CLONE_PARENT`, so that the helper is the *server's* child,
//!   exactly as an exec'd one is: the server waits for it and reaps it, its parent-death
//!   signal fires when the server dies, and it lives on if the launcher dies;
//! - the forked helper itself answers with its pid ([`Reply`]) before anything else, so
//!   that a launcher killed between its fork and an answer of its own could not leave a
//!   helper the server does not know of; a fork that fails is answered by the launcher.
//! - when the server closes its end, the launcher exits; it also has a parent-death
//!   signal of its own.
//!
//! What a forked helper starts with is what an exec'd one does: the launcher was
//! started with an empty environment and the server's stderr, holds no descriptor
//! but its socket, `/dev/null` and stderr (the socket is replaced by the helper's stdin),
//! never installs a signal handler, blocks no signal, and never uses the standard output
//! or a `HashMap` (whose keys a fork would share) before it forks. It holds no secret:
//! it receives nothing but pipe ends.

use nix::errno::Errno;
use nix::sys::socket::{send, MsgFlags};
use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

/// The name (`comm`) the launcher shows in `ps` and `/proc/<pid>/comm`; the helpers it
/// forks take back the name an exec'd helper has.
pub const LAUNCHER_NAME: &str = "sandcall-launch";

/// The launcher's answer to one request: 4 bytes, native order. Positive: the pid of
/// the forked helper (sent by the helper itself); negative: `-errno` of a failed fork.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Forked(i32),
    Failed(Errno),
}

impl Reply {
    pub const LEN: usize = 4;

    pub fn encode(self) -> [u8; Self::LEN] {
        match self {
            Reply::Forked(pid) => pid.to_ne_bytes(),
            Reply::Failed(errno) => (-(errno as i32)).to_ne_bytes(),
        }
    }

    /// `None` for anything that is not one answer.
    pub fn decode(bytes: &[u8]) -> Option<Reply> {
        let value = i32::from_ne_bytes(bytes.try_into().ok()?);
        match value {
            0 | i32::MIN => None,
            pid if pid > 0 => Some(Reply::Forked(pid)),
            neg => Some(Reply::Failed(Errno::from_raw(-neg))),
        }
    }
}

/// Entry point of `sandcall helper-launcher`; fd 0 is the server's socket.
/// Returns the process exit code; a forked helper never returns from here (it exits
/// with its own code).
pub fn run_launcher() -> i32 {
    // Dies with the server. Were the server gone already, its end of the socket is
    // closed and the first receive below ends the launcher.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    // Everything the server holds is close-on-exec; this makes sure, for the launcher
    // and so for every helper it forks.
    close_from(3);
    let helper_name = nix::sys::prctl::get_name().ok();
    if let Ok(name) = CString::new(LAUNCHER_NAME) {
        let _ = nix::sys::prctl::set_name(&name);
    }
    loop {
        let (stdin, stdout) = match receive() {
            Ok(Some(ends)) => ends,
            Ok(None) => return 0,
            Err(Errno::EINTR) => continue,
            Err(Errno::EBADMSG) => {
                let _ = answer(Reply::Failed(Errno::EBADMSG));
                continue;
            }
            Err(e) => {
                eprintln!("sandcall launcher: receiving a request: {e}");
                return 1;
            }
        };
        // SAFETY: the launcher is single-threaded, so the child may do anything; with
        // CLONE_PARENT and no CLONE_VM it is a fork whose parent is the server.
        match unsafe { fork_as_sibling() } {
            Ok(0) => {
                let code = helper_main(stdin, stdout, helper_name.as_deref());
                std::process::exit(code);
            }
            // The helper answers for itself; the launcher's copies of its ends close.
            Ok(_) => {}
            Err(e) => {
                let _ = answer(Reply::Failed(e));
            }
        }
    }
}

/// In the forked child: answers with its pid, takes the two pipe ends as its stdin and
/// stdout, and runs the helper.
fn helper_main(stdin: OwnedFd, stdout: OwnedFd, name: Option<&std::ffi::CStr>) -> i32 {
    if answer(Reply::Forked(std::process::id() as i32)).is_err() {
        return 1;
    }
    // dup2 onto 0 closes the launcher's socket in this process; the copies dup2 makes
    // are not close-on-exec, as an exec'd helper's stdin and stdout are not.
    if nix::unistd::dup2(stdin.as_raw_fd(), 0).is_err() || nix::unistd::dup2(stdout.as_raw_fd(), 1).is_err() {
        return 1;
    }
    drop((stdin, stdout));
    close_from(3);
    if let Some(name) = name {
        let _ = nix::sys::prctl::set_name(name);
    }
    // The launcher blocks no signal; the mask is cleared anyway, as a new process's is.
    let _ = nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&nix::sys::signal::SigSet::empty()),
        None,
    );
    crate::helper::run_helper()
}

/// fork(2) with `CLONE_PARENT`: the child's parent is the launcher's parent.
///
/// # Safety
/// As for fork(2). The child's copy of the C library's cached thread id is the
/// launcher's; the helper uses no pthread call that relies on it.
unsafe fn fork_as_sibling() -> Result<libc::pid_t, Errno> {
    // SAFETY: no CLONE_VM, no new stack: the child runs on its copy of this one, as
    // after fork(2). The exit signal is the launcher's own (SIGCHLD) under CLONE_PARENT.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(ret as libc::pid_t)
    }
}

/// One request: `Ok(None)` once the server closed its end.
fn receive() -> Result<Option<(OwnedFd, OwnedFd)>, Errno> {
    let mut byte = [0u8; 1];
    let (bytes, fds, truncated) = crate::io::receive_fds::<2>(0, &mut byte, MsgFlags::empty())?;
    if bytes == 0 {
        return Ok(None);
    }
    match <[OwnedFd; 2]>::try_from(fds) {
        Ok([stdin, stdout]) if !truncated => Ok(Some((stdin, stdout))),
        _ => Err(Errno::EBADMSG),
    }
}

fn answer(reply: Reply) -> Result<(), Errno> {
    // SAFETY: fd 0 is the socket for as long as this process runs the launcher.
    let socket = unsafe { BorrowedFd::borrow_raw(0) };
    send(socket.as_raw_fd(), &reply.encode(), MsgFlags::MSG_NOSIGNAL).map(|_| ())
}

/// Closes every descriptor from `first` up.
fn close_from(first: libc::c_uint) {
    // SAFETY: a plain system call; nothing of this process's Rust code owns a
    // descriptor above 2 at the points it is called.
    unsafe { libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, 0u32) };
}

#[cfg(test)]
mod tests {
    use super::Reply;
    use nix::errno::Errno;

    #[test]
    fn replies_round_trip_and_junk_is_refused() {
        for reply in [Reply::Forked(1), Reply::Forked(4_194_304), Reply::Failed(Errno::EAGAIN)] {
            assert_eq!(Reply::decode(&reply.encode()), Some(reply));
        }
        assert_eq!(Reply::decode(&0i32.to_ne_bytes()), None);
        assert_eq!(Reply::decode(&i32::MIN.to_ne_bytes()), None);
        assert_eq!(Reply::decode(&[1, 2, 3]), None);
    }
}
