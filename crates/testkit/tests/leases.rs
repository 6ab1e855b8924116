//! Clients that die do not leak (issue 29): open handles are held under client leases, so a
//! client process killed with an unlinked file open no longer keeps the file's memory once its
//! lease runs out, and one that was only stopped finds its handles closed when it wakes. And
//! `tessera fsck` finds and reclaims an inode no name reaches, leaving a healthy cluster alone.

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use std::time::Duration;
use tessera_proto::{Op, Response, Timespec};
use tessera_testkit::{digest, pattern, wait_until, Cluster, ClusterSpec, Raw, Worker};

const MIB: u64 = 1 << 20;
const EIO: i32 = 5;
/// Short, so that the tests are quick: clients renew every third of it.
const LEASE: &str = "1s";
/// Long enough for a lease to run out and the servers to report it, on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// `servers` servers, two copies of everything: the handles are let go on both copies.
fn cluster_of(servers: usize) -> Result<Cluster> {
    Cluster::start(&ClusterSpec {
        servers,
        replication: 2,
        memory: "256MiB".into(),
        partitions: 32,
        manager_args: ["--open-lease", LEASE, "--dead-after", "1s"]
            .map(String::from)
            .to_vec(),
        ..ClusterSpec::default()
    })
}

fn cluster() -> Result<Cluster> {
    cluster_of(2)
}

/// Bytes the live servers hold, as their last heartbeats report them.
fn used(w: &mut Worker) -> Result<u64> {
    w.ok(&json!({"cmd": "usage"}))?["used"]
        .as_u64()
        .context("usage without used")
}

/// A worker holding `path` open after writing `len` bytes to it (published by an fsync), and
/// its handle.
fn holder(c: &Cluster, path: &str, len: u64) -> Result<(Worker, Value)> {
    let mut w = c.worker()?;
    let open = json!({"cmd": "open", "path": path, "write": true, "create": true});
    let h = w.ok(&open)?["handle"].clone();
    w.ok(&json!({"cmd": "write", "handle": h, "offset": 0, "len": len, "seed": 3}))?;
    w.ok(&json!({"cmd": "fsync", "handle": h}))?;
    Ok((w, h))
}

#[test]
fn a_killed_client_no_longer_keeps_an_unlinked_file() -> Result<()> {
    let c = cluster()?;
    let mut other = c.worker()?;
    let before = used(&mut other)?;
    let (held, _) = holder(&c, "/held", 16 * MIB)?;
    other.ok(&json!({"cmd": "unlink", "path": "/held"}))?;
    // Several lease periods: the living holder renews, the file stays.
    std::thread::sleep(Duration::from_secs(4));
    let kept = used(&mut other)?;
    ensure!(
        kept >= before + 2 * 16 * MIB,
        "an unlinked file open in a live client is kept ({before} -> {kept} bytes)"
    );
    drop(held); // SIGKILL
    wait_until(PATIENCE, || {
        used(&mut other).is_ok_and(|u| u < before + 16 * MIB)
    })
    .context("the killed client's file was not deleted after its lease ran out")?;
    Ok(())
}

#[test]
fn a_client_stopped_past_its_lease_finds_its_handles_closed() -> Result<()> {
    let c = cluster()?;
    let mut other = c.worker()?;
    let before = used(&mut other)?;
    let (mut held, h) = holder(&c, "/stopped", 8 * MIB)?;
    let open = json!({"cmd": "open", "path": "/kept", "write": true, "create": true});
    let h2 = held.ok(&open)?["handle"].clone();
    other.ok(&json!({"cmd": "unlink", "path": "/stopped"}))?;
    wait_until(PATIENCE, || {
        used(&mut other).is_ok_and(|u| u >= before + 2 * 8 * MIB)
    })
    .context("the servers never reported the file")?;
    held.signal(libc::SIGSTOP);
    let freed = wait_until(PATIENCE, || {
        used(&mut other).is_ok_and(|u| u < before + 8 * MIB)
    });
    held.signal(libc::SIGCONT);
    freed.context("the stopped client's file was not deleted after its lease ran out")?;
    // Once it renews, it learns its lease ran out: its handles fail, also that of a file that
    // still has its name, and the late closes change nothing.
    let read = json!({"cmd": "read", "handle": h, "offset": 0, "len": 4096});
    wait_until(PATIENCE, || {
        held.call(&read).is_ok_and(|v| v["errno"] == EIO)
    })
    .context("a handle of an expired lease still reads")?;
    held.fails(&json!({"cmd": "fsync", "handle": h2}), EIO)?;
    held.fails(&json!({"cmd": "close", "handle": h}), EIO)?;
    held.fails(&json!({"cmd": "close", "handle": h2}), EIO)?;
    // New opens carry a new lease and work.
    let again = json!({"cmd": "open", "path": "/kept", "write": true});
    let h3 = held.ok(&again)?["handle"].clone();
    held.ok(&json!({"cmd": "write", "handle": h3, "offset": 0, "len": 100, "seed": 1}))?;
    held.ok(&json!({"cmd": "close", "handle": h3}))?;
    let st = other.ok(&json!({"cmd": "stat", "path": "/kept"}))?;
    ensure!(st["size"] == 100, "{st}");
    ensure!(used(&mut other)? < before + 8 * MIB, "nothing came back");
    Ok(())
}

