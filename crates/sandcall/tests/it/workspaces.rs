//! Workspaces (`workspaces = true`): a run with `runtime_session_hint` or `workspace_id`
//! starts in the working directory that its principal's previous run with the same one
//! left; one run at a time (409 `workspace_busy`); off by default.

use crate::common::Server;
use crate::files::{assert_error, Client};
use serde_json::{json, Value};
use std::time::Duration;

const KEYS: &str = "alice:key-a-0123456789abcdef,bob:key-b-0123456789abcdef";
const ALICE: &str = "key-a-0123456789abcdef";
const BOB: &str = "key-b-0123456789abcdef";

fn bash(c: &Client, code: &str, workspace: Value) -> Value {
    let mut body = json!({"language": "bash", "code": code});
    if let (Some(obj), Value::Object(ws)) = (body.as_object_mut(), workspace) {
        obj.extend(ws);
    }
    c.exec(body)
}

/// Runs 1, 2, ... of one conversation: what each one leaves, the next one finds.
pub(crate) fn a_workspace_carries_files_from_run_to_run(a: &Client, b: &Client) {
    let hint = json!({"runtime_session_hint": "conv_1.a:b-c"});
    let r = bash(a, "echo one > notes.txt; mkdir -p d; echo deep > d/x.txt", hint.clone());
    assert_eq!(r["status"], "ok", "{r}");
    let r = bash(a, "cat notes.txt d/x.txt; echo two >> notes.txt", hint.clone());
    assert_eq!(r["stdout"], "one\ndeep\n", "{r}");
    let r = bash(a, "cat notes.txt; rm d/x.txt", hint.clone());
    assert_eq!(r["stdout"], "one\ntwo\n", "{r}");
    // A deleted file is gone from the workspace.
    let r = bash(a, "ls -R", hint.clone());
    assert!(!r["stdout"].as_str().unwrap().contains("x.txt"), "{r}");
    assert!(r["stdout"].as_str().unwrap().contains("notes.txt"), "{r}");
    // `workspace_id` names the same workspace; another hint is another workspace, and
    // a run without one starts empty.
    let r = bash(a, "cat notes.txt", json!({"workspace_id": "conv_1.a:b-c"}));
    assert_eq!(r["stdout"], "one\ntwo\n", "{r}");
    let r = bash(a, "ls", json!({"runtime_session_hint": "conv_2"}));
    assert_eq!(r["stdout"], "", "{r}");
    let r = bash(a, "ls", json!({}));
    assert_eq!(r["stdout"], "", "{r}");
    // Another principal with the same hint has a workspace of its own.
    let r = bash(b, "ls", hint.clone());
    assert_eq!(r["stdout"], "", "{r}");
}

/// While one run holds a workspace, another run in it gets 409 `workspace_busy`; once
/// the first has ended, the workspace is free again.
pub(crate) fn concurrent_use_of_a_workspace_is_409(first: &Client, second: &Client) {
    let hint = json!({"runtime_session_hint": "busy"});
    std::thread::scope(|scope| {
        let long = scope.spawn(|| bash(first, "sleep 3; echo done > out.txt", hint.clone()));
        std::thread::sleep(Duration::from_millis(1500));
        let reply = second.post_json(
            "/v1/exec",
            &json!({"language": "bash", "code": "ls", "runtime_session_hint": "busy"}),
        );
        assert_error(&reply, 409, "workspace_busy");
        let r = long.join().unwrap();
        assert_eq!(r["status"], "ok", "{r}");
    });
    let r = bash(second, "cat out.txt", hint);
    assert_eq!(r["stdout"], "done\n", "{r}");
}

#[test]
fn a_workspace_keeps_files_per_hint_and_principal() {
    let s = Server::start_with(&[("SANDCALL_API_KEYS", KEYS), ("SANDCALL_WORKSPACES", "true")], "");
    a_workspace_carries_files_from_run_to_run(&Client::api_key(&s, ALICE), &Client::api_key(&s, BOB));
}

#[test]
fn concurrent_use_is_409() {
    let s = Server::start_with(&[("SANDCALL_WORKSPACES", "true")], "");
    let c = Client::anonymous(&s);
    concurrent_use_of_a_workspace_is_409(&c, &c);
}

#[test]
fn bad_workspace_names_are_400() {
    let s = Server::start_with(&[("SANDCALL_WORKSPACES", "true")], "");
    let c = Client::anonymous(&s);
    for body in [
        json!({"code": "ls", "runtime_session_hint": "has space"}),
        json!({"code": "ls", "runtime_session_hint": 42}),
        json!({"code": "ls", "workspace_id": ""}),
        json!({"code": "ls", "workspace_id": "x".repeat(257)}),
        json!({"code": "ls", "workspace_id": "../x"}),
    ] {
        assert_error(&c.post_json("/v1/exec", &body), 400, "invalid_request");
    }
}

#[test]
fn workspaces_are_off_by_default() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    // The hint is ignored, even a malformed one: LibreChat sends it to every server.
    let hint = json!({"runtime_session_hint": "conv"});
    bash(&c, "echo one > notes.txt", hint.clone());
    let r = bash(&c, "ls", hint);
    assert_eq!(r["stdout"], "", "{r}");
    let r = bash(&c, "echo ok", json!({"runtime_session_hint": {"forged": true}}));
    assert_eq!(r["stdout"], "ok\n", "{r}");
    // `workspace_id` is sandcall's own: refused rather than silently starting afresh.
    let reply = c.post_json("/v1/exec", &json!({"code": "ls", "workspace_id": "conv"}));
    assert_error(&reply, 400, "invalid_request");
}

#[test]
fn a_workspace_in_use_outlives_file_ttl_and_ends_file_ttl_after_its_last_run() {
    let s = Server::start_with(
        &[
            ("SANDCALL_WORKSPACES", "true"),
            ("SANDCALL_FILE_TTL_S", "3"),
            ("SANDCALL_FILE_SWEEP_INTERVAL_S", "1"),
        ],
        "",
    );
    let c = Client::anonymous(&s);
    let hint = json!({"workspace_id": "kept"});
    bash(&c, "echo kept > a.txt", hint.clone());
    // Read, never changed, for twice the ttl: each run renews it.
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(6) {
        let r = bash(&c, "cat a.txt", hint.clone());
        assert_eq!(r["stdout"], "kept\n", "after {:?}: {r}", start.elapsed());
        std::thread::sleep(Duration::from_millis(700));
    }
    // Unused for longer than the ttl: gone.
    std::thread::sleep(Duration::from_secs(5));
    let r = bash(&c, "ls", hint);
    assert_eq!(r["stdout"], "", "{r}");
}
