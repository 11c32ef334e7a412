//! Starting: host paths that sandboxes could not see are refused by `serve`, `mcp` and
//! `doctor` with the cause and the fix, and `sandcall mcp` answers at once while its
//! first start installs the managed runtimes.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
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

/// A package registry that never answers: it accepts connections (pip's and npm's)
/// and holds them until `release`, then closes them and stops listening, so that the
/// install fails at once.
struct SilentRegistry {
    url: String,
    connections: Arc<AtomicUsize>,
    release: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SilentRegistry {
    fn start() -> SilentRegistry {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let connections = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(AtomicBool::new(false));
        let thread = {
            let (connections, release) = (connections.clone(), release.clone());
            std::thread::spawn(move || {
                let mut held = Vec::new();
                while !release.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            held.push(stream);
                            connections.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })
        };
        SilentRegistry {
            url,
            connections,
            release,
            thread: Some(thread),
        }
    }

    fn release(&mut self) {
        self.release.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

/// `sandcall mcp` over its stdin and stdout, one JSON-RPC message a line.
struct McpProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    messages: mpsc::Receiver<Value>,
    /// Notifications seen while waiting for answers.
    notifications: Vec<Value>,
}

impl McpProcess {
    fn start(data_dir: &Path, env: &[(&str, &str)]) -> McpProcess {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandcall"));
        cmd.args(["mcp", "--data-dir"])
            .arg(data_dir)
            .env("SANDCALL_LOG", "warn")
            .env("SANDCALL_WARM_POOL_SIZE", "0")
            .env("SANDCALL_WARM_PRELOAD_POOL_SIZE", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // The machine's own settings of pip and npm (an index, a directory of wheels)
        // are not the test's.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("PIP_") || k.to_ascii_lowercase().starts_with("npm_config_") {
                cmd.env_remove(k.as_ref());
            }
        }
        // SANDCALL_TEST_ISOLATION=gvisor (a pass of `.ci/run`): sandboxes in that tier.
        if let Ok(tier) = std::env::var("SANDCALL_TEST_ISOLATION") {
            cmd.env("SANDCALL_ISOLATION", tier);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, messages) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let message =
                    serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON-RPC on stdout ({e}): {line}"));
                if tx.send(message).is_err() {
                    return;
                }
            }
        });
        McpProcess {
            stdin: child.stdin.take(),
            child,
            messages,
            notifications: Vec::new(),
        }
    }

    fn send(&mut self, message: Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    }

    /// Sends request `id` and waits up to `within` for its answer.
    fn call(&mut self, id: u64, method: &str, params: Value, within: Duration) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let message = self
                .messages
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no answer to {method} within {within:?}"));
            if message["id"] == id {
                return message;
            }
            self.notifications.push(message);
        }
    }

    fn initialize(&mut self, within: Duration) -> Value {
        let params = json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "sandcall-it", "version": "1"},
        });
        let answer = self.call(1, "initialize", params, within);
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        answer
    }

    fn tool_names(&mut self, id: u64, within: Duration) -> Vec<String> {
        let answer = self.call(id, "tools/list", json!({}), within);
        let mut names: Vec<String> = answer["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"))
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    }

    /// Closes stdin: the server stops.
    fn stop(mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("sandcall mcp did not stop when its stdin closed");
    }
}

