//! `tessera evaluate`'s page: each candidate's time with its spread, performance per dollar
//! and the price of a run in a cloud, the scaling model against the measured points, the
//! table of everything measured, and the recommendation in words.

use crate::chart::{self, house_mesh, legend, tick, Area, Drawn, Mark, AXIS, GRID};
use crate::page::{self, bytes, escape, per_second};
use plotters::prelude::*;
use std::fmt::Write as _;
use tessera_evaluate::{Bound, Extrapolation, Outcome, Verdict};

const W: u32 = 960;
const BAR: u32 = 34;

fn colour(b: Bound) -> RGBColor {
    match b {
        Bound::Network => RGBColor(0x1f, 0x6f, 0xb4),
        Bound::Cpu => RGBColor(0xe0, 0x63, 0x1a),
        Bound::Memory => RGBColor(0x8e, 0x44, 0xad),
        Bound::Latency => RGBColor(0x2b, 0x9a, 0x3e),
    }
}

const BOUNDS: [Bound; 4] = [Bound::Network, Bound::Cpu, Bound::Memory, Bound::Latency];

/// The whole page.
pub fn evaluate_report(v: &Verdict, title: &str, source: &str) -> String {
    let mut body = format!(
        r#"<p class="note"><b>{}</b></p>"#,
        escape(&v.recommendation)
    );
    body.push_str("<h2>Time per configuration</h2>");
    body.push_str(&bars(
        &v.outcomes,
        "seconds (median; whiskers: fastest and slowest run)",
        &|o| o.seconds.median,
        Some(&|o: &Outcome| (o.seconds.min, o.seconds.max)),
    ));
    body.push_str("<h2>Cost</h2><div class=\"cols\">");
    body.push_str(&bars(
        &v.outcomes,
        &format!(
            "performance per purchase dollar, relative to {}",
            v.baseline
        ),
        &|o| o.perf_per_dollar,
        None,
    ));
    body.push_str(&bars(
        &v.outcomes,
        "price of one run in a cloud",
        &|o| o.cloud_cost,
        None,
    ));
    body.push_str("</div><h2>Measured</h2>");
    body.push_str(&table(&v.outcomes));
    body.push_str("<h2>Scaling model</h2>");
    body.push_str(&scaling(&v.scaling));
    page::document(title, source, &body)
}

type Whisker<'a> = Option<&'a dyn Fn(&Outcome) -> (f64, f64)>;

/// One horizontal bar per candidate, coloured by what bounds it.
fn bars(
    outcomes: &[Outcome],
    desc: &str,
    value: &dyn Fn(&Outcome) -> f64,
    whisker: Whisker,
) -> String {
    let h = 90 + BAR * outcomes.len() as u32;
    chart::svg(W, h, |root| {
        let (top, plot) = root.split_vertically(36);
        let max = outcomes
            .iter()
            .map(|o| whisker.map_or(value(o), |w| w(o).1).max(value(o)))
            .fold(0.0, f64::max);
        let x_max = if max > 0.0 { max * 1.1 } else { 1.0 };
        let n = outcomes.len();
        let mut chart = ChartBuilder::on(&plot)
            .margin_left(10)
            .margin_right(20)
            .x_label_area_size(40)
            .y_label_area_size(150)
            .build_cartesian_2d(0f64..x_max, (0..n).into_segmented())?;
        house_mesh(chart.configure_mesh().disable_y_mesh(), 13)
            .x_label_formatter(&tick)
            .y_label_formatter(&|s| match s {
                SegmentValue::CenterOf(i) => {
                    outcomes.get(*i).map_or(String::new(), |o| o.name.clone())
                }
                _ => String::new(),
            })
            .x_desc(desc)
            .draw()?;
        for (i, o) in outcomes.iter().enumerate() {
            let (a, b) = (SegmentValue::Exact(i), SegmentValue::Exact(i + 1));
            chart.draw_series(std::iter::once(
                Rectangle::new([(0.0, a), (value(o), b)], colour(o.bound).mix(0.8).filled())
                    .into_dyn(),
            ))?;
            if let Some(w) = whisker {
                let (lo, hi) = w(o);
                let mid = SegmentValue::CenterOf(i);
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(lo, mid.clone()), (hi, mid)],
                    AXIS.stroke_width(2),
                )))?;
            }
        }
        draw_legend(&top)
    })
}

