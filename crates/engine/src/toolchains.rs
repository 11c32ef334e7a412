//! `sandcall runtime install --toolchains`: the compiled languages' Debian packages.
//! Each built-in language names its packages beside its declaration
//! (`runtime::languages::LANGUAGES`, `Build::packages`); this module takes the ones of
//! the languages whose toolchain is missing, and installs them with `apt-get install`
//! when sandcall is root and apt-get is on PATH, or else says the exact command to run.
//! `serve`'s start names the languages that are unavailable and this command.
//!
//! Blocking code (it runs apt-get). Must not touch the sandbox.

use crate::runtime::languages::{self, State};
use sandcall_api::Language;
use sandcall_config::Config;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The command that installs the missing toolchains, as the messages name it.
pub const COMMAND: &str = "sandcall runtime install --toolchains";

/// Where apt keeps its package lists: with none there, `apt-get install` cannot find
/// any package (a fresh container, or a machine whose lists were cleaned).
const APT_LISTS: &str = "/var/lib/apt/lists";

/// A built-in language whose toolchain is missing, and the packages that have it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingToolchain {
    pub language: Language,
    pub packages: &'static [&'static str],
}

/// The built-in languages whose toolchain is not found in `toolchain_path`.
pub fn missing(config: &Config) -> Vec<MissingToolchain> {
    languages::LANGUAGES
        .iter()
        .filter(|d| d.build.is_some())
        .filter_map(|d| match languages::state(d.language, config) {
            State::MissingToolchain { packages, .. } if !packages.is_empty() => Some(MissingToolchain {
                language: d.language,
                packages,
            }),
            _ => None,
        })
        .collect()
}

/// Every package of `missing`, each once, in the declarations' order.
pub fn packages(missing: &[MissingToolchain]) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for p in missing.iter().flat_map(|m| m.packages.iter().copied()) {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// apt-get's arguments that install `packages`: no recommended packages (each
/// language names all it needs), no questions.
pub fn apt_install_args(packages: &[&str]) -> Vec<String> {
    ["install", "-y", "--no-install-recommends"]
        .into_iter()
        .chain(packages.iter().copied())
        .map(String::from)
        .collect()
}

/// The command line that installs `packages`, as an operator types it.
pub fn apt_install_line(packages: &[&str]) -> String {
    format!("apt-get {}", apt_install_args(packages).join(" "))
}

/// The languages' own names, for messages: `go, php, rust`.
pub fn names(missing: &[MissingToolchain]) -> String {
    missing
        .iter()
        .map(|m| m.language.names()[0])
        .collect::<Vec<_>>()
        .join(", ")
}

/// What `--toolchains` does on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Every toolchain is there.
    Nothing,
    /// Run apt-get (after `apt-get update` when the package lists are missing).
    Install { apt_get: PathBuf, update_first: bool },
    /// Cannot install here: why, and the operator runs the command line instead.
    Print { why: String },
}

/// The plan for `packages` given who runs sandcall, where apt-get is, and whether
/// apt's package lists are there.
pub fn plan(packages: &[&str], root: bool, apt_get: Option<PathBuf>, lists_present: bool) -> Plan {
    if packages.is_empty() {
        return Plan::Nothing;
    }
    match (root, apt_get) {
        (true, Some(apt_get)) => Plan::Install {
            apt_get,
            update_first: !lists_present,
        },
        (_, None) => Plan::Print {
            why: "apt-get is not on PATH (not a Debian or Ubuntu machine?): install the packages with this \
                  machine's package manager, or set `toolchain_path` to where the toolchains are"
                .into(),
        },
        (false, Some(_)) => Plan::Print {
            why: "installing packages needs root: run the command below as root (or this command with sudo)".into(),
        },
    }
}

/// apt-get on PATH.
pub fn find_apt_get() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("apt-get"))
        .find(|p| p.is_file())
}

/// Whether apt's package lists are there (any `*_Packages*` file).
pub fn lists_present(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().contains("_Packages"))
    })
}

