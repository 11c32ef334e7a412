//! The hostile programs that make sense in JavaScript (fixtures `tests/hostile/*.mjs`):
//! each is contained, and the server then runs a normal program. In CI's warm pass
//! (SANDCALL_TEST_WARM_POOL) they run in warm JavaScript sandboxes.

use crate::common::{assert_run_reclaimed, hostile, Server};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn js_server() -> Server {
    Server::start_with(&[("SANDCALL_WARM_LANGUAGES", r#"["javascript"]"#)], "")
}

fn js(s: &Server, fixture: &str, extra: Value) -> Value {
    let mut body = json!({"lang": "js", "code": hostile(fixture)});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    s.exec(body)
}

fn assert_js_still_runs(s: &Server) {
    let r = s.exec(json!({"lang": "js", "code": "console.log(6 * 7)"}));
    assert_eq!(r["stdout"], "42\n", "{r}");
    s.assert_healthy();
}

#[test]
fn js_fork_bomb_is_held_by_the_pids_limit() {
    let s = js_server();
    let t = Instant::now();
    let r = js(
        &s,
        "fork_bomb.mjs",
        json!({"timeout": 5000, "limits": {"max_processes": 32}}),
    );
    assert_eq!(r["status"], "timed_out", "{r}");
    assert!(t.elapsed() < Duration::from_secs(20), "took {:?}", t.elapsed());
    let out: Value = serde_json::from_str(r["stdout"].as_str().unwrap().trim()).unwrap_or_else(|e| panic!("{e}: {r}"));
    // Node's own threads count against the limit too: fewer than 32 children.
    assert_eq!(out["error"], "EAGAIN", "{r}");
    assert!(out["spawned"].as_u64().unwrap() < 32, "{r}");
    assert_run_reclaimed(&s, r["session_id"].as_str().unwrap());
    assert_js_still_runs(&s);
}

#[test]
fn js_memory_bomb_is_oom_killed() {
    let s = js_server();
    let r = js(
        &s,
        "memory_bomb.mjs",
        json!({"timeout": 30000, "limits": {"memory_limit_mb": 128}}),
    );
    assert_eq!(r["status"], "killed", "{r}");
    assert_eq!(r["oom_killed"], true, "{r}");
    let peak = r["memory_peak"].as_u64().unwrap();
    assert!(peak <= crate::common::memory_bound(128), "memory_peak {peak}");
    assert_js_still_runs(&s);
}

#[test]
fn js_cpu_spin_is_killed_at_the_timeout() {
    let s = js_server();
    let r = js(&s, "cpu_spin.mjs", json!({"timeout": 700}));
    assert_eq!(r["status"], "timed_out", "{r}");
    let wall = r["execution_time"].as_u64().unwrap();
    assert!((700..900).contains(&wall), "killed at {wall} ms");
    let r = js(
        &s,
        "cpu_spin.mjs",
        json!({"timeout": 20000, "limits": {"cpu_time_limit_ms": 300}}),
    );
    assert_eq!(r["status"], "killed", "{r}");
    assert_js_still_runs(&s);
}

#[test]
fn js_has_no_network() {
    let s = js_server();
    let r = js(&s, "network.mjs", json!({"timeout": 15000}));
    assert_eq!(r["status"], "ok", "{r}");
    let out: Value = serde_json::from_str(r["stdout"].as_str().unwrap().trim()).unwrap_or_else(|e| panic!("{e}: {r}"));
    assert_ne!(out["connect"], "connected", "{r}");
    assert_ne!(out["dns"], "resolved", "{r}");
    assert_ne!(out["fetch"], "fetched", "{r}");
    assert_js_still_runs(&s);
}

#[test]
fn node_starts_under_the_default_limits_and_seccomp() {
    // V8 reserves far more address space than memory_limit_mb and starts threads: both
    // must stay within the limits, and node must start with the smallest memory a
    // request may ask for that holds it.
    let s = js_server();
    let r = s.exec(json!({"lang": "js", "code": "const fs = require('fs');\nconst threads = fs.readdirSync('/proc/self/task').length;\nconsole.log(threads > 1, typeof WebAssembly.instantiate);", "limits": {"memory_limit_mb": 64}}));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "true function\n", "{r}");
}
