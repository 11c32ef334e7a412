//! The task that owns one session's sandbox: it reads the helper's events, publishes
//! pauses, hands results in, and runs the session's timers. `Driver::run` is a small
//! loop that waits for the first of them (`Wake`) and hands it to its handler: the
//! helper's events (`on_event`), the requests' commands (`on_command`) and the timers
//! (`on_timer`).

use super::*;
use crate::isolation::HelperChannel;

/// What a session's driver starts from: filled in by `Sessions::start` and by a replay.
pub(super) struct DriverSpec {
    pub(super) sessions: Sessions,
    pub(super) session: Arc<Session>,
    pub(super) tools: ToolSet,
    pub(super) max_tool_calls: u64,
    pub(super) language: sandcall_api::Language,
    pub(super) outbox: PathBuf,
    /// The isolation tier the session's sandbox is from.
    pub(super) tier: Arc<dyn IsolationTier>,
    /// When the whole loop must have ended, waits included (`loop_timeout`, or
    /// `timeout` with `programmatic_timeout_scope = "loop"`). The program's own
    /// running time is the helper's clock, which stops while it waits.
    pub(super) loop_deadline: Option<Instant>,
    /// Set when the program runs again from its journal.
    pub(super) replay: Option<Replay>,
    /// The session's state as journalled.
    pub(super) state: SessionState,
    /// The inputs staged: what `ops::ingest` lists as kept, changed or deleted.
    pub(super) staged: Vec<sandcall_sandbox::protocol::InputFile>,
    /// The workspace the session runs in, if any.
    pub(super) held: Option<SessionWorkspace>,
    /// The session's way out, when it was granted network: served until it ends.
    pub(super) endpoint: Option<crate::egress::Endpoint>,
}

impl DriverSpec {
    /// Drives the session to its end: the task that owns its sandbox.
    pub(super) async fn run(
        self,
        helper: Box<dyn HelperChannel>,
        commands: mpsc::UnboundedReceiver<DriverCommand>,
        slot: SessionSlot,
        run_slot: Slot,
    ) {
        let driver = Driver::new(self, helper, commands, slot, run_slot);
        driver.run().await;
    }
}

/// How a session ended, besides what the program did.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Ending {
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

/// What the program's run came to: its result, or how the sandbox failed.
type Outcome = Result<RunResult, RunError>;

/// What woke the driver.
enum Wake {
    /// The helper's next event.
    Event(Result<Event, RunError>),
    /// An MCP server answered one of the program's calls: (call key, reply).
    McpReply(u64, ToolReply),
    /// A request's command (resume, cancel, ...); None once every sender is gone.
    Command(Option<DriverCommand>),
    Timer(Timer),
    /// The server stops.
    Shutdown,
}

/// The driver's timers.
#[derive(Clone, Copy)]
enum Timer {
    /// Paused for `tool_call_timeout`.
    ToolCall,
    /// Paused for `session_expiry`.
    Expiry,
    /// Paused for `session_idle_evict_s`.
    Evict,
    /// The whole loop's deadline.
    Loop,
}

/// The task that owns one session's sandbox, and what it holds while it runs.
pub(super) struct Driver {
    sessions: Sessions,
    session: Arc<Session>,
    tools: ToolSet,
    max_tool_calls: u64,
    language: sandcall_api::Language,
    outbox: PathBuf,
    tier: Arc<dyn IsolationTier>,
    helper: Box<dyn HelperChannel>,
    commands: mpsc::UnboundedReceiver<DriverCommand>,
    config: Arc<Config>,
    store: Arc<dyn SessionStore>,
    id: String,
    tool_timeout: Duration,
    expiry: Duration,
    evict: Duration,
    shutdown: watch::Receiver<bool>,
    /// The session's place among `max_sessions`, held to the end.
    slot: Option<SessionSlot>,
    /// Held while the program runs; dropped at each pause, given back with each resume.
    run_slot: Option<Slot>,
    paused_count: Option<Paused>,
    /// Calls checked and waiting to be handed out at the next pause.
    pending: Vec<(u64, String, ToolArguments)>,
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
    pending_bytes: u64,
    /// Over the session's life, at most max_session_tool_bytes.
    session_bytes: u64,
    /// A check that ran past its time budget and is still running (see `check`).
    overrun: Option<JoinHandle<Result<Checked, String>>>,
    /// Calls handed out and not answered yet, listed again in the next pause when a
    /// resume answers only some of them.
    outstanding: Vec<(String, u64, String, ToolArguments)>,
    /// See `DriverSpec::loop_deadline`; None once it has passed.
    loop_deadline: Option<Instant>,
    replay: Option<Replay>,
    /// The journal's view of the session, written before each answer that depends on it.
    state: SessionState,
    accepted: u64,
    delivered: u64,
    pause: u64,
    carry: (String, String),
    paused_at: Option<Instant>,
    ending: Ending,
    /// A resume won the race with a timer: its results are queued, and until they
    /// are handled no new pause may be published (their call keys would be cleared
    /// with the old ones).
    results_on_their_way: bool,
    /// The store could not mark this pause dormant: it is not evicted (it stays live).
    keep_live: bool,
    /// Answers of the MCP servers the program's calls went to: (call key, reply).
    mcp_tx: mpsc::UnboundedSender<(u64, ToolReply)>,
    mcp_rx: mpsc::UnboundedReceiver<(u64, ToolReply)>,
    staged: Vec<sandcall_sandbox::protocol::InputFile>,
    held: Option<SessionWorkspace>,
    endpoint: Option<crate::egress::Endpoint>,
}

