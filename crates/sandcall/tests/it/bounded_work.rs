//! Bounded work: for each route, the largest request the default limits allow costs the
//! server at most `MAX_GROWTH_MIB` of memory (its peak RSS over the request, measured
//! from `/proc/<pid>/status` after resetting the peak) and never keeps `GET /v1/health`
//! waiting longer than `MAX_HEALTH_MS`. docs/threat-model.md states both bounds.
//!
//! **Run this test alone**, like the soak: it measures the server's memory and health
//! latency, which another test beside it would skew. CI runs it in the soak's step.

use crate::common::Server;
use crate::files::{file_part, multipart, multipart_content_type, Client, Reply};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The most a request may add to the server's peak RSS, in MiB. The largest measured is
/// the programmatic start with a full pause, 43 to 77 MiB (its tool calls are parsed and
/// checked on blocking threads, and where glibc's per-thread arenas put them moves the
/// peak), then the resume with three results of 5 MiB, about 50 MiB (the body, the
/// results as text, and their replies on their way to the helper); everything else is
/// under 6 MiB.
const MAX_GROWTH_MIB: u64 = 96;
/// The longest `GET /v1/health` may take while a request is under way. The debug-built
/// server answers within about 105 ms while it takes in the largest programmatic start
/// and resume (megabytes of JSON parsed and checked, on a 2-core machine whose other
/// core runs this test's own JSON work).
const MAX_HEALTH_MS: u128 = 200;
const ROUTE: &str = "/v1/exec/programmatic";
/// The default limits these requests are the largest for.
const MAX_CODE_BYTES: usize = 1 << 20;
const MAX_STDIN_BYTES: usize = 1 << 20;
const MAX_FILE_BYTES: usize = 25 << 20;

fn status_kib(pid: u32, field: &str) -> u64 {
    crate::common::proc_status_kib(pid, field).unwrap_or_else(|| panic!("no {field} for {pid}"))
}

/// What one request cost: the growth of the server's peak RSS, and the slowest health
/// check while it ran.
struct Cost {
    growth_kib: u64,
    slowest_health: Duration,
    health_checks: usize,
}

