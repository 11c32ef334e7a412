//! The JWT provider: LibreChat's signed tokens, checked the way the Code Interpreter API
//! checks them. It owns the verification keys (loaded once, at start, from the `[jwt]`
//! settings; a source that cannot be read or parsed is an error then, never later) and
//! the rules a token must pass. It knows no HTTP: `auth` decides which credentials come
//! here and answers the refusal.
//!
//! jsonwebtoken checks the signatures; the header and the claims are read here, so that
//! each refusal can say which rule the token broke (to the log; the caller is told only
//! its class, `Refusal::class`).

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey};
use sandcall_config::JwtConfig;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Longest token looked at, in bytes: LibreChat's are under 1 KiB.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// Longest `jti`, in characters.
pub const MAX_JTI_CHARS: usize = 256;
/// Longest `sub` and `tenant_id`, in characters: they make up the principal.
pub const MAX_ID_CHARS: usize = 256;
/// The claims every token must have.
const REQUIRED_CLAIMS: [&str; 9] = [
    "iss",
    "aud",
    "sub",
    "jti",
    "iat",
    "nbf",
    "exp",
    "principal_source",
    "auth_context_hash",
];
/// The `principal_source` values LibreChat mints.
const PRINCIPAL_SOURCES: [&str; 2] = ["librechat_jwt", "openid_reuse"];
/// Most `clock_skew_seconds` may be.
const MAX_SKEW_SECONDS: u64 = 300;
/// Most `max_ttl_seconds` may be.
const MAX_TTL_CEILING_SECONDS: u64 = 86_400;

/// The algorithms sandcall verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    EdDSA,
    RS256,
    HS256,
}

impl Alg {
    const ALL: [Alg; 3] = [Alg::EdDSA, Alg::RS256, Alg::HS256];

    fn parse(name: &str) -> Option<Alg> {
        Alg::ALL.into_iter().find(|a| a.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Alg::EdDSA => "EdDSA",
            Alg::RS256 => "RS256",
            Alg::HS256 => "HS256",
        }
    }

    fn jsonwebtoken(self) -> Algorithm {
        match self {
            Alg::EdDSA => Algorithm::EdDSA,
            Alg::RS256 => Algorithm::RS256,
            Alg::HS256 => Algorithm::HS256,
        }
    }
}

/// A configured key that a token's kid may name.
struct Key {
    /// The key and the one algorithm it verifies, or what it is when sandcall cannot
    /// verify with it (an EC key, a JWKS key whose `alg` is PS256, ...): a token naming
    /// it is refused, saying so.
    usage: Result<(Alg, DecodingKey), String>,
    /// Which setting it came from, for `doctor`.
    source: &'static str,
}

/// A JWT key source or setting that cannot be used. The message names the setting and
/// what is wrong; it never holds key material.
#[derive(Debug, thiserror::Error)]
#[error("JWT keys: {0}")]
pub struct JwtConfigError(String);

/// The verified caller: the pair that makes the principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub tenant: String,
    pub sub: String,
}

