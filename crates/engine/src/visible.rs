//! Host paths runs must see: each is bound into every sandbox, so none may lie under a
//! mount point where every sandbox mounts something of its own (`/tmp`, `/dev/shm`, ...,
//! from `sandcall_sandbox::mounts::MOUNTED_OVER`, and the gvisor tier's
//! `gvisor::MOUNTED_OVER`), which would hide it. `serve`, `mcp` and `doctor` check this
//! at start (`check_visible`), before any install.

use sandcall_config::Config;
use std::fs;
use std::path::{Path, PathBuf};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
