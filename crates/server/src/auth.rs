//! The `authenticate` middleware: every route runs behind it. It resolves the caller's
//! `Principal` through `sandcall_auth::Auth` (or answers 401), and in local mode first
//! refuses what only a web page would send.

use crate::error::ApiError;
use crate::listen::LocalAddr;
use crate::AppState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sandcall_api::error_type;
use sandcall_auth::Operator;
use std::net::SocketAddr;

/// Middleware: resolves the principal, or answers 401. In local mode it first refuses
/// what only a web page would send (`local_request_refusal`). `GET /v1/health` without
/// credentials passes with no principal (load balancers and probes have no key); with
/// credentials that are not valid it is 401 like every other route.
///
/// `/metrics` is the operator's alone (`Auth::operator`): no principal opens it. On
/// `/v1/health` the operator's `metrics_token` stands in for a principal and gets the
/// server-wide figures.
pub async fn authenticate(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    if state.auth.local_mode() {
        if let Some(refusal) = local_request_refusal(&req, state.auth.loopback_hosts_only()) {
            return refusal.into_response();
        }
    }
    if let Some(pass) = req.headers().get(crate::cluster::FORWARDED_HEADER) {
        return match forwarded_principal(&state, pass, &req) {
            Ok(principal) => {
                req.extensions_mut().insert(principal);
                next.run(req).await
            }
            Err(e) => unauthorized(e),
        };
    }
    if req.uri().path() == "/metrics" {
        return match state.auth.operator(req.headers()) {
            Ok(operator) => {
                req.extensions_mut().insert(operator);
                next.run(req).await
            }
            Err(e) => unauthorized(e),
        };
    }
    if is_health(&req) {
        if let Ok(operator @ Operator::Token) = state.auth.operator(req.headers()) {
            req.extensions_mut().insert(operator);
            return next.run(req).await;
        }
        if !state.auth.local_mode() && !has_credentials(req.headers()) {
            return next.run(req).await;
        }
    }
    match state.auth.principal(req.headers()) {
        Ok(principal) => {
            req.extensions_mut().insert(principal);
            next.run(req).await
        }
        Err(e) => unauthorized(e),
    }
}

/// A request forwarded by another node of the cluster: the principal that node
/// authenticated, from the pass it carries instead of the caller's credentials. Any
/// credentials it also carries are ignored; a node that is not in a cluster takes none.
fn forwarded_principal(
    state: &AppState,
    pass: &axum::http::HeaderValue,
    req: &Request,
) -> Result<sandcall_auth::Principal, sandcall_auth::AuthError> {
    let refused = |m: String| sandcall_auth::AuthError::Unauthorized(m);
    let Some(cluster) = &state.cluster else {
        return Err(refused(
            "forwarded requests are taken only from the nodes of a cluster".into(),
        ));
    };
    let pass = pass
        .to_str()
        .map_err(|_| refused("the forward's pass is malformed".into()))?;
    cluster
        .accept(pass, req.method().as_str(), req.uri().path())
        .map(sandcall_auth::Principal)
        .map_err(|e| {
            tracing::warn!(error = %e, path = %req.uri().path(), "a forwarded request was refused");
            refused(e.to_string())
        })
}

/// 401 with `WWW-Authenticate: Bearer`.
fn unauthorized(e: sandcall_auth::AuthError) -> Response {
    let mut response = ApiError::from(e).into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
    response
}

fn is_health(req: &Request) -> bool {
    req.uri().path() == "/v1/health" && matches!(*req.method(), Method::GET | Method::HEAD)
}

/// Any key header at all, valid or not.
fn has_credentials(headers: &HeaderMap) -> bool {
    headers.contains_key(header::AUTHORIZATION) || headers.contains_key("x-api-key")
}

