//! `tessera._tessera`: the Tessera client for Python (PyO3). The pure-Python package `tessera`
//! (python/tessera) builds the user-facing API and the fsspec file system on top of it.
//!
//! One multi-thread tokio runtime serves every client of the process. Every call that talks to
//! the cluster releases the GIL (`Python::detach`) and blocks on that runtime, so Python threads
//! run their I/O in parallel. Bulk data is copied once: into the client's stripe buffers on a
//! write, from the network's buffers into the returned `bytes` on a read. Batch calls
//! (`cat_many`, `pipe_many`, `put_many`, `get_many`) keep many files in flight at once.

mod batch;
mod collective;
mod config;
mod error;
mod file;
mod sink;
mod trace;

use batch::{outcomes, run_all};
use bytes::Bytes;
use collective::{collective_err, fixed, CollectiveError, PyCollective};
use error::{at, to_py};
use file::PyFile;
use futures::stream::{self, StreamExt};
use pyo3::exceptions::{PyConnectionError, PyUserWarning, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;
use tessera_client::{
    Client, ClientOptions, Error, File, FileKind, Inode, OpenOptions, TraceOptions,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Files a batch call keeps in flight by default.
const DEFAULT_CONCURRENCY: usize = 32;

/// The process's runtime, started at first use.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("tessera-io")
            .build()
            // Without a runtime nothing works; failing to start threads at import is fatal.
            .unwrap_or_else(|e| panic!("cannot start the Tessera I/O runtime: {e}"))
    })
}

/// A new `bytes` object of `len` bytes, not initialised, and its bytes to fill.
///
/// # Safety
///
/// The caller must fill the whole slice before Python sees the object (an object handed
/// back with fewer bytes filled exposes uninitialised memory), and must not use the slice
/// after the object is dropped.
pub(crate) unsafe fn new_bytes(
    py: Python<'_>,
    len: usize,
) -> PyResult<(Bound<'_, PyBytes>, &mut [u8])> {
    let n = isize::try_from(len).map_err(|_| PyValueError::new_err("too many bytes"))?;
    // SAFETY: PyBytes_FromStringAndSize(NULL, n) returns a new, unshared bytes object of n
    // bytes (or NULL with an exception set, turned into Err); its buffer lives as long as the
    // object, which the returned Bound keeps alive.
    unsafe {
        let obj = pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), n);
        let obj = Bound::from_owned_ptr_or_err(py, obj)?.cast_into_unchecked::<PyBytes>();
        let ptr = pyo3::ffi::PyBytes_AsString(obj.as_ptr()).cast::<u8>();
        if ptr.is_null() {
            return Err(PyErr::fetch(py));
        }
        let buf = std::slice::from_raw_parts_mut(ptr, len);
        Ok((obj, buf))
    }
}

/// One `bytes` object from chunks: one copy, with the GIL released.
fn join_chunks<'py>(py: Python<'py>, chunks: &[Bytes]) -> PyResult<Bound<'py, PyBytes>> {
    if let [one] = chunks {
        return Ok(PyBytes::new(py, one));
    }
    let total = chunks.iter().map(Bytes::len).sum();
    // SAFETY: the chunks fill all `total` bytes before the object is returned.
    let (obj, buf) = unsafe { new_bytes(py, total)? };
    py.detach(|| {
        let mut at = 0;
        for c in chunks {
            buf[at..at + c.len()].copy_from_slice(c);
            at += c.len();
        }
    });
    Ok(obj)
}

/// `/a/b` for `tessera://a/b/`, `a/b`, `/a//b`...
fn norm(path: &str) -> String {
    let path = path
        .strip_prefix("tessera://")
        .or_else(|| path.strip_prefix("tessera:"))
        .unwrap_or(path);
    let parts: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    format!("/{}", parts.join("/"))
}

fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn seconds(t: tessera_client::Timespec) -> f64 {
    t.secs as f64 + f64::from(t.nanos) * 1e-9
}

