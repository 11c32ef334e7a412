//! LibreChat's JWTs over HTTP: a server started with an Ed25519 public key made by the
//! test, tokens minted the way LibreChat mints them, and the principal they make, the
//! pair (`tenant_id`, `sub`). Each LibreChat user sees only their own files and sessions;
//! API keys keep working beside JWTs; a token that breaks a rule is 401; a key source
//! that cannot be parsed stops `serve` and fails `doctor`. (Each rule on its own is a
//! unit test in crates/auth/src/jwt.rs.)

use crate::common::Server;
use crate::files::{assert_error, file_part, output, output_names, stored_count, Client, NO_SUCH_ID};
use crate::principals::{resume_body, start_paused};
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const KID: &str = "lc-codeapi-2026-05";
const ROUTE: &str = "/v1/exec/programmatic";
const OPS_KEY: &str = "ops-key-0123456789abcdef";

/// LibreChat's side: the private key it signs with, and the public PEM sandcall gets.
struct LibreChat {
    key: EncodingKey,
    public_pem: String,
}

impl LibreChat {
    /// A new Ed25519 key pair, made here.
    fn new() -> LibreChat {
        let key = ed25519_dalek::SigningKey::from_bytes(&rand::random::<[u8; 32]>());
        LibreChat {
            key: EncodingKey::from_ed_der(key.to_pkcs8_der().unwrap().as_bytes()),
            public_pem: key.verifying_key().to_public_key_pem(LineEnding::LF).unwrap(),
        }
    }

    /// A token for `sub` in `tenant` (None: no `tenant_id` claim), valid for 5 minutes
    /// from `iat`, with `changes` applied to the claims.
    fn token_at(&self, tenant: Option<&str>, sub: &str, iat: u64, changes: Value) -> String {
        let mut claims = json!({
            "iss": "librechat",
            "aud": "codeapi",
            "sub": sub,
            "iat": iat,
            "nbf": iat,
            "exp": iat + 300,
            "jti": format!("jti-{}", rand::random::<u64>()),
            "role": "USER",
            "principal_source": "librechat_jwt",
            "auth_context_hash": "hash",
        });
        if let Some(tenant) = tenant {
            claims["tenant_id"] = json!(tenant);
        }
        for (k, v) in changes.as_object().unwrap() {
            claims[k] = v.clone();
        }
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(KID.into());
        jsonwebtoken::encode(&header, &claims, &self.key).unwrap()
    }

    fn token(&self, tenant: Option<&str>, sub: &str) -> String {
        self.token_at(tenant, sub, now(), json!({}))
    }

    /// A client that sends a fresh token for this user.
    fn user(&self, s: &Server, tenant: Option<&str>, sub: &str) -> Client {
        Client::bearer(s, &self.token(tenant, sub))
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// A server that knows LibreChat's public key (as its deployment passes it: the PEM in
/// CODEAPI_JWT_PUBLIC_KEY with CODEAPI_JWT_KID) and one API key, `ops`.
fn server(lc: &LibreChat) -> Server {
    Server::start_with(
        &[
            ("CODEAPI_JWT_PUBLIC_KEY", &lc.public_pem),
            ("CODEAPI_JWT_KID", KID),
            ("SANDCALL_API_KEYS", &format!("ops:{OPS_KEY}")),
        ],
        "",
    )
}

fn str_of<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field].as_str().unwrap_or_else(|| panic!("no {field}: {v}"))
}

