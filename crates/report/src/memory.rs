//! `tessera report`'s page: memory allocated and used over time with the server count, drawn
//! like MemFS's Figure 6, and a table of totals the caller computes.

use crate::chart::{self, font, house_mesh, legend, tick, Area, Drawn, Mark};
use crate::page::{self, byte_unit};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One sample of the manager's memory history. Its own type, so that drawing needs no manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySample {
    /// Milliseconds since the manager started.
    pub t_ms: u64,
    /// Live servers.
    pub nodes: u32,
    /// Memory the live servers offer, bytes.
    pub allocated: u64,
    /// Memory their data takes, bytes.
    pub used: u64,
}

const W: u32 = 960;
const H: u32 = 520;
const ALLOC: RGBColor = RGBColor(0x1f, 0x6f, 0xb4);
const USED: RGBColor = RGBColor(0xe0, 0x63, 0x1a);
const NODES: RGBColor = RGBColor(0x2b, 0x9a, 0x3e);

/// The whole page: title, chart, and `summary` (label, value) as a table below it.
pub fn memory_report(
    samples: &[MemorySample],
    summary: &[(&str, String)],
    title: &str,
    source: &str,
) -> String {
    let body = format!("{}\n{}", memory_chart(samples), page::kv_table(summary));
    page::document(
        title,
        &format!("from {source}; each sample holds until the next"),
        &body,
    )
}

/// The chart: memory allocated (a step line over a light area) and used (over a darker area) in
/// bytes against time on the left axis, the server count (dashed steps) on the right. Handles
/// no and one sample.
pub fn memory_chart(samples: &[MemorySample]) -> String {
    chart::svg(W, H, |root| draw(root, samples))
}

