//! The in-memory store of one node: its partitions of stripes, inodes and directory entries.
//! Pure (no I/O): every operation is a short critical section on one partition.

use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use tessera_placement::{meta_partition, Ino, PartitionId};
use tessera_proto::{
    check_name, BufferPool, DirEntry, ErrorCode, FileKind, Inode, Listed, Name, SetAttr, SyncItem,
    Timespec, DIR_PAGE_INODE_BYTES, DIR_PAGE_MAX,
};

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
}

/// A partition's state at one instant, for syncing it to another node. Stripes are shared
/// with the store (`Bytes` clones): while a snapshot holds a stripe, a write to it copies it,
/// so an unchanged stripe is recognised by its buffer pointer.
#[derive(Default)]
pub struct Snapshot {
    stripes: HashMap<Ino, BTreeMap<u64, Bytes>>,
    inodes: HashMap<Ino, Inode>,
    entries: BTreeMap<(Ino, Name), DirEntry>,
}

/// The changes from one snapshot to the next, in the order a receiver applies them; `data`
/// holds the bytes of each `SyncItem::Stripe`, in item order.
#[derive(Default)]
pub struct Delta {
    pub items: Vec<SyncItem>,
    pub data: Vec<Bytes>,
}

fn same_bytes(a: &Bytes, b: &Bytes) -> bool {
    a.as_ptr() == b.as_ptr() && a.len() == b.len()
}

