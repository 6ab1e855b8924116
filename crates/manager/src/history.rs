//! Memory allocated and used over time (MemFS Figure 6), in bounded space: samples are
//! gathered into buckets of `resolution_ms`; when the buffer is full, neighbouring buckets are
//! merged and the resolution doubles, so a long run still covers its whole span.
//!
//! A sample's values hold until the next sample (step function). Merging averages them over
//! time, so the integrals [`usage_stats`] computes (the benchmark's "resource usage
//! improvement") survive any number of merges; node counts keep the maximum, so a short
//! scale-out stays visible. Pure: the caller supplies the time.

use serde::{Deserialize, Serialize};

/// Samples kept at most (about 100 KiB).
pub const DEFAULT_CAPACITY: usize = 4096;
/// Initial bucket width: the manager ticks several times a second; one point a second is
/// plenty for a plot and keeps an hour at full resolution.
pub const DEFAULT_RESOLUTION_MS: u64 = 1000;

/// The cluster's memory at one moment (or, once merged, averaged over a bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// Milliseconds since the manager started.
    pub t_ms: u64,
    /// Live servers (the most over a merged bucket).
    pub nodes: u32,
    /// Memory offered by the live servers, bytes.
    pub allocated: u64,
    /// Memory their data takes, bytes.
    pub used: u64,
}

/// The bucket being filled: integrals so far and the latest sample, whose values hold until
/// the next one arrives.
#[derive(Debug, Clone)]
struct Open {
    start: u64,
    allocated_area: u128,
    used_area: u128,
    nodes: u32,
    last: Sample,
}

impl Open {
    fn at(s: Sample) -> Self {
        Self {
            start: s.t_ms,
            allocated_area: 0,
            used_area: 0,
            nodes: 0,
            last: s,
        }
    }
}

fn avg(area: u128, span: u128) -> u64 {
    u64::try_from(area / span).unwrap_or(u64::MAX)
}

/// A bounded record of [`Sample`]s covering the manager's whole life.
#[derive(Debug, Clone)]
pub struct History {
    closed: Vec<Sample>,
    open: Option<Open>,
    capacity: usize,
    resolution_ms: u64,
}

impl Default for History {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY, DEFAULT_RESOLUTION_MS)
    }
}

impl History {
    /// At most `capacity` samples (at least 4), one per `resolution_ms` to begin with (0: one
    /// per distinct millisecond).
    #[must_use]
    pub fn new(capacity: usize, resolution_ms: u64) -> Self {
        Self {
            closed: Vec::new(),
            open: None,
            capacity: capacity.max(4),
            resolution_ms,
        }
    }

    /// The current bucket width in milliseconds (doubles whenever the buffer is compacted).
    #[must_use]
    pub fn resolution_ms(&self) -> u64 {
        self.resolution_ms
    }

    /// Adds a sample. Time never goes backwards: an earlier `t_ms` counts as the latest one.
    pub fn record(&mut self, sample: Sample) {
        let Some(open) = &mut self.open else {
            self.open = Some(Open::at(sample));
            return;
        };
        let mut s = sample;
        s.t_ms = s.t_ms.max(open.last.t_ms);
        let dt = u128::from(s.t_ms - open.last.t_ms);
        if dt > 0 {
            open.allocated_area += u128::from(open.last.allocated) * dt;
            open.used_area += u128::from(open.last.used) * dt;
            open.nodes = open.nodes.max(open.last.nodes);
        }
        if s.t_ms - open.start < self.resolution_ms.max(1) {
            // Same bucket: the newest values hold from here on.
            open.last = s;
            return;
        }
        if let Some(bucket) = open.integrated_until(s.t_ms) {
            self.closed.push(bucket);
        }
        self.open = Some(Open::at(s));
        if self.closed.len() >= self.capacity {
            self.compact();
        }
    }

