//! `tessera trace export --format parquet`: a trace's records as one Parquet table (pandas,
//! pyarrow, polars), written a batch at a time, so a trace of any length fits in memory. The
//! header, the gaps and how the trace ended go into the file's key/value metadata.

use anyhow::{Context, Result};
use arrow_array::builder::{BooleanBuilder, Int64Builder, StringBuilder};
use arrow_array::builder::{UInt32Builder, UInt64Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use std::path::Path;
use std::sync::Arc;
use tessera_trace::{Item, Reader, Record};

/// Rows per record batch (and at most per row group).
const BATCH: usize = 65536;

/// The table's columns, in order: a record's fields (docs/TRACING.md).
fn schema() -> Schema {
    let col = |name, t, nullable| Field::new(name, t, nullable);
    Schema::new(vec![
        col("op", DataType::Utf8, false),
        col("mode", DataType::Utf8, false),
        col("via_handle", DataType::Boolean, false),
        col("pid", DataType::UInt32, false),
        col("exe", DataType::Utf8, true),
        col("uid", DataType::UInt32, false),
        col("ino", DataType::UInt64, false),
        col("path", DataType::Utf8, true),
        col("target", DataType::Utf8, true),
        col("offset", DataType::UInt64, false),
        col("size", DataType::UInt64, false),
        col("server_size", DataType::UInt64, true),
        col("flags", DataType::UInt32, false),
        col("start_ns", DataType::UInt64, false),
        col("end_ns", DataType::UInt64, false),
        col("result", DataType::Int64, false),
    ])
}

#[derive(Default)]
struct Columns {
    op: StringBuilder,
    mode: StringBuilder,
    via_handle: BooleanBuilder,
    pid: UInt32Builder,
    exe: StringBuilder,
    uid: UInt32Builder,
    ino: UInt64Builder,
    path: StringBuilder,
    target: StringBuilder,
    offset: UInt64Builder,
    size: UInt64Builder,
    server_size: UInt64Builder,
    flags: UInt32Builder,
    start_ns: UInt64Builder,
    end_ns: UInt64Builder,
    result: Int64Builder,
    rows: usize,
}

impl Columns {
    fn push(&mut self, r: &Record) {
        self.op.append_value(r.op.name());
        self.mode.append_value(r.mode.name());
        self.via_handle.append_value(r.via_handle);
        self.pid.append_value(r.pid);
        self.exe.append_option(r.exe.as_deref());
        self.uid.append_value(r.uid);
        self.ino.append_value(r.ino);
        self.path.append_option(r.path.as_deref());
        self.target.append_option(r.target.as_deref());
        self.offset.append_value(r.offset);
        self.size.append_value(r.size);
        self.server_size.append_option(r.server_size);
        self.flags.append_value(r.flags);
        self.start_ns.append_value(r.start_ns);
        self.end_ns.append_value(r.end_ns);
        self.result.append_value(r.result);
        self.rows += 1;
    }

    /// The rows pushed so far as a batch; the builders start over.
    fn batch(&mut self, schema: &Arc<Schema>) -> Result<RecordBatch> {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.op.finish()),
            Arc::new(self.mode.finish()),
            Arc::new(self.via_handle.finish()),
            Arc::new(self.pid.finish()),
            Arc::new(self.exe.finish()),
            Arc::new(self.uid.finish()),
            Arc::new(self.ino.finish()),
            Arc::new(self.path.finish()),
            Arc::new(self.target.finish()),
            Arc::new(self.offset.finish()),
            Arc::new(self.size.finish()),
            Arc::new(self.server_size.finish()),
            Arc::new(self.flags.finish()),
            Arc::new(self.start_ns.finish()),
            Arc::new(self.end_ns.finish()),
            Arc::new(self.result.finish()),
        ];
        self.rows = 0;
        Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
    }
}

/// Writes the records of `trace` that overlap `[from, to]` (ns) to `out`, in the trace's order.
pub fn export(trace: &Path, (from, to): (u64, u64), out: &Path) -> Result<()> {
    let mut r = Reader::open(trace).with_context(|| format!("reading {}", trace.display()))?;
    let schema = Arc::new(schema());
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_size(BATCH)
        .build();
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut w = ArrowWriter::try_new(file, Arc::clone(&schema), Some(props))?;
    let mut cols = Columns::default();
    let (mut gaps, mut end) = (Vec::new(), None);
    while let Some(item) = r
        .next_item()
        .with_context(|| format!("reading {}", trace.display()))?
    {
        match item {
            Item::Record(rec) if rec.end_ns >= from && rec.start_ns <= to => {
                cols.push(&rec);
                if cols.rows == BATCH {
                    w.write(&cols.batch(&schema)?)?;
                }
            }
            Item::Record(_) => {}
            Item::Gap(g) => gaps.push(format!("[{},{},{}]", g.dropped, g.from_ns, g.to_ns)),
            Item::End { records, dropped } => end = Some(format!("{records},{dropped}")),
        }
    }
    if cols.rows > 0 {
        w.write(&cols.batch(&schema)?)?;
    }
    let h = r.header();
    let meta = [
        ("tessera.host", h.host.clone()),
        ("tessera.pid", h.pid.to_string()),
        ("tessera.source", h.source.clone()),
        ("tessera.mode", h.mode.name().to_string()),
        ("tessera.clock_unix_ns", h.unix_ns.to_string()),
        // [dropped, from_ns, to_ns] per gap.
        ("tessera.gaps", format!("[{}]", gaps.join(","))),
        // "records,dropped" from the end marker; empty if the writer did not stop cleanly.
        ("tessera.end", end.unwrap_or_default()),
    ];
    for (k, v) in meta {
        w.append_key_value_metadata(KeyValue::new(k.to_string(), v));
    }
    w.close()?;
    Ok(())
}

