//! Capacity-proportional assignment of partitions to nodes (after Y0, as MemFS uses it).
//!
//! Every node gets a share of the `P * r` partition copies proportional to its capacity
//! (largest-remainder rounding, so equal nodes differ by at most one), capped at `P` because a
//! node holds at most one copy of a partition. Starting from a previous assignment, a node keeps
//! the copies it already has up to its new share, and only the surplus and the copies of departed
//! nodes move: adding one node to `N` equal nodes moves about `P/(N+1)` partitions.

use crate::NodeId;
use std::collections::{BTreeMap, BTreeSet};

/// A node and its capacity (bytes of memory it offers, or any consistent unit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeWeight {
    pub node: NodeId,
    pub capacity: u64,
    /// Failure domain (a rack, a switch, a host): copies of one partition go to distinct
    /// domains where the capacities allow it. `None`: a domain of its own.
    pub domain: Option<u32>,
}

/// Which domains hold copies in a replica list: a node without a domain is its own.
struct Domains(BTreeMap<NodeId, u32>);

impl Domains {
    fn new(nodes: &[NodeWeight]) -> Self {
        Self(
            nodes
                .iter()
                .filter_map(|n| Some((n.node, n.domain?)))
                .collect(),
        )
    }

    /// Would `n` share a failure domain with a copy in `list` (other than `except`)?
    fn clash(&self, list: &[NodeId], n: NodeId, except: Option<NodeId>) -> bool {
        let Some(d) = self.0.get(&n) else {
            return false;
        };
        list.iter()
            .any(|m| *m != n && Some(*m) != except && self.0.get(m) == Some(d))
    }
}

/// Why no assignment could be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AssignError {
    #[error("no nodes to assign partitions to")]
    NoNodes,
    #[error("replication {need} needs at least {need} nodes, the cluster has {have}")]
    TooFewNodes { need: usize, have: usize },
    #[error("node {0} offers zero capacity")]
    ZeroCapacity(NodeId),
    #[error("node {0} is listed twice")]
    DuplicateNode(NodeId),
    #[error("replication must be at least 1")]
    NoReplication,
    #[error("a cluster needs at least one partition")]
    NoPartitions,
}

/// Splits `slots` among `nodes` in proportion to capacity, no node above `cap`. Returns one share
/// per node, in the order given; shares sum to `min(slots, cap * nodes)`.
#[must_use]
pub fn capacity_shares(nodes: &[NodeWeight], slots: u64, cap: u64) -> Vec<u64> {
    let mut share = vec![0u64; nodes.len()];
    let mut open: Vec<usize> = (0..nodes.len()).collect();
    let mut left = slots.min(cap.saturating_mul(nodes.len() as u64));
    // Water-filling: fix nodes whose proportional share exceeds the cap, then split the rest.
    loop {
        let total: u128 = open.iter().map(|&i| u128::from(nodes[i].capacity)).sum();
        if open.is_empty() || total == 0 {
            return share;
        }
        let over: Vec<usize> = open
            .iter()
            .copied()
            .filter(|&i| u128::from(left) * u128::from(nodes[i].capacity) / total > u128::from(cap))
            .collect();
        if over.is_empty() {
            let mut rems = Vec::with_capacity(open.len());
            let mut given = 0u64;
            for &i in &open {
                let exact = u128::from(left) * u128::from(nodes[i].capacity);
                share[i] = (exact / total) as u64;
                given += share[i];
                rems.push((exact % total, i));
            }
            // Largest remainders first; ties go to the lower node id so the result is stable.
            rems.sort_by(|a, b| b.0.cmp(&a.0).then(nodes[a.1].node.cmp(&nodes[b.1].node)));
            for &(_, i) in rems.iter().take((left - given) as usize) {
                share[i] += 1;
            }
            return share;
        }
        for &i in &over {
            share[i] = cap;
            left -= cap;
        }
        open.retain(|i| !over.contains(i));
    }
}

