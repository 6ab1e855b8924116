//! The model page's charts: offset over time (PIOM's Figure 3), bytes per process over time,
//! and request-size histograms. Each returns HTML: the chart and a note on what it leaves out.

use crate::chart::{self, font, house_mesh, legend, tick, Area, Drawn, Mark, TimeAxis, AXIS};
use crate::page::{byte_unit, bytes, count, duration, escape};
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use tessera_model::{DataOp, Model, Point};

/// Wide enough for a laptop, narrow enough to leave the page margins.
const WIDTH: u32 = 1200;
/// The left label area of the timeline and the heat map: the same, so their plots line up.
const LABEL_W: u32 = 190;
/// Files drawn in the timeline, one panel each.
const PANELS: usize = 4;
const PANEL_H: u32 = 250;
/// Markers drawn at most: past this, every k-th sampled request.
const MAX_POINTS: usize = 12_000;
/// Heat-map rows at most (the rest are summed into one) and columns (neighbours merged).
const HEAT_ROWS: usize = 24;
const HEAT_COLS: usize = 300;
const HEAT_ROW_H: u32 = 22;
/// Size classes of the timeline at most.
const CLASSES: usize = 8;

const READ: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const WRITE: RGBColor = RGBColor(0xd6, 0x5f, 0x0e);
/// One colour per request-size class, small to large; distinct side by side.
const CLASS_COLORS: [RGBColor; CLASSES + 1] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0x7f, 0x7f, 0x7f),
];

