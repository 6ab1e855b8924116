//! The I/O model's page: findings first, each linking to the rows it concerns; the application
//! summary; the charts; then the file, phase, metadata-phase and process tables, each bounded
//! to its heaviest rows (and any row a finding names).

use crate::io_charts::{self, clip};
use crate::page::{
    self, bytes, count, duration, escape, kv_table, per_second, percent, signed_bytes,
};
use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use tessera_model::{
    AccessMode, DataOp, Direction, FileModel, Finding, FindingKind, MetaKind, MetaPhase, Model,
    Phase, Sharing,
};

/// Rows each table shows at most, besides those a finding names.
const FILES: usize = 100;
const PHASES: usize = 100;
const META_PHASES: usize = 50;
const PROCESSES: usize = 50;
/// Files, phases and metadata phases one finding links to at most (each kind).
const REFS: usize = 8;
/// Processes whose initial offset a phase row lists.
const OFFSETS: usize = 3;

/// The model as one self-contained HTML page (no script, no external asset).
pub fn model_report(model: &Model) -> String {
    let mut named = Shown::default();
    for f in &model.findings {
        named.files.extend(f.files.iter().take(REFS));
        named.phases.extend(f.phases.iter().take(REFS));
        named.meta.extend(f.meta_phases.iter().take(REFS));
    }
    let files = pick(
        &model.files,
        FILES,
        |f| f.bytes_read.saturating_add(f.bytes_written),
        |f| f.id,
        &named.files,
    );
    let mut phases = pick(&model.phases, PHASES, |p| p.weight, |p| p.id, &named.phases);
    let mut metas = pick(
        &model.meta_phases,
        META_PHASES,
        |p| p.ops,
        |p| p.id,
        &named.meta,
    );
    // Phases read in order, as the application went through them.
    phases.sort_by_key(|p| (p.start_ns, p.id));
    metas.sort_by_key(|p| (p.start_ns, p.id));
    let shown = Shown {
        files: files.iter().map(|f| f.id).collect(),
        phases: phases.iter().map(|p| p.id).collect(),
        meta: metas.iter().map(|p| p.id).collect(),
    };

    let mut body = String::from(
        r##"<nav><a href="#findings">Findings</a><a href="#summary">Application</a><a href="#timeline">Timeline</a><a href="#heat">Bytes per process</a><a href="#sizes">Request sizes</a><a href="#files">Files</a><a href="#phases">Phases</a><a href="#meta">Metadata phases</a><a href="#processes">Processes</a></nav>"##,
    );
    let src = &model.source;
    if src.dropped > 0 {
        let _ = write!(
            body,
            r#"<p class="warn">The tracer had no room for {} of its records: the model misses them.</p>"#,
            count(src.dropped)
        );
    }
    body += &findings(model, &shown);
    body += &summary(model);
    section(
        &mut body,
        "timeline",
        "Offset over time",
        &io_charts::timeline(model),
    );
    section(
        &mut body,
        "heat",
        "Bytes moved per process over time",
        &io_charts::heat_map(model),
    );
    section(
        &mut body,
        "sizes",
        "Request sizes",
        &io_charts::size_histograms(model),
    );
    section(&mut body, "files", "Files", &files_table(model, &files));
    section(
        &mut body,
        "phases",
        "Data phases",
        &phases_table(model, &phases, &shown),
    );
    section(
        &mut body,
        "meta",
        "Metadata phases",
        &meta_table(model, &metas),
    );
    section(&mut body, "processes", "Processes", &processes_table(model));
    page::document(
        &format!("I/O model of {}", src.trace),
        &format!(
            "{} ({} records, traced by {}{}; schema {})",
            src.trace,
            count(src.records),
            src.traced_by,
            if src.mode.is_empty() {
                String::new()
            } else {
                format!(", {} mode", src.mode)
            },
            model.schema
        ),
        &body,
    )
}

/// Rows by id: those the findings name (always shown, whatever their weight), then those
/// the tables show, which links may point at.
#[derive(Default)]
struct Shown {
    files: BTreeSet<u32>,
    phases: BTreeSet<u32>,
    meta: BTreeSet<u32>,
}

