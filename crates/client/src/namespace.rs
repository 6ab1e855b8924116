//! Metadata operations. Each is a short sequence of single-partition server operations; the
//! order is chosen so that a crash in the middle leaves at worst an unreachable inode, never a
//! directory entry pointing at nothing that could be mistaken for data.

use crate::route::{unexpected, Key};
use crate::{Client, Error, File, Result, WriteAck};
use bytes::Bytes;
use std::future::Future;
use tessera_placement::{meta_partition, placed_ino, Ino, ROOT_INO};
use tessera_proto::{
    check_name, DirEntry, ErrorCode, FileKind, Inode, Listed, Op, Response, SetAttr, Timespec,
    DIR_PAGE_MAX, SYMLINK_MAX,
};
use tracing::warn;

/// How to open a file; mirrors `std::fs::OpenOptions`.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    pub read: bool,
    pub write: bool,
    pub append: bool,
    pub truncate: bool,
    pub create: bool,
    pub create_new: bool,
    /// Permission bits for a new file (before the umask, for opens by path).
    pub mode: u32,
    /// When this file's writes count as done; `None`: the client's `write_ack`.
    pub write_ack: Option<WriteAck>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            read: true,
            write: false,
            append: false,
            truncate: false,
            create: false,
            create_new: false,
            mode: 0o666,
            write_ack: None,
        }
    }
}

impl OpenOptions {
    /// Read only.
    #[must_use]
    pub fn read() -> Self {
        Self::default()
    }
    /// Write, creating or truncating (like `File::create`).
    #[must_use]
    pub fn create() -> Self {
        Self {
            read: false,
            write: true,
            truncate: true,
            create: true,
            ..Self::default()
        }
    }
    /// Read and write an existing file.
    #[must_use]
    pub fn read_write() -> Self {
        Self {
            write: true,
            ..Self::default()
        }
    }
}

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

/// Capacity and use of the whole cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub capacity: u64,
    pub used: u64,
    pub inodes: u64,
    pub nodes: u32,
}

/// A number for a new inode of `kind` in directory `parent`. Numbers are drawn at random and
/// claimed with an exclusive create: unique without a central allocator. A directory's number
/// hashes, so directories spread over all nodes; anything else is placed in its directory's
/// partition (`placed_ino`), where its name is, so that create and lookup are one request each.
fn new_ino(kind: FileKind, parent: Ino, partitions: u32) -> Ino {
    if kind != FileKind::Dir {
        let p = meta_partition(parent, partitions);
        return placed_ino(p, rand::random(), partitions);
    }
    // Below PLACED_INO; 0 and the root are never drawn.
    loop {
        let ino = rand::random::<u64>() >> 2;
        if ino > ROOT_INO {
            return ino;
        }
    }
}

/// What naming a new inode came to.
enum Named {
    /// Made; the directory's attributes after, when the server gave them.
    Made(Option<Inode>),
    /// The inode number was taken, not the name: another may be drawn.
    NumberTaken(Error),
}

impl Client {
    pub(crate) async fn meta(&self, ino: Ino, op: Op) -> Result<Response> {
        Ok(self
            .router
            .call(self.lane.as_ref(), Key::Meta(ino), op, Bytes::new())
            .await?
            .0)
    }

    /// [`Self::meta`], also telling whether the request was re-sent after a server that may have
    /// applied it failed to answer (a primary that died mid-request had forwarded the change to
    /// the mirror that now answers): a non-idempotent operation may then meet its own effect.
    async fn meta_resent(&self, ino: Ino, op: Op) -> (Result<Response>, bool) {
        let (r, resent) = self
            .router
            .call_ex(self.lane.as_ref(), Key::Meta(ino), op, Bytes::new())
            .await;
        (r.map(|(resp, _)| resp), resent)
    }

    async fn meta_inode(&self, ino: Ino, op: Op) -> Result<Inode> {
        match self.meta(ino, op).await? {
            Response::Inode(i) => Ok(i),
            other => Err(unexpected(&other)),
        }
    }

    /// Attributes of an inode.
    pub async fn getattr(&self, ino: Ino) -> Result<Inode> {
        self.meta_inode(ino, Op::InodeGet { ino }).await
    }

    /// The entry `name` of directory `parent`, and its inode if it lives with the entry.
    async fn find(&self, parent: Ino, name: &[u8]) -> Result<(DirEntry, Option<Inode>)> {
        check_name(name)?;
        let op = Op::DirLookup {
            dir: parent,
            name: name.to_vec(),
        };
        match self.meta(parent, op).await? {
            Response::Found { entry, inode } => Ok((entry, inode)),
            other => Err(unexpected(&other)),
        }
    }

