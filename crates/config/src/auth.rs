//! Who may call: API keys (stored as hashes), LibreChat's JWT settings, and whether a server without either may listen beyond loopback.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// AuthConfig: the keys of docs/configuration.md this section holds. Each field's doc comment
/// gives its unit and default.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct AuthConfig {
    /// API keys, each mapping to a principal, stored as SHA-256 hashes:
    /// `[[api_keys]] principal = "alice" sha256 = "<hex>"` (`sandcall keys add NAME` adds
    /// one). SANDCALL_API_KEYS=`principal:key,principal:key` adds plain keys. Default
    /// none: local mode (one principal, no authentication, loopback only).
    pub api_keys: Vec<ApiKey>,
    /// With no credentials, listen on a non-loopback address anyway: for a private network
    /// whose every host may run code (LibreChat and sandcall side by side in containers,
    /// say). A warning at start. Requests may then name the server by any host; foreign
    /// `Origin`s and JSON bodies without `Content-Type` are still refused. Default false.
    pub allow_unauthenticated: bool,
    /// LibreChat's JWTs: where their keys come from and the rules of the check (the
    /// `[jwt]` table, or the Code Interpreter API's `CODEAPI_JWT_*` variables). With no key
    /// source set, JWTs are off.
    pub jwt: JwtConfig,
    /// The operator's credential for `GET /metrics` (and for `GET /v1/health` with the
    /// server-wide figures): a bearer token of at least 16 visible characters, sent as
    /// `Authorization: Bearer <metrics_token>`. No tenant's API key or JWT opens
    /// `/metrics`. Default none: `/metrics` is refused whenever any credential (an API
    /// key or a JWT key source) is configured, and open only in local mode.
    pub metrics_token: Option<String>,
}

/// An authentication setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthConfigError {
    #[error("api_keys: principal {0:?} must be 1 to 64 letters, digits, `_-.@`")]
    Principal(String),
    #[error("api_keys: sha256 of {0:?} must be 64 hex characters")]
    KeyHash(String),
    #[error("metrics_token must be at least {MIN_METRICS_TOKEN_CHARS} visible ASCII characters, without spaces")]
    MetricsToken,
}

/// Shortest `metrics_token`.
pub const MIN_METRICS_TOKEN_CHARS: usize = 16;

impl AuthConfig {
    pub fn validate(&self) -> Result<(), AuthConfigError> {
        for key in &self.api_keys {
            if !valid_principal(&key.principal) {
                return Err(AuthConfigError::Principal(key.principal.clone()));
            }
            if key.sha256.len() != 64 || !key.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(AuthConfigError::KeyHash(key.principal.clone()));
            }
        }
        if let Some(token) = &self.metrics_token {
            if token.len() < MIN_METRICS_TOKEN_CHARS || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(AuthConfigError::MetricsToken);
            }
        }
        Ok(())
    }

    /// Some credential is configured: an API key or a JWT key source.
    pub fn has_credentials(&self) -> bool {
        !self.api_keys.is_empty() || self.jwt.has_key_source()
    }
}

/// One API key: the principal it stands for and the SHA-256 of the key, in hex.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    pub principal: String,
    pub sha256: String,
    /// Pins the key's principal to this isolation tier, or a stronger one: with
    /// `gvisor`, its runs are in the gvisor tier whatever the server's `isolation`.
    /// File only. Default none: the server's `isolation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<crate::Isolation>,
    /// Narrows the server's `egress_allow` for the key's principal: its runs may reach
    /// only these hosts (each covered by `egress_allow`, checked at start). File only.
    /// Default none: all of `egress_allow` (for a principal in `egress_principals`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<String>>,
}

