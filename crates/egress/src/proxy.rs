//! The proxy protocol: one client connection of a run, spoken as HTTP/1.1 by hyper.
//! `CONNECT host:port` opens a tunnel; an absolute-form `http://` request is forwarded in
//! origin form on a connection of its own. Each upstream connection is checked (policy,
//! bounds, every resolved address) before it is opened, to the address that was checked.
//!
//! This module knows no configuration, engine or sandbox: the caller accepts connections
//! and hands each to `RunEgress::serve`.

use crate::address::refused_kind;
use crate::host::Host;
use crate::http::{program_side, strip_hop_by_hop, text, upstream_error};
use crate::meter::{ConnCounts, Metered, BYTES_LIMIT};
use crate::policy::HostCheck;
use crate::run::{now_ms, OpenRecord, Outcome, Record, RunEgress, Serving, CONNECTION_LIMIT};
use crate::secrets::{Interceptor, Secret};
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

/// How long connecting to one upstream address may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most resolved addresses considered for one name.
const MAX_ADDRESSES: usize = 16;

type Body = Either<Incoming, Full<Bytes>>;

/// What the requests of one client connection share.
struct ClientConn {
    run: Arc<RunEgress>,
    /// Tunnels and upstream connections. An async lock: the connection's end awaits the
    /// set while holding it (no request can spawn more by then).
    tasks: tokio::sync::Mutex<JoinSet<()>>,
    timed_out: Arc<AtomicBool>,
}

impl ClientConn {
    async fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.lock().await.spawn(task);
    }
}

impl RunEgress {
    /// Serves one client connection speaking the HTTP/1.1 proxy protocol; returns when it
    /// ends, when `max_connection_seconds` have passed, or when the run is closed.
    pub async fn serve<S>(self: &Arc<Self>, client: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        // Declared first, dropped last: the call counts until its tunnels have ended.
        let _serving = Serving::begin(self);
        let Ok(_permit) = self.clients.clone().try_acquire_owned() else {
            tracing::debug!("egress: too many open connections to the proxy; closing one");
            return;
        };
        let conn = Arc::new(ClientConn {
            run: self.clone(),
            tasks: tokio::sync::Mutex::new(JoinSet::new()),
            timed_out: Arc::new(AtomicBool::new(false)),
        });
        let limit = Duration::from_secs(u64::from(self.grant.limits.max_connection_seconds));
        let mut serving = Box::pin(serve_client(conn.clone(), client));
        tokio::select! {
            _ = &mut serving => return,
            _ = tokio::time::sleep(limit) => {
                // Set before the tunnels are ended, so that their records say why.
                conn.timed_out.store(true, Ordering::Relaxed);
                tracing::debug!("egress: a connection reached its time limit");
            }
            _ = self.closed.cancelled() => {}
        }
        // Ends the client connection (and releases the tasks' lock), then its tunnels and
        // upstream connections, waiting for them: their records are complete on return.
        drop(serving);
        conn.tasks.lock().await.shutdown().await;
    }
}

async fn serve_client<S>(conn: Arc<ClientConn>, client: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = {
        let conn = conn.clone();
        hyper::service::service_fn(move |req| {
            let conn = conn.clone();
            async move { Ok::<_, Infallible>(handle(&conn, req).await) }
        })
    };
    if let Err(e) = program_side()
        .serve_connection(TokioIo::new(client), service)
        .with_upgrades()
        .await
    {
        tracing::debug!(error = %e, "egress: client connection ended with an error");
    }
    let mut tasks = conn.tasks.lock().await;
    while tasks.join_next().await.is_some() {}
}

