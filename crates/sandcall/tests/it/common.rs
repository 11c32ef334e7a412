//! The test harness: a real server process with its own data directory.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// For tests that count what is left on the machine (cgroups, processes, staging
/// directories): no warm sandboxes, even in a pass that turns the pool on with
/// `SANDCALL_TEST_WARM_POOL`.
pub const NO_POOL: (&str, &str) = ("SANDCALL_WARM_POOL_SIZE", "0");

pub struct Server {
    pub child: Option<Child>,
    pub base: String,
    pub port: u16,
    pub dir: PathBuf,
    pub data_dir: PathBuf,
    pub config_path: PathBuf,
}

/// Whether this is `.ci/run`'s gvisor pass (`SANDCALL_TEST_ISOLATION=gvisor`): every
/// server runs its sandboxes in the gvisor tier. Only where gVisor's kernel answers
/// differently from the host's (docs/isolation.md, "Differences a program can see") does
/// a test expect something else of it.
pub fn gvisor_pass() -> bool {
    std::env::var("SANDCALL_TEST_ISOLATION").as_deref() == Ok("gvisor")
}

/// The most a run with a memory limit of `limit_mib` may be seen to peak at: the limit
/// (and a page of slack) in the `namespace` tier; in the `gvisor` tier the limit plus
/// what gVisor's own kernel may take (`gvisor::KERNEL_MEMORY`), which its peak counts.
pub fn memory_bound(limit_mib: u64) -> u64 {
    let gvisor = if gvisor_pass() {
        sandcall_engine::gvisor::KERNEL_MEMORY
    } else {
        0
    };
    (limit_mib << 20) + gvisor + (1 << 20)
}

/// Fails loudly when the tests cannot do what they claim to test.
pub fn require_root() {
    assert!(
        nix_is_root(),
        "sandcall's integration tests build real sandboxes and need root (bash .ci/run runs them as root)"
    );
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The languages that get warm sandboxes unless a test says otherwise.
pub const WARM_LANGUAGES: &str = r#"["python","bash"]"#;

/// Where the test servers find the Python runtime: SANDCALL_RUNTIME_DIR (which `.ci/run`
/// sets, after `sandcall runtime install` there), else `target/runtimes` of this
/// workspace.
pub fn runtime_dir() -> PathBuf {
    match std::env::var_os("SANDCALL_RUNTIME_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/runtimes"),
    }
}

