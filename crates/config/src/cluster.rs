//! Many nodes: how the others reach this one, and how long its hold on a session lasts.

use serde::{Deserialize, Serialize};

/// ClusterConfig: the keys of docs/configuration.md this section holds. Each field's doc comment
/// gives its unit and default.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ClusterConfig {
    /// How the other nodes of a cluster reach this one (`http://host:port`): a resume,
    /// GET or cancel of a session this node holds live is forwarded here. Also this
    /// node's id in the session store's leases, so it must be unique per node. Default
    /// none (one node).
    pub node_url: Option<String>,
    /// With a shared session store: how long a node's ownership of a live session lasts
    /// unless renewed, in ms (renewed every third of it while the node lives). After a
    /// node dies, its sessions are taken over by replay once this has passed. Default
    /// 10000.
    pub node_lease_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            node_url: None,
            node_lease_ms: 10_000,
        }
    }
}

/// A cluster setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    #[error("node_url = {0:?}: expected http://host:port")]
    NodeUrl(String),
    #[error("node_lease_ms must be at least 300")]
    LeaseTooShort,
}

impl ClusterConfig {
    pub fn validate(&self) -> Result<(), ClusterError> {
        if let Some(url) = &self.node_url {
            let ok = url
                .strip_prefix("http://")
                .is_some_and(|rest| !rest.is_empty() && !rest.contains(['/', '?', '#', ' ']));
            if !ok {
                return Err(ClusterError::NodeUrl(url.clone()));
            }
        }
        if self.node_lease_ms < 300 {
            return Err(ClusterError::LeaseTooShort);
        }
        Ok(())
    }
}
