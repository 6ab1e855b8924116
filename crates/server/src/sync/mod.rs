//! Partition copies (a rebuild after a lost server, or a migration), both sides: the
//! receiver pulls a partition from its primary in rounds ([`receive`]), and the primary
//! answers each pull with pages of a snapshot or of the changes since the previous round's
//! snapshot ([`send`]). The last round runs with the partition fenced at the primary; the fence
//! is lifted by the table that settles the copy, or after [`FENCE_TIMEOUT`].

mod receive;
mod send;

pub use receive::run;
pub(crate) use send::pull;

use crate::node::Node;
use crate::store::{lock, Store};
use send::Session;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Mutex;
use std::time::Duration;
use tessera_placement::{Epoch, NodeId, PartitionId, PartitionTable};
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
    /// Partitions fenced for a copy's last round: the epoch they were fenced at, and when.
    fences: Mutex<HashMap<PartitionId, (Epoch, Instant)>>,
    /// Partitions being received now.
    pub syncing: AtomicU32,
    /// Bytes received by copies, ever.
    pub synced_bytes: AtomicU64,
}

impl Copies {
    /// A new table is installed: lifts the fences it settled, and forgets the copies this node
    /// (`me`) no longer sends.
    pub(crate) fn table_installed(&self, store: &Store, table: &PartitionTable, me: NodeId) {
        self.lift_fences(store, |p, at, _| table.changed(p) > at);
        lock(&self.sessions)
            .retain(|&(p, n), _| table.primary(p) == Some(me) && table.receives(n, p));
    }

    /// Lifts fences the table never settled (an abandoned copy). Returns whether any remain:
    /// while some do, the table is worth polling often.
    pub fn expire_fences(&self, store: &Store) -> bool {
        let now = Instant::now();
        self.lift_fences(store, |p, _, since| {
            let expired = now.duration_since(since) > FENCE_TIMEOUT;
            if expired {
                warn!(
                    partition = p,
                    "lifting a sync fence the table never settled"
                );
            }
            expired
        });
        !lock(&self.fences).is_empty()
    }

    fn lift_fences(&self, store: &Store, done: impl Fn(PartitionId, Epoch, Instant) -> bool) {
        lock(&self.fences).retain(|&p, &mut (at, since)| {
            if done(p, at, since) {
                let _ = store.fence(p, false);
                false
            } else {
                true
            }
        });
    }
}
