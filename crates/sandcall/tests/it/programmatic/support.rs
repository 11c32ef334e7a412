//! Helpers shared by the programmatic tests: tool declarations, the shapes of a pause and
//! of an ending, starting and resuming sessions, driving one to its end with a caller
//! that answers every call, and waiting until a session's sandbox is reclaimed.

use crate::common::{descendants, dir_entries, processes_matching, run_cgroups, Server};
use crate::files::assert_nanoid;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

pub(super) const ROUTE: &str = "/v1/exec/programmatic";

/// Program source from its lines (no indentation games with Rust string literals).
pub(super) fn src(lines: &[&str]) -> String {
    let mut s = lines.join("\n");
    s.push('\n');
    s
}

/// A tool declaration whose parameters are an object schema.
pub(super) fn tool(name: &str, properties: Value, required: &[&str]) -> Value {
    let mut parameters = json!({"type": "object", "properties": properties});
    if !required.is_empty() {
        parameters["required"] = json!(required);
    }
    json!({"name": name, "description": format!("the {name} tool"), "parameters": parameters})
}

pub(super) fn rate_tool() -> Value {
    tool(
        "get_exchange_rate",
        json!({"base": {"type": "string"}, "quote": {"type": "string"}}),
        &["base", "quote"],
    )
}

pub(super) fn usd_eur() -> Value {
    json!({"base": "USD", "quote": "EUR"})
}

