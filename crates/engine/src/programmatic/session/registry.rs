//! The sessions this node holds in memory, their request ids, the places (session
//! slots) they take, and what ended ones keep of their audit trails.

use super::*;
use std::collections::VecDeque;
use std::sync::Weak;

/// The audit trails ended sessions keep while they stay readable (`session_expiry_s`),
/// in the order the sessions ended, and their weight all together
/// (`Audit::bytes`): held to `max_ended_session_bytes` by letting the oldest go.
#[derive(Default)]
pub(super) struct EndedTrails {
    trails: VecDeque<(Weak<Session>, usize)>,
    bytes: usize,
}

/// A session's place among `max_sessions` and among its principal's sessions.
pub(super) struct SessionSlot {
    pub(super) _permit: OwnedSemaphorePermit,
    /// Given back when the session ends or goes dormant (the store counts a dormant one).
    pub(super) _held: Held,
}

/// Counts a session among the paused ones while it is; uncounted when dropped.
pub(super) struct Paused {
    inner: Arc<Inner>,
    now: bool,
}

impl Paused {
    pub(super) fn new(inner: Arc<Inner>) -> Self {
        Paused { inner, now: false }
    }

    pub(super) fn set(&mut self, paused: bool) {
        use std::sync::atomic::Ordering::SeqCst;
        if std::mem::replace(&mut self.now, paused) != paused {
            if paused {
                self.inner.paused.fetch_add(1, SeqCst);
            } else {
                self.inner.paused.fetch_sub(1, SeqCst);
            }
        }
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        self.set(false);
    }
}

impl Sessions {
    pub(super) fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.inner.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for one more session of `principal`: 429 when it holds its share (its
    /// sessions here, and its dormant ones, which the store counts), 503 when the server
    /// holds `max_sessions`.
    pub(super) async fn take_session_slot(&self, principal: &Principal) -> Result<SessionSlot, EngineError> {
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
    pub(super) fn session_slot(&self, held: Held) -> Result<SessionSlot, EngineError> {
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

    /// `session` has ended and stays readable for a while: its trail is counted among
    /// the ended sessions', and the trails of the sessions that ended first are let go
    /// while they all weigh more than `max_ended_session_bytes`.
    pub(super) fn keep_ended_trail(&self, session: &Arc<Session>) {
        let cap = usize::try_from(self.inner.config.sessions.max_ended_session_bytes).unwrap_or(usize::MAX);
        let weight = session.audit().bytes();
        let mut released = Vec::new();
        {
            let mut ended = self.inner.ended.lock().unwrap_or_else(|p| p.into_inner());
            ended.trails.push_back((Arc::downgrade(session), weight));
            ended.bytes += weight;
            while ended.bytes > cap {
                let Some((oldest, weight)) = ended.trails.pop_front() else {
                    break;
                };
                ended.bytes -= weight;
                released.push(oldest);
            }
        }
        // Outside the ledger's lock: a session's audit lock is never taken under it.
        for session in released.iter().filter_map(Weak::upgrade) {
            tracing::info!(session = %session.id, "an ended session's audit trail was let go (max_ended_session_bytes)");
            session.audit().release();
        }
    }

    /// `session` is gone (its `session_expiry_s` after its end is up, or the server
    /// stops): its trail no longer counts.
    pub(super) fn forget_ended_trail(&self, session: &Arc<Session>) {
        let mut ended = self.inner.ended.lock().unwrap_or_else(|p| p.into_inner());
        let at = ended
            .trails
            .iter()
            .position(|(s, _)| std::ptr::eq(s.as_ptr(), Arc::as_ptr(session)));
        if let Some((_, weight)) = at.and_then(|i| ended.trails.remove(i)) {
            ended.bytes -= weight;
        }
    }

    /// What the trails of ended sessions still readable hold, all together.
    pub fn ended_trail_bytes(&self) -> usize {
        self.inner.ended.lock().unwrap_or_else(|p| p.into_inner()).bytes
    }

    /// The sessions `principal` holds a sandbox for on this node now.
    pub fn held_by(&self, principal: &Principal) -> usize {
        self.inner.per_principal.held(&principal.0)
    }

    /// The sessions this node keeps an entry of in memory (a dormant one has none).
    pub fn entries(&self) -> usize {
        self.map().len()
    }

    /// Lets cancel name `session` by `request_id` from now: in memory, and with Redis in
    /// the store too, so that cancel by request id reaches it from any node.
    pub(super) async fn name_request(&self, session: &Arc<Session>, request_id: String) {
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

    pub(super) fn requests(&self) -> MutexGuard<'_, HashMap<(String, String), String>> {
        self.inner.requests.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes the session from the registry and its journal from the store (with what
    /// it kept there while dormant).
    pub(super) async fn forget(&self, session: &Arc<Session>) {
        self.remove(session);
        // No driver holds its workspace: it is given back here, as it was.
        let held = self.workspace_of(&session.id).await;
        if let Err(e) = self.inner.store.remove(&session.id).await {
            tracing::warn!(session = %session.id, error = %e, "could not remove a session's journal");
        }
        self.let_go_workspace(held).await;
    }

    pub(super) fn remove(&self, session: &Arc<Session>) {
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
