//! Admission control: at most `max_concurrent_runs` run at once, at most
//! `max_queued_runs` wait, and nobody waits longer than `queue_timeout_ms`.

use crate::error::ApiError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Clone)]
pub struct Admission {
    slots: Arc<Semaphore>,
    waiting: Arc<AtomicUsize>,
    max_waiting: usize,
    max_wait: Duration,
    capacity: usize,
}

/// A run slot; released when dropped.
pub struct Slot {
    _permit: OwnedSemaphorePermit,
}

impl Admission {
    pub fn new(capacity: usize, max_waiting: usize, max_wait: Duration) -> Self {
        Admission {
            slots: Arc::new(Semaphore::new(capacity)),
            waiting: Arc::new(AtomicUsize::new(0)),
            max_waiting,
            max_wait,
            capacity,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn active(&self) -> usize {
        self.capacity - self.slots.available_permits()
    }

    /// Takes a slot, waiting in the bounded queue if needed.
    pub async fn admit(&self) -> Result<Slot, ApiError> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(Slot { _permit: permit });
        }
        let retry_after = self.max_wait.as_secs().max(1);
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.max_waiting {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::at_capacity(retry_after));
        }
        let result = tokio::time::timeout(self.max_wait, self.slots.clone().acquire_owned()).await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        match result {
            Ok(Ok(permit)) => Ok(Slot { _permit: permit }),
            _ => Err(ApiError::at_capacity(retry_after)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn full_queue_is_refused_at_once_and_waiters_time_out() {
        let adm = Admission::new(1, 1, Duration::from_millis(50));
        let first = adm.admit().await.unwrap();
        let waiter = {
            let adm = adm.clone();
            tokio::spawn(async move { adm.admit().await.map(|_| ()) })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The queue (one place) is taken by the waiter: refused without waiting.
        let err = adm.admit().await.err().unwrap();
        assert_eq!(err.error_type, "at_capacity");
        assert_eq!(err.retry_after_s, Some(1));
        // The waiter gives up after max_wait.
        assert!(waiter.await.unwrap().is_err());
        drop(first);
        assert!(adm.admit().await.is_ok());
    }
}