fn empty(text: &str) -> String {
    format!(r#"<p class="empty">{}</p>"#, escape(text))
}

/// A request-size class: sizes in `lo..hi`.
#[derive(Debug, Clone, PartialEq)]
struct SizeClass {
    lo: u64,
    hi: u64,
    label: String,
}

/// Classes for the sizes seen: each size its own when there are few (the common case: an
/// application uses a handful), else ranges of whole octaves, at most [`CLASSES`] of them, and
/// zero-length requests apart.
fn size_classes(sizes: &BTreeSet<u64>) -> Vec<SizeClass> {
    if sizes.len() <= CLASSES {
        return sizes
            .iter()
            .map(|&s| SizeClass {
                lo: s,
                hi: s.saturating_add(1),
                label: bytes(s),
            })
            .collect();
    }
    let mut classes = Vec::new();
    if sizes.contains(&0) {
        classes.push(SizeClass {
            lo: 0,
            hi: 1,
            label: "0 B".into(),
        });
    }
    let positive = sizes.range(1..);
    let (Some(&min), Some(&max)) = (positive.clone().next(), positive.last()) else {
        return classes;
    };
    let octave = |s: u64| 63 - s.leading_zeros();
    let (first, last) = (octave(min), octave(max));
    let step = (last - first + 1).div_ceil(CLASSES as u32);
    let pow = |e: u32| 1u64.checked_shl(e).unwrap_or(u64::MAX);
    let mut e = first;
    while e <= last {
        let (lo, hi) = (pow(e), pow(e + step));
        let hi = if e + step > last { u64::MAX } else { hi };
        let label = if hi == u64::MAX {
            format!("≥ {}", bytes(lo))
        } else {
            format!("{} – {}", bytes(lo), bytes(hi))
        };
        classes.push(SizeClass { lo, hi, label });
        e += step;
    }
    classes
}

/// The end of the model's time.
fn span_ns(model: &Model) -> u64 {
    let t = &model.timeline;
    let heat_cols = t.heat.iter().map(|r| r.bytes.len()).max().unwrap_or(0) as u64;
    [
        t.points.iter().map(|p| p.start_ns).max(),
        Some(heat_cols.saturating_mul(t.bin_ns)),
        model.files.iter().map(|f| f.last_ns).max(),
        model.phases.iter().map(|p| p.end_ns).max(),
        model.meta_phases.iter().map(|p| p.end_ns).max(),
        model.processes.iter().map(|p| p.last_ns).max(),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(0)
}

/// Offset over time, one panel per busiest file, one marker per sampled request: colour by
/// request-size class, a dot for a read and a cross for a write.
pub fn timeline(model: &Model) -> String {
    let points = &model.timeline.points;
    if points.is_empty() {
        return empty("No data requests were traced.");
    }
    let mut per_file: BTreeMap<u32, usize> = BTreeMap::new();
    for p in points {
        *per_file.entry(p.file).or_default() += 1;
    }
    let moved = |f: u32| {
        model
            .file(f)
            .map_or(0, |m| m.bytes_read.saturating_add(m.bytes_written))
    };
    let mut files: Vec<u32> = per_file.keys().copied().collect();
    files.sort_by_key(|&f| (Reverse(moved(f)), Reverse(per_file[&f]), f));
    files.truncate(PANELS);
    let on_shown: Vec<&Point> = points.iter().filter(|p| files.contains(&p.file)).collect();
    let stride = on_shown.len().div_ceil(MAX_POINTS).max(1);
    let drawn: Vec<&Point> = on_shown.iter().step_by(stride).copied().collect();
    let classes = size_classes(&drawn.iter().map(|p| p.size).collect());
    let class_of = |size: u64| classes.iter().position(|c| c.lo <= size && size < c.hi);

    let height = 44 + PANEL_H * files.len() as u32;
    let svg = chart::svg(WIDTH, height, |root| {
        let (top, rest) = root.split_vertically(44);
        let mut items: Vec<(Mark, String)> = classes
            .iter()
            .enumerate()
            .map(|(i, c)| (Mark::Dot(CLASS_COLORS[i.min(CLASSES)]), c.label.clone()))
            .collect();
        items.push((Mark::Dot(AXIS), "read".into()));
        items.push((Mark::Cross(AXIS), "write".into()));
        legend(&top, "request size:", &items, 20)?;
        let panels = rest.split_evenly((files.len(), 1));
        for (panel, &file) in panels.iter().zip(&files) {
            let mine: Vec<&Point> = drawn.iter().filter(|p| p.file == file).copied().collect();
            file_panel(panel, model, file, &mine, &|p| {
                CLASS_COLORS[class_of(p.size).unwrap_or(CLASSES).min(CLASSES)]
            })?;
        }
        Ok(())
    });
    let mut note = format!(
        "One marker per sampled request (the model keeps 1 of every {} data requests",
        count(model.timeline.sampled_every.max(1))
    );
    if stride > 1 {
        note += &format!("; 1 of every {stride} of those is drawn here");
    }
    note += "); y is the offset within the file.";
    let others = per_file.len() - files.len();
    if others > 0 {
        let hidden = points.len() - on_shown.len();
        note += &format!(
            " The {} files that moved the most bytes are shown; {} sampled requests on {} other files are not.",
            files.len(),
            count(hidden as u64),
            count(others as u64)
        );
    }
    format!(r#"{svg}<p class="note">{}</p>"#, escape(&note))
}

fn file_panel(
    panel: &Area<'_>,
    model: &Model,
    file: u32,
    points: &[&Point],
    color: &dyn Fn(&Point) -> RGBColor,
) -> Drawn {
    let f = model.file(file);
    let top = points
        .iter()
        .map(|p| p.offset.saturating_add(p.size))
        .chain(f.map(|f| f.size))
        .max()
        .unwrap_or(0)
        .max(1);
    let (unit, unit_size) = byte_unit(top as f64);
    let mut caption = f.map_or_else(|| format!("file {file}"), |f| clip(&f.path, 90));
    if let Some(f) = f {
        caption += &format!(
            "  ({}, {}, {}, {} moved)",
            crate::model_page::sharing(f.sharing),
            crate::model_page::access(f.access),
            crate::model_page::direction(f.direction),
            bytes(f.bytes_read.saturating_add(f.bytes_written))
        );
    }
    // Each panel spans its file's requests, in a unit of its own: a file used for a moment of
    // a long run still shows its pattern.
    let (first, last) = points.iter().fold((u64::MAX, 0), |(lo, hi), p| {
        (lo.min(p.start_ns), hi.max(p.start_ns))
    });
    let pad = (last.saturating_sub(first) / 40).max(1000);
    let (first, last) = (first.saturating_sub(pad), last.saturating_add(pad));
    let time = TimeAxis::new(last - first);
    let mut chart = ChartBuilder::on(panel)
        .caption(caption, font(14))
        .margin_right(24)
        .margin_top(4)
        .x_label_area_size(40)
        .y_label_area_size(LABEL_W)
        .build_cartesian_2d(
            time.at(first)..time.at(last),
            0f64..(top as f64 / unit_size),
        )?;
    house_mesh(&mut chart.configure_mesh(), 12)
        .y_labels(5)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .y_desc(format!("offset ({unit})"))
        .x_desc(format!("time since the trace began ({})", time.unit))
        .draw()?;
    let at = |p: &Point| (time.at(p.start_ns), p.offset as f64 / unit_size);
    chart.draw_series(
        points
            .iter()
            .filter(|p| p.op == DataOp::Read)
            .map(|p| Circle::new(at(p), 2, color(p).filled())),
    )?;
    chart.draw_series(
        points
            .iter()
            .filter(|p| p.op == DataOp::Write)
            .map(|p| Cross::new(at(p), 3, color(p).stroke_width(1))),
    )?;
    Ok(())
}

/// At most `max` characters of `s`, its end kept (a path's file name matters most).
pub fn clip(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        s.to_string()
    } else {
        let tail: String = s.chars().skip(n - max + 1).collect();
        format!("…{tail}")
    }
}

/// Bytes each process moved over time: a row per process (the busiest; the others summed into
/// one), a column per time bin, darker for more, on a log scale.
pub fn heat_map(model: &Model) -> String {
    let t = &model.timeline;
    let cols = t.heat.iter().map(|r| r.bytes.len()).max().unwrap_or(0);
    if cols == 0 || t.bin_ns == 0 {
        return empty("No bytes were moved.");
    }
    let exe: BTreeMap<u32, &str> = model
        .processes
        .iter()
        .filter_map(|p| Some((p.pid, p.exe.as_deref()?)))
        .collect();
    let merge = cols.div_ceil(HEAT_COLS);
    let merged = |bytes: &[u64]| -> Vec<u64> { bytes.chunks(merge).map(total).collect() };
    let mut rows: Vec<(String, Vec<u64>)> = t
        .heat
        .iter()
        .map(|r| {
            let name = exe
                .get(&r.pid)
                .map_or("", |e| e.rsplit('/').next().unwrap_or(e));
            (clip(&format!("{} {name}", r.pid), 26), merged(&r.bytes))
        })
        .collect();
    rows.sort_by_key(|(_, b)| Reverse(total(b)));
    if rows.len() > HEAT_ROWS {
        let rest = rows.split_off(HEAT_ROWS - 1);
        let mut sum = vec![0u64; cols.div_ceil(merge)];
        for (_, b) in &rest {
            for (s, v) in sum.iter_mut().zip(b) {
                *s = s.saturating_add(*v);
            }
        }
        rows.push((format!("{} other processes", rest.len()), sum));
    }
    let peak = rows.iter().flat_map(|(_, b)| b).copied().max().unwrap_or(0);
    if peak == 0 {
        return empty("No bytes were moved.");
    }
    let col_ns = t.bin_ns.saturating_mul(merge as u64);
    let time = TimeAxis::new(span_ns(model));
    // Darker for more bytes, on a log scale: light enough at the low end to tell from none.
    let scale = DerivedColorMap::new(&[
        RGBColor(0xc6, 0xdb, 0xef),
        RGBColor(0x42, 0x92, 0xc6),
        RGBColor(0x08, 0x30, 0x6b),
    ]);
    let log_peak = ((peak as f64) + 1.0).log2();
    let shade = |b: u64| scale.get_color((((b as f64) + 1.0).log2() / log_peak) as f32);
    let n = rows.len() as u32;
    let chart_h = 30 + HEAT_ROW_H * n + 50;
    let svg = chart::svg(WIDTH, chart_h + 70, |root| {
        let (main, bar) = root.split_vertically(chart_h);
        let mut chart = ChartBuilder::on(&main)
            .margin_right(24)
            .margin_top(12)
            .x_label_area_size(46)
            .y_label_area_size(LABEL_W)
            .build_cartesian_2d(0f64..time.max, (0..n).into_segmented())?;
        chart
            .configure_mesh()
            .disable_mesh()
            .axis_style(AXIS)
            .label_style(font(12))
            .axis_desc_style(font(13))
            .y_labels(n as usize)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => (n - 1)
                    .checked_sub(*i)
                    .and_then(|r| rows.get(r as usize))
                    .map_or_else(String::new, |r| r.0.clone()),
                _ => String::new(),
            })
            .x_label_formatter(&tick)
            .y_desc("process (pid, program)")
            .x_desc(format!("time since the trace began ({})", time.unit))
            .draw()?;
        for (i, (_, cells)) in rows.iter().enumerate() {
            let y = n - 1 - i as u32;
            chart.draw_series(cells.iter().enumerate().filter(|(_, &b)| b > 0).map(
                |(j, &b)| {
                    let x0 = time.at(col_ns.saturating_mul(j as u64));
                    let x1 = time.at(col_ns.saturating_mul(j as u64 + 1));
                    Rectangle::new(
                        [
                            (x0, SegmentValue::Exact(y)),
                            (x1, SegmentValue::Exact(y + 1)),
                        ],
                        shade(b).filled(),
                    )
                },
            ))?;
        }
        shade_bar(&bar, log_peak, col_ns, &shade)
    });
    let mut note = format!(
        "Each column is {} wide; the scale is logarithmic, white is nothing moved.",
        duration(col_ns)
    );
    if t.heat.len() > HEAT_ROWS {
        note += &format!(
            " The {} processes that moved the most bytes have a row each; the {} others share the last.",
            HEAT_ROWS - 1,
            count((t.heat.len() - (HEAT_ROWS - 1)) as u64)
        );
    }
    format!(r#"{svg}<p class="note">{}</p>"#, escape(&note))
}

/// The heat map's colour scale, in bytes per column on a log₂ axis (so its ticks fall on whole
/// KiB, MiB...).
fn shade_bar(
    area: &Area<'_>,
    log_peak: f64,
    col_ns: u64,
    shade: &dyn Fn(u64) -> RGBColor,
) -> Drawn {
    let width = area.dim_in_pixel().0;
    let mut chart = ChartBuilder::on(area)
        .margin_right(width.saturating_sub(LABEL_W + 420))
        .margin_top(6)
        .x_label_area_size(40)
        .y_label_area_size(LABEL_W)
        .build_cartesian_2d(0f64..log_peak, 0f64..1f64)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .disable_y_axis()
        .axis_style(AXIS)
        .label_style(font(12))
        .axis_desc_style(font(13))
        .x_labels(6)
        .x_label_formatter(&|e| bytes(e.exp2().round() as u64))
        .x_desc(format!("bytes moved in {}", duration(col_ns)))
        .draw()?;
    const STEPS: u32 = 64;
    chart.draw_series((0..STEPS).map(|k| {
        let (e0, e1) = (
            log_peak * f64::from(k) / f64::from(STEPS),
            log_peak * f64::from(k + 1) / f64::from(STEPS),
        );
        let mid = ((e0 + e1) / 2.0).exp2() as u64;
        Rectangle::new([(e0, 0.0), (e1, 1.0)], shade(mid).filled())
    }))?;
    Ok(())
}

/// Counts from a model summed without overflowing on a corrupt one.
fn total(counts: &[u64]) -> u64 {
    counts.iter().fold(0, |a, &b| a.saturating_add(b))
}

/// A request-size bin: sizes from 2^(b-1) up to 2^b (b = 0 holds zero-length requests).
fn size_bin(size: u64) -> u32 {
    64 - size.leading_zeros()
}

fn bin_label(b: u32) -> String {
    if b == 0 {
        "0 B".into()
    } else {
        bytes(1u64 << (b - 1))
    }
}

/// Request sizes of reads and of writes, from every phase, in power-of-two bins.
pub fn size_histograms(model: &Model) -> String {
    let mut bins: [BTreeMap<u32, u64>; 2] = Default::default();
    let mut totals = [(0u64, 0u64); 2];
    for ph in &model.phases {
        let k = usize::from(ph.op == DataOp::Write);
        for sc in &ph.sizes {
            let n = bins[k].entry(size_bin(sc.size)).or_default();
            *n = n.saturating_add(sc.count);
        }
        totals[k].0 = totals[k].0.saturating_add(ph.ops);
        totals[k].1 = totals[k].1.saturating_add(ph.weight);
    }
    let all: BTreeSet<u32> = bins.iter().flat_map(|b| b.keys().copied()).collect();
    let (Some(&lo), Some(&hi)) = (all.first(), all.last()) else {
        return empty("No data requests were traced.");
    };
    let n = hi - lo + 1;
    // Every bin labelled while the labels fit, else every k-th.
    let every = n.div_ceil(8);
    let svg = chart::svg(WIDTH, 330, |root| {
        let halves = root.split_evenly((1, 2));
        for (k, half) in halves.iter().enumerate() {
            let (name, color) = if k == 0 {
                ("reads", READ)
            } else {
                ("writes", WRITE)
            };
            let caption = if totals[k].0 == 0 {
                format!("{name}: none")
            } else {
                format!(
                    "{name}: {} requests, {}",
                    count(totals[k].0),
                    bytes(totals[k].1)
                )
            };
            let top = bins[k].values().copied().max().unwrap_or(0).max(1);
            let mut chart = ChartBuilder::on(half)
                .caption(caption, font(14))
                .margin(10)
                .x_label_area_size(46)
                .y_label_area_size(70)
                .build_cartesian_2d(
                    (lo..hi + 1).into_segmented(),
                    0u64..top.saturating_add(top / 10 + 1),
                )?;
            house_mesh(chart.configure_mesh().disable_x_mesh(), 12)
                .x_labels(n as usize + 1)
                .x_label_formatter(&|v| match v {
                    SegmentValue::CenterOf(b) if b.saturating_sub(lo).is_multiple_of(every) => {
                        bin_label(*b)
                    }
                    _ => String::new(),
                })
                .y_label_formatter(&|c| count(*c))
                .x_desc("request size (from)")
                .y_desc("requests")
                .draw()?;
            chart.draw_series(
                Histogram::vertical(&chart)
                    .style(color.filled())
                    .margin(2)
                    .data(bins[k].iter().map(|(&b, &c)| (b, c))),
            )?;
        }
        Ok(())
    });
    format!(
        r#"{svg}<p class="note">Each bar counts the requests from its size up to twice it.</p>"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_sizes_are_classes_of_their_own_many_are_octave_ranges() {
        let few: BTreeSet<u64> = [4096, 1 << 20].into();
        let c = size_classes(&few);
        assert_eq!(c.len(), 2);
        assert_eq!(
            (c[0].lo, c[0].hi, c[0].label.as_str()),
            (4096, 4097, "4 KiB")
        );
        let many: BTreeSet<u64> = (0..40).map(|e| 1u64 << e).chain([0, u64::MAX]).collect();
        let c = size_classes(&many);
        assert!(c.len() <= CLASSES + 1, "{c:?}");
        assert_eq!(c[0].label, "0 B");
        assert_eq!(c[1].lo, 1);
        assert_eq!(c.last().map(|c| c.hi), Some(u64::MAX));
        // Every size falls in exactly one class but u64::MAX itself, which no request has.
        for s in &many {
            let n = c.iter().filter(|c| c.lo <= *s && *s < c.hi).count();
            assert_eq!(n, usize::from(*s != u64::MAX), "{s}");
        }
        for w in c.windows(2) {
            assert_eq!(w[0].hi, w[1].lo);
        }
    }

    #[test]
    fn size_bins() {
        assert_eq!(size_bin(0), 0);
        assert_eq!(size_bin(1), 1);
        assert_eq!(size_bin(4096), 13);
        assert_eq!(size_bin(8191), 13);
        assert_eq!(bin_label(13), "4 KiB");
        assert_eq!(bin_label(0), "0 B");
        assert_eq!(size_bin(u64::MAX), 64);
        assert_eq!(bin_label(64), "8192 PiB");
    }

    #[test]
    fn clip_keeps_the_end() {
        assert_eq!(clip("abc", 5), "abc");
        assert_eq!(clip("abcdef", 4), "…def");
    }
}
