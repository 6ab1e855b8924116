//! The mount's open files, by handle and by inode.
//!
//! Most operations ask about one handle; several ask about every handle of one inode on this
//! mount: each entry and attribute reply (the size unpublished writes made), each read (whose
//! writes to publish first) and each write (whose read-ahead to drop). The index by inode
//! keeps those at the cost of the inode's own handles, not of every file open on the mount.

use std::collections::HashMap;
use std::sync::Arc;

pub(crate) struct Handles<V> {
    by_fh: HashMap<u64, (u64, Arc<V>)>,
    /// Each inode's handles (a few at most, usually one).
    by_ino: HashMap<u64, Vec<(u64, Arc<V>)>>,
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
    pub fn insert(&mut self, fh: u64, ino: u64, v: V) {
        let v = Arc::new(v);
        self.by_ino
            .entry(ino)
            .or_default()
            .push((fh, Arc::clone(&v)));
        let old = self.by_fh.insert(fh, (ino, v));
        debug_assert!(old.is_none(), "handle {fh} given out twice");
    }

    pub fn get(&self, fh: u64) -> Option<Arc<V>> {
        self.by_fh.get(&fh).map(|(_, v)| Arc::clone(v))
    }

    pub fn remove(&mut self, fh: u64) -> Option<Arc<V>> {
        let (ino, v) = self.by_fh.remove(&fh)?;
        if let Some(list) = self.by_ino.get_mut(&ino) {
            list.retain(|(k, _)| *k != fh);
            if list.is_empty() {
                self.by_ino.remove(&ino);
            }
        }
        Some(v)
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
        self.by_ino.get(&ino).into_iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_found_by_inode_until_released() {
        let mut h = Handles::default();
        h.insert(1, 7, "a");
        h.insert(2, 7, "b");
        h.insert(3, 8, "c");
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
        h.insert(4, 8, "d");
        let mut all = h.take_all().iter().map(|v| **v).collect::<Vec<_>>();
        all.sort_unstable();
        assert_eq!(all, ["c", "d"]);
        assert!(h.get(3).is_none() && h.of(8).count() == 0, "none left");
    }
}
