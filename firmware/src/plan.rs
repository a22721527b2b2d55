//! A step's writes: the core's commands as the CDU's settings, in the
//! Linux controller's order (`cooling_ctrl::decide::writes`), each written
//! on its own: the rack valves, the pumps to run, the lead pump, then the
//! heartbeat (only when every safety write went in: it tells the CDU the
//! controller is alive *and* in charge), then the pump speed and the
//! setpoint. The setpoint and the speed are rounded to the register's
//! resolution and held to the map's range; a failed write never holds
//! back the next. (The decision path moves to the shared `cooling-decide`
//! crate; this is the firmware's first step until it does.)
//!
//! Glossary:
//! - *safety writes*: the valves, the pumps to run and the lead pump.
//! - *heartbeat*: a value that changes every step; when it stops changing
//!   the CDU falls back to its own safe setpoint.

use core::fmt;

use cooling_core::Commands;
use loopwarden_protocol::message::Pump;

use crate::map::{self, Register, ValueError};
use crate::rtu::RtuError;

/// A CDU setting the controller writes, in the order written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// Rack valves open, bit n = rack n.
    Valves,
    /// Pumps to run, bit 0 A, bit 1 B.
    PumpsRun,
    /// The lead pump, 0 A, 1 B.
    LeadPump,
    /// A value that changes every step.
    Heartbeat,
    /// Pump speed command, %.
    PumpSpeed,
    /// Supply temperature setpoint, °C.
    Setpoint,
}

impl Setting {
    /// Every setting, in the order written.
    pub const ORDER: [Setting; 6] = [
        Setting::Valves,
        Setting::PumpsRun,
        Setting::LeadPump,
        Setting::Heartbeat,
        Setting::PumpSpeed,
        Setting::Setpoint,
    ];

    /// Its holding register in the map.
    pub fn register(self) -> &'static Register {
        match self {
            Setting::Valves => map::VALVES_OPEN,
            Setting::PumpsRun => map::PUMPS_RUN,
            Setting::LeadPump => map::LEAD_PUMP,
            Setting::Heartbeat => map::HEARTBEAT,
            Setting::PumpSpeed => map::PUMP_SPEED,
            Setting::Setpoint => map::SUPPLY_SETPOINT,
        }
    }

    /// A safety write: the heartbeat waits for it.
    pub fn safety(self) -> bool {
        matches!(
            self,
            Setting::Valves | Setting::PumpsRun | Setting::LeadPump
        )
    }
}

/// One setting to write.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Write {
    /// Which.
    pub setting: Setting,
    /// Its value in the register's unit.
    pub value: f64,
}

/// A step's writes, in the order of [`Setting::ORDER`].
pub type Plan = [Write; 6];

/// `v` held to register `r`'s range.
fn held(r: &Register, v: f64) -> f64 {
    match (r.min, r.max) {
        (Some(lo), Some(hi)) => v.clamp(lo, hi),
        _ => v,
    }
}

/// The writes for commands `c` with this step's `heartbeat`.
pub fn plan(c: &Commands, heartbeat: u16) -> Plan {
    let setpoint = map::round(f64::from(c.setpoint_c) * 100.0) / 100.0;
    let speed = map::round(f64::from(c.pump_speed) * 1000.0) / 10.0;
    let pumps = u8::from(c.pump_on[0]) | (u8::from(c.pump_on[1]) << 1);
    let values = [
        f64::from(c.valves_open),
        f64::from(pumps),
        if c.lead == Pump::B { 1.0 } else { 0.0 },
        f64::from(heartbeat),
        held(map::PUMP_SPEED, speed),
        held(map::SUPPLY_SETPOINT, setpoint),
    ];
    core::array::from_fn(|i| Write {
        setting: Setting::ORDER[i],
        value: values[i],
    })
}

/// Why a write did not go in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WriteFailure {
    /// The CDU or the line failed it.
    Rtu(RtuError),
    /// The value does not fit the register.
    Value(ValueError),
    /// Not sent: a safety write failed (the heartbeat only).
    Withheld,
    /// Not sent: the step's time ran out.
    OutOfTime,
}

