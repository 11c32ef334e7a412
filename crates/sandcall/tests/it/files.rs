//! Files: uploads, staging into the working directory, collection of what a run wrote,
//! downloads, listing, deletion and retention; and every trick a hostile program can
//! play on collection (links, fifos, devices, odd names, swaps, floods, sparse files),
//! each with a fixture in `tests/hostile/collect_*`.
//!
//! The HTTP helpers at the top (multipart uploads, raw bytes, auth headers) are shared
//! with `principals.rs`.

use crate::common::{descendants, hostile, Server, NO_POOL};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// HTTP helpers
// ---------------------------------------------------------------------------

/// One answer: status, Content-Type and the raw body.
pub(crate) struct Reply {
    pub status: u16,
    pub content_type: Option<String>,
    pub retry_after: Option<String>,
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as JSON, or a JSON string holding the raw body when it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&self.body).into_owned()))
    }
}

impl std::fmt::Display for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = String::from_utf8_lossy(&self.body);
        let shown: String = text.chars().take(2000).collect();
        write!(f, "HTTP {} ({:?}): {}", self.status, self.content_type, shown)
    }
}

/// One part of a multipart/form-data body.
#[derive(Clone)]
pub(crate) struct Part<'a> {
    pub field: &'a str,
    pub filename: Option<&'a str>,
    pub content_type: Option<&'a str>,
    pub data: &'a [u8],
}

/// A file part named `file`, the way LibreChat sends it.
pub(crate) fn file_part<'a>(filename: &'a str, content_type: &'a str, data: &'a [u8]) -> Part<'a> {
    Part {
        field: "file",
        filename: Some(filename),
        content_type: Some(content_type),
        data,
    }
}

/// A plain form field.
pub(crate) fn field_part<'a>(name: &'a str, value: &'a str) -> Part<'a> {
    Part {
        field: name,
        filename: None,
        content_type: None,
        data: value.as_bytes(),
    }
}

pub(crate) const BOUNDARY: &str = "sandcall-test-boundary-7f3a9c1e5b2d";

pub(crate) fn multipart_content_type() -> String {
    format!("multipart/form-data; boundary={BOUNDARY}")
}

/// The header of one part, up to and including the blank line before its bytes.
fn part_head(part: &Part) -> Vec<u8> {
    let mut head = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{}\"",
        part.field
    );
    if let Some(filename) = part.filename {
        head.push_str(&format!("; filename=\"{filename}\""));
    }
    head.push_str("\r\n");
    if let Some(ct) = part.content_type {
        head.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    head.push_str("\r\n");
    head.into_bytes()
}

fn multipart_tail() -> Vec<u8> {
    format!("--{BOUNDARY}--\r\n").into_bytes()
}

/// A multipart/form-data body, built by hand.
pub(crate) fn multipart(parts: &[Part]) -> Vec<u8> {
    let mut body = Vec::new();
    for part in parts {
        assert!(
            !part.data.windows(BOUNDARY.len()).any(|w| w == BOUNDARY.as_bytes()),
            "test data holds the multipart boundary"
        );
        body.extend_from_slice(&part_head(part));
        body.extend_from_slice(part.data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(&multipart_tail());
    body
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build()
}

/// Turns ureq's answer (4xx/5xx are errors there) into the response itself.
fn into_response(method: &str, path: &str, result: Result<ureq::Response, ureq::Error>) -> ureq::Response {
    match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

/// A client of one server, with or without credentials.
#[derive(Clone)]
pub(crate) struct Client {
    base: String,
    headers: Vec<(String, String)>,
}

impl Client {
    /// No credentials at all.
    pub fn anonymous(s: &Server) -> Client {
        Client::at(&s.base)
    }

    /// No credentials, for a server at `base` (`http://host:port`).
    pub fn at(base: &str) -> Client {
        Client {
            base: base.trim_end_matches('/').to_owned(),
            headers: Vec::new(),
        }
    }

    /// `Authorization: Bearer <key>`.
    pub fn bearer(s: &Server, key: &str) -> Client {
        Client::anonymous(s).with("Authorization", &format!("Bearer {key}"))
    }

    /// `X-API-Key: <key>`.
    pub fn api_key(s: &Server, key: &str) -> Client {
        Client::anonymous(s).with("X-API-Key", key)
    }

    /// This client with one more header on every request.
    pub fn with(mut self, name: &str, value: &str) -> Client {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    fn request(&self, method: &str, path: &str) -> ureq::Request {
        let mut req = agent().request(method, &format!("{}{}", self.base, path));
        for (k, v) in &self.headers {
            req = req.set(k, v);
        }
        req
    }

    /// Any request; the body is read whole (up to 256 MiB).
    pub fn send(&self, method: &str, path: &str, content_type: Option<&str>, body: Option<&[u8]>) -> Reply {
        let mut req = self.request(method, path);
        if let Some(ct) = content_type {
            req = req.set("Content-Type", ct);
        }
        let result = match body {
            Some(b) => req.send_bytes(b),
            None => req.call(),
        };
        let resp = into_response(method, path, result);
        let status = resp.status();
        let content_type = resp.header("Content-Type").map(str::to_owned);
        let retry_after = resp.header("Retry-After").map(str::to_owned);
        let mut bytes = Vec::new();
        resp.into_reader()
            .take(256 << 20)
            .read_to_end(&mut bytes)
            .unwrap_or_else(|e| panic!("{method} {path}: reading the body: {e}"));
        Reply {
            status,
            content_type,
            retry_after,
            body: bytes,
        }
    }

    pub fn get(&self, path: &str) -> Reply {
        self.send("GET", path, None, None)
    }

    pub fn delete(&self, path: &str) -> Reply {
        self.send("DELETE", path, None, None)
    }

    pub fn post_json(&self, path: &str, body: &Value) -> Reply {
        self.send(
            "POST",
            path,
            Some("application/json"),
            Some(body.to_string().as_bytes()),
        )
    }

    /// POST /v1/upload with these parts.
    pub fn upload_parts(&self, parts: &[Part]) -> Reply {
        self.send(
            "POST",
            "/v1/upload",
            Some(&multipart_content_type()),
            Some(&multipart(parts)),
        )
    }

    /// POST /v1/upload/batch with these parts.
    pub fn upload_batch(&self, parts: &[Part]) -> Reply {
        self.send(
            "POST",
            "/v1/upload/batch",
            Some(&multipart_content_type()),
            Some(&multipart(parts)),
        )
    }

    /// Uploads one file; must answer 200 with exactly that file.
    pub fn upload(&self, filename: &str, content_type: &str, data: &[u8]) -> Uploaded {
        let reply = self.upload_parts(&[file_part(filename, content_type, data)]);
        assert_eq!(reply.status, 200, "upload of {filename}: {reply}");
        let v = reply.json();
        let files = v["files"].as_array().unwrap_or_else(|| panic!("no files: {v}"));
        assert_eq!(files.len(), 1, "{v}");
        Uploaded {
            session_id: v["storage_session_id"]
                .as_str()
                .unwrap_or_else(|| panic!("no storage_session_id: {v}"))
                .to_owned(),
            id: files[0]["id"]
                .as_str()
                .unwrap_or_else(|| panic!("no id: {v}"))
                .to_owned(),
            name: files[0]["name"]
                .as_str()
                .unwrap_or_else(|| panic!("no name: {v}"))
                .to_owned(),
            response: v,
        }
    }

    /// POST /v1/exec, which must answer 200.
    pub fn exec(&self, body: Value) -> Value {
        let reply = self.post_json("/v1/exec", &body);
        assert_eq!(reply.status, 200, "exec: {reply}");
        reply.json()
    }

    pub fn download(&self, session_id: &str, file_id: &str) -> Reply {
        self.get(&format!("/v1/download/{session_id}/{file_id}"))
    }

    /// GET /v1/files/{session_id}?detail=normalized, which must answer 200 with a list.
    pub fn list(&self, session_id: &str) -> Vec<Value> {
        self.list_detail(session_id, "detail=normalized")
    }

    /// GET /v1/files/{session_id}?{query}, which must answer 200 with a list.
    pub fn list_detail(&self, session_id: &str, query: &str) -> Vec<Value> {
        let reply = self.get(&format!("/v1/files/{session_id}?{query}"));
        assert_eq!(reply.status, 200, "list {session_id}: {reply}");
        match reply.json() {
            Value::Array(items) => items,
            other => panic!("list {session_id} is not an array: {other}"),
        }
    }

    pub fn object(&self, session_id: &str, file_id: &str) -> Reply {
        self.get(&format!("/v1/sessions/{session_id}/objects/{file_id}"))
    }

    pub fn delete_file(&self, session_id: &str, file_id: &str) -> Reply {
        self.delete(&format!("/v1/files/{session_id}/{file_id}"))
    }
}

/// One uploaded file.
pub(crate) struct Uploaded {
    pub session_id: String,
    pub id: String,
    pub name: String,
    pub response: Value,
}

impl Uploaded {
    /// This file as an entry of exec's `files`, staged under `name`.
    pub fn input(&self, name: &str) -> Value {
        json!({"id": self.id, "storage_session_id": self.session_id, "name": name})
    }
}

/// An error answer: this status, `{"error": "<non-empty>", "error_type": error_type}`.
pub(crate) fn assert_error(reply: &Reply, status: u16, error_type: &str) {
    assert_eq!(reply.status, status, "expected {status} {error_type}: {reply}");
    let v = reply.json();
    assert_eq!(v["error_type"], error_type, "{reply}");
    assert!(
        v["error"].as_str().is_some_and(|e| !e.is_empty()),
        "no error message: {reply}"
    );
}

pub(crate) fn assert_nanoid(id: &Value, context: &dyn std::fmt::Display) {
    let id = id
        .as_str()
        .unwrap_or_else(|| panic!("id {id} is not a string: {context}"));
    assert_eq!(id.len(), 21, "id {id:?} is not 21 characters: {context}");
    assert!(
        id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
        "id {id:?} is not over [A-Za-z0-9_-]: {context}"
    );
}

/// An id of the right shape that names nothing.
pub(crate) const NO_SUCH_ID: &str = "AAAAAAAAAAAAAAAAAAAAA";

// ---------------------------------------------------------------------------
// Helpers about runs and their outputs
// ---------------------------------------------------------------------------

/// Program source from its lines.
fn src(lines: &[&str]) -> String {
    let mut s = lines.join("\n");
    s.push('\n');
    s
}

fn session_of(r: &Value) -> String {
    r["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no session_id: {r}"))
        .to_owned()
}

/// The names of a run's new output files (not the inputs it returned as inherited), in
/// the order listed.
pub(crate) fn output_names(r: &Value) -> Vec<String> {
    r["files"]
        .as_array()
        .unwrap_or_else(|| panic!("no files: {r}"))
        .iter()
        .filter(|f| f["inherited"] != true)
        .map(|f| {
            f["name"]
                .as_str()
                .unwrap_or_else(|| panic!("file without a name: {r}"))
                .to_owned()
        })
        .collect()
}

/// The names of the inputs a run returned as inherited, in the order listed.
pub(crate) fn inherited_names(r: &Value) -> Vec<String> {
    r["files"]
        .as_array()
        .unwrap_or_else(|| panic!("no files: {r}"))
        .iter()
        .filter(|f| f["inherited"] == true)
        .map(|f| f["name"].as_str().unwrap_or_else(|| panic!("no name: {r}")).to_owned())
        .collect()
}

/// The output entry named `name`.
pub(crate) fn output<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["files"]
        .as_array()
        .unwrap_or_else(|| panic!("no files: {r}"))
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no output file {name:?}: {r}"))
}

/// Downloads the output file named `name`, which must answer 200.
pub(crate) fn download_output(c: &Client, r: &Value, name: &str) -> Vec<u8> {
    let f = output(r, name);
    let reply = c.download(f["storage_session_id"].as_str().unwrap(), f["id"].as_str().unwrap());
    assert_eq!(reply.status, 200, "download of {name}: {reply}");
    reply.body
}

/// `files_skipped` as (name, reason) pairs.
fn skipped(r: &Value) -> Vec<(String, String)> {
    r["files_skipped"]
        .as_array()
        .unwrap_or_else(|| panic!("no files_skipped: {r}"))
        .iter()
        .map(|e| {
            (
                e["name"]
                    .as_str()
                    .unwrap_or_else(|| panic!("skipped without a name: {r}"))
                    .to_owned(),
                e["reason"]
                    .as_str()
                    .unwrap_or_else(|| panic!("skipped without a reason: {r}"))
                    .to_owned(),
            )
        })
        .collect()
}

/// The skipped names with this reason, sorted.
fn skipped_for(r: &Value, reason: &str) -> Vec<String> {
    let mut names: Vec<String> = skipped(r)
        .into_iter()
        .filter(|(_, why)| why == reason)
        .map(|(n, _)| n)
        .collect();
    names.sort();
    names
}

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// (name, reason) pairs, to compare with `skipped`.
fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items.iter().map(|(n, r)| (n.to_string(), r.to_string())).collect()
}

/// Every output entry has the documented shape and lives under the run's session.
fn assert_outputs_shape(r: &Value) {
    let session = session_of(r);
    for f in r["files"].as_array().unwrap_or_else(|| panic!("no files: {r}")) {
        assert_nanoid(&f["id"], r);
        if f["inherited"] == true {
            // An input returned as it was keeps its own storage session.
            continue;
        }
        assert_eq!(f["storage_session_id"], session.as_str(), "{r}");
        assert!(f["size"].is_u64(), "{r}");
        assert!(f["name"].is_string(), "{r}");
    }
}

/// Regular files under `dir`, recursively, never following a symbolic link.
pub(crate) fn regular_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if meta.is_dir() {
                todo.push(e.path());
            } else if meta.is_file() {
                out.push(e.path());
            }
        }
    }
    out
}

