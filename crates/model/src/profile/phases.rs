//! From the runs kept per file to phases: runs of one shape on a file at the same time, one
//! per process, joined; and the file models.

use super::run::{by_count, count_size, Run, Think};
use super::FileState;
use crate::model::*;
use std::cmp::Reverse;
use std::collections::HashMap;

/// The phases (runs of one shape on a file at the same time, one per process, joined) and the
/// file models.
pub(super) fn phases_and_files(states: Vec<FileState>) -> (Vec<Phase>, Vec<FileModel>) {
    let mut phases = Vec::new();
    let mut files = Vec::new();
    for (id, mut f) in states.into_iter().enumerate() {
        let id = id as u32;
        f.runs.sort_by_key(|r| (r.start_ns, r.pid));
        let mut groups: Vec<Vec<Run>> = Vec::new();
        for run in f.runs {
            let joins = groups.iter_mut().rev().find(|g| {
                let head = &g[0];
                let end = g.iter().map(|r| r.end_ns).max().unwrap_or(0);
                head.shape() == run.shape()
                    && run.start_ns <= end
                    && g.iter().all(|r| r.pid != run.pid)
            });
            match joins {
                Some(g) => g.push(run),
                None => groups.push(vec![run]),
            }
        }
        let mut modes: HashMap<AccessMode, u64> = HashMap::new();
        let nphases = groups.len() as u32;
        for g in groups {
            *modes.entry(g[0].access).or_default() += g.iter().map(|r| r.bytes).sum::<u64>();
            phases.push(phase(id, g));
        }
        let mut who = f.readers.clone();
        who.extend(f.writers.iter().filter(|p| !f.readers.contains(p)));
        let access = (modes.into_iter())
            .max_by_key(|(m, bytes)| (*bytes, Reverse(*m as u8)))
            .map_or(AccessMode::Sequential, |(m, _)| m);
        files.push(FileModel {
            id,
            path: f
                .path
                .map_or_else(|| format!("inode {}", f.ino), |p| p.to_string()),
            size: f.size,
            created: f.created,
            processes: who.len() as u32,
            sharing: if who.len() > 1 {
                Sharing::Shared
            } else {
                Sharing::PerProcess
            },
            direction: match (f.reads > 0, f.writes > 0) {
                (false, false) => Direction::None,
                (true, false) => Direction::Read,
                (false, true) => Direction::Write,
                (true, true) => Direction::ReadWrite,
            },
            access,
            phases: nphases,
            bytes_read: f.bytes_read,
            bytes_written: f.bytes_written,
            reads: f.reads,
            writes: f.writes,
            io_time_ns: f.io_time_ns,
            first_ns: if f.first_ns == u64::MAX {
                0
            } else {
                f.first_ns
            },
            last_ns: f.last_ns,
        });
    }
    phases.sort_by_key(|p: &Phase| (p.start_ns, p.file, p.op));
    for (i, p) in phases.iter_mut().enumerate() {
        p.id = i as u32;
    }
    (phases, files)
}

/// The phase of a group of runs (one per process, same shape).
pub(super) fn phase(file: u32, mut runs: Vec<Run>) -> Phase {
    runs.sort_by_key(|r| (r.first_offset, r.pid));
    let head = runs[0].clone();
    let mut sizes: Vec<SizeCount> = Vec::new();
    for r in &runs {
        for s in &r.sizes {
            count_size(
                &mut sizes,
                s.size,
                s.count * u64::from(r.repetitions),
                usize::MAX,
            );
        }
    }
    by_count(&mut sizes);
    let mut distances: Vec<u64> = runs.iter().map(Run::median_distance).collect();
    distances.sort_unstable();
    let mut think = Think::default();
    for r in &runs {
        think.merge(&r.think);
    }
    let leads: u64 = runs.iter().map(|r| r.lead_ns).fold(0, u64::saturating_add);
    Phase {
        id: 0,
        file,
        op: head.op,
        access: head.access,
        processes: (runs.iter())
            .map(|r| PhaseProcess {
                pid: r.pid,
                initial_offset: r.first_offset,
                ops: r.ops,
                start_ns: r.start_ns,
            })
            .collect(),
        weight: runs.iter().map(|r| r.bytes).sum(),
        repetitions: head.repetitions,
        ops: runs.iter().map(|r| r.ops * u64::from(r.repetitions)).sum(),
        request_size: sizes.first().map_or(0, |s| s.size),
        sizes,
        displacement: if head.access == AccessMode::Random {
            None
        } else {
            head.displacement
        },
        distance_ns: distances[distances.len() / 2],
        think: think.bins(),
        lead_ns: leads / runs.len() as u64,
        offset_min: runs.iter().map(|r| r.offset_min).min().unwrap_or(0),
        offset_max: runs.iter().map(|r| r.offset_max).max().unwrap_or(0),
        start_ns: runs.iter().map(|r| r.start_ns).min().unwrap_or(0),
        end_ns: runs.iter().map(|r| r.end_ns).max().unwrap_or(0),
        io_time_ns: runs.iter().map(|r| r.io_time_ns).sum(),
    }
}
