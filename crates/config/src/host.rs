//! The machine side: the data directory, the sandbox user, the cgroup subtree, the
//! isolation tier.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// HostConfig: the keys of docs/configuration.md this section holds. Each field's doc comment
/// gives its unit and default.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct HostConfig {
    /// Directory for the server's state and the runs' staging directories.
    /// Default `./sandcall-data`.
    pub data_dir: PathBuf,
    /// For tests of the server itself: enables `GET /v1/_fault/panic`, whose handler
    /// panics (to check that a panic is answered 500 and the server goes on). Default
    /// false; never turn it on in production.
    pub fault_injection: bool,
    /// Host uid the sandbox user maps to. Default 65534 (nobody) as root, else your uid.
    pub sandbox_uid: Option<u32>,
    /// Host gid the sandbox user maps to. Default 65534 as root, else your gid.
    pub sandbox_gid: Option<u32>,
    /// A cgroup v2 directory to create run cgroups in (a delegated subtree). Default:
    /// detected, `<hierarchy>/sandcall-<hash of data_dir>`.
    pub cgroup_root: Option<PathBuf>,
    /// Where runs get their sandboxes: `namespace` (Linux namespaces, cgroups and a
    /// seccomp filter on the host's kernel) or `gvisor` (each sandbox also inside a gVisor
    /// sandbox of its own, whose kernel answers the program's system calls).
    /// docs/isolation.md says which to choose. Default `namespace`.
    pub isolation: Isolation,
    /// The `runsc` binary of the `gvisor` tier. Default: `runsc` found on PATH.
    pub runsc_path: Option<PathBuf>,
}

/// An isolation tier (`isolation`), weakest first: `Ord` says which is stronger.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    #[default]
    Namespace,
    Gvisor,
}

impl Isolation {
    pub const ALL: [Isolation; 2] = [Isolation::Namespace, Isolation::Gvisor];

    pub fn name(self) -> &'static str {
        match self {
            Isolation::Namespace => "namespace",
            Isolation::Gvisor => "gvisor",
        }
    }

    /// The tier a name names (`namespace`, `gvisor`), in any case.
    pub fn parse(name: &str) -> Option<Isolation> {
        Isolation::ALL.into_iter().find(|i| i.name().eq_ignore_ascii_case(name))
    }
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            data_dir: PathBuf::from("./sandcall-data"),
            fault_injection: false,
            sandbox_uid: None,
            sandbox_gid: None,
            cgroup_root: None,
            isolation: Isolation::Namespace,
            runsc_path: None,
        }
    }
}

/// A host setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("sandbox_uid and sandbox_gid may not be 0: the sandbox user must not be the host's root")]
    RootSandboxUser,
}

impl HostConfig {
    pub fn validate(&self) -> Result<(), HostError> {
        if self.sandbox_uid == Some(0) || self.sandbox_gid == Some(0) {
            return Err(HostError::RootSandboxUser);
        }
        Ok(())
    }
}
