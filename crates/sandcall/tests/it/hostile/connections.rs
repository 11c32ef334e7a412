//! Slow and idle connections: header and body timeouts, the connection cap.
//!
//! None of these attacks needs a key: a client that opens connections and sends little
//! or nothing would otherwise hold a descriptor of the server each, for as long as it
//! likes, until the server can accept no one.

use crate::common::{dir_entries, fd_count, Server};
use serde_json::{json, Value};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// What a timer of the server may take beyond its setting, on a loaded 2-core machine.
const MARGIN: Duration = Duration::from_secs(3);

/// One HTTP answer, read off a raw connection.
pub(super) struct Answer {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.head, String::from_utf8_lossy(&self.body)))
    }

    /// `{"error", "error_type"}` with this status and code.
    pub fn assert_error(&self, status: u16, error_type: &str) {
        let v = self.json();
        assert_eq!(self.status, status, "{}\n{v}", self.head);
        assert_eq!(v["error_type"], error_type, "{v}");
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}\n\n{}", self.head, String::from_utf8_lossy(&self.body))
    }
}

pub(super) fn connect(s: &Server) -> TcpStream {
    TcpStream::connect(("127.0.0.1", s.port)).expect("connect")
}

/// A request written by hand: `head` is the request line and headers without the final
/// blank line; `Content-Length` is added when there is a body.
pub(super) fn raw_request(head: &str, body: &[u8]) -> Vec<u8> {
    let mut out = head.trim_end().replace('\n', "\r\n").into_bytes();
    if !body.is_empty() {
        out.extend_from_slice(format!("\r\nContent-Length: {}", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(body);
    out
}

/// Sends `request` on a new connection and reads the answer (within `wait`).
pub(super) fn exchange(s: &Server, request: &[u8], wait: Duration) -> Answer {
    let mut c = connect(s);
    c.write_all(request).unwrap();
    read_answer(&mut c, wait).unwrap_or_else(|e| panic!("no answer within {wait:?}: {e}"))
}

/// Reads one answer whose body has a `Content-Length` (every JSON answer has).
pub(super) fn read_answer(c: &mut TcpStream, wait: Duration) -> std::io::Result<Answer> {
    c.set_read_timeout(Some(wait))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = c.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::Error::new(ErrorKind::UnexpectedEof, "closed before an answer"));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {head}"));
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        let n = c.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Ok(Answer { status, head, body })
}

/// Waits until the server closes `c` (end of file or a reset), at the latest `by`.
/// Returns whether it did.
fn closed_by(c: &mut TcpStream, by: Instant) -> bool {
    let mut chunk = [0u8; 4096];
    loop {
        let left = by.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        c.set_read_timeout(Some(left)).unwrap();
        match c.read(&mut chunk) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return false,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
    }
}

/// This test process may hold many connections: its soft open-files limit goes up to the
/// hard one (nextest runs each test in a process of its own).
fn allow_many_sockets() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a valid pointer to a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
}

/// The resident memory of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    crate::common::proc_status_kib(pid, "VmRSS").unwrap_or_else(|| panic!("no VmRSS for {pid}"))
}

/// The most descriptors `pid` has open, sampled until `done` says stop.
fn peak_fds(pid: u32, done: &std::sync::atomic::AtomicBool) -> usize {
    let mut peak = 0;
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        peak = peak.max(fd_count(pid));
        std::thread::sleep(Duration::from_millis(5));
    }
    peak.max(fd_count(pid))
}

