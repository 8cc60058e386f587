//! PNG charts with plotters' bitmap backend; the font (DejaVu Sans) is read
//! at run time, so no system font library is needed.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Context, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::{DbKind, Key, Report};
use crate::runs::BacklogRun;

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

fn register_font() -> anyhow::Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let bytes = std::fs::read(FONT).map_err(|e| format!("{FONT}: {e}"))?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{FONT} is not a usable font"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// Picks one quantile out of a latency row.
type Quantile = fn(&crate::runs::LatencyRow) -> f64;

/// One line of a chart: label, colour, points (x index or value, y).
struct Line {
    label: String,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("{e}")
}

/// A white canvas of `size` pixels for the PNG at `path`, the font
/// registered.
fn canvas(path: &Path, size: (u32, u32)) -> anyhow::Result<Area<'_>> {
    register_font()?;
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    Ok(root)
}

/// Writes the canvas to its PNG at `path`.
fn save(root: &Area<'_>, path: &Path) -> anyhow::Result<()> {
    root.present()
        .map_err(err)
        .with_context(|| format!("write {}", path.display()))
}

/// A chart on `area` in the common style (17 pt caption, 12 px margin),
/// with `x` and `y` pixels for the axes' labels.
fn chart_on<'a, 'b>(
    area: &'a Area<'b>,
    caption: &str,
    (x, y): (u32, u32),
) -> ChartBuilder<'a, 'a, BitMapBackend<'b>> {
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(caption, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(x)
        .y_label_area_size(y);
    builder
}

/// Draws `points` as a 2 px line in `color`, listed as `label` in the
/// chart's legend.
fn draw_line<'a, CT>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, CT>,
    points: impl IntoIterator<Item = (f64, f64)>,
    color: RGBColor,
    label: impl Into<String>,
) -> anyhow::Result<()>
where
    CT: CoordTranslate<From = (f64, f64)>,
{
    chart
        .draw_series(LineSeries::new(points, color.stroke_width(2)))
        .map_err(err)?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    Ok(())
}

/// The legend of the labelled lines, at `position`, on a light box.
fn draw_legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, CT>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

/// Points at x = the index of each of `ticks` (a categorical axis), where
/// `y` has a value for that tick.
fn indexed(ticks: &[u16], y: impl Fn(u16) -> Option<f64>) -> Vec<(f64, f64)> {
    ticks
        .iter()
        .enumerate()
        .filter_map(|(i, &t)| Some((i as f64, y(t)?)))
        .collect()
}

/// Labels only 1, 2 and 5 × 10^k on a log axis (the others stay gridlines).
fn log_label(y: &f64) -> String {
    if *y <= 0.0 {
        return String::new();
    }
    let mantissa = y / 10f64.powf(y.log10().floor());
    if [1.0, 2.0, 5.0, 10.0]
        .iter()
        .any(|m| (mantissa - m).abs() < 0.02)
    {
        if *y >= 1.0 {
            format!("{y:.0}")
        } else {
            format!("{y:.1}")
        }
    } else {
        String::new()
    }
}

/// A panel with a log y axis; x is either categorical (`ticks` given:
/// x = index) or numeric.
fn panel(
    area: &Area<'_>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    ticks: Option<&[String]>,
    lines: &[Line],
    legend_at: SeriesLabelPosition,
) -> anyhow::Result<()> {
    let ys: Vec<f64> = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .filter(|y| *y > 0.0)
        .collect();
    let xs: Vec<f64> = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .collect();
    let (ymin, ymax) = match (
        ys.iter().copied().reduce(f64::min),
        ys.iter().copied().reduce(f64::max),
    ) {
        (Some(lo), Some(hi)) => (lo / 1.6, hi * 1.6),
        _ => (1.0, 10.0),
    };
    let (xmin, xmax) = match ticks {
        Some(t) => (-0.3, t.len() as f64 - 0.7),
        None => {
            let hi = xs.iter().copied().reduce(f64::max).unwrap_or(1.0);
            (0.0, hi * 1.08)
        }
    };
    let mut chart = chart_on(area, title, (42, 62))
        .build_cartesian_2d(xmin..xmax, (ymin..ymax).log_scale())
        .map_err(err)?;
    let tick_label = |x: &f64| -> String {
        match ticks {
            Some(t) => {
                let i = x.round();
                if (x - i).abs() < 0.01 && i >= 0.0 {
                    t.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            }
            None => format!("{x:.0}"),
        }
    };
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&tick_label)
        .y_label_formatter(&log_label)
        .label_style(("sans-serif", 13));
    if let Some(t) = ticks {
        mesh.x_labels(t.len() * 4 + 1);
    }
    mesh.draw().map_err(err)?;
    for line in lines.iter().filter(|l| !l.points.is_empty()) {
        let color = line.color;
        draw_line(
            &mut chart,
            line.points.iter().copied(),
            color,
            line.label.as_str(),
        )?;
        chart
            .draw_series(
                line.points
                    .iter()
                    .map(|p| Circle::new(*p, 4, color.filled())),
            )
            .map_err(err)?;
    }
    draw_legend(&mut chart, legend_at)
}

