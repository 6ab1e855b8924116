//! The model page on hand-built models: what it shows, what it links, and that it stays bounded.

mod common;

use common::{dangling_links, empty, make, Shape};
use tessera_report::model_report;

/// Well-formed enough for a browser and free of numbers gone wrong.
fn sane(html: &str) {
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    for bad in ["NaN", "inf<", "undefined"] {
        assert!(!html.contains(bad), "{bad} in the page");
    }
    assert!(!html.contains("<script"), "the page runs no script");
    assert!(!html.contains("chart not drawn"), "a chart failed");
    for tag in ["svg", "table", "tr", "ul", "li", "h2", "p"] {
        let open =
            html.matches(&format!("<{tag}>")).count() + html.matches(&format!("<{tag} ")).count();
        assert_eq!(
            open,
            html.matches(&format!("</{tag}>")).count(),
            "<{tag}> unbalanced"
        );
    }
    assert_eq!(
        dangling_links(html),
        Vec::<String>::new(),
        "links to no row"
    );
}

/// How many items outside the `n` heaviest (by `key`, largest first, then smallest id) are
/// `named`.
fn beyond_top<T>(
    items: &[T],
    n: usize,
    key: impl Fn(&T) -> (u64, u32),
    named: impl Fn(&T) -> bool,
) -> usize {
    let mut order: Vec<&T> = items.iter().collect();
    order.sort_by_key(|t| {
        let (w, id) = key(t);
        (std::cmp::Reverse(w), id)
    });
    order.iter().skip(n).filter(|t| named(t)).count()
}

fn rows(html: &str, prefix: &str) -> usize {
    html.matches(&format!("<tr id=\"{prefix}-")).count()
}

#[test]
fn an_empty_model_says_so_and_draws_nothing() {
    let html = model_report(&empty());
    sane(&html);
    assert!(html.contains("<title>I/O model of empty.ttrace</title>"));
    for note in [
        "Nothing stands out.",
        "No data requests were traced.",
        "No bytes were moved.",
        "No files.",
        "No data phases.",
        "No metadata phases.",
        "No processes.",
    ] {
        assert!(html.contains(note), "{note} missing");
    }
    assert_eq!(html.matches("<svg").count(), 0);
}