/// 401 `unauthorized` with `WWW-Authenticate: Bearer`, its message naming `rule`.
fn assert_refused(s: &Server, token: &str, rule: &str) {
    let resp = match ureq::get(&s.url("/v1/health"))
        .set("Authorization", &format!("Bearer {token}"))
        .call()
    {
        Err(ureq::Error::Status(_, r)) => r,
        other => panic!("a token breaking {rule:?} was not refused: {other:?}"),
    };
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.header("WWW-Authenticate"), Some("Bearer"));
    let body: Value = serde_json::from_str(&resp.into_string().unwrap()).unwrap();
    assert_eq!(body["error_type"], "unauthorized", "{body}");
    let message = str_of(&body, "error");
    assert!(message.contains(rule), "{rule:?} not in {message:?}");
    assert!(!message.contains("BEGIN") && !message.contains("/tmp"), "{message}");
    let reply = Client::bearer(s, token).post_json("/v1/exec", &json!({"code": "print(1)"}));
    assert_error(&reply, 401, "unauthorized");
}

#[test]
fn two_librechat_users_cannot_see_each_others_files_or_sessions() {
    let lc = LibreChat::new();
    let s = server(&lc);
    let alice = lc.user(&s, Some("legacy"), "6650a1b2c3d4e5f6a7b8c9d0");
    let bob = lc.user(&s, Some("legacy"), "6650a1b2c3d4e5f6a7b8c9d1");

    let up = alice.upload("secret.csv", "text/csv", b"alice,only\n");
    let run = alice.exec(json!({
        "code": "open('report.txt', 'w').write(open('secret.csv').read().upper())",
        "files": [up.input("secret.csv")],
    }));
    assert_eq!(output_names(&run), vec!["report.txt".to_owned()], "{run}");
    let run_sid = str_of(&run, "session_id").to_owned();
    let out_id = str_of(output(&run, "report.txt"), "id").to_owned();
    let paused = start_paused(&alice);
    let paused_sid = str_of(&paused, "session_id").to_owned();

    // Bob gets what a file or session that never existed gets.
    assert_error(&bob.download(NO_SUCH_ID, NO_SUCH_ID), 404, "file_not_found");
    for (sid, id) in [
        (up.session_id.as_str(), up.id.as_str()),
        (run_sid.as_str(), out_id.as_str()),
    ] {
        assert_error(&bob.download(sid, id), 404, "file_not_found");
        assert_error(&bob.object(sid, id), 404, "file_not_found");
        assert_error(&bob.delete_file(sid, id), 404, "file_not_found");
        assert!(bob.list(sid).is_empty(), "bob lists alice's session {sid}");
    }
    let reply = bob.post_json(
        "/v1/exec",
        &json!({"code": "print(open('secret.csv').read())", "files": [up.input("secret.csv")]}),
    );
    assert_error(&reply, 404, "file_not_found");
    assert_error(&bob.get(&format!("{ROUTE}/{paused_sid}")), 404, "session_not_found");
    assert_error(&bob.post_json(ROUTE, &resume_body(&paused)), 404, "session_not_found");
    assert_error(
        &bob.post_json(&format!("{ROUTE}/cancel"), &json!({"session_id": paused_sid})),
        404,
        "session_not_found",
    );

    // Alice, with a new token (a new jti, a later iat), is still alice.
    let alice = Client::bearer(
        &s,
        &lc.token_at(
            Some("legacy"),
            "6650a1b2c3d4e5f6a7b8c9d0",
            now() - 5,
            json!({"principal_source": "openid_reuse"}),
        ),
    );
    let reply = alice.download(&up.session_id, &up.id);
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.body, b"alice,only\n");
    assert_eq!(alice.list(&run_sid).len(), 1);
    let reply = alice.post_json(ROUTE, &resume_body(&paused));
    assert_eq!(reply.status, 200, "bob's attempts touched alice's session: {reply}");
    let done = reply.json();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["stdout"], "rate 0.92\n", "{done}");

    // Bob's own things are his.
    let his = bob.upload("bob.txt", "text/plain", b"bob\n");
    assert_error(&alice.download(&his.session_id, &his.id), 404, "file_not_found");
    assert_eq!(bob.download(&his.session_id, &his.id).body, b"bob\n");
}

