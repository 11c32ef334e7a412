//! sandcall's server: the HTTP face of the engine. Routes and extractors, the OpenAPI
//! document, listening and each connection's timers, authentication and request rates,
//! forwarding to other nodes, the MCP server mode, and the wiring that starts it all. It
//! alone turns errors into HTTP answers (`error`).

// Request paths answer errors, they do not panic (tests may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod auth;
pub mod cluster;
pub mod egress;
pub mod error;
pub mod extract;
pub mod files;
pub mod http;
pub mod listen;
pub mod mcp;
pub mod node_auth;
pub mod openapi;
pub mod profile;
pub mod rate_limit;
pub mod router;
pub mod telemetry;

// The engine's modules, under the names the routes use.
use sandcall_config as config;
use sandcall_engine::{doctor, exec, gvisor, host, npm_runtime, programmatic, python_runtime};
use sandcall_engine::{pool, runner, Engine};
use sandcall_store as store;

use config::Config;
use runner::{Runner, RunnerSettings};
use sandcall_engine::isolation::Tiers;
use std::sync::Arc;
use std::time::Duration;

/// Shared by every handler: the engine, and what only HTTP requests need (credentials,
/// request rates, forwarding to other nodes). Derefs to the engine.
#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    pub auth: sandcall_auth::Auth,
    /// Per-principal request rates (`rate_limit_*`).
    pub rate_limits: rate_limit::RateLimits,
    /// Many nodes: forwards a request about a session to the node that holds it live.
    /// None on a single node.
    pub cluster: Option<Arc<cluster::Forwarder>>,
}

impl std::ops::Deref for AppState {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        &self.engine
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
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let started = start_all(&config, shutdown_rx).await?;
    let cap = listen::connection_cap(&config);
    let listener = tokio::net::TcpListener::bind(&config.listen.address)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.listen.address.clone(),
            source,
        })?;
    let addr = listener.local_addr()?;
    let host = &started.host;
    tracing::info!(%addr, cgroup = host.cgroups.version(), data_dir = %host.data_dir.display(), "sandcall listening");
    // A machine-readable line for scripts and tests that listen on port 0.
    println!("sandcall listening on http://{addr}");

    let app = router::router(started.state.clone());
    listen::serve(listener, app, cap, listen::Timeouts::new(&config), async move {
        wait_for_signal().await;
        tracing::info!("shutting down: killing running programs");
        let _ = shutdown_tx.send(true);
    })
    .await;
    // In-flight requests have been answered; make sure every helper is gone too.
    let deadline = started.wait_for_helpers().await;
    // Every session's driver done (a paused one dormant in the store), and with many
    // nodes this node's sessions free for the others now.
    started.sessions_at_exit.release_leases(deadline).await;
    let left = started.host.cgroups.close();
    tracing::info!(left, "stopped");
    Ok(())
}

/// What `sandcall mcp` does before its engine starts, off the async workers: install
/// the managed runtimes when they are missing (the binary's `install_runtimes`). Says
/// what it did worth telling the first tool call, a sentence each.
pub type Prepare = Box<dyn FnOnce(&mut Config) -> Vec<String> + Send>;

