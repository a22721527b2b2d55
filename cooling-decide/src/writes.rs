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
//! - *asked*: what of a step's commands the writes are made of
//!   ([`Asked`]).
//! - *safety writes*: the valves, the pumps to run and the lead pump.
//! - *map limits*: the ranges the register map gives the writable
//!   settings ([`MapLimits`]).
//! - *heartbeat count*: the number of heartbeats sent since the start;
//!   a step plans the one past the last sent ([`Outcome::heartbeat_sent`]),
//!   the shell writes it within the register's range.
//! - *unsure*: a write gone in on its echo alone that is not known taken
//!   (the CDU did not take the setting's last write, and no read-back has
//!   read it held since): taken setting by setting, but not every write
//!   is ([`Outcome::unsure`]).

use core::fmt::{self, Display};

use cooling_core::{Commands, ConfigError, CoreConfig};
use heapless::Vec;
use loopwarden_protocol::message::{CduSetting, Event, Pump};
use serde::{Deserialize, Serialize};

use crate::float::round;
use crate::said::{words, Said, Words};

/// The most writes of a step: one per setting.
pub const MAX_WRITES: usize = Setting::ORDER.len();
/// The events of the decision path held until taken.
pub const EVENTS: usize = 8;
/// The events of the decision path held until taken.
pub type Events = Vec<Event, EVENTS>;

/// A CDU setting the controller writes, in the order written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
/// positions (read from a map by the shell: `cooling_ctrl::modbus::map_limits`).
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
    fn has(&self, s: Setting) -> bool {
        Setting::ORDER
            .iter()
            .position(|o| *o == s)
            .is_some_and(|i| self.mapped[i])
    }
}

/// The core's configuration `cfg` held to the map's ranges: where the map
/// is tighter than the core's own limits (the lowest and highest
/// setpoint, the lowest pump speed), the map's wins. Returns each change,
/// for the log at start; an error naming both ranges when the site's
/// setpoint range (itself one the core takes) and the map's leave no
/// range between them ([`ConfigError::SetpointOutsideMap`]).
pub fn tighten(cfg: &mut CoreConfig, lim: &MapLimits) -> Result<Vec<Said, 3>, ConfigError> {
    let mut said = Vec::new();
    let c = &mut cfg.cdu;
    let site = (c.min_setpoint_c, c.max_setpoint_c);
    // At most one of each of the three: pushes cannot fail.
    if let Some((lo, hi)) = lim.setpoint_c {
        let (lo, hi) = (lo as f32, hi as f32);
        if lo > c.min_setpoint_c {
            let _ = said.push(Said::LowestSetpoint {
                map_c: lo,
                site_c: c.min_setpoint_c,
            });
            c.min_setpoint_c = lo;
        }
        if hi < c.max_setpoint_c {
            let _ = said.push(Said::HighestSetpoint {
                map_c: hi,
                configured_c: c.max_setpoint_c,
            });
            c.max_setpoint_c = hi;
        }
        // The core needs its lowest below its highest (`validate`).
        if site.0 < site.1 && c.min_setpoint_c >= c.max_setpoint_c {
            let centi = |v: f32| round(f64::from(v) * 100.0) as i32;
            return Err(ConfigError::SetpointOutsideMap {
                map_centi: [centi(lo), centi(hi)],
                site_centi: [centi(site.0), centi(site.1)],
            });
        }
    }
    if let Some((lo, _)) = lim.speed_pct {
        let lo = (lo / 100.0) as f32;
        if lo > c.min_speed {
            let _ = said.push(Said::LowestSpeed {
                map: lo,
                configured: c.min_speed,
            });
            c.min_speed = lo;
        }
    }
    Ok(said)
}

/// What of a step's commands its writes are made of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Asked {
    /// Supply setpoint, °C.
    pub setpoint_c: f32,
    /// Pump speed, fraction of full.
    pub pump_speed: f32,
    /// Pumps A and B on.
    pub pump_on: [bool; 2],
    /// The lead pump.
    pub lead: Pump,
    /// Rack valves open, bit n = rack n.
    pub valves_open: u16,
}

