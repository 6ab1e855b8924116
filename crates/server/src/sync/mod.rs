//! Partition copies (a rebuild after a lost server, or a migration), both sides: the
//! receiver pulls a partition from its primary in rounds ([`receive`]), and the primary
//! answers each pull with pages of a snapshot or of the changes since the previous round's
//! snapshot ([`send`]). The last round runs with the partition fenced at the primary; the fence
//! is lifted by the table that settles the copy, or after [`FENCE_TIMEOUT`].

mod receive;
mod send;

pub use receive::run;
pub(crate) use send::pull;

use crate::node::{stale, Node};
use crate::store::{lock, Store};
use send::Session;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Mutex;
use std::time::Duration;
use tessera_placement::{NodeId, PartitionId, PartitionTable};
use tessera_proto::ErrorCode;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::warn;

/// A fence that the table has not lifted by then is lifted anyway (the copy was abandoned).
pub const FENCE_TIMEOUT: Duration = Duration::from_secs(5);

/// What copying partitions needs of a server beyond the [`Node`].
pub trait Host: Node {
    fn copies(&self) -> &Copies;
    /// Woken whenever a new table is installed.
    fn installed(&self) -> &Notify;
    /// Held by a replicated change of partition `p` at its primary: a fence waits for it.
    fn meta_lock(&self, p: PartitionId) -> &tokio::sync::Mutex<()>;
}

/// A server's copies: those it sends (per receiver and partition) and the fences of their
/// last rounds, and counters of those it receives.
#[derive(Default)]
pub struct Copies {
    sessions: Mutex<HashMap<(PartitionId, NodeId), Session>>,
    /// Copies in their last round, by partition and receiver, and when their fence began: a
    /// partition stays fenced while any of its copies is, so that no write is acknowledged
    /// without a copy that the manager is about to promote.
    fences: Mutex<HashMap<(PartitionId, NodeId), Instant>>,
    /// Partitions being received now.
    pub syncing: AtomicU32,
    /// Bytes received by copies, ever.
    pub synced_bytes: AtomicU64,
}

impl Copies {
    /// A new table is installed: lifts the fences of the copies it settled (promoted, or no
    /// longer wanted from this node), and forgets the copies this node (`me`) no longer sends.
    /// Another copy of the same partition settling leaves a fence in place.
    pub(crate) fn table_installed(&self, store: &Store, table: &PartitionTable, me: NodeId) {
        let sends = |p, n| table.primary(p) == Some(me) && table.receives(n, p);
        self.lift_fences(store, |p, n, _| !sends(p, n));
        lock(&self.sessions).retain(|&(p, n), _| sends(p, n));
    }

    /// Lifts fences the table never settled (an abandoned copy). Returns whether any remain:
    /// while some do, the table is worth polling often.
    pub fn expire_fences(&self, store: &Store) -> bool {
        let now = Instant::now();
        self.lift_fences(store, |p, n, since| {
            let expired = now.duration_since(since) > FENCE_TIMEOUT;
            if expired {
                warn!(
                    partition = p,
                    node = n,
                    "lifting a sync fence the table never settled"
                );
            }
            expired
        });
        !lock(&self.fences).is_empty()
    }

    /// Fences partition `p` for `node`'s last round, if this node (`h`) still sends it that
    /// copy. Checked under the fences' lock, so a table settling the copy cannot come between
    /// the check and the fence and leave the fence up.
    fn fence(&self, h: &impl Host, p: PartitionId, node: NodeId) -> Result<(), ErrorCode> {
        let mut fences = lock(&self.fences);
        let t = h
            .table()
            .ok_or_else(|| ErrorCode::NotReady("no partition table".into()))?;
        let table = &t.info.table;
        if table.primary(p) != Some(h.id()) || !table.receives(node, p) {
            return Err(stale(table.epoch()));
        }
        h.store().fence(p, true)?;
        fences.insert((p, node), Instant::now());
        Ok(())
    }

    /// Ends the fences `done` says are over; a partition opens once none of its fences remain.
    fn lift_fences(&self, store: &Store, done: impl Fn(PartitionId, NodeId, Instant) -> bool) {
        let mut fences = lock(&self.fences);
        let mut ended = Vec::new();
        fences.retain(|&(p, n), &mut since| {
            let over = done(p, n, since);
            if over {
                ended.push(p);
            }
            !over
        });
        for p in ended {
            if !fences.keys().any(|&(q, _)| q == p) {
                let _ = store.fence(p, false);
            }
        }
    }
}
