//! Authentication and principals: API keys (from SANDCALL_API_KEYS, or stored hashed in
//! the config by `sandcall keys add`), 401 on every route without a valid key, local
//! mode only on a loopback address, and principals that cannot see each other's
//! sessions or files (another principal's things answer 404, as if they did not exist).

use crate::common::Server;
use crate::files::{
    assert_error, download_output, field_part, file_part, multipart, multipart_content_type, output, output_names,
    sha256_hex, stored_count, Client, Reply, Uploaded, NO_SUCH_ID,
};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const KEYS: &str = "alice:key-a-0123456789abcdef,bob:key-b-0123456789abcdef";
const ALICE: &str = "key-a-0123456789abcdef";
const BOB: &str = "key-b-0123456789abcdef";
const ROUTE: &str = "/v1/exec/programmatic";

/// A request without credentials: method, path, Content-Type, body.
type Request = (&'static str, String, Option<&'static str>, Option<Vec<u8>>);

/// How a server is started: a label, its arguments after `serve`, its environment.
type Launch<'a> = (&'a str, Vec<String>, Vec<(&'a str, &'a str)>);

fn keyed_server() -> Server {
    Server::start_with(&[("SANDCALL_API_KEYS", KEYS)], "")
}

pub fn rate_tool() -> Value {
    json!({
        "name": "get_rate",
        "description": "the exchange rate of a currency",
        "parameters": {"type": "object", "properties": {"base": {"type": "string"}}, "required": ["base"]},
    })
}

/// Starts a programmatic session that pauses at its first tool call.
pub fn start_paused(c: &Client) -> Value {
    let reply = c.post_json(
        ROUTE,
        &json!({"language": "python", "code": "print('rate', get_rate(base='USD'))", "tools": [rate_tool()]}),
    );
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    assert_eq!(v["status"], "tool_call_required", "{v}");
    v
}

/// The resume request that answers `paused`'s call with 0.92.
pub fn resume_body(paused: &Value) -> Value {
    json!({
        "session_id": paused["session_id"],
        "continuation_token": paused["continuation_token"],
        "tool_results": [{"call_id": paused["tool_calls"][0]["id"], "result": 0.92, "is_error": false}],
    })
}

fn str_of<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field].as_str().unwrap_or_else(|| panic!("no {field}: {v}"))
}

/// What alice owns: an upload, a run that read it and wrote an output, a paused session.
struct World {
    upload: Uploaded,
    run: Value,
    paused: Value,
}

impl World {
    fn run_session(&self) -> &str {
        str_of(&self.run, "session_id")
    }

    fn output_id(&self) -> &str {
        str_of(output(&self.run, "report.txt"), "id")
    }

    fn paused_session(&self) -> &str {
        str_of(&self.paused, "session_id")
    }
}

fn alice_world(alice: &Client) -> World {
    let upload = alice.upload("secret.csv", "text/csv", b"alice,only\n");
    let run = alice.exec(json!({
        "code": "open('report.txt', 'w').write(open('secret.csv').read().upper())",
        "files": [upload.input("secret.csv")],
    }));
    assert_eq!(run["status"], "ok", "{run}");
    assert_eq!(output_names(&run), vec!["report.txt".to_owned()], "{run}");
    let paused = start_paused(alice);
    World { upload, run, paused }
}

/// 401 `unauthorized`, with the request named when it is not.
fn assert_unauthorized(reply: &Reply, what: &str) {
    assert_eq!(reply.status, 401, "{what}: {reply}");
    let v = reply.json();
    assert_eq!(v["error_type"], "unauthorized", "{what}: {reply}");
    assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{what}: {reply}");
}

// ---------------------------------------------------------------------------
// Keys on every route
// ---------------------------------------------------------------------------

