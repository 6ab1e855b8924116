//! Mirrors and failures (issue 4): a manager and servers as real processes on 127.0.0.x with
//! replication 2, clients in separate processes; servers are killed with SIGKILL mid-run,
//! restarted, or slowed down by fault injection. Every byte a client was told is written must
//! read back intact.

use anyhow::Result;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tessera_testkit::{digest, pattern, verify_files, Cluster, ClusterSpec, Worker};

const MIB: u64 = 1 << 20;
const EIO: i32 = 5;

fn spec(servers: usize, replication: u8) -> ClusterSpec {
    ClusterSpec {
        servers,
        replication,
        memory: "2GiB".into(),
        partitions: 128,
        manager_args: vec!["--dead-after".into(), "1s".into()],
        ..ClusterSpec::default()
    }
}

fn write(w: &mut Worker, path: &str, len: u64, seed: u64) -> Result<()> {
    w.ok(
        &json!({"cmd": "write_file", "path": path, "len": len, "seed": seed, "chunk": 256 << 10}),
    )?;
    Ok(())
}

fn settled(st: &Value) -> bool {
    st["degraded"] == 0 && st["incoming"] == 0 && st["lost"] == 0
}

fn alive(st: &Value) -> usize {
    st["nodes"]
        .as_array()
        .map_or(0, |n| n.iter().filter(|n| n["alive"] == true).count())
}

#[test]
fn a_server_killed_during_writes_loses_nothing_and_is_rebuilt() -> Result<()> {
    let mut cluster = Cluster::start(&spec(4, 2))?;
    let mut watch = cluster.worker()?;
    watch.ok(&json!({"cmd": "status"}))?;
    let killed = AtomicBool::new(false);
    let files = std::thread::scope(|s| -> Result<Vec<(String, u64, u64)>> {
        let writer = s.spawn(|| -> Result<Vec<(String, u64, u64)>> {
            let mut w = cluster.worker()?;
            w.ok(&json!({"cmd": "mkdir", "path": "/w"}))?;
            let mut files = Vec::new();
            // Keep writing until well after the kill: the client must ride through it.
            let mut after = 0;
            for k in 0..400u64 {
                let path = format!("/w/f{k}");
                write(&mut w, &path, 2 * MIB + k, k)?;
                files.push((path, 2 * MIB + k, k));
                if killed.load(Ordering::SeqCst) {
                    after += 1;
                    if after == 25 {
                        break;
                    }
                }
            }
            Ok(files)
        });
        std::thread::sleep(Duration::from_millis(1500));
        // SAFETY: signalling our own child process (reaped after the writer is done).
        unsafe { libc::kill(cluster.servers[1].id() as i32, libc::SIGKILL) };
        killed.store(true, Ordering::SeqCst);
        writer.join().expect("writer thread")
    })?;
    assert!(files.len() > 25, "the kill came after the writes ended");
    cluster.kill_server(1)?; // reaps the process
    let mut reader = cluster.worker()?;
    verify_files(&mut reader, &files)?;

    // The lost copies are rebuilt on the survivors: back to two complete copies of everything.
    let st = Cluster::wait_status(&mut watch, Duration::from_secs(90), |st| {
        alive(st) == 3 && settled(st)
    })?;
    let epoch = st["epoch"].as_u64().unwrap_or(0);
    // A second failure after the rebuild loses nothing either.
    cluster.kill_server(2)?;
    Cluster::wait_status(&mut watch, Duration::from_secs(30), |st| {
        alive(st) == 2 && st["epoch"].as_u64() > Some(epoch)
    })?;
    verify_files(&mut reader, &files)?;

    // A restarted server rejoins as a new node and takes its share back.
    cluster.restart_server(1)?;
    let st = Cluster::wait_status(&mut watch, Duration::from_secs(90), |st| {
        alive(st) == 3 && settled(st)
    })?;
    let fresh = st["nodes"]
        .as_array()
        .and_then(|n| {
            n.iter()
                .filter(|n| n["alive"] == true)
                .max_by_key(|n| n["id"].as_u64())
        })
        .cloned()
        .unwrap_or_default();
    assert!(fresh["partitions"].as_u64().unwrap_or(0) > 0, "{st}");
    verify_files(&mut reader, &files)?;
    Ok(())
}

#[test]
fn a_server_killed_during_reads_is_failed_over() -> Result<()> {
    let mut cluster = Cluster::start(&spec(4, 2))?;
    let (mut w, mut watch) = (cluster.worker()?, cluster.worker()?);
    let files: Vec<_> = (0..16u64)
        .map(|k| (format!("/r{k}"), 4 * MIB + 17 * k, 100 + k))
        .collect();
    for (path, len, seed) in &files {
        write(&mut w, path, *len, *seed)?;
    }
    let killed = AtomicBool::new(false);
    std::thread::scope(|s| -> Result<()> {
        let reader = s.spawn(|| -> Result<usize> {
            let mut r = cluster.worker()?;
            let mut passes_after = 0;
            let mut passes = 0;
            while passes_after < 2 {
                let was_killed = killed.load(Ordering::SeqCst);
                verify_files(&mut r, &files)?;
                passes += 1;
                if was_killed {
                    passes_after += 1;
                }
                anyhow::ensure!(passes < 200, "reads never saw the kill");
            }
            Ok(passes)
        });
        std::thread::sleep(Duration::from_millis(800));
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(cluster.servers[3].id() as i32, libc::SIGKILL) };
        killed.store(true, Ordering::SeqCst);
        reader.join().expect("reader thread")?;
        Ok(())
    })?;
    cluster.kill_server(3)?;
    Cluster::wait_status(&mut watch, Duration::from_secs(90), |st| {
        alive(st) == 3 && settled(st)
    })?;
    verify_files(&mut w, &files)?;
    Ok(())
}

