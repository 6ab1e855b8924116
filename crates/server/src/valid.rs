//! Structural checks of metadata changes that need no state: whatever a client sends with the
//! cluster secret, the namespace stays a namespace. Made in [`crate::handler`] before a change
//! is applied, by the primary and by every mirror alike (the checks of the store, which need
//! the partition's state, decide the same way on every copy too, as the copies are equal).
//!
//! Inode numbers say what they are: the root is [`ROOT_INO`]; other directories have hashed
//! numbers (made by `InodeCreate`, which makes nothing else); everything else has a number
//! placed in its directory's partition (made by `DirCreate`, which makes no directory). So a
//! directory entry's kind can be checked against its number on any server, and no number can
//! come back as an inode of the other sort.

use tessera_placement::{meta_partition, Ino, PartitionId, PLACED_INO, ROOT_INO};
use tessera_proto::{DirEntry, ErrorCode, FileKind, Inode, Op, SYMLINK_MAX};

fn invalid(why: impl Into<String>) -> ErrorCode {
    ErrorCode::Invalid(why.into())
}

fn placed(ino: Ino) -> bool {
    ino & PLACED_INO != 0
}

/// Is `ino` a number a directory can have?
fn dir_number(ino: Ino) -> bool {
    ino != 0 && !placed(ino)
}

/// Checks a change to partition `p` of a cluster of `partitions` partitions.
pub fn check(op: &Op, p: PartitionId, partitions: u32) -> Result<(), ErrorCode> {
    match op {
        Op::InodeCreate { inode } => new_dir(inode),
        Op::DirCreate { dir, inode, .. } => {
            if !placed(inode.ino) || meta_partition(inode.ino, partitions) != p {
                return Err(invalid(format!(
                    "inode {} is not placed with directory {dir}",
                    inode.ino
                )));
            }
            new_placed(inode)
        }
        Op::DirInsert { dir, entry, .. } => entry_for(*dir, entry),
        Op::DirDestroy { dir: ROOT_INO } | Op::InodeReclaim { ino: ROOT_INO, .. } => {
            Err(invalid("the root directory cannot be removed"))
        }
        Op::InodeLink { ino, .. } if !placed(*ino) => Err(invalid(format!(
            "inode {ino} is a directory: its links are its entries"
        ))),
        Op::InodeSetAttr { ino, attr } => {
            if attr.size.is_some() && !placed(*ino) {
                return Err(ErrorCode::IsDir);
            }
            match attr.parent {
                None => Ok(()),
                Some(_) if *ino == ROOT_INO => Err(invalid("the root is its own parent")),
                Some(_) if placed(*ino) => Err(invalid("only a directory has a parent")),
                Some(d) if !dir_number(d) || d == *ino => {
                    Err(invalid(format!("inode {d} cannot be the parent of {ino}")))
                }
                Some(_) => Ok(()),
            }
        }
        Op::InodeExtend { ino, .. }
        | Op::InodeReserve { ino, .. }
        | Op::InodeRetract { ino, .. }
            if !placed(*ino) =>
        {
            Err(ErrorCode::IsDir)
        }
        _ => Ok(()),
    }
}

/// A new directory, as `InodeCreate` makes it: a hashed number, two links, nothing open.
fn new_dir(i: &Inode) -> Result<(), ErrorCode> {
    if i.kind != FileKind::Dir || !dir_number(i.ino) {
        return Err(invalid(format!(
            "InodeCreate makes directories with hashed numbers, not a {:?} numbered {}",
            i.kind, i.ino
        )));
    }
    let parent_ok = if i.ino == ROOT_INO {
        i.parent == ROOT_INO
    } else {
        dir_number(i.parent) && i.parent != i.ino
    };
    if !parent_ok {
        return Err(invalid(format!(
            "directory {} cannot have {} as parent",
            i.ino, i.parent
        )));
    }
    fresh(i, 2, 0, 0)
}

/// A new file, symbolic link or special file, as `DirCreate` makes it: one link, at most the
/// creator's open handle, no parent; a symbolic link's size is its target's length.
fn new_placed(i: &Inode) -> Result<(), ErrorCode> {
    let target_ok = match i.kind {
        FileKind::Dir => return Err(invalid("DirCreate does not make directories")),
        FileKind::Symlink => {
            !i.target.is_empty() && i.target.len() <= SYMLINK_MAX && !i.target.contains(&0)
        }
        _ => i.target.is_empty(),
    };
    if !target_ok {
        return Err(invalid(format!(
            "a symbolic link, and nothing else, has a target of 1 to {SYMLINK_MAX} bytes \
             without NUL"
        )));
    }
    if i.parent != 0 {
        return Err(invalid("only a directory has a parent"));
    }
    fresh(i, 1, 1, i.target.len() as u64)
}

fn fresh(i: &Inode, nlink: u32, max_open: u32, size: u64) -> Result<(), ErrorCode> {
    if i.nlink != nlink || i.open_count > max_open || i.size != size || i.mode & !0o7777 != 0 {
        return Err(invalid(format!(
            "a new {:?} has {nlink} links, at most {max_open} open handles, size {size} and \
             permission bits only",
            i.kind
        )));
    }
    Ok(())
}