#[test]
fn two_tenants_with_the_same_sub_are_different_principals() {
    let lc = LibreChat::new();
    let s = server(&lc);
    let in_a = lc.user(&s, Some("tenant-a"), "user-1");
    let in_b = lc.user(&s, Some("tenant-b"), "user-1");
    let up = in_a.upload("a.txt", "text/plain", b"tenant a\n");
    assert_error(&in_b.download(&up.session_id, &up.id), 404, "file_not_found");
    assert!(in_b.list(&up.session_id).is_empty());
    let paused = start_paused(&in_a);
    assert_error(&in_b.post_json(ROUTE, &resume_body(&paused)), 404, "session_not_found");
    assert_eq!(in_a.download(&up.session_id, &up.id).body, b"tenant a\n");
    // A token without tenant_id is in the tenant `legacy`, as LibreChat without tenants.
    let legacy = lc.user(&s, Some("legacy"), "user-1");
    let untenanted = lc.user(&s, None, "user-1");
    let up = untenanted.upload("l.txt", "text/plain", b"legacy\n");
    assert_eq!(legacy.download(&up.session_id, &up.id).body, b"legacy\n");
    assert_error(&in_a.download(&up.session_id, &up.id), 404, "file_not_found");
}

#[test]
fn an_api_key_works_beside_jwts() {
    let lc = LibreChat::new();
    let s = server(&lc);
    let user = lc.user(&s, Some("legacy"), "user-1");
    for ops in [Client::bearer(&s, OPS_KEY), Client::api_key(&s, OPS_KEY)] {
        let r = ops.exec(json!({"code": "print(6 * 7)"}));
        assert_eq!(r["stdout"], "42\n", "{r}");
    }
    let ops = Client::api_key(&s, OPS_KEY);
    let theirs = ops.upload("ops.txt", "text/plain", b"ops\n");
    let mine = user.upload("user.txt", "text/plain", b"user\n");
    assert_error(&user.download(&theirs.session_id, &theirs.id), 404, "file_not_found");
    assert_error(&ops.download(&mine.session_id, &mine.id), 404, "file_not_found");
    assert_eq!(ops.download(&theirs.session_id, &theirs.id).body, b"ops\n");
    assert_eq!(user.download(&mine.session_id, &mine.id).body, b"user\n");
    // X-API-Key is always an API key, even when it holds a valid JWT.
    let token = lc.token(Some("legacy"), "user-1");
    assert_error(&Client::api_key(&s, &token).get("/v1/health"), 401, "unauthorized");
    // Health says more to either credential, and only status and version to none.
    for c in [user.clone(), ops.clone()] {
        let reply = c.get("/v1/health");
        assert_eq!(reply.status, 200, "{reply}");
        assert!(reply.json().as_object().unwrap().len() > 2, "{reply}");
    }
    let bare = Client::anonymous(&s).get("/v1/health");
    assert_eq!(bare.status, 200, "{bare}");
    let mut fields: Vec<String> = bare.json().as_object().unwrap().keys().cloned().collect();
    fields.sort();
    assert_eq!(fields, ["status", "version"], "{bare}");
}

#[test]
fn expired_and_wrongly_signed_tokens_are_401_and_change_nothing() {
    let lc = LibreChat::new();
    let s = server(&lc);
    let stored = stored_count(&s);
    let expired = lc.token_at(Some("legacy"), "user-1", now() - 400, json!({}));
    assert_refused(&s, &expired, "expired");
    let stranger = LibreChat::new();
    assert_refused(&s, &stranger.token(Some("legacy"), "user-1"), "signature is not valid");
    assert_refused(
        &s,
        &lc.token_at(Some("legacy"), "user-1", now(), json!({"aud": "another-api"})),
        "not accepted",
    );
    assert_refused(
        &s,
        &lc.token_at(Some("legacy"), "user-1", now(), json!({"exp": now() + 3600})),
        "not accepted",
    );
    assert_refused(&s, "not-a-key", "not valid");
    assert_refused(&s, "a.b", "malformed");
    // Nothing those requests asked for happened.
    let refused = Client::bearer(&s, &expired);
    let reply = refused.upload_parts(&[file_part("x.txt", "text/plain", b"x")]);
    assert_error(&reply, 401, "unauthorized");
    assert_eq!(stored_count(&s), stored, "a refused request stored a file");
    // The same user with a valid token is served.
    let r = lc
        .user(&s, Some("legacy"), "user-1")
        .exec(json!({"code": "print('ok')"}));
    assert_eq!(r["stdout"], "ok\n", "{r}");
}

