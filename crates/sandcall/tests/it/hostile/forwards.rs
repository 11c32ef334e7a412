//! Finding 5 of issue 25: cluster forwarding trusted what is in Redis. Whoever can write
//! a session's owner key could name any URL, and the node that got the request sent it
//! there with the caller's `Authorization`/`X-API-Key`. Now a node forwards only to its
//! `peer_urls`, a forward carries a signed single-use pass instead of the caller's
//! credentials, and `sandcall-node` is not shown to clients unless `node_header` is set.
//! The nodes are real and share a real Redis (`SANDCALL_TEST_REDIS_URL`).

use crate::cluster::{cluster_urls, next_node_url, node_at, node_with_config, redis_url};
use crate::common::Server;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const ROUTE: &str = "/v1/exec/programmatic";
const KEYS: &str = "alice:key-a-0123456789abcdef";
const ALICE: &str = "key-a-0123456789abcdef";

/// One command to the test Redis (`redis://host:port/db`), in RESP; its first reply
/// line.
fn redis(args: &[&str]) -> String {
    let url = redis_url();
    let rest = url.strip_prefix("redis://").unwrap();
    let (addr, db) = rest.split_once('/').unwrap_or((rest, "0"));
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let encode = |args: &[&str]| {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        out
    };
    conn.write_all((encode(&["SELECT", db]) + &encode(args)).as_bytes())
        .unwrap();
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line, "+OK\r\n", "SELECT {db}");
    line.clear();
    reader.read_line(&mut line).unwrap();
    line
}

/// Names `owner` as the owner of session `id` in Redis for a minute, as someone with
/// write access to Redis could.
fn forge_owner(id: &str, owner: &str) {
    let reply = redis(&["SET", &format!("sandcall:s:{{{id}}}:owner"), owner, "PX", "60000"]);
    assert_eq!(reply, "+OK\r\n");
}

/// One HTTP/1.1 message from `r`: its head and body (by Content-Length), as bytes.
fn read_message(r: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut message = Vec::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
        message.extend_from_slice(line.as_bytes());
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).ok()?;
    message.extend_from_slice(&body);
    Some(message)
}

/// `message` with `connection: close` added after its first line.
fn closing(message: &[u8]) -> Vec<u8> {
    let end = message.iter().position(|&b| b == b'\n').unwrap() + 1;
    [&message[..end], b"connection: close\r\n", &message[end..]].concat()
}

/// Sends one request to `addr` and reads its whole answer.
fn send_raw(addr: &str, request: &[u8]) -> Vec<u8> {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    conn.write_all(&closing(request)).unwrap();
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer);
    answer
}

/// A listener that records every request it is sent; with `relay_to`, it passes each on
/// there and its answer back (a node's front, seeing what reaches the node), else it
/// answers 502.
fn recorder(listener: TcpListener, relay_to: Option<String>) -> Arc<Mutex<Vec<Vec<u8>>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut conn = conn;
            // One request per connection: the answer says `connection: close`.
            let Some(request) = read_message(&mut reader) else {
                continue;
            };
            log.lock().unwrap().push(request.clone());
            let answer = match &relay_to {
                Some(addr) => closing(&send_raw(addr, &request)),
                None => b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec(),
            };
            let _ = conn.write_all(&answer);
        }
    });
    seen
}

fn keyed(extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = vec![("SANDCALL_API_KEYS".to_owned(), KEYS.to_owned())];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

fn pairs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// A request as alice: status, the `sandcall-node` header, the body.
fn as_alice(s: &Server, method: &str, path: &str, body: Option<Value>) -> (u16, Option<String>, Value) {
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(60)).build();
    let req = agent
        .request(method, &s.url(path))
        .set("Authorization", &format!("Bearer {ALICE}"))
        .set("Content-Type", "application/json");
    let result = match body {
        Some(b) => req.send_string(&b.to_string()),
        None => req.call(),
    };
    let resp = match result {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path}: {e}"),
    };
    let node = resp.header("sandcall-node").map(str::to_owned);
    let status = resp.status();
    let text = resp.into_string().unwrap();
    (status, node, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// A paused session of alice's on `s`; its id.
fn paused_on(s: &Server) -> String {
    let tool = json!({"name": "get", "description": "gets", "parameters": {"type": "object", "properties": {}}});
    let (status, _, v) = as_alice(s, "POST", ROUTE, Some(json!({"code": "print(get())", "tools": [tool]})));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "tool_call_required", "{v}");
    v["session_id"].as_str().unwrap().to_owned()
}

