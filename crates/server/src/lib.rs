//! sandcall's server: configuration, HTTP routes, admission control and the runner that
//! drives sandbox helpers. It never forks, enters namespaces or loads seccomp filters:
//! those happen only in the helper process (`sandcall_sandbox::helper`).

// Request paths answer errors, they do not panic (tests may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod admission;
pub mod auth;
pub mod cluster;
pub mod config;
pub mod doctor;
pub mod error;
pub mod exec;
pub mod files;
pub mod host;
pub mod http;
pub mod ids;
pub mod json;
pub mod launcher;
pub mod listen;
pub mod mcp;
pub mod npm_runtime;
pub mod openapi;
pub mod pool;
pub mod programmatic;
pub mod python_runtime;
pub mod rate_limit;
pub mod runner;
pub mod runtime;
pub mod store;
pub mod telemetry;

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
    pub auth: auth::Auth,
    pub pool: pool::Pool,
    /// A health check's trial run is under way.
    pub probing: Arc<std::sync::atomic::AtomicBool>,
    pub files: Arc<dyn files::FileStore>,
    /// Where helpers put a run's output files before the store takes them.
    pub outbox_dir: std::path::PathBuf,
    /// Per-principal request rates (`rate_limit_*`).
    pub rate_limits: rate_limit::RateLimits,
    /// Many nodes: forwards a request about a session to the node that holds it live.
    /// None on a single node.
    pub cluster: Option<Arc<cluster::Forwarder>>,
}

