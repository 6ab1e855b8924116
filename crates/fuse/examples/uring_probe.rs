//! How many requests a second can a FUSE server take over `/dev/fuse` and over io_uring on
//! this machine? A probe, not a file system: it mounts a read-only directory of `FILES` files
//! of 1 MiB served from nothing (their bytes are a function of the offset), answers LOOKUP,
//! GETATTR, OPEN, READ, FLUSH, RELEASE and STATFS with attributes and entries that expire at
//! once (every `stat` is a request) and files opened with direct I/O (every read is one), and
//! times threads of this process doing `stat`s and 4 KiB `pread`s on it. The transport is the
//! only thing that differs between the two modes, so their ratio is the ceiling of what
//! serving the mount over io_uring could gain (docs/design/fuse-io-uring.md).
//!
//! Usage: `uring_probe dev|uring MOUNTPOINT [SECONDS] [THREADS]`, as root; `uring` needs the
//! fuse module's `enable_uring` set to Y. Prints one JSON line.

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const FILES: u64 = 1000;
const FILE_SIZE: u64 = 1 << 20;
const MAX_WRITE: usize = 128 << 10;
/// Ring entries per queue.
const DEPTH: usize = 16;

const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;

// Opcodes.
const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const OPEN: u32 = 14;
const READ: u32 = 15;
const STATFS: u32 = 17;
const RELEASE: u32 = 18;
const FLUSH: u32 = 25;
const INIT: u32 = 26;
const OPENDIR: u32 = 27;
const RELEASEDIR: u32 = 29;
const BATCH_FORGET: u32 = 42;

// INIT flags.
const ASYNC_READ: u64 = 1;
const BIG_WRITES: u64 = 1 << 5;
const PARALLEL_DIROPS: u64 = 1 << 18;
const MAX_PAGES: u64 = 1 << 22;
const INIT_EXT: u64 = 1 << 30;
const OVER_IO_URING: u64 = 1 << 41;
const FOPEN_DIRECT_IO: u32 = 1;

// Ring commands and the layout of `fuse_uring_req_header`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
const RING_IN_OUT: usize = 0;
const RING_OP_IN: usize = 128;
const RING_ENT: usize = 256;
const RING_HEADER: usize = 256 + 32;

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A request's header fields the probe uses.
struct In {
    opcode: u32,
    unique: u64,
    nodeid: u64,
}

fn parse_in(h: &[u8]) -> In {
    In {
        opcode: le32(h, 4),
        unique: le64(h, 8),
        nodeid: le64(h, 16),
    }
}

