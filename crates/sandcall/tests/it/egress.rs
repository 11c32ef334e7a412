//! Egress (docs/egress.md): a run granted network reaches the allowed hosts through the
//! server's proxy, and nothing else. The upstreams are real HTTP and HTTPS servers in
//! this process, on loopback addresses of this machine: the proxy refuses loopback
//! unless the configuration names it (`egress_allow_addresses`), which these servers'
//! configurations do, except where the refusal itself is tested.
//!
//! `.ci/run` runs these in both tiers; the last test asks for the gvisor tier itself.
//!
//! The upstreams listen on 127.0.0.2: the program's `NO_PROXY` names `localhost` and
//! `127.0.0.1` (the sandbox's own loopback), so its clients send anything else to the
//! proxy, as they would a remote host.

use crate::common::Server;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

/// What an upstream answers on `/`.
pub(crate) const GREETING: &str = "hello from upstream";

/// A real upstream on 127.0.0.2 that answers every request with `GREETING`, or with
/// `n` bytes on `/bytes/n`, and keeps each request's first line and headers.
pub(crate) struct Upstream {
    pub(crate) port: u16,
    seen: Arc<Mutex<Vec<String>>>,
    /// The PEM of its certificate (an HTTPS upstream), the program's trust anchor.
    ca_pem: Option<String>,
}

impl Upstream {
    pub(crate) fn http() -> Upstream {
        Upstream::start(None)
    }

    /// An HTTPS upstream with a self-signed certificate for `127.0.0.2` and `localhost`.
    fn https() -> Upstream {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.2".to_owned()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let ca_pem = cert.pem();
        let der_key = rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], der_key)
            .unwrap();
        let mut up = Upstream::start(Some(Arc::new(config)));
        up.ca_pem = Some(ca_pem);
        up
    }

    fn start(tls: Option<Arc<rustls::ServerConfig>>) -> Upstream {
        let (port, seen) = listen("127.0.0.2:0", tls, answer);
        Upstream {
            port,
            seen,
            ca_pem: None,
        }
    }

    /// The requests it has seen, one string each (request line and headers).
    pub(crate) fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// A test upstream's connection, plain or TLS.
pub(crate) trait Conn: Read + Write {}
impl<T: Read + Write> Conn for T {}

/// A test upstream on `addr` (TLS with `tls`): each connection is handed to `handle`, on
/// a thread of its own, with the list of request heads the upstream keeps. Returns the
/// port and that list.
pub(crate) fn listen(
    addr: &str,
    tls: Option<Arc<rustls::ServerConfig>>,
    handle: fn(Box<dyn Conn>, &Mutex<Vec<String>>),
) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind(addr).unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().map_while(Result::ok) {
            let (log, tls) = (log.clone(), tls.clone());
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(20)));
                match tls {
                    Some(config) => {
                        let Ok(session) = rustls::ServerConnection::new(config) else {
                            return;
                        };
                        handle(Box::new(rustls::StreamOwned::new(session, conn)), &log);
                    }
                    None => handle(Box::new(conn), &log),
                }
            });
        }
    });
    (port, seen)
}

/// A request's head (request line and headers, without the blank line), read from
/// `reader`; none when the connection ends first.
pub(crate) fn read_head<R: BufRead>(reader: &mut R) -> Option<String> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        if line == "\r\n" || line == "\n" {
            return Some(head);
        }
        head.push_str(&line);
    }
}

/// Reads one request head and answers it.
fn answer(stream: Box<dyn Conn>, log: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream);
    let Some(head) = read_head(&mut reader) else { return };
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
    // A request's body is read (and dropped) before the answer.
    let length = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|n| n.trim().to_owned())
        })
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    if std::io::copy(&mut (&mut reader).take(length), &mut std::io::sink()).is_err() {
        return;
    }
    log.lock().unwrap().push(head);
    let body: Vec<u8> = match path.strip_prefix("/bytes/").and_then(|n| n.parse::<usize>().ok()) {
        Some(n) => vec![b'x'; n],
        None => GREETING.as_bytes().to_vec(),
    };
    let mut stream = reader.into_inner();
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(&body);
    let _ = stream.flush();
}