/// Runs `f` while measuring the server: its peak RSS is reset first (clear_refs 5), and
/// a client checks health every 10 ms on a kept-alive connection, from before `f` starts
/// until after it ends.
fn measure<T>(s: &Server, f: impl FnOnce() -> T) -> (T, Cost) {
    let pid = s.pid();
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the server's peak RSS");
    let before = status_kib(pid, "VmRSS");
    let stop = Arc::new(AtomicBool::new(false));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let monitor = {
        let (stop, latencies, url) = (stop.clone(), latencies.clone(), s.url("/v1/health"));
        std::thread::spawn(move || {
            let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(30)).build();
            while !stop.load(Ordering::SeqCst) {
                let t = Instant::now();
                let ok = agent.get(&url).call().is_ok_and(|r| r.status() == 200);
                assert!(ok, "health did not answer 200 during the request");
                latencies.lock().unwrap().push(t.elapsed());
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    // One check before the request and one after it, however short it is.
    let checks = || latencies.lock().unwrap().len();
    while checks() == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let out = f();
    let during = checks();
    while checks() == during {
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::SeqCst);
    monitor.join().unwrap();
    let peak = status_kib(pid, "VmHWM");
    let latencies = latencies.lock().unwrap();
    let cost = Cost {
        growth_kib: peak.saturating_sub(before),
        slowest_health: latencies.iter().copied().max().unwrap_or_default(),
        health_checks: latencies.len(),
    };
    (out, cost)
}

fn check(label: &str, cost: &Cost, failures: &mut Vec<String>) {
    eprintln!(
        "bounded work: {label}: peak RSS +{:.1} MiB, slowest of {} health checks {:.1} ms",
        cost.growth_kib as f64 / 1024.0,
        cost.health_checks,
        cost.slowest_health.as_secs_f64() * 1000.0
    );
    if cost.growth_kib > MAX_GROWTH_MIB << 10 {
        failures.push(format!(
            "{label}: the server's peak RSS grew by {} KiB, over {MAX_GROWTH_MIB} MiB",
            cost.growth_kib
        ));
    }
    if cost.slowest_health.as_millis() > MAX_HEALTH_MS {
        failures.push(format!(
            "{label}: health took {:?}, over {MAX_HEALTH_MS} ms",
            cost.slowest_health
        ));
    }
    if cost.health_checks < 2 {
        failures.push(format!(
            "{label}: too short to measure health ({} checks)",
            cost.health_checks
        ));
    }
}

/// Python source of exactly `size` bytes: `body`, then a comment that pads it.
fn padded(body: &str, size: usize) -> String {
    let mut code = format!("{body}\n#");
    code.push_str(&"x".repeat(size - code.len() - 1));
    code.push('\n');
    assert_eq!(code.len(), size);
    code
}

/// A tool schema of about `bytes` bytes: many string properties.
fn big_schema(bytes: usize) -> Value {
    let mut properties = serde_json::Map::new();
    let mut i = 0;
    while serde_json::to_vec(&properties).unwrap().len() < bytes {
        properties.insert(format!("field_{i}"), json!({"type": "string", "maxLength": 100}));
        i += 1;
    }
    json!({"type": "object", "properties": properties})
}

fn ok(reply: &Reply) -> Value {
    assert_eq!(reply.status, 200, "{reply}");
    reply.json()
}

#[test]
fn the_largest_request_of_each_route_costs_a_bounded_amount() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let mut failures = Vec::new();
    warm_every_route(&c);
    exec_the_largest_run(&s, &c, &mut failures);
    let uploaded = upload_twenty_files_at_the_cap(&s, &c, &mut failures);
    let session = uploaded["storage_session_id"].as_str().unwrap().to_owned();
    let file = uploaded["files"][0]["id"].as_str().unwrap().to_owned();
    download_list_and_describe(&s, &c, &session, &file, &mut failures);
    batch_upload_and_list_in_full(&s, &c, &mut failures);
    let tools = tools_filling_the_body();
    let paused = start_a_full_pause(&s, &c, &tools, &mut failures);
    get_the_paused_session(&s, &c, &paused, &mut failures);
    resume_with_the_largest_results(&s, &c, &paused, &mut failures);
    cancel_a_full_pause(&s, &c, &tools, &mut failures);
    delete_the_large_files_and_get_the_documents(&s, &c, &uploaded, &session, &mut failures);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What ended sessions keep of their audit trails is held to `max_ended_session_bytes`:
/// sessions run one after another, each filling its trail to its 2 MiB budget with
/// refusals whose reasons are cut at 1 KiB. The trails of the first ones are let go and
/// say so; the server's memory stops growing with the number of sessions.
#[test]
fn ended_sessions_hold_a_bounded_amount() {
    const CAP: u64 = 4 << 20;
    /// Refusals per session: over the 2 MiB a trail may hold (each record weighs about
    /// 1.3 KiB), so each trail is full.
    const CALLS: u64 = 1700;
    const SESSIONS: usize = 12;
    /// What the server's RSS may grow by from the third session's end to the last's.
    /// Kept whole, the nine more trails would be 18 MiB and more.
    const MAX_GROWTH_MIB: u64 = 8;
    let s = Server::start_with(
        &[],
        &format!("max_tool_calls = {CALLS}\nmax_ended_session_bytes = {CAP}\n"),
    );
    let c = Client::anonymous(&s);
    let tool = json!({"name": "count", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}});
    let mut sessions = Vec::new();
    let mut rss_after_warm = 0;
    for i in 0..SESSIONS {
        let body = json!({"code": crate::common::hostile("refusal_bloat.py"), "args": ["fill", CALLS.to_string()],
            "tools": [tool], "max_tool_calls": CALLS, "timeout": 120000});
        let r = ok(&c.post_json(ROUTE, &body));
        assert_eq!(r["status"], "completed", "{}", shown(&r));
        let out: Value =
            serde_json::from_str(r["stdout"].as_str().unwrap().trim()).unwrap_or_else(|e| panic!("{e}: {r}"));
        assert_eq!(out["refused"], CALLS, "{out}");
        sessions.push(r["session_id"].as_str().unwrap().to_owned());
        let trail = ok(&c.get(&format!("{ROUTE}/{}/calls", sessions[i])));
        let listed = trail["calls"].as_array().unwrap().len() as u64;
        assert!(listed > 1000 && listed < CALLS, "{listed} records in a full trail");
        assert_eq!(listed + trail["calls_dropped"].as_u64().unwrap(), CALLS);
        if i == 2 {
            rss_after_warm = status_kib(s.pid(), "VmRSS");
        }
    }
    let rss_end = status_kib(s.pid(), "VmRSS");
    let scrape = crate::metrics::scrape(&c);
    let held = crate::metrics::value(&scrape, "sandcall_ended_session_trail_bytes", &[]) as u64;
    eprintln!(
        "bounded work: {SESSIONS} ended sessions hold {} KiB of trails; RSS {} -> {} MiB",
        held >> 10,
        rss_after_warm >> 10,
        rss_end >> 10
    );
    assert!(held <= CAP && held > CAP / 4, "ended trails hold {held} bytes");
    // The first sessions' trails were let go, and say so; the last one's is whole.
    for id in &sessions[..SESSIONS - 2] {
        let trail = ok(&c.get(&format!("{ROUTE}/{id}/calls")));
        assert_eq!(trail["trail_released"], true, "{}", shown(&trail));
        assert_eq!(trail["calls"], json!([]));
        assert_eq!(trail["calls_dropped"], CALLS);
    }
    let last = ok(&c.get(&format!("{ROUTE}/{}/calls", sessions[SESSIONS - 1])));
    assert!(last.get("trail_released").is_none(), "{}", shown(&last));
    assert!(!last["calls"].as_array().unwrap().is_empty());
    // Their endings are still there to GET.
    assert_eq!(ok(&c.get(&format!("{ROUTE}/{}", sessions[0])))["status"], "completed");
    let growth = rss_end.saturating_sub(rss_after_warm);
    assert!(
        growth < MAX_GROWTH_MIB << 10,
        "the server grew by {} MiB over {} more ended sessions",
        growth >> 10,
        SESSIONS - 3
    );
}

/// Every route once, small, so that first-use allocations are not counted by the
/// measured requests.
fn warm_every_route(c: &Client) {
    ok(&c.post_json("/v1/exec", &json!({"code": "print(1)"})));
    let up = c.upload("warm.txt", "text/plain", b"warm");
    ok(&c.download(&up.session_id, &up.id));
    let p = ok(&c.post_json(
        ROUTE,
        &json!({"code": "print(t())", "tools": [{"name": "t", "parameters": {"type": "object"}}]}),
    ));
    ok(&c.get(&format!("{ROUTE}/{}", p["session_id"].as_str().unwrap())));
    ok(&c.post_json(
        ROUTE,
        &json!({"continuation_token": p["continuation_token"], "tool_results": [{"call_id": p["tool_calls"][0]["id"], "result": 1}]}),
    ));
}

/// POST /v1/exec: the largest code and stdin; the program floods both streams and
/// leaves as many large (sparse) output files as collection takes.
fn exec_the_largest_run(s: &Server, c: &Client, failures: &mut Vec<String>) {
    let program = "import sys\n\
        data = sys.stdin.read()\n\
        sys.stdout.write('o' * (4 << 20)); sys.stderr.write('e' * (4 << 20))\n\
        for i in range(100):\n    open(f'out{i}.bin', 'wb').truncate((25 << 20) - 1)\n\
        print(len(data))";
    let body = json!({"code": padded(program, MAX_CODE_BYTES - 64), "stdin": "s".repeat(MAX_STDIN_BYTES)});
    let (reply, cost) = measure(s, || c.post_json("/v1/exec", &body));
    let run = ok(&reply);
    assert_eq!(run["stdout_truncated"], true, "{}", &run["stderr"]);
    check(
        "POST /v1/exec (1 MiB code, 1 MiB stdin, floods, 100 large outputs)",
        &cost,
        failures,
    );
}

/// POST /v1/upload: 20 parts at max_file_bytes (the body may hold 100, but 500 MiB is
/// enough to show that parts are streamed to disk, not held). Returns the answer.
fn upload_twenty_files_at_the_cap(s: &Server, c: &Client, failures: &mut Vec<String>) -> Value {
    let data = vec![b'u'; MAX_FILE_BYTES];
    let names: Vec<String> = (0..20).map(|i| format!("big{i}.bin")).collect();
    let parts: Vec<_> = names
        .iter()
        .map(|n| file_part(n, "application/octet-stream", &data))
        .collect();
    let body = multipart(&parts);
    let (reply, cost) = measure(s, || {
        c.send("POST", "/v1/upload", Some(&multipart_content_type()), Some(&body))
    });
    let uploaded = ok(&reply);
    drop(body);
    check("POST /v1/upload (20 × 25 MiB)", &cost, failures);
    uploaded
}

/// GET /v1/download of the largest file, four at once; then listing and metadata.
fn download_list_and_describe(s: &Server, c: &Client, session: &str, file: &str, failures: &mut Vec<String>) {
    let (replies, cost) = measure(s, || {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4).map(|_| scope.spawn(|| c.download(session, file))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        })
    });
    assert!(replies
        .iter()
        .all(|r| r.status == 200 && r.body.len() == MAX_FILE_BYTES));
    drop(replies);
    check("GET /v1/download (25 MiB, 4 at once)", &cost, failures);
    let (_, cost) = measure(s, || {
        for _ in 0..20 {
            ok(&c.get(&format!("/v1/files/{session}")));
            ok(&c.object(session, file));
        }
    });
    check("GET /v1/files and /v1/sessions/../objects (20 files)", &cost, failures);
}

