//! An operation applied to the node's store, once its epoch and ownership were checked and
//! (for a metadata change) its mirrors were sent it: the store call each `Op` is, and the
//! answer it makes.

use super::NodeHandler;
use crate::node::{err, ok, Answer};
use crate::store::{lock, Links};
use bytes::Bytes;
use tessera_placement::{Ino, PartitionId};
use tessera_proto::{ErrorCode, Op, Response};

impl NodeHandler {
    pub(super) fn apply(
        &self,
        held: &[PartitionId],
        p: PartitionId,
        op: Op,
        payload: Bytes,
    ) -> Answer {
        let s = &self.store;
        // A deleted file's stripes are dropped in the background by every copy of its inode's
        // partition: the drop outlives the server that answered.
        let links = |ino: Ino, (nlink, deleted): Links| {
            if deleted {
                self.purge.push(ino);
            }
            nlink
        };
        let result: Result<Answer, ErrorCode> = match op {
            Op::WriteStripe {
                file,
                stripe,
                offset,
            } => s.write(p, file, stripe, offset, payload).map(|()| ok()),
            Op::WriteScatter {
                file,
                stripe,
                pieces,
            } => s
                .write_scatter(p, file, stripe, &pieces, payload)
                .map(|()| ok()),
            Op::ReadStripe {
                file,
                stripe,
                offset,
                len,
            } => s
                .read(p, file, stripe, offset, len)
                .map(|b| (Response::Ok, b)),
            Op::TruncateStripes { file, size } => s.truncate(held, file, size).map(|()| ok()),
            Op::DropFiles { files } => s.drop_files(held, &files).map(|()| ok()),
            Op::InodeCreate { inode } => s.inode_create(p, inode).map(|()| ok()),
            Op::InodeGet { ino } => s.inode_get(p, ino).map(inode),
            Op::InodeSetAttr { ino, attr } => s.inode_setattr(p, ino, &attr).map(inode),
            Op::InodeExtend { ino, size, mtime } => s.inode_extend(p, ino, size, mtime).map(inode),
            Op::InodeReserve { ino, len, mtime } => s.inode_reserve(p, ino, len, mtime).map(inode),
            Op::InodeRetract { ino, from, to } => s.inode_retract(p, ino, from, to).map(inode),
            Op::InodeLink { ino, delta, ctime } => s
                .inode_link(p, ino, delta, ctime)
                .map(|l| answer_links(links(ino, l))),
            Op::InodeOpen { ino, holder } => {
                self.renewed(holder);
                s.inode_open(p, ino, holder).map(inode)
            }
            Op::InodeClose { ino, holder } => {
                self.renewed(holder);
                s.inode_close(p, ino, holder, false)
                    .map(|l| answer_links(links(ino, l)))
            }
            Op::InodeRevoke { ino, holder } => {
                lock(&self.leases).expire(holder);
                s.inode_close(p, ino, holder, true)
                    .map(|l| answer_links(links(ino, l)))
            }
            Op::LeaseRenew { .. } => Err(ErrorCode::Invalid(
                "a lease is renewed where it is asked for, not applied".into(),
            )),
            Op::InodeScan {
                partition,
                after,
                limit,
            } => s
                .inode_scan(partition, after, limit)
                .map(|(inodes, more)| (Response::Inodes { inodes, more }, Bytes::new())),
            Op::InodeReclaim { ino, change, ctime } => {
                s.inode_reclaim(p, ino, change, ctime).map(|l| {
                    let reclaimed = l.map(|l| links(ino, l)).is_some();
                    (Response::Reclaimed(reclaimed), Bytes::new())
                })
            }
            Op::DirInsert {
                dir,
                name,
                entry,
                replace,
                mtime,
            } => s
                .dir_insert(p, dir, name, entry, replace, mtime)
                .map(|r| (Response::Replaced(r), Bytes::new())),
            Op::DirRemove {
                dir,
                name,
                expect,
                want_dir,
                mtime,
            } => s
                .dir_remove(p, dir, name, expect, want_dir, mtime)
                .map(|e| (Response::Entry(e), Bytes::new())),
            Op::DirUnlink { dir, name, mtime } => {
                s.dir_unlink(p, dir, name, mtime).map(|(entry, l, dir)| {
                    let resp = Response::Unlinked {
                        entry,
                        nlink: l.map(|l| links(entry.ino, l)),
                        dir,
                    };
                    (resp, Bytes::new())
                })
            }
            Op::DirLookup { dir, name } => s
                .dir_lookup(p, dir, &name)
                .map(|(entry, inode)| (Response::Found { entry, inode }, Bytes::new())),
            Op::DirList { dir, after, limit } => s
                .dir_list(p, dir, after, limit)
                .map(|(entries, more)| (Response::Entries { entries, more }, Bytes::new())),
            Op::DirRename {
                dir,
                from,
                to,
                replace,
                replace_dir,
                mtime,
            } => s
                .dir_rename(p, dir, from, to, replace, replace_dir, mtime)
                .map(|r| {
                    let resp = Response::Renamed {
                        moved: r.moved,
                        ctime_set: r.ctime_set,
                        replaced: r.replaced,
                        nlink: r.replaced.zip(r.links).map(|(e, l)| links(e.ino, l)),
                        dir: r.dir,
                    };
                    (resp, Bytes::new())
                }),
            Op::DirDestroy { dir } => s.dir_destroy(p, dir).map(|()| ok()),
            Op::DirCreate {
                dir,
                name,
                inode: file,
                mtime,
                holder,
            } => {
                if file.open_count > 0 {
                    self.renewed(holder);
                }
                s.dir_create(p, dir, name, file.created_by(holder), mtime)
                    .map(inode)
            }
            Op::NodeStats => Ok((Response::Stats(self.stats()), Bytes::new())),
            Op::Relinquish { .. } => Err(ErrorCode::Invalid(
                "a relinquished promise is answered where it is held, not applied".into(),
            )),
            Op::SyncPull { .. } => Err(ErrorCode::Invalid("a sync pull is not applied".into())),
            Op::RenameLock { .. } | Op::RenameUnlock { .. } => Err(ErrorCode::Invalid(
                "the rename lock is kept where it is asked for, not applied".into(),
            )),
        };
        result.unwrap_or_else(err)
    }
}

fn inode(i: tessera_proto::Inode) -> Answer {
    (Response::Inode(i), Bytes::new())
}
fn answer_links(nlink: u32) -> Answer {
    (Response::Links { nlink }, Bytes::new())
}
