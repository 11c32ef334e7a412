//! Node-to-node credentials: what a forwarded request carries instead of the caller's.
//!
//! A node that forwards a request about a session to its owner has already authenticated
//! the caller; the owner must learn who the caller is without being handed the caller's
//! API key or JWT (a node that forwarded those would give them to whoever can write an
//! owner URL into the session store). So the forward carries a pass: the principal, the
//! target node's `node_url`, the method and path, a random nonce and an expiry, under an
//! HMAC-SHA256 whose key is derived from the cluster's shared `token_secret`. The owner
//! accepts a pass only if it is addressed to itself, for this method and path, not
//! expired, and not seen before (each nonce is kept until its pass expires).
//!
//! It owns the pass format and the replay memory; it knows no HTTP headers (`cluster`
//! and `auth` carry it).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::collections::HashMap;
use std::sync::Mutex;

/// How long a pass is good for, in ms: a forward is sent at once, so this only has to
/// cover the clock difference between nodes.
pub const PASS_TTL_MS: u64 = 15_000;
/// Most nonces remembered at once. A node that is sent more unexpired passes than this
/// refuses the rest until some expire (only a node holding the secret can make them).
const MAX_REMEMBERED: usize = 100_000;
/// What the key is derived for: the pass key differs from the continuation-token key
/// made from the same secret.
const KEY_PURPOSE: &[u8] = b"sandcall node-to-node forward pass v1";

/// The signed content of a pass.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Claims {
    /// The principal the forwarding node authenticated.
    principal: String,
    /// The `node_url` of the node it is for.
    to: String,
    method: String,
    path: String,
    nonce: String,
    /// Expiry, ms since 1970.
    exp: u64,
}

/// Why a pass was refused. The messages go to the caller of a forged forward and name
/// nothing of the configuration.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PassError {
    #[error("the forward's pass is malformed")]
    Malformed,
    #[error("the forward's pass is not signed with the cluster's secret")]
    Signature,
    #[error("the forward's pass is for another node or request")]
    Elsewhere,
    #[error("the forward's pass has expired")]
    Expired,
    #[error("the forward's pass was used before")]
    Replayed,
    #[error("too many forwards at once; retry")]
    Busy,
}

/// The cluster's pass key, and this node's memory of the nonces it accepted.
pub struct NodeAuth {
    key: [u8; 32],
    /// This node's `node_url`: passes addressed elsewhere are refused.
    own_url: String,
    /// Nonce -> its pass's expiry (ms).
    seen: Mutex<HashMap<String, u64>>,
}

impl NodeAuth {
    /// The key, derived from the cluster's `token_secret` (the hex text every node is
    /// configured with).
    pub fn new(token_secret: &str, own_url: &str) -> NodeAuth {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(token_secret.as_bytes())
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(KEY_PURPOSE);
        NodeAuth {
            key: mac.finalize().into_bytes().into(),
            own_url: own_url.to_owned(),
            seen: Mutex::new(HashMap::new()),
        }
    }

    fn mac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"))
    }

    /// A pass for one request of `principal` to the node at `to`.
    pub fn sign(&self, principal: &str, to: &str, method: &str, path: &str, now_ms: u64) -> String {
        let claims = Claims {
            principal: principal.to_owned(),
            to: to.to_owned(),
            method: method.to_owned(),
            path: path.to_owned(),
            nonce: hex(&rand::random::<[u8; 16]>()),
            exp: now_ms.saturating_add(PASS_TTL_MS),
        };
        let body = serde_json::to_vec(&claims).unwrap_or_default();
        let mut mac = self.mac();
        mac.update(&body);
        let tag = mac.finalize().into_bytes();
        format!("{}.{}", URL_SAFE_NO_PAD.encode(&body), URL_SAFE_NO_PAD.encode(tag))
    }

    /// The principal of a pass for this node and this request, once: the nonce is
    /// remembered until the pass expires.
    pub fn verify(&self, pass: &str, method: &str, path: &str, now_ms: u64) -> Result<String, PassError> {
        let (body, tag) = pass.split_once('.').ok_or(PassError::Malformed)?;
        let body = URL_SAFE_NO_PAD.decode(body).map_err(|_| PassError::Malformed)?;
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| PassError::Malformed)?;
        let mut mac = self.mac();
        mac.update(&body);
        // Constant-time comparison.
        mac.verify_slice(&tag).map_err(|_| PassError::Signature)?;
        let claims: Claims = serde_json::from_slice(&body).map_err(|_| PassError::Malformed)?;
        if claims.to != self.own_url || claims.method != method || claims.path != path {
            return Err(PassError::Elsewhere);
        }
        // Not expired, and not made for longer than a pass lasts (with a clock's slack).
        if claims.exp <= now_ms || claims.exp > now_ms.saturating_add(2 * PASS_TTL_MS) {
            return Err(PassError::Expired);
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= MAX_REMEMBERED / 2 {
            seen.retain(|_, exp| *exp > now_ms);
        }
        if seen.contains_key(&claims.nonce) {
            return Err(PassError::Replayed);
        }
        if seen.len() >= MAX_REMEMBERED {
            return Err(PassError::Busy);
        }
        seen.insert(claims.nonce, claims.exp);
        Ok(claims.principal)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Now, in ms since 1970.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "5ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7";
    const B: &str = "http://10.0.0.2:3112";
    const NOW: u64 = 1_800_000_000_000;

    #[test]
    fn a_pass_is_good_for_its_node_and_request_once() {
        let a = NodeAuth::new(SECRET, "http://10.0.0.1:3112");
        let b = NodeAuth::new(SECRET, B);
        let pass = a.sign("alice", B, "POST", "/v1/exec/programmatic", NOW);
        assert_eq!(
            b.verify(&pass, "POST", "/v1/exec/programmatic", NOW + 5),
            Ok("alice".into())
        );
        assert_eq!(
            b.verify(&pass, "POST", "/v1/exec/programmatic", NOW + 6),
            Err(PassError::Replayed)
        );
        // Another node, method or path: refused.
        let pass = a.sign("alice", B, "POST", "/v1/exec/programmatic", NOW);
        assert_eq!(
            a.verify(&pass, "POST", "/v1/exec/programmatic", NOW),
            Err(PassError::Elsewhere)
        );
        assert_eq!(
            b.verify(&pass, "GET", "/v1/exec/programmatic", NOW),
            Err(PassError::Elsewhere)
        );
        assert_eq!(b.verify(&pass, "POST", "/v1/exec", NOW), Err(PassError::Elsewhere));
        // Expired.
        assert_eq!(
            b.verify(&pass, "POST", "/v1/exec/programmatic", NOW + PASS_TTL_MS),
            Err(PassError::Expired)
        );
        // Another secret, or a changed principal: not signed.
        let other = NodeAuth::new(&SECRET.replace('5', "6"), "http://10.0.0.1:3112");
        let forged = other.sign("alice", B, "POST", "/p", NOW);
        assert_eq!(b.verify(&forged, "POST", "/p", NOW), Err(PassError::Signature));
        let pass = a.sign("alice", B, "POST", "/p", NOW);
        let (body, tag) = pass.split_once('.').unwrap();
        let body = String::from_utf8(URL_SAFE_NO_PAD.decode(body).unwrap())
            .unwrap()
            .replace("alice", "bob");
        let tampered = format!("{}.{tag}", URL_SAFE_NO_PAD.encode(body));
        assert_eq!(b.verify(&tampered, "POST", "/p", NOW), Err(PassError::Signature));
        assert_eq!(b.verify("x", "POST", "/p", NOW), Err(PassError::Malformed));
    }
}
