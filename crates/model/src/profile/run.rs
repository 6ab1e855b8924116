//! A run: consecutive requests of one process on one file with one shape, and the size
//! histograms runs and phases keep.

use super::DISTANCES;
use crate::model::*;
use tessera_trace::Record;

/// Consecutive requests of one process on one file with one shape.
#[derive(Debug, Clone)]
pub(super) struct Run {
    pub(super) pid: u32,
    pub(super) op: DataOp,
    pub(super) access: AccessMode,
    pub(super) first_offset: u64,
    pub(super) last_offset: u64,
    pub(super) last_end: u64,
    /// Offset difference between consecutive requests, while it stays the same.
    pub(super) displacement: Option<i64>,
    /// Every request began where the one before ended.
    pub(super) contiguous: bool,
    pub(super) ops: u64,
    pub(super) bytes: u64,
    pub(super) sizes: Vec<SizeCount>,
    pub(super) offset_min: u64,
    pub(super) offset_max: u64,
    pub(super) start_ns: u64,
    pub(super) end_ns: u64,
    pub(super) last_start_ns: u64,
    pub(super) io_time_ns: u64,
    pub(super) distances: Vec<u64>,
    pub(super) repetitions: u32,
    /// The process's time outside I/O before each of its requests but the first.
    pub(super) think: Think,
    /// Its time outside I/O before the first.
    pub(super) lead_ns: u64,
}

/// Power-of-two bins of idle gaps (bin `b` holds `[2^b, 2^(b+1))` ns; the last, anything
/// longer): each a count and a sum, so that a replay keeps both the spread and the total.
const THINK_BINS: usize = 40;

#[derive(Debug, Clone)]
pub(super) struct Think([(u64, u64); THINK_BINS]);

impl Default for Think {
    fn default() -> Self {
        Think([(0, 0); THINK_BINS])
    }
}

impl Think {
    pub(super) fn add(&mut self, ns: u64) {
        let b = (ns.max(1).ilog2() as usize).min(THINK_BINS - 1);
        self.0[b].0 += 1;
        self.0[b].1 = self.0[b].1.saturating_add(ns);
    }

    pub(super) fn merge(&mut self, other: &Think) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            a.0 += b.0;
            a.1 = a.1.saturating_add(b.1);
        }
    }

    /// The bins that hold gaps, shortest first.
    pub(super) fn bins(&self) -> Vec<ThinkBin> {
        (self.0.iter())
            .filter(|(count, _)| *count > 0)
            .map(|&(count, sum)| ThinkBin {
                count,
                mean_ns: sum / count,
            })
            .collect()
    }
}

impl Run {
    /// A run from its first request, `idle` ns after the process's request before it ended.
    pub(super) fn new(r: &Record, op: DataOp, bytes: u64, idle: u64) -> Self {
        Run {
            pid: r.pid,
            op,
            access: AccessMode::Sequential,
            first_offset: r.offset,
            last_offset: r.offset,
            last_end: r.offset.saturating_add(r.size),
            displacement: None,
            contiguous: true,
            ops: 1,
            bytes,
            sizes: vec![SizeCount {
                size: r.size,
                count: 1,
            }],
            offset_min: r.offset,
            offset_max: r.offset.saturating_add(r.size),
            start_ns: r.start_ns,
            end_ns: r.end_ns,
            last_start_ns: r.start_ns,
            io_time_ns: r.duration_ns(),
            distances: Vec::new(),
            repetitions: 1,
            think: Think::default(),
            lead_ns: idle,
        }
    }

    /// Does the request at `r` keep this run's shape?
    pub(super) fn extends(&self, r: &Record) -> bool {
        if self.access == AccessMode::Random {
            return false;
        }
        let step = r.offset as i64 - self.last_offset as i64;
        if self.ops == 1 {
            return true;
        }
        (self.contiguous && r.offset == self.last_end) || self.displacement == Some(step)
    }

