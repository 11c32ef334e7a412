//! Leak accounting: after many runs, hostile ones included, nothing is left over.

use crate::common::{descendants, dir_entries, fd_count, hostile, launchers, mount_count, run_cgroups, settle, Server};
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn two_hundred_runs_leave_nothing_behind() {
    two_hundred_runs(0);
}

/// The same against warm sandboxes built one by one (Bash's always are; Python's when
/// `zygote` is off): afterwards, exactly the refilled pool is left. Forked sandboxes
/// have their own count: `zygote::many_forked_runs_leave_nothing_behind`.
#[test]
fn two_hundred_warm_runs_leave_nothing_behind() {
    two_hundred_runs(3);
}

fn two_hundred_runs(pool: usize) {
    let s = Server::start_with(
        &[
            ("SANDCALL_WARM_POOL_SIZE", &pool.to_string()),
            ("SANDCALL_ZYGOTE", "false"),
        ],
        "",
    );
    s.assert_healthy();
    let instance = s.instance();
    let pid = s.pid();
    // Each warm sandbox: a helper, the sandbox's init and its waiting program; one
    // staging directory; one cgroup per hierarchy.
    let idle = 2 * pool;
    let hierarchies = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .filter(|e| e.path().join(&instance).is_dir())
        .count();
    let warm_idle = || {
        s.request("GET", "/v1/health", None, None).2["warm_idle"]
            .as_u64()
            .unwrap() as usize
    };
    let steady = || {
        (
            warm_idle(),
            descendants(pid).len(),
            run_cgroups(&instance),
            dir_entries(&s.data_dir.join("runs")),
        )
    };
    let want = (idle, 3 * idle, idle * hierarchies, idle);
    assert_eq!(
        settle(steady, want),
        want,
        "(idle, processes, cgroups, staging dirs) before"
    );
    let fds_before = fd_count(s.pid());
    let mounts_before = mount_count();

    let bodies = [
        json!({"code": "print(1)"}),
        json!({"language": "bash", "code": "echo 1"}),
        json!({"language": "bash", "code": hostile("fork_bomb.sh"), "timeout": 500}),
        json!({"code": hostile("memory_bomb.py"), "limits": {"memory_limit_mb": 64}}),
        json!({"code": hostile("cpu_spin.py"), "timeout": 150}),
        json!({"language": "bash", "code": hostile("leave_background.sh")}),
        json!({"code": hostile("open_files.py")}),
        json!({"language": "bash", "code": "dd if=/dev/zero of=/tmp/x bs=1M count=8 2>/dev/null; sleep 10 &", "limits": {"workspace_limit_mb": 4}}),
    ];
    let started = Instant::now();
    std::thread::scope(|scope| {
        for worker in 0..4 {
            let (s, bodies) = (&s, &bodies);
            scope.spawn(move || {
                for i in 0..50 {
                    let body = &bodies[(worker * 50 + i) % bodies.len()];
                    let (status, v) = s.post("/v1/exec", body);
                    assert_eq!(status, 200, "{v}");
                }
            });
        }
    });
    eprintln!("200 runs in {:?}", started.elapsed());

    assert_eq!(
        settle(steady, want),
        want,
        "(idle, processes, cgroups, staging dirs) after"
    );
    assert_eq!(settle(mount_count, mounts_before), mounts_before, "host mounts changed");
    // The helpers were forked by one launcher, which is still the only one.
    assert_eq!(launchers(pid).len(), 1, "helper launchers");
    // Descriptors of the server may vary by a few (connection pool, epoll); runs must
    // not add up.
    let fds_after = fd_count(s.pid());
    assert!(fds_after <= fds_before + 4, "server fds {fds_before} -> {fds_after}");
    let _ = Duration::ZERO;
    s.assert_healthy();
}

/// A server stopped with SIGTERM removes its whole cgroup subtree, the instance
/// directory of each hierarchy included: every directory left behind is a task group
/// the kernel walks again on each later run's `cpu.cfs_quota_us` write, on any server of
/// the machine (thousands of them made every run measurably slower).
#[test]
fn a_stopped_server_leaves_no_cgroup_behind() {
    let mut s = Server::start_with(&[("SANDCALL_WARM_POOL_SIZE", "2")], "");
    s.assert_healthy();
    s.wait_warm(2);
    let instance = s.instance();
    // One instance directory per hierarchy: memory, pids, cpu and cpuacct on cgroup v1,
    // one on v2.
    let bases = sandcall_sandbox::cgroup::CgroupRoot::detect(&instance).unwrap().bases();
    let present = || bases.iter().filter(|base| base.is_dir()).count();
    assert_eq!(
        present(),
        bases.len(),
        "the server has no cgroup subtree to remove: {bases:?}"
    );
    assert!(run_cgroups(&instance) >= 2, "the warm sandboxes have no cgroups");
    let status = s.stop();
    assert!(status.success(), "{status:?}");
    assert_eq!(present(), 0, "instance directories left after the stop: {bases:?}");
}