impl AppState {
    /// Whether sandboxes can be built: after a failure, a trial run (outside admission
    /// control, so a full queue cannot hide a recovery) decides. Returns the reason when not.
    pub async fn sandbox_unavailable(&self) -> Option<String> {
        let failing = self.runner.failing()?;
        // One trial at a time, however many health checks arrive meanwhile.
        if self.probing.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Some(failing);
        }
        let still = self.probe().await;
        self.probing.store(false, std::sync::atomic::Ordering::SeqCst);
        still
    }

    async fn probe(&self) -> Option<String> {
        let launch = runtime::launch(sandcall_api::Language::Bash, &self.config.bash, &[]);
        let limits = exec::resolve_limits(&self.config, None).ok()?;
        let spec = RunSpec::new(ids::new_id(), "exit 0".into(), launch, 10_000, limits);
        let _ = self.runner.run(spec, ()).await;
        self.runner.failing()
    }

    /// Runs a validated exec command: stages its files, waits for a slot, runs, stores
    /// its output files, maps the outcome.
    /// Also says whether the run had a warm sandbox.
    pub async fn execute(
        &self,
        principal: &auth::Principal,
        cmd: exec::ExecCommand,
    ) -> Result<(ExecResponse, bool), ApiError> {
        // A run in a workspace holds it until its outputs are stored (files::workspace).
        let mut cmd = cmd;
        let workspace = match cmd.workspace.clone() {
            Some(name) => {
                let hold_ms = cmd.timeout_ms + self.config.queue_timeout_ms + WORKSPACE_HOLD_MARGIN_MS;
                let (lease, inputs) = files::workspace::take(
                    self.files.clone(),
                    &principal.0,
                    &name,
                    hold_ms,
                    self.config.file_ttl_s * 1000,
                    &cmd.files,
                )
                .await?;
                cmd.files.extend(inputs);
                Some(lease)
            }
            None => None,
        };
        let inputs =
            files::ops::resolve_inputs(&*self.files, &principal.0, &cmd.files, cmd.limits.workspace_bytes).await?;
        let queued = std::time::Instant::now();
        let slot = self.admission.admit(&principal.0).await?;
        telemetry::elapsed(telemetry::QUEUE_SECONDS, queued);
        // A warm sandbox serves requests that keep the default limits (with `zygote`, one
        // forked now when the pool is empty).
        let warm = if cmd.custom_limits {
            None
        } else {
            self.pool.take_or_fork(cmd.language, &cmd.code).await
        };
        let session_id = warm.as_ref().map_or_else(ids::new_id, |h| h.run_id().to_owned());
        tracing::Span::current().record("session_id", session_id.as_str());
        let language = cmd.language;
        let launch = exec::launch_for(&cmd, &self.config);
        let outbox = self.outbox_dir.join(&session_id);
        // Whatever happens to this request (a client that goes away drops it mid-way),
        // the run's outbox does not outlive it.
        let _outbox = OutboxGuard(outbox.clone());
        let stderr_cap = cmd.limits.max_output_bytes;
        let mut spec = RunSpec::new(session_id.clone(), cmd.code, launch, cmd.timeout_ms, cmd.limits);
        spec.stdin = cmd.stdin;
        spec.inputs = inputs;
        spec.collect = Some(self.collect_into(&outbox, spec.limits.workspace_bytes));
        // The slot travels with the run, which finishes even if the client goes away.
        let started = std::time::Instant::now();
        let was_warm = warm.is_some();
        let outcome = match warm {
            Some(helper) => {
                let (go, files) = runtime::warm_go(cmd.language, &cmd.args, None);
                spec.go = Some(go);
                spec.support_files.extend(files);
                self.runner.run_warm(helper, spec, slot).await
            }
            None => self.runner.run(spec, slot).await,
        };
        tracing::debug!(
            warm = was_warm,
            elapsed_us = started.elapsed().as_micros() as u64,
            "run finished"
        );
        let mut result = match outcome {
            Ok(result) => result,
            Err(e @ (RunError::Spawn(_) | RunError::Protocol(_) | RunError::Sandbox(_))) => {
                let _ = tokio::fs::remove_dir_all(&outbox).await;
                return Err(ApiError::internal(error_type::SANDBOX_FAILURE, &e.to_string()));
            }
        };
        let (files, skipped, skipped_total) = files::ops::ingest_outputs(
            &*self.files,
            &principal.0,
            &session_id,
            &self.config,
            &outbox,
            &mut result,
        )
        .await;
        let wall_ms = result.wall_time_ms;
        let mut response = exec::to_response(session_id, result, stderr_cap);
        telemetry::run_ended(
            "exec",
            runtime::languages::name(language, &self.config),
            response.status.label(),
            wall_ms,
        );
        response.files = files;
        response.files_skipped = skipped;
        response.files_skipped_total = skipped_total;
        if let Some(lease) = workspace {
            lease.save(&response.files).await;
        }
        Ok((response, was_warm))
    }

    /// Collection settings for a run whose outputs go to `outbox`. A run stores at most
    /// its working directory's size (`workspace_bytes`) of outputs.
    pub fn collect_into(&self, outbox: &std::path::Path, workspace_bytes: u64) -> sandcall_sandbox::protocol::Collect {
        sandcall_sandbox::protocol::Collect {
            outbox: outbox.to_path_buf(),
            max_files: self.config.max_output_files,
            max_file_bytes: self.config.max_file_bytes,
            max_total_bytes: workspace_bytes,
        }
    }
}

/// How long a workspace's lease outlasts the run's own time and its wait for a slot:
/// collecting and storing the outputs.
const WORKSPACE_HOLD_MARGIN_MS: u64 = 120_000;

/// Removes a run's outbox directory when dropped.
struct OutboxGuard(std::path::PathBuf);

impl Drop for OutboxGuard {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = std::fs::remove_dir_all(&self.0);
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
    run(config, Frontend::Http).await
}

/// `sandcall mcp`: the same server machinery, answering MCP over stdin and stdout (and
/// no HTTP listener) until the client closes stdin, or SIGTERM or SIGINT.
pub async fn serve_mcp_stdio(config: Config) -> Result<(), ServeError> {
    run(config, Frontend::McpStdio).await
}

/// What a started server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frontend {
    Http,
    McpStdio,
}

