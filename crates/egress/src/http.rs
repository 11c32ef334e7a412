//! What the proxy and the interception of a secret's host answer alike: the program's
//! one-line refusals, an upstream's failure, and the headers that belong to one hop.

use crate::meter::{ConnCounts, BYTES_LIMIT};
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper_util::rt::TokioTimer;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The largest request head a program may send (hyper answers 431 past it).
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a program may take to send a request head (and stay idle between requests).
const HEAD_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP/1.1 server the program's connections are spoken to, to the proxy and to the
/// interception of a secret's host alike: request heads bounded in size and time.
pub(crate) fn program_side() -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .max_buf_size(MAX_HEAD_BYTES)
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_READ_TIMEOUT);
    builder
}

/// The answer to a request the upstream failed: the byte budget's refusal when that is
/// what cut it, else 502.
pub(crate) fn upstream_error<B>(counts: &ConnCounts, e: &hyper::Error) -> Response<Either<B, Full<Bytes>>> {
    if counts.cut.load(Ordering::Relaxed) {
        return text(StatusCode::FORBIDDEN, BYTES_LIMIT);
    }
    tracing::debug!(error = %e, "egress: upstream request failed");
    text(
        StatusCode::BAD_GATEWAY,
        "the upstream server closed the connection or sent an invalid response",
    )
}

/// Headers that belong to one hop: those `Connection` names, the standard ones, and every
/// `Proxy-*` header (a proxy's credentials are not the upstream's business).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
        .collect();
    for name in named {
        headers.remove(name.as_str());
    }
    for name in [
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ] {
        headers.remove(name);
    }
    let proxy: Vec<_> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("proxy-"))
        .cloned()
        .collect();
    for name in proxy {
        headers.remove(name);
    }
}

/// A one-line answer the program sees.
pub(crate) fn text<B>(status: StatusCode, message: &str) -> Response<Either<B, Full<Bytes>>> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(format!(
        "sandcall egress: {message}\n"
    )))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if status == StatusCode::BAD_REQUEST {
        // A client that speaks something else gets nothing more on this connection.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}
