//! Programmatic sessions: the pause/resume state machine, the driver task that owns a
//! session's sandbox, and the registry the routes look sessions up in.
//!
//! ```text
//! start ──> Running ──(program blocks on calls)──> Paused{pause n} ──(resume, token n)──> Running ...
//!             │                                      │  tool_call_timeout: TimeoutError in the program ──> Running
//!             │                                      │  session_expiry: sandbox killed ──> gone (404)
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
use crate::pool::Pool;
use crate::runner::{Helper, RunError, RunSpec, Runner};
use bytes::Bytes;
use sandcall_api::ids;
use sandcall_api::{error_type, OutputFile, ProgrammaticResponse, SkippedFile, ToolArguments, ToolCall, ToolResult};
use sandcall_auth::Principal;
use sandcall_config::Config;
use sandcall_sandbox::protocol::{Collect, Command, Event, RunResult, ToolReply};
use sandcall_store::{JournalEntry, SessionStart, SessionState, SessionStore};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Where a session is.
enum Phase {
    Running,
    /// Waiting for the caller: the calls handed out at pause number `pause`.
    Paused {
        pause: u64,
        calls: Vec<(String, u64)>,
    },
    Done,
}

struct Shared {
    phase: Phase,
    /// What GET answers now; also what a waiting request receives.
    response: Published,
    /// The last resume accepted, so that a retry of it (same token, same results)
    /// answers what it answered. One per session: only the latest token can be retried.
    last_resume: Option<LastResume>,
    /// The session is paused with no sandbox (evicted, or journalled by a server before
    /// a restart): since when it has been paused, ms since the epoch. A resume brings it
    /// back by replay (`Sessions::revive`).
    dormant: Option<u64>,
}

/// An accepted resume: the pause it answered, a digest of its results, and its answer
/// once published (the next pause or the end). The answer shares the published
/// response's arguments, so keeping it costs no copy of them.
struct LastResume {
    pause: u64,
    digest: [u8; 32],
    /// The answer, and the version it was published as: while it is still the current
    /// response, a retry answers the current response's JSON (serialized once).
    answer: Option<(u64, Published)>,
}

/// A response as published, and its JSON once a GET asked for it: every later GET
/// answers those same bytes, so no GET serializes (or copies) the pending calls again.
/// Cloning the response itself copies no arguments either (`ToolArguments` is shared).
struct Published {
    response: ProgrammaticResponse,
    json: Option<Bytes>,
}

impl From<ProgrammaticResponse> for Published {
    fn from(response: ProgrammaticResponse) -> Published {
        Published { response, json: None }
    }
}

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

impl Published {
    /// A copy: the response shares its arguments, the JSON its bytes.
    fn copy(&self) -> Published {
        Published {
            response: self.response.clone(),
            json: self.json.clone(),
        }
    }
}

impl LastResume {
    fn copy(&self) -> LastResume {
        LastResume {
            pause: self.pause,
            digest: self.digest,
            answer: self.answer.as_ref().map(|(v, p)| (*v, p.copy())),
        }
    }
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
        let mut shared = self.lock();
        if !matches!(shared.phase, Phase::Paused { .. }) {
            return false;
        }
        shared.phase = Phase::Running;
        shared.response = ProgrammaticResponse::Running {
            session_id: self.id.clone(),
        }
        .into();
        true
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
    /// The request as the session journal keeps it (no resume fields).
    pub request: sandcall_api::ProgrammaticRequest,
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
    runner: Runner,
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
    pool: Pool,
    /// Every session's journal.
    store: Arc<dyn SessionStore>,
    /// The MCP servers whose tools programs may call (`mcp_servers`).
    mcp: crate::mcp_client::McpServers,
    /// With a store that many nodes share: this node's id (its `node_url`), which the
    /// leases name. None on a single node.
    node: Option<String>,
    /// How long a lease lasts unless renewed (`node_lease_ms`).
    lease_ms: u64,
    /// Every session's driver task: at shutdown the server waits for them, so that each
    /// paused session is marked dormant and gives its lease up before the process ends.
    drivers: tokio_util::task::TaskTracker,
}

fn not_found() -> EngineError {
    EngineError::new(
        ErrorKind::NotFound,
        error_type::SESSION_NOT_FOUND,
        "no such session (it may have ended or expired)",
    )
}

/// What sessions run on, shared with the rest of the server.
pub struct Backing {
    pub runner: Runner,
    pub pool: Pool,
    pub admission: Admission,
    pub files: Arc<dyn FileStore>,
    /// Where helpers put a run's output files before the store takes them.
    pub outbox_dir: PathBuf,
    /// Where sessions are journalled.
    pub store: Arc<dyn SessionStore>,
    /// This node's `node_url`, when the store is shared by many nodes.
    pub node: Option<String>,
}

