//! `/mcp`'s POST bodies before rmcp reads them. rmcp holds a request whole (its body, the
//! JSON-RPC message parsed from it, the tool's arguments), so a body larger than the API's
//! JSON limit (`max_body_bytes`) is streamed to `incoming/` first, and only an
//! `upload_file` call may be that large: its `text` or `base64` is decoded from the file
//! on disk into a file of its own (sha256 and size counted on the way, `max_file_bytes`
//! checked as the bytes come), and rmcp gets the message without it, the decoded file
//! riding along in the request's extensions (which no client can set). So an upload costs
//! the server buffers, not its size, whatever the number at once.
//!
//! Must not: store files or answer tool calls (`SandcallMcp::upload` does both).

use crate::error::ApiError;
use crate::files::ops::storage_error;
use crate::AppState;
use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};
use std::cell::Cell;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use struson::reader::{JsonReader, JsonStreamReader, ValueType};
use struson::writer::{JsonStreamWriter, JsonWriter};

/// The largest body rmcp reads itself: the API's JSON limit and the JSON-RPC around it.
pub fn in_memory_limit(state: &AppState) -> usize {
    state.config.max_body_bytes().saturating_add(64 << 10)
}

/// The largest body at all: an upload at `max_file_bytes` as base64 (or as text with
/// every byte escaped as `\u00XX`, six bytes each, is refused by this bound: its
/// decoded size is what `max_file_bytes` counts, its encoding is the caller's choice)
/// and the JSON-RPC around it.
pub fn spool_limit(state: &AppState) -> usize {
    (state.config.files.max_file_bytes as usize / 3 * 4 + 4)
        .max(in_memory_limit(state))
        .saturating_add(64 << 10)
}

/// An `upload_file` call's content, decoded to disk, or why it could not be: for
/// `SandcallMcp::upload`, in the request's extensions.
#[derive(Clone)]
pub struct SpooledUpload(pub Arc<Result<Spooled, ApiError>>);

/// Decoded content in `incoming/`, removed when dropped unless the store took it.
pub struct Spooled {
    pub path: PathBuf,
    pub size: u64,
    pub sha256: String,
}

