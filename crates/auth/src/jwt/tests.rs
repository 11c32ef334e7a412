use super::*;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
use jsonwebtoken::EncodingKey;
use serde_json::json;

/// "Now" in every test: 2027-01-15.
const NOW: i64 = 1_800_000_000;
const RSA_PRIVATE: &str = include_str!("../testdata/rsa-private.pem");
const RSA_PUBLIC: &str = include_str!("../testdata/rsa-public.pem");
const EC_PUBLIC: &str = include_str!("../testdata/ec-public.pem");

/// An Ed25519 key made by the test: what signs, and its public half.
struct EdKey {
    signing: EncodingKey,
    public_pem: String,
    public_raw: [u8; 32],
}

fn ed_key() -> EdKey {
    let key = ed25519_dalek::SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    EdKey {
        signing: EncodingKey::from_ed_der(key.to_pkcs8_der().unwrap().as_bytes()),
        public_pem: key.verifying_key().to_public_key_pem(LineEnding::LF).unwrap(),
        public_raw: key.verifying_key().to_bytes(),
    }
}

fn rsa_signing() -> EncodingKey {
    EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()).unwrap()
}

/// A token with exactly this header and these claims, signed with `key` for `alg`
/// (whatever the header says).
fn sign(header: &Value, claims: &Value, key: &EncodingKey, alg: Algorithm) -> String {
    sign_raw(header.to_string().as_bytes(), claims.to_string().as_bytes(), key, alg)
}

fn sign_raw(header: &[u8], payload: &[u8], key: &EncodingKey, alg: Algorithm) -> String {
    let message = format!("{}.{}", URL_SAFE_NO_PAD.encode(header), URL_SAFE_NO_PAD.encode(payload));
    let signature = jsonwebtoken::crypto::sign(message.as_bytes(), key, alg).unwrap();
    format!("{message}.{signature}")
}

fn header(alg: &str, kid: &str) -> Value {
    json!({"alg": alg, "typ": "JWT", "kid": kid})
}

/// Claims as LibreChat mints them, valid at NOW.
fn claims() -> Value {
    json!({
        "iss": "librechat",
        "aud": "codeapi",
        "sub": "user_123",
        "iat": NOW - 10,
        "nbf": NOW - 10,
        "exp": NOW + 290,
        "jti": "jti_123",
        "tenant_id": "tenant_abc",
        "role": "USER",
        "principal_source": "librechat_jwt",
        "auth_context_hash": "hash_123",
    })
}

fn with(mut claims: Value, name: &str, value: Value) -> Value {
    claims[name] = value;
    claims
}

fn without(mut claims: Value, name: &str) -> Value {
    claims.as_object_mut().unwrap().remove(name);
    claims
}

fn single_key_config(ed: &EdKey) -> JwtConfig {
    JwtConfig {
        public_key: Some(ed.public_pem.clone()),
        kid: Some("lc-codeapi-2026-05".into()),
        ..JwtConfig::default()
    }
}

fn verifier(c: &JwtConfig) -> JwtVerifier {
    JwtVerifier::load(c).unwrap().expect("a key source is set")
}

fn load_error(c: &JwtConfig) -> String {
    match JwtVerifier::load(c) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("loaded: {c:?}"),
    }
}

fn user(tenant: &str, sub: &str) -> User {
    User {
        tenant: tenant.into(),
        sub: sub.into(),
    }
}

/// A verifier with one Ed25519 key, and a token signer for its kid.
struct Fixture {
    ed: EdKey,
    v: JwtVerifier,
}

impl Fixture {
    fn new() -> Fixture {
        let ed = ed_key();
        let v = verifier(&single_key_config(&ed));
        Fixture { ed, v }
    }

    fn token(&self, claims: &Value) -> String {
        sign(
            &header("EdDSA", "lc-codeapi-2026-05"),
            claims,
            &self.ed.signing,
            Algorithm::EdDSA,
        )
    }

    fn token_with_header(&self, header: &Value) -> String {
        sign(header, &claims(), &self.ed.signing, Algorithm::EdDSA)
    }

    fn check(&self, token: &str) -> Result<User, Refusal> {
        self.v.verify(token, NOW)
    }

