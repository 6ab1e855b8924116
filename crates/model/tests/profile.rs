//! The profiler on made-up traces whose model is known in advance: one file per process
//! written sequentially, one shared file strided by process, random reads, a read phase then a
//! write phase, a file read again and again, a create-stat-unlink burst; and on long random
//! streams: the counts are exact, records out of order change nothing, memory stays bounded.

use proptest::prelude::*;
use std::sync::Arc;
use tessera_model::*;
use tessera_trace::{Mode, Op, Record};

const MS: u64 = 1_000_000;

fn rec(op: Op, pid: u32, ino: u64, path: &str, offset: u64, size: u64, start: u64) -> Record {
    Record {
        op,
        mode: Mode::Library,
        via_handle: false,
        pid,
        uid: 0,
        exe: Some(Arc::from(format!("p{pid}"))),
        ino,
        path: Some(Arc::from(path)),
        target: None,
        offset,
        size,
        server_size: None,
        flags: 0,
        start_ns: start,
        end_ns: start + 100_000,
        result: if matches!(op, Op::Read | Op::Write) {
            size as i64
        } else {
            0
        },
    }
}

fn source() -> Source {
    Source {
        trace: "test".into(),
        traced_by: "test".into(),
        mode: "library".into(),
        start_unix_ns: 0,
        records: 0,
        dropped: 0,
    }
}

fn profile(records: &[Record]) -> Model {
    let mut p = Profiler::new(Limits::default());
    for r in records {
        p.push(r);
    }
    p.finish(source())
}

#[test]
fn one_file_per_process_written_sequentially() {
    let mut t = Vec::new();
    for pid in 1..=4u32 {
        let path = format!("out/p{pid}");
        t.push(rec(Op::Create, pid, 100 + u64::from(pid), &path, 0, 0, 0));
        for k in 0..16 {
            let at = (k * 4 + u64::from(pid)) * MS;
            t.push(rec(
                Op::Write,
                pid,
                100 + u64::from(pid),
                &path,
                k << 16,
                1 << 16,
                at,
            ));
        }
    }
    let m = profile(&t);
    assert_eq!(m.application.processes, 4);
    assert_eq!(m.application.files, 4);
    assert_eq!(m.application.bytes_written, (4 * 16) << 16);
    assert_eq!(m.application.metadata.creates, 4);
    assert_eq!(m.phases.len(), 4, "{:#?}", m.phases);
    for f in &m.files {
        assert_eq!(
            (
                f.sharing,
                f.direction,
                f.access,
                f.phases,
                f.size,
                f.created
            ),
            (
                Sharing::PerProcess,
                Direction::Write,
                AccessMode::Sequential,
                1,
                16 << 16,
                true
            )
        );
    }
    for p in &m.phases {
        assert_eq!(
            (p.op, p.access, p.ops, p.request_size),
            (DataOp::Write, AccessMode::Sequential, 16, 1 << 16)
        );
        assert_eq!(
            (p.displacement, p.repetitions, p.processes.len()),
            (Some(1 << 16), 1, 1)
        );
        assert_eq!(p.processes[0].initial_offset, 0);
        assert_eq!(p.distance_ns, 4 * MS);
        // Each 0.1 ms request 4 ms after the one before: 3.9 ms outside I/O, 15 times; before
        // the first, the time since the create ended.
        let pid = u64::from(p.processes[0].pid);
        assert_eq!(
            p.think,
            [ThinkBin {
                count: 15,
                mean_ns: 3_900_000
            }]
        );
        assert_eq!(p.lead_ns, pid * MS - 100_000);
    }
}

