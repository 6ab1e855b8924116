//! The coordinators' ranges: the output order cut into one range per coordinator, about
//! equal in bytes, at records the writers sampled. Every writer computes the same cuts from
//! the same markers; each coordinator then finds exactly where its range begins and ends in
//! every run ([`crate::order::locate`]), and so its offset in the output, before it merges.

use crate::marker::Marker;
use crate::order::{Bound, Cut, RunId};

/// One sampled record and the stretch of its run it stands for, up to the next sample.
struct Weighed<'a> {
    key: &'a [u8],
    run: RunId,
    pos: u64,
    bytes: u64,
    records: u64,
}

/// `ranges + 1` bounds, from `Start` to `End`: range `i` is `[bounds[i], bounds[i + 1])`.
/// With `top`, the bytes are shared as the first `top` records appear to spread (the
/// ranges after the `top`-th record write nothing).
#[must_use]
pub fn cuts(markers: &[Marker], ranges: usize, top: Option<u64>) -> Vec<Bound> {
    let mut items = Vec::new();
    for m in markers {
        for r in &m.runs {
            let run = RunId {
                rank: m.rank,
                run: r.run,
            };
            for (i, s) in r.samples.iter().enumerate() {
                let (next_pos, next_bytes) = r
                    .samples
                    .get(i + 1)
                    .map_or((r.records, r.bytes), |n| (n.pos, n.bytes));
                items.push(Weighed {
                    key: &s.key,
                    run,
                    pos: s.pos,
                    bytes: next_bytes.saturating_sub(s.bytes),
                    records: next_pos.saturating_sub(s.pos),
                });
            }
        }
    }
    items.sort_by(|a, b| (a.key, a.run, a.pos).cmp(&(b.key, b.run, b.pos)));
    let mut total: u64 = items.iter().map(|w| w.bytes).sum();
    if let Some(k) = top {
        let (mut records, mut bytes) = (0u64, 0u64);
        for w in &items {
            records += w.records;
            bytes += w.bytes;
            if records >= k {
                total = bytes;
                break;
            }
        }
    }
    let ranges = ranges.max(1);
    let mut bounds = vec![Bound::Start];
    let mut next = 0;
    let mut before = 0u64;
    for i in 1..ranges {
        let target = (u128::from(total) * i as u128 / ranges as u128) as u64;
        while next < items.len() && before < target {
            before += items[next].bytes;
            next += 1;
        }
        bounds.push(match items.get(next) {
            Some(w) => Bound::At(Cut {
                key: w.key.to_vec(),
                run: w.run,
                pos: w.pos,
            }),
            None => Bound::End,
        });
    }
    bounds.push(Bound::End);
    bounds
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marker::{Agreed, RunSummary};
    use crate::merge::{Merge, Step};
    use crate::order::{locate, scan, Located};
    use crate::run::{Pos, RunEncoder, RunIndex};
    use crate::Strategy;
    use proptest::prelude::*;

    /// A run: its entries' bytes (without the index) and its index.
    struct Run {
        id: RunId,
        data: Vec<u8>,
        index: RunIndex,
        entries: Vec<(Vec<u8>, Vec<u8>)>,
    }

    fn make_runs(writers: &[Vec<Vec<(u8, u16)>>]) -> Vec<Run> {
        let mut out = Vec::new();
        for (rank, runs) in writers.iter().enumerate() {
            for (n, recs) in runs.iter().enumerate() {
                let mut entries: Vec<(Vec<u8>, Vec<u8>)> = recs
                    .iter()
                    .enumerate()
                    .map(|(i, &(k, len))| {
                        let rec = format!("{rank}.{n}.{i}.").into_bytes();
                        let mut rec = rec.repeat(usize::from(len) / rec.len() + 1);
                        rec.truncate(usize::from(len));
                        (vec![k], rec)
                    })
                    .collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0)); // stable: arrival order kept
                let mut enc = RunEncoder::new();
                let mut data = Vec::new();
                for (k, r) in &entries {
                    enc.push(&mut data, k, r);
                }
                let mut tail = Vec::new();
                let index = enc.finish(&mut tail);
                out.push(Run {
                    id: RunId {
                        rank: rank as u32,
                        run: n as u32,
                    },
                    data,
                    index,
                    entries,
                });
            }
        }
        out
    }

    fn markers(runs: &[Run], writers: usize) -> Vec<Marker> {
        (0..writers as u32)
            .map(|rank| Marker {
                rank,
                agreed: Agreed {
                    writers: writers as u32,
                    sorted: true,
                    order: crate::Order::Rank,
                    top: None,
                    fixed: None,
                    strategy: Strategy::Least,
                    coordinators_per_node: 1,
                },
                host: "h".into(),
                pid: 0,
                load: 0.0,
                records: 0,
                bytes: 0,
                runs: runs
                    .iter()
                    .filter(|r| r.id.rank == rank)
                    .map(|r| RunSummary::of(r.id.run, &r.index))
                    .collect(),
                parts: Vec::new(),
            })
            .collect()
    }

    fn find(run: &Run, bound: &Bound) -> Pos {
        match locate(&run.index, run.id, bound) {
            Located::Exact(p) => p,
            Located::Within { from, to } => {
                let Bound::At(cut) = bound else {
                    unreachable!()
                };
                scan(
                    &run.data[from.offset as usize..to as usize],
                    from,
                    run.id,
                    cut,
                )
                .unwrap()
            }
        }
    }

    /// Merges range `[lo, hi)` of every run, blocks of `block` bytes fed as asked.
    fn merge_range(
        runs: &[Run],
        lo: &Bound,
        hi: &Bound,
        block: usize,
        limit: Option<u64>,
    ) -> (Vec<u8>, u64, u64) {
        let spans: Vec<(Pos, Pos)> = runs.iter().map(|r| (find(r, lo), find(r, hi))).collect();
        let offset = spans.iter().map(|(a, _)| a.bytes).sum::<u64>();
        let before = spans.iter().map(|(a, _)| a.records).sum::<u64>();
        let counts = spans.iter().map(|(a, b)| b.records - a.records).collect();
        let mut fed: Vec<u64> = spans.iter().map(|(a, _)| a.offset).collect();
        let limit = limit.map(|k| k.saturating_sub(before));
        let mut m = Merge::new(counts, limit);
        let mut out = Vec::new();
        loop {
            match m.step().unwrap() {
                Step::Need(j) => {
                    let end = spans[j].1.offset;
                    let to = (fed[j] + block as u64).min(end);
                    assert!(to > fed[j], "asked for more than the range holds");
                    m.feed(j, &runs[j].data[fed[j] as usize..to as usize]);
                    fed[j] = to;
                }
                Step::Record { record, .. } => out.extend_from_slice(record),
                Step::Done => break,
            }
        }
        (out, offset, before)
    }

    proptest! {
        /// Cut into any number of ranges, each merged on its own at the offset its start
        /// gives, the runs make exactly the reference sort; with a limit, its prefix.
        #[test]
        fn ranges_merged_apart_make_the_reference_sort(
            writers in prop::collection::vec(
                prop::collection::vec(prop::collection::vec((0u8..6, 0u16..3000), 0..120), 0..4),
                1..5,
            ),
            ranges in 1usize..6,
            block in 1usize..70_000,
            top in prop::option::of(0u64..400),
        ) {
            let runs = make_runs(&writers);
            let ms = markers(&runs, writers.len());
            // Reference: every record, stably sorted by key (runs in (rank, run) order).
            let mut all: Vec<(Vec<u8>, Vec<u8>)> = runs.iter().flat_map(|r| r.entries.clone()).collect();
            all.sort_by(|a, b| a.0.cmp(&b.0));
            let keep = top.map_or(all.len(), |k| all.len().min(k as usize));
            let expect: Vec<u8> = all[..keep].iter().flat_map(|(_, r)| r.clone()).collect();

            let bounds = cuts(&ms, ranges, top);
            prop_assert_eq!(bounds.len(), ranges + 1);
            let mut output = vec![0xAAu8; expect.len()];
            let mut written = 0;
            for w in bounds.windows(2) {
                let (part, offset, before) = merge_range(&runs, &w[0], &w[1], block, top);
                if top.is_some_and(|k| before >= k) {
                    prop_assert!(part.is_empty());
                    continue;
                }
                let at = offset as usize;
                prop_assert!(at + part.len() <= output.len());
                output[at..at + part.len()].copy_from_slice(&part);
                written += part.len();
            }
            prop_assert_eq!(written, expect.len(), "ranges overlap or leave gaps");
            prop_assert_eq!(output, expect);
        }
    }

    #[test]
    fn ranges_share_the_bytes_about_equally() {
        // 4 writers, 1 run each, 20,000 records of 100 bytes with keys spread evenly.
        let writers: Vec<Vec<Vec<(u8, u16)>>> = (0..4)
            .map(|w| {
                vec![(0..20_000)
                    .map(|i| (((i * 7 + w) % 251) as u8, 100))
                    .collect()]
            })
            .collect();
        let runs = make_runs(&writers);
        let bounds = cuts(&markers(&runs, 4), 4, None);
        let sizes: Vec<u64> = bounds
            .windows(2)
            .map(|w| {
                runs.iter()
                    .map(|r| find(r, &w[1]).bytes - find(r, &w[0]).bytes)
                    .sum()
            })
            .collect();
        let total: u64 = sizes.iter().sum();
        assert_eq!(total, 4 * 20_000 * 100);
        for s in sizes {
            assert!(
                s > total / 4 * 8 / 10 && s < total / 4 * 12 / 10,
                "{s} of {total}"
            );
        }
    }

    #[test]
    fn no_records_make_empty_ranges() {
        assert_eq!(
            cuts(&[], 3, None),
            [Bound::Start, Bound::End, Bound::End, Bound::End]
        );
    }
}
