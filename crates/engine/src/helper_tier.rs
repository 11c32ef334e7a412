//! Both isolation tiers, as the seam (`isolation`) sees them: a sandbox is a `sandcall
//! sandbox-helper` process (`runner::Runner`), warm ones from the pool (`pool::Pool`).
//! Where the helper runs is the runner's business: on the host (`namespace`) or in a
//! gVisor sandbox of its own (`gvisor`, `crate::gvisor`). The helper's handle is both a
//! warm sandbox and a running one.

use crate::isolation::{HelperChannel, IsolationTier, WarmSandbox};
use crate::pool::Pool;
use crate::run::{RunError, RunSpec};
use crate::runner::{Helper, Runner};
use async_trait::async_trait;
use sandcall_api::Language;
use sandcall_sandbox::protocol::{Command, Event, RunResult};

/// A tier whose sandboxes are sandbox helpers (`runner::Runner`), warm ones from the
/// pool (`pool::Pool`).
#[derive(Clone)]
pub struct HelperTier {
    runner: Runner,
    pool: Pool,
}

impl HelperTier {
    pub fn new(runner: Runner, pool: Pool) -> HelperTier {
        HelperTier { runner, pool }
    }
}

#[async_trait]
impl IsolationTier for HelperTier {
    async fn take_warm(&self, principal: &str, language: Language, code: &str) -> Option<Box<dyn WarmSandbox>> {
        let helper = self.pool.take_or_fork(principal, language, code).await?;
        Some(Box::new(helper))
    }

    async fn start(&self, spec: RunSpec) -> Result<Box<dyn HelperChannel>, RunError> {
        Ok(Box::new(self.runner.start(spec).await?))
    }

    async fn run(
        &self,
        warm: Option<Box<dyn WarmSandbox>>,
        spec: RunSpec,
        hold: Box<dyn std::any::Any + Send>,
    ) -> Result<RunResult, RunError> {
        match warm {
            Some(warm) => self.runner.run_started(warm.begin(spec), hold).await,
            None => self.runner.run(spec, hold).await,
        }
    }

    fn failing(&self) -> Option<String> {
        self.runner.failing()
    }

    fn record_failure(&self, error: &RunError) {
        self.runner.record_failure(error);
    }
}

#[async_trait]
impl WarmSandbox for Helper {
    fn run_id(&self) -> &str {
        Helper::run_id(self)
    }

    fn hash_seed(&self) -> Option<u32> {
        Helper::hash_seed(self)
    }

    async fn begin(self: Box<Self>, spec: RunSpec) -> Result<Box<dyn HelperChannel>, RunError> {
        Ok(Box::new(Helper::begin(*self, spec).await?))
    }

    fn discard(self: Box<Self>) {
        let mut helper = *self;
        helper.abort();
        tokio::spawn(helper.wait());
    }
}

#[async_trait]
impl HelperChannel for Helper {
    fn run_id(&self) -> &str {
        Helper::run_id(self)
    }

    fn hash_seed(&self) -> Option<u32> {
        Helper::hash_seed(self)
    }

    async fn next_event(&mut self) -> Result<Event, RunError> {
        Helper::next_event(self).await
    }

    async fn send(&mut self, command: &Command) -> Result<(), RunError> {
        Helper::send(self, command).await
    }

    fn abort(&mut self) {
        Helper::abort(self);
    }

    fn aborted(&self) -> bool {
        Helper::aborted(self)
    }

    async fn wait(&mut self) {
        self.wait_in_place().await;
    }
}
