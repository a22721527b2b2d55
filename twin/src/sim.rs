//! Plays a scenario on the plant in simulated time, with a controller in
//! charge of the CDU, and keeps the figures of `docs/plant-model.md` §8.3.
//!
//! The controller sees what a real one would see (the CDU's sensors over
//! Modbus, with the scenario's sensor faults applied; the leak ropes on its
//! board; the hosts' reports over the bus) and answers with what a CDU
//! accepts (setpoint, pump speed and pumps, rack valves) and what it tells
//! the hosts (power caps, cooling lost). The plant model stays hidden from
//! it (only the `oracle` reference is shown the truth, through
//! [`Controller::observe`]). One step is one second of simulated time.
//!
//! The hosts follow their agents ([`crate::hosts`]): a host told that its
//! cooling is lost drains and powers its GPUs down 30 s later; told that
//! it is back, it powers them up and its jobs resume (the operator
//! restarts them).
//!
//! During a `modbus_outage` the CDU neither answers nor hears: the
//! controller reads no temperature, flow or meter (the outdoor
//! temperature, the pumps' feedback and the meters hold what was last
//! read), and the CDU keeps the setpoint, pump speed, pumps and valves it
//! was last told until its heartbeat timeout: a CDU that heard the
//! controller's heartbeat falls back to its own safe settings when it
//! stops (`docs/plant-model.md` §3.5). The leak ropes
//! are board inputs and the hosts are on the bus, so both still work.
//! During a `bus_outage` the hosts neither report nor hear: the controller
//! sees no host reports, a host keeps a cap lease it holds until it lapses
//! ([`LEASE_S`] after its last renewal), and news of a rack's cooling does
//! not reach it.
//!
//! Glossary:
//! - *reference controller*: a fixed policy to compare against
//!   (`baseline-18`, `baseline-32`: the vendors' usual fixed setpoint, or
//!   static warm water, pumps at 100 %, no caps).
//! - *pumped leak second*: a second in which a leaking rack's valve was
//!   still open.

use std::io::Write;

mod baseline;
mod controller;
mod multi;
pub use baseline::Baseline;
pub use controller::{feedback_stuck, host_reports, Controller, Decision, HostReport, Readings};
pub use multi::{run_hall, FacilityCoordinator, FacilityOrder, FacilityPolicy, HallSummary};

use crate::hosts::HostFollow;
use crate::plant::{Actuation, Conditions, Meters, Plant};
use crate::scenario::{FaultKind, Scenario, SensorFault, SensorName};
use crate::tally::{Declared, Tally};

/// The figures of a run (`docs/plant-model.md` §8.3).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Scenario name.
    pub scenario: String,
    /// Controller name.
    pub controller: String,
    /// Length, s.
    pub duration_s: u64,
    /// IT energy, kWh.
    pub it_kwh: f64,
    /// Facility energy, kWh.
    pub facility_kwh: f64,
    /// Facility energy / IT energy (infinite, `null` in JSON, with no IT
    /// energy).
    pub pue: f64,
    /// Work done, GPU-hours at w = 1.
    pub work_gpu_h: f64,
    /// Facility kWh per work-GPU-hour (infinite, `null` in JSON, for a
    /// run that did no work).
    pub kwh_per_work_gpu_h: f64,
    /// Hottest junction, °C.
    pub max_gpu_temp_c: f64,
    /// GPU-seconds above the max operating temperature.
    pub gpu_s_above_max_operating: u64,
    /// HW slowdown episodes.
    pub slowdown_episodes: u32,
    /// GPU shutdowns (excluding GPUs failed by the scenario and GPUs
    /// powered down by their hosts).
    pub shutdowns: u32,
    /// Host-seconds with a cap asked: each second counts every host the
    /// controller asked for a cap.
    pub cap_requests: u64,
    /// Seconds the controller declared itself in failsafe.
    pub failsafe_s: u64,
    /// Leaks in the scenario that began within the run.
    pub leaks: u32,
    /// Seconds in which a leaking rack had coolant pumped to it (its valve
    /// open while a pump ran).
    pub leak_pumped_s: u64,
    /// Times the lead pump changed.
    pub pump_switchovers: u32,
    /// Times a valve closed for a leak opened again with no operator's
    /// clear (`simulate` has no operator: any reopening counts; the live
    /// hall hears its operators' clears, [`crate::hall::Hall::leak_cleared`]).
    pub valve_reopened_unattended: u32,
    /// Times a rack was newly reported as having lost leak sensing.
    pub leak_sensing_alarms: u32,
    /// Controller restarts the scenario caused.
    pub controller_restarts: u32,
    /// Racks the controller newly reported as having a valve position
    /// input it does not believe.
    pub valve_feedback_alarms: u32,
}

/// `a / b`, infinite where there is no `b` (a run with no IT or no
/// work: its energy bought nothing, the worst figure, never the best;
/// `null` in the summary's JSON).
pub(crate) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::INFINITY
    }
}

/// A sensor as the controller sees it, with the scenario's faults: the
/// reading it stuck at, how far it has drifted. Simulate and the live
/// hall ([`crate::hall::Hall`]) read their sensors through it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SensorState {
    stuck: Option<f64>,
    drift: f64,
}

impl SensorState {
    /// The reading of a sensor whose truth is `truth`, `dt` seconds after
    /// its last, under `fault` ([`SensorFault::of`]): none when lost, the
    /// value it stuck at, or the truth plus its drift so far.
    pub(crate) fn read(&mut self, fault: SensorFault, truth: f64, dt: f64) -> Option<f64> {
        match fault {
            SensorFault::Lost => return None,
            SensorFault::Stuck => return Some(*self.stuck.get_or_insert(truth)),
            SensorFault::Drift(rate) => self.drift += rate / 60.0 * dt,
            SensorFault::None => self.drift = 0.0,
        }
        self.stuck = None;
        Some(truth + self.drift)
    }
}

