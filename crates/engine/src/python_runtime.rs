//! The managed Python runtime: a venv of the pinned packages of
//! `runtimes/python/requirements.lock`, built with the sandbox's interpreter (`python`)
//! into `runtime_dir/python-<hash>`, and bound read-only into every sandbox at the same
//! absolute path (so the venv's own paths hold inside). The hash covers the lock and
//! sandcall's start-up files, so changing either makes a new runtime next to the old.
//!
//! Owns finding, installing and describing runtimes. An install happens in a
//! `.python-<hash>.partial-<pid>` directory beside the final one and is renamed into
//! place only when complete, so a half install is never found; a lock file serialises
//! installers sharing one `runtime_dir`. Blocking code (it runs pip): callers on tokio
//! use `spawn_blocking`. Must not touch the sandbox: `apply` only edits the config.

use sandcall_config::Config;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The exact versions the runtime holds (binary wheels only, installed `--no-deps`).
pub const LOCK: &str = include_str!("../../../runtimes/python/requirements.lock");
/// Files written into the venv's site-packages: the `.pth` that imports the start-up
/// module, the start-up module, and the matplotlib backend that saves figures.
const SITE_FILES: [(&str, &str); 3] = [
    ("sandcall.pth", include_str!("../../../runtimes/python/sandcall.pth")),
    (
        "sandcall_site.py",
        include_str!("../../../runtimes/python/sandcall_site.py"),
    ),
    (
        "sandcall_mpl.py",
        include_str!("../../../runtimes/python/sandcall_mpl.py"),
    ),
];
/// What is read from the host's /etc by matplotlib's fonts (bound read-only with the runtime).
const FONTS_CONFIG: &str = "/etc/fonts";

/// One pinned package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Package {
    pub name: String,
    pub version: String,
}

/// An installed runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// `python-<hash>`.
    pub id: String,
    /// Its directory (bound into sandboxes at this same path).
    pub dir: PathBuf,
    /// The venv's interpreter.
    pub python: PathBuf,
    pub packages: Vec<Package>,
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{step} failed ({status}): {output}")]
    Step {
        step: String,
        status: String,
        output: String,
    },
    #[error("the lock file is malformed: {0}")]
    Lock(#[from] LockError),
}

/// A line of a lock file that is not `name==version`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {text:?} is not name==version")]
pub struct LockError {
    /// Counted from 1.
    pub line: usize,
    /// The line, trimmed.
    pub text: String,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> InstallError {
    let what = what.into();
    move |source| InstallError::Io { what, source }
}

/// The packages of a lock file: `name==version` lines; `#` comments and blank lines are
/// skipped, anything else is an error naming the line.
pub fn parse_lock(text: &str) -> Result<Vec<Package>, LockError> {
    let mut packages = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, version)) = line.split_once("==") else {
            return Err(LockError {
                line: n + 1,
                text: line.to_owned(),
            });
        };
        let ok_name = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        let ok_version = !version.is_empty()
            && version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '!' | '-' | '_'));
        if !ok_name || !ok_version {
            return Err(LockError {
                line: n + 1,
                text: line.to_owned(),
            });
        }
        packages.push(Package {
            name: name.to_owned(),
            version: version.to_owned(),
        });
    }
    Ok(packages)
}

/// The runtime's name for a lock, the start-up files and the interpreter it is built
/// with: `python-` and 16 hex characters of their SHA-256.
pub fn runtime_id(lock: &str, python: &Path) -> String {
    let mut hash = Sha256::new();
    hash.update(lock.as_bytes());
    hash.update([0u8]);
    hash.update(python.as_os_str().as_encoded_bytes());
    for (name, text) in SITE_FILES {
        hash.update([0u8]);
        hash.update(name.as_bytes());
        hash.update([0u8]);
        hash.update(text.as_bytes());
    }
    let hex: String = hash.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("python-{hex}")
}

/// `runtime_dir`, or its default `<data_dir>/runtimes`.
pub fn runtime_dir(config: &Config) -> PathBuf {
    config
        .languages
        .runtime_dir
        .clone()
        .unwrap_or_else(|| config.host.data_dir.join("runtimes"))
}

