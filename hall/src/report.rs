//! The run's report: four SVG charts of the trace and a Markdown page.
//!
//! The charts are drawn with `plotters`' SVG backend and no font library:
//! text goes into the SVG as `<text>` elements (sans-serif) that the viewer
//! renders, and plotters sizes it with its built-in estimate. Nothing links
//! fontconfig or freetype, and no font file is read.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::trace::{running_pue, TraceRow};

/// The GPUs' maximum operating temperature, °C.
pub const MAX_OPERATING_C: f64 = 87.0;
/// The GPUs' hardware slowdown temperature, °C.
pub const HW_SLOWDOWN_C: f64 = 89.0;

/// The charts, in the order they are written and linked.
pub const CHARTS: [&str; 4] = ["temperatures.svg", "power.svg", "pue.svg", "pump_caps.svg"];
/// The report page.
pub const REPORT: &str = "report.md";

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 520;
const LEGEND_W: u32 = 230;
const FONT: &str = "sans-serif";

const BLUE_: RGBColor = RGBColor(31, 119, 180);
const ORANGE: RGBColor = RGBColor(255, 127, 14);
const GREEN_: RGBColor = RGBColor(44, 160, 44);
const RED_: RGBColor = RGBColor(214, 39, 40);
const PURPLE: RGBColor = RGBColor(148, 103, 189);
const GREY: RGBColor = RGBColor(110, 110, 110);
const DARK_RED: RGBColor = RGBColor(140, 0, 0);

/// Why the report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// There is nothing to plot.
    #[error("the trace has no rows")]
    NoRows,
    /// The summary is not a JSON object.
    #[error("the summary is not a JSON object")]
    SummaryNotObject,
    /// A file or the folder could not be written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// plotters failed to draw a chart.
    #[error("{}: drawing failed: {message}", path.display())]
    Draw {
        /// The chart's file.
        path: PathBuf,
        /// plotters' error.
        message: String,
    },
}

/// Writes the report of a run into `dir` (made if missing): the four charts
/// of [`CHARTS`] and [`REPORT`], which has `title`, the summary's figures
/// as a table when a summary (the JSON object `cooling-ctrl simulate`
/// prints) is given, and links to the charts. Returns the files written,
/// charts first.
pub fn write_report(
    dir: &Path,
    title: &str,
    rows: &[TraceRow],
    summary: Option<&serde_json::Value>,
) -> Result<Vec<PathBuf>, ReportError> {
    if rows.is_empty() {
        return Err(ReportError::NoRows);
    }
    let summary = match summary {
        None => None,
        Some(serde_json::Value::Object(m)) => Some(m),
        Some(_) => return Err(ReportError::SummaryNotObject),
    };
    fs::create_dir_all(dir).map_err(|source| ReportError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Vec::new();
    let charts: [DrawFn; 4] = [temperatures, power, pue, pump_caps];
    for (name, draw) in CHARTS.iter().zip(charts) {
        let path = dir.join(name);
        draw(&path, title, rows).map_err(|message| ReportError::Draw {
            path: path.clone(),
            message,
        })?;
        written.push(path);
    }
    let path = dir.join(REPORT);
    fs::write(&path, markdown(title, rows, summary)).map_err(|source| ReportError::Io {
        path: path.clone(),
        source,
    })?;
    written.push(path);
    Ok(written)
}

/// Draws one chart of the trace into a file.
type DrawFn = fn(&Path, &str, &[TraceRow]) -> Result<(), String>;

/// One line of a chart.
struct Series {
    label: String,
    color: RGBColor,
    dashed: bool,
    /// On the right-hand axis.
    secondary: bool,
    points: Vec<(f64, f64)>,
}

impl Series {
    fn new(label: &str, color: RGBColor, points: Vec<(f64, f64)>) -> Self {
        Series {
            label: label.to_string(),
            color,
            dashed: false,
            secondary: false,
            points,
        }
    }

    fn dashed(mut self) -> Self {
        self.dashed = true;
        self
    }

    fn secondary(mut self) -> Self {
        self.secondary = true;
        self
    }
}

/// What a chart shows.
struct Chart<'a> {
    caption: String,
    y_desc: &'a str,
    y_range: (f64, f64),
    /// Description and top of the right-hand axis (counts, from 0).
    y2: Option<(&'a str, f64)>,
    series: Vec<Series>,
}

fn minutes(rows: &[TraceRow]) -> (f64, f64) {
    let a = rows[0].t_s / 60.0;
    let b = rows[rows.len() - 1].t_s / 60.0;
    if b > a {
        (a, b)
    } else {
        (a, a + 1.0)
    }
}

fn points(rows: &[TraceRow], f: impl Fn(&TraceRow) -> f64) -> Vec<(f64, f64)> {
    rows.iter().map(|r| (r.t_s / 60.0, f(r))).collect()
}

/// The hottest GPU of the rows that have one.
fn hottest_points(rows: &[TraceRow]) -> Vec<(f64, f64)> {
    rows.iter()
        .filter_map(|r| Some((r.t_s / 60.0, r.max_gpu_c?)))
        .collect()
}

/// A count drawn as steps: it holds until the next row.
fn steps(rows: &[TraceRow], f: impl Fn(&TraceRow) -> f64) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(rows.len() * 2);
    for (i, r) in rows.iter().enumerate() {
        if i > 0 {
            out.push((r.t_s / 60.0, f(&rows[i - 1])));
        }
        out.push((r.t_s / 60.0, f(r)));
    }
    out
}

