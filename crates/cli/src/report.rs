//! `tessera report`: memory allocated and used over time, as the manager recorded it (its
//! `/history` HTTP endpoint), drawn like MemFS's Figure 6 into a self-contained HTML file
//! (an inline, hand-written SVG: no scripts, no plotting library, opens anywhere).

use crate::config::{self, FileConfig};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tessera_manager::history::{usage_stats, Sample, UsageStats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Default address of the manager's HTTP API (as `tessera up` starts it).
pub const DEFAULT_HTTP: &str = "127.0.0.1:7071";

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// The manager's HTTP admin API (default: `http` from the configuration or the cluster
    /// file, else 127.0.0.1:7071).
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// Where to write the HTML report.
    #[arg(long, default_value = "memory.html")]
    out: PathBuf,
    /// Print the history (samples and totals) as JSON instead of writing HTML.
    #[arg(long)]
    json: bool,
    /// Draw a history saved earlier with --json instead of asking the manager.
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    /// Title of the report.
    #[arg(long, default_value = "Tessera memory over time")]
    title: String,
}

/// What `/history` answers (and `--json` prints); the totals are recomputed here.
#[derive(Debug, Deserialize)]
struct HistoryDoc {
    samples: Vec<Sample>,
}

pub async fn run(flag_secret: Option<&str>, cfg: &FileConfig, args: &ReportArgs) -> Result<()> {
    let (text, source) = match &args.input {
        Some(path) => (
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
            path.display().to_string(),
        ),
        None => {
            let http = args
                .http
                .clone()
                .or_else(|| cfg.http.clone())
                .unwrap_or_else(|| DEFAULT_HTTP.into());
            let addr = config::addr(&http, "HTTP")?;
            let secret = flag_secret
                .map(str::to_string)
                .or_else(|| cfg.secret.clone())
                .context(
                    "no cluster secret: pass --secret, set TESSERA_SECRET, or use the cluster \
                     file `tessera up` writes",
                )?;
            (
                fetch(addr, "/history", &secret).await?,
                format!("http://{addr}"),
            )
        }
    };
    let doc: HistoryDoc = serde_json::from_str(&text).context("reading the history (JSON)")?;
    let stats = usage_stats(&doc.samples);
    if args.json {
        let out = serde_json::json!({"samples": doc.samples, "stats": stats});
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let html = render_html(&doc.samples, &stats, &args.title, &source);
    std::fs::write(&args.out, html).with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "wrote {} ({} samples over {:.0} s, mean utilisation {:.1} %)",
        args.out.display(),
        doc.samples.len(),
        stats.duration_s,
        100.0 * stats.mean_utilisation
    );
    Ok(())
}

/// The manager's memory history, if its HTTP API answers (for `tessera status`).
pub async fn recent(cfg: &FileConfig, secret: &str) -> Option<Vec<Sample>> {
    let http = cfg.http.clone().unwrap_or_else(|| DEFAULT_HTTP.into());
    let addr = config::addr(&http, "HTTP").ok()?;
    let text = tokio::time::timeout(Duration::from_secs(2), fetch(addr, "/history", secret))
        .await
        .ok()?
        .ok()?;
    serde_json::from_str::<HistoryDoc>(&text)
        .ok()
        .map(|d| d.samples)
}

/// One line of memory use over time: `width` columns, each the used share of the largest
/// allocation in the run, as block characters; with the span, peaks and server counts.
#[must_use]
pub fn sparkline(samples: &[Sample], width: usize) -> Option<String> {
    const BLOCKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let (first, last) = (samples.first()?, samples.last()?);
    let span = last.t_ms.saturating_sub(first.t_ms).max(1);
    let peak_alloc = samples.iter().map(|s| s.allocated).max()?.max(1);
    let width = width.clamp(1, samples.len());
    let mut line = String::with_capacity(width * 3);
    for col in 0..width {
        let (lo, hi) = (
            first.t_ms + span * col as u64 / width as u64,
            first.t_ms + span * (col as u64 + 1) / width as u64,
        );
        let used = samples
            .iter()
            .filter(|s| s.t_ms >= lo && (s.t_ms < hi || col + 1 == width))
            .map(|s| s.used)
            .max()
            .unwrap_or(0);
        let level = (used as f64 / peak_alloc as f64 * 7.0).round() as usize;
        line.push(BLOCKS[level.min(7)]);
    }
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let (min_n, max_n) = (
        samples.iter().map(|s| s.nodes).min()?,
        samples.iter().map(|s| s.nodes).max()?,
    );
    Some(format!(
        "memory over the last {:.0} s: used {line}  (peak {:.2} GiB used of {:.2} GiB allocated; {min_n}-{max_n} servers)",
        span as f64 / 1000.0,
        gib(samples.iter().map(|s| s.used).max()?),
        gib(peak_alloc),
    ))
}

