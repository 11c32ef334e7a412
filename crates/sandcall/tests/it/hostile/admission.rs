//! One principal cannot take every session or run slot, and programmatic runs are
//! counted in admission like `/v1/exec`: a session holds a run slot while its program
//! runs, not while it sits paused.

use crate::common::Server;
use crate::files::{Client, Reply};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const KEYS: &str = "alice:key-a-0123456789abcdef,bob:key-b-0123456789abcdef";
const ALICE: &str = "key-a-0123456789abcdef";
const BOB: &str = "key-b-0123456789abcdef";
const ROUTE: &str = "/v1/exec/programmatic";

fn rate_tool() -> Value {
    json!({"name": "get_rate", "parameters": {"type": "object", "properties": {"base": {"type": "string"}}}})
}

/// Starts a session that pauses at its first call; returns the raw reply.
fn start_paused(c: &Client) -> Reply {
    c.post_json(
        ROUTE,
        &json!({"code": "print('rate', get_rate(base='USD'))", "tools": [rate_tool()]}),
    )
}

fn paused(reply: &Reply) -> Value {
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    assert_eq!(v["status"], "tool_call_required", "{v}");
    v
}

fn resume_body(paused: &Value) -> Value {
    json!({
        "continuation_token": paused["continuation_token"],
        "tool_results": [{"call_id": paused["tool_calls"][0]["id"], "result": 0.92}],
    })
}

fn assert_refused(reply: &Reply, status: u16, error_type: &str) {
    assert_eq!(reply.status, status, "{reply}");
    assert_eq!(reply.json()["error_type"], error_type, "{reply}");
    assert!(reply.json()["error"].as_str().is_some_and(|m| !m.is_empty()), "{reply}");
    assert!(reply.retry_after.is_some(), "no Retry-After: {reply}");
}

#[test]
fn one_principal_cannot_hold_every_session() {
    let s = Server::start_with(
        &[("SANDCALL_API_KEYS", KEYS)],
        "max_sessions = 4\nmax_sessions_per_principal = 2\n",
    );
    let (alice, bob) = (Client::bearer(&s, ALICE), Client::bearer(&s, BOB));
    let a1 = paused(&start_paused(&alice));
    let _a2 = paused(&start_paused(&alice));
    let third = start_paused(&alice);
    assert_refused(&third, 429, "principal_at_capacity");
    assert!(third.json()["error"]
        .as_str()
        .unwrap()
        .contains("max_sessions_per_principal"));
    // Everyone else still gets their sessions.
    let b1 = paused(&start_paused(&bob));
    let _b2 = paused(&start_paused(&bob));
    // Ending one of alice's gives her the place back.
    let cancelled = alice.post_json(&format!("{ROUTE}/cancel"), &json!({"session_id": a1["session_id"]}));
    assert_eq!(cancelled.json()["error_type"], "cancelled", "{cancelled}");
    paused(&start_paused(&alice));
    // The refused start changed nothing: bob's session resumes as ever.
    let done = bob.post_json(ROUTE, &resume_body(&b1)).json();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["stdout"], "rate 0.92\n");
}

#[test]
fn programmatic_runs_take_run_slots_like_exec() {
    let s = Server::start_with(
        &[],
        "max_concurrent_runs = 2\nmax_queued_runs = 0\nqueue_timeout_ms = 500\n",
    );
    // Each program spins for 3 s of wall time and calls no tool.
    let spin = json!({"code": "import time\nt = time.time()\nwhile time.time() - t < 3: pass\nprint('done')", "tools": [], "timeout": 20000});
    let base = s.base.clone();
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let (base, spin) = (base.clone(), spin.clone());
            std::thread::spawn(move || Client::at(&base).post_json(ROUTE, &spin))
        })
        .collect();
    // While they run, health counts them, and never more than the capacity.
    let mut seen = Vec::new();
    let until = Instant::now() + Duration::from_millis(2000);
    while Instant::now() < until {
        let (_, _, health) = s.request("GET", "/v1/health", None, None);
        seen.push(health["active_runs"].as_u64().unwrap());
        std::thread::sleep(Duration::from_millis(100));
    }
    let replies: Vec<Reply> = runs.into_iter().map(|t| t.join().unwrap()).collect();
    let completed = replies.iter().filter(|r| r.json()["status"] == "completed").count();
    for r in replies.iter().filter(|r| r.json()["status"] != "completed") {
        assert_refused(r, 503, "at_capacity");
    }
    assert_eq!(
        completed,
        2,
        "{:?}",
        replies.iter().map(|r| r.to_string()).collect::<Vec<_>>()
    );
    assert!(seen.iter().all(|&n| n <= 2), "active_runs over the capacity: {seen:?}");
    assert!(seen.contains(&2), "health did not count the running sessions: {seen:?}");
}

