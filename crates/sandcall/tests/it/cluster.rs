//! Many nodes over one real Redis (`session_store = "redis://..."`): sessions created on
//! one node are seen by the other, a resume that lands on a node that does not hold the
//! session live is forwarded to its owner while the owner lives, and taken over by replay
//! once the owner is dead (SIGKILL) and its lease has run out; a token is accepted once
//! across nodes; a Redis that goes down answers 503 and loses nothing.
//!
//! The nodes share nothing but Redis (each has its own data dir and file store), so the
//! programs here use no input files. Redis is `SANDCALL_TEST_REDIS_URL` (`.ci/run` starts
//! one); the test of a Redis restart starts its own `redis-server`.

use crate::common::Server;
use serde_json::{json, Value};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROUTE: &str = "/v1/exec/programmatic";
/// Every node of a cluster signs tokens with the same key.
pub(crate) const SECRET: &str = "5ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7";
/// Short leases, so that a dead node's sessions are taken over within the test.
const LEASE_MS: &str = "1500";

pub(crate) fn redis_url() -> String {
    std::env::var("SANDCALL_TEST_REDIS_URL").expect(
        "SANDCALL_TEST_REDIS_URL is not set: the cluster tests need a real Redis (`.ci/run` starts one; locally: \
         redis-server --port 6390 --daemonize yes, then SANDCALL_TEST_REDIS_URL=redis://127.0.0.1:6390/0)",
    )
}

/// Most nodes (and servers of the test's own, `reserved_port`) one test process starts
/// (nextest runs each test in a process of its own; a plain `cargo test` runs them all
/// in one).
const MAX_NODES: usize = 24;

/// The `node_url`s of every node this process may start, chosen before the first starts:
/// each node must list them all in `peer_urls`, the only URLs it forwards to.
///
/// A node binds its port only when it starts (and again when a test restarts it), so
/// the ports are taken below the kernel's ephemeral range, where no other test's
/// `127.0.0.1:0` can land meanwhile: a block of `MAX_NODES` chosen by the process id
/// (test processes running at once have different ones), the next free block if it is
/// not free.
pub(crate) fn cluster_urls() -> &'static [String] {
    static URLS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    URLS.get_or_init(|| {
        let ephemeral_low: usize = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse().ok())
            .unwrap_or(32768);
        let low = 10_000;
        let blocks = ephemeral_low.saturating_sub(low) / MAX_NODES;
        assert!(
            blocks > 0,
            "no ports below the ephemeral range ({ephemeral_low}) for the cluster tests"
        );
        let first = std::process::id() as usize % blocks;
        for block in (0..blocks).map(|b| (first + b) % blocks) {
            let start = low + block * MAX_NODES;
            // Held open together while checked, so that no two are the same port.
            let held: Result<Vec<_>, _> = (start..start + MAX_NODES)
                .map(|port| std::net::TcpListener::bind(("127.0.0.1", port as u16)))
                .collect();
            if let Ok(listeners) = held {
                return listeners
                    .iter()
                    .map(|l| format!("http://{}", l.local_addr().unwrap()))
                    .collect();
            }
        }
        panic!("no free block of {MAX_NODES} ports below {ephemeral_low} for the cluster tests");
    })
}

/// The next of `cluster_urls`.
pub(crate) fn next_node_url() -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let i = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    cluster_urls()
        .get(i)
        .unwrap_or_else(|| panic!("more than {MAX_NODES} nodes in one test process"))
        .clone()
}

/// A port of `cluster_urls`' block for a server that is not a node (a Redis of the
/// test's own, which it restarts), safe from other tests' `127.0.0.1:0` for the same
/// reason as the nodes' ports.
fn reserved_port() -> u16 {
    let url = next_node_url();
    let port = url.rsplit(':').next().and_then(|p| p.parse().ok());
    port.unwrap_or_else(|| panic!("no port in {url}"))
}

/// A node of the cluster on Redis `redis`, with extra environment.
fn node(redis: &str, extra: &[(&str, &str)]) -> Server {
    node_with_config(redis, extra, "")
}

/// The same, with a configuration file's text; `extra` may override the defaults.
pub(crate) fn node_with_config(redis: &str, extra: &[(&str, &str)], config: &str) -> Server {
    let node_url = next_node_url();
    let listen = node_url.trim_start_matches("http://").to_owned();
    node_at(redis, extra, config, &node_url, &listen)
}

