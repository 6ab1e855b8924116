//! The FUSE mount as unmodified programs see it: standard-library file operations and their
//! POSIX errors, on two mounts of one cluster (as on two nodes). Needs root and /dev/fuse.

use anyhow::Result;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::time::{Duration, SystemTime};
use tessera_testkit::{bin, mounted, pattern, wait_until, Cluster, ClusterSpec};

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

#[test]
fn posix_operations_through_two_mounts() -> Result<()> {
    let cluster = Cluster::start(&ClusterSpec::default())?;
    let base = tempfile_dir()?;
    // Without the kernel's attribute cache, so `stat` too sees the other mount's changes at once
    // (tests/posix/test_mount.py covers the default, cached mode).
    let a = cluster.mount(&base.join("a"), &["--attr-cache", "0"])?;
    let b = cluster.mount(&base.join("b"), &["--attr-cache", "0"])?;
    let (pa, pb) = (a.dir.clone(), b.dir.clone());

    // Whole files, across stripes; visible on the other mount after close.
    let data = pattern(1, 0, 3_000_001);
    fs::write(pa.join("f"), &data)?;
    assert_eq!(fs::read(pb.join("f"))?, data, "close-to-open across mounts");
    assert_eq!(fs::metadata(pb.join("f"))?.len(), 3_000_001);

    // pread/pwrite at any offset, O_APPEND, O_EXCL, O_TRUNC.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(pa.join("f"))?;
    f.write_all_at(b"XYZ", 1_048_575)?;
    let mut buf = [0u8; 5];
    f.read_exact_at(&mut buf, 1_048_574)?;
    assert_eq!(&buf, &[data[1_048_574], b'X', b'Y', b'Z', data[1_048_578]]);
    drop(f);
    let mut ap = OpenOptions::new().append(true).open(pa.join("f"))?;
    ap.write_all(b"tail")?;
    drop(ap);
    assert_eq!(fs::metadata(pb.join("f"))?.len(), 3_000_005);
    let e = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(pa.join("f"))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists);
    File::create(pa.join("f"))?.write_all(b"short")?;
    assert_eq!(fs::read(pb.join("f"))?, b"short");

    // Directories and their errors.
    fs::create_dir(pa.join("d"))?;
    fs::write(pa.join("d/x"), b"x")?;
    assert_eq!(
        errno(&fs::remove_dir(pa.join("d")).unwrap_err()),
        libc::ENOTEMPTY
    );
    assert_eq!(errno(&fs::read(pa.join("d")).unwrap_err()), libc::EISDIR);
    assert_eq!(
        errno(&fs::write(pa.join("f/under-a-file"), b"").unwrap_err()),
        libc::ENOTDIR
    );
    assert_eq!(
        errno(&fs::metadata(pa.join("missing")).unwrap_err()),
        libc::ENOENT
    );
    assert_eq!(
        errno(&fs::write(pa.join("n".repeat(256)), b"").unwrap_err()),
        libc::ENAMETOOLONG
    );
    let mut names: Vec<_> = fs::read_dir(&pb)?
        .map(|e| e.map(|e| e.file_name().into_string().unwrap_or_default()))
        .collect::<Result<_, _>>()?;
    names.sort();
    assert_eq!(names, ["d", "f"]);

    // Rename over an existing file, and across directories.
    fs::write(pa.join("d/y"), b"y")?;
    fs::rename(pa.join("d/x"), pa.join("d/y"))?;
    assert_eq!(fs::read(pb.join("d/y"))?, b"x");
    fs::rename(pa.join("d/y"), pa.join("moved"))?;
    assert_eq!(fs::read(pb.join("moved"))?, b"x");

    // Unlinked while open: the descriptor keeps working until it is closed.
    let mut tmp = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(pa.join("tmp"))?;
    tmp.write_all(&pattern(2, 0, 2_000_000))?;
    fs::remove_file(pa.join("tmp"))?;
    assert!(!pb.join("tmp").exists());
    tmp.seek(SeekFrom::Start(0))?;
    let mut back = Vec::new();
    tmp.read_to_end(&mut back)?;
    assert_eq!(back, pattern(2, 0, 2_000_000));
    drop(tmp);

    // Links, modes, times, truncate, statfs.
    std::os::unix::fs::symlink("moved", pa.join("link"))?;
    assert_eq!(fs::read_link(pb.join("link"))?.to_str(), Some("moved"));
    assert_eq!(fs::read(pb.join("link"))?, b"x");
    fs::hard_link(pa.join("moved"), pa.join("hard"))?;
    assert_eq!(fs::metadata(pb.join("moved"))?.nlink(), 2);
    fs::set_permissions(pa.join("hard"), fs::Permissions::from_mode(0o600))?;
    assert_eq!(fs::metadata(pb.join("moved"))?.mode() & 0o7777, 0o600);
    let when = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
    File::options()
        .write(true)
        .open(pa.join("hard"))?
        .set_modified(when)?;
    assert_eq!(
        fs::metadata(pb.join("moved"))?.modified()?,
        when,
        "nanosecond mtimes, for make"
    );
    let t = OpenOptions::new()
        .write(true)
        .mode(0o644)
        .create(true)
        .truncate(false)
        .open(pa.join("f"))?;
    t.set_len(2)?;
    drop(t);
    assert_eq!(fs::read(pb.join("f"))?, b"sh");
    let st = statvfs(&pa)?;
    assert!(
        st.0 > 0 && st.1 <= st.0,
        "statfs reports the cluster's capacity: {st:?}"
    );
    drop(a);
    drop(b);
    Ok(())
}