impl Drop for McpProcess {
    /// A test that failed leaves no server behind.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const TOOLS: [&str; 4] = ["download_file", "execute_code", "list_files", "upload_file"];

/// On a fresh data directory and an empty runtime directory, `sandcall mcp` installs
/// the managed runtimes first (pip and npm, from a registry that holds them waiting here):
/// `initialize` and `tools/list` answer within a second meanwhile, and the first
/// `execute_code` waits for the install, with progress notifications, then runs and says
/// what the install did.
#[test]
fn sandcall_mcp_answers_at_once_while_its_first_start_installs_the_runtimes() {
    crate::common::require_root();
    let base = scratch("mcp");
    let runtimes = base.join("runtimes");
    std::fs::create_dir_all(&runtimes).unwrap();
    let mut registry = SilentRegistry::start();
    let index = format!("{}/simple/", registry.url);
    let npm_cache = base.join("npm-cache");
    let runtimes_env = runtimes.to_str().unwrap().to_owned();
    let npm_cache_env = npm_cache.to_str().unwrap().to_owned();
    let npmrc = base.join("npmrc").to_str().unwrap().to_owned();
    let mut mcp = McpProcess::start(
        &base.join("data"),
        &[
            ("SANDCALL_RUNTIME_DIR", &runtimes_env),
            ("SANDCALL_INSTALL_RUNTIME", "true"),
            // pip and npm reach only the silent registry, from empty caches, and give up
            // at the first failure.
            ("PIP_CONFIG_FILE", "/dev/null"),
            ("PIP_INDEX_URL", &index),
            ("PIP_NO_CACHE_DIR", "1"),
            ("PIP_RETRIES", "0"),
            ("npm_config_registry", &registry.url),
            ("npm_config_userconfig", &npmrc),
            ("npm_config_cache", &npm_cache_env),
            ("npm_config_fetch_retries", "0"),
        ],
    );
    let answer = mcp.initialize(Duration::from_secs(1));
    assert_eq!(answer["result"]["serverInfo"]["name"], "sandcall", "{answer}");
    assert_eq!(mcp.tool_names(2, Duration::from_secs(1)), TOOLS);

    // The install is under way, held by the registry: pip has asked it for a package.
    let deadline = Instant::now() + Duration::from_secs(60);
    while registry.connections.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the install never reached the registry");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(mcp.tool_names(3, Duration::from_secs(1)), TOOLS, "while pip waits");

    // A run asked for now waits for the install, and hears about it meanwhile.
    let run = json!({
        "name": "execute_code",
        "arguments": {"language": "python", "code": "print(6 * 7)"},
        "_meta": {"progressToken": "first-run"},
    });
    mcp.send(json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": run}));
    std::thread::sleep(Duration::from_millis(1500));
    registry.release();
    let deadline = Instant::now() + Duration::from_secs(180);
    let answer = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = mcp.messages.recv_timeout(left).expect("execute_code never answered");
        if message["id"] == 4 {
            break message;
        }
        mcp.notifications.push(message);
    };
    let progress: Vec<&Value> = mcp
        .notifications
        .iter()
        .filter(|n| n["method"] == "notifications/progress" && n["params"]["progressToken"] == "first-run")
        .collect();
    assert!(
        !progress.is_empty(),
        "no progress notification: {:?}",
        mcp.notifications
    );
    let message = progress[0]["params"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("installs the managed runtimes"), "{message}");

    // The install failed (the registry never answered): the run goes on with the bare
    // interpreter, and its result says why the data stack is missing.
    let result = &answer["result"];
    assert_ne!(result["isError"], true, "{answer}");
    let out = &result["structuredContent"];
    assert_eq!(out["stdout"], "42\n", "{answer}");
    let notice = out["notice"].as_str().unwrap_or_else(|| panic!("no notice: {answer}"));
    for part in [
        "could not install the Python runtime",
        "`sandcall runtime install` retries",
        "This call waited",
    ] {
        assert!(notice.contains(part), "{part:?} in {notice}");
    }
    // Told once: the next call has no notice.
    let again = mcp.call(
        5,
        "tools/call",
        json!({"name": "execute_code", "arguments": {"language": "bash", "code": "echo 7"}}),
        Duration::from_secs(60),
    );
    assert_eq!(again["result"]["structuredContent"]["stdout"], "7\n", "{again}");
    assert!(again["result"]["structuredContent"].get("notice").is_none(), "{again}");
    mcp.stop();
    let _ = std::fs::remove_dir_all(&base);
}

/// A start that fails after `sandcall mcp` answered (here: no Python interpreter) is
/// every tool call's error, naming the cause, and the server keeps answering.
#[test]
fn a_failed_start_of_sandcall_mcp_is_each_tool_calls_error_and_it_keeps_answering() {
    crate::common::require_root();
    let base = scratch("mcp-failed");
    let mut mcp = McpProcess::start(
        &base.join("data"),
        &[
            ("SANDCALL_PYTHON", "/nonexistent/python3"),
            ("SANDCALL_INSTALL_RUNTIME", "false"),
        ],
    );
    mcp.initialize(Duration::from_secs(1));
    for id in [2, 3] {
        let run = json!({"name": "execute_code", "arguments": {"language": "bash", "code": "echo 1"}});
        let answer = mcp.call(id, "tools/call", run, Duration::from_secs(60));
        assert_eq!(answer["result"]["isError"], true, "{answer}");
        let error = answer["result"]["structuredContent"]["error"]
            .as_str()
            .unwrap_or_default();
        for part in [
            "sandcall could not start",
            "python interpreter",
            "/nonexistent/python3 is missing",
            "restart `sandcall mcp`",
        ] {
            assert!(error.contains(part), "{part:?} in {answer}");
        }
    }
    assert_eq!(mcp.tool_names(4, Duration::from_secs(1)), TOOLS);
    mcp.stop();
    let _ = std::fs::remove_dir_all(&base);
}
