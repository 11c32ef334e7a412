//! Warm sandboxes: each is used once, nothing of one run reaches the next, and a burst
//! larger than the pool still succeeds. (The hostile and leak tests also run against
//! warm sandboxes: leaks.rs has a warm variant, and CI runs hostile.rs a second time
//! with SANDCALL_TEST_WARM_POOL set.)

use crate::common::{assert_run_reclaimed, Server};
use serde_json::json;
use std::collections::HashSet;
use std::time::Duration;

fn warm_server(size: usize) -> Server {
    Server::start_with(&[("SANDCALL_WARM_POOL_SIZE", &size.to_string())], "")
}

#[test]
fn a_warm_sandbox_is_never_handed_out_twice() {
    let s = warm_server(2);
    let mut ids = HashSet::new();
    let code = "import os, glob\nprint(sorted(glob.glob('/tmp/*') + glob.glob('/mnt/data/*') + glob.glob('/dev/shm/*')))\nopen(f'/tmp/m{os.getpid()}', 'w').write('x')\nopen('/mnt/data/m', 'w').write('x')\nopen('/dev/shm/m', 'w').write('x')";
    for _ in 0..12 {
        s.wait_warm(4);
        let (kind, r) = s.exec_kind(&json!({"code": code}).to_string());
        assert_eq!(kind, "warm");
        assert_eq!(r["stdout"], "[]\n", "a file of an earlier run is visible: {r}");
        assert!(
            ids.insert(r["session_id"].as_str().unwrap().to_owned()),
            "session id reused: {r}"
        );
    }
}

#[test]
fn no_state_leaks_from_one_warm_run_into_the_next() {
    let s = warm_server(1);
    let dirty = "import builtins, os, resource, signal, sys, types\n\
builtins.LEAKED = 1\n\
os.environ['LEAKED'] = '1'\n\
sys.modules['leaked_module'] = types.ModuleType('leaked_module')\n\
sys.path.append('/leaked')\n\
open('/tmp/leaked', 'w').write('x')\n\
os.chdir('/tmp')\n\
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n\
signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
os.umask(0o077)\n\
print('dirtied')";
    let check = "import builtins, os, resource, signal, sys\n\
print(hasattr(builtins, 'LEAKED'), 'LEAKED' in os.environ, 'leaked_module' in sys.modules,\n\
      '/leaked' in sys.path, os.path.exists('/tmp/leaked'), os.getcwd(),\n\
      resource.getrlimit(resource.RLIMIT_NOFILE), signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,\n\
      oct(os.umask(0o022)))";
    for _ in 0..3 {
        s.wait_warm(2);
        let (kind, r) = s.exec_kind(&json!({"code": dirty}).to_string());
        assert_eq!(
            (kind.as_str(), r["stdout"].as_str()),
            ("warm", Some("dirtied\n")),
            "{r}"
        );
        s.wait_warm(2);
        let (kind, r) = s.exec_kind(&json!({"code": check}).to_string());
        assert_eq!(kind, "warm");
        assert_eq!(
            r["stdout"], "False False False False False /mnt/data (1024, 1024) True 0o22\n",
            "{r}"
        );
    }
    // Bash: variables, functions, traps, cwd, limits and files.
    s.wait_warm(2);
    let r = s.bash("export LEAKED=1; leaked() { :; }; trap 'echo trapped' EXIT; cd /tmp; ulimit -n 64; touch /tmp/leaked; echo dirtied");
    assert_eq!(r["stdout"], "dirtied\ntrapped\n", "{r}");
    s.wait_warm(2);
    let r = s.bash("echo \"${LEAKED:-none} $(type -t leaked || echo none) $(pwd) $(ulimit -n) $(ls /tmp | wc -l)\"");
    assert_eq!(r["stdout"], "none none /mnt/data 1024 0\n", "{r}");
}

#[test]
fn a_burst_larger_than_the_pool_still_succeeds() {
    let s = warm_server(1);
    let results: Vec<serde_json::Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..12)
            .map(|i| {
                let s = &s;
                scope.spawn(move || s.exec(json!({"code": format!("print({i} * 3)")})))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["stdout"], format!("{}\n", i * 3));
        assert_run_reclaimed(&s, r["session_id"].as_str().unwrap());
    }
}

#[test]
fn custom_limits_take_a_cold_sandbox_and_defaults_a_warm_one() {
    let s = warm_server(1);
    // A warm sandbox has the defaults; a request that lowers a limit must get it.
    s.wait_warm(2);
    let body = json!({"language": "bash", "code": "ulimit -n", "limits": {"max_open_files": 64}}).to_string();
    let (kind, r) = s.exec_kind(&body);
    assert_eq!(r["stdout"], "64\n", "{r}");
    assert_eq!(kind, "cold");
    let (kind, r) = s.exec_kind(&json!({"language": "bash", "code": "ulimit -n"}).to_string());
    assert_eq!(r["stdout"], "1024\n");
    assert_eq!(kind, "warm");
}