fn sensor(
    s: &Scenario,
    t: f64,
    name: SensorName,
    truth: f64,
    state: &mut SensorState,
) -> Option<f64> {
    state.read(SensorFault::of(s.active(t), name), truth, 1.0)
}

/// The lead pump of a pump command: the one pump on (`None`: both or
/// neither).
pub fn lead_of(on: [bool; 2]) -> Option<usize> {
    match on {
        [true, false] => Some(0),
        [false, true] => Some(1),
        _ => None,
    }
}

/// What the CDU was last told over Modbus (it keeps it while Modbus is out).
#[derive(Clone)]
struct CduCommand {
    setpoint_c: f64,
    pump_speed: f64,
    pump_on: [bool; 2],
    valves: Vec<bool>,
}

/// How long a cap lease holds at a host without renewal, s (the
/// controller's shell renews its leases well within it).
pub const LEASE_S: f64 = 30.0;

/// Plays `scenario` with `controller` in charge; writes the time series to
/// `trace` (CSV, one row every `trace_every_s`) when given.
pub fn run(
    name: &str,
    scenario: &Scenario,
    controller: &mut dyn Controller,
    mut trace: Option<&mut dyn Write>,
    trace_every_s: u64,
) -> std::io::Result<Summary> {
    let mut st = RunState::new(scenario);
    let leaks = scenario.leaks_before(scenario.duration_s as f64);
    if let Some(w) = trace.as_deref_mut() {
        writeln!(w, "t_s,ambient_c,setpoint_c,supply_c,return_c,flow_lpm,pump_speed,max_gpu_c,it_kw,facility_kw,caps")?;
    }
    for sec in 0..scenario.duration_s {
        let s = st.cdu_second(sec, scenario, controller);
        st.plant.step(1.0, &s.act, &s.cond);
        st.last = st.plant.meters();
        st.account(&s.second, &s.act);
        if let Some(w) = trace.as_deref_mut() {
            if trace_due(sec, trace_every_s, scenario.duration_s) {
                st.trace_row(w, &s.second, &s.act)?;
            }
        }
    }
    Ok(st.summary(name, controller.name(), leaks))
}

/// Whether the trace takes a row after second `sec` (the state at
/// `sec + 1`): every `every` seconds, and the run's last state at
/// `duration_s`, once.
pub(crate) fn trace_due(sec: u64, every: u64, duration_s: u64) -> bool {
    let t = sec + 1;
    t % every.max(1) == 0 || t == duration_s
}

/// One CDU's second up to the plant's step: what the scenario has in
/// force, the conditions the plant steps under and what its actuators do.
struct CduSecond {
    second: Second,
    cond: Conditions,
    act: Actuation,
}

/// One second of a run: the time and what the scenario has in force then.
struct Second {
    /// Simulated time, s.
    t: f64,
    /// Outdoor air, °C.
    ambient: f64,
    /// The faults in force.
    active: Vec<FaultKind>,
    /// The bus is out (no host reports, the hosts hear nothing).
    bus_out: bool,
    /// The CDU answers on Modbus.
    modbus_ok: bool,
    /// Per rack: it leaks.
    leaking: Vec<bool>,
    /// Per rack: its rope is cut.
    rope_cut: Vec<bool>,
    /// The board's input lines can be read.
    board_ok: bool,
    /// The CDU refuses writes (local mode at its panel).
    writes_refused: bool,
}

/// A run between seconds: the plant, what the CDU and the hosts were last
/// told, what the controller last read over Modbus, and the counters of
/// the summary.
struct RunState<'a> {
    scenario: &'a Scenario,
    racks: usize,
    hosts_per_rack: usize,
    per_host: usize,
    per_rack: usize,
    hosts: usize,
    /// GPUs in the hall.
    n: usize,
    plant: Plant,
    follow: HostFollow,
    /// The CDU's sensors: the five of the loop, then the outdoor one.
    sensors: [SensorState; 6],
    /// Per GPU: failed by the scenario.
    failed: Vec<bool>,
    cdu: CduCommand,
    /// Per host: the cap lease it holds (cap, W; lapses at, s).
    leases: Vec<Option<(f64, f64)>>,
    /// The figures of the summary besides the plant's.
    tally: Tally,
    /// Per rack: the valve's real position, open.
    valves_open: Vec<bool>,
    /// The lead pump the CDU was last told.
    lead: usize,
    /// A `latch_corrupt` waits for the next restart.
    latch_damage_due: bool,
    /// The controller's process is down until this second.
    down_until: Option<u64>,
    /// When the CDU last heard its heartbeat register written, s.
    heartbeat_at: Option<f64>,
    /// The CDU took the last writes.
    writes_ok: bool,
    /// The pump faults as last read over Modbus.
    read_pump_faults: [bool; 2],
    /// The plant's meters after the last step.
    last: Meters,
    /// The pump feedback as last read over Modbus.
    read_pumps: [bool; 2],
    /// The IT meter as last read over Modbus, W.
    read_it_w: f64,
    /// The facility meter as last read over Modbus, W.
    read_facility_w: f64,
    /// The outdoor sensor as last read over Modbus, °C.
    read_ambient_c: Option<f64>,
    /// Hosts the controller's decision of this second asks to cap.
    caps_now: usize,
}

