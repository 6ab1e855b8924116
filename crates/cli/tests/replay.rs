//! `tessera replay` as users run it: exports that fio parses (IOR is not packaged in Debian:
//! its script is checked for its structure), replays of a model with their table and JSON,
//! the fidelity check against an original trace (a replay's own, and one of a real mount),
//! and clear errors for bad inputs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tessera_model::{synthetic, Model};

mod support;

use support::{Up, TESSERA};

fn tessera(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(TESSERA)
        .args(args)
        .output()
        .expect("tessera runs")
}

fn os<S: AsRef<std::ffi::OsStr> + ?Sized>(s: &S) -> &std::ffi::OsStr {
    s.as_ref()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The issue's five applications, and one with every kind of phase at once.
fn models() -> Vec<(&'static str, Model)> {
    let mut mixed = synthetic::read_then_write(8, 4096);
    let burst = synthetic::create_stat_unlink(2, 16);
    mixed.meta_phases = burst.meta_phases;
    vec![
        (
            "file-per-process",
            synthetic::file_per_process(4, 16, 65536),
        ),
        ("shared-strided", synthetic::shared_strided(4, 16, 4096)),
        ("random-reads", synthetic::random_reads(64, 4096, 1 << 20)),
        ("read-then-write", synthetic::read_then_write(16, 65536)),
        ("create-stat-unlink", synthetic::create_stat_unlink(4, 64)),
        ("mixed", mixed),
    ]
}

fn write_model(dir: &Path, name: &str, m: &Model) -> PathBuf {
    let p = dir.join(format!("{name}.model.json"));
    std::fs::write(&p, m.to_json()).expect("the model");
    p
}

#[test]
fn fio_parses_every_export_and_ior_scripts_hold_a_run_per_phase() {
    let home = tempfile::tempdir().expect("a directory");
    for (name, m) in models() {
        let model = write_model(home.path(), name, &m);
        let job = home.path().join(format!("{name}.fio"));
        let o = tessera(&[
            os("replay"),
            os(&model),
            os("--export"),
            os("fio"),
            os("-o"),
            os(&job),
        ]);
        assert!(o.status.success(), "{name}: {}", text(&o));
        let parsed = Command::new("fio")
            .arg("--parse-only")
            .arg(&job)
            .output()
            .expect("fio is installed (scripts/deps.sh)");
        let job_text = std::fs::read_to_string(&job).unwrap_or_default();
        assert!(
            parsed.status.success(),
            "{name}: fio --parse-only: {}\n{job_text}",
            text(&parsed)
        );
        let sections = job_text.lines().filter(|l| l.starts_with("[phase")).count();
        assert_eq!(
            sections,
            m.phases.len(),
            "{name}: a job per phase\n{job_text}"
        );

        let o = tessera(&[os("replay"), os(&model), os("--export"), os("ior")]);
        assert!(o.status.success(), "{name}: {}", text(&o));
        let ior = String::from_utf8_lossy(&o.stdout).into_owned();
        let lines: Vec<&str> = ior.lines().map(str::trim).collect();
        let start = lines.iter().position(|l| *l == "IOR START");
        let stop = lines.iter().position(|l| *l == "IOR STOP");
        assert!(
            matches!((start, stop), (Some(a), Some(b)) if a < b),
            "{name}:\n{ior}"
        );
        assert_eq!(
            lines.iter().filter(|l| **l == "RUN").count(),
            m.phases.len(),
            "{name}: a RUN per phase\n{ior}"
        );
        // Every RUN states its layout, and IOR's rules hold: transfers a multiple of 8 that
        // divide the block.
        let value = |l: &str, key: &str| {
            l.strip_prefix(key)
                .and_then(|v| v.strip_prefix('='))
                .and_then(|v| v.parse::<u64>().ok())
        };
        let t: Vec<u64> = lines
            .iter()
            .filter_map(|l| value(l, "transferSize"))
            .collect();
        let b: Vec<u64> = lines.iter().filter_map(|l| value(l, "blockSize")).collect();
        assert_eq!(
            (t.len(), b.len()),
            (m.phases.len(), m.phases.len()),
            "{name}:\n{ior}"
        );
        for (t, b) in t.iter().zip(&b) {
            assert!(t % 8 == 0 && b % t == 0, "{name}: -t {t} -b {b}\n{ior}");
        }
        assert!(ior
            .lines()
            .take_while(|l| l.starts_with('#'))
            .any(|l| l.contains("approximations")));

        let o = tessera(&[os("replay"), os(&model), os("--export"), os("mdtest")]);
        assert!(o.status.success(), "{name}: {}", text(&o));
        let md = String::from_utf8_lossy(&o.stdout).into_owned();
        let commands: Vec<&str> = md.lines().filter(|l| !l.starts_with('#')).collect();
        if m.meta_phases.is_empty() {
            assert!(commands.is_empty(), "{name}:\n{md}");
        } else {
            assert_eq!(commands.len(), 1, "{name}:\n{md}");
            assert!(commands[0].contains("mdtest -F -C -T -r"), "{name}:\n{md}");
        }
    }
}

#[test]
fn a_replay_prints_its_phases_and_writes_json() {
    let home = tempfile::tempdir().expect("a directory");
    let (name, m) = models().remove(3);
    let model = write_model(home.path(), name, &m);
    let dir = home.path().join("run");
    std::fs::create_dir(&dir).expect("the replay directory");
    let json = home.path().join("out.json");
    let o = tessera(&[
        os("replay"),
        os(&model),
        os("--dir"),
        os(&dir),
        os("--json"),
        os(&json),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        table.contains("read /data/in") && table.contains("write /data/out"),
        "{table}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON")).expect("JSON");
    assert_eq!(report["total"]["bytes"], 2 * 16 * 65536);
    assert_eq!(report["phases"].as_array().map(Vec::len), Some(2));
    assert_eq!(report["prepared_bytes"], 16 * 65536);
}

#[test]
fn bad_inputs_are_clear_errors() {
    let home = tempfile::tempdir().expect("a directory");
    let m = synthetic::file_per_process(1, 1, 10);
    let model = write_model(home.path(), "m", &m);
    let other = home.path().join("other.json");
    std::fs::write(
        &other,
        m.to_json().replace("tessera.model/1", "tessera.model/9"),
    )
    .expect("a model");
    let o = tessera(&[os("replay"), os(&other), os("--dir"), os(home.path())]);
    assert!(!o.status.success());
    assert!(text(&o).contains("tessera.model/9"), "{}", text(&o));
    let o = tessera(&[os("replay"), os(&model), os("--dir"), os("/nonexistent/x")]);
    assert!(!o.status.success());
    assert!(text(&o).contains("/nonexistent/x"), "{}", text(&o));
    assert!(!text(&o).contains("panicked"), "{}", text(&o));
    let o = tessera(&[os("replay"), os(&model)]);
    assert!(!o.status.success(), "--dir or --export is needed");
}

/// An original trace (here the replay's own of a synthetic application), profiled, replayed
/// and checked against it: the shape matches; checked against another trace, it does not.
#[test]
fn a_check_compares_the_replay_with_the_original() {
    let home = tempfile::tempdir().expect("a directory");
    let traces = home.path().join("traces");
    let run = home.path().join("run");
    std::fs::create_dir(&run).expect("the replay directory");
    let make_trace = |name: &str, m: &Model| -> PathBuf {
        let model = write_model(home.path(), name, m);
        let dir = traces.join(name);
        let o = tessera(&[
            os("replay"),
            os(&model),
            os("--dir"),
            os(&run),
            os("--trace"),
            os(&dir),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        let t = std::fs::read_dir(&dir)
            .expect("a trace")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .next();
        t.expect("a trace file")
    };
    let (name, m) = models().remove(5);
    let original = make_trace(name, &m);
    let other = make_trace("other", &synthetic::file_per_process(2, 8, 4096));
    let profiled = home.path().join("profiled.json");
    let o = tessera(&[os("profile"), os(&original), os("-o"), os(&profiled)]);
    assert!(o.status.success(), "{}", text(&o));

    let o = tessera(&[
        os("replay"),
        os(&profiled),
        os("--dir"),
        os(&run),
        os("--check"),
        os(&original),
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("shape:") && !out.contains("DIFFERS"), "{out}");
    assert!(out.contains("I/O time in phases: original"), "{out}");

    let o = tessera(&[
        os("replay"),
        os(&profiled),
        os("--dir"),
        os(&run),
        os("--check"),
        os(&other),
    ]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(
        out.contains("DIFFERS") && out.contains("did not do what the original did"),
        "{out}"
    );
}

/// A program traced through a real mount (`dd`, 64 KiB writes, and `cat` reading the file
/// back), profiled, then replayed into the mount with the check: the same shape. Needs root
/// and /dev/fuse.
#[test]
fn a_traced_program_replays_with_its_shape_through_a_mount() {
    let home = tempfile::tempdir().expect("a home");
    let (mnt, dir) = (home.path().join("mnt"), home.path().join("traces"));
    std::fs::create_dir(&mnt).expect("mount point");
    let _up = Up::start(
        home.path(),
        &[
            os("--servers"),
            os("2"),
            os("--memory"),
            os("256MiB"),
            os("--mount"),
            os(&mnt),
            os("--trace"),
            os(&dir),
        ],
    );
    let out = mnt.join("dd.out");
    let dd = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", out.display()))
        .args(["bs=64k", "count=32"])
        .output()
        .expect("dd");
    assert!(dd.status.success(), "{}", text(&dd));
    let stop = Command::new(TESSERA)
        .args([os("trace"), os("stop"), os(&mnt)])
        .env("TESSERA_HOME", home.path())
        .output()
        .expect("trace stop");
    assert!(stop.status.success(), "{}", text(&stop));
    let trace = std::fs::read_dir(&dir)
        .expect("traces")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "ttrace"))
        .expect("a trace");
    // The writer finishes the file shortly after the stop.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let model = home.path().join("dd.model.json");
    loop {
        let o = tessera(&[os("profile"), os(&trace), os("-o"), os(&model)]);
        assert!(o.status.success(), "{}", text(&o));
        let m = Model::from_json(&std::fs::read_to_string(&model).unwrap_or_default());
        if m.is_ok_and(|m| m.application.writes >= 32) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the trace holds dd's writes"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let run = mnt.join("replay");
    std::fs::create_dir(&run).expect("a replay directory in the mount");
    let o = tessera(&[
        os("replay"),
        os(&model),
        os("--dir"),
        os(&run),
        os("--check"),
        os(&trace),
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("dd.out") && !out.contains("DIFFERS"), "{out}");
    assert_eq!(
        std::fs::metadata(run.join("dd.out")).map(|m| m.len()).ok(),
        Some(32 * 65536)
    );
}

/// The mount's traces of what a replay opened, by path: the opens of each.
fn opens(trace: &Path) -> std::collections::BTreeMap<String, u64> {
    let mut r = tessera_trace::Reader::open(trace).expect("a trace");
    let mut by = std::collections::BTreeMap::new();
    while let Some(item) = r.next_item().expect("readable") {
        if let tessera_trace::Item::Record(rec) = item {
            if matches!(rec.op, tessera_trace::Op::Open | tessera_trace::Op::Create) {
                *by.entry(rec.path.as_deref().unwrap_or("?").to_string())
                    .or_insert(0) += 1;
            }
        }
    }
    by
}

/// An original timed by a mount (a replay of a known model, traced by the mount only while
/// its phases ran), profiled and replayed with `--check --mount-trace`: the check compares
/// the mount's trace of the replay's phases with the original, both timed by the mount, and
/// says so; a process opens its file once for its two phases on it, as the original did.
/// Needs root and /dev/fuse.
#[test]
fn a_check_through_a_mount_times_the_replay_as_the_mount_timed_the_original() {
    let home = tempfile::tempdir().expect("a home");
    let mnt = home.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mount point");
    let _up = Up::start(
        home.path(),
        &[
            os("--servers"),
            os("2"),
            os("--memory"),
            os("256MiB"),
            os("--mount"),
            os(&mnt),
        ],
    );
    // One process reads /f, then writes it: two phases on one file. Reads come first because
    // a read-back of fresh writes is served by the page cache and never reaches the mount;
    // the prepared input is evicted by --drop-caches (and a mount passes on writes in its own
    // sizes, so a change of size alone may not cut a phase).
    let mut m = synthetic::file_per_process(1, 16, 65536);
    m.phases[0].op = tessera_model::DataOp::Read;
    let mut tail = m.phases[0].clone();
    tail.op = tessera_model::DataOp::Write;
    for p in &mut tail.processes {
        p.start_ns += 1_000_000_000;
    }
    tail.start_ns += 1_000_000_000;
    tail.end_ns += 1_000_000_000;
    tail.id = 1;
    m.phases.push(tail);
    m.files[0].path = "/f".into();
    m.files[0].created = false;
    let model = write_model(home.path(), "two-phases", &m);
    let (orig, run) = (mnt.join("orig"), mnt.join("run"));
    std::fs::create_dir(&orig).expect("a directory in the mount");
    std::fs::create_dir(&run).expect("a directory in the mount");
    let traces = home.path().join("traces");
    // Cold caches where this machine lets root drop them (a container may not).
    let can_drop = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/sys/vm/drop_caches")
        .is_ok();
    let replay = |model: &Path, dir: &Path, tdir: &Path, check: Option<&Path>| {
        let mut args = vec![
            os("replay"),
            os(model),
            os("--dir"),
            os(dir),
            os("--mount-trace"),
            os(tdir),
            os("--json"),
            os("-"),
        ];
        if can_drop {
            args.push(os("--drop-caches"));
        }
        if let Some(c) = check {
            args.extend([os("--check"), os(c)]);
        }
        let o = tessera(&args);
        // A check fails on any difference of shape, and request sizes are the kernel's.
        let shape_only = check.is_some()
            && String::from_utf8_lossy(&o.stderr).contains("did not do what the original did");
        assert!(o.status.success() || shape_only, "{}", text(&o));
        let json: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
        let trace = json["mount_trace"].as_str().map(PathBuf::from);
        let trace = trace.unwrap_or_else(|| panic!("the mount's trace: {json}"));
        (json, trace)
    };
    let (_, original) = replay(&model, &orig, &traces.join("orig"), None);
    let profiled = home.path().join("orig.model.json");
    let o = tessera(&[os("profile"), os(&original), os("-o"), os(&profiled)]);
    assert!(o.status.success(), "{}", text(&o));
    let pm = Model::from_json(&std::fs::read_to_string(&profiled).unwrap_or_default())
        .expect("the original's model");
    let on_f: Vec<_> = pm
        .phases
        .iter()
        .filter(|p| p.file == pm.phases[0].file)
        .collect();
    assert!(on_f.len() >= 2, "two phases on one file: {}", pm.to_json());
    assert_eq!(
        opens(&original).get("/orig/f"),
        Some(&1),
        "{:?}",
        opens(&original)
    );

    let (json, replayed) = replay(&profiled, &run, &traces.join("run"), Some(&original));
    let check = &json["check"];
    assert_eq!(check["time_by"], "mount", "{check}");
    assert_eq!(check["time_alike"], true, "{check}");
    assert!(
        check["io_time_ns"][0].as_u64().is_some_and(|t| t > 0),
        "{check}"
    );
    assert!(
        check["io_time_ns"][1].as_u64().is_some_and(|t| t > 0),
        "{check}"
    );
    // Bytes are exact; request sizes are the kernel's (read-ahead, write-back), which vary
    // from run to run on a busy machine, so they are not asserted here.
    let differ: Vec<&serde_json::Value> = check["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["what"].as_str().is_some_and(|w| w.starts_with("bytes")))
        .filter(|c| c["matches"] != true)
        .collect();
    assert!(differ.is_empty(), "{differ:?}");
    // Only the phases were traced: the preparation (writing /run/orig/f) is not there.
    let ops = opens(&replayed);
    assert_eq!(
        ops.get("/run/orig/f"),
        Some(&1),
        "one open of the file: {ops:?}"
    );
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert_eq!(
        std::fs::metadata(run.join("orig/f")).map(|m| m.len()).ok(),
        Some(16 * 65536)
    );
}
