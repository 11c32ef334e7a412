//! The pinned npm set for programs: the packages of `runtimes/npm/package.json`, at the
//! exact versions of its `package-lock.json`, installed with `npm ci --ignore-scripts`
//! into `runtime_dir/npm-<hash>/node_modules` beside the Python runtime, and bound
//! read-only at `/node_modules` in every sandbox (the runner's helper mounts it). That is
//! where Node's resolution walks to from the code (`/run/sandcall/main.mjs`) and from the
//! working directory (`/mnt/data`), so `import x from "x"` (ES modules do not read
//! NODE_PATH) and `require("x")` both find it, in plain and programmatic runs, warm and
//! cold. The hash covers the lock and package.json: changing either makes a new set next
//! to the old. The set holds TypeScript's transpiler too (`TRANSPILER`).
//!
//! Owns finding, installing and describing the set. An install happens in a
//! `.npm-<hash>.partial-<pid>` directory and is renamed into place only when complete,
//! so a half install is never found; a lock file serialises installers. Blocking code
//! (it runs npm). Must not touch the sandbox or the config.

use sandcall_config::Config;
use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The top-level packages (exact versions).
pub const PACKAGE_JSON: &str = include_str!("../../../runtimes/npm/package.json");
/// Every package of the set, dependencies included.
pub const LOCK: &str = include_str!("../../../runtimes/npm/package-lock.json");
/// Where the set's `node_modules` is bound inside every sandbox.
pub const SANDBOX_PATH: &str = "/node_modules";
/// The package of the set that is TypeScript's transpiler (`runtime::languages`): the
/// first start installs it with the rest, so TypeScript needs no setting of its own.
pub const TRANSPILER: &str = "sucrase";

/// An installed npm set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// `npm-<hash>`.
    pub id: String,
    /// Its directory; `node_modules` inside is what sandboxes see.
    pub dir: PathBuf,
    /// The top-level packages with the versions the lock pins.
    pub packages: Vec<crate::python_runtime::Package>,
}

