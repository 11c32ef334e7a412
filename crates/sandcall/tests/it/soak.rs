//! Soak: one server (and then two nodes sharing Redis and S3) under sixteen concurrent
//! clients for a bounded time, every kind of request mixed (plain runs, programmatic
//! sessions resumed, failed, gathered, cancelled and abandoned, files, hostile programs),
//! each answer checked exactly; afterwards nothing may be left over.
//!
//! **Run this test alone.** It compares host-wide counts before and after the load
//! (processes under the server, run cgroups, host mounts, the server's descriptors), and
//! it saturates the machine: any other test beside it skews both. CI runs the rest with
//! `cargo nextest run -E 'not test(/^soak::/)'`, then this with
//! `cargo nextest run -E 'test(/^soak::/)'`.
//!
//! The load lasts 120 s, or `SANDCALL_SOAK_SECS` seconds. nextest ends a test after
//! three minutes; for a longer soak run it with `cargo test --test it soak -- --nocapture`.

use crate::common::{descendants, dir_entries, fd_count, hostile, mount_count, run_cgroups, settle, Server};
use crate::files::{file_part, multipart, multipart_content_type};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Read;
use std::time::{Duration, Instant};

const CLIENTS: usize = 16;
const DEFAULT_SECS: u64 = 120;
/// Short, so that abandoned sessions end within the test.
const SESSION_EXPIRY: Duration = Duration::from_secs(4);
/// How long after its expiry an abandoned session may still be answered as paused.
const EXPIRY_GRACE: Duration = Duration::from_secs(10);
/// Caps low enough that the load meets them: 16 clients of one principal (local mode)
/// against 6 run slots, 2 places in the queue, 9 runs and 8 sessions per principal (per
/// node: on two nodes each node has half of each). Both kinds of refusal, `503
/// at_capacity` and `429 principal_at_capacity`, must happen, and each is retried
/// unchanged: its retry must get exactly the answer the first try would have, so the
/// refusal changed nothing (a refused resume left its token good).
#[derive(Clone, Copy)]
struct Caps {
    runs: u64,
    queued: u64,
    runs_per_principal: u64,
    sessions_per_principal: u64,
}

impl Caps {
    const ONE_NODE: Caps = Caps {
        runs: 6,
        queued: 2,
        runs_per_principal: 9,
        sessions_per_principal: 8,
    };
    const EACH_OF_TWO: Caps = Caps {
        runs: 3,
        queued: 1,
        runs_per_principal: 5,
        sessions_per_principal: 4,
    };

    fn config(self) -> String {
        format!(
            // The principal's Python templates (`zygote`) are stopped a second after
            // the load, so the server is back to its idle footprint.
            "max_concurrent_runs = {}\nmax_queued_runs = {}\nmax_runs_per_principal = {}\nmax_sessions_per_principal = {}\nzygote_template_idle_s = 1\n",
            self.runs, self.queued, self.runs_per_principal, self.sessions_per_principal
        )
    }
}
/// Failure messages kept per client (all are counted).
const KEPT_FAILURES: usize = 20;
const ROUTE: &str = "/v1/exec/programmatic";

/// What one iteration of a client does.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Python,
    Bash,
    Resumed,
    ToolError,
    Gather,
    Cancelled,
    Abandoned,
    Files,
    Hostile,
}

const KINDS: [Kind; 9] = [
    Kind::Python,
    Kind::Bash,
    Kind::Resumed,
    Kind::ToolError,
    Kind::Gather,
    Kind::Cancelled,
    Kind::Abandoned,
    Kind::Files,
    Kind::Hostile,
];

/// Returns early with the message when the condition does not hold.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// Files expire and are swept during the load too; abandoned sessions expire.
fn soak_env() -> Vec<(String, String)> {
    vec![
        ("SANDCALL_SESSION_EXPIRY_S".into(), SESSION_EXPIRY.as_secs().to_string()),
        ("SANDCALL_FILE_TTL_S".into(), "60".into()),
        ("SANDCALL_FILE_SWEEP_INTERVAL_S".into(), "5".into()),
    ]
}

#[test]
fn soak_mixed_load_leaves_nothing_behind() {
    let env = soak_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let s = Server::start_with(&env, &Caps::ONE_NODE.config());
    soak(vec![s], Caps::ONE_NODE);
}

/// The same load against two nodes that share their sessions through Redis and their
/// files through S3 (the servers `.ci/run` starts): every request of a client goes to the
/// two nodes in turn, so sessions are resumed, read and cancelled through the node that
/// does not hold them (forwarded to the one that does), and files uploaded through one
/// are used and downloaded through the other.
#[test]
fn soak_two_nodes_over_redis_and_s3_leave_nothing_behind() {
    let redis = crate::cluster::redis_url();
    let prefix = crate::common::unique_prefix("soak");
    let nodes = (0..2)
        .map(|_| {
            let mut env = soak_env();
            env.extend(crate::common::s3_env(&prefix));
            env.push(("SANDCALL_TOKEN_SECRET".into(), crate::cluster::SECRET.into()));
            // The harness's warm pool (cluster nodes default to none), as Footprint expects.
            let pool = std::env::var("SANDCALL_TEST_WARM_POOL").unwrap_or_else(|_| "0".into());
            env.push(("SANDCALL_WARM_POOL_SIZE".into(), pool));
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            crate::cluster::node_with_config(&redis, &env, &Caps::EACH_OF_TWO.config())
        })
        .collect();
    soak(nodes, Caps::EACH_OF_TWO);
}

