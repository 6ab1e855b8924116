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
}

/// Maps every partition to an ordered list of nodes (primary first). The epoch grows by one at
/// every change; clients and servers compare epochs to detect a stale routing decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionTable {
    epoch: Epoch,
    replicas: Vec<Vec<NodeId>>,
}

impl PartitionTable {
    /// Checks that every partition has at least one replica and no node twice.
    pub fn new(epoch: Epoch, replicas: Vec<Vec<NodeId>>) -> Result<Self, TableError> {
        if replicas.is_empty() {
            return Err(TableError::Empty);
        }
        for (p, list) in replicas.iter().enumerate() {
            let p = p as PartitionId;
            if list.is_empty() {
                return Err(TableError::NoReplica(p));
            }
            let mut seen = BTreeSet::new();
            for &n in list {
                if !seen.insert(n) {
                    return Err(TableError::DuplicateReplica(p, n));
                }
            }
        }
        Ok(Self { epoch, replicas })
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

    /// Replica list of partition `p`, primary first.
    ///
    /// # Panics
    /// If `p` is out of range: partition ids come from hashing modulo [`Self::partitions`].
    #[must_use]
    pub fn replicas(&self, p: PartitionId) -> &[NodeId] {
        &self.replicas[p as usize]
    }

    /// All replica lists, indexed by partition.
    #[must_use]
    pub fn all(&self) -> &[Vec<NodeId>] {
        &self.replicas
    }

    /// Does `node` hold a copy of partition `p`?
    #[must_use]
    pub fn holds(&self, node: NodeId, p: PartitionId) -> bool {
        self.replicas
            .get(p as usize)
            .is_some_and(|l| l.contains(&node))
    }

    /// The nodes that appear in the table.
    #[must_use]
    pub fn nodes(&self) -> BTreeSet<NodeId> {
        self.replicas.iter().flatten().copied().collect()
    }

    /// How many partition copies each node holds.
    #[must_use]
    pub fn load(&self) -> BTreeMap<NodeId, usize> {
        let mut m = BTreeMap::new();
        for &n in self.replicas.iter().flatten() {
            *m.entry(n).or_insert(0) += 1;
        }
        m
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
}
