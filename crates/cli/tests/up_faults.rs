//! `tessera up` as a user starts it, outliving the death of its children: a server killed
//! with SIGKILL during I/O, with mirrors, loses nothing, the cluster stays up, and a new server
//! takes the dead one's place; a server stopped (SIGSTOP) past the dead-node time comes back
//! as a new node and serves nothing stale; a killed manager is started again and recovers the
//! cluster while I/O goes on; a mount killed with a file open holds it no longer than its
//! lease. Needs root and /dev/fuse.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;

use support::{Up, TESSERA};

fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The pids of `up`'s children that run `tessera server`.
fn servers_of(up: u32) -> Vec<u32> {
    children_of(up, "server")
}

/// The pids of `up`'s children that run `tessera <role>`.
fn children_of(up: u32, role: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // Field 4, after the parenthesised name, is the parent's pid.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        // `tessera ROLE ...`, or `tessera --manager ADDR mount ...` for the mount.
        let runs = cmdline
            .split(|b| *b == 0)
            .skip(1)
            .take(3)
            .any(|a| a == role.as_bytes());
        if parent == Some(up) && runs {
            pids.push(pid);
        }
    }
    pids
}

/// Bytes of file `n`: a few stripes, distinct per file.
fn content(n: u64, len: usize) -> Vec<u8> {
    let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `tessera status --json`, or null while the manager does not answer.
fn status(home: &Path) -> serde_json::Value {
    let out = Command::new(TESSERA)
        .args(["status", "--json"])
        .env("TESSERA_HOME", home)
        .output()
        .expect("tessera status");
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

fn live_nodes(home: &Path) -> usize {
    status(home)["nodes"]
        .as_array()
        .map_or(0, |n| n.iter().filter(|n| n["alive"] == true).count())
}

/// `tessera up` of 4 servers (room for everything the tests write, twice, on 3 of them) with
/// two copies of everything, mounted on `home/mnt`. Returns it and the device of `home`.
fn up_mirrored(home: &Path) -> (Up, PathBuf, u64) {
    up_mirrored_with(home, &[])
}

/// [`up_mirrored`], with more arguments.
fn up_mirrored_with(home: &Path, more: &[&str]) -> (Up, PathBuf, u64) {
    let mnt = home.join("mnt");
    std::fs::create_dir(&mnt).expect("mount point");
    let more = more.iter().map(|a| a.as_ref());
    let up = Up::start(
        home,
        &[
            "--servers".as_ref(),
            "4".as_ref(),
            "--memory".as_ref(),
            "1GiB".as_ref(),
            "--replication".as_ref(),
            "2".as_ref(),
            "--dead-after".as_ref(),
            "1s".as_ref(),
            "--mount".as_ref(),
            mnt.as_os_str(),
        ]
        .into_iter()
        .chain(more)
        .collect::<Vec<&std::ffi::OsStr>>(),
    );
    (up, mnt, std::fs::metadata(home).expect("home").dev())
}

#[test]
fn up_outlives_a_killed_server_loses_nothing_and_starts_it_again() {
    let home = tempfile::tempdir().expect("a home");
    let home = home.path().to_path_buf();
    let (mut up, mnt, parent_dev) = up_mirrored(&home);

    // Written and closed before the crash, and during it: every acknowledged file must read
    // back whole.
    let len = 3 << 20;
    for n in 0..8 {
        std::fs::write(mnt.join(format!("before-{n}")), content(n, len)).expect("write");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, mnt) = (Arc::clone(&stop), mnt.clone());
        std::thread::spawn(move || {
            let mut written = Vec::new();
            for n in 100.. {
                if stop.load(Ordering::Relaxed) || n >= 200 {
                    break;
                }
                let path: PathBuf = mnt.join(format!("during-{n}"));
                // Stored when fsync says so (a close's error is lost in a drop).
                let stored = std::fs::File::create(&path).and_then(|mut f| {
                    f.write_all(&content(n, len))?;
                    f.sync_all()
                });
                written.push((n, stored.map_err(|e| e.to_string())));
            }
            written
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let before = servers_of(up.0.id());
    assert_eq!(before.len(), 4, "four servers: {before:?}");
    // SAFETY: a server process of this test's own `tessera up`.
    unsafe { libc::kill(before[1] as i32, libc::SIGKILL) };
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    let during = writer.join().expect("writer");

    assert!(
        up.0.try_wait().expect("up's status").is_none(),
        "tessera up stopped when a server died: {}",
        std::fs::read_to_string(home.join("up.log")).unwrap_or_default()
    );
    let failed: Vec<_> = during.iter().filter(|(_, r)| r.is_err()).collect();
    assert!(
        !during.is_empty() && failed.is_empty(),
        "with a copy left, no write may fail: {failed:?}"
    );
    let files = (0..8)
        .map(|n| (n, format!("before-{n}")))
        .chain(during.iter().map(|(n, _)| (*n, format!("during-{n}"))));
    for (n, name) in files {
        let back = std::fs::read(mnt.join(&name)).expect("read back");
        assert!(back == content(n, len), "{name} changed after the crash");
    }
    wait_until(
        "a new server in the dead one's place",
        Duration::from_secs(60),
        || servers_of(up.0.id()).len() == 4 && live_nodes(&home) == 4,
    );
    let log = std::fs::read_to_string(home.join("up.log")).unwrap_or_default();
    assert!(
        log.contains("exited (signal: 9") && log.contains("started again"),
        "the death and the restart are reported: {log}"
    );
    // SAFETY: signalling our own child; Ctrl-C still stops everything.
    unsafe { libc::kill(up.0.id() as i32, libc::SIGINT) };
    let status = up.0.wait().expect("up ends");
    assert!(status.success(), "up after Ctrl-C: {status}");
    assert!(
        std::fs::metadata(&mnt).is_ok_and(|m| m.dev() == parent_dev),
        "unmounted at the end"
    );
}

#[test]
fn a_server_stopped_past_the_dead_node_time_rejoins_as_a_new_node() {
    let home = tempfile::tempdir().expect("a home");
    let home = home.path().to_path_buf();
    let (up, mnt, _) = up_mirrored(&home);
    let len = 3 << 20;
    for n in 0..8 {
        std::fs::write(mnt.join(format!("f{n}")), content(n, len)).expect("write");
    }
    // Reads and stats go on while a server hangs: each waits at most until the table drops
    // the server (not the request timeout).
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, mnt) = (Arc::clone(&stop), mnt.clone());
        std::thread::spawn(move || {
            let mut longest = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                for n in 0..8 {
                    let t = Instant::now();
                    let f = mnt.join(format!("f{n}"));
                    std::fs::metadata(&f).expect("stat");
                    assert_eq!(std::fs::read(&f).expect("read").len(), len);
                    longest = longest.max(t.elapsed());
                }
            }
            longest
        })
    };
    let stopped = servers_of(up.0.id())[2];
    // SAFETY: a server process of this test's own `tessera up`.
    unsafe { libc::kill(stopped as i32, libc::SIGSTOP) };
    wait_until(
        "the stopped server declared dead",
        Duration::from_secs(30),
        || live_nodes(&home) == 3,
    );
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let longest = reader.join().expect("reader");
    assert!(
        longest < Duration::from_secs(20),
        "one read waited {longest:?} on the stopped server"
    );
    // Changed while it sleeps: it must not answer with the old bytes later. (Writes too wait
    // at most until the table drops it; a truncate asks every node.)
    let t = Instant::now();
    for n in 0..8 {
        std::fs::write(mnt.join(format!("f{n}")), content(n + 1000, len)).expect("rewrite");
    }
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "rewrites waited {:?} on the stopped server",
        t.elapsed()
    );
    // SAFETY: as above.
    unsafe { libc::kill(stopped as i32, libc::SIGCONT) };
    wait_until(
        "the stopped server back as a node",
        Duration::from_secs(60),
        || live_nodes(&home) == 4,
    );
    assert!(
        servers_of(up.0.id()).contains(&stopped),
        "the same process rejoined by itself"
    );
    for n in 0..8 {
        let back = std::fs::read(mnt.join(format!("f{n}"))).expect("read back");
        assert!(back == content(n + 1000, len), "f{n} read stale bytes");
    }
}

