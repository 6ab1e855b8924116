//! Replays of the models of issue 32's test applications into a temporary directory, each
//! traced: the replay's own records hold exactly the model's requests (counts, sizes,
//! offsets, order), the model profiled from them has the original's shape, and bad
//! directories give errors, not panics.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tessera_model::{compare, synthetic, Limits, Model, Profiler, Source, ThinkBin};
use tessera_replay::{replay, Error, Options, PhaseKind, Report, Think};
use tessera_trace::{Item, Mode, Op, Reader, Record};

/// Replays `m` in a new directory, traced; the report, the trace's records by start, and the
/// directory.
fn run(m: &Model) -> (Report, Vec<Record>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a directory");
    let traces = tempfile::tempdir().expect("a trace directory");
    let opts = Options {
        trace: Some(traces.path().to_path_buf()),
        ..Options::default()
    };
    let report = replay(m, dir.path(), &opts).expect("the replay");
    let path = report.trace.clone().expect("a trace");
    assert!(path.starts_with(traces.path()));
    let mut reader = Reader::open(&path).expect("the replay's trace");
    assert_eq!(reader.header().mode, Mode::Library);
    assert!(reader.header().source.starts_with("replay "));
    let mut records = Vec::new();
    let mut ended = false;
    while let Some(item) = reader.next_item().expect("readable") {
        match item {
            Item::Record(r) => records.push(r),
            Item::Gap(g) => panic!("records lost: {g:?}"),
            Item::End { .. } => ended = true,
        }
    }
    assert!(ended, "the trace was finished");
    // The replay's model has the original's shape.
    let mut profiler = Profiler::new(Limits::default());
    for r in &records {
        profiler.push(r);
    }
    let source = Source {
        trace: "replay".into(),
        traced_by: "replay".into(),
        mode: "library".into(),
        start_unix_ns: 0,
        records: 0,
        dropped: 0,
    };
    let replayed = profiler.finish(source);
    let c = compare(m, &replayed);
    assert!(c.shape_matches(), "{}", c.text(true));
    records.sort_by_key(|r| r.start_ns);
    (report, records, dir)
}

fn of(records: &[Record], op: Op) -> Vec<&Record> {
    records.iter().filter(|r| r.op == op).collect()
}

/// Every record succeeded in full.
fn all_whole(records: &[Record]) {
    for r in records {
        let want = if r.op.is_data() { r.size as i64 } else { 0 };
        assert!(
            r.result >= want.min(0) && (!r.op.is_data() || r.result == want),
            "{r:?}"
        );
    }
}

#[test]
fn file_per_process_writes_each_file_sequentially() {
    let m = synthetic::file_per_process(3, 8, 4096);
    let (report, records, dir) = run(&m);
    all_whole(&records);
    let writes = of(&records, Op::Write);
    assert_eq!(writes.len(), 24);
    assert_eq!(records.len(), 24, "only the model's requests");
    for i in 0..3u32 {
        let mine: Vec<&&Record> = writes.iter().filter(|r| r.pid == 100 + i).collect();
        let offsets: Vec<u64> = mine.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, (0..8).map(|k| k * 4096).collect::<Vec<_>>());
        assert!(mine
            .iter()
            .all(|r| r.path.as_deref() == Some(&format!("/out.{i}")[..]) && r.size == 4096));
        assert_eq!(r_exe(mine[0]), Some("synthetic"));
        let len = std::fs::metadata(dir.path().join(format!("out.{i}"))).map(|m| m.len());
        assert_eq!(len.ok(), Some(8 * 4096));
    }
    assert_eq!(report.total.bytes, 24 * 4096);
    assert_eq!(report.total.ops, 24);
    assert_eq!(report.processes, 3);
    assert_eq!(report.phases.len(), 3);
    assert!(report.phases.iter().all(|p| p.measure.bytes == 8 * 4096));
}

fn r_exe(r: &Record) -> Option<&str> {
    r.exe.as_deref()
}

#[test]
fn a_shared_file_is_strided_by_process() {
    let m = synthetic::shared_strided(4, 5, 1000);
    let (report, records, dir) = run(&m);
    all_whole(&records);
    let writes = of(&records, Op::Write);
    assert_eq!(writes.len(), 20);
    for i in 0..4u64 {
        let mut offsets: Vec<u64> = writes
            .iter()
            .filter(|r| u64::from(r.pid) == 100 + i)
            .map(|r| r.offset)
            .collect();
        offsets.sort_unstable();
        assert_eq!(
            offsets,
            (0..5).map(|k| (k * 4 + i) * 1000).collect::<Vec<_>>()
        );
    }
    let len = std::fs::metadata(dir.path().join("shared")).map(|m| m.len());
    assert_eq!(len.ok(), Some(20_000));
    assert_eq!(report.phases[0].processes, 4);
}

