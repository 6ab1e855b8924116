//! Integration tests: a manager and several servers as real processes on 127.0.0.x, driven by
//! clients in separate processes (`tessera-worker`), checked against in-memory models.

use anyhow::Result;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::time::{Duration, Instant};
use tessera_client::{
    Client, ClientOptions, Lane, Notice, NoticeSink, OpenOptions, SetAttr, RECALL_PATIENCE,
};
use tessera_testkit::{digest, held_memory, pattern, Cluster, ClusterSpec, Worker};

const MIB: u64 = 1 << 20;
const ROOT: u64 = 1;
const ENOENT: i32 = 2;
const EACCES: i32 = 13;
const EISDIR: i32 = 21;
const EINVAL: i32 = 22;
const ENOSPC: i32 = 28;
const ENOTEMPTY: i32 = 39;

fn read_hash(w: &mut Worker, path: &str) -> Result<(u64, String)> {
    let v = w.ok(&json!({"cmd": "read_file", "path": path}))?;
    Ok((
        v["len"].as_u64().unwrap_or(u64::MAX),
        v["hash"].as_str().unwrap_or("").to_string(),
    ))
}

#[test]
fn files_of_edge_sizes_round_trip_between_processes() -> Result<()> {
    let cluster = Cluster::start(&ClusterSpec::default())?;
    let (mut writer, mut reader) = (cluster.worker()?, cluster.worker()?);
    for (i, size) in [0, 1, MIB - 1, MIB, MIB + 1, 100 * MIB]
        .into_iter()
        .enumerate()
    {
        let path = format!("/size-{size}");
        // Odd-sized writes exercise the aggregation of small writes into stripes.
        writer.ok(
            &json!({"cmd": "write_file", "path": path, "len": size, "seed": i, "chunk": 300_001}),
        )?;
        let (len, hash) = read_hash(&mut reader, &path)?;
        assert_eq!(len, size, "{path}");
        assert_eq!(hash, digest(&pattern(i as u64, 0, size as usize)), "{path}");
        assert_eq!(
            reader.ok(&json!({"cmd": "stat", "path": path}))?["size"],
            size
        );
    }
    Ok(())
}

#[test]
fn random_overlapping_writes_and_truncates_match_a_model() -> Result<()> {
    let cluster = Cluster::start(&ClusterSpec::default())?;
    let mut w = cluster.worker()?;
    let h = w.ok(&json!({"cmd": "open", "path": "/model", "create": true, "write": true}))?
        ["handle"]
        .clone();
    let mut rng = StdRng::seed_from_u64(0x7e55e7a);
    let mut model: Vec<u8> = Vec::new();
    for i in 0..400u64 {
        match rng.gen_range(0..10) {
            0..=5 => {
                let off = rng.gen_range(0..6 * MIB);
                let max_len = if rng.gen_bool(0.5) { 4096 } else { 3 * MIB };
                let len = rng.gen_range(1..max_len) as usize;
                w.ok(&json!({"cmd": "write", "handle": h, "offset": off, "len": len, "seed": i}))?;
                let end = off as usize + len;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&pattern(i, off, len));
            }
            6 => {
                let size = rng.gen_range(0..7 * MIB) as usize;
                w.ok(&json!({"cmd": "truncate", "handle": h, "size": size}))?;
                model.resize(size, 0);
            }
            _ => {
                let off = rng.gen_range(0..8 * MIB) as usize;
                let len = rng.gen_range(0..3 * MIB) as usize;
                let v = w.ok(&json!({"cmd": "read", "handle": h, "offset": off, "len": len}))?;
                let want = &model[off.min(model.len())..(off + len).min(model.len())];
                assert_eq!(v["len"], want.len(), "read {off}+{len} after op {i}");
                assert_eq!(v["hash"], digest(want), "read {off}+{len} after op {i}");
            }
        }
    }
    w.ok(&json!({"cmd": "close", "handle": h}))?;
    let (len, hash) = read_hash(&mut cluster.worker()?, "/model")?;
    assert_eq!((len, hash), (model.len() as u64, digest(&model)));
    Ok(())
}

