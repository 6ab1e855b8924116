//! The elastic policy: when to add servers and which ones to remove, from the memory the
//! servers report (MemFS section II-B: scale out near full, scale in below a low mark, by a
//! step the user sets). Pure and deterministic: the caller passes the time and the loads, and
//! acts on the [`Decision`] (a provisioner adds nodes; removed nodes are drained first).
//!
//! Against flapping:
//! - scale-in happens only if the data left behind fits the remaining nodes below the middle
//!   of the two marks (`(low + high) / 2`), so a scale-in cannot cause the next scale-out;
//! - no decision while a reconfiguration is under way, and none for `cooldown` after the
//!   last decision or after the last reconfiguration was seen; the caller also holds it back
//!   until every server reported its use under the current table (`State::elastic`), so the
//!   copies a reconfiguration dropped are not counted.

use serde::Serialize;
use std::cmp::Reverse;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};
use tessera_placement::NodeId;

/// How many nodes one decision adds or removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Step {
    /// A fixed number of nodes.
    Nodes(u32),
    /// A percentage of the current (non-draining) nodes, at least one node.
    Percent(u32),
}

impl Step {
    /// Nodes this step means for a cluster of `current` nodes (at least 1).
    #[must_use]
    pub fn count(self, current: usize) -> usize {
        let n = match self {
            Step::Nodes(n) => n as usize,
            // Rounded down: a percentage is a rate, not a promise; small clusters move by one.
            Step::Percent(p) => current.saturating_mul(p as usize) / 100,
        };
        n.max(1)
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Nodes(n) => write!(f, "{n}"),
            Step::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl FromStr for Step {
    type Err = PolicyError;

    /// `2` (nodes) or `25%` (of the current nodes).
    fn from_str(s: &str) -> Result<Self, PolicyError> {
        let t = s.trim();
        let bad = |why: &str| PolicyError::Parse {
            what: "scaling step",
            text: s.to_string(),
            why: why.to_string(),
        };
        let step =
            if let Some(p) = t.strip_suffix('%') {
                Step::Percent(
                    p.trim()
                        .parse()
                        .map_err(|_| bad("expected a whole percentage such as 25%"))?,
                )
            } else {
                Step::Nodes(t.parse().map_err(|_| {
                    bad("expected a node count such as 2, or a percentage such as 25%")
                })?)
            };
        match step {
            Step::Nodes(0) | Step::Percent(0) => Err(PolicyError::ZeroStep),
            Step::Percent(p) if p > 100 => Err(bad("a percentage step is at most 100%")),
            s => Ok(s),
        }
    }
}

/// A memory mark: `90%` or `0.9`.
pub fn parse_mark(s: &str) -> Result<f64, PolicyError> {
    let t = s.trim();
    let bad = |why: &str| PolicyError::Parse {
        what: "memory mark",
        text: s.to_string(),
        why: why.to_string(),
    };
    let v = if let Some(p) = t.strip_suffix('%') {
        p.trim()
            .parse::<f64>()
            .map_err(|_| bad("expected a percentage such as 90%"))?
            / 100.0
    } else {
        let v: f64 = t
            .parse()
            .map_err(|_| bad("expected a percentage such as 90% or a fraction such as 0.9"))?;
        if v > 1.0 {
            // "90" is most likely meant as a percentage; say so rather than guess.
            return Err(bad("a fraction is at most 1: write 90% or 0.9"));
        }
        v
    };
    if !(v > 0.0 && v <= 1.0) {
        return Err(bad("must be above 0 and at most 100%"));
    }
    Ok(v)
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    #[error("bad {what} {text:?}: {why}")]
    Parse {
        what: &'static str,
        text: String,
        why: String,
    },
    #[error("the {which} memory mark {value} must be above 0 and at most 1 (100%)")]
    MarkRange { which: &'static str, value: f64 },
    #[error("the low memory mark ({low}) must be below the high mark ({high})")]
    MarksOrder { low: f64, high: f64 },
    #[error("the minimum node count {min} is above the maximum {max}")]
    Bounds { min: usize, max: usize },
    #[error("the maximum node count must be at least 1")]
    ZeroMax,
    #[error("the scaling step must be at least one node or 1%")]
    ZeroStep,
    #[error("a percentage scaling step is at most 100% (got {0}%)")]
    StepPercent(u32),
}

/// The policy's settings (`--scale-high`, `--scale-low`, `--scale-step`, ...).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyConfig {
    /// Scale out when used / capacity reaches this (0 < high <= 1).
    pub high: f64,
    /// Scale in when used / capacity falls below this (0 < low < high).
    pub low: f64,
    pub step: Step,
    /// Never scale in below this many nodes (nor below 1).
    pub min_nodes: usize,
    /// Never scale out above this many nodes.
    pub max_nodes: usize,
    /// Quiet time after a decision or a reconfiguration before the next decision.
    pub cooldown: Duration,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            high: 0.90,
            low: 0.50,
            // MemFS's example step: a quarter of the current cluster.
            step: Step::Percent(25),
            min_nodes: 1,
            max_nodes: usize::MAX,
            cooldown: Duration::from_secs(10),
        }
    }
}

