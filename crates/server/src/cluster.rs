//! Many nodes over one shared session store: forwarding a request about a session to the
//! node that holds it live (`node_url`). Which node that is, and taking a session over
//! when its owner is gone, is `programmatic::session::Sessions::locate`; this module only
//! carries the request there and the answer back.
//!
//! The forwarded request is the same request: method, path, the JSON body and the request
//! id, but never the caller's credentials (`Authorization`, `X-API-Key`): in their place
//! `sandcall-forwarded` carries a pass (`node_auth`) naming the principal this node
//! authenticated, good for the owner node and this request, once. A node never forwards
//! a request that carries it: a request crosses at most one hop. It forwards only to the
//! URLs of its `peer_urls`: the owner's URL comes from the session store, and a URL
//! written there by someone else gets nothing.

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// Set on a forwarded request; its value is the pass (`node_auth`).
pub const FORWARDED_HEADER: &str = "sandcall-forwarded";
/// With `node_header = true`, set on every answer about a session in a cluster: the node
/// that served it.
pub const NODE_HEADER: &str = "sandcall-node";

/// The request headers a forward passes on: never the caller's credentials.
const PASSED_ON: [&str; 2] = ["content-type", sandcall_api::REQUEST_ID_HEADER];

/// The answer headers a forward passes back.
const PASSED_BACK: [&str; 4] = ["content-type", "retry-after", "sandcall-node", "sandcall-resume"];

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The owner could not be reached at all (refused, no route, connect timeout): the
    /// request did not get there.
    #[error("the owning node cannot be reached: {0}")]
    Unreachable(String),
    /// The request may have reached the owner, but no whole answer came back.
    #[error("forwarding to the owning node failed: {0}")]
    Failed(String),
    /// The owner the session store names is not one of `peer_urls`: nothing was sent.
    #[error("the session store names an owner that is not one of peer_urls: {0:?}")]
    NotAPeer(String),
}

pub struct Forwarder {
    /// This node's `node_url`: its id in the leases.
    node_url: String,
    /// The only URLs a request is forwarded to (`peer_urls`).
    peers: Vec<String>,
    /// Signs the passes this node sends, checks the ones it is sent.
    passes: crate::node_auth::NodeAuth,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Forwarder {
    /// `token_secret`: the cluster's shared secret, from which the pass key is derived.
    pub fn new(node_url: String, peers: Vec<String>, token_secret: &str) -> Forwarder {
        let mut connector = HttpConnector::new();
        // A dead owner is found out fast; a live one may take as long as its program runs
        // to the next pause, so the answer itself has no timeout here (the owner bounds it).
        connector.set_connect_timeout(Some(Duration::from_secs(1)));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Forwarder {
            passes: crate::node_auth::NodeAuth::new(token_secret, &node_url),
            node_url,
            peers,
            client,
        }
    }

    /// The principal of a forwarded request to this node: its pass, checked.
    pub fn accept(&self, pass: &str, method: &str, path: &str) -> Result<String, crate::node_auth::PassError> {
        self.passes.verify(pass, method, path, crate::node_auth::now_ms())
    }

    pub fn node_url(&self) -> &str {
        &self.node_url
    }

    /// The request of `principal`, sent to the node at `owner` if it is one of the peers;
    /// its answer.
    pub async fn forward(
        &self,
        owner: &str,
        principal: &str,
        method: Method,
        path: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response, ForwardError> {
        if !self.peers.iter().any(|peer| peer == owner) {
            return Err(ForwardError::NotAPeer(owner.chars().take(200).collect()));
        }
        let pass = self
            .passes
            .sign(principal, owner, method.as_str(), path, crate::node_auth::now_ms());
        let mut request = hyper::Request::builder().method(method).uri(format!("{owner}{path}"));
        for name in PASSED_ON {
            for value in headers.get_all(name) {
                request = request.header(name, value);
            }
        }
        let pass = HeaderValue::from_str(&pass).map_err(|e| ForwardError::Failed(e.to_string()))?;
        let request = request
            .header(FORWARDED_HEADER, pass)
            .body(Full::new(body))
            .map_err(|e| ForwardError::Failed(e.to_string()))?;
        let answer = self.client.request(request).await.map_err(|e| {
            if e.is_connect() {
                ForwardError::Unreachable(e.to_string())
            } else {
                ForwardError::Failed(e.to_string())
            }
        })?;
        let (parts, body) = answer.into_parts();
        let bytes = body
            .collect()
            .await
            .map_err(|e| ForwardError::Failed(e.to_string()))?
            .to_bytes();
        let mut response = (parts.status, bytes).into_response();
        for name in PASSED_BACK {
            if let Some(value) = parts.headers.get(name) {
                response.headers_mut().insert(name, value.clone());
            }
        }
        Ok(response)
    }
}

/// The answer when the owner took the request but its answer was lost on the way: the
/// caller retries (a retried resume gets the first one's answer).
pub fn forward_failed(e: &ForwardError) -> crate::error::ApiError {
    tracing::warn!(error = %e, "forwarding a request to the session's owner");
    if let ForwardError::NotAPeer(_) = e {
        return crate::error::ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            sandcall_api::error_type::SESSION_OWNER_UNAVAILABLE,
            "the node the session store names as this session's owner is not one of this node's \
             peer_urls; the request was not forwarded",
        );
    }
    crate::error::ApiError {
        retry_after_s: Some(1),
        ..crate::error::ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            sandcall_api::error_type::SESSION_OWNER_UNAVAILABLE,
            "the node that holds this session did not answer; retry (a retried resume gets its first answer)",
        )
    }
}