/// How many regular files the file store holds on disk (its database included).
pub(crate) fn stored_count(s: &Server) -> usize {
    regular_files(&s.data_dir.join("files")).len()
}

/// Waits until the store holds `expected` regular files (cleanup may trail the answer).
fn wait_for_stored_count(s: &Server, expected: usize, limit: Duration) {
    let t = Instant::now();
    loop {
        let n = stored_count(s);
        if n == expected {
            return;
        }
        assert!(
            t.elapsed() < limit,
            "the store holds {n} regular files, expected {expected}: {:?}",
            regular_files(&s.data_dir.join("files"))
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Host secrets that must never show up in anything the server stores or returns.
fn host_secrets(s: &Server) -> Vec<(String, Vec<u8>)> {
    let mut secrets = Vec::new();
    let first_line = |path: &str| -> Option<Vec<u8>> {
        let text = std::fs::read(path).ok()?;
        let line = text.split(|&b| b == b'\n').next()?.to_vec();
        (line.len() >= 8).then_some(line)
    };
    for path in ["/etc/passwd", "/etc/shadow", "/etc/hostname"] {
        if let Some(line) = first_line(path) {
            secrets.push((path.to_owned(), line));
        }
    }
    if let Ok(key) = std::fs::read(s.data_dir.join("token.key")) {
        if key.len() >= 16 {
            secrets.push(("token.key".to_owned(), key));
        }
    }
    // The store's own database must not come back as a file either.
    if let Ok(db) = std::fs::read(s.data_dir.join("files/meta.redb")) {
        if db.len() >= 64 {
            secrets.push(("meta.redb".to_owned(), db[..64].to_vec()));
        }
    }
    secrets
}

/// No stored object holds any of `secrets`; `bodies` (what was downloaded) neither.
fn assert_no_secrets(s: &Server, secrets: &[(String, Vec<u8>)], bodies: &[Vec<u8>]) {
    let objects = regular_files(&s.data_dir.join("files/objects"));
    for (what, secret) in secrets {
        for path in &objects {
            let bytes = std::fs::read(path).unwrap_or_default();
            assert!(
                !contains(&bytes, secret),
                "the store holds {what} in {}",
                path.display()
            );
        }
        for body in bodies {
            assert!(!contains(body, secret), "a download returned {what}");
        }
    }
}

/// The server's peak resident memory, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    crate::common::proc_status_kib(pid, "VmHWM").unwrap_or_else(|| panic!("no VmHWM in /proc/{pid}/status"))
}

/// Runs a hostile collection fixture and returns the response and how long it took.
fn run_fixture(s: &Server, language: &str, fixture: &str, args: Value, files: Value) -> (Value, Duration) {
    let t = Instant::now();
    let r = s.exec(json!({
        "language": language,
        "code": hostile(fixture),
        "args": args,
        "files": files,
        "timeout": 60000,
    }));
    (r, t.elapsed())
}

/// SHA-256 through coreutils (no hashing crate among the test's dependencies).
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    use std::process::{Command, Stdio};
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run sha256sum");
    let mut stdin = child.stdin.take().unwrap();
    let data = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

fn unique(s: &Server, what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{what}-{}-{}-{nanos}", std::process::id(), s.port)
}

// ---------------------------------------------------------------------------
// Uploads, staging, outputs, downloads
// ---------------------------------------------------------------------------

#[test]
fn upload_exec_download_round_trip() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let csv = b"city,temp\nOslo,4\nLima,19\n";
    let up = c.upload("weather.csv", "text/csv", csv);
    let v = &up.response;
    assert_eq!(up.name, "weather.csv");
    assert_eq!(v["message"], "success", "{v}");
    assert_nanoid(&v["storage_session_id"], v);
    let f = &v["files"][0];
    assert_nanoid(&f["id"], v);
    assert_eq!(f["fileId"], f["id"], "{v}");
    assert_eq!(f["name"], "weather.csv", "{v}");
    assert_eq!(f["filename"], "weather.csv", "{v}");
    assert_eq!(f["storage_session_id"], v["storage_session_id"], "{v}");
    assert_eq!(f["size"], csv.len(), "{v}");
    assert!(
        f["content_type"].as_str().is_some_and(|t| t.starts_with("text/csv")),
        "{v}"
    );

    let r = c.exec(json!({
        "language": "python",
        "code": src(&[
            "import os",
            "print(os.getcwd())",
            "print(open('weather.csv').read(), end='')",
            "rows = open('/mnt/data/weather.csv').read().splitlines()[1:]",
            "with open('report.txt', 'w') as f:",
            "    f.write(';'.join(r.upper() for r in rows) + '\\n')",
            "with open('chart.png', 'wb') as f:",
            "    f.write(bytes(range(256)) * 4)",
        ]),
        "files": [up.input("weather.csv")],
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(
        r["stdout"],
        format!("/mnt/data\n{}", std::str::from_utf8(csv).unwrap()),
        "{r}"
    );
    assert_outputs_shape(&r);
    // Files are listed in sorted path order; the unchanged input is not listed.
    assert_eq!(output_names(&r), strings(&["chart.png", "report.txt"]), "{r}");
    assert_eq!(r["files_skipped"], json!([]), "{r}");
    assert_eq!(r["files_skipped_total"], 0, "{r}");
    let report = b"OSLO,4;LIMA,19\n";
    assert_eq!(output(&r, "report.txt")["size"], report.len(), "{r}");
    assert_eq!(download_output(&c, &r, "report.txt"), report);
    let png: Vec<u8> = (0..4).flat_map(|_| 0..=255u8).collect();
    assert_eq!(output(&r, "chart.png")["size"], png.len(), "{r}");
    assert_eq!(download_output(&c, &r, "chart.png"), png);

    // Content types: from the upload, or guessed from the name.
    let chart = output(&r, "chart.png");
    let reply = c.download(&session_of(&r), chart["id"].as_str().unwrap());
    assert!(
        reply
            .content_type
            .as_deref()
            .is_some_and(|t| t.starts_with("image/png")),
        "{reply}"
    );
    let reply = c.download(&up.session_id, &up.id);
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.body, csv);
    assert!(
        reply.content_type.as_deref().is_some_and(|t| t.starts_with("text/csv")),
        "{reply}"
    );
    // LibreChat adds query parameters; they are ignored.
    let reply = c.get(&format!("/v1/download/{}/{}?kind=user&id=abc", up.session_id, up.id));
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.body, csv);
}

#[test]
fn binary_uploads_come_back_byte_for_byte() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    // Every byte value, CR LF pairs and something that looks like a part boundary.
    let mut data: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    data.extend_from_slice(b"\r\n--not-the-boundary\r\n\r\n\0\0");
    let up = c.upload("blob.bin", "application/octet-stream", &data);
    assert_eq!(up.response["files"][0]["size"], data.len());
    let reply = c.download(&up.session_id, &up.id);
    assert_eq!(reply.status, 200, "{reply}");
    assert!(reply.body == data, "the download differs from the upload");
    // The sandbox sees the same bytes.
    let r = c.exec(json!({
        "code": "import hashlib\nprint(hashlib.sha256(open('blob.bin', 'rb').read()).hexdigest())",
        "files": [up.input("blob.bin")],
    }));
    let expected = sha256_hex(&data);
    assert_eq!(r["stdout"], format!("{expected}\n"), "{r}");
}

#[test]
fn upload_takes_several_parts_and_ignores_other_fields() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let reply = c.upload_parts(&[
        field_part("kind", "user"),
        field_part("entity_id", "agent_123"),
        file_part("one.txt", "text/plain", b"first\n"),
        Part {
            field: "files",
            filename: Some("two.json"),
            content_type: Some("application/json"),
            data: b"{\"n\": 2}",
        },
    ]);
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    let files = v["files"].as_array().unwrap_or_else(|| panic!("{v}"));
    assert_eq!(files.len(), 2, "{v}");
    let sid = v["storage_session_id"].as_str().unwrap();
    for (f, name, body) in [
        (&files[0], "one.txt", &b"first\n"[..]),
        (&files[1], "two.json", &b"{\"n\": 2}"[..]),
    ] {
        assert_eq!(f["name"], name, "{v}");
        assert_eq!(f["storage_session_id"], sid, "{v}");
        let got = c.download(sid, f["id"].as_str().unwrap());
        assert_eq!(got.status, 200, "{got}");
        assert_eq!(got.body, body);
    }
    assert_ne!(files[0]["id"], files[1]["id"]);

    // No file part at all.
    let reply = c.upload_parts(&[field_part("kind", "user")]);
    assert_error(&reply, 400, "invalid_request");
    // Not multipart.
    let reply = c.send(
        "POST",
        "/v1/upload",
        Some("application/json"),
        Some(b"{\"file\": \"x\"}"),
    );
    assert!((400..500).contains(&reply.status), "{reply}");
    assert!(reply.json()["error_type"].is_string(), "{reply}");
}

