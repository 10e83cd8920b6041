//! The plots of a run, as SVG: rates against worker counts, RSS against live processes.

use std::error::Error;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

/// What the plots are drawn from, gathered while the benchmarks run.
#[derive(Default)]
pub struct Plots {
    /// Workers, wasmproc's lifecycles/s and raw wasmtime's.
    pub lifecycles: Vec<(usize, f64, f64)>,
    /// Workers, wasmproc's steps/s and raw wasmtime's.
    pub steps: Vec<(usize, f64, f64)>,
    /// A series a run of the idle measurement: its label and (live processes, RSS KiB
    /// over the baseline) samples.
    pub rss: Vec<(String, Vec<(u64, f64)>)>,
}

const SIZE: (u32, u32) = (720, 440);
const COLOURS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
];

/// Writes every plot that has data into `dir`; returns the files written.
pub fn write(plots: &Plots, dir: &Path) -> Result<Vec<PathBuf>, Box<dyn Error>> {
    let mut written = Vec::new();
    let by_workers = [
        ("lifecycles-by-workers.svg", "Lifecycles per second by worker count", "lifecycles/s", &plots.lifecycles),
        ("steps-by-workers.svg", "Wasm steps per second by worker count", "steps/s", &plots.steps),
    ];
    for (file, caption, unit, points) in by_workers {
        if points.is_empty() {
            continue;
        }
        let path = dir.join(file);
        let series = [
            ("wasmproc".to_owned(), points.iter().map(|&(w, ours, _)| (w as f64, ours / 1e3)).collect()),
            ("raw wasmtime".to_owned(), points.iter().map(|&(w, _, raw)| (w as f64, raw / 1e3)).collect()),
        ];
        let workers = points.iter().map(|p| p.0).max().unwrap_or(1) as f64;
        lines(&path, caption, ("workers", &format!("thousand {unit}")), (0.5, workers + 0.5), &series)?;
        written.push(path);
    }
    let rss: Vec<(String, Vec<(f64, f64)>)> = plots
        .rss
        .iter()
        .filter(|(_, samples)| !samples.is_empty())
        .map(|(label, samples)| {
            (label.clone(), samples.iter().map(|&(live, kib)| (live as f64 / 1e3, kib / 1024.0)).collect())
        })
        .collect();
    if !rss.is_empty() {
        let path = dir.join("rss-by-processes.svg");
        let most = rss.iter().flat_map(|(_, s)| s.iter().map(|p| p.0)).fold(0.0, f64::max);
        let caption = "RSS of idle processes (over the empty host)";
        lines(&path, caption, ("thousand live processes", "MiB"), (0.0, most * 1.05), &rss)?;
        written.push(path);
    }
    Ok(written)
}

/// A line chart with a point at each sample, one colour a series, y from 0.
fn lines(
    path: &Path,
    caption: &str,
    (x_desc, y_desc): (&str, &str),
    (x_from, x_to): (f64, f64),
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let top = series.iter().flat_map(|(_, s)| s.iter().map(|p| p.1)).fold(0.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(x_from..x_to, 0.0..(top * 1.15).max(1.0))?;
    // Worker counts are whole: a label between two would be a count that was not run.
    let whole = |x: &f64| if (x - x.round()).abs() < 1e-9 { format!("{x:.0}") } else { String::new() };
    let y_label = |y: &f64| format!("{y:.0}");
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&whole)
        .y_label_formatter(&y_label)
        .draw()?;
    for (i, (label, points)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let mut points = points.clone();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(points.iter().copied(), colour.stroke_width(2)))?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