#[test]
fn think_time_keeps_its_spread_and_total() {
    // One writer computing 1 ms, 1 ms, 20 ms between its requests, over and over; a second
    // process's requests in between are not the first one's compute.
    let mut t = Vec::new();
    let mut at = 0;
    for k in 0..30u64 {
        t.push(rec(Op::Write, 1, 7, "f", k << 12, 1 << 12, at));
        t.push(rec(Op::Read, 2, 8, "g", k << 12, 1 << 12, at + 200_000));
        at += 100_000 + if k % 3 == 2 { 20 * MS } else { MS };
    }
    let m = profile(&t);
    let p = (m.phases.iter())
        .find(|p| p.op == DataOp::Write)
        .expect("the write phase");
    assert_eq!(p.ops, 30);
    assert_eq!(
        p.think,
        [
            ThinkBin {
                count: 20,
                mean_ns: MS
            },
            ThinkBin {
                count: 9,
                mean_ns: 20 * MS
            }
        ]
    );
    assert_eq!(p.lead_ns, 0);
}

#[test]
fn one_shared_file_strided_by_process_is_one_phase_of_four() {
    let mut t = Vec::new();
    for k in 0..8u64 {
        for rank in 0..4u64 {
            let offset = (k * 4 + rank) * 4096;
            t.push(rec(
                Op::Write,
                rank as u32 + 1,
                7,
                "shared",
                offset,
                4096,
                (k * 4 + rank) * MS,
            ));
        }
    }
    let m = profile(&t);
    assert_eq!(m.phases.len(), 1, "{:#?}", m.phases);
    let p = &m.phases[0];
    assert_eq!(
        (p.access, p.displacement, p.ops, p.weight),
        (AccessMode::Strided, Some(16384), 32, 32 * 4096)
    );
    let starts: Vec<u64> = p.processes.iter().map(|w| w.initial_offset).collect();
    assert_eq!(starts, [0, 4096, 8192, 12288]);
    assert!(p.processes.iter().all(|w| w.ops == 8));
    let f = &m.files[0];
    assert_eq!(
        (f.sharing, f.processes, f.access),
        (Sharing::Shared, 4, AccessMode::Strided)
    );
}

/// A xorshift stream, for offsets with no pattern.
fn noise(seed: u64) -> impl Iterator<Item = u64> {
    let mut x = seed | 1;
    std::iter::repeat_with(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    })
}

#[test]
fn random_reads_are_one_random_phase() {
    let t: Vec<Record> = noise(3)
        .take(200)
        .enumerate()
        .map(|(i, x)| rec(Op::Read, 9, 5, "db", (x % 1024) * 4096, 4096, i as u64 * MS))
        .collect();
    let m = profile(&t);
    assert_eq!(m.phases.len(), 1, "{:#?}", m.phases);
    let p = &m.phases[0];
    assert_eq!(
        (p.access, p.ops, p.displacement),
        (AccessMode::Random, 200, None)
    );
    assert_eq!(
        p.sizes,
        [SizeCount {
            size: 4096,
            count: 200
        }]
    );
    assert!(p.offset_max <= 1024 * 4096);
    assert_eq!(m.files[0].access, AccessMode::Random);
    assert!(!m.files[0].created, "read, never created: an input");
}

#[test]
fn a_read_phase_then_a_write_phase_in_order() {
    let mut t = Vec::new();
    for k in 0..10u64 {
        t.push(rec(Op::Read, 1, 1, "in", k << 20, 1 << 20, k * MS));
    }
    // The last write is short: the request sizes say so exactly.
    for k in 0..10u64 {
        let size = if k == 9 { 1000 } else { 1 << 20 };
        t.push(rec(Op::Write, 1, 2, "out", k << 20, size, (20 + k) * MS));
    }
    let m = profile(&t);
    let shape: Vec<_> = m
        .phases
        .iter()
        .map(|p| (p.file, p.op, p.access, p.ops))
        .collect();
    assert_eq!(
        shape,
        [
            (0, DataOp::Read, AccessMode::Sequential, 10),
            (1, DataOp::Write, AccessMode::Sequential, 10)
        ]
    );
    assert_eq!(
        m.phases[1].sizes,
        [
            SizeCount {
                size: 1 << 20,
                count: 9
            },
            SizeCount {
                size: 1000,
                count: 1
            }
        ]
    );
    assert_eq!(m.files[1].size, (9 << 20) + 1000);
}

