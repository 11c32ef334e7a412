//! A `CONNECT` to a host that has a secret in the run's grant: the proxy answers it, then
//! speaks TLS to the program with a leaf of the per-server CA, TLS to the real upstream
//! (verified against the trust store), and relays HTTP/1.1 requests between them. In each
//! request the placeholder is replaced by the secret's value in the secret's header only;
//! in each response (headers, body, trailers) the value is replaced by the placeholder, so
//! that an upstream that echoes what it got does not hand the secret to the program.

use crate::http::{program_side, strip_hop_by_hop, text, upstream_error};
use crate::meter::Metered;
use crate::run::OpenRecord;
use crate::secrets::{Interceptor, Secret};
use aho_corasick::{AhoCorasick, MatchKind};
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::{Either, Full};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio_rustls::{TlsAcceptor, TlsConnector};

type Body = Either<Scrub, Full<Bytes>>;

/// How long a TLS handshake (either side) may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Finds secret values and gives their placeholders.
pub(crate) struct Matcher {
    values: AhoCorasick,
    placeholders: Vec<Bytes>,
    longest: usize,
}

impl Matcher {
    pub(crate) fn new(secrets: &[Secret]) -> Option<Matcher> {
        let values = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(secrets.iter().map(|s| s.value.expose()))
            .ok()?;
        Some(Matcher {
            values,
            placeholders: secrets.iter().map(|s| Bytes::from(s.placeholder.clone())).collect(),
            longest: secrets.iter().map(|s| s.value.expose().len()).max().unwrap_or(1),
        })
    }

    /// Scrubs `buf` into `out` as far as is certain: up to where a value could still
    /// begin and end in bytes not seen yet (everywhere, `at_end`). Returns how far.
    pub(crate) fn scrub(&self, buf: &[u8], at_end: bool, out: &mut Vec<u8>) -> usize {
        let limit = if at_end {
            buf.len()
        } else {
            buf.len().saturating_sub(self.longest - 1)
        };
        let mut pos = 0;
        for found in self.values.find_iter(buf) {
            if found.start() >= limit {
                break;
            }
            out.extend_from_slice(&buf[pos..found.start()]);
            out.extend_from_slice(&self.placeholders[found.pattern().as_usize()]);
            pos = found.end();
        }
        let safe = pos.max(limit);
        out.extend_from_slice(&buf[pos..safe]);
        safe
    }

    fn scrub_headers(&self, headers: &mut HeaderMap) {
        for value in headers.values_mut() {
            if self.values.is_match(value.as_bytes()) {
                let mut out = Vec::with_capacity(value.len());
                self.scrub(value.as_bytes(), true, &mut out);
                // Placeholders are visible ASCII: what was a header value still is one.
                if let Ok(scrubbed) = HeaderValue::from_bytes(&out) {
                    *value = scrubbed;
                }
            }
        }
    }
}

/// A response body with every secret value replaced by its placeholder, also where a
/// value is split between chunks (the bytes that could begin one are held back).
pub(crate) struct Scrub {
    inner: Incoming,
    matcher: Arc<Matcher>,
    carry: Vec<u8>,
    trailers: Option<HeaderMap>,
    ended: bool,
}

