//! Names in directories: lookup, mknod, mkdir, unlink, rmdir, symlink (and readlink), rename
//! and link.

use crate::complete::Complete;
use crate::convert::{errno, ino_errno};
use crate::fs::Fs;
use crate::guard::{Entered, Settled};
use crate::trace::{ReplyData, ReplyEmpty, ReplyEntry};
use fuser::{Errno, INodeNo, RenameFlags, Request};
use std::sync::Arc;
use tessera_client::{FileKind, Name, OpenOptions, NAME_MAX};

impl Fs {
    /// A name this mount knows absent (`complete.rs`) is answered so at once, without waiting
    /// for the creates answered ahead in the directory.
    pub(crate) fn lookup(
        self: &Arc<Self>,
        e: Entered,
        parent: INodeNo,
        name: Name,
        reply: ReplyEntry,
    ) {
        if name.len() <= NAME_MAX && self.complete().is_some_and(|c| c.absent(parent.0, &name)) {
            return reply.error(Errno::ENOENT);
        }
        let s = e.settle(self, &[parent.0]);
        self.serve(s, move |fs| async move {
            let since = fs.since();
            let r = fs.client.lookup(parent.0, &name).await;
            let lease = since.map(|s| (s, parent.0, &name[..]));
            fs.entry(reply, r, lease);
        });
    }

    pub(crate) fn readlink(self: &Arc<Self>, s: Settled, ino: INodeNo, reply: ReplyData) {
        self.serve(s, move |fs| async move {
            match fs.client.readlink(ino.0).await {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(ino_errno(&e)),
            }
        });
    }

    #[allow(clippy::too_many_arguments)] // the kernel's request, as fuser hands it
    pub(crate) fn mknod(
        self: &Arc<Self>,
        s: Settled,
        req: &Request,
        parent: INodeNo,
        name: Name,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let special = match mode & libc::S_IFMT {
            libc::S_IFREG => None,
            libc::S_IFIFO => Some(FileKind::Fifo),
            libc::S_IFSOCK => Some(FileKind::Socket),
            // Stored so that tools copying a tree keep them; the mount is nodev, so they
            // cannot be opened through it.
            libc::S_IFCHR => Some(FileKind::CharDevice(rdev)),
            libc::S_IFBLK => Some(FileKind::BlockDevice(rdev)),
            _ => return reply.error(Errno::EINVAL),
        };
        let client = self.caller(req);
        let perm = mode & !umask & 0o7777;
        self.adding(parent, &name);
        self.serve(s, move |fs| async move {
            let r = match special {
                Some(kind) => client.mknod(parent.0, &name, kind, perm).await,
                None => {
                    async {
                        let f = client
                            .create(parent.0, &name, perm, true, &OpenOptions::create())
                            .await?;
                        let attr = f.attr();
                        f.close().await?;
                        Ok(attr)
                    }
                    .await
                }
            };
            fs.dir_changed(parent.0, None);
            fs.entry(reply, r, None);
        });
    }

    /// A directory made here is one whose every name this mount knows (`complete.rs`).
    pub(crate) fn mkdir(
        self: &Arc<Self>,
        s: Settled,
        req: &Request,
        parent: INodeNo,
        name: Name,
        mode: u32,
        reply: ReplyEntry,
    ) {
        let client = self.caller(req);
        self.adding(parent, &name);
        self.serve(s, move |fs| async move {
            let cuts = fs.complete().map(Complete::cuts);
            let r = client.mkdir(parent.0, &name, mode).await;
            if let (Ok(dir), Some(cuts), Some(c)) = (&r, cuts, fs.complete()) {
                c.made(cuts, dir.ino);
            }
            fs.dir_changed(parent.0, None);
            fs.entry(reply, r, None);
        });
    }

    pub(crate) fn unlink(
        self: &Arc<Self>,
        s: Settled,
        parent: INodeNo,
        name: Name,
        reply: ReplyEmpty,
    ) {
        self.serve(s, move |fs| async move {
            match fs.client.unlink_in(parent.0, &name).await {
                Ok(gone) => {
                    fs.dir_changed(parent.0, gone.dir);
                    reply.ok();
                }
                Err(e) => {
                    fs.dir_changed(parent.0, None);
                    reply.error(errno(&e));
                }
            }
        });
    }

    pub(crate) fn rmdir(
        self: &Arc<Self>,
        s: Settled,
        parent: INodeNo,
        name: Name,
        reply: ReplyEmpty,
    ) {
        self.serve(s, move |fs| async move {
            let r = fs.client.rmdir(parent.0, &name).await;
            fs.dir_changed(parent.0, None);
            Fs::empty(reply, r);
        });
    }

    pub(crate) fn symlink(
        self: &Arc<Self>,
        s: Settled,
        req: &Request,
        parent: INodeNo,
        name: Name,
        target: Vec<u8>,
        reply: ReplyEntry,
    ) {
        let client = self.caller(req);
        self.adding(parent, &name);
        self.serve(s, move |fs| async move {
            let r = client.symlink(parent.0, &name, &target).await;
            fs.dir_changed(parent.0, None);
            fs.entry(reply, r, None);
        });
    }

    pub(crate) fn rename(
        self: &Arc<Self>,
        s: Settled,
        (parent, name): (INodeNo, Name),
        (newparent, newname): (INodeNo, Name),
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return reply.error(Errno::EINVAL); // not supported (docs/SEMANTICS.md)
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        self.adding(newparent, &newname);
        self.serve(s, move |fs| async move {
            let r = fs
                .client
                .rename(parent.0, &name, newparent.0, &newname, noreplace)
                .await;
            match &r {
                Ok(moved) => {
                    fs.dir_changed(parent.0, moved.dir.clone());
                }
                Err(_) => fs.dir_changed(parent.0, None),
            }
            if newparent != parent {
                fs.dir_changed(newparent.0, None);
            }
            Fs::empty(reply, r.map(drop));
        });
    }

    pub(crate) fn link(
        self: &Arc<Self>,
        s: Settled,
        ino: INodeNo,
        newparent: INodeNo,
        newname: Name,
        reply: ReplyEntry,
    ) {
        self.adding(newparent, &newname);
        self.serve(s, move |fs| async move {
            let r = fs.client.link(ino.0, newparent.0, &newname).await;
            fs.dir_changed(newparent.0, None);
            fs.entry(reply, r, None);
        });
    }
}