#[test]
fn four_processes_write_one_file() -> Result<()> {
    let cluster = Cluster::start(&ClusterSpec::default())?;
    const BLOCK: u64 = 256 << 10;
    const BLOCKS: u64 = 96;
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..4u64)
            .map(|k| {
                let cluster = &cluster;
                s.spawn(move || -> Result<()> {
                    let mut w = cluster.worker()?;
                    let h = w.ok(&json!({"cmd": "open", "path": "/n-to-1", "create": true, "write": true}))?["handle"].clone();
                    for b in (k..BLOCKS).step_by(4) {
                        w.ok(&json!({"cmd": "write", "handle": h, "offset": b * BLOCK, "len": BLOCK, "seed": k}))?;
                    }
                    w.ok(&json!({"cmd": "close", "handle": h}))?;
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("writer thread")?;
        }
        Ok(())
    })?;
    let mut want = Vec::with_capacity((BLOCKS * BLOCK) as usize);
    for b in 0..BLOCKS {
        want.extend(pattern(b % 4, b * BLOCK, BLOCK as usize));
    }
    let (len, hash) = read_hash(&mut cluster.worker()?, "/n-to-1")?;
    assert_eq!(len, BLOCKS * BLOCK, "size is the largest extent written");
    assert_eq!(hash, digest(&want));
    Ok(())
}

fn used(w: &mut Worker) -> Result<u64> {
    Ok(w.ok(&json!({"cmd": "usage"}))?["used"]
        .as_u64()
        .unwrap_or(0))
}

