//! Caps and quotas: max_file_bytes on uploads and outputs (enforced while the body
//! streams in), the stored-files quota across a batch, uploads streamed to disk, and
//! max_output_files.

use super::client::{
    agent, assert_error, file_part, into_response, multipart_content_type, multipart_tail, part_head, Client,
};
use super::support::{
    batch_outcomes, download_output, output_names, pairs, peak_rss_kib, regular_files, skipped, skipped_for, src,
    stored_count, strings, wait_for_stored_count,
};
use crate::common::Server;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

#[test]
fn the_quota_holds_per_file_across_a_batch() {
    let s = Server::start_with(
        &[
            ("SANDCALL_MAX_STORED_FILES_PER_PRINCIPAL", "3"),
            ("SANDCALL_MAX_FILE_BYTES", "1000"),
        ],
        "",
    );
    let c = Client::anonymous(&s);
    let before = stored_count(&s);
    let big = vec![b'x'; 1001];
    let reply = c.upload_batch(&[
        file_part("1.txt", "text/plain", b"1"),
        file_part("big.bin", "application/octet-stream", &big),
        file_part("2.txt", "text/plain", b"2"),
        file_part("3.txt", "text/plain", b"3"),
        file_part("4.txt", "text/plain", b"4"),
    ]);
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    assert_eq!(v["message"], "partial_success", "{v}");
    let outcomes: Vec<(String, String)> = batch_outcomes(&v).into_iter().map(|(st, n, _)| (st, n)).collect();
    assert_eq!(
        outcomes,
        pairs(&[
            ("success", "1.txt"),
            ("error", "big.bin"),
            ("success", "2.txt"),
            ("success", "3.txt"),
            ("error", "4.txt")
        ])
    );
    assert!(
        v["files"][1]["error"].as_str().unwrap().contains("max_file_bytes"),
        "{v}"
    );
    assert!(
        v["files"][4]["error"]
            .as_str()
            .unwrap()
            .contains("max_stored_files_per_principal"),
        "{v}"
    );
    // At the quota, a whole batch fails: 400, and still nothing more is stored.
    let reply = c.upload_batch(&[file_part("5.txt", "text/plain", b"5")]);
    assert_eq!(reply.status, 400, "{reply}");
    assert_eq!(reply.json()["failed"], 1, "{reply}");
    assert_eq!(stored_count(&s), before + 3);
}

#[test]
fn files_over_max_file_bytes_are_refused_and_never_stored() {
    let s = Server::start_with(&[("SANDCALL_MAX_FILE_BYTES", "1000")], "");
    let c = Client::anonymous(&s);
    // At the cap is fine.
    let at_cap = vec![b'a'; 1000];
    let up = c.upload("at_cap.txt", "text/plain", &at_cap);
    assert_eq!(up.response["files"][0]["size"], 1000);
    let stored = stored_count(&s);

    // One byte over, far over, and a small file riding along with a big one.
    let over = vec![b'b'; 1001];
    let far = vec![b'c'; 20_000];
    for parts in [
        vec![file_part("over.txt", "text/plain", &over)],
        vec![file_part("far.txt", "text/plain", &far)],
        vec![
            file_part("small.txt", "text/plain", b"small\n"),
            file_part("over.txt", "text/plain", &over),
        ],
    ] {
        let reply = c.upload_parts(&parts);
        assert_error(&reply, 413, "payload_too_large");
        wait_for_stored_count(&s, stored, Duration::from_secs(5));
    }
    assert!(
        regular_files(&s.data_dir.join("files/incoming")).is_empty(),
        "half-received uploads are left behind"
    );

    // An output file over the cap is not read, not stored, and listed as too large.
    let r = c.exec(json!({
        "code": src(&[
            "open('ok.txt', 'wb').write(b'o' * 1000)",
            "open('big.txt', 'wb').write(b'b' * 1001)",
            "open('huge.bin', 'wb').write(b'h' * 5000000)",
        ]),
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(output_names(&r), strings(&["ok.txt"]), "{r}");
    assert_eq!(skipped_for(&r, "too_large"), strings(&["big.txt", "huge.bin"]), "{r}");
    assert_eq!(skipped(&r).len(), 2, "{r}");
    assert_eq!(r["files_skipped_total"], 2, "{r}");
    assert_eq!(download_output(&c, &r, "ok.txt").len(), 1000);
    wait_for_stored_count(&s, stored + 1, Duration::from_secs(5));
}

#[test]
fn a_refused_upload_is_read_to_its_end_so_the_client_gets_the_answer() {
    // The part is refused after 1 MiB, with 15 MiB still to come: far more than the
    // socket buffers hold. A server that answered and closed at once would leave the
    // client writing into a reset connection, never seeing the 413.
    let s = Server::start_with(&[("SANDCALL_MAX_FILE_BYTES", "1048576")], "");
    let c = Client::anonymous(&s);
    let big = vec![b'd'; 16 << 20];
    let stored = stored_count(&s);
    for _ in 0..2 {
        let reply = c.upload_parts(&[file_part("big.bin", "application/octet-stream", &big)]);
        assert_error(&reply, 413, "payload_too_large");
    }
    wait_for_stored_count(&s, stored, Duration::from_secs(5));
    assert!(regular_files(&s.data_dir.join("files/incoming")).is_empty());
}

/// Sends an upload whose body never ends: chunked, then 1 MiB of one file part, then
/// silence. Returns the status and body of the answer, or None if none came in `wait`.
fn endless_upload(s: &Server, wait: Duration) -> Option<(u16, String)> {
    use std::net::TcpStream;
    let mut stream = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    stream.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let port = s.port;
    let sender = std::thread::spawn(move || {
        let head = format!(
            "POST /v1/upload HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {}\r\nTransfer-Encoding: chunked\r\n\r\n",
            multipart_content_type()
        );
        if writer.write_all(head.as_bytes()).is_err() {
            return;
        }
        let mut chunk = |data: &[u8]| -> bool {
            let mut buf = format!("{:x}\r\n", data.len()).into_bytes();
            buf.extend_from_slice(data);
            buf.extend_from_slice(b"\r\n");
            writer.write_all(&buf).is_ok()
        };
        let part = part_head(&file_part("endless.bin", "application/octet-stream", b""));
        if !chunk(&part) {
            return;
        }
        let block = vec![b'x'; 64 << 10];
        for _ in 0..16 {
            if !chunk(&block) {
                return;
            }
        }
        // The body never ends; the test's end closes the connection.
    });
    let deadline = Instant::now() + wait;
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    while Instant::now() < deadline && !response_complete(&got) {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            // A reset after the answer, when the server drops the rest of the body.
            Err(_) => break,
        }
    }
    let _ = sender.join();
    let text = String::from_utf8_lossy(&got).into_owned();
    let status: u16 = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((status, body))
}

/// Whether `got` holds a whole HTTP response (headers, and a body of Content-Length).
fn response_complete(got: &[u8]) -> bool {
    let text = String::from_utf8_lossy(got);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())?
    });
    match length {
        Some(n) => body.len() >= n,
        None => false,
    }
}

