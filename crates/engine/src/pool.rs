//! Warm sandboxes: built, with their interpreter already started and waiting, before a
//! request arrives. Each is used once and replaced in the background, so no state of
//! one run can reach another; a request that finds the pool empty (a burst) or asks for
//! limits other than the defaults takes the cold path instead.
//!
//! With `zygote`, Python runs are forked from a template of the run's own principal
//! (`Templates`): started on a principal's first run, stopped when idle, at most
//! `zygote_templates` at once. Runs of one principal share their template's memory
//! layout, AT_RANDOM (the stack canary and pointer guard) and hash seed; runs of two
//! principals never do. Each template keeps one sandbox forked ahead for its principal.
//! The warm sets themselves are built the usual way (each program its own interpreter,
//! so its own randomness) and serve any principal.

use crate::runner::{Helper, Runner, Template};
use crate::runtime;
use sandcall_api::ids;
use sandcall_api::Language;
use sandcall_config::Config;
use sandcall_sandbox::protocol::{Launch, Limits, ToolChannel};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};

#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

/// One warm set: a language's sandboxes, and for Python on the managed runtime a second
/// set whose interpreters have imported `warm_preload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Set {
    language: Language,
    preloaded: bool,
}

struct Inner {
    ready: Mutex<HashMap<Set, Vec<Helper>>>,
    wake: Notify,
    /// The top-level packages of `warm_preload` when a preloaded set is kept: a run
    /// whose code imports one of them is given a preloaded sandbox.
    preloaded_packages: Vec<String>,
    /// The sets whose runs are forked from a template of their principal (`zygote`),
    /// and what such a template and a fork of it need.
    forks: Mutex<HashMap<Set, ForkFrom>>,
    /// The principals' templates.
    templates: Templates,
    shutdown: watch::Receiver<bool>,
}

/// What it takes to start a principal's template of a set and to fork a run of it
/// (`Pool::take_or_fork`).
#[derive(Clone)]
struct ForkFrom {
    runner: Runner,
    /// The template's launch and limits.
    launch: Launch,
    template_limits: Limits,
    /// A run's.
    limits: Limits,
    tools: ToolChannel,
}

/// The templates of the principals, one per principal and set: started on demand,
/// stopped after `idle` without a run, at most `max` alive at once.
struct Templates {
    alive: Mutex<HashMap<(String, Set), Arc<PrincipalTemplate>>>,
    max: usize,
    idle: Duration,
}

/// One principal's template of one set, and the sandbox forked from it ahead of the
/// principal's next run.
struct PrincipalTemplate {
    zygote: Arc<Zygote>,
    /// Forked ahead (at most `FORKED_AHEAD`), for this principal's runs only.
    ready: Mutex<Vec<Helper>>,
    last_used: Mutex<tokio::time::Instant>,
    /// Set to true to stop its keeper (evicted).
    stop: watch::Sender<bool>,
}

/// Sandboxes each principal's template keeps forked ahead of its runs: a fork on the
/// request path costs the run the fork, its cgroup and its mounts.
const FORKED_AHEAD: usize = 1;

