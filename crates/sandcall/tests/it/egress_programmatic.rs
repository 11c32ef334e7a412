//! Egress for programmatic sessions (docs/egress.md): a session granted network keeps
//! its proxy across its pauses, its answer carries the summary, and a session granted
//! network is not replayed after a restart (its requests would be made again).

use crate::common::Server;
use crate::egress::{egress_server, Upstream, GREETING};
use serde_json::{json, Value};

const ROUTE: &str = "/v1/exec/programmatic";

fn get_tool() -> Value {
    json!({
        "name": "get",
        "description": "gets",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    })
}

/// A Python program that fetches `/a` from `host`, calls `get`, then fetches `/b`.
fn fetching_program(host: &str) -> String {
    [
        "import urllib.request",
        "def fetch(path):",
        &format!("    return urllib.request.urlopen('http://{host}' + path, timeout=20).read().decode()"),
        "print('before', fetch('/a'))",
        "r = get(n=1)",
        "print('after', fetch('/b'), r)",
        "",
    ]
    .join("\n")
}

fn start(s: &Server, code: String) -> Value {
    let (status, v) = s.post(
        ROUTE,
        &json!({"language": "python", "code": code, "tools": [get_tool()], "network": {}, "timeout": 60000}),
    );
    assert_eq!(status, 200, "start: {v}");
    assert_eq!(v["status"], "tool_call_required", "{v}");
    v
}

fn answer(s: &Server, paused: &Value, result: Value) -> (u16, Value) {
    let call = &paused["tool_calls"][0];
    s.post(
        ROUTE,
        &json!({
            "session_id": paused["session_id"],
            "continuation_token": paused["continuation_token"],
            "tool_results": [{"call_id": call["id"], "result": result, "is_error": false}],
        }),
    )
}

/// The paths the upstream was asked for, in order.
fn paths(up: &Upstream) -> Vec<String> {
    up.seen()
        .iter()
        .map(|head| head.split_whitespace().nth(1).unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn a_session_reaches_an_allowed_host_before_and_after_a_tool_call_pause() {
    let up = Upstream::http();
    let host = format!("127.0.0.2:{}", up.port);
    let s = egress_server(std::slice::from_ref(&host), "\"127.0.0.2/32\"", "");
    let paused = start(&s, fetching_program(&host));
    assert_eq!(paused["partial_stdout"], format!("before {GREETING}\n"), "{paused}");
    let (status, done) = answer(&s, &paused, json!(42));
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["stdout"],
        format!("before {GREETING}\nafter {GREETING} 42\n"),
        "{done}"
    );
    assert_eq!(paths(&up), ["/a", "/b"]);
    // The answer carries the session's network, as /v1/exec's does.
    assert_eq!(done["network"]["connections"], 2, "{done}");
    assert_eq!(done["network"]["refused"], 0, "{done}");
    assert!(done["network"]["bytes_in"].as_u64().unwrap() > 0, "{done}");
}

#[test]
fn a_session_granted_network_is_not_replayed_after_a_restart() {
    let up = Upstream::http();
    let host = format!("127.0.0.2:{}", up.port);
    let s = egress_server(std::slice::from_ref(&host), "\"127.0.0.2/32\"", "");
    let paused = start(&s, fetching_program(&host));
    assert_eq!(paths(&up), ["/a"]);
    let (s, _) = s.restart(&[], true);
    // The resume ends the session with a clear error: the program is not run again,
    // so its first request is not made a second time.
    let (status, v) = answer(&s, &paused, json!(42));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "error", "{v}");
    assert!(v["error"].as_str().unwrap().contains("granted network"), "{v}");
    assert_eq!(paths(&up), ["/a"]);
    // It is over: resuming again is refused.
    let (status, v) = answer(&s, &paused, json!(42));
    assert!(status == 404 || status == 409 || v["status"] == "error", "{status} {v}");
}
