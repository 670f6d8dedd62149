//! Figures (plain data: panels of series) drawn with `plotters` to PNG and SVG. Text uses
//! the bundled DejaVu Sans, registered once, so that drawing needs no system fonts.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Error, Result};

/// Pixels of every picture (the SVG's user units too).
pub const SIZE: (u32, u32) = (1200, 800);

const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mark {
    Line,
    /// A line with a dot at each point (few points).
    LinePoints,
    /// Bars of this width centred on each x (histograms, rates per pair).
    Bars(f64),
    /// A dashed reference (the diagonal of a reliability diagram, a target level).
    Dashed,
    /// Dots only (data).
    Points,
    /// A shaded region: the points run along its upper edge, then back along its lower.
    Band,
}

/// One labelled series of (x, y) points.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    pub mark: Mark,
}

impl Series {
    pub fn new(label: &str, points: Vec<(f64, f64)>, mark: Mark) -> Self {
        Series {
            label: label.to_string(),
            points,
            mark,
        }
    }
}

/// Where a panel's legend goes (where its data is not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Corner {
    UpperLeft,
    #[default]
    UpperRight,
    LowerLeft,
    LowerRight,
}

/// One chart of a figure.
#[derive(Debug, Clone, Default)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Fixed y range (otherwise from the data, padded).
    pub y_range: Option<(f64, f64)>,
    pub legend: Corner,
    /// The x axis counts (epochs, samples, indices): ticks at whole numbers only.
    pub integer_x: bool,
}

impl Panel {
    pub fn legend_at(mut self, corner: Corner) -> Self {
        self.legend = corner;
        self
    }

    pub fn integer_x(mut self) -> Self {
        self.integer_x = true;
        self
    }

    pub fn y_range(mut self, lo: f64, hi: f64) -> Self {
        self.y_range = Some((lo, hi));
        self
    }
}