/// `sandcall mcp`: MCP over stdin and stdout (and no HTTP listener) until the client
/// closes stdin, or SIGTERM or SIGINT. It answers at once: `initialize` and `tools/list`
/// need no engine, while `prepare` (a first start's install takes minutes) and the start
/// of the server machinery run meanwhile. Tool calls wait for them; when the start
/// fails, every tool call answers why, and the process keeps answering.
pub async fn serve_mcp_stdio(config: Config, prepare: Prepare) -> Result<(), ServeError> {
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let (ready_tx, ready_rx) = tokio::sync::watch::channel(mcp::Start::Pending);
    let held = std::sync::Mutex::new(None);
    let starting = async {
        match start_for_mcp(config, prepare, shutdown_rx.clone()).await {
            Ok((started, notice)) => {
                let host = &started.host;
                // stdout is the protocol's: nothing else may be written there.
                tracing::info!(cgroup = host.cgroups.version(), data_dir = %host.data_dir.display(), "sandcall serving MCP on stdio");
                ready_tx.send_replace(mcp::Start::Ready(Box::new(started.state.clone()), notice));
                *held.lock().unwrap_or_else(|p| p.into_inner()) = Some(started);
            }
            Err(e) => {
                eprintln!("sandcall: {e}; every MCP tool call answers with this until sandcall mcp is restarted");
                ready_tx.send_replace(mcp::Start::Failed(e.to_string().into()));
            }
        }
        std::future::pending::<()>().await
    };
    let principal = sandcall_auth::Principal(sandcall_auth::LOCAL.into());
    tokio::select! {
        served = mcp::serve_stdio(ready_rx, principal, shutdown_rx.clone()) => served?,
        () = starting => {}
        _ = wait_for_signal() => {}
    }
    let _ = shutdown_tx.send(true);
    let started = held.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(started) = started {
        started.wait_for_helpers().await;
        started.host.cgroups.close();
    }
    Ok(())
}

/// `sandcall mcp`'s start: `prepare`, then what `serve` starts; the notice for the
/// first tool call, if `prepare` had one.
async fn start_for_mcp(
    mut config: Config,
    prepare: Prepare,
    shutdown_rx: tokio::sync::watch::Receiver<bool>,
) -> Result<(Started, Option<Arc<str>>), ServeError> {
    let (config, notes) = tokio::task::spawn_blocking(move || {
        let notes = prepare(&mut config);
        (config, notes)
    })
    .await
    .map_err(|e| ServeError::Preflight(e.to_string()))?;
    let started = start_all(&config, shutdown_rx).await?;
    let notice = (!notes.is_empty()).then(|| notes.join(" ").into());
    Ok((started, notice))
}

/// A started server: what it answers with, and what its stop waits for.
struct Started {
    state: AppState,
    runners: Vec<Runner>,
    sessions_at_exit: programmatic::session::Sessions,
    host: host::Host,
}

impl Started {
    /// Waits (up to 10 s) until every helper is gone; the deadline it waited to.
    async fn wait_for_helpers(&self) -> tokio::time::Instant {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let active = || self.runners.iter().map(Runner::active).sum::<usize>();
        while active() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        deadline
    }
}

/// Everything before a server answers: the checks, the host, the engine.
async fn start_all(config: &Config, shutdown_rx: tokio::sync::watch::Receiver<bool>) -> Result<Started, ServeError> {
    let auth = preflight(config).await?;
    let host = host::prepare(config).map_err(|e| ServeError::Preflight(e.to_string()))?;
    telemetry::install().map_err(|e| ServeError::Preflight(e.to_string()))?;
    warn_if_sandboxes_outgrow_memory(config);
    let (state, runners, sessions_at_exit) = start(config, &host, auth, shutdown_rx).await?;
    Ok(Started {
        state,
        runners,
        sessions_at_exit,
        host,
    })
}

/// The isolation tiers a server has, its own (`isolation`) first: with `namespace`, also
/// `gvisor` when `runsc` is there (for the principals pinned to it, and the requests that
/// ask for it); with `gvisor`, that alone (no principal or request may have less).
fn tiers_of(config: &Config, has_runsc: bool) -> Vec<config::Isolation> {
    use config::Isolation::{Gvisor, Namespace};
    match config.host.isolation {
        Namespace if has_runsc => vec![Namespace, Gvisor],
        Namespace => vec![Namespace],
        Gvisor => vec![Gvisor],
    }
}

