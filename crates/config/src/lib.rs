//! Configuration: defaults, then the TOML file, then `SANDCALL_*` environment variables,
//! then command-line flags. docs/configuration.md lists every key; a test keeps the two
//! in step.
//!
//! The file is flat (`memory_limit_mb = 512`, not `[limits]`), and so is the environment;
//! in the code the keys are grouped by concern into sections, each with its own checks and
//! its own error: `listen`, `host`, `limits`, `sessions`, `files`, `auth`, `languages`,
//! `cluster`. `Config::load` reads each section out of the same merged keys, refuses a key
//! that no section has, then checks each section and the few rules that span two.

// Configuration errors are answered at start, not on request paths (tests may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod auth;
pub mod cluster;
pub mod egress;
pub mod files;
pub mod host;
pub mod languages;
pub mod limits;
pub mod listen;
pub mod rate;
pub mod sessions;

pub use auth::{key_hash, ApiKey, AuthConfig, AuthConfigError, JwtConfig};
pub use cluster::{ClusterConfig, ClusterError};
pub use egress::{EgressConfig, EgressError, EgressSecret};
pub use files::{ExecutionProfile, FilesConfig, FilesError};
pub use host::{HostConfig, HostError, Isolation};
pub use languages::{LanguageConfig, LanguagesConfig, LanguagesError};
pub use limits::{LimitsConfig, LimitsError};
pub use listen::{ListenConfig, ListenError};
pub use sessions::{McpServerConfig, SessionsConfig, SessionsError, TimeoutScope};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Every server setting, by section. Serialized, it is the flat map of every key.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Config {
    #[serde(flatten)]
    pub listen: ListenConfig,
    #[serde(flatten)]
    pub host: HostConfig,
    #[serde(flatten)]
    pub limits: LimitsConfig,
    #[serde(flatten)]
    pub sessions: SessionsConfig,
    #[serde(flatten)]
    pub files: FilesConfig,
    #[serde(flatten)]
    pub auth: AuthConfig,
    #[serde(flatten)]
    pub languages: LanguagesConfig,
    #[serde(flatten)]
    pub cluster: ClusterConfig,
    #[serde(flatten)]
    pub egress: EgressConfig,
}

/// Ceilings for the limits a request may set in `limits`: the same fields as the
/// request's own `limits` object (one type, so the two cannot drift apart). Unset means
/// "the default".
pub use sandcall_api::RequestLimits as Ceilings;

