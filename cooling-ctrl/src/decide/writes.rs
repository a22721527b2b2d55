//! The core's commands as the CDU's settings, in safety order, each
//! written on its own: the rack valves, the pumps to run, the lead pump,
//! then the heartbeat (only when every safety write that was due went
//! in: it tells the CDU that the controller is alive *and* in charge),
//! then the pump speed and the setpoint. A setting outside the register
//! map's range is written at the map's nearest bound and reported
//! ([`Event::SettingLimited`], once when it begins and once when it
//! ends); it never holds back another write.
//!
//! Glossary:
//! - *safety writes*: the valves, the pumps to run and the lead pump.
//! - *map limits*: the ranges the register map gives the writable
//!   settings ([`MapLimits`]).

use std::format;
use std::string::String;
use std::vec::Vec;

use cooling_core::{Commands, CoreConfig};
use loopwarden_boards::modbus_map::{Kind, RegisterMap};
use loopwarden_protocol::message::{CduSetting, Event, Pump};

/// A CDU setting the controller writes, in the order written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

    /// Its holding register's name in a register map.
    pub fn register(self) -> &'static str {
        match self {
            Setting::Valves => "valves_open",
            Setting::PumpsRun => "pumps_run",
            Setting::LeadPump => "lead_pump",
            Setting::Heartbeat => "heartbeat",
            Setting::PumpSpeed => "pump_speed",
            Setting::Setpoint => "supply_setpoint",
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

/// What a register map says of the settings: which it has, the ranges of
/// the setpoint and the pump speed, and whether the CDU reports its valve
/// positions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MapLimits {
    /// Per [`Setting::ORDER`]: the map has it as a holding register.
    pub mapped: [bool; 6],
    /// The setpoint's range, °C.
    pub setpoint_c: Option<(f64, f64)>,
    /// The pump speed's range, %.
    pub speed_pct: Option<(f64, f64)>,
    /// The map reads the valve positions (`valves_closed`).
    pub positions: bool,
}

impl MapLimits {
    /// The limits of `map`.
    pub fn of(map: &RegisterMap) -> Self {
        let holding = |name: &str| map.get(name).filter(|r| r.kind == Kind::Holding);
        let range = |s: Setting| holding(s.register()).and_then(|r| r.min.zip(r.max));
        Self {
            mapped: Setting::ORDER.map(|s| holding(s.register()).is_some()),
            setpoint_c: range(Setting::Setpoint),
            speed_pct: range(Setting::PumpSpeed),
            positions: map.get("valves_closed").is_some(),
        }
    }

    fn has(&self, s: Setting) -> bool {
        Setting::ORDER
            .iter()
            .position(|o| *o == s)
            .is_some_and(|i| self.mapped[i])
    }
}

/// The core's configuration `cfg` held to the map's ranges: where the map
/// is tighter than the core's own limits (the lowest and highest
/// setpoint, the lowest pump speed), the map's wins. Returns each change
/// in words, for the log at start.
pub fn tighten(cfg: &mut CoreConfig, lim: &MapLimits) -> Vec<String> {
    let mut said = Vec::new();
    let c = &mut cfg.cdu;
    if let Some((lo, hi)) = lim.setpoint_c {
        let (lo, hi) = (lo as f32, hi as f32);
        if lo > c.min_setpoint_c {
            said.push(format!(
                "lowest setpoint {:.1} °C (the site's dew point allows {:.1} °C, the CDU's register map takes no less than {lo:.1} °C)",
                lo, c.min_setpoint_c
            ));
            c.min_setpoint_c = lo;
        }
        if hi < c.max_setpoint_c {
            said.push(format!(
                "highest setpoint {hi:.1} °C (configured {:.1} °C, the CDU's register map takes no more)",
                c.max_setpoint_c
            ));
            c.max_setpoint_c = hi;
        }
    }
    if let Some((lo, _)) = lim.speed_pct {
        let lo = (lo / 100.0) as f32;
        if lo > c.min_speed {
            said.push(format!(
                "lowest pump speed {:.0} % (configured {:.0} %, the CDU's register map takes no less)",
                lo * 100.0,
                c.min_speed * 100.0
            ));
            c.min_speed = lo;
        }
    }
    said
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
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// The writes; a setting the map lacks, or the valves while they are
    /// held, is not among them.
    pub writes: Vec<Write>,
}

