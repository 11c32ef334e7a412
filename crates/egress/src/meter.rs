//! Byte budgets: an upstream socket that counts what passes each way, against the run's
//! budget shared by all its connections, and fails once a budget is spent (which ends the
//! connection). Bytes are reserved before a read or write, so that concurrent connections
//! cannot overshoot the budget together.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// One direction's budget of a run.
#[derive(Debug)]
pub(crate) struct Budget {
    used: AtomicU64,
    max: u64,
}

impl Budget {
    pub(crate) fn new(max: u64) -> Self {
        Budget {
            used: AtomicU64::new(0),
            max,
        }
    }

    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub(crate) fn spent(&self) -> bool {
        self.used() >= self.max
    }

    /// Reserves up to `want` bytes; 0 when the budget is spent.
    fn reserve(&self, want: u64) -> u64 {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let take = want.min(self.max.saturating_sub(used));
            if take == 0 {
                return 0;
            }
            match self
                .used
                .compare_exchange_weak(used, used + take, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return take,
                Err(now) => used = now,
            }
        }
    }

    fn give_back(&self, unused: u64) {
        if unused > 0 {
            self.used.fetch_sub(unused, Ordering::Relaxed);
        }
    }
}

/// What one connection moved, and whether a budget cut it.
#[derive(Debug, Default)]
pub(crate) struct ConnCounts {
    pub(crate) bytes_out: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
    pub(crate) cut: AtomicBool,
}

/// An upstream socket under the run's budgets.
pub(crate) struct Metered {
    pub(crate) inner: TcpStream,
    pub(crate) out: Arc<Budget>,
    pub(crate) inb: Arc<Budget>,
    pub(crate) counts: Arc<ConnCounts>,
}

pub(crate) const BYTES_LIMIT: &str = "network bytes limit exceeded";

fn cut(counts: &ConnCounts) -> io::Error {
    counts.cut.store(true, Ordering::Relaxed);
    io::Error::new(io::ErrorKind::ConnectionAborted, BYTES_LIMIT)
}

impl AsyncRead for Metered {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let want = buf.remaining() as u64;
        if want == 0 {
            return Poll::Ready(Ok(()));
        }
        let this = &mut *self;
        let take = this.inb.reserve(want);
        if take == 0 {
            // The budget is spent exactly: an upstream that ends here has not passed it;
            // one more byte would (that byte is not passed on).
            let mut probe = [0u8; 1];
            let mut probe = ReadBuf::new(&mut probe);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut probe))?;
            return match probe.filled().len() {
                0 => Poll::Ready(Ok(())),
                _ => Poll::Ready(Err(cut(&this.counts))),
            };
        }
        let dst = buf.initialize_unfilled_to(take as usize);
        let mut part = ReadBuf::new(dst);
        let result = Pin::new(&mut this.inner).poll_read(cx, &mut part);
        let n = part.filled().len();
        this.inb.give_back(take - n as u64);
        this.counts.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
        buf.advance(n);
        result
    }
}

impl AsyncWrite for Metered {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let this = &mut *self;
        let take = this.out.reserve(buf.len() as u64);
        if take == 0 {
            return Poll::Ready(Err(cut(&this.counts)));
        }
        let result = Pin::new(&mut this.inner).poll_write(cx, &buf[..take as usize]);
        let written = match &result {
            Poll::Ready(Ok(n)) => *n as u64,
            _ => 0,
        };
        this.out.give_back(take - written);
        this.counts.bytes_out.fetch_add(written, Ordering::Relaxed);
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(Pin::new(&mut self.inner).poll_shutdown(cx))?;
        Poll::Ready(Ok(()))
    }
}
