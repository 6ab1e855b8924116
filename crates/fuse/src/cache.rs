//! What the kernel may cache, and for how long: the decisions only, pure (no I/O, no replies),
//! so each is tested here. The handlers act on them (`FUSE_NOTIFY_INVAL_*`, open flags, TTLs).
//!
//! - Attributes and entries: the lease time when the servers' promises cover the answer
//!   (`leases.rs` grants it), else `attr_ttl`; a name is cached absent only on a promise.
//! - Pages, close-to-open: an open keeps the kernel's pages of a file (`KEEP_CACHE`) only if
//!   the inode's change counter is where it was when they were current, moved on by this
//!   mount's own changes alone ([`Pages`]).
//! - Open flags: which handles bypass the page cache (`FOPEN_DIRECT_IO`), which need no FLUSH.
//! - After a write: a direct write drops the pages it replaced; a sequential writer through the
//!   page cache has the pages behind it dropped ([`drop_behind`]).

use crate::options::MountOptions;
use fuser::FopenFlags;
use std::collections::HashMap;
use std::ops::Range;
use std::time::Duration;

/// Bound on [`Pages`]; past it the map starts over (opens then drop pages once more).
const PAGES_MAX: usize = 1 << 16;
/// Drop-behind of a sequential writer through the page cache: the kernel keeps this much of
/// what it wrote last (for reading back), and the pages before it are dropped this much at a
/// time.
const DROP_BEHIND_KEEP: u64 = 64 << 20;
const DROP_BEHIND_STEP: u64 = 16 << 20;

/// The mount options that decide what the kernel caches.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    attr_ttl: Duration,
    lease: Duration,
    direct_io: bool,
    writeback_cache: bool,
}

/// What readdirplus may do with the attributes a listing brought ([`Policy::listed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Listed {
    /// The servers' promise on the listing's names and attributes still holds: answers from it
    /// may be leased.
    pub leasable: bool,
    /// The attributes may be handed out as they came (else each is asked for again).
    pub fresh: bool,
}

/// What follows a write answered, for the kernel's pages of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterWrite {
    Nothing,
    /// A direct write: drop the pages it replaced (not every kernel does), before the answer.
    DropWritten,
    /// Through the page cache: drop what lies behind a sequential writer ([`drop_behind`]),
    /// after the answer (the kernel holds the write's pages locked until then).
    DropBehind,
}

impl Policy {
    pub(crate) fn new(opts: &MountOptions) -> Self {
        Self {
            attr_ttl: opts.attr_ttl,
            lease: opts.lease,
            direct_io: opts.direct_io,
            writeback_cache: opts.writeback_cache,
        }
    }

    /// Does the mount take the servers' promises (leases, directories it knows every name of)?
    /// Not without a lease time, nor when the kernel caches nothing anyway.
    pub(crate) fn leases(&self) -> bool {
        !(self.lease.is_zero() || self.attr_ttl.is_zero())
    }

    /// Does the kernel cache attributes at all? If so, each open drops those it holds
    /// (close-to-open), and listings bring attributes (readdirplus).
    pub(crate) fn caches_attrs(&self) -> bool {
        !self.attr_ttl.is_zero()
    }

    pub(crate) fn writeback_cache(&self) -> bool {
        self.writeback_cache
    }

    /// How long the kernel may keep an answer: the lease time if the servers' promises cover
    /// it (`leased`), else `attr_ttl`.
    pub(crate) fn ttl(&self, leased: bool) -> &Duration {
        if leased {
            &self.lease
        } else {
            &self.attr_ttl
        }
    }

    /// How long the kernel may remember that a name does not exist: only on the servers'
    /// promise to tell when it appears (an open after another node's create must find the
    /// file); otherwise not at all (ENOENT).
    pub(crate) fn absent_ttl(&self, leased: bool) -> Option<&Duration> {
        leased.then_some(&self.lease)
    }

    /// Is an answer this old as young as the kernel may keep it without a promise?
    pub(crate) fn young(&self, age: Duration) -> bool {
        age < self.attr_ttl
    }

    /// A listing asked for when `heard_then` notices were heard (None: no promises), now
    /// `heard_now`, `age` old, with no namespace change through this mount since
    /// (`unchanged_here`: the servers do not tell a mount of its own changes).
    pub(crate) fn listed(
        &self,
        unchanged_here: bool,
        heard_then: Option<u64>,
        heard_now: Option<u64>,
        age: Duration,
    ) -> Listed {
        let leasable = unchanged_here && heard_then.is_some() && heard_then == heard_now;
        Listed {
            leasable,
            fresh: leasable || self.young(age),
        }
    }

    /// Whether a handle opened with open(2) `flags` appends where the mount places it
    /// (`Handles::append`), not where the kernel put the write: not with the writeback cache,
    /// whose writes are pages at their real offsets.
    pub(crate) fn places_appends(&self, flags: i32) -> bool {
        flags & libc::O_APPEND != 0 && !self.writeback_cache
    }

