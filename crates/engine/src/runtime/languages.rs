//! The languages sandcall runs, as data: one declaration each, read by `runtime` (argv,
//! environment, warm launcher, tool stubs), the pool (one warm set per language that has
//! a warm launcher), `exec` (is the toolchain there?) and `doctor`. A language's names
//! and aliases are `sandcall_api::Language::names`. To add a language, see
//! docs/runtimes.md, "Adding a language".

use sandcall_api::Language;
use sandcall_config::Config;
use std::path::{Path, PathBuf};

/// Which config key names the program that runs a language.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interpreter {
    Python,
    Bash,
    Node,
    /// A compiled (or toolchain-run) language: Bash runs its `Build` script
    /// (`runtime::launch_build`), which compiles then execs the program.
    Toolchain,
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
    /// None: programs in this language cannot call tools (`/v1/exec/programmatic`
    /// answers `unsupported_capability`).
    None,
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
    /// For `Interpreter::Toolchain`: how the code is compiled and run.
    pub build: Option<Build<'static>>,
}

/// How a toolchain language runs: Bash compiles the code (when there is a compile
/// step) in the code directory, inside the run's sandbox, cgroup and time limit, then
/// execs the run command with the program's arguments. Both commands are Bash command
/// lines in which `$CODE` is the code file's path, `$BUILD` an empty directory on the
/// run's /tmp for the build's output, and `$SANDCALL_MEMORY_MB` the run's memory limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Build<'a> {
    /// The code's file name in /run/sandcall.
    pub code_file: &'a str,
    /// Runs in /run/sandcall (so messages name the user's file as `main.c:3:5`), its
    /// stdin empty and its stdout sent to stderr; a failure ends the run with its status.
    pub compile: Option<&'a str>,
    /// A simple command, run in the working directory; the program's arguments follow.
    pub run: &'a str,
    /// The commands the toolchain needs, looked up in `toolchain_path`.
    pub tools: &'a [&'a str],
    /// The Debian packages that provide them, so that they compile and link without
    /// apt's recommended packages: the one list `sandcall runtime install --toolchains`
    /// installs from (`crate::toolchains`), and `doctor` names.
    pub packages: &'a [&'a str],
    /// Host paths to bind read-only into every sandbox when they exist (configuration
    /// the toolchain reads outside /usr); a last component may hold one `*`.
    pub paths: &'a [&'a str],
}

/// A declaration of a toolchain language: no runner, no warm sandbox (each run
/// compiles), no tools.
const fn toolchain(
    language: Language,
    env: &'static [(&'static str, &'static str)],
    build: Build<'static>,
) -> Declaration {
    Declaration {
        language,
        interpreter: Interpreter::Toolchain,
        code_file: build.code_file,
        env,
        runner: None,
        start: Start::Direct,
        warm_inline_flags: &[],
        warm: None,
        tools: ToolStub::None,
        transpiler: false,
        build: Some(build),
    }
}

/// A language the operator declared in the config (`[[languages]]`): every one of
/// them shares this declaration; its `Build` comes from the config (`build`).
const DECLARED: Declaration = Declaration {
    language: Language::Declared(0),
    interpreter: Interpreter::Toolchain,
    code_file: "main",
    env: &[],
    runner: None,
    start: Start::Direct,
    warm_inline_flags: &[],
    warm: None,
    tools: ToolStub::None,
    transpiler: false,
    build: None,
};

