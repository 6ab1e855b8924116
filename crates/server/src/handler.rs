//! Turns requests into store operations, after checking the table epoch and that this node
//! holds the partition the key hashes to.

use crate::store::Store;
use bytes::Bytes;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use tessera_placement::{meta_partition, stripe_partition, Epoch, NodeId, PartitionId};
use tessera_proto::{
    BufferPool, ClusterConfig, ErrorCode, Handler, NodeStats, Op, Request, Response, TableInfo,
};
use tokio::sync::Notify;

/// A partition table and the partitions this node holds in it (node-wide operations visit
/// only those).
struct Installed {
    info: TableInfo,
    held: Vec<PartitionId>,
}

pub struct NodeHandler {
    node: NodeId,
    config: ClusterConfig,
    store: Store,
    /// The table and the partitions this node holds in it.
    table: RwLock<Option<Arc<Installed>>>,
    /// Wakes the heartbeat task to fetch the table now.
    refresh: Notify,
    load: AtomicU32,
}

type Reply = (Response, Bytes);

fn err(e: ErrorCode) -> Reply {
    (Response::Error(e), Bytes::new())
}

impl NodeHandler {
    #[must_use]
    pub fn new(node: NodeId, config: ClusterConfig, capacity: u64, pool: Arc<BufferPool>) -> Self {
        Self {
            node,
            config,
            store: Store::new(config.partitions, config.stripe_size, capacity, pool),
            table: RwLock::new(None),
            refresh: Notify::new(),
            load: AtomicU32::new(0),
        }
    }

    #[must_use]
    pub fn node(&self) -> NodeId {
        self.node
    }

