//! The timeline the report draws: one of every 2^k requests, and bytes per process per column
//! of a width that doubles as the trace goes on.

use super::Limits;
use crate::model::*;
use std::collections::BTreeMap;
use tessera_trace::Record;

/// The timeline: sampled requests and bytes per process per column.
pub(super) struct Sampler {
    pub(super) every: u64,
    pub(super) seen: u64,
    pub(super) points: Vec<Point>,
    pub(super) bin_ns: u64,
    pub(super) heat: BTreeMap<u32, Vec<u64>>,
}

impl Sampler {
    pub(super) fn take(&mut self, r: &Record, file: u32, op: DataOp, bytes: u64, l: &Limits) {
        let t = r.start_ns;
        if self.seen.is_multiple_of(self.every) {
            if self.points.len() >= l.points {
                let mut i = 0;
                self.points.retain(|_| {
                    i += 1;
                    i % 2 == 1
                });
                self.every *= 2;
            }
            if self.seen.is_multiple_of(self.every) {
                self.points.push(Point {
                    start_ns: t,
                    pid: r.pid,
                    file,
                    op,
                    offset: r.offset,
                    size: r.size,
                });
            }
        }
        self.seen += 1;
        let mut bin = t / self.bin_ns;
        while bin >= l.heat_bins as u64 {
            self.bin_ns *= 2;
            for row in self.heat.values_mut() {
                let merged: Vec<u64> = row.chunks(2).map(|c| c.iter().sum()).collect();
                *row = merged;
            }
            bin = t / self.bin_ns;
        }
        let row = self.heat.entry(r.pid).or_default();
        let bin = bin as usize;
        if row.len() <= bin {
            row.resize(bin + 1, 0);
        }
        row[bin] += bytes;
    }
}