/// A server whose runs may reach `rules` (every principal), loopback allowed as
/// `addresses` says, with `extra` config lines.
pub(crate) fn egress_server(rules: &[String], addresses: &str, extra: &str) -> Server {
    Server::start_with(&[], &egress_config(rules, addresses, extra))
}

/// A configuration whose every principal's runs may reach `rules`, with `addresses`
/// (TOML strings) exempt from the refusal of loopback and private addresses.
pub(crate) fn egress_config(rules: &[String], addresses: &str, extra: &str) -> String {
    let rules: Vec<String> = rules.iter().map(|r| format!("{r:?}")).collect();
    format!(
        "egress_allow = [{}]\negress_principals = [\"*\"]\negress_allow_addresses = [{addresses}]\n{extra}",
        rules.join(", ")
    )
}

fn run(s: &Server, language: &str, code: &str, network: Value) -> Value {
    s.exec(json!({"language": language, "code": code, "network": network, "timeout": 60000}))
}

#[test]
fn an_allowed_https_host_is_reached_by_curl_python_requests_and_node_fetch() {
    let up = Upstream::https();
    let host = format!("127.0.0.2:{}", up.port);
    let s = egress_server(std::slice::from_ref(&host), "\"127.0.0.2/32\"", "");
    let ca = up.ca_pem.clone().unwrap();
    let url = format!("https://{host}/hello");
    // curl's CONNECT through HTTPS_PROXY, with the upstream's certificate as its CA.
    let bash = format!("cat > /tmp/ca.pem <<'EOF'\n{ca}EOF\ncurl -sS --max-time 20 --cacert /tmp/ca.pem {url}");
    let r = run(&s, "bash", &bash, json!({}));
    assert_eq!(r["stdout"], GREETING, "{r}");
    assert_eq!(r["network"]["connections"], 1, "{r}");
    assert_eq!(r["network"]["refused"], 0, "{r}");
    assert!(r["network"]["bytes_in"].as_u64().unwrap() > 0, "{r}");
    // Python: urllib and requests (the managed runtime's) read the same environment.
    let py = format!(
        r#"
import ssl, urllib.request, requests
open("/tmp/ca.pem", "w").write({ca:?})
ctx = ssl.create_default_context(cafile="/tmp/ca.pem")
print(urllib.request.urlopen({url:?}, context=ctx, timeout=20).read().decode())
print(requests.get({url:?}, verify="/tmp/ca.pem", timeout=20).text)
"#
    );
    let r = run(&s, "python", &py, json!({"allow": [host]}));
    assert_eq!(r["stdout"], format!("{GREETING}\n{GREETING}\n"), "{r}");
    assert_eq!(r["network"]["connections"], 2, "{r}");
    // Node's fetch (the preload's agent) through a CONNECT tunnel: a child `node`, since
    // NODE_EXTRA_CA_CERTS, here the upstream's certificate, is read as a process starts.
    let js = format!(
        r#"
require("node:fs").writeFileSync("/tmp/ca.pem", {ca:?});
const child = `fetch({url:?}).then(async (r) => console.log(r.status, await r.text()),
  (e) => console.log("failed", e.cause && e.cause.code))`;
const env = {{ ...process.env, NODE_EXTRA_CA_CERTS: "/tmp/ca.pem" }};
const out = require("node:child_process").spawnSync(process.execPath, ["-e", child], {{ env, encoding: "utf8" }});
process.stdout.write(out.stdout + out.stderr);
"#
    );
    let r = run(&s, "javascript", &js, json!({}));
    assert_eq!(r["stdout"], format!("200 {GREETING}\n"), "{r}");
    assert_eq!(r["network"]["connections"], 1, "{r}");
    assert_eq!(up.seen().len(), 4, "{:?}", up.seen());
    // Each run's socket on the host is gone with its run.
    let left: Vec<_> = std::fs::read_dir(s.data_dir.join("egress")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn node_fetch_and_plain_http_go_through_the_proxy() {
    let up = Upstream::http();
    let host = format!("127.0.0.2:{}", up.port);
    let s = egress_server(std::slice::from_ref(&host), "\"127.0.0.2/32\"", "");
    let js = format!("const r = await fetch('http://{host}/js'); console.log(r.status, await r.text());");
    let r = run(&s, "javascript", &js, json!({}));
    assert_eq!(r["stdout"], format!("200 {GREETING}\n"), "{r}");
    assert_eq!(r["network"]["connections"], 1, "{r}");
    // Plain HTTP is forwarded as an origin-form request.
    let r = run(
        &s,
        "bash",
        &format!("curl -sS --max-time 20 http://{host}/plain"),
        json!({}),
    );
    assert_eq!(r["stdout"], GREETING, "{r}");
    let seen = up.seen();
    assert!(seen.iter().any(|h| h.starts_with("GET /plain HTTP/1.1")), "{seen:?}");
    // Many times the relay's buffers, both ways, through a CONNECT tunnel: every byte.
    let code = format!(
        "head -c 3000000 /dev/zero > /tmp/up; curl -sS --max-time 20 -p --data-binary @/tmp/up \
         http://{host}/bytes/5000000 | wc -c"
    );
    let r = run(&s, "bash", &code, json!({}));
    assert_eq!(r["stdout"], "5000000\n", "{r}");
    assert!(r["network"]["bytes_out"].as_u64().unwrap() > 3_000_000, "{r}");
}

#[test]
fn a_host_outside_the_policy_is_refused_with_a_clear_error() {
    let up = Upstream::http();
    let host = format!("127.0.0.2:{}", up.port);
    let s = egress_server(std::slice::from_ref(&host), "\"127.0.0.2/32\"", "");
    let py = r#"
import urllib.request, urllib.error
try:
    urllib.request.urlopen("http://api.other.example/x", timeout=20)
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip())
"#;
    let r = run(&s, "python", py, json!({}));
    assert_eq!(
        r["stdout"], "403 sandcall egress: api.other.example is not in this run's network policy\n",
        "{r}"
    );
    assert_eq!(r["network"]["connections"], 1, "{r}");
    assert_eq!(r["network"]["refused"], 1, "{r}");
    // A port the rule does not name, through CONNECT.
    let r = run(
        &s,
        "bash",
        "curl -sS --max-time 20 -p http://127.0.0.2:1/ 2>&1; echo",
        json!({}),
    );
    assert!(r["stdout"].as_str().unwrap().contains("403"), "{r}");
    assert!(up.seen().is_empty(), "{:?}", up.seen());
}

#[test]
fn a_name_resolving_to_loopback_is_refused_unless_its_address_is_configured() {
    let up = Upstream::http();
    let host = format!("localhost:{}", up.port);
    // `localhost` is allowed by name, but no address range is: its address is refused.
    let s = egress_server(std::slice::from_ref(&host), "", "");
    // NO_PROXY would keep localhost off the proxy: the program clears it, as a program
    // trying to reach the host's services through it would.
    let code = format!("unset NO_PROXY no_proxy; curl -sS --max-time 20 http://{host}/");
    let r = run(&s, "bash", &code, json!({}));
    let out = r["stdout"].as_str().unwrap();
    assert!(
        out.contains("localhost resolves to") && out.contains("which egress refuses"),
        "{r}"
    );
    assert_eq!(r["network"]["refused"], 1, "{r}");
    assert!(up.seen().is_empty(), "{:?}", up.seen());
}

#[test]
fn asking_for_more_than_the_policy_is_a_400_naming_the_host() {
    let s = egress_server(&["api.example.com:443".to_owned()], "", "");
    for (network, names) in [
        (json!({"allow": ["evil.example.org"]}), "evil.example.org"),
        (
            json!({"allow": ["api.example.com:443", "api.example.com:22"]}),
            "api.example.com:22",
        ),
        (json!({"allow": ["*.example.com"]}), "*.example.com"),
    ] {
        let (status, v) = s.post("/v1/exec", &json!({"code": "print(1)", "network": network}));
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error_type"], "invalid_request", "{v}");
        assert!(v["error"].as_str().unwrap().contains(names), "{v}");
    }
    // A programmatic start is checked alike.
    let (status, v) = s.post(
        "/v1/exec/programmatic",
        &json!({"code": "print(1)", "network": {"allow": ["evil.example.org"]}}),
    );
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("evil.example.org"), "{v}");
    // A principal the configuration does not name gets no network at all.
    let s = Server::start_with(
        &[],
        "egress_allow = [\"api.example.com\"]\negress_principals = [\"alice\"]\n",
    );
    let (status, v) = s.post("/v1/exec", &json!({"code": "print(1)", "network": {}}));
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("egress_principals"), "{v}");
    // Nor does any principal of a server without egress.
    let s = Server::start();
    let (status, v) = s.post("/v1/exec", &json!({"code": "print(1)", "network": {}}));
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("no network"), "{v}");
}