/// Local mode has no key, so any web page the local user opens could otherwise call it:
/// with `fetch` from its own origin (the browser sends `Origin`), or after rebinding its
/// own host name to 127.0.0.1 (the browser sends that name as `Host`). Both are refused
/// here, before any handler runs; `JsonBody` refuses a body that does not say it is JSON.
fn local_request_refusal(req: &Request, loopback_hosts_only: bool) -> Option<ApiError> {
    // The authority of an absolute-form request target stands in for `Host`.
    let hosts = req.uri().authority().map(|a| a.as_str().to_owned()).into_iter().chain(
        req.headers()
            .get_all(header::HOST)
            .iter()
            .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned()),
    );
    for host in hosts.filter(|_| loopback_hosts_only) {
        if !is_loopback_host(&host) {
            return Some(ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                error_type::MISDIRECTED_REQUEST,
                "in local mode only requests to localhost, 127.0.0.0/8 or [::1] are served",
            ));
        }
    }
    let local = req.extensions().get::<LocalAddr>().map(|a| a.0);
    for origin in req.headers().get_all(header::ORIGIN) {
        if !local.is_some_and(|local| is_own_origin(origin.as_bytes(), local)) {
            return Some(ApiError::new(
                StatusCode::FORBIDDEN,
                error_type::FORBIDDEN_ORIGIN,
                "in local mode requests from web pages of other origins are refused",
            ));
        }
    }
    None
}

/// `Host` names this machine's loopback: `localhost`, an IPv4 literal in 127.0.0.0/8 or
/// `[::1]`, with or without a port. Subdomains of `localhost` are refused: nothing needs
/// them, and a resolver that sends them on to DNS would let a rebinding name through.
fn is_loopback_host(host: &str) -> bool {
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((ip, port)) => {
                return ip.parse::<std::net::Ipv6Addr>().is_ok_and(|ip| ip.is_loopback()) && is_port_suffix(port)
            }
            None => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        },
    };
    if let Some(port) = port {
        if port.is_empty() || port.parse::<u16>().is_err() {
            return false;
        }
    }
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// Empty, or `:` and a port number.
fn is_port_suffix(rest: &str) -> bool {
    rest.is_empty() || rest.strip_prefix(':').is_some_and(|p| p.parse::<u16>().is_ok())
}

/// `Origin` is the server's own: `http://` and 127.0.0.1, localhost, [::1] or the address
/// it was reached on, with its real port (browsers leave port 80 out).
fn is_own_origin(origin: &[u8], local: SocketAddr) -> bool {
    let Ok(origin) = std::str::from_utf8(origin) else {
        return false;
    };
    let port = local.port();
    let mut hosts = vec!["127.0.0.1".to_owned(), "localhost".to_owned(), "[::1]".to_owned()];
    hosts.push(match local.ip() {
        std::net::IpAddr::V4(ip) => ip.to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
    });
    hosts.iter().any(|host| {
        origin.eq_ignore_ascii_case(&format!("http://{host}:{port}"))
            || (port == 80 && origin.eq_ignore_ascii_case(&format!("http://{host}")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for host in [
            "localhost",
            "LocalHost:3112",
            "127.0.0.1",
            "127.0.0.1:80",
            "127.8.9.10:65535",
            "[::1]",
            "[::1]:3112",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:3112",
            "localhost.evil.example",
            "a.localhost",
            "localhost.",
            "127.1",
            "0x7f.0.0.1",
            "128.0.0.1",
            "0.0.0.0",
            "10.0.0.1:3112",
            "[::2]",
            "[::ffff:127.0.0.1]",
            "[::1]x",
            "[::1]:",
            "localhost:",
            "localhost:99999",
            "localhost:80:80",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn own_origins() {
        let local: SocketAddr = "127.0.0.1:3112".parse().unwrap();
        for origin in ["http://127.0.0.1:3112", "http://localhost:3112", "http://[::1]:3112"] {
            assert!(is_own_origin(origin.as_bytes(), local), "{origin}");
        }
        for origin in [
            "http://127.0.0.1:3113",
            "http://127.0.0.1",
            "https://127.0.0.1:3112",
            "http://evil.example:3112",
            "http://localhost:3112.evil.example",
            "null",
            "",
        ] {
            assert!(!is_own_origin(origin.as_bytes(), local), "{origin}");
        }
        let other: SocketAddr = "127.0.0.2:80".parse().unwrap();
        assert!(is_own_origin(b"http://127.0.0.2", other));
        assert!(is_own_origin(b"http://localhost:80", other));
    }
}
