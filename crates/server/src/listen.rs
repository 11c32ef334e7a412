//! The accept loop and the life of a client connection. Each connection holds one permit
//! of `max_connections`: at the cap the loop stops accepting, and further clients wait in
//! the kernel's listen backlog until a connection closes. Each connection has two timers
//! of its own: a client must send a request's headers within `header_read_timeout_ms`,
//! and an idle keep-alive connection is closed after `keep_alive_timeout_ms`.
//!
//! This module owns connections only. It knows no route, principal or body (the body
//! timeout is `http.rs`'s, as a request's body belongs to its handler).

use crate::config::Config;
use axum::body::Body;
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower::ServiceExt;

/// The address a connection was accepted on. It is put into every request's extensions,
/// so that local mode can tell the server's own origin (its real port) from others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalAddr(pub SocketAddr);

/// How long a client may be silent.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// From the accept, or from the first byte of a later request, to its last header.
    pub header_read: Duration,
    /// From the end of a response to the first byte of the next request.
    pub keep_alive: Duration,
}

impl Timeouts {
    pub fn new(config: &Config) -> Self {
        Timeouts {
            header_read: Duration::from_millis(config.listen.header_read_timeout_ms),
            keep_alive: Duration::from_millis(config.listen.keep_alive_timeout_ms),
        }
    }
}

/// Descriptors the server keeps for everything that is not a client connection: the
/// listener, the runtime, the file store's database, logs.
const BASE_FDS: u64 = 64;
/// Descriptors per helper process (its stdin and stdout pipes, with room to spare).
const FDS_PER_HELPER: u64 = 4;
/// Descriptors per connection: its socket, and the stored file it may be reading or
/// writing (download, upload).
const FDS_PER_CONNECTION: u64 = 2;
/// The fewest connections the server runs with, whatever the limit says.
const MIN_CONNECTIONS: usize = 16;

/// Raises the soft open-files limit to the hard one (the kernel's default soft limit,
/// 1024, would hold only a few hundred idle clients), then says how many connections
/// fit beside the runs: `max_connections`, or fewer, with a warning, when the limit
/// cannot hold them.
pub fn connection_cap(config: &Config) -> usize {
    let open_files = match raise_open_files_limit() {
        Ok(limit) => limit,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read or raise the open-files limit; keeping max_connections");
            return config.listen.max_connections.min(MAX_PERMITS);
        }
    };
    let cap = fitting_connections(open_files, config);
    if cap < config.listen.max_connections {
        tracing::warn!(
            open_files,
            max_connections = config.listen.max_connections,
            connections = cap,
            "the open-files limit cannot hold max_connections beside the runs: accepting fewer connections \
             (raise the hard limit, e.g. LimitNOFILE= or ulimit -Hn, to accept more)"
        );
    }
    cap
}

/// A semaphore holds at most this many permits, and `acquire_many` counts in u32.
const MAX_PERMITS: usize = u32::MAX as usize >> 3;

/// Sets the soft `RLIMIT_NOFILE` to the hard one (or to the kernel's `nr_open`, when the
/// hard limit is infinite) and returns the soft limit now in force.
fn raise_open_files_limit() -> nix::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let mut target = hard;
    if hard == RLIM_INFINITY {
        // The kernel refuses a soft limit above nr_open.
        if let Some(nr_open) = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            target = nr_open;
        }
    }
    if soft >= target {
        return Ok(soft);
    }
    setrlimit(Resource::RLIMIT_NOFILE, target, hard)?;
    Ok(target)
}

/// How many connections `open_files` descriptors hold beside the runs' helpers.
fn fitting_connections(open_files: u64, config: &Config) -> usize {
    let helpers =
        (config.limits.max_concurrent_runs + config.sessions.max_sessions + 2 * config.languages.warm_pool_size) as u64;
    let reserve = BASE_FDS + FDS_PER_HELPER * helpers;
    let fit = open_files.saturating_sub(reserve) / FDS_PER_CONNECTION;
    let fit = usize::try_from(fit).unwrap_or(usize::MAX);
    config
        .listen
        .max_connections
        .min(fit.max(MIN_CONNECTIONS))
        .min(MAX_PERMITS)
}