#[test]
fn the_upload_cap_is_enforced_while_streaming() {
    let s = Server::start_with(&[("SANDCALL_MAX_FILE_BYTES", "1000")], "");
    let stored = stored_count(&s);
    // A server that waited for the whole body before counting would never answer.
    let (status, body) = endless_upload(&s, Duration::from_secs(30))
        .expect("no answer to an endless upload: the cap must be enforced while the body streams in");
    assert_eq!(status, 413, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(v["error_type"], "payload_too_large", "{v}");
    wait_for_stored_count(&s, stored, Duration::from_secs(5));
    assert!(regular_files(&s.data_dir.join("files/incoming")).is_empty());
    s.assert_healthy();
}

#[test]
fn uploads_stream_to_disk() {
    const SIZE: usize = 160 << 20;
    let s = Server::start_with(&[("SANDCALL_MAX_FILE_BYTES", &(200u64 << 20).to_string())], "");
    let before = peak_rss_kib(s.pid());
    let data: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
    let part = file_part("big.bin", "application/octet-stream", b"");
    let head = part_head(&part);
    let mut tail = b"\r\n".to_vec();
    tail.extend_from_slice(&multipart_tail());
    let length = head.len() + data.len() + tail.len();
    let body = std::io::Cursor::new(head)
        .chain(&data[..])
        .chain(std::io::Cursor::new(tail));
    let resp = into_response(
        "POST",
        "/v1/upload",
        agent()
            .post(&s.url("/v1/upload"))
            .set("Content-Type", &multipart_content_type())
            .set("Content-Length", &length.to_string())
            .send(body),
    );
    let status = resp.status();
    let text = resp.into_string().unwrap();
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["files"][0]["size"], SIZE, "{v}");
    let grew = peak_rss_kib(s.pid()).saturating_sub(before);
    assert!(
        grew < 64 << 10,
        "the server's peak memory grew by {grew} KiB for a 160 MiB upload"
    );

    // The download streams back the same bytes.
    let (sid, id) = (
        v["storage_session_id"].as_str().unwrap(),
        v["files"][0]["id"].as_str().unwrap(),
    );
    let path = format!("/v1/download/{sid}/{id}");
    let resp = into_response("GET", &path, agent().get(&s.url(&path)).call());
    assert_eq!(resp.status(), 200);
    let mut reader = resp.into_reader();
    let mut offset = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        assert!(offset + n <= SIZE, "the download is longer than the upload");
        assert!(
            buf[..n] == data[offset..offset + n],
            "the download differs at byte {offset}"
        );
        offset += n;
    }
    assert_eq!(offset, SIZE);
}

#[test]
fn max_output_files_caps_what_is_collected() {
    let s = Server::start_with(&[("SANDCALL_MAX_OUTPUT_FILES", "3")], "");
    let c = Client::anonymous(&s);
    let r = c.exec(json!({"language": "bash", "code": "for n in e d c b a; do echo $n > $n.txt; done"}));
    assert_eq!(output_names(&r), strings(&["a.txt", "b.txt", "c.txt"]), "{r}");
    assert_eq!(skipped_for(&r, "too_many_files"), strings(&["d.txt", "e.txt"]), "{r}");
    assert_eq!(skipped(&r).len(), 2, "{r}");
    assert_eq!(r["files_skipped_total"], 2, "{r}");
    assert_eq!(download_output(&c, &r, "c.txt"), b"c\n");
}