impl Sessions {
    pub fn new(key: TokenKey, config: Arc<Config>, shutdown: watch::Receiver<bool>, backing: Backing) -> Self {
        let Backing {
            runner,
            pool,
            admission,
            files,
            outbox_dir,
            store,
            node,
        } = backing;
        let node = node.filter(|_| store.shared());
        let lease_ms = config.cluster.node_lease_ms;
        let slots = Arc::new(Semaphore::new(config.sessions.max_sessions));
        let config_mcp = config.sessions.mcp_servers.clone();
        let per_principal = PerPrincipal::new(config.sessions_per_principal());
        Sessions {
            inner: Arc::new(Inner {
                map: Mutex::new(HashMap::new()),
                requests: Mutex::new(HashMap::new()),
                key,
                runner,
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
                pool,
                store,
                mcp: crate::mcp_client::McpServers::new(&config_mcp),
                node,
                lease_ms,
                drivers: tokio_util::task::TaskTracker::new(),
            }),
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.inner.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session, if it exists and belongs to `principal`; anyone else gets 404.
    fn get(&self, id: &str, principal: &Principal) -> Result<Arc<Session>, EngineError> {
        self.map()
            .get(id)
            .filter(|s| s.principal == principal.0)
            .cloned()
            .ok_or_else(not_found)
    }

    /// Starts the program and answers with its first pause or its end.
    /// Answers the JSON of the response, which every request for it shares.
    pub async fn start(&self, principal: &Principal, cmd: StartCommand) -> Result<Bytes, EngineError> {
        let mut spec = cmd.spec;
        let inner = &self.inner;
        spec.inputs = ops::resolve_inputs(&*inner.files, &principal.0, &cmd.files, spec.limits.workspace_bytes).await?;
        let slot = self.take_session_slot(principal).await?;
        // The program runs from the start: it needs a run slot like any /v1/exec run.
        let run_slot = inner.admission.admit(&principal.0).await?;
        // Taken only once the request is known to go ahead: a refused request must not
        // use up a warm sandbox.
        let warm = if cmd.custom_limits {
            None
        } else {
            inner.pool.take_or_fork(cmd.language, &spec.code).await
        };
        if let Some(helper) = &warm {
            spec.run_id = helper.run_id().to_owned();
        }
        let outbox = inner.outbox_dir.join(&spec.run_id);
        spec.collect = Some(Collect {
            outbox: outbox.clone(),
            max_files: inner.config.files.max_output_files,
            max_file_bytes: inner.config.files.max_file_bytes,
            max_total_bytes: spec.limits.workspace_bytes,
        });
        let id = spec.run_id.clone();
        tracing::Span::current().record("session_id", id.as_str());
        let loop_deadline = cmd.loop_timeout_ms.map(|ms| Instant::now() + Duration::from_millis(ms));
        // The program's random generators are seeded, and the seeds journalled, so that a
        // replay draws the same numbers.
        let seed: u32 = rand::random();
        let hash_seed = warm.as_ref().and_then(Helper::hash_seed).unwrap_or_else(rand::random);
        let record = SessionStart {
            principal: principal.0.clone(),
            request: cmd.request,
            seed,
            hash_seed,
            loop_deadline_ms: cmd.loop_timeout_ms.map(|ms| now_ms() + ms),
            created_ms: now_ms(),
        };
        // Journalled before the program starts: no answer about it goes out before.
        if let Err(e) = inner.store.create(&id, &record, &SessionState::default()).await {
            if let Some(mut helper) = warm {
                helper.abort();
                tokio::spawn(helper.wait());
            }
            return Err(journal_failed(&e));
        }
        // Many nodes: this node owns the session while it holds it live.
        if let Some(node) = &inner.node {
            let now = now_ms();
            if let Err(e) = inner.store.claim(&id, node, now, now + inner.lease_ms).await {
                let _ = inner.store.remove(&id).await;
                if let Some(mut helper) = warm {
                    helper.abort();
                    tokio::spawn(helper.wait());
                }
                return Err(journal_failed(&e));
            }
        }
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
                self.inner.runner.start(spec).await
            }
        };
        let helper = match started {
            Ok(h) => h,
            Err(e) => {
                self.inner.runner.record_failure(&e);
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
        self.map().insert(id.clone(), session.clone());
        if let Some(request_id) = cmd.request_id {
            self.name_request(&session, request_id).await;
        }
        let driver = Driver {
            sessions: self.clone(),
            session: session.clone(),
            tools: cmd.tools,
            max_tool_calls: cmd.max_tool_calls,
            language: cmd.language,
            outbox,
            loop_deadline,
            replay: None,
            state: SessionState::default(),
        };
        self.inner.drivers.spawn(driver.run(helper, rx, slot, run_slot));
        session.next_outcome_json(0).await
    }

    /// A place for one more session of `principal`: 429 when it holds its share (its
    /// sessions here, and its dormant ones, which the store counts), 503 when the server
    /// holds `max_sessions`.
    async fn take_session_slot(&self, principal: &Principal) -> Result<SessionSlot, EngineError> {
        let inner = &self.inner;
        let at_capacity = || {
            EngineError::principal_at_capacity(format!(
                "this caller already holds {} sessions (max_sessions_per_principal); end one or retry later",
                inner.per_principal.cap()
            ))
        };
        let dormant = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let before = inner
            .store
            .dormant(Some(&principal.0))
            .await
            .map_err(|e| journal_failed(&e))?;
        let held = inner
            .per_principal
            .take_beyond(&principal.0, dormant(before))
            .ok_or_else(at_capacity)?;
        // A session of the principal may have gone dormant meanwhile: counted by the
        // store from then on, and its place here given back just after. Looked at again,
        // so that no session is counted by neither.
        let after = inner
            .store
            .dormant(Some(&principal.0))
            .await
            .map_err(|e| journal_failed(&e))?;
        if after > before
            && inner.per_principal.held(&principal.0).saturating_add(dormant(after)) > inner.per_principal.cap()
        {
            return Err(at_capacity());
        }
        self.session_slot(held)
    }

    /// A place among `max_sessions` for a session whose principal's place is `held`.
    fn session_slot(&self, held: Held) -> Result<SessionSlot, EngineError> {
        let inner = &self.inner;
        let permit = inner.slots.clone().try_acquire_owned().map_err(|_| EngineError {
            message: "the server holds as many sessions as it may (max_sessions); retry later".into(),
            ..EngineError::at_capacity(1)
        })?;
        Ok(SessionSlot {
            _permit: permit,
            _held: held,
        })
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
            let (calls, calls_dropped) = session.audit().list();
            return Ok(sandcall_api::CallsResponse {
                session_id: session.id.clone(),
                calls,
                calls_dropped,
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
        })
    }

    /// Paused sessions that hold no sandbox (evicted, or left paused by an earlier
    /// server), as the store counts them; None if it cannot be read now.
    pub async fn dormant_count(&self) -> Option<usize> {
        match self.inner.store.dormant(None).await {
            Ok(n) => usize::try_from(n).ok(),
            Err(e) => {
                tracing::warn!(error = %e, "could not count the dormant sessions");
                None
            }
        }
    }

    /// The sessions this node keeps an entry of in memory (a dormant one has none).
    pub fn entries(&self) -> usize {
        self.map().len()
    }

    /// What a dormant session keeps in the store besides its journal, now: its first
    /// timer's deadline, its audit trail and its latest request id.
    fn dormancy(&self, session: &Session, paused_ms: u64) -> Result<sandcall_store::Dormancy, String> {
        let config = &self.inner.config;
        let expiry_ms = config.sessions.session_expiry_s.saturating_mul(1000);
        let audit = serde_json::to_string(&session.audit().snapshot()).map_err(|e| e.to_string())?;
        Ok(sandcall_store::Dormancy {
            principal: session.principal.clone(),
            due_ms: paused_ms.saturating_add(expiry_ms.min(config.sessions.tool_call_timeout_ms)),
            audit,
            request_id: session.request_id(),
        })
    }

    /// Marks `session` dormant in the store, before its node lets go of it.
    async fn sleep_in_store(&self, session: &Session, paused_ms: u64) -> bool {
        let written = match self.dormancy(session, paused_ms) {
            Ok(dormancy) => self
                .inner
                .store
                .sleep(&session.id, &dormancy)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        match written {
            Ok(written) => written,
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "could not mark a session dormant; it stays live");
                false
            }
        }
    }

    /// Forgets this node's entry of `session` if it is dormant: the store keeps it.
    fn drop_dormant(&self, session: &Arc<Session>) {
        let shared = session.lock();
        if shared.dormant.is_some() {
            self.remove(session);
        }
    }

    /// The same, for the entry of session `id`, if any.
    fn drop_dormant_id(&self, id: &str) {
        let held = self.map().get(id).cloned();
        if let Some(session) = held {
            self.drop_dormant(&session);
        }
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
        let (id, pause) = self.inner.key.verify(token).ok_or_else(|| {
            EngineError::new(
                ErrorKind::Unauthorized,
                error_type::INVALID_CONTINUATION_TOKEN,
                "the continuation token is not valid",
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

    /// Where a request about session `id` is served: here if this node holds it live (no
    /// store round trip: the fast path); else it is looked up in the store, on one node as
    /// on many. In a cluster, at its owner's node while the owner's lease is good; else
    /// here, after taking it over: `own` (a resume or a cancel, which change it) claims
    /// the lease atomically, so that one node at a time brings it back. A request that
    /// changes it registers the session from the store (dormant, or run again to its next
    /// pause if it was running when its node died); a GET of a dormant session is
    /// answered from the store and registers nothing.
    /// `forwarded`: the request came from another node, and is never sent on again.
    pub async fn locate(
        &self,
        id: &str,
        principal: &Principal,
        forwarded: bool,
        own: bool,
    ) -> Result<Located, EngineError> {
        let inner = &self.inner;
        let here = self.map().get(id).cloned();
        if let Some(session) = &here {
            if session.lock().dormant.is_none() {
                return Ok(Located::Here);
            }
        }
        let store = &inner.store;
        let Some(node) = inner.node.as_deref() else {
            // One node: nobody else holds it. A dormant session is brought into memory
            // for a request that changes it; anything else is answered as it is found.
            if here.is_none() && own {
                if let Some((owner_principal, state)) = store.entry(id).await.map_err(|e| journal_failed(&e))? {
                    if owner_principal == principal.0 && state.open {
                        self.adopt(id, owner_principal, state).await;
                    }
                }
            }
            return Ok(Located::Here);
        };
        // A claim lost to another node sends the request there on the next round.
        for _ in 0..3 {
            let now = now_ms();
            match store.owner(id, now).await.map_err(|e| journal_failed(&e))? {
                Some(owner) if owner != node => {
                    if forwarded {
                        return Err(owner_moved());
                    }
                    return Ok(Located::Owner(owner));
                }
                _ => {}
            }
            let Some((owner_principal, state)) = store.entry(id).await.map_err(|e| journal_failed(&e))? else {
                self.drop_stale(id);
                return Err(not_found());
            };
            if owner_principal != principal.0 {
                return Err(not_found());
            }
            // A running session whose node is gone is run again here: that needs the lease.
            let claim = own || !state.open;
            if !claim {
                // A GET of a dormant session: answered from the store.
                return Ok(Located::Here);
            }
            if !store
                .claim(id, node, now, now + inner.lease_ms)
                .await
                .map_err(|e| journal_failed(&e))?
            {
                continue;
            }
            self.adopt(id, owner_principal, state).await;
            return Ok(Located::Here);
        }
        Err(owner_moved())
    }

    /// Registers the session as the store has it, unless this node's entry is live or
    /// already at the same pause.
    async fn adopt(&self, id: &str, principal: String, state: SessionState) {
        let current = self.map().get(id).cloned();
        if let Some(session) = current {
            let shared = session.lock();
            let same = match &shared.phase {
                Phase::Paused { pause, .. } => state.open && *pause == state.pause,
                _ => true,
            };
            if shared.dormant.is_none() || same {
                return;
            }
        }
        self.bring_back(id.to_owned(), principal, state).await;
    }

    /// Forgets this node's entry of a session that is no longer journalled (ended on
    /// another node), unless it holds it live.
    fn drop_stale(&self, id: &str) {
        self.drop_dormant_id(id);
    }

    /// Many nodes: the owner at `owner` could not be reached. Waits (at most the lease's
    /// length and a second) until its lease runs out or the session has another owner;
    /// 503 if it does not.
    pub async fn wait_out_lease(&self, id: &str, owner: &str) -> Result<(), EngineError> {
        let inner = &self.inner;
        let deadline = Instant::now() + Duration::from_millis(inner.lease_ms) + Duration::from_secs(1);
        loop {
            let current = inner.store.owner(id, now_ms()).await.map_err(|e| journal_failed(&e))?;
            if current.as_deref() != Some(owner) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(owner_moved());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// At shutdown: waits (until `deadline`) for every session's driver to end, then, with
    /// many nodes, gives up this node's leases, so that the other nodes take its sessions
    /// over at once instead of waiting for the leases to run out.
    pub async fn release_leases(&self, deadline: tokio::time::Instant) {
        // Each session's driver ends the session's run at shutdown: a paused one is
        // marked dormant and gives its own lease up once its sandbox is gone. Leaving
        // before they have would leave their leases to run out.
        self.inner.drivers.close();
        let _ = tokio::time::timeout_at(deadline, self.inner.drivers.wait()).await;
        let Some(node) = self.inner.node.as_deref() else {
            return;
        };
        let ids: Vec<String> = self.map().keys().cloned().collect();
        for id in ids {
            if let Err(e) = self.inner.store.release(&id, node).await {
                tracing::warn!(session = %id, error = %e, "could not release a session's lease");
            }
        }
    }

    /// Many nodes: renews this node's lease on every session it holds live, every third
    /// of `node_lease_ms`, until the server stops.
    pub async fn renew_leases(self) {
        let inner = &self.inner;
        let Some(node) = inner.node.clone() else {
            return;
        };
        let mut shutdown = inner.shutdown.clone();
        let every = Duration::from_millis((inner.lease_ms / 3).max(100));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            // Cloned out first: a session's lock is never taken under the map's.
            let held: Vec<Arc<Session>> = self.map().values().cloned().collect();
            let live: Vec<String> = held
                .iter()
                .filter(|s| s.lock().dormant.is_none())
                .map(|s| s.id.clone())
                .collect();
            for id in live {
                let now = now_ms();
                match inner.store.claim(&id, &node, now, now + inner.lease_ms).await {
                    Ok(true) => {}
                    Ok(false) => {
                        // Another node took it over: its requests go there from now, and
                        // this copy ends without touching the journal.
                        tracing::warn!(session = %id, "another node took over a session this node held; its copy here ends");
                        let session = self.map().get(&id).cloned();
                        if let Some(session) = session {
                            self.remove(&session);
                            session.send(DriverCommand::Abandon);
                        }
                    }
                    Err(e) => tracing::warn!(session = %id, error = %e, "could not renew a session's lease"),
                }
            }
        }
    }

    /// Lets cancel name `session` by `request_id` from now: in memory, and with Redis in
    /// the store too, so that cancel by request id reaches it from any node.
    async fn name_request(&self, session: &Arc<Session>, request_id: String) {
        let store = &self.inner.store;
        if store.shared() {
            if let Err(e) = store.name_request(&session.principal, &request_id, &session.id).await {
                tracing::warn!(session = %session.id, error = %e, "could not record a session's request id");
            }
        }
        self.name_by_request_id(session, request_id);
    }

    /// Lets cancel name `session` by `request_id` from now, in place of the id an earlier
    /// request named it by. A later request with the same id takes it over.
    pub fn name_by_request_id(&self, session: &Session, request_id: String) {
        let mut current = session.request_id.lock().unwrap_or_else(|p| p.into_inner());
        let Ok(current) = current.as_mut() else {
            return;
        };
        let mut requests = self.requests();
        if let Some(old) = current.take() {
            let key = (session.principal.clone(), old);
            if requests.get(&key) == Some(&session.id) {
                requests.remove(&key);
            }
        }
        requests.insert((session.principal.clone(), request_id.clone()), session.id.clone());
        *current = Some(request_id);
    }

    /// The session a request with `X-LibreChat-Code-Request-ID: request_id` was about, if it
    /// is this principal's and still known (held here, or named in the store: a dormant
    /// session, or with Redis any node's); else 404.
    pub async fn by_request_id(&self, principal: &Principal, request_id: &str) -> Result<String, EngineError> {
        let known = self
            .requests()
            .get(&(principal.0.clone(), request_id.to_owned()))
            .cloned();
        if let Some(id) = known {
            return Ok(id);
        }
        let stored = self
            .inner
            .store
            .by_request(&principal.0, request_id)
            .await
            .map_err(|e| journal_failed(&e))?;
        // A session held live here answers to its latest request id only (the store may
        // still have the one it was named by when it went dormant).
        let stored = stored.filter(|id| {
            let held = self.map().get(id).cloned();
            held.is_none_or(|s| s.lock().dormant.is_some() || s.request_id().as_deref() == Some(request_id))
        });
        stored.ok_or_else(|| {
            EngineError::new(
                ErrorKind::NotFound,
                error_type::SESSION_NOT_FOUND,
                "no session of this caller was started or resumed with this request_id (it may have ended or expired)",
            )
        })
    }

    fn requests(&self) -> MutexGuard<'_, HashMap<(String, String), String>> {
        self.inner.requests.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session's state as the JSON of a `ProgrammaticResponse`. A paused session's
    /// answer is serialized once and shared by every GET that reads it.
    pub async fn status(&self, principal: &Principal, id: &str) -> Result<Bytes, EngineError> {
        let mut looked_twice = false;
        let session = loop {
            let missing = match self.get(id, principal) {
                Ok(session) => break session,
                Err(missing) => missing,
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
                if matches!(shared.phase, Phase::Done) {
                    return Ok(shared.response.response.clone());
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

    /// Removes the session from the registry and its journal from the store (with what
    /// it kept there while dormant).
    async fn forget(&self, session: &Arc<Session>) {
        self.remove(session);
        if let Err(e) = self.inner.store.remove(&session.id).await {
            tracing::warn!(session = %session.id, error = %e, "could not remove a session's journal");
        }
    }

    fn remove(&self, session: &Arc<Session>) {
        let mut map = self.map();
        if map.get(&session.id).is_some_and(|s| Arc::ptr_eq(s, session)) {
            map.remove(&session.id);
        }
        drop(map);
        let mut named = session.request_id.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(Some(request_id)) = std::mem::replace(&mut *named, Err(())) {
            let mut requests = self.requests();
            let key = (session.principal.clone(), request_id);
            if requests.get(&key) == Some(&session.id) {
                requests.remove(&key);
            }
        }
    }
}

/// A resume of a dormant session: the pause it answered, its results by call id, and
/// their digest.
struct Resumed {
    pause: u64,
    /// None when the replies are the server's (tool_call_timeout_ms): no caller's resume
    /// can be retried then.
    digest: Option<[u8; 32]>,
    replies: Vec<(String, ToolReply)>,
    /// What to go back to if the store cannot record the replies now.
    undo: Option<Undo>,
}

/// What a replay still has to meet: the journalled calls the program has not made
/// again yet, the replies known for calls, and the output the caller already has.
struct Replay {
    /// (pause, call id, name, arguments), in the order they were handed out.
    calls: std::collections::VecDeque<(u64, String, String, Value)>,
    replies: HashMap<String, ToolReply>,
    skip_stdout: u64,
    skip_stderr: u64,
}

impl Replay {
    fn new(entries: Vec<JournalEntry>, state: &SessionState) -> Replay {
        let mut calls = std::collections::VecDeque::new();
        let mut replies = HashMap::new();
        for entry in entries {
            match entry {
                JournalEntry::Call {
                    pause,
                    call_id,
                    name,
                    arguments,
                } => {
                    let arguments = serde_json::from_str(arguments.get()).unwrap_or(Value::Null);
                    calls.push_back((pause, call_id, name, arguments));
                }
                JournalEntry::Reply { call_id, reply } => {
                    replies.insert(call_id, reply);
                }
            }
        }
        Replay {
            calls,
            replies,
            skip_stdout: state.stdout_sent,
            skip_stderr: state.stderr_sent,
        }
    }

    /// The journalled call a call of the replayed program is: one of the earliest
    /// pause's calls not met yet, with the same name and arguments (the calls of one
    /// pause may come in any order, as Bash's background jobs make them). None: the
    /// program took another path.
    fn meet(&mut self, name: &str, arguments: &str) -> Option<String> {
        let first = self.calls.front()?.0;
        let arguments: Value = serde_json::from_str(arguments).ok()?;
        let at = self
            .calls
            .iter()
            .take_while(|(pause, ..)| *pause == first)
            .position(|(_, _, n, a)| n == name && *a == arguments)?;
        self.calls.remove(at).map(|(_, call_id, ..)| call_id)
    }
}

impl Sessions {
    /// Brings the sessions journalled by an earlier server back: a paused one waits,
    /// dormant, for its resume, in the store alone (marked dormant there if its server
    /// ended without doing so, as after SIGKILL); one whose program was running (its last
    /// resume accepted, its next pause not reached) runs again to its next pause, which a
    /// retry of that resume then answers. A session that never paused is forgotten:
    /// nobody holds a token of it.
    pub async fn recover(&self) {
        let inner = &self.inner;
        // A store that many nodes share holds every node's sessions: each is looked up
        // by id when a request names it (`locate`), not taken at start.
        if inner.store.shared() {
            return;
        }
        let listed = match inner.store.list().await {
            Ok(listed) => listed,
            Err(e) => {
                tracing::error!(error = %e, "could not read the session store: no session recovered");
                return;
            }
        };
        let mut recovered = 0usize;
        let expiry_ms = inner.config.sessions.session_expiry_s.saturating_mul(1000);
        for (id, principal, state) in listed {
            if state.open && state.pause > 0 {
                if now_ms().saturating_sub(state.paused_ms) > expiry_ms {
                    let _ = inner.store.remove(&id).await;
                    continue;
                }
                if self.keep_dormant(&id, principal, state.paused_ms).await {
                    recovered += 1;
                }
                continue;
            }
            if self.bring_back(id, principal, state).await {
                recovered += 1;
            }
        }
        if recovered > 0 {
            tracing::info!(recovered, "programmatic sessions recovered from the session store");
        }
    }

    /// Makes sure a paused session left by an earlier server is marked dormant in the
    /// store (it was not if that server was killed while holding it live), keeping what
    /// it kept there if it was.
    async fn keep_dormant(&self, id: &str, principal: String, paused_ms: u64) -> bool {
        let store = &self.inner.store;
        match store.dormant_audit(id).await {
            Ok(Some(_)) => return true,
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(session = %id, error = %e, "could not read a session's dormancy");
                return false;
            }
        }
        let session = Session::new(
            id.to_owned(),
            principal,
            Shared {
                phase: Phase::Done,
                response: dormant_placeholder(id),
                last_resume: None,
                dormant: Some(paused_ms),
            },
            None,
        );
        self.sleep_in_store(&session, paused_ms).await
    }

    /// Registers one journalled session: paused, dormant; running when its node
    /// stopped, run again to its next pause. False if it was forgotten instead (it never
    /// paused, so nobody holds a token of it, or its pause expired).
    async fn bring_back(&self, id: String, principal: String, state: SessionState) -> bool {
        let inner = &self.inner;
        let expiry_ms = inner.config.sessions.session_expiry_s.saturating_mul(1000);
        let expired = state.open && now_ms().saturating_sub(state.paused_ms) > expiry_ms;
        if state.pause == 0 || expired {
            let _ = inner.store.remove(&id).await;
            return false;
        }
        // Each outstanding call is named by its place in the pause (a dormant session
        // has no helper keys); `revive` maps the results back to call ids.
        let calls = state
            .outstanding
            .iter()
            .enumerate()
            .map(|(i, call_id)| (call_id.clone(), i as u64))
            .collect();
        let last_resume = state.last_resume.as_ref().and_then(|(pause, digest)| {
            Some(LastResume {
                pause: *pause,
                digest: unhex(digest)?,
                answer: None,
            })
        });
        let shared = if state.open {
            Shared {
                phase: Phase::Paused {
                    pause: state.pause,
                    calls,
                },
                response: dormant_placeholder(&id),
                last_resume,
                dormant: Some(state.paused_ms),
            }
        } else {
            Shared {
                phase: Phase::Running,
                response: ProgrammaticResponse::Running { session_id: id.clone() }.into(),
                last_resume,
                dormant: None,
            }
        };
        let (commands, rx) = if state.open {
            (None, None)
        } else {
            let (commands, rx) = mpsc::unbounded_channel();
            (Some(commands), Some(rx))
        };
        // A paused one is counted among its principal's sessions by the store, as dormant.
        let session = Arc::new(Session::new(id.clone(), principal.clone(), shared, commands));
        self.map().insert(id.clone(), session.clone());
        if let Some(rx) = rx {
            let Ok(slot) = self.take_session_slot(&Principal(principal.clone())).await else {
                if inner.node.is_some() {
                    // Another node may bring it back: its journal stays.
                    self.remove(&session);
                } else {
                    self.forget(&session).await;
                }
                return false;
            };
            let run_slot = inner.admission.admit_now(&principal);
            self.inner
                .drivers
                .spawn(self.clone().revive(session, rx, slot, run_slot, None));
        }
        true
    }

    /// Every second: ends dormant sessions whose pause outlived `session_expiry_s`, and
    /// brings back those whose pause outlived `tool_call_timeout_ms`, with the timeout
    /// as their calls' results, as a live session's program would get it. Driven by the
    /// store's deadline index (`SessionStore::due`): no dormant session is in memory.
    pub async fn expire_dormant(self) {
        let mut shutdown = self.inner.shutdown.clone();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            let due = match self.inner.store.due(now_ms(), DUE_BATCH).await {
                Ok(due) => due,
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the dormant sessions' deadlines");
                    continue;
                }
            };
            for id in due {
                self.act_on_due(&id).await;
            }
        }
    }

    /// A dormant session whose deadline passed: expired, its calls timed out, or (its
    /// index entry stale) left alone.
    async fn act_on_due(&self, id: &str) {
        let inner = &self.inner;
        let store = &inner.store;
        let expiry_ms = inner.config.sessions.session_expiry_s.saturating_mul(1000);
        let tool_timeout_ms = inner.config.sessions.tool_call_timeout_ms;
        let here = self.map().get(id).cloned();
        if here.as_ref().is_some_and(|s| s.lock().dormant.is_none()) {
            // Held live here: the wake that should have taken it out of the index did
            // not reach the store.
            let _ = store.wake(id).await;
            return;
        }
        // Many nodes: one node at a time acts on it, and not while another holds it live.
        if let Some(node) = inner.node.as_deref() {
            let now = now_ms();
            if !matches!(store.claim(id, node, now, now + inner.lease_ms).await, Ok(true)) {
                return;
            }
        }
        let entry = match store.entry(id).await {
            Ok(entry) => entry,
            Err(e) => {
                tracing::warn!(session = %id, error = %e, "could not read a dormant session");
                self.let_go(id).await;
                return;
            }
        };
        let journalled = entry.is_some();
        let Some((principal, state)) = entry.filter(|(_, state)| state.open) else {
            // Not paused any more: it is not dormant. Not journalled at all (its keys
            // expired from Redis): what is left of it goes.
            let _ = store.wake(id).await;
            if !journalled {
                let _ = store.remove(id).await;
            }
            self.let_go(id).await;
            return;
        };
        let waited = now_ms().saturating_sub(state.paused_ms);
        if waited > expiry_ms {
            if let Some(session) = &here {
                let mut shared = session.lock();
                shared.dormant = None;
                shared.phase = Phase::Done;
                drop(shared);
                self.remove(session);
            }
            if let Err(e) = store.remove(id).await {
                tracing::warn!(session = %id, error = %e, "could not remove an expired session's journal");
            }
            self.let_go(id).await;
            return;
        }
        if waited > tool_timeout_ms && tool_timeout_ms < expiry_ms {
            self.adopt(id, principal, state).await;
            let session = self.map().get(id).cloned();
            if let Some(session) = session {
                if !self.time_out_dormant(&session) {
                    // No place for it now: the next tick tries again.
                    self.drop_dormant(&session);
                    self.let_go(id).await;
                }
            }
            return;
        }
        self.let_go(id).await;
    }

    /// Many nodes: gives up this node's lease on a session it does not hold live.
    async fn let_go(&self, id: &str) {
        if let Some(node) = self.inner.node.as_deref() {
            let _ = self.inner.store.release(id, node).await;
        }
    }

    /// `tool_call_timeout_ms` for a dormant session: its calls get the timeout, as they
    /// would in a live one, and it is brought back by replay to go on. False with no
    /// session place free now (the next tick tries again).
    fn time_out_dormant(&self, session: &Arc<Session>) -> bool {
        let inner = &self.inner;
        let Ok(permit) = inner.slots.clone().try_acquire_owned() else {
            return false;
        };
        // Counted by the store until it wakes: taken past the cap, as on a resume.
        let held = inner.per_principal.force(&session.principal);
        let slot = SessionSlot {
            _permit: permit,
            _held: held,
        };
        let message = format!(
            "no result within tool_call_timeout ({} ms)",
            inner.config.sessions.tool_call_timeout_ms
        );
        let (commands, rx) = mpsc::unbounded_channel();
        let resumed = {
            let mut shared = session.lock();
            let resumed = match &shared.phase {
                Phase::Paused { pause, calls } if shared.dormant.is_some() => Resumed {
                    pause: *pause,
                    digest: None,
                    replies: calls
                        .iter()
                        .map(|(call_id, _)| (call_id.clone(), ToolReply::error("timeout", message.clone())))
                        .collect(),
                    // With the store down, the session stays dormant and the next tick
                    // tries again.
                    undo: Some(Undo {
                        calls: calls.clone(),
                        response: shared.response.copy(),
                        last_resume: shared.last_resume.as_ref().map(LastResume::copy),
                        dormant: shared.dormant,
                        reject: oneshot::channel().0,
                    }),
                },
                _ => return false,
            };
            // The pause's token is stale from now, as on a live session.
            shared.dormant = None;
            self.map().insert(session.id.clone(), session.clone());
            shared.phase = Phase::Running;
            shared.response = ProgrammaticResponse::Running {
                session_id: session.id.clone(),
            }
            .into();
            session.set_commands(Some(commands));
            resumed
        };
        let run_slot = inner.admission.admit_now(&session.principal);
        self.inner
            .drivers
            .spawn(self.clone().revive(session.clone(), rx, slot, run_slot, Some(resumed)));
        true
    }

    /// Brings a dormant session back: runs its program again in a fresh sandbox, and
    /// drives it as a replay (`Driver::run`), after journalling `resumed` (the resume
    /// that woke it; none when it was running as the server stopped).
    async fn revive(
        self,
        session: Arc<Session>,
        rx: mpsc::UnboundedReceiver<DriverCommand>,
        slot: SessionSlot,
        run_slot: Slot,
        mut resumed: Option<Resumed>,
    ) {
        let undo = resumed.as_mut().and_then(|r| r.undo.take());
        let pause = resumed.as_ref().map(|r| r.pause);
        match self.replay_driver(&session, resumed).await {
            Ok((driver, helper)) => {
                // Awake: out of the store's dormant sessions, with the audit trail it
                // kept there (the replay meets its calls by id and lists each once).
                match self.inner.store.wake(&session.id).await {
                    Ok(Some(json)) => {
                        if let Ok(kept) = serde_json::from_str::<sandcall_store::DormantAudit>(&json) {
                            *session.audit() = super::audit::Audit::restore(kept);
                        }
                    }
                    Ok(None) => {}
                    // Its index entry stays: the deadline sweep finds it live and retries.
                    Err(e) => tracing::warn!(session = %session.id, error = %e, "could not mark a session awake"),
                }
                driver.run(helper, rx, slot, run_slot).await
            }
            Err(e) if e.starts_with(STORE_UNAVAILABLE) && undo.is_some() => {
                // Nothing was recorded: the session stays dormant, its token good, and
                // kept by the store alone.
                drop((rx, run_slot, slot));
                if let (Some(undo), Some(pause)) = (undo, pause) {
                    session.undo(pause, undo, &e);
                }
                self.drop_dormant(&session);
            }
            Err(e) if e == TOKEN_USED_ALREADY => {
                // Another node (or a racing copy of it here) used the token first, and
                // runs the session on: only this entry goes, not the journal.
                drop((slot, run_slot));
                self.remove(&session);
                session.publish(
                    Phase::Done,
                    ProgrammaticResponse::Error {
                        session_id: session.id.clone(),
                        error: "another node resumed this session first".into(),
                        error_type: error_type::CONTINUATION_TOKEN_USED.into(),
                        stdout: String::new(),
                        stderr: String::new(),
                    },
                );
            }
            Err(e) => {
                tracing::error!(session = %session.id, error = %e, "a session could not be brought back");
                drop((slot, run_slot));
                self.forget(&session).await;
                session.publish(
                    Phase::Done,
                    ProgrammaticResponse::Error {
                        session_id: session.id.clone(),
                        error: format!("the session could not be brought back: {e}"),
                        error_type: error_type::SANDBOX_FAILURE.into(),
                        stdout: String::new(),
                        stderr: String::new(),
                    },
                );
            }
        }
    }

    async fn replay_driver(
        &self,
        session: &Arc<Session>,
        resumed: Option<Resumed>,
    ) -> Result<(Driver, Helper), String> {
        let inner = &self.inner;
        let id = &session.id;
        let journal = inner
            .store
            .load(id)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("it is no longer journalled")?;
        let mut state = journal.state.clone();
        let mut entries = journal.entries;
        if let Some(resumed) = resumed {
            let answered: Vec<JournalEntry> = resumed
                .replies
                .into_iter()
                .map(|(call_id, reply)| JournalEntry::Reply { call_id, reply })
                .collect();
            state.open = false;
            state.outstanding.retain(|c| {
                !answered
                    .iter()
                    .any(|a| matches!(a, JournalEntry::Reply { call_id, .. } if call_id == c))
            });
            state.last_resume = resumed.digest.map(|digest| (resumed.pause, hex(&digest)));
            state.partial_stdout.clear();
            state.partial_stderr.clear();
            let consumed = inner.store.consume(id, resumed.pause, &answered, &state).await;
            if !consumed.map_err(|e| match e {
                sandcall_store::StoreError::Unavailable(detail) => format!("{STORE_UNAVAILABLE}: {detail}"),
                e => e.to_string(),
            })? {
                return Err(TOKEN_USED_ALREADY.into());
            }
            entries.extend(answered);
        }
        let replay = Replay::new(entries, &state);
        let config = inner.config.clone();
        let request = journal.start.request.clone();
        let cmd = tokio::task::spawn_blocking(move || super::parse_start(request, &config))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.message)?;
        let mut spec = cmd.spec;
        spec.inputs = ops::resolve_inputs(
            &*inner.files,
            &session.principal,
            &cmd.files,
            spec.limits.workspace_bytes,
        )
        .await
        .map_err(|e| e.message)?;
        // A warm sandbox, as the first run had, when one hashes alike: a cold start (a
        // helper, namespaces, a cgroup, the interpreter and the preamble from nothing)
        // was most of a replayed resume's time (docs/scaling.md). A warm Python sandbox
        // built the usual way has a hash seed of its own, which a replay's never is: only
        // forks of a template (`zygote`) share one, so only they are worth a try.
        let hashes = cmd.language != sandcall_api::Language::Python || inner.config.languages.zygote;
        let warm = if cmd.custom_limits || !hashes {
            None
        } else {
            inner.pool.take_or_fork(cmd.language, &spec.code).await
        };
        let warm = match warm {
            Some(helper) if helper.hash_seed().is_none_or(|s| s == journal.start.hash_seed) => Some(helper),
            Some(mut other) => {
                // Another template's seed (rebuilt since, as after a restart): a set could
                // iterate in another order. Given back, and the replay runs cold.
                other.abort();
                tokio::spawn(other.wait());
                None
            }
            None => None,
        };
        if let Some(helper) = &warm {
            spec.run_id = helper.run_id().to_owned();
        }
        let outbox = inner.outbox_dir.join(&spec.run_id);
        spec.collect = Some(Collect {
            outbox: outbox.clone(),
            max_files: inner.config.files.max_output_files,
            max_file_bytes: inner.config.files.max_file_bytes,
            max_total_bytes: spec.limits.workspace_bytes,
        });
        let started = match warm {
            Some(helper) => {
                let names = cmd.tools.names();
                let (go, files) = crate::runtime::warm_go(cmd.language, &cmd.args, Some(&names));
                spec.go = Some(go);
                spec.support_files = files;
                seed_run(&mut spec, cmd.language, journal.start.seed, None);
                helper.begin(spec).await
            }
            None => {
                seed_run(
                    &mut spec,
                    cmd.language,
                    journal.start.seed,
                    Some(journal.start.hash_seed),
                );
                inner.runner.start(spec).await
            }
        };
        let helper = started.map_err(|e| {
            inner.runner.record_failure(&e);
            e.to_string()
        })?;
        let loop_deadline = journal
            .start
            .loop_deadline_ms
            .map(|at| Instant::now() + Duration::from_millis(at.saturating_sub(now_ms())));
        let driver = Driver {
            sessions: self.clone(),
            session: session.clone(),
            tools: cmd.tools,
            max_tool_calls: cmd.max_tool_calls,
            language: cmd.language,
            outbox,
            loop_deadline,
            replay: Some(replay),
            state,
        };
        Ok((driver, helper))
    }
}

/// Dormant sessions acted on per tick of the deadline sweep (`expire_dormant`), at most.
const DUE_BATCH: usize = 256;

/// Why a revive failed when the store had the token used already (by another node, or
/// a timer).
const TOKEN_USED_ALREADY: &str = "its token was used already";

/// How a revive's error begins when the store could not be reached (nothing recorded).
const STORE_UNAVAILABLE: &str = "the session store is unavailable";

/// A session's place among `max_sessions` and among its principal's sessions.
struct SessionSlot {
    _permit: OwnedSemaphorePermit,
    /// Given back when the session ends or goes dormant (the store counts a dormant one).
    _held: Held,
}

/// Counts a session among the paused ones while it is; uncounted when dropped.
struct Paused<'a> {
    count: &'a std::sync::atomic::AtomicUsize,
    now: std::cell::Cell<bool>,
}

impl<'a> Paused<'a> {
    fn new(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        Paused {
            count,
            now: std::cell::Cell::new(false),
        }
    }

    fn set(&self, paused: bool) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.now.replace(paused) != paused {
            if paused {
                self.count.fetch_add(1, SeqCst);
            } else {
                self.count.fetch_sub(1, SeqCst);
            }
        }
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.set(false);
    }
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

/// `text` without its first `*skip` bytes (the output the caller already has), cut at a
/// character boundary; `*skip` goes down by what was cut.
fn skip_sent(text: &str, skip: &mut u64) -> String {
    let mut cut = (*skip).min(text.len() as u64) as usize;
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    *skip -= (cut as u64).min(*skip);
    text[cut..].to_owned()
}

/// A call's checked arguments as the journal keeps them.
fn arguments_box(arguments: &ToolArguments) -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string(arguments.get().to_owned())
        .unwrap_or_else(|_| serde_json::value::RawValue::from_string("null".into()).unwrap_or_default())
}

/// What a dormant session holds for its response: nothing of its pause (GET and a
/// retried resume read that from the store).
fn dormant_placeholder(id: &str) -> Published {
    ProgrammaticResponse::Running {
        session_id: id.to_owned(),
    }
    .into()
}

/// 503: the lease moved to another node while the request was on its way.
fn owner_moved() -> EngineError {
    EngineError {
        retry_after_s: Some(1),
        ..EngineError::new(
            ErrorKind::Unavailable,
            error_type::SESSION_OWNER_UNAVAILABLE,
            "the session is moving between nodes; retry",
        )
    }
}

fn token_used() -> EngineError {
    EngineError::new(
        ErrorKind::Conflict,
        error_type::CONTINUATION_TOKEN_USED,
        "this continuation token was already used or is no longer current",
    )
}

/// What a resume does next.
enum Step {
    /// Hand these replies to the program.
    Go(Vec<(u64, ToolReply)>),
    /// Wait past this version, then look again.
    Wait(u64),
    /// Answer the dormant session's pause, from the store.
    Stored,
}

/// What a use of a token whose pause is no longer open gets.
enum Again {
    /// The answer: the first use's, for a retry, or the session's ending.
    Answer(Result<Bytes, EngineError>),
    /// The retried resume has no answer yet: wait for the next version and look again.
    Wait,
    /// 409.
    Used,
    /// The answer is the pause of a dormant session, kept only in the store.
    Stored,
}

fn answer_again(shared: &mut Shared, version: u64, pause: u64, digest: &[u8; 32]) -> Again {
    if let Some(last) = shared.last_resume.as_mut().filter(|l| l.pause == pause) {
        if last.digest != *digest {
            return Again::Used;
        }
        // A dormant session paused after its last resume: that pause is the answer.
        if shared.dormant.is_some() {
            return Again::Stored;
        }
        return match last.answer.as_mut() {
            // Still the current response: its JSON is the one every request shares.
            Some((at, _)) if *at == version => Again::Answer(published_json(&mut shared.response)),
            Some((_, answer)) => Again::Answer(published_json(answer)),
            // The first use is still on its way to the program; its answer comes
            // with the next published version.
            None => Again::Wait,
        };
    }
    if matches!(shared.phase, Phase::Done) {
        return Again::Answer(published_json(&mut shared.response));
    }
    Again::Used
}

/// A published response's JSON, serialized at most once.
fn published_json(published: &mut Published) -> Result<Bytes, EngineError> {
    if let Some(json) = &published.json {
        return Ok(json.clone());
    }
    let json = Bytes::from(serde_json::to_vec(&published.response).map_err(serialize_failed)?);
    published.json = Some(json.clone());
    Ok(json)
}

/// A digest of a resume's results, the same whatever their order: a retry is told
/// from a different answer by it.
fn results_digest(results: &[ToolResult]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut sorted: Vec<&ToolResult> = results.iter().collect();
    sorted.sort_by(|a, b| a.call_id.cmp(&b.call_id));
    let mut hash = Sha256::new();
    for r in sorted {
        for part in [
            r.call_id.as_str(),
            if r.is_error { "1" } else { "0" },
            r.error_message.as_deref().unwrap_or(""),
            r.result.get(),
        ] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part.as_bytes());
        }
    }
    hash.finalize().into()
}

/// Each result's JSON text must fit `max_tool_result_bytes` (413, the token stays good).
fn check_result_sizes(results: &[ToolResult], max: u64) -> Result<(), EngineError> {
    for r in results {
        let size = r.result.get().len() as u64 + r.error_message.as_ref().map_or(0, |m| m.len() as u64);
        if size > max {
            return Err(EngineError::new(
                ErrorKind::TooLarge,
                error_type::PAYLOAD_TOO_LARGE,
                format!(
                    "the result for call_id {:?} is {size} bytes, over the limit of {max} (max_tool_result_bytes)",
                    r.call_id
                ),
            ));
        }
    }
    Ok(())
}

/// The results answer some or all of the pending calls: each at most once, none
/// unknown, at least one.
fn match_results(calls: &[(String, u64)], results: &[ToolResult]) -> Result<Vec<(u64, ToolReply)>, EngineError> {
    let bad = |m: String| EngineError::new(ErrorKind::Invalid, error_type::INVALID_TOOL_RESULTS, m);
    let mut replies = Vec::with_capacity(calls.len());
    let mut seen = std::collections::HashSet::new();
    for r in results {
        let Some((_, key)) = calls.iter().find(|(id, _)| *id == r.call_id) else {
            return Err(bad(format!(
                "call_id {:?} is not a pending call of this session",
                r.call_id
            )));
        };
        if !seen.insert(r.call_id.as_str()) {
            return Err(bad(format!("call_id {:?} is answered twice", r.call_id)));
        }
        let reply = if r.is_error {
            ToolReply::error(
                "tool_error",
                r.error_message.clone().unwrap_or_else(|| "the tool failed".into()),
            )
        } else {
            ToolReply::result(r.result.clone())
        };
        replies.push((*key, reply));
    }
    if replies.is_empty() {
        let pending: Vec<&str> = calls.iter().map(|(id, _)| id.as_str()).collect();
        return Err(bad(format!(
            "tool_results is empty: answer one or more of the pending calls {}",
            pending.join(", ")
        )));
    }
    Ok(replies)
}

async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn rfc3339_in(d: Duration) -> String {
    humantime::format_rfc3339_millis(SystemTime::now() + d).to_string()
}

/// The task that owns one session's sandbox.
struct Driver {
    sessions: Sessions,
    session: Arc<Session>,
    tools: ToolSet,
    max_tool_calls: u64,
    language: sandcall_api::Language,
    outbox: PathBuf,
    /// When the whole loop must have ended, waits included (`loop_timeout`, or
    /// `timeout` with `programmatic_timeout_scope = "loop"`). The program's own
    /// running time is the helper's clock, which stops while it waits.
    loop_deadline: Option<Instant>,
    /// Set when the program runs again from its journal.
    replay: Option<Replay>,
    /// The session's state as journalled.
    state: SessionState,
}

/// Appends `add`, keeping at most `cap` bytes (cut at a character boundary).
fn push_capped(s: &mut String, add: &str, cap: usize) {
    s.push_str(add);
    if s.len() > cap {
        let mut end = cap;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// How a session ended, besides what the program did.
#[derive(Clone, Copy, PartialEq)]
enum Ending {
    Normal,
    Cancelled,
    Expired,
    /// The loop's deadline passed.
    LoopTimeout,
    /// The replayed program took another path than the journal's.
    Diverged,
    /// The session store refused a write.
    Unjournalled,
    /// Paused and left dormant (evicted, or the server stops): the journal keeps it.
    Dormant,
}

impl Driver {
    /// Runs `ToolSet::check` on a blocking thread, off the async workers, and waits for
    /// it at most `CHECK_TIME_BUDGET`; a call whose check takes longer is refused. A
    /// thread cannot be stopped, so an overrunning check goes on and is kept in
    /// `overrun`: until it ends, this session's next calls are refused at once, and one
    /// session never has more than one check running.
    async fn check(
        &self,
        overrun: &mut Option<JoinHandle<Result<Checked, String>>>,
        name: &str,
        arguments: Option<Value>,
        argv: Option<Vec<String>>,
        budget: ByteBudget,
    ) -> Result<Checked, String> {
        if overrun.as_ref().is_some_and(|h| !h.is_finished()) {
            return Err(format!(
                "the check of an earlier call is still running past its time budget ({} ms); retry later",
                CHECK_TIME_BUDGET.as_millis()
            ));
        }
        *overrun = None;
        let started = Instant::now();
        let checks = self.sessions.inner.checks.clone();
        let Ok(Ok(permit)) = tokio::time::timeout(CHECK_TIME_BUDGET, checks.acquire_owned()).await else {
            return Err(format!(
                "the server is busy checking other calls; {name} was not checked within {} ms, retry later",
                CHECK_TIME_BUDGET.as_millis()
            ));
        };
        let tools = self.tools.clone();
        let owned = name.to_owned();
        // The permit goes with the check, and is given back when it ends, overrun or not.
        let mut handle = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            tools.check(&owned, arguments, argv, &budget).map_err(|e| e.to_string())
        });
        let left = CHECK_TIME_BUDGET.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, &mut handle).await {
            Ok(Ok(verdict)) => verdict,
            Ok(Err(e)) => {
                tracing::error!(session = %self.session.id, error = %e, "a tool-call check failed");
                Err("the call could not be checked".into())
            }
            Err(_) => {
                *overrun = Some(handle);
                Err(format!(
                    "checking the arguments of {name} against its schema took longer than {} ms",
                    CHECK_TIME_BUDGET.as_millis()
                ))
            }
        }
    }

    async fn run(
        mut self,
        mut helper: Helper,
        mut commands: mpsc::UnboundedReceiver<DriverCommand>,
        slot: SessionSlot,
        run_slot: Slot,
    ) {
        // Held while the program runs; dropped at each pause, given back with each resume.
        let mut run_slot = Some(run_slot);
        let admission = self.sessions.inner.admission.clone();
        let paused_count = Paused::new(&self.sessions.inner.paused);
        let config = self.sessions.inner.config.clone();
        let tool_timeout = Duration::from_millis(config.sessions.tool_call_timeout_ms);
        let expiry = Duration::from_secs(config.sessions.session_expiry_s);
        let mut shutdown = self.sessions.inner.shutdown.clone();
        let id = self.session.id.clone();
        // Calls checked and waiting to be handed out at the next pause.
        let mut pending: Vec<(u64, String, ToolArguments)> = Vec::new();
        // What a paused session holds in the server is bounded by config (P =
        // max_pause_bytes, O = max_output_bytes):
        //   P       the arguments of the published pause, kept once as the checked JSON
        //           text (`arguments` and `input` share it);
        //   2P + 12O the JSON of the paused response, once a GET asked for it (both
        //           keys, and the partial output escaped, at worst 6 bytes a byte);
        //   P       calls made while paused, waiting here for the next pause under the
        //           same budget;
        //   2O      the partial output (`carry`, then in the response);
        //   and the token, call ids and names (~150 bytes a call, at most
        //   max_tool_calls calls), plus a few KiB of fixed state.
        // With the defaults: about 4 × 4 MiB + 14 × 64 KiB + 15 KiB ≈ 17 MiB at most.
        let mut pending_bytes = 0u64;
        // Over the session's life, at most max_session_tool_bytes.
        let mut session_bytes = 0u64;
        // A check that ran past its time budget and is still running (see `check`).
        let mut overrun: Option<JoinHandle<Result<Checked, String>>> = None;
        // Calls handed out and not answered yet, listed again in the next pause when a
        // resume answers only some of them.
        let mut outstanding: Vec<(String, u64, String, ToolArguments)> = Vec::new();
        let mut loop_deadline = self.loop_deadline;
        let mut replay = self.replay.take();
        // The journal's view of the session, written before each answer that depends on it.
        let mut state = std::mem::take(&mut self.state);
        let store = self.sessions.inner.store.clone();
        let evict = Duration::from_secs(config.sessions.session_idle_evict_s);
        let mut accepted = 0u64;
        let mut delivered = state.calls_made;
        let mut pause = state.pause;
        let mut carry = (String::new(), String::new());
        let mut paused_at: Option<Instant> = None;
        let mut ending = Ending::Normal;
        // A resume won the race with a timer: its results are queued, and until they
        // are handled no new pause may be published (their call keys would be cleared
        // with the old ones).
        let mut results_on_their_way = false;
        // The store could not mark this pause dormant: it is not evicted (it stays live).
        let mut keep_live = false;
        // Answers of the MCP servers the program's calls went to: (call key, reply).
        let (mcp_tx, mut mcp_rx) = mpsc::unbounded_channel::<(u64, ToolReply)>();

        let outcome = loop {
            tokio::select! {
                event = helper.next_event() => match event {
                    Ok(Event::ToolCall { key, name, arguments, argv }) => {
                        let verdict = if accepted >= self.max_tool_calls {
                            Err(format!("over the budget of {} tool calls for this run (max_tool_calls)", self.max_tool_calls))
                        } else {
                            let budget = ByteBudget {
                                max_call: config.sessions.max_tool_call_bytes,
                                max_pause: config.sessions.max_pause_bytes,
                                pause_used: pending_bytes,
                                max_session: config.sessions.max_session_tool_bytes,
                                session_used: session_bytes,
                            };
                            self.check(&mut overrun, &name, arguments, argv, budget).await
                        };
                        match verdict {
                            Ok(checked) => {
                                accepted += 1;
                                session_bytes += checked.size;
                                // A tool of an MCP server: sandcall calls it, and the caller
                                // never sees the call. Not journalled: a replay calls it again.
                                if let Some(server) = self.tools.mcp_server(&name) {
                                    let call_id = ids::new_id();
                                    {
                                        let mut audit = self.session.audit();
                                        audit.requested(&id, key, &name, checked.arguments.get());
                                        audit.sent_to_mcp(&id, key, &call_id, server);
                                    }
                                    let (mcp, server, tx) = (self.sessions.inner.mcp.clone(), server.to_owned(), mcp_tx.clone());
                                    tokio::spawn(async move {
                                        let reply = mcp.call(&server, &name, checked.arguments.get(), tool_timeout).await;
                                        let _ = tx.send((key, reply));
                                    });
                                    continue;
                                }
                                // A replay answers the journalled calls from the journal.
                                if let Some(replay) = replay.as_mut().filter(|r| !r.calls.is_empty()) {
                                    match replay.meet(&name, checked.arguments.get()) {
                                        Some(call_id) => match replay.replies.remove(&call_id) {
                                            Some(reply) => {
                                                {
                                                    let mut audit = self.session.audit();
                                                    audit.replayed(key, &call_id, &name, checked.arguments.get());
                                                    audit.answered(&id, key, &reply);
                                                }
                                                let _ = helper.send(&Command::Reply { key, reply }).await;
                                            }
                                            // Handed out before and not answered yet: it is
                                            // handed out again at the next pause.
                                            None => {
                                                self.session.audit().replayed(key, &call_id, &name, checked.arguments.get());
                                                outstanding.push((call_id, key, name, ToolArguments::new(checked.arguments)));
                                            }
                                        },
                                        None => {
                                            tracing::info!(session = %id, call = %name, "the replayed program took another path");
                                            if ending == Ending::Normal {
                                                ending = Ending::Diverged;
                                            }
                                            helper.abort();
                                        }
                                    }
                                    continue;
                                }
                                pending_bytes += checked.size;
                                self.session.audit().requested(&id, key, &name, checked.arguments.get());
                                pending.push((key, name, ToolArguments::new(checked.arguments)));
                            }
                            Err(reason) => {
                                // A replay meets again the refusals the first run met
                                // before its last journalled call: listed once.
                                if replay.as_ref().is_none_or(|r| r.calls.is_empty()) {
                                    self.session.audit().refused(&id, &name, &reason);
                                }
                                let _ = helper.send(&Command::Reply { key, reply: ToolReply::error("refused", reason) }).await;
                            }
                        }
                    }
                    Ok(Event::Blocked { mut partial_stdout, mut partial_stderr }) => {
                        if let Some(replay) = replay.as_mut() {
                            // What the caller already has is not sent twice.
                            partial_stdout = skip_sent(&partial_stdout, &mut replay.skip_stdout);
                            partial_stderr = skip_sent(&partial_stderr, &mut replay.skip_stderr);
                        }
                        let cap = config.limits.max_output_bytes as usize;
                        push_capped(&mut carry.0, &partial_stdout, cap);
                        push_capped(&mut carry.1, &partial_stderr, cap);
                        if (pending.is_empty() && outstanding.is_empty())
                            || paused_at.is_some()
                            || results_on_their_way
                            || ending != Ending::Normal
                        {
                            continue;
                        }
                        pause += 1;
                        let mut handed = Vec::with_capacity(outstanding.len() + pending.len());
                        let mut calls = Vec::with_capacity(outstanding.len() + pending.len());
                        // Calls a partial resume left unanswered come first, under their ids.
                        for (call_id, key, name, arguments) in &outstanding {
                            handed.push((call_id.clone(), *key));
                            calls.push(ToolCall::new(call_id.clone(), name.clone(), arguments.clone()));
                        }
                        let mut entries = Vec::with_capacity(pending.len());
                        for (key, name, arguments) in pending.drain(..) {
                            let call_id = ids::new_id();
                            self.session.audit().handed_out(&id, key, &call_id);
                            handed.push((call_id.clone(), key));
                            outstanding.push((call_id.clone(), key, name.clone(), arguments.clone()));
                            entries.push(JournalEntry::Call {
                                pause,
                                call_id: call_id.clone(),
                                name: name.clone(),
                                arguments: arguments_box(&arguments),
                            });
                            calls.push(ToolCall::new(call_id, name, arguments));
                        }
                        pending_bytes = 0;
                        delivered = accepted;
                        let (partial_stdout, partial_stderr) = std::mem::take(&mut carry);
                        let response = ProgrammaticResponse::ToolCallRequired {
                            session_id: id.clone(),
                            continuation_token: self.sessions.inner.key.sign(&id, pause),
                            tool_calls: calls,
                            partial_stdout,
                            partial_stderr,
                            // The token is good until the first timer runs out.
                            expires_at: rfc3339_in(tool_timeout.min(expiry).min(
                                loop_deadline.map_or(Duration::MAX, |d| d.saturating_duration_since(Instant::now())),
                            )),
                        };
                        let json = serialized(&response).await;
                        // Journalled before the caller may see the token.
                        state.pause = pause;
                        state.open = true;
                        state.outstanding = outstanding.iter().map(|(c, ..)| c.clone()).collect();
                        if let ProgrammaticResponse::ToolCallRequired { partial_stdout, partial_stderr, expires_at, .. } = &response {
                            state.stdout_sent += partial_stdout.len() as u64;
                            state.stderr_sent += partial_stderr.len() as u64;
                            state.partial_stdout.clone_from(partial_stdout);
                            state.partial_stderr.clone_from(partial_stderr);
                            state.expires_at.clone_from(expires_at);
                        }
                        state.calls_made = delivered;
                        state.paused_ms = now_ms();
                        // A store that is down for a moment (Redis restarting) is waited
                        // for, up to 10 s: the pause is handed out once it is recorded.
                        let mut appended = store.append(&id, &entries, &state).await;
                        for _ in 0..20 {
                            if !matches!(appended, Err(sandcall_store::StoreError::Unavailable(_))) {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            appended = store.append(&id, &entries, &state).await;
                        }
                        if let Err(e) = appended {
                            tracing::error!(session = %id, error = %e, "could not journal a pause");
                            ending = Ending::Unjournalled;
                            helper.abort();
                            continue;
                        }
                        paused_at = Some(Instant::now());
                        keep_live = false;
                        self.session.publish_json(Phase::Paused { pause, calls: handed }, response, json);
                        // Waiting for the caller takes no CPU: the slot goes to someone else.
                        run_slot = None;
                        paused_count.set(true);
                    }
                    Ok(Event::Finished { result }) => {
                        // A replay that ends before meeting every journalled call took
                        // another path.
                        if replay.as_ref().is_some_and(|r| !r.calls.is_empty()) && ending == Ending::Normal {
                            ending = Ending::Diverged;
                        }
                        break Ok(result);
                    }
                    Ok(Event::Failed { message }) => break Err(RunError::Sandbox(message)),
                    Ok(Event::Ready { .. }) => {}
                    Err(e) => break Err(e),
                },
                Some((key, reply)) = mcp_rx.recv() => {
                    self.session.audit().answered(&id, key, &reply);
                    let _ = helper.send(&Command::Reply { key, reply }).await;
                },
                command = commands.recv() => match command {
                    Some(DriverCommand::Results(replies, slot, digest, undo)) => {
                        let was_paused_at = paused_at.take();
                        results_on_their_way = false;
                        run_slot = Some(slot);
                        paused_count.set(false);
                        // Journalled before the program gets them: the token is used. The
                        // replies move into the journal's entries and back out, never
                        // copied (a resume may carry many MiB of results).
                        let mut keys = Vec::with_capacity(replies.len());
                        let mut unjournalled = Vec::new();
                        let mut entries: Vec<JournalEntry> = Vec::with_capacity(replies.len());
                        for (key, reply) in replies {
                            match outstanding.iter().find(|(_, k, _, _)| *k == key) {
                                Some((call_id, ..)) => {
                                    keys.push(key);
                                    entries.push(JournalEntry::Reply { call_id: call_id.clone(), reply });
                                }
                                None => unjournalled.push((key, reply)),
                            }
                        }
                        // The pause's state, put back if the store cannot take the resume.
                        let before = (
                            state.open,
                            state.outstanding.clone(),
                            state.last_resume.take(),
                            std::mem::take(&mut state.partial_stdout),
                            std::mem::take(&mut state.partial_stderr),
                        );
                        state.open = false;
                        state.outstanding.retain(|c| !entries.iter().any(|e| matches!(e, JournalEntry::Reply { call_id, .. } if call_id == c)));
                        state.last_resume = Some((pause, hex(&digest)));
                        let consumed = store.consume(&id, pause, &entries, &state).await;
                        if let Err(sandcall_store::StoreError::Unavailable(detail)) = &consumed {
                            // Nothing was recorded: the pause goes on as it was, its token
                            // good, and the resume gets 503.
                            (
                                state.open,
                                state.outstanding,
                                state.last_resume,
                                state.partial_stdout,
                                state.partial_stderr,
                            ) = before;
                            self.session.undo(pause, *undo, detail);
                            paused_at = was_paused_at.or_else(|| Some(Instant::now()));
                            run_slot = None;
                            paused_count.set(true);
                            continue;
                        }
                        drop(undo);
                        if !matches!(consumed, Ok(true)) {
                            tracing::error!(session = %id, "could not journal a resume");
                            ending = Ending::Unjournalled;
                            helper.abort();
                            continue;
                        }
                        let journalled = keys.into_iter().zip(entries).filter_map(|(key, entry)| match entry {
                            JournalEntry::Reply { reply, .. } => Some((key, reply)),
                            JournalEntry::Call { .. } => None,
                        });
                        for (key, reply) in journalled.chain(unjournalled) {
                            outstanding.retain(|(_, k, _, _)| *k != key);
                            self.session.audit().answered(&id, key, &reply);
                            let _ = helper.send(&Command::Reply { key, reply }).await;
                        }
                    }
                    Some(DriverCommand::Abandon) => {
                        if ending == Ending::Normal {
                            ending = Ending::Unjournalled;
                        }
                        self.session.unpause();
                        helper.abort();
                    }
                    Some(DriverCommand::Cancel) => {
                        if ending == Ending::Normal {
                            ending = Ending::Cancelled;
                        }
                        helper.abort();
                    }
                    None => {}
                },
                _ = until(paused_at.map(|t| t + tool_timeout)) => {
                    // The caller did not answer in time: the program gets TimeoutError and
                    // goes on; the token of this pause is stale from now.
                    paused_at = None;
                    if !self.session.unpause() {
                        results_on_their_way = true;
                        continue;
                    }
                    // The program goes on without its caller, so it cannot wait in the queue.
                    run_slot = Some(admission.admit_now(&self.session.principal));
                    paused_count.set(false);
                    let message = format!("no result within tool_call_timeout ({} ms)", config.sessions.tool_call_timeout_ms);
                    let entries: Vec<JournalEntry> = outstanding
                        .iter()
                        .map(|(call_id, ..)| JournalEntry::Reply {
                            call_id: call_id.clone(),
                            reply: ToolReply::error("timeout", message.clone()),
                        })
                        .collect();
                    state.open = false;
                    state.outstanding.clear();
                    state.partial_stdout.clear();
                    state.partial_stderr.clear();
                    if !matches!(store.consume(&id, pause, &entries, &state).await, Ok(true)) {
                        tracing::error!(session = %id, "could not journal a tool-call timeout");
                        ending = Ending::Unjournalled;
                        helper.abort();
                        continue;
                    }
                    for (_, key, _, _) in outstanding.drain(..) {
                        let reply = ToolReply::error("timeout", message.clone());
                        self.session.audit().answered(&id, key, &reply);
                        let _ = helper.send(&Command::Reply { key, reply }).await;
                    }
                },
                _ = until(paused_at.map(|t| t + expiry)) => {
                    paused_at = None;
                    if !self.session.unpause() {
                        results_on_their_way = true;
                        continue;
                    }
                    ending = Ending::Expired;
                    // Gone for every later request from now, not once the sandbox is
                    // reclaimed; requests already waiting still get the ending.
                    self.sessions.remove(&self.session);
                    helper.abort();
                },
                _ = until(paused_at.filter(|_| !evict.is_zero() && !keep_live).map(|t| t + evict)) => {
                    // Idle for session_idle_evict_s: the sandbox goes, the journal stays.
                    // The store marks it dormant first (its deadlines, its principal's
                    // count, its audit trail): from then on nothing of it needs memory.
                    if !self.sessions.sleep_in_store(&self.session, state.paused_ms).await {
                        keep_live = true;
                        continue;
                    }
                    paused_at = None;
                    if !self.session.make_dormant(state.paused_ms) {
                        // A resume got there first: it is not dormant after all.
                        let _ = store.wake(&id).await;
                        results_on_their_way = true;
                        continue;
                    }
                    ending = Ending::Dormant;
                    helper.abort();
                },
                _ = until(loop_deadline) => {
                    // The whole loop's budget is spent, waits included.
                    loop_deadline = None;
                    if ending == Ending::Normal {
                        ending = Ending::LoopTimeout;
                    }
                    self.session.unpause();
                    helper.abort();
                },
                _ = async { let _ = shutdown.wait_for(|stop| *stop).await; }, if !helper.aborted() => {
                    // A paused session outlives the server in its journal, dormant (if the
                    // store cannot mark it so now, the next start does: `recover`).
                    if paused_at.is_some() {
                        let slept = self.sessions.sleep_in_store(&self.session, state.paused_ms).await;
                        if self.session.make_dormant(state.paused_ms) {
                            ending = Ending::Dormant;
                        } else if slept {
                            let _ = store.wake(&id).await;
                        }
                    }
                    helper.abort();
                },
            }
        };
        self.session.audit().run_ended();
        if ending == Ending::Dormant {
            // The session stays paused, in the store alone: its entry here goes (unless a
            // resume woke it meanwhile), and its places with it (the store counts it
            // among its principal's sessions). Its resume brings it back by replay
            // (`Sessions::revive`).
            drop(commands);
            helper.wait().await;
            drop(run_slot);
            drop(paused_count);
            drop(slot);
            self.sessions.drop_dormant(&self.session);
            let _ = tokio::fs::remove_dir_all(&self.outbox).await;
            // No sandbox holds it now: any node may bring it back.
            if let Some(node) = &self.sessions.inner.node {
                if let Err(e) = store.release(&id, node).await {
                    tracing::warn!(session = %id, error = %e, "could not release a session's lease");
                }
            }
            return;
        }
        // No resume reaches the program from here: one that comes later finds the session
        // no longer paused (409), and results already queued are dropped with the
        // receiver, and with them the run slots their resumes took.
        self.session.unpause();
        drop(commands);
        // The sandbox is gone once the helper has exited; only then are the slots free.
        helper.wait().await;
        drop(run_slot);
        drop(paused_count);
        drop(slot);
        // The session has ended: its journal goes. Unless many nodes share it and this
        // node could not write it: another node may have moved the session on.
        let shared_and_lost = ending == Ending::Unjournalled && self.sessions.inner.node.is_some();
        if shared_and_lost {
            tracing::warn!(session = %id, "a session's journal moved on without this node; its copy here ends");
        } else if let Err(e) = store.remove(&id).await {
            tracing::warn!(session = %id, error = %e, "could not remove a session's journal");
        }
        // The ending holds the whole run's output, as a live one does: the replay
        // printed all of it again, once.
        let wall_ms = outcome.as_ref().map_or(0, |r| r.wall_time_ms);
        let response = match outcome {
            // Only a completed run has output files to give: an `error` answer has no
            // field for them, so nothing is stored that nobody would be told about.
            Ok(mut result) if ending == Ending::Normal && !result.timed_out && !result.aborted => {
                let inner = &self.sessions.inner;
                let stored = ops::ingest_outputs(
                    &*inner.files,
                    &self.session.principal,
                    &id,
                    &inner.config,
                    &self.outbox,
                    &mut result,
                )
                .await;
                self.ending(result, ending, delivered, stored)
            }
            Ok(result) => {
                let _ = tokio::fs::remove_dir_all(&self.outbox).await;
                self.ending(result, ending, delivered, (Vec::new(), Vec::new(), 0))
            }
            Err(e) => {
                let _ = tokio::fs::remove_dir_all(&self.outbox).await;
                self.failure(&e)
            }
        };
        let status = match &response {
            ProgrammaticResponse::Completed { .. } => "completed",
            ProgrammaticResponse::Error { error_type, .. } => error_type.as_str(),
            ProgrammaticResponse::ToolCallRequired { .. } | ProgrammaticResponse::Running { .. } => "paused",
        };
        let config = &self.sessions.inner.config;
        crate::telemetry::run_ended(
            "programmatic",
            crate::runtime::languages::name(self.language, config),
            status,
            wall_ms,
        );
        if ending == Ending::Expired {
            // An expired session is gone: resuming it gets 404.
            self.session.publish(Phase::Done, response);
            self.sessions.remove(&self.session);
            return;
        }
        self.session.publish(Phase::Done, response);
        // The ended session stays readable (GET) for a while, then goes; at shutdown at
        // once (nothing serves a GET then), so that the server's wait for its drivers
        // is not a wait for these.
        let mut shutdown = self.sessions.inner.shutdown.clone();
        tokio::select! {
            _ = tokio::time::sleep(expiry) => {}
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
        self.sessions.remove(&self.session);
    }

    fn ending(
        &self,
        result: RunResult,
        ending: Ending,
        delivered: u64,
        (files, files_skipped, files_skipped_total): (Vec<OutputFile>, Vec<SkippedFile>, usize),
    ) -> ProgrammaticResponse {
        let session_id = self.session.id.clone();
        let mut result = result;
        // A diverged replay was stopped by the server: no note about it on stderr.
        if ending != Ending::Diverged {
            let notes = crate::exec::sandbox_notes(&result, self.sessions.inner.config.limits.max_output_bytes);
            crate::exec::append_notes(&mut result.stderr, &notes);
        }
        let error = |error_type: &str, error: String| ProgrammaticResponse::Error {
            session_id: session_id.clone(),
            error,
            error_type: error_type.into(),
            stdout: result.stdout.clone(),
            stderr: result.stderr.clone(),
        };
        match ending {
            Ending::Cancelled => return error(error_type::CANCELLED, "the session was cancelled".into()),
            Ending::Expired => {
                return error(
                    error_type::SESSION_EXPIRED,
                    "the session was not resumed within session_expiry".into(),
                )
            }
            Ending::LoopTimeout => {
                return error(
                    error_type::TIMEOUT,
                    "the session did not finish within its loop timeout".into(),
                )
            }
            Ending::Diverged => {
                return error(
                    error_type::REPLAY_DIVERGED,
                    "the program, run again from its journal, took another path (another tool call, other \
                     arguments, or an end before a journalled call); its earlier answers no longer apply"
                        .into(),
                )
            }
            Ending::Unjournalled => {
                return error(
                    error_type::INTERNAL,
                    "the session could not be written to the session store".into(),
                )
            }
            Ending::Normal | Ending::Dormant => {}
        }
        if result.timed_out {
            // The same words as the note on stderr: LibreChat shows the model `error`.
            return error(error_type::TIMEOUT, "[sandbox] Time limit exceeded".into());
        }
        if result.aborted {
            return error(error_type::SHUTTING_DOWN, "the server is shutting down".into());
        }
        ProgrammaticResponse::Completed {
            session_id: session_id.clone(),
            stdout: result.stdout,
            stderr: result.stderr,
            files,
            files_skipped,
            files_skipped_total,
            tool_calls_made: delivered,
            execution_time: result.wall_time_ms,
            exit_code: result.exit_code,
            signal: result.signal,
            timed_out: false,
            stdout_truncated: result.stdout_truncated,
            stderr_truncated: result.stderr_truncated,
        }
    }

    fn failure(&self, e: &RunError) -> ProgrammaticResponse {
        self.sessions.inner.runner.record_failure(e);
        tracing::error!(session = %self.session.id, error = %e, "programmatic session failed");
        ProgrammaticResponse::Error {
            session_id: self.session.id.clone(),
            error: "the sandbox failed".into(),
            error_type: error_type::SANDBOX_FAILURE.into(),
            stdout: String::new(),
            stderr: String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(id: &str, value: Value) -> ToolResult {
        ToolResult {
            call_id: id.into(),
            result: serde_json::value::to_raw_value(&value).unwrap(),
            is_error: false,
            error_message: None,
        }
    }

    #[test]
    fn results_answer_some_or_all_of_the_pending_calls() {
        let calls = vec![("a".to_string(), 1), ("b".to_string(), 2)];
        let ok = match_results(&calls, &[result("b", Value::from(2)), result("a", Value::from(1))]).unwrap();
        assert_eq!(ok.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![2, 1]);
        // Some of them: the rest wait for the next pause.
        let some = match_results(&calls, &[result("b", Value::Null)]).unwrap();
        assert_eq!(some.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![2]);
        for bad in [
            vec![
                result("a", Value::Null),
                result("b", Value::Null),
                result("c", Value::Null),
            ],
            vec![result("a", Value::Null), result("a", Value::Null)],
            vec![],
        ] {
            assert_eq!(
                match_results(&calls, &bad).unwrap_err().error_type,
                "invalid_tool_results"
            );
        }
    }

    #[test]
    fn a_retry_is_told_by_its_results_whatever_their_order() {
        let one = [result("a", Value::from(1)), result("b", Value::from("x"))];
        let same = [result("b", Value::from("x")), result("a", Value::from(1))];
        let other = [result("a", Value::from(2)), result("b", Value::from("x"))];
        assert_eq!(results_digest(&one), results_digest(&same));
        assert_ne!(results_digest(&one), results_digest(&other));
        let mut failed = result("a", Value::from(1));
        failed.is_error = true;
        assert_ne!(results_digest(&one[..1]), results_digest(&[failed]));
    }

    #[test]
    fn results_over_max_tool_result_bytes_are_refused() {
        let big = result("a", Value::from("x".repeat(100)));
        assert!(check_result_sizes(std::slice::from_ref(&big), 102).is_ok());
        let err = check_result_sizes(&[big], 101).unwrap_err();
        assert_eq!(err.kind, ErrorKind::TooLarge);
        assert!(err.message.contains("max_tool_result_bytes"), "{}", err.message);
    }

    #[test]
    fn errors_become_tool_errors() {
        let calls = vec![("a".to_string(), 7)];
        let r = ToolResult {
            call_id: "a".into(),
            result: Default::default(),
            is_error: true,
            error_message: Some("boom".into()),
        };
        let replies = match_results(&calls, &[r]).unwrap();
        assert_eq!(replies[0].1, ToolReply::error("tool_error", "boom"));
    }
}