/// A GET on the manager's HTTP API with the cluster secret; the body of a 200 answer.
async fn fetch(addr: SocketAddr, path: &str, secret: &str) -> Result<String> {
    if secret.chars().any(char::is_control) {
        bail!("the cluster secret contains control characters: it cannot go in an HTTP header");
    }
    let limit = Duration::from_secs(10);
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to the manager's HTTP API at {addr}"))?;
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {secret}\r\n\
             Accept: application/json\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await?;
        anyhow::Ok(raw)
    };
    let raw = tokio::time::timeout(limit, exchange)
        .await
        .with_context(|| format!("the manager's HTTP API at {addr} did not answer in {limit:?}"))?
        .with_context(|| format!("asking http://{addr}{path}"))?;
    let (status, body) = parse_response(&raw)?;
    let body = String::from_utf8(body).context("the answer is not UTF-8")?;
    match status {
        200 => Ok(body),
        401 => bail!("the manager refused the cluster secret (HTTP 401)"),
        404 => bail!("the manager at {addr} has no {path} (an older version?)"),
        s => bail!("the manager answered HTTP {s}: {}", body.trim()),
    }
}

/// Status and body of an HTTP/1.x response (plain or chunked; the connection was closed).
fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>)> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("incomplete HTTP answer (no end of headers)")?;
    let head = std::str::from_utf8(&raw[..end]).context("HTTP headers are not text")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("not an HTTP answer: {status_line:?}"))?;
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.to_ascii_lowercase().contains("chunked")
        })
    });
    let body = &raw[end + 4..];
    if !chunked {
        return Ok((status, body.to_vec()));
    }
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("truncated chunked body")?;
        let size_text = std::str::from_utf8(&rest[..eol]).context("bad chunk size")?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok((status, out));
        }
        let chunk = rest.get(..size).context("truncated chunk")?;
        out.extend_from_slice(chunk);
        rest = rest.get(size + 2..).context("truncated chunk")?;
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// A byte unit that keeps the axis numbers readable.
fn byte_unit(max: f64) -> (&'static str, f64) {
    const UNITS: [(&str, f64); 5] = [
        ("TiB", 1099511627776.0),
        ("GiB", 1073741824.0),
        ("MiB", 1048576.0),
        ("KiB", 1024.0),
        ("B", 1.0),
    ];
    for (name, size) in UNITS {
        if max >= size {
            return (name, size);
        }
    }
    ("GiB", GIB)
}

/// A tick step of 1, 2 or 5 times a power of ten, giving about `target` intervals.
fn nice_step(range: f64, target: f64) -> f64 {
    if !(range.is_finite() && range > 0.0) {
        return 1.0;
    }
    let raw = range / target;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let f = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    f * mag
}

