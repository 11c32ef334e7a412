//! The workspace a programmatic session runs in (`runtime_session_hint` or
//! `workspace_id`, with `workspaces` on): taken at the start, held across every pause
//! and resume (the lease renewed at each), and given back when the session ends. Only a
//! session that completes saves what its program left, which its answer's `files` lists;
//! any other end leaves the workspace as it was. A dormant session keeps the lease in the
//! store; its replay holds it again under the journalled holder.

use super::*;
use crate::files::workspace::{self, Lease};
use sandcall_api::RuntimeStatus;
use sandcall_store::HeldWorkspace;

/// How long a lease outlasts the longest stretch between two of the session's renewals
/// (a pause, up to `session_expiry_s`; a run, up to its `timeout`): waiting for a slot,
/// and storing the outputs.
const HOLD_MARGIN_MS: u64 = 120_000;

/// A session's workspace, held by its driver.
pub(super) struct SessionWorkspace {
    pub(super) lease: Lease,
    pub(super) journalled: HeldWorkspace,
    pub(super) runtime_session_id: String,
    /// How long each renewal holds it.
    pub(super) hold_ms: u64,
}

impl SessionWorkspace {
    /// Moves the lease's end on: at each pause and resume.
    pub(super) async fn renew(&self, session: &str) {
        if !self.lease.renew(self.hold_ms).await {
            tracing::warn!(
                session,
                "a session's workspace lease was taken over; its files will not be saved"
            );
        }
    }

    pub(super) fn status(&self) -> RuntimeStatus {
        if self.journalled.reused {
            RuntimeStatus::Reused
        } else {
            RuntimeStatus::New
        }
    }
}

/// The lease's length at each renewal, for a program of `timeout_ms`.
pub(super) fn hold_ms(config: &Config, timeout_ms: u64) -> u64 {
    let expiry_ms = config.sessions.session_expiry_s.saturating_mul(1000);
    timeout_ms
        .max(expiry_ms)
        .saturating_add(config.limits.queue_timeout_ms)
        .saturating_add(HOLD_MARGIN_MS)
}

impl Sessions {
    /// Takes the principal's workspace `name` for a new session, and adds its files to
    /// `files` (after the caller's own, which win a name). 409 `workspace_busy` while
    /// another run holds it.
    pub(super) async fn take_workspace(
        &self,
        principal: &str,
        name: &str,
        timeout_ms: u64,
        files: &mut Vec<sandcall_api::FileRef>,
    ) -> Result<SessionWorkspace, EngineError> {
        let config = &self.inner.config;
        let hold_ms = hold_ms(config, timeout_ms);
        let ttl_ms = config.files.file_ttl_s.saturating_mul(1000);
        let (lease, inputs) =
            workspace::take(self.inner.files.clone(), principal, name, hold_ms, ttl_ms, files).await?;
        let journalled = HeldWorkspace {
            name: name.to_owned(),
            holder: lease.holder().to_owned(),
            reused: !inputs.is_empty(),
        };
        files.extend(inputs);
        Ok(SessionWorkspace {
            lease,
            runtime_session_id: workspace::runtime_session_id(principal, name),
            journalled,
            hold_ms,
        })
    }

    /// A replayed session's workspace, held again under its journalled holder.
    pub(super) async fn hold_workspace_again(
        &self,
        principal: &str,
        journalled: HeldWorkspace,
        timeout_ms: u64,
    ) -> Result<SessionWorkspace, EngineError> {
        let config = &self.inner.config;
        let hold_ms = hold_ms(config, timeout_ms);
        let ttl_ms = config.files.file_ttl_s.saturating_mul(1000);
        let lease = workspace::hold_again(
            self.inner.files.clone(),
            principal,
            &journalled.name,
            &journalled.holder,
            hold_ms,
            ttl_ms,
        )
        .await?;
        Ok(SessionWorkspace {
            lease,
            runtime_session_id: workspace::runtime_session_id(principal, &journalled.name),
            journalled,
            hold_ms,
        })
    }

    /// The workspace a journalled session holds, if any: read before its journal goes,
    /// and given back (`let_go_workspace`) after, so that the workspace is not free
    /// while the session can still be seen.
    pub(super) async fn workspace_of(&self, id: &str) -> Option<(String, HeldWorkspace)> {
        let journal = self.inner.store.load(id).await.ok()??;
        Some((journal.start.principal, journal.start.workspace?))
    }

    /// Gives back, unchanged, the workspace of a session that ends with no driver
    /// holding it (dormant, then expired or cancelled).
    pub(super) async fn let_go_workspace(&self, held: Option<(String, HeldWorkspace)>) {
        if let Some((principal, held)) = held {
            workspace::let_go(&*self.inner.files, &principal, &held.name, &held.holder).await;
        }
    }
}
