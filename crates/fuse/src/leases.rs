//! Long kernel cache times on the servers' callback promises.
//!
//! The mount subscribes its client (`Client::subscribe`): the servers then tell it when a name
//! or attributes they answered change, or a name they answered absent appears (`Notice`). So
//! the kernel may keep those answers for the lease time (60 s by default) instead of the short
//! attribute time, and `stat` of a file costs no request, yet a change made on another node
//! reaches this kernel as soon as the notice does: an invalidator thread drops the kernel's
//! copy (`FUSE_NOTIFY_INVAL_*`).
//!
//! Races. A notice can arrive while an answer it concerns is still on its way to the kernel;
//! that answer must not be cached long. Every answer notes `heard` (notices received) before
//! its request goes out; [`Leases::grant`] gives the lease only if none arrived since, and
//! holds `gate` (shared) while the answer is handed to the kernel. The invalidator passes
//! `gate` exclusively once before it invalidates: an answer granted before the notice is in
//! the kernel by then (so the invalidation drops it), one granted after saw the notice
//! counted and got the short time. The invalidator never holds `gate` while it calls into the
//! kernel: an invalidation waits for the directory's lock, which a create being answered may
//! hold.
//!
//! A notice drops what it names from the kernel whether it was leased or not (an answer kept
//! for the short time is stale too). `held` lists what was handed out for the lease time, so
//! that `Reset` (a connection to a server ended, the table changed) knows what to drop. It is
//! bounded: when [`HELD_MAX`] is reached, what was granted longer than the lease time ago (the
//! kernel has let it go) is forgotten; if that frees no room, answers get the short time.
//!
//! The queue to the invalidator is bounded too ([`NOTICES_MAX`]), and hearing a notice never
//! blocks: notices are heard on a connection's reader, and the invalidator may be waiting on
//! the kernel, which may be waiting for a create whose answer that very reader is to read. A
//! notice that finds the queue full is not lost but made coarser: what it would drop from the
//! kernel is dropped with everything held, as on `Reset` (answers kept for the short time
//! expire on their own, as the contract allows); a recall (`Notice::Listing`) is given back at
//! once, since that only spawns the giving back.

use crate::complete::Complete;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, TrySendError};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};
use tessera_client::{Name, Notice, NoticeSink};

/// Answers kept in the kernel for the lease time at most.
const HELD_MAX: usize = 1 << 20;
/// Notices waiting for the invalidator at most (a few MB with long names).
const NOTICES_MAX: usize = 1 << 14;

/// Something the kernel may cache.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    Attr(u64),
    Entry(u64, Name),
}

/// What the mount does when a directory's completeness is recalled.
type OnRecall = Box<dyn Fn(u64) + Send + Sync>;

pub(crate) struct Leases {
    /// To the invalidator.
    tx: mpsc::SyncSender<Notice>,
    /// A notice found the queue full: the invalidator drops everything held.
    overflowed: AtomicBool,
    recalled: OnceLock<OnRecall>,
    heard: AtomicU64,
    gate: RwLock<()>,
    held: Mutex<Held>,
    lease: Duration,
    max: usize,
    /// Directories whose names this mount knows all of, on the servers' promise.
    pub(crate) complete: Complete,
}

/// What was granted for the lease time, and when.
#[derive(Default)]
struct Held {
    keys: HashMap<Key, Instant>,
    /// When expired grants were last forgotten (not at every grant once full: that would
    /// walk them all each time).
    swept: Option<Instant>,
}

impl Leases {
    /// Starts the invalidator, which calls into the kernel through `notifier` once it is
    /// set; the sink is what the client's connections deliver notices to.
    pub fn start(
        notifier: Arc<OnceLock<fuser::Notifier>>,
        lease: Duration,
    ) -> std::io::Result<(Arc<Self>, NoticeSink)> {
        let (tx, rx) = mpsc::sync_channel::<Notice>(NOTICES_MAX);
        let leases = Arc::new(Self::new(lease, HELD_MAX, tx));
        let l = leases.clone();
        std::thread::Builder::new()
            .name("tessera-inval".into())
            .spawn(move || l.invalidate(&rx, &notifier))?;
        let heard = leases.clone();
        let sink = NoticeSink::new(move |n| heard.hear(n));
        Ok((leases, sink))
    }