impl Driver {
    fn new(
        spec: DriverSpec,
        helper: Box<dyn HelperChannel>,
        commands: mpsc::UnboundedReceiver<DriverCommand>,
        slot: SessionSlot,
        run_slot: Slot,
    ) -> Driver {
        let DriverSpec {
            sessions,
            session,
            tools,
            max_tool_calls,
            language,
            outbox,
            tier,
            loop_deadline,
            replay,
            state,
            staged,
            held,
            endpoint,
        } = spec;
        let config = sessions.inner.config.clone();
        let (mcp_tx, mcp_rx) = mpsc::unbounded_channel::<(u64, ToolReply)>();
        Driver {
            tier,
            paused_count: Some(Paused::new(sessions.inner.clone())),
            store: sessions.inner.store.clone(),
            shutdown: sessions.inner.shutdown.clone(),
            id: session.id.clone(),
            tool_timeout: Duration::from_millis(config.sessions.tool_call_timeout_ms),
            expiry: Duration::from_secs(config.sessions.session_expiry_s),
            evict: Duration::from_secs(config.sessions.session_idle_evict_s),
            config,
            sessions,
            session,
            tools,
            max_tool_calls,
            language,
            outbox,
            helper,
            commands,
            slot: Some(slot),
            run_slot: Some(run_slot),
            pending: Vec::new(),
            pending_bytes: 0,
            session_bytes: 0,
            overrun: None,
            outstanding: Vec::new(),
            loop_deadline,
            replay,
            accepted: 0,
            delivered: state.calls_made,
            pause: state.pause,
            state,
            carry: (String::new(), String::new()),
            paused_at: None,
            ending: Ending::Normal,
            results_on_their_way: false,
            keep_live: false,
            mcp_tx,
            mcp_rx,
            staged,
            held,
            endpoint,
        }
    }

    /// Moves the workspace's lease on, if the session holds one.
    async fn renew_workspace(&mut self) {
        if let Some(held) = &self.held {
            held.renew(&self.id).await;
        }
    }

    /// Waits for the first thing that happens and hands it to its handler, until the
    /// program's run has ended; then ends the session.
    async fn run(mut self) {
        let outcome = loop {
            let wake = self.next_wake().await;
            let ended = match wake {
                Wake::Event(event) => self.on_event(event).await,
                Wake::McpReply(key, reply) => {
                    self.reply(key, reply).await;
                    None
                }
                Wake::Command(command) => {
                    self.on_command(command).await;
                    None
                }
                Wake::Timer(timer) => {
                    self.on_timer(timer).await;
                    None
                }
                Wake::Shutdown => {
                    self.on_shutdown().await;
                    None
                }
            };
            if let Some(outcome) = ended {
                break outcome;
            }
        };
        self.finish(outcome).await;
    }