#[test]
fn a_file_read_three_times_is_one_phase_of_three_repetitions() {
    let mut t = Vec::new();
    for rep in 0..3u64 {
        for k in 0..10u64 {
            t.push(rec(
                Op::Read,
                1,
                1,
                "ref",
                k << 16,
                1 << 16,
                (rep * 20 + k) * MS,
            ));
        }
    }
    let m = profile(&t);
    assert_eq!(m.phases.len(), 1, "{:#?}", m.phases);
    let p = &m.phases[0];
    assert_eq!((p.repetitions, p.ops, p.weight), (3, 30, 30 << 16));
    assert_eq!(
        p.sizes,
        [SizeCount {
            size: 1 << 16,
            count: 30
        }]
    );
}

#[test]
fn a_create_stat_unlink_burst_is_three_metadata_phases() {
    let mut t = Vec::new();
    let mut at = 0;
    for op in [Op::Create, Op::Getattr, Op::Unlink] {
        for i in 0..100u64 {
            for pid in [1, 2] {
                at += MS / 10;
                t.push(rec(
                    op,
                    pid,
                    1000 + i * 2 + u64::from(pid),
                    &format!("burst/f{i}.{pid}"),
                    0,
                    0,
                    at,
                ));
            }
        }
    }
    let m = profile(&t);
    let kinds: Vec<_> = m
        .meta_phases
        .iter()
        .map(|p| (p.kind, p.ops, p.processes.len(), p.dir.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            (MetaKind::Create, 200, 2, "burst"),
            (MetaKind::Stat, 200, 2, "burst"),
            (MetaKind::Unlink, 200, 2, "burst")
        ]
    );
    let md = &m.application.metadata;
    assert_eq!((md.creates, md.stats, md.unlinks), (200, 200, 200));
    assert!(m.phases.is_empty());
}

#[test]
fn a_listing_is_one_operation_however_many_pages_it_takes() {
    // Twenty directories read to the end: each a first page (offset 0), then pages from the
    // cookie the one before ended at, then the empty page that ends it.
    let mut t = Vec::new();
    let mut at = 0;
    for d in 0..20u64 {
        for (k, cookie) in [0, 40, 80, 95].into_iter().enumerate() {
            at += MS / 10;
            let r = rec(Op::Readdir, 1, 10 + d, &format!("tree/d{d}"), cookie, 0, at);
            assert_eq!(k == 0, r.offset == 0);
            t.push(r);
        }
    }
    let m = profile(&t);
    assert_eq!(m.application.metadata.listings, 20);
    let phases: Vec<_> = (m.meta_phases.iter())
        .map(|p| (p.kind, p.ops, p.dir.as_str()))
        .collect();
    assert_eq!(phases, [(MetaKind::List, 20, "tree")]);
    // Every page's time counts.
    let page = t[0].duration_ns();
    assert_eq!(m.meta_phases[0].io_time_ns, 80 * page);
}

#[test]
fn the_model_round_trips_through_json_and_other_schemas_are_refused() {
    let m = profile(&[rec(Op::Write, 1, 1, "a", 0, 10, 0)]);
    let text = m.to_json();
    assert_eq!(Model::from_json(&text).unwrap(), m);
    let other = text.replacen(SCHEMA, "tessera.model/99", 1);
    assert!(matches!(
        Model::from_json(&other),
        Err(Error::Schema { .. })
    ));
    assert!(Model::from_json("{}").is_err());
}