async fn handle(conn: &Arc<ClientConn>, mut req: Request<Incoming>) -> Response<Body> {
    if req.method() == Method::CONNECT {
        let Some((host, port)) = req
            .uri()
            .authority()
            .and_then(|a| Some((a.host().to_string(), a.port_u16()?)))
        else {
            return text(StatusCode::BAD_REQUEST, "CONNECT needs a target of the form host:port");
        };
        let upstream = match open(conn, &host, port).await {
            Ok(upstream) => upstream,
            Err(response) => return *response,
        };
        let on_upgrade = hyper::upgrade::on(&mut req);
        match intercepting(&conn.run, &host) {
            // A host with a secret: TLS ends here, requests are relayed one by one.
            Some((tls, name, secrets)) => {
                conn.spawn(async move {
                    if let Ok(upgraded) = on_upgrade.await {
                        crate::intercept::intercept(upgraded, upstream, name, secrets, tls).await;
                    }
                })
                .await;
            }
            None => {
                conn.spawn(async move {
                    let (mut upstream, _record) = upstream;
                    if let Ok(upgraded) = on_upgrade.await {
                        let mut client = TokioIo::new(upgraded);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                })
                .await;
            }
        }
        let mut established = Response::new(Either::Right(Full::new(Bytes::new())));
        established
            .extensions_mut()
            .insert(hyper::ext::ReasonPhrase::from_static(b"Connection established"));
        return established;
    }
    let uri = req.uri();
    let target = match (uri.scheme_str(), uri.authority()) {
        (Some("http"), Some(authority)) => (authority.host().to_string(), authority.port_u16().unwrap_or(80)),
        (Some(_), Some(_)) => {
            return text(
                StatusCode::BAD_REQUEST,
                "only http:// requests are forwarded; use CONNECT for https",
            )
        }
        _ => {
            return text(
                StatusCode::BAD_REQUEST,
                "this is a proxy: send CONNECT host:port or an absolute http:// request",
            )
        }
    };
    match open(conn, &target.0, target.1).await {
        Ok(upstream) => forward(conn, req, upstream).await,
        Err(response) => *response,
    }
}

/// The interception of a `CONNECT` to `host`, if the run has secrets for it (and the
/// server set interception up): the interceptor, the host's name and its secrets.
fn intercepting(run: &RunEgress, host: &str) -> Option<(Arc<Interceptor>, String, Vec<Secret>)> {
    let tls = run.tls.clone()?;
    let Some(Host::Name(name)) = Host::parse(host) else {
        return None;
    };
    let secrets: Vec<Secret> = run.grant.secrets.iter().filter(|s| s.host == name).cloned().collect();
    (!secrets.is_empty()).then_some((tls, name, secrets))
}

/// Forwards one plain-HTTP request on a new upstream connection, in origin form, without
/// the hop-by-hop and `Proxy-*` headers; the response streams back the same way.
async fn forward(conn: &Arc<ClientConn>, req: Request<Incoming>, upstream: (Metered, OpenRecord)) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    // The target's host replaces any Host header (RFC 9112, 3.2.2): the upstream serves
    // the name that was checked, and userinfo in the target goes nowhere.
    let host = match parts.uri.authority() {
        Some(a) if a.port().is_some() => format!("{}:{}", a.host(), a.port_u16().unwrap_or(80)),
        Some(a) => a.host().to_string(),
        None => String::new(),
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = match path.parse::<Uri>() {
        Ok(uri) => uri,
        Err(_) => return text(StatusCode::BAD_REQUEST, "the request target has no valid path"),
    };
    parts.version = http::Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    match HeaderValue::from_str(&host) {
        Ok(value) => {
            parts.headers.insert(header::HOST, value);
        }
        Err(_) => return text(StatusCode::BAD_REQUEST, "the request target has no valid host"),
    }
    let (metered, record) = upstream;
    let counts = record.counts.clone();
    let (mut sender, connection) = match hyper::client::conn::http1::handshake(TokioIo::new(metered)).await {
        Ok(pair) => pair,
        Err(e) => return upstream_error(&counts, &e),
    };
    conn.spawn(async move {
        let _record = record;
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "egress: upstream connection ended with an error");
        }
    })
    .await;
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, Either::Left(body))
        }
        Err(e) => upstream_error(&counts, &e),
    }
}

/// What the program asked the proxy for: the host as records name it, the port, and when
/// (ms since the epoch).
#[derive(Clone, Copy)]
struct Attempt<'a> {
    host: &'a str,
    port: u16,
    asked: u64,
}

/// An attempt that ends before a connection: its record and the answer.
fn refuse(
    conn: &ClientConn,
    attempt: &Attempt<'_>,
    address: Option<IpAddr>,
    outcome: Outcome,
    status: StatusCode,
    reason: String,
) -> Box<Response<Body>> {
    let Attempt { host, port, asked } = *attempt;
    tracing::debug!(host, port, ?address, ?outcome, %reason, "egress: attempt refused");
    let response = text(status, &reason);
    let record = Record {
        host: host.to_string(),
        port,
        address,
        bytes_out: 0,
        bytes_in: 0,
        outcome,
        reason: Some(reason),
        opened_at_ms: asked,
        closed_at_ms: Some(now_ms()),
    };
    conn.run.record(record);
    Box::new(response)
}

