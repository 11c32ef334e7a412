//! Local mode and web pages: a foreign Origin, a foreign Host (DNS rebinding) and a
//! body without Content-Type are refused.
//!
//! Local mode has no key, so the only thing between a web page the local user opens and
//! the server is what the browser sends: `Origin` on a cross-origin request, the page's
//! own host name as `Host` after a DNS rebinding, and a "simple" body (no preflight) that
//! cannot claim to be JSON. Each refused request must leave no trace: the program below
//! would take 3 s and leave an output file in the store.

use super::connections::{exchange, raw_request, Answer};
use crate::common::{dir_entries, Server};
use serde_json::json;
use std::time::{Duration, Instant};

/// Sleeps 3 s and writes an output file: a refused request answers long before, and
/// leaves the store empty.
fn marker_program() -> String {
    json!({"code": "import time\nopen('ran.txt', 'w').write('ran')\ntime.sleep(3)\nprint('ran')"}).to_string()
}

fn stored_objects(s: &Server) -> usize {
    dir_entries(&s.data_dir.join("files/objects"))
}

/// Sends a request written by hand and checks it was refused at once.
fn refused(s: &Server, head: &str, body: &[u8], status: u16, error_type: &str) -> Answer {
    let t = Instant::now();
    let answer = exchange(s, &raw_request(head, body), Duration::from_secs(30));
    let took = t.elapsed();
    answer.assert_error(status, error_type);
    assert!(took < Duration::from_secs(2), "{head}: answered after {took:?}: it ran");
    answer
}

fn exec_head(host: &str, extra: &str) -> String {
    format!("POST /v1/exec HTTP/1.1\nHost: {host}\nConnection: close\n{extra}")
}

#[test]
fn a_foreign_origin_is_refused_before_anything_runs() {
    let s = Server::start();
    let host = format!("127.0.0.1:{}", s.port);
    let program = marker_program();
    let other_port = if s.port == 65535 { 1 } else { s.port + 1 };
    for origin in [
        "http://evil.example".to_owned(),
        format!("http://evil.example:{}", s.port),
        "null".to_owned(),
        format!("http://127.0.0.1:{other_port}"),
        format!("https://127.0.0.1:{}", s.port),
        format!("http://localhost:{}.evil.example", s.port),
    ] {
        let extra = format!("Origin: {origin}\nContent-Type: application/json");
        refused(
            &s,
            &exec_head(&host, &extra),
            program.as_bytes(),
            403,
            "forbidden_origin",
        );
        // Every route, the fallbacks too, before anything else.
        for path in ["/v1/health", "/no/such/route", "/v1/files/x"] {
            let head = format!("GET {path} HTTP/1.1\nHost: {host}\nConnection: close\nOrigin: {origin}");
            refused(&s, &head, b"", 403, "forbidden_origin");
        }
        let head = format!("DELETE /v1/health HTTP/1.1\nHost: {host}\nConnection: close\nOrigin: {origin}");
        refused(&s, &head, b"", 403, "forbidden_origin");
        let boundary = "b0undary";
        let upload = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\r\nhello\r\n--{boundary}--\r\n"
        );
        let head = format!(
            "POST /v1/upload HTTP/1.1\nHost: {host}\nConnection: close\nOrigin: {origin}\n\
             Content-Type: multipart/form-data; boundary={boundary}"
        );
        refused(&s, &head, upload.as_bytes(), 403, "forbidden_origin");
    }
    assert_eq!(stored_objects(&s), 0, "a refused request stored a file");
    s.assert_healthy();
}

#[test]
fn a_host_that_is_not_loopback_is_refused_before_anything_runs() {
    let s = Server::start();
    let program = marker_program();
    let port = s.port;
    // What a browser sends after evil.example was rebound to 127.0.0.1.
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("localhost.evil.example:{port}"),
        format!("a.localhost:{port}"),
        format!("127.0.0.1.evil.example:{port}"),
        format!("0.0.0.0:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
    ] {
        refused(
            &s,
            &exec_head(&host, "Content-Type: application/json"),
            program.as_bytes(),
            421,
            "misdirected_request",
        );
        let head = format!("GET /no/such/route HTTP/1.1\nHost: {host}\nConnection: close");
        refused(&s, &head, b"", 421, "misdirected_request");
    }
    // An absolute-form request target names the host too.
    let head = format!(
        "POST http://evil.example:{port}/v1/exec HTTP/1.1\nHost: evil.example:{port}\nConnection: close\nContent-Type: application/json"
    );
    refused(&s, &head, program.as_bytes(), 421, "misdirected_request");
    assert_eq!(stored_objects(&s), 0, "a refused request stored a file");
    s.assert_healthy();
}