impl Drop for Spooled {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A spooled body, removed when dropped.
struct SpooledBody(PathBuf);

impl Drop for SpooledBody {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The body as it arrived: in memory when small, else on disk.
enum Received {
    Small(Bytes),
    Spooled(SpooledBody),
}

/// POST /mcp: a small body goes to rmcp as it is; a large one is spooled and, when it
/// is an `upload_file` call, goes to rmcp without its content; any other large body is
/// refused (413).
pub async fn post(state: AppState, req: Request) -> Result<Request, Response> {
    let (mut parts, body) = req.into_parts();
    // A body announced as large goes to disk from its first byte.
    let announced = parts
        .headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    let spooled = match receive(&state, body, announced)
        .await
        .map_err(IntoResponse::into_response)?
    {
        Received::Small(bytes) => return Ok(Request::from_parts(parts, Body::from(bytes))),
        Received::Spooled(spooled) => spooled,
    };
    let incoming = state.files.incoming_dir();
    let max_file = state.config.files.max_file_bytes;
    let max_rest = in_memory_limit(&state);
    let rewritten = tokio::task::spawn_blocking(move || rewrite(&spooled.0, &incoming, max_file, max_rest))
        .await
        .map_err(|e| ApiError::internal(sandcall_api::error_type::INTERNAL, &format!("an MCP upload: {e}")))
        .and_then(|r| r)
        .map_err(IntoResponse::into_response)?;
    let (body, upload) = rewritten;
    parts.extensions.insert(SpooledUpload(Arc::new(upload)));
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Ok(Request::from_parts(parts, Body::from(body)))
}

/// Reads the body: in memory up to `in_memory_limit` (unless `announced` larger), then
/// into a file in `incoming/` up to `spool_limit`.
async fn receive(state: &AppState, body: Body, announced: Option<usize>) -> Result<Received, ApiError> {
    use tokio::io::AsyncWriteExt;
    let small = match announced {
        Some(length) if length > in_memory_limit(state) => 0,
        _ => in_memory_limit(state),
    };
    let max = spool_limit(state);
    let mut body = body;
    let mut head = BytesMut::new();
    let mut file: Option<(tokio::io::BufWriter<tokio::fs::File>, SpooledBody)> = None;
    let mut size = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(body_error)?;
        let Ok(chunk) = frame.into_data() else { continue };
        size += chunk.len();
        if size > max {
            return Err(ApiError::too_large(format!(
                "the body is larger than {max} bytes (an upload_file of max_file_bytes as base64)"
            )));
        }
        if let Some((out, _)) = file.as_mut() {
            out.write_all(&chunk).await.map_err(|e| storage_error(e.into()))?;
        } else if size <= small {
            head.extend_from_slice(&chunk);
        } else {
            let path = state
                .files
                .incoming_dir()
                .join(format!("{}.mcp", sandcall_api::ids::new_id()));
            let guard = SpooledBody(path.clone());
            let mut out = tokio::io::BufWriter::new(
                tokio::fs::File::create(&path)
                    .await
                    .map_err(|e| storage_error(e.into()))?,
            );
            out.write_all(&head).await.map_err(|e| storage_error(e.into()))?;
            out.write_all(&chunk).await.map_err(|e| storage_error(e.into()))?;
            head = BytesMut::new();
            file = Some((out, guard));
        }
    }
    match file {
        None => Ok(Received::Small(head.freeze())),
        Some((mut out, guard)) => {
            out.flush().await.map_err(|e| storage_error(e.into()))?;
            Ok(Received::Spooled(guard))
        }
    }
}

fn body_error(e: axum::Error) -> ApiError {
    if crate::extract::body_timed_out(&e) {
        crate::extract::request_timeout()
    } else {
        ApiError::bad_request("the request body could not be read")
    }
}

fn not_json(e: impl std::fmt::Display) -> ApiError {
    tracing::debug!(error = %e, "a large /mcp body is not the JSON expected");
    ApiError::bad_request("the body is not a JSON-RPC message")
}

/// Only an upload may be large.
fn not_an_upload(max_rest: usize) -> ApiError {
    ApiError::too_large(format!(
        "only an upload_file call may send /mcp more than {max_rest} bytes; send a smaller message"
    ))
}

/// The spooled message without its upload's content, and that content decoded to a
/// file; an error when it is not a call of `upload_file`, or what is left is over
/// `max_rest`.
fn rewrite(
    body: &Path,
    incoming: &Path,
    max_file: u64,
    max_rest: usize,
) -> Result<(Vec<u8>, Result<Spooled, ApiError>), ApiError> {
    let open = || -> Result<_, ApiError> {
        let file = std::fs::File::open(body).map_err(|e| storage_error(e.into()))?;
        Ok(JsonStreamReader::new(BufReader::with_capacity(64 << 10, file)))
    };
    // First pass: the method and the tool, wherever they stand in the message.
    if scan(&mut open()?).map_err(not_json)? != (Some("tools/call".into()), Some("upload_file".into())) {
        return Err(not_an_upload(max_rest));
    }
    // Second pass: everything copied but params.arguments.text and .base64.
    let mut reader = open()?;
    let over = Rc::new(Cell::new(false));
    let mut writer = JsonStreamWriter::new(Capped {
        out: Vec::new(),
        max: max_rest,
        over: over.clone(),
    });
    let mut upload: Option<Result<Spooled, ApiError>> = None;
    let mut take_content = |name: &str, reader: &mut JsonStreamReader<_>| -> JsonResult<bool> {
        if !matches!(name, "text" | "base64") || reader.peek()? != ValueType::String {
            return Ok(false);
        }
        let decoded = decode(reader, name == "base64", incoming, max_file)?;
        upload = Some(match upload.take() {
            None => decoded,
            Some(_) => Err(ApiError::bad_request("give exactly one of `text` or `base64`")),
        });
        Ok(true)
    };
    let copied = copy_object(&mut reader, &mut writer, &["params", "arguments"], &mut take_content)
        .and_then(|()| Ok(reader.consume_trailing_whitespace()?));
    if let Err(e) = copied {
        if over.get() {
            return Err(not_an_upload(max_rest));
        }
        return Err(not_json(e));
    }
    let out = writer.finish_document().map_err(not_json)?;
    let upload = upload.unwrap_or_else(|| Err(ApiError::bad_request("give exactly one of `text` or `base64`")));
    Ok((out.out, upload))
}

type JsonResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Copies the object at `reader` to `writer`, going down the members `path` names (where
/// each is an object). Each member of the object at the path's end is offered to `take`
/// first: it returns true for one it consumed itself, which is then not copied.
fn copy_object<R: Read, W: Write>(
    reader: &mut JsonStreamReader<R>,
    writer: &mut JsonStreamWriter<W>,
    path: &[&str],
    take: &mut dyn FnMut(&str, &mut JsonStreamReader<R>) -> JsonResult<bool>,
) -> JsonResult<()> {
    reader.begin_object()?;
    writer.begin_object()?;
    while reader.has_next()? {
        let name = reader.next_name_owned()?;
        match path.split_first() {
            None if take(&name, reader)? => continue,
            Some((next, rest)) if *next == name && reader.peek()? == ValueType::Object => {
                writer.name(&name)?;
                copy_object(reader, writer, rest, take)?;
                continue;
            }
            _ => {}
        }
        writer.name(&name)?;
        reader.transfer_to(writer)?;
    }
    reader.end_object()?;
    writer.end_object()?;
    Ok(())
}

/// The top level's `method` and `params.name`, each when a short string.
fn scan<R: Read>(reader: &mut JsonStreamReader<R>) -> JsonResult<(Option<String>, Option<String>)> {
    let (mut method, mut tool) = (None, None);
    reader.begin_object()?;
    while reader.has_next()? {
        let name = reader.next_name_owned()?;
        match name.as_str() {
            "method" if reader.peek()? == ValueType::String => method = short_string(reader)?,
            "params" if reader.peek()? == ValueType::Object => {
                reader.begin_object()?;
                while reader.has_next()? {
                    if reader.next_name()? == "name" && reader.peek()? == ValueType::String {
                        tool = short_string(reader)?;
                    } else {
                        reader.skip_value()?;
                    }
                }
                reader.end_object()?;
            }
            _ => reader.skip_value()?,
        }
    }
    reader.end_object()?;
    Ok((method, tool))
}

/// A string value of at most 64 bytes; a longer one (read through, not held) is none.
fn short_string<R: Read>(reader: &mut JsonStreamReader<R>) -> JsonResult<Option<String>> {
    let mut value = Vec::new();
    let mut string = reader.next_string_reader()?;
    (&mut string).take(65).read_to_end(&mut value)?;
    std::io::copy(&mut string, &mut std::io::sink())?;
    drop(string);
    Ok(String::from_utf8(value).ok().filter(|v| v.len() <= 64))
}

/// Decodes the string value at `reader` (base64, or text as UTF-8) into a new file of
/// `incoming/`. A refusal of the content (too large, not base64) is the inner error, the
/// rest of the string read through; an error of the JSON or the disk is the outer.
fn decode<R: Read>(
    reader: &mut JsonStreamReader<R>,
    base64: bool,
    incoming: &Path,
    max_file: u64,
) -> JsonResult<Result<Spooled, ApiError>> {
    let path = incoming.join(sandcall_api::ids::new_id());
    let file = std::fs::File::create(&path)?;
    let mut spooled = Spooled {
        path,
        size: 0,
        sha256: String::new(),
    };
    let mut sink = Counted {
        out: BufWriter::with_capacity(64 << 10, file),
        hasher: Sha256::new(),
        size: 0,
        max: max_file,
    };
    let mut string = reader.next_string_reader()?;
    let copied = if base64 {
        let engine = base64::engine::general_purpose::STANDARD;
        let mut decoder = base64::read::DecoderReader::new(NoWhitespace(&mut string), &engine);
        std::io::copy(&mut decoder, &mut sink)
    } else {
        std::io::copy(&mut string, &mut sink)
    };
    let refused = match copied {
        Ok(_) => None,
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => Some(ApiError::too_large(format!(
            "the file is larger than {max_file} bytes (max_file_bytes)"
        ))),
        Err(e) if base64 && e.get_ref().is_some_and(|inner| inner.is::<base64::DecodeError>()) => {
            Some(ApiError::bad_request(format!("`base64` is not valid base64: {e}")))
        }
        Err(e) => return Err(e.into()),
    };
    // The rest of a refused value is read through, so that the message can be copied on.
    std::io::copy(&mut string, &mut std::io::sink())?;
    drop(string);
    if let Some(e) = refused {
        return Ok(Err(e));
    }
    sink.out.flush()?;
    spooled.size = sink.size;
    spooled.sha256 = sink.hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(Ok(spooled))
}

/// The decoded bytes' way to disk: hashed, counted, refused past `max`.
struct Counted {
    out: BufWriter<std::fs::File>,
    hasher: Sha256,
    size: u64,
    max: u64,
}

impl Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.size += buf.len() as u64;
        if self.size > self.max {
            return Err(std::io::Error::from(std::io::ErrorKind::FileTooLarge));
        }
        self.hasher.update(buf);
        self.out.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Base64 as JSON carries it may be wrapped in lines; the decoder wants none.
struct NoWhitespace<R>(R);

impl<R: Read> Read for NoWhitespace<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let n = self.0.read(buf)?;
            if n == 0 {
                return Ok(0);
            }
            let mut kept = 0;
            for i in 0..n {
                if !buf[i].is_ascii_whitespace() {
                    buf[kept] = buf[i];
                    kept += 1;
                }
            }
            if kept > 0 {
                return Ok(kept);
            }
        }
    }
}