/// Values given as command-line flags, which win over everything else.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<String>,
    pub data_dir: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Parse(#[from] Box<figment::Error>),
    #[error("configuration: unknown key `{0}`: docs/configuration.md lists every key")]
    UnknownKey(String),
    #[error("configuration: {0}")]
    Invalid(String),
    #[error("configuration: {0}")]
    Listen(#[from] ListenError),
    #[error("configuration: {0}")]
    Host(#[from] HostError),
    #[error("configuration: {0}")]
    Limits(#[from] LimitsError),
    #[error("configuration: {0}")]
    Sessions(#[from] SessionsError),
    #[error("configuration: {0}")]
    Files(#[from] FilesError),
    #[error("configuration: {0}")]
    Auth(#[from] AuthConfigError),
    #[error("configuration: {0}")]
    Languages(#[from] LanguagesError),
    #[error("configuration: {0}")]
    Cluster(#[from] ClusterError),
    #[error("configuration: {0}")]
    Egress(#[from] EgressError),
    #[error("configuration: session_store = redis://... needs node_url: how the other nodes reach this one")]
    RedisWithoutNodeUrl,
    #[error(
        "configuration: session_store = redis://... needs peer_urls: the node_url of every node, the only \
         URLs a request is forwarded to"
    )]
    RedisWithoutPeerUrls,
}

/// The top-level keys, for filtering the environment: only `SANDCALL_<KEY>` variables
/// that name a real key are read, so SANDCALL_LOG and friends do not trip the strict
/// check that catches typos in the file.
fn known_keys() -> Vec<String> {
    match serde_json::to_value(Config::default()) {
        Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

impl Config {
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError::Invalid(format!(
                    "config file {} does not exist",
                    file.display()
                )));
            }
            figment = figment.merge(Toml::file(file));
        }
        let keys = known_keys();
        // The filter sees the variable's name without the prefix, as written
        // (CEILINGS__MEMORY_LIMIT_MB), before `split` turns `__` into nesting.
        // SANDCALL_API_KEYS holds plain keys in its own format, read below.
        let env = Env::prefixed("SANDCALL_").filter(move |k| {
            let top = k.as_str().split("__").next().unwrap_or("");
            !top.eq_ignore_ascii_case("api_keys") && keys.iter().any(|known| known.eq_ignore_ascii_case(top))
        });
        figment = figment.merge(env.split("__"));
        figment = merge_codeapi_jwt_env(figment)?;
        if let Some(listen) = &overrides.listen {
            figment = figment.merge(Serialized::default("listen", listen));
        }
        if let Some(dir) = &overrides.data_dir {
            figment = figment.merge(Serialized::default("data_dir", dir));
        }
        let mut config = Config::extract(&figment)?;
        // The stateful profile is workspaces.
        if config.files.execution_profile == ExecutionProfile::Stateful {
            config.files.workspaces = true;
        }
        if let Ok(value) = std::env::var("SANDCALL_API_KEYS") {
            config.auth.api_keys.extend(parse_env_keys(&value)?);
        }
        config.validate()?;
        Ok(config)
    }

    /// Each section out of the merged keys, after refusing any key no section has.
    fn extract(figment: &Figment) -> Result<Config, ConfigError> {
        let given: figment::value::Dict = figment.extract().map_err(Box::new)?;
        let known = known_keys();
        if let Some(unknown) = given.keys().find(|k| !known.contains(k)) {
            return Err(ConfigError::UnknownKey(unknown.clone()));
        }
        let section = |e| ConfigError::Parse(Box::new(e));
        Ok(Config {
            listen: figment.extract().map_err(section)?,
            host: figment.extract().map_err(section)?,
            limits: figment.extract().map_err(section)?,
            sessions: figment.extract().map_err(section)?,
            files: figment.extract().map_err(section)?,
            auth: figment.extract().map_err(section)?,
            languages: figment.extract().map_err(section)?,
            cluster: figment.extract().map_err(section)?,
            egress: figment.extract().map_err(section)?,
        })
    }

    /// Each section's own checks, then the rules that span two sections.
    fn validate(&self) -> Result<(), ConfigError> {
        self.listen.validate()?;
        self.limits.validate()?;
        self.sessions.validate()?;
        self.files.validate()?;
        self.auth.validate()?;
        self.host.validate()?;
        self.cluster.validate()?;
        self.languages.validate()?;
        self.egress.validate()?;
        if self.sessions.in_redis() && self.cluster.node_url.is_none() {
            return Err(ConfigError::RedisWithoutNodeUrl);
        }
        if self.sessions.in_redis() && self.cluster.peer_urls.is_empty() {
            return Err(ConfigError::RedisWithoutPeerUrls);
        }
        Ok(())
    }

    pub fn has_credentials(&self) -> bool {
        self.auth.has_credentials()
    }

    /// Whether some principal's runs are in the gvisor tier whatever a request asks:
    /// the server's `isolation`, or a key's pin.
    pub fn pins_gvisor(&self) -> bool {
        let gvisor = |i: Option<Isolation>| i == Some(Isolation::Gvisor);
        self.host.isolation == Isolation::Gvisor
            || self.auth.api_keys.iter().any(|k| gvisor(k.isolation))
            || (self.auth.jwt.has_key_source() && gvisor(self.auth.jwt.isolation))
    }

    /// The default wall-clock budget of a run, in ms.
    pub fn default_run_timeout_ms(&self) -> u64 {
        self.limits.default_run_timeout_ms()
    }

    /// How many runs may wait for a slot.
    pub fn queue_length(&self) -> usize {
        self.limits.queue_length()
    }

    /// Sessions one principal may hold at once (`max_sessions_per_principal`).
    pub fn sessions_per_principal(&self) -> usize {
        let default = if !self.has_credentials() {
            self.sessions.max_sessions
        } else {
            (self.sessions.max_sessions / 4).max(1)
        };
        self.sessions.max_sessions_per_principal.unwrap_or(default)
    }

    /// The rate of a group of routes, if it has one (checked by `validate`).
    pub fn rate_limit(&self, group: rate::Group) -> Option<rate::Rate> {
        self.limits.rate_limit(group)
    }

    /// Runs one principal may have running or queued (`max_runs_per_principal`).
    pub fn runs_per_principal(&self) -> usize {
        let default = if !self.has_credentials() {
            usize::MAX
        } else {
            (self.limits.max_concurrent_runs / 2).max(1)
        };
        self.limits.max_runs_per_principal.unwrap_or(default)
    }

    /// The request body limit: code and stdin at their maxima, plus room for the rest.
    pub fn max_body_bytes(&self) -> usize {
        self.limits.max_body_bytes()
    }

    /// The body limit of `POST /v1/exec/programmatic`: a resume may carry three results
    /// of `max_tool_result_bytes` (more at once go in parts: a resume may answer some
    /// of the pending calls), and never less than any other JSON route.
    pub fn max_programmatic_body_bytes(&self) -> usize {
        let results = self
            .sessions
            .max_tool_result_bytes
            .saturating_mul(3)
            .saturating_add(1 << 20);
        self.max_body_bytes()
            .max(usize::try_from(results).unwrap_or(usize::MAX))
    }
}

/// The Code Interpreter API's variables and the `[jwt]` keys they set. Read as plain
/// text (a JWKS or a PEM must not go through figment's value parsing); an empty one is
/// unset, as there.
const CODEAPI_JWT_ENV: &[(&str, &str)] = &[
    ("CODEAPI_JWT_JWKS_JSON", "jwks_json"),
    ("CODEAPI_JWT_PUBLIC_KEYS_DIR", "public_keys_dir"),
    ("CODEAPI_JWT_PUBLIC_KEY", "public_key"),
    // CODEAPI_JWT_KID wins over its older name.
    ("CODEAPI_JWT_KEY_ID", "kid"),
    ("CODEAPI_JWT_KID", "kid"),
    ("CODEAPI_JWT_HS256_SECRET", "hs256_secret"),
    ("CODEAPI_JWT_HS256_KID", "hs256_kid"),
    ("CODEAPI_JWT_ALLOWED_ALGS", "allowed_algs"),
    ("CODEAPI_JWT_ISSUER", "issuer"),
    ("CODEAPI_JWT_AUDIENCE", "audience"),
    ("CODEAPI_JWT_CLOCK_SKEW_SECONDS", "clock_skew_seconds"),
    ("CODEAPI_JWT_MAX_TTL_SECONDS", "max_ttl_seconds"),
    ("CODEAPI_JWT_SINGLE_TENANT_ID", "single_tenant_id"),
];

/// Merges the `CODEAPI_JWT_*` variables that are set over `figment`.
fn merge_codeapi_jwt_env(mut figment: Figment) -> Result<Figment, ConfigError> {
    if std::env::var_os("CODEAPI_JWT_TRUST_ENTRIES_JSON").is_some() {
        return Err(ConfigError::Invalid(
            "CODEAPI_JWT_TRUST_ENTRIES_JSON is not supported: set CODEAPI_JWT_ISSUER, CODEAPI_JWT_AUDIENCE and \
             CODEAPI_JWT_ALLOWED_ALGS (or [jwt] in the config file) instead"
                .into(),
        ));
    }
    for (var, key) in CODEAPI_JWT_ENV {
        let value = match std::env::var(var) {
            Ok(v) if v.trim().is_empty() => continue,
            Ok(v) => v,
            Err(std::env::VarError::NotPresent) => continue,
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(ConfigError::Invalid(format!("{var} is not valid UTF-8")))
            }
        };
        let path = format!("jwt.{key}");
        figment = if key.ends_with("_seconds") {
            let n: u64 = value
                .trim()
                .parse()
                .map_err(|_| ConfigError::Invalid(format!("{var} must be a whole number of seconds")))?;
            figment.merge(Serialized::default(&path, n))
        } else {
            figment.merge(Serialized::default(&path, value))
        };
    }
    Ok(figment)
}

/// Parses SANDCALL_API_KEYS: `principal:key,principal:key`.
pub fn parse_env_keys(value: &str) -> Result<Vec<ApiKey>, ConfigError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|entry| match entry.split_once(':') {
            Some((principal, key)) if auth::valid_principal(principal) && key.len() >= 16 => Ok(ApiKey {
                principal: principal.to_owned(),
                sha256: key_hash(key),
                isolation: None,
                egress: None,
            }),
            _ => Err(ConfigError::Invalid(
                "SANDCALL_API_KEYS must be principal:key pairs separated by commas, keys of 16 characters or more"
                    .into(),
            )),
        })
        .collect()
}

/// `sandcall keys add NAME`: makes a new key, appends its hash to the config file
/// (created if missing, mode 0600) and returns the key, which is not kept anywhere.
pub fn add_key(config_file: &Path, principal: &str) -> Result<String, ConfigError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if !auth::valid_principal(principal) {
        return Err(ConfigError::Invalid(
            "a principal is 1 to 64 letters, digits, `_-.@`".into(),
        ));
    }
    let key = format!("sc_{}{}", sandcall_api::ids::new_id(), sandcall_api::ids::new_id());
    let entry = format!(
        "\n[[api_keys]]\nprincipal = \"{principal}\"\nsha256 = \"{}\"\n",
        key_hash(&key)
    );
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(config_file)
        .map_err(|e| ConfigError::Invalid(format!("open {}: {e}", config_file.display())))?;
    file.write_all(entry.as_bytes())
        .map_err(|e| ConfigError::Invalid(format!("write {}: {e}", config_file.display())))?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcp_servers_need_a_name_and_a_command_and_unique_names() {
        let server = |name: &str, command: &str| McpServerConfig {
            name: name.into(),
            command: command.into(),
            ..Default::default()
        };
        let mut c = Config {
            sessions: SessionsConfig {
                mcp_servers: vec![server("weather", "/bin/weather"), server("files", "files-mcp")],
                ..Default::default()
            },
            ..Config::default()
        };
        assert!(c.validate().is_ok());
        c.sessions.mcp_servers.push(server("weather", "/bin/other"));
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("mcp_servers[2]") && e.contains("taken"), "{e}");
        c.sessions.mcp_servers = vec![server("", "/bin/x")];
        assert!(c.validate().is_err());
        c.sessions.mcp_servers = vec![server("x", "")];
        assert!(c.validate().is_err());
    }

    #[test]
    fn a_redis_session_store_needs_a_node_url_and_a_shared_token_secret() {
        let secret = "ab".repeat(32);
        let with = |store: Option<&str>, node: Option<&str>, secret: Option<&str>| {
            Config {
                sessions: SessionsConfig {
                    session_store: store.map(str::to_owned),
                    token_secret: secret.map(str::to_owned),
                    ..Default::default()
                },
                cluster: ClusterConfig {
                    node_url: node.map(str::to_owned),
                    peer_urls: vec!["http://10.0.0.1:8080".into(), "http://10.0.0.2:8080".into()],
                    ..Default::default()
                },
                ..Config::default()
            }
            .validate()
        };
        assert!(with(None, None, None).is_ok());
        assert!(with(Some("embedded"), None, None).is_ok());
        let redis = Some("redis://127.0.0.1:6379/0");
        assert!(with(redis, Some("http://10.0.0.1:8080"), Some(&secret)).is_ok());
        for (store, node, secret, says) in [
            (redis, None, Some(secret.as_str()), "node_url"),
            (redis, Some("http://10.0.0.1:8080"), None, "token_secret"),
            (Some("memcached://x"), None, None, "session_store"),
            (None, Some("10.0.0.1:8080"), None, "node_url"),
            (None, Some("http://10.0.0.1:8080/path"), None, "node_url"),
        ] {
            let err = with(store, node, secret).unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        }
        // A cluster node names its peers: the only URLs it forwards to.
        let mut c = Config {
            sessions: SessionsConfig {
                session_store: redis.map(str::to_owned),
                token_secret: Some(secret.clone()),
                ..Default::default()
            },
            cluster: ClusterConfig {
                node_url: Some("http://10.0.0.1:8080".into()),
                ..Default::default()
            },
            ..Config::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("peer_urls"), "{err}");
        c.cluster.peer_urls = vec!["http://10.0.0.2:8080/x".into()];
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("peer_urls"), "{err}");
        c.cluster.peer_urls = vec!["http://10.0.0.2:8080".into()];
        assert!(c.validate().is_ok());
    }

    #[test]
    fn defaults_match_the_documented_table() {
        let c = Config::default();
        assert_eq!(c.listen.address, "127.0.0.1:3112");
        assert_eq!(c.limits.max_run_timeout_ms, 300_000);
        assert_eq!(c.limits.max_output_bytes, 65_536);
        assert_eq!(c.limits.memory_limit_mb, 512);
        assert_eq!(c.limits.max_processes, 128);
        assert_eq!(c.limits.workspace_limit_mb, 256);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn warm_languages_must_name_languages() {
        let mut c = Config::default();
        assert_eq!(
            c.languages.warm_languages,
            ["python", "bash", "javascript", "typescript"]
        );
        c.languages.warm_languages = vec!["js".into(), "PY".into()];
        assert!(c.validate().is_ok());
        c.languages.warm_languages = vec!["python".into(), "cobol".into()];
        assert!(c.validate().is_err());
    }

    #[test]
    fn a_principals_template_is_kept_idle_for_at_least_a_second() {
        let mut c = Config::default();
        assert_eq!(
            (c.languages.zygote_templates, c.languages.zygote_template_idle_s),
            (16, 300)
        );
        c.languages.zygote_template_idle_s = 1;
        assert!(c.validate().is_ok());
        c.languages.zygote_template_idle_s = 0;
        assert!(c.validate().is_err());
    }

    #[test]
    fn declared_languages_are_checked() {
        let awk = LanguageConfig {
            names: vec!["awk".into()],
            code_file: "main.awk".into(),
            run: "awk -f \"$CODE\"".into(),
            ..LanguageConfig::default()
        };
        let check = |l: LanguageConfig| {
            let c = Config {
                languages: LanguagesConfig {
                    declared: vec![l],
                    ..Default::default()
                },
                ..Config::default()
            };
            c.validate().map_err(|e| e.to_string())
        };
        assert!(check(awk.clone()).is_ok());
        for (bad, why) in [
            (
                LanguageConfig {
                    names: vec![],
                    ..awk.clone()
                },
                "at least one name",
            ),
            (
                LanguageConfig {
                    names: vec!["rs".into()],
                    ..awk.clone()
                },
                "already a language's name",
            ),
            (
                LanguageConfig {
                    names: vec!["a b".into()],
                    ..awk.clone()
                },
                "letters, digits",
            ),
            (
                LanguageConfig {
                    code_file: "../x".into(),
                    ..awk.clone()
                },
                "plain file name",
            ),
            (
                LanguageConfig {
                    code_file: "runner.py".into(),
                    ..awk.clone()
                },
                "plain file name",
            ),
            (
                LanguageConfig {
                    run: " ".into(),
                    ..awk.clone()
                },
                "must not be blank",
            ),
            (
                LanguageConfig {
                    compile: Some("".into()),
                    ..awk.clone()
                },
                "must not be blank",
            ),
            (
                LanguageConfig {
                    tools: vec!["bin/awk".into()],
                    ..awk.clone()
                },
                "absolute paths",
            ),
            (
                LanguageConfig {
                    paths: vec!["opt/x".into()],
                    ..awk.clone()
                },
                "must be absolute",
            ),
        ] {
            let err = check(bad).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
        // Two languages may not share a name.
        let c = Config {
            languages: LanguagesConfig {
                declared: vec![
                    awk.clone(),
                    LanguageConfig {
                        names: vec!["AWK".into()],
                        ..awk
                    },
                ],
                ..Default::default()
            },
            ..Config::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("already a language's name"));
        let c = Config {
            languages: LanguagesConfig {
                toolchain_path: vec!["usr/bin".into()],
                ..Default::default()
            },
            ..Config::default()
        };
        assert!(c.validate().is_err());
    }

    #[test]
    fn warm_preload_takes_module_names_only() {
        let mut c = Config::default();
        assert_eq!(c.languages.warm_preload, ["numpy", "pandas", "matplotlib.pyplot"]);
        assert!(c.validate().is_ok());
        for bad in ["", "os; import x", "a..b", "1abc", "a-b", ".a"] {
            c.languages.warm_preload = vec![bad.into()];
            assert!(c.validate().is_err(), "{bad:?} accepted");
        }
        c.languages.warm_preload = vec!["scipy.stats".into(), "_x1".into()];
        assert!(c.validate().is_ok());
        c.languages.warm_preload = Vec::new();
        assert!(c.validate().is_ok());
    }

    #[test]
    fn every_key_is_documented() {
        let doc = include_str!("../../../docs/configuration.md");
        for key in known_keys() {
            assert!(
                doc.contains(&format!("`{key}`")),
                "docs/configuration.md does not describe `{key}`"
            );
        }
        let jwt = serde_json::to_value(JwtConfig::default()).unwrap();
        for key in jwt.as_object().unwrap().keys() {
            assert!(
                doc.contains(&format!("`jwt.{key}`")),
                "docs/configuration.md does not describe `jwt.{key}`"
            );
        }
        for (var, _) in CODEAPI_JWT_ENV {
            assert!(doc.contains(var), "docs/configuration.md does not name {var}");
        }
        let ceilings = serde_json::to_value(Ceilings::default()).unwrap();
        for key in ceilings.as_object().unwrap().keys() {
            assert!(
                doc.contains(&format!("`ceilings.{key}`")),
                "docs/configuration.md does not describe `ceilings.{key}`"
            );
        }
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail closure signature
    fn file_then_env_then_flags() {
        let dir = std::env::temp_dir().join(format!("sandcall-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(
            &file,
            "memory_limit_mb = 256\nmax_processes = 64\nlisten = \"127.0.0.1:9\"\n[ceilings]\nmemory_limit_mb = 1024\n",
        )
        .unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("SANDCALL_MAX_PROCESSES", "32");
            jail.set_env("SANDCALL_LOG", "debug");
            let c = Config::load(
                Some(&file),
                &Overrides {
                    listen: Some("127.0.0.1:7".into()),
                    data_dir: None,
                },
            )
            .map_err(|e| e.to_string())?;
            assert_eq!(c.limits.memory_limit_mb, 256);
            assert_eq!(c.limits.max_processes, 32);
            assert_eq!(c.listen.address, "127.0.0.1:7");
            assert_eq!(c.limits.ceilings.memory_limit_mb, Some(1024));
            Ok(())
        });
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail closure signature
    fn programmatic_timeout_scope_and_result_size() {
        let c = Config::default();
        assert_eq!(c.sessions.programmatic_timeout_scope, TimeoutScope::Run);
        assert_eq!(c.sessions.max_tool_result_bytes, 5 << 20);
        // Three results of 5 MiB and room for the rest.
        assert_eq!(c.max_programmatic_body_bytes(), 16 << 20);
        figment::Jail::expect_with(|jail| {
            jail.set_env("SANDCALL_PROGRAMMATIC_TIMEOUT_SCOPE", "loop");
            jail.set_env("SANDCALL_MAX_TOOL_RESULT_BYTES", "1024");
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.sessions.programmatic_timeout_scope, TimeoutScope::Loop);
            // Never below the other JSON routes' limit.
            assert_eq!(c.max_programmatic_body_bytes(), c.max_body_bytes());
            jail.set_env("SANDCALL_PROGRAMMATIC_TIMEOUT_SCOPE", "forever");
            assert!(Config::load(None, &Overrides::default()).is_err());
            jail.set_env("SANDCALL_PROGRAMMATIC_TIMEOUT_SCOPE", "run");
            jail.set_env("SANDCALL_MAX_TOOL_RESULT_BYTES", "0");
            let err = Config::load(None, &Overrides::default()).unwrap_err().to_string();
            assert!(err.contains("max_tool_result_bytes"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_in_the_file_are_refused() {
        let dir = std::env::temp_dir().join(format!("sandcall-config-typo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(&file, "memory_limt_mb = 256\n").unwrap();
        let err = Config::load(Some(&file), &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("memory_limt_mb"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lowering_the_timeout_ceiling_alone_lowers_the_default() {
        let c = Config {
            limits: LimitsConfig {
                max_run_timeout_ms: 1000,
                ..Default::default()
            },
            ..Config::default()
        };
        assert!(c.validate().is_ok());
        assert_eq!(c.default_run_timeout_ms(), 1000);
        let c = Config {
            limits: LimitsConfig {
                max_concurrent_runs: 3,
                ..Default::default()
            },
            ..Config::default()
        };
        assert_eq!(c.queue_length(), 12);
    }

    #[test]
    fn env_keys_are_hashed_and_checked() {
        let keys = parse_env_keys("alice:key-a-1234567890, bob:key-b-1234567890").unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].principal, "alice");
        assert_eq!(keys[0].sha256, key_hash("key-a-1234567890"));
        assert!(!keys[0].sha256.contains("key-a"));
        assert!(parse_env_keys("alice").is_err());
        assert!(parse_env_keys("alice:short").is_err());
        assert!(parse_env_keys("bad name:key-a-1234567890").is_err());
    }

    #[test]
    fn added_keys_are_stored_as_hashes() {
        let dir = std::env::temp_dir().join(format!("sandcall-keys-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(&file, "memory_limit_mb = 256\n").unwrap();
        let key = add_key(&file, "alice").unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!text.contains(&key));
        let c = Config::load(Some(&file), &Overrides::default()).unwrap();
        assert_eq!(c.limits.memory_limit_mb, 256);
        assert_eq!(
            c.auth.api_keys,
            vec![ApiKey {
                principal: "alice".into(),
                sha256: key_hash(&key),
                isolation: None,
                egress: None,
            }]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail closure signature
    fn the_stateful_profile_turns_workspaces_on() {
        figment::Jail::expect_with(|jail| {
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.files.execution_profile, ExecutionProfile::Default);
            assert!(!c.files.workspaces);
            jail.create_file("c.toml", "execution_profile = \"stateful\"\nworkspaces = false\n")?;
            let c = Config::load(Some(Path::new("c.toml")), &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.files.execution_profile, ExecutionProfile::Stateful);
            assert!(c.files.workspaces, "stateful is workspaces");
            jail.set_env("SANDCALL_EXECUTION_PROFILE", "warm");
            let err = Config::load(None, &Overrides::default()).unwrap_err().to_string();
            assert!(err.contains("execution_profile") || err.contains("warm"), "{err}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail closure signature
    fn jwt_settings_from_the_file_and_the_codeapi_variables() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "c.toml",
                "[jwt]\nissuer = \"from-file\"\naudience = \"file-aud\"\nallowed_algs = [\"EdDSA\"]\n",
            )?;
            let c = Config::load(Some(Path::new("c.toml")), &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.auth.jwt.issuer, "from-file");
            assert_eq!(c.auth.jwt.allowed_algs, ["EdDSA"]);
            assert!(!c.has_credentials(), "no key source yet");
            let jwks = r#"{"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "abc", "kid": "k1"}]}"#;
            let pem = "-----BEGIN PUBLIC KEY-----\\nMCowBQYDK2VwAyEA\\n-----END PUBLIC KEY-----";
            jail.set_env("CODEAPI_JWT_JWKS_JSON", jwks);
            jail.set_env("CODEAPI_JWT_PUBLIC_KEY", pem);
            jail.set_env("CODEAPI_JWT_KEY_ID", "old-name");
            jail.set_env("CODEAPI_JWT_KID", "2026");
            jail.set_env("CODEAPI_JWT_ALLOWED_ALGS", "EdDSA, HS256");
            jail.set_env("CODEAPI_JWT_ISSUER", "from-env");
            jail.set_env("CODEAPI_JWT_CLOCK_SKEW_SECONDS", "5");
            jail.set_env("CODEAPI_JWT_HS256_SECRET", "");
            jail.set_env("SANDCALL_JWT__AUDIENCE", "sandcall-aud");
            jail.set_env("SANDCALL_JWT__MAX_TTL_SECONDS", "60");
            let c = Config::load(Some(Path::new("c.toml")), &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.auth.jwt.jwks_json.as_deref(), Some(jwks), "JSON text is kept as text");
            assert_eq!(c.auth.jwt.public_key.as_deref(), Some(pem));
            assert_eq!(c.auth.jwt.kid.as_deref(), Some("2026"), "a number-like kid stays text");
            assert_eq!(c.auth.jwt.allowed_algs, ["EdDSA", "HS256"]);
            assert_eq!(c.auth.jwt.issuer, "from-env", "the environment wins over the file");
            assert_eq!(c.auth.jwt.audience, "sandcall-aud", "SANDCALL_JWT__<KEY> works too");
            assert_eq!(c.auth.jwt.max_ttl_seconds, 60);
            assert_eq!(c.auth.jwt.clock_skew_seconds, 5);
            assert_eq!(c.auth.jwt.hs256_secret, None, "an empty variable is unset");
            assert!(c.has_credentials());
            assert_eq!(c.sessions_per_principal(), (c.sessions.max_sessions / 4).max(1));
            jail.set_env("CODEAPI_JWT_MAX_TTL_SECONDS", "five minutes");
            let err = Config::load(None, &Overrides::default()).unwrap_err().to_string();
            assert!(err.contains("CODEAPI_JWT_MAX_TTL_SECONDS"), "{err}");
            jail.set_env("CODEAPI_JWT_MAX_TTL_SECONDS", "300");
            jail.set_env("CODEAPI_JWT_TRUST_ENTRIES_JSON", "[]");
            let err = Config::load(None, &Overrides::default()).unwrap_err().to_string();
            assert!(err.contains("CODEAPI_JWT_TRUST_ENTRIES_JSON"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn ceilings_below_defaults_are_refused() {
        let mut c = Config::default();
        c.limits.ceilings.memory_limit_mb = Some(100);
        assert!(c.validate().is_err());
    }
}
