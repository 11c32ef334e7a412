//! Workspaces (`workspaces = true`): a run that names one (`workspace_id`, or
//! LibreChat's `runtime_session_hint`) starts with the files its principal's previous
//! run in that workspace left, and leaves its own for the next.
//!
//! A workspace is a list of stored files and the names they have in the working
//! directory, kept by the file store (`FileStore::workspace_take` and
//! `workspace_release`), so every node sees the same one. A run holds the workspace from
//! before its inputs are resolved until its outputs are stored: one run at a time, and a
//! second one is answered `409 workspace_busy`. The hold is a lease, so a node that dies
//! mid-run frees it when the lease runs out. A programmatic session holds it from its
//! start to its end, pauses included (`programmatic::session::held`): it renews the
//! lease, keeps it while dormant, and a replay holds it again under the same holder.
//!
//! What the next run gets is what the run's answer lists in `files`: the inputs that
//! came back unchanged (`inherited`) and the files the run wrote, so everything the
//! output collection keeps (within `max_output_files`, `max_file_bytes`, the working
//! directory's size and the principal's quota). A file the run deleted, or one the
//! collection skipped, is not in it. The files are ordinary stored files, counted in the
//! quota, and each run in the workspace moves their expiry to `file_ttl_s` after it: a
//! workspace lasts `file_ttl_s` after its last run.

use super::ops::storage_error;
use super::{now_ms, FileStore};
use crate::error::EngineError;
use crate::error::ErrorKind;
use sandcall_api::{error_type, FileRef, OutputFile};
use sandcall_store::WorkspaceFile;
use std::sync::Arc;

/// A workspace held by one run: given back when dropped, unchanged unless `save` ran.
pub struct Lease {
    store: Arc<dyn FileStore>,
    principal: String,
    name: String,
    holder: String,
    held: bool,
    /// `file_ttl_s`, in ms: how long the workspace's files live on after it is saved.
    ttl_ms: u64,
}

