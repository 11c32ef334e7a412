//! JavaScript and TypeScript (Node) over HTTP: the same sandbox, limits, warm pool and
//! files as Python, and programs that call tools. TypeScript's transpiler is the one in
//! the managed npm set (`sandcall runtime install`, which .ci/run runs into
//! SANDCALL_RUNTIME_DIR): no server here sets `typescript_transpiler`.

use crate::common::Server;
use crate::files::{download_output, Client};
use serde_json::{json, Value};

/// A server that runs TypeScript (with nothing but the managed npm set for it); `warm`
/// gives JavaScript and TypeScript warm sets of that size.
pub fn node_server(warm: usize) -> Server {
    Server::start_with(
        &[
            ("SANDCALL_WARM_POOL_SIZE", &warm.to_string()),
            ("SANDCALL_WARM_LANGUAGES", r#"["javascript","typescript"]"#),
        ],
        "",
    )
}

fn run(s: &Server, lang: &str, code: &str) -> Value {
    s.exec(json!({"lang": lang, "code": code}))
}

#[test]
fn javascript_and_typescript_hello_world_under_every_alias() {
    let s = node_server(0);
    for lang in ["js", "javascript", "node", "JS"] {
        let r = run(&s, lang, "console.log('hello from', process.argv[1])");
        assert_eq!(r["status"], "ok", "{lang}: {r}");
        assert_eq!(r["stdout"], "hello from /run/sandcall/main.mjs\n", "{lang}: {r}");
        assert_eq!(r["stderr"], "", "{r}");
    }
    for lang in ["ts", "typescript"] {
        let r = run(
            &s,
            lang,
            "const who: string = 'ts';\nconsole.log(`hello from ${who}`, process.argv[1])",
        );
        assert_eq!(r["status"], "ok", "{lang}: {r}");
        assert_eq!(r["stdout"], "hello from ts /run/sandcall/main.ts\n", "{lang}: {r}");
    }
}

#[test]
fn exit_codes_stderr_stdin_and_args() {
    let s = node_server(0);
    for lang in ["js", "ts"] {
        let r = run(&s, lang, "console.log('out');\nconsole.error('err');\nprocess.exit(3);");
        assert_eq!(r["status"], "failed", "{r}");
        assert_eq!(r["exit_code"], 3, "{r}");
        assert_eq!(r["stdout"], "out\n", "{r}");
        assert_eq!(r["stderr"], "err\n", "{r}");
        let r = s.exec(json!({
            "lang": lang,
            "code": "const fs = require('fs');\nconst input = fs.readFileSync(0, 'utf8');\nconsole.log(input.toUpperCase().trim(), JSON.stringify(process.argv.slice(2)));",
            "stdin": "line one\nline two\n",
            "args": ["a", "b c", "--flag"],
        }));
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["stdout"], "LINE ONE\nLINE TWO [\"a\",\"b c\",\"--flag\"]\n", "{r}");
    }
}

#[test]
fn an_uncaught_error_points_at_the_users_line() {
    let s = node_server(0);
    let r = run(
        &s,
        "js",
        "const a = 1;\n\nfunction f() {\n  throw new Error('boom ' + a);\n}\nf();\n",
    );
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["exit_code"], 1, "{r}");
    let err = r["stderr"].as_str().unwrap();
    assert!(err.starts_with("Error: boom 1\n"), "{err}");
    assert!(err.contains("at f (file:///run/sandcall/main.mjs:4:9)"), "{err}");
    assert!(err.contains("file:///run/sandcall/main.mjs:6:1"), "{err}");
    assert!(
        !err.contains("runner") && !err.contains("[eval1]"),
        "the runner shows: {err}"
    );
    // TypeScript: the types and the interface take lines, which still count.
    let code = "interface Point {\n  x: number;\n  y: number;\n}\nconst p: Point = { x: 1, y: 2 };\nif (p.x < p.y) {\n  throw new TypeError(`bad point ${p.x}`);\n}\n";
    let r = run(&s, "ts", code);
    assert_eq!(r["status"], "failed", "{r}");
    let err = r["stderr"].as_str().unwrap();
    assert!(err.starts_with("TypeError: bad point 1\n"), "{err}");
    assert!(err.contains("/run/sandcall/main.ts:7:9"), "{err}");
    // A syntax error says where.
    let r = run(&s, "ts", "const ok = 1;\nlet x: = 3;\n");
    assert_eq!(r["status"], "failed", "{r}");
    assert!(
        r["stderr"].as_str().unwrap().contains("/run/sandcall/main.ts:2:"),
        "{r}"
    );
    let r = run(&s, "js", "const ok = 1;\nlet = = 3;\n");
    assert_eq!(r["status"], "failed", "{r}");
    assert!(r["stderr"].as_str().unwrap().contains("SyntaxError"), "{r}");
    // A value that is not an Error, thrown later from a timer.
    let r = run(&s, "js", "setTimeout(() => { throw 'late'; }, 5);");
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["stderr"], "Uncaught 'late'\n", "{r}");
}