/// The runtime of this build's lock for interpreter `python` in `runtime_dir`, if
/// installed. (A runtime is for the interpreter it was built with: configuring another
/// `python` runs that one, bare.)
pub fn find(runtime_dir: &Path, python: &Path) -> Option<Installed> {
    // Canonical, since it becomes a bind-mount target: no `..`, no symlink.
    open(&std::fs::canonicalize(runtime_dir.join(runtime_id(LOCK, python))).ok()?)
}

/// The installed runtime in `dir` (complete, since only complete ones are renamed there).
fn open(dir: &Path) -> Option<Installed> {
    let id = dir.file_name()?.to_string_lossy().into_owned();
    let dir = dir.to_path_buf();
    let python = dir.join("venv/bin/python3");
    if !python.exists() {
        return None;
    }
    let lock = std::fs::read_to_string(dir.join("requirements.lock")).ok()?;
    let packages = parse_lock(&lock).ok()?;
    Some(Installed {
        id,
        dir,
        python,
        packages,
    })
}

/// Makes the config run Python on an installed runtime: its interpreter, its directory
/// and the host's font configuration bound read-only.
pub fn apply(config: &mut Config, installed: &Installed) {
    config.languages.python = installed.python.clone();
    config.languages.extra_runtime_paths.push(installed.dir.clone());
    if Path::new(FONTS_CONFIG).is_dir() {
        config.languages.extra_runtime_paths.push(PathBuf::from(FONTS_CONFIG));
    }
}

/// The runtime in use by a config (its `python` is an installed runtime's), if any.
pub fn in_use(config: &Config) -> Option<Installed> {
    let dir = config.languages.python.parent()?.parent()?.parent()?;
    let runtimes = std::fs::canonicalize(runtime_dir(config)).ok()?;
    open(dir).filter(|r| r.python == config.languages.python && dir.starts_with(&runtimes))
}

/// What `GET /v1/runtimes` says: the runtime in use, if any, without host paths.
pub fn describe(config: &Config) -> sandcall_api::RuntimesResponse {
    let runtimes = in_use(config)
        .map(|r| sandcall_api::RuntimeInfo {
            name: r.id,
            language: "python".into(),
            packages: r
                .packages
                .into_iter()
                .map(|p| sandcall_api::RuntimePackage {
                    name: p.name,
                    version: p.version,
                })
                .collect(),
        })
        .into_iter()
        .collect();
    sandcall_api::RuntimesResponse { runtimes }
}

/// The packages pip is asked for, as counted for the progress display.
fn count_packages() -> usize {
    parse_lock(LOCK).map(|p| p.len()).unwrap_or(0)
}

/// Builds the runtime of this build's lock into `runtime_dir` with `python` (or finds it
/// there), reporting each stage and each package through `progress`.
pub fn install(runtime_dir: &Path, python: &Path, progress: &mut dyn FnMut(&str)) -> Result<Installed, InstallError> {
    parse_lock(LOCK)?;
    let (installed, already) = install_once(
        runtime_dir,
        &runtime_id(LOCK, python),
        |dir| find(dir, python),
        |tmp, final_dir| build(tmp, final_dir, python, progress),
        |final_dir| InstallError::Step {
            step: "checking the installed runtime".into(),
            status: "missing".into(),
            output: format!("{} has no interpreter", final_dir.display()),
        },
        |what, source| InstallError::Io { what, source },
    )?;
    if already {
        progress(&format!(
            "the Python runtime is already installed in {}",
            installed.dir.display()
        ));
    }
    Ok(installed)
}