/// Everything a `tool_call_required` response must carry.
pub(super) fn assert_paused_shape(r: &Value) {
    assert_eq!(r["status"], "tool_call_required", "{r}");
    assert_nanoid(&r["session_id"], r);
    assert!(
        r["continuation_token"].as_str().is_some_and(|t| !t.is_empty()),
        "no continuation token: {r}"
    );
    assert!(r["partial_stdout"].is_string(), "no partial_stdout: {r}");
    assert!(r["partial_stderr"].is_string(), "no partial_stderr: {r}");
    assert!(!r["expires_at"].is_null(), "no expires_at: {r}");
    let calls = r["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("no tool_calls: {r}"));
    assert!(!calls.is_empty(), "paused without calls: {r}");
    for c in calls {
        assert_nanoid(&c["id"], r);
        assert!(c["name"].is_string(), "call without a name: {r}");
        assert!(c["arguments"].is_object(), "arguments are not an object: {r}");
        assert_eq!(c["input"], c["arguments"], "input must repeat arguments: {r}");
    }
    let mut ids: Vec<&str> = calls.iter().map(|c| c["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), calls.len(), "duplicate call ids: {r}");
}

/// Everything a `completed` response must carry.
pub(super) fn assert_completed_shape(r: &Value) {
    assert_eq!(r["status"], "completed", "{r}");
    assert_nanoid(&r["session_id"], r);
    for field in ["stdout", "stderr"] {
        assert!(r[field].is_string(), "{field} missing: {r}");
    }
    for field in ["timed_out", "stdout_truncated", "stderr_truncated"] {
        assert!(r[field].is_boolean(), "{field} missing: {r}");
    }
    assert!(r["tool_calls_made"].is_u64(), "tool_calls_made missing: {r}");
    assert!(r["execution_time"].is_u64(), "execution_time missing: {r}");
    assert!(r["files"].is_array(), "files missing: {r}");
}

/// A JSON error body `{"error", "error_type"}` with the given HTTP status.
pub(super) fn assert_api_error(status: u16, v: &Value, code: u16, error_type: &str) {
    assert_eq!(status, code, "expected {code} {error_type}, got {status}: {v}");
    assert_eq!(v["error_type"], error_type, "{v}");
    assert!(
        v["error"].as_str().is_some_and(|e| !e.is_empty()),
        "no error message: {v}"
    );
}

/// First call of a session; must answer 200.
pub(super) fn start(s: &Server, body: &Value) -> Value {
    let (status, v) = s.post(ROUTE, body);
    assert_eq!(status, 200, "programmatic start answered {status}: {v}");
    v
}

pub(super) fn ok_result(call_id: &Value, result: Value) -> Value {
    json!({"call_id": call_id, "result": result, "is_error": false})
}

pub(super) fn err_result(call_id: &Value, message: &str) -> Value {
    json!({"call_id": call_id, "result": null, "is_error": true, "error_message": message})
}

/// Resume `paused` with an explicit token.
pub(super) fn resume_with(s: &Server, paused: &Value, token: &str, results: Value) -> (u16, Value) {
    s.post(
        ROUTE,
        &json!({
            "session_id": paused["session_id"],
            "continuation_token": token,
            "tool_results": results,
        }),
    )
}

/// Resume `paused` with its own token.
pub(super) fn resume(s: &Server, paused: &Value, results: Value) -> (u16, Value) {
    let token = paused["continuation_token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token: {paused}"));
    resume_with(s, paused, token, results)
}

/// GET /v1/exec/programmatic/{id}.
pub(super) fn state(s: &Server, id: &str) -> (u16, Value) {
    let (status, _, v) = s.request("GET", &format!("{ROUTE}/{id}"), None, None);
    (status, v)
}

pub(super) fn session_id(r: &Value) -> String {
    r["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no session_id: {r}"))
        .to_owned()
}

/// Polls GET until the session reaches `completed` or `error`.
pub(super) fn wait_for_outcome(s: &Server, id: &str, limit: Duration) -> Value {
    let t = Instant::now();
    loop {
        let (status, v) = state(s, id);
        assert_eq!(status, 200, "GET session {id} answered {status}: {v}");
        if v["status"] == "completed" || v["status"] == "error" {
            return v;
        }
        // Between a timed-out call and the next pause the program runs (an extension state).
        assert!(v["status"] == "tool_call_required" || v["status"] == "running", "{v}");
        assert!(t.elapsed() < limit, "session {id} not ended after {limit:?}: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until no sandbox of this server is left: no run cgroup, no process under the
/// server, no staging directory, and no process whose command line holds `marker`.
pub(super) fn wait_until_reclaimed(s: &Server, marker: Option<&str>, limit: Duration) {
    let instance = s.instance();
    let t = Instant::now();
    loop {
        let cgroups = run_cgroups(&instance);
        let procs = descendants(s.pid());
        let staging = dir_entries(&s.data_dir.join("runs"));
        let marked = marker.map(processes_matching).unwrap_or_default();
        if cgroups == 0 && procs.is_empty() && staging == 0 && marked.is_empty() {
            return;
        }
        assert!(
            t.elapsed() < limit,
            "not reclaimed after {limit:?}: {cgroups} run cgroups, processes {procs:?}, \
             {staging} staging dirs, {marker:?} still running as {marked:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the caller answers to one tool call: (result, is_error, error_message).
pub(super) type Answer = (Value, bool, String);

pub(super) fn ok(v: Value) -> Answer {
    (v, false, String::new())
}

pub(super) fn fail(message: &str) -> Answer {
    (Value::Null, true, message.to_owned())
}

/// A session driven to its end.
pub(super) struct Outcome {
    /// The final `completed` or `error` response.
    pub(super) last: Value,
    /// How many `tool_call_required` responses were answered.
    pub(super) rounds: usize,
    /// Every call the caller received, in order.
    pub(super) calls: Vec<Value>,
    /// Every `tool_call_required` response, in order.
    pub(super) pauses: Vec<Value>,
}

/// Starts a session and answers every call with `answer(name, arguments)` until the
/// session completes or errors.
pub(super) fn drive(s: &Server, body: &Value, answer: impl FnMut(&str, &Value) -> Answer) -> Outcome {
    let first = start(s, body);
    drive_from(s, first, answer)
}

/// Like `drive`, from a first response already in hand.
pub(super) fn drive_from(s: &Server, first: Value, mut answer: impl FnMut(&str, &Value) -> Answer) -> Outcome {
    let session = first["session_id"].clone();
    assert_nanoid(&session, &first);
    let mut out = Outcome {
        last: Value::Null,
        rounds: 0,
        calls: Vec::new(),
        pauses: Vec::new(),
    };
    let mut r = first;
    loop {
        assert_eq!(r["session_id"], session, "session id changed: {r}");
        let status = r["status"].as_str().unwrap_or("").to_owned();
        match status.as_str() {
            "tool_call_required" => {}
            "completed" | "error" => {
                out.last = r;
                return out;
            }
            _ => panic!("unexpected programmatic response: {r}"),
        }
        assert_paused_shape(&r);
        if let Some(previous) = out.pauses.last() {
            assert_ne!(
                previous["continuation_token"], r["continuation_token"],
                "each pause has its own token"
            );
        }
        out.rounds += 1;
        assert!(out.rounds <= 500, "runaway session: {r}");
        let mut results = Vec::new();
        for call in r["tool_calls"].as_array().unwrap() {
            out.calls.push(call.clone());
            let (value, is_error, message) = answer(call["name"].as_str().unwrap(), &call["arguments"]);
            results.push(if is_error {
                err_result(&call["id"], &message)
            } else {
                ok_result(&call["id"], value)
            });
        }
        let (code, next) = resume(s, &r, Value::Array(results));
        assert_eq!(code, 200, "resume answered {code}: {next}\nresuming: {r}");
        out.pauses.push(r);
        r = next;
    }
}

/// The one-character change of a token, in the middle, keeping the token's alphabet.
pub(super) fn altered(token: &str) -> String {
    let chars: Vec<char> = token.chars().collect();
    let n = chars.len();
    let alnum = |i: usize| chars[i].is_ascii_alphanumeric();
    // A character in the middle whose neighbours are also plain characters (never one
    // next to a separator, where an encoding may have slack bits).
    let i = (0..n)
        .flat_map(|d| [n / 2 + d, (n / 2).wrapping_sub(d)])
        .find(|&i| i < n && i > 0 && i + 1 < n && alnum(i - 1) && alnum(i) && alnum(i + 1))
        .unwrap_or_else(|| panic!("no alphanumeric run in token {token:?}"));
    let c = chars[i];
    let replacement = match c {
        '0'..='9' => {
            if c == '0' {
                '1'
            } else {
                '0'
            }
        }
        'a'..='z' => {
            if c == 'a' {
                'b'
            } else {
                'a'
            }
        }
        _ => {
            if c == 'A' {
                'B'
            } else {
                'A'
            }
        }
    };
    let mut out = chars;
    out[i] = replacement;
    let out: String = out.into_iter().collect();
    assert_ne!(out, token);
    out
}

/// Python that leaves a `sleep` of its own running in the sandbox, so the test can
/// see whether the whole sandbox was killed.
pub(super) fn background_sleep(seconds: u32) -> String {
    format!("import subprocess\nsubprocess.Popen([\"sleep\", \"{seconds}\"])\n")
}
