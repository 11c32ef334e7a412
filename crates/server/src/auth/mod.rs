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

use crate::config::Config;
use crate::error::ApiError;
use crate::listen::LocalAddr;
use crate::AppState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sandcall_api::error_type;
use std::net::SocketAddr;
use std::sync::Arc;

/// The principal a request acts for. Sessions and files belong to one.
///
/// The string is what the stores key by: an API key's principal name (letters, digits,
/// `_-.@`), `local`, or for a JWT `jwt:` and the JSON array `[tenant_id, sub]`. The
/// three forms cannot meet: only the JWT form has `:`, and JSON keeps every pair apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal(pub String);

/// The principal of local mode.
pub const LOCAL: &str = "local";

impl Principal {
    /// The principal of a LibreChat user: the pair (tenant, sub). `jwt` refuses control
    /// characters in both, so the file store's `principal \0 session \0 id` keys stay
    /// unambiguous.
    pub fn of_jwt_user(tenant: &str, sub: &str) -> Principal {
        Principal(format!("jwt:{}", serde_json::Value::from(vec![tenant, sub])))
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
}

impl Auth {
    /// Loads every credential: a JWT key source that cannot be read or parsed is an error
    /// (`serve` refuses to start, `doctor` fails, with this message).
    pub fn new(config: &Config) -> Result<Self, jwt::JwtConfigError> {
        Ok(Auth {
            api_keys: api_keys::ApiKeys::new(config),
            jwt: jwt::JwtVerifier::load(&config.jwt)?.map(Arc::new),
            loopback_hosts_only: !exposed_without_credentials(config),
        })
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
    pub fn principal(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        if self.local_mode() {
            return Ok(Principal(LOCAL.into()));
        }
        let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, error_type::UNAUTHORIZED, m);
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|k| !k.is_empty());
        if let Some(token) = bearer {
            if let Some(principal) = self.api_keys.principal(token) {
                return Ok(principal);
            }
            if let Some(verifier) = self.jwt.as_ref().filter(|_| jwt::looks_like_jwt(token)) {
                return match verifier.verify(token, jwt::now()) {
                    Ok(user) => Ok(Principal::of_jwt_user(&user.tenant, &user.sub)),
                    Err(refusal) => {
                        tracing::debug!(%refusal, "JWT refused");
                        Err(unauthorized(&format!("the JWT was refused: {refusal}")))
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

/// Local mode only on loopback: otherwise anyone who can reach the port runs code.
pub fn check_listen(config: &Config, auth: &Auth) -> Result<(), String> {
    let addr: SocketAddr = config
        .listen
        .parse()
        .map_err(|e| format!("listen {:?}: {e}", config.listen))?;
    if auth.local_mode() && !addr.ip().is_loopback() && !config.allow_unauthenticated {
        return Err(format!(
            "listening on {addr} with no api_keys would let anyone who reaches it run code: add a key \
             (`sandcall keys add NAME --config FILE`, or SANDCALL_API_KEYS), or LibreChat's JWT public key \
             ([jwt], or CODEAPI_JWT_PUBLIC_KEY and CODEAPI_JWT_KID), listen on 127.0.0.1, or, \
             on a private network where every host may run code, set allow_unauthenticated = true"
        ));
    }
    Ok(())
}

/// No credentials, and a listening address others can reach: `allow_unauthenticated`.
pub fn exposed_without_credentials(config: &Config) -> bool {
    let loopback = config.listen.parse::<SocketAddr>().is_ok_and(|a| a.ip().is_loopback());
    !config.has_credentials() && config.allow_unauthenticated && !loopback
}

/// Middleware: resolves the principal, or answers 401. In local mode it first refuses
/// what only a web page would send (`local_request_refusal`). `GET /v1/health` without
/// credentials passes with no principal (load balancers and probes have no key); with
/// credentials that are not valid it is 401 like every other route.
pub async fn authenticate(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    if state.auth.local_mode() {
        if let Some(refusal) = local_request_refusal(&req, state.auth.loopback_hosts_only) {
            return refusal.into_response();
        }
    } else if is_health(&req) && !has_credentials(req.headers()) {
        return next.run(req).await;
    }
    match state.auth.principal(req.headers()) {
        Ok(principal) => {
            req.extensions_mut().insert(principal);
            next.run(req).await
        }
        Err(e) => {
            let mut response = e.into_response();
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
            response
        }
    }
}

fn is_health(req: &Request) -> bool {
    req.uri().path() == "/v1/health" && matches!(*req.method(), Method::GET | Method::HEAD)
}

/// Any key header at all, valid or not.
fn has_credentials(headers: &HeaderMap) -> bool {
    headers.contains_key(header::AUTHORIZATION) || headers.contains_key("x-api-key")
}

/// Local mode has no key, so any web page the local user opens could otherwise call it:
/// with `fetch` from its own origin (the browser sends `Origin`), or after rebinding its
/// own host name to 127.0.0.1 (the browser sends that name as `Host`). Both are refused
/// here, before any handler runs; `JsonBody` refuses a body that does not say it is JSON.
fn local_request_refusal(req: &Request, loopback_hosts_only: bool) -> Option<ApiError> {
    // The authority of an absolute-form request target stands in for `Host`.
    let hosts = req.uri().authority().map(|a| a.as_str().to_owned()).into_iter().chain(
        req.headers()
            .get_all(header::HOST)
            .iter()
            .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned()),
    );
    for host in hosts.filter(|_| loopback_hosts_only) {
        if !is_loopback_host(&host) {
            return Some(ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                error_type::MISDIRECTED_REQUEST,
                "in local mode only requests to localhost, 127.0.0.0/8 or [::1] are served",
            ));
        }
    }
    let local = req.extensions().get::<LocalAddr>().map(|a| a.0);
    for origin in req.headers().get_all(header::ORIGIN) {
        if !local.is_some_and(|local| is_own_origin(origin.as_bytes(), local)) {
            return Some(ApiError::new(
                StatusCode::FORBIDDEN,
                error_type::FORBIDDEN_ORIGIN,
                "in local mode requests from web pages of other origins are refused",
            ));
        }
    }
    None
}

/// `Host` names this machine's loopback: `localhost`, an IPv4 literal in 127.0.0.0/8 or
/// `[::1]`, with or without a port. Subdomains of `localhost` are refused: nothing needs
/// them, and a resolver that sends them on to DNS would let a rebinding name through.
fn is_loopback_host(host: &str) -> bool {
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((ip, port)) => {
                return ip.parse::<std::net::Ipv6Addr>().is_ok_and(|ip| ip.is_loopback()) && is_port_suffix(port)
            }
            None => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        },
    };
    if let Some(port) = port {
        if port.is_empty() || port.parse::<u16>().is_err() {
            return false;
        }
    }
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// Empty, or `:` and a port number.
fn is_port_suffix(rest: &str) -> bool {
    rest.is_empty() || rest.strip_prefix(':').is_some_and(|p| p.parse::<u16>().is_ok())
}

/// `Origin` is the server's own: `http://` and 127.0.0.1, localhost, [::1] or the address
/// it was reached on, with its real port (browsers leave port 80 out).
fn is_own_origin(origin: &[u8], local: SocketAddr) -> bool {
    let Ok(origin) = std::str::from_utf8(origin) else {
        return false;
    };
    let port = local.port();
    let mut hosts = vec!["127.0.0.1".to_owned(), "localhost".to_owned(), "[::1]".to_owned()];
    hosts.push(match local.ip() {
        std::net::IpAddr::V4(ip) => ip.to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
    });
    hosts.iter().any(|host| {
        origin.eq_ignore_ascii_case(&format!("http://{host}:{port}"))
            || (port == 80 && origin.eq_ignore_ascii_case(&format!("http://{host}")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{key_hash, ApiKey};

    fn auth() -> Auth {
        let c = Config {
            api_keys: vec![ApiKey {
                principal: "alice".into(),
                sha256: key_hash("alice-key-1234567890"),
            }],
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
        assert_eq!(
            auth().principal(&HeaderMap::new()).unwrap_err().status,
            StatusCode::UNAUTHORIZED
        );
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "nope".parse().unwrap());
        assert_eq!(auth().principal(&h).unwrap_err().error_type, "unauthorized");
    }

    /// A server with one API key (alice's) and an HS256 secret, HS256 allowed.
    fn both(api_key: bool) -> Auth {
        let c = Config {
            api_keys: if api_key {
                vec![ApiKey {
                    principal: "alice".into(),
                    sha256: key_hash("alice-key-1234567890"),
                }]
            } else {
                Vec::new()
            },
            jwt: crate::config::JwtConfig {
                hs256_secret: Some("dev-secret-dev-secret".into()),
                allowed_algs: vec!["HS256".into()],
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
            axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
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
        assert_eq!(refused.message, "the API key is not valid");
        // A JWT-shaped value that is not a valid JWT says which rule it broke.
        let refused = auth.principal(&headers("authorization", "Bearer a.b")).unwrap_err();
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
        assert!(refused.message.contains("three segments"), "{}", refused.message);
        let refused = auth
            .principal(&headers("authorization", "Bearer wrong-key"))
            .unwrap_err();
        assert_eq!(refused.message, "the API key is not valid");
        let refused = auth.principal(&HeaderMap::new()).unwrap_err();
        assert!(refused.message.contains("JWT or API key"), "{}", refused.message);
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
        assert!(refused.message.contains("not a JWT"), "{}", refused.message);
        let c = Config {
            listen: "0.0.0.0:3112".into(),
            jwt: crate::config::JwtConfig {
                hs256_secret: Some("dev-secret-dev-secret".into()),
                ..Default::default()
            },
            ..Config::default()
        };
        assert!(check_listen(&c, &Auth::new(&c).unwrap()).is_ok());
        assert!(!exposed_without_credentials(&Config {
            allow_unauthenticated: true,
            ..c.clone()
        }));
        // Without JWT keys a JWT is just a key that is not valid.
        let refused = auth()
            .principal(&headers("authorization", &format!("Bearer {token}")))
            .unwrap_err();
        assert_eq!(refused.message, "the API key is not valid");
    }

    #[test]
    fn loopback_hosts() {
        for host in [
            "localhost",
            "LocalHost:3112",
            "127.0.0.1",
            "127.0.0.1:80",
            "127.8.9.10:65535",
            "[::1]",
            "[::1]:3112",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:3112",
            "localhost.evil.example",
            "a.localhost",
            "localhost.",
            "127.1",
            "0x7f.0.0.1",
            "128.0.0.1",
            "0.0.0.0",
            "10.0.0.1:3112",
            "[::2]",
            "[::ffff:127.0.0.1]",
            "[::1]x",
            "[::1]:",
            "localhost:",
            "localhost:99999",
            "localhost:80:80",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn own_origins() {
        let local: SocketAddr = "127.0.0.1:3112".parse().unwrap();
        for origin in ["http://127.0.0.1:3112", "http://localhost:3112", "http://[::1]:3112"] {
            assert!(is_own_origin(origin.as_bytes(), local), "{origin}");
        }
        for origin in [
            "http://127.0.0.1:3113",
            "http://127.0.0.1",
            "https://127.0.0.1:3112",
            "http://evil.example:3112",
            "http://localhost:3112.evil.example",
            "null",
            "",
        ] {
            assert!(!is_own_origin(origin.as_bytes(), local), "{origin}");
        }
        let other: SocketAddr = "127.0.0.2:80".parse().unwrap();
        assert!(is_own_origin(b"http://127.0.0.2", other));
        assert!(is_own_origin(b"http://localhost:80", other));
    }

    #[test]
    fn local_mode_only_on_loopback() {
        let mut c = Config::default();
        assert!(check_listen(&c, &Auth::new(&c).unwrap()).is_ok());
        c.listen = "0.0.0.0:3112".into();
        let refusal = check_listen(&c, &Auth::new(&c).unwrap()).unwrap_err();
        assert!(refusal.contains("api_keys") && refusal.contains("allow_unauthenticated"));
        c.allow_unauthenticated = true;
        assert!(check_listen(&c, &Auth::new(&c).unwrap()).is_ok());
        assert!(exposed_without_credentials(&c));
        assert!(!Auth::new(&c).unwrap().loopback_hosts_only);
        c.listen = "127.0.0.1:3112".into();
        assert!(!exposed_without_credentials(&c), "on loopback it stays local mode");
        c.listen = "0.0.0.0:3112".into();
        c.allow_unauthenticated = false;
        c.api_keys = vec![ApiKey {
            principal: "a".into(),
            sha256: key_hash("k"),
        }];
        assert!(check_listen(&c, &Auth::new(&c).unwrap()).is_ok());
    }
}
