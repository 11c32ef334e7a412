//! `sandcall doctor`: every check `serve` depends on, each with its fix.

use crate::host;
use crate::runner::{RunSpec, Runner, RunnerSettings};
use crate::runtime;
use crate::runtime::languages::State;
use sandcall_api::Language;
use sandcall_config::{Config, Isolation};
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
    pub fix: &'static str,
}

pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    pub fn all_passed(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            let _ = writeln!(out, "[{}] {}: {}", if c.ok { "pass" } else { "FAIL" }, c.name, c.detail);
            if !c.ok {
                let _ = writeln!(out, "       fix: {}", c.fix);
            }
        }
        out
    }

    pub fn failures(&self) -> String {
        self.checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| format!("{}: {} (fix: {})", c.name, c.detail, c.fix))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

fn read_int(path: &str) -> Option<i64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn check_userns() -> Check {
    let root = nix::unistd::geteuid().is_root();
    let max = read_int("/proc/sys/user/max_user_namespaces");
    let unpriv = read_int("/proc/sys/kernel/unprivileged_userns_clone");
    let apparmor = read_int("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");
    let (ok, detail) = if max == Some(0) {
        (false, "user.max_user_namespaces is 0".to_string())
    } else if !root && unpriv == Some(0) {
        (
            false,
            "kernel.unprivileged_userns_clone is 0 and sandcall is not root".to_string(),
        )
    } else if !root && apparmor == Some(1) {
        (false, "AppArmor restricts unprivileged user namespaces".to_string())
    } else {
        (
            true,
            format!("available ({})", if root { "running as root" } else { "unprivileged" }),
        )
    };
    Check {
        name: "user namespaces",
        ok,
        detail,
        fix: "sysctl -w user.max_user_namespaces=15000 kernel.unprivileged_userns_clone=1 (and on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0), or run sandcall as root",
    }
}

fn check_seccomp() -> Check {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let policy = sandcall_sandbox::seccomp::Policy::compile();
    let (ok, detail) = match (status.contains("Seccomp:"), policy) {
        (false, _) => (false, "the kernel has no seccomp support".to_string()),
        (true, Err(e)) => (false, e.to_string()),
        (true, Ok(_)) => (true, "filter compiles and the kernel supports seccomp".to_string()),
    };
    Check {
        name: "seccomp",
        ok,
        detail,
        fix: "use a kernel built with CONFIG_SECCOMP_FILTER=y",
    }
}

/// Landlock is a second layer, best effort: its absence is a warning, never a failure.
fn check_landlock(config: &Config) -> Check {
    let abi = sandcall_sandbox::landlock_layer::kernel_abi();
    let mut detail = if abi == 0 {
        let warning = "warning: this kernel has no Landlock (or it is disabled): runs are confined by \
                       namespaces, mounts and seccomp only";
        tracing::warn!("{warning}");
        warning.to_string()
    } else if abi < 6 {
        format!(
            "ABI {abi}: filesystem rules in force; abstract Unix sockets and signals are not scoped (ABI 6, \
             Linux 6.12)"
        )
    } else {
        format!("ABI {abi}: filesystem rules, abstract Unix sockets and signals scoped")
    };
    if config.pins_gvisor() {
        detail.push_str("; in the gvisor tier, gVisor's kernel has no Landlock: runs there go without it");
    }
    Check {
        name: "landlock",
        ok: true,
        detail,
        fix: "boot a kernel with CONFIG_SECURITY_LANDLOCK=y and landlock in its lsm= list",
    }
}

fn check_interpreter(name: &'static str, path: &Path) -> Check {
    use std::os::unix::fs::PermissionsExt;
    let ok = fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false);
    Check {
        name,
        ok,
        detail: if ok {
            format!("{}", path.display())
        } else {
            format!("{} is missing or not executable", path.display())
        },
        fix: "install it (apt-get install python3 bash) or set `python` / `bash` in the config to its absolute path",
    }
}

