//! Who is calling. Two providers resolve credentials into a `Principal`: static API keys
//! (`api_keys`) and LibreChat's signed JWTs (`jwt`). With neither configured, everyone is
//! the one local principal, and only loopback (or an explicitly opened private network)
//! may reach the server. Every route runs behind `authenticate`.
//!
//! Which provider sees a credential: `X-API-Key` is always an API key. A `Bearer` value
//! that is a configured API key is that key; otherwise, when JWT keys are configured and
//! the value is JWT-shaped (it has a `.`, which no key `sandcall keys add` makes has),
//! it is a JWT; otherwise it is an API key that is not valid.

pub mod api_keys;
pub mod jwt;

use http::{header, HeaderMap};
use sandcall_config::{Config, Isolation};
use std::net::SocketAddr;
use std::sync::Arc;

/// Why credentials were refused; the message is safe to answer to the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credentials, or credentials that are not valid.
    #[error("{0}")]
    Unauthorized(String),
}

/// The listening address and the credentials do not fit together.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("listen {listen:?}: {source}")]
    Unparsable {
        listen: String,
        source: std::net::AddrParseError,
    },
    #[error(
        "listening on {0} with no api_keys would let anyone who reaches it run code: add a key \
         (`sandcall keys add NAME --config FILE`, or SANDCALL_API_KEYS), or LibreChat's JWT public key \
         ([jwt], or CODEAPI_JWT_PUBLIC_KEY and CODEAPI_JWT_KID), listen on 127.0.0.1, or, \
         on a private network where every host may run code, set allow_unauthenticated = true"
    )]
    OpenWithoutCredentials(SocketAddr),
}

/// Most characters of a JWT refusal's reason written to the log.
const MAX_LOGGED_REASON: usize = 300;

/// The principal a request acts for. Sessions and files belong to one.
///
/// The string is what the stores key by: an API key's principal name (letters, digits,
/// `_-.@`), `local`, or for a JWT `jwt:` and the JSON array `[tenant_id, sub]`. The
/// three forms cannot meet: only the JWT form has `:`, and JSON keeps every pair apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal(pub String);

/// The principal of local mode.
pub const LOCAL: &str = "local";

/// What every JWT principal begins with (no API key principal has `:`).
const JWT_PREFIX: &str = "jwt:";

impl Principal {
    /// The principal of a LibreChat user: the pair (tenant, sub). `jwt` refuses control
    /// characters in both, so the file store's `principal \0 session \0 id` keys stay
    /// unambiguous.
    pub fn of_jwt_user(tenant: &str, sub: &str) -> Principal {
        Principal(format!("{JWT_PREFIX}{}", serde_json::Value::from(vec![tenant, sub])))
    }
}

impl Tiers {
    fn new(config: &Config) -> Tiers {
        let default = config.host.isolation;
        let mut api_keys = std::collections::HashMap::new();
        for key in &config.auth.api_keys {
            // One pinned key pins its principal.
            let tier = key.isolation.unwrap_or(default).max(default);
            let entry = api_keys.entry(key.principal.clone()).or_insert(default);
            *entry = (*entry).max(tier);
        }
        Tiers {
            default,
            api_keys,
            jwt: config.auth.jwt.isolation.unwrap_or(default).max(default),
        }
    }
}

#[derive(Clone)]
pub struct Auth {
    api_keys: api_keys::ApiKeys,
    /// Loaded once at start; None when no JWT key source is configured.
    jwt: Option<Arc<jwt::JwtVerifier>>,
    /// Local mode on loopback: only loopback host names are served (DNS rebinding).
    /// Off when `allow_unauthenticated` opens it to a network, whose clients name the
    /// server as they like.
    loopback_hosts_only: bool,
    /// Each principal's isolation tier (`Auth::isolation`).
    tiers: Arc<Tiers>,
    /// Hex SHA-256 of `metrics_token`: the operator's credential. Compared as a hash, as
    /// the API keys are, so the comparison's time says nothing about the token.
    metrics_token: Option<String>,
}

/// Who may read `GET /metrics`, and who gets the server-wide `GET /v1/health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// The caller sent `metrics_token`.
    Token,
    /// Local mode with no `metrics_token`: the one local principal is the operator.
    Local,
}

/// The isolation tier of each principal: the server's `isolation`, or a stronger one its
/// API key (`[[api_keys]] isolation`) or the JWTs (`[jwt] isolation`) pin it to.
struct Tiers {
    default: Isolation,
    api_keys: std::collections::HashMap<String, Isolation>,
    jwt: Isolation,
}