impl<'a> RunState<'a> {
    /// The hall at rest at the start of `scenario`.
    fn new(scenario: &'a Scenario) -> Self {
        // The plant is the hall as it is, not as configured.
        let site = scenario.truth.clone();
        let racks = site.racks;
        let hosts_per_rack = site.hosts_per_rack;
        let per_host = site.gpus_per_host;
        let per_rack = hosts_per_rack * per_host;
        let hosts = racks * hosts_per_rack;
        let start_c = scenario.ambient.at(0.0).max(20.0);
        let plant = Plant::new(site, start_c);
        let n = plant.gpus().len();
        // The CDU at rest: holding the hall's temperature, lead pump at 100 %.
        let cdu = CduCommand {
            setpoint_c: start_c,
            pump_speed: 1.0,
            pump_on: [true, false],
            valves: vec![true; racks],
        };
        let last = plant.meters();
        Self {
            scenario,
            racks,
            hosts_per_rack,
            per_host,
            per_rack,
            hosts,
            n,
            follow: HostFollow::new(hosts, per_host),
            sensors: [SensorState::default(); 6],
            failed: vec![false; n],
            leases: vec![None; hosts],
            tally: Tally::new(racks, 0),
            valves_open: vec![true; racks],
            lead: 0,
            latch_damage_due: false,
            down_until: None,
            heartbeat_at: None,
            writes_ok: true,
            read_pump_faults: [false; 2],
            read_pumps: cdu.pump_on,
            read_it_w: last.it_w,
            read_facility_w: last.facility_w,
            read_ambient_c: None,
            caps_now: 0,
            cdu,
            last,
            plant,
        }
    }

    /// Second `sec` of `scenario` (this CDU's) up to the plant's step: the
    /// controller reads, decides and is heard by the hosts and the CDU.
    fn cdu_second(
        &mut self,
        sec: u64,
        scenario: &Scenario,
        controller: &mut dyn Controller,
    ) -> CduSecond {
        let s = self.begin_second(sec);
        let readings = self.readings(&s);
        let mut cond = scenario.conditions(s.t, &self.failed);
        let demand = cond.demand.clone();
        self.follow.apply(s.t, &mut cond.demand);
        controller.observe(&self.plant, &cond);
        self.caps_now = 0;
        let d = self
            .controller_up(sec, controller)
            .then(|| controller.step(&readings));
        if let Some(d) = &d {
            self.heard(d);
        }
        self.hosts_hear(&s, d.as_ref());
        cond.demand = demand;
        let powered_down = self.follow.apply(s.t, &mut cond.demand);
        let act = self.actuation(&s, d.as_ref(), powered_down);
        CduSecond {
            second: s,
            cond,
            act,
        }
    }

    /// What the scenario has in force at second `sec`; the GPUs it fails
    /// then fail in the plant.
    fn begin_second(&mut self, sec: u64) -> Second {
        let scenario = self.scenario;
        let t = sec as f64;
        let ambient = scenario.ambient.at(t);
        let active: Vec<FaultKind> = scenario.active(t).cloned().collect();
        let bus_out = active.contains(&FaultKind::BusOutage);
        let modbus_ok = !active.contains(&FaultKind::ModbusOutage);
        let leaking: Vec<bool> = (0..self.racks)
            .map(|r| active.contains(&FaultKind::Leak(r)))
            .collect();
        let rope_cut: Vec<bool> = (0..self.racks)
            .map(|r| active.contains(&FaultKind::RopeCut(r)))
            .collect();
        for f in &scenario.faults {
            if let (FaultKind::ControllerRestart(down), true) = (&f.kind, f.at_s == sec) {
                self.down_until = Some(sec + down.ceil() as u64);
                self.tally.restarted();
            }
            if f.kind == FaultKind::LatchCorrupt && f.at_s == sec {
                self.latch_damage_due = true;
            }
        }
        for f in &active {
            if let FaultKind::GpuFail(r, h, g) = f {
                let i = r * self.per_rack + h * self.per_host + g;
                if !self.failed[i] {
                    self.failed[i] = true;
                    self.plant.fail_gpu(i);
                }
            }
        }
        Second {
            t,
            ambient,
            board_ok: !active.contains(&FaultKind::BoardIoFault),
            writes_refused: active.contains(&FaultKind::CduWriteRefused),
            active,
            bus_out,
            modbus_ok,
            leaking,
            rope_cut,
        }
    }

