//! The hostile programs that make sense in the compiled languages (fixtures
//! `tests/hostile/*.c`, `*.cpp`, `*.go`, `*.java`), and compilers fed hostile input:
//! each is contained by the run's own limits, and the server then runs a normal program.
//! These languages have no warm sandboxes, so CI's warm pass runs them cold, beside warm
//! Python and Bash ones.

use crate::common::{assert_run_reclaimed, hostile, Server};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// Fails loudly (never skips) when a toolchain is not installed.
fn require(tool: &str, package: &str) {
    assert!(
        Path::new("/usr/bin").join(tool).exists(),
        "/usr/bin/{tool} is missing: install the Debian package {package} (.ci/run does)"
    );
}

fn run(s: &Server, lang: &str, fixture: &str, extra: Value) -> Value {
    let mut body = json!({"lang": lang, "code": hostile(fixture)});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    s.exec(body)
}

fn json_stdout(r: &Value) -> Value {
    serde_json::from_str(r["stdout"].as_str().unwrap().trim()).unwrap_or_else(|e| panic!("{e}: {r}"))
}

fn assert_c_still_runs(s: &Server) {
    let r = s.exec(
        json!({"lang": "c", "code": "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 6 * 7); return 0; }\n"}),
    );
    assert_eq!(r["stdout"], "42\n", "{r}");
    s.assert_healthy();
}

#[test]
fn c_fork_bomb_is_held_by_the_pids_limit() {
    require("gcc", "gcc");
    let s = Server::start();
    let t = Instant::now();
    let r = run(
        &s,
        "c",
        "fork_bomb.c",
        json!({"timeout": 4000, "limits": {"max_processes": 32}}),
    );
    assert_eq!(r["status"], "timed_out", "{r}");
    assert!(t.elapsed() < Duration::from_secs(20), "took {:?}", t.elapsed());
    let out = json_stdout(&r);
    assert_eq!(out["error"], "EAGAIN", "{r}");
    assert!(out["spawned"].as_u64().unwrap() < 32, "{r}");
    assert_run_reclaimed(&s, r["session_id"].as_str().unwrap());
    assert_c_still_runs(&s);
}

#[test]
fn c_memory_bomb_is_oom_killed() {
    require("gcc", "gcc");
    let s = Server::start();
    let r = run(
        &s,
        "c",
        "memory_bomb.c",
        json!({"timeout": 30000, "limits": {"memory_limit_mb": 128}}),
    );
    assert_eq!(r["status"], "killed", "{r}");
    assert_eq!(r["oom_killed"], true, "{r}");
    assert_eq!(r["signal"], "SIGKILL", "{r}");
    let peak = r["memory_peak"].as_u64().unwrap();
    assert!(peak <= crate::common::memory_bound(128), "memory_peak {peak}");
    assert_c_still_runs(&s);
}

#[test]
fn c_cpu_spin_is_killed_at_the_timeout_compile_included() {
    require("gcc", "gcc");
    let s = Server::start();
    // The timeout covers the compile and the run: the whole run ends at 1500 ms.
    let r = run(&s, "c", "cpu_spin.c", json!({"timeout": 1500}));
    assert_eq!(r["status"], "timed_out", "{r}");
    let wall = r["execution_time"].as_u64().unwrap();
    assert!((1500..1700).contains(&wall), "killed at {wall} ms");
    let r = run(
        &s,
        "c",
        "cpu_spin.c",
        json!({"timeout": 20000, "limits": {"cpu_time_limit_ms": 400}}),
    );
    assert_eq!(r["status"], "killed", "{r}");
    assert_c_still_runs(&s);
}

#[test]
fn c_has_no_network() {
    require("gcc", "gcc");
    let s = Server::start();
    let r = run(&s, "c", "network.c", json!({"timeout": 15000}));
    assert_eq!(r["status"], "ok", "{r}");
    let out = json_stdout(&r);
    assert_ne!(out["connect"], "connected", "{r}");
    assert_ne!(out["dns"], "resolved", "{r}");
    assert_c_still_runs(&s);
}