#[test]
fn list_objects_and_delete() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let up = c.upload("notes.md", "text/markdown", b"# notes\n");
    let r = c.exec(json!({
        "language": "bash",
        "code": "cat notes.md > copy.md && echo extra >> copy.md && printf 'abc' > data.bin",
        "files": [up.input("notes.md")],
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(output_names(&r), strings(&["copy.md", "data.bin"]), "{r}");
    assert_eq!(inherited_names(&r), strings(&["notes.md"]), "{r}");
    let run = session_of(&r);

    // Listing a session.
    let listed = c.list(&run);
    assert_eq!(listed.len(), 2, "{listed:?}");
    let mut names: Vec<&str> = listed.iter().map(|f| f["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, vec!["copy.md", "data.bin"]);
    for f in &listed {
        assert_nanoid(&f["id"], &json!(listed));
        assert!(!f["lastModified"].is_null(), "{f}");
        assert!(f["contentType"].is_string(), "{f}");
        let out = output(&r, f["name"].as_str().unwrap());
        assert_eq!(f["id"], out["id"], "{f}");
        assert_eq!(f["size"], out["size"], "{f}");
    }
    let uploads = c.list(&up.session_id);
    assert_eq!(uploads.len(), 1, "{uploads:?}");
    assert_eq!(uploads[0]["id"], up.id.as_str());
    assert_eq!(uploads[0]["name"], "notes.md");
    assert_eq!(uploads[0]["size"], 8);
    // An unknown session is an empty list.
    assert!(c.list(NO_SUCH_ID).is_empty());

    // Object metadata, without the bytes.
    let data = output(&r, "data.bin");
    let reply = c.object(&run, data["id"].as_str().unwrap());
    assert_eq!(reply.status, 200, "{reply}");
    let o = reply.json();
    assert_eq!(o["size"], 3, "{o}");
    assert!(o["contentType"].is_string(), "{o}");
    assert!(o["etag"].as_str().is_some_and(|e| !e.is_empty()), "{o}");
    let modified = o["lastModified"].as_str().unwrap_or_else(|| panic!("{o}"));
    let b = modified.as_bytes();
    assert!(
        b.len() >= 19 && b[4] == b'-' && b[7] == b'-' && b[10] == b'T' && b[13] == b':' && b[16] == b':',
        "lastModified is not ISO 8601: {o}"
    );
    let reply = c.object(&up.session_id, &up.id);
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.json()["size"], 8, "{reply}");
    assert_error(&c.object(&run, NO_SUCH_ID), 404, "file_not_found");

    // Delete: 200 with what was deleted, then gone from every route.
    let copy_id = output(&r, "copy.md")["id"].as_str().unwrap().to_owned();
    let reply = c.delete_file(&run, &copy_id);
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(
        reply.json(),
        json!({"message": "File deleted successfully", "session_id": run, "fileId": copy_id})
    );
    assert_error(&c.download(&run, &copy_id), 404, "file_not_found");
    assert_error(&c.object(&run, &copy_id), 404, "file_not_found");
    let listed = c.list(&run);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["name"], "data.bin");
    assert_error(&c.delete_file(&run, &copy_id), 404, "file_not_found");
    assert_error(&c.delete_file(&run, NO_SUCH_ID), 404, "file_not_found");
    // The other files are untouched.
    assert_eq!(download_output(&c, &r, "data.bin"), b"abc");
    assert_eq!(c.download(&up.session_id, &up.id).body, b"# notes\n");
    // A deleted input cannot be staged any more.
    let reply = c.delete_file(&up.session_id, &up.id);
    assert_eq!(reply.status, 200, "{reply}");
    let reply = c.post_json(
        "/v1/exec",
        &json!({"code": "print(1)", "files": [up.input("notes.md")]}),
    );
    assert_error(&reply, 404, "file_not_found");
}

#[test]
fn bash_outputs_in_sub_folders() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let r = c.exec(json!({
        "language": "bash",
        "code": src(&[
            "mkdir -p out/deep/er empty_dir",
            "echo hi > out/a.txt",
            "printf 'x' > b.bin",
            "seq 1 1000 > out/deep/er/numbers.txt",
            "echo scratch > /tmp/not_collected.txt",
        ]),
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_outputs_shape(&r);
    assert_eq!(
        output_names(&r),
        strings(&["b.bin", "out/a.txt", "out/deep/er/numbers.txt"]),
        "{r}"
    );
    assert_eq!(download_output(&c, &r, "out/a.txt"), b"hi\n");
    assert_eq!(download_output(&c, &r, "b.bin"), b"x");
    let numbers: String = (1..=1000).map(|i| format!("{i}\n")).collect();
    assert_eq!(download_output(&c, &r, "out/deep/er/numbers.txt"), numbers.as_bytes());
    assert_eq!(output(&r, "out/deep/er/numbers.txt")["size"], numbers.len());
    // A run that writes nothing lists nothing.
    let r = c.exec(json!({"language": "bash", "code": "echo quiet"}));
    assert_eq!(r["files"], json!([]), "{r}");
}

#[test]
fn unchanged_inputs_come_back_inherited_and_changed_ones_as_new_files() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let keep = c.upload("keep.txt", "text/plain", b"keep me\n");
    let grow = c.upload("grow.txt", "text/plain", b"line 1\n");
    let r = c.exec(json!({
        "code": src(&[
            "print(open('keep.txt').read(), end='')",
            "with open('grow.txt', 'a') as f:",
            "    f.write('line 2\\n')",
        ]),
        "files": [keep.input("keep.txt"), grow.input("grow.txt")],
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "keep me\n", "{r}");
    assert_eq!(output_names(&r), strings(&["grow.txt"]), "{r}");
    let out = output(&r, "grow.txt");
    assert_eq!(out["storage_session_id"], r["session_id"], "{r}");
    assert_ne!(out["id"], grow.id.as_str(), "a changed input is a new file: {r}");
    assert_eq!(
        out["modified_from"],
        json!({"id": grow.id, "storage_session_id": grow.session_id}),
        "{r}"
    );
    assert!(out.get("inherited").is_none(), "{r}");
    // The unchanged input comes back as it was: its own id and storage session.
    assert_eq!(inherited_names(&r), strings(&["keep.txt"]), "{r}");
    assert_eq!(
        output(&r, "keep.txt"),
        &json!({"id": keep.id, "name": "keep.txt", "storage_session_id": keep.session_id, "size": 8, "inherited": true}),
        "{r}"
    );
    assert_eq!(download_output(&c, &r, "grow.txt"), b"line 1\nline 2\n");
    // What the sandbox wrote never reaches the stored original.
    assert_eq!(c.download(&grow.session_id, &grow.id).body, b"line 1\n");
    assert_eq!(c.download(&keep.session_id, &keep.id).body, b"keep me\n");

    // Inputs are staged read-write, and each run gets its own copy.
    let r = c.exec(json!({
        "language": "bash",
        "code": "cat grow.txt; echo changed > grow.txt; rm keep.txt",
        "files": [keep.input("keep.txt"), grow.input("grow.txt")],
    }));
    assert_eq!(r["stdout"], "line 1\n", "{r}");
    assert_eq!(output_names(&r), strings(&["grow.txt"]), "{r}");
    // A deleted input is not inherited.
    assert!(inherited_names(&r).is_empty(), "{r}");
    assert_eq!(download_output(&c, &r, "grow.txt"), b"changed\n");
    assert_eq!(c.download(&grow.session_id, &grow.id).body, b"line 1\n");
    assert_eq!(c.download(&keep.session_id, &keep.id).body, b"keep me\n");
}

#[test]
fn inputs_in_sub_folders_and_the_session_id_alias() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let a = c.upload("x.csv", "text/csv", b"1,2\n");
    let b = c.upload("y.txt", "text/plain", b"why\n");
    let r = c.exec(json!({
        "language": "bash",
        "code": "cat data/x.csv a/b/c/why.txt; cat top.txt",
        "files": [
            a.input("data/x.csv"),
            {"id": b.id, "session_id": b.session_id, "name": "a/b/c/why.txt", "kind": "user", "version": 3},
            {"id": a.id, "storage_session_id": a.session_id, "name": "top.txt"},
        ],
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "1,2\nwhy\n1,2\n", "{r}");
    assert!(output_names(&r).is_empty(), "unchanged inputs are not new outputs: {r}");
    assert_eq!(
        inherited_names(&r),
        strings(&["data/x.csv", "a/b/c/why.txt", "top.txt"]),
        "{r}"
    );
}

#[test]
fn bad_input_names_are_400() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let up = c.upload("x.txt", "text/plain", b"x\n");
    for name in [
        "/etc/passwd",
        "/mnt/data/x.txt",
        "../x.txt",
        "..",
        "a/../../x.txt",
        "data/..",
        "",
        "new\nline.txt",
        "nul\u{0}byte.txt",
        "esc\u{1b}[31m.txt",
    ] {
        let reply = c.post_json("/v1/exec", &json!({"code": "print('ran')", "files": [up.input(name)]}));
        assert_error(&reply, 400, "invalid_request");
        let reply = c.post_json(
            "/v1/exec/programmatic",
            &json!({"code": "print('ran')", "tools": [], "files": [up.input(name)]}),
        );
        assert_error(&reply, 400, "invalid_request");
    }
    // Dots inside a name are fine.
    let r = c.exec(json!({"code": "print(open('a..b').read(), end='')", "files": [up.input("a..b")]}));
    assert_eq!(r["stdout"], "x\n", "{r}");
}

#[test]
fn unknown_or_malformed_input_ids_are_404() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let up = c.upload("x.txt", "text/plain", b"x\n");
    for file in [
        json!({"id": NO_SUCH_ID, "storage_session_id": up.session_id, "name": "x.txt"}),
        json!({"id": up.id, "storage_session_id": NO_SUCH_ID, "name": "x.txt"}),
        json!({"id": up.id, "session_id": NO_SUCH_ID, "name": "x.txt"}),
        // Ids that try to walk the store's directories.
        json!({"id": "../meta.redb", "storage_session_id": "..", "name": "x.txt"}),
        json!({"id": "../../token.key", "storage_session_id": up.session_id, "name": "x.txt"}),
        json!({"id": up.id, "storage_session_id": format!("../{}", up.session_id), "name": "x.txt"}),
    ] {
        let reply = c.post_json("/v1/exec", &json!({"code": "print('ran')", "files": [file]}));
        assert_error(&reply, 404, "file_not_found");
        let reply = c.post_json(
            "/v1/exec/programmatic",
            &json!({"code": "print('ran')", "tools": [], "files": [file]}),
        );
        assert_error(&reply, 404, "file_not_found");
    }
}

#[test]
fn file_routes_cannot_walk_the_store() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let up = c.upload("x.txt", "text/plain", b"x\n");
    let secrets = host_secrets(&s);
    let before = regular_files(&s.data_dir);
    let sid = &up.session_id;
    let real_sid = sid.clone();
    for (sid, fid) in [
        ("..", "meta.redb"),
        ("..%2F..", "token.key"),
        ("%2E%2E", "%2E%2E%2Ftoken.key"),
        (sid.as_str(), "..%2F..%2Fmeta.redb"),
        (sid.as_str(), "%2E%2E%2F%2E%2E%2F%2E%2E%2Ftoken.key"),
        ("..%2F..%2F..%2F..%2F..%2Fetc", "passwd"),
    ] {
        for reply in [c.download(sid, fid), c.object(sid, fid), c.delete_file(sid, fid)] {
            assert!(reply.status == 404 || reply.status == 400, "{sid}/{fid}: {reply}");
            assert_no_secrets(&s, &secrets, &[reply.body]);
        }
        let reply = c.get(&format!("/v1/files/{sid}"));
        assert!(
            reply.status == 200 || reply.status == 404 || reply.status == 400,
            "{reply}"
        );
        // Listing the real session legitimately shows its file; nothing else lists.
        if reply.status == 200 && sid != real_sid {
            assert_eq!(reply.json(), json!([]), "{reply}");
        }
    }
    // Nothing was deleted.
    let after = regular_files(&s.data_dir);
    for path in &before {
        assert!(after.contains(path), "{} is gone", path.display());
    }
    assert_eq!(c.download(&up.session_id, &up.id).body, b"x\n");
}

#[test]
fn upload_names_keep_to_the_store() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let marker = unique(&s, "escape");
    for raw in [
        format!("../../../../../../tmp/{marker}-a.txt"),
        format!("/tmp/{marker}-b.txt"),
        format!("..\\..\\{marker}-c.txt"),
        format!("sub/../../{marker}-d.txt"),
    ] {
        let reply = c.upload_parts(&[file_part(&raw, "text/plain", b"escaped?\n")]);
        assert!(reply.status == 200 || reply.status == 400, "{raw}: {reply}");
        if reply.status == 200 {
            let v = reply.json();
            let name = v["files"][0]["name"].as_str().unwrap_or_else(|| panic!("{v}"));
            assert!(!name.starts_with('/'), "{v}");
            assert!(!name.split(['/', '\\']).any(|p| p == ".."), "{v}");
        } else {
            assert_error(&reply, 400, "invalid_request");
        }
    }
    let mut leaked: Vec<PathBuf> = Vec::new();
    let dirs: [&Path; 5] = [
        Path::new("/tmp"),
        Path::new("/"),
        s.dir.parent().unwrap_or(Path::new("/tmp")),
        s.dir.as_path(),
        s.data_dir.as_path(),
    ];
    for dir in dirs {
        if let Ok(entries) = std::fs::read_dir(dir) {
            leaked.extend(
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.to_string_lossy().contains(&marker)),
            );
        }
    }
    leaked.extend(
        regular_files(&s.data_dir)
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(&marker)),
    );
    assert!(leaked.is_empty(), "an upload name became a path: {leaked:?}");
}