#[test]
fn every_route_needs_a_valid_key() {
    let s = keyed_server();
    let alice = Client::bearer(&s, ALICE);
    let w = alice_world(&alice);
    let (sid, fid) = (w.upload.session_id.as_str(), w.upload.id.as_str());
    let (run_sid, out_id) = (w.run_session(), w.output_id());
    let paused_sid = w.paused_session();
    let json_ct = Some("application/json");
    let body = |v: Value| Some(v.to_string().into_bytes());
    let requests: Vec<Request> = vec![
        ("GET", "/v1/health".into(), None, None),
        ("GET", "/openapi.json".into(), None, None),
        ("POST", "/v1/exec".into(), json_ct, body(json!({"code": "print(1)"}))),
        ("POST", "/v1/exec".into(), json_ct, Some(b"{not json".to_vec())),
        (
            "POST",
            "/v1/exec".into(),
            json_ct,
            body(json!({"code": "print(open('secret.csv').read())", "files": [w.upload.input("secret.csv")]})),
        ),
        (
            "POST",
            ROUTE.into(),
            json_ct,
            body(json!({"code": "print(get_rate(base='X'))", "tools": [rate_tool()]})),
        ),
        ("POST", ROUTE.into(), json_ct, body(resume_body(&w.paused))),
        (
            "POST",
            format!("{ROUTE}/cancel"),
            json_ct,
            body(json!({"session_id": paused_sid})),
        ),
        ("GET", format!("{ROUTE}/{paused_sid}"), None, None),
        ("GET", format!("{ROUTE}/{NO_SUCH_ID}"), None, None),
        (
            "POST",
            "/v1/upload".into(),
            None,
            Some(multipart(&[file_part("intruder.txt", "text/plain", b"intruder\n")])),
        ),
        (
            "POST",
            "/v1/upload/batch".into(),
            None,
            Some(multipart(&[file_part("intruder.txt", "text/plain", b"intruder\n")])),
        ),
        ("GET", format!("/v1/download/{sid}/{fid}"), None, None),
        ("GET", format!("/v1/download/{sid}/{fid}?kind=user&id=x"), None, None),
        ("GET", format!("/v1/download/{run_sid}/{out_id}"), None, None),
        ("GET", format!("/v1/download/{NO_SUCH_ID}/{NO_SUCH_ID}"), None, None),
        ("GET", format!("/v1/files/{sid}"), None, None),
        ("GET", format!("/v1/files/{NO_SUCH_ID}"), None, None),
        ("GET", format!("/v1/sessions/{sid}/objects/{fid}"), None, None),
        ("DELETE", format!("/v1/files/{sid}/{fid}"), None, None),
        ("DELETE", format!("/v1/files/{run_sid}/{out_id}"), None, None),
    ];
    let multipart_ct = multipart_content_type();
    let wrong: Vec<(&str, Client)> = vec![
        ("no credentials", Client::anonymous(&s)),
        ("empty X-API-Key", Client::api_key(&s, "")),
        ("empty bearer", Client::bearer(&s, "")),
        ("unknown key", Client::api_key(&s, "wrong")),
        ("alice's key cut short", Client::api_key(&s, "key-a-12")),
        ("alice's key extended", Client::api_key(&s, "key-a-0123456789abcdef4")),
        ("alice's key upper-cased", Client::bearer(&s, "KEY-A-123")),
        ("the principal's name", Client::api_key(&s, "alice")),
        ("name:key", Client::api_key(&s, "alice:key-a-0123456789abcdef")),
        (
            "two keys run together",
            Client::bearer(&s, "key-a-0123456789abcdefkey-b-0123456789abcdef"),
        ),
        ("bob's key cut short", Client::bearer(&s, "key-b-45")),
        (
            "basic auth",
            Client::anonymous(&s).with("Authorization", "Basic YWxpY2U6a2V5LWEtMTIz"),
        ),
        (
            "another scheme",
            Client::anonymous(&s).with("Authorization", "Token key-a-0123456789abcdef"),
        ),
    ];
    let stored = stored_count(&s);
    for (label, client) in &wrong {
        for (method, path, ct, req_body) in &requests {
            let ct = if path.starts_with("/v1/upload") {
                Some(multipart_ct.as_str())
            } else {
                *ct
            };
            let reply = client.send(method, path, ct, req_body.as_deref());
            if path == "/v1/health" && *label == "no credentials" {
                // Health needs none, and then says only whether the server is up.
                assert_eq!(reply.status, 200, "{reply}");
                assert_eq!(field_names(&reply.json()), ["status", "version"], "{reply}");
                continue;
            }
            assert_unauthorized(&reply, &format!("{label}: {method} {path}"));
        }
    }

    // Nothing any of those requests asked for happened.
    assert_eq!(
        stored_count(&s),
        stored,
        "an unauthenticated upload or run stored a file"
    );
    let reply = alice.download(sid, fid);
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.body, b"alice,only\n");
    assert_eq!(download_output(&alice, &w.run, "report.txt"), b"ALICE,ONLY\n");
    let reply = alice.get(&format!("{ROUTE}/{paused_sid}"));
    assert_eq!(reply.status, 200, "{reply}");
    let state = reply.json();
    assert_eq!(state["status"], "tool_call_required", "not cancelled: {state}");
    assert_eq!(state["continuation_token"], w.paused["continuation_token"], "{state}");
    let reply = alice.post_json(ROUTE, &resume_body(&w.paused));
    assert_eq!(reply.status, 200, "the token was not used up: {reply}");
    let done = reply.json();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["stdout"], "rate 0.92\n", "{done}");
}