#[test]
fn a_killed_manager_is_started_again_and_recovers_the_cluster_while_io_goes_on() {
    let home = tempfile::tempdir().expect("a home");
    let home = home.path().to_path_buf();
    let (up, mnt, _) = up_mirrored(&home);
    let len = 3 << 20;
    let epoch = status(&home)["epoch"].as_u64().expect("an epoch");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, mnt) = (Arc::clone(&stop), mnt.clone());
        std::thread::spawn(move || {
            let mut written = Vec::new();
            for n in 0..200 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let path: PathBuf = mnt.join(format!("f{n}"));
                let stored = std::fs::File::create(&path).and_then(|mut f| {
                    f.write_all(&content(n, len))?;
                    f.sync_all()
                });
                written.push((n, stored.map_err(|e| e.to_string())));
            }
            written
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let manager = children_of(up.0.id(), "manager");
    assert_eq!(manager.len(), 1, "one manager: {manager:?}");
    // SAFETY: the manager process of this test's own `tessera up`.
    unsafe { libc::kill(manager[0] as i32, libc::SIGKILL) };
    wait_until(
        "a new manager that knows the four servers",
        Duration::from_secs(60),
        || live_nodes(&home) == 4,
    );
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().expect("writer");
    let failed: Vec<_> = written.iter().filter(|(_, r)| r.is_err()).collect();
    assert!(
        !written.is_empty() && failed.is_empty(),
        "the manager is not on the data path: {failed:?}"
    );
    for (n, _) in &written {
        let back = std::fs::read(mnt.join(format!("f{n}"))).expect("read back");
        assert!(back == content(*n, len), "f{n} changed");
    }
    let after = status(&home);
    assert!(
        after["epoch"].as_u64().is_some_and(|e| e >= epoch),
        "epochs go on from the servers' table: {epoch} then {after}"
    );
    let log = || std::fs::read_to_string(home.join("up.log")).unwrap_or_default();
    // The servers are back at once; the recovery ends one dead-node time later.
    wait_until("the end of the recovery", Duration::from_secs(30), || {
        log().contains("the cluster is recovered")
    });
    let log = log();
    assert!(
        log.contains("manager exited (signal: 9"),
        "the death is reported: {log}"
    );
    assert!(!log.contains('\u{1b}'), "no terminal colours in a log file");
    // The recovered manager runs the cluster: a dead server is replaced and rebuilt.
    // SAFETY: a server process of this test's own `tessera up`.
    unsafe { libc::kill(servers_of(up.0.id())[0] as i32, libc::SIGKILL) };
    wait_until(
        "a rebuilt cluster under the new manager",
        Duration::from_secs(90),
        || {
            let s = status(&home);
            live_nodes(&home) == 4 && s["degraded"] == 0 && s["incoming"] == 0
        },
    );
    for (n, _) in &written {
        let back = std::fs::read(mnt.join(format!("f{n}"))).expect("read back");
        assert!(back == content(*n, len), "f{n} changed after the rebuild");
    }
}

