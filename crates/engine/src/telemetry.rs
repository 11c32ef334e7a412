//! What the server counts and times, for `GET /metrics` (Prometheus text format, the
//! `metrics` facade with its Prometheus exporter): the metrics' names and the calls that
//! record them. The HTTP side (each request's span and timing, the scrape route) is the
//! server's `telemetry`.
//!
//! The recorder is the process's one global recorder, installed by `install` at the
//! start of `serve`. Code that records before it (unit tests, the CLI) records into the
//! facade's no-op recorder. No label holds a principal, a session id or anything a
//! caller chose freely: languages and statuses are from closed sets, routes are the
//! router's templates.

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use sandcall_api::error_type;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Runs that ended, by `kind` (`exec`, `programmatic`), `language` and `status`.
pub const RUNS: &str = "sandcall_runs_total";
/// Seconds a run waited for its slot (`max_concurrent_runs`).
pub const QUEUE_SECONDS: &str = "sandcall_run_queue_seconds";
/// Seconds to build a sandbox, by `warm` (`true`: for the pool, ahead of a request).
pub const BUILD_SECONDS: &str = "sandcall_sandbox_build_seconds";
/// Seconds a program ran (its wall time), by `kind` and `language`.
pub const RUN_SECONDS: &str = "sandcall_run_seconds";
/// Seconds from a request's arrival to its answer, by `method`, `route` (the route's
/// template, `/v1/files/:session_id`; `unmatched` for a path no route has) and `status`.
pub const REQUEST_SECONDS: &str = "sandcall_http_request_duration_seconds";
/// Requests answered, by `method`, `route` and `status`.
pub const REQUESTS: &str = "sandcall_http_requests_total";
/// Requests refused before they ran, by `reason` (the `error_type`: `at_capacity`,
/// `principal_at_capacity`, `rate_limited`).
pub const REFUSALS: &str = "sandcall_admission_refusals_total";
/// Sandboxes forked from a template, by how their first process got into its cgroup:
/// `cloned` (cgroup v2: born there, `clone3` with `CLONE_INTO_CGROUP`) or `moved` (by
/// the helper, after its hello: cgroup v1, or no such call).
pub const FORKED_RUNS: &str = "sandcall_forked_sandboxes_total";
/// Warm sandboxes ready, by `language` and `preloaded`.
pub const WARM_IDLE: &str = "sandcall_warm_sandboxes";
/// Programmatic sessions holding a sandbox, and those of them paused.
pub const SESSIONS_LIVE: &str = "sandcall_sessions_live";
pub const SESSIONS_PAUSED: &str = "sandcall_sessions_paused";
/// Paused sessions kept only in the session store (evicted, or left by a restart).
pub const SESSIONS_DORMANT: &str = "sandcall_sessions_dormant";
/// Sessions this node keeps an entry of in memory (live ones, ended ones still readable);
/// a dormant session has none.
pub const SESSIONS_IN_MEMORY: &str = "sandcall_sessions_in_memory";
/// Bytes the audit trails of ended sessions still readable hold (`max_ended_session_bytes`).
pub const ENDED_TRAIL_BYTES: &str = "sandcall_ended_session_trail_bytes";
/// Sessions evicted (their sandbox freed while paused).
pub const EVICTIONS: &str = "sandcall_sessions_evicted_total";
/// Tool calls handed out to callers, by `language`.
pub const TOOL_CALLS: &str = "sandcall_tool_calls_total";
/// Tool calls the server refused before the caller saw them, by `reason`.
pub const TOOL_CALLS_REFUSED: &str = "sandcall_tool_calls_refused_total";
/// Tool results received, by `is_error`.
pub const TOOL_RESULTS: &str = "sandcall_tool_results_total";
/// Bytes of files stored (uploads and run outputs), and how many files.
pub const STORED_BYTES: &str = "sandcall_stored_bytes_total";
pub const STORED_FILES: &str = "sandcall_stored_files_total";
/// Connections runs opened through the egress proxy, by `outcome` (`relayed`, `refused`).
pub const EGRESS_CONNECTIONS: &str = "sandcall_egress_connections_total";
/// Bytes through the egress proxy, by `direction` (`out`: sent upstream, `in`).
pub const EGRESS_BYTES: &str = "sandcall_egress_bytes_total";

