//! The goodput report's three SVG charts, drawn with plotters' SVG
//! backend and no font library, as the hall's report draws its own.
//!
//! Glossary:
//! - *ETT*: effective training time, in percent on every axis.
//! - *lead*: hours before a failure its precursor is flagged (log axis).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use loopwarden_twin::goodput::PolicySummary;

use super::study::{Cell, Point, Study, COVERAGE, TARGET};

/// The charts, in the order they are written and linked.
pub const CHARTS: [&str; 3] = [
    "ett_vs_checkpoint.svg",
    "ett_vs_precursor.svg",
    "lost_by_cause.svg",
];

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 520;
const LEGEND_W: u32 = 250;
const FONT: &str = "sans-serif";

const POLICY_COLORS: [RGBColor; 4] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];
const RAMP: [RGBColor; 5] = [
    RGBColor(158, 202, 225),
    RGBColor(107, 174, 214),
    RGBColor(66, 146, 198),
    RGBColor(33, 113, 181),
    RGBColor(8, 69, 148),
];
const GREY: RGBColor = RGBColor(110, 110, 110);

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Res = Result<(), Box<dyn std::error::Error>>;
/// Draws one chart of the study.
type Draw = fn(&Area<'_>, &Study) -> Res;

/// One line: label, colour, dashed, points.
struct Line {
    label: String,
    color: RGBColor,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

/// Writes the three charts into `dir`.
pub fn write(dir: &Path, study: &Study) -> Result<(), String> {
    let draws: [(&str, Draw); 3] = [
        (CHARTS[0], checkpoint),
        (CHARTS[1], precursor),
        (CHARTS[2], lost_by_cause),
    ];
    for (name, draw) in draws {
        let path = dir.join(name);
        let root = SVGBackend::new(&path, (WIDTH, HEIGHT)).into_drawing_area();
        draw(&root, study)
            .and_then(|()| root.present().map_err(Into::into))
            .map_err(|e| format!("{}: drawing failed: {e}", path.display()))?;
    }
    Ok(())
}

/// A tick label without trailing zeros.
fn tick(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn percent_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v * 100.0), hi.max(v * 100.0))
    });
    if !lo.is_finite() {
        return (0.0, 100.0);
    }
    let pad = ((hi - lo) * 0.08).max(0.5);
    ((lo - pad).max(0.0), (hi + pad).min(100.0))
}

/// Lines on a log x axis, the legend at the right.
fn log_chart(root: &Area<'_>, caption: &str, x_desc: &str, lines: &[Line]) -> Res {
    root.fill(&WHITE)?;
    let area = root.titled(caption, (FONT, 22))?;
    let (plot, legend) = area.split_horizontally(WIDTH - LEGEND_W);
    let xs = lines.iter().flat_map(|l| &l.points).map(|p| p.0);
    let (x0, x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    let (y0, y1) = percent_range(lines.iter().flat_map(|l| &l.points).map(|p| p.1 / 100.0));
    let mut ctx = ChartBuilder::on(&plot)
        .margin(10)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d((x0..x1.max(x0 * 1.01)).log_scale(), y0..y1)?;
    ctx.configure_mesh()
        .x_desc(x_desc)
        .y_desc("ETT (%)")
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(210, 210, 210))
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .draw()?;
    for l in lines {
        let style = l.color.stroke_width(2);
        let pts = l.points.iter().copied();
        if l.dashed {
            ctx.draw_series(DashedLineSeries::new(pts, 8, 5, style))?;
        } else {
            ctx.draw_series(LineSeries::new(pts, style))?;
            ctx.draw_series(
                l.points
                    .iter()
                    .map(|&p| Circle::new(p, 3, l.color.filled())),
            )?;
        }
    }
    draw_legend(&legend, lines)
}

fn draw_legend(area: &Area<'_>, lines: &[Line]) -> Res {
    let entries = lines.iter().map(|l| (l.label.as_str(), l.color, l.dashed));
    loopwarden_hall::report::draw_legend(area, entries)
}

/// The sweeps' policies, named as the report's sensitivity tables name
/// them: no policy raises a false alarm there.
pub const SWEPT_POLICIES: [&str; 3] = [
    "reactive",
    "agent, no false quarantines",
    "agent + drain, no false alarms",
];

fn policy_lines(points: &[Point]) -> Vec<Line> {
    SWEPT_POLICIES
        .iter()
        .enumerate()
        .map(|(k, name)| Line {
            label: name.to_string(),
            color: POLICY_COLORS[k],
            dashed: false,
            points: points.iter().map(|p| (p.x, p.ett[k] * 100.0)).collect(),
        })
        .collect()
}