impl PolicyConfig {
    pub fn validate(&self) -> Result<(), PolicyError> {
        for (which, value) in [("high", self.high), ("low", self.low)] {
            // Written this way so NaN fails too.
            if !(value > 0.0 && value <= 1.0) {
                return Err(PolicyError::MarkRange { which, value });
            }
        }
        if self.low >= self.high {
            return Err(PolicyError::MarksOrder {
                low: self.low,
                high: self.high,
            });
        }
        if self.max_nodes == 0 {
            return Err(PolicyError::ZeroMax);
        }
        if self.min_nodes > self.max_nodes {
            return Err(PolicyError::Bounds {
                min: self.min_nodes,
                max: self.max_nodes,
            });
        }
        match self.step {
            Step::Nodes(0) | Step::Percent(0) => Err(PolicyError::ZeroStep),
            Step::Percent(p) if p > 100 => Err(PolicyError::StepPercent(p)),
            _ => Ok(()),
        }
    }

    /// The usage a scale-in must leave below: halfway between the marks.
    #[must_use]
    pub fn scale_in_ceiling(&self) -> f64 {
        (self.low + self.high) / 2.0
    }
}

/// One live server as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLoad {
    pub node: NodeId,
    /// Memory it offers, bytes.
    pub capacity: u64,
    /// Memory its data takes, bytes (from its last heartbeat).
    pub used: u64,
    /// Being drained (leaving): neither counted nor chosen.
    pub draining: bool,
    /// May be removed by the policy (e.g. the provisioner can release it).
    pub removable: bool,
    /// When it joined: among equally loaded nodes the newest goes first.
    pub joined_at: Instant,
}

/// What the policy wants done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Decision {
    None,
    /// Provision this many new nodes.
    Add(u32),
    /// Drain and release these nodes (in the order given).
    Remove(Vec<NodeId>),
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::None => write!(f, "no change"),
            Decision::Add(n) => write!(f, "add {n} node{}", if *n == 1 { "" } else { "s" }),
            Decision::Remove(ids) => {
                let list: Vec<String> = ids.iter().map(ToString::to_string).collect();
                write!(f, "remove node(s) {}", list.join(", "))
            }
        }
    }
}

/// Used and offered bytes over the nodes that are not draining.
fn totals(nodes: &[NodeLoad]) -> (usize, u128, u128) {
    nodes
        .iter()
        .filter(|n| !n.draining)
        .fold((0, 0, 0), |(k, cap, used), n| {
            (
                k + 1,
                cap + u128::from(n.capacity),
                used + u128::from(n.used),
            )
        })
}

/// The elastic policy engine. Holds only the time of its last action.
#[derive(Debug, Clone)]
pub struct Policy {
    config: PolicyConfig,
    /// The last decision, or the last time a reconfiguration was seen under way.
    quiet_since: Option<Instant>,
}

impl Policy {
    pub fn new(config: PolicyConfig) -> Result<Self, PolicyError> {
        config.validate()?;
        Ok(Self {
            config,
            quiet_since: None,
        })
    }

