//! The languages: the interpreters and toolchains a run uses, the operator's own languages, the managed runtimes, and the warm sandboxes kept for each.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// LanguagesConfig: the keys of docs/configuration.md this section holds. Each field's doc comment
/// gives its unit and default.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct LanguagesConfig {
    /// Warm sandboxes kept ready per language (Python, Bash), each with its
    /// interpreter started; 0 turns the pool off. Each holds up to `memory_limit_mb`.
    /// Default 4.
    pub warm_pool_size: usize,
    /// The languages that get a warm set of `warm_pool_size` sandboxes (names or
    /// aliases); a language whose toolchain is missing gets none. Default all four:
    /// python, bash, javascript, typescript.
    pub warm_languages: Vec<String>,
    /// Python interpreter, an absolute path inside the runtime. Default `/usr/bin/python3`.
    pub python: PathBuf,
    /// Bash interpreter. Default `/usr/bin/bash`.
    pub bash: PathBuf,
    /// Node.js, which runs JavaScript and TypeScript. Default `/usr/bin/node`. When it is
    /// missing, `js` and `ts` answer `unsupported_capability`.
    pub node: PathBuf,
    /// The TypeScript transpiler: the directory of a `sucrase` npm package (its
    /// `node_modules` directory is bound read-only into every sandbox). Default none:
    /// the one in the managed npm set (`runtime_dir`), which the first start installs.
    pub typescript_transpiler: Option<PathBuf>,
    /// More host paths bound read-only into every sandbox (an interpreter outside /usr,
    /// say). Default none.
    pub extra_runtime_paths: Vec<PathBuf>,
    /// Directories, in order, where the compiled languages' toolchains (gcc, go, java,
    /// ...) are looked up; each one outside /usr is bound read-only into every sandbox
    /// and put first on the program's PATH. A language whose commands are not found
    /// answers `unsupported_capability`. Default `["/usr/bin"]`.
    pub toolchain_path: Vec<PathBuf>,
    /// Languages the operator declares (`[[languages]]`): names, code file, optional
    /// compile command, run command, commands and paths the toolchain needs
    /// (docs/runtimes.md, "Languages an operator declares"). Default none.
    #[serde(rename = "languages")]
    pub declared: Vec<LanguageConfig>,
    /// Modules the preloaded warm Python sandboxes import while they wait, when Python
    /// runs on the managed runtime, so a run's own import of them costs nothing; each a
    /// dotted module name. They count against the run's `memory_limit_mb`. A run whose
    /// code imports one of them (its top-level package) takes a preloaded sandbox, any
    /// other run a plain one (docs/runtimes.md#warm-imports). Empty turns it off.
    /// Default `["numpy", "pandas", "matplotlib.pyplot"]`.
    pub warm_preload: Vec<String>,
    /// Preloaded warm Python sandboxes kept ready beside the `warm_pool_size` plain
    /// ones; each holds about 90 MiB and takes about a second of CPU to build. 0 turns
    /// them off. Default 2.
    pub warm_preload_pool_size: usize,
    /// Fork Python runs (plain and preloaded) from a template that has started the
    /// interpreter and imported the preloads (a "zygote", ARCHITECTURE.md "Forked
    /// runs"), instead of starting an interpreter for each. Each principal has templates
    /// of its own (`zygote_templates`); while a principal's is being (re)built, its runs
    /// take warm sandboxes built the usual way (or the cold path). Needs the server to run as root (without it, a note in the log, and no
    /// template). Default true.
    pub zygote: bool,
    /// With `zygote`: the most templates alive at once. Each principal gets templates
    /// of its own (one per set it uses), started at its first run and stopped after
    /// `zygote_template_idle_s` without one, so that runs of two principals never share
    /// a template's memory layout, stack canary and hash seed; a principal that finds
    /// no room runs in sandboxes built the usual way. Each costs about an idle warm
    /// sandbox's memory (docs/benchmarks.md). 0 forks nothing. Default 16.
    pub zygote_templates: usize,
    /// With `zygote`: seconds without a run after which a principal's template is
    /// stopped (the runs forked from it live on); at least 1. Default 300.
    pub zygote_template_idle_s: u64,
    /// Where managed runtimes are installed (`sandcall runtime install`), one directory
    /// per lock (`python-<hash>`), bound read-only into every sandbox; may be shared by
    /// several data dirs. Default `<data_dir>/runtimes`.
    pub runtime_dir: Option<PathBuf>,
    /// `serve` installs the Python runtime on first start when it is missing (minutes,
    /// once; without registry access it warns and runs on the bare `python`). Default true.
    pub install_runtime: bool,
}

impl Default for LanguagesConfig {
    fn default() -> Self {
        LanguagesConfig {
            warm_pool_size: 4,
            warm_languages: ["python", "bash", "javascript", "typescript"]
                .map(String::from)
                .to_vec(),
            python: PathBuf::from("/usr/bin/python3"),
            bash: PathBuf::from("/usr/bin/bash"),
            node: PathBuf::from("/usr/bin/node"),
            typescript_transpiler: None,
            extra_runtime_paths: Vec::new(),
            toolchain_path: vec![PathBuf::from("/usr/bin")],
            declared: Vec::new(),
            warm_preload: ["numpy", "pandas", "matplotlib.pyplot"].map(String::from).to_vec(),
            warm_preload_pool_size: 2,
            zygote: true,
            zygote_templates: 16,
            zygote_template_idle_s: 300,
            runtime_dir: None,
            install_runtime: true,
        }
    }
}