    /// The first of the helper's next event, an MCP answer, a command, a timer and
    /// the server's shutdown.
    async fn next_wake(&mut self) -> Wake {
        let tool_call = self.paused_at.map(|t| t + self.tool_timeout);
        let expiry = self.paused_at.map(|t| t + self.expiry);
        let evict = self
            .paused_at
            .filter(|_| !self.evict.is_zero() && !self.keep_live)
            .map(|t| t + self.evict);
        let loop_deadline = self.loop_deadline;
        let aborted = self.helper.aborted();
        let shutdown = &mut self.shutdown;
        tokio::select! {
            event = self.helper.next_event() => Wake::Event(event),
            Some((key, reply)) = self.mcp_rx.recv() => Wake::McpReply(key, reply),
            command = self.commands.recv() => Wake::Command(command),
            _ = until(tool_call) => Wake::Timer(Timer::ToolCall),
            _ = until(expiry) => Wake::Timer(Timer::Expiry),
            _ = until(evict) => Wake::Timer(Timer::Evict),
            _ = until(loop_deadline) => Wake::Timer(Timer::Loop),
            _ = async { let _ = shutdown.wait_for(|stop| *stop).await; }, if !aborted => Wake::Shutdown,
        }
    }

    /// Hands a reply to the program, and lists it in the audit trail.
    async fn reply(&mut self, key: u64, reply: ToolReply) {
        self.session.audit().answered(&self.id, key, &reply);
        let _ = self.helper.send(&Command::Reply { key, reply }).await;
    }

    /// Stops the program, ending the session as `ending` unless it already ends otherwise.
    fn stop(&mut self, ending: Ending) {
        if self.ending == Ending::Normal {
            self.ending = ending;
        }
        self.helper.abort();
    }

    /// Marks the session paused (its run slot given up) or running.
    fn set_paused(&mut self, paused: bool) {
        if let Some(count) = &mut self.paused_count {
            count.set(paused);
        }
    }

    /// One of the helper's events; the run's outcome once it has ended.
    async fn on_event(&mut self, event: Result<Event, RunError>) -> Option<Outcome> {
        match event {
            Ok(Event::ToolCall {
                key,
                name,
                arguments,
                argv,
            }) => self.on_tool_call(key, name, arguments, argv).await,
            Ok(Event::Blocked {
                partial_stdout,
                partial_stderr,
            }) => self.on_blocked(partial_stdout, partial_stderr).await,
            Ok(Event::Finished { result }) => {
                // A replay that ends before meeting every journalled call took
                // another path.
                if self.replay.as_ref().is_some_and(|r| !r.calls.is_empty()) && self.ending == Ending::Normal {
                    self.ending = Ending::Diverged;
                }
                return Some(Ok(result));
            }
            Ok(Event::Failed { message }) => return Some(Err(RunError::Sandbox(message))),
            Ok(Event::Ready { .. }) => {}
            Err(e) => return Some(Err(e)),
        }
        None
    }

    /// The program called a tool: the call is checked, then sent to its MCP server,
    /// answered from the journal (a replay), or kept for the next pause.
    async fn on_tool_call(&mut self, key: u64, name: String, arguments: Option<Value>, argv: Option<Vec<String>>) {
        let config = self.config.clone();
        let verdict = if self.accepted >= self.max_tool_calls {
            Err(format!(
                "over the budget of {} tool calls for this run (max_tool_calls)",
                self.max_tool_calls
            ))
        } else {
            let budget = ByteBudget {
                max_call: config.sessions.max_tool_call_bytes,
                max_pause: config.sessions.max_pause_bytes,
                pause_used: self.pending_bytes,
                max_session: config.sessions.max_session_tool_bytes,
                session_used: self.session_bytes,
            };
            self.check(&name, arguments, argv, budget).await
        };
        let checked = match verdict {
            Ok(checked) => checked,
            Err(reason) => {
                // The reason may quote megabytes the program sent (a name, a value off
                // the schema): the program, the trail and the log get it cut.
                let reason = crate::programmatic::audit::cut(&reason, crate::programmatic::audit::MAX_REASON_BYTES);
                // A replay meets again the refusals the first run met
                // before its last journalled call: listed once.
                if self.replay.as_ref().is_none_or(|r| r.calls.is_empty()) {
                    self.session.audit().refused(&self.id, &name, &reason);
                }
                let reply = ToolReply::error("refused", reason.into_owned());
                let _ = self.helper.send(&Command::Reply { key, reply }).await;
                return;
            }
        };
        self.accepted += 1;
        self.session_bytes += checked.size;
        // A tool of an MCP server: sandcall calls it, and the caller
        // never sees the call. Not journalled: a replay calls it again.
        if let Some(server) = self.tools.mcp_server(&name) {
            let call_id = ids::new_id();
            {
                let mut audit = self.session.audit();
                audit.requested(&self.id, key, &name, checked.arguments.get());
                audit.sent_to_mcp(&self.id, key, &call_id, server);
            }
            let (mcp, server, tx) = (self.sessions.inner.mcp.clone(), server.to_owned(), self.mcp_tx.clone());
            let tool_timeout = self.tool_timeout;
            let principal = self.session.principal.clone();
            tokio::spawn(async move {
                let reply = mcp
                    .call(&principal, &server, &name, checked.arguments.get(), tool_timeout)
                    .await;
                let _ = tx.send((key, reply));
            });
            return;
        }
        // A replay answers the journalled calls from the journal.
        if self.replay.as_ref().is_some_and(|r| !r.calls.is_empty()) {
            self.replay_call(key, name, checked).await;
            return;
        }
        self.pending_bytes += checked.size;
        self.session
            .audit()
            .requested(&self.id, key, &name, checked.arguments.get());
        self.pending.push((key, name, ToolArguments::new(checked.arguments)));
    }

