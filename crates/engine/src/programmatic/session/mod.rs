//! Programmatic sessions: the pause/resume state machine, the driver task that owns a
//! session's sandbox, and the registry the routes look sessions up in.
//!
//! ```text
//! start ──> Running ──(program blocks on calls)──> Paused{pause n} ──(resume, token n)──> Running ...
//!             │                                      │  tool_call_timeout: TimeoutError in the program ──> Running
//!             │                                      │  session_expiry ──> Expired (404 at once) ──> gone
//!             │                                      │  loop_timeout ──> Ending (a resume waits) ──> Done
//!             └──(program ends / timeout / cancel)──> Done
//! Paused{n} ──(idle for session_idle_evict_s, or shutdown)──> Paused{n}, dormant (sandbox freed;
//!             journalled) ──(resume with token n, or tool_call_timeout)──> Running, by replay
//! ```
//! Every step is journalled in the `SessionStore` before the answer that depends on it
//! goes out; a session whose process is gone is brought back by replaying its journal.
//! A token names a pause; it is good while the session sits in exactly that pause, and
//! the check and the move to Running happen under one lock: of two concurrent resumes
//! with one token, one wins and the other gets 409.

use super::token::TokenKey;
use super::tools::{ByteBudget, Checked, ToolSet, CHECK_TIME_BUDGET};
use crate::admission::{Admission, Held, PerPrincipal, Slot};
use crate::error::EngineError;
use crate::error::ErrorKind;
use crate::files::{now_ms, ops, FileStore};
use crate::isolation::{IsolationTier, Tiers};
use crate::runner::{RunError, RunSpec};
use bytes::Bytes;
use sandcall_api::ids;
use sandcall_api::{error_type, ProgrammaticResponse, ToolArguments, ToolCall, ToolResult};
use sandcall_auth::Principal;
use sandcall_config::{Config, Isolation};
use sandcall_sandbox::protocol::{Command, Event, RunResult, ToolReply};
use sandcall_store::{JournalEntry, SessionStart, SessionState, SessionStore};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

mod dormancy;
mod driver;
mod held;
mod ownership;
mod registry;
mod replay;
mod state;
#[cfg(test)]
mod tests;

use dormancy::*;
use driver::*;
use held::*;
use registry::*;
use replay::*;
use state::*;

pub struct Session {
    id: String,
    /// Only this principal may see or touch the session.
    principal: String,
    /// The latest `X-LibreChat-Code-Request-ID` of a request about the session (its start
    /// or a resume), by which cancel may name it. One per session: the registry holds
    /// no more request ids than sessions. `Err(())` once the session left the registry,
    /// so that a request racing its removal cannot leave an entry behind.
    request_id: Mutex<Result<Option<String>, ()>>,
    shared: Mutex<Shared>,
    /// Bumped every time `response` changes to a pause or an end.
    version: watch::Sender<u64>,
    /// To the session's driver; none while the session is dormant.
    commands: Mutex<Option<mpsc::UnboundedSender<DriverCommand>>>,
    /// Every tool call of the session, for `GET .../calls` (`audit`).
    audit: Mutex<super::audit::Audit>,
}

enum DriverCommand {
    /// The caller's results, with the run slot the program runs on from now, the
    /// digest of the results (journalled, for a retry of the resume), and what to go
    /// back to if the store cannot take them.
    Results(Vec<(u64, ToolReply)>, Slot, [u8; 32], Box<Undo>),
    Cancel,
    /// Many nodes: another node took the session over (this node's lease ran out, as
    /// in a Redis outage longer than a lease): this copy ends, and leaves the journal.
    Abandon,
}

/// A pause as it was before a resume moved it on: what the session goes back to when
/// the session store cannot record the resume now (Redis down). The resume then gets
/// `reject`'s 503 and the token stays good.
struct Undo {
    calls: Vec<(String, u64)>,
    response: Published,
    last_resume: Option<LastResume>,
    dormant: Option<u64>,
    reject: oneshot::Sender<EngineError>,
}

impl Session {
    /// Puts the pause back as `undo` has it, and answers its resume 503: the store did
    /// not record the resume, so the token is still good.
    fn undo(&self, pause: u64, undo: Undo, detail: &str) {
        let Undo {
            calls,
            response,
            last_resume,
            dormant,
            reject,
        } = undo;
        {
            let mut shared = self.lock();
            shared.phase = Phase::Paused { pause, calls };
            shared.response = response;
            shared.last_resume = last_resume;
            shared.dormant = dormant;
            if dormant.is_some() {
                self.set_commands(None);
            }
        }
        let _ = reject.send(EngineError::store_unavailable(detail));
        // Retries of the same resume waiting for its answer look again.
        self.version.send_modify(|v| *v += 1);
    }

