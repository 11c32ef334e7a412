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
        let preload = config.warm_pool_size > 0
            && config.warm_preload_pool_size > 0
            && !config.warm_preload.is_empty()
            && crate::python_runtime::in_use(&config).is_some();
        let mut preloaded_packages: Vec<String> = Vec::new();
        if preload {
            for module in &config.warm_preload {
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
            }),
        };
        if config.warm_pool_size == 0 {
            return pool;
        }
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
            let mut sets = vec![(false, config.warm_pool_size, env.clone())];
            if language == Language::Python && preload {
                // These import the heavy modules while they wait (runner.py), so a
                // run's `import pandas` costs nothing.
                env.push(("SANDCALL_PRELOAD".into(), config.warm_preload.join(",")));
                sets.push((true, config.warm_preload_pool_size, env));
            }
            for (preloaded, size, env) in sets {
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
        let preloaded = language == Language::Python
            && !self.inner.preloaded_packages.is_empty()
            && imports_any(code, &self.inner.preloaded_packages);
        let helper = self.ready().get_mut(&Set { language, preloaded }).and_then(Vec::pop);
        self.inner.wake.notify_waiters();
        helper
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

struct Refill {
    pool: Pool,
    runner: Runner,
    set: Set,
    size: usize,
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
            let have = self.pool.ready().get(&self.set).map_or(0, Vec::len);
            if have >= self.size {
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
        // Shutting down: every idle sandbox is reclaimed.
        let idle: Vec<Helper> = self.pool.ready().remove(&self.set).unwrap_or_default();
        for mut helper in idle {
            helper.abort();
            helper.wait().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::imports_any;

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