#[test]
fn programmatic_runs_use_warm_sandboxes_too() {
    let s = warm_server(2);
    let tool =
        json!({"name": "get_rate", "parameters": {"type": "object", "properties": {"base": {"type": "string"}}}});
    for (language, code, want) in [
        (
            "python",
            "import sys\nrate = get_rate(base='USD')\nprint(rate, sys.argv[1:])",
            "0.5 ['x']\n",
        ),
        ("bash", "echo $(get_rate base=USD) \"$@\"", "0.5 x\n"),
    ] {
        s.wait_warm(4);
        let (status, first) = s.post(
            "/v1/exec/programmatic",
            &json!({"language": language, "code": code, "tools": [tool], "args": ["x"]}),
        );
        assert_eq!(status, 200, "{first}");
        assert_eq!(first["status"], "tool_call_required", "{first}");
        let call = &first["tool_calls"][0];
        let (_, done) = s.post(
            "/v1/exec/programmatic",
            &json!({"continuation_token": first["continuation_token"], "tool_results": [{"call_id": call["id"], "result": 0.5}]}),
        );
        assert_eq!(done["status"], "completed", "{done}");
        assert_eq!(done["stdout"], want, "{done}");
    }
}

#[test]
fn warm_runs_report_exit_codes_output_and_files_like_cold_ones() {
    let s = warm_server(2);
    for (code, status, exit, stdout) in [
        ("import sys\nprint('a')\nsys.exit(3)", "failed", 3, "a\n"),
        ("print('b', flush=False)\nraise ValueError('x')", "failed", 1, "b\n"),
        ("import sys\nsys.stdout.write('no newline')", "ok", 0, "no newline"),
        (
            "import os, sys\nsys.stdout.write('raw')\nsys.stdout.flush()\nos._exit(7)",
            "failed",
            7,
            "raw",
        ),
    ] {
        s.wait_warm(4);
        let (kind, r) = s.exec_kind(&json!({"code": code}).to_string());
        assert_eq!(kind, "warm");
        assert_eq!(
            (r["status"].as_str(), r["exit_code"].as_i64(), r["stdout"].as_str()),
            (Some(status), Some(exit), Some(stdout)),
            "{r}"
        );
    }
    s.wait_warm(4);
    let (kind, r) = s.exec_kind(&json!({"code": "open('out.txt', 'w').write('made warm')\nprint('done')"}).to_string());
    assert_eq!(kind, "warm");
    assert_eq!(r["files"].as_array().map(Vec::len), Some(1), "{r}");
    assert_eq!(r["files"][0]["name"], "out.txt");
    let url = s.url(&format!(
        "/v1/download/{}/{}",
        r["session_id"].as_str().unwrap(),
        r["files"][0]["id"].as_str().unwrap()
    ));
    assert_eq!(ureq::get(&url).call().unwrap().into_string().unwrap(), "made warm");
    assert_run_reclaimed(&s, r["session_id"].as_str().unwrap());
}

/// The nice value of process `pid` (field 19 of /proc/<pid>/stat), if it still exists.
fn nice_of(pid: u32) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(16)?.parse().ok()
}

/// The nice values of the server's descendants (helpers, inits, programs), sorted.
fn descendant_nices(s: &Server) -> Vec<i64> {
    let mut nices: Vec<i64> = crate::common::descendants(s.pid())
        .into_iter()
        .filter_map(nice_of)
        .collect();
    nices.sort();
    nices
}

/// Prints the program's nice value (Python), with the answer's sandbox kind.
fn run_nice(s: &Server) -> (String, serde_json::Value) {
    s.exec_kind(&json!({"code": "import os\nprint(os.getpriority(os.PRIO_PROCESS, 0))"}).to_string())
}