/// Every declared language, in `Language::ALL`'s order.
pub const LANGUAGES: [Declaration; 13] = [
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
        build: None,
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
        build: None,
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
        build: None,
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
        build: None,
    },
    toolchain(
        Language::C,
        &[],
        Build {
            code_file: "main.c",
            compile: Some(r#"gcc -std=gnu17 -O2 -g -pipe -o "$BUILD/main" main.c -lm"#),
            run: r#""$BUILD/main""#,
            tools: &["gcc"],
            packages: &["gcc", "libc6-dev"],
            paths: &[],
        },
    ),
    toolchain(
        Language::Cpp,
        &[],
        Build {
            code_file: "main.cpp",
            compile: Some(r#"g++ -std=gnu++17 -O2 -g -pipe -o "$BUILD/main" main.cpp -lm"#),
            run: r#""$BUILD/main""#,
            tools: &["g++"],
            packages: &["g++", "libc6-dev"],
            paths: &[],
        },
    ),
    toolchain(
        Language::Go,
        // Go's caches go to the run's /tmp; it never reaches for the network.
        &[
            ("GOCACHE", "/tmp/.cache/go-build"),
            ("GOPATH", "/tmp/go"),
            ("GOPROXY", "off"),
            ("GOTOOLCHAIN", "local"),
            ("GOTELEMETRY", "off"),
            ("CGO_ENABLED", "0"),
        ],
        Build {
            code_file: "main.go",
            compile: Some(r#"go build -o "$BUILD/main" main.go"#),
            run: r#""$BUILD/main""#,
            tools: &["go"],
            packages: &["golang-go"],
            paths: &[],
        },
    ),
    toolchain(
        Language::Java,
        &[],
        // The launcher's source-file mode compiles in memory, in the same JVM and
        // limits: any public class name works, and traces name `Main.java:LINE`. The
        // JVM fits the run: serial GC, a heap of half the memory limit, the C1
        // compiler only, no perf-data file; class data sharing only reads its archive.
        Build {
            code_file: "Main.java",
            compile: None,
            run: r#"java -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData -Xss4m -Xmx$((SANDCALL_MEMORY_MB / 2))m -XX:ReservedCodeCacheSize=32m "$CODE""#,
            // javac: the source-file mode needs the JDK's compiler, not just a JRE.
            tools: &["java", "javac"],
            packages: &["default-jdk-headless"],
            paths: &["/etc/java-*-openjdk"],
        },
    ),
    toolchain(
        Language::Php,
        &[],
        Build {
            code_file: "main.php",
            compile: None,
            run: r#"php -d display_errors=stderr -d log_errors=0 "$CODE""#,
            tools: &["php"],
            packages: &["php-cli"],
            paths: &["/etc/php"],
        },
    ),
    toolchain(
        Language::Rust,
        &[],
        Build {
            code_file: "main.rs",
            compile: Some(r#"rustc --edition 2021 -C debuginfo=0 -o "$BUILD/main" main.rs"#),
            run: r#""$BUILD/main""#,
            tools: &["rustc", "cc"],
            packages: &["rustc"],
            paths: &[],
        },
    ),
    toolchain(
        Language::R,
        &[],
        Build {
            code_file: "main.r",
            compile: None,
            run: r#"Rscript "$CODE""#,
            tools: &["Rscript"],
            packages: &["r-base-core"],
            paths: &["/etc/R"],
        },
    ),
    toolchain(
        Language::Fortran,
        &[],
        Build {
            code_file: "main.f90",
            compile: Some(r#"gfortran -O2 -g -fcheck=bounds -pipe -o "$BUILD/main" main.f90"#),
            run: r#""$BUILD/main""#,
            tools: &["gfortran"],
            packages: &["gfortran", "libc6-dev"],
            paths: &[],
        },
    ),
    toolchain(
        Language::D,
        &[],
        Build {
            code_file: "main.d",
            // Unoptimised: with -O2, Phobos's templates take gdc 4 s and 300 MB.
            compile: Some(r#"gdc -g -pipe -o "$BUILD/main" main.d"#),
            run: r#""$BUILD/main""#,
            tools: &["gdc"],
            packages: &["gdc", "libc6-dev"],
            paths: &[],
        },
    ),
];

/// The declaration of `language`.
pub fn declaration(language: Language) -> &'static Declaration {
    if let Language::Declared(_) = language {
        return &DECLARED;
    }
    // Every built-in `Language` has exactly one declaration (a unit test checks).
    LANGUAGES
        .iter()
        .find(|d| d.language == language)
        .unwrap_or(&LANGUAGES[0])
}

/// Parses a language name: a built-in one's name or alias, else a name the operator
/// declared (`languages`).
pub fn parse(name: &str, config: &Config) -> Option<Language> {
    if let Some(language) = Language::parse(name) {
        return Some(language);
    }
    let name = name.trim().to_ascii_lowercase();
    let index = config
        .languages
        .declared
        .iter()
        .position(|l| l.names.iter().any(|n| n.trim().eq_ignore_ascii_case(&name)))?;
    u16::try_from(index).ok().map(Language::Declared)
}

/// A language's own name (its first).
pub fn name(language: Language, config: &Config) -> &str {
    match language {
        Language::Declared(i) => config
            .languages
            .declared
            .get(usize::from(i))
            .and_then(|l| l.names.first())
            .map_or("declared", |n| n.as_str()),
        _ => language.names().first().copied().unwrap_or("?"),
    }
}

/// How a toolchain language compiles and runs (None for the interpreted ones). A
/// declared language's `tools` and `paths` are in the config (`missing`,
/// `runtime_paths`), not in the result.
pub fn build(language: Language, config: &Config) -> Option<Build<'_>> {
    match language {
        Language::Declared(i) => config.languages.declared.get(usize::from(i)).map(|l| Build {
            code_file: &l.code_file,
            compile: l.compile.as_deref(),
            run: &l.run,
            tools: &[],
            packages: &[],
            paths: &[],
        }),
        _ => declaration(language).build,
    }
}

/// The interpreter that runs `language`, as configured.
pub fn interpreter(language: Language, config: &Config) -> &Path {
    match declaration(language).interpreter {
        Interpreter::Python => &config.languages.python,
        Interpreter::Bash | Interpreter::Toolchain => &config.languages.bash,
        Interpreter::Node => &config.languages.node,
    }
}

/// The config key of `language`'s interpreter.
pub fn interpreter_key(language: Language) -> &'static str {
    match declaration(language).interpreter {
        Interpreter::Python => "python",
        Interpreter::Bash | Interpreter::Toolchain => "bash",
        Interpreter::Node => "node",
    }
}

/// Where the TypeScript transpiler (the `sucrase` package) is inside the sandbox, if
/// `language` needs it: `typescript_transpiler` when the operator set one (bound at the
/// same path), else the managed npm set's, under `/node_modules` (which every sandbox
/// binds when the set is installed; `missing` says when it is not).
pub fn transpiler(language: Language, config: &Config) -> Option<PathBuf> {
    if !declaration(language).transpiler {
        return None;
    }
    Some(match &config.languages.typescript_transpiler {
        Some(dir) => dir.clone(),
        None => Path::new(crate::npm_runtime::SANDBOX_PATH).join(crate::npm_runtime::TRANSPILER),
    })
}

/// The transpiler's package directory on the host: `typescript_transpiler`, else the
/// managed npm set's `sucrase` (there when the set is installed). No file system access.
pub fn transpiler_on_host(config: &Config) -> PathBuf {
    match &config.languages.typescript_transpiler {
        Some(dir) => dir.clone(),
        None => crate::npm_runtime::transpiler_dir(&crate::python_runtime::runtime_dir(config)),
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

/// Where `tool` (a command name, or an absolute path) is found: the first directory of
/// `toolchain_path` that holds it as an executable.
pub fn find_tool(tool: &str, config: &Config) -> Option<PathBuf> {
    if tool.starts_with('/') {
        let path = PathBuf::from(tool);
        return executable(&path).then_some(path);
    }
    config
        .languages
        .toolchain_path
        .iter()
        .map(|dir| dir.join(tool))
        .find(|path| executable(path))
}

/// The commands `language`'s toolchain needs.
pub fn tools(language: Language, config: &Config) -> Vec<&str> {
    match language {
        Language::Declared(i) => config
            .languages
            .declared
            .get(usize::from(i))
            .map(|l| l.tools.iter().map(String::as_str).collect())
            .unwrap_or_default(),
        _ => declaration(language)
            .build
            .map(|b| b.tools.to_vec())
            .unwrap_or_default(),
    }
}

/// Whether `language` can run on this host, and if not, what is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Ready,
    /// A declared language index with no declaration.
    NotDeclared,
    /// Its interpreter (config key `key`) is not there.
    MissingInterpreter {
        path: PathBuf,
        key: &'static str,
    },
    /// Commands of its toolchain are not in `toolchain_path`; `packages` are the Debian
    /// packages that have them (none for a language the operator declared).
    MissingToolchain {
        packages: &'static [&'static str],
        absent: Vec<String>,
        searched: String,
    },
    /// TypeScript's transpiler: neither `typescript_transpiler` nor the npm set has it.
    MissingTranspiler {
        configured: bool,
    },
}

impl State {
    /// Why the language cannot run, as the API and `doctor` say it; None when ready.
    pub fn why(&self) -> Option<String> {
        match self {
            State::Ready => None,
            State::NotDeclared => Some("it is not declared".into()),
            State::MissingInterpreter { path, key } => Some(format!(
                "its interpreter ({}) is not installed on this server (config `{key}`)",
                path.display()
            )),
            State::MissingToolchain {
                packages,
                absent,
                searched,
            } => {
                let package = match packages {
                    [] => String::new(),
                    [one] => format!(" (Debian package {one})"),
                    many => format!(" (Debian packages {})", many.join(" ")),
                };
                Some(format!(
                    "its toolchain{package} is not installed on this server: {} not found in {searched} (config \
                     `toolchain_path`)",
                    absent.join(", ")
                ))
            }
            State::MissingTranspiler { configured: true } => {
                Some("its transpiler (sucrase) is not installed on this server (config `typescript_transpiler`)".into())
            }
            State::MissingTranspiler { configured: false } => Some(
                "its transpiler (sucrase, part of the managed npm packages) is not installed on this server \
                 (`sandcall runtime install` adds it, and needs npm)"
                    .into(),
            ),
        }
    }
}

/// Whether `language` can run on this host: its interpreter, toolchain and transpiler.
/// A few `stat`s.
pub fn state(language: Language, config: &Config) -> State {
    if let Language::Declared(i) = language {
        if config.languages.declared.get(usize::from(i)).is_none() {
            return State::NotDeclared;
        }
    }
    let path = interpreter(language, config);
    if !executable(path) {
        return State::MissingInterpreter {
            path: path.to_path_buf(),
            key: interpreter_key(language),
        };
    }
    let absent: Vec<String> = tools(language, config)
        .into_iter()
        .filter(|t| find_tool(t, config).is_none())
        .map(String::from)
        .collect();
    if !absent.is_empty() {
        let dirs: Vec<String> = config
            .languages
            .toolchain_path
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        return State::MissingToolchain {
            packages: declaration(language).build.map_or(&[], |b| b.packages),
            absent,
            searched: dirs.join(":"),
        };
    }
    if declaration(language).transpiler && !transpiler_on_host(config).join("package.json").is_file() {
        return State::MissingTranspiler {
            configured: config.languages.typescript_transpiler.is_some(),
        };
    }
    State::Ready
}

/// Why `language` cannot run on this host (its interpreter, toolchain or transpiler is
/// missing), or None when it can. A few `stat`s.
pub fn missing(language: Language, config: &Config) -> Option<String> {
    state(language, config).why()
}

/// `pattern`'s matches: itself, or when its last component holds a `*`, the entries
/// of its directory that match it.
fn expand(pattern: &str) -> Vec<PathBuf> {
    let path = Path::new(pattern);
    let (Some(dir), Some(last)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    let Some((prefix, suffix)) = last.split_once('*') else {
        return vec![path.to_path_buf()];
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.len() > prefix.len() + suffix.len() && n.starts_with(prefix) && n.ends_with(suffix))
        })
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

/// The alternatives system's symlinks, bound read-only into every sandbox.
const ALTERNATIVES: &str = "/etc/alternatives";

/// Directories of `toolchain_path` outside /usr (which every sandbox already sees).
fn toolchain_dirs(config: &Config) -> impl Iterator<Item = &PathBuf> {
    config
        .languages
        .toolchain_path
        .iter()
        .filter(|d| !d.starts_with("/usr") && d.is_dir())
}

/// The program's PATH: `toolchain_path`'s directories outside /usr, then the usual.
pub fn sandbox_path(config: &Config) -> String {
    let mut path: Vec<String> = toolchain_dirs(config).map(|d| d.display().to_string()).collect();
    path.push("/usr/local/bin:/usr/bin:/bin".into());
    path.join(":")
}

/// Host paths the sandbox must see besides /usr for the declared languages: the
/// transpiler's `node_modules` directory (sucrase's own dependencies sit beside it),
/// /etc/alternatives, the toolchains' configuration outside /usr (`/etc/R`, ...), `toolchain_path`'s
/// directories outside /usr, and the operator's languages' `paths`.
pub fn runtime_paths(config: &Config) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = config
        .languages
        .typescript_transpiler
        .as_ref()
        .and_then(|dir| dir.parent())
        .filter(|dir| dir.is_dir())
        .map(|dir| vec![dir.to_path_buf()])
        .unwrap_or_default();
    // Debian's toolchains reach their commands and libraries (java, cc, awk,
    // libblas) through the alternatives' symlinks.
    paths.extend(expand(ALTERNATIVES).into_iter().filter(|p| p.is_dir()));
    for build in LANGUAGES.iter().filter_map(|d| d.build) {
        paths.extend(build.paths.iter().flat_map(|p| expand(p)).filter(|p| p.exists()));
    }
    paths.extend(toolchain_dirs(config).cloned());
    for l in &config.languages.declared {
        paths.extend(l.paths.iter().filter(|p| p.exists()).cloned());
    }
    // Each once, and a directory before what it holds.
    paths.sort();
    paths.dedup();
    paths
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
            languages: sandcall_config::LanguagesConfig {
                node: PathBuf::from("/nonexistent/node"),
                ..Default::default()
            },
            ..Config::default()
        };
        let why = missing(Language::JavaScript, &config).unwrap();
        assert!(why.contains("/nonexistent/node") && why.contains("`node`"), "{why}");
        let config = Config {
            languages: sandcall_config::LanguagesConfig {
                node: PathBuf::from("/usr/bin/bash"),
                typescript_transpiler: None,
                ..Default::default()
            },
            ..Config::default()
        };
        assert!(missing(Language::JavaScript, &config).is_none());
        assert!(missing(Language::Bash, &config).is_none());
    }

    #[test]
    fn the_transpiler_comes_from_the_npm_set_unless_one_is_configured() {
        let dir = std::env::temp_dir().join(format!("sandcall-ts-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut config = Config {
            languages: sandcall_config::LanguagesConfig {
                node: PathBuf::from("/usr/bin/bash"),
                runtime_dir: Some(dir.clone()),
                ..Default::default()
            },
            ..Config::default()
        };
        // No npm set: TypeScript is missing, and the message says what adds it.
        let why = missing(Language::TypeScript, &config).unwrap();
        assert!(why.contains("sandcall runtime install"), "{why}");
        assert_eq!(transpiler(Language::JavaScript, &config), None);
        assert_eq!(
            transpiler(Language::TypeScript, &config),
            Some(PathBuf::from("/node_modules/sucrase"))
        );
        assert!(runtime_paths(&config).iter().all(|p| !p.starts_with(&dir)));
        // The npm set with sucrase in it: TypeScript is ready, and the runner reads the
        // transpiler under /node_modules, which the set is bound at.
        let set = dir.join(crate::npm_runtime::set_id(
            crate::npm_runtime::PACKAGE_JSON,
            crate::npm_runtime::LOCK,
        ));
        std::fs::create_dir_all(set.join("node_modules/sucrase")).unwrap();
        std::fs::write(set.join("package-lock.json"), crate::npm_runtime::LOCK).unwrap();
        assert!(missing(Language::TypeScript, &config).is_some(), "no package.json yet");
        std::fs::write(set.join("node_modules/sucrase/package.json"), "{}").unwrap();
        assert_eq!(missing(Language::TypeScript, &config), None);
        assert_eq!(
            config_env(Language::TypeScript, &config),
            vec![("SANDCALL_TYPESCRIPT".to_string(), "/node_modules/sucrase".to_string())]
        );
        // A configured one wins, and when it is not there the message names the key.
        config.languages.typescript_transpiler = Some(PathBuf::from("/nonexistent/sucrase"));
        let why = missing(Language::TypeScript, &config).unwrap();
        assert!(why.contains("typescript_transpiler"), "{why}");
        assert_eq!(
            transpiler(Language::TypeScript, &config),
            Some(PathBuf::from("/nonexistent/sucrase"))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn toolchains_are_looked_up_in_toolchain_path() {
        let config = Config {
            languages: sandcall_config::LanguagesConfig {
                toolchain_path: vec![PathBuf::from("/nonexistent")],
                ..Default::default()
            },
            ..Config::default()
        };
        let why = missing(Language::C, &config).unwrap();
        assert!(
            why.contains("gcc") && why.contains("toolchain_path") && why.contains("(Debian packages gcc libc6-dev)"),
            "{why}"
        );
        let config = Config {
            languages: sandcall_config::LanguagesConfig {
                toolchain_path: vec![PathBuf::from("/nonexistent"), PathBuf::from("/usr/bin")],
                ..Default::default()
            },
            ..Config::default()
        };
        assert_eq!(find_tool("bash", &config), Some(PathBuf::from("/usr/bin/bash")));
        assert_eq!(sandbox_path(&config), "/usr/local/bin:/usr/bin:/bin");
    }

    #[test]
    fn declared_languages_parse_after_the_built_in_ones() {
        let config = Config {
            languages: sandcall_config::LanguagesConfig {
                declared: vec![sandcall_config::LanguageConfig {
                    names: vec!["Awk".into(), "gawk".into()],
                    code_file: "main.awk".into(),
                    run: "awk -f \"$CODE\"".into(),
                    tools: vec!["awk".into(), "/nonexistent/awk".into()],
                    ..Default::default()
                }],
                ..Default::default()
            },
            ..Config::default()
        };
        assert_eq!(parse("AWK", &config), Some(Language::Declared(0)));
        assert_eq!(parse("gawk", &config), Some(Language::Declared(0)));
        assert_eq!(parse("f90", &config), Some(Language::Fortran));
        assert_eq!(parse("ruby", &config), None);
        assert_eq!(name(Language::Declared(0), &config), "Awk");
        assert_eq!(build(Language::Declared(0), &config).unwrap().code_file, "main.awk");
        let why = missing(Language::Declared(0), &config).unwrap();
        assert!(why.contains("/nonexistent/awk"), "{why}");
        assert!(missing(Language::Declared(1), &config)
            .unwrap()
            .contains("not declared"));
    }

    #[test]
    fn runtime_paths_hold_the_toolchains_config_and_the_operators_paths() {
        let config = Config {
            languages: sandcall_config::LanguagesConfig {
                toolchain_path: vec![PathBuf::from("/usr/bin"), PathBuf::from("/tmp")],
                declared: vec![sandcall_config::LanguageConfig {
                    names: vec!["x".into()],
                    code_file: "main.x".into(),
                    run: "x".into(),
                    paths: vec![PathBuf::from("/proc/self"), PathBuf::from("/nonexistent")],
                    ..Default::default()
                }],
                ..Default::default()
            },
            ..Config::default()
        };
        let paths = runtime_paths(&config);
        if Path::new(ALTERNATIVES).is_dir() {
            assert!(paths.contains(&PathBuf::from(ALTERNATIVES)), "{paths:?}");
        }
        // A toolchain directory outside /usr is bound, and first on PATH; /usr/bin is
        // already there.
        assert!(paths.contains(&PathBuf::from("/tmp")), "{paths:?}");
        assert!(!paths.contains(&PathBuf::from("/usr/bin")), "{paths:?}");
        assert_eq!(sandbox_path(&config), "/tmp:/usr/local/bin:/usr/bin:/bin");
        // The operator's paths, those that exist.
        assert!(paths.contains(&PathBuf::from("/proc/self")), "{paths:?}");
        assert!(!paths.contains(&PathBuf::from("/nonexistent")), "{paths:?}");
    }

    #[test]
    fn patterns_expand_to_existing_entries() {
        assert_eq!(expand("/usr/bin"), vec![PathBuf::from("/usr/bin")]);
        assert!(expand("/usr/b*n").contains(&PathBuf::from("/usr/bin")));
        assert!(expand("/nonexistent/x*").is_empty());
    }
}