    /// The entry `name` of directory `parent`.
    pub async fn lookup_entry(&self, parent: Ino, name: &[u8]) -> Result<DirEntry> {
        Ok(self.find(parent, name).await?.0)
    }

    /// The inode named `name` in directory `parent`: one request for a file placed with its
    /// directory, two for a directory or a file renamed or linked from elsewhere.
    pub async fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Inode> {
        match self.find(parent, name).await? {
            (_, Some(inode)) => Ok(inode),
            (entry, None) => self.getattr(entry.ino).await,
        }
    }

    /// Changes attributes; a new size also cuts or extends the file's data.
    pub async fn setattr(&self, ino: Ino, attr: SetAttr) -> Result<Inode> {
        let size = attr.size;
        let inode = self.meta_inode(ino, Op::InodeSetAttr { ino, attr }).await?;
        if let Some(size) = size {
            // Cut the stripes after the size is set: readers clamp to the size, so nobody sees
            // the old bytes past it in between.
            self.router
                .broadcast(Op::TruncateStripes { file: ino, size })
                .await?;
        }
        Ok(inode)
    }

    /// One page of a directory's entries, in name order, after `after`, with the inodes that
    /// live with them.
    pub async fn readdir(
        &self,
        dir: Ino,
        after: Option<&[u8]>,
        limit: u32,
    ) -> Result<(Vec<Listed>, bool)> {
        let op = Op::DirList {
            dir,
            after: after.map(<[u8]>::to_vec),
            limit: limit.min(DIR_PAGE_MAX),
        };
        match self.meta(dir, op).await? {
            Response::Entries { entries, more } => Ok((entries, more)),
            other => Err(unexpected(&other)),
        }
    }

    /// All entries of a directory, with the inodes that live with them.
    pub async fn readdir_all(&self, dir: Ino) -> Result<Vec<Listed>> {
        let mut all: Vec<Listed> = Vec::new();
        loop {
            let after = all.last().map(|(n, _, _)| n.as_slice());
            let (page, more) = self.readdir(dir, after, DIR_PAGE_MAX).await?;
            all.extend(page);
            if !more {
                return Ok(all);
            }
        }
    }

    fn new_inode(
        &self,
        ino: Ino,
        kind: FileKind,
        mode: u32,
        parent: Ino,
        target: Vec<u8>,
        open: bool,
    ) -> Inode {
        let mut inode = Inode::new(
            ino,
            kind,
            mode,
            self.opts.uid,
            self.opts.gid,
            parent,
            target,
        );
        inode.open_count = u32::from(open);
        inode
    }

    async fn insert(
        &self,
        parent: Ino,
        name: &[u8],
        entry: DirEntry,
        replace: bool,
    ) -> Result<Option<DirEntry>> {
        let op = Op::DirInsert {
            dir: parent,
            name: name.to_vec(),
            entry,
            replace,
            mtime: Timespec::now(),
        };
        match self.meta_resent(parent, op).await {
            (Ok(Response::Replaced(old)), _) => Ok(old),
            (Ok(other), _) => Err(unexpected(&other)),
            // Re-sent after the primary died: `Exists` may be our own insert, already applied.
            (Err(e), true) if e.is(&ErrorCode::Exists) && !replace => {
                match self.lookup_entry(parent, name).await {
                    Ok(found) if found.ino == entry.ino => Ok(None),
                    _ => Err(e),
                }
            }
            (Err(e), _) => Err(e),
        }
    }

    /// Is the inode now numbered `mine.ino` the one we created (not another client's)?
    async fn is_ours(&self, mine: &Inode) -> bool {
        self.getattr(mine.ino).await.is_ok_and(|i| {
            (i.kind, i.ctime, i.uid, i.gid, i.mode, i.parent)
                == (
                    mine.kind,
                    mine.ctime,
                    mine.uid,
                    mine.gid,
                    mine.mode,
                    mine.parent,
                )
        })
    }

    /// Creates an inode and links it into `parent`. Anything but a directory is placed in the
    /// directory's partition and created with its name in one request (`DirCreate`), whose
    /// answer also gives the directory's attributes after the insert (returned second).
    async fn make(
        &self,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        target: Vec<u8>,
        open: bool,
    ) -> Result<(Inode, Option<Inode>)> {
        check_name(name)?;
        if kind == FileKind::Dir {
            return Ok((self.make_dir(parent, name, mode).await?, None));
        }
        let partitions = self.router.config().partitions;
        let mut tries = 0;
        loop {
            let ino = new_ino(kind, parent, partitions);
            let inode = self.new_inode(ino, kind, mode, parent, target.clone(), open);
            match self.name_new(parent, name, &inode).await? {
                Named::Made(dir) => return Ok((inode, dir)),
                Named::NumberTaken(_) if tries < 8 => tries += 1,
                Named::NumberTaken(e) => return Err(e),
            }
        }
    }

