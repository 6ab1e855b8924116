//! Removing and moving names: unlink, rmdir and rename, each ordered so that a crash in the
//! middle leaves at worst an unreachable inode or a name that still leads to its inode.

use crate::route::unexpected;
use crate::{Client, Error, Result};
use tessera_placement::{Ino, ROOT_INO};
use tessera_proto::{
    check_name, DirEntry, ErrorCode, FileKind, Inode, Op, Response, SetAttr, Timespec,
};
use tracing::warn;

/// What a rename replaced.
#[derive(Debug, Clone, Default)]
pub struct Moved {
    /// The file or directory the target name led to.
    pub replaced: Option<Ino>,
    /// The directory right after, when the server reported it (a rename within one).
    pub dir: Option<Inode>,
}

/// What an unlink removed.
#[derive(Debug, Clone, Default)]
pub struct Unlinked {
    /// The inode the name led to (unknown after a failover re-sent the request).
    pub ino: Option<Ino>,
    /// The directory right after, when the server reported it (as [`Client::create_in`]).
    pub dir: Option<Inode>,
}

impl Client {
    /// Drops one link of `ino`. If that was the last link and no handle is open, the server
    /// deletes it and drops its data.
    pub(super) async fn unref(&self, ino: Ino) -> Result<()> {
        let op = Op::InodeLink {
            ino,
            delta: -1,
            ctime: Timespec::now(),
        };
        match self.meta(ino, op).await? {
            Response::Links { .. } => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Removes a non-directory name. An open file keeps its data until its last close. A
    /// placed file (inode with its directory) loses name and link in one request.
    pub async fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.unlink_in(parent, name).await.map(drop)
    }

    /// [`Self::unlink`], also telling what it removed.
    pub async fn unlink_in(&self, parent: Ino, name: &[u8]) -> Result<Unlinked> {
        check_name(name)?;
        let op = Op::DirUnlink {
            dir: parent,
            name: name.to_vec(),
            mtime: Timespec::now(),
        };
        let (entry, dir) = match self.meta_resent(parent, op).await {
            (
                Ok(Response::Unlinked {
                    nlink: Some(_),
                    entry,
                    dir,
                }),
                _,
            ) => {
                return Ok(Unlinked {
                    ino: Some(entry.ino),
                    dir: Some(dir),
                });
            }
            (Ok(Response::Unlinked { entry, dir, .. }), _) => (entry, dir),
            (Ok(other), _) => return Err(unexpected(&other)),
            // Re-sent after the primary died: our removal was applied. Which inode the name
            // led to is unknown now, so its link stays (an unreachable inode at worst, as after
            // a client crash between the two steps).
            (Err(e), true) if e.is(&ErrorCode::NotFound) => {
                warn!(
                    parent,
                    "unlink re-sent after a failover found the name gone"
                );
                return Ok(Unlinked::default());
            }
            (Err(e), _) => return Err(e),
        };
        self.unref(entry.ino).await?;
        Ok(Unlinked {
            ino: Some(entry.ino),
            dir: Some(dir),
        })
    }

    /// Removes an empty directory.
    pub async fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        let entry = self.lookup_entry(parent, name).await?;
        if entry.kind != FileKind::Dir {
            return Err(ErrorCode::NotDir.into());
        }
        // A directory already gone (an rmdir that stopped halfway) leaves its name to remove.
        match self
            .meta(entry.ino, Op::DirDestroy { dir: entry.ino })
            .await
        {
            Err(e) if !e.is(&ErrorCode::NotFound) => return Err(e),
            _ => {}
        }
        let op = Op::DirRemove {
            dir: parent,
            name: name.to_vec(),
            expect: Some(entry.ino),
            want_dir: Some(true),
            mtime: Timespec::now(),
        };
        self.dirs.forget(parent, name);
        self.ok_unless_resent_gone(parent, op).await
    }

    /// For a removal (`DirRemove`): `NotFound` after the request was re-sent following a
    /// primary's death means our first attempt removed it: success.
    async fn ok_unless_resent_gone(&self, ino: Ino, op: Op) -> Result<()> {
        match self.meta_resent(ino, op).await {
            (Ok(_), _) => Ok(()),
            (Err(e), true) if e.is(&ErrorCode::NotFound) => Ok(()),
            (Err(e), _) => Err(e),
        }
    }

    /// Is `dir` empty?
    async fn is_empty(&self, dir: Ino) -> Result<bool> {
        Ok(self.readdir(dir, None, 1).await?.0.is_empty())
    }