impl Plan {
    /// The value planned for `s`, if it is written.
    pub fn value(&self, s: Setting) -> Option<f64> {
        self.writes.iter().find(|w| w.setting == s).map(|w| w.value)
    }
}

/// What became of a step's writes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Outcome {
    /// Each write tried, with the CDU's answer (`Err`: why it failed).
    pub tried: Vec<(Setting, Result<(), String>)>,
}

impl Outcome {
    /// Every write of the plan went in (or the plan had none to fail).
    pub fn all_ok(&self) -> bool {
        self.tried.iter().all(|(_, r)| r.is_ok())
    }

    /// Whether `w` is to be written now, after what was tried: the
    /// heartbeat only when no safety write failed.
    pub fn due(&self, w: &Write) -> bool {
        w.setting != Setting::Heartbeat || self.tried.iter().all(|(s, r)| !s.safety() || r.is_ok())
    }

    /// Records the CDU's answer to `s`.
    pub fn record(&mut self, s: Setting, r: Result<(), String>) {
        self.tried.push((s, r));
    }

    /// The first failure, in words.
    pub fn first_error(&self) -> Option<String> {
        self.tried
            .iter()
            .find_map(|(s, r)| r.as_ref().err().map(|e| format!("{}: {e}", s.register())))
    }

    /// An outcome in which every write of `plan` went in (`ok`) or none
    /// did: a CDU that takes a step's writes together, as the twin's.
    pub fn whole(plan: &Plan, ok: bool) -> Self {
        let r = || {
            if ok {
                Ok(())
            } else {
                Err("not taken".into())
            }
        };
        Self {
            tried: plan.writes.iter().map(|w| (w.setting, r())).collect(),
        }
    }
}

/// Turns commands into a [`Plan`] and reports the settings the map limits.
#[derive(Debug, Clone, Default)]
pub struct Limiter {
    /// Per clamped setting (setpoint, speed): the limit in force now, as
    /// (wanted, written).
    limited: [Option<(f64, f64)>; 2],
    /// Writes that were limited, since the start.
    pub count: u64,
}

impl Limiter {
    /// The plan for commands `c`: `valves` (`None`: held, not written),
    /// this step's `heartbeat`, the setpoint and speed held to `lim`
    /// (rounded to 0.01 °C and 0.1 %). A limit that begins or ends is
    /// pushed onto `events`.
    pub fn plan(
        &mut self,
        c: &Commands,
        valves: Option<u16>,
        heartbeat: u16,
        lim: &MapLimits,
        events: &mut Vec<Event>,
    ) -> Plan {
        let setpoint = (f64::from(c.setpoint_c) * 100.0).round() / 100.0;
        let speed = (f64::from(c.pump_speed) * 1000.0).round() / 10.0;
        let setpoint = self.held(0, setpoint, lim.setpoint_c, events);
        let speed = self.held(1, speed, lim.speed_pct, events);
        let values = [
            valves.map(f64::from),
            Some(f64::from(
                u8::from(c.pump_on[0]) | (u8::from(c.pump_on[1]) << 1),
            )),
            Some(if c.lead == Pump::B { 1.0 } else { 0.0 }),
            Some(f64::from(heartbeat)),
            Some(speed),
            Some(setpoint),
        ];
        let writes = Setting::ORDER
            .iter()
            .zip(values)
            .filter(|(s, _)| lim.has(**s))
            .filter_map(|(s, v)| v.map(|value| Write { setting: *s, value }))
            .collect();
        Plan { writes }
    }

