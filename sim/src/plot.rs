//! The SVG plot: admitted rate per region over time, with the quota and the bound as rates.

use std::path::Path;

use plotters::prelude::*;

use crate::error::{Result, SimError};
use crate::report::{PlotData, Report};

const SIZE_PIXELS: (u32, u32) = (1200, 600);

/// Writes the plot of the report's first seed to `path`.
pub fn write_svg(report: &Report, path: &Path) -> Result<()> {
    let plot = report
        .plot
        .as_ref()
        .ok_or_else(|| SimError::Plot("the report has no run to plot".to_string()))?;
    let svg = render_svg(plot)?;
    std::fs::write(path, svg).map_err(|source| SimError::Write {
        path: path.to_path_buf(),
        source,
    })
}

fn plot_error(e: impl std::fmt::Display) -> SimError {
    SimError::Plot(e.to_string())
}

/// The plot as SVG text.
pub fn render_svg(plot: &PlotData) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE_PIXELS).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        draw(&root, plot)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

fn draw(root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>, plot: &PlotData) -> Result<()> {
    let bucket_secs = plot.bucket.as_secs_f64();
    let buckets = plot.admitted_per_sec.first().map_or(0, Vec::len);
    let x_max = (buckets as f64 * bucket_secs).max(bucket_secs);
    let y_max = plot
        .admitted_per_sec
        .iter()
        .flatten()
        .copied()
        .chain(plot.bound_per_sec.iter().flatten().copied())
        .fold(plot.quota_per_sec, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(root)
        .caption(&plot.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max.max(1.0))
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("seconds since start")
        .y_desc(format!("{} units/s", plot.limit))
        .draw()
        .map_err(plot_error)?;
    let x = |b: usize| b as f64 * bucket_secs;
    for (i, (region, rates)) in plot.regions.iter().zip(&plot.admitted_per_sec).enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                rates.iter().enumerate().map(|(b, r)| (x(b), *r)),
                color.stroke_width(1),
            ))
            .map_err(plot_error)?
            .label(format!("admitted, {region}"))
            .legend(move |(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 20, ly)], color));
    }
    chart
        .draw_series(LineSeries::new(
            [(0.0, plot.quota_per_sec), (x_max, plot.quota_per_sec)],
            BLACK.stroke_width(2),
        ))
        .map_err(plot_error)?
        .label("quota (L / W)")
        .legend(|(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 20, ly)], BLACK));
    draw_bound(&mut chart, plot, &x)?;
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.85))
        .draw()
        .map_err(plot_error)
}

type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// The bound where one was reported: per stretch of buckets that have it, a line and the band
/// from the quota up to it, as the dashboard draws a window (docs/dashboard.md).
fn draw_bound(chart: &mut Chart<'_, '_>, plot: &PlotData, x: &dyn Fn(usize) -> f64) -> Result<()> {
    let red = RED.stroke_width(2);
    let mut labelled = false;
    let mut b = 0;
    while b < plot.bound_per_sec.len() {
        if plot.bound_per_sec[b].is_none() {
            b += 1;
            continue;
        }
        let start = b;
        while b < plot.bound_per_sec.len() && plot.bound_per_sec[b].is_some() {
            b += 1;
        }
        let points: Vec<(f64, f64)> = (start..b)
            .filter_map(|i| plot.bound_per_sec[i].map(|v| (x(i), v)))
            .collect();
        let floor = points.iter().rev().map(|(px, _)| (*px, plot.quota_per_sec));
        let band = Polygon::new(
            points.iter().copied().chain(floor).collect::<Vec<_>>(),
            RED.mix(0.12).filled(),
        );
        chart
            .draw_series(std::iter::once(band))
            .map_err(plot_error)?;
        let series = chart
            .draw_series(LineSeries::new(points, red))
            .map_err(plot_error)?;
        if !labelled {
            series
                .label("quota + bound")
                .legend(|(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 20, ly)], RED));
            labelled = true;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_plot_names_every_region_the_quota_and_the_bound() {
        let plot = PlotData {
            title: "t".into(),
            limit: "api/tenant".into(),
            bucket: Duration::from_millis(500),
            regions: vec!["us-east".into(), "eu-west".into()],
            admitted_per_sec: vec![vec![10.0, 12.0, 9.0], vec![5.0, 6.0, 4.0]],
            quota_per_sec: 20.0,
            bound_per_sec: vec![None, Some(25.0), Some(25.0)],
        };
        let svg = render_svg(&plot).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("<polygon"), "the bound's band");
        for label in [
            "admitted, us-east",
            "admitted, eu-west",
            "quota (L / W)",
            "quota + bound",
        ] {
            assert!(svg.contains(label), "{label} missing");
        }
    }
}
