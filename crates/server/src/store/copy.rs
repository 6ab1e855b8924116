//! Whole partitions, for copying them to another server: fences, snapshots, the deltas between
//! them, and applying a copy's pages.

use super::{entry_cost, Store, INODE_COST, R};
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use tessera_placement::{Ino, PartitionId};
use tessera_proto::{DirEntry, ErrorCode, Inode, Name, SyncItem};

/// A partition's state at one instant, for syncing it to another node. Stripes are shared
/// with the store (`Bytes` clones): while a snapshot holds a stripe, a write to it copies it,
/// so an unchanged stripe is recognised by its buffer pointer.
#[derive(Default)]
pub struct Snapshot {
    pub(super) stripes: HashMap<Ino, BTreeMap<u64, Bytes>>,
    pub(super) inodes: HashMap<Ino, Inode>,
    pub(super) entries: BTreeMap<(Ino, Name), DirEntry>,
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
                d.items.push(SyncItem::Inode(i.clone(), i.opens.clone()));
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

impl Store {
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
        debug_assert_eq!(
            freed, gone.used,
            "partition {p} was charged other than what it held"
        );
        self.refund_store(freed);
        Ok(())
    }

    /// Applies a page of sync items to partition `p`; `data` holds the stripe bytes of the
    /// `Stripe` items, back to back. Checked against capacity item by item (ENOSPC stops it).
    pub fn apply_sync(&self, p: PartitionId, items: Vec<SyncItem>, data: &Bytes) -> R<()> {
        let mut guard = self.part(p)?;
        let part = &mut *guard;
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
                    self.charge(&mut part.used, (len as u64).saturating_sub(old_len))?;
                    self.refund(&mut part.used, old_len.saturating_sub(len as u64));
                    // Copied out of the page, so the page's buffer is not pinned by one stripe.
                    let mut buf = self.pool.get(len as usize);
                    buf.extend_from_slice(&bytes);
                    self.check_stripe(buf.len());
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
                            self.refund(&mut part.used, old.len() as u64);
                            self.stripes.fetch_sub(1, Ordering::Relaxed);
                            self.pool.recycle(old);
                        }
                        if stripes.is_empty() {
                            part.stripes.remove(&file);
                            self.unplace(p, [file]);
                        }
                    }
                }
                SyncItem::Inode(mut i, opens) => {
                    i.opens = opens;
                    let cost = INODE_COST + i.target.len() as u64;
                    match part.inodes.insert(i.ino, i) {
                        Some(old) => {
                            self.refund(&mut part.used, INODE_COST + old.target.len() as u64);
                            self.charge_anyway(&mut part.used, cost);
                        }
                        None => {
                            self.charge_anyway(&mut part.used, cost);
                            self.inodes.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                SyncItem::NoInode(ino) => {
                    if let Some(old) = part.inodes.remove(&ino) {
                        self.refund(&mut part.used, INODE_COST + old.target.len() as u64);
                        self.inodes.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                SyncItem::Entry { dir, name, entry } => {
                    let cost = entry_cost(&name);
                    if part.entries.insert((dir, name), entry).is_none() {
                        self.charge_anyway(&mut part.used, cost);
                    }
                }
                SyncItem::NoEntry { dir, name } => {
                    if part.entries.remove(&(dir, name.clone())).is_some() {
                        self.refund(&mut part.used, entry_cost(&name));
                    }
                }
            }
        }
        Ok(())
    }
}