/// The checks before anything starts: credentials load and fit the listening address
/// (a JWT key source that cannot be parsed stops the start), and `doctor` passes.
async fn preflight(config: &Config) -> Result<sandcall_auth::Auth, ServeError> {
    // Credentials are loaded once, here: a JWT key source that cannot be parsed stops the start.
    let auth = sandcall_auth::Auth::new(config).map_err(|e| ServeError::Preflight(e.to_string()))?;
    sandcall_auth::check_listen(config, &auth).map_err(|e| ServeError::Preflight(e.to_string()))?;
    if sandcall_auth::exposed_without_credentials(config) {
        let warning = format!(
            "warning: allow_unauthenticated: listening on {} with no credentials: every host that can \
             reach it can run code here; use this only on a private network",
            config.listen.address
        );
        eprintln!("{warning}");
        tracing::warn!("{warning}");
    }
    if config.has_credentials() && config.host.isolation == config::Isolation::Namespace {
        let note = "note: isolation = \"namespace\": the programs of every principal share this host's \
                    kernel, behind namespaces and a seccomp filter; for code from people you don't trust, \
                    set isolation = \"gvisor\" (docs/isolation.md)";
        eprintln!("{note}");
        tracing::warn!("{note}");
    }
    let report = doctor::run(config).await;
    if !report.all_passed() {
        eprint!("{}", report.render());
        return Err(ServeError::Preflight(report.failures()));
    }
    Ok(auth)
}

