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
//! An absent name answered here is not cached by the kernel (no promise covers the name on
//! its own once the directory's is used up), so the next look-up comes here again.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};
use tessera_client::{Name, Notice};

/// Names (and directories) kept at most, about 100 bytes each.
const NAMES_MAX: usize = 1 << 18;

#[derive(Default)]
pub(crate) struct Complete(Mutex<Dirs>);

#[derive(Default)]
struct Dirs {
    names: HashMap<u64, HashSet<Name>>,
    kept: usize,
    /// Notices that ended completeness so far.
    cuts: u64,
    max: usize,
}

impl Complete {
    fn with_max(max: usize) -> Self {
        Self(Mutex::new(Dirs {
            max,
            ..Dirs::default()
        }))
    }

    pub(crate) fn new() -> Self {
        Self::with_max(NAMES_MAX)
    }

    fn dirs(&self) -> MutexGuard<'_, Dirs> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
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