impl Installed {
    /// The host directory bound at `/node_modules`.
    pub fn node_modules(&self) -> PathBuf {
        self.dir.join("node_modules")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("npm is not installed ({0}): JavaScript programs run without npm packages and TypeScript is unavailable (apt-get install npm, then `sandcall runtime install`)")]
    NoNpm(String),
    #[error("npm ci failed ({status}): {output}")]
    Npm { status: String, output: String },
    #[error("runtimes/npm is malformed: {0}")]
    Manifest(#[from] ManifestError),
}

/// Why a package.json and its lock do not give a set of exactly pinned packages.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("package.json: {0}")]
    PackageJson(#[source] serde_json::Error),
    #[error("package-lock.json: {0}")]
    Lock(#[source] serde_json::Error),
    #[error("package.json has no dependencies")]
    NoDependencies,
    #[error("{name} is not pinned to an exact version: {wanted:?}")]
    NotPinned { name: String, wanted: String },
    #[error("{name} is not in package-lock.json")]
    NotLocked { name: String },
    #[error("{name}: package.json pins {wanted}, the lock {locked} (run npm install --package-lock-only)")]
    Disagree {
        name: String,
        wanted: String,
        locked: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> InstallError {
    let what = what.into();
    move |source| InstallError::Io { what, source }
}

/// The top-level packages of a package.json and lock: each dependency of package.json
/// with the version the lock gives it. Every dependency must be pinned exactly
/// (`1.2.3`, no range) and agree with the lock.
pub fn packages(package_json: &str, lock: &str) -> Result<Vec<crate::python_runtime::Package>, ManifestError> {
    let manifest: serde_json::Value = serde_json::from_str(package_json).map_err(ManifestError::PackageJson)?;
    let lock: serde_json::Value = serde_json::from_str(lock).map_err(ManifestError::Lock)?;
    let deps = manifest["dependencies"]
        .as_object()
        .ok_or(ManifestError::NoDependencies)?;
    let mut out = Vec::new();
    for (name, wanted) in deps {
        let wanted = wanted.as_str().unwrap_or_default();
        let exact = !wanted.is_empty()
            && wanted
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'))
            && wanted.starts_with(|c: char| c.is_ascii_digit());
        if !exact {
            return Err(ManifestError::NotPinned {
                name: name.clone(),
                wanted: wanted.to_owned(),
            });
        }
        let locked = lock["packages"][format!("node_modules/{name}")]["version"]
            .as_str()
            .ok_or_else(|| ManifestError::NotLocked { name: name.clone() })?;
        if locked != wanted {
            return Err(ManifestError::Disagree {
                name: name.clone(),
                wanted: wanted.to_owned(),
                locked: locked.to_owned(),
            });
        }
        out.push(crate::python_runtime::Package {
            name: name.clone(),
            version: locked.to_owned(),
        });
    }
    Ok(out)
}

/// The set's name for a package.json and lock: `npm-` and 16 hex characters of their
/// SHA-256.
pub fn set_id(package_json: &str, lock: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(package_json.as_bytes());
    hash.update([0u8]);
    hash.update(lock.as_bytes());
    let hex: String = hash.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("npm-{hex}")
}

/// The name of this build's set (`set_id` of the checked-in files), computed once.
pub fn this_set_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| set_id(PACKAGE_JSON, LOCK))
}

/// Where this build's set has TypeScript's transpiler in `runtime_dir` (there when the
/// set is installed: only complete installs get the set's name).
pub fn transpiler_dir(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join(this_set_id()).join("node_modules").join(TRANSPILER)
}

/// The set of this build's lock in `runtime_dir`, if installed.
pub fn find(runtime_dir: &Path) -> Option<Installed> {
    // Canonical, since it becomes a bind-mount source: no `..`, no symlink.
    let dir = std::fs::canonicalize(runtime_dir.join(this_set_id())).ok()?;
    // Only complete installs are renamed there.
    if !dir.join("node_modules").is_dir() || !dir.join("package-lock.json").is_file() {
        return None;
    }
    Some(Installed {
        id: dir.file_name()?.to_string_lossy().into_owned(),
        packages: packages(PACKAGE_JSON, LOCK).ok()?,
        dir,
    })
}

/// The set the servers of this config use: the one of this build's lock in
/// `runtime_dir`, if installed.
pub fn for_config(config: &Config) -> Option<Installed> {
    find(&crate::python_runtime::runtime_dir(config))
}

/// What `GET /v1/runtimes` says of a set, without host paths.
pub fn describe(installed: &Installed) -> sandcall_api::RuntimeInfo {
    sandcall_api::RuntimeInfo {
        name: installed.id.clone(),
        language: "javascript".into(),
        packages: installed
            .packages
            .iter()
            .map(|p| sandcall_api::RuntimePackage {
                name: p.name.clone(),
                version: p.version.clone(),
            })
            .collect(),
    }
}

/// npm: beside the configured `node` (Debian puts both in /usr/bin), else on PATH.
fn npm_for(node: &Path) -> Option<PathBuf> {
    let beside = node.parent().map(|d| d.join("npm"));
    if let Some(npm) = beside.filter(|p| p.is_file()) {
        return Some(npm);
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join("npm"))
        .find(|p| p.is_file())
}

/// Installs the set of this build's lock into `runtime_dir` with npm (or finds it
/// there), reporting each stage and the download's progress through `progress`.
pub fn install(runtime_dir: &Path, node: &Path, progress: &mut dyn FnMut(&str)) -> Result<Installed, InstallError> {
    let listed = packages(PACKAGE_JSON, LOCK)?;
    let (installed, already) = crate::python_runtime::install_once(
        runtime_dir,
        &set_id(PACKAGE_JSON, LOCK),
        find,
        |tmp, _| {
            let npm = npm_for(node)
                .ok_or_else(|| InstallError::NoNpm(format!("none beside {} or on PATH", node.display())))?;
            build(tmp, &npm, listed.len(), progress)
        },
        |final_dir| InstallError::Npm {
            status: "missing".into(),
            output: format!("{} has no node_modules", final_dir.display()),
        },
        |what, source| InstallError::Io { what, source },
    )?;
    if already {
        progress(&format!(
            "the npm packages are already installed in {}",
            installed.dir.display()
        ));
    }
    Ok(installed)
}

fn build(tmp: &Path, npm: &Path, top: usize, progress: &mut dyn FnMut(&str)) -> Result<(), InstallError> {
    let total = serde_json::from_str::<serde_json::Value>(LOCK)
        .ok()
        .and_then(|l| l["packages"].as_object().map(|p| p.len().saturating_sub(1)))
        .unwrap_or(0);
    progress(&format!(
        "[1/2] npm ci: {top} packages ({total} with their dependencies and every platform's optional binaries)"
    ));
    std::fs::write(tmp.join("package.json"), PACKAGE_JSON).map_err(io("write package.json"))?;
    write_lock(tmp)?;
    // No install script runs: none of the set needs one (sharp's native code comes
    // prebuilt in its optional @img/sharp-<platform> packages).
    let mut child = Command::new(npm)
        .args(["ci", "--ignore-scripts", "--omit=dev", "--no-audit", "--no-fund"])
        .args(["--no-update-notifier", "--loglevel=http"])
        .current_dir(tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io(format!("start {}", npm.display())))?;
    let mut tail: Vec<String> = Vec::new();
    let mut fetched = 0usize;
    if let Some(err) = child.stderr.take() {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains("http fetch GET 200") && line.contains(".tgz") {
                fetched += 1;
                if fetched.is_multiple_of(50) {
                    progress(&format!("      {fetched} downloaded"));
                }
            } else {
                tail.push(line);
                if tail.len() > 20 {
                    tail.remove(0);
                }
            }
        }
    }
    let status = child.wait().map_err(io("wait for npm ci"))?;
    if !status.success() {
        return Err(InstallError::Npm {
            status: status.to_string(),
            output: tail.join("\n"),
        });
    }
    progress(&format!("[2/2] {fetched} packages downloaded and unpacked"));
    Ok(())
}

/// Writes the copy of the lock that npm ci installs from.
fn write_lock(dir: &Path) -> Result<(), InstallError> {
    std::fs::write(dir.join("package-lock.json"), LOCK).map_err(io("write package-lock.json"))
}

/// What `serve` does before serving: nothing when the set is installed; else, with
/// `install_runtime` on, installs it, saying where; when that fails (no npm, no
/// registry) or is off, warns that JavaScript runs without npm packages. Says what it
/// installed, or could not, in a sentence (`sandcall mcp` tells its first tool call).
pub fn prepare_for_serve(config: &Config) -> Option<String> {
    let dir = crate::python_runtime::runtime_dir(config);
    if let Some(found) = find(&dir) {
        tracing::info!(npm = %found.dir.display(), packages = found.packages.len(), "npm packages for programs");
        return None;
    }
    if !config.languages.node.exists() {
        // JavaScript is unavailable anyway, and doctor says why.
        return None;
    }
    if !config.languages.install_runtime {
        tracing::warn!(
            runtime_dir = %dir.display(),
            "the npm packages for programs are not installed and install_runtime is off: JavaScript runs \
             without them and TypeScript (whose transpiler they hold) is unavailable (run `sandcall runtime \
             install` to add lodash, dayjs, exceljs, ... and sucrase)"
        );
        return None;
    }
    eprintln!(
        "sandcall: first start: installing the npm packages for programs (lodash, dayjs, exceljs, sharp, ...) and \
         TypeScript's transpiler (sucrase) into {}.",
        dir.display()
    );
    let started = std::time::Instant::now();
    match install(&dir, &config.languages.node, &mut |line| eprintln!("sandcall: {line}")) {
        Ok(installed) => {
            eprintln!("sandcall: the npm packages are ready in {}", installed.dir.display());
            Some(format!(
                "The first start installed the npm packages for programs ({} packages: lodash, dayjs, exceljs, ... and TypeScript's transpiler) in {:.0} s.",
                installed.packages.len(),
                started.elapsed().as_secs_f64()
            ))
        }
        Err(e) => {
            let why = format!(
                "could not install the npm packages for programs ({e}); JavaScript runs without them and \
                 TypeScript is unavailable (`sandcall runtime install` retries)"
            );
            tracing::warn!("{why}");
            Some(format!("The first start {why}."))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checked_in_set_is_pinned_and_holds_the_code_interpreter_list() {
        let packages = packages(PACKAGE_JSON, LOCK).unwrap();
        let names: Vec<&str> = packages.iter().map(|p| p.name.as_str()).collect();
        for wanted in [
            "lodash",
            "date-fns",
            "dayjs",
            "papaparse",
            "exceljs",
            "pdf-lib",
            "sharp",
            "marked",
            "cheerio",
            "zod",
            "js-yaml",
            "mathjs",
            "pptxgenjs",
            TRANSPILER,
        ] {
            assert!(names.contains(&wanted), "{wanted} is not in runtimes/npm/package.json");
        }
        // No install script runs, so none may be needed (npm records them in the lock).
        assert!(!LOCK.contains("\"hasInstallScript\": true") || LOCK.contains("node_modules/sharp"));
        // The lock names no registry host.
        assert!(!LOCK.contains("\"resolved\""), "the lock must not name the registry");
    }

    #[test]
    fn docs_runtimes_lists_every_npm_package() {
        let doc = include_str!("../../../docs/runtimes.md");
        for p in packages(PACKAGE_JSON, LOCK).unwrap() {
            let row = format!("| `{}` | {} |", p.name, p.version);
            assert!(doc.contains(&row), "docs/runtimes.md lacks {row}");
        }
    }

    #[test]
    fn ranges_and_disagreements_are_refused() {
        let lock = r#"{"packages":{"node_modules/a":{"version":"1.2.3"}}}"#;
        assert_eq!(packages(r#"{"dependencies":{"a":"1.2.3"}}"#, lock).unwrap().len(), 1);
        for bad in ["^1.2.3", "~1.2.3", "*", "latest", "1.x || 2", ""] {
            let manifest = format!(r#"{{"dependencies":{{"a":"{bad}"}}}}"#);
            let e = packages(&manifest, lock).unwrap_err().to_string();
            assert!(e.contains("exact"), "{bad}: {e}");
        }
        assert!(packages(r#"{"dependencies":{"a":"1.2.4"}}"#, lock)
            .unwrap_err()
            .to_string()
            .contains("the lock 1.2.3"));
        assert!(packages(r#"{"dependencies":{"b":"1.0.0"}}"#, lock)
            .unwrap_err()
            .to_string()
            .contains("not in package-lock.json"));
    }

    #[test]
    fn a_partial_install_is_not_found() {
        let dir = std::env::temp_dir().join(format!("sandcall-npm-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let id = set_id(PACKAGE_JSON, LOCK);
        std::fs::create_dir_all(dir.join(format!(".{id}.partial-1/node_modules"))).unwrap();
        assert!(find(&dir).is_none());
        std::fs::create_dir_all(dir.join(&id).join("node_modules")).unwrap();
        assert!(find(&dir).is_none(), "no lock copy: not complete");
        write_lock(&dir.join(&id)).unwrap();
        let found = find(&dir).unwrap();
        assert_eq!(found.id, id);
        assert!(found.node_modules().ends_with("node_modules"));
        assert_eq!(describe(&found).language, "javascript");
        assert_ne!(set_id("{}", LOCK), id);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
