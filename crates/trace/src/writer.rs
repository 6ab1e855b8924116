//! The writer: producers encode records into a bounded buffer under a short lock and go on; a
//! background thread swaps the buffer out and appends it to the file as one checksummed chunk,
//! every `flush_every` or when it is half full. A producer never waits for the disk: with no
//! room left, its record is counted, and the count goes into the stream as a gap, where the
//! records would have been.

use crate::format::{put_record, put_str, put_v, CHUNK_HEAD, CHUNK_MAGIC};
use crate::format::{DEF_OVERHEAD, GAP_MAX, REC_MAX, T_DEF, T_END, T_GAP, T_RESET};
use crate::record::{Event, Gap, Mode};
use crate::Header;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use xxhash_rust::xxh3::Xxh3Builder;

/// How much memory a writer may use, and how often it writes.
#[derive(Debug, Clone)]
pub struct Options {
    /// Bytes of encoded records waiting to be written; twice this is allocated (the buffer
    /// being filled and the one being written).
    pub buffer_bytes: usize,
    /// How often the buffer is written out: a process killed loses at most this much.
    pub flush_every: Duration,
    /// Bytes of interned strings kept; past it they are forgotten and defined again.
    pub strings_bytes: usize,
    /// A test hook: the writer sleeps this long before each chunk, as on a stalled disk.
    pub stall: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            buffer_bytes: 16 << 20,
            flush_every: Duration::from_millis(250),
            strings_bytes: 8 << 20,
            stall: Duration::ZERO,
        }
    }
}

/// What a writer did, once stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub records: u64,
    pub dropped: u64,
    pub bytes: u64,
}

/// Appends records to a trace file from any number of threads. Stopped (the rest written, and
/// an end marker) by [`Writer::finish`] or when dropped.
pub struct Writer {
    shared: Arc<Shared>,
    base: Instant,
    thread: Mutex<Option<JoinHandle<Stats>>>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Signalled when the writer has written what was asked for by [`Writer::flush`].
    flushed: Condvar,
    cap: usize,
    strings_cap: usize,
}

struct State {
    buf: Vec<u8>,
    /// Records in `buf` (lost with it if it cannot be written).
    buffered: u64,
    /// Start of the last record in `buf` (starts are stored as differences).
    prev_start: u64,
    strings: HashMap<Box<[u8]>, u64, Xxh3Builder>,
    string_bytes: usize,
    /// Records not kept since the last gap was written.
    gap: Option<Gap>,
    records: u64,
    dropped: u64,
    stop: bool,
    /// Flushes asked for, and the last one written.
    flush_asked: u64,
    flush_done: u64,
}

impl State {
    fn lose(&mut self, n: u64, at: u64) {
        self.dropped += n;
        let g = self.gap.get_or_insert(Gap {
            dropped: 0,
            from_ns: at,
            to_ns: at,
        });
        g.dropped += n;
        g.to_ns = g.to_ns.max(at);
    }

    fn put_gap(&mut self) {
        if let Some(g) = self.gap.take() {
            self.buf.push(T_GAP);
            put_v(&mut self.buf, g.dropped);
            put_v(&mut self.buf, g.from_ns);
            put_v(&mut self.buf, g.to_ns);
        }
    }

    /// The id of `s`, defined in the buffer first if new.
    fn intern(&mut self, s: &[u8]) -> u64 {
        if let Some(&id) = self.strings.get(s) {
            return id;
        }
        let id = self.strings.len() as u64;
        self.buf.push(T_DEF);
        put_v(&mut self.buf, id);
        put_str(&mut self.buf, s);
        self.string_bytes += s.len();
        self.strings.insert(s.into(), id);
        id
    }
}