async fn run(config: Config, frontend: Frontend) -> Result<(), ServeError> {
    // Credentials are loaded once, here: a JWT key source that cannot be parsed stops the start.
    let auth = auth::Auth::new(&config).map_err(|e| ServeError::Preflight(e.to_string()))?;
    auth::check_listen(&config, &auth).map_err(ServeError::Preflight)?;
    if auth::exposed_without_credentials(&config) {
        let warning = format!(
            "warning: allow_unauthenticated: listening on {} with no credentials: every host that can \
             reach it can run code here; use this only on a private network",
            config.listen
        );
        eprintln!("{warning}");
        tracing::warn!("{warning}");
    }
    let report = doctor::run(&config).await;
    if !report.all_passed() {
        eprint!("{}", report.render());
        return Err(ServeError::Preflight(report.failures()));
    }
    let host = host::prepare(&config).map_err(ServeError::Preflight)?;
    telemetry::install().map_err(ServeError::Preflight)?;
    warn_if_sandboxes_outgrow_memory(&config);
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let runner = Runner::new(
        RunnerSettings {
            helper_exe: std::env::current_exe()?,
            runs_dir: host.runs_dir.clone(),
            cgroups: host.cgroups.clone(),
            extra_runtime_paths: config
                .extra_runtime_paths
                .iter()
                .cloned()
                .chain(runtime::languages::runtime_paths(&config))
                .collect(),
            node_modules: crate::npm_runtime::for_config(&config).map(|n| n.node_modules()),
            host_uid: host.host_uid,
            host_gid: host.host_gid,
            max_code_bytes: config.max_code_bytes,
        },
        shutdown_rx.clone(),
    );
    runner.start_launcher().await;
    let admission = Admission::new(
        config.max_concurrent_runs,
        config.queue_length(),
        Duration::from_millis(config.queue_timeout_ms),
        config.runs_per_principal(),
    );
    let key = programmatic::token::TokenKey::load(config.token_secret.as_deref(), &host.data_dir)
        .map_err(ServeError::Preflight)?;
    let shared_config = Arc::new(config.clone());
    let store = store::open_file_store(&config, &host.data_dir)
        .await
        .map_err(|e| ServeError::Preflight(e.to_string()))?;
    let session_store: Arc<dyn store::SessionStore> = match config.session_store.as_deref() {
        Some(url) if url.starts_with("redis://") => {
            // A session's keys outlive its last write by as long as it can wait or run
            // before its next one: a session no node ends does not stay in Redis forever.
            let ttl_ms = config
                .session_expiry_s
                .saturating_mul(1000)
                .max(config.tool_call_timeout_ms)
                .saturating_add(config.max_run_timeout_ms)
                .saturating_add(60_000);
            Arc::new(
                store::redis::RedisSessionStore::open(url, ttl_ms).map_err(|e| ServeError::Preflight(e.to_string()))?,
            )
        }
        _ => Arc::new(
            store::embedded::EmbeddedSessionStore::open(&host.data_dir)
                .map_err(|e| ServeError::Preflight(e.to_string()))?,
        ),
    };
    let cluster = config
        .node_url
        .clone()
        .filter(|_| session_store.shared())
        .map(|url| Arc::new(cluster::Forwarder::new(url)));
    let outbox_dir = host.data_dir.join("outbox");
    // Outputs of runs a previous server did not finish storing are lost with it.
    let _ = std::fs::remove_dir_all(&outbox_dir);
    std::fs::create_dir_all(&outbox_dir)?;
    let default_limits = exec::resolve_limits(&config, None).map_err(|e| ServeError::Preflight(e.message))?;
    let pool = pool::Pool::start(
        runner.clone(),
        shared_config.clone(),
        default_limits,
        programmatic::tool_channel(&config),
        shutdown_rx.clone(),
    );
    let sessions = programmatic::session::Sessions::new(
        key,
        shared_config.clone(),
        shutdown_rx.clone(),
        programmatic::session::Backing {
            runner: runner.clone(),
            pool: pool.clone(),
            admission: admission.clone(),
            files: store.clone(),
            outbox_dir: outbox_dir.clone(),
            store: session_store,
            node: cluster.as_ref().map(|c| c.node_url().to_owned()),
        },
    );
    // Sessions an earlier server left paused wait for their resume (replay).
    sessions.recover().await;
    tokio::spawn(sessions.clone().expire_dormant());
    tokio::spawn(sessions.clone().renew_leases());
    let sessions_at_exit = sessions.clone();
    let state = AppState {
        config: shared_config,
        runner: runner.clone(),
        pool,
        probing: Default::default(),
        admission,
        sessions,
        auth,
        files: store.clone(),
        outbox_dir,
        rate_limits: rate_limit::RateLimits::new(&config),
        cluster,
    };
    tokio::spawn(rate_limit::forget_idle_every(
        state.rate_limits.clone(),
        Duration::from_secs(60),
    ));
    let stale_outbox = Duration::from_millis(config.max_run_timeout_ms) + Duration::from_secs(600);
    tokio::spawn(sweep_files(
        store,
        Duration::from_secs(config.file_sweep_interval_s),
        state.outbox_dir.clone(),
        stale_outbox,
    ));
    if frontend == Frontend::McpStdio {
        // stdout is the protocol's: nothing else may be written there.
        tracing::info!(cgroup = host.cgroups.version(), data_dir = %host.data_dir.display(), "sandcall serving MCP on stdio");
        let principal = auth::Principal(auth::LOCAL.into());
        tokio::select! {
            served = mcp::serve_stdio(state, principal, shutdown_rx.clone()) => served?,
            _ = wait_for_signal() => {}
        }
        let _ = shutdown_tx.send(true);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while runner.active() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        host.cgroups.close();
        return Ok(());
    }
    let cap = listen::connection_cap(&config);
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
    listen::serve(listener, app, cap, listen::Timeouts::new(&config), async move {
        wait_for_signal().await;
        tracing::info!("shutting down: killing running programs");
        let _ = shutdown_tx.send(true);
    })
    .await;
    // In-flight requests have been answered; make sure every helper is gone too.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while runner.active() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Every session's driver done (a paused one dormant in the store), and with many
    // nodes this node's sessions free for the others now.
    sessions_at_exit.release_leases(deadline).await;
    let left = host.cgroups.close();
    tracing::info!(left, "stopped");
    Ok(())
}

