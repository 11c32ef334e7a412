//! Secrets over real TLS on loopback: a client that trusts sandcall's CA speaks through
//! the proxy to TLS upstreams whose certificates a test CA (made here with rcgen, passed as
//! an extra root) signs. The upstreams echo what they receive, in headers and body.

mod common;

use bytes::Bytes;
use common::start_proxy;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use sandcall_egress::{
    Ca, HostRule, Interceptor, IpNet, Limits, Outcome, Policy, Resolver, RunEgress, Secret, SecretValue,
};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const VALUE: &str = "sk-live-0123456789-the-real-secret";
const PLACEHOLDER: &str = "SANDCALL-PLACEHOLDER-API-KEY";
const ROOMY: Limits = Limits {
    max_connections: 100,
    max_bytes_out: 1 << 20,
    max_bytes_in: 1 << 20,
    max_connection_seconds: 30,
};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A directory of this test's own (not /tmp: shared with nothing, kept for a look).
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("egress-secrets-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A CA of the test's, standing for a public CA that upstream servers have certificates of.
struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn test_ca(name: &str) -> TestCa {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    TestCa {
        issuer: Issuer::new(params, key),
        pem: cert.pem(),
    }
}

/// An upstream serving TLS for "localhost" and 127.0.0.1 with a certificate `ca` signs;
/// it answers each request with the headers it received (as `x-echo-*` headers and as the
/// body) and reports them.
async fn echo_upstream(ca: &TestCa) -> (u16, mpsc::UnboundedReceiver<http::HeaderMap>) {
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params
        .subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else { return };
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let tx = tx.clone();
                    async move { Ok::<_, Infallible>(echo(req, &tx)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (port, rx)
}

fn echo(req: Request<Incoming>, tx: &mpsc::UnboundedSender<http::HeaderMap>) -> Response<Full<Bytes>> {
    let _ = tx.send(req.headers().clone());
    let mut body = String::new();
    let mut response = Response::builder();
    for (name, value) in req.headers() {
        let value = value.to_str().unwrap_or("?");
        body.push_str(&format!("{name}: {value}\n"));
        response = response.header(format!("x-echo-{name}"), value);
    }
    // Long enough to be sent in more than one chunk of the body; then the value (as an
    // upstream could say it) that the proxy is to scrub from what the program receives.
    body.push_str(&"padding ".repeat(4096));
    body.push_str(&format!("again: {VALUE}\n"));
    response.body(Full::new(Bytes::from(body))).unwrap()
}

fn secret() -> Secret {
    Secret::new(
        "localhost",
        "authorization",
        PLACEHOLDER,
        SecretValue::new(VALUE.into()),
    )
    .unwrap()
}

/// A run allowing `rules` (loopback named explicitly, as a test configuration would),
/// with the secret for localhost and interception by a CA kept in `dir`.
fn run_with_secret(rules: &[String], dir: &std::path::Path, extra_roots: &str) -> (Arc<RunEgress>, String) {
    let policy = Policy {
        rules: rules.iter().map(|r| HostRule::parse(r).unwrap()).collect(),
        allow_addresses: ["127.0.0.0/8", "::1/128"]
            .iter()
            .map(|a| a.parse::<IpNet>().unwrap())
            .collect(),
    };
    let mut grant = policy.grant(None, ROOMY).unwrap();
    grant.secrets = vec![secret()];
    let ca = Ca::load_or_create(dir, &["localhost".to_string()]).unwrap();
    let ca_pem = ca.cert_pem().to_string();
    let tls = Interceptor::new(ca, extra_roots.as_bytes()).unwrap();
    (
        RunEgress::with_interceptor(grant, Resolver::system(), Arc::new(tls)),
        ca_pem,
    )
}

/// CONNECTs through the proxy and checks it answers 200.
async fn connect(proxy: SocketAddr, target: &str) -> TcpStream {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(
            stream.read(&mut byte).await.unwrap(),
            1,
            "the proxy closed during CONNECT"
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    stream
}

/// TLS trusting only `roots_pem` over `stream`, then one GET with the placeholder in the
/// secret's header and in another; the answer's status, headers and body as text.
async fn get_through(stream: TcpStream, server: ServerName<'static>, roots_pem: &str) -> (StatusCode, String) {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(roots_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(server, stream)
        .await
        .expect("TLS through the proxy");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
    tokio::spawn(connection);
    let request = Request::get("/v1/things")
        .header("host", "localhost")
        .header("authorization", format!("Bearer {PLACEHOLDER}"))
        .header("x-also", PLACEHOLDER)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    let mut text = format!("{:?}\n", response.headers());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    text.push_str(&String::from_utf8_lossy(&body));
    (status, text)
}

#[tokio::test]
async fn the_secret_reaches_its_upstream_in_its_header_and_the_program_sees_only_the_placeholder() {
    let upstream_ca = test_ca("upstream test CA");
    let (port, mut seen) = echo_upstream(&upstream_ca).await;
    let dir = scratch("reach");
    let (run, ca_pem) = run_with_secret(&[format!("localhost:{port}")], &dir, &upstream_ca.pem);
    let proxy = start_proxy(&run).await;

    let stream = connect(proxy, &format!("localhost:{port}")).await;
    // The client trusts sandcall's CA only: the proxy terminated TLS.
    let (status, answer) = get_through(stream, ServerName::try_from("localhost").unwrap(), &ca_pem).await;
    assert_eq!(status, StatusCode::OK, "{answer}");

    let headers = seen.recv().await.unwrap();
    assert_eq!(headers["authorization"], format!("Bearer {VALUE}").as_str());
    // Only the secret's header carries it: the placeholder elsewhere is left as sent.
    assert_eq!(headers["x-also"], PLACEHOLDER);

    // The upstream echoed the value in headers and body; the program gets the placeholder.
    assert!(!answer.contains(VALUE), "the answer holds the secret:\n{answer}");
    assert!(
        answer.contains(&format!("authorization: Bearer {PLACEHOLDER}")),
        "{answer}"
    );
    assert!(answer.contains(&format!("again: {PLACEHOLDER}")), "{answer}");

    run.close_and_wait().await;
    let records = run.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].outcome, Outcome::Relayed, "{records:?}");
    assert!(records[0].bytes_out > 0 && records[0].bytes_in > 0, "{records:?}");
    let shown = format!(
        "{records:?} {} {:?}",
        serde_json::to_string(&records).unwrap(),
        run.grant()
    );
    assert!(!shown.contains(VALUE), "{shown}");
}

#[tokio::test]
async fn an_upstream_whose_certificate_does_not_verify_gets_502_and_a_failed_record() {
    // The upstream's CA is not among the roots the interceptor trusts (another test CA is).
    let (port, mut seen) = echo_upstream(&test_ca("unknown CA")).await;
    let dir = scratch("unverified");
    let (run, ca_pem) = run_with_secret(&[format!("localhost:{port}")], &dir, &test_ca("trusted CA").pem);
    let proxy = start_proxy(&run).await;

    let stream = connect(proxy, &format!("localhost:{port}")).await;
    let (status, answer) = get_through(stream, ServerName::try_from("localhost").unwrap(), &ca_pem).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{answer}");
    assert!(
        answer.contains("sandcall egress: TLS with localhost failed"),
        "{answer}"
    );
    assert!(seen.try_recv().is_err(), "the upstream got a request");

    run.close_and_wait().await;
    let records = run.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].outcome, Outcome::Failed, "{records:?}");
    let reason = records[0].reason.as_deref().unwrap_or("");
    assert!(reason.contains("TLS with localhost failed"), "{reason}");
    assert_eq!(run.summary().failed, 1);
}