    /// Halves the closed buckets by merging neighbours, and doubles the resolution (at least
    /// to the buckets' new mean width) so new buckets match the old.
    fn compact(&mut self) {
        let end = self.open.as_ref().map_or(0, |o| o.start);
        let old = std::mem::take(&mut self.closed);
        let next_start = |i: usize| old.get(i).map_or(end, |s| s.t_ms);
        for i in (0..old.len()).step_by(2) {
            let a = old[i];
            let Some(&b) = old.get(i + 1) else {
                self.closed.push(a);
                continue;
            };
            let (da, db) = (
                u128::from(b.t_ms - a.t_ms),
                u128::from(next_start(i + 2).saturating_sub(b.t_ms)),
            );
            let span = da + db;
            let merged = if span == 0 {
                b
            } else {
                Sample {
                    t_ms: a.t_ms,
                    nodes: a.nodes.max(b.nodes),
                    allocated: avg(
                        u128::from(a.allocated) * da + u128::from(b.allocated) * db,
                        span,
                    ),
                    used: avg(u128::from(a.used) * da + u128::from(b.used) * db, span),
                }
            };
            self.closed.push(merged);
        }
        let first = self.closed.first().map_or(end, |s| s.t_ms);
        let mean = (end - first) / self.closed.len().max(1) as u64;
        self.resolution_ms = (self.resolution_ms * 2).max(mean).max(1);
    }

    /// Every sample: the merged past, the bucket being filled, and the latest sample (whose
    /// values hold "now"). Consecutive samples define a step function from the first `t_ms`
    /// to the last.
    #[must_use]
    pub fn samples(&self) -> Vec<Sample> {
        let mut out = Vec::with_capacity(self.closed.len() + 2);
        out.extend_from_slice(&self.closed);
        if let Some(o) = &self.open {
            out.extend(o.integrated_until(o.last.t_ms));
            out.push(o.last);
        }
        out
    }

    /// The latest sample, if any.
    #[must_use]
    pub fn last(&self) -> Option<Sample> {
        self.open.as_ref().map(|o| o.last)
    }
}

impl Open {
    /// The bucket closed at `end` (the last sample's values held until then).
    fn integrated_until(&self, end: u64) -> Option<Sample> {
        let span = u128::from(end - self.start);
        (span > 0).then(|| Sample {
            t_ms: self.start,
            nodes: self.nodes,
            allocated: avg(self.allocated_area, span),
            used: avg(self.used_area, span),
        })
    }
}

impl Serialize for History {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct View {
            resolution_ms: u64,
            samples: Vec<Sample>,
        }
        View {
            resolution_ms: self.resolution_ms,
            samples: self.samples(),
        }
        .serialize(ser)
    }
}

/// Integrals over a run (step integration: each sample's values hold until the next).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct UsageStats {
    /// From the first sample to the last.
    pub duration_s: f64,
    /// Memory allocated over time (byte-seconds).
    pub allocated_byte_seconds: f64,
    /// Memory used over time (byte-seconds).
    pub used_byte_seconds: f64,
    /// Allocated but unused (byte-seconds): what elasticity saves.
    pub waste_byte_seconds: f64,
    /// Used over allocated, time-weighted (0 to 1; the instant ratio for a single sample).
    pub mean_utilisation: f64,
    pub peak_nodes: u32,
    pub peak_allocated: u64,
    pub peak_used: u64,
}

#[must_use]
pub fn usage_stats(samples: &[Sample]) -> UsageStats {
    let mut st = UsageStats::default();
    for s in samples {
        st.peak_nodes = st.peak_nodes.max(s.nodes);
        st.peak_allocated = st.peak_allocated.max(s.allocated);
        st.peak_used = st.peak_used.max(s.used);
    }
    for w in samples.windows(2) {
        let dt = w[1].t_ms.saturating_sub(w[0].t_ms) as f64 / 1000.0;
        st.allocated_byte_seconds += w[0].allocated as f64 * dt;
        st.used_byte_seconds += w[0].used as f64 * dt;
        // Used can exceed allocated for a moment (a heartbeat from a node already dropped).
        st.waste_byte_seconds += w[0].allocated.saturating_sub(w[0].used) as f64 * dt;
    }
    if let (Some(a), Some(b)) = (samples.first(), samples.last()) {
        st.duration_s = b.t_ms.saturating_sub(a.t_ms) as f64 / 1000.0;
    }
    st.mean_utilisation = if st.allocated_byte_seconds > 0.0 {
        st.used_byte_seconds / st.allocated_byte_seconds
    } else {
        match samples {
            [s, ..] if s.allocated > 0 && st.duration_s == 0.0 => {
                s.used as f64 / s.allocated as f64
            }
            _ => 0.0,
        }
    };
    st
}

