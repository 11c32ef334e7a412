//! The `sandcall` binary: `serve`, `mcp`, `doctor`, and the hidden `sandbox-helper` that
//! runs every sandbox (forked by the hidden `helper-launcher`, or exec'd by the server
//! while no launcher runs).

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "sandcall",
    version,
    about = "Runs untrusted Python and Bash programs for AI applications"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the HTTP server.
    Serve(ServeArgs),
    /// Serve the Model Context Protocol over stdin and stdout (for an MCP client that
    /// launches sandcall itself, like Claude Desktop): the tools execute_code,
    /// upload_file, list_files and download_file, with the same config as `serve`. `serve`
    /// answers MCP over HTTP at /mcp too. See docs/mcp.md.
    Mcp(ServeArgs),
    /// Check that this machine can run sandboxes, and say how to fix what is missing.
    Doctor(ServeArgs),
    /// Manage API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Manage the runtimes programs run on (the Python data stack).
    #[command(subcommand)]
    Runtime(RuntimeCommand),
    /// Print the OpenAPI document of the HTTP API (what GET /openapi.json serves).
    Openapi,
    /// Internal: build and run one sandbox, driven over stdin/stdout by the server.
    #[command(hide = true)]
    SandboxHelper,
    /// Internal: the process that forks each sandbox's helper, driven over a socket
    /// on its stdin by the server (`sandcall_sandbox::launcher`).
    #[command(hide = true)]
    HelperLauncher,
    /// Inside a sandbox: call a declared tool (what the Bash tool commands run).
    #[command(hide = true)]
    ToolCall {
        name: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Make a new API key for principal NAME: prints the key once and appends only its
    /// SHA-256 to the config file.
    Add {
        name: String,
        /// The TOML configuration file to add the key to (created if missing).
        #[arg(long, short)]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum RuntimeCommand {
    /// Install the pinned Python runtime (numpy, pandas, matplotlib, ...) and the pinned
    /// npm packages for programs (lodash, dayjs, exceljs, ..., and TypeScript's
    /// transpiler) from the package registries into `runtime_dir`, unless they are there
    /// already; with --toolchains, the compiled languages' Debian packages instead.
    Install(InstallArgs),
}

#[derive(clap::Args)]
struct InstallArgs {
    #[command(flatten)]
    serve: ServeArgs,
    /// Install the Debian packages of the compiled languages (C, C++, Go, Java, PHP,
    /// Rust, R, Fortran, D) whose toolchain is missing, with apt-get (as root); without
    /// root or apt-get, print the apt-get command and fail.
    #[arg(long)]
    toolchains: bool,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Address to listen on (overrides `listen` and SANDCALL_LISTEN).
    #[arg(long)]
    listen: Option<String>,
    /// Data directory (overrides `data_dir` and SANDCALL_DATA_DIR).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::SandboxHelper => ExitCode::from(sandcall_sandbox::helper::run_helper() as u8),
        Command::HelperLauncher => ExitCode::from(sandcall_sandbox::launcher::run_launcher() as u8),
        Command::ToolCall { name, args } => ExitCode::from(sandcall_sandbox::tools::client_main(&name, &args) as u8),
        Command::Serve(args) => run_async(serve(args)),
        Command::Mcp(args) => run_async(mcp(args)),
        Command::Doctor(args) => run_async(doctor(args)),
        Command::Runtime(RuntimeCommand::Install(args)) if args.toolchains => toolchains_install(&args.serve),
        Command::Runtime(RuntimeCommand::Install(args)) => runtime_install(&args.serve),
        Command::Openapi => {
            print!("{}", sandcall_server::router::document());
            ExitCode::SUCCESS
        }
        Command::Keys(KeysCommand::Add { name, config }) => match sandcall_config::add_key(&config, &name) {
            Ok(key) => {
                println!("{key}");
                eprintln!(
                    "sandcall: added a key for {name} to {}; it is shown only now",
                    config.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sandcall: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

fn run_async(fut: impl std::future::Future<Output = anyhow::Result<ExitCode>>) -> ExitCode {
    let logs = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SANDCALL_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr);
    // One JSON object per line, with the request's span (route, session id) in it.
    match std::env::var("SANDCALL_LOG_FORMAT").as_deref() {
        Ok("json") => logs.json().with_current_span(true).with_span_list(false).init(),
        Ok("text") | Err(_) => logs.init(),
        Ok(other) => {
            eprintln!("sandcall: SANDCALL_LOG_FORMAT must be text or json, not {other:?}");
            return ExitCode::FAILURE;
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandcall: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(fut) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sandcall: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime_install(args: &ServeArgs) -> ExitCode {
    let config = match load(args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("sandcall: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let dir = sandcall_engine::python_runtime::runtime_dir(&config);
    eprintln!("sandcall: installing the Python runtime into {}", dir.display());
    match sandcall_engine::python_runtime::install(&dir, &config.languages.python, &mut |line| {
        eprintln!("sandcall: {line}")
    }) {
        Ok(installed) => {
            println!("{}", installed.dir.display());
            eprintln!(
                "sandcall: the Python runtime ({} packages) is ready in {}",
                installed.packages.len(),
                installed.dir.display()
            );
        }
        Err(e) => {
            eprintln!("sandcall: installing the Python runtime failed: {e}");
            return ExitCode::FAILURE;
        }
    }
    eprintln!(
        "sandcall: installing the npm packages for programs into {}",
        dir.display()
    );
    match sandcall_engine::npm_runtime::install(&dir, &config.languages.node, &mut |line| eprintln!("sandcall: {line}"))
    {
        Ok(installed) => {
            println!("{}", installed.dir.display());
            eprintln!(
                "sandcall: the npm packages ({}) are ready in {}",
                installed.packages.len(),
                installed.dir.display()
            );
            ExitCode::SUCCESS
        }
        // Without npm, JavaScript still runs (with Node's own modules): a warning.
        Err(e @ sandcall_engine::npm_runtime::InstallError::NoNpm(_)) => {
            eprintln!("sandcall: warning: {e}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sandcall: installing the npm packages failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `runtime install --toolchains`: the missing toolchains' Debian packages, or the
/// command that installs them.
fn toolchains_install(args: &ServeArgs) -> ExitCode {
    use sandcall_engine::toolchains;
    let config = match load(args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("sandcall: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    match toolchains::install(&config, &mut |line| eprintln!("sandcall: {line}")) {
        Ok(added) if added.is_empty() => {
            eprintln!("sandcall: every compiled language's toolchain is installed");
            ExitCode::SUCCESS
        }
        Ok(added) => {
            eprintln!(
                "sandcall: the toolchains of {} are installed",
                toolchains::names(&added)
            );
            ExitCode::SUCCESS
        }
        Err(toolchains::InstallError::CannotInstall { why, line }) => {
            eprintln!(
                "sandcall: cannot install the compiled languages' toolchains here: {why}. The command that \
                 installs them (as root, on Debian or Ubuntu):"
            );
            println!("{line}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("sandcall: installing the toolchains failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn load(args: &ServeArgs) -> anyhow::Result<sandcall_config::Config> {
    let overrides = sandcall_config::Overrides {
        listen: args.listen.clone(),
        data_dir: args.data_dir.clone(),
    };
    Ok(sandcall_config::Config::load(args.config.as_deref(), &overrides)?)
}

/// The configuration, refused when sandboxes could not see a path they need (before any
/// install into it: `sandcall_engine::visible::check_visible`).
fn load_visible(args: &ServeArgs) -> anyhow::Result<sandcall_config::Config> {
    let config = load(args)?;
    sandcall_engine::visible::check_visible(&config).map_err(|e| anyhow::anyhow!("refusing to start: {e}"))?;
    Ok(config)
}

/// The configuration `serve` and `mcp` run with: loaded, and pointed at the managed
/// runtimes (installed first if missing), off the async workers.
async fn prepared(args: &ServeArgs) -> anyhow::Result<sandcall_config::Config> {
    let mut config = load_visible(args)?;
    Ok(tokio::task::spawn_blocking(move || {
        install_runtimes(&mut config);
        config
    })
    .await?)
}

/// Points the config at the managed runtimes, installing them first when missing (a
/// first start); what it installed, or could not, a sentence each.
fn install_runtimes(config: &mut sandcall_config::Config) -> Vec<String> {
    let python = sandcall_engine::python_runtime::prepare_for_serve(config);
    let npm = sandcall_engine::npm_runtime::prepare_for_serve(config);
    if let Some(notice) = sandcall_engine::toolchains::start_notice(config) {
        eprintln!("sandcall: {notice}");
    }
    python.into_iter().chain(npm).collect()
}

async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    sandcall_server::serve(prepared(&args).await?).await?;
    Ok(ExitCode::SUCCESS)
}

/// As `serve`, with MCP on stdio in place of the HTTP listener, answering at once: the
/// managed runtimes are installed (a first start) while it answers.
async fn mcp(args: ServeArgs) -> anyhow::Result<ExitCode> {
    sandcall_server::serve_mcp_stdio(load_visible(&args)?, Box::new(install_runtimes)).await?;
    Ok(ExitCode::SUCCESS)
}

async fn doctor(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let mut config = load(&args)?;
    let dir = sandcall_engine::python_runtime::runtime_dir(&config);
    if let Some(found) = sandcall_engine::python_runtime::find(&dir, &config.languages.python) {
        sandcall_engine::python_runtime::apply(&mut config, &found);
    }
    let report = sandcall_engine::doctor::run(&config).await;
    print!("{}", report.render());
    Ok(if report.all_passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