fn checkpoint(root: &Area<'_>, s: &Study) -> Res {
    let j = &s.inputs.job;
    let caption = format!(
        "ETT against the checkpoint interval ({} GPUs, write {} s, restart {} min)",
        j.gpus,
        tick(j.checkpoint_write_s),
        tick(j.restart_min)
    );
    log_chart(
        root,
        &caption,
        "checkpoint interval (min, log)",
        &policy_lines(&s.checkpoint),
    )
}

fn precursor(root: &Area<'_>, s: &Study) -> Res {
    let of = |c: f64| -> Vec<&Cell> { s.precursors.iter().filter(|x| x.coverage == c).collect() };
    let mut lines: Vec<Line> = COVERAGE
        .iter()
        .enumerate()
        .map(|(k, &c)| Line {
            label: format!("{} % flagged", tick(c * 100.0)),
            color: RAMP[k],
            dashed: false,
            points: of(c).iter().map(|x| (x.lead_h, x.ett * 100.0)).collect(),
        })
        .collect();
    let (a, b) = (LEAD_RANGE.0, LEAD_RANGE.1);
    // The drain lines have no false alarm and run over the sweeps'
    // trials: the agent without false quarantines over the same trials is
    // their match.
    let agent = s.agent_swept.ett * 100.0;
    lines.push(Line {
        label: "agent, no drain, no false quarantines".into(),
        color: POLICY_COLORS[1],
        dashed: true,
        points: vec![(a, agent), (b, agent)],
    });
    lines.push(Line {
        label: format!("{} % target", tick(TARGET * 100.0)),
        color: GREY,
        dashed: true,
        points: vec![(a, TARGET * 100.0), (b, TARGET * 100.0)],
    });
    let caption = "ETT with drains against precursor lead time and coverage";
    log_chart(
        root,
        caption,
        "lead time (hours before the failure, log)",
        &lines,
    )
}

/// The lead axis: the sweep's first and last lead.
const LEAD_RANGE: (f64, f64) = (
    super::study::LEAD_H[0],
    super::study::LEAD_H[super::study::LEAD_H.len() - 1],
);

fn lost_by_cause(root: &Area<'_>, s: &Study) -> Res {
    root.fill(&WHITE)?;
    let area = root.titled("GPU-hours lost by cause, per trial", (FONT, 22))?;
    let (plot, legend) = area.split_horizontally(WIDTH - LEGEND_W);
    let rows = causes(s);
    let n = rows.len().max(1) as f64;
    let top = rows.iter().flat_map(|r| r.1).fold(1.0, f64::max) * 1.05;
    let mut ctx = ChartBuilder::on(&plot)
        .margin(10)
        .x_label_area_size(50)
        .y_label_area_size(170)
        .build_cartesian_2d(0.0..top, 0.0..n)?;
    ctx.configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc("GPU-hours")
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(210, 210, 210))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    let label = TextStyle::from((FONT, 13).into_font())
        .color(&BLACK)
        .pos(Pos::new(HPos::Right, VPos::Center));
    for (i, (name, v)) in rows.iter().enumerate() {
        let y = n - 1.0 - i as f64;
        for (k, &g) in v.iter().enumerate() {
            let (y0, y1) = (y + 0.1 + 0.2 * k as f64, y + 0.1 + 0.2 * (k + 1) as f64);
            let bar = Rectangle::new([(0.0, y0), (g, y1)], POLICY_COLORS[k].filled());
            ctx.draw_series(std::iter::once(bar))?;
        }
        let (px, py) = ctx.backend_coord(&(0.0, y + 0.5));
        root.draw(&Text::new(name.clone(), (px - 6, py), label.clone()))?;
    }
    let names = [
        "reactive",
        "agent",
        "agent + drain",
        "drain, no false alarm",
    ];
    let lines: Vec<Line> = names
        .iter()
        .enumerate()
        .map(|(k, l)| Line {
            label: l.to_string(),
            color: POLICY_COLORS[k],
            dashed: false,
            points: Vec::new(),
        })
        .collect();
    draw_legend(&legend, &lines)
}

/// Causes with any loss, largest (reactive) first: name, GPU-h per
/// policy, then the drain policy's without false alarms.
pub fn causes(s: &Study) -> Vec<(String, [f64; 4])> {
    let p = &s.headline.policies;
    let q = &s.no_false_alarms;
    let mut rows: Vec<(String, [f64; 4])> = p[0]
        .lost_by_cause
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            let of = |x: &PolicySummary| x.lost_by_cause[i].1;
            (name.clone(), [of(&p[0]), of(&p[1]), of(&p[2]), of(q)])
        })
        .filter(|(_, v)| v.iter().any(|&g| g > 0.0))
        .collect();
    rows.sort_by(|a, b| b.1[0].total_cmp(&a.1[0]));
    rows
}