impl PrincipalTemplate {
    fn take(&self) -> Option<Helper> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = tokio::time::Instant::now();
    }

    fn idle_since(&self) -> tokio::time::Instant {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Pool {
    /// Starts one refill task per warm set: `warm_pool_size` sandboxes for each
    /// language, and `warm_preload_pool_size` preloaded Python ones.
    pub fn start(
        runner: Runner,
        config: Arc<Config>,
        limits: Limits,
        tools: ToolChannel,
        shutdown: watch::Receiver<bool>,
    ) -> Pool {
        let preload = config.languages.warm_pool_size > 0
            && config.languages.warm_preload_pool_size > 0
            && !config.languages.warm_preload.is_empty()
            && crate::python_runtime::in_use(&config).is_some();
        let mut preloaded_packages: Vec<String> = Vec::new();
        if preload {
            for module in &config.languages.warm_preload {
                let package = module.split('.').next().unwrap_or(module).to_owned();
                if !preloaded_packages.contains(&package) {
                    preloaded_packages.push(package);
                }
            }
        }
        let pool = Pool {
            inner: Arc::new(Inner {
                ready: Mutex::new(HashMap::new()),
                wake: Notify::new(),
                preloaded_packages,
                forks: Mutex::new(HashMap::new()),
                templates: Templates {
                    alive: Mutex::new(HashMap::new()),
                    max: config.languages.zygote_templates,
                    idle: Duration::from_secs(config.languages.zygote_template_idle_s),
                },
                shutdown: shutdown.clone(),
            }),
        };
        if config.languages.warm_pool_size == 0 {
            return pool;
        }
        // One warm set per declared language that has a warm launcher and whose
        // toolchain is installed.
        let wanted: Vec<Language> = config
            .languages
            .warm_languages
            .iter()
            .filter_map(|n| Language::parse(n))
            .collect();
        for decl in runtime::languages::LANGUAGES.iter().filter(|d| d.warm.is_some()) {
            let language = decl.language;
            if !wanted.contains(&language) {
                continue;
            }
            if let Some(why) = runtime::languages::missing(language, &config) {
                tracing::info!(?language, "no warm sandboxes: {why}");
                continue;
            }
            let interpreter = runtime::languages::interpreter(language, &config);
            let (argv, mut env) = runtime::warm_launch(language, interpreter);
            env.extend(runtime::languages::config_env(language, &config));
            let mut sets = vec![(false, config.languages.warm_pool_size, env.clone())];
            if language == Language::Python && preload {
                // These import the heavy modules while they wait (runner.py), so a
                // run's `import pandas` costs nothing.
                env.push(("SANDCALL_PRELOAD".into(), config.languages.warm_preload.join(",")));
                sets.push((true, config.languages.warm_preload_pool_size, env));
            }
            for (preloaded, size, env) in sets {
                // Python's sets fork from a template of their own when `zygote` is on.
                // Without root, a run's helper could not reach its non-dumpable init
                // through /proc, so the sets are built the usual way.
                // A gVisor sandbox holds one run: nothing is forked across them.
                let zygote_on = config.languages.zygote
                    && language == Language::Python
                    && config.host.isolation == sandcall_config::Isolation::Namespace;
                if zygote_on && !nix::unistd::geteuid().is_root() {
                    // A note, not a warning: `zygote` is on by default, and a server
                    // that is not root is a supported way to run.
                    tracing::info!(
                        "zygote needs the server to run as root; warm Python sandboxes are built the usual way"
                    );
                }
                if zygote_on && nix::unistd::geteuid().is_root() {
                    // Each principal's template is started at its first run
                    // (`take_or_fork`); this is what it takes.
                    let (argv, mut env) = runtime::template_launch(interpreter);
                    env.extend(runtime::languages::config_env(language, &config));
                    if preloaded {
                        env.push(("SANDCALL_PRELOAD".into(), config.languages.warm_preload.join(",")));
                    }
                    let fork = ForkFrom {
                        runner: runner.clone(),
                        launch: Launch {
                            argv,
                            env,
                            wait_ready: true,
                        },
                        template_limits: template_limits(&limits, &config),
                        limits: limits.clone(),
                        tools: tools.clone(),
                    };
                    pool.inner
                        .forks
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(Set { language, preloaded }, fork);
                }
                let fill = Refill {
                    pool: pool.clone(),
                    runner: runner.clone(),
                    set: Set { language, preloaded },
                    size,
                    // A preloaded sandbox is handed out only once its imports are done
                    // (runner.py says `ready`).
                    launch: Launch {
                        argv: argv.clone(),
                        env,
                        wait_ready: preloaded,
                    },
                    limits: limits.clone(),
                    tools: tools.clone(),
                };
                tokio::spawn(fill.run(shutdown.clone()));
            }
        }
        if !pool.inner.forks.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
            tokio::spawn(pool.clone().evict_idle_templates(shutdown));
        }
        pool
    }

    fn ready(&self) -> std::sync::MutexGuard<'_, HashMap<Set, Vec<Helper>>> {
        self.inner.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A warm sandbox for a run of `code` in `language`, if one is ready. It is the
    /// caller's now. Python code that imports a preloaded package gets a preloaded
    /// sandbox; any other code a plain one, so that a stream of short runs never uses
    /// up the preloaded sandboxes, which are slow to rebuild. Either way the run's
    /// results are the same: only its import time differs.
    pub fn take(&self, language: Language, code: &str) -> Option<Helper> {
        let helper = self.ready().get_mut(&self.set_for(language, code)).and_then(Vec::pop);
        self.inner.wake.notify_waiters();
        helper
    }

    /// A sandbox for a run of `principal`'s: forked now from the principal's template
    /// of the set when it is ready (a fork, a cgroup and a few mounts; no interpreter
    /// to start), else a warm one as `take` gives. A principal with no template yet has
    /// one started for its later runs (when fewer than `zygote_templates` are alive);
    /// its run does not wait for it. None when neither is to be had: the run takes the
    /// cold path.
    pub async fn take_or_fork(&self, principal: &str, language: Language, code: &str) -> Option<Helper> {
        let set = self.set_for(language, code);
        if let Some(helper) = self.fork_for(principal, set).await {
            return Some(helper);
        }
        self.take(language, code)
    }

    /// A sandbox forked from `principal`'s template of `set`, if it is ready; starts
    /// the template if there is none.
    async fn fork_for(&self, principal: &str, set: Set) -> Option<Helper> {
        let fork = self
            .inner
            .forks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&set)
            .cloned()?;
        let template = self.principal_template(principal, set, &fork)?;
        template.touch();
        if let Some(helper) = template.take() {
            self.inner.wake.notify_waiters();
            return Some(helper);
        }
        let template = template.zygote.get()?;
        let forked = fork
            .runner
            .prepare_forked(ids::new_id(), fork.limits, fork.tools, &template, false)
            .await;
        match forked {
            Ok(mut helper) => {
                helper.set_hash_seed(template.seed);
                Some(helper)
            }
            Err(e) => {
                tracing::warn!(?set, error = %e, "could not fork a sandbox on demand");
                None
            }
        }
    }

    /// `principal`'s template of `set`: the one alive, else one started now (not yet
    /// ready), else None when `zygote_templates` are alive already.
    fn principal_template(&self, principal: &str, set: Set, fork: &ForkFrom) -> Option<Arc<PrincipalTemplate>> {
        let templates = &self.inner.templates;
        let mut alive = templates.alive.lock().unwrap_or_else(|p| p.into_inner());
        let key = (principal.to_owned(), set);
        if let Some(template) = alive.get(&key) {
            return Some(template.clone());
        }
        if alive.len() >= templates.max || *self.inner.shutdown.borrow() {
            tracing::debug!(?set, "no room for another template: the run is not forked");
            return None;
        }
        let (stop, stopped) = watch::channel(false);
        let template = Arc::new(PrincipalTemplate {
            zygote: Arc::new(Zygote::default()),
            ready: Mutex::new(Vec::new()),
            last_used: Mutex::new(tokio::time::Instant::now()),
            stop,
        });
        let keeper = Keeper {
            zygote: template.zygote.clone(),
            pool: self.clone(),
            runner: fork.runner.clone(),
            launch: fork.launch.clone(),
            limits: fork.template_limits.clone(),
            stopped: stopped.clone(),
        };
        tokio::spawn(keeper.run(self.inner.shutdown.clone()));
        tokio::spawn(self.clone().fork_ahead(template.clone(), fork.clone(), stopped));
        alive.insert(key, template.clone());
        Some(template)
    }

    /// Keeps `FORKED_AHEAD` sandboxes forked from `template` while it is ready, until
    /// it is stopped or the server shuts down; then reclaims the ones left.
    async fn fork_ahead(self, template: Arc<PrincipalTemplate>, fork: ForkFrom, mut stopped: watch::Receiver<bool>) {
        let mut shutdown = self.inner.shutdown.clone();
        while !*shutdown.borrow() && !*stopped.borrow() {
            let have = template.ready.lock().unwrap_or_else(|p| p.into_inner()).len();
            let ready = template.zygote.get().filter(|_| have < FORKED_AHEAD);
            let Some(ready) = ready else {
                let woken = self.inner.wake.notified();
                tokio::select! {
                    _ = woken => {}
                    _ = shutdown.changed() => {}
                    _ = stopped.changed() => {}
                    // Notifications can be missed between the check and the wait.
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
                continue;
            };
            let forked = fork
                .runner
                .prepare_forked(ids::new_id(), fork.limits.clone(), fork.tools.clone(), &ready, true)
                .await;
            match forked {
                Ok(mut helper) => {
                    helper.set_hash_seed(ready.seed);
                    template.ready.lock().unwrap_or_else(|p| p.into_inner()).push(helper);
                }
                Err(e) => {
                    // The template may have just exited: its keeper builds another.
                    tracing::warn!(error = %e, "could not fork a sandbox ahead");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        let left: Vec<Helper> = std::mem::take(&mut *template.ready.lock().unwrap_or_else(|p| p.into_inner()));
        for mut helper in left {
            helper.abort();
            helper.wait().await;
        }
    }

    /// Stops the templates no run has used for `zygote_template_idle_s` (the runs
    /// forked from one live on), until the server shuts down.
    async fn evict_idle_templates(self, mut shutdown: watch::Receiver<bool>) {
        let templates = &self.inner.templates;
        let every = (templates.idle / 4).clamp(Duration::from_millis(250), Duration::from_secs(5));
        while !*shutdown.borrow() {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.changed() => {}
            }
            let now = tokio::time::Instant::now();
            let mut alive = templates.alive.lock().unwrap_or_else(|p| p.into_inner());
            alive.retain(|(_, set), template| {
                let keep = now.duration_since(template.idle_since()) < templates.idle;
                if !keep {
                    tracing::debug!(?set, "stopping an idle template");
                    let _ = template.stop.send(true);
                }
                keep
            });
        }
    }

    /// The set a run of `code` in `language` takes its sandbox from.
    fn set_for(&self, language: Language, code: &str) -> Set {
        let preloaded = language == Language::Python
            && !self.inner.preloaded_packages.is_empty()
            && imports_any(code, &self.inner.preloaded_packages);
        Set { language, preloaded }
    }

    /// Warm sandboxes ready now, by set: language, preloaded, how many (empty sets too).
    pub fn idle_by_set(&self) -> Vec<(Language, bool, usize)> {
        self.ready()
            .iter()
            .map(|(set, ready)| (set.language, set.preloaded, ready.len()))
            .collect()
    }

    /// Warm sandboxes ready now, all sets together.
    pub fn idle(&self) -> usize {
        self.ready().values().map(Vec::len).sum()
    }
}

/// Whether Python `code` has an `import` or `from` statement, at any indentation, that
/// names one of `packages` (or a module inside one). A routing hint, not a parser: code
/// that imports another way (`__import__`, `importlib`) takes a plain sandbox and pays
/// for its import, as a cold run would.
fn imports_any(code: &str, packages: &[String]) -> bool {
    let names_one = |module: &str| {
        let package = module.trim().split(['.', ' ']).next().unwrap_or_default();
        packages.iter().any(|p| p == package)
    };
    code.lines().flat_map(|line| line.split(';')).any(|statement| {
        let statement = statement.trim_start();
        if let Some(rest) = statement.strip_prefix("import ") {
            rest.split(',').any(names_one)
        } else if let Some(rest) = statement.strip_prefix("from ") {
            names_one(rest)
        } else {
            false
        }
    })
}

/// A set's template ("zygote"), while it is ready to fork.
#[derive(Default)]
struct Zygote {
    /// The template, while it is ready; None while it is being (re)built.
    ready: Mutex<Option<Template>>,
}

impl Zygote {
    fn get(&self) -> Option<Template> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, ready: Option<Template>) {
        *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = ready;
    }
}

/// What each run forked from a template may leave charged to the template's cgroup:
/// pages the template (and on cgroup v1 the run's first process, before the run's
/// helper has moved it into the run's cgroup) write after a fork are copied, and the run
/// keeps the originals, which stay charged to the template for the run's life. Measured: about
/// 0.4 MiB per paused session (docs/benchmarks.md, the zygote notes).
const TEMPLATE_MEMORY_PER_RUN: u64 = 1 << 20;

/// A template's limits: a run's, with room in its memory limit for what every run that
/// can be alive at once leaves charged to it (`TEMPLATE_MEMORY_PER_RUN`): paused
/// sessions, runs under way, and the warm sandboxes. Without it, the template's cgroup
/// filled up with a few hundred paused sessions and the template was killed.
fn template_limits(limits: &Limits, config: &Config) -> Limits {
    let live = config.sessions.max_sessions
        + config.limits.max_concurrent_runs
        + config.languages.warm_pool_size
        + config.languages.warm_preload_pool_size;
    let mut limits = limits.clone();
    limits.memory_bytes = limits
        .memory_bytes
        .saturating_add(TEMPLATE_MEMORY_PER_RUN.saturating_mul(live as u64));
    limits
}

/// Keeps a principal's template of a set running: builds it, and builds a new one
/// whenever it exits, until it is evicted (`stopped`) or the server shuts down. Runs
/// already forked from a template that exits live on (its helper waits for them).
struct Keeper {
    zygote: Arc<Zygote>,
    pool: Pool,
    runner: Runner,
    launch: Launch,
    limits: Limits,
    stopped: watch::Receiver<bool>,
}

impl Keeper {
    fn stop(&self, shutdown: &watch::Receiver<bool>) -> bool {
        *shutdown.borrow() || *self.stopped.borrow()
    }

    async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        while !self.stop(&shutdown) {
            let id = ids::new_id();
            let socket = self.runner.settings().runs_dir.join(format!("zygote-{id}.sock"));
            // One hash seed per template, shared by the runs it forks: all of one
            // principal's (the threat model says why that is safe), and journaled by
            // programmatic sessions.
            let seed = rand::random::<u32>();
            let mut launch = self.launch.clone();
            launch.env.push(("PYTHONHASHSEED".into(), seed.to_string()));
            let started = self
                .runner
                .prepare_template(id.clone(), self.limits.clone(), launch, socket.clone())
                .await;
            let mut helper = match started {
                Ok(helper) => helper,
                Err(e) => {
                    tracing::warn!(error = %e, "could not start a Python template");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = shutdown.changed() => {}
                        _ = self.stopped.changed() => {}
                    }
                    continue;
                }
            };
            if self.stop(&shutdown) {
                helper.abort();
                helper.wait().await;
                break;
            }
            self.zygote.set(Some(Template {
                id,
                socket: socket.clone(),
                seed,
            }));
            self.pool.inner.wake.notify_waiters();
            tokio::select! {
                event = helper.next_event() => {
                    // The template exited: its helper stays until the runs it forked
                    // have ended, and is reaped in the background.
                    self.zygote.set(None);
                    tracing::warn!(?event, "the Python template exited; building a new one");
                    tokio::spawn(helper.linger());
                }
                _ = shutdown.changed() => {
                    self.zygote.set(None);
                    helper.abort();
                    helper.wait().await;
                }
                _ = self.stopped.changed() => {
                    // Evicted: the template exits, and the runs forked from it live on.
                    self.zygote.set(None);
                    retire(helper, &socket).await;
                }
            }
        }
        self.zygote.set(None);
    }
}

