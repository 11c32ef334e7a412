//! What a run needs of an isolation tier, and what a programmatic session's driver needs
//! of one running sandbox (`HelperChannel`). Sessions reach sandboxes only through
//! these, so that another tier can stand behind them without touching sessions, files
//! or HTTP, and so that tests can drive a session with a scripted sandbox.

use crate::error::EngineError;
use crate::run::{RunError, RunSpec};
use async_trait::async_trait;
use sandcall_api::Language;
use sandcall_config::Isolation;
use sandcall_sandbox::protocol::{Command, Event, RunResult};
use std::sync::Arc;

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
    /// A warm sandbox for `principal`'s run of `code` in `language`, ready or made now
    /// (a forked one only from that principal's own template); None when there is none
    /// to be had (the run takes the cold path).
    async fn take_warm(&self, principal: &str, language: Language, code: &str) -> Option<Box<dyn WarmSandbox>>;

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

/// The isolation tiers a server has (docs/isolation.md), and which one a run gets: its
/// principal's (`sandcall_auth::Auth::isolation`), or a stronger one its request asks for.
#[derive(Clone, Default)]
pub struct Tiers {
    namespace: Option<Arc<dyn IsolationTier>>,
    gvisor: Option<Arc<dyn IsolationTier>>,
}

impl Tiers {
    /// A server with no tier yet; `with` adds them.
    pub fn new() -> Tiers {
        Tiers::default()
    }

    pub fn with(mut self, isolation: Isolation, tier: Arc<dyn IsolationTier>) -> Tiers {
        match isolation {
            Isolation::Namespace => self.namespace = Some(tier),
            Isolation::Gvisor => self.gvisor = Some(tier),
        }
        self
    }

    pub fn get(&self, isolation: Isolation) -> Option<&Arc<dyn IsolationTier>> {
        match isolation {
            Isolation::Namespace => self.namespace.as_ref(),
            Isolation::Gvisor => self.gvisor.as_ref(),
        }
    }

    /// The tiers this server has, weakest first.
    pub fn present(&self) -> impl Iterator<Item = (Isolation, &Arc<dyn IsolationTier>)> {
        Isolation::ALL.into_iter().filter_map(|i| self.get(i).map(|t| (i, t)))
    }

    /// The tier of a run whose principal's tier is `principal` and whose request asked
    /// for `requested`: the stronger of the two. A request for a weaker tier is refused,
    /// and so is one for a tier this server lacks.
    pub fn pick(
        &self,
        principal: Isolation,
        requested: Option<Isolation>,
    ) -> Result<(Isolation, Arc<dyn IsolationTier>), EngineError> {
        if let Some(asked) = requested.filter(|asked| *asked < principal) {
            return Err(EngineError::bad_request(format!(
                "`isolation` \"{}\" is weaker than this caller's tier, \"{}\": a request may ask for a \
                 stronger tier, never a weaker one",
                asked.name(),
                principal.name()
            )));
        }
        let chosen = requested.unwrap_or(principal).max(principal);
        match self.get(chosen) {
            Some(tier) => Ok((chosen, tier.clone())),
            None => Err(EngineError {
                code: Some(sandcall_api::error_code::UNSUPPORTED_CAPABILITY),
                ..EngineError::bad_request(format!(
                    "this server has no \"{}\" isolation tier (docs/isolation.md); retrying will not work",
                    chosen.name()
                ))
            }),
        }
    }

    /// Why some tier cannot build sandboxes now, since its last failure; None when all can.
    pub fn failing(&self) -> Option<String> {
        self.present().find_map(|(_, t)| t.failing())
    }
}

/// A request's `isolation` field: a tier's name, or absent.
pub fn parse_isolation(field: Option<&str>) -> Result<Option<Isolation>, EngineError> {
    field
        .map(|name| {
            Isolation::parse(name).ok_or_else(|| {
                EngineError::bad_request(format!("`isolation` must be \"namespace\" or \"gvisor\", not {name:?}"))
            })
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    /// A tier that is never asked for a sandbox: `pick` only chooses.
    struct Unused;

    #[async_trait]
    impl IsolationTier for Unused {
        async fn take_warm(&self, _: &str, _: Language, _: &str) -> Option<Box<dyn WarmSandbox>> {
            None
        }
        async fn start(&self, _: RunSpec) -> Result<Box<dyn HelperChannel>, RunError> {
            Err(RunError::Protocol("unused".into()))
        }
        async fn run(
            &self,
            _: Option<Box<dyn WarmSandbox>>,
            _: RunSpec,
            _: Box<dyn std::any::Any + Send>,
        ) -> Result<RunResult, RunError> {
            Err(RunError::Protocol("unused".into()))
        }
        fn failing(&self) -> Option<String> {
            None
        }
        fn record_failure(&self, _: &RunError) {}
    }

    #[test]
    fn a_run_gets_its_principals_tier_or_a_stronger_one_it_asks_for() {
        use Isolation::{Gvisor, Namespace};
        let both = Tiers::new()
            .with(Namespace, Arc::new(Unused))
            .with(Gvisor, Arc::new(Unused));
        let chosen = |p, r| {
            both.pick(p, r)
                .map(|(i, _)| i)
                .map_err(|e| (e.kind, e.error_type, e.code))
        };
        assert_eq!(chosen(Namespace, None), Ok(Namespace));
        assert_eq!(chosen(Namespace, Some(Gvisor)), Ok(Gvisor));
        assert_eq!(chosen(Gvisor, None), Ok(Gvisor));
        assert_eq!(chosen(Gvisor, Some(Gvisor)), Ok(Gvisor));
        let weaker = both.pick(Gvisor, Some(Namespace)).err().unwrap();
        assert_eq!(
            (weaker.kind, weaker.error_type, weaker.code),
            (ErrorKind::Invalid, "invalid_request", None)
        );
        assert!(weaker.message.contains("weaker"), "{}", weaker.message);

        let namespace_only = Tiers::new().with(Namespace, Arc::new(Unused));
        let missing = namespace_only.pick(Namespace, Some(Gvisor)).err().unwrap();
        assert_eq!(missing.kind, ErrorKind::Invalid);
        assert_eq!(missing.code, Some("unsupported_capability"));
        assert!(namespace_only.pick(Namespace, None).is_ok());
    }

    #[test]
    fn a_requests_isolation_names_a_tier() {
        assert_eq!(parse_isolation(None).unwrap(), None);
        assert_eq!(parse_isolation(Some("gVisor")).unwrap(), Some(Isolation::Gvisor));
        assert_eq!(parse_isolation(Some("namespace")).unwrap(), Some(Isolation::Namespace));
        assert!(parse_isolation(Some("vm")).unwrap_err().message.contains("\"vm\""));
    }
}
