//! The faults of `docs/plant-model.md` §8.1 and §8.4 played through the real
//! controller shell (`play`, headless, in real time): a leak isolated and
//! kept shut across a restart whose newest latched record is damaged and
//! whose CDU is silent at first, a leak the CDU's own input sees while the
//! board's inputs fail, and a valve position input that lies. The run's
//! summary (`docs/plant-model.md` §8.3, what `play --json` prints) says what
//! happened, figured as `simulate` figures it.

use loopwarden_hall::play::{play, PlayConfig};
use loopwarden_twin::scenario::Scenario;

const FAULTS: &str = r#"
format = "plant-scenario/1"
description = "a leak kept shut across a damaged latch and a silent CDU, a leak seen while the board fails, a lying valve input"
duration_s = 60
seed = 9
[site]
racks = 4
hosts_per_rack = 1
[ambient]
points = [[0, 22.0], [60, 22.0]]
[load]
all = [[0, 0.6], [60, 0.6]]

[[fault]]
at_s = 3
kind = "valve_feedback_stuck"
target = "3"
value = 1.0

[[fault]]
at_s = 8
until_s = 18
kind = "leak"
target = "1"

[[fault]]
at_s = 22
kind = "latch_corrupt"

[[fault]]
at_s = 22
kind = "controller_restart"
value = 3.0

[[fault]]
at_s = 22
until_s = 30
kind = "modbus_outage"

[[fault]]
at_s = 34
until_s = 56
kind = "board_io_fault"

[[fault]]
at_s = 38
kind = "leak"
target = "0"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaks_stay_isolated_through_a_damaged_latch_a_failed_board_and_a_lying_valve_input() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Scenario::from_toml(FAULTS, "faults.toml").unwrap();
    let out = play(PlayConfig::headless(scenario, "faults", dir.path()))
        .await
        .expect("the run completes");
    let s = out.summary.expect("a summary");
    eprintln!("{}", serde_json::to_string(&s).unwrap());
    assert_eq!(s.leaks, 2);
    assert_eq!(s.controller_restarts, 1);
    // Each leak closed within a step or two of the second it began.
    assert!(s.leak_pumped_s <= 4, "{s:?}");
    assert_eq!(s.valve_reopened_unattended, 0, "{s:?}");
    assert_eq!(s.valve_feedback_alarms, 1, "{s:?}");
    assert!(s.leak_sensing_alarms >= 1, "the failed board: {s:?}");
    assert_eq!(s.shutdowns, 0);
    assert_eq!(s.duration_s, 60);
    // The restarted controller found its newest record damaged, and
    // latched again what the valves said.
    assert!(
        out.events.iter().any(|e| e.contains("rack 1")),
        "{:?}",
        out.events
    );
}