/// The servers the cluster file lists for clients to start from.
fn seeds(home: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(home.join("cluster.toml")).unwrap_or_default();
    let file: toml::Table = toml::from_str(&text).unwrap_or_default();
    file.get("seeds")
        .and_then(|s| s.as_array())
        .map(|s| {
            s.iter()
                .filter_map(|a| a.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn with_the_manager_hung_and_a_server_killed_every_file_reads_and_new_clients_start() {
    let home = tempfile::tempdir().expect("a home");
    let home = home.path().to_path_buf();
    let (up, mnt, _) = up_mirrored_with(&home, &["--manager-timeout", "20s"]);
    let len = 3 << 20;
    let dir = mnt.join("d");
    std::fs::create_dir(&dir).expect("mkdir");
    for n in 0..16 {
        std::fs::write(dir.join(format!("f{n}")), content(n, len)).expect("write");
    }
    wait_until(
        "four servers in the cluster file",
        Duration::from_secs(30),
        || seeds(&home).len() == 4,
    );
    let manager = children_of(up.0.id(), "manager");
    assert_eq!(manager.len(), 1, "one manager: {manager:?}");
    // SAFETY: the manager and a server of this test's own `tessera up`.
    unsafe {
        libc::kill(manager[0] as i32, libc::SIGSTOP);
        libc::kill(servers_of(up.0.id())[2] as i32, libc::SIGKILL);
    }
    let away = Instant::now();
    // Nothing read from the kernel's caches: names, attributes and bytes come from the
    // servers, each file's from whichever copy is left.
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 16, "{names:?}");
    for n in 0..16 {
        let back = std::fs::read(dir.join(format!("f{n}"))).expect("read with the manager away");
        assert!(back == content(n, len), "f{n} changed");
    }
    // A new client starts from the servers the cluster file lists.
    let cat = Command::new(TESSERA)
        .args(["cat", "/d/f5"])
        .env("TESSERA_HOME", &home)
        .output()
        .expect("tessera cat");
    assert!(
        cat.status.success() && cat.stdout == content(5, len),
        "a new client while the manager is away: {}",
        String::from_utf8_lossy(&cat.stderr)
    );
    let served = away.elapsed();
    let log = || std::fs::read_to_string(home.join("up.log")).unwrap_or_default();
    wait_until("the hung manager killed", Duration::from_secs(60), || {
        log().contains("the manager has not answered for")
    });
    wait_until(
        "a new manager that rebuilt the cluster",
        Duration::from_secs(90),
        || {
            let s = status(&home);
            live_nodes(&home) == 4 && s["degraded"] == 0 && s["incoming"] == 0
        },
    );
    for n in 0..16 {
        let back = std::fs::read(dir.join(format!("f{n}"))).expect("read back");
        assert!(back == content(n, len), "f{n} changed after the recovery");
    }
    eprintln!("read everything with the manager away in {served:?}");
}

/// Bytes held by the servers, as `status` reports them (0 while the manager does not answer).
fn used(home: &Path) -> u64 {
    status(home)["nodes"].as_array().map_or(0, |nodes| {
        nodes
            .iter()
            .filter_map(|n| n["stats"]["used"].as_u64())
            .sum()
    })
}

#[test]
fn a_mount_killed_with_a_file_open_holds_it_no_longer_than_its_lease() {
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path();
    let mnt = home.join("mnt");
    std::fs::create_dir(&mnt).expect("mount point");
    let up = Up::start(
        home,
        &[
            "--servers".as_ref(),
            "2".as_ref(),
            "--memory".as_ref(),
            "256MiB".as_ref(),
            "--open-lease".as_ref(),
            "1s".as_ref(),
            "--mount".as_ref(),
            mnt.as_os_str(),
        ],
    );
    const SIZE: u64 = 32 << 20;
    std::fs::write(mnt.join("big"), content(7, SIZE as usize)).expect("write through the mount");
    // A program keeps it open through the mount (the mount is the client holding the handle).
    let mut holder = Command::new("bash")
        .args(["-c", "exec 3<\"$1\"; exec sleep 600", "holder"])
        .arg(mnt.join("big"))
        .spawn()
        .expect("holder");
    wait_until("the holder's open", Duration::from_secs(10), || {
        std::fs::read_link(format!("/proc/{}/fd/3", holder.id())).is_ok()
    });
    let rm = |what: &str| {
        let out = Command::new(TESSERA)
            .args(["rm", what])
            .env("TESSERA_HOME", home)
            .output()
            .expect("tessera rm");
        assert!(out.status.success(), "{out:?}");
    };
    rm("/big");
    // Open on a live mount, which renews its lease: kept past several lease periods.
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        used(home) >= SIZE,
        "an open file was deleted under its holder"
    );

    let mounts = children_of(up.0.id(), "mount");
    assert_eq!(mounts.len(), 1, "one mount");
    // SAFETY: signalling the test's own grandchild.
    unsafe { libc::kill(mounts[0] as i32, libc::SIGKILL) };
    // Its handle is let go once its lease runs out, and the unlinked file with it.
    wait_until(
        "the memory of the unlinked file back",
        Duration::from_secs(60),
        || used(home) < SIZE / 4,
    );
    let _ = holder.kill();
    let _ = holder.wait();
    // `up` mounts again, and the new mount works.
    wait_until("a new mount", Duration::from_secs(60), || {
        children_of(up.0.id(), "mount")
            .iter()
            .any(|&m| m != mounts[0])
            && std::fs::write(mnt.join("after"), b"x").is_ok()
    });
}
