//! The I/O model of synthetic applications whose model is known in advance, traced through a
//! real mount (`tessera mount --direct-io --trace`, so the kernel passes requests as made),
//! profiled with `tessera profile` and checked field by field: one file per process written
//! sequentially, one shared file strided by process, random reads, a read phase then a write
//! phase, a create-stat-unlink burst. Needs root, /dev/fuse and python3.

use std::path::Path;
use std::process::{Child, Command};
use tessera_model::{AccessMode, DataOp, Direction, MetaKind, Model, Phase, Sharing, SizeCount};

mod support;

use support::traced::{stop_and_read, trace_file, Mount};
use support::{Up, TESSERA};

/// The synthetic applications, one per mode: `python3 APP MODE ROOT [RANK]`.
const APP: &str = r#"
import os, random, sys, time
mode, root = sys.argv[1], sys.argv[2]
if mode == "seq":
    rank = int(sys.argv[3])
    fd = os.open(f"{root}/pp/f{rank}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for k in range(16):
        os.pwrite(fd, b"q" * 65536, k * 65536)
    os.close(fd)
elif mode == "strided":
    rank = int(sys.argv[3])
    fd = os.open(f"{root}/shared", os.O_WRONLY)
    for k in range(8):
        os.pwrite(fd, b"s" * 4096, (k * 4 + rank) * 4096)
        time.sleep(0.02)
    os.close(fd)
elif mode == "random":
    fd = os.open(f"{root}/db", os.O_RDONLY)
    rng = random.Random(7)
    for _ in range(200):
        os.pread(fd, 4096, rng.randrange(1024) * 4096)
    os.close(fd)
elif mode == "rw":
    src = os.open(f"{root}/in", os.O_RDONLY)
    data = [os.pread(src, 65536, k * 65536) for k in range(4)]
    os.close(src)
    dst = os.open(f"{root}/out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for k, d in enumerate(data):
        os.pwrite(dst, d, k * 65536)
    os.close(dst)
elif mode == "meta":
    os.mkdir(f"{root}/burst")
    names = [f"{root}/burst/f{i}" for i in range(50)]
    for n in names:
        os.close(os.open(n, os.O_WRONLY | os.O_CREAT, 0o644))
    time.sleep(1.5)
    for n in names:
        os.stat(n)
    time.sleep(1.5)
    for n in names:
        os.unlink(n)
"#;

fn app(home: &Path, mnt: &Path, mode: &str, rank: Option<u32>) -> Child {
    let mut cmd = Command::new("python3");
    cmd.arg(home.join("app.py")).arg(mode).arg(mnt);
    if let Some(r) = rank {
        cmd.arg(r.to_string());
    }
    cmd.spawn().expect("python3")
}

fn run(children: Vec<Child>) {
    for mut c in children {
        assert!(c.wait().expect("the app").success());
    }
}

fn dd(mnt: &Path, name: &str, blocks: u32) {
    let out = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", mnt.join(name).display()))
        .args(["bs=64k", &format!("count={blocks}"), "status=none"])
        .status()
        .expect("dd");
    assert!(out.success());
}

/// `tessera profile INPUT -o OUT`, read back.
fn profile(input: &Path, out: &Path) -> Model {
    let status = Command::new(TESSERA)
        .arg("profile")
        .arg(input)
        .arg("-o")
        .arg(out)
        .status()
        .expect("tessera profile");
    assert!(status.success());
    Model::from_json(&std::fs::read_to_string(out).expect("the model")).expect("a model")
}

fn phases_of<'a>(m: &'a Model, path: &str) -> Vec<&'a Phase> {
    let file = m.files.iter().find(|f| f.path == path).expect(path);
    m.phases.iter().filter(|p| p.file == file.id).collect()
}