/// How every managed runtime (this one, and the npm set) is installed into
/// `runtime_dir/<id>`: one installer at a time per id (a lock file; the others wait, then
/// find it installed), partial installs of interrupted installers removed, the new one
/// built by `build(tmp, final_dir)` in `.<id>.partial-<pid>` and renamed into place only
/// when complete, so `find` (given the canonical `runtime_dir`) never sees a half
/// install. Answers what `find` then gives, and whether it was there already;
/// `missing(final_dir)` is the error when `find` gives nothing after a build.
pub(crate) fn install_once<T, E>(
    runtime_dir: &Path,
    id: &str,
    find: impl Fn(&Path) -> Option<T>,
    build: impl FnOnce(&Path, &Path) -> Result<(), E>,
    missing: impl FnOnce(&Path) -> E,
    io_error: impl Fn(String, std::io::Error) -> E,
) -> Result<(T, bool), E> {
    let io = |what: String| {
        let io_error = &io_error;
        move |source| io_error(what, source)
    };
    std::fs::create_dir_all(runtime_dir).map_err(io(format!("create {}", runtime_dir.display())))?;
    let runtime_dir = std::fs::canonicalize(runtime_dir).map_err(io("resolve the runtime directory".into()))?;
    let lock_path = runtime_dir.join(format!(".{id}.lock"));
    let lock_file = std::fs::File::create(&lock_path).map_err(io(format!("create {}", lock_path.display())))?;
    let _guard = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| io(format!("lock {}", lock_path.display()))(e.into()))?;
    if let Some(found) = find(&runtime_dir) {
        return Ok((found, true));
    }
    // Partial installs of earlier, interrupted installers: nobody else holds the lock.
    let partial = format!(".{id}.partial-");
    if let Ok(entries) = std::fs::read_dir(&runtime_dir) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&partial) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let tmp = runtime_dir.join(format!("{partial}{}", std::process::id()));
    let final_dir = runtime_dir.join(id);
    std::fs::create_dir_all(&tmp).map_err(io(format!("create {}", tmp.display())))?;
    let result = build(&tmp, &final_dir)
        .and_then(|()| std::fs::rename(&tmp, &final_dir).map_err(io(format!("rename into {}", final_dir.display()))));
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    match find(&runtime_dir) {
        Some(found) => Ok((found, false)),
        None => Err(missing(&final_dir)),
    }
}

fn build(tmp: &Path, final_dir: &Path, python: &Path, progress: &mut dyn FnMut(&str)) -> Result<(), InstallError> {
    let venv = tmp.join("venv");
    let total = count_packages();
    progress(&format!(
        "[1/4] creating a virtual environment with {}",
        python.display()
    ));
    run(
        "creating the venv (is python3-venv installed?)",
        Command::new(python).arg("-m").arg("venv").arg(&venv),
        &mut |_| {},
    )?;
    let lock_copy = tmp.join("requirements.lock");
    std::fs::write(&lock_copy, LOCK).map_err(io("write the lock file"))?;
    progress(&format!("[2/4] downloading and installing {total} packages with pip"));
    let mut seen = 0usize;
    run(
        "pip install",
        Command::new(venv.join("bin/python3"))
            .args(["-m", "pip", "install", "--disable-pip-version-check", "--no-input"])
            .args(["--no-deps", "--only-binary", ":all:", "--progress-bar", "off", "-r"])
            .arg(&lock_copy),
        &mut |line| {
            if let Some(what) = line.strip_prefix("Collecting ") {
                seen += 1;
                progress(&format!("      {seen}/{total} {what}"));
            } else if line.starts_with("Installing collected packages") {
                progress(&format!("      unpacking {seen} packages"));
            }
        },
    )?;
    progress("[3/4] adding sandcall's start-up files");
    let site = site_packages(&venv)?;
    for (name, text) in SITE_FILES {
        std::fs::write(site.join(name), text).map_err(io(format!("write {name}")))?;
    }
    progress("[4/4] building matplotlib's font cache");
    let cache = venv.join("mplcache");
    std::fs::create_dir_all(&cache).map_err(io("create the font cache directory"))?;
    run(
        "building the font cache",
        Command::new(venv.join("bin/python3"))
            .args(["-c", "import matplotlib.font_manager"])
            .env("MPLCONFIGDIR", &cache)
            .env("MPLBACKEND", "Agg"),
        &mut |_| {},
    )?;
    // The cache names matplotlib's own fonts by their path here; they will be under the
    // final directory.
    let (from, to) = (tmp.to_string_lossy(), final_dir.to_string_lossy());
    for entry in std::fs::read_dir(&cache).map_err(io("read the font cache"))?.flatten() {
        let text = std::fs::read_to_string(entry.path()).map_err(io("read the font cache"))?;
        std::fs::write(entry.path(), text.replace(from.as_ref(), to.as_ref())).map_err(io("write the font cache"))?;
    }
    Ok(())
}

