//! The helper's end of the tool channel: a unix socket in the sandbox's read-only code
//! directory (`/run/sandcall/tools.sock`). The helper is only a relay: it parses the
//! program's messages, forwards each call to the server, which checks it, and passes
//! the server's replies back on the connection the call came from.
//!
//! The helper runs outside the run's cgroup, so what a program can make it hold or do
//! is bounded here: unfinished lines share one input budget, queued replies one bound,
//! and every call costs a token from a bucket that refills slowly (see `REFUSAL_BURST`).
//! A program that goes over waits (its connections are not read) or loses the
//! connection; the helper and the server never pay for it.

use crate::io::read_some;
use crate::protocol::{ToolChannel, ToolReply};
use nix::poll::PollFlags;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

/// One connection from the program (the Python runner keeps one; each Bash tool command
/// opens its own).
struct Conn {
    stream: OwnedFd,
    /// The unfinished line (and, while the refusal bucket is empty, complete lines not
    /// handled yet).
    buf: Vec<u8>,
    /// No newline in `buf[..scanned]`: each byte is looked at once.
    scanned: usize,
    /// Holds `max_message_bytes` of the input budget: its line is longer than
    /// `SMALL_LINE_BYTES` and may grow to the message cap.
    reserved: bool,
    /// `buf` holds a complete line that waits for a token.
    waiting: bool,
    /// The program closed its end; what it sent is still handled.
    eof: bool,
    /// Replies not yet taken by the program (a large result does not fit the socket
    /// buffer at once); written as the socket becomes writable.
    out: Vec<u8>,
}

/// While this much waits to be written to a connection, nothing more is read from it:
/// a program that sends without reading only slows itself down.
const READ_PAUSE_BYTES: usize = 1 << 20;
/// Calls forwarded and not answered yet, across all connections; more are refused here.
const MAX_PENDING_CALLS: usize = 1024;
/// The longest call id a program may use (its id comes back in the reply).
const MAX_ID_BYTES: usize = 256;
/// The longest tool name, in characters: the limit on declared names, so a longer one
/// names no tool. Refused here, so that the server never holds (or logs, or lists in
/// the audit trail) a name of megabytes.
pub const MAX_NAME_CHARS: usize = 128;
/// What a connection's unfinished line may hold without a share of the input budget:
/// every call of the Python runner's and Bash's small calls fit, so only long calls
/// ever wait for a share.
pub(crate) const SMALL_LINE_BYTES: usize = 64 << 10;
/// The refusal bucket: tokens beyond the run's `max_calls`, and how many come back per
/// second. Every call and every line the helper refuses costs one; accepted calls are
/// at most `max_calls`, so only refused ones can empty it. While it is empty, no
/// connection is read: a program that spams bad calls gets about 32 refusals a second
/// and slows only itself, and the server's work on its refusals is bounded the same way.
pub(crate) const REFUSAL_BURST: u64 = 64;
pub(crate) const REFILL_PER_SECOND: f64 = 32.0;

/// Tokens for the program's lines (see `REFUSAL_BURST`).
struct Bucket {
    tokens: f64,
    capacity: f64,
    last: Instant,
}

impl Bucket {
    fn new(capacity: u64, now: Instant) -> Self {
        Bucket {
            tokens: capacity as f64,
            capacity: capacity as f64,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * REFILL_PER_SECOND).min(self.capacity);
        self.last = now;
    }

    fn ready(&self) -> bool {
        self.tokens >= 1.0
    }

    fn take(&mut self) {
        self.tokens -= 1.0;
    }

    /// When the next token comes, while there is none.
    fn next_at(&self) -> Option<Instant> {
        (!self.ready()).then(|| self.last + Duration::from_secs_f64((1.0 - self.tokens) / REFILL_PER_SECOND))
    }
}

pub(crate) struct ToolHub {
    listener: UnixListener,
    conns: Vec<Option<Conn>>,
    /// Calls forwarded and not yet answered: key -> (connection slot, the program's id).
    calls: HashMap<u64, (usize, Box<RawValue>)>,
    next_key: u64,
    settings: ToolChannel,
    /// Bytes of the input budget held by connections with a long line.
    reserved_bytes: u64,
    /// Bytes of replies queued on all connections together.
    queued_bytes: u64,
    bucket: Bucket,
    /// A call came since the last flush: the next flush is the program's due one, and
    /// costs no token (the Python runner sends one after each plain call).
    called_since_flush: bool,
    /// A call arrived since the last `Blocked`.
    pub(crate) unannounced: bool,
    /// The program said it now waits for its calls.
    pub(crate) flush: bool,
}

