//! Where the server listens, and the timers and cap of its connections.

use serde::{Deserialize, Serialize};

/// ListenConfig: the keys of docs/configuration.md this section holds. Each field's doc comment
/// gives its unit and default.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ListenConfig {
    /// Address and port to listen on. Default `127.0.0.1:3112`.
    #[serde(rename = "listen")]
    pub address: String,
    /// Longest time a client may take to send a request's headers, in ms; then the
    /// connection is closed. Default 10000.
    pub header_read_timeout_ms: u64,
    /// Longest time a client may take to send a request's whole body, in ms; then the
    /// request gets 408 `request_timeout`. Default 120000.
    pub body_read_timeout_ms: u64,
    /// An idle keep-alive connection (no request under way) is closed after this many
    /// ms. Default 20000.
    pub keep_alive_timeout_ms: u64,
    /// Client connections open at once; more wait to be accepted. Default 2048 (less if
    /// the open-files limit cannot be raised to fit them).
    pub max_connections: usize,
}

impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig {
            address: "127.0.0.1:3112".into(),
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 120_000,
            keep_alive_timeout_ms: 20_000,
            max_connections: 2048,
        }
    }
}

/// A listen setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListenError {
    #[error("listen = {0:?} is not an address:port")]
    NotAnAddress(String),
    #[error("{0} must be above 0")]
    Zero(&'static str),
}

impl ListenConfig {
    pub fn validate(&self) -> Result<(), ListenError> {
        if self.address.parse::<std::net::SocketAddr>().is_err() {
            return Err(ListenError::NotAnAddress(self.address.clone()));
        }
        for (name, value) in [
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("body_read_timeout_ms", self.body_read_timeout_ms),
            ("keep_alive_timeout_ms", self.keep_alive_timeout_ms),
            ("max_connections", self.max_connections as u64),
        ] {
            if value == 0 {
                return Err(ListenError::Zero(name));
            }
        }
        Ok(())
    }
}
