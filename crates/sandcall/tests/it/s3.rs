//! Two nodes sharing one S3 bucket (the moto server `.ci/run` starts): a file belongs to
//! the cluster, not to the node it went through, and the quota is the cluster's too.
//! Each test fails when SANDCALL_TEST_S3_ENDPOINT is unset (`common::s3_server`).

use crate::common::{s3_env, unique_prefix, Server};
use crate::files::{assert_error, file_part, Client};
use serde_json::{json, Value};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A node whose files live under `prefix` in the test bucket.
fn node(prefix: &str, extra: &[(&str, &str)]) -> Server {
    let env = s3_env(prefix);
    let mut all: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    all.extend_from_slice(extra);
    Server::start_with(&all, "")
}

fn output<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["files"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["name"] == name))
        .unwrap_or_else(|| panic!("no output {name}: {r}"))
}

#[test]
fn a_file_uploaded_through_one_node_is_listed_downloaded_and_used_through_another() {
    let prefix = unique_prefix("two-nodes");
    let a = node(&prefix, &[]);
    let b = node(&prefix, &[]);
    let (ca, cb) = (Client::anonymous(&a), Client::anonymous(&b));

    let up = ca.upload("in.txt", "text/plain", b"from A\n");
    let listed = cb.list(&up.session_id);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["id"], up.id.as_str(), "{listed:?}");
    assert_eq!(listed[0]["name"], "in.txt", "{listed:?}");
    let got = cb.download(&up.session_id, &up.id);
    assert_eq!(got.status, 200, "{got}");
    assert_eq!(got.body, b"from A\n");

    // An input on B, staged from B's own copy; its output goes back through A.
    let r = cb.exec(json!({
        "language": "python",
        "code": "print(open('in.txt').read(), end='')\nopen('out.txt', 'w').write('from B\\n')",
        "files": [up.input("in.txt")],
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "from A\n", "{r}");
    let out = output(&r, "out.txt");
    let (sid, fid) = (out["storage_session_id"].as_str().unwrap(), out["id"].as_str().unwrap());
    let got = ca.download(sid, fid);
    assert_eq!(got.status, 200, "{got}");
    assert_eq!(got.body, b"from B\n");
    assert_eq!(ca.list(sid).len(), 1);
    // And as an input of a run on A, which never had a copy of it.
    let r = ca.exec(json!({
        "language": "bash",
        "code": "cat out.txt",
        "files": [{"id": fid, "storage_session_id": sid, "name": "out.txt"}],
    }));
    assert_eq!(r["stdout"], "from B\n", "{r}");

    // Deleted through A: gone through B.
    let gone = ca.delete_file(&up.session_id, &up.id);
    assert_eq!(gone.status, 200, "{gone}");
    assert_eq!(cb.download(&up.session_id, &up.id).status, 404);
    assert!(cb.list(&up.session_id).is_empty());
}

#[test]
fn the_quota_holds_across_nodes() {
    let prefix = unique_prefix("quota");
    let quota = [("SANDCALL_MAX_STORED_FILES_PER_PRINCIPAL", "4")];
    let a = node(&prefix, &quota);
    let b = node(&prefix, &quota);
    let (ca, cb) = (Client::anonymous(&a), Client::anonymous(&b));

    // Eight uploads at once, four through each node: exactly four are stored.
    let results: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let c = if i % 2 == 0 { &ca } else { &cb };
                scope.spawn(move || {
                    let name = format!("f{i}.txt");
                    let reply = c.upload_parts(&[file_part(&name, "text/plain", b"x")]);
                    (reply.status, reply.json())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let statuses: Vec<u16> = results.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 4, "{results:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 507).count(), 4, "{results:?}");
    for c in [&ca, &cb] {
        let reply = c.upload_parts(&[file_part("more.txt", "text/plain", b"x")]);
        assert_error(&reply, 507, "quota_exceeded");
    }

    // A file deleted through one node makes room through the other, once: deleting it
    // again through either node frees nothing more.
    let (_, stored) = results.iter().find(|(s, _)| *s == 200).unwrap();
    let (sid, fid) = (
        stored["storage_session_id"].as_str().unwrap(),
        stored["files"][0]["id"].as_str().unwrap(),
    );
    assert_eq!(cb.delete_file(sid, fid).status, 200);
    assert_eq!(ca.delete_file(sid, fid).status, 404);
    assert_eq!(cb.delete_file(sid, fid).status, 404);
    let reply = ca.upload_parts(&[file_part("room.txt", "text/plain", b"x")]);
    assert_eq!(reply.status, 200, "{reply}");
    let reply = cb.upload_parts(&[file_part("full.txt", "text/plain", b"x")]);
    assert_error(&reply, 507, "quota_exceeded");
}

#[test]
fn a_workspace_moves_between_nodes_and_is_held_by_one_run_across_them() {
    let prefix = unique_prefix("workspaces");
    let on = [("SANDCALL_WORKSPACES", "true")];
    let a = node(&prefix, &on);
    let b = node(&prefix, &on);
    let (ca, cb) = (Client::anonymous(&a), Client::anonymous(&b));
    let r = ca.exec(json!({"language": "bash", "code": "echo from A > notes.txt", "runtime_session_hint": "conv"}));
    assert_eq!(r["status"], "ok", "{r}");
    let r = cb.exec(
        json!({"language": "bash", "code": "cat notes.txt; echo from B >> notes.txt", "runtime_session_hint": "conv"}),
    );
    assert_eq!(r["stdout"], "from A\n", "{r}");
    let r = ca.exec(json!({"language": "bash", "code": "cat notes.txt", "runtime_session_hint": "conv"}));
    assert_eq!(r["stdout"], "from A\nfrom B\n", "{r}");
    // A run on A holds the workspace: B's run in it is refused.
    crate::workspaces::concurrent_use_of_a_workspace_is_409(&ca, &cb);
}

#[test]
fn two_nodes_sweeping_one_bucket_free_each_expired_file_once() {
    let prefix = unique_prefix("sweep");
    let env = [
        ("SANDCALL_MAX_STORED_FILES_PER_PRINCIPAL", "3"),
        ("SANDCALL_FILE_TTL_S", "4"),
        ("SANDCALL_FILE_SWEEP_INTERVAL_S", "1"),
    ];
    let a = node(&prefix, &env);
    let b = node(&prefix, &env);
    let (ca, cb) = (Client::anonymous(&a), Client::anonymous(&b));
    let mut stored = Vec::new();
    for (i, c) in [&ca, &cb, &ca].into_iter().enumerate() {
        stored.push(c.upload(&format!("f{i}.txt"), "text/plain", b"x"));
    }
    assert_error(
        &cb.upload_parts(&[file_part("full.txt", "text/plain", b"x")]),
        507,
        "quota_exceeded",
    );
    // Both nodes sweep every second. Once every file is past its time (hidden at once)
    // and both nodes have swept since, the quota is free again by exactly three files:
    // freed once each, not once per node.
    let start = std::time::Instant::now();
    while !stored
        .iter()
        .all(|f| ca.download(&f.session_id, &f.id).status == 404 && cb.download(&f.session_id, &f.id).status == 404)
    {
        assert!(start.elapsed() < std::time::Duration::from_secs(30), "never expired");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    std::thread::sleep(std::time::Duration::from_millis(2500));
    for (i, c) in [&ca, &cb, &ca].into_iter().enumerate() {
        let reply = c.upload_parts(&[file_part(&format!("again{i}.txt"), "text/plain", b"x")]);
        assert_eq!(reply.status, 200, "{reply}");
    }
    assert_error(
        &cb.upload_parts(&[file_part("over.txt", "text/plain", b"x")]),
        507,
        "quota_exceeded",
    );
}

#[test]
fn a_file_store_that_is_malformed_or_unreachable_stops_the_start() {
    crate::common::require_root();
    let (endpoint, bucket) = crate::common::s3_server();
    let dir = std::env::temp_dir().join(format!("sandcall-s3-refuse-{}", std::process::id()));
    let run = |store: &str, endpoint: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandcall"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&dir)
            .env("SANDCALL_INSTALL_RUNTIME", "false")
            .env("SANDCALL_RUNTIME_DIR", crate::common::runtime_dir())
            .env("SANDCALL_WARM_POOL_SIZE", "0")
            .env("SANDCALL_FILE_STORE", store)
            .env("SANDCALL_S3_ENDPOINT", endpoint)
            .env("AWS_ACCESS_KEY_ID", "sandcall-test")
            .env("AWS_SECRET_ACCESS_KEY", "sandcall-test")
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{store} at {endpoint} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run("ftp://somewhere/x", &endpoint);
    assert!(
        err.contains("refusing to start") && err.contains("s3://bucket/prefix"),
        "{err}"
    );
    let err = run(&format!("s3://{bucket}/x"), "http://192.0.2.1:9000");
    assert!(err.contains("refusing to start") && err.contains("loopback"), "{err}");
    let err = run("s3://no-such-bucket-sandcall/x", &endpoint);
    assert!(
        err.contains("refusing to start") && err.contains("NoSuchBucket"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A TCP relay to the test S3 server that can fail as the network between them would:
/// cut (each new connection closed at once) or black-holed (each new connection held
/// open, never answered). Either way the connections it was relaying are shut down.
struct Relay {
    port: u16,
    mode: Arc<AtomicU8>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

const RELAYING: u8 = 0;
const CUT: u8 = 1;
const BLACK_HOLE: u8 = 2;

impl Relay {
    fn to(endpoint: &str) -> Relay {
        let target = endpoint.trim_start_matches("http://").trim_end_matches('/').to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let relay = Relay {
            port: listener.local_addr().unwrap().port(),
            mode: Arc::new(AtomicU8::new(RELAYING)),
            open: Default::default(),
        };
        let (mode, open) = (relay.mode.clone(), relay.open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                match mode.load(Ordering::SeqCst) {
                    CUT => continue,
                    BLACK_HOLE => {
                        open.lock().unwrap().push(client);
                        continue;
                    }
                    _ => {}
                }
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let pairs = [
                    (client.try_clone(), server.try_clone()),
                    (server.try_clone(), client.try_clone()),
                ];
                open.lock().unwrap().extend([client, server]);
                for (from, to) in pairs {
                    if let (Ok(mut from), Ok(mut to)) = (from, to) {
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut from, &mut to);
                            let _ = to.shutdown(Shutdown::Write);
                        });
                    }
                }
            }
        });
        relay
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
        for conn in self.open.lock().unwrap().drain(..) {
            let _ = conn.shutdown(Shutdown::Both);
        }
    }
}

/// A node whose files live in the test bucket under a prefix of its own, reached through
/// `relay`.
fn relayed_node(relay: &Relay, extra: &[(&str, &str)]) -> Server {
    // The later SANDCALL_S3_ENDPOINT wins over the one `s3_env` gives.
    let relayed = relay.url();
    let mut env = vec![("SANDCALL_S3_ENDPOINT", relayed.as_str())];
    env.extend_from_slice(extra);
    node(&unique_prefix("outage"), &env)
}

#[test]
fn a_file_store_out_of_reach_answers_503_and_loses_nothing() {
    let relay = Relay::to(&crate::common::s3_server().0);
    let s = relayed_node(
        &relay,
        &[
            ("SANDCALL_MAX_STORED_FILES_PER_PRINCIPAL", "2"),
            ("SANDCALL_S3_TIMEOUT_MS", "2000"),
        ],
    );
    let c = Client::anonymous(&s);
    let kept = c.upload("kept.txt", "text/plain", b"kept\n");

    relay.set(CUT);
    let refused = c.upload_parts(&[file_part("lost.txt", "text/plain", b"lost\n")]);
    assert_error(&refused, 503, "store_unavailable");
    assert_eq!(refused.retry_after.as_deref(), Some("1"), "{refused}");
    let batch = c.upload_batch(&[file_part("lost-too.txt", "text/plain", b"lost\n")]);
    assert_error(&batch, 503, "store_unavailable");
    assert_error(&c.download(&kept.session_id, &kept.id), 503, "store_unavailable");
    assert_error(&c.delete_file(&kept.session_id, &kept.id), 503, "store_unavailable");
    assert_error(
        &c.get(&format!("/v1/files/{}", kept.session_id)),
        503,
        "store_unavailable",
    );
    // A run with an input file cannot stage it, and says so the same way.
    let staged = c.post_json(
        "/v1/exec",
        &json!({"language": "bash", "code": "cat kept.txt", "files": [kept.input("kept.txt")]}),
    );
    assert_error(&staged, 503, "store_unavailable");
    // A run without inputs still answers; the output it could not store is listed as
    // skipped, and why.
    let r = c.exec(json!({"language": "python", "code": "open('out.txt', 'w').write('x')\nprint('ran')"}));
    assert_eq!(r["stdout"], "ran\n", "{r}");
    assert_eq!(
        r["files_skipped"],
        json!([{"name": "out.txt", "reason": "storage_unavailable"}]),
        "{r}"
    );
    s.assert_healthy();

    // Back: what was stored is whole (the refused delete removed nothing), and the
    // refused uploads took no place in the quota of two files: one more fits, and the
    // one after that does not.
    relay.set(RELAYING);
    let got = c.download(&kept.session_id, &kept.id);
    assert_eq!((got.status, got.body.as_slice()), (200, &b"kept\n"[..]), "{got}");
    assert_eq!(c.list(&kept.session_id).len(), 1);
    c.upload("second.txt", "text/plain", b"second\n");
    let over = c.upload_parts(&[file_part("third.txt", "text/plain", b"third\n")]);
    assert_error(&over, 507, "quota_exceeded");
}

#[test]
fn an_s3_that_never_answers_is_given_up_on_after_s3_timeout_ms() {
    let relay = Relay::to(&crate::common::s3_server().0);
    let s = relayed_node(&relay, &[("SANDCALL_S3_TIMEOUT_MS", "1000")]);
    let c = Client::anonymous(&s);
    let kept = c.upload("kept.txt", "text/plain", b"kept\n");
    relay.set(BLACK_HOLE);
    // Without the bound, the object store client waits 30 s for each try and retries
    // for 3 minutes.
    let t = Instant::now();
    assert_error(&c.download(&kept.session_id, &kept.id), 503, "store_unavailable");
    let refused = c.upload_parts(&[file_part("late.txt", "text/plain", b"late\n")]);
    assert_error(&refused, 503, "store_unavailable");
    assert!(t.elapsed() < Duration::from_secs(15), "took {:?}", t.elapsed());
    relay.set(RELAYING);
    let got = c.download(&kept.session_id, &kept.id);
    assert_eq!((got.status, got.body.as_slice()), (200, &b"kept\n"[..]), "{got}");
}