/// The fsspec-style description of an inode.
pub(crate) fn inode_dict<'py>(
    py: Python<'py>,
    name: &str,
    i: &Inode,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let (kind, fmt) = match i.kind {
        FileKind::File => ("file", libc::S_IFREG),
        FileKind::Dir => ("directory", libc::S_IFDIR),
        FileKind::Symlink => ("link", libc::S_IFLNK),
        FileKind::Fifo => ("other", libc::S_IFIFO),
        FileKind::Socket => ("other", libc::S_IFSOCK),
        FileKind::CharDevice(_) => ("other", libc::S_IFCHR),
        FileKind::BlockDevice(_) => ("other", libc::S_IFBLK),
    };
    d.set_item("name", name)?;
    d.set_item("size", if i.kind == FileKind::Dir { 0 } else { i.size })?;
    d.set_item("type", kind)?;
    d.set_item("mode", fmt | i.mode)?;
    d.set_item("ino", i.ino)?;
    d.set_item("nlink", i.nlink)?;
    d.set_item("uid", i.uid)?;
    d.set_item("gid", i.gid)?;
    d.set_item("mtime", seconds(i.mtime))?;
    d.set_item("atime", seconds(i.atime))?;
    d.set_item("ctime", seconds(i.ctime))?;
    d.set_item("islink", i.kind == FileKind::Symlink)?;
    if i.kind == FileKind::Symlink {
        d.set_item("destination", String::from_utf8_lossy(&i.target).as_ref())?;
    }
    Ok(d)
}

fn open_options(mode: &str) -> PyResult<OpenOptions> {
    let bad = || {
        PyValueError::new_err(format!(
            "invalid mode {mode:?}: Tessera files are binary: rb, wb, ab, xb, r+b, w+b, a+b, x+b"
        ))
    };
    let plus = mode.contains('+');
    if !mode.chars().all(|c| "rwaxb+".contains(c))
        || mode.chars().filter(|c| "rwax".contains(*c)).count() != 1
        || mode.matches('b').count() != 1
        || mode.matches('+').count() > 1
    {
        return Err(bad());
    }
    let mut o = OpenOptions {
        read: plus,
        ..OpenOptions::default()
    };
    if mode.contains('r') {
        o.read = true;
        o.write = plus;
    } else if mode.contains('w') {
        o.write = true;
        o.create = true;
        o.truncate = true;
    } else if mode.contains('a') {
        o.append = true;
        o.create = true;
    } else {
        o.write = true;
        o.create_new = true;
    }
    Ok(o)
}

/// Resolves a byte range the way fsspec does: negative positions count from the end.
fn range(size: u64, start: Option<i64>, end: Option<i64>) -> (u64, u64) {
    let at = |p: i64| {
        if p < 0 {
            size.saturating_sub(p.unsigned_abs())
        } else {
            (p as u64).min(size)
        }
    };
    let s = start.map_or(0, at);
    let e = end.map_or(size, at);
    (s, e.max(s))
}

/// The bytes of `[start, end)` of the file at `path`, stripe by stripe (no copy).
async fn read_range(
    client: &Client,
    path: &str,
    start: Option<i64>,
    end: Option<i64>,
) -> Result<Vec<Bytes>, Error> {
    let mut f = client.open(path, &OpenOptions::read()).await?;
    let out = read_range_of(&mut f, u64::from(client.stripe_size()), start, end).await;
    let closed = f.close().await;
    let out = out?;
    closed?;
    Ok(out)
}

async fn read_range_of(
    f: &mut File,
    stripe: u64,
    start: Option<i64>,
    end: Option<i64>,
) -> Result<Vec<Bytes>, Error> {
    let (mut pos, end) = range(f.len(), start, end);
    let mut out = Vec::new();
    while pos < end {
        let piece = (stripe - pos % stripe).min(end - pos);
        let b = f.read_at(pos, piece as usize).await?;
        if b.is_empty() {
            break;
        }
        pos += b.len() as u64;
        out.push(b);
    }
    Ok(out)
}

