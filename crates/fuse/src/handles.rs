//! The mount's open files, by handle and by inode.
//!
//! Most operations ask about one handle; several ask about every handle of one inode on this
//! mount: each entry and attribute reply (the size unpublished writes made), each read (whose
//! writes to publish first) and each write (whose read-ahead to drop). The index by inode
//! keeps those at the cost of the inode's own handles, not of every file open on the mount.
//!
//! Each inode with handles also has its end as this mount knows it: the size its opens found,
//! moved by this mount's writes and truncates. Appends are placed there, one after the other:
//! the kernel's idea of the size lags behind writes other handles still buffer, and each
//! handle's own size knows only its writes. The end is kept while an open of the inode is on
//! its way too: its answer may predate a publish whose handle is released before it arrives.

use std::collections::HashMap;
use std::sync::Arc;

pub(crate) struct Handles<V> {
    by_fh: HashMap<u64, (u64, Arc<V>)>,
    /// Each inode's handles (a few at most, usually one) and its end.
    by_ino: HashMap<u64, Open<V>>,
}

struct Open<V> {
    handles: Vec<(u64, Arc<V>)>,
    end: u64,
    /// Opens of the inode on their way ([`Handles::opening`]).
    opening: u32,
}

impl<V> Default for Handles<V> {
    fn default() -> Self {
        Self {
            by_fh: HashMap::new(),
            by_ino: HashMap::new(),
        }
    }
}

impl<V> Handles<V> {
    /// Adds handle `fh` of `ino`, which its open found ending at `end` (`truncated`: the open
    /// cut it there).
    pub fn insert(&mut self, fh: u64, ino: u64, v: V, end: u64, truncated: bool) {
        let v = Arc::new(v);
        let open = self.by_ino.entry(ino).or_insert_with(|| Open {
            handles: Vec::new(),
            end,
            opening: 0,
        });
        open.end = if truncated { end } else { open.end.max(end) };
        open.handles.push((fh, Arc::clone(&v)));
        let old = self.by_fh.insert(fh, (ino, v));
        debug_assert!(old.is_none(), "handle {fh} given out twice");
    }

    pub fn get(&self, fh: u64) -> Option<Arc<V>> {
        self.by_fh.get(&fh).map(|(_, v)| Arc::clone(v))
    }

    pub fn remove(&mut self, fh: u64) -> Option<Arc<V>> {
        let (ino, v) = self.by_fh.remove(&fh)?;
        if let Some(open) = self.by_ino.get_mut(&ino) {
            open.handles.retain(|(k, _)| *k != fh);
            self.forget_unused(ino);
        }
        Some(v)
    }

    /// An open of `ino` is on its way: its end is kept until [`Handles::open_done`].
    pub fn opening(&mut self, ino: u64) {
        let open = self.by_ino.entry(ino).or_insert_with(|| Open {
            handles: Vec::new(),
            end: 0,
            opening: 0,
        });
        open.opening += 1;
    }

    /// The open of `ino` announced by [`Handles::opening`] is answered (and kept, or failed).
    pub fn open_done(&mut self, ino: u64) {
        if let Some(open) = self.by_ino.get_mut(&ino) {
            open.opening = open.opening.saturating_sub(1);
            self.forget_unused(ino);
        }
    }

    fn forget_unused(&mut self, ino: u64) {
        if self
            .by_ino
            .get(&ino)
            .is_some_and(|open| open.handles.is_empty() && open.opening == 0)
        {
            self.by_ino.remove(&ino);
        }
    }

    /// Every handle, leaving none.
    pub fn take_all(&mut self) -> Vec<Arc<V>> {
        self.by_ino.clear();
        self.by_fh.drain().map(|(_, (_, v))| v).collect()
    }

    /// The handles of `ino`.
    pub fn of(&self, ino: u64) -> impl Iterator<Item = &Arc<V>> {
        self.with_fh(ino).map(|(_, v)| v)
    }

    /// The handles of `ino` other than `fh`.
    pub fn others(&self, ino: u64, fh: u64) -> impl Iterator<Item = &Arc<V>> {
        self.with_fh(ino)
            .filter(move |(k, _)| *k != fh)
            .map(|(_, v)| v)
    }

    fn with_fh(&self, ino: u64) -> impl Iterator<Item = &(u64, Arc<V>)> {
        self.by_ino
            .get(&ino)
            .into_iter()
            .flat_map(|open| &open.handles)
    }

