//! The syscall allowlist (crates/sandbox/policy/seccomp.json): the calls and socket
//! families of issue 25's finding 3, refused in cold and forked runs, while the netlink
//! route socket glibc's resolver uses still opens.

use crate::common::{hostile, Server};
use serde_json::{json, Value};

const ENOSYS: u64 = 38;
const EPROTONOSUPPORT: u64 = 93;
const EAFNOSUPPORT: u64 = 97;

fn check_policy(r: &Value) {
    assert_eq!(r["status"], "ok", "{r}");
    let v: Value = serde_json::from_str(r["stdout"].as_str().unwrap().trim()).unwrap_or_else(|e| panic!("{e}: {r}"));
    for name in [
        "modify_ldt",
        "kcmp",
        "personality",
        "mbind",
        "set_mempolicy",
        "move_pages",
        "migrate_pages",
        "process_madvise",
        "memfd_secret",
        "statmount",
        "listmount",
        "lsm_get_self_attr",
        "lsm_list_modules",
        "mseal",
        "open_tree_attr",
        "above_the_policy",
    ] {
        assert_eq!(v[name], ENOSYS, "{name} was not refused with ENOSYS: {v}");
    }
    // Let through by the policy (gVisor's kernel answers the query itself with EINVAL).
    assert_ne!(v["personality_query"], ENOSYS, "{v}");
    for (name, errno) in v["families"].as_object().unwrap() {
        assert_eq!(errno, EAFNOSUPPORT, "{name} was not refused: {v}");
    }
    for (name, errno) in v["protocols"].as_object().unwrap() {
        assert_eq!(errno, EPROTONOSUPPORT, "{name} was not refused: {v}");
    }
    for (name, errno) in v["allowed"].as_object().unwrap() {
        assert_eq!(errno, 0, "{name} was refused: {v}");
    }
    assert!(v["if_nameindex"].as_array().unwrap().contains(&json!("lo")), "{v}");
}

#[test]
fn calls_outside_the_allowlist_answer_enosys_and_socket_families_are_limited() {
    let s = Server::start();
    check_policy(&s.exec(json!({"code": hostile("policy.py")})));
    s.assert_healthy();
}

/// A forked run installs the filters the helper compiled (`runtime/zygote.py`): the same
/// refusals hold there.
#[test]
fn a_forked_run_has_the_same_allowlist() {
    if crate::common::gvisor_pass() {
        // A gVisor sandbox holds one run: nothing is forked in that tier (pool.rs).
        return;
    }
    let s = crate::zygote::forked_server(1, None);
    check_policy(&crate::zygote::run_forked(&s, json!({"code": hostile("policy.py")})));
    s.assert_healthy();
}
