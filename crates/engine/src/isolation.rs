//! What a run needs of an isolation tier, and what a programmatic session's driver needs
//! of one running sandbox (`HelperChannel`). Sessions reach sandboxes only through
//! these, so that another tier can stand behind them without touching sessions, files
//! or HTTP, and so that tests can drive a session with a scripted sandbox.

use crate::run::{RunError, RunSpec};
use async_trait::async_trait;
use sandcall_api::Language;
use sandcall_sandbox::protocol::{Command, Event, RunResult};

/// The session driver's view of one running sandbox: the program's events, and the
/// commands (tool replies) it takes.
#[async_trait]
pub trait HelperChannel: Send {
    /// Names the sandbox (its cgroup and staging directory); a warm sandbox's run takes
    /// it as its session id.
    fn run_id(&self) -> &str;

    /// The `PYTHONHASHSEED` a warm program started with, if any.
    fn hash_seed(&self) -> Option<u32>;

    /// The next event. Must be cancel-safe: the driver selects on it with its timers,
    /// and an event whose read a timer interrupted comes with the next call.
    async fn next_event(&mut self) -> Result<Event, RunError>;

    /// Sends a command (a tool call's reply) to the sandbox; never waits on the program.
    async fn send(&mut self, command: &Command) -> Result<(), RunError>;

    /// Tells the sandbox to kill the program and reclaim itself; a `Finished` event (with
    /// `aborted`) follows.
    fn abort(&mut self);

    /// Whether `abort` was called.
    fn aborted(&self) -> bool;

    /// Aborts if not done already, and waits until the sandbox is gone (its slots may be
    /// given back only then).
    async fn wait(&mut self);
}

/// A sandbox built ahead of its run (a warm one), its program waiting to begin.
#[async_trait]
pub trait WarmSandbox: Send {
    /// Names the sandbox; the run takes it as its id.
    fn run_id(&self) -> &str;

    /// The `PYTHONHASHSEED` its program started with, if it was set: a programmatic
    /// session journals it, so that its replay hashes alike.
    fn hash_seed(&self) -> Option<u32>;

    /// Starts the run's program in it (`spec.go` says how); on failure the sandbox is
    /// reclaimed.
    async fn begin(self: Box<Self>, spec: RunSpec) -> Result<Box<dyn HelperChannel>, RunError>;

    /// Gives it up unused: it is reclaimed in the background.
    fn discard(self: Box<Self>);
}

/// What a run needs of an isolation tier: a warm sandbox when one is ready, a fresh one
/// otherwise, the running sandbox's events and tool channel (`HelperChannel`), its end
/// and usage (the `RunResult` of its `Finished` event), and the tier's health.
#[async_trait]
pub trait IsolationTier: Send + Sync {
    /// A warm sandbox for a run of `code` in `language`, ready or made now; None when
    /// there is none to be had (the run takes the cold path).
    async fn take_warm(&self, language: Language, code: &str) -> Option<Box<dyn WarmSandbox>>;

    /// Builds a sandbox and starts `spec`'s program in it; the caller drives the rest.
    async fn start(&self, spec: RunSpec) -> Result<Box<dyn HelperChannel>, RunError>;

    /// Runs `spec` to its end (a run with no tools: `/v1/exec`), in `warm` when given
    /// (`spec.go` starts its program), in a task of its own that keeps `hold` until the
    /// sandbox is done; the `RunResult` says how it ended and what it used. The sandbox
    /// is cleaned up (reclaimed) whatever happens to the caller.
    async fn run(
        &self,
        warm: Option<Box<dyn WarmSandbox>>,
        spec: RunSpec,
        hold: Box<dyn std::any::Any + Send>,
    ) -> Result<RunResult, RunError>;

    /// Why sandboxes cannot be built now, since the last failure; None when they can.
    fn failing(&self) -> Option<String>;

    /// Notes a sandbox that failed, for the health route.
    fn record_failure(&self, error: &RunError);
}