/// Why a token was refused: one variant per rule. The messages hold no key material and
/// no host path.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("it is longer than {MAX_TOKEN_BYTES} bytes")]
    TooLong,
    #[error("a JWT has three segments separated by `.`; this one has {0}")]
    Segments(usize),
    #[error("its {0} is not base64url-encoded JSON object")]
    Encoding(&'static str),
    #[error("its header has no `alg`")]
    NoAlg,
    #[error("its alg {0:?} is not supported (EdDSA, RS256, HS256)")]
    UnsupportedAlg(String),
    #[error("its alg {0} is not allowed here (allowed_algs: {1})")]
    AlgNotAllowed(&'static str, String),
    #[error("its typ is {0}; when present it must be \"JWT\"")]
    Typ(String),
    #[error("its header has no `kid`")]
    NoKid,
    #[error("its kid {0:?} names no configured key")]
    UnknownKid(String),
    #[error("its kid {kid:?} names {key}, and the token says {alg}")]
    KeyAlgMismatch {
        kid: String,
        key: String,
        alg: &'static str,
    },
    #[error("its signature is not valid for the key {0:?}")]
    Signature(String),
    #[error("it has no `{0}` claim")]
    Missing(&'static str),
    #[error("its `{0}` claim must be {1}")]
    Malformed(&'static str, &'static str),
    #[error("its iss {got} is not the expected issuer {expected:?}")]
    Issuer { got: String, expected: String },
    #[error("its aud does not name the expected audience {0:?}")]
    Audience(String),
    #[error("it expired at {exp} (now {now}, clock skew {skew} s)")]
    Expired { exp: i64, now: i64, skew: u64 },
    #[error("it is not valid before {nbf} (now {now}, clock skew {skew} s)")]
    NotYetValid { nbf: i64, now: i64, skew: u64 },
    #[error("it was issued in the future, at {iat} (now {now}, clock skew {skew} s)")]
    IssuedInFuture { iat: i64, now: i64, skew: u64 },
    #[error("its exp ({exp}) is not after its iat ({iat})")]
    ExpNotAfterIat { exp: i64, iat: i64 },
    #[error("its lifetime (exp - iat) is {0} s, more than the {1} s allowed")]
    LifetimeTooLong(i64, u64),
    #[error("its jti is {0} characters long, more than {MAX_JTI_CHARS}")]
    JtiTooLong(usize),
    #[error("its principal_source {0} is not one of librechat_jwt, openid_reuse")]
    PrincipalSource(String),
}

impl Refusal {
    /// What the caller is told: the class of failure only. The full reason (`Display`)
    /// names key ids, key types, the allowed algorithms and the expected issuer and
    /// audience, which an unauthenticated caller must not learn: it goes to the log.
    /// Unknown kid, wrong algorithm, wrong key type and a bad signature are one class,
    /// so that which kids exist cannot be probed.
    pub fn class(&self) -> &'static str {
        use Refusal::*;
        match self {
            TooLong | Segments(_) | Encoding(_) | NoAlg | Typ(_) | NoKid | Missing(_) | Malformed(..) => {
                "it is malformed"
            }
            UnsupportedAlg(_) | AlgNotAllowed(..) | UnknownKid(_) | KeyAlgMismatch { .. } | Signature(_) => {
                "its signature is not valid"
            }
            Expired { .. } => "it has expired",
            NotYetValid { .. } | IssuedInFuture { .. } => "it is not valid yet",
            Issuer { .. }
            | Audience(_)
            | ExpNotAfterIat { .. }
            | LifetimeTooLong(..)
            | JtiTooLong(_)
            | PrincipalSource(_) => "it is not accepted by this server",
        }
    }
}

/// The keys and the rules, loaded once at start.
pub struct JwtVerifier {
    keys: BTreeMap<String, Key>,
    allowed: Vec<Alg>,
    issuer: String,
    audience: String,
    skew: u64,
    max_ttl: u64,
    single_tenant: String,
    /// JWKS keys without a `kid`, which no token can name (reported by `doctor`).
    ignored_without_kid: usize,
}

/// Seconds since 1970, as tokens count.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A bearer value meant as a JWT: API keys have no `.`.
pub fn looks_like_jwt(token: &str) -> bool {
    token.contains('.')
}

/// base64url, with or without padding (the Code Interpreter API's decoder takes both).
const B64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

impl JwtVerifier {
    /// Reads and checks every key source and setting. `Ok(None)`: no key source is set,
    /// JWTs are off.
    pub fn load(c: &JwtConfig) -> Result<Option<JwtVerifier>, JwtConfigError> {
        let bad = |m: String| Err(JwtConfigError(m));
        let mut allowed = Vec::new();
        for name in &c.allowed_algs {
            match Alg::parse(name) {
                Some(alg) if !allowed.contains(&alg) => allowed.push(alg),
                Some(_) => {}
                None => {
                    return bad(format!(
                        "allowed_algs (CODEAPI_JWT_ALLOWED_ALGS): {name:?} is not one of EdDSA, RS256, HS256"
                    ))
                }
            }
        }
        if allowed.is_empty() {
            return bad("allowed_algs (CODEAPI_JWT_ALLOWED_ALGS) names no algorithm".into());
        }
        for (name, value) in [
            ("issuer (CODEAPI_JWT_ISSUER)", &c.issuer),
            ("audience (CODEAPI_JWT_AUDIENCE)", &c.audience),
            ("single_tenant_id (CODEAPI_JWT_SINGLE_TENANT_ID)", &c.single_tenant_id),
        ] {
            if value.trim().is_empty() {
                return bad(format!("{name} may not be empty"));
            }
        }
        if has_control(&c.single_tenant_id) || c.single_tenant_id.chars().count() > MAX_ID_CHARS {
            return bad(format!(
                "single_tenant_id (CODEAPI_JWT_SINGLE_TENANT_ID) must be at most {MAX_ID_CHARS} characters, none of them control characters"
            ));
        }
        if c.clock_skew_seconds > MAX_SKEW_SECONDS {
            return bad(format!(
                "clock_skew_seconds (CODEAPI_JWT_CLOCK_SKEW_SECONDS) is {}, more than {MAX_SKEW_SECONDS}",
                c.clock_skew_seconds
            ));
        }
        if !(1..=MAX_TTL_CEILING_SECONDS).contains(&c.max_ttl_seconds) {
            return bad(format!(
                "max_ttl_seconds (CODEAPI_JWT_MAX_TTL_SECONDS) must be 1 to {MAX_TTL_CEILING_SECONDS}, not {}",
                c.max_ttl_seconds
            ));
        }
        if !c.has_key_source() {
            return Ok(None);
        }
        let mut keys = Keys::default();
        if let Some(jwks) = c.jwks_json.as_deref().filter(|j| !j.trim().is_empty()) {
            keys.load_jwks(jwks)?;
        }
        if let Some(dir) = c.public_keys_dir.as_deref().filter(|d| !d.as_os_str().is_empty()) {
            keys.load_dir(dir)?;
        }
        if let Some(pem) = c.public_key.as_deref().filter(|p| !p.trim().is_empty()) {
            const SOURCE: &str = "public_key (CODEAPI_JWT_PUBLIC_KEY)";
            let Some(kid) = c.kid.as_deref().filter(|k| !k.trim().is_empty()) else {
                return bad(format!("{SOURCE} needs its kid: set kid (CODEAPI_JWT_KID)"));
            };
            let usage = key_from_text(pem).map_err(|e| JwtConfigError(format!("{SOURCE}: {e}")))?;
            keys.add(kid, usage, SOURCE)?;
        }
        if let Some(secret) = c.hs256_secret.as_deref().filter(|s| !s.is_empty()) {
            const SOURCE: &str = "hs256_secret (CODEAPI_JWT_HS256_SECRET)";
            let kid = c
                .hs256_kid
                .as_deref()
                .or(c.kid.as_deref())
                .filter(|k| !k.trim().is_empty())
                .unwrap_or("hs256-dev");
            let key =
                DecodingKey::from_secret(secret.as_bytes()).map_err(|e| JwtConfigError(format!("{SOURCE}: {e}")))?;
            keys.add(kid, Ok((Alg::HS256, key)), SOURCE)?;
        }
        if keys.map.is_empty() {
            return bad(
                "the key sources that are set hold no key with a kid (jwks_json, public_keys_dir, public_key, hs256_secret)"
                    .into(),
            );
        }
        Ok(Some(JwtVerifier {
            keys: keys.map,
            allowed,
            issuer: c.issuer.clone(),
            audience: c.audience.clone(),
            skew: c.clock_skew_seconds,
            max_ttl: c.max_ttl_seconds,
            single_tenant: c.single_tenant_id.clone(),
            ignored_without_kid: keys.without_kid,
        }))
    }

    /// One line for `doctor`: sources, kids and their algorithms, and the rules.
    pub fn describe(&self) -> String {
        let mut out = format!(
            "JWT: issuer {:?}, audience {:?}, allowed algorithms {}, clock skew {} s, max lifetime {} s; keys:",
            self.issuer,
            self.audience,
            self.allowed.iter().map(|a| a.name()).collect::<Vec<_>>().join(","),
            self.skew,
            self.max_ttl,
        );
        for (i, (kid, key)) in self.keys.iter().enumerate() {
            let what = match &key.usage {
                Ok((alg, _)) if self.allowed.contains(alg) => alg.name().to_owned(),
                Ok((alg, _)) => format!("{}, not in allowed_algs: unused", alg.name()),
                Err(what) => format!("{what}: unused"),
            };
            let _ = write!(
                out,
                "{} {kid:?} ({what}, from {})",
                if i == 0 { "" } else { "," },
                key.source
            );
        }
        if self.ignored_without_kid > 0 {
            let _ = write!(out, "; {} JWKS key(s) without kid ignored", self.ignored_without_kid);
        }
        out
    }

    /// Checks `token` against every rule, in the order a reader would: its shape, its
    /// header, its key and signature, then its claims. `now` is seconds since 1970.
    pub fn verify(&self, token: &str, now: i64) -> Result<User, Refusal> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Refusal::TooLong);
        }
        let segments: Vec<&str> = token.split('.').collect();
        let [header_b64, payload_b64, signature_b64] = segments[..] else {
            return Err(Refusal::Segments(segments.len()));
        };
        let header = decode_json(header_b64).ok_or(Refusal::Encoding("header"))?;
        let alg = match header.get("alg") {
            None => return Err(Refusal::NoAlg),
            Some(Value::String(name)) => Alg::parse(name).ok_or_else(|| Refusal::UnsupportedAlg(name.clone()))?,
            Some(other) => return Err(Refusal::UnsupportedAlg(other.to_string())),
        };
        if !self.allowed.contains(&alg) {
            let allowed = self.allowed.iter().map(|a| a.name()).collect::<Vec<_>>().join(",");
            return Err(Refusal::AlgNotAllowed(alg.name(), allowed));
        }
        if let Some(typ) = header.get("typ") {
            if typ.as_str() != Some("JWT") {
                return Err(Refusal::Typ(typ.to_string()));
            }
        }
        let kid = match header.get("kid") {
            Some(Value::String(kid)) if !kid.is_empty() => kid,
            _ => return Err(Refusal::NoKid),
        };
        let key = self.keys.get(kid).ok_or_else(|| Refusal::UnknownKid(kid.clone()))?;
        let mismatch = |what: String| Refusal::KeyAlgMismatch {
            kid: kid.clone(),
            key: what,
            alg: alg.name(),
        };
        let decoding_key = match &key.usage {
            Ok((key_alg, decoding_key)) if *key_alg == alg => decoding_key,
            Ok((key_alg, _)) => return Err(mismatch(format!("a key for {}", key_alg.name()))),
            Err(what) => return Err(mismatch(what.clone())),
        };
        let signed = &token[..header_b64.len() + 1 + payload_b64.len()];
        let valid = jsonwebtoken::crypto::verify(signature_b64, signed.as_bytes(), decoding_key, alg.jsonwebtoken());
        if !matches!(valid, Ok(true)) {
            return Err(Refusal::Signature(kid.clone()));
        }
        let claims = decode_json(payload_b64).ok_or(Refusal::Encoding("payload"))?;
        self.check_claims(&claims, now)
    }

    fn check_claims(&self, claims: &Map<String, Value>, now: i64) -> Result<User, Refusal> {
        for name in REQUIRED_CLAIMS {
            if claims.get(name).is_none_or(Value::is_null) {
                return Err(Refusal::Missing(name));
            }
        }
        let iss = nonempty_string(claims, "iss")?;
        if iss != self.issuer {
            return Err(Refusal::Issuer {
                got: Value::from(iss).to_string(),
                expected: self.issuer.clone(),
            });
        }
        let aud_ok = match &claims["aud"] {
            Value::String(aud) => aud == &self.audience,
            Value::Array(list) if !list.is_empty() && list.iter().all(Value::is_string) => {
                list.iter().any(|a| a.as_str() == Some(self.audience.as_str()))
            }
            _ => return Err(Refusal::Malformed("aud", "a string or a non-empty list of strings")),
        };
        if !aud_ok {
            return Err(Refusal::Audience(self.audience.clone()));
        }
        let sub = identifier(claims, "sub")?;
        let tenant = match claims.get("tenant_id") {
            None | Some(Value::Null) => self.single_tenant.clone(),
            Some(_) => identifier(claims, "tenant_id")?,
        };
        let jti = nonempty_string(claims, "jti")?;
        let principal_source = nonempty_string(claims, "principal_source")?;
        nonempty_string(claims, "auth_context_hash")?;
        let iat = seconds(claims, "iat")?;
        let nbf = seconds(claims, "nbf")?;
        let exp = seconds(claims, "exp")?;
        let skew = self.skew as i64;
        if exp <= now - skew {
            return Err(Refusal::Expired {
                exp,
                now,
                skew: self.skew,
            });
        }
        if nbf > now + skew {
            return Err(Refusal::NotYetValid {
                nbf,
                now,
                skew: self.skew,
            });
        }
        if iat > now + skew {
            return Err(Refusal::IssuedInFuture {
                iat,
                now,
                skew: self.skew,
            });
        }
        if exp <= iat {
            return Err(Refusal::ExpNotAfterIat { exp, iat });
        }
        if exp - iat > self.max_ttl as i64 {
            return Err(Refusal::LifetimeTooLong(exp - iat, self.max_ttl));
        }
        let jti_chars = jti.chars().count();
        if jti_chars > MAX_JTI_CHARS {
            return Err(Refusal::JtiTooLong(jti_chars));
        }
        if !PRINCIPAL_SOURCES.contains(&principal_source) {
            return Err(Refusal::PrincipalSource(Value::from(principal_source).to_string()));
        }
        Ok(User { tenant, sub })
    }
}