/// Checks an attempt (policy, bounds, every address the name resolves to) and connects to
/// a checked address. The record of a connection that opens is completed as it closes.
async fn open(conn: &Arc<ClientConn>, raw_host: &str, port: u16) -> Result<(Metered, OpenRecord), Box<Response<Body>>> {
    let run = &conn.run;
    let asked = now_ms();
    // Records name the host as rules do (lower case, no trailing dot) where it parses.
    let parsed = Host::parse(raw_host);
    let shown: String = match &parsed {
        Some(host) => host.to_string(),
        None => raw_host.chars().take(256).collect(),
    };
    let attempt = Attempt {
        host: &shown,
        port,
        asked,
    };
    let forbidden =
        |address, outcome, reason| Err(refuse(conn, &attempt, address, outcome, StatusCode::FORBIDDEN, reason));
    let Some(host) = parsed else {
        return forbidden(None, Outcome::Refused, format!("{shown} is not a valid host name"));
    };
    match run.grant.check(&host, port) {
        HostCheck::Allowed => {}
        HostCheck::HostNotAllowed => {
            return forbidden(
                None,
                Outcome::Refused,
                format!("{host} is not in this run's network policy"),
            );
        }
        HostCheck::PortNotAllowed => {
            return forbidden(
                None,
                Outcome::Refused,
                format!("port {port} of {host} is not in this run's network policy"),
            );
        }
    }
    if run.out.spent() || run.inb.spent() {
        return forbidden(None, Outcome::Limited, BYTES_LIMIT.to_string());
    }
    let max = run.grant.limits.max_connections;
    if run
        .opened
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < max).then_some(n + 1))
        .is_err()
    {
        return forbidden(None, Outcome::Limited, CONNECTION_LIMIT.to_string());
    }
    let addresses = match resolve(run, &host, port).await {
        Ok(addresses) => addresses,
        Err(reason) => {
            return Err(refuse(
                conn,
                &attempt,
                None,
                Outcome::Failed,
                StatusCode::BAD_GATEWAY,
                reason,
            ))
        }
    };
    for addr in &addresses {
        let ip = addr.ip();
        if let Some(kind) = refused_kind(ip).filter(|_| !run.grant.address_named(ip)) {
            let reason = match host {
                Host::Address(_) => format!("{host} is {kind}, which egress refuses"),
                Host::Name(_) => format!("{host} resolves to {kind} ({ip}), which egress refuses"),
            };
            return forbidden(Some(ip), Outcome::Refused, reason);
        }
    }
    let Some((stream, addr)) = connect(&addresses).await else {
        let reason = format!("could not connect to {host} port {port}");
        let address = addresses.first().map(SocketAddr::ip);
        return Err(refuse(
            conn,
            &attempt,
            address,
            Outcome::Failed,
            StatusCode::BAD_GATEWAY,
            reason,
        ));
    };
    let counts = Arc::new(ConnCounts::default());
    let record = Record {
        host: host.to_string(),
        port,
        address: Some(addr.ip()),
        bytes_out: 0,
        bytes_in: 0,
        outcome: Outcome::Relayed,
        reason: None,
        opened_at_ms: asked,
        closed_at_ms: None,
    };
    let metered = Metered {
        inner: stream,
        out: run.out.clone(),
        inb: run.inb.clone(),
        counts: counts.clone(),
    };
    let open = run.record_open(record, counts, conn.timed_out.clone());
    Ok((metered, open))
}

/// The addresses to connect to: a literal one, or what the host's resolver answers.
async fn resolve(run: &RunEgress, host: &Host, port: u16) -> Result<Vec<SocketAddr>, String> {
    let name = match host {
        Host::Address(addr) => return Ok(vec![SocketAddr::new(*addr, port)]),
        Host::Name(name) => name,
    };
    let lookup = tokio::net::lookup_host((name.as_str(), port));
    match tokio::time::timeout(run.resolver.timeout, lookup).await {
        Ok(Ok(found)) => {
            let addresses: Vec<SocketAddr> = found.take(MAX_ADDRESSES).collect();
            if addresses.is_empty() {
                Err(format!("{name} has no address"))
            } else {
                Ok(addresses)
            }
        }
        Ok(Err(e)) => {
            tracing::debug!(name, error = %e, "egress: resolving failed");
            Err(format!("{name} could not be resolved"))
        }
        Err(_) => Err(format!("resolving {name} took too long")),
    }
}

/// Connects to the first of the (checked) addresses that answers.
async fn connect(addresses: &[SocketAddr]) -> Option<(TcpStream, SocketAddr)> {
    for addr in addresses {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Some((stream, *addr)),
            Ok(Err(e)) => tracing::debug!(%addr, error = %e, "egress: connecting failed"),
            Err(_) => tracing::debug!(%addr, "egress: connecting took too long"),
        }
    }
    None
}