#[test]
fn a_bad_rule_stops_the_server_at_start() {
    let stderr = refused_start("egress_allow = [\"bad host name!\"]\negress_principals = [\"*\"]\n");
    assert!(
        stderr.contains("egress_allow") && stderr.contains("bad host name!"),
        "{stderr}"
    );
}

/// Starts `sandcall serve` with `config`, which must make it refuse to start; its stderr.
fn refused_start(config: &str) -> String {
    let dir = Server::new_dir();
    let file = dir.join("sandcall.toml");
    std::fs::write(&file, config).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--config")
        .arg(&file)
        .env("SANDCALL_INSTALL_RUNTIME", "false")
        .output()
        .unwrap();
    assert!(!out.status.success(), "started with {config}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const ALICE_KEY: &str = "alice-key-0123456789abcdef";
const BOB_KEY: &str = "bob-key-0123456789abcdef";

#[test]
fn a_principals_own_egress_list_narrows_the_servers() {
    let (a, b) = (Upstream::http(), Upstream::http());
    let (host_a, host_b) = (format!("127.0.0.2:{}", a.port), format!("127.0.0.2:{}", b.port));
    let keys = |alice_egress: &str| {
        format!(
            "egress_allow = [{host_a:?}, {host_b:?}]\negress_principals = [\"*\"]\n\
             egress_allow_addresses = [\"127.0.0.2/32\"]\n\n\
             [[api_keys]]\nprincipal = \"alice\"\nsha256 = \"{}\"\negress = [{alice_egress}]\n\n\
             [[api_keys]]\nprincipal = \"bob\"\nsha256 = \"{}\"\n",
            sandcall_config::key_hash(ALICE_KEY),
            sandcall_config::key_hash(BOB_KEY)
        )
    };
    let s = Server::start_with(&[], &keys(&format!("{host_a:?}")));
    let fetch = |key: &str, host: &str, network: Value| {
        let code = format!("curl -sS --max-time 20 http://{host}/x");
        let body = json!({"lang": "bash", "code": code, "network": network, "timeout": 60000});
        s.post_with("/v1/exec", &body, &[("X-API-Key", key)])
    };
    // alice reaches her own host; the server's other one is not in her policy.
    let (status, r) = fetch(ALICE_KEY, &host_a, json!({}));
    assert_eq!((status, r["stdout"].as_str()), (200, Some(GREETING)), "{r}");
    let (status, r) = fetch(ALICE_KEY, &host_b, json!({}));
    assert_eq!(status, 200, "{r}");
    assert!(
        r["stdout"]
            .as_str()
            .unwrap()
            .contains("not in this run's network policy"),
        "{r}"
    );
    assert!(b.seen().is_empty(), "{:?}", b.seen());
    // Asking for it is a 400 that names it.
    let (status, r) = fetch(ALICE_KEY, &host_b, json!({"allow": [host_b]}));
    assert_eq!(status, 400, "{r}");
    assert!(r["error"].as_str().unwrap().contains(&host_b), "{r}");
    // bob, with no list of his own, has the server's whole policy.
    let (status, r) = fetch(BOB_KEY, &host_b, json!({"allow": [host_b]}));
    assert_eq!((status, r["stdout"].as_str()), (200, Some(GREETING)), "{r}");
    drop(s);
    // A principal's list may not reach past the server's: the server refuses to start.
    let stderr = refused_start(&keys("\"api.other.example\""));
    assert!(
        stderr.contains("alice") && stderr.contains("api.other.example") && stderr.contains("egress_allow"),
        "{stderr}"
    );
}

#[test]
fn without_network_a_run_has_no_way_out_on_a_server_with_egress() {
    let up = Upstream::http();
    let host = format!("127.0.0.2:{}", up.port);
    let s = egress_server(std::slice::from_ref(&host), "\"127.0.0.2/32\"", "");
    let py = r#"
import socket
for port in (3128, 53):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port)); print("connected", port)
    except OSError as e:
        print("refused", port)
"#;
    let r = s.exec(json!({"code": py}));
    assert_eq!(r["stdout"], "refused 3128\nrefused 53\n", "{r}");
    assert!(r.get("network").is_none(), "{r}");
}