/// Counts a run's egress once it is over.
pub fn egress(summary: &sandcall_api::NetworkSummary) {
    let relayed = summary.connections.saturating_sub(summary.refused);
    metrics::counter!(EGRESS_CONNECTIONS, "outcome" => "relayed").increment(relayed);
    metrics::counter!(EGRESS_CONNECTIONS, "outcome" => "refused").increment(summary.refused);
    metrics::counter!(EGRESS_BYTES, "direction" => "out").increment(summary.bytes_out);
    metrics::counter!(EGRESS_BYTES, "direction" => "in").increment(summary.bytes_in);
}

/// Buckets of the latency histograms, in seconds: 1 ms to 5 min.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Why the Prometheus recorder could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("metrics: {0}")]
pub struct TelemetryError(#[from] BuildError);

/// Installs the Prometheus recorder as the process's recorder (once; later calls keep
/// the first), and keeps its histograms trimmed.
pub fn install() -> Result<(), TelemetryError> {
    if HANDLE.get().is_some() {
        return Ok(());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)?
        .install_recorder()?;
    describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    let _ = HANDLE.set(handle);
    Ok(())
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(RUNS, "Runs that ended, by kind, language and status.");
    describe_histogram!(QUEUE_SECONDS, Unit::Seconds, "Time a run waited for a run slot.");
    describe_histogram!(
        BUILD_SECONDS,
        Unit::Seconds,
        "Time to build a sandbox (warm: for the pool)."
    );
    describe_histogram!(RUN_SECONDS, Unit::Seconds, "Wall time of a program's run.");
    describe_histogram!(REQUEST_SECONDS, Unit::Seconds, "Time from a request to its answer.");
    describe_counter!(REQUESTS, "Requests answered, by method, route and status.");
    describe_counter!(REFUSALS, "Requests refused by admission control or a rate, by reason.");
    describe_counter!(
        FORKED_RUNS,
        "Sandboxes forked from a template, by how their first process got into its cgroup."
    );
    describe_gauge!(WARM_IDLE, "Warm sandboxes ready, by language.");
    describe_gauge!(SESSIONS_LIVE, "Programmatic sessions holding a sandbox.");
    describe_gauge!(SESSIONS_PAUSED, "Live programmatic sessions paused on tool calls.");
    describe_gauge!(SESSIONS_DORMANT, "Paused sessions kept only in the session store.");
    describe_gauge!(SESSIONS_IN_MEMORY, "Programmatic sessions this node keeps in memory.");
    describe_gauge!(
        ENDED_TRAIL_BYTES,
        "Bytes the audit trails of ended sessions still readable hold."
    );
    describe_counter!(EVICTIONS, "Paused sessions evicted from their sandbox.");
    describe_counter!(TOOL_CALLS, "Tool calls handed out to callers.");
    describe_counter!(TOOL_CALLS_REFUSED, "Tool calls refused by the server, by reason.");
    describe_counter!(TOOL_RESULTS, "Tool results received, by is_error.");
    describe_counter!(STORED_BYTES, Unit::Bytes, "Bytes of files stored.");
    describe_counter!(STORED_FILES, "Files stored.");
}

/// One run that ended.
/// `status`: an exec run's (`ok`, `failed`, ...), or a session's ending (`completed`, or
/// its `error_type`).
pub fn run_ended(kind: &'static str, language: &str, status: &str, wall_ms: u64) {
    let labels = [("kind", kind.to_owned()), ("language", language.to_owned())];
    metrics::counter!(
        RUNS,
        &[
            ("kind", kind.to_owned()),
            ("language", language.to_owned()),
            ("status", status.to_owned())
        ]
    )
    .increment(1);
    metrics::histogram!(RUN_SECONDS, &labels).record(wall_ms as f64 / 1000.0);
}

/// A refusal answered before anything ran, by its `error_type`.
pub fn refused(error_type: &'static str) {
    if matches!(
        error_type,
        error_type::AT_CAPACITY | error_type::PRINCIPAL_AT_CAPACITY | error_type::RATE_LIMITED
    ) {
        metrics::counter!(REFUSALS, "reason" => error_type).increment(1);
    }
}

/// Every metric in Prometheus's text format; `None` before `install`.
pub fn render() -> Option<String> {
    HANDLE.get().map(PrometheusHandle::render)
}

/// A time, from `since` to now, into histogram `name`.
pub fn elapsed(name: &'static str, since: Instant) {
    metrics::histogram!(name).record(since.elapsed().as_secs_f64());
}

/// Files stored: how many, and their bytes together.
pub fn stored(files: u64, bytes: u64) {
    metrics::counter!(STORED_FILES).increment(files);
    metrics::counter!(STORED_BYTES).increment(bytes);
}
