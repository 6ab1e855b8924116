//! A full cluster: what a write that fails with ENOSPC leaves in its file (never bytes that
//! were not stored under the size), and that removing or cutting a file gives back every
//! stripe it ever wrote. Through the library (as `tessera cp` uses it), the CLI and the FUSE
//! mount (which needs root and /dev/fuse).

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use std::io::Write;
use std::os::fd::IntoRawFd;
use std::time::{Duration, Instant};
use tessera_testkit::{digest, held_memory, pattern, Cluster, ClusterSpec, Worker};

const MIB: u64 = 1 << 20;
const ENOSPC: i32 = 28;
/// More than the clusters below hold.
const TOO_MUCH: u64 = 512 * MIB;

/// Four servers of 64 MiB: full after a few hundred stripe writes.
fn small_cluster(replication: u8) -> Result<Cluster> {
    Cluster::start(&ClusterSpec {
        servers: 4,
        memory: "64MiB".into(),
        replication,
        ..ClusterSpec::default()
    })
}

/// Stripes and bytes the live servers hold, summed, as their last heartbeats report them.
fn stored(w: &mut Worker) -> Result<(u64, u64)> {
    let st = w.ok(&json!({"cmd": "status"}))?;
    let nodes = st["nodes"].as_array().context("status without nodes")?;
    let live = nodes.iter().filter(|n| n["alive"] == true);
    Ok(live.fold((0, 0), |(s, u), n| {
        (
            s + n["stripes"].as_u64().unwrap_or(0),
            u + n["used"].as_u64().unwrap_or(0),
        )
    }))
}

/// What the servers hold once it stopped changing: the same figures over several heartbeats.
fn settled(w: &mut Worker) -> Result<(u64, u64)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = stored(w)?;
    let mut since = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = stored(w)?;
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() > Duration::from_millis(1500) {
            return Ok(now);
        }
        ensure!(
            Instant::now() < deadline,
            "the servers' figures kept changing"
        );
    }
}

