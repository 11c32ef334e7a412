//! sandcall's engine: everything a request does between its parsing and its answer, with
//! no HTTP in it. Admission, the warm pool, the runner and the helper launcher that build
//! sandboxes, the languages and runtimes, `/v1/exec`'s command and result, programmatic
//! sessions, file operations and workspaces, the MCP client, and `doctor`. It never forks,
//! enters namespaces or loads seccomp filters: those happen only in the helper process
//! (`sandcall_sandbox::helper`). It never imports axum or hyper and never chooses an HTTP
//! status: failures are `EngineError`s, which the server maps.

// Request paths answer errors, they do not panic (tests may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod admission;
pub mod doctor;
pub mod egress;
pub mod error;
pub mod exec;
pub mod files;
pub mod gvisor;
pub mod helper_tier;
pub mod host;
pub mod isolation;
pub mod json;
pub mod launcher;
pub mod mcp_client;
pub mod npm_runtime;
pub mod pool;
pub mod programmatic;
pub mod python_runtime;
pub mod run;
pub mod runner;
pub mod runtime;
pub mod telemetry;
pub mod toolchains;
pub mod visible;

use admission::Admission;
use error::EngineError;
use runner::{RunError, RunSpec, Runner};
use sandcall_api::{error_type, ExecResponse};
use sandcall_config::Config;
use std::sync::Arc;

/// What every request needs of the engine: the configuration, the runner and its warm
/// pool, admission, programmatic sessions and the file store. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    pub config: Arc<Config>,
    pub runner: Runner,
    pub admission: Admission,
    pub sessions: programmatic::session::Sessions,
    /// The warm pool of the server's own tier (`isolation`), for the health route.
    pub pool: pool::Pool,
    /// Where runs get their sandboxes: one `helper_tier::HelperTier` per tier this
    /// server has.
    pub tiers: isolation::Tiers,
    /// A health check's trial run is under way.
    pub probing: Arc<std::sync::atomic::AtomicBool>,
    pub files: Arc<dyn files::FileStore>,
    /// Where helpers put a run's output files before the store takes them.
    pub outbox_dir: std::path::PathBuf,
    /// The egress proxy, when the configuration allows any host (`egress_allow`).
    pub egress: Option<egress::Egress>,
}