/// What a program may send, one JSON object per line: `{"op":"call","id","name",
/// "arguments"|"argv"}` or `{"op":"flush"}`. The arguments are not parsed here, only
/// checked to be JSON and passed on as they came: a parsed value can take many times
/// the bytes of its text (`[0,0,...]`), and the helper's memory is not the run's.
#[derive(Deserialize)]
struct ProgramMessage<'a> {
    #[serde(borrow)]
    op: Cow<'a, str>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default)]
    argv: Option<&'a RawValue>,
}

/// `Event::ToolCall` as it goes on the wire, with the arguments as the program sent them.
#[derive(Serialize)]
struct ToolCallEvent<'a> {
    event: &'static str,
    key: u64,
    name: &'a str,
    arguments: Option<&'a RawValue>,
    argv: Option<&'a RawValue>,
}

/// `Command::Reply` as it comes from the server, with the reply kept as its text.
#[derive(Deserialize)]
struct ReplyCommand<'a> {
    #[serde(borrow)]
    command: Cow<'a, str>,
    key: u64,
    #[serde(borrow)]
    reply: &'a RawValue,
}

/// A JSON array of strings, checked without building it.
struct StringArray;

impl<'de> Deserialize<'de> for StringArray {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Str;
        impl<'de> Deserialize<'de> for Str {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = Str;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("a string")
                    }
                    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Str, E> {
                        Ok(Str)
                    }
                }
                d.deserialize_str(V)
            }
        }
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = StringArray;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array of strings")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<StringArray, A::Error> {
                while seq.next_element::<Str>()?.is_some() {}
                Ok(StringArray)
            }
        }
        d.deserialize_seq(V)
    }
}

/// A refusal from the helper itself, for the program.
fn refusal(id: Option<&RawValue>, message: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct Refusal<'a> {
        id: Option<&'a RawValue>,
        ok: bool,
        kind: &'static str,
        error: &'a str,
    }
    let refusal = Refusal {
        id,
        ok: false,
        kind: "refused",
        error: message,
    };
    serde_json::to_vec(&refusal).unwrap_or_default()
}

/// The server's reply (a JSON object) with the program's id put in front.
fn with_id(id: &RawValue, reply: &RawValue) -> Option<Vec<u8>> {
    let rest = reply.get().trim_start().strip_prefix('{')?.trim_start();
    let mut line = Vec::with_capacity(reply.get().len() + id.get().len() + 8);
    line.extend_from_slice(b"{\"id\":");
    line.extend_from_slice(id.get().as_bytes());
    if !rest.starts_with('}') {
        line.push(b',');
    }
    line.extend_from_slice(rest.as_bytes());
    Some(line)
}

/// What to do with one line of the program's.
enum Handled {
    /// Forward this event to the server.
    Event(Vec<u8>),
    /// Nothing for the server (answered here, or a flush).
    Done,
}

impl ToolHub {
    pub(crate) fn bind(path: &Path, settings: ToolChannel) -> io::Result<Self> {
        let listener = UnixListener::bind(path)?;
        // The program's uid must be able to connect; nothing else can reach the file.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        listener.set_nonblocking(true)?;
        let bucket = Bucket::new(settings.max_calls.saturating_add(REFUSAL_BURST), Instant::now());
        Ok(ToolHub {
            listener,
            conns: Vec::new(),
            calls: HashMap::new(),
            next_key: 1,
            settings,
            reserved_bytes: 0,
            queued_bytes: 0,
            bucket,
            called_since_flush: false,
            unannounced: false,
            flush: false,
        })
    }

    pub(crate) fn listener_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// Before each poll: tokens that came back, and shares of the input budget for long
    /// lines that wait for one. Returns when to look again for the next token, if the
    /// bucket is empty (the connections are not polled for reading meanwhile).
    pub(crate) fn prepare_poll(&mut self, now: Instant) -> Option<Instant> {
        self.bucket.refill(now);
        for slot in 0..self.conns.len() {
            self.reserve(slot);
        }
        self.bucket.next_at()
    }