/// The range of the values with a margin; never empty.
fn padded(values: impl Iterator<Item = f64>, min_span: f64) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    let mid = (lo + hi) / 2.0;
    let half = ((hi - lo) / 2.0).max(min_span / 2.0) * 1.08;
    (mid - half, mid + half)
}

fn temperatures(path: &Path, title: &str, rows: &[TraceRow]) -> Result<(), String> {
    let (x0, x1) = minutes(rows);
    let all = rows
        .iter()
        .flat_map(|r| {
            [
                r.ambient_c,
                r.setpoint_c,
                r.supply_c,
                r.return_c,
                r.max_gpu_c.unwrap_or(f64::NAN),
            ]
        })
        .filter(|v| v.is_finite());
    let (lo, hi) = padded(all.chain([HW_SLOWDOWN_C]), 10.0);
    let line = |v: f64| vec![(x0, v), (x1, v)];
    draw_chart(
        path,
        Chart {
            caption: format!("{title}: temperatures"),
            y_desc: "temperature (°C)",
            y_range: (lo.floor(), hi.ceil()),
            y2: None,
            series: vec![
                Series::new("hottest GPU", RED_, hottest_points(rows)),
                Series::new("return", ORANGE, points(rows, |r| r.return_c)),
                Series::new("supply", BLUE_, points(rows, |r| r.supply_c)),
                Series::new("setpoint", GREEN_, points(rows, |r| r.setpoint_c)),
                Series::new("ambient", GREY, points(rows, |r| r.ambient_c)),
                Series::new("89 °C HW slowdown", DARK_RED, line(HW_SLOWDOWN_C)).dashed(),
                Series::new("87 °C max operating", PURPLE, line(MAX_OPERATING_C)).dashed(),
            ],
        },
    )
}

fn power(path: &Path, title: &str, rows: &[TraceRow]) -> Result<(), String> {
    let hi = rows
        .iter()
        .map(|r| r.it_kw.max(r.facility_kw))
        .fold(0.0, f64::max);
    let lo = rows
        .iter()
        .map(|r| r.it_kw.min(r.facility_kw))
        .fold(f64::INFINITY, f64::min)
        .min(0.0);
    draw_chart(
        path,
        Chart {
            caption: format!("{title}: power"),
            y_desc: "power (kW)",
            y_range: (lo, if hi > lo { hi * 1.1 } else { lo + 1.0 }),
            y2: None,
            series: vec![
                Series::new("facility", RED_, points(rows, |r| r.facility_kw)),
                Series::new("IT", BLUE_, points(rows, |r| r.it_kw)),
            ],
        },
    )
}

