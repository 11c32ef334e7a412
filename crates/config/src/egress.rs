//! Egress (docs/egress.md): which hosts runs may ever reach through the server's proxy,
//! which principals may use it, the address ranges it may reach anyway, and its bounds.
//! The rules' syntax is checked where they are parsed, at the server's start
//! (`sandcall_egress::HostRule`); this section checks what it can without it.

use serde::{Deserialize, Serialize};

/// EgressConfig: the keys of docs/configuration.md this section holds. Each field's doc
/// comment gives its unit and default.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct EgressConfig {
    /// The hosts a run may ever reach: `api.example.com`, `*.example.com` (subdomains),
    /// with optional ports (`host:443`, `host:80,443`; default 80 and 443). Empty (the
    /// default): no run has any network.
    pub egress_allow: Vec<String>,
    /// The principals that may ask for network (`network` of a request): API-key
    /// principals by name, `local` in local mode, `jwt:*` for every JWT principal, `*`
    /// for every principal. Default none.
    pub egress_principals: Vec<String>,
    /// Address ranges (CIDR) the proxy may connect to although they are loopback,
    /// private, link-local and so on, which it otherwise refuses. Default none.
    pub egress_allow_addresses: Vec<String>,
    /// Connections one run may open through the proxy, refused ones included. Default 32.
    pub egress_max_connections: u32,
    /// Bytes one run may send, and receive, through the proxy (each way). Default
    /// 104857600 (100 MiB).
    pub egress_max_bytes: u64,
    /// The longest one connection through the proxy may last, in seconds. Default 300.
    pub egress_connection_timeout_s: u32,
    /// Secrets the proxy puts into requests to their host (docs/egress.md, "Secrets");
    /// `[[egress_secrets]]` tables. Default none.
    pub egress_secrets: Vec<EgressSecret>,
    /// A PEM file of extra roots the proxy trusts for secret hosts' certificates, besides
    /// the distribution's trust store (private CAs, tests). Default none.
    pub egress_extra_roots: Option<std::path::PathBuf>,
}

/// One secret: for `host`'s `header`, its value from `env:NAME` or `file:/path` (read at
/// the server's start, never from a request); the program gets a placeholder in its
/// environment variable `env`; `principals` may use it (the same forms as
/// `egress_principals`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EgressSecret {
    pub host: String,
    pub header: String,
    pub env: String,
    pub value: String,
    #[serde(default)]
    pub principals: Vec<String>,
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            egress_allow: Vec::new(),
            egress_principals: Vec::new(),
            egress_allow_addresses: Vec::new(),
            egress_max_connections: 32,
            egress_max_bytes: 100 << 20,
            egress_connection_timeout_s: 300,
            egress_secrets: Vec::new(),
            egress_extra_roots: None,
        }
    }
}

/// The most connections a run may be allowed: the helper relays at most 64 at once,
/// and each costs the proxy a task and two sockets.
pub const MAX_EGRESS_CONNECTIONS: u32 = 10_000;

/// An egress setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    #[error("egress_max_connections must be between 1 and {MAX_EGRESS_CONNECTIONS}")]
    Connections,
    #[error("egress_max_bytes must be at least 1")]
    Bytes,
    #[error("egress_connection_timeout_s must be between 1 and 86400")]
    Timeout,
    #[error("egress_principals: {0:?} is not a principal (1 to 64 letters, digits, `_-.@`, or `*`)")]
    Principal(String),
    #[error("egress_secrets: {0}")]
    Secret(String),
}