/// Why `--toolchains` did not leave every toolchain installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// Not root, or no apt-get: the operator runs `line`.
    #[error("{why}")]
    CannotInstall { why: String, line: String },
    #[error("{command} failed ({status})")]
    Apt { command: String, status: String },
    #[error("cannot run {command}: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the packages are installed but {names} still cannot run: {why} (is /usr/bin in `toolchain_path`?)")]
    StillMissing { names: String, why: String },
}

/// Installs the missing toolchains' packages (root and apt-get), reporting through
/// `progress`; apt-get's own output goes to stderr. Returns the languages it added.
pub fn install(config: &Config, progress: &mut dyn FnMut(&str)) -> Result<Vec<MissingToolchain>, InstallError> {
    let wanted = missing(config);
    let packages = packages(&wanted);
    let root = nix::unistd::geteuid().is_root();
    match plan(&packages, root, find_apt_get(), lists_present(Path::new(APT_LISTS))) {
        Plan::Nothing => Ok(Vec::new()),
        Plan::Print { why } => Err(InstallError::CannotInstall {
            why,
            line: apt_install_line(&packages),
        }),
        Plan::Install { apt_get, update_first } => {
            progress(&format!(
                "installing the toolchains of {}: {}",
                names(&wanted),
                apt_install_line(&packages)
            ));
            if update_first {
                progress("apt's package lists are missing: apt-get update first");
                apt(&apt_get, &["update".to_string()])?;
            }
            if let Err(e) = apt(&apt_get, &apt_install_args(&packages)) {
                if update_first {
                    return Err(e);
                }
                // Lists that name versions the mirror no longer has: once more, fresh.
                progress(&format!("{e}: apt-get update, then once more"));
                apt(&apt_get, &["update".to_string()])?;
                apt(&apt_get, &apt_install_args(&packages))?;
            }
            let left = missing(config);
            if let Some(first) = left.first() {
                return Err(InstallError::StillMissing {
                    names: names(&left),
                    why: languages::missing(first.language, config).unwrap_or_default(),
                });
            }
            Ok(wanted)
        }
    }
}