#[test]
fn a_forged_owner_url_in_redis_gets_no_request() {
    // Bound before the nodes pick their ports, so it is none of their peers.
    let stranger = TcpListener::bind("127.0.0.1:0").unwrap();
    let stranger_url = format!("http://{}", stranger.local_addr().unwrap());
    let seen = recorder(stranger, None);
    let redis = redis_url();
    let a = node_with_config(&redis, &pairs(&keyed(&[])), "");
    let b = node_with_config(&redis, &pairs(&keyed(&[])), "");
    assert!(!cluster_urls().contains(&stranger_url));
    let id = paused_on(&a);
    forge_owner(&id, &stranger_url);
    let (status, _, v) = as_alice(&b, "GET", &format!("{ROUTE}/{id}"), None);
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error_type"], "session_owner_unavailable", "{v}");
    assert!(v["error"].as_str().unwrap().contains("peer_urls"), "{v}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(seen.lock().unwrap().is_empty(), "the forged owner was sent a request");
}

#[test]
fn a_forward_carries_a_single_use_pass_and_no_caller_credential() {
    let redis = redis_url();
    // A is known to the cluster by a front that records what reaches it.
    let front_url = next_node_url();
    let front = TcpListener::bind(front_url.trim_start_matches("http://")).unwrap();
    let own = TcpListener::bind("127.0.0.1:0").unwrap();
    let own_listen = own.local_addr().unwrap().to_string();
    drop(own);
    let seen = recorder(front, Some(own_listen.clone()));
    let a = node_at(&redis, &pairs(&keyed(&[])), "", &front_url, &own_listen);
    let b = node_with_config(&redis, &pairs(&keyed(&[])), "");
    let id = paused_on(&a);
    let path = format!("{ROUTE}/{id}");
    let (status, _, v) = as_alice(&b, "GET", &path, None);
    assert_eq!(status, 200, "the forward through B was served: {v}");
    assert_eq!(v["session_id"], id.as_str(), "{v}");
    let forwards = seen.lock().unwrap().clone();
    assert_eq!(forwards.len(), 1, "one forward reached A");
    let forward = String::from_utf8_lossy(&forwards[0]).to_ascii_lowercase();
    assert!(forward.contains("sandcall-forwarded:"), "{forward}");
    assert!(!forward.contains(ALICE), "the caller's key was forwarded: {forward}");
    assert!(!forward.contains("\nauthorization:"), "{forward}");
    assert!(!forward.contains("\nx-api-key:"), "{forward}");
    // The same forward again, straight to A: its pass was used.
    let replay = String::from_utf8_lossy(&send_raw(&own_listen, &forwards[0])).into_owned();
    assert!(
        replay.starts_with("HTTP/1.1 401"),
        "a replayed forward was served: {replay}"
    );
    // A forward with no valid pass, and the caller's key beside it: refused too.
    let forged =
        format!("GET {path} HTTP/1.1\r\nhost: x\r\nsandcall-forwarded: x.y\r\nauthorization: Bearer {ALICE}\r\n\r\n");
    let answer = String::from_utf8_lossy(&send_raw(&own_listen, forged.as_bytes())).into_owned();
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
}

#[test]
fn the_node_header_is_absent_unless_configured() {
    let redis = redis_url();
    let off = [("SANDCALL_NODE_HEADER", "false")];
    let a = node_with_config(&redis, &pairs(&keyed(&off)), "");
    let b = node_with_config(&redis, &pairs(&keyed(&off)), "");
    let id = paused_on(&a);
    let (status, node, v) = as_alice(&a, "GET", &format!("{ROUTE}/{id}"), None);
    assert_eq!(status, 200, "{v}");
    assert_eq!(node, None, "A shows its URL");
    let (status, node, v) = as_alice(&b, "GET", &format!("{ROUTE}/{id}"), None);
    assert_eq!(status, 200, "{v}");
    assert_eq!(node, None, "a forwarded answer shows the owner's URL");
    // Opted in, it is there.
    let on = [("SANDCALL_NODE_HEADER", "true")];
    let c = node_with_config(&redis, &pairs(&keyed(&on)), "");
    let id = paused_on(&c);
    let (_, node, _) = as_alice(&c, "GET", &format!("{ROUTE}/{id}"), None);
    assert_eq!(node.as_deref(), Some(c.base.as_str()));
}
