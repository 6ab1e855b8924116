//! The cluster's rename lock, kept by the primary of the root's partition ([`Op::RenameLock`]).
//!
//! A rename that moves a directory under another parent must check that the target is not
//! inside the directory, and then change two directories and the moved one's parent. Two such
//! renames from different clients (`a` into `b` and `b` into `a`) can each pass their check
//! before the other's changes land, and together cut both off the tree. Holding one lock over
//! check and changes makes them one decision, as the kernel's per-file-system rename lock
//! does on a local disk. The lock is a lease: a holder that dies loses it after
//! [`RENAME_LEASE`].
//!
//! [`Op::RenameLock`]: tessera_proto::Op::RenameLock

use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tessera_proto::RENAME_LEASE;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How often a waiter looks again even if not woken (a holder's lease may run out).
const POLL: Duration = Duration::from_millis(50);

#[derive(Default)]
pub(crate) struct RenameLock {
    /// The holder and when its lease ends.
    held: Mutex<Option<(u64, Instant)>>,
    freed: Notify,
}

impl RenameLock {
    /// Takes the lock for `holder` if it is free, expired at `now`, or already its own.
    fn try_take(&self, holder: u64, now: Instant) -> bool {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        match *held {
            Some((h, until)) if h != holder && now < until => false,
            _ => {
                *held = Some((holder, now + RENAME_LEASE));
                true
            }
        }
    }

    /// Waits until `holder` has the lock, at most `patience`; false if it did not get it.
    pub(crate) async fn take(&self, holder: u64, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let now = Instant::now();
            if self.try_take(holder, now) {
                return true;
            }
            if now >= deadline {
                return false;
            }
            let _ = tokio::time::timeout(POLL.min(deadline - now), freed).await;
        }
    }

    /// Takes the lock at once if that is possible.
    pub(crate) fn take_now(&self, holder: u64) -> bool {
        self.try_take(holder, Instant::now())
    }

    /// Gives the lock back if `holder` has it.
    pub(crate) fn release(&self, holder: u64) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(*held, Some((h, _)) if h == holder) {
            *held = None;
            drop(held);
            self.freed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn one_holder_at_a_time_until_released_or_expired() {
        let l = RenameLock::default();
        let t0 = Instant::now();
        assert!(l.try_take(1, t0));
        assert!(l.try_take(1, t0), "its holder may take it again");
        assert!(!l.try_take(2, t0 + Duration::from_secs(1)));
        l.release(2);
        assert!(!l.try_take(2, t0), "only the holder releases it");
        assert!(
            l.try_take(2, t0 + RENAME_LEASE),
            "a lease that ran out is lost"
        );
        l.release(2);
        assert!(l.try_take(3, t0));
    }

    #[tokio::test]
    async fn a_waiter_gets_the_lock_when_it_is_given_back() {
        let l = Arc::new(RenameLock::default());
        assert!(l.take_now(1));
        let waiter = tokio::spawn({
            let l = Arc::clone(&l);
            async move { l.take(2, Duration::from_secs(30)).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "waits while the lock is held");
        l.release(1);
        assert!(waiter.await.expect("waiter"));
        assert!(!l.take(3, Duration::from_millis(10)).await, "gives up");
    }
}
