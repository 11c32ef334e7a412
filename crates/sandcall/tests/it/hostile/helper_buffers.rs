//! Work the host-side helper does for a run outside the run's cgroup: its buffers and
//! its CPU on refused calls are bounded.
//!
//! The helper (`sandcall sandbox-helper`, or forked by `sandcall helper-launcher`, a
//! child of the server either way) is found through /proc while the run goes on, and its VmHWM is compared with that of a helper whose
//! program does nothing.

use crate::common::{hostile, Server};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const ROUTE: &str = "/v1/exec/programmatic";
/// What a hostile program may make its helper hold beyond an idle one's peak. The
/// budgets allow about 12 MiB (four long lines of 2 MiB + 64 KiB, and 64 KiB on each
/// of 64 connections); the rest is room for the allocator.
const HELPER_GROWTH_BOUND: u64 = 24 << 20;

fn assert_helper_growth_bounded(peak: u64, idle: u64) {
    let growth = peak.saturating_sub(idle);
    assert!(
        growth < HELPER_GROWTH_BOUND,
        "the helper grew by {} MiB (peak {} MiB, idle {} MiB)",
        growth >> 20,
        peak >> 20,
        idle >> 20
    );
}

/// The server's children that are sandbox helpers (init, cloned from a helper, has the
/// same command line but is the helper's child).
fn helpers(server: u32) -> Vec<u32> {
    crate::common::parents()
        .into_iter()
        .filter(|&(_, ppid)| ppid == server)
        .map(|(pid, _)| pid)
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            (cmdline.contains("sandbox-helper") || cmdline.contains("helper-launcher"))
                && !crate::common::is_launcher(*pid)
        })
        .collect()
}

/// A field of /proc/<pid>/status in bytes (VmRSS, VmHWM).
fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    crate::common::proc_status_kib(pid, field).map(|kib| kib << 10)
}

/// CPU time (user and system) of a process so far, in ms.
fn cpu_ms(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(ticks * 1000 / hz)
}

/// What the helpers of a server were seen to use during a request.
struct Usage {
    /// The highest VmHWM of any helper. Idle helpers (a warm pool's) stay near their
    /// idle size, so this is the run's own.
    peak: u64,
    /// The most CPU time any helper used.
    cpu_ms: u64,
}

/// Runs `request` while sampling every helper of the server.
fn sampled<T: Send + 'static>(s: &Server, request: impl FnOnce() -> T + Send + 'static) -> (T, Usage) {
    let worker = std::thread::spawn(request);
    let mut usage = Usage { peak: 0, cpu_ms: 0 };
    while !worker.is_finished() {
        for pid in helpers(s.pid()) {
            usage.peak = usage.peak.max(status_bytes(pid, "VmHWM").unwrap_or(0));
            usage.cpu_ms = usage.cpu_ms.max(cpu_ms(pid).unwrap_or(0));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (worker.join().unwrap(), usage)
}

fn post(s: &Server, path: &str, body: Value) -> impl FnOnce() -> (u16, Value) + Send + 'static {
    let url = s.url(path);
    move || {
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build();
        match agent.post(&url).send_json(body) {
            Ok(r) => (r.status(), r.into_json().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap_or(Value::Null)),
            Err(e) => panic!("POST {path}: {e}", path = url),
        }
    }
}

fn echo_tool() -> Value {
    json!({"name": "echo", "parameters": {"type": "object"}})
}

/// 64 tool connections with 2 MiB each and no newline, held open until the timeout.
#[test]
fn tool_connections_without_newlines_are_bounded() {
    let s = Server::start();
    let idle_code = "import time\ntime.sleep(1)\n";
    let ((status, r), Usage { peak: idle, .. }) =
        sampled(&s, post(&s, ROUTE, json!({"code": idle_code, "tools": [echo_tool()]})));
    assert_eq!((status, &r["status"]), (200, &json!("completed")), "{r}");

    let t = Instant::now();
    let body = json!({"code": hostile("tool_flood.py"), "args": ["3"], "tools": [echo_tool()], "timeout": 5000});
    let ((status, r), Usage { peak, cpu_ms }) = sampled(&s, post(&s, ROUTE, body));
    let elapsed = t.elapsed();
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["status"], "error", "{r}");
    let growth = peak.saturating_sub(idle);
    eprintln!(
        "tool flood: helper peak {peak} B, idle {idle} B, growth {growth} B, CPU {cpu_ms} ms, {elapsed:?}, stdout {}",
        r["stdout"]
    );
    assert_helper_growth_bounded(peak, idle);
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
    s.assert_healthy();
}