/// Each language's state, one line each: ready (with the commands it runs), or what is
/// missing (the interpreter, the toolchain and its Debian packages, the transpiler) and
/// the command that adds it. Every language but Python and Bash (checked above) is
/// optional: reported, never failed.
fn check_languages(config: &Config) -> Check {
    let built_in = runtime::languages::LANGUAGES.iter().map(|d| d.language);
    let declared = (0..config.languages.declared.len()).filter_map(|i| u16::try_from(i).ok().map(Language::Declared));
    let mut ready = 0;
    let mut lines = Vec::new();
    for l in built_in.chain(declared) {
        let name = runtime::languages::name(l, config);
        let state = runtime::languages::state(l, config);
        let line = match &state {
            State::Ready => {
                ready += 1;
                format!("{name}: ready ({})", ready_detail(l, config))
            }
            State::MissingToolchain {
                packages,
                absent,
                searched,
            } if !packages.is_empty() => format!(
                "{name}: missing toolchain (Debian {} {}): {} not found in {searched} (config `toolchain_path`)",
                if packages.len() == 1 { "package" } else { "packages" },
                packages.join(" "),
                absent.join(", ")
            ),
            State::MissingToolchain { .. } => format!("{name}: missing toolchain: {}", state.why().unwrap_or_default()),
            State::MissingInterpreter { .. } => {
                format!("{name}: missing interpreter: {}", state.why().unwrap_or_default())
            }
            State::MissingTranspiler { .. } => {
                format!("{name}: missing transpiler: {}", state.why().unwrap_or_default())
            }
            State::NotDeclared => format!("{name}: not declared"),
        };
        lines.push(line);
    }
    let mut detail = format!("{ready} of {} ready", lines.len());
    let toolchains = crate::toolchains::missing(config);
    if !toolchains.is_empty() {
        let _ = write!(
            detail,
            "; `{}` adds {} ({})",
            crate::toolchains::COMMAND,
            crate::toolchains::names(&toolchains),
            crate::toolchains::apt_install_line(&crate::toolchains::packages(&toolchains))
        );
    }
    for line in lines {
        let _ = write!(detail, "\n       - {line}");
    }
    Check {
        name: "languages",
        ok: true,
        detail,
        fix: "`sandcall runtime install --toolchains` (the compiled languages' Debian packages), `sandcall runtime install` (TypeScript's transpiler, with the npm packages), Node.js 20 for JavaScript and TypeScript (apt-get install nodejs npm); or set `node`, `toolchain_path`, `typescript_transpiler`",
    }
}

/// What a ready language runs: its interpreter, its toolchain's commands, its transpiler.
fn ready_detail(language: Language, config: &Config) -> String {
    let mut found: Vec<String> = runtime::languages::tools(language, config)
        .into_iter()
        .filter_map(|t| runtime::languages::find_tool(t, config))
        .map(|p| p.display().to_string())
        .collect();
    if found.is_empty() {
        found.push(runtime::languages::interpreter(language, config).display().to_string());
    }
    if runtime::languages::declaration(language).transpiler {
        found.push(runtime::languages::transpiler_on_host(config).display().to_string());
    }
    found.join(", ")
}

/// Which credentials are configured; a JWT key source that cannot be read or parsed
/// fails, with the message `serve` refuses to start with.
fn check_credentials(config: &Config) -> Check {
    let (ok, detail) = match sandcall_auth::Auth::new(config) {
        Ok(auth) => (true, auth.describe()),
        Err(e) => (false, e.to_string()),
    };
    Check {
        name: "credentials",
        ok,
        detail,
        fix: "correct or remove the JWT key source named above ([jwt] in the config, or the CODEAPI_JWT_* variables; see docs/configuration.md)",
    }
}

/// The managed Python runtime in use and its packages. Never a failure: without one,
/// Python runs on the bare interpreter.
fn check_python_runtime(config: &Config) -> Check {
    let dir = crate::python_runtime::runtime_dir(config);
    let detail = match crate::python_runtime::in_use(config) {
        Some(r) => {
            let list: Vec<String> = r.packages.iter().map(|p| format!("{} {}", p.name, p.version)).collect();
            format!(
                "{} in {}, {} packages: {}",
                r.id,
                r.dir.display(),
                r.packages.len(),
                list.join(", ")
            )
        }
        None => format!(
            "none in {}: Python runs on the bare {} (`sandcall runtime install` adds numpy, pandas, matplotlib, ...)",
            dir.display(),
            config.languages.python.display()
        ),
    };
    Check {
        name: "python runtime",
        ok: true,
        detail,
        fix: "run `sandcall runtime install`",
    }
}

