//! Reconfiguration as pure functions: from the current table and the live nodes, the next
//! replica and incoming lists.
//!
//! A copy only counts as complete once it has been synced, so a change never makes a node a
//! replica directly: a node that joins, or that takes over a lost copy, first appears in the
//! partition's incoming list, and [`complete`] promotes it when its sync is done. Copies the new
//! goal no longer wants stay replicas (clients keep writing to them) until every copy of the
//! whole reconfiguration is complete; then [`settle`] drops them all at once. So a target that
//! dies mid-migration loses nothing, even without mirrors: the old copies are still current.
//! Dead nodes vanish at once; a partition left with no complete copy is lost.

use crate::{assign, AssignError, NodeId, NodeWeight, PartitionId, PartitionTable};
use std::collections::BTreeSet;

/// Replica and incoming lists for the next table, and the goal they converge to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Where every partition's copies should end up (the capacity-proportional assignment).
    pub goal: Vec<Vec<NodeId>>,
    pub replicas: Vec<Vec<NodeId>>,
    pub incoming: Vec<Vec<NodeId>>,
}

/// Plans the next lists for `prev` when the live nodes are `alive` (a node missing from it is
/// dead). Nodes in `draining` keep serving what they hold but get nothing in the goal: their
/// copies move to the others, and once those are complete they hold nothing (scale-in). Moves
/// as few copies as the capacity-proportional assignment allows.
pub fn plan(
    prev: &PartitionTable,
    alive: &[NodeWeight],
    draining: &[NodeId],
    replication: u8,
) -> Result<Plan, AssignError> {
    let live: BTreeSet<NodeId> = alive.iter().map(|w| w.node).collect();
    let alive: Vec<NodeWeight> = alive
        .iter()
        .copied()
        .filter(|w| !draining.contains(&w.node))
        .collect();
    let alive = alive.as_slice();
    let keep =
        |l: &[NodeId]| -> Vec<NodeId> { l.iter().copied().filter(|n| live.contains(n)).collect() };
    let replicas: Vec<Vec<NodeId>> = prev.all().iter().map(|l| keep(l)).collect();
    let receiving: Vec<Vec<NodeId>> = prev.all_incoming().iter().map(|l| keep(l)).collect();
    // What each node holds or is getting: the assignment keeps as much of it as it can.
    let held: Vec<Vec<NodeId>> = replicas
        .iter()
        .zip(&receiving)
        .map(|(r, i)| r.iter().chain(i).copied().collect())
        .collect();
    let r = replication.min(u8::try_from(alive.len()).unwrap_or(u8::MAX));
    let goal = assign(Some(&held), alive, prev.partitions(), r.max(1))?;
    let mut incoming = Vec::with_capacity(goal.len());
    let mut out = Vec::with_capacity(goal.len());
    for (p, rep) in replicas.into_iter().enumerate() {
        if rep.is_empty() {
            // Lost: no complete copy to sync from.
            out.push(rep);
            incoming.push(Vec::new());
            continue;
        }
        let inc: Vec<NodeId> = goal[p]
            .iter()
            .copied()
            .filter(|n| !rep.contains(n))
            .collect();
        out.push(rep);
        incoming.push(inc);
    }
    settle(&goal, &mut out, &incoming);
    Ok(Plan {
        goal,
        replicas: out,
        incoming,
    })
}

/// Once no copy is incoming anywhere, drops the copies outside the goal (keeping the order, so
/// a primary stays unless it is the one dropped). Returns whether anything was dropped.
pub fn settle(
    goal: &[Vec<NodeId>],
    replicas: &mut [Vec<NodeId>],
    incoming: &[Vec<NodeId>],
) -> bool {
    if incoming.iter().any(|i| !i.is_empty()) {
        return false;
    }
    let mut dropped = false;
    for (rep, goal) in replicas.iter_mut().zip(goal) {
        if goal.iter().all(|n| rep.contains(n)) && rep.len() > goal.len() {
            rep.retain(|n| goal.contains(n));
            dropped = true;
        }
    }
    dropped
}

