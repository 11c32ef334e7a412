//! What a run needs of an isolation tier, and what a programmatic session's driver needs
//! of one running sandbox (`HelperChannel`). Sessions reach sandboxes only through
//! these, so that another tier can stand behind them without touching sessions, files
//! or HTTP, and so that tests can drive a session with a scripted sandbox.

use crate::runner::RunError;
use async_trait::async_trait;
use sandcall_sandbox::protocol::{Command, Event};

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
