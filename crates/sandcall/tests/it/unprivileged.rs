//! The server running as an ordinary user: unprivileged user namespaces, and a cgroup
//! subtree delegated to that user (here created and chowned by the root test harness,
//! as an administrator or systemd's Delegate=yes would).

use crate::common::{hostile, Server};
use serde_json::{json, Value};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The unprivileged account the server runs as.
const NOBODY: (u32, u32) = (65534, 65534);

fn chown_tree(path: &Path, (uid, gid): (u32, u32)) {
    let status = Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{gid}"))
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

/// Delegates this instance's v1 (or v2) cgroup directories to `user`.
fn delegate_cgroups(instance: &str, user: (u32, u32)) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for controller in ["memory", "pids", "cpu", "cpuacct"] {
        let base = Path::new("/sys/fs/cgroup").join(controller);
        if base.join("cgroup.procs").exists() {
            let dir = base.join(instance);
            std::fs::create_dir_all(&dir).unwrap();
            chown_tree(&dir, user);
            dirs.push(dir);
        }
    }
    assert!(
        !dirs.is_empty(),
        "this test knows cgroup v1 hierarchies; the machine has none"
    );
    dirs
}

#[test]
fn an_ordinary_user_runs_sandboxes_with_a_delegated_cgroup() {
    let dir = Server::new_dir();
    chown_tree(&dir, NOBODY);
    let data_dir = std::fs::canonicalize(dir.join("data")).unwrap();
    let instance = sandcall_engine::host::instance_name(&data_dir);

    // Without a delegated cgroup, doctor says what is missing and how to fix it.
    let exe = dir.join("sandcall-doctor");
    std::fs::copy(env!("CARGO_BIN_EXE_sandcall"), &exe).unwrap();
    let out = Command::new(&exe)
        .args(["doctor", "--data-dir"])
        .arg(&data_dir)
        .uid(NOBODY.0)
        .gid(NOBODY.1)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("[pass] user namespaces: available (unprivileged)"),
        "{text}"
    );
    assert!(
        text.contains("[FAIL] cgroups") && text.contains("Delegate=yes"),
        "{text}"
    );

    let cgroups = delegate_cgroups(&instance, NOBODY);
    let egress = "egress_allow = [\"api.example.com:443\"]\negress_principals = [\"*\"]\n";
    let s = Server::launch(dir, &[], egress, Some(NOBODY));
    s.assert_healthy();
    let r = s.py("import os\nprint(os.getuid(), os.getcwd())");
    assert_eq!(r["stdout"], "1000 /mnt/data\n", "{r}");

    // The same containment as under root: memory, refused calls, invisible host.
    let r = s.exec(json!({"code": hostile("memory_bomb.py"), "limits": {"memory_limit_mb": 96}}));
    assert_eq!(r["oom_killed"], true, "{r}");
    let r = s.exec(json!({"code": hostile("syscalls.py"), "args": [s.pid().to_string()]}));
    let v: Value = serde_json::from_str(r["stdout"].as_str().unwrap().trim()).unwrap_or_else(|e| panic!("{e}: {r}"));
    for name in ["ptrace", "mount", "unshare", "setns", "keyctl", "bpf", "userfaultfd"] {
        assert_eq!(v[name], 1, "{name}: {v}");
    }
    assert_eq!(v["kill_server"], "no such process");
    let r = s.py("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), os.path.exists('/root'), os.path.exists('/home'))");
    assert_eq!(r["stdout"], "[1, 2] False False\n", "{r}");
    let r = s.exec(json!({"language": "bash", "code": hostile("fork_bomb.sh"), "timeout": 1500}));
    assert_eq!(r["status"], "timed_out");
    // Egress works without root too: the proxy answers the program (docs/egress.md).
    let r = s.exec(json!({
        "language": "bash",
        "code": "curl -sS --max-time 20 http://api.other.example/",
        "network": {},
    }));
    assert_eq!(
        r["stdout"], "sandcall egress: api.other.example is not in this run's network policy\n",
        "{r}"
    );
    s.assert_healthy();
    drop(s);
    // The server cannot remove what root delegated to it; the test harness does.
    for d in cgroups {
        match std::fs::remove_dir(&d) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => panic!("{}: {e}", d.display()),
            _ => {}
        }
    }
}