impl Writer {
    /// Creates `path` (which must not exist), writes `header` (its clock set to now: time 0)
    /// and starts the writer thread.
    pub fn create(path: &Path, header: &Header, opts: &Options) -> std::io::Result<Writer> {
        let mut file = File::options().write(true).create_new(true).open(path)?;
        let base = Instant::now();
        let mut header = header.clone();
        header.unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let head = header.encode();
        file.write_all(&head)?;
        let cap = opts.buffer_bytes.max(REC_MAX + GAP_MAX);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                buf: Vec::with_capacity(cap),
                buffered: 0,
                prev_start: 0,
                strings: HashMap::default(),
                string_bytes: 0,
                gap: None,
                records: 0,
                dropped: 0,
                stop: false,
                flush_asked: 0,
                flush_done: 0,
            }),
            wake: Condvar::new(),
            flushed: Condvar::new(),
            cap,
            strings_cap: opts.strings_bytes,
        });
        let (s, every, stall) = (Arc::clone(&shared), opts.flush_every, opts.stall);
        let written = head.len() as u64;
        let thread = std::thread::Builder::new()
            .name("trace-writer".into())
            .spawn(move || s.run(file, written, (every, stall), base))?;
        Ok(Writer {
            shared,
            base,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Starts a trace of `source` (e.g. `fuse /mnt/t`) in a new file of `dir`,
    /// `<host>-<pid>-<n>.ttrace`, numbered in the order this process starts them; its path.
    pub fn create_in(
        dir: &Path,
        source: String,
        mode: Mode,
        opts: &Options,
    ) -> std::io::Result<(PathBuf, Writer)> {
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let host = hostname();
        let pid = std::process::id();
        let n = STARTED.fetch_add(1, Ordering::Relaxed) + 1;
        let path = dir.join(format!("{host}-{pid}-{n}.ttrace"));
        let writer = Writer::create(&path, &Header::new(host, pid, source, mode), opts)?;
        Ok((path, writer))
    }

    /// Nanoseconds since the trace's time 0 (monotonic).
    pub fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Queues a record; false if there was no room (it is counted in the next gap). Never
    /// waits for the disk.
    pub fn push(&self, e: &Event<'_>) -> bool {
        let strings = [e.exe, e.path, e.target];
        // Room for the worst case: a pending gap, a reset and every string new.
        let need = REC_MAX
            + GAP_MAX
            + 1
            + strings
                .iter()
                .flatten()
                .map(|s| s.len() + DEF_OVERHEAD)
                .sum::<usize>();
        let mut st = self.shared.lock();
        let before = st.buf.len();
        if before + need > self.shared.cap || st.stop {
            st.lose(1, e.start_ns);
            return false;
        }
        st.put_gap();
        let new_bytes: usize = strings.iter().flatten().map(|s| s.len()).sum();
        if st.string_bytes + new_bytes > self.shared.strings_cap {
            st.buf.push(T_RESET);
            st.strings.clear();
            st.string_bytes = 0;
        }
        let ids = strings.map(|s| s.map(|s| st.intern(s)));
        let prev = st.prev_start;
        put_record(&mut st.buf, e, ids, prev);
        st.prev_start = e.start_ns;
        st.buffered += 1;
        st.records += 1;
        let half = self.shared.cap / 2;
        let crossed = before < half && st.buf.len() >= half;
        drop(st);
        if crossed {
            self.shared.wake.notify_one();
        }
        true
    }

    /// Returns once what was queued before the call is written out (as a chunk of its own).
    pub fn flush(&self) {
        let mut st = self.shared.lock();
        st.flush_asked += 1;
        let asked = st.flush_asked;
        self.shared.wake.notify_one();
        while st.flush_done < asked && !st.stop {
            st = (self.shared.flushed.wait(st)).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Writes what is buffered and an end marker, and stops the thread.
    pub fn finish(self) -> Stats {
        self.close()
    }

    /// `finish` for a writer that is shared: records pushed after it are not kept. The stats
    /// are returned to the first call only.
    pub fn close(&self) -> Stats {
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match thread.map(JoinHandle::join) {
            Some(Ok(stats)) => stats,
            _ => Stats::default(),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.close();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The writer thread: until stopped, swaps the buffer out and appends it as a chunk.
    fn run(
        &self,
        mut file: File,
        mut written: u64,
        times: (Duration, Duration),
        base: Instant,
    ) -> Stats {
        let (every, stall) = times;
        let mut spare = Vec::with_capacity(self.cap);
        loop {
            let (mut out, lost, stop, asked) = {
                let mut st = self.lock();
                if !st.stop && st.buf.len() < self.cap / 2 && st.flush_asked == st.flush_done {
                    st = self
                        .wake
                        .wait_timeout(st, every)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                let stop = st.stop;
                if stop {
                    // Past the bound if need be: these few bytes say how the trace ended.
                    st.put_gap();
                    let (records, dropped) = (st.records, st.dropped);
                    st.buf.push(T_END);
                    put_v(&mut st.buf, records);
                    put_v(&mut st.buf, dropped);
                }
                st.prev_start = 0;
                let lost = std::mem::take(&mut st.buffered);
                let asked = st.flush_asked;
                (std::mem::replace(&mut st.buf, spare), lost, stop, asked)
            };
            if !out.is_empty() {
                std::thread::sleep(stall);
                match write_chunk(&mut file, &out) {
                    Ok(n) => written += n,
                    Err(e) => {
                        // Cut the torn chunk off, so later chunks still follow whole ones.
                        let _ = file.set_len(written);
                        let _ = file.seek(SeekFrom::Start(written));
                        tracing::warn!("writing a trace chunk: {e}");
                        let at = u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        let mut st = self.lock();
                        st.records -= lost.min(st.records);
                        st.lose(lost, at);
                        // The lost chunk defined strings: define them all again.
                        st.buf.push(T_RESET);
                        st.strings.clear();
                        st.string_bytes = 0;
                    }
                }
            }
            out.clear();
            spare = out;
            self.lock().flush_done = asked;
            self.flushed.notify_all();
            if stop {
                let st = self.lock();
                return Stats {
                    records: st.records,
                    dropped: st.dropped,
                    bytes: written,
                };
            }
        }
    }
}

fn write_chunk(file: &mut File, items: &[u8]) -> std::io::Result<u64> {
    let len = u32::try_from(items.len()).map_err(std::io::Error::other)?;
    let mut head = [0u8; CHUNK_HEAD];
    head[..4].copy_from_slice(&CHUNK_MAGIC);
    head[4..8].copy_from_slice(&len.to_le_bytes());
    head[8..].copy_from_slice(&xxhash_rust::xxh3::xxh3_64(items).to_le_bytes());
    file.write_all(&head)?;
    file.write_all(items)?;
    Ok((CHUNK_HEAD + items.len()) as u64)
}

/// This machine's name, as traces are named and described.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}
