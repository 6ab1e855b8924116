//! What both pages share: the HTML shell and its style, escaping, and how numbers read.

use std::fmt::Write as _;

/// Text made safe for HTML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// One whole page: `title` (plain text), a line saying where the data came from (plain text),
/// and `body` (HTML). No script and no external asset: it opens anywhere, offline.
pub fn document(title: &str, source: &str, body: &str) -> String {
    let title = escape(title);
    format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{STYLE}</style></head>
<body>
<h1>{title}</h1>
<p class="src">{}</p>
{body}
</body></html>
"#,
        escape(source)
    )
}

const STYLE: &str = "
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1240px; padding: 0 16px;
  color: #222; font-size: 14px; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 6px; border-bottom: 1px solid #ddd; padding-bottom: 3px; }
p.src { color: #666; margin: 0 0 12px; font-size: 13px; }
p.note { color: #666; font-size: 13px; margin: 4px 0; }
p.empty { color: #888; font-style: italic; }
nav { font-size: 13px; margin: 0 0 8px; }
nav a { margin-right: 12px; }
svg { max-width: 100%; height: auto; display: block; }
table { border-collapse: collapse; font-size: 13px; }
th { text-align: left; font-weight: 600; color: #444; padding: 3px 14px 3px 0; white-space: nowrap; }
td { padding: 3px 14px 3px 0; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.num { text-align: right; }
td.path { white-space: normal; word-break: break-all; min-width: 180px; max-width: 380px; }
tr { border-bottom: 1px solid #eee; }
tr:target { background: #fff3b0; }
table.kv th { font-weight: normal; }
table.kv td { text-align: right; }
.cols { display: flex; flex-wrap: wrap; gap: 8px 48px; align-items: flex-start; }
.scroll { max-width: 100%; max-height: 70vh; overflow: auto; border: 1px solid #e4e4e4; }
.scroll thead th { position: sticky; top: 0; background: #f7f7f7; }
ul.findings { padding-left: 20px; }
ul.findings li { margin: 6px 0; }
ul.findings .kind { font-weight: 600; }
ul.findings .refs { color: #555; font-size: 13px; }
.warn { color: #a33; }
";

/// A key-value table (the summaries); keys and values are plain text.
pub fn kv_table(rows: &[(&str, String)]) -> String {
    let mut t = String::from(r#"<table class="kv">"#);
    for (k, v) in rows {
        let _ = write!(t, "<tr><th>{}</th><td>{}</td></tr>", escape(k), escape(v));
    }
    t.push_str("</table>");
    t
}

const UNITS: [(&str, u64); 6] = [
    ("PiB", 1 << 50),
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("B", 1),
];

/// The binary unit that keeps numbers up to `max` bytes readable, and its size.
pub fn byte_unit(max: f64) -> (&'static str, f64) {
    UNITS
        .iter()
        .find(|(_, size)| max >= *size as f64)
        .map_or(("B", 1.0), |&(name, size)| (name, size as f64))
}

/// Bytes in a binary unit: whole when exact (request sizes read as `64 KiB`), else one decimal.
pub fn bytes(n: u64) -> String {
    let (unit, size) = byte_unit(n as f64);
    let size = size as u64;
    if n.is_multiple_of(size) {
        format!("{} {unit}", n / size)
    } else {
        format!("{:.1} {unit}", n as f64 / size as f64)
    }
}

/// A signed byte count (a displacement).
pub fn signed_bytes(n: i64) -> String {
    if n < 0 {
        format!("−{}", bytes(n.unsigned_abs()))
    } else {
        bytes(n.unsigned_abs())
    }
}

/// A count with thousands separated.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A duration in the unit that suits it.
pub fn duration(ns: u64) -> String {
    let s = ns as f64 / 1e9;
    if ns == 0 {
        "0".into()
    } else if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else if s < 120.0 {
        format!("{s:.2} s")
    } else if s < 7200.0 {
        format!("{:.0} min {:.0} s", (s / 60.0).floor(), s % 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

/// A rate per second with three significant digits or so.
pub fn per_second(v: f64) -> String {
    if !v.is_finite() {
        "–".into()
    } else if v >= 100.0 {
        count(v.round() as u64)
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// `part` as a share of `whole`, in percent.
pub fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "–".into()
    } else {
        format!("{:.1} %", 100.0 * part as f64 / whole as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(4096), "4 KiB");
        assert_eq!(bytes(4000), "3.9 KiB");
        assert_eq!(bytes(3 << 30), "3 GiB");
        assert_eq!(bytes(u64::MAX), "16384.0 PiB");
        assert_eq!(signed_bytes(-65536), "−64 KiB");
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1234567), "1,234,567");
        assert_eq!(duration(0), "0");
        assert_eq!(duration(850), "850 ns");
        assert_eq!(duration(4_560_000), "4.6 ms");
        assert_eq!(duration(1_230_000_000), "1.23 s");
        assert_eq!(duration(150_000_000_000), "2 min 30 s");
        assert_eq!(per_second(f64::NAN), "–");
        assert_eq!(per_second(1234.4), "1,234");
        assert_eq!(percent(1, 0), "–");
        assert_eq!(percent(1, 4), "25.0 %");
        assert_eq!(byte_unit(0.0), ("B", 1.0));
        assert_eq!(byte_unit(3.0 * 1048576.0).0, "MiB");
        assert_eq!(
            escape(r#"<a href="x">&'"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