impl Asked {
    /// What `c` asks of the CDU.
    pub fn of(c: &Commands) -> Self {
        Self {
            setpoint_c: c.setpoint_c,
            pump_speed: c.pump_speed,
            pump_on: c.pump_on,
            lead: c.lead,
            valves_open: c.valves_open,
        }
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
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// The writes; a setting the map lacks, or the valves while they are
    /// held, is not among them.
    pub writes: Vec<Write, MAX_WRITES>,
}

impl Plan {
    /// The value planned for `s`, if it is written.
    pub fn value(&self, s: Setting) -> Option<f64> {
        self.writes.iter().find(|w| w.setting == s).map(|w| w.value)
    }
}

/// What became of a step's writes.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Outcome {
    /// Each write tried, with the CDU's answer (`Err`: why it failed, as
    /// the shell said it, cut to [`crate::said::WORDS`] bytes).
    pub tried: Vec<(Setting, Result<(), Words>), MAX_WRITES>,
    /// Writes that went in on their echo alone, with why they are not
    /// known taken: the setting's last write did not go in and no
    /// read-back has read it held since (the shell's read-back failed).
    /// Each still counts as taken on its own ([`Outcome::taken`]: its
    /// echo is all there is of it, so a lead pump's trip is judged and a
    /// valve word recorded), but not every setting is
    /// ([`Outcome::all_ok`]: the CDU is reported as not taking its
    /// writes).
    pub unsure: Vec<(Setting, Words), MAX_WRITES>,
    /// The heartbeat is held back from the next step on (its write
    /// not taken): the CDU echoed a safety setting it does not hold, so
    /// it runs on its own control ([`cooling_core::Taken::heartbeat_held`];
    /// set on the step that found it, so the mode's change names it).
    pub heartbeat_held: bool,
    /// The heartbeat's write went out on the line this step, whatever the
    /// answer (taken, refused, or none: one unanswered may have been
    /// taken; one refused, perhaps for its value, is not sent again).
    /// Only then is the next heartbeat one past it: one withheld or not
    /// sent leaves the count where it was, so the next value still
    /// differs from the last one sent (a register of two values would
    /// otherwise read the same heartbeat again after one withheld).
    pub heartbeat_sent: bool,
}

/// A write that failed, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteError {
    /// Which.
    pub setting: Setting,
    /// Why, as the shell said it.
    pub why: Words,
}

impl Display for WriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.setting.register(), self.why)
    }
}

impl Outcome {
    /// Every write of the plan went in and is known taken (or the plan
    /// had none to fail): none failed, none is [`Outcome::unsure`].
    pub fn all_ok(&self) -> bool {
        self.tried.iter().all(|(_, r)| r.is_ok()) && self.unsure.is_empty()
    }

    /// What the CDU took, setting by setting: one that failed did not go
    /// in; one not tried (not in the map), or gone in on its echo alone
    /// ([`Outcome::unsure`]), counts as in.
    pub fn taken(&self) -> cooling_core::Taken {
        let failed = |setting| self.tried.iter().any(|(s, r)| *s == setting && r.is_err());
        cooling_core::Taken {
            all: self.all_ok(),
            setpoint: !failed(Setting::Setpoint),
            speed: !failed(Setting::PumpSpeed),
            valves: !failed(Setting::Valves),
            pumps: !failed(Setting::PumpsRun) && !failed(Setting::LeadPump),
            heartbeat_held: self.heartbeat_held,
        }
    }

    /// Whether `w` is to be written now, after what was tried: the
    /// heartbeat only when no safety write failed.
    pub fn due(&self, w: &Write) -> bool {
        w.setting != Setting::Heartbeat || self.tried.iter().all(|(s, r)| !s.safety() || r.is_ok())
    }

    /// Records the CDU's answer to `s` (an error's words cut to
    /// [`crate::said::WORDS`] bytes). A plan writes each setting once;
    /// past [`MAX_WRITES`] answers, a failure takes the place of the last
    /// success, so that a failure is never lost.
    pub fn record<E: Display>(&mut self, s: Setting, r: Result<(), E>) {
        let entry = (s, r.map_err(|e| words(&e)));
        if let Err(entry) = self.tried.push(entry) {
            let last_ok = self.tried.iter_mut().rev().find(|(_, r)| r.is_ok());
            if let (Err(_), Some(last)) = (&entry.1, last_ok) {
                *last = entry;
            }
        }
    }

    /// The first failure (else the first setting not known taken,
    /// [`Outcome::unsure`]).
    pub fn first_error(&self) -> Option<WriteError> {
        let failed = self.tried.iter().find_map(|(s, r)| {
            r.as_ref().err().map(|why| WriteError {
                setting: *s,
                why: why.clone(),
            })
        });
        failed.or_else(|| {
            self.unsure.first().map(|(s, why)| WriteError {
                setting: *s,
                why: why.clone(),
            })
        })
    }

    /// An outcome in which every write of `plan` went in (`ok`) or none
    /// did: a CDU that takes a step's writes together, as the twin's.
    /// Every write was tried: the heartbeat, if planned, was sent.
    pub fn whole(plan: &Plan, ok: bool) -> Self {
        let answer = if ok { Ok(()) } else { Err(words(&"not taken")) };
        Self {
            tried: (plan.writes.iter())
                .map(|w| (w.setting, answer.clone()))
                .collect(),
            unsure: Vec::new(),
            heartbeat_held: false,
            heartbeat_sent: plan.value(Setting::Heartbeat).is_some(),
        }
    }
}