fn draw(root: &Area<'_>, samples: &[MemorySample]) -> Drawn {
    let (top, plot) = root.split_vertically(40);
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
    let (unit, unit_size) = if peak > 0.0 {
        byte_unit(peak)
    } else {
        ("GiB", f64::from(1u32 << 30))
    };
    let y_max = if peak > 0.0 {
        peak / unit_size * 1.05
    } else {
        1.0
    };
    // The node line peaks at about half height, below the memory lines (which peak near the
    // top), so equal nodes' allocation and count do not draw over each other.
    let peak_nodes = samples.iter().map(|s| s.nodes).max().unwrap_or(0);
    let n_max = (f64::from(peak_nodes.max(1)) / 0.55).ceil();

    let mut chart = ChartBuilder::on(&plot)
        .margin_left(10)
        .margin_right(10)
        .margin_bottom(8)
        .x_label_area_size(46)
        .y_label_area_size(70)
        .right_y_label_area_size(56)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?
        .set_secondary_coord(0f64..x_max, 0f64..n_max);
    house_mesh(chart.configure_mesh().disable_x_mesh(), 13)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .x_desc(format!("time ({t_unit})"))
        .y_desc(format!("memory ({unit})"))
        .draw()?;
    chart
        .configure_secondary_axes()
        .axis_style(NODES)
        .label_style(font(13).color(&NODES))
        .axis_desc_style(font(14).color(&NODES))
        .y_desc("nodes")
        // One tick per node while they fit; the formatter labels whole nodes only.
        .y_labels((n_max as usize + 1).min(11))
        .y_label_formatter(&|n| {
            if n.fract() == 0.0 {
                format!("{n:.0}")
            } else {
                String::new()
            }
        })
        .draw()?;

    legend(
        &top,
        "",
        &[
            (Mark::Line(ALLOC), "memory allocated".into()),
            (Mark::Line(USED), "memory used".into()),
            (Mark::Dashed(NODES), "nodes (right axis)".into()),
        ],
        80,
    )?;

    if samples.is_empty() {
        let (w, h) = plot.dim_in_pixel();
        plot.draw(&Text::new(
            "no samples yet",
            (w as i32 / 2, h as i32 / 2),
            font(16)
                .color(&RGBColor(0x88, 0x88, 0x88))
                .pos(Pos::new(HPos::Center, VPos::Center)),
        ))?;
        return Ok(());
    }
    let x = |s: &MemorySample| s.t_ms.saturating_sub(t0) as f64 / 1000.0 / t_div;
    // A single sample holds across the whole (one second) chart.
    let end_x = if samples.len() == 1 {
        x_max
    } else {
        x(&samples[samples.len() - 1])
    };
    let steps = |val: &dyn Fn(&MemorySample) -> f64| {
        let mut pts = vec![(x(&samples[0]), val(&samples[0]))];
        for w in samples.windows(2) {
            let (prev, next) = (val(&w[0]), val(&w[1]));
            pts.push((x(&w[1]), prev));
            pts.push((x(&w[1]), next));
        }
        pts.push((end_x, val(&samples[samples.len() - 1])));
        pts
    };
    let mem = |b: u64| b as f64 / unit_size;
    chart.draw_series(
        AreaSeries::new(steps(&|s| mem(s.allocated)), 0.0, ALLOC.mix(0.13))
            .border_style(ALLOC.stroke_width(2)),
    )?;
    chart.draw_series(
        AreaSeries::new(steps(&|s| mem(s.used)), 0.0, USED.mix(0.30))
            .border_style(USED.stroke_width(2)),
    )?;
    chart.draw_secondary_series(DashedLineSeries::new(
        steps(&|s| f64::from(s.nodes)),
        6,
        4,
        NODES.stroke_width(2),
    ))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_ms: u64, nodes: u32, allocated: u64, used: u64) -> MemorySample {
        MemorySample {
            t_ms,
            nodes,
            allocated,
            used,
        }
    }

    fn sane(svg: &str) {
        let svg = svg.trim_end();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"), "{svg}");
        assert_eq!(svg.matches("<svg").count(), 1);
        for bad in ["NaN", "inf"] {
            assert!(!svg.contains(bad), "{bad} in {svg}");
        }
        assert_eq!(svg.matches('<').count(), svg.matches('>').count());
    }

    /// Colours appear as plotters writes them: `#RRGGBB`.
    fn color(c: RGBColor) -> String {
        format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
    }

    #[test]
    fn draws_both_series_and_the_nodes() {
        let g = 1u64 << 30;
        let samples: Vec<MemorySample> = (0..50)
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
        let svg = memory_chart(&samples);
        sane(&svg);
        for part in [
            "memory allocated",
            "memory used",
            "nodes (right axis)",
            "memory (GiB)",
            "time (s)",
            "\nnodes\n",
        ] {
            assert!(svg.contains(part), "{part} missing");
        }
        // Each series is drawn, not only its legend: the areas' outlines and the dashes.
        for c in [ALLOC, USED, NODES] {
            assert!(
                svg.matches(&color(c)).count() >= 3,
                "{} drawn too little",
                color(c)
            );
        }
        let html = memory_report(
            &samples,
            &[("peak nodes", "6".into())],
            "a <b> run",
            "http://x",
        );
        assert!(html.contains("<title>a &lt;b&gt; run</title>"));
        assert!(html.contains("<th>peak nodes</th><td>6</td>"));
        assert!(html.contains("from http://x; each sample holds until the next"));
        assert!(html.contains(&svg));
    }

    #[test]
    fn handles_no_and_one_sample_and_tiny_sizes() {
        let svg = memory_chart(&[]);
        sane(&svg);
        assert!(svg.contains("no samples yet"));
        let one = [sample(1234, 1, 64 << 20, 0)];
        let svg = memory_chart(&one);
        sane(&svg);
        assert!(svg.contains("memory (MiB)") && svg.contains(&color(USED)));
        let zeros = [sample(0, 0, 0, 0), sample(0, 0, 0, 0)];
        sane(&memory_chart(&zeros));
        let hours = [sample(0, 1, 10, 5), sample(3 * 3600 * 1000, 1, 10, 5)];
        assert!(memory_chart(&hours).contains("time (min)"));
    }
}
