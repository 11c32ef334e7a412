//! A run's network (docs/egress.md), as the engine sees it: whether a request may have
//! the hosts it asks for (`EgressPolicy::grant`), and the run's endpoint on the host
//! (`Endpoint`): a unix socket `<data_dir>/egress/<run>.sock` whose connections the
//! run's proxy serves. The sandbox helper relays the program's connections to
//! 127.0.0.1:3128 inside the sandbox to this socket (`sandcall_sandbox::protocol::Egress`).
//!
//! The proxy itself (policy syntax, address checks, CONNECT and plain HTTP, bounds) is
//! `sandcall-egress`, which speaks HTTP with hyper; the engine never imports hyper, so
//! it sees the proxy only through the two traits here, which the server implements.

use crate::error::EngineError;
use sandcall_api::{NetworkRequest, NetworkSummary};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

/// The port the program's proxy listens on, on the sandbox's loopback.
pub const PROXY_PORT: u16 = 3128;

/// The proxy as the engine uses it: the server's policy, narrowed per principal.
pub trait EgressPolicy: Send + Sync {
    /// `principal`'s run asking for `requested` (None: everything its policy allows).
    /// Err: the message for the caller, naming the host that is not allowed.
    fn grant(&self, principal: &str, requested: Option<&[String]>) -> Result<Arc<dyn RunEgress>, String>;
}

/// One run's proxy: every connection of the run is served by the same one, which
/// counts and bounds them together.
pub trait RunEgress: Send + Sync {
    /// Serves one connection relayed from the sandbox, until it ends.
    fn serve(self: Arc<Self>, conn: tokio::net::UnixStream) -> Pin<Box<dyn Future<Output = ()> + Send>>;
    /// Once the run is over: ends whatever of it is still connected, waits for its
    /// connections to be done, logs them (host, port, address, bytes, outcome) and
    /// gives the counts.
    fn finish(self: Arc<Self>, run_id: String) -> Pin<Box<dyn Future<Output = NetworkSummary> + Send>>;
    /// The `[sandbox]` reason when a bound ended or refused the run's traffic.
    fn limit_reason(&self) -> Option<&'static str>;
    /// The run's connections so far, in the order the program asked for them (a
    /// connection still open has its bytes so far, and no `closed_at`), and how many were
    /// not recorded: for a programmatic session's audit trail.
    fn connections(&self) -> (Vec<sandcall_api::AuditConnection>, u64) {
        (Vec::new(), 0)
    }
    /// The program's environment for the run's secrets: each secret's variable holding
    /// its placeholder (never a value).
    fn program_env(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// The trust bundle (PEM) the program verifies TLS with, when the run has secrets:
    /// the distribution's roots and the CA of the proxy that intercepts their hosts.
    fn trust_bundle(&self) -> Option<String> {
        None
    }
}

/// A connection record's time, `ms` since the epoch, in the form the audit trail gives
/// its times (RFC 3339, ms, UTC): `AuditConnection::opened_at` and `closed_at`.
pub fn record_time(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(at).to_string()
}

/// What the engine holds of egress: the policy and the directory of the runs' sockets.
#[derive(Clone)]
pub struct Egress {
    pub policy: Arc<dyn EgressPolicy>,
    pub dir: PathBuf,
}

/// The request's `network`, checked against the caller's policy before the run takes a
/// slot. Without `network` the run has none.
pub fn grant(
    egress: Option<&Egress>,
    principal: &str,
    network: Option<&NetworkRequest>,
) -> Result<Option<Arc<dyn RunEgress>>, EngineError> {
    let Some(network) = network else { return Ok(None) };
    let refused = EngineError::bad_request;
    let Some(egress) = egress else {
        return Err(refused(
            "`network`: this server gives runs no network (no `egress_allow`)".into(),
        ));
    };
    if let Some(allow) = &network.allow {
        if allow.is_empty() {
            return Err(refused(
                "`network.allow` is empty: leave `network` out for no network".into(),
            ));
        }
        if allow.len() > 256 {
            return Err(refused("`network.allow` names more than 256 hosts".into()));
        }
    }
    egress
        .policy
        .grant(principal, network.allow.as_deref())
        .map(Some)
        .map_err(|message| refused(format!("`network`: {message}")))
}

/// The environment that points a program's HTTP clients at the proxy.
pub fn proxy_env() -> Vec<(String, String)> {
    let proxy = format!("http://127.0.0.1:{PROXY_PORT}");
    let mut env = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        env.push((name.to_owned(), proxy.clone()));
    }
    for name in ["NO_PROXY", "no_proxy"] {
        env.push((name.to_owned(), "localhost,127.0.0.1".to_owned()));
    }
    env
}

/// Where the trust bundle of a run with secrets is, in the sandbox (not /tmp: the sandbox
/// mounts its own there).
const TRUST_BUNDLE_FILE: &str = "egress-ca-bundle.pem";

