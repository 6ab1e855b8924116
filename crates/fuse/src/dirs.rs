//! Listings: opendir takes a snapshot of a directory's entries, readdir and readdirplus hand
//! it out, releasedir forgets it.

use crate::convert::{attr, file_type, ino_errno};
use crate::fs::{is_dot, Fs, Listing};
use crate::guard::Settled;
use crate::leases::Key;
use crate::trace::{ReplyDirectory, ReplyDirectoryPlus, ReplyOpen};
use fuser::{FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Instant;
use tessera_client::{Error, FileKind, Inode};

/// The most entries one readdirplus answer can carry: 1 MiB (the kernel's largest request)
/// of entries of at least 152 bytes.
const LISTED_MAX: usize = (1 << 20) / 152;

impl Fs {
    /// Always on the runtime (see the crate doc).
    pub(crate) fn opendir(self: &Arc<Self>, s: Settled, ino: INodeNo, reply: ReplyOpen) {
        self.spawn(s, move |fs| async move {
            let r = async {
                let dir = fs.client.getattr(ino.0).await?;
                let (since, changes) = (fs.since(), fs.dir_changes.load(Ordering::SeqCst));
                let file_changes = fs.file_changes.load(Ordering::SeqCst);
                let entries = fs.client.readdir_all(ino.0).await?;
                let mut list = Vec::with_capacity(entries.len() + 2);
                list.push((b".".to_vec(), dir.ino, FileType::Directory, None));
                list.push((b"..".to_vec(), dir.parent.max(1), FileType::Directory, None));
                list.extend(
                    entries
                        .into_iter()
                        .map(|(n, e, inode)| (n, e.ino, file_type(e.kind), inode)),
                );
                let list = Listing {
                    dir: ino.0,
                    entries: list,
                    at: Instant::now(),
                    since,
                    changes,
                    file_changes,
                };
                Ok::<_, Error>(list)
            }
            .await;
            match r {
                Ok(list) => {
                    let fh = fs.next_fh.fetch_add(1, Ordering::Relaxed);
                    fs.dirs
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(fh, Arc::new(list));
                    reply.opened(FileHandle(fh), FopenFlags::empty());
                }
                Err(e) => reply.error(ino_errno(&e)),
            }
        });
    }

    pub(crate) fn readdir(list: &Listing, offset: u64, mut reply: ReplyDirectory) {
        for (i, (name, ino, kind, _)) in list.entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    /// readdir with each entry's attributes (asked for when attributes are cached): `ls -l`
    /// and `find` then need no lookup per entry. Attributes that came with the listing
    /// (placed files) serve while they are as young as the kernel may keep them, or while the
    /// servers' promise on them holds (no notice, and no change made here, since the
    /// listing): a run of such entries is then answered leased (`Fs::reply_listed`). Others
    /// are fetched in parallel, a batch at a time (`Fs::reply_fetched`).
    ///
    /// None came with the listing once this mount published a size since it was asked for
    /// (`Fs::files_unchanged`): the kernel takes a readdirplus's attributes over the size its
    /// own writes gave a file if the request was made after those writes, as this one may
    /// have been (a file written and closed while `ls` ran).
    pub(crate) fn readdirplus(
        self: &Arc<Self>,
        s: Settled,
        list: Arc<Listing>,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        let start = (offset as usize).min(list.entries.len());
        self.spawn(s, move |fs| async move {
            let files = fs.files_unchanged(&list);
            let unchanged = files && list.changes == fs.dir_changes.load(Ordering::SeqCst);
            let listed = fs
                .policy
                .listed(unchanged, list.since, fs.since(), list.at.elapsed());
            let (leasable, fresh) = (listed.leasable, files && listed.fresh);
            if leasable && list.ready(start, fresh) {
                if let Some(reply) = fs.reply_listed(&list, start, reply) {
                    fs.reply_fetched(&list, start, false, false, reply).await;
                }
            } else {
                fs.reply_fetched(&list, start, fresh, leasable, reply).await;
            }
        });
    }

    pub(crate) fn releasedir(&self, fh: FileHandle) {
        self.dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&fh.0);
    }

    /// Attributes of a listing's entry `ino` that needs no request: `.` and `..` (the kernel
    /// takes none from them), or one that came with the listing.
    fn listed_attr(&self, ino: u64, listed: Option<&Inode>) -> FileAttr {
        match listed {
            Some(i) => attr(&self.local(i.clone())),
            None => attr(&Inode::new(ino, FileKind::Dir, 0o755, 0, 0, 1, Vec::new())),
        }
    }

    /// readdirplus from `start` over the entries whose attributes came with the listing, up to
    /// the first without: names and attributes leased if the promise holds. The reply back,
    /// unanswered, if this mount published a size while the attributes were taken.
    fn reply_listed(
        &self,
        list: &Listing,
        start: usize,
        mut reply: ReplyDirectoryPlus,
    ) -> Option<ReplyDirectoryPlus> {
        let run = &list.entries[start..];
        let run = &run[..(0..run.len())
            .find(|&k| !list.ready(start + k, true))
            .unwrap_or(run.len())
            .min(LISTED_MAX)];
        let keys = || {
            run.iter()
                .filter(|e| !is_dot(&e.0))
                .flat_map(|(name, ino, _, _)| [Key::Entry(list.dir, name.clone()), Key::Attr(*ino)])
                .collect()
        };
        let gate = self.grant(list.since, keys);
        let ttl = self.policy.ttl(gate.is_some());
        let attrs: Vec<FileAttr> = (run.iter())
            .map(|(_, ino, _, listed)| self.listed_attr(*ino, listed.as_ref()))
            .collect();
        // After the attributes: a flush seen in them (its unpublished size gone) is counted.
        if !self.files_unchanged(list) {
            return Some(reply);
        }
        for (k, ((name, ino, _, _), attr)) in run.iter().zip(&attrs).enumerate() {
            let (off, name) = ((start + k + 1) as u64, OsStr::from_bytes(name));
            if reply.add(INodeNo(*ino), off, name, ttl, attr, Generation(0)) {
                break;
            }
        }
        reply.ok();
        drop(gate);
        None
    }

    /// readdirplus from `start`, fetching the attributes that are not at hand in parallel, a
    /// batch at a time, until the kernel's buffer is full (or, `leasable`, until a run of
    /// entries `reply_listed` can answer).
    async fn reply_fetched(
        &self,
        list: &Listing,
        start: usize,
        fresh: bool,
        leasable: bool,
        mut reply: ReplyDirectoryPlus,
    ) {
        const BATCH: usize = 32;
        let entries = &list.entries;
        let ttl = self.policy.ttl(false);
        let (mut fresh, mut leasable) = (fresh, leasable);
        let mut next = start;
        while next < entries.len() {
            let batch = &entries[next..entries.len().min(next + BATCH)];
            let attrs = futures::future::join_all(batch.iter().enumerate().map(
                |(k, (_, ino, _, listed))| async move {
                    if list.ready(next + k, fresh) {
                        return Some(self.listed_attr(*ino, listed.as_ref()));
                    }
                    // An entry deleted since opendir is left out.
                    let i = self.client.getattr(*ino).await.ok()?;
                    Some(attr(&self.local(i)))
                },
            ))
            .await;
            if fresh && !self.files_unchanged(list) {
                // As in `reply_listed`: the batch again, every attribute asked for.
                (fresh, leasable) = (false, false);
                continue;
            }
            for (k, ((name, ino, _, _), attr)) in batch.iter().zip(attrs).enumerate() {
                let Some(attr) = attr else { continue };
                let (off, name) = ((next + k + 1) as u64, OsStr::from_bytes(name));
                if reply.add(INodeNo(*ino), off, name, ttl, &attr, Generation(0)) {
                    return reply.ok();
                }
            }
            next += batch.len();
            if leasable && list.ready(next, fresh) {
                break;
            }
        }
        reply.ok();
    }
}
