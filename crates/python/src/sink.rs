//! `bytes` objects as the memory read answers are received into (`tessera_client::ReadSinks`).
//!
//! A stripe read is received from the socket straight into a new `bytes` object; when a Python
//! `read` asks for exactly that stripe, the object itself is returned: the data is copied once,
//! by the kernel, as for the Rust client. The objects are found again by the address of their
//! data, which the `Bytes` the client returns starts at.

use crate::new_bytes;
use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tessera_client::ReadSinks;
use tessera_client::Sink;

/// The `bytes` objects of one open file that are sinks still referenced by the client, by the
/// address of their data.
#[derive(Default)]
pub(crate) struct BytesSinks {
    live: Mutex<HashMap<usize, Py<PyBytes>>>,
}

impl BytesSinks {
    fn lock(&self) -> MutexGuard<'_, HashMap<usize, Py<PyBytes>>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The `bytes` object whose whole content `data` is, if it was received as one.
    pub(crate) fn object<'py>(&self, py: Python<'py>, data: &Bytes) -> Option<Bound<'py, PyBytes>> {
        let live = self.lock();
        let obj = live.get(&(data.as_ptr() as usize))?.bind(py);
        (obj.as_bytes().len() == data.len()).then(|| obj.clone())
    }
}

/// A sink in a `bytes` object registered in `BytesSinks`; dropping it (when the client lets go
/// of the `Bytes` it backs) forgets the object, which lives on if Python holds it.
struct BytesSink {
    ptr: *mut u8,
    len: usize,
    owner: Arc<BytesSinks>,
}

// SAFETY: the pointer is into a `bytes` object kept alive by `owner`'s map until this sink is
// dropped; nothing else writes it (the object is new and reaches Python only once filled).
unsafe impl Send for BytesSink {}

impl Sink for BytesSink {
    fn buf(&mut self) -> &mut [u8] {
        // SAFETY: see `Send`: `len` bytes at `ptr`, alive and written only through this sink.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: as in `buf`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for BytesSink {
    fn drop(&mut self) {
        // Without the interpreter attached, pyo3 defers the reference drop to the next attach.
        let obj = self.owner.lock().remove(&(self.ptr as usize));
        drop(obj);
    }
}

/// The `ReadSinks` of one file: shares the map with the `PyFile` that looks objects up.
pub(crate) struct FileSinks(pub(crate) Arc<BytesSinks>);

impl ReadSinks for FileSinks {
    fn sink(&self, len: usize) -> Option<Box<dyn Sink>> {
        Python::attach(|py| {
            // SAFETY: the object is handed to Python (`BytesSinks::object`) only once the
            // client has filled the whole sink; until then the map only keeps it alive.
            let (obj, buf) = unsafe { new_bytes(py, len).ok()? };
            let ptr = buf.as_mut_ptr();
            self.0.lock().insert(ptr as usize, obj.unbind());
            Some(Box::new(BytesSink {
                ptr,
                len,
                owner: self.0.clone(),
            }) as Box<dyn Sink>)
        })
    }
}