    /// A call the replayed program made, met against the journal's.
    async fn replay_call(&mut self, key: u64, name: String, checked: Checked) {
        let Some(replay) = self.replay.as_mut() else {
            return;
        };
        match replay.meet(&name, checked.arguments.get()) {
            Some(call_id) => match replay.replies.remove(&call_id) {
                Some(reply) => {
                    self.session
                        .audit()
                        .replayed(key, &call_id, &name, checked.arguments.get());
                    self.reply(key, reply).await;
                }
                // Handed out before and not answered yet: it is
                // handed out again at the next pause.
                None => {
                    self.session
                        .audit()
                        .replayed(key, &call_id, &name, checked.arguments.get());
                    self.outstanding
                        .push((call_id, key, name, ToolArguments::new(checked.arguments)));
                }
            },
            None => {
                tracing::info!(session = %self.id, call = %name, "the replayed program took another path");
                self.stop(Ending::Diverged);
            }
        }
    }

    /// The program waits for its calls' results: the calls waiting are handed out in a
    /// new pause, journalled before the caller may see its token.
    async fn on_blocked(&mut self, mut partial_stdout: String, mut partial_stderr: String) {
        if let Some(replay) = self.replay.as_mut() {
            // What the caller already has is not sent twice.
            partial_stdout = skip_sent(&partial_stdout, &mut replay.skip_stdout);
            partial_stderr = skip_sent(&partial_stderr, &mut replay.skip_stderr);
        }
        let cap = self.config.limits.max_output_bytes as usize;
        push_capped(&mut self.carry.0, &partial_stdout, cap);
        push_capped(&mut self.carry.1, &partial_stderr, cap);
        if (self.pending.is_empty() && self.outstanding.is_empty())
            || self.paused_at.is_some()
            || self.results_on_their_way
            || self.ending != Ending::Normal
        {
            return;
        }
        self.pause += 1;
        let pause = self.pause;
        let id = self.id.clone();
        let mut handed = Vec::with_capacity(self.outstanding.len() + self.pending.len());
        let mut calls = Vec::with_capacity(self.outstanding.len() + self.pending.len());
        // Calls a partial resume left unanswered come first, under their ids.
        for (call_id, key, name, arguments) in &self.outstanding {
            handed.push((call_id.clone(), *key));
            calls.push(ToolCall::new(call_id.clone(), name.clone(), arguments.clone()));
        }
        let mut entries = Vec::with_capacity(self.pending.len());
        for (key, name, arguments) in std::mem::take(&mut self.pending) {
            let call_id = ids::new_id();
            self.session.audit().handed_out(&id, key, &call_id);
            handed.push((call_id.clone(), key));
            self.outstanding
                .push((call_id.clone(), key, name.clone(), arguments.clone()));
            entries.push(JournalEntry::Call {
                pause,
                call_id: call_id.clone(),
                name: name.clone(),
                arguments: arguments_box(&arguments),
            });
            calls.push(ToolCall::new(call_id, name, arguments));
        }
        self.pending_bytes = 0;
        self.delivered = self.accepted;
        let (partial_stdout, partial_stderr) = std::mem::take(&mut self.carry);
        let response = ProgrammaticResponse::ToolCallRequired {
            session_id: id.clone(),
            continuation_token: self.sessions.inner.key.sign(&id, pause),
            tool_calls: calls,
            partial_stdout,
            partial_stderr,
            // The token is good until the first timer runs out.
            expires_at: rfc3339_in(
                self.tool_timeout.min(self.expiry).min(
                    self.loop_deadline
                        .map_or(Duration::MAX, |d| d.saturating_duration_since(Instant::now())),
                ),
            ),
        };
        let json = serialized(&response).await;
        if !self.journal_pause(&response, &entries).await {
            return;
        }
        // Held for the pause, which may last until session_expiry.
        self.renew_workspace().await;
        self.paused_at = Some(Instant::now());
        self.keep_live = false;
        self.session
            .publish_json(Phase::Paused { pause, calls: handed }, response, json);
        // Waiting for the caller takes no CPU: the slot goes to someone else.
        self.run_slot = None;
        self.set_paused(true);
    }

