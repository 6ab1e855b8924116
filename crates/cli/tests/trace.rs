//! I/O tracing through real mounts started as users start them (`tessera up --mount --trace`,
//! `tessera mount --trace`): known programs traced record by record, a mount killed with
//! SIGKILL leaves a readable trace of everything up to its last flush, a stalled writer
//! leaves a counted gap, and the exports hold every record. Needs root and /dev/fuse.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tessera_trace::{Mode, Op, Record};

mod support;

use support::traced::{read, stop_and_read, trace_file, Mount, Trace};
use support::{Up, TESSERA};

/// A cluster of two small servers, and directories for a mount and for traces.
fn cluster(mount_with_trace: bool) -> (tempfile::TempDir, Up, PathBuf, PathBuf) {
    let home = tempfile::tempdir().expect("a home");
    let (mnt, dir) = (home.path().join("mnt"), home.path().join("traces"));
    std::fs::create_dir(&mnt).expect("mount point");
    let mut args: Vec<&std::ffi::OsStr> = ["--servers", "2", "--memory", "256MiB"]
        .iter()
        .map(|s| s.as_ref())
        .collect();
    if mount_with_trace {
        args.extend([
            "--mount".as_ref(),
            mnt.as_os_str(),
            "--trace".as_ref(),
            dir.as_os_str(),
        ]);
    }
    let up = Up::start(home.path(), &args);
    (home, up, mnt, dir)
}

fn of(t: &Trace, pid: u32, op: Op) -> Vec<&Record> {
    t.records
        .iter()
        .filter(|r| r.pid == pid && r.op == op)
        .collect()
}

fn path(r: &Record) -> &str {
    r.path.as_deref().unwrap_or("?")
}