    fn new(
        id: String,
        principal: String,
        shared: Shared,
        commands: Option<mpsc::UnboundedSender<DriverCommand>>,
    ) -> Session {
        Session {
            id,
            principal,
            request_id: Mutex::new(Ok(None)),
            shared: Mutex::new(shared),
            version: watch::channel(0).0,
            commands: Mutex::new(commands),
            audit: Mutex::new(Default::default()),
        }
    }

    fn audit(&self) -> MutexGuard<'_, super::audit::Audit> {
        self.audit.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The latest request id the session was named by, if any.
    fn request_id(&self) -> Option<String> {
        self.request_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .ok()
            .cloned()
            .flatten()
    }

    fn send(&self, command: DriverCommand) -> bool {
        self.commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|c| c.send(command).is_ok())
    }

    fn set_commands(&self, commands: Option<mpsc::UnboundedSender<DriverCommand>>) {
        *self.commands.lock().unwrap_or_else(|p| p.into_inner()) = commands;
    }

    /// Frees the pause's sandbox, keeping the pause (its token stays good): true unless
    /// the session has left the pause already (a resume got there first).
    fn make_dormant(&self, since_ms: u64) -> bool {
        let mut shared = self.lock();
        if !matches!(shared.phase, Phase::Paused { .. }) || shared.dormant.is_some() {
            return false;
        }
        shared.dormant = Some(since_ms);
        metrics::counter!(crate::telemetry::EVICTIONS).increment(1);
        // The pause's answer (its calls' arguments, its output) is in the store: a dormant
        // session keeps nothing of it in memory.
        shared.response = dormant_placeholder(&self.id);
        if let Some(last) = shared.last_resume.as_mut() {
            last.answer = None;
        }
        self.set_commands(None);
        true
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, phase: Phase, response: ProgrammaticResponse) {
        self.publish_json(phase, response, None);
    }

    /// Publishes `response` with its JSON, when the caller made it already.
    fn publish_json(&self, phase: Phase, response: ProgrammaticResponse, json: Option<Bytes>) {
        let mut shared = self.lock();
        shared.phase = phase;
        if let Some(last) = shared.last_resume.as_mut().filter(|l| l.answer.is_none()) {
            let version = *self.version.borrow() + 1;
            last.answer = Some((
                version,
                Published {
                    response: response.clone(),
                    json: json.clone(),
                },
            ));
        }
        shared.response = Published { response, json };
        self.version.send_modify(|v| *v += 1);
    }

    /// Leaves the pause because a timer ran out, unless a resume got there first.
    fn unpause(&self) -> bool {
        self.leave_pause(Phase::Running)
    }

    /// Leaves the pause for `phase` (running again, ending, or expired), unless a
    /// resume got there first.
    fn leave_pause(&self, phase: Phase) -> bool {
        let mut shared = self.lock();
        if !matches!(shared.phase, Phase::Paused { .. }) {
            return false;
        }
        shared.phase = phase;
        shared.response = ProgrammaticResponse::Running {
            session_id: self.id.clone(),
        }
        .into();
        true
    }

    fn expired(&self) -> bool {
        matches!(self.lock().phase, Phase::Expired)
    }

    fn current(&self) -> ProgrammaticResponse {
        self.lock().response.response.clone()
    }

    /// The current response as JSON, serialized at most once per published response.
    fn current_json(&self) -> Result<Bytes, serde_json::Error> {
        let mut shared = self.lock();
        if let Some(json) = &shared.response.json {
            return Ok(json.clone());
        }
        let mut json = serde_json::to_vec(&shared.response.response)?;
        // It is kept while the session is paused: without the slack of its growth.
        json.shrink_to_fit();
        let json = Bytes::from(json);
        shared.response.json = Some(json.clone());
        Ok(json)
    }

    /// Waits until the session moves past version `seen` (to a pause or an end).
    async fn next_outcome(&self, seen: u64) -> ProgrammaticResponse {
        self.wait_past(seen).await;
        self.current()
    }

    /// The same, as the JSON every request for this outcome shares.
    async fn next_outcome_json(&self, seen: u64) -> Result<Bytes, EngineError> {
        self.wait_past(seen).await;
        self.current_json().map_err(serialize_failed)
    }

    async fn wait_past(&self, seen: u64) {
        let mut rx = self.version.subscribe();
        let _ = rx.wait_for(|v| *v > seen).await;
    }
}

/// How a resume reached its program: the live sandbox's process, or a replay of the
/// journal in a fresh one (the session was dormant). The route says it in the
/// `sandcall-resume` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    Live,
    Replay,
}