/// A tick label without trailing zeros (20, 0.25, 1e-6).
fn tick(v: f64) -> String {
    // A tick that is zero but for rounding (−5.6e-17 between −0.2 and 0.2) reads as 0.
    let v = if v.abs() < 1e-12 { 0.0 } else { v };
    if v != 0.0 && (v.abs() < 1e-3 || v.abs() >= 1e5) {
        return format!("{v:.1e}");
    }
    let s = format!("{v:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

/// A picture: panels side by side (up to three per row).
#[derive(Debug, Clone)]
pub struct Figure {
    /// File stem: `NAME.png`, `NAME.svg`.
    pub name: String,
    pub title: String,
    pub panels: Vec<Panel>,
}

/// Colours of the series in order (colour-blind-safe, Okabe & Ito 2008).
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(120, 120, 120),
    RGBColor(0, 0, 0),
];

/// Writes `figure` as `dir/NAME.png` and `dir/NAME.svg`; returns both paths.
pub fn write(figure: &Figure, dir: &Path) -> Result<Vec<PathBuf>> {
    REGISTER.call_once(|| {
        // The font is compiled in; a failure here is a broken build, reported on use.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
    let png = dir.join(format!("{}.png", figure.name));
    let svg = dir.join(format!("{}.svg", figure.name));
    let fail = |path: &Path, e: String| Error::Checkpoint(format!("{}: {e}", path.display()));
    {
        let root = BitMapBackend::new(&png, SIZE).into_drawing_area();
        draw(&root, figure).map_err(|e| fail(&png, e))?;
        root.present().map_err(|e| fail(&png, e.to_string()))?;
    }
    {
        let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
        draw(&root, figure).map_err(|e| fail(&svg, e))?;
        root.present().map_err(|e| fail(&svg, e.to_string()))?;
    }
    Ok(vec![png, svg])
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    figure: &Figure,
) -> std::result::Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    let body = root
        .titled(&figure.title, ("sans-serif", 30))
        .map_err(err)?;
    let n = figure.panels.len().max(1);
    let cols = n.min(3);
    let rows = n.div_ceil(cols);
    for (area, panel) in body.split_evenly((rows, cols)).iter().zip(&figure.panels) {
        draw_panel(area, panel).map_err(err)?;
    }
    Ok(())
}

/// The data's extent, padded by 5% (a flat series gets a unit-wide band).
fn extent(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = if hi > lo {
        0.05 * (hi - lo)
    } else {
        0.5f64.max(lo.abs() * 0.05)
    };
    (lo - pad, hi + pad)
}

/// The panel's x and y ranges: its points with a margin, a bar's width, and zero under
/// bars; the y range given if any.
fn ranges(panel: &Panel) -> ((f64, f64), (f64, f64)) {
    let half_bar = |s: &Series| match s.mark {
        Mark::Bars(w) => w / 2.0,
        _ => 0.0,
    };
    let x = extent(panel.series.iter().flat_map(|s| {
        let h = half_bar(s);
        s.points.iter().flat_map(move |p| [p.0 - h, p.0 + h])
    }));
    let y = panel.y_range.unwrap_or_else(|| {
        let bars = panel.series.iter().any(|s| matches!(s.mark, Mark::Bars(_)));
        let (lo, hi) = extent(
            panel
                .series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.1)),
        );
        // Bars stand on zero.
        if bars {
            (lo.min(0.0), hi)
        } else {
            (lo, hi)
        }
    });
    (x, y)
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let ((x0, x1), (y0, y1)) = ranges(panel);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)?;
    chart
        .configure_mesh()
        .x_desc(panel.x_label.as_str())
        .y_desc(panel.y_label.as_str())
        .label_style(("sans-serif", 14))
        .x_labels(8)
        .y_labels(8)
        .x_label_formatter(&|v| match panel.integer_x && (v - v.round()).abs() > 1e-9 {
            true => String::new(),
            false => tick(*v),
        })
        .y_label_formatter(&|v| tick(*v))
        .axis_desc_style(("sans-serif", 16))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (k, s) in panel.series.iter().enumerate() {
        let colour = PALETTE[k % PALETTE.len()];
        let legend = |c: RGBColor| {
            move |(x, y): (i32, i32)| Rectangle::new([(x, y - 4), (x + 18, y + 4)], c.filled())
        };
        let drawn = match s.mark {
            Mark::Line => {
                chart.draw_series(LineSeries::new(s.points.clone(), colour.stroke_width(2)))?
            }
            Mark::Dashed => chart.draw_series(DashedLineSeries::new(
                s.points.clone(),
                6,
                4,
                colour.stroke_width(1),
            ))?,
            Mark::LinePoints => {
                chart.draw_series(LineSeries::new(s.points.clone(), colour.stroke_width(2)))?;
                chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 4, colour.filled())))?
            }
            Mark::Points => {
                chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 2, colour.filled())))?
            }
            Mark::Band => chart.draw_series(std::iter::once(Polygon::new(
                s.points.clone(),
                colour.mix(0.25).filled(),
            )))?,
            Mark::Bars(w) => chart.draw_series(s.points.iter().map(|&(x, y)| {
                Rectangle::new(
                    [(x - w / 2.0, 0.0), (x + w / 2.0, y)],
                    colour.mix(0.55).filled(),
                )
            }))?,
        };
        if !s.label.is_empty() {
            drawn.label(s.label.as_str()).legend(legend(colour));
        }
    }
    if panel.series.iter().any(|s| !s.label.is_empty()) {
        chart
            .configure_series_labels()
            .position(match panel.legend {
                Corner::UpperLeft => SeriesLabelPosition::UpperLeft,
                Corner::UpperRight => SeriesLabelPosition::UpperRight,
                Corner::LowerLeft => SeriesLabelPosition::LowerLeft,
                Corner::LowerRight => SeriesLabelPosition::LowerRight,
            })
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn ticks_drop_trailing_zeros() {
        assert_eq!(super::tick(20.0), "20");
        assert_eq!(super::tick(0.25), "0.25");
        assert_eq!(super::tick(-0.0), "0");
        assert_eq!(super::tick(2e-6), "2.0e-6");
    }
}