/// `fuse_attr` of node `ino` (1: the root directory; 2 + i: file i).
fn attr(ino: u64, out: &mut Vec<u8>) {
    let dir = ino == 1;
    let (size, mode, nlink) = if dir {
        (0, libc::S_IFDIR | 0o755, 2)
    } else {
        (FILE_SIZE, libc::S_IFREG | 0o444, 1)
    };
    for v in [ino, size, size.div_ceil(512), 0, 0, 0] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [0u32, 0, 0, mode, nlink, 0, 0, 0, 4096, 0] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// The reply to `req` (its op header `op`, its payload `data`): an errno (0: none) and the
/// reply's arguments appended to `out`. `None`: no reply (forgets).
fn serve(req: &In, op: &[u8], data: &[u8], out: &mut Vec<u8>) -> Option<i32> {
    match req.opcode {
        FORGET | BATCH_FORGET => None,
        LOOKUP => {
            let name = data.split(|&b| b == 0).next().unwrap_or_default();
            let file = std::str::from_utf8(name)
                .ok()
                .and_then(|n| n.strip_prefix('f')?.parse::<u64>().ok())
                .filter(|&i| i < FILES && req.nodeid == 1);
            let Some(i) = file else {
                return Some(libc::ENOENT);
            };
            // nodeid, generation, entry and attribute validity 0: every stat asks again.
            for v in [2 + i, 0, 0, 0] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&[0; 8]);
            attr(2 + i, out);
            Some(0)
        }
        GETATTR => {
            out.extend_from_slice(&[0; 16]);
            attr(req.nodeid, out);
            Some(0)
        }
        OPEN | OPENDIR => {
            out.extend_from_slice(&0u64.to_le_bytes());
            let flags = if req.opcode == OPEN {
                FOPEN_DIRECT_IO
            } else {
                0
            };
            out.extend_from_slice(&flags.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            Some(0)
        }
        READ => {
            let offset = le64(op, 8);
            let size = le32(op, 16) as u64;
            let end = (offset + size).min(FILE_SIZE);
            out.extend((offset..end.max(offset)).map(|o| (o % 251) as u8));
            Some(0)
        }
        FLUSH | RELEASE | RELEASEDIR => Some(0),
        STATFS => {
            for v in [1u64 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            for v in [4096u32, 255, 4096, 0, 0, 0, 0, 0, 0, 0] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            Some(0)
        }
        _ => Some(libc::ENOSYS),
    }
}

fn out_header(len: usize, error: i32, unique: u64) -> [u8; OUT_HEADER] {
    let mut h = [0u8; OUT_HEADER];
    h[0..4].copy_from_slice(&(len as u32).to_le_bytes());
    h[4..8].copy_from_slice(&(-error).to_le_bytes());
    h[8..16].copy_from_slice(&unique.to_le_bytes());
    h
}

/// Answers requests read from `/dev/fuse` until the connection ends.
fn dev_loop(fd: i32, stop: &AtomicBool) {
    let mut buf = vec![0u8; MAX_WRITE + 4096];
    let mut out = Vec::with_capacity(MAX_WRITE + 4096);
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: reads into a buffer of that length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) || e.raw_os_error() == Some(libc::ENOENT) {
                continue;
            }
            return;
        }
        if (n as usize) < IN_HEADER {
            continue;
        }
        let req = parse_in(&buf);
        let args = &buf[IN_HEADER..n as usize];
        out.clear();
        out.extend_from_slice(&[0; OUT_HEADER]);
        // Over /dev/fuse the op header and the payload follow the header together; the ops
        // served take only one of them.
        let Some(err) = serve(&req, args, args, &mut out) else {
            continue;
        };
        if err != 0 {
            out.truncate(OUT_HEADER);
        }
        let h = out_header(out.len(), err, req.unique);
        out[..OUT_HEADER].copy_from_slice(&h);
        // SAFETY: writes the reply's bytes.
        unsafe { libc::write(fd, out.as_ptr().cast(), out.len()) };
    }
}

/// A ring entry's two buffers, as the kernel is given them.
struct Entry {
    header: Box<[u8; RING_HEADER]>,
    payload: Vec<u8>,
    iov: Box<[libc::iovec; 2]>,
}

/// A `URING_CMD` of 128-byte entries for the fuse descriptor; `iov`: REGISTER's buffers.
fn command(
    fd: i32,
    op: u32,
    qid: u16,
    commit: u64,
    iov: Option<&[libc::iovec; 2]>,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit.to_le_bytes());
    cmd[16..18].copy_from_slice(&qid.to_le_bytes());
    let e = opcode::UringCmd80::new(types::Fd(fd), op).cmd(cmd).build();
    let Some(iov) = iov else {
        return e;
    };
    // The builder has no `addr` and `len`; REGISTER takes its iovecs there (offsets 16 and 24
    // of `io_uring_sqe`).
    // SAFETY: Entry128 is the kernel's 128-byte `io_uring_sqe`, plain bytes.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    raw[16..24].copy_from_slice(&(iov.as_ptr() as u64).to_le_bytes());
    raw[24..28].copy_from_slice(&2u32.to_le_bytes());
    // SAFETY: the same bytes, two fields set.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// Queue `qid`'s thread: pinned to its CPU, registers `DEPTH` entries and answers what they