/// The helper caps its own data size (a soft RLIMIT_DATA) as a backstop; the program
/// does not inherit it: its memory is the cgroup's business.
#[test]
fn the_helper_has_a_memory_limit_and_the_program_does_not() {
    let s = Server::start();
    let code = "import resource, time\nprint(resource.getrlimit(resource.RLIMIT_DATA))\ntime.sleep(1)\n";
    let worker = std::thread::spawn(post(&s, ROUTE, json!({"code": code, "tools": [echo_tool()]})));
    let mut soft = None;
    while !worker.is_finished() {
        for pid in helpers(s.pid()) {
            let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap_or_default();
            if let Some(line) = limits.lines().find(|l| l.starts_with("Max data size")) {
                soft = line
                    .split_whitespace()
                    .nth(3)
                    .and_then(|v| v.parse::<u64>().ok())
                    .or(soft);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, r) = worker.join().unwrap();
    assert_eq!((status, &r["status"]), (200, &json!("completed")), "{r}");
    assert_eq!(r["stdout"], "(-1, -1)\n", "{r}");
    // In the gvisor tier the helper is a process of gVisor's kernel, which the host's
    // /proc does not show; the program's side is checked above all the same.
    if crate::common::gvisor_pass() {
        assert_eq!(soft, None, "a helper seen on the host in the gvisor tier");
        return;
    }
    let soft = soft.expect("the helper's data size is limited");
    assert!(soft < 1 << 30, "{soft}");
}

/// 63 MiB on a warm Python run's status channel (fd 3), without a newline.
#[test]
fn a_flooded_status_channel_is_bounded() {
    let s = Server::start_with(&[("SANDCALL_WARM_POOL_SIZE", "1")], "");
    let ((status, r), Usage { peak: idle, .. }) = sampled(
        &s,
        post(&s, "/v1/exec", json!({"code": "import time\ntime.sleep(1)\n"})),
    );
    assert_eq!((status, &r["status"]), (200, &json!("ok")), "{r}");
    s.wait_warm(2);

    let t = Instant::now();
    let body = json!({"code": hostile("status_flood.py"), "timeout": 10000});
    let ((status, r), Usage { peak, cpu_ms }) = sampled(&s, post(&s, "/v1/exec", body));
    let elapsed = t.elapsed();
    let growth = peak.saturating_sub(idle);
    eprintln!(
        "status flood: helper peak {peak} B, idle {idle} B, growth {growth} B, CPU {cpu_ms} ms, {elapsed:?}, stdout {}",
        r["stdout"]
    );
    assert_eq!(status, 200, "{r}");
    // Unbounded, the helper also looked for a newline in all it held at every read
    // (seconds of CPU outside the run's cgroup), and the writer stalled behind it.
    assert!(cpu_ms < 2000, "the helper spent {cpu_ms} ms of CPU");
    assert!(
        r["stdout"].as_str().unwrap_or("").contains("written"),
        "the flood did not end within the run's timeout: {r}"
    );
    assert_helper_growth_bounded(peak, idle);
    assert!(elapsed < Duration::from_secs(20), "took {elapsed:?}");
    s.assert_healthy();
}

/// 20,000 calls of an undeclared tool: refusals come at most as fast as the bucket
/// allows (its capacity is max_tool_calls + 64, refilled at 32 per second).
#[test]
fn refused_calls_are_rate_limited() {
    let s = Server::start();
    let body = json!({"code": hostile("refusal_spam.py"), "tools": [echo_tool()], "timeout": 20000});
    let (status, r) = post(&s, ROUTE, body)();
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["status"], "completed", "{r}");
    let v: Value = serde_json::from_str(r["stdout"].as_str().unwrap().trim()).unwrap_or_else(|e| panic!("{e}: {r}"));
    let refused = v["refused"].as_f64().unwrap();
    let elapsed = v["elapsed"].as_f64().unwrap();
    let allowed = (100 + 64) as f64 + 32.0 * elapsed;
    eprintln!("refusal spam: {refused} refusals in {elapsed:.2} s (allowed {allowed:.0})");
    assert!(refused > 0.0, "no refusal at all: {r}");
    assert!(refused <= allowed + 8.0, "{refused} refusals in {elapsed:.2} s: {r}");
    s.assert_healthy();
}

/// Answers every call of a session with `answer(arguments)` until it ends; returns the
/// last response and the number of calls of each pause.
fn drive(s: &Server, body: Value, answer: impl Fn(&Value) -> Value) -> (Value, Vec<usize>) {
    // Read as a stream: a pause with 5 MiB of arguments is over what s.post reads.
    let (status, mut r) = post(s, ROUTE, body)();
    assert_eq!(status, 200, "{r}");
    let mut pauses = Vec::new();
    while r["status"] == "tool_call_required" {
        let calls = r["tool_calls"].as_array().unwrap();
        pauses.push(calls.len());
        assert!(pauses.len() < 50, "runaway session: {r}");
        let results: Vec<Value> = calls
            .iter()
            .map(|c| json!({"call_id": c["id"], "result": answer(&c["arguments"]), "is_error": false}))
            .collect();
        let resume = json!({"session_id": r["session_id"], "continuation_token": r["continuation_token"], "tool_results": results});
        let (status, next) = post(s, ROUTE, resume)();
        assert_eq!(status, 200, "{next}");
        r = next;
    }
    (r, pauses)
}

/// Within the bounds: the Python runner's one connection with ten gathered calls of
/// 512 KiB each, all handed out in one pause.
#[test]
fn ten_gathered_calls_of_512_kib_still_work() {
    // The pause carries 5 MiB of arguments, over the default max_pause_bytes.
    let s = Server::start_with(&[], "max_pause_bytes = 8388608\n");
    let code = [
        "import asyncio",
        "async def main():",
        "    rs = await asyncio.gather(*[echo(i=i, data='x' * (512 << 10)) for i in range(10)])",
        "    print(sorted(rs))",
        "asyncio.run(main())",
    ]
    .join("\n");
    let (r, pauses) = drive(&s, json!({"code": code, "tools": [echo_tool()]}), |args| {
        json!(args["data"].as_str().unwrap().len() + args["i"].as_u64().unwrap() as usize)
    });
    assert_eq!(r["status"], "completed", "{r}");
    let want: Vec<usize> = (0..10).map(|i| (512 << 10) + i).collect();
    assert_eq!(r["stdout"], format!("{want:?}\n"), "{r}");
    assert_eq!(pauses, vec![10], "{r}");
}

/// Within the bounds: twenty Bash tool commands in the background, each on its own
/// connection with a 100 KiB argument.
#[test]
fn twenty_concurrent_bash_tool_calls_still_work() {
    let s = Server::start();
    let code = "big=$(head -c 102400 /dev/zero | tr '\\0' x)\n\
for i in $(seq 1 20); do echo_b i=$i d=$big > /tmp/out$i & done\n\
wait\n\
cat /tmp/out* | sort -n | tr '\\n' ' '\n";
    let tool = json!({"name": "echo_b", "parameters": {"type": "object",
        "properties": {"i": {"type": "integer"}, "d": {"type": "string"}}}});
    let (r, pauses) = drive(&s, json!({"language": "bash", "code": code, "tools": [tool]}), |args| {
        assert_eq!(args["d"].as_str().unwrap().len(), 102400);
        json!(args["i"])
    });
    assert_eq!(r["status"], "completed", "{r}");
    let want: Vec<String> = (1..=20).map(|i| i.to_string()).collect();
    assert_eq!(r["stdout"], format!("{} ", want.join(" ")), "{r}");
    assert_eq!(pauses.iter().sum::<usize>(), 20, "{pauses:?}");
}