#[test]
fn dd_is_traced_record_by_record_and_exported() {
    let (home, _up, mnt, dir) = cluster(true);
    let home = home.path();
    const N: u64 = 16;
    let dd = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", mnt.join("dd.out").display()))
        .args(["bs=64k", &format!("count={N}")])
        .stderr(Stdio::null())
        .spawn()
        .expect("dd");
    let pid = dd.id();
    assert!(dd.wait_with_output().expect("dd").status.success());
    let t = stop_and_read(home, &mnt, &dir);
    assert!(t.gaps.is_empty(), "no records lost");

    let writes = of(&t, pid, Op::Write);
    assert_eq!(writes.len() as u64, N, "one record per write(2)");
    for (i, w) in writes.iter().enumerate() {
        let at = i as u64 * 65536;
        assert_eq!(
            (w.offset, w.size, w.result),
            (at, 65536, 65536),
            "write {i}"
        );
        assert_eq!(path(w), "/dd.out");
        assert_eq!(w.exe.as_deref(), Some("dd"));
        // Write-only handles bypass the page cache (`cache.rs`), and records say so.
        assert_eq!(w.mode, Mode::DirectIo);
        assert!(!w.via_handle && w.start_ns <= w.end_ns);
    }
    // Every byte went to the servers: a stripe when it filled, the rest at the close (some
    // again if a new table made a write go again: a young cluster's table still changes).
    let sent: u64 = t
        .records
        .iter()
        .filter(|r| r.path.as_deref() == Some("/dd.out"))
        .filter_map(|r| r.server_size)
        .sum();
    assert!(
        sent >= N * 65536,
        "the servers were asked to store {sent} bytes"
    );
    assert!(writes.iter().all(|w| w.server_size.is_some()));
    let create = of(&t, pid, Op::Create);
    assert_eq!(create.len(), 1, "dd created its output");
    assert_eq!((path(create[0]), create[0].result), ("/dd.out", 0));
    assert!(create[0].end_ns <= writes[0].start_ns);
    // A flush per close(2) of a descriptor (dd moves its output to descriptor 1: two).
    assert!(!of(&t, pid, Op::Flush).is_empty(), "dd closed its output");
    // The stop itself is the last thing traced.
    let last = t
        .records
        .iter()
        .max_by_key(|r| r.start_ns)
        .expect("records");
    assert_eq!(last.op, Op::Setxattr);
    assert_eq!(t.end, Some((t.records.len() as u64, 0)));

    // Chrome trace JSON: every record is an event, on its process's track.
    let trace = trace_file(&dir);
    let chrome = home.join("trace.json");
    let out = Command::new(TESSERA)
        .args(["trace", "export", "--format", "chrome", "-o"])
        .arg(&chrome)
        .arg(&trace)
        .output()
        .expect("export");
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&chrome).expect("the export")).expect("JSON");
    let events = json["traceEvents"].as_array().expect("events");
    let slices: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(slices.len(), t.records.len(), "one slice per record");
    let dd_writes = slices
        .iter()
        .filter(|e| e["pid"] == pid && e["name"] == "write")
        .count();
    assert_eq!(dd_writes as u64, N);
    assert!(events
        .iter()
        .any(|e| e["ph"] == "M" && e["pid"] == pid && e["args"]["name"] == format!("dd ({pid})")));
    // A window keeps what overlaps it.
    let (from, to) = (writes[2].start_ns, writes[5].end_ns);
    let out = Command::new(TESSERA)
        .args(["trace", "export", "--format", "chrome"])
        .args(["--from", &format!("{}", from as f64 / 1e9)])
        .args(["--to", &format!("{}", to as f64 / 1e9)])
        .arg(&trace)
        .output()
        .expect("export");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let windowed = json["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["ph"] == "X" && e["pid"] == pid && e["name"] == "write")
        .count();
    assert!(
        (4..N as usize).contains(&windowed),
        "{windowed} writes in the window"
    );

    // fio iolog v3: dd's writes, in order, under the mount.
    let out = Command::new(TESSERA)
        .args(["trace", "export", "--format", "fio"])
        .arg(&trace)
        .output()
        .expect("export");
    let text = String::from_utf8(out.stdout).expect("text");
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("fio version 3 iolog"));
    let file = mnt.canonicalize().expect("mnt").join("dd.out");
    let writes: Vec<(u64, u64)> = lines
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() == 5 && f[1] == file.to_str().unwrap_or_default() && f[2] == "write")
                .then(|| (f[3].parse().unwrap_or(0), f[4].parse().unwrap_or(0)))
        })
        .collect();
    let expected: Vec<(u64, u64)> = (0..N).map(|i| (i * 65536, 65536)).collect();
    assert_eq!(writes, expected, "{text}");

    #[cfg(feature = "parquet")]
    parquet_holds_every_record(home, &trace, &t);

    let out = Command::new(TESSERA)
        .args(["trace", "summary"])
        .arg(&trace)
        .output()
        .expect("summary");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.contains("0 lost in 0 gaps; the writer stopped cleanly"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains(&pid.to_string()) && l.contains(" dd ") && l.contains("1.0 MiB")),
        "{text}"
    );
}

/// `trace export --format parquet` read back: a row per record, in order, every field.
#[cfg(feature = "parquet")]
fn parquet_holds_every_record(home: &Path, trace: &Path, t: &Trace) {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int64Type, UInt32Type, UInt64Type};
    use arrow_array::{Array, StringArray};
    let file = home.join("trace.parquet");
    let out = Command::new(TESSERA)
        .args(["trace", "export", "--format", "parquet", "-o"])
        .arg(&file)
        .arg(trace)
        .output()
        .expect("export");
    assert!(out.status.success(), "{out:?}");
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        std::fs::File::open(&file).expect("the export"),
    )
    .expect("a Parquet file");
    let meta = reader
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .cloned();
    let end = meta
        .unwrap_or_default()
        .into_iter()
        .find(|kv| kv.key == "tessera.end")
        .and_then(|kv| kv.value);
    assert_eq!(end, Some(format!("{},0", t.records.len())));
    let mut rows = Vec::new();
    for batch in reader.build().expect("a reader") {
        let b = batch.expect("a batch");
        let col = |name: &str| b.column_by_name(name).expect(name).clone();
        let text = |name: &str| col(name).as_string::<i32>().clone();
        let u64s = |name: &str| col(name).as_primitive::<UInt64Type>().clone();
        let (op, exe, path, mode) = (text("op"), text("exe"), text("path"), text("mode"));
        let pid = col("pid").as_primitive::<UInt32Type>().clone();
        let result = col("result").as_primitive::<Int64Type>().clone();
        let via = col("via_handle").as_boolean().clone();
        let (ino, offset, size) = (u64s("ino"), u64s("offset"), u64s("size"));
        let (start, end) = (u64s("start_ns"), u64s("end_ns"));
        for i in 0..b.num_rows() {
            let opt = |a: &StringArray| (!a.is_null(i)).then(|| a.value(i).to_string());
            rows.push((
                op.value(i).to_string(),
                mode.value(i).to_string(),
                via.value(i),
                pid.value(i),
                opt(&exe),
                ino.value(i),
                opt(&path),
                (offset.value(i), size.value(i)),
                (start.value(i), end.value(i), result.value(i)),
            ));
        }
    }
    let expected: Vec<_> = t
        .records
        .iter()
        .map(|r| {
            (
                r.op.name().to_string(),
                r.mode.name().to_string(),
                r.via_handle,
                r.pid,
                r.exe.as_deref().map(str::to_string),
                r.ino,
                r.path.as_deref().map(str::to_string),
                (r.offset, r.size),
                (r.start_ns, r.end_ns, r.result),
            )
        })
        .collect();
    assert_eq!(rows, expected);
}

