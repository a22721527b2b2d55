//! The reference controllers that stand for today's practice: a fixed
//! setpoint (`baseline-18`, `baseline-32`), pumps at 100 % on the lead
//! pump, every valve open, no caps (`docs/plant-model.md` §7).

use super::{Controller, Decision, Readings};

/// A fixed setpoint, pumps at 100 % on the lead pump, valves open, no
/// caps, nothing else: `baseline-18` and `baseline-32`.
pub struct Baseline {
    name: String,
    setpoint_c: f64,
    racks: usize,
}

impl Baseline {
    /// A baseline at `setpoint_c` for `racks` racks.
    pub fn new(setpoint_c: f64, racks: usize) -> Self {
        Self {
            name: format!("baseline-{setpoint_c:.0}"),
            setpoint_c,
            racks,
        }
    }
}

impl Controller for Baseline {
    fn name(&self) -> &str {
        &self.name
    }
    fn step(&mut self, _: &Readings) -> Decision {
        Decision {
            setpoint_c: self.setpoint_c,
            pump_speed: 1.0,
            pump_on: [true, false],
            valves: vec![true; self.racks],
            host_caps: Vec::new(),
            rack_cooling_lost: vec![false; self.racks],
            failsafe: false,
            heartbeat: false,
            leak_sensing_lost: Vec::new(),
            hold_valves: false,
            valve_feedback_alarms: Vec::new(),
        }
    }
}
