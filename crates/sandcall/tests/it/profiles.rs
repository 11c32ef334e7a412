//! LibreChat's execution profiles (`execution_profile`, docs/librechat.md): the
//! `X-CodeAPI-Expected-Profile` check, `X-CodeAPI-Execution-Profile` on every response,
//! and what a run's answer tells LibreChat's client: `runtime_session_id`,
//! `runtime_status`, `deleted_files`, `artifact_delivery` and `artifact_truncation`.

use crate::common::Server;
use crate::files::Client;
use serde_json::{json, Value};
use std::time::Duration;

const KEYS: &str = "alice:key-a-0123456789abcdef,bob:key-b-0123456789abcdef";
const ALICE: &str = "key-a-0123456789abcdef";
const BOB: &str = "key-b-0123456789abcdef";

fn stateful() -> Server {
    Server::start_with(
        &[("SANDCALL_API_KEYS", KEYS), ("SANDCALL_EXECUTION_PROFILE", "stateful")],
        "",
    )
}

/// A request with extra headers: status, the `X-CodeAPI-Execution-Profile` it carried,
/// and the body as JSON.
fn send(
    s: &Server,
    method: &str,
    path: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> (u16, Option<String>, Value) {
    let mut all = headers.to_vec();
    if body.is_some() {
        all.push(("Content-Type", "application/json"));
    }
    let body = body.map(Value::to_string);
    s.request_reading(method, path, &all, body.as_deref(), "X-CodeAPI-Execution-Profile")
}

fn bash(code: &str, hint: &str) -> Value {
    json!({"lang": "bash", "code": code, "runtime_session_hint": hint})
}

/// A client that expects the other profile is refused with 409 before anything runs;
/// one that expects this server's, or says nothing, is served; every answer (a 401, a
/// 404, the 409, a 200) names the server's profile.
#[test]
fn the_other_profile_is_409_before_anything_runs_and_every_answer_names_the_profile() {
    let s = stateful();
    let alice = [("X-API-Key", ALICE)];
    let expect = |profile: &'static str| [("X-API-Key", ALICE), ("X-CodeAPI-Expected-Profile", profile)];
    let (status, profile, v) = send(
        &s,
        "POST",
        "/v1/exec",
        Some(&bash("echo x > ran.txt", "conv")),
        &expect("default"),
    );
    assert_eq!((status, profile.as_deref()), (409, Some("stateful")), "{v}");
    assert_eq!(v["error"], "execution_profile_mismatch", "{v}");
    assert_eq!(v["error_type"], "execution_profile_mismatch", "{v}");
    // Nothing ran: the conversation's workspace is still empty.
    let (status, _, v) = send(&s, "POST", "/v1/exec", Some(&bash("ls", "conv")), &expect("stateful"));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stdout"], "", "the refused run wrote to the workspace: {v}");
    // The programmatic route is refused the same way.
    let start = json!({"code": "print(1)", "tools": []});
    let (status, _, v) = send(&s, "POST", "/v1/exec/programmatic", Some(&start), &expect("default"));
    assert_eq!(
        (status, v["error"].as_str()),
        (409, Some("execution_profile_mismatch")),
        "{v}"
    );
    // No header: served as before.
    let (status, profile, v) = send(&s, "POST", "/v1/exec", Some(&bash("echo ok", "conv")), &alice);
    assert_eq!(
        (status, profile.as_deref(), v["stdout"].as_str()),
        (200, Some("stateful"), Some("ok\n")),
        "{v}"
    );
    // A header that names no profile is a bad request.
    let (status, _, v) = send(&s, "POST", "/v1/exec", Some(&bash("true", "conv")), &expect("warm"));
    assert_eq!(
        (status, v["error_type"].as_str()),
        (400, Some("invalid_request")),
        "{v}"
    );
    for (path, credentials, want) in [
        ("/v1/health", &[][..], 200),
        ("/v1/runtimes", &[][..], 401),
        ("/v1/no-such-route", &alice[..], 404),
    ] {
        let (status, profile, v) = send(&s, "GET", path, None, credentials);
        assert_eq!((status, profile.as_deref()), (want, Some("stateful")), "{path}: {v}");
    }

    // A default server refuses a stateful client, and says `default`.
    let d = Server::start();
    let (status, profile, v) = send(
        &d,
        "POST",
        "/v1/exec",
        Some(&bash("echo x", "conv")),
        &[("X-CodeAPI-Expected-Profile", "stateful")],
    );
    assert_eq!((status, profile.as_deref()), (409, Some("default")), "{v}");
    assert_eq!(v["error"], "execution_profile_mismatch", "{v}");
    let (status, profile, v) = send(
        &d,
        "POST",
        "/v1/exec",
        Some(&bash("echo x", "conv")),
        &[("X-CodeAPI-Expected-Profile", "default")],
    );
    assert_eq!(
        (status, profile.as_deref(), v["runtime_session_id"].is_null()),
        (200, Some("default"), true),
        "{v}"
    );
}

/// The stateful profile is workspaces: one conversation's runs share their files, and
/// each answer names the conversation's runtime (`runtime_session_id`, the same for the
/// conversation, another for another conversation or another principal), whether it
/// started with earlier files (`runtime_status`), and the files it deleted.
#[test]
fn a_stateful_run_names_its_runtime_and_the_files_it_deleted() {
    let s = stateful();
    let (a, b) = (Client::api_key(&s, ALICE), Client::api_key(&s, BOB));
    let hint = "v2:conversation:0123abcd";
    let first = a.exec(bash("echo one > a.txt; echo two > b.txt", hint));
    assert_eq!(first["runtime_status"], "new", "{first}");
    let id = first["runtime_session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{first}"))
        .to_owned();
    assert!(first.get("deleted_files").is_none(), "{first}");
    let second = a.exec(bash("cat a.txt; rm a.txt", hint));
    assert_eq!(second["stdout"], "one\n", "{second}");
    assert_eq!(second["runtime_status"], "reused", "{second}");
    assert_eq!(second["runtime_session_id"], id.as_str(), "{second}");
    assert_eq!(second["deleted_files"], json!(["a.txt"]), "{second}");
    let third = a.exec(bash("ls", hint));
    assert_eq!(third["stdout"], "b.txt\n", "{third}");
    assert!(
        third.get("deleted_files").is_none(),
        "an unchanged file is not deleted: {third}"
    );
    // Another conversation, and another principal's conversation of the same hint.
    for other in [a.exec(bash("ls", "v2:conversation:ffff")), b.exec(bash("ls", hint))] {
        assert_eq!(other["stdout"], "", "{other}");
        assert_eq!(other["runtime_status"], "new", "{other}");
        assert!(other["runtime_session_id"].as_str().is_some_and(|o| o != id), "{other}");
    }
}

