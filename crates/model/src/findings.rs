//! What a model shows that a person should know, in plain words, each pointing at the files
//! and phases concerned: small requests, random access to a shared file, stretches bound by
//! metadata, many processes writing one file.

use crate::model::*;

/// Requests below this are small: each costs a round trip for little data.
const SMALL: u64 = 64 << 10;
/// Small requests matter once they are this share of a phase's requests and the phase has
/// this many.
const SMALL_SHARE: f64 = 0.5;
const SMALL_MIN_OPS: u64 = 64;
/// Metadata is the bottleneck once it takes this share of the time in I/O.
const METADATA_SHARE: f64 = 0.3;
/// Writers of one file from which it is "many" (N-to-1 output).
const MANY_WRITERS: usize = 4;
/// Files and phases named in a finding's text.
const NAMED: usize = 3;

/// The findings of `model`, most bytes or time concerned first within each kind.
pub fn findings(model: &Model) -> Vec<Finding> {
    let mut out = Vec::new();
    small_requests(model, &mut out);
    random_on_shared(model, &mut out);
    metadata_bound(model, &mut out);
    many_writers(model, &mut out);
    out
}

fn names(model: &Model, files: &[u32]) -> String {
    let mut named: Vec<String> = (files.iter().take(NAMED))
        .filter_map(|&f| model.file(f))
        .map(|f| f.path.clone())
        .collect();
    if files.len() > NAMED {
        named.push(format!("{} more", files.len() - NAMED));
    }
    named.join(", ")
}

fn dedup(mut v: Vec<u32>) -> Vec<u32> {
    let mut seen = std::collections::HashSet::new();
    v.retain(|x| seen.insert(*x));
    v
}

fn small_requests(model: &Model, out: &mut Vec<Finding>) {
    let mut phases: Vec<&Phase> = (model.phases.iter())
        .filter(|p| p.ops >= SMALL_MIN_OPS)
        .filter(|p| {
            let small: u64 = p
                .sizes
                .iter()
                .filter(|s| s.size < SMALL)
                .map(|s| s.count)
                .sum();
            small as f64 >= SMALL_SHARE * p.ops as f64
        })
        .collect();
    if phases.is_empty() {
        return;
    }
    phases.sort_by_key(|p| std::cmp::Reverse(p.ops));
    let ops: u64 = phases.iter().map(|p| p.ops).sum();
    let all = model.application.reads + model.application.writes;
    let files = dedup(phases.iter().map(|p| p.file).collect());
    out.push(Finding {
        kind: FindingKind::SmallRequests,
        text: format!(
            "{ops} of {all} requests are in phases of mostly small requests (under 64 KiB): \
             each costs a round trip for little data; larger buffers would move the same bytes \
             in fewer. Files: {}.",
            names(model, &files)
        ),
        files,
        phases: phases.iter().map(|p| p.id).collect(),
        meta_phases: Vec::new(),
    });
}

fn random_on_shared(model: &Model, out: &mut Vec<Finding>) {
    let shared = |f: u32| model.file(f).is_some_and(|f| f.sharing == Sharing::Shared);
    let mut phases: Vec<&Phase> = (model.phases.iter())
        .filter(|p| p.access == AccessMode::Random && shared(p.file))
        .collect();
    if phases.is_empty() {
        return;
    }
    phases.sort_by_key(|p| std::cmp::Reverse(p.weight));
    let files = dedup(phases.iter().map(|p| p.file).collect());
    out.push(Finding {
        kind: FindingKind::RandomOnSharedFile,
        text: format!(
            "Random access to files several processes share: {}. Their requests land on \
             every server in no order, and read-ahead cannot help.",
            names(model, &files)
        ),
        files,
        phases: phases.iter().map(|p| p.id).collect(),
        meta_phases: Vec::new(),
    });
}

fn metadata_bound(model: &Model, out: &mut Vec<Finding>) {
    let app = &model.application;
    if app.io_time_ns == 0 {
        return;
    }
    let share = app.metadata.time_ns as f64 / app.io_time_ns as f64;
    if share < METADATA_SHARE {
        return;
    }
    let mut bursts: Vec<&MetaPhase> = model.meta_phases.iter().collect();
    bursts.sort_by_key(|m| std::cmp::Reverse(m.io_time_ns));
    let worst: Vec<String> = (bursts.iter().take(NAMED))
        .map(|m| {
            let secs = (m.end_ns - m.start_ns) as f64 / 1e9;
            format!("{} {:?} in {} over {secs:.2} s", m.ops, m.kind, m.dir)
        })
        .collect();
    out.push(Finding {
        kind: FindingKind::MetadataBound,
        text: format!(
            "Metadata operations take {:.0} % of the time in I/O ({:.0} per second on average, \
             {} in the busiest second){}",
            share * 100.0,
            app.metadata.per_second,
            app.metadata.peak_per_second,
            if worst.is_empty() {
                ".".to_string()
            } else {
                format!("; the largest bursts: {}.", worst.join("; "))
            }
        ),
        files: Vec::new(),
        phases: Vec::new(),
        meta_phases: bursts.iter().map(|m| m.id).collect(),
    });
}

fn many_writers(model: &Model, out: &mut Vec<Finding>) {
    for f in &model.files {
        let mut writers: Vec<u32> = (model.phases.iter())
            .filter(|p| p.file == f.id && p.op == DataOp::Write)
            .flat_map(|p| p.processes.iter().map(|w| w.pid))
            .collect();
        writers.sort_unstable();
        writers.dedup();
        if writers.len() < MANY_WRITERS {
            continue;
        }
        let phases: Vec<u32> = (model.phases.iter())
            .filter(|p| p.file == f.id && p.op == DataOp::Write)
            .map(|p| p.id)
            .collect();
        out.push(Finding {
            kind: FindingKind::ManyWritersOneFile,
            text: format!(
                "{} processes write one file, {} ({} phases): N-to-1 output, where collective \
                 output (aggregating the writers' records into a few large writes) helps.",
                writers.len(),
                f.path,
                phases.len()
            ),
            files: vec![f.id],
            phases,
            meta_phases: Vec::new(),
        });
    }
}
