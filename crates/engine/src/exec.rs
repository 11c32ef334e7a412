//! POST /v1/exec as a domain operation: request → command → run → response.

use crate::error::{EngineError, ErrorKind};
use crate::runtime;
use sandcall_api::{error_type, ExecRequest, ExecResponse, ExecStatus, Language, RequestLimits};
use sandcall_config::Config;
use sandcall_sandbox::protocol::{Limits, RunResult};

const MIB: u64 = 1 << 20;

/// A validated exec request.
#[derive(Debug, Clone)]
pub struct ExecCommand {
    pub language: Language,
    pub code: String,
    pub args: Vec<String>,
    pub stdin: String,
    pub timeout_ms: u64,
    pub limits: Limits,
    pub files: Vec<sandcall_api::FileRef>,
    /// The request set its own limits (a warm sandbox has the defaults).
    pub custom_limits: bool,
    /// The caller's workspace the run starts in and saves to (`workspaces` on).
    pub workspace: Option<String>,
    /// The isolation tier the request asked for (`Tiers::pick` decides).
    pub isolation: Option<sandcall_config::Isolation>,
    /// The network the request asked for (`crate::egress::grant` decides).
    pub network: Option<sandcall_api::NetworkRequest>,
}

/// The request's language (Python by default). A name that is not declared, or a
/// declared language whose toolchain this host lacks, is `unsupported_capability`.
pub fn parse_language(language: Option<&str>, lang: Option<&str>, config: &Config) -> Result<Language, EngineError> {
    let parsed = parse_language_name(language, lang, config)?;
    let name = runtime::languages::name(parsed, config);
    // The reason, which names host paths, is for the log and `doctor`, not the client.
    match runtime::languages::missing(parsed, config) {
        None => Ok(parsed),
        Some(why) => Err(EngineError {
            code: Some(sandcall_api::error_code::UNSUPPORTED_CAPABILITY),
            ..EngineError::new(ErrorKind::Invalid, error_type::UNSUPPORTED_LANGUAGE, {
                tracing::debug!(language = name, "refused: {why}");
                format!(
                    "this server cannot run {name} programs: its toolchain is not installed here; \
                         retrying in {name} will not work"
                )
            })
        }),
    }
}

fn parse_language_name(language: Option<&str>, lang: Option<&str>, config: &Config) -> Result<Language, EngineError> {
    match language.or(lang) {
        None => Ok(Language::Python),
        Some(name) => runtime::languages::parse(name, config).ok_or_else(|| {
            // The operator's own languages, when there are any, are named too.
            let declared: Vec<&str> = config
                .languages
                .declared
                .iter()
                .filter_map(|l| l.names.first().map(String::as_str))
                .collect();
            let declared = if declared.is_empty() {
                String::new()
            } else {
                format!(", or this server's own: {}", declared.join(", "))
            };
            EngineError {
                code: Some(sandcall_api::error_code::UNSUPPORTED_CAPABILITY),
                ..EngineError::new(
                    ErrorKind::Invalid,
                    error_type::UNSUPPORTED_LANGUAGE,
                    format!(
                        "this server does not run {name:?} programs: use python (py, python3), bash (sh), \
                         javascript (js, node), typescript (ts), c, cpp, go, java, php, rust (rs), r, \
                         fortran (f90) or d{declared}; retrying in {name:?} will not work"
                    ),
                )
            }
        }),
    }
}

/// `code` must be there, not blank, and within max_code_bytes; `args` free of NULs.
pub fn check_code_and_args(
    code: Option<String>,
    args: Option<Vec<String>>,
    config: &Config,
    missing: &str,
) -> Result<(String, Vec<String>), EngineError> {
    let code = code.ok_or_else(|| EngineError::bad_request(missing))?;
    if code.trim().is_empty() {
        return Err(EngineError::bad_request("`code` is empty"));
    }
    // Python refuses such source, or cuts it at the NUL, depending on its version and
    // on how it reads the file: refusing it here gives one answer everywhere.
    if code.contains('\0') {
        return Err(EngineError::bad_request("`code` may not contain NUL bytes"));
    }
    if code.len() as u64 > config.limits.max_code_bytes {
        return Err(EngineError::too_large(format!(
            "`code` is larger than {} bytes",
            config.limits.max_code_bytes
        )));
    }
    let args = args.unwrap_or_default();
    if args.iter().any(|a| a.contains('\0')) {
        return Err(EngineError::bad_request("`args` may not contain NUL bytes"));
    }
    Ok((code, args))
}