    /// Journals a pause (its calls, and the session's state) before the caller may see
    /// its token; false, the program stopped, if the store would not take it.
    async fn journal_pause(&mut self, response: &ProgrammaticResponse, entries: &[JournalEntry]) -> bool {
        let state = &mut self.state;
        state.pause = self.pause;
        state.open = true;
        state.outstanding = self.outstanding.iter().map(|(c, ..)| c.clone()).collect();
        if let ProgrammaticResponse::ToolCallRequired {
            partial_stdout,
            partial_stderr,
            expires_at,
            ..
        } = response
        {
            state.stdout_sent += partial_stdout.len() as u64;
            state.stderr_sent += partial_stderr.len() as u64;
            state.partial_stdout.clone_from(partial_stdout);
            state.partial_stderr.clone_from(partial_stderr);
            state.expires_at.clone_from(expires_at);
        }
        state.calls_made = self.delivered;
        state.paused_ms = now_ms();
        // A store that is down for a moment (Redis restarting) is waited
        // for, up to 10 s: the pause is handed out once it is recorded.
        let mut appended = self.store.append(&self.id, entries, &self.state).await;
        for _ in 0..20 {
            if !matches!(appended, Err(sandcall_store::StoreError::Unavailable(_))) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            appended = self.store.append(&self.id, entries, &self.state).await;
        }
        if let Err(e) = appended {
            tracing::error!(session = %self.id, error = %e, "could not journal a pause");
            self.stop(Ending::Unjournalled);
            return false;
        }
        true
    }

    /// A request's command: a resume's results, a cancel, or an abandoned session.
    async fn on_command(&mut self, command: Option<DriverCommand>) {
        match command {
            Some(DriverCommand::Results(replies, slot, digest, undo)) => {
                self.on_results(replies, slot, digest, undo).await;
            }
            Some(DriverCommand::Abandon) => {
                if self.ending == Ending::Normal {
                    self.ending = Ending::Unjournalled;
                }
                self.session.unpause();
                self.helper.abort();
            }
            Some(DriverCommand::Cancel) => self.stop(Ending::Cancelled),
            None => {}
        }
    }

    /// A resume's results, journalled before the program gets them: the token is used.
    async fn on_results(&mut self, replies: Vec<(u64, ToolReply)>, slot: Slot, digest: [u8; 32], undo: Box<Undo>) {
        let was_paused_at = self.paused_at.take();
        self.results_on_their_way = false;
        self.run_slot = Some(slot);
        self.set_paused(false);
        // The replies move into the journal's entries and back out, never
        // copied (a resume may carry many MiB of results).
        let mut keys = Vec::with_capacity(replies.len());
        let mut unjournalled = Vec::new();
        let mut entries: Vec<JournalEntry> = Vec::with_capacity(replies.len());
        for (key, reply) in replies {
            match self.outstanding.iter().find(|(_, k, _, _)| *k == key) {
                Some((call_id, ..)) => {
                    keys.push(key);
                    entries.push(JournalEntry::Reply {
                        call_id: call_id.clone(),
                        reply,
                    });
                }
                None => unjournalled.push((key, reply)),
            }
        }
        let pause = self.pause;
        let state = &mut self.state;
        // The pause's state, put back if the store cannot take the resume.
        let before = (
            state.open,
            state.outstanding.clone(),
            state.last_resume.take(),
            std::mem::take(&mut state.partial_stdout),
            std::mem::take(&mut state.partial_stderr),
        );
        state.open = false;
        state.outstanding.retain(|c| {
            !entries
                .iter()
                .any(|e| matches!(e, JournalEntry::Reply { call_id, .. } if call_id == c))
        });
        state.last_resume = Some((pause, hex(&digest)));
        let consumed = self.store.consume(&self.id, pause, &entries, &self.state).await;
        if let Err(sandcall_store::StoreError::Unavailable(detail)) = &consumed {
            // Nothing was recorded: the pause goes on as it was, its token
            // good, and the resume gets 503.
            let state = &mut self.state;
            (
                state.open,
                state.outstanding,
                state.last_resume,
                state.partial_stdout,
                state.partial_stderr,
            ) = before;
            self.session.undo(pause, *undo, detail);
            self.paused_at = was_paused_at.or_else(|| Some(Instant::now()));
            self.run_slot = None;
            self.set_paused(true);
            return;
        }
        drop(undo);
        if !matches!(consumed, Ok(true)) {
            tracing::error!(session = %self.id, "could not journal a resume");
            self.stop(Ending::Unjournalled);
            return;
        }
        self.renew_workspace().await;
        let journalled = keys.into_iter().zip(entries).filter_map(|(key, entry)| match entry {
            JournalEntry::Reply { reply, .. } => Some((key, reply)),
            JournalEntry::Call { .. } => None,
        });
        for (key, reply) in journalled.chain(unjournalled) {
            self.outstanding.retain(|(_, k, _, _)| *k != key);
            self.reply(key, reply).await;
        }
    }