/// Copies the local file `local` to `remote` in stripe-sized pieces.
async fn put_one(client: &Client, local: &std::path::Path, remote: &str) -> Result<(), Error> {
    let io = |e: std::io::Error| Error::Invalid(format!("{}: {e}", local.display()));
    let mut src = tokio::fs::File::open(local).await.map_err(io)?;
    let stripe = client.stripe_size() as usize;
    let mut dst = client.open(remote, &OpenOptions::create()).await?;
    let mut buf = vec![0u8; stripe];
    let mut pos = 0u64;
    let copied: Result<(), Error> = async {
        loop {
            let mut n = 0;
            while n < stripe {
                match src.read(&mut buf[n..]).await.map_err(io)? {
                    0 => break,
                    k => n += k,
                }
            }
            if n == 0 {
                return Ok(());
            }
            dst.write_at(pos, &buf[..n]).await?;
            pos += n as u64;
        }
    }
    .await;
    let closed = dst.close().await;
    copied?;
    closed
}

/// Copies `remote` to the local file `local`.
async fn get_one(client: &Client, remote: &str, local: &std::path::Path) -> Result<(), Error> {
    let io = |e: std::io::Error| Error::Invalid(format!("{}: {e}", local.display()));
    let mut src = client.open(remote, &OpenOptions::read()).await?;
    let stripe = u64::from(client.stripe_size());
    let copied: Result<(), Error> = async {
        let mut dst = tokio::fs::File::create(local).await.map_err(io)?;
        let mut pos = 0;
        loop {
            let b = src.read_at(pos, stripe as usize).await?;
            if b.is_empty() {
                break;
            }
            pos += b.len() as u64;
            dst.write_all(&b).await.map_err(io)?;
        }
        dst.flush().await.map_err(io)
    }
    .await;
    let closed = src.close().await;
    copied?;
    closed
}

/// Copies a file within the cluster.
async fn copy_one(client: &Client, from: &str, to: &str) -> Result<(), Error> {
    let mut src = client.open(from, &OpenOptions::read()).await?;
    let stripe = u64::from(client.stripe_size());
    let copied = async {
        let mut dst = client.open(to, &OpenOptions::create()).await?;
        let mut pos = 0;
        let written: Result<(), Error> = async {
            loop {
                let b = src.read_at(pos, stripe as usize).await?;
                if b.is_empty() {
                    return Ok(());
                }
                dst.write_at(pos, &b).await?;
                pos += b.len() as u64;
            }
        }
        .await;
        let closed = dst.close().await;
        written.and(closed)
    }
    .await;
    let closed = src.close().await;
    copied.and(closed)
}

/// `seconds` as a duration, for the argument `what`.
fn duration(seconds: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds).map_err(|_| {
        PyValueError::new_err(format!("{what}: {seconds} is not a duration in seconds"))
    })
}

/// A connection to a Tessera cluster, shared by every thread of the process that uses it.
///
/// `manager` (HOST:PORT) and `secret` come from the arguments, else `TESSERA_MANAGER` /
/// `TESSERA_SECRET`, else the configuration file (`config` or `TESSERA_CONFIG`), else the
/// cluster file `tessera up` writes (`$TESSERA_HOME/cluster.toml`).
#[pyclass(module = "tessera._tessera", name = "Client", frozen)]
pub struct PyClient {
    client: Client,
    manager: String,
}

impl PyClient {
    fn run<T: Send>(
        &self,
        py: Python<'_>,
        path: &str,
        f: impl std::future::Future<Output = Result<T, Error>> + Send,
    ) -> PyResult<T> {
        py.detach(|| runtime().block_on(f)).map_err(at(path))
    }
}

