//! Who is calling: API keys map to principals; without keys, everyone is the one local
//! principal. Every route runs behind `authenticate`.

use crate::config::{key_hash, Config};
use crate::error::ApiError;
use crate::AppState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::net::SocketAddr;

/// The principal a request acts for. Sessions and files belong to one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal(pub String);

/// The principal of local mode.
pub const LOCAL: &str = "local";

#[derive(Clone)]
pub struct Auth {
    /// Hex SHA-256 of a key -> principal. Empty: local mode.
    keys: HashMap<String, String>,
}

impl Auth {
    pub fn new(config: &Config) -> Self {
        Auth {
            keys: config
                .api_keys
                .iter()
                .map(|k| (k.sha256.to_ascii_lowercase(), k.principal.clone()))
                .collect(),
        }
    }

    pub fn local_mode(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key from `Authorization: Bearer` or `X-API-Key`, checked.
    pub fn principal(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        if self.local_mode() {
            return Ok(Principal(LOCAL.into()));
        }
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")));
        let key = bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
        let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, sandcall_api::error_type::UNAUTHORIZED, m);
        let key = key.map(str::trim).filter(|k| !k.is_empty()).ok_or_else(|| {
            unauthorized("an API key is required: send `Authorization: Bearer <key>` or `X-API-Key: <key>`")
        })?;
        self.keys
            .get(&key_hash(key))
            .map(|p| Principal(p.clone()))
            .ok_or_else(|| unauthorized("the API key is not valid"))
    }
}

/// Local mode only on loopback: otherwise anyone who can reach the port runs code.
pub fn check_listen(config: &Config, auth: &Auth) -> Result<(), String> {
    let addr: SocketAddr = config
        .listen
        .parse()
        .map_err(|e| format!("listen {:?}: {e}", config.listen))?;
    if auth.local_mode() && !addr.ip().is_loopback() {
        return Err(format!(
            "listening on {addr} with no api_keys would let anyone who reaches it run code: add a key \
             (`sandcall keys add NAME --config FILE`, or SANDCALL_API_KEYS) or listen on 127.0.0.1"
        ));
    }
    Ok(())
}

/// Middleware: resolves the principal, or answers 401.
pub async fn authenticate(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ApiKey;

    fn auth() -> Auth {
        let c = Config {
            api_keys: vec![ApiKey {
                principal: "alice".into(),
                sha256: key_hash("alice-key-1234567890"),
            }],
            ..Config::default()
        };
        Auth::new(&c)
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

    #[test]
    fn local_mode_only_on_loopback() {
        let mut c = Config::default();
        assert!(check_listen(&c, &Auth::new(&c)).is_ok());
        c.listen = "0.0.0.0:3112".into();
        assert!(check_listen(&c, &Auth::new(&c)).unwrap_err().contains("api_keys"));
        c.api_keys = vec![ApiKey {
            principal: "a".into(),
            sha256: key_hash("k"),
        }];
        assert!(check_listen(&c, &Auth::new(&c)).is_ok());
    }
}
