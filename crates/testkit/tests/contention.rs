//! Many processes, and two mounts, on the same files at once: nothing may be lost. Appends
//! from several processes to one log, and directory renames that cross each other from two
//! mounts. Needs root and /dev/fuse.

use anyhow::{ensure, Context, Result};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use tessera_testkit::{Cluster, ClusterSpec};

/// Runs `script` with `sh -c` in `n` processes at once (`$1` is the process's number) and
/// waits for all; each must succeed.
fn race_shells(n: usize, script: &str) -> Result<()> {
    let children = (0..n)
        .map(|k| {
            Command::new("sh")
                .args(["-c", script, "sh", &k.to_string()])
                .stdin(Stdio::null())
                .spawn()
                .context("starting sh")
        })
        .collect::<Result<Vec<_>>>()?;
    for mut c in children {
        let status = c.wait()?;
        ensure!(status.success(), "a writer failed: {status}");
    }
    Ok(())
}

/// Every line of `path`, each of which must be one of the `expected` records, once.
fn check_log(path: &Path, expected: &BTreeSet<String>) -> Result<()> {
    let text = fs::read_to_string(path)?;
    let lines: Vec<&str> = text.lines().collect();
    let unique: BTreeSet<String> = lines.iter().map(|l| (*l).to_string()).collect();
    let stray: Vec<_> = unique.difference(expected).take(3).collect();
    ensure!(stray.is_empty(), "merged or torn lines: {stray:?}");
    ensure!(
        lines.len() == expected.len() && unique.len() == expected.len(),
        "{}: {} lines ({} distinct), {} written",
        path.display(),
        lines.len(),
        unique.len(),
        expected.len()
    );
    Ok(())
}

fn records(writers: usize, each: usize, tag: &str) -> BTreeSet<String> {
    (0..writers)
        .flat_map(|k| (1..=each).map(move |i| format!("{tag}{k} {i}")))
        .collect()
}

#[test]
fn appends_from_many_processes_on_one_mount_all_land() -> Result<()> {
    let cluster = Cluster::start(&ClusterSpec::default())?;
    let base = temp_dir("append")?;
    let m = cluster.mount(&base.join("m"), &[])?;
    let dir = m.dir.to_string_lossy().into_owned();

    // One open each, 2,000 records each: one write(2) per record, all with O_APPEND.
    race_shells(
        4,
        &format!(
            "exec 3>>'{dir}/held.log'; i=1; while [ $i -le 2000 ]; do \
             echo \"h$1 $i\" >&3; i=$((i+1)); done"
        ),
    )?;
    check_log(&m.dir.join("held.log"), &records(4, 2000, "h"))?;

    // A shell's `>>`: open, append, close for every record.
    race_shells(
        4,
        &format!(
            "i=1; while [ $i -le 250 ]; do echo \"s$1 $i\" >> '{dir}/shell.log'; \
             i=$((i+1)); done"
        ),
    )?;
    check_log(&m.dir.join("shell.log"), &records(4, 250, "s"))?;

    // Read-write handles (through the page cache otherwise), each record made durable.
    let py = format!(
        "import os, sys\n\
         k = sys.argv[1]\n\
         fd = os.open('{dir}/synced.log', os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)\n\
         for i in range(1, 501):\n\
         \x20   os.write(fd, f'f{{k}} {{i}}\\n'.encode())\n\
         \x20   os.fsync(fd)\n\
         os.close(fd)\n"
    );
    let children = (0..2)
        .map(|k| {
            Command::new("python3")
                .args(["-c", &py, &k.to_string()])
                .stdin(Stdio::null())
                .spawn()
                .context("starting python3")
        })
        .collect::<Result<Vec<_>>>()?;
    for mut c in children {
        ensure!(c.wait()?.success(), "a synced appender failed");
    }
    check_log(&m.dir.join("synced.log"), &records(2, 500, "f"))?;
    Ok(())
}

#[test]
fn crossing_directory_renames_from_two_mounts_never_cut_the_tree() -> Result<()> {
    const PAIRS: usize = 200;
    let cluster = Cluster::start(&ClusterSpec::default())?;
    let base = temp_dir("rename")?;
    let a = cluster.mount(&base.join("a"), &[])?;
    let b = cluster.mount(&base.join("b"), &[])?;
    for i in 0..PAIRS {
        let pair = a.dir.join(format!("race/{i}"));
        for d in ["a", "b"] {
            fs::create_dir_all(pair.join(d))?;
            fs::write(pair.join(d).join("file"), d)?;
        }
    }
    // Both mounts know every directory before the race, as busy nodes would.
    for m in [&a.dir, &b.dir] {
        for i in 0..PAIRS {
            fs::metadata(m.join(format!("race/{i}/a/file")))?;
            fs::metadata(m.join(format!("race/{i}/b/file")))?;
        }
    }
    let barrier = std::sync::Barrier::new(2);
    let run = |root: &PathBuf, from: &'static str, into: &'static str| {
        barrier.wait();
        (0..PAIRS)
            .map(|i| {
                let pair = root.join(format!("race/{i}"));
                fs::rename(pair.join(from), pair.join(into).join(from)).is_ok()
            })
            .collect::<Vec<bool>>()
    };
    let moved = std::thread::scope(|s| {
        let ta = s.spawn(|| run(&a.dir, "a", "b"));
        let tb = s.spawn(|| run(&b.dir, "b", "a"));
        (ta.join(), tb.join())
    });
    let (Ok(by_a), Ok(by_b)) = moved else {
        anyhow::bail!("a renaming thread panicked");
    };
    for i in 0..PAIRS {
        ensure!(
            !(by_a[i] && by_b[i]),
            "pair {i}: both crossing renames succeeded"
        );
        let pair = a.dir.join(format!("race/{i}"));
        let (top, inner) = match (by_a[i], by_b[i]) {
            (true, _) => ("b", "a"),
            (_, true) => ("a", "b"),
            _ => anyhow::bail!("pair {i}: neither rename succeeded"),
        };
        let names: Vec<_> = fs::read_dir(&pair)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        ensure!(names == [top], "pair {i}: {names:?} left, {top} expected");
        ensure!(fs::read(pair.join(top).join("file"))? == top.as_bytes());
        ensure!(fs::read(pair.join(top).join(inner).join("file"))? == inner.as_bytes());
    }
    Ok(())
}

fn temp_dir(what: &str) -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("tessera-{what}-{}", std::process::id()));
    fs::create_dir_all(&d)?;
    Ok(d)
}