/// An uploaded input the run deleted comes back in `deleted_files` in the default
/// profile too (LibreChat's client drops it from the conversation's files); one it left
/// or changed does not.
#[test]
fn a_deleted_input_is_in_deleted_files() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let gone = c.upload("gone.txt", "text/plain", b"gone");
    let kept = c.upload("kept.txt", "text/plain", b"kept");
    let changed = c.upload("changed.txt", "text/plain", b"old");
    let files: Vec<Value> = [&gone, &kept, &changed]
        .iter()
        .map(|f| json!({"id": f.id, "storage_session_id": f.session_id, "name": f.name}))
        .collect();
    let r = c.exec(json!({"lang": "bash", "code": "rm gone.txt; echo new > changed.txt", "files": files}));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["deleted_files"], json!(["gone.txt"]), "{r}");
    assert!(r.get("runtime_session_id").is_none(), "no workspace, no runtime: {r}");
}

/// Outputs the collection left out are `artifact_truncation`; outputs that could not be
/// stored are `artifact_delivery`, in the shape LibreChat's client accepts.
#[test]
fn skipped_and_undelivered_outputs_are_reported() {
    let s = Server::start_with(
        &[
            ("SANDCALL_MAX_OUTPUT_FILES", "3"),
            ("SANDCALL_MAX_STORED_FILES_PER_PRINCIPAL", "2"),
        ],
        "",
    );
    let c = Client::anonymous(&s);
    let r = c.exec(json!({"lang": "bash", "code": "for i in 1 2 3 4 5; do echo $i > f$i.txt; done"}));
    assert_eq!(r["files"].as_array().map(Vec::len), Some(2), "{r}");
    assert_eq!(
        r["artifact_delivery"],
        json!({"code": "artifact_delivery_failed", "status": "partial", "attempted": 3, "delivered": 2, "failed": 1}),
        "{r}"
    );
    let t = &r["artifact_truncation"];
    assert_eq!(t["reasons"], json!(["max_files"]), "{r}");
    assert_eq!(t["skipped_count"], 2, "{r}");
    assert_eq!(t["skipped"].as_array().map(Vec::len), Some(2), "{r}");
    // Nothing left out: neither field.
    let s = Server::start();
    let r = Client::anonymous(&s).exec(json!({"lang": "bash", "code": "echo 1 > one.txt"}));
    assert!(
        r.get("artifact_delivery").is_none() && r.get("artifact_truncation").is_none(),
        "{r}"
    );
}

/// LibreChat's pre-warm (`true` in Bash, with the conversation's hint) answers at once,
/// without waiting for or opening the workspace: even while a run holds it.
#[test]
fn the_prewarm_answers_at_once_even_while_a_run_holds_the_workspace() {
    let s = stateful();
    let a = Client::api_key(&s, ALICE);
    let hint = "v2:conversation:prewarm";
    std::thread::scope(|scope| {
        let long = scope.spawn(|| a.exec(bash("sleep 3; echo done > out.txt", hint)));
        std::thread::sleep(Duration::from_millis(1000));
        let r = a.exec(bash("true", hint));
        let long_still_running = !long.is_finished();
        assert_eq!(
            (r["status"].as_str(), r["exit_code"].as_i64()),
            (Some("ok"), Some(0)),
            "{r}"
        );
        assert!(r["runtime_session_id"].is_string(), "{r}");
        // The run holds the workspace for 2 s more: the pre-warm answered before it ended.
        assert!(long_still_running, "the pre-warm waited for the run: {r}");
        let done = long.join().unwrap();
        assert_eq!(done["status"], "ok", "{done}");
        assert_eq!(r["runtime_session_id"], done["runtime_session_id"], "{r} {done}");
    });
    // The pre-warm left the workspace as the run saved it.
    let r = a.exec(bash("cat out.txt", hint));
    assert_eq!(
        (r["stdout"].as_str(), r["runtime_status"].as_str()),
        (Some("done\n"), Some("reused")),
        "{r}"
    );
}