#[test]
fn half_sent_headers_are_closed_within_the_header_timeout() {
    allow_many_sockets();
    let timeout = Duration::from_millis(1000);
    let s = Server::start_with(&[("SANDCALL_HEADER_READ_TIMEOUT_MS", "1000")], "");
    let pid = s.pid();
    let baseline = fd_count(pid);
    let rss_before = rss_kib(pid);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || peak_fds(pid, &done))
    };
    // Half a header line each, then silence: the slowloris attack.
    let mut conns: Vec<TcpStream> = (0..500)
        .map(|_| {
            let mut c = connect(&s);
            c.write_all(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
                .unwrap();
            c
        })
        .collect();
    let sent = Instant::now();
    let grown = rss_kib(pid).saturating_sub(rss_before);
    let by = sent + timeout + MARGIN;
    let open = conns
        .iter_mut()
        .map(|c| closed_by(c, by))
        .filter(|closed| !closed)
        .count();
    let took = sent.elapsed();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let peak = sampler.join().unwrap();
    assert!(
        peak >= baseline + 50,
        "the server did not take the connections: {peak} fds at most"
    );
    assert_eq!(
        open, 0,
        "{open} of 500 connections still open {took:?} after their half header"
    );
    assert!(grown < 64 << 10, "500 half-sent headers grew the server by {grown} KiB");
    eprintln!(
        "500 half-sent headers: all closed {took:?} after the last was sent ({peak} fds at the peak, \
         {baseline} before; RSS +{grown} KiB)"
    );
    // Every descriptor is given back.
    let start = Instant::now();
    while fd_count(pid) > baseline && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        fd_count(pid) <= baseline,
        "{} fds open, {baseline} before",
        fd_count(pid)
    );
    s.assert_healthy();
}

#[test]
fn idle_connections_past_the_cap_do_not_lock_out_a_new_client() {
    allow_many_sockets();
    let cap = 50;
    let s = Server::start_with(
        &[
            ("SANDCALL_MAX_CONNECTIONS", "50"),
            ("SANDCALL_HEADER_READ_TIMEOUT_MS", "1000"),
        ],
        "",
    );
    let pid = s.pid();
    let baseline = fd_count(pid);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || peak_fds(pid, &done))
    };
    // Connections that never send a byte.
    let idle: Vec<TcpStream> = (0..200).map(|_| connect(&s)).collect();
    let t = Instant::now();
    let answer = exchange(
        &s,
        b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        Duration::from_secs(30),
    );
    let waited = t.elapsed();
    assert_eq!(answer.status, 200, "{answer}");
    assert_eq!(answer.json()["status"], "ok", "{answer}");
    // 150 idle connections wait ahead of it, 50 at a time for 1 s each.
    assert!(waited < Duration::from_secs(10), "health answered after {waited:?}");
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let peak = sampler.join().unwrap();
    let slack = 8;
    assert!(
        peak <= baseline + cap + slack,
        "the server held {peak} fds with 200 idle clients ({baseline} before, cap {cap})"
    );
    eprintln!(
        "200 idle connections, cap 50: health answered after {waited:?}; fds peaked at {peak} ({baseline} before)"
    );
    drop(idle);
    s.assert_healthy();
}