/// The id LibreChat reads as `runtime_session_id`: the same for every run in the
/// principal's workspace `name`, and different for another principal's of that name.
pub fn runtime_session_id(principal: &str, name: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update(b"sandcall-workspace\0");
    hash.update(principal.as_bytes());
    hash.update(b"\0");
    hash.update(name.as_bytes());
    let digest = hash.finalize();
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

fn busy() -> EngineError {
    EngineError::new(
        ErrorKind::Conflict,
        error_type::WORKSPACE_BUSY,
        "this workspace is in use by another run; try again when it has finished",
    )
}

/// Takes the workspace `name` of `principal` for a run that may last `hold_ms`, and
/// returns its files as inputs, after the request's own `files`: a file of the
/// workspace named like one of those (or a folder of one, or inside one) gives way, and
/// one that expired or was deleted is left out.
pub async fn take(
    store: Arc<dyn FileStore>,
    principal: &str,
    name: &str,
    hold_ms: u64,
    ttl_ms: u64,
    requested: &[FileRef],
) -> Result<(Lease, Vec<FileRef>), EngineError> {
    let (lease, files) = lease(
        store.clone(),
        principal,
        name,
        sandcall_api::ids::new_id(),
        hold_ms,
        ttl_ms,
    )
    .await?;
    let clashes = |n: &str| {
        requested
            .iter()
            .any(|r| r.name == n || r.name.starts_with(&format!("{n}/")) || n.starts_with(&format!("{}/", r.name)))
    };
    let mut inputs = Vec::with_capacity(files.len());
    for f in files {
        if clashes(&f.name) {
            continue;
        }
        if store
            .get(principal, &f.session_id, &f.id)
            .await
            .map_err(storage_error)?
            .is_none()
        {
            continue;
        }
        inputs.push(FileRef {
            id: f.id,
            storage_session_id: Some(f.session_id),
            session_id: None,
            name: f.name,
            entity_id: None,
        });
    }
    Ok((lease, inputs))
}

/// Takes the workspace for `holder` (again, if it holds it already) until `hold_ms`
/// from now; 409 `workspace_busy` while another holder's lease is good.
async fn lease(
    store: Arc<dyn FileStore>,
    principal: &str,
    name: &str,
    holder: String,
    hold_ms: u64,
    ttl_ms: u64,
) -> Result<(Lease, Vec<WorkspaceFile>), EngineError> {
    let now = now_ms();
    let files = store
        .workspace_take(principal, name, &holder, now, now.saturating_add(hold_ms))
        .await
        .map_err(storage_error)?
        .ok_or_else(busy)?;
    let lease = Lease {
        store,
        principal: principal.to_owned(),
        name: name.to_owned(),
        holder,
        held: true,
        ttl_ms,
    };
    Ok((lease, files))
}

/// Holds the workspace again under the `holder` a programmatic session took it with
/// (a replay of the session, on this node or another): its files are not read, the
/// session's journal has them. 409 `workspace_busy` if another run holds it now (the
/// session's lease ran out meanwhile and someone else took it).
pub async fn hold_again(
    store: Arc<dyn FileStore>,
    principal: &str,
    name: &str,
    holder: &str,
    hold_ms: u64,
    ttl_ms: u64,
) -> Result<Lease, EngineError> {
    Ok(lease(store, principal, name, holder.to_owned(), hold_ms, ttl_ms)
        .await?
        .0)
}

/// Gives back the workspace `holder` holds, unchanged: for a programmatic session that
/// ends while no driver holds its `Lease` (dormant, and expired or cancelled).
pub async fn let_go(store: &dyn FileStore, principal: &str, name: &str, holder: &str) {
    if let Err(e) = store.workspace_release(principal, name, holder, None).await {
        tracing::warn!(error = %e, "giving a workspace back");
    }
}

impl Lease {
    /// The holder the lease is taken under (journalled by a programmatic session).
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Moves the lease's end to `hold_ms` from now (a programmatic session, at each
    /// pause and resume). False if another holder has it: the lease ran out meanwhile,
    /// and this run's files will not be saved.
    pub async fn renew(&self, hold_ms: u64) -> bool {
        let now = now_ms();
        match self
            .store
            .workspace_take(
                &self.principal,
                &self.name,
                &self.holder,
                now,
                now.saturating_add(hold_ms),
            )
            .await
        {
            Ok(taken) => taken.is_some(),
            Err(e) => {
                tracing::warn!(error = %e, "renewing a workspace's lease");
                // The lease is still good until its end: a store down for a moment is
                // not a lost workspace.
                true
            }
        }
    }

    /// Gives the workspace back unchanged, now (dropping the lease does it too, but
    /// later: a caller told of the run's end may otherwise find it still held).
    pub async fn give_back(mut self) {
        self.held = false;
        let_go(&*self.store, &self.principal, &self.name, &self.holder).await;
    }

    /// Leaves the workspace held in the store, for a later holder of the same name: a
    /// programmatic session that goes dormant keeps it until it ends.
    pub fn keep(mut self) {
        self.held = false;
    }

    /// Saves what the run left (its answer's `files`) as the workspace, and gives it back.
    /// Its files live `file_ttl_s` from now: those the run did not change too.
    pub async fn save(mut self, files: &[OutputFile]) {
        let ids: Vec<(String, String)> = files
            .iter()
            .map(|f| (f.storage_session_id.clone(), f.id.clone()))
            .collect();
        let now = now_ms();
        if let Err(e) = self
            .store
            .renew(&self.principal, &ids, now, now.saturating_add(self.ttl_ms))
            .await
        {
            tracing::warn!(error = %e, "renewing a workspace's files");
        }
        let files = files
            .iter()
            .map(|f| WorkspaceFile {
                name: f.name.clone(),
                session_id: f.storage_session_id.clone(),
                id: f.id.clone(),
            })
            .collect();
        self.held = false;
        if let Err(e) = self
            .store
            .workspace_release(&self.principal, &self.name, &self.holder, Some(files))
            .await
        {
            tracing::warn!(error = %e, "saving a workspace");
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        // The run did not finish (an error, a client that went away): the workspace
        // keeps what it had.
        let (store, principal, name, holder) = (
            self.store.clone(),
            self.principal.clone(),
            self.name.clone(),
            self.holder.clone(),
        );
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = store.workspace_release(&principal, &name, &holder, None).await {
                    tracing::warn!(error = %e, "giving a workspace back");
                }
            });
        }
    }
}