    /// A write through this mount ended at `end`.
    pub fn wrote(&mut self, ino: u64, end: u64) {
        if let Some(open) = self.by_ino.get_mut(&ino) {
            open.end = open.end.max(end);
        }
    }

    /// A truncate through this mount set the size.
    pub fn truncated(&mut self, ino: u64, size: u64) {
        if let Some(open) = self.by_ino.get_mut(&ino) {
            open.end = size;
        }
    }

    /// An append of `len` bytes at `at` failed: the end goes back unless another append
    /// followed it (which then leaves a hole, as a failed write in the middle of a file does).
    pub fn unappend(&mut self, ino: u64, at: u64, len: u64) {
        if let Some(open) = self.by_ino.get_mut(&ino) {
            if open.end == at.saturating_add(len) {
                open.end = at;
            }
        }
    }

    /// Where an append of `len` bytes to `ino` goes: its end, which moves past them, so the
    /// next append follows even before this one is written. `None` if `ino` has no handle.
    pub fn append(&mut self, ino: u64, len: u64) -> Option<u64> {
        let open = self.by_ino.get_mut(&ino)?;
        let at = open.end;
        open.end = at.saturating_add(len);
        Some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_found_by_inode_until_released() {
        let mut h = Handles::default();
        h.insert(1, 7, "a", 0, false);
        h.insert(2, 7, "b", 0, false);
        h.insert(3, 8, "c", 0, false);
        assert_eq!(h.of(7).map(|v| **v).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(h.others(7, 1).map(|v| **v).collect::<Vec<_>>(), ["b"]);
        assert_eq!(h.get(3).as_deref(), Some(&"c"));
        assert_eq!(h.remove(1).as_deref(), Some(&"a"));
        assert!(h.remove(1).is_none(), "a handle is released once");
        assert_eq!(h.of(7).count(), 1);
        h.remove(2);
        assert_eq!(h.of(7).count(), 0);
        assert!(
            !h.by_ino.contains_key(&7),
            "no list is kept for an inode without handles"
        );
        assert_eq!(h.of(8).count(), 1);
        assert!(h.get(2).is_none());
        h.insert(4, 8, "d", 0, false);
        let mut all = h.take_all().iter().map(|v| **v).collect::<Vec<_>>();
        all.sort_unstable();
        assert_eq!(all, ["c", "d"]);
        assert!(h.get(3).is_none() && h.of(8).count() == 0, "none left");
    }

    #[test]
    fn appends_follow_one_another_from_the_end_the_mount_knows() {
        let mut h = Handles::default();
        assert_eq!(h.append(7, 10), None, "no end without a handle");
        h.insert(1, 7, "a", 100, false);
        // Opened before the first handle's writes were published: found an older size.
        h.insert(2, 7, "b", 40, false);
        assert_eq!(h.append(7, 10), Some(100));
        assert_eq!(h.append(7, 5), Some(110), "the next append follows at once");
        h.unappend(7, 110, 5);
        assert_eq!(h.append(7, 5), Some(110), "a failed append leaves no hole");
        h.unappend(7, 100, 10);
        assert_eq!(h.append(7, 0), Some(115), "unless another followed it");
        h.wrote(7, 300);
        assert_eq!(h.append(7, 1), Some(300), "past a write beyond the end");
        h.truncated(7, 0);
        assert_eq!(h.append(7, 2), Some(0), "a truncate sets the end");
        h.insert(3, 7, "c", 0, false);
        assert_eq!(
            h.append(7, 1),
            Some(2),
            "an open finding less keeps the end"
        );
        h.insert(4, 7, "d", 0, true);
        assert_eq!(h.append(7, 1), Some(0), "an open with O_TRUNC cut it");
        for fh in 1..=4 {
            h.remove(fh);
        }
        assert_eq!(h.append(7, 1), None, "forgotten with the last handle");
        h.insert(5, 7, "e", 9, false);
        assert_eq!(
            h.append(7, 1),
            Some(9),
            "a new open starts from what it found"
        );
    }

    #[test]
    fn the_end_outlives_the_last_handle_while_an_open_is_on_its_way() {
        let mut h = Handles::default();
        h.insert(1, 7, "a", 0, false);
        h.opening(7);
        assert_eq!(h.append(7, 10), Some(0));
        h.remove(1);
        // Its answer found the size before the released handle's append was published.
        h.insert(2, 7, "b", 0, false);
        h.open_done(7);
        assert_eq!(h.append(7, 1), Some(10));
        h.remove(2);
        h.opening(8);
        h.open_done(8);
        assert!(h.by_ino.is_empty(), "nothing kept for a failed open");
    }
}