/// Waits until the bytes in use, as the servers report them in their heartbeats, satisfy `ok`
/// (or 20 s pass); returns the last figure.
fn wait_used(w: &mut Worker, ok: impl Fn(u64) -> bool) -> Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let u = used(w)?;
        if ok(u) || Instant::now() > deadline {
            return Ok(u);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn unlinked_file_lives_until_its_last_close() -> Result<()> {
    let cluster = Cluster::start(&ClusterSpec::default())?;
    let (mut a, mut b) = (cluster.worker()?, cluster.worker()?);
    a.ok(&json!({"cmd": "write_file", "path": "/tmpfile", "len": 8 * MIB, "seed": 1}))?;
    let h = a.ok(&json!({"cmd": "open", "path": "/tmpfile", "write": true}))?["handle"].clone();
    b.ok(&json!({"cmd": "unlink", "path": "/tmpfile"}))?;
    b.fails(&json!({"cmd": "stat", "path": "/tmpfile"}), ENOENT)?;
    // The open handle still reads and writes the data.
    let v = a.ok(&json!({"cmd": "read", "handle": h, "offset": 0, "len": 8 * MIB}))?;
    assert_eq!(v["hash"], digest(&pattern(1, 0, (8 * MIB) as usize)));
    a.ok(&json!({"cmd": "write", "handle": h, "offset": MIB, "len": 100, "seed": 2}))?;
    let v = a.ok(&json!({"cmd": "read", "handle": h, "offset": MIB, "len": 100}))?;
    assert_eq!(v["hash"], digest(&pattern(2, MIB, 100)));
    let before = wait_used(&mut b, |u| u >= 8 * MIB)?;
    assert!(before >= 8 * MIB, "the data is still held: {before}");
    a.ok(&json!({"cmd": "close", "handle": h}))?;
    let after = wait_used(&mut b, |u| u < 8 * MIB)?;
    assert!(
        after < 8 * MIB,
        "the last close freed the data: {before} -> {after}"
    );
    Ok(())
}

#[test]
fn a_server_gives_back_the_memory_of_removed_files() -> Result<()> {
    let cluster = Cluster::start(&ClusterSpec {
        servers: 1,
        ..ClusterSpec::default()
    })?;
    let pid = cluster.servers[0].id();
    let mut w = cluster.worker()?;
    let base = held_memory(pid)?;
    w.ok(&json!({"cmd": "write_file", "path": "/big", "len": 512 * MIB, "seed": 3}))?;
    let full = held_memory(pid)?;
    assert!(
        full >= base + 400 * MIB,
        "the file is in the server's memory: {base} -> {full}"
    );
    w.ok(&json!({"cmd": "unlink", "path": "/big"}))?;
    // Freed pages go back within a second or two, the idle write buffers after two quiet
    // spells of the pool (5 s each). They go back lazily: the process stays as large until
    // the kernel needs them.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let now = held_memory(pid)?;
        if now < base + 100 * MIB {
            return Ok(());
        }
        assert!(
            Instant::now() < deadline,
            "the server kept the memory of the removed file: {base} -> {full} -> {now}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn rename_within_and_across_directories() -> Result<()> {
    let cluster = Cluster::start(&ClusterSpec::default())?;
    let (mut w, mut other) = (cluster.worker()?, cluster.worker()?);
    for d in ["/d1", "/d2"] {
        w.ok(&json!({"cmd": "mkdir", "path": d}))?;
    }
    w.ok(&json!({"cmd": "write_file", "path": "/d1/x", "len": 3 * MIB, "seed": 10}))?;
    w.ok(&json!({"cmd": "write_file", "path": "/d2/z", "len": 2 * MIB, "seed": 11}))?;
    w.ok(&json!({"cmd": "rename", "from": "/d1/x", "to": "/d2/y"}))?;
    other.fails(&json!({"cmd": "stat", "path": "/d1/x"}), ENOENT)?;
    assert_eq!(
        read_hash(&mut other, "/d2/y")?.1,
        digest(&pattern(10, 0, (3 * MIB) as usize))
    );
    // Over an existing file: the target is replaced atomically (same directory).
    w.ok(&json!({"cmd": "rename", "from": "/d2/y", "to": "/d2/z"}))?;
    assert_eq!(
        other.ok(&json!({"cmd": "readdir", "path": "/d2"}))?["names"],
        json!(["z"])
    );
    assert_eq!(
        read_hash(&mut other, "/d2/z")?.1,
        digest(&pattern(10, 0, (3 * MIB) as usize))
    );
    // A directory moves with its contents; it cannot move into itself.
    w.ok(&json!({"cmd": "rename", "from": "/d2", "to": "/d1/sub"}))?;
    assert_eq!(
        other.ok(&json!({"cmd": "readdir", "path": "/d1"}))?["names"],
        json!(["sub"])
    );
    assert_eq!(read_hash(&mut other, "/d1/sub/z")?.0, 3 * MIB);
    w.fails(
        &json!({"cmd": "rename", "from": "/d1", "to": "/d1/sub/inner"}),
        EINVAL,
    )?;
    w.fails(&json!({"cmd": "rmdir", "path": "/d1"}), ENOTEMPTY)?;
    // Hard links share data; the data outlives one name.
    w.ok(&json!({"cmd": "link", "from": "/d1/sub/z", "to": "/alias"}))?;
    assert_eq!(
        other.ok(&json!({"cmd": "stat", "path": "/alias"}))?["nlink"],
        2
    );
    w.ok(&json!({"cmd": "unlink", "path": "/d1/sub/z"}))?;
    assert_eq!(read_hash(&mut other, "/alias")?.0, 3 * MIB);
    // Within a directory over a file with data: the old file and its data go in the same
    // step (a temporary file renamed over its target, as editors and tools save).
    let before = used(&mut w)?;
    w.ok(&json!({"cmd": "write_file", "path": "/d1/new", "len": MIB, "seed": 12}))?;
    w.ok(&json!({"cmd": "write_file", "path": "/d1/old", "len": 4 * MIB, "seed": 13}))?;
    w.ok(&json!({"cmd": "rename", "from": "/d1/new", "to": "/d1/old"}))?;
    assert_eq!(
        read_hash(&mut other, "/d1/old")?.1,
        digest(&pattern(12, 0, MIB as usize))
    );
    let after = wait_used(&mut w, |u| u < before + 2 * MIB)?;
    assert!(
        after < before + 2 * MIB,
        "4 MiB replaced still held: {after}"
    );
    // A directory over a directory: only an empty one.
    for d in ["/e1", "/e2"] {
        w.ok(&json!({"cmd": "mkdir", "path": d}))?;
    }
    w.ok(&json!({"cmd": "write_file", "path": "/e2/f", "len": 1, "seed": 14}))?;
    w.fails(
        &json!({"cmd": "rename", "from": "/e1", "to": "/e2"}),
        ENOTEMPTY,
    )?;
    w.fails(
        &json!({"cmd": "rename", "from": "/d1/old", "to": "/e2"}),
        EISDIR,
    )?;
    w.ok(&json!({"cmd": "unlink", "path": "/e2/f"}))?;
    w.ok(&json!({"cmd": "rename", "from": "/e1", "to": "/e2"}))?;
    other.fails(&json!({"cmd": "stat", "path": "/e1"}), ENOENT)?;
    assert_eq!(
        other.ok(&json!({"cmd": "readdir", "path": "/e2"}))?["names"],
        json!([])
    );
    Ok(())
}

#[test]
fn full_cluster_says_enospc_and_keeps_existing_files() -> Result<()> {
    let spec = ClusterSpec {
        memory: "24MiB".into(),
        ..ClusterSpec::default()
    };
    let cluster = Cluster::start(&spec)?;
    let mut w = cluster.worker()?;
    w.ok(&json!({"cmd": "write_file", "path": "/keep", "len": 8 * MIB, "seed": 5}))?;
    w.fails(
        &json!({"cmd": "write_file", "path": "/big", "len": 200 * MIB, "seed": 6}),
        ENOSPC,
    )?;
    assert_eq!(
        read_hash(&mut w, "/keep")?.1,
        digest(&pattern(5, 0, (8 * MIB) as usize))
    );
    w.ok(&json!({"cmd": "unlink", "path": "/big"}))?;
    // At once, as a program that removes files to make room does: the space comes back a
    // moment after the unlink (the stripes are dropped in the background), and a write
    // refused meanwhile waits for it.
    w.ok(&json!({"cmd": "write_file", "path": "/again", "len": 8 * MIB, "seed": 7}))?;
    assert_eq!(
        read_hash(&mut w, "/again")?.1,
        digest(&pattern(7, 0, (8 * MIB) as usize))
    );
    Ok(())
}

#[test]
fn wrong_secret_is_refused() -> Result<()> {
    let cluster = Cluster::start(&ClusterSpec {
        servers: 1,
        ..ClusterSpec::default()
    })?;
    let mut w = Worker::spawn(cluster.manager, "not-the-secret")?;
    let v = w.call(&json!({"cmd": "stat", "path": "/"}))?;
    assert_eq!(v["ok"], false);
    assert_eq!(v["errno"], EACCES);
    assert!(v["error"].as_str().unwrap_or("").contains("secret"), "{v}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_close_only_their_connection() -> Result<()> {
    use tessera_proto::{auth::client_handshake, frame, Secret};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    let cluster = tokio::task::spawn_blocking(|| Cluster::start(&ClusterSpec::default())).await??;
    let server = cluster.status().await?.nodes[0].addr;
    let bad_frames: Vec<Vec<u8>> = vec![
        frame::encode_head(1, frame::FrameKind::Request, &[0xff; 5], 0)?, // undecodable header
        {
            let mut f = frame::encode_head(1, frame::FrameKind::Request, &[], 0)?;
            f[12] = 7; // unknown kind
            f
        },
        u32::MAX.to_le_bytes().to_vec(), // absurd length
    ];
    for bad in &bad_frames {
        let mut s = TcpStream::connect(server).await?;
        client_handshake(&mut s, &Secret::new(&cluster.secret)).await?;
        s.write_all(bad).await?;
        s.write_all(&[0u8; 64]).await?;
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await??;
        assert_eq!(n, 0, "the server closed the connection");
    }
    // Garbage before any handshake.
    let mut s = TcpStream::connect(server).await?;
    s.write_all(&[0x42; 100]).await?;
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await?;
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    // Everyone else is unharmed.
    tokio::task::spawn_blocking(move || -> Result<()> {
        let mut w = cluster.worker()?;
        w.ok(&json!({"cmd": "write_file", "path": "/after", "len": 5 * MIB, "seed": 9}))?;
        assert_eq!(
            read_hash(&mut w, "/after")?.1,
            digest(&pattern(9, 0, (5 * MIB) as usize))
        );
        Ok(())
    })
    .await??;
    Ok(())
}

/// A client subscribed to notices (what it hears), and another client, of `cluster`.
async fn subscribed(
    cluster: &Cluster,
) -> Result<(Client, Client, std::sync::mpsc::Receiver<Notice>)> {
    let opts = || ClientOptions::new(cluster.manager, &cluster.secret);
    let (watcher, other) = (
        Client::connect(opts()).await?,
        Client::connect(opts()).await?,
    );
    let (tx, heard) = std::sync::mpsc::channel();
    watcher.subscribe(NoticeSink::new(move |n| {
        let _ = tx.send(n);
    }))?;
    Ok((watcher, other, heard))
}

/// Waits up to 30 s for a notice `wanted` accepts, failing on one `unwanted` accepts first.
fn hear(
    heard: &std::sync::mpsc::Receiver<Notice>,
    wanted: impl Fn(&Notice) -> bool,
    unwanted: impl Fn(&Notice) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match heard.recv_timeout(left) {
            Ok(n) if wanted(&n) => return,
            Ok(n) => assert!(!unwanted(&n), "unexpected {n:?}"),
            Err(e) => panic!("the notice did not come: {e}"),
        }
    }
}

/// A lane (blocking threads' own connections, as the FUSE workers keep) carries lookups, and
/// the promises its answers make reach the client's subscribed connection: a name looked up
/// absent through a lane is told when another client creates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_on_a_lane_are_promised_to_the_subscribed_connection() -> Result<()> {
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(&ClusterSpec::default())).await??;
    let (watcher, other, heard) = subscribed(&cluster).await?;
    let (rt, c) = (tokio::runtime::Handle::current(), watcher.clone());
    let (lane, absent) = tokio::task::spawn_blocking(move || {
        let lane = Lane::new();
        let absent = lane.block_on(&rt, c.on_lane(&lane).lookup(ROOT, b"late"));
        (lane, absent)
    })
    .await?;
    assert!(
        absent.as_ref().is_err_and(|e| e.errno() == ENOENT),
        "{absent:?}"
    );
    assert_eq!(lane.connections(), 1, "the lookup went out on the lane");

    other.create_dir("/late").await?;
    let late = |n: &Notice| matches!(n, Notice::Entry { dir: ROOT, name } if name == b"late");
    hear(&heard, late, |_| false);
    Ok(())
}

