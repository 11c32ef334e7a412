//! The `gvisor` isolation tier (docs/isolation.md): its programs see gVisor's kernel, its
//! limits hold, a server without `runsc` says how to get it, and nothing of a gVisor
//! sandbox outlives its run, a killed run or a killed server. The suites that run twice
//! (`.ci/run`'s gvisor pass) check that everything else works the same in the tier.

use crate::common::{processes_matching, run_cgroups, settle, Server, NO_POOL};
use serde_json::json;
use std::time::Duration;

const GVISOR: (&str, &str) = ("SANDCALL_ISOLATION", "gvisor");

/// What is left of gVisor sandboxes: `runsc` state files, processes that name the
/// server's `runsc` state directory, and host cgroups of the server's instance.
fn leftovers(s: &Server) -> (usize, usize, usize) {
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
    )
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
    assert!(peak <= (128 + 96) << 20, "peak {peak}");
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
    let state = s.data_dir.join("gvisor").join("state");
    let kernels = || -> Vec<u32> {
        processes_matching(&state.to_string_lossy())
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"runsc-sandbox\0"))
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut found = kernels();
    while found.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        found = kernels();
    }
    assert!(!found.is_empty(), "no gVisor kernel running under {}", state.display());
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

/// Runs, a run cut off by its timeout, and a run whose client goes away leave nothing;
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
    let none = (0, 0, 0);
    assert_eq!(
        settle(|| leftovers(&s), none),
        none,
        "(state files, processes, cgroups) before"
    );
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
        "(state files, processes, cgroups) after {runs} runs"
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
        "(state files, processes, cgroups) after a SIGKILLed server's successor started"
    );
    s.assert_healthy();
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
