//! The helper launcher (`sandcall helper-launcher`, ARCHITECTURE.md "Process model"):
//! every sandbox's helper is forked from it rather than exec'd, as a child of the
//! server; what a helper starts with is what an exec'd one did; runs survive the
//! launcher's death, which loses no request (a new launcher takes over); and the
//! launcher dies with the server.

use crate::common::{descendants, launchers, parents, settle, Server};
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;

/// How a helper of the server was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Started {
    /// Forked by the launcher: its command line is the launcher's.
    Forked,
    /// Exec'd by the server.
    Execd,
}

/// The server's helpers alive now (its children but the launcher), and how each started.
fn helpers(server: u32) -> Vec<(u32, Started)> {
    let mut out = Vec::new();
    for (pid, ppid) in parents() {
        if ppid != server || launchers(server).contains(&pid) {
            continue;
        }
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(" helper-launcher") {
            out.push((pid, Started::Forked));
        } else if cmd.contains(" sandbox-helper") {
            out.push((pid, Started::Execd));
        }
    }
    out
}

/// The descriptors `pid` holds: fd number -> what it points at.
fn fds(pid: u32) -> Vec<(u32, String)> {
    let mut out: Vec<(u32, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let fd = e.file_name().to_string_lossy().parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            Some((fd, target.display().to_string()))
        })
        .collect();
    out.sort();
    out
}

fn environ(pid: u32) -> Vec<u8> {
    std::fs::read(format!("/proc/{pid}/environ")).unwrap()
}

/// Whether `pid` is gone (or dead, waiting to be reaped by whoever adopted it).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// Children of the server that exited and were not reaped.
fn zombies(server: u32) -> Vec<u32> {
    parents()
        .into_iter()
        .filter(|(pid, ppid)| *ppid == server && dead(*pid))
        .map(|(pid, _)| pid)
        .collect()
}

fn kill9(pid: u32) {
    // SAFETY: plain kill(2).
    let rc = unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    assert_eq!(rc, 0, "kill {pid}");
}

/// One launcher of `server`, waited for.
fn the_launcher(server: u32) -> u32 {
    let found = settle(|| launchers(server).len(), 1);
    assert_eq!(found, 1, "one launcher: {:?}", launchers(server));
    launchers(server)[0]
}

/// Starts a run that sleeps `seconds` in the background, and returns its helpers
/// (every helper alive once it has started).
fn with_a_sleeping_run<T>(s: &Server, seconds: f64, look: impl FnOnce() -> T) -> T {
    std::thread::scope(|scope| {
        let run = scope.spawn(|| {
            let v = s.py(&format!(
                "import time\nprint('start', flush=True)\ntime.sleep({seconds})\nprint('end')"
            ));
            assert_eq!(v["stdout"], "start\nend\n", "{v}");
        });
        std::thread::sleep(Duration::from_millis(500));
        let seen = look();
        run.join().unwrap();
        seen
    })
}

#[test]
fn every_helper_is_forked_by_the_launcher_and_starts_as_an_execd_one_did() {
    let s = Server::start_with(&[("SANDCALL_WARM_POOL_SIZE", "1")], "");
    s.assert_healthy();
    let server = s.pid();
    let launcher = the_launcher(server);
    // The launcher holds its socket, /dev/null and stderr only, and no environment.
    let held = fds(launcher);
    assert_eq!(
        held.iter().map(|(fd, _)| *fd).collect::<Vec<_>>(),
        [0, 1, 2],
        "{held:?}"
    );
    assert!(held[0].1.starts_with("socket:"), "{held:?}");
    assert_eq!(held[1].1, "/dev/null", "{held:?}");
    assert!(environ(launcher).is_empty());

    let seen = with_a_sleeping_run(&s, 1.5, || {
        let found = helpers(server);
        let forked = found.iter().filter(|(_, how)| *how == Started::Forked).count();
        // The run's helper and the refill's (or the pool's idle sandbox's).
        assert!(forked >= 1, "{found:?}");
        for (pid, how) in &found {
            assert_eq!(*how, Started::Forked, "helper {pid} was exec'd: {found:?}");
            // A helper's parent is the server (the launcher forks with CLONE_PARENT).
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let ppid = status
                .lines()
                .find_map(|l| l.strip_prefix("PPid:"))
                .map(|p| p.trim().to_string());
            if let Some(ppid) = ppid {
                assert_eq!(ppid, server.to_string(), "helper {pid}'s parent");
            }
            // Its stdin and stdout are the server's pipes, stderr the server's stderr,
            // and its environment is empty.
            if let (Ok(stdin), Ok(stdout)) = (
                std::fs::read_link(format!("/proc/{pid}/fd/0")),
                std::fs::read_link(format!("/proc/{pid}/fd/1")),
            ) {
                assert!(stdin.display().to_string().starts_with("pipe:"), "{stdin:?}");
                assert!(stdout.display().to_string().starts_with("pipe:"), "{stdout:?}");
                assert_eq!(
                    std::fs::read_link(format!("/proc/{pid}/fd/2")).ok(),
                    std::fs::read_link(format!("/proc/{server}/fd/2")).ok()
                );
                assert!(environ(*pid).is_empty(), "helper {pid} has an environment");
                // The name an exec'd helper has, not the launcher's.
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                assert_eq!(comm.trim_end(), "sandcall");
            }
        }
        found.len()
    });
    assert!(seen >= 1);
    assert_eq!(settle(|| zombies(server), vec![]), Vec::<u32>::new());
    s.assert_healthy();
}