pub fn hostile(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// In `Server::start_with`'s environment: the file the server's stderr goes to (instead
/// of the test's).
pub const STDERR_FILE: &str = "SANDCALL_TEST_STDERR_FILE";

impl Server {
    pub fn start() -> Server {
        Server::start_with(&[], "")
    }

    /// Starts a server with extra environment variables and extra TOML config lines.
    pub fn start_with(env: &[(&str, &str)], config: &str) -> Server {
        let dir = Server::new_dir();
        Server::launch(dir, env, config, None)
    }

    /// A fresh directory for one server: its config file and data directory go here.
    pub fn new_dir() -> PathBuf {
        require_root();
        let dir = std::env::temp_dir().join(format!("sandcall-it-{}-{}", std::process::id(), rand_suffix()));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        dir
    }

    /// A new directory outside /tmp (under target/), for what sandboxes must see, such as
    /// a runtime directory: every sandbox mounts a tmpfs of its own on /tmp, and the
    /// server refuses a runtime directory there.
    pub fn new_visible_dir() -> PathBuf {
        require_root();
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/it-dirs")
            .join(format!("{}-{}", std::process::id(), rand_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Starts `sandcall serve` with its files in `dir`, as root or as `user` (uid, gid).
    pub fn launch(dir: PathBuf, env: &[(&str, &str)], config: &str, user: Option<(u32, u32)>) -> Server {
        Server::launch_at(dir, env, config, user, "127.0.0.1:0")
    }

    /// The same, listening on `listen` (a cluster's node must know its own address
    /// before it starts: its `node_url`).
    pub fn launch_at(
        dir: PathBuf,
        env: &[(&str, &str)],
        config: &str,
        user: Option<(u32, u32)>,
        listen: &str,
    ) -> Server {
        let data_dir = dir.join("data");
        let config_path = dir.join("sandcall.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut cmd = match user {
            None => Command::new(env!("CARGO_BIN_EXE_sandcall")),
            Some((uid, gid)) => {
                // The build directory may sit where the user cannot reach (under /root):
                // give the user its own copy of the binary.
                use std::os::unix::process::CommandExt;
                let exe = dir.join("sandcall");
                std::fs::copy(env!("CARGO_BIN_EXE_sandcall"), &exe).unwrap();
                let mut cmd = Command::new(exe);
                cmd.uid(uid).gid(gid);
                cmd
            }
        };
        cmd.args(["serve", "--listen", listen, "--data-dir"])
            .arg(&data_dir)
            .arg("--config")
            .arg(&config_path)
            .env("SANDCALL_LOG", "warn")
            // The servers never install the Python runtime themselves: they use the one
            // `.ci/run` installed (tests of the data stack fail when it is missing).
            .env("SANDCALL_INSTALL_RUNTIME", "false")
            .env("SANDCALL_RUNTIME_DIR", runtime_dir())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // The warm pool is off unless a test (or SANDCALL_TEST_WARM_POOL, which CI sets
        // for a second pass of the hostile tests) asks for it: tests that count what
        // is left on the machine would otherwise see the pool's sandboxes.
        let pool = std::env::var("SANDCALL_TEST_WARM_POOL").unwrap_or_else(|_| "0".into());
        cmd.env("SANDCALL_WARM_POOL_SIZE", &pool);
        // Warm sets for Python and Bash only, which is what tests that count warm
        // sandboxes expect; the JavaScript tests ask for theirs.
        cmd.env("SANDCALL_WARM_LANGUAGES", WARM_LANGUAGES);
        // No preloaded Python sandboxes (a second of CPU each to build) unless a test
        // asks for them.
        cmd.env("SANDCALL_WARM_PRELOAD_POOL_SIZE", "0");
        // SANDCALL_TEST_FILE_STORE=s3 (a pass of `.ci/run`): every server keeps its files
        // in the test S3 server, under a prefix of its own.
        if std::env::var("SANDCALL_TEST_FILE_STORE").as_deref() == Ok("s3") {
            let prefix = format!("it-{}-{}", std::process::id(), rand_suffix());
            for (k, v) in s3_env(&prefix) {
                cmd.env(k, v);
            }
        }
        // SANDCALL_TEST_ISOLATION=gvisor (a pass of `.ci/run`): every server runs its
        // sandboxes in the gvisor tier.
        if let Ok(tier) = std::env::var("SANDCALL_TEST_ISOLATION") {
            cmd.env("SANDCALL_ISOLATION", tier);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        // A test that reads the server's log names a file for its stderr.
        if let Some((_, path)) = env.iter().find(|(k, _)| *k == STDERR_FILE) {
            cmd.stderr(std::fs::File::create(path).unwrap());
        }
        let mut child = cmd.spawn().expect("start sandcall serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("sandcall listening on ") {
                    let _ = tx.send(url.to_string());
                }
            }
        });
        let base = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                let status = child.wait();
                panic!("sandcall serve did not start: {status:?}");
            }
        };
        let port = base.rsplit(':').next().unwrap().parse().unwrap();
        let data_dir = std::fs::canonicalize(&data_dir).unwrap();
        let server = Server {
            child: Some(child),
            base,
            port,
            dir,
            data_dir,
            config_path,
        };
        // With a warm pool, start once it is full, so that the first runs are warm.
        let size = env
            .iter()
            .find(|(k, _)| *k == "SANDCALL_WARM_POOL_SIZE")
            .map(|(_, v)| v.to_string())
            .unwrap_or(pool);
        let languages = env
            .iter()
            .find(|(k, _)| *k == "SANDCALL_WARM_LANGUAGES")
            .map_or(WARM_LANGUAGES, |(_, v)| v);
        let languages = serde_json::from_str::<Vec<String>>(languages).map_or(2, |l| l.len());
        let size = size.parse::<usize>().unwrap_or(0);
        let preloaded = if size == 0 {
            0
        } else {
            env.iter()
                .find(|(k, _)| *k == "SANDCALL_WARM_PRELOAD_POOL_SIZE")
                .map_or(0, |(_, v)| v.parse::<usize>().unwrap_or(0))
        };
        if user.is_none() {
            server.wait_warm(languages * size + preloaded);
        }
        server
    }

    /// Waits until `n` warm sandboxes are ready (health's `warm_idle`).
    pub fn wait_warm(&self, n: usize) {
        if n == 0 {
            return;
        }
        let start = Instant::now();
        while self.warm_idle() < n {
            assert!(start.elapsed() < Duration::from_secs(60), "the warm pool did not fill");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The warm sandboxes ready, as the health route says.
    pub fn warm_idle(&self) -> usize {
        let (_, _, health) = self.request("GET", "/v1/health", None, None);
        // With API keys configured, health without a key does not say; such tests do
        // not use the pool.
        match health.get("warm_idle") {
            Some(idle) => idle.as_u64().unwrap_or(0) as usize,
            None => usize::MAX,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Any request; returns status, Retry-After, and the body parsed as JSON (or a
    /// JSON string holding the raw body when it is not JSON, which tests then reject).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&str>,
    ) -> (u16, Option<String>, Value) {
        let headers: Vec<(&str, &str)> = content_type.map(|ct| ("Content-Type", ct)).into_iter().collect();
        self.request_reading(method, path, &headers, body, "Retry-After")
    }

    /// Any request with `headers`; returns status, the response header `read`, and the
    /// body as `request` does.
    pub fn request_reading(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
        read: &str,
    ) -> (u16, Option<String>, Value) {
        let (status, mut found, value) = self.request_reading_each(method, path, headers, body, &[read]);
        (status, found.pop().flatten(), value)
    }

    /// `request_reading` for several response headers, in `read`'s order.
    pub fn request_reading_each(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
        read: &[&str],
    ) -> (u16, Vec<Option<String>>, Value) {
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build();
        let mut req = agent.request(method, &self.url(path));
        for (name, value) in headers {
            req = req.set(name, value);
        }
        let result = match body {
            Some(b) => req.send_string(b),
            None => req.call(),
        };
        let resp = match result {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let status = resp.status();
        let found = read.iter().map(|name| resp.header(name).map(str::to_owned)).collect();
        let text = resp.into_string().unwrap();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, found, value)
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (s, _, v) = self.request("POST", path, Some("application/json"), Some(&body.to_string()));
        (s, v)
    }

    /// A JSON POST with extra headers (credentials, `X-LibreChat-Code-Request-ID`).
    pub fn post_with(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, Value) {
        let mut all = vec![("Content-Type", "application/json")];
        all.extend_from_slice(headers);
        let (status, _, value) = self.request_reading_each("POST", path, &all, Some(&body.to_string()), &[]);
        (status, value)
    }

    /// POST /v1/exec, which must answer 200.
    pub fn exec(&self, body: Value) -> Value {
        let (status, v) = self.post("/v1/exec", &body);
        assert_eq!(status, 200, "exec answered {status}: {v}");
        v
    }

    /// POST /v1/exec; returns the `sandcall-sandbox` header (warm or cold) and the body.
    pub fn exec_kind(&self, body: &str) -> (String, Value) {
        let resp = ureq::post(&self.url("/v1/exec"))
            .set("Content-Type", "application/json")
            .send_string(body)
            .unwrap();
        let kind = resp.header("sandcall-sandbox").unwrap_or("").to_owned();
        (kind, serde_json::from_str(&resp.into_string().unwrap()).unwrap())
    }

    pub fn py(&self, code: &str) -> Value {
        self.exec(json!({"language": "python", "code": code}))
    }

    pub fn bash(&self, code: &str) -> Value {
        self.exec(json!({"language": "bash", "code": code}))
    }

    /// The server still answers, and still runs programs correctly.
    pub fn assert_healthy(&self) {
        let (status, _, v) = self.request("GET", "/v1/health", None, None);
        assert_eq!(status, 200, "health: {v}");
        assert_eq!(v["status"], "ok");
        let r = self.py("print(sum(range(10)))");
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["stdout"], "45\n");
    }

    /// Stops this server (SIGTERM, or SIGKILL when `hard`) and starts a new one on the
    /// same data directory, configuration and environment; returns the old exit status.
    pub fn restart(self, env: &[(&str, &str)], hard: bool) -> (Server, Option<std::process::ExitStatus>) {
        let mut old = self;
        let mut child = old.child.take().expect("server running");
        let status = if hard {
            let _ = child.kill();
            let _ = child.wait();
            None
        } else {
            // SAFETY: plain kill(2) on our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            Some(child.wait().unwrap())
        };
        let dir = old.dir.clone();
        let config = std::fs::read_to_string(&old.config_path).unwrap();
        // The new server owns the directory now.
        std::mem::forget(old);
        (Server::launch(dir, env, &config, None), status)
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) };
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        self.terminate();
        let mut child = self.child.take().expect("server running");
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if start.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!("server did not stop within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn instance(&self) -> String {
        sandcall_engine::host::instance_name(&self.data_dir)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop();
        }
        // A server a test killed leaves its cgroups (a stopped one removes them itself);
        // its data dir goes now, so no later server would sweep them.
        if let Ok(cgroups) = sandcall_sandbox::cgroup::CgroupRoot::detect(&self.instance()) {
            cgroups.close();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The S3-compatible server the tests use (moto's server mode, which `.ci/run` starts)
/// and its bucket: SANDCALL_TEST_S3_ENDPOINT and SANDCALL_TEST_S3_BUCKET. A test that
/// needs them fails when they are unset: it must not pass without S3.
pub fn s3_server() -> (String, String) {
    let endpoint = std::env::var("SANDCALL_TEST_S3_ENDPOINT").unwrap_or_default();
    let bucket = std::env::var("SANDCALL_TEST_S3_BUCKET").unwrap_or_default();
    assert!(
        !endpoint.is_empty() && !bucket.is_empty(),
        "SANDCALL_TEST_S3_ENDPOINT and SANDCALL_TEST_S3_BUCKET are unset: this test needs the S3 server \
         that .ci/run starts (moto)"
    );
    (endpoint, bucket)
}

/// The environment of a server whose files live in the test S3 server under `prefix`
/// (servers given the same prefix share their files).
pub fn s3_env(prefix: &str) -> Vec<(String, String)> {
    let (endpoint, bucket) = s3_server();
    [
        ("SANDCALL_FILE_STORE", format!("s3://{bucket}/{prefix}")),
        ("SANDCALL_S3_ENDPOINT", endpoint),
        ("AWS_ACCESS_KEY_ID", "sandcall-test".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "sandcall-test".to_owned()),
        ("AWS_DEFAULT_REGION", "us-east-1".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// A key prefix no other test uses.
pub fn unique_prefix(what: &str) -> String {
    format!("{what}-{}-{}", std::process::id(), rand_suffix())
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish()
}

/// A field of `/proc/<pid>/status` given in kB (`VmRSS`, `VmHWM`, ...), in KiB; None if
/// the process or the field is gone.
pub fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    line.split_whitespace().next()?.parse().ok()
}

/// Every host process with its parent: `(pid, ppid)`.
pub fn parents() -> Vec<(u32, u32)> {
    let mut parents = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name may contain spaces; fields after it are fixed.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let ppid: u32 = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        parents.push((pid, ppid));
    }
    parents
}

/// Processes whose parent chain leads to `root` (not counting `root`), but for the
/// server's helper launcher (see `launchers`), which lives as long as the server and
/// has no children of its own (the helpers it forks are the server's).
pub fn descendants(root: u32) -> Vec<u32> {
    let parents = parents();
    let mut found = vec![root];
    let mut changed = true;
    while changed {
        changed = false;
        for (pid, ppid) in &parents {
            if found.contains(ppid) && !found.contains(pid) {
                found.push(*pid);
                changed = true;
            }
        }
    }
    found.retain(|p| *p != root && !is_launcher(*p));
    found
}

/// The name (`comm`) of the helper launcher (`sandcall_sandbox::launcher::LAUNCHER_NAME`).
pub const LAUNCHER_NAME: &str = "sandcall-launch";

/// Whether `pid` is a helper launcher.
pub fn is_launcher(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == LAUNCHER_NAME)
}

/// The helper launchers whose parent is `server`.
pub fn launchers(server: u32) -> Vec<u32> {
    parents()
        .into_iter()
        .filter(|(pid, ppid)| *ppid == server && is_launcher(*pid))
        .map(|(pid, _)| pid)
        .collect()
}

/// Host processes whose command line contains `needle`.
pub fn processes_matching(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                out.push(pid);
            }
        }
    }
    out
}

/// Whether a program of `s` whose command line holds `marker` runs: on the host (the
/// `namespace` tier), or, in the `gvisor` tier, where the host sees only gVisor's kernel,
/// whether a gVisor sandbox of `s` runs.
pub fn program_running(s: &Server, marker: &str) -> bool {
    if !gvisor_pass() {
        return !processes_matching(marker).is_empty();
    }
    !gvisor_kernels(s).is_empty()
}

/// The gVisor kernels (`runsc-sandbox` processes) of `s`'s gVisor sandboxes running now.
pub fn gvisor_kernels(s: &Server) -> Vec<u32> {
    let state = s.data_dir.join("gvisor").join("state");
    processes_matching(&state.to_string_lossy())
        .into_iter()
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"runsc-sandbox\0")))
        .collect()
}