/// One node's footprint before the load.
struct Before {
    idle: Footprint,
    fds: usize,
    rss: u64,
}

fn soak(mut nodes: Vec<Server>, caps: Caps) {
    let clustered = nodes.len() > 1;
    let secs: u64 = std::env::var("SANDCALL_SOAK_SECS")
        .ok()
        .map(|v| v.parse().expect("SANDCALL_SOAK_SECS is a number of seconds"))
        .unwrap_or(DEFAULT_SECS);
    let began = Instant::now();
    let mut before = Vec::new();
    for s in &nodes {
        s.assert_healthy();
        let idle = Footprint::idle(s);
        let now = settle(|| Footprint::measure(s), idle);
        assert_eq!(now, idle, "the server is not idle before the load");
        before.push(Before {
            idle,
            fds: fds_of(s, clustered),
            rss: rss_kib(s.pid()),
        });
    }
    let mounts_before = mount_count();

    let load_began = Instant::now();
    let deadline = load_began + Duration::from_secs(secs);
    let mut tally = Tally::default();
    let watching = std::sync::atomic::AtomicBool::new(true);
    std::thread::scope(|scope| {
        // Meanwhile, health must never count more programs running than there are slots,
        // nor more sessions than the principal may hold: a refused request that ran (or
        // kept its session) anyway would show here.
        let watcher = scope.spawn(|| watch_counts(&nodes, caps, &watching));
        let handles: Vec<_> = (0..CLIENTS)
            .map(|index| {
                let nodes = &nodes;
                scope.spawn(move || Client::new(nodes, index).run_until(deadline))
            })
            .collect();
        for (index, handle) in handles.into_iter().enumerate() {
            match handle.join() {
                Ok(t) => tally.merge(t),
                Err(panic) => tally.fail(format!("client {index} panicked: {}", panic_text(&panic))),
            }
        }
        watching.store(false, std::sync::atomic::Ordering::SeqCst);
        match watcher.join() {
            Ok(watched) => tally.merge(watched),
            Err(panic) => tally.fail(format!("the health watcher panicked: {}", panic_text(&panic))),
        }
    });
    if tally.at_capacity == 0 || tally.principal_at_capacity == 0 {
        tally.fail(format!(
            "the caps were never met: {} at_capacity, {} principal_at_capacity",
            tally.at_capacity, tally.principal_at_capacity
        ));
    }
    let load_time = load_began.elapsed();

    // A server that died under the load has nothing left to measure.
    let mut after = Vec::new();
    for (s, before) in nodes.iter_mut().zip(&before) {
        let exited = s.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
        after.push(match exited {
            Some(status) => {
                tally.fail(format!("the server exited during the load: {status}"));
                (0, 0)
            }
            None => check_nothing_left(s, before.idle, before.fds, clustered, &mut tally),
        });
    }
    let mounts_after = settle(mount_count, mounts_before);
    if mounts_after != mounts_before {
        tally.fail(format!("host mounts {mounts_before} -> {mounts_after}"));
    }
    let mut last = Client::new(&nodes, CLIENTS);
    for _ in &nodes {
        if let Err(e) = last.python(0) {
            last.tally.fail(format!("a run after the load: {e}"));
        }
    }
    tally.merge(last.tally);

    let (rss_after, fds_after) = after[0];
    eprintln!(
        "{}",
        tally.summary(
            secs,
            load_time,
            began.elapsed(),
            (before[0].rss, rss_after),
            (before[0].fds, fds_after)
        )
    );
    for (i, (before, (rss_after, fds_after))) in before.iter().zip(after).enumerate().skip(1) {
        eprintln!(
            "node {i}: server RSS {} -> {} MiB, fds {} -> {fds_after}",
            before.rss >> 10,
            rss_after >> 10,
            before.fds
        );
    }
    assert!(
        tally.failures.is_empty(),
        "{} failures (first {} shown):\n{}",
        tally.failure_count,
        tally.failures.len(),
        tally.failures.join("\n")
    );
}

