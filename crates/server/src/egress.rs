//! The egress proxy (`sandcall-egress`) behind the engine's `EgressPolicy`: the server
//! builds the policy from the configuration at start (a rule or range that does not
//! parse stops it), and each granted run gets a `RunEgress` of its own. The engine never
//! sees hyper; this is the only place the two meet.

use sandcall_api::NetworkSummary;
use sandcall_config::Config;
use sandcall_egress::{Ca, HostRule, Interceptor, IpNet, Limits, Policy, Resolver, Secret, SecretValue};
use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

/// The server's egress policy, from `egress_allow`, `egress_allow_addresses`,
/// `egress_principals` and the bounds, and the principals' own narrower ones.
pub struct ServerEgress {
    config: sandcall_config::EgressConfig,
    policy: Policy,
    /// `[[api_keys]] egress`, by principal.
    keys: HashMap<String, Policy>,
    /// `[jwt] egress`, for every principal a JWT names.
    jwt: Option<Policy>,
    limits: Limits,
    secrets: Secrets,
}

/// The configured secrets, with the CA that intercepts their hosts.
#[derive(Default)]
struct Secrets {
    list: Vec<Configured>,
    tls: Option<Arc<Interceptor>>,
    /// The sandbox's trust bundle (the distribution's roots and the CA).
    bundle: Arc<String>,
}

struct Configured {
    secret: Secret,
    /// The program's variable that holds the placeholder.
    env: String,
    principals: Vec<String>,
}