impl Auth {
    /// Loads every credential: a JWT key source that cannot be read or parsed is an error
    /// (`serve` refuses to start, `doctor` fails, with this message).
    pub fn new(config: &Config) -> Result<Self, jwt::JwtConfigError> {
        Ok(Auth {
            api_keys: api_keys::ApiKeys::new(config),
            jwt: jwt::JwtVerifier::load(&config.auth.jwt)?.map(Arc::new),
            loopback_hosts_only: !exposed_without_credentials(config),
            tiers: Arc::new(Tiers::new(config)),
            metrics_token: config.auth.metrics_token.as_deref().map(sandcall_config::key_hash),
        })
    }

    /// The operator, or why not. With `metrics_token` set, only `Authorization: Bearer
    /// <metrics_token>` is; without it, only local mode's one principal is, and a server
    /// with any credential configured has no operator (its `/metrics` stays closed).
    pub fn operator(&self, headers: &HeaderMap) -> Result<Operator, AuthError> {
        let refused = |m: &str| AuthError::Unauthorized(m.to_owned());
        let Some(hash) = &self.metrics_token else {
            return if self.local_mode() {
                Ok(Operator::Local)
            } else {
                Err(refused(
                    "GET /metrics is closed on a server with credentials until metrics_token is set; \
                     a tenant's API key or JWT does not open it",
                ))
            };
        };
        match bearer(headers) {
            Some(token) if sandcall_config::key_hash(token) == *hash => Ok(Operator::Token),
            _ => Err(refused(
                "GET /metrics needs the operator's token: send `Authorization: Bearer <metrics_token>`",
            )),
        }
    }

    /// The isolation tier `principal`'s runs are in, at least: a request may ask for a
    /// stronger one, never a weaker one.
    pub fn isolation(&self, principal: &Principal) -> Isolation {
        let t = &self.tiers;
        if principal.0.starts_with(JWT_PREFIX) {
            return t.jwt;
        }
        t.api_keys.get(&principal.0).copied().unwrap_or(t.default)
    }

    /// Local mode on loopback: only loopback host names may be served.
    pub fn loopback_hosts_only(&self) -> bool {
        self.loopback_hosts_only
    }

    pub fn local_mode(&self) -> bool {
        self.api_keys.is_empty() && self.jwt.is_none()
    }

    /// What is configured, for `doctor`: the number of API keys, and the JWT settings.
    pub fn describe(&self) -> String {
        if self.local_mode() {
            return "none: local mode, one principal and no authentication".into();
        }
        let keys = match self.api_keys.len() {
            1 => "1 API key".to_owned(),
            n => format!("{n} API keys"),
        };
        match &self.jwt {
            Some(jwt) => format!("{keys}; {}", jwt.describe()),
            None => format!("{keys}; JWT: off (no key source)"),
        }
    }

    /// The credentials of `Authorization: Bearer` or `X-API-Key`, checked.
    pub fn principal(&self, headers: &HeaderMap) -> Result<Principal, AuthError> {
        if self.local_mode() {
            return Ok(Principal(LOCAL.into()));
        }
        let unauthorized = |m: &str| AuthError::Unauthorized(m.to_owned());
        if let Some(token) = bearer(headers) {
            if let Some(principal) = self.api_keys.principal(token) {
                return Ok(principal);
            }
            if let Some(verifier) = self.jwt.as_ref().filter(|_| jwt::looks_like_jwt(token)) {
                return match verifier.verify(token, jwt::now()) {
                    Ok(user) => Ok(Principal::of_jwt_user(&user.tenant, &user.sub)),
                    Err(refusal) => {
                        // The reason names kids, issuer and audience: the log has it
                        // (cut, as it may quote a caller's kid or iss), the caller gets
                        // its class only.
                        let reason: String = refusal.to_string().chars().take(MAX_LOGGED_REASON).collect();
                        tracing::info!(%reason, "JWT refused");
                        Err(unauthorized(&format!("the JWT was refused: {}", refusal.class())))
                    }
                };
            }
            return Err(unauthorized(if self.api_keys.is_empty() {
                "the bearer token is not a JWT (three base64url segments separated by `.`)"
            } else {
                "the API key is not valid"
            }));
        }
        let key = headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|k| !k.is_empty());
        let Some(key) = key else {
            return Err(unauthorized(if self.jwt.is_some() {
                "credentials are required: send `Authorization: Bearer <JWT or API key>` or `X-API-Key: <key>`"
            } else {
                "an API key is required: send `Authorization: Bearer <key>` or `X-API-Key: <key>`"
            }));
        };
        self.api_keys
            .principal(key)
            .ok_or_else(|| unauthorized("the API key is not valid"))
    }
}

/// The value of `Authorization: Bearer`, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