/// Random reads of stripes without mirrors go out on the reading thread's lane, and read what
/// was written there, holes as zeros.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_reads_on_a_lane_read_the_file() -> Result<()> {
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(&ClusterSpec::default())).await??;
    let c = Client::connect(ClientOptions::new(cluster.manager, &cluster.secret)).await?;
    // 16 stripes, the second half of each a hole: all on the inode's server has odds 3^-16.
    let stripes = 16u64;
    let data = pattern(3, 0, (stripes * MIB) as usize);
    let mut f = c.open("/r", &OpenOptions::create()).await?;
    for s in 0..stripes {
        let at = (s * MIB) as usize;
        f.write_at(at as u64, &data[at..at + (MIB / 2) as usize])
            .await?;
    }
    f.set_len(stripes * MIB).await?;
    f.close().await?;
    let rt = tokio::runtime::Handle::current();
    let (lane, reads) = tokio::task::spawn_blocking(move || {
        let lane = Lane::new();
        let c = c.on_lane(&lane);
        let mut rng = StdRng::seed_from_u64(11);
        let reads = lane.block_on(&rt, async move {
            let mut f = c.open("/r", &OpenOptions::read()).await?;
            let mut reads = Vec::new();
            for _ in 0..200 {
                let at = rng.gen_range(0..stripes * MIB - 1);
                let len = rng.gen_range(1..=(stripes * MIB - at).min(300_000)) as usize;
                reads.push((at, f.read_at(at, len).await?));
            }
            f.close().await?;
            Ok::<_, tessera_client::Error>(reads)
        });
        (lane, reads)
    })
    .await?;
    for (at, got) in reads? {
        let want: Vec<u8> = (at..at + got.len() as u64)
            .map(|i| {
                if i % MIB < MIB / 2 {
                    data[i as usize]
                } else {
                    0
                }
            })
            .collect();
        assert!(got[..] == want[..], "{} bytes at {at}", got.len());
    }
    assert!(lane.connections() > 1, "the reads went out on the lane");
    Ok(())
}

