//! Directories this mount made, whose every name it knows: there it answers that a name is
//! absent itself, without asking a server, so a create costs no look-up round trip.
//!
//! The server that holds a directory promises its maker (`InodeCreate`, to a subscribed
//! connection) to tell it when anyone else adds a name to it or removes it
//! (`Notice::Listing`); the mount's own names it records here before it asks for them to be
//! made, so a name on its way in is never answered absent. A directory is forgotten when the
//! notice comes, on `Reset` (every directory: the promise may be lost with a connection or a
//! table change) and when the names kept reach [`NAMES_MAX`]. It is recorded only if no such
//! notice came while it was being made ([`Complete::cuts`]): one may concern it already.
//!
//! Where it knows every name, the mount answers a create before the server has it (the
//! request goes out right after, see `Fs::create` in `open.rs`): the server recalls the promise
//! before anyone else adds a name or removes the directory, and the mount gives it back
//! (`Op::Relinquish`) only once those creates are in ([`Complete::settle`]). Until then every
//! other request about the directory or the new file waits for them too; the close's FLUSH,
//! which comes right after most creates, without holding a worker: the worker that lands the
//! create answers it ([`Complete::after`]).
//!
//! An absent name answered here is not cached by the kernel (no promise covers the name on
//! its own once the directory's is used up), so the next look-up comes here again.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use tessera_client::{Name, Notice};

/// Names (and directories) kept at most, about 100 bytes each.
const NAMES_MAX: usize = 1 << 18;

#[derive(Default)]
pub(crate) struct Complete {
    dirs: Mutex<Dirs>,
    /// Signalled when creates answered ahead are in.
    landed: Condvar,
    /// Creates answered ahead and not yet in: the fast way to see there are none.
    in_flight: AtomicUsize,
}

#[derive(Default)]
struct Dirs {
    names: HashMap<u64, HashSet<Name>>,
    kept: usize,
    /// Notices that ended completeness so far.
    cuts: u64,
    max: usize,
    /// Creates answered ahead and not yet in, by directory and by new inode.
    ahead: HashMap<u64, usize>,
    /// What to run once the last of them is in, by the same keys ([`Complete::after`]).
    then: HashMap<u64, Vec<Then>>,
}

/// Work left for the thread that lands a create.
type Then = Box<dyn FnOnce() + Send>;

impl Complete {
    fn with_max(max: usize) -> Self {
        Self {
            dirs: Mutex::new(Dirs {
                max,
                ..Dirs::default()
            }),
            ..Self::default()
        }
    }

    pub(crate) fn new() -> Self {
        Self::with_max(NAMES_MAX)
    }

    fn dirs(&self) -> MutexGuard<'_, Dirs> {
        self.dirs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Note it before making a directory, to pass to [`Self::made`].
    pub(crate) fn cuts(&self) -> u64 {
        self.dirs().cuts
    }

    /// This mount made directory `dir`, having noted `cuts` before it asked.
    pub(crate) fn made(&self, cuts: u64, dir: u64) {
        let mut d = self.dirs();
        if d.cuts == cuts && d.kept < d.max && !d.names.contains_key(&dir) {
            d.names.insert(dir, HashSet::new());
            d.kept += 1;
        }
    }

    /// This mount is about to add `name` to `dir`.
    pub(crate) fn adding(&self, dir: u64, name: &[u8]) {
        let d = &mut *self.dirs();
        let Some(names) = d.names.get_mut(&dir) else {
            return;
        };
        if names.contains(name) {
            return;
        }
        if d.kept < d.max {
            names.insert(name.to_vec());
            d.kept += 1;
        } else {
            // Forgotten rather than kept incomplete: look-ups there ask the server again.
            d.kept -= names.len() + 1;
            d.names.remove(&dir);
        }
    }

    /// If `name` is certainly absent from `dir`, records it as being added there by a create
    /// answered ahead, of inode `ino`: true. [`Self::landed`] must follow.
    pub(crate) fn ahead(&self, dir: u64, name: &[u8], ino: u64) -> bool {
        let d = &mut *self.dirs();
        let Some(names) = d.names.get_mut(&dir) else {
            return false;
        };
        if d.kept >= d.max || names.contains(name) {
            return false;
        }
        names.insert(name.to_vec());
        d.kept += 1;
        for key in [dir, ino] {
            *d.ahead.entry(key).or_default() += 1;
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// The create of `ino` in `dir` answered ahead is in, or failed.
    pub(crate) fn landed(&self, dir: u64, ino: u64) {
        let mut d = self.dirs();
        let mut due = Vec::new();
        for key in [dir, ino] {
            if let Some(n) = d.ahead.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    d.ahead.remove(&key);
                    due.extend(d.then.remove(&key).into_iter().flatten());
                }
            }
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        drop(d);
        self.landed.notify_all();
        for then in due {
            then();
        }
    }

    /// Runs `then` once no create answered ahead in directory `ino`, or of inode `ino`, is on
    /// its way: now, on this thread, or on the thread that lands the last of them. Unlike
    /// [`Self::settle`], no thread waits meanwhile, and none has to be woken: a close's FLUSH
    /// is answered by the thread that heard its create is in.
    /// Boxed only if it has to wait.
    pub(crate) fn after(&self, ino: u64, then: impl FnOnce() + Send + 'static) {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            let mut d = self.dirs();
            if d.ahead.contains_key(&ino) {
                d.then.entry(ino).or_default().push(Box::new(then));
                return;
            }
        }
        then();
    }