impl Served {
    pub fn as_str(self) -> &'static str {
        match self {
            Served::Live => "live",
            Served::Replay => "replay",
        }
    }
}

/// Where a request about a session is to be served (`Sessions::locate`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Located {
    /// On this node: it holds the session, or has just taken it over.
    Here,
    /// On the node at this `node_url`, which holds it live (its lease is good).
    Owner(String),
}

/// Everything a new session needs, validated.
pub struct StartCommand {
    pub spec: RunSpec,
    pub tools: ToolSet,
    pub max_tool_calls: u64,
    pub files: Vec<sandcall_api::FileRef>,
    pub language: sandcall_api::Language,
    pub args: Vec<String>,
    pub custom_limits: bool,
    /// The bound on the whole loop, waits included, if any (`loop_timeout`, or
    /// `timeout` under `programmatic_timeout_scope = "loop"`).
    pub loop_timeout_ms: Option<u64>,
    /// The start's `X-LibreChat-Code-Request-ID`.
    pub request_id: Option<String>,
    /// The request as the session journal keeps it (no resume fields); its
    /// `isolation` becomes the tier the session runs in, so that a replay finds it.
    pub request: sandcall_api::ProgrammaticRequest,
    /// The isolation tier the request asked for (`Tiers::pick` decides).
    pub isolation: Option<sandcall_config::Isolation>,
    /// The caller's workspace the session runs in (`workspaces` on), held to its end.
    pub workspace: Option<String>,
}

#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Inner>,
}

struct Inner {
    /// The sessions this node holds: live ones, ended ones still readable, and a dormant
    /// one only while a request or a timer brings it back (a dormant session is kept in
    /// the store alone: `SessionStore::sleep`). Lock order: a session's `shared`, then
    /// this, never the other way round.
    map: Mutex<HashMap<String, Arc<Session>>>,
    /// (principal, request id) → session id, for cancel by `request_id`. An entry
    /// lives as long as its session is in `map`; the store names dormant sessions (and,
    /// with Redis, every node's sessions).
    requests: Mutex<HashMap<(String, String), String>>,
    key: TokenKey,
    /// Where sessions' sandboxes come from.
    tiers: Tiers,
    config: Arc<Config>,
    slots: Arc<Semaphore>,
    /// Sessions per principal (`max_sessions_per_principal`).
    per_principal: Arc<PerPrincipal>,
    /// Run slots: a session holds one while its program runs, not while it is paused.
    admission: Admission,
    /// Sessions paused now, waiting for their caller.
    paused: std::sync::atomic::AtomicUsize,
    /// Tool-call checks running at once, server-wide: one per core. A check runs on a
    /// blocking thread outside every cgroup, and one that overruns its budget goes on
    /// until it ends, so without this many sessions' checks could starve the server.
    checks: Arc<Semaphore>,
    shutdown: watch::Receiver<bool>,
    files: Arc<dyn FileStore>,
    outbox_dir: PathBuf,
    /// Every session's journal.
    store: Arc<dyn SessionStore>,
    /// The MCP servers whose tools programs may call (`mcp_servers`).
    mcp: crate::mcp_client::McpServers,
    /// With a store that many nodes share: this node's id (its `node_url`), which the
    /// leases name. None on a single node.
    node: Option<String>,
    /// The egress proxy, for sessions granted network.
    egress: Option<crate::egress::Egress>,
    /// How long a lease lasts unless renewed (`node_lease_ms`).
    lease_ms: u64,
    /// Every session's driver task: at shutdown the server waits for them, so that each
    /// paused session is marked dormant and gives its lease up before the process ends.
    drivers: tokio_util::task::TaskTracker,
    /// The audit trails of ended sessions still readable (`max_ended_session_bytes`).
    ended: Mutex<EndedTrails>,
}

/// What sessions run on, shared with the rest of the server.
pub struct Backing {
    /// Where sandboxes come from (`helper_tier::HelperTier`s in the server).
    pub tiers: Tiers,
    pub admission: Admission,
    pub files: Arc<dyn FileStore>,
    /// Where helpers put a run's output files before the store takes them.
    pub outbox_dir: PathBuf,
    /// Where sessions are journalled.
    pub store: Arc<dyn SessionStore>,
    /// This node's `node_url`, when the store is shared by many nodes.
    pub node: Option<String>,
    /// The egress proxy, when the configuration allows any host (`egress_allow`).
    pub egress: Option<crate::egress::Egress>,
}

/// Why a revive failed when the store had the token used already (by another node, or
/// a timer).
const TOKEN_USED_ALREADY: &str = "its token was used already";

