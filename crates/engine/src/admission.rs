//! Admission control: at most `max_concurrent_runs` run at once, at most
//! `max_queued_runs` wait, nobody waits longer than `queue_timeout_ms`, and one
//! principal has at most `max_runs_per_principal` running or waiting.
//!
//! Every program that runs holds a `Slot`: a `/v1/exec` run for its whole length, a
//! programmatic session while its program runs (not while it sits paused waiting for
//! the caller). So `active()` is the number of programs using CPU now, whatever route
//! started them.

use crate::error::EngineError;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

struct Inner {
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    /// Programs let run past the capacity (see `admit_now`).
    overflow: AtomicUsize,
    max_waiting: usize,
    max_wait: Duration,
    capacity: usize,
    principals: Arc<PerPrincipal>,
}

/// A run slot; released when dropped.
pub struct Slot {
    _permit: Option<OwnedSemaphorePermit>,
    _principal: Held,
    overflow: Option<Arc<Inner>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(inner) = self.overflow.take() {
            inner.overflow.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// One request in the queue; counted out when dropped.
struct Waiter<'a>(&'a AtomicUsize);

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How many of something each principal holds, with a cap per principal.
pub struct PerPrincipal {
    cap: usize,
    /// A principal holding none has no entry.
    held: Mutex<HashMap<String, usize>>,
}

/// One thing a principal holds; given back when dropped.
pub struct Held {
    owner: Arc<PerPrincipal>,
    principal: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.owner.lock();
        if let Some(n) = held.get_mut(&self.principal) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.principal);
            }
        }
    }
}

impl PerPrincipal {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(PerPrincipal {
            cap,
            held: Mutex::new(HashMap::new()),
        })
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One more for `principal`, unless it holds its cap already.
    pub fn take(self: &Arc<Self>, principal: &str) -> Option<Held> {
        let mut held = self.lock();
        let n = held.get(principal).copied().unwrap_or(0);
        if n >= self.cap {
            return None;
        }
        held.insert(principal.to_owned(), n + 1);
        Some(self.held_by(principal))
    }

    /// One more for `principal`, unless it holds its cap already counting `beyond` more
    /// that are held elsewhere (a principal's dormant sessions, kept in the store).
    pub fn take_beyond(self: &Arc<Self>, principal: &str, beyond: usize) -> Option<Held> {
        let mut held = self.lock();
        let n = held.get(principal).copied().unwrap_or(0);
        if n.saturating_add(beyond) >= self.cap {
            return None;
        }
        held.insert(principal.to_owned(), n + 1);
        Some(self.held_by(principal))
    }

    /// How many `principal` holds now.
    pub fn held(&self, principal: &str) -> usize {
        self.lock().get(principal).copied().unwrap_or(0)
    }

    /// One more for `principal`, past its cap if need be.
    pub fn force(self: &Arc<Self>, principal: &str) -> Held {
        *self.lock().entry(principal.to_owned()).or_insert(0) += 1;
        self.held_by(principal)
    }

    fn held_by(self: &Arc<Self>, principal: &str) -> Held {
        Held {
            owner: self.clone(),
            principal: principal.to_owned(),
        }
    }

    /// Principals holding at least one.
    pub fn holders(&self) -> usize {
        self.lock().len()
    }
}

impl Admission {
    pub fn new(capacity: usize, max_waiting: usize, max_wait: Duration, per_principal: usize) -> Self {
        Admission {
            inner: Arc::new(Inner {
                slots: Arc::new(Semaphore::new(capacity)),
                waiting: AtomicUsize::new(0),
                overflow: AtomicUsize::new(0),
                max_waiting,
                max_wait,
                capacity,
                principals: PerPrincipal::new(per_principal),
            }),
        }
    }

    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    /// Programs running now (holding a slot).
    pub fn active(&self) -> usize {
        self.inner.capacity - self.inner.slots.available_permits() + self.inner.overflow.load(Ordering::SeqCst)
    }

    /// `principal`'s programs running or waiting for a slot now.
    pub fn active_of(&self, principal: &str) -> usize {
        self.inner.principals.held(principal)
    }

