//! One run's egress: its grant, its budgets and counters, and the record of every
//! connection attempt. `proxy.rs` serves the program's connections against it.

use crate::meter::{Budget, ConnCounts, BYTES_LIMIT};
use crate::policy::Grant;
use crate::secrets::Interceptor;
use serde::Serialize;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

/// The records a run keeps; attempts past them are counted in the summary only, so that a
/// program looping on refused hosts cannot grow the server's memory.
pub const MAX_RECORDS: usize = 1000;
/// Connections to the proxy a run may hold open at once: its `max_connections`, within
/// these bounds (each holds a descriptor of the server, two while it relays). Further ones
/// are closed at once.
const MIN_OPEN_CLIENTS: usize = 16;
const MAX_OPEN_CLIENTS: usize = 256;

pub(crate) const CONNECTION_LIMIT: &str = "network connection limit exceeded";
pub(crate) const TIME_LIMIT: &str = "network connection time limit exceeded";

/// How names are resolved: the host's resolver (the system's, through tokio), with a time
/// limit. Tests reach loopback servers through `Policy::allow_addresses`, not a fake.
#[derive(Debug, Clone)]
pub struct Resolver {
    pub(crate) timeout: Duration,
}

impl Resolver {
    /// The host's resolver, waiting at most 10 seconds for an answer.
    pub fn system() -> Self {
        Resolver {
            timeout: Duration::from_secs(10),
        }
    }
}

impl Default for Resolver {
    fn default() -> Self {
        Resolver::system()
    }
}

/// What became of one connection attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Connected and relayed until one side closed.
    Relayed,
    /// Refused by the policy or the address rules.
    Refused,
    /// Allowed, but the name did not resolve or the connection failed.
    Failed,
    /// Refused or cut by a bound of the run (connections, bytes, time).
    Limited,
}

/// One connection attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Record {
    pub host: String,
    pub port: u16,
    /// The address connected to (or the one that was refused).
    pub address: Option<IpAddr>,
    pub bytes_out: u64,
    pub bytes_in: u64,
    pub outcome: Outcome,
    /// Why it was refused, failed or limited.
    pub reason: Option<String>,
    /// When the program asked the proxy for it, in ms since the epoch.
    pub opened_at_ms: u64,
    /// When it was over, in ms since the epoch: when it was refused or failed, or when a
    /// relayed connection closed or was cut. None while it is open.
    pub closed_at_ms: Option<u64>,
}

/// Now, in ms since the epoch (the time of records).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A run's egress in numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Summary {
    /// Connection attempts, whatever became of them.
    pub connections: u64,
    /// Attempts refused by the policy, the address rules or a bound.
    pub refused: u64,
    /// Attempts that failed to resolve or connect.
    pub failed: u64,
    /// Bytes sent upstream and received from upstream, over all connections.
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// Attempts past `MAX_RECORDS`, counted here but not recorded.
    pub records_dropped: u64,
}

/// A run's egress: its grant, counters and records, shared by all its connections.
pub struct RunEgress {
    pub(crate) grant: Grant,
    pub(crate) resolver: Resolver,
    pub(crate) out: Arc<Budget>,
    pub(crate) inb: Arc<Budget>,
    /// Upstream connections opened or being opened (they count against the limit).
    pub(crate) opened: AtomicU32,
    /// Upstream connections open now.
    open: AtomicU32,
    attempts: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
    records: Mutex<Vec<Record>>,
    limit_reason: OnceLock<&'static str>,
    pub(crate) clients: Arc<Semaphore>,
    /// `serve` calls under way, and the wake-up for `close_and_wait` when one ends.
    pub(crate) serving: AtomicU32,
    pub(crate) served: Notify,
    pub(crate) closed: CancellationToken,
    /// TLS interception for the grant's secrets, if the server set it up.
    pub(crate) tls: Option<Arc<Interceptor>>,
}

impl RunEgress {
    pub fn new(grant: Grant, resolver: Resolver) -> Arc<RunEgress> {
        Self::build(grant, resolver, None)
    }

    /// A run whose `CONNECT`s to hosts with a secret in `grant.secrets` are intercepted
    /// with `tls` (see docs/egress.md, "Secrets"). Without it (`new`), such `CONNECT`s are
    /// opaque tunnels like any other and placeholders reach the host unreplaced.
    pub fn with_interceptor(grant: Grant, resolver: Resolver, tls: Arc<Interceptor>) -> Arc<RunEgress> {
        Self::build(grant, resolver, Some(tls))
    }

