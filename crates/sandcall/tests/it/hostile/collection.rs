//! Output collection and storage quotas: sparse files cannot inflate what a run stores,
//! and a principal's stored bytes and files are bounded.

use crate::common::{hostile, Server};
use crate::files::{assert_error, file_part, multipart_content_type, regular_files, Client, Reply, BOUNDARY};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const KEYS: &str = "alice:key-a-0123456789abcdef,bob:key-b-0123456789abcdef";
const ALICE: &str = "key-a-0123456789abcdef";
const BOB: &str = "key-b-0123456789abcdef";
const KIB: usize = 1 << 10;
const MIB: u64 = 1 << 20;

/// Apparent bytes (st_size) of every stored object: what the data dir holds for files,
/// whatever the filesystem does with holes.
fn object_bytes(s: &Server) -> u64 {
    regular_files(&s.data_dir.join("files/objects"))
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum()
}

fn object_count(s: &Server) -> usize {
    regular_files(&s.data_dir.join("files/objects")).len()
}

/// Nothing is left half-received.
fn assert_incoming_empty(s: &Server) {
    let left = regular_files(&s.data_dir.join("files/incoming"));
    assert!(left.is_empty(), "left in incoming/: {left:?}");
}

fn upload(c: &Client, name: &str, size: usize) -> Reply {
    c.upload_parts(&[file_part(name, "application/octet-stream", &vec![b'q'; size])])
}

/// The storage session and id of the one file of a successful upload.
fn uploaded(reply: &Reply) -> (String, String) {
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    (
        v["storage_session_id"].as_str().unwrap().to_owned(),
        v["files"][0]["id"].as_str().unwrap().to_owned(),
    )
}