/// Waits until the servers hold `want` (stripes, bytes), for at most 30 s.
fn wait_stored(w: &mut Worker, want: (u64, u64), what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = stored(w)?;
        if now == want {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{what}: the servers hold (stripes, bytes) {now:?}, not {want:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn size(w: &mut Worker, path: &str) -> Result<u64> {
    w.ok(&json!({"cmd": "stat", "path": path}))?["size"]
        .as_u64()
        .context("stat without a size")
}

/// Every byte under the file's size is the pattern `seed` written there.
fn holds_pattern(w: &mut Worker, path: &str, seed: u64) -> Result<u64> {
    let len = size(w, path)?;
    let v = w.ok(&json!({"cmd": "read_file", "path": path}))?;
    ensure!(v["len"] == len, "{path}: read {} of {len} bytes", v["len"]);
    ensure!(
        v["hash"] == digest(&pattern(seed, 0, len as usize)),
        "{path}: the {len} bytes under its size are not those written"
    );
    Ok(len)
}

fn errno_of(v: &Value) -> Option<i64> {
    (v["ok"] != true).then(|| v["errno"].as_i64().unwrap_or(-1))
}

#[test]
fn a_write_failing_with_enospc_leaves_only_stored_bytes_and_a_late_close_frees_all() -> Result<()> {
    // Two copies: a stripe counts as stored once both replicas have it.
    let cluster = small_cluster(2)?;
    let (mut w, mut other) = (cluster.worker()?, cluster.worker()?);
    let empty = settled(&mut w)?;
    assert_eq!(empty.0, 0, "a new cluster holds no stripes");

    let open = json!({"cmd": "open", "path": "/big", "create": true, "write": true, "read": false});
    let h = w.ok(&open)?["handle"].clone();
    let mut end = 0;
    let mut failed = None;
    while end < TOO_MUCH && failed.is_none() {
        let v =
            w.call(&json!({"cmd": "write", "handle": h, "offset": end, "len": MIB, "seed": 11}))?;
        failed = errno_of(&v);
        if failed.is_none() {
            end += MIB;
        }
    }
    assert_eq!(failed, Some(ENOSPC.into()), "writes past the memory fail");
    // What the handle wrote past the first stripe not stored is dropped from the size: its
    // fsync says so too.
    let v = w.call(&json!({"cmd": "fsync", "handle": h}))?;
    assert_eq!(
        errno_of(&v),
        Some(ENOSPC.into()),
        "fsync after the loss: {v}"
    );
    let len = holds_pattern(&mut other, "/big", 11)?;
    assert!(
        len > 0 && len <= end,
        "the size {len} is a prefix of the {end} bytes written"
    );
    // Small files (a close that publishes the size beside the file's one write) until several
    // failed: each holds what was written, or nothing. Those stored stay until the end, so the
    // room the failed stripe of /big left on the fullest server fills up.
    let mut failures = 0;
    let mut kept = Vec::new();
    for k in 0..400u64 {
        if failures == 8 {
            break;
        }
        let path = format!("/small-{k}");
        let v = w.call(&json!({"cmd": "write_file", "path": path, "len": 60 << 10, "seed": k}))?;
        match errno_of(&v) {
            None => {
                holds_pattern(&mut other, &path, k)?;
                kept.push(path);
                continue;
            }
            Some(e) => {
                assert_eq!(e, i64::from(ENOSPC), "{path}: {v}");
                failures += 1;
                let st = other.call(&json!({"cmd": "stat", "path": path}))?;
                assert!(
                    errno_of(&st).is_some() || st["size"] == 0,
                    "{path}: its close failed, yet it has {} bytes",
                    st["size"]
                );
            }
        }
        let _ = other.call(&json!({"cmd": "unlink", "path": path}))?;
    }
    assert_eq!(failures, 8, "small files never filled the cluster");
    for path in kept {
        other.ok(&json!({"cmd": "unlink", "path": path}))?;
    }

    // Removed while open: the last close frees every stripe the file wrote, also those past
    // its size.
    other.ok(&json!({"cmd": "unlink", "path": "/big"}))?;
    let _ = w.call(&json!({"cmd": "close", "handle": h}))?;
    wait_stored(
        &mut other,
        empty,
        "after the last close of the removed file",
    )?;
    // The space is usable again.
    w.ok(&json!({"cmd": "write_file", "path": "/after", "len": 32 * MIB, "seed": 12}))?;
    holds_pattern(&mut other, "/after", 12)?;
    Ok(())
}

#[test]
fn a_failed_tessera_cp_leaves_a_true_prefix_and_rm_frees_all_it_wrote() -> Result<()> {
    let cluster = small_cluster(1)?;
    let mut w = cluster.worker()?;
    let empty = settled(&mut w)?;
    let dir = std::env::temp_dir().join(format!("tessera-space-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let src = dir.join("src");
    let mut f = std::fs::File::create(&src)?;
    for at in (0..TOO_MUCH / 2).step_by(MIB as usize) {
        f.write_all(&pattern(21, at, MIB as usize))?;
    }
    drop(f);

    let src_arg = src.to_string_lossy().into_owned();
    let out = cluster.tessera(&["cp", &src_arg, "tessera:/copy"]);
    std::fs::remove_dir_all(&dir)?;
    let e = out.err().context("cp into a full cluster succeeded")?;
    assert!(
        format!("{e:#}").contains("no space left"),
        "cp says why it failed: {e:#}"
    );
    let len = holds_pattern(&mut w, "/copy", 21)?;
    assert!(len < TOO_MUCH / 2, "cp left {len} bytes");

    cluster.tessera(&["rm", "/copy"])?;
    wait_stored(&mut w, empty, "after rm of the partial copy")?;
    Ok(())
}

#[test]
fn a_truncate_drops_stripes_past_the_new_size_also_those_past_the_recorded_size() -> Result<()> {
    let cluster = small_cluster(1)?;
    let (mut w, mut other) = (cluster.worker()?, cluster.worker()?);
    let empty = settled(&mut w)?;
    w.ok(&json!({"cmd": "write_file", "path": "/t", "len": 8 * MIB, "seed": 31}))?;
    // Stripes stored past the recorded size: written through a handle that did not publish.
    let h = w.ok(&json!({"cmd": "open", "path": "/t", "write": true}))?["handle"].clone();
    w.ok(&json!({"cmd": "write", "handle": h, "offset": 8 * MIB, "len": 8 * MIB, "seed": 31}))?;
    w.ok(&json!({"cmd": "read", "handle": h, "offset": 0, "len": 1}))?; // waits for the writes
    assert_eq!(size(&mut other, "/t")?, 8 * MIB);
    let t = other.ok(&json!({"cmd": "open", "path": "/t", "write": true}))?["handle"].clone();
    other.ok(&json!({"cmd": "truncate", "handle": t, "size": 3 * MIB / 2}))?;
    other.ok(&json!({"cmd": "close", "handle": t}))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while stored(&mut other)?.0 != 2 {
        assert!(
            Instant::now() < deadline,
            "a file cut to 1.5 stripes keeps {} stripes",
            stored(&mut other)?.0
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Removed while open, then closed: nothing is left.
    other.ok(&json!({"cmd": "unlink", "path": "/t"}))?;
    w.ok(&json!({"cmd": "close", "handle": h}))?;
    wait_stored(&mut other, empty, "after the removed file's last close")?;
    Ok(())
}

/// 1 MiB writes of pattern `seed` through `f` until one fails; the bytes written and the
/// error, and what close(2) said.
fn write_until_error(f: std::fs::File, seed: u64) -> (u64, std::io::Error, i32) {
    use std::os::unix::fs::FileExt;
    let mut end = 0;
    let e = loop {
        if end >= TOO_MUCH {
            break std::io::Error::other("no error");
        }
        match f.write_all_at(&pattern(seed, end, MIB as usize), end) {
            Ok(()) => end += MIB,
            Err(e) => break e,
        }
    };
    // SAFETY: a descriptor this function owns, closed once.
    let closed = unsafe { libc::close(f.into_raw_fd()) };
    let close_errno = if closed == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    };
    (end, e, close_errno)
}

/// Small files written on a full cluster until several closes failed: each file holds what was
/// written, or nothing if its close failed. (A small file's close through the mount publishes
/// its size beside its one write and takes it back if that write fails.) Removes them.
fn small_files_fill_what_is_left(dir: &std::path::Path) -> Result<()> {
    const LEN: usize = 60 << 10;
    let mut failures = 0;
    let mut names = Vec::new();
    for k in 0..400u64 {
        if failures == 8 {
            break;
        }
        let path = dir.join(format!("small-{k}"));
        let mut f = match std::fs::File::create(&path) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(ENOSPC) => {
                failures += 1; // no room for its inode
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let wrote = f.write_all(&pattern(100 + k, 0, LEN));
        // SAFETY: a descriptor this function owns, closed once.
        let closed = unsafe { libc::close(f.into_raw_fd()) } == 0;
        let Ok(meta) = std::fs::metadata(&path) else {
            failures += 1; // its create failed: no name
            continue;
        };
        names.push(path.clone());
        if wrote.is_ok() && closed {
            ensure!(
                std::fs::read(&path)? == pattern(100 + k, 0, LEN),
                "{}: not what was written",
                path.display()
            );
        } else {
            failures += 1;
            ensure!(
                meta.len() == 0,
                "{}: its close failed, yet it has {} bytes",
                path.display(),
                meta.len()
            );
        }
    }
    ensure!(failures == 8, "small files never filled the cluster");
    for path in names {
        std::fs::remove_file(path)?;
    }
    Ok(())
}

#[test]
fn through_the_mount_enospc_reaches_the_writer_and_the_size_covers_only_stored_bytes() -> Result<()>
{
    let cluster = small_cluster(1)?;
    let mut w = cluster.worker()?;
    let empty = settled(&mut w)?;
    let dir = std::env::temp_dir().join(format!("tessera-space-mnt-{}", std::process::id()));
    let m = cluster.mount(&dir, &[])?;

    // Write-only (as dd opens its output: past the page cache), then read-write (through it).
    for (i, read) in [false, true].into_iter().enumerate() {
        let name = format!("f{i}");
        let path = m.dir.join(&name);
        let seed = 41 + i as u64;
        let f = std::fs::OpenOptions::new()
            .read(read)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        let (end, e, close_errno) = write_until_error(f, seed);
        assert_eq!(
            e.raw_os_error(),
            Some(ENOSPC),
            "{name}: the writer is told: {e}"
        );
        // The write that failed may have stored its first part.
        let len = std::fs::metadata(&path)?.len();
        assert!(
            len <= end + MIB,
            "{name}: size {len} past the {end} bytes written"
        );
        let data = std::fs::read(&path)?;
        assert_eq!(data.len() as u64, len, "{name}: read as long as its size");
        let first_bad = data
            .iter()
            .zip(pattern(seed, 0, data.len()))
            .position(|(a, b)| *a != b);
        assert_eq!(
            first_bad, None,
            "{name}: bytes under the size {len} differ from those written (close said {close_errno})"
        );
        assert_eq!(holds_pattern(&mut w, &format!("/{name}"), seed)?, len);
        if i == 0 {
            small_files_fill_what_is_left(&m.dir)?;
        }

        // Cut to half, then removed: every stripe goes.
        let half = len / 2;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)?
            .set_len(half)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while stored(&mut w)?.0 != half.div_ceil(MIB) {
            assert!(
                Instant::now() < deadline,
                "{name}: cut to {half} bytes, it keeps {} stripes",
                stored(&mut w)?.0
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        std::fs::remove_file(&path)?;
        wait_stored(&mut w, empty, &format!("{name}: after rm"))?;
    }
    drop(m);
    let _ = std::fs::remove_dir(&dir);
    Ok(())
}

/// The one server's `(pooled, used, capacity)` in a status.
fn pool_of(st: &Value) -> (u64, u64, u64) {
    let n = &st["nodes"][0];
    let field = |k: &str| n[k].as_u64().unwrap_or(0);
    (field("pooled"), field("used"), field("capacity"))
}

/// A server given `--prefault` fills its pool of pre-faulted stripe buffers while idle, keeps
/// them through the quiet spells that trim an ordinary pool, lends them to writes, and fills
/// it again only with the memory its data leaves free. Everything is polled with generous
/// deadlines: filling waits for idle time, which a loaded machine may make late.
#[test]
fn a_prefaulting_server_fills_its_pool_while_idle_and_keeps_it() -> Result<()> {
    const PREFAULT: u64 = 64 * MIB;
    let cluster = Cluster::start(&ClusterSpec {
        servers: 1,
        memory: "96MiB".into(),
        server_args: vec![(0, vec!["--prefault".into(), "64MiB".into()])],
        ..ClusterSpec::default()
    })?;
    let pid = cluster.servers[0].id();
    let mut w = cluster.worker()?;
    let patience = Duration::from_secs(60);
    Cluster::wait_status(&mut w, patience, |st| pool_of(st).0 >= PREFAULT)?;
    let held = held_memory(pid)?;
    ensure!(
        held >= PREFAULT,
        "the pooled buffers are in the server's memory, touched: {held} bytes held"
    );
    // Two quiet spells of the pool (5 s each) would have cut an ordinary one to 16 MiB.
    std::thread::sleep(Duration::from_secs(12));
    let (pooled, _, _) = pool_of(&w.ok(&json!({"cmd": "status"}))?);
    ensure!(pooled >= PREFAULT, "kept through quiet spells: {pooled}");

    // A file of 64 MiB takes the buffers; the pool is filled again up to what is left free.
    w.ok(&json!({"cmd": "write_file", "path": "/f", "len": 64 * MIB, "seed": 5}))?;
    let st = Cluster::wait_status(&mut w, patience, |st| {
        let (pooled, used, capacity) = pool_of(st);
        used >= 64 * MIB && pooled + used + 2 * MIB > capacity
    })?;
    let (pooled, used, capacity) = pool_of(&st);
    ensure!(
        pooled + used <= capacity,
        "the pool counts within --memory: {pooled} pooled + {used} used > {capacity}"
    );
    ensure!(holds_pattern(&mut w, "/f", 5)? == 64 * MIB);
    Ok(())
}
