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
//! bounded: past [`HELD_MAX`], answers get the short time.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, RwLockReadGuard};
use tessera_client::{Name, Notice, NoticeSink};

/// Answers kept in the kernel for the lease time at most.
const HELD_MAX: usize = 1 << 20;

/// Something the kernel may cache.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    Attr(u64),
    Entry(u64, Name),
}

pub(crate) struct Leases {
    heard: AtomicU64,
    gate: RwLock<()>,
    held: Mutex<HashSet<Key>>,
}

impl Leases {
    /// Starts the invalidator, which calls into the kernel through `notifier` once it is
    /// set; the sink is what the client's connections deliver notices to.
    pub fn start(
        notifier: Arc<OnceLock<fuser::Notifier>>,
    ) -> std::io::Result<(Arc<Self>, NoticeSink)> {
        let leases = Arc::new(Self {
            heard: AtomicU64::new(0),
            gate: RwLock::new(()),
            held: Mutex::default(),
        });
        let (tx, rx) = mpsc::channel::<Notice>();
        let l = leases.clone();
        std::thread::Builder::new()
            .name("tessera-inval".into())
            .spawn(move || l.invalidate(&rx, &notifier))?;
        let heard = leases.clone();
        let sink = NoticeSink::new(move |n| {
            heard.heard.fetch_add(1, Ordering::SeqCst);
            let _ = tx.send(n);
        });
        Ok((leases, sink))
    }

    /// Notices heard so far; note it before sending the request whose answer may be leased.
    pub fn heard(&self) -> u64 {
        self.heard.load(Ordering::SeqCst)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashSet<Key>> {
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
        if held.len() + keys.len() > HELD_MAX {
            return None;
        }
        held.extend(keys);
        drop(held);
        Some(gate)
    }

    fn invalidate(&self, rx: &mpsc::Receiver<Notice>, notifier: &OnceLock<fuser::Notifier>) {
        while let Ok(first) = rx.recv() {
            let batch: Vec<Notice> = std::iter::once(first).chain(rx.try_iter()).collect();
            // Every answer granted before these notices were counted is in the kernel now.
            drop(self.gate.write().unwrap_or_else(PoisonError::into_inner));
            let mut drop_now = Vec::new();
            {
                let mut held = self.held();
                for n in batch {
                    // Dropped whether leased or not: an answer kept for the short time is
                    // stale as well.
                    let key = match n {
                        Notice::Attr { ino } => Key::Attr(ino),
                        Notice::Entry { dir, name } => Key::Entry(dir, name),
                        Notice::Reset => {
                            drop_now.extend(held.drain());
                            continue;
                        }
                    };
                    held.remove(&key);
                    drop_now.push(key);
                }
            }
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
}