const WORKER: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const BROKER: RGBColor = RGBColor(0xd6, 0x27, 0x28);
const DB: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
const DB_BATCH: RGBColor = RGBColor(0x94, 0x67, 0xbd);
const ORANGE: RGBColor = RGBColor(0xff, 0x7f, 0x0e);
const GREY: RGBColor = RGBColor(0x7f, 0x7f, 0x7f);

/// Throughput vs shards, throughput vs prefetch, latency vs load.
pub fn draw(report: &Report, path: &Path) -> anyhow::Result<()> {
    let p = &report.plan;
    let root = canvas(path, (1650, 600))?;
    let m = &report.machine;
    let title = format!(
        "urutan e2e ({} mode, {} msgs/drain, medians of {}) — {} cores, RabbitMQ {}, PostgreSQL {}, commit {}",
        p.mode, p.messages, p.rounds, m.nproc, m.rabbitmq, m.postgresql, m.git_commit
    );
    let (head, body) = root.split_vertically(36);
    head.draw(&Text::new(title, (12, 10), ("sans-serif", 16)))
        .map_err(err)?;
    let panels = body.split_evenly((1, 3));

    // The measured rate of `key(tick)` at each tick.
    let rates = |ticks: &[u16], key: fn(u16) -> Key| indexed(ticks, |t| report.rate(key(t)));
    let shard_ticks: Vec<String> = p.shard_counts.iter().map(u16::to_string).collect();
    panel(
        &panels[0],
        "Throughput vs shards (PREFETCH=1)",
        "shards",
        "msg/s",
        Some(&shard_ticks),
        &[
            Line {
                label: "worker".into(),
                color: WORKER,
                points: rates(&p.shard_counts, |s| Key::Worker {
                    shards: s,
                    prefetch: 1,
                }),
            },
            Line {
                label: "broker only (ack-only)".into(),
                color: BROKER,
                points: rates(&p.shard_counts, |s| Key::BrokerOnly {
                    shards: s,
                    prefetch: 1,
                }),
            },
            Line {
                label: "database only, 1 msg/tx".into(),
                color: DB,
                points: rates(&p.shard_counts, |s| Key::DbOnly {
                    tasks: s,
                    batch: 1,
                    mode: DbKind::PerMessage,
                }),
            },
        ],
        SeriesLabelPosition::LowerRight,
    )?;

    let mut prefetches = vec![1u16];
    prefetches.extend(&p.prefetches);
    let pf_ticks: Vec<String> = prefetches.iter().map(u16::to_string).collect();
    panel(
        &panels[1],
        "Throughput vs batch size (4 shards; PREFETCH = batch unless pipelined)",
        "messages per transaction (BATCH_MAX)",
        "msg/s",
        Some(&pf_ticks),
        &[
            Line {
                label: "worker".into(),
                color: WORKER,
                points: rates(&prefetches, |pf| Key::Worker {
                    shards: 4,
                    prefetch: pf,
                }),
            },
            Line {
                label: "broker only (multiple-ack)".into(),
                color: BROKER,
                points: rates(&prefetches, |pf| Key::BrokerOnly {
                    shards: 4,
                    prefetch: pf,
                }),
            },
            Line {
                label: "database only, PREFETCH msgs/tx".into(),
                color: DB,
                points: indexed(&prefetches, |pf| report.db_ceiling(4, pf)),
            },
            Line {
                label: "worker, DB via Unix socket".into(),
                color: ORANGE,
                points: rates(&prefetches, |pf| Key::WorkerUnix {
                    shards: 4,
                    prefetch: pf,
                }),
            },
            Line {
                label: "worker, pipelined (PREFETCH = 2 × x, BATCH_MAX = x)".into(),
                color: GREY,
                points: rates(&prefetches, |pf| Key::WorkerPipelinedBatch {
                    shards: 4,
                    batch: pf,
                }),
            },
            Line {
                label: "database only, via Unix socket".into(),
                color: DB_BATCH,
                points: rates(&prefetches, |pf| Key::DbOnlyUnix {
                    tasks: 4,
                    batch: usize::from(pf),
                }),
            },
        ],
        SeriesLabelPosition::LowerRight,
    )?;

    let colors = [WORKER, BROKER, DB, DB_BATCH, ORANGE, GREY];
    let mut lines = Vec::new();
    for set in &report.latency {
        let quantiles: [(&str, Quantile); 3] = [
            ("p50", |l| l.p50_ms),
            ("p99", |l| l.p99_ms),
            ("p99.9", |l| l.p999_ms),
        ];
        for (name, f) in quantiles {
            lines.push(Line {
                label: format!("PREFETCH={} {name}", set.prefetch),
                color: colors[lines.len() % colors.len()],
                points: set.rows.iter().map(|l| (l.load * 100.0, f(l))).collect(),
            });
        }
    }
    panel(
        &panels[2],
        &format!("Latency vs load ({} shards)", p.latency_shards),
        "offered load, % of the configuration's max",
        "publish → apply, ms",
        None,
        &lines,
        SeriesLabelPosition::UpperLeft,
    )?;
    save(&root, path)
}

