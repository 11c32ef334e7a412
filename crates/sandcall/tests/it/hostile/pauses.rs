//! Bytes per pause and per session: what a paused session holds in the server is
//! bounded by config.

use super::schemas::{drive, Watch, ROUTE};
use crate::common::{hostile, Server};
use serde_json::{json, Value};

fn store_tool() -> Value {
    json!({"name": "store", "parameters": {"type": "object", "properties": {"blob": {"type": "string"}}}})
}

fn get(s: &Server, id: &str) -> Value {
    let (status, _, v) = s.request("GET", &format!("{ROUTE}/{id}"), None, None);
    assert_eq!(status, 200, "{v}");
    v
}

/// A response cut to its first 300 characters, for assertion messages: these hold
/// megabytes of arguments.
fn short(v: &Value) -> String {
    v.to_string().chars().take(300).collect()
}

#[test]
fn a_flood_of_large_calls_in_one_pause_is_held_to_max_pause_bytes() {
    let s = Server::start();
    s.assert_healthy(); // warm up: the first run's allocations are not the attack's
    let max_pause_bytes = 4 << 20; // the default
                                   // 100 calls whose arguments are just under max_tool_call_bytes (1 MiB) each. The
                                   // helper may see the program wait (blocked on the full socket) before the flush,
                                   // so the calls can come in more than one pause; each must stay within the budget.
    let body = json!({
        "code": hostile("pause_flood.py"),
        "args": ["100", ((1 << 20) - 64).to_string()],
        "timeout": 120000,
        "tools": [store_tool()],
    });
    let watch = Watch::start(&s);
    let (status, mut r) = s.post(ROUTE, &body);
    assert_eq!(status, 200, "{}", short(&r));
    let id = r["session_id"].as_str().unwrap().to_owned();
    let mut delivered = 0;
    let mut pauses = 0;
    while r["status"] == "tool_call_required" {
        pauses += 1;
        // Checked before the readers too, so that a server without the budget fails
        // here rather than with eight copies of an unbounded pause.
        let growth = watch.growth();
        assert!(
            growth < 64 << 20,
            "pause {pauses} grew the server by {} MiB",
            growth >> 20
        );
        // Eight readers of the paused session at once.
        let readers: Vec<_> = (0..8)
            .map(|_| {
                let url = s.url(&format!("{ROUTE}/{id}"));
                std::thread::spawn(move || ureq::get(&url).call().unwrap().into_string().unwrap().len())
            })
            .collect();
        for reader in readers {
            reader.join().unwrap();
        }
        let growth = watch.growth();
        assert!(
            growth < 64 << 20,
            "reading pause {pauses} grew the server by {} MiB",
            growth >> 20
        );
        let state = get(&s, &id);
        assert_eq!(state["tool_calls"], r["tool_calls"], "{}", short(&state));
        let calls = r["tool_calls"].as_array().unwrap();
        let total: usize = calls.iter().map(|c| c["arguments"].to_string().len()).sum();
        assert!(
            total <= max_pause_bytes,
            "pause {pauses} hands out {total} bytes of arguments"
        );
        for c in calls {
            assert!(
                c["input"] == c["arguments"],
                "input differs from arguments in {}",
                c["id"]
            );
        }
        delivered += calls.len();
        let results: Vec<Value> = calls
            .iter()
            .map(|c| json!({"call_id": c["id"], "result": "stored", "is_error": false}))
            .collect();
        let resume = json!({"session_id": id, "continuation_token": r["continuation_token"], "tool_results": results});
        let (status, next) = s.post(ROUTE, &resume);
        assert_eq!(status, 200, "{}", short(&next));
        r = next;
    }
    let (growth, slowest) = watch.finish();
    eprintln!(
        "pause flood: {delivered} calls in {pauses} pauses, RSS growth {} MiB, health at most {slowest:?}",
        growth >> 20
    );
    assert_eq!(r["status"], "completed", "{}", short(&r));
    // The rest were refused in the program, with a reason naming the limit.
    let out: Value = serde_json::from_str(r["stdout"].as_str().unwrap()).unwrap();
    assert_eq!(out["refused"], 100 - delivered, "{out}");
    assert!(delivered < 100, "every call reached the caller");
    // Mostly the pause budget; past 32 delivered calls the session's (32 MiB) too.
    assert!(out["limits"]["max_pause_bytes"].as_u64().unwrap_or(0) > 0, "{out}");
    assert_eq!(out["other"], Value::Null, "{out}");
    assert!(
        growth < 64 << 20,
        "the paused session grew the server by {} MiB",
        growth >> 20
    );
    s.assert_healthy();
}

#[test]
fn a_session_hands_out_at_most_max_session_tool_bytes() {
    let s = Server::start_with(&[], "max_session_tool_bytes = 3000\n");
    // Each call is 1,011 bytes of arguments: two fit in 3,000, a third does not.
    let code = [
        "for i in range(4):",
        "    try:",
        "        print('ok', store(blob='x' * 1000))",
        "    except ToolError as e:",
        "        print('refused', 'max_session_tool_bytes' in str(e))",
    ]
    .join("\n");
    let (pauses, end) = drive(&s, &json!({"code": code, "tools": [store_tool()]}));
    assert_eq!(pauses.len(), 2, "{pauses:?}");
    assert_eq!(end["status"], "completed", "{end}");
    assert_eq!(end["tool_calls_made"], 2, "{end}");
    assert_eq!(end["stdout"], "ok 1\nok 1\nrefused True\nrefused True\n", "{end}");
    s.assert_healthy();
}