/// How a revive's error begins when the store could not be reached (nothing recorded).
const STORE_UNAVAILABLE: &str = "the session store is unavailable";

impl Sessions {
    pub fn new(key: TokenKey, config: Arc<Config>, shutdown: watch::Receiver<bool>, backing: Backing) -> Self {
        let Backing {
            tiers,
            admission,
            files,
            outbox_dir,
            store,
            node,
            egress,
        } = backing;
        let node = node.filter(|_| store.shared());
        let lease_ms = config.cluster.node_lease_ms;
        let slots = Arc::new(Semaphore::new(config.sessions.max_sessions));
        let mcp = crate::mcp_client::McpServers::new(&config.sessions);
        let per_principal = PerPrincipal::new(config.sessions_per_principal());
        Sessions {
            inner: Arc::new(Inner {
                map: Mutex::new(HashMap::new()),
                requests: Mutex::new(HashMap::new()),
                key,
                tiers,
                config,
                slots,
                per_principal,
                admission,
                paused: Default::default(),
                checks: Arc::new(Semaphore::new(
                    std::thread::available_parallelism().map_or(1, |n| n.get()),
                )),
                shutdown,
                files,
                outbox_dir,
                store,
                mcp,
                node,
                egress,
                lease_ms,
                drivers: tokio_util::task::TaskTracker::new(),
                ended: Mutex::default(),
            }),
        }
    }

    /// The session, if it exists and belongs to `principal`; anyone else gets 404.
    fn get(&self, id: &str, principal: &Principal) -> Result<Arc<Session>, EngineError> {
        self.held(id, principal)?.ok_or_else(not_found)
    }

    /// The session if it is held here and belongs to `principal`; 404 if it is held
    /// here but expired (its store entry may outlive it for a moment: it is not read).
    fn held(&self, id: &str, principal: &Principal) -> Result<Option<Arc<Session>>, EngineError> {
        let session = self.map().get(id).filter(|s| s.principal == principal.0).cloned();
        match session {
            Some(session) if session.expired() => Err(not_found()),
            session => Ok(session),
        }
    }

