//! Bad requests get the spec's JSON error shape and change nothing.

use crate::common::Server;
use serde_json::{json, Value};

fn assert_error(v: &Value, error_type: &str) {
    assert_eq!(v["error_type"], error_type, "{v}");
    assert!(v["error"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    // `code` appears only where a coarser code applies (an unsupported language).
    let mut expected = if error_type == "unsupported_language" {
        assert_eq!(v["code"], "unsupported_capability", "{v}");
        3
    } else {
        2
    };
    // A refusal that may pass later says when to retry, in the body as in Retry-After.
    if ["at_capacity", "principal_at_capacity", "rate_limited"].contains(&error_type) {
        assert!(v["retry_after_seconds"].as_u64().is_some_and(|s| s >= 1), "{v}");
        expected += 1;
    }
    assert_eq!(
        v.as_object().map(|o| o.len()),
        Some(expected),
        "only error, error_type (and code, retry_after_seconds): {v}"
    );
}

#[test]
fn malformed_and_mistyped_requests() {
    let s = Server::start();
    let json_ct = Some("application/json");
    let cases: &[(&str, u16, &str)] = &[
        ("{\"code\": ", 400, "invalid_json"),
        ("not json at all", 400, "invalid_json"),
        ("", 400, "invalid_json"),
        ("{\"code\": 5}", 400, "invalid_request"),
        (
            "{\"code\": \"print(1)\", \"args\": \"notalist\"}",
            400,
            "invalid_request",
        ),
        ("{\"code\": \"print(1)\", \"timeout\": -5}", 400, "invalid_request"),
        ("{\"code\": \"print(1)\", \"timeout\": 0}", 400, "invalid_request"),
        (
            "{\"code\": \"print(1)\", \"limits\": {\"memory_limit_mb\": \"lots\"}}",
            400,
            "invalid_request",
        ),
        (
            "{\"code\": \"print(1)\", \"limits\": {\"bogus\": 1}}",
            400,
            "invalid_request",
        ),
        ("[1, 2]", 400, "invalid_request"),
        ("{\"language\": \"python\"}", 400, "invalid_request"),
        ("{\"code\": \"\"}", 400, "invalid_request"),
        ("{\"code\": \"   \\n\"}", 400, "invalid_request"),
        (
            "{\"code\": \"print(1)\", \"language\": \"cobol\"}",
            400,
            "unsupported_language",
        ),
        (
            "{\"code\": \"print(1)\", \"files\": [{\"id\": \"x\", \"name\": \"a.txt\"}]}",
            400,
            "invalid_request",
        ),
    ];
    for (body, status, error_type) in cases {
        let (got, _, v) = s.request("POST", "/v1/exec", json_ct, Some(body));
        assert_eq!(got, *status, "{body}: {v}");
        assert_error(&v, error_type);
    }
    let (got, _, v) = s.request("POST", "/v1/exec", Some("text/plain"), Some("{\"code\": \"print(1)\"}"));
    assert_eq!(got, 415);
    assert_error(&v, "unsupported_media_type");
    // No Content-Type at all is refused in local mode, where a web page could send it
    // (hostile::local_mode); a server with keys takes it as JSON (principals).
    let (got, _, v) = s.request("POST", "/v1/exec", None, Some("{\"code\": \"print(1)\"}"));
    assert_eq!(got, 415, "{v}");
    assert_error(&v, "unsupported_media_type");
    // Unknown fields are ignored.
    let r = s.exec(json!({"code": "print(1)", "user_id": "abc", "entity_id": 5}));
    assert_eq!(r["stdout"], "1\n");
    s.assert_healthy();
}

#[test]
fn oversized_bodies_and_code() {
    let s = Server::start();
    let huge = json!({"code": format!("# {}\nprint(1)", "x".repeat(4 << 20))}).to_string();
    let (got, _, v) = s.request("POST", "/v1/exec", Some("application/json"), Some(&huge));
    assert_eq!(got, 413, "{v}");
    assert_error(&v, "payload_too_large");
    let code = json!({"code": format!("# {}\nprint(1)", "x".repeat((1 << 20) + 10))}).to_string();
    let (got, _, v) = s.request("POST", "/v1/exec", Some("application/json"), Some(&code));
    assert_eq!(got, 413, "{v}");
    assert_error(&v, "payload_too_large");
    s.assert_healthy();
}

/// A body far over the limit, more than the socket buffers hold: the client is still
/// sending when the server decides, and must still get the 413 (not a reset connection).
#[test]
fn a_body_far_over_the_limit_still_gets_its_answer() {
    let s = Server::start();
    let huge = json!({"code": format!("# {}\nprint(1)", "x".repeat(48 << 20))}).to_string();
    for _ in 0..2 {
        let (got, _, v) = s.request("POST", "/v1/exec", Some("application/json"), Some(&huge));
        assert_eq!(got, 413, "{v}");
        assert_error(&v, "payload_too_large");
    }
    s.assert_healthy();
}

/// A path parameter that is not UTF-8 once decoded gets the JSON error shape, not the
/// framework's plain-text answer.
#[test]
fn path_parameters_that_are_not_utf8_get_a_json_error() {
    let s = Server::start();
    for (method, path) in [
        ("GET", "/v1/exec/programmatic/%FF"),
        ("GET", "/v1/files/%FF"),
        ("GET", "/v1/download/%FF/abc"),
        ("GET", "/v1/sessions/abc/objects/%FF"),
        ("DELETE", "/v1/files/%FF/abc"),
    ] {
        let (got, _, v) = s.request(method, path, None, None);
        assert_eq!(got, 400, "{method} {path}: {v}");
        assert_error(&v, "invalid_request");
    }
}

#[test]
fn unknown_routes_and_methods() {
    let s = Server::start();
    let (got, _, v) = s.request("GET", "/v1/nope", None, None);
    assert_eq!(got, 404);
    assert_error(&v, "not_found");
    let (got, _, v) = s.request("GET", "/v1/exec", None, None);
    assert_eq!(got, 405);
    assert_error(&v, "method_not_allowed");
}

#[test]
fn beyond_capacity_is_503_with_retry_after() {
    let s = Server::start_with(
        &[
            ("SANDCALL_MAX_CONCURRENT_RUNS", "1"),
            ("SANDCALL_MAX_QUEUED_RUNS", "1"),
            ("SANDCALL_QUEUE_TIMEOUT_MS", "3000"),
        ],
        "",
    );
    std::thread::scope(|scope| {
        let long = scope.spawn(|| s.exec(json!({"language": "bash", "code": "sleep 2; echo done"})));
        std::thread::sleep(std::time::Duration::from_millis(300));
        let queued = scope.spawn(|| s.exec(json!({"language": "bash", "code": "echo queued"})));
        std::thread::sleep(std::time::Duration::from_millis(300));
        // One running, one queued: the third is refused at once.
        let (got, retry, v) = s.request(
            "POST",
            "/v1/exec",
            Some("application/json"),
            Some(&json!({"code": "print(1)"}).to_string()),
        );
        assert_eq!(got, 503, "{v}");
        assert_error(&v, "at_capacity");
        assert!(retry.and_then(|r| r.parse::<u64>().ok()).is_some_and(|r| r >= 1));
        assert_eq!(long.join().unwrap()["stdout"], "done\n");
        // The queued run waited for the slot and then ran.
        assert_eq!(queued.join().unwrap()["stdout"], "queued\n");
    });
    s.assert_healthy();
}
