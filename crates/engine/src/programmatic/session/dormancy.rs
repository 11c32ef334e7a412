//! Dormant sessions: paused sessions kept in the store alone, their sandbox freed
//! (evicted, or the server stopped), revived by replay when resumed or timed out, and
//! expired when nobody resumes them.

use super::*;

/// Dormant sessions acted on per tick of the deadline sweep (`expire_dormant`), at most.
pub(super) const DUE_BATCH: usize = 256;

impl Sessions {
    /// What a dormant session keeps in the store besides its journal, now: its first
    /// timer's deadline, its audit trail and its latest request id.
    pub(super) fn dormancy(&self, session: &Session, paused_ms: u64) -> Result<sandcall_store::Dormancy, String> {
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
    pub(super) async fn sleep_in_store(&self, session: &Session, paused_ms: u64) -> bool {
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
    pub(super) fn drop_dormant(&self, session: &Arc<Session>) {
        let shared = session.lock();
        if shared.dormant.is_some() {
            self.remove(session);
        }
    }

    /// The same, for the entry of session `id`, if any.
    pub(super) fn drop_dormant_id(&self, id: &str) {
        let held = self.map().get(id).cloned();
        if let Some(session) = held {
            self.drop_dormant(&session);
        }
    }

    /// Paused sessions that hold no sandbox (evicted, or left paused by an earlier
    /// server), as the store counts them; None if it cannot be read now.
    pub async fn dormant_count(&self) -> Option<usize> {
        self.dormant_count_of(None).await
    }

    /// The same, of one principal's sessions only (None: of every principal's).
    pub async fn dormant_count_of(&self, principal: Option<&str>) -> Option<usize> {
        match self.inner.store.dormant(principal).await {
            Ok(n) => usize::try_from(n).ok(),
            Err(e) => {
                tracing::warn!(error = %e, "could not count the dormant sessions");
                None
            }
        }
    }

    /// Makes sure a paused session left by an earlier server is marked dormant in the
    /// store (it was not if that server was killed while holding it live), keeping what
    /// it kept there if it was.
    pub(super) async fn keep_dormant(&self, id: &str, principal: String, paused_ms: u64) -> bool {
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
    pub(super) async fn bring_back(&self, id: String, principal: String, state: SessionState) -> bool {
        let inner = &self.inner;
        let expiry_ms = inner.config.sessions.session_expiry_s.saturating_mul(1000);
        let expired = state.open && now_ms().saturating_sub(state.paused_ms) > expiry_ms;
        if state.pause == 0 || expired {
            let held = self.workspace_of(&id).await;
            let _ = inner.store.remove(&id).await;
            self.let_go_workspace(held).await;
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
    pub(super) async fn act_on_due(&self, id: &str) {
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
                shared.phase = Phase::Expired;
                drop(shared);
                self.remove(session);
            }
            let held = self.workspace_of(id).await;
            if let Err(e) = store.remove(id).await {
                tracing::warn!(session = %id, error = %e, "could not remove an expired session's journal");
            }
            self.let_go_workspace(held).await;
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
    pub(super) async fn let_go(&self, id: &str) {
        if let Some(node) = self.inner.node.as_deref() {
            let _ = self.inner.store.release(id, node).await;
        }
    }

    /// `tool_call_timeout_ms` for a dormant session: its calls get the timeout, as they
    /// would in a live one, and it is brought back by replay to go on. False with no
    /// session place free now (the next tick tries again).
    pub(super) fn time_out_dormant(&self, session: &Arc<Session>) -> bool {
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
    pub(super) async fn revive(
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
                            *session.audit() = super::super::audit::Audit::restore(kept);
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
}

/// What a dormant session holds for its response: nothing of its pause (GET and a
/// retried resume read that from the store).
pub(super) fn dormant_placeholder(id: &str) -> Published {
    ProgrammaticResponse::Running {
        session_id: id.to_owned(),
    }
    .into()
}
