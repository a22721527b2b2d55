//! The report: four SVG charts that parse as XML and name their axes, and
//! report.md with the title, the summary's table and links to the charts.

use std::path::Path;

use loopwarden_hall::report::{CHARTS, REPORT};
use loopwarden_hall::{write_report, ReportError, TraceRow};

fn rows(quarantined: bool) -> Vec<TraceRow> {
    (0..60)
        .map(|i| {
            let t = i as f64 * 10.0;
            TraceRow {
                t_s: t,
                ambient_c: 30.0 + t / 100.0,
                setpoint_c: 32.0,
                supply_c: 32.0 + (t / 100.0).sin(),
                return_c: 40.0 + (t / 100.0).sin(),
                flow_lpm: 192.0,
                pump_speed: if i < 30 { 1.0 } else { 0.6 },
                max_gpu_c: Some(60.0 + i as f64 / 2.0),
                it_kw: 100.0 + (i % 7) as f64,
                facility_kw: 125.0 + (i % 5) as f64,
                caps: (i / 20) as u32,
                quarantined: quarantined.then_some((i / 30) as u32),
            }
        })
        .collect()
}

fn summary() -> serde_json::Value {
    serde_json::json!({
        "scenario": "chiller_trip_heatwave", "controller": "baseline-32",
        "duration_s": 600, "it_kwh": 17.5, "facility_kwh": 21.7, "pue": 1.2097,
        "work_gpu_h": 20.0, "kwh_per_work_gpu_h": 1.0725, "max_gpu_temp_c": 89.5,
        "gpu_s_above_max_operating": 12, "slowdown_episodes": 1, "shutdowns": 0,
        "cap_requests": 0, "failsafe_s": 0, "leaks": 0, "leak_pumped_s": 0,
        "extra_figure": "a | b"
    })
}

/// The SVG's text, every `<text>` element trimmed.
fn svg_texts(path: &Path) -> Vec<String> {
    let svg = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&svg)
        .unwrap_or_else(|e| panic!("{} is not XML: {e}", path.display()));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| {
            n.descendants()
                .filter(|d| d.is_text())
                .filter_map(|d| d.text())
                .collect::<String>()
                .trim()
                .to_string()
        })
        .collect()
}

#[test]
fn report_writes_four_svgs_and_markdown_that_name_their_axes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("new/report");
    let title = "heat wave <A & B>";
    let written = write_report(&out, title, &rows(true), Some(&summary())).unwrap();
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "temperatures.svg",
            "power.svg",
            "pue.svg",
            "pump_caps.svg",
            "report.md"
        ]
    );
    let axes: [&[&str]; 4] = [
        &[
            "temperature (°C)",
            "hottest GPU",
            "supply",
            "return",
            "setpoint",
            "ambient",
            "87 °C max operating",
            "89 °C HW slowdown",
        ],
        &["power (kW)", "IT", "facility"],
        &[
            "PUE (facility / IT)",
            "PUE at each instant",
            "running PUE (energy)",
        ],
        &[
            "pump speed (%)",
            "hosts",
            "pump speed",
            "hosts capped (right)",
            "hosts with a GPU quarantined (right)",
        ],
    ];
    for (file, want) in CHARTS.iter().zip(axes) {
        let texts = svg_texts(&out.join(file));
        for w in want.iter().chain(&["time (min)"]) {
            assert!(
                texts.iter().any(|t| t == w),
                "{file} lacks {w:?}: {texts:?}"
            );
        }
        assert!(
            texts.iter().any(|t| t.starts_with(title)),
            "{file} lacks the title: {texts:?}"
        );
    }
    let md = std::fs::read_to_string(out.join(REPORT)).unwrap();
    assert!(md.starts_with(&format!("# {title}\n")), "{md}");
    assert!(md.contains("| PUE | 1.210 |  | `pue` |"), "{md}");
    assert!(
        md.contains("| hottest GPU | 89.5 | °C | `max_gpu_temp_c` |"),
        "{md}"
    );
    assert!(md.contains("| extra_figure | a \\| b |"), "{md}");
    assert!(
        md.contains("| most hosts with a GPU quarantined at once | 1 |"),
        "{md}"
    );
    for file in CHARTS {
        assert!(
            md.contains(&format!("]({file})")),
            "{md} lacks a link to {file}"
        );
    }
}

