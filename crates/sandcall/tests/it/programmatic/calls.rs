//! The call-and-answer loop: a program pauses at each tool call (one call, a chain, a
//! gather of several), the caller's results or errors reach it whole, the output so far
//! comes with each pause, and fifty sessions run side by side without crossing.

use super::support::{
    assert_api_error, assert_completed_shape, assert_paused_shape, drive, drive_from, fail, ok, ok_result, rate_tool,
    resume, session_id, src, start, state, tool, usd_eur, wait_until_reclaimed,
};
use crate::common::{Server, NO_POOL};
use crate::files::assert_nanoid;
use serde_json::{json, Value};
use std::time::Duration;

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
        // In the gvisor tier each session starts a gVisor sandbox, and Python in it, from
        // nothing, several times the CPU of a namespace sandbox's start: fifty at once
        // outlast the client's wait on two cores, twelve load them about as much.
        let sessions = if crate::common::gvisor_pass() { 12 } else { 50 };
        let handles: Vec<_> = (0..sessions)
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
            assert_eq!(out.rounds, 10, "session {i}: {}", out.last);
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