/// Assigns `partitions` partitions with `replication` copies each to `nodes`, moving as little
/// as possible from `prev` (the previous replica lists, if any). Deterministic in its inputs.
pub fn assign(
    prev: Option<&[Vec<NodeId>]>,
    nodes: &[NodeWeight],
    partitions: u32,
    replication: u8,
) -> Result<Vec<Vec<NodeId>>, AssignError> {
    let r = usize::from(replication);
    if partitions == 0 {
        return Err(AssignError::NoPartitions);
    }
    if r == 0 {
        return Err(AssignError::NoReplication);
    }
    if nodes.is_empty() {
        return Err(AssignError::NoNodes);
    }
    if nodes.len() < r {
        return Err(AssignError::TooFewNodes {
            need: r,
            have: nodes.len(),
        });
    }
    let mut seen = BTreeSet::new();
    for n in nodes {
        if n.capacity == 0 {
            return Err(AssignError::ZeroCapacity(n.node));
        }
        if !seen.insert(n.node) {
            return Err(AssignError::DuplicateNode(n.node));
        }
    }

    let p = partitions as usize;
    let shares = capacity_shares(nodes, (p * r) as u64, p as u64);
    let target: BTreeMap<NodeId, i64> = nodes
        .iter()
        .zip(&shares)
        .map(|(n, &s)| (n.node, s as i64))
        .collect();
    let mut count: BTreeMap<NodeId, i64> = target.keys().map(|&n| (n, 0)).collect();

    let domains = Domains::new(nodes);
    // Keep what each surviving node already holds, up to its share.
    let mut out: Vec<Vec<NodeId>> = vec![Vec::with_capacity(r); p];
    // In r rounds, the k-th keeping at most k copies of each partition: the copies that must go
    // are then spread over many partitions (each one slot a new node can fill) instead of
    // emptying the last partitions in order.
    for k in 1..=r {
        let Some(prev) = prev else { break };
        for (list, old) in out.iter_mut().zip(prev) {
            for &n in old {
                if list.len() >= k {
                    break;
                }
                if list.contains(&n) || domains.clash(list, n, None) {
                    continue;
                }
                if let (Some(&t), Some(c)) = (target.get(&n), count.get_mut(&n)) {
                    if *c < t {
                        *c += 1;
                        list.push(n);
                    }
                }
            }
        }
    }

    // Fill the gaps from the nodes furthest below their share. Ties are broken by a hash of
    // (partition, node), not by node id, so a node's mirrors spread over all the others
    // (declustering): a lost node is rebuilt from many peers, and balance needs few extra moves.
    for (i, list) in out.iter_mut().enumerate() {
        while list.len() < r {
            // A node in a new failure domain if any is left, else any node not in the list.
            let best = |spread: bool| {
                count
                    .iter()
                    .filter(|(n, _)| {
                        !(list.contains(n) || (spread && domains.clash(list, **n, None)))
                    })
                    .max_by(|a, b| {
                        (target[a.0] - a.1)
                            .cmp(&(target[b.0] - b.1))
                            .then(tie(i, *a.0).cmp(&tie(i, *b.0)))
                    })
                    .map(|(&n, _)| n)
            };
            let pick = best(true)
                .or_else(|| best(false))
                .expect("at least r nodes, so a node not yet in this list exists");
            *count.get_mut(&pick).expect("picked from count") += 1;
            list.push(pick);
        }
    }

    // Keeping copies in partition order can leave a node above its share in partitions where a
    // node below its share has no copy (with r >= 2, a new node can take only one copy of each
    // partition): hand such copies over. Each hand-over is a move the shares require anyway.
    // Copies just placed are handed over first: moving a kept copy instead costs one more move.
    for kept_too in [false, true] {
        for (i, list) in out.iter_mut().enumerate() {
            hand_over(
                list,
                prev.map(|pr| pr[i].as_slice()),
                kept_too,
                &target,
                &mut count,
                &domains,
            );
        }
    }
    // A failure domain may still hold more copies than its nodes' shares add up to, every
    // partition of its over-full node already having a copy in the domain short of copies: a
    // copy of another node of the full domain crosses over, and that node then takes one of
    // the over-full node's copies (a hand-over within the domain).
    let excess = |count: &BTreeMap<NodeId, i64>| -> i64 {
        count.iter().map(|(n, c)| (c - target[n]).max(0)).sum()
    };
    let mut left = excess(&count);
    while left > 0 && cross_domain(&mut out, &target, &mut count, &domains) {
        for list in &mut out {
            hand_over(list, None, true, &target, &mut count, &domains);
        }
        let now = excess(&count);
        if now >= left {
            break;
        }
        left = now;
    }
    Ok(out)
}