#[test]
fn programmatic_runs_take_inputs_and_return_outputs() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let up = c.upload("prices.txt", "text/plain", b"10\n20\n");
    let tool = json!({
        "name": "convert",
        "description": "converts an amount",
        "parameters": {"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]},
    });
    let reply = c.post_json(
        "/v1/exec/programmatic",
        &json!({
            "language": "python",
            "code": src(&[
                "total = sum(int(x) for x in open('input/prices.txt').read().split())",
                "converted = convert(amount=total)",
                "with open('result.txt', 'w') as f:",
                "    f.write(f'{total} -> {converted}\\n')",
                "print('done')",
            ]),
            "tools": [tool],
            "files": [{"id": up.id, "storage_session_id": up.session_id, "name": "input/prices.txt",
                "kind": "user", "entity_id": "agent_7"}],
        }),
    );
    assert_eq!(reply.status, 200, "{reply}");
    let paused = reply.json();
    assert_eq!(paused["status"], "tool_call_required", "{paused}");
    let call = &paused["tool_calls"][0];
    assert_eq!(call["arguments"], json!({"amount": 30}), "{paused}");
    let reply = c.post_json(
        "/v1/exec/programmatic",
        &json!({
            "session_id": paused["session_id"],
            "continuation_token": paused["continuation_token"],
            "tool_results": [{"call_id": call["id"], "result": 27.6, "is_error": false}],
        }),
    );
    assert_eq!(reply.status, 200, "{reply}");
    let done = reply.json();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["stdout"], "done\n", "{done}");
    assert_eq!(output_names(&done), strings(&["result.txt"]), "{done}");
    assert_outputs_shape(&done);
    assert_eq!(download_output(&c, &done, "result.txt"), b"30 -> 27.6\n");
    // The input comes back inherited, with the entity_id the request gave it.
    assert_eq!(
        output(&done, "input/prices.txt"),
        &json!({"id": up.id, "name": "input/prices.txt", "storage_session_id": up.session_id, "size": 6,
            "inherited": true, "entity_id": "agent_7"}),
        "{done}"
    );
}