/// LibreChat's JWTs (`[jwt]`). Every key also comes from its `CODEAPI_JWT_*` variable,
/// the names the Code Interpreter API reads, which wins over the file. The keys
/// themselves are loaded and checked at start (`auth::jwt`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct JwtConfig {
    /// A JWKS document, as JSON text (`{"keys": [...]}`); keys without a `kid` are
    /// ignored. CODEAPI_JWT_JWKS_JSON. Default none.
    pub jwks_json: Option<String>,
    /// A folder of public keys, one per file, in PEM (or JWK JSON); a file's name without
    /// its extension is its kid. CODEAPI_JWT_PUBLIC_KEYS_DIR. Default none.
    pub public_keys_dir: Option<PathBuf>,
    /// One public key, as PEM text (line breaks may be written `\n`) or a JWK JSON
    /// object; not a path. Needs `kid`. CODEAPI_JWT_PUBLIC_KEY. Default none.
    pub public_key: Option<String>,
    /// The kid of `public_key`. CODEAPI_JWT_KID (or CODEAPI_JWT_KEY_ID). Default none.
    pub kid: Option<String>,
    /// A shared secret for HS256 tokens, for development; HS256 must also be in
    /// `allowed_algs`. CODEAPI_JWT_HS256_SECRET. Default none.
    pub hs256_secret: Option<String>,
    /// The kid of `hs256_secret`. CODEAPI_JWT_HS256_KID. Default: `kid` if set, else
    /// `hs256-dev`.
    pub hs256_kid: Option<String>,
    /// Algorithms a token may use, out of `EdDSA`, `RS256`, `HS256`: a list, or one
    /// comma-separated string. CODEAPI_JWT_ALLOWED_ALGS. Default `EdDSA,RS256`.
    #[serde(deserialize_with = "names_or_comma_list")]
    pub allowed_algs: Vec<String>,
    /// The `iss` a token must have. CODEAPI_JWT_ISSUER. Default `librechat`.
    pub issuer: String,
    /// The `aud` a token must have (or include, when a list). CODEAPI_JWT_AUDIENCE.
    /// Default `codeapi`.
    pub audience: String,
    /// Tolerance on `exp`, `nbf` and `iat`, in seconds, at most 300.
    /// CODEAPI_JWT_CLOCK_SKEW_SECONDS. Default 30.
    pub clock_skew_seconds: u64,
    /// Longest lifetime (`exp - iat`) a token may have, in seconds, 1 to 86400.
    /// CODEAPI_JWT_MAX_TTL_SECONDS. Default 300.
    pub max_ttl_seconds: u64,
    /// The tenant of a token without `tenant_id`. CODEAPI_JWT_SINGLE_TENANT_ID. Default
    /// `legacy`, what LibreChat sends when it has no tenants.
    pub single_tenant_id: String,
    /// Pins every principal a JWT names (each LibreChat user) to this isolation tier, or
    /// a stronger one. Default none: the server's `isolation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<crate::Isolation>,
    /// Narrows the server's `egress_allow` for every principal a JWT names, as
    /// `[[api_keys]] egress` does for a key's. Default none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<String>>,
}

impl Default for JwtConfig {
    fn default() -> Self {
        JwtConfig {
            jwks_json: None,
            public_keys_dir: None,
            public_key: None,
            kid: None,
            hs256_secret: None,
            hs256_kid: None,
            allowed_algs: vec!["EdDSA".into(), "RS256".into()],
            issuer: "librechat".into(),
            audience: "codeapi".into(),
            clock_skew_seconds: 30,
            max_ttl_seconds: 300,
            single_tenant_id: "legacy".into(),
            isolation: None,
            egress: None,
        }
    }
}

impl JwtConfig {
    /// Some key source is set: JWTs are on (and the server is not in local mode).
    pub fn has_key_source(&self) -> bool {
        let set = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.trim().is_empty());
        set(&self.jwks_json)
            || self.public_keys_dir.as_ref().is_some_and(|d| !d.as_os_str().is_empty())
            || set(&self.public_key)
            || self.hs256_secret.as_deref().is_some_and(|s| !s.is_empty())
    }
}

/// `["EdDSA", "RS256"]` in the file, `EdDSA,RS256` in the environment.
fn names_or_comma_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Names {
        One(String),
        List(Vec<String>),
    }
    Ok(match Names::deserialize(d)? {
        Names::One(s) => s
            .split(',')
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect(),
        Names::List(l) => l.into_iter().map(|n| n.trim().to_owned()).collect(),
    })
}

/// Hex SHA-256 of an API key, as stored.
pub fn key_hash(key: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(crate) fn valid_principal(p: &str) -> bool {
    (1..=64).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.@".contains(&b))
}
