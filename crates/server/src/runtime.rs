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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