/// Run cgroups of this server's instance, across every hierarchy.
pub fn run_cgroups(instance: &str) -> usize {
    run_cgroup_paths(instance).len()
}

/// The paths of this instance's cgroups, across every hierarchy and at any depth (on
/// v2, a template's runs are below the template's directory).
pub fn run_cgroup_paths(instance: &str) -> std::collections::BTreeSet<PathBuf> {
    fn below(dir: &Path, into: &mut std::collections::BTreeSet<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for path in entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()) {
            below(&path, into);
            into.insert(path);
        }
    }
    let mut bases: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .map(|entry| entry.path().join(instance))
        .collect();
    // cgroup v2 mounted directly at /sys/fs/cgroup.
    bases.push(Path::new("/sys/fs/cgroup").join(instance));
    let mut paths = std::collections::BTreeSet::new();
    for base in &bases {
        below(base, &mut paths);
    }
    paths
}

/// Polls `f` until it returns `want` (up to 10 s): helpers answer before they finish
/// removing a run's cgroup and mounts, so counts settle a moment after the answer.
pub fn settle<T: PartialEq + std::fmt::Debug>(mut f: impl FnMut() -> T, want: T) -> T {
    let start = Instant::now();
    loop {
        let got = f();
        if got == want || start.elapsed() > Duration::from_secs(10) {
            return got;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Nothing of run `session_id` is left: no cgroup of it in any hierarchy, no staging
/// directory (after the moment a helper takes to tear down).
pub fn assert_run_reclaimed(s: &Server, session_id: &str) {
    let instance = s.instance();
    let left = || {
        let mut left: Vec<String> = Vec::new();
        for entry in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
            let dir = entry.path().join(&instance).join(session_id);
            if dir.exists() {
                left.push(dir.display().to_string());
            }
        }
        let staging = s.data_dir.join("runs").join(session_id);
        if staging.exists() {
            left.push(staging.display().to_string());
        }
        left
    };
    assert_eq!(
        settle(left, Vec::new()),
        Vec::<String>::new(),
        "run {session_id} was not reclaimed"
    );
}

pub fn mount_count() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap().lines().count()
}

pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// The names in a directory (none if it does not exist).
pub fn dir_names(path: &Path) -> std::collections::BTreeSet<std::ffi::OsString> {
    std::fs::read_dir(path)
        .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default()
}

pub fn dir_entries(path: &Path) -> usize {
    std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0)
}