/// An entry added to directory `dir`: never the root or `dir` itself, and of the sort its
/// number says.
fn entry_for(dir: Ino, e: &DirEntry) -> Result<(), ErrorCode> {
    if e.ino == ROOT_INO || e.ino == 0 || e.ino == dir {
        return Err(invalid(format!(
            "inode {} cannot have a name in directory {dir}",
            e.ino
        )));
    }
    if (e.kind == FileKind::Dir) != dir_number(e.ino) {
        return Err(invalid(format!("inode {} cannot be a {:?}", e.ino, e.kind)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_placement::placed_ino;
    use tessera_proto::{SetAttr, Timespec};

    const P: u32 = 16;

    fn dir(ino: Ino, parent: Ino) -> Inode {
        Inode::new(ino, FileKind::Dir, 0o755, 0, 0, parent, Vec::new())
    }

    fn ok(op: &Op) -> bool {
        check(op, op.partition(P).unwrap(), P).is_ok()
    }

    #[test]
    fn only_directories_are_made_alone_and_only_with_hashed_numbers() {
        let create = |inode| Op::InodeCreate { inode };
        assert!(ok(&create(dir(ROOT_INO, ROOT_INO))), "the manager's root");
        assert!(ok(&create(dir(77, ROOT_INO))));
        let file = Inode::new(78, FileKind::File, 0o644, 0, 0, 0, Vec::new());
        let placed_dir = dir(placed_ino(3, 5, P), ROOT_INO);
        let mut linked = dir(79, ROOT_INO);
        linked.nlink = 0;
        let mut open = dir(79, ROOT_INO);
        open.open_count = 1;
        let mut typed = dir(79, ROOT_INO);
        typed.mode = 0o40755;
        for bad in [
            file,
            placed_dir,
            dir(0, ROOT_INO),
            dir(ROOT_INO, 5),
            dir(80, 0),
            dir(80, 80),
            linked,
            open,
            typed,
        ] {
            assert!(!ok(&create(bad.clone())), "{bad:?}");
        }
    }

    #[test]
    fn dir_create_makes_well_formed_placed_inodes_only() {
        // Into a directory of partition 3: a file placed there, or numbered `ino`.
        let dir = (2..).find(|&d| meta_partition(d, P) == 3).unwrap();
        let make = |ino, kind, target: &[u8]| {
            let op = Op::DirCreate {
                dir,
                name: b"n".to_vec(),
                inode: Inode::new(ino, kind, 0o644, 0, 0, 0, target.to_vec()),
                mtime: Timespec::default(),
                holder: 1,
            };
            check(&op, 3, P)
        };
        let here = |kind, target: &[u8]| make(placed_ino(3, 99, P), kind, target);
        assert_eq!(here(FileKind::File, b""), Ok(()));
        assert_eq!(here(FileKind::Symlink, b"/x"), Ok(()));
        assert_eq!(here(FileKind::CharDevice(7), b""), Ok(()));
        for (kind, target) in [
            (FileKind::Dir, &b""[..]),
            (FileKind::Symlink, b""),
            (FileKind::Symlink, b"a\0b"),
            (FileKind::File, b"x"),
        ] {
            assert!(here(kind, target).is_err(), "{kind:?} {target:?}");
        }
        assert!(here(FileKind::Symlink, &[b'x'; SYMLINK_MAX]).is_ok());
        assert!(here(FileKind::Symlink, &[b'x'; SYMLINK_MAX + 1]).is_err());
        // Placed elsewhere, or hashed.
        assert!(make(placed_ino(4, 99, P), FileKind::File, b"").is_err());
        assert!(make(dir, FileKind::File, b"").is_err());
    }

    #[test]
    fn entries_name_neither_the_root_nor_their_directory_and_match_their_numbers() {
        let insert = |dir, ino, kind| Op::DirInsert {
            dir,
            name: b"n".to_vec(),
            entry: DirEntry { ino, kind },
            replace: true,
            mtime: Timespec::default(),
        };
        let file = placed_ino(2, 9, P);
        assert!(ok(&insert(ROOT_INO, 50, FileKind::Dir)));
        assert!(ok(&insert(50, file, FileKind::Symlink)));
        for (dir, ino, kind) in [
            (50, ROOT_INO, FileKind::Dir),
            (50, 50, FileKind::Dir),
            (50, 0, FileKind::File),
            (50, 51, FileKind::File),
            (50, file, FileKind::Dir),
        ] {
            assert!(!ok(&insert(dir, ino, kind)), "{dir} {ino} {kind:?}");
        }
    }

    #[test]
    fn the_root_stays_and_directories_keep_their_shape() {
        assert!(!ok(&Op::DirDestroy { dir: ROOT_INO }));
        assert!(ok(&Op::DirDestroy { dir: 50 }));
        let link = |ino| Op::InodeLink {
            ino,
            delta: -1,
            ctime: Timespec::default(),
        };
        assert!(!ok(&link(ROOT_INO)));
        assert!(!ok(&link(50)));
        assert!(ok(&link(placed_ino(1, 1, P))));
        let set = |ino, size, parent| Op::InodeSetAttr {
            ino,
            attr: SetAttr {
                size,
                parent,
                ..SetAttr::default()
            },
        };
        let file = placed_ino(1, 1, P);
        assert!(ok(&set(50, None, Some(60))));
        assert!(ok(&set(file, Some(3), None)));
        assert_eq!(
            check(&set(50, Some(0), None), meta_partition(50, P), P),
            Err(ErrorCode::IsDir)
        );
        for (ino, parent) in [(ROOT_INO, 50), (50, 0), (50, 50), (50, file), (file, 50)] {
            assert!(!ok(&set(ino, None, Some(parent))), "{ino} {parent}");
        }
        let extend = |ino| Op::InodeExtend {
            ino,
            size: 1,
            mtime: Timespec::default(),
        };
        assert!(ok(&extend(file)));
        assert!(!ok(&extend(50)));
    }
}
