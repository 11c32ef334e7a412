//! Which node holds a session when many share the store: locating it, forwarding to its
//! owner, taking it over (adopting it) and the leases that say who owns it.

use super::*;

impl Sessions {
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
    pub(super) async fn adopt(&self, id: &str, principal: String, state: SessionState) {
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
    pub(super) fn drop_stale(&self, id: &str) {
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
}

/// 503: the lease moved to another node while the request was on its way.
pub(super) fn owner_moved() -> EngineError {
    EngineError {
        retry_after_s: Some(1),
        ..EngineError::new(
            ErrorKind::Unavailable,
            error_type::SESSION_OWNER_UNAVAILABLE,
            "the session is moving between nodes; retry",
        )
    }
}
