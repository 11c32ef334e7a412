//! A programmatic session in a workspace (`runtime_session_hint` or `workspace_id` on
//! its start, `workspaces` on): LibreChat's stateful profile on the programmatic route.
//! The session holds the workspace from its start to its end, pauses included (409
//! `workspace_busy` for any other run in it meanwhile); a session that completes leaves
//! its files for the next run, any other end leaves the workspace as it was.

use super::support::{assert_api_error, ok_result, rate_tool, resume, session_id, src, start, state, usd_eur, ROUTE};
use crate::common::{Server, NO_POOL};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const WORKSPACES: (&str, &str) = ("SANDCALL_WORKSPACES", "true");

/// A Python program in workspace `hint` that runs `before`, calls the rate tool once
/// (a pause), then runs `after`.
fn around_a_call(hint: &str, before: &[&str], after: &[&str]) -> Value {
    let mut lines = before.to_vec();
    lines.push("rate = get_exchange_rate(base=\"USD\", quote=\"EUR\")");
    lines.extend_from_slice(after);
    json!({
        "language": "python",
        "code": src(&lines),
        "tools": [rate_tool()],
        "runtime_session_hint": hint,
    })
}

/// Answers the one call of `paused`.
fn answer(s: &Server, paused: &Value) -> (u16, Value) {
    assert_eq!(paused["status"], "tool_call_required", "{paused}");
    let call = &paused["tool_calls"][0];
    assert_eq!(call["arguments"], usd_eur(), "{paused}");
    resume(s, paused, json!([ok_result(&call["id"], json!({"rate": 0.9}))]))
}

fn bash(s: &Server, hint: &str, code: &str) -> (u16, Value) {
    s.post(
        "/v1/exec",
        &json!({"language": "bash", "code": code, "runtime_session_hint": hint}),
    )
}

/// A run of `code` in `hint` that must be served (the workspace is free).
fn bash_ok(s: &Server, hint: &str, code: &str) -> Value {
    let (status, v) = bash(s, hint, code);
    assert_eq!(status, 200, "the workspace is not free: {v}");
    v
}

/// Files written before and after a pause are there for the next /v1/exec of the same
/// hint, and of no other; meanwhile every other run in the workspace is 409; the
/// session's answer carries the workspace's id and status, and the inputs it deleted.
#[test]
fn a_session_holds_its_workspace_across_a_pause_and_leaves_its_files_for_the_next_run() {
    let s = Server::start_with(&[WORKSPACES], "");
    let hint = "conv-programmatic";
    let first = start(
        &s,
        &around_a_call(
            hint,
            &["open('before.txt', 'w').write('written before the call\\n')"],
            &[
                "open('after.txt', 'w').write(f'rate {rate[\"rate\"]}\\n')",
                "print('done')",
            ],
        ),
    );
    assert_eq!(first["status"], "tool_call_required", "{first}");

    // Paused, the session still holds the workspace: /v1/exec and another programmatic
    // start in it are 409, another workspace is free.
    let (status, v) = bash(&s, hint, "ls");
    assert_api_error(status, &v, 409, "workspace_busy");
    let (status, v) = s.post(ROUTE, &around_a_call(hint, &[], &[]));
    assert_api_error(status, &v, 409, "workspace_busy");
    let (status, v) = s.post(
        ROUTE,
        &json!({"code": "print(1)", "tools": [rate_tool()], "workspace_id": hint}),
    );
    assert_api_error(status, &v, 409, "workspace_busy");
    let other = bash_ok(&s, "conv-other", "echo other > other.txt; ls");
    assert_eq!(other["stdout"], "other.txt\n", "{other}");

    let (status, done) = answer(&s, &first);
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["stdout"], "done\n", "{done}");
    assert_eq!(done["runtime_status"], "new", "{done}");
    let id = done["runtime_session_id"].as_str().unwrap_or_default().to_owned();
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "runtime_session_id: {done}"
    );

    // The next run of the conversation finds both files, and the same runtime.
    let next = bash_ok(&s, hint, "cat before.txt after.txt");
    assert_eq!(next["stdout"], "written before the call\nrate 0.9\n", "{next}");
    assert_eq!(
        (next["runtime_session_id"].as_str(), next["runtime_status"].as_str()),
        (Some(id.as_str()), Some("reused")),
        "{next}"
    );
    // Another conversation has its own.
    let other = bash_ok(&s, "conv-other", "ls");
    assert_eq!(other["stdout"], "other.txt\n", "{other}");

    // A second session in the workspace starts from it, and deletes a file of it.
    let second = start(
        &s,
        &around_a_call(
            hint,
            &["import os", "print(open('after.txt').read(), end='')"],
            &["os.remove('before.txt')"],
        ),
    );
    assert_eq!(second["partial_stdout"], "rate 0.9\n", "{second}");
    let (_, done) = answer(&s, &second);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        (done["runtime_session_id"].as_str(), done["runtime_status"].as_str()),
        (Some(id.as_str()), Some("reused")),
        "{done}"
    );
    assert_eq!(done["deleted_files"], json!(["before.txt"]), "{done}");
    let last = bash_ok(&s, hint, "ls");
    assert_eq!(last["stdout"], "after.txt\n", "{last}");
}