/// Accepts connections until `shutdown` resolves, at most `cap` open at once, and serves
/// each with `app`. Then it stops accepting, lets every connection finish the request it
/// is on (the others close at once, half-sent headers too), and returns when the last one
/// has closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    cap: usize,
    timeouts: Timeouts,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(cap));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = pin!(shutdown);
    loop {
        // A permit first: at the cap the loop waits here, and does not accept.
        let permit = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of descriptors (EMFILE, ENFILE) or memory: retrying at once would
                // spin, and the condition usually passes as connections close.
                tracing::error!(error = %e, "accepting a connection");
                tokio::select! {
                    _ = &mut shutdown => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        tracing::trace!(%peer, "connection accepted");
        tokio::spawn(connection(stream, peer, app.clone(), timeouts, permit, stop_rx.clone()));
    }
    // Closing the listener refuses new connections from here on.
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection gives its permit back as it closes.
    let _ = permits.acquire_many(cap as u32).await;
}

/// Errors of one connection that says nothing about the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset)
}

/// Serves one connection over HTTP/1.1 until it ends, a timer of `Activity` runs out, or
/// the shutdown comes (a request in progress is answered first).
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    timeouts: Timeouts,
    _permit: OwnedSemaphorePermit,
    mut stop: watch::Receiver<bool>,
) {
    let local = stream.local_addr().ok().map(LocalAddr);
    let activity = Arc::new(Activity::new());
    let io = hyper_util::rt::TokioIo::new(Watched {
        stream,
        activity: activity.clone(),
    });
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            let busy = Busy::begin(activity.clone());
            if let Some(local) = local {
                req.extensions_mut().insert(local);
            }
            let app = app.clone();
            async move {
                let response = app.oneshot(req.map(Body::new)).await?;
                Ok::<_, std::convert::Infallible>(response.map(|body| Tracked { body, _busy: busy }))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    // hyper's own header timer also runs while a keep-alive connection is idle (from the
    // end of a response), so it would close idle connections at the header timeout
    // whatever `keep_alive_timeout_ms` says. `Activity` times both instead.
    builder.header_read_timeout(None);
    let mut conn = pin!(builder.serve_connection(io, service));
    let mut stopping = false;
    loop {
        let deadline = activity.deadline(timeouts);
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = sleep_until(deadline) => {
                // The timer may be stale: recheck under the lock.
                if activity.deadline(timeouts).is_some_and(|d| d <= Instant::now()) {
                    // Dropping the connection closes it: no request is under way.
                    tracing::debug!(%peer, "closing a connection that sent nothing in time");
                    return;
                }
            }
            _ = activity.changed.notified() => {}
            _ = stop.wait_for(|stop| *stop), if !stopping => {
                // A connection with no request under way (idle, or still sending
                // headers) closes at once, so that a slow client cannot hold up the
                // shutdown; one with a request answers it first.
                if activity.deadline(timeouts).is_some() {
                    return;
                }
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// What one connection is doing, for its timers. The service marks requests (from their
/// headers to the end of their response), the socket marks the first byte read while no
/// request is under way.
struct Activity {
    state: Mutex<ActivityState>,
    /// Wakes the connection's task to recompute its deadline.
    changed: Notify,
}

struct ActivityState {
    /// Requests whose response has not been sent whole yet.
    in_flight: usize,
    /// When the connection last became idle (its accept, or the end of a response).
    idle_since: Instant,
    /// When the first byte of the next request's headers arrived, if one did.
    head_started: Option<Instant>,
}

impl Activity {
    fn new() -> Self {
        let now = Instant::now();
        Activity {
            state: Mutex::new(ActivityState {
                in_flight: 0,
                idle_since: now,
                // A new connection owes its first request's headers from the accept on.
                head_started: Some(now),
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ActivityState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// When the connection is to be closed, or None while a request is under way (its
    /// body has a timer of its own, and a handler may take as long as its run).
    fn deadline(&self, timeouts: Timeouts) -> Option<Instant> {
        let state = self.lock();
        if state.in_flight > 0 {
            return None;
        }
        Some(match state.head_started {
            Some(start) => start + timeouts.header_read,
            None => state.idle_since + timeouts.keep_alive,
        })
    }

    fn bytes_read(&self) {
        let mut state = self.lock();
        if state.in_flight == 0 && state.head_started.is_none() {
            state.head_started = Some(Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }
}

/// A request under way, from its headers until its response body is dropped (sent, or
/// the connection gone).
struct Busy(Arc<Activity>);

impl Busy {
    fn begin(activity: Arc<Activity>) -> Self {
        {
            let mut state = activity.lock();
            state.in_flight += 1;
            state.head_started = None;
        }
        activity.changed.notify_one();
        Busy(activity)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        {
            let mut state = self.0.lock();
            state.in_flight = state.in_flight.saturating_sub(1);
            if state.in_flight == 0 {
                state.idle_since = Instant::now();
                state.head_started = None;
            }
        }
        self.0.changed.notify_one();
    }
}

/// A response body that keeps its request marked as under way until hyper drops it.
struct Tracked {
    body: Body,
    _busy: Busy,
}

impl hyper::body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The connection's socket, telling `Activity` when bytes arrive.
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_read();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_room_for_the_runs() {
        let config = Config {
            listen: sandcall_config::ListenConfig {
                max_connections: 2048,
                ..Default::default()
            },
            limits: sandcall_config::LimitsConfig {
                max_concurrent_runs: 8,
                ..Default::default()
            },
            sessions: sandcall_config::SessionsConfig {
                max_sessions: 64,
                ..Default::default()
            },
            languages: sandcall_config::LanguagesConfig {
                warm_pool_size: 4,
                ..Default::default()
            },
            ..Config::default()
        };
        // 64 + 4 × (8 + 64 + 8) = 384 reserved, 2 per connection.
        assert_eq!(fitting_connections(1_048_576, &config), 2048);
        assert_eq!(fitting_connections(384 + 2 * 2048, &config), 2048);
        assert_eq!(fitting_connections(1024, &config), 320);
        assert_eq!(fitting_connections(100, &config), MIN_CONNECTIONS);
    }

    #[test]
    fn the_deadline_follows_the_connection() {
        let timeouts = Timeouts {
            header_read: Duration::from_secs(10),
            keep_alive: Duration::from_secs(20),
        };
        let activity = Arc::new(Activity::new());
        let accepted = activity.lock().idle_since;
        // The first request's headers are due from the accept, bytes or not.
        assert_eq!(activity.deadline(timeouts), Some(accepted + timeouts.header_read));
        activity.bytes_read();
        assert_eq!(activity.deadline(timeouts), Some(accepted + timeouts.header_read));
        let busy = Busy::begin(activity.clone());
        assert_eq!(
            activity.deadline(timeouts),
            None,
            "no timer while a request is under way"
        );
        activity.bytes_read();
        assert_eq!(activity.deadline(timeouts), None, "its body's bytes start nothing");
        drop(busy);
        let idle = activity.lock().idle_since;
        assert!(idle >= accepted);
        assert_eq!(activity.deadline(timeouts), Some(idle + timeouts.keep_alive));
        activity.bytes_read();
        // The next request's headers are due from its first byte.
        let head = activity.lock().head_started.unwrap();
        assert!(head >= idle);
        assert_eq!(activity.deadline(timeouts), Some(head + timeouts.header_read));
    }
}