    /// Starts the program and answers with its first pause or its end.
    /// Answers the JSON of the response, which every request for it shares.
    /// Starts a session for `principal`, whose isolation tier is `tier` (a request may
    /// ask for a stronger one: `Tiers::pick`).
    pub async fn start(&self, principal: &Principal, tier: Isolation, cmd: StartCommand) -> Result<Bytes, EngineError> {
        let mut spec = cmd.spec;
        let mut request = cmd.request;
        let inner = &self.inner;
        let (isolation, tier) = inner.tiers.pick(tier, cmd.isolation)?;
        request.isolation = Some(isolation.name().to_owned());
        // The grant lives as long as the session, pauses included (docs/egress.md).
        let granted = crate::egress::grant(inner.egress.as_ref(), &principal.0, request.network.as_ref())?;
        // The workspace is held from here to the session's end (`held`); its files
        // are journalled with the caller's, so that a replay stages the same ones.
        let mut files = cmd.files;
        let held = match &cmd.workspace {
            Some(name) => {
                let held = self
                    .take_workspace(&principal.0, name, spec.timeout_ms, &mut files)
                    .await?;
                request.files = Some(files.clone());
                Some(held)
            }
            None => None,
        };
        spec.inputs = ops::resolve_inputs(&*inner.files, &principal.0, &files, spec.limits.workspace_bytes).await?;
        let staged = spec.inputs.clone();
        let slot = self.take_session_slot(principal).await?;
        // The program runs from the start: it needs a run slot like any /v1/exec run.
        let run_slot = inner.admission.admit(&principal.0).await?;
        // Taken only once the request is known to go ahead: a refused request must not
        // use up a warm sandbox.
        let warm = if cmd.custom_limits || granted.is_some() {
            None
        } else {
            tier.take_warm(&principal.0, cmd.language, &spec.code).await
        };
        if let Some(helper) = &warm {
            spec.run_id = helper.run_id().to_owned();
        }
        let outbox = inner.outbox_dir.join(&spec.run_id);
        spec.collect = Some(crate::files::ops::collect_into(
            &inner.config,
            &outbox,
            spec.limits.workspace_bytes,
        ));
        let id = spec.run_id.clone();
        tracing::Span::current().record("session_id", id.as_str());
        let loop_deadline = cmd.loop_timeout_ms.map(|ms| Instant::now() + Duration::from_millis(ms));
        // The program's random generators are seeded, and the seeds journalled, so that a
        // replay draws the same numbers.
        let seed: u32 = rand::random();
        let hash_seed = warm.as_ref().and_then(|w| w.hash_seed()).unwrap_or_else(rand::random);
        let record = SessionStart {
            principal: principal.0.clone(),
            request,
            seed,
            hash_seed,
            loop_deadline_ms: cmd.loop_timeout_ms.map(|ms| now_ms() + ms),
            created_ms: now_ms(),
            workspace: held.as_ref().map(|h| h.journalled.clone()),
        };
        // Journalled before the program starts: no answer about it goes out before.
        if let Err(e) = inner.store.create(&id, &record, &SessionState::default()).await {
            if let Some(warm) = warm {
                warm.discard();
            }
            return Err(journal_failed(&e));
        }
        // Many nodes: this node owns the session while it holds it live.
        if let Some(node) = &inner.node {
            let now = now_ms();
            if let Err(e) = inner.store.claim(&id, node, now, now + inner.lease_ms).await {
                let _ = inner.store.remove(&id).await;
                if let Some(warm) = warm {
                    warm.discard();
                }
                return Err(journal_failed(&e));
            }
        }
        let endpoint = match crate::egress::open_for(inner.egress.as_ref(), granted, &id, &mut spec, cmd.language) {
            Ok(endpoint) => endpoint,
            Err(e) => {
                let _ = inner.store.remove(&id).await;
                return Err(e);
            }
        };
        let started = match warm {
            Some(helper) => {
                let names = cmd.tools.names();
                let (go, files) = crate::runtime::warm_go(cmd.language, &cmd.args, Some(&names));
                spec.go = Some(go);
                spec.support_files = files;
                seed_run(&mut spec, cmd.language, seed, None);
                helper.begin(spec).await
            }
            None => {
                seed_run(&mut spec, cmd.language, seed, Some(hash_seed));
                tier.start(spec).await
            }
        };
        let helper = match started {
            Ok(h) => h,
            Err(e) => {
                tier.record_failure(&e);
                let _ = inner.store.remove(&id).await;
                return Err(EngineError::internal(error_type::SANDBOX_FAILURE, &e.to_string()));
            }
        };
        let (commands, rx) = mpsc::unbounded_channel();
        let session = Arc::new(Session::new(
            id.clone(),
            principal.0.clone(),
            Shared {
                phase: Phase::Running,
                response: ProgrammaticResponse::Running { session_id: id.clone() }.into(),
                last_resume: None,
                dormant: None,
            },
            Some(commands),
        ));
        if let Some(endpoint) = &endpoint {
            session.audit().attach_network(endpoint.run.clone());
        }
        self.map().insert(id.clone(), session.clone());
        if let Some(request_id) = cmd.request_id {
            self.name_request(&session, request_id).await;
        }
        let driver = DriverSpec {
            sessions: self.clone(),
            session: session.clone(),
            tools: cmd.tools,
            max_tool_calls: cmd.max_tool_calls,
            language: cmd.language,
            outbox,
            tier,
            loop_deadline,
            replay: None,
            state: SessionState::default(),
            staged,
            held,
            endpoint,
        };
        self.inner.drivers.spawn(driver.run(helper, rx, slot, run_slot));
        session.next_outcome_json(0).await
    }

