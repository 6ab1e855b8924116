//! The in-memory store of one node: its partitions of stripes, inodes and directory entries.
//! Pure (no I/O): every operation is a short critical section on one partition.
//!
//! This file holds the partitions, their locks and the capacity accounting; the operations are
//! in four parts: whole partitions for copies ([`copy`]), stripes ([`stripes`]), inodes
//! ([`inodes`]) and directory entries ([`dirs`]).

mod copy;
mod dirs;
mod inodes;
mod stripes;
#[cfg(test)]
mod tests;

pub use copy::{Delta, Snapshot};

use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use tessera_placement::{Ino, PartitionId};
use tessera_proto::{BufferPool, DirEntry, ErrorCode, Inode, Name};

/// Bytes charged for an inode and for a directory entry beyond its name: rough, but it keeps a
/// metadata-only workload from growing without bound.
const INODE_COST: u64 = 256;
const ENTRY_COST: u64 = 32;

#[derive(Default)]
struct Partition {
    /// Stripes by file, then index: dropping or truncating a file touches only its stripes.
    stripes: HashMap<Ino, BTreeMap<u64, Bytes>>,
    inodes: HashMap<Ino, Inode>,
    entries: Entries,
    /// Changes refused (retryable `NotReady`) while the last round of a sync reads the
    /// partition: checked under the partition's lock, so no change slips past the snapshot.
    fenced: bool,
    /// The bytes charged for what this partition holds: the store's `used` is their sum.
    used: u64,
}

/// A partition's directory entries, and how many of them name each inode: an inode named here
/// is not deleted when its link count drops to zero (a client that dropped one link too many),
/// so that a name never leads to nothing where the server can see both.
#[derive(Default)]
struct Entries {
    /// By (directory, name): a listing is a range scan.
    map: BTreeMap<(Ino, Name), DirEntry>,
    named: HashMap<Ino, u32>,
}

impl Entries {
    fn insert(&mut self, key: (Ino, Name), e: DirEntry) -> Option<DirEntry> {
        *self.named.entry(e.ino).or_default() += 1;
        let old = self.map.insert(key, e);
        if let Some(old) = &old {
            self.unname(old.ino);
        }
        old
    }

    fn remove(&mut self, key: &(Ino, Name)) -> Option<DirEntry> {
        let old = self.map.remove(key)?;
        self.unname(old.ino);
        Some(old)
    }

    fn unname(&mut self, ino: Ino) {
        if let std::collections::hash_map::Entry::Occupied(mut n) = self.named.entry(ino) {
            *n.get_mut() -= 1;
            if *n.get() == 0 {
                n.remove();
            }
        }
    }

    fn names(&self, ino: Ino) -> bool {
        self.named.contains_key(&ino)
    }

    /// Does directory `dir` have entries?
    fn lists(&self, dir: Ino) -> bool {
        self.map
            .range((dir, Vec::new())..)
            .next()
            .is_some_and(|((d, _), _)| *d == dir)
    }
}

/// Counters reported in heartbeats.
#[derive(Default)]
pub struct Counters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub meta_ops: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
}

pub struct Store {
    partitions: Vec<Mutex<Partition>>,
    stripe_size: u32,
    capacity: u64,
    used: AtomicU64,
    stripes: AtomicU64,
    inodes: AtomicU64,
    /// Which partitions here hold stripes of which file, by file: truncating or dropping a
    /// file visits just those, and finds every stripe it ever wrote, also past its size (a
    /// write that failed, a handle that never published). Locked after a partition, never
    /// before one.
    placed: Mutex<BTreeSet<(Ino, PartitionId)>>,
    pool: std::sync::Arc<BufferPool>,
    pub counters: Counters,
}

type R<T> = Result<T, ErrorCode>;

/// What dropping a link or closing a handle did to an inode: the links left, and whether it was
/// a file deleted, whose stripes are to be dropped ([`Store::drop_files`]).
pub type Links = (u32, bool);

/// What an unlink removed: the entry, the links verdict if the inode was in the same
/// partition, and the directory after.
pub type Unlinked = (DirEntry, Option<Links>, Inode);