impl Engine {
    /// Whether sandboxes can be built: after a failure, a trial run (outside admission
    /// control, so a full queue cannot hide a recovery) decides. Returns the reason when not.
    pub async fn sandbox_unavailable(&self) -> Option<String> {
        let failing = self.tiers.failing()?;
        // One trial at a time, however many health checks arrive meanwhile.
        if self.probing.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Some(failing);
        }
        let still = self.probe().await;
        self.probing.store(false, std::sync::atomic::Ordering::SeqCst);
        still
    }

    async fn probe(&self) -> Option<String> {
        for (_, tier) in self.tiers.present().filter(|(_, t)| t.failing().is_some()) {
            let launch = runtime::launch(sandcall_api::Language::Bash, &self.config.languages.bash, &[]);
            let limits = exec::resolve_limits(&self.config, None).ok()?;
            let spec = RunSpec::new(sandcall_api::ids::new_id(), "exit 0".into(), launch, 10_000, limits);
            let _ = tier.run(None, spec, Box::new(())).await;
        }
        self.tiers.failing()
    }

    /// Runs a validated exec command: stages its files, waits for a slot, runs, stores
    /// its output files, maps the outcome.
    /// Also says whether the run had a warm sandbox.
    /// `tier` is the principal's isolation tier; the request may ask for a stronger one.
    pub async fn execute(
        &self,
        principal: &sandcall_auth::Principal,
        tier: sandcall_config::Isolation,
        cmd: exec::ExecCommand,
    ) -> Result<(ExecResponse, bool), EngineError> {
        let (_, tier) = self.tiers.pick(tier, cmd.isolation)?;
        let granted = egress::grant(self.egress.as_ref(), &principal.0, cmd.network.as_ref())?;
        // A run in a workspace holds it until its outputs are stored (files::workspace).
        let mut cmd = cmd;
        if exec::is_prewarm(&cmd) {
            let name = cmd.workspace.as_deref().unwrap_or_default();
            let id = files::workspace::runtime_session_id(&principal.0, name);
            return Ok((exec::prewarm_response(id), false));
        }
        let mut runtime = None;
        let workspace = match cmd.workspace.clone() {
            Some(name) => {
                let hold_ms = cmd.timeout_ms + self.config.limits.queue_timeout_ms + WORKSPACE_HOLD_MARGIN_MS;
                let (lease, inputs) = files::workspace::take(
                    self.files.clone(),
                    &principal.0,
                    &name,
                    hold_ms,
                    self.config.files.file_ttl_s * 1000,
                    &cmd.files,
                )
                .await?;
                let status = if inputs.is_empty() {
                    sandcall_api::RuntimeStatus::New
                } else {
                    sandcall_api::RuntimeStatus::Reused
                };
                runtime = Some((files::workspace::runtime_session_id(&principal.0, &name), status));
                cmd.files.extend(inputs);
                Some(lease)
            }
            None => None,
        };
        let inputs =
            files::ops::resolve_inputs(&*self.files, &principal.0, &cmd.files, cmd.limits.workspace_bytes).await?;
        let queued = std::time::Instant::now();
        let slot = self.admission.admit(&principal.0).await?;
        telemetry::elapsed(telemetry::QUEUE_SECONDS, queued);
        // A warm sandbox serves requests that keep the default limits (with `zygote`, one
        // forked now when the pool is empty).
        // A run with network is built for it: its program's environment names the proxy.
        let warm = if cmd.custom_limits || granted.is_some() {
            None
        } else {
            tier.take_warm(&principal.0, cmd.language, &cmd.code).await
        };
        let session_id = warm
            .as_ref()
            .map_or_else(sandcall_api::ids::new_id, |h| h.run_id().to_owned());
        tracing::Span::current().record("session_id", session_id.as_str());
        let language = cmd.language;
        let launch = exec::launch_for(&cmd, &self.config);
        let outbox = self.outbox_dir.join(&session_id);
        // Whatever happens to this request (a client that goes away drops it mid-way),
        // the run's outbox does not outlive it.
        let _outbox = OutboxGuard(outbox.clone());
        let stderr_cap = cmd.limits.max_output_bytes;
        let mut spec = RunSpec::new(session_id.clone(), cmd.code, launch, cmd.timeout_ms, cmd.limits);
        spec.stdin = cmd.stdin;
        let staged = inputs.clone();
        spec.inputs = inputs;
        spec.collect = Some(files::ops::collect_into(
            &self.config,
            &outbox,
            spec.limits.workspace_bytes,
        ));
        // The run's way out, served until the run is over (dropping it closes it).
        let endpoint = egress::open_for(self.egress.as_ref(), granted, &session_id, &mut spec, language)?;
        // The slot travels with the run, which finishes even if the client goes away.
        let started = std::time::Instant::now();
        let was_warm = warm.is_some();
        let outcome = match warm {
            Some(helper) => {
                let (go, files) = runtime::warm_go(cmd.language, &cmd.args, None);
                spec.go = Some(go);
                spec.support_files.extend(files);
                tier.run(Some(helper), spec, Box::new(slot)).await
            }
            None => tier.run(None, spec, Box::new(slot)).await,
        };
        tracing::debug!(
            warm = was_warm,
            elapsed_us = started.elapsed().as_micros() as u64,
            "run finished"
        );
        let mut result = match outcome {
            Ok(result) => result,
            Err(e @ (RunError::Spawn(_) | RunError::Protocol(_) | RunError::Sandbox(_))) => {
                let _ = tokio::fs::remove_dir_all(&outbox).await;
                return Err(EngineError::internal(error_type::SANDBOX_FAILURE, &e.to_string()));
            }
        };
        let stored = files::ops::ingest(
            &*self.files,
            &principal.0,
            &session_id,
            &self.config,
            &staged,
            &outbox,
            &mut result,
        )
        .await;
        let wall_ms = result.wall_time_ms;
        let mut response = exec::to_response(session_id, result, stderr_cap);
        telemetry::run_ended(
            "exec",
            runtime::languages::name(language, &self.config),
            response.status.label(),
            wall_ms,
        );
        response.artifact_delivery = sandcall_api::ArtifactDelivery::of(stored.delivered, stored.undelivered);
        response.artifact_truncation =
            sandcall_api::ArtifactTruncation::of(&stored.skipped, stored.skipped_total, stored.undelivered);
        response.files = stored.files;
        response.files_skipped = stored.skipped;
        response.files_skipped_total = stored.skipped_total;
        response.deleted_files = stored.deleted;
        if let Some(endpoint) = endpoint {
            let (summary, note) = endpoint.finish(&response.session_id).await;
            response.network = Some(summary);
            exec::append_notes(&mut response.stderr, note.as_slice());
        }
        if let Some((id, status)) = runtime {
            response.runtime_session_id = Some(id);
            response.runtime_status = Some(status);
        }
        if let Some(lease) = workspace {
            lease.save(&response.files).await;
        }
        Ok((response, was_warm))
    }
}

/// How long a workspace's lease outlasts the run's own time and its wait for a slot:
/// collecting and storing the outputs.
const WORKSPACE_HOLD_MARGIN_MS: u64 = 120_000;

/// Removes a run's outbox directory when dropped.
struct OutboxGuard(std::path::PathBuf);

impl Drop for OutboxGuard {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