/// A run with secrets: their placeholders in the environment, and the trust bundle that
/// holds the proxy's CA, named by the variables OpenSSL, Python `requests`, curl and
/// Node read.
fn secrets(spec: &mut crate::run::RunSpec, run: &dyn RunEgress) {
    spec.env.extend(run.program_env());
    if let Some(bundle) = run.trust_bundle() {
        spec.support_files.push((TRUST_BUNDLE_FILE.to_owned(), bundle));
        let path = format!("{}/{TRUST_BUNDLE_FILE}", crate::runtime::CODE_DIR);
        for name in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "NODE_EXTRA_CA_CERTS",
        ] {
            spec.env.push((name.to_owned(), path.clone()));
        }
    }
}

/// The preload that puts Node's fetch behind the proxy (`runtime/egress_proxy.cjs`).
const NODE_PRELOAD: &str = include_str!("runtime/egress_proxy.cjs");
const NODE_PRELOAD_FILE: &str = "egress_proxy.cjs";

/// What a JavaScript or TypeScript run with network needs besides the environment: the
/// preload and the option that loads it.
fn node_preload(spec: &mut crate::run::RunSpec) {
    spec.support_files
        .push((NODE_PRELOAD_FILE.to_owned(), NODE_PRELOAD.to_owned()));
    spec.env.push((
        "NODE_OPTIONS".to_owned(),
        format!("--require={}/{NODE_PRELOAD_FILE}", crate::runtime::CODE_DIR),
    ));
}

/// The way out of a run `granted` network (`grant`), for `/v1/exec` and programmatic
/// sessions alike: its socket `run_id`, served until the endpoint is dropped, and `spec`
/// built for it (`prepare_run`). None for a run without network.
pub fn open_for(
    egress: Option<&Egress>,
    granted: Option<Arc<dyn RunEgress>>,
    run_id: &str,
    spec: &mut crate::run::RunSpec,
    language: sandcall_api::Language,
) -> Result<Option<Endpoint>, EngineError> {
    let (Some(run), Some(egress)) = (granted, egress) else {
        return Ok(None);
    };
    let endpoint = Endpoint::open(&egress.dir, run_id, run).map_err(|e| {
        EngineError::internal(
            sandcall_api::error_type::SANDBOX_FAILURE,
            &format!("egress socket: {e}"),
        )
    })?;
    prepare_run(spec, &endpoint, language);
    Ok(Some(endpoint))
}

/// Builds `spec` for a run with network served by `endpoint`: the helper's relay, the
/// environment naming the proxy, the secrets' placeholders and trust bundle, and Node's
/// preload.
fn prepare_run(spec: &mut crate::run::RunSpec, endpoint: &Endpoint, language: sandcall_api::Language) {
    spec.egress = Some(endpoint.message());
    spec.env.extend(proxy_env());
    secrets(spec, endpoint.run.as_ref());
    if matches!(
        language,
        sandcall_api::Language::JavaScript | sandcall_api::Language::TypeScript
    ) {
        node_preload(spec);
    }
}

/// A run's socket on the host, served while the run lasts. Dropping it stops taking
/// connections and removes the socket (connections in flight end with the sandbox).
pub struct Endpoint {
    path: PathBuf,
    accept: tokio::task::JoinHandle<()>,
    pub run: Arc<dyn RunEgress>,
}

impl Endpoint {
    pub fn open(dir: &Path, run_id: &str, run: Arc<dyn RunEgress>) -> std::io::Result<Endpoint> {
        let path = dir.join(format!("{run_id}.sock"));
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path)?;
        let serving = run.clone();
        let accept = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((conn, _)) => {
                        tokio::spawn(serving.clone().serve(conn));
                    }
                    Err(e) => {
                        tracing::warn!("egress: accepting a relayed connection: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                }
            }
        });
        Ok(Endpoint { path, accept, run })
    }

    /// What the helper is told: where to relay, and where to listen.
    pub fn message(&self) -> sandcall_sandbox::protocol::Egress {
        sandcall_sandbox::protocol::Egress {
            socket: self.path.clone(),
            port: PROXY_PORT,
            channel: None,
        }
    }

    /// The run is over: its summary (counted in `/metrics`, logged) and the `[sandbox]`
    /// line for its stderr, if a bound cut it.
    pub async fn finish(self, run_id: &str) -> (NetworkSummary, Option<String>) {
        let run = self.run.clone();
        // No more connections: the socket goes first.
        drop(self);
        let summary = run.clone().finish(run_id.to_owned()).await;
        crate::telemetry::egress(&summary);
        let note = run.limit_reason().map(|r| format!("[sandbox] {r}"));
        (summary, note)
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.accept.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Makes the directory of the runs' sockets, empty (a previous server's sockets are
/// stale), mode 0700: only the server (and its helpers) may connect.
pub fn prepare_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}