    fn build(grant: Grant, resolver: Resolver, tls: Option<Arc<Interceptor>>) -> Arc<RunEgress> {
        let clients = (grant.limits.max_connections as usize).clamp(MIN_OPEN_CLIENTS, MAX_OPEN_CLIENTS);
        Arc::new(RunEgress {
            out: Arc::new(Budget::new(grant.limits.max_bytes_out)),
            inb: Arc::new(Budget::new(grant.limits.max_bytes_in)),
            grant,
            resolver,
            opened: AtomicU32::new(0),
            open: AtomicU32::new(0),
            attempts: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            records: Mutex::new(Vec::new()),
            limit_reason: OnceLock::new(),
            clients: Arc::new(Semaphore::new(clients)),
            serving: AtomicU32::new(0),
            served: Notify::new(),
            closed: CancellationToken::new(),
            tls,
        })
    }

    /// The grant this run was given.
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// Every connection attempt so far, in the order the program asked for them
    /// (`opened_at_ms`; attempts asked for in the same ms in the order they were decided),
    /// at most `MAX_RECORDS`.
    pub fn records(&self) -> Vec<Record> {
        let mut records = self.lock_records().clone();
        // Kept in the order they were decided: one that took long to resolve or connect
        // is kept after those asked for later.
        records.sort_by_key(|r| r.opened_at_ms);
        records
    }

    pub fn summary(&self) -> Summary {
        Summary {
            connections: self.attempts.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            bytes_out: self.out.used(),
            bytes_in: self.inb.used(),
            records_dropped: self.dropped.load(Ordering::Relaxed),
        }
    }

    /// Upstream connections open now (their records are complete once this is 0).
    pub fn open_connections(&self) -> u32 {
        self.open.load(Ordering::Relaxed)
    }

    /// The `[sandbox]` reason of the first bound that refused or cut traffic, if any.
    pub fn limit_reason(&self) -> Option<&'static str> {
        self.limit_reason.get().copied()
    }

    /// Ends every connection of the run (tunnels and requests under way included); later
    /// connections are closed at once. For the end of a run.
    pub fn close(&self) {
        self.closed.cancel();
    }

    /// `close`, then waits until every `serve` call has returned: from then on the
    /// records and the summary are final.
    pub async fn close_and_wait(&self) {
        self.close();
        loop {
            let ended = self.served.notified();
            tokio::pin!(ended);
            // Registered before the count is read, so that no wake-up falls in between.
            ended.as_mut().enable();
            if self.serving.load(Ordering::Acquire) == 0 {
                return;
            }
            ended.await;
        }
    }

    fn lock_records(&self) -> MutexGuard<'_, Vec<Record>> {
        self.records.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn set_limit(&self, reason: &'static str) {
        let _ = self.limit_reason.set(reason);
    }

    /// Records an attempt; its index while the record is to be completed, if it was kept.
    pub(crate) fn record(&self, record: Record) -> Option<usize> {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        match record.outcome {
            Outcome::Refused | Outcome::Limited => self.refused.fetch_add(1, Ordering::Relaxed),
            Outcome::Failed => self.failed.fetch_add(1, Ordering::Relaxed),
            Outcome::Relayed => 0,
        };
        if let Outcome::Limited = record.outcome {
            if let Some(reason) = limit_of(record.reason.as_deref()) {
                self.set_limit(reason);
            }
        }
        let mut records = self.lock_records();
        if records.len() >= MAX_RECORDS {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        records.push(record);
        Some(records.len() - 1)
    }

    /// Records a connection that opened; its record is completed when the returned
    /// guard is dropped.
    pub(crate) fn record_open(
        self: &Arc<Self>,
        record: Record,
        counts: Arc<ConnCounts>,
        timed_out: Arc<AtomicBool>,
    ) -> OpenRecord {
        self.open.fetch_add(1, Ordering::Relaxed);
        let index = self.record(record);
        OpenRecord {
            run: self.clone(),
            index,
            counts,
            timed_out,
            failure: Mutex::new(None),
        }
    }

    /// Completes the record of a relayed connection as it closes.
    fn finish(&self, index: Option<usize>, counts: &ConnCounts, timed_out: bool, failure: Option<String>) {
        if failure.is_some() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        let limited = if counts.cut.load(Ordering::Relaxed) {
            Some(BYTES_LIMIT)
        } else if timed_out {
            Some(TIME_LIMIT)
        } else {
            None
        };
        if let Some(reason) = limited {
            self.set_limit(reason);
        }
        let Some(index) = index else {
            self.open.fetch_sub(1, Ordering::Relaxed);
            return;
        };
        let mut records = self.lock_records();
        if let Some(record) = records.get_mut(index) {
            record.closed_at_ms = Some(now_ms());
            record.bytes_out = counts.bytes_out.load(Ordering::Relaxed);
            record.bytes_in = counts.bytes_in.load(Ordering::Relaxed);
            if let Some(reason) = limited {
                record.outcome = Outcome::Limited;
                record.reason = Some(reason.to_string());
            } else if let Some(reason) = failure {
                record.outcome = Outcome::Failed;
                record.reason = Some(reason);
            }
        }
        drop(records);
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

fn limit_of(reason: Option<&str>) -> Option<&'static str> {
    [BYTES_LIMIT, CONNECTION_LIMIT, TIME_LIMIT]
        .into_iter()
        .find(|r| Some(*r) == reason)
}

/// Counts a `serve` call under way, until it returns.
pub(crate) struct Serving<'a>(&'a RunEgress);