#[test]
fn a_json_body_without_content_type_is_refused_before_anything_runs() {
    let s = Server::start();
    let host = format!("127.0.0.1:{}", s.port);
    let program = marker_program();
    refused(
        &s,
        &exec_head(&host, ""),
        program.as_bytes(),
        415,
        "unsupported_media_type",
    );
    // The content types a web page may send without a preflight.
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let extra = format!("Content-Type: {ct}");
        refused(
            &s,
            &exec_head(&host, &extra),
            program.as_bytes(),
            415,
            "unsupported_media_type",
        );
    }
    let tool = json!({"name": "f", "description": "f", "parameters": {"type": "object"}});
    let start = json!({"code": "import time\nopen('ran.txt', 'w').write('ran')\ntime.sleep(3)", "tools": [tool]});
    for (path, body) in [
        ("/v1/exec/programmatic", start.to_string()),
        ("/v1/exec/programmatic/cancel", json!({"session_id": "x"}).to_string()),
    ] {
        let head = format!("POST {path} HTTP/1.1\nHost: {host}\nConnection: close");
        refused(&s, &head, body.as_bytes(), 415, "unsupported_media_type");
    }
    assert_eq!(stored_objects(&s), 0, "a refused request stored a file");
    s.assert_healthy();
}

#[test]
fn the_servers_own_origin_and_plain_clients_still_work() {
    let s = Server::start();
    let port = s.port;
    let body = json!({"code": "print(6 * 7)"}).to_string();
    for (host, origin) in [
        (format!("127.0.0.1:{port}"), Some(format!("http://127.0.0.1:{port}"))),
        (format!("localhost:{port}"), Some(format!("http://localhost:{port}"))),
        (format!("[::1]:{port}"), Some(format!("http://[::1]:{port}"))),
        (format!("LOCALHOST:{port}"), None),
        ("127.0.0.1".to_owned(), None),
        (format!("127.0.0.2:{port}"), None),
    ] {
        let mut extra = "Content-Type: application/json".to_owned();
        if let Some(origin) = &origin {
            extra.push_str(&format!("\nOrigin: {origin}"));
        }
        let answer = exchange(
            &s,
            &raw_request(&exec_head(&host, &extra), body.as_bytes()),
            Duration::from_secs(60),
        );
        assert_eq!(answer.status, 200, "Host {host}, Origin {origin:?}: {answer}");
        assert_eq!(answer.json()["stdout"], "42\n", "{answer}");
    }
    // A curl-like client: no Origin, the address it connected to as Host.
    let r = s.exec(json!({"code": "print(1)"}));
    assert_eq!(r["stdout"], "1\n");
    let (status, _, health) = s.request("GET", "/v1/health", None, None);
    assert_eq!(status, 200, "{health}");
    assert!(
        health["active_runs"].is_u64(),
        "local mode gets the whole health: {health}"
    );
}

#[test]
fn a_keyed_server_takes_the_same_requests_with_a_key() {
    let key = "key-local-mode-0123456789";
    let keys = format!("alice:{key}");
    let s = Server::start_with(&[("SANDCALL_API_KEYS", &keys)], "");
    let port = s.port;
    let body = json!({"code": "print('ran', end='')"}).to_string();
    for extra in [
        format!("Origin: http://evil.example\nContent-Type: application/json\nAuthorization: Bearer {key}"),
        format!("Content-Type: application/json\nX-API-Key: {key}"),
        format!("Authorization: Bearer {key}"),
    ] {
        for host in [format!("127.0.0.1:{port}"), format!("evil.example:{port}")] {
            let answer = exchange(
                &s,
                &raw_request(&exec_head(&host, &extra), body.as_bytes()),
                Duration::from_secs(60),
            );
            assert_eq!(answer.status, 200, "Host {host}, {extra}: {answer}");
            assert_eq!(answer.json()["stdout"], "ran", "{answer}");
        }
    }
    // Without the key, still 401, whatever the origin.
    let head =
        format!("POST /v1/exec HTTP/1.1\nHost: 127.0.0.1:{port}\nConnection: close\nOrigin: http://evil.example");
    let answer = exchange(&s, &raw_request(&head, body.as_bytes()), Duration::from_secs(30));
    answer.assert_error(401, "unauthorized");
}