#[tokio::test]
async fn the_placeholder_sent_to_another_allowed_host_arrives_unreplaced() {
    let upstream_ca = test_ca("upstream test CA");
    let (port, mut seen) = echo_upstream(&upstream_ca).await;
    let dir = scratch("other");
    // 127.0.0.1 is allowed too, but has no secret: its CONNECT is an opaque tunnel, which
    // the client shows by verifying the upstream's own certificate through it.
    let rules = [format!("localhost:{port}"), format!("127.0.0.1:{port}")];
    let (run, _ca_pem) = run_with_secret(&rules, &dir, &upstream_ca.pem);
    let proxy = start_proxy(&run).await;

    let stream = connect(proxy, &format!("127.0.0.1:{port}")).await;
    let server = ServerName::IpAddress("127.0.0.1".parse::<std::net::IpAddr>().unwrap().into());
    let (status, answer) = get_through(stream, server, &upstream_ca.pem).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let headers = seen.recv().await.unwrap();
    assert_eq!(headers["authorization"], format!("Bearer {PLACEHOLDER}").as_str());
    assert!(
        answer.contains(&format!("authorization: Bearer {PLACEHOLDER}")),
        "{answer}"
    );
}

#[tokio::test]
async fn the_ca_is_kept_private_reused_and_constrained_to_the_secret_hosts() {
    let dir = scratch("ca");
    let hosts = ["api.example.com".to_string(), "localhost".to_string()];
    let first = Ca::load_or_create(&dir, &hosts).unwrap();
    for file in [sandcall_egress::CA_KEY_FILE, sandcall_egress::CA_CERT_FILE] {
        let mode = std::fs::metadata(dir.join(file)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{file}");
    }
    let key = std::fs::read_to_string(dir.join(sandcall_egress::CA_KEY_FILE)).unwrap();
    // Reused at the next start; remade (same key) when the secret hosts change.
    let again = Ca::load_or_create(&dir, &hosts).unwrap();
    assert_eq!(first.cert_pem(), again.cert_pem());
    let other = Ca::load_or_create(&dir, &hosts[..1]).unwrap();
    assert_ne!(first.cert_pem(), other.cert_pem());
    assert_eq!(
        key,
        std::fs::read_to_string(dir.join(sandcall_egress::CA_KEY_FILE)).unwrap()
    );
    assert!(!first.cert_pem().contains("PRIVATE KEY"));

    let der = CertificateDer::from_pem_slice(first.cert_pem().as_bytes()).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    assert!(cert.is_ca());
    let constraints = cert.name_constraints().unwrap().expect("name constraints").value;
    let permitted: Vec<String> = constraints
        .permitted_subtrees
        .as_ref()
        .unwrap()
        .iter()
        .map(|s| format!("{:?}", s.base))
        .collect();
    assert_eq!(permitted, ["DNSName(\"api.example.com\")", "DNSName(\"localhost\")"]);
    // No address at all, v4 or v6.
    assert_eq!(constraints.excluded_subtrees.as_ref().unwrap().len(), 2);
}
