//! Durable programmatic sessions: the session journal, resume by replay after a restart
//! (SIGTERM or SIGKILL of the real server, restarted on the same data dir) and after
//! eviction, single-use tokens across restarts, and replay divergence.

use crate::common::{descendants, run_cgroups, Server, NO_POOL};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const ROUTE: &str = "/v1/exec/programmatic";

fn src(lines: &[&str]) -> String {
    let mut s = lines.join("\n");
    s.push('\n');
    s
}

/// `get(n, order?)`: the one tool of these programs.
fn get_tool() -> Value {
    json!({
        "name": "get",
        "description": "gets",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer"}, "order": {"type": "string"}},
            "required": ["n"],
        },
    })
}

fn start(s: &Server, language: &str, code: String) -> Value {
    let (status, v) = s.post(
        ROUTE,
        &json!({"language": language, "code": code, "tools": [get_tool()]}),
    );
    assert_eq!(status, 200, "start: {v}");
    assert_eq!(v["status"], "tool_call_required", "{v}");
    v
}

/// Answers every call of `paused` with `f(call)`.
fn answer(s: &Server, paused: &Value, f: impl Fn(&Value) -> Value) -> (u16, Value) {
    let results: Vec<Value> = paused["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("no calls: {paused}"))
        .iter()
        .map(|c| json!({"call_id": c["id"], "result": f(c), "is_error": false}))
        .collect();
    resume_with(s, paused, paused["continuation_token"].as_str().unwrap(), results)
}

fn resume_with(s: &Server, paused: &Value, token: &str, results: Vec<Value>) -> (u16, Value) {
    s.post(
        ROUTE,
        &json!({"session_id": paused["session_id"], "continuation_token": token, "tool_results": results}),
    )
}

fn paused(r: (u16, Value)) -> Value {
    assert_eq!(r.0, 200, "{}", r.1);
    assert_eq!(r.1["status"], "tool_call_required", "{}", r.1);
    r.1
}

fn completed(r: (u16, Value)) -> Value {
    assert_eq!(r.0, 200, "{}", r.1);
    assert_eq!(r.1["status"], "completed", "{}", r.1);
    r.1
}

fn status(s: &Server, paused: &Value) -> Value {
    let (code, _, v) = s.request(
        "GET",
        &format!("{ROUTE}/{}", paused["session_id"].as_str().unwrap()),
        None,
        None,
    );
    assert_eq!(code, 200, "{v}");
    v
}

/// A program paused before its first call's answer, with output already delivered;
/// its arguments come from `random` and from a set's order (PYTHONHASHSEED), which a
/// replay must draw alike.
fn first_call_program() -> String {
    src(&[
        "import random",
        "print('a-start')",
        "n = random.randint(0, 10**9)",
        "order = ','.join({'x', 'y', 'z', 'w', 'v', 'u'})",
        "r = get(n=n, order=order)",
        "print('a-got', r)",
    ])
}

/// Gathered calls answered before the restart, then one more pause.
fn gathered_program() -> String {
    src(&[
        "import random",
        "print('b1')",
        "rs = await asyncio.gather(get(n=random.randint(0, 99)), get(n=random.randint(100, 199)), get(n=random.randint(200, 299)))",
        "print('b2', sum(rs))",
        "r = await get(n=sum(rs))",
        "print('b3', r)",
    ])
}

/// Output delivered across several pauses.
fn looping_program() -> String {
    src(&[
        "import sys",
        "for i in range(3):",
        "    print(f'c{i}')",
        "    print(f'e{i}', file=sys.stderr)",
        "    r = get(n=i)",
        "    print(f'c{i} got {r}')",
    ])
}

fn survives_a_restart(hard: bool) {
    let s = Server::start();
    let a = start(&s, "python", first_call_program());
    assert_eq!(a["partial_stdout"], "a-start\n", "{a}");

    let b = start(&s, "python", gathered_program());
    assert_eq!(b["tool_calls"].as_array().unwrap().len(), 3, "{b}");
    let b2 = paused(answer(&s, &b, |_| json!(1)));
    assert_eq!(b2["partial_stdout"], "b2 3\n", "{b2}");
    assert_eq!(b2["tool_calls"][0]["arguments"], json!({"n": 3}), "{b2}");

    let c = start(&s, "python", looping_program());
    let c2 = paused(answer(&s, &c, |_| json!(10)));
    let c3 = paused(answer(&s, &c2, |_| json!(11)));
    assert_eq!(c3["partial_stdout"], "c1 got 11\nc2\n", "{c3}");
    assert_eq!(c3["partial_stderr"], "e2\n", "{c3}");

    let (s, _) = s.restart(&[], hard);

    // The paused sessions are known again, paused where they were.
    let a_now = status(&s, &a);
    assert_eq!(a_now["status"], "tool_call_required", "{a_now}");
    assert_eq!(a_now["continuation_token"], a["continuation_token"], "{a_now}");
    // A used token stays refused; the current one is accepted, once.
    let (code, v) = resume_with(
        &s,
        &c2,
        c2["continuation_token"].as_str().unwrap(),
        vec![json!({"call_id": c2["tool_calls"][0]["id"], "result": 1, "is_error": false})],
    );
    assert_eq!(code, 409, "{v}");
    assert_eq!(v["error_type"], "continuation_token_used", "{v}");

    // Each completes with exactly the output it would have had (the whole run's, as
    // `completed` always holds), no line twice.
    let a_end = completed(answer(&s, &a, |_| json!(42)));
    assert_eq!(a_end["stdout"], "a-start\na-got 42\n", "{a_end}");
    assert_eq!(a_end["tool_calls_made"], 1, "{a_end}");
    let b_end = completed(answer(&s, &b2, |_| json!(7)));
    assert_eq!(b_end["stdout"], "b1\nb2 3\nb3 7\n", "{b_end}");
    assert_eq!(b_end["tool_calls_made"], 4, "{b_end}");
    let c_end = completed(answer(&s, &c3, |_| json!(12)));
    assert_eq!(
        c_end["stdout"], "c0\nc0 got 10\nc1\nc1 got 11\nc2\nc2 got 12\n",
        "{c_end}"
    );
    assert_eq!(c_end["stderr"], "e0\ne1\ne2\n", "{c_end}");

    // Used after the restart too.
    let (code, v) = answer(&s, &a, |_| json!(1));
    assert!(code == 409 || v["status"] == "completed", "{code} {v}");
}

#[test]
fn paused_sessions_survive_sigkill() {
    survives_a_restart(true);
}

#[test]
fn paused_sessions_survive_sigterm() {
    survives_a_restart(false);
}

#[test]
fn a_program_that_takes_another_path_on_replay_ends_with_replay_diverged() {
    let s = Server::start_with(&[NO_POOL], "");
    let code = src(&[
        "import os",
        "print('start')",
        "r = get(n=int.from_bytes(os.urandom(4), 'big'))",
        "print('got', r)",
    ]);
    let p = start(&s, "python", code);
    let (s, _) = s.restart(&[NO_POOL], true);
    let (code, v) = answer(&s, &p, |_| json!(1));
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["status"], "error", "{v}");
    assert_eq!(v["error_type"], "replay_diverged", "{v}");
    assert!(!v["stdout"].as_str().unwrap_or("").contains("got"), "{v}");
    // Nothing of it is left.
    wait_until_no_sandbox(&s);
}