/// Moves one copy from a domain holding a node above its target to a node below its target
/// in another domain, in a partition with no copy in that domain. False if there is none.
fn cross_domain(
    out: &mut [Vec<NodeId>],
    target: &BTreeMap<NodeId, i64>,
    count: &mut BTreeMap<NodeId, i64>,
    domains: &Domains,
) -> bool {
    let over = |n: &NodeId| count[n] > target[n];
    let full: BTreeSet<u32> = count
        .keys()
        .filter(|n| over(n))
        .filter_map(|n| domains.0.get(n).copied())
        .collect();
    let under: Vec<NodeId> = count
        .keys()
        .copied()
        .filter(|n| count[n] < target[n] && domains.0.get(n).is_none_or(|d| !full.contains(d)))
        .collect();
    for u in under {
        for list in out.iter_mut() {
            if list.contains(&u) || domains.clash(list, u, None) {
                continue;
            }
            let from = list
                .iter()
                .position(|m| domains.0.get(m).is_some_and(|d| full.contains(d)));
            if let Some(slot) = from {
                *count.get_mut(&list[slot]).expect("a listed node") -= 1;
                *count.get_mut(&u).expect("a counted node") += 1;
                list[slot] = u;
                return true;
            }
        }
    }
    false
}

fn tie(partition: usize, node: NodeId) -> u64 {
    let mut key = [0u8; 12];
    key[..8].copy_from_slice(&(partition as u64).to_le_bytes());
    key[8..].copy_from_slice(&node.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&key)
}