fn draw_legend(area: &Area<'_>) -> Drawn {
    let items: Vec<(Mark, String)> = BOUNDS
        .iter()
        .map(|b| (Mark::Dot(colour(*b)), b.words().to_string()))
        .collect();
    legend(area, "", &items, 160)
}

fn table(outcomes: &[Outcome]) -> String {
    let mut t = String::from(
        "<div class=\"scroll\"><table><thead><tr><th>configuration</th><th>hosts</th>\
         <th>time (s)</th><th>min–max</th><th>throughput</th><th>ops/s</th><th>CPU busy</th>\
         <th>links busy</th><th>memory busy</th><th>I/O wait (s)</th><th>bound</th>\
         <th>perf/$ (rel.)</th><th>cluster cost</th><th>cloud cost/run</th></tr></thead><tbody>",
    );
    for o in outcomes {
        let _ = write!(
            t,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{:.2}</td>\
             <td class=\"num\">{:.2}–{:.2}</td><td class=\"num\">{}/s</td>\
             <td class=\"num\">{}</td><td class=\"num\">{:.0} %</td><td class=\"num\">{:.0} %</td>\
             <td class=\"num\">{:.0} %</td><td class=\"num\">{:.2}</td><td>{}</td>\
             <td class=\"num\">{:.2}</td><td class=\"num\">{:.0}</td><td class=\"num\">{:.4}</td></tr>",
            escape(&o.name),
            o.hosts,
            o.seconds.median,
            o.seconds.min,
            o.seconds.max,
            bytes(o.throughput as u64),
            per_second(o.ops_per_second),
            o.cpu_busy * 100.0,
            o.link_busy * 100.0,
            o.memory_busy * 100.0,
            o.iowait_seconds,
            escape(o.bound.words()),
            o.perf_per_dollar,
            o.purchase_cost,
            o.cloud_cost,
        );
    }
    t.push_str("</tbody></table></div>");
    t
}

fn scaling(x: &Extrapolation) -> String {
    let mut out = String::from(
        "<p class=\"note\">Ernest's terms for a fixed input (1, log m, m for m hosts), the work \
         split over C, the cores the hosts could get (their limits together, at most this \
         machine's), work every host does at the speed of its cores (m/C), and data crossing \
         the links (1/(m × Gbit/s)), fitted by non-negative least squares on the median times. \
         It assumes the hosts of a cluster alike and a fixed input. Emulated hosts share this \
         machine's cores, so CPU-bound configurations are slower here than on real hosts; \
         predictions are for real hosts, each with its own cores.</p>",
    );
    if let Some(note) = &x.note {
        let _ = write!(out, "<p class=\"note warn\">{}</p>", escape(note));
    }
    let Some(model) = &x.model else {
        return out;
    };
    let terms: Vec<(&str, String)> = tessera_evaluate::scaling::FEATURES
        .iter()
        .zip(&model.coefficients)
        .map(|(f, c)| (*f, format!("{c:.4} s")))
        .collect();
    out.push_str(&page::kv_table(&terms));
    out.push_str(&chart::svg(W, 420, |root| scaling_chart(root, x)));
    if !x.checks.is_empty() {
        out.push_str(
            "<h3>Each measured configuration predicted by the model fitted on the others</h3>\
             <table><tr><th>hosts</th><th>Gbit/s</th><th>cores got</th><th>measured (s)</th>\
             <th>predicted (s)</th><th>error</th></tr>",
        );
        for c in &x.checks {
            let _ = write!(
                out,
                "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
                 <td class=\"num\">{:.2}</td><td class=\"num\">{:.2}</td>\
                 <td class=\"num\">{:.0} %</td></tr>",
                c.point.hosts,
                tick(&c.point.gbit),
                tick(&c.point.cores),
                c.point.seconds,
                c.predicted,
                c.error * 100.0
            );
        }
        out.push_str("</table>");
    }
    if !x.predictions.is_empty() {
        out.push_str(
            "<h3>Predicted</h3><table><tr><th>hosts</th><th>Gbit/s</th><th>cores each</th>\
             <th>time (s)</th></tr>",
        );
        for p in &x.predictions {
            let _ = write!(
                out,
                "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
                 <td class=\"num\">{:.2}</td></tr>",
                p.hosts,
                tick(&p.gbit),
                tick(&p.host_cores),
                p.seconds
            );
        }
        out.push_str("</table>");
    }
    out
}