    /// The token breaks only one rule: the refusal says which.
    fn refused(&self, token: &str) -> Refusal {
        let refusal = self.check(token).expect_err("accepted");
        let message = refusal.to_string();
        assert!(!message.contains("BEGIN"), "key material in {message}");
        refusal
    }
}

// --- good tokens -------------------------------------------------------------

#[test]
fn an_eddsa_token_from_a_single_key_names_its_tenant_and_user() {
    let f = Fixture::new();
    assert_eq!(f.check(&f.token(&claims())), Ok(user("tenant_abc", "user_123")));
    // LibreChat without tenants sends `legacy`; a token without tenant_id means the same.
    assert_eq!(
        f.check(&f.token(&with(claims(), "tenant_id", json!("legacy")))),
        Ok(user("legacy", "user_123"))
    );
    assert_eq!(
        f.check(&f.token(&without(claims(), "tenant_id"))),
        Ok(user("legacy", "user_123"))
    );
    // Optional claims may be there or not; `typ` may be left out.
    let extra = with(with(claims(), "org_id", json!("o")), "plan_id", json!("p"));
    assert!(f.check(&f.token(&without(extra, "role"))).is_ok());
    assert!(f
        .check(&f.token_with_header(&json!({"alg": "EdDSA", "kid": "lc-codeapi-2026-05"})))
        .is_ok());
    // `\n` written out, as in a one-line environment variable.
    let one_line = JwtConfig {
        public_key: Some(f.ed.public_pem.replace('\n', "\\n")),
        kid: Some("lc-codeapi-2026-05".into()),
        ..JwtConfig::default()
    };
    assert!(verifier(&one_line).verify(&f.token(&claims()), NOW).is_ok());
}