/// Replaces copies of `list` held by nodes above their target with nodes below it that hold
/// no copy of this partition (only copies new since `kept` unless `kept_too`).
fn hand_over(
    list: &mut [NodeId],
    kept: Option<&[NodeId]>,
    kept_too: bool,
    target: &BTreeMap<NodeId, i64>,
    count: &mut BTreeMap<NodeId, i64>,
    domains: &Domains,
) {
    {
        for slot in 0..list.len() {
            let n = list[slot];
            if count[&n] <= target[&n] || (!kept_too && kept.is_some_and(|k| k.contains(&n))) {
                continue;
            }
            let under = count
                .iter()
                // Never into a domain the partition already has (unless `n` clashed already).
                .filter(|(u, c)| {
                    **c < target[*u]
                        && !list.contains(u)
                        && (domains.clash(list, n, None) || !domains.clash(list, **u, Some(n)))
                })
                .max_by(|a, b| {
                    (target[a.0] - a.1)
                        .cmp(&(target[b.0] - b.1))
                        .then(b.0.cmp(a.0))
                })
                .map(|(&u, _)| u);
            if let Some(u) = under {
                *count.get_mut(&n).expect("a listed node") -= 1;
                *count.get_mut(&u).expect("picked from count") += 1;
                list[slot] = u;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PartitionTable;
    use proptest::prelude::*;

    fn equal(n: u32) -> Vec<NodeWeight> {
        (1..=n)
            .map(|node| NodeWeight {
                node,
                capacity: 4 << 30,
                domain: None,
            })
            .collect()
    }

    fn spread(a: &[Vec<NodeId>]) -> (usize, usize) {
        let t = PartitionTable::new(0, a.to_vec()).unwrap();
        let load = t.load();
        (*load.values().min().unwrap(), *load.values().max().unwrap())
    }

    #[test]
    fn errors() {
        assert_eq!(assign(None, &[], 8, 1), Err(AssignError::NoNodes));
        assert_eq!(
            assign(None, &equal(1), 8, 2),
            Err(AssignError::TooFewNodes { need: 2, have: 1 })
        );
        assert_eq!(
            assign(None, &equal(2), 0, 1),
            Err(AssignError::NoPartitions)
        );
        assert_eq!(
            assign(None, &equal(2), 8, 0),
            Err(AssignError::NoReplication)
        );
        let zero = [NodeWeight {
            node: 1,
            capacity: 0,
            domain: None,
        }];
        assert_eq!(assign(None, &zero, 8, 1), Err(AssignError::ZeroCapacity(1)));
        let dup = [
            NodeWeight {
                node: 1,
                capacity: 1,
                domain: None,
            },
            NodeWeight {
                node: 1,
                capacity: 1,
                domain: None,
            },
        ];
        assert_eq!(assign(None, &dup, 8, 1), Err(AssignError::DuplicateNode(1)));
    }

    /// Found by `copies_spread_over_failure_domains`: after a join, one domain held more
    /// copies than its nodes' shares, and every partition of its over-full node already had a
    /// copy in the domain short of copies (min 3, max 6 before `cross_domain`).
    #[test]
    fn a_domain_over_its_share_gives_copies_to_another() {
        let (d, p, r) = (4, 25, 3);
        let nodes = |n: u32| {
            (1..=n)
                .map(|node| NodeWeight {
                    node,
                    capacity: 1 << 30,
                    domain: Some(node % d),
                })
                .collect::<Vec<_>>()
        };
        let before = assign(None, &nodes(12), p, r).unwrap();
        let after = assign(Some(&before), &nodes(16), p, r).unwrap();
        for list in &after {
            let ds: BTreeSet<_> = list.iter().map(|n| n % d).collect();
            assert_eq!(ds.len(), list.len(), "{list:?}");
        }
        let (min, max) = spread(&after);
        assert!(max - min <= 2, "min {min} max {max}");
    }

    #[test]
    fn shares_respect_cap() {
        let nodes = [
            NodeWeight {
                node: 1,
                capacity: 100,
                domain: None,
            },
            NodeWeight {
                node: 2,
                capacity: 1,
                domain: None,
            },
            NodeWeight {
                node: 3,
                capacity: 1,
                domain: None,
            },
        ];
        // r = 2 over 10 partitions: the big node is capped at 10, the rest split evenly.
        assert_eq!(capacity_shares(&nodes, 20, 10), vec![10, 5, 5]);
    }

    proptest! {
        #[test]
        fn equal_nodes_balance_within_one(n in 1u32..40, p in 1u32..2048) {
            let a = assign(None, &equal(n), p, 1).unwrap();
            let (min, max) = spread(&a);
            prop_assert!(max - min <= 1, "min {} max {}", min, max);
            prop_assert!(a.iter().all(|l| l.len() == 1));
        }

        #[test]
        fn deterministic(n in 1u32..20, p in 1u32..1024, r in 1u8..=3) {
            prop_assume!(n as usize >= r as usize);
            prop_assert_eq!(assign(None, &equal(n), p, r), assign(None, &equal(n), p, r));
        }

        #[test]
        fn heterogeneous_shares_are_proportional(caps in prop::collection::vec(1u64..64, 1..12), p in 64u32..2048) {
            let nodes: Vec<_> = caps.iter().enumerate()
                .map(|(i, &c)| NodeWeight { node: i as u32 + 1, capacity: c << 30, domain: None }).collect();
            let a = assign(None, &nodes, p, 1).unwrap();
            let load = PartitionTable::new(0, a).unwrap().load();
            let total: u64 = caps.iter().sum();
            for (i, &c) in caps.iter().enumerate() {
                let exact = f64::from(p) * c as f64 / total as f64;
                let got = *load.get(&(i as u32 + 1)).unwrap_or(&0) as f64;
                prop_assert!((got - exact).abs() < 1.0, "node {} got {} want {}", i + 1, got, exact);
            }
        }

        #[test]
        fn adding_a_node_moves_about_p_over_n_plus_1(n in 1u32..32, p in 32u32..4096) {
            let before = assign(None, &equal(n), p, 1).unwrap();
            let after = assign(Some(&before), &equal(n + 1), p, 1).unwrap();
            let moved = PartitionTable::new(1, after.clone()).unwrap()
                .moves_from(&PartitionTable::new(0, before).unwrap());
            let bound = (p as usize).div_ceil(n as usize + 1);
            prop_assert!(moved <= bound, "moved {} bound {}", moved, bound);
            let (min, max) = spread(&after);
            prop_assert!(max - min <= 1);
        }

        #[test]
        fn removing_a_node_moves_only_its_partitions(n in 2u32..32, p in 32u32..4096, gone in 1u32..32) {
            prop_assume!(gone <= n);
            let before = assign(None, &equal(n), p, 1).unwrap();
            let rest: Vec<_> = equal(n).into_iter().filter(|w| w.node != gone).collect();
            let after = assign(Some(&before), &rest, p, 1).unwrap();
            let old = PartitionTable::new(0, before).unwrap();
            let moved = PartitionTable::new(1, after).unwrap().moves_from(&old);
            prop_assert_eq!(moved, old.load()[&gone]);
        }

        #[test]
        fn adding_nodes_with_mirrors_stays_balanced(n in 2u32..12, p in 16u32..1024, r in 2u8..=3, add in 1u32..4) {
            prop_assume!(n as usize >= r as usize);
            let before = assign(None, &equal(n), p, r).unwrap();
            let after = assign(Some(&before), &equal(n + add), p, r).unwrap();
            prop_assert!(PartitionTable::new(0, after.clone()).is_ok(), "distinct replicas");
            let (min, max) = spread(&after);
            prop_assert!(max - min <= 2, "min {} max {}", min, max);
        }

        #[test]
        fn copies_spread_over_failure_domains(d in 2u32..5, per in 1u32..4, p in 16u32..512, r in 1u8..=3, add in 0u32..2) {
            // d domains of `per` equal nodes each (node k in domain k % d), then a join.
            prop_assume!(d as usize >= r as usize);
            let nodes = |n: u32| (1..=n).map(|node| NodeWeight { node, capacity: 1 << 30, domain: Some(node % d) }).collect::<Vec<_>>();
            let before = assign(None, &nodes(d * per), p, r).unwrap();
            let after = assign(Some(&before), &nodes(d * (per + add)), p, r).unwrap();
            for list in before.iter().chain(&after) {
                let ds: std::collections::BTreeSet<_> = list.iter().map(|n| n % d).collect();
                prop_assert_eq!(ds.len(), list.len(), "{:?}", list);
            }
            let (min, max) = spread(&after);
            prop_assert!(max - min <= 2, "min {} max {}", min, max);
        }

        #[test]
        fn replicas_are_distinct_and_balanced(n in 3u32..24, p in 16u32..2048, r in 1u8..=3) {
            let a = assign(None, &equal(n), p, r).unwrap();
            prop_assert!(PartitionTable::new(0, a.clone()).is_ok(), "distinct replicas");
            prop_assert!(a.iter().all(|l| l.len() == r as usize));
            let (min, max) = spread(&a);
            prop_assert!(max - min <= 2, "min {} max {}", min, max);
        }
    }
}