impl fmt::Display for WriteFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriteFailure::Rtu(e) => write!(f, "{e}"),
            WriteFailure::Value(e) => write!(f, "{e}"),
            WriteFailure::Withheld => write!(f, "withheld: a safety write failed"),
            WriteFailure::OutOfTime => write!(f, "not sent: the step's time ran out"),
        }
    }
}

/// What became of a step's writes.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Each write tried, with the CDU's answer.
    pub tried: heapless::Vec<(Setting, Result<(), WriteFailure>), 6>,
}

impl Outcome {
    /// Every write of the plan went in.
    pub fn all_ok(&self) -> bool {
        self.tried.iter().all(|(_, r)| r.is_ok())
    }

    /// Whether `w` is to be written now, after what was tried: the
    /// heartbeat only when no safety write failed.
    pub fn due(&self, w: &Write) -> bool {
        w.setting != Setting::Heartbeat || self.tried.iter().all(|(s, r)| !s.safety() || r.is_ok())
    }

    /// Records what became of `s`.
    pub fn record(&mut self, s: Setting, r: Result<(), WriteFailure>) {
        // Six settings, six places.
        let _ = self.tried.push((s, r));
    }

    /// The first failure.
    pub fn first_error(&self) -> Option<(Setting, WriteFailure)> {
        self.tried
            .iter()
            .find_map(|(s, r)| r.err().map(|e| (*s, e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rtu::{Op, OpKind};
    use cooling_core::{Core, CoreConfig};

    fn commands(setpoint_c: f32, speed: f32) -> Commands {
        let mut c = Core::new(CoreConfig::default())
            .unwrap()
            .step(&cooling_core::Inputs {
                now_ms: 0,
                cdu: None,
                ambient_c: None,
                leaks: cooling_core::LeakInputs {
                    wet: 0,
                    rope_faults: 0,
                    read_ok: false,
                    cdu: None,
                },
                cdu_writes_ok: true,
                hosts: &[],
            });
        c.setpoint_c = setpoint_c;
        c.pump_speed = speed;
        c.valves_open = 0b1011;
        c.pump_on = [false, true];
        c.lead = Pump::B;
        c
    }

    #[test]
    fn the_writes_go_in_the_controllers_order_held_to_the_map() {
        let p = plan(&commands(12.345, 0.1234), 7);
        let order: [&str; 6] = p.map(|w| w.setting.register().name);
        assert_eq!(
            order,
            [
                "valves_open",
                "pumps_run",
                "lead_pump",
                "heartbeat",
                "pump_speed",
                "supply_setpoint"
            ]
        );
        let values: [f64; 6] = p.map(|w| w.value);
        // The setpoint below the map's 17 °C is written at 17; 12.3 % at the map's 30 %.
        assert_eq!(values, [11.0, 2.0, 1.0, 7.0, 30.0, 17.0]);
        let p = plan(&commands(30.126, 0.8234), 8);
        assert_eq!(p[4].value, 82.3);
        assert_eq!(p[5].value, 30.13);
    }

    #[test]
    fn the_heartbeat_waits_for_every_safety_write() {
        let p = plan(&commands(30.0, 0.8), 1);
        let mut o = Outcome::default();
        o.record(Setting::Valves, Ok(()));
        let op = Op {
            kind: OpKind::WriteSingle,
            unit: 1,
            address: 4,
            count: 1,
            first: "pumps_run",
            last: "pumps_run",
        };
        o.record(
            Setting::PumpsRun,
            Err(WriteFailure::Rtu(RtuError::Refused { op, code: 4 })),
        );
        o.record(Setting::LeadPump, Ok(()));
        assert!(!o.due(&p[3]));
        assert!(o.due(&p[4]), "the speed is written all the same");
        assert!(!o.all_ok());
        assert_eq!(o.first_error().map(|(s, _)| s), Some(Setting::PumpsRun));
        let mut o = Outcome::default();
        for s in [Setting::Valves, Setting::PumpsRun, Setting::LeadPump] {
            o.record(s, Ok(()));
        }
        assert!(o.due(&p[3]));
    }
}