#[test]
fn warm_sandboxes_wait_at_the_lowest_priority_and_run_at_the_normal_one() {
    let s = warm_server(2);
    s.wait_warm(4);
    // Everything built ahead of requests (each idle sandbox's helper, init and
    // waiting program) yields to the runs in flight.
    let nices = crate::common::settle(
        || {
            let n = descendant_nices(&s);
            n.iter().all(|v| *v == 19) && n.len() >= 4 * 3
        },
        true,
    );
    assert!(nices, "idle warm sandboxes not at nice 19: {:?}", descendant_nices(&s));
    // A run's program, its threads and its helper are back at the server's own nice value
    // (this test's: a runner started under `nice` starts its servers there): as a cold
    // run's are.
    let normal = sandcall_sandbox::priority::nice_of(0).unwrap();
    let line = format!("{normal}\n");
    for _ in 0..3 {
        s.wait_warm(4);
        let (kind, r) = run_nice(&s);
        assert_eq!(
            (kind.as_str(), r["stdout"].as_str()),
            ("warm", Some(line.as_str())),
            "{r}"
        );
        s.wait_warm(4);
        let (kind, r) = s.exec_kind(&json!({"language": "bash", "code": "nice"}).to_string());
        assert_eq!(
            (kind.as_str(), r["stdout"].as_str()),
            ("warm", Some(line.as_str())),
            "{r}"
        );
    }
    let code = "import os, threading\nseen = []\nt = threading.Thread(target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, 0)))\nt.start(); t.join()\nprint(os.getpriority(os.PRIO_PROCESS, 0), seen)";
    s.wait_warm(4);
    let (kind, r) = s.exec_kind(&json!({"code": code}).to_string());
    let threads = format!("{normal} [{normal}]\n");
    assert_eq!(
        (kind.as_str(), r["stdout"].as_str()),
        ("warm", Some(threads.as_str())),
        "{r}"
    );
    // A cold run (its own limits) never was lowered.
    let r = s.exec(
        json!({"code": "import os\nprint(os.getpriority(os.PRIO_PROCESS, 0))", "limits": {"max_open_files": 64}}),
    );
    assert_eq!(r["stdout"], line, "{r}");
}

#[test]
fn forked_runs_run_at_the_normal_priority_from_the_pool_and_on_demand() {
    let s = Server::start_with(
        &[
            ("SANDCALL_ZYGOTE", "true"),
            ("SANDCALL_WARM_POOL_SIZE", "1"),
            ("SANDCALL_WARM_LANGUAGES", r#"["python"]"#),
        ],
        "",
    );
    // The principal's template is started at its first run: runs are forked once it
    // is ready (a forked run's uid 1000 maps to the template's 1000).
    let forked = "print(open('/proc/self/uid_map').read().split()[1] == '1000')";
    let start = std::time::Instant::now();
    while s.exec(json!({ "code": forked }))["stdout"] != "True\n" {
        assert!(start.elapsed() < Duration::from_secs(60), "no forked run");
        std::thread::sleep(Duration::from_millis(100));
    }
    s.wait_warm(1);
    // The template and the pool's sandbox wait at nice 19.
    let lowered = crate::common::settle(|| descendant_nices(&s).iter().all(|v| *v == 19), true);
    assert!(
        lowered,
        "idle forked sandboxes not at nice 19: {:?}",
        descendant_nices(&s)
    );
    // Forked on demand in a burst: every program runs at the server's nice value.
    let line = format!("{}\n", sandcall_sandbox::priority::nice_of(0).unwrap());
    let answers: Vec<(String, serde_json::Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4).map(|_| scope.spawn(|| run_nice(&s))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (kind, r) in &answers {
        assert_eq!(r["stdout"], line, "{kind}: {r}");
    }
    assert!(answers.iter().all(|(kind, _)| kind == "warm"), "{answers:?}");
}

/// A warm Bash sandbox runs the code in the shell that waited for it (no second bash at
/// the go): what a script sees of itself, its errors and its exit are those of
/// `bash main.sh args` in a cold sandbox.
#[test]
fn warm_bash_runs_answer_as_cold_ones() {
    let warm = Server::start_with(
        &[
            ("SANDCALL_WARM_POOL_SIZE", "2"),
            ("SANDCALL_WARM_LANGUAGES", r#"["bash"]"#),
        ],
        "",
    );
    let cold = Server::start_with(&[("SANDCALL_WARM_POOL_SIZE", "0")], "");
    let programs = [
        json!({"code": "echo \"$0|$#|$1|$2|${BASH_SOURCE[*]}|$$\"\nf() { echo \"${FUNCNAME[0]} $LINENO\"; }\nf\nset | grep -c '^a=' || true", "args": ["a", "b c"]}),
        json!({"code": "nosuchcommand\necho \"status $?\"\nls /nonexistent\nexit 4"}),
        json!({"code": "echo before\nif then\necho after"}),
        json!({"code": "set -e\necho one\nfalse\necho two"}),
        json!({"code": "read -r line; echo \"got $line\"; cat", "stdin": "first\nrest\n"}),
        json!({"code": "trap 'echo bye' EXIT\necho \"$(pwd) $(ulimit -n)\"\nexit 3"}),
    ];
    for body in programs {
        let mut body = body;
        body["language"] = json!("bash");
        warm.wait_warm(2);
        let (kind, w) = warm.exec_kind(&body.to_string());
        assert_eq!(kind, "warm", "{w}");
        let (kind, c) = cold.exec_kind(&body.to_string());
        assert_eq!(kind, "cold", "{c}");
        for key in ["status", "exit_code", "signal", "stdout", "stderr"] {
            assert_eq!(w[key], c[key], "{key} of {body}:\nwarm {w}\ncold {c}");
        }
    }
}