fn used(w: &mut Worker) -> Result<u64> {
    Ok(w.ok(&json!({"cmd": "usage"}))?["used"]
        .as_u64()
        .unwrap_or(u64::MAX))
}

/// Deleted files' stripes are dropped by the servers holding their inodes, on every node and
/// copy, also while a server that held some of them is dead (the drop gets around it once it
/// is out of the table).
#[test]
fn deleted_files_give_their_space_back_on_every_copy_also_past_a_dead_server() -> Result<()> {
    let mut cluster = Cluster::start(&spec(4, 2))?;
    let (mut w, mut watch) = (cluster.worker()?, cluster.worker()?);
    watch.ok(&json!({"cmd": "status"}))?;
    let empty = used(&mut w)?;
    w.ok(&json!({"cmd": "mkdir", "path": "/p"}))?;
    let files: Vec<_> = (0..150u64)
        .map(|k| {
            (
                format!("/p/f{k}"),
                if k % 50 == 0 { 5 * MIB } else { 100_000 + k },
                k,
            )
        })
        .collect();
    for (path, len, seed) in &files {
        write(&mut w, path, *len, *seed)?;
    }
    let total: u64 = files.iter().map(|f| f.1).sum();
    let deadline = Instant::now() + Duration::from_secs(20);
    while used(&mut w)? < empty + 2 * total && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        used(&mut w)? >= empty + 2 * total,
        "two copies of everything"
    );
    // Half of them go while every server is up, half right after one died.
    for (path, _, _) in &files[..75] {
        w.ok(&json!({"cmd": "unlink", "path": path}))?;
    }
    cluster.kill_server(2)?;
    for (path, _, _) in &files[75..] {
        w.ok(&json!({"cmd": "unlink", "path": path}))?;
    }
    Cluster::wait_status(&mut watch, Duration::from_secs(90), |st| {
        alive(st) == 3 && settled(st)
    })?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut now = used(&mut w)?;
    while now > empty + MIB && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        now = used(&mut w)?;
    }
    assert!(
        now <= empty + MIB,
        "space of deleted files still held: {now} bytes against {empty} before the writes"
    );
    Ok(())
}

#[test]
fn a_single_copy_lost_with_its_server_reads_as_eio() -> Result<()> {
    let mut cluster = Cluster::start(&spec(3, 1))?;
    let (mut w, mut watch) = (cluster.worker()?, cluster.worker()?);
    // Workers connect on their first command: this one must be connected before the loss.
    watch.ok(&json!({"cmd": "status"}))?;
    let files: Vec<_> = (0..48u64)
        .map(|k| (format!("/s{k}"), 200_000 + k, k))
        .collect();
    for (path, len, seed) in &files {
        write(&mut w, path, *len, *seed)?;
    }
    cluster.kill_server(1)?;
    // Its partitions are lost once the manager has re-planned without it.
    Cluster::wait_status(&mut watch, Duration::from_secs(30), |st| {
        alive(st) == 2 && st["lost"].as_u64().unwrap_or(0) > 0
    })?;
    let started = Instant::now();
    let (mut good, mut eio) = (0, 0);
    for (path, len, seed) in &files {
        let v = w.call(&json!({"cmd": "read_file", "path": path}))?;
        if v["ok"] == true {
            assert_eq!(
                v["hash"],
                digest(&pattern(*seed, 0, *len as usize)),
                "{path}"
            );
            good += 1;
        } else {
            assert_eq!(v["errno"], EIO, "{path}: {v}");
            eio += 1;
        }
    }
    assert!(eio > 0, "no file lost a stripe ({good} read back)");
    // Clear errors, not waits for a server that is gone.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    Ok(())
}

#[test]
fn reads_move_away_from_a_slow_replica() -> Result<()> {
    let mut spec = spec(4, 2);
    spec.server_args = vec![(0, vec!["--fault-delay".into(), "30ms".into()])];
    let cluster = Cluster::start(&spec)?;
    let (mut w, mut watch) = (cluster.worker()?, cluster.worker()?);
    write(&mut w, "/big", 48 * MIB, 9)?;
    let before = Cluster::wait_status(&mut watch, Duration::from_secs(5), |_| true)?;
    for _ in 0..2 {
        verify_files(&mut w, &[("/big".into(), 48 * MIB, 9)])?;
    }
    // Heartbeats carry the counters every 500 ms.
    std::thread::sleep(Duration::from_millis(1200));
    let after = Cluster::wait_status(&mut watch, Duration::from_secs(5), |_| true)?;
    let read_by = |st: &Value, slow: bool| -> u64 {
        st["nodes"].as_array().map_or(0, |n| {
            n.iter()
                .filter(|n| n["addr"].as_str().unwrap_or("").starts_with("127.0.0.2:") == slow)
                .map(|n| n["bytes_read"].as_u64().unwrap_or(0))
                .sum()
        })
    };
    let slow = read_by(&after, true) - read_by(&before, true);
    let rest = read_by(&after, false) - read_by(&before, false);
    // Without replica choice the slow node would serve about a quarter of the bytes.
    assert!(
        slow * 10 < slow + rest,
        "the slow node served {slow} of {} bytes",
        slow + rest
    );
    Ok(())
}