    pub(super) fn add(&mut self, r: &Record, bytes: u64, sizes: usize, idle: u64) {
        self.think.add(idle);
        let step = r.offset as i64 - self.last_offset as i64;
        if self.ops == 1 {
            self.displacement = Some(step);
            self.contiguous = r.offset == self.last_end;
        } else {
            self.contiguous &= r.offset == self.last_end;
            if self.displacement != Some(step) {
                self.displacement = None;
            }
        }
        if self.distances.len() < DISTANCES {
            self.distances
                .push(r.start_ns.saturating_sub(self.last_start_ns));
        }
        self.last_start_ns = r.start_ns;
        self.last_offset = r.offset;
        self.last_end = r.offset.saturating_add(r.size);
        self.ops += 1;
        self.bytes += bytes;
        count_size(&mut self.sizes, r.size, 1, sizes);
        self.offset_min = self.offset_min.min(r.offset);
        self.offset_max = self.offset_max.max(self.last_end);
        self.end_ns = self.end_ns.max(r.end_ns);
        self.io_time_ns += r.duration_ns();
    }

    /// Takes `other`'s requests in: the two are one random run now (of one repetition:
    /// the repetitions of either are counted out).
    pub(super) fn absorb(&mut self, other: &Run, sizes: usize) {
        self.access = AccessMode::Random;
        self.displacement = None;
        self.contiguous = false;
        let reps = u64::from(std::mem::replace(&mut self.repetitions, 1));
        self.ops = self.ops * reps + other.ops * u64::from(other.repetitions);
        for s in &mut self.sizes {
            s.count *= reps;
        }
        self.bytes += other.bytes;
        for s in &other.sizes {
            count_size(
                &mut self.sizes,
                s.size,
                s.count * u64::from(other.repetitions),
                sizes,
            );
        }
        if self.distances.len() < DISTANCES {
            self.distances
                .push(other.start_ns.saturating_sub(self.last_start_ns));
        }
        self.last_start_ns = other.last_start_ns;
        self.think.merge(&other.think);
        self.think.add(other.lead_ns);
        self.offset_min = self.offset_min.min(other.offset_min);
        self.offset_max = self.offset_max.max(other.offset_max);
        self.end_ns = self.end_ns.max(other.end_ns);
        self.io_time_ns += other.io_time_ns;
    }

    /// Is `next` this run again (same requests from the same place)?
    pub(super) fn repeated_by(&self, next: &Run) -> bool {
        self.access == next.access
            && self.access != AccessMode::Random
            && self.first_offset == next.first_offset
            && self.ops == next.ops
            && self.displacement == next.displacement
            && self.sizes == next.sizes
    }

    pub(super) fn repeat(&mut self, next: &Run) {
        self.repetitions += 1;
        self.bytes += next.bytes;
        self.end_ns = self.end_ns.max(next.end_ns);
        self.io_time_ns += next.io_time_ns;
        self.last_start_ns = next.last_start_ns;
        self.think.merge(&next.think);
        self.think.add(next.lead_ns);
    }

    /// The shape a phase of several processes shares: all but where each starts.
    pub(super) fn shape(&self) -> (DataOp, AccessMode, u64, Option<i64>, u32, &[SizeCount]) {
        (
            self.op,
            self.access,
            self.ops,
            self.displacement,
            self.repetitions,
            &self.sizes,
        )
    }

    pub(super) fn median_distance(&self) -> u64 {
        let mut d = self.distances.clone();
        d.sort_unstable();
        d.get(d.len() / 2).copied().unwrap_or(0)
    }
}

/// Adds `count` requests of `size` to a histogram of at most `max` sizes (in the order first
/// seen: [`by_count`] sorts it).
pub(super) fn count_size(sizes: &mut Vec<SizeCount>, size: u64, count: u64, max: usize) {
    let full = sizes.len() >= max;
    match sizes.iter_mut().find(|s| s.size == size) {
        Some(s) => s.count += count,
        None if !full => sizes.push(SizeCount { size, count }),
        None => {
            if let Some(last) = sizes.last_mut() {
                last.count += count;
            }
        }
    }
}

/// Most frequent size first.
pub(super) fn by_count(sizes: &mut [SizeCount]) {
    sizes.sort_by(|a, b| b.count.cmp(&a.count).then(a.size.cmp(&b.size)));
}
