//! Metadata operations. Each is a short sequence of single-partition server operations; the
//! order is chosen so that a crash in the middle leaves at worst an unreachable inode, never a
//! directory entry pointing at nothing that could be mistaken for data.

use crate::options::OpenOptions;
use crate::route::{unexpected, Key};
use crate::{Client, Error, File, Result};
use bytes::Bytes;
use std::future::Future;
use tessera_placement::{meta_partition, placed_ino, Ino, ROOT_INO};
use tessera_proto::{
    check_name, DirEntry, ErrorCode, FileKind, Inode, Listed, Op, Response, SetAttr, Timespec,
    DIR_PAGE_MAX, SYMLINK_MAX,
};
mod fsck;
mod remove;

pub use fsck::{Fsck, Orphan};
pub use remove::{Moved, Unlinked};

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

    /// [`Self::meta`] for a read, which a mirror answers when the primary does not.
    async fn read_meta(&self, ino: Ino, op: Op) -> Result<Response> {
        self.router
            .read_meta(self.lane.as_ref(), Key::Meta(ino), op)
            .await
    }

    async fn meta_inode(&self, ino: Ino, op: Op) -> Result<Inode> {
        inode_of(self.meta(ino, op).await?)
    }

    /// Attributes of an inode.
    pub async fn getattr(&self, ino: Ino) -> Result<Inode> {
        inode_of(self.read_meta(ino, Op::InodeGet { ino }).await?)
    }

    /// The entry `name` of directory `parent`, and its inode if it lives with the entry.
    async fn find(&self, parent: Ino, name: &[u8]) -> Result<(DirEntry, Option<Inode>)> {
        check_name(name)?;
        let op = Op::DirLookup {
            dir: parent,
            name: name.to_vec(),
        };
        match self.read_meta(parent, op).await? {
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
        match self.read_meta(dir, op).await? {
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
        holder: Option<u64>,
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
        inode.open_count = u32::from(holder.is_some());
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
        holder: Option<u64>,
    ) -> Result<(Inode, Option<Inode>)> {
        check_name(name)?;
        if kind == FileKind::Dir {
            return Ok((self.make_dir(parent, name, mode).await?, None));
        }
        let partitions = self.router.config().partitions;
        let mut tries = 0;
        loop {
            let ino = new_ino(kind, parent, partitions);
            let inode = self.new_inode(ino, kind, mode, parent, target.clone(), holder);
            match self.name_new(parent, name, &inode, holder).await? {
                Named::Made(dir) => return Ok((inode, dir)),
                Named::NumberTaken(_) if tries < 8 => tries += 1,
                Named::NumberTaken(e) => return Err(e),
            }
        }
    }

    /// Creates `inode` with its name in `parent` (`DirCreate`), opened under lease `holder`
    /// if given.
    async fn name_new(
        &self,
        parent: Ino,
        name: &[u8],
        inode: &Inode,
        holder: Option<u64>,
    ) -> Result<Named> {
        let op = Op::DirCreate {
            dir: parent,
            name: name.to_vec(),
            inode: inode.clone(),
            mtime: Timespec::now(),
            holder: holder.unwrap_or(0),
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
            let inode = self.new_inode(ino, FileKind::Dir, mode, parent, Vec::new(), None);
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
        let holder = self.lease.holder();
        match self
            .make(parent, name, FileKind::File, mode, Vec::new(), Some(holder))
            .await
        {
            Ok((inode, dir)) => Ok((File::new(self.clone(), inode, opts, Some(holder)), dir)),
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
        let holder = self.lease.holder();
        let inode = self.new_inode(ino, FileKind::File, mode, parent, Vec::new(), Some(holder));
        let (me, name, made) = (self.clone(), name.to_vec(), inode.clone());
        let request = async move {
            match me.name_new(parent, &name, &made, Some(holder)).await? {
                Named::Made(dir) => Ok(dir),
                // Its number is handed out already: no other may be drawn.
                Named::NumberTaken(e) => Err(e),
            }
        };
        Ok((File::new(self.clone(), inode, opts, Some(holder)), request))
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
        let made = self.make(parent, name, FileKind::Dir, mode, Vec::new(), None);
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
            .make(parent, name, kind, mode, Vec::new(), None)
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
            None,
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

    /// Opens an existing inode. An open for reading only is made by a mirror when the
    /// inode's primary does not answer: not counted (no server holds it open), it reads what
    /// the mirrors hold while the manager is away and cannot replace the primary.
    pub async fn open_ino(&self, ino: Ino, opts: &OpenOptions) -> Result<File> {
        let holder = self.lease.holder();
        let open = Op::InodeOpen { ino, holder };
        let reading = !(opts.write || opts.append || opts.truncate);
        let called = self
            .router
            .call_or_mirror(
                self.lane.as_ref(),
                Key::Meta(ino),
                open,
                Bytes::new(),
                reading.then_some(Op::InodeGet { ino }),
            )
            .await;
        let inode = inode_of(called.answer?.0)?;
        // A primary that got the open but never answered may have counted it: the count
        // lapses with the lease, as a dead client's would.
        let holder = (!called.by_mirror).then_some(holder);
        if let Some(holder) = holder {
            if inode.kind == FileKind::Dir && (opts.write || opts.append) {
                let _ = self.meta(ino, Op::InodeClose { ino, holder }).await;
                return Err(ErrorCode::IsDir.into());
            }
        }
        let mut file = File::new(self.clone(), inode, opts, holder);
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

fn inode_of(resp: Response) -> Result<Inode> {
    match resp {
        Response::Inode(i) => Ok(i),
        other => Err(unexpected(&other)),
    }
}
