//! `loopwarden-hall goodput` as a user runs it: the JSON summary's fields,
//! report.md and its three charts (SVG that parses), a mix from a file,
//! and a bad mix refused with the file's name and the reason.

use std::path::Path;
use std::process::Command;

fn goodput(out: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_loopwarden-hall"))
        .arg("goodput")
        .args(["--trials", "4", "--sweep-trials", "2", "--days", "3"])
        .args(["--no-measured", "--json", "--out"])
        .arg(out)
        .args(extra)
        .output()
        .expect("the binary runs")
}

fn ett_of(v: &serde_json::Value, policy: &str) -> f64 {
    v["ett"][policy].as_f64().unwrap()
}

fn svg_texts(path: &Path) -> Vec<String> {
    let svg = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&svg)
        .unwrap_or_else(|e| panic!("{} is not XML: {e}", path.display()));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_string())
        .collect()
}

#[test]
fn goodput_prints_its_summary_and_writes_the_report_and_charts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let flags = [
        "--seed",
        "9",
        "--false-alarms-per-gpu-day",
        "1e-4",
        "--false-quarantines-per-gpu-day",
        "1e-4",
    ];
    let o = goodput(&out, &flags);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let stdout = String::from_utf8(o.stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(v["trials"], 4);
    assert_eq!(v["seed"], 9);
    assert_eq!(v["quarantine_ends_job"], false);
    assert_eq!(v["false_alarms_per_gpu_day"], 1e-4);
    assert_eq!(v["false_quarantines_per_gpu_day"], 1e-4);
    // False quarantines cost the agent; reactive handling has none.
    let by_cause = &v["lost_gpu_h_by_cause"];
    assert_eq!(by_cause["reactive"]["false_alarm"], 0.0);
    assert!(by_cause["agent"]["false_alarm"].as_f64().unwrap() >= 0.0);
    assert_eq!(by_cause["agent_no_false_quarantines"]["false_alarm"], 0.0);
    for p in ["reactive", "agent", "agent_drain"] {
        let ett = v["ett"][p].as_f64().unwrap();
        assert!(ett > 0.5 && ett < 1.0, "{p}: {ett}");
        assert!(v["interruptions"][p].as_f64().unwrap() > 0.0);
        let lost = v["lost_gpu_h_by_cause"][p].as_object().unwrap();
        assert!(lost["faulty_gpu"].as_f64().unwrap() > 0.0);
        assert!(lost["checkpoints"].as_f64().unwrap() > 0.0);
        assert!(lost.contains_key("false_alarm"));
    }
    assert!(
        v["lost_gpu_h_by_cause"]["agent_drain"]["false_alarm"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    for heading in [
        "## ETT per policy",
        "## Where the time goes",
        "### By cause",
        "## Sensitivity",
        "### Checkpoint interval",
        "### Restart",
        "## Precursors",
        "## Drains against false alarms",
        "## The moonshot",
        "**Answer:**",
    ] {
        assert!(md.contains(heading), "report.md lacks {heading}");
    }
    // Without --quarantine-ends-job the agent is credited with no hang,
    // and at triage 0 with no naming either.
    assert!(md.contains("waits for the 10-minute collective timeout under every policy"));
    assert!(md.contains("reactive handling names the bad host at once too"));
    assert!(md.contains("| quarantine ends the job | no | `--quarantine-ends-job` |"));
    assert!(md.contains("keeps a healthy host out of the next restart under both agent policies"));
    assert!(md.contains("`--false-quarantines-per-gpu-day` |"));
    // Differences between policies come with their interval.
    let d = &v["ett_differences"]["agent_drain_minus_reactive"];
    let mean = d["mean"].as_f64().unwrap();
    let half = d["ci95_half_width"].as_f64().unwrap();
    assert!(half > 0.0 && d["trials"] == 4, "{d}");
    let drain_gain = ett_of(&v, "agent_drain") - ett_of(&v, "reactive");
    assert!((mean - drain_gain).abs() < 1e-9, "{d}");
    let row = format!(
        "| agent + drain − reactive | {:+.3} | {:+.3} to {:+.3} (± {:.3}) | 4 |",
        mean * 100.0,
        (mean - half) * 100.0,
        (mean + half) * 100.0,
        half * 100.0
    );
    assert!(md.contains(&row), "report.md lacks {row}");
    // The drain policy is the site's to build, and the report says so.
    let drains = "Loopwarden does not drain: the agent only marks the GPU `degraded` on the bus \
                  (keep running, mark for maintenance), and its actions run on quarantine and \
                  cooling loss alone. The drain policy needs the site's scheduler to read \
                  `degraded` from the bus and requeue the job at a checkpoint, which Loopwarden \
                  does not ship.";
    assert!(md.contains(drains), "report.md lacks: {drains}");
    for (chart, axis) in [
        ("ett_vs_checkpoint.svg", "checkpoint interval (min, log)"),
        (
            "ett_vs_precursor.svg",
            "lead time (hours before the failure, log)",
        ),
        ("lost_by_cause.svg", "GPU-hours"),
    ] {
        assert!(
            md.contains(&format!("]({chart})")),
            "report.md links {chart}"
        );
        let texts = svg_texts(&out.join(chart));
        assert!(texts.iter().any(|t| t == axis), "{chart}: {texts:?}");
        assert!(stdout.contains(chart));
    }
    assert!(svg_texts(&out.join("lost_by_cause.svg"))
        .iter()
        .any(|t| t == "faulty_gpu"));
}

#[test]
fn goodput_reads_a_mix_file_and_refuses_a_bad_one_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mix = dir.path().join("two.toml");
    let text = r#"format = "goodput-mix/1"
source = "two classes"
rate_per_gpu_day = 0.002
[[class]]
name = "gpu"
share = 0.7
host_visible = true
onset = "crash"
precursor = { coverage = 0.8, lead = { kind = "fixed", hours = 2.0 } }
[[class]]
name = "switch"
share = 0.3
host_visible = false
onset = "hang"
excludes_host = false
"#;
    std::fs::write(&mix, text).unwrap();
    let out = dir.path().join("run");
    let flags = ["--mix", mix.to_str().unwrap(), "--gpus", "1024"];
    let o = goodput(&out, &[&flags[..], &["--quarantine-ends-job"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8(o.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(v["quarantine_ends_job"], true);
    let lost = v["lost_gpu_h_by_cause"]["reactive"].as_object().unwrap();
    let mut names: Vec<&str> = lost.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["checkpoints", "false_alarm", "gpu", "switch"]);
    // 80 % of the GPU failures drained two hours ahead: fewer interruptions.
    let i = &v["interruptions"];
    assert!(i["agent_drain"].as_f64().unwrap() < i["agent"].as_f64().unwrap());

    std::fs::write(&mix, text.replace("share = 0.3", "share = 0.2")).unwrap();
    let o = goodput(&out, &["--mix", mix.to_str().unwrap()]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("two.toml: the shares sum to 0.900000000, not 1 (within 1e-6)"),
        "{e}"
    );
}

#[test]
fn drains_with_neither_false_flag_are_compared_with_the_agent_with_none() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = goodput(&out, &["--false-quarantines-per-gpu-day", "1e-2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8(o.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let ett = |p: &str| v["ett"][p].as_f64().unwrap();
    let gain = (ett("agent_drain_no_false_alarms") - ett("agent_no_false_quarantines")) * 100.0;
    // Far from the gain over the agent as run, which false quarantines
    // bring down.
    let as_run = (ett("agent_drain_no_false_alarms") - ett("agent")) * 100.0;
    assert!((gain - as_run).abs() > 0.01, "{gain} {as_run}");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    // Said with its paired interval over the same trials.
    let d = &v["ett_differences"]["agent_drain_minus_agent_with_neither"];
    let h = d["ci95_half_width"].as_f64().unwrap() * 100.0;
    let said = format!("and {gain:+.2} ± {h:.2} points (95 %)");
    assert!(md.contains(&said), "report.md lacks {said}");
    assert!(md.contains("with neither (against the agent without false quarantines)"));
    assert!(md.contains("| reactive | agent, no false quarantines |"));
    assert!(!md.contains("(as run) |"));
}

#[test]
fn a_quarantine_that_ends_the_job_is_an_interruption_not_a_failure_drained() {
    let dir = tempfile::tempdir().unwrap();
    let mix = dir.path().join("quarantined.toml");
    let text = r#"format = "goodput-mix/1"
source = "every flag a quarantine"
rate_per_gpu_day = 0.002
[[class]]
name = "gpu"
share = 1.0
host_visible = true
onset = "crash"
precursor = { coverage = 0.8, lead = { kind = "fixed", hours = 2.0 }, quarantined = 1.0 }
"#;
    std::fs::write(&mix, text).unwrap();
    let out = dir.path().join("run");
    let flags = ["--mix", mix.to_str().unwrap(), "--gpus", "1024"];
    let o = goodput(&out, &[&flags[..], &["--quarantine-ends-job"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8(o.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let (i, q) = (&v["interruptions"], &v["quarantine_stops"]);
    let f = |x: &serde_json::Value, p: &str| x[p].as_f64().unwrap();
    assert_eq!(f(q, "reactive"), 0.0);
    assert!(f(q, "agent") > 0.0, "{v}");
    // The job stops as often under the agent as under reactive handling:
    // each quarantine stop is one failure's stop, sooner.
    assert!(f(i, "agent") >= f(q, "agent"), "{v}");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    let row: Vec<&str> = md
        .lines()
        .find(|l| l.starts_with("| agent |"))
        .unwrap()
        .split('|')
        .map(str::trim)
        .collect();
    // policy, ETT, percentiles, interruptions, quarantine stops, drains,
    // failures drained or left out of a restart.
    assert_eq!(row[6], "0.0", "the agent drains nothing: {row:?}");
    let n = |k: usize| row[k].parse::<f64>().unwrap();
    assert!(n(7) < n(5), "a stop is not a failure averted: {row:?}");
    assert!(md.contains("| of which a quarantine's stop | drains | failures drained or left out of a restart before they struck |"));
}