#[test]
fn findings_point_at_what_they_concern() {
    let mut t = Vec::new();
    // Eight writers of one file, small strided requests, randomly interleaved: N-to-1, small.
    for (i, x) in noise(5).take(800).enumerate() {
        let pid = (x % 8) as u32 + 1;
        t.push(rec(
            Op::Write,
            pid,
            3,
            "all.sam",
            (x >> 8) % (1 << 20) * 512,
            512,
            i as u64 * MS,
        ));
    }
    let m = profile(&t);
    let kinds: Vec<FindingKind> = m.findings.iter().map(|f| f.kind).collect();
    assert!(kinds.contains(&FindingKind::SmallRequests), "{kinds:?}");
    assert!(
        kinds.contains(&FindingKind::RandomOnSharedFile),
        "{kinds:?}"
    );
    let many = m
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::ManyWritersOneFile)
        .expect("N-to-1");
    assert_eq!(many.files, [0]);
    assert!(
        many.text.contains("all.sam") && many.text.starts_with("8 processes"),
        "{}",
        many.text
    );
}

#[test]
fn a_long_stream_stays_bounded() {
    let limits = Limits {
        points: 1000,
        heat_bins: 50,
        runs_per_file: 20,
        ..Limits::default()
    };
    let mut p = Profiler::new(limits);
    let mut n = 0u64;
    let (mut read, mut written) = (0, 0);
    for (i, x) in noise(11).take(300_000).enumerate() {
        // Short sequential bursts at random places: many runs.
        let (pid, file) = ((x % 5) as u32, (x >> 3) % 3);
        let op = if x & 64 == 0 { Op::Read } else { Op::Write };
        let base = (x >> 20) % 4096 * 65536;
        for k in 0..3 {
            let r = rec(
                op,
                pid,
                file + 1,
                "f",
                base + k * 4096,
                4096,
                i as u64 * 10 * MS + k,
            );
            match op {
                Op::Read => read += 4096,
                _ => written += 4096,
            }
            p.push(&r);
            n += 1;
        }
    }
    let m = p.finish(source());
    assert_eq!(m.source.records, n);
    assert_eq!(
        (m.application.bytes_read, m.application.bytes_written),
        (read, written)
    );
    assert_eq!(
        m.phases.iter().map(|p| p.ops).sum::<u64>(),
        n,
        "every request in a phase"
    );
    assert!(m.timeline.points.len() <= 1000);
    assert!(m.timeline.heat.iter().all(|h| h.bytes.len() <= 50));
    assert!(
        m.files.iter().all(|f| f.phases <= 20 * 2),
        "{:?}",
        m.files.iter().map(|f| f.phases).collect::<Vec<_>>()
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the requests and their order of arrival (within the reorder window), every
    /// request and byte is in exactly one phase, and the size histograms add up.
    #[test]
    fn every_request_is_counted_once(
        reqs in prop::collection::vec((0u32..4, 0u64..3, any::<bool>(), 0u64..64, 1u64..5), 1..400),
        swap in prop::collection::vec((0usize..400, 0usize..8), 0..50),
    ) {
        let mut t: Vec<Record> = reqs
            .iter()
            .enumerate()
            .map(|(i, &(pid, file, read, block, blocks))| {
                let op = if read { Op::Read } else { Op::Write };
                rec(op, pid, file + 1, "f", block * 4096, blocks * 4096, i as u64 * MS)
            })
            .collect();
        for (at, by) in swap {
            let (a, b) = (at % t.len(), (at + by) % t.len());
            t.swap(a, b);
        }
        let m = profile(&t);
        let ops: u64 = m.phases.iter().map(|p| p.ops).sum();
        let weight: u64 = m.phases.iter().map(|p| p.weight).sum();
        prop_assert_eq!(ops, reqs.len() as u64);
        prop_assert_eq!(weight, m.application.bytes_read + m.application.bytes_written);
        for p in &m.phases {
            prop_assert_eq!(p.sizes.iter().map(|s| s.count).sum::<u64>(), p.ops);
            prop_assert_eq!(p.processes.iter().map(|w| w.ops).sum::<u64>() * u64::from(p.repetitions), p.ops);
        }
        let mut sorted = t.clone();
        sorted.sort_by_key(|r| r.start_ns);
        prop_assert_eq!(profile(&sorted).phases, m.phases, "arrival order changes nothing");
    }
}