/// Creates answered ahead (mount A made the directories, so it knows every name there) race
/// another mount's exclusive creates of the same names: each name has exactly one winner, and
/// no create that an open reported done fails afterwards (the server recalls A's promise and
/// waits for A's creates before B's). What both read back is the winner's.
#[test]
fn exclusive_creates_race_across_mounts_with_one_winner_each() -> Result<()> {
    const DIRS: usize = 12;
    const NAMES: usize = 40;
    let cluster = Cluster::start(&ClusterSpec::default())?;
    let base = tempfile_dir()?.join("race");
    let a = cluster.mount(&base.join("a"), &[])?;
    let b = cluster.mount(&base.join("b"), &[])?;
    for d in 0..DIRS {
        fs::create_dir(a.dir.join(format!("d{d}")))?;
    }
    let race = |root: std::path::PathBuf, me: u8| {
        std::thread::spawn(move || -> Result<Vec<bool>> {
            let mut won = Vec::new();
            for d in 0..DIRS {
                for n in 0..NAMES {
                    let path = root.join(format!("d{d}/n{n}"));
                    match OpenOptions::new().write(true).create_new(true).open(&path) {
                        Ok(mut f) => {
                            f.write_all(&[me])?;
                            // Fails if the create did not in fact happen.
                            f.sync_all()?;
                            won.push(true);
                        }
                        Err(e) if e.kind() == ErrorKind::AlreadyExists => won.push(false),
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            Ok(won)
        })
    };
    let (ta, tb) = (race(a.dir.clone(), b'a'), race(b.dir.clone(), b'b'));
    let join = |t: std::thread::JoinHandle<Result<Vec<bool>>>| {
        t.join().map_err(|_| anyhow::anyhow!("a racer panicked"))?
    };
    let (won_a, won_b) = (join(ta)?, join(tb)?);
    for (i, (wa, wb)) in won_a.iter().zip(&won_b).enumerate() {
        assert!(
            wa != wb,
            "name {i}: exactly one mount creates it ({wa}, {wb})"
        );
        let name = format!("d{}/n{}", i / NAMES, i % NAMES);
        let winner = if *wa { b'a' } else { b'b' };
        assert_eq!(fs::read(a.dir.join(&name))?, [winner], "{name} on a");
        assert_eq!(fs::read(b.dir.join(&name))?, [winner], "{name} on b");
    }
    assert!(
        won_a.iter().any(|w| *w),
        "the mount that made the directories created some names"
    );
    Ok(())
}

/// A create answered ahead, then its close: once close(2) returned, another mount finds the
/// file, with its bytes (close-to-open). The close's FLUSH is answered only after the create
/// is on its server, by the worker that lands it; empty files and small outputs alike.
#[test]
fn a_file_created_ahead_is_on_the_servers_when_its_close_returns() -> Result<()> {
    const FILES: usize = 300;
    let cluster = Cluster::start(&ClusterSpec::default())?;
    let base = tempfile_dir()?.join("ahead");
    let a = cluster.mount(&base.join("a"), &[])?;
    let b = cluster.mount(&base.join("b"), &[])?;
    // Mount A made the directory, so it knows every name there and answers creates ahead.
    fs::create_dir(a.dir.join("out"))?;
    for i in 0..FILES {
        let name = format!("out/f{i}");
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(a.dir.join(&name))?;
        if i % 2 == 1 {
            f.write_all(format!("output {i}").as_bytes())?;
        }
        drop(f);
        let seen = fs::read(b.dir.join(&name))?;
        let want = if i % 2 == 1 {
            format!("output {i}").into_bytes()
        } else {
            Vec::new()
        };
        assert_eq!(
            seen, want,
            "{name} on the other mount right after its close"
        );
    }
    assert_eq!(fs::read_dir(b.dir.join("out"))?.count(), FILES);
    Ok(())
}

/// Files written and closed while other processes list their directory (`ls`: readdirplus
/// from a listing taken before the close) read back whole right after, from another process:
/// a listing's attributes must not give the kernel a size older than the close published.
#[test]
fn a_file_written_while_its_directory_is_listed_reads_back_whole() -> Result<()> {
    let cluster = Cluster::start(&ClusterSpec::default())?;
    let base = tempfile_dir()?.join("listed");
    let m = cluster.mount(&base.join("m"), &[])?;
    let scratch = base.join("scratch");
    fs::create_dir_all(&scratch)?;
    fs::create_dir(m.dir.join("stress"))?;
    let script = format!(
        "cd {mnt}
         for p in $(seq 1 6); do
           ( for i in $(seq 1 60); do
               head -c $((i * 3001)) /dev/urandom > {s}/$p
               cp {s}/$p stress/$p-$i
               cmp {s}/$p stress/$p-$i || exit 1
               ls stress > /dev/null
             done ) &
         done
         fails=0
         for j in $(jobs -p); do wait $j || fails=$((fails + 1)); done
         test $fails = 0",
        mnt = m.dir.display(),
        s = scratch.display()
    );
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "a copy read back short: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fs::read_dir(m.dir.join("stress"))?.count(), 360);
    drop(m);
    fs::remove_dir_all(&base).ok();
    Ok(())
}

/// Ctrl-C on a mount that still has a file open (SIGINT; SIGTERM is handled the same way): the
/// directory leaves the namespace at once, the open file is still served until it is closed,
/// and then the process ends by itself. A second Ctrl-C ends it at once. Neither leaves a dead
/// mount behind, and `tessera umount` frees the one a killed mount process leaves.
#[test]
fn stopping_a_mount_with_a_file_open_serves_the_file_until_it_is_closed() -> Result<()> {
    let within = Duration::from_secs(20);
    let cluster = Cluster::start(&ClusterSpec::default())?;
    let dir = tempfile_dir()?.join("stop");

    let mut m = cluster.mount(&dir, &[])?;
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(dir.join("held"))?;
    let data = pattern(7, 0, 4 << 20);
    f.write_all(&data[..3 << 20])?;
    m.signal(libc::SIGINT);
    wait_until(within, || !mounted(&dir))?;
    assert!(m.ended()?.is_none(), "the mount still serves its open file");
    f.write_all(&data[3 << 20..])?;
    f.sync_all()?;
    let mut back = Vec::new();
    f.seek(SeekFrom::Start(0))?;
    f.read_to_end(&mut back)?;
    assert!(back == data, "read back through the detached mount");
    drop(f);
    let ended = m.wait_end(within)?;
    assert!(
        ended.success(),
        "ends once the file is closed: {ended}; its log:\n{}",
        m.log()
    );

    let mut m = cluster.mount(&dir, &[])?;
    assert!(
        fs::read(dir.join("held"))? == data,
        "what the detached mount wrote is in the cluster"
    );
    // Its close reached the servers (the kernel may cut the last RELEASE off): once removed,
    // the file's memory is given back, which a file still counted open would keep. Use is
    // what the servers last reported, so it is waited for both ways.
    let used = |d: &std::path::Path| statvfs(d).map_or(0, |(total, free)| total - free);
    wait_until(within, || used(&dir) >= 4 << 20)?;
    fs::remove_file(dir.join("held"))?;
    wait_until(within, || used(&dir) < 1 << 20)?;

    fs::write(dir.join("kept"), b"kept")?;
    let f = File::open(dir.join("kept"))?;
    m.signal(libc::SIGINT);
    wait_until(within, || !mounted(&dir))?;
    m.signal(libc::SIGINT);
    assert!(m.wait_end(within)?.success(), "a second Ctrl-C ends it");
    assert!(!mounted(&dir), "no dead mount left behind");
    fs::read_dir(&dir)?;
    drop(f);

    let mut m = cluster.mount(&dir, &[])?;
    m.kill()?;
    // `stat` may still answer from the kernel's cache; listing asks the mount.
    let dead = fs::read_dir(&dir).expect_err("a killed mount process leaves a dead mount");
    assert_eq!(errno(&dead), libc::ENOTCONN);
    let umount = std::process::Command::new(bin("tessera")?)
        .arg("umount")
        .arg(&dir)
        .status()?;
    assert!(umount.success());
    assert!(!mounted(&dir), "tessera umount freed it");
    Ok(())
}

#[test]
fn a_long_sequential_write_leaves_only_its_tail_in_the_page_cache() -> Result<()> {
    const MIB: usize = 1 << 20;
    let cluster = Cluster::start(&ClusterSpec::default())?;
    let base = tempfile_dir()?;
    let m = cluster.mount(&base.join("drop"), &[])?;
    // Read-write: the handle goes through the page cache (write-only ones bypass it).
    let open = |name: &str| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(m.dir.join(name))
    };
    let fill = |f: &mut File, seed: u64| -> std::io::Result<()> {
        for i in 0..160 {
            f.write_all(&pattern(seed, (i * MIB) as u64, MIB))?;
        }
        Ok(())
    };

    let mut f = open("alone")?;
    fill(&mut f, 1)?;
    let head = cached_pages(&f, 0, 64 * MIB)?;
    assert_eq!(head, 0, "the pages of what was written first were dropped");
    // What was dropped is read back from the servers, through the same handle and others.
    let mut back = vec![0; 160 * MIB];
    f.read_exact_at(&mut back, 0)?;
    assert!(
        back == pattern(1, 0, 160 * MIB),
        "read back through the writer"
    );
    drop(f);
    assert!(
        fs::read(m.dir.join("alone"))? == back,
        "read back after close"
    );

    // With another handle of the file open, its pages may be mapped or read: none are dropped.
    let other = open("shared")?;
    let mut f = open("shared")?;
    fill(&mut f, 2)?;
    let head = cached_pages(&f, 0, 64 * MIB)?;
    assert!(
        head > (48 * MIB / 4096),
        "pages kept with another handle open: {head}"
    );
    drop((f, other));
    assert!(fs::read(m.dir.join("shared"))? == pattern(2, 0, 160 * MIB));
    Ok(())
}

/// How many pages of `[offset, offset + len)` of `f` the kernel holds (mincore on a mapping,
/// which faults nothing in).
fn cached_pages(f: &File, offset: usize, len: usize) -> Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh shared read-only mapping of an open file, unmapped before returning;
    // mincore writes one byte per page into a vector of that many.
    unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            offset as libc::off_t,
        );
        anyhow::ensure!(map != libc::MAP_FAILED, "mmap failed");
        let mut vec = vec![0u8; len.div_ceil(4096)];
        let r = libc::mincore(map, len, vec.as_mut_ptr());
        libc::munmap(map, len);
        anyhow::ensure!(r == 0, "mincore failed");
        Ok(vec.iter().filter(|b| **b & 1 == 1).count())
    }
}

fn statvfs(p: &std::path::Path) -> Result<(u64, u64)> {
    let c = std::ffi::CString::new(p.as_os_str().to_string_lossy().as_bytes())?;
    // SAFETY: a valid path and a zeroed out-struct.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    anyhow::ensure!(
        unsafe { libc::statvfs(c.as_ptr(), &mut s) } == 0,
        "statvfs failed"
    );
    Ok((s.f_blocks * s.f_frsize, s.f_bfree * s.f_frsize))
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("tessera-fuse-{}", std::process::id()));
    fs::create_dir_all(&d)?;
    Ok(d)
}
