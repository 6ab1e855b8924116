//! `tessera._tessera.Collective`: one writer of a collective output (`tessera.collective`).
//! Appends only buffer (the GIL is kept: no I/O); the calls that write or wait release it.

use crate::error::to_py;
use crate::runtime;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::sync::{Mutex, MutexGuard, PoisonError};
use tessera_collective::{Collective, Error, Fixed, Outcome};

pyo3::create_exception!(
    _tessera,
    CollectiveError,
    PyOSError,
    "A collective output will not be made: a writer died, left or failed (the message says which)."
);

/// The Python exception for a collective output's error.
pub(crate) fn collective_err(e: Error, path: &str) -> PyErr {
    match e {
        Error::Client(e) => to_py(&e, Some(path)),
        Error::Invalid(m) => PyValueError::new_err(m),
        e @ (Error::Failed(_) | Error::Corrupt(_)) => {
            CollectiveError::new_err((e.errno(), e.to_string(), path.to_string()))
        }
    }
}

/// The fixed-size records of `tessera.collective(record_size=, key_range=)`, if given.
pub(crate) fn fixed(
    record_size: Option<u64>,
    key_range: Option<(u64, u64)>,
) -> PyResult<Option<Fixed>> {
    match (record_size, key_range) {
        (None, None) => Ok(None),
        (Some(record_size), Some((lo, hi))) => Ok(Some(Fixed {
            record_size,
            keys: lo..hi,
        })),
        _ => Err(PyValueError::new_err(
            "fixed-size records need both record_size and key_range",
        )),
    }
}

/// One writer of a collective output. Use one object from one thread at a time.
#[pyclass(module = "tessera._tessera", name = "Collective")]
pub struct PyCollective {
    inner: Mutex<Collective>,
    path: String,
}

impl PyCollective {
    pub(crate) fn new(inner: Collective, path: String) -> Self {
        Self {
            inner: Mutex::new(inner),
            path,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Collective> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `push` the record; when the buffer is full, flush it with the GIL released.
    fn add(
        &self,
        py: Python<'_>,
        w: &mut Collective,
        record: &[u8],
        key: Option<&[u8]>,
    ) -> PyResult<()> {
        let full = w
            .push(record, key)
            .map_err(|e| collective_err(e, &self.path))?;
        if full {
            py.detach(|| runtime().block_on(w.flush()))
                .map_err(|e| collective_err(e, &self.path))?;
        }
        Ok(())
    }
}

impl PyCollective {
    /// `place` the record of `key`; when the buffer is full, flush it with the GIL released.
    /// A key given twice: the flush records it as the output's error, and raises.
    fn place(&self, py: Python<'_>, w: &mut Collective, key: u64, record: &[u8]) -> PyResult<()> {
        let full = match w.place(key, record) {
            Ok(full) => full,
            Err(Error::Failed(_)) => true,
            Err(e) => return Err(collective_err(e, &self.path)),
        };
        if full {
            py.detach(|| runtime().block_on(w.flush()))
                .map_err(|e| collective_err(e, &self.path))?;
        }
        Ok(())
    }
}

fn outcome<'py>(py: Python<'py>, o: &Outcome) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("size", o.size)?;
    d.set_item("records", o.records)?;
    d.set_item("coordinators", o.coordinators.clone())?;
    d.set_item("coordinator", o.coordinator)?;
    d.set_item("runs", o.runs)?;
    d.set_item("waited", o.waited.as_secs_f64())?;
    d.set_item("aggregation", o.aggregation.as_secs_f64())?;
    d.set_item("merge", o.merge.map(|m| m.as_secs_f64()))?;
    d.set_item("passes", o.passes)?;
    Ok(d)
}

#[pymethods]
impl PyCollective {
    /// The output's path.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    #[getter]
    fn rank(&self) -> u32 {
        self.lock().options().rank
    }

    #[getter]
    fn writers(&self) -> u32 {
        self.lock().options().writers
    }