/// A language setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LanguagesError {
    #[error("{0} must be an absolute path")]
    NotAbsolute(&'static str),
    #[error("warm_languages names {0:?}, which is not a language (python, bash, javascript, typescript)")]
    WarmLanguage(String),
    #[error("{0} entry {1} must be absolute, without ..")]
    SearchPath(&'static str, String),
    #[error("warm_preload entry {0:?} must be a dotted Python module name")]
    WarmPreload(String),
    /// A `[[languages]]` entry; the message names it and what is wrong.
    #[error("{0}")]
    Declared(String),
    #[error("too many languages")]
    TooMany,
    #[error("zygote_template_idle_s must be at least 1")]
    TemplateIdle,
}

impl LanguagesConfig {
    pub fn validate(&self) -> Result<(), LanguagesError> {
        for (name, path) in [("python", &self.python), ("bash", &self.bash), ("node", &self.node)]
            .into_iter()
            .chain(self.typescript_transpiler.iter().map(|p| ("typescript_transpiler", p)))
        {
            if !path.is_absolute() {
                return Err(LanguagesError::NotAbsolute(name));
            }
        }
        if let Some(name) = self
            .warm_languages
            .iter()
            .find(|n| sandcall_api::Language::parse(n).is_none())
        {
            return Err(LanguagesError::WarmLanguage(name.clone()));
        }
        check_search_path("toolchain_path", &self.toolchain_path)?;
        if self.zygote_template_idle_s == 0 {
            return Err(LanguagesError::TemplateIdle);
        }
        self.validate_declared()?;
        for m in &self.warm_preload {
            let ok = !m.is_empty()
                && m.split('.').all(|part| {
                    part.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                });
            if !ok {
                return Err(LanguagesError::WarmPreload(m.clone()));
            }
        }
        check_search_path("extra_runtime_paths", &self.extra_runtime_paths)
    }

    fn validate_declared(&self) -> Result<(), LanguagesError> {
        let bad = |m: String| Err(LanguagesError::Declared(m));
        let mut seen: Vec<String> = Vec::new();
        for (i, l) in self.declared.iter().enumerate() {
            let what = format!("languages[{i}]");
            if l.names.is_empty() {
                return bad(format!("{what} needs at least one name"));
            }
            for name in &l.names {
                let lower = name.trim().to_ascii_lowercase();
                let ok = !lower.is_empty()
                    && lower.len() <= 32
                    && lower.chars().all(|c| c.is_ascii_alphanumeric() || "+-_.#".contains(c));
                if !ok {
                    return bad(format!(
                        "{what}: name {name:?} must be 1 to 32 letters, digits or + - _ . #"
                    ));
                }
                if sandcall_api::Language::parse(&lower).is_some() || seen.contains(&lower) {
                    return bad(format!("{what}: name {name:?} is already a language's name"));
                }
                seen.push(lower);
            }
            let reserved = ["args", "tools.json", "tools.sh", "runner.py", "runner.mjs", "bin"];
            let plain = !l.code_file.is_empty()
                && l.code_file.len() <= 64
                && !l.code_file.starts_with('.')
                && l.code_file
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
            if !plain || reserved.contains(&l.code_file.as_str()) {
                return bad(format!(
                    "{what}: code_file {:?} must be a plain file name (letters, digits, . _ -)",
                    l.code_file
                ));
            }
            if l.run.trim().is_empty() || l.compile.as_ref().is_some_and(|c| c.trim().is_empty()) {
                return bad(format!("{what}: run (and compile, when given) must not be blank"));
            }
            if l.tools
                .iter()
                .any(|t| t.is_empty() || (t.contains('/') && !t.starts_with('/')))
            {
                return bad(format!("{what}: tools are command names or absolute paths"));
            }
            if let Some(p) = l
                .paths
                .iter()
                .find(|p| !p.is_absolute() || p.components().any(|c| matches!(c, std::path::Component::ParentDir)))
            {
                return bad(format!("{what}: path {} must be absolute, without ..", p.display()));
            }
        }
        if self.declared.len() > usize::from(u16::MAX) {
            return Err(LanguagesError::TooMany);
        }
        Ok(())
    }
}

/// Every entry of a list of host paths is absolute, without `..`.
fn check_search_path(key: &'static str, paths: &[PathBuf]) -> Result<(), LanguagesError> {
    match paths
        .iter()
        .find(|p| !p.is_absolute() || p.components().any(|c| matches!(c, std::path::Component::ParentDir)))
    {
        Some(p) => Err(LanguagesError::SearchPath(key, p.display().to_string())),
        None => Ok(()),
    }
}

/// A language the operator declares (`[[languages]]`). Its commands are Bash command
/// lines: `compile` runs in the code directory, `run` in the working directory with the
/// program's arguments after it; `$CODE` is the code file's path, `$BUILD` an empty
/// directory on the run's /tmp.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LanguageConfig {
    /// The names it answers to (any case), its own name first.
    pub names: Vec<String>,
    /// The code's file name (`main.awk`).
    pub code_file: String,
    /// Compiles the code; a failure ends the run with its status.
    #[serde(default)]
    pub compile: Option<String>,
    /// Runs the program: a simple command.
    pub run: String,
    /// Commands it needs, looked up in `toolchain_path` (or absolute paths); when one
    /// is missing the language answers `unsupported_capability`.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Host paths bound read-only into every sandbox (its toolchain outside /usr).
    #[serde(default)]
    pub paths: Vec<PathBuf>,
}