/// `sandcall serve` or `doctor` with these arguments and environment: its exit status,
/// stdout and stderr, once it exits (or, for a server that starts, the port it printed).
fn sandcall(args: &[&str], env: &[(&str, &str)], limit: Duration) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandcall"));
    cmd.args(args)
        .env_remove("SANDCALL_API_KEYS")
        .env("SANDCALL_INSTALL_RUNTIME", "false")
        .env("SANDCALL_RUNTIME_DIR", crate::common::runtime_dir())
        .env("SANDCALL_LOG", "warn")
        .env("SANDCALL_WARM_POOL_SIZE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut out = String::new();
    for line in BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        out.push_str(&line);
        out.push('\n');
        if line.starts_with("sandcall listening on ") {
            // It started: stop it, as an operator would.
            // SAFETY: plain kill(2) on our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            break;
        }
    }
    let t = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("sandcall {args:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status.code(), out, err.join().unwrap())
}

#[test]
fn serve_and_doctor_refuse_a_key_file_they_cannot_parse() {
    let dir = Server::new_dir();
    let keys = dir.join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let lc = LibreChat::new();
    std::fs::write(keys.join(format!("{KID}.pem")), &lc.public_pem).unwrap();
    std::fs::write(
        keys.join("broken.pem"),
        "-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n",
    )
    .unwrap();
    let data = dir.join("data");
    let (data, keys_arg) = (data.to_str().unwrap(), keys.to_str().unwrap());
    let env = [("CODEAPI_JWT_PUBLIC_KEYS_DIR", keys_arg)];
    let (code, stdout, stderr) = sandcall(
        &["serve", "--listen", "127.0.0.1:0", "--data-dir", data],
        &env,
        Duration::from_secs(30),
    );
    assert_ne!(code, Some(0), "serve started with a broken key: {stdout}{stderr}");
    assert!(!stdout.contains("sandcall listening on"), "{stdout}");
    let expected = "JWT keys: public_keys_dir (CODEAPI_JWT_PUBLIC_KEYS_DIR):";
    assert!(stderr.contains(expected) && stderr.contains("broken.pem"), "{stderr}");
    let (code, stdout, _) = sandcall(&["doctor", "--data-dir", data], &env, Duration::from_secs(60));
    assert_ne!(code, Some(0), "doctor passed a broken key: {stdout}");
    assert!(
        stdout.contains("[FAIL] credentials: ") && stdout.contains(expected) && stdout.contains("broken.pem"),
        "{stdout}"
    );

    // Without the broken file, doctor says what is configured, and serve starts, on a
    // non-loopback address too: JWT keys are credentials.
    std::fs::remove_file(keys.join("broken.pem")).unwrap();
    let (code, stdout, _) = sandcall(&["doctor", "--data-dir", data], &env, Duration::from_secs(120));
    assert!(
        stdout.contains("[pass] credentials: 0 API keys; JWT: issuer \"librechat\", audience \"codeapi\"")
            && stdout.contains(&format!("\"{KID}\" (EdDSA, from public_keys_dir")),
        "{stdout}"
    );
    assert_eq!(code, Some(0), "{stdout}");
    let (_, stdout, stderr) = sandcall(
        &["serve", "--listen", "0.0.0.0:0", "--data-dir", data],
        &env,
        Duration::from_secs(60),
    );
    assert!(stdout.contains("sandcall listening on"), "{stdout}{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