    /// What the controller reads this second, with the scenario's sensor
    /// faults and outages.
    fn readings(&mut self, s: &Second) -> Readings {
        let last = self.last;
        // The sensors drift and stick whether or not anyone reads them.
        let truths = [
            (SensorName::SupplyTemp, last.supply_c),
            (SensorName::ReturnTemp, last.return_c),
            (SensorName::Flow, last.flow_lpm),
            (SensorName::FacilitySupplyTemp, last.facility_supply_c),
            (SensorName::DiffPressure, last.diff_pressure_kpa),
        ];
        let mut sensed = [None; 5];
        for (k, (name, truth)) in truths.into_iter().enumerate() {
            let v = sensor(self.scenario, s.t, name, truth, &mut self.sensors[k]);
            sensed[k] = v.filter(|_| s.modbus_ok);
        }
        // The outdoor sensor is the CDU's too: what it reads goes with
        // the CDU's other registers.
        let outdoor = sensor(
            self.scenario,
            s.t,
            SensorName::OutdoorTemp,
            s.ambient,
            &mut self.sensors[5],
        );
        if s.modbus_ok {
            self.read_ambient_c = outdoor;
            let tripped = |i| s.active.contains(&FaultKind::PumpTrip(i));
            self.read_pumps = [0, 1].map(|i| self.cdu.pump_on[i] && !tripped(i));
            self.read_pump_faults = [0, 1].map(tripped);
            (self.read_it_w, self.read_facility_w) = (last.it_w, last.facility_w);
        }
        let reports = if s.bus_out {
            Vec::new()
        } else {
            host_reports(&self.plant)
        };
        let hottest = reports
            .iter()
            .filter(|h| h.gpus > 0)
            .map(|h| h.hottest_c)
            .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t))));
        Readings {
            t_s: s.t,
            modbus_ok: s.modbus_ok,
            supply_c: sensed[0],
            return_c: sensed[1],
            flow_lpm: sensed[2],
            facility_supply_c: sensed[3],
            ambient_c: self.read_ambient_c,
            diff_pressure_kpa: sensed[4],
            valves_closed: s.modbus_ok.then(|| {
                (0..self.racks)
                    .map(|r| feedback_stuck(&s.active, r).unwrap_or(!self.valves_open[r]))
                    .collect()
            }),
            cdu_leaks: s.modbus_ok.then(|| {
                (0..self.racks)
                    .map(|r| s.leaking[r] && !s.rope_cut[r])
                    .collect()
            }),
            leaks: (0..self.racks)
                .map(|r| s.board_ok && s.leaking[r] && !s.rope_cut[r])
                .collect(),
            rope_faults: s.rope_cut.iter().map(|c| s.board_ok && *c).collect(),
            board_ok: s.board_ok,
            pumps_running: self.read_pumps,
            pump_faults: self.read_pump_faults,
            writes_ok: self.writes_ok,
            hosts: reports,
            hottest_gpu_c: hottest,
            it_w: self.read_it_w,
            facility_w: self.read_facility_w,
        }
    }

    /// Whether the controller runs at second `sec`: after a restart's
    /// downtime its process starts again ([`Controller::restart`]).
    fn controller_up(&mut self, sec: u64, controller: &mut dyn Controller) -> bool {
        match self.down_until {
            Some(until) if sec < until => false,
            Some(_) => {
                self.down_until = None;
                if std::mem::take(&mut self.latch_damage_due) {
                    controller.damage_latch();
                }
                controller.restart();
                true
            }
            None => true,
        }
    }

    /// Counts what the controller's decision `d` declares: failsafe, caps
    /// asked, racks newly reported as having lost leak sensing.
    fn heard(&mut self, d: &Decision) {
        self.caps_now = d.host_caps.iter().take(self.hosts).flatten().count();
        self.tally.declared(&declared(d, self.caps_now), 1.0);
    }

    /// The hosts hear the controller over the bus, when the bus works and
    /// the controller runs; a cap lease they hold lapses `LEASE_S` after
    /// it was last renewed.
    fn hosts_hear(&mut self, s: &Second, d: Option<&Decision>) {
        let t = s.t;
        if let (Some(d), false) = (d, s.bus_out) {
            for (host, lease) in self.leases.iter_mut().enumerate() {
                if d.rack_cooling_lost.get(host / self.hosts_per_rack) == Some(&true) {
                    self.follow.cooling_lost(host, t);
                } else {
                    self.follow.cooling_restored(host);
                }
                *lease = d
                    .host_caps
                    .get(host)
                    .copied()
                    .flatten()
                    .map(|c| (c, t + LEASE_S));
            }
        }
        for l in self.leases.iter_mut() {
            if l.is_some_and(|(_, until)| t >= until) {
                *l = None;
            }
        }
    }

    /// The CDU hears `d` over Modbus when Modbus works and it takes writes
    /// (a heartbeat among them); it falls back to its own safe setpoint at
    /// full speed once a heartbeat it has heard stops for its timeout
    /// (not while in local mode).
    fn cdu_hears(&mut self, s: &Second, d: Option<&Decision>) -> CduCommand {
        let racks = self.racks;
        let writes = s.modbus_ok && !s.writes_refused;
        if let Some(d) = d {
            self.writes_ok = writes;
            if writes {
                let valves = match d.hold_valves {
                    true => self.cdu.valves.clone(),
                    false => (0..racks)
                        .map(|r| d.valves.get(r).copied().unwrap_or(true))
                        .collect(),
                };
                self.cdu = CduCommand {
                    setpoint_c: d.setpoint_c,
                    pump_speed: d.pump_speed,
                    pump_on: d.pump_on,
                    valves,
                };
                if d.heartbeat {
                    self.heartbeat_at = Some(s.t);
                }
            }
        }
        let lp = &self.scenario.truth.secondary;
        let lost = self
            .heartbeat_at
            .is_some_and(|h| s.t - h >= lp.heartbeat_timeout_s);
        let mut told = self.cdu.clone();
        if lost && !s.writes_refused {
            (told.setpoint_c, told.pump_speed, told.pump_on) =
                crate::sim_cdu::fallback(lp, told.pump_on, self.lead);
        }
        told
    }

    /// What the plant's actuators do this second: what the CDU heard, stuck
    /// valves staying open, the leases the hosts keep.
    fn actuation(
        &mut self,
        s: &Second,
        d: Option<&Decision>,
        powered_down: Vec<bool>,
    ) -> Actuation {
        let cdu = self.cdu_hears(s, d);
        if let Some(lead) = lead_of(cdu.pump_on) {
            self.lead = lead;
        }
        self.tally.lead(lead_of(cdu.pump_on));
        // A stuck valve keeps its position: open, as at the start.
        self.valves_open = (0..self.racks)
            .map(|r| s.active.contains(&FaultKind::ValveStuck(r)) || cdu.valves[r])
            .collect();
        let per_host = self.per_host;
        Actuation {
            setpoint_c: cdu.setpoint_c,
            pump_speed: cdu.pump_speed,
            pump_on: cdu.pump_on,
            valves: self.valves_open.clone(),
            caps: (0..self.n)
                .map(|i| {
                    self.leases
                        .get(i / per_host)
                        .copied()
                        .flatten()
                        .map(|(c, _)| c)
                })
                .collect(),
            powered_down,
        }
    }

    /// After the plant's step: the seconds a leaking rack was pumped
    /// (valve open, water moving) and the valves closed for a leak that
    /// opened again.
    fn account(&mut self, s: &Second, act: &Actuation) {
        let flowing = self.last.flow_lpm > 0.0;
        self.tally.account(&s.leaking, &act.valves, flowing, 1.0);
    }

    /// One row of the trace, after the plant's step: the state at its
    /// end, with what the step played under (outdoor air, commands).
    fn trace_row(&self, w: &mut dyn Write, s: &Second, act: &Actuation) -> std::io::Result<()> {
        let (t, ambient, last) = (s.t + 1.0, s.ambient, self.last);
        let max_gpu = self
            .plant
            .gpus()
            .iter()
            .map(|g| g.t_j)
            .fold(f64::MIN, f64::max);
        let caps = self.caps_now;
        writeln!(
            w,
            "{t},{ambient:.2},{:.2},{:.2},{:.2},{:.1},{:.2},{max_gpu:.2},{:.2},{:.2},{caps}",
            act.setpoint_c,
            last.supply_c,
            last.return_c,
            last.flow_lpm,
            act.pump_speed,
            last.it_w / 1000.0,
            last.facility_w / 1000.0
        )
    }

    /// The figures of the run, from the plant's accounts and the tally.
    fn summary(&self, name: &str, controller: &str, leaks: u32) -> Summary {
        let t = self.plant.totals();
        self.tally
            .summary(name, controller, self.scenario.duration_s, &t, leaks)
    }
}

