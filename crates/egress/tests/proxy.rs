//! The proxy over real loopback sockets: a client speaking proxy protocol, the proxy
//! (`RunEgress::serve` behind a listener), and real upstream servers. Loopback upstreams are
//! reached only where a test names their addresses in `allow_addresses`, as a configuration
//! would.

mod common;

use common::start_proxy;
use sandcall_egress::{HostRule, IpNet, Limits, Outcome, Policy, Record, Resolver, RunEgress};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const ROOMY: Limits = Limits {
    max_connections: 100,
    max_bytes_out: 1 << 20,
    max_bytes_in: 1 << 20,
    max_connection_seconds: 30,
};
/// How long a test waits for anything that should happen at once.
const PATIENCE: Duration = Duration::from_secs(5);

fn run_with(rules: &[String], allow: &[&str], limits: Limits) -> Arc<RunEgress> {
    let policy = Policy {
        rules: rules.iter().map(|r| HostRule::parse(r).unwrap()).collect(),
        allow_addresses: allow.iter().map(|a| a.parse::<IpNet>().unwrap()).collect(),
    };
    RunEgress::new(policy.grant(None, limits).unwrap(), Resolver::system())
}

/// An upstream that echoes what it receives.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// An upstream that sends `n` bytes to whoever connects, then waits for them to close.
async fn firehose(n: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = stream.write_all(&vec![b'x'; n]).await;
                let mut sink = [0u8; 1024];
                while matches!(stream.read(&mut sink).await, Ok(1..)) {}
            });
        }
    });
    addr
}

/// A plain HTTP upstream that reports each request head it reads and answers "hello".
async fn http_server() -> (SocketAddr, mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let head = read_head(&mut stream).await;
                let _ = tx.send(head);
                let answer = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nKeep-Alive: timeout=5\r\nX-Up: 1\r\n\r\nhello";
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    (addr, rx)
}

/// Reads up to the blank line that ends a head (byte by byte: what follows is not ours).
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(PATIENCE, stream.read(&mut byte)).await {
            Ok(Ok(1)) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Sends `request` and reads the answer's status and (Content-Length) body.
async fn ask(stream: &mut TcpStream, request: &str) -> (u16, String) {
    stream.write_all(request.as_bytes()).await.unwrap();
    let head = read_head(stream).await;
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let length = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    tokio::time::timeout(PATIENCE, stream.read_exact(&mut body))
        .await
        .unwrap()
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

async fn connect_through(proxy: SocketAddr, target: &str) -> (TcpStream, u16, String) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let (status, body) = ask(
        &mut stream,
        &format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"),
    )
    .await;
    (stream, status, body)
}

/// Reads until the other side closes (or errs); fails the test if it stays open.
async fn read_to_close(stream: &mut TcpStream) -> usize {
    let mut total = 0;
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return total,
            Ok(Ok(n)) => total += n,
            Err(_) => panic!("the connection stayed open after {total} bytes"),
        }
    }
}

