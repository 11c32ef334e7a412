//! Landlock: a second layer, independent of the mount tree, applied to every sandboxed
//! program just before its seccomp filter (cold runs: `helper/init.rs`; forked runs:
//! `runtime/zygote.py`, from the plan this module writes).
//!
//! The program may read and execute only the runtime paths the sandbox binds (and its
//! code), read `/etc` and `/proc`, use the bound device nodes, and write only its tmpfs
//! mounts and working directory (`/tmp`, `/dev/shm`, `/mnt/data`). With ABI 6 and later
//! it can neither connect to abstract Unix sockets nor signal processes created outside
//! its own domain (the sandbox's init). If a bind or a mount ever exposed more than it
//! should, these rules still hold.
//!
//! Best effort by ABI: a kernel with an older Landlock gets the rights it knows, and a
//! kernel without Landlock (gVisor's, or one booted without it) runs the program under
//! the other layers only; `sandcall doctor` says which.

use landlock::{
    Access, AccessFs, BitFlags, PathBeneath, PathFd, RestrictionStatus, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetError, RulesetStatus, Scope, ABI,
};
use std::path::{Path, PathBuf};

/// The newest ABI whose rights this policy asks for (and was tested with); newer
/// kernels get exactly these, older ones the subset they know.
const TARGET: ABI = ABI::V6;

/// What a program may do beneath one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// List directories (the root: `ls /` works, nothing under it is readable by this).
    List,
    /// Read files and directories (configuration, `/proc`).
    Read,
    /// Read and execute (the runtime, the code).
    ReadExecute,
    /// Read and write existing device nodes (`/dev/null`, `/dev/urandom`, `/dev/tty`).
    Devices,
    /// Everything (the run's own tmpfs mounts and working directory).
    Write,
}

impl Grant {
    fn access(self) -> BitFlags<AccessFs> {
        match self {
            Grant::List => AccessFs::ReadDir.into(),
            Grant::Read => AccessFs::ReadFile | AccessFs::ReadDir,
            Grant::ReadExecute => AccessFs::ReadFile | AccessFs::ReadDir | AccessFs::Execute,
            Grant::Devices => {
                AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::ReadDir | AccessFs::Truncate | AccessFs::IoctlDev
            }
            Grant::Write => AccessFs::from_all(TARGET),
        }
    }
}

/// The rules, as paths inside the sandbox's root (the same in cold and forked runs).
pub fn rules(extra_runtime_paths: &[PathBuf], node_modules: bool) -> Vec<(PathBuf, Grant)> {
    let mut rules = vec![(PathBuf::from("/"), Grant::List)];
    for name in crate::mounts::RUNTIME_TOP {
        rules.push((Path::new("/").join(name), Grant::ReadExecute));
    }
    for extra in extra_runtime_paths {
        rules.push((extra.clone(), Grant::ReadExecute));
    }
    if node_modules {
        rules.push((PathBuf::from("/node_modules"), Grant::ReadExecute));
    }
    rules.extend([
        (PathBuf::from("/run/sandcall"), Grant::ReadExecute),
        (PathBuf::from("/etc"), Grant::Read),
        (PathBuf::from("/proc"), Grant::Read),
        (PathBuf::from("/dev"), Grant::Devices),
        (PathBuf::from("/dev/shm"), Grant::Write),
        (PathBuf::from("/tmp"), Grant::Write),
        (PathBuf::from("/mnt/data"), Grant::Write),
    ]);
    rules
}

/// The kernel's Landlock ABI version: 0 when it has none (or it is disabled).
pub fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the version query reads no memory (a null attribute of size 0).
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(r).unwrap_or(0).max(0)
}

/// Restricts the calling process (no_new_privs must be set). Paths that do not exist
/// in this sandbox are skipped. Returns whether Landlock is in force.
pub fn apply(rules: &[(PathBuf, Grant)]) -> Result<bool, RulesetError> {
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(TARGET))?
        .scope(Scope::from_all(TARGET))?
        .create()?;
    for (path, grant) in rules {
        // A missing path (no /lib32 on this host) is no rule; nothing else fails here.
        let Ok(fd) = PathFd::new(path) else { continue };
        ruleset = ruleset.add_rule(PathBeneath::new(fd, grant.access()))?;
    }
    let RestrictionStatus { ruleset, .. } = ruleset.restrict_self()?;
    Ok(ruleset != RulesetStatus::NotEnforced)
}

/// What a forked run applies itself (`runtime/zygote.py`, `_apply_landlock`), with the
/// masks this kernel knows: `{"abi", "fs", "scoped", "rules": [[path, mask], ...]}`.
/// `abi` 0 means no Landlock: the run goes on without it.
pub fn plan(rules: &[(PathBuf, Grant)]) -> serde_json::Value {
    let abi = ABI::from(kernel_abi().min(TARGET as i32));
    let fs = AccessFs::from_all(abi);
    let scoped = Scope::from_all(abi);
    let rules: Vec<serde_json::Value> = rules
        .iter()
        .map(|(path, grant)| serde_json::json!([path, (grant.access() & fs).bits()]))
        .collect();
    serde_json::json!({
        "abi": abi as i32,
        "fs": fs.bits(),
        "scoped": scoped.bits(),
        "rules": rules,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writable_paths_are_only_the_runs_own_mounts() {
        let rules = rules(&[PathBuf::from("/opt/r")], true);
        let writable: Vec<_> = rules
            .iter()
            .filter(|(_, g)| g.access().contains(AccessFs::MakeReg))
            .map(|(p, _)| p.to_str().unwrap())
            .collect();
        assert_eq!(writable, ["/dev/shm", "/tmp", "/mnt/data"]);
        assert!(rules.contains(&(PathBuf::from("/opt/r"), Grant::ReadExecute)));
    }

    #[test]
    fn the_plan_holds_no_right_the_kernel_lacks() {
        let plan = plan(&rules(&[], false));
        let fs = plan["fs"].as_u64().unwrap();
        for rule in plan["rules"].as_array().unwrap() {
            assert_eq!(rule[1].as_u64().unwrap() & !fs, 0, "{rule}");
        }
        if kernel_abi() == 0 {
            assert_eq!(plan["abi"], 0);
        }
    }
}
