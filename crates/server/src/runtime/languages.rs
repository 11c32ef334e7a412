//! The languages sandcall runs, as data: one declaration each, read by `runtime` (argv,
//! environment, warm launcher, tool stubs), the pool (one warm set per language that has
//! a warm launcher), `exec` (is the toolchain there?) and `doctor`. A language's names
//! and aliases are `sandcall_api::Language::names`. To add a language, see
//! docs/runtimes.md, "Adding a language".

use crate::config::Config;
use sandcall_api::Language;
use std::path::{Path, PathBuf};

/// Which config key names the program that runs a language.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interpreter {
    Python,
    Bash,
    Node,
}

/// How a run starts: `{interpreter}` and `{code}` (the code file's path in the sandbox)
/// are replaced, then the program's arguments follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// `{interpreter} {code} args...`
    Direct,
    /// `{interpreter} {runner} args...`: a runner file (a support file) runs the code.
    Runner,
}

/// How a warm sandbox's program waits for its code (see `runtime::warm_launch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Warm {
    /// The runner itself, started with its source inline, waits on fd 3.
    Runner,
    /// A tiny shell waits on fd 3, then execs the interpreter on the code.
    Shell,
}

/// How the declared tools of a programmatic run reach the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolStub {
    /// runner.py defines Python functions from tools.json.
    PythonRunner,
    /// tools.sh, sourced through BASH_ENV, defines shell functions that run
    /// `sandcall tool-call`.
    BashFunctions,
    /// runner.mjs defines global async functions from tools.json.
    NodeRunner,
}

/// A runner: its file name in the code directory, and its source.
#[derive(Debug, Clone, Copy)]
pub struct Runner {
    pub file: &'static str,
    pub source: &'static str,
}

pub const PYTHON_RUNNER: Runner = Runner {
    file: "runner.py",
    source: include_str!("runner.py"),
};

pub const NODE_RUNNER: Runner = Runner {
    file: "runner.mjs",
    source: include_str!("runner.mjs"),
};

/// One language.
#[derive(Debug, Clone, Copy)]
pub struct Declaration {
    pub language: Language,
    pub interpreter: Interpreter,
    /// The code's file name in /run/sandcall.
    pub code_file: &'static str,
    /// Variables beyond the common ones (`runtime::launch`).
    pub env: &'static [(&'static str, &'static str)],
    /// The runner, if the language has one.
    pub runner: Option<Runner>,
    /// How plain (tool-less) runs start; programmatic runs always start through the
    /// runner when there is one.
    pub start: Start,
    /// Interpreter flags that come before the runner when it runs inline (warm).
    pub warm_inline_flags: &'static [&'static str],
    pub warm: Option<Warm>,
    pub tools: ToolStub,
    /// Needs the TypeScript transpiler (`typescript_transpiler`).
    pub transpiler: bool,
}

/// Every declared language, in `Language::ALL`'s order.
pub const LANGUAGES: [Declaration; 4] = [
    Declaration {
        language: Language::Python,
        interpreter: Interpreter::Python,
        code_file: "main.py",
        env: &[
            ("PYTHONUNBUFFERED", "1"),
            ("PYTHONDONTWRITEBYTECODE", "1"),
            // Modules the caller uploads next to the program are importable.
            ("PYTHONPATH", "/mnt/data"),
            ("MPLBACKEND", "Agg"),
        ],
        runner: Some(PYTHON_RUNNER),
        start: Start::Direct,
        warm_inline_flags: &["-c"],
        warm: Some(Warm::Runner),
        tools: ToolStub::PythonRunner,
        transpiler: false,
    },
    Declaration {
        language: Language::Bash,
        interpreter: Interpreter::Bash,
        code_file: "main.sh",
        env: &[],
        runner: None,
        start: Start::Direct,
        warm_inline_flags: &[],
        warm: Some(Warm::Shell),
        tools: ToolStub::BashFunctions,
        transpiler: false,
    },
    Declaration {
        language: Language::JavaScript,
        interpreter: Interpreter::Node,
        // An ES module: top-level await and `import` work as they do in a .mjs file.
        code_file: "main.mjs",
        env: &[("SANDCALL_MAIN", "/run/sandcall/main.mjs")],
        runner: Some(NODE_RUNNER),
        start: Start::Runner,
        warm_inline_flags: &["--input-type=module", "-e"],
        warm: Some(Warm::Runner),
        tools: ToolStub::NodeRunner,
        transpiler: false,
    },
    Declaration {
        language: Language::TypeScript,
        interpreter: Interpreter::Node,
        code_file: "main.ts",
        env: &[("SANDCALL_MAIN", "/run/sandcall/main.ts")],
        runner: Some(NODE_RUNNER),
        start: Start::Runner,
        warm_inline_flags: &["--input-type=module", "-e"],
        warm: Some(Warm::Runner),
        tools: ToolStub::NodeRunner,
        transpiler: true,
    },
];

