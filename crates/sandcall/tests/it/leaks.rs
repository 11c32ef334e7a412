//! Leak accounting: after many runs, hostile ones included, nothing is left over.

use crate::common::{descendants, dir_entries, fd_count, hostile, mount_count, run_cgroups, Server};
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn two_hundred_runs_leave_nothing_behind() {
    let s = Server::start();
    s.assert_healthy();
    let instance = s.instance();
    let fds_before = fd_count(s.pid());
    let mounts_before = mount_count();
    assert_eq!(descendants(s.pid()), Vec::<u32>::new());
    assert_eq!(run_cgroups(&instance), 0);
    assert_eq!(dir_entries(&s.data_dir.join("runs")), 0);

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

    assert_eq!(descendants(s.pid()), Vec::<u32>::new(), "processes left");
    assert_eq!(run_cgroups(&instance), 0, "cgroups left");
    assert_eq!(dir_entries(&s.data_dir.join("runs")), 0, "staging dirs left");
    assert_eq!(mount_count(), mounts_before, "host mounts changed");
    // Descriptors of the server may vary by a few (connection pool, epoll); runs must
    // not add up.
    let fds_after = fd_count(s.pid());
    assert!(fds_after <= fds_before + 4, "server fds {fds_before} -> {fds_after}");
    let _ = Duration::ZERO;
    s.assert_healthy();
}
