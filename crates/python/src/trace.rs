//! `read_trace`: a trace file's records as columns, for `tessera.trace.read` to make a pandas
//! DataFrame of (the columns and their names are those of `tessera trace export --format
//! parquet`).

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::path::PathBuf;
use tessera_trace::{Item, Reader, Record};

/// Every record's fields, column by column.
#[derive(Default)]
struct Columns {
    op: Vec<&'static str>,
    mode: Vec<&'static str>,
    via_handle: Vec<bool>,
    pid: Vec<u32>,
    exe: Vec<Option<String>>,
    uid: Vec<u32>,
    ino: Vec<u64>,
    path: Vec<Option<String>>,
    target: Vec<Option<String>>,
    offset: Vec<u64>,
    size: Vec<u64>,
    server_size: Vec<Option<u64>>,
    flags: Vec<u32>,
    start_ns: Vec<u64>,
    end_ns: Vec<u64>,
    result: Vec<i64>,
}

impl Columns {
    fn push(&mut self, r: Record) {
        let text = |s: Option<std::sync::Arc<str>>| s.map(|s| s.to_string());
        self.op.push(r.op.name());
        self.mode.push(r.mode.name());
        self.via_handle.push(r.via_handle);
        self.pid.push(r.pid);
        self.exe.push(text(r.exe));
        self.uid.push(r.uid);
        self.ino.push(r.ino);
        self.path.push(text(r.path));
        self.target.push(text(r.target));
        self.offset.push(r.offset);
        self.size.push(r.size);
        self.server_size.push(r.server_size);
        self.flags.push(r.flags);
        self.start_ns.push(r.start_ns);
        self.end_ns.push(r.end_ns);
        self.result.push(r.result);
    }

    fn into_dict(self, py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("op", self.op)?;
        d.set_item("mode", self.mode)?;
        d.set_item("via_handle", self.via_handle)?;
        d.set_item("pid", self.pid)?;
        d.set_item("exe", self.exe)?;
        d.set_item("uid", self.uid)?;
        d.set_item("ino", self.ino)?;
        d.set_item("path", self.path)?;
        d.set_item("target", self.target)?;
        d.set_item("offset", self.offset)?;
        d.set_item("size", self.size)?;
        d.set_item("server_size", self.server_size)?;
        d.set_item("flags", self.flags)?;
        d.set_item("start_ns", self.start_ns)?;
        d.set_item("end_ns", self.end_ns)?;
        d.set_item("result", self.result)?;
        Ok(d)
    }
}

/// The trace at `path`: (header, columns, gaps, end). The header is a dict (host, pid,
/// source, mode, clock_unix_ns), each gap a dict (dropped, from_ns, to_ns), and `end` the
/// writer's (records, dropped) if it stopped cleanly, else None. A file cut anywhere reads up
/// to its last whole chunk.
#[pyfunction]
#[allow(clippy::type_complexity)] // the tuple Python unpacks
pub fn read_trace(
    py: Python<'_>,
    path: PathBuf,
) -> PyResult<(
    Bound<'_, PyDict>,
    Bound<'_, PyDict>,
    Bound<'_, PyList>,
    Option<(u64, u64)>,
)> {
    let failed = |e: tessera_trace::Error| match e {
        tessera_trace::Error::Io(e) => PyOSError::new_err(format!("{}: {e}", path.display())),
        e => PyValueError::new_err(format!("{}: {e}", path.display())),
    };
    let (header, cols, gaps, end) = py
        .detach(|| {
            let mut r = Reader::open(&path)?;
            let header = r.header().clone();
            let (mut cols, mut gaps, mut end) = (Columns::default(), Vec::new(), None);
            while let Some(item) = r.next_item()? {
                match item {
                    Item::Record(rec) => cols.push(rec),
                    Item::Gap(g) => gaps.push(g),
                    Item::End { records, dropped } => end = Some((records, dropped)),
                }
            }
            Ok((header, cols, gaps, end))
        })
        .map_err(failed)?;
    let h = PyDict::new(py);
    h.set_item("host", &header.host)?;
    h.set_item("pid", header.pid)?;
    h.set_item("source", &header.source)?;
    h.set_item("mode", header.mode.name())?;
    h.set_item("clock_unix_ns", header.unix_ns)?;
    let g = PyList::empty(py);
    for gap in gaps {
        let d = PyDict::new(py);
        d.set_item("dropped", gap.dropped)?;
        d.set_item("from_ns", gap.from_ns)?;
        d.set_item("to_ns", gap.to_ns)?;
        g.append(d)?;
    }
    Ok((h, cols.into_dict(py)?, g, end))
}
