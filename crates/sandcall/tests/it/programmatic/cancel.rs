//! Cancelling a session, by its id or by LibreChat's request id: the program and all it
//! started are killed, and the session answers its ending.

use super::support::{
    assert_api_error, assert_paused_shape, background_sleep, ok_result, rate_tool, resume, session_id, start, state,
    wait_until_reclaimed, ROUTE,
};
use crate::common::{run_cgroups, Server, NO_POOL};
use serde_json::json;
use std::time::Duration;

#[test]
fn cancel_kills_the_program() {
    let s = Server::start_with(&[NO_POOL], "");
    let seconds = 200_000 + u32::from(s.port);
    let marker = format!("sleep {seconds}");
    let body = json!({
        "language": "python",
        "code": format!(
            "{}print(\"started\", flush=True)\nget_exchange_rate(base=\"USD\", quote=\"EUR\")\nprint(\"never\")\n",
            background_sleep(seconds)
        ),
        "tools": [rate_tool()],
    });
    let first = start(&s, &body);
    assert_paused_shape(&first);
    let id = session_id(&first);
    assert!(run_cgroups(&s.instance()) > 0, "a paused session keeps its run cgroup");
    assert!(
        crate::common::program_running(&s, &marker),
        "the program's own child is running"
    );

    let (code, r) = s.post(&format!("{ROUTE}/cancel"), &json!({"session_id": id}));
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(r["error_type"], "cancelled", "{r}");
    assert_eq!(r["session_id"], id.as_str(), "{r}");
    assert!(
        r["stdout"]
            .as_str()
            .is_some_and(|o| o.contains("started") && !o.contains("never")),
        "{r}"
    );

    let (code, st) = state(&s, &id);
    assert_eq!(code, 200, "{st}");
    assert_eq!(st["status"], "error", "{st}");
    assert_eq!(st["error_type"], "cancelled", "{st}");

    wait_until_reclaimed(&s, Some(marker.as_str()), Duration::from_secs(10));

    let (code, v) = resume(
        &s,
        &first,
        json!([ok_result(&first["tool_calls"][0]["id"], json!(0.92))]),
    );
    // An ended session answers its ending.
    assert_eq!(code, 200, "resuming a cancelled session answered {code}: {v}");
    assert_eq!(v, st);
    s.assert_healthy();
}

#[test]
fn cancel_by_request_id() {
    let keys = "alice:key-a-0123456789abcdef,bob:key-b-0123456789abcdef";
    let s = Server::start_with(&[("SANDCALL_API_KEYS", keys)], "");
    let alice = ("X-API-Key", "key-a-0123456789abcdef");
    let bob = ("X-API-Key", "key-b-0123456789abcdef");
    let cancel = format!("{ROUTE}/cancel");
    let body = json!({"language": "python", "code": "print(get_exchange_rate(base='USD', quote='EUR'))", "tools": [rate_tool()], "timeout": 15000});
    let (code, first) = s.post_with(ROUTE, &body, &[alice, ("X-LibreChat-Code-Request-ID", "req-42")]);
    assert_eq!(code, 200, "{first}");
    assert_paused_shape(&first);

    // Another principal's request id, an unknown one: 404; neither field: 400.
    let (code, v) = s.post_with(&cancel, &json!({"request_id": "req-42"}), &[bob]);
    assert_api_error(code, &v, 404, "session_not_found");
    let (code, v) = s.post_with(&cancel, &json!({"request_id": "req-43"}), &[alice]);
    assert_api_error(code, &v, 404, "session_not_found");
    let (code, v) = s.post_with(&cancel, &json!({}), &[alice]);
    assert_api_error(code, &v, 400, "invalid_request");

    // LibreChat's abort: only the request id.
    let (code, v) = s.post_with(&cancel, &json!({"request_id": "req-42"}), &[alice]);
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["status"], "error", "{v}");
    assert_eq!(v["error_type"], "cancelled", "{v}");
    assert_eq!(v["session_id"], first["session_id"]);

    // The client sends a fresh id with each request: a resume's id names the session
    // from then on, in place of the start's.
    let body = json!({"language": "python", "code": "for i in range(2): get_exchange_rate(base='USD', quote='EUR')", "tools": [rate_tool()]});
    let (code, first) = s.post_with(ROUTE, &body, &[alice, ("X-LibreChat-Code-Request-ID", "start-1")]);
    assert_eq!(code, 200, "{first}");
    let resume_body = json!({
        "continuation_token": first["continuation_token"],
        "tool_results": [ok_result(&first["tool_calls"][0]["id"], json!(1))],
    });
    let (code, second) = s.post_with(
        ROUTE,
        &resume_body,
        &[alice, ("X-LibreChat-Code-Request-ID", "resume-1")],
    );
    assert_eq!(code, 200, "{second}");
    assert_paused_shape(&second);
    let (code, v) = s.post_with(&cancel, &json!({"request_id": "start-1"}), &[alice]);
    assert_api_error(code, &v, 404, "session_not_found");
    let (code, v) = s.post_with(&cancel, &json!({"request_id": "resume-1"}), &[alice]);
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["error_type"], "cancelled", "{v}");
    assert_eq!(v["session_id"], first["session_id"]);

    // A request id that is too long is refused at the start.
    let long = "x".repeat(257);
    let (code, v) = s.post_with(ROUTE, &body, &[alice, ("X-LibreChat-Code-Request-ID", &long)]);
    assert_api_error(code, &v, 400, "invalid_request");
}
