//! Finding 7 of issue 25: an unauthenticated caller probes the JWT check. A 401 says
//! which class of rule the token broke, never which kids are configured, what type each
//! key is, which algorithms are allowed, or the expected issuer and audience; and an
//! unknown kid cannot be told from a bad signature (which kids exist cannot be probed).

use crate::common::Server;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

const ED_KID: &str = "kid-ed-quartz-41";
const HS_KID: &str = "kid-hs-marble-77";
const HS_SECRET: &str = "a-development-secret-of-32-bytes-or-more";
const ISSUER: &str = "issuer-saffron-9";
const AUDIENCE: &str = "audience-cobalt-3";
/// What no 401 may contain: the configured kids, issuer and audience, and the key types
/// and algorithms the server has.
const SECRETS: [&str; 8] = [ED_KID, HS_KID, ISSUER, AUDIENCE, "EdDSA", "Ed25519", "RS256", "HS256"];

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(changes: Value) -> Value {
    let now = now();
    let mut c = json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": "user-1", "tenant_id": "t",
        "iat": now, "nbf": now, "exp": now + 60, "jti": format!("j-{}", rand::random::<u64>()),
        "principal_source": "librechat_jwt", "auth_context_hash": "h",
    });
    for (k, v) in changes.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

/// A server with an Ed25519 key (allowed) and an HS256 secret (configured, but HS256 is
/// not in the allowed algorithms), both under kids a caller must not learn.
fn server() -> (Server, EncodingKey) {
    let key = ed25519_dalek::SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let pem = key.verifying_key().to_public_key_pem(LineEnding::LF).unwrap();
    let s = Server::start_with(
        &[
            ("CODEAPI_JWT_PUBLIC_KEY", &pem),
            ("CODEAPI_JWT_KID", ED_KID),
            ("CODEAPI_JWT_HS256_SECRET", HS_SECRET),
            ("CODEAPI_JWT_HS256_KID", HS_KID),
            ("CODEAPI_JWT_ISSUER", ISSUER),
            ("CODEAPI_JWT_AUDIENCE", AUDIENCE),
        ],
        "",
    );
    (s, EncodingKey::from_ed_der(key.to_pkcs8_der().unwrap().as_bytes()))
}

fn ed_token(key: &EncodingKey, kid: &str, changes: Value) -> String {
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(kid.into());
    jsonwebtoken::encode(&header, &claims(changes), key).unwrap()
}

/// The token with its header replaced (its signature then no longer fits).
fn with_header(token: &str, header: Value) -> String {
    let rest = token.split_once('.').unwrap().1;
    format!("{}.{rest}", URL_SAFE_NO_PAD.encode(header.to_string()))
}

/// The 401's status and body for `token` on an authenticated route.
fn refusal(s: &Server, token: &str) -> (u16, String) {
    let (status, body) = s.post_with(
        "/v1/exec",
        &json!({"code": "print(1)"}),
        &[("Authorization", &format!("Bearer {token}"))],
    );
    (status, body.to_string())
}

/// 401 `unauthorized`, its body naming none of `SECRETS`.
fn assert_tells_nothing(s: &Server, case: &str, token: &str) -> String {
    let (status, body) = refusal(s, token);
    assert_eq!(status, 401, "{case}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error_type"], "unauthorized", "{case}: {body}");
    for secret in SECRETS {
        assert!(!body.contains(secret), "{case}: the 401 names {secret:?}: {body}");
    }
    v["error"].as_str().unwrap().to_owned()
}

#[test]
fn jwt_refusals_name_no_kid_key_type_issuer_or_audience() {
    let (s, key) = server();
    let good = ed_token(&key, ED_KID, json!({}));
    assert_eq!(refusal(&s, &good).0, 200, "the good token is served");

    let unknown_kid = ed_token(&key, "kid-nobody", json!({}));
    let bad_signature = {
        let (head, _) = good.rsplit_once('.').unwrap();
        format!("{head}.{}", URL_SAFE_NO_PAD.encode([7u8; 64]))
    };
    // HS256 is configured (under HS_KID) but not allowed.
    let mut hs_header = Header::new(Algorithm::HS256);
    hs_header.kid = Some(HS_KID.into());
    let hs_key = EncodingKey::from_secret(HS_SECRET.as_bytes()).unwrap();
    let alg_not_allowed = jsonwebtoken::encode(&hs_header, &claims(json!({})), &hs_key).unwrap();
    // RS256 names the Ed25519 key: a key of another type.
    let key_type_mismatch = with_header(&good, json!({"alg": "RS256", "typ": "JWT", "kid": ED_KID}));
    let alg_none = with_header(&good, json!({"alg": "none", "typ": "JWT", "kid": ED_KID}));
    let wrong_issuer = ed_token(&key, ED_KID, json!({"iss": "someone-else"}));
    let wrong_audience = ed_token(&key, ED_KID, json!({"aud": "another-api"}));

    let mut signature_class = Vec::new();
    for (case, token) in [
        ("unknown kid", &unknown_kid),
        ("bad signature", &bad_signature),
        ("alg not allowed", &alg_not_allowed),
        ("key of another type", &key_type_mismatch),
        ("alg none", &alg_none),
    ] {
        signature_class.push((case, assert_tells_nothing(&s, case, token)));
    }
    // An unknown kid, a wrong algorithm and a bad signature answer the same words:
    // which kids exist, and what each is, cannot be probed.
    for (case, message) in &signature_class {
        assert_eq!(message, &signature_class[0].1, "{case} answers differently");
    }
    assert!(signature_class[0].1.contains("signature"), "{signature_class:?}");
    for (case, token) in [("wrong issuer", &wrong_issuer), ("wrong audience", &wrong_audience)] {
        let message = assert_tells_nothing(&s, case, token);
        assert!(message.contains("not accepted"), "{case}: {message}");
    }
    // The class still says what to fix for an expired token.
    let expired = ed_token(
        &key,
        ED_KID,
        json!({"iat": now() - 200, "nbf": now() - 200, "exp": now() - 100}),
    );
    assert!(assert_tells_nothing(&s, "expired", &expired).contains("expired"));
    assert_eq!(refusal(&s, &ed_token(&key, ED_KID, json!({}))).0, 200);
}