impl<'a> Serving<'a> {
    pub(crate) fn begin(run: &'a RunEgress) -> Self {
        run.serving.fetch_add(1, Ordering::AcqRel);
        Serving(run)
    }
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.0.serving.fetch_sub(1, Ordering::AcqRel);
        self.0.served.notify_waiters();
    }
}

/// Completes a relayed connection's record when the connection is dropped, however it
/// ends (closed by a side, cut by a budget, or dropped at the time limit).
pub(crate) struct OpenRecord {
    run: Arc<RunEgress>,
    index: Option<usize>,
    pub(crate) counts: Arc<ConnCounts>,
    /// Set by the connection to the proxy when its time limit ends it.
    timed_out: Arc<AtomicBool>,
    /// Why a connection that opened failed after all (TLS of an intercepted one).
    failure: Mutex<Option<String>>,
}

impl OpenRecord {
    /// Marks the connection `failed` with `reason` (the first reason given stays).
    pub(crate) fn fail(&self, reason: String) {
        tracing::debug!(%reason, "egress: connection failed");
        let mut failure = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        failure.get_or_insert(reason);
    }
}

impl Drop for OpenRecord {
    fn drop(&mut self) {
        let timed_out = self.timed_out.load(Ordering::Relaxed);
        let failure = self.failure.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        self.run.finish(self.index, &self.counts, timed_out, failure);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    fn run() -> Arc<RunEgress> {
        let limits = crate::Limits {
            max_connections: 1,
            max_bytes_out: 1,
            max_bytes_in: 1,
            max_connection_seconds: 1,
        };
        RunEgress::new(Policy::default().grant(None, limits).unwrap(), Resolver::system())
    }

    fn refused(host: &str) -> Record {
        Record {
            host: host.into(),
            port: 443,
            address: None,
            bytes_out: 0,
            bytes_in: 0,
            outcome: Outcome::Refused,
            reason: Some("not in the policy".into()),
            opened_at_ms: 1_000,
            closed_at_ms: Some(1_002),
        }
    }

    #[test]
    fn records_stop_at_their_cap_and_the_summary_counts_the_rest() {
        let run = run();
        for i in 0..MAX_RECORDS + 5 {
            run.record(refused(&format!("h{i}.example")));
        }
        assert_eq!(run.records().len(), MAX_RECORDS);
        let summary = run.summary();
        assert_eq!(
            (summary.connections, summary.refused, summary.records_dropped),
            (MAX_RECORDS as u64 + 5, MAX_RECORDS as u64 + 5, 5)
        );
        assert_eq!(run.limit_reason(), None);
    }

    #[test]
    fn records_list_in_the_order_asked_for_and_close_with_a_time() {
        let run = run();
        let slow = Record {
            outcome: Outcome::Relayed,
            reason: None,
            closed_at_ms: None,
            ..refused("slow.example")
        };
        // Asked for after the slow one but decided first: listed after it all the same.
        run.record(Record {
            opened_at_ms: 2_000,
            closed_at_ms: Some(2_000),
            ..refused("quick.example")
        });
        let before = now_ms();
        let open = run.record_open(slow, Arc::default(), Arc::default());
        let hosts = |run: &RunEgress| run.records().into_iter().map(|r| r.host).collect::<Vec<_>>();
        assert_eq!(hosts(&run), ["slow.example", "quick.example"]);
        assert_eq!(run.records()[0].closed_at_ms, None);
        drop(open);
        let closed = run.records()[0].closed_at_ms.expect("closed with a time");
        assert!(closed >= before && closed <= now_ms(), "{closed}");
        assert_eq!(run.open_connections(), 0);
    }

    #[test]
    fn records_and_summaries_serialize_plainly() {
        let run = run();
        run.record(refused("api.other.com"));
        let json = serde_json::to_value(run.records()).unwrap();
        assert_eq!(
            json,
            serde_json::json!([{"host": "api.other.com", "port": 443, "address": null, "bytes_out": 0, "bytes_in": 0,
                "outcome": "refused", "reason": "not in the policy",
                "opened_at_ms": 1_000, "closed_at_ms": 1_002}])
        );
        let summary = serde_json::to_value(run.summary()).unwrap();
        assert_eq!(summary["connections"], 1);
        assert_eq!(summary["refused"], 1);
    }
}
