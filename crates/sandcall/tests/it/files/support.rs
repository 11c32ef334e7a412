//! Helpers about runs and their outputs, shared by the file tests: output names and
//! entries, skipped files, the store's files on disk, host secrets that must never leak,
//! and hostile collection fixtures.

use super::client::{assert_nanoid, Client};
use crate::common::{hostile, Server};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Program source from its lines.
pub(super) fn src(lines: &[&str]) -> String {
    let mut s = lines.join("\n");
    s.push('\n');
    s
}

pub(super) fn session_of(r: &Value) -> String {
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
pub(super) fn skipped(r: &Value) -> Vec<(String, String)> {
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
pub(super) fn skipped_for(r: &Value, reason: &str) -> Vec<String> {
    let mut names: Vec<String> = skipped(r)
        .into_iter()
        .filter(|(_, why)| why == reason)
        .map(|(n, _)| n)
        .collect();
    names.sort();
    names
}

pub(super) fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// (name, reason) pairs, to compare with `skipped`.
pub(super) fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items.iter().map(|(n, r)| (n.to_string(), r.to_string())).collect()
}

/// Every output entry has the documented shape and lives under the run's session.
pub(super) fn assert_outputs_shape(r: &Value) {
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
pub(super) fn wait_for_stored_count(s: &Server, expected: usize, limit: Duration) {
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

pub(super) fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Host secrets that must never show up in anything the server stores or returns.
pub(super) fn host_secrets(s: &Server) -> Vec<(String, Vec<u8>)> {
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
pub(super) fn assert_no_secrets(s: &Server, secrets: &[(String, Vec<u8>)], bodies: &[Vec<u8>]) {
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
pub(super) fn peak_rss_kib(pid: u32) -> u64 {
    crate::common::proc_status_kib(pid, "VmHWM").unwrap_or_else(|| panic!("no VmHWM in /proc/{pid}/status"))
}

/// Runs a hostile collection fixture and returns the response and how long it took.
pub(super) fn run_fixture(s: &Server, language: &str, fixture: &str, args: Value, files: Value) -> (Value, Duration) {
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

pub(super) fn unique(s: &Server, what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{what}-{}-{}-{nanos}", std::process::id(), s.port)
}

/// A batch answer's `files` as (status, filename, has an error) triples.
pub(super) fn batch_outcomes(v: &Value) -> Vec<(String, String, bool)> {
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