/// Turns commands into a [`Plan`] and reports the settings the map limits.
#[derive(Debug, Clone)]
pub struct Limiter {
    /// Per clamped setting (setpoint, speed): the limit in force now, as
    /// (wanted, written).
    limited: [Option<(f64, f64)>; 2],
    /// Writes that were limited, since the start.
    pub count: u64,
}

impl Default for Limiter {
    fn default() -> Self {
        Self::new()
    }
}

impl Limiter {
    /// No setting limited yet.
    pub const fn new() -> Self {
        Self {
            limited: [None; 2],
            count: 0,
        }
    }

    /// The plan for what the commands ask (`c`): `valves` (`None`: held,
    /// not written), this step's `heartbeat`, the setpoint and speed held
    /// to `lim` (rounded to 0.01 °C and 0.1 %). A limit that begins or
    /// ends is pushed onto `events`.
    pub fn plan(
        &mut self,
        c: &Asked,
        valves: Option<u16>,
        heartbeat: u32,
        lim: &MapLimits,
        events: &mut Events,
    ) -> Plan {
        let setpoint = round(f64::from(c.setpoint_c) * 100.0) / 100.0;
        let speed = round(f64::from(c.pump_speed) * 1000.0) / 10.0;
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
        events: &mut Events,
    ) -> f64 {
        let written = range.map_or(wanted, |(lo, hi)| wanted.clamp(lo, hi));
        let setting = if i == 0 {
            CduSetting::SupplySetpoint
        } else {
            CduSetting::PumpSpeed
        };
        let centi = |v: f64| round(v * 100.0) as i32;
        let now = (written != wanted).then_some((wanted, written));
        if now.is_some() {
            self.count += 1;
        }
        if now.is_some() != self.limited[i].is_some() {
            push_newest(
                events,
                Event::SettingLimited {
                    setting,
                    wanted_centi: centi(wanted),
                    written_centi: centi(written),
                    active: now.is_some(),
                },
            );
        }
        self.limited[i] = now;
        written
    }
}

