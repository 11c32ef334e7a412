//! The audit trail of a session's tool calls: every call the program made, as it was
//! requested (name, the SHA-256 and size of its arguments, when), refused by the server
//! (why), or handed out and then answered (result size, `is_error`, latency) or timed
//! out. Kept with the session in memory, served by
//! `GET /v1/exec/programmatic/{session_id}/calls`, and written to the log (target
//! `sandcall::audit`) as each step happens: the log is the record that outlives the
//! session.
//!
//! A record is found by the helper's call key while its run lives, and by the call id
//! once the call is handed out: a replayed run (new keys) meets its journalled calls by
//! id and adds no second record for a call already listed.

use sandcall_api::{AuditCall, AuditConnection, AuditOutcome};
use sandcall_sandbox::protocol::ToolReply;
use sha2::{Digest, Sha256};
use std::time::{Instant, SystemTime};

/// Records kept per session at most; past it the oldest answered or refused ones give
/// way (counted in `dropped`), so a program that makes calls for hours holds bounded
/// memory.
const MAX_RECORDS: usize = 10_000;

/// Bytes of records kept per session at most (`Record::weight`), besides their count:
/// past it the oldest give way as past `MAX_RECORDS`. 2 MiB holds about 5,000 records of
/// short names and reasons.
pub const MAX_TRAIL_BYTES: usize = 2 << 20;

/// The longest refusal reason kept, sent to the program or logged, in bytes: a reason
/// quotes what was refused (an undeclared name, a value off the schema), which the
/// program chose and may have made megabytes long.
pub const MAX_REASON_BYTES: usize = 1 << 10;

/// The longest tool name a record keeps, in bytes: four bytes for each of the 128
/// characters a declared name may have. The helper refuses longer names before they get
/// here; this holds if it did not.
const MAX_RECORD_NAME_BYTES: usize = 4 * super::tools::MAX_NAME_CHARS;