fn pue(path: &Path, title: &str, rows: &[TraceRow]) -> Result<(), String> {
    let per_row: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| r.pue().map(|p| (r.t_s / 60.0, p)))
        .collect();
    let running: Vec<(f64, f64)> = rows
        .iter()
        .zip(running_pue(rows))
        .filter_map(|(r, p)| p.map(|p| (r.t_s / 60.0, p)))
        .collect();
    let y_range = padded(per_row.iter().chain(&running).map(|p| p.1), 0.05);
    draw_chart(
        path,
        Chart {
            caption: format!("{title}: PUE"),
            y_desc: "PUE (facility / IT)",
            y_range,
            y2: None,
            series: vec![
                Series::new("PUE at each instant", ORANGE, per_row),
                Series::new("running PUE (energy)", BLUE_, running),
            ],
        },
    )
}

fn pump_caps(path: &Path, title: &str, rows: &[TraceRow]) -> Result<(), String> {
    let quarantined = rows.iter().any(|r| r.quarantined.is_some());
    let most = rows
        .iter()
        .map(|r| r.caps.max(r.quarantined.unwrap_or(0)))
        .max()
        .unwrap_or(0);
    let top = match most {
        0..=4 => 5.0,
        5..=9 => 10.0,
        n => (f64::from(n) * 1.1 / 10.0).ceil() * 10.0,
    };
    let mut series = vec![
        Series::new("pump speed", BLUE_, points(rows, |r| r.pump_speed * 100.0)),
        Series::new(
            "hosts capped (right)",
            RED_,
            steps(rows, |r| f64::from(r.caps)),
        )
        .secondary(),
    ];
    if quarantined {
        series.push(
            Series::new(
                "hosts with a GPU quarantined (right)",
                PURPLE,
                steps(rows, |r| f64::from(r.quarantined.unwrap_or(0))),
            )
            .secondary()
            .dashed(),
        );
    }
    let speed_hi = rows
        .iter()
        .map(|r| r.pump_speed * 100.0)
        .fold(100.0, f64::max);
    draw_chart(
        path,
        Chart {
            caption: format!("{title}: pump and caps"),
            y_desc: "pump speed (%)",
            y_range: (0.0, speed_hi * 1.05),
            y2: Some(("hosts", top)),
            series,
        },
    )
}

/// A tick label without trailing zeros: 20, 1.15.
fn tick(v: f64) -> String {
    let s = format!("{v:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

fn draw_chart(path: &Path, chart: Chart<'_>) -> Result<(), String> {
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    draw_on(&root, &chart).map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

fn draw_on(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    chart: &Chart<'_>,
) -> Result<(), Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let area = root.titled(&chart.caption, (FONT, 22))?;
    let (plot, legend) = area.split_horizontally(WIDTH - LEGEND_W);
    let (x0, x1) = (
        chart
            .series
            .iter()
            .flat_map(|s| &s.points)
            .map(|p| p.0)
            .fold(f64::INFINITY, f64::min),
        chart
            .series
            .iter()
            .flat_map(|s| &s.points)
            .map(|p| p.0)
            .fold(f64::NEG_INFINITY, f64::max),
    );
    let (x0, x1) = if x1 > x0 { (x0, x1) } else { (x0, x0 + 1.0) };
    let (y0, y1) = chart.y_range;
    let mut builder = ChartBuilder::on(&plot);
    builder
        .margin(10)
        .x_label_area_size(50)
        .y_label_area_size(70);
    if chart.y2.is_some() {
        builder.right_y_label_area_size(60);
    }
    let mut ctx = builder
        .build_cartesian_2d(x0..x1, y0..y1)?
        .set_secondary_coord(x0..x1, 0.0..chart.y2.map_or(1.0, |y| y.1));
    ctx.configure_mesh()
        .x_desc("time (min)")
        .y_desc(chart.y_desc)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(210, 210, 210))
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .draw()?;
    if let Some((desc, top)) = chart.y2 {
        ctx.configure_secondary_axes()
            .y_desc(desc)
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 16))
            .y_labels(if top <= 10.0 { top as usize + 1 } else { 11 })
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()?;
    }
    for s in &chart.series {
        let style = s.color.stroke_width(2);
        match (s.secondary, s.dashed) {
            (false, false) => {
                ctx.draw_series(LineSeries::new(s.points.iter().copied(), style))?;
            }
            (false, true) => {
                ctx.draw_series(DashedLineSeries::new(s.points.iter().copied(), 8, 5, style))?;
            }
            (true, false) => {
                ctx.draw_secondary_series(LineSeries::new(s.points.iter().copied(), style))?;
            }
            (true, true) => {
                ctx.draw_secondary_series(DashedLineSeries::new(
                    s.points.iter().copied(),
                    8,
                    5,
                    style,
                ))?;
            }
        }
    }
    let entries = chart
        .series
        .iter()
        .map(|s| (s.label.as_str(), s.color, s.dashed));
    draw_legend(&legend, entries)?;
    Ok(())
}