#[test]
fn synthetic_applications_profile_into_their_known_model() {
    let home = tempfile::tempdir().expect("a home");
    let home = home.path();
    let (mnt, dir) = (home.join("mnt"), home.join("traces"));
    std::fs::create_dir(&mnt).expect("mount point");
    std::fs::write(home.join("app.py"), APP).expect("app.py");
    let _up = Up::start(home, &["--servers", "2", "--memory", "256MiB"]);
    let dir_arg = dir.to_string_lossy().into_owned();
    let m = Mount::start(
        home,
        &mnt,
        &[
            "--direct-io",
            "--attr-cache",
            "0",
            "--lease",
            "0",
            "--trace",
            &dir_arg,
        ],
    );
    std::fs::create_dir(mnt.join("pp")).expect("mkdir");
    dd(&mnt, "shared", 0);
    dd(&mnt, "db", 64);
    dd(&mnt, "in", 4);
    run((0..3).map(|r| app(home, &mnt, "seq", Some(r))).collect());
    run((0..4)
        .map(|r| app(home, &mnt, "strided", Some(r)))
        .collect());
    run(vec![app(home, &mnt, "random", None)]);
    run(vec![app(home, &mnt, "rw", None)]);
    run(vec![app(home, &mnt, "meta", None)]);
    let t = stop_and_read(home, &mnt, &dir);
    assert!(t.gaps.is_empty(), "nothing lost");
    drop(m);

    let m = profile(&trace_file(&dir), &home.join("model.json"));
    assert_eq!(m.source.records, t.records.len() as u64);
    // The same records as a Parquet table (as another tool would hand them) make the same model.
    let table = home.join("trace.parquet");
    let status = Command::new(TESSERA)
        .args(["trace", "export", "--format", "parquet", "-o"])
        .arg(&table)
        .arg(trace_file(&dir))
        .status()
        .expect("tessera trace export");
    assert!(status.success());
    let from_table = profile(&table, &home.join("table.json"));
    assert_eq!(
        (
            &from_table.application,
            &from_table.files,
            &from_table.phases
        ),
        (&m.application, &m.files, &m.phases)
    );
    assert_eq!(from_table.meta_phases, m.meta_phases);

    // One file per process, written sequentially.
    for r in 0..3 {
        let path = format!("/pp/f{r}");
        let f = m
            .files
            .iter()
            .find(|f| f.path == path)
            .expect("a file per process");
        assert_eq!(
            (
                f.size,
                f.created,
                f.sharing,
                f.direction,
                f.access,
                f.phases
            ),
            (
                1 << 20,
                true,
                Sharing::PerProcess,
                Direction::Write,
                AccessMode::Sequential,
                1
            )
        );
        let p = phases_of(&m, &path)[0];
        assert_eq!(
            (p.op, p.ops, p.request_size, p.displacement),
            (DataOp::Write, 16, 65536, Some(65536))
        );
        assert_eq!(
            (p.processes.len(), p.repetitions, p.weight),
            (1, 1, 1 << 20)
        );
    }
    // One shared file, strided by process: one phase of four.
    let shared = m
        .files
        .iter()
        .find(|f| f.path == "/shared")
        .expect("shared");
    assert_eq!(
        (shared.sharing, shared.processes, shared.access),
        (Sharing::Shared, 4, AccessMode::Strided)
    );
    let p = phases_of(&m, "/shared");
    assert_eq!(p.len(), 1, "{p:#?}");
    assert_eq!(
        (p[0].access, p[0].displacement, p[0].ops, p[0].weight),
        (AccessMode::Strided, Some(16384), 32, 32 * 4096)
    );
    let starts: Vec<u64> = p[0].processes.iter().map(|w| w.initial_offset).collect();
    assert_eq!(starts, [0, 4096, 8192, 12288]);
    // Random reads of a file written first.
    let db = phases_of(&m, "/db");
    let shape: Vec<_> = db.iter().map(|p| (p.op, p.access, p.ops)).collect();
    assert_eq!(
        shape,
        [
            (DataOp::Write, AccessMode::Sequential, 64),
            (DataOp::Read, AccessMode::Random, 200)
        ]
    );
    assert_eq!(
        db[1].sizes,
        [SizeCount {
            size: 4096,
            count: 200
        }]
    );
    // A read phase, then a write phase.
    let (read, write) = (phases_of(&m, "/in"), phases_of(&m, "/out"));
    assert_eq!(
        (read.len(), write.len()),
        (2, 1),
        "dd's write and the read; the write"
    );
    assert_eq!(
        (read[1].op, read[1].ops, read[1].access),
        (DataOp::Read, 4, AccessMode::Sequential)
    );
    assert_eq!(
        (write[0].op, write[0].ops, write[0].access),
        (DataOp::Write, 4, AccessMode::Sequential)
    );
    assert!(read[1].end_ns <= write[0].start_ns, "in order");
    // The create-stat-unlink burst.
    let burst: Vec<_> = (m.meta_phases.iter())
        .filter(|p| p.dir == "/burst")
        .map(|p| (p.kind, p.ops))
        .collect();
    assert!(burst.contains(&(MetaKind::Create, 50)), "{burst:?}");
    assert!(burst.contains(&(MetaKind::Unlink, 50)), "{burst:?}");
    assert!(
        burst.iter().any(|&(k, n)| k == MetaKind::Stat && n >= 50),
        "{burst:?}"
    );
    assert_eq!(
        m.application.metadata.creates,
        3 + 3 + 1 + 50,
        "the files per process, dd's, the copy, the burst's"
    );
}