/// Polls every node's health until `watching` goes false; a failure for every count over
/// its cap (the caps are each node's).
fn watch_counts(nodes: &[Server], caps: Caps, watching: &std::sync::atomic::AtomicBool) -> Tally {
    let mut tally = Tally::default();
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(30)).build();
    let (max_runs, max_sessions) = (caps.runs, caps.sessions_per_principal);
    let mut turn = 0usize;
    while watching.load(std::sync::atomic::Ordering::SeqCst) {
        turn += 1;
        let s = &nodes[turn % nodes.len()];
        if let Ok(reply) = agent.get(&s.url("/v1/health")).call() {
            let health: Value = reply.into_json().unwrap_or_default();
            let active = health["active_runs"].as_u64().unwrap_or(0);
            tally.health_samples += 1;
            let sessions = health["sessions"].as_u64().unwrap_or(u64::MAX);
            let paused = health["paused_sessions"].as_u64().unwrap_or(u64::MAX);
            if active > max_runs || sessions > max_sessions || paused > sessions {
                tally.fail(format!(
                    "health counts over the caps ({max_runs} runs, {max_sessions} sessions): {health}"
                ));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    tally
}

// ---------------------------------------------------------------------------
// What is left on the machine
// ---------------------------------------------------------------------------

/// After the load: every abandoned session has been seen to expire; the sandboxes of the
/// rest must be gone too, and the warm pool refilled. Returns the server's RSS (KiB) and
/// descriptors, for the summary.
fn check_nothing_left(
    s: &Server,
    idle: Footprint,
    fds_before: usize,
    clustered: bool,
    tally: &mut Tally,
) -> (u64, usize) {
    let after = settle(|| Footprint::measure(s), idle);
    if after != idle {
        tally.fail(format!("left over after the load: {after:?}, idle was {idle:?}"));
    }
    // A few descriptors may come and go (connections closing, epoll); runs must not add up.
    let fds_settled = settle(|| fds_of(s, clustered) <= fds_before + 4, true);
    let fds_after = fds_of(s, clustered);
    if !fds_settled {
        tally.fail(format!("server descriptors {fds_before} -> {fds_after}"));
    }
    (rss_kib(s.pid()), fds_after)
}

/// What the server holds on the host besides its idle warm sandboxes.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Footprint {
    warm_idle: usize,
    /// Processes under the server: sandbox helpers and what runs in them.
    processes: usize,
    run_cgroups: usize,
    staging_dirs: usize,
    outbox_dirs: usize,
    incoming_uploads: usize,
}

impl Footprint {
    fn measure(s: &Server) -> Footprint {
        let (_, _, health) = s.request("GET", "/v1/health", None, None);
        Footprint {
            warm_idle: health["warm_idle"].as_u64().unwrap_or(u64::MAX) as usize,
            processes: descendants(s.pid()).len(),
            run_cgroups: run_cgroups(&s.instance()),
            staging_dirs: dir_entries(&s.data_dir.join("runs")),
            outbox_dirs: dir_entries(&s.data_dir.join("outbox")),
            incoming_uploads: dir_entries(&s.data_dir.join("files/incoming")),
        }
    }

    /// A server with a full warm pool and nothing else: each warm sandbox is a helper,
    /// the sandbox's init and its waiting program, one staging directory and one cgroup
    /// per hierarchy. With `zygote` (the default), a principal's Python templates are
    /// started at its first run and stopped when idle (`zygote_template_idle_s`): an
    /// idle server holds none.
    fn idle(s: &Server) -> Footprint {
        // The harness's pool size, per language.
        let pool: usize = std::env::var("SANDCALL_TEST_WARM_POOL")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let instance = s.instance();
        let hierarchies = std::fs::read_dir("/sys/fs/cgroup")
            .unwrap()
            .flatten()
            .filter(|e| e.path().join(&instance).is_dir())
            .count();
        let sandboxes = 2 * pool;
        Footprint {
            warm_idle: sandboxes,
            processes: 3 * sandboxes,
            run_cgroups: sandboxes * hierarchies,
            staging_dirs: sandboxes,
            outbox_dirs: 0,
            incoming_uploads: 0,
        }
    }
}

/// Where run `id` would have left something: its cgroups, staging and outbox directories.
fn remains_of(s: &Server, id: &str) -> Vec<String> {
    let instance = s.instance();
    let mut left: Vec<String> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .map(|e| e.path().join(&instance).join(id))
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect();
    for dir in ["runs", "outbox"] {
        let path = s.data_dir.join(dir).join(id);
        if path.exists() {
            left.push(path.display().to_string());
        }
    }
    left
}

/// The server's descriptors. A node of a cluster keeps pools of idle TCP connections to
/// its peer, Redis and S3, as many as the load needed at once, until their idle timeouts:
/// not a leak, so its TCP sockets are not counted (the one-node soak counts every
/// descriptor, TCP ones included).
fn fds_of(s: &Server, clustered: bool) -> usize {
    let pid = s.pid();
    if !clustered {
        return fd_count(pid);
    }
    let mut tcp = std::collections::HashSet::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            if let Some(inode) = line.split_whitespace().nth(9) {
                tcp.insert(format!("socket:[{inode}]"));
            }
        }
    }
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .map(|target| !tcp.contains(&target.to_string_lossy().into_owned()))
                .unwrap_or(false)
        })
        .count()
}

