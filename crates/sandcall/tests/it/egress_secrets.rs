//! Egress secrets (docs/egress.md, "Secrets"): a run sees only a placeholder; the proxy
//! puts the secret in its header on the way to its host, over TLS it terminates with the
//! server's CA, and takes it out of what comes back. The upstreams are real servers of
//! this process on loopback (named in `egress_allow_addresses`); the secret host's
//! certificate is signed by a test CA the server trusts through `egress_extra_roots`.
//! `.ci/run` runs these in both isolation tiers.

use crate::common::{Server, STDERR_FILE};
use crate::egress::{listen, read_head, Conn};
use serde_json::{json, Value};
use std::io::{BufReader, Write};
use std::sync::{Arc, Mutex};

const VALUE: &str = "sk-live-4242-the-real-secret-value";

/// A loopback upstream that answers each request with its head (request line and
/// headers) as the body and its `Authorization` in `X-Echo-Auth`, and keeps the heads.
struct Echo {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Echo {
    fn start(addr: &str, tls: Option<Arc<rustls::ServerConfig>>) -> Echo {
        let (port, seen) = listen(addr, tls, echo);
        Echo { port, seen }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

fn echo(stream: Box<dyn Conn>, log: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream);
    let Some(head) = read_head(&mut reader) else { return };
    log.lock().unwrap().push(head.clone());
    let auth = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("authorization: ")
                .or_else(|| l.strip_prefix("Authorization: "))
        })
        .unwrap_or("")
        .to_owned();
    let mut stream = reader.into_inner();
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Echo-Auth: {auth}\r\nConnection: close\r\n\r\n{head}",
        head.len()
    );
    let _ = stream.flush();
}

/// A test CA (its PEM) and a TLS upstream on 127.0.0.1 for `localhost` that it signs.
fn tls_upstream() -> (Echo, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::default();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let der_key = rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], der_key)
        .unwrap();
    (Echo::start("127.0.0.1:0", Some(Arc::new(config))), ca_pem)
}

/// A server whose runs may reach `host` (its secret's, `localhost`) and `other_host`, the
/// secret `VALUE` in `authorization` for `localhost` (placeholder in `API_TOKEN`), the test
/// CA `test_ca` trusted for upstreams; with the file of its log (debug), in its directory.
fn secret_server(host: &str, other_host: &str, test_ca: &str) -> (Server, std::path::PathBuf) {
    let dir = Server::new_dir();
    let log = dir.join("server.log");
    let roots = dir.join("roots.pem");
    std::fs::write(&roots, test_ca).unwrap();
    let config = format!(
        "egress_allow = [{host:?}, {other_host:?}]\negress_principals = [\"*\"]\n\
         egress_allow_addresses = [\"127.0.0.0/8\", \"::1/128\"]\negress_extra_roots = {roots:?}\n\
         [[egress_secrets]]\nhost = \"localhost\"\nheader = \"authorization\"\nenv = \"API_TOKEN\"\n\
         value = \"env:SANDCALL_TEST_SECRET\"\nprincipals = [\"*\"]\n"
    );
    let log_path = log.to_str().unwrap();
    let env = [
        ("SANDCALL_TEST_SECRET", VALUE),
        ("SANDCALL_LOG", "debug"),
        (STDERR_FILE, log_path),
    ];
    (Server::launch(dir, &env, &config, None), log)
}

