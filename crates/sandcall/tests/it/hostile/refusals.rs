//! Tool calls the server refuses cost it bounded memory, however long what the program
//! sent: names over the declared limit never leave the helper, and a refusal's reason
//! (which quotes the name or the value) is cut before the program, the audit trail and
//! the log get it.

use crate::common::{hostile, Server};
use serde_json::{json, Value};

const ROUTE: &str = "/v1/exec/programmatic";
/// What the server's resident memory may keep after the run, in MiB. Kept whole, the
/// refusals' names and reasons are about 280 MB; cut, under 200 KiB. The rest is room for
/// what the allocator keeps of the calls parsed on their way (2 MB each, four at once).
const MAX_GROWTH_MIB: u64 = 48;
/// The longest reason kept (`MAX_REASON_BYTES` in the engine).
const MAX_REASON_BYTES: usize = 1024;

fn count_tool() -> Value {
    json!({"name": "count", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}})
}

fn rss_kib(s: &Server) -> u64 {
    crate::common::proc_status_kib(s.pid(), "VmRSS").expect("the server's VmRSS")
}

#[test]
fn long_names_and_values_in_refused_calls_are_not_kept() {
    let s = Server::start();
    // A first session, so that what a session's first run allocates is not counted.
    let warm = json!({"code": "print(1)", "tools": [count_tool()]});
    let (status, r) = s.post(ROUTE, &warm);
    assert_eq!((status, r["status"].as_str()), (200, Some("completed")), "{r}");
    let before = rss_kib(&s);

    let body = json!({"code": hostile("refusal_bloat.py"), "args": ["big"], "tools": [count_tool()], "timeout": 60000});
    let (status, r) = s.post(ROUTE, &body);
    assert_eq!((status, r["status"].as_str()), (200, Some("completed")), "{r}");
    let out: Value = serde_json::from_str(r["stdout"].as_str().unwrap().trim()).unwrap_or_else(|e| panic!("{e}: {r}"));
    let after = rss_kib(&s);
    let growth = after.saturating_sub(before);
    eprintln!(
        "refused calls: the server's RSS {} -> {} MiB",
        before >> 10,
        after >> 10
    );
    assert!(
        growth < MAX_GROWTH_MIB << 10,
        "the server kept {} MiB after the refusals (RSS {} -> {} MiB)",
        growth >> 10,
        before >> 10,
        after >> 10
    );

    // Every call was answered, refused, and the program was told a short reason; the
    // 40 long names by the helper itself.
    assert_eq!(
        (out["replies"].as_u64(), out["refused"].as_u64()),
        (Some(120), Some(120)),
        "{out}"
    );
    assert!(
        out["longest_error"].as_u64().unwrap() <= MAX_REASON_BYTES as u64,
        "{out}"
    );
    assert_eq!(out["over_128"], 40, "{out}");

    // The trail lists the 80 calls that reached the server, each with a bounded reason;
    // the long names never did.
    let session = r["session_id"].as_str().unwrap();
    let (status, _, calls) = s.request("GET", &format!("{ROUTE}/{session}/calls"), None, None);
    assert_eq!(status, 200, "{calls}");
    let listed = calls["calls"].as_array().unwrap();
    assert_eq!(listed.len(), 80, "{}", calls.to_string().len());
    assert_eq!(calls["calls_dropped"], 0);
    for call in listed {
        assert_eq!(call["name"], "count");
        assert_eq!(call["outcome"]["status"], "refused");
        let reason = call["outcome"]["reason"].as_str().unwrap();
        assert!(reason.len() <= MAX_REASON_BYTES, "a reason of {} bytes", reason.len());
        assert!(reason.contains("bytes in all]"), "{reason}");
    }
    assert!(calls.to_string().len() < 200 << 10, "{} bytes", calls.to_string().len());
    s.assert_healthy();
}