/// The npm packages for programs and their versions. Never a failure: without them,
/// JavaScript and TypeScript run with Node's own modules only.
fn check_npm_packages(config: &Config) -> Check {
    let detail = match crate::npm_runtime::for_config(config) {
        Some(n) => {
            let list: Vec<String> = n.packages.iter().map(|p| format!("{} {}", p.name, p.version)).collect();
            format!(
                "{} in {}, bound at {}, {} packages: {}",
                n.id,
                n.dir.display(),
                crate::npm_runtime::SANDBOX_PATH,
                n.packages.len(),
                list.join(", ")
            )
        }
        None => format!(
            "none in {}: JavaScript and TypeScript run without npm packages (`sandcall runtime install` adds lodash, dayjs, exceljs, ...)",
            crate::python_runtime::runtime_dir(config).display()
        ),
    };
    Check {
        name: "npm packages",
        ok: true,
        detail,
        fix: "run `sandcall runtime install` (it needs npm)",
    }
}

/// A `runsc` older than this is named in `doctor`'s detail and logged as a warning at
/// start: gVisor fixes security bugs every week.
const RUNSC_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

/// The `gvisor` tier's `runsc`: found, its version and platform, and its age.
fn check_gvisor(config: &Config) -> Check {
    let fix = "install gVisor's runsc (runtimes/gvisor/install.sh on Debian and Ubuntu, or a current release \
               of gVisor's own) or set `runsc_path`; docs/isolation.md";
    let found = crate::gvisor::find_runsc(config.host.runsc_path.as_deref())
        .and_then(|path| crate::gvisor::runsc_version(&path).map(|v| (path, v)));
    let (path, version) = match found {
        Ok(found) => found,
        Err(e) => {
            return Check {
                name: "gvisor",
                ok: false,
                detail: e.to_string(),
                fix,
            }
        }
    };
    let mut detail = format!("{} ({}), platform systrap", version.line, path.display());
    let released = version
        .released
        .and_then(|(y, m, d)| humantime::parse_rfc3339(&format!("{y:04}-{m:02}-{d:02}T00:00:00Z")).ok());
    match released.and_then(|r| std::time::SystemTime::now().duration_since(r).ok()) {
        Some(age) if age > RUNSC_MAX_AGE => {
            let warning = format!(
                "warning: runsc was released {} days ago; gVisor fixes security bugs every week: install a \
                 current release (docs/isolation.md, \"Installing runsc\")",
                age.as_secs() / 86_400
            );
            tracing::warn!("{warning}");
            let _ = write!(detail, "; {warning}");
        }
        Some(_) => {}
        None => detail.push_str("; its release date is unknown"),
    }
    Check {
        name: "gvisor",
        ok: true,
        detail,
        fix,
    }
}

/// The host paths runs must see are where sandboxes can see them (`visible::check_visible`).
fn check_visible(config: &Config) -> Check {
    let visible = crate::visible::check_visible(config);
    Check {
        name: "paths sandboxes see",
        ok: visible.is_ok(),
        detail: match visible {
            Ok(()) => format!(
                "the runtime directory {} and the toolchains are outside the sandbox's own mount points",
                crate::python_runtime::runtime_dir(config).display()
            ),
            Err(e) => e.to_string(),
        },
        fix: "move the path the detail names to a directory that sandboxes see, as it says",
    }
}

/// Runs every check, ending with a real sandboxed program in each language.
pub async fn run(config: &Config) -> Report {
    let mut checks = vec![
        check_credentials(config),
        check_userns(),
        check_seccomp(),
        check_landlock(config),
    ];
    checks.push(check_interpreter("python interpreter", &config.languages.python));
    checks.push(check_interpreter("bash interpreter", &config.languages.bash));
    checks.push(check_languages(config));
    checks.push(check_python_runtime(config));
    checks.push(check_npm_packages(config));
    if config.pins_gvisor() || crate::gvisor::find_runsc(config.host.runsc_path.as_deref()).is_ok() {
        checks.push(check_gvisor(config));
    }
    checks.push(check_visible(config));
    let data_dir = host::data_dir(config);
    checks.push(Check {
        name: "data directory",
        ok: data_dir.is_ok(),
        detail: match &data_dir {
            Ok(d) => d.display().to_string(),
            Err(e) => e.to_string(),
        },
        fix: "make `data_dir` point to a directory sandcall can create and write",
    });
    let cgroups = data_dir
        .as_ref()
        .map_err(ToString::to_string)
        .and_then(|d| host::cgroups(config, d).map_err(|e| e.to_string()));
    checks.push(Check {
        name: "cgroups",
        ok: cgroups.is_ok(),
        detail: match &cgroups {
            Ok(c) => format!("{} at {}", c.version(), c.bases().first().map(|p| p.display().to_string()).unwrap_or_default()),
            Err(e) => e.clone(),
        },
        fix: "run as root with cgroup v1 memory+pids or cgroup v2 mounted, or delegate a cgroup v2 subtree to this user (systemd: Delegate=yes) and set `cgroup_root` to it",
    });
    if checks.iter().all(|c| c.ok) {
        checks.push(trial_run(config).await);
    }
    Report { checks }
}