/// Local mode only on loopback: otherwise anyone who can reach the port runs code.
pub fn check_listen(config: &Config, auth: &Auth) -> Result<(), ListenError> {
    let addr: SocketAddr = config
        .listen
        .address
        .parse()
        .map_err(|source| ListenError::Unparsable {
            listen: config.listen.address.clone(),
            source,
        })?;
    if auth.local_mode() && !addr.ip().is_loopback() && !config.auth.allow_unauthenticated {
        return Err(ListenError::OpenWithoutCredentials(addr));
    }
    Ok(())
}

/// No credentials, and a listening address others can reach: `allow_unauthenticated`.
pub fn exposed_without_credentials(config: &Config) -> bool {
    let loopback = config
        .listen
        .address
        .parse::<SocketAddr>()
        .is_ok_and(|a| a.ip().is_loopback());
    !config.has_credentials() && config.auth.allow_unauthenticated && !loopback
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandcall_config::{key_hash, ApiKey};

    /// A principal's tier is the server's, or the stronger one its key or the JWTs pin
    /// it to; a pin never weakens it.
    #[test]
    fn a_principals_tier_is_the_servers_or_a_stronger_pin() {
        let key = |principal: &str, isolation| ApiKey {
            principal: principal.into(),
            sha256: key_hash(&format!("{principal}-key-1234567890")),
            isolation,
            egress: None,
        };
        for default in Isolation::ALL {
            let mut c = Config::default();
            c.host.isolation = default;
            c.auth.api_keys = vec![
                key("plain", None),
                key("pinned", Some(Isolation::Gvisor)),
                key("weaker", Some(Isolation::Namespace)),
                key("mixed", None),
                key("mixed", Some(Isolation::Gvisor)),
            ];
            c.auth.jwt.hs256_secret = Some("a-secret-of-thirty-two-bytes-or-more!".into());
            c.auth.jwt.allowed_algs = vec!["HS256".into()];
            c.auth.jwt.isolation = Some(Isolation::Gvisor);
            let a = Auth::new(&c).unwrap();
            let tier = |p: &str| a.isolation(&Principal(p.into()));
            assert_eq!(tier("plain"), default);
            assert_eq!(tier("pinned"), Isolation::Gvisor);
            assert_eq!(tier("weaker"), default, "a pin never weakens");
            assert_eq!(tier("mixed"), Isolation::Gvisor, "one pinned key pins its principal");
            assert_eq!(a.isolation(&Principal::of_jwt_user("t", "u")), Isolation::Gvisor);
        }
        assert_eq!(
            Auth::new(&Config::default())
                .unwrap()
                .isolation(&Principal(LOCAL.into())),
            Isolation::Namespace
        );
    }

    fn auth() -> Auth {
        let c = Config {
            auth: sandcall_config::AuthConfig {
                api_keys: vec![ApiKey {
                    principal: "alice".into(),
                    sha256: key_hash("alice-key-1234567890"),
                    isolation: None,
                    egress: None,
                }],
                ..Default::default()
            },
            ..Config::default()
        };
        Auth::new(&c).unwrap()
    }

    #[test]
    fn both_header_forms_name_the_principal() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer alice-key-1234567890".parse().unwrap());
        assert_eq!(auth().principal(&h).unwrap(), Principal("alice".into()));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "alice-key-1234567890".parse().unwrap());
        assert_eq!(auth().principal(&h).unwrap(), Principal("alice".into()));
    }

    #[test]
    fn missing_or_wrong_keys_are_401() {
        assert!(matches!(
            auth().principal(&HeaderMap::new()).unwrap_err(),
            AuthError::Unauthorized(_)
        ));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "nope".parse().unwrap());
        assert!(matches!(auth().principal(&h).unwrap_err(), AuthError::Unauthorized(_)));
    }

    /// A server with one API key (alice's) and an HS256 secret, HS256 allowed.
    fn both(api_key: bool) -> Auth {
        let c = Config {
            auth: sandcall_config::AuthConfig {
                api_keys: if api_key {
                    vec![ApiKey {
                        principal: "alice".into(),
                        sha256: key_hash("alice-key-1234567890"),
                        isolation: None,
                        egress: None,
                    }]
                } else {
                    Vec::new()
                },
                jwt: sandcall_config::JwtConfig {
                    hs256_secret: Some("dev-secret-dev-secret".into()),
                    allowed_algs: vec!["HS256".into()],
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Config::default()
        };
        Auth::new(&c).unwrap()
    }

    fn hs256_token(tenant: &str, sub: &str) -> String {
        let now = jwt::now();
        let claims = serde_json::json!({
            "iss": "librechat", "aud": "codeapi", "sub": sub, "tenant_id": tenant,
            "iat": now, "nbf": now, "exp": now + 60, "jti": "j",
            "principal_source": "librechat_jwt", "auth_context_hash": "h",
        });
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some("hs256-dev".into());
        let key = jsonwebtoken::EncodingKey::from_secret(b"dev-secret-dev-secret").unwrap();
        jsonwebtoken::encode(&header, &claims, &key).unwrap()
    }

    fn headers(name: &str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
        h
    }

    #[test]
    fn bearer_values_go_to_the_provider_they_belong_to() {
        let auth = both(true);
        assert!(!auth.local_mode());
        let token = hs256_token("legacy", "user-1");
        assert_eq!(
            auth.principal(&headers("authorization", &format!("Bearer {token}")))
                .unwrap(),
            Principal::of_jwt_user("legacy", "user-1")
        );
        assert_eq!(
            auth.principal(&headers("authorization", "Bearer alice-key-1234567890"))
                .unwrap(),
            Principal("alice".into())
        );
        // X-API-Key is always an API key.
        let refused = auth.principal(&headers("x-api-key", &token)).unwrap_err();
        assert_eq!(refused.to_string(), "the API key is not valid");
        // A JWT-shaped value that is not a valid JWT says which class of rule it broke.
        let refused = auth.principal(&headers("authorization", "Bearer a.b")).unwrap_err();
        assert!(matches!(refused, AuthError::Unauthorized(_)));
        assert!(refused.to_string().contains("malformed"), "{}", refused.to_string());
        let refused = auth
            .principal(&headers("authorization", "Bearer wrong-key"))
            .unwrap_err();
        assert_eq!(refused.to_string(), "the API key is not valid");
        let refused = auth.principal(&HeaderMap::new()).unwrap_err();
        assert!(
            refused.to_string().contains("JWT or API key"),
            "{}",
            refused.to_string()
        );
        assert!(
            auth.describe().starts_with("1 API key; JWT: issuer \"librechat\""),
            "{}",
            auth.describe()
        );
    }

    #[test]
    fn jwt_keys_alone_are_credentials() {
        let jwt_only = both(false);
        assert!(!jwt_only.local_mode(), "JWT keys alone are not local mode");
        let token = hs256_token("t", "u");
        assert!(jwt_only
            .principal(&headers("authorization", &format!("Bearer {token}")))
            .is_ok());
        let refused = jwt_only
            .principal(&headers("authorization", "Bearer some-key"))
            .unwrap_err();
        assert!(refused.to_string().contains("not a JWT"), "{}", refused.to_string());
        let c = Config {
            listen: sandcall_config::ListenConfig {
                address: "0.0.0.0:3112".into(),
                ..Default::default()
            },
            auth: sandcall_config::AuthConfig {
                jwt: sandcall_config::JwtConfig {
                    hs256_secret: Some("dev-secret-dev-secret".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Config::default()
        };
        assert!(check_listen(&c, &Auth::new(&c).unwrap()).is_ok());
        assert!(!exposed_without_credentials(&Config {
            auth: sandcall_config::AuthConfig {
                allow_unauthenticated: true,
                ..c.auth.clone()
            },
            ..c.clone()
        }));
        // Without JWT keys a JWT is just a key that is not valid.
        let refused = auth()
            .principal(&headers("authorization", &format!("Bearer {token}")))
            .unwrap_err();
        assert_eq!(refused.to_string(), "the API key is not valid");
    }

    #[test]
    fn local_mode_only_on_loopback() {
        let mut c = Config::default();
        assert!(check_listen(&c, &Auth::new(&c).unwrap()).is_ok());
        c.listen.address = "0.0.0.0:3112".into();
        let refusal = check_listen(&c, &Auth::new(&c).unwrap()).unwrap_err().to_string();
        assert!(refusal.contains("api_keys") && refusal.contains("allow_unauthenticated"));
        c.auth.allow_unauthenticated = true;
        assert!(check_listen(&c, &Auth::new(&c).unwrap()).is_ok());
        assert!(exposed_without_credentials(&c));
        assert!(!Auth::new(&c).unwrap().loopback_hosts_only);
        c.listen.address = "127.0.0.1:3112".into();
        assert!(!exposed_without_credentials(&c), "on loopback it stays local mode");
        c.listen.address = "0.0.0.0:3112".into();
        c.auth.allow_unauthenticated = false;
        c.auth.api_keys = vec![ApiKey {
            principal: "a".into(),
            sha256: key_hash("k"),
            isolation: None,
            egress: None,
        }];
        assert!(check_listen(&c, &Auth::new(&c).unwrap()).is_ok());
    }
}
