//! What is refused before a call reaches the caller: arguments that do not match the
//! schema, calls over the request's or the server's budget or size, undeclared tools, and
//! tool schemas that cannot be checked (a circular $ref); schemas as LibreChat writes them
//! are accepted.

use super::support::{assert_api_error, assert_completed_shape, drive, ok, rate_tool, src, tool, usd_eur, ROUTE};
use crate::common::{run_cgroups, Server, NO_POOL};
use serde_json::{json, Value};

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