/// Reads the secrets' values (`env:NAME`, `file:/path`), gives each a random placeholder,
/// and loads or makes the CA under `data_dir`. Errors never hold a value.
fn load_secrets(e: &sandcall_config::EgressConfig, data_dir: &Path) -> Result<Secrets, String> {
    if e.egress_secrets.is_empty() {
        return Ok(Secrets::default());
    }
    let mut list = Vec::new();
    for s in &e.egress_secrets {
        let value = if let Some(name) = s.value.strip_prefix("env:") {
            std::env::var(name).map_err(|_| {
                format!(
                    "egress_secrets: the secret for {:?}: environment variable {name} is not set",
                    s.host
                )
            })?
        } else if let Some(path) = s.value.strip_prefix("file:") {
            let text = std::fs::read_to_string(path)
                .map_err(|err| format!("egress_secrets: the secret for {:?}: reading {path}: {err}", s.host))?;
            text.trim_end_matches(['\r', '\n']).to_owned()
        } else {
            return Err(format!(
                "egress_secrets: the secret for {:?}: `value` must be `env:NAME` or `file:/path`",
                s.host
            ));
        };
        let placeholder = format!("sandcall-secret-{}", hex(&rand::random::<[u8; 16]>()));
        let secret = Secret::new(&s.host, &s.header, &placeholder, SecretValue::new(value))
            .map_err(|err| format!("egress_secrets: {err}"))?;
        list.push(Configured {
            secret,
            env: s.env.clone(),
            principals: s.principals.clone(),
        });
    }
    let hosts: Vec<String> = list.iter().map(|c| c.secret.host.clone()).collect();
    let ca = Ca::load_or_create(data_dir, &hosts).map_err(|err| err.to_string())?;
    let extra = match &e.egress_extra_roots {
        Some(path) => {
            std::fs::read(path).map_err(|err| format!("egress_extra_roots: reading {}: {err}", path.display()))?
        }
        None => Vec::new(),
    };
    let tls = Interceptor::new(ca, &extra).map_err(|err| err.to_string())?;
    Ok(Secrets {
        list,
        bundle: Arc::new(tls.trust_bundle()),
        tls: Some(Arc::new(tls)),
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl ServerEgress {
    /// None when the configuration allows no host. Err: the reason a rule or range
    /// cannot be used, for the start-up error.
    pub fn from_config(config: &Config, data_dir: &Path) -> Result<Option<ServerEgress>, String> {
        let e = &config.egress;
        if e.egress_allow.is_empty() {
            return Ok(None);
        }
        let rules = e
            .egress_allow
            .iter()
            .map(|r| HostRule::parse(r).map_err(|err| format!("egress_allow: {err}")))
            .collect::<Result<Vec<_>, _>>()?;
        let allow_addresses = e
            .egress_allow_addresses
            .iter()
            .map(|a| {
                a.parse::<IpNet>()
                    .or_else(|_| a.parse::<std::net::IpAddr>().map(IpNet::from))
                    .map_err(|_| format!("egress_allow_addresses: {a:?} is not an address range (e.g. 10.1.2.0/24)"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let secrets = load_secrets(e, data_dir)?;
        let policy = Policy { rules, allow_addresses };
        let limits = Limits {
            max_connections: e.egress_max_connections,
            max_bytes_out: e.egress_max_bytes,
            max_bytes_in: e.egress_max_bytes,
            max_connection_seconds: e.egress_connection_timeout_s,
        };
        let mut keys = HashMap::new();
        for key in &config.auth.api_keys {
            if let Some(own) = &key.egress {
                let whose = format!("api_keys: the key of {:?}", key.principal);
                keys.insert(key.principal.clone(), narrowed(&policy, own, limits, &whose)?);
            }
        }
        let jwt = match &config.auth.jwt.egress {
            Some(own) => Some(narrowed(&policy, own, limits, "jwt.egress")?),
            None => None,
        };
        Ok(Some(ServerEgress {
            secrets,
            config: e.clone(),
            policy,
            keys,
            jwt,
            limits,
        }))
    }

    /// The policy `principal`'s runs are granted from: its own narrower one, if any.
    fn policy_of(&self, principal: &str) -> &Policy {
        let jwt = principal.starts_with("jwt:").then_some(self.jwt.as_ref()).flatten();
        self.keys.get(principal).or(jwt).unwrap_or(&self.policy)
    }
}

/// A principal's own `egress` list as a policy: the server's narrowed to it. Every entry
/// must be a rule the server's policy covers, else the start-up error says whose it is.
fn narrowed(policy: &Policy, own: &[String], limits: Limits, whose: &str) -> Result<Policy, String> {
    let rules = own
        .iter()
        .map(|r| HostRule::parse(r).map_err(|err| format!("{whose}: egress: {err}")))
        .collect::<Result<Vec<_>, _>>()?;
    policy
        .grant(Some(own), limits)
        .map_err(|err| format!("{whose}: egress: {err} (each entry must be covered by egress_allow)"))?;
    Ok(policy.narrowed(&rules))
}

impl sandcall_engine::egress::EgressPolicy for ServerEgress {
    fn grant(
        &self,
        principal: &str,
        requested: Option<&[String]>,
    ) -> Result<Arc<dyn sandcall_engine::egress::RunEgress>, String> {
        if !self.config.allows(principal) {
            return Err("this caller may not use network on this server (egress_principals)".into());
        }
        let mut grant = self
            .policy_of(principal)
            .grant(requested, self.limits)
            .map_err(|e| e.to_string())?;
        let mine: Vec<&Configured> = self
            .secrets
            .list
            .iter()
            .filter(|c| sandcall_config::EgressConfig::names(&c.principals, principal))
            .collect();
        let (Some(tls), false) = (&self.secrets.tls, mine.is_empty()) else {
            let run = sandcall_egress::RunEgress::new(grant, Resolver::system());
            return Ok(Arc::new(RunProxy {
                run,
                env: Vec::new(),
                bundle: None,
            }));
        };
        grant.secrets = mine.iter().map(|c| c.secret.clone()).collect();
        let env = mine
            .iter()
            .map(|c| (c.env.clone(), c.secret.placeholder.clone()))
            .collect();
        let run = sandcall_egress::RunEgress::with_interceptor(grant, Resolver::system(), tls.clone());
        Ok(Arc::new(RunProxy {
            run,
            env,
            bundle: Some(self.secrets.bundle.clone()),
        }))
    }
}

/// One run's proxy, with the environment its secrets give the program.
struct RunProxy {
    run: Arc<sandcall_egress::RunEgress>,
    env: Vec<(String, String)>,
    bundle: Option<Arc<String>>,
}

impl sandcall_engine::egress::RunEgress for RunProxy {
    fn serve(self: Arc<Self>, conn: tokio::net::UnixStream) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let run = self.run.clone();
        Box::pin(async move { run.serve(conn).await })
    }

    fn finish(self: Arc<Self>, run_id: String) -> Pin<Box<dyn Future<Output = NetworkSummary> + Send>> {
        Box::pin(async move {
            let run = &self.run;
            // The run is over: whatever of it is still connected ends now, and the
            // records are final once every connection is done.
            run.close_and_wait().await;
            for r in run.records() {
                tracing::info!(
                    run = run_id,
                    host = r.host,
                    port = r.port,
                    address = r.address.map(|a| a.to_string()),
                    bytes_out = r.bytes_out,
                    bytes_in = r.bytes_in,
                    outcome = ?r.outcome,
                    reason = r.reason,
                    opened_at = sandcall_engine::egress::record_time(r.opened_at_ms),
                    closed_at = r.closed_at_ms.map(sandcall_engine::egress::record_time),
                    "egress connection"
                );
            }
            let summary = run.summary();
            NetworkSummary {
                connections: summary.connections,
                refused: summary.refused,
                bytes_out: summary.bytes_out,
                bytes_in: summary.bytes_in,
            }
        })
    }

    fn limit_reason(&self) -> Option<&'static str> {
        self.run.limit_reason()
    }

    fn program_env(&self) -> Vec<(String, String)> {
        self.env.clone()
    }

    fn trust_bundle(&self) -> Option<String> {
        self.bundle.as_ref().map(|b| b.to_string())
    }

    fn connections(&self) -> (Vec<sandcall_api::AuditConnection>, u64) {
        use sandcall_egress::Outcome;
        use sandcall_engine::egress::record_time;
        let records = self.run.records().into_iter().map(|r| sandcall_api::AuditConnection {
            host: r.host,
            port: r.port,
            address: r.address.map(|a| a.to_string()),
            bytes_out: r.bytes_out,
            bytes_in: r.bytes_in,
            outcome: match r.outcome {
                Outcome::Relayed => "relayed",
                Outcome::Refused => "refused",
                Outcome::Failed => "failed",
                Outcome::Limited => "limited",
            }
            .to_owned(),
            reason: r.reason,
            opened_at: record_time(r.opened_at_ms),
            closed_at: r.closed_at_ms.map(record_time),
        });
        (records.collect(), self.run.summary().records_dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandcall_engine::egress::EgressPolicy;

    #[test]
    fn jwt_principals_get_the_jwt_list_and_others_the_servers_policy() {
        let mut config = Config::default();
        config.egress.egress_allow = vec!["a.example.com".into(), "b.example.com".into()];
        config.egress.egress_principals = vec!["*".into()];
        config.auth.jwt.egress = Some(vec!["a.example.com".into()]);
        let egress = ServerEgress::from_config(&config, Path::new("/nonexistent"))
            .unwrap()
            .unwrap();
        let asks = |principal: &str, host: &str| egress.grant(principal, Some(&[host.to_owned()])).is_ok();
        assert!(asks("jwt:legacy:user1", "a.example.com"));
        assert!(!asks("jwt:legacy:user1", "b.example.com"));
        assert!(asks("alice", "b.example.com"));
        // A list past the server's is a start-up error that says whose it is.
        config.auth.jwt.egress = Some(vec!["c.example.com".into()]);
        let err = ServerEgress::from_config(&config, Path::new("/nonexistent"))
            .err()
            .unwrap();
        assert!(err.contains("jwt.egress") && err.contains("c.example.com"), "{err}");
    }
}