    /// Appends a record (with its key if the output is sorted).
    #[pyo3(signature = (record, key = None))]
    fn append(&self, py: Python<'_>, record: &[u8], key: Option<&[u8]>) -> PyResult<()> {
        let mut w = self.lock();
        self.add(py, &mut w, record, key)
    }

    /// Appends many records (and their keys, one per record, if the output is sorted).
    #[pyo3(signature = (records, keys = None))]
    fn append_many(
        &self,
        py: Python<'_>,
        records: Vec<Bound<'_, PyBytes>>,
        keys: Option<Vec<Bound<'_, PyBytes>>>,
    ) -> PyResult<()> {
        if keys.as_ref().is_some_and(|k| k.len() != records.len()) {
            return Err(PyValueError::new_err("records and keys differ in length"));
        }
        let mut w = self.lock();
        for (i, r) in records.iter().enumerate() {
            let key = keys.as_ref().map(|k| k[i].as_bytes());
            self.add(py, &mut w, r.as_bytes(), key)?;
        }
        Ok(())
    }

    /// Puts the fixed-size record of `key`.
    fn put(&self, py: Python<'_>, key: u64, record: &[u8]) -> PyResult<()> {
        let mut w = self.lock();
        self.place(py, &mut w, key, record)
    }

    /// Puts many fixed-size records, one per key.
    fn put_many(
        &self,
        py: Python<'_>,
        keys: Vec<u64>,
        records: Vec<Bound<'_, PyBytes>>,
    ) -> PyResult<()> {
        if keys.len() != records.len() {
            return Err(PyValueError::new_err("records and keys differ in length"));
        }
        let mut w = self.lock();
        for (k, r) in keys.into_iter().zip(&records) {
            self.place(py, &mut w, k, r.as_bytes())?;
        }
        Ok(())
    }

    /// Puts many fixed-size records given one after another in `data`, one per key.
    fn put_packed(&self, py: Python<'_>, keys: Vec<u64>, data: &[u8]) -> PyResult<()> {
        let mut w = self.lock();
        let size = w.options().fixed.as_ref().map_or(0, |f| f.record_size);
        if (keys.len() as u64).checked_mul(size) != Some(data.len() as u64) {
            return Err(PyValueError::new_err(format!(
                "{} bytes are not {} records of {size} bytes",
                data.len(),
                keys.len()
            )));
        }
        for (k, r) in keys.into_iter().zip(data.chunks_exact(size as usize)) {
            self.place(py, &mut w, k, r)?;
        }
        Ok(())
    }

    /// Starts writing the buffer as a run in the background (waits for the run before, if it
    /// is still being written).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let mut guard = self.lock();
        let w = &mut *guard;
        py.detach(|| runtime().block_on(w.flush()))
            .map_err(|e| collective_err(e, &self.path))
    }

    /// Waits until every run issued is written.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        let mut guard = self.lock();
        let w = &mut *guard;
        py.detach(|| runtime().block_on(w.wait()))
            .map_err(|e| collective_err(e, &self.path))
    }

    /// Whether every run issued is written.
    fn test(&self) -> bool {
        self.lock().test()
    }

    /// Writes what is left, waits for every writer, takes part in aggregation; returns what
    /// was made once the output is in place.
    fn finalize<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let mut guard = self.lock();
        let w = &mut *guard;
        let o = py
            .detach(|| runtime().block_on(w.finalise()))
            .map_err(|e| collective_err(e, &self.path))?;
        outcome(py, &o)
    }

    /// Leaves without finishing: the other writers fail, naming this one and `reason`.
    #[pyo3(signature = (reason = "aborted"))]
    fn abort(&self, py: Python<'_>, reason: &str) -> PyResult<()> {
        let mut guard = self.lock();
        let w = &mut *guard;
        py.detach(|| runtime().block_on(w.abort(reason)))
            .map_err(|e| collective_err(e, &self.path))
    }
}