impl hyper::body::Body for Scrub {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        loop {
            if this.ended {
                if !this.carry.is_empty() {
                    let mut out = Vec::with_capacity(this.carry.len());
                    this.matcher.scrub(&this.carry, true, &mut out);
                    this.carry.clear();
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                }
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        this.carry.extend_from_slice(&data);
                        let mut out = Vec::with_capacity(this.carry.len());
                        let done = this.matcher.scrub(&this.carry, false, &mut out);
                        this.carry.drain(..done);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                        }
                    }
                    Err(frame) => {
                        if let Ok(mut trailers) = frame.into_trailers() {
                            this.matcher.scrub_headers(&mut trailers);
                            this.trailers = Some(trailers);
                        }
                    }
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => this.ended = true,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.carry.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Puts each secret's value in place of its placeholder, in that secret's header only.
/// Whether any was put.
fn substitute(headers: &mut HeaderMap, secrets: &[Secret]) -> bool {
    let mut put = false;
    for secret in secrets {
        let values: Vec<HeaderValue> = headers.get_all(&secret.header).iter().cloned().collect();
        if !values
            .iter()
            .any(|v| contains(v.as_bytes(), secret.placeholder.as_bytes()))
        {
            continue;
        }
        headers.remove(&secret.header);
        for value in values {
            let replaced = match value.to_str() {
                Ok(text) if text.contains(&secret.placeholder) => {
                    put = true;
                    let text = text.replace(&secret.placeholder, secret.value.expose());
                    HeaderValue::from_str(&text).map(|mut v| {
                        v.set_sensitive(true);
                        v
                    })
                }
                _ => Ok(value),
            };
            if let Ok(value) = replaced {
                headers.append(&secret.header, value);
            }
        }
    }
    put
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// What the requests of one intercepted connection share.
struct Session {
    host: String,
    secrets: Vec<Secret>,
    matcher: Arc<Matcher>,
    /// The upstream, or why there is none (its certificate did not verify...).
    upstream: Result<tokio::sync::Mutex<SendRequest<Incoming>>, String>,
    record: OpenRecord,
}

/// Serves one intercepted `CONNECT` (already answered) until either side ends it. Its
/// record (opened by the caller) says `failed` and why when TLS fails either way.
pub(crate) async fn intercept(
    client: Upgraded,
    upstream: (Metered, OpenRecord),
    host: String,
    secrets: Vec<Secret>,
    tls: Arc<Interceptor>,
) {
    let (metered, record) = upstream;
    let Some(matcher) = Matcher::new(&secrets).map(Arc::new) else {
        record.fail(format!("the secrets for {host} could not be set up"));
        return;
    };
    let leaf = match tls.ca.leaf(&host) {
        Ok(leaf) => leaf,
        Err(e) => {
            tracing::warn!(error = %e, "egress: no leaf certificate");
            record.fail(format!("sandcall has no certificate for {host}"));
            return;
        }
    };
    let accepted = tokio::time::timeout(HANDSHAKE_TIMEOUT, TlsAcceptor::from(leaf).accept(TokioIo::new(client))).await;
    let client = match accepted {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "egress: the program's TLS handshake failed");
            record.fail("the program's TLS handshake with the proxy failed (does it trust sandcall's CA?)".into());
            return;
        }
        Err(_) => {
            record.fail("the program's TLS handshake with the proxy took too long".into());
            return;
        }
    };
    let (upstream, driver) = connect_upstream(&tls, &host, metered).await;
    if let Err(reason) = &upstream {
        record.fail(reason.clone());
    }
    let session = Arc::new(Session {
        host,
        secrets,
        matcher,
        upstream: upstream.map(tokio::sync::Mutex::new),
        record,
    });
    let service = {
        let session = session.clone();
        hyper::service::service_fn(move |req| {
            let session = session.clone();
            async move { Ok::<_, Infallible>(relay(&session, req).await) }
        })
    };
    let serving = program_side().serve_connection(TokioIo::new(client), service);
    // The upstream connection is driven beside the program's; once it ends, requests get
    // 502 until the program closes.
    let driving = async {
        if let Some(driver) = driver {
            if let Err(e) = driver.await {
                tracing::debug!(error = %e, "egress: intercepted upstream connection ended with an error");
            }
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        result = serving => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "egress: intercepted client connection ended with an error");
            }
        }
        () = driving => {}
    }
}

type Driver = hyper::client::conn::http1::Connection<TokioIo<tokio_rustls::client::TlsStream<Metered>>, Incoming>;

/// TLS to the upstream, verified, then HTTP/1.1 on it.
async fn connect_upstream(
    tls: &Interceptor,
    host: &str,
    metered: Metered,
) -> (Result<SendRequest<Incoming>, String>, Option<Driver>) {
    let Ok(name) = ServerName::try_from(host.to_string()) else {
        return (Err(format!("{host} is not a name TLS can verify")), None);
    };
    let connector = TlsConnector::from(tls.upstream.clone());
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, metered)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return (Err(format!("TLS with {host} failed: {e}")), None),
        Err(_) => return (Err(format!("TLS with {host} took too long")), None),
    };
    match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
        Ok((sender, driver)) => (Ok(sender), Some(driver)),
        Err(e) => (Err(format!("HTTP with {host} failed: {e}")), None),
    }
}

