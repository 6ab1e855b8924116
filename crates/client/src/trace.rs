//! Tracing the library's calls (docs/TRACING.md): a program linked with the client (a Rust
//! program, or Python through the `tessera` package) can have each call it makes by path, and
//! each call on a file it opened by path, written as one record into a trace file, in the
//! format a mount writes (`tessera_trace`), in mode `library`. Off (no
//! [`ClientOptions::trace`](crate::ClientOptions::trace)), a call pays one predictable branch.
//!
//! The inode calls a FUSE mount makes are not recorded here: the mount records the kernel's
//! requests itself. A path call records what the program asked for, not the lookups it took
//! (a whole-file `read` records its open, reads and close, as the calls it is made of).

use crate::{Error, Inode, Result};
use std::path::PathBuf;
use std::sync::Arc;
use tessera_trace::{Event, Mode, Op, Writer};

/// `flags` of a stat (`lstat`) that does not follow a final symbolic link: `AT_SYMLINK_NOFOLLOW`.
pub(crate) const NOFOLLOW: u32 = 0x100;
/// `flags` of a `create_dir_all` (with the mode) or a `remove_all`: missing parents made, or
/// a whole tree removed.
pub(crate) const PARENTS: u32 = 1 << 31;

/// Where a client writes its trace, and the writer's memory and flush interval.
#[derive(Debug, Clone)]
pub struct TraceOptions {
    /// A new file `<host>-<pid>-<n>.ttrace` is written in this directory.
    pub dir: PathBuf,
    pub writer: tessera_trace::Options,
}

impl TraceOptions {
    #[must_use]
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        TraceOptions {
            dir: dir.into(),
            writer: tessera_trace::Options::default(),
        }
    }
}

/// The trace a client and the files it opened by path write to.
pub(crate) struct Tracer {
    writer: Writer,
    path: PathBuf,
    pid: u32,
    /// This process's name, as a mount would record it.
    exe: Option<Box<[u8]>>,
}

impl Tracer {
    pub(crate) fn start(opts: &TraceOptions) -> Result<Tracer> {
        let exe = std::fs::read("/proc/self/comm").ok().map(|mut c| {
            if c.last() == Some(&b'\n') {
                c.pop();
            }
            c.into_boxed_slice()
        });
        let source = format!(
            "library {}",
            String::from_utf8_lossy(exe.as_deref().unwrap_or(b"?"))
        );
        let failed = |e: std::io::Error| {
            Error::Invalid(format!("cannot trace into {}: {e}", opts.dir.display()))
        };
        std::fs::create_dir_all(&opts.dir).map_err(failed)?;
        let (path, writer) =
            Writer::create_in(&opts.dir, source, Mode::Library, &opts.writer).map_err(failed)?;
        tracing::info!("tracing to {}", path.display());
        Ok(Tracer {
            writer,
            path,
            pid: std::process::id(),
            exe,
        })
    }

    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Writes out what was recorded so far.
    pub(crate) fn flush(&self) {
        self.writer.flush();
    }

    /// Finishes the trace: calls after this are not recorded.
    pub(crate) fn close(&self) {
        self.writer.close();
    }
}

/// A call being traced: begun by [`begin`], recorded by [`Span::end`].
pub(crate) struct Span {
    tracer: Arc<Tracer>,
    start: u64,
}

/// Begins a record if `tracer` is there (one branch when it is not).
#[inline]
pub(crate) fn begin(tracer: Option<&Arc<Tracer>>) -> Option<Span> {
    tracer.map(|t| Span {
        start: t.writer.now(),
        tracer: Arc::clone(t),
    })
}

/// What a traced call was asked to do.
pub(crate) struct Call<'a> {
    pub op: Op,
    pub path: &'a [u8],
    pub target: Option<&'a [u8]>,
    pub offset: u64,
    pub size: u64,
    pub server_size: Option<u64>,
    pub flags: u32,
    pub uid: u32,
    /// The file's inode, when the call is on an open file.
    pub ino: u64,
}

impl<'a> Call<'a> {
    pub(crate) fn new(op: Op, path: &'a [u8], uid: u32) -> Self {
        Call {
            op,
            path,
            target: None,
            offset: 0,
            size: 0,
            server_size: None,
            flags: 0,
            uid,
            ino: 0,
        }
    }
}

/// What a call's answer says for its record: the inode it is of, and a count (bytes read,
/// entries listed).
pub(crate) trait Answer {
    fn ino(&self) -> u64 {
        0
    }
    fn count(&self) -> i64 {
        0
    }
}

impl Answer for () {}

impl Answer for usize {
    fn count(&self) -> i64 {
        i64::try_from(*self).unwrap_or(i64::MAX)
    }
}

impl Answer for Inode {
    fn ino(&self) -> u64 {
        self.ino
    }
}

impl Answer for crate::File {
    fn ino(&self) -> u64 {
        crate::File::ino(self)
    }
}

impl<T> Answer for Vec<T> {
    fn count(&self) -> i64 {
        i64::try_from(self.len()).unwrap_or(i64::MAX)
    }
}

impl Answer for bytes::Bytes {
    fn count(&self) -> i64 {
        i64::try_from(self.len()).unwrap_or(i64::MAX)
    }
}

impl Span {
    pub(crate) fn end<T: Answer>(self, call: &Call<'_>, out: &Result<T>) {
        let end_ns = self.tracer.writer.now();
        let (result, ino) = match out {
            Ok(v) => (v.count(), v.ino()),
            Err(e) => (-i64::from(e.errno()), 0),
        };
        let t = &self.tracer;
        t.writer.push(&Event {
            op: call.op,
            mode: Mode::Library,
            via_handle: false,
            pid: t.pid,
            uid: call.uid,
            exe: t.exe.as_deref(),
            ino: if ino != 0 { ino } else { call.ino },
            path: Some(call.path),
            target: call.target,
            offset: call.offset,
            size: call.size,
            server_size: call.server_size,
            flags: call.flags,
            start_ns: self.start,
            end_ns,
            result,
        });
    }
}