#[test]
fn a_secret_reaches_its_host_and_the_program_sees_only_the_placeholder() {
    let (secret_host, test_ca) = tls_upstream();
    let other = Echo::start("127.0.0.2:0", None);
    let host = format!("localhost:{}", secret_host.port);
    let other_host = format!("127.0.0.2:{}", other.port);
    let (s, log) = secret_server(&host, &other_host, &test_ca);
    let run = |language: &str, code: &str| -> Value {
        s.exec(json!({"language": language, "code": code, "network": {}, "timeout": 60000}))
    };
    let url = format!("https://{host}/secret");
    // curl (CURL_CA_BUNDLE), with NO_PROXY cleared: `localhost` is otherwise not proxied.
    let bash = format!(
        "unset NO_PROXY no_proxy\necho \"token=$API_TOKEN\"\ncat /proc/self/environ | tr '\\0' '\\n' | grep -c sandcall-secret-\n\
         curl -sS -i --max-time 20 -H \"Authorization: Bearer $API_TOKEN\" {url}\n\
         curl -sS --max-time 20 -H \"Authorization: Bearer $API_TOKEN\" http://{other_host}/other"
    );
    let r = run("bash", &bash);
    let out = r["stdout"].as_str().unwrap().to_owned();
    assert!(out.starts_with("token=sandcall-secret-"), "{r}");
    let placeholder = out.lines().next().unwrap().strip_prefix("token=").unwrap().to_owned();
    // The variable's placeholder is in /proc/self/environ, the value nowhere.
    assert_eq!(out.lines().nth(1), Some("1"), "{r}");
    assert!(out.contains(&format!("x-echo-auth: Bearer {placeholder}")), "{r}");
    assert!(out.contains(&format!("authorization: Bearer {placeholder}")), "{r}");
    assert!(!r.to_string().contains(VALUE), "the program saw the secret: {r}");

    // Python's urllib (SSL_CERT_FILE) and requests (REQUESTS_CA_BUNDLE), and what
    // /proc/self/environ holds.
    let py = format!(
        r#"
import os, urllib.request
for k in ("NO_PROXY", "no_proxy"):
    os.environ.pop(k, None)
environ = open("/proc/self/environ", "rb").read()
print("environ-has-placeholder", os.environ["API_TOKEN"].encode() in environ)
req = urllib.request.Request({url:?}, headers={{"Authorization": "Bearer " + os.environ["API_TOKEN"]}})
with urllib.request.urlopen(req, timeout=20) as resp:
    print(resp.headers["X-Echo-Auth"])
    print(resp.read().decode())
import requests
resp = requests.get({url:?}, headers={{"Authorization": "Bearer " + os.environ["API_TOKEN"]}}, timeout=20)
print("requests", resp.headers["X-Echo-Auth"])
"#
    );
    let r = run("python", &py);
    let out = r["stdout"].as_str().unwrap();
    assert!(out.starts_with("environ-has-placeholder True\n"), "{r}");
    assert!(out.contains(&format!("Bearer {placeholder}\n")), "{r}");
    assert!(out.contains(&format!("requests Bearer {placeholder}\n")), "{r}");
    assert!(!r.to_string().contains(VALUE), "the program saw the secret: {r}");

    // The secret host got the value, in the header, from every client.
    let seen = secret_host.seen();
    assert_eq!(seen.len(), 3, "{seen:?}");
    for head in &seen {
        let auth = head
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("authorization:"));
        assert_eq!(
            auth.map(|l| l[14..].trim()),
            Some(format!("Bearer {VALUE}").as_str()),
            "{head}"
        );
    }
    // The other allowed host got the placeholder as sent.
    let seen = other.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].contains(&format!("Bearer {placeholder}")), "{seen:?}");
    assert!(!seen[0].contains(VALUE), "{seen:?}");

    // The server's log so far (the runs are over, their connections logged).
    let log = std::fs::read_to_string(&log).unwrap();
    drop(s);
    assert!(log.contains("egress connection"), "the log shows no connection: {log}");
    assert!(!log.contains(VALUE), "the server logged the secret");
}