#[test]
fn killing_the_launcher_mid_burst_loses_no_request_and_a_new_one_takes_over() {
    let s = Server::start_with(&[("SANDCALL_WARM_POOL_SIZE", "2")], "");
    s.assert_healthy();
    let server = s.pid();
    let first = the_launcher(server);
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        // A run under way when the launcher dies finishes as it would have.
        let long = scope.spawn(|| s.py("import time\ntime.sleep(1.5)\nprint('survived')"));
        for worker in 0..4 {
            let (s, done) = (&s, &done);
            scope.spawn(move || {
                for i in 0..10 {
                    let v = if i % 2 == 0 {
                        s.py(&format!("print({worker} * 100 + {i})"))
                    } else {
                        s.bash(&format!("echo $(({worker} * 100 + {i}))"))
                    };
                    assert_eq!(v["exit_code"], 0, "{v}");
                    assert_eq!(v["stdout"], format!("{}\n", worker * 100 + i), "{v}");
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
        while done.load(std::sync::atomic::Ordering::SeqCst) < 8 {
            std::thread::sleep(Duration::from_millis(5));
        }
        kill9(first);
        let v = long.join().unwrap();
        assert_eq!(v["stdout"], "survived\n", "{v}");
    });
    assert_eq!(done.load(std::sync::atomic::Ordering::SeqCst), 40);
    // A new launcher runs, and helpers are forked from it again.
    let second = settle(|| launchers(server).into_iter().filter(|p| *p != first).count(), 1);
    assert_eq!(second, 1, "a new launcher: {:?}", launchers(server));
    let second = the_launcher(server);
    assert!(dead(first));
    // Helpers started from now on (the run's, or the refill of the warm sandbox it
    // took) are forked; idle warm sandboxes exec'd while there was no launcher may
    // still wait in the pool.
    let before: BTreeSet<u32> = helpers(server).into_iter().map(|(pid, _)| pid).collect();
    let kinds = with_a_sleeping_run(&s, 1.0, || {
        helpers(server)
            .into_iter()
            .filter(|(pid, _)| !before.contains(pid))
            .map(|(_, how)| how)
            .collect::<BTreeSet<_>>()
    });
    assert_eq!(kinds.into_iter().collect::<Vec<_>>(), [Started::Forked]);
    assert_eq!(launchers(server), [second]);
    // Nothing left unreaped, whichever way each helper started.
    assert_eq!(settle(|| zombies(server), vec![]), Vec::<u32>::new());
    s.assert_healthy();
}

#[test]
fn the_launcher_and_its_helpers_die_with_the_server() {
    // With a Python template too: its init, which watches no pipe of its helper, must
    // die by its parent-death signal (which the kernel clears at its setresuid).
    let s = Server::start_with(&[("SANDCALL_WARM_POOL_SIZE", "1"), ("SANDCALL_ZYGOTE", "true")], "");
    s.assert_healthy();
    let server = s.pid();
    let launcher = the_launcher(server);
    let tree = std::thread::scope(|scope| {
        // Its answer never comes: the server dies under it.
        let run = scope.spawn(|| s.post("/v1/exec", &json!({"code": "import time\ntime.sleep(5)"})));
        std::thread::sleep(Duration::from_millis(800));
        let tree = descendants(server);
        assert!(helpers(server).len() >= 2, "the run's helper and the idle sandbox's");
        kill9(server);
        let _ = run.join();
        tree
    });
    assert!(settle(|| dead(launcher), true), "the launcher outlived the server");
    let alive = || tree.iter().copied().filter(|p| !dead(*p)).collect::<Vec<u32>>();
    assert_eq!(
        settle(alive, vec![]),
        Vec::<u32>::new(),
        "the server's sandboxes outlived it"
    );
    // A new server on the same data directory sweeps the killed one's cgroups.
    let (s, _) = s.restart(&[], true);
    s.assert_healthy();
}