/// A session that does not complete (cancelled, out of time, expired) gives the
/// workspace back as it was: what it wrote is not kept, and the next run is served.
#[test]
fn a_session_that_does_not_complete_leaves_the_workspace_as_it_was_and_frees_it() {
    // Paused for a second, a session is evicted (dormant: no driver holds its lease).
    let s = Server::start_with(
        &[
            WORKSPACES,
            NO_POOL,
            ("SANDCALL_SESSION_IDLE_EVICT_S", "1"),
            ("SANDCALL_SESSION_EXPIRY_S", "3"),
        ],
        "",
    );
    let hint = "conv-unchanged";
    bash_ok(&s, hint, "echo before > kept.txt");
    let clobber = [
        "open('kept.txt', 'w').write('clobbered\\n')",
        "open('new.txt', 'w').write('new\\n')",
    ];
    let unchanged = |s: &Server, what: &str| {
        let r = bash_ok(s, hint, "cat kept.txt; ls");
        assert_eq!(r["stdout"], "before\nkept.txt\n", "after {what}: {r}");
    };

    // Cancelled while paused, live and dormant.
    for wait in [Duration::ZERO, Duration::from_millis(2500)] {
        let paused = start(&s, &around_a_call(hint, &clobber, &[]));
        std::thread::sleep(wait);
        let (status, v) = bash(&s, hint, "ls");
        assert_api_error(status, &v, 409, "workspace_busy");
        let (status, v) = s.post(&format!("{ROUTE}/cancel"), &json!({"session_id": session_id(&paused)}));
        assert_eq!((status, v["error_type"].as_str()), (200, Some("cancelled")), "{v}");
        unchanged(&s, &format!("a cancel after {wait:?}"));
    }

    // Out of its run time after a resume.
    let mut body = around_a_call(hint, &clobber, &["import time", "time.sleep(30)"]);
    body["timeout"] = json!(3000);
    let paused = start(&s, &body);
    let (status, v) = answer(&s, &paused);
    assert_eq!((status, v["error_type"].as_str()), (200, Some("timeout")), "{v}");
    unchanged(&s, "a timeout");

    // Not resumed within session_expiry (dormant by then): the workspace is free once
    // the session is gone.
    let paused = start(&s, &around_a_call(hint, &clobber, &[]));
    let id = session_id(&paused);
    let t = Instant::now();
    loop {
        let (status, v) = bash(&s, hint, "ls");
        if status == 200 {
            assert_eq!(
                state(&s, &id).0,
                404,
                "the workspace was free while its session lived: {v}"
            );
            break;
        }
        assert_api_error(status, &v, 409, "workspace_busy");
        assert!(t.elapsed() < Duration::from_secs(20), "the session did not expire");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(t.elapsed() > Duration::from_secs(2), "freed before session_expiry");
    unchanged(&s, "an expiry");
}

/// A session whose program fails (exits non-zero) still completes: as on /v1/exec, what
/// it left is the workspace's.
#[test]
fn a_program_that_fails_still_saves_what_it_left_as_exec_does() {
    let s = Server::start_with(&[WORKSPACES], "");
    let hint = "conv-failing";
    let paused = start(
        &s,
        &around_a_call(
            hint,
            &["open('partial.txt', 'w').write('partial\\n')"],
            &["raise SystemExit(3)"],
        ),
    );
    let (_, done) = answer(&s, &paused);
    assert_eq!(
        (done["status"].as_str(), done["exit_code"].as_i64()),
        (Some("completed"), Some(3)),
        "{done}"
    );
    let r = bash_ok(&s, hint, "cat partial.txt");
    assert_eq!(r["stdout"], "partial\n", "{r}");
}

/// The server is killed while a session pauses in a workspace: the new server keeps the
/// workspace held for the session (409 for another run), the resume replays the program
/// in it and completes, and its files are the workspace's.
#[test]
fn a_session_replayed_after_a_restart_keeps_its_workspace() {
    let s = Server::start_with(&[WORKSPACES, NO_POOL], "");
    let hint = "conv-durable";
    bash_ok(&s, hint, "echo from an earlier run > earlier.txt");
    let paused = start(
        &s,
        &around_a_call(
            hint,
            &["print(open('earlier.txt').read(), end='')"],
            &["open('after.txt', 'w').write('after the restart\\n')", "print('done')"],
        ),
    );
    assert_eq!(paused["partial_stdout"], "from an earlier run\n", "{paused}");
    let (s, _) = s.restart(&[WORKSPACES, NO_POOL], true);
    let (status, v) = bash(&s, hint, "ls");
    assert_api_error(status, &v, 409, "workspace_busy");
    let (status, done) = answer(&s, &paused);
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["runtime_status"], "reused", "{done}");
    let r = bash_ok(&s, hint, "cat earlier.txt after.txt");
    assert_eq!(r["stdout"], "from an earlier run\nafter the restart\n", "{r}");
}