fn decode_json(segment: &str) -> Option<Map<String, Value>> {
    let bytes = B64.decode(segment).ok()?;
    match serde_json::from_slice(&bytes).ok()? {
        Value::Object(map) => Some(map),
        _ => None,
    }
}

fn nonempty_string<'a>(claims: &'a Map<String, Value>, name: &'static str) -> Result<&'a str, Refusal> {
    claims
        .get(name)
        .and_then(Value::as_str)
        .filter(|s| !s.trim().is_empty())
        .ok_or(Refusal::Malformed(name, "a non-empty string"))
}

/// `sub` or `tenant_id`: part of the principal, so short and free of control characters.
fn identifier(claims: &Map<String, Value>, name: &'static str) -> Result<String, Refusal> {
    let value = nonempty_string(claims, name)?;
    if value.chars().count() > MAX_ID_CHARS || has_control(value) {
        return Err(Refusal::Malformed(
            name,
            "a string of at most 256 characters, none of them control characters",
        ));
    }
    Ok(value.to_owned())
}

fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

/// A NumericDate: seconds since 1970, a JSON number (fractions are cut).
fn seconds(claims: &Map<String, Value>, name: &'static str) -> Result<i64, Refusal> {
    let malformed = Refusal::Malformed(name, "a number of seconds since 1970");
    let value = claims.get(name).ok_or(malformed.clone())?;
    if let Some(n) = value.as_i64() {
        return Ok(n);
    }
    match value.as_f64() {
        Some(f) if f.is_finite() && f.abs() < 1e15 => Ok(f.floor() as i64),
        _ => Err(malformed),
    }
}