/// Ends an idle template without ending the runs forked from it: asks it to exit (on
/// its listening socket; `zygote.py`), then leaves its helper to wait for those runs.
/// A template that cannot be asked is aborted, with whatever it forked.
async fn retire(mut helper: Helper, socket: &std::path::Path) {
    let asked = async {
        use tokio::io::AsyncWriteExt;
        let mut conn = tokio::net::UnixStream::connect(socket).await?;
        conn.write_all(b"exit\n").await
    };
    match tokio::time::timeout(Duration::from_secs(5), asked).await {
        Ok(Ok(())) => {
            let exited = tokio::time::timeout(Duration::from_secs(10), helper.next_event()).await;
            if exited.is_ok() {
                tokio::spawn(helper.linger());
                return;
            }
            tracing::warn!("an idle template did not exit when asked; aborting it");
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "could not ask an idle template to exit; aborting it"),
        Err(_) => tracing::warn!("could not ask an idle template to exit in time; aborting it"),
    }
    helper.abort();
    helper.wait().await;
}

/// Keeps a warm set full of sandboxes built the usual way.
#[derive(Clone)]
struct Refill {
    pool: Pool,
    runner: Runner,
    set: Set,
    size: usize,
    launch: Launch,
    limits: Limits,
    tools: ToolChannel,
}

