//! Per-principal rates by route group (`rate_limit_exec`, `rate_limit_sessions`,
//! `rate_limit_files`): a burst over a group's rate gets 429 `rate_limited` with
//! `Retry-After` and `retry_after_seconds`; other principals, other groups and the
//! unlimited routes are not affected.

use crate::common::Server;
use crate::files::{Client, Reply};
use crate::principals::{resume_body, start_paused};
use serde_json::json;

const KEYS: &str = "alice:key-a-0123456789abcdef,bob:key-b-0123456789abcdef";

/// A 429 `rate_limited` whose header and field agree on a wait of at least a second.
fn assert_rate_limited(reply: &Reply, group_key: &str) {
    assert_eq!(reply.status, 429, "{reply}");
    let v = reply.json();
    assert_eq!(v["error_type"], "rate_limited", "{v}");
    assert!(v["error"].as_str().unwrap().contains(group_key), "{v}");
    let header: u64 = reply.retry_after.as_deref().expect("Retry-After").parse().unwrap();
    assert!(header >= 1, "{reply}");
    assert_eq!(v["retry_after_seconds"], header, "{v}");
}

#[test]
fn a_burst_over_a_groups_rate_is_refused_for_that_principal_alone() {
    let s = Server::start_with(
        &[
            ("SANDCALL_API_KEYS", KEYS),
            ("SANDCALL_RATE_LIMIT_EXEC", "3/min"),
            ("SANDCALL_RATE_LIMIT_SESSIONS", "2/min"),
            ("SANDCALL_RATE_LIMIT_FILES", "4/min"),
        ],
        "",
    );
    let alice = Client::bearer(&s, "key-a-0123456789abcdef");
    let bob = Client::bearer(&s, "key-b-0123456789abcdef");
    let run = json!({"lang": "py", "code": "print(1)"});

    // exec: three pass, the fourth is refused; bob still runs.
    for _ in 0..3 {
        let r = alice.post_json("/v1/exec", &run);
        assert_eq!(r.status, 200, "{r}");
    }
    let refused = alice.post_json("/v1/exec", &run);
    assert_rate_limited(&refused, "rate_limit_exec");
    // One request comes back every 20 s.
    assert!(refused.retry_after.as_deref().unwrap().parse::<u64>().unwrap() <= 20);
    let r = bob.post_json("/v1/exec", &run);
    assert_eq!(r.status, 200, "{r}");

    // A programmatic start is an exec: alice's is refused, before any session exists.
    let r = alice.post_json(
        "/v1/exec/programmatic",
        &json!({"language": "python", "code": "print(1)", "tools": []}),
    );
    assert_rate_limited(&r, "rate_limit_exec");

    // Sessions: bob's start counts as his second exec; its resume and a GET are the
    // sessions group's two, the next GET is refused.
    let paused = start_paused(&bob);
    let id = paused["session_id"].as_str().unwrap();
    let r = bob.post_json("/v1/exec/programmatic", &resume_body(&paused));
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.json()["status"], "completed", "{r}");
    let r = bob.get(&format!("/v1/exec/programmatic/{id}"));
    assert_ne!(r.status, 429, "{r}");
    assert_rate_limited(&bob.get(&format!("/v1/exec/programmatic/{id}")), "rate_limit_sessions");

    // Files: a group of its own, untouched by the exec refusals above.
    for _ in 0..4 {
        let r = alice.get("/v1/files/no-such-session");
        assert_eq!(r.status, 200, "{r}");
    }
    assert_rate_limited(&alice.get("/v1/files/no-such-session"), "rate_limit_files");
    assert_eq!(bob.get("/v1/files/no-such-session").status, 200);

    // Health and the OpenAPI document are never limited.
    for _ in 0..10 {
        assert_eq!(alice.get("/v1/health").status, 200);
        assert_eq!(alice.get("/openapi.json").status, 200);
    }
}

#[test]
fn a_rate_that_is_not_one_stops_the_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(Server::new_dir().join("data"))
        .env("SANDCALL_RATE_LIMIT_FILES", "10/day")
        .env("SANDCALL_INSTALL_RUNTIME", "false")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("rate_limit_files") && stderr.contains("N/min"),
        "{stderr}"
    );
}
