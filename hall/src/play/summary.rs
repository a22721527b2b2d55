//! The run's figures for the report, built from the hall's own summary,
//! and the hottest GPU of a trace row.
//!
//! Glossary:
//! - *hall summary*: [`loopwarden_twin::sim::Summary`], the figures
//!   `cooling-ctrl simulate` prints (energy, PUE, work, the hottest GPU,
//!   time above 87 °C, HW slowdowns, thermal shutdowns, failsafe, leaks).
//! - *report summary*: the JSON object the report's tables read: the hall
//!   summary with the live run's own figures added.

use loopwarden_twin::plant::GpuState;
use loopwarden_twin::sim::Summary;
use serde_json::{Map, Value};

/// What the live run adds to the hall summary.
pub(crate) struct LiveFigures<'a> {
    /// Whole simulated seconds played.
    pub played_s: u64,
    /// Why the run stopped short, when it did.
    pub note: Option<String>,
    /// Hosts whose telemetry the observer received.
    pub hosts_heard: usize,
    /// GPUs the agents quarantined.
    pub quarantined: usize,
    /// Racks the controller declared lost.
    pub racks_lost: usize,
    /// The baselines' figures ([`crate::compare::baselines_json`]).
    pub baselines: &'a Value,
}

/// The report summary of a live run: every field of the hall summary `s`
/// (thermal shutdowns, the hottest GPU, time above 87 °C and the rest),
/// the controller named as live, the length played, and `live`'s figures.
pub(crate) fn report_summary(s: &Summary, live: &LiveFigures<'_>) -> Value {
    let mut m = match serde_json::to_value(s) {
        Ok(Value::Object(m)) => m,
        // A struct of numbers and strings always serialises to an object;
        // were it not, the report still carries what the run adds.
        _ => Map::new(),
    };
    m.insert(
        "controller".into(),
        format!("{} (live)", s.controller).into(),
    );
    m.insert("duration_s".into(), live.played_s.into());
    m.insert("hosts_heard".into(), live.hosts_heard.into());
    m.insert("quarantined".into(), live.quarantined.into());
    m.insert("racks_lost".into(), live.racks_lost.into());
    if let Some(note) = &live.note {
        m.insert("note".into(), note.clone().into());
    }
    m.insert(crate::report::BASELINES.into(), live.baselines.clone());
    Value::Object(m)
}

/// The hottest GPU junction of the hall, °C, over every GPU, shut down or
/// not, as `cooling-ctrl simulate`'s trace takes it; `None` with no GPU.
pub(crate) fn hottest(gpus: &[GpuState]) -> Option<f64> {
    gpus.iter().map(|g| g.t_j).reduce(f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceRow;

    fn hall_summary() -> Summary {
        Summary {
            scenario: "chiller-trip".into(),
            controller: "ours".into(),
            duration_s: 1800,
            it_kwh: 50.0,
            facility_kwh: 60.0,
            pue: 1.2,
            work_gpu_h: 100.0,
            kwh_per_work_gpu_h: 0.6,
            max_gpu_temp_c: 97.3,
            gpu_s_above_max_operating: 420,
            slowdown_episodes: 3,
            shutdowns: 2,
            cap_requests: 10,
            failsafe_s: 30,
            leaks: 1,
            leak_pumped_s: 4,
            pump_switchovers: 0,
            valve_reopened_unattended: 0,
            leak_sensing_alarms: 0,
            controller_restarts: 0,
            valve_feedback_alarms: 0,
        }
    }

    fn gpu(t_j: f64, shut_down: bool) -> GpuState {
        GpuState {
            t_j,
            t_in: 30.0,
            power: 0.0,
            work: 0.0,
            demand: 0.0,
            limit: 700.0,
            slowdown: false,
            shut_down,
            powered_down: false,
        }
    }

    #[test]
    fn the_live_report_shows_the_halls_shutdowns_and_hottest_gpu() {
        let baselines = serde_json::json!({});
        let live = LiveFigures {
            played_s: 1799,
            note: None,
            hosts_heard: 16,
            quarantined: 1,
            racks_lost: 0,
            baselines: &baselines,
        };
        let v = report_summary(&hall_summary(), &live);
        let row = TraceRow {
            t_s: 0.0,
            ambient_c: 20.0,
            setpoint_c: 30.0,
            supply_c: 30.0,
            return_c: 40.0,
            flow_lpm: 100.0,
            pump_speed: 1.0,
            max_gpu_c: Some(80.0),
            it_kw: 100.0,
            facility_kw: 120.0,
            caps: 0,
            quarantined: None,
        };
        let md = crate::report::markdown("run", &[row], v.as_object());
        for line in [
            "| thermal shutdowns | 2 |  | `shutdowns` |",
            "| hottest GPU | 97.3 | °C | `max_gpu_temp_c` |",
            "| GPU time above 87 °C | 420 | GPU-s | `gpu_s_above_max_operating` |",
            "| HW slowdown episodes | 3 |  | `slowdown_episodes` |",
            "| time in failsafe | 30 | s | `failsafe_s` |",
            "| leaks | 1 |  | `leaks` |",
            "| controller | ours (live) |  | `controller` |",
            "| duration | 1799 | s | `duration_s` |",
            "| hosts_heard | 16 |  | `hosts_heard` |",
        ] {
            assert!(md.contains(line), "no {line:?} in\n{md}");
        }
    }

    #[test]
    fn the_hottest_gpu_counts_a_shut_down_gpu_and_is_absent_without_gpus() {
        assert_eq!(hottest(&[gpu(70.0, false), gpu(96.0, true)]), Some(96.0));
        assert_eq!(hottest(&[gpu(96.0, true), gpu(96.5, true)]), Some(96.5));
        assert_eq!(hottest(&[]), None);
    }
}