    /// One of the session's timers ran out.
    async fn on_timer(&mut self, timer: Timer) {
        match timer {
            Timer::ToolCall => self.on_tool_call_timeout().await,
            Timer::Expiry => {
                self.paused_at = None;
                if !self.session.leave_pause(Phase::Expired) {
                    self.results_on_their_way = true;
                    return;
                }
                self.ending = Ending::Expired;
                // Gone for every later request from now, not once the sandbox is
                // reclaimed; requests already waiting still get the ending.
                self.sessions.remove(&self.session);
                self.helper.abort();
            }
            Timer::Evict => self.on_idle().await,
            Timer::Loop => {
                // The whole loop's budget is spent, waits included.
                self.loop_deadline = None;
                if self.ending == Ending::Normal {
                    self.ending = Ending::LoopTimeout;
                }
                // A resume that comes while the sandbox stops answers the ending.
                self.session.leave_pause(Phase::Ending);
                self.helper.abort();
            }
        }
    }

    /// The caller did not answer in time: the program gets TimeoutError and
    /// goes on; the token of this pause is stale from now.
    async fn on_tool_call_timeout(&mut self) {
        self.paused_at = None;
        if !self.session.unpause() {
            self.results_on_their_way = true;
            return;
        }
        // The program goes on without its caller, so it cannot wait in the queue.
        self.run_slot = Some(self.sessions.inner.admission.admit_now(&self.session.principal));
        self.set_paused(false);
        let config = &self.config;
        let message = format!(
            "no result within tool_call_timeout ({} ms)",
            config.sessions.tool_call_timeout_ms
        );
        let entries: Vec<JournalEntry> = self
            .outstanding
            .iter()
            .map(|(call_id, ..)| JournalEntry::Reply {
                call_id: call_id.clone(),
                reply: ToolReply::error("timeout", message.clone()),
            })
            .collect();
        let state = &mut self.state;
        state.open = false;
        state.outstanding.clear();
        state.partial_stdout.clear();
        state.partial_stderr.clear();
        if !matches!(
            self.store.consume(&self.id, self.pause, &entries, &self.state).await,
            Ok(true)
        ) {
            tracing::error!(session = %self.id, "could not journal a tool-call timeout");
            self.stop(Ending::Unjournalled);
            return;
        }
        self.renew_workspace().await;
        for (_, key, _, _) in std::mem::take(&mut self.outstanding) {
            self.reply(key, ToolReply::error("timeout", message.clone())).await;
        }
    }

    /// Idle for session_idle_evict_s: the sandbox goes, the journal stays.
    /// The store marks it dormant first (its deadlines, its principal's
    /// count, its audit trail): from then on nothing of it needs memory.
    async fn on_idle(&mut self) {
        if !self.sessions.sleep_in_store(&self.session, self.state.paused_ms).await {
            self.keep_live = true;
            return;
        }
        self.paused_at = None;
        if !self.session.make_dormant(self.state.paused_ms) {
            // A resume got there first: it is not dormant after all.
            let _ = self.store.wake(&self.id).await;
            self.results_on_their_way = true;
            return;
        }
        self.ending = Ending::Dormant;
        self.helper.abort();
    }

    /// A paused session outlives the server in its journal, dormant (if the
    /// store cannot mark it so now, the next start does: `recover`).
    async fn on_shutdown(&mut self) {
        if self.paused_at.is_some() {
            let slept = self.sessions.sleep_in_store(&self.session, self.state.paused_ms).await;
            if self.session.make_dormant(self.state.paused_ms) {
                self.ending = Ending::Dormant;
            } else if slept {
                let _ = self.store.wake(&self.id).await;
            }
        }
        self.helper.abort();
    }

