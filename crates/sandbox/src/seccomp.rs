//! The seccomp-bpf policy applied to every sandboxed program, as the last step before exec
//! (cold runs) or before the runner takes over (forked runs, `runtime/zygote.py`).
//!
//! The policy is data: `policy/seccomp.json` holds four filters, each call with a comment.
//!
//! - `allow`: the allowlist. Every system call a runtime needs (Python with its data
//!   stack, Node, Bash, Java, Go, R, PHP, the compilers and what they build) is listed;
//!   `socket` only for `AF_UNIX`, `AF_INET`, `AF_INET6` and `AF_NETLINK` with
//!   `NETLINK_ROUTE`, `personality` only to read it or set the default persona. Anything
//!   else, including every call newer than the list, answers ENOSYS before the kernel
//!   sees it. ENOSYS rather than EPERM: it is what a kernel without the call says, so
//!   libc and runtimes take the fallback they already have for older kernels (glibc's
//!   clone3 to clone, statx to fstatat, faccessat2 to faccessat; Go and Java likewise)
//!   instead of treating EPERM as a hard failure.
//! - `refuse_families`: `socket` of any other family answers EAFNOSUPPORT, as a kernel
//!   without that family's module does, so the host never loads one for a run.
//! - `refuse_protocols`: `socket` of `AF_INET`/`AF_INET6` with a protocol other than
//!   TCP, UDP and ICMP (SCTP, DCCP, ...) or of netlink other than route answers
//!   EPROTONOSUPPORT, for the same reason.
//! - `refuse_eperm`: calls a run must not make at all (mounts, ptrace, keyrings, eBPF,
//!   io_uring, nested namespaces, the clock, ...) answer EPERM, the answer the layers
//!   underneath (namespaces, no capabilities) would give.
//! - `refuse_enosys`: clone3, whose flags a filter cannot read.
//!
//! When several filters refuse a call with an errno, the kernel answers with the most
//! recently installed one's: `compile` orders the filters so that the `refuse_*` filters
//! speak before the allowlist's ENOSYS.

use seccompiler::{BpfProgram, TargetArch};

const POLICY: &str = include_str!("../policy/seccomp.json");

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp policy does not compile: {0}")]
    Compile(String),
    #[error("installing the seccomp filter: {0}")]
    Install(String),
}

/// The compiled filters, in the order they are installed.
pub struct Policy {
    filters: Vec<BpfProgram>,
}

impl Policy {
    pub fn compile() -> Result<Self, SeccompError> {
        let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| SeccompError::Compile(format!("{e:?}")))?;
        let mut map = seccompiler::compile_from_json(POLICY.as_bytes(), arch)
            .map_err(|e| SeccompError::Compile(e.to_string()))?;
        let mut filters = Vec::new();
        if arch == TargetArch::x86_64 {
            filters.push(refuse_x32());
        }
        // Installed in this order, evaluated in the reverse: see the module's notes.
        for name in [
            "allow",
            "refuse_families",
            "refuse_protocols",
            "refuse_eperm",
            "refuse_enosys",
        ] {
            let prog = map
                .remove(name)
                .ok_or_else(|| SeccompError::Compile(format!("filter {name} missing")))?;
            filters.push(prog);
        }
        Ok(Policy { filters })
    }

    /// The filters as a forked run's program installs them (`runtime/zygote.py`): for
    /// each, in order, its instruction count as a native-endian u32, then its
    /// instructions (`code` u16, `jt` u8, `jf` u8, `k` u32, native-endian).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for f in &self.filters {
            out.extend_from_slice(&(f.len() as u32).to_ne_bytes());
            for i in f {
                out.extend_from_slice(&i.code.to_ne_bytes());
                out.push(i.jt);
                out.push(i.jf);
                out.extend_from_slice(&i.k.to_ne_bytes());
            }
        }
        out
    }

    /// Installs every filter on the calling thread. no_new_privs must already be set.
    pub fn apply(&self) -> Result<(), SeccompError> {
        for f in &self.filters {
            seccompiler::apply_filter(f).map_err(|e| SeccompError::Install(e.to_string()))?;
        }
        Ok(())
    }
}