#[test]
fn a_body_that_stalls_half_way_gets_408() {
    let timeout = Duration::from_millis(1000);
    let s = Server::start_with(&[("SANDCALL_BODY_READ_TIMEOUT_MS", "1000")], "");
    let port = s.port;

    // A JSON route: half the body, then silence.
    let body = json!({"code": "print('ran')"}).to_string();
    let mut c = connect(&s);
    let head = format!(
        "POST /v1/exec HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(&body.as_bytes()[..body.len() / 2]).unwrap();
    let t = Instant::now();
    let answer = read_answer(&mut c, timeout + MARGIN + Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("no answer to a stalled JSON body: {e}"));
    let took = t.elapsed();
    answer.assert_error(408, "request_timeout");
    assert!(took < timeout + MARGIN, "408 after {took:?}");
    assert!(
        answer.head.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    eprintln!("stalled JSON body: 408 after {took:?}");

    // An upload: a file part cut off half way.
    let boundary = "stall-boundary-5d1c";
    let mut multipart = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"half.bin\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    multipart.extend(std::iter::repeat_n(b'x', 256 << 10));
    multipart.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let mut c = connect(&s);
    let head = format!(
        "POST /v1/upload HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: multipart/form-data; boundary={boundary}\r\n\
         Content-Length: {}\r\n\r\n",
        multipart.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(&multipart[..multipart.len() / 2]).unwrap();
    let t = Instant::now();
    let answer = read_answer(&mut c, timeout + MARGIN + Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("no answer to a stalled upload: {e}"));
    let took = t.elapsed();
    answer.assert_error(408, "request_timeout");
    assert!(took < timeout + MARGIN, "408 after {took:?}");
    eprintln!("stalled upload: 408 after {took:?}");
    // Nothing of it is kept.
    let files = s.data_dir.join("files");
    assert_eq!(dir_entries(&files.join("objects")), 0, "an object was stored");
    assert_eq!(dir_entries(&files.join("incoming")), 0, "a partial upload was left");
    s.assert_healthy();
}

/// hyper's own header timeout starts when a keep-alive connection goes idle, so with it
/// an idle connection would close at `header_read_timeout_ms`; the server times the two
/// apart. Here the header timeout is short and the keep-alive long: the idle connection
/// outlives the first and closes at the second, and a request sent in between is served.
#[test]
fn an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout() {
    let keep_alive = Duration::from_millis(2500);
    let s = Server::start_with(
        &[
            ("SANDCALL_HEADER_READ_TIMEOUT_MS", "500"),
            ("SANDCALL_KEEP_ALIVE_TIMEOUT_MS", "2500"),
        ],
        "",
    );
    let request = b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    let mut c = connect(&s);
    c.write_all(request).unwrap();
    assert_eq!(read_answer(&mut c, Duration::from_secs(10)).unwrap().status, 200);
    // Idle for longer than the header timeout: still open, and it serves a request.
    std::thread::sleep(Duration::from_millis(1200));
    c.write_all(request).unwrap();
    let answer = read_answer(&mut c, Duration::from_secs(10)).expect("the idle connection was closed early");
    assert_eq!(answer.status, 200, "{answer}");
    let idle = Instant::now();
    assert!(
        closed_by(&mut c, idle + keep_alive + MARGIN),
        "an idle connection still open {:?} after its last answer",
        idle.elapsed()
    );
    let took = idle.elapsed();
    assert!(took >= keep_alive - Duration::from_millis(300), "closed after {took:?}");
    eprintln!("idle keep-alive connection (keep-alive 2500 ms, headers 500 ms): closed after {took:?}");

    // And a keep-alive timeout shorter than the header timeout is kept too.
    let s = Server::start_with(
        &[
            ("SANDCALL_HEADER_READ_TIMEOUT_MS", "30000"),
            ("SANDCALL_KEEP_ALIVE_TIMEOUT_MS", "1000"),
        ],
        "",
    );
    let mut c = connect(&s);
    c.write_all(request).unwrap();
    assert_eq!(read_answer(&mut c, Duration::from_secs(10)).unwrap().status, 200);
    let idle = Instant::now();
    assert!(
        closed_by(&mut c, idle + Duration::from_millis(1000) + MARGIN),
        "an idle connection still open {:?} after its answer",
        idle.elapsed()
    );
    eprintln!(
        "idle keep-alive connection (keep-alive 1000 ms, headers 30000 ms): closed after {:?}",
        idle.elapsed()
    );
}

/// The soft limit of this process, and so of the server it starts, is lowered to the
/// kernel's usual default first: the server must raise it itself.
#[test]
fn the_open_files_soft_limit_is_raised_to_the_hard_one() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a valid pointer to a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max.min(1024);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    let s = Server::start();
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", s.pid())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("{limits}"));
    let values: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(values.len(), 2, "{line}");
    assert_eq!(values[0], values[1], "soft and hard open-files limits differ: {line}");
    assert_eq!(values[1], lim.rlim_max.to_string(), "{line}");
    eprintln!("{line}");
}

/// At shutdown a slow client cannot hold the server up: connections with no request under
/// way close at once (the header timeout here is the default 10 s), and a request in
/// progress is still answered.
#[test]
fn slow_and_idle_connections_do_not_delay_the_shutdown() {
    let mut s = Server::start();
    let mut slow = connect(&s);
    slow.write_all(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
        .unwrap();
    let mut idle = connect(&s);
    idle.write_all(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    assert_eq!(read_answer(&mut idle, Duration::from_secs(10)).unwrap().status, 200);
    let body = json!({"language": "bash", "code": "sleep 1; echo done"}).to_string();
    let mut running = connect(&s);
    let head = format!(
        "POST /v1/exec HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    running.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let status = s.stop();
    let took = t.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    let answer = read_answer(&mut running, Duration::from_secs(5)).expect("the request in progress got no answer");
    assert_eq!(answer.status, 200, "{answer}");
    eprintln!("shutdown with a slow, an idle and a running connection: {took:?}");
}
