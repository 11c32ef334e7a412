//! The tools as each language sees them: Python functions (positional arguments, the
//! names the Code Interpreter rules give them, the modules a program starts with) and
//! Bash commands (key=value or JSON arguments, background calls); errors and line numbers
//! are the program's own.

use super::support::{
    assert_api_error, assert_completed_shape, assert_paused_shape, drive, drive_from, fail, ok, ok_result, rate_tool,
    resume, src, start, tool, Answer, ROUTE,
};
use crate::common::Server;
use serde_json::{json, Value};

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
