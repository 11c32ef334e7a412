//! Runs forked from a Python template (`zygote = true`, ARCHITECTURE.md "Forked runs"):
//! they behave as cold runs do, share nothing a run can read with another, start with
//! fresh random state and unpatched modules, survive the template being killed, and
//! leave nothing behind.
//!
//! A forked run is told apart by its user namespace: its uid 1000 maps to the
//! template's uid 1000, where a built sandbox's maps straight to the host's uid.

use crate::common::{descendants, fd_count, hostile, mount_count, processes_matching, run_cgroups, settle, Server};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The comment that opens the template's inline source, so its command line.
const TEMPLATE: &str = "sandcall's Python template";

/// A server whose warm Python sandboxes are forked: `plain` plain ones and, when
/// `preload` names modules, one preloaded set of one.
pub(crate) fn forked_server(plain: usize, preload: Option<&str>) -> Server {
    let plain = plain.to_string();
    let mut env = vec![
        ("SANDCALL_ZYGOTE", "true"),
        ("SANDCALL_WARM_POOL_SIZE", plain.as_str()),
        ("SANDCALL_WARM_LANGUAGES", r#"["python"]"#),
    ];
    if let Some(modules) = preload {
        env.push(("SANDCALL_WARM_PRELOAD", modules));
        env.push(("SANDCALL_WARM_PRELOAD_POOL_SIZE", "1"));
    }
    Server::start_with(&env, "")
}

/// Put before a program: says on stderr's last line, as the program ends (also by
/// `sys.exit` or an exception), whether the run was forked.
const SAY_FORKED: &str = "import atexit as _a, sys as _s; _a.register(lambda: _s.stderr.write('forked=%s\\n' % (open('/proc/self/uid_map').read().split()[1] == '1000')))\n";

/// Runs Python `code` and returns the answer, and whether the run was forked (false
/// also when the program was killed before it could say).
fn run(s: &Server, body: Value) -> (Value, bool) {
    run_with(s, &[], body)
}

/// `run`, with request headers (a principal's key).
fn run_with(s: &Server, headers: &[(&str, &str)], body: Value) -> (Value, bool) {
    let mut body = body;
    let code = format!("{SAY_FORKED}{}", body["code"].as_str().unwrap_or_default());
    body["code"] = Value::String(code);
    let (status, v) = s.post_with("/v1/exec", &body, headers);
    assert_eq!(status, 200, "{v}");
    let stderr = v["stderr"].as_str().unwrap_or_default();
    let forked = stderr.lines().last() == Some("forked=True");
    (v, forked)
}

/// Runs `code` in a forked sandbox, retrying while the pool still hands out built ones
/// (right after start, or while a template is rebuilt).
pub(crate) fn run_forked(s: &Server, body: Value) -> Value {
    run_forked_with(s, &[], body)
}

/// `run_forked`, with request headers (a principal's key).
fn run_forked_with(s: &Server, headers: &[(&str, &str)], body: Value) -> Value {
    let start = Instant::now();
    loop {
        let (v, forked) = run_with(s, headers, body.clone());
        if forked {
            return v;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "no forked run: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn stdout(v: &Value) -> &str {
    v["stdout"].as_str().unwrap_or_default()
}

#[test]
fn forked_runs_answer_as_cold_runs_do() {
    let forked = forked_server(1, None);
    // Built sandboxes, whatever the environment says (SANDCALL_ZYGOTE=true in CI).
    let cold = Server::start_with(&[("SANDCALL_ZYGOTE", "false")], "");
    let programs = [
        json!({"code": "print('hi')\nimport sys\nsys.exit(3)"}),
        json!({"code": "def f():\n    raise ValueError('boom')\nf()"}),
        json!({"code": "import os\nprint(sorted(os.listdir('.')), os.getcwd(), os.getuid(), os.getpid())\nopen('out.txt', 'w').write('x' * 10)"}),
        json!({"code": "import sys\nprint(sys.argv, sys.path[0], __name__, __file__)", "args": ["a", "b"]}),
        json!({"code": "import os\nprint(sorted(os.listdir('/tmp')), sorted(os.listdir('/dev/shm')), open('/proc/self/cgroup').read().count('/'))"}),
        json!({"code": "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 80), timeout=1)\nexcept OSError as e:\n    print('refused', e.errno)"}),
        json!({"code": "import resource\nprint([resource.getrlimit(r) for r in (resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC, resource.RLIMIT_FSIZE, resource.RLIMIT_CORE)])"}),
        json!({"code": "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0], open('/proc/self/status').read().split('NoNewPrivs:')[1].split()[0], open('/proc/self/status').read().split('Seccomp:')[1].split()[0])"}),
        // Init (pid 1) holds the capabilities of the run's namespaces: the program must
        // not read or write its memory, read its environment or descriptors, or kill it.
        json!({"code": "import os\nfor p in ('/proc/1/mem', '/proc/1/environ', '/proc/1/fd/0'):\n    try:\n        open(p, 'rb').read(1)\n        print(p, 'read')\n    except OSError as e:\n        print(p, type(e).__name__)\nos.kill(1, 9)\nprint('alive')"}),
        json!({"code": hostile("memory_bomb.py"), "limits": {"memory_limit_mb": 64}}),
        json!({"code": "while True: pass", "timeout": 300}),
    ];
    for body in programs {
        // While the template lives, the pool's sandbox after a forked one is forked too.
        run_forked(&forked, json!({"code": "pass"}));
        forked.wait_warm(1);
        let (f, was_forked) = run(&forked, body.clone());
        let killed = f["signal"] == "SIGKILL";
        assert!(was_forked || killed, "{f}");
        let (c, was_forked) = run(&cold, body.clone());
        assert!(!was_forked, "{c}");
        for key in ["status", "exit_code", "signal", "timed_out", "oom_killed", "stdout"] {
            assert_eq!(f[key], c[key], "{key} of {body}:\nforked {f}\ncold {c}");
        }
        let lines = |v: &Value| {
            let text = v["stderr"].as_str().unwrap_or_default().to_owned();
            text.lines()
                .filter(|l| !l.starts_with("forked="))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(lines(&f), lines(&c), "stderr of {body}");
        let names = |v: &Value| {
            v["files"]
                .as_array()
                .map(|f| f.iter().map(|x| x["name"].clone()).collect::<Vec<_>>())
        };
        assert_eq!(names(&f), names(&c), "files of {body}");
    }
}

#[test]
fn back_to_back_forked_runs_draw_different_random_numbers() {
    let s = forked_server(1, Some(r#"["numpy"]"#));
    let code = "import random, numpy, os\nprint(random.random(), numpy.random.random(), random.getrandbits(64), os.urandom(8).hex())";
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let v = run_forked(&s, json!({ "code": code }));
        assert_eq!(v["exit_code"], 0, "{v}");
        for value in stdout(&v).split_whitespace() {
            assert!(seen.insert(value.to_owned()), "{value} came twice: {v}");
        }
    }
}

#[test]
fn a_run_that_patches_a_preloaded_module_leaves_the_next_run_unaffected() {
    let s = forked_server(1, Some(r#"["numpy"]"#));
    let patch = "import numpy, json, os\nnumpy.pi = 3\nnumpy.sum = lambda *a, **k: 'patched'\njson.dumps = None\nos.environ['LEFT'] = 'behind'\nnumpy.random.seed(0)\nprint(numpy.pi, numpy.sum([1, 2]))";
    let v = run_forked(&s, json!({ "code": patch }));
    assert_eq!(stdout(&v), "3 patched\n", "{v}");
    let check = "import numpy, json, os\nprint(numpy.pi, numpy.sum([1, 2]), json.dumps([1]), os.environ.get('LEFT'), numpy.random.random() == numpy.random.RandomState(0).random())";
    let v = run_forked(&s, json!({ "code": check }));
    assert_eq!(stdout(&v), "3.141592653589793 3 [1] None False\n", "{v}");
}

#[test]
fn a_forked_run_cannot_reach_another_runs_memory_processes_or_files() {
    let s = forked_server(2, None);
    // Run A holds a secret in memory (in a module every run shares with the template),
    // in each of its writable places, and in a process of its own; then waits.
    let hold = "import json, os, subprocess, time\nsecret = 'SECRET-' + os.urandom(8).hex()\njson.SECRET = secret\nos.environ['SECRET'] = secret\nfor d in ('/tmp', '/dev/shm', '/mnt/data'):\n    open(d + '/secret.txt', 'w').write(secret)\np = subprocess.Popen(['sleep', '6'])\nprint(secret, flush=True)\ntime.sleep(5)";
    let look = r#"
import json, os, glob
found = []
print(getattr(json, 'SECRET', None), os.environ.get('SECRET'))
for d in ('/tmp', '/dev/shm', '/mnt/data', '/run/sandcall'):
    found += [p for p in glob.glob(d + '/**/secret*', recursive=True)]
pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
for pid in pids:
    try:
        cmd = open('/proc/%d/cmdline' % pid, 'rb').read()
    except OSError:
        continue
    if cmd.split(b'\0')[0].endswith(b'sleep'):
        found.append(pid)
print(found, pids[:2])
"#;
    std::thread::scope(|scope| {
        let holder = scope.spawn(|| run_forked(&s, json!({ "code": hold, "timeout": 20000 })));
        std::thread::sleep(Duration::from_millis(1500));
        let v = run_forked(&s, json!({ "code": look }));
        let lines: Vec<&str> = stdout(&v).lines().collect();
        assert_eq!(lines, ["None None", "[] [1, 2]"], "{v}");
        let held = holder.join().unwrap();
        assert!(stdout(&held).starts_with("SECRET-"), "{held}");
    });
}

#[test]
fn killing_the_template_mid_burst_loses_no_request() {
    let s = forked_server(2, None);
    run_forked(&s, json!({"code": "print(1)"}));
    let mine = descendants(s.pid());
    let before: Vec<u32> = processes_matching(TEMPLATE)
        .into_iter()
        .filter(|p| mine.contains(p))
        .collect();
    assert_eq!(templates(&before).len(), 1, "one template process");
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for i in 0..10 {
                    let (v, _) = run(&s, json!({"code": format!("print({i} * 2)")}));
                    assert_eq!(v["exit_code"], 0, "{v}");
                    assert_eq!(stdout(&v), format!("{}\n", i * 2), "{v}");
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
        while done.load(std::sync::atomic::Ordering::SeqCst) < 8 {
            std::thread::sleep(Duration::from_millis(5));
        }
        for pid in templates(&before) {
            kill9(pid);
        }
    });
    assert_eq!(done.into_inner(), 40);
    // A new template comes, and runs are forked from it again.
    run_forked(&s, json!({"code": "print(1)"}));
    let after = processes_matching(TEMPLATE);
    assert!(
        after.iter().any(|p| !before.contains(p)),
        "no new template: {before:?} {after:?}"
    );
    s.assert_healthy();
}

/// A process's pid in each pid namespace it is in, outermost first (`NSpid`); empty
/// once it is gone.
fn nspid(pid: u32) -> Vec<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The templates among processes that carry the template's source on their command
/// line: the runs forked from it do too, but they sit one pid namespace deeper (pid 2 of
/// the template's namespace is the template itself).
fn templates(pids: &[u32]) -> Vec<u32> {
    pids.iter()
        .copied()
        .filter(|pid| {
            let nspid = nspid(*pid);
            nspid.len() == 2 && nspid[1] == "2"
        })
        .collect()
}

fn kill9(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    assert!(status.is_ok_and(|s| s.success()), "kill {pid}");
}

/// Forked runs, hostile ones among them, leave no process, cgroup, mount, staging
/// entry or descriptor behind: afterwards the machine holds what it held before (the
/// template and the refilled pool). SANDCALL_ZYGOTE_LEAK_RUNS sets how many (default
/// 1,000; the issue's 10,000 take about ten times as long).
#[test]
fn many_forked_runs_leave_nothing_behind() {
    let runs: usize = std::env::var("SANDCALL_ZYGOTE_LEAK_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let s = forked_server(3, None);
    run_forked(&s, json!({"code": "print(1)"}));
    let instance = s.instance();
    let pid = s.pid();
    let steady = || {
        let idle = s.request("GET", "/v1/health", None, None).2["warm_idle"]
            .as_u64()
            .unwrap_or(0);
        (
            idle,
            descendants(pid).len(),
            run_cgroups(&instance),
            crate::common::dir_entries(&s.data_dir.join("runs")),
            mount_count(),
        )
    };
    // The pool full, of forked sandboxes, and nothing else under way.
    s.wait_warm(3);
    let mut before = steady();
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = steady();
        if now == before && now.0 == 3 {
            break;
        }
        before = now;
    }
    let fds_before = fd_count(pid);
    let bodies = [
        json!({"code": "print(1)"}),
        json!({"code": "open('x', 'w').write('1')\nimport subprocess\nsubprocess.Popen(['sleep', '30'])"}),
        json!({"code": hostile("memory_bomb.py"), "limits": {"memory_limit_mb": 64}}),
        json!({"code": hostile("cpu_spin.py"), "timeout": 100}),
        json!({"code": hostile("open_files.py")}),
    ];
    let forked = std::sync::atomic::AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for worker in 0..4 {
            let (s, bodies, forked) = (&s, &bodies, &forked);
            scope.spawn(move || {
                for i in (worker..runs).step_by(4) {
                    // Mostly short runs: the hostile ones each take their time.
                    let body = if i % 20 == 0 {
                        &bodies[1 + (i / 20) % 4]
                    } else {
                        &bodies[0]
                    };
                    let (_, was_forked) = run(s, body.clone());
                    if was_forked {
                        forked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let forked = forked.into_inner();
    eprintln!("{runs} runs ({forked} forked) in {:?}", started.elapsed());
    // Four clients against a pool of three: a run that finds the pool empty gets a
    // sandbox forked for it there and then.
    assert!(forked * 10 >= runs * 9, "only {forked} of {runs} runs were forked");
    assert_eq!(
        settle(steady, before),
        before,
        "(idle, processes, cgroups, runs dir, mounts)"
    );
    // No more than before (one the server held then, a connection say, may be closed).
    let fds = settle(|| fd_count(pid) <= fds_before, true);
    assert!(
        fds,
        "the server's descriptors: {} now, {fds_before} before",
        fd_count(pid)
    );
}

/// A forked run's first process gets into the run's cgroup before it writes anything of
/// the run: on cgroup v2 it is born there (the template clones it with `clone3` and
/// `CLONE_INTO_CGROUP`, into the cgroup the run's helper hands it), on v1 the helper
/// moves it there after its hello. The server counts which, and on a v2 machine (CI's
/// cgroup v2 machine runs this test) every fork must have been a clone into the cgroup.
#[test]
fn a_forked_runs_first_process_is_cloned_into_its_cgroup_on_v2() {
    let s = forked_server(1, None);
    for _ in 0..3 {
        assert_eq!(stdout(&run_forked(&s, json!({"code": "print(1)"}))), "1\n");
    }
    let (status, _, health) = s.request("GET", "/v1/health", None, None);
    assert_eq!(status, 200, "{health}");
    let client = crate::files::Client::anonymous(&s);
    let scrape = crate::metrics::scrape(&client);
    let count = |how| crate::metrics::value(&scrape, "sandcall_forked_sandboxes_total", &[("cgroup", how)]);
    let (cloned, moved) = (count("cloned"), count("moved"));
    match health["cgroup"].as_str() {
        Some("v2") => assert!(cloned >= 3.0 && moved == 0.0, "cloned {cloned}, moved {moved}"),
        Some("v1") => assert!(moved >= 3.0 && cloned == 0.0, "cloned {cloned}, moved {moved}"),
        other => panic!("cgroup version {other:?}: {health}"),
    }
}

/// A forked run's code directory is its own tmpfs, written by the helper at the `Run`:
/// it is read-only before the first line of the program runs (init seals it, then
/// releases the program), and the program keeps no descriptor of that release.
#[test]
fn a_forked_runs_code_directory_is_read_only_from_its_first_line() {
    let s = forked_server(1, None);
    let code = r#"import os
for path, mode in (('/run/sandcall/main.py', 'a'), ('/run/sandcall/new.py', 'w')):
    try:
        open(path, mode).write('x')
        print(path, 'written')
    except OSError as e:
        print(path, e.errno)
ro = [l.split()[5].split(',')[0] for l in open('/proc/self/mountinfo') if l.split()[4] == '/run/sandcall']
try:
    os.fstat(4)
    print('fd 4 open')
except OSError:
    print('fd 4 closed')
print(sorted(set(ro)), 'main.py' in os.listdir('/run/sandcall'))
"#;
    for _ in 0..3 {
        let v = run_forked(&s, json!({ "code": code }));
        assert_eq!(v["exit_code"], 0, "{v}");
        assert_eq!(
            stdout(&v),
            "/run/sandcall/main.py 30\n/run/sandcall/new.py 30\nfd 4 closed\n['ro'] True\n",
            "{v}"
        );
    }
}

/// A programmatic session pauses and resumes in a forked run as in any warm sandbox: its
/// calls reach the caller, its results come back, its random numbers follow its seed.
#[test]
fn a_programmatic_session_pauses_and_resumes_in_a_forked_run() {
    let s = forked_server(2, None);
    run_forked(&s, json!({"code": "pass"}));
    s.wait_warm(2);
    let tool = json!({"name": "add", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}});
    let code = "import random\nx = await add(x=1)\ny = await add(x=x)\nprint(x, y, open('/proc/self/uid_map').read().split()[1] == '1000', random.random() < 1)";
    let (status, mut r) = s.post("/v1/exec/programmatic", &json!({"code": code, "tools": [tool]}));
    assert_eq!(status, 200, "{r}");
    let mut calls = 0;
    while r["status"] == "tool_call_required" {
        let call = &r["tool_calls"][0];
        let x = call["arguments"]["x"].as_i64().unwrap();
        let body = json!({"session_id": r["session_id"], "continuation_token": r["continuation_token"],
                          "tool_results": [{"call_id": call["id"], "result": x + 10}]});
        let (status, next) = s.post("/v1/exec/programmatic", &body);
        assert_eq!(status, 200, "{next}");
        r = next;
        calls += 1;
    }
    assert_eq!(calls, 2, "{r}");
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["stdout"], "11 21 True True\n", "{r}");
}

/// The programs of the runs forked from a template that are alive now: pid 2 of a pid
/// namespace nested in the template's (host, template, run).
fn forked_programs(server: u32) -> usize {
    descendants(server)
        .into_iter()
        .filter(|pid| {
            let nspid = nspid(*pid);
            nspid.len() == 3 && nspid[2] == "2"
        })
        .count()
}

/// Many sessions paused at once in forked runs: the template lives through them all.
/// It used to be killed after a few dozen: every process of every run counted against
/// the template's RLIMIT_NPROC (the kernel counts a nested user namespace's processes
/// in its parent's too), and what each run kept charged to the template's cgroup filled
/// its memory. Small limits make both show early: `max_processes = 16` (the template
/// then failed at the ninth paused session), and a 64 MB memory limit (the template's
/// cgroup then filled up at about 40 sessions, and at about 130 once a run's own pages
/// were charged to it no more). SANDCALL_ZYGOTE_PAUSED sets how many (default 150);
/// the first template failure ends the test.
#[test]
fn many_paused_forked_sessions_leave_the_template_alive() {
    let sessions: usize = std::env::var("SANDCALL_ZYGOTE_PAUSED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(150);
    let max_sessions = (sessions + 10).to_string();
    let s = Server::start_with(
        &[
            ("SANDCALL_ZYGOTE", "true"),
            ("SANDCALL_WARM_POOL_SIZE", "2"),
            ("SANDCALL_WARM_LANGUAGES", r#"["python"]"#),
            ("SANDCALL_WARM_PRELOAD_POOL_SIZE", "0"),
            ("SANDCALL_MAX_PROCESSES", "16"),
            ("SANDCALL_MEMORY_LIMIT_MB", "64"),
            ("SANDCALL_MAX_SESSIONS", max_sessions.as_str()),
        ],
        "",
    );
    run_forked(&s, json!({"code": "pass"}));
    s.wait_warm(2);
    // The warm pool's programs are pid 2 of their namespaces too: only the processes
    // that carry the template's source are looked at.
    let template = || {
        let mine = descendants(s.pid());
        let candidates: Vec<u32> = processes_matching(TEMPLATE)
            .into_iter()
            .filter(|p| mine.contains(p))
            .collect();
        templates(&candidates)
    };
    let first = template();
    assert_eq!(first.len(), 1, "one template: {first:?}");
    let tool = json!({"name": "inc", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}});
    let code = "print(await inc(x=1))";
    let mut paused = Vec::new();
    for i in 0..sessions {
        let (status, r) = s.post(
            "/v1/exec/programmatic",
            &json!({"code": code, "tools": [tool], "timeout": 120000}),
        );
        assert_eq!(status, 200, "session {i}: {r}");
        assert_eq!(r["status"], "tool_call_required", "session {i}: {r}");
        paused.push(r);
        if i % 10 == 9 {
            assert_eq!(
                template(),
                first,
                "the template was replaced after {} paused sessions",
                i + 1
            );
        }
    }
    assert_eq!(template(), first, "the template was replaced");
    // Every paused session is a forked run (and the pool holds forked ones too).
    let forked = forked_programs(s.pid());
    assert!(
        forked >= sessions,
        "{forked} forked runs for {sessions} paused sessions"
    );
    // They all resume.
    for r in &paused {
        let call = &r["tool_calls"][0];
        let body = json!({"session_id": r["session_id"], "continuation_token": r["continuation_token"],
                          "tool_results": [{"call_id": call["id"], "result": 7}]});
        let (status, done) = s.post("/v1/exec/programmatic", &body);
        assert_eq!(status, 200, "{done}");
        assert_eq!(done["status"], "completed", "{done}");
        assert_eq!(done["stdout"], "7\n", "{done}");
    }
    assert_eq!(template(), first, "the template was replaced");
    s.assert_healthy();
}

/// What a program can learn of the randomness it started with: the 16 bytes at
/// AT_RANDOM (from which glibc drew the stack canary and pointer guard; in a forked run
/// the auxiliary vector and those bytes are its template's, and /proc/self/auxv is not
/// readable, so the C library's `getauxval` finds them), where the heap put an object the
/// interpreter made at its start (`id(len)`), where the C library was mapped, and
/// Python's string hash (its seed).
const RANDOMNESS: &str = r#"
import ctypes
getauxval = ctypes.CDLL(None).getauxval
getauxval.restype = ctypes.c_ulong
getauxval.argtypes = [ctypes.c_ulong]
at_random = getauxval(25)
libc = ctypes.cast(ctypes.CDLL(None).printf, ctypes.c_void_p).value
print(ctypes.string_at(at_random, 16).hex(), hex(id(len)), hex(libc), hash('sandcall-witness'))
"#;

/// Runs of two principals (two API keys) are forked from templates of their own: each
/// principal's forked runs share their template's randomness (which is what a shared
/// template would hand to both), the two principals' never do. Finding 4 of issue 25.
#[test]
fn runs_of_two_principals_never_share_a_templates_randomness() {
    let s = Server::start_with(
        &[
            (
                "SANDCALL_API_KEYS",
                "alice:key-alice-0123456789,bob:key-bob-0123456789ab",
            ),
            ("SANDCALL_ZYGOTE", "true"),
            ("SANDCALL_WARM_POOL_SIZE", "1"),
            ("SANDCALL_WARM_LANGUAGES", r#"["python"]"#),
        ],
        "",
    );
    let witness = |key: &str| -> Vec<String> {
        let headers = [("X-API-Key", key)];
        let mut seen = Vec::new();
        for _ in 0..3 {
            let v = run_forked_with(&s, &headers, json!({ "code": RANDOMNESS }));
            assert_eq!(v["exit_code"], 0, "{v}");
            seen.push(stdout(&v).trim().to_owned());
        }
        seen
    };
    let alice = witness("key-alice-0123456789");
    let bob = witness("key-bob-0123456789ab");
    // One principal's forked runs share their template's values: the witness sees them.
    for runs in [&alice, &bob] {
        assert!(
            runs.iter().all(|r| *r == runs[0]),
            "one template's runs differ: {runs:?}"
        );
    }
    let (a, b): (Vec<&str>, Vec<&str>) = (alice[0].split(' ').collect(), bob[0].split(' ').collect());
    assert_eq!((a.len(), b.len()), (4, 4), "{alice:?} {bob:?}");
    for (i, what) in ["AT_RANDOM", "id(len)", "the C library's address", "the hash seed"]
        .iter()
        .enumerate()
    {
        assert_ne!(
            a[i], b[i],
            "alice's and bob's forked runs share {what}: {alice:?} {bob:?}"
        );
    }
}

/// The templates are bounded in number (`zygote_templates`) and an idle one is stopped
/// (`zygote_template_idle_s`) without ending the runs forked from it: with room for one
/// template, bob's runs are not forked while alice's template lives; once it has been
/// idle for its time it is gone, alice's session paused in a run forked from it still
/// completes, and bob's runs are forked from a template of his own.
#[test]
fn templates_are_bounded_and_an_idle_one_is_stopped_while_its_runs_live_on() {
    let s = Server::start_with(
        &[
            (
                "SANDCALL_API_KEYS",
                "alice:key-alice-0123456789,bob:key-bob-0123456789ab",
            ),
            ("SANDCALL_ZYGOTE", "true"),
            ("SANDCALL_ZYGOTE_TEMPLATES", "1"),
            ("SANDCALL_ZYGOTE_TEMPLATE_IDLE_S", "3"),
            ("SANDCALL_WARM_POOL_SIZE", "1"),
            ("SANDCALL_WARM_LANGUAGES", r#"["python"]"#),
        ],
        "",
    );
    let alice = [("X-API-Key", "key-alice-0123456789")];
    let bob = [("X-API-Key", "key-bob-0123456789ab")];
    let live_templates = || {
        let mine = descendants(s.pid());
        let candidates: Vec<u32> = processes_matching(TEMPLATE)
            .into_iter()
            .filter(|p| mine.contains(p))
            .collect();
        templates(&candidates).len()
    };
    run_forked_with(&s, &alice, json!({"code": "pass"}));
    // A session of alice's paused in a run forked from her template.
    let tool = json!({"name": "inc", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}});
    let code = "print(await inc(x=1), open('/proc/self/uid_map').read().split()[1] == '1000')";
    let (status, paused) = s.post_with(
        "/v1/exec/programmatic",
        &json!({"code": code, "tools": [tool], "timeout": 60000}),
        &alice,
    );
    assert_eq!(
        (status, paused["status"].as_str()),
        (200, Some("tool_call_required")),
        "{paused}"
    );
    // No room for bob's template while alice's lives.
    for _ in 0..3 {
        let (v, forked) = run_with(&s, &bob, json!({"code": "print(1)"}));
        assert_eq!(stdout(&v), "1\n", "{v}");
        assert!(
            !forked,
            "bob's run was forked while alice's template held the only place"
        );
    }
    assert_eq!(live_templates(), 1);
    // Idle for its time (3 s, checked every second or so), alice's template is stopped.
    let gone = Instant::now();
    while live_templates() > 0 {
        assert!(
            gone.elapsed() < Duration::from_secs(20),
            "alice's idle template was not stopped"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Her paused run lives on, and completes.
    let call = &paused["tool_calls"][0];
    let body = json!({"session_id": paused["session_id"], "continuation_token": paused["continuation_token"],
                      "tool_results": [{"call_id": call["id"], "result": 7}]});
    let (status, done) = s.post_with("/v1/exec/programmatic", &body, &alice);
    assert_eq!(status, 200, "{done}");
    assert_eq!(
        (done["status"].as_str(), done["stdout"].as_str()),
        (Some("completed"), Some("7 True\n")),
        "{done}"
    );
    // Now there is room: bob's runs are forked from a template of his own.
    run_forked_with(&s, &bob, json!({"code": "pass"}));
    assert_eq!(live_templates(), 1);
}