impl EgressConfig {
    pub fn validate(&self) -> Result<(), EgressError> {
        if !(1..=MAX_EGRESS_CONNECTIONS).contains(&self.egress_max_connections) {
            return Err(EgressError::Connections);
        }
        if self.egress_max_bytes == 0 {
            return Err(EgressError::Bytes);
        }
        if !(1..=86_400).contains(&self.egress_connection_timeout_s) {
            return Err(EgressError::Timeout);
        }
        let bad_principal =
            |p: &&String| p.as_str() != "*" && (p.is_empty() || p.len() > 200 || p.contains(char::is_whitespace));
        if let Some(bad) = self.egress_principals.iter().find(bad_principal) {
            return Err(EgressError::Principal(bad.clone()));
        }
        for secret in &self.egress_secrets {
            let fail = |why: String| Err(EgressError::Secret(format!("the secret for {:?}: {why}", secret.host)));
            if !(secret.value.starts_with("env:") || secret.value.starts_with("file:")) {
                // Said without the value, which may be the secret itself.
                return fail("`value` must be `env:NAME` or `file:/path`".into());
            }
            let env_ok = !secret.env.is_empty()
                && !secret.env.starts_with(|c: char| c.is_ascii_digit())
                && secret.env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !env_ok {
                return fail(format!("`env` {:?} is not an environment variable name", secret.env));
            }
            if let Some(bad) = secret.principals.iter().find(bad_principal) {
                return fail(format!("{bad:?} is not a principal"));
            }
        }
        Ok(())
    }

    /// Whether `principal` is one of `principals` (names, `jwt:*`, `*`).
    pub fn names(principals: &[String], principal: &str) -> bool {
        principals
            .iter()
            .any(|p| p == "*" || p == principal || (p == "jwt:*" && principal.starts_with("jwt:")))
    }

    /// Whether `principal`'s runs may have network at all.
    pub fn allows(&self, principal: &str) -> bool {
        !self.egress_allow.is_empty() && Self::names(&self.egress_principals, principal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked_and_principals_named() {
        let ok = EgressConfig::default();
        assert!(ok.validate().is_ok());
        for (bad, says) in [
            (
                EgressConfig {
                    egress_max_connections: 0,
                    ..ok.clone()
                },
                "egress_max_connections",
            ),
            (
                EgressConfig {
                    egress_max_bytes: 0,
                    ..ok.clone()
                },
                "egress_max_bytes",
            ),
            (
                EgressConfig {
                    egress_connection_timeout_s: 0,
                    ..ok.clone()
                },
                "egress_connection_timeout_s",
            ),
            (
                EgressConfig {
                    egress_principals: vec!["a b".into()],
                    ..ok.clone()
                },
                "egress_principals",
            ),
        ] {
            assert!(bad.validate().unwrap_err().to_string().contains(says), "{bad:?}");
        }
    }

    #[test]
    fn only_named_principals_of_a_server_with_hosts_may_have_network() {
        let mut c = EgressConfig {
            egress_principals: vec!["alice".into(), "jwt:*".into()],
            ..Default::default()
        };
        // No hosts: nobody, whoever is named.
        assert!(!c.allows("alice"));
        c.egress_allow = vec!["api.example.com".into()];
        assert!(c.allows("alice"));
        assert!(c.allows(r#"jwt:["t","u"]"#));
        assert!(!c.allows("bob"));
        assert!(!c.allows("local"));
        c.egress_principals = vec!["*".into()];
        assert!(c.allows("bob") && c.allows("local"));
    }

    #[test]
    fn a_secret_value_is_a_source_never_a_literal_and_its_env_a_name() {
        let secret = |env: &str, value: &str| EgressConfig {
            egress_secrets: vec![EgressSecret {
                host: "api.example.com".into(),
                header: "authorization".into(),
                env: env.into(),
                value: value.into(),
                principals: vec!["*".into()],
            }],
            ..EgressConfig::default()
        };
        assert!(secret("API_KEY", "env:API_KEY").validate().is_ok());
        assert!(secret("API_KEY", "file:/etc/key").validate().is_ok());
        let literal = secret("API_KEY", "sk-live-123").validate().unwrap_err().to_string();
        assert!(literal.contains("env:NAME"), "{literal}");
        assert!(!literal.contains("sk-live-123"), "{literal}");
        for env in ["", "1KEY", "API-KEY", "A B"] {
            assert!(secret(env, "env:X").validate().is_err(), "{env:?}");
        }
    }
}
