//! How each language is started inside the sandbox: the argv, the code file name and the
//! environment. Pure functions, no I/O.

use sandcall_api::Language;
use std::path::Path;

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
const PYTHON_RUNNER: &str = include_str!("runner.py");

/// A declared tool as the program sees it: the declared name and the names it is
/// called by in each language.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolNames {
    pub declared: String,
    pub python: String,
    pub bash: String,
}

const PYTHON_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del",
    "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is", "lambda", "nonlocal",
    "not", "or", "pass", "raise", "return", "try", "while", "with", "yield",
];

/// `-`, spaces and dots become `_`, a leading digit gets `_`, a keyword gets `_tool`.
pub fn python_name(declared: &str) -> String {
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

/// A Bash function name: what is not a letter, digit, `_`, `-` or `.` becomes `_`.
pub fn bash_name(declared: &str) -> String {
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
        }
    }
}

/// A warm sandbox's program: started before the code exists, it waits on fd 3 for its
/// go line (see `warm_go`) and then runs `/run/sandcall/main.*` exactly as a cold run
/// would. Python waits inside the runner (already started: the point of warming);
/// Bash waits in a tiny shell that then execs the real one.
pub fn warm_launch(language: Language, interpreter: &Path) -> (Vec<String>, Vec<(String, String)>) {
    let base = launch(language, interpreter, &[]);
    let mut env = base.env;
    let interpreter = interpreter.to_string_lossy().into_owned();
    let argv = match language {
        Language::Python => {
            env.push(("SANDCALL_WARM".into(), "1".into()));
            vec![interpreter, "-c".into(), PYTHON_RUNNER.into()]
        }
        Language::Bash => {
            // Tool commands, when the run has any, come through BASH_ENV; a file that
            // does not exist is ignored.
            env.push(("BASH_ENV".into(), format!("{CODE_DIR}/tools.sh")));
            let script = format!(
                "read -r _ <&3; exec 3<&-; mapfile -d '' -t a < {CODE_DIR}/args; exec {interpreter} {CODE_DIR}/main.sh \"${{a[@]}}\""
            );
            vec![interpreter.clone(), "-c".into(), script, "sandcall".into()]
        }
    };
    (argv, env)
}

/// What a warm sandbox's program needs at its start: the go line, and support files.
pub fn warm_go(language: Language, args: &[String], tools: Option<&[ToolNames]>) -> (String, Vec<(String, String)>) {
    let mut files = Vec::new();
    if let Some(tools) = tools {
        files = launch_with_tools(language, Path::new("/"), args, tools).support_files;
        files.retain(|(name, _)| name != "runner.py");
    }
    let go = match language {
        Language::Python => serde_json::json!({"args": args, "tools": tools.is_some()}).to_string(),
        Language::Bash => {
            let mut list = String::new();
            for a in args {
                list.push_str(a);
                list.push('\0');
            }
            files.push(("args".into(), list));
            "go".into()
        }
    };
    (go, files)
}

/// How a program that calls tools is started: Python through the runner, Bash with the
/// tool commands defined through BASH_ENV. Neither adds a line to the user's file.
pub fn launch_with_tools(language: Language, interpreter: &Path, args: &[String], tools: &[ToolNames]) -> Launch {
    let mut launch = launch(language, interpreter, args);
    match language {
        Language::Python => {
            launch.argv[1] = format!("{CODE_DIR}/runner.py");
            let list: Vec<serde_json::Value> = tools
                .iter()
                .map(|t| serde_json::json!({"name": t.declared, "python": t.python}))
                .collect();
            launch.support_files.push(("runner.py".into(), PYTHON_RUNNER.into()));
            launch
                .support_files
                .push(("tools.json".into(), serde_json::Value::Array(list).to_string()));
        }
        Language::Bash => {
            let mut script =
                String::from("# The declared tools, as commands (defined by sandcall through BASH_ENV).\n");
            for t in tools {
                // Declared names are limited to letters, digits and `_-. `, so single
                // quotes need no escaping.
                script.push_str(&format!(
                    "{}() {{ {CODE_DIR}/bin/sandcall tool-call '{}' \"$@\"; }}\n",
                    t.bash, t.declared
                ));
            }
            launch.support_files.push(("tools.sh".into(), script));
            launch.env.push(("BASH_ENV".into(), format!("{CODE_DIR}/tools.sh")));
        }
    }
    launch
}

pub fn launch(language: Language, interpreter: &Path, args: &[String]) -> Launch {
    let code_file = match language {
        Language::Python => "main.py",
        Language::Bash => "main.sh",
    };
    let mut argv = vec![
        interpreter.to_string_lossy().into_owned(),
        format!("{CODE_DIR}/{code_file}"),
    ];
    argv.extend(args.iter().cloned());
    let mut env: Vec<(String, String)> = [
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
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    if language == Language::Python {
        for (k, v) in [
            ("PYTHONUNBUFFERED", "1"),
            ("PYTHONDONTWRITEBYTECODE", "1"),
            // Modules the caller uploads next to the program are importable.
            ("PYTHONPATH", WORK_DIR),
            ("MPLBACKEND", "Agg"),
        ] {
            env.push((k.to_owned(), v.to_owned()));
        }
    }
    Launch {
        code_file: code_file.to_owned(),
        argv,
        env,
        support_files: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_names_are_normalised() {
        assert_eq!(python_name("get-rate"), "get_rate");
        assert_eq!(python_name("get rate"), "get_rate");
        assert_eq!(python_name("3d_plot"), "_3d_plot");
        assert_eq!(python_name("import"), "import_tool");
        assert_eq!(python_name("lookup"), "lookup");
        assert_eq!(bash_name("get rate"), "get_rate");
        assert_eq!(bash_name("get-rate.v2"), "get-rate.v2");
    }

    #[test]
    fn tools_do_not_touch_the_users_file() {
        let tools = vec![ToolNames::new("get-rate")];
        let l = launch_with_tools(Language::Python, Path::new("/usr/bin/python3"), &["x".into()], &tools);
        assert_eq!(l.argv, vec!["/usr/bin/python3", "/run/sandcall/runner.py", "x"]);
        assert_eq!(l.code_file, "main.py");
        let json = &l.support_files.iter().find(|(n, _)| n == "tools.json").unwrap().1;
        assert_eq!(json, r#"[{"name":"get-rate","python":"get_rate"}]"#);
        let l = launch_with_tools(Language::Bash, Path::new("/usr/bin/bash"), &[], &tools);
        assert_eq!(l.argv, vec!["/usr/bin/bash", "/run/sandcall/main.sh"]);
        let sh = &l.support_files[0].1;
        assert!(
            sh.contains("get-rate() { /run/sandcall/bin/sandcall tool-call 'get-rate' \"$@\"; }"),
            "{sh}"
        );
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
    fn bash_has_no_python_variables() {
        let l = launch(Language::Bash, Path::new("/usr/bin/bash"), &[]);
        assert_eq!(l.argv, vec!["/usr/bin/bash", "/run/sandcall/main.sh"]);
        assert!(!l.env.iter().any(|(k, _)| k.starts_with("PYTHON")));
    }
}
