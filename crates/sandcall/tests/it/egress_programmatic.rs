//! Egress for programmatic sessions (docs/egress.md): a session granted network keeps
//! its proxy across its pauses, its connections are in its audit trail beside its tool
//! calls, its answer carries the summary, and a session granted network is not
//! replayed after a restart (its requests would be made again).

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
pub(crate) fn fetching_program(host: &str) -> String {
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

/// The session's audit trail (`GET .../calls`).
fn calls(s: &Server, paused: &Value) -> Value {
    let (code, _, v) = s.request(
        "GET",
        &format!("{ROUTE}/{}/calls", paused["session_id"].as_str().unwrap()),
        None,
        None,
    );
    assert_eq!(code, 200, "{v}");
    v
}

/// The paths the upstream was asked for, in order.
pub(crate) fn paths(up: &Upstream) -> Vec<String> {
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
    // While paused, the trail lists the call and the connection made before it.
    let trail = calls(&s, &paused);
    assert_eq!(trail["calls"].as_array().unwrap().len(), 1, "{trail}");
    assert_eq!(trail["calls"][0]["name"], "get", "{trail}");
    let port = up.port;
    let first = &trail["connections"][0];
    assert_eq!(trail["connections"].as_array().unwrap().len(), 1, "{trail}");
    assert_eq!(
        (&first["host"], &first["port"], &first["address"], &first["outcome"]),
        (
            &json!("127.0.0.2"),
            &json!(port),
            &json!("127.0.0.2"),
            &json!("relayed")
        ),
        "{trail}"
    );
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
    // After the end, the trail has both connections, with their bytes.
    let trail = calls(&s, &paused);
    let connections = trail["connections"].as_array().unwrap();
    assert_eq!(connections.len(), 2, "{trail}");
    for c in connections {
        assert_eq!(c["outcome"], "relayed", "{trail}");
        assert!(c["bytes_in"].as_u64().unwrap() > GREETING.len() as u64, "{trail}");
        assert!(c["bytes_out"].as_u64().unwrap() > 0, "{trail}");
    }
    assert_eq!(trail["calls"][0]["outcome"]["status"], "answered", "{trail}");
}

#[test]
fn a_refused_host_is_in_the_trail_as_refused() {
    let up = Upstream::http();
    let host = format!("127.0.0.2:{}", up.port);
    let s = egress_server(std::slice::from_ref(&host), "\"127.0.0.2/32\"", "");
    let code = [
        "import urllib.request, urllib.error",
        "try:",
        "    urllib.request.urlopen('http://evil.example.org/x', timeout=20).read()",
        "    print('reached')",
        "except Exception as e:",
        "    print('refused')",
        "r = get(n=1)",
        "",
    ]
    .join("\n");
    let paused = start(&s, code);
    assert_eq!(paused["partial_stdout"], "refused\n", "{paused}");
    let trail = calls(&s, &paused);
    let c = &trail["connections"][0];
    assert_eq!(trail["connections"].as_array().unwrap().len(), 1, "{trail}");
    assert_eq!(
        (&c["host"], &c["port"]),
        (&json!("evil.example.org"), &json!(80)),
        "{trail}"
    );
    assert_eq!(c["outcome"], "refused", "{trail}");
    assert!(!c["reason"].as_str().unwrap_or_default().is_empty(), "{trail}");
    let (status, done) = answer(&s, &paused, json!(1));
    assert_eq!((status, &done["status"]), (200, &json!("completed")), "{done}");
    assert_eq!(done["network"]["refused"], 1, "{done}");
    assert!(up.seen().is_empty(), "{:?}", up.seen());
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

#[test]
fn a_session_granted_network_is_not_replayed_after_an_eviction() {
    let up = Upstream::http();
    let host = format!("127.0.0.2:{}", up.port);
    let config = format!(
        "egress_allow = [\"{host}\"]\negress_principals = [\"*\"]\negress_allow_addresses = [\"127.0.0.2/32\"]\n"
    );
    let s = Server::start_with(
        &[crate::common::NO_POOL, ("SANDCALL_SESSION_IDLE_EVICT_S", "1")],
        &config,
    );
    let paused = start(&s, fetching_program(&host));
    assert_eq!(paths(&up), ["/a"]);
    // Evicted: its sandbox goes, the session waits in the store.
    let t = std::time::Instant::now();
    while crate::common::run_cgroups(&s.instance()) > 0 || !crate::common::descendants(s.pid()).is_empty() {
        assert!(t.elapsed().as_secs() < 20, "the paused session was not evicted");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (status, v) = answer(&s, &paused, json!(42));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "error", "{v}");
    assert!(v["error"].as_str().unwrap().contains("granted network"), "{v}");
    assert_eq!(paths(&up), ["/a"]);
}
