//! Starting: host paths that sandboxes could not see are refused by `serve`, `mcp` and
//! `doctor` with the cause and the fix.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A fresh directory under this workspace's `target/` (never under /tmp, which the
/// refusals below are about).
fn scratch(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../target/it-startup-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::canonicalize(dir).unwrap()
}

/// Runs `sandcall <sub> --data-dir <data_dir>` with `env`, stdin closed; its exit status,
/// stdout and stderr, or a panic when it has not ended within 20 s (a server that
/// started instead of refusing).
fn refused(sub: &str, data_dir: &Path, env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandcall"));
    cmd.args([sub, "--data-dir"])
        .arg(data_dir)
        .env_remove("SANDCALL_RUNTIME_DIR")
        .env("SANDCALL_INSTALL_RUNTIME", "false")
        .env("SANDCALL_LISTEN", "127.0.0.1:0")
        .env("SANDCALL_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().unwrap();
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) on our own child's pid; no memory is involved.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!(
                "sandcall {sub} with data dir {} did not refuse to start",
                data_dir.display()
            );
        }
    };
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn runtimes_under_paths_every_sandbox_replaces_are_refused_with_the_cause_and_the_fix() {
    crate::common::require_root();
    let base = scratch("paths");
    let id = std::process::id();
    let in_tmp = PathBuf::from(format!("/tmp/sandcall-it-startup-{id}"));
    let in_shm = PathBuf::from(format!("/dev/shm/sandcall-it-startup-{id}"));
    let runtime_in_tmp = format!("/tmp/sandcall-it-startup-runtimes-{id}");
    let cases = [
        (
            &in_tmp,
            vec![],
            format!("data_dir {} is under /tmp", in_tmp.display()),
            "/var/lib/sandcall)",
        ),
        (
            &in_shm,
            vec![],
            format!("data_dir {} is under /dev/shm", in_shm.display()),
            "/var/lib/sandcall)",
        ),
        (
            &base,
            vec![("SANDCALL_RUNTIME_DIR", runtime_in_tmp.as_str())],
            format!("runtime_dir {runtime_in_tmp} is under /tmp"),
            "/var/lib/sandcall/runtimes)",
        ),
    ];
    for (data_dir, env, cause, example) in &cases {
        for sub in ["serve", "mcp", "doctor"] {
            let started = Instant::now();
            let (ok, stdout, stderr) = refused(sub, data_dir, env);
            let text = if sub == "doctor" { &stdout } else { &stderr };
            assert!(!ok, "{sub} started: {stdout}{stderr}");
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{sub} took {:?}",
                started.elapsed()
            );
            // The cause: which key, where, and what hides it; the fix: where to go instead.
            for part in [
                cause.as_str(),
                "which every sandbox replaces with a tmpfs of its own",
                "so runs could not see the managed runtimes",
                "outside /tmp, /dev/shm, /proc, /mnt/data",
                example,
            ] {
                assert!(text.contains(part), "{sub}: {part:?} in {text}");
            }
            let lead = if sub == "doctor" {
                "[FAIL] paths sandboxes see: "
            } else {
                "sandcall: refusing to start: "
            };
            assert!(text.contains(&format!("{lead}{cause}")), "{sub}: {text}");
        }
    }
    // Nothing was installed where runs could not see it.
    assert!(!Path::new(&runtime_in_tmp).exists());
    for dir in [&in_tmp, &in_shm, &base] {
        let _ = std::fs::remove_dir_all(dir);
    }
}
