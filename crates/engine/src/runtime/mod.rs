//! How each language is started inside the sandbox: the argv, the code file name and the
//! environment, from the languages' declarations (`languages.rs`). Pure functions, no I/O.

pub mod languages;

use languages::{declaration, Build, Start, ToolStub, Warm};
use sandcall_api::Language;
use std::path::{Path, PathBuf};

/// The host paths a server with `config` binds into its programs' roots besides the
/// system's own (`sandcall_sandbox::mounts::host_view`): the runtimes, toolchains and
/// operator's paths, and the npm packages.
pub fn program_host_paths(config: &sandcall_config::Config) -> (Vec<PathBuf>, Option<PathBuf>) {
    let extra = config
        .languages
        .extra_runtime_paths
        .iter()
        .cloned()
        .chain(languages::runtime_paths(config))
        .collect();
    (extra, crate::npm_runtime::for_config(config).map(|n| n.node_modules()))
}

/// Where the submitted code appears inside the sandbox (read-only).
pub const CODE_DIR: &str = "/run/sandcall";
/// The program's working directory.
pub const WORK_DIR: &str = "/mnt/data";

pub struct Launch {
    pub code_file: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// More files for the code directory.
    pub support_files: Vec<(String, String)>,
}

/// The Python runner of programs that call tools (see runner.py).
const PYTHON_RUNNER: &str = languages::PYTHON_RUNNER.source;

/// A declared tool as the program sees it: the declared name, the names it is called
/// by in each language (the Code Interpreter API's rules), the older names sandcall
/// gave it where those differ (kept callable as aliases), and its parameters in the
/// order Python's positional arguments take them.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolNames {
    pub declared: String,
    pub python: String,
    pub bash: String,
    /// The JavaScript (and TypeScript) name: a global async function.
    pub js: String,
    /// Python names that also call the tool (sandcall's earlier rule); none that
    /// would collide with another tool's name.
    pub python_aliases: Vec<String>,
    /// Bash names that also call the tool.
    pub bash_aliases: Vec<String>,
    /// Required properties first, in the schema's order, then the optional ones.
    pub params: Vec<String>,
    /// How many of `params` are required.
    pub required: usize,
}

const PYTHON_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del",
    "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is", "lambda", "nonlocal",
    "not", "or", "pass", "raise", "return", "try", "while", "with", "yield",
];

/// JavaScript's reserved words and the globals a program relies on, which a tool's
/// name must not take.
const JS_RESERVED: &[&str] = &[
    "await",
    "break",
    "case",
    "catch",
    "class",
    "const",
    "continue",
    "debugger",
    "default",
    "delete",
    "do",
    "else",
    "enum",
    "export",
    "extends",
    "false",
    "finally",
    "for",
    "function",
    "if",
    "implements",
    "import",
    "in",
    "instanceof",
    "interface",
    "let",
    "new",
    "null",
    "package",
    "private",
    "protected",
    "public",
    "return",
    "static",
    "super",
    "switch",
    "this",
    "throw",
    "true",
    "try",
    "typeof",
    "var",
    "void",
    "while",
    "with",
    "yield",
    "arguments",
    "eval",
    "undefined",
    "NaN",
    "Infinity",
    "console",
    "process",
    "require",
    "module",
    "exports",
    "globalThis",
    "Promise",
    "Object",
    "Array",
    "String",
    "Number",
    "Boolean",
    "Symbol",
    "Error",
    "JSON",
    "Math",
    "Date",
    "ToolError",
];

/// Bash names a tool must not take: its keywords and the builtins a program relies on.
const BASH_RESERVED: &[&str] = &[
    "if", "then", "else", "elif", "fi", "case", "esac", "for", "select", "while", "until", "do", "done", "in",
    "function", "time", "coproc", "return", "exit", "break", "continue", "shift", "export", "readonly", "local",
    "declare", "typeset", "unset", "alias", "unalias", "source", "echo", "printf", "read", "cd", "pwd", "kill", "trap",
    "wait", "eval", "exec", "jobs", "bg", "fg", "set", "let", "test", "true", "false",
];

