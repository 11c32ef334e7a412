//! Faults: a program killed from outside, a panic in a handler, a restart with paused
//! sessions (kept, by their journal), a full data directory. The server must answer clearly and carry on.

use crate::common::{descendants, dir_names, processes_matching, run_cgroup_paths, run_cgroups, settle, Server};
use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_program_killed_from_outside_ends_as_killed() {
    let s = Server::start();
    std::thread::scope(|scope| {
        let run =
            scope.spawn(|| s.exec(json!({"language": "bash", "code": "echo up; sleep 300.9876", "timeout": 60000})));
        let t = Instant::now();
        let pid = loop {
            if let Some(pid) = processes_matching("sleep 300.9876").first() {
                break *pid;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "the program did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        // The main program is bash; kill it, from the host, with SIGKILL.
        let bash = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let ppid: i32 = bash
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        // SAFETY: kill(2) on a process of our own test run.
        assert_eq!(unsafe { libc::kill(ppid, libc::SIGKILL) }, 0);
        let r = run.join().unwrap();
        assert_eq!(r["status"], "killed", "{r}");
        assert_eq!(r["signal"], "SIGKILL");
        assert_eq!(r["stdout"], "up\n");
    });
    assert_eq!(
        settle(|| processes_matching("sleep 300.9876"), Vec::new()),
        Vec::<u32>::new()
    );
    s.assert_healthy();
}

#[test]
fn a_panic_in_a_handler_is_a_500_and_the_server_goes_on() {
    let s = Server::start_with(&[("SANDCALL_FAULT_INJECTION", "true")], "");
    for _ in 0..3 {
        let (status, _, v) = s.request("GET", "/v1/_fault/panic", None, None);
        assert_eq!(status, 500, "{v}");
        assert_eq!(v["error_type"], "internal", "{v}");
        assert!(
            !v["error"].as_str().unwrap().contains("fault injection"),
            "no internals in the answer: {v}"
        );
    }
    s.assert_healthy();
    // Without the setting the route does not exist.
    let plain = Server::start();
    assert_eq!(plain.request("GET", "/v1/_fault/panic", None, None).0, 404);
}

fn paused_session(s: &Server) -> serde_json::Value {
    let tool = json!({"name": "wait_for_me", "parameters": {"type": "object"}});
    let (status, r) = s.post(
        "/v1/exec/programmatic",
        &json!({"code": "print(wait_for_me())", "tools": [tool]}),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["status"], "tool_call_required", "{r}");
    r
}

/// A paused session outlives the restart in its journal: its resume brings it back by
/// replay in a sandbox of the new server (it/durable.rs tests replay itself).
fn resume_after_restart(s: &Server, paused: &serde_json::Value) {
    let (status, _, v) = s.request(
        "GET",
        &format!("/v1/exec/programmatic/{}", paused["session_id"].as_str().unwrap()),
        None,
        None,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "tool_call_required", "{v}");
    let call = &paused["tool_calls"][0]["id"];
    let (status, v) = s.post(
        "/v1/exec/programmatic",
        &json!({"session_id": paused["session_id"], "continuation_token": paused["continuation_token"],
                "tool_results": [{"call_id": call, "result": 1}]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["stdout"], "1\n", "{v}");
}

#[test]
fn a_restart_keeps_paused_sessions_and_leaves_nothing_of_their_sandboxes() {
    for hard in [false, true] {
        let s = Server::start();
        let instance = s.instance();
        let sessions: Vec<_> = (0..3).map(|_| paused_session(&s)).collect();
        assert!(run_cgroups(&instance) >= 3);
        // What the old server holds: its sessions' sandboxes, and warm ones if the pool
        // is on. The new server's own warm sandboxes are not the old ones.
        let old_cgroups = run_cgroup_paths(&instance);
        let old_staging = dir_names(&s.data_dir.join("runs"));
        let old_pid = s.pid();
        let (s, status) = s.restart(&[], hard);
        if let Some(status) = status {
            assert!(status.success(), "SIGTERM: {status:?}");
        }
        // Nothing of the old sandboxes: the old server's tree is gone, and the new one
        // swept what a killed server could not reclaim.
        assert!(descendants(old_pid).is_empty());
        let left = || old_cgroups.intersection(&run_cgroup_paths(&instance)).count();
        assert_eq!(settle(left, 0), 0, "hard={hard}");
        let staging = dir_names(&s.data_dir.join("runs"));
        assert_eq!(old_staging.intersection(&staging).count(), 0, "hard={hard}");
        for paused in &sessions {
            resume_after_restart(&s, paused);
        }
        s.assert_healthy();
    }
}

#[test]
fn a_full_data_directory_gives_507_and_plain_runs_still_work() {
    crate::common::require_root();
    let dir = Server::new_dir();
    let data = dir.join("data");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&data)
        .status()
        .unwrap();
    assert!(mounted.success(), "mounting a small tmpfs as the data dir");
    let s = Server::launch(dir, &[], "", None);
    // Fill the disk.
    let filler = s.data_dir.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 4 << 20]);
    // Small enough to sit in the socket buffers whole: the server may answer 507 before
    // reading the rest, and the client must not be cut off mid-send.
    let body = vec![b'x'; 4 << 10];
    let boundary = "sandcallfaultboundary";
    let mut multipart = format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n").into_bytes();
    multipart.extend_from_slice(&body);
    multipart.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let resp = ureq::post(&s.url("/v1/upload"))
        .set("Content-Type", &format!("multipart/form-data; boundary={boundary}"))
        .send_bytes(&multipart);
    let (status, text) = match resp {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(status, 507, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error_type"], "insufficient_storage");
    // Output files cannot be stored: the run still answers, with the reason.
    let r = s.bash("head -c 100000 /dev/zero > out.bin; echo wrote");
    assert_eq!(r["stdout"], "wrote\n", "{r}");
    assert_eq!(r["files"], json!([]), "{r}");
    assert_eq!(r["files_skipped"][0]["reason"], "storage_full", "{r}");
    // A run without files works.
    s.assert_healthy();
    let _ = std::fs::remove_file(&filler);
    let root = s.dir.clone();
    drop(s);
    let _ = Command::new("umount").arg("-l").arg(root.join("data")).status();
    let _ = std::fs::remove_dir_all(&root);
}