/// Relays one request of an intercepted connection.
async fn relay(session: &Session, req: Request<Incoming>) -> Response<Body> {
    let upstream = match &session.upstream {
        Ok(upstream) => upstream,
        Err(reason) => return text(StatusCode::BAD_GATEWAY, reason),
    };
    let (mut parts, body) = req.into_parts();
    // Inside the tunnel the target is in origin form; an absolute one loses its authority
    // (the connection goes to the checked host whatever it names).
    if parts.uri.authority().is_some() {
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        match path.parse::<Uri>() {
            Ok(uri) => parts.uri = uri,
            Err(_) => return text(StatusCode::BAD_REQUEST, "the request target has no valid path"),
        }
    }
    parts.version = http::Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    if !parts.headers.contains_key(header::HOST) {
        if let Ok(host) = HeaderValue::from_str(&session.host) {
            parts.headers.insert(header::HOST, host);
        }
    }
    if substitute(&mut parts.headers, &session.secrets) {
        // A compressed answer could not be scrubbed: ask for none.
        parts
            .headers
            .insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }
    let mut sender = upstream.lock().await;
    if sender.ready().await.is_err() {
        return text(
            StatusCode::BAD_GATEWAY,
            &format!("the connection to {} has closed", session.host),
        );
    }
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            session.matcher.scrub_headers(&mut parts.headers);
            // Scrubbing may change the body's length.
            parts.headers.remove(header::CONTENT_LENGTH);
            let body = Scrub {
                inner: body,
                matcher: session.matcher.clone(),
                carry: Vec::new(),
                trailers: None,
                ended: false,
            };
            Response::from_parts(parts, Either::Left(body))
        }
        Err(e) => upstream_error(&session.record.counts, &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::SecretValue;

    fn secret(header: &str, placeholder: &str, value: &str) -> Secret {
        Secret::new("api.example.com", header, placeholder, SecretValue::new(value.into())).unwrap()
    }

    #[test]
    fn the_placeholder_is_replaced_in_its_header_only() {
        let secrets = [secret("authorization", "PLACEHOLDER-A", "real-value-a")];
        let mut headers = HeaderMap::new();
        headers.insert("authorization", HeaderValue::from_static("Bearer PLACEHOLDER-A"));
        headers.insert("x-other", HeaderValue::from_static("PLACEHOLDER-A"));
        assert!(substitute(&mut headers, &secrets));
        assert_eq!(headers["authorization"], "Bearer real-value-a");
        assert_eq!(headers["x-other"], "PLACEHOLDER-A");
        let mut without = HeaderMap::new();
        without.insert("authorization", HeaderValue::from_static("Bearer something"));
        assert!(!substitute(&mut without, &secrets));
        assert_eq!(without["authorization"], "Bearer something");
    }

    #[test]
    fn values_split_between_chunks_are_scrubbed() {
        let matcher = Matcher::new(&[secret("x-key", "PLACEHOLDER", "0123456789")]).unwrap();
        let body = b"a0123456789b01234567890123456789c012345678".to_vec();
        // Every way of cutting the body in two and in three.
        for i in 0..=body.len() {
            for j in i..=body.len() {
                let mut carry = Vec::new();
                let mut out = Vec::new();
                for chunk in [&body[..i], &body[i..j], &body[j..]] {
                    carry.extend_from_slice(chunk);
                    let done = matcher.scrub(&carry, false, &mut out);
                    carry.drain(..done);
                }
                matcher.scrub(&carry, true, &mut out);
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    "aPLACEHOLDERbPLACEHOLDERPLACEHOLDERc012345678",
                    "cut at {i}, {j}"
                );
            }
        }
    }
}