fn section(body: &mut String, id: &str, title: &str, html: &str) {
    let _ = write!(body, r#"<h2 id="{id}">{}</h2>{html}"#, escape(title));
}

/// The `limit` items heaviest by `weight` (ties by id), plus those in `must`.
fn pick<'m, T>(
    items: &'m [T],
    limit: usize,
    weight: impl Fn(&T) -> u64,
    id: impl Fn(&T) -> u32,
    must: &BTreeSet<u32>,
) -> Vec<&'m T> {
    let mut order: Vec<&T> = items.iter().collect();
    order.sort_by_key(|t| (Reverse(weight(t)), id(t)));
    let mut out: Vec<&T> = order.iter().take(limit).copied().collect();
    out.extend(
        order
            .iter()
            .skip(limit)
            .filter(|t| must.contains(&id(t)))
            .copied(),
    );
    out
}

/// A note under a table that leaves rows out.
fn left_out(shown: usize, total: usize, what: &str, by: &str) -> String {
    if shown >= total {
        return String::new();
    }
    format!(
        r#"<p class="note">{} of {} {what} shown ({by}); {} more left out.</p>"#,
        count(shown as u64),
        count(total as u64),
        count((total - shown) as u64)
    )
}

fn finding_kind(k: FindingKind) -> &'static str {
    match k {
        FindingKind::SmallRequests => "Small requests",
        FindingKind::RandomOnSharedFile => "Random access on a shared file",
        FindingKind::MetadataBound => "Metadata-bound",
        FindingKind::ManyWritersOneFile => "Many processes write one file",
    }
}

fn findings(model: &Model, links: &Shown) -> String {
    let mut out = String::from(r#"<h2 id="findings">Findings</h2>"#);
    if model.findings.is_empty() {
        out += r#"<p class="empty">Nothing stands out.</p>"#;
        return out;
    }
    out += r#"<ul class="findings">"#;
    for f in &model.findings {
        let _ = write!(
            out,
            r#"<li><span class="kind">{}:</span> {}{}</li>"#,
            finding_kind(f.kind),
            escape(&f.text),
            finding_refs(model, f, links)
        );
    }
    out += "</ul>";
    out
}

fn finding_refs(model: &Model, f: &Finding, links: &Shown) -> String {
    let mut parts = Vec::new();
    let list = |ids: &[u32], link: &dyn Fn(u32) -> String| {
        let mut s: Vec<String> = ids.iter().take(REFS).map(|&i| link(i)).collect();
        if ids.len() > REFS {
            s.push(format!("and {} more", count((ids.len() - REFS) as u64)));
        }
        s.join(", ")
    };
    if !f.files.is_empty() {
        parts.push(format!(
            "files: {}",
            list(&f.files, &|i| file_ref(model, i, links, 60))
        ));
    }
    if !f.phases.is_empty() {
        parts.push(format!(
            "phases: {}",
            list(&f.phases, &|i| row_ref("phase", i, &links.phases))
        ));
    }
    if !f.meta_phases.is_empty() {
        parts.push(format!(
            "metadata phases: {}",
            list(&f.meta_phases, &|i| row_ref("meta", i, &links.meta))
        ));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(r#"<br><span class="refs">{}</span>"#, parts.join("; "))
    }
}

fn file_name(model: &Model, id: u32, max: usize) -> String {
    model
        .file(id)
        .map_or_else(|| format!("file {id}"), |f| clip(&f.path, max))
}

/// A file by name, linking to its row when the table shows it.
fn file_ref(model: &Model, id: u32, links: &Shown, max: usize) -> String {
    let name = escape(&file_name(model, id, max));
    if links.files.contains(&id) {
        format!(r##"<a href="#file-{id}">{name}</a>"##)
    } else {
        name
    }
}

/// A phase by number, linking to its row (`{prefix}-{id}`) when the table shows it.
fn row_ref(prefix: &str, id: u32, shown: &BTreeSet<u32>) -> String {
    if shown.contains(&id) {
        format!(r##"<a href="#{prefix}-{id}">{id}</a>"##)
    } else {
        id.to_string()
    }
}

fn summary(model: &Model) -> String {
    let a = &model.application;
    let m = &a.metadata;
    let mean = |b: u64, n: u64| b.checked_div(n).map_or_else(|| "–".into(), bytes);
    let app = [
        ("processes", count(u64::from(a.processes))),
        ("files", count(u64::from(a.files))),
        ("bytes read", bytes(a.bytes_read)),
        ("bytes written", bytes(a.bytes_written)),
        ("reads", count(a.reads)),
        ("writes", count(a.writes)),
        ("mean read", mean(a.bytes_read, a.reads)),
        ("mean write", mean(a.bytes_written, a.writes)),
        ("failed operations", count(a.errors)),
        ("wall time (first to last operation)", duration(a.wall_ns)),
        (
            "time in I/O (summed over processes)",
            duration(a.io_time_ns),
        ),
        (
            "time with I/O in flight",
            format!(
                "{} ({} of wall)",
                duration(a.busy_ns),
                percent(a.busy_ns, a.wall_ns)
            ),
        ),
    ];
    let meta = [
        ("creates", count(m.creates)),
        ("directories made", count(m.mkdirs)),
        ("stats and lookups", count(m.stats)),
        ("opens", count(m.opens)),
        ("unlinks", count(m.unlinks)),
        ("renames", count(m.renames)),
        ("directory listings", count(m.listings)),
        ("metadata operations per second", per_second(m.per_second)),
        ("most in one second", count(m.peak_per_second)),
        ("time in metadata operations", duration(m.time_ns)),
    ];
    let ops: Vec<(&str, String)> = a.ops.iter().map(|(k, v)| (k.as_str(), count(*v))).collect();
    format!(
        r#"<h2 id="summary">Application</h2><div class="cols"><div>{}</div><div>{}</div><div>{}</div></div>"#,
        kv_table(&app),
        kv_table(&meta),
        if ops.is_empty() {
            String::new()
        } else {
            kv_table(&ops)
        }
    )
}

pub fn access(a: AccessMode) -> &'static str {
    match a {
        AccessMode::Sequential => "sequential",
        AccessMode::Strided => "strided",
        AccessMode::Random => "random",
    }
}

pub fn sharing(s: Sharing) -> &'static str {
    match s {
        Sharing::PerProcess => "one process",
        Sharing::Shared => "shared",
    }
}

pub fn direction(d: Direction) -> &'static str {
    match d {
        Direction::None => "no data",
        Direction::Read => "read",
        Direction::Write => "write",
        Direction::ReadWrite => "read and write",
    }
}

fn op(o: DataOp) -> &'static str {
    match o {
        DataOp::Read => "read",
        DataOp::Write => "write",
    }
}

