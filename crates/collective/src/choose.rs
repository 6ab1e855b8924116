//! Which writers become coordinators (ARC §III-D), as a pure function of what every writer
//! reported in its marker, so that every writer makes the same choice on its own.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// How coordinators are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Nodes by load average, lowest first, taken in turn (as `LeastRr`).
    #[default]
    LeastLoaded,
    /// The writers with the least local data (ARC_LEAST), wherever they run.
    Least,
    /// The writers with the most local data (ARC_MOST), wherever they run.
    Most,
    /// Least local data, nodes taken in turn (ARC_LEAST_RR).
    LeastRr,
    /// Most local data, nodes taken in turn (ARC_MOST_RR).
    MostRr,
}

impl Strategy {
    pub const ALL: [Strategy; 5] = [
        Self::LeastLoaded,
        Self::Least,
        Self::Most,
        Self::LeastRr,
        Self::MostRr,
    ];

    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::LeastLoaded => "least-loaded",
            Self::Least => "least",
            Self::Most => "most",
            Self::LeastRr => "least-rr",
            Self::MostRr => "most-rr",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                format!("unknown strategy {s:?}: least-loaded, least, most, least-rr or most-rr")
            })
    }
}

/// What the choice looks at of a writer.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub rank: u32,
    /// Its node (host name).
    pub host: String,
    /// Its local data: the record bytes it wrote.
    pub bytes: u64,
    /// Its node's load average when it finished writing.
    pub load: f64,
}

/// The coordinators, by rank, in the order of the ranges they take: as many as the nodes
/// allow, `per_node` each (fewer on a node with fewer writers). `Least` and `Most` rank all
/// writers and may take several on one node; the round-robin strategies take each node's
/// share from it. Ties go to the lower rank (and node name).
#[must_use]
pub fn choose(writers: &[Candidate], strategy: Strategy, per_node: usize) -> Vec<u32> {
    let per_node = per_node.max(1);
    let mut nodes: BTreeMap<&str, Vec<&Candidate>> = BTreeMap::new();
    for w in writers {
        nodes.entry(&w.host).or_default().push(w);
    }
    let count: usize = nodes.values().map(|ws| ws.len().min(per_node)).sum();
    let most = matches!(strategy, Strategy::Most | Strategy::MostRr);
    let by_data = |a: &&Candidate, b: &&Candidate| {
        let data = if most {
            b.bytes.cmp(&a.bytes)
        } else {
            a.bytes.cmp(&b.bytes)
        };
        data.then(a.rank.cmp(&b.rank))
    };
    if matches!(strategy, Strategy::Least | Strategy::Most) {
        let mut all: Vec<&Candidate> = writers.iter().collect();
        all.sort_by(by_data);
        return all.iter().take(count).map(|w| w.rank).collect();
    }
    let mut queues: Vec<(&str, Vec<&Candidate>)> = nodes
        .into_iter()
        .map(|(host, mut ws)| {
            ws.sort_by(by_data);
            ws.truncate(per_node);
            (host, ws)
        })
        .collect();
    // Nodes take turns in the order of their first pick (or of their load).
    if strategy == Strategy::LeastLoaded {
        let load = |ws: &[&Candidate]| ws.iter().map(|w| w.load).fold(f64::INFINITY, f64::min);
        queues.sort_by(|a, b| load(&a.1).total_cmp(&load(&b.1)).then(a.0.cmp(b.0)));
    } else {
        queues.sort_by(|a, b| by_data(&a.1[0], &b.1[0]));
    }
    let mut out = Vec::with_capacity(count);
    for turn in 0..per_node {
        out.extend(
            queues
                .iter()
                .filter_map(|(_, ws)| ws.get(turn))
                .map(|w| w.rank),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(rank: u32, host: &str, bytes: u64, load: f64) -> Candidate {
        Candidate {
            rank,
            host: host.into(),
            bytes,
            load,
        }
    }

    /// Two nodes: a holds ranks 0-2, b ranks 3-4.
    fn two_nodes() -> Vec<Candidate> {
        vec![
            w(0, "a", 50, 2.0),
            w(1, "a", 10, 2.0),
            w(2, "a", 20, 2.0),
            w(3, "b", 90, 0.5),
            w(4, "b", 40, 0.5),
        ]
    }

    #[test]
    fn least_and_most_rank_all_writers() {
        let ws = two_nodes();
        // One per node: two coordinators, the two with the least (most) data anywhere.
        assert_eq!(choose(&ws, Strategy::Least, 1), [1, 2]);
        assert_eq!(choose(&ws, Strategy::Most, 1), [3, 0]);
        assert_eq!(choose(&ws, Strategy::Least, 2), [1, 2, 4, 0]);
        assert_eq!(choose(&ws, Strategy::Most, 2), [3, 0, 4, 2]);
    }

    #[test]
    fn round_robin_spreads_over_nodes() {
        let ws = two_nodes();
        assert_eq!(choose(&ws, Strategy::LeastRr, 1), [1, 4]);
        assert_eq!(choose(&ws, Strategy::MostRr, 1), [3, 0]);
        assert_eq!(choose(&ws, Strategy::LeastRr, 2), [1, 4, 2, 3]);
        assert_eq!(choose(&ws, Strategy::MostRr, 2), [3, 0, 4, 2]);
        // A node gives no more writers than it has.
        assert_eq!(choose(&ws, Strategy::LeastRr, 5), [1, 4, 2, 3, 0]);
    }

    #[test]
    fn least_loaded_starts_with_the_idlest_node() {
        let ws = two_nodes();
        assert_eq!(choose(&ws, Strategy::LeastLoaded, 1), [4, 1]);
        assert_eq!(choose(&ws, Strategy::LeastLoaded, 2), [4, 1, 3, 2]);
    }

    #[test]
    fn ties_go_to_the_lower_rank_and_one_node_is_one_coordinator() {
        let ws: Vec<_> = (0..4).map(|r| w(3 - r, "h", 7, 1.0)).collect();
        for s in Strategy::ALL {
            assert_eq!(choose(&ws, s, 1), [0], "{s}");
            assert_eq!(choose(&ws, s, 3), [0, 1, 2], "{s}");
        }
        assert!(choose(&[], Strategy::Least, 1).is_empty());
    }

    #[test]
    fn names_round_trip() {
        for s in Strategy::ALL {
            assert_eq!(s.name().parse::<Strategy>(), Ok(s));
        }
        assert!("fastest".parse::<Strategy>().is_err());
    }
}
