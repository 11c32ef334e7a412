//! POST /v1/exec: what a well-behaved program gets back.

use crate::common::Server;
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn python_and_bash_hello_world() {
    let s = Server::start();
    let r = s.py("print('hello from python')");
    assert_eq!(r["status"], "ok");
    assert_eq!(r["stdout"], "hello from python\n");
    assert_eq!(r["stderr"], "");
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["code"], 0);
    assert_eq!(r["signal"], serde_json::Value::Null);
    assert_eq!(r["timed_out"], false);
    assert_eq!(r["oom_killed"], false);
    assert_eq!(r["files"], json!([]));
    assert!(r["memory_peak"].as_u64().unwrap() > 0, "{r}");
    assert!(r["execution_time"].as_u64().is_some() && r["execution_time"] == r["wall_time"]);
    assert!(r["cpu_time"].as_u64().is_some());
    let id = r["session_id"].as_str().unwrap();
    assert_eq!(id.len(), 21);
    assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));

    let r = s.bash("echo hello from $0 | tr a-z A-Z");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "HELLO FROM /RUN/SANDCALL/MAIN.SH\n");
}

#[test]
fn language_aliases_and_lang_field() {
    let s = Server::start();
    for (field, name, code) in [
        ("lang", "py", "print(1)"),
        ("language", "python3", "print(1)"),
        ("lang", "sh", "echo 1"),
        ("language", "bash", "echo 1"),
    ] {
        let r = s.exec(json!({field: name, "code": code}));
        assert_eq!(r["stdout"], "1\n", "{field}={name}: {r}");
    }
    // No language at all means Python; `language` wins over `lang`.
    assert_eq!(s.exec(json!({"code": "print(2)"}))["stdout"], "2\n");
    assert_eq!(
        s.exec(json!({"code": "echo 3", "language": "bash", "lang": "python"}))["stdout"],
        "3\n"
    );
}

#[test]
fn exit_codes_and_stderr() {
    let s = Server::start();
    let r = s.py("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)");
    assert_eq!(r["status"], "failed");
    assert_eq!(r["exit_code"], 3);
    assert_eq!(r["code"], 3);
    assert_eq!(r["stdout"], "out\n");
    assert_eq!(r["stderr"], "err\n");
    let r = s.bash("echo oops >&2; exit 42");
    assert_eq!(r["status"], "failed");
    assert_eq!(r["exit_code"], 42);
    assert_eq!(r["stderr"], "oops\n");
}

#[test]
fn stdin_and_args() {
    let s = Server::start();
    let r = s.exec(json!({"code": "import sys\nprint(sys.stdin.read().upper(), end='')\nprint(sys.argv[1:])", "stdin": "line one\nline two\n", "args": ["a", "b c", "--flag"]}));
    assert_eq!(r["stdout"], "LINE ONE\nLINE TWO\n['a', 'b c', '--flag']\n", "{r}");
    let r = s.exec(json!({"language": "bash", "code": "read x; echo \"got $x and $# args: $2\"", "stdin": "value\n", "args": ["1", "two"]}));
    assert_eq!(r["stdout"], "got value and 2 args: two\n");
    // A large stdin is fed completely.
    let big = "x".repeat(300_000);
    let r = s.exec(json!({"code": "import sys\nprint(len(sys.stdin.read()))", "stdin": big}));
    assert_eq!(r["stdout"], "300000\n");
}

#[test]
fn traceback_line_numbers_are_the_users_own() {
    let s = Server::start();
    let r = s.py("x = 1\ny = 2\nraise ValueError('line three')\n");
    assert_eq!(r["status"], "failed");
    let err = r["stderr"].as_str().unwrap();
    assert!(err.contains("line 3"), "{err}");
    assert!(err.contains("ValueError: line three"), "{err}");
    let r = s.bash("true\nfalse_command_here\n");
    assert!(r["stderr"].as_str().unwrap().contains("line 2"), "{r}");
}