/// What decision `d` declares, with `caps` hosts capped.
fn declared(d: &Decision, caps: usize) -> Declared {
    Declared {
        caps,
        failsafe: d.failsafe,
        sensing_lost: d.leak_sensing_lost.clone(),
        feedback_alarms: d.valve_feedback_alarms.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(extra: &str) -> Scenario {
        let text = format!(
            r#"
format = "plant-scenario/1"
description = "test"
duration_s = 1800
seed = 1
[site]
racks = 2
[ambient]
points = [[0, 20.0], [1800, 24.0]]
[load]
all = [[0, 0.3], [300, 0.9]]
{extra}
"#
        );
        Scenario::from_toml(&text, "test.toml").expect("valid")
    }

    /// Records what it reads, answers as baseline-32.
    struct Recorder {
        seen: Vec<Readings>,
        inner: Baseline,
    }

    impl Controller for Recorder {
        fn name(&self) -> &str {
            "recorder"
        }
        fn step(&mut self, r: &Readings) -> Decision {
            self.seen.push(r.clone());
            self.inner.step(r)
        }
    }

    #[test]
    fn cold_water_costs_more_energy_per_work_than_warm_water() {
        let s = scenario("");
        let cold = run("t", &s, &mut Baseline::new(18.0, 2), None, 10).unwrap();
        let warm = run("t", &s, &mut Baseline::new(32.0, 2), None, 10).unwrap();
        assert!(
            cold.kwh_per_work_gpu_h > warm.kwh_per_work_gpu_h,
            "{cold:?} {warm:?}"
        );
        assert!(cold.pue > warm.pue);
        assert!(warm.max_gpu_temp_c > cold.max_gpu_temp_c);
        assert_eq!((cold.shutdowns, warm.shutdowns), (0, 0));
        assert_eq!(cold.controller, "baseline-18");
        // Same demand, nearly the same work (warmer GPUs leak a little more
        // power, under the same 700 W limit).
        assert!((cold.work_gpu_h - warm.work_gpu_h).abs() < 0.02 * cold.work_gpu_h);
    }

    #[test]
    fn a_pump_trip_with_a_controller_that_never_starts_the_lag_pump_shuts_gpus_down() {
        let s = scenario("[[fault]]\nat_s = 600\nkind = \"pump_trip\"\ntarget = \"A\"\n");
        let r = run("t", &s, &mut Baseline::new(32.0, 2), None, 10).unwrap();
        assert!(r.slowdown_episodes > 0 && r.shutdowns > 0, "{r:?}");
    }

    #[test]
    fn a_run_that_does_no_work_costs_infinitely_much_per_unit_of_work() {
        let mut idle = scenario("");
        idle.load_all = crate::scenario::Curve(vec![[0.0, 0.0]]);
        idle.duration_s = 300;
        let r = run("t", &idle, &mut Baseline::new(32.0, 2), None, 60).unwrap();
        assert_eq!(r.work_gpu_h, 0.0);
        assert!(r.facility_kwh > 0.0);
        assert_eq!(r.kwh_per_work_gpu_h, f64::INFINITY, "{r:?}");
        let busy = run("t", &scenario(""), &mut Baseline::new(32.0, 2), None, 60).unwrap();
        assert!(busy.kwh_per_work_gpu_h < r.kwh_per_work_gpu_h);
        assert_eq!(ratio(1.0, 0.0), f64::INFINITY);
        assert_eq!(ratio(3.0, 2.0), 1.5);
    }

    #[test]
    fn a_leak_left_open_is_counted_and_a_failed_gpu_is_not_a_shutdown() {
        let s = scenario(
            "[[fault]]\nat_s = 1000\nkind = \"leak\"\ntarget = \"1\"\n\
             [[fault]]\nat_s = 500\nkind = \"gpu_fail\"\ntarget = \"0.0.3\"\n",
        );
        let r = run("t", &s, &mut Baseline::new(32.0, 2), None, 10).unwrap();
        assert_eq!((r.leaks, r.leak_pumped_s), (1, 800));
        assert_eq!(
            r.shutdowns, 0,
            "a GPU the scenario fails is not the controller's"
        );
    }

    #[test]
    fn sensor_faults_act_on_what_the_controller_reads() {
        let s = scenario(
            "[[fault]]\nat_s = 600\nuntil_s = 900\nkind = \"sensor_stuck\"\ntarget = \"return_temp\"\n\
             [[fault]]\nat_s = 1000\nuntil_s = 1120\nkind = \"sensor_drift\"\ntarget = \"supply_temp\"\nvalue = 0.5\n\
             [[fault]]\nat_s = 1200\nuntil_s = 1300\nkind = \"sensor_lost\"\ntarget = \"flow\"\n\
             [[fault]]\nat_s = 1400\nuntil_s = 1500\nkind = \"bus_outage\"\n",
        );
        let mut c = Recorder {
            seen: Vec::new(),
            inner: Baseline::new(32.0, 2),
        };
        run("t", &s, &mut c, None, 10).unwrap();
        let at = |t: usize| &c.seen[t];
        assert_eq!(at(600).return_c, at(899).return_c, "stuck");
        assert_ne!(
            at(500).return_c,
            at(899).return_c,
            "the load rose meanwhile"
        );
        // 120 s at 0.5 K/min: 1 K above the truth by the end.
        let truth = at(1200).supply_c.unwrap();
        let drifted = at(1119).supply_c.unwrap();
        assert!((drifted - truth - 1.0).abs() < 0.05, "{drifted} vs {truth}");
        assert_eq!(at(1250).flow_lpm, None, "lost");
        assert!(at(1350).flow_lpm.is_some(), "back");
        assert_eq!(
            at(1450).hottest_gpu_c,
            None,
            "no GPU reports without the bus"
        );
        assert!(at(1550).hottest_gpu_c.is_some());
    }

    #[test]
    fn the_outdoor_temperature_is_a_sensor_with_the_scenarios_faults() {
        // Ambient 20 °C rising to 24 °C over 1800 s: 0.13 K a minute.
        let s = scenario(
            "[[fault]]\nat_s = 300\nuntil_s = 600\nkind = \"sensor_stuck\"\ntarget = \"outdoor_temp\"\n\
             [[fault]]\nat_s = 700\nuntil_s = 820\nkind = \"sensor_drift\"\ntarget = \"outdoor_temp\"\nvalue = -1.5\n\
             [[fault]]\nat_s = 900\nuntil_s = 1000\nkind = \"sensor_lost\"\ntarget = \"outdoor_temp\"\n\
             [[fault]]\nat_s = 1100\nuntil_s = 1200\nkind = \"sensor_lost\"\ntarget = \"outdoor_temp\"\n\
             [[fault]]\nat_s = 1150\nuntil_s = 1300\nkind = \"modbus_outage\"\n\
             [[fault]]\nat_s = 1400\nuntil_s = 1500\nkind = \"modbus_outage\"\n",
        );
        let (_, seen) = play(&s, |_, _| {});
        let truth = |t: usize| s.ambient.at(t as f64);
        let at = |t: usize| seen[t].ambient_c;
        assert_eq!(at(100), Some(truth(100)), "a healthy sensor reads true");
        // Stuck at what it read at 300 s while the air warmed by 0.66 K.
        assert_eq!(at(300), Some(truth(300)));
        assert_eq!(at(599), at(300), "stuck");
        assert!(truth(599) - truth(300) > 0.6);
        assert_eq!(at(600), Some(truth(600)), "cleared");
        // 120 s at -1.5 K/min: 3 K below the truth by the end.
        let off = at(819).unwrap() - truth(819);
        assert!((off + 3.0).abs() < 0.05, "{off}");
        assert_eq!(at(820), Some(truth(820)), "cleared");
        assert_eq!(at(950), None, "lost");
        assert_eq!(at(1000), Some(truth(1000)), "back");
        // Lost when Modbus went out at 1150 s: nothing to hold; back when
        // Modbus and the sensor are.
        assert_eq!((at(1120), at(1250)), (None, None));
        assert_eq!(at(1300), Some(truth(1300)));
        // A healthy sensor during an outage holds its last reading, like
        // the CDU's other registers; the true air goes on warming.
        assert_eq!(at(1450), Some(truth(1399)));
        assert!(truth(1450) > truth(1399));
        assert!(!seen[1450].modbus_ok);
        assert_eq!(at(1500), Some(truth(1500)));
    }

    /// Plays `s` with a controller that answers as baseline-32 changed by
    /// `tweak` (given the readings), and records what it read.
    fn play(s: &Scenario, tweak: impl FnMut(&Readings, &mut Decision)) -> (Summary, Vec<Readings>) {
        struct Tweaked<F> {
            seen: Vec<Readings>,
            inner: Baseline,
            tweak: F,
        }
        impl<F: FnMut(&Readings, &mut Decision)> Controller for Tweaked<F> {
            fn name(&self) -> &str {
                "tweaked"
            }
            fn step(&mut self, r: &Readings) -> Decision {
                self.seen.push(r.clone());
                let mut d = self.inner.step(r);
                (self.tweak)(r, &mut d);
                d
            }
        }
        let mut c = Tweaked {
            seen: Vec::new(),
            inner: Baseline::new(32.0, s.site.racks),
            tweak,
        };
        let sum = run("t", s, &mut c, None, 10).unwrap();
        (sum, c.seen)
    }

    #[test]
    fn hosts_report_their_running_gpus_by_global_index() {
        let s = scenario(
            "[[fault]]\nat_s = 500\nkind = \"gpu_fail\"\ntarget = \"1.2.3\"\n\
             [[fault]]\nat_s = 1400\nuntil_s = 1500\nkind = \"bus_outage\"\n",
        );
        let (_, seen) = play(&s, |_, _| {});
        let r = &seen[1000];
        assert_eq!(r.hosts.len(), 2 * 4);
        for (k, h) in r.hosts.iter().enumerate() {
            assert_eq!((h.host, h.rack), (k, k / 4));
            assert!(!h.slowdown);
            assert_eq!(h.limit_w, 700.0);
        }
        // Rack 1, host 2: global host 6, one GPU failed.
        assert_eq!(r.hosts[6].gpus, 7);
        assert_eq!(r.hosts[5].gpus, 8);
        assert!(r.hosts[6].gpu_power_w < r.hosts[5].gpu_power_w);
        let hottest = r.hosts.iter().map(|h| h.hottest_c).fold(f64::MIN, f64::max);
        assert_eq!(r.hottest_gpu_c, Some(hottest));
        assert!(hottest > 40.0 && hottest < 80.0, "{hottest}");
        assert!(seen[1450].hosts.is_empty() && seen[1450].hottest_gpu_c.is_none());
        assert_eq!(seen[1550].hosts.len(), 8);
    }

    #[test]
    fn during_a_modbus_outage_nothing_is_read_and_the_cdu_keeps_its_last_orders() {
        let s = scenario(
            "[[fault]]\nat_s = 900\nuntil_s = 1200\nkind = \"modbus_outage\"\n\
             [[fault]]\nat_s = 1000\nkind = \"leak\"\ntarget = \"1\"\n",
        );
        // From 950 s the controller wants 40 °C and closes the leaking
        // rack's valve: neither reaches the CDU until Modbus is back.
        let (sum, seen) = play(&s, |r, d| {
            if r.t_s >= 950.0 {
                d.setpoint_c = 40.0;
            }
            d.valves = r.leaks.iter().map(|l| !l).collect();
        });
        let before = &seen[899];
        assert!(before.modbus_ok && before.supply_c.is_some());
        let r = &seen[1100];
        assert!(!r.modbus_ok);
        assert_eq!(
            (r.supply_c, r.return_c, r.flow_lpm, r.facility_supply_c),
            (None, None, None, None)
        );
        assert_eq!(r.pumps_running, before.pumps_running);
        assert_eq!(
            (r.it_w, r.facility_w),
            (seen[900].it_w, seen[900].facility_w)
        );
        assert_eq!(r.leaks, vec![false, true], "the ropes are board pins");
        assert_eq!(r.hosts.len(), 8, "the hosts are on the bus");
        // The supply held 32 °C through the outage, then went to 40 °C.
        let supply = |t: usize| seen[t].supply_c.unwrap();
        assert!((supply(1200) - 32.0).abs() < 0.05, "{}", supply(1200));
        assert!((supply(1500) - 40.0).abs() < 0.05, "{}", supply(1500));
        // The leak stayed pumped until the CDU heard the valve command.
        assert_eq!(sum.leak_pumped_s, 200);
    }

    #[test]
    fn pumps_running_is_the_contactor_feedback() {
        let s = scenario("[[fault]]\nat_s = 600\nkind = \"pump_trip\"\ntarget = \"A\"\n");
        let (sum, seen) = play(&s, |r, d| {
            if !r.pumps_running[0] {
                d.pump_on = [true, true];
            }
        });
        assert_eq!(seen[599].pumps_running, [true, false], "B idles as lag");
        assert_eq!(seen[600].pumps_running, [false, false], "A tripped");
        assert_eq!(seen[601].pumps_running, [false, true], "B started");
        assert_eq!(sum.shutdowns, 0);
    }

    #[test]
    fn a_rack_told_its_cooling_is_lost_powers_down_30_s_later_and_back_up() {
        let s =
            scenario("[[fault]]\nat_s = 600\nuntil_s = 1200\nkind = \"leak\"\ntarget = \"1\"\n");
        let (sum, seen) = play(&s, |r, d| {
            d.valves = r.leaks.iter().map(|l| !l).collect();
            d.rack_cooling_lost = r.leaks.clone();
            d.host_caps = (0..8).map(|h| r.leaks[h / 4].then_some(200.0)).collect();
            d.failsafe = r.leaks.iter().any(|&l| l);
        });
        let running = |t: usize, host: usize| seen[t].hosts[host].gpus;
        assert_eq!((running(630, 4), running(630, 0)), (8, 8), "draining");
        assert_eq!(
            (running(631, 4), running(631, 0)),
            (0, 8),
            "down from 630 s"
        );
        assert_eq!(seen[700].hosts[4].gpu_power_w, 0.0);
        assert_eq!(running(1201, 4), 8, "powered up when told");
        assert_eq!(
            (sum.shutdowns, sum.slowdown_episodes, sum.leak_pumped_s),
            (0, 0, 0)
        );
        assert_eq!(sum.cap_requests, 4 * 600, "host-seconds");
        assert_eq!(sum.failsafe_s, 600);
        let (whole, _) = play(&scenario(""), |_, _| {});
        let lost = whole.work_gpu_h - sum.work_gpu_h;
        // 32 GPUs at 0.9 (less the first 30 s at the minimum cap) for
        // about 570 s of lost work.
        assert!(
            lost > 32.0 * 0.8 * 560.0 / 3600.0 && lost < 32.0 * 0.9 * 600.0 / 3600.0,
            "{lost}"
        );
    }

    #[test]
    fn during_a_bus_outage_a_held_cap_lapses_after_its_lease_and_no_new_one_arrives() {
        /// Caps every host from 500 s on, every second, and notes the
        /// limit the plant's first GPU really runs under.
        struct Capper(Vec<f64>);
        impl Controller for Capper {
            fn name(&self) -> &str {
                "capper"
            }
            fn observe(&mut self, plant: &Plant, _: &Conditions) {
                self.0.push(plant.gpus()[0].limit);
            }
            fn step(&mut self, r: &Readings) -> Decision {
                let mut d = Baseline::new(32.0, 2).step(r);
                if r.t_s >= 500.0 {
                    d.host_caps = vec![Some(300.0); 8];
                }
                d
            }
        }
        let s = scenario("[[fault]]\nat_s = 600\nuntil_s = 900\nkind = \"bus_outage\"\n");
        let mut c = Capper(Vec::new());
        run("t", &s, &mut c, None, 60).unwrap();
        // observe() at t sees the limit the step before t applied.
        let limit = |t: usize| c.0[t + 1];
        assert_eq!(limit(599), 300.0, "the cap was heard before the outage");
        assert_eq!(limit(625), 300.0, "held within its lease");
        assert_eq!(limit(640), 700.0, "lapsed 30 s after its last renewal");
        assert_eq!(limit(899), 700.0, "nothing is heard during the outage");
        assert_eq!(limit(905), 300.0, "heard again after it");
    }

    #[test]
    fn the_trace_has_a_header_and_a_row_per_interval() {
        let s = scenario("");
        let mut out = Vec::new();
        run("t", &s, &mut Baseline::new(32.0, 2), Some(&mut out), 60).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("t_s,ambient_c,setpoint_c,supply_c"));
        assert_eq!(lines.len(), 1 + 1800 / 60);
        assert_eq!(lines[1].split(',').count(), lines[0].split(',').count());
        // Each row is the state at its time: after 60 s first, the run's
        // end last.
        let t_of = |l: &str| l.split(',').next().unwrap().to_string();
        assert_eq!(
            (t_of(lines[1]), t_of(lines[30])),
            ("60".into(), "1800".into())
        );
        // A length that is no multiple of the interval ends on its last state.
        let mut out = Vec::new();
        let mut short = scenario("");
        short.duration_s = 1000;
        run("t", &short, &mut Baseline::new(32.0, 2), Some(&mut out), 60).unwrap();
        let text = String::from_utf8(out).unwrap();
        let times: Vec<String> = text.lines().skip(1).map(t_of).collect();
        assert_eq!(times.len(), 1000 / 60 + 1);
        assert_eq!(
            times[times.len() - 2..],
            ["960".to_string(), "1000".to_string()]
        );
    }

    #[test]
    fn a_seized_pump_reads_running_with_no_flow_and_no_pressure() {
        let s = scenario("[[fault]]\nat_s = 600\nkind = \"pump_seized\"\ntarget = \"A\"\n");
        let (sum, seen) = play(&s, |_, _| {});
        assert!(seen[599].flow_lpm.unwrap() > 50.0);
        assert!((seen[599].diff_pressure_kpa.unwrap() - 100.0).abs() < 1.0);
        let r = &seen[605];
        assert_eq!(
            (r.pumps_running, r.pump_faults),
            ([true, false], [false, false])
        );
        assert_eq!((r.flow_lpm, r.diff_pressure_kpa), (Some(0.0), Some(0.0)));
        assert!(sum.shutdowns > 0, "nobody started the lag pump");
        assert_eq!(sum.pump_switchovers, 0);
    }

    #[test]
    fn a_cut_rope_reads_dry_with_its_fault_and_failed_lines_read_nothing() {
        let s = scenario(
            "[[fault]]\nat_s = 600\nkind = \"rope_cut\"\ntarget = \"1\"\n\
             [[fault]]\nat_s = 700\nkind = \"leak\"\ntarget = \"1\"\n\
             [[fault]]\nat_s = 900\nuntil_s = 960\nkind = \"board_io_fault\"\n",
        );
        let (sum, seen) = play(&s, |r, d| {
            d.leak_sensing_lost = (0..2).map(|k| !r.board_ok || r.rope_faults[k]).collect();
        });
        assert_eq!(
            (seen[650].leaks.clone(), seen[650].rope_faults.clone()),
            (vec![false, false], vec![false, true])
        );
        assert_eq!(seen[800].leaks, vec![false, false], "the leak is not seen");
        assert!(!seen[930].board_ok && seen[930].rope_faults == vec![false, false]);
        assert_eq!(
            sum.leak_sensing_alarms, 2,
            "rack 1 at 600 s, rack 0 at 900 s"
        );
        assert_eq!(sum.leak_pumped_s, 1800 - 700);
    }

    #[test]
    fn a_cdu_that_heard_a_heartbeat_falls_back_when_it_stops_and_refused_writes_do_not_reach_it() {
        // The controller writes 40 °C and its heartbeat, then goes down for
        // 60 s at 600 s; the CDU refuses writes from 1000 s to 1200 s.
        let s = scenario(
            "[[fault]]\nat_s = 600\nkind = \"controller_restart\"\nvalue = 60.0\n\
             [[fault]]\nat_s = 1000\nuntil_s = 1200\nkind = \"cdu_write_refused\"\n",
        );
        let (sum, seen) = play(&s, |r, d| {
            d.heartbeat = true;
            d.setpoint_c = if r.t_s >= 1000.0 { 30.0 } else { 40.0 };
        });
        assert_eq!(sum.controller_restarts, 1);
        assert_eq!(seen.len() as u64, 1800 - 60, "no step while it is down");
        // Down from 600 s: the CDU holds 40 °C for 10 s, then its own 25 °C.
        let supply = |t: f64| seen.iter().find(|r| r.t_s == t).unwrap().supply_c.unwrap();
        assert!((supply(599.0) - 40.0).abs() < 0.1);
        assert!(supply(660.0) < 30.0, "{}", supply(660.0));
        assert!((supply(900.0) - 40.0).abs() < 0.1, "back under control");
        let r = seen.iter().find(|r| r.t_s == 1100.0).unwrap();
        assert!(!r.writes_ok);
        assert!(
            (r.supply_c.unwrap() - 40.0).abs() < 0.1,
            "local mode keeps 40 °C"
        );
        assert!((supply(1500.0) - 30.0).abs() < 0.1);
    }
}