    /// Creates `inode` with its name in `parent` (`DirCreate`).
    async fn name_new(&self, parent: Ino, name: &[u8], inode: &Inode) -> Result<Named> {
        let op = Op::DirCreate {
            dir: parent,
            name: name.to_vec(),
            inode: inode.clone(),
            mtime: Timespec::now(),
        };
        let (r, resent) = self.meta_resent(parent, op).await;
        let e = match r {
            Ok(Response::Inode(dir)) => return Ok(Named::Made(Some(dir))),
            Ok(other) => return Err(unexpected(&other)),
            Err(e) if e.is(&ErrorCode::Exists) => e,
            Err(e) => return Err(e),
        };
        // The name is taken or, rarely, the number: the entry tells which.
        match self.lookup_entry(parent, name).await {
            // Re-sent after the primary died: our own create, applied.
            Ok(found) if resent && found.ino == inode.ino => Ok(Named::Made(None)),
            Err(nf) if nf.is(&ErrorCode::NotFound) => Ok(Named::NumberTaken(e)),
            _ => Err(e),
        }
    }

    /// A directory's inode lives in a partition of its own (where its entries go), so it is
    /// created first and named second (the inode is removed again if the name is taken): in
    /// that order a name, once visible, always leads to an inode.
    async fn make_dir(&self, parent: Ino, name: &[u8], mode: u32) -> Result<Inode> {
        let partitions = self.router.config().partitions;
        let mut tries = 0;
        let inode = loop {
            let ino = new_ino(FileKind::Dir, parent, partitions);
            let inode = self.new_inode(ino, FileKind::Dir, mode, parent, Vec::new(), false);
            let op = Op::InodeCreate {
                inode: inode.clone(),
            };
            match self.meta_resent(ino, op).await {
                (Ok(_), _) => break inode,
                // Re-sent after the primary died: `Exists` may be our own create, applied.
                (Err(e), true) if e.is(&ErrorCode::Exists) && self.is_ours(&inode).await => {
                    break inode
                }
                (Err(e), _) if e.is(&ErrorCode::Exists) && tries < 8 => tries += 1,
                (Err(e), _) => return Err(e),
            }
        };
        let entry = DirEntry {
            ino: inode.ino,
            kind: FileKind::Dir,
        };
        if let Err(e) = self.insert(parent, name, entry, false).await {
            let _ = self
                .meta(inode.ino, Op::DirDestroy { dir: inode.ino })
                .await;
            return Err(e);
        }
        Ok(inode)
    }

    /// Creates a regular file and opens it. With `exclusive` an existing name is an error;
    /// otherwise an existing file is opened (and truncated if `opts.truncate`).
    pub async fn create(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        opts: &OpenOptions,
    ) -> Result<File> {
        Ok(self.create_in(parent, name, mode, exclusive, opts).await?.0)
    }

    /// [`Self::create`], also returning the attributes of `parent` right after the file was
    /// created in it, when the server reported them (a mount answers the kernel's next look
    /// at the directory with them).
    pub async fn create_in(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        opts: &OpenOptions,
    ) -> Result<(File, Option<Inode>)> {
        match self
            .make(parent, name, FileKind::File, mode, Vec::new(), true)
            .await
        {
            Ok((inode, dir)) => Ok((File::new(self.clone(), inode, opts), dir)),
            Err(e) if e.is(&ErrorCode::Exists) && !exclusive => {
                let entry = self.lookup_entry(parent, name).await?;
                Ok((self.open_ino(entry.ino, opts).await?, None))
            }
            Err(e) => Err(e),
        }
    }