    /// Renames `parent/name` to `new_parent/new_name`, replacing a target as POSIX allows
    /// (unless `noreplace`). Within one directory this is one atomic server operation, which
    /// also checks the kinds, sets the moved file's ctime and drops a replaced file's link
    /// (one request, unless the target is a directory, whose emptiness is checked first);
    /// across directories the new name is linked before the old one is removed, so the file
    /// is never without a name (it may briefly have both).
    pub async fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        noreplace: bool,
    ) -> Result<Moved> {
        check_name(name)?;
        check_name(new_name)?;
        if parent == new_parent {
            match self
                .rename_within(parent, name, new_name, noreplace, false)
                .await
            {
                // A directory at the target (or a file moved onto one): checked below.
                Err(e) if e.is(&ErrorCode::IsDir) => {}
                done => return done,
            }
        }
        if parent != new_parent && self.lookup_entry(parent, name).await?.kind == FileKind::Dir {
            // Its loop check and its changes are one decision under the cluster's rename lock,
            // which another directory's move across parents also takes.
            let holder = rand::random::<u64>();
            self.meta(ROOT_INO, Op::RenameLock { holder }).await?;
            let moved = self
                .rename_across(parent, name, new_parent, new_name, noreplace)
                .await;
            // Not given back (the server is gone), the lock is lost with its lease.
            if let Err(e) = self.meta(ROOT_INO, Op::RenameUnlock { holder }).await {
                warn!("giving back the rename lock: {e}");
            }
            return moved;
        }
        self.rename_across(parent, name, new_parent, new_name, noreplace)
            .await
    }

    /// A rename that [`Self::rename_within`] could not do alone: across directories, or onto a
    /// directory. Looks both names up afresh (under the rename lock when moving a directory).
    async fn rename_across(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        noreplace: bool,
    ) -> Result<Moved> {
        let src = self.lookup_entry(parent, name).await?;
        let dst = match self.lookup_entry(new_parent, new_name).await {
            Ok(e) => Some(e),
            Err(e) if e.is(&ErrorCode::NotFound) => None,
            Err(e) => return Err(e),
        };
        if let Some(dst) = dst {
            if noreplace {
                return Err(ErrorCode::Exists.into());
            }
            if dst.ino == src.ino {
                // POSIX: both names are links to the same file: nothing to do.
                return Ok(Moved::default());
            }
            match (src.kind == FileKind::Dir, dst.kind == FileKind::Dir) {
                (true, true) if !self.is_empty(dst.ino).await? => {
                    return Err(ErrorCode::NotEmpty.into())
                }
                (true, false) => return Err(ErrorCode::NotDir.into()),
                (false, true) => return Err(ErrorCode::IsDir.into()),
                _ => {}
            }
        }
        if parent == new_parent {
            return self
                .rename_within(parent, name, new_name, noreplace, true)
                .await;
        }
        if src.kind == FileKind::Dir && self.is_ancestor(src.ino, new_parent).await? {
            return Err(Error::Invalid("cannot move a directory into itself".into()));
        }
        let now = Timespec::now();
        let replaced = self.insert(new_parent, new_name, src, !noreplace).await?;
        let op = Op::DirRemove {
            dir: parent,
            name: name.to_vec(),
            expect: Some(src.ino),
            want_dir: None,
            mtime: now,
        };
        self.ok_unless_resent_gone(parent, op).await?;
        self.dirs.forget(parent, name);
        self.dirs.forget(new_parent, new_name);
        // A moved directory gets its new parent (its `..`) and the time at once.
        let attr = SetAttr {
            parent: (src.kind == FileKind::Dir).then_some(new_parent),
            ctime: now,
            ..SetAttr::default()
        };
        self.meta(src.ino, Op::InodeSetAttr { ino: src.ino, attr })
            .await?;
        let replaced = replaced.filter(|old| old.ino != src.ino);
        self.replaced(replaced, false).await?;
        Ok(Moved {
            replaced: replaced.map(|old| old.ino),
            dir: None,
        })
    }

    /// A rename within `parent` (`Op::DirRename`), and what is left of it to do here.
    async fn rename_within(
        &self,
        parent: Ino,
        name: &[u8],
        new_name: &[u8],
        noreplace: bool,
        replace_dir: bool,
    ) -> Result<Moved> {
        let now = Timespec::now();
        let op = Op::DirRename {
            dir: parent,
            from: name.to_vec(),
            to: new_name.to_vec(),
            replace: !noreplace,
            replace_dir,
            mtime: now,
        };
        let renamed = match self.meta_resent(parent, op).await {
            (Ok(r @ Response::Renamed { .. }), _) => r,
            (Ok(other), _) => return Err(unexpected(&other)),
            // Re-sent after the primary died: our rename may have been applied already (the
            // old name gone, the new one there); what it replaced then keeps its link.
            (Err(e), true)
                if e.is(&ErrorCode::NotFound)
                    && self.lookup_entry(parent, new_name).await.is_ok() =>
            {
                return Ok(Moved::default());
            }
            (Err(e), _) => return Err(e),
        };
        let Response::Renamed {
            moved,
            ctime_set,
            replaced,
            nlink,
            dir,
        } = renamed
        else {
            return Err(unexpected(&renamed));
        };
        let Some(moved) = moved else {
            // Nothing changed.
            return Ok(Moved {
                replaced: None,
                dir: Some(dir),
            });
        };
        self.dirs.forget(parent, name);
        self.dirs.forget(parent, new_name);
        if !ctime_set {
            let attr = SetAttr {
                ctime: now,
                ..SetAttr::default()
            };
            self.meta(
                moved.ino,
                Op::InodeSetAttr {
                    ino: moved.ino,
                    attr,
                },
            )
            .await?;
        }
        self.replaced(replaced, nlink.is_some()).await?;
        Ok(Moved {
            replaced: replaced.map(|old| old.ino),
            dir: Some(dir),
        })
    }

    /// Finishes off what a rename replaced: a directory is destroyed; a file loses its link,
    /// unless the server dropped it already (`unlinked`).
    async fn replaced(&self, old: Option<DirEntry>, unlinked: bool) -> Result<()> {
        match old {
            Some(old) if old.kind == FileKind::Dir => {
                self.meta(old.ino, Op::DirDestroy { dir: old.ino }).await?;
            }
            Some(old) if !unlinked => self.unref(old.ino).await?,
            _ => {}
        }
        Ok(())
    }

    /// Is directory `ancestor` on the path from `dir` up to the root?
    async fn is_ancestor(&self, ancestor: Ino, mut dir: Ino) -> Result<bool> {
        for _ in 0..4096 {
            if dir == ancestor {
                return Ok(true);
            }
            if dir == ROOT_INO {
                return Ok(false);
            }
            dir = self.getattr(dir).await?.parent;
        }
        Err(Error::Loop)
    }
}