    /// Sessions holding a sandbox now, and how many of them are paused.
    pub fn counts(&self) -> (usize, usize) {
        let inner = &self.inner;
        let alive = inner.config.sessions.max_sessions - inner.slots.available_permits();
        (alive, inner.paused.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// The MCP servers whose tools programs may call (`mcp_servers`).
    pub fn mcp(&self) -> &crate::mcp_client::McpServers {
        &self.inner.mcp
    }

    /// The session's tool calls as the audit trail keeps them (`audit`): in memory while
    /// this node holds the session, in the store while it is dormant.
    pub async fn calls(&self, principal: &Principal, id: &str) -> Result<sandcall_api::CallsResponse, EngineError> {
        let held = self.get(id, principal).ok();
        if let Some(session) = held.filter(|s| s.lock().dormant.is_none()) {
            let audit = session.audit();
            let (calls, calls_dropped) = audit.list();
            let (connections, connections_dropped) = audit.connections();
            return Ok(sandcall_api::CallsResponse {
                session_id: session.id.clone(),
                calls,
                calls_dropped,
                trail_released: audit.released(),
                connections,
                connections_dropped,
            });
        }
        let store = &self.inner.store;
        match store.entry(id).await.map_err(|e| journal_failed(&e))? {
            Some((owner, _)) if owner == principal.0 => {}
            _ => return Err(not_found()),
        }
        let kept = store
            .dormant_audit(id)
            .await
            .map_err(|e| journal_failed(&e))?
            .and_then(|json| serde_json::from_str::<sandcall_store::DormantAudit>(&json).ok())
            .unwrap_or_default();
        Ok(sandcall_api::CallsResponse {
            session_id: id.to_owned(),
            calls: kept.calls,
            calls_dropped: kept.dropped,
            trail_released: false,
            connections: kept.connections,
            connections_dropped: kept.connections_dropped,
        })
    }

    /// Hands the caller's results to the paused program and answers with what comes next.
    ///
    /// The results may answer some of the pending calls; the rest come back in the next
    /// pause. A retry of the last accepted resume (its token, the same results) answers
    /// what that resume answered; a resume of a session that has ended answers its
    /// ending; any other use of a used token is 409.
    pub async fn resume(
        &self,
        principal: &Principal,
        token: &str,
        session_id: Option<&str>,
        results: Vec<ToolResult>,
        request_id: Option<String>,
    ) -> Result<(Bytes, Served), EngineError> {
        let answer = self
            .resume_here(principal, token, session_id, results, request_id)
            .await;
        // A dormant session brought into memory for this resume, which did not wake it
        // (refused, or the store was down), is left to the store again.
        if let Some(id) = self.token_session(token) {
            self.drop_dormant_id(&id);
        }
        answer
    }

    async fn resume_here(
        &self,
        principal: &Principal,
        token: &str,
        session_id: Option<&str>,
        results: Vec<ToolResult>,
        request_id: Option<String>,
    ) -> Result<(Bytes, Served), EngineError> {
        // 400, not 401: LibreChat's client tells the model a 401 means it is not allowed
        // to run code at all, and a 400 that its request was rejected.
        let (id, pause) = self.inner.key.verify(token).ok_or_else(|| {
            EngineError::new(
                ErrorKind::Invalid,
                error_type::INVALID_CONTINUATION_TOKEN,
                "the continuation token is not valid: it does not parse or its signature does not verify",
            )
        })?;
        if session_id.is_some_and(|s| s != id) {
            return Err(EngineError::bad_request(
                "session_id does not match the continuation token",
            ));
        }
        let session = self.get(&id, principal)?;
        // LibreChat's client sends a fresh request id with each request, and cancels by
        // the one of the request it abandons.
        if let Some(request_id) = request_id {
            self.name_request(&session, request_id).await;
        }
        check_result_sizes(&results, self.inner.config.sessions.max_tool_result_bytes)?;
        // Hashing megabytes of results takes milliseconds: off the async workers.
        let (digest, results) = tokio::task::spawn_blocking(move || (results_digest(&results), results))
            .await
            .map_err(|e| EngineError::internal(error_type::INTERNAL, &format!("hashing results: {e}")))?;
        let results = results.as_slice();
        loop {
            // Checked here, before waiting for a run slot, so that a stale token or
            // results that do not fit are answered at once; the phase is checked again
            // below, under the lock, where it counts (the same pause has the same calls,
            // so the replies made here still fit then).
            let step = {
                let mut shared = session.lock();
                let open = matches!(&shared.phase, Phase::Paused { pause: current, .. } if *current == pause);
                match &shared.phase {
                    Phase::Paused { calls, .. } if open => Step::Go(match_results(calls, results)?),
                    _ => match answer_again(&mut shared, *session.version.borrow(), pause, &digest) {
                        Again::Answer(json) => return json.map(|j| (j, Served::Live)),
                        Again::Stored => Step::Stored,
                        // Read under the lock that publishing takes: no answer can slip
                        // in between.
                        Again::Wait => Step::Wait(*session.version.borrow()),
                        Again::Used => return Err(token_used()),
                        Again::Gone => return Err(not_found()),
                    },
                }
            };
            let replies = match step {
                Step::Go(replies) => replies,
                Step::Stored => return self.stored_answer(&session).await.map(|j| (j, Served::Live)),
                Step::Wait(seen) => {
                    session.wait_past(seen).await;
                    continue;
                }
            };
            // The program runs again from here: it waits for a run slot like a new run.
            // A refusal here leaves the pause, and the token, as they were.
            let run_slot = self.inner.admission.admit(principal.0.as_str()).await?;
            // A dormant session needs a sandbox again: a place among max_sessions too. Its
            // place among its principal's sessions is counted by the store until it wakes
            // (`revive`): taken here past the cap, since it is one of them already.
            let mut revive_slot = if session.lock().dormant.is_some() {
                Some(self.session_slot(self.inner.per_principal.force(&principal.0))?)
            } else {
                None
            };
            let mut served = Served::Live;
            let rejection;
            let seen = {
                let mut shared = session.lock();
                let calls = match &shared.phase {
                    Phase::Paused { pause: current, calls } if *current == pause => calls.clone(),
                    // Another use of the token got there first: this one is its retry,
                    // or 409, as above.
                    _ => continue,
                };
                // What the session goes back to if the store cannot take the resume now
                // (503, the token stays good).
                let (reject, rejected) = oneshot::channel();
                let undo = Undo {
                    calls: calls.clone(),
                    response: shared.response.copy(),
                    last_resume: shared.last_resume.as_ref().map(LastResume::copy),
                    dormant: shared.dormant,
                    reject,
                };
                rejection = rejected;
                if shared.dormant.is_some() {
                    // It went dormant meanwhile: look again, with a session slot.
                    let Some(slot) = revive_slot.take() else { continue };
                    let replies = replies
                        .into_iter()
                        .filter_map(|(key, reply)| {
                            let (call_id, _) = calls.iter().find(|(_, k)| *k == key)?;
                            Some((call_id.clone(), reply))
                        })
                        .collect();
                    shared.dormant = None;
                    // Held here again, whatever became of the entry it was found by.
                    self.map().insert(id.clone(), session.clone());
                    let (commands, rx) = mpsc::unbounded_channel();
                    session.set_commands(Some(commands));
                    let resumed = Resumed {
                        pause,
                        digest: Some(digest),
                        replies,
                        undo: Some(undo),
                    };
                    self.inner
                        .drivers
                        .spawn(self.clone().revive(session.clone(), rx, slot, run_slot, Some(resumed)));
                    served = Served::Replay;
                } else if !session.send(DriverCommand::Results(replies, run_slot, digest, Box::new(undo))) {
                    return Err(not_found());
                }
                shared.phase = Phase::Running;
                shared.response = ProgrammaticResponse::Running { session_id: id.clone() }.into();
                shared.last_resume = Some(LastResume {
                    pause,
                    digest,
                    answer: None,
                });
                *session.version.borrow()
            };
            let mut rejected: oneshot::Receiver<EngineError> = rejection;
            // The rejection is sent before the version moves: it is seen first.
            let outcome = tokio::select! {
                biased;
                Ok(e) = &mut rejected => return Err(e),
                json = session.next_outcome_json(seen) => json,
            };
            return outcome.map(|j| (j, served));
        }
    }

    /// The session a token names, if the token is this cluster's (its state is not
    /// looked at): to find the session's node before the resume.
    pub fn token_session(&self, token: &str) -> Option<String> {
        self.inner.key.verify(token).map(|(id, _)| id)
    }

    /// This node's id, when the session store is shared by many nodes.
    pub fn node(&self) -> Option<&str> {
        self.inner.node.as_deref()
    }

    /// The session's state as the JSON of a `ProgrammaticResponse`. A paused session's
    /// answer is serialized once and shared by every GET that reads it.
    pub async fn status(&self, principal: &Principal, id: &str) -> Result<Bytes, EngineError> {
        let mut looked_twice = false;
        let session = loop {
            let missing = match self.held(id, principal)? {
                Some(session) => break session,
                None => not_found(),
            };
            // Not held here: a dormant session's pause is in the store.
            match self.inner.store.entry(id).await.map_err(|e| journal_failed(&e))? {
                Some((owner, state)) if owner == principal.0 && state.open => {
                    if let Some(json) = self.stored_pause(id).await? {
                        return Ok(json);
                    }
                    // Its pause ended between the two reads: brought back into memory
                    // (its calls timed out, or a resume woke it), where it is now.
                    if looked_twice {
                        return Err(missing);
                    }
                    looked_twice = true;
                }
                _ => return Err(missing),
            }
        };
        if session.lock().dormant.is_some() {
            return self.stored_answer(&session).await;
        }
        session.current_json().map_err(serialize_failed)
    }

    /// A dormant session's pause, as handed out: only the store keeps it. If the session
    /// woke up meanwhile, its current answer.
    async fn stored_answer(&self, session: &Arc<Session>) -> Result<Bytes, EngineError> {
        match self.stored_pause(&session.id).await? {
            Some(json) if session.lock().dormant.is_some() => Ok(json),
            _ => session.current_json().map_err(serialize_failed),
        }
    }

    /// The pause session `id` waits in, as the store has it; None if it is not paused.
    async fn stored_pause(&self, id: &str) -> Result<Option<Bytes>, EngineError> {
        let journal = match self.inner.store.load(id).await {
            Ok(Some(journal)) if journal.state.open => journal,
            Ok(_) => return Ok(None),
            Err(e) => return Err(journal_failed(&e)),
        };
        let state = journal.state;
        let mut calls: Vec<Option<ToolCall>> = vec![None; state.outstanding.len()];
        for entry in journal.entries {
            if let JournalEntry::Call {
                call_id,
                name,
                arguments,
                ..
            } = entry
            {
                if let Some(i) = state.outstanding.iter().position(|c| *c == call_id) {
                    calls[i] = Some(ToolCall::new(call_id, name, ToolArguments::new(arguments)));
                }
            }
        }
        let response = ProgrammaticResponse::ToolCallRequired {
            session_id: id.to_owned(),
            continuation_token: self.inner.key.sign(id, state.pause),
            tool_calls: calls.into_iter().flatten().collect(),
            partial_stdout: state.partial_stdout,
            partial_stderr: state.partial_stderr,
            expires_at: state.expires_at,
        };
        match serialized(&response).await {
            Some(json) => Ok(Some(json)),
            None => Err(EngineError::internal(
                error_type::INTERNAL,
                "serializing a session's state failed",
            )),
        }
    }

    /// Kills the program; answers with the session's end.
    pub async fn cancel(&self, principal: &Principal, id: &str) -> Result<ProgrammaticResponse, EngineError> {
        let session = self.get(id, principal)?;
        loop {
            let (seen, dormant) = {
                let mut shared = session.lock();
                match shared.phase {
                    Phase::Done => return Ok(shared.response.response.clone()),
                    Phase::Expired => return Err(not_found()),
                    _ => {}
                }
                (*session.version.borrow(), shared.dormant.take().is_some())
            };
            {
                if dormant {
                    // No sandbox to kill: the session ends here, and leaves the journal.
                    let response = ProgrammaticResponse::Error {
                        session_id: session.id.clone(),
                        error: "the session was cancelled".into(),
                        error_type: error_type::CANCELLED.into(),
                        stdout: String::new(),
                        stderr: String::new(),
                    };
                    session.publish(Phase::Done, response.clone());
                    self.forget(&session).await;
                    return Ok(response);
                }
            }
            let _ = session.send(DriverCommand::Cancel);
            session.next_outcome(seen).await;
        }
    }
}

fn not_found() -> EngineError {
    EngineError::new(
        ErrorKind::NotFound,
        error_type::SESSION_NOT_FOUND,
        "no such session (it may have ended or expired)",
    )
}

fn serialize_failed(e: serde_json::Error) -> EngineError {
    EngineError::internal(error_type::INTERNAL, &format!("serializing a session's state: {e}"))
}

/// A pause's answer as JSON, made on a blocking thread: it holds up to `max_pause_bytes`
/// of arguments twice (`arguments` and `input`). `None` if that fails; the first request
/// then serializes it.
async fn serialized(response: &ProgrammaticResponse) -> Option<Bytes> {
    let response = response.clone();
    let json = tokio::task::spawn_blocking(move || serde_json::to_vec(&response)).await;
    json.ok().and_then(Result::ok).map(Bytes::from)
}

/// Seeds the program's random generators from `seed`: Python's `random` and numpy's
/// global generator (`runner.py`), JavaScript's `Math.random` (`runner.mjs`), both from
/// the `seed` file, and Bash's `$RANDOM` (`tools.sh`). A cold Python program also gets
/// `hash_seed` as its `PYTHONHASHSEED` (a warm one started with its own, `Pool`).
fn seed_run(spec: &mut RunSpec, language: sandcall_api::Language, seed: u32, hash_seed: Option<u32>) {
    spec.support_files.push(("seed".into(), seed.to_string()));
    if let Some((_, script)) = spec.support_files.iter_mut().find(|(name, _)| name == "tools.sh") {
        script.push_str(&format!("RANDOM={seed}\n"));
    }
    if let Some(hash_seed) = hash_seed.filter(|_| language == sandcall_api::Language::Python) {
        spec.env.push(("PYTHONHASHSEED".into(), hash_seed.to_string()));
    }
}

fn journal_failed(e: &sandcall_store::StoreError) -> EngineError {
    if let sandcall_store::StoreError::Unavailable(detail) = e {
        return EngineError::store_unavailable(detail);
    }
    tracing::error!(error = %e, "the session store failed");
    EngineError::internal(
        error_type::INTERNAL,
        "the session could not be written to the session store",
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if text.len() != 64 {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A call's checked arguments as the journal keeps them.
fn arguments_box(arguments: &ToolArguments) -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string(arguments.get().to_owned())
        .unwrap_or_else(|_| serde_json::value::RawValue::from_string("null".into()).unwrap_or_default())
}

fn token_used() -> EngineError {
    EngineError::new(
        ErrorKind::Conflict,
        error_type::CONTINUATION_TOKEN_USED,
        "this continuation token was already used or is no longer current",
    )
}