/// On x86_64 the x32 ABI reaches the same kernel entry points with bit 30 set in the
/// syscall number, which a filter keyed on plain numbers would let through. The
/// generated filters check the architecture but not this bit, so a four-instruction
/// filter refuses every x32 call.
fn refuse_x32() -> BpfProgram {
    use seccompiler::sock_filter;
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const X32_BIT: u32 = 0x4000_0000;
    const RET_ERRNO_ENOSYS: u32 = 0x0005_0000 | libc::ENOSYS as u32;
    const RET_ALLOW: u32 = 0x7fff_0000;
    vec![
        sock_filter {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        }, // seccomp_data.nr
        sock_filter {
            code: JGE_K,
            jt: 0,
            jf: 1,
            k: X32_BIT,
        },
        sock_filter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: RET_ERRNO_ENOSYS,
        },
        sock_filter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: RET_ALLOW,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_compiles_and_lists_the_refused_calls() {
        let policy = Policy::compile().expect("policy compiles");
        assert_eq!(policy.filters.len(), if cfg!(target_arch = "x86_64") { 6 } else { 5 });
        for name in [
            "ptrace",
            "mount",
            "unshare",
            "setns",
            "keyctl",
            "bpf",
            "io_uring_setup",
            "perf_event_open",
            "userfaultfd",
            "init_module",
            "settimeofday",
            "fanotify_init",
            "inotify_init",
            "inotify_init1",
            "inotify_add_watch",
        ] {
            assert!(
                POLICY.contains(&format!("\"syscall\": \"{name}\"")),
                "{name} is refused"
            );
        }
    }

    /// What a forked run's program installs (runtime/zygote.py reads this layout): each
    /// filter's count, then its instructions, 8 bytes each, in order.
    #[test]
    fn the_filters_serialize_as_counts_and_instructions() {
        let policy = Policy::compile().expect("policy compiles");
        let bytes = policy.to_bytes();
        let mut at = 0;
        for f in &policy.filters {
            let count = u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            assert_eq!(count, f.len());
            let first = &bytes[at + 4..at + 12];
            assert_eq!(u16::from_ne_bytes([first[0], first[1]]), f[0].code);
            assert_eq!(u32::from_ne_bytes(first[4..8].try_into().unwrap()), f[0].k);
            at += 4 + 8 * count;
        }
        assert_eq!(at, bytes.len());
    }

    /// Runs `check` in a forked child under the policy (a loaded filter cannot be
    /// removed); the child exits with the number of the first failed expectation.
    fn in_filtered_child(check: fn() -> i32) {
        let policy = Policy::compile().unwrap();
        // SAFETY: the child only makes plain system calls before _exit.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let ok = nix::sys::prctl::set_no_new_privs().is_ok() && policy.apply().is_ok();
                let code = if ok { check() } else { 100 };
                // SAFETY: _exit never returns and runs no destructor of the forked copy.
                unsafe { libc::_exit(code) };
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
            }
        }
    }

    /// The errno of a raw system call, or 0 if it succeeded.
    fn errno_of(r: libc::c_long) -> i32 {
        if r < 0 {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
        } else {
            0
        }
    }

    #[test]
    fn filter_refuses_in_a_child() {
        in_filtered_child(|| {
            // SAFETY: a plain system call on an integer flag.
            let r = unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUTS) };
            if errno_of(r) != libc::EPERM {
                return 1;
            }
            0
        });
    }

    /// What is not listed answers ENOSYS, other socket families EAFNOSUPPORT, and
    /// what is listed still works.
    #[test]
    fn the_allowlist_refuses_what_it_does_not_list() {
        in_filtered_child(|| {
            // SAFETY: system calls on integers only; the refused ones never reach the kernel.
            unsafe {
                if errno_of(libc::syscall(1000)) != libc::ENOSYS {
                    return 1;
                }
                if errno_of(libc::syscall(libc::SYS_kcmp, 0, 0, 0, 0, 0)) != libc::ENOSYS {
                    return 2;
                }
                if errno_of(libc::syscall(libc::SYS_personality, 0x0040_0000)) != libc::ENOSYS {
                    return 3;
                }
                if errno_of(libc::syscall(libc::SYS_socket, libc::AF_ALG, libc::SOCK_SEQPACKET, 0))
                    != libc::EAFNOSUPPORT
                {
                    return 4;
                }
                let audit = libc::syscall(libc::SYS_socket, libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_AUDIT);
                if errno_of(audit) != libc::EPROTONOSUPPORT {
                    return 5;
                }
                let route = libc::syscall(libc::SYS_socket, libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE);
                if errno_of(route) != 0 {
                    return 6;
                }
                if errno_of(libc::syscall(libc::SYS_socket, libc::AF_UNIX, libc::SOCK_STREAM, 0)) != 0 {
                    return 7;
                }
                if errno_of(libc::syscall(libc::SYS_getpid)) != 0 {
                    return 8;
                }
            }
            0
        });
    }
}