#[test]
fn the_connection_limit_refuses_with_the_sandbox_reason() {
    let up = Upstream::http();
    let host = format!("127.0.0.2:{}", up.port);
    let s = egress_server(
        std::slice::from_ref(&host),
        "\"127.0.0.2/32\"",
        "egress_max_connections = 2\n",
    );
    let code =
        format!("for i in 1 2 3 4; do curl -s -o /dev/null -w '%{{http_code}} ' --max-time 20 http://{host}/; done");
    let r = run(&s, "bash", &code, json!({}));
    assert_eq!(r["stdout"], "200 200 403 403 ", "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .ends_with("[sandbox] network connection limit exceeded\n"),
        "{r}"
    );
    assert_eq!(up.seen().len(), 2);
    // `/metrics` (open in local mode) counts them.
    let (status, _, text) = s.request("GET", "/metrics", None, None);
    assert_eq!(status, 200);
    let text = text.as_str().unwrap_or_default().to_owned();
    for line in [
        "sandcall_egress_connections_total{outcome=\"relayed\"} 2",
        "sandcall_egress_connections_total{outcome=\"refused\"} 2",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line} in {text}");
    }
}

#[test]
fn the_byte_limit_cuts_the_traffic_with_the_sandbox_reason() {
    let up = Upstream::http();
    let host = format!("127.0.0.2:{}", up.port);
    let s = egress_server(
        std::slice::from_ref(&host),
        "\"127.0.0.2/32\"",
        "egress_max_bytes = 100000\n",
    );
    // 4 MiB asked for, 100 kB allowed: the transfer is cut short of it.
    let code = format!("curl -s --max-time 20 http://{host}/bytes/4194304 | wc -c");
    let r = run(&s, "bash", &code, json!({}));
    let got: u64 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(got <= 100_000, "{got} bytes came through: {r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .ends_with("[sandbox] network bytes limit exceeded\n"),
        "{r}"
    );
    assert!(r["network"]["bytes_in"].as_u64().unwrap() <= 100_000, "{r}");
}