    /// Open flags for a handle opened with open(2) `flags`.
    ///
    /// Write-only handles bypass the page cache too: each write(2) is one request either way
    /// (without the writeback cache), and nothing can read pages through them, so filling
    /// pages would only cost a copy on the writer's path. Read-write handles keep it: direct,
    /// fio's 1 MiB writes ran up to 2x faster, but reading back through the handle (temporary
    /// files, HDF5, SQLite) 8-30x slower (BENCHMARKS.md).
    ///
    /// An appending handle bypasses it as well: its writes land where the mount places them
    /// (`OpenFile::append`), which may not be where the kernel would have put their pages.
    ///
    /// A read-only handle has nothing to publish at close: the kernel need not send FLUSH.
    pub(crate) fn open_flags(&self, flags: i32) -> FopenFlags {
        let access = flags & libc::O_ACCMODE;
        let write_only = access == libc::O_WRONLY && !self.writeback_cache;
        let mut out = FopenFlags::empty();
        if self.direct_io || write_only || self.places_appends(flags) {
            out |= FopenFlags::FOPEN_DIRECT_IO;
        }
        if access == libc::O_RDONLY {
            out |= FopenFlags::FOPEN_NOFLUSH;
        }
        out
    }

    /// May an open keep the kernel's pages of the file, `current` as [`Pages::opened`] says?
    pub(crate) fn keep_cache(&self, current: bool) -> bool {
        current && !self.direct_io
    }

    /// What to do with the kernel's pages after a write through a handle opened `direct`
    /// (`FOPEN_DIRECT_IO`); `page_writeback`: the write is the kernel writing back pages of a
    /// mapping (or of the writeback cache), which are the pages, one of them waiting for this
    /// very answer.
    pub(crate) fn after_write(&self, direct: bool, page_writeback: bool) -> AfterWrite {
        if page_writeback {
            AfterWrite::Nothing
        } else if direct {
            AfterWrite::DropWritten
        } else if self.writeback_cache {
            AfterWrite::Nothing
        } else {
            AfterWrite::DropBehind
        }
    }
}

/// For each file whose pages the kernel may hold, the inode `change` they are current with:
/// set at an open that dropped them, moved on by this mount's own changes (its writes went
/// through the page cache). An open finding the counter there keeps them.
pub(crate) struct Pages {
    current: HashMap<u64, u64>,
    max: usize,
}

impl Default for Pages {
    fn default() -> Self {
        Self::with_max(PAGES_MAX)
    }
}

impl Pages {
    fn with_max(max: usize) -> Self {
        Self {
            current: HashMap::new(),
            max,
        }
    }

    /// Close-to-open for data: an open just fetched `ino` at `change`; are the kernel's pages
    /// of it current? Only if nobody changed the file since they were; otherwise the open drops
    /// them, and they are current again from here on.
    pub(crate) fn opened(&mut self, ino: u64, change: u64) -> bool {
        if self.current.get(&ino) == Some(&change) {
            return true;
        }
        if self.current.len() >= self.max {
            self.current.clear();
        }
        self.current.insert(ino, change);
        false
    }

    /// This mount changed `ino` to `change` (its writes also went to the kernel's pages): the
    /// pages stay current if that change was the only one since they were.
    pub(crate) fn changed(&mut self, ino: u64, change: u64) {
        if let Some(c) = self.current.get_mut(&ino) {
            if *c + 1 == change {
                *c = change;
            } else {
                self.current.remove(&ino);
            }
        }
    }
}