impl Snapshot {
    /// What turns `old` (nothing, for a first round) into `self`.
    #[must_use]
    pub fn delta_from(&self, old: Option<&Snapshot>) -> Delta {
        let empty = Snapshot::default();
        let old = old.unwrap_or(&empty);
        let mut d = Delta::default();
        for (&file, stripes) in &self.stripes {
            let before = old.stripes.get(&file);
            for (&index, b) in stripes {
                if before
                    .and_then(|o| o.get(&index))
                    .is_some_and(|o| same_bytes(o, b))
                {
                    continue;
                }
                d.items.push(SyncItem::Stripe {
                    file,
                    index,
                    len: b.len() as u32,
                });
                d.data.push(b.clone());
            }
        }
        for (&file, stripes) in &old.stripes {
            let now = self.stripes.get(&file);
            for &index in stripes.keys() {
                if now.is_none_or(|n| !n.contains_key(&index)) {
                    d.items.push(SyncItem::NoStripe { file, index });
                }
            }
        }
        for (ino, i) in &self.inodes {
            if old.inodes.get(ino) != Some(i) {
                d.items.push(SyncItem::Inode(i.clone()));
            }
        }
        for ino in old.inodes.keys() {
            if !self.inodes.contains_key(ino) {
                d.items.push(SyncItem::NoInode(*ino));
            }
        }
        for ((dir, name), e) in &self.entries {
            if old.entries.get(&(*dir, name.clone())) != Some(e) {
                d.items.push(SyncItem::Entry {
                    dir: *dir,
                    name: name.clone(),
                    entry: *e,
                });
            }
        }
        for (dir, name) in old.entries.keys() {
            if !self.entries.contains_key(&(*dir, name.clone())) {
                d.items.push(SyncItem::NoEntry {
                    dir: *dir,
                    name: name.clone(),
                });
            }
        }
        d
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

    // ---- whole partitions (sync) ----

    /// Fences partition `p` against changes (or lifts the fence).
    pub fn fence(&self, p: PartitionId, on: bool) -> R<()> {
        self.part(p)?.fenced = on;
        Ok(())
    }

    #[must_use]
    pub fn is_fenced(&self, p: PartitionId) -> bool {
        self.part(p).is_ok_and(|part| part.fenced)
    }

    /// The partition's state now (stripes shared, not copied).
    pub fn snapshot(&self, p: PartitionId) -> R<Snapshot> {
        let part = self.part(p)?;
        Ok(Snapshot {
            stripes: part.stripes.clone(),
            inodes: part.inodes.clone(),
            entries: part.entries.map.clone(),
        })
    }

    /// Forgets everything partition `p` holds (a copy no longer wanted, or a sync restarting).
    pub fn clear(&self, p: PartitionId) -> R<()> {
        let mut part = self.part(p)?;
        let gone = std::mem::take(&mut *part);
        self.unplace(p, gone.stripes.keys().copied());
        drop(part);
        let mut freed = 0;
        for (_, stripes) in gone.stripes {
            for (_, b) in stripes {
                freed += b.len() as u64;
                self.stripes.fetch_sub(1, Ordering::Relaxed);
                self.pool.recycle(b);
            }
        }
        for (_, i) in gone.inodes {
            freed += INODE_COST + i.target.len() as u64;
            self.inodes.fetch_sub(1, Ordering::Relaxed);
        }
        freed += gone
            .entries
            .map
            .keys()
            .map(|(_, n)| entry_cost(n))
            .sum::<u64>();
        self.refund(freed);
        Ok(())
    }

    /// Applies a page of sync items to partition `p`; `data` holds the stripe bytes of the
    /// `Stripe` items, back to back. Checked against capacity item by item (ENOSPC stops it).
    pub fn apply_sync(&self, p: PartitionId, items: Vec<SyncItem>, data: &Bytes) -> R<()> {
        let mut part = self.part(p)?;
        let mut at = 0usize;
        for item in items {
            match item {
                SyncItem::Stripe { file, index, len } => {
                    let end = at
                        .checked_add(len as usize)
                        .filter(|&e| e <= data.len() && len <= self.stripe_size)
                        .ok_or_else(|| {
                            ErrorCode::Invalid("sync page shorter than its stripes".into())
                        })?;
                    let bytes = data.slice(at..end);
                    at = end;
                    let old = part.stripes.get(&file).and_then(|s| s.get(&index));
                    let old_len = old.map_or(0, |b| b.len() as u64);
                    self.charge((len as u64).saturating_sub(old_len))?;
                    self.refund(old_len.saturating_sub(len as u64));
                    // Copied out of the page, so the page's buffer is not pinned by one stripe.
                    let mut buf = self.pool.get(len as usize);
                    buf.extend_from_slice(&bytes);
                    let stripes = part.stripes.entry(file).or_insert_with(|| {
                        self.place(p, file);
                        BTreeMap::new()
                    });
                    if let Some(old) = stripes.insert(index, buf.freeze()) {
                        self.pool.recycle(old);
                    } else {
                        self.stripes.fetch_add(1, Ordering::Relaxed);
                    }
                }
                SyncItem::NoStripe { file, index } => {
                    if let Some(stripes) = part.stripes.get_mut(&file) {
                        if let Some(old) = stripes.remove(&index) {
                            self.refund(old.len() as u64);
                            self.stripes.fetch_sub(1, Ordering::Relaxed);
                            self.pool.recycle(old);
                        }
                        if stripes.is_empty() {
                            part.stripes.remove(&file);
                            self.unplace(p, [file]);
                        }
                    }
                }
                SyncItem::Inode(i) => {
                    let cost = INODE_COST + i.target.len() as u64;
                    match part.inodes.insert(i.ino, i) {
                        Some(old) => {
                            self.refund(INODE_COST + old.target.len() as u64);
                            self.used.fetch_add(cost, Ordering::Relaxed);
                        }
                        None => {
                            self.used.fetch_add(cost, Ordering::Relaxed);
                            self.inodes.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                SyncItem::NoInode(ino) => {
                    if let Some(old) = part.inodes.remove(&ino) {
                        self.refund(INODE_COST + old.target.len() as u64);
                        self.inodes.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                SyncItem::Entry { dir, name, entry } => {
                    let cost = entry_cost(&name);
                    if part.entries.insert((dir, name), entry).is_none() {
                        self.used.fetch_add(cost, Ordering::Relaxed);
                    }
                }
                SyncItem::NoEntry { dir, name } => {
                    if part.entries.remove(&(dir, name.clone())).is_some() {
                        self.refund(entry_cost(&name));
                    }
                }
            }
        }
        Ok(())
    }

    /// Reserves `more` bytes of capacity, or says ENOSPC and reserves nothing.
    fn charge(&self, more: u64) -> R<()> {
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
                Ok(_) => return Ok(()),
                Err(now) => cur = now,
            }
        }
    }

    fn refund(&self, less: u64) {
        self.used.fetch_sub(less, Ordering::Relaxed);
    }

    // ---- stripes ----

    /// Writes `data` at `offset` of a stripe. Checked against capacity before anything changes.
    pub fn write(&self, p: PartitionId, file: Ino, stripe: u64, offset: u32, data: Bytes) -> R<()> {
        let end = offset as usize + data.len();
        if end > self.stripe_size as usize {
            return Err(ErrorCode::Invalid(format!(
                "write to {offset}+{} crosses the stripe end",
                data.len()
            )));
        }
        let mut part = self.part_mut(p)?;
        let file_stripes = part.stripes.entry(file).or_default();
        let old = file_stripes.remove(&stripe);
        let old_len = old.as_ref().map_or(0, Bytes::len);
        let new_len = old_len.max(end);
        if let Err(e) = self.charge((new_len - old_len) as u64) {
            if let Some(old) = old {
                file_stripes.insert(stripe, old);
            } else if file_stripes.is_empty() {
                part.stripes.remove(&file);
            }
            return Err(e);
        }
        let existed = old.is_some();
        let stored = match old {
            // A whole stripe: keep the buffer it arrived in, no copy.
            _ if offset == 0 && data.len() == self.stripe_size as usize => {
                if let Some(old) = old {
                    self.pool.recycle(old);
                }
                data
            }
            None => {
                let mut buf = self.pool.get(end);
                buf.resize(offset as usize, 0);
                buf.extend_from_slice(&data);
                self.pool.recycle(data);
                buf.freeze()
            }
            Some(old) => {
                // In place when nobody reads the old bytes; otherwise copy on write.
                let mut buf = old.try_into_mut().unwrap_or_else(|shared| {
                    let mut b = self.pool.get(new_len);
                    b.extend_from_slice(&shared);
                    b
                });
                if buf.len() < end {
                    buf.resize(end, 0);
                }
                buf[offset as usize..end].copy_from_slice(&data);
                self.pool.recycle(data);
                buf.freeze()
            }
        };
        let file_stripes = part.stripes.entry(file).or_default();
        file_stripes.insert(stripe, stored);
        if !existed {
            self.stripes.fetch_add(1, Ordering::Relaxed);
            if file_stripes.len() == 1 {
                self.place(p, file);
            }
        }
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_written
            .fetch_add((end - offset as usize) as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Up to `len` bytes at `offset` of a stripe (fewer where it holds less), without copying.
    pub fn read(&self, p: PartitionId, file: Ino, stripe: u64, offset: u32, len: u32) -> R<Bytes> {
        let part = self.part(p)?;
        let data = part
            .stripes
            .get(&file)
            .and_then(|s| s.get(&stripe))
            .map_or_else(Bytes::new, |b| {
                let start = (offset as usize).min(b.len());
                b.slice(start..b.len().min(start + len as usize))
            });
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_read
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(data)
    }

    /// Notes that partition `p` here holds stripes of `file` (under `p`'s lock).
    fn place(&self, p: PartitionId, file: Ino) {
        lock(&self.placed).insert((file, p));
    }

    /// Notes that partition `p` here holds no more stripes of `files` (under `p`'s lock).
    fn unplace(&self, p: PartitionId, files: impl IntoIterator<Item = Ino>) {
        let mut placed = lock(&self.placed);
        for file in files {
            placed.remove(&(file, p));
        }
    }

    /// The partitions of `held` (sorted) that hold stripes of `file` here.
    fn placed_in(&self, held: &[PartitionId], file: Ino) -> Vec<PartitionId> {
        lock(&self.placed)
            .range((file, 0)..=(file, PartitionId::MAX))
            .map(|&(_, p)| p)
            .filter(|p| held.binary_search(p).is_ok())
            .collect()
    }

    /// Cuts `file`'s stripes in partition `p` to end at byte `size` of the file.
    fn cut(&self, p: PartitionId, file: Ino, size: u64) -> R<()> {
        let ss = u64::from(self.stripe_size);
        let mut part = self.part_mut(p)?;
        let Some(stripes) = part.stripes.get_mut(&file) else {
            return Ok(());
        };
        let first_gone = size.div_ceil(ss);
        for (_, b) in stripes.split_off(&first_gone) {
            self.refund(b.len() as u64);
            self.stripes.fetch_sub(1, Ordering::Relaxed);
            self.pool.recycle(b);
        }
        if !size.is_multiple_of(ss) {
            if let Some(b) = stripes.get_mut(&(size / ss)) {
                let keep = (size % ss) as usize;
                if b.len() > keep {
                    self.refund((b.len() - keep) as u64);
                    b.truncate(keep);
                }
            }
        }
        if stripes.is_empty() {
            part.stripes.remove(&file);
            self.unplace(p, [file]);
        }
        Ok(())
    }

    /// Cuts every stripe of `file` held here, in the partitions of `held` (sorted), to end at
    /// byte `size` of the file: also those past the size it had.
    pub fn truncate(&self, held: &[PartitionId], file: Ino, size: u64) -> R<()> {
        for p in self.placed_in(held, file) {
            self.cut(p, file, size)?;
        }
        Ok(())
    }

    /// Deletes every stripe of the deleted `files` held here, in the partitions of `held`
    /// (sorted), whatever the files' sizes were. A partition that refuses (fenced) does not
    /// stop the others; the first refusal is returned, for the caller to try again (drops are
    /// idempotent).
    pub fn drop_files(&self, held: &[PartitionId], files: &[Ino]) -> R<()> {
        let mut refused = Ok(());
        for &file in files {
            for p in self.placed_in(held, file) {
                if let Err(e) = self.cut(p, file, 0) {
                    refused = refused.and(Err(e));
                }
            }
        }
        refused
    }

    // ---- inodes ----

    fn meta_op(&self) {
        self.counters.meta_ops.fetch_add(1, Ordering::Relaxed);
    }

    pub fn inode_create(&self, p: PartitionId, inode: Inode) -> R<()> {
        self.meta_op();
        let mut part = self.part_mut(p)?;
        if part.inodes.contains_key(&inode.ino) {
            return Err(ErrorCode::Exists);
        }
        self.charge(INODE_COST + inode.target.len() as u64)?;
        self.inodes.fetch_add(1, Ordering::Relaxed);
        part.inodes.insert(inode.ino, inode);
        Ok(())
    }

    /// Applies `f` to inode `ino` and returns the result.
    fn with_inode<T>(&self, p: PartitionId, ino: Ino, f: impl FnOnce(&mut Inode) -> T) -> R<T> {
        self.meta_op();
        let mut part = self.part_mut(p)?;
        part.inodes.get_mut(&ino).map(f).ok_or(ErrorCode::NotFound)
    }

    pub fn inode_get(&self, p: PartitionId, ino: Ino) -> R<Inode> {
        self.meta_op();
        let part = self.part(p)?;
        part.inodes.get(&ino).cloned().ok_or(ErrorCode::NotFound)
    }

    pub fn inode_setattr(&self, p: PartitionId, ino: Ino, a: &SetAttr) -> R<Inode> {
        self.with_inode(p, ino, |i| {
            if a.size.is_some() {
                Self::resizable(i)?;
            }
            if let Some(m) = a.mode {
                i.mode = m & 0o7777;
            }
            if let Some(u) = a.uid {
                i.uid = u;
            }
            if let Some(g) = a.gid {
                i.gid = g;
            }
            if let Some(s) = a.size {
                i.size = s;
            }
            if let Some(t) = a.atime {
                i.atime = t;
            }
            if let Some(t) = a.mtime {
                i.mtime = t;
            }
            if let Some(d) = a.parent {
                i.parent = d;
            }
            i.ctime = a.ctime;
            i.change += 1;
            Ok(i.clone())
        })?
    }

    pub fn inode_extend(&self, p: PartitionId, ino: Ino, size: u64, mtime: Timespec) -> R<Inode> {
        self.with_inode(p, ino, |i| {
            Self::resizable(i)?;
            i.size = i.size.max(size);
            i.mtime = i.mtime.max(mtime);
            i.ctime = i.ctime.max(mtime);
            i.change += 1;
            Ok(i.clone())
        })?
    }

    /// Only a regular file's size is its own to change (a symbolic link's is its target's).
    fn resizable(i: &Inode) -> R<()> {
        match i.kind {
            FileKind::File => Ok(()),
            FileKind::Dir => Err(ErrorCode::IsDir),
            _ => Err(ErrorCode::Invalid(format!(
                "a {:?} has no size to change",
                i.kind
            ))),
        }
    }

    /// Takes a writer's extent back to `to` if the size is still `from`: nobody extended the
    /// file since. A size left as it was counts as no change.
    pub fn inode_retract(&self, p: PartitionId, ino: Ino, from: u64, to: u64) -> R<Inode> {
        self.with_inode(p, ino, |i| {
            Self::resizable(i)?;
            if i.size == from && to < from {
                i.size = to;
                i.change += 1;
            }
            Ok(i.clone())
        })?
    }

    /// Removes the inode if it has neither links nor open handles nor a name here. A file's
    /// stripes are then to be dropped whatever its size: a write that failed, or was never
    /// published, may have stored stripes past it.
    fn reap(&self, part: &mut Partition, ino: Ino) -> Links {
        match part.inodes.get(&ino) {
            Some(i) if i.nlink == 0 && i.open_count == 0 && !part.entries.names(ino) => {
                let i = part.inodes.remove(&ino).expect("present");
                self.refund(INODE_COST + i.target.len() as u64);
                self.inodes.fetch_sub(1, Ordering::Relaxed);
                (0, i.kind == FileKind::File)
            }
            Some(i) => (i.nlink, false),
            None => (0, false),
        }
    }

    pub fn inode_link(&self, p: PartitionId, ino: Ino, delta: i32, ctime: Timespec) -> R<Links> {
        self.meta_op();
        let mut part = self.part_mut(p)?;
        let i = part.inodes.get_mut(&ino).ok_or(ErrorCode::NotFound)?;
        i.nlink = i.nlink.saturating_add_signed(delta);
        i.ctime = ctime;
        i.change += 1;
        Ok(self.reap(&mut part, ino))
    }

    pub fn inode_open(&self, p: PartitionId, ino: Ino) -> R<Inode> {
        self.with_inode(p, ino, |i| {
            i.open_count = i.open_count.saturating_add(1);
            i.clone()
        })
    }

    pub fn inode_close(&self, p: PartitionId, ino: Ino) -> R<Links> {
        self.meta_op();
        let mut part = self.part_mut(p)?;
        let i = part.inodes.get_mut(&ino).ok_or(ErrorCode::NotFound)?;
        i.open_count = i.open_count.saturating_sub(1);
        Ok(self.reap(&mut part, ino))
    }

    // ---- directory entries (the directory's inode is in the same partition) ----

    fn dir_of(part: &mut Partition, dir: Ino) -> R<&mut Inode> {
        let d = part.inodes.get_mut(&dir).ok_or(ErrorCode::NotFound)?;
        if d.kind != FileKind::Dir {
            return Err(ErrorCode::NotDir);
        }
        Ok(d)
    }

    /// May `new` replace `old` under rename rules?
    fn replaceable(old: &DirEntry, new: &DirEntry) -> R<()> {
        match (old.kind == FileKind::Dir, new.kind == FileKind::Dir) {
            (true, false) => Err(ErrorCode::IsDir),
            (false, true) => Err(ErrorCode::NotDir),
            _ => Ok(()),
        }
    }

    /// Adjusts a directory after entries of kind `added`/`removed` changed: mtime, ctime, and
    /// its link count (2 + subdirectories).
    fn touch_dir(
        d: &mut Inode,
        added: Option<FileKind>,
        removed: Option<FileKind>,
        mtime: Timespec,
    ) {
        if added == Some(FileKind::Dir) {
            d.nlink += 1;
        }
        if removed == Some(FileKind::Dir) {
            d.nlink = d.nlink.saturating_sub(1);
        }
        d.mtime = mtime;
        d.ctime = mtime;
        d.change += 1;
    }

    pub fn dir_insert(
        &self,
        p: PartitionId,
        dir: Ino,
        name: Name,
        entry: DirEntry,
        replace: bool,
        mtime: Timespec,
    ) -> R<Option<DirEntry>> {
        self.meta_op();
        check_name(&name)?;
        let mut part = self.part_mut(p)?;
        Self::dir_of(&mut part, dir)?;
        // The inode, where it lives here, is there and of the entry's kind.
        match part.inodes.get(&entry.ino) {
            Some(i) if i.kind != entry.kind => {
                return Err(ErrorCode::Invalid(format!(
                    "inode {} is a {:?}, not a {:?}",
                    entry.ino, i.kind, entry.kind
                )))
            }
            None if meta_partition(entry.ino, self.partitions.len() as u32) == p => {
                return Err(ErrorCode::NotFound)
            }
            _ => {}
        }
        let key = (dir, name);
        let old = part.entries.map.get(&key).copied();
        if let Some(old) = &old {
            if !replace {
                return Err(ErrorCode::Exists);
            }
            Self::replaceable(old, &entry)?;
        } else {
            self.charge(entry_cost(&key.1))?;
        }
        part.entries.insert(key, entry);
        let d = Self::dir_of(&mut part, dir)?;
        Self::touch_dir(d, Some(entry.kind), old.map(|o| o.kind), mtime);
        Ok(old)
    }

    pub fn dir_remove(
        &self,
        p: PartitionId,
        dir: Ino,
        name: Name,
        expect: Option<Ino>,
        want_dir: Option<bool>,
        mtime: Timespec,
    ) -> R<DirEntry> {
        self.meta_op();
        let mut part = self.part_mut(p)?;
        Self::dir_of(&mut part, dir)?;
        let key = (dir, name);
        let e = *part.entries.map.get(&key).ok_or(ErrorCode::NotFound)?;
        if expect.is_some_and(|i| i != e.ino) {
            return Err(ErrorCode::NotFound);
        }
        match (want_dir, e.kind == FileKind::Dir) {
            (Some(false), true) => return Err(ErrorCode::IsDir),
            (Some(true), false) => return Err(ErrorCode::NotDir),
            _ => {}
        }
        part.entries.remove(&key);
        self.refund(entry_cost(&key.1));
        let d = Self::dir_of(&mut part, dir)?;
        Self::touch_dir(d, None, Some(e.kind), mtime);
        Ok(e)
    }

    /// `dir_remove` of a non-directory and, if its inode is in this partition too (a placed
    /// file), `inode_link` -1 on it: the link count and whether its stripes must go. Returns
    /// the directory as it is now too.
    pub fn dir_unlink(&self, p: PartitionId, dir: Ino, name: Name, mtime: Timespec) -> R<Unlinked> {
        let e = self.dir_remove(p, dir, name, None, Some(false), mtime)?;
        let links = match self.inode_link(p, e.ino, -1, mtime) {
            Ok(links) => Some(links),
            Err(ErrorCode::NotFound) => None,
            Err(x) => return Err(x),
        };
        Ok((e, links, self.inode_get(p, dir)?))
    }

    /// The entry `name` of `dir` and, if it lives in this partition too, its inode.
    pub fn dir_lookup(
        &self,
        p: PartitionId,
        dir: Ino,
        name: &[u8],
    ) -> R<(DirEntry, Option<Inode>)> {
        self.meta_op();
        let part = self.part(p)?;
        let entry = part
            .entries
            .map
            .get(&(dir, name.to_vec()))
            .copied()
            .ok_or(ErrorCode::NotFound)?;
        Ok((entry, part.inodes.get(&entry.ino).cloned()))
    }

    /// Creates `inode` (placed in this partition: the caller checks) and names it `name` in
    /// `dir`, at once, so the name never leads to a missing inode nor the inode lacks its
    /// name. Returns the directory as it is now.
    pub fn dir_create(
        &self,
        p: PartitionId,
        dir: Ino,
        name: Name,
        inode: Inode,
        mtime: Timespec,
    ) -> R<Inode> {
        self.meta_op();
        check_name(&name)?;
        let mut part = self.part_mut(p)?;
        Self::dir_of(&mut part, dir)?;
        let key = (dir, name);
        if part.entries.map.contains_key(&key) || part.inodes.contains_key(&inode.ino) {
            return Err(ErrorCode::Exists);
        }
        let cost = INODE_COST + inode.target.len() as u64 + entry_cost(&key.1);
        self.charge(cost)?;
        let entry = DirEntry {
            ino: inode.ino,
            kind: inode.kind,
        };
        self.inodes.fetch_add(1, Ordering::Relaxed);
        part.inodes.insert(inode.ino, inode);
        part.entries.insert(key, entry);
        let d = Self::dir_of(&mut part, dir)?;
        Self::touch_dir(d, Some(entry.kind), None, mtime);
        Ok(d.clone())
    }

    pub fn dir_list(
        &self,
        p: PartitionId,
        dir: Ino,
        after: Option<Name>,
        limit: u32,
    ) -> R<(Vec<Listed>, bool)> {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        self.meta_op();
        let mut part = self.part(p)?;
        Self::dir_of(&mut part, dir)?;
        let limit = limit.clamp(1, DIR_PAGE_MAX) as usize;
        let start = match after {
            Some(a) => Excluded((dir, a)),
            None => Included((dir, Vec::new())),
        };
        let end = match dir.checked_add(1) {
            Some(next) => Excluded((next, Vec::new())),
            None => Unbounded,
        };
        let mut budget = DIR_PAGE_INODE_BYTES;
        let mut it = part.entries.map.range((start, end)).map(|((_, n), e)| {
            let inode = part.inodes.get(&e.ino).filter(|i| {
                let size = INODE_COST as usize + i.target.len();
                let fits = size <= budget;
                budget = budget.saturating_sub(size);
                fits
            });
            (n.clone(), *e, inode.cloned())
        });
        let page: Vec<_> = it.by_ref().take(limit).collect();
        let more = it.next().is_some();
        Ok((page, more))
    }

    /// Renames `from` to `to` in `dir` (see `Op::DirRename`).
    #[allow(clippy::too_many_arguments)]
    pub fn dir_rename(
        &self,
        p: PartitionId,
        dir: Ino,
        from: Name,
        to: Name,
        replace: bool,
        replace_dir: bool,
        mtime: Timespec,
    ) -> R<Renamed> {
        self.meta_op();
        check_name(&to)?;
        let mut part = self.part_mut(p)?;
        Self::dir_of(&mut part, dir)?;
        let src = *part
            .entries
            .map
            .get(&(dir, from.clone()))
            .ok_or(ErrorCode::NotFound)?;
        let unchanged = |part: &mut Partition| {
            Ok(Renamed {
                moved: None,
                ctime_set: false,
                replaced: None,
                links: None,
                dir: Self::dir_of(part, dir)?.clone(),
            })
        };
        if from == to {
            return unchanged(&mut part);
        }
        let old = part.entries.map.get(&(dir, to.clone())).copied();
        if let Some(old) = &old {
            if !replace {
                return Err(ErrorCode::Exists);
            }
            Self::replaceable(old, &src)?;
            if old.ino == src.ino {
                return unchanged(&mut part);
            }
            if old.kind == FileKind::Dir && !replace_dir {
                return Err(ErrorCode::IsDir);
            }
            self.refund(entry_cost(&from));
        } else {
            // The new name may be longer than the old one.
            let grow = entry_cost(&to).saturating_sub(entry_cost(&from));
            self.charge(grow)?;
            self.refund(entry_cost(&from).saturating_sub(entry_cost(&to)));
        }
        part.entries.remove(&(dir, from));
        part.entries.insert((dir, to), src);
        let d = Self::dir_of(&mut part, dir)?;
        Self::touch_dir(d, None, old.map(|o| o.kind), mtime);
        let ctime_set = part.inodes.get_mut(&src.ino).is_some_and(|i| {
            i.ctime = mtime;
            i.change += 1;
            true
        });
        let replaced_here = old.filter(|o| o.kind != FileKind::Dir).and_then(|o| {
            let i = part.inodes.get_mut(&o.ino)?;
            i.nlink = i.nlink.saturating_sub(1);
            i.ctime = mtime;
            i.change += 1;
            Some(o.ino)
        });
        let links = replaced_here.map(|ino| self.reap(&mut part, ino));
        Ok(Renamed {
            moved: Some(src),
            ctime_set,
            replaced: old,
            links,
            dir: Self::dir_of(&mut part, dir)?.clone(),
        })
    }

    pub fn dir_destroy(&self, p: PartitionId, dir: Ino) -> R<()> {
        self.meta_op();
        let mut part = self.part_mut(p)?;
        Self::dir_of(&mut part, dir)?;
        let has_entries = part
            .entries
            .map
            .range((dir, Vec::new())..)
            .next()
            .is_some_and(|((d, _), _)| *d == dir);
        if has_entries {
            return Err(ErrorCode::NotEmpty);
        }
        let i = part.inodes.remove(&dir).expect("checked above");
        self.refund(INODE_COST + i.target.len() as u64);
        self.inodes.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    const SS: u32 = 4096;

    fn store(capacity: u64) -> Store {
        Store::new(4, SS, capacity, Arc::new(BufferPool::new(SS as usize, 8)))
    }

    impl Store {
        /// Does the index of files' partitions name exactly the partitions holding stripes?
        fn placed_matches(&self) -> bool {
            let mut actual = BTreeSet::new();
            for (p, m) in self.partitions.iter().enumerate() {
                for (&file, stripes) in &lock(m).stripes {
                    assert!(!stripes.is_empty(), "no empty stripe maps are kept");
                    actual.insert((file, p as PartitionId));
                }
            }
            *lock(&self.placed) == actual
        }
    }

    fn inode(ino: Ino, kind: FileKind) -> Inode {
        Inode {
            ino,
            kind,
            mode: 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
            parent: 0,
            target: Vec::new(),
            open_count: 0,
            change: 0,
        }
    }

    fn t(secs: i64) -> Timespec {
        Timespec { secs, nanos: 0 }
    }

    fn entry(ino: Ino, kind: FileKind) -> DirEntry {
        DirEntry { ino, kind }
    }

    /// A number, from `n * 1000` on, whose inode lives in another partition than 0 (where the
    /// tests' directories are): an entry may name it without its inode being here.
    fn far(n: u64) -> Ino {
        (n * 1000..).find(|&i| meta_partition(i, 4) != 0).unwrap()
    }

    #[derive(Debug, Clone)]
    enum StripeOp {
        Write {
            stripe: u64,
            offset: u32,
            data: Vec<u8>,
        },
        Truncate(u64),
        Read {
            stripe: u64,
            offset: u32,
            len: u32,
        },
    }

    fn stripe_op() -> impl Strategy<Value = StripeOp> {
        prop_oneof![
            4 => (0u64..4, 0u32..SS).prop_flat_map(|(stripe, offset)| {
                prop::collection::vec(any::<u8>(), 0..=(SS - offset) as usize)
                    .prop_map(move |data| StripeOp::Write { stripe, offset, data })
            }),
            1 => (0u64..(4 * u64::from(SS))).prop_map(StripeOp::Truncate),
            3 => (0u64..4, 0u32..SS, 0u32..SS).prop_map(|(stripe, offset, len)| StripeOp::Read { stripe, offset, len }),
        ]
    }

    /// Applies one change of a mixed workload to partition 0 (errors are part of it).
    fn mixed(s: &Store, op: &StripeOp, k: u64) {
        match op {
            StripeOp::Write {
                stripe,
                offset,
                data,
            } => {
                let _ = s.write(0, 9 + k % 2, *stripe, *offset, Bytes::from(data.clone()));
                let mut i = inode(100 + k % 5, FileKind::File);
                i.size = k;
                let _ = s.inode_create(0, i);
                let _ = s.inode_extend(0, 100 + k % 5, k, t(k as i64));
            }
            StripeOp::Truncate(size) => {
                let _ = s.truncate(&[0], 9 + k % 2, *size);
                let _ = s.inode_link(0, 100 + k % 5, -1, t(1));
                let _ = s.dir_insert(
                    0,
                    1,
                    format!("f{}", k % 7).into_bytes(),
                    DirEntry {
                        ino: k,
                        kind: FileKind::File,
                    },
                    true,
                    t(2),
                );
            }
            StripeOp::Read { stripe, .. } => {
                let _ = s.dir_remove(
                    0,
                    1,
                    format!("f{}", stripe % 7).into_bytes(),
                    None,
                    None,
                    t(3),
                );
            }
        }
    }

    type Contents = (
        Vec<(Ino, u64, Vec<u8>)>,
        Vec<Inode>,
        Vec<(Ino, Name, DirEntry)>,
    );

    /// Everything a partition holds, for comparing two copies.
    fn contents(s: &Store) -> Contents {
        let snap = s.snapshot(0).unwrap();
        let mut stripes: Vec<_> = snap
            .stripes
            .iter()
            .flat_map(|(f, m)| m.iter().map(move |(i, b)| (*f, *i, b.to_vec())))
            .collect();
        stripes.sort();
        let mut inodes: Vec<_> = snap.inodes.values().cloned().collect();
        inodes.sort_by_key(|i| i.ino);
        let entries = snap
            .entries
            .iter()
            .map(|((d, n), e)| (*d, n.clone(), *e))
            .collect();
        (stripes, inodes, entries)
    }

    /// Sends the changes since `base` from `src` to `dst`, as a sync round does.
    fn round(src: &Store, dst: &Store, base: Option<&Snapshot>) -> Snapshot {
        let snap = src.snapshot(0).unwrap();
        let d = snap.delta_from(base);
        let data: Vec<u8> = d.data.iter().flat_map(|b| b.to_vec()).collect();
        dst.apply_sync(0, d.items, &Bytes::from(data)).unwrap();
        snap
    }

    #[test]
    fn a_fenced_partition_refuses_changes_but_serves_reads() {
        let s = store(1 << 30);
        s.write(0, 9, 0, 0, Bytes::from_static(b"abc")).unwrap();
        s.fence(0, true).unwrap();
        assert!(matches!(
            s.write(0, 9, 0, 0, Bytes::from_static(b"x")),
            Err(ErrorCode::NotReady(_))
        ));
        assert!(matches!(
            s.inode_create(0, inode(5, FileKind::File)),
            Err(ErrorCode::NotReady(_))
        ));
        assert_eq!(&s.read(0, 9, 0, 0, 3).unwrap()[..], b"abc");
        s.fence(0, false).unwrap();
        s.write(0, 9, 0, 0, Bytes::from_static(b"x")).unwrap();
    }

    proptest! {
        /// A copy built from a snapshot and then the deltas of later rounds, while the source
        /// keeps changing between rounds, ends equal to the source, with the same accounting;
        /// clearing it gives all its memory back.
        #[test]
        fn sync_rounds_converge(
            before in prop::collection::vec(stripe_op(), 0..30),
            during in prop::collection::vec(prop::collection::vec(stripe_op(), 0..20), 1..4),
        ) {
            let (src, dst) = (store(1 << 30), store(1 << 30));
            src.inode_create(0, inode(1, FileKind::Dir)).unwrap();
            for (k, op) in before.iter().enumerate() {
                mixed(&src, op, k as u64);
            }
            let mut base = round(&src, &dst, None);
            for (r, ops) in during.iter().enumerate() {
                for (k, op) in ops.iter().enumerate() {
                    mixed(&src, op, (r * 100 + k) as u64);
                }
                base = round(&src, &dst, Some(&base));
            }
            drop(base);
            prop_assert_eq!(contents(&src), contents(&dst));
            for s in [&src, &dst] {
                let part = s.part(0).unwrap();
                let mut recount = HashMap::<Ino, u32>::new();
                for e in part.entries.map.values() {
                    *recount.entry(e.ino).or_default() += 1;
                }
                prop_assert_eq!(&part.entries.named, &recount, "names counted as they are");
            }
            prop_assert_eq!(src.used(), dst.used());
            prop_assert_eq!((src.stripe_count(), src.inode_count()), (dst.stripe_count(), dst.inode_count()));
            prop_assert!(src.placed_matches() && dst.placed_matches());
            dst.clear(0).unwrap();
            prop_assert_eq!((dst.used(), dst.stripe_count(), dst.inode_count()), (0, 0, 0));
            prop_assert!(dst.placed_matches());
        }

        /// Stripe writes, truncates and reads agree with a plain byte-vector model, and the
        /// bytes accounted as used are exactly the bytes stored.
        #[test]
        fn stripes_match_a_model(ops in prop::collection::vec(stripe_op(), 1..60)) {
            let s = store(1 << 30);
            let mut model: Vec<Vec<u8>> = vec![Vec::new(); 4];
            for op in ops {
                match op {
                    StripeOp::Write { stripe, offset, data } => {
                        let m = &mut model[stripe as usize];
                        let end = offset as usize + data.len();
                        if m.len() < end { m.resize(end, 0); }
                        m[offset as usize..end].copy_from_slice(&data);
                        s.write(0, 9, stripe, offset, Bytes::from(data)).unwrap();
                    }
                    StripeOp::Truncate(size) => {
                        s.truncate(&[0], 9, size).unwrap();
                        for (i, m) in model.iter_mut().enumerate() {
                            let start = i as u64 * u64::from(SS);
                            m.truncate(size.saturating_sub(start).min(u64::from(SS)) as usize);
                        }
                    }
                    StripeOp::Read { stripe, offset, len } => {
                        let got = s.read(0, 9, stripe, offset, len).unwrap();
                        let m = &model[stripe as usize];
                        let start = (offset as usize).min(m.len());
                        prop_assert_eq!(&got[..], &m[start..m.len().min(start + len as usize)]);
                    }
                }
                let stored: usize = model.iter().map(Vec::len).sum();
                prop_assert_eq!(s.used(), stored as u64);
                prop_assert!(s.placed_matches());
            }
        }
    }

    #[test]
    fn full_stripe_writes_keep_the_received_buffer() {
        let s = store(1 << 20);
        let data = Bytes::from(vec![7u8; SS as usize]);
        let ptr = data.as_ptr();
        s.write(1, 5, 0, 0, data).unwrap();
        assert_eq!(
            s.read(1, 5, 0, 0, SS).unwrap().as_ptr(),
            ptr,
            "stored without a copy"
        );
        assert_eq!(s.stripe_count(), 1);
        s.truncate(&[0, 1, 2, 3], 5, 0).unwrap();
        assert_eq!((s.stripe_count(), s.used()), (0, 0));
    }

    #[test]
    fn a_deleted_file_is_dropped_wherever_its_stripes_are_whatever_its_size() {
        let s = store(1 << 20);
        let held: Vec<PartitionId> = (0..4).collect();
        let put = |p: PartitionId, file: Ino, stripe: u64| {
            s.write(p, file, stripe, 0, Bytes::from_static(b"x"))
                .unwrap();
        };
        // Far past any size the files were given.
        for (p, stripe) in [(0, 0), (1, 1), (3, 900), (3, 901)] {
            put(p, 5, stripe);
        }
        put(2, 6, 0);
        s.drop_files(&held, &[5]).unwrap();
        assert_eq!(s.stripe_count(), 1, "file 6 keeps its stripe");
        s.drop_files(&held, &[5, 6, 7]).unwrap();
        assert_eq!((s.stripe_count(), s.used()), (0, 0));
        // Partitions not held are left alone.
        put(1, 7, 0);
        s.drop_files(&[0, 2, 3], &[7]).unwrap();
        assert_eq!(s.stripe_count(), 1);
        // A partition fenced for a copy's last round refuses, without stopping the others;
        // the drop is tried again once the fence is lifted.
        put(2, 8, 0);
        s.fence(1, true).unwrap();
        assert!(matches!(
            s.drop_files(&held, &[7, 8]),
            Err(ErrorCode::NotReady(_))
        ));
        assert_eq!(s.stripe_count(), 1);
        s.fence(1, false).unwrap();
        s.drop_files(&held, &[7, 8]).unwrap();
        assert_eq!(s.stripe_count(), 0);
        assert!(s.placed_matches());
    }

    #[test]
    fn a_truncate_cuts_stripes_past_the_old_size_in_every_partition_held() {
        let s = store(1 << 20);
        for (p, stripe) in [(0, 0), (1, 1), (2, 2), (3, 700)] {
            s.write(p, 5, stripe, 0, Bytes::from(vec![1u8; SS as usize]))
                .unwrap();
        }
        s.truncate(&[0, 1, 2, 3], 5, u64::from(SS) + 10).unwrap();
        assert_eq!(
            (s.stripe_count(), s.used()),
            (2, u64::from(SS) + 10),
            "stripe 0 whole, 10 bytes of stripe 1"
        );
        assert!(s.placed_matches());
    }

    #[test]
    fn a_reader_keeps_its_bytes_while_the_stripe_is_overwritten() {
        let s = store(1 << 20);
        s.write(0, 1, 0, 0, Bytes::from_static(b"aaaa")).unwrap();
        let held = s.read(0, 1, 0, 0, 4).unwrap();
        s.write(0, 1, 0, 1, Bytes::from_static(b"bb")).unwrap();
        assert_eq!(&held[..], b"aaaa", "copy on write");
        assert_eq!(&s.read(0, 1, 0, 0, 4).unwrap()[..], b"abba");
    }

    #[test]
    fn enospc_changes_nothing() {
        let s = store(6000);
        s.write(0, 1, 0, 0, Bytes::from(vec![1u8; 4000])).unwrap();
        let before = s.used();
        assert_eq!(
            s.write(0, 1, 1, 0, Bytes::from(vec![2u8; 4000])),
            Err(ErrorCode::NoSpace)
        );
        assert_eq!(
            s.write(0, 1, 0, 3000, Bytes::from(vec![3u8; 1096]))
                .map(drop),
            Ok(()),
            "fits"
        );
        assert_eq!(
            s.write(0, 2, 0, 0, Bytes::from(vec![3u8; 2000])),
            Err(ErrorCode::NoSpace)
        );
        assert_eq!(s.used(), before + 96);
        assert_eq!(&s.read(0, 1, 0, 0, 3000).unwrap()[..], &[1u8; 3000][..]);
        assert_eq!(s.read(0, 1, 1, 0, 10).unwrap().len(), 0);
        assert!(
            matches!(
                s.write(0, 1, 0, SS - 1, Bytes::from_static(b"xx")),
                Err(ErrorCode::Invalid(_))
            ),
            "past the stripe end"
        );
        let tiny = store(10);
        assert_eq!(
            tiny.inode_create(0, inode(3, FileKind::File)),
            Err(ErrorCode::NoSpace)
        );
        assert_eq!((tiny.inode_count(), tiny.used()), (0, 0));
    }

    #[test]
    fn links_and_open_handles_decide_when_an_inode_goes() {
        let s = store(1 << 20);
        s.inode_create(0, inode(7, FileKind::File)).unwrap();
        assert_eq!(
            s.inode_create(0, inode(7, FileKind::File)),
            Err(ErrorCode::Exists)
        );
        assert_eq!(s.inode_open(0, 7).unwrap().open_count, 1);
        assert_eq!(s.inode_link(0, 7, 1, t(1)), Ok((2, false)));
        assert_eq!(s.inode_link(0, 7, -1, t(2)), Ok((1, false)));
        assert_eq!(s.inode_link(0, 7, -1, t(3)), Ok((0, false)), "still open");
        assert!(s.inode_get(0, 7).is_ok());
        let extended = s.inode_extend(0, 7, 1, t(4)).unwrap();
        assert_eq!(extended.size, 1);
        // Three link changes and the extend; the open counts for nothing.
        assert_eq!(
            extended.change, 4,
            "every change but opens and closes counts"
        );
        let attr = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        assert_eq!(s.inode_setattr(0, 7, &attr).unwrap().change, 5);
        assert_eq!(
            s.inode_close(0, 7),
            Ok((0, true)),
            "last close reaps it; its stripes are to be dropped"
        );
        assert_eq!(s.inode_get(0, 7), Err(ErrorCode::NotFound));
        assert_eq!((s.inode_count(), s.used()), (0, 0));
        s.inode_create(0, inode(9, FileKind::File)).unwrap();
        assert_eq!(
            s.inode_link(0, 9, -1, t(4)),
            Ok((0, true)),
            "whatever its size: a failed write may have stored stripes past it"
        );
        s.inode_create(0, inode(8, FileKind::File)).unwrap();
        assert_eq!(s.inode_extend(0, 8, 100, t(5)).unwrap().size, 100);
        assert_eq!(
            s.inode_extend(0, 8, 50, t(6)).unwrap().size,
            100,
            "extend never shrinks"
        );
        let retracted = s.inode_retract(0, 8, 100, 40).unwrap();
        assert_eq!(retracted.size, 40, "the extent taken back");
        assert_eq!(
            s.inode_retract(0, 8, 100, 10).unwrap(),
            retracted,
            "moved since: left alone"
        );
        let a = SetAttr {
            size: Some(10),
            mode: Some(0o600),
            parent: Some(4),
            ctime: t(7),
            ..SetAttr::default()
        };
        let i = s.inode_setattr(0, 8, &a).unwrap();
        assert_eq!((i.size, i.mode, i.parent, i.ctime), (10, 0o600, 4, t(7)));
    }

    #[test]
    fn a_rename_over_a_placed_file_drops_its_link_and_sets_times_in_one_step() {
        let s = store(1 << 20);
        s.inode_create(0, inode(10, FileKind::Dir)).unwrap();
        s.inode_create(0, inode(30, FileKind::Dir)).unwrap();
        let mut full = inode(21, FileKind::File);
        full.size = 5;
        s.dir_create(0, 10, b"tmp".to_vec(), inode(20, FileKind::File), t(1))
            .unwrap();
        s.dir_create(0, 10, b"target".to_vec(), full, t(1)).unwrap();
        s.dir_insert(
            0,
            10,
            b"sub".to_vec(),
            entry(30, FileKind::Dir),
            false,
            t(1),
        )
        .unwrap();
        let renamed = s
            .dir_rename(
                0,
                10,
                b"tmp".to_vec(),
                b"target".to_vec(),
                true,
                false,
                t(2),
            )
            .unwrap();
        let expected = Renamed {
            moved: Some(entry(20, FileKind::File)),
            ctime_set: true,
            replaced: Some(entry(21, FileKind::File)),
            links: Some((0, true)),
            dir: s.inode_get(0, 10).unwrap(),
        };
        assert_eq!(renamed, expected, "21 is gone and had data");
        assert_eq!(renamed.dir.mtime, t(2));
        assert_eq!(s.inode_get(0, 21), Err(ErrorCode::NotFound));
        assert_eq!(s.inode_get(0, 20).unwrap().ctime, t(2));
        // A directory at the target only on the caller's word that it is empty.
        s.dir_create(0, 10, b"d".to_vec(), inode(22, FileKind::File), t(3))
            .unwrap();
        s.inode_create(0, inode(31, FileKind::Dir)).unwrap();
        s.dir_insert(
            0,
            10,
            b"sub2".to_vec(),
            entry(31, FileKind::Dir),
            false,
            t(3),
        )
        .unwrap();
        let dir_over_dir = |replace_dir| {
            s.dir_rename(
                0,
                10,
                b"sub2".to_vec(),
                b"sub".to_vec(),
                true,
                replace_dir,
                t(4),
            )
        };
        assert_eq!(dir_over_dir(false), Err(ErrorCode::IsDir));
        let renamed = dir_over_dir(true).unwrap();
        assert_eq!(renamed.replaced, Some(entry(30, FileKind::Dir)));
        assert_eq!(
            renamed.links, None,
            "a directory is destroyed by the caller"
        );
        assert_eq!(s.inode_get(0, 10).unwrap().nlink, 3, "2 + sub");
    }

    #[test]
    fn create_names_an_inode_at_once_or_changes_nothing() {
        let s = store(1 << 20);
        s.inode_create(0, inode(10, FileKind::Dir)).unwrap();
        let f = inode(20, FileKind::File);
        let d = s.dir_create(0, 10, b"f".to_vec(), f.clone(), t(1)).unwrap();
        assert_eq!(d, s.inode_get(0, 10).unwrap());
        let entry = DirEntry {
            ino: 20,
            kind: FileKind::File,
        };
        assert_eq!(s.dir_lookup(0, 10, b"f"), Ok((entry, Some(f.clone()))));
        assert_eq!(s.inode_get(0, 10).unwrap().mtime, t(1));
        let used = s.used();
        // The name taken, the number taken, no directory, not a directory, a bad name.
        let refused = [
            (10, "f", 21, ErrorCode::Exists),
            (10, "g", 20, ErrorCode::Exists),
            (99, "g", 22, ErrorCode::NotFound),
            (20, "g", 23, ErrorCode::NotDir),
        ];
        for (dir, name, ino, err) in refused {
            let file = inode(ino, FileKind::File);
            let got = s.dir_create(0, dir, name.as_bytes().to_vec(), file, t(2));
            assert_eq!(got, Err(err));
        }
        assert!(matches!(
            s.dir_create(0, 10, b"a/b".to_vec(), inode(24, FileKind::File), t(2)),
            Err(ErrorCode::Invalid(_))
        ));
        assert_eq!(s.used(), used, "a refused create reserves nothing");
        assert_eq!(s.inode_get(0, 10).unwrap().mtime, t(1));
        for ino in 21..25 {
            assert_eq!(s.inode_get(0, ino), Err(ErrorCode::NotFound));
        }
        let tiny = store(INODE_COST);
        tiny.inode_create(0, inode(10, FileKind::Dir)).unwrap();
        assert_eq!(
            tiny.dir_create(0, 10, b"f".to_vec(), inode(20, FileKind::File), t(1)),
            Err(ErrorCode::NoSpace)
        );
        assert_eq!(tiny.dir_lookup(0, 10, b"f"), Err(ErrorCode::NotFound));
    }

    #[test]
    fn unlink_drops_name_and_link_at_once_when_the_inode_is_here() {
        let unlink = |s: &Store, name: &str| {
            s.dir_unlink(0, 10, name.into(), t(3))
                .map(|(entry, links, dir)| (entry, links, dir.mtime))
        };
        let s = store(1 << 20);
        s.inode_create(0, inode(10, FileKind::Dir)).unwrap();
        for (name, ino) in [("a", 20), ("b", 21), ("open", 22)] {
            s.dir_create(0, 10, name.into(), inode(ino, FileKind::File), t(1))
                .unwrap();
        }
        s.inode_extend(0, 20, 5, t(2)).unwrap();
        s.inode_link(0, 21, 1, t(2)).unwrap(); // a second name elsewhere
        s.inode_open(0, 22).unwrap();
        let e = |ino| DirEntry {
            ino,
            kind: FileKind::File,
        };
        assert_eq!(unlink(&s, "a"), Ok((e(20), Some((0, true)), t(3))));
        assert_eq!(s.inode_get(0, 20), Err(ErrorCode::NotFound), "reaped");
        assert_eq!(unlink(&s, "b"), Ok((e(21), Some((1, false)), t(3))));
        assert_eq!(s.inode_get(0, 21).unwrap().nlink, 1);
        let kept = unlink(&s, "open");
        assert_eq!(kept, Ok((e(22), Some((0, false)), t(3))), "open: kept");
        // A name whose inode lives elsewhere (a hard link): the caller drops the link.
        let far = DirEntry {
            ino: far(99),
            kind: FileKind::File,
        };
        s.dir_insert(0, 10, b"far".to_vec(), far, false, t(4))
            .unwrap();
        assert_eq!(unlink(&s, "far"), Ok((far, None, t(3))));
        s.inode_create(0, inode(30, FileKind::Dir)).unwrap();
        let sub = DirEntry {
            ino: 30,
            kind: FileKind::Dir,
        };
        s.dir_insert(0, 10, b"sub".to_vec(), sub, false, t(6))
            .unwrap();
        assert_eq!(unlink(&s, "sub"), Err(ErrorCode::IsDir));
        assert_eq!(unlink(&s, "gone"), Err(ErrorCode::NotFound));
    }

    #[test]
    fn an_inode_named_here_outlives_links_dropped_too_many_times() {
        let s = store(1 << 20);
        s.inode_create(0, inode(10, FileKind::Dir)).unwrap();
        s.dir_create(0, 10, b"f".to_vec(), inode(20, FileKind::File), t(1))
            .unwrap();
        // A second name without a link, as a rename between two directories here makes for a
        // moment; then a buggy client drops the one link and unlinks one name.
        s.dir_insert(0, 10, b"g".to_vec(), entry(20, FileKind::File), false, t(1))
            .unwrap();
        assert_eq!(s.inode_link(0, 20, -1, t(2)), Ok((0, false)));
        assert_eq!(
            s.inode_link(0, 20, -1, t(2)),
            Ok((0, false)),
            "no underflow"
        );
        let unlinked = s.dir_unlink(0, 10, b"f".to_vec(), t(3)).unwrap();
        assert_eq!(unlinked.1, Some((0, false)));
        assert_eq!(
            s.dir_lookup(0, 10, b"g").map(|(_, i)| i.is_some()),
            Ok(true),
            "the other name still leads to the inode"
        );
        let unlinked = s.dir_unlink(0, 10, b"g".to_vec(), t(4)).unwrap();
        assert_eq!(unlinked.1, Some((0, true)), "its last name gone: deleted");
        assert_eq!(s.inode_get(0, 20), Err(ErrorCode::NotFound));
        // A rename over a name of an inode that has another name here keeps it.
        s.dir_create(0, 10, b"a".to_vec(), inode(21, FileKind::File), t(5))
            .unwrap();
        s.dir_insert(0, 10, b"b".to_vec(), entry(21, FileKind::File), false, t(5))
            .unwrap();
        s.dir_create(0, 10, b"c".to_vec(), inode(22, FileKind::File), t(5))
            .unwrap();
        let renamed = s
            .dir_rename(0, 10, b"c".to_vec(), b"a".to_vec(), true, false, t(6))
            .unwrap();
        assert_eq!(renamed.links, Some((0, false)));
        assert!(s.inode_get(0, 21).is_ok(), "still named b");
    }

    #[test]
    fn an_entry_leads_to_an_inode_of_its_kind_where_the_server_sees_it() {
        let s = store(1 << 20);
        s.inode_create(0, inode(10, FileKind::Dir)).unwrap();
        s.dir_create(0, 10, b"f".to_vec(), inode(20, FileKind::File), t(1))
            .unwrap();
        let here = (2..).find(|&i| meta_partition(i, 4) == 0).unwrap();
        assert_eq!(
            s.dir_insert(
                0,
                10,
                b"x".to_vec(),
                entry(here, FileKind::Dir),
                false,
                t(2)
            ),
            Err(ErrorCode::NotFound),
            "an inode that would be here is not"
        );
        assert!(matches!(
            s.dir_insert(
                0,
                10,
                b"x".to_vec(),
                entry(20, FileKind::Symlink),
                false,
                t(2)
            ),
            Err(ErrorCode::Invalid(_))
        ));
        assert_eq!(
            s.dir_insert(0, 10, b"x".to_vec(), entry(20, FileKind::File), false, t(2)),
            Ok(None)
        );
        assert_eq!(
            s.dir_insert(
                0,
                10,
                b"y".to_vec(),
                entry(far(1), FileKind::File),
                false,
                t(2)
            ),
            Ok(None),
            "an inode elsewhere is the caller's word"
        );
        assert_eq!(s.inode_get(0, 10).unwrap().mtime, t(2));
    }

    #[test]
    fn only_a_regular_file_changes_size() {
        let s = store(1 << 20);
        let mut link = inode(12, FileKind::Symlink);
        link.target = b"/x".to_vec();
        link.size = 2;
        s.inode_create(0, link).unwrap();
        s.inode_create(0, inode(13, FileKind::Dir)).unwrap();
        s.inode_create(0, inode(14, FileKind::File)).unwrap();
        let resize = SetAttr {
            size: Some(9),
            ..SetAttr::default()
        };
        assert!(matches!(
            s.inode_setattr(0, 12, &resize),
            Err(ErrorCode::Invalid(_))
        ));
        assert_eq!(s.inode_setattr(0, 13, &resize), Err(ErrorCode::IsDir));
        assert!(matches!(
            s.inode_extend(0, 12, 9, t(1)),
            Err(ErrorCode::Invalid(_))
        ));
        assert_eq!(s.inode_extend(0, 13, 9, t(1)), Err(ErrorCode::IsDir));
        assert_eq!(s.inode_get(0, 12).unwrap().size, 2, "unchanged");
        assert_eq!(s.inode_setattr(0, 14, &resize).unwrap().size, 9);
        assert_eq!(s.inode_extend(0, 14, 10, t(1)).unwrap().size, 10);
    }

    #[test]
    fn directory_rules() {
        let s = store(1 << 20);
        let (d, f, sub) = (10, far(11), far(12));
        s.inode_create(0, inode(d, FileKind::Dir)).unwrap();
        let file = DirEntry {
            ino: f,
            kind: FileKind::File,
        };
        let dir = DirEntry {
            ino: sub,
            kind: FileKind::Dir,
        };
        assert_eq!(
            s.dir_insert(0, 99, b"x".to_vec(), file, false, t(1)),
            Err(ErrorCode::NotFound)
        );
        s.inode_create(0, inode(13, FileKind::File)).unwrap();
        assert_eq!(
            s.dir_insert(0, 13, b"x".to_vec(), file, false, t(1)),
            Err(ErrorCode::NotDir)
        );
        assert_eq!(
            s.dir_insert(0, d, b"f".to_vec(), file, false, t(1)),
            Ok(None)
        );
        assert_eq!(
            s.dir_insert(0, d, b"f".to_vec(), file, false, t(1)),
            Err(ErrorCode::Exists)
        );
        assert_eq!(
            s.dir_insert(0, d, b"f".to_vec(), dir, true, t(1)),
            Err(ErrorCode::NotDir)
        );
        assert_eq!(
            s.dir_insert(0, d, b"s".to_vec(), dir, false, t(2)),
            Ok(None)
        );
        assert_eq!(
            s.dir_insert(0, d, b"s".to_vec(), file, true, t(2)),
            Err(ErrorCode::IsDir)
        );
        let di = s.inode_get(0, d).unwrap();
        assert_eq!((di.nlink, di.mtime), (3, t(2)), "2 + one subdirectory");
        assert!(matches!(
            s.dir_insert(0, d, b"a/b".to_vec(), file, false, t(2)),
            Err(ErrorCode::Invalid(_))
        ));
        assert_eq!(
            s.dir_lookup(0, d, b"f"),
            Ok((file, None)),
            "the file's inode lives elsewhere"
        );
        assert_eq!(
            s.dir_remove(0, d, b"s".to_vec(), None, Some(false), t(3)),
            Err(ErrorCode::IsDir)
        );
        assert_eq!(
            s.dir_remove(0, d, b"f".to_vec(), None, Some(true), t(3)),
            Err(ErrorCode::NotDir)
        );
        assert_eq!(
            s.dir_remove(0, d, b"f".to_vec(), Some(999), None, t(3)),
            Err(ErrorCode::NotFound)
        );
        assert_eq!(s.dir_destroy(0, d), Err(ErrorCode::NotEmpty));
        let moved = s
            .dir_rename(0, d, b"f".to_vec(), b"g".to_vec(), false, false, t(4))
            .unwrap();
        assert_eq!(
            (moved.moved, moved.ctime_set, moved.replaced, moved.links),
            (Some(file), false, None, None),
            "the file's inode lives elsewhere: its ctime is the caller's to set"
        );
        assert_eq!(moved.dir, s.inode_get(0, d).unwrap());
        assert_eq!(
            s.dir_rename(0, d, b"g".to_vec(), b"s".to_vec(), true, true, t(4)),
            Err(ErrorCode::IsDir),
            "file over dir"
        );
        assert_eq!(
            s.dir_rename(0, d, b"g".to_vec(), b"s".to_vec(), false, false, t(4)),
            Err(ErrorCode::Exists)
        );
        assert_eq!(
            s.dir_remove(0, d, b"s".to_vec(), Some(sub), Some(true), t(5)),
            Ok(dir)
        );
        assert_eq!(s.inode_get(0, d).unwrap().nlink, 2);
        assert_eq!(
            s.dir_remove(0, d, b"g".to_vec(), None, Some(false), t(5)),
            Ok(file)
        );
        assert_eq!(s.dir_destroy(0, d), Ok(()));
        assert_eq!(s.dir_lookup(0, d, b"g"), Err(ErrorCode::NotFound));
        assert_eq!(
            s.dir_insert(0, d, b"late".to_vec(), file, false, t(6)),
            Err(ErrorCode::NotFound),
            "no inserts into a removed dir"
        );
        assert_eq!(s.used(), 256, "only inode 13 is left");
    }

    #[test]
    fn listings_page_in_name_order_and_stay_in_their_directory() {
        let s = store(1 << 24);
        for d in [20, 21] {
            s.inode_create(0, inode(d, FileKind::Dir)).unwrap();
        }
        for i in 0..25u64 {
            let e = DirEntry {
                ino: far(100 + i),
                kind: FileKind::File,
            };
            s.dir_insert(0, 20, format!("n{i:02}").into_bytes(), e, false, t(1))
                .unwrap();
            s.dir_insert(0, 21, format!("m{i:02}").into_bytes(), e, false, t(1))
                .unwrap();
        }
        let mut names = Vec::new();
        let mut after = None;
        loop {
            let (page, more) = s.dir_list(0, 20, after.clone(), 10).unwrap();
            assert!(page.len() <= 10);
            after = page.last().map(|(n, _, _)| n.clone());
            names.extend(
                page.into_iter()
                    .map(|(n, _, _)| String::from_utf8(n).unwrap()),
            );
            if !more {
                break;
            }
        }
        let want: Vec<_> = (0..25).map(|i| format!("n{i:02}")).collect();
        assert_eq!(names, want);
        assert_eq!(s.dir_list(0, 99, None, 10), Err(ErrorCode::NotFound));
    }

    #[test]
    fn listings_carry_the_inodes_held_with_them_up_to_a_budget() {
        let s = store(1 << 30);
        s.inode_create(0, inode(10, FileKind::Dir)).unwrap();
        // A file placed here, one whose inode lives elsewhere, and symlinks with long targets.
        s.dir_create(0, 10, b"a".to_vec(), inode(11, FileKind::File), t(1))
            .unwrap();
        let away = DirEntry {
            ino: far(12),
            kind: FileKind::File,
        };
        s.dir_insert(0, 10, b"b".to_vec(), away, false, t(1))
            .unwrap();
        let links = 2 * DIR_PAGE_INODE_BYTES / 4096;
        for i in 0..links as u64 {
            let mut l = inode(100 + i, FileKind::Symlink);
            l.target = vec![b'x'; 4096];
            s.dir_create(0, 10, format!("l{i:04}").into_bytes(), l, t(1))
                .unwrap();
        }
        let (page, _) = s.dir_list(0, 10, None, DIR_PAGE_MAX).unwrap();
        assert_eq!(page[0].2, Some(inode(11, FileKind::File)));
        assert_eq!((page[1].1, page[1].2.clone()), (away, None));
        let with: Vec<_> = page[2..].iter().map(|(_, _, i)| i.is_some()).collect();
        assert!(
            with[0] && !with[with.len() - 1],
            "the budget stops inodes, not entries"
        );
        assert_eq!(with.len(), links);
        let carried: usize = page
            .iter()
            .filter_map(|(_, _, i)| i.as_ref())
            .map(|i| i.target.len())
            .sum();
        assert!(carried <= DIR_PAGE_INODE_BYTES);
    }
}
