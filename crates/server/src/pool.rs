//! Warm sandboxes: built, with their interpreter already started and waiting, before a
//! request arrives. Each is used once and replaced in the background, so no state of
//! one run can reach another; a request that finds the pool empty (a burst) or asks for
//! limits other than the defaults takes the cold path instead.

use crate::config::Config;
use crate::ids;
use crate::runner::{Helper, Runner};
use crate::runtime;
use sandcall_api::Language;
use sandcall_sandbox::protocol::{Launch, Limits, ToolChannel};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};

#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    ready: Mutex<HashMap<Language, Vec<Helper>>>,
    wake: Notify,
    size: usize,
}

impl Pool {
    /// Starts one refill task per language; `size` sandboxes are kept ready for each.
    pub fn start(
        runner: Runner,
        config: Arc<Config>,
        limits: Limits,
        tools: ToolChannel,
        shutdown: watch::Receiver<bool>,
    ) -> Pool {
        let size = config.warm_pool_size;
        let pool = Pool {
            inner: Arc::new(Inner {
                ready: Mutex::new(HashMap::new()),
                wake: Notify::new(),
                size,
            }),
        };
        if size > 0 {
            // One warm set per declared language that has a warm launcher and whose
            // toolchain is installed.
            let wanted: Vec<Language> = config
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
                let mut wait_ready = false;
                // On the managed runtime, warm Python sandboxes import the heavy modules
                // while they wait (runner.py), so a run's `import pandas` costs nothing.
                if language == Language::Python
                    && !config.warm_preload.is_empty()
                    && crate::python_runtime::in_use(&config).is_some()
                {
                    env.push(("SANDCALL_PRELOAD".into(), config.warm_preload.join(",")));
                    // Handed out only once they are imported (runner.py says `ready`).
                    wait_ready = true;
                }
                let fill = Refill {
                    pool: pool.clone(),
                    runner: runner.clone(),
                    language,
                    launch: Launch { argv, env, wait_ready },
                    limits: limits.clone(),
                    tools: tools.clone(),
                };
                tokio::spawn(fill.run(shutdown.clone()));
            }
        }
        pool
    }

    fn ready(&self) -> std::sync::MutexGuard<'_, HashMap<Language, Vec<Helper>>> {
        self.inner.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A warm sandbox for `language`, if one is ready. It is the caller's now.
    pub fn take(&self, language: Language) -> Option<Helper> {
        let helper = self.ready().get_mut(&language).and_then(Vec::pop);
        self.inner.wake.notify_waiters();
        helper
    }

    /// Warm sandboxes ready now, all languages together.
    pub fn idle(&self) -> usize {
        self.ready().values().map(Vec::len).sum()
    }
}

struct Refill {
    pool: Pool,
    runner: Runner,
    language: Language,
    launch: Launch,
    limits: Limits,
    tools: ToolChannel,
}

impl Refill {
    async fn run(self, mut shutdown: watch::Receiver<bool>) {
        loop {
            if *shutdown.borrow() {
                break;
            }
            let have = self.pool.ready().get(&self.language).map_or(0, Vec::len);
            if have >= self.pool.inner.size {
                let woken = self.pool.inner.wake.notified();
                tokio::select! {
                    _ = woken => {}
                    _ = shutdown.changed() => {}
                    // Notifications can be missed between the check and the wait.
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
                continue;
            }
            // Each warm Python program gets a hash seed of its own, as random as
            // Python's own, but known: a programmatic session's replay uses it again.
            let mut launch = self.launch.clone();
            let hash_seed = (self.language == Language::Python).then(rand::random::<u32>);
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
                    self.pool.ready().entry(self.language).or_default().push(helper)
                }
                Err(e) => {
                    tracing::warn!(language = ?self.language, error = %e, "could not prepare a warm sandbox");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        // Shutting down: every idle sandbox is reclaimed.
        let idle: Vec<Helper> = self.pool.ready().remove(&self.language).unwrap_or_default();
        for mut helper in idle {
            helper.abort();
            helper.wait().await;
        }
    }
}
