//! What a step is given from below: the CDU's measurements as its
//! register map decodes them ([`CduMeasurements`]), the board's leak
//! lines ([`BoardRead`]) and the outdoor temperature ([`StepIn`]), and how
//! they become the core's inputs ([`core_readings`], [`leak_inputs`]).
//!
//! Glossary:
//! - *board read*: what the controller board's leak lines gave this step.
//! - *measurement*: a CDU register decoded with the map's scale; `None`
//!   where the map of this CDU model has no such register.

use cooling_core::{CduReadings, LeakInputs};
use serde::{Deserialize, Serialize};

/// What the CDU measures, decoded with the map's scale. `None`: the map of
/// this CDU model has no such register.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct CduMeasurements {
    /// Secondary supply temperature, °C (`supply_temp`).
    pub supply_c: Option<f64>,
    /// Secondary return temperature, °C (`return_temp`).
    pub return_c: Option<f64>,
    /// Secondary flow, L/min (`flow`).
    pub flow_lpm: Option<f64>,
    /// Facility water supply temperature, °C (`facility_supply_temp`).
    pub facility_supply_c: Option<f64>,
    /// Pump A and B contactor feedback (`pump_a_running`, `pump_b_running`).
    pub pumps_running: [Option<bool>; 2],
    /// Leak inputs, bit n = rack n (`leak_inputs`).
    pub leaks: Option<u16>,
    /// Loop differential pressure, kPa (`diff_pressure`).
    pub diff_pressure_kpa: Option<f64>,
    /// Rack valves reading closed, bit n = rack n (`valves_closed`).
    pub valves_closed: Option<u16>,
    /// Pump A and B drive or overload fault (`pump_a_fault`,
    /// `pump_b_fault`).
    pub pump_faults: [Option<bool>; 2],
    /// IT power meter, W (`it_power`).
    pub it_w: Option<f64>,
    /// Cooling plant power meter, W (`cooling_power`).
    pub cooling_w: Option<f64>,
    /// Facility power meter, W (`facility_power`).
    pub facility_w: Option<f64>,
    /// Outdoor air temperature, °C (`outdoor_temp`: the dry cooler's
    /// sensor as the CDU reports it; a lost one reads far outside any
    /// air's range, which the shell refuses).
    pub outdoor_c: Option<f64>,
}

/// What the board's leak lines gave this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BoardRead {
    /// No board: the CDU's leak register is the only leak input.
    Absent,
    /// Read: ropes wet and ropes whose supervision reports a fault, bit n
    /// = rack n.
    Read {
        /// Ropes wet.
        wet: u16,
        /// Ropes cut or shorted.
        faults: u16,
    },
    /// The read failed: nothing is known of the ropes.
    Failed,
}

/// What a step is given besides the CDU and the hosts' reports (heard
/// between steps: [`crate::Decider::hear_host`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepIn {
    /// Now, ms on the process's monotonic clock.
    pub now_ms: u64,
    /// What the board's leak lines gave.
    pub board: BoardRead,
    /// The outdoor temperature as measured, °C.
    pub ambient_c: Option<f32>,
}

/// The core's leak inputs from the board and the CDU's leak register
/// (`cdu`; `None`: not read this step). Each input counts on its own.
pub fn leak_inputs(board: BoardRead, cdu: Option<u16>) -> LeakInputs {
    match board {
        BoardRead::Read { wet, faults } => LeakInputs {
            wet,
            rope_faults: faults,
            read_ok: true,
            cdu,
        },
        BoardRead::Failed => LeakInputs {
            wet: 0,
            rope_faults: 0,
            read_ok: false,
            cdu,
        },
        // The CDU's register stands in for the ropes: while it does not
        // answer, leak sensing is lost.
        BoardRead::Absent => LeakInputs {
            wet: 0,
            rope_faults: 0,
            read_ok: cdu.is_some(),
            cdu,
        },
    }
}

/// The core's readings from the CDU's.
pub fn core_readings(r: &CduMeasurements) -> CduReadings {
    let f = |x: Option<f64>| x.map(|v| v as f32);
    CduReadings {
        supply_c: f(r.supply_c),
        return_c: f(r.return_c),
        flow_lpm: f(r.flow_lpm),
        facility_supply_c: f(r.facility_supply_c),
        pumps_running: r.pumps_running.map(|p| p.unwrap_or(false)),
        pump_faults: r.pump_faults.map(|p| p.unwrap_or(false)),
        diff_pressure_kpa: f(r.diff_pressure_kpa),
        valves_closed: r.valves_closed,
        it_w: f(r.it_w),
        facility_w: f(r.facility_w),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_board_the_cdus_register_is_the_leak_input() {
        let l = leak_inputs(BoardRead::Absent, Some(0b0100));
        assert!(l.read_ok && l.reads_wet(2) && !l.reads_wet(1));
        let l = leak_inputs(BoardRead::Absent, None);
        assert!(!l.read_ok, "a silent CDU without a board is sensing lost");
        let l = leak_inputs(BoardRead::Failed, Some(0b0001));
        assert!(!l.read_ok && l.reads_wet(0), "a failed board masks nothing");
    }
}