    /// Waits for the sandbox to be gone, then gives its places back: no resume reaches
    /// the program from here, and results already queued are dropped with the
    /// receiver, and with them the run slots their resumes took.
    async fn release(&mut self) {
        self.commands.close();
        while self.commands.try_recv().is_ok() {}
        // The sandbox is gone once the helper has exited; only then are the slots free.
        self.helper.wait().await;
        self.run_slot = None;
        self.paused_count = None;
        self.slot = None;
    }

    /// The run has ended: the session goes dormant, or publishes its ending.
    async fn finish(mut self, outcome: Outcome) {
        self.session.audit().run_ended();
        let id = self.id.clone();
        if self.ending == Ending::Dormant {
            // The session stays paused, in the store alone: its entry here goes (unless a
            // resume woke it meanwhile), and its places with it (the store counts it
            // among its principal's sessions). Its resume brings it back by replay
            // (`Sessions::revive`).
            self.release().await;
            // A session granted network is not replayed (`replay_driver`): its proxy
            // ends here, its connections logged.
            if let Some(endpoint) = self.endpoint.take() {
                endpoint.finish(&id).await;
            }
            self.sessions.drop_dormant(&self.session);
            let _ = tokio::fs::remove_dir_all(&self.outbox).await;
            // Its workspace stays held (the lease runs past the pause's expiry): the
            // replay holds it again, and an expiry or a cancel gives it back.
            if let Some(held) = self.held.take() {
                held.lease.keep();
            }
            // No sandbox holds it now: any node may bring it back.
            if let Some(node) = &self.sessions.inner.node {
                if let Err(e) = self.store.release(&id, node).await {
                    tracing::warn!(session = %id, error = %e, "could not release a session's lease");
                }
            }
            return;
        }
        // No resume reaches the program from here: one that comes later finds the session
        // no longer paused (409).
        self.session.unpause();
        self.release().await;
        // The session has ended: its journal goes. Unless many nodes share it and this
        // node could not write it: another node may have moved the session on.
        let shared_and_lost = self.ending == Ending::Unjournalled && self.sessions.inner.node.is_some();
        if shared_and_lost {
            tracing::warn!(session = %id, "a session's journal moved on without this node; its copy here ends");
            // The node that runs it on holds its workspace, under the same holder.
            if let Some(held) = self.held.take() {
                held.lease.keep();
            }
        } else if let Err(e) = self.store.remove(&id).await {
            tracing::warn!(session = %id, error = %e, "could not remove a session's journal");
        }
        let wall_ms = outcome.as_ref().map_or(0, |r| r.wall_time_ms);
        let mut response = self.respond(outcome).await;
        self.end_workspace(&mut response).await;
        self.end_network(&mut response).await;
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
        if self.ending == Ending::Expired {
            // An expired session is gone: resuming it gets 404.
            self.session.publish(Phase::Expired, response);
            self.sessions.remove(&self.session);
            return;
        }
        self.session.publish(Phase::Done, response);
        // The ended session stays readable (GET) for a while, then goes; at shutdown at
        // once (nothing serves a GET then), so that the server's wait for its drivers
        // is not a wait for these. Its trail meanwhile counts against
        // `max_ended_session_bytes`.
        self.sessions.keep_ended_trail(&self.session);
        let mut shutdown = self.sessions.inner.shutdown.clone();
        tokio::select! {
            _ = tokio::time::sleep(self.expiry) => {}
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
        self.sessions.forget_ended_trail(&self.session);
        self.sessions.remove(&self.session);
    }

    /// The ending's response. It holds the whole run's output, as a live one does: the
    /// replay printed all of it again, once.
    async fn respond(&mut self, outcome: Outcome) -> ProgrammaticResponse {
        match outcome {
            // Only a completed run has output files to give: an `error` answer has no
            // field for them, so nothing is stored that nobody would be told about.
            Ok(mut result) if self.ending == Ending::Normal && !result.timed_out && !result.aborted => {
                let inner = &self.sessions.inner;
                let stored = ops::ingest(
                    &*inner.files,
                    &self.session.principal,
                    &self.id,
                    &inner.config,
                    &self.staged,
                    &self.outbox,
                    &mut result,
                )
                .await;
                self.ending(result, self.ending, self.delivered, stored)
            }
            Ok(result) => {
                let _ = tokio::fs::remove_dir_all(&self.outbox).await;
                self.ending(result, self.ending, self.delivered, ops::Ingested::default())
            }
            Err(e) => {
                let _ = tokio::fs::remove_dir_all(&self.outbox).await;
                self.failure(&e)
            }
        }
    }

    /// Runs `ToolSet::check` on a blocking thread, off the async workers, and waits for
    /// it at most `CHECK_TIME_BUDGET`; a call whose check takes longer is refused. A
    /// thread cannot be stopped, so an overrunning check goes on and is kept in
    /// `overrun`: until it ends, this session's next calls are refused at once, and one
    /// session never has more than one check running.
    async fn check(
        &mut self,
        name: &str,
        arguments: Option<Value>,
        argv: Option<Vec<String>>,
        budget: ByteBudget,
    ) -> Result<Checked, String> {
        if self.overrun.as_ref().is_some_and(|h| !h.is_finished()) {
            return Err(format!(
                "the check of an earlier call is still running past its time budget ({} ms); retry later",
                CHECK_TIME_BUDGET.as_millis()
            ));
        }
        self.overrun = None;
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
                self.overrun = Some(handle);
                Err(format!(
                    "checking the arguments of {name} against its schema took longer than {} ms",
                    CHECK_TIME_BUDGET.as_millis()
                ))
            }
        }
    }

    fn ending(&self, result: RunResult, ending: Ending, delivered: u64, stored: ops::Ingested) -> ProgrammaticResponse {
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
            // The note on stderr's words without its `[sandbox] `: LibreChat's client
            // matches `error` exactly to tell the model what happened.
            return error(error_type::TIMEOUT, "Time limit exceeded".into());
        }
        if result.aborted {
            return error(error_type::SHUTTING_DOWN, "the server is shutting down".into());
        }
        ProgrammaticResponse::Completed {
            session_id: session_id.clone(),
            stdout: result.stdout,
            stderr: result.stderr,
            artifact_delivery: sandcall_api::ArtifactDelivery::of(stored.delivered, stored.undelivered).map(Box::new),
            artifact_truncation: sandcall_api::ArtifactTruncation::of(
                &stored.skipped,
                stored.skipped_total,
                stored.undelivered,
            )
            .map(Box::new),
            files: stored.files,
            files_skipped: stored.skipped,
            files_skipped_total: stored.skipped_total,
            deleted_files: stored.deleted,
            runtime_session_id: None,
            runtime_status: None,
            network: None,
            tool_calls_made: delivered,
            execution_time: result.wall_time_ms,
            exit_code: result.exit_code,
            signal: result.signal,
            timed_out: false,
            stdout_truncated: result.stdout_truncated,
            stderr_truncated: result.stderr_truncated,
        }
    }

    /// The session has ended: its workspace is given back, saved with the files its
    /// answer lists if it completed, unchanged otherwise (an `error` answer lists no
    /// files, and the next run starts from what the last answer listed).
    async fn end_workspace(&mut self, response: &mut ProgrammaticResponse) {
        let Some(held) = self.held.take() else {
            return;
        };
        match response {
            ProgrammaticResponse::Completed {
                files,
                runtime_session_id,
                runtime_status,
                ..
            } => {
                *runtime_status = Some(held.status());
                *runtime_session_id = Some(held.runtime_session_id);
                held.lease.save(files).await;
            }
            _ => held.lease.give_back().await,
        }
    }

    /// The session has ended: its proxy is finished, and a completed answer carries its
    /// summary (and the `[sandbox]` line on stderr when a bound cut its traffic).
    async fn end_network(&mut self, response: &mut ProgrammaticResponse) {
        let Some(endpoint) = self.endpoint.take() else {
            return;
        };
        let (summary, note) = endpoint.finish(&self.id).await;
        if let ProgrammaticResponse::Completed { network, stderr, .. } = response {
            *network = Some(Box::new(summary));
            crate::exec::append_notes(stderr, note.as_slice());
        }
    }

    fn failure(&self, e: &RunError) -> ProgrammaticResponse {
        self.tier.record_failure(e);
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

pub(super) async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

pub(super) fn rfc3339_in(d: Duration) -> String {
    humantime::format_rfc3339_millis(SystemTime::now() + d).to_string()
}

/// Appends `add`, keeping at most `cap` bytes (cut at a character boundary).
pub(super) fn push_capped(s: &mut String, add: &str, cap: usize) {
    s.push_str(add);
    if s.len() > cap {
        let mut end = cap;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}