/// LibreChat's pre-warm of a conversation's runtime: `true` in Bash, with nothing else,
/// in a workspace. It is answered at once, without a sandbox (`prewarm_response`).
pub fn is_prewarm(cmd: &ExecCommand) -> bool {
    cmd.workspace.is_some()
        && cmd.language == Language::Bash
        && cmd.code.trim() == "true"
        && cmd.args.is_empty()
        && cmd.stdin.is_empty()
        && cmd.files.is_empty()
}

/// What a run of `true` answers, with the workspace's id: the workspace is neither
/// opened nor changed, so there is no `runtime_status`.
pub fn prewarm_response(runtime_session_id: String) -> ExecResponse {
    let mut response = to_response(sandcall_api::ids::new_id(), RunResult::default(), 0);
    response.status = ExecStatus::Ok;
    response.exit_code = Some(0);
    response.code = Some(0);
    response.runtime_session_id = Some(runtime_session_id);
    response
}

pub fn parse_exec(req: ExecRequest, config: &Config) -> Result<ExecCommand, EngineError> {
    let language = parse_language(req.language.as_deref(), req.lang.as_deref(), config)?;
    let (code, args) = check_code_and_args(req.code, req.args, config, "`code` is required")?;
    let stdin = req.stdin.unwrap_or_default();
    if stdin.len() as u64 > config.limits.max_stdin_bytes {
        return Err(EngineError::too_large(format!(
            "`stdin` is larger than {} bytes",
            config.limits.max_stdin_bytes
        )));
    }
    let timeout_ms = timeout(req.run_timeout, req.timeout, config)?;
    let limits = resolve_limits(config, req.limits.as_ref())?;
    let workspace = parse_workspace(req.workspace_id, req.runtime_session_hint, config)?;
    let isolation = crate::isolation::parse_isolation(req.isolation.as_deref())?;
    Ok(ExecCommand {
        language,
        code,
        args,
        stdin,
        timeout_ms,
        limits,
        files: req.files.unwrap_or_default(),
        custom_limits: req.limits.is_some_and(|l| l != RequestLimits::default()),
        workspace,
        isolation,
        network: req.network,
    })
}

/// The workspace a request names: `workspace_id`, else `runtime_session_hint` (empty is
/// none). With `workspaces` off the hint is ignored (LibreChat sends it to every server)
/// and `workspace_id` refused, since silently starting afresh would lose the caller's files.
pub fn parse_workspace(
    id: Option<String>,
    hint: Option<serde_json::Value>,
    config: &Config,
) -> Result<Option<String>, EngineError> {
    if !config.files.workspaces {
        return match id {
            Some(_) => Err(EngineError::bad_request(
                "`workspace_id`: workspaces are off on this server (`workspaces = false`)",
            )),
            None => Ok(None),
        };
    }
    let name = match (id, hint) {
        (Some(id), _) => id,
        (None, None | Some(serde_json::Value::Null)) => return Ok(None),
        (None, Some(serde_json::Value::String(h))) if h.is_empty() => return Ok(None),
        (None, Some(serde_json::Value::String(h))) => h,
        (None, Some(_)) => return Err(EngineError::bad_request("`runtime_session_hint` must be a string")),
    };
    let valid = (1..=256).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    if !valid {
        return Err(EngineError::bad_request(
            "a workspace name (`workspace_id` or `runtime_session_hint`) must be 1 to 256 of A-Z a-z 0-9 _ . : -",
        ));
    }
    Ok(Some(name))
}

/// The requested wall-clock budget, clamped to the ceiling: `first` if given, else
/// `second` (the two names a request may use). Each given value must be at least 1 ms,
/// the one that loses included.
pub fn timeout(first: Option<u64>, second: Option<u64>, config: &Config) -> Result<u64, EngineError> {
    if first == Some(0) || second == Some(0) {
        return Err(EngineError::bad_request("`timeout` must be at least 1 ms"));
    }
    Ok(match first.or(second) {
        Some(ms) => ms.min(config.limits.max_run_timeout_ms),
        None => config.default_run_timeout_ms(),
    })
}