#[test]
fn an_rs256_token_from_a_keys_dir() {
    let dir = tempdir("rs256");
    std::fs::write(dir.join("rsa-2026.pem"), RSA_PUBLIC).unwrap();
    let ed = ed_key();
    std::fs::write(dir.join("ed-2026.pub"), &ed.public_pem).unwrap();
    // Folders (a Kubernetes secret's `..data`) are skipped.
    std::fs::create_dir(dir.join("..data")).unwrap();
    let v = verifier(&JwtConfig {
        public_keys_dir: Some(dir.clone()),
        ..JwtConfig::default()
    });
    let t = sign(
        &header("RS256", "rsa-2026"),
        &claims(),
        &rsa_signing(),
        Algorithm::RS256,
    );
    assert_eq!(v.verify(&t, NOW), Ok(user("tenant_abc", "user_123")));
    let t = sign(&header("EdDSA", "ed-2026"), &claims(), &ed.signing, Algorithm::EdDSA);
    assert_eq!(v.verify(&t, NOW), Ok(user("tenant_abc", "user_123")));
    let described = v.describe();
    assert!(
        described.contains("\"rsa-2026\" (RS256") && described.contains("\"ed-2026\" (EdDSA"),
        "{described}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tokens_from_a_jwks() {
    let ed = ed_key();
    let rsa = {
        use rsa::pkcs8::DecodePublicKey;
        use rsa::traits::PublicKeyParts;
        let key = rsa::PublicKey::from_public_key_pem(RSA_PUBLIC).unwrap();
        (key.n_bytes(), key.e_bytes())
    };
    let jwks = json!({"keys": [
        {"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(ed.public_raw), "kid": "ed", "alg": "EdDSA", "use": "sig"},
        {"kty": "RSA", "n": URL_SAFE_NO_PAD.encode(&rsa.0), "e": URL_SAFE_NO_PAD.encode(&rsa.1), "kid": "rsa"},
        {"kty": "RSA", "n": URL_SAFE_NO_PAD.encode(&rsa.0), "e": "AQAB", "kid": "pss", "alg": "PS256"},
        {"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA", "kid": "ec"},
        {"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(ed.public_raw)},
    ]});
    let v = verifier(&JwtConfig {
        jwks_json: Some(jwks.to_string()),
        ..JwtConfig::default()
    });
    let t = sign(&header("EdDSA", "ed"), &claims(), &ed.signing, Algorithm::EdDSA);
    assert_eq!(v.verify(&t, NOW), Ok(user("tenant_abc", "user_123")));
    let t = sign(&header("RS256", "rsa"), &claims(), &rsa_signing(), Algorithm::RS256);
    assert_eq!(v.verify(&t, NOW), Ok(user("tenant_abc", "user_123")));
    // The key says what it is for: a PS256 key does not verify RS256.
    let t = sign(&header("RS256", "pss"), &claims(), &rsa_signing(), Algorithm::RS256);
    assert_eq!(
        v.verify(&t, NOW),
        Err(Refusal::KeyAlgMismatch {
            kid: "pss".into(),
            key: "a key for PS256".into(),
            alg: "RS256"
        })
    );
    let t = sign(&header("EdDSA", "ec"), &claims(), &ed.signing, Algorithm::EdDSA);
    assert!(matches!(v.verify(&t, NOW), Err(Refusal::KeyAlgMismatch { .. })));
    let described = v.describe();
    assert!(described.contains("1 JWKS key(s) without kid ignored"), "{described}");
    assert!(described.contains("\"pss\" (a key for PS256: unused"), "{described}");
}

#[test]
fn hs256_only_when_allowed() {
    let secret = "a-development-secret-of-some-length";
    let key = EncodingKey::from_secret(secret.as_bytes()).unwrap();
    let config = JwtConfig {
        hs256_secret: Some(secret.into()),
        ..JwtConfig::default()
    };
    let t = sign(&header("HS256", "hs256-dev"), &claims(), &key, Algorithm::HS256);
    // Refused by default: HS256 is not in the default allowed_algs.
    assert_eq!(
        verifier(&config).verify(&t, NOW),
        Err(Refusal::AlgNotAllowed("HS256", "EdDSA,RS256".into()))
    );
    assert!(verifier(&config)
        .describe()
        .contains("HS256, not in allowed_algs: unused"));
    let allowed = JwtConfig {
        allowed_algs: vec!["HS256".into()],
        ..config.clone()
    };
    assert_eq!(verifier(&allowed).verify(&t, NOW), Ok(user("tenant_abc", "user_123")));
    // Its own kid, when set.
    let named = JwtConfig {
        hs256_kid: Some("dev-1".into()),
        ..allowed.clone()
    };
    let t2 = sign(&header("HS256", "dev-1"), &claims(), &key, Algorithm::HS256);
    assert!(verifier(&named).verify(&t2, NOW).is_ok());
    assert_eq!(
        verifier(&named).verify(&t, NOW),
        Err(Refusal::UnknownKid("hs256-dev".into()))
    );
    // Another secret's signature is not valid.
    let other = sign(
        &header("HS256", "hs256-dev"),
        &claims(),
        &EncodingKey::from_secret(b"x").unwrap(),
        Algorithm::HS256,
    );
    assert_eq!(
        verifier(&allowed).verify(&other, NOW),
        Err(Refusal::Signature("hs256-dev".into()))
    );
}

// --- one rule broken at a time -------------------------------------------------

#[test]
fn the_shape_of_the_token() {
    let f = Fixture::new();
    let good = f.token(&claims());
    assert_eq!(f.refused(&"a".repeat(MAX_TOKEN_BYTES + 1)), Refusal::TooLong);
    let (head, _) = good.rsplit_once('.').unwrap();
    assert_eq!(f.refused(head), Refusal::Segments(2));
    assert_eq!(f.refused(&format!("{good}.x")), Refusal::Segments(4));
    assert_eq!(f.refused("not-base64!.e30.sig"), Refusal::Encoding("header"));
    let not_object = URL_SAFE_NO_PAD.encode("[1]");
    assert_eq!(f.refused(&format!("{not_object}.e30.sig")), Refusal::Encoding("header"));
    // The payload is read after the signature: a signed payload that is not JSON.
    let t = sign_raw(
        header("EdDSA", "lc-codeapi-2026-05").to_string().as_bytes(),
        b"nope",
        &f.ed.signing,
        Algorithm::EdDSA,
    );
    assert_eq!(f.refused(&t), Refusal::Encoding("payload"));
}

#[test]
fn the_alg_must_be_supported_and_allowed() {
    let f = Fixture::new();
    assert_eq!(
        f.refused(&f.token_with_header(&json!({"typ": "JWT", "kid": "lc-codeapi-2026-05"}))),
        Refusal::NoAlg
    );
    for alg in ["none", "ES256", "PS256", "eddsa"] {
        assert_eq!(
            f.refused(&f.token_with_header(&header(alg, "lc-codeapi-2026-05"))),
            Refusal::UnsupportedAlg(alg.into())
        );
    }
    let only_rs = JwtConfig {
        allowed_algs: vec!["RS256".into()],
        ..single_key_config(&f.ed)
    };
    assert_eq!(
        verifier(&only_rs).verify(&f.token(&claims()), NOW),
        Err(Refusal::AlgNotAllowed("EdDSA", "RS256".into()))
    );
}

#[test]
fn typ_when_present_is_jwt() {
    let f = Fixture::new();
    for typ in [json!("at+jwt"), json!("jwt"), json!(1)] {
        let h = json!({"alg": "EdDSA", "typ": typ, "kid": "lc-codeapi-2026-05"});
        assert_eq!(f.refused(&f.token_with_header(&h)), Refusal::Typ(typ.to_string()));
    }
}

#[test]
fn the_kid_names_a_configured_key_of_the_tokens_alg() {
    let f = Fixture::new();
    assert_eq!(
        f.refused(&f.token_with_header(&json!({"alg": "EdDSA", "typ": "JWT"}))),
        Refusal::NoKid
    );
    assert_eq!(f.refused(&f.token_with_header(&header("EdDSA", ""))), Refusal::NoKid);
    assert_eq!(
        f.refused(&f.token_with_header(&header("EdDSA", "rotated-away"))),
        Refusal::UnknownKid("rotated-away".into())
    );
    // An RS256 token naming the Ed25519 key.
    let t = sign(
        &header("RS256", "lc-codeapi-2026-05"),
        &claims(),
        &rsa_signing(),
        Algorithm::RS256,
    );
    assert_eq!(
        f.refused(&t),
        Refusal::KeyAlgMismatch {
            kid: "lc-codeapi-2026-05".into(),
            key: "a key for EdDSA".into(),
            alg: "RS256"
        }
    );
}

#[test]
fn the_signature_must_be_valid() {
    let f = Fixture::new();
    let other = ed_key();
    let t = sign(
        &header("EdDSA", "lc-codeapi-2026-05"),
        &claims(),
        &other.signing,
        Algorithm::EdDSA,
    );
    assert_eq!(f.refused(&t), Refusal::Signature("lc-codeapi-2026-05".into()));
    // A claim changed after signing.
    let good = f.token(&claims());
    let parts: Vec<&str> = good.split('.').collect();
    let forged = URL_SAFE_NO_PAD.encode(with(claims(), "sub", json!("admin")).to_string());
    assert_eq!(
        f.refused(&format!("{}.{forged}.{}", parts[0], parts[2])),
        Refusal::Signature("lc-codeapi-2026-05".into())
    );
    assert_eq!(
        f.refused(&format!("{}.{}.", parts[0], parts[1])),
        Refusal::Signature("lc-codeapi-2026-05".into())
    );
}

#[test]
fn every_required_claim_must_be_present() {
    let f = Fixture::new();
    for name in [
        "iss",
        "aud",
        "sub",
        "jti",
        "iat",
        "nbf",
        "exp",
        "principal_source",
        "auth_context_hash",
    ] {
        assert_eq!(
            f.refused(&f.token(&without(claims(), name))),
            Refusal::Missing(name),
            "{name}"
        );
        assert_eq!(
            f.refused(&f.token(&with(claims(), name, Value::Null))),
            Refusal::Missing(name)
        );
    }
}

#[test]
fn claims_of_the_wrong_type() {
    let f = Fixture::new();
    for (name, value) in [
        ("iss", json!(1)),
        ("sub", json!("")),
        ("sub", json!("  ")),
        ("sub", json!(123)),
        ("jti", json!(["a"])),
        ("principal_source", json!(true)),
        ("auth_context_hash", json!("")),
        ("iat", json!("1800000000")),
        ("nbf", json!({})),
        ("exp", json!(1e300)),
        ("aud", json!(7)),
        ("aud", json!([])),
        ("aud", json!(["codeapi", 7])),
        ("tenant_id", json!("")),
        ("tenant_id", json!(42)),
    ] {
        let refusal = f.refused(&f.token(&with(claims(), name, value.clone())));
        assert!(
            matches!(refusal, Refusal::Malformed(n, _) if n == name),
            "{name} = {value}: {refusal:?}"
        );
    }
}

#[test]
fn sub_and_tenant_make_the_principal_so_they_are_short_and_printable() {
    let f = Fixture::new();
    for name in ["sub", "tenant_id"] {
        for value in [
            "a\0b".to_owned(),
            "line\nbreak".into(),
            "del\u{7f}".into(),
            "x".repeat(MAX_ID_CHARS + 1),
        ] {
            let refusal = f.refused(&f.token(&with(claims(), name, json!(value))));
            assert!(
                matches!(refusal, Refusal::Malformed(n, _) if n == name),
                "{name}: {refusal:?}"
            );
        }
        let longest = "é".repeat(MAX_ID_CHARS);
        assert!(f.check(&f.token(&with(claims(), name, json!(longest)))).is_ok());
    }
}

#[test]
fn issuer_and_audience() {
    let f = Fixture::new();
    assert_eq!(
        f.refused(&f.token(&with(claims(), "iss", json!("other-issuer")))),
        Refusal::Issuer {
            got: "\"other-issuer\"".into(),
            expected: "librechat".into()
        }
    );
    for aud in [json!("other-api"), json!(["other-api"]), json!(["account", "codeapi2"])] {
        assert_eq!(
            f.refused(&f.token(&with(claims(), "aud", aud))),
            Refusal::Audience("codeapi".into())
        );
    }
    assert!(f
        .check(&f.token(&with(claims(), "aud", json!(["account", "codeapi"]))))
        .is_ok());
    let configured = JwtConfig {
        issuer: "lc-prod".into(),
        audience: "sandcall".into(),
        ..single_key_config(&f.ed)
    };
    let t = f.token(&with(with(claims(), "iss", json!("lc-prod")), "aud", json!("sandcall")));
    assert!(verifier(&configured).verify(&t, NOW).is_ok());
    assert!(matches!(
        verifier(&configured).verify(&f.token(&claims()), NOW),
        Err(Refusal::Issuer { .. })
    ));
}

#[test]
fn expiry_not_before_and_issued_at_each_within_the_skew() {
    let f = Fixture::new();
    let timed = |iat: i64, nbf: i64, exp: i64| {
        f.token(&with(
            with(with(claims(), "iat", json!(iat)), "nbf", json!(nbf)),
            "exp",
            json!(exp),
        ))
    };
    // Expired 31 s ago: beyond the 30 s skew. 29 s ago: within it.
    assert_eq!(
        f.refused(&timed(NOW - 200, NOW - 200, NOW - 31)),
        Refusal::Expired {
            exp: NOW - 31,
            now: NOW,
            skew: 30
        }
    );
    assert_eq!(
        f.refused(&timed(NOW - 200, NOW - 200, NOW - 30)),
        Refusal::Expired {
            exp: NOW - 30,
            now: NOW,
            skew: 30
        }
    );
    assert!(f.check(&timed(NOW - 200, NOW - 200, NOW - 29)).is_ok());
    assert_eq!(
        f.refused(&timed(NOW, NOW + 31, NOW + 200)),
        Refusal::NotYetValid {
            nbf: NOW + 31,
            now: NOW,
            skew: 30
        }
    );
    assert!(f.check(&timed(NOW, NOW + 30, NOW + 200)).is_ok());
    assert_eq!(
        f.refused(&timed(NOW + 31, NOW, NOW + 200)),
        Refusal::IssuedInFuture {
            iat: NOW + 31,
            now: NOW,
            skew: 30
        }
    );
    assert!(f.check(&timed(NOW + 30, NOW, NOW + 200)).is_ok());
    // Fractional seconds are NumericDates too.
    assert!(f
        .check(&f.token(&with(claims(), "exp", json!(NOW as f64 + 10.5))))
        .is_ok());
    let no_skew = JwtConfig {
        clock_skew_seconds: 0,
        ..single_key_config(&f.ed)
    };
    assert!(matches!(
        verifier(&no_skew).verify(&timed(NOW - 200, NOW - 200, NOW - 1), NOW),
        Err(Refusal::Expired { .. })
    ));
}

#[test]
fn exp_after_iat_and_the_lifetime_at_most_the_maximum() {
    let f = Fixture::new();
    let timed = |iat: i64, exp: i64| {
        f.token(&with(
            with(with(claims(), "iat", json!(iat)), "nbf", json!(iat)),
            "exp",
            json!(exp),
        ))
    };
    assert_eq!(
        f.refused(&timed(NOW, NOW)),
        Refusal::ExpNotAfterIat { exp: NOW, iat: NOW }
    );
    assert_eq!(
        f.refused(&timed(NOW + 10, NOW + 5)),
        Refusal::ExpNotAfterIat {
            exp: NOW + 5,
            iat: NOW + 10
        }
    );
    assert_eq!(f.refused(&timed(NOW, NOW + 301)), Refusal::LifetimeTooLong(301, 300));
    assert!(f.check(&timed(NOW, NOW + 300)).is_ok());
    let longer = JwtConfig {
        max_ttl_seconds: 3600,
        ..single_key_config(&f.ed)
    };
    assert!(verifier(&longer).verify(&timed(NOW, NOW + 3600), NOW).is_ok());
}

#[test]
fn jti_at_most_256_characters() {
    let f = Fixture::new();
    assert_eq!(
        f.refused(&f.token(&with(claims(), "jti", json!("j".repeat(257))))),
        Refusal::JtiTooLong(257)
    );
    assert!(f
        .check(&f.token(&with(claims(), "jti", json!("j".repeat(256)))))
        .is_ok());
}

#[test]
fn principal_source_is_one_librechat_mints() {
    let f = Fixture::new();
    assert!(f
        .check(&f.token(&with(claims(), "principal_source", json!("openid_reuse"))))
        .is_ok());
    assert_eq!(
        f.refused(&f.token(&with(claims(), "principal_source", json!("api_key")))),
        Refusal::PrincipalSource("\"api_key\"".into())
    );
}

#[test]
fn single_tenant_id_names_the_tenant_of_tokens_without_one() {
    let f = Fixture::new();
    let c = JwtConfig {
        single_tenant_id: "acme".into(),
        ..single_key_config(&f.ed)
    };
    let v = verifier(&c);
    assert_eq!(
        v.verify(&f.token(&without(claims(), "tenant_id")), NOW),
        Ok(user("acme", "user_123"))
    );
    assert_eq!(v.verify(&f.token(&claims()), NOW), Ok(user("tenant_abc", "user_123")));
}

#[test]
fn principals_of_users_never_meet() {
    use crate::Principal;
    let pairs = [
        ("legacy", "alice"),
        ("legacy", "bob"),
        ("other", "alice"),
        ("a", "b:c"),
        ("a:b", "c"),
        ("a\",\"b", "c"),
        ("a", "\",\"b\",\"c"),
        ("local", "local"),
    ];
    let principals: Vec<String> = pairs.iter().map(|(t, s)| Principal::of_jwt_user(t, s).0).collect();
    for (i, p) in principals.iter().enumerate() {
        for q in &principals[i + 1..] {
            assert_ne!(p, q);
        }
        // API-key principals are letters, digits and `_-.@`; local mode's is `local`.
        assert!(p.contains(':') && p != crate::LOCAL, "{p}");
        assert!(!p.chars().any(char::is_control), "{p}");
    }
    assert_eq!(principals[0], r#"jwt:["legacy","alice"]"#);
}

// --- loading keys ---------------------------------------------------------------

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sandcall-jwt-{name}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn no_key_source_means_jwts_are_off() {
    assert!(JwtVerifier::load(&JwtConfig::default()).unwrap().is_none());
    let blank = JwtConfig {
        jwks_json: Some("  ".into()),
        public_key: Some(String::new()),
        ..JwtConfig::default()
    };
    assert!(JwtVerifier::load(&blank).unwrap().is_none());
}

/// Each config fails to load with a message that starts with "JWT keys: ", holds the
/// expected words, and shows no key material.
fn assert_refused_with_a_clear_message(cases: Vec<(&str, JwtConfig, &str)>) {
    for (label, config, expected) in cases {
        let message = load_error(&config);
        assert!(
            message.starts_with("JWT keys: ") && message.contains(expected),
            "{label}: {message}"
        );
        assert!(
            !message.contains("BEGIN") && !message.contains("MII"),
            "{label}: key material in {message}"
        );
    }
}

/// public_key: garbage inside PEM, a path instead of PEM, a private key, or no kid with it.
#[test]
fn a_public_key_that_cannot_be_parsed_is_refused_with_a_clear_message() {
    let ed = ed_key();
    let cases: Vec<(&str, JwtConfig, &str)> = vec![
        (
            "garbage PEM",
            JwtConfig {
                public_key: Some("-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----".into()),
                kid: Some("k".into()),
                ..JwtConfig::default()
            },
            "public_key (CODEAPI_JWT_PUBLIC_KEY): not an Ed25519 or RSA public key",
        ),
        (
            "a path instead of PEM",
            JwtConfig {
                public_key: Some("/etc/keys/lc.pem".into()),
                kid: Some("k".into()),
                ..JwtConfig::default()
            },
            "not a PEM public key",
        ),
        (
            "a private key",
            JwtConfig {
                public_key: Some(RSA_PRIVATE.into()),
                kid: Some("k".into()),
                ..JwtConfig::default()
            },
            "this is a private key",
        ),
        (
            "no kid",
            JwtConfig {
                public_key: Some(ed.public_pem.clone()),
                ..JwtConfig::default()
            },
            "needs its kid",
        ),
    ];
    assert_refused_with_a_clear_message(cases);
}

/// jwks_json: not JSON, no `keys`, keys that are unusable or contradict themselves, a
/// secret, no key with a kid; and a JWKS kid that public_key's kid repeats.
#[test]
fn a_jwks_that_cannot_be_parsed_is_refused_with_a_clear_message() {
    let ed = ed_key();
    let cases: Vec<(&str, JwtConfig, &str)> = vec![
        (
            "JWKS not JSON",
            JwtConfig {
                jwks_json: Some("{keys: ".into()),
                ..JwtConfig::default()
            },
            "jwks_json (CODEAPI_JWT_JWKS_JSON): not valid JSON",
        ),
        (
            "JWKS without keys",
            JwtConfig {
                jwks_json: Some(r#"{"kty": "OKP"}"#.into()),
                ..JwtConfig::default()
            },
            "`keys` list",
        ),
        (
            "JWKS key of the wrong size",
            JwtConfig {
                jwks_json: Some(json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "AAAA", "kid": "k"}]}).to_string()),
                ..JwtConfig::default()
            },
            "not 32 bytes",
        ),
        (
            "JWKS RSA key too small",
            JwtConfig {
                jwks_json: Some(json!({"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB", "kid": "k"}]}).to_string()),
                ..JwtConfig::default()
            },
            "key \"k\": not a usable RSA public key",
        ),
        (
            "JWKS key whose alg contradicts it",
            JwtConfig {
                jwks_json: Some(
                    json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(ed.public_raw), "kid": "k", "alg": "RS256"}]})
                        .to_string(),
                ),
                ..JwtConfig::default()
            },
            "does not fit its key type",
        ),
        (
            "JWKS secret",
            JwtConfig {
                jwks_json: Some(json!({"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "k"}]}).to_string()),
                ..JwtConfig::default()
            },
            "hs256_secret",
        ),
        (
            "JWKS whose keys have no kid",
            JwtConfig {
                jwks_json: Some(json!({"keys": []}).to_string()),
                ..JwtConfig::default()
            },
            "hold no key with a kid",
        ),
        (
            "the same kid twice",
            JwtConfig {
                jwks_json: Some(
                    json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(ed.public_raw), "kid": "k"}]})
                        .to_string(),
                ),
                public_key: Some(ed.public_pem.clone()),
                kid: Some("k".into()),
                ..JwtConfig::default()
            },
            "kid \"k\" is configured twice",
        ),
    ];
    assert_refused_with_a_clear_message(cases);
}