fn skipped(r: &Value) -> Vec<(String, String)> {
    r["files_skipped"]
        .as_array()
        .unwrap_or_else(|| panic!("no files_skipped: {r}"))
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn output_sizes(r: &Value) -> Vec<(String, u64)> {
    r["files"]
        .as_array()
        .unwrap_or_else(|| panic!("no files: {r}"))
        .iter()
        .map(|f| (f["name"].as_str().unwrap().to_owned(), f["size"].as_u64().unwrap()))
        .collect()
}

#[test]
fn sparse_outputs_are_collected_only_up_to_the_workspace_limit() {
    let s = Server::start();
    let before = object_bytes(&s);
    let r = s.exec(
        json!({"code": hostile("collect_sparse_many.py"), "limits": {"workspace_limit_mb": 16}, "timeout": 60000}),
    );
    assert_eq!(r["status"], "ok", "{r}");
    // The files really are holes: the workspace (16 MiB) could not hold 160 MiB of data.
    // (gVisor's tmpfs counts a hole's blocks as written; they are holes all the same.)
    if !crate::common::gvisor_pass() {
        assert_eq!(r["stdout"], "blocks=0\n", "{r}");
    }
    let files = output_sizes(&r);
    let total: u64 = files.iter().map(|(_, n)| n).sum();
    assert!(total <= 16 * MIB, "collected {total} bytes: {r}");
    assert_eq!(files.len(), 4, "four files of 4 MiB fit 16 MiB: {r}");
    let skips = skipped(&r);
    assert_eq!(r["files_skipped_total"], 36, "{r}");
    assert!(skips.iter().all(|(_, why)| why == "over_workspace_limit"), "{skips:?}");
    assert_eq!(
        files.len() + skips.len(),
        40,
        "every file is either collected or listed: {r}"
    );
    let grew = object_bytes(&s) - before;
    assert!(grew <= 16 * MIB + MIB, "the data dir grew by {grew} bytes");
    s.assert_healthy();
}

#[test]
fn an_upload_over_the_byte_quota_gets_507_and_stores_nothing() {
    let env = [
        ("SANDCALL_API_KEYS", KEYS),
        ("SANDCALL_MAX_STORED_BYTES_PER_PRINCIPAL", "1048576"),
    ];
    let s = Server::start_with(&env, "");
    let (alice, bob) = (Client::bearer(&s, ALICE), Client::bearer(&s, BOB));
    let first = uploaded(&upload(&alice, "first.bin", 600 * KIB));
    let (bytes, count) = (object_bytes(&s), object_count(&s));

    // One file that does not fit, and two parts of which the second does not: 507, and
    // the first part of the second upload is not kept either (all or nothing).
    let over = upload(&alice, "second.bin", 600 * KIB);
    assert_error(&over, 507, "quota_exceeded");
    let data = vec![b'q'; 300 * KIB];
    let parts = alice.upload_parts(&[
        file_part("a.bin", "application/octet-stream", &data[..200 * KIB]),
        file_part("b.bin", "application/octet-stream", &data),
    ]);
    assert_error(&parts, 507, "quota_exceeded");
    assert_eq!(
        (object_bytes(&s), object_count(&s)),
        (bytes, count),
        "something was stored"
    );
    assert_incoming_empty(&s);
    assert_eq!(alice.list(&first.0).len(), 1);

    // Another principal's quota is its own.
    uploaded(&upload(&bob, "bob.bin", 600 * KIB));

    // Filled to the byte: the next upload is refused however small.
    let rest = 1024 * KIB - 600 * KIB;
    uploaded(&upload(&alice, "rest.bin", rest));
    assert_error(&upload(&alice, "one.bin", 1), 507, "quota_exceeded");

    // The quota survives a restart: it is kept in the store's database.
    let (s, _) = s.restart(&env, false);
    let alice = Client::bearer(&s, ALICE);
    assert_error(&upload(&alice, "one.bin", 1), 507, "quota_exceeded");

    // Deleting a file frees its bytes.
    assert_eq!(alice.delete_file(&first.0, &first.1).status, 200);
    uploaded(&upload(&alice, "again.bin", 600 * KIB));
    assert_error(&upload(&alice, "one.bin", 1), 507, "quota_exceeded");
    assert_incoming_empty(&s);
}

#[test]
fn an_upload_over_the_file_quota_gets_507_and_stores_nothing() {
    let env = [
        ("SANDCALL_API_KEYS", KEYS),
        ("SANDCALL_MAX_STORED_FILES_PER_PRINCIPAL", "3"),
    ];
    let s = Server::start_with(&env, "");
    let (alice, bob) = (Client::bearer(&s, ALICE), Client::bearer(&s, BOB));
    let two = alice.upload_parts(&[
        file_part("a.txt", "text/plain", b"a"),
        file_part("b.txt", "text/plain", b"b"),
    ]);
    let (session, first_id) = uploaded(&two);
    let count = object_count(&s);
    let over = alice.upload_parts(&[
        file_part("c.txt", "text/plain", b"c"),
        file_part("d.txt", "text/plain", b"d"),
    ]);
    assert_error(&over, 507, "quota_exceeded");
    assert_eq!(object_count(&s), count, "the upload that went over left a file");
    assert_incoming_empty(&s);
    uploaded(&upload(&alice, "c.txt", 1));
    assert_error(&upload(&alice, "d.txt", 1), 507, "quota_exceeded");
    for i in 0..3 {
        uploaded(&upload(&bob, &format!("bob{i}.txt"), 1));
    }
    assert_eq!(alice.delete_file(&session, &first_id).status, 200);
    uploaded(&upload(&alice, "d.txt", 1));
    assert_error(&upload(&alice, "e.txt", 1), 507, "quota_exceeded");
    assert_incoming_empty(&s);
}

#[test]
fn a_principal_at_its_quota_is_refused_before_its_upload_is_read() {
    let s = Server::start_with(&[("SANDCALL_MAX_STORED_FILES_PER_PRINCIPAL", "1")], "");
    uploaded(&upload(&Client::anonymous(&s), "only.txt", 1));
    // Headers that promise 64 MiB, and only the first part's head: an answer can come
    // only from a server that judged the request before reading its body.
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /v1/upload HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: {}\r\nContent-Length: {}\r\n\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\n\r\n",
        s.port,
        multipart_content_type(),
        64 << 20,
    );
    tcp.write_all(head.as_bytes()).unwrap();
    let t = Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // Until the JSON body has come (the connection may stay open).
    while !answer.ends_with(b"}") {
        match tcp.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) => panic!("no answer after {:?}: {e}", t.elapsed()),
        }
    }
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 507"), "{text}");
    assert!(text.contains(r#""error_type":"quota_exceeded""#), "{text}");
    assert_incoming_empty(&s);
    assert_eq!(object_count(&s), 1);
}

#[test]
fn run_outputs_over_the_quota_are_skipped_as_quota_exceeded() {
    let s = Server::start_with(
        &[
            ("SANDCALL_MAX_STORED_BYTES_PER_PRINCIPAL", "1048576"),
            ("SANDCALL_MAX_STORED_FILES_PER_PRINCIPAL", "3"),
        ],
        "",
    );
    let c = Client::anonymous(&s);
    // Three files of 400 KiB: the third would take the principal over 1 MiB.
    let r = c.exec(json!({
        "code": "for n in 'abc':\n    open(n + '.bin', 'wb').write(b'x' * 409600)\nprint('ok')",
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(
        output_sizes(&r),
        vec![("a.bin".into(), 409_600), ("b.bin".into(), 409_600)],
        "{r}"
    );
    assert_eq!(skipped(&r), vec![("c.bin".into(), "quota_exceeded".into())], "{r}");
    assert_eq!(object_bytes(&s), 2 * 409_600);

    // A programmatic run: one more file fits the file quota (3), the next does not.
    let reply = c.post_json(
        "/v1/exec/programmatic",
        &json!({"code": "open('x.txt', 'w').write('x')\nopen('y.txt', 'w').write('y')"}),
    );
    assert_eq!(reply.status, 200, "{reply}");
    let p = reply.json();
    assert_eq!(p["status"], "completed", "{p}");
    assert_eq!(output_sizes(&p), vec![("x.txt".into(), 1)], "{p}");
    assert_eq!(skipped(&p), vec![("y.txt".into(), "quota_exceeded".into())], "{p}");
    assert_eq!(object_count(&s), 3);
    assert_error(&upload(&c, "more.txt", 1), 507, "quota_exceeded");
    s.assert_healthy();
}

/// Starts `n` uploads of `size` bytes at once (`n` threads behind a barrier); returns
/// their statuses, each 200 or a 507 `quota_exceeded`.
fn racing_uploads(s: &Server, n: usize, size: usize) -> Vec<u16> {
    let barrier = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let c = Client::anonymous(s);
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let data = vec![b'r'; size];
                let name = format!("race{i}.bin");
                let part = [file_part(&name, "application/octet-stream", &data)];
                barrier.wait();
                let reply = c.upload_parts(&part);
                if reply.status != 200 {
                    assert_error(&reply, 507, "quota_exceeded");
                }
                reply.status
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn concurrent_uploads_never_exceed_the_quota_together() {
    let s = Server::start_with(
        &[
            ("SANDCALL_MAX_STORED_BYTES_PER_PRINCIPAL", "1048576"),
            ("SANDCALL_MAX_STORED_FILES_PER_PRINCIPAL", "8"),
        ],
        "",
    );
    // Bytes: five of 200 KiB fit 1 MiB, a sixth would not.
    let statuses = racing_uploads(&s, 12, 200 * KIB);
    let ok = statuses.iter().filter(|&&st| st == 200).count();
    assert_eq!(ok, 5, "{statuses:?}");
    assert_eq!(object_bytes(&s), 5 * 200 * KIB as u64);
    assert_incoming_empty(&s);
    // Files: with the bytes freed, eight tiny files fit, a ninth would not.
    for path in list_all(&s) {
        assert_eq!(Client::anonymous(&s).delete_file(&path.0, &path.1).status, 200);
    }
    let statuses = racing_uploads(&s, 12, 1);
    let ok = statuses.iter().filter(|&&st| st == 200).count();
    assert_eq!(ok, 8, "{statuses:?}");
    assert_eq!(object_count(&s), 8);
    assert_incoming_empty(&s);
}

/// (session, id) of every stored object, read from the data dir's layout
/// (`objects/<session>/<id>`).
fn list_all(s: &Server) -> Vec<(String, String)> {
    regular_files(&s.data_dir.join("files/objects"))
        .iter()
        .map(|p| {
            let name = |p: &Path| p.file_name().unwrap().to_str().unwrap().to_owned();
            (name(p.parent().unwrap()), name(p))
        })
        .collect()
}