/// A directory a subscribed client made is promised complete: the names it adds itself tell
/// it nothing, the first name another client adds recalls the promise (`Notice::Listing`)
/// and waits until it is given back (`relinquish`), and so does the directory's removal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_made_is_complete_until_another_client_adds_a_name() -> Result<()> {
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(&ClusterSpec::default())).await??;
    let (watcher, other, heard) = subscribed(&cluster).await?;
    let dir = watcher.mkdir(ROOT, b"made", 0o755).await?.ino;
    let listing = move |n: &Notice| *n == Notice::Listing { dir };
    watcher.symlink(dir, b"mine", b"t").await?;
    // Its own name ended nothing: a notice from the same server comes first.
    watcher.getattr(dir).await?;
    let chmod = SetAttr {
        mode: Some(0o700),
        ..SetAttr::default()
    };
    other.setattr(dir, chmod).await?;
    hear(&heard, |n| *n == Notice::Attr { ino: dir }, listing);
    let theirs = tokio::spawn({
        let other = other.clone();
        async move { other.symlink_path("t", "/made/theirs").await }
    });
    hear(&heard, listing, |_| false);
    // The holder may have answered creates there that are still on their way: the other
    // client's name waits for the promise to come back.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!theirs.is_finished(), "added before the promise came back");
    watcher.relinquish(dir).await?;
    theirs.await??;
    assert!(watcher.lookup(dir, b"theirs").await.is_ok());

    // A holder that never gives it back is waited for only so long.
    let hung = watcher.mkdir(ROOT, b"hung", 0o755).await?.ino;
    let started = Instant::now();
    other.symlink_path("t", "/hung/theirs").await?;
    assert!(
        started.elapsed() >= RECALL_PATIENCE / 2,
        "the holder was not waited for"
    );
    hear(&heard, |n| *n == Notice::Listing { dir: hung }, |_| false);

    let gone = watcher.mkdir(ROOT, b"gone", 0o755).await?.ino;
    watcher.rmdir(ROOT, b"gone").await?;
    hear(&heard, |n| *n == Notice::Listing { dir: gone }, |_| false);
    Ok(())
}