    #[must_use]
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// Restarts the cooldown: something outside the policy changed the cluster (a manual
    /// `scale`, a death), so let the loads settle first.
    pub fn hold(&mut self, now: Instant) {
        self.quiet_since = Some(now);
    }

    /// Used / capacity over the nodes that are not draining (`None` without capacity).
    #[must_use]
    pub fn usage(nodes: &[NodeLoad]) -> Option<f64> {
        let (_, cap, used) = totals(nodes);
        (cap > 0).then(|| used as f64 / cap as f64)
    }

    /// What to do now. `nodes` are the live servers (dead ones left out); `reconfiguring` is
    /// true while copies are moving, nodes are being provisioned or drained. A decision other
    /// than [`Decision::None`] starts the cooldown; the caller is expected to act on it.
    pub fn decide(&mut self, now: Instant, nodes: &[NodeLoad], reconfiguring: bool) -> Decision {
        if reconfiguring {
            self.quiet_since = Some(now);
            return Decision::None;
        }
        if self
            .quiet_since
            .is_some_and(|t| now.saturating_duration_since(t) < self.config.cooldown)
        {
            return Decision::None;
        }
        let (n, cap, used) = totals(nodes);
        if n == 0 || cap == 0 {
            return Decision::None;
        }
        let c = &self.config;
        let usage = used as f64 / cap as f64;
        let decision = if usage >= c.high {
            let room = c.max_nodes.saturating_sub(n);
            let add = c.step.count(n).min(room);
            if add == 0 {
                Decision::None
            } else {
                Decision::Add(u32::try_from(add).unwrap_or(u32::MAX))
            }
        } else if usage < c.low {
            self.scale_in(nodes, n, cap, used)
        } else {
            Decision::None
        };
        if decision != Decision::None {
            self.quiet_since = Some(now);
        }
        decision
    }

