//! `tessera._tessera.File`: an open file of the cluster, seen from Python as a binary file.
//!
//! Reads go stripe by stripe: each stripe is received from the network straight into a new
//! `bytes` object (`sink.rs`). A read of exactly one stripe from its start (`read(stripe
//! size)` at an aligned cursor, or the file's tail) returns that object: no copy but the
//! kernel's. Other reads copy from it once into the `bytes` object they return. The last stripe
//! read is kept, so small reads (a CSV parser's 64 KiB, a Parquet footer) cost a memory copy,
//! not a round trip each; the client's read-ahead keeps the next stripes in flight on
//! sequential reads. Writes are copied once, into the client's stripe buffers. Every call
//! releases the GIL while it waits for the cluster.

use crate::error::{at, to_py};
use crate::sink::{BytesSinks, FileSinks};
use crate::{inode_dict, new_bytes, runtime};
use bytes::Bytes;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::io::SeekFrom;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tessera_client::{Error, File};

/// The open handle and the cursor.
pub(crate) struct Handle {
    file: Option<File>,
    pos: u64,
    /// The last stripe read: (stripe index, its bytes from the stripe's start).
    cached: Option<(u64, Bytes)>,
}

/// Stripe `idx` (its bytes from the stripe's start), through `cached`.
async fn stripe_at(
    file: &mut File,
    stripe: u64,
    idx: u64,
    cached: &mut Option<(u64, Bytes)>,
) -> Result<Bytes, Error> {
    if let Some((i, b)) = cached {
        if *i == idx {
            return Ok(b.clone());
        }
    }
    let b = file.read_at(idx * stripe, stripe as usize).await?;
    *cached = Some((idx, b.clone()));
    Ok(b)
}

/// Reads from `pos` into `out`, stripe by stripe through `cached`; returns the bytes read
/// (fewer than `out.len()` only at the end of the file).
async fn read_into(
    file: &mut File,
    stripe: u64,
    mut pos: u64,
    out: &mut [u8],
    cached: &mut Option<(u64, Bytes)>,
) -> Result<usize, Error> {
    let mut done = 0;
    while done < out.len() {
        let idx = pos / stripe;
        let data = stripe_at(file, stripe, idx, cached).await?;
        let start = (pos - idx * stripe) as usize;
        if start >= data.len() {
            break;
        }
        let n = (data.len() - start).min(out.len() - done);
        out[done..done + n].copy_from_slice(&data[start..start + n]);
        done += n;
        pos += n as u64;
        if data.len() < stripe as usize {
            break; // the end of the file
        }
    }
    Ok(done)
}

/// An open file of a Tessera cluster (binary). Use it through `tessera.Client.open`, which
/// wraps it in a standard `io` object; this class is the raw handle.
#[pyclass(module = "tessera._tessera", name = "File")]
pub struct PyFile {
    handle: Mutex<Handle>,
    path: String,
    mode: String,
    readable: bool,
    writable: bool,
    append: bool,
    stripe: u64,
    sinks: Arc<BytesSinks>,
}

