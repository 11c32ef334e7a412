//! sandcall's egress proxy: what a run may reach over the network, and the proxy that
//! takes it there. A run's program speaks HTTP/1.1 proxy protocol (`CONNECT host:port`
//! for HTTPS, absolute-form requests for plain HTTP) to `RunEgress::serve`; every
//! connection is checked against the run's `Grant` (host rules and ports), its bounds,
//! and every address its name resolves to, then relayed to the address that was checked.
//!
//! **Architecture invariant:** this crate knows no other sandcall crate, no configuration
//! file and no sandbox: the server builds a `Policy` from its configuration, the engine
//! asks it for a run's `Grant`, and the sandbox side hands the program's connections to
//! `RunEgress::serve`.

mod address;
mod host;
mod http;
mod intercept;
mod meter;
mod policy;
mod proxy;
mod run;
mod secrets;

pub use address::refused_kind;
pub use ipnet::IpNet;
pub use policy::{Grant, HostRule, Limits, Policy, PolicyError};
pub use run::{Outcome, Record, Resolver, RunEgress, Summary, MAX_RECORDS};
pub use secrets::{Ca, Interceptor, Secret, SecretError, SecretValue, CA_CERT_FILE, CA_KEY_FILE};
