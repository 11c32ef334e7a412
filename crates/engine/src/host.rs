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

/// A host path that runs must see (it is bound into every sandbox) under a mount point
/// where every sandbox mounts something of its own, which hides it: the cause and the
/// fix, in words an operator can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HiddenPath {
    /// The config key that names the path (`data_dir` when `runtime_dir` is its default).
    pub key: String,
    pub path: PathBuf,
    /// `path` with its symlinks resolved, as far as it exists.
    pub resolved: PathBuf,
    pub mount_point: &'static str,
    /// Which sandboxes mount over it, and with what.
    pub replaced_by: String,
}

impl std::fmt::Display for HiddenPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.key, self.path.display())?;
        if self.resolved != self.path {
            write!(f, " (that is, {})", self.resolved.display())?;
        }
        write!(
            f,
            " is under {}, which {}, so runs could not see ",
            self.mount_point, self.replaced_by
        )?;
        let (what, choose) = match self.key.as_str() {
            "data_dir" => (
                "the managed runtimes installed in its `runtimes` directory (the default runtime_dir)",
                "choose a data_dir (or set runtime_dir to a directory)",
            ),
            "runtime_dir" => ("the managed runtimes installed there", "choose a runtime_dir"),
            _ => ("what is there", "choose a directory"),
        };
        let example = match self.key.as_str() {
            "data_dir" => "/var/lib/sandcall",
            "runtime_dir" => "/var/lib/sandcall/runtimes",
            _ => "/opt/sandcall",
        };
        write!(
            f,
            "{what}; {choose} outside {} (e.g. {example})",
            mount_points().join(", ")
        )
    }
}

impl std::error::Error for HiddenPath {}

/// Every mount point some sandbox mounts over: the sandbox's own (`build_root`), then
/// those of the gvisor tier's sandboxes.
fn mounted_over() -> impl Iterator<Item = (&'static str, String)> {
    let own = sandcall_sandbox::mounts::MOUNTED_OVER
        .into_iter()
        .map(|(at, what)| (at, format!("every sandbox replaces with {what}")));
    let gvisor = crate::gvisor::MOUNTED_OVER
        .into_iter()
        .map(|(at, what)| (at, format!("every sandbox of the gvisor tier replaces with {what}")));
    own.chain(gvisor)
}

fn mount_points() -> Vec<&'static str> {
    let mut all: Vec<&str> = Vec::new();
    for (at, _) in mounted_over() {
        if !all.contains(&at) {
            all.push(at);
        }
    }
    all
}

/// `path`, absolute, with the symlinks of its longest existing ancestor resolved and the
/// rest (not created yet) appended as it is.
fn resolve(path: &Path) -> PathBuf {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut rest = Vec::new();
    let mut existing = path.as_path();
    loop {
        if let Ok(mut found) = fs::canonicalize(existing) {
            found.extend(rest.iter().rev());
            return found;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                existing = parent;
            }
            _ => return path,
        }
    }
}

/// The mount point that hides `path` (resolved) from sandboxes, and what replaces it.
/// Paths match by whole components: `/tmpfoo` is not under `/tmp`.
pub fn hidden_by(path: &Path) -> Option<(&'static str, String)> {
    mounted_over().find(|(at, _)| path.starts_with(at))
}