/// bring until the connection ends.
fn ring_loop(fd: i32, qid: u16, served: &AtomicU64) -> std::io::Result<()> {
    // SAFETY: a CPU set built and applied to this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(usize::from(qid), &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> =
        IoUring::builder().build(DEPTH as u32 * 2)?;
    let mut entries: Vec<Entry> = (0..DEPTH)
        .map(|_| {
            let mut header = Box::new([0u8; RING_HEADER]);
            let mut payload = vec![0u8; MAX_WRITE];
            let iov = Box::new([
                libc::iovec {
                    iov_base: header.as_mut_ptr().cast(),
                    iov_len: RING_HEADER,
                },
                libc::iovec {
                    iov_base: payload.as_mut_ptr().cast(),
                    iov_len: MAX_WRITE,
                },
            ]);
            Entry {
                header,
                payload,
                iov,
            }
        })
        .collect();
    for (i, e) in entries.iter().enumerate() {
        let sqe = command(fd, CMD_REGISTER, qid, 0, Some(&e.iov)).user_data(i as u64);
        // SAFETY: the buffers live as long as the ring (the kernel holds them until it ends).
        unsafe { ring.submission().push(&sqe) }.map_err(|_| std::io::Error::other("queue full"))?;
    }
    ring.submit()?;
    let mut out = Vec::with_capacity(MAX_WRITE);
    loop {
        ring.submit_and_wait(1)?;
        let done: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (i, res) in done {
            if res < 0 {
                // The connection ended (or REGISTER was refused).
                return if res == -libc::ENOTCONN || res == -libc::ENODEV {
                    Ok(())
                } else {
                    Err(std::io::Error::from_raw_os_error(-res))
                };
            }
            let e = &mut entries[i as usize];
            let req = parse_in(&e.header[RING_IN_OUT..]);
            let commit = le64(&e.header[..], RING_ENT + 8);
            let len = le32(&e.header[..], RING_ENT + 16) as usize;
            out.clear();
            let op = e.header[RING_OP_IN..RING_ENT].to_vec();
            let err = serve(&req, &op, &e.payload[..len.min(MAX_WRITE)], &mut out).unwrap_or(0);
            if err != 0 {
                out.clear();
            }
            e.payload[..out.len()].copy_from_slice(&out);
            let h = out_header(OUT_HEADER + out.len(), err, req.unique);
            e.header[RING_IN_OUT..RING_IN_OUT + OUT_HEADER].copy_from_slice(&h);
            e.header[RING_ENT + 16..RING_ENT + 20]
                .copy_from_slice(&(out.len() as u32).to_le_bytes());
            served.fetch_add(1, Ordering::Relaxed);
            let sqe = command(fd, CMD_COMMIT_AND_FETCH, qid, commit, None).user_data(i);
            // SAFETY: as at registration.
            unsafe { ring.submission().push(&sqe) }
                .map_err(|_| std::io::Error::other("queue full"))?;
        }
    }
}

