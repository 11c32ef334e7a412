//! The egress proxy (`sandcall-egress`) behind the engine's `EgressPolicy`: the server
//! builds the policy from the configuration at start (a rule or range that does not
//! parse stops it), and each granted run gets a `RunEgress` of its own. The engine never
//! sees hyper; this is the only place the two meet.

use sandcall_api::NetworkSummary;
use sandcall_config::Config;
use sandcall_egress::{HostRule, IpNet, Limits, Policy, Resolver};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// The server's egress policy, from `egress_allow`, `egress_allow_addresses`,
/// `egress_principals` and the bounds.
pub struct ServerEgress {
    config: sandcall_config::EgressConfig,
    policy: Policy,
    limits: Limits,
}

impl ServerEgress {
    /// None when the configuration allows no host. Err: the reason a rule or range
    /// cannot be used, for the start-up error.
    pub fn from_config(config: &Config) -> Result<Option<ServerEgress>, String> {
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
        Ok(Some(ServerEgress {
            config: e.clone(),
            policy: Policy { rules, allow_addresses },
            limits: Limits {
                max_connections: e.egress_max_connections,
                max_bytes_out: e.egress_max_bytes,
                max_bytes_in: e.egress_max_bytes,
                max_connection_seconds: e.egress_connection_timeout_s,
            },
        }))
    }
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
        let grant = self.policy.grant(requested, self.limits).map_err(|e| e.to_string())?;
        Ok(Arc::new(RunProxy(sandcall_egress::RunEgress::new(
            grant,
            Resolver::system(),
        ))))
    }
}

/// One run's proxy.
struct RunProxy(Arc<sandcall_egress::RunEgress>);

impl sandcall_engine::egress::RunEgress for RunProxy {
    fn serve(self: Arc<Self>, conn: tokio::net::UnixStream) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let run = self.0.clone();
        Box::pin(async move { run.serve(conn).await })
    }

    fn finish(self: Arc<Self>, run_id: String) -> Pin<Box<dyn Future<Output = NetworkSummary> + Send>> {
        Box::pin(async move {
            let run = &self.0;
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
        self.0.limit_reason()
    }
}
