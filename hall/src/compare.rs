//! The run against the references: the same scenario, cut to the same
//! length, played in simulated time (a second of plant per step, as
//! `cooling-ctrl simulate` plays it) by `baseline-18` and `baseline-32`,
//! and their figures as the report reads them.
//!
//! Glossary:
//! - *baseline*: a fixed policy to compare against: the supply held at one
//!   temperature (18 °C, the usual vendor default; 32 °C, static warm
//!   water), pumps at full speed, no caps ([`loopwarden_twin::sim::Baseline`]).
//! - *energy per work*: facility kWh per GPU-hour of work at full speed
//!   (`kwh_per_work_gpu_h`), so that a run that caps or loses GPUs does
//!   not look cheaper for doing less.

use loopwarden_twin::scenario::Scenario;
use loopwarden_twin::sim::{self, Baseline, Summary};

/// The baselines' supply setpoints, °C.
pub const BASELINE_SETPOINTS_C: [f64; 2] = [18.0, 32.0];

/// Plays the first `duration_s` seconds of `sc` with each baseline, in
/// simulated time. A hall of several CDUs has no single-CDU baseline:
/// none then.
pub fn baselines(sc: &Scenario, duration_s: u64) -> std::io::Result<Vec<Summary>> {
    if sc.site.cdus > 1 {
        return Ok(Vec::new());
    }
    let mut cut = sc.clone();
    cut.duration_s = duration_s.min(sc.duration_s);
    BASELINE_SETPOINTS_C
        .iter()
        .map(|&sp| {
            let mut b = Baseline::new(sp, sc.site.racks);
            sim::run("baseline", &cut, &mut b, None, 1)
        })
        .collect()
}

/// The baselines as the summary carries them (`baselines`): per
/// controller name, its setpoint, PUE, energy and work.
pub fn baselines_json(runs: &[Summary]) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (s, sp) in runs.iter().zip(BASELINE_SETPOINTS_C) {
        m.insert(
            s.controller.clone(),
            serde_json::json!({
                "setpoint_c": sp,
                "pue": s.pue,
                "kwh_per_work_gpu_h": s.kwh_per_work_gpu_h,
                "facility_kwh": s.facility_kwh,
                "work_gpu_h": s.work_gpu_h,
            }),
        );
    }
    serde_json::Value::Object(m)
}

/// How much less `ours` spends than `base`, percent of `base` (negative:
/// more); `None` without a `base`.
pub fn saved_pct(ours: f64, base: f64) -> Option<f64> {
    (base > 0.0 && ours.is_finite()).then(|| (base - ours) / base * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHORT: &str = r#"
format = "plant-scenario/1"
description = "a warm job"
duration_s = 300
seed = 3
[site]
racks = 2
hosts_per_rack = 2
[ambient]
points = [[0, 30.0], [300, 30.0]]
[load]
all = [[0, 0.9], [300, 0.9]]
"#;

    #[test]
    fn both_baselines_play_the_cut_scenario() {
        let sc = Scenario::from_toml(SHORT, "short.toml").unwrap();
        let runs = baselines(&sc, 120).unwrap();
        let names: Vec<&str> = runs.iter().map(|s| s.controller.as_str()).collect();
        assert_eq!(names, ["baseline-18", "baseline-32"]);
        for s in &runs {
            assert_eq!(s.duration_s, 120);
            assert!(s.pue > 1.0 && s.kwh_per_work_gpu_h > 0.0, "{s:?}");
        }
        // Cold water costs the chiller more on a 30 °C day.
        assert!(runs[0].pue > runs[1].pue, "{runs:?}");
        let j = baselines_json(&runs);
        assert_eq!(j["baseline-32"]["setpoint_c"], 32.0);
        assert_eq!(j["baseline-18"]["pue"], runs[0].pue);
    }

    #[test]
    fn savings_are_a_share_of_the_baseline() {
        assert_eq!(saved_pct(0.9, 1.0).map(|p| p.round()), Some(10.0));
        assert_eq!(saved_pct(1.1, 1.0).map(|p| p.round()), Some(-10.0));
        assert_eq!(saved_pct(1.0, 0.0), None);
    }
}