/// A legend beside a plot, so it never hides a line: one row per
/// `(label, colour, dashed)`, in order (the hall's and the goodput
/// report's charts).
pub fn draw_legend<'a>(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    entries: impl Iterator<Item = (&'a str, RGBColor, bool)>,
) -> Result<(), Box<dyn std::error::Error>> {
    let x = 8;
    let style = TextStyle::from((FONT, 15).into_font())
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    for (i, (label, color, dashed)) in entries.enumerate() {
        let y = 30 + 26 * i as i32;
        let line = color.stroke_width(3);
        if dashed {
            for k in 0..3 {
                area.draw(&PathElement::new(
                    vec![(x + 11 * k, y), (x + 11 * k + 7, y)],
                    line,
                ))?;
            }
        } else {
            area.draw(&PathElement::new(vec![(x, y), (x + 29, y)], line))?;
        }
        area.draw(&Text::new(label.to_string(), (x + 38, y), style.clone()))?;
    }
    Ok(())
}

/// The summary's known figures: field, what it is, unit.
const FIGURES: [(&str, &str, &str); 17] = [
    ("scenario", "scenario", ""),
    ("controller", "controller", ""),
    ("note", "note", ""),
    ("duration_s", "duration", "s"),
    ("it_kwh", "IT energy", "kWh"),
    ("facility_kwh", "facility energy", "kWh"),
    ("pue", "PUE", ""),
    ("work_gpu_h", "work done", "GPU-h"),
    (
        "kwh_per_work_gpu_h",
        "facility energy per work",
        "kWh per GPU-h",
    ),
    ("max_gpu_temp_c", "hottest GPU", "°C"),
    ("gpu_s_above_max_operating", "GPU time above 87 °C", "GPU-s"),
    ("slowdown_episodes", "HW slowdown episodes", ""),
    ("shutdowns", "thermal shutdowns", ""),
    ("cap_requests", "host-time with caps asked", "host-s"),
    ("failsafe_s", "time in failsafe", "s"),
    ("leaks", "leaks", ""),
    (
        "leak_pumped_s",
        "time a leaking rack's valve stayed open",
        "s",
    ),
];

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn value_text(key: &str, v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if key == "pue" || key.contains("per_") {
                format!("{x:.3}")
            } else {
                format!("{x:.1}")
            }
        }
        other => other.to_string(),
    }
}

/// Seconds as people write them: `5.1`, `30`, `0.25`.
fn secs(v: f64) -> String {
    let text = if v >= 10.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    match text.strip_suffix(".0") {
        Some(whole) => whole.to_string(),
        None => text,
    }
}

/// The summary's key for the baselines' figures (see
/// [`crate::compare::baselines_json`]).
pub const BASELINES: &str = "baselines";

/// A summary figure: `Some(Some(v))` a number, `Some(None)` a `null` (a
/// ratio whose denominator is 0), `None` missing or not a number.
fn figure(v: Option<&serde_json::Value>) -> Option<Option<f64>> {
    match v? {
        serde_json::Value::Null => Some(None),
        x => Some(Some(x.as_f64()?)),
    }
}