/// POST /v1/upload/batch: 200 parts (the most) of 1 MiB under long nested names, whose
/// files are all held until the body is read; then the fullest listing of them, and
/// their deletion.
fn batch_upload_and_list_in_full(s: &Server, c: &Client, failures: &mut Vec<String>) {
    let mib = vec![b'b'; 1 << 20];
    let names: Vec<String> = (0..200).map(|i| format!("{}f{i}.bin", "d/".repeat(100))).collect();
    let parts: Vec<_> = names
        .iter()
        .map(|n| file_part(n, "application/octet-stream", &mib))
        .collect();
    let body = multipart(&parts);
    let (reply, cost) = measure(s, || {
        c.send("POST", "/v1/upload/batch", Some(&multipart_content_type()), Some(&body))
    });
    let batch = ok(&reply);
    drop(body);
    assert_eq!(batch["succeeded"], 200, "{}", shown(&batch));
    check("POST /v1/upload/batch (200 × 1 MiB, long names)", &cost, failures);
    let batch_session = batch["storage_session_id"].as_str().unwrap().to_owned();
    let (_, cost) = measure(s, || {
        for _ in 0..5 {
            ok(&c.get(&format!("/v1/files/{batch_session}?detail=full")));
        }
    });
    check("GET /v1/files?detail=full (200 files)", &cost, failures);
    for f in batch["files"].as_array().unwrap() {
        assert_eq!(c.delete_file(&batch_session, f["fileId"].as_str().unwrap()).status, 200);
    }
}

