//! The one-command run, headless, on a short scenario: every host's agent
//! and the CDU's controller are heard on the broker, the controller drives
//! the simulated CDU over Modbus, and the report is written.

use loopwarden_hall::play::{play, PlayConfig};
use loopwarden_twin::scenario::Scenario;

/// A short scenario: a job starts on 4 hosts, the controller takes over.
const SHORT: &str = include_str!("../scenarios/short.toml");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_system_runs_headless_and_everything_is_heard() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Scenario::from_toml(SHORT, "short.toml").unwrap();
    let out = play(PlayConfig::headless(scenario, "short", dir.path()))
        .await
        .expect("the run completes");
    let want: Vec<String> = ["r0h0", "r0h1", "r1h0", "r1h1"].map(String::from).to_vec();
    assert_eq!(
        out.hosts_heard.iter().cloned().collect::<Vec<_>>(),
        want,
        "telemetry from every host"
    );
    assert!(out.cdu_heard, "the CDU's telemetry");
    // The CDU started at the vendor default (18 °C, 100 %); the controller
    // boots at 25 °C and then optimises: what the CDU holds now came over
    // Modbus.
    let (sp, speed) = out.cdu_settings;
    assert!(
        (sp - 18.0).abs() > 0.5 || (speed - 1.0).abs() > 0.01,
        "{sp} {speed}"
    );
    for f in [
        "temperatures.svg",
        "power.svg",
        "pue.svg",
        "pump_caps.svg",
        "report.md",
        "trace.csv",
    ] {
        assert!(dir.path().join(f).exists(), "{f}");
    }
    // The report opens with the run against both baselines, played on
    // the same scenario in simulated time: PUE and energy per work each.
    let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    let result = md.split("\n## ").nth(1).unwrap_or("");
    assert!(result.starts_with("Result\n"), "{md}");
    for run in ["this run: ours (live)", "baseline-18", "baseline-32"] {
        let row = result
            .lines()
            .find(|l| l.starts_with(&format!("| {run}")))
            .unwrap_or_else(|| panic!("no row for {run}:\n{result}"));
        let figures: Vec<f64> = row
            .split('|')
            .filter_map(|c| c.trim().parse().ok())
            .collect();
        assert!(
            figures.len() == 2 && figures[0] > 1.0 && figures[1] > 0.0,
            "PUE above 1 and energy per work: {row}"
        );
    }
}
