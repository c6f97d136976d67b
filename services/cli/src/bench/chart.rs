//! throughput.svg: accepted orders per second per strategy, the hot SKU's
//! bar beside the many SKUs' bar.

use crate::CliError;
use anyhow::Context;
use plotters::coord::ranged1d::SegmentedCoord;
use plotters::coord::types::{RangedCoordf64, RangedCoordu32};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One strategy's pair of bars.
pub struct Bars {
    pub label: String,
    pub hot: f64,
    pub many: f64,
}

const HOT: RGBColor = RGBColor(214, 69, 65);
const MANY: RGBColor = RGBColor(52, 120, 198);
/// Pixels between one strategy's pair of bars and the next pair.
const OUTER_MARGIN: u32 = 12;

/// The chart as SVG text.
pub fn throughput_svg(bars: &[Bars], many_label: &str) -> Result<String, CliError> {
    let mut svg = String::new();
    draw(&mut svg, bars, many_label).context("drawing the chart")?;
    Ok(svg)
}

fn draw(svg: &mut String, bars: &[Bars], many_label: &str) -> anyhow::Result<()> {
    let root = SVGBackend::with_string(svg, (960, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = u32::try_from(bars.len().max(1))?;
    let top = bars
        .iter()
        .flat_map(|b| [b.hot, b.many])
        .fold(1.0_f64, f64::max)
        * 1.3;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Accepted orders per second, by strategy",
            ("sans-serif", 24),
        )
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(80)
        // An integer range includes its end: n segments are 0..=n-1.
        .build_cartesian_2d((0u32..n - 1).into_segmented(), 0f64..top)?;
    draw_mesh(&mut chart, bars)?;
    // From a segment's centre to the middle of a bar (less its outer margin), in pixels.
    let quarter = i32::try_from(chart.plotting_area().dim_in_pixel().0 / n / 4)?;
    let to_middle = quarter - i32::try_from(OUTER_MARGIN / 2)?;
    let series = [
        ("hot SKU", HOT, -to_middle, true),
        (many_label, MANY, to_middle, false),
    ];
    for (label, color, shift, left) in series {
        draw_series(&mut chart, bars, label, color, shift, left)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    root.present()?;
    Ok(())
}

/// The chart's drawing: one segment per strategy along x, orders/s up y.
type Chart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<SegmentedCoord<RangedCoordu32>, RangedCoordf64>>;

/// The axes: each strategy's label under its segment, orders/s up the side.
fn draw_mesh(chart: &mut Chart<'_, '_>, bars: &[Bars]) -> anyhow::Result<()> {
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(TRANSPARENT)
        .x_labels(bars.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => bars
                .get(*i as usize)
                .map(|b| b.label.clone())
                .unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("orders/s")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 15))
        .draw()?;
    Ok(())
}

/// One series: each strategy's bar in the `left` or right half of its
/// segment, its value printed above it (`shift` pixels from the centre),
/// and its legend entry.
fn draw_series(
    chart: &mut Chart<'_, '_>,
    bars: &[Bars],
    label: &str,
    color: RGBColor,
    shift: i32,
    left: bool,
) -> anyhow::Result<()> {
    let value = |b: &Bars| if left { b.hot } else { b.many };
    chart
        .draw_series(bars.iter().zip(0u32..).map(|(b, i)| {
            let (from, to) = if left {
                (SegmentValue::Exact(i), SegmentValue::CenterOf(i))
            } else {
                (SegmentValue::CenterOf(i), SegmentValue::Exact(i + 1))
            };
            let mut bar = Rectangle::new([(from, 0.0), (to, value(b))], color.filled());
            if left {
                bar.set_margin(0, 0, OUTER_MARGIN, 1);
            } else {
                bar.set_margin(0, 0, 1, OUTER_MARGIN);
            }
            bar
        }))?
        .label(label)
        .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
    chart.draw_series(bars.iter().zip(0u32..).map(|(b, i)| {
        EmptyElement::at((SegmentValue::CenterOf(i), value(b)))
            + Text::new(
                format!("{:.0}", value(b)),
                (shift, -16),
                ("sans-serif", 13)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Top)),
            )
    }))?;
    Ok(())
}