/// The index of the server that is primary of `ino`'s partition.
fn primary_of(c: &Cluster, ino: u64) -> Result<usize> {
    let rt = tokio::runtime::Runtime::new()?;
    let raw = rt.block_on(Raw::connect(c.manager, &c.secret))?;
    let info = raw.info();
    let p = tessera_placement::meta_partition(ino, info.config.partitions);
    let node = info
        .table
        .primary(p)
        .context("a partition without replicas")?;
    let addr = info
        .nodes
        .iter()
        .find(|n| n.id == node)
        .context("no address")?;
    match addr.addr.ip() {
        // Server i listens on 127.0.0.(i+2).
        std::net::IpAddr::V4(ip) => Ok(usize::from(ip.octets()[3]) - 2),
        ip => anyhow::bail!("a server on {ip}"),
    }
}

#[test]
fn open_handles_survive_the_loss_of_their_primary_and_expire_on_the_new_one() -> Result<()> {
    let mut c = cluster_of(3)?;
    let mut other = c.worker()?;
    let (mut held, h) = holder(&c, "/f", 8 * MIB)?;
    let ino = other.ok(&json!({"cmd": "stat", "path": "/f"}))?["ino"]
        .as_u64()
        .context("stat without ino")?;
    other.ok(&json!({"cmd": "unlink", "path": "/f"}))?;
    c.kill_server(primary_of(&c, ino)?)?;
    Cluster::wait_status(&mut other, PATIENCE, |st| {
        let alive = st["nodes"]
            .as_array()
            .map_or(0, |n| n.iter().filter(|n| n["alive"] == true).count());
        alive == 2 && st["degraded"] == 0 && st["incoming"] == 0
    })?;
    // Several lease periods on the new primary (and the rebuilt copy): the holder renews there.
    std::thread::sleep(Duration::from_secs(4));
    let at = 5 * MIB;
    let read = held.ok(&json!({"cmd": "read", "handle": h, "offset": at, "len": 4096}))?;
    ensure!(
        read["hash"] == digest(&pattern(3, at, 4096)),
        "the open, unlinked file lost its data: {read}"
    );
    let kept = used(&mut other)?;
    drop(held); // SIGKILL
    wait_until(PATIENCE, || {
        used(&mut other).is_ok_and(|u| u + 8 * MIB < kept)
    })
    .context("the new primary did not let the killed client's handle go")?;
    Ok(())
}

fn fsck(c: &Cluster, args: &[&str]) -> Result<Value> {
    let out = c.tessera(&[&["fsck", "--json"], args].concat())?;
    Ok(serde_json::from_str(&out)?)
}

#[test]
fn fsck_reclaims_an_inode_no_name_reaches_and_leaves_a_healthy_cluster_alone() -> Result<()> {
    let c = cluster()?;
    let mut w = c.worker()?;
    let base = used(&mut w)?;
    w.ok(&json!({"cmd": "mkdir", "path": "/d"}))?;
    for name in ["/d/a", "/d/b", "/orphan"] {
        w.ok(&json!({"cmd": "write_file", "path": name, "len": 4 * MIB, "seed": 1}))?;
    }
    let healthy = fsck(&c, &["--min-age", "1ms", "--repair"])?;
    ensure!(
        healthy["orphans"] == json!([]) && healthy["reclaimed"] == 0,
        "{healthy}"
    );
    ensure!(healthy["reachable"] == healthy["inodes"], "{healthy}");

    // A client that died in the middle of an unlink: the name is gone, the link is not. And
    // a directory made without its name.
    let rt = tokio::runtime::Runtime::new()?;
    let ino = w.ok(&json!({"cmd": "stat", "path": "/orphan"}))?["ino"]
        .as_u64()
        .context("stat without ino")?;
    rt.block_on(async {
        let mut raw = Raw::connect(c.manager, &c.secret).await?;
        let now = Timespec::now();
        let remove = Op::DirRemove {
            dir: tessera_placement::ROOT_INO,
            name: b"orphan".to_vec(),
            expect: Some(ino),
            want_dir: Some(false),
            mtime: now,
        };
        ensure!(matches!(raw.call(&remove).await?, Response::Entry(_)));
        let dir = tessera_proto::Inode::new(
            0x1234_5678,
            tessera_proto::FileKind::Dir,
            0o755,
            0,
            0,
            tessera_placement::ROOT_INO,
            Vec::new(),
        );
        let create = Op::InodeCreate { inode: dir };
        ensure!(raw.call(&create).await? == Response::Ok);
        Ok(())
    })?;
    // Three files of 4 MiB, two copies each.
    wait_until(PATIENCE, || {
        used(&mut w).is_ok_and(|u| u >= base + 3 * 2 * 4 * MIB)
    })
    .context("the servers never reported the files")?;

    let young = fsck(&c, &["--repair"])?;
    ensure!(
        young["orphans"] == json!([]) && young["young"] == 2,
        "too young to judge: {young}"
    );
    let found = fsck(&c, &["--min-age", "1ms"])?;
    ensure!(
        found["orphans"].as_array().map(Vec::len) == Some(2)
            && found["bytes"] == 4 * MIB
            && found["reclaimed"] == 0,
        "{found}"
    );
    let repaired = fsck(&c, &["--min-age", "1ms", "--repair"])?;
    ensure!(
        repaired["reclaimed"] == 2 && repaired["reclaimed_bytes"] == 4 * MIB,
        "{repaired}"
    );
    wait_until(PATIENCE, || {
        used(&mut w).is_ok_and(|u| u < base + 2 * 2 * 4 * MIB + 4 * MIB)
    })
    .context("the orphan's stripes were not dropped")?;
    let after = fsck(&c, &["--min-age", "1ms"])?;
    ensure!(
        after["orphans"] == json!([]) && after["reachable"] == after["inodes"],
        "{after}"
    );
    for name in ["/d/a", "/d/b"] {
        let st = w.ok(&json!({"cmd": "stat", "path": name}))?;
        ensure!(st["size"] == 4 * MIB, "{name}: {st}");
    }
    Ok(())
}