/// Why a finished sync could not be taken into the table.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompleteError {
    #[error("node {node} is not receiving partition {partition}")]
    NotIncoming {
        node: NodeId,
        partition: PartitionId,
    },
}

/// `node` finished receiving partition `p`: it becomes a complete replica (the copies it
/// replaces are dropped by [`settle`] when the whole reconfiguration is done). Returns the new
/// lists of `p`.
pub fn complete(
    table: &PartitionTable,
    p: PartitionId,
    node: NodeId,
) -> Result<(Vec<NodeId>, Vec<NodeId>), CompleteError> {
    if !table.receives(node, p) {
        return Err(CompleteError::NotIncoming { node, partition: p });
    }
    let mut replicas = table.replicas(p).to_vec();
    replicas.push(node);
    let incoming: Vec<NodeId> = table
        .incoming(p)
        .iter()
        .copied()
        .filter(|&n| n != node)
        .collect();
    Ok((replicas, incoming))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn equal(nodes: impl IntoIterator<Item = NodeId>) -> Vec<NodeWeight> {
        nodes
            .into_iter()
            .map(|node| NodeWeight {
                node,
                capacity: 1 << 30,
                domain: None,
            })
            .collect()
    }

    /// Applies a plan, then completes every incoming copy: the table a reconfiguration ends at.
    fn converge(prev: &PartitionTable, alive: &[NodeWeight], r: u8) -> PartitionTable {
        let plan = plan(prev, alive, &[], r).unwrap();
        let mut t = prev.next(plan.replicas, plan.incoming).unwrap();
        while let Some(p) = (0..t.partitions()).find(|&p| !t.incoming(p).is_empty()) {
            let node = t.incoming(p)[0];
            let (rep, inc) = complete(&t, p, node).unwrap();
            let mut all = t.all().to_vec();
            let mut all_inc = t.all_incoming().to_vec();
            all[p as usize] = rep;
            all_inc[p as usize] = inc;
            // Until the last copy is done, the copies being replaced stay replicas.
            let last = all_inc.iter().all(Vec::is_empty);
            let before = all.clone();
            let dropped = settle(&plan.goal, &mut all, &all_inc);
            assert!(last || (!dropped && all == before));
            t = t.next(all, all_inc).unwrap();
        }
        t
    }

    #[test]
    fn a_dead_node_is_replaced_from_the_survivors() {
        let t = PartitionTable::new(1, assign(None, &equal(1..=4), 64, 2).unwrap()).unwrap();
        let plan = plan(&t, &equal([1, 2, 4]), &[], 2).unwrap();
        for p in 0..64 {
            let (rep, inc) = (&plan.replicas[p], &plan.incoming[p]);
            assert!(!rep.contains(&3) && !inc.contains(&3));
            assert!(
                rep.len() + inc.len() >= 2,
                "partition {p}: {rep:?} + {inc:?}"
            );
            // Nothing becomes complete without a sync.
            assert!(rep.iter().all(|n| t.holds(*n, p as u32)));
        }
        // About the dead node's copies are rebuilt, not a reshuffle.
        let rebuilt: usize = plan.incoming.iter().map(Vec::len).sum();
        let lost = t.load()[&3];
        assert!(
            rebuilt >= lost && rebuilt <= lost + lost / 4,
            "{rebuilt} for {lost}"
        );
    }

    #[test]
    fn single_copies_on_a_dead_node_are_lost() {
        let t = PartitionTable::new(1, assign(None, &equal(1..=2), 16, 1).unwrap()).unwrap();
        let plan = plan(&t, &equal([1]), &[], 1).unwrap();
        let u = t.next(plan.replicas, plan.incoming).unwrap();
        let lost: Vec<_> = u.lost().collect();
        assert_eq!(lost.len(), t.load()[&2]);
        assert!(lost.iter().all(|&p| u.incoming(p).is_empty()));
    }

    #[test]
    fn completing_a_copy_that_is_not_incoming_is_refused() {
        let t = PartitionTable::new(1, vec![vec![1], vec![2]]).unwrap();
        assert_eq!(
            complete(&t, 0, 2),
            Err(CompleteError::NotIncoming {
                node: 2,
                partition: 0
            })
        );
    }

    #[test]
    fn a_draining_node_keeps_serving_until_its_copies_moved() {
        let t = PartitionTable::new(1, assign(None, &equal(1..=3), 32, 1).unwrap()).unwrap();
        let plan = plan(&t, &equal(1..=3), &[2], 1).unwrap();
        for p in 0..32u32 {
            // Node 2 stays a replica where it was one, with a copy incoming elsewhere.
            assert_eq!(plan.replicas[p as usize], t.replicas(p));
            assert!(!plan.goal[p as usize].contains(&2));
            assert_eq!(plan.incoming[p as usize].is_empty(), !t.holds(2, p));
        }
        // Once the copies are done node 2 holds nothing.
        let mut u = t.next(plan.replicas, plan.incoming).unwrap();
        while let Some(p) = (0..u.partitions()).find(|&p| !u.incoming(p).is_empty()) {
            let (rep, inc) = complete(&u, p, u.incoming(p)[0]).unwrap();
            let (mut all, mut all_inc) = (u.all().to_vec(), u.all_incoming().to_vec());
            all[p as usize] = rep;
            all_inc[p as usize] = inc;
            settle(&plan.goal, &mut all, &all_inc);
            u = u.next(all, all_inc).unwrap();
        }
        assert!(!u.nodes().contains(&2));
        assert!(u.all().iter().all(|l| l.len() == 1));
    }

    proptest! {
        #[test]
        fn joins_converge_to_the_goal_and_move_little(n in 1u32..10, p in 16u32..512, r in 1u8..=3, add in 1u32..4) {
            prop_assume!(n as usize >= r as usize);
            let t = PartitionTable::new(1, assign(None, &equal(1..=n), p, r).unwrap()).unwrap();
            let alive = equal(1..=n + add);
            let end = converge(&t, &alive, r);
            // Every partition back to r complete copies, balanced within two.
            prop_assert!(end.all().iter().all(|l| l.len() == r as usize));
            let load = end.load();
            let (min, max) = (load.values().min().unwrap(), load.values().max().unwrap());
            prop_assert!(max - min <= 2, "min {} max {}", min, max);
            // Only the new nodes' shares moved.
            // Within 15 % of the new nodes' shares (a hand-over between old nodes now and then).
            let ideal = (p as usize * r as usize * add as usize).div_ceil((n + add) as usize);
            let bound = ideal + ideal.div_ceil(7) + r as usize * add as usize;
            prop_assert!(end.moves_from(&t) <= bound, "moved {} bound {}", end.moves_from(&t), bound);
        }

        #[test]
        fn deaths_keep_data_while_a_copy_survives(n in 2u32..10, p in 16u32..512, r in 1u8..=3, dead in 1u32..10) {
            prop_assume!(n as usize >= r as usize && dead <= n);
            let t = PartitionTable::new(1, assign(None, &equal(1..=n), p, r).unwrap()).unwrap();
            let alive = equal((1..=n).filter(|&x| x != dead));
            let end = converge(&t, &alive, r);
            for q in 0..p {
                let survived = t.replicas(q).iter().any(|&x| x != dead);
                prop_assert_eq!(end.replicas(q).is_empty(), !survived);
                prop_assert!(!end.replicas(q).contains(&dead));
                if survived {
                    let want = usize::from(r).min(alive.len());
                    prop_assert_eq!(end.replicas(q).len(), want);
                }
            }
        }
    }
}