#[test]
fn code_with_a_nul_byte_is_refused() {
    let s = Server::start();
    for language in ["python", "bash"] {
        let (status, v) = s.post(
            "/v1/exec",
            &serde_json::json!({"code": "print(1)\n\u{0}\n", "language": language}),
        );
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error_type"], "invalid_request");
        assert!(v["error"].as_str().unwrap().contains("NUL"), "{v}");
    }
}

#[test]
fn non_utf8_output_is_replaced() {
    let s = Server::start();
    let r = s.py("import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe end\\n')\nsys.stderr.buffer.write(b'\\xc3')");
    assert_eq!(r["stdout"], "ok \u{fffd}\u{fffd} end\n", "{r}");
    assert_eq!(r["stderr"], "\u{fffd}");
}

#[test]
fn hundred_megabytes_of_output_are_truncated_while_the_server_stays_responsive() {
    let s = Server::start();
    std::thread::scope(|scope| {
        let big = scope.spawn(|| {
            s.py("import sys\nchunk = b'y' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.buffer.write(chunk)\nsys.stderr.write('e' * 100000)\n")
        });
        // While 100 MB stream through the helper, the server answers other requests.
        std::thread::sleep(Duration::from_millis(50));
        let t = Instant::now();
        let (status, _, _) = s.request("GET", "/v1/health", None, None);
        assert_eq!(status, 200);
        assert!(t.elapsed() < Duration::from_secs(2), "health took {:?}", t.elapsed());
        let r = big.join().unwrap();
        assert_eq!(r["status"], "ok", "{}", r["stderr"]);
        assert_eq!(r["stdout"].as_str().unwrap().len(), 65536);
        assert_eq!(r["stdout_truncated"], true);
        // The cap holds for the program's bytes; what the model must know follows it.
        assert_eq!(
            r["stderr"].as_str().unwrap(),
            format!(
                "{}\n[sandbox] stdout length exceeded\n[sandbox] stderr truncated at 65536 bytes\n",
                "e".repeat(65536)
            )
        );
        assert_eq!(r["stderr_truncated"], true);
    });
    let r = s.py("print('short')");
    assert_eq!(r["stdout_truncated"], false);
}

#[test]
fn timeouts_hold_to_the_millisecond() {
    let s = Server::start();
    // What a run costs this server here, now, without a timeout: the baseline the
    // timed-out run's answer is measured against (a loaded machine, or the gvisor
    // tier, makes both slower alike).
    let t = Instant::now();
    let r = s.exec(json!({"language": "bash", "code": "true"}));
    let baseline = t.elapsed();
    assert_eq!(r["status"], "ok", "{r}");
    let t = Instant::now();
    let r = s.exec(json!({"language": "bash", "code": "sleep 30", "timeout": 350}));
    let elapsed = t.elapsed();
    assert_eq!(r["status"], "timed_out", "{r}");
    assert_eq!(r["timed_out"], true);
    assert_eq!(r["exit_code"], serde_json::Value::Null);
    assert_eq!(r["signal"], "SIGKILL");
    assert_eq!(r["stderr"], "[sandbox] Time limit exceeded\n", "the model reads why");
    let wall = r["execution_time"].as_u64().unwrap();
    // Not rounded up to a whole second, and not cut short.
    assert!((350..450).contains(&wall), "execution_time {wall}");
    // Answered once the program is killed: the 350 ms, and at most 600 ms more than a
    // plain run takes (no grace period, no rounding).
    assert!(
        elapsed < baseline + Duration::from_millis(350 + 600),
        "answered after {elapsed:?}, where a plain run took {baseline:?}"
    );
    // run_timeout is the other spelling.
    let r = s.exec(json!({"language": "bash", "code": "sleep 30", "run_timeout": 120}));
    assert_eq!(r["status"], "timed_out");
    assert!(r["execution_time"].as_u64().unwrap() < 220, "{r}");
}