// ---------------------------------------------------------------------------
// Files as LibreChat uses them: nested names, batches, detail levels, read-only
// inputs, inherited and modified outputs
// ---------------------------------------------------------------------------

/// A batch answer's `files` as (status, filename, has an error) triples.
fn batch_outcomes(v: &Value) -> Vec<(String, String, bool)> {
    v["files"]
        .as_array()
        .unwrap_or_else(|| panic!("no files: {v}"))
        .iter()
        .map(|f| {
            (
                f["status"].as_str().unwrap_or_default().to_owned(),
                f["filename"].as_str().unwrap_or_default().to_owned(),
                f["error"].as_str().is_some_and(|e| !e.is_empty()),
            )
        })
        .collect()
}

#[test]
fn nested_upload_names_are_staged_at_their_path_and_outputs_keep_their_folders() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let script =
        b"import os\nos.makedirs('skill/out', exist_ok=True)\nopen('skill/out/result.txt', 'w').write('ran\\n')\n";
    let reply = c.upload_parts(&[
        field_part("kind", "skill"),
        field_part("id", "skill_42"),
        field_part("version", "3"),
        file_part("skill/scripts/run.py", "text/x-python", script),
    ]);
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    assert_eq!(v["files"][0]["name"], "skill/scripts/run.py", "{v}");
    assert_eq!(v["files"][0]["filename"], "skill/scripts/run.py", "{v}");
    let sid = v["storage_session_id"].as_str().unwrap().to_owned();
    let fid = v["files"][0]["fileId"].as_str().unwrap().to_owned();
    let r = c.exec(json!({
        "lang": "py",
        "code": "import runpy; runpy.run_path('skill/scripts/run.py'); print(open('skill/out/result.txt').read(), end='')",
        "files": [{"id": fid, "resource_id": "r1", "name": "skill/scripts/run.py", "storage_session_id": sid, "kind": "skill"}],
    }));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "ran\n", "{r}");
    assert_eq!(output_names(&r), strings(&["skill/out/result.txt"]), "{r}");
    assert_eq!(inherited_names(&r), strings(&["skill/scripts/run.py"]), "{r}");
    assert_eq!(download_output(&c, &r, "skill/out/result.txt"), b"ran\n");
    // Bad names stay refused, nothing stored.
    let before = stored_count(&s);
    for bad in [
        "../x.py",
        "/etc/x.py",
        "a//b.py",
        "a/./b.py",
        "skill/../../x.py",
        "dir/",
    ] {
        let reply = c.upload_parts(&[file_part(bad, "text/plain", b"x")]);
        assert_error(&reply, 400, "invalid_request");
    }
    assert_eq!(stored_count(&s), before);
}

#[test]
fn list_detail_levels_and_filters() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let reply = c.upload_parts(&[
        field_part("kind", "user"),
        field_part("id", "user_1"),
        field_part("read_only", "true"),
        file_part("docs/a.txt", "text/plain", b"hello"),
        file_part("notes", "text/plain", b"all:\n"),
    ]);
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    let sid = v["storage_session_id"].as_str().unwrap().to_owned();
    let a = v["files"][0]["id"].as_str().unwrap().to_owned();
    let m = v["files"][1]["id"].as_str().unwrap().to_owned();
    let a_name = format!("{sid}/{a}.txt");
    let m_name = format!("{sid}/{m}");

    // simple, the default: object names, with the extension if any.
    let simple = c.list_detail(&sid, "");
    assert_eq!(simple, vec![json!(a_name), json!(m_name)]);
    assert_eq!(c.list_detail(&sid, "detail=simple"), simple);

    let etag = format!("\"{}\"", sha256_hex(b"hello"));
    let summary = c.list_detail(&sid, "detail=summary");
    assert_eq!(summary.len(), 2);
    let modified = summary[0]["lastModified"].clone();
    assert!(modified.is_string(), "{summary:?}");
    assert_eq!(
        summary[0],
        json!({"name": a_name, "size": 5, "lastModified": modified, "etag": etag})
    );

    let full = c.list_detail(&sid, "detail=full");
    assert_eq!(
        full[0],
        json!({"name": a_name, "size": 5, "lastModified": modified, "etag": etag,
            "metadata": {"content-type": "text/plain", "original-filename": "docs/a.txt",
                "original-filename-encoded": "none"},
            "contentType": "text/plain"})
    );
    assert_eq!(full[1]["metadata"]["original-filename"], "notes");

    let normalized = c.list_detail(&sid, "detail=normalized");
    assert_eq!(
        normalized[0],
        json!({"id": a, "name": "docs/a.txt", "storage_session_id": sid, "size": 5,
            "contentType": "text/plain", "lastModified": modified, "read_only": true})
    );

    // The client's own query: kind and id of the uploader.
    assert_eq!(c.list_detail(&sid, "detail=full&kind=user&id=user_1").len(), 2);
    assert!(c.list_detail(&sid, "detail=full&kind=skill").is_empty());
    assert!(c.list_detail(&sid, "detail=full&kind=user&id=user_2").is_empty());
    // An unknown detail is refused; unknown sessions are empty at every level.
    assert_error(
        &c.get(&format!("/v1/files/{sid}?detail=everything")),
        400,
        "invalid_request",
    );
    assert!(c.list_detail(NO_SUCH_ID, "detail=summary").is_empty());

    // The object name from the list reaches the file on the other routes too.
    let got = c.get(&format!("/v1/download/{a_name}"));
    assert_eq!(got.status, 200, "{got}");
    assert_eq!(got.body, b"hello");
    assert_eq!(c.object(&sid, &format!("{a}.txt")).json()["size"], 5);
    let reply = c.delete(&format!("/v1/files/{a_name}"));
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(
        reply.json(),
        json!({"message": "File deleted successfully", "session_id": sid, "fileId": a})
    );
    assert_eq!(c.list_detail(&sid, ""), vec![json!(m_name)]);
}