/// Each limit: the request's value if given, else the default; never above the ceiling.
pub fn resolve_limits(config: &Config, req: Option<&RequestLimits>) -> Result<Limits, EngineError> {
    let empty = RequestLimits::default();
    let r = req.unwrap_or(&empty);
    let c = &config.limits.ceilings;
    let pick = |name: &str, asked: Option<u64>, default: u64, ceiling: Option<u64>| -> Result<u64, EngineError> {
        match asked {
            Some(0) => Err(EngineError::bad_request(format!("limits.{name} must be above 0"))),
            Some(v) => Ok(v.min(ceiling.unwrap_or(default))),
            None => Ok(default),
        }
    };
    Ok(Limits {
        memory_bytes: pick(
            "memory_limit_mb",
            r.memory_limit_mb,
            config.limits.memory_limit_mb,
            c.memory_limit_mb,
        )? * MIB,
        max_processes: pick(
            "max_processes",
            r.max_processes,
            config.limits.max_processes,
            c.max_processes,
        )?,
        max_open_files: pick(
            "max_open_files",
            r.max_open_files,
            config.limits.max_open_files,
            c.max_open_files,
        )?,
        file_size_bytes: pick(
            "file_size_limit_mb",
            r.file_size_limit_mb,
            config.limits.file_size_limit_mb,
            c.file_size_limit_mb,
        )? * MIB,
        workspace_bytes: pick(
            "workspace_limit_mb",
            r.workspace_limit_mb,
            config.limits.workspace_limit_mb,
            c.workspace_limit_mb,
        )? * MIB,
        tmp_bytes: config.limits.tmp_limit_mb * MIB,
        cpu_time_ms: pick(
            "cpu_time_limit_ms",
            r.cpu_time_limit_ms,
            config.limits.cpu_time_limit_ms,
            c.cpu_time_limit_ms,
        )?,
        cpus: config.limits.cpus,
        max_output_bytes: pick(
            "max_output_bytes",
            r.max_output_bytes,
            config.limits.max_output_bytes,
            c.max_output_bytes,
        )?,
    })
}

pub fn launch_for(cmd: &ExecCommand, config: &Config) -> runtime::Launch {
    if let Some(build) = runtime::languages::build(cmd.language, config) {
        return runtime::launch_build(
            cmd.language,
            &build,
            &config.languages.bash,
            &runtime::languages::sandbox_path(config),
            cmd.limits.memory_bytes >> 20,
            &cmd.args,
        );
    }
    let interpreter = runtime::languages::interpreter(cmd.language, config);
    let mut launch = runtime::launch(cmd.language, interpreter, &cmd.args);
    launch.env.extend(runtime::languages::config_env(cmd.language, config));
    launch
}

pub fn status_of(result: &RunResult) -> ExecStatus {
    if result.timed_out {
        ExecStatus::TimedOut
    } else if result.signal.is_some() {
        ExecStatus::Killed
    } else if result.exit_code == Some(0) {
        ExecStatus::Ok
    } else {
        ExecStatus::Failed
    }
}

/// Why a run ended abnormally, in the words the model reads: the Code Interpreter API's
/// where it has them, sandcall's own for the rest. `None` for a program that exited.
pub fn abnormal_end(result: &RunResult) -> Option<String> {
    if result.timed_out {
        Some("Time limit exceeded".into())
    } else if result.oom_killed {
        Some("Out of memory".into())
    } else if result.cpu_limit_exceeded {
        Some("CPU time limit exceeded".into())
    } else if result.aborted {
        Some("Stopped: the server is shutting down".into())
    } else {
        result
            .signal
            .as_ref()
            .map(|signal| format!("Killed by signal {signal}"))
    }
}

/// LibreChat shows a model only a run's `stdout` and `stderr`, never the response's
/// flags, so without these lines a model cannot tell a program that stopped printing
/// from one that was cut off or killed, and retries blindly. Each abnormal end becomes
/// one `[sandbox] ...` line appended to `stderr`, after the cap (the notes are not
/// counted against `max_output_bytes`). `stderr_cap` is the run's `max_output_bytes`.
pub fn sandbox_notes(result: &RunResult, stderr_cap: u64) -> Vec<String> {
    let mut notes = Vec::new();
    if result.stdout_truncated {
        notes.push("[sandbox] stdout length exceeded".to_owned());
    }
    if result.stderr_truncated {
        notes.push(format!("[sandbox] stderr truncated at {stderr_cap} bytes"));
    }
    if let Some(end) = abnormal_end(result) {
        notes.push(format!("[sandbox] {end}"));
    }
    notes
}

/// Appends the notes to `stderr`, each on a line of its own.
pub fn append_notes(stderr: &mut String, notes: &[String]) {
    for note in notes {
        if !stderr.is_empty() && !stderr.ends_with('\n') {
            stderr.push('\n');
        }
        stderr.push_str(note);
        stderr.push('\n');
    }
}