/// A table of records read back ([`read`]), with what its metadata says of where it came from.
pub struct Table {
    pub records: Vec<Record>,
    /// `tessera.source` and `tessera.mode`, when the table says.
    pub source: Option<String>,
    pub mode: Option<String>,
    pub clock_unix_ns: u64,
}

/// The records of a Parquet table with the export's columns, read whole and put in order of
/// start (a table another tool wrote, such as a Darshan log through `tessera.darshan`, is in
/// no particular order). `op`, `pid`, `offset`, `size`, `start_ns`, `end_ns` and `result` are
/// required, of any integer type; the others may be missing (a missing `ino` is a hash of
/// `path`).
pub fn read(path: &Path) -> Result<Table> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let what = || format!("reading {}", path.display());
    let file = std::fs::File::open(path).with_context(what)?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).with_context(what)?;
    let meta = |key: &str| {
        let kv = builder.metadata().file_metadata().key_value_metadata()?;
        kv.iter().find(|k| k.key == key)?.value.clone()
    };
    let (source, mode) = (meta("tessera.source"), meta("tessera.mode"));
    let clock_unix_ns = meta("tessera.clock_unix_ns")
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut records = Vec::new();
    for batch in builder.build().with_context(what)? {
        let batch = batch.with_context(what)?;
        columns_to_records(&batch, &mut records).with_context(what)?;
    }
    records.sort_by_key(|r| (r.start_ns, r.end_ns));
    Ok(Table {
        records,
        source,
        mode,
        clock_unix_ns,
    })
}

fn columns_to_records(batch: &RecordBatch, out: &mut Vec<Record>) -> Result<()> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int64Type, UInt32Type, UInt64Type};
    use arrow_array::Array;
    let column = |name: &str, t: &DataType, required: bool| -> Result<Option<ArrayRef>> {
        match batch.column_by_name(name) {
            Some(c) => Ok(Some(
                arrow_cast::cast(c, t).with_context(|| format!("column {name:?} is not {t}"))?,
            )),
            None if required => anyhow::bail!("no column {name:?}"),
            None => Ok(None),
        }
    };
    let u64s =
        |name, required| -> Result<Option<ArrayRef>> { column(name, &DataType::UInt64, required) };
    let text = |name| column(name, &DataType::Utf8, false);
    let req = |c: Option<ArrayRef>| c.ok_or_else(|| anyhow::anyhow!("a required column"));
    let op = req(column("op", &DataType::Utf8, true)?)?;
    let pid = req(column("pid", &DataType::UInt32, true)?)?;
    let offset = req(u64s("offset", true)?)?;
    let size = req(u64s("size", true)?)?;
    let start = req(u64s("start_ns", true)?)?;
    let end = req(u64s("end_ns", true)?)?;
    let result = req(column("result", &DataType::Int64, true)?)?;
    let (ino, server) = (u64s("ino", false)?, u64s("server_size", false)?);
    let uid = column("uid", &DataType::UInt32, false)?;
    let flags = column("flags", &DataType::UInt32, false)?;
    let via = column("via_handle", &DataType::Boolean, false)?;
    let (mode, exe, path, target) = (text("mode")?, text("exe")?, text("path")?, text("target")?);
    let s = |c: &Option<ArrayRef>, i: usize| -> Option<Arc<str>> {
        let c = c.as_ref()?.as_string::<i32>();
        (!c.is_null(i)).then(|| Arc::from(c.value(i)))
    };
    let u = |c: &ArrayRef, i: usize| c.as_primitive::<UInt64Type>().value(i);
    let u32_or_0 = |c: &Option<ArrayRef>, i: usize| {
        c.as_ref()
            .filter(|c| !c.is_null(i))
            .map_or(0, |c| c.as_primitive::<UInt32Type>().value(i))
    };
    let ops = op.as_string::<i32>();
    for i in 0..batch.num_rows() {
        let name = ops.value(i);
        let Some(&op) = tessera_trace::Op::ALL.iter().find(|o| o.name() == name) else {
            anyhow::bail!("row {i}: unknown operation {name:?}");
        };
        let path = s(&path, i);
        let ino = match &ino {
            Some(c) if !c.is_null(i) => u(c, i),
            _ => path.as_deref().map_or(0, name_hash),
        };
        out.push(Record {
            op,
            mode: s(&mode, i)
                .and_then(|m| tessera_trace::Mode::from_name(&m))
                .unwrap_or(tessera_trace::Mode::Library),
            via_handle: via.as_ref().is_some_and(|c| c.as_boolean().value(i)),
            pid: pid.as_primitive::<UInt32Type>().value(i),
            uid: u32_or_0(&uid, i),
            exe: s(&exe, i),
            ino,
            path,
            target: s(&target, i),
            offset: u(&offset, i),
            size: u(&size, i),
            server_size: server.as_ref().filter(|c| !c.is_null(i)).map(|c| u(c, i)),
            flags: u32_or_0(&flags, i),
            start_ns: u(&start, i),
            end_ns: u(&end, i),
            result: result.as_primitive::<Int64Type>().value(i),
        });
    }
    Ok(())
}

/// An inode number for a file known by name only.
fn name_hash(path: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    h.finish() | 1
}
