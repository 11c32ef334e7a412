//! The helper's end of the tool channel: a unix socket in the sandbox's read-only code
//! directory (`/run/sandcall/tools.sock`). The helper is only a relay: it parses the
//! program's messages, forwards each call to the server, which checks it, and passes
//! the server's replies back on the connection the call came from.

use crate::io::read_some;
use crate::protocol::{Event, ToolChannel, ToolReply};
use serde_json::Value;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

/// One connection from the program (the Python runner keeps one; each Bash tool command
/// opens its own).
struct Conn {
    stream: OwnedFd,
    buf: Vec<u8>,
    /// Replies not yet taken by the program (a large result does not fit the socket
    /// buffer at once); written as the socket becomes writable.
    out: Vec<u8>,
}

/// Replies a connection may have waiting before the program counts as not reading.
const MAX_QUEUED_REPLY_BYTES: usize = 256 << 20;
/// While this much waits to be written to a connection, nothing more is read from it:
/// a program that sends without reading only slows itself down.
pub(crate) const READ_PAUSE_BYTES: usize = 1 << 20;
/// Calls forwarded and not answered yet, across all connections; more are refused here.
const MAX_PENDING_CALLS: usize = 1024;
/// The longest call id a program may use (its id comes back in the reply).
const MAX_ID_BYTES: usize = 256;

pub(crate) struct ToolHub {
    listener: UnixListener,
    conns: Vec<Option<Conn>>,
    /// Calls forwarded and not yet answered: key -> (connection slot, the program's id).
    calls: HashMap<u64, (usize, Value)>,
    next_key: u64,
    settings: ToolChannel,
    /// A call arrived since the last `Blocked`.
    pub(crate) unannounced: bool,
    /// The program said it now waits for its calls.
    pub(crate) flush: bool,
}

/// What a program may send, one JSON object per line.
#[derive(serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum ProgramMessage {
    Call {
        id: Value,
        name: String,
        arguments: Option<Value>,
        argv: Option<Vec<String>>,
    },
    Flush,
}

impl ToolHub {
    pub(crate) fn bind(path: &Path, settings: ToolChannel) -> io::Result<Self> {
        let listener = UnixListener::bind(path)?;
        // The program's uid must be able to connect; nothing else can reach the file.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        listener.set_nonblocking(true)?;
        Ok(ToolHub {
            listener,
            conns: Vec::new(),
            calls: HashMap::new(),
            next_key: 1,
            settings,
            unannounced: false,
            flush: false,
        })
    }