const MEASURED: RGBColor = RGBColor(0x1f, 0x6f, 0xb4);
const LEFT_OUT: RGBColor = RGBColor(0xe0, 0x63, 0x1a);
const PREDICTED: RGBColor = RGBColor(0x8e, 0x44, 0xad);

/// Time against hosts: the model's curve for each link speed measured or predicted, the
/// measured points, each predicted from the others, and the predictions.
fn scaling_chart(root: &Area<'_>, x: &Extrapolation) -> Drawn {
    let Some(model) = &x.model else {
        return Ok(());
    };
    let (top, plot) = root.split_vertically(36);
    let points: Vec<_> = x
        .checks
        .iter()
        .map(|c| c.point)
        .chain(x.predictions.iter().copied())
        .collect();
    let m_max = points.iter().map(|p| p.hosts).max().unwrap_or(1).max(2);
    let t_max = x
        .checks
        .iter()
        .flat_map(|c| [c.point.seconds, c.predicted])
        .chain(x.predictions.iter().map(|p| p.seconds))
        .fold(0.0, f64::max)
        .max(1e-3)
        * 1.15;
    let mut chart = ChartBuilder::on(&plot)
        .margin_left(10)
        .margin_right(20)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(1f64..f64::from(m_max) * 1.05, 0f64..t_max)?;
    house_mesh(&mut chart.configure_mesh(), 13)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .x_desc("hosts")
        .y_desc("seconds")
        .draw()?;
    let mut kinds: Vec<(f64, f64)> = points.iter().map(|p| (p.gbit, p.host_cores)).collect();
    kinds.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    kinds.dedup();
    for (gbit, host_cores) in &kinds {
        // As on real hosts, each with its own cores.
        let curve = (10..=m_max * 10).map(|m10| {
            let m = f64::from(m10) / 10.0;
            (m, model.predict_at(m, *gbit, m * host_cores))
        });
        chart.draw_series(LineSeries::new(curve, GRID.mix(1.0).stroke_width(2)))?;
    }
    chart.draw_series(x.checks.iter().map(|c| {
        Circle::new(
            (f64::from(c.point.hosts), c.point.seconds),
            5,
            MEASURED.filled(),
        )
    }))?;
    chart.draw_series(x.checks.iter().map(|c| {
        Cross::new(
            (f64::from(c.point.hosts), c.predicted),
            5,
            LEFT_OUT.stroke_width(2),
        )
    }))?;
    chart.draw_series(x.predictions.iter().map(|p| {
        Circle::new(
            (f64::from(p.hosts), p.seconds),
            5,
            PREDICTED.stroke_width(2),
        )
    }))?;
    legend(
        &top,
        "",
        &[
            (Mark::Dot(MEASURED), "measured".into()),
            (Mark::Cross(LEFT_OUT), "predicted with it left out".into()),
            (Mark::Dot(PREDICTED), "predicted".into()),
            (Mark::Line(GRID), "model, per link speed and host".into()),
        ],
        70,
    )
}