#[test]
fn random_reads_of_a_file_that_was_there() {
    let m = synthetic::random_reads(300, 4096, 1 << 20);
    let (report, records, dir) = run(&m);
    all_whole(&records);
    assert_eq!(report.prepared_bytes, 1 << 20, "prepared untimed");
    let reads = of(&records, Op::Read);
    assert_eq!(reads.len(), 300);
    assert!(reads
        .iter()
        .all(|r| r.offset % 4096 == 0 && r.offset + r.size <= 1 << 20));
    let sequential = reads
        .windows(2)
        .filter(|w| w[1].offset == w[0].offset + 4096)
        .count();
    assert!(
        sequential < 30,
        "{sequential} of 300 followed the one before"
    );
    assert_eq!(report.total.bytes, 300 * 4096);
    // Prepared once: a second replay finds the file at its size and writes nothing.
    let again = replay(&m, dir.path(), &Options::default()).expect("a second replay");
    assert_eq!(again.prepared_bytes, 0);
    assert_eq!(again.trace, None);
    assert_eq!(again.total.bytes, 300 * 4096);
}

#[test]
fn a_write_phase_waits_for_the_read_phase_before_it() {
    let m = synthetic::read_then_write(16, 512);
    let (report, records, dir) = run(&m);
    all_whole(&records);
    let (reads, writes) = (of(&records, Op::Read), of(&records, Op::Write));
    assert_eq!((reads.len(), writes.len()), (16, 16));
    let last_read = reads.iter().map(|r| r.end_ns).max().unwrap_or(0);
    assert!(writes.iter().all(|w| w.start_ns >= last_read));
    assert!(reads.iter().all(|r| r.path.as_deref() == Some("/data/in")));
    assert!(writes
        .iter()
        .all(|r| r.path.as_deref() == Some("/data/out")));
    assert!(dir.path().join("data/out").is_file());
    let kinds: Vec<PhaseKind> = report.phases.iter().map(|p| p.kind).collect();
    assert_eq!(kinds, vec![PhaseKind::Data, PhaseKind::Data]);
    assert!(report.phases[0].what.starts_with("read /data/in"));
}

#[test]
fn a_create_stat_unlink_burst() {
    let m = synthetic::create_stat_unlink(4, 100);
    let (report, records, dir) = run(&m);
    all_whole(&records);
    let mut counts: BTreeMap<Op, usize> = BTreeMap::new();
    for r in &records {
        *counts.entry(r.op).or_default() += 1;
    }
    assert_eq!(
        counts,
        BTreeMap::from([(Op::Unlink, 100), (Op::Getattr, 100), (Op::Create, 100)])
    );
    let pids: std::collections::BTreeSet<u32> = records.iter().map(|r| r.pid).collect();
    assert_eq!(pids.len(), 4);
    // Each stat and unlink found a name the creates made.
    let created: std::collections::BTreeSet<_> = of(&records, Op::Create)
        .iter()
        .map(|r| r.path.clone())
        .collect();
    assert!(of(&records, Op::Unlink)
        .iter()
        .all(|r| created.contains(&r.path)
            && r.path.as_deref().is_some_and(|p| p.starts_with("/burst/"))));
    let last_create = of(&records, Op::Create).iter().map(|r| r.end_ns).max();
    assert!(of(&records, Op::Getattr)
        .iter()
        .all(|r| Some(r.start_ns) >= last_create));
    assert_eq!(report.total.errors, 0);
    assert_eq!(report.total.ops, 300);
    let left = std::fs::read_dir(dir.path().join("burst")).map(|d| d.count());
    assert_eq!(left.ok(), Some(0), "the burst left nothing");
}

#[test]
fn a_replay_reports_as_json() {
    let m = synthetic::file_per_process(1, 2, 10);
    let (report, _, _dir) = run(&m);
    let json = serde_json::to_string(&report).expect("JSON");
    assert!(json.contains("\"bytes_per_s\""), "{json}");
    let back: Report = serde_json::from_str(&json).expect("read back");
    // Rates read back to within a rounding.
    assert_eq!((back.total.bytes, back.total.ops), (20, 2));
    assert_eq!(back.phases.len(), report.phases.len());
    assert_eq!(back.trace, report.trace);
}

#[test]
fn think_time_keeps_the_time_between_requests() {
    // One process, 6 requests 20 ms apart: at least 100 ms from the first start to the last,
    // spent on a core or asleep.
    let mut m = synthetic::file_per_process(1, 6, 10);
    m.phases[0].distance_ns = 20_000_000;
    m.application.wall_ns = 200_000_000;
    for think in [Think::Burn, Think::Sleep] {
        let dir = tempfile::tempdir().expect("a directory");
        let opts = Options {
            think: Some(think),
            ..Options::default()
        };
        let report = replay(&m, dir.path(), &opts).expect("the replay");
        assert_eq!(report.think, Some(think));
        assert_eq!(report.total.ops, 6);
        assert!(
            report.total.wall_ns >= 100_000_000,
            "{think:?}: {} ns",
            report.total.wall_ns
        );
    }
    // A profiler's bins of think time are kept instead: 5 gaps of 20 ms whatever the
    // distance.
    m.phases[0].distance_ns = 0;
    m.phases[0].think = vec![ThinkBin {
        count: 5,
        mean_ns: 20_000_000,
    }];
    let dir = tempfile::tempdir().expect("a directory");
    let opts = Options {
        think: Some(Think::Burn),
        ..Options::default()
    };
    let report = replay(&m, dir.path(), &opts).expect("the replay");
    assert!(
        report.total.wall_ns >= 100_000_000,
        "{} ns",
        report.total.wall_ns
    );
    // A wait longer than the whole application is refused, not waited.
    for (distance, bin, lead) in [(u64::MAX, 0, 0), (0, u64::MAX, 0), (0, 0, u64::MAX)] {
        m.phases[0].distance_ns = distance;
        m.phases[0].think[0].mean_ns = bin;
        m.phases[0].lead_ns = lead;
        let dir = tempfile::tempdir().expect("a directory");
        let opts = Options {
            think: Some(Think::Sleep),
            ..Options::default()
        };
        let e = replay(&m, dir.path(), &opts).expect_err("a wait of 584 years");
        assert!(matches!(e, Error::Model(_)), "{e}");
    }
}