#[test]
fn both_header_forms_name_the_same_principal() {
    let s = keyed_server();
    for (label, c) in [
        ("bearer alice", Client::bearer(&s, ALICE)),
        ("x-api-key alice", Client::api_key(&s, ALICE)),
        ("bearer bob", Client::bearer(&s, BOB)),
        ("x-api-key bob", Client::api_key(&s, BOB)),
    ] {
        let reply = c.get("/v1/health");
        assert_eq!(reply.status, 200, "{label}: {reply}");
        assert_eq!(reply.json()["status"], "ok", "{label}: {reply}");
        let r = c.exec(json!({"code": "print(6 * 7)"}));
        assert_eq!(r["stdout"], "42\n", "{label}: {r}");
    }
    // Uploaded with one form, read with the other: one principal.
    let up = Client::bearer(&s, ALICE).upload("a.txt", "text/plain", b"mine\n");
    let via_header = Client::api_key(&s, ALICE);
    let reply = via_header.download(&up.session_id, &up.id);
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.body, b"mine\n");
    assert_eq!(via_header.list(&up.session_id).len(), 1);
    let r = via_header.exec(json!({"code": "print(open('a.txt').read(), end='')", "files": [up.input("a.txt")]}));
    assert_eq!(r["stdout"], "mine\n", "{r}");
    // Bob, in either form, is someone else.
    for bob in [Client::bearer(&s, BOB), Client::api_key(&s, BOB)] {
        assert_error(&bob.download(&up.session_id, &up.id), 404, "file_not_found");
    }
}

// ---------------------------------------------------------------------------
// Principals apart
// ---------------------------------------------------------------------------