    fn table(&self) -> Option<Arc<Installed>> {
        self.table
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    #[must_use]
    pub fn epoch(&self) -> Option<Epoch> {
        self.table().map(|t| t.info.table.epoch())
    }

    /// Installs a table (ignoring one older than ours).
    pub fn install(&self, info: TableInfo) {
        let mut t = self.table.write().unwrap_or_else(PoisonError::into_inner);
        if t.as_ref()
            .is_none_or(|cur| cur.info.table.epoch() < info.table.epoch())
        {
            tracing::info!(epoch = info.table.epoch(), "installed partition table");
            let held = (0..info.table.partitions())
                .filter(|&p| info.table.holds(self.node, p))
                .collect();
            *t = Some(Arc::new(Installed { info, held }));
        }
    }

    pub async fn refresh_wanted(&self) {
        self.refresh.notified().await;
    }

    #[must_use]
    pub fn stats(&self) -> NodeStats {
        let c = &self.store.counters;
        NodeStats {
            capacity: self.store.capacity(),
            used: self.store.used(),
            stripes: self.store.stripe_count(),
            inodes: self.store.inode_count(),
            load: self.load.load(Ordering::Relaxed),
            reads: c.reads.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            meta_ops: c.meta_ops.load(Ordering::Relaxed),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
        }
    }

    /// The partition an operation's key hashes to; `None` for node-wide operations.
    fn partition(&self, op: &Op) -> Option<PartitionId> {
        let p = self.config.partitions;
        match op {
            Op::WriteStripe { file, stripe, .. } | Op::ReadStripe { file, stripe, .. } => {
                Some(stripe_partition(*file, *stripe, p))
            }
            Op::InodeCreate { inode } => Some(meta_partition(inode.ino, p)),
            Op::InodeGet { ino }
            | Op::InodeSetAttr { ino, .. }
            | Op::InodeExtend { ino, .. }
            | Op::InodeLink { ino, .. }
            | Op::InodeOpen { ino }
            | Op::InodeClose { ino } => Some(meta_partition(*ino, p)),
            Op::DirInsert { dir, .. }
            | Op::DirRemove { dir, .. }
            | Op::DirLookup { dir, .. }
            | Op::DirList { dir, .. }
            | Op::DirRename { dir, .. }
            | Op::DirDestroy { dir } => Some(meta_partition(*dir, p)),
            Op::TruncateStripes { .. } | Op::DropFile { .. } | Op::NodeStats => None,
        }
    }

    fn serve_op(&self, epoch: Epoch, op: Op, payload: Bytes) -> Reply {
        let Some(installed) = self.table() else {
            self.refresh.notify_one();
            return err(ErrorCode::NotReady(
                "this server has no partition table yet".into(),
            ));
        };
        let (table, held) = (&installed.info, &installed.held);
        let current = table.table.epoch();
        if epoch != current {
            if epoch > current {
                self.refresh.notify_one();
            }
            return err(ErrorCode::StaleEpoch { current });
        }
        let part = self.partition(&op);
        if let Some(p) = part {
            if !table.table.holds(self.node, p) {
                return err(ErrorCode::StaleEpoch { current });
            }
        }
        let p = part.unwrap_or(0);
        let held = || held.iter().copied();
        let s = &self.store;
        let result: Result<Reply, ErrorCode> = match op {
            Op::WriteStripe {
                file,
                stripe,
                offset,
            } => s
                .write(p, file, stripe, offset, payload)
                .map(|()| (Response::Ok, Bytes::new())),
            Op::ReadStripe {
                file,
                stripe,
                offset,
                len,
            } => s
                .read(p, file, stripe, offset, len)
                .map(|b| (Response::Ok, b)),
            Op::TruncateStripes { file, size } => s.truncate(held(), file, size).map(|()| ok()),
            Op::DropFile { file } => s.drop_file(held(), file).map(|()| ok()),
            Op::InodeCreate { inode } => s.inode_create(p, inode).map(|()| ok()),
            Op::InodeGet { ino } => s.inode_get(p, ino).map(inode),
            Op::InodeSetAttr { ino, attr } => s.inode_setattr(p, ino, &attr).map(inode),
            Op::InodeExtend { ino, size, mtime } => s.inode_extend(p, ino, size, mtime).map(inode),
            Op::InodeLink { ino, delta, ctime } => s.inode_link(p, ino, delta, ctime).map(links),
            Op::InodeOpen { ino } => s.inode_open(p, ino).map(inode),
            Op::InodeClose { ino } => s.inode_close(p, ino).map(links),
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
            Op::DirLookup { dir, name } => s
                .dir_lookup(p, dir, &name)
                .map(|e| (Response::Entry(e), Bytes::new())),
            Op::DirList { dir, after, limit } => s
                .dir_list(p, dir, after, limit)
                .map(|(entries, more)| (Response::Entries { entries, more }, Bytes::new())),
            Op::DirRename {
                dir,
                from,
                to,
                replace,
                mtime,
            } => s
                .dir_rename(p, dir, from, to, replace, mtime)
                .map(|r| (Response::Replaced(r), Bytes::new())),
            Op::DirDestroy { dir } => s.dir_destroy(p, dir).map(|()| ok()),
            Op::NodeStats => Ok((Response::Stats(self.stats()), Bytes::new())),
        };
        result.unwrap_or_else(err)
    }
}

fn ok() -> Reply {
    (Response::Ok, Bytes::new())
}
fn inode(i: tessera_proto::Inode) -> Reply {
    (Response::Inode(i), Bytes::new())
}
fn links((nlink, drop_data): (u32, bool)) -> Reply {
    (Response::Links { nlink, drop_data }, Bytes::new())
}

impl Handler for NodeHandler {
    fn handle(&self, req: Request, payload: Bytes) -> (Response, Bytes) {
        match req {
            Request::Op { epoch, op } => {
                self.load.fetch_add(1, Ordering::Relaxed);
                let reply = self.serve_op(epoch, op, payload);
                self.load.fetch_sub(1, Ordering::Relaxed);
                reply
            }
            _ => err(ErrorCode::Invalid(
                "a storage server only serves file operations".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_placement::{assign, NodeWeight, PartitionTable};
    use tessera_proto::NodeAddr;

    const P: u32 = 16;

    fn handler(node: NodeId) -> (NodeHandler, TableInfo) {
        let config = ClusterConfig {
            partitions: P,
            stripe_size: 1 << 20,
            replication: 1,
        };
        let nodes = [
            NodeWeight {
                node: 1,
                capacity: 1,
            },
            NodeWeight {
                node: 2,
                capacity: 1,
            },
        ];
        let table = PartitionTable::new(3, assign(None, &nodes, P, 1).unwrap()).unwrap();
        let addrs = vec![
            NodeAddr {
                id: 1,
                addr: "127.0.0.2:1".parse().unwrap(),
            },
            NodeAddr {
                id: 2,
                addr: "127.0.0.3:1".parse().unwrap(),
            },
        ];
        let info = TableInfo {
            config,
            table,
            nodes: addrs,
        };
        (
            NodeHandler::new(node, config, 1 << 30, Arc::new(BufferPool::new(1 << 20, 4))),
            info,
        )
    }

    fn write(file: u64, stripe: u64, epoch: Epoch) -> Request {
        Request::Op {
            epoch,
            op: Op::WriteStripe {
                file,
                stripe,
                offset: 0,
            },
        }
    }

    #[test]
    fn epochs_and_ownership_are_checked() {
        let (h, info) = handler(1);
        let data = Bytes::from_static(b"x");
        assert!(matches!(
            h.handle(write(1, 0, 3), data.clone()).0,
            Response::Error(ErrorCode::NotReady(_))
        ));
        h.install(info.clone());
        // Find one stripe this node holds and one it does not.
        let mine = (0..)
            .find(|&s| info.table.holds(1, stripe_partition(1, s, P)))
            .unwrap();
        let theirs = (0..)
            .find(|&s| !info.table.holds(1, stripe_partition(1, s, P)))
            .unwrap();
        assert_eq!(h.handle(write(1, mine, 3), data.clone()).0, Response::Ok);
        assert_eq!(
            h.handle(write(1, theirs, 3), data.clone()).0,
            Response::Error(ErrorCode::StaleEpoch { current: 3 })
        );
        assert_eq!(
            h.handle(write(1, mine, 2), data.clone()).0,
            Response::Error(ErrorCode::StaleEpoch { current: 3 })
        );
        assert_eq!(
            h.handle(write(1, mine, 4), data).0,
            Response::Error(ErrorCode::StaleEpoch { current: 3 })
        );
        // An older table never replaces a newer one.
        let mut old = info;
        old.table = PartitionTable::new(2, old.table.all().to_vec()).unwrap();
        h.install(old);
        assert_eq!(h.epoch(), Some(3));
        assert!(matches!(
            h.handle(Request::GetTable, Bytes::new()).0,
            Response::Error(ErrorCode::Invalid(_))
        ));
        let stats = h
            .handle(
                Request::Op {
                    epoch: 3,
                    op: Op::NodeStats,
                },
                Bytes::new(),
            )
            .0;
        assert!(
            matches!(
                stats,
                Response::Stats(NodeStats {
                    writes: 1,
                    bytes_written: 1,
                    ..
                })
            ),
            "{stats:?}"
        );
    }
}
