//! POST /v1/exec/programmatic: programs that call the caller's tools. The program is
//! paused at each tool call, the caller answers over HTTP, and the token, budget,
//! timeout and cleanup rules of the wire contract hold.

use crate::common::{descendants, dir_entries, processes_matching, run_cgroups, Server, NO_POOL};
use crate::files::assert_nanoid;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const ROUTE: &str = "/v1/exec/programmatic";

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Program source from its lines (no indentation games with Rust string literals).
fn src(lines: &[&str]) -> String {
    let mut s = lines.join("\n");
    s.push('\n');
    s
}

/// A tool declaration whose parameters are an object schema.
fn tool(name: &str, properties: Value, required: &[&str]) -> Value {
    let mut parameters = json!({"type": "object", "properties": properties});
    if !required.is_empty() {
        parameters["required"] = json!(required);
    }
    json!({"name": name, "description": format!("the {name} tool"), "parameters": parameters})
}

fn rate_tool() -> Value {
    tool(
        "get_exchange_rate",
        json!({"base": {"type": "string"}, "quote": {"type": "string"}}),
        &["base", "quote"],
    )
}

fn usd_eur() -> Value {
    json!({"base": "USD", "quote": "EUR"})
}

/// Everything a `tool_call_required` response must carry.
fn assert_paused_shape(r: &Value) {
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
fn assert_completed_shape(r: &Value) {
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
fn assert_api_error(status: u16, v: &Value, code: u16, error_type: &str) {
    assert_eq!(status, code, "expected {code} {error_type}, got {status}: {v}");
    assert_eq!(v["error_type"], error_type, "{v}");
    assert!(
        v["error"].as_str().is_some_and(|e| !e.is_empty()),
        "no error message: {v}"
    );
}

/// First call of a session; must answer 200.
fn start(s: &Server, body: &Value) -> Value {
    let (status, v) = s.post(ROUTE, body);
    assert_eq!(status, 200, "programmatic start answered {status}: {v}");
    v
}

fn ok_result(call_id: &Value, result: Value) -> Value {
    json!({"call_id": call_id, "result": result, "is_error": false})
}

fn err_result(call_id: &Value, message: &str) -> Value {
    json!({"call_id": call_id, "result": null, "is_error": true, "error_message": message})
}

/// Resume `paused` with an explicit token.
fn resume_with(s: &Server, paused: &Value, token: &str, results: Value) -> (u16, Value) {
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
fn resume(s: &Server, paused: &Value, results: Value) -> (u16, Value) {
    let token = paused["continuation_token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token: {paused}"));
    resume_with(s, paused, token, results)
}

/// GET /v1/exec/programmatic/{id}.
fn state(s: &Server, id: &str) -> (u16, Value) {
    let (status, _, v) = s.request("GET", &format!("{ROUTE}/{id}"), None, None);
    (status, v)
}

fn session_id(r: &Value) -> String {
    r["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no session_id: {r}"))
        .to_owned()
}

/// Polls GET until the session reaches `completed` or `error`.
fn wait_for_outcome(s: &Server, id: &str, limit: Duration) -> Value {
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
fn wait_until_reclaimed(s: &Server, marker: Option<&str>, limit: Duration) {
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
type Answer = (Value, bool, String);

fn ok(v: Value) -> Answer {
    (v, false, String::new())
}

fn fail(message: &str) -> Answer {
    (Value::Null, true, message.to_owned())
}

/// A session driven to its end.
struct Outcome {
    /// The final `completed` or `error` response.
    last: Value,
    /// How many `tool_call_required` responses were answered.
    rounds: usize,
    /// Every call the caller received, in order.
    calls: Vec<Value>,
    /// Every `tool_call_required` response, in order.
    pauses: Vec<Value>,
}

/// Starts a session and answers every call with `answer(name, arguments)` until the
/// session completes or errors.
fn drive(s: &Server, body: &Value, answer: impl FnMut(&str, &Value) -> Answer) -> Outcome {
    let first = start(s, body);
    drive_from(s, first, answer)
}

/// Like `drive`, from a first response already in hand.
fn drive_from(s: &Server, first: Value, mut answer: impl FnMut(&str, &Value) -> Answer) -> Outcome {
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
fn altered(token: &str) -> String {
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
fn background_sleep(seconds: u32) -> String {
    format!("import subprocess\nsubprocess.Popen([\"sleep\", \"{seconds}\"])\n")
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[test]
fn exchange_rate_example() {
    let s = Server::start();
    let body = json!({
        "language": "python",
        "code": src(&[
            "rate = get_exchange_rate(base=\"USD\", quote=\"EUR\")",
            "print(f\"100 USD = {100 * rate} EUR\")",
        ]),
        "tools": [rate_tool()],
    });
    let first = start(&s, &body);
    assert_paused_shape(&first);
    let calls = first["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{first}");
    assert_eq!(calls[0]["name"], "get_exchange_rate", "{first}");
    assert_eq!(calls[0]["arguments"], usd_eur(), "{first}");
    assert_eq!(calls[0]["input"], usd_eur(), "{first}");
    assert_nanoid(&calls[0]["id"], &first);
    assert_eq!(first["partial_stdout"], "", "{first}");
    assert_eq!(first["partial_stderr"], "", "{first}");

    // GET repeats the pause: the same calls and the same token.
    let id = session_id(&first);
    let (code, again) = state(&s, &id);
    assert_eq!(code, 200, "{again}");
    assert_eq!(again["status"], "tool_call_required", "{again}");
    assert_eq!(again["session_id"], first["session_id"], "{again}");
    assert_eq!(again["continuation_token"], first["continuation_token"], "{again}");
    assert_eq!(again["tool_calls"], first["tool_calls"], "{again}");

    let out = drive_from(&s, first, |name, args| {
        assert_eq!(name, "get_exchange_rate");
        assert_eq!(args, &usd_eur());
        ok(json!(0.92))
    });
    assert_eq!(out.rounds, 1);
    let r = &out.last;
    assert_completed_shape(r);
    assert_eq!(r["stdout"], "100 USD = 92.0 EUR\n", "{r}");
    assert_eq!(r["stderr"], "", "{r}");
    assert_eq!(r["tool_calls_made"], 1, "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["signal"], Value::Null, "{r}");
    assert_eq!(r["timed_out"], false, "{r}");
    assert_eq!(r["stdout_truncated"], false, "{r}");
    assert_eq!(r["files"], json!([]), "{r}");
    assert_eq!(r["session_id"], id.as_str(), "{r}");

    // The finished session's state is its outcome.
    let (code, done) = state(&s, &id);
    assert_eq!(code, 200, "{done}");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["stdout"], "100 USD = 92.0 EUR\n", "{done}");
}

#[test]
fn await_form_and_dict_argument() {
    let s = Server::start();
    let body = json!({
        "language": "python",
        "code": src(&[
            "r = await get_exchange_rate({\"base\": \"USD\", \"quote\": \"EUR\"})",
            "print(r)",
        ]),
        "tools": [rate_tool()],
    });
    let out = drive(&s, &body, |_, _| ok(json!(0.92)));
    assert_eq!(out.rounds, 1);
    assert_eq!(out.calls.len(), 1);
    assert_eq!(out.calls[0]["name"], "get_exchange_rate");
    assert_eq!(out.calls[0]["arguments"], usd_eur());
    assert_eq!(out.calls[0]["input"], usd_eur());
    let r = &out.last;
    assert_completed_shape(r);
    assert_eq!(r["stdout"], "0.92\n", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["tool_calls_made"], 1, "{r}");

    // A call with no arguments at all sends an empty object; results come back as
    // Python values of the matching type.
    let body = json!({
        "language": "python",
        "code": src(&["t = now()", "print(type(t).__name__, t['iso'], t['tags'], t['ok'], t['none'])"]),
        "tools": [tool("now", json!({}), &[])],
    });
    let out = drive(&s, &body, |name, args| {
        assert_eq!(name, "now");
        assert_eq!(args, &json!({}));
        ok(json!({"iso": "2024-01-01", "tags": [1, "two"], "ok": true, "none": null}))
    });
    assert_eq!(out.rounds, 1);
    assert_eq!(out.calls[0]["arguments"], json!({}));
    assert_eq!(out.last["status"], "completed", "{}", out.last);
    assert_eq!(
        out.last["stdout"], "dict 2024-01-01 [1, 'two'] True None\n",
        "{}",
        out.last
    );
}

#[test]
fn twenty_five_sequential_calls() {
    let s = Server::start();
    let body = json!({
        "language": "python",
        "code": src(&[
            "total = 0",
            "for i in range(25):",
            "    total += add(a=i, b=1)",
            "print(total)",
        ]),
        "tools": [tool("add", json!({"a": {"type": "integer"}, "b": {"type": "integer"}}), &["a", "b"])],
        "max_tool_calls": 100,
    });
    let out = drive(&s, &body, |name, args| {
        assert_eq!(name, "add");
        ok(json!(args["a"].as_i64().unwrap() + args["b"].as_i64().unwrap()))
    });
    assert_eq!(out.rounds, 25);
    for (i, pause) in out.pauses.iter().enumerate() {
        let calls = pause["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "round {i}: {pause}");
        assert_eq!(calls[0]["arguments"], json!({"a": i, "b": 1}), "round {i}: {pause}");
    }
    let r = &out.last;
    assert_completed_shape(r);
    assert_eq!(r["stdout"], "325\n", "{r}");
    assert_eq!(r["tool_calls_made"], 25, "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
}

#[test]
fn chained_calls() {
    let s = Server::start();
    let body = json!({
        "language": "python",
        "code": src(&[
            "v = 1",
            "for _ in range(5):",
            "    v = step(x=v)",
            "print('final', v)",
        ]),
        "tools": [tool("step", json!({"x": {"type": "integer"}}), &["x"])],
    });
    let out = drive(&s, &body, |name, args| {
        assert_eq!(name, "step");
        ok(json!(args["x"].as_i64().unwrap() * 2 + 1))
    });
    assert_eq!(out.rounds, 5);
    let seen: Vec<Value> = out.calls.iter().map(|c| c["arguments"]["x"].clone()).collect();
    assert_eq!(seen, vec![json!(1), json!(3), json!(7), json!(15), json!(31)]);
    assert_eq!(out.last["status"], "completed", "{}", out.last);
    assert_eq!(out.last["stdout"], "final 63\n", "{}", out.last);
    assert_eq!(out.last["tool_calls_made"], 5, "{}", out.last);
}

#[test]
fn gather_five_in_one_response_shuffled_results() {
    let s = Server::start();
    let body = json!({
        "language": "python",
        "code": src(&[
            "import asyncio",
            "res = await asyncio.gather(*(square(n=i) for i in range(5)))",
            "print(res)",
        ]),
        "tools": [tool("square", json!({"n": {"type": "integer"}}), &["n"])],
    });
    let first = start(&s, &body);
    assert_paused_shape(&first);
    let calls = first["tool_calls"].as_array().unwrap().clone();
    assert_eq!(calls.len(), 5, "gathered calls must arrive together: {first}");
    let mut ns: Vec<i64> = calls
        .iter()
        .map(|c| {
            assert_eq!(c["name"], "square", "{first}");
            c["arguments"]["n"].as_i64().unwrap_or_else(|| panic!("{first}"))
        })
        .collect();
    ns.sort_unstable();
    assert_eq!(ns, vec![0, 1, 2, 3, 4], "{first}");

    // Answer in an order that is not the order of the calls.
    let mut order: Vec<&Value> = calls.iter().rev().collect();
    order.rotate_left(2);
    let results: Vec<Value> = order
        .iter()
        .map(|c| {
            let n = c["arguments"]["n"].as_i64().unwrap();
            ok_result(&c["id"], json!(n * n))
        })
        .collect();
    let (code, r) = resume(&s, &first, Value::Array(results));
    assert_eq!(code, 200, "{r}");
    assert_completed_shape(&r);
    assert_eq!(r["stdout"], "[0, 1, 4, 9, 16]\n", "{r}");
    assert_eq!(r["tool_calls_made"], 5, "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
}

#[test]
fn partial_stdout_before_pause() {
    let s = Server::start();
    let body = json!({
        "language": "python",
        "code": src(&[
            "import sys",
            "print(\"before\")",
            "sys.stderr.write(\"warn\\n\")",
            "x = tick()",
            "print(\"middle\")",
            "y = tick()",
            "print(\"after\")",
        ]),
        "tools": [tool("tick", json!({}), &[])],
    });
    let out = drive(&s, &body, |_, _| ok(json!(1)));
    assert_eq!(out.rounds, 2);
    // Each pause carries the output produced since the previous response.
    assert_eq!(out.pauses[0]["partial_stdout"], "before\n", "{}", out.pauses[0]);
    assert_eq!(out.pauses[0]["partial_stderr"], "warn\n", "{}", out.pauses[0]);
    assert_eq!(out.pauses[1]["partial_stdout"], "middle\n", "{}", out.pauses[1]);
    assert_eq!(out.pauses[1]["partial_stderr"], "", "{}", out.pauses[1]);
    // The completed response holds the whole run's output.
    let r = &out.last;
    assert_completed_shape(r);
    assert_eq!(r["stdout"], "before\nmiddle\nafter\n", "{r}");
    assert_eq!(r["stderr"], "warn\n", "{r}");
}

#[test]
fn is_error_raises_tool_error() {
    let s = Server::start();
    let answer = |_: &str, args: &Value| {
        if args["quote"] == "XXX" {
            fail("unknown currency XXX")
        } else {
            ok(json!(0.92))
        }
    };

    // Caught: the program goes on.
    let body = json!({
        "language": "python",
        "code": src(&[
            "try:",
            "    get_exchange_rate(base=\"USD\", quote=\"XXX\")",
            "    print(\"no error\")",
            "except ToolError as e:",
            "    print(\"caught\", e)",
            "print(\"subclass\", issubclass(ToolError, Exception))",
            "print(get_exchange_rate(base=\"USD\", quote=\"EUR\"))",
        ]),
        "tools": [rate_tool()],
    });
    let out = drive(&s, &body, answer);
    assert_eq!(out.rounds, 2);
    let r = &out.last;
    assert_completed_shape(r);
    assert_eq!(r["stdout"], "caught unknown currency XXX\nsubclass True\n0.92\n", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");

    // Uncaught: still `completed`, with the traceback and a non-zero exit.
    let body = json!({
        "language": "python",
        "code": src(&[
            "print(\"start\")",
            "rate = get_exchange_rate(base=\"USD\", quote=\"XXX\")",
            "print(\"unreachable\", rate)",
        ]),
        "tools": [rate_tool()],
    });
    let out = drive(&s, &body, answer);
    assert_eq!(out.rounds, 1);
    let r = &out.last;
    assert_completed_shape(r);
    assert_eq!(r["stdout"], "start\n", "{r}");
    let code = r["exit_code"].as_i64().unwrap_or_else(|| panic!("no exit code: {r}"));
    assert_ne!(code, 0, "{r}");
    let err = r["stderr"].as_str().unwrap();
    assert!(err.contains("ToolError"), "{err}");
    assert!(err.contains("unknown currency XXX"), "{err}");
    assert!(err.contains("File \"/run/sandcall/main.py\", line 2"), "{err}");
}

#[test]
fn refused_calls_never_reach_the_caller() {
    let s = Server::start();

    // (a) Arguments that do not match the schema.
    let body = json!({
        "language": "python",
        "code": src(&[
            "for args in [{\"base\": 1, \"quote\": \"EUR\"}, {\"base\": \"USD\"}]:",
            "    try:",
            "        get_exchange_rate(**args)",
            "        print(\"reached\")",
            "    except ToolError as e:",
            "        print(\"refused:\", e)",
            "print(get_exchange_rate(base=\"USD\", quote=\"EUR\"))",
        ]),
        "tools": [rate_tool()],
    });
    let out = drive(&s, &body, |_, _| ok(json!(0.92)));
    assert_eq!(
        out.calls.len(),
        1,
        "only the valid call reaches the caller: {:?}",
        out.calls
    );
    assert_eq!(out.calls[0]["name"], "get_exchange_rate");
    assert_eq!(out.calls[0]["arguments"], usd_eur());
    let r = &out.last;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["tool_calls_made"], 1, "{r}");
    let lines: Vec<&str> = r["stdout"].as_str().unwrap().lines().collect();
    assert_eq!(lines.len(), 3, "{r}");
    for line in &lines[..2] {
        let reason = line.strip_prefix("refused: ").unwrap_or_else(|| panic!("{r}"));
        assert!(!reason.trim().is_empty(), "a refusal says why: {r}");
    }
    assert_eq!(lines[2], "0.92", "{r}");

    // (b) Over the max_tool_calls budget of the request.
    let body = json!({
        "language": "python",
        "code": src(&[
            "for i in range(4):",
            "    try:",
            "        print(\"ok\", add(a=i, b=1))",
            "    except ToolError as e:",
            "        print(\"refused\", i, e)",
        ]),
        "tools": [tool("add", json!({"a": {"type": "integer"}, "b": {"type": "integer"}}), &["a", "b"])],
        "max_tool_calls": 3,
    });
    let out = drive(&s, &body, |_, args| {
        ok(json!(args["a"].as_i64().unwrap() + args["b"].as_i64().unwrap()))
    });
    let seen: Vec<Value> = out.calls.iter().map(|c| c["arguments"].clone()).collect();
    assert_eq!(
        seen,
        vec![
            json!({"a": 0, "b": 1}),
            json!({"a": 1, "b": 1}),
            json!({"a": 2, "b": 1})
        ],
        "exactly the budget reaches the caller"
    );
    let r = &out.last;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["tool_calls_made"], 3, "{r}");
    let stdout = r["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("ok 1\nok 2\nok 3\nrefused 3 "), "{r}");
    assert!(
        stdout.trim_end().len() > "ok 1\nok 2\nok 3\nrefused 3".len(),
        "a refusal says why: {r}"
    );

    // (c) A call whose JSON is over max_tool_call_bytes (1 MiB by default).
    let body = json!({
        "language": "python",
        "code": src(&[
            "try:",
            "    get_exchange_rate(base=\"x\" * 2_000_000, quote=\"EUR\")",
            "    print(\"reached\")",
            "except ToolError as e:",
            "    print(\"too big:\", str(e)[:200])",
            "print(get_exchange_rate(base=\"USD\", quote=\"EUR\"))",
        ]),
        "tools": [rate_tool()],
    });
    let out = drive(&s, &body, |_, _| ok(json!(0.92)));
    assert_eq!(out.calls.len(), 1, "the oversized call must not reach the caller");
    assert_eq!(out.calls[0]["arguments"], usd_eur());
    let r = &out.last;
    assert_eq!(r["status"], "completed", "{r}");
    let lines: Vec<&str> = r["stdout"].as_str().unwrap().lines().collect();
    assert_eq!(lines.len(), 2, "{r}");
    let reason = lines[0].strip_prefix("too big: ").unwrap_or_else(|| panic!("{r}"));
    assert!(!reason.trim().is_empty(), "a refusal says why: {r}");
    assert_eq!(lines[1], "0.92", "{r}");

    // (d) A hand-made protocol message naming an undeclared tool; the same channel
    // with a declared tool does reach the caller.
    let body = json!({
        "language": "python",
        "code": src(&[
            "import json, socket",
            "def ask(msg):",
            "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)",
            "    s.connect(\"/run/sandcall/tools.sock\")",
            "    s.sendall((json.dumps(msg) + \"\\n\" + json.dumps({\"op\": \"flush\"}) + \"\\n\").encode())",
            "    line = s.makefile(\"rb\").readline()",
            "    s.close()",
            "    return json.loads(line)",
            "r = ask({\"op\": \"call\", \"id\": \"x1\", \"name\": \"delete_everything\", \"arguments\": {\"path\": \"/\"}})",
            "print(\"undeclared\", r[\"id\"], r[\"ok\"], r.get(\"kind\"), bool(r.get(\"error\")))",
            "r = ask({\"op\": \"call\", \"id\": \"x2\", \"name\": \"get_exchange_rate\", \"arguments\": {\"base\": \"USD\", \"quote\": \"EUR\"}})",
            "print(\"declared\", r[\"id\"], r[\"ok\"], r.get(\"result\"))",
        ]),
        "tools": [rate_tool()],
    });
    let out = drive(&s, &body, |_, _| ok(json!(0.92)));
    let names: Vec<&str> = out.calls.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        vec!["get_exchange_rate"],
        "undeclared tools never reach the caller"
    );
    assert_eq!(out.calls[0]["arguments"], usd_eur());
    let r = &out.last;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(
        r["stdout"], "undeclared x1 False refused True\ndeclared x2 True 0.92\n",
        "{r}"
    );
    assert_eq!(r["exit_code"], 0, "{r}");
}

#[test]
fn server_ceilings_bound_tool_calls() {
    let s = Server::start_with(
        &[
            ("SANDCALL_MAX_TOOL_CALLS", "2"),
            ("SANDCALL_MAX_TOOL_CALL_BYTES", "4096"),
        ],
        "",
    );
    // A request cannot raise max_tool_calls above the ceiling.
    let body = json!({
        "language": "python",
        "code": src(&[
            "for i in range(3):",
            "    try:",
            "        print(\"ok\", echo(v=i))",
            "    except ToolError:",
            "        print(\"refused\", i)",
        ]),
        "tools": [tool("echo", json!({"v": {"type": "integer"}}), &["v"])],
        "max_tool_calls": 50,
    });
    let out = drive(&s, &body, |_, args| ok(args["v"].clone()));
    assert_eq!(out.calls.len(), 2, "{:?}", out.calls);
    assert_eq!(out.last["stdout"], "ok 0\nok 1\nrefused 2\n", "{}", out.last);

    // max_tool_call_bytes comes from the config.
    let body = json!({
        "language": "python",
        "code": src(&[
            "try:",
            "    echo(s=\"y\" * 10000)",
            "    print(\"reached\")",
            "except ToolError:",
            "    print(\"refused\")",
            "print(echo(s=\"y\" * 100) == \"y\" * 100)",
        ]),
        "tools": [tool("echo", json!({"s": {"type": "string"}}), &["s"])],
    });
    let out = drive(&s, &body, |_, args| ok(args["s"].clone()));
    assert_eq!(out.calls.len(), 1, "{:?}", out.calls);
    assert_eq!(out.calls[0]["arguments"]["s"].as_str().map(str::len), Some(100));
    assert_eq!(out.last["stdout"], "refused\nTrue\n", "{}", out.last);
}

#[test]
fn tokens() {
    let s = Server::start();
    let body = json!({
        "language": "python",
        "code": src(&["a = add(a=1, b=2)", "b = add(a=a, b=10)", "print(a, b)"]),
        "tools": [tool("add", json!({"a": {"type": "integer"}, "b": {"type": "integer"}}), &["a", "b"])],
    });
    let first = start(&s, &body);
    assert_paused_shape(&first);
    let call = first["tool_calls"][0].clone();
    assert_eq!(call["arguments"], json!({"a": 1, "b": 2}), "{first}");
    let token1 = first["continuation_token"].as_str().unwrap().to_owned();

    // Results that answer no pending call, or one twice, or one that is not pending:
    // 400, token kept.
    let bogus_id = json!("AAAAAAAAAAAAAAAAAAAAA");
    assert_ne!(bogus_id, call["id"]);
    for results in [
        json!([]),
        json!([ok_result(&bogus_id, json!(3))]),
        json!([ok_result(&call["id"], json!(3)), ok_result(&call["id"], json!(3))]),
        json!([ok_result(&call["id"], json!(3)), ok_result(&bogus_id, json!(3))]),
    ] {
        let (code, v) = resume(&s, &first, results.clone());
        assert_api_error(code, &v, 400, "invalid_tool_results");
        let (code, st) = state(&s, &session_id(&first));
        assert_eq!(code, 200, "{st}");
        assert_eq!(st["status"], "tool_call_required", "after {results}: {st}");
        assert_eq!(st["continuation_token"], token1.as_str(), "after {results}: {st}");
    }

    // An altered token: 401.
    let forged = altered(&token1);
    let (code, v) = resume_with(&s, &first, &forged, json!([ok_result(&call["id"], json!(3))]));
    assert_api_error(code, &v, 401, "invalid_continuation_token");

    // The real token still works after all of the above.
    let (code, second) = resume(&s, &first, json!([ok_result(&call["id"], json!(3))]));
    assert_eq!(code, 200, "{second}");
    assert_paused_shape(&second);
    assert_eq!(second["session_id"], first["session_id"]);
    assert_ne!(
        second["continuation_token"],
        token1.as_str(),
        "a new pause has a new token"
    );
    assert_eq!(
        second["tool_calls"][0]["arguments"],
        json!({"a": 3, "b": 10}),
        "{second}"
    );

    // Second use of a used token with the same results is a retry: it answers what the
    // first use answered. With other results: 409, and the session stays where it is.
    let (code, again) = resume_with(&s, &first, &token1, json!([ok_result(&call["id"], json!(3))]));
    assert_eq!(code, 200, "{again}");
    assert_eq!(again, second, "a retry answers what the first use answered");
    let (code, v) = resume_with(&s, &first, &token1, json!([ok_result(&call["id"], json!(4))]));
    assert_api_error(code, &v, 409, "continuation_token_used");
    let (code, v) = resume_with(
        &s,
        &first,
        &token1,
        json!([ok_result(&second["tool_calls"][0]["id"], json!(13))]),
    );
    assert_api_error(code, &v, 409, "continuation_token_used");

    let out = drive_from(&s, second.clone(), |_, args| {
        ok(json!(args["a"].as_i64().unwrap() + args["b"].as_i64().unwrap()))
    });
    assert_eq!(out.rounds, 1);
    assert_eq!(out.last["status"], "completed", "{}", out.last);
    assert_eq!(out.last["stdout"], "3 13\n", "{}", out.last);
    assert_eq!(out.last["tool_calls_made"], 2, "{}", out.last);

    // The last token is used up too: a retry of its resume answers the ending, and
    // so does any resume of the ended session (never 409, which LibreChat shows as
    // "temporarily unavailable").
    let (code, v) = resume(
        &s,
        &second,
        json!([ok_result(&second["tool_calls"][0]["id"], json!(13))]),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(v, out.last);
    let (code, v) = resume_with(&s, &first, &token1, json!([ok_result(&call["id"], json!(5))]));
    assert_eq!(code, 200, "{v}");
    assert_eq!(v, out.last);
}

#[test]
fn resume_may_omit_session_id() {
    let s = Server::start();
    let body = json!({
        "language": "python",
        "code": src(&["print(get_exchange_rate(base=\"USD\", quote=\"EUR\"))"]),
        "tools": [rate_tool()],
    });
    let first = start(&s, &body);
    assert_paused_shape(&first);
    let (code, r) = s.post(
        ROUTE,
        &json!({
            "code": "",
            "continuation_token": first["continuation_token"],
            "tool_results": [ok_result(&first["tool_calls"][0]["id"], json!(0.92))],
        }),
    );
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["session_id"], first["session_id"], "{r}");
    assert_eq!(r["stdout"], "0.92\n", "{r}");
}

#[test]
fn unknown_sessions_are_404() {
    let s = Server::start();
    let (code, v) = state(&s, "AAAAAAAAAAAAAAAAAAAAA");
    assert_api_error(code, &v, 404, "session_not_found");
    let (code, v) = s.post(
        &format!("{ROUTE}/cancel"),
        &json!({"session_id": "AAAAAAAAAAAAAAAAAAAAA"}),
    );
    assert_api_error(code, &v, 404, "session_not_found");
}

#[test]
fn never_resumed_session_is_reclaimed() {
    let s = Server::start_with(&[("SANDCALL_SESSION_EXPIRY_S", "1"), NO_POOL], "");
    let seconds = 100_000 + u32::from(s.port);
    let marker = format!("sleep {seconds}");
    let body = json!({
        "language": "python",
        "code": format!(
            "{}print(\"paused\", flush=True)\nget_exchange_rate(base=\"USD\", quote=\"EUR\")\nprint(\"never\")\n",
            background_sleep(seconds)
        ),
        "tools": [rate_tool()],
    });
    let first = start(&s, &body);
    assert_paused_shape(&first);
    // The paused program really holds a sandbox.
    assert!(run_cgroups(&s.instance()) > 0, "a paused session keeps its run cgroup");
    assert!(!descendants(s.pid()).is_empty(), "a paused session keeps its program");
    assert!(
        !processes_matching(&marker).is_empty(),
        "the program's own child is running"
    );

    // Paused until it expires, then gone: never shown as running while it is killed.
    let path = format!("{ROUTE}/{}", first["session_id"].as_str().unwrap());
    let t = std::time::Instant::now();
    loop {
        let (code, _, v) = s.request("GET", &path, None, None);
        if code == 404 {
            break;
        }
        assert_eq!(v["status"], "tool_call_required", "{v}");
        assert!(t.elapsed() < Duration::from_secs(10), "never expired: {v}");
        std::thread::sleep(Duration::from_millis(10));
    }
    wait_until_reclaimed(&s, Some(marker.as_str()), Duration::from_secs(10));
    let (code, v) = resume(
        &s,
        &first,
        json!([ok_result(&first["tool_calls"][0]["id"], json!(0.92))]),
    );
    assert_api_error(code, &v, 404, "session_not_found");
    s.assert_healthy();
}

#[test]
fn tool_call_timeout_raises_timeout_error() {
    let s = Server::start_with(&[("SANDCALL_TOOL_CALL_TIMEOUT_MS", "500")], "");
    let body = json!({
        "language": "python",
        "code": src(&[
            "try:",
            "    r = slow_lookup(q=\"x\")",
            "    print(\"got\", r)",
            "except TimeoutError:",
            "    print(\"timed out\")",
            "print(\"done\")",
        ]),
        "tools": [tool("slow_lookup", json!({"q": {"type": "string"}}), &["q"])],
    });
    let t = Instant::now();
    let first = start(&s, &body);
    assert_paused_shape(&first);
    assert_eq!(first["tool_calls"][0]["name"], "slow_lookup", "{first}");
    // Not resumed: the program gets TimeoutError and runs on to the end.
    let id = session_id(&first);
    let r = wait_for_outcome(&s, &id, Duration::from_secs(15));
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "the call timed out early: {r}"
    );
    assert_completed_shape(&r);
    assert_eq!(r["stdout"], "timed out\ndone\n", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    // The token of the timed-out pause is stale, and the session has ended: a late
    // resume gets the ending (200), not 409.
    let (code, v) = resume(
        &s,
        &first,
        json!([ok_result(&first["tool_calls"][0]["id"], json!("late"))]),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(v, r);
}

#[test]
fn whole_loop_timeout() {
    let s = Server::start_with(&[NO_POOL], "");

    // Paused and never resumed: `loop_timeout` includes time spent waiting for the
    // caller (`timeout` does not; see ptc_librechat::timeout_stops_while_paused).
    let body = json!({
        "loop_timeout": 1500,
        "language": "python",
        "code": src(&[
            "print(\"started\", flush=True)",
            "get_exchange_rate(base=\"USD\", quote=\"EUR\")",
            "print(\"never\")",
        ]),
        "tools": [rate_tool()],
    });
    let t = Instant::now();
    let first = start(&s, &body);
    let r = if first["status"] == "tool_call_required" {
        assert_paused_shape(&first);
        wait_for_outcome(&s, &session_id(&first), Duration::from_secs(20))
    } else {
        // A very loaded machine may spend the whole budget before the first pause.
        first.clone()
    };
    assert!(
        t.elapsed() >= Duration::from_millis(1500),
        "ended before its budget: {r}"
    );
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(r["error_type"], "timeout", "{r}");
    assert!(r["error"].is_string(), "{r}");
    assert_eq!(r["session_id"], first["session_id"], "{r}");
    let stdout = r["stdout"].as_str().unwrap_or_else(|| panic!("no stdout: {r}"));
    assert!(stdout.contains("started"), "partial output is kept: {r}");
    assert!(!stdout.contains("never"), "{r}");
    wait_until_reclaimed(&s, None, Duration::from_secs(10));

    // Resumed, then spinning past the budget.
    let body = json!({
        "language": "python",
        "code": src(&[
            "x = get_exchange_rate(base=\"USD\", quote=\"EUR\")",
            "print(\"resumed\", x, flush=True)",
            "while True:",
            "    pass",
        ]),
        "tools": [rate_tool()],
        "timeout": 1500,
    });
    let t = Instant::now();
    let first = start(&s, &body);
    assert_paused_shape(&first);
    let (code, r) = resume(
        &s,
        &first,
        json!([ok_result(&first["tool_calls"][0]["id"], json!(0.92))]),
    );
    assert_eq!(code, 200, "{r}");
    let r = if r["status"] == "error" {
        r
    } else {
        wait_for_outcome(&s, &session_id(&first), Duration::from_secs(20))
    };
    assert!(
        t.elapsed() >= Duration::from_millis(1500),
        "ended before its budget: {r}"
    );
    assert!(t.elapsed() < Duration::from_secs(30), "budget not enforced: {r}");
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(r["error_type"], "timeout", "{r}");
    assert!(r["stdout"].as_str().is_some_and(|o| o.contains("resumed 0.92")), "{r}");
    // LibreChat shows the model `error` and stderr: both say why, in the same words.
    assert_eq!(r["error"], "[sandbox] Time limit exceeded", "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .is_some_and(|e| e.ends_with("[sandbox] Time limit exceeded\n")),
        "{r}"
    );
    wait_until_reclaimed(&s, None, Duration::from_secs(10));
}

#[test]
fn bash_tools() {
    let s = Server::start();
    let body = json!({
        "language": "bash",
        "code": src(&[
            "out=$(calc n=5 s=007); echo \"kv:$out\"",
            "out=$(calc '{\"n\":6,\"s\":\"y\"}'); echo \"json:$out\"",
            "calc n=abc s=x 2>/dev/null; echo \"bad=$?\"",
            "get_rate base=ERR; echo \"rc=$?\"",
            "get_rate base=USD > /tmp/a & get_rate base=GBP > /tmp/b & wait",
            "cat /tmp/a /tmp/b",
        ]),
        "tools": [
            tool("calc", json!({"n": {"type": "integer"}, "s": {"type": "string"}}), &["n", "s"]),
            tool("get_rate", json!({"base": {"type": "string"}}), &["base"]),
        ],
    });
    let out = drive(&s, &body, |name, args| match name {
        "calc" => {
            let n = args["n"]
                .as_i64()
                .unwrap_or_else(|| panic!("n is not an integer: {args}"));
            let text = args["s"]
                .as_str()
                .unwrap_or_else(|| panic!("s is not a string: {args}"));
            if n == 5 {
                ok(json!(format!("r{n}{text}")))
            } else {
                ok(json!({"v": [n, text]}))
            }
        }
        "get_rate" => match args["base"].as_str() {
            Some("ERR") => fail("no such currency ERR"),
            Some(base) => ok(json!(format!("rate-{base}"))),
            None => panic!("base is not a string: {args}"),
        },
        other => panic!("unexpected tool {other}"),
    });
    assert_eq!(out.rounds, 4, "{:?}", out.pauses);
    let call = |round: usize| &out.pauses[round]["tool_calls"];
    assert_eq!(call(0).as_array().unwrap().len(), 1);
    assert_eq!(call(0)[0]["name"], "calc");
    assert_eq!(
        call(0)[0]["arguments"],
        json!({"n": 5, "s": "007"}),
        "key=value converted by the schema"
    );
    assert_eq!(call(1)[0]["name"], "calc");
    assert_eq!(call(1)[0]["arguments"], json!({"n": 6, "s": "y"}));
    assert_eq!(call(2)[0]["name"], "get_rate");
    assert_eq!(call(2)[0]["arguments"], json!({"base": "ERR"}));
    // The two background calls arrive in one response.
    let together = call(3).as_array().unwrap();
    assert_eq!(together.len(), 2, "{}", out.pauses[3]);
    let mut bases: Vec<&str> = together
        .iter()
        .map(|c| c["arguments"]["base"].as_str().unwrap())
        .collect();
    bases.sort_unstable();
    assert_eq!(bases, vec!["GBP", "USD"]);
    assert_eq!(out.calls.len(), 5, "the refused call never reaches the caller");

    let r = &out.last;
    assert_completed_shape(r);
    assert_eq!(
        r["stdout"], "kv:r5007\njson:{\"v\":[6,\"y\"]}\nbad=2\nrc=1\nrate-USD\nrate-GBP\n",
        "{r}"
    );
    assert!(r["stderr"].as_str().unwrap().contains("no such currency ERR"), "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["tool_calls_made"], 5, "{r}");
}

#[test]
fn cancel_kills_the_program() {
    let s = Server::start_with(&[NO_POOL], "");
    let seconds = 200_000 + u32::from(s.port);
    let marker = format!("sleep {seconds}");
    let body = json!({
        "language": "python",
        "code": format!(
            "{}print(\"started\", flush=True)\nget_exchange_rate(base=\"USD\", quote=\"EUR\")\nprint(\"never\")\n",
            background_sleep(seconds)
        ),
        "tools": [rate_tool()],
    });
    let first = start(&s, &body);
    assert_paused_shape(&first);
    let id = session_id(&first);
    assert!(run_cgroups(&s.instance()) > 0, "a paused session keeps its run cgroup");
    assert!(
        !processes_matching(&marker).is_empty(),
        "the program's own child is running"
    );

    let (code, r) = s.post(&format!("{ROUTE}/cancel"), &json!({"session_id": id}));
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(r["error_type"], "cancelled", "{r}");
    assert_eq!(r["session_id"], id.as_str(), "{r}");
    assert!(
        r["stdout"]
            .as_str()
            .is_some_and(|o| o.contains("started") && !o.contains("never")),
        "{r}"
    );

    let (code, st) = state(&s, &id);
    assert_eq!(code, 200, "{st}");
    assert_eq!(st["status"], "error", "{st}");
    assert_eq!(st["error_type"], "cancelled", "{st}");

    wait_until_reclaimed(&s, Some(marker.as_str()), Duration::from_secs(10));

    let (code, v) = resume(
        &s,
        &first,
        json!([ok_result(&first["tool_calls"][0]["id"], json!(0.92))]),
    );
    // An ended session answers its ending.
    assert_eq!(code, 200, "resuming a cancelled session answered {code}: {v}");
    assert_eq!(v, st);
    s.assert_healthy();
}

#[test]
fn circular_ref_schema_is_refused() {
    let s = Server::start_with(&[NO_POOL], "");
    let code = "print(walk(child={}))\n";
    for parameters in [
        json!({
            "$defs": {"node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}}}},
            "$ref": "#/$defs/node"
        }),
        json!({"type": "object", "properties": {"child": {"$ref": "#"}}}),
    ] {
        let body = json!({
            "language": "python",
            "code": code,
            "tools": [{"name": "walk", "description": "walks a tree", "parameters": parameters}],
        });
        let (status, v) = s.post(ROUTE, &body);
        assert_api_error(status, &v, 400, "invalid_tool_schema");
        assert!(v["error"].as_str().unwrap().contains("Circular $ref detected"), "{v}");
    }
    assert_eq!(run_cgroups(&s.instance()), 0, "no sandbox for a refused request");

    // A $ref that is not recursive is fine.
    let body = json!({
        "language": "python",
        "code": "print(get_exchange_rate(base=\"USD\", quote=\"EUR\"))\n",
        "tools": [{
            "name": "get_exchange_rate",
            "description": "rates",
            "parameters": {
                "$defs": {"currency": {"type": "string"}},
                "type": "object",
                "properties": {"base": {"$ref": "#/$defs/currency"}, "quote": {"$ref": "#/$defs/currency"}},
                "required": ["base", "quote"]
            }
        }],
    });
    let out = drive(&s, &body, |_, _| ok(json!(0.92)));
    assert_eq!(out.calls.len(), 1);
    assert_eq!(out.calls[0]["arguments"], usd_eur());
    assert_eq!(out.last["stdout"], "0.92\n", "{}", out.last);
}

#[test]
fn fifty_concurrent_sessions() {
    let s = Server::start_with(
        &[
            ("SANDCALL_MAX_SESSIONS", "64"),
            ("SANDCALL_MAX_CONCURRENT_RUNS", "64"),
            NO_POOL,
        ],
        "",
    );
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..50i64)
            .map(|i| {
                let s = &s;
                scope.spawn(move || {
                    let body = json!({
                        "language": "python",
                        "code": format!(
                            "total = 0\nfor r in range(10):\n    total += echo(v={i} * 1000 + r)\nprint(total)\n"
                        ),
                        "tools": [tool("echo", json!({"v": {"type": "integer"}}), &["v"])],
                    });
                    let out = drive(s, &body, |name, args| {
                        assert_eq!(name, "echo", "session {i}");
                        let v = args["v"].as_i64().unwrap_or_else(|| panic!("session {i}: {args}"));
                        assert_eq!(v / 1000, i, "session {i} received another session's call: {args}");
                        ok(json!(v * 2))
                    });
                    (i, out)
                })
            })
            .collect();
        for h in handles {
            let (i, out) = h.join().unwrap();
            assert_eq!(out.rounds, 10, "session {i}");
            let seen: Vec<i64> = out
                .calls
                .iter()
                .map(|c| c["arguments"]["v"].as_i64().unwrap())
                .collect();
            let expected: Vec<i64> = (0..10).map(|r| i * 1000 + r).collect();
            assert_eq!(seen, expected, "session {i}");
            let r = &out.last;
            assert_eq!(r["status"], "completed", "session {i}: {r}");
            assert_eq!(r["stdout"], format!("{}\n", 20000 * i + 90), "session {i}: {r}");
            assert_eq!(r["exit_code"], 0, "session {i}: {r}");
            assert_eq!(r["tool_calls_made"], 10, "session {i}: {r}");
        }
    });
    wait_until_reclaimed(&s, None, Duration::from_secs(10));
    s.assert_healthy();
}

#[test]
fn concurrent_resumes_with_one_token_exactly_one_wins() {
    let s = Server::start();
    for round in 0..5 {
        let first = start(
            &s,
            &json!({"language": "python", "code": "print(get_exchange_rate(base='USD', quote='EUR'))", "tools": [rate_tool()]}),
        );
        let call = first["tool_calls"][0]["id"].clone();
        let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..2)
                .map(|i| {
                    let (s, first, call) = (&s, &first, &call);
                    scope.spawn(move || resume(s, first, json!([ok_result(call, json!(i))])))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let won: Vec<&Value> = answers.iter().filter(|(c, _)| *c == 200).map(|(_, v)| v).collect();
        let lost: Vec<&Value> = answers.iter().filter(|(c, _)| *c == 409).map(|(_, v)| v).collect();
        assert_eq!((won.len(), lost.len()), (1, 1), "round {round}: {answers:?}");
        assert_eq!(lost[0]["error_type"], "continuation_token_used");
        assert_eq!(won[0]["status"], "completed", "{}", won[0]);
        assert!(won[0]["stdout"] == "0\n" || won[0]["stdout"] == "1\n", "{}", won[0]);
    }
}

#[test]
fn syntax_errors_and_line_numbers_are_the_users_own() {
    let s = Server::start();
    let r = start(
        &s,
        &json!({"language": "python", "code": "x = 1\n\ny = (\n", "tools": [rate_tool()]}),
    );
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["exit_code"], 1);
    let err = r["stderr"].as_str().unwrap();
    assert!(
        err.contains("File \"/run/sandcall/main.py\", line 3") && err.contains("SyntaxError"),
        "{err}"
    );
    assert!(!err.contains("runner.py"), "the runner stays out of the way: {err}");
    let r = start(
        &s,
        &json!({"language": "python", "code": "import sys\nprint(sys.argv, __name__, __file__)\nraise KeyError('k')\n", "tools": []}),
    );
    assert_eq!(
        r["stdout"], "['/run/sandcall/main.py'] __main__ /run/sandcall/main.py\n",
        "{r}"
    );
    let err = r["stderr"].as_str().unwrap();
    assert!(err.contains("line 3") && err.contains("KeyError"), "{err}");
    assert!(!err.contains("runner.py"), "{err}");
    let r = start(
        &s,
        &json!({"language": "bash", "code": "echo one\nnot_a_command_xyz\n", "tools": [rate_tool()]}),
    );
    assert!(r["stderr"].as_str().unwrap().contains("line 2"), "{r}");
}

#[test]
fn large_results_reach_the_program_whole() {
    let s = Server::start();
    let big = "x".repeat(3_000_000);
    let tool = json!({"name": "fetch", "parameters": {"type": "object"}});
    for (language, code) in [
        ("python", "r = fetch()\nprint(len(r), r[:3])"),
        ("bash", "r=$(fetch)\necho ${#r} ${r:0:3}"),
    ] {
        let out = drive(
            &s,
            &json!({"language": language, "code": code, "tools": [tool]}),
            |_, _| ok(json!(big)),
        );
        assert_eq!(out.last["status"], "completed", "{language}: {}", out.last);
        assert_eq!(
            out.last["stdout"], "3000000 xxx\n",
            "{language}: {}",
            out.last["stderr"]
        );
    }
}

#[test]
fn a_call_made_while_paused_is_handed_out_at_the_next_pause() {
    let s = Server::start();
    // Two threads call at nearly the same time; whichever comes second may arrive while
    // the session is already paused on the first. Both must reach the caller.
    let code = src(&[
        "import threading",
        "out = {}",
        "def work(n):",
        "    out[n] = double(x=n)",
        "ts = [threading.Thread(target=work, args=(n,)) for n in (1, 2)]",
        "[t.start() for t in ts]",
        "[t.join() for t in ts]",
        "print(sorted(out.items()))",
    ]);
    let tool = json!({"name": "double", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}});
    for _ in 0..3 {
        let out = drive(
            &s,
            &json!({"code": code, "tools": [tool], "timeout": 20000}),
            |_, args| ok(json!(args["x"].as_i64().unwrap() * 2)),
        );
        assert_eq!(out.last["status"], "completed", "{}", out.last);
        assert_eq!(out.last["stdout"], "[(1, 2), (2, 4)]\n", "{}", out.last);
        assert_eq!(out.last["tool_calls_made"], 2);
    }
    // Bash: a background call started after the first pause.
    let code = "double x=1 > /tmp/a &\nsleep 0.3\ndouble x=2 > /tmp/b\nwait\ncat /tmp/a /tmp/b\n";
    let out = drive(
        &s,
        &json!({"language": "bash", "code": code, "tools": [tool], "timeout": 20000}),
        |_, args| ok(json!(args["x"].as_i64().unwrap() * 2)),
    );
    assert_eq!(out.last["stdout"], "2\n4\n", "{}", out.last);
}

// ---------------------------------------------------------------------------
// Programmatic calls as LibreChat's client makes them (issue 11, item 4)
// ---------------------------------------------------------------------------

/// The answer every call of these tests gets: the call's own arguments, echoed.
fn echo_args(_: &str, args: &Value) -> Answer {
    ok(args.clone())
}

#[test]
fn python_programs_start_with_asyncio_json_os_sys() {
    // Written as LibreChat's tool description teaches: no import at all.
    let s = Server::start();
    let body = json!({
        "lang": "py",
        "code": src(&[
            "results: List[Any] = await asyncio.gather(lookup(q='a'), lookup(q='b'))",
            "print(json.dumps(results), os.getcwd(), sys.argv[0].endswith('main.py'))",
            "assert ToolExecutionError is ToolError and Optional[Dict[str, Union[int, str]]]",
        ]),
        "tools": [tool("lookup", json!({"q": {"type": "string"}}), &["q"])],
        "timeout": 15000,
    });
    let out = drive(&s, &body, |_, args| {
        ok(json!(format!("hit-{}", args["q"].as_str().unwrap())))
    });
    assert_eq!(out.rounds, 1, "the gathered calls arrive together: {:?}", out.pauses);
    assert_completed_shape(&out.last);
    assert_eq!(
        out.last["stdout"], "[\"hit-a\", \"hit-b\"] /mnt/data True\n",
        "{}",
        out.last
    );
}

#[test]
fn tool_names_follow_the_code_interpreter_rules_and_keep_their_old_names() {
    let s = Server::start();
    // Python: `-` becomes `_`, `.` is dropped; sandcall's earlier name (`.` as `_`)
    // still calls the tool. A keyword gets `_tool`.
    let body = json!({
        "language": "python",
        "code": src(&[
            "a = files_read_v2(path='x')",
            "b = filesread_v2(path='y')",
            "c = import_tool(path='z')",
            "print(a['path'], b['path'], c['path'])",
        ]),
        "tools": [
            tool("files.read-v2", json!({"path": {"type": "string"}}), &["path"]),
            tool("import", json!({"path": {"type": "string"}}), &["path"]),
        ],
    });
    let out = drive(&s, &body, echo_args);
    assert_completed_shape(&out.last);
    assert_eq!(out.last["stdout"], "x y z\n", "{}", out.last);
    let names: Vec<&str> = out.calls.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        vec!["files.read-v2", "files.read-v2", "import"],
        "declared names"
    );

    // Bash: `-` and `.` become `_`; the earlier name (with `-` and `.`) still works; a
    // builtin's name gets `_tool`, and the builtin itself is untouched.
    let body = json!({
        "language": "bash",
        "code": src(&[
            "get_rate_v2 base=USD",
            "get-rate.v2 base=EUR",
            "echo_tool text=hi",
            "echo plain-echo",
            "_ptc_x_tool n=1",
        ]),
        "tools": [
            tool("get-rate.v2", json!({"base": {"type": "string"}}), &["base"]),
            tool("echo", json!({"text": {"type": "string"}}), &["text"]),
            tool("_ptc_x", json!({"n": {"type": "integer"}}), &["n"]),
        ],
    });
    let out = drive(&s, &body, |name, args| ok(json!(format!("{name}:{args}"))));
    assert_completed_shape(&out.last);
    assert_eq!(
        out.last["stdout"],
        "get-rate.v2:{\"base\":\"USD\"}\nget-rate.v2:{\"base\":\"EUR\"}\necho:{\"text\":\"hi\"}\nplain-echo\n_ptc_x:{\"n\":1}\n",
        "{}",
        out.last
    );

    // Two tools that normalise to one name: 400, nothing started.
    for pair in [["get-rate", "get_rate"], ["a.b", "a-b"], ["x y", "x_y"]] {
        let (code, v) = s.post(
            ROUTE,
            &json!({"code": "pass", "tools": [tool(pair[0], json!({}), &[]), tool(pair[1], json!({}), &[])]}),
        );
        assert_api_error(code, &v, 400, "invalid_tool_schema");
        assert!(v["error"].as_str().unwrap().contains("same name"), "{v}");
    }
}

#[test]
fn python_stubs_take_positional_arguments() {
    let s = Server::start();
    // The schema lists optional `limit` before required `query`: positional order is
    // required first (schema order), then optional. The order is the text's, so the
    // body is sent as written (serde_json's maps would sort the keys).
    let search = r#"{"name": "search", "parameters": {"type": "object",
        "properties": {"limit": {"type": "integer"}, "query": {"type": "string"}, "lang": {"type": "string"}},
        "required": ["query"]}}"#;
    let code = src(&[
        "print(search('q1'))",
        "print(search('q2', 5))",
        "print(search('q3', None, 'de'))",
        "print(search(query='q4', limit=None))",
        "print(search({'query': 'q5', 'limit': 1}))",
        "print(search('q6', lang='fr'))",
        "try:",
        "    search('a', 1, 'b', 'extra')",
        "except TypeError as e:",
        "    print('TypeError', 'at most 3' in str(e))",
        "try:",
        "    search('a', query='b')",
        "except TypeError as e:",
        "    print('TypeError', 'multiple values' in str(e))",
    ]);
    let raw = format!(
        r#"{{"language": "python", "code": {}, "tools": [{search}]}}"#,
        json!(code)
    );
    let (status, _, first) = s.request("POST", ROUTE, Some("application/json"), Some(&raw));
    assert_eq!(status, 200, "{first}");
    let out = drive_from(&s, first, |_, args| ok(json!(args.to_string())));
    assert_completed_shape(&out.last);
    let args: Vec<Value> = out.calls.iter().map(|c| c["arguments"].clone()).collect();
    assert_eq!(
        args,
        vec![
            json!({"query": "q1"}),
            json!({"query": "q2", "limit": 5}),
            json!({"query": "q3", "lang": "de"}),
            json!({"query": "q4"}),
            json!({"query": "q5", "limit": 1}),
            json!({"query": "q6", "lang": "fr"}),
        ]
    );
    let stdout = out.last["stdout"].as_str().unwrap();
    assert!(stdout.ends_with("TypeError True\nTypeError True\n"), "{stdout}");
}

#[test]
fn schemas_as_librechat_writes_them_are_accepted() {
    let s = Server::start();
    let body = json!({
        "language": "python",
        "code": src(&[
            "print(convert(amount=1.5, times=2))",
            "try:",
            "    convert(amount='lots', times=2)",
            "except ToolError as e:",
            "    print('refused', 'do not match' in str(e))",
        ]),
        "tools": [tool("convert", json!({"amount": {"type": "float"}, "times": {"type": "int"}}), &["amount"])],
    });
    let out = drive(&s, &body, |_, args| ok(json!(args["amount"].as_f64().unwrap() * 2.0)));
    assert_completed_shape(&out.last);
    assert_eq!(out.last["stdout"], "3.0\nrefused True\n", "{}", out.last);
    assert_eq!(out.calls.len(), 1, "the refused call never reaches the caller");
}

#[test]
fn a_resume_may_answer_some_of_the_pending_calls() {
    let s = Server::start();
    let body = json!({
        "language": "python",
        "code": src(&[
            "r = await asyncio.gather(t(n=1), t(n=2), t(n=3))",
            "print(r)",
        ]),
        "tools": [tool("t", json!({"n": {"type": "integer"}}), &["n"])],
    });
    let first = start(&s, &body);
    assert_paused_shape(&first);
    let calls = first["tool_calls"].as_array().unwrap().clone();
    assert_eq!(calls.len(), 3, "{first}");
    let by_n = |n: i64| calls.iter().find(|c| c["arguments"]["n"] == n).unwrap().clone();

    // Answer only n=2: the next pause lists the other two, under their ids, with a new
    // token.
    let (code, second) = resume(&s, &first, json!([ok_result(&by_n(2)["id"], json!(20))]));
    assert_eq!(code, 200, "{second}");
    assert_paused_shape(&second);
    assert_ne!(second["continuation_token"], first["continuation_token"]);
    let mut left: Vec<String> = second["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect();
    left.sort();
    let mut want = vec![
        by_n(1)["id"].as_str().unwrap().to_owned(),
        by_n(3)["id"].as_str().unwrap().to_owned(),
    ];
    want.sort();
    assert_eq!(left, want, "{second}");

    // A retry of the partial resume answers the same pause again.
    let (code, again) = resume(&s, &first, json!([ok_result(&by_n(2)["id"], json!(20))]));
    assert_eq!(code, 200, "{again}");
    assert_eq!(again, second);

    // The answered call cannot be answered again; the others can.
    let (code, v) = resume(&s, &second, json!([ok_result(&by_n(2)["id"], json!(0))]));
    assert_api_error(code, &v, 400, "invalid_tool_results");
    let (code, third) = resume(&s, &second, json!([ok_result(&by_n(3)["id"], json!(30))]));
    assert_eq!(code, 200, "{third}");
    assert_paused_shape(&third);
    assert_eq!(third["tool_calls"].as_array().unwrap().len(), 1, "{third}");
    assert_eq!(third["tool_calls"][0]["id"], by_n(1)["id"]);
    let (code, done) = resume(&s, &third, json!([ok_result(&by_n(1)["id"], json!(10))]));
    assert_eq!(code, 200, "{done}");
    assert_completed_shape(&done);
    assert_eq!(done["stdout"], "[10, 20, 30]\n", "{done}");
    assert_eq!(done["tool_calls_made"], 3, "{done}");
}

#[test]
fn an_ended_session_answers_its_ending() {
    let s = Server::start();
    let body = json!({"language": "python", "code": "print(get_exchange_rate(base='USD', quote='EUR'))", "tools": [rate_tool()]});
    let first = start(&s, &body);
    assert_paused_shape(&first);
    let (code, cancelled) = s.post(&format!("{ROUTE}/cancel"), &json!({"session_id": first["session_id"]}));
    assert_eq!(code, 200, "{cancelled}");
    assert_eq!(cancelled["error_type"], "cancelled", "{cancelled}");
    // The client's resume after that (and its retry) gets the ending, 200, not 409.
    for _ in 0..2 {
        let (code, v) = resume(&s, &first, json!([ok_result(&first["tool_calls"][0]["id"], json!(1))]));
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["status"], "error", "{v}");
        assert_eq!(v["error_type"], "cancelled", "{v}");
        assert_eq!(v, cancelled);
    }
}

#[test]
fn cancel_by_request_id() {
    let keys = "alice:key-a-0123456789abcdef,bob:key-b-0123456789abcdef";
    let s = Server::start_with(&[("SANDCALL_API_KEYS", keys)], "");
    let alice = ("X-API-Key", "key-a-0123456789abcdef");
    let bob = ("X-API-Key", "key-b-0123456789abcdef");
    let cancel = format!("{ROUTE}/cancel");
    let body = json!({"language": "python", "code": "print(get_exchange_rate(base='USD', quote='EUR'))", "tools": [rate_tool()], "timeout": 15000});
    let (code, first) = s.post_with(ROUTE, &body, &[alice, ("X-LibreChat-Code-Request-ID", "req-42")]);
    assert_eq!(code, 200, "{first}");
    assert_paused_shape(&first);

    // Another principal's request id, an unknown one: 404; neither field: 400.
    let (code, v) = s.post_with(&cancel, &json!({"request_id": "req-42"}), &[bob]);
    assert_api_error(code, &v, 404, "session_not_found");
    let (code, v) = s.post_with(&cancel, &json!({"request_id": "req-43"}), &[alice]);
    assert_api_error(code, &v, 404, "session_not_found");
    let (code, v) = s.post_with(&cancel, &json!({}), &[alice]);
    assert_api_error(code, &v, 400, "invalid_request");

    // LibreChat's abort: only the request id.
    let (code, v) = s.post_with(&cancel, &json!({"request_id": "req-42"}), &[alice]);
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["status"], "error", "{v}");
    assert_eq!(v["error_type"], "cancelled", "{v}");
    assert_eq!(v["session_id"], first["session_id"]);

    // The client sends a fresh id with each request: a resume's id names the session
    // from then on, in place of the start's.
    let body = json!({"language": "python", "code": "for i in range(2): get_exchange_rate(base='USD', quote='EUR')", "tools": [rate_tool()]});
    let (code, first) = s.post_with(ROUTE, &body, &[alice, ("X-LibreChat-Code-Request-ID", "start-1")]);
    assert_eq!(code, 200, "{first}");
    let resume_body = json!({
        "continuation_token": first["continuation_token"],
        "tool_results": [ok_result(&first["tool_calls"][0]["id"], json!(1))],
    });
    let (code, second) = s.post_with(
        ROUTE,
        &resume_body,
        &[alice, ("X-LibreChat-Code-Request-ID", "resume-1")],
    );
    assert_eq!(code, 200, "{second}");
    assert_paused_shape(&second);
    let (code, v) = s.post_with(&cancel, &json!({"request_id": "start-1"}), &[alice]);
    assert_api_error(code, &v, 404, "session_not_found");
    let (code, v) = s.post_with(&cancel, &json!({"request_id": "resume-1"}), &[alice]);
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["error_type"], "cancelled", "{v}");
    assert_eq!(v["session_id"], first["session_id"]);

    // A request id that is too long is refused at the start.
    let long = "x".repeat(257);
    let (code, v) = s.post_with(ROUTE, &body, &[alice, ("X-LibreChat-Code-Request-ID", &long)]);
    assert_api_error(code, &v, 400, "invalid_request");
}

#[test]
fn results_up_to_5_mib_reach_the_program() {
    let s = Server::start();
    let body = json!({
        "language": "python",
        "code": "r = fetch(); print(len(r), r[:3])\n",
        "tools": [tool("fetch", json!({}), &[])],
    });
    let first = start(&s, &body);
    assert_paused_shape(&first);
    let call = &first["tool_calls"][0]["id"];
    // Over 5 MiB: 413, and the token stays good.
    let too_big = "y".repeat(5 * 1024 * 1024);
    let (code, v) = resume(&s, &first, json!([ok_result(call, json!(too_big))]));
    assert_api_error(code, &v, 413, "payload_too_large");
    assert!(v["error"].as_str().unwrap().contains("max_tool_result_bytes"), "{v}");
    // 5 MiB of JSON text, the quotes included.
    let big = "x".repeat(5 * 1024 * 1024 - 2);
    let (code, done) = resume(&s, &first, json!([ok_result(call, json!(big))]));
    assert_eq!(code, 200, "{done}");
    assert_completed_shape(&done);
    assert_eq!(done["stdout"], format!("{} xxx\n", 5 * 1024 * 1024 - 2), "{done}");
}

/// Answers each call after `delay`, as a slow tool would.
fn slow(delay: Duration) -> impl FnMut(&str, &Value) -> Answer {
    move |_, args| {
        std::thread::sleep(delay);
        ok(args.clone())
    }
}

#[test]
fn timeout_stops_while_paused() {
    // LibreChat's case: three 2-second tools in sequence, `timeout: 5000`.
    let s = Server::start();
    let body = json!({
        "language": "python",
        "code": src(&[
            "for i in range(3):",
            "    print(slow_tool(i=i)['i'])",
        ]),
        "tools": [tool("slow_tool", json!({"i": {"type": "integer"}}), &["i"])],
        "timeout": 5000,
    });
    let t = Instant::now();
    let out = drive(&s, &body, slow(Duration::from_secs(2)));
    assert!(t.elapsed() >= Duration::from_secs(6), "{:?}", t.elapsed());
    assert_completed_shape(&out.last);
    assert_eq!(out.last["stdout"], "0\n1\n2\n", "{}", out.last);
    assert_eq!(out.rounds, 3);

    // The same with Bash tools and background jobs.
    let body = json!({
        "language": "bash",
        "code": src(&["slow_tool i=0", "slow_tool i=1 & slow_tool i=2 & wait", "slow_tool i=3"]),
        "tools": [tool("slow_tool", json!({"i": {"type": "integer"}}), &["i"])],
        "timeout": 3000,
    });
    let out = drive(&s, &body, slow(Duration::from_millis(2000)));
    assert_completed_shape(&out.last);
    assert_eq!(out.last["tool_calls_made"], 4, "{}", out.last);

    // The program's own running time still counts: spinning between calls is cut.
    let body = json!({
        "language": "python",
        "code": src(&[
            "import time",
            "for i in range(3):",
            "    slow_tool(i=i)",
            "    end = time.monotonic() + 1.5",
            "    while time.monotonic() < end: pass",
            "print('never')",
        ]),
        "tools": [tool("slow_tool", json!({"i": {"type": "integer"}}), &["i"])],
        "timeout": 3750,
    });
    let out = drive(&s, &body, slow(Duration::from_millis(500)));
    assert_eq!(out.last["status"], "error", "{}", out.last);
    assert_eq!(out.last["error_type"], "timeout", "{}", out.last);
    assert_eq!(out.rounds, 3, "spins of 1.5 s pass 3.75 s in the third: {}", out.last);
}

#[test]
fn loop_timeout_and_the_loop_scope_count_the_waits() {
    let body = |extra: Value| {
        let mut b = json!({
            "language": "python",
            "code": src(&["for i in range(3):", "    slow_tool(i=i)", "print('done')"]),
            "tools": [tool("slow_tool", json!({"i": {"type": "integer"}}), &["i"])],
            "timeout": 5000,
        });
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    // `loop_timeout` on the request; 0 is refused.
    let s = Server::start();
    let (code, v) = s.post(ROUTE, &body(json!({"loop_timeout": 0})));
    assert_api_error(code, &v, 400, "invalid_request");
    let t = Instant::now();
    let out = drive(&s, &body(json!({"loop_timeout": 3000})), slow(Duration::from_secs(2)));
    assert_eq!(out.last["status"], "error", "{}", out.last);
    assert_eq!(out.last["error_type"], "timeout", "{}", out.last);
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    drop(s);

    // The server's setting: `timeout` is the whole loop's.
    let s = Server::start_with(&[("SANDCALL_PROGRAMMATIC_TIMEOUT_SCOPE", "loop")], "");
    let out = drive(&s, &body(json!({})), slow(Duration::from_secs(2)));
    assert_eq!(out.last["status"], "error", "{}", out.last);
    assert_eq!(out.last["error_type"], "timeout", "{}", out.last);
    assert!(out.rounds >= 2 && out.rounds <= 3, "{}", out.rounds);
}

#[test]
fn concurrent_retries_with_the_same_results_get_the_same_answer() {
    let s = Server::start();
    for round in 0..3 {
        let first = start(
            &s,
            &json!({"language": "python", "code": "print(get_exchange_rate(base='USD', quote='EUR'))", "tools": [rate_tool()]}),
        );
        let call = first["tool_calls"][0]["id"].clone();
        let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..3)
                .map(|_| {
                    let (s, first, call) = (&s, &first, &call);
                    scope.spawn(move || resume(s, first, json!([ok_result(call, json!(0.5))])))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (code, v) in &answers {
            assert_eq!(*code, 200, "round {round}: {answers:?}");
            assert_eq!(*v, answers[0].1, "round {round}: every retry gets the one answer");
        }
        assert_eq!(answers[0].1["status"], "completed", "{}", answers[0].1);
        assert_eq!(answers[0].1["stdout"], "0.5\n", "{}", answers[0].1);
    }
}

#[test]
fn bash_background_calls_may_be_answered_in_parts() {
    let s = Server::start();
    let body = json!({
        "language": "bash",
        "code": src(&[
            "get_rate base=USD > /tmp/a & get_rate base=GBP > /tmp/b & wait",
            "cat /tmp/a /tmp/b",
        ]),
        "tools": [tool("get-rate", json!({"base": {"type": "string"}}), &["base"])],
    });
    let first = start(&s, &body);
    assert_paused_shape(&first);
    let calls = first["tool_calls"].as_array().unwrap().clone();
    assert_eq!(calls.len(), 2, "{first}");
    let usd = calls.iter().find(|c| c["arguments"]["base"] == "USD").unwrap();
    let gbp = calls.iter().find(|c| c["arguments"]["base"] == "GBP").unwrap();
    let (code, second) = resume(&s, &first, json!([ok_result(&usd["id"], json!("rate-USD"))]));
    assert_eq!(code, 200, "{second}");
    assert_paused_shape(&second);
    assert_eq!(second["tool_calls"].as_array().unwrap().len(), 1, "{second}");
    assert_eq!(second["tool_calls"][0]["id"], gbp["id"], "{second}");
    assert_eq!(second["tool_calls"][0]["name"], "get-rate", "{second}");
    let (code, done) = resume(&s, &second, json!([ok_result(&gbp["id"], json!("rate-GBP"))]));
    assert_eq!(code, 200, "{done}");
    assert_completed_shape(&done);
    assert_eq!(done["stdout"], "rate-USD\nrate-GBP\n", "{done}");
}