const SCRIPT: &str = r#"
import os, sys
d = sys.argv[1]
os.mkdir(d + "/py")
a, b = d + "/py/a.txt", d + "/py/b.txt"
fd = os.open(a, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
os.write(fd, b"a" * 10000)
os.pwrite(fd, b"b" * 100, 20000)
os.close(fd)
assert os.stat(a).st_size == 20100
fd = os.open(a, os.O_RDONLY)
assert os.pread(fd, 4096, 0) == b"a" * 4096
assert os.pread(fd, 4096, 8192) == b"a" * 1808 + bytes(2288)
os.close(fd)
os.rename(a, b)
os.unlink(b)
"#;

#[test]
fn a_python_script_is_traced_as_it_ran() {
    let (home, _up, mnt, dir) = cluster(false);
    let home = home.path();
    let dirs = dir.to_str().expect("a path");
    // Requests as the program made them: no page cache, and every stat asked.
    let _mount = Mount::start(
        home,
        &mnt,
        &[
            "--direct-io",
            "--attr-cache",
            "0",
            "--lease",
            "0",
            "--trace",
            dirs,
        ],
    );
    let py = Command::new("python3")
        .args(["-c", SCRIPT])
        .arg(&mnt)
        .spawn()
        .expect("python3");
    let pid = py.id();
    assert!(py.wait_with_output().expect("python").status.success());
    let t = stop_and_read(home, &mnt, &dir);

    let mine: Vec<&Record> = t.records.iter().filter(|r| r.pid == pid).collect();
    assert!(mine.iter().all(|r| r.exe.as_deref() == Some("python3")));
    assert!(mine
        .iter()
        .all(|r| r.mode == Mode::DirectIo || !r.op.is_data()));
    let (a, b) = ("/py/a.txt", "/py/b.txt");
    // What the script did, in order, as (op, path, offset, size, result); other requests
    // (look-ups, getattrs) may come between.
    let expected: Vec<(Op, &str, u64, u64, i64)> = vec![
        (Op::Mkdir, "/py", 0, 0, 0),
        (Op::Create, a, 0, 0, 0),
        (Op::Write, a, 0, 10000, 10000),
        (Op::Write, a, 20000, 100, 100),
        (Op::Flush, a, 0, 0, 0),
        (Op::Getattr, a, 0, 0, 0),
        (Op::Open, a, 0, 0, 0),
        (Op::Read, a, 0, 4096, 4096),
        (Op::Read, a, 8192, 4096, 4096),
        (Op::Rename, a, 0, 0, 0),
        (Op::Unlink, b, 0, 0, 0),
    ];
    let seen: Vec<(Op, &str, u64, u64, i64)> = mine
        .iter()
        .map(|r| (r.op, path(r), r.offset, r.size, r.result))
        .collect();
    let mut rest = seen.iter();
    for e in &expected {
        assert!(
            rest.any(|s| s == e),
            "{e:?} not found in order in what python did:\n{seen:#?}"
        );
    }
    let rename = mine.iter().find(|r| r.op == Op::Rename).expect("rename");
    assert_eq!(rename.target.as_deref(), Some(b));
    let create = mine.iter().find(|r| r.op == Op::Create).expect("create");
    assert_eq!(create.flags as i32 & libc::O_ACCMODE, libc::O_WRONLY);
    // SAFETY: no preconditions.
    let uid = unsafe { libc::getuid() };
    assert!(mine.iter().all(|r| r.uid == uid));
}

/// Writes blocks `k`, `k + 4`, `k + 8`, ... (8 of them, 64 KiB each) of argv[1].
const SHARER: &str = r#"
import os, sys
k = int(sys.argv[2])
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)
for i in range(8):
    os.pwrite(fd, bytes([k]) * 65536, (k + 4 * i) * 65536)
