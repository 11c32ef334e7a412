//! `GET /metrics`: after known traffic, a scrape parsed by a Prometheus text parser
//! shows the right counts; the route is the operator's (`metrics_token`).

use crate::common::Server;
use crate::files::Client;
use prometheus_parse::{Sample, Scrape, Value as PromValue};
use serde_json::json;

const KEYS: &str = "alice:key-a-0123456789abcdef";

/// The operator's `metrics_token` of every test server that is scraped and has
/// credentials (SANDCALL_METRICS_TOKEN).
pub(crate) const METRICS_TOKEN: &str = "metrics-token-0123456789abcdef";

/// The client that may scrape `s`: the operator, with `METRICS_TOKEN`.
pub(crate) fn operator(s: &Server) -> Client {
    Client::bearer(s, METRICS_TOKEN)
}

/// The scrape, parsed.
pub(crate) fn scrape(c: &Client) -> Scrape {
    let reply = c.get("/metrics");
    assert_eq!(reply.status, 200, "{reply}");
    assert!(
        reply.content_type.as_deref().unwrap_or("").starts_with("text/plain"),
        "{reply}"
    );
    let text = String::from_utf8(reply.body).unwrap();
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap()
}

/// The samples of `name` whose labels include every pair of `labels`.
fn samples<'a>(s: &'a Scrape, name: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
    s.samples
        .iter()
        .filter(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .collect()
}

/// The value of the one counter or gauge `name` with `labels`; 0 when there is none.
pub(crate) fn value(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    match samples(s, name, labels).as_slice() {
        [] => 0.0,
        [one] => match one.value {
            PromValue::Counter(v) | PromValue::Gauge(v) | PromValue::Untyped(v) => v,
            ref other => panic!("{name} is not a counter or gauge: {other:?}"),
        },
        many => panic!("{name} {labels:?} matches {} samples", many.len()),
    }
}

/// The number of observations of histogram `name` with `labels`.
fn observations(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> u64 {
    samples(s, name, labels)
        .iter()
        .map(|x| match &x.value {
            PromValue::Histogram(buckets) => buckets.last().map_or(0, |b| b.count as u64),
            other => panic!("{name} is not a histogram: {other:?}"),
        })
        .sum()
}

#[test]
fn a_scrape_after_known_traffic_shows_its_counts() {
    let s = Server::start_with(
        &[
            ("SANDCALL_API_KEYS", KEYS),
            ("SANDCALL_METRICS_TOKEN", METRICS_TOKEN),
            ("SANDCALL_RATE_LIMIT_FILES", "1/min"),
            ("SANDCALL_WARM_POOL_SIZE", "1"),
        ],
        "",
    );
    let alice = Client::bearer(&s, "key-a-0123456789abcdef");
    let ops = operator(&s);
    // The operator's alone.
    assert_eq!(Client::anonymous(&s).get("/metrics").status, 401);
    assert_eq!(alice.get("/metrics").status, 401);
    // The pool builds its warm sandboxes (`wait_warm` cannot see them: health without
    // a key does not say), each timed once it is ready.
    let built = || observations(&scrape(&ops), "sandcall_sandbox_build_seconds", &[("warm", "true")]);
    assert!(
        crate::common::settle(|| built() >= 2, true),
        "no two warm sandboxes were built"
    );

    for code in [
        "print(1)",
        "print(2)",
        "open('out.txt', 'w').write('12345')",
        "raise SystemExit(3)",
    ] {
        let r = alice.post_json("/v1/exec", &json!({"lang": "py", "code": code}));
        assert_eq!(r.status, 200, "{r}");
    }
    let r = alice.post_json("/v1/exec", &json!({"lang": "bash", "code": "echo 1"}));
    assert_eq!(r.status, 200, "{r}");
    // A refusal: the files group's rate is one a minute.
    assert_eq!(alice.get("/v1/files/none").status, 200);
    assert_eq!(alice.get("/v1/files/none").status, 429);
    // A route that does not exist is counted under no path of its own.
    assert_eq!(alice.get("/v1/no/such/route/abc").status, 404);

    let m = scrape(&ops);
    let run = |language: &str, status: &str| {
        value(
            &m,
            "sandcall_runs_total",
            &[("kind", "exec"), ("language", language), ("status", status)],
        )
    };
    assert_eq!(run("python", "ok"), 3.0);
    assert_eq!(run("python", "failed"), 1.0);
    assert_eq!(run("bash", "ok"), 1.0);
    assert_eq!(observations(&m, "sandcall_run_seconds", &[("language", "python")]), 4);
    assert_eq!(observations(&m, "sandcall_run_queue_seconds", &[]), 5);
    // The warm builds counted above are still there, and each run was answered and timed.
    assert!(observations(&m, "sandcall_sandbox_build_seconds", &[("warm", "true")]) >= 2);
    let exec = [("method", "POST"), ("route", "/v1/exec"), ("status", "200")];
    assert_eq!(value(&m, "sandcall_http_requests_total", &exec), 5.0);
    assert_eq!(observations(&m, "sandcall_http_request_duration_seconds", &exec), 5);
    let files = [("method", "GET"), ("route", "/v1/files/:session_id")];
    assert_eq!(
        value(
            &m,
            "sandcall_http_requests_total",
            &[files[0], files[1], ("status", "429")]
        ),
        1.0
    );
    assert_eq!(
        value(&m, "sandcall_admission_refusals_total", &[("reason", "rate_limited")]),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "sandcall_http_requests_total",
            &[("route", "unmatched"), ("status", "404")]
        ),
        1.0
    );
    // No label holds a raw path.
    assert!(m
        .samples
        .iter()
        .all(|x| x.labels.get("route") != Some("/v1/no/such/route/abc")));
    // The warm sets refill after the runs.
    crate::common::settle(
        || {
            let m = scrape(&ops);
            value(
                &m,
                "sandcall_warm_sandboxes",
                &[("language", "python"), ("preloaded", "false")],
            )
        },
        1.0,
    );
    assert_eq!(value(&m, "sandcall_sessions_live", &[]), 0.0);
    // The one output file.
    assert_eq!(value(&m, "sandcall_stored_files_total", &[]), 1.0);
    assert_eq!(value(&m, "sandcall_stored_bytes_total", &[]), 5.0);
}

#[test]
fn json_logs_carry_the_requests_span_with_its_session_id() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    crate::common::require_root();
    let dir = Server::new_dir();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .env("SANDCALL_LOG_FORMAT", "json")
        .env("SANDCALL_LOG", "sandcall_engine=debug,info")
        .env("SANDCALL_RUNTIME_DIR", crate::common::runtime_dir())
        .env("SANDCALL_INSTALL_RUNTIME", "false")
        .env("SANDCALL_WARM_POOL_SIZE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let base = stdout
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("sandcall listening on ").map(str::to_owned))
        .expect("the server starts");
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let reply = Client::at(&base).post_json("/v1/exec", &json!({"lang": "py", "code": "print(1)"}));
    assert_eq!(reply.status, 200, "{reply}");
    let session_id = reply.json()["session_id"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut seen = Vec::new();
    let found = loop {
        let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) else {
            break None;
        };
        // Every line is one JSON object.
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if v["fields"]["message"] == "run finished" {
            break Some(v);
        }
        seen.push(line);
    };
    let _ = child.kill();
    let _ = child.wait();
    let v = found.unwrap_or_else(|| panic!("no `run finished` line in {seen:#?}"));
    assert_eq!(v["span"]["session_id"], session_id.as_str(), "{v}");
    assert_eq!(v["span"]["route"], "/v1/exec", "{v}");
}