/// Paused sessions keep their sandboxes, and each may hold `memory_limit_mb`: say so at
/// start when all of them together (with the runs and the warm pool) could hold more
/// than the machine has, since then the kernel, not the limits, decides who goes. A
/// note, not a warning: the limits are caps, and most sandboxes use a few MiB (the
/// defaults on a small machine are over).
fn warn_if_sandboxes_outgrow_memory(config: &Config) {
    let total_mib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let kib: u64 = m
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some(kib >> 10)
    });
    let sandboxes = config.max_sessions + config.max_concurrent_runs + 2 * config.warm_pool_size;
    let worst_mib = (sandboxes as u64).saturating_mul(config.memory_limit_mb);
    if let Some(total_mib) = total_mib.filter(|&t| worst_mib > t) {
        tracing::info!(
            sandboxes,
            memory_limit_mb = config.memory_limit_mb,
            worst_mib,
            total_mib,
            "max_sessions + max_concurrent_runs + the warm pool, each at memory_limit_mb, could hold more memory \
             than this machine has; lower max_sessions (or memory_limit_mb) to keep every sandbox within it"
        );
    }
}

/// Deletes expired files now and then, and outbox directories that no request came
/// back for (their client went away before the run ended).
async fn sweep_files(store: Arc<dyn files::FileStore>, every: Duration, outbox: std::path::PathBuf, stale: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let outbox = outbox.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for entry in std::fs::read_dir(&outbox).into_iter().flatten().flatten() {
                let old = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .map(|t| t.elapsed().unwrap_or_default() > stale);
                if old.unwrap_or(false) {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        })
        .await;
        match store.sweep(files::now_ms()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(n, "expired files deleted"),
            Err(e) => tracing::warn!(error = %e, "sweeping expired files"),
        }
    }
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