/// What a rename did (`Response::Renamed`).
#[derive(Debug, PartialEq, Eq)]
pub struct Renamed {
    /// The entry renamed; `None` if nothing changed.
    pub moved: Option<DirEntry>,
    /// The moved inode lives here and got its ctime.
    pub ctime_set: bool,
    pub replaced: Option<DirEntry>,
    /// The replaced file's inode lived here and lost its link: its links left, and whether
    /// it is gone with data to drop.
    pub links: Option<Links>,
    /// The directory after.
    pub dir: Inode,
}

/// A mutex's guard; a panic elsewhere while it was held leaves nothing half-done here.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn entry_cost(name: &[u8]) -> u64 {
    ENTRY_COST + name.len() as u64
}

impl Store {
    #[must_use]
    pub fn new(
        partitions: u32,
        stripe_size: u32,
        capacity: u64,
        pool: std::sync::Arc<BufferPool>,
    ) -> Self {
        Self {
            partitions: (0..partitions).map(|_| Mutex::default()).collect(),
            stripe_size,
            capacity,
            used: AtomicU64::new(0),
            stripes: AtomicU64::new(0),
            inodes: AtomicU64::new(0),
            placed: Mutex::default(),
            pool,
            counters: Counters::default(),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    /// The stripe buffers this store draws from and gives back to.
    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
    pub fn stripe_count(&self) -> u64 {
        self.stripes.load(Ordering::Relaxed)
    }
    pub fn inode_count(&self) -> u64 {
        self.inodes.load(Ordering::Relaxed)
    }

    fn part(&self, p: PartitionId) -> R<MutexGuard<'_, Partition>> {
        let m = self
            .partitions
            .get(p as usize)
            .ok_or_else(|| ErrorCode::Invalid(format!("no partition {p}")))?;
        Ok(lock(m))
    }

    /// The partition, for a change: refused while the partition is fenced for a sync.
    fn part_mut(&self, p: PartitionId) -> R<MutexGuard<'_, Partition>> {
        let part = self.part(p)?;
        if part.fenced {
            return Err(ErrorCode::NotReady(format!(
                "partition {p} is finishing a copy to another server"
            )));
        }
        Ok(part)
    }

    /// Reserves `more` bytes of capacity for a partition whose charge is `used`, or says ENOSPC
    /// and reserves nothing.
    fn charge(&self, used: &mut u64, more: u64) -> R<()> {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let next = cur
                .checked_add(more)
                .filter(|&n| n <= self.capacity)
                .ok_or(ErrorCode::NoSpace)?;
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        *used += more;
        self.check_charge(*used);
        Ok(())
    }

    /// Charges `more` bytes whatever the capacity: what a copy brings that is not stripes (the
    /// primary had room for it; refusing it half-way would leave a namespace torn).
    fn charge_anyway(&self, used: &mut u64, more: u64) {
        self.used.fetch_add(more, Ordering::Relaxed);
        *used += more;
        self.check_charge(*used);
    }

    /// Gives back `less` bytes of a partition whose charge is `used`.
    fn refund(&self, used: &mut u64, less: u64) {
        debug_assert!(
            *used >= less,
            "a partition charged {used} bytes gives back {less}"
        );
        *used = used.saturating_sub(less);
        self.refund_store(less);
    }

    /// Gives back `less` bytes of the store's charge alone (a partition emptied at once).
    fn refund_store(&self, less: u64) {
        let before = self.used.fetch_sub(less, Ordering::Relaxed);
        debug_assert!(
            before >= less,
            "the store charged {before} bytes gives back {less}"
        );
    }

    /// A partition's charge is part of the store's: the store's is changed first when charging
    /// and last when giving back, so it is never below any partition's.
    fn check_charge(&self, part_used: u64) {
        debug_assert!(
            part_used <= self.used(),
            "a partition charged {part_used} bytes, the whole store {}",
            self.used()
        );
    }

    /// Debug builds: is a stripe of `len` bytes within the stripe size?
    fn check_stripe(&self, len: usize) {
        debug_assert!(
            len <= self.stripe_size as usize,
            "a stripe of {len} bytes, past the stripe size {}",
            self.stripe_size
        );
    }
}