#[test]
fn principals_cannot_see_each_others_files() {
    let s = keyed_server();
    let alice = Client::bearer(&s, ALICE);
    let bob = Client::api_key(&s, BOB);
    let w = alice_world(&alice);
    let (sid, fid) = (w.upload.session_id.as_str(), w.upload.id.as_str());
    let (run_sid, out_id) = (w.run_session(), w.output_id());

    // The same answers as for files that never existed.
    assert_error(&bob.download(NO_SUCH_ID, NO_SUCH_ID), 404, "file_not_found");
    for (session, id) in [(sid, fid), (run_sid, out_id)] {
        assert_error(&bob.download(session, id), 404, "file_not_found");
        assert_error(
            &bob.get(&format!("/v1/download/{session}/{id}?kind=user&id=x")),
            404,
            "file_not_found",
        );
        assert_error(&bob.object(session, id), 404, "file_not_found");
        assert_error(&bob.delete_file(session, id), 404, "file_not_found");
        assert!(bob.list(session).is_empty(), "bob lists alice's session {session}");
    }

    // Alice's files cannot be staged into bob's runs, by either spelling of the session.
    for file in [
        w.upload.input("secret.csv"),
        json!({"id": fid, "session_id": sid, "name": "secret.csv"}),
        json!({"id": out_id, "storage_session_id": run_sid, "name": "secret.csv"}),
    ] {
        let code = "print(open('secret.csv').read())";
        let reply = bob.post_json("/v1/exec", &json!({"code": code, "files": [file]}));
        assert_error(&reply, 404, "file_not_found");
        let reply = bob.post_json(ROUTE, &json!({"code": code, "tools": [rate_tool()], "files": [file]}));
        assert_error(&reply, 404, "file_not_found");
    }

    // Bob's uploads land in a session of his own, whatever fields he sends.
    let reply = bob.upload_parts(&[
        field_part("storage_session_id", sid),
        field_part("session_id", sid),
        field_part("entity_id", sid),
        file_part("secret.csv", "text/csv", b"bob was here\n"),
    ]);
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    let bob_sid = str_of(&v, "storage_session_id").to_owned();
    let bob_fid = str_of(&v["files"][0], "id").to_owned();
    assert_ne!(bob_sid, sid, "bob's upload joined alice's session: {v}");
    let listed = alice.list(sid);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["id"], fid);
    // And alice cannot see his.
    assert_error(&alice.download(&bob_sid, &bob_fid), 404, "file_not_found");
    assert!(alice.list(&bob_sid).is_empty());
    let r = bob.exec(json!({
        "code": "print(open('secret.csv').read(), end='')\nopen('bob.txt', 'w').write('b')",
        "files": [{"id": bob_fid, "storage_session_id": bob_sid, "name": "secret.csv"}],
    }));
    assert_eq!(r["stdout"], "bob was here\n", "{r}");
    let bob_out = str_of(output(&r, "bob.txt"), "id").to_owned();
    assert_error(
        &alice.download(str_of(&r, "session_id"), &bob_out),
        404,
        "file_not_found",
    );
    assert_eq!(download_output(&bob, &r, "bob.txt"), b"b");

    // Alice still sees everything of hers, unchanged.
    let reply = alice.download(sid, fid);
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.body, b"alice,only\n");
    assert_eq!(download_output(&alice, &w.run, "report.txt"), b"ALICE,ONLY\n");
    assert_eq!(alice.list(run_sid).len(), 1);
    let reply = alice.object(sid, fid);
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.json()["size"], 11, "{reply}");
    assert_eq!(alice.delete_file(run_sid, out_id).status, 200);
    assert_error(&alice.download(run_sid, out_id), 404, "file_not_found");
}