/// A figure's cell: three decimals, or what its `null` means.
fn cell3(v: Option<f64>, null: &str) -> String {
    v.map_or(null.to_string(), |x| format!("{x:.3}"))
}

/// One row of the result table: (name, PUE, energy per work, set point).
type ResultRow<'a> = (&'a String, Option<f64>, Option<f64>, Option<f64>);

/// The report's opening when the summary has the run's PUE and energy per
/// work and the baselines' (`baselines`): a table of the three and a
/// sentence with what the run saved against each. A `null` figure (no IT
/// energy, no work done) is said as such, not left out.
fn result(m: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
    let pue = figure(m.get("pue"))?;
    let per_work = figure(m.get("kwh_per_work_gpu_h"))?;
    let bases: Vec<ResultRow> = m
        .get(BASELINES)?
        .as_object()?
        .iter()
        .filter_map(|(name, b)| {
            let pue = figure(b.get("pue"))?;
            let per_work = figure(b.get("kwh_per_work_gpu_h"))?;
            Some((name, pue, per_work, b.get("setpoint_c")?.as_f64()))
        })
        .collect();
    if bases.is_empty() {
        return None;
    }
    let who = m
        .get("controller")
        .and_then(|c| c.as_str())
        .unwrap_or("ours");
    let (no_it, no_work) = ("no IT energy", "no work done");
    let mut md = String::new();
    let _ = writeln!(md, "## Result\n");
    let _ = writeln!(
        md,
        "| run | PUE | facility energy per work (kWh per GPU-h) |"
    );
    let _ = writeln!(md, "|---|---:|---:|");
    let _ = writeln!(
        md,
        "| this run: {} | {} | {} |",
        cell(who),
        cell3(pue, no_it),
        cell3(per_work, no_work)
    );
    for (name, b_pue, b_work, sp) in &bases {
        let fixed = sp.map_or(String::new(), |c| format!(": supply fixed at {c:.0} °C"));
        let (p, w) = (cell3(*b_pue, no_it), cell3(*b_work, no_work));
        let _ = writeln!(md, "| {}{fixed} | {p} | {w} |", cell(name));
    }
    md.push_str(&saved(pue, per_work, &bases));
    Some(md)
}

/// The sentence under the result table: what the run saved against each
/// baseline that did work, or that this run did none.
fn saved(pue: Option<f64>, per_work: Option<f64>, bases: &[ResultRow]) -> String {
    let Some(per_work) = per_work else {
        return "\nThis run did no GPU work: its facility energy bought none, so its energy \
                per unit of work has no value (`null` in the summary) and is set against no \
                baseline.\n\n"
            .to_string();
    };
    let pue = cell3(pue, "none");
    let against: Vec<String> = bases
        .iter()
        .filter_map(|(name, b_pue, b_work, _)| {
            let pct = crate::compare::saved_pct(per_work, (*b_work)?)?;
            let less = if pct >= 0.0 { "less" } else { "more" };
            Some(format!(
                "{:.1} % {less} than {name} (PUE {pue} against {})",
                pct.abs(),
                cell3(*b_pue, "none")
            ))
        })
        .collect();
    let against = if against.is_empty() {
        "set against no baseline: none did work".to_string()
    } else {
        against.join(" and ")
    };
    format!(
        "\nFacility energy per unit of GPU work: {against}. The baselines played the \
         same scenario in simulated time: supply fixed, pumps at full speed, \
         no caps.\n\n"
    )
}