/// LibreChat shows the model only stdout and stderr: each abnormal end is also a last
/// `[sandbox] ...` line on stderr, while a program that exits (even non-zero) gets none.
#[test]
fn abnormal_ends_are_told_on_stderr() {
    let s = Server::start();
    let r = s.py("import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGSEGV)");
    assert_eq!(r["status"], "killed", "{r}");
    assert_eq!(r["stderr"], "[sandbox] Killed by signal SIGSEGV\n", "{r}");
    let r = s.exec(json!({"code": "import sys\nsys.stderr.write('half a line')\nbytearray(2 << 30)", "limits": {"memory_limit_mb": 64}}));
    assert_eq!(r["oom_killed"], true, "{r}");
    // In the gvisor tier the host kernel may end the whole gVisor sandbox, and what the
    // program printed with it.
    let told = if crate::common::gvisor_pass() {
        "[sandbox] Out of memory\n"
    } else {
        "half a line\n[sandbox] Out of memory\n"
    };
    assert!(r["stderr"].as_str().unwrap().ends_with(told), "{r}");
    let r = s.exec(json!({"code": "while True: pass", "limits": {"cpu_time_limit_ms": 300}}));
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .ends_with("[sandbox] CPU time limit exceeded\n"),
        "{r}"
    );
    let r = s.exec(json!({"code": "print('x' * 500)", "limits": {"max_output_bytes": 100}}));
    assert_eq!(r["status"], "ok");
    assert_eq!(r["stderr"], "[sandbox] stdout length exceeded\n");
    let r = s.py("import sys\nprint('oops', file=sys.stderr)\nsys.exit(3)");
    assert_eq!(r["stderr"], "oops\n", "an exit is the program's own business: {r}");
}

/// A language the server does not run is 400 with `code: unsupported_capability` beside
/// `error_type`, which LibreChat's client turns into "do not retry with this language".
#[test]
fn an_unknown_language_is_an_unsupported_capability() {
    let s = Server::start();
    for route in ["/v1/exec", "/v1/exec/programmatic"] {
        let (status, v) = s.post(route, &json!({"lang": "cobol", "code": "DISPLAY 1", "tools": []}));
        assert_eq!(status, 400, "{route}: {v}");
        assert_eq!(v["error_type"], "unsupported_language", "{v}");
        assert_eq!(v["code"], "unsupported_capability", "{v}");
        assert!(v["error"].as_str().unwrap().contains("cobol"), "{v}");
    }
    // Other errors carry no `code`.
    let (status, v) = s.post("/v1/exec", &json!({"code": ""}));
    assert_eq!(status, 400);
    assert!(v.get("code").is_none(), "{v}");
}

#[test]
fn request_limits_lower_the_defaults() {
    let s = Server::start();
    let r = s.exec(json!({"code": "print('x' * 5000)", "limits": {"max_output_bytes": 100}}));
    assert_eq!(r["stdout"].as_str().unwrap().len(), 100);
    assert_eq!(r["stdout_truncated"], true);
    // Asking for more than the ceiling gets the ceiling (default 128 processes).
    let r = s.exec(json!({"language": "bash", "code": "ulimit -u", "limits": {"max_processes": 100000}}));
    assert_eq!(r["stdout"], "128\n", "{r}");
    let r = s.exec(json!({"language": "bash", "code": "ulimit -n", "limits": {"max_open_files": 64}}));
    assert_eq!(r["stdout"], "64\n");
}

#[test]
fn thirty_two_concurrent_runs_each_get_their_own_output() {
    let s = Server::start();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..32)
            .map(|i| {
                let s = &s;
                scope.spawn(move || {
                    let (lang, code) = if i % 2 == 0 {
                        ("python", format!("import os\nprint({i} * 1000 + 7, os.getpid())"))
                    } else {
                        ("bash", format!("echo $(( {i} * 1000 + 7 )) $$"))
                    };
                    (i, s.exec(json!({"language": lang, "code": code})))
                })
            })
            .collect();
        for h in handles {
            let (i, r) = h.join().unwrap();
            assert_eq!(r["status"], "ok", "run {i}: {r}");
            let out = r["stdout"].as_str().unwrap();
            let mut parts = out.split_whitespace();
            assert_eq!(
                parts.next(),
                Some((i * 1000 + 7).to_string().as_str()),
                "run {i}: {out}"
            );
            // Each run is alone in its pid namespace: its program is pid 2, after init.
            assert_eq!(parts.next(), Some("2"), "run {i}: {out}");
        }
    });
}