/// The declaration of `language`.
pub fn declaration(language: Language) -> &'static Declaration {
    // Every `Language` has exactly one declaration (a unit test checks).
    LANGUAGES
        .iter()
        .find(|d| d.language == language)
        .unwrap_or(&LANGUAGES[0])
}

/// The interpreter that runs `language`, as configured.
pub fn interpreter(language: Language, config: &Config) -> &Path {
    match declaration(language).interpreter {
        Interpreter::Python => &config.python,
        Interpreter::Bash => &config.bash,
        Interpreter::Node => &config.node,
    }
}

/// The config key of `language`'s interpreter.
pub fn interpreter_key(language: Language) -> &'static str {
    match declaration(language).interpreter {
        Interpreter::Python => "python",
        Interpreter::Bash => "bash",
        Interpreter::Node => "node",
    }
}

/// The sucrase package directory, if `language` needs it.
pub fn transpiler(language: Language, config: &Config) -> Option<&Path> {
    if declaration(language).transpiler {
        config.typescript_transpiler.as_deref()
    } else {
        None
    }
}

/// Variables a launch of `language` takes from the config: the transpiler's path, which
/// the runner reads (and removes before the program starts).
pub fn config_env(language: Language, config: &Config) -> Vec<(String, String)> {
    match transpiler(language, config) {
        Some(dir) => vec![("SANDCALL_TYPESCRIPT".into(), dir.to_string_lossy().into_owned())],
        None => Vec::new(),
    }
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Why `language` cannot run on this host (its interpreter or transpiler is missing),
/// or None when it can. One `stat` or two.
pub fn missing(language: Language, config: &Config) -> Option<String> {
    let path = interpreter(language, config);
    if !executable(path) {
        return Some(format!(
            "its interpreter ({}) is not installed on this server (config `{}`)",
            path.display(),
            interpreter_key(language)
        ));
    }
    if declaration(language).transpiler {
        let ok = config
            .typescript_transpiler
            .as_ref()
            .is_some_and(|dir| dir.join("package.json").is_file());
        if !ok {
            return Some(
                "its transpiler (sucrase) is not installed on this server (config `typescript_transpiler`)".into(),
            );
        }
    }
    None
}

/// Host paths the sandbox must see besides /usr for the declared languages: the
/// transpiler's `node_modules` directory (sucrase's own dependencies sit beside it).
pub fn runtime_paths(config: &Config) -> Vec<PathBuf> {
    config
        .typescript_transpiler
        .as_ref()
        .and_then(|dir| dir.parent())
        .filter(|dir| dir.is_dir())
        .map(|dir| vec![dir.to_path_buf()])
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_language_is_declared_once() {
        for language in Language::ALL {
            assert_eq!(LANGUAGES.iter().filter(|d| d.language == language).count(), 1);
            assert_eq!(declaration(language).language, language);
        }
    }

    #[test]
    fn a_missing_interpreter_or_transpiler_is_named() {
        let config = Config {
            node: PathBuf::from("/nonexistent/node"),
            ..Config::default()
        };
        let why = missing(Language::JavaScript, &config).unwrap();
        assert!(why.contains("/nonexistent/node") && why.contains("`node`"), "{why}");
        let config = Config {
            node: PathBuf::from("/usr/bin/bash"),
            typescript_transpiler: None,
            ..Config::default()
        };
        assert!(missing(Language::JavaScript, &config).is_none());
        let why = missing(Language::TypeScript, &config).unwrap();
        assert!(why.contains("typescript_transpiler"), "{why}");
        assert!(missing(Language::Bash, &config).is_none());
    }
}
