//! The audit trail: `GET /v1/exec/programmatic/{session_id}/calls` lists exactly the
//! calls a session's program made (handed out and answered, refused by the server, or
//! answered with an error), the metrics count them, and another principal sees none.

use crate::common::Server;
use crate::files::{sha256_hex, Client};
use crate::metrics::{operator, scrape, value, METRICS_TOKEN};
use crate::principals::rate_tool;
use serde_json::{json, Value};

const KEYS: &str = "alice:key-a-0123456789abcdef,bob:key-b-0123456789abcdef";

const PROGRAM: &str = r#"
print("rate", get_rate(base="USD"))
try:
    get_rate(base=5)
except Exception as e:
    print("refused:", type(e).__name__)
try:
    get_rate(base="XXX")
except Exception as e:
    print("tool error:", e)
"#;

fn calls(c: &Client, id: &str) -> Vec<Value> {
    let r = c.get(&format!("/v1/exec/programmatic/{id}/calls"));
    assert_eq!(r.status, 200, "{r}");
    let v = r.json();
    assert_eq!(v["session_id"], id, "{v}");
    assert_eq!(v["calls_dropped"], 0, "{v}");
    v["calls"].as_array().unwrap().clone()
}

#[test]
fn the_calls_route_lists_every_call_made_refused_and_answered() {
    let s = Server::start_with(
        &[("SANDCALL_API_KEYS", KEYS), ("SANDCALL_METRICS_TOKEN", METRICS_TOKEN)],
        "",
    );
    let alice = Client::bearer(&s, "key-a-0123456789abcdef");
    let bob = Client::bearer(&s, "key-b-0123456789abcdef");
    let first = start(&alice);
    assert_eq!(first["status"], "tool_call_required", "{first}");
    let id = first["session_id"].as_str().unwrap();
    let call1 = first["tool_calls"][0]["id"].as_str().unwrap();

    // While paused: the call is listed, handed out, not answered yet.
    let listed = calls(&alice, id);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["call_id"], call1);
    assert_eq!(listed[0]["name"], "get_rate");
    assert_eq!(listed[0]["arguments_sha256"], sha256_hex(br#"{"base":"USD"}"#));
    assert_eq!(listed[0]["arguments_bytes"], 14);
    assert_eq!(listed[0]["outcome"], json!({"status": "pending"}));
    // Another principal's session does not exist for bob.
    assert_eq!(bob.get(&format!("/v1/exec/programmatic/{id}/calls")).status, 404);

    let r = alice.post_json(
        "/v1/exec/programmatic",
        &json!({"session_id": id, "continuation_token": first["continuation_token"],
                "tool_results": [{"call_id": call1, "result": 0.92}]}),
    );
    let second = r.json();
    assert_eq!(second["status"], "tool_call_required", "{second}");
    let call3 = second["tool_calls"][0]["id"].as_str().unwrap();
    let r = alice.post_json(
        "/v1/exec/programmatic",
        &json!({"session_id": id, "continuation_token": second["continuation_token"],
                "tool_results": [{"call_id": call3, "result": null, "is_error": true, "error_message": "unknown currency"}]}),
    );
    let end = r.json();
    assert_eq!(end["status"], "completed", "{end}");
    assert_eq!(
        end["stdout"], "rate 0.92\nrefused: ToolError\ntool error: unknown currency\n",
        "{end}"
    );

    let listed = calls(&alice, id);
    assert_eq!(listed.len(), 3, "{listed:#?}");
    let [answered, refused, errored] = [&listed[0], &listed[1], &listed[2]];
    assert_eq!(answered["call_id"], call1);
    assert_eq!(answered["outcome"]["status"], "answered");
    assert_eq!(answered["outcome"]["is_error"], false);
    assert_eq!(answered["outcome"]["result_bytes"], 4, "0.92");
    assert!(answered["outcome"]["latency_ms"].is_u64());
    assert!(refused["call_id"].is_null(), "{refused}");
    assert_eq!(refused["name"], "get_rate");
    assert!(refused["arguments_sha256"].is_null(), "{refused}");
    assert_eq!(refused["outcome"]["status"], "refused");
    assert!(
        refused["outcome"]["reason"]
            .as_str()
            .unwrap()
            .contains("do not match its schema"),
        "{refused}"
    );
    assert_eq!(errored["call_id"], call3);
    assert_eq!(errored["arguments_sha256"], sha256_hex(br#"{"base":"XXX"}"#));
    assert_eq!(errored["outcome"]["status"], "answered");
    assert_eq!(errored["outcome"]["is_error"], true);
    assert_eq!(errored["outcome"]["result_bytes"], "unknown currency".len());
    for c in &listed {
        assert!(c["requested_at"].as_str().unwrap().ends_with('Z'), "{c}");
        assert!(c.get("replayed").is_none(), "{c}");
    }

    // The same story in the metrics.
    let m = scrape(&operator(&s));
    assert_eq!(value(&m, "sandcall_tool_calls_total", &[]), 2.0);
    assert_eq!(
        value(
            &m,
            "sandcall_tool_calls_refused_total",
            &[("reason", "invalid_arguments")]
        ),
        1.0
    );
    assert_eq!(value(&m, "sandcall_tool_results_total", &[("outcome", "ok")]), 1.0);
    assert_eq!(value(&m, "sandcall_tool_results_total", &[("outcome", "error")]), 1.0);
    assert_eq!(
        value(
            &m,
            "sandcall_runs_total",
            &[
                ("kind", "programmatic"),
                ("language", "python"),
                ("status", "completed")
            ]
        ),
        1.0
    );
}

/// Resumes `paused`'s one call with `result`.
/// Starts PROGRAM with the rate tool: its first pause.
fn start(c: &Client) -> Value {
    let r = c.post_json(
        "/v1/exec/programmatic",
        &json!({"language": "python", "code": PROGRAM, "tools": [rate_tool()]}),
    );
    assert_eq!(r.status, 200, "{r}");
    r.json()
}

/// Each listed call's outcome, in order.
fn outcomes(listed: &[Value]) -> Vec<&Value> {
    listed.iter().map(|c| &c["outcome"]["status"]).collect()
}

fn answer(c: &Client, paused: &Value, result: Value) -> Value {
    let r = c.post_json(
        "/v1/exec/programmatic",
        &json!({"session_id": paused["session_id"], "continuation_token": paused["continuation_token"],
                "tool_results": [{"call_id": paused["tool_calls"][0]["id"], "result": result}]}),
    );
    assert_eq!(r.status, 200, "{r}");
    r.json()
}

#[test]
fn a_replay_lists_each_call_once() {
    let env = [
        ("SANDCALL_API_KEYS", KEYS),
        ("SANDCALL_METRICS_TOKEN", METRICS_TOKEN),
        ("SANDCALL_SESSION_IDLE_EVICT_S", "1"),
    ];
    let s = Server::start_with(&env, "");
    let alice = Client::bearer(&s, "key-a-0123456789abcdef");
    let first = start(&alice);
    let id = first["session_id"].as_str().unwrap().to_owned();
    let dormant = || value(&scrape(&operator(&s)), "sandcall_sessions_dormant", &[]);
    // Evicted while paused; the resume brings it back by replay, which meets the first
    // call again: still one record of it.
    crate::common::settle(dormant, 1.0);
    let second = answer(&alice, &first, json!(0.92));
    assert_eq!(second["status"], "tool_call_required", "{second}");
    let listed = calls(&alice, &id);
    assert_eq!(outcomes(&listed), ["answered", "refused", "pending"], "{listed:#?}");
    assert!(listed.iter().all(|c| c.get("replayed").is_none()), "{listed:#?}");
    crate::common::settle(dormant, 1.0);
    assert_eq!(calls(&alice, &id).len(), 3);

    // The trail of a dormant session is kept with it in the store: a restart loses
    // none of it, and the replay after it still lists each call once.
    let (s, _) = s.restart(&env, false);
    let alice = Client::bearer(&s, "key-a-0123456789abcdef");
    let kept = calls(&alice, &id);
    assert_eq!(outcomes(&kept), ["answered", "refused", "pending"], "{kept:#?}");
    let end = answer(&alice, &second, json!(null));
    assert_eq!(end["status"], "completed", "{end}");
    let listed = calls(&alice, &id);
    assert_eq!(listed.len(), 3, "{listed:#?}");
    assert_eq!(listed[0]["call_id"], first["tool_calls"][0]["id"]);
    assert_eq!(listed[2]["call_id"], second["tool_calls"][0]["id"]);
    assert_eq!(outcomes(&listed), ["answered", "refused", "answered"], "{listed:#?}");
    assert!(listed.iter().all(|c| c.get("replayed").is_none()), "{listed:#?}");
}

#[test]
fn a_replay_after_sigkill_lists_the_journalled_calls_again_as_replayed() {
    // Killed while it held the session live: the records went with it, and the replay
    // lists the journalled calls again, marked `replayed`.
    let env = [("SANDCALL_API_KEYS", KEYS)];
    let s = Server::start_with(&env, "");
    let alice = Client::bearer(&s, "key-a-0123456789abcdef");
    let first = start(&alice);
    let id = first["session_id"].as_str().unwrap().to_owned();
    let second = answer(&alice, &first, json!(0.92));
    assert_eq!(second["status"], "tool_call_required", "{second}");
    let (s, _) = s.restart(&env, true);
    let alice = Client::bearer(&s, "key-a-0123456789abcdef");
    let end = answer(&alice, &second, json!(null));
    assert_eq!(end["status"], "completed", "{end}");
    let listed = calls(&alice, &id);
    assert_eq!(listed.len(), 2, "{listed:#?}");
    assert_eq!(listed[0]["call_id"], first["tool_calls"][0]["id"]);
    assert_eq!(listed[1]["call_id"], second["tool_calls"][0]["id"]);
    for c in &listed {
        assert_eq!(c["replayed"], true, "{c}");
        assert_eq!(c["outcome"]["status"], "answered", "{c}");
    }
}