    pub(crate) fn listener_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// The open connections, with their slot numbers, for the poll set.
    pub(crate) fn conn_fds(&self) -> Vec<(usize, BorrowedFd<'_>, usize)> {
        self.conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|c| (i, c.stream.as_fd(), c.out.len())))
            .collect()
    }

    pub(crate) fn has_pending(&self) -> bool {
        !self.calls.is_empty()
    }

    pub(crate) fn accept(&mut self) {
        while let Ok((stream, _)) = self.listener.accept() {
            let open = self.conns.iter().filter(|c| c.is_some()).count();
            if open >= self.settings.max_connections || stream.set_nonblocking(true).is_err() {
                continue; // dropped: the program sees the connection closed
            }
            let conn = Conn {
                stream: OwnedFd::from(stream),
                buf: Vec::new(),
                out: Vec::new(),
            };
            match self.conns.iter().position(Option::is_none) {
                Some(i) => self.conns[i] = Some(conn),
                None => self.conns.push(Some(conn)),
            }
        }
    }

    /// Reads what connection `slot` sent; returns the events for the server.
    pub(crate) fn read(&mut self, slot: usize) -> Vec<Event> {
        let mut events = Vec::new();
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return events;
        };
        let mut chunk = [0u8; 64 * 1024];
        let closed = match read_some(&conn.stream, &mut chunk) {
            Ok(0) => true,
            Ok(n) => {
                conn.buf.extend_from_slice(&chunk[..n]);
                false
            }
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        };
        let mut lines = Vec::new();
        while let Some(pos) = conn.buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = conn.buf.drain(..=pos).collect();
            line.pop();
            lines.push(line);
        }
        // A message can only be that long by mistake or malice: hang up.
        let too_long = conn.buf.len() as u64 > self.settings.max_message_bytes;
        for line in lines {
            match serde_json::from_slice::<ProgramMessage>(&line) {
                Ok(ProgramMessage::Call { id, .. }) if id.to_string().len() > MAX_ID_BYTES => {
                    let reply =
                        serde_json::json!({"id": null, "ok": false, "kind": "refused", "error": "call id too long"});
                    self.send(slot, &reply);
                }
                Ok(ProgramMessage::Call { id, .. }) if self.calls.len() >= MAX_PENDING_CALLS => {
                    let reply = serde_json::json!({"id": id, "ok": false, "kind": "refused",
                        "error": format!("more than {MAX_PENDING_CALLS} tool calls are waiting for an answer")});
                    self.send(slot, &reply);
                }
                Ok(ProgramMessage::Call {
                    id,
                    name,
                    arguments,
                    argv,
                }) => {
                    let key = self.next_key;
                    self.next_key += 1;
                    self.calls.insert(key, (slot, id));
                    self.unannounced = true;
                    events.push(Event::ToolCall {
                        key,
                        name,
                        arguments,
                        argv,
                    });
                }
                Ok(ProgramMessage::Flush) => self.flush = true,
                Err(e) => {
                    let reply = serde_json::json!({"id": null, "ok": false, "kind": "refused", "error": format!("malformed tool message: {e}")});
                    self.send(slot, &reply);
                }
            }
        }
        if closed || too_long {
            self.close(slot);
        }
        events
    }

    /// Passes the server's reply to the connection the call came from.
    pub(crate) fn reply(&mut self, key: u64, reply: &ToolReply) {
        let Some((slot, id)) = self.calls.remove(&key) else {
            return;
        };
        let mut message = serde_json::to_value(reply).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut message {
            map.insert("id".into(), id);
        }
        self.send(slot, &message);
    }

    fn send(&mut self, slot: usize, message: &Value) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        let mut line = serde_json::to_vec(message).unwrap_or_default();
        line.push(b'\n');
        if conn.out.len() + line.len() > MAX_QUEUED_REPLY_BYTES {
            return self.close(slot);
        }
        conn.out.extend_from_slice(&line);
        self.flush_out(slot);
    }

    /// Writes what the socket takes now of the replies queued for `slot`.
    pub(crate) fn flush_out(&mut self, slot: usize) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        while !conn.out.is_empty() {
            match nix::unistd::write(&conn.stream, &conn.out) {
                Ok(n) => {
                    conn.out.drain(..n);
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => return,
                Err(_) => return self.close(slot),
            }
        }
    }

    fn close(&mut self, slot: usize) {
        if let Some(c) = self.conns.get_mut(slot) {
            *c = None;
        }
        self.calls.retain(|_, (s, _)| *s != slot);
    }
}

/// Connects to the tool socket from inside the sandbox (the Bash tool command's side).
pub fn connect(path: &Path) -> io::Result<UnixStream> {
    UnixStream::connect(path)
}

/// `sandcall tool-call NAME ARGS...`, the Bash tool command inside the sandbox: sends
/// the call, waits for the answer, prints the result (a string as it is, anything else
/// as compact JSON) and exits 0; a tool error goes to stderr with exit 1, a refused
/// call with exit 2, a call that timed out with exit 124.
pub fn client_main(name: &str, argv: &[String]) -> i32 {
    use std::io::{BufRead, Write};
    let fail = |code: i32, message: &str| {
        eprintln!("{name}: {message}");
        code
    };
    let Ok(mut stream) = connect(Path::new("/run/sandcall/tools.sock")) else {
        return fail(2, "tool calls are not available in this run");
    };
    let call = serde_json::json!({"op": "call", "id": 1, "name": name, "argv": argv});
    let mut line = call.to_string();
    line.push('\n');
    if stream.write_all(line.as_bytes()).is_err() {
        return fail(2, "the connection to sandcall closed");
    }
    let mut reply = String::new();
    if std::io::BufReader::new(&stream).read_line(&mut reply).unwrap_or(0) == 0 {
        return fail(2, "the connection to sandcall closed");
    }
    let Ok(reply) = serde_json::from_str::<ToolReply>(&reply) else {
        return fail(2, "unreadable answer from sandcall");
    };
    if reply.ok {
        let out = match reply.result.unwrap_or(Value::Null) {
            Value::String(s) => s,
            other => other.to_string(),
        };
        println!("{out}");
        return 0;
    }
    let message = reply.error.unwrap_or_default();
    match reply.kind.as_deref() {
        Some("tool_error") => {
            eprintln!("{message}");
            1
        }
        Some("timeout") => fail(124, &message),
        _ => fail(2, &message),
    }
}