fn rss_kib(pid: u32) -> u64 {
    crate::common::proc_status_kib(pid, "VmRSS").unwrap_or(0)
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

// ---------------------------------------------------------------------------
// Counting
// ---------------------------------------------------------------------------

/// What the clients saw.
#[derive(Default)]
struct Tally {
    requests: u64,
    statuses: BTreeMap<u16, u64>,
    /// `503 at_capacity` answers, each retried.
    at_capacity: u64,
    /// `429 principal_at_capacity` answers, each retried.
    principal_at_capacity: u64,
    /// Health checks of the watcher.
    health_samples: u64,
    runs: [u64; KINDS.len()],
    sessions: u64,
    /// Round trips of `/v1/exec` for the short Python and Bash programs.
    exec_latency: Vec<Duration>,
    /// How long after its expiry an abandoned session was first seen gone, at most.
    expiry_lateness: Duration,
    abandoned_expired: u64,
    failure_count: u64,
    failures: Vec<String>,
}

impl Tally {
    fn fail(&mut self, message: String) {
        self.failure_count += 1;
        if self.failures.len() < KEPT_FAILURES {
            self.failures.push(message);
        }
    }

    fn merge(&mut self, other: Tally) {
        self.requests += other.requests;
        for (status, n) in other.statuses {
            *self.statuses.entry(status).or_default() += n;
        }
        self.at_capacity += other.at_capacity;
        self.principal_at_capacity += other.principal_at_capacity;
        self.health_samples += other.health_samples;
        for (mine, theirs) in self.runs.iter_mut().zip(other.runs) {
            *mine += theirs;
        }
        self.sessions += other.sessions;
        self.exec_latency.extend(other.exec_latency);
        self.expiry_lateness = self.expiry_lateness.max(other.expiry_lateness);
        self.abandoned_expired += other.abandoned_expired;
        self.failure_count += other.failure_count;
        self.failures.extend(other.failures);
    }

    fn summary(
        &mut self,
        secs: u64,
        load_time: Duration,
        total: Duration,
        rss_kib: (u64, u64),
        fds: (usize, usize),
    ) -> String {
        self.exec_latency.sort_unstable();
        let percentile = |p: f64| {
            let n = self.exec_latency.len();
            if n == 0 {
                return 0.0;
            }
            let i = ((n - 1) as f64 * p).round() as usize;
            self.exec_latency[i].as_secs_f64() * 1000.0
        };
        let statuses: Vec<String> = self.statuses.iter().map(|(s, n)| format!("{s}: {n}")).collect();
        let runs: Vec<String> = KINDS
            .iter()
            .zip(self.runs)
            .map(|(kind, n)| format!("{kind:?} {n}"))
            .collect();
        format!(
            "soak: {secs} s of load ({:.1} s with the last runs, {:.1} s in all), {CLIENTS} clients; \
             {} requests ({}); 503 at_capacity retried: {}; 429 principal_at_capacity retried: {}; \
             health checks within the caps: {}; runs by kind: {}; programmatic sessions: {}; \
             exec of short programs: {} requests, p50 {:.1} ms, p99 {:.1} ms; \
             abandoned sessions expired: {}, of those seen paused past their expiry gone at most {} ms after it; \
             server RSS {} -> {} MiB, fds {} -> {}; failures: {}",
            load_time.as_secs_f64(),
            total.as_secs_f64(),
            self.requests,
            statuses.join(", "),
            self.at_capacity,
            self.principal_at_capacity,
            self.health_samples,
            runs.join(", "),
            self.sessions,
            self.exec_latency.len(),
            percentile(0.5),
            percentile(0.99),
            self.abandoned_expired,
            self.expiry_lateness.as_millis(),
            rss_kib.0 / 1024,
            rss_kib.1 / 1024,
            fds.0,
            fds.1,
            self.failure_count,
        )
    }
}

// ---------------------------------------------------------------------------
// One client
// ---------------------------------------------------------------------------

/// One HTTP answer.
struct Reply {
    status: u16,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&self.body).into_owned()))
    }
}

/// A JSON value cut short for a failure message.
fn shown(v: &Value) -> String {
    let text = v.to_string();
    if text.len() <= 1500 {
        return text;
    }
    let mut end = 1500;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &text[..end], text.len())
}

/// A session left paused, to be checked once it should have expired.
struct Abandoned {
    id: String,
    paused: Value,
    /// When the pause was seen; the server's expiry counts from a moment before.
    seen: Instant,
}

/// One of the concurrent clients: its own connection pool, counts and failures.
struct Client<'a> {
    /// The nodes, each request to the next in turn.
    nodes: &'a [Server],
    turn: usize,
    index: usize,
    agent: ureq::Agent,
    tally: Tally,
    abandoned: Vec<Abandoned>,
}

