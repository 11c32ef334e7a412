//! The `gvisor` isolation tier (docs/isolation.md): its programs see gVisor's kernel, its
//! limits hold, a server without `runsc` says how to get it, and nothing of a gVisor
//! sandbox outlives its run, a killed run or a killed server. The suites that run twice
//! (`.ci/run`'s gvisor pass) check that everything else works the same in the tier.

use crate::common::{
    gvisor_kernels, mount_count, processes_matching, run_cgroup_paths, run_cgroups, settle, Server, NO_POOL,
};
use serde_json::json;
use std::time::Duration;

const GVISOR: (&str, &str) = ("SANDCALL_ISOLATION", "gvisor");

/// What is left of gVisor sandboxes: `runsc` state files, processes that name the
/// server's `runsc` state directory, host cgroups of the server's instance, and
/// sandboxes' own directories (`gvisor::RunView`).
fn leftovers(s: &Server) -> (usize, usize, usize, usize) {
    let state = s.data_dir.join("gvisor").join("state");
    let states = std::fs::read_dir(&state).map_or(0, |entries| {
        entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".state"))
            .count()
    });
    (
        states,
        processes_matching(&state.to_string_lossy()).len(),
        run_cgroups(&s.instance()),
        sandbox_dirs(s),
    )
}

/// The gVisor sandboxes of the server that have their own directories
/// (`gvisor::RunView`): each from its start to its end.
fn sandbox_dirs(s: &Server) -> usize {
    std::fs::read_dir(s.data_dir.join("gvisor").join("runs")).map_or(0, |e| e.count())
}

#[test]
fn a_program_sees_gvisors_kernel_not_the_hosts() {
    let s = Server::start_with(&[GVISOR, NO_POOL], "");
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let host_version = std::fs::read_to_string("/proc/version").unwrap();
    for language in ["bash", "py"] {
        let code = match language {
            "bash" => "uname -r; cat /proc/version",
            _ => "import os; print(os.uname().release); print(open('/proc/version').read(), end='')",
        };
        let r = s.exec(json!({"lang": language, "code": code}));
        assert_eq!(r["status"], "ok", "{r}");
        let out = r["stdout"].as_str().unwrap();
        let (release, version) = out.split_once('\n').unwrap();
        assert_ne!(
            release,
            host_release.trim(),
            "{language} sees the host's kernel release"
        );
        assert_ne!(version, host_version, "{language} sees the host's /proc/version");
        assert!(!version.is_empty(), "{language}: no /proc/version");
    }
    // The namespace tier's programs see the host's kernel: the check above can tell.
    let plain = Server::start_with(&[NO_POOL, ("SANDCALL_ISOLATION", "namespace")], "");
    let r = plain.bash("uname -r");
    assert_eq!(r["stdout"].as_str().unwrap().trim(), host_release.trim());
}

#[test]
fn a_server_asked_for_gvisor_without_runsc_refuses_to_start_and_says_how_to_install_it() {
    let dir = Server::new_dir();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .env("SANDCALL_ISOLATION", "gvisor")
        .env("SANDCALL_RUNSC_PATH", dir.join("no-runsc-here"))
        .env("SANDCALL_INSTALL_RUNTIME", "false")
        .env("SANDCALL_RUNTIME_DIR", crate::common::runtime_dir())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success(), "started without runsc");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("runsc") && stderr.contains("install") && stderr.contains("runsc_path"),
        "{stderr}"
    );
}