impl PyFile {
    pub(crate) fn new(mut file: File, path: String, mode: String, stripe: u64) -> Self {
        let (readable, writable, append) = mode_flags(&mode);
        let sinks = Arc::new(BytesSinks::default());
        file.set_read_sinks(Arc::new(FileSinks(sinks.clone())));
        Self {
            handle: Mutex::new(Handle {
                file: Some(file),
                pos: 0,
                cached: None,
            }),
            path,
            mode,
            readable,
            writable,
            append,
            stripe,
            sinks,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Handle> {
        self.handle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn mode_flags(mode: &str) -> (bool, bool, bool) {
    let plus = mode.contains('+');
    let readable = mode.contains('r') || plus;
    let writable = !mode.contains('r') || plus;
    (readable, writable, mode.contains('a'))
}

fn closed() -> PyErr {
    PyValueError::new_err("I/O operation on closed file")
}

pyo3::import_exception!(io, UnsupportedOperation);

fn unsupported(what: &str) -> PyErr {
    UnsupportedOperation::new_err(what.to_string())
}

#[pymethods]
impl PyFile {
    /// Reads up to `size` bytes from the cursor (all the rest if `size` is negative or None);
    /// returns fewer only at the end of the file, and `b""` there.
    #[pyo3(signature = (size = -1))]
    fn read<'py>(&self, py: Python<'py>, size: Option<i64>) -> PyResult<Bound<'py, PyBytes>> {
        if !self.readable {
            return Err(unsupported("File not open for reading"));
        }
        let mut h = self.lock();
        let pos = h.pos;
        let avail = h
            .file
            .as_ref()
            .ok_or_else(closed)?
            .len()
            .saturating_sub(pos);
        let want = match size {
            Some(n) if n >= 0 => avail.min(n as u64),
            _ => avail,
        };
        let want = usize::try_from(want).map_err(|_| PyValueError::new_err("read too large"))?;
        let stripe = self.stripe;
        let h = &mut *h;
        if want > 0 && pos.is_multiple_of(stripe) && want as u64 <= stripe {
            let data = py.detach(|| {
                let Handle { file, cached, .. } = &mut *h;
                let file = file
                    .as_mut()
                    .ok_or(Error::BadHandle("anything: it is closed"))?;
                runtime().block_on(stripe_at(file, stripe, pos / stripe, cached))
            });
            let data = data.map_err(at(&self.path))?;
            if data.len() == want {
                if let Some(obj) = self.sinks.object(py, &data) {
                    h.pos += want as u64;
                    return Ok(obj);
                }
            }
        }
        // SAFETY: Python gets `bytes` only once all `want` bytes were read into it; a short
        // read returns a copy of the filled part instead.
        let (bytes, buf) = unsafe { new_bytes(py, want)? };
        let got = py.detach(|| {
            let Handle { file, cached, .. } = h;
            let file = file
                .as_mut()
                .ok_or(Error::BadHandle("anything: it is closed"))?;
            runtime().block_on(read_into(file, stripe, pos, buf, cached))
        });
        let got = got.map_err(at(&self.path))?;
        h.pos += got as u64;
        if got < want {
            return Ok(PyBytes::new(py, &bytes.as_bytes()[..got]));
        }
        Ok(bytes)
    }

    /// Writes `data` (a `bytes` object) at the cursor (at the end in append mode); returns
    /// its length. The bytes may still be in flight: `flush` or `close` reports failures.
    fn write(&self, py: Python<'_>, data: &[u8]) -> PyResult<usize> {
        if !self.writable {
            return Err(unsupported("File not open for writing"));
        }
        let append = self.append;
        let mut h = self.lock();
        let h = &mut *h;
        py.detach(|| {
            let file = h
                .file
                .as_mut()
                .ok_or(Error::BadHandle("anything: it is closed"))?;
            h.cached = None;
            let n = runtime().block_on(file.write_at(h.pos, data))?;
            h.pos = if append { file.len() } else { h.pos + n as u64 };
            Ok(n)
        })
        .map_err(|e: Error| to_py(&e, Some(&self.path)))
    }

    /// Moves the cursor (`whence` 0: from the start, 1: from the cursor, 2: from the end) and
    /// returns its new position.
    #[pyo3(signature = (offset, whence = 0))]
    fn seek(&self, offset: i64, whence: i32) -> PyResult<u64> {
        let mut h = self.lock();
        let size = h.file.as_ref().ok_or_else(closed)?.len();
        let to = match whence {
            0 => u64::try_from(offset).ok().map(SeekFrom::Start),
            1 => Some(SeekFrom::Current(offset)),
            2 => Some(SeekFrom::End(offset)),
            _ => {
                return Err(PyValueError::new_err(format!(
                    "invalid whence ({whence}, should be 0, 1 or 2)"
                )))
            }
        };
        let pos = match to {
            Some(SeekFrom::Start(p)) => Some(p),
            Some(SeekFrom::Current(d)) => h.pos.checked_add_signed(d),
            Some(SeekFrom::End(d)) => size.checked_add_signed(d),
            None => None,
        };
        h.pos = pos.ok_or_else(|| PyErr::from(std::io::Error::from_raw_os_error(libc::EINVAL)))?;
        Ok(h.pos)
    }

    /// The cursor.
    fn tell(&self) -> PyResult<u64> {
        let h = self.lock();
        h.file.as_ref().ok_or_else(closed)?;
        Ok(h.pos)
    }

    /// Waits until everything written is stored and publishes the size (close-to-open: a
    /// process that opens the file afterwards sees it).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let mut h = self.lock();
        let h = &mut *h;
        let Some(file) = h.file.as_mut() else {
            return Ok(());
        };
        if !self.writable {
            return Ok(());
        }
        py.detach(|| runtime().block_on(file.flush()))
            .map_err(at(&self.path))
    }

    /// Flushes and releases the handle; reports any write that failed. Closing twice is fine.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let file = self.lock().file.take();
        let Some(file) = file else {
            return Ok(());
        };
        py.detach(|| runtime().block_on(file.close()))
            .map_err(at(&self.path))
    }

    /// Cuts or extends the file to `size` (default: the cursor); returns the new size.
    #[pyo3(signature = (size = None))]
    fn truncate(&self, py: Python<'_>, size: Option<u64>) -> PyResult<u64> {
        if !self.writable {
            return Err(unsupported("File not open for writing"));
        }
        let mut h = self.lock();
        let h = &mut *h;
        let size = size.unwrap_or(h.pos);
        let file = h.file.as_mut().ok_or_else(closed)?;
        h.cached = None;
        py.detach(|| runtime().block_on(file.set_len(size)))
            .map_err(at(&self.path))?;
        Ok(size)
    }

    /// Fresh attributes of the open file (with what this handle wrote but not yet published).
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let h = self.lock();
        let file = h.file.as_ref().ok_or_else(closed)?;
        let inode = py
            .detach(|| runtime().block_on(file.metadata()))
            .map_err(at(&self.path))?;
        inode_dict(py, &self.path, &inode)
    }

    /// The size as this handle sees it (at open, plus its own writes and truncates).
    #[getter]
    fn size(&self) -> PyResult<u64> {
        Ok(self.lock().file.as_ref().ok_or_else(closed)?.len())
    }

    #[getter]
    fn closed(&self) -> bool {
        self.lock().file.is_none()
    }

    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    #[getter]
    fn mode(&self) -> &str {
        &self.mode
    }

    fn readable(&self) -> bool {
        self.readable
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn seekable(&self) -> bool {
        true
    }
}

impl Drop for PyFile {
    fn drop(&mut self) {
        // Dropped without close: the client finishes the handle in the background, which
        // needs the runtime's context.
        let file = self.lock().file.take();
        if let Some(file) = file {
            let _guard = runtime().enter();
            drop(file);
        }
    }
}