#[test]
fn principals_cannot_touch_each_others_sessions() {
    let s = keyed_server();
    let alice = Client::bearer(&s, ALICE);
    let bob = Client::bearer(&s, BOB);
    let paused = start_paused(&alice);
    let sid = str_of(&paused, "session_id").to_owned();
    let token = str_of(&paused, "continuation_token").to_owned();

    // The same answers as for a session that never existed.
    assert_error(&bob.get(&format!("{ROUTE}/{NO_SUCH_ID}")), 404, "session_not_found");
    // Resume with alice's token: with the session id, without it, with empty code.
    let mut without_id = resume_body(&paused);
    without_id.as_object_mut().unwrap().remove("session_id");
    let mut empty_code = resume_body(&paused);
    empty_code["code"] = json!("");
    for body in [resume_body(&paused), without_id, empty_code] {
        assert_error(&bob.post_json(ROUTE, &body), 404, "session_not_found");
    }
    assert_error(&bob.get(&format!("{ROUTE}/{sid}")), 404, "session_not_found");
    assert_error(
        &bob.post_json(&format!("{ROUTE}/cancel"), &json!({"session_id": sid})),
        404,
        "session_not_found",
    );

    // Alice's session is untouched: still paused on the same token, not cancelled.
    let reply = alice.get(&format!("{ROUTE}/{sid}"));
    assert_eq!(reply.status, 200, "{reply}");
    let state = reply.json();
    assert_eq!(state["status"], "tool_call_required", "{state}");
    assert_eq!(state["continuation_token"], token.as_str(), "{state}");
    let reply = alice.post_json(ROUTE, &resume_body(&paused));
    assert_eq!(reply.status, 200, "bob's attempts used up alice's token: {reply}");
    let done = reply.json();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["stdout"], "rate 0.92\n", "{done}");
    // Ended, it is still hers alone.
    assert_error(&bob.get(&format!("{ROUTE}/{sid}")), 404, "session_not_found");

    // A session bob cannot cancel, alice can.
    let paused = start_paused(&alice);
    let sid = str_of(&paused, "session_id").to_owned();
    assert_error(
        &bob.post_json(&format!("{ROUTE}/cancel"), &json!({"session_id": sid})),
        404,
        "session_not_found",
    );
    let reply = alice.post_json(&format!("{ROUTE}/cancel"), &json!({"session_id": sid}));
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.json()["error_type"], "cancelled", "{reply}");

    // Bob's own sessions work as usual, and alice cannot reach them.
    let bobs = start_paused(&bob);
    let bob_sid = str_of(&bobs, "session_id").to_owned();
    assert_error(&alice.get(&format!("{ROUTE}/{bob_sid}")), 404, "session_not_found");
    assert_error(&alice.post_json(ROUTE, &resume_body(&bobs)), 404, "session_not_found");
    let reply = bob.post_json(ROUTE, &resume_body(&bobs));
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.json()["stdout"], "rate 0.92\n", "{reply}");
}

// ---------------------------------------------------------------------------
// Keys in the config: `sandcall keys add`
// ---------------------------------------------------------------------------

/// Runs `sandcall keys add NAME --config FILE`; returns the key it printed.
fn keys_add(config: &Path, name: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .args(["keys", "add", name, "--config"])
        .arg(config)
        .env_remove("SANDCALL_API_KEYS")
        .stdin(Stdio::null())
        .output()
        .expect("run sandcall keys add");
    assert!(
        out.status.success(),
        "keys add {name}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("the key is text");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "keys add prints the key and nothing else on stdout: {stdout:?}"
    );
    let key = lines[0].trim().to_owned();
    assert!(
        key.len() >= 20 && key.is_ascii() && !key.contains(char::is_whitespace),
        "not a usable key: {key:?}"
    );
    key
}

/// The key with its last character changed.
fn altered(key: &str) -> String {
    let mut k = key.to_owned();
    let last = k.pop().unwrap();
    k.push(if last == 'a' { 'b' } else { 'a' });
    k
}