/// A server that stops being a partition's primary (a new server took it) tells the clients
/// it made promises to there to forget them: the new primary does not know of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promises_are_dropped_with_the_partitions_a_new_server_takes() -> Result<()> {
    let mut cluster =
        tokio::task::spawn_blocking(|| Cluster::start(&ClusterSpec::default())).await??;
    let (watcher, _other, heard) = subscribed(&cluster).await?;
    // Promises in many partitions: some will move.
    for i in 0..64 {
        watcher
            .mkdir(ROOT, format!("d{i}").as_bytes(), 0o755)
            .await?;
    }
    let cluster = tokio::task::spawn_blocking(move || -> Result<Cluster> {
        cluster.add_server()?;
        Ok(cluster)
    })
    .await??;
    // The watcher sends nothing meanwhile, so only a server can tell it.
    hear(&heard, |n| *n == Notice::Reset, |_| false);
    drop(cluster);
    Ok(())
}

/// Small files closed on a lane (a FUSE worker's close) send their one stripe write there,
/// beside the size: every byte reads back elsewhere, also after a second write and flush
/// through the same handle, and for a file past the lane's size limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_files_closed_on_a_lane_read_back_elsewhere() -> Result<()> {
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(&ClusterSpec::default())).await??;
    let opts = || ClientOptions::new(cluster.manager, &cluster.secret);
    let (writer, reader) = (
        Client::connect(opts()).await?,
        Client::connect(opts()).await?,
    );
    let sizes: Vec<usize> = (0..48).map(|k| 1 + k * 1500).chain([100 << 10]).collect();
    let rt = tokio::runtime::Handle::current();
    let (lane, written) = {
        let sizes = sizes.clone();
        tokio::task::spawn_blocking(move || {
            let lane = Lane::new();
            let writer = writer.on_lane(&lane);
            let written = lane.block_on(&rt, async move {
                for (k, &len) in sizes.iter().enumerate() {
                    let data = pattern(k as u64, 0, len);
                    let mut f = writer
                        .open(&format!("/small{k}"), &OpenOptions::create())
                        .await?;
                    f.write_at(0, &data).await?;
                    f.flush().await?;
                    // A second write and flush through the same handle, at an offset.
                    f.write_at(len as u64 + 10, b"tail").await?;
                    f.close().await?;
                }
                Ok::<_, tessera_client::Error>(())
            });
            (lane, written)
        })
        .await?
    };
    written?;
    for (k, &len) in sizes.iter().enumerate() {
        let mut want = pattern(k as u64, 0, len);
        want.extend_from_slice(&[0; 10]);
        want.extend_from_slice(b"tail");
        let got = reader.read(&format!("/small{k}")).await?;
        assert!(got[..] == want[..], "file {k} of {len} bytes");
    }
    assert!(lane.connections() > 1, "the closes went out on the lane");
    Ok(())
}