/// 100 tools whose schemas fill the programmatic route's body, 1 MiB of code less that
/// room.
fn tools_filling_the_body() -> Vec<Value> {
    let mut tools = vec![json!({"name": "sink", "parameters": {"type": "object"}})];
    tools.extend((1..100).map(|i| json!({"name": format!("tool_{i}"), "parameters": big_schema(18 << 10)})));
    tools
}

/// POST /v1/exec/programmatic with `tools`; the program hands out as much as one pause
/// may hold, in the shape that costs the most to hold in memory (arrays of small
/// numbers). Returns the pause.
fn start_a_full_pause(s: &Server, c: &Client, tools: &[Value], failures: &mut Vec<String>) -> Value {
    let body = body_of_full_pause(tools);
    let (reply, cost) = measure(s, || c.post_json(ROUTE, &body));
    let paused = ok(&reply);
    assert_eq!(paused["status"], "tool_call_required", "{}", shown(&paused));
    assert_eq!(paused["tool_calls"].as_array().unwrap().len(), 4, "{}", shown(&paused));
    check("POST /v1/exec/programmatic (100 tools, a full pause)", &cost, failures);
    drop(reply);
    paused
}

/// GET of the paused session, eight at once.
fn get_the_paused_session(s: &Server, c: &Client, paused: &Value, failures: &mut Vec<String>) {
    let id = paused["session_id"].as_str().unwrap().to_owned();
    let (replies, cost) = measure(s, || {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| c.get(&format!("{ROUTE}/{id}"))))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        })
    });
    assert!(replies.iter().all(|r| r.status == 200));
    drop(replies);
    check(
        "GET /v1/exec/programmatic/{id} (a full pause, 8 at once)",
        &cost,
        failures,
    );
}