fn meta_kind(k: MetaKind) -> &'static str {
    match k {
        MetaKind::Create => "create",
        MetaKind::Mkdir => "mkdir",
        MetaKind::Stat => "stat",
        MetaKind::Open => "open",
        MetaKind::Unlink => "unlink",
        MetaKind::Rmdir => "rmdir",
        MetaKind::Rename => "rename",
        MetaKind::List => "list",
    }
}

/// A table: its header (plain text) and rows (HTML), in a box that scrolls past a screenful.
fn table(head: &[&str], rows: &str) -> String {
    let mut t = String::from(r#"<div class="scroll"><table><thead><tr>"#);
    for h in head {
        let _ = write!(t, "<th>{}</th>", escape(h));
    }
    let _ = write!(t, "</tr></thead><tbody>{rows}</tbody></table></div>");
    t
}

fn num(v: impl std::fmt::Display) -> String {
    format!(r#"<td class="num">{v}</td>"#)
}

fn files_table(model: &Model, shown: &[&FileModel]) -> String {
    if shown.is_empty() {
        return r#"<p class="empty">No files.</p>"#.into();
    }
    let mut rows = String::new();
    for f in shown {
        let _ = write!(
            rows,
            r#"<tr id="file-{}"><td class="path" title="{}">{}</td>{}{}<td>{}</td><td>{}</td><td>{}</td>{}{}{}{}{}{}{}</tr>"#,
            f.id,
            escape(&f.path),
            escape(&clip(&f.path, 120)),
            num(bytes(f.size)),
            num(f.processes),
            sharing(f.sharing),
            direction(f.direction),
            access(f.access),
            num(f.phases),
            num(bytes(f.bytes_read)),
            num(bytes(f.bytes_written)),
            num(count(f.reads)),
            num(count(f.writes)),
            num(duration(f.io_time_ns)),
            num(format!(
                "{} – {}",
                duration(f.first_ns),
                duration(f.last_ns)
            )),
        );
    }
    let mut out = table(
        &[
            "file",
            "size",
            "processes",
            "sharing",
            "direction",
            "access",
            "phases",
            "read",
            "written",
            "reads",
            "writes",
            "I/O time",
            "active",
        ],
        &rows,
    );
    out += &left_out(
        shown.len(),
        model.files.len(),
        "files",
        "those that moved the most bytes first, and any a finding names",
    );
    out
}

fn phases_table(model: &Model, phases: &[&Phase], links: &Shown) -> String {
    if phases.is_empty() {
        return r#"<p class="empty">No data phases.</p>"#.into();
    }
    let mut rows = String::new();
    for p in phases {
        let file = file_ref(model, p.file, links, 40);
        let full = model.file(p.file).map_or("", |f| f.path.as_str());
        let mut offsets: Vec<String> = p
            .processes
            .iter()
            .take(OFFSETS)
            .map(|pp| bytes(pp.initial_offset))
            .collect();
        if p.processes.len() > OFFSETS {
            offsets.push(format!("… {} more", p.processes.len() - OFFSETS));
        }
        let pids: Vec<String> = p
            .processes
            .iter()
            .take(64)
            .map(|pp| pp.pid.to_string())
            .collect();
        let _ = write!(
            rows,
            r#"<tr id="phase-{}">{}<td title="{}">{file}</td><td>{}</td><td>{}</td><td class="num" title="pids {}">{}</td>{}{}{}{}<td>{}</td>{}{}{}{}{}</tr>"#,
            p.id,
            num(p.id),
            escape(full),
            op(p.op),
            access(p.access),
            pids.join(" "),
            p.processes.len(),
            num(bytes(p.weight)),
            num(p.repetitions),
            num(count(p.ops)),
            num(bytes(p.request_size)),
            offsets.join(", "),
            num(p.displacement.map_or_else(|| "varies".into(), signed_bytes)),
            num(duration(p.distance_ns)),
            num(duration(p.start_ns)),
            num(duration(p.end_ns.saturating_sub(p.start_ns))),
            num(duration(p.io_time_ns)),
        );
    }
    let mut out = table(
        &[
            "phase",
            "file",
            "op",
            "access",
            "np",
            "weight",
            "repetitions",
            "ops",
            "request size",
            "initial offsets",
            "displacement",
            "distance",
            "start",
            "duration",
            "I/O time",
        ],
        &rows,
    );
    out += &left_out(
        phases.len(),
        model.phases.len(),
        "phases",
        "the heaviest in bytes and any a finding names, in order of start",
    );
    out
}

fn meta_table(model: &Model, metas: &[&MetaPhase]) -> String {
    if metas.is_empty() {
        return r#"<p class="empty">No metadata phases.</p>"#.into();
    }
    let mut rows = String::new();
    for p in metas {
        let span = p.end_ns.saturating_sub(p.start_ns);
        let rate = if span == 0 {
            "–".into()
        } else {
            per_second(p.ops as f64 / (span as f64 / 1e9))
        };
        let _ = write!(
            rows,
            r#"<tr id="meta-{}">{}<td>{}</td><td class="path">{}</td>{}{}{}{}{}{}</tr>"#,
            p.id,
            num(p.id),
            meta_kind(p.kind),
            escape(&clip(&p.dir, 120)),
            num(p.processes.len()),
            num(count(p.ops)),
            num(rate),
            num(duration(p.start_ns)),
            num(duration(span)),
            num(duration(p.io_time_ns)),
        );
    }
    let mut out = table(
        &[
            "phase",
            "kind",
            "directory",
            "np",
            "ops",
            "per second",
            "start",
            "duration",
            "I/O time",
        ],
        &rows,
    );
    out += &left_out(
        metas.len(),
        model.meta_phases.len(),
        "metadata phases",
        "those with the most operations and any a finding names, in order of start",
    );
    out
}

fn processes_table(model: &Model) -> String {
    if model.processes.is_empty() {
        return r#"<p class="empty">No processes.</p>"#.into();
    }
    let shown = pick(
        &model.processes,
        PROCESSES,
        |p| p.bytes_read.saturating_add(p.bytes_written),
        |p| p.pid,
        &BTreeSet::new(),
    );
    let mut rows = String::new();
    for p in &shown {
        let _ = write!(
            rows,
            r#"<tr>{}<td class="path">{}</td>{}{}{}{}{}</tr>"#,
            num(p.pid),
            escape(&clip(p.exe.as_deref().unwrap_or("?"), 120)),
            num(count(p.ops)),
            num(bytes(p.bytes_read)),
            num(bytes(p.bytes_written)),
            num(duration(p.io_time_ns)),
            num(format!(
                "{} – {}",
                duration(p.first_ns),
                duration(p.last_ns)
            )),
        );
    }
    let mut out = table(
        &[
            "pid",
            "program",
            "operations",
            "read",
            "written",
            "I/O time",
            "active",
        ],
        &rows,
    );
    out += &left_out(
        shown.len(),
        model.processes.len(),
        "processes",
        "those that moved the most bytes first",
    );
    out
}