#[test]
fn keys_add_prints_a_key_once_and_stores_only_its_hash() {
    let dir = Server::new_dir();
    let config = dir.join("keys.toml");
    let preamble = "# written by the test\nsession_expiry_s = 600\n";
    std::fs::write(&config, preamble).unwrap();

    let carol = keys_add(&config, "carol");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.starts_with(preamble), "keys add appends to the file: {text}");
    assert!(text.contains("[[api_keys]]"), "{text}");
    assert!(text.contains("principal = \"carol\""), "{text}");
    let carol_hash = sha256_hex(carol.as_bytes());
    assert!(
        text.to_ascii_lowercase().contains(&carol_hash),
        "no sha256 of the key: {text}"
    );
    assert!(!text.contains(&carol), "the key itself is stored: {text}");

    let dave = keys_add(&config, "dave");
    assert_ne!(carol, dave, "each key is new");
    let text = std::fs::read_to_string(&config).unwrap();
    assert_eq!(text.matches("[[api_keys]]").count(), 2, "{text}");
    assert!(text.contains("principal = \"dave\""), "{text}");
    let dave_hash = sha256_hex(dave.as_bytes());
    assert!(text.to_ascii_lowercase().contains(&dave_hash), "{text}");
    assert!(
        !text.contains(&carol) && !text.contains(&dave),
        "a key is stored: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);

    // A server started with that config knows both keys, and only them.
    let s = Server::start_with(&[], &text);
    for (label, c) in [
        ("carol", Client::bearer(&s, &carol)),
        ("dave", Client::api_key(&s, &dave)),
    ] {
        let reply = c.get("/openapi.json");
        assert_eq!(reply.status, 200, "{label}: {reply}");
    }
    for (label, c) in [
        ("no key", Client::anonymous(&s)),
        ("carol's key altered", Client::bearer(&s, &altered(&carol))),
        ("the stored hash as a key", Client::api_key(&s, &carol_hash)),
        (
            "the stored hash, upper-case",
            Client::bearer(&s, &dave_hash.to_ascii_uppercase()),
        ),
        ("a key of the environment's kind", Client::api_key(&s, ALICE)),
    ] {
        assert_unauthorized(&c.get("/openapi.json"), label);
    }
    // Each key is its own principal.
    let carols = Client::bearer(&s, &carol);
    let up = carols.upload("c.txt", "text/plain", b"carol's\n");
    assert_error(
        &Client::api_key(&s, &dave).download(&up.session_id, &up.id),
        404,
        "file_not_found",
    );
    assert_eq!(carols.download(&up.session_id, &up.id).body, b"carol's\n");
}

// ---------------------------------------------------------------------------
// Where local mode is allowed
// ---------------------------------------------------------------------------

/// A `sandcall serve` started by a test itself; killed if the test fails.
struct Spawned(Option<Child>);

impl Spawned {
    fn serve(args: &[String], env: &[(&str, &str)]) -> Spawned {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandcall"));
        cmd.arg("serve")
            .args(args)
            .env_remove("SANDCALL_API_KEYS")
            .env("SANDCALL_INSTALL_RUNTIME", "false")
            .env("SANDCALL_RUNTIME_DIR", crate::common::runtime_dir())
            .env_remove("SANDCALL_LISTEN")
            .env("SANDCALL_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Spawned(Some(cmd.spawn().expect("start sandcall serve")))
    }

    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("still held")
    }