#[test]
fn report_without_summary_or_quarantine_and_with_one_row() {
    let dir = tempfile::tempdir().unwrap();
    let one = &rows(false)[..1];
    let written = write_report(dir.path(), "one row", one, None).unwrap();
    assert_eq!(written.len(), 5);
    for file in CHARTS {
        let texts = svg_texts(&dir.path().join(file));
        assert!(texts.iter().any(|t| t == "time (min)"), "{file}: {texts:?}");
        assert!(!texts.iter().any(|t| t.contains("quarantined")), "{file}");
    }
    let md = std::fs::read_to_string(dir.path().join(REPORT)).unwrap();
    assert!(!md.contains("## Summary"), "{md}");
}

#[test]
fn report_refuses_no_rows_and_a_summary_that_is_no_object() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        write_report(dir.path(), "t", &[], None),
        Err(ReportError::NoRows)
    ));
    assert!(matches!(
        write_report(
            dir.path(),
            "t",
            &rows(false),
            Some(&serde_json::json!([1, 2]))
        ),
        Err(ReportError::SummaryNotObject)
    ));
}

/// The rows of the report's first section, which must be `## Result`:
/// (run, PUE, facility kWh per GPU-h of work), and the section's text.
fn result_section(md: &str) -> (Vec<(String, f64, f64)>, String) {
    let body = md.split_once("\n## ").map(|(_, b)| b).unwrap_or("");
    assert!(body.starts_with("Result\n"), "the first section:\n{md}");
    let section = body.split("\n## ").next().unwrap().to_string();
    let rows = section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| run "))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            let num = |c: &str| {
                c.parse::<f64>()
                    .unwrap_or_else(|e| panic!("{l}: {c:?}: {e}"))
            };
            (cells[0].to_string(), num(cells[1]), num(cells[2]))
        })
        .collect();
    (rows, section)
}

#[test]
fn report_opens_with_the_run_against_both_baselines() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = summary();
    s["controller"] = "ours (live)".into();
    s["pue"] = 1.1.into();
    s["kwh_per_work_gpu_h"] = 1.0.into();
    s["baselines"] = serde_json::json!({
        "baseline-18": {"setpoint_c": 18.0, "pue": 1.25, "kwh_per_work_gpu_h": 1.25},
        "baseline-32": {"setpoint_c": 32.0, "pue": 1.05, "kwh_per_work_gpu_h": 0.95},
    });
    write_report(dir.path(), "demo", &rows(true), Some(&s)).unwrap();
    let md = std::fs::read_to_string(dir.path().join(REPORT)).unwrap();
    let (rows, text) = result_section(&md);
    assert_eq!(
        rows,
        [
            ("this run: ours (live)".to_string(), 1.1, 1.0),
            ("baseline-18: supply fixed at 18 °C".to_string(), 1.25, 1.25),
            ("baseline-32: supply fixed at 32 °C".to_string(), 1.05, 0.95),
        ]
    );
    assert!(
        text.contains("20.0 % less than baseline-18 (PUE 1.100 against 1.250)"),
        "{text}"
    );
    assert!(
        text.contains("5.3 % more than baseline-32 (PUE 1.100 against 1.050)"),
        "{text}"
    );
    // The baselines are not repeated as a raw figure in the summary.
    assert!(!md.contains("`baselines`"), "{md}");
}

#[test]
fn without_baselines_the_report_opens_with_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    write_report(dir.path(), "t", &rows(false), Some(&summary())).unwrap();
    let md = std::fs::read_to_string(dir.path().join(REPORT)).unwrap();
    assert!(!md.contains("## Result"), "{md}");
    assert!(md.starts_with("# t\n\nTrace: "), "{md}");
}