/// Runs apt-get with `args`, without questions, its output on stderr.
fn apt(apt_get: &Path, args: &[String]) -> Result<(), InstallError> {
    let command = format!("{} {}", apt_get.display(), args.join(" "));
    let status = Command::new(apt_get)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .status()
        .map_err(|source| InstallError::Spawn {
            command: command.clone(),
            source,
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(InstallError::Apt {
            command,
            status: status.to_string(),
        })
    }
}

/// What `serve` says at its start when built-in languages cannot run: one message that
/// names them, why, and the command that adds the missing toolchains. None when every
/// built-in language is ready.
pub fn start_notice(config: &Config) -> Option<String> {
    let unavailable: Vec<(Language, String)> = languages::LANGUAGES
        .iter()
        .filter_map(|d| languages::missing(d.language, config).map(|why| (d.language, why)))
        .collect();
    if unavailable.is_empty() {
        return None;
    }
    let names: Vec<&str> = unavailable.iter().map(|(l, _)| l.names()[0]).collect();
    let mut out = format!(
        "{} of {} languages are unavailable on this server: {}.",
        unavailable.len(),
        languages::LANGUAGES.len(),
        names.join(", ")
    );
    let toolchains = missing(config);
    if !toolchains.is_empty() {
        out.push_str(&format!(
            " The toolchains of {} are not installed: `{COMMAND}` adds them ({}).",
            self::names(&toolchains),
            apt_install_line(&packages(&toolchains))
        ));
    }
    let others: Vec<String> = unavailable
        .iter()
        .filter(|(l, _)| !toolchains.iter().any(|m| m.language == *l))
        .map(|(l, why)| format!("{}: {why}", l.names()[0]))
        .collect();
    if !others.is_empty() {
        out.push_str(&format!(" {}.", others.join("; ")));
    }
    out.push_str(" `sandcall doctor` lists every language's state.");
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with_toolchain_path(dirs: &[&str]) -> Config {
        Config {
            languages: sandcall_config::LanguagesConfig {
                toolchain_path: dirs.iter().map(PathBuf::from).collect(),
                ..Default::default()
            },
            ..Config::default()
        }
    }

    #[test]
    fn every_compiled_language_names_its_packages_and_nothing_else_does() {
        for d in &languages::LANGUAGES {
            match d.build {
                Some(b) => assert!(!b.packages.is_empty(), "{:?} names no package", d.language),
                None => assert!(d.interpreter != languages::Interpreter::Toolchain),
            }
        }
    }

    #[test]
    fn with_no_toolchain_found_every_package_is_listed_once_in_order() {
        let config = config_with_toolchain_path(&["/nonexistent"]);
        let wanted = missing(&config);
        assert_eq!(names(&wanted), "c, cpp, go, java, php, rust, r, fortran, d");
        assert_eq!(
            packages(&wanted),
            [
                "gcc",
                "libc6-dev",
                "g++",
                "golang-go",
                "default-jdk-headless",
                "php-cli",
                "rustc",
                "r-base-core",
                "gfortran",
                "gdc"
            ]
        );
        assert_eq!(
            apt_install_line(&packages(&wanted)[..3]),
            "apt-get install -y --no-install-recommends gcc libc6-dev g++"
        );
        assert_eq!(
            apt_install_args(&["gdc"]),
            ["install", "-y", "--no-install-recommends", "gdc"]
        );
    }

    #[test]
    fn only_the_missing_toolchains_are_listed() {
        // A directory with a `gcc` (bash will do: only its being executable counts).
        let dir = std::env::temp_dir().join(format!("sandcall-toolchains-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink("/usr/bin/bash", dir.join("gcc")).unwrap();
        let config = config_with_toolchain_path(&[dir.to_str().unwrap()]);
        let wanted = missing(&config);
        assert!(!wanted.iter().any(|m| m.language == Language::C), "{wanted:?}");
        assert!(wanted.iter().any(|m| m.language == Language::Cpp), "{wanted:?}");
        assert!(!packages(&wanted).contains(&"gcc"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_plan_installs_only_as_root_with_apt_get_and_updates_empty_lists() {
        let apt = Some(PathBuf::from("/usr/bin/apt-get"));
        assert_eq!(plan(&[], false, None, false), Plan::Nothing);
        assert_eq!(
            plan(&["gcc"], true, apt.clone(), true),
            Plan::Install {
                apt_get: PathBuf::from("/usr/bin/apt-get"),
                update_first: false
            }
        );
        assert_eq!(
            plan(&["gcc"], true, apt.clone(), false),
            Plan::Install {
                apt_get: PathBuf::from("/usr/bin/apt-get"),
                update_first: true
            }
        );
        let Plan::Print { why } = plan(&["gcc"], false, apt, true) else {
            panic!("not root: must print")
        };
        assert!(why.contains("root"), "{why}");
        let Plan::Print { why } = plan(&["gcc"], true, None, true) else {
            panic!("no apt-get: must print")
        };
        assert!(why.contains("apt-get is not on PATH"), "{why}");
    }

    #[test]
    fn package_lists_are_found_by_their_names() {
        let dir = std::env::temp_dir().join(format!("sandcall-apt-lists-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("partial")).unwrap();
        assert!(!lists_present(&dir));
        assert!(!lists_present(&dir.join("nonexistent")));
        std::fs::write(
            dir.join("deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages.lz4"),
            "",
        )
        .unwrap();
        assert!(lists_present(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_start_notice_names_the_languages_and_the_command() {
        let config = config_with_toolchain_path(&["/nonexistent"]);
        let notice = start_notice(&config).unwrap();
        assert!(notice.contains("go, java, php"), "{notice}");
        assert!(notice.contains(&format!("`{COMMAND}`")), "{notice}");
        assert!(
            notice.contains("apt-get install -y --no-install-recommends gcc libc6-dev"),
            "{notice}"
        );
    }

    #[test]
    fn the_container_image_installs_every_package_of_the_list() {
        let dockerfile = include_str!("../../../deploy/Dockerfile");
        let all = packages(&missing(&config_with_toolchain_path(&["/nonexistent"])));
        for p in all {
            assert!(
                dockerfile.split_whitespace().any(|w| w == p),
                "deploy/Dockerfile does not install {p}"
            );
        }
    }
}