#[derive(Default)]
struct Keys {
    map: BTreeMap<String, Key>,
    without_kid: usize,
}

impl Keys {
    fn add(
        &mut self,
        kid: &str,
        usage: Result<(Alg, DecodingKey), String>,
        source: &'static str,
    ) -> Result<(), JwtConfigError> {
        if let Some(other) = self.map.get(kid) {
            return Err(JwtConfigError(format!(
                "kid {kid:?} is configured twice, in {} and in {source}",
                other.source
            )));
        }
        self.map.insert(kid.to_owned(), Key { usage, source });
        Ok(())
    }

    fn load_jwks(&mut self, text: &str) -> Result<(), JwtConfigError> {
        const SOURCE: &str = "jwks_json (CODEAPI_JWT_JWKS_JSON)";
        let bad = |m: String| JwtConfigError(format!("{SOURCE}: {m}"));
        let doc: Value = serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let Some(list) = doc.get("keys").and_then(Value::as_array) else {
            return Err(bad("a JWKS is an object with a `keys` list".into()));
        };
        for (i, jwk) in list.iter().enumerate() {
            let Some(jwk) = jwk.as_object() else {
                return Err(bad(format!("key {i} is not a JSON object")));
            };
            let Some(kid) = jwk.get("kid").and_then(Value::as_str).filter(|k| !k.is_empty()) else {
                self.without_kid += 1;
                continue;
            };
            let usage = key_from_jwk(jwk).map_err(|e| bad(format!("key {kid:?}: {e}")))?;
            self.add(kid, usage, SOURCE)?;
        }
        Ok(())
    }