/// A tick value with as many decimals as its step needs.
fn tick_label(v: f64, step: f64) -> String {
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    format!("{v:.decimals$}")
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const W: f64 = 960.0;
const H: f64 = 500.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 70.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const ALLOC_COLOR: &str = "#1f6fb4";
const USED_COLOR: &str = "#e0631a";
const NODES_COLOR: &str = "#2b9a3e";

/// The chart: memory allocated (step line over a light area) and used (line over a darker
/// area) in bytes against seconds on the left axis, the node count (dashed steps) on the
/// right. Pure; handles no and one sample.
pub fn render_svg(samples: &[Sample]) -> String {
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let t0 = samples.first().map_or(0, |s| s.t_ms);
    let span_s = samples.last().map_or(0, |s| s.t_ms.saturating_sub(t0)) as f64 / 1000.0;
    // Long runs read better in minutes.
    let (t_unit, t_div) = if span_s > 2.0 * 3600.0 {
        ("min", 60.0)
    } else {
        ("s", 1.0)
    };
    let x_max = if span_s > 0.0 { span_s / t_div } else { 1.0 };
    let peak = samples
        .iter()
        .map(|s| s.allocated.max(s.used))
        .max()
        .unwrap_or(0) as f64;
    let (unit, unit_size) = byte_unit(peak);
    let y_step = nice_step(
        if peak > 0.0 {
            peak / unit_size * 1.05
        } else {
            1.0
        },
        5.0,
    );
    let y_max = if peak > 0.0 {
        (peak / unit_size * 1.05 / y_step).ceil() * y_step
    } else {
        1.0
    };
    let peak_nodes = samples.iter().map(|s| s.nodes).max().unwrap_or(0);
    // The node line peaks at about half height, below the memory lines (which peak near the
    // top), so equal nodes' allocation and count do not draw over each other.
    let n_top = f64::from(peak_nodes.max(1)) / 0.55;
    let n_step = nice_step(n_top, 5.0).max(1.0).round();
    let n_max = (n_top / n_step).ceil() * n_step;

    let x = |t_ms: u64| LEFT + (t_ms.saturating_sub(t0) as f64 / 1000.0 / t_div) / x_max * pw;
    let y = |bytes: u64| TOP + ph - (bytes as f64 / unit_size) / y_max * ph;
    let yn = |n: u32| TOP + ph - f64::from(n) / n_max * ph;

    let mut o = String::new();
    let _ = write!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" font-family="system-ui, sans-serif" font-size="13" role="img"><title>Memory allocated and used over time</title>"#
    );
    let _ = write!(
        o,
        r##"<rect x="0" y="0" width="{W}" height="{H}" fill="#fff"/>"##
    );
    // Grid and left axis ticks.
    let mut v = 0.0;
    while v <= y_max + y_step * 1e-9 {
        let yy = TOP + ph - v / y_max * ph;
        let _ = write!(
            o,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 8.0,
            yy + 4.0,
            tick_label(v, y_step)
        );
        v += y_step;
    }
    let x_step = nice_step(x_max, 8.0);
    let mut t = 0.0;
    while t <= x_max + x_step * 1e-9 {
        let xx = LEFT + t / x_max * pw;
        let _ = write!(
            o,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#444"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 5.0,
            TOP + ph + 20.0,
            tick_label(t, x_step)
        );
        t += x_step;
    }
    // Right axis ticks (nodes).
    let mut n = 0.0;
    while n <= n_max + 1e-9 {
        let yy = TOP + ph - n / n_max * ph;
        let _ = write!(
            o,
            r##"<line x1="{:.1}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="{NODES_COLOR}"/><text x="{:.1}" y="{:.1}" fill="{NODES_COLOR}">{n:.0}</text>"##,
            LEFT + pw,
            LEFT + pw + 5.0,
            LEFT + pw + 9.0,
            yy + 4.0,
        );
        n += n_step;
    }

    if samples.is_empty() {
        let _ = write!(
            o,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#888" font-size="16">no samples yet</text>"##,
            LEFT + pw / 2.0,
            TOP + ph / 2.0
        );
    } else {
        // A single sample holds across the whole (one second) chart.
        let end_x = if samples.len() == 1 {
            LEFT + pw
        } else {
            x(samples[samples.len() - 1].t_ms)
        };
        let base = TOP + ph;
        let step_path = |val: &dyn Fn(&Sample) -> f64| {
            let mut d = format!("M{:.1},{:.1}", x(samples[0].t_ms), val(&samples[0]));
            for w in samples.windows(2) {
                let _ = write!(d, "H{:.1}V{:.1}", x(w[1].t_ms), val(&w[1]));
            }
            let _ = write!(d, "H{end_x:.1}");
            d
        };
        let alloc = step_path(&|s| y(s.allocated));
        let used = step_path(&|s| y(s.used));
        let nodes = step_path(&|s| yn(s.nodes));
        let x0 = x(samples[0].t_ms);
        let _ = write!(
            o,
            r#"<path d="{alloc}V{base:.1}H{x0:.1}Z" fill="{ALLOC_COLOR}" fill-opacity="0.13" stroke="none"/><path d="{used}V{base:.1}H{x0:.1}Z" fill="{USED_COLOR}" fill-opacity="0.30" stroke="none"/><path id="allocated" d="{alloc}" fill="none" stroke="{ALLOC_COLOR}" stroke-width="2"/><path id="used" d="{used}" fill="none" stroke="{USED_COLOR}" stroke-width="2"/><path id="nodes" d="{nodes}" fill="none" stroke="{NODES_COLOR}" stroke-width="1.5" stroke-dasharray="6 4"/>"#
        );
    }
    // Axes, labels and legend.
    let _ = write!(
        o,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/><text x="{:.1}" y="{:.1}" text-anchor="middle">time ({t_unit})</text><text transform="translate(22 {:.1}) rotate(-90)" text-anchor="middle">memory ({unit})</text><text transform="translate({:.1} {:.1}) rotate(90)" text-anchor="middle" fill="{NODES_COLOR}">nodes</text>"##,
        LEFT + pw / 2.0,
        H - 15.0,
        TOP + ph / 2.0,
        W - 18.0,
        TOP + ph / 2.0,
    );
    let legend = [
        (ALLOC_COLOR, "", "memory allocated"),
        (USED_COLOR, "", "memory used"),
        (
            NODES_COLOR,
            r#" stroke-dasharray="6 4""#,
            "nodes (right axis)",
        ),
    ];
    let mut lx = LEFT;
    for (color, dash, label) in legend {
        let _ = write!(
            o,
            r#"<line x1="{lx:.1}" y1="25" x2="{:.1}" y2="25" stroke="{color}" stroke-width="3"{dash}/><text x="{:.1}" y="30">{label}</text>"#,
            lx + 28.0,
            lx + 34.0
        );
        lx += 34.0 + 8.0 * label.len() as f64 + 30.0;
    }
    o.push_str("</svg>");
    o
}