#[test]
fn one_file_one_process() {
    let m = make(Shape {
        processes: 1,
        files: 1,
        phases_per_file: 2,
        meta_phases: 0,
        points_per_phase: 50,
    });
    let html = model_report(&m);
    sane(&html);
    // Timeline, heat map and histograms, each drawn by plotters.
    assert_eq!(html.matches("<svg").count(), 3);
    assert_eq!(rows(&html, "file"), 1);
    assert_eq!(rows(&html, "phase"), 2);
    let f = &m.files[0];
    assert!(html.contains(&f.path));
    // The size class of its requests is in the legend (4 KiB, each size its own colour).
    assert!(html.contains("\n4 KiB\n"), "size legend");
    assert!(html.contains("\nread\n") && html.contains("\nwrite\n"));
    assert!(html.contains("offset (KiB)") || html.contains("offset (MiB)"));
    assert!(html.contains("time since the trace began (ms)"));
    // The heat map labels its row with pid and program name.
    assert!(html.contains("\n1000 sort\n"), "heat-map row label");
    // Histograms: one caption per direction, with counts.
    // 404 requests of 4 KiB each way.
    assert!(
        html.contains("reads: 404 requests, 1.6 MiB"),
        "read histogram caption"
    );
    assert!(html.contains("writes: 404 requests, 1.6 MiB"));
    // Phase fields as PIOM has them.
    assert!(
        html.contains("<td class=\"num\">4 KiB</td>"),
        "displacement or size"
    );
    // The finding links to the file's and its phases' rows.
    assert!(html.contains(r##"<a href="#file-0">"##));
    assert!(html.contains(r##"<a href="#phase-1">1</a>"##));
    // No note about rows left out: everything fits.
    assert!(!html.contains("left out"));
}

#[test]
fn many_processes_share_the_heat_map_bounded() {
    let m = make(Shape {
        processes: 300,
        files: 4,
        phases_per_file: 2,
        meta_phases: 2,
        points_per_phase: 200,
    });
    let html = model_report(&m);
    sane(&html);
    assert!(
        html.contains("277 other processes"),
        "the lightest processes share one row"
    );
    assert!(html.contains("The 23 processes that moved the most bytes have a row each"));
    // Process table bounded, with a note.
    assert!(html.contains("50 of 300 processes shown"));
    // Phases list every process's initial offset up to a few.
    assert!(html.contains("0 B, 4 KiB, 8 KiB, … 297 more"));
}

#[test]
fn large_models_stay_bounded_and_findings_keep_their_rows() {
    let m = make(Shape {
        processes: 64,
        files: 3000,
        phases_per_file: 4,
        meta_phases: 400,
        points_per_phase: 20,
    });
    assert_eq!(m.phases.len(), 12_000);
    assert_eq!(m.timeline.points.len(), 240_000);
    let html = model_report(&m);
    sane(&html);
    assert!(
        html.len() < 4 << 20,
        "page of {} bytes for a large model",
        html.len()
    );
    // The heaviest 100, and those a finding names that are not among them: the lightest file
    // (small requests) and its phases, the random-read file and phase.
    let named_files = beyond_top(
        &m.files,
        100,
        |f| (f.bytes_read + f.bytes_written, f.id),
        |f| m.findings.iter().any(|x| x.files.contains(&f.id)),
    );
    assert_eq!(named_files, 2);
    assert_eq!(rows(&html, "file"), 102);
    let last = m.files.last().expect("files");
    assert!(html.contains(&format!("<tr id=\"file-{}\"", last.id)));
    assert!(html.contains("102 of 3,000 files shown"));
    assert!(html.contains("2,898 more left out"));
    let named_phases = beyond_top(
        &m.phases,
        100,
        |p| (p.weight, p.id),
        |p| m.findings.iter().any(|x| x.phases.contains(&p.id)),
    );
    assert_eq!(named_phases, 5);
    assert_eq!(rows(&html, "phase"), 105);
    assert!(html.contains("105 of 12,000 phases shown"));
    // Metadata phases: 50 and the 8 a finding may name at most.
    assert!(rows(&html, "meta") <= 58);
    assert!(html.contains("of 400 metadata phases shown"));
    assert!(
        html.contains("and 392 more"),
        "a finding's links are bounded"
    );
    // The timeline draws 4 files and says how many requests it leaves out.
    assert!(html.contains("The 4 files that moved the most bytes are shown"));
    assert!(html.contains("sampled requests on 2,996 other files are not."));
}

#[test]
fn text_from_the_trace_is_escaped_everywhere() {
    let mut m = make(Shape {
        processes: 2,
        files: 2,
        ..Shape::default()
    });
    m.files[0].path = "evil/<script>alert(1)</script>&\"q\".dat".into();
    m.findings[0].text = "<b>bold</b> claim".into();
    m.source.trace = "<t>.ttrace".into();
    let html = model_report(&m);
    sane(&html);
    assert!(!html.contains("<script>alert"));
    assert!(!html.contains("<b>bold"));
    assert!(html.contains("&lt;b&gt;bold&lt;/b&gt; claim"));
    assert!(html.contains("<title>I/O model of &lt;t&gt;.ttrace</title>"));
    // In the table (HTML escaping) and in the timeline's panel caption (plotters' own).
    assert!(html.contains("evil/&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;q&quot;.dat"));
    assert!(
        html.contains("evil/&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;q&quot;.dat  (shared")
    );
}

#[test]
fn dropped_records_and_dangling_references_are_handled() {
    let mut m = make(Shape::default());
    m.source.dropped = 1234;
    // A finding that names rows the model does not have: text, not a link to nothing.
    m.findings[0].files.push(999);
    m.findings[0].phases.push(999);
    let html = model_report(&m);
    sane(&html);
    assert!(html.contains("no room for 1,234 of its records"));
    assert!(html.contains(", file 999;") || html.contains(", file 999<"));
}

#[test]
fn extreme_values_from_a_corrupt_model_do_not_break_the_page() {
    let mut m = make(Shape {
        processes: 3,
        files: 3,
        ..Shape::default()
    });
    let max = u64::MAX;
    m.files[0].bytes_read = max;
    m.files[0].bytes_written = max;
    m.files[0].size = max;
    m.phases[0].sizes.push(tessera_model::SizeCount {
        size: max,
        count: max,
    });
    m.phases[0].ops = max;
    m.phases[0].end_ns = 0; // before its start
    m.phases[1]
        .sizes
        .push(tessera_model::SizeCount { size: 0, count: 3 });
    m.timeline.points[0].offset = max;
    m.timeline.points[0].size = max;
    m.timeline.points[1].start_ns = max;
    m.timeline.heat[0].bytes[0] = max;
    m.timeline.heat[1].bytes[0] = max;
    m.processes[0].bytes_read = max;
    m.processes[0].bytes_written = max;
    m.application.wall_ns = max;
    m.application.metadata.per_second = f64::NAN;
    m.meta_phases[0].start_ns = max;
    let html = model_report(&m);
    sane(&html);
    // A heat map with no bin width cannot be drawn: it says so instead.
    m.timeline.bin_ns = 0;
    assert!(model_report(&m).contains("No bytes were moved."));
}