#[test]
fn batch_upload_stores_each_file_on_its_own() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let reply = c.upload_batch(&[
        field_part("kind", "skill"),
        field_part("id", "skill_9"),
        file_part("skill/SKILL.md", "text/markdown", b"# skill\n"),
        file_part("../escape.txt", "text/plain", b"no"),
        file_part("skill/scripts/run.sh", "text/x-sh", b"echo hi\n"),
        file_part("/abs.txt", "text/plain", b"no"),
        field_part("read_only", "true"),
    ]);
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    assert_eq!(v["message"], "partial_success", "{v}");
    assert_eq!(
        (v["succeeded"].as_u64(), v["failed"].as_u64()),
        (Some(2), Some(2)),
        "{v}"
    );
    assert_eq!(
        batch_outcomes(&v),
        vec![
            ("success".into(), "skill/SKILL.md".into(), false),
            ("error".into(), "../escape.txt".into(), true),
            ("success".into(), "skill/scripts/run.sh".into(), false),
            ("error".into(), "/abs.txt".into(), true),
        ]
    );
    let sid = v["storage_session_id"].as_str().unwrap().to_owned();
    assert_nanoid(&v["storage_session_id"], &v);
    let skill_md = v["files"][0]["fileId"].as_str().unwrap().to_owned();
    assert_nanoid(&v["files"][0]["fileId"], &v);
    assert_eq!(c.download(&sid, &skill_md).body, b"# skill\n");
    // The fields apply to every file, even when sent after them.
    let listed = c.list(&sid);
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.iter().all(|f| f["read_only"] == true), "{listed:?}");
    assert_eq!(c.list_detail(&sid, "kind=skill&id=skill_9").len(), 2);

    // Everything good: success.
    let reply = c.upload_batch(&[
        file_part("a.txt", "text/plain", b"a"),
        file_part("b/c.txt", "text/plain", b"c"),
    ]);
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    assert_eq!(v["message"], "success", "{v}");
    assert_eq!(
        (v["succeeded"].as_u64(), v["failed"].as_u64()),
        (Some(2), Some(0)),
        "{v}"
    );
    assert!(v["files"][0].get("error").is_none(), "{v}");

    // Every file failed: 400, the batch body with the error shape's fields too.
    let before = stored_count(&s);
    let reply = c.upload_batch(&[
        file_part("../a", "text/plain", b"a"),
        file_part("x//y", "text/plain", b"b"),
    ]);
    assert_eq!(reply.status, 400, "{reply}");
    let v = reply.json();
    assert_eq!(v["message"], "error", "{v}");
    assert_eq!(v["error_type"], "invalid_request", "{v}");
    assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    assert_eq!(
        (v["succeeded"].as_u64(), v["failed"].as_u64()),
        (Some(0), Some(2)),
        "{v}"
    );
    assert_eq!(stored_count(&s), before);
    // No file part, or a bad field: the plain error, nothing stored.
    assert_error(&c.upload_batch(&[field_part("kind", "user")]), 400, "invalid_request");
    let reply = c.upload_batch(&[field_part("read_only", "maybe"), file_part("a.txt", "text/plain", b"a")]);
    assert_error(&reply, 400, "invalid_request");
    // A field sent twice: which value applies would be a guess, so neither route takes it.
    for twice in [
        [field_part("read_only", "true"), field_part("read_only", "false")],
        [field_part("version", "1"), field_part("version", "1")],
        [field_part("id", "a"), field_part("entity_id", "a")],
    ] {
        let parts = [
            twice[0].clone(),
            file_part("a.txt", "text/plain", b"a"),
            twice[1].clone(),
        ];
        let reply = c.upload_batch(&parts);
        assert_error(&reply, 400, "invalid_request");
        assert!(
            reply.json()["error"].as_str().unwrap().contains("more than once"),
            "{reply}"
        );
        assert_error(&c.upload_parts(&parts), 400, "invalid_request");
    }
    assert_eq!(stored_count(&s), before);
}

#[test]
fn batch_upload_takes_200_files_and_refuses_201() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let names: Vec<String> = (0..201).map(|i| format!("dir{}/f{i}.txt", i % 7)).collect();
    let parts: Vec<Part> = names.iter().map(|n| file_part(n, "text/plain", n.as_bytes())).collect();
    let before = stored_count(&s);
    assert_error(&c.upload_batch(&parts), 400, "invalid_request");
    assert_eq!(stored_count(&s), before, "a refused batch stores nothing");
    let reply = c.upload_batch(&parts[..200]);
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    assert_eq!(v["message"], "success", "{v}");
    assert_eq!(v["succeeded"], 200, "{v}");
    let sid = v["storage_session_id"].as_str().unwrap();
    assert_eq!(c.list_detail(sid, "").len(), 200);
    let f = &v["files"][123];
    assert_eq!(f["filename"], names[123].as_str(), "{v}");
    assert_eq!(
        c.download(sid, f["fileId"].as_str().unwrap()).body,
        names[123].as_bytes()
    );
}

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
fn read_only_inputs_are_never_returned_as_new_outputs() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let reply = c.upload_batch(&[
        field_part("read_only", "true"),
        file_part("skill/tool.py", "text/x-python", b"X = 1\n"),
        file_part("skill/data.txt", "text/plain", b"data\n"),
    ]);
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    let sid = v["storage_session_id"].as_str().unwrap().to_owned();
    let tool = v["files"][0]["fileId"].as_str().unwrap().to_owned();
    let data = v["files"][1]["fileId"].as_str().unwrap().to_owned();
    let user = c.upload("notes.txt", "text/plain", b"n\n");
    let r = c.exec(json!({
        "language": "bash",
        "code": "echo 'X = 2' > skill/tool.py; rm skill/data.txt; echo more >> notes.txt; echo new > new.txt",
        "files": [
            {"id": tool, "storage_session_id": sid, "name": "skill/tool.py", "entity_id": "skill_1"},
            {"id": data, "storage_session_id": sid, "name": "skill/data.txt"},
            user.input("notes.txt"),
        ],
    }));
    assert_eq!(r["status"], "ok", "{r}");
    // Changed or deleted, a read-only input comes back as it was; the writable one that
    // changed is a new file.
    assert_eq!(output_names(&r), strings(&["new.txt", "notes.txt"]), "{r}");
    assert_eq!(
        inherited_names(&r),
        strings(&["skill/tool.py", "skill/data.txt"]),
        "{r}"
    );
    assert_eq!(
        output(&r, "skill/tool.py"),
        &json!({"id": tool, "name": "skill/tool.py", "storage_session_id": sid, "size": 6,
            "inherited": true, "entity_id": "skill_1"}),
        "{r}"
    );
    assert!(output(&r, "skill/data.txt").get("entity_id").is_none(), "{r}");
    assert_eq!(
        output(&r, "notes.txt")["modified_from"],
        json!({"id": user.id, "storage_session_id": user.session_id}),
        "{r}"
    );
    assert!(r["files_skipped"].as_array().unwrap().is_empty(), "{r}");
    assert_eq!(c.download(&sid, &tool).body, b"X = 1\n");
    // A run that leaves nothing at all still returns its read-only inputs.
    let r = c.exec(json!({
        "language": "bash",
        "code": "rm -rf skill",
        "files": [{"id": tool, "storage_session_id": sid, "name": "skill/tool.py"}],
    }));
    assert_eq!(inherited_names(&r), strings(&["skill/tool.py"]), "{r}");
    assert!(output_names(&r).is_empty(), "{r}");
}

// ---------------------------------------------------------------------------
// Size caps, streaming
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Hostile collection
// ---------------------------------------------------------------------------

#[test]
fn symlinks_pointing_outside_are_never_followed() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let input = c.upload("input.csv", "text/csv", b"a,b\n");
    let secrets = host_secrets(&s);
    assert!(
        secrets.iter().any(|(w, _)| w == "/etc/passwd"),
        "the host has no /etc/passwd to protect"
    );
    let stored = stored_count(&s);
    let (r, took) = run_fixture(
        &s,
        "bash",
        "collect_symlinks.sh",
        json!([s.data_dir.to_string_lossy()]),
        json!([input.input("input.csv")]),
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "done\n", "{r}");
    assert_eq!(output_names(&r), strings(&["ok.txt"]), "{r}");
    assert_eq!(
        skipped_for(&r, "symlink"),
        strings(&[
            "data_dir",
            "etc",
            "input.csv",
            "nested/passwd",
            "passwd",
            "proc_root_passwd",
            "relative_passwd",
            "root",
            "self_loop",
            "shadow",
            "stored_files",
            "token_key",
        ]),
        "{r}"
    );
    assert_eq!(skipped(&r).len(), 12, "{r}");
    assert_eq!(r["files_skipped_total"], 12, "{r}");
    let ok = download_output(&c, &r, "ok.txt");
    assert_eq!(ok, b"fine\n");
    wait_for_stored_count(&s, stored + 1, Duration::from_secs(5));
    assert_no_secrets(&s, &secrets, &[ok]);
    // The input replaced by a link is untouched in the store.
    assert_eq!(c.download(&input.session_id, &input.id).body, b"a,b\n");
    s.assert_healthy();
}

#[test]
fn hard_links_are_collected_once() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let secrets = host_secrets(&s);
    let stored = stored_count(&s);
    let (r, _) = run_fixture(&s, "bash", "collect_hard_links.sh", json!([]), json!([]));
    assert_eq!(r["status"], "ok", "{r}");
    let out = r["stdout"].as_str().unwrap();
    assert!(!out.contains("shadow=0"), "a hard link to /etc/shadow was made: {r}");
    assert!(!out.contains("passwd=0"), "a hard link to /etc/passwd was made: {r}");
    assert_eq!(output_names(&r), strings(&["a.txt", "solo.txt"]), "{r}");
    assert_eq!(skipped_for(&r, "hard_link"), strings(&["b.txt", "sub/c.txt"]), "{r}");
    assert_eq!(skipped(&r).len(), 2, "{r}");
    assert_eq!(r["files_skipped_total"], 2, "{r}");
    let a = download_output(&c, &r, "a.txt");
    assert_eq!(a, b"shared\n");
    assert_eq!(download_output(&c, &r, "solo.txt"), b"solo\n");
    wait_for_stored_count(&s, stored + 2, Duration::from_secs(5));
    assert_no_secrets(&s, &secrets, &[a]);
}

