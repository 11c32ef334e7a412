//! Tool schemas whose validation would cost the server exponential work are refused at
//! declaration, and validation cannot stall the async runtime.

use crate::common::Server;
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub(super) const ROUTE: &str = "/v1/exec/programmatic";

/// The server's resident memory (VmRSS), in bytes.
pub(super) fn rss(pid: u32) -> u64 {
    crate::common::proc_status_kib(pid, "VmRSS").unwrap_or_else(|| panic!("no VmRSS for {pid}")) << 10
}

/// Watches the server while a test attacks it: every 10 ms it samples the server's RSS
/// and times a GET /v1/health, keeping the maxima.
pub(super) struct Watch {
    stop: Arc<AtomicBool>,
    maxima: Arc<Mutex<(u64, Duration)>>,
    thread: Option<JoinHandle<()>>,
    pid: u32,
    pub baseline: u64,
}

impl Watch {
    pub fn start(s: &Server) -> Watch {
        let pid = s.pid();
        let health = s.url("/v1/health");
        let baseline = rss(pid);
        let stop = Arc::new(AtomicBool::new(false));
        let maxima = Arc::new(Mutex::new((baseline, Duration::ZERO)));
        let thread = {
            let (stop, maxima) = (stop.clone(), maxima.clone());
            std::thread::spawn(move || {
                let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(60)).build();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let ok = agent.get(&health).call().is_ok_and(|r| r.status() == 200);
                    let took = t.elapsed();
                    let now = rss(pid);
                    let mut m = maxima.lock().unwrap();
                    assert!(ok, "health did not answer 200");
                    m.0 = m.0.max(now);
                    m.1 = m.1.max(took);
                    drop(m);
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        };
        Watch {
            stop,
            maxima,
            thread: Some(thread),
            pid,
            baseline,
        }
    }

    /// The largest RSS growth over the baseline so far, in bytes (sampled now too).
    pub fn growth(&self) -> u64 {
        let mut m = self.maxima.lock().unwrap();
        m.0 = m.0.max(rss(self.pid));
        m.0.saturating_sub(self.baseline)
    }

    /// (largest RSS growth over the baseline in bytes, slowest health answer).
    pub fn finish(mut self) -> (u64, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        let (max_rss, slowest) = *self.maxima.lock().unwrap();
        (max_rss.saturating_sub(self.baseline), slowest)
    }
}

/// `d0: allOf[$ref d1, $ref d1]`, ... `d{depth}: {type: object}`: no cycle, but
/// 2^depth subschemas once every $ref is followed.
pub(super) fn dag_defs(depth: usize) -> Map<String, Value> {
    let mut defs = Map::new();
    for i in 0..depth {
        let next = format!("#/$defs/d{}", i + 1);
        defs.insert(format!("d{i}"), json!({"allOf": [{"$ref": next}, {"$ref": next}]}));
    }
    defs.insert(format!("d{depth}"), json!({"type": "object"}));
    defs
}

/// Starts a session and answers every call with `1` until it ends; returns every
/// pause and the ending.
pub(super) fn drive(s: &Server, body: &Value) -> (Vec<Value>, Value) {
    let (status, mut r) = s.post(ROUTE, body);
    assert_eq!(status, 200, "{r}");
    let mut pauses = Vec::new();
    while r["status"] == "tool_call_required" {
        let results: Vec<Value> = r["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| json!({"call_id": c["id"], "result": 1, "is_error": false}))
            .collect();
        let resume = json!({"session_id": r["session_id"], "continuation_token": r["continuation_token"], "tool_results": results});
        pauses.push(r);
        let (status, next) = s.post(ROUTE, &resume);
        assert_eq!(status, 200, "{next}");
        r = next;
    }
    (pauses, r)
}

#[test]
fn exponential_ref_dags_are_refused_at_declaration() {
    let s = Server::start();
    for depth in [20, 26] {
        let schema = json!({"$defs": dag_defs(depth), "$ref": "#/$defs/d0"});
        // The program makes no call: on a server without the bounds the declaration
        // is accepted, and this test fails there, before any exponential work.
        let body = json!({"code": "print('declared')", "tools": [{"name": "t", "parameters": schema}]});
        let t = Instant::now();
        let (status, v) = s.post(ROUTE, &body);
        assert_eq!(status, 400, "depth {depth}: {v}");
        assert_eq!(v["error_type"], "invalid_tool_schema", "{v}");
        let message = v["error"].as_str().unwrap();
        // Which bound a DAG passes first depends on its shape: its size or its depth.
        assert!(
            message.contains("10000 JSON values") || message.contains("deeper than 64"),
            "the message names the bound: {message}"
        );
        assert!(t.elapsed() < Duration::from_secs(2), "depth {depth}: {:?}", t.elapsed());
    }
    // Bytes too: one tool's schema over 64 KiB.
    let big = json!({"type": "object", "description": "x".repeat(70_000)});
    let (status, v) = s.post(
        ROUTE,
        &json!({"code": "print(1)", "tools": [{"name": "t", "parameters": big}]}),
    );
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("65536 bytes"), "{v}");
    s.assert_healthy();
}

#[test]
fn shared_refs_and_large_schemas_are_accepted_and_validated() {
    let s = Server::start();
    let money = json!({"type": "object", "properties": {"amount": {"type": "number"}, "currency": {"type": "string"}}, "required": ["amount", "currency"]});
    let quote = json!({
        "$defs": {"money": money},
        "type": "object",
        "properties": {"price": {"$ref": "#/$defs/money"}, "cost": {"$ref": "#/$defs/money"}},
        "required": ["price", "cost"],
    });
    let properties: Map<String, Value> = (0..200)
        .map(|i| {
            let kind = if i % 2 == 0 { "string" } else { "integer" };
            (
                format!("f{i}"),
                json!({"type": kind, "description": format!("Field number {i} of the record, as the form names it.")}),
            )
        })
        .collect();
    let record = json!({"type": "object", "properties": properties, "required": ["f0", "f1"]});
    assert!(record.to_string().len() > 15_000);
    let code = [
        "try:",
        "    quote(price={'amount': 1, 'currency': 'EUR'}, cost={'amount': 'one', 'currency': 'EUR'})",
        "    print('reached')",
        "except ToolError as e:",
        "    print('refused', 'cost/amount' in str(e))",
        "print(quote(price={'amount': 1, 'currency': 'EUR'}, cost={'amount': 2, 'currency': 'USD'}))",
        "fields = {'f%d' % i: ('v%d' % i if i % 2 == 0 else i) for i in range(200)}",
        "print(record(**fields))",
        "try:",
        "    record(f0='a', f1='not a number')",
        "except ToolError as e:",
        "    print('refused', 'f1' in str(e))",
    ]
    .join("\n");
    let body = json!({"code": code, "tools": [{"name": "quote", "parameters": quote}, {"name": "record", "parameters": record}]});
    let (pauses, end) = drive(&s, &body);
    assert_eq!(end["status"], "completed", "{end}");
    assert_eq!(end["stdout"], "refused True\n1\n1\nrefused True\n", "{end}");
    let calls: Vec<&Value> = pauses
        .iter()
        .flat_map(|p| p["tool_calls"].as_array().unwrap())
        .collect();
    assert_eq!(calls.len(), 2, "only the valid calls reach the caller: {calls:?}");
    assert_eq!(calls[0]["arguments"]["cost"], json!({"amount": 2, "currency": "USD"}));
    assert_eq!(calls[1]["arguments"].as_object().unwrap().len(), 200);
    s.assert_healthy();
}

#[test]
fn calls_against_the_largest_allowed_schema_keep_health_fast() {
    let s = Server::start();
    // Warm up: the first run's allocations are not the attack's.
    s.assert_healthy();
    // The largest DAG the expanded-size bound lets through, applied to every item of an
    // array: checking a call costs (items) × (2^9 subschemas). 300 items keep each check
    // well inside its 1 s budget on a loaded machine, so the calls reach the caller; 20
    // of them at once still keep every core of the checks busy.
    let schema = json!({"$defs": dag_defs(9), "type": "object", "properties": {"xs": {"type": "array", "items": {"$ref": "#/$defs/d0"}}}});
    let code = [
        "import asyncio",
        "async def main():",
        "    xs = [{}] * 300",
        "    return await asyncio.gather(*[t(xs=xs) for _ in range(20)], return_exceptions=True)",
        "results = asyncio.run(main())",
        "print(sum(1 for r in results if r == 1), sum(1 for r in results if isinstance(r, ToolError)))",
    ]
    .join("\n");
    let body = json!({"code": code, "timeout": 120000, "tools": [{"name": "t", "parameters": schema}]});
    let watch = Watch::start(&s);
    let (pauses, end) = drive(&s, &body);
    let (growth, slowest) = watch.finish();
    assert_eq!(end["status"], "completed", "{end}");
    let answered: usize = pauses.iter().map(|p| p["tool_calls"].as_array().unwrap().len()).sum();
    let line = end["stdout"].as_str().unwrap().trim().to_owned();
    assert_eq!(line, format!("{answered} {}", 20 - answered), "{end}");
    assert!(answered > 0, "the calls are validated and reach the caller: {end}");
    eprintln!(
        "largest schema: {answered} calls passed, health at most {slowest:?}, RSS growth {} KiB",
        growth >> 10
    );
    // A stall guard only: the checks run on blocking threads (were they on the async
    // workers, health would wait seconds here, and the time-budget test could not cut
    // a check off). Measured at under 10 ms; a loaded CI machine has been seen at 113.
    assert!(
        slowest < Duration::from_millis(500),
        "/v1/health took {slowest:?} while calls were checked"
    );
    assert!(growth < 64 << 20, "the server grew by {} MiB", growth >> 20);
    s.assert_healthy();
}

#[test]
fn a_check_over_its_time_budget_is_refused_in_the_program() {
    let s = Server::start();
    let schema = json!({"$defs": dag_defs(9), "type": "object", "properties": {"xs": {"type": "array", "items": {"$ref": "#/$defs/d0"}}}});
    // 15,000 items × 2^9 subschemas: seconds of checking, more than the 1 s budget.
    // While that check goes on, the session's next calls are refused at once; once it
    // has ended, calls are checked again.
    let code = [
        "import time",
        "try:",
        "    t(xs=[{}] * 15000)",
        "    print('passed')",
        "except ToolError as e:",
        "    print('slow', 'took longer than 1000 ms' in str(e))",
        "busy = 0",
        "deadline = time.monotonic() + 100",
        "while True:",
        "    try:",
        "        print(t(xs=[]))",
        "        break",
        "    except ToolError as e:",
        "        assert 'still running' in str(e) and time.monotonic() < deadline, e",
        "        busy += 1",
        "        time.sleep(0.2)",
        "print('busy', busy > 0)",
    ]
    .join("\n");
    let body = json!({"code": code, "timeout": 120000, "tools": [{"name": "t", "parameters": schema}]});
    let (pauses, end) = drive(&s, &body);
    assert_eq!(end["status"], "completed", "{end}");
    assert_eq!(end["stdout"], "slow True\n1\nbusy True\n", "{end}");
    assert_eq!(pauses.len(), 1);
    assert_eq!(pauses[0]["tool_calls"][0]["arguments"], json!({"xs": []}));
    s.assert_healthy();
}