/// MemFS's "resource usage improvement" of a run over a baseline (a static cluster): how
/// much less allocated-but-unused memory it held over time, as a fraction (0.558 = 55.8 %).
/// `None` if the baseline wasted nothing.
#[must_use]
pub fn resource_usage_improvement(baseline: &UsageStats, run: &UsageStats) -> Option<f64> {
    (baseline.waste_byte_seconds > 0.0)
        .then(|| 1.0 - run.waste_byte_seconds / baseline.waste_byte_seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn s(t_ms: u64, nodes: u32, allocated: u64, used: u64) -> Sample {
        Sample {
            t_ms,
            nodes,
            allocated,
            used,
        }
    }

    #[test]
    fn stats_of_nothing_and_of_one_sample() {
        let st = usage_stats(&[]);
        assert_eq!(st, UsageStats::default());
        let st = usage_stats(&[s(5, 2, 4 * GIB, GIB)]);
        assert_eq!((st.duration_s, st.allocated_byte_seconds), (0.0, 0.0));
        assert_eq!(st.mean_utilisation, 0.25);
        assert_eq!((st.peak_nodes, st.peak_used), (2, GIB));
        assert_eq!(usage_stats(&[s(0, 0, 0, 0)]).mean_utilisation, 0.0);
    }

    #[test]
    fn step_integration() {
        // 4 GiB for 10 s (1 GiB used), then 8 GiB for 5 s (6 GiB used).
        let st = usage_stats(&[
            s(0, 2, 4 * GIB, GIB),
            s(10_000, 4, 8 * GIB, 6 * GIB),
            s(15_000, 4, 8 * GIB, 6 * GIB),
        ]);
        let g = GIB as f64;
        assert_eq!(st.duration_s, 15.0);
        assert_eq!(st.allocated_byte_seconds, 80.0 * g);
        assert_eq!(st.used_byte_seconds, 40.0 * g);
        assert_eq!(st.waste_byte_seconds, 40.0 * g);
        assert_eq!(st.mean_utilisation, 0.5);
        assert_eq!(st.peak_allocated, 8 * GIB);
        // Used above allocated counts as no waste, not negative waste.
        let st = usage_stats(&[s(0, 1, GIB, 2 * GIB), s(1000, 1, GIB, 0)]);
        assert_eq!(st.waste_byte_seconds, 0.0);
    }

    #[test]
    fn improvement_over_a_static_run() {
        let stat = usage_stats(&[s(0, 8, 8 * GIB, 2 * GIB), s(100_000, 8, 8 * GIB, 2 * GIB)]);
        let elastic = usage_stats(&[s(0, 3, 3 * GIB, 2 * GIB), s(100_000, 3, 3 * GIB, 2 * GIB)]);
        let imp = resource_usage_improvement(&stat, &elastic).unwrap();
        assert!((imp - 5.0 / 6.0).abs() < 1e-12, "{imp}");
        assert_eq!(
            resource_usage_improvement(&elastic, &stat).map(|v| v < 0.0),
            Some(true)
        );
        assert_eq!(
            resource_usage_improvement(&UsageStats::default(), &stat),
            None
        );
    }

    #[test]
    fn keeps_every_sample_at_full_resolution() {
        let mut h = History::new(64, 0);
        assert!(h.samples().is_empty());
        assert_eq!(h.last(), None);
        h.record(s(0, 1, GIB, 0));
        assert_eq!(h.samples(), vec![s(0, 1, GIB, 0)]);
        h.record(s(100, 2, 2 * GIB, 5));
        h.record(s(250, 2, 2 * GIB, 7));
        assert_eq!(
            h.samples(),
            vec![
                s(0, 1, GIB, 0),
                s(100, 2, 2 * GIB, 5),
                s(250, 2, 2 * GIB, 7)
            ]
        );
        // A sample at the same millisecond replaces the latest; an earlier one counts as now.
        h.record(s(250, 3, 3 * GIB, 9));
        h.record(s(200, 3, 3 * GIB, 11));
        assert_eq!(h.samples().last(), Some(&s(250, 3, 3 * GIB, 11)));
        assert_eq!(h.samples().len(), 3);
    }

    #[test]
    fn buckets_average_over_time_and_keep_the_most_nodes() {
        let mut h = History::new(64, 1000);
        h.record(s(0, 1, 1000, 100));
        h.record(s(250, 2, 2000, 100));
        h.record(s(500, 1, 1000, 300));
        // Open bucket so far: 250 ms at 1000 and 250 ms at 2000.
        assert_eq!(h.samples(), vec![s(0, 2, 1500, 100), s(500, 1, 1000, 300)]);
        h.record(s(1000, 1, 1000, 300));
        // Closed at 1000: 1000*250 + 2000*250 + 1000*500 over 1000 ms.
        assert_eq!(h.samples(), vec![s(0, 2, 1250, 200), s(1000, 1, 1000, 300)]);
    }

    #[test]
    fn stays_bounded_covers_the_whole_run_and_keeps_the_integrals() {
        let mut h = History::new(64, 0);
        let mut exact = Vec::new();
        // 10 000 samples, 100 ms apart, memory changing in steps and used wobbling.
        for i in 0..10_000u64 {
            let nodes = 2 + (i / 1500) as u32 % 4;
            let x = s(
                i * 100,
                nodes,
                u64::from(nodes) * GIB,
                (i * 7919 % 1000) * (GIB / 1000),
            );
            h.record(x);
            exact.push(x);
            assert!(h.samples().len() <= 64 + 2, "{} samples", h.samples().len());
        }
        let kept = h.samples();
        assert_eq!(kept.first().unwrap().t_ms, 0);
        assert_eq!(kept.last().unwrap().t_ms, 999_900);
        assert!(kept.windows(2).all(|w| w[0].t_ms < w[1].t_ms));
        assert_eq!(kept.iter().map(|x| x.nodes).max(), Some(5));
        assert!(h.resolution_ms() >= 10_000, "{}", h.resolution_ms());
        let (a, b) = (usage_stats(&exact), usage_stats(&kept));
        let close = |x: f64, y: f64| (x - y).abs() <= 1e-6 * x.abs().max(1.0);
        assert_eq!(a.duration_s, b.duration_s);
        assert!(
            close(a.allocated_byte_seconds, b.allocated_byte_seconds),
            "{a:?} {b:?}"
        );
        assert!(
            close(a.used_byte_seconds, b.used_byte_seconds),
            "{a:?} {b:?}"
        );
        // Waste is integrated after averaging, and used never exceeds allocated here.
        assert!(
            close(a.waste_byte_seconds, b.waste_byte_seconds),
            "{a:?} {b:?}"
        );
    }

    #[test]
    fn serializes_its_samples() {
        let mut h = History::default();
        h.record(s(0, 1, 10, 5));
        h.record(s(3000, 2, 20, 5));
        let v = serde_json::to_value(&h).unwrap();
        assert_eq!(v["resolution_ms"], 1000);
        assert_eq!(v["samples"][1]["nodes"], 2);
        let back: Vec<Sample> = serde_json::from_value(v["samples"].clone()).unwrap();
        assert_eq!(back, h.samples());
    }
}