#[test]
fn typescript_interfaces_types_and_imports() {
    let s = node_server(0);
    let code = "import path from 'node:path';\nimport { createHash } from 'crypto';\ninterface Row { name: string; n: number }\ntype Total = { [k: string]: number };\nenum Kind { A = 1, B }\nconst rows: Row[] = [{ name: 'a', n: 1 }, { name: 'a', n: 2 }];\nconst total: Total = {};\nfor (const r of rows) total[r.name] = (total[r.name] ?? 0) + r.n;\nfunction id<T>(x: T): T { return x; }\nconsole.log(JSON.stringify(total), Kind.B, id<string>(path.basename('/x/y.txt')), createHash('sha256').update('').digest('hex').slice(0, 8));\n";
    let r = run(&s, "ts", code);
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "{\"a\":3} 2 y.txt e3b0c442\n", "{r}");
    // The program may declare names the CommonJS wrapper also has (but not `require`,
    // which its imports become); it runs in strict mode.
    let code = "import { createRequire } from 'node:module';\nconst load = createRequire('/run/sandcall/main.ts');\nconst module: { name: string } = { name: 'm' };\nconst exports = 1;\nconsole.log(typeof load('node:fs').readFileSync, module.name, (function (this: unknown) { return this === undefined; })());\n";
    let r = run(&s, "ts", code);
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "function m true\n", "{r}");
}

#[test]
fn top_level_await_and_require() {
    let s = node_server(0);
    let code = "const { setTimeout: sleep } = require('node:timers/promises');\nconst v = await sleep(20, 'waited');\nconst os = await import('node:os');\nconsole.log(v, typeof os.cpus);";
    for lang in ["js", "ts"] {
        let r = run(&s, lang, code);
        assert_eq!(r["status"], "ok", "{lang}: {r}");
        assert_eq!(r["stdout"], "waited function\n", "{lang}: {r}");
    }
}

#[test]
fn warm_and_cold_runs_are_the_same() {
    let s = node_server(1);
    let code = "const fs = require('fs');\nconsole.log(process.argv.slice(1).join(' '), process.cwd(), Object.keys(process.env).filter(k => k.startsWith('SANDCALL')).length, fs.readdirSync('/run/sandcall').filter(f => f.startsWith('main')).join());\nconsole.error('to stderr');\nprocess.exitCode = 4;";
    for lang in ["js", "ts"] {
        let file = if lang == "js" { "main.mjs" } else { "main.ts" };
        let mut seen = Vec::new();
        for custom in [false, true] {
            s.wait_warm(2);
            let mut body = json!({"lang": lang, "code": code, "args": ["x", "y z"]});
            if custom {
                // Limits other than the defaults take the cold path.
                body["limits"] = json!({"memory_limit_mb": 400});
            }
            let (kind, r) = s.exec_kind(&body.to_string());
            assert_eq!(kind, if custom { "cold" } else { "warm" }, "{r}");
            assert_eq!(r["exit_code"], 4, "{kind}: {r}");
            assert_eq!(
                r["stdout"],
                format!("/run/sandcall/{file} x y z /mnt/data 0 {file}\n"),
                "{kind}: {r}"
            );
            assert_eq!(r["stderr"], "to stderr\n", "{kind}: {r}");
            seen.push((r["stdout"].clone(), r["stderr"].clone(), r["exit_code"].clone()));
        }
        assert_eq!(seen[0], seen[1]);
    }
}

