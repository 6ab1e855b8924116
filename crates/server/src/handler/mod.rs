//! Turns requests into store operations, after checking the table epoch and that this node
//! holds the partition the key hashes to.
//!
//! Replication: data writes reach every replica from the client. Metadata changes go to the
//! partition's primary, which forwards them to the other replicas, waits for them, and only
//! then applies the change itself, one change per partition at a time: every replica applies
//! the same changes in the same order, and a conditional change (exclusive create, remove if
//! empty) decides the same way everywhere. A copy being built (rebuild, migration) is filled by
//! [`crate::sync`] pulling snapshots and deltas from the primary ([`Op::SyncPull`], answered
//! there by `sync` too).

mod apply;
mod leases;

use crate::leases::Leases;
use crate::node::{err, now, ok, stale, Answer, Installed, Node};
use crate::peers::{Net, Peers};
use crate::purge;
use crate::rename_lock::RenameLock;
use crate::store::{lock, Store};
use crate::sync::{self, Copies};
use crate::valid;
use crate::watch::{self, Watches};
use bytes::Bytes;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;
use tessera_placement::{Epoch, Ino, NodeId, PartitionId};
use tessera_proto::{
    BufferPool, ClusterConfig, Conn, ErrorCode, Handler, NodeStats, Notice, Op, Reply, Request,
    Response, TableInfo, Watcher, RECALL_PATIENCE, RENAME_LEASE,
};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How long a primary keeps trying to reach a mirror before failing a change (the manager
/// declares a dead server within a few seconds, which ends the wait sooner).
const FORWARD_PATIENCE: Duration = Duration::from_secs(30);

pub struct NodeHandler {
    node: NodeId,
    config: ClusterConfig,
    pub store: Store,
    /// The table and the partitions this node holds in it.
    table: RwLock<Option<Arc<Installed>>>,
    /// Wakes the heartbeat task to fetch the table now.
    refresh: Notify,
    /// Wakes the sync task, and changes waiting on a mirror, when a new table is installed.
    installed: Notify,
    load: AtomicU32,
    peers: Peers,
    /// One replicated metadata change (or fencing) per partition at a time, at the primary.
    meta_locks: Vec<tokio::sync::Mutex<()>>,
    /// Callback promises made to subscribed connections, per partition.
    watches: Watches,
    /// Woken when a holder gives a directory's completeness back (`Op::Relinquish`).
    relinquished: Notify,
    /// Held by directory renames across parents, at the primary of the root's partition.
    rename_lock: Arc<RenameLock>,
    /// Deleted files whose stripes are still to be dropped ([`crate::purge`]).
    purge: purge::Queue,
    /// Partition copies sent and received ([`crate::sync`]).
    pub(crate) copies: Copies,
    /// Fault injection: every stripe request waits this long first (a slow node).
    fault_delay: Duration,
    /// Clients' leases on the open handles of the partitions held here.
    leases: Mutex<Leases>,
    /// Per partition, since when this node is its primary (or since it started): a holder's
    /// lease counts from then at the earliest.
    primary_since: Mutex<Vec<Instant>>,
}

/// How often a change waiting for a recalled promise looks whether its holders are gone.
const RECALL_POLL: Duration = Duration::from_millis(50);

/// Metadata operations that change state: these are replicated through the primary.
fn is_meta_change(op: &Op) -> bool {
    matches!(
        op,
        Op::InodeCreate { .. }
            | Op::InodeSetAttr { .. }
            | Op::InodeExtend { .. }
            | Op::InodeReserve { .. }
            | Op::InodeRetract { .. }
            | Op::InodeLink { .. }
            | Op::InodeOpen { .. }
            | Op::InodeClose { .. }
            | Op::InodeRevoke { .. }
            | Op::InodeReclaim { .. }
            | Op::DirInsert { .. }
            | Op::DirRemove { .. }
            | Op::DirUnlink { .. }
            | Op::DirRename { .. }
            | Op::DirDestroy { .. }
            | Op::DirCreate { .. }
    )
}

impl NodeHandler {
    #[must_use]
    pub fn new(
        node: NodeId,
        config: ClusterConfig,
        capacity: u64,
        pool: Arc<BufferPool>,
        net: Arc<dyn Net>,
    ) -> Self {
        Self {
            node,
            config,
            store: Store::new(config.partitions, config.stripe_size, capacity, pool),
            table: RwLock::new(None),
            refresh: Notify::new(),
            installed: Notify::new(),
            load: AtomicU32::new(0),
            peers: Peers::new(net),
            meta_locks: (0..config.partitions)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            watches: Watches::new(config.partitions, watch::MAX_PROMISES),
            relinquished: Notify::new(),
            rename_lock: Arc::default(),
            purge: purge::Queue::default(),
            copies: Copies::default(),
            fault_delay: Duration::ZERO,
            leases: Mutex::new(Leases::new(config.open_lease())),
            primary_since: Mutex::new(vec![Instant::now(); config.partitions as usize]),
        }
    }

    /// Makes every stripe request wait `delay` first: a slow or overloaded node, for tests and
    /// benchmarks of replica choice.
    #[must_use]
    pub fn with_fault_delay(mut self, delay: Duration) -> Self {
        self.fault_delay = delay;
        self
    }

    /// Installs a table (ignoring one older than ours, and refusing one that does not fit the
    /// cluster: `TableInfo::check`): abandons the promises of partitions this node is no
    /// longer primary of, forgets partitions it no longer holds or receives, and lifts fences
    /// the table settled.
    pub fn install(&self, info: TableInfo) {
        if let Err(e) = info.check(self.config.partitions) {
            warn!(
                epoch = info.table.epoch(),
                "refusing a partition table: {e}"
            );
            return;
        }
        let old = {
            let mut t = self.table.write().unwrap_or_else(PoisonError::into_inner);
            if t.as_ref()
                .is_some_and(|cur| cur.info.table.epoch() >= info.table.epoch())
            {
                return;
            }
            let table = &info.table;
            let me = self.node;
            let held = (0..table.partitions())
                .filter(|&p| table.holds(me, p))
                .collect();
            let node_changed = (0..table.partitions())
                .filter(|&p| table.holds(me, p) || table.receives(me, p))
                .map(|p| table.changed(p))
                .max()
                .unwrap_or(0);
            info!(epoch = table.epoch(), "installed partition table");
            t.replace(Arc::new(Installed {
                info,
                held,
                node_changed,
            }))
        };
        let Some(new) = self.table() else { return };
        let table = &new.info.table;
        {
            let at = Instant::now();
            let mut since = lock(&self.primary_since);
            for (p, since) in (0..table.partitions()).zip(since.iter_mut()) {
                let me = Some(self.node);
                if table.primary(p) == me
                    && old.as_ref().is_none_or(|o| o.info.table.primary(p) != me)
                {
                    *since = at;
                }
            }
        }
        if let Some(old) = old {
            for p in 0..table.partitions() {
                let was_primary = old.info.table.primary(p) == Some(self.node);
                if was_primary && table.primary(p) != Some(self.node) {
                    if let Some(mut locked) = self.watches.lock(p) {
                        locked.abandon();
                    }
                }
                let had =
                    old.info.table.holds(self.node, p) || old.info.table.receives(self.node, p);
                if had && !table.holds(self.node, p) && !table.receives(self.node, p) {
                    debug!(
                        partition = p,
                        "dropping a partition copy no longer wanted here"
                    );
                    let _ = self.store.clear(p);
                }
            }
        }
        self.copies.table_installed(&self.store, table, self.node);
        self.purge.table_changed();
        self.installed.notify_waiters();
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
            syncing: self.copies.syncing.load(Ordering::Relaxed),
            synced_bytes: self.copies.synced_bytes.load(Ordering::Relaxed),
            epoch: self.epoch().unwrap_or(0),
            pooled: (self.store.pool().idle() * self.store.pool().buf_size()) as u64,
        }
    }

    /// The partition an operation's key hashes to; `None` for node-wide operations.
    fn partition(&self, op: &Op) -> Option<PartitionId> {
        op.partition(self.config.partitions)
    }

    /// Is a request routed at `epoch` for `part` (or node-wide) still valid here?
    fn check(
        &self,
        t: &Installed,
        epoch: Epoch,
        part: Option<PartitionId>,
    ) -> Result<(), ErrorCode> {
        let table = &t.info.table;
        let current = table.epoch();
        if epoch > current {
            self.want_refresh();
            return Err(stale(current));
        }
        match part {
            Some(p) if p >= table.partitions() => {
                Err(ErrorCode::Invalid(format!("no partition {p}")))
            }
            Some(p) if !table.holds(self.node, p) || epoch < table.changed(p) => {
                Err(stale(current))
            }
            None if epoch < t.node_changed => Err(stale(current)),
            _ => Ok(()),
        }
    }

    fn serve(
        self: &Arc<Self>,
        from: Option<&Watcher>,
        epoch: Epoch,
        op: Op,
        payload: Bytes,
    ) -> Reply {
        let Some(t) = self.table() else {
            self.want_refresh();
            return now(err(ErrorCode::NotReady(
                "this server has no partition table yet".into(),
            )));
        };
        let part = self.partition(&op);
        if let Op::SyncPull {
            partition,
            node,
            round,
            from,
            fence,
        } = op
        {
            return sync::pull(self, &t, epoch, partition, node, round, from, fence);
        }
        // Renewed whatever the epoch: a client behind the table is still alive.
        if let Op::LeaseRenew { holder } = op {
            return now(self.renew(&t, epoch, holder));
        }
        if let Err(e) = self.check(&t, epoch, part) {
            return now(err(e));
        }
        let p = part.unwrap_or(0);
        // Refused before anything waits on it or is forwarded; mirrors check again.
        if let Err(e) = valid::check(&op, p, self.config.partitions) {
            return now(err(e));
        }
        if let Op::Relinquish { dir } = op {
            if let (Some(w), Some(mut locked)) = (from, self.watches.lock(p)) {
                locked.relinquish(dir, w);
            }
            self.relinquished.notify_waiters();
            return now(ok());
        }
        if let Op::RenameLock { holder } | Op::RenameUnlock { holder } = op {
            return self.rename_lock(&t, p, &op, holder);
        }
        let recalled = match (watch::recalls(&op), self.watches.lock(p)) {
            (Some(dir), Some(mut locked)) => Some((dir, locked.recall(dir, from))),
            _ => None,
        };
        if let Some((dir, holders)) = recalled.filter(|(_, h)| !h.is_empty()) {
            let (h, from) = (self.clone(), from.cloned());
            return Reply::Detached(Box::pin(async move {
                h.await_relinquish(p, dir, &holders).await;
                match h.serve(from.as_ref(), epoch, op, payload) {
                    Reply::Now(resp, payload) => (resp, payload),
                    Reply::Later(answer) | Reply::Detached(answer) => answer.await,
                }
            }));
        }
        if is_meta_change(&op) && t.info.table.replicas(p).len() > 1 {
            if t.info.table.primary(p) != Some(self.node) {
                return now(err(stale(t.info.table.epoch())));
            }
            let (h, from) = (self.clone(), from.cloned());
            return Reply::Detached(Box::pin(async move {
                h.replicate(from.as_ref(), epoch, p, op).await
            }));
        }
        if !self.fault_delay.is_zero()
            && matches!(
                op,
                Op::ReadStripe { .. } | Op::WriteStripe { .. } | Op::WriteScatter { .. }
            )
        {
            let h = self.clone();
            return Reply::Later(Box::pin(async move {
                tokio::time::sleep(h.fault_delay).await;
                // Checked again: a table installed meanwhile may have promoted a copy and
                // lifted the fence that kept this write off the partition.
                let Some(t) = h.table() else {
                    return err(ErrorCode::NotReady("no partition table".into()));
                };
                if let Err(e) = h.check(&t, epoch, part) {
                    return err(e);
                }
                h.apply(&t.held, p, op, payload)
            }));
        }
        now(self.apply_promised(from, &t.held, p, op, payload))
    }

    /// Takes or gives back the rename lock, which only the primary of the root's partition
    /// keeps. A wait that outlasts a lease answers `NotReady`, and the client asks again.
    fn rename_lock(&self, t: &Installed, p: PartitionId, op: &Op, holder: u64) -> Reply {
        if t.info.table.primary(p) != Some(self.node) {
            return now(err(stale(t.info.table.epoch())));
        }
        let lock = Arc::clone(&self.rename_lock);
        match op {
            Op::RenameUnlock { .. } => {
                lock.release(holder);
                now(ok())
            }
            _ if lock.take_now(holder) => now(ok()),
            _ => Reply::Detached(Box::pin(async move {
                if lock.take(holder, RENAME_LEASE + RECALL_POLL).await {
                    ok()
                } else {
                    err(ErrorCode::NotReady("the rename lock is busy".into()))
                }
            })),
        }
    }

    /// Waits until the `holders` of `dir`'s completeness gave it back or are gone, at most
    /// `RECALL_PATIENCE`; past that, takes it from them (a holder that does not answer is
    /// hung or cut off, and its late creates there may then find their names taken).
    async fn await_relinquish(&self, p: PartitionId, dir: Ino, holders: &[Watcher]) {
        let deadline = Instant::now() + RECALL_PATIENCE;
        loop {
            let given_back = self.relinquished.notified();
            tokio::pin!(given_back);
            given_back.as_mut().enable();
            let waiting = {
                let Some(mut locked) = self.watches.lock(p) else {
                    return;
                };
                let held = locked.still_held(dir, holders);
                if held && Instant::now() >= deadline {
                    warn!(
                        dir,
                        "a directory's completeness was not given back in time: taken"
                    );
                    for w in holders {
                        locked.relinquish(dir, w);
                    }
                    return;
                }
                held
            };
            if !waiting {
                return;
            }
            // Also wakes now and then: a holder's connection may end without a word.
            let _ = tokio::time::timeout(RECALL_POLL, given_back).await;
        }
    }

    /// A metadata change at the primary: the mirrors first, then here.
    async fn replicate(
        self: Arc<Self>,
        from: Option<&Watcher>,
        epoch: Epoch,
        p: PartitionId,
        op: Op,
    ) -> Answer {
        let _one_at_a_time = self.meta_locks[p as usize].lock().await;
        if self.store.is_fenced(p) {
            return err(ErrorCode::NotReady(format!(
                "partition {p} is finishing a copy to another server"
            )));
        }
        let Some(t) = self.table() else {
            return err(ErrorCode::NotReady("no partition table".into()));
        };
        if t.info.table.primary(p) != Some(self.node) {
            return err(stale(t.info.table.epoch()));
        }
        let mirrors: Vec<NodeId> = t.info.table.replicas(p)[1..].to_vec();
        let sent =
            futures::future::join_all(mirrors.iter().map(|&m| self.forward(m, epoch, p, &op)))
                .await;
        if let Some(e) = sent.into_iter().find_map(Result::err) {
            return err(e);
        }
        let held = self.table().map(|t| t.held.clone()).unwrap_or_default();
        self.apply_promised(from, &held, p, op, Bytes::new())
    }

    /// [`Self::apply`] at the primary, breaking the callback promises a change makes untrue and
    /// making those an answer to `from` (if it subscribed) implies (`watch.rs`). Mirrors
    /// make no promises: clients ask primaries.
    fn apply_promised(
        &self,
        from: Option<&Watcher>,
        held: &[PartitionId],
        p: PartitionId,
        op: Op,
        payload: Bytes,
    ) -> Answer {
        let change = is_meta_change(&op);
        let read = matches!(
            op,
            Op::InodeGet { .. } | Op::DirLookup { .. } | Op::DirList { .. }
        );
        let locked = if change || (read && from.is_some()) {
            self.watches.lock(p)
        } else {
            None
        };
        let Some(mut locked) = locked else {
            return self.apply(held, p, op, payload);
        };
        let asked = op.clone();
        let answer = self.apply(held, p, op, payload);
        if change {
            let origin_too = watch::origin_told(&asked);
            locked.r#break(from, origin_too, watch::broken(&asked, &answer.0));
        }
        if let Some(w) = from {
            // A table installed since the request was checked abandoned this partition's
            // promises (`install`): one made now would be kept by nobody.
            let me = Some(self.node);
            if self.table().is_some_and(|t| t.info.table.primary(p) == me) {
                locked.promise(w, watch::promised(&asked, &answer.0));
            } else {
                w.notify(Notice::Reset);
            }
        }
        answer
    }

    /// Delivers a change to mirror `m`. Done when the mirror answered (applied, or refused the
    /// same way this node will), or when the table no longer lists it as a replica (it died).
    async fn forward(
        &self,
        m: NodeId,
        epoch: Epoch,
        p: PartitionId,
        op: &Op,
    ) -> Result<(), ErrorCode> {
        let req = Request::Replica {
            epoch,
            op: op.clone(),
        };
        let deadline = Instant::now() + FORWARD_PATIENCE;
        loop {
            let t = self
                .table()
                .ok_or_else(|| ErrorCode::NotReady("no partition table".into()))?;
            let table = &t.info.table;
            if !table.replicas(p).contains(&m) {
                return Ok(());
            }
            if table.primary(p) != Some(self.node) {
                return Err(stale(table.epoch()));
            }
            let answer = {
                // A hung mirror never answers: a table that drops it ends the wait.
                let call = self.peers.call(&t.info, m, &req);
                tokio::pin!(call);
                loop {
                    let installed = self.installed.notified();
                    tokio::pin!(installed);
                    installed.as_mut().enable();
                    if !self
                        .table()
                        .is_some_and(|t| t.info.table.replicas(p).contains(&m))
                    {
                        return Ok(());
                    }
                    tokio::select! {
                        biased;
                        answer = &mut call => break answer,
                        () = installed => {}
                    }
                }
            };
            match answer {
                Ok((Response::Error(ErrorCode::StaleEpoch { current }), _))
                    if current > table.epoch() =>
                {
                    self.want_refresh();
                }
                Ok((Response::Error(ErrorCode::StaleEpoch { .. } | ErrorCode::NotReady(_)), _)) => {
                }
                Ok(_) => return Ok(()),
                Err(e) => {
                    debug!(
                        mirror = m,
                        partition = p,
                        "forward failed, waiting for the table: {e}"
                    );
                    self.want_refresh();
                }
            }
            if Instant::now() > deadline {
                return Err(ErrorCode::Internal(format!(
                    "mirror node {m} of partition {p} did not take a change for {FORWARD_PATIENCE:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A change forwarded by the primary of its partition.
    fn serve_replica(&self, epoch: Epoch, op: Op) -> Answer {
        let Some(t) = self.table() else {
            self.want_refresh();
            return err(ErrorCode::NotReady("no partition table yet".into()));
        };
        let table = &t.info.table;
        if epoch > table.epoch() {
            self.want_refresh();
            return err(stale(table.epoch()));
        }
        let Some(p) = self.partition(&op).filter(|&p| p < table.partitions()) else {
            return err(ErrorCode::Invalid("not a partition change".into()));
        };
        // Taken only as a mirror: a node that became primary must not apply a stale
        // primary's changes behind its own.
        if !is_meta_change(&op) || !table.holds(self.node, p) || table.primary(p) == Some(self.node)
        {
            return err(stale(table.epoch()));
        }
        if let Err(e) = valid::check(&op, p, self.config.partitions) {
            return err(e);
        }
        self.apply(&t.held, p, op, Bytes::new())
    }
}

impl Node for NodeHandler {
    fn id(&self) -> NodeId {
        self.node
    }

    fn table(&self) -> Option<Arc<Installed>> {
        self.table
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn store(&self) -> &Store {
        &self.store
    }

    fn peers(&self) -> &Peers {
        &self.peers
    }

    fn want_refresh(&self) {
        self.refresh.notify_one();
    }
}

impl purge::Host for NodeHandler {
    fn queue(&self) -> &purge::Queue {
        &self.purge
    }
}

impl sync::Host for NodeHandler {
    fn copies(&self) -> &Copies {
        &self.copies
    }

    fn installed(&self) -> &Notify {
        &self.installed
    }

    fn meta_lock(&self, p: PartitionId) -> &tokio::sync::Mutex<()> {
        &self.meta_locks[p as usize]
    }
}

/// The RPC face of a node: requests come in through here.
pub struct Service(pub Arc<NodeHandler>);

impl Handler for Service {
    fn handle(&self, conn: &Conn, req: Request, payload: Bytes) -> Reply {
        let h = &self.0;
        match req {
            Request::Op { epoch, op } => {
                h.load.fetch_add(1, Ordering::Relaxed);
                let reply = h.serve(conn.watcher(), epoch, op, payload);
                h.load.fetch_sub(1, Ordering::Relaxed);
                reply
            }
            Request::Replica { epoch, op } => now(h.serve_replica(epoch, op)),
            // Clients go on with the servers' table while the manager is away.
            Request::GetTable => now(match h.table() {
                Some(t) => (Response::Table(t.info.clone()), Bytes::new()),
                None => err(ErrorCode::NotReady("this server has no table yet".into())),
            }),
            _ => now(err(ErrorCode::Invalid(
                "a storage server only serves file operations".into(),
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_placement::{assign, stripe_partition, NodeWeight, PartitionTable};
    use tessera_proto::NodeAddr;

    const P: u32 = 16;

    /// The answer of a request served at once.
    fn answer(r: Reply) -> Response {
        match r {
            Reply::Now(resp, _) => resp,
            Reply::Later(_) | Reply::Detached(_) => panic!("expected an answer at once"),
        }
    }

    fn handler(node: NodeId) -> (Service, TableInfo) {
        let config = ClusterConfig::new(P, 1 << 20, 1);
        let nodes = [
            NodeWeight {
                node: 1,
                capacity: 1,
                domain: None,
            },
            NodeWeight {
                node: 2,
                capacity: 1,
                domain: None,
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
            Service(Arc::new(NodeHandler::new(
                node,
                config,
                1 << 30,
                Arc::new(BufferPool::new(1 << 20, 4)),
                Arc::new(tessera_proto::Conns::new(Arc::new(
                    tessera_proto::RpcConfig::new(
                        tessera_proto::Secret::new("s"),
                        Arc::new(BufferPool::new(1 << 20, 4)),
                    ),
                ))),
            ))),
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
            answer(h.handle(&Conn::default(), write(1, 0, 3), data.clone())),
            Response::Error(ErrorCode::NotReady(_))
        ));
        h.0.install(info.clone());
        // Find one stripe this node holds and one it does not.
        let mine = (0..)
            .find(|&s| info.table.holds(1, stripe_partition(1, s, P)))
            .unwrap();
        let theirs = (0..)
            .find(|&s| !info.table.holds(1, stripe_partition(1, s, P)))
            .unwrap();
        assert_eq!(
            answer(h.handle(&Conn::default(), write(1, mine, 3), data.clone())),
            Response::Ok
        );
        assert_eq!(
            answer(h.handle(&Conn::default(), write(1, theirs, 3), data.clone())),
            Response::Error(ErrorCode::StaleEpoch { current: 3 })
        );
        assert_eq!(
            answer(h.handle(&Conn::default(), write(1, mine, 2), data.clone())),
            Response::Error(ErrorCode::StaleEpoch { current: 3 })
        );
        assert_eq!(
            answer(h.handle(&Conn::default(), write(1, mine, 4), data)),
            Response::Error(ErrorCode::StaleEpoch { current: 3 })
        );
        // An older table never replaces a newer one.
        let mut old = info;
        old.table = PartitionTable::new(2, old.table.all().to_vec()).unwrap();
        h.0.install(old);
        assert_eq!(h.0.epoch(), Some(3));
        match answer(h.handle(&Conn::default(), Request::GetTable, Bytes::new())) {
            Response::Table(t) => assert_eq!(t.table.epoch(), 3),
            other => panic!("a server hands out its table: {other:?}"),
        }
        let stats = answer(h.handle(
            &Conn::default(),
            Request::Op {
                epoch: 3,
                op: Op::NodeStats,
            },
            Bytes::new(),
        ));
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

    /// Two copies of one partition fence it for their last rounds: the promotion of one leaves
    /// the partition fenced until the other is settled too, so no write is acknowledged without
    /// a copy the manager is about to promote.
    #[tokio::test]
    async fn a_partition_stays_fenced_until_each_of_its_copies_is_settled() {
        let (h, mut info) = handler(1);
        info.nodes.push(NodeAddr {
            id: 3,
            addr: "127.0.0.4:1".parse().unwrap(),
        });
        let p = (0..P).find(|&p| info.table.primary(p) == Some(1)).unwrap();
        let step = |info: &TableInfo, replicas: &[NodeId], incoming: &[NodeId]| {
            let (mut r, mut i) = (
                info.table.all().to_vec(),
                info.table.all_incoming().to_vec(),
            );
            r[p as usize] = replicas.to_vec();
            i[p as usize] = incoming.to_vec();
            let mut next = info.clone();
            next.table = info.table.next(r, i).unwrap();
            next
        };
        let both = step(&info, &[1], &[2, 3]);
        h.0.install(both.clone());
        let epoch = both.table.epoch();
        for node in [2, 3] {
            for (round, fence) in [(0, false), (1, true)] {
                let pull = Request::Op {
                    epoch,
                    op: Op::SyncPull {
                        partition: p,
                        node,
                        round,
                        from: 0,
                        fence,
                    },
                };
                let resp = match h.handle(&Conn::default(), pull, Bytes::new()) {
                    Reply::Now(resp, _) => resp,
                    Reply::Later(a) | Reply::Detached(a) => a.await.0,
                };
                assert!(matches!(resp, Response::SyncPage { .. }), "{resp:?}");
            }
        }
        let first = step(&both, &[1, 2], &[3]);
        h.0.install(first.clone());
        assert!(h.0.store.is_fenced(p), "node 3's last round is not settled");
        h.0.install(step(&first, &[1, 2, 3], &[]));
        assert!(!h.0.store.is_fenced(p));
    }

    /// A table of another partition count, or naming a node without an address, is refused.
    #[test]
    fn a_table_that_does_not_fit_the_cluster_is_not_installed() {
        let (h, info) = handler(1);
        let mut unfit = info.clone();
        unfit.table = PartitionTable::new(3, vec![vec![1]; P as usize + 1]).unwrap();
        unfit.config.partitions = P + 1;
        h.0.install(unfit);
        let mut unknown = info.clone();
        unknown.table = PartitionTable::new(3, vec![vec![1, 3]; P as usize]).unwrap();
        h.0.install(unknown);
        assert_eq!(h.0.epoch(), None);
        h.0.install(info);
        assert_eq!(h.0.epoch(), Some(3));
    }
}