fn gib_s(byte_seconds: f64) -> String {
    let v = byte_seconds / GIB;
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

/// The whole report: title, chart and a table of the totals. Pure.
pub fn render_html(samples: &[Sample], stats: &UsageStats, title: &str, source: &str) -> String {
    let title = escape(title);
    let rows = [
        ("duration", format!("{:.1} s", stats.duration_s)),
        ("samples", samples.len().to_string()),
        ("peak nodes", stats.peak_nodes.to_string()),
        (
            "peak memory allocated",
            crate::up::human(stats.peak_allocated),
        ),
        ("peak memory used", crate::up::human(stats.peak_used)),
        (
            "memory allocated over time",
            format!("{} GiB·s", gib_s(stats.allocated_byte_seconds)),
        ),
        (
            "memory used over time",
            format!("{} GiB·s", gib_s(stats.used_byte_seconds)),
        ),
        (
            "allocated but unused",
            format!("{} GiB·s", gib_s(stats.waste_byte_seconds)),
        ),
        (
            "mean utilisation (used / allocated)",
            format!("{:.1} %", 100.0 * stats.mean_utilisation),
        ),
    ];
    let mut table = String::new();
    for (k, v) in rows {
        let _ = write!(table, "<tr><th>{k}</th><td>{}</td></tr>", escape(&v));
    }
    format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; }}