#[test]
fn fifos_and_sockets_are_skipped_without_hanging() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let input = c.upload("input.txt", "text/plain", b"in\n");
    let (r, took) = run_fixture(
        &s,
        "python",
        "collect_fifos.py",
        json!([]),
        json!([input.input("input.txt")]),
    );
    assert!(took < Duration::from_secs(20), "collection hung on a fifo: {took:?}");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(output_names(&r), strings(&["ok.txt"]), "{r}");
    let mut expected = vec!["input.txt", "pipe", "sub/pipe"];
    if r["stdout"].as_str().unwrap().contains("socket made") {
        expected.push("sock");
    }
    expected.sort_unstable();
    assert_eq!(skipped_for(&r, "not_regular_file"), strings(&expected), "{r}");
    assert_eq!(skipped(&r).len(), expected.len(), "{r}");
    assert_eq!(download_output(&c, &r, "ok.txt"), b"fine\n");
    assert_eq!(c.download(&input.session_id, &input.id).body, b"in\n");
    s.assert_healthy();
}

#[test]
fn device_nodes_cannot_be_made_or_collected() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let (r, took) = run_fixture(&s, "python", "collect_devices.py", json!([]), json!([]));
    assert!(took < Duration::from_secs(20), "took {took:?}: {r}");
    assert_eq!(r["status"], "ok", "{r}");
    let results: Value = serde_json::from_str(r["stdout"].as_str().unwrap().trim())
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {r}"));
    for name in ["char_null", "char_zero", "char_mem", "block_sda"] {
        assert!(results[name].is_u64(), "mknod {name} was not refused: {results}");
    }
    assert_eq!(output_names(&r), strings(&["ok.txt"]), "{r}");
    assert_eq!(
        skipped_for(&r, "symlink"),
        strings(&["mem_link", "urandom_link", "zero_link"]),
        "{r}"
    );
    if results["null_hard"] == "created" {
        // Linked in after all: it must still never be read.
        assert_eq!(skipped_for(&r, "not_regular_file"), strings(&["null_hard"]), "{r}");
    } else {
        assert_eq!(skipped(&r).len(), 3, "{r}");
    }
    for (name, _) in skipped(&r) {
        assert!(!name.starts_with("char_") && !name.starts_with("block_"), "{r}");
    }
    assert_eq!(download_output(&c, &r, "ok.txt"), b"fine\n");
    s.assert_healthy();
}

#[test]
fn names_with_dots_are_plain_names_and_nothing_escapes() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let marker = unique(&s, "dots");
    let (r, _) = run_fixture(&s, "bash", "collect_dot_names.sh", json!([marker]), json!([]));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(
        output_names(&r),
        strings(&["...", "..dir/file", "a..b", "b..", "sub/..."]),
        "{r}"
    );
    assert_eq!(r["files_skipped"], json!([]), "{r}");
    for (name, body) in [
        ("...", &b"three\n"[..]),
        ("..dir/file", &b"inside\n"[..]),
        ("a..b", &b"ab\n"[..]),
        ("b..", &b"tail\n"[..]),
        ("sub/...", &b"deep\n"[..]),
    ] {
        assert_eq!(download_output(&c, &r, name), body, "{name}");
    }
    // Nothing named after the marker exists on the host.
    let escaped = format!("escape-{marker}");
    for dir in [Path::new("/"), Path::new("/mnt"), Path::new("/tmp"), s.dir.as_path()] {
        assert!(!dir.join(&escaped).exists(), "{} exists", dir.join(&escaped).display());
    }
    let found: Vec<PathBuf> = regular_files(&s.dir)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(&marker))
        .collect();
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn names_with_newlines_or_invalid_utf8_are_skipped() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let stored = stored_count(&s);
    let (r, _) = run_fixture(&s, "python", "collect_bad_names.py", json!([]), json!([]));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "made\n", "{r}");
    assert_eq!(
        output_names(&r),
        strings(&["caf\u{e9} \u{2713}.txt", "good.txt"]),
        "{r}"
    );
    assert_eq!(download_output(&c, &r, "caf\u{e9} \u{2713}.txt"), b"unicode\n");
    assert_eq!(download_output(&c, &r, "good.txt"), b"good\n");
    let bad = skipped(&r);
    assert!(bad.iter().all(|(_, why)| why == "invalid_name"), "{r}");
    assert_eq!(bad.len(), 6, "{r}");
    assert_eq!(r["files_skipped_total"], 6, "{r}");
    let names: Vec<&str> = bad.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"bad\u{fffd}name.txt"), "{r}");
    for (start, end) in [
        ("new", "line.txt"),
        ("carriage", "return.txt"),
        ("escape", ".txt"),
        ("tab", "name.txt"),
        ("dir\u{fffd}", ""),
    ] {
        assert_eq!(
            names
                .iter()
                .filter(|n| n.starts_with(start) && n.ends_with(end))
                .count(),
            1,
            "no single entry for {start}...{end}: {r}"
        );
    }
    wait_for_stored_count(&s, stored + 2, Duration::from_secs(5));
    // Listing the run's session shows only the good names.
    let mut listed: Vec<String> = c
        .list(&session_of(&r))
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    assert_eq!(listed, strings(&["caf\u{e9} \u{2713}.txt", "good.txt"]));
}

#[test]
fn directory_swapped_for_a_symlink_at_the_end() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let secrets = host_secrets(&s);
    let (r, _) = run_fixture(&s, "bash", "collect_dir_swap.sh", json!([]), json!([]));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "swapping\n", "{r}");
    assert_eq!(output_names(&r), strings(&["moved/hostname", "moved/passwd"]), "{r}");
    assert_eq!(skipped(&r), pairs(&[("out", "symlink")]), "{r}");
    let mut bodies = Vec::new();
    for name in ["moved/hostname", "moved/passwd"] {
        let body = download_output(&c, &r, name);
        assert_eq!(body, b"decoy\n", "{name}");
        bodies.push(body);
    }
    assert_no_secrets(&s, &secrets, &bodies);
}

#[test]
fn swapping_during_collection_reads_nothing_outside() {
    let s = Server::start_with(&[NO_POOL], "");
    let c = Client::anonymous(&s);
    let secrets = host_secrets(&s);
    for round in 0..3 {
        let (r, took) = run_fixture(&s, "python", "collect_swap_race.py", json!([]), json!([]));
        assert!(took < Duration::from_secs(30), "round {round} took {took:?}: {r}");
        assert_eq!(r["status"], "ok", "round {round}: {r}");
        assert!(
            r["stdout"].as_str().unwrap().contains("leaving the swapper running"),
            "{r}"
        );
        let mut allowed = vec!["file_swap".to_owned(), "file_link".to_owned(), "tmp_swap".to_owned()];
        for dir in ["out", "swap", "tmp_swap"] {
            for name in ["passwd", "group", "hostname"] {
                allowed.push(format!("{dir}/{name}"));
            }
        }
        let mut bodies = Vec::new();
        for name in output_names(&r) {
            assert!(
                allowed.contains(&name),
                "round {round}: collected {name:?}, not a decoy: {r}"
            );
            let body = download_output(&c, &r, &name);
            assert_eq!(body, b"decoy\n", "round {round}: {name} is not the decoy");
            bodies.push(body);
        }
        assert!(output_names(&r).len() <= 4, "round {round}: {r}");
        for (name, why) in skipped(&r) {
            assert!(
                allowed.contains(&name) || ["out", "swap"].contains(&name.as_str()),
                "round {round}: {name}: {r}"
            );
            assert!(
                why == "symlink" || why == "not_regular_file",
                "round {round}: {name} {why}: {r}"
            );
        }
        assert_no_secrets(&s, &secrets, &bodies);
    }
    // The swapper died with its run.
    let t = Instant::now();
    while !descendants(s.pid()).is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "left behind: {:?}",
            descendants(s.pid())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    s.assert_healthy();
}

#[test]
fn ten_thousand_tiny_files() {
    let s = Server::start();
    let c = Client::anonymous(&s);
    let stored = stored_count(&s);
    let (r, took) = run_fixture(&s, "bash", "collect_many_files.sh", json!([]), json!([]));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "created 10000\n", "{}", r["stderr"]);
    assert!(took < Duration::from_secs(60), "took {took:?}");
    let names = output_names(&r);
    let expected: Vec<String> = (0..100).map(|i| format!("f{i:04}")).collect();
    assert_eq!(names, expected, "the first 100 in sorted order");
    let skipped = skipped(&r);
    assert_eq!(skipped.len(), 100, "files_skipped lists at most 100 entries");
    assert!(
        skipped
            .iter()
            .all(|(n, why)| why == "too_many_files" && !names.contains(n)),
        "{r}"
    );
    assert_eq!(r["files_skipped_total"], 9900, "{}", r["files_skipped_total"]);
    assert_eq!(download_output(&c, &r, "f0042"), b"0042");
    wait_for_stored_count(&s, stored + 100, Duration::from_secs(10));
    assert_eq!(c.list(&session_of(&r)).len(), 100);
}