/// How many of a set's warm sandboxes are built at once. In the namespace tier one
/// takes a few milliseconds, and one at a time keeps up with any client. A gVisor
/// sandbox's start is as much waiting as work (its `runsc` processes start one another:
/// about 260 ms of wall time for 124 ms of CPU, docs/isolation.md), so that tier builds
/// two at once: one at a time, a single client running code 50 ms apart used up the
/// pool and a third of its runs started cold (docs/benchmarks.md).
fn builds_at_once(runner: &Runner) -> usize {
    if runner.settings().gvisor.is_some() {
        2
    } else {
        1
    }
}

impl Refill {
    async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let at_once = builds_at_once(&self.runner);
        let mut building = tokio::task::JoinSet::new();
        while !*shutdown.borrow() {
            while building.try_join_next().is_some() {}
            let have = self.pool.ready().get(&self.set).map_or(0, Vec::len);
            if have + building.len() >= self.size || building.len() >= at_once {
                let woken = self.pool.inner.wake.notified();
                tokio::select! {
                    _ = woken => {}
                    Some(_) = building.join_next(), if !building.is_empty() => {}
                    _ = shutdown.changed() => {}
                    // Notifications can be missed between the check and the wait.
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
                continue;
            }
            building.spawn(self.clone().build());
        }
        // Shutting down: the builds under way end, then every idle sandbox is reclaimed.
        while building.join_next().await.is_some() {}
        let idle: Vec<Helper> = self.pool.ready().remove(&self.set).unwrap_or_default();
        for mut helper in idle {
            helper.abort();
            helper.wait().await;
        }
    }

