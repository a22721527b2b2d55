//! `loopwarden-hall plot` on small CSV files.

use std::path::Path;
use std::process::{Command, Output};

const CSV: &str = "\
t_s,ambient_c,setpoint_c,supply_c,return_c,flow_lpm,pump_speed,max_gpu_c,it_kw,facility_kw,caps
0,41.00,32.00,41.00,42.49,192.0,1.00,42.38,107.24,135.36,0
10,41.01,32.00,40.59,44.75,192.0,1.00,53.16,108.80,136.96,0
20,41.03,32.00,40.27,46.09,192.0,1.00,59.83,108.80,136.96,1
30,41.04,32.00,40.00,46.87,192.0,1.00,63.90,108.80,136.96,2
";

const SUMMARY: &str =
    r#"{"scenario":"chiller_trip_heatwave","controller":"baseline-32","pue":1.2097,"it_kwh":1.0}"#;

fn hall(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_loopwarden-hall"))
        .args(args)
        .output()
        .unwrap()
}

fn plot(trace: &Path, summary: Option<&Path>, out: &Path) -> Output {
    let mut args = vec!["plot".as_ref(), "--trace".as_ref(), trace.as_os_str()];
    if let Some(s) = summary {
        args.extend(["--summary".as_ref(), s.as_os_str()]);
    }
    args.extend(["--out".as_ref(), out.as_os_str()]);
    hall(&args)
}

#[test]
fn plot_writes_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("run.csv");
    let summary = dir.path().join("run.json");
    std::fs::write(&trace, CSV).unwrap();
    std::fs::write(&summary, SUMMARY).unwrap();
    let out = dir.path().join("report");
    let o = plot(&trace, Some(&summary), &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8(o.stdout).unwrap();
    for f in [
        "temperatures.svg",
        "power.svg",
        "pue.svg",
        "pump_caps.svg",
        "report.md",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
        assert!(stdout.contains(f), "{stdout}");
    }
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    // The title defaults to the summary's scenario and controller.
    assert!(
        md.starts_with("# chiller_trip_heatwave (baseline-32)\n"),
        "{md}"
    );
    assert!(md.contains("| PUE | 1.210 |"), "{md}");
    assert!(md.contains(", a row every 10 s"), "{md}");
}

#[test]
fn plot_takes_a_title_and_no_summary() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("run.csv");
    std::fs::write(&trace, CSV).unwrap();
    let out = dir.path().join("r");
    let o = hall(&[
        "plot".as_ref(),
        "--trace".as_ref(),
        trace.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
        "--title".as_ref(),
        "My run".as_ref(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.starts_with("# My run\n"), "{md}");
}

#[test]
fn plot_errors_name_the_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r");
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, CSV.replace("40.27", "warm")).unwrap();
    let o = plot(&bad, None, &out);
    assert!(!o.status.success());
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(err.contains(&bad.display().to_string()), "{err}");
    assert!(err.contains("line 4, column `supply_c`"), "{err}");
    assert!(err.contains("\"warm\""), "{err}");
    assert!(!out.exists(), "nothing written for a bad trace");

    let headless = dir.path().join("headless.csv");
    std::fs::write(&headless, CSV.replace(",caps\n", "\n")).unwrap();
    let err = String::from_utf8(plot(&headless, None, &out).stderr).unwrap();
    assert!(err.contains("no `caps` column"), "{err}");

    let good = dir.path().join("good.csv");
    std::fs::write(&good, CSV).unwrap();
    let json = dir.path().join("s.json");
    std::fs::write(&json, "{\n  \"pue\": 1.2,\n  oops\n}").unwrap();
    let o = plot(&good, Some(&json), &out);
    assert!(!o.status.success());
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(err.contains(&json.display().to_string()), "{err}");
    assert!(err.contains("line 3"), "{err}");

    let missing = dir.path().join("nope.csv");
    let err = String::from_utf8(plot(&missing, None, &out).stderr).unwrap();
    assert!(err.contains("nope.csv"), "{err}");
}

#[test]
fn no_subcommand_is_a_usage_error() {
    let o = hall(&[]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(err.contains("plot"), "{err}");
}

/// A short scenario: a job starts on 4 hosts, the controller takes over.
const SHORT: &str = include_str!("scenarios/short.toml");

/// `play --headless --speed 5` of `scenario` into `out`.
fn play_headless(scenario: &Path, out: &Path) -> Output {
    hall(&[
        "play".as_ref(),
        "--headless".as_ref(),
        "--speed".as_ref(),
        "5".as_ref(),
        "--scenario".as_ref(),
        scenario.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
    ])
}

/// `play`, headless, says first what runs, ends without an ERROR line
/// (the agents and the controller leave the embedded broker in order),
/// and its report opens with the run against both baselines.
#[test]
fn play_says_what_runs_and_ends_without_error_lines() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("short.toml");
    std::fs::write(&scenario, SHORT).unwrap();
    let out = dir.path().join("run");
    let o = play_headless(&scenario, &out);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    let first = stdout.lines().next().unwrap_or("");
    for part in [
        "short: one simulated hall, 4 hosts (32 GPUs), one CDU",
        "the embedded MQTT broker at 127.0.0.1:",
        "speed ×5 (45 s of scenario in about 9 s)",
        &format!("results in {}/", out.display()),
    ] {
        assert!(
            first.contains(part),
            "{part:?} not in the first line: {first}"
        );
    }
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(errors.is_empty(), "ERROR lines:\n{}", errors.join("\n"));
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    let result = md
        .split("\n## ")
        .nth(1)
        .unwrap_or_else(|| panic!("no section:\n{md}"));
    assert!(result.starts_with("Result\n"), "{md}");
    for run in ["this run: ours (live)", "baseline-18", "baseline-32"] {
        let row = result
            .lines()
            .find(|l| l.starts_with(&format!("| {run}")))
            .unwrap_or_else(|| panic!("no row for {run}:\n{result}"));
        let numbers = row
            .split('|')
            .filter_map(|c| c.trim().parse::<f64>().ok())
            .filter(|v| *v > 0.0)
            .count();
        assert_eq!(numbers, 2, "PUE and energy per work: {row}");
    }
}

/// A second `play` into the same folder starts from fresh agents: the
/// first run's flash files would bring back its quarantine at the start
/// of the second (regression: a GPU "quarantined" at t=5 s, before its
/// fault).
#[test]
fn a_second_play_in_the_same_folder_starts_from_fresh_agents() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("fault.toml");
    let fault = "\n[[fault]]\nat_s = 25\nkind = \"gpu_fail\"\ntarget = \"0.1.5\"\n";
    std::fs::write(&scenario, format!("{SHORT}{fault}")).unwrap();
    let out = dir.path().join("run");
    for run in 1..=2 {
        let o = play_headless(&scenario, &out);
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "run {run}: {stdout}");
        let quarantined_at: Vec<f64> = stdout
            .lines()
            .filter(|l| l.contains("GPU 5 quarantined"))
            .filter_map(|l| l.trim().strip_prefix("t=")?.split('s').next()?.parse().ok())
            .collect();
        assert!(
            !quarantined_at.is_empty() && quarantined_at.iter().all(|t| *t >= 24.0),
            "run {run}: GPU 5 quarantined at {quarantined_at:?} s, its fault is at 25 s:\n{stdout}"
        );
    }
}