/// The rewritten message, refused past `max` bytes (and `over` set).
struct Capped {
    out: Vec<u8>,
    max: usize,
    over: Rc<Cell<bool>>,
}

impl Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > self.max {
            self.over.set(true);
            return Err(std::io::Error::other(
                "the message without its upload is over the limit",
            ));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spool(dir: &Path, body: &str) -> PathBuf {
        let path = dir.join("body");
        std::fs::write(&path, body).unwrap();
        path
    }

    fn temp_dir(name: &str) -> PathBuf {
        // Under the workspace's target directory (tests' sandboxes mount their own /tmp).
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/spool-tests")
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn an_upload_loses_its_content_to_a_file_and_keeps_the_rest() {
        let dir = temp_dir("upload");
        // `params` before `method`, and the arguments before the tool's name.
        let body = r#"{"params": {"arguments": {"base64": "aGVs\nbG8=", "name": "a.txt"}, "name": "upload_file"}, "jsonrpc": "2.0", "id": 7, "method": "tools/call"}"#;
        let (rest, upload) = rewrite(&spool(&dir, body), &dir, 100, 1 << 20).unwrap();
        let rest: serde_json::Value = serde_json::from_slice(&rest).unwrap();
        assert_eq!(
            rest,
            serde_json::json!({"params": {"arguments": {"name": "a.txt"}, "name": "upload_file"}, "jsonrpc": "2.0", "id": 7, "method": "tools/call"})
        );
        let upload = upload.unwrap();
        assert_eq!(std::fs::read(&upload.path).unwrap(), b"hello");
        assert_eq!(upload.size, 5);
        assert_eq!(upload.sha256, format!("{:x}", Sha256::digest(b"hello")));
        let text = r#"{"method": "tools/call", "params": {"name": "upload_file", "arguments": {"name": "b", "text": "caf\u00e9"}}}"#;
        let (_, upload) = rewrite(&spool(&dir, text), &dir, 100, 1 << 20).unwrap();
        assert_eq!(std::fs::read(&upload.unwrap().path).unwrap(), "café".as_bytes());
    }

    #[test]
    fn content_refusals_are_the_tools_and_other_large_messages_are_refused() {
        let dir = temp_dir("refusals");
        let call = |arguments: &str| {
            format!(r#"{{"method": "tools/call", "params": {{"name": "upload_file", "arguments": {arguments}}}}}"#)
        };
        let refused = |body: String| rewrite(&spool(&dir, &body), &dir, 4, 1 << 20).unwrap().1.err().unwrap();
        assert_eq!(refused(call(r#"{"name": "a", "text": "12345"}"#)).status, 413);
        assert!(refused(call(r#"{"name": "a", "base64": "!!!!"}"#))
            .message
            .contains("base64"));
        assert!(refused(call(r#"{"name": "a", "text": "1", "base64": "MQ=="}"#))
            .message
            .contains("exactly one"));
        assert!(refused(call(r#"{"name": "a"}"#)).message.contains("exactly one"));
        // Another tool, or what is left of an upload over the limit: refused whole.
        let other = r#"{"method": "tools/call", "params": {"name": "execute_code", "arguments": {"text": "x"}}}"#;
        assert_eq!(
            rewrite(&spool(&dir, other), &dir, 4, 1 << 20).err().unwrap().status,
            413
        );
        let padded = call(&format!(
            r#"{{"name": "a", "text": "1", "pad": "{}"}}"#,
            "x".repeat(200)
        ));
        assert_eq!(rewrite(&spool(&dir, &padded), &dir, 4, 100).err().unwrap().status, 413);
        assert_eq!(rewrite(&spool(&dir, "[1, 2"), &dir, 4, 100).err().unwrap().status, 400);
        // Refused content leaves no file behind (only the spooled body).
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    }
}