#[test]
fn two_gib_sparse_file_is_never_read() {
    // The file size limit is raised so that the sparse file can exist at all.
    let s = Server::start_with(&[("SANDCALL_FILE_SIZE_LIMIT_MB", "4096")], "");
    let c = Client::anonymous(&s);
    let stored = stored_count(&s);
    let before = peak_rss_kib(s.pid());
    let (r, took) = run_fixture(&s, "bash", "collect_sparse_file.sh", json!([]), json!([]));
    assert!(took < Duration::from_secs(20), "took {took:?}: {r}");
    assert_eq!(r["status"], "ok", "{r}");
    let out = r["stdout"].as_str().unwrap();
    assert!(
        out.contains("truncate=0") && out.contains("size=2147483648"),
        "the sparse file was not made: {r}"
    );
    assert_eq!(output_names(&r), strings(&["small.txt"]), "{r}");
    assert_eq!(skipped(&r), pairs(&[("big.bin", "too_large")]), "{r}");
    assert_eq!(download_output(&c, &r, "small.txt"), b"small\n");
    wait_for_stored_count(&s, stored + 1, Duration::from_secs(5));
    for path in regular_files(&s.data_dir) {
        let len = std::fs::metadata(&path).map_or(0, |m| m.len());
        assert!(len < 100 << 20, "{} holds {len} bytes", path.display());
    }
    let grew = peak_rss_kib(s.pid()).saturating_sub(before);
    assert!(grew < 256 << 10, "the server's peak memory grew by {grew} KiB");

    // At the default file size limit (256 MiB) the file cannot even be made: truncate
    // dies with SIGXFSZ, leaving at most an empty big.bin, which is an ordinary output.
    drop(s);
    let s = Server::start();
    let (r, took) = run_fixture(&s, "bash", "collect_sparse_file.sh", json!([]), json!([]));
    assert!(took < Duration::from_secs(20), "took {took:?}: {r}");
    for f in r["files"].as_array().unwrap() {
        assert!(
            f["name"] == "small.txt" || (f["name"] == "big.bin" && f["size"] == 0),
            "{r}"
        );
    }
    assert!(output_names(&r).contains(&"small.txt".to_string()), "{r}");
    for (name, why) in skipped(&r) {
        assert_eq!((name.as_str(), why.as_str()), ("big.bin", "too_large"), "{r}");
    }
}

// ---------------------------------------------------------------------------
// Retention
// ---------------------------------------------------------------------------

#[test]
fn files_expire_after_file_ttl() {
    const TTL_S: u64 = 5;
    let s = Server::start_with(
        &[
            ("SANDCALL_FILE_TTL_S", &TTL_S.to_string()),
            ("SANDCALL_FILE_SWEEP_INTERVAL_S", "1"),
        ],
        "",
    );
    let c = Client::anonymous(&s);
    let baseline = stored_count(&s);
    let marker_in = unique(&s, "retained-input");
    let marker_out = unique(&s, "retained-output");
    let t = Instant::now();
    let up = c.upload("notes.txt", "text/plain", marker_in.as_bytes());
    let r = c.exec(json!({
        "code": "import sys\nopen('out.txt', 'w').write(sys.argv[1])\nprint(open('notes.txt').read())",
        "args": [marker_out],
        "files": [up.input("notes.txt")],
    }));
    assert_eq!(r["stdout"], format!("{marker_in}\n"), "{r}");
    let run = session_of(&r);
    let out_id = output(&r, "out.txt")["id"].as_str().unwrap().to_owned();
    // Both are there while young.
    assert_eq!(c.download(&up.session_id, &up.id).body, marker_in.as_bytes());
    assert_eq!(c.download(&run, &out_id).body, marker_out.as_bytes());
    assert_eq!(c.list(&up.session_id).len(), 1);
    assert_eq!(c.list(&run).len(), 1);
    assert_eq!(stored_count(&s), baseline + 2);

    // Then gone, from every route and from the disk.
    let holds_marker = || {
        regular_files(&s.data_dir).iter().any(|p| {
            let bytes = std::fs::read(p).unwrap_or_default();
            contains(&bytes, marker_in.as_bytes()) || contains(&bytes, marker_out.as_bytes())
        })
    };
    let mut first_gone = None;
    loop {
        let gone_in = c.download(&up.session_id, &up.id).status == 404;
        let gone_out = c.download(&run, &out_id).status == 404;
        if (gone_in || gone_out) && first_gone.is_none() {
            first_gone = Some(t.elapsed());
        }
        if gone_in
            && gone_out
            && c.list(&up.session_id).is_empty()
            && c.list(&run).is_empty()
            && stored_count(&s) == baseline
            && !holds_marker()
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(TTL_S + 25),
            "not expired after {:?}: {} stored files (baseline {baseline})",
            t.elapsed(),
            stored_count(&s)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let first_gone = first_gone.unwrap_or_default();
    assert!(
        first_gone >= Duration::from_millis(TTL_S * 1000 - 500),
        "a file expired after {first_gone:?}, before its ttl of {TTL_S} s"
    );
    assert_error(&c.download(&up.session_id, &up.id), 404, "file_not_found");
    assert_error(&c.object(&run, &out_id), 404, "file_not_found");
    let reply = c.post_json(
        "/v1/exec",
        &json!({"code": "print(1)", "files": [up.input("notes.txt")]}),
    );
    assert_error(&reply, 404, "file_not_found");
    s.assert_healthy();
}

#[test]
fn inputs_that_cannot_fit_or_clash_are_refused_before_the_run() {
    let s = Server::start_with(&[("SANDCALL_WORKSPACE_LIMIT_MB", "1")], "");
    let c = Client::anonymous(&s);
    let big = c.upload("big.bin", "application/octet-stream", &vec![7u8; (1 << 20) - 100]);
    let small = c.upload("small.txt", "text/plain", b"tiny");
    // Together they are within a byte count of 1 MiB, but not in tmpfs pages.
    let r = s.post(
        "/v1/exec",
        &json!({"code": "print(1)", "files": [
            {"id": big.id, "storage_session_id": big.session_id, "name": "a.bin"},
            {"id": small.id, "storage_session_id": small.session_id, "name": "b.txt"}]}),
    );
    assert_eq!(r.0, 413, "{}", r.1);
    // One name a folder of the other.
    let r = s.post(
        "/v1/exec",
        &json!({"code": "print(1)", "files": [
            {"id": small.id, "storage_session_id": small.session_id, "name": "a"},
            {"id": small.id, "storage_session_id": small.session_id, "name": "a/b"}]}),
    );
    assert_eq!(r.0, 400, "{}", r.1);
    assert_eq!(r.1["error_type"], "invalid_request");
    s.assert_healthy();
}

#[test]
fn folders_nested_too_deep_are_not_walked() {
    let s = Server::start();
    let r = s.py("import os\nfor i in range(100):\n    os.mkdir('d')\n    os.chdir('d')\nopen('deep.txt', 'w').write('x')\nos.chdir('/mnt/data')\nopen('top.txt', 'w').write('y')");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(output_names(&r), vec!["top.txt".to_string()], "{r}");
    let skipped = r["files_skipped"].as_array().unwrap();
    assert!(skipped.iter().any(|e| e["reason"] == "too_deep"), "{r}");
    s.assert_healthy();
}

/// The file answers match their schemas in docs/openapi.json: every required field is
/// answered, every answered field is documented.
#[test]
fn file_answers_have_the_documented_fields() {
    let doc: Value = serde_json::from_str(include_str!("../../../../docs/openapi.json")).unwrap();
    let schemas = &doc["components"]["schemas"];
    let check = |name: &str, answer: &Value| {
        let schema = &schemas[name];
        for field in schema["required"].as_array().unwrap_or_else(|| panic!("{name}")) {
            let field = field.as_str().unwrap();
            assert!(
                answer.get(field).is_some(),
                "{name}.{field} is documented but missing: {answer}"
            );
        }
        for key in answer.as_object().unwrap_or_else(|| panic!("{name}: {answer}")).keys() {
            assert!(
                schema["properties"].get(key).is_some(),
                "{name}.{key} is answered but not documented"
            );
        }
    };
    let s = Server::start();
    let c = Client::anonymous(&s);
    let reply = c.upload_batch(&[
        field_part("read_only", "true"),
        file_part("a/b.txt", "text/plain", b"b"),
        file_part("../x", "text/plain", b"x"),
    ]);
    let batch = reply.json();
    check("BatchUploadResponse", &batch);
    check("BatchFileResult", &batch["files"][0]);
    check("BatchFileResult", &batch["files"][1]);
    let sid = batch["storage_session_id"].as_str().unwrap();
    let fid = batch["files"][0]["fileId"].as_str().unwrap();
    let failed = c.upload_batch(&[file_part("../x", "text/plain", b"x")]).json();
    check("BatchUploadResponse", &failed);
    check("FileSummary", &c.list_detail(sid, "detail=summary")[0]);
    let full = c.list_detail(sid, "detail=full");
    check("FileFull", &full[0]);
    check("FileObjectMetadata", &full[0]["metadata"]);
    check("FileNormalized", &c.list_detail(sid, "detail=normalized")[0]);
    let up = c.upload("in.txt", "text/plain", b"in");
    let r = c.exec(json!({
        "code": "open('in.txt', 'a').write('!'); open('new.txt', 'w').write('n')",
        "files": [up.input("in.txt"), {"id": fid, "storage_session_id": sid, "name": "a/b.txt", "entity_id": "e"}],
    }));
    for f in r["files"].as_array().unwrap() {
        check("OutputFile", f);
    }
    check("FileOrigin", &output(&r, "in.txt")["modified_from"]);
    check("DeleteFileResponse", &c.delete_file(sid, fid).json());
}