fn site_packages(venv: &Path) -> Result<PathBuf, InstallError> {
    let lib = venv.join("lib");
    for entry in std::fs::read_dir(&lib).map_err(io("read the venv"))?.flatten() {
        let site = entry.path().join("site-packages");
        if site.is_dir() {
            return Ok(site);
        }
    }
    Err(InstallError::Step {
        step: "finding site-packages".into(),
        status: "missing".into(),
        output: lib.display().to_string(),
    })
}

/// Runs a step, feeding each line of its output to `line` and keeping the last of them
/// for the error.
fn run(step: &str, command: &mut Command, line: &mut dyn FnMut(&str)) -> Result<(), InstallError> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io(step))?;
    let mut stderr = child.stderr.take();
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_string(&mut text);
        }
        text
    });
    let mut tail: Vec<String> = Vec::new();
    if let Some(out) = child.stdout.take() {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            line(&l);
            tail.push(l);
            if tail.len() > 20 {
                tail.remove(0);
            }
        }
    }
    let status = child.wait().map_err(io(step))?;
    let errors = errors.join().unwrap_or_default();
    if status.success() {
        return Ok(());
    }
    let mut output = tail.join("\n");
    let errors: Vec<&str> = errors.lines().collect();
    output.push('\n');
    output.push_str(&errors[errors.len().saturating_sub(20)..].join("\n"));
    Err(InstallError::Step {
        step: step.into(),
        status: status.to_string(),
        output: output.trim().to_owned(),
    })
}