#[test]
fn node_fetch_over_https_to_a_secrets_host_sends_the_secret_and_sees_the_placeholder() {
    let (secret_host, test_ca) = tls_upstream();
    let other = Echo::start("127.0.0.2:0", None);
    let host = format!("localhost:{}", secret_host.port);
    let other_host = format!("127.0.0.2:{}", other.port);
    let (s, _log) = secret_server(&host, &other_host, &test_ca);
    let url = format!("https://{host}/node");
    // `localhost` is in NO_PROXY; the preload's EnvHttpProxyAgent reads NO_PROXY at each
    // request, so the program clears it as the curl and Python cases do. Then a child
    // `node` (the preload comes with NODE_OPTIONS) without NODE_EXTRA_CA_CERTS: the
    // proxy's certificate for the host does not verify there.
    let js = format!(
        r#"
const {{ spawnSync }} = require("node:child_process");
const token = process.env.API_TOKEN;
console.log("token=" + token);
delete process.env.NO_PROXY;
delete process.env.no_proxy;
const r = await fetch({url:?}, {{ headers: {{ Authorization: "Bearer " + token }} }});
const body = await r.text();
console.log("status", r.status, r.headers.get("x-echo-auth"));
console.log("body-has-placeholder", body.includes("Bearer " + token));
const env = {{ ...process.env }};
delete env.NODE_EXTRA_CA_CERTS;
const child = `fetch({url:?}, {{ headers: {{ Authorization: "Bearer " + process.env.API_TOKEN }} }})
  .then((r) => console.log("child", r.status), (e) => console.log("child-failed", e.cause && e.cause.code))`;
const out = spawnSync(process.execPath, ["-e", child], {{ env, encoding: "utf8", timeout: 30000 }});
console.log(out.stdout.trim(), out.stderr.trim());
"#
    );
    let r = s.exec(json!({"language": "javascript", "code": js, "network": {}, "timeout": 60000}));
    let out = r["stdout"].as_str().unwrap_or_default().to_owned();
    let placeholder = out
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("token="))
        .unwrap_or_default()
        .to_owned();
    assert!(placeholder.starts_with("sandcall-secret-"), "{r}");
    let mut lines = out.lines().skip(1);
    assert_eq!(
        lines.next(),
        Some(format!("status 200 Bearer {placeholder}").as_str()),
        "{r}"
    );
    assert_eq!(lines.next(), Some("body-has-placeholder true"), "{r}");
    // Without the bundle's CA the handshake with the proxy fails: no request is made.
    let child = lines.next().unwrap_or_default();
    let code = child.strip_prefix("child-failed ").unwrap_or_default().trim();
    let untrusted = [
        "SELF_SIGNED_CERT_IN_CHAIN",
        "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
        "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
    ];
    assert!(untrusted.contains(&code), "a certificate error: {r}");
    assert!(!r.to_string().contains(VALUE), "the program saw the secret: {r}");
    // The host got the value in its header, once (the parent's request).
    let seen = secret_host.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let auth = seen[0]
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("authorization:"));
    assert_eq!(
        auth.map(|l| l[14..].trim()),
        Some(format!("Bearer {VALUE}").as_str()),
        "{seen:?}"
    );
    assert!(other.seen().is_empty());
}

#[test]
fn a_secret_that_cannot_be_read_stops_the_server_without_showing_a_value() {
    let dir = Server::new_dir();
    let config = dir.join("sandcall.toml");
    let key_file = dir.join("key");
    std::fs::write(&key_file, format!("{VALUE}\nsecond line\n")).unwrap();
    // A header name that is not one: the value was read, and is not in the message.
    std::fs::write(
        &config,
        format!(
            "egress_allow = [\"api.example.com\"]\negress_principals = [\"*\"]\n[[egress_secrets]]\n\
             host = \"api.example.com\"\nheader = \"bad header\"\nenv = \"K\"\nvalue = \"file:{}\"\n",
            key_file.display()
        ),
    )
    .unwrap();
    let start = |config: &std::path::Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandcall"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.join("data"))
            .arg("--config")
            .arg(config)
            .env("SANDCALL_INSTALL_RUNTIME", "false")
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = start(&config);
    assert!(
        stderr.contains("egress_secrets") && stderr.contains("bad header"),
        "{stderr}"
    );
    assert!(!stderr.contains(VALUE), "{stderr}");
    // A variable that is not set: named, with the host.
    std::fs::write(
        &config,
        "egress_allow = [\"api.example.com\"]\negress_principals = [\"*\"]\n[[egress_secrets]]\n\
         host = \"api.example.com\"\nheader = \"x-api-key\"\nenv = \"K\"\nvalue = \"env:SANDCALL_TEST_NOT_SET\"\n",
    )
    .unwrap();
    let stderr = start(&config);
    assert!(stderr.contains("SANDCALL_TEST_NOT_SET is not set"), "{stderr}");
}