#[test]
fn a_warm_start_takes_large_non_ascii_arguments_whole() {
    // The go line is read in 64 KiB pieces: a character split between two must survive.
    let s = node_server(1);
    let arg = format!("x{}", "é€".repeat(30_000));
    for lang in ["js", "ts"] {
        s.wait_warm(2);
        let body = json!({"lang": lang, "code": "const a = process.argv[2];\nconsole.log(a.length, a === 'x' + 'é€'.repeat(30000));", "args": [arg]});
        let (kind, r) = s.exec_kind(&body.to_string());
        assert_eq!(kind, "warm", "{r}");
        assert_eq!(r["stdout"], "60001 true\n", "{lang}: {r}");
    }
}

#[test]
fn files_in_and_out() {
    let s = node_server(0);
    let c = Client::anonymous(&s);
    // In: an uploaded file is in the working directory; out: what the program writes
    // there comes back as a file.
    let up = c.upload("data.csv", "text/csv", b"a,b\n1,2\n3,4\n");
    let r = c.exec(json!({
        "lang": "ts",
        "code": "import fs from 'fs';\nconst rows: string[] = fs.readFileSync('data.csv', 'utf8').trim().split('\\n').slice(1);\nconst sum = rows.map(r => r.split(',').map(Number)).reduce((t, [a, b]) => t + a * b, 0);\nfs.writeFileSync('sum.txt', String(sum));\nconsole.log(sum);",
        "files": [up.input("data.csv")],
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "14\n", "{r}");
    assert_eq!(download_output(&c, &r, "sum.txt"), b"14");
}

/// Starts a programmatic session and answers each pause with `answer` until it ends;
/// returns every pause and the last response.
fn drive(s: &Server, body: &Value, mut answer: impl FnMut(&Value) -> Value) -> (Vec<Value>, Value) {
    let (status, mut r) = s.post("/v1/exec/programmatic", body);
    assert_eq!(status, 200, "{r}");
    let mut pauses = Vec::new();
    while r["status"] == "tool_call_required" {
        assert!(pauses.len() < 20, "runaway: {r}");
        let results: Vec<Value> = r["tool_calls"].as_array().unwrap().iter().map(&mut answer).collect();
        let (status, next) = s.post(
            "/v1/exec/programmatic",
            &json!({"session_id": r["session_id"], "continuation_token": r["continuation_token"], "tool_results": results}),
        );
        assert_eq!(status, 200, "{next}");
        pauses.push(r);
        r = next;
    }
    (pauses, r)
}

#[test]
fn js_and_ts_tools_promise_all_is_one_pause_and_errors_can_be_caught() {
    let s = node_server(1);
    let tools = json!([
        {"name": "get-rate", "description": "a rate", "parameters": {"type": "object", "properties": {"base": {"type": "string"}, "quote": {"type": "string"}}, "required": ["base", "quote"]}},
        {"name": "lookup", "description": "a lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}},
    ]);
    let js = "console.log('start');\nconst all = await Promise.all([get_rate({ base: 'USD', quote: 'EUR' }), get_rate({ base: 'USD', quote: 'GBP' }), lookup({ q: 'x' })]);\nconsole.log(JSON.stringify(all));\ntry {\n  await get_rate({ base: 'USD', quote: 'XXX' });\n} catch (e) {\n  console.log('caught', e instanceof Error, e instanceof ToolError, e.message);\n}\ntry {\n  await get_rate({ base: 'USD' });\n} catch (e) {\n  console.log('refused', e instanceof Error);\n}\nconsole.log(await lookup({ q: 'y' }));\n";
    let ts = format!(
        "interface Rate {{ base: string; quote: string }}\nconst r: Rate = {{ base: 'USD', quote: 'EUR' }};\n{js}"
    );
    for (lang, code) in [("js", js.to_owned()), ("ts", ts)] {
        let body = json!({"lang": lang, "code": code, "tools": tools});
        let (pauses, last) = drive(&s, &body, |call| {
            let args = &call["arguments"];
            let id = &call["id"];
            if args["quote"] == "XXX" {
                json!({"call_id": id, "result": null, "is_error": true, "error_message": "unknown currency XXX"})
            } else if call["name"] == "get-rate" {
                json!({"call_id": id, "result": format!("{}/{}", args["base"].as_str().unwrap(), args["quote"].as_str().unwrap()), "is_error": false})
            } else {
                json!({"call_id": id, "result": {"q": args["q"]}, "is_error": false})
            }
        });
        // The three calls of Promise.all come in one pause; then the failing call,
        // then the last lookup (the refused call never reaches the caller).
        let sizes: Vec<usize> = pauses
            .iter()
            .map(|p| p["tool_calls"].as_array().unwrap().len())
            .collect();
        assert_eq!(sizes, vec![3, 1, 1], "{lang}: {pauses:?}");
        assert_eq!(pauses[0]["partial_stdout"], "start\n", "{lang}");
        assert_eq!(last["status"], "completed", "{lang}: {last}");
        assert_eq!(
            last["stdout"],
            "start\n[\"USD/EUR\",\"USD/GBP\",{\"q\":\"x\"}]\ncaught true true unknown currency XXX\nrefused true\n{ q: 'y' }\n",
            "{lang}: {last}"
        );
        assert_eq!(last["exit_code"], 0, "{lang}: {last}");
        assert_eq!(last["tool_calls_made"], 5, "{lang}: {last}");
    }
}

#[test]
fn an_uncaught_tool_error_ends_the_program_with_the_users_line() {
    let s = node_server(0);
    let tools = json!([{"name": "boom", "description": "fails", "parameters": {"type": "object", "properties": {}}}]);
    let body = json!({"lang": "js", "code": "\nawait boom({});\nconsole.log('unreachable');\n", "tools": tools});
    let (pauses, last) = drive(
        &s,
        &body,
        |call| json!({"call_id": call["id"], "result": null, "is_error": true, "error_message": "it broke"}),
    );
    assert_eq!(pauses.len(), 1);
    assert_eq!(last["status"], "completed", "{last}");
    assert_eq!(last["exit_code"], 1, "{last}");
    let err = last["stderr"].as_str().unwrap();
    assert!(err.starts_with("ToolError: it broke\n"), "{err}");
    assert!(err.contains("/run/sandcall/main.mjs:2"), "{err}");
}

#[test]
fn without_node_js_and_ts_are_an_unsupported_capability_and_doctor_says_why() {
    let s = Server::start_with(&[("SANDCALL_NODE", "/nonexistent/node")], "");
    for (route, lang) in [
        ("/v1/exec", "js"),
        ("/v1/exec", "typescript"),
        ("/v1/exec/programmatic", "node"),
    ] {
        let (status, v) = s.post(route, &json!({"lang": lang, "code": "console.log(1)", "tools": []}));
        assert_eq!(status, 400, "{route} {lang}: {v}");
        assert_eq!(v["error_type"], "unsupported_language", "{v}");
        assert_eq!(v["code"], "unsupported_capability", "{v}");
        assert!(
            !v["error"].as_str().unwrap().contains("/nonexistent"),
            "a host path: {v}"
        );
    }
    // Python and Bash are untouched.
    assert_eq!(s.py("print(1)")["stdout"], "1\n");
    // doctor passes, and says what is missing.
    let dir = Server::new_dir();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .args(["doctor", "--data-dir"])
        .arg(dir.join("data"))
        .env("SANDCALL_NODE", "/nonexistent/node")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("- javascript: missing interpreter: its interpreter (/nonexistent/node) is not installed"),
        "{text}"
    );
    assert!(text.contains("[pass] sandbox trial run: bash, python ran"), "{text}");
    // With Node but no npm set (TypeScript's transpiler is in it), TypeScript alone is
    // refused, and doctor says which command adds it.
    // (An empty runtime directory, under target/: sandboxes replace /tmp.)
    let runtimes = Server::new_visible_dir();
    let runtimes = runtimes.to_str().unwrap();
    let s = Server::start_with(&[("SANDCALL_RUNTIME_DIR", runtimes)], "");
    let (status, v) = s.post("/v1/exec", &json!({"lang": "ts", "code": "console.log(1)"}));
    assert_eq!((status, &v["code"]), (400, &json!("unsupported_capability")), "{v}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .args(["doctor", "--data-dir"])
        .arg(dir.join("data"))
        .env("SANDCALL_RUNTIME_DIR", runtimes)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("- typescript: missing transpiler: ") && text.contains("(`sandcall runtime install` adds it"),
        "{text}"
    );
    assert!(text.contains("- javascript: ready (/usr/bin/node)"), "{text}");
    let r = s.exec(json!({"lang": "js", "code": "console.log(1)"}));
    assert_eq!(r["stdout"], "1\n", "{r}");
}