    /// `wanted` held to `range`; a limit that begins or ends is reported.
    fn held(
        &mut self,
        i: usize,
        wanted: f64,
        range: Option<(f64, f64)>,
        events: &mut Vec<Event>,
    ) -> f64 {
        let written = range.map_or(wanted, |(lo, hi)| wanted.clamp(lo, hi));
        let setting = if i == 0 {
            CduSetting::SupplySetpoint
        } else {
            CduSetting::PumpSpeed
        };
        let centi = |v: f64| (v * 100.0).round() as i32;
        let now = (written != wanted).then_some((wanted, written));
        if now.is_some() {
            self.count += 1;
        }
        if now.is_some() != self.limited[i].is_some() {
            events.push(Event::SettingLimited {
                setting,
                wanted_centi: centi(wanted),
                written_centi: centi(written),
                active: now.is_some(),
            });
        }
        self.limited[i] = now;
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands(setpoint_c: f32, speed: f32) -> Commands {
        let mut c = cooling_core::Core::new(CoreConfig::default())
            .unwrap()
            .step(&cooling_core::Inputs {
                now_ms: 0,
                cdu: None,
                ambient_c: None,
                leaks: cooling_core::LeakInputs::DRY,
                cdu_writes_ok: true,
                hosts: &[],
            });
        c.setpoint_c = setpoint_c;
        c.pump_speed = speed;
        c
    }

    #[test]
    fn a_setpoint_outside_the_map_is_held_to_it_and_the_valves_still_go_first() {
        let lim = MapLimits::of(&RegisterMap::sim_cdu());
        assert_eq!(lim.setpoint_c, Some((17.0, 45.0)));
        let mut l = Limiter::default();
        let mut ev = Vec::new();
        let p = l.plan(&commands(14.0, 0.5), Some(0b0111), 9, &lim, &mut ev);
        let order: Vec<Setting> = p.writes.iter().map(|w| w.setting).collect();
        assert_eq!(order, Setting::ORDER.to_vec());
        assert_eq!(p.value(Setting::Valves), Some(7.0));
        assert_eq!(p.value(Setting::Setpoint), Some(17.0));
        assert_eq!(p.value(Setting::PumpSpeed), Some(50.0));
        assert!(matches!(
            ev.as_slice(),
            [Event::SettingLimited {
                setting: CduSetting::SupplySetpoint,
                wanted_centi: 1400,
                written_centi: 1700,
                active: true
            }]
        ));
        // Still limited: no new event; back inside: one.
        l.plan(&commands(15.0, 0.5), Some(0), 10, &lim, &mut ev);
        assert_eq!(ev.len(), 1);
        l.plan(&commands(20.0, 0.5), None, 11, &lim, &mut ev);
        assert_eq!(ev.len(), 2);
        assert_eq!(l.count, 2);
        let held = l.plan(&commands(20.0, 0.5), None, 12, &lim, &mut ev);
        assert_eq!(
            held.value(Setting::Valves),
            None,
            "held valves are not written"
        );
    }

    #[test]
    fn the_heartbeat_waits_for_the_safety_writes_and_nothing_else() {
        let hb = Write {
            setting: Setting::Heartbeat,
            value: 1.0,
        };
        let mut o = Outcome::default();
        o.record(Setting::Valves, Ok(()));
        o.record(Setting::PumpsRun, Ok(()));
        assert!(o.due(&hb));
        o.record(Setting::Setpoint, Err("exception 3".into()));
        assert!(o.due(&hb), "a refused setpoint does not stop the heartbeat");
        o.record(Setting::Valves, Err("exception 4".into()));
        assert!(!o.due(&hb), "a refused valve write does");
        assert!(!o.all_ok());
        assert_eq!(
            o.first_error().as_deref(),
            Some("supply_setpoint: exception 3")
        );
    }

    #[test]
    fn the_core_is_held_to_the_tighter_of_its_limits_and_the_maps() {
        let lim = MapLimits::of(&RegisterMap::sim_cdu());
        let mut cfg = CoreConfig::default();
        cfg.cdu.min_setpoint_c = 13.0;
        let said = tighten(&mut cfg, &lim);
        assert_eq!(cfg.cdu.min_setpoint_c, 17.0);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].contains("dew point"), "{}", said[0]);
        let mut again = cfg;
        assert!(tighten(&mut again, &lim).is_empty());
    }
}