#[pymethods]
impl PyClient {
    #[new]
    #[pyo3(signature = (manager = None, secret = None, config = None, timeout = 30.0, trace = None))]
    fn new(
        py: Python<'_>,
        manager: Option<String>,
        secret: Option<String>,
        config: Option<PathBuf>,
        timeout: f64,
        trace: Option<PathBuf>,
    ) -> PyResult<Self> {
        let config::Found {
            addr,
            secret,
            seeds,
            warnings,
        } = config::resolve(manager, secret, config)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        for w in warnings {
            let category = py.get_type::<PyUserWarning>();
            let msg =
                std::ffi::CString::new(w).map_err(|e| PyValueError::new_err(e.to_string()))?;
            PyErr::warn(py, &category, &msg, 2)?;
        }
        let mut opts = ClientOptions::new(addr, &secret);
        opts.seeds = seeds;
        if timeout.is_finite() && timeout >= 0.0 {
            opts.ready_timeout = Duration::from_secs_f64(timeout);
        }
        opts.trace = trace.map(TraceOptions::new);
        let client = py
            .detach(|| runtime().block_on(Client::connect(opts)))
            .map_err(|e| match e {
                Error::Unavailable(m) => {
                    PyConnectionError::new_err(format!("cannot reach the manager at {addr}: {m}"))
                }
                e => to_py(&e, None),
            })?;
        Ok(Self {
            client,
            manager: addr.to_string(),
        })
    }

    /// The manager address this client connected to.
    #[getter]
    fn manager(&self) -> &str {
        &self.manager
    }

    /// The trace file this client's calls are recorded in (`trace=`), or None.
    #[getter]
    fn trace_file(&self) -> Option<PathBuf> {
        self.client.trace_file().map(PathBuf::from)
    }

    /// Writes out the trace's records so far (also done every 250 ms).
    fn flush_trace(&self, py: Python<'_>) {
        py.detach(|| self.client.flush_trace());
    }

    /// Finishes the trace: later calls are not recorded (done at exit).
    fn stop_trace(&self, py: Python<'_>) {
        py.detach(|| self.client.stop_trace());
    }

    /// The cluster's stripe size in bytes.
    #[getter]
    fn stripe_size(&self) -> u32 {
        self.client.stripe_size()
    }

