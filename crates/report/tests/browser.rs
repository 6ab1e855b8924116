//! The pages in a real browser: headless Chromium loads each, takes a screenshot (it must show
//! a drawn page, not a blank one) and dumps the DOM after a checking script the test adds ran
//! (no error, every chart laid out, every link's target there, nothing wider than a laptop).
//! Skips, saying why, only when `chromium` is not installed (scripts/deps.sh installs it).
//! `TESSERA_REPORT_SHOTS=DIR` keeps the pages and screenshots there, to look at.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tessera_report::{evaluate_report, memory_report, model_report, MemorySample};

/// The window: a laptop's width, tall enough to see the charts and the first tables.
const WIDTH: u32 = 1400;
const HEIGHT: u32 = 3000;
/// Chromium is slow to start on a loaded machine; past this it is killed and the test fails.
const LIMIT: Duration = Duration::from_secs(180);

/// Recorded before anything else runs, so an error anywhere in the page is caught.
const CATCH: &str = r#"<script>window.__errors = [];
window.addEventListener("error", function (e) { window.__errors.push(String(e.message)); });</script>"#;

/// Runs after the whole body parsed; its verdict goes into the DOM Chromium dumps.
const CHECK: &str = r##"<script>(function () {
  var svgs = Array.from(document.querySelectorAll("svg"));
  var drawn = svgs.filter(function (s) {
    var r = s.getBoundingClientRect();
    return r.width > 300 && r.height > 100 && s.querySelectorAll("text").length > 3;
  }).length;
  var missing = Array.from(document.querySelectorAll('a[href^="#"]'))
    .map(function (a) { return a.getAttribute("href").slice(1); })
    .filter(function (id) { return !document.getElementById(id); });
  var out = document.createElement("pre");
  out.id = "page-check";
  out.textContent = JSON.stringify({
    svgs: svgs.length, drawn: drawn, missing: missing, errors: window.__errors,
    width: document.documentElement.scrollWidth
  });
  document.body.appendChild(out);
})();</script>"##;

fn chromium_missing() -> bool {
    match Command::new("chromium")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(_) => false,
        Err(e) => {
            eprintln!(
                "SKIPPED: the browser test needs `chromium` ({e}); scripts/deps.sh installs it"
            );
            true
        }
    }
}

/// Chromium, headless, on `page` with `args`; its stdout into `out`. Fails the test if it
/// does not finish within [`LIMIT`] or fails.
fn chromium(page: &Path, args: &[String], out: &Path) {
    let stdout = std::fs::File::create(out).expect("stdout file");
    let stderr_path = out.with_extension("stderr");
    let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            // The tests run as root in CI, where Chromium's sandbox refuses to start.
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--disable-extensions",
            "--mute-audio",
        ])
        .arg(format!(
            "--user-data-dir={}",
            out.with_extension("profile").display()
        ))
        .arg(format!("--window-size={WIDTH},{HEIGHT}"))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .expect("starting chromium");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for chromium") {
            break status;
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not finish in {LIMIT:?}: {}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        status.success(),
        "chromium failed ({status}): {}",
        std::fs::read_to_string(&stderr_path).unwrap_or_default()
    );
}

/// What the checking script saw.
#[derive(Debug, serde::Deserialize)]
struct Check {
    svgs: usize,
    drawn: usize,
    missing: Vec<String>,
    errors: Vec<String>,
    width: u32,
}

/// `html` with the checks added, written to `dir/name.html`, loaded twice: for the screenshot
/// (its path returned) and for the DOM (the checks' verdict returned).
fn load(dir: &Path, name: &str, html: &str) -> (PathBuf, Check) {
    assert!(
        !html.contains("<script"),
        "the page brings no script of its own"
    );
    let checked = html
        .replacen("<head>", &format!("<head>{CATCH}"), 1)
        .replacen("</body>", &format!("{CHECK}</body>"), 1);
    let page = dir.join(format!("{name}.html"));
    std::fs::write(&page, checked).expect("writing the page");
    let shot = dir.join(format!("{name}.png"));
    chromium(
        &page,
        &[format!("--screenshot={}", shot.display())],
        &dir.join(format!("{name}.shot.out")),
    );
    let dom_path = dir.join(format!("{name}.dom"));
    chromium(
        &page,
        &[
            "--dump-dom".to_string(),
            "--virtual-time-budget=5000".to_string(),
        ],
        &dom_path,
    );
    let dom = std::fs::read_to_string(&dom_path).expect("the DOM");
    let start = dom.find(r#"<pre id="page-check">"#).unwrap_or_else(|| {
        panic!("the checking script did not run: the page did not load to its end")
    });
    let rest = &dom[start + r#"<pre id="page-check">"#.len()..];
    let json = &rest[..rest.find("</pre>").expect("end of the verdict")];
    let json = json
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    let check: Check = serde_json::from_str(&json).expect("the verdict");
    (shot, check)
}