    /// Blocks while creates answered ahead in directory `ino`, or of inode `ino`, are on their
    /// way.
    pub(crate) fn settle(&self, ino: u64) {
        if self.in_flight.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut d = self.dirs();
        while d.ahead.contains_key(&ino) {
            d = self.landed.wait(d).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Are creates answered ahead in directory or of inode `ino` on their way?
    pub(crate) fn unsettled(&self, ino: u64) -> bool {
        self.in_flight.load(Ordering::SeqCst) > 0 && self.dirs().ahead.contains_key(&ino)
    }

    /// Is `name` certainly absent from `dir`?
    pub(crate) fn absent(&self, dir: u64, name: &[u8]) -> bool {
        self.dirs()
            .names
            .get(&dir)
            .is_some_and(|names| !names.contains(name))
    }

    /// A notice arrived from a server.
    pub(crate) fn heard(&self, n: &Notice) {
        let mut d = self.dirs();
        match n {
            Notice::Listing { dir } => {
                if let Some(names) = d.names.remove(dir) {
                    d.kept -= names.len() + 1;
                }
            }
            Notice::Reset => {
                d.names.clear();
                d.kept = 0;
            }
            Notice::Attr { .. } | Notice::Entry { .. } => return,
        }
        d.cuts += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_this_mount_added_exist_until_a_notice_ends_it() {
        let c = Complete::new();
        assert!(!c.absent(7, b"x"), "not made here: ask the server");
        let cuts = c.cuts();
        c.made(cuts, 7);
        assert!(c.absent(7, b"x"));
        c.adding(7, b"x");
        assert!(!c.absent(7, b"x") && c.absent(7, b"y"));
        c.heard(&Notice::Entry {
            dir: 7,
            name: b"y".to_vec(),
        });
        assert!(c.absent(7, b"y"), "names removed elsewhere do not matter");
        c.heard(&Notice::Listing { dir: 7 });
        assert!(!c.absent(7, b"y"));
        assert_eq!(c.dirs().kept, 0);
    }

    /// A create answered ahead takes its name at once; requests about the directory or the
    /// new inode wait until it lands, and a recall ends further ones (not those in flight).
    #[test]
    fn creates_ahead_hold_their_directory_and_inode_until_they_land() {
        let c = std::sync::Arc::new(Complete::new());
        assert!(!c.ahead(7, b"x", 70), "only where every name is known");
        c.made(c.cuts(), 7);
        assert!(c.ahead(7, b"x", 70));
        assert!(!c.ahead(7, b"x", 71), "the name is taken");
        assert!(c.unsettled(7) && c.unsettled(70) && !c.unsettled(8));
        c.heard(&Notice::Listing { dir: 7 });
        assert!(!c.ahead(7, b"y", 72), "recalled: no more ahead");
        assert!(c.unsettled(7), "the one in flight still counts");
        let waiter = {
            let c = c.clone();
            std::thread::spawn(move || c.settle(7))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished());
        c.landed(7, 70);
        waiter.join().unwrap();
        assert!(!c.unsettled(7) && !c.unsettled(70));
        c.settle(70);
    }

    /// Work queued behind a create answered ahead runs once, on the thread that lands the
    /// last create of its key; with none on its way, at once.
    #[test]
    fn work_after_creates_ahead_runs_when_the_last_one_lands() {
        use std::sync::atomic::AtomicU32;
        use std::sync::Arc;
        let c = Complete::new();
        let ran = Arc::new(AtomicU32::new(0));
        let count = |ran: &Arc<AtomicU32>| {
            let ran = ran.clone();
            Box::new(move || {
                ran.fetch_add(1, Ordering::SeqCst);
            }) as Then
        };
        c.after(70, count(&ran));
        assert_eq!(ran.load(Ordering::SeqCst), 1, "nothing on its way: at once");
        c.made(c.cuts(), 7);
        assert!(c.ahead(7, b"x", 70) && c.ahead(7, b"y", 71));
        c.after(70, count(&ran));
        c.after(7, count(&ran));
        c.after(72, count(&ran));
        assert_eq!(
            ran.load(Ordering::SeqCst),
            2,
            "only the one about another inode"
        );
        c.landed(7, 70);
        assert_eq!(
            ran.load(Ordering::SeqCst),
            3,
            "the file's work, not the directory's"
        );
        c.landed(7, 71);
        assert_eq!(
            ran.load(Ordering::SeqCst),
            4,
            "the directory's, with its last create"
        );
        assert!(c.dirs().then.is_empty());
    }

    #[test]
    fn a_notice_while_the_directory_was_made_or_a_reset_forgets_it() {
        let c = Complete::new();
        let cuts = c.cuts();
        c.heard(&Notice::Listing { dir: 8 });
        c.made(cuts, 7);
        assert!(!c.absent(7, b"x"), "the notice may have been about 7");
        c.made(c.cuts(), 7);
        c.made(c.cuts(), 9);
        c.heard(&Notice::Reset);
        assert!(!c.absent(7, b"x") && !c.absent(9, b"x"));
    }

    #[test]
    fn a_directory_past_the_bound_is_forgotten_not_kept_incomplete() {
        let c = Complete::with_max(3);
        c.made(c.cuts(), 7);
        c.made(c.cuts(), 8);
        c.adding(7, b"a");
        c.adding(7, b"a");
        c.adding(8, b"b");
        assert!(!c.absent(8, b"b") && !c.absent(8, b"c"));
        assert!(c.absent(7, b"b"));
        assert_eq!(c.dirs().kept, 2);
        c.adding(7, b"b");
        c.made(c.cuts(), 9);
        assert!(!c.absent(9, b"x"), "no room");
    }
}