/// Builds a real sandbox and runs a program in each language, in each isolation tier a
/// principal may be pinned to (the server's own `isolation`, and `gvisor` when a key
/// pins one to it).
async fn trial_run(config: &Config) -> Check {
    let fix = "run `sandcall doctor` as the same user as the server and read the detail above; SANDCALL_LOG=debug shows the helper's errors";
    let failed = |detail: String| Check {
        name: "sandbox trial run",
        ok: false,
        detail,
        fix,
    };
    let host = match host::prepare(config) {
        Ok(h) => h,
        Err(e) => return failed(e.to_string()),
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return failed(format!("current_exe: {e}")),
    };
    let gvisor = match crate::gvisor::for_config(config, &host, &exe) {
        Ok(g) => g,
        Err(e) => return failed(e.to_string()),
    };
    let mut tiers = vec![config.host.isolation];
    if config.pins_gvisor() && !tiers.contains(&Isolation::Gvisor) {
        tiers.push(Isolation::Gvisor);
    }
    let mut ran = Vec::new();
    for isolation in &tiers {
        let gvisor = gvisor.clone().filter(|_| *isolation == Isolation::Gvisor);
        let (_tx, rx) = tokio::sync::watch::channel(false);
        let runner = Runner::new(RunnerSettings::new(config, &host, exe.clone(), gvisor), rx);
        ran = match trial_in(config, &runner).await {
            Ok(ran) => ran,
            Err(detail) => return failed(format!("{} tier: {detail}", isolation.name())),
        };
    }
    let tiers: Vec<&str> = tiers.iter().map(|i| i.name()).collect();
    Check {
        name: "sandbox trial run",
        ok: true,
        detail: format!(
            "{} ran in a sandbox of the {} tier",
            ran.join(", "),
            tiers.join(" and the ")
        ),
        fix,
    }
}

/// The trial programs, one per language installed, in sandboxes of `runner`; the
/// languages that ran, or what went wrong.
async fn trial_in(config: &Config, runner: &Runner) -> Result<Vec<&'static str>, String> {
    let mut ran = Vec::new();
    for (language, code, expected) in [
        (Language::Bash, "echo sandcall-ok", "sandcall-ok\n"),
        (Language::Python, "print(6 * 7)", "42\n"),
        (Language::JavaScript, "console.log(6 * 7)", "42\n"),
        (Language::TypeScript, "const n: number = 6 * 7;\nconsole.log(n)", "42\n"),
    ] {
        // JavaScript and TypeScript are optional: the languages check says when they
        // are missing.
        if runtime::languages::missing(language, config).is_some() {
            continue;
        }
        ran.push(language.names()[0]);
        let interpreter = runtime::languages::interpreter(language, config);
        let mut launch = runtime::launch(language, interpreter, &[]);
        launch.env.extend(runtime::languages::config_env(language, config));
        let limits = crate::exec::resolve_limits(config, None).map_err(|e| e.message)?;
        let spec = RunSpec::new(sandcall_api::ids::new_id(), code.into(), launch, 20_000, limits);
        match runner.run(spec, ()).await {
            Ok(r) if r.stdout == expected && r.exit_code == Some(0) => {}
            Ok(r) => {
                return Err(format!(
                    "{language:?} printed {:?}, stderr {:?}, exit {:?}, signal {:?}, timed out {}, out of memory {}, after {} ms",
                    r.stdout, r.stderr, r.exit_code, r.signal, r.timed_out, r.oom_killed, r.wall_time_ms
                ))
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    // Helpers answer before they finish tearing down; let them finish, so that nothing
    // of the trial is mistaken for a leftover by the sweep that `serve` does next.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while runner.active() > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    Ok(ran)
}
