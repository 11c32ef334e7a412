//! Landlock, the second layer (crates/sandbox/src/landlock_layer.rs): what the mounts
//! allow a program but Landlock refuses, in cold and forked runs. In the gvisor tier
//! gVisor's kernel has no Landlock: the run must go on without it.

use crate::common::{gvisor_pass, hostile, Server};
use serde_json::{json, Value};

/// The host kernel's Landlock ABI (0: none).
fn host_abi() -> i64 {
    // SAFETY: the version query reads no memory.
    let r = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) };
    r.max(0)
}

fn check(r: &Value, forked: bool) {
    assert_eq!(r["status"], "ok", "{r}");
    let v: Value = serde_json::from_str(r["stdout"].as_str().unwrap().trim()).unwrap_or_else(|e| panic!("{e}: {r}"));
    for what in ["tmp", "dev_shm", "mnt_data", "dev_null", "exec_tmp", "kill_child"] {
        assert_eq!(v[what], "ok", "{what} must still work: {v}");
    }
    if gvisor_pass() || host_abi() == 0 {
        return;
    }
    assert!(v["abi"].as_i64().unwrap() >= 1, "{v}");
    // /proc is mounted writable for the process's own files; Landlock grants it read only.
    assert_eq!(v["proc_comm"], "EACCES", "{v}");
    if host_abi() >= 6 && forked {
        // A forked run's init runs as the program's uid: only Landlock's signal scope
        // stops the program from signalling it. (A cold run's init is root in the
        // namespace, which the kernel's own permission check already refuses.)
        assert_eq!(v["kill_init"], "EPERM", "{v}");
    }
}

#[test]
fn landlock_refuses_what_the_mounts_would_allow() {
    let s = Server::start();
    check(&s.exec(json!({"code": hostile("landlock.py")})), false);
    s.assert_healthy();
}

#[test]
fn a_forked_run_is_under_the_same_landlock_rules_and_cannot_signal_its_init() {
    if crate::common::gvisor_pass() {
        // A gVisor sandbox holds one run: nothing is forked in that tier (pool.rs).
        return;
    }
    let s = crate::zygote::forked_server(1, None);
    check(
        &crate::zygote::run_forked(&s, json!({"code": hostile("landlock.py")})),
        true,
    );
    s.assert_healthy();
}
