//! `tessera report`: memory allocated and used over time, as the manager recorded it (its
//! `/history` HTTP endpoint), drawn like MemFS's Figure 6 into a self-contained HTML file
//! (tessera-report's page: an inline SVG chart, no scripts, opens anywhere).

use crate::config::{self, FileConfig};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tessera_manager::history::{usage_stats, Sample, UsageStats};
use tessera_report::{memory_report, MemorySample};
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
    let samples: Vec<MemorySample> = samples
        .iter()
        .map(|s| MemorySample {
            t_ms: s.t_ms,
            nodes: s.nodes,
            allocated: s.allocated,
            used: s.used,
        })
        .collect();
    memory_report(&samples, &rows, title, source)
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

    #[test]
    fn the_page_has_the_chart_and_the_totals() {
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
        let html = render_html(&samples, &usage_stats(&samples), "a <b> run", "x");
        assert!(html.contains("a &lt;b&gt; run") && html.contains("GiB·s"));
        assert_eq!(html.matches("<svg").count(), 1);
        for part in [
            "memory allocated",
            "memory used",
            "memory (GiB)",
            "time (s)",
        ] {
            assert!(html.contains(part), "{part} missing");
        }
        assert!(html.contains("<th>peak nodes</th><td>6</td>"), "{html}");
        let empty = render_html(&[], &usage_stats(&[]), "t", "s");
        assert!(empty.contains("no samples yet") && empty.contains("0.0 %"));
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