    fn load_dir(&mut self, dir: &Path) -> Result<(), JwtConfigError> {
        const SOURCE: &str = "public_keys_dir (CODEAPI_JWT_PUBLIC_KEYS_DIR)";
        let bad = |m: String| JwtConfigError(format!("{SOURCE}: {m}"));
        let entries = std::fs::read_dir(dir).map_err(|e| bad(format!("cannot read {}: {e}", dir.display())))?;
        let mut paths = Vec::new();
        for entry in entries {
            paths.push(
                entry
                    .map_err(|e| bad(format!("cannot read {}: {e}", dir.display())))?
                    .path(),
            );
        }
        paths.sort();
        for path in paths {
            // Follows symlinks, as a Kubernetes secret's files are; folders (its `..data`) are skipped.
            let meta = std::fs::metadata(&path).map_err(|e| bad(format!("cannot read {}: {e}", path.display())))?;
            if !meta.is_file() {
                continue;
            }
            let Some(kid) = path.file_stem().and_then(|s| s.to_str()).filter(|k| !k.is_empty()) else {
                continue;
            };
            let text =
                std::fs::read_to_string(&path).map_err(|e| bad(format!("cannot read {}: {e}", path.display())))?;
            let usage = key_from_text(&text).map_err(|e| bad(format!("{}: {e}", path.display())))?;
            self.add(kid, usage, SOURCE)?;
        }
        Ok(())
    }
}