/// The run's records once no connection is open any more.
async fn settled_records(run: &RunEgress, n: usize) -> Vec<Record> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let records = run.records();
        let done = records.len() >= n && run.open_connections() == 0;
        if done || Instant::now() > deadline {
            return records;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn only(records: &[Record]) -> &Record {
    assert_eq!(records.len(), 1, "{records:?}");
    &records[0]
}

#[tokio::test]
async fn an_allowed_connect_relays_bytes_both_ways_and_is_recorded() {
    let upstream = echo_server().await;
    let run = run_with(&[format!("127.0.0.1:{}", upstream.port())], &["127.0.0.1/32"], ROOMY);
    let proxy = start_proxy(&run).await;
    let mut tunnel = TcpStream::connect(proxy).await.unwrap();
    let request = format!("CONNECT {upstream} HTTP/1.1\r\nHost: {upstream}\r\n\r\n");
    tunnel.write_all(request.as_bytes()).await.unwrap();
    let head = read_head(&mut tunnel).await;
    assert!(head.starts_with("HTTP/1.1 200 Connection established\r\n"), "{head}");
    tunnel.write_all(b"ping over the tunnel").await.unwrap();
    let mut back = [0u8; 20];
    tokio::time::timeout(PATIENCE, tunnel.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&back, b"ping over the tunnel");
    drop(tunnel);
    let records = settled_records(&run, 1).await;
    let record = only(&records);
    assert_eq!(
        (record.outcome, record.address, record.bytes_out, record.bytes_in),
        (Outcome::Relayed, Some(upstream.ip()), 20, 20)
    );
    let summary = run.summary();
    assert_eq!(
        (
            summary.connections,
            summary.refused,
            summary.bytes_out,
            summary.bytes_in
        ),
        (1, 0, 20, 20)
    );
    assert_eq!(run.limit_reason(), None);
}

#[tokio::test]
async fn a_host_outside_the_policy_gets_403_naming_it_and_a_record() {
    let run = run_with(&["api.example.com:443".into()], &[], ROOMY);
    let proxy = start_proxy(&run).await;
    let (_, status, body) = connect_through(proxy, "api.other.com:443").await;
    assert_eq!(status, 403);
    assert_eq!(
        body,
        "sandcall egress: api.other.com is not in this run's network policy\n"
    );
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let (status, body) = ask(
        &mut stream,
        "GET http://API.Other.com./x HTTP/1.1\r\nHost: api.other.com\r\n\r\n",
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let records = run.records();
    // Both named as rules name hosts: lower case, without the trailing dot.
    assert_eq!(records.len(), 2);
    for record in records {
        assert_eq!(
            (record.host.as_str(), record.outcome, record.address),
            ("api.other.com", Outcome::Refused, None)
        );
        assert!(record.reason.unwrap().contains("not in this run's network policy"));
    }
    assert_eq!(run.summary().refused, 2);
}

#[tokio::test]
async fn a_port_outside_the_rule_gets_403_naming_the_port() {
    let upstream = echo_server().await;
    let run = run_with(&[format!("localhost:{}", upstream.port())], &["127.0.0.1/32"], ROOMY);
    let proxy = start_proxy(&run).await;
    let (_, status, body) = connect_through(proxy, "localhost:22").await;
    assert_eq!(status, 403);
    assert_eq!(
        body,
        "sandcall egress: port 22 of localhost is not in this run's network policy\n"
    );
    assert_eq!(only(&run.records()).outcome, Outcome::Refused);
}

#[tokio::test]
async fn a_name_resolving_to_loopback_is_refused_unless_the_address_is_named() {
    let upstream = echo_server().await;
    let rule = format!("localhost:{}", upstream.port());
    let target = format!("localhost:{}", upstream.port());

    let refusing = run_with(std::slice::from_ref(&rule), &[], ROOMY);
    let (_, status, body) = connect_through(start_proxy(&refusing).await, &target).await;
    assert_eq!(status, 403);
    // The first refused address of the answer is named (/etc/hosts may list ::1 too).
    let record = only(&refusing.records()).clone();
    let address = record.address.expect("the refused address is recorded");
    assert!(address.is_loopback(), "{address}");
    let want = format!("sandcall egress: localhost resolves to a loopback address ({address}), which egress refuses\n");
    assert_eq!(body, want);
    assert_eq!(record.outcome, Outcome::Refused);

    let allowing = run_with(&[rule], &["127.0.0.0/8", "::1/128"], ROOMY);
    let (mut tunnel, status, _) = connect_through(start_proxy(&allowing).await, &target).await;
    assert_eq!(status, 200);
    tunnel.write_all(b"x").await.unwrap();
    let mut back = [0u8; 1];
    tokio::time::timeout(PATIENCE, tunnel.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn literal_internal_addresses_are_refused_even_when_a_rule_names_them() {
    let targets = [
        ("10.0.0.5:443", "10.0.0.5 is a private address"),
        ("192.168.1.1:443", "192.168.1.1 is a private address"),
        ("169.254.169.254:80", "169.254.169.254 is a link-local address"),
        ("[::ffff:127.0.0.1]:443", "::ffff:127.0.0.1 is a loopback address"),
        (
            "[::ffff:169.254.169.254]:80",
            "::ffff:169.254.169.254 is a link-local address",
        ),
        ("[::1]:443", "::1 is a loopback address"),
        ("0.0.0.0:80", "0.0.0.0 is an unspecified address"),
        ("[fd00::1]:443", "fd00::1 is a private (unique local) address"),
        ("100.64.0.1:443", "100.64.0.1 is a shared (CGNAT) address"),
    ];
    let rules: Vec<String> = targets.iter().map(|(t, _)| t.to_string()).collect();
    let run = run_with(&rules, &[], ROOMY);
    let proxy = start_proxy(&run).await;
    for (target, why) in targets {
        let (_, status, body) = connect_through(proxy, target).await;
        assert_eq!(status, 403, "{target}: {body}");
        assert_eq!(body, format!("sandcall egress: {why}, which egress refuses\n"));
    }
    // The metadata service over plain HTTP too.
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let request = "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n";
    let (status, body) = ask(&mut stream, request).await;
    assert_eq!(
        (status, body.as_str()),
        (
            403,
            "sandcall egress: 169.254.169.254 is a link-local address, which egress refuses\n"
        )
    );
    let records = run.records();
    assert_eq!(records.len(), targets.len() + 1);
    assert!(
        records
            .iter()
            .all(|r| r.outcome == Outcome::Refused && r.address.is_some()),
        "{records:?}"
    );
    assert_eq!(run.open_connections(), 0);
}

#[tokio::test]
async fn plain_http_is_forwarded_in_origin_form_without_proxy_headers() {
    let (upstream, mut heads) = http_server().await;
    let run = run_with(&[format!("127.0.0.1:{}", upstream.port())], &["127.0.0.1/32"], ROOMY);
    let proxy = start_proxy(&run).await;
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let request = format!(
        "GET http://user:pw@{upstream}/data/set.csv?v=2 HTTP/1.1\r\nHost: elsewhere.internal\r\nX-Mine: kept\r\n\
         Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive, X-Drop\r\n\
         X-Drop: hop\r\n\r\n"
    );
    let (status, body) = ask(&mut stream, &request).await;
    assert_eq!((status, body.as_str()), (200, "hello"));
    let head = heads.recv().await.unwrap();
    let lower = head.to_ascii_lowercase();
    assert!(head.starts_with("GET /data/set.csv?v=2 HTTP/1.1\r\n"), "{head}");
    assert!(lower.contains(&format!("host: {upstream}\r\n")), "{head}");
    assert!(lower.contains("x-mine: kept\r\n"), "{head}");
    for gone in [
        "proxy-authorization",
        "proxy-connection",
        "x-drop",
        "keep-alive",
        "elsewhere",
        "user:pw",
    ] {
        assert!(!lower.contains(gone), "{gone} reached the upstream: {head}");
    }
    // The same client connection may send another request (a new upstream connection).
    let (status, _) = ask(
        &mut stream,
        &format!("GET http://{upstream}/two HTTP/1.1\r\nHost: {upstream}\r\n\r\n"),
    )
    .await;
    assert_eq!(status, 200);
    assert!(heads.recv().await.unwrap().starts_with("GET /two HTTP/1.1\r\n"));
    drop(stream);
    let records = settled_records(&run, 2).await;
    assert_eq!(records.len(), 2);
    assert!(
        records
            .iter()
            .all(|r| r.outcome == Outcome::Relayed && r.bytes_out > 0 && r.bytes_in > 0),
        "{records:?}"
    );
}

#[tokio::test]
async fn connections_past_the_limit_are_refused_with_the_reason() {
    let upstream = echo_server().await;
    let limits = Limits {
        max_connections: 2,
        ..ROOMY
    };
    let run = run_with(&[format!("127.0.0.1:{}", upstream.port())], &["127.0.0.1/32"], limits);
    let proxy = start_proxy(&run).await;
    let (_a, first, _) = connect_through(proxy, &upstream.to_string()).await;
    let (_b, second, _) = connect_through(proxy, &upstream.to_string()).await;
    assert_eq!((first, second), (200, 200));
    assert_eq!(run.limit_reason(), None);
    let (_, third, body) = connect_through(proxy, &upstream.to_string()).await;
    assert_eq!(third, 403);
    assert_eq!(body, "sandcall egress: network connection limit exceeded\n");
    assert_eq!(run.limit_reason(), Some("network connection limit exceeded"));
    let records = run.records();
    assert_eq!(
        records.iter().map(|r| r.outcome).collect::<Vec<_>>(),
        [Outcome::Relayed, Outcome::Relayed, Outcome::Limited]
    );
}

#[tokio::test]
async fn the_byte_limit_cuts_the_connection_and_sets_the_reason() {
    let upstream = firehose(256 * 1024).await;
    let limits = Limits {
        max_bytes_in: 10_000,
        ..ROOMY
    };
    let run = run_with(&[format!("127.0.0.1:{}", upstream.port())], &["127.0.0.1/32"], limits);
    let proxy = start_proxy(&run).await;
    let (mut tunnel, status, _) = connect_through(proxy, &upstream.to_string()).await;
    assert_eq!(status, 200);
    let received = read_to_close(&mut tunnel).await;
    assert!(received <= 10_000, "{received} bytes came through a budget of 10000");
    let records = settled_records(&run, 1).await;
    let record = only(&records);
    assert_eq!(record.outcome, Outcome::Limited);
    assert_eq!(record.reason.as_deref(), Some("network bytes limit exceeded"));
    assert_eq!(record.bytes_in, 10_000);
    assert_eq!(run.limit_reason(), Some("network bytes limit exceeded"));
    // A spent budget refuses further connections.
    let (_, status, body) = connect_through(proxy, &upstream.to_string()).await;
    assert_eq!(
        (status, body.as_str()),
        (403, "sandcall egress: network bytes limit exceeded\n")
    );

    // The same going out: an echo tunnel that is sent more than the budget.
    let echo = echo_server().await;
    let limits = Limits {
        max_bytes_out: 1000,
        ..ROOMY
    };
    let run = run_with(&[format!("127.0.0.1:{}", echo.port())], &["127.0.0.1/32"], limits);
    let (mut tunnel, status, _) = connect_through(start_proxy(&run).await, &echo.to_string()).await;
    assert_eq!(status, 200);
    let _ = tunnel.write_all(&[b'y'; 5000]).await;
    let echoed = read_to_close(&mut tunnel).await;
    assert!(echoed <= 1000, "{echoed}");
    let records = settled_records(&run, 1).await;
    assert_eq!(
        (only(&records).outcome, only(&records).bytes_out),
        (Outcome::Limited, 1000)
    );
    assert_eq!(run.summary().bytes_out, 1000);
}

#[tokio::test]
async fn a_connection_ends_at_its_time_limit_with_its_record_complete() {
    let upstream = echo_server().await;
    let limits = Limits {
        max_connection_seconds: 1,
        ..ROOMY
    };
    let run = run_with(&[format!("127.0.0.1:{}", upstream.port())], &["127.0.0.1/32"], limits);
    // `serve` called here, so that the test sees the moment it returns.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = listener.local_addr().unwrap();
    let client = tokio::spawn(async move {
        let (mut tunnel, status, _) = connect_through(proxy, &upstream.to_string()).await;
        assert_eq!(status, 200);
        tunnel.write_all(b"abc").await.unwrap();
        read_to_close(&mut tunnel).await
    });
    let (stream, _) = listener.accept().await.unwrap();
    let started = Instant::now();
    run.serve(stream).await;
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    // Complete as `serve` returns: outcome, reason and bytes.
    let record = only(&run.records()).clone();
    assert_eq!(
        (record.outcome, record.bytes_out, record.bytes_in),
        (Outcome::Limited, 3, 3)
    );
    assert_eq!(record.reason.as_deref(), Some("network connection time limit exceeded"));
    assert_eq!(run.open_connections(), 0);
    assert_eq!(run.limit_reason(), Some("network connection time limit exceeded"));
    assert_eq!(client.await.unwrap(), 3);
}

#[tokio::test]
async fn bad_requests_get_4xx_without_a_hang() {
    let run = run_with(&["example.com".into()], &[], ROOMY);
    let proxy = start_proxy(&run).await;
    let cases: [(Vec<u8>, u16); 5] = [
        (b"\x16\x03\x01\x02\x00garbage\r\n\r\n".to_vec(), 400),
        (b"GET /not/absolute HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 400),
        (
            b"CONNECT example.com HTTP/1.1\r\nHost: example.com\r\n\r\n".to_vec(),
            400,
        ),
        (
            b"GET https://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n".to_vec(),
            400,
        ),
        (
            [
                b"GET http://example.com/ HTTP/1.1\r\nX-Big: ".as_slice(),
                &[b'a'; 40 * 1024],
                b"\r\n\r\n",
            ]
            .concat(),
            431,
        ),
    ];
    for (request, want) in cases {
        let mut stream = TcpStream::connect(proxy).await.unwrap();
        let _ = stream.write_all(&request).await;
        let head = read_head(&mut stream).await;
        let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        assert_eq!(
            status,
            want,
            "{:?} answered {head:?}",
            String::from_utf8_lossy(&request[..40.min(request.len())])
        );
        read_to_close(&mut stream).await;
    }
    // Nothing of these reached for the network.
    assert!(run.records().is_empty(), "{:?}", run.records());
}

#[tokio::test]
async fn closing_the_run_ends_its_tunnels() {
    let upstream = echo_server().await;
    let run = run_with(&[format!("127.0.0.1:{}", upstream.port())], &["127.0.0.1/32"], ROOMY);
    let proxy = start_proxy(&run).await;
    let (mut tunnel, status, _) = connect_through(proxy, &upstream.to_string()).await;
    assert_eq!(status, 200);
    tunnel.write_all(b"abcd").await.unwrap();
    let mut back = [0u8; 4];
    tokio::time::timeout(PATIENCE, tunnel.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    // A second client connection, still sending its head.
    let mut slow = TcpStream::connect(proxy).await.unwrap();
    slow.write_all(b"CONNECT ").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    tokio::time::timeout(PATIENCE, run.close_and_wait())
        .await
        .expect("close_and_wait returned");
    // Final as close_and_wait returns.
    let record = only(&run.records()).clone();
    assert_eq!(
        (record.outcome, record.bytes_out, record.bytes_in),
        (Outcome::Relayed, 4, 4)
    );
    assert_eq!(run.open_connections(), 0);
    read_to_close(&mut tunnel).await;
    read_to_close(&mut slow).await;
    // Later connections are closed at once.
    let mut late = TcpStream::connect(proxy).await.unwrap();
    read_to_close(&mut late).await;
}

#[tokio::test]
async fn a_client_that_stalls_in_its_request_head_is_closed() {
    let run = run_with(&["example.com".into()], &[], ROOMY);
    let mut stream = TcpStream::connect(start_proxy(&run).await).await.unwrap();
    stream
        .write_all(b"CONNECT example.com:443 HTTP/1.1\r\nHost: exa")
        .await
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 256];
    // The head's time limit is 10 s; a connection still open after 15 s is a failure.
    let end = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the stalled connection stayed open");
    assert!(
        started.elapsed() >= Duration::from_secs(9),
        "closed after {:?}",
        started.elapsed()
    );
    assert!(run.records().is_empty());
}

#[tokio::test]
async fn connections_to_the_proxy_past_the_cap_are_closed_at_once() {
    // The cap on open connections to the proxy is max_connections, within 16 and 256.
    for (max_connections, cap) in [(1, 16), (1000, 256)] {
        let run = run_with(
            &["example.com".into()],
            &[],
            Limits {
                max_connections,
                ..ROOMY
            },
        );
        let proxy = start_proxy(&run).await;
        let mut idle = Vec::new();
        for _ in 0..cap {
            idle.push(TcpStream::connect(proxy).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut extra = TcpStream::connect(proxy).await.unwrap();
        let started = Instant::now();
        read_to_close(&mut extra).await;
        // The served ones would close only at the head's time limit, 10 s.
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        // One closes; the next connection is served.
        drop(idle.pop());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (_, status, _) = connect_through(proxy, "other.example:443").await;
        assert_eq!(status, 403);
    }
}

#[tokio::test]
async fn an_allowed_host_that_does_not_answer_gets_502_and_a_failed_record() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let run = run_with(&[format!("127.0.0.1:{}", closed.port())], &["127.0.0.1/32"], ROOMY);
    let (_, status, body) = connect_through(start_proxy(&run).await, &closed.to_string()).await;
    assert_eq!(status, 502);
    assert_eq!(
        body,
        format!(
            "sandcall egress: could not connect to 127.0.0.1 port {}\n",
            closed.port()
        )
    );
    let record = only(&run.records()).clone();
    assert_eq!((record.outcome, record.address), (Outcome::Failed, Some(closed.ip())));
    assert_eq!(run.summary().failed, 1);
}

#[tokio::test]
async fn an_answer_of_exactly_the_byte_budget_is_not_limited() {
    let (upstream, _heads) = http_server().await;
    // The answer is 75 bytes; a budget of 75 holds it exactly.
    let limits = Limits {
        max_bytes_in: 75,
        ..ROOMY
    };
    let run = run_with(&[format!("127.0.0.1:{}", upstream.port())], &["127.0.0.1/32"], limits);
    let mut stream = TcpStream::connect(start_proxy(&run).await).await.unwrap();
    let (status, body) = ask(&mut stream, &format!("GET http://{upstream}/ HTTP/1.1\r\n\r\n")).await;
    assert_eq!((status, body.as_str()), (200, "hello"));
    drop(stream);
    let records = settled_records(&run, 1).await;
    assert_eq!(
        (only(&records).outcome, only(&records).bytes_in),
        (Outcome::Relayed, 75),
        "{records:?}"
    );
    assert_eq!(run.limit_reason(), None);
}

/// A plain HTTP upstream that reports each request's head and body (by Content-Length, or
/// chunked up to its last chunk), and answers with hop-by-hop headers of its own.
async fn http_body_server() -> (SocketAddr, mpsc::UnboundedReceiver<(String, String)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let head = read_head(&mut stream).await;
                let lower = head.to_ascii_lowercase();
                let mut body = Vec::new();
                if let Some(length) = lower.lines().find_map(|l| l.strip_prefix("content-length:")) {
                    body.resize(length.trim().parse().unwrap(), 0);
                    stream.read_exact(&mut body).await.unwrap();
                } else if lower.contains("transfer-encoding: chunked") {
                    let mut byte = [0u8; 1];
                    while !body.ends_with(b"0\r\n\r\n") && stream.read(&mut byte).await.unwrap() == 1 {
                        body.push(byte[0]);
                    }
                }
                let _ = tx.send((head, String::from_utf8_lossy(&body).into_owned()));
                let answer = "HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: keep-alive, X-Hop\r\n\
                              X-Hop: 1\r\nKeep-Alive: timeout=5\r\nX-Up: 1\r\n\r\nok";
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn plain_http_request_bodies_go_up_and_hop_headers_of_the_answer_stay_behind() {
    let (upstream, mut seen) = http_body_server().await;
    let run = run_with(&[format!("127.0.0.1:{}", upstream.port())], &["127.0.0.1/32"], ROOMY);
    let mut stream = TcpStream::connect(start_proxy(&run).await).await.unwrap();
    let sized = format!("POST http://{upstream}/form HTTP/1.1\r\nContent-Length: 11\r\n\r\nfield=value");
    let chunked = format!(
        "POST http://{upstream}/stream HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n3\r\nefg\r\n0\r\n\r\n"
    );
    for (request, want_body) in [(sized, "field=value"), (chunked, "abcdefg")] {
        stream.write_all(request.as_bytes()).await.unwrap();
        let answer = read_head(&mut stream).await.to_ascii_lowercase();
        assert!(answer.starts_with("http/1.1 201 created\r\n"), "{answer}");
        assert!(answer.contains("x-up: 1\r\n"), "{answer}");
        for gone in ["x-hop", "keep-alive: timeout"] {
            assert!(!answer.contains(gone), "{gone} came back to the client: {answer}");
        }
        let mut ok = [0u8; 2];
        tokio::time::timeout(PATIENCE, stream.read_exact(&mut ok))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&ok, b"ok");
        let (head, body) = seen.recv().await.unwrap();
        // A chunked body may be re-framed: compare what it carries.
        let carried: String = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            body.split("\r\n").skip(1).step_by(2).collect()
        } else {
            body
        };
        assert_eq!(carried, want_body, "{head}");
    }
}
