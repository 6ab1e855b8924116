//! What writers and coordinators leave in the working directory for one another (JSON).

use crate::choose::Strategy;
use crate::run::RunIndex;
use serde::{Deserialize, Serialize};

/// Samples a writer's marker carries of each run, for the splitters.
pub const MARKER_SAMPLES: usize = 64;

/// `w<rank>.done`: a writer wrote all its runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Marker {
    pub rank: u32,
    /// What every writer must agree on.
    pub agreed: Agreed,
    pub host: String,
    pub pid: u32,
    /// The node's load average (1 minute) when the writer finished.
    pub load: f64,
    pub records: u64,
    /// Record bytes.
    pub bytes: u64,
    pub runs: Vec<RunSummary>,
    /// In arrival order: where its buffers went in the output.
    #[serde(default)]
    pub parts: Vec<Part>,
}

/// A buffer written at its reservation in the output (arrival order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    pub offset: u64,
    pub bytes: u64,
    pub records: u64,
}

/// The options every writer of one output must give alike.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Agreed {
    pub writers: u32,
    pub sorted: bool,
    #[serde(default)]
    pub order: crate::Order,
    pub top: Option<u64>,
    #[serde(default)]
    pub fixed: Option<crate::Fixed>,
    pub strategy: Strategy,
    pub coordinators_per_node: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSummary {
    pub run: u32,
    pub records: u64,
    pub bytes: u64,
    /// Some of the run's index samples, the first among them.
    pub samples: Vec<MarkerSample>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkerSample {
    #[serde(with = "hex")]
    pub key: Vec<u8>,
    /// Records before it in its run.
    pub pos: u64,
    /// Record bytes before it in its run.
    pub bytes: u64,
}

impl RunSummary {
    /// The summary of run `run` with `index`: at most [`MARKER_SAMPLES`] of its samples,
    /// evenly spread.
    #[must_use]
    pub fn of(run: u32, index: &RunIndex) -> Self {
        let n = index.samples.len();
        let take = n.min(MARKER_SAMPLES);
        let samples = (0..take)
            .map(|i| &index.samples[i * n / take])
            .map(|s| MarkerSample {
                key: s.key.clone(),
                pos: s.at.records,
                bytes: s.at.bytes,
            })
            .collect();
        Self {
            run,
            records: index.end.records,
            bytes: index.end.bytes,
            samples,
        }
    }
}

/// `c<i>.done`: coordinator `index` wrote its range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoordinatorDone {
    pub index: usize,
    pub rank: u32,
    /// Where its range begins in the output, and what it wrote there.
    pub offset: u64,
    pub records: u64,
    pub bytes: u64,
    /// Merge passes (1 unless its runs were too many for its memory at once).
    pub passes: u32,
    /// Seconds it took from the start of its merge to its last byte stored.
    pub merge_secs: f64,
}

/// `finished`: the output is in place (written just before the directory is removed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finished {
    pub size: u64,
    pub records: u64,
    pub coordinators: Vec<u32>,
    /// Seconds from the last writer's marker seen to the output in place.
    pub aggregation_secs: f64,
}

/// `w<rank>.abort`: a writer left without finishing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Abort {
    pub rank: u32,
    pub reason: String,
}

/// Keys as hexadecimal strings.
mod hex {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};
    use std::fmt::Write;

    pub fn serialize<S: Serializer>(key: &[u8], s: S) -> Result<S::Ok, S::Error> {
        let mut out = String::with_capacity(key.len() * 2);
        for b in key {
            let _ = write!(out, "{b:02x}");
        }
        s.serialize_str(&out)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        if s.len() % 2 != 0 {
            return Err(D::Error::custom("odd length of a hexadecimal key"));
        }
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(D::Error::custom))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::{Pos, Sample};

    #[test]
    fn markers_round_trip_through_json() {
        let index = RunIndex {
            samples: (0..200u64)
                .map(|i| Sample {
                    key: vec![0, 0xff, i as u8],
                    at: Pos {
                        offset: i * 100,
                        records: i * 10,
                        bytes: i * 90,
                    },
                })
                .collect(),
            end: Pos {
                offset: 20_000,
                records: 2000,
                bytes: 18_000,
            },
        };
        let run = RunSummary::of(3, &index);
        assert_eq!(run.samples.len(), MARKER_SAMPLES);
        assert_eq!(run.samples[0].pos, 0);
        assert_eq!((run.records, run.bytes), (2000, 18_000));
        let m = Marker {
            rank: 1,
            agreed: Agreed {
                writers: 4,
                sorted: true,
                order: crate::Order::Rank,
                top: Some(5),
                fixed: None,
                strategy: Strategy::MostRr,
                coordinators_per_node: 2,
            },
            host: "node".into(),
            pid: 42,
            load: 0.25,
            records: 2000,
            bytes: 18_000,
            runs: vec![run],
            parts: vec![Part {
                offset: 7,
                bytes: 8,
                records: 9,
            }],
        };
        let json = serde_json::to_string(&m).unwrap();
        assert!(
            json.contains("\"key\":\"00ff03\"") && json.contains("most-rr"),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<Marker>(&json).unwrap(), m);
        assert!(serde_json::from_str::<MarkerSample>(r#"{"key":"0","pos":0,"bytes":0}"#).is_err());
    }
}
