//! Preparing the host for sandboxes: the data directory, this instance's cgroup subtree,
//! sweeping what a previous server left behind, and refusing host paths that sandboxes
//! must see but could not (`check_visible`).

use sandcall_config::Config;
use sandcall_sandbox::cgroup::{CgroupError, CgroupRoot};
use sha2::{Digest, Sha256};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub struct Host {
    pub data_dir: PathBuf,
    pub runs_dir: PathBuf,
    /// Where helpers put a run's output files before the store takes them.
    pub outbox_dir: PathBuf,
    pub cgroups: CgroupRoot,
    pub host_uid: u32,
    pub host_gid: u32,
    /// Held while this `Host` lives: no other server sweeps or uses the data directory.
    pub lock: DataDirLock,
}

/// An exclusive `flock` on `<data_dir>/lock`. The kernel drops it when the process ends,
/// however it ends, and sandbox helpers do not inherit it (the descriptor is close-on-exec).
pub struct DataDirLock(#[allow(dead_code)] nix::fcntl::Flock<fs::File>);

/// Why the host could not be prepared for sandboxes.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("open {}: {source}", path.display())]
    OpenLock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another sandcall process is using the data directory {}: stop it, or give this one another `data_dir`", data_dir.display())]
    DataDirInUse { data_dir: PathBuf },
    #[error("lock {}: {source}", path.display())]
    Lock {
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("create data dir {}: {source}", path.display())]
    CreateDataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("data dir {}: {source}", path.display())]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("chmod data dir: {0}")]
    ChmodDataDir(#[source] std::io::Error),
    #[error("create {}: {source}", path.display())]
    CreateRunsDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
}

/// Takes the data directory for this process, or says which one is taken.
pub fn lock_data_dir(data_dir: &Path) -> Result<DataDirLock, HostError> {
    let path = data_dir.join("lock");
    let file = match fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
    {
        Ok(file) => file,
        Err(source) => return Err(HostError::OpenLock { path, source }),
    };
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(DataDirLock(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(HostError::DataDirInUse {
            data_dir: data_dir.to_path_buf(),
        }),
        Err((_, source)) => Err(HostError::Lock { path, source }),
    }
}

/// Names this server's cgroup subtree after its data directory, so that two servers with
/// different data directories never sweep each other's runs, and a restarted server finds
/// what its predecessor left.
pub fn instance_name(data_dir: &Path) -> String {
    let digest = Sha256::digest(data_dir.as_os_str().as_encoded_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("sandcall-{hex}")
}

pub fn data_dir(config: &Config) -> Result<PathBuf, HostError> {
    let path = || config.host.data_dir.clone();
    fs::create_dir_all(&config.host.data_dir).map_err(|source| HostError::CreateDataDir { path: path(), source })?;
    let dir = fs::canonicalize(&config.host.data_dir).map_err(|source| HostError::DataDir { path: path(), source })?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(HostError::ChmodDataDir)?;
    Ok(dir)
}

pub fn cgroups(config: &Config, data_dir: &Path) -> Result<CgroupRoot, HostError> {
    let root = match &config.host.cgroup_root {
        Some(dir) => CgroupRoot::v2_at(dir.join(instance_name(data_dir))),
        None => CgroupRoot::detect(&instance_name(data_dir))?,
    };
    root.ensure()?;
    Ok(root)
}

pub fn ids(config: &Config) -> (u32, u32) {
    let root = nix::unistd::geteuid().is_root();
    let uid = config
        .host
        .sandbox_uid
        .unwrap_or(if root { 65534 } else { nix::unistd::geteuid().as_raw() });
    let gid = config
        .host
        .sandbox_gid
        .unwrap_or(if root { 65534 } else { nix::unistd::getegid().as_raw() });
    (uid, gid)
}

/// Everything `serve` needs before it accepts requests.
pub fn prepare(config: &Config) -> Result<Host, HostError> {
    let data_dir = data_dir(config)?;
    // Before the sweep: what is in there may belong to a server that is still running.
    let lock = lock_data_dir(&data_dir)?;
    let runs_dir = data_dir.join("runs");
    if let Err(source) = fs::create_dir_all(&runs_dir) {
        return Err(HostError::CreateRunsDir { path: runs_dir, source });
    }
    let cgroups = cgroups(config, &data_dir)?;
    let swept = cgroups.sweep() + sweep_runs_dir(&runs_dir);
    if swept > 0 {
        tracing::warn!(swept, "removed sandboxes left by a previous server");
    }
    let (host_uid, host_gid) = ids(config);
    Ok(Host {
        outbox_dir: data_dir.join("outbox"),
        data_dir,
        runs_dir,
        cgroups,
        host_uid,
        host_gid,
        lock,
    })
}

/// Staging directories are empty on the host (their mounts lived in the dead helper's
/// own mount namespace), so removing them is a plain rmdir.
fn sweep_runs_dir(runs_dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(runs_dir) else { return 0 };
    entries
        .flatten()
        .filter(|e| {
            // The listening sockets of Python templates (`pool::Keeper`) are files.
            let socket = e
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with("zygote-") && n.ends_with(".sock"));
            if socket {
                fs::remove_file(e.path()).is_ok()
            } else {
                fs::remove_dir(e.path()).is_ok()
            }
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_removes_empty_staging_dirs_and_template_sockets_only() {
        let dir = std::env::temp_dir().join(format!("sandcall-sweep-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("empty")).unwrap();
        fs::create_dir_all(dir.join("full/x")).unwrap();
        fs::write(dir.join("zygote-abc.sock"), b"").unwrap();
        fs::write(dir.join("other"), b"").unwrap();
        assert_eq!(sweep_runs_dir(&dir), 2);
        let mut left: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["full", "other"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn instance_names_differ_by_data_dir_and_are_stable() {
        let a = instance_name(Path::new("/var/lib/sandcall"));
        assert_eq!(a, instance_name(Path::new("/var/lib/sandcall")));
        assert_ne!(a, instance_name(Path::new("/tmp/other")));
        assert!(a.starts_with("sandcall-") && a.len() == "sandcall-".len() + 12);
    }
}