/// RSS against messages applied, and progress over time, of each long
/// backlog drain (one line per drain).
pub fn draw_backlog(drains: &[BacklogRun], path: &Path) -> anyhow::Result<()> {
    let root = canvas(path, (1300, 520))?;
    let panels = root.split_evenly((1, 2));
    let samples = || drains.iter().flat_map(|d| d.samples.iter());
    let n_max = samples().map(|s| s.applied).max().unwrap_or(1).max(1) as f64;
    let t_max = samples().map(|s| s.t_s).fold(1.0, f64::max);
    let rss_max = samples().map(|s| s.hwm_mib).fold(1.0, f64::max) * 1.2;
    let label = |d: &BacklogRun| {
        d.scrape_every_s
            .map_or("/metrics never scraped".to_owned(), |e| {
                format!("/metrics scraped every {e:.0} s")
            })
    };
    let colors = [BROKER, WORKER, DB, ORANGE];
    let (shards, prefetch) = drains.first().map_or((0, 0), |d| (d.shards, d.prefetch));
    let title = format!("Worker RSS while draining ({shards} shards, PREFETCH={prefetch})");
    let mut chart = chart_on(&panels[0], &title, (40, 60))
        .build_cartesian_2d(0.0..n_max * 1.02, 0.0..rss_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("messages applied")
        .y_desc("VmRSS, MiB")
        .x_label_formatter(&|x| format!("{:.0}k", x / 1000.0))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    for (i, d) in drains.iter().enumerate() {
        let color = colors[i % colors.len()];
        let points = d.samples.iter().filter(|s| s.applied > 0);
        draw_line(
            &mut chart,
            points.map(|s| (s.applied as f64, s.rss_mib)),
            color,
            label(d),
        )?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    let mut progress = chart_on(&panels[1], "Messages applied over time", (40, 70))
        .build_cartesian_2d(0.0..t_max * 1.02, 0.0..n_max * 1.05)
        .map_err(err)?;
    progress
        .configure_mesh()
        .x_desc("seconds since the worker started")
        .y_desc("applied")
        .label_style(("sans-serif", 13))
        .y_label_formatter(&|y| format!("{:.0}k", y / 1000.0))
        .draw()
        .map_err(err)?;
    for (i, d) in drains.iter().enumerate() {
        let color = colors[i % colors.len()];
        progress
            .draw_series(LineSeries::new(
                d.samples.iter().map(|s| (s.t_s, s.applied as f64)),
                color.stroke_width(2),
            ))
            .map_err(err)?;
    }
    save(&root, path)
}

/// The sustained-load curves: p99 and p50 against the offered rate, one
/// line per configuration, the knees' bounds as grey lines.
pub fn draw_sustained(curves: &[crate::sustained::Curve], path: &Path) -> anyhow::Result<()> {
    let root = canvas(path, (1400, 560))?;
    let (left, right) = root.split_horizontally(700);
    let colors = [BROKER, WORKER, ORANGE, DB, DB_BATCH, GREY];
    for (area, title, pick) in [
        (&left, "p99 publish → commit vs offered load", 0),
        (&right, "p50 publish → commit vs offered load", 1),
    ] {
        let mut lines: Vec<Line> = curves
            .iter()
            .zip(colors.iter().cycle())
            .map(|(c, color)| Line {
                label: c.label.clone(),
                color: *color,
                points: c
                    .steps
                    .iter()
                    .map(|s| (s.offered, if pick == 0 { s.p99_ms } else { s.p50_ms }))
                    .filter(|p| p.1.is_finite())
                    .collect(),
            })
            .collect();
        if pick == 0 {
            let hi = curves
                .iter()
                .flat_map(|c| c.steps.iter().map(|s| s.offered))
                .reduce(f64::max)
                .unwrap_or(1.0);
            for bound in crate::sustained::KNEES_MS {
                lines.push(Line {
                    label: format!("{bound:.0} ms"),
                    color: GREY,
                    points: vec![(0.0, bound), (hi, bound)],
                });
            }
        }
        panel(
            area,
            title,
            "offered load (msg/s)",
            "latency (ms, log)",
            None,
            &lines,
            SeriesLabelPosition::UpperLeft,
        )?;
    }
    root.present().map_err(err)?;
    Ok(())
}
