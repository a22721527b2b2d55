//! `cooling-ctrl simulate` as a process: a scenario file in, one JSON
//! object out.

#![cfg(feature = "twin")]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cooling-ctrl");

const SCENARIO: &str = r#"
format = "plant-scenario/1"
description = "short: idle, then a job"
duration_s = 900
seed = 2
[site]
racks = 1
[ambient]
points = [[0, 18.0], [900, 20.0]]
[load]
all = [[0, 0.1], [300, 0.9]]
"#;

fn simulate(controller: &str, scenario: &str) -> std::process::Output {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("short.toml");
    std::fs::write(&path, scenario).expect("write scenario");
    Command::new(BIN)
        .args(["simulate", "--controller", controller, "--scenario"])
        .arg(&path)
        .output()
        .expect("run cooling-ctrl")
}

#[test]
fn prints_the_figures_of_a_run_as_one_json_object() {
    let out = simulate("baseline-18", SCENARIO);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for key in [
        "scenario",
        "controller",
        "duration_s",
        "it_kwh",
        "facility_kwh",
        "pue",
        "work_gpu_h",
        "kwh_per_work_gpu_h",
        "max_gpu_temp_c",
        "gpu_s_above_max_operating",
        "slowdown_episodes",
        "shutdowns",
        "cap_requests",
        "failsafe_s",
        "leaks",
        "leak_pumped_s",
    ] {
        assert!(v.get(key).is_some(), "{key} missing from {v}");
    }
    assert_eq!(v["scenario"], "short");
    assert_eq!(v["controller"], "baseline-18");
    assert_eq!(v["duration_s"], 900);
    assert!(v["pue"].as_f64().unwrap() > 1.0);
}

#[test]
fn ours_runs_the_control_core_and_unknown_controllers_are_refused() {
    let out = simulate("ours", SCENARIO);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["controller"], "ours", "{v}");
    assert!(
        v.get("note").is_none(),
        "the core runs, not a stand-in: {v}"
    );
    assert_eq!(v["shutdowns"], 0, "{v}");
    let out = simulate("nobody", SCENARIO);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("oracle"));
    let out = simulate(
        "baseline-18",
        &SCENARIO.replace("duration_s = 900", "duration_s = 0"),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("duration_s"));
}

#[test]
fn the_oracle_runs_and_spends_no_more_per_work_than_the_baselines() {
    let figures = |controller: &str| {
        let out = simulate(controller, SCENARIO);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(v["controller"], controller);
        assert!(v.get("note").is_none(), "{v}");
        v
    };
    let oracle = figures("oracle");
    assert_eq!(oracle["shutdowns"], 0);
    assert_eq!(oracle["failsafe_s"], 0);
    for baseline in ["baseline-18", "baseline-32"] {
        let b = figures(baseline);
        assert!(
            oracle["kwh_per_work_gpu_h"].as_f64().unwrap()
                <= b["kwh_per_work_gpu_h"].as_f64().unwrap(),
            "oracle {oracle} vs {b}"
        );
    }
}