/// Starts the engine (the runner and its launcher, admission, the stores, the warm pool,
/// the sessions an earlier server left) and the server's own state around it, with its
/// background tasks. Also returns the runner and the sessions, which the stop waits for.
async fn start(
    config: &Config,
    host: &host::Host,
    auth: sandcall_auth::Auth,
    shutdown_rx: tokio::sync::watch::Receiver<bool>,
) -> Result<(AppState, Vec<Runner>, programmatic::session::Sessions), ServeError> {
    // One runner per isolation tier this server has (`tiers_of`), the server's own first.
    let exe = std::env::current_exe()?;
    let gvisor = gvisor::for_config(config, host, &exe).map_err(|e| ServeError::Preflight(e.to_string()))?;
    let mut runners = Vec::new();
    for isolation in tiers_of(config, gvisor.is_some()) {
        let gvisor = gvisor.clone().filter(|_| isolation == config::Isolation::Gvisor);
        let runner = Runner::new(
            RunnerSettings::new(config, host, exe.clone(), gvisor),
            shutdown_rx.clone(),
        );
        runner.start_launcher().await;
        runners.push((isolation, runner));
    }
    let runner = runners[0].1.clone();
    let admission = sandcall_engine::admission::Admission::new(
        config.limits.max_concurrent_runs,
        config.queue_length(),
        Duration::from_millis(config.limits.queue_timeout_ms),
        config.runs_per_principal(),
    );
    let key = programmatic::token::TokenKey::load(config.sessions.token_secret.as_deref(), &host.data_dir)
        .map_err(|e| ServeError::Preflight(e.to_string()))?;
    let shared_config = Arc::new(config.clone());
    let store = store::open_file_store(config, &host.data_dir)
        .await
        .map_err(|e| ServeError::Preflight(e.to_string()))?;
    // A session's keys outlive its last write by as long as it can wait or run before
    // its next one: a session no node ends does not stay in Redis forever.
    let ttl_ms = config
        .sessions
        .session_expiry_s
        .saturating_mul(1000)
        .max(config.sessions.tool_call_timeout_ms)
        .saturating_add(config.limits.max_run_timeout_ms)
        .saturating_add(60_000);
    let session_store =
        store::open_session_store(config, &host.data_dir, ttl_ms).map_err(|e| ServeError::Preflight(e.to_string()))?;
    let cluster = config
        .cluster
        .node_url
        .clone()
        .filter(|_| session_store.shared())
        .map(|url| {
            // A shared session store needs token_secret (`Config::validate`).
            let secret = config.sessions.token_secret.as_deref().unwrap_or_default();
            Arc::new(cluster::Forwarder::new(url, config.cluster.peer_urls.clone(), secret))
        });
    let outbox_dir = host.outbox_dir.clone();
    // Outputs of runs a previous server did not finish storing are lost with it.
    let _ = std::fs::remove_dir_all(&outbox_dir);
    std::fs::create_dir_all(&outbox_dir)?;
    let default_limits = exec::resolve_limits(config, None).map_err(|e| ServeError::Preflight(e.message))?;
    let egress = match egress::ServerEgress::from_config(config, &host.data_dir).map_err(ServeError::Preflight)? {
        Some(policy) => {
            let dir = host.data_dir.join("egress");
            sandcall_engine::egress::prepare_dir(&dir)?;
            Some(sandcall_engine::egress::Egress {
                policy: Arc::new(policy),
                dir,
            })
        }
        None => None,
    };
    // Where runs and sessions get their sandboxes: each tier's runner with a warm pool of
    // its own. A gvisor tier that only requests may ask for (no principal is pinned to
    // it) keeps no warm sandboxes: its runs start cold.
    let mut tiers = Tiers::new();
    let mut pools = Vec::new();
    for (isolation, tier_runner) in &runners {
        let pool_config = if *isolation == config.host.isolation || config.pins_gvisor() {
            shared_config.clone()
        } else {
            let mut cold = config.clone();
            cold.languages.warm_pool_size = 0;
            Arc::new(cold)
        };
        let pool = pool::Pool::start(
            tier_runner.clone(),
            pool_config,
            default_limits.clone(),
            programmatic::tool_channel(config),
            shutdown_rx.clone(),
        );
        let tier = sandcall_engine::helper_tier::HelperTier::new(tier_runner.clone(), pool.clone());
        tiers = tiers.with(*isolation, Arc::new(tier));
        pools.push(pool);
    }
    let pool = pools[0].clone();
    let sessions = programmatic::session::Sessions::new(
        key,
        shared_config.clone(),
        shutdown_rx.clone(),
        programmatic::session::Backing {
            tiers: tiers.clone(),
            admission: admission.clone(),
            files: store.clone(),
            outbox_dir: outbox_dir.clone(),
            store: session_store,
            node: cluster.as_ref().map(|c| c.node_url().to_owned()),
            egress: egress.clone(),
        },
    );
    // Sessions an earlier server left paused wait for their resume (replay).
    sessions.recover().await;
    tokio::spawn(sessions.clone().expire_dormant());
    tokio::spawn(sessions.clone().renew_leases());
    let sessions_at_exit = sessions.clone();
    let state = AppState {
        engine: Engine {
            config: shared_config,
            runner: runner.clone(),
            pool,
            tiers,
            probing: Default::default(),
            admission,
            sessions,
            files: store.clone(),
            outbox_dir,
            egress,
        },
        auth,
        rate_limits: rate_limit::RateLimits::new(config),
        cluster,
    };
    tokio::spawn(rate_limit::forget_idle_every(
        state.rate_limits.clone(),
        Duration::from_secs(60),
    ));
    let stale_outbox = Duration::from_millis(config.limits.max_run_timeout_ms) + Duration::from_secs(600);
    tokio::spawn(sweep_files(
        store,
        Duration::from_secs(config.files.file_sweep_interval_s),
        state.outbox_dir.clone(),
        stale_outbox,
    ));
    let runners = runners.into_iter().map(|(_, r)| r).collect();
    Ok((state, runners, sessions_at_exit))
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
    let sandboxes =
        config.sessions.max_sessions + config.limits.max_concurrent_runs + 2 * config.languages.warm_pool_size;
    let worst_mib = (sandboxes as u64).saturating_mul(config.limits.memory_limit_mb);
    if let Some(total_mib) = total_mib.filter(|&t| worst_mib > t) {
        tracing::info!(
            sandboxes,
            memory_limit_mb = config.limits.memory_limit_mb,
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