h1 {{ font-size: 20px; margin: 0 0 4px; }}
p.src {{ color: #666; margin: 0 0 12px; font-size: 13px; }}
table {{ border-collapse: collapse; margin-top: 16px; font-size: 14px; }}
th {{ text-align: left; font-weight: normal; color: #444; padding: 3px 24px 3px 0; }}
td {{ text-align: right; padding: 3px 0; font-variant-numeric: tabular-nums; }}
tr {{ border-bottom: 1px solid #eee; }}
</style></head>
<body>
<h1>{title}</h1>
<p class="src">from {}; each sample holds until the next</p>
{}
<table>{table}</table>
</body></html>
"#,
        escape(source),
        render_svg(samples)
    )
}

#[cfg(test)]
mod spark_tests {
    use super::*;

    #[test]
    fn sparkline_follows_use() {
        let s = |t_ms, used| Sample {
            t_ms,
            nodes: 2,
            allocated: 8 << 30,
            used,
        };
        assert_eq!(sparkline(&[], 10), None);
        let one = sparkline(&[s(0, 4 << 30)], 10).unwrap();
        assert!(one.contains("used ▅ "), "{one}");
        let up_down = [s(0, 0), s(1000, 4 << 30), s(2000, 8 << 30), s(3000, 0)];
        let line = sparkline(&up_down, 4).unwrap();
        assert!(line.contains("used ▁▅█▁"), "{line}");
        assert!(line.contains("2-2 servers"), "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_ms: u64, nodes: u32, allocated: u64, used: u64) -> Sample {
        Sample {
            t_ms,
            nodes,
            allocated,
            used,
        }
    }

    fn sane(svg: &str) {
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"), "{svg}");
        assert_eq!(svg.matches("<svg").count(), 1);
        for bad in ["NaN", "inf"] {
            assert!(!svg.contains(bad), "{bad} in {svg}");
        }
        assert_eq!(svg.matches('<').count(), svg.matches('>').count());
    }

    #[test]
    fn draws_both_series_and_the_nodes() {
        let g = 1u64 << 30;
        let samples: Vec<Sample> = (0..50)
            .map(|i| {
                let nodes = 2 + i / 10;
                sample(
                    u64::from(i) * 1000,
                    nodes,
                    u64::from(nodes) * 4 * g,
                    u64::from(i) * g / 4,
                )
            })
            .collect();
        let svg = render_svg(&samples);
        sane(&svg);
        for part in [
            r#"id="allocated""#,
            r#"id="used""#,
            r#"id="nodes""#,
            "memory allocated",
            "memory used",
            "memory (GiB)",
            "time (s)",
        ] {
            assert!(svg.contains(part), "{part} missing");
        }
        let html = render_html(&samples, &usage_stats(&samples), "a <b> run", "x");
        assert!(html.contains("a &lt;b&gt; run") && html.contains("GiB·s"));
        assert!(html.contains(&svg));
    }

    #[test]
    fn handles_no_and_one_sample_and_tiny_sizes() {
        let svg = render_svg(&[]);
        sane(&svg);
        assert!(svg.contains("no samples yet"));
        let one = [sample(1234, 1, 64 << 20, 0)];
        let svg = render_svg(&one);
        sane(&svg);
        assert!(svg.contains(r#"id="used""#) && svg.contains("memory (MiB)"));
        let zeros = [sample(0, 0, 0, 0), sample(0, 0, 0, 0)];
        sane(&render_svg(&zeros));
        let html = render_html(&[], &usage_stats(&[]), "t", "s");
        assert!(html.contains("no samples yet") && html.contains("0.0 %"));
    }

    #[test]
    fn nice_ticks() {
        assert_eq!(nice_step(10.0, 5.0), 2.0);
        assert_eq!(nice_step(7.0, 5.0), 2.0);
        assert_eq!(nice_step(0.3, 5.0), 0.1);
        assert_eq!(nice_step(0.0, 5.0), 1.0);
        assert_eq!(nice_step(f64::NAN, 5.0), 1.0);
        assert_eq!(tick_label(0.30000000000000004, 0.1), "0.3");
        assert_eq!(tick_label(40.0, 20.0), "40");
        assert_eq!(byte_unit(3.0 * GIB).0, "GiB");
        assert_eq!(byte_unit(0.0).0, "GiB");
    }

    #[test]
    fn parses_http_answers() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_response(plain).unwrap(), (200, b"{}".to_vec()));
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3;x=y\r\n:1}\r\n0\r\n\r\n";
        assert_eq!(
            parse_response(chunked).unwrap(),
            (200, b"{\"a\":1}".to_vec())
        );
        let denied = b"HTTP/1.1 401 Unauthorized\r\n\r\nno";
        assert_eq!(parse_response(denied).unwrap().0, 401);
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_response(b"garbage\r\n\r\n").is_err());
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err()
        );
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nab")
                .is_err()
        );
    }

    #[test]
    fn reads_what_json_prints_and_what_the_manager_serves() {
        let served = r#"{"resolution_ms":1000,"samples":[{"t_ms":0,"nodes":1,"allocated":5,"used":1}],"stats":{}}"#;
        let doc: HistoryDoc = serde_json::from_str(served).unwrap();
        assert_eq!(doc.samples, vec![sample(0, 1, 5, 1)]);
    }
}