/// Waits (up to 15 s) until `node` holds no session in memory: its sessions were evicted
/// to the store.
fn wait_until_evicted(node: &Server) {
    let t = Instant::now();
    loop {
        let (_, _, health) = node.request("GET", "/v1/health", None, None);
        if health["sessions"].as_u64() == Some(0) {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(15), "not evicted: {health}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A node known to the others as `node_url` and listening on `listen` (the same place,
/// unless something stands between them).
pub(crate) fn node_at(redis: &str, extra: &[(&str, &str)], config: &str, node_url: &str, listen: &str) -> Server {
    let peers = cluster_urls().join(",");
    let mut env = vec![
        ("SANDCALL_SESSION_STORE", redis),
        ("SANDCALL_NODE_URL", node_url),
        ("SANDCALL_PEER_URLS", peers.as_str()),
        ("SANDCALL_TOKEN_SECRET", SECRET),
        ("SANDCALL_NODE_LEASE_MS", LEASE_MS),
        // These tests check which node answered.
        ("SANDCALL_NODE_HEADER", "true"),
        ("SANDCALL_WARM_POOL_SIZE", "0"),
    ];
    env.extend_from_slice(extra);
    Server::launch_at(Server::new_dir(), &env, config, None, listen)
}

fn get_tool() -> Value {
    json!({
        "name": "get",
        "description": "gets",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    })
}

/// One call, then its result printed: `start <k>`, `got <k> <result>`.
fn program(k: usize) -> String {
    format!("print('start {k}')\nr = get(n={k})\nprint('got {k}', r)\n")
}

/// A request with the answer's status, the headers this test looks at, and its body.
struct Answer {
    status: u16,
    node: String,
    resume: String,
    body: Value,
}

fn send(s: &Server, method: &str, path: &str, body: Option<&Value>) -> Answer {
    send_with(s, method, path, body, &[])
}

fn send_with(s: &Server, method: &str, path: &str, body: Option<&Value>, extra: &[(&str, &str)]) -> Answer {
    let mut headers = vec![("Content-Type", "application/json")];
    headers.extend_from_slice(extra);
    let body = body.map(Value::to_string);
    let read = ["sandcall-node", "sandcall-resume"];
    let (status, found, body) = s.request_reading_each(method, path, &headers, body.as_deref(), &read);
    let [node, resume] = [0, 1].map(|i| found[i].clone().unwrap_or_default());
    Answer {
        status,
        node,
        resume,
        body,
    }
}

fn start(s: &Server, k: usize) -> Value {
    let a = send(
        s,
        "POST",
        ROUTE,
        Some(&json!({"language": "python", "code": program(k), "tools": [get_tool()]})),
    );
    assert_eq!(a.status, 200, "start: {}", a.body);
    assert_eq!(a.body["status"], "tool_call_required", "{}", a.body);
    assert_eq!(a.body["partial_stdout"], format!("start {k}\n"), "{}", a.body);
    assert_eq!(a.node, s.base, "the node that started it answers");
    a.body
}

fn resume(s: &Server, paused: &Value, result: Value) -> Answer {
    let call = &paused["tool_calls"][0];
    send(
        s,
        "POST",
        ROUTE,
        Some(&json!({
            "session_id": paused["session_id"],
            "continuation_token": paused["continuation_token"],
            "tool_results": [{"call_id": call["id"], "result": result, "is_error": false}],
        })),
    )
}

fn completed(a: &Answer, k: usize, result: &str) {
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["status"], "completed", "{}", a.body);
    assert_eq!(a.body["stdout"], format!("start {k}\ngot {k} {result}\n"), "{}", a.body);
}

fn kill_hard(mut s: Server) {
    let mut child = s.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn twenty_sessions_paused_on_a_node_killed_with_sigkill_complete_through_another() {
    let redis = redis_url();
    let a = node(&redis, &[]);
    let b = node(&redis, &[]);
    let paused: Vec<Value> = (0..20).map(|k| start(&a, k)).collect();
    // While A lives, B sees them (forwarded to A: GET reads the live pause).
    let seen = send(
        &b,
        "GET",
        &format!("{ROUTE}/{}", paused[0]["session_id"].as_str().unwrap()),
        None,
    );
    assert_eq!(seen.status, 200, "{}", seen.body);
    assert_eq!(seen.body["continuation_token"], paused[0]["continuation_token"]);
    assert_eq!(seen.node, a.base, "A answered it");
    kill_hard(a);
    // Each completes through B: once A's lease runs out, B takes it over by replay.
    let started = Instant::now();
    for (k, p) in paused.iter().enumerate() {
        let answer = resume(&b, p, json!(k * 10));
        completed(&answer, k, &(k * 10).to_string());
        assert_eq!(answer.node, b.base);
        assert_eq!(answer.resume, "replay", "B had no live process of it");
        assert_eq!(answer.body["tool_calls_made"], 1);
    }
    assert!(started.elapsed() < Duration::from_secs(120));
    // Each token is used now, on every node.
    let again = resume(&b, &paused[3], json!("other"));
    assert!(
        again.status == 409 || again.body["status"] == "completed",
        "{} {}",
        again.status,
        again.body
    );
}

#[test]
fn a_resume_sent_to_another_node_is_forwarded_to_the_live_owner() {
    let redis = redis_url();
    let a = node(&redis, &[]);
    let b = node(&redis, &[]);
    // Two pauses, to see the token of a forwarded answer work again through B.
    let code = "print('one')\nx = get(n=1)\nprint('two', x)\ny = get(n=2)\nprint('three', y)\n";
    let first = send(
        &a,
        "POST",
        ROUTE,
        Some(&json!({"language": "python", "code": code, "tools": [get_tool()]})),
    );
    assert_eq!(first.body["status"], "tool_call_required", "{}", first.body);
    // Paused longer than the lease: A renews it while it holds the session live, so
    // B still forwards rather than taking it over.
    std::thread::sleep(Duration::from_millis(3 * LEASE_MS.parse::<u64>().unwrap()));
    let second = resume(&b, &first.body, json!("x"));
    assert_eq!(second.status, 200, "{}", second.body);
    assert_eq!(second.body["status"], "tool_call_required", "{}", second.body);
    assert_eq!(second.body["partial_stdout"], "two x\n", "{}", second.body);
    assert_eq!(second.node, a.base, "A, which holds it live, answered");
    assert_eq!(second.resume, "live", "the live program went on: no replay");
    let end = resume(&b, &second.body, json!("y"));
    assert_eq!(end.body["status"], "completed", "{}", end.body);
    assert_eq!(end.body["stdout"], "one\ntwo x\nthree y\n", "{}", end.body);
    assert_eq!(end.node, a.base);
    assert_eq!(end.resume, "live");

    // Cancel through B reaches A's live session too.
    let other = start(&a, 7);
    let cancelled = send(
        &b,
        "POST",
        &format!("{ROUTE}/cancel"),
        Some(&json!({"session_id": other["session_id"]})),
    );
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    assert_eq!(cancelled.body["error_type"], "cancelled", "{}", cancelled.body);
    assert_eq!(cancelled.node, a.base);

    // Another principal's session is 404 through either node; so is one that never was.
    let missing = send(&b, "GET", &format!("{ROUTE}/no-such-session"), None);
    assert_eq!(missing.status, 404, "{}", missing.body);
    assert_eq!(missing.body["error_type"], "session_not_found");
}

/// Two threads send `paused`'s token at once, to `x` and `y`, with different results:
/// exactly one is accepted (completed), the other is 409.
fn one_of_two(x: &Server, y: &Server, paused: &Value, k: usize) {
    let (first, second) = std::thread::scope(|scope| {
        let one = scope.spawn(|| resume(x, paused, json!("from-x")));
        let two = scope.spawn(|| resume(y, paused, json!("from-y")));
        (one.join().unwrap(), two.join().unwrap())
    });
    let accepted: Vec<&Answer> = [&first, &second]
        .into_iter()
        .filter(|a| a.status == 200 && a.body["status"] == "completed")
        .collect();
    assert_eq!(
        accepted.len(),
        1,
        "exactly one is accepted: {} {} / {} {}",
        first.status,
        first.body,
        second.status,
        second.body
    );
    let refused = if accepted[0].body["stdout"].as_str().unwrap().contains("from-x") {
        &second
    } else {
        &first
    };
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert_eq!(
        refused.body["error_type"], "continuation_token_used",
        "{}",
        refused.body
    );
    let won = accepted[0].body["stdout"].as_str().unwrap();
    assert!(
        won == format!("start {k}\ngot {k} from-x\n") || won == format!("start {k}\ngot {k} from-y\n"),
        "{won}"
    );
}

#[test]
fn one_token_sent_to_both_nodes_at_once_is_accepted_by_exactly_one() {
    let redis = redis_url();
    // Evicted after a second idle: the dormant sessions have no owner, and both nodes
    // race to take them over through Redis.
    let evict = [("SANDCALL_SESSION_IDLE_EVICT_S", "1")];
    let a = node(&redis, &evict);
    let b = node(&redis, &evict);
    for k in 0..3 {
        // Live on A: B forwards, A's lock decides.
        let live = start(&a, k);
        one_of_two(&a, &b, &live, k);
    }
    let dormant: Vec<Value> = (10..13).map(|k| start(&a, k)).collect();
    std::thread::sleep(Duration::from_millis(2500));
    for (i, p) in dormant.iter().enumerate() {
        one_of_two(&a, &b, p, 10 + i);
    }
}

/// A `redis-server` of the test's own, on a free port, persisting to `dir` (each write
/// fsynced), so that a restart keeps everything.
struct OwnRedis {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl OwnRedis {
    fn start(dir: &std::path::Path, port: u16) -> OwnRedis {
        std::fs::create_dir_all(dir).unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "yes", "--appendfsync", "always", "--dir"])
            .arg(dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (`.ci/run` installs Debian's redis-server)");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        OwnRedis {
            child,
            port,
            dir: dir.to_owned(),
        }
    }

    /// SIGTERM, as a restart does; waits for it to exit.
    fn stop(&mut self) {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn redis_restarted_mid_run_answers_503_while_down_and_loses_nothing() {
    let port = reserved_port();
    let dir = std::env::temp_dir().join(format!("sandcall-it-redis-{}-{port}", std::process::id()));
    let mut redis = OwnRedis::start(&dir, port);
    let url = format!("redis://127.0.0.1:{port}/0");
    let a = node(&url, &[]);
    let b = node(&url, &[]);
    let paused: Vec<Value> = (0..3).map(|k| start(&a, k)).collect();
    // Two gathered calls, answered one at a time.
    let gathered = send(
        &a,
        "POST",
        ROUTE,
        Some(&json!({
            "language": "python",
            "code": "rs = await asyncio.gather(get(n=1), get(n=2))\nprint(rs)\n",
            "tools": [get_tool()],
        })),
    )
    .body;
    assert_eq!(gathered["tool_calls"].as_array().unwrap().len(), 2, "{gathered}");
    let answer_one = |s: &Server, i: usize, value: &str| {
        send(
            s,
            "POST",
            ROUTE,
            Some(&json!({
                "session_id": gathered["session_id"],
                "continuation_token": gathered["continuation_token"],
                "tool_results": [{"call_id": gathered["tool_calls"][i]["id"], "result": value, "is_error": false}],
            })),
        )
    };

    redis.stop();
    // While Redis is down: a new session is refused, a resume is refused with its token
    // still good, a node that must ask Redis where a session lives says so: all 503.
    let refused = send(
        &a,
        "POST",
        ROUTE,
        Some(&json!({"language": "python", "code": program(9), "tools": [get_tool()]})),
    );
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.body["error_type"], "store_unavailable", "{}", refused.body);
    let not_now = resume(&a, &paused[0], json!("early"));
    assert_eq!(not_now.status, 503, "{}", not_now.body);
    assert_eq!(not_now.body["error_type"], "store_unavailable", "{}", not_now.body);
    let half = answer_one(&a, 0, "one");
    assert_eq!(half.status, 503, "{}", half.body);
    let elsewhere = resume(&b, &paused[1], json!("early"));
    assert_eq!(elsewhere.status, 503, "{}", elsewhere.body);
    assert_eq!(elsewhere.body["error_type"], "store_unavailable", "{}", elsewhere.body);
    // The live pause still answers on its node.
    let live = send(
        &a,
        "GET",
        &format!("{ROUTE}/{}", paused[2]["session_id"].as_str().unwrap()),
        None,
    );
    assert_eq!(live.status, 200, "{}", live.body);
    assert_eq!(live.body["status"], "tool_call_required", "{}", live.body);

    let mut redis = OwnRedis::start(&dir, redis.port);
    // Everything is back: each session completes with the result sent now, through
    // either node, and a token used once stays used.
    let started = Instant::now();
    let mut first = resume(&a, &paused[0], json!("late"));
    while first.status == 503 && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(200));
        first = resume(&a, &paused[0], json!("late"));
    }
    completed(&first, 0, "late");
    assert_eq!(first.resume, "live");
    completed(&resume(&b, &paused[1], json!("late")), 1, "late");
    completed(&resume(&a, &paused[2], json!("late")), 2, "late");
    // The refused half-answer left nothing behind: answering the other call first still
    // leaves the first one outstanding, under its id.
    let rest = answer_one(&a, 1, "two");
    assert_eq!(rest.status, 200, "{}", rest.body);
    assert_eq!(rest.body["status"], "tool_call_required", "{}", rest.body);
    assert_eq!(rest.body["tool_calls"].as_array().unwrap().len(), 1, "{}", rest.body);
    assert_eq!(rest.body["tool_calls"][0]["id"], gathered["tool_calls"][0]["id"]);
    let call = &rest.body["tool_calls"][0];
    let end = send(
        &b,
        "POST",
        ROUTE,
        Some(&json!({
            "session_id": gathered["session_id"],
            "continuation_token": rest.body["continuation_token"],
            "tool_results": [{"call_id": call["id"], "result": "one", "is_error": false}],
        })),
    );
    assert_eq!(end.body["status"], "completed", "{}", end.body);
    assert_eq!(end.body["stdout"], "['one', 'two']\n", "{}", end.body);
    let used = resume(&b, &paused[0], json!("again"));
    assert_eq!(used.status, 409, "{}", used.body);
    // New sessions work again.
    let fresh = start(&b, 5);
    completed(&resume(&a, &fresh, json!(1)), 5, "1");
    redis.stop();
}

#[test]
fn a_session_running_on_a_node_that_dies_is_run_again_elsewhere_and_its_resume_answered_when_retried() {
    let redis = redis_url();
    let a = node(&redis, &[]);
    let b = node(&redis, &[]);
    let code =
        "import time\nprint('s')\nr = get(n=1)\ntime.sleep(3)\nprint('after', r)\nr2 = get(n=2)\nprint('end', r2)\n";
    let first = send(
        &a,
        "POST",
        ROUTE,
        Some(&json!({"language": "python", "code": code, "tools": [get_tool()]})),
    );
    assert_eq!(first.body["status"], "tool_call_required", "{}", first.body);
    let paused = first.body;
    // The resume is accepted on A (journalled), and A dies while the program runs on.
    let lost = {
        let url = a.url(ROUTE);
        let body = json!({
            "session_id": paused["session_id"],
            "continuation_token": paused["continuation_token"],
            "tool_results": [{"call_id": paused["tool_calls"][0]["id"], "result": "r1", "is_error": false}],
        });
        std::thread::spawn(move || {
            let _ = ureq::post(&url)
                .set("Content-Type", "application/json")
                .send_string(&body.to_string());
        })
    };
    std::thread::sleep(Duration::from_millis(1000));
    kill_hard(a);
    lost.join().unwrap();
    // Its retry through B: B takes the session over once A's lease has run out, runs it
    // again from the journal to its next pause, and answers the retry with it.
    let retried = resume(&b, &paused, json!("r1"));
    assert_eq!(retried.status, 200, "{}", retried.body);
    assert_eq!(retried.body["status"], "tool_call_required", "{}", retried.body);
    assert_eq!(
        retried.body["partial_stdout"], "after r1\n",
        "no line twice: {}",
        retried.body
    );
    assert_eq!(retried.node, b.base);
    let end = resume(&b, &retried.body, json!("r2"));
    assert_eq!(end.body["status"], "completed", "{}", end.body);
    assert_eq!(end.body["stdout"], "s\nafter r1\nend r2\n", "{}", end.body);
}

#[test]
fn a_node_stopped_with_sigterm_gives_its_sessions_up_at_once() {
    let redis = redis_url();
    // Long leases: a session taken over only once its lease ran out would take 20 s.
    let long = [("SANDCALL_NODE_LEASE_MS", "20000")];
    let mut a = node(&redis, &long);
    let b = node(&redis, &long);
    let paused: Vec<Value> = (0..3).map(|k| start(&a, k)).collect();
    a.stop();
    let started = Instant::now();
    for (k, p) in paused.iter().enumerate() {
        let answer = resume(&b, p, json!("now"));
        completed(&answer, k, "now");
        assert_eq!(answer.resume, "replay");
    }
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "B took the sessions over without waiting for A's leases: {:?}",
        started.elapsed()
    );
}

#[test]
fn a_node_whose_session_was_taken_over_elsewhere_lets_it_go() {
    let redis = redis_url();
    let a = node(&redis, &[]);
    let b = node(&redis, &[]);
    let paused = start(&a, 4);
    // As after a Redis outage longer than a lease: B holds the session's lease now.
    let id = paused["session_id"].as_str().unwrap();
    let set = Command::new("redis-cli")
        .args([
            "-u",
            &redis,
            "SET",
            &format!("sandcall:s:{{{id}}}:owner"),
            &b.base,
            "PX",
            "60000",
        ])
        .output()
        .expect("redis-cli (installed with redis-server)");
    assert!(set.status.success(), "{set:?}");
    // A's next renewal finds it and drops its copy: the resume sent to A goes to B, which
    // brings the session back from the journal.
    std::thread::sleep(Duration::from_millis(2 * LEASE_MS.parse::<u64>().unwrap() / 3));
    let answer = resume(&a, &paused, json!("b"));
    completed(&answer, 4, "b");
    assert_eq!(answer.node, b.base, "B, which holds the lease, answered");
    assert_eq!(answer.resume, "replay");
}

/// POST with a request id.
fn send_named(s: &Server, path: &str, body: &Value, request_id: &str) -> Answer {
    send_with(
        s,
        "POST",
        path,
        Some(body),
        &[("X-LibreChat-Code-Request-ID", request_id)],
    )
}

#[test]
fn cancel_by_request_id_reaches_a_session_from_any_node_live_or_evicted() {
    let redis = redis_url();
    let a = node(&redis, &[("SANDCALL_SESSION_IDLE_EVICT_S", "2")]);
    let b = node(&redis, &[]);
    let body = |k: usize| json!({"language": "python", "code": program(k), "tools": [get_tool()]});
    let tag = format!("{}", std::process::id());
    let (live_id, dormant_id) = (format!("live-{tag}"), format!("dormant-{tag}"));
    let live = send_named(&a, ROUTE, &body(1), &live_id);
    assert_eq!(live.status, 200, "{}", live.body);
    // Held live by A: a cancel by its request id sent to B reaches it there.
    let cancel = format!("{ROUTE}/cancel");
    let v = send_named(&b, &cancel, &json!({"request_id": live_id}), "any");
    assert_eq!(v.status, 200, "{}", v.body);
    assert_eq!(v.body["error_type"], "cancelled", "{}", v.body);
    assert_eq!(v.body["session_id"], live.body["session_id"]);
    assert_eq!(v.node, a.base, "the owner answered");

    // Evicted on A: kept by Redis alone; B cancels it by its request id, and finds its
    // pause and its calls in the store meanwhile.
    let evicted = send_named(&a, ROUTE, &body(2), &dormant_id);
    assert_eq!(evicted.status, 200, "{}", evicted.body);
    let id = evicted.body["session_id"].as_str().unwrap().to_owned();
    wait_until_evicted(&a);
    let got = send(&b, "GET", &format!("{ROUTE}/{id}"), None);
    assert_eq!(got.status, 200, "{}", got.body);
    assert_eq!(got.body, evicted.body);
    let calls = send(&b, "GET", &format!("{ROUTE}/{id}/calls"), None);
    assert_eq!(calls.status, 200, "{}", calls.body);
    assert_eq!(calls.body["calls"].as_array().map(Vec::len), Some(1), "{}", calls.body);
    let v = send_named(&b, &cancel, &json!({"request_id": dormant_id}), "any");
    assert_eq!(v.status, 200, "{}", v.body);
    assert_eq!(v.body["error_type"], "cancelled", "{}", v.body);
    assert_eq!(v.body["session_id"], json!(id));
    let again = send_named(&a, &cancel, &json!({"request_id": dormant_id}), "any");
    assert_eq!(again.status, 404, "{}", again.body);
    let resumed = resume(&a, &evicted.body, json!(1));
    assert!(resumed.status == 404 || resumed.status == 409, "{}", resumed.body);
}

/// Egress in a cluster (docs/egress.md): each node serves its own runs' proxy, a session
/// granted network is resumed through any node (forwarded to the node that holds it live),
/// and one whose node died is not replayed elsewhere. The upstream is a real server of
/// this process on 127.0.0.2, which every node's configuration names explicitly.
mod egress {
    use super::*;
    use crate::egress::{egress_config, Upstream, GREETING};
    use crate::egress_programmatic::{fetching_program, paths};

    /// Two nodes over `redis` whose runs may reach `host` (every principal).
    fn nodes(redis: &str, host: &str) -> (Server, Server) {
        let config = egress_config(std::slice::from_ref(&host.to_owned()), "\"127.0.0.2/32\"", "");
        (
            node_with_config(redis, &[], &config),
            node_with_config(redis, &[], &config),
        )
    }

    /// The sum of `/metrics`' samples of `name` with `label`.
    fn metric(s: &Server, name: &str, label: &str) -> u64 {
        let (status, _, text) = s.request("GET", "/metrics", None, None);
        assert_eq!(status, 200, "{text}");
        let text = text.as_str().unwrap_or_default().to_owned();
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    fn start_fetching(s: &Server, host: &str) -> Value {
        let a = send(
            s,
            "POST",
            ROUTE,
            Some(&json!({
                "language": "python", "code": fetching_program(host), "tools": [get_tool()],
                "network": {}, "timeout": 60000,
            })),
        );
        assert_eq!(a.status, 200, "start: {}", a.body);
        assert_eq!(a.body["status"], "tool_call_required", "{}", a.body);
        assert_eq!(a.body["partial_stdout"], format!("before {GREETING}\n"), "{}", a.body);
        assert_eq!(a.node, s.base, "the node that started it answers");
        a.body
    }

    fn connections(s: &Server, paused: &Value) -> Answer {
        let id = paused["session_id"].as_str().unwrap();
        let a = send(s, "GET", &format!("{ROUTE}/{id}/calls"), None);
        assert_eq!(a.status, 200, "{}", a.body);
        a
    }

    #[test]
    fn exec_with_network_reaches_an_allowed_host_and_is_refused_others_on_either_node() {
        let up = Upstream::http();
        let host = format!("127.0.0.2:{}", up.port);
        let (a, b) = nodes(&redis_url(), &host);
        for (name, s, other) in [("a", &a, &b), ("b", &b, &a)] {
            let code = format!(
                "import urllib.request\nprint(urllib.request.urlopen('http://{host}/{name}', timeout=20).read().decode())\n\
                 try:\n    urllib.request.urlopen('http://evil.example.org/x', timeout=20)\n    print('reached')\n\
                 except Exception as e:\n    print('refused', getattr(e, 'code', e))\n"
            );
            let before = metric(other, "sandcall_egress_connections_total", "relayed");
            let r = s.exec(json!({"language": "python", "code": code, "network": {}, "timeout": 60000}));
            assert_eq!(r["stdout"], format!("{GREETING}\nrefused 403\n"), "{name}: {r}");
            assert_eq!(r["network"]["connections"], 2, "{name}: {r}");
            assert_eq!(r["network"]["refused"], 1, "{name}: {r}");
            // This node's own proxy served it: its metrics count the connection, the
            // other node's do not move.
            assert!(metric(s, "sandcall_egress_connections_total", "relayed") >= 1, "{name}");
            assert_eq!(
                metric(other, "sandcall_egress_connections_total", "relayed"),
                before,
                "{name}"
            );
            // Its socket went with its run.
            let left: Vec<_> = std::fs::read_dir(s.data_dir.join("egress")).unwrap().collect();
            assert!(left.is_empty(), "{name}: {left:?}");
        }
        let seen: Vec<String> = paths(&up);
        assert_eq!(seen, ["/a", "/b"], "the refused host reached nothing");
    }

    #[test]
    fn a_session_with_network_resumed_through_another_node_goes_on_at_its_owner() {
        let up = Upstream::http();
        let host = format!("127.0.0.2:{}", up.port);
        let (a, b) = nodes(&redis_url(), &host);
        let paused = start_fetching(&a, &host);
        // While it waits, B lists the connection made before the pause.
        let trail = connections(&b, &paused);
        assert_eq!(
            trail.body["connections"].as_array().map(Vec::len),
            Some(1),
            "{}",
            trail.body
        );
        assert_eq!(trail.body["connections"][0]["outcome"], "relayed", "{}", trail.body);
        let done = resume(&b, &paused, json!(42));
        assert_eq!(done.status, 200, "{}", done.body);
        assert_eq!(done.body["status"], "completed", "{}", done.body);
        assert_eq!(
            done.body["stdout"],
            format!("before {GREETING}\nafter {GREETING} 42\n"),
            "{}",
            done.body
        );
        assert_eq!(done.node, a.base, "A, which holds it live, answered");
        assert_eq!(done.resume, "live");
        assert_eq!(done.body["network"]["connections"], 2, "{}", done.body);
        // The request after the resume reached the upstream, once.
        assert_eq!(paths(&up), ["/a", "/b"]);
        // Through B, the trail lists both connections with their bytes.
        let trail = connections(&b, &paused);
        let listed = trail.body["connections"].as_array().unwrap();
        assert_eq!(listed.len(), 2, "{}", trail.body);
        for c in listed {
            assert_eq!(c["outcome"], "relayed", "{}", trail.body);
            assert_eq!(c["host"], "127.0.0.2", "{}", trail.body);
            assert!(
                c["bytes_in"].as_u64().unwrap() > GREETING.len() as u64,
                "{}",
                trail.body
            );
        }
        assert_eq!(trail.body["calls"][0]["name"], "get", "{}", trail.body);
    }

    #[test]
    fn a_session_with_network_whose_node_is_killed_ends_with_an_error_on_another_not_a_replay() {
        let up = Upstream::http();
        let host = format!("127.0.0.2:{}", up.port);
        let (a, b) = nodes(&redis_url(), &host);
        let paused = start_fetching(&a, &host);
        assert_eq!(paths(&up), ["/a"]);
        kill_hard(a);
        // B takes it over once A's lease has run out, and ends it: a replay would make
        // its first request again.
        let started = Instant::now();
        let ended = resume(&b, &paused, json!(42));
        assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
        assert_eq!(ended.status, 200, "{}", ended.body);
        assert_eq!(ended.body["status"], "error", "{}", ended.body);
        assert_eq!(ended.body["error_type"], "sandbox_failure", "{}", ended.body);
        let message = ended.body["error"].as_str().unwrap_or_default();
        assert!(message.contains("granted network"), "{}", ended.body);
        assert_eq!(ended.node, b.base);
        assert_eq!(paths(&up), ["/a"], "nothing was requested again");
        // It is over on every node.
        let again = resume(&b, &paused, json!(42));
        assert!(
            again.status == 404 || again.status == 409 || again.body["status"] == "error",
            "{} {}",
            again.status,
            again.body
        );
        assert_eq!(paths(&up), ["/a"]);
    }

    #[test]
    fn an_evicted_session_with_network_keeps_its_connections_in_the_trail_on_every_node() {
        let up = Upstream::http();
        let host = format!("127.0.0.2:{}", up.port);
        let config = egress_config(std::slice::from_ref(&host), "\"127.0.0.2/32\"", "");
        let redis = redis_url();
        let a = node_with_config(&redis, &[("SANDCALL_SESSION_IDLE_EVICT_S", "1")], &config);
        let b = node_with_config(&redis, &[], &config);
        let paused = start_fetching(&a, &host);
        // Evicted on A: the store alone keeps it, and its trail.
        wait_until_evicted(&a);
        for s in [&b, &a] {
            let trail = connections(s, &paused);
            assert_eq!(trail.body["calls"].as_array().map(Vec::len), Some(1), "{}", trail.body);
            let listed = trail.body["connections"].as_array().cloned().unwrap_or_default();
            assert_eq!(listed.len(), 1, "the connection made before the pause: {}", trail.body);
            assert_eq!(listed[0]["host"], "127.0.0.2", "{}", trail.body);
            assert_eq!(listed[0]["outcome"], "relayed", "{}", trail.body);
            assert!(listed[0]["bytes_in"].as_u64().unwrap() > 0, "{}", trail.body);
        }
        // Its resume through B ends it without a replay.
        let ended = resume(&b, &paused, json!(42));
        assert_eq!(ended.body["status"], "error", "{}", ended.body);
        assert!(
            ended.body["error"]
                .as_str()
                .unwrap_or_default()
                .contains("granted network"),
            "{}",
            ended.body
        );
        assert_eq!(paths(&up), ["/a"]);
        let id = paused["session_id"].as_str().unwrap();
        // Ended and forgotten, as a session that cannot be brought back is (the log
        // keeps its connections).
        let after = send(&b, "GET", &format!("{ROUTE}/{id}/calls"), None);
        assert_eq!(after.status, 404, "{}", after.body);
    }
}