os.close(fd)
"#;

/// Maps argv[1] and reads a byte of each of its pages.
const MAPPER: &str = r#"
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
assert all(m[i] == 7 for i in range(0, len(m), 4096))
m.close()
os.close(fd)
"#;

#[test]
fn processes_sharing_a_file_and_a_mapping_are_told_apart() {
    let (home, _up, mnt, dir) = cluster(true);
    let home = home.path();
    let shared = mnt.join("shared");
    let sharers: Vec<Child> = (0..4)
        .map(|k| {
            Command::new("python3")
                .args(["-c", SHARER])
                .arg(&shared)
                .arg(k.to_string())
                .spawn()
                .expect("python3")
        })
        .collect();
    let pids: Vec<u32> = sharers.iter().map(Child::id).collect();
    for s in sharers {
        assert!(s.wait_with_output().expect("a writer").status.success());
    }
    // A file written whole by one process, then read through a mapping by another.
    let mapped = mnt.join("mapped");
    std::fs::write(&mapped, vec![7u8; 1 << 20]).expect("the mapped file");
    let mapper = Command::new("python3")
        .args(["-c", MAPPER])
        .arg(&mapped)
        .spawn()
        .expect("python3");
    let mapper_pid = mapper.id();
    assert!(mapper
        .wait_with_output()
        .expect("the mapper")
        .status
        .success());
    let t = stop_and_read(home, &mnt, &dir);

    for (k, &pid) in pids.iter().enumerate() {
        let mut offsets: Vec<u64> = of(&t, pid, Op::Write)
            .iter()
            .filter(|w| path(w) == "/shared" && w.result == 65536)
            .map(|w| w.offset)
            .collect();
        offsets.sort_unstable();
        let expected: Vec<u64> = (0..8).map(|i| (k as u64 + 4 * i) * 65536).collect();
        assert_eq!(offsets, expected, "writer {k} (pid {pid})");
    }
    // The page faults come as reads of the mapper's, covering the file.
    let reads = of(&t, mapper_pid, Op::Read);
    assert!(reads.iter().all(|r| path(r) == "/mapped" && r.result >= 0));
    let read: i64 = reads.iter().map(|r| r.result).sum();
    assert!(read >= 1 << 20, "{read} bytes read through the mapping");
}

/// CLOCK_MONOTONIC in seconds, as Python's time.monotonic() reads it.
fn monotonic() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Writes 64 KiB blocks to argv[1] until a write fails, then lists when each write returned
/// (time.monotonic()) in argv[2].
const WRITER: &str = r#"
import os, sys, time
done = []
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)
try:
    while True:
        os.write(fd, b"x" * 65536)
        done.append(time.monotonic())
        time.sleep(0.002)
except OSError:
    pass
with open(sys.argv[2], "w") as f:
    f.write("\n".join(map(repr, done)))
"#;

#[test]
fn a_mount_killed_leaves_a_trace_of_all_but_its_last_second() {
    let (home, _up, mnt, dir) = cluster(false);
    let home = home.path();
    let mut mount = Mount::start(home, &mnt, &["--trace", dir.to_str().expect("a path")]);
    let times = home.join("times");
    let mut writer = Command::new("python3")
        .args(["-c", WRITER])
        .arg(mnt.join("out"))
        .arg(&times)
        .spawn()
        .expect("python3");
    let pid = writer.id();
    std::thread::sleep(Duration::from_secs(3));
    let killed_at = monotonic();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(mount.0.id() as i32, libc::SIGKILL) };
    let _ = mount.0.wait();
    // The dead mount's writes fail; detached, the directory is free again.
    let umount = Command::new(TESSERA).arg("umount").arg(&mnt).status();
    assert!(umount.expect("tessera umount").success());
    assert!(writer.wait().expect("the writer").success());
    let done: Vec<f64> = std::fs::read_to_string(&times)
        .expect("the writer's times")
        .lines()
        .map(|l| l.parse().expect("a time"))
        .collect();

    let t = read(&trace_file(&dir));
    assert_eq!(t.end, None, "a killed writer writes no end");
    let writes = of(&t, pid, Op::Write);
    // In the order they were made, none missing before the last one kept.
    for (i, w) in writes.iter().enumerate() {
        assert_eq!((w.offset, w.size), (i as u64 * 65536, 65536), "write {i}");
    }
    // Everything done a second before the kill was written (flushes come every 250 ms).
    let before = done.iter().filter(|&&at| at < killed_at - 1.0).count();
    assert!(
        before > 10,
        "the writer wrote for a while: {} writes",
        done.len()
    );
    assert!(
        writes.len() >= before && writes.len() <= done.len(),
        "{} writes traced; {before} done a second before the kill, {} in all",
        writes.len(),
        done.len()
    );
}