    /// Waits for the process to exit on its own; returns its status, stdout and stderr.
    fn wait_for_exit(mut self, limit: Duration) -> (ExitStatus, String, String) {
        let mut stdout = self.child().stdout.take().unwrap();
        let mut stderr = self.child().stderr.take().unwrap();
        let out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            s
        });
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let t = Instant::now();
        let status = loop {
            if let Some(status) = self.child().try_wait().unwrap() {
                break status;
            }
            assert!(t.elapsed() < limit, "sandcall serve still running after {limit:?}");
            std::thread::sleep(Duration::from_millis(50));
        };
        self.0 = None;
        (status, out.join().unwrap(), err.join().unwrap())
    }

    /// Waits for the "sandcall listening on URL" line; returns the port.
    fn wait_for_port(&mut self, limit: Duration) -> u16 {
        let stdout = self.child().stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("sandcall listening on ") {
                    let _ = tx.send(url.to_owned());
                }
            }
        });
        let url = rx
            .recv_timeout(limit)
            .unwrap_or_else(|_| panic!("sandcall serve did not start within {limit:?}"));
        url.trim_end_matches('/')
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {url:?}"))
    }

    /// SIGTERM, then waits for the exit.
    fn stop(mut self) {
        let mut child = self.0.take().expect("still held");
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("sandcall serve did not stop within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn path_arg(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

#[test]
fn a_non_loopback_address_without_keys_refuses_to_start() {
    let dir = Server::new_dir();
    let data = path_arg(&dir.join("data"));
    let empty = dir.join("empty.toml");
    std::fs::write(&empty, "").unwrap();
    let in_file = dir.join("listen.toml");
    std::fs::write(&in_file, "listen = \"0.0.0.0:0\"\n").unwrap();
    let (empty, in_file) = (path_arg(&empty), path_arg(&in_file));
    let (data, empty, in_file) = (data.as_str(), empty.as_str(), in_file.as_str());
    let owned = |args: &[&str]| -> Vec<String> { args.iter().map(|a| a.to_string()).collect() };
    let flag = |listen: &str| owned(&["--listen", listen, "--data-dir", data, "--config", empty]);
    let cases: Vec<Launch> = vec![
        ("--listen 0.0.0.0:0", flag("0.0.0.0:0"), vec![]),
        ("--listen [::]:0", flag("[::]:0"), vec![]),
        (
            "listen in the config file",
            owned(&["--data-dir", data, "--config", in_file]),
            vec![],
        ),
        (
            "SANDCALL_LISTEN",
            owned(&["--data-dir", data, "--config", empty]),
            vec![("SANDCALL_LISTEN", "0.0.0.0:0")],
        ),
    ];
    for (label, args, env) in cases {
        let t = Instant::now();
        let (status, stdout, stderr) = Spawned::serve(&args, &env).wait_for_exit(Duration::from_secs(30));
        assert!(
            !status.success(),
            "{label}: started without keys on a public address\n{stderr}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "{label}: took {:?} to refuse",
            t.elapsed()
        );
        assert!(
            stderr.contains("api_keys") && stderr.contains("allow_unauthenticated"),
            "{label}: the message does not say what to add: {stderr}"
        );
        assert!(!stdout.contains("sandcall listening on"), "{label}: {stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_non_loopback_address_with_keys_starts() {
    let dir = Server::new_dir();
    let empty = dir.join("empty.toml");
    std::fs::write(&empty, "").unwrap();
    let (data, empty) = (path_arg(&dir.join("data")), path_arg(&empty));
    let args: Vec<String> = [
        "--listen",
        "0.0.0.0:0",
        "--data-dir",
        data.as_str(),
        "--config",
        empty.as_str(),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let mut server = Spawned::serve(&args, &[("SANDCALL_API_KEYS", KEYS)]);
    let port = server.wait_for_port(Duration::from_secs(60));
    let base = format!("http://127.0.0.1:{port}");
    let reply = Client::at(&base).with("X-API-Key", ALICE).get("/openapi.json");
    assert_eq!(reply.status, 200, "{reply}");
    assert_unauthorized(&Client::at(&base).get("/openapi.json"), "no key on a public address");
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `allow_unauthenticated` opens a server with no credentials to a private network: it
/// starts on a non-loopback address with a warning, serves requests that name it by any
/// host (containers call it `sandcall:3112`), and still refuses web pages.
#[test]
fn allow_unauthenticated_listens_beyond_loopback_with_a_warning() {
    let dir = Server::new_dir();
    let empty = dir.join("empty.toml");
    std::fs::write(&empty, "").unwrap();
    let (data, empty) = (path_arg(&dir.join("data")), path_arg(&empty));
    let args: Vec<String> = ["--listen", "0.0.0.0:0", "--data-dir", &data, "--config", &empty]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let mut server = Spawned::serve(&args, &[("SANDCALL_ALLOW_UNAUTHENTICATED", "true")]);
    let stderr = server.child().stderr.take().unwrap();
    // Read to the end (the server must not meet a closed pipe), counting the warnings.
    let warned = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .filter(|l| l.contains("allow_unauthenticated") && l.contains("private network"))
            .count()
            > 0
    });
    let port = server.wait_for_port(Duration::from_secs(60));
    let base = format!("http://127.0.0.1:{port}");
    let named = Client::at(&base).with("Host", &format!("sandcall:{port}"));
    let ran = named.post_json("/v1/exec", &json!({"code": "print(6 * 7)"}));
    assert_eq!(ran.status, 200, "{ran}");
    assert_eq!(ran.json()["stdout"], "42\n", "{ran}");
    // A web page is still a web page.
    let page = Client::at(&base).with("Origin", "http://evil.example");
    let refused = page.post_json("/v1/exec", &json!({"code": "print(1)"}));
    assert_eq!(refused.status, 403, "{refused}");
    assert_eq!(refused.json()["error_type"], "forbidden_origin");
    let untyped = named.send("POST", "/v1/exec", None, Some(br#"{"code": "print(1)"}"#));
    assert_eq!(untyped.status, 415, "{untyped}");
    server.stop();
    assert!(warned.join().unwrap(), "no warning at start");
    let _ = std::fs::remove_dir_all(&dir);
    // The same request to a server in plain local mode (loopback only) is refused: the
    // name is what the rebinding check looks at.
    let local = Server::start();
    let misnamed = Client::at(&local.base).with("Host", &format!("sandcall:{}", local.port));
    let reply = misnamed.post_json("/v1/exec", &json!({"code": "print(6 * 7)"}));
    assert_eq!(reply.status, 421, "{reply}");
}

#[test]
fn local_mode_needs_no_key() {
    let s = Server::start();
    let anyone = Client::anonymous(&s);
    let reply = anyone.get("/v1/health");
    assert_eq!(reply.status, 200, "{reply}");
    let up = anyone.upload("local.txt", "text/plain", b"local\n");
    let r = anyone.exec(json!({"code": "print(open('local.txt').read(), end='')", "files": [up.input("local.txt")]}));
    assert_eq!(r["stdout"], "local\n", "{r}");
    let paused = start_paused(&anyone);
    assert_eq!(
        anyone.get(&format!("{ROUTE}/{}", str_of(&paused, "session_id"))).status,
        200
    );
    // With no keys configured there is nothing to check a key against: one principal,
    // whatever a client sends (LibreChat always sends its configured key).
    for c in [Client::api_key(&s, "anything"), Client::bearer(&s, "whatever")] {
        assert_eq!(c.get("/v1/health").status, 200);
        let reply = c.download(&up.session_id, &up.id);
        assert_eq!(reply.status, 200, "{reply}");
        assert_eq!(reply.body, b"local\n");
    }
    let reply = anyone.post_json(ROUTE, &resume_body(&paused));
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.json()["stdout"], "rate 0.92\n", "{reply}");
}

fn field_names(v: &Value) -> Vec<&str> {
    let mut names: Vec<&str> = v
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// Load balancers and container probes have no key: health answers them, with whether
/// the server is up and nothing about what it holds. A tenant's key gets its own figures
/// (hostile::operator_data checks they are its own); a key that is not valid is still 401.
#[test]
fn health_needs_no_key_and_says_more_with_one() {
    let s = keyed_server();
    let bare = Client::anonymous(&s).get("/v1/health");
    assert_eq!(bare.status, 200, "{bare}");
    assert_eq!(field_names(&bare.json()), ["status", "version"], "{bare}");
    assert_eq!(bare.json()["status"], "ok", "{bare}");
    let full = Client::bearer(&s, ALICE).get("/v1/health");
    assert_eq!(full.status, 200, "{full}");
    assert_eq!(
        field_names(&full.json()),
        [
            "active_runs",
            "cgroup",
            "dormant_sessions",
            "max_concurrent_runs",
            "max_sessions",
            "sessions",
            "status",
            "version",
        ],
        "{full}"
    );
    assert_unauthorized(&Client::api_key(&s, "wrong").get("/v1/health"), "a wrong key");
    assert_unauthorized(&Client::bearer(&s, "").get("/v1/health"), "an empty key");
    // Only health: the rest still needs a key.
    assert_unauthorized(&Client::anonymous(&s).get("/v1/health/"), "health with a slash");
    assert_unauthorized(&Client::anonymous(&s).get("/openapi.json"), "no key");
}
