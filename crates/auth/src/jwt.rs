//! The JWT provider: LibreChat's signed tokens, checked the way the Code Interpreter API
//! checks them. It owns the verification keys (loaded once, at start, from the `[jwt]`
//! settings; a source that cannot be read or parsed is an error then, never later) and
//! the rules a token must pass. It knows no HTTP: `auth` decides which credentials come
//! here and answers the refusal.
//!
//! jsonwebtoken checks the signatures; the header and the claims are read here, so that
//! each refusal can say which rule the token broke.

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
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
    use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
    use jsonwebtoken::EncodingKey;
    use serde_json::json;

    /// "Now" in every test: 2027-01-15.
    const NOW: i64 = 1_800_000_000;
    const RSA_PRIVATE: &str = include_str!("testdata/rsa-private.pem");
    const RSA_PUBLIC: &str = include_str!("testdata/rsa-public.pem");
    const EC_PUBLIC: &str = include_str!("testdata/ec-public.pem");

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

    #[test]
    fn key_sources_that_cannot_be_parsed_are_refused_with_a_clear_message() {
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
            (
                "a missing keys dir",
                JwtConfig {
                    public_keys_dir: Some("/nonexistent/sandcall-keys".into()),
                    ..JwtConfig::default()
                },
                "public_keys_dir (CODEAPI_JWT_PUBLIC_KEYS_DIR): cannot read /nonexistent/sandcall-keys",
            ),
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
}