#[test]
fn a_paused_session_holds_no_run_slot_and_its_resume_waits_for_one() {
    let s = Server::start_with(&[], "max_concurrent_runs = 1\nmax_queued_runs = 0\n");
    let c = Client::anonymous(&s);
    let p = paused(&start_paused(&c));
    // Health tells it as it is: one session, paused, and no program running.
    let (_, _, health) = s.request("GET", "/v1/health", None, None);
    assert_eq!(health["active_runs"], 0, "{health}");
    assert_eq!(health["sessions"], 1, "{health}");
    assert_eq!(health["paused_sessions"], 1, "{health}");
    // The one slot is free for others while the session waits for its caller.
    let r = s.py("print(1)");
    assert_eq!(r["stdout"], "1\n", "{r}");
    // With the slot busy and no queue, the resume is refused and the token stays good.
    let base = s.base.clone();
    let busy = std::thread::spawn(move || {
        Client::at(&base).post_json("/v1/exec", &json!({"code": "import time\ntime.sleep(2)"}))
    });
    let t = Instant::now();
    while s.request("GET", "/v1/health", None, None).2["active_runs"] != 1 {
        assert!(t.elapsed() < Duration::from_secs(10), "the busy run never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Results that do not fit are answered at once, without a slot.
    let wrong =
        json!({"continuation_token": p["continuation_token"], "tool_results": [{"call_id": "nope", "result": 1}]});
    let reply = c.post_json(ROUTE, &wrong);
    assert_eq!(reply.status, 400, "{reply}");
    assert_eq!(reply.json()["error_type"], "invalid_tool_results", "{reply}");
    assert_refused(&c.post_json(ROUTE, &resume_body(&p)), 503, "at_capacity");
    assert_eq!(busy.join().unwrap().status, 200);
    let done = c.post_json(ROUTE, &resume_body(&p)).json();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["stdout"], "rate 0.92\n");
    let (_, _, health) = s.request("GET", "/v1/health", None, None);
    assert_eq!(
        (&health["active_runs"], &health["sessions"], &health["paused_sessions"]),
        (&json!(0), &json!(0), &json!(0)),
        "{health}"
    );
}

#[test]
fn one_principal_cannot_take_every_run_slot() {
    let s = Server::start_with(
        &[("SANDCALL_API_KEYS", KEYS)],
        "max_concurrent_runs = 4\nmax_runs_per_principal = 1\n",
    );
    let base = s.base.clone();
    let long = std::thread::spawn(move || {
        Client::at(&base)
            .with("Authorization", &format!("Bearer {ALICE}"))
            .post_json(
                "/v1/exec",
                &json!({"code": "import time\ntime.sleep(3)\nprint('slept')"}),
            )
    });
    let alice = Client::bearer(&s, ALICE);
    let t = Instant::now();
    while alice.get("/v1/health").json()["active_runs"] != 1 {
        assert!(t.elapsed() < Duration::from_secs(10), "alice's run never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let refused = alice.post_json("/v1/exec", &json!({"code": "print(2)"}));
    assert_refused(&refused, 429, "principal_at_capacity");
    assert!(refused.json()["error"]
        .as_str()
        .unwrap()
        .contains("max_runs_per_principal"));
    // A programmatic start is the same kind of run, and is refused the same way.
    assert_refused(&start_paused(&alice), 429, "principal_at_capacity");
    let bob = Client::bearer(&s, BOB).post_json("/v1/exec", &json!({"code": "print(3)"}));
    assert_eq!(bob.json()["stdout"], "3\n", "{bob}");
    assert_eq!(long.join().unwrap().json()["stdout"], "slept\n");
    // Her share is back once her run ended.
    assert_eq!(
        alice.post_json("/v1/exec", &json!({"code": "print(4)"})).json()["stdout"],
        "4\n"
    );
}

/// A resume that races the end of its session (here, a cancel) must not keep the run slot
/// it took: once every session has ended, health counts no program running.
#[test]
fn a_resume_racing_the_end_of_its_session_keeps_no_slot() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    for delay_ms in [0, 5, 10, 20, 30, 40] {
        let p = paused(&start_paused(&c));
        let base = s.base.clone();
        let id = p["session_id"].clone();
        let cancel = std::thread::spawn(move || {
            Client::at(&base).post_json(&format!("{ROUTE}/cancel"), &json!({"session_id": id}))
        });
        std::thread::sleep(Duration::from_millis(delay_ms));
        // Whatever it gets (the ending, 409 or 404), it must leave nothing held.
        let _ = c.post_json(ROUTE, &resume_body(&p));
        assert_eq!(cancel.join().unwrap().status, 200);
    }
    let t = Instant::now();
    loop {
        let (_, _, health) = s.request("GET", "/v1/health", None, None);
        if health["active_runs"] == 0 && health["sessions"] == 0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "still held after every session ended: {health}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
