//! The epoch-versioned partition table.

use crate::{Epoch, NodeId, PartitionId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Why a table was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TableError {
    #[error("a partition table needs at least one partition")]
    Empty,
    #[error("partition {0} has no replica")]
    NoReplica(PartitionId),
    #[error("partition {0} lists node {1} twice")]
    DuplicateReplica(PartitionId, NodeId),
    #[error("partition {0} is being copied but has no complete replica to copy from")]
    NoSource(PartitionId),
    #[error("the next table has {got} partitions, the cluster has {want}")]
    WrongSize { want: usize, got: usize },
    #[error("partition {0} changed after the table's epoch")]
    ChangedLater(PartitionId),
}

/// Maps every partition to an ordered list of nodes holding a complete copy (primary first) and
/// the nodes receiving a copy (rebuild after a loss, or migration). The epoch grows by one at
/// every change, and each partition remembers the epoch its lists last changed at: a request
/// routed at epoch `e` is valid for partition `p` while `changed(p) <= e`, so a reconfiguration
/// fences only the partitions it touches.
///
/// A partition whose replica list is empty is lost (every copy was on nodes that died):
/// requests for it fail with EIO, never with silently missing data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Received")]
pub struct PartitionTable {
    epoch: Epoch,
    replicas: Vec<Vec<NodeId>>,
    incoming: Vec<Vec<NodeId>>,
    changed: Vec<Epoch>,
}

/// A table as it arrives from the network, checked before it is one: a decoded table holds
/// what [`PartitionTable::new`] and [`PartitionTable::next`] promise.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, Clone))]
struct Received {
    epoch: Epoch,
    replicas: Vec<Vec<NodeId>>,
    incoming: Vec<Vec<NodeId>>,
    changed: Vec<Epoch>,
}

impl TryFrom<Received> for PartitionTable {
    type Error = TableError;

    fn try_from(r: Received) -> Result<Self, TableError> {
        check(&r.replicas, &r.incoming)?;
        if r.changed.len() != r.replicas.len() {
            return Err(TableError::WrongSize {
                want: r.replicas.len(),
                got: r.changed.len(),
            });
        }
        if let Some(p) = r.changed.iter().position(|&c| c > r.epoch) {
            return Err(TableError::ChangedLater(p as PartitionId));
        }
        Ok(Self {
            epoch: r.epoch,
            replicas: r.replicas,
            incoming: r.incoming,
            changed: r.changed,
        })
    }
}

fn check(replicas: &[Vec<NodeId>], incoming: &[Vec<NodeId>]) -> Result<(), TableError> {
    if replicas.is_empty() {
        return Err(TableError::Empty);
    }
    if incoming.len() != replicas.len() {
        return Err(TableError::WrongSize {
            want: replicas.len(),
            got: incoming.len(),
        });
    }
    for (p, (list, inc)) in replicas.iter().zip(incoming).enumerate() {
        let p = p as PartitionId;
        if list.is_empty() && !inc.is_empty() {
            return Err(TableError::NoSource(p));
        }
        let mut seen = BTreeSet::new();
        for &n in list.iter().chain(inc) {
            if !seen.insert(n) {
                return Err(TableError::DuplicateReplica(p, n));
            }
        }
    }
    Ok(())
}

impl PartitionTable {
    /// A first table: every partition has at least one replica, no node twice, nothing moving.
    pub fn new(epoch: Epoch, replicas: Vec<Vec<NodeId>>) -> Result<Self, TableError> {
        if let Some(p) = replicas.iter().position(Vec::is_empty) {
            return Err(TableError::NoReplica(p as PartitionId));
        }
        let incoming = vec![Vec::new(); replicas.len()];
        check(&replicas, &incoming)?;
        Ok(Self {
            epoch,
            changed: vec![epoch; replicas.len()],
            replicas,
            incoming,
        })
    }

    /// The table one epoch later with these lists; partitions whose lists differ from this
    /// table's are stamped with the new epoch.
    pub fn next(
        &self,
        replicas: Vec<Vec<NodeId>>,
        incoming: Vec<Vec<NodeId>>,
    ) -> Result<Self, TableError> {
        if replicas.len() != self.replicas.len() {
            return Err(TableError::WrongSize {
                want: self.replicas.len(),
                got: replicas.len(),
            });
        }
        check(&replicas, &incoming)?;
        let epoch = self.epoch + 1;
        let changed = (0..replicas.len())
            .map(|p| {
                if replicas[p] == self.replicas[p] && incoming[p] == self.incoming[p] {
                    self.changed[p]
                } else {
                    epoch
                }
            })
            .collect();
        Ok(Self {
            epoch,
            replicas,
            incoming,
            changed,
        })
    }

    /// This table's lists at a later `epoch`, every partition stamped as changed then: tables
    /// this one does not know of may lie between the two (a restarted manager's), so a
    /// request routed with any of them must be refused as stale.
    #[must_use]
    pub fn renumbered(&self, epoch: Epoch) -> Self {
        let epoch = epoch.max(self.epoch);
        Self {
            epoch,
            replicas: self.replicas.clone(),
            incoming: self.incoming.clone(),
            changed: vec![epoch; self.replicas.len()],
        }
    }

    #[must_use]
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Number of partitions (P).
    #[must_use]
    pub fn partitions(&self) -> u32 {
        self.replicas.len() as u32
    }

    /// Complete copies of partition `p`, primary first; empty if the partition is lost.
    ///
    /// # Panics
    /// If `p` is out of range: partition ids come from hashing modulo [`Self::partitions`].
    #[must_use]
    pub fn replicas(&self, p: PartitionId) -> &[NodeId] {
        &self.replicas[p as usize]
    }

    /// Nodes receiving a copy of partition `p` (not yet readable there).
    ///
    /// # Panics
    /// If `p` is out of range.
    #[must_use]
    pub fn incoming(&self, p: PartitionId) -> &[NodeId] {
        &self.incoming[p as usize]
    }

    /// The epoch at which partition `p`'s lists last changed: requests routed before it are
    /// stale for `p`.
    ///
    /// # Panics
    /// If `p` is out of range.
    #[must_use]
    pub fn changed(&self, p: PartitionId) -> Epoch {
        self.changed[p as usize]
    }

    /// The primary of `p`, unless the partition is lost.
    #[must_use]
    pub fn primary(&self, p: PartitionId) -> Option<NodeId> {
        self.replicas
            .get(p as usize)
            .and_then(|l| l.first().copied())
    }

    /// All complete replica lists, indexed by partition.
    #[must_use]
    pub fn all(&self) -> &[Vec<NodeId>] {
        &self.replicas
    }

    /// All incoming lists, indexed by partition.
    #[must_use]
    pub fn all_incoming(&self) -> &[Vec<NodeId>] {
        &self.incoming
    }

    /// Does `node` hold a complete copy of partition `p`?
    #[must_use]
    pub fn holds(&self, node: NodeId, p: PartitionId) -> bool {
        self.replicas
            .get(p as usize)
            .is_some_and(|l| l.contains(&node))
    }

    /// Is `node` receiving a copy of partition `p`?
    #[must_use]
    pub fn receives(&self, node: NodeId, p: PartitionId) -> bool {
        self.incoming
            .get(p as usize)
            .is_some_and(|l| l.contains(&node))
    }

    /// The nodes that appear in the table (holding or receiving).
    #[must_use]
    pub fn nodes(&self) -> BTreeSet<NodeId> {
        self.replicas
            .iter()
            .chain(&self.incoming)
            .flatten()
            .copied()
            .collect()
    }

    /// How many complete partition copies each node holds.
    #[must_use]
    pub fn load(&self) -> BTreeMap<NodeId, usize> {
        let mut m = BTreeMap::new();
        for &n in self.replicas.iter().flatten() {
            *m.entry(n).or_insert(0) += 1;
        }
        m
    }

    /// Partitions with no copy left.
    pub fn lost(&self) -> impl Iterator<Item = PartitionId> + '_ {
        (0..self.partitions()).filter(|&p| self.replicas[p as usize].is_empty())
    }

    /// Partitions that are not lost but have fewer than `r` complete copies.
    pub fn degraded(&self, r: u8) -> impl Iterator<Item = PartitionId> + '_ {
        (0..self.partitions()).filter(move |&p| {
            let n = self.replicas[p as usize].len();
            n > 0 && n < usize::from(r)
        })
    }

    /// Number of partition copies being received.
    #[must_use]
    pub fn copies_incoming(&self) -> usize {
        self.incoming.iter().map(Vec::len).sum()
    }

    /// Number of partition copies placed on a node that did not hold them in `prev`: the data
    /// that a change from `prev` to `self` has to move.
    #[must_use]
    pub fn moves_from(&self, prev: &PartitionTable) -> usize {
        self.replicas
            .iter()
            .enumerate()
            .map(|(p, list)| {
                let old = prev.replicas.get(p).map(Vec::as_slice).unwrap_or(&[]);
                list.iter().filter(|n| !old.contains(n)).count()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What a decoded table must hold, said apart from the code that checks it.
    fn sound(r: &Received) -> bool {
        let p = r.replicas.len();
        p > 0
            && r.incoming.len() == p
            && r.changed.len() == p
            && r.changed.iter().all(|&c| c <= r.epoch)
            && r.replicas.iter().zip(&r.incoming).all(|(list, inc)| {
                let all: Vec<_> = list.iter().chain(inc).collect();
                let distinct: BTreeSet<_> = all.iter().collect();
                distinct.len() == all.len() && (inc.is_empty() || !list.is_empty())
            })
    }

    fn received() -> impl Strategy<Value = Received> {
        fn list() -> impl Strategy<Value = Vec<NodeId>> {
            prop::collection::vec(NodeId::MIN..5, 0..4)
        }
        (0usize..5, 0u64..6).prop_flat_map(move |(p, epoch)| {
            // Mostly of one length, now and then not.
            let len = move || prop_oneof![8 => Just(p), 1 => 0usize..6];
            (
                len().prop_flat_map(move |n| prop::collection::vec(list(), n)),
                len().prop_flat_map(move |n| prop::collection::vec(list(), n)),
                len().prop_flat_map(move |n| prop::collection::vec(0u64..7, n)),
            )
                .prop_map(move |(replicas, incoming, changed)| Received {
                    epoch,
                    replicas,
                    incoming,
                    changed,
                })
        })
    }

    proptest! {
        /// A table is decoded exactly when it holds what `new` and `next` promise: no node
        /// twice in a partition, nothing copied without a source, one list of each per
        /// partition, no change later than its epoch. (A partition with no replica decodes:
        /// it is lost.)
        #[test]
        fn a_table_decodes_exactly_when_it_is_sound(r in received()) {
            let want = sound(&r);
            let decoded = PartitionTable::try_from(r);
            prop_assert_eq!(decoded.is_ok(), want, "{:?}", decoded);
        }
    }

    #[test]
    fn validation() {
        assert_eq!(PartitionTable::new(1, vec![]), Err(TableError::Empty));
        assert_eq!(
            PartitionTable::new(1, vec![vec![1], vec![]]),
            Err(TableError::NoReplica(1))
        );
        assert_eq!(
            PartitionTable::new(1, vec![vec![1, 1]]),
            Err(TableError::DuplicateReplica(0, 1))
        );
        let t = PartitionTable::new(3, vec![vec![1, 2], vec![2, 3]]).unwrap();
        assert!(t.holds(3, 1) && !t.holds(3, 0) && !t.holds(1, 7));
        assert_eq!(t.load(), BTreeMap::from([(1, 1), (2, 2), (3, 1)]));
        let u = PartitionTable::new(4, vec![vec![1, 4], vec![2, 3]]).unwrap();
        assert_eq!(u.moves_from(&t), 1);
    }

    #[test]
    fn next_stamps_only_changed_partitions() {
        let t = PartitionTable::new(3, vec![vec![1, 2], vec![2, 3], vec![3, 1]]).unwrap();
        // Node 2 died: partition 0 and 1 lose it, partition 1 gets node 1 as an incoming copy.
        let u = t
            .next(
                vec![vec![1], vec![3], vec![3, 1]],
                vec![vec![], vec![1], vec![]],
            )
            .unwrap();
        assert_eq!(u.epoch(), 4);
        assert_eq!((u.changed(0), u.changed(1), u.changed(2)), (4, 4, 3));
        assert!(u.receives(1, 1) && !u.holds(1, 1));
        assert_eq!(u.primary(1), Some(3));
        assert_eq!(u.degraded(2).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(u.copies_incoming(), 1);
        // A lost partition, and the errors.
        let v = u
            .next(vec![vec![], vec![3], vec![3]], vec![vec![]; 3])
            .unwrap();
        assert_eq!(v.lost().collect::<Vec<_>>(), vec![0]);
        assert_eq!(v.primary(0), None);
        assert_eq!(
            u.next(
                vec![vec![], vec![3], vec![3]],
                vec![vec![1], vec![], vec![]]
            ),
            Err(TableError::NoSource(0))
        );
        assert_eq!(
            u.next(
                vec![vec![1], vec![3], vec![3]],
                vec![vec![1], vec![], vec![]]
            ),
            Err(TableError::DuplicateReplica(0, 1))
        );
        assert!(matches!(
            u.next(vec![vec![1]], vec![vec![]]),
            Err(TableError::WrongSize { .. })
        ));
    }
}