    /// Builds one warm sandbox into the set. A failed build keeps its place among the
    /// builds under way for a second, so that a broken runtime is not retried at once.
    async fn build(self) {
        // Each warm Python program gets a hash seed of its own, as random as Python's
        // own, but known: a programmatic session's replay uses it again.
        let mut launch = self.launch.clone();
        let hash_seed = (self.set.language == Language::Python).then(rand::random::<u32>);
        if let Some(seed) = hash_seed {
            launch.env.push(("PYTHONHASHSEED".into(), seed.to_string()));
        }
        let prepared = self
            .runner
            .prepare_warm(ids::new_id(), self.limits.clone(), launch, self.tools.clone())
            .await;
        match prepared {
            Ok(mut helper) => {
                if let Some(seed) = hash_seed {
                    helper.set_hash_seed(seed);
                }
                self.pool.ready().entry(self.set).or_default().push(helper)
            }
            Err(e) => {
                tracing::warn!(set = ?self.set, error = %e, "could not prepare a warm sandbox");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{imports_any, template_limits, TEMPLATE_MEMORY_PER_RUN};
    use sandcall_config::Config;
    use sandcall_sandbox::protocol::Limits;

    #[test]
    fn a_template_has_room_for_what_its_live_runs_leave_charged_to_it() {
        let config = Config {
            sessions: sandcall_config::SessionsConfig {
                max_sessions: 100,
                ..Default::default()
            },
            limits: sandcall_config::LimitsConfig {
                max_concurrent_runs: 8,
                ..Default::default()
            },
            languages: sandcall_config::LanguagesConfig {
                warm_pool_size: 2,
                warm_preload_pool_size: 1,
                ..Default::default()
            },
            ..Config::default()
        };
        let limits = Limits {
            memory_bytes: 512 << 20,
            max_processes: 128,
            max_open_files: 1024,
            file_size_bytes: 1 << 20,
            workspace_bytes: 1 << 20,
            tmp_bytes: 1 << 20,
            cpu_time_ms: 1000,
            cpus: 1.0,
            max_output_bytes: 1024,
        };
        let template = template_limits(&limits, &config);
        assert_eq!(template.memory_bytes, (512 << 20) + 111 * TEMPLATE_MEMORY_PER_RUN);
        // Nothing else changes.
        assert_eq!(
            Limits {
                memory_bytes: limits.memory_bytes,
                ..template
            },
            limits
        );
    }

    #[test]
    fn imports_of_the_preloaded_packages_are_found() {
        let packages = ["numpy".to_owned(), "pandas".to_owned(), "matplotlib".to_owned()];
        for code in [
            "import pandas as pd",
            "import os, numpy as np",
            "import matplotlib.pyplot as plt",
            "from matplotlib import pyplot",
            "from pandas.api import types",
            "x = 1; import numpy",
            "def f():\n    import numpy\n    return numpy.pi",
            "import sys\nprint('pandas' in sys.modules)\nimport pandas",
        ] {
            assert!(imports_any(code, &packages), "{code:?}");
        }
        for code in [
            "print(1)",
            "import os, sys",
            "import numpyx",
            "from numbers import Number",
            "# import pandas",
            "s = 'import pandas'",
            "__import__('pandas')",
            "import",
        ] {
            assert!(!imports_any(code, &packages), "{code:?}");
        }
    }
}