/// public_keys_dir: a folder that is not there.
#[test]
fn a_keys_dir_that_cannot_be_read_is_refused_with_a_clear_message() {
    let cases: Vec<(&str, JwtConfig, &str)> = vec![(
        "a missing keys dir",
        JwtConfig {
            public_keys_dir: Some("/nonexistent/sandcall-keys".into()),
            ..JwtConfig::default()
        },
        "public_keys_dir (CODEAPI_JWT_PUBLIC_KEYS_DIR): cannot read /nonexistent/sandcall-keys",
    )];
    assert_refused_with_a_clear_message(cases);
}

/// The checks' settings: algorithms unknown or none, a skew too wide, no lifetime, no
/// issuer.
#[test]
fn check_settings_that_cannot_work_are_refused_with_a_clear_message() {
    let cases: Vec<(&str, JwtConfig, &str)> = vec![
        (
            "an unknown algorithm",
            JwtConfig {
                allowed_algs: vec!["EdDSA".into(), "ES256".into()],
                ..JwtConfig::default()
            },
            "\"ES256\" is not one of EdDSA, RS256, HS256",
        ),
        (
            "no algorithm",
            JwtConfig {
                allowed_algs: vec![],
                ..JwtConfig::default()
            },
            "names no algorithm",
        ),
        (
            "a skew of an hour",
            JwtConfig {
                clock_skew_seconds: 3600,
                ..JwtConfig::default()
            },
            "clock_skew_seconds",
        ),
        (
            "no lifetime",
            JwtConfig {
                max_ttl_seconds: 0,
                ..JwtConfig::default()
            },
            "max_ttl_seconds",
        ),
        (
            "no issuer",
            JwtConfig {
                issuer: " ".into(),
                ..JwtConfig::default()
            },
            "issuer (CODEAPI_JWT_ISSUER) may not be empty",
        ),
    ];
    assert_refused_with_a_clear_message(cases);
}

