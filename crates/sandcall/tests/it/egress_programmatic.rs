//! Egress for programmatic sessions (docs/egress.md): a session granted network keeps
//! its proxy across its pauses, its connections are in its audit trail beside its tool
//! calls, with times that put both in one order, its answer carries the summary, a
//! dormant session's trail keeps its connections, and a session granted network is not
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

/// An RFC 3339 time of the trail, in ms since the epoch.
fn ms_of(v: &Value) -> u64 {
    let text = v.as_str().unwrap_or_else(|| panic!("not a time: {v}"));
    let at = humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    at.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
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
fn connections_carry_times_that_sort_them_among_the_tool_calls() {
    let up = Upstream::http();
    let host = format!("127.0.0.2:{}", up.port);
    let s = egress_server(std::slice::from_ref(&host), "\"127.0.0.2/32\"", "");
    let code = [
        "import urllib.request",
        "r1 = get(n=1)",
        &format!("body = urllib.request.urlopen('http://{host}/a', timeout=20).read().decode()"),
        "r2 = get(n=2)",
        "print(body, r1, r2)",
        "",
    ]
    .join("\n");
    let began = now_ms();
    let first = start(&s, code);
    let (status, second) = answer(&s, &first, json!(1));
    assert_eq!(
        (status, &second["status"]),
        (200, &json!("tool_call_required")),
        "{second}"
    );
    let (status, done) = answer(&s, &second, json!(2));
    assert_eq!((status, &done["status"]), (200, &json!("completed")), "{done}");
    let ended = now_ms();
    assert_eq!(done["stdout"], format!("{GREETING} 1 2\n"), "{done}");
    let trail = calls(&s, &first);
    let calls = trail["calls"].as_array().unwrap();
    let connections = trail["connections"].as_array().unwrap();
    assert_eq!((calls.len(), connections.len()), (2, 1), "{trail}");
    let c = &connections[0];
    let (opened, closed) = (ms_of(&c["opened_at"]), ms_of(&c["closed_at"]));
    // Within the session's life, and closed no earlier than opened.
    assert!(
        began <= opened && opened <= closed && closed <= ended,
        "{began} {ended} {trail}"
    );
    // Made between the two calls: merged by time, it sorts between them.
    let (call1, call2) = (ms_of(&calls[0]["requested_at"]), ms_of(&calls[1]["requested_at"]));
    assert!(call1 < opened && opened < call2, "{trail}");
    let mut merged: Vec<(u64, &str)> = calls
        .iter()
        .map(|call| (ms_of(&call["requested_at"]), "call"))
        .chain(connections.iter().map(|c| (ms_of(&c["opened_at"]), "connection")))
        .collect();
    merged.sort_by_key(|(at, _)| *at);
    let order: Vec<&str> = merged.iter().map(|(_, what)| *what).collect();
    assert_eq!(order, ["call", "connection", "call"], "{trail}");
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
    let config = crate::egress::egress_config(std::slice::from_ref(&host), "\"127.0.0.2/32\"", "");
    let s = Server::start_with(
        &[crate::common::NO_POOL, ("SANDCALL_SESSION_IDLE_EVICT_S", "1")],
        &config,
    );
    let began = now_ms();
    let paused = start(&s, fetching_program(&host));
    assert_eq!(paths(&up), ["/a"]);
    // Evicted: its sandbox goes, the session waits in the store.
    let t = std::time::Instant::now();
    while crate::common::run_cgroups(&s.instance()) > 0 || !crate::common::descendants(s.pid()).is_empty() {
        assert!(t.elapsed().as_secs() < 20, "the paused session was not evicted");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Dormant, its trail (in the store) still lists its connection, with its times.
    let trail = calls(&s, &paused);
    assert_eq!(trail["calls"].as_array().unwrap().len(), 1, "{trail}");
    let connections = trail["connections"].as_array().unwrap();
    assert_eq!(connections.len(), 1, "{trail}");
    let c = &connections[0];
    assert_eq!(
        (&c["host"], &c["port"], &c["outcome"]),
        (&json!("127.0.0.2"), &json!(up.port), &json!("relayed")),
        "{trail}"
    );
    assert!(c["bytes_in"].as_u64().unwrap() > GREETING.len() as u64, "{trail}");
    let opened = ms_of(&c["opened_at"]);
    assert!(
        began <= opened && opened <= ms_of(&trail["calls"][0]["requested_at"]),
        "{trail}"
    );
    assert!(trail.get("connections_dropped").is_none(), "{trail}");
    let (status, v) = answer(&s, &paused, json!(42));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "error", "{v}");
    assert!(v["error"].as_str().unwrap().contains("granted network"), "{v}");
    assert_eq!(paths(&up), ["/a"]);
}