impl<'a> Client<'a> {
    fn new(nodes: &'a [Server], index: usize) -> Client<'a> {
        Client {
            nodes,
            turn: index,
            index,
            agent: ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build(),
            tally: Tally::default(),
            abandoned: Vec::new(),
        }
    }

    /// Runs iterations until `deadline`, then checks the sessions it abandoned.
    fn run_until(mut self, deadline: Instant) -> Tally {
        let mut iteration = 0u64;
        while Instant::now() < deadline {
            self.check_expired(false);
            // Clients start at different kinds, so every kind runs at every moment.
            let kind = KINDS[(self.index + iteration as usize) % KINDS.len()];
            let result = match kind {
                Kind::Python => self.python(iteration),
                Kind::Bash => self.bash(iteration),
                Kind::Resumed => self.resumed(iteration),
                Kind::ToolError => self.tool_error(iteration),
                Kind::Gather => self.gather(iteration),
                Kind::Cancelled => self.cancelled(iteration),
                Kind::Abandoned => self.abandon(iteration),
                Kind::Files => self.files(iteration),
                Kind::Hostile => self.hostile(iteration),
            };
            self.tally.runs[kind as usize] += 1;
            if let Err(e) = result {
                let message = format!("client {} iteration {iteration} ({kind:?}): {e}", self.index);
                self.tally.fail(message);
            }
            iteration += 1;
        }
        self.check_expired(true);
        self.tally
    }

    /// A number of its own for this client and iteration.
    fn unique(&self, iteration: u64, salt: u64) -> u64 {
        (self.index as u64 + 1) * 1_000_003 + iteration * 7_919 + salt
    }

    fn tag(&self, iteration: u64) -> String {
        format!("c{}i{iteration}", self.index)
    }

    // -- HTTP ---------------------------------------------------------------

    /// Sends one request. `503 at_capacity` and `429 principal_at_capacity` with
    /// `Retry-After` are backpressure: counted, and retried unchanged after a short sleep
    /// (the caller then checks the answer exactly, which shows the refusal changed nothing). Any other 5xx, or no answer, is an error.
    fn send(
        &mut self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&[u8]>,
    ) -> Result<Reply, String> {
        let give_up = Instant::now() + Duration::from_secs(120);
        loop {
            self.turn += 1;
            let node = &self.nodes[self.turn % self.nodes.len()];
            let mut req = self.agent.request(method, &node.url(path));
            if let Some(ct) = content_type {
                req = req.set("Content-Type", ct);
            }
            let result = match body {
                Some(b) => req.send_bytes(b),
                None => req.call(),
            };
            let resp = match result {
                Ok(r) | Err(ureq::Error::Status(_, r)) => r,
                Err(e) => return Err(format!("{method} {path}: no answer: {e}")),
            };
            let status = resp.status();
            let retry_after = resp.header("Retry-After").is_some();
            let mut bytes = Vec::new();
            resp.into_reader()
                .take(64 << 20)
                .read_to_end(&mut bytes)
                .map_err(|e| format!("{method} {path}: reading the body: {e}"))?;
            self.tally.requests += 1;
            *self.tally.statuses.entry(status).or_default() += 1;
            let reply = Reply { status, body: bytes };
            let refused = match (status, reply.json()["error_type"].as_str()) {
                (503, Some("at_capacity")) => Some(&mut self.tally.at_capacity),
                (429, Some("principal_at_capacity")) => Some(&mut self.tally.principal_at_capacity),
                _ => None,
            };
            if let (Some(count), true) = (refused, retry_after) {
                *count += 1;
                ensure!(Instant::now() < give_up, "{method} {path}: at capacity for two minutes");
                std::thread::sleep(Duration::from_millis(100 + 20 * (self.index as u64 % 8)));
                continue;
            }
            ensure!(
                status < 500,
                "{method} {path} answered {status}: {}",
                shown(&reply.json())
            );
            return Ok(reply);
        }
    }

    fn post(&mut self, path: &str, body: &Value) -> Result<(u16, Value), String> {
        let reply = self.send(
            "POST",
            path,
            Some("application/json"),
            Some(body.to_string().as_bytes()),
        )?;
        Ok((reply.status, reply.json()))
    }

    fn get(&mut self, path: &str) -> Result<(u16, Value), String> {
        let reply = self.send("GET", path, None, None)?;
        Ok((reply.status, reply.json()))
    }

    /// POST /v1/exec, which must answer 200.
    fn exec(&mut self, body: &Value) -> Result<Value, String> {
        let (status, v) = self.post("/v1/exec", body)?;
        ensure!(status == 200, "exec answered {status}: {}", shown(&v));
        Ok(v)
    }

    /// The first call of a session, which must answer 200.
    fn start(&mut self, body: &Value) -> Result<Value, String> {
        let (status, v) = self.post(ROUTE, body)?;
        ensure!(status == 200, "programmatic start answered {status}: {}", shown(&v));
        self.tally.sessions += 1;
        Ok(v)
    }

    /// Resumes `paused` with `results`; must answer 200.
    fn resume(&mut self, paused: &Value, results: Vec<Value>) -> Result<Value, String> {
        let (status, v) = self.resume_status(paused, results)?;
        ensure!(status == 200, "resume answered {status}: {}", shown(&v));
        Ok(v)
    }

    fn resume_status(&mut self, paused: &Value, results: Vec<Value>) -> Result<(u16, Value), String> {
        let body = json!({
            "session_id": paused["session_id"],
            "continuation_token": paused["continuation_token"],
            "tool_results": results,
        });
        self.post(ROUTE, &body)
    }

    fn state(&mut self, id: &str) -> Result<(u16, Value), String> {
        self.get(&format!("{ROUTE}/{id}"))
    }

    // -- The kinds of iteration ----------------------------------------------

    /// A short Python program whose output only this iteration can produce.
    fn python(&mut self, iteration: u64) -> Result<(), String> {
        let (a, b) = (self.unique(iteration, 11), self.unique(iteration, 977));
        let code = format!("a = {a}\nb = {b}\nprint(a * b, a ** 3)\n");
        let want = format!("{} {}\n", u128::from(a) * u128::from(b), u128::from(a).pow(3));
        self.short_run(&json!({"language": "python", "code": code}), &want)
    }

    /// Runs a short program, timed, which must succeed and print exactly `want`.
    fn short_run(&mut self, body: &Value, want: &str) -> Result<(), String> {
        let t = Instant::now();
        let r = self.exec(body)?;
        self.tally.exec_latency.push(t.elapsed());
        ensure!(
            r["status"] == "ok" && r["stdout"] == want && r["stderr"] == "" && r["exit_code"] == 0,
            "want stdout {want:?}: {}",
            shown(&r)
        );
        Ok(())
    }

    /// A short Bash program with arguments and standard input.
    fn bash(&mut self, iteration: u64) -> Result<(), String> {
        let (a, b) = (self.unique(iteration, 5), self.unique(iteration, 101));
        let tag = self.tag(iteration);
        let code = format!("read line\necho \"$(( {a} * {b} )) $line $1\"\n");
        let want = format!("{} in-{tag} arg-{tag}\n", a * b);
        let body =
            json!({"language": "bash", "code": code, "stdin": format!("in-{tag}\n"), "args": [format!("arg-{tag}")]});
        self.short_run(&body, &want)
    }

    /// Three tool calls in a row, each with an argument made of the previous result;
    /// Python and Bash in turn.
    fn resumed(&mut self, iteration: u64) -> Result<(), String> {
        let start_key = format!("start-{}", self.tag(iteration));
        let bash = (iteration / KINDS.len() as u64) % 2 == 1;
        let code = if !bash {
            format!("a = lookup(key=\"{start_key}\")\nb = lookup(key=a)\nc = lookup(key=b)\nprint(a, b, c)\n")
        } else {
            format!(
                "a=$(lookup key=\"{start_key}\")\nb=$(lookup key=\"$a\")\nc=$(lookup key=\"$b\")\necho \"$a $b $c\"\n"
            )
        };
        let language = if bash { "bash" } else { "python" };
        let secret = self.unique(iteration, 31);
        let body = json!({"language": language, "code": code, "tools": [tool("lookup", "key", "string")]});
        let mut r = self.start(&body)?;
        let mut key = start_key;
        let mut values = Vec::new();
        for round in 0..3 {
            let call = single_call(&r)?;
            ensure!(
                call["name"] == "lookup" && call["arguments"] == json!({"key": key}),
                "round {round}: want lookup({key:?}): {}",
                shown(&r)
            );
            let value = format!("{key}/{round}-{secret}");
            let result = json!({"call_id": call["id"], "result": value});
            r = self.resume(&r, vec![result])?;
            values.push(value.clone());
            key = value;
        }
        let want = format!("{}\n", values.join(" "));
        ensure!(
            r["status"] == "completed"
                && r["stdout"] == want.as_str()
                && r["exit_code"] == 0
                && r["tool_calls_made"] == 3,
            "{language}: want completed with stdout {want:?}: {}",
            shown(&r)
        );
        Ok(())
    }

    /// A tool that fails; the program catches the error and goes on.
    fn tool_error(&mut self, iteration: u64) -> Result<(), String> {
        let tag = self.tag(iteration);
        let code = format!(
            "try:\n    fetch(item=\"{tag}\")\n    print(\"no error\")\nexcept ToolError as e:\n    print(\"caught\", e)\nprint(\"after\")\n"
        );
        let r = self.start(&json!({"code": code, "tools": [tool("fetch", "item", "string")]}))?;
        let call = single_call(&r)?;
        ensure!(call["arguments"] == json!({"item": tag}), "{}", shown(&r));
        let message = format!("denied-{tag}-{}", self.unique(iteration, 3));
        let result = json!({"call_id": call["id"], "result": null, "is_error": true, "error_message": message});
        let r = self.resume(&r, vec![result])?;
        let want = format!("caught {message}\nafter\n");
        ensure!(
            r["status"] == "completed" && r["stdout"] == want.as_str() && r["exit_code"] == 0,
            "want stdout {want:?}: {}",
            shown(&r)
        );
        Ok(())
    }

    /// Three calls gathered into one pause, answered in another order.
    fn gather(&mut self, iteration: u64) -> Result<(), String> {
        let ns: Vec<u64> = (0..3).map(|k| self.unique(iteration, 1000 * k)).collect();
        let code = format!(
            "import asyncio\nres = await asyncio.gather(square(n={}), square(n={}), square(n={}))\nprint(res)\n",
            ns[0], ns[1], ns[2]
        );
        let r = self.start(&json!({"code": code, "tools": [tool("square", "n", "integer")]}))?;
        ensure!(r["status"] == "tool_call_required", "{}", shown(&r));
        let calls = r["tool_calls"].as_array().cloned().unwrap_or_default();
        ensure!(calls.len() == 3, "want 3 calls in one pause: {}", shown(&r));
        let answer = |n: u64| n * n + iteration;
        let mut results = Vec::new();
        for call in &calls {
            let n = call["arguments"]["n"].as_u64().unwrap_or(0);
            ensure!(
                call["name"] == "square" && ns.contains(&n),
                "unexpected call {call}: {}",
                shown(&r)
            );
            results.push(json!({"call_id": call["id"], "result": answer(n)}));
        }
        // Reversed, then rotated: never the order of the calls.
        results.reverse();
        results.rotate_left((iteration % 3) as usize);
        let r = self.resume(&r, results)?;
        let want = format!("[{}, {}, {}]\n", answer(ns[0]), answer(ns[1]), answer(ns[2]));
        ensure!(
            r["status"] == "completed" && r["stdout"] == want.as_str() && r["tool_calls_made"] == 3,
            "want stdout {want:?}: {}",
            shown(&r)
        );
        Ok(())
    }

    /// Starts a session that prints `{label}-{tag}`, then pauses on one call of `tool_name`
    /// (which never returns in time); checks the pause. Returns it and the printed line.
    fn start_paused(&mut self, tag: &str, label: &str, tool_name: &str, arg: &str) -> Result<(Value, String), String> {
        let code = format!("print(\"{label}-{tag}\", flush=True)\n{tool_name}({arg}=\"{tag}\")\nprint(\"never\")\n");
        let first = self.start(&json!({"code": code, "tools": [tool(tool_name, arg, "string")]}))?;
        single_call(&first)?;
        let printed = format!("{label}-{tag}\n");
        ensure!(first["partial_stdout"] == printed.as_str(), "{}", shown(&first));
        Ok((first, printed))
    }

    /// A paused session cancelled: the answer, then what GET, a resume and a second
    /// cancel say while the ended session is kept for reading.
    fn cancelled(&mut self, iteration: u64) -> Result<(), String> {
        let tag = self.tag(iteration);
        let (first, started) = self.start_paused(&tag, "started", "wait_here", "token")?;
        let id = session_id(&first)?;
        let (status, r) = self.post(&format!("{ROUTE}/cancel"), &json!({"session_id": id}))?;
        let ended = Instant::now();
        let is_cancelled =
            |v: &Value| v["status"] == "error" && v["error_type"] == "cancelled" && v["session_id"] == id.as_str();
        ensure!(
            status == 200 && is_cancelled(&r) && r["stdout"] == started.as_str(),
            "cancel answered {status}: {}",
            shown(&r)
        );
        let (status, st) = self.state(&id)?;
        let (resumed, v) = self.resume_status(
            &first,
            vec![json!({"call_id": first["tool_calls"][0]["id"], "result": 1})],
        )?;
        let (again, c) = self.post(&format!("{ROUTE}/cancel"), &json!({"session_id": id}))?;
        // The ended session is readable for the expiry time; past it, forgotten (404).
        if ended.elapsed() + Duration::from_secs(1) < SESSION_EXPIRY {
            ensure!(
                status == 200 && is_cancelled(&st),
                "GET after cancel answered {status}: {}",
                shown(&st)
            );
            // A resume of an ended session answers its ending.
            ensure!(
                resumed == 200 && is_cancelled(&v),
                "resume after cancel answered {resumed}: {}",
                shown(&v)
            );
            ensure!(
                again == 200 && is_cancelled(&c),
                "second cancel answered {again}: {}",
                shown(&c)
            );
        }
        Ok(())
    }

    /// A session left paused, never resumed; checked once it should have expired.
    fn abandon(&mut self, iteration: u64) -> Result<(), String> {
        let tag = self.tag(iteration);
        let (first, _) = self.start_paused(&tag, "parked", "park", "spot")?;
        let seen = Instant::now();
        let id = session_id(&first)?;
        // While paused, GET gives the same pause, so a client that lost it could resume.
        let (status, st) = self.state(&id)?;
        ensure!(
            status == 200
                && st["status"] == "tool_call_required"
                && st["continuation_token"] == first["continuation_token"],
            "GET of a paused session answered {status}: {}",
            shown(&st)
        );
        self.abandoned.push(Abandoned {
            id,
            paused: first,
            seen,
        });
        Ok(())
    }

    /// Checks the abandoned sessions whose expiry has passed (all of them when `all`,
    /// waiting as needed): forgotten (404 to GET and to a resume) and reclaimed.
    fn check_expired(&mut self, all: bool) {
        let pending = std::mem::take(&mut self.abandoned);
        for session in pending {
            let due = session.seen + SESSION_EXPIRY;
            if !all && Instant::now() < due {
                self.abandoned.push(session);
                continue;
            }
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if let Err(e) = self.expired(&session, due) {
                let message = format!("client {} abandoned session {}: {e}", self.index, session.id);
                self.tally.fail(message);
            }
        }
    }

    fn expired(&mut self, session: &Abandoned, due: Instant) -> Result<(), String> {
        // How late it went is known only if it was seen paused after it was due; a
        // client held up by retries may look only once it is long gone.
        let mut last_paused: Option<Instant> = None;
        let gone = loop {
            let (status, v) = self.state(&session.id)?;
            if status == 404 {
                ensure!(
                    v["error_type"] == "session_not_found",
                    "GET answered 404: {}",
                    shown(&v)
                );
                break Instant::now();
            }
            // Paused until the timer runs out, then gone at once.
            ensure!(
                status == 200 && v["status"] == "tool_call_required",
                "GET before it was gone answered {status}: {}",
                shown(&v)
            );
            ensure!(
                due.elapsed() < EXPIRY_GRACE,
                "still paused {EXPIRY_GRACE:?} after its expiry: {}",
                shown(&v)
            );
            last_paused = Some(Instant::now());
            std::thread::sleep(Duration::from_millis(100));
        };
        if last_paused.is_some_and(|t| t >= due) {
            self.tally.expiry_lateness = self.tally.expiry_lateness.max(gone.saturating_duration_since(due));
        }
        self.tally.abandoned_expired += 1;
        let call = &session.paused["tool_calls"][0]["id"];
        let (status, v) = self.resume_status(&session.paused, vec![json!({"call_id": call, "result": 1})])?;
        ensure!(
            status == 404 && v["error_type"] == "session_not_found",
            "resume after expiry answered {status}: {}",
            shown(&v)
        );
        let left = settle(
            || {
                self.nodes
                    .iter()
                    .flat_map(|s| remains_of(s, &session.id))
                    .collect::<Vec<_>>()
            },
            Vec::new(),
        );
        ensure!(left.is_empty(), "not reclaimed: {left:?}");
        Ok(())
    }

    /// Upload, a run that reads the file and writes another, download, compare.
    fn files(&mut self, iteration: u64) -> Result<(), String> {
        let tag = self.tag(iteration);
        let mut data = format!("{tag} {}\n", self.unique(iteration, 7)).repeat(50).into_bytes();
        data.extend(0..=255u8);
        let body = multipart(&[file_part("in.bin", "application/octet-stream", &data)]);
        let reply = self.send("POST", "/v1/upload", Some(&multipart_content_type()), Some(&body))?;
        let up = reply.json();
        ensure!(reply.status == 200, "upload answered {}: {}", reply.status, shown(&up));
        let input =
            json!({"id": up["files"][0]["id"], "storage_session_id": up["storage_session_id"], "name": "in.bin"});
        let code = format!(
            "data = open(\"in.bin\", \"rb\").read()\nopen(\"out.bin\", \"wb\").write(data[::-1] + b\"|{tag}\")\nprint(len(data))\n"
        );
        let r = self.exec(&json!({"code": code, "files": [input]}))?;
        let mut want: Vec<u8> = data.iter().rev().copied().collect();
        want.extend_from_slice(format!("|{tag}").as_bytes());
        // The input comes back too, inherited (unchanged): only new files count here.
        let outputs: Vec<Value> = r["files"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f["inherited"] != true)
            .collect();
        ensure!(
            r["status"] == "ok"
                && r["stdout"] == format!("{}\n", data.len()).as_str()
                && outputs.len() == 1
                && outputs[0]["name"] == "out.bin"
                && outputs[0]["size"] == want.len(),
            "want one output out.bin of {} bytes: {}",
            want.len(),
            shown(&r)
        );
        let (session, id) = (&outputs[0]["storage_session_id"], &outputs[0]["id"]);
        let path = format!(
            "/v1/download/{}/{}",
            session.as_str().unwrap_or(""),
            id.as_str().unwrap_or("")
        );
        let got = self.send("GET", &path, None, None)?;
        ensure!(
            got.status == 200 && got.body == want,
            "download answered {} with {} bytes, not the {} written",
            got.status,
            got.body.len(),
            want.len()
        );
        Ok(())
    }

    /// A hostile program, which must end with its documented status.
    fn hostile(&mut self, iteration: u64) -> Result<(), String> {
        let tag = self.tag(iteration);
        match (self.index as u64 + iteration / KINDS.len() as u64) % 4 {
            0 => {
                let r = self.exec(&json!({"language": "bash", "code": hostile("fork_bomb.sh"), "timeout": 1000}))?;
                ensure!(
                    r["status"] == "timed_out" && r["timed_out"] == true,
                    "fork bomb: {}",
                    shown(&r)
                );
            }
            1 => {
                let body =
                    json!({"code": hostile("memory_bomb.py"), "timeout": 30000, "limits": {"memory_limit_mb": 64}});
                let r = self.exec(&body)?;
                ensure!(
                    r["status"] == "killed" && r["oom_killed"] == true && r["signal"] == "SIGKILL",
                    "memory bomb: {}",
                    shown(&r)
                );
            }
            2 => {
                let r = self.exec(&json!({"code": hostile("cpu_spin.py"), "timeout": 300}))?;
                ensure!(
                    r["status"] == "timed_out" && r["timed_out"] == true && r["signal"] == "SIGKILL",
                    "cpu spin: {}",
                    shown(&r)
                );
            }
            _ => {
                // Far more output than is kept: the first max_output_bytes (64 KiB) come back.
                let line = format!("flood-{tag}\n");
                let code = format!("yes flood-{tag} | head -c 4000000");
                let r = self.exec(&json!({"language": "bash", "code": code}))?;
                let kept = 65536;
                let want: String = line.repeat(kept / line.len() + 1).chars().take(kept).collect();
                ensure!(
                    r["status"] == "ok" && r["stdout_truncated"] == true && r["stdout"] == want.as_str(),
                    "flood: want the first {kept} bytes, truncated: {}",
                    shown(&r)
                );
            }
        }
        Ok(())
    }
}

/// A tool taking one required parameter.
fn tool(name: &str, parameter: &str, kind: &str) -> Value {
    json!({
        "name": name,
        "parameters": {"type": "object", "properties": {parameter: {"type": kind}}, "required": [parameter]},
    })
}

/// The only call of a `tool_call_required` response.
fn single_call(r: &Value) -> Result<&Value, String> {
    ensure!(
        r["status"] == "tool_call_required" && r["tool_calls"].as_array().is_some_and(|c| c.len() == 1),
        "want a pause with one call: {}",
        shown(r)
    );
    Ok(&r["tool_calls"][0])
}

fn session_id(r: &Value) -> Result<String, String> {
    r["session_id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no session_id: {}", shown(r)))
}