/// The Code Interpreter API's rule for Python: `-` and whitespace become `_`, every
/// other character outside `[A-Za-z0-9_]` is dropped, a leading digit gets `_` in
/// front, a keyword gets `_tool` after it. (A name with nothing left is `tool`.)
pub fn python_name(declared: &str) -> String {
    identifier(declared, &['-'], |name| PYTHON_KEYWORDS.contains(&name))
}

/// The Code Interpreter API's rule for Bash: `-`, whitespace and `.` become `_`, other
/// characters outside `[A-Za-z0-9_]` are dropped, a leading digit gets `_`, a keyword,
/// a builtin of `BASH_RESERVED` or a name starting `_ptc_` gets `_tool` after it, and
/// an empty result is `tool`.
pub fn bash_name(declared: &str) -> String {
    identifier(declared, &['-', '.'], |name| {
        BASH_RESERVED.contains(&name) || name.starts_with("_ptc_")
    })
}

/// sandcall's rule for JavaScript, the Python rule with JavaScript's reserved words:
/// `-` and whitespace become `_`, every other character outside `[A-Za-z0-9_]` is
/// dropped, a leading digit gets `_` in front, a reserved word or global of
/// `JS_RESERVED` gets `_tool` after it, and an empty result is `tool`. The result is
/// always a valid JavaScript identifier.
pub fn js_name(declared: &str) -> String {
    identifier(declared, &['-'], |name| JS_RESERVED.contains(&name))
}

/// The shape the three rules share: whitespace and `to_underscore` become `_`, other
/// characters outside `[A-Za-z0-9_]` are dropped, nothing left is `tool`, a leading
/// digit gets `_` in front, and a name `reserved` says is taken gets `_tool` after it.
fn identifier(declared: &str, to_underscore: &[char], reserved: impl Fn(&str) -> bool) -> String {
    let mut name: String = declared
        .chars()
        .filter_map(|c| match c {
            c if to_underscore.contains(&c) || c.is_whitespace() => Some('_'),
            c if c.is_ascii_alphanumeric() || c == '_' => Some(c),
            _ => None,
        })
        .collect();
    if name.is_empty() {
        return "tool".into();
    }
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    if reserved(&name) {
        name.push_str("_tool");
    }
    name
}

/// sandcall's earlier Python name: every character outside `[A-Za-z0-9_]` became `_`.
fn legacy_python_name(declared: &str) -> String {
    let mut name: String = declared
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect();
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    if PYTHON_KEYWORDS.contains(&name.as_str()) {
        name.push_str("_tool");
    }
    name
}