/// Mounts the probe at `dir` and answers INIT; the session's descriptor.
fn mount(dir: &str, uring: bool) -> std::io::Result<OwnedFd> {
    let path = CString::new("/dev/fuse")?;
    // SAFETY: opens a device; the descriptor is owned below.
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let opts = CString::new(format!(
        "fd={raw},rootmode=40000,user_id=0,group_id=0,allow_other"
    ))?;
    let (src, target, kind) = (
        CString::new("probe")?,
        CString::new(dir)?,
        CString::new("fuse.probe")?,
    );
    // SAFETY: C strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            kind.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            opts.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut buf = vec![0u8; MAX_WRITE + 4096];
    // SAFETY: reads into a buffer of that length.
    let n = unsafe { libc::read(raw, buf.as_mut_ptr().cast(), buf.len()) };
    if n < (IN_HEADER + 16) as isize || parse_in(&buf).opcode != INIT {
        return Err(std::io::Error::other("no INIT"));
    }
    let req = parse_in(&buf);
    let (minor, readahead) = (le32(&buf, IN_HEADER + 4), le32(&buf, IN_HEADER + 8));
    let offered =
        u64::from(le32(&buf, IN_HEADER + 12)) | (u64::from(le32(&buf, IN_HEADER + 16)) << 32);
    let mut want = ASYNC_READ | BIG_WRITES | PARALLEL_DIROPS | MAX_PAGES | INIT_EXT;
    if uring {
        if offered & OVER_IO_URING == 0 {
            return Err(std::io::Error::other(
                "the kernel does not offer FUSE_OVER_IO_URING (enable_uring?)",
            ));
        }
        want |= OVER_IO_URING;
    }
    let flags = want & offered;
    let mut out = Vec::with_capacity(80);
    out.extend_from_slice(&[0; OUT_HEADER]);
    for v in [7u32, minor.min(44), readahead, flags as u32] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&64u16.to_le_bytes()); // max_background
    out.extend_from_slice(&48u16.to_le_bytes()); // congestion_threshold
    out.extend_from_slice(&(MAX_WRITE as u32).to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes()); // time_gran
    out.extend_from_slice(&((MAX_WRITE / 4096) as u16).to_le_bytes()); // max_pages
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&((flags >> 32) as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4 + 2 + 22]);
    let h = out_header(out.len(), 0, req.unique);
    out[..OUT_HEADER].copy_from_slice(&h);
    // SAFETY: writes the reply's bytes.
    if unsafe { libc::write(raw, out.as_ptr().cast(), out.len()) } != out.len() as isize {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// Operations a second of `threads` threads doing `op` for `secs`.
fn load(threads: usize, secs: f64, op: impl Fn(u64) + Sync) -> f64 {
    let count = AtomicU64::new(0);
    let until = Instant::now() + Duration::from_secs_f64(secs);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (count, op) = (&count, &op);
            s.spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                let mut n = 0;
                while Instant::now() < until {
                    for _ in 0..64 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        op(x);
                    }
                    n += 64;
                }
                count.fetch_add(n, Ordering::Relaxed);
            });
        }
    });
    count.load(Ordering::Relaxed) as f64 / secs
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage =
        || std::io::Error::other("usage: uring_probe dev|uring MOUNTPOINT [SECONDS] [THREADS]");
    let uring = match args.get(1).map(String::as_str) {
        Some("dev") => false,
        Some("uring") => true,
        _ => return Err(usage()),
    };
    let dir = args.get(2).ok_or_else(usage)?.clone();
    let secs: f64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let threads: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(2);
    let fd = mount(&dir, uring)?;
    let raw = fd.as_raw_fd();
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut servers = Vec::new();
    // /dev/fuse threads: all the work in `dev` mode; forgets and interrupts with rings.
    for _ in 0..if uring { 1 } else { cpus } {
        let stop = stop.clone();
        servers.push(std::thread::spawn(move || dev_loop(raw, &stop)));
    }
    let mut rings = Vec::new();
    if uring {
        for q in 0..cpus as u16 {
            let served = served.clone();
            rings.push(std::thread::spawn(move || ring_loop(raw, q, &served)));
        }
    }
    // SAFETY: a plain stat of the mount point.
    let dev = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        let p = CString::new(dir.clone())?;
        libc::stat(p.as_ptr(), &mut st);
        st.st_dev
    };
    std::thread::sleep(Duration::from_millis(200));
    let stat = |x: u64| {
        let p = CString::new(format!("{dir}/f{}", x % FILES)).expect("no NUL");
        // SAFETY: a stat into a local buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        unsafe { libc::stat(p.as_ptr(), &mut st) };
    };
    let stats = load(threads, secs, stat);
    let file = std::fs::File::open(format!("{dir}/f0"))?;
    let read = |x: u64| {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; 4096];
        let at = (x % (FILE_SIZE / 4096)) * 4096;
        let _ = file.read_at(&mut b, at);
    };
    let reads = load(threads, secs, read);
    drop(file);
    let on_ring = served.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let target = CString::new(dir.clone())?;
    // SAFETY: detaches the mount; then the connection is aborted so the kernel completes the
    // ring commands it holds and every thread sees the end.
    unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    let abort = format!("/sys/fs/fuse/connections/{}/abort", libc::minor(dev));
    let _ = std::fs::write(abort, "1");
    for r in rings {
        match r.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("ring: {e}"),
            Err(_) => eprintln!("ring thread panicked"),
        }
    }
    for s in servers {
        let _ = s.join();
    }
    println!(
        "{{\"mode\":\"{}\",\"threads\":{threads},\"stats_per_s\":{stats:.0},\"reads_4k_per_s\":{reads:.0},\"served_on_rings\":{on_ring}}}",
        if uring { "uring" } else { "dev" }
    );
    Ok(())
}
