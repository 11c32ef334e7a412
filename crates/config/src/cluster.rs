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
    /// With a shared session store: the `node_url` of every node of the cluster (this
    /// one's may be listed too). A request is forwarded only to one of these: the owner
    /// URL read from the session store must match one exactly, or the request fails and
    /// nothing is sent. Required with a shared session store. A list, or one
    /// comma-separated string (SANDCALL_PEER_URLS). Default none.
    #[serde(deserialize_with = "urls_or_comma_list")]
    pub peer_urls: Vec<String>,
    /// With a shared session store: answers about a session carry `sandcall-node`, the
    /// URL of the node that served it (for debugging a cluster; it shows internal
    /// addresses to clients). Default false.
    pub node_header: bool,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            node_url: None,
            node_lease_ms: 10_000,
            peer_urls: Vec::new(),
            node_header: false,
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
    #[error("peer_urls: {0:?}: expected http://host:port")]
    PeerUrl(String),
}

/// `http://host:port`, nothing after: what a node URL is.
fn is_node_url(url: &str) -> bool {
    url.strip_prefix("http://")
        .is_some_and(|rest| !rest.is_empty() && !rest.contains(['/', '?', '#', ' ', '@']))
}

impl ClusterConfig {
    pub fn validate(&self) -> Result<(), ClusterError> {
        if let Some(url) = &self.node_url {
            if !is_node_url(url) {
                return Err(ClusterError::NodeUrl(url.clone()));
            }
        }
        if let Some(url) = self.peer_urls.iter().find(|u| !is_node_url(u)) {
            return Err(ClusterError::PeerUrl(url.clone()));
        }
        if self.node_lease_ms < 300 {
            return Err(ClusterError::LeaseTooShort);
        }
        Ok(())
    }
}

/// `["http://a:3112", "http://b:3112"]` in the file, `http://a:3112,http://b:3112` in the
/// environment.
fn urls_or_comma_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Urls {
        One(String),
        List(Vec<String>),
    }
    Ok(match Urls::deserialize(d)? {
        Urls::One(s) => s
            .split(',')
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty())
            .collect(),
        Urls::List(list) => list,
    })
}