/// Waits until the server holds no sandbox: no run cgroup, no helper process.
fn wait_until_no_sandbox(s: &Server) {
    let t = Instant::now();
    loop {
        let cgroups = run_cgroups(&s.instance());
        let procs = descendants(s.pid());
        if cgroups == 0 && procs.is_empty() {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "still {cgroups} run cgroups and processes {procs:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_idle_paused_session_is_evicted_and_still_completes() {
    let s = Server::start_with(&[NO_POOL, ("SANDCALL_SESSION_IDLE_EVICT_S", "1")], "");
    let p = start(&s, "python", looping_program());
    assert_eq!(p["partial_stdout"], "c0\n", "{p}");
    // Evicted: its sandbox is gone.
    std::thread::sleep(Duration::from_millis(1200));
    wait_until_no_sandbox(&s);
    let (_, _, health) = s.request("GET", "/v1/health", None, None);
    assert_eq!(
        (health["sessions"].as_u64(), health["dormant_sessions"].as_u64()),
        (Some(0), Some(1)),
        "{health}"
    );
    let now = status(&s, &p);
    assert_eq!(now["status"], "tool_call_required", "{now}");
    // Each resume brings it back by replay; it pauses again and is evicted again.
    let p2 = paused(answer(&s, &p, |_| json!(10)));
    assert_eq!(p2["partial_stdout"], "c0 got 10\nc1\n", "{p2}");
    assert_eq!(p2["partial_stderr"], "e1\n", "{p2}");
    std::thread::sleep(Duration::from_millis(1200));
    wait_until_no_sandbox(&s);
    // An evicted session keeps its pause only in the store: GET, and a retry of the
    // resume that led to it, answer it from there.
    assert_eq!(status(&s, &p2), p2);
    assert_eq!(paused(answer(&s, &p, |_| json!(10))), p2);
    let p3 = paused(answer(&s, &p2, |_| json!(11)));
    assert_eq!(p3["partial_stdout"], "c1 got 11\nc2\n", "{p3}");
    let end = completed(answer(&s, &p3, |_| json!(12)));
    assert_eq!(end["stdout"], "c0\nc0 got 10\nc1\nc1 got 11\nc2\nc2 got 12\n", "{end}");
    assert_eq!(end["tool_calls_made"], 3, "{end}");
    wait_until_no_sandbox(&s);
}

#[test]
fn javascript_and_bash_sessions_survive_a_restart() {
    let s = Server::start();
    let js = start(
        &s,
        "javascript",
        src(&[
            "console.log('js-start');",
            "const r = await get({ n: Math.floor(Math.random() * 1e9) });",
            "console.log('js-got', r);",
        ]),
    );
    assert_eq!(js["partial_stdout"], "js-start\n", "{js}");
    let sh = start(
        &s,
        "bash",
        src(&[
            "echo sh-start",
            // $RANDOM of the main shell (a subshell reseeds its own, from the clock).
            "n=$RANDOM",
            "r=$(get n=$n)",
            "echo \"sh-got $r\"",
        ]),
    );
    assert_eq!(sh["partial_stdout"], "sh-start\n", "{sh}");
    let (s, _) = s.restart(&[], true);
    let js_end = completed(answer(&s, &js, |_| json!(5)));
    assert_eq!(js_end["stdout"], "js-start\njs-got 5\n", "{js_end}");
    let sh_end = completed(answer(&s, &sh, |_| json!(6)));
    assert_eq!(sh_end["stdout"], "sh-start\nsh-got 6\n", "{sh_end}");
}

#[test]
fn a_warm_python_session_with_numpy_replays_the_same_numbers() {
    // A warm sandbox's program started with a hash seed of its own; the replay (warm
    // from the same template, or cold) must start with the same one, and numpy's generator must draw alike.
    let s = Server::start_with(&[("SANDCALL_WARM_POOL_SIZE", "1")], "");
    let p = start(
        &s,
        "python",
        src(&[
            "import numpy as np",
            "print('np-start')",
            "order = ','.join({'alpha', 'beta', 'gamma', 'delta', 'epsilon'})",
            "r = get(n=int(np.random.randint(0, 2**31 - 1)), order=order)",
            "print('np-got', r)",
        ]),
    );
    let (s, _) = s.restart(&[], true);
    let end = completed(answer(&s, &p, |_| json!(3)));
    assert_eq!(end["stdout"], "np-start\nnp-got 3\n", "{end}");
}

#[test]
fn a_resume_cut_off_by_a_crash_is_answered_when_retried() {
    // The resume was accepted (journalled) and the program was running when the server
    // died: after the restart the program runs again to its next pause, and a retry of
    // the same resume (same token, same results) gets it.
    let s = Server::start();
    let p = start(
        &s,
        "python",
        src(&[
            "import time",
            "a = get(n=1)",
            "print('slept', a)",
            "time.sleep(2)",
            "b = get(n=2)",
            "print('done', a + b)",
        ]),
    );
    let results = vec![json!({"call_id": p["tool_calls"][0]["id"], "result": 10, "is_error": false})];
    let base = s.base.clone();
    let body = json!({"continuation_token": p["continuation_token"], "tool_results": results.clone()});
    let cut = std::thread::spawn(move || {
        let _ = ureq::post(&format!("{base}{ROUTE}")).send_json(body);
    });
    std::thread::sleep(Duration::from_millis(800));
    let (s, _) = s.restart(&[], true);
    cut.join().unwrap();
    let token = p["continuation_token"].as_str().unwrap();
    let next = paused(resume_with(&s, &p, token, results));
    assert_eq!(next["tool_calls"][0]["arguments"], json!({"n": 2}), "{next}");
    // The output the cut-off answer would have carried.
    assert_eq!(next["partial_stdout"], "slept 10\n", "{next}");
    // Other results with the same token are another use: 409.
    let other = vec![json!({"call_id": p["tool_calls"][0]["id"], "result": 11, "is_error": false})];
    let (code, v) = resume_with(&s, &p, token, other);
    assert_eq!(code, 409, "{v}");
    let end = completed(answer(&s, &next, |_| json!(5)));
    assert_eq!(end["stdout"], "slept 10\ndone 15\n", "{end}");
}

#[test]
fn evicted_sessions_can_be_cancelled_and_expire() {
    let s = Server::start_with(
        &[
            NO_POOL,
            ("SANDCALL_SESSION_IDLE_EVICT_S", "1"),
            ("SANDCALL_SESSION_EXPIRY_S", "4"),
        ],
        "",
    );
    let code = src(&["r = get(n=1)", "print(r)"]);
    let cancelled = start(&s, "python", code.clone());
    let expiring = start(&s, "python", code);
    std::thread::sleep(Duration::from_millis(1200));
    wait_until_no_sandbox(&s);
    crate::common::settle(|| in_memory(&s), 0);
    let (status_code, v) = s.post(
        &format!("{ROUTE}/cancel"),
        &json!({"session_id": cancelled["session_id"]}),
    );
    assert_eq!(status_code, 200, "{v}");
    assert_eq!(v["error_type"], "cancelled", "{v}");
    let (code, v) = answer(&s, &cancelled, |_| json!(1));
    assert!(code == 404 || code == 409, "a cancelled session's resume: {code} {v}");
    // The other one expires with its pause (session_expiry_s), evicted or not.
    std::thread::sleep(Duration::from_secs(4));
    let (code, v) = answer(&s, &expiring, |_| json!(1));
    assert_eq!(code, 404, "{v}");
    assert_eq!(v["error_type"], "session_not_found", "{v}");
    assert_eq!(dormant(&s), Some(0));
    // Gone from the journal too: a restart does not bring either back.
    let (s, _) = s.restart(&[], false);
    let (code, _, v) = s.request(
        "GET",
        &format!("{ROUTE}/{}", expiring["session_id"].as_str().unwrap()),
        None,
        None,
    );
    assert_eq!(code, 404, "{v}");
}

#[test]
fn one_token_of_an_evicted_session_is_accepted_once_when_sent_twice_at_once() {
    let s = Server::start_with(&[NO_POOL, ("SANDCALL_SESSION_IDLE_EVICT_S", "1")], "");
    let p = start(&s, "python", src(&["r = get(n=1)", "print('got', r)"]));
    std::thread::sleep(Duration::from_millis(1200));
    wait_until_no_sandbox(&s);
    let s = std::sync::Arc::new(s);
    let threads: Vec<_> = [1, 2]
        .into_iter()
        .map(|v| {
            let (s, p) = (s.clone(), p.clone());
            std::thread::spawn(move || answer(&s, &p, move |_| json!(v)))
        })
        .collect();
    let answers: Vec<(u16, Value)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let won: Vec<&Value> = answers.iter().filter(|(c, _)| *c == 200).map(|(_, v)| v).collect();
    assert_eq!(won.len(), 1, "{answers:?}");
    assert_eq!(won[0]["status"], "completed", "{answers:?}");
    let lost = answers.iter().find(|(c, _)| *c != 200).unwrap();
    assert_eq!(lost.0, 409, "{answers:?}");
    assert_eq!(lost.1["error_type"], "continuation_token_used", "{answers:?}");
}

#[test]
fn an_evicted_session_still_counts_among_its_principals_sessions() {
    // It gives back its sandbox, not its place: what one principal keeps journalled is
    // bounded by max_sessions_per_principal.
    let s = Server::start_with(
        &[
            NO_POOL,
            ("SANDCALL_SESSION_IDLE_EVICT_S", "1"),
            ("SANDCALL_MAX_SESSIONS_PER_PRINCIPAL", "1"),
        ],
        "",
    );
    let code = src(&["r = get(n=1)", "print(r)"]);
    let first = start(&s, "python", code.clone());
    std::thread::sleep(Duration::from_millis(1200));
    wait_until_no_sandbox(&s);
    let body = json!({"language": "python", "code": code, "tools": [get_tool()]});
    // Counted by the store: nothing of it is in the server's memory.
    crate::common::settle(|| in_memory(&s), 0);
    let (status_code, v) = s.post(ROUTE, &body);
    assert_eq!(status_code, 429, "{v}");
    assert_eq!(v["error_type"], "principal_at_capacity", "{v}");
    // Not after a restart either: the store still counts it.
    let env = [
        NO_POOL,
        ("SANDCALL_SESSION_IDLE_EVICT_S", "1"),
        ("SANDCALL_MAX_SESSIONS_PER_PRINCIPAL", "1"),
    ];
    let (s, _) = s.restart(&env, false);
    let (status_code, v) = s.post(ROUTE, &body);
    assert_eq!(status_code, 429, "{v}");
    assert_eq!(v["error_type"], "principal_at_capacity", "{v}");
    // Its resume takes its place back; once it has ended, the place is free.
    let end = completed(answer(&s, &first, |_| json!(1)));
    assert_eq!(end["stdout"], "1\n", "{end}");
    let (status_code, v) = s.post(ROUTE, &body);
    assert_eq!(status_code, 200, "{v}");
}

#[test]
fn an_evicted_session_still_gets_its_tool_call_timeout() {
    // Eviction changes nothing the caller sees: an unanswered pause still times out at
    // tool_call_timeout_ms, and the program goes on (brought back by replay for it).
    let s = Server::start_with(
        &[
            NO_POOL,
            ("SANDCALL_SESSION_IDLE_EVICT_S", "1"),
            ("SANDCALL_TOOL_CALL_TIMEOUT_MS", "3000"),
        ],
        "",
    );
    let p = start(
        &s,
        "python",
        src(&[
            "print('before')",
            "try:",
            "    r = get(n=1)",
            "    print('got', r)",
            "except TimeoutError:",
            "    print('timed out')",
            "print('done')",
        ]),
    );
    std::thread::sleep(Duration::from_millis(1200));
    wait_until_no_sandbox(&s);
    // Timed out from the store's deadline index: nothing of it is in memory till then.
    crate::common::settle(|| in_memory(&s), 0);
    let t = Instant::now();
    let end = loop {
        let v = status(&s, &p);
        if v["status"] == "completed" || v["status"] == "error" {
            break v;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "not ended: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(end["status"], "completed", "{end}");
    assert_eq!(end["stdout"], "before\ntimed out\ndone\n", "{end}");
    // The stale token gets the ending, as on a live session.
    let (code, v) = answer(&s, &p, |_| json!(1));
    assert_eq!(code, 200, "{v}");
    assert_eq!(v, end);
}

/// The session entries the server keeps in memory (`sandcall_sessions_in_memory`).
fn in_memory(s: &Server) -> u64 {
    let (code, _, v) = s.request("GET", "/metrics", None, None);
    assert_eq!(code, 200, "{v}");
    let text = v.as_str().unwrap_or_default();
    let n = text
        .lines()
        .find_map(|l| l.strip_prefix("sandcall_sessions_in_memory "))
        .and_then(|n| n.trim().parse::<f64>().ok());
    n.unwrap_or_else(|| panic!("no sandcall_sessions_in_memory in {text}")) as u64
}

/// `dormant_sessions` of `GET /v1/health`.
fn dormant(s: &Server) -> Option<u64> {
    let (_, _, health) = s.request("GET", "/v1/health", None, None);
    health["dormant_sessions"].as_u64()
}

fn calls_of(s: &Server, paused: &Value) -> Value {
    let path = format!("{ROUTE}/{}/calls", paused["session_id"].as_str().unwrap());
    let (code, _, v) = s.request("GET", &path, None, None);
    assert_eq!(code, 200, "{v}");
    v
}

#[test]
fn an_evicted_session_is_kept_by_the_store_alone_and_every_request_still_finds_it() {
    // Both sessions must still be in memory when the second has paused: the idle time
    // must outlast the second's start, a cold sandbox (a cold gVisor sandbox under load
    // has taken more than a second).
    let s = Server::start_with(&[NO_POOL, ("SANDCALL_SESSION_IDLE_EVICT_S", "3")], "");
    let past_idle = Duration::from_millis(3200);
    let body = |code: String| json!({"language": "python", "code": code, "tools": [get_tool()]});
    let (code, a) = s.post_with(
        ROUTE,
        &body(looping_program()),
        &[("X-LibreChat-Code-Request-ID", "req-a")],
    );
    assert_eq!(code, 200, "{a}");
    let one_call = src(&["r = get(n=1)", "print(r)"]);
    let (code, b) = s.post_with(ROUTE, &body(one_call), &[("X-LibreChat-Code-Request-ID", "req-b")]);
    assert_eq!(code, 200, "{b}");
    let calls_before = calls_of(&s, &a);
    assert_eq!(
        calls_before["calls"].as_array().map(Vec::len),
        Some(1),
        "{calls_before}"
    );
    assert_eq!(in_memory(&s), 2);

    // Evicted: no sandbox, and no entry in the server's memory; the store counts them.
    std::thread::sleep(past_idle);
    wait_until_no_sandbox(&s);
    crate::common::settle(|| in_memory(&s), 0);
    assert_eq!(dormant(&s), Some(2));
    // GET and the audit trail answer from the store what they answered before, and
    // bring nothing back into memory.
    assert_eq!(status(&s, &a), a);
    assert_eq!(calls_of(&s, &a), calls_before);
    assert_eq!(in_memory(&s), 0);

    // Cancel by the request id of the request that started it.
    let cancel = format!("{ROUTE}/cancel");
    let (code, v) = s.post_with(&cancel, &json!({"request_id": "req-b"}), &[]);
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        (&v["error_type"], &v["session_id"]),
        (&json!("cancelled"), &b["session_id"]),
        "{v}"
    );
    let (code, v) = s.post_with(&cancel, &json!({"request_id": "req-b"}), &[]);
    assert_eq!(code, 404, "{v}");
    assert_eq!(dormant(&s), Some(1));
    assert_eq!(in_memory(&s), 0);

    // A resume brings it back by replay, under a new request id; evicted again, its
    // trail lists each call once.
    let results = json!([{"call_id": a["tool_calls"][0]["id"], "result": 10}]);
    let resume =
        json!({"session_id": a["session_id"], "continuation_token": a["continuation_token"], "tool_results": results});
    let (code, a2) = s.post_with(ROUTE, &resume, &[("X-LibreChat-Code-Request-ID", "req-a2")]);
    assert_eq!(code, 200, "{a2}");
    assert_eq!(a2["partial_stdout"], "c0 got 10\nc1\n", "{a2}");
    let calls_live = calls_of(&s, &a);
    std::thread::sleep(past_idle);
    wait_until_no_sandbox(&s);
    crate::common::settle(|| in_memory(&s), 0);
    let calls_dormant = calls_of(&s, &a);
    assert_eq!(calls_dormant, calls_live);
    let outcomes: Vec<&Value> = calls_dormant["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["outcome"]["status"])
        .collect();
    assert_eq!(outcomes, ["answered", "pending"], "{calls_dormant}");
    // The resume's request id names it now, not the start's.
    let (code, v) = s.post_with(&cancel, &json!({"request_id": "req-a"}), &[]);
    assert_eq!(code, 404, "{v}");
    let (code, v) = s.post_with(&cancel, &json!({"request_id": "req-a2"}), &[]);
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["error_type"], "cancelled", "{v}");
    assert_eq!(dormant(&s), Some(0));
    assert_eq!(in_memory(&s), 0);
}

#[test]
fn many_evicted_sessions_leave_no_entry_in_memory() {
    // Eviction of many sessions at once: each leaves the registry; the store counts
    // them, and each still completes.
    let s = Server::start_with(&[NO_POOL, ("SANDCALL_SESSION_IDLE_EVICT_S", "1")], "");
    let sessions: Vec<Value> = (0..8)
        .map(|i| start(&s, "python", src(&[&format!("r = get(n={i})"), "print('got', r)"])))
        .collect();
    std::thread::sleep(Duration::from_millis(1200));
    wait_until_no_sandbox(&s);
    crate::common::settle(|| in_memory(&s), 0);
    assert_eq!(dormant(&s), Some(8));
    for (i, p) in sessions.iter().enumerate() {
        let end = completed(answer(&s, p, move |_| json!(i)));
        assert_eq!(end["stdout"], format!("got {i}\n"), "{end}");
    }
    assert_eq!(dormant(&s), Some(0));
}

/// Sandboxes built for a request, not ahead of it for the warm pool.
fn cold_builds(s: &Server) -> u64 {
    let (_, _, v) = s.request("GET", "/metrics", None, None);
    let text = v.as_str().unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("sandcall_sandbox_build_seconds_count{warm=\"false\"} "))
        .and_then(|n| n.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

#[test]
fn a_replay_takes_a_warm_sandbox_when_one_hashes_alike() {
    // A cold start was most of a replayed resume's time (docs/scaling.md). A JavaScript
    // sandbox has no hash seed to match: the replay takes one from the pool.
    let s = Server::start_with(
        &[
            ("SANDCALL_WARM_POOL_SIZE", "1"),
            ("SANDCALL_WARM_LANGUAGES", r#"["javascript"]"#),
            ("SANDCALL_SESSION_IDLE_EVICT_S", "1"),
        ],
        "",
    );
    let p = start(
        &s,
        "javascript",
        src(&[
            "console.log('a');",
            "const r = await get({ n: 1 });",
            "console.log('got', r);",
        ]),
    );
    std::thread::sleep(Duration::from_millis(1200));
    crate::common::settle(|| in_memory(&s), 0);
    s.wait_warm(1);
    let before = cold_builds(&s);
    let (code, _, v) = s.request(
        "POST",
        ROUTE,
        Some("application/json"),
        Some(
            &json!({"session_id": p["session_id"], "continuation_token": p["continuation_token"],
                    "tool_results": [{"call_id": p["tool_calls"][0]["id"], "result": 5}]})
            .to_string(),
        ),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["stdout"], "a\ngot 5\n", "{v}");
    assert_eq!(cold_builds(&s), before, "the replay built a cold sandbox");
}