#[test]
fn a_keys_dir_with_a_file_that_is_not_a_key_is_refused() {
    let dir = tempdir("garbage");
    std::fs::write(dir.join("good.pem"), RSA_PUBLIC).unwrap();
    std::fs::write(dir.join("README.txt"), "keys for LibreChat\n").unwrap();
    let message = load_error(&JwtConfig {
        public_keys_dir: Some(dir.clone()),
        ..JwtConfig::default()
    });
    assert!(
        message.contains("README.txt") && message.contains("not a PEM public key"),
        "{message}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    // An EC key loads, and a token naming it is refused saying why.
    let dir = tempdir("ec");
    std::fs::write(dir.join("ec.pem"), EC_PUBLIC).unwrap();
    let v = verifier(&JwtConfig {
        public_keys_dir: Some(dir.clone()),
        ..JwtConfig::default()
    });
    let ed = ed_key();
    let t = sign(&header("EdDSA", "ec"), &claims(), &ed.signing, Algorithm::EdDSA);
    assert!(matches!(v.verify(&t, NOW), Err(Refusal::KeyAlgMismatch { key, .. }) if key.contains("EC key")));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_single_key_may_be_a_jwk() {
    let ed = ed_key();
    let jwk = json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(ed.public_raw)});
    let v = verifier(&JwtConfig {
        public_key: Some(jwk.to_string()),
        kid: Some("k1".into()),
        ..JwtConfig::default()
    });
    let t = sign(&header("EdDSA", "k1"), &claims(), &ed.signing, Algorithm::EdDSA);
    assert!(v.verify(&t, NOW).is_ok());
    assert!(
        v.describe()
            .contains("\"k1\" (EdDSA, from public_key (CODEAPI_JWT_PUBLIC_KEY))"),
        "{}",
        v.describe()
    );
}
