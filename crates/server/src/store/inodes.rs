//! Inodes: create, read and change them, links and open handles, and reaping an inode that
//! has none of either left.

use super::{Links, Partition, Store, INODE_COST, R};
use std::sync::atomic::Ordering;
use tessera_placement::{Ino, PartitionId};
use tessera_proto::{ErrorCode, FileKind, Inode, SetAttr, Timespec, SCAN_PAGE_MAX};

/// The largest size a reservation may make: what `off_t` holds.
const MAX_SIZE: u64 = i64::MAX as u64;

impl Store {
    pub(super) fn meta_op(&self) {
        self.counters.meta_ops.fetch_add(1, Ordering::Relaxed);
    }

    pub fn inode_create(&self, p: PartitionId, inode: Inode) -> R<()> {
        self.meta_op();
        let mut part = self.part_mut(p)?;
        if part.inodes.contains_key(&inode.ino) {
            return Err(ErrorCode::Exists);
        }
        self.charge(&mut part.used, INODE_COST + inode.target.len() as u64)?;
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

    /// Adds `len` to the size (the caller's bytes are the last `len` of the answer's size).
    pub fn inode_reserve(&self, p: PartitionId, ino: Ino, len: u64, mtime: Timespec) -> R<Inode> {
        self.with_inode(p, ino, |i| {
            Self::resizable(i)?;
            i.size = i
                .size
                .checked_add(len)
                .filter(|&s| s <= MAX_SIZE)
                .ok_or_else(|| {
                    ErrorCode::Invalid(format!(
                        "reserving {len} bytes after {} makes a file larger than one can be",
                        i.size
                    ))
                })?;
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
    pub(super) fn reap(&self, part: &mut Partition, ino: Ino) -> Links {
        match part.inodes.get(&ino) {
            Some(i) if i.nlink == 0 && i.opens.is_empty() && !part.entries.names(ino) => {
                let i = part.inodes.remove(&ino).expect("present");
                self.refund(&mut part.used, INODE_COST + i.target.len() as u64);
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

    pub fn inode_open(&self, p: PartitionId, ino: Ino, holder: u64) -> R<Inode> {
        self.with_inode(p, ino, |i| {
            i.open_by(holder);
            i.clone()
        })
    }

    /// Releases a handle of `holder` ([`Opens::close`]), or with `all` every one (its lease ran
    /// out), and reaps the inode if that was the last thing keeping it.
    ///
    /// [`Opens::close`]: tessera_proto::Opens::close
    pub fn inode_close(&self, p: PartitionId, ino: Ino, holder: u64, all: bool) -> R<Links> {
        self.meta_op();
        let mut part = self.part_mut(p)?;
        let i = part.inodes.get_mut(&ino).ok_or(ErrorCode::NotFound)?;
        i.close_by(holder, all);
        Ok(self.reap(&mut part, ino))
    }

    /// Every (inode, holder) with handles open in partition `p`: a scan of its inodes, made
    /// once per lease check.
    pub fn open_holders(&self, p: PartitionId) -> R<Vec<(Ino, u64)>> {
        let part = self.part(p)?;
        Ok(part
            .inodes
            .values()
            .flat_map(|i| i.opens.holders().map(|(h, _)| (i.ino, h)))
            .collect())
    }

    /// Partition `p`'s inodes numbered after `after`, in number order, at most `limit`; and
    /// whether more follow.
    pub fn inode_scan(
        &self,
        p: PartitionId,
        after: Option<Ino>,
        limit: u32,
    ) -> R<(Vec<Inode>, bool)> {
        self.meta_op();
        let part = self.part(p)?;
        let mut inos: Vec<Ino> = part
            .inodes
            .keys()
            .copied()
            .filter(|&i| after.is_none_or(|a| i > a))
            .collect();
        let limit = limit.clamp(1, SCAN_PAGE_MAX) as usize;
        let more = inos.len() > limit;
        if more {
            inos.select_nth_unstable(limit);
            inos.truncate(limit);
        }
        inos.sort_unstable();
        Ok((inos.iter().map(|i| part.inodes[i].clone()).collect(), more))
    }

    /// Deletes inode `ino` if it is as a scan saw it (`change`, `ctime`), has no open handle,
    /// no name in its partition and, for a directory, no entries: what it did, or `None` if it
    /// is in use.
    pub fn inode_reclaim(
        &self,
        p: PartitionId,
        ino: Ino,
        change: u64,
        ctime: Timespec,
    ) -> R<Option<Links>> {
        self.meta_op();
        let mut part = self.part_mut(p)?;
        let in_use = part.entries.names(ino) || part.entries.lists(ino);
        let i = part.inodes.get_mut(&ino).ok_or(ErrorCode::NotFound)?;
        if i.change != change || i.ctime != ctime || !i.opens.is_empty() || in_use {
            return Ok(None);
        }
        i.nlink = 0;
        Ok(Some(self.reap(&mut part, ino)))
    }
}