/// `text`, or its first bytes up to a character boundary followed by a note that it was
/// cut, `max` bytes at most in all (a `max` under the note's length gives the note alone).
pub fn cut(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let note = format!("… [cut: {} bytes in all]", text.len());
    let mut end = max.saturating_sub(note.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{note}", &text[..end]).into()
}

struct Record {
    /// The helper's key of the call in the current run (none once its run has ended).
    key: Option<u64>,
    handed_out: Option<Instant>,
    call: AuditCall,
}

impl Record {
    /// What the record holds in memory, near enough: its fixed part, its strings, and
    /// room for the id and time its answer adds.
    fn weight(&self) -> usize {
        let c = &self.call;
        let reason = match &c.outcome {
            AuditOutcome::Refused { reason } => reason.len(),
            _ => 0,
        };
        const LATER: usize = 64; // call_id and answered_at, once set
        std::mem::size_of::<Record>()
            + LATER
            + c.name.len()
            + c.arguments_sha256.as_ref().map_or(0, String::len)
            + c.requested_at.len()
            + c.mcp_server.as_ref().map_or(0, String::len)
            + reason
    }
}

#[derive(Default)]
pub struct Audit {
    records: Vec<Record>,
    dropped: u64,
    /// The records' weight, all together (`Record::weight`).
    bytes: usize,
    /// The records were let go by `release` (an ended session's, past
    /// `max_ended_session_bytes`).
    released: bool,
    /// The session's proxy, when it was granted network: its connection records are
    /// listed beside the calls (`connections`).
    network: Option<std::sync::Arc<dyn crate::egress::RunEgress>>,
    /// The connections a trail brought back from the store listed (and how many it did
    /// not), listed while no proxy is attached.
    kept_connections: (Vec<AuditConnection>, u64),
}

/// Milliseconds since the epoch, as RFC 3339.
fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A refusal's class, for the metric's `reason` label: `budget` (max_tool_calls and the
/// byte budgets), `unknown_tool`, `check_time` (the check was busy or ran over its
/// budget), or `invalid_arguments`.
fn refusal_kind(reason: &str) -> &'static str {
    const BUDGETS: [&str; 4] = [
        "(max_tool_calls)",
        "(max_tool_call_bytes)",
        "(max_pause_bytes)",
        "(max_session_tool_bytes)",
    ];
    if BUDGETS.iter().any(|b| reason.contains(b)) {
        "budget"
    } else if reason.starts_with("unknown tool") {
        "unknown_tool"
    } else if reason.contains("retry later")
        || reason.contains("took longer than")
        || reason.contains("could not be checked")
    {
        "check_time"
    } else {
        "invalid_arguments"
    }
}

impl Audit {
    fn push(&mut self, record: Record) {
        let weight = record.weight();
        while !self.records.is_empty() && (self.records.len() >= MAX_RECORDS || self.bytes + weight > MAX_TRAIL_BYTES) {
            let settled = self.records.iter().position(|r| r.call.outcome.is_settled());
            let gone = self.records.remove(settled.unwrap_or(0));
            self.bytes -= gone.weight();
            self.dropped += 1;
        }
        self.bytes += weight;
        self.records.push(record);
    }

    /// What the records hold in memory, near enough (see `Record::weight`).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Lets every record go, counting them in `dropped`: an ended session's trail, when
    /// ended sessions hold more than `max_ended_session_bytes`.
    pub fn release(&mut self) {
        self.network = None;
        self.kept_connections = (Vec::new(), 0);
        self.dropped += self.records.len() as u64;
        self.records = Vec::new();
        self.bytes = 0;
        self.released = true;
    }

    /// The records were let go by `release`.
    pub fn released(&self) -> bool {
        self.released
    }

    fn by_key(&mut self, key: u64) -> Option<&mut Record> {
        self.records.iter_mut().rev().find(|r| r.key == Some(key))
    }

    /// A call the program made that passed the server's checks.
    pub fn requested(&mut self, session: &str, key: u64, name: &str, arguments: &str) {
        let call = AuditCall {
            call_id: None,
            name: name.to_owned(),
            arguments_sha256: Some(sha256_hex(arguments.as_bytes())),
            arguments_bytes: Some(arguments.len() as u64),
            requested_at: now_rfc3339(),
            mcp_server: None,
            replayed: false,
            outcome: AuditOutcome::Pending,
        };
        tracing::info!(target: "sandcall::audit", session, name, arguments_sha256 = call.arguments_sha256.as_deref().unwrap_or(""), arguments_bytes = arguments.len(), "tool call requested");
        self.push(Record {
            key: Some(key),
            handed_out: None,
            call,
        });
    }

    /// A call the server refused (unknown tool, arguments off the schema, a budget). The
    /// name and the reason are kept, and logged, cut to their bounds.
    pub fn refused(&mut self, session: &str, name: &str, reason: &str) {
        let name = cut(name, MAX_RECORD_NAME_BYTES);
        let reason = cut(reason, MAX_REASON_BYTES);
        let name = name.as_ref();
        let reason = reason.as_ref();
        let call = AuditCall {
            call_id: None,
            name: name.to_owned(),
            arguments_sha256: None,
            arguments_bytes: None,
            requested_at: now_rfc3339(),
            mcp_server: None,
            replayed: false,
            outcome: AuditOutcome::Refused {
                reason: reason.to_owned(),
            },
        };
        let kind = refusal_kind(reason);
        tracing::info!(target: "sandcall::audit", session, name, kind, reason, "tool call refused");
        metrics::counter!(crate::telemetry::TOOL_CALLS_REFUSED, "reason" => kind).increment(1);
        self.push(Record {
            key: None,
            handed_out: None,
            call,
        });
    }

    /// The call of `key` goes to MCP server `server` (not to the caller) under `call_id`.
    pub fn sent_to_mcp(&mut self, session: &str, key: u64, call_id: &str, server: &str) {
        if let Some(r) = self.by_key(key) {
            r.call.call_id = Some(call_id.to_owned());
            r.call.mcp_server = Some(server.to_owned());
            r.handed_out = Some(Instant::now());
            tracing::info!(target: "sandcall::audit", session, call_id, name = %r.call.name, mcp_server = server, "tool call sent to its MCP server");
            metrics::counter!(crate::telemetry::TOOL_CALLS).increment(1);
        }
    }

    /// The call of `key` is handed out to the caller under `call_id`.
    pub fn handed_out(&mut self, session: &str, key: u64, call_id: &str) {
        if let Some(r) = self.by_key(key) {
            r.call.call_id = Some(call_id.to_owned());
            r.handed_out = Some(Instant::now());
            tracing::info!(target: "sandcall::audit", session, call_id, name = %r.call.name, "tool call handed out");
            metrics::counter!(crate::telemetry::TOOL_CALLS).increment(1);
        }
    }

    /// A replayed run met journalled call `call_id` (now key `key`): listed once, under
    /// its id; a call not listed yet (its record went with an earlier server) is added,
    /// marked `replayed`.
    pub fn replayed(&mut self, key: u64, call_id: &str, name: &str, arguments: &str) {
        if let Some(r) = self
            .records
            .iter_mut()
            .find(|r| r.call.call_id.as_deref() == Some(call_id))
        {
            r.key = Some(key);
            return;
        }
        self.push(Record {
            key: Some(key),
            handed_out: Some(Instant::now()),
            call: AuditCall {
                call_id: Some(call_id.to_owned()),
                name: name.to_owned(),
                arguments_sha256: Some(sha256_hex(arguments.as_bytes())),
                arguments_bytes: Some(arguments.len() as u64),
                requested_at: now_rfc3339(),
                mcp_server: None,
                replayed: true,
                outcome: AuditOutcome::Pending,
            },
        });
    }

    /// The program received `reply` for the call of `key`: the caller's result, or
    /// the server's timeout.
    pub fn answered(&mut self, session: &str, key: u64, reply: &ToolReply) {
        let Some(r) = self.by_key(key) else { return };
        if r.call.outcome.is_settled() {
            // A replay handing the journalled answer back again.
            return;
        }
        let latency_ms = r.handed_out.map_or(0, |t| t.elapsed().as_millis() as u64);
        let answered_at = now_rfc3339();
        r.call.outcome = if reply.kind.as_deref() == Some("timeout") {
            AuditOutcome::TimedOut {
                answered_at,
                latency_ms,
            }
        } else {
            let result_bytes = match (&reply.result, &reply.error) {
                (Some(result), _) => result.get().len(),
                (None, Some(error)) => error.len(),
                (None, None) => 0,
            } as u64;
            AuditOutcome::Answered {
                is_error: !reply.ok,
                result_bytes,
                answered_at,
                latency_ms,
            }
        };
        let outcome = match &r.call.outcome {
            AuditOutcome::TimedOut { .. } => "timed_out",
            AuditOutcome::Answered { is_error: true, .. } => "error",
            _ => "ok",
        };
        tracing::info!(target: "sandcall::audit", session, call_id = r.call.call_id.as_deref().unwrap_or(""), name = %r.call.name, outcome, latency_ms, "tool call answered");
        metrics::counter!(crate::telemetry::TOOL_RESULTS, "outcome" => outcome).increment(1);
    }

    /// The run ended: keys are not reused by its replay.
    pub fn run_ended(&mut self) {
        for r in &mut self.records {
            r.key = None;
        }
    }

    /// The trail as a dormant session keeps it in the store (`SessionStore::sleep`).
    /// A session granted network keeps its connections too: it is never brought back
    /// (docs/egress.md, "Replay"), so the store is where they are listed from then on.
    pub fn snapshot(&self) -> sandcall_store::DormantAudit {
        let (calls, dropped) = self.list();
        let (connections, connections_dropped) = self.connections();
        sandcall_store::DormantAudit {
            calls,
            dropped,
            connections,
            connections_dropped,
        }
    }

    /// The trail of a session brought back from the store: what it listed when it went
    /// dormant. A call still waiting for its answer measures its latency from when it
    /// was requested.
    pub fn restore(kept: sandcall_store::DormantAudit) -> Audit {
        let now = SystemTime::now();
        let mut audit = Audit {
            dropped: kept.dropped,
            kept_connections: (kept.connections, kept.connections_dropped),
            ..Audit::default()
        };
        // Through `push`: a trail kept by an earlier version is held to today's bounds.
        for call in kept.calls {
            let handed_out = call.call_id.as_ref().map(|_| {
                let ago = humantime::parse_rfc3339(&call.requested_at)
                    .ok()
                    .and_then(|at| now.duration_since(at).ok())
                    .unwrap_or_default();
                Instant::now().checked_sub(ago).unwrap_or_else(Instant::now)
            });
            audit.push(Record {
                key: None,
                handed_out,
                call,
            });
        }
        audit
    }

    /// The records, oldest first, and how many gave way to newer ones.
    pub fn list(&self) -> (Vec<AuditCall>, u64) {
        (self.records.iter().map(|r| r.call.clone()).collect(), self.dropped)
    }

    /// The session's proxy, whose connections the trail lists from now on.
    pub fn attach_network(&mut self, run: std::sync::Arc<dyn crate::egress::RunEgress>) {
        self.network = Some(run);
    }

    /// The session's connections through its proxy (or those a restored trail kept), in
    /// the order the program asked for them, and how many are not listed: the latest ones
    /// are kept within what the trail's bounds leave beside the calls (`MAX_RECORDS`,
    /// `MAX_TRAIL_BYTES`).
    pub fn connections(&self) -> (Vec<AuditConnection>, u64) {
        let (mut all, mut dropped) = match &self.network {
            Some(run) => run.connections(),
            None => self.kept_connections.clone(),
        };
        let mut room_records = MAX_RECORDS.saturating_sub(self.records.len());
        let mut room_bytes = MAX_TRAIL_BYTES.saturating_sub(self.bytes);
        let mut keep = 0;
        for c in all.iter().rev() {
            let weight = connection_weight(c);
            if room_records == 0 || weight > room_bytes {
                break;
            }
            room_records -= 1;
            room_bytes -= weight;
            keep += 1;
        }
        let gone = all.len() - keep;
        dropped += gone as u64;
        all.drain(..gone);
        (all, dropped)
    }
}

/// What a connection's record weighs against the trail's byte bound, near enough.
fn connection_weight(c: &AuditConnection) -> usize {
    std::mem::size_of::<AuditConnection>()
        + c.host.len()
        + c.address.as_ref().map_or(0, String::len)
        + c.outcome.len()
        + c.reason.as_ref().map_or(0, String::len)
        + c.opened_at.len()
        + c.closed_at.as_ref().map_or(0, String::len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason_of(audit: &Audit, i: usize) -> String {
        match &audit.list().0[i].outcome {
            AuditOutcome::Refused { reason } => reason.clone(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cut_keeps_short_text_and_cuts_long_text_on_a_char_boundary() {
        assert_eq!(cut("short", 1024), "short");
        let exact = "x".repeat(1024);
        assert_eq!(cut(&exact, 1024), exact);
        // Three-byte characters: the cut cannot fall inside one.
        let long = "€".repeat(1 << 20);
        let cut_text = cut(&long, 1024);
        assert!(cut_text.len() <= 1024, "{}", cut_text.len());
        assert!(cut_text.len() > 900, "{}", cut_text.len());
        assert!(cut_text.starts_with("€€€"));
        assert!(
            cut_text.ends_with(&format!("[cut: {} bytes in all]", long.len())),
            "{cut_text}"
        );
        // A bound under the note's length gives the note alone.
        assert!(cut(&long, 3).starts_with("… [cut:"));
    }

    #[test]
    fn refusals_keep_a_cut_name_and_reason() {
        let mut audit = Audit::default();
        let name = "n".repeat(2 << 20);
        let reason = format!("unknown tool {name:?}: it was not declared for this run");
        audit.refused("s", &name, &reason);
        let (calls, _) = audit.list();
        assert!(calls[0].name.len() <= MAX_RECORD_NAME_BYTES, "{}", calls[0].name.len());
        let kept = reason_of(&audit, 0);
        assert!(kept.len() <= MAX_REASON_BYTES, "{}", kept.len());
        assert!(
            kept.starts_with("unknown tool \"nnn") && kept.contains("[cut: "),
            "{kept}"
        );
        assert!(audit.bytes() < 4 << 10, "{}", audit.bytes());
    }

    #[test]
    fn a_trail_is_held_to_its_byte_budget() {
        let mut audit = Audit::default();
        let reason = "r".repeat(MAX_REASON_BYTES);
        for i in 0..5_000 {
            audit.refused("s", &format!("tool_{i}"), &reason);
            assert!(audit.bytes() <= MAX_TRAIL_BYTES, "{} after {i}", audit.bytes());
        }
        let (calls, dropped) = audit.list();
        // Each record weighs over 1 KiB: the budget, not the count, bound them.
        assert!(calls.len() < 2_048, "{}", calls.len());
        assert_eq!(calls.len() as u64 + dropped, 5_000);
        // The newest are kept.
        assert_eq!(calls.last().unwrap().name, "tool_4999");
        let kept: usize = audit.records.iter().map(Record::weight).sum();
        assert_eq!(kept, audit.bytes());
    }

    #[test]
    fn release_lets_every_record_go_and_says_so() {
        let mut audit = Audit::default();
        for i in 0..10 {
            audit.refused("s", &format!("t{i}"), "no");
        }
        assert!(!audit.released());
        audit.release();
        assert!(audit.released());
        assert_eq!(audit.bytes(), 0);
        let (calls, dropped) = audit.list();
        assert!(calls.is_empty());
        assert_eq!(dropped, 10);
    }

    /// A proxy that has made `n` connections (the connection records alone matter here).
    struct Made(usize);

    impl crate::egress::RunEgress for Made {
        fn serve(
            self: std::sync::Arc<Self>,
            _: tokio::net::UnixStream,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
            Box::pin(async {})
        }
        fn finish(
            self: std::sync::Arc<Self>,
            _: String,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = sandcall_api::NetworkSummary> + Send>> {
            Box::pin(async { Default::default() })
        }
        fn limit_reason(&self) -> Option<&'static str> {
            None
        }
        fn connections(&self) -> (Vec<AuditConnection>, u64) {
            let one = |i: usize| AuditConnection {
                host: format!("h{i}.example.com"),
                port: 443,
                address: None,
                bytes_out: 0,
                bytes_in: 0,
                outcome: "refused".into(),
                reason: Some("x".repeat(200)),
                opened_at: crate::egress::record_time(1_000 + i as u64),
                closed_at: Some(crate::egress::record_time(1_001 + i as u64)),
            };
            ((0..self.0).map(one).collect(), 3)
        }
    }

    #[test]
    fn connections_share_the_trails_bounds_and_the_latest_are_kept() {
        let mut audit = Audit::default();
        audit.attach_network(std::sync::Arc::new(Made(5)));
        let (listed, dropped) = audit.connections();
        assert_eq!((listed.len(), dropped), (5, 3));
        // Calls that fill the trail's bytes but for a few connections' room.
        audit.attach_network(std::sync::Arc::new(Made(20_000)));
        let mut i = 0;
        while audit.bytes() < MAX_TRAIL_BYTES - (20 << 10) {
            audit.refused("s", &format!("t{i}"), &"n".repeat(MAX_REASON_BYTES));
            i += 1;
        }
        let (listed, dropped) = audit.connections();
        assert!(!listed.is_empty() && listed.len() < 100, "{}", listed.len());
        let weight: usize = listed.iter().map(connection_weight).sum();
        assert!(audit.bytes() + weight <= MAX_TRAIL_BYTES);
        assert_eq!(listed.len() as u64 + dropped, 20_003);
        assert_eq!(listed.last().unwrap().host, "h19999.example.com");
        // A released trail lists none.
        audit.release();
        assert_eq!(audit.connections(), (Vec::new(), 0));
    }

    #[test]
    fn a_dormant_trail_keeps_its_connections_and_their_count() {
        let mut audit = Audit::default();
        audit.refused("s", "t", "no");
        audit.attach_network(std::sync::Arc::new(Made(4)));
        let kept = audit.snapshot();
        assert_eq!((kept.connections.len(), kept.connections_dropped), (4, 3));
        // Through the store's JSON, as a dormant session keeps it.
        let json = serde_json::to_string(&kept).unwrap();
        let back: sandcall_store::DormantAudit = serde_json::from_str(&json).unwrap();
        assert_eq!(back.connections, kept.connections);
        let restored = Audit::restore(back);
        assert_eq!(restored.connections(), (kept.connections.clone(), 3));
        assert_eq!(restored.connections().0[1].opened_at, "1970-01-01T00:00:01.001Z");
        assert_eq!(restored.list().0.len(), 1);
        // A trail kept before connections were: none, none dropped.
        let old: sandcall_store::DormantAudit = serde_json::from_str(r#"{"calls": [], "dropped": 2}"#).unwrap();
        assert_eq!(Audit::restore(old).connections(), (Vec::new(), 0));
    }
}