#[test]
fn c_cannot_write_outside_its_scratch_space() {
    require("gcc", "gcc");
    let s = Server::start();
    let r = run(&s, "c", "write_outside.c", json!({}));
    assert_eq!(r["status"], "ok", "{r}");
    let out = json_stdout(&r);
    let out = out.as_object().unwrap();
    assert_eq!(out.len(), 8, "{r}");
    for (path, outcome) in out {
        if path == "/tmp/sandcall-x" {
            assert_eq!(outcome, "written", "{r}");
        } else {
            assert_ne!(outcome, "written", "{path}: {r}");
        }
    }
    assert_c_still_runs(&s);
}

#[test]
fn an_endless_compile_is_stopped_by_the_timeout() {
    require("g++", "g++");
    let s = Server::start();
    let t = Instant::now();
    let r = run(&s, "cpp", "compile_endless.cpp", json!({"timeout": 2000}));
    assert_eq!(r["status"], "timed_out", "{r}");
    assert_eq!(r["timed_out"], true, "{r}");
    let wall = r["execution_time"].as_u64().unwrap();
    assert!((2000..2200).contains(&wall), "killed at {wall} ms");
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
    assert_run_reclaimed(&s, r["session_id"].as_str().unwrap());
    assert_c_still_runs(&s);
}

#[test]
fn a_huge_compile_is_stopped_by_the_memory_limit() {
    require("gcc", "gcc");
    let s = Server::start();
    let r = run(
        &s,
        "c",
        "compile_huge.c",
        json!({"timeout": 30000, "limits": {"memory_limit_mb": 128}}),
    );
    assert_eq!(r["oom_killed"], true, "{r}");
    let stderr = r["stderr"].as_str().unwrap();
    let peak = r["memory_peak"].as_u64().unwrap();
    if crate::common::gvisor_pass() {
        // The host kernel ends the whole gVisor sandbox, the compiler's driver with it;
        // the peak counts gVisor's own kernel (`gvisor::KERNEL_MEMORY`).
        assert_eq!(r["status"], "killed", "{r}");
        assert!(stderr.ends_with("[sandbox] Out of memory\n"), "{r}");
        assert!(peak <= crate::common::memory_bound(128), "memory_peak {peak}");
    } else {
        // The compiler proper is killed; its driver reports it and the run fails.
        assert_eq!(r["status"], "failed", "{r}");
        assert!(stderr.contains("Killed signal terminated program cc1"), "{r}");
        assert!(peak <= 129 << 20, "memory_peak {peak}");
    }
    assert_c_still_runs(&s);
}

#[test]
fn go_threads_are_held_by_the_pids_limit() {
    require("go", "golang-go");
    let s = Server::start();
    let r = run(
        &s,
        "go",
        "threads.go",
        json!({"timeout": 15000, "limits": {"max_processes": 32}}),
    );
    // Go's runtime cannot make more threads and stops the program itself.
    assert_eq!(r["status"], "failed", "{r}");
    assert!(
        r["stderr"].as_str().unwrap().contains("failed to create new OS thread"),
        "{r}"
    );
    assert_run_reclaimed(&s, r["session_id"].as_str().unwrap());
    s.assert_healthy();
}

#[test]
fn java_memory_bomb_meets_its_own_heap_limit_first() {
    require("java", "default-jdk-headless");
    let s = Server::start();
    let r = run(
        &s,
        "java",
        "memory_bomb.java",
        json!({"timeout": 30000, "limits": {"memory_limit_mb": 128}}),
    );
    // The heap is sized from the memory limit: the JVM says so, the cgroup need not kill.
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["oom_killed"], false, "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("java.lang.OutOfMemoryError: Java heap space"),
        "{r}"
    );
    assert_c_still_runs(&s);
}
