//! A bound on the connections of a listening port that have not proven themselves yet (RPC
//! connections in their handshake, any HTTP connection).
//!
//! Past the bound, the oldest such connection is closed to make room for the new one, rather
//! than the new one refused: a flood of idle connections then only ever holds the newest few
//! hundred, each for its timeout at most, and a real client connecting during the flood still
//! gets in (its handshake takes a round trip; the flood would have to open hundreds of
//! connections within that round trip to push it out).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// The connections admitted on one port and not yet let go.
#[derive(Clone)]
pub struct Admission {
    max: usize,
    slots: Arc<Mutex<Slots>>,
}

#[derive(Default)]
struct Slots {
    next: u64,
    /// By age; dropping a sender tells its connection to close.
    open: BTreeMap<u64, oneshot::Sender<()>>,
}

/// A connection's place among the admitted; gives it up when dropped.
pub struct Ticket {
    id: u64,
    slots: Arc<Mutex<Slots>>,
    evicted: oneshot::Receiver<()>,
}

impl Admission {
    /// At most `max` (at least 1) connections at a time.
    #[must_use]
    pub fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            slots: Arc::default(),
        }
    }

    /// Admits a new connection; true if the oldest one was told to close to make room.
    #[must_use]
    pub fn admit(&self) -> (Ticket, bool) {
        let (tx, rx) = oneshot::channel();
        let mut slots = lock(&self.slots);
        let evicted = slots.open.len() >= self.max && slots.open.pop_first().is_some();
        let id = slots.next;
        slots.next += 1;
        slots.open.insert(id, tx);
        let ticket = Ticket {
            id,
            slots: self.slots.clone(),
            evicted: rx,
        };
        (ticket, evicted)
    }

    /// Connections admitted and not let go.
    #[must_use]
    pub fn len(&self) -> usize {
        lock(&self.slots).open.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Ticket {
    /// Runs `work` to its end, or `None` if a newer connection needed this one's room first.
    pub async fn run<F: Future>(&mut self, work: F) -> Option<F::Output> {
        tokio::select! {
            out = work => Some(out),
            _ = &mut self.evicted => None,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        lock(&self.slots).open.remove(&self.id);
    }
}

/// Raises this process's soft limit on open files to its hard one (the soft one is often
/// 1024), and returns the limit now in force. Every connection is a file, and authenticated
/// connections are not bounded: each FUSE thread of each mount keeps its own to every server.
pub fn raise_open_file_limit() -> std::io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` only writes the struct given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            ..lim
        };
        // SAFETY: `setrlimit` only reads the struct given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        lim = raised;
    }
    Ok(lim.rlim_cur)
}

fn lock(slots: &Mutex<Slots>) -> std::sync::MutexGuard<'_, Slots> {
    // A panic while holding this lock cannot leave the map inconsistent.
    slots
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::pending;

    #[tokio::test]
    async fn past_the_bound_the_oldest_gives_way() {
        let admission = Admission::new(2);
        let (mut a, evicted) = admission.admit();
        assert!(!evicted);
        let (mut b, evicted) = admission.admit();
        assert!(!evicted);
        let (mut c, evicted) = admission.admit();
        assert!(evicted, "a third connection pushes the first out");
        assert_eq!(admission.len(), 2);
        assert_eq!(
            a.run(pending::<()>()).await,
            None,
            "the first is told to close"
        );
        assert_eq!(b.run(async { 1 }).await, Some(1), "the others go on");
        drop(b);
        assert_eq!(admission.len(), 1);
        let (_d, evicted) = admission.admit();
        assert!(!evicted, "a connection let go made room");
        assert_eq!(c.run(async { 2 }).await, Some(2));
        drop((a, c));
        assert_eq!(admission.len(), 1);
    }
}