/// A PEM public key, or one JWK as a JSON object. Line breaks written as the two
/// characters `\n` (as in a one-line environment variable) are read as line breaks.
fn key_from_text(text: &str) -> Result<Result<(Alg, DecodingKey), String>, String> {
    let text = text.replace("\\n", "\n");
    let text = text.trim();
    if text.starts_with('{') {
        let jwk: Map<String, Value> =
            serde_json::from_str(text).map_err(|e| format!("not a JWK: not valid JSON: {e}"))?;
        return key_from_jwk(&jwk);
    }
    if !text.starts_with("-----BEGIN ") {
        return Err("not a PEM public key nor a JWK JSON object (the value is the key itself, not a path)".into());
    }
    if text.contains("PRIVATE KEY-----") {
        return Err("this is a private key: give the public key (`openssl pkey -in KEY.pem -pubout`)".into());
    }
    if let Ok(key) = DecodingKey::from_ed_pem(text.as_bytes()) {
        check_ed25519(&key)?;
        return Ok(Ok((Alg::EdDSA, key)));
    }
    if let Ok(key) = DecodingKey::from_rsa_pem(text.as_bytes()) {
        check_rsa_der(key.try_get_as_bytes().unwrap_or_default())?;
        return Ok(Ok((Alg::RS256, key)));
    }
    if DecodingKey::from_ec_pem(text.as_bytes()).is_ok() {
        return Ok(Err("an EC key, which sandcall does not verify with".into()));
    }
    Err("not an Ed25519 or RSA public key in PEM form".into())
}

