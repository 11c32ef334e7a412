//! Time limits: a tool call the caller never answers, `timeout` and `loop_timeout` with the
//! waits for the caller counted or not, and a paused session that is never resumed,
//! reclaimed when it expires.

use super::support::{
    assert_api_error, assert_completed_shape, assert_paused_shape, background_sleep, drive, ok, ok_result, rate_tool,
    resume, session_id, src, start, tool, wait_for_outcome, wait_until_reclaimed, Answer, ROUTE,
};
use crate::common::{descendants, run_cgroups, Server, NO_POOL};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

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
        crate::common::program_running(&s, &marker),
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
    // LibreChat's client matches `error` exactly ("Time limit exceeded"), and shows the
    // model stderr, which ends with the `[sandbox]` line.
    assert_eq!(r["error"], "Time limit exceeded", "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .is_some_and(|e| e.ends_with("[sandbox] Time limit exceeded\n")),
        "{r}"
    );
    wait_until_reclaimed(&s, None, Duration::from_secs(10));
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

    // The program's own running time still counts: spinning between calls is cut, in
    // the third spin (4.5 s of spinning against 4.4), whatever the interpreter's start
    // and the pauses' crossings take up to 1.4 s (a cold start in gVisor, under load).
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
        "timeout": 4400,
    });
    let out = drive(&s, &body, slow(Duration::from_millis(500)));
    assert_eq!(out.last["status"], "error", "{}", out.last);
    assert_eq!(out.last["error_type"], "timeout", "{}", out.last);
    assert_eq!(out.rounds, 3, "spins of 1.5 s pass 4.4 s in the third: {}", out.last);
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