/// Refuses the host paths runs must see when a sandbox's own mounts would hide them:
/// the managed runtimes' directory (`runtime_dir`, by default under `data_dir`),
/// `extra_runtime_paths`, `typescript_transpiler`, `toolchain_path` and the declared
/// languages' `paths`. (The data directory itself may be anywhere: staging directories
/// are bound from the host's side before the sandbox's own mounts.)
pub fn check_visible(config: &Config) -> Result<(), HiddenPath> {
    let langs = &config.languages;
    let runtime_key = if langs.runtime_dir.is_some() {
        "runtime_dir"
    } else {
        "data_dir"
    };
    let runtime_path = langs
        .runtime_dir
        .clone()
        .unwrap_or_else(|| config.host.data_dir.clone());
    let mut paths: Vec<(String, PathBuf)> = vec![(runtime_key.into(), runtime_path)];
    let named = |key: &str, list: &[PathBuf]| list.iter().map(|p| (key.to_owned(), p.clone())).collect::<Vec<_>>();
    paths.extend(named("extra_runtime_paths", &langs.extra_runtime_paths));
    paths.extend(named("typescript_transpiler", langs.typescript_transpiler.as_slice()));
    paths.extend(named("toolchain_path", &langs.toolchain_path));
    for (i, l) in langs.declared.iter().enumerate() {
        paths.extend(named(&format!("languages[{i}].paths"), &l.paths));
    }
    for (key, path) in paths {
        let resolved = resolve(&path);
        if let Some((mount_point, replaced_by)) = hidden_by(&resolved) {
            return Err(HiddenPath {
                key,
                path,
                resolved,
                mount_point,
                replaced_by,
            });
        }
    }
    Ok(())
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
    fn mount_points_match_whole_components() {
        for hidden in [
            "/tmp",
            "/tmp/x/runtimes",
            "/dev/shm/a",
            "/proc/1",
            "/mnt/data/x",
            "/run/sandcall",
            "/dev/x",
        ] {
            assert!(hidden_by(Path::new(hidden)).is_some(), "{hidden}");
        }
        for seen in [
            "/tmpfoo",
            "/tmpfoo/x",
            "/var/tmp/x",
            "/mnt/database",
            "/run/sandcall2",
            "/devices",
            "/",
        ] {
            assert_eq!(hidden_by(Path::new(seen)), None, "{seen}");
        }
        let (at, what) = hidden_by(Path::new("/dev/shm/x")).unwrap();
        assert_eq!(at, "/dev/shm");
        assert!(what.contains("tmpfs of its own"), "{what}");
    }

    #[test]
    fn a_hidden_runtime_is_refused_with_its_cause_and_fix() {
        let mut config = Config::default();
        config.host.data_dir = PathBuf::from("/tmp/sandcall-data");
        let refused = check_visible(&config).unwrap_err();
        assert_eq!((refused.key.as_str(), refused.mount_point), ("data_dir", "/tmp"));
        let message = refused.to_string();
        for part in [
            "data_dir /tmp/sandcall-data is under /tmp",
            "tmpfs",
            "runs could not see",
            "outside /tmp, /dev/shm",
            "/var/lib/sandcall",
        ] {
            assert!(message.contains(part), "{part:?} in {message}");
        }
        // An explicit runtime_dir elsewhere makes such a data directory usable.
        config.languages.runtime_dir = Some(PathBuf::from("/var/lib/sandcall/runtimes"));
        assert_eq!(check_visible(&config), Ok(()));
        config.languages.toolchain_path.push(PathBuf::from("/dev/shm/go/bin"));
        assert_eq!(check_visible(&config).unwrap_err().key, "toolchain_path");
    }

    #[test]
    fn symlinks_are_resolved_before_matching() {
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../target/host-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(&base).unwrap();
        let link = base.join("data");
        std::os::unix::fs::symlink("/dev/shm", &link).unwrap();
        let mut config = Config::default();
        config.host.data_dir = link.join("not-yet");
        let refused = check_visible(&config).unwrap_err();
        assert_eq!(refused.resolved, Path::new("/dev/shm/not-yet"));
        assert!(refused.to_string().contains("(that is, /dev/shm/not-yet)"), "{refused}");
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn instance_names_differ_by_data_dir_and_are_stable() {
        let a = instance_name(Path::new("/var/lib/sandcall"));
        assert_eq!(a, instance_name(Path::new("/var/lib/sandcall")));
        assert_ne!(a, instance_name(Path::new("/tmp/other")));
        assert!(a.starts_with("sandcall-") && a.len() == "sandcall-".len() + 12);
    }
}