/// Pushes `e`; when `events` is full (no one took them), the oldest
/// gives way: the newest says how a limit stands now.
pub(crate) fn push_newest(events: &mut Events, e: Event) {
    if events.is_full() {
        events.remove(0);
    }
    // Room was made above.
    let _ = events.push(e);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::said::WORDS;
    use std::string::ToString;

    /// The limits of the simulated CDU's register map
    /// (`boards/cdus/sim-cdu.toml`; cooling-ctrl checks that its map reads
    /// so).
    pub(crate) fn sim_cdu() -> MapLimits {
        MapLimits {
            mapped: [true; 6],
            setpoint_c: Some((17.0, 45.0)),
            speed_pct: Some((30.0, 100.0)),
            positions: true,
        }
    }

    fn commands(setpoint_c: f32, speed: f32) -> Asked {
        let mut c = cooling_core::Core::new(CoreConfig::default())
            .unwrap()
            .step(&cooling_core::Inputs {
                now_ms: 0,
                cdu: None,
                ambient_c: None,
                leaks: cooling_core::LeakInputs::DRY,
                cdu_taken: cooling_core::Taken::ALL,
                valves_held: 0,
                hosts: &[],
            });
        c.setpoint_c = setpoint_c;
        c.pump_speed = speed;
        Asked::of(&c)
    }

    #[test]
    fn a_setpoint_outside_the_map_is_held_to_it_and_the_valves_still_go_first() {
        let lim = sim_cdu();
        let mut l = Limiter::default();
        let mut ev = Events::new();
        let p = l.plan(&commands(14.0, 0.5), Some(0b0111), 9, &lim, &mut ev);
        assert!(p.writes.iter().map(|w| w.setting).eq(Setting::ORDER));
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
        o.record(Setting::Valves, Ok::<(), &str>(()));
        o.record(Setting::PumpsRun, Ok::<(), &str>(()));
        assert!(o.due(&hb));
        o.record(Setting::Setpoint, Err("exception 3"));
        assert!(o.due(&hb), "a refused setpoint does not stop the heartbeat");
        o.record(Setting::Valves, Err("exception 4"));
        assert!(!o.due(&hb), "a refused valve write does");
        assert!(!o.all_ok());
        assert_eq!(
            o.first_error().map(|e| e.to_string()).as_deref(),
            Some("supply_setpoint: exception 3")
        );
    }

    #[test]
    fn a_refused_lead_pump_or_pumps_write_is_no_pumps_taken() {
        for refused in [Setting::PumpsRun, Setting::LeadPump] {
            let mut o = Outcome::default();
            for s in Setting::ORDER {
                o.record(
                    s,
                    if s == refused {
                        Err("exception 4")
                    } else {
                        Ok(())
                    },
                );
            }
            let t = o.taken();
            assert!(!t.pumps && !t.all, "{refused:?}");
            assert!(t.valves && t.speed && t.setpoint, "{refused:?}");
        }
        let mut o = Outcome::default();
        o.record(Setting::Setpoint, Err("exception 3"));
        assert!(o.taken().pumps, "a refused setpoint leaves the pumps told");
    }

    #[test]
    fn the_core_is_held_to_the_tighter_of_its_limits_and_the_maps() {
        let lim = sim_cdu();
        let mut cfg = CoreConfig::default();
        cfg.cdu.min_setpoint_c = 13.0;
        let said = tighten(&mut cfg, &lim).unwrap();
        assert_eq!(cfg.cdu.min_setpoint_c, 17.0);
        assert_eq!(said.len(), 1, "{said:?}");
        assert_eq!(
            said[0].to_string(),
            "lowest setpoint 17.0 °C (the site's dew point allows 13.0 °C, the CDU's register map takes no less than 17.0 °C)"
        );
        let mut again = cfg;
        assert!(tighten(&mut again, &lim).unwrap().is_empty());
    }

    #[test]
    fn a_map_whose_setpoints_the_site_allows_none_of_is_refused_naming_both_ranges() {
        let none: Result<Option<crate::LatchRecord>, &str> = Ok(None);
        let mut lim = sim_cdu();
        lim.setpoint_c = Some((17.0, 25.0));
        let mut cfg = CoreConfig::default();
        cfg.cdu.min_setpoint_c = 27.0;
        cfg.cdu.max_setpoint_c = 45.0;
        let e = crate::Decider::new(cfg, lim, &none).expect_err("refused");
        assert_eq!(
            e.to_string(),
            "cdu: the register map takes supply_setpoint 17.0 to 25.0 °C, the site's \
             setpoints run from 27.0 °C (the lowest its dew point allows) to 45.0 °C: \
             no range of setpoints meets both"
        );
        // A started decider is left as it was.
        let mut d = crate::Decider::new(CoreConfig::default(), sim_cdu(), &none).unwrap();
        assert!(d.start(cfg, lim, &none).is_err());
        assert_eq!(d.limits(), &sim_cdu());
        // One setpoint in common is no range to regulate in.
        cfg.cdu.min_setpoint_c = 25.0;
        assert!(tighten(&mut cfg.clone(), &lim)
            .expect_err("refused")
            .to_string()
            .contains("supply_setpoint 17.0 to 25.0 °C, the site's setpoints run from 25.0 °C"));
        // A map above the site's highest, in hundredths as the map has it.
        lim.setpoint_c = Some((30.25, 45.0));
        cfg.cdu.min_setpoint_c = 17.0;
        cfg.cdu.max_setpoint_c = 28.0;
        let e = tighten(&mut cfg.clone(), &lim)
            .expect_err("refused")
            .to_string();
        assert!(e.contains("supply_setpoint 30.25 to 45.0 °C, the site's setpoints run from 17.0 °C (the lowest its dew point allows) to 28.0 °C"), "{e}");
        // A site range wrong on its own is the core's to refuse.
        cfg.cdu.max_setpoint_c = 10.0;
        let e = crate::Decider::new(cfg, lim, &none).expect_err("refused");
        assert!(e
            .to_string()
            .contains("min_setpoint_c must be below max_setpoint_c"));
    }

    #[test]
    fn a_failure_past_the_writes_of_a_plan_is_not_lost_and_long_words_are_cut() {
        let mut o = Outcome::default();
        for s in Setting::ORDER {
            o.record(s, Ok::<(), &str>(()));
        }
        let long = "no answer ".repeat(40);
        o.record(Setting::Valves, Err(long.as_str()));
        assert_eq!(o.tried.len(), MAX_WRITES);
        assert!(!o.all_ok());
        let e = o.first_error().unwrap();
        assert_eq!(e.setting, Setting::Valves);
        assert!(e.why.len() <= WORDS && e.why.starts_with("no answer"));
    }

    #[test]
    fn events_no_one_takes_give_way_to_the_newest() {
        let lim = sim_cdu();
        let mut l = Limiter::default();
        let mut ev = Events::new();
        for i in 0..2 * EVENTS {
            let setpoint = if i % 2 == 0 { 14.0 } else { 20.0 };
            l.plan(&commands(setpoint, 0.5), None, 0, &lim, &mut ev);
        }
        assert_eq!(ev.len(), EVENTS);
        assert!(matches!(
            ev.last(),
            Some(Event::SettingLimited { active: false, .. })
        ));
    }
}