    /// Requests waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.inner.waiting.load(Ordering::SeqCst)
    }

    /// Counts one more run for `principal`, or refuses with 429 when it has its share.
    fn count(&self, principal: &str) -> Result<Held, EngineError> {
        self.inner.principals.take(principal).ok_or_else(|| {
            EngineError::principal_at_capacity(format!(
                "this caller already has {} runs running or waiting (max_runs_per_principal); retry later",
                self.inner.principals.cap()
            ))
        })
    }

    /// Takes a slot for `principal`, waiting in the bounded queue if needed.
    pub async fn admit(&self, principal: &str) -> Result<Slot, EngineError> {
        let counted = self.count(principal)?;
        let inner = &self.inner;
        if let Ok(permit) = inner.slots.clone().try_acquire_owned() {
            return Ok(Slot {
                _permit: Some(permit),
                _principal: counted,
                overflow: None,
            });
        }
        let retry_after = inner.max_wait.as_secs().max(1);
        // Counted out when dropped: also when the request goes away while it waits.
        let waiter = Waiter(&inner.waiting);
        if inner.waiting.fetch_add(1, Ordering::SeqCst) >= inner.max_waiting {
            return Err(EngineError::at_capacity(retry_after));
        }
        let result = tokio::time::timeout(inner.max_wait, inner.slots.clone().acquire_owned()).await;
        drop(waiter);
        match result {
            Ok(Ok(permit)) => Ok(Slot {
                _permit: Some(permit),
                _principal: counted,
                overflow: None,
            }),
            _ => Err(EngineError::at_capacity(retry_after)),
        }
    }

    /// A slot for a program that goes on running whether or not one is free: a paused
    /// session whose caller did not answer in time resumes on its own (TimeoutError in
    /// the program), and cannot be made to wait. Past the capacity it is counted as
    /// overflow, so `active()` still tells the truth.
    pub fn admit_now(&self, principal: &str) -> Slot {
        let counted = self.inner.principals.force(principal);
        match self.inner.slots.clone().try_acquire_owned() {
            Ok(permit) => Slot {
                _permit: Some(permit),
                _principal: counted,
                overflow: None,
            },
            Err(_) => {
                self.inner.overflow.fetch_add(1, Ordering::SeqCst);
                Slot {
                    _permit: None,
                    _principal: counted,
                    overflow: Some(self.inner.clone()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn full_queue_is_refused_at_once_and_waiters_time_out() {
        let adm = Admission::new(1, 1, Duration::from_millis(50), usize::MAX);
        let first = adm.admit("a").await.unwrap();
        let waiter = {
            let adm = adm.clone();
            tokio::spawn(async move { adm.admit("a").await.map(|_| ()) })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(adm.queued(), 1);
        // The queue (one place) is taken by the waiter: refused without waiting.
        let err = adm.admit("a").await.err().unwrap();
        assert_eq!(err.error_type, "at_capacity");
        assert_eq!(err.retry_after_s, Some(1));
        // The waiter gives up after max_wait.
        assert!(waiter.await.unwrap().is_err());
        drop(first);
        assert!(adm.admit("a").await.is_ok());
    }

    #[tokio::test]
    async fn a_waiter_that_goes_away_leaves_the_queue() {
        let adm = Admission::new(1, 1, Duration::from_secs(10), usize::MAX);
        let _held = adm.admit("a").await.unwrap();
        // The client goes away while its request waits: the future is dropped.
        assert!(tokio::time::timeout(Duration::from_millis(20), adm.admit("a"))
            .await
            .is_err());
        assert_eq!(adm.queued(), 0);
        assert_eq!(adm.inner.principals.holders(), 1);
        // The queue's one place is free again: this one waits (and times out) rather than
        // being refused at once.
        let t = std::time::Instant::now();
        assert!(tokio::time::timeout(Duration::from_millis(50), adm.admit("a"))
            .await
            .is_err());
        assert!(t.elapsed() >= Duration::from_millis(50));
    }

    #[tokio::test]
    async fn one_principal_gets_its_share_and_the_others_get_the_rest() {
        let adm = Admission::new(4, 4, Duration::from_millis(50), 2);
        let a1 = adm.admit("alice").await.unwrap();
        let _a2 = adm.admit("alice").await.unwrap();
        let err = adm.admit("alice").await.err().unwrap();
        assert_eq!(err.error_type, "principal_at_capacity");
        assert_eq!(err.kind, crate::error::ErrorKind::TooMany);
        assert_eq!(err.retry_after_s, Some(1));
        // A refusal takes nothing: bob still has his share, and the count is right.
        let _b1 = adm.admit("bob").await.unwrap();
        let _b2 = adm.admit("bob").await.unwrap();
        assert_eq!(adm.active(), 4);
        drop(a1);
        assert_eq!(adm.active(), 3);
        assert!(adm.admit("alice").await.is_ok());
    }

    #[tokio::test]
    async fn a_program_that_must_run_is_counted_past_the_capacity() {
        let adm = Admission::new(1, 0, Duration::from_millis(10), 1);
        let first = adm.admit("a").await.unwrap();
        let forced = adm.admit_now("a");
        assert_eq!(adm.active(), 2);
        // It counts against the principal's share too.
        assert_eq!(adm.admit("a").await.err().unwrap().error_type, "principal_at_capacity");
        drop(forced);
        drop(first);
        assert_eq!(adm.active(), 0);
        assert_eq!(adm.inner.principals.holders(), 0);
    }
}