#[test]
fn a_run_in_the_gvisor_tier_reaches_an_allowed_host_through_its_channel() {
    // gVisor's sandbox opens no host socket: the server passes it a channel at its start
    // and answers each of its connections with one made to the run's proxy socket.
    let up = Upstream::http();
    let host = format!("127.0.0.2:{}", up.port);
    let s = egress_server(std::slice::from_ref(&host), "\"127.0.0.2/32\"", "");
    let code = format!(
        "cat /proc/version; for i in 1 2 3; do curl -sS --max-time 20 http://{host}/g$i; echo; done; \
         curl -sS --max-time 20 -o /dev/null -w '%{{http_code}}' http://other.example/"
    );
    let ask = json!({"language": "bash", "code": code, "network": {}, "isolation": "gvisor", "timeout": 60000});
    let r = s.exec(ask);
    let out = r["stdout"].as_str().unwrap();
    let host_version = std::fs::read_to_string("/proc/version").unwrap();
    assert_ne!(out.lines().next(), host_version.lines().next(), "not in gVisor: {r}");
    assert_eq!(out.matches(GREETING).count(), 3, "{r}");
    assert!(out.ends_with("403"), "{r}");
    assert_eq!(
        (&r["network"]["connections"], &r["network"]["refused"]),
        (&json!(4), &json!(1)),
        "{r}"
    );
    let seen = up.seen();
    for path in ["/g1", "/g2", "/g3"] {
        assert!(seen.iter().any(|h| h.starts_with(&format!("GET {path} "))), "{seen:?}");
    }
    // A programmatic session in that tier too.
    let py =
        format!("import urllib.request\nprint(urllib.request.urlopen('http://{host}/p', timeout=20).read().decode())");
    let (status, v) = s.post(
        "/v1/exec/programmatic",
        &json!({"code": py, "network": {}, "isolation": "gvisor", "tools": [], "timeout": 60000}),
    );
    assert_eq!((status, v["status"].as_str()), (200, Some("completed")), "{v}");
    assert_eq!(v["stdout"], format!("{GREETING}\n"), "{v}");
    s.assert_healthy();
}