/// The resume: results filling the route's body (3 × max_tool_result_bytes + 1 MiB):
/// three of about 5 MiB each, and a small one.
fn resume_with_the_largest_results(s: &Server, c: &Client, paused: &Value, failures: &mut Vec<String>) {
    let results: Vec<Value> = paused["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, call)| json!({"call_id": call["id"], "result": vec![0; if i < 3 { 2_600_000 } else { 1 }]}))
        .collect();
    let body = json!({"continuation_token": paused["continuation_token"], "tool_results": results});
    let (reply, cost) = measure(s, || c.post_json(ROUTE, &body));
    let done = ok(&reply);
    assert_eq!(done["stdout"], "7800001\n", "{}", shown(&done));
    check("POST /v1/exec/programmatic resume (15 MiB of results)", &cost, failures);
}

/// POST /v1/exec/programmatic/cancel of a session paused on a full pause.
fn cancel_a_full_pause(s: &Server, c: &Client, tools: &[Value], failures: &mut Vec<String>) {
    let paused = ok(&c.post_json(ROUTE, &body_of_full_pause(tools)));
    assert_eq!(paused["status"], "tool_call_required", "{}", shown(&paused));
    let cancel = json!({"session_id": paused["session_id"]});
    let (reply, cost) = measure(s, || c.post_json(&format!("{ROUTE}/cancel"), &cancel));
    assert_eq!(ok(&reply)["error_type"], "cancelled");
    check("POST /v1/exec/programmatic/cancel (a full pause)", &cost, failures);
}

/// DELETE of the twenty large files of `uploaded`; the documents and a bare health check.
fn delete_the_large_files_and_get_the_documents(
    s: &Server,
    c: &Client,
    uploaded: &Value,
    session: &str,
    failures: &mut Vec<String>,
) {
    let ids: Vec<String> = uploaded["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_owned())
        .collect();
    let (_, cost) = measure(s, || {
        for id in &ids {
            assert_eq!(c.delete_file(session, id).status, 200);
        }
        ok(&c.get("/openapi.json"));
        ok(&c.get("/v1/health"));
    });
    check(
        "DELETE /v1/files (20 × 25 MiB), GET /openapi.json, GET /v1/health",
        &cost,
        failures,
    );
}

/// The first call of a session with `tools`, 1 MiB of code less the room they take,
/// whose program hands out as much as one pause may hold (4 calls of 1 MB) in the shape
/// that costs the most to hold in memory (arrays of small numbers).
fn body_of_full_pause(tools: &[Value]) -> Value {
    let program = "import asyncio\n\
        r = await asyncio.gather(*[sink(xs=[0] * 520000) for _ in range(4)])\n\
        print(sum(len(x) for x in r))";
    let body = json!({"code": padded(program, MAX_CODE_BYTES - 64), "tools": tools});
    assert!(body.to_string().len() < MAX_CODE_BYTES + MAX_STDIN_BYTES + (1 << 20));
    body
}

fn shown(v: &Value) -> String {
    v.to_string().chars().take(1500).collect()
}

/// The most four `upload_file` calls of ~24 MiB at once, over `/mcp`, may add to the
/// server's peak RSS, in MiB. A body announced larger than the JSON limit
/// (`max_body_bytes`) is spooled to disk from its first byte and decoded from there
/// through 64 KiB buffers, so each upload holds a few hundred KiB (hyper's, the
/// spooler's and the decoder's buffers, a blocking thread's stack); measured, the four
/// grow it by about 7 MiB. (One that arrives without a length is held up to the JSON
/// limit, 3 MiB by default, before it goes to disk.) Held in memory (body, parsed
/// message, arguments, decoded bytes), one such upload grew the server by ~35 MiB and
/// four at once by ~166 MiB.
const MAX_MCP_UPLOADS_GROWTH_MIB: u64 = 16;

/// Standard base64 (the tests have no crate for it).
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// One JSON-RPC call of `upload_file` over `/mcp` (stateless streamable HTTP); its
/// result, from a JSON answer or the last `data:` line of an event stream.
fn mcp_upload(c: &Client, body: &[u8]) -> Value {
    let reply = c.clone().with("Accept", "application/json, text/event-stream").send(
        "POST",
        "/mcp",
        Some("application/json"),
        Some(body),
    );
    assert_eq!(reply.status, 200, "{reply}");
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    let json = text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("data:"))
        .unwrap_or(&text)
        .trim()
        .to_owned();
    let v: Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {text:.300}"));
    v["result"].clone()
}

fn upload_call(name: &str, data: &[u8]) -> Vec<u8> {
    json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "upload_file", "arguments": {"name": name, "base64": base64(data)}},
    })
    .to_string()
    .into_bytes()
}