    /// A file created ahead of its request: the open file, to hand out now, and the request
    /// that makes it, giving what [`Self::create_in`] gives of `parent`. Only for a caller
    /// that knows `name` is free in `parent` and stays free until the request is answered (a
    /// mount that holds the directory's completeness promise, which the server recalls from
    /// it before anyone else adds a name there); until then, the file takes only writes that
    /// stay in its buffer ([`File::buffers`]).
    pub fn create_ahead(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        opts: &OpenOptions,
    ) -> Result<(
        File,
        impl Future<Output = Result<Option<Inode>>> + Send + 'static,
    )> {
        check_name(name)?;
        let ino = new_ino(FileKind::File, parent, self.router.config().partitions);
        let inode = self.new_inode(ino, FileKind::File, mode, parent, Vec::new(), true);
        let (me, name, made) = (self.clone(), name.to_vec(), inode.clone());
        let request = async move {
            match me.name_new(parent, &name, &made).await? {
                Named::Made(dir) => Ok(dir),
                // Its number is handed out already: no other may be drawn.
                Named::NumberTaken(e) => Err(e),
            }
        };
        Ok((File::new(self.clone(), inode, opts), request))
    }

    /// Gives back `dir`'s completeness promise, which its server recalled (`Notice::Listing`):
    /// every create answered ahead there is in.
    pub async fn relinquish(&self, dir: Ino) -> Result<()> {
        match self.meta(dir, Op::Relinquish { dir }).await? {
            Response::Ok => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn mkdir(&self, parent: Ino, name: &[u8], mode: u32) -> Result<Inode> {
        let made = self.make(parent, name, FileKind::Dir, mode, Vec::new(), false);
        Ok(made.await?.0)
    }

    /// A named pipe, socket or device node (the other kinds have their own calls).
    pub async fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        mode: u32,
    ) -> Result<Inode> {
        if matches!(kind, FileKind::File | FileKind::Dir | FileKind::Symlink) {
            return Err(Error::Invalid(format!("mknod does not make a {kind:?}")));
        }
        Ok(self
            .make(parent, name, kind, mode, Vec::new(), false)
            .await?
            .0)
    }

    pub async fn symlink(&self, parent: Ino, name: &[u8], target: &[u8]) -> Result<Inode> {
        if target.is_empty() || target.len() > SYMLINK_MAX || target.contains(&0) {
            return Err(Error::Invalid(format!(
                "symbolic link target must be 1 to {SYMLINK_MAX} bytes without NUL"
            )));
        }
        let made = self.make(
            parent,
            name,
            FileKind::Symlink,
            0o777,
            target.to_vec(),
            false,
        );
        Ok(made.await?.0)
    }

    pub async fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let inode = self.getattr(ino).await?;
        if inode.kind != FileKind::Symlink {
            return Err(Error::Invalid("not a symbolic link".into()));
        }
        Ok(inode.target)
    }

    /// A new name for an existing file (a hard link).
    pub async fn link(&self, ino: Ino, parent: Ino, name: &[u8]) -> Result<Inode> {
        check_name(name)?;
        let inode = self.getattr(ino).await?;
        if inode.kind == FileKind::Dir {
            return Err(Error::Permission(
                "hard links to directories are not allowed".into(),
            ));
        }
        let now = Timespec::now();
        self.meta(
            ino,
            Op::InodeLink {
                ino,
                delta: 1,
                ctime: now,
            },
        )
        .await?;
        if let Err(e) = self
            .insert(
                parent,
                name,
                DirEntry {
                    ino,
                    kind: inode.kind,
                },
                false,
            )
            .await
        {
            // Best effort: the link that never got its name.
            let _ = self.unref(ino).await;
            return Err(e);
        }
        self.getattr(ino).await
    }

    /// Drops one link of `ino`. If that was the last link and no handle is open, the server
    /// deletes it and drops its data.
    async fn unref(&self, ino: Ino) -> Result<()> {
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

    /// Opens an existing inode.
    pub async fn open_ino(&self, ino: Ino, opts: &OpenOptions) -> Result<File> {
        let inode = self.meta_inode(ino, Op::InodeOpen { ino }).await?;
        if inode.kind == FileKind::Dir && (opts.write || opts.append) {
            let _ = self.meta(ino, Op::InodeClose { ino }).await;
            return Err(ErrorCode::IsDir.into());
        }
        let mut file = File::new(self.clone(), inode, opts);
        if opts.truncate && (opts.write || opts.append) {
            if let Err(e) = file.set_len(0).await {
                let _ = file.close().await;
                return Err(e);
            }
        }
        Ok(file)
    }

    /// Capacity and use summed over the live servers.
    pub async fn usage(&self) -> Result<Usage> {
        let status = self.status().await?;
        let live = status.nodes.iter().filter(|n| n.alive);
        let mut u = Usage {
            capacity: 0,
            used: 0,
            inodes: 0,
            nodes: 0,
        };
        for n in live {
            u.capacity += n.stats.capacity;
            u.used += n.stats.used;
            u.inodes += n.stats.inodes;
            u.nodes += 1;
        }
        Ok(u)
    }
}