    /// The open connections with what to poll them for. A connection that may neither
    /// be read nor written is left out: its hang-up would wake every poll.
    pub(crate) fn conn_fds(&self) -> Vec<(usize, BorrowedFd<'_>, PollFlags)> {
        self.conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let c = c.as_ref()?;
                let mut flags = PollFlags::empty();
                if self.may_read(c) {
                    flags |= PollFlags::POLLIN;
                }
                if !c.out.is_empty() {
                    flags |= PollFlags::POLLOUT;
                }
                (!flags.is_empty()).then(|| (i, c.stream.as_fd(), flags))
            })
            .collect()
    }

    /// Whether to read more from `c`: it has room for its line, no line waiting for a
    /// token, not much unread reply, and the bucket has a token.
    fn may_read(&self, c: &Conn) -> bool {
        !c.eof
            && !c.waiting
            && self.bucket.ready()
            && c.out.len() < READ_PAUSE_BYTES
            && (c.reserved || c.buf.len() < SMALL_LINE_BYTES)
    }

    /// Gives connection `slot` a share of the input budget if its line outgrew the small
    /// allowance and a share is free; gives it back once the line is short again.
    fn reserve(&mut self, slot: usize) {
        let share = self.settings.max_message_bytes;
        let Some(c) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        let long = c.buf.len() >= SMALL_LINE_BYTES;
        if long && !c.reserved && self.reserved_bytes + share <= self.settings.max_input_bytes.max(share) {
            c.reserved = true;
            self.reserved_bytes += share;
            // All of it at once: growing by doubling would hold up to twice the line.
            c.buf.reserve_exact((share as usize + 1).saturating_sub(c.buf.len()));
        } else if !long && c.reserved {
            c.reserved = false;
            self.reserved_bytes -= share;
            c.buf.shrink_to(SMALL_LINE_BYTES);
        }
    }

    /// Some connection holds part of a message (or lines not handled yet).
    pub(crate) fn receiving(&self) -> bool {
        self.conns.iter().flatten().any(|c| !c.buf.is_empty())
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
                buf: Vec::with_capacity(SMALL_LINE_BYTES),
                scanned: 0,
                reserved: false,
                waiting: false,
                eof: false,
                out: Vec::new(),
            };
            match self.conns.iter().position(Option::is_none) {
                Some(i) => self.conns[i] = Some(conn),
                None => self.conns.push(Some(conn)),
            }
        }
    }

    /// Reads what connection `slot` sent; returns the events for the server.
    pub(crate) fn read(&mut self, slot: usize) -> Vec<Vec<u8>> {
        self.bucket.refill(Instant::now());
        let limit = self.settings.max_message_bytes as usize + 1;
        let Some(conn) = self.conns.get(slot).and_then(Option::as_ref) else {
            return Vec::new();
        };
        if self.may_read(conn) {
            let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
                return Vec::new();
            };
            // Never past what the line may hold: the small allowance, or with a share
            // one byte over the message cap (which then closes the connection).
            let room = if conn.reserved { limit } else { SMALL_LINE_BYTES };
            let mut chunk = [0u8; 64 * 1024];
            let want = room.saturating_sub(conn.buf.len()).min(chunk.len());
            if want > 0 {
                match read_some(&conn.stream, &mut chunk[..want]) {
                    Ok(0) => conn.eof = true,
                    Ok(n) => conn.buf.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => conn.eof = true,
                }
            }
        }
        let events = self.handle_lines(slot);
        if let Some(conn) = self.conns.get(slot).and_then(Option::as_ref) {
            // A message can only be that long by mistake or malice: hang up.
            let too_long = conn.buf.len() >= limit;
            if too_long || (conn.eof && !conn.waiting) {
                self.close(slot);
            } else {
                self.reserve(slot);
            }
        }
        events
    }

    /// Handles the lines that waited for tokens, now that there are some.
    pub(crate) fn pump(&mut self) -> Vec<Vec<u8>> {
        let mut events = Vec::new();
        if !self.conns.iter().flatten().any(|c| c.waiting) {
            return events;
        }
        self.bucket.refill(Instant::now());
        for slot in 0..self.conns.len() {
            if !self.bucket.ready() {
                break;
            }
            if self.conns[slot].as_ref().is_some_and(|c| c.waiting) {
                events.extend(self.read(slot));
            }
        }
        events
    }

    /// Handles the complete lines buffered on `slot`, as long as there are tokens.
    fn handle_lines(&mut self, slot: usize) -> Vec<Vec<u8>> {
        let mut events = Vec::new();
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return events;
        };
        let mut buf = std::mem::take(&mut conn.buf);
        let mut scanned = conn.scanned;
        conn.waiting = false;
        let mut start = 0;
        let mut waiting = false;
        while let Some(pos) = buf[scanned..].iter().position(|&b| b == b'\n').map(|p| scanned + p) {
            if !self.bucket.ready() {
                waiting = true;
                break;
            }
            match self.handle_line(slot, &buf[start..pos]) {
                Handled::Event(event) => events.push(event),
                Handled::Done => {}
            }
            start = pos + 1;
            scanned = start;
            if self.conns.get(slot).is_none_or(Option::is_none) {
                return events; // closed while answering (its replies overflowed)
            }
        }
        if !waiting {
            scanned = buf.len();
        }
        buf.drain(..start);
        if let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) {
            conn.buf = buf;
            conn.scanned = scanned - start;
            conn.waiting = waiting;
        }
        events
    }

    /// One line of the program's. The caller made sure a token is there; this takes it
    /// unless the line is the flush due after a call.
    fn handle_line(&mut self, slot: usize, line: &[u8]) -> Handled {
        let message = match serde_json::from_slice::<ProgramMessage>(line) {
            Ok(m) => m,
            Err(e) => {
                self.bucket.take();
                self.send(slot, refusal(None, &format!("malformed tool message: {e}")));
                return Handled::Done;
            }
        };
        match message.op.as_ref() {
            "flush" => {
                if !std::mem::take(&mut self.called_since_flush) {
                    self.bucket.take();
                }
                self.flush = true;
                Handled::Done
            }
            "call" => {
                self.bucket.take();
                let id = message.id.map(RawValue::get).unwrap_or("null");
                if id.len() > MAX_ID_BYTES {
                    self.send(slot, refusal(None, "call id too long"));
                    return Handled::Done;
                }
                let Ok(id) = RawValue::from_string(id.to_owned()) else {
                    return Handled::Done;
                };
                if self.calls.len() >= MAX_PENDING_CALLS {
                    let message = format!("more than {MAX_PENDING_CALLS} tool calls are waiting for an answer");
                    self.send(slot, refusal(Some(&id), &message));
                    return Handled::Done;
                }
                let Some(name) = message.name else {
                    self.send(slot, refusal(Some(&id), "malformed tool message: a call needs a name"));
                    return Handled::Done;
                };
                // Four bytes a character at most: a longer name is over without counting.
                if name.len() > 4 * MAX_NAME_CHARS || name.chars().count() > MAX_NAME_CHARS {
                    let message = format!(
                        "unknown tool: its name is over {MAX_NAME_CHARS} characters, the longest a declared tool may have"
                    );
                    self.send(slot, refusal(Some(&id), &message));
                    return Handled::Done;
                }
                if let Some(argv) = message.argv {
                    if let Err(e) = serde_json::from_str::<StringArray>(argv.get()) {
                        self.send(slot, refusal(Some(&id), &format!("malformed tool message: argv: {e}")));
                        return Handled::Done;
                    }
                }
                let key = self.next_key;
                let event = ToolCallEvent {
                    event: "tool_call",
                    key,
                    name: &name,
                    arguments: message.arguments,
                    argv: message.argv,
                };
                let Ok(event) = serde_json::to_vec(&event) else {
                    return Handled::Done;
                };
                self.next_key += 1;
                self.calls.insert(key, (slot, id));
                self.unannounced = true;
                self.called_since_flush = true;
                Handled::Event(event)
            }
            other => {
                self.bucket.take();
                let text = format!("malformed tool message: unknown op {other:?}");
                self.send(slot, refusal(message.id, &text));
                Handled::Done
            }
        }
    }

    /// A line from the server's control channel that is a `Reply`: passes the reply to
    /// the connection the call came from. Returns whether it was one.
    pub(crate) fn command(&mut self, line: &[u8]) -> bool {
        let Ok(command) = serde_json::from_slice::<ReplyCommand>(line) else {
            return false;
        };
        if command.command != "reply" {
            return false;
        }
        let Some((slot, id)) = self.calls.remove(&command.key) else {
            return true;
        };
        if let Some(line) = with_id(&id, command.reply) {
            self.send(slot, line);
        }
        true
    }

    fn send(&mut self, slot: usize, mut line: Vec<u8>) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        line.push(b'\n');
        // The program does not take its replies: it loses the connection.
        if self.queued_bytes + line.len() as u64 > self.settings.max_queued_reply_bytes {
            return self.close(slot);
        }
        self.queued_bytes += line.len() as u64;
        if conn.out.is_empty() {
            conn.out = line;
        } else {
            conn.out.extend_from_slice(&line);
        }
        self.flush_out(slot);
    }

    /// Writes what the socket takes now of the replies queued for `slot`.
    pub(crate) fn flush_out(&mut self, slot: usize) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        let mut written = 0;
        let mut failed = false;
        while written < conn.out.len() {
            match nix::unistd::write(&conn.stream, &conn.out[written..]) {
                Ok(n) => written += n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        conn.out.drain(..written);
        if conn.out.is_empty() && conn.out.capacity() > READ_PAUSE_BYTES {
            conn.out = Vec::new();
        }
        self.queued_bytes -= written as u64;
        if failed {
            self.close(slot);
        }
    }

    fn close(&mut self, slot: usize) {
        if let Some(c) = self.conns.get_mut(slot).and_then(Option::take) {
            self.queued_bytes -= c.out.len() as u64;
            if c.reserved {
                self.reserved_bytes -= self.settings.max_message_bytes;
            }
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
        let result = reply.result.and_then(|r| serde_json::from_str(r.get()).ok());
        let out = match result.unwrap_or(Value::Null) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Command, Event};
    use std::io::{Read, Write};

    fn settings() -> ToolChannel {
        ToolChannel {
            max_message_bytes: 200 << 10,
            max_connections: 8,
            max_input_bytes: 400 << 10,
            max_queued_reply_bytes: 1 << 20,
            max_calls: 10,
        }
    }

    /// A hub on a socket in a fresh directory, and `n` connections to it.
    fn hub(n: usize) -> (ToolHub, Vec<UnixStream>, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("sandcall-tools-{}-{:?}", std::process::id(), Instant::now()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tools.sock");
        let mut hub = ToolHub::bind(&path, settings()).unwrap();
        let clients: Vec<UnixStream> = (0..n).map(|_| UnixStream::connect(&path).unwrap()).collect();
        hub.accept();
        (hub, clients, dir)
    }

    /// Reads every connection until nothing more comes.
    fn read_all(hub: &mut ToolHub) -> Vec<Vec<u8>> {
        let mut events = Vec::new();
        loop {
            hub.prepare_poll(Instant::now());
            let slots: Vec<usize> = hub
                .conn_fds()
                .into_iter()
                .filter(|(_, _, f)| f.contains(PollFlags::POLLIN))
                .map(|(s, _, _)| s)
                .collect();
            let before = events.len();
            let buffered: usize = hub.conns.iter().flatten().map(|c| c.buf.len()).sum();
            for slot in slots {
                events.extend(hub.read(slot));
            }
            let after: usize = hub.conns.iter().flatten().map(|c| c.buf.len()).sum();
            if events.len() == before && after == buffered {
                return events;
            }
        }
    }

    fn reply_line(client: &mut UnixStream) -> Value {
        let mut line = Vec::new();
        let mut byte = [0u8];
        while client.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        serde_json::from_slice(&line).unwrap()
    }

    #[test]
    fn bucket_refills_at_its_rate_up_to_its_capacity() {
        let t0 = Instant::now();
        let mut b = Bucket::new(3, t0);
        for _ in 0..3 {
            assert!(b.ready());
            b.take();
        }
        assert!(!b.ready());
        let next = b.next_at().unwrap();
        assert_eq!(next, t0 + Duration::from_secs_f64(1.0 / REFILL_PER_SECOND));
        b.refill(next);
        assert!(b.ready());
        b.refill(t0 + Duration::from_secs(60));
        assert_eq!(b.tokens, 3.0);
        assert_eq!(b.next_at(), None);
    }

    #[test]
    fn calls_are_relayed_as_the_server_reads_them() {
        let (mut hub, mut clients, dir) = hub(1);
        let c = &mut clients[0];
        c.write_all(b"{\"op\":\"call\",\"id\":\"c1\",\"name\":\"f\",\"arguments\":{\"x\":[1, 2]}}\n")
            .unwrap();
        c.write_all(b"{\"op\":\"call\",\"id\":7,\"name\":\"g\",\"argv\":[\"a=1\",\"b\"]}\n{\"op\":\"flush\"}\n")
            .unwrap();
        let events = read_all(&mut hub);
        assert_eq!(events.len(), 2);
        assert!(hub.flush && hub.unannounced);
        let parsed: Vec<Event> = events.iter().map(|e| serde_json::from_slice(e).unwrap()).collect();
        match &parsed[0] {
            Event::ToolCall {
                key,
                name,
                arguments,
                argv,
            } => {
                assert_eq!((*key, name.as_str(), argv), (1, "f", &None));
                assert_eq!(arguments, &Some(serde_json::json!({"x": [1, 2]})));
            }
            other => panic!("{other:?}"),
        }
        match &parsed[1] {
            Event::ToolCall {
                key, argv, arguments, ..
            } => {
                assert_eq!((*key, arguments), (2, &None));
                assert_eq!(argv, &Some(vec!["a=1".to_string(), "b".to_string()]));
            }
            other => panic!("{other:?}"),
        }
        // The server's replies go back with the program's own ids.
        for (key, reply) in [
            (2, ToolReply::error("refused", "no")),
            (1, ToolReply::result(serde_json::value::to_raw_value("r").unwrap())),
        ] {
            let line = serde_json::to_vec(&Command::Reply { key, reply }).unwrap();
            assert!(hub.command(&line));
        }
        assert_eq!(
            reply_line(c),
            serde_json::json!({"id": 7, "ok": false, "kind": "refused", "error": "no"})
        );
        assert_eq!(
            reply_line(c),
            serde_json::json!({"id": "c1", "ok": true, "result": "r"})
        );
        assert!(!hub.has_pending());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn bad_lines_are_refused_here() {
        let (mut hub, mut clients, dir) = hub(1);
        let c = &mut clients[0];
        let long_id = format!("\"{}\"", "i".repeat(MAX_ID_BYTES));
        let lines = format!(
            "not json\n{{\"op\":\"call\",\"id\":{long_id},\"name\":\"f\"}}\n{{\"op\":\"call\",\"id\":3,\"name\":\"f\",\"argv\":[1]}}\n{{\"op\":\"dance\",\"id\":4}}\n"
        );
        c.write_all(lines.as_bytes()).unwrap();
        assert!(read_all(&mut hub).is_empty());
        let errors: Vec<Value> = (0..4).map(|_| reply_line(c)).collect();
        for e in &errors {
            assert_eq!(
                (&e["ok"], &e["kind"]),
                (&Value::Bool(false), &serde_json::json!("refused")),
                "{e}"
            );
        }
        assert_eq!(errors[1]["error"], "call id too long");
        assert_eq!(
            (&errors[2]["id"], &errors[3]["id"]),
            (&serde_json::json!(3), &serde_json::json!(4))
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn names_over_128_characters_are_refused_here() {
        let (mut hub, mut clients, dir) = hub(1);
        let c = &mut clients[0];
        // 128 characters of two bytes each pass on; 129 characters, or 100 KiB, do not.
        let longest = "é".repeat(MAX_NAME_CHARS);
        let lines = format!(
            "{{\"op\":\"call\",\"id\":1,\"name\":\"{longest}\"}}\n{{\"op\":\"call\",\"id\":2,\"name\":\"{}\"}}\n{{\"op\":\"call\",\"id\":3,\"name\":\"{}\"}}\n",
            "x".repeat(MAX_NAME_CHARS + 1),
            "y".repeat(100 << 10),
        );
        c.write_all(lines.as_bytes()).unwrap();
        let events = read_all(&mut hub);
        assert_eq!(events.len(), 1);
        match serde_json::from_slice::<Event>(&events[0]).unwrap() {
            Event::ToolCall { name, .. } => assert_eq!(name, longest),
            other => panic!("{other:?}"),
        }
        for id in [2, 3] {
            let e = reply_line(c);
            assert_eq!(
                (&e["id"], &e["kind"]),
                (&serde_json::json!(id), &serde_json::json!("refused")),
                "{e}"
            );
            let error = e["error"].as_str().unwrap();
            assert!(error.contains("over 128 characters") && error.len() < 200, "{error}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn an_empty_bucket_stops_reading_and_lines_wait() {
        let (mut hub, mut clients, dir) = hub(1);
        let c = &mut clients[0];
        let capacity = settings().max_calls + REFUSAL_BURST;
        let mut lines = String::new();
        for i in 0..capacity + 5 {
            lines.push_str(&format!("{{\"op\":\"call\",\"id\":{i},\"name\":\"f\"}}\n"));
        }
        c.write_all(lines.as_bytes()).unwrap();
        let events = read_all(&mut hub);
        assert_eq!(events.len() as u64, capacity);
        assert!(hub.conns[0].as_ref().unwrap().waiting);
        assert!(hub.conn_fds().is_empty(), "not polled while the bucket is empty");
        // Asked at the bucket's own last refill, so that a slow machine's delay since
        // then cannot have brought the token already.
        let next = hub.prepare_poll(hub.bucket.last).expect("a time for the next token");
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let forwarded = hub.pump().len() as f64;
        // One token has come; more only as far as the clock ran on past it.
        let late = Instant::now().saturating_duration_since(next).as_secs_f64();
        assert!(
            forwarded >= 1.0 && forwarded <= 1.0 + (late * REFILL_PER_SECOND).ceil(),
            "{forwarded} calls forwarded, {late} s after the token"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn long_lines_share_the_input_budget() {
        // Each share is max_message_bytes: two of the three connections get one.
        let (mut hub, mut clients, dir) = hub(3);
        let line = format!(
            "{{\"op\":\"call\",\"id\":1,\"name\":\"f\",\"arguments\":{{\"d\":\"{}\"}}}}\n",
            "x".repeat(150 << 10)
        );
        for c in &mut clients {
            c.set_nonblocking(true).unwrap();
            let _ = c.write(&line.as_bytes()[..line.len() - 1]); // all but the newline
        }
        read_all(&mut hub);
        let reserved = hub.conns.iter().flatten().filter(|c| c.reserved).count();
        assert_eq!(reserved, 2);
        assert!(hub.conns.iter().flatten().all(|c| c.buf.len() <= line.len()));
        let held: usize = hub.conns.iter().flatten().map(|c| c.buf.len()).sum();
        assert!(held < 2 * line.len() + SMALL_LINE_BYTES, "{held}");
        // One ends its line: its share goes to the waiting one, whose line then arrives.
        let first = hub
            .conns
            .iter()
            .position(|c| c.as_ref().is_some_and(|c| c.reserved))
            .unwrap();
        clients[first].write_all(b"\n").unwrap();
        let mut events = read_all(&mut hub);
        let waiting = hub.conns.iter().position(|c| {
            c.as_ref()
                .is_some_and(|c| !c.reserved && c.buf.len() >= SMALL_LINE_BYTES)
        });
        assert!(waiting.is_none(), "the waiting connection got the freed share");
        for (i, c) in clients.iter_mut().enumerate() {
            if i != first {
                c.set_nonblocking(false).unwrap();
            }
        }
        events.extend(read_all(&mut hub));
        assert!(!events.is_empty());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn replies_over_the_total_bound_close_the_connection() {
        let (mut hub, mut clients, dir) = hub(1);
        clients[0]
            .write_all(b"{\"op\":\"call\",\"id\":1,\"name\":\"f\"}\n{\"op\":\"call\",\"id\":2,\"name\":\"f\"}\n")
            .unwrap();
        assert_eq!(read_all(&mut hub).len(), 2);
        // Nobody reads: the first reply fills the socket buffer and the queue.
        let big = ToolReply::result(serde_json::value::to_raw_value(&"x".repeat(900 << 10)).unwrap());
        assert!(hub.command(
            &serde_json::to_vec(&Command::Reply {
                key: 1,
                reply: big.clone()
            })
            .unwrap()
        ));
        assert!(hub.conns[0].is_some());
        assert!(hub.command(&serde_json::to_vec(&Command::Reply { key: 2, reply: big }).unwrap()));
        assert!(hub.conns[0].is_none(), "closed");
        assert_eq!(hub.queued_bytes, 0);
        let _ = std::fs::remove_dir_all(dir);
    }
}