#[test]
fn doctor_names_runscs_version_and_platform_and_runs_a_trial_in_the_tier() {
    let dir = Server::new_dir();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .args(["doctor", "--data-dir"])
        .arg(dir.join("data"))
        .env("SANDCALL_ISOLATION", "gvisor")
        .env("SANDCALL_INSTALL_RUNTIME", "false")
        .env("SANDCALL_RUNTIME_DIR", crate::common::runtime_dir())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let gvisor = stdout
        .lines()
        .find(|l| l.starts_with("[pass] gvisor: "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        gvisor.contains("runsc version") && gvisor.contains("platform systrap"),
        "{gvisor}"
    );
    assert!(stdout.contains("ran in a sandbox of the gvisor tier"), "{stdout}");
}

#[test]
fn a_memory_bomb_ends_as_out_of_memory_and_the_next_run_works() {
    let s = Server::start_with(&[GVISOR, NO_POOL], "");
    let r = s.exec(json!({
        "lang": "py",
        "code": "x = []\nwhile True:\n    x.append(bytearray(16 << 20))",
        "limits": {"memory_limit_mb": 128},
    }));
    assert_eq!(r["oom_killed"], true, "{r}");
    assert!(r["stderr"].as_str().unwrap().contains("[sandbox] Out of memory"), "{r}");
    // The limit held: the sandbox's peak is the run's limit plus gVisor's own kernel.
    let peak = r["memory_peak"].as_u64().unwrap();
    assert!(peak <= ((128 + 97) << 20), "peak {peak}");
    s.assert_healthy();
}

/// A gVisor sandbox that dies under its run (here its kernel is killed from the host, as
/// a program that crashed gVisor's kernel would leave it) ends the run as killed, not as
/// a server failure, and the next run works.
#[test]
fn a_run_whose_gvisor_sandbox_dies_ends_as_a_killed_run_and_the_next_run_works() {
    let s = Server::start_with(&[GVISOR, NO_POOL], "");
    let base = s.base.clone();
    let run = std::thread::spawn(move || -> serde_json::Value {
        ureq::post(&format!("{base}/v1/exec"))
            .send_json(json!({"lang": "bash", "code": "echo started; sleep 60"}))
            .unwrap()
            .into_json()
            .unwrap()
    });
    let kernels = || gvisor_kernels(&s);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut found = kernels();
    while found.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        found = kernels();
    }
    assert!(
        !found.is_empty(),
        "no gVisor kernel running under {}",
        s.data_dir.display()
    );
    // Let the program start, then kill gVisor's kernel.
    std::thread::sleep(Duration::from_millis(1500));
    for pid in found {
        // SAFETY: plain kill(2) of a process of this test's own server's sandbox.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let r = run.join().unwrap();
    assert_eq!(r["status"], "killed", "{r}");
    assert_eq!(r["signal"], "SIGKILL", "{r}");
    s.assert_healthy();
}

/// Runs, a run cut off by its timeout, and a run whose client goes away leave nothing
/// (no `runsc` state, process, host cgroup or mount);
/// then a server SIGKILLed with runs in flight leaves gVisor sandboxes, which the next
/// server on the same data directory sweeps at start. `SANDCALL_GVISOR_LEAK_RUNS` runs
/// (default 50; `.ci/run` runs 1,000 in its group of tests that run alone).
#[test]
fn gvisor_sandboxes_leave_nothing_after_runs_a_killed_run_or_a_killed_server() {
    let runs: usize = std::env::var("SANDCALL_GVISOR_LEAK_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50);
    let s = Server::start_with(&[GVISOR, NO_POOL], "");
    let none = (0, 0, 0, 0);
    assert_eq!(
        settle(|| leftovers(&s), none),
        none,
        "(state files, processes, cgroups, directories) before"
    );
    let mounts = mount_count();
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let (base, n) = (s.base.clone(), runs / 2 + (runs % 2) * (1 - t));
            std::thread::spawn(move || {
                for i in 0..n {
                    let body = json!({"lang": "bash", "code": format!("echo {i}")});
                    let r: serde_json::Value = ureq::post(&format!("{base}/v1/exec"))
                        .send_json(body)
                        .unwrap()
                        .into_json()
                        .unwrap();
                    assert_eq!(r["stdout"], format!("{i}\n"), "{r}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let r = s.exec(json!({"lang": "bash", "code": "sleep 30", "timeout": 500}));
    assert_eq!(r["status"], "timed_out", "{r}");
    // A client that goes away mid-run.
    let gone = ureq::post(&s.url("/v1/exec"))
        .timeout(Duration::from_millis(700))
        .send_json(json!({"lang": "bash", "code": "sleep 3"}));
    assert!(gone.is_err(), "the run ended before the client went away");
    assert_eq!(
        settle(|| leftovers(&s), none),
        none,
        "(state files, processes, cgroups, directories) after {runs} runs"
    );
    assert_eq!(
        settle(mount_count, mounts),
        mounts,
        "the host's mounts after {runs} runs"
    );

    // Runs in flight when the server is SIGKILLed.
    let base = s.base.clone();
    let in_flight: Vec<_> = (0..2)
        .map(|_| {
            let base = base.clone();
            std::thread::spawn(move || {
                let _ = ureq::post(&format!("{base}/v1/exec")).send_json(json!({"lang": "bash", "code": "sleep 60"}));
            })
        })
        .collect();
    let running = |s: &Server| leftovers(s).0;
    assert_eq!(settle(|| running(&s).min(2), 2), 2, "two gVisor sandboxes running");
    let (s, _) = s.restart(&[GVISOR, NO_POOL], true);
    for t in in_flight {
        t.join().unwrap();
    }
    assert_eq!(
        settle(|| leftovers(&s), none),
        none,
        "(state files, processes, cgroups, directories) after a SIGKILLed server's successor started"
    );
    assert_eq!(
        settle(mount_count, mounts),
        mounts,
        "the host's mounts after the restart"
    );
    s.assert_healthy();
}

/// The CPU weights of this server's host cgroups (`cpu.shares` on v1, `cpu.weight` on
/// v2), of those named `id` only with `Some`.
fn cpu_weights(s: &Server, id: Option<&str>) -> Vec<u64> {
    run_cgroup_paths(&s.instance())
        .into_iter()
        .filter(|dir| id.is_none_or(|id| dir.file_name().is_some_and(|n| n == id)))
        .flat_map(|dir| {
            ["cpu.shares", "cpu.weight"]
                .iter()
                .filter_map(|f| std::fs::read_to_string(dir.join(f)).ok()?.trim().parse().ok())
                .collect::<Vec<u64>>()
        })
        .collect()
}

/// Starts a Python session that pauses on its one tool call, holding its sandbox; its id.
fn pause_a_session(s: &Server) -> String {
    let (status, paused) = s.post(
        "/v1/exec/programmatic",
        &json!({
            "language": "python",
            "code": "print(ask())",
            "tools": [{"name": "ask", "description": "asks", "parameters": {"type": "object", "properties": {}}}],
        }),
    );
    assert_eq!(
        (status, &paused["status"]),
        (200, &json!("tool_call_required")),
        "{paused}"
    );
    paused["session_id"].as_str().unwrap().to_owned()
}

/// A warm gVisor sandbox waits at the lowest CPU weight on the host, with every process
/// and thread of it (the helper inside can only lower or raise what runs on gVisor's
/// kernel); at its run it gets the default weight back, so a warm run does not run at
/// the priority of the pool's refills.
#[test]
fn a_warm_gvisor_sandbox_waits_at_the_lowest_cpu_weight_and_runs_at_the_default() {
    let s = Server::start_with(
        &[
            GVISOR,
            ("SANDCALL_WARM_POOL_SIZE", "1"),
            ("SANDCALL_WARM_LANGUAGES", r#"["python"]"#),
        ],
        "",
    );
    s.wait_warm(1);
    let lowest = [2, 1]; // v1's cpu.shares, v2's cpu.weight
    let waiting = cpu_weights(&s, None);
    assert!(
        !waiting.is_empty() && waiting.iter().all(|w| lowest.contains(w)),
        "an idle warm gVisor sandbox's CPU weight: {waiting:?}"
    );
    let id = pause_a_session(&s);
    let running = cpu_weights(&s, Some(id.as_str()));
    assert!(
        !running.is_empty() && running.iter().all(|w| [1024, 100].contains(w)),
        "the CPU weight of run {id}'s gVisor sandbox: {running:?}"
    );
}

/// The tier's pool builds two of a set's warm sandboxes at once (a gVisor sandbox's
/// start is as much waiting as work), never more. With four sessions paused holding
/// theirs (the whole pool, taken at once), the sandboxes neither paused nor ready
/// (`sandbox_dirs`) are being built.
#[test]
fn the_tiers_pool_builds_two_warm_sandboxes_at_once() {
    const SIZE: usize = 4;
    let s = Server::start_with(
        &[
            GVISOR,
            ("SANDCALL_WARM_POOL_SIZE", "4"),
            ("SANDCALL_WARM_PRELOAD_POOL_SIZE", "0"),
            ("SANDCALL_WARM_LANGUAGES", r#"["python"]"#),
        ],
        "",
    );
    s.wait_warm(SIZE);
    // All at once, so that the pool is empty before its first replacement is ready.
    std::thread::scope(|scope| {
        for _ in 0..SIZE {
            scope.spawn(|| pause_a_session(&s));
        }
    });
    let start = std::time::Instant::now();
    let mut most = 0;
    loop {
        // Sandboxes first, then the ready ones, which only grow while the pool refills:
        // the difference never counts a ready sandbox as one being built.
        let sandboxes = sandbox_dirs(&s);
        let ready = s.warm_idle();
        most = most.max(sandboxes.saturating_sub(ready + SIZE));
        if ready >= SIZE {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the warm pool did not refill"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(most, 2, "the most warm gVisor sandboxes seen being built at once");
}

/// A server with credentials (many principals) on the `namespace` tier says once, at
/// start, what that means and how to switch; one on `gvisor`, or a local one, does not.
#[test]
fn a_server_with_credentials_on_the_namespace_tier_says_so_once_at_start() {
    let note = "isolation = \"namespace\": the programs of every principal share this host's kernel";
    for (tier, keys, want) in [("namespace", true, 1), ("gvisor", true, 0), ("namespace", false, 0)] {
        let stderr = start_and_stop(&[
            ("SANDCALL_ISOLATION", tier),
            if keys {
                ("SANDCALL_API_KEYS", "alice:key-a-0123456789abcdef")
            } else {
                ("SANDCALL_TEST_NO_KEYS", "1")
            },
            NO_POOL,
        ]);
        assert_eq!(stderr.matches(note).count(), want, "{tier}, keys {keys}: {stderr}");
        if want == 1 {
            assert!(stderr.contains("isolation = \"gvisor\""), "{stderr}");
        }
    }
}

/// Starts `sandcall serve`, stops it once it listens, and returns what it wrote to stderr.
fn start_and_stop(env: &[(&str, &str)]) -> String {
    use std::io::{BufRead, Read};
    let dir = Server::new_dir();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .envs(env.iter().copied())
        .env("SANDCALL_LOG", "off")
        .env("SANDCALL_INSTALL_RUNTIME", "false")
        .env("SANDCALL_RUNTIME_DIR", crate::common::runtime_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let listening = stdout
        .lines()
        .map_while(Result::ok)
        .any(|l| l.starts_with("sandcall listening on "));
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(listening, "the server did not start: {stderr}");
    stderr
}

const ALICE_KEY: &str = "alice-key-0123456789abcdef";
const BOB_KEY: &str = "bob-key-0123456789abcdef";

/// A server on the `namespace` tier with two keys: alice's, and bob's, pinned to `gvisor`.
fn pinned_server() -> Server {
    let config = format!(
        "[[api_keys]]\nprincipal = \"alice\"\nsha256 = \"{}\"\n\n\
         [[api_keys]]\nprincipal = \"bob\"\nsha256 = \"{}\"\nisolation = \"gvisor\"\n",
        sandcall_config::key_hash(ALICE_KEY),
        sandcall_config::key_hash(BOB_KEY)
    );
    Server::start_with(&[NO_POOL, ("SANDCALL_ISOLATION", "namespace")], &config)
}

fn release_seen(s: &Server, key: &str, extra: serde_json::Value) -> (u16, serde_json::Value) {
    let mut body = json!({"lang": "bash", "code": "uname -r"});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    s.post_with("/v1/exec", &body, &[("X-API-Key", key)])
}

#[test]
fn a_principal_pinned_to_gvisor_runs_there_and_may_ask_for_no_less() {
    let s = pinned_server();
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let host = host.trim();
    let stdout = |r: &serde_json::Value| r["stdout"].as_str().unwrap().trim().to_owned();

    let (status, r) = release_seen(&s, BOB_KEY, json!({}));
    assert_eq!(status, 200, "{r}");
    assert_ne!(stdout(&r), host, "bob's run is on the host's kernel: {r}");
    let (status, r) = release_seen(&s, BOB_KEY, json!({"isolation": "gvisor"}));
    assert_eq!((status, stdout(&r) != host), (200, true), "{r}");
    for path in ["/v1/exec", "/v1/exec/programmatic"] {
        let body = json!({"lang": "bash", "code": "uname -r", "isolation": "namespace"});
        let (status, r) = s.post_with(path, &body, &[("X-API-Key", BOB_KEY)]);
        assert_eq!(
            (status, r["error_type"].as_str()),
            (400, Some("invalid_request")),
            "{path}: {r}"
        );
        assert!(r["error"].as_str().unwrap().contains("weaker"), "{r}");
    }

    let (status, r) = release_seen(&s, ALICE_KEY, json!({}));
    assert_eq!((status, stdout(&r)), (200, host.to_owned()), "{r}");
    let (status, r) = release_seen(&s, ALICE_KEY, json!({"isolation": "namespace"}));
    assert_eq!((status, stdout(&r)), (200, host.to_owned()), "{r}");
    let (status, r) = release_seen(&s, ALICE_KEY, json!({"isolation": "gvisor"}));
    assert_eq!(status, 200, "{r}");
    assert_ne!(stdout(&r), host, "alice asked for gvisor: {r}");
    let (status, r) = release_seen(&s, ALICE_KEY, json!({"isolation": "vm"}));
    assert_eq!(
        (status, r["error_type"].as_str()),
        (400, Some("invalid_request")),
        "{r}"
    );

    // A programmatic session asked for gvisor pauses, resumes and ends there.
    let tool = json!({"name": "inc", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}});
    let start = json!({
        "code": "import os\nr = inc(x=1)\nprint(os.uname().release, r)",
        "tools": [tool],
        "isolation": "gvisor",
    });
    let (status, r) = s.post_with("/v1/exec/programmatic", &start, &[("X-API-Key", ALICE_KEY)]);
    assert_eq!((status, r["status"].as_str()), (200, Some("tool_call_required")), "{r}");
    let resume = json!({
        "session_id": r["session_id"],
        "continuation_token": r["continuation_token"],
        "tool_results": [{"call_id": r["tool_calls"][0]["id"], "result": 2}],
    });
    let (status, r) = s.post_with("/v1/exec/programmatic", &resume, &[("X-API-Key", ALICE_KEY)]);
    assert_eq!((status, r["status"].as_str()), (200, Some("completed")), "{r}");
    let out = stdout(&r);
    let (release, result) = out.split_once(' ').unwrap();
    assert_ne!(release, host, "{r}");
    assert_eq!(result, "2");
}

/// Runs of two principals at once are in two gVisor sandboxes: each run has its own.
#[test]
fn runs_of_two_principals_are_in_different_gvisor_sandboxes() {
    let s = pinned_server();
    let runs: Vec<_> = [ALICE_KEY, BOB_KEY]
        .into_iter()
        .map(|key| {
            let base = s.base.clone();
            std::thread::spawn(move || -> serde_json::Value {
                ureq::post(&format!("{base}/v1/exec"))
                    .set("X-API-Key", key)
                    .send_json(json!({"lang": "bash", "code": "sleep 3; uname -r", "isolation": "gvisor"}))
                    .unwrap()
                    .into_json()
                    .unwrap()
            })
        })
        .collect();
    let kernels = || gvisor_kernels(&s).len();
    assert_eq!(settle(|| kernels().min(2), 2), 2, "two gVisor kernels while both run");
    let answers: Vec<serde_json::Value> = runs.into_iter().map(|t| t.join().unwrap()).collect();
    for r in &answers {
        assert_eq!(r["status"], "ok", "{r}");
    }
    assert_ne!(answers[0]["session_id"], answers[1]["session_id"]);
}

/// A server without `runsc` that nothing pins to gvisor starts, and refuses a request for
/// the tier as something it cannot do.
#[test]
fn a_request_for_gvisor_on_a_server_without_runsc_is_an_unsupported_capability() {
    let s = Server::start_with(
        &[NO_POOL, ("SANDCALL_ISOLATION", "namespace"), ("PATH", "/nonexistent")],
        "",
    );
    let (status, r) = s.post(
        "/v1/exec",
        &json!({"lang": "bash", "code": "echo hi", "isolation": "gvisor"}),
    );
    assert_eq!(status, 400, "{r}");
    assert_eq!(r["code"], "unsupported_capability", "{r}");
    let (status, r) = s.post("/v1/exec", &json!({"lang": "bash", "code": "echo hi"}));
    assert_eq!((status, r["stdout"].as_str()), (200, Some("hi\n")), "{r}");
}