    /// The most nodes, up to the step, whose removal leaves the data below the scale-in
    /// ceiling on the rest: the least loaded first, the newest first among equals.
    fn scale_in(&self, nodes: &[NodeLoad], n: usize, cap: u128, used: u128) -> Decision {
        let c = &self.config;
        let floor = c.min_nodes.max(1);
        let mut candidates: Vec<&NodeLoad> = nodes
            .iter()
            .filter(|x| !x.draining && x.removable)
            .collect();
        candidates.sort_by_key(|x| (x.used, Reverse(x.joined_at), Reverse(x.node)));
        let most = c
            .step
            .count(n)
            .min(n.saturating_sub(floor))
            .min(candidates.len());
        let ceiling = c.scale_in_ceiling();
        for k in (1..=most).rev() {
            let removed: u128 = candidates[..k].iter().map(|x| u128::from(x.capacity)).sum();
            let left = cap - removed;
            if left > 0 && (used as f64 / left as f64) < ceiling {
                return Decision::Remove(candidates[..k].iter().map(|x| x.node).collect());
            }
        }
        Decision::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;

    fn cfg(step: Step, min: usize, max: usize) -> PolicyConfig {
        PolicyConfig {
            step,
            min_nodes: min,
            max_nodes: max,
            ..PolicyConfig::default()
        }
    }

    /// `count` equal nodes of 1 GiB holding `frac` of it each, ids 1.., joined in id order.
    fn even(t0: Instant, count: u32, frac: f64) -> Vec<NodeLoad> {
        (1..=count)
            .map(|i| NodeLoad {
                node: i,
                capacity: GIB,
                used: (GIB as f64 * frac).round() as u64,
                draining: false,
                removable: true,
                joined_at: t0 + Duration::from_secs(u64::from(i)),
            })
            .collect()
    }

    fn secs(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    #[test]
    fn parses_marks_and_steps() {
        assert_eq!(parse_mark("90%").unwrap(), 0.9);
        assert_eq!(parse_mark(" 0.5 ").unwrap(), 0.5);
        assert_eq!(parse_mark("100%").unwrap(), 1.0);
        assert_eq!(parse_mark("1").unwrap(), 1.0);
        for bad in ["90", "0", "0%", "-0.2", "101%", "lots", "", "NaN"] {
            assert!(parse_mark(bad).is_err(), "{bad} accepted");
        }
        let e = parse_mark("90").unwrap_err().to_string();
        assert!(e.contains("write 90% or 0.9"), "{e}");
        assert_eq!("2".parse::<Step>().unwrap(), Step::Nodes(2));
        assert_eq!(" 25% ".parse::<Step>().unwrap(), Step::Percent(25));
        assert_eq!("0".parse::<Step>().unwrap_err(), PolicyError::ZeroStep);
        assert_eq!("0%".parse::<Step>().unwrap_err(), PolicyError::ZeroStep);
        for bad in ["-1", "2.5", "150%", "x%", ""] {
            assert!(bad.parse::<Step>().is_err(), "{bad} accepted");
        }
        for s in [Step::Nodes(3), Step::Percent(25)] {
            assert_eq!(s.to_string().parse::<Step>().unwrap(), s);
        }
    }

    #[test]
    fn validation_says_what_is_wrong() {
        assert!(PolicyConfig::default().validate().is_ok());
        let with = |f: fn(&mut PolicyConfig)| {
            let mut c = PolicyConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(matches!(
            with(|c| c.low = 0.95),
            PolicyError::MarksOrder { .. }
        ));
        assert!(matches!(
            with(|c| c.low = c.high),
            PolicyError::MarksOrder { .. }
        ));
        assert!(matches!(
            with(|c| c.high = 1.5),
            PolicyError::MarkRange { which: "high", .. }
        ));
        assert!(matches!(
            with(|c| c.low = 0.0),
            PolicyError::MarkRange { which: "low", .. }
        ));
        assert!(matches!(
            with(|c| c.low = f64::NAN),
            PolicyError::MarkRange { .. }
        ));
        assert!(matches!(
            with(|c| {
                c.min_nodes = 5;
                c.max_nodes = 4;
            }),
            PolicyError::Bounds { min: 5, max: 4 }
        ));
        assert_eq!(with(|c| c.max_nodes = 0), PolicyError::ZeroMax);
        assert_eq!(with(|c| c.step = Step::Nodes(0)), PolicyError::ZeroStep);
        assert_eq!(
            with(|c| c.step = Step::Percent(101)),
            PolicyError::StepPercent(101)
        );
        assert!(Policy::new(PolicyConfig {
            low: 0.9,
            ..PolicyConfig::default()
        })
        .is_err());
        let msg = with(|c| c.low = 0.95).to_string();
        assert!(msg.contains("below the high mark"), "{msg}");
    }

    #[test]
    fn step_counts() {
        assert_eq!(Step::Nodes(3).count(10), 3);
        assert_eq!(Step::Percent(25).count(64), 16);
        assert_eq!(Step::Percent(25).count(6), 1);
        assert_eq!(Step::Percent(25).count(3), 1);
        assert_eq!(Step::Percent(100).count(5), 5);
        assert_eq!(Step::Percent(50).count(0), 1);
    }

    #[test]
    fn scales_out_at_the_high_mark() {
        let t0 = Instant::now();
        let mut p = Policy::new(cfg(Step::Nodes(2), 1, 100)).unwrap();
        assert_eq!(p.decide(t0, &even(t0, 4, 0.89), false), Decision::None);
        assert_eq!(p.decide(t0, &even(t0, 4, 0.9), false), Decision::Add(2));
    }

    #[test]
    fn scales_in_below_the_low_mark_least_loaded_and_newest_first() {
        let t0 = Instant::now();
        let mut p = Policy::new(cfg(Step::Nodes(2), 1, 100)).unwrap();
        assert_eq!(p.decide(t0, &even(t0, 8, 0.5), false), Decision::None);
        let mut nodes = even(t0, 8, 0.3);
        // Node 3 holds less than the others; 6, 7 and 8 tie, 8 is the newest.
        nodes[2].used = GIB / 10;
        assert_eq!(p.decide(t0, &nodes, false), Decision::Remove(vec![3, 8]));
        // The order the nodes are listed in does not matter.
        let mut p = Policy::new(cfg(Step::Nodes(2), 1, 100)).unwrap();
        nodes.reverse();
        assert_eq!(p.decide(t0, &nodes, false), Decision::Remove(vec![3, 8]));
    }

    #[test]
    fn scale_in_keeps_the_rest_below_the_middle_of_the_marks() {
        let t0 = Instant::now();
        // 4 nodes at 45 %: removing 2 would leave 90 %, 1 leaves 60 % (< 70 %).
        let mut p = Policy::new(cfg(Step::Nodes(2), 1, 100)).unwrap();
        assert_eq!(
            p.decide(t0, &even(t0, 4, 0.45), false),
            Decision::Remove(vec![4])
        );
        // 2 nodes at 40 %: removing one leaves 80 %, above the ceiling: nothing.
        let mut p = Policy::new(cfg(Step::Nodes(1), 1, 100)).unwrap();
        assert_eq!(p.decide(t0, &even(t0, 2, 0.4), false), Decision::None);
        // 2 nodes at 34 %: one leaves 68 %: allowed.
        assert_eq!(
            p.decide(t0, &even(t0, 2, 0.34), false),
            Decision::Remove(vec![2])
        );
    }

    #[test]
    fn heterogeneous_capacities_count_in_the_projection() {
        let t0 = Instant::now();
        let mut p = Policy::new(cfg(Step::Nodes(1), 1, 100)).unwrap();
        // A big node (4 GiB) and a small one (1 GiB), 2 GiB of data: 40 %. Removing the
        // small node leaves 50 %; removing the big one would leave 200 %.
        let mut nodes = even(t0, 2, 0.0);
        nodes[0].capacity = 4 * GIB;
        nodes[0].used = 2 * GIB - GIB / 4;
        nodes[1].used = GIB / 4;
        assert_eq!(p.decide(t0, &nodes, false), Decision::Remove(vec![2]));
        // If the small node holds more, the big one is the least loaded but cannot go.
        nodes[0].used = GIB / 8;
        nodes[1].used = GIB / 2 + GIB / 4;
        nodes[0].capacity = 2 * GIB;
        nodes[1].capacity = 2 * GIB;
        let mut p = Policy::new(cfg(Step::Nodes(1), 1, 100)).unwrap();
        assert_eq!(p.decide(t0, &nodes, false), Decision::Remove(vec![1]));
    }

    #[test]
    fn steps_by_percent_of_current_nodes() {
        let t0 = Instant::now();
        let mut p = Policy::new(cfg(Step::Percent(25), 1, 1000)).unwrap();
        assert_eq!(p.decide(t0, &even(t0, 32, 0.95), false), Decision::Add(8));
        let mut p = Policy::new(cfg(Step::Percent(25), 1, 1000)).unwrap();
        assert_eq!(p.decide(t0, &even(t0, 3, 0.95), false), Decision::Add(1));
        let mut p = Policy::new(cfg(Step::Percent(25), 1, 1000)).unwrap();
        match p.decide(t0, &even(t0, 16, 0.2), false) {
            Decision::Remove(ids) => assert_eq!(ids, vec![16, 15, 14, 13]),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn respects_min_and_max_nodes() {
        let t0 = Instant::now();
        let mut p = Policy::new(cfg(Step::Nodes(4), 1, 6)).unwrap();
        assert_eq!(p.decide(t0, &even(t0, 4, 0.95), false), Decision::Add(2));
        let mut p = Policy::new(cfg(Step::Nodes(4), 1, 6)).unwrap();
        assert_eq!(p.decide(t0, &even(t0, 6, 1.0), false), Decision::None);
        let mut p = Policy::new(cfg(Step::Nodes(4), 3, 10)).unwrap();
        assert_eq!(
            p.decide(t0, &even(t0, 4, 0.01), false),
            Decision::Remove(vec![4])
        );
        let mut p = Policy::new(cfg(Step::Nodes(4), 3, 10)).unwrap();
        assert_eq!(p.decide(t0, &even(t0, 3, 0.01), false), Decision::None);
        // min 0 still keeps one node.
        let mut p = Policy::new(cfg(Step::Nodes(4), 0, 10)).unwrap();
        assert_eq!(p.decide(t0, &even(t0, 1, 0.0), false), Decision::None);
    }

    #[test]
    fn draining_and_unremovable_nodes_are_left_alone() {
        let t0 = Instant::now();
        let mut p = Policy::new(cfg(Step::Nodes(2), 1, 100)).unwrap();
        let mut nodes = even(t0, 4, 0.2);
        nodes[3].draining = true;
        nodes[2].removable = false;
        nodes[1].used = 0;
        // Usage counts nodes 1-3 only; 4 is leaving, 3 cannot go.
        assert_eq!(p.decide(t0, &nodes, false), Decision::Remove(vec![2, 1]));
        // A draining node's capacity does not count: 2 nodes full, 1 draining empty.
        let mut p = Policy::new(cfg(Step::Nodes(1), 1, 100)).unwrap();
        let mut nodes = even(t0, 3, 0.95);
        nodes[2].used = 0;
        nodes[2].draining = true;
        assert!((Policy::usage(&nodes).unwrap() - 0.95).abs() < 1e-9);
        assert_eq!(p.decide(t0, &nodes, false), Decision::Add(1));
        assert_eq!(Policy::usage(&[]), None);
        assert_eq!(p.decide(secs(t0, 100), &[], false), Decision::None);
    }

    #[test]
    fn waits_while_reconfiguring_and_for_the_cooldown() {
        let t0 = Instant::now();
        let mut p = Policy::new(cfg(Step::Nodes(1), 1, 100)).unwrap();
        let full = even(t0, 4, 0.95);
        assert_eq!(p.decide(t0, &full, true), Decision::None);
        // The reconfiguration ended just now: wait out the cooldown first.
        assert_eq!(p.decide(secs(t0, 9), &full, false), Decision::None);
        assert_eq!(p.decide(secs(t0, 10), &full, false), Decision::Add(1));
        assert_eq!(p.decide(secs(t0, 15), &full, false), Decision::None);
        assert_eq!(p.decide(secs(t0, 20), &full, false), Decision::Add(1));
        // A manual change restarts the cooldown too.
        p.hold(secs(t0, 25));
        assert_eq!(p.decide(secs(t0, 34), &full, false), Decision::None);
        assert_eq!(p.decide(secs(t0, 35), &full, false), Decision::Add(1));
        // Nothing to do does not start a cooldown.
        let mut p = Policy::new(cfg(Step::Nodes(1), 1, 100)).unwrap();
        assert_eq!(p.decide(t0, &even(t0, 4, 0.7), false), Decision::None);
        assert_eq!(p.decide(secs(t0, 1), &full, false), Decision::Add(1));
    }

    #[test]
    fn no_flapping_around_the_high_mark() {
        let t0 = Instant::now();
        let mut p = Policy::new(cfg(Step::Nodes(1), 1, 100)).unwrap();
        let mut count = 4u32;
        let data = 0.9 * 4.0 * GIB as f64;
        let mut decisions = Vec::new();
        for s in 0..120u64 {
            // Data wobbles 2 % around 90 % of the initial 4 nodes, every second.
            let wobble = if s % 2 == 0 { 1.02 } else { 0.98 };
            let frac = data * wobble / (f64::from(count) * GIB as f64);
            match p.decide(secs(t0, s), &even(t0, count, frac), false) {
                Decision::None => {}
                Decision::Add(k) => {
                    count += k;
                    decisions.push((s, Decision::Add(k)));
                }
                d => decisions.push((s, d)),
            }
        }
        // One node added at the first peak; at 5 nodes (72 %) nothing more, ever.
        assert_eq!(decisions, vec![(0, Decision::Add(1))]);
    }

    #[test]
    fn no_flapping_around_the_low_mark() {
        let t0 = Instant::now();
        let mut p = Policy::new(cfg(Step::Nodes(2), 1, 100)).unwrap();
        let mut count = 8u32;
        let data = 0.5 * 8.0 * GIB as f64;
        let mut decisions = Vec::new();
        for s in 0..120u64 {
            let wobble = if s % 2 == 0 { 1.03 } else { 0.97 };
            let frac = data * wobble / (f64::from(count) * GIB as f64);
            match p.decide(secs(t0, s), &even(t0, count, frac), false) {
                Decision::None => {}
                Decision::Remove(ids) => {
                    count -= ids.len() as u32;
                    decisions.push((s, Decision::Remove(ids)));
                }
                d => decisions.push((s, d)),
            }
        }
        // First dip below 50 %: 2 of 8 go (about 65 % left); then it stays put.
        assert_eq!(decisions, vec![(1, Decision::Remove(vec![8, 7]))]);
    }

    /// A simulated elastic cluster: equal 1 GiB nodes, data spread evenly; an addition takes
    /// `settle` seconds to provision and copy, a removal as long to drain.
    fn simulate(
        mut p: Policy,
        start: u32,
        data: impl Fn(u64) -> f64,
        end: u64,
    ) -> Vec<(u64, Decision, u32)> {
        let t0 = Instant::now();
        let settle = 3;
        let mut count = start;
        let mut busy_until = 0;
        let mut log = Vec::new();
        let mut joined: Vec<(NodeId, u64)> = (1..=start).map(|i| (i, 0)).collect();
        let mut next_id = start + 1;
        for s in 0..end {
            let bytes = data(s);
            let nodes: Vec<NodeLoad> = joined
                .iter()
                .map(|&(node, at)| NodeLoad {
                    node,
                    capacity: GIB,
                    used: (bytes / f64::from(count)).round() as u64,
                    draining: false,
                    removable: true,
                    joined_at: secs(t0, at),
                })
                .collect();
            assert!(
                bytes <= f64::from(count) * GIB as f64,
                "out of memory at {s} s"
            );
            let d = p.decide(secs(t0, s), &nodes, s < busy_until);
            match &d {
                Decision::None => continue,
                Decision::Add(k) => {
                    for _ in 0..*k {
                        joined.push((next_id, s));
                        next_id += 1;
                    }
                    count += k;
                }
                Decision::Remove(ids) => {
                    joined.retain(|(n, _)| !ids.contains(n));
                    count -= ids.len() as u32;
                }
            }
            busy_until = s + settle;
            log.push((s, d, count));
        }
        log
    }

    #[test]
    fn drives_up_then_down() {
        let g = GIB as f64;
        // Data grows 0.1 GiB/s to 7 GiB (70 s), stays 20 s, then drops in three stages (as a
        // workflow deleting its intermediate files), to nothing.
        let data = |s: u64| -> f64 {
            let s = s as f64;
            if s < 70.0 {
                0.1 * g * s
            } else if s < 90.0 {
                7.0 * g
            } else if s < 110.0 {
                3.5 * g
            } else if s < 130.0 {
                1.5 * g
            } else {
                0.0
            }
        };
        let p = Policy::new(PolicyConfig {
            step: Step::Nodes(2),
            min_nodes: 2,
            max_nodes: 12,
            cooldown: Duration::from_secs(5),
            ..PolicyConfig::default()
        })
        .unwrap();
        let log = simulate(p, 2, data, 160);
        // Out when 2, 4 and 6 nodes reach 90 %; 8 nodes then hold the 7 GiB peak (87.5 %).
        // In: 3.5 GiB on 8 (44 %) -> 2 go (58 % left). 1.5 GiB on 6 (25 %) -> 2 go (38 %);
        // still below 50 % after the cooldown, but 2 more would leave 75 %: only 1 goes (50 %).
        // Nothing left -> down to the minimum of 2. Least loaded ties: the newest first.
        let expect = vec![
            (18, Decision::Add(2), 4),
            (36, Decision::Add(2), 6),
            (54, Decision::Add(2), 8),
            (90, Decision::Remove(vec![8, 7]), 6),
            (110, Decision::Remove(vec![6, 5]), 4),
            (117, Decision::Remove(vec![4]), 3),
            (130, Decision::Remove(vec![3]), 2),
        ];
        assert_eq!(log, expect);
    }

    fn arb_nodes() -> impl Strategy<Value = Vec<(u64, u64, bool, bool, u8)>> {
        prop::collection::vec(
            (
                1u64..64,
                0u64..=100,
                any::<bool>(),
                prop::bool::weighted(0.8),
                0u8..10,
            ),
            0..24,
        )
    }

    fn build(t0: Instant, raw: &[(u64, u64, bool, bool, u8)]) -> Vec<NodeLoad> {
        raw.iter()
            .enumerate()
            .map(|(i, &(cap, pct, draining, removable, age))| NodeLoad {
                node: i as NodeId + 1,
                capacity: cap * GIB,
                used: cap * GIB * pct / 100,
                draining,
                removable,
                joined_at: secs(t0, u64::from(age)),
            })
            .collect()
    }

    proptest! {
        #[test]
        fn decisions_respect_every_rule(
            raw in arb_nodes(),
            high in 0.6f64..=1.0,
            low in 0.05f64..0.55,
            nodes_step in prop::bool::ANY,
            step in 1u32..10,
            min in 0usize..6,
            extra in 0usize..20,
            reconfiguring in any::<bool>(),
            shuffle_seed in any::<u64>(),
        ) {
            let t0 = Instant::now();
            let config = PolicyConfig {
                high,
                low,
                step: if nodes_step { Step::Nodes(step) } else { Step::Percent(step * 10) },
                min_nodes: min,
                max_nodes: min.max(1) + extra,
                cooldown: Duration::from_secs(10),
            };
            let mut p = Policy::new(config.clone()).unwrap();
            let nodes = build(t0, &raw);
            let d = p.decide(t0, &nodes, reconfiguring);
            // Deterministic, whatever order the nodes come in.
            let mut shuffled = nodes.clone();
            let len = shuffled.len().max(1);
            shuffled.rotate_left((shuffle_seed as usize) % len);
            if shuffle_seed % 2 == 0 { shuffled.reverse(); }
            let mut q = Policy::new(config.clone()).unwrap();
            prop_assert_eq!(&q.decide(t0, &shuffled, reconfiguring), &d);

            let active: Vec<&NodeLoad> = nodes.iter().filter(|n| !n.draining).collect();
            let cap: u128 = active.iter().map(|n| u128::from(n.capacity)).sum();
            let used: u128 = active.iter().map(|n| u128::from(n.used)).sum();
            let usage = if cap == 0 { None } else { Some(used as f64 / cap as f64) };
            match &d {
                Decision::None => {
                    if !reconfiguring {
                        if let Some(u) = usage {
                            // Scale-out is never refused below the maximum.
                            prop_assert!(u < high || active.len() >= config.max_nodes);
                        }
                    }
                }
                Decision::Add(k) => {
                    prop_assert!(!reconfiguring);
                    prop_assert!(usage.unwrap() >= high);
                    prop_assert!(*k >= 1);
                    prop_assert!(active.len() + *k as usize <= config.max_nodes);
                }
                Decision::Remove(ids) => {
                    prop_assert!(!reconfiguring);
                    prop_assert!(usage.unwrap() < low);
                    prop_assert!(!ids.is_empty());
                    prop_assert!(active.len() - ids.len() >= min.max(1));
                    prop_assert!(ids.len() <= config.step.count(active.len()));
                    let mut uniq = ids.clone();
                    uniq.sort_unstable();
                    uniq.dedup();
                    prop_assert_eq!(uniq.len(), ids.len());
                    let gone: u128 = ids.iter().map(|id| {
                        let n = nodes.iter().find(|n| n.node == *id).unwrap();
                        prop_assert!(n.removable && !n.draining);
                        Ok(u128::from(n.capacity))
                    }).sum::<Result<u128, TestCaseError>>()?;
                    prop_assert!((used as f64 / (cap - gone) as f64) < (low + high) / 2.0);
                }
            }
            // After a decision or a reconfiguration, nothing within the cooldown (and without
            // either, the same loads still decide nothing).
            prop_assert_eq!(p.decide(t0 + Duration::from_secs(9), &nodes, false), Decision::None);
        }
    }
}