pub(crate) fn markdown(
    title: &str,
    rows: &[TraceRow],
    summary: Option<&serde_json::Map<String, serde_json::Value>>,
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# {}\n", title.trim());
    if let Some(r) = summary.and_then(result) {
        md.push_str(&r);
    }
    let first = rows[0].t_s;
    let last = rows[rows.len() - 1].t_s;
    let every = if rows.len() > 1 {
        format!(
            ", a row every {} s",
            secs((last - first) / (rows.len() - 1) as f64)
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        md,
        "Trace: {} rows from {:.1} to {:.1} min{every}.\n",
        rows.len(),
        first / 60.0,
        last / 60.0
    );
    if let Some(m) = summary {
        let _ = writeln!(md, "## Summary\n");
        let _ = writeln!(md, "| figure | value | unit | field |");
        let _ = writeln!(md, "|---|---:|---|---|");
        for (key, label, unit) in FIGURES {
            if let Some(v) = m.get(key) {
                let _ = writeln!(
                    md,
                    "| {label} | {} | {unit} | `{key}` |",
                    cell(&value_text(key, v))
                );
            }
        }
        for (key, v) in m {
            if !FIGURES.iter().any(|f| f.0 == key) && key != BASELINES {
                let _ = writeln!(
                    md,
                    "| {} | {} |  | `{}` |",
                    cell(key),
                    cell(&value_text(key, v)),
                    cell(key)
                );
            }
        }
        md.push('\n');
    }
    let max = |f: fn(&TraceRow) -> f64| rows.iter().map(f).fold(f64::NEG_INFINITY, f64::max);
    let _ = writeln!(md, "## From the trace\n");
    let _ = writeln!(md, "| figure | value |");
    let _ = writeln!(md, "|---|---:|");
    if let Some(c) = rows.iter().filter_map(|r| r.max_gpu_c).reduce(f64::max) {
        let _ = writeln!(md, "| hottest GPU | {c:.1} °C |");
    }
    let _ = writeln!(md, "| highest return | {:.1} °C |", max(|r| r.return_c));
    let _ = writeln!(
        md,
        "| highest facility power | {:.1} kW |",
        max(|r| r.facility_kw)
    );
    if let Some(Some(p)) = running_pue(rows).last() {
        let _ = writeln!(md, "| PUE over the trace | {p:.3} |");
    }
    let _ = writeln!(
        md,
        "| most hosts capped | {} |",
        rows.iter().map(|r| r.caps).max().unwrap_or(0)
    );
    if rows.iter().any(|r| r.quarantined.is_some()) {
        let q = rows.iter().filter_map(|r| r.quarantined).max().unwrap_or(0);
        let _ = writeln!(md, "| most hosts with a GPU quarantined at once | {q} |");
    }
    md.push('\n');
    let _ = writeln!(md, "## Charts\n");
    let names = [
        "Temperatures: supply, return, setpoint, hottest GPU and ambient, with the 87 °C and 89 °C limits",
        "Power: IT and facility",
        "PUE: at each instant and running (energy since the start)",
        "Pump speed and hosts capped",
    ];
    for (file, name) in CHARTS.iter().zip(names) {
        let _ = writeln!(
            md,
            "### {}\n\n![{name}]({file})\n",
            name.split(':').next().unwrap_or(name)
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::{result, secs};

    #[test]
    fn a_run_that_did_no_work_keeps_its_result_and_says_so() {
        let v = serde_json::json!({
            "controller": "ours",
            "pue": 1.25,
            "kwh_per_work_gpu_h": null,
            "baselines": {
                "baseline-18": {"pue": 1.4, "kwh_per_work_gpu_h": 0.9, "setpoint_c": 18.0},
                "baseline-32": {"pue": null, "kwh_per_work_gpu_h": null, "setpoint_c": 32.0}
            }
        });
        let md = result(v.as_object().unwrap()).expect("the result section");
        assert!(
            md.contains("| this run: ours | 1.250 | no work done |"),
            "{md}"
        );
        assert!(
            md.contains("| baseline-18: supply fixed at 18 °C | 1.400 | 0.900 |"),
            "{md}"
        );
        assert!(
            md.contains("| baseline-32: supply fixed at 32 °C | no IT energy | no work done |"),
            "{md}"
        );
        assert!(md.contains("This run did no GPU work"), "{md}");
        // A summary without the figures at all has no result section.
        let bare = serde_json::json!({"controller": "ours"});
        assert_eq!(result(bare.as_object().unwrap()), None);
    }

    #[test]
    fn seconds_read_as_people_write_them() {
        assert_eq!(secs(5.123296238999998), "5.1");
        assert_eq!(secs(5.0), "5");
        assert_eq!(secs(30.4), "30");
        assert_eq!(secs(0.25), "0.25");
    }
}