#[test]
fn a_stalled_writer_leaves_a_counted_gap() {
    let (home, _up, mnt, dir) = cluster(false);
    let home = home.path();
    let dirs = dir.to_str().expect("a path");
    // Room for a few hundred records, and a writer that takes 3 s per chunk.
    let _mount = Mount::start(
        home,
        &mnt,
        &[
            "--trace",
            dirs,
            "--trace-buffer",
            "8KiB",
            "--trace-stall",
            "3",
        ],
    );
    const N: u64 = 2000;
    let dd = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", mnt.join("dd.out").display()))
        .args(["bs=4k", &format!("count={N}")])
        .stderr(Stdio::null())
        .spawn()
        .expect("dd");
    let pid = dd.id();
    assert!(dd.wait_with_output().expect("dd").status.success());
    let t = stop_and_read(home, &mnt, &dir);

    let lost: u64 = t.gaps.iter().map(|g| g.dropped).sum();
    assert!(lost > 0, "a stalled writer lost records");
    let (records, dropped) = t.end.expect("an end");
    assert_eq!((records, dropped), (t.records.len() as u64, lost));
    // Every write is either recorded or counted in a gap.
    let writes = of(&t, pid, Op::Write);
    assert!(writes.len() as u64 + lost >= N);
    assert!((writes.len() as u64) < N);
    // Recorded writes stay in order around the gaps.
    assert!(writes.windows(2).all(|w| w[0].offset < w[1].offset));
    for g in &t.gaps {
        assert!(g.from_ns <= g.to_ns && g.dropped > 0);
    }

    let out = Command::new(TESSERA)
        .args(["trace", "summary"])
        .arg(trace_file(&dir))
        .output()
        .expect("summary");
    let text = String::from_utf8_lossy(&out.stdout);
    let said = format!("{lost} lost in {} gaps", t.gaps.len());
    assert!(text.contains(&said), "{text}");
}

#[test]
fn a_trace_started_later_names_the_files_looked_up_before() {
    let (home, _up, mnt, dir) = cluster(false);
    let home = home.path();
    let _mount = Mount::start(home, &mnt, &[]);
    std::fs::create_dir(mnt.join("d")).expect("mkdir");
    std::fs::write(mnt.join("d/f"), b"known before").expect("write");
    // Looked up now, untraced: the kernel keeps the names and will not ask again.
    assert_eq!(
        std::fs::read(mnt.join("d/f")).expect("read"),
        b"known before"
    );
    let dirs = dir.to_str().expect("a path");
    std::fs::create_dir(&dir).expect("trace directory");
    let out = Command::new(TESSERA)
        .args(["trace", "start"])
        .arg(&mnt)
        .args(["--dir", dirs])
        .env("TESSERA_HOME", home)
        .output()
        .expect("tessera trace start");
    assert!(out.status.success(), "trace start: {out:?}");
    assert_eq!(
        std::fs::read(mnt.join("d/f")).expect("read"),
        b"known before"
    );
    let t = stop_and_read(home, &mnt, &dir);
    let reads: Vec<&str> = (t.records.iter())
        .filter(|r| r.op == Op::Read || r.op == Op::Open)
        .map(path)
        .collect();
    assert!(!reads.is_empty(), "the read is traced");
    assert!(
        reads.iter().all(|p| *p == "/d/f"),
        "named, not by inode: {reads:?}"
    );
}