/// What `serve` does before serving: use the installed runtime; or install it (when
/// `install_runtime` is on), saying where and how to skip it; or, when that fails or is
/// off, run on the bare interpreter with a warning. Says what it installed, or could
/// not, in a sentence (`sandcall mcp` tells its first tool call).
pub fn prepare_for_serve(config: &mut Config) -> Option<String> {
    let dir = runtime_dir(config);
    if let Some(found) = find(&dir, &config.languages.python) {
        tracing::info!(runtime = %found.dir.display(), packages = found.packages.len(), "Python runtime");
        apply(config, &found);
        return None;
    }
    if !config.languages.python.exists() {
        // The server refuses to start with a missing interpreter, and says so.
        return None;
    }
    if !config.languages.install_runtime {
        tracing::warn!(
            runtime_dir = %dir.display(),
            "no Python runtime installed and install_runtime is off: Python runs on the bare {} \
             (run `sandcall runtime install` to add numpy, pandas, matplotlib, ...)",
            config.languages.python.display()
        );
        return None;
    }
    eprintln!(
        "sandcall: first start: installing the Python runtime ({} packages: numpy, pandas, matplotlib, ...) into {}.\n\
         sandcall: this takes a few minutes once; to skip it, set install_runtime = false or SANDCALL_INSTALL_RUNTIME=false.",
        count_packages(),
        dir.display()
    );
    let started = std::time::Instant::now();
    match install(&dir, &config.languages.python, &mut |line| {
        eprintln!("sandcall: {line}")
    }) {
        Ok(installed) => {
            let seconds = started.elapsed().as_secs_f64();
            eprintln!(
                "sandcall: the Python runtime is ready in {} ({seconds:.0} s)",
                installed.dir.display(),
            );
            apply(config, &installed);
            Some(format!(
                "The first start installed the Python runtime ({} packages: numpy, pandas, matplotlib, ...) in {seconds:.0} s.",
                installed.packages.len()
            ))
        }
        Err(e) => {
            let why = format!(
                "could not install the Python runtime ({e}); Python runs on the bare {} without numpy, pandas, \
                 matplotlib... (`sandcall runtime install` retries)",
                config.languages.python.display()
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
    fn the_checked_in_lock_parses_and_holds_the_data_stack() {
        let packages = parse_lock(LOCK).unwrap();
        let names: Vec<String> = packages.iter().map(|p| p.name.to_lowercase()).collect();
        for wanted in [
            "numpy",
            "pandas",
            "scipy",
            "statsmodels",
            "scikit-learn",
            "scikit-image",
            "matplotlib",
            "seaborn",
            "plotly",
            "sympy",
            "networkx",
            "pillow",
            "opencv-python-headless",
            "pyarrow",
            "openpyxl",
            "xlrd",
            "xlsxwriter",
            "python-docx",
            "python-pptx",
            "reportlab",
            "pypdf",
            "pdfminer.six",
            "beautifulsoup4",
            "lxml",
            "tabulate",
            "numba",
        ] {
            assert!(names.contains(&wanted.to_string()), "{wanted} is not in the lock");
        }
        // Each package once.
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
    }

    #[test]
    fn docs_runtimes_lists_every_package_of_the_lock() {
        let doc = include_str!("../../../docs/runtimes.md");
        for p in parse_lock(LOCK).unwrap() {
            let row = format!("| `{}` | {} |", p.name, p.version);
            assert!(doc.contains(&row), "docs/runtimes.md lacks {row}");
        }
    }

    #[test]
    fn lock_lines_must_be_exact_pins() {
        let ok = parse_lock("# comment\n\nnumpy==2.4.6\npdfminer.six==20260107\n  \n").unwrap();
        assert_eq!(
            ok,
            vec![
                Package {
                    name: "numpy".into(),
                    version: "2.4.6".into()
                },
                Package {
                    name: "pdfminer.six".into(),
                    version: "20260107".into()
                },
            ]
        );
        for bad in [
            "numpy",
            "numpy>=2",
            "numpy==",
            "==1.0",
            "numpy==1.0; os_name=='nt'",
            "-e ./x",
            "a b==1",
        ] {
            let e = parse_lock(bad).unwrap_err().to_string();
            assert!(e.starts_with("line 1:"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_runtime_is_named_by_its_lock() {
        let py = Path::new("/usr/bin/python3");
        let id = runtime_id("numpy==1\n", py);
        assert!(id.starts_with("python-") && id.len() == "python-".len() + 16, "{id}");
        assert_eq!(id, runtime_id("numpy==1\n", py));
        assert_ne!(id, runtime_id("numpy==2\n", py));
        // Another interpreter, another runtime.
        assert_ne!(id, runtime_id("numpy==1\n", Path::new("/usr/bin/python3.12")));
    }

    #[test]
    fn a_partial_install_is_not_found() {
        let dir = std::env::temp_dir().join(format!("sandcall-rt-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let py = Path::new("/usr/bin/python3");
        let id = runtime_id(LOCK, py);
        // A partial directory beside the final one is never used.
        std::fs::create_dir_all(dir.join(format!(".{id}.partial-1/venv/bin"))).unwrap();
        assert!(find(&dir, py).is_none());
        // A final directory whose interpreter is there but whose lock copy is not
        // (written before the rename, so this is not an install) is not used either.
        std::fs::create_dir_all(dir.join(&id).join("venv/bin")).unwrap();
        std::os::unix::fs::symlink("/usr/bin/python3", dir.join(&id).join("venv/bin/python3")).unwrap();
        assert!(find(&dir, py).is_none());
        std::fs::write(dir.join(&id).join("requirements.lock"), "numpy==1\n").unwrap();
        let found = find(&dir, py).unwrap();
        assert!(
            find(&dir, Path::new("/usr/bin/python3.11")).is_none(),
            "built for another interpreter"
        );
        assert_eq!(found.id, id);
        assert_eq!(found.packages.len(), 1);
        let mut config = Config::default();
        apply(&mut config, &found);
        assert_eq!(config.languages.python, found.python);
        assert!(config.languages.extra_runtime_paths.contains(&found.dir));
        // Only a runtime under `runtime_dir` is the one in use.
        assert!(in_use(&config).is_none());
        config.languages.runtime_dir = Some(dir.clone());
        assert_eq!(in_use(&config), Some(found));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
