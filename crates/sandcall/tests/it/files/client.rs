//! HTTP helpers for every test module: a client of one server, with or without
//! credentials; multipart bodies built by hand; answers as status, headers and raw bytes;
//! the error answer's shape.

use crate::common::Server;
use serde_json::{json, Value};
use std::io::Read;
use std::time::Duration;

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
pub(super) fn part_head(part: &Part) -> Vec<u8> {
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

pub(super) fn multipart_tail() -> Vec<u8> {
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

pub(super) fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build()
}

/// Turns ureq's answer (4xx/5xx are errors there) into the response itself.
pub(super) fn into_response(method: &str, path: &str, result: Result<ureq::Response, ureq::Error>) -> ureq::Response {
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