    /// Attributes of `path` as a dict (name, size, type, mode, mtime...); symbolic links are
    /// followed unless `follow` is false.
    #[pyo3(signature = (path, follow = true))]
    fn info<'py>(&self, py: Python<'py>, path: &str, follow: bool) -> PyResult<Bound<'py, PyDict>> {
        let c = &self.client;
        let p = norm(path);
        let inode = self.run(py, &p, async {
            if follow {
                c.stat(&p).await
            } else {
                c.lstat(&p).await
            }
        })?;
        inode_dict(py, &p, &inode)
    }

    /// Whether `path` exists.
    fn exists(&self, py: Python<'_>, path: &str) -> PyResult<bool> {
        let p = norm(path);
        let c = &self.client;
        match py.detach(|| runtime().block_on(c.stat(&p))) {
            Ok(_) => Ok(true),
            Err(e) if matches!(e.errno(), libc::ENOENT | libc::ENOTDIR) => Ok(false),
            Err(e) => Err(to_py(&e, Some(&p))),
        }
    }

    /// The entries of the directory `path`: dicts as `info` gives (`detail=True`) or full
    /// paths, sorted by name.
    #[pyo3(signature = (path, detail = true))]
    fn ls<'py>(&self, py: Python<'py>, path: &str, detail: bool) -> PyResult<Bound<'py, PyList>> {
        let p = norm(path);
        let c = &self.client;
        let mut entries = self.run(py, &p, c.read_dir(&p))?;
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let items: Vec<Py<PyAny>> = entries
            .iter()
            .map(|(name, inode)| {
                let full = join(&p, &String::from_utf8_lossy(name));
                if detail {
                    inode_dict(py, &full, inode).map(|d| d.into_any().unbind())
                } else {
                    Ok(pyo3::types::PyString::new(py, &full).into_any().unbind())
                }
            })
            .collect::<PyResult<_>>()?;
        PyList::new(py, items)
    }

    /// Creates the directory `path`: its parent must exist unless `parents`; an existing
    /// directory is an error unless `exist_ok`.
    #[pyo3(signature = (path, parents = false, exist_ok = false))]
    fn mkdir(&self, py: Python<'_>, path: &str, parents: bool, exist_ok: bool) -> PyResult<()> {
        let p = norm(path);
        let c = &self.client;
        self.run(py, &p, async {
            match c.stat(&p).await {
                Ok(i) if i.kind == FileKind::Dir && exist_ok => return Ok(()),
                Ok(_) => return Err(tessera_client::ErrorCode::Exists.into()),
                Err(_) => {}
            }
            let made = if parents {
                c.create_dir_all(&p).await
            } else {
                c.create_dir(&p).await
            };
            match made {
                Err(e) if exist_ok && e.errno() == libc::EEXIST => match c.stat(&p).await? {
                    i if i.kind == FileKind::Dir => Ok(()),
                    _ => Err(e),
                },
                r => r.map(|_| ()),
            }
        })
    }

    /// Removes the file `path`, or with `recursive` a directory and everything below it.
    /// A directory without `recursive` is an IsADirectoryError (use `rmdir`).
    #[pyo3(signature = (path, recursive = false))]
    fn rm(&self, py: Python<'_>, path: &str, recursive: bool) -> PyResult<()> {
        let p = norm(path);
        let c = &self.client;
        self.run(py, &p, async {
            if recursive {
                return c.remove_all(&p).await;
            }
            if c.lstat(&p).await?.kind == FileKind::Dir {
                return Err(tessera_client::ErrorCode::IsDir.into());
            }
            c.remove_file(&p).await
        })
    }

    /// Removes the empty directory `path`.
    fn rmdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let p = norm(path);
        let c = &self.client;
        self.run(py, &p, c.remove_dir(&p))
    }

    /// Renames `src` to `dst` (atomic within one directory; replaces a file or empty
    /// directory at `dst`).
    fn mv(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        let (s, d) = (norm(src), norm(dst));
        let c = &self.client;
        self.run(py, &s, c.rename_path(&s, &d))
    }

    /// Copies the file `src` to `dst` within the cluster.
    fn copy(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        let (s, d) = (norm(src), norm(dst));
        let c = &self.client;
        self.run(py, &s, copy_one(c, &s, &d))
    }

    /// Opens `path` in a binary mode (rb, wb, ab, xb, r+b, w+b, a+b, x+b) and returns the
    /// raw handle.
    #[pyo3(signature = (path, mode = "rb"))]
    fn open(&self, py: Python<'_>, path: &str, mode: &str) -> PyResult<PyFile> {
        let opts = open_options(mode)?;
        let p = norm(path);
        let c = &self.client;
        let file = self.run(py, &p, async {
            let f = c.open(&p, &opts).await?;
            if f.attr().kind == FileKind::Dir {
                let _ = f.close().await;
                return Err(tessera_client::ErrorCode::IsDir.into());
            }
            Ok(f)
        })?;
        let f = PyFile::new(file, p, mode.to_string(), u64::from(c.stripe_size()));
        Ok(f)
    }

    /// The bytes of `path` from `start` to `end` (None: the start / the end; negative:
    /// counted from the end).
    #[pyo3(signature = (path, start = None, end = None))]
    fn cat<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        start: Option<i64>,
        end: Option<i64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let p = norm(path);
        let chunks = self.run(py, &p, read_range(&self.client, &p, start, end))?;
        join_chunks(py, &chunks)
    }

    /// Creates or replaces the file `path` with `data`.
    fn pipe(&self, py: Python<'_>, path: &str, data: &[u8]) -> PyResult<()> {
        let p = norm(path);
        self.run(py, &p, self.client.write(&p, data))
    }

    /// Changes the permission bits of `path`.
    fn chmod(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        let p = norm(path);
        self.run(py, &p, self.client.set_mode(&p, mode)).map(|_| ())
    }

    /// Capacity and use of the cluster: capacity, used, inodes and nodes.
    fn usage<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let u = self.run(py, "/", self.client.usage())?;
        let d = PyDict::new(py);
        d.set_item("capacity", u.capacity)?;
        d.set_item("used", u.used)?;
        d.set_item("inodes", u.inodes)?;
        d.set_item("nodes", u.nodes)?;
        Ok(d)
    }

    /// Many `cat`s at once, `concurrency` files in flight: a list with, for every path, its
    /// bytes or the exception reading it raised.
    #[pyo3(signature = (paths, starts = None, ends = None, concurrency = DEFAULT_CONCURRENCY))]
    fn cat_many<'py>(
        &self,
        py: Python<'py>,
        paths: Vec<String>,
        starts: Option<Vec<Option<i64>>>,
        ends: Option<Vec<Option<i64>>>,
        concurrency: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let n = paths.len();
        let starts = starts.unwrap_or_else(|| vec![None; n]);
        let ends = ends.unwrap_or_else(|| vec![None; n]);
        if starts.len() != n || ends.len() != n {
            return Err(PyValueError::new_err(
                "paths, starts and ends differ in length",
            ));
        }
        let paths: Vec<String> = paths.iter().map(|p| norm(p)).collect();
        let client = &self.client;
        let results: Vec<Result<Vec<Bytes>, Error>> = py.detach(|| {
            let jobs = paths.iter().zip(starts).zip(ends).map(|((p, s), e)| {
                let (c, p) = (client.clone(), p.clone());
                async move { read_range(&c, &p, s, e).await }
            });
            run_all(jobs, concurrency)
        });
        let items: Vec<Py<PyAny>> = results
            .into_iter()
            .zip(&paths)
            .map(|(r, p)| match r {
                Ok(chunks) => join_chunks(py, &chunks).map(|b| b.into_any().unbind()),
                Err(e) => Ok(to_py(&e, Some(p)).into_value(py).into_any()),
            })
            .collect::<PyResult<_>>()?;
        PyList::new(py, items)
    }

    /// Many `pipe`s at once: `items` are (path, bytes) pairs; returns None or the exception
    /// for every item.
    #[pyo3(signature = (items, concurrency = DEFAULT_CONCURRENCY))]
    fn pipe_many<'py>(
        &self,
        py: Python<'py>,
        items: Vec<(String, Bound<'py, PyBytes>)>,
        concurrency: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let work: Vec<(String, &[u8])> =
            items.iter().map(|(p, b)| (norm(p), b.as_bytes())).collect();
        let client = &self.client;
        let results = py.detach(|| {
            runtime().block_on(
                stream::iter(work.iter().map(|(p, d)| client.write(p, d)))
                    .buffered(concurrency.max(1))
                    .collect::<Vec<_>>(),
            )
        });
        let names: Vec<String> = work.into_iter().map(|(p, _)| p).collect();
        outcomes(py, results, &names)
    }

    /// Copies local files to the cluster, `concurrency` at once: `pairs` are (local path,
    /// cluster path); parents must exist. Returns None or the exception for every pair.
    #[pyo3(signature = (pairs, concurrency = DEFAULT_CONCURRENCY))]
    fn put_many<'py>(
        &self,
        py: Python<'py>,
        pairs: Vec<(PathBuf, String)>,
        concurrency: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let pairs: Vec<(PathBuf, String)> = pairs.into_iter().map(|(l, r)| (l, norm(&r))).collect();
        let client = &self.client;
        let results = py.detach(|| {
            let jobs = pairs.iter().map(|(l, r)| {
                let (c, l, r) = (client.clone(), l.clone(), r.clone());
                async move { put_one(&c, &l, &r).await }
            });
            run_all(jobs, concurrency)
        });
        let names: Vec<String> = pairs.into_iter().map(|(_, r)| r).collect();
        outcomes(py, results, &names)
    }

    /// Copies cluster files to local files, `concurrency` at once: `pairs` are (cluster path,
    /// local path); local parents must exist. Returns None or the exception for every pair.
    #[pyo3(signature = (pairs, concurrency = DEFAULT_CONCURRENCY))]
    fn get_many<'py>(
        &self,
        py: Python<'py>,
        pairs: Vec<(String, PathBuf)>,
        concurrency: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let pairs: Vec<(String, PathBuf)> = pairs.into_iter().map(|(r, l)| (norm(&r), l)).collect();
        let client = &self.client;
        let results = py.detach(|| {
            let jobs = pairs.iter().map(|(r, l)| {
                let (c, r, l) = (client.clone(), r.clone(), l.clone());
                async move { get_one(&c, &r, &l).await }
            });
            run_all(jobs, concurrency)
        });
        let names: Vec<String> = pairs.into_iter().map(|(r, _)| r).collect();
        outcomes(py, results, &names)
    }

    /// Joins the collective output `path` as writer `rank` of `writers` (see
    /// `tessera.collective`).
    #[pyo3(signature = (
        path, writers, rank, sorted = false, threshold = 16 << 20, top = None,
        strategy = "least-loaded", coordinators_per_node = 1, memory = 64 << 20,
        timeout = 10.0, join_timeout = 300.0, record_size = None, key_range = None,
        order = "rank",
    ))]
    #[allow(clippy::too_many_arguments)]
    fn collective(
        &self,
        py: Python<'_>,
        path: &str,
        writers: u32,
        rank: u32,
        sorted: bool,
        threshold: usize,
        top: Option<u64>,
        strategy: &str,
        coordinators_per_node: usize,
        memory: usize,
        timeout: f64,
        join_timeout: f64,
        record_size: Option<u64>,
        key_range: Option<(u64, u64)>,
        order: &str,
    ) -> PyResult<PyCollective> {
        let p = norm(path);
        let opts = tessera_collective::Options {
            sorted,
            order: order.parse().map_err(PyValueError::new_err)?,
            threshold,
            top,
            fixed: fixed(record_size, key_range)?,
            strategy: strategy.parse().map_err(PyValueError::new_err)?,
            coordinators_per_node,
            memory,
            timeout: duration(timeout, "timeout")?,
            join_timeout: duration(join_timeout, "join_timeout")?,
            ..tessera_collective::Options::new(writers, rank)
        };
        let c = &self.client;
        let w = py
            .detach(|| runtime().block_on(tessera_collective::Collective::join(c, &p, opts)))
            .map_err(|e| collective_err(e, &p))?;
        Ok(PyCollective::new(w, p))
    }

    /// Waits until the collective output `path` is in place and returns its size; raises
    /// `CollectiveError` with the reason if its writers failed (`timeout`: seconds, or None
    /// to wait as long as it takes).
    #[pyo3(signature = (path, timeout = None))]
    fn wait_output(&self, py: Python<'_>, path: &str, timeout: Option<f64>) -> PyResult<u64> {
        let p = norm(path);
        let timeout = timeout.map(|t| duration(t, "timeout")).transpose()?;
        let c = &self.client;
        py.detach(|| runtime().block_on(tessera_collective::wait_output(c, &p, timeout)))
            .map_err(|e| collective_err(e, &p))
    }
}

/// Where `tessera up` writes the cluster file (`$TESSERA_HOME/cluster.toml`).
#[pyfunction]
fn cluster_file() -> PathBuf {
    config::cluster_file()
}

/// The module `tessera._tessera`.
#[pymodule]
fn _tessera(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyClient>()?;
    m.add_class::<PyFile>()?;
    m.add_class::<PyCollective>()?;
    m.add("CollectiveError", m.py().get_type::<CollectiveError>())?;
    m.add_function(wrap_pyfunction!(cluster_file, m)?)?;
    m.add_function(wrap_pyfunction!(trace::read_trace, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