/// A file created ahead of its request takes the writes that stay in its buffer before the
/// request is in (`File::buffers`); they reach the servers at its close, after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_created_ahead_buffers_writes_until_it_is_made() -> Result<()> {
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(&ClusterSpec::default())).await??;
    let opts = || ClientOptions::new(cluster.manager, &cluster.secret);
    let (writer, reader) = (
        Client::connect(opts()).await?,
        Client::connect(opts()).await?,
    );
    let (mut f, made) = writer.create_ahead(ROOT, b"early", 0o644, &OpenOptions::create())?;
    let head = pattern(1, 0, 100);
    assert!(f.buffers(0, head.len()));
    f.write_at(0, &head).await?;
    assert!(f.buffers(100, 50), "a write that follows on stays");
    assert!(!f.buffers(300, 10), "a gap sends what is buffered");
    assert!(
        !f.buffers(100, 64 << 20),
        "a write to the stripe's end sends it"
    );
    assert!(
        reader.lookup(ROOT, b"early").await.is_err(),
        "made before its request"
    );
    made.await?;
    f.write_at(100, b"tail").await?;
    f.close().await?;
    let mut want = head;
    want.extend_from_slice(b"tail");
    assert!(reader.read("/early").await?[..] == want[..]);
    Ok(())
}