/// `stderr_cap` is the run's `max_output_bytes` (see `sandbox_notes`).
pub fn to_response(session_id: String, mut result: RunResult, stderr_cap: u64) -> ExecResponse {
    let notes = sandbox_notes(&result, stderr_cap);
    append_notes(&mut result.stderr, &notes);
    ExecResponse {
        session_id,
        status: status_of(&result),
        stdout: result.stdout,
        stderr: result.stderr,
        stdout_truncated: result.stdout_truncated,
        stderr_truncated: result.stderr_truncated,
        exit_code: result.exit_code,
        code: result.exit_code,
        signal: result.signal,
        timed_out: result.timed_out,
        oom_killed: result.oom_killed,
        files: Vec::new(),
        files_skipped: Vec::new(),
        files_skipped_total: 0,
        deleted_files: Vec::new(),
        artifact_delivery: None,
        artifact_truncation: None,
        runtime_session_id: None,
        runtime_status: None,
        execution_time: result.wall_time_ms,
        wall_time: result.wall_time_ms,
        cpu_time: result.cpu_time_ms,
        memory_peak: result.memory_peak_bytes,
        network: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: &str) -> ExecRequest {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn language_wins_over_lang_and_python_is_the_default() {
        let c = Config::default();
        assert_eq!(
            parse_exec(req(r#"{"code":"x","language":"bash","lang":"py"}"#), &c)
                .unwrap()
                .language,
            Language::Bash
        );
        assert_eq!(
            parse_exec(req(r#"{"code":"x"}"#), &c).unwrap().language,
            Language::Python
        );
        let err = parse_exec(req(r#"{"code":"x","lang":"cobol"}"#), &c).unwrap_err();
        assert_eq!(err.error_type, "unsupported_language");
    }

    #[test]
    fn missing_or_blank_code_is_refused() {
        let c = Config::default();
        assert!(parse_exec(req(r#"{"language":"python"}"#), &c)
            .unwrap_err()
            .message
            .contains("required"));
        assert!(parse_exec(req(r#"{"code":"  \n"}"#), &c)
            .unwrap_err()
            .message
            .contains("empty"));
    }

    #[test]
    fn limits_are_clamped_to_ceilings() {
        let mut c = Config::default();
        c.limits.ceilings.memory_limit_mb = Some(1024);
        let l = resolve_limits(
            &c,
            Some(&RequestLimits {
                memory_limit_mb: Some(4096),
                max_processes: Some(10),
                ..Default::default()
            }),
        )
        .unwrap();
        assert_eq!(l.memory_bytes, 1024 * MIB);
        assert_eq!(l.max_processes, 10);
        // Without a ceiling, the default is the ceiling.
        let l = resolve_limits(
            &c,
            Some(&RequestLimits {
                max_open_files: Some(1 << 20),
                ..Default::default()
            }),
        )
        .unwrap();
        assert_eq!(l.max_open_files, c.limits.max_open_files);
        assert!(resolve_limits(
            &c,
            Some(&RequestLimits {
                max_processes: Some(0),
                ..Default::default()
            })
        )
        .is_err());
    }

    #[test]
    fn timeout_is_clamped_and_zero_refused() {
        let c = Config::default();
        assert_eq!(
            timeout(Some(10_000_000), None, &c).unwrap(),
            c.limits.max_run_timeout_ms
        );
        assert_eq!(timeout(Some(1500), Some(9), &c).unwrap(), 1500);
        assert_eq!(timeout(None, Some(9), &c).unwrap(), 9);
        assert!(timeout(Some(0), None, &c).is_err());
        // A zero is refused even where the other name would win.
        assert!(timeout(Some(1), Some(0), &c).is_err());
        assert!(timeout(Some(0), Some(1), &c).is_err());
    }

    #[test]
    fn status_follows_the_result() {
        let mut r = RunResult {
            exit_code: Some(0),
            ..Default::default()
        };
        assert_eq!(status_of(&r), ExecStatus::Ok);
        r.exit_code = Some(3);
        assert_eq!(status_of(&r), ExecStatus::Failed);
        r = RunResult {
            signal: Some("SIGKILL".into()),
            ..Default::default()
        };
        assert_eq!(status_of(&r), ExecStatus::Killed);
        r.timed_out = true;
        assert_eq!(status_of(&r), ExecStatus::TimedOut);
    }

    #[test]
    fn abnormal_ends_become_sandbox_lines_on_stderr() {
        let notes = |r: &RunResult| sandbox_notes(r, 65_536);
        let exited = RunResult {
            exit_code: Some(1),
            stderr: "Traceback ...".into(),
            ..Default::default()
        };
        assert!(notes(&exited).is_empty(), "a program that exited gets no note");
        let cases = [
            (
                RunResult {
                    timed_out: true,
                    signal: Some("SIGKILL".into()),
                    ..Default::default()
                },
                "[sandbox] Time limit exceeded",
            ),
            (
                RunResult {
                    oom_killed: true,
                    signal: Some("SIGKILL".into()),
                    ..Default::default()
                },
                "[sandbox] Out of memory",
            ),
            (
                RunResult {
                    cpu_limit_exceeded: true,
                    signal: Some("SIGKILL".into()),
                    ..Default::default()
                },
                "[sandbox] CPU time limit exceeded",
            ),
            (
                RunResult {
                    signal: Some("SIGSEGV".into()),
                    ..Default::default()
                },
                "[sandbox] Killed by signal SIGSEGV",
            ),
            (
                RunResult {
                    exit_code: Some(0),
                    stdout_truncated: true,
                    ..Default::default()
                },
                "[sandbox] stdout length exceeded",
            ),
            (
                RunResult {
                    exit_code: Some(0),
                    stderr_truncated: true,
                    ..Default::default()
                },
                "[sandbox] stderr truncated at 65536 bytes",
            ),
        ];
        for (result, line) in cases {
            assert_eq!(notes(&result), vec![line.to_owned()], "{result:?}");
        }
        let both = RunResult {
            stdout_truncated: true,
            timed_out: true,
            ..Default::default()
        };
        assert_eq!(
            notes(&both),
            ["[sandbox] stdout length exceeded", "[sandbox] Time limit exceeded"]
        );
        // Each note starts a line of its own, and ends one.
        let mut stderr = "partial".to_owned();
        append_notes(&mut stderr, &notes(&both));
        assert_eq!(
            stderr,
            "partial\n[sandbox] stdout length exceeded\n[sandbox] Time limit exceeded\n"
        );
        let mut stderr = String::new();
        append_notes(&mut stderr, &["[sandbox] Out of memory".to_owned()]);
        assert_eq!(stderr, "[sandbox] Out of memory\n");
    }

    #[test]
    fn only_a_bare_true_in_a_workspace_is_a_prewarm() {
        let mut config = Config::default();
        config.files.workspaces = true;
        let cmd = |json: &str| parse_exec(req(json), &config).unwrap();
        assert!(is_prewarm(&cmd(
            r#"{"lang": "bash", "code": "true", "runtime_session_hint": "c"}"#
        )));
        assert!(is_prewarm(&cmd(
            r#"{"lang": "sh", "code": " true\n", "workspace_id": "c"}"#
        )));
        for other in [
            r#"{"lang": "bash", "code": "true"}"#,
            r#"{"lang": "py", "code": "true", "runtime_session_hint": "c"}"#,
            r#"{"lang": "bash", "code": "true; ls", "runtime_session_hint": "c"}"#,
            r#"{"lang": "bash", "code": "true", "args": ["x"], "runtime_session_hint": "c"}"#,
            r#"{"lang": "bash", "code": "true", "stdin": "x", "runtime_session_hint": "c"}"#,
        ] {
            assert!(!is_prewarm(&cmd(other)), "{other}");
        }
        let answer = prewarm_response("abc".into());
        assert_eq!((answer.status, answer.exit_code), (ExecStatus::Ok, Some(0)));
        assert_eq!(
            (answer.runtime_session_id.as_deref(), answer.runtime_status),
            (Some("abc"), None)
        );
    }

    #[test]
    fn an_unknown_language_says_not_to_retry() {
        let err = parse_language(Some("cobol"), None, &Config::default()).unwrap_err();
        assert_eq!(err.code, Some("unsupported_capability"));
        assert_eq!(err.kind, ErrorKind::Invalid);
    }

    #[test]
    fn a_declared_language_without_its_toolchain_is_unsupported() {
        let config = Config {
            languages: sandcall_config::LanguagesConfig {
                node: std::path::PathBuf::from("/nonexistent/node"),
                ..Default::default()
            },
            ..Config::default()
        };
        for name in ["js", "ts"] {
            let err = parse_language(Some(name), None, &config).unwrap_err();
            assert_eq!(err.code, Some("unsupported_capability"));
            assert!(err.message.contains("toolchain is not installed"), "{}", err.message);
            // No host path reaches the client.
            assert!(!err.message.contains("/nonexistent"), "{}", err.message);
        }
    }
}