/// One JWK: what it is (`kty`, `crv`), checked against what it says it is for (`alg`).
fn key_from_jwk(jwk: &Map<String, Value>) -> Result<Result<(Alg, DecodingKey), String>, String> {
    let field = |name: &str| jwk.get(name).and_then(Value::as_str);
    let (alg, key) = match field("kty") {
        Some("OKP") if field("crv") == Some("Ed25519") => {
            let x = field("x").ok_or("an Ed25519 JWK needs `x`")?;
            let bytes = B64.decode(x).map_err(|_| "its `x` is not base64url")?;
            if bytes.len() != 32 {
                return Err("its `x` is not 32 bytes, as an Ed25519 key is".into());
            }
            let key = DecodingKey::from_ed_der(&bytes);
            check_ed25519(&key)?;
            (Alg::EdDSA, key)
        }
        Some("RSA") => {
            let part = |name: &str| -> Result<Vec<u8>, String> {
                let text = field(name).ok_or(format!("an RSA JWK needs `{name}`"))?;
                B64.decode(text).map_err(|_| format!("its `{name}` is not base64url"))
            };
            let (n, e) = (part("n")?, part("e")?);
            rsa::PublicKey::new(
                rsa::BoxedUint::from_be_slice_vartime(&n),
                rsa::BoxedUint::from_be_slice_vartime(&e),
            )
            .map_err(|e| format!("not a usable RSA public key: {e}"))?;
            (Alg::RS256, DecodingKey::from_rsa_raw_components(&n, &e))
        }
        Some("oct") => {
            return Err(
                "a symmetric key (kty oct): give HS256 secrets in hs256_secret (CODEAPI_JWT_HS256_SECRET)".into(),
            )
        }
        Some("OKP") => return Ok(Err(format!("an OKP key on curve {:?}", field("crv").unwrap_or("?")))),
        Some(kty) => return Ok(Err(format!("a {kty} key, which sandcall does not verify with"))),
        None => return Err("it has no `kty`".into()),
    };
    match jwk.get("alg") {
        None => Ok(Ok((alg, key))),
        Some(Value::String(said)) => match Alg::parse(said) {
            Some(said_alg) if said_alg == alg => Ok(Ok((alg, key))),
            Some(_) => Err(format!("its alg {said} does not fit its key type")),
            None => Ok(Err(format!("a key for {said}"))),
        },
        Some(_) => Err("its `alg` is not a string".into()),
    }
}

/// An Ed25519 key is a valid curve point (the verifier is built as it would be per token).
fn check_ed25519(key: &DecodingKey) -> Result<(), String> {
    jsonwebtoken::crypto::verify("", b"", key, Algorithm::EdDSA)
        .map(|_| ())
        .map_err(|_| "not a valid Ed25519 public key".into())
}

/// jsonwebtoken parses an RSA key only per token: parse it now, once.
fn check_rsa_der(der: &[u8]) -> Result<(), String> {
    use rsa::pkcs1::DecodeRsaPublicKey;
    rsa::PublicKey::from_pkcs1_der(der)
        .map(|_| ())
        .map_err(|e| format!("not a usable RSA public key: {e}"))
}

#[cfg(test)]
mod tests;