/// Pixels of the screenshot that are not the page's white background, and of those how many
/// are clearly coloured (the charts' marks, not text or grid).
fn inked(png_path: &Path) -> (u64, u64, u64) {
    let file = std::fs::File::open(png_path).expect("the screenshot exists");
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("a size")];
    let info = reader.next_frame(&mut buf).expect("a frame");
    assert_eq!(
        (info.width, info.height),
        (WIDTH, HEIGHT),
        "screenshot size"
    );
    let channels = info.color_type.samples();
    assert!(channels >= 3, "{:?}", info.color_type);
    let (mut ink, mut colour) = (0, 0);
    for px in buf[..info.buffer_size()].chunks(channels) {
        let (r, g, b) = (i32::from(px[0]), i32::from(px[1]), i32::from(px[2]));
        if r < 235 || g < 235 || b < 235 {
            ink += 1;
        }
        if r.max(g).max(b) - r.min(g).min(b) > 40 {
            colour += 1;
        }
    }
    (ink, colour, u64::from(WIDTH) * u64::from(HEIGHT))
}

fn workdir() -> (Option<tempfile::TempDir>, PathBuf) {
    match std::env::var_os("TESSERA_REPORT_SHOTS") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            std::fs::create_dir_all(&dir).expect("TESSERA_REPORT_SHOTS");
            (None, dir)
        }
        None => {
            let tmp = tempfile::tempdir().expect("tempdir");
            let path = tmp.path().to_path_buf();
            (Some(tmp), path)
        }
    }
}

fn assert_clean(check: &Check, svgs: usize) {
    assert!(check.errors.is_empty(), "script errors: {:?}", check.errors);
    assert_eq!(check.svgs, svgs, "charts in the page");
    assert_eq!(
        check.drawn, svgs,
        "charts laid out with their labels: {check:?}"
    );
    assert!(
        check.missing.is_empty(),
        "links to nothing: {:?}",
        check.missing
    );
    assert!(
        check.width <= WIDTH,
        "the page is {} px wide: wider than the window",
        check.width
    );
}

#[test]
fn the_model_page_renders_in_chromium() {
    if chromium_missing() {
        return;
    }
    let (_keep, dir) = workdir();
    let model = common::make(common::Shape {
        processes: 40,
        files: 300,
        phases_per_file: 2,
        meta_phases: 80,
        points_per_phase: 60,
    });
    let (shot, check) = load(&dir, "model", &model_report(&model));
    assert_clean(&check, 3);
    let (ink, colour, all) = inked(&shot);
    assert!(
        ink > all / 20,
        "the page looks blank: {ink} of {all} pixels inked"
    );
    assert!(
        colour > all / 200,
        "the charts show no colour: {colour} of {all} pixels"
    );
    eprintln!(
        "model page: {ink} of {all} pixels inked, {colour} coloured; {}",
        shot.display()
    );
}

#[test]
fn the_memory_page_renders_in_chromium() {
    if chromium_missing() {
        return;
    }
    let (_keep, dir) = workdir();
    let g = 1u64 << 30;
    let samples: Vec<MemorySample> = (0..120)
        .map(|i| MemorySample {
            t_ms: i * 1000,
            nodes: 2 + (i / 30) as u32,
            allocated: (2 + i / 30) * 4 * g,
            used: (i % 50) * g / 5,
        })
        .collect();
    let html = memory_report(&samples, &[("samples", "120".into())], "memory", "a test");
    let (shot, check) = load(&dir, "memory", &html);
    assert_clean(&check, 1);
    let (ink, colour, all) = inked(&shot);
    // One chart on a tall page: less ink, but its areas are coloured.
    assert!(
        ink > all / 100,
        "the page looks blank: {ink} of {all} pixels inked"
    );
    assert!(
        colour > all / 200,
        "the chart shows no colour: {colour} of {all} pixels"
    );
}

#[test]
fn the_evaluation_page_renders_in_chromium() {
    if chromium_missing() {
        return;
    }
    let (_keep, dir) = workdir();
    let verdict = common::verdict();
    let html = evaluate_report(&verdict, "evaluation", "a test");
    let (shot, check) = load(&dir, "evaluate", &html);
    // Time, performance per dollar, cloud price, and the scaling model.
    assert_clean(&check, 4);
    let (ink, colour, all) = inked(&shot);
    assert!(
        ink > all / 50,
        "the page looks blank: {ink} of {all} pixels inked"
    );
    assert!(
        colour > all / 200,
        "the charts show no colour: {colour} of {all} pixels"
    );
}