/// sandcall's earlier Bash name: what is not a letter, digit, `_`, `-` or `.` became
/// `_` (Bash function names may hold `-` and `.`).
fn legacy_bash_name(declared: &str) -> String {
    declared
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl ToolNames {
    pub fn new(declared: &str) -> Self {
        ToolNames {
            declared: declared.to_owned(),
            python: python_name(declared),
            bash: bash_name(declared),
            js: js_name(declared),
            python_aliases: Vec::new(),
            bash_aliases: Vec::new(),
            params: Vec::new(),
            required: 0,
        }
    }

    /// The names of a set of tools, with the earlier names as aliases where they differ.
    /// Two tools whose names (by the current rules) are one name in a language are an
    /// error, naming both; an alias that would be a name of another tool, or of two
    /// tools, or a name Bash reserves, is left out.
    pub fn for_tools(declared: &[&str]) -> Result<Vec<ToolNames>, (String, String)> {
        let mut all: Vec<ToolNames> = Vec::with_capacity(declared.len());
        for name in declared {
            let names = ToolNames::new(name);
            if let Some(other) = all.iter().find(|t| {
                t.declared == names.declared || t.python == names.python || t.bash == names.bash || t.js == names.js
            }) {
                return Err((other.declared.clone(), names.declared));
            }
            all.push(names);
        }
        let python: Vec<String> = declared.iter().map(|d| legacy_python_name(d)).collect();
        let bash: Vec<String> = declared.iter().map(|d| legacy_bash_name(d)).collect();
        let count = |list: &[String], name: &str| list.iter().filter(|n| *n == name).count();
        let primaries_py: Vec<String> = all.iter().map(|t| t.python.clone()).collect();
        let primaries_sh: Vec<String> = all.iter().map(|t| t.bash.clone()).collect();
        for (i, t) in all.iter_mut().enumerate() {
            let (py, sh) = (&python[i], &bash[i]);
            if *py != t.python && !primaries_py.contains(py) && count(&python, py) == 1 {
                t.python_aliases.push(py.clone());
            }
            let reserved = BASH_RESERVED.contains(&sh.as_str()) || sh.starts_with("_ptc_");
            if *sh != t.bash && !reserved && !primaries_sh.contains(sh) && count(&bash, sh) == 1 {
                t.bash_aliases.push(sh.clone());
            }
        }
        Ok(all)
    }
}

/// `s` as one single-quoted Bash word.
fn bash_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// What every Python program that calls tools starts with (LibreChat's tool
/// description teaches `await asyncio.gather(...)` with no import).
pub const PYTHON_PRELUDE_MODULES: &[&str] = &["asyncio", "json", "os", "sys"];

/// A warm sandbox's program: started before the code exists, it waits on fd 3 for its
/// go line (see `warm_go`) and then runs `/run/sandcall/main.*` exactly as a cold run
/// would. A language with a runner (Python, JavaScript) waits inside the runner, already
/// started: the point of warming; Bash waits in a tiny shell that then execs the real one.
pub fn warm_launch(language: Language, interpreter: &Path) -> (Vec<String>, Vec<(String, String)>) {
    let decl = declaration(language);
    let base = launch(language, interpreter, &[]);
    let mut env = base.env;
    let interpreter = interpreter.to_string_lossy().into_owned();
    let argv = match (decl.warm, decl.runner) {
        (Some(Warm::Runner), Some(runner)) => {
            env.push(("SANDCALL_WARM".into(), "1".into()));
            let mut argv = vec![interpreter];
            argv.extend(decl.warm_inline_flags.iter().map(|f| f.to_string()));
            argv.push(runner.source.into());
            argv
        }
        _ => {
            // Tool commands, when the run has any, come through BASH_ENV; a file that
            // does not exist is ignored.
            env.push(("BASH_ENV".into(), format!("{CODE_DIR}/tools.sh")));
            // The waiting shell runs the code itself, with a script's `$0` and
            // arguments, instead of starting a second bash at the go: that exec was
            // most of a warm `echo 1` (1.8 ms of CPU and 145 page faults in the
            // program after its go, against 0.4 ms for Python's `print(1)`). It reads
            // BASH_ENV as a new bash would, and only then the code.
            let code = format!("{CODE_DIR}/{}", decl.code_file);
            let script = format!(
                "read -r _ <&3; exec 3<&-; mapfile -d '' -t a < {CODE_DIR}/args; set -- \"${{a[@]}}\"; unset a; if [[ -f $BASH_ENV ]]; then . \"$BASH_ENV\"; fi; . {code}"
            );
            vec![interpreter.clone(), "-c".into(), script, code]
        }
    };
    (argv, env)
}

/// The Python template ("zygote") that forks warm Python sandboxes (`config.zygote`).
pub const ZYGOTE_SOURCE: &str = include_str!("zygote.py");

/// How a Python template starts: the warm Python launch's environment, with
/// `zygote.py` inline and the runner's source as its argument, which it loads as a
/// module and runs in each forked run. Python only: the template forks a running
/// interpreter, and only Python's runner is written for it.
pub fn template_launch(interpreter: &Path) -> (Vec<String>, Vec<(String, String)>) {
    let (_, env) = warm_launch(Language::Python, interpreter);
    let runner = declaration(Language::Python).runner.map_or("", |r| r.source);
    let argv = vec![
        interpreter.to_string_lossy().into_owned(),
        "-c".into(),
        without_comment_lines(ZYGOTE_SOURCE),
        runner.into(),
    ];
    (argv, env)
}

/// `source` without its comment lines after the first (which names the template on its
/// command line). The template's command line is every forked process's (`/proc/<pid>/cmdline`,
/// which a program may print): shorter is cheaper to show, and it keeps the hostile
/// suite's snoop, which prints pid 1's and pid 2's, within the output limit. zygote.py has
/// no line inside a string that starts with `#` (`template_source_keeps_every_code_line`).
fn without_comment_lines(source: &str) -> String {
    let mut lines = source.lines();
    let mut out: String = lines.next().unwrap_or_default().to_owned();
    for line in lines.filter(|l| !l.trim_start().starts_with('#')) {
        out.push('\n');
        out.push_str(line);
    }
    out.push('\n');
    out
}

/// What a warm sandbox's program needs at its start: the go line, and support files.
pub fn warm_go(language: Language, args: &[String], tools: Option<&[ToolNames]>) -> (String, Vec<(String, String)>) {
    let decl = declaration(language);
    let mut files = Vec::new();
    if let Some(tools) = tools {
        files = launch_with_tools(language, Path::new("/"), args, tools).support_files;
        // The runner already runs.
        files.retain(|(name, _)| decl.runner.is_none_or(|r| r.file != name));
    }
    let go = match decl.warm {
        Some(Warm::Shell) => {
            let mut list = String::new();
            for a in args {
                list.push_str(a);
                list.push('\0');
            }
            files.push(("args".into(), list));
            "go".into()
        }
        _ => serde_json::json!({"args": args, "tools": tools.is_some()}).to_string(),
    };
    (go, files)
}

/// How a program that calls tools is started: Python and JavaScript through their
/// runner, Bash with the tool commands defined through BASH_ENV. None adds a line to the
/// user's file.
pub fn launch_with_tools(language: Language, interpreter: &Path, args: &[String], tools: &[ToolNames]) -> Launch {
    let mut launch = launch(language, interpreter, args);
    match declaration(language).tools {
        ToolStub::PythonRunner => {
            launch.argv[1] = format!("{CODE_DIR}/runner.py");
            let list: Vec<serde_json::Value> = tools
                .iter()
                .map(|t| {
                    let mut names = vec![t.python.clone()];
                    names.extend(t.python_aliases.iter().cloned());
                    serde_json::json!({"name": t.declared, "python": names, "params": t.params, "required": t.required})
                })
                .collect();
            launch.support_files.push(("runner.py".into(), PYTHON_RUNNER.into()));
            launch
                .support_files
                .push(("tools.json".into(), serde_json::Value::Array(list).to_string()));
        }
        ToolStub::NodeRunner => {
            // `launch` already starts through the runner.
            let list: Vec<serde_json::Value> = tools
                .iter()
                .map(|t| serde_json::json!({"name": t.declared, "js": [t.js]}))
                .collect();
            launch
                .support_files
                .push(("tools.json".into(), serde_json::Value::Array(list).to_string()));
        }
        // Refused before a launch (`programmatic::parse_start`).
        ToolStub::None => {}
        ToolStub::BashFunctions => {
            let mut script =
                String::from("# The declared tools, as commands (defined by sandcall through BASH_ENV).\n");
            for t in tools {
                let declared = bash_quote(&t.declared);
                for name in std::iter::once(&t.bash).chain(&t.bash_aliases) {
                    script.push_str(&format!(
                        "{name}() {{ {CODE_DIR}/bin/sandcall tool-call {declared} \"$@\"; }}\n"
                    ));
                }
            }
            launch.support_files.push(("tools.sh".into(), script));
            launch.env.push(("BASH_ENV".into(), format!("{CODE_DIR}/tools.sh")));
        }
    }
    launch
}

/// Where a toolchain language's build goes: the run's /tmp.
pub const BUILD_DIR: &str = "/tmp/sandcall-build";

/// A run of a toolchain language (`languages::Build`): Bash sets `$CODE` and `$BUILD`,
/// runs the compile step in the code directory with an empty stdin and its output on
/// stderr (a failure ends the run with the compiler's status), then execs the run
/// command with the program's arguments. All of it happens in the run's sandbox,
/// cgroup and time limit. `path` is the program's PATH, `memory_mb` the run's memory
/// limit (`$SANDCALL_MEMORY_MB`, which the JVM's heap is sized from).
pub fn launch_build(
    language: Language,
    build: &Build<'_>,
    bash: &Path,
    path: &str,
    memory_mb: u64,
    args: &[String],
) -> Launch {
    let mut launch = launch(language, bash, &[]);
    let mut script = format!(
        "CODE={CODE_DIR}/{}; BUILD={BUILD_DIR}; mkdir -p \"$BUILD\" || exit 125\n",
        build.code_file
    );
    if let Some(compile) = build.compile {
        script.push_str(&format!("(cd {CODE_DIR} && {compile}\n) </dev/null >&2 || exit $?\n"));
    }
    script.push_str(&format!("exec {} \"$@\"\n", build.run));
    let bash = bash.to_string_lossy().into_owned();
    launch.argv = vec![bash, "-c".into(), script, "sandcall".into()];
    launch.argv.extend(args.iter().cloned());
    launch.code_file = build.code_file.to_owned();
    for (k, v) in &mut launch.env {
        if k == "PATH" {
            *v = path.to_owned();
        }
    }
    launch.env.push(("SANDCALL_MEMORY_MB".into(), memory_mb.to_string()));
    launch
}

/// A plain run of `language`: `{interpreter} {code} args...`, or through the language's
/// runner.
pub fn launch(language: Language, interpreter: &Path, args: &[String]) -> Launch {
    let decl = declaration(language);
    let mut support_files = Vec::new();
    let first = match (decl.start, decl.runner) {
        (Start::Runner, Some(runner)) => {
            support_files.push((runner.file.to_owned(), runner.source.to_owned()));
            runner.file
        }
        _ => decl.code_file,
    };
    let mut argv = vec![
        interpreter.to_string_lossy().into_owned(),
        format!("{CODE_DIR}/{first}"),
    ];
    argv.extend(args.iter().cloned());
    let env: Vec<(String, String)> = [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        // HOME is scratch space: tools that write dotfiles there must not litter the
        // working directory, whose files are the run's outputs.
        ("HOME", "/tmp"),
        ("TMPDIR", "/tmp"),
        ("USER", "sandbox"),
        ("LOGNAME", "sandbox"),
        ("PWD", WORK_DIR),
        ("LANG", "C.UTF-8"),
        ("LC_ALL", "C.UTF-8"),
    ]
    .into_iter()
    .chain(decl.env.iter().copied())
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    Launch {
        code_file: decl.code_file.to_owned(),
        argv,
        env,
        support_files,
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn template_source_keeps_every_code_line() {
        let short = super::without_comment_lines(super::ZYGOTE_SOURCE);
        assert!(short.starts_with("# sandcall's Python template"), "{short}");
        assert!(short.len() < super::ZYGOTE_SOURCE.len() * 3 / 4);
        let code = |s: &str| -> Vec<String> {
            s.lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(code(&short), code(super::ZYGOTE_SOURCE));
        // The template still compiles: Python parses the shortened source.
        let out = std::process::Command::new("python3")
            .args(["-c", "import sys; compile(sys.argv[1], '<zygote>', 'exec')", &short])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    use super::*;

    #[test]
    fn python_names_follow_the_code_interpreter_rules() {
        // `-` and whitespace become `_`.
        assert_eq!(python_name("get-rate"), "get_rate");
        assert_eq!(python_name("get rate\tnow"), "get_rate_now");
        // Every other character outside [A-Za-z0-9_] is dropped.
        assert_eq!(python_name("files.read"), "filesread");
        assert_eq!(python_name("a/b:c@d!é"), "abcd");
        assert_eq!(python_name("keep_under_score"), "keep_under_score");
        // A leading digit gets `_` in front.
        assert_eq!(python_name("3d_plot"), "_3d_plot");
        assert_eq!(python_name(".9x"), "_9x");
        // A keyword gets `_tool` after it.
        assert_eq!(python_name("import"), "import_tool");
        assert_eq!(python_name("class"), "class_tool");
        assert_eq!(python_name("None"), "None_tool");
        assert_eq!(python_name("lookup"), "lookup");
        // Nothing left: `tool`.
        assert_eq!(python_name("..."), "tool");
    }

    #[test]
    fn bash_names_follow_the_code_interpreter_rules() {
        // `-`, whitespace and `.` become `_`.
        assert_eq!(bash_name("get-rate.v2"), "get_rate_v2");
        assert_eq!(bash_name("get rate"), "get_rate");
        // Other characters outside [A-Za-z0-9_] are dropped.
        assert_eq!(bash_name("a/b:c@d!é"), "abcd");
        // A leading digit gets `_`.
        assert_eq!(bash_name("3d"), "_3d");
        // Keywords and listed builtins get `_tool`.
        for reserved in BASH_RESERVED {
            assert_eq!(bash_name(reserved), format!("{reserved}_tool"));
        }
        assert_eq!(bash_name("echo"), "echo_tool");
        assert_eq!(bash_name("time"), "time_tool");
        assert_eq!(bash_name("cat"), "cat");
        // Any name starting `_ptc_`.
        assert_eq!(bash_name("_ptc_call"), "_ptc_call_tool");
        assert_eq!(bash_name("_ptc-x"), "_ptc_x_tool");
        // Empty: `tool`.
        assert_eq!(bash_name("!!"), "tool");
        assert_eq!(bash_name(""), "tool");
    }

    #[test]
    fn js_names_are_identifiers_that_shadow_no_global() {
        assert_eq!(js_name("get-rate"), "get_rate");
        assert_eq!(js_name("files.read"), "filesread");
        assert_eq!(js_name("3d plot"), "_3d_plot");
        assert_eq!(js_name("class"), "class_tool");
        assert_eq!(js_name("require"), "require_tool");
        assert_eq!(js_name("console"), "console_tool");
        assert_eq!(js_name("ToolError"), "ToolError_tool");
        assert_eq!(js_name("!!"), "tool");
        assert_eq!(js_name("lookup"), "lookup");
        // A JavaScript collision is refused like the others.
        assert!(ToolNames::for_tools(&["await", "await_tool"]).is_err());
        let tools = ToolNames::for_tools(&["get-rate"]).unwrap();
        let l = launch_with_tools(Language::JavaScript, Path::new("/usr/bin/node"), &[], &tools);
        assert_eq!(l.argv, vec!["/usr/bin/node", "/run/sandcall/runner.mjs"]);
        assert_eq!(l.code_file, "main.mjs");
        let json = &l.support_files.iter().find(|(n, _)| n == "tools.json").unwrap().1;
        assert_eq!(json, r#"[{"js":["get_rate"],"name":"get-rate"}]"#);
    }

    #[test]
    fn earlier_names_stay_as_aliases_unless_they_collide() {
        let names = ToolNames::for_tools(&["get-rate.v2", "files.read", "plain"]).unwrap();
        assert_eq!(names[0].python, "get_ratev2");
        assert_eq!(names[0].python_aliases, vec!["get_rate_v2"]);
        assert_eq!(names[0].bash, "get_rate_v2");
        assert_eq!(names[0].bash_aliases, vec!["get-rate.v2"]);
        assert_eq!(names[1].python_aliases, vec!["files_read"]);
        assert!(names[2].python_aliases.is_empty() && names[2].bash_aliases.is_empty());
        // Names whose aliases would meet also meet by the current rules, in one
        // language or the other: refused, naming both tools.
        assert!(ToolNames::for_tools(&["a.b", "a_b"]).is_err(), "`a_b` in Bash");
        let names = ToolNames::for_tools(&["p.q", "p;q"]).unwrap_err();
        assert_eq!(names, ("p.q".to_string(), "p;q".to_string()));
        // A Bash alias never shadows a reserved name.
        let names = ToolNames::for_tools(&["echo"]).unwrap();
        assert_eq!(names[0].bash, "echo_tool");
        assert!(names[0].bash_aliases.is_empty());
    }

    #[test]
    fn names_that_normalise_to_one_are_a_collision() {
        assert!(ToolNames::for_tools(&["get-rate", "get_rate"]).is_err());
        assert!(ToolNames::for_tools(&["get rate", "get-rate"]).is_err());
        // `.` becomes `_` in Bash, and is dropped in Python: one language is enough.
        assert!(ToolNames::for_tools(&["a.b", "a_b"]).is_err());
        assert!(ToolNames::for_tools(&["a.b", "ab"]).is_err());
        assert!(ToolNames::for_tools(&["a.b", "a-b"]).is_err());
        assert!(ToolNames::for_tools(&["a.b", "b.a"]).is_ok());
        assert!(ToolNames::for_tools(&["same", "same"]).is_err());
    }

    #[test]
    fn tools_do_not_touch_the_users_file() {
        let tools = ToolNames::for_tools(&["get-rate.v2", "it's"]).unwrap();
        let l = launch_with_tools(Language::Python, Path::new("/usr/bin/python3"), &["x".into()], &tools);
        assert_eq!(l.argv, vec!["/usr/bin/python3", "/run/sandcall/runner.py", "x"]);
        assert_eq!(l.code_file, "main.py");
        let json = &l.support_files.iter().find(|(n, _)| n == "tools.json").unwrap().1;
        let json: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(
            json[0],
            serde_json::json!({"name": "get-rate.v2", "python": ["get_ratev2", "get_rate_v2"], "params": [], "required": 0})
        );
        let l = launch_with_tools(Language::Bash, Path::new("/usr/bin/bash"), &[], &tools);
        assert_eq!(l.argv, vec!["/usr/bin/bash", "/run/sandcall/main.sh"]);
        let sh = &l.support_files[0].1;
        for line in [
            "get_rate_v2() { /run/sandcall/bin/sandcall tool-call 'get-rate.v2' \"$@\"; }",
            "get-rate.v2() { /run/sandcall/bin/sandcall tool-call 'get-rate.v2' \"$@\"; }",
            "its() { /run/sandcall/bin/sandcall tool-call 'it'\\''s' \"$@\"; }",
        ] {
            assert!(sh.contains(line), "{sh}");
        }
        assert!(l.env.contains(&("BASH_ENV".into(), "/run/sandcall/tools.sh".into())));
    }

    #[test]
    fn python_argv_puts_user_args_after_the_script() {
        let l = launch(
            Language::Python,
            Path::new("/usr/bin/python3"),
            &["a".into(), "b c".into()],
        );
        assert_eq!(l.argv, vec!["/usr/bin/python3", "/run/sandcall/main.py", "a", "b c"]);
        assert_eq!(l.code_file, "main.py");
        assert!(l.env.iter().any(|(k, v)| k == "PYTHONPATH" && v == WORK_DIR));
    }

    #[test]
    fn a_build_compiles_in_the_code_dir_then_execs_the_program() {
        let config = sandcall_config::Config::default();
        let build = languages::build(Language::C, &config).unwrap();
        let l = launch_build(
            Language::C,
            &build,
            Path::new("/usr/bin/bash"),
            "/opt/x:/usr/bin",
            256,
            &["a b".into()],
        );
        assert_eq!(l.code_file, "main.c");
        assert_eq!(l.argv[0], "/usr/bin/bash");
        assert_eq!(l.argv[1], "-c");
        assert_eq!(&l.argv[3..], ["sandcall", "a b"]);
        let script = &l.argv[2];
        assert!(
            script.starts_with("CODE=/run/sandcall/main.c; BUILD=/tmp/sandcall-build;"),
            "{script}"
        );
        assert!(script.contains("(cd /run/sandcall && gcc "), "{script}");
        assert!(script.contains(") </dev/null >&2 || exit $?\n"), "{script}");
        assert!(script.ends_with("exec \"$BUILD/main\" \"$@\"\n"), "{script}");
        assert!(l.env.contains(&("PATH".into(), "/opt/x:/usr/bin".into())));
        assert!(l.env.contains(&("SANDCALL_MEMORY_MB".into(), "256".into())));
        // No compile step: straight to the run command.
        let build = languages::build(Language::Php, &config).unwrap();
        let l = launch_build(Language::Php, &build, Path::new("/usr/bin/bash"), "/usr/bin", 256, &[]);
        assert!(!l.argv[2].contains("cd /run/sandcall"), "{}", l.argv[2]);
    }

    #[test]
    fn bash_has_no_python_variables() {
        let l = launch(Language::Bash, Path::new("/usr/bin/bash"), &[]);
        assert_eq!(l.argv, vec!["/usr/bin/bash", "/run/sandcall/main.sh"]);
        assert!(!l.env.iter().any(|(k, _)| k.starts_with("PYTHON")));
    }
}