/// Drop-behind: a handle writing a file from start to end through the page cache leaves the
/// kernel a copy of everything it wrote, which the servers hold too. Those pages are fresh
/// memory for every write (faulted in and filled; 0.4-0.6 GB/s for a 4 GiB fio write against
/// 2.0-2.2 with O_DIRECT, BENCHMARKS.md) and double the node's memory for the file. Past the
/// last [`DROP_BEHIND_KEEP`] bytes they are dropped, [`DROP_BEHIND_STEP`] at a time, so new
/// writes reuse them; reading back the start of a long file then asks the servers.
///
/// The write `[offset, offset + n)` was answered; the handle's previous write ended at
/// `prev_end`, and its pages were dropped up to `dropped`: the range to drop now, if any.
pub(crate) fn drop_behind(prev_end: u64, offset: u64, n: u64, dropped: u64) -> Option<Range<u64>> {
    let to = (offset + n).saturating_sub(DROP_BEHIND_KEEP) / DROP_BEHIND_STEP * DROP_BEHIND_STEP;
    (prev_end == offset && to > dropped).then_some(dropped..to)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(f: impl FnOnce(&mut MountOptions)) -> Policy {
        let mut opts = MountOptions::default();
        f(&mut opts);
        Policy::new(&opts)
    }

    #[test]
    fn pages_stay_current_through_this_mounts_changes_only() {
        let mut p = Pages::default();
        assert!(!p.opened(1, 5), "never seen: the open drops them");
        assert!(p.opened(1, 5), "nobody changed it since");
        p.changed(1, 6);
        assert!(p.opened(1, 6), "our own write moved them on");
        p.changed(1, 8);
        assert!(!p.opened(1, 8), "someone else changed it in between");
        assert!(p.opened(1, 8));
        p.changed(2, 1);
        assert!(
            !p.opened(2, 1),
            "a change to a file whose pages were never current"
        );
    }

    #[test]
    fn pages_start_over_at_the_bound() {
        let mut p = Pages::with_max(2);
        assert!(!p.opened(1, 1) && !p.opened(2, 1));
        assert!(!p.opened(3, 1), "full: forgets all");
        assert!(!p.opened(1, 1), "forgotten, so dropped once more");
        assert!(p.opened(3, 1));
    }

    #[test]
    fn the_cache_is_never_kept_under_direct_io() {
        assert!(policy(|_| {}).keep_cache(true));
        assert!(!policy(|_| {}).keep_cache(false));
        assert!(!policy(|o| o.direct_io = true).keep_cache(true));
    }

    #[test]
    fn write_only_and_appending_handles_bypass_the_page_cache() {
        let p = policy(|_| {});
        let direct = |p: &Policy, flags| p.open_flags(flags).contains(FopenFlags::FOPEN_DIRECT_IO);
        assert!(direct(&p, libc::O_WRONLY));
        assert!(!direct(&p, libc::O_RDWR));
        assert!(direct(&p, libc::O_RDWR | libc::O_APPEND));
        assert!(p.places_appends(libc::O_WRONLY | libc::O_APPEND));
        let noflush = |flags| p.open_flags(flags).contains(FopenFlags::FOPEN_NOFLUSH);
        assert!(noflush(libc::O_RDONLY) && !noflush(libc::O_RDWR) && !noflush(libc::O_WRONLY));

        let wb = policy(|o| o.writeback_cache = true);
        assert!(!direct(&wb, libc::O_WRONLY) && !direct(&wb, libc::O_RDWR | libc::O_APPEND));
        assert!(!wb.places_appends(libc::O_WRONLY | libc::O_APPEND));

        let dio = policy(|o| o.direct_io = true);
        assert!(direct(&dio, libc::O_RDONLY) && direct(&dio, libc::O_RDWR));
    }

    #[test]
    fn answers_are_kept_long_only_on_a_promise_and_absence_only_then() {
        let p = policy(|_| {});
        assert_eq!(*p.ttl(true), Duration::from_secs(60));
        assert_eq!(*p.ttl(false), Duration::from_secs(1));
        assert_eq!(p.absent_ttl(true), Some(&Duration::from_secs(60)));
        assert_eq!(p.absent_ttl(false), None);
        assert!(p.leases() && p.caches_attrs());
        assert!(!policy(|o| o.lease = Duration::ZERO).leases());
        let uncached = policy(|o| o.attr_ttl = Duration::ZERO);
        assert!(!uncached.leases() && !uncached.caches_attrs());
    }

    #[test]
    fn a_listing_is_leasable_while_nothing_was_heard_or_changed_here_since() {
        let p = policy(|_| {});
        let (young, old) = (Duration::ZERO, Duration::from_secs(5));
        let both = Listed {
            leasable: true,
            fresh: true,
        };
        assert_eq!(p.listed(true, Some(3), Some(3), old), both);
        let by_age = |fresh| Listed {
            leasable: false,
            fresh,
        };
        assert_eq!(
            p.listed(true, Some(3), Some(4), old),
            by_age(false),
            "a notice"
        );
        assert_eq!(
            p.listed(false, Some(3), Some(3), young),
            by_age(true),
            "our change"
        );
        assert_eq!(
            p.listed(true, None, None, old),
            by_age(false),
            "no promises"
        );
    }

    #[test]
    fn what_a_write_does_to_the_pages() {
        let p = policy(|_| {});
        assert_eq!(p.after_write(true, false), AfterWrite::DropWritten);
        assert_eq!(p.after_write(false, false), AfterWrite::DropBehind);
        assert_eq!(p.after_write(true, true), AfterWrite::Nothing);
        assert_eq!(p.after_write(false, true), AfterWrite::Nothing);
        let wb = policy(|o| o.writeback_cache = true);
        assert_eq!(wb.after_write(false, false), AfterWrite::Nothing);
    }

    #[test]
    fn a_sequential_writer_keeps_only_its_tail_dropped_a_step_at_a_time() {
        const MIB: u64 = 1 << 20;
        assert_eq!(
            drop_behind(0, 0, MIB, 0),
            None,
            "nothing behind the kept tail yet"
        );
        let end = DROP_BEHIND_KEEP + DROP_BEHIND_STEP;
        assert_eq!(
            drop_behind(end - MIB, end - MIB, MIB, 0),
            Some(0..DROP_BEHIND_STEP)
        );
        assert_eq!(
            drop_behind(end, end, MIB, DROP_BEHIND_STEP),
            None,
            "less than a step more"
        );
        assert_eq!(drop_behind(0, end - MIB, MIB, 0), None, "not sequential");
        let far = DROP_BEHIND_KEEP + 3 * DROP_BEHIND_STEP + 5;
        assert_eq!(
            drop_behind(far - MIB, far - MIB, MIB, DROP_BEHIND_STEP),
            Some(DROP_BEHIND_STEP..3 * DROP_BEHIND_STEP)
        );
    }
}