#[test]
fn bad_directories_are_errors() {
    let m = synthetic::file_per_process(1, 2, 10);
    let missing = PathBuf::from("/nonexistent/tessera-replay");
    let e = replay(&m, &missing, &Options::default()).expect_err("no directory");
    assert!(matches!(e, Error::Dir { .. }), "{e}");
    assert!(e.to_string().contains("/nonexistent/tessera-replay"));
    let file = tempfile::NamedTempFile::new().expect("a file");
    let e = replay(&m, file.path(), &Options::default()).expect_err("a file");
    assert!(matches!(e, Error::NotDir(_)), "{e}");
    let mut bad = m.clone();
    bad.files[0].path = "/../escape".into();
    let dir = tempfile::tempdir().expect("a directory");
    let e = replay(&bad, dir.path(), &Options::default()).expect_err("a path outside");
    assert!(matches!(e, Error::Path(_)), "{e}");
    assert!(!dir
        .path()
        .parent()
        .unwrap_or(Path::new("/"))
        .join("escape")
        .exists());
}

/// A full file system stops the replay with the file and the reason (needs root, to mount a
/// small tmpfs; skipped otherwise).
#[test]
fn a_full_disk_is_an_error() {
    let dir = tempfile::tempdir().expect("a directory");
    let c = |s: &Path| std::ffi::CString::new(s.as_os_str().as_encoded_bytes()).ok();
    let (Some(target), Some(fs), Some(opts)) = (
        c(dir.path()),
        std::ffi::CString::new("tmpfs").ok(),
        std::ffi::CString::new("size=1m").ok(),
    ) else {
        return;
    };
    // SAFETY: plain C strings that outlive the call.
    let mounted = unsafe {
        libc::mount(
            fs.as_ptr(),
            target.as_ptr(),
            fs.as_ptr(),
            0,
            opts.as_ptr().cast(),
        )
    };
    if mounted != 0 {
        eprintln!("skipped: cannot mount a tmpfs here (not root?)");
        return;
    }
    struct Unmount(std::ffi::CString);
    impl Drop for Unmount {
        fn drop(&mut self) {
            // SAFETY: a C string that outlives the call.
            unsafe { libc::umount(self.0.as_ptr()) };
        }
    }
    let _unmount = Unmount(target);
    let m = synthetic::file_per_process(1, 64, 64 << 10);
    let e = replay(&m, dir.path(), &Options::default()).expect_err("4 MiB into 1 MiB");
    let text = e.to_string();
    assert!(matches!(e, Error::Io { .. }), "{text}");
    assert!(
        text.contains("out.0") && text.contains("No space left"),
        "{text}"
    );
}

/// A hand-made model with a phase of no process, and a request no memory holds: the replay
/// ends, with an error for the second.
#[test]
fn odd_models_end() {
    let dir = tempfile::tempdir().expect("a directory");
    let mut m = synthetic::read_then_write(4, 16);
    m.phases[0].processes.clear();
    let r = replay(&m, dir.path(), &Options::default()).expect("the replay");
    assert_eq!(r.total.ops, 4, "the write phase ran");
    let mut m = synthetic::file_per_process(1, 1, 10);
    m.phases[0].request_size = u64::MAX / 2;
    m.phases[0].sizes[0].size = u64::MAX / 2;
    let e = replay(&m, dir.path(), &Options::default()).expect_err("too large");
    assert!(e.to_string().contains("no memory"), "{e}");
}

#[test]
fn phases_of_one_request_per_process_end() {
    // A part of one request once waited for every process's start, its own not yet counted.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for m in [
            synthetic::file_per_process(2, 1, 4096),
            synthetic::shared_strided(3, 1, 4096),
        ] {
            let dir = tempfile::tempdir().expect("a directory");
            let report = replay(&m, dir.path(), &Options::default()).expect("the replay");
            let requests: u64 = m.phases.iter().map(|p| p.ops).sum();
            assert_eq!(report.total.ops, requests);
        }
        let _ = done.send(());
    });
    finished
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("the replays end");
}
