//! Starting, refusing to start, `doctor`, and stopping with running programs.

use crate::common::{descendants, dir_entries, run_cgroups, Server, NO_POOL};
use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn doctor_passes_on_this_machine() {
    crate::common::require_root();
    let dir = std::env::temp_dir().join(format!("sandcall-doctor-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .args(["doctor", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for check in ["user namespaces", "seccomp", "cgroups", "sandbox trial run"] {
        assert!(text.contains(&format!("[pass] {check}")), "{text}");
    }
    // Landlock is reported, never failed: its ABI, or a warning that the kernel has none.
    // SAFETY: the version query reads no memory.
    let abi = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) };
    let landlock = if abi > 0 {
        format!("[pass] landlock: ABI {abi}:")
    } else {
        "[pass] landlock: warning: this kernel has no Landlock".to_string()
    };
    assert!(text.contains(&landlock), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_interpreter_fails_doctor_and_serve_refuses_to_start() {
    crate::common::require_root();
    let dir = std::env::temp_dir().join(format!("sandcall-refuse-{}", std::process::id()));
    let run = |sub: &str| {
        Command::new(env!("CARGO_BIN_EXE_sandcall"))
            .args([sub, "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&dir)
            .env("SANDCALL_PYTHON", "/nonexistent/python3")
            .env("SANDCALL_INSTALL_RUNTIME", "false")
            .output()
            .unwrap()
    };
    let out = run("doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        text.contains("[FAIL] python interpreter: /nonexistent/python3 is missing"),
        "{text}"
    );
    assert!(text.contains("fix:"), "{text}");
    let out = run("serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to start") && err.contains("python interpreter"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A second server (or `doctor`) on a data directory in use would sweep the first one's
/// sandboxes from under it: it refuses instead, and the first goes on unharmed.
#[test]
fn a_data_directory_in_use_is_refused_and_its_server_keeps_running() {
    let s = Server::start();
    // A run in progress, whose sandbox a sweep would remove.
    let busy = std::thread::scope(|scope| {
        let running = scope.spawn(|| s.py("import time\ntime.sleep(1.5)\nprint('survived')"));
        std::thread::sleep(Duration::from_millis(500));
        for sub in ["serve", "doctor"] {
            let out = Command::new(env!("CARGO_BIN_EXE_sandcall"))
                .args([sub, "--listen", "127.0.0.1:0", "--data-dir"])
                .arg(&s.data_dir)
                .env("SANDCALL_INSTALL_RUNTIME", "false")
                .output()
                .unwrap();
            assert!(!out.status.success(), "{sub} started on a data directory in use");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                text.contains("another sandcall process is using the data directory"),
                "{sub}: {text}"
            );
        }
        running.join().unwrap()
    });
    assert_eq!(busy["stdout"], "survived\n", "{busy}");
    assert_eq!(s.py("print(2)")["stdout"], "2\n");
}

#[test]
fn bad_configuration_is_refused_with_the_reason() {
    crate::common::require_root();
    let dir = std::env::temp_dir().join(format!("sandcall-badconf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("c.toml"), "memory_limit_mb = \"lots\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .args(["serve", "--config"])
        .arg(dir.join("c.toml"))
        .env("SANDCALL_INSTALL_RUNTIME", "false")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("memory_limit_mb"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_kills_running_programs_and_reclaims_every_sandbox() {
    let mut s = Server::start();
    let instance = s.instance();
    let pid = s.pid();
    let results = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..3)
            .map(|_| {
                let s = &s;
                scope.spawn(move || s.exec(json!({"language": "bash", "code": "echo started; sleep 300.4321"})))
            })
            .collect();
        // Wait until the three programs are running.
        let t = Instant::now();
        while run_cgroups(&instance) < 3 * 2 && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(200));
        assert!(!descendants(pid).is_empty());
        s.terminate();
        (
            Instant::now(),
            runs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>(),
        )
    });
    let (t, results) = results;
    let status = s.stop();
    assert!(status.success(), "{status:?}");
    assert!(t.elapsed() < Duration::from_secs(10), "shutdown took {:?}", t.elapsed());
    for r in results {
        assert_eq!(r["status"], "killed", "{r}");
        assert_eq!(r["stdout"], "started\n");
    }
    assert_eq!(run_cgroups(&instance), 0);
    assert_eq!(dir_entries(&s.data_dir.join("runs")), 0);
    assert!(crate::common::processes_matching("sleep 300.4321").is_empty());
}

#[test]
fn health_reports_503_while_sandboxes_cannot_be_built() {
    let s = Server::start_with(&[NO_POOL], "");
    s.assert_healthy();
    // Take away this instance's memory cgroup directory: no sandbox can be built.
    let memory = std::path::Path::new("/sys/fs/cgroup/memory").join(s.instance());
    assert!(memory.is_dir(), "this test needs the cgroup v1 memory hierarchy");
    // The last run's helper may still be removing its cgroup.
    assert_eq!(crate::common::settle(|| run_cgroups(&s.instance()), 0), 0);
    std::fs::remove_dir(&memory).unwrap();
    let (status, v) = s.post("/v1/exec", &json!({"code": "print(1)"}));
    assert_eq!(status, 500, "{v}");
    assert_eq!(v["error_type"], "sandbox_failure");
    assert!(!v["error"].as_str().unwrap().contains("/sys"), "no host paths: {v}");
    let (status, _, v) = s.request("GET", "/v1/health", None, None);
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["status"], "unavailable");
    assert!(v["reason"].as_str().is_some_and(|r| !r.is_empty()), "{v}");
    // Once sandboxes work again, so does health.
    std::fs::create_dir(&memory).unwrap();
    s.assert_healthy();
    assert_eq!(crate::common::settle(|| dir_entries(&s.data_dir.join("runs")), 0), 0);
}

#[test]
fn the_interpreter_is_configurable() {
    let s = Server::start_with(&[], "python = \"/usr/bin/python3.11\"\nbash = \"/bin/bash\"\n");
    let r = s.py("import sys\nprint(sys.executable)");
    assert_eq!(r["stdout"], "/usr/bin/python3.11\n", "{r}");
    assert_eq!(s.bash("echo $BASH")["stdout"], "/bin/bash\n");
}

#[test]
fn sigterm_does_not_wait_for_ended_sessions_to_expire() {
    // An ended programmatic session stays readable for session_expiry_s (default 300):
    // the server's wait for its sessions' drivers at shutdown must not wait that out,
    // nor its own 10 s deadline.
    let mut s = Server::start();
    let (status, v) = s.post(
        "/v1/exec/programmatic",
        &json!({"code": "print(t())", "tools": [{"name": "t", "parameters": {"type": "object"}}]}),
    );
    assert_eq!(status, 200, "{v}");
    let (status, done) = s.post(
        "/v1/exec/programmatic",
        &json!({"continuation_token": v["continuation_token"], "tool_results": [{"call_id": v["tool_calls"][0]["id"], "result": 7}]}),
    );
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["stdout"], "7\n", "{done}");
    let t = Instant::now();
    let status = s.stop();
    assert!(status.success(), "{status:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "shutdown took {:?}", t.elapsed());
}