#[test]
fn four_large_mcp_uploads_at_once_cost_a_bounded_amount_of_memory() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    // A small upload first, so that first-use allocations are not counted.
    let small = mcp_upload(&c, &upload_call("warm.txt", b"warm"));
    assert_eq!(small["structuredContent"]["size"], 4, "{small}");
    let data: Vec<u8> = (0..24u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let body = upload_call("big.bin", &data);
    let (results, cost) = measure(&s, || {
        std::thread::scope(|scope| {
            let uploads: Vec<_> = (0..4).map(|_| scope.spawn(|| mcp_upload(&c, &body))).collect();
            uploads.into_iter().map(|u| u.join().unwrap()).collect::<Vec<_>>()
        })
    });
    for r in &results {
        assert_ne!(r["isError"], Value::Bool(true), "{r}");
        assert_eq!(r["structuredContent"]["size"], data.len(), "{r}");
    }
    // What was stored is what was sent.
    let stored = &results[0]["structuredContent"];
    let path = stored["download_path"].as_str().unwrap();
    let reply = c.get(path);
    assert!(reply.status == 200 && reply.body == data, "{}", reply.status);
    eprintln!(
        "bounded work: four /mcp upload_file of 24 MiB at once: peak RSS +{:.1} MiB",
        cost.growth_kib as f64 / 1024.0
    );
    assert!(
        cost.growth_kib <= MAX_MCP_UPLOADS_GROWTH_MIB << 10,
        "four uploads grew the server's peak RSS by {} KiB, over {MAX_MCP_UPLOADS_GROWTH_MIB} MiB",
        cost.growth_kib
    );
    // A large message that is not an upload is refused before rmcp reads it.
    let padded = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "list_files", "arguments": {"session_id": "x".repeat(8 << 20)}}});
    let reply = c
        .clone()
        .with("Accept", "application/json, text/event-stream")
        .post_json("/mcp", &padded);
    assert_eq!(reply.status, 413, "{reply}");
    assert_eq!(reply.json()["error_type"], "payload_too_large", "{reply}");
    s.assert_healthy();
}