    /// What to do when a server recalls a directory's completeness (`Notice::Listing`): give
    /// it back once the creates answered ahead there are in. Set once, by the mount.
    pub fn on_recall(&self, f: impl Fn(u64) + Send + Sync + 'static) {
        let _ = self.recalled.set(Box::new(f));
    }

    /// A notice, from a server or from the mount itself; never blocks (see the module doc).
    fn hear(&self, n: Notice) {
        self.complete.heard(&n);
        self.heard.fetch_add(1, Ordering::SeqCst);
        match self.tx.try_send(n) {
            // Disconnected: the invalidator is gone with the session.
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(n)) => self.overflow(n),
        }
    }

    /// `n` found the queue full. The flag is set before the `Reset` is offered: if that finds
    /// the queue full too, the invalidator reads the flag after it takes what is queued;
    /// otherwise the `Reset` wakes it.
    fn overflow(&self, n: Notice) {
        if let Notice::Listing { dir } = n {
            if let Some(give_back) = self.recalled.get() {
                give_back(dir);
            }
            return;
        }
        self.overflowed.store(true, Ordering::SeqCst);
        let _ = self.tx.try_send(Notice::Reset);
    }

    /// A create answered ahead failed: `name` in `dir` is not there after all. What the
    /// kernel keeps of it goes, and so does the directory's completeness (given back: the
    /// names this mount knows there are no longer all true).
    pub fn unmade(&self, dir: u64, name: Name, ino: u64) {
        self.hear(Notice::Listing { dir });
        self.hear(Notice::Entry { dir, name });
        self.hear(Notice::Attr { ino });
    }

    fn new(lease: Duration, max: usize, tx: mpsc::SyncSender<Notice>) -> Self {
        Self {
            tx,
            overflowed: AtomicBool::new(false),
            recalled: OnceLock::new(),
            heard: AtomicU64::new(0),
            gate: RwLock::new(()),
            held: Mutex::default(),
            lease,
            max,
            complete: Complete::new(),
        }
    }

    /// Notices heard so far; note it before sending the request whose answer may be leased.
    pub fn heard(&self) -> u64 {
        self.heard.load(Ordering::SeqCst)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// May an answer about `keys`, asked for when `heard` was `since`, be kept for the lease
    /// time? If so, hand it to the kernel before dropping the guard.
    pub fn grant(&self, since: u64, keys: Vec<Key>) -> Option<RwLockReadGuard<'_, ()>> {
        let gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        if self.heard() != since {
            return None;
        }
        let mut held = self.held();
        if held.keys.len() + keys.len() > self.max {
            let sweep_every = (self.lease / 8).min(Duration::from_secs(1));
            if held.swept.is_some_and(|t| t.elapsed() < sweep_every) {
                return None;
            }
            // With a margin: the kernel's time started when it took the answer, a little later.
            let kept_for = self.lease + sweep_every;
            held.keys.retain(|_, t| t.elapsed() < kept_for);
            held.swept = Some(Instant::now());
            if held.keys.len() + keys.len() > self.max {
                return None;
            }
        }
        let now = Instant::now();
        held.keys.extend(keys.into_iter().map(|k| (k, now)));
        drop(held);
        Some(gate)
    }

    fn invalidate(&self, rx: &mpsc::Receiver<Notice>, notifier: &OnceLock<fuser::Notifier>) {
        while let Some(drop_now) = self.take(rx) {
            let Some(n) = notifier.get() else { continue };
            for key in drop_now {
                // ENOENT: the kernel no longer has it, which is as good.
                let _ = match &key {
                    Key::Attr(ino) => n.inval_inode(fuser::INodeNo(*ino), -1, 0),
                    Key::Entry(dir, name) => {
                        n.inval_entry(fuser::INodeNo(*dir), OsStr::from_bytes(name))
                    }
                };
            }
        }
    }

    /// Waits for notices and takes them all: what the kernel is to drop. None once the
    /// sender is gone.
    fn take(&self, rx: &mpsc::Receiver<Notice>) -> Option<Vec<Key>> {
        let first = rx.recv().ok()?;
        let mut batch: Vec<Notice> = std::iter::once(first).chain(rx.try_iter()).collect();
        // Read before passing the gate: the notices that overflowed were counted by then.
        if self.overflowed.swap(false, Ordering::SeqCst) {
            batch.push(Notice::Reset);
        }
        // Every answer granted before these notices were counted is in the kernel now.
        drop(self.gate.write().unwrap_or_else(PoisonError::into_inner));
        let mut drop_now = Vec::new();
        let mut held = self.held();
        for n in batch {
            // Dropped whether leased or not: an answer kept for the short time is stale as
            // well.
            let key = match n {
                Notice::Attr { ino } => Key::Attr(ino),
                Notice::Entry { dir, name } => Key::Entry(dir, name),
                // Names the mount answered absent itself are not in the kernel.
                Notice::Listing { dir } => {
                    if let Some(give_back) = self.recalled.get() {
                        give_back(dir);
                    }
                    continue;
                }
                Notice::Reset => {
                    drop_now.extend(held.keys.drain().map(|(k, _)| k));
                    continue;
                }
            };
            held.keys.remove(&key);
            drop_now.push(key);
        }
        Some(drop_now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_list_forgets_expired_grants_and_refuses_fresh_ones() {
        let lease = Duration::from_secs(1);
        let l = Leases::new(lease, 2, mpsc::sync_channel(1).0);
        let since = l.heard();
        assert!(l.grant(since, vec![Key::Attr(1), Key::Attr(2)]).is_some());
        assert!(
            l.grant(since, vec![Key::Attr(3)]).is_none(),
            "full of live grants"
        );
        std::thread::sleep(lease + lease / 8 + Duration::from_millis(100));
        assert!(
            l.grant(since, vec![Key::Attr(3)]).is_some(),
            "the kernel let 1 and 2 go"
        );
        assert_eq!(l.held().keys.len(), 1);
        // A notice heard since the request was sent: the answer gets the short time.
        l.heard.fetch_add(1, Ordering::SeqCst);
        assert!(l.grant(since, vec![Key::Attr(4)]).is_none());
    }

    /// Past the queue's bound a notice is made coarser, never lost, and hearing never blocks:
    /// everything held is dropped from the kernel, and a recall is given back at once.
    #[test]
    fn a_full_queue_drops_everything_held_and_still_gives_directories_back() {
        let (tx, rx) = mpsc::sync_channel(2);
        let l = Leases::new(Duration::from_secs(60), 16, tx);
        let given_back = Arc::new(Mutex::new(Vec::new()));
        let g = given_back.clone();
        l.on_recall(move |dir| g.lock().unwrap().push(dir));
        let since = l.heard();
        let leased = [Key::Attr(1), Key::Attr(2), Key::Entry(7, b"x".to_vec())];
        drop(l.grant(since, leased.to_vec()));
        for ino in [1, 2, 3] {
            l.hear(Notice::Attr { ino });
        }
        l.hear(Notice::Listing { dir: 7 });
        assert_eq!(*given_back.lock().unwrap(), [7], "given back by the hearer");
        assert_eq!(
            l.heard(),
            since + 4,
            "answers on their way get the short time"
        );
        let mut dropped = l.take(&rx).unwrap();
        dropped.sort_by_key(|k| format!("{k:?}"));
        dropped.dedup();
        assert_eq!(
            dropped, leased,
            "the overflowed notice for 3 held nothing; the entry only went with everything"
        );
        assert!(l.held().keys.is_empty());

        // Room again: a notice is queued as it comes, with no reset behind it.
        drop(l.grant(l.heard(), vec![Key::Attr(5)]));
        l.hear(Notice::Attr { ino: 1 });
        assert_eq!(l.take(&rx).unwrap(), [Key::Attr(1)]);
        assert_eq!(l.held().keys.len(), 1, "5 is still held");
    }
}
