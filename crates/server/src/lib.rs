//! sandcall's server: configuration, HTTP routes, admission control and the runner that
//! drives sandbox helpers. It never forks, enters namespaces or loads seccomp filters:
//! those happen only in the helper process (`sandcall_sandbox::helper`).

pub mod admission;
pub mod config;
pub mod doctor;
pub mod error;
pub mod exec;
pub mod host;
pub mod http;
pub mod ids;
pub mod programmatic;
pub mod runner;
pub mod runtime;

use admission::Admission;
use config::Config;
use error::ApiError;
use runner::{RunError, RunSpec, Runner, RunnerSettings};
use sandcall_api::{error_type, ExecResponse};
use std::sync::Arc;
use std::time::Duration;

/// Shared by every handler.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub runner: Runner,
    pub admission: Admission,
    pub sessions: programmatic::session::Sessions,
}

impl AppState {
    /// Whether sandboxes can be built: after a failure, a trial run (outside admission
    /// control, so a full queue cannot hide a recovery) decides. Returns the reason when not.
    pub async fn sandbox_unavailable(&self) -> Option<String> {
        self.runner.failing()?;
        let launch = runtime::launch(sandcall_api::Language::Bash, &self.config.bash, &[]);
        let limits = exec::resolve_limits(&self.config, None).ok()?;
        let spec = RunSpec {
            run_id: ids::new_id(),
            code: "exit 0".into(),
            code_file: launch.code_file,
            argv: launch.argv,
            env: launch.env,
            stdin: String::new(),
            timeout_ms: 10_000,
            limits,
            support_files: Vec::new(),
            tools: None,
        };
        let _ = self.runner.run(spec, ()).await;
        self.runner.failing()
    }

    /// Runs a validated exec command: waits for a slot, runs, maps the outcome.
    pub async fn execute(&self, cmd: exec::ExecCommand) -> Result<ExecResponse, ApiError> {
        let slot = self.admission.admit().await?;
        let session_id = ids::new_id();
        let launch = exec::launch_for(&cmd, &self.config);
        let spec = RunSpec {
            run_id: session_id.clone(),
            code: cmd.code,
            code_file: launch.code_file,
            argv: launch.argv,
            env: launch.env,
            stdin: cmd.stdin,
            timeout_ms: cmd.timeout_ms,
            limits: cmd.limits,
            support_files: Vec::new(),
            tools: None,
        };
        // The slot travels with the run, which finishes even if the client goes away.
        match self.runner.run(spec, slot).await {
            Ok(result) => Ok(exec::to_response(session_id, result)),
            Err(e @ (RunError::Spawn(_) | RunError::Protocol(_) | RunError::Sandbox(_))) => {
                Err(ApiError::internal(error_type::SANDBOX_FAILURE, &e.to_string()))
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("refusing to start: {0}")]
    Preflight(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
}

/// Runs the server until SIGTERM or SIGINT, then kills the running programs, reclaims
/// their sandboxes and returns.
pub async fn serve(config: Config) -> Result<(), ServeError> {
    let report = doctor::run(&config).await;
    if !report.all_passed() {
        eprint!("{}", report.render());
        return Err(ServeError::Preflight(report.failures()));
    }
    let host = host::prepare(&config).map_err(ServeError::Preflight)?;
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let runner = Runner::new(
        RunnerSettings {
            helper_exe: std::env::current_exe()?,
            runs_dir: host.runs_dir.clone(),
            cgroups: host.cgroups.clone(),
            extra_runtime_paths: config.extra_runtime_paths.clone(),
            host_uid: host.host_uid,
            host_gid: host.host_gid,
            max_code_bytes: config.max_code_bytes,
        },
        shutdown_rx.clone(),
    );
    let admission = Admission::new(
        config.max_concurrent_runs,
        config.queue_length(),
        Duration::from_millis(config.queue_timeout_ms),
    );
    let key = programmatic::token::TokenKey::load(config.token_secret.as_deref(), &host.data_dir)
        .map_err(ServeError::Preflight)?;
    let shared_config = Arc::new(config.clone());
    let sessions =
        programmatic::session::Sessions::new(key, runner.clone(), shared_config.clone(), shutdown_rx.clone());
    let state = AppState {
        config: shared_config,
        runner: runner.clone(),
        admission,
        sessions,
    };
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.listen.clone(),
            source,
        })?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, cgroup = host.cgroups.version(), data_dir = %host.data_dir.display(), "sandcall listening");
    // A machine-readable line for scripts and tests that listen on port 0.
    println!("sandcall listening on http://{addr}");

    let app = http::router(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            wait_for_signal().await;
            tracing::info!("shutting down: killing running programs");
            let _ = shutdown_tx.send(true);
        })
        .await?;
    // In-flight requests have been answered; make sure every helper is gone too.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while runner.active() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let left = host.cgroups.sweep();
    tracing::info!(left, "stopped");
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        // Without signal handlers we can only run until killed.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
