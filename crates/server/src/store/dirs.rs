//! Directory entries (the directory's inode is in the same partition): insert, remove,
//! unlink, look up, create with an inode, list, rename and destroy.

use super::{entry_cost, Partition, Renamed, Store, Unlinked, INODE_COST, R};
use std::sync::atomic::Ordering;
use tessera_placement::{meta_partition, Ino, PartitionId};
use tessera_proto::{
    check_name, DirEntry, ErrorCode, FileKind, Inode, Listed, Name, Timespec, DIR_PAGE_INODE_BYTES,
    DIR_PAGE_MAX,
};

impl Store {
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
            self.charge(&mut part.used, entry_cost(&key.1))?;
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
        self.refund(&mut part.used, entry_cost(&key.1));
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
        self.charge(&mut part.used, cost)?;
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
            self.refund(&mut part.used, entry_cost(&from));
        } else {
            // The new name may be longer than the old one.
            let grow = entry_cost(&to).saturating_sub(entry_cost(&from));
            self.charge(&mut part.used, grow)?;
            let shrink = entry_cost(&from).saturating_sub(entry_cost(&to));
            self.refund(&mut part.used, shrink);
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
        if part.entries.lists(dir) {
            return Err(ErrorCode::NotEmpty);
        }
        let i = part.inodes.remove(&dir).expect("checked above");
        self.refund(&mut part.used, INODE_COST + i.target.len() as u64);
        self.inodes.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }
}
