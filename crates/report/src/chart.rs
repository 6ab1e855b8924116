//! What every chart shares: drawing one into an inline SVG string, the legend row, the time
//! axis, fonts and colours.

use crate::page::escape;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

pub type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
pub type Drawn = Result<(), Box<dyn std::error::Error>>;

/// The browser lays the text out; plotters only estimates its size.
pub const FONT: &str = "sans-serif";

/// Text of `px` CSS pixels (plotters' SVG backend writes 1/1.24 of the size it is given).
pub fn font(px: u32) -> TextStyle<'static> {
    (FONT, f64::from(px) * 1.24)
        .into_font()
        .color(&RGBColor(0x33, 0x33, 0x33))
}

/// A tick value without the trailing zeros plotters would print (`20`, not `20.0`).
pub fn tick(v: &f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

pub const GRID: RGBColor = RGBColor(0xe4, 0xe4, 0xe4);
pub const AXIS: RGBColor = RGBColor(0x44, 0x44, 0x44);

/// Every chart's axes and grid: light lines off, bold ones in `GRID`, labels of `px` pixels
/// and axis descriptions one larger.
pub fn house_mesh<'m, 'a, 'b, X, Y, DB>(
    mesh: &'m mut plotters::chart::MeshStyle<'a, 'b, X, Y, DB>,
    px: u32,
) -> &'m mut plotters::chart::MeshStyle<'a, 'b, X, Y, DB>
where
    X: plotters::coord::ranged1d::Ranged,
    Y: plotters::coord::ranged1d::Ranged,
    DB: DrawingBackend,
{
    mesh.light_line_style(WHITE)
        .bold_line_style(GRID)
        .axis_style(AXIS)
        .label_style(font(px))
        .axis_desc_style(font(px + 1))
}

/// A `width` × `height` chart that `draw` makes, as an inline `<svg>`; if plotters refuses it,
/// a note saying why, so one bad chart does not cost the page.
pub fn svg(width: u32, height: u32, draw: impl FnOnce(&Area<'_>) -> Drawn) -> String {
    let mut out = String::new();
    let drawn = {
        let root = SVGBackend::with_string(&mut out, (width, height)).into_drawing_area();
        root.fill(&WHITE)
            .map_err(Into::into)
            .and_then(|()| draw(&root))
            .and_then(|()| root.present().map_err(Into::into))
    };
    match drawn {
        Ok(()) => out,
        Err(e) => format!(
            r#"<p class="note warn">chart not drawn: {}</p>"#,
            escape(&e.to_string())
        ),
    }
}

/// How a legend entry is marked.
#[derive(Debug, Clone, Copy)]
pub enum Mark {
    Dot(RGBColor),
    Cross(RGBColor),
    Line(RGBColor),
    Dashed(RGBColor),
}

/// A legend on one row across `area`, from its left edge, vertically centred: a title, then
/// each mark followed by its label.
pub fn legend(area: &Area<'_>, title: &str, items: &[(Mark, String)], left: i32) -> Drawn {
    let text = font(13);
    let y = area.dim_in_pixel().1 as i32 / 2;
    let mut x = left;
    if !title.is_empty() {
        area.draw(&Text::new(
            title.to_string(),
            (x, y),
            text.clone().pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
        x += area.estimate_text_size(title, &text)?.0 as i32 + 14;
    }
    for (mark, label) in items {
        match *mark {
            Mark::Dot(c) => area.draw(&Circle::new((x + 6, y), 4, c.filled()))?,
            Mark::Cross(c) => area.draw(&Cross::new((x + 6, y), 4, c.stroke_width(2)))?,
            Mark::Line(c) => area.draw(&PathElement::new(
                vec![(x, y), (x + 24, y)],
                c.stroke_width(3),
            ))?,
            Mark::Dashed(c) => {
                for dx in [0, 10, 20] {
                    area.draw(&PathElement::new(
                        vec![(x + dx, y), (x + dx + 6, y)],
                        c.stroke_width(3),
                    ))?;
                }
            }
        }
        let mark_w = match mark {
            Mark::Dot(_) | Mark::Cross(_) => 14,
            _ => 30,
        };
        area.draw(&Text::new(
            label.clone(),
            (x + mark_w, y),
            text.clone().pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
        x += mark_w + area.estimate_text_size(label, &text)?.0 as i32 + 22;
    }
    Ok(())
}

/// Time since the trace began, in a unit that suits its span; the model's charts share one so
/// that they line up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeAxis {
    pub unit: &'static str,
    /// Nanoseconds in one unit.
    pub ns: f64,
    /// The axis' end, in units (never zero).
    pub max: f64,
}

impl TimeAxis {
    pub fn new(span_ns: u64) -> Self {
        let span = span_ns as f64;
        let (unit, ns) = if span >= 2.0 * 3600e9 {
            ("min", 60e9)
        } else if span >= 2e9 {
            ("s", 1e9)
        } else if span >= 2e6 {
            ("ms", 1e6)
        } else {
            ("µs", 1e3)
        };
        let max = if span > 0.0 { span / ns } else { 1.0 };
        Self { unit, ns, max }
    }

    pub fn at(&self, t_ns: u64) -> f64 {
        t_ns as f64 / self.ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_lose_trailing_zeros() {
        assert_eq!(tick(&20.0), "20");
        assert_eq!(tick(&0.30000000000000004), "0.3");
        assert_eq!(tick(&2.5), "2.5");
        assert_eq!(tick(&-0.0000001), "0");
    }

    #[test]
    fn time_axis_picks_a_unit() {
        assert_eq!(TimeAxis::new(0).unit, "µs");
        assert_eq!(TimeAxis::new(0).max, 1.0);
        let ms = TimeAxis::new(5_000_000);
        assert_eq!((ms.unit, ms.max), ("ms", 5.0));
        assert_eq!(ms.at(2_500_000), 2.5);
        assert_eq!(TimeAxis::new(30_000_000_000).unit, "s");
        assert_eq!(TimeAxis::new(3 * 3600 * 1_000_000_000).unit, "min");
    }

    #[test]
    fn a_chart_that_cannot_be_drawn_becomes_a_note() {
        let page = svg(100, 100, |_| Err("no room".into()));
        assert!(page.contains("chart not drawn: no room"), "{page}");
        let drawn = svg(100, 100, |_| Ok(()));
        assert!(drawn.starts_with("<svg") && drawn.trim_end().ends_with("</svg>"));
    }
}
