//! The hall as its controller meets it: the plant behind the simulated
//! CDU's registers and the simulated board pins.
//!
//! Each step the hall reads what clients left in the CDU's holding
//! registers (setpoint, pump speed, pumps to run, rack valves, heartbeat)
//! and the controller-healthy relay on the board, steps the plant under
//! the scenario's conditions and faults, and writes back what a real CDU
//! would show: its measurements in the input registers (with the
//! scenario's sensor faults, valve positions and pump faults; the outdoor
//! temperature too, where the map has `outdoor_temp`) and the leak ropes
//! on the board's lines (wet, cut, or the lines failing). A reading past
//! its register's range shows at the range's end (short of the type's
//! "no value" sentinel); a register that cannot take its value keeps no
//! other from being written.
//!
//! The CDU falls back on its own, as real ones do: once it has seen the
//! heartbeat register change or the relay pulse, a heartbeat unchanged or
//! a relay without an edge for `heartbeat_timeout_s` puts it on its local
//! safe setpoint (`fallback_setpoint_c`) at full pump speed, its valves as
//! they were, until the controller is back. In local mode (the scenario's
//! `cdu_write_refused`) it refuses writes and holds what it had. The power caps come from the
//! hosts, and the hosts follow their agents ([`crate::hosts`]): the run
//! tells the hall when an agent quarantined a GPU or a rack's hosts were
//! told their cooling is lost, and the hall drains and powers down by its
//! own clock. Time is passed in.
//!
//! Glossary:
//! - *hall*: plant + simulated CDU + simulated pins + scenario clock.
//! - *plant state*: the CDU's pumps running (contactor closed and the
//!   drive not tripped), its valves open (as told, or stuck open) and its
//!   fallback, as the hall played them in its last step
//!   ([`Hall::plant_state`]); not as written, nor as its registers show
//!   them (a Modbus outage freezes them, a stuck position input lies).

use crate::hosts::HostFollow;
use loopwarden_boards::modbus_map::ValueError;
use loopwarden_boards::pins::PinMap;

use crate::pins::SimLines;
use crate::plant::{Actuation, GpuState, Plant};
use crate::scenario::{FaultKind, Scenario, SensorFault, SensorName};
use crate::sim::SensorState;
use crate::sim_cdu::{fallback, SimCdu};
use crate::tally::{Declared, Tally};

/// The CDU's pumps, valves and fallback as the hall played them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlantState {
    /// Pump A and B running: told to (or on the fallback), the drive not
    /// tripped. A seized pump runs, as its contactor says, and moves no
    /// water.
    pub pumps_running: [bool; 2],
    /// Per rack: its valve open (as told, or stuck open).
    pub valves_open: Vec<bool>,
    /// On its own fallback.
    pub fallback: bool,
}

impl PlantState {
    /// The CDU at rest, before the hall has played anything: its pumps and
    /// valves as `cdu`'s settings tell them, for `racks` racks, no fault,
    /// no fallback (a setting the map lacks reads as 0).
    fn at_rest(cdu: &SimCdu, racks: usize) -> Self {
        let told = |name: &str| cdu.setting(name).unwrap_or(0.0) as u32;
        let (run, valves) = (told("pumps_run"), told("valves_open"));
        Self {
            pumps_running: [run & 1 != 0, run & 2 != 0],
            valves_open: (0..racks).map(|r| valves & (1 << r) != 0).collect(),
            fallback: false,
        }
    }
}

/// The simulated hall.
pub struct Hall {
    plant: Plant,
    scenario: Scenario,
    cdu: SimCdu,
    lines: SimLines,
    pins: PinMap,
    caps: Vec<Option<f64>>,
    follow: HostFollow,
    failed: Vec<bool>,
    t: f64,
    /// The CDU's sensors as faults leave them: the five of the loop, then
    /// the outdoor one.
    sensors: [SensorState; 6],
    /// The heartbeat register's last value and when it changed, s.
    heartbeat: Option<(f64, f64)>,
    /// The relay line's last level and when it changed, s.
    relay: Option<(bool, f64)>,
    /// The CDU's pumps, valves and fallback as the last step played them.
    played: PlantState,
    /// The summary's figures besides the plant's.
    tally: Tally,
    /// What the controller last declared (`None`: it is down and
    /// declares nothing).
    declared: Option<Declared>,
}

impl Hall {
    /// A hall playing `scenario`, its CDU serving `cdu`'s registers and its
    /// board on `lines` mapped by `pins`.
    pub fn new(scenario: Scenario, cdu: SimCdu, lines: SimLines, pins: PinMap) -> Self {
        // The plant is the hall as it is, not as configured.
        let plant = Plant::new(scenario.truth.clone(), scenario.ambient.at(0.0).max(20.0));
        let n = plant.gpus().len();
        let site = plant.site();
        let follow = HostFollow::new(site.racks * site.hosts_per_rack, site.gpus_per_host);
        let site_racks = site.racks;
        // A CDU at rest runs its lead pump.
        if cdu.setting("pumps_run").is_ok_and(|r| r == 0.0) {
            let lead = cdu.setting("lead_pump").unwrap_or(0.0).min(1.0);
            let _ = cdu.write_setting("pumps_run", if lead == 1.0 { 2.0 } else { 1.0 });
        }
        let lead0 = cdu.setting("lead_pump").unwrap_or(0.0).min(1.0) as usize;
        let played = PlantState::at_rest(&cdu, site_racks);
        // Dry, whole ropes at start.
        for r in &pins.ropes {
            lines.assert(&r.leak, false);
            lines.assert(&r.fault, false);
        }
        let mut hall = Self {
            plant,
            scenario,
            cdu,
            lines,
            pins,
            caps: vec![None; n],
            follow,
            failed: vec![false; n],
            t: 0.0,
            sensors: [SensorState::default(); 6],
            heartbeat: None,
            relay: None,
            played,
            tally: Tally::new(site_racks, lead0),
            declared: None,
        };
        // The outdoor sensor reads from the start (its register's 0 would
        // pass for a 0 °C day), no time yet to drift; the loop's sensors
        // read at the first step.
        let sensing: Vec<FaultKind> = hall.scenario.active(0.0).cloned().collect();
        let truth = hall.scenario.ambient.at(0.0);
        let outdoor = hall.sensor(&sensing, 5, SensorName::OutdoorTemp, truth, 0.0);
        if let Err(e) = hall.show_outdoor(outdoor) {
            tracing::warn!("hall: the outdoor sensor's register: {e}");
        }
        hall
    }

    /// Simulated time, s.
    pub fn time_s(&self) -> f64 {
        self.t
    }

    /// The CDU ran on its own fallback at the last step (it lost its
    /// controller's heartbeat or relay).
    pub fn in_fallback(&self) -> bool {
        self.played.fallback
    }

    /// The CDU's pumps, valves and fallback as the last step played them
    /// (before the first step: as its settings tell them, at rest).
    pub fn plant_state(&self) -> &PlantState {
        &self.played
    }

    /// The controller now declares `d` (its last commands), counted from
    /// the next step on; `None`: it is down (or has not yet commanded)
    /// and declares nothing, as `simulate` counts nothing while it is down.
    pub fn declare(&mut self, d: Option<Declared>) {
        self.declared = d;
    }

    /// An operator cleared the leak latched on `rack`: its valve reopening
    /// from now on is attended, not unattended.
    pub fn leak_cleared(&mut self, rack: usize) {
        self.tally.cleared(rack);
    }

    /// The controller's process stopped to start again (a
    /// `controller_restart` played through the real shell).
    pub fn controller_restarted(&mut self) {
        self.tally.restarted();
    }

    /// The summary of the run so far (`docs/plant-model.md` §8.3), as `simulate`
    /// reports it, named `scenario`, for `controller`.
    pub fn summary(&self, scenario: &str, controller: &str) -> crate::sim::Summary {
        let leaks = self.scenario.leaks_before(self.t);
        let t = self.plant.totals();
        self.tally
            .summary(scenario, controller, self.t.round() as u64, &t, leaks)
    }

    /// The plant (for the report; a controller must not read it).
    pub fn plant(&self) -> &Plant {
        &self.plant
    }

    /// Every GPU's state.
    pub fn gpus(&self) -> &[GpuState] {
        self.plant.gpus()
    }

    /// A host's cap on GPU `i` (`None`: its default limit).
    pub fn set_cap(&mut self, i: usize, cap: Option<f64>) {
        if let Some(c) = self.caps.get_mut(i) {
            *c = cap;
        }
    }

    /// The cap a host put on GPU `i`.
    pub fn cap(&self, i: usize) -> Option<f64> {
        self.caps.get(i).copied().flatten()
    }

    /// GPUs the scenario has failed (XID 79).
    pub fn failed(&self) -> &[bool] {
        &self.failed
    }

    /// GPU `i`'s node agent quarantined it now: its job is drained 30 s
    /// later by the hall's clock (its demand drops to 0).
    pub fn quarantined(&mut self, i: usize) {
        self.follow.quarantine(i, self.t);
    }

    /// GPU `i`'s node agent released it: it takes work again at once.
    pub fn released(&mut self, i: usize) {
        self.follow.release(i);
    }

    /// The hosts of `rack` were told now that their cooling is lost
    /// (`true`: they drain and power their GPUs down 30 s later) or back
    /// (`false`: they power up and their jobs resume, as an operator
    /// restarts them).
    pub fn set_rack_cooling_lost(&mut self, rack: usize, lost: bool) {
        let per_rack = self.plant.site().hosts_per_rack;
        for host in rack * per_rack..(rack + 1) * per_rack {
            if lost {
                self.follow.cooling_lost(host, self.t);
            } else {
                self.follow.cooling_restored(host);
            }
        }
    }

    /// Host `host`'s agent powered its GPUs down now (its cooling-loss
    /// action, after its grace period): from now they draw nothing.
    pub fn host_powered_down(&mut self, host: usize) {
        self.follow.power_down(host, self.t);
    }

    /// Host `host`'s agent said cooling is back (it powered up or resumed):
    /// its GPUs take work again at once.
    pub fn host_restored(&mut self, host: usize) {
        self.follow.cooling_restored(host);
    }

    /// Sensor `k` (`name`) reading `truth` after `dt` seconds under the
    /// `active` faults: lost, stuck, or drifting by its rate per minute
    /// (by the rule simulate reads its sensors by, [`SensorFault::of`]).
    fn sensor(
        &mut self,
        active: &[FaultKind],
        k: usize,
        name: SensorName,
        truth: f64,
        dt: f64,
    ) -> Option<f64> {
        self.sensors[k].read(SensorFault::of(active, name), truth, dt)
    }

    /// Whether the CDU has lost its controller: a heartbeat or relay it
    /// has seen has not changed for the timeout.
    fn controller_lost(&mut self) -> Result<bool, ValueError> {
        let t = self.t;
        note_change(&mut self.heartbeat, self.cdu.setting("heartbeat")?, t);
        let level = self.lines.asserted(&self.pins.controller_healthy);
        note_change(&mut self.relay, level, t);
        let timeout = self.plant.site().secondary.heartbeat_timeout_s;
        let stale = |at: f64| at.is_finite() && t - at >= timeout;
        Ok(self.heartbeat.is_some_and(|(_, at)| stale(at))
            || self.relay.is_some_and(|(_, at)| stale(at)))
    }

    /// What the plant's actuators do: what the CDU was told, or its own
    /// fallback when it lost its controller (not in local mode). Notes it
    /// as the plant state played from now.
    fn actuation(
        &mut self,
        active: &[FaultKind],
        cond: &mut crate::plant::Conditions,
    ) -> Result<Actuation, ValueError> {
        let racks = self.plant.site().racks;
        let valves_bits = self.cdu.setting("valves_open")? as u32;
        let run = self.cdu.setting("pumps_run")? as u32;
        let lead = (self.cdu.setting("lead_pump")? as usize).min(1);
        let lost = self.controller_lost()? && !self.cdu.local();
        let mut pump_on = [run & 1 != 0, run & 2 != 0];
        let (mut setpoint_c, mut pump_speed) = (
            self.cdu.setting("supply_setpoint")?,
            self.cdu.setting("pump_speed")? / 100.0,
        );
        if lost {
            (setpoint_c, pump_speed, pump_on) =
                fallback(&self.plant.site().secondary, pump_on, lead);
        }
        let powered_down = self.follow.apply(self.t, &mut cond.demand);
        let valves: Vec<bool> = (0..racks)
            .map(|r| active.contains(&FaultKind::ValveStuck(r)) || valves_bits & (1 << r) != 0)
            .collect();
        let tripped = |i: usize| active.contains(&FaultKind::PumpTrip(i));
        self.played = PlantState {
            pumps_running: [0, 1].map(|i| pump_on[i] && !tripped(i)),
            valves_open: valves.clone(),
            fallback: lost,
        };
        Ok(Actuation {
            setpoint_c,
            pump_speed,
            pump_on,
            valves,
            caps: self.caps.clone(),
            powered_down,
        })
    }

    /// Advances the hall by `dt` seconds.
    pub fn step(&mut self, dt: f64) -> Result<(), ValueError> {
        let site = self.plant.site();
        let per_host = site.gpus_per_host;
        let per_rack = site.hosts_per_rack * per_host;
        let racks = site.racks;
        let active: Vec<FaultKind> = self.scenario.active(self.t).cloned().collect();
        for f in &active {
            if let FaultKind::GpuFail(r, h, g) = f {
                let i = r * per_rack + h * per_host + g;
                if !self.failed[i] {
                    self.failed[i] = true;
                    self.plant.fail_gpu(i);
                }
            }
        }
        let local = active.contains(&FaultKind::CduWriteRefused);
        if self.cdu.local() && !local {
            self.local_ended();
        }
        self.cdu.set_local(local);
        // A Modbus outage: the CDU's gateway answers nothing for it.
        self.cdu.set_cut(active.contains(&FaultKind::ModbusOutage));
        // The hosts drain and power down by the hall's clock.
        let mut cond = self.scenario.conditions(self.t, &self.failed);
        let act = self.actuation(&active, &mut cond)?;
        if let Some(d) = &self.declared {
            self.tally.declared(d, dt);
        }
        self.tally.lead(crate::sim::lead_of(act.pump_on));
        self.plant.step(dt, &act, &cond);
        let leaking: Vec<bool> = (0..racks)
            .map(|r| active.contains(&FaultKind::Leak(r)))
            .collect();
        let flowing = self.plant.meters().flow_lpm > 0.0;
        self.tally.account(&leaking, &act.valves, flowing, dt);
        self.t += dt;
        self.show_board(&active);
        // The sensors drift and stick whether or not anyone reads them.
        let readings = self.sense(dt);
        // During a Modbus outage the registers keep their last values and
        // every request fails (the gateway's exception 11).
        if active.contains(&FaultKind::ModbusOutage) {
            return Ok(());
        }
        self.show_registers(&act, &active, &readings)
    }

    /// Local mode ended (an operator at the panel handed the CDU back):
    /// the heartbeat and the relay it has seen are timed from now, so a
    /// controller whose writes it refused is not taken as lost at once.
    fn local_ended(&mut self) {
        let t = self.t;
        if let Some((_, at)) = self.heartbeat.as_mut().filter(|(_, at)| at.is_finite()) {
            *at = t;
        }
        if let Some((_, at)) = self.relay.as_mut().filter(|(_, at)| at.is_finite()) {
            *at = t;
        }
    }

    /// The CDU's sensors at the new time after a step of `dt` seconds, as
    /// the scenario's faults leave them: the five of the loop (supply,
    /// return, flow, facility supply, differential pressure), then the
    /// outdoor one.
    fn sense(&mut self, dt: f64) -> [Option<f64>; 6] {
        let m = self.plant.meters();
        let sensing: Vec<FaultKind> = self.scenario.active(self.t).cloned().collect();
        let truths = [
            (SensorName::SupplyTemp, m.supply_c),
            (SensorName::ReturnTemp, m.return_c),
            (SensorName::Flow, m.flow_lpm),
            (SensorName::FacilitySupplyTemp, m.facility_supply_c),
            (SensorName::DiffPressure, m.diff_pressure_kpa),
            (SensorName::OutdoorTemp, self.scenario.ambient.at(self.t)),
        ];
        let mut out = [None; 6];
        for (k, (name, truth)) in truths.into_iter().enumerate() {
            out[k] = self.sensor(&sensing, k, name, truth, dt);
        }
        out
    }

    /// The ropes on the board's lines: wet where a rack leaks (a cut rope
    /// reads dry and raises its fault line); every read fails while the
    /// input lines fail.
    fn show_board(&self, active: &[FaultKind]) {
        for rope in &self.pins.ropes {
            let cut = active.contains(&FaultKind::RopeCut(rope.rack));
            let wet = active.contains(&FaultKind::Leak(rope.rack)) && !cut;
            self.lines.assert(&rope.leak, wet);
            self.lines.assert(&rope.fault, cut);
        }
        self.lines
            .set_failing(active.contains(&FaultKind::BoardIoFault));
    }

    /// What the CDU shows in its input registers after a step, its
    /// sensors reading `readings` ([`Hall::sense`]). Every register is
    /// written even where one cannot take its value: the first such error
    /// is returned once all are written.
    fn show_registers(
        &self,
        act: &Actuation,
        active: &[FaultKind],
        readings: &[Option<f64>; 6],
    ) -> Result<(), ValueError> {
        let mut first = None;
        let mut note = |r: Result<(), ValueError>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        let registers = [
            "supply_temp",
            "return_temp",
            "flow",
            "facility_supply_temp",
            "diff_pressure",
        ];
        for (register, v) in registers.into_iter().zip(readings) {
            // A lost sensor reads as its register's floor (0), as a broken
            // 4-20 mA loop does; the controller must tell it from a reading.
            // A reading past the register's range shows at its end.
            let shown = self.saturated(register, v.unwrap_or(0.0).max(0.0));
            note(self.cdu.set_measurement(register, shown));
        }
        note(self.show_outdoor(readings[5]));
        for (register, v) in self.status_measurements(act, active) {
            note(self.cdu.set_measurement(register, v));
        }
        first.map_or(Ok(()), Err)
    }

    /// The CDU's measurements besides its sensors after a step: pumps,
    /// valves, leak inputs and meters.
    fn status_measurements(
        &self,
        act: &Actuation,
        active: &[FaultKind],
    ) -> [(&'static str, f64); 9] {
        let m = self.plant.meters();
        let racks = self.plant.site().racks;
        // A seized pump's contactor reads running; a tripped one shows
        // its drive's fault.
        let tripped = |i: usize| f64::from(u8::from(active.contains(&FaultKind::PumpTrip(i))));
        let running = self.played.pumps_running.map(|on| f64::from(u8::from(on)));
        let bits = |f: &dyn Fn(usize) -> bool| -> f64 {
            f64::from((0..racks).filter(|r| f(*r)).map(|r| 1u32 << r).sum::<u32>())
        };
        // A stuck position input reads what it is stuck at.
        let closed = |r: usize| crate::sim::feedback_stuck(active, r).unwrap_or(!act.valves[r]);
        // The CDU's leak inputs are the same ropes, wired to it too.
        let leak_bits = bits(&|r| {
            active.contains(&FaultKind::Leak(r)) && !active.contains(&FaultKind::RopeCut(r))
        });
        [
            ("pump_a_running", running[0]),
            ("pump_b_running", running[1]),
            ("pump_a_fault", tripped(0)),
            ("pump_b_fault", tripped(1)),
            ("valves_closed", bits(&closed)),
            ("leak_inputs", leak_bits),
            ("it_power", m.it_w.round()),
            ("cooling_power", (m.pump_w + m.fans_w + m.chiller_w).round()),
            ("facility_power", m.facility_w.round()),
        ]
    }
}

impl Hall {
    /// The dry cooler's outdoor sensor in the CDU's `outdoor_temp`, where
    /// its map has one, with the scenario's sensor faults. Outdoor air
    /// may be below 0 °C, so a lost sensor cannot read 0 as the loop's
    /// do: it reads the register type's "no value" sentinel (0x8000 in an
    /// i16: -327.68 °C at 0.01; 0xFFFF in a u16, 0xFFFFFFFF in a u32),
    /// which the controller's map reads as no reading
    /// ([`RegisterMap::reading`](loopwarden_boards::modbus_map::RegisterMap::reading)).
    /// A reading, a drift included, is held within the register's other
    /// values ([`Hall::saturated`]): below 0 °C an unsigned register
    /// shows 0. `reading`: what the sensor reads (`None`: lost).
    fn show_outdoor(&self, reading: Option<f64>) -> Result<(), ValueError> {
        const REGISTER: &str = "outdoor_temp";
        let Some(r) = self.cdu.map().get(REGISTER) else {
            return Ok(());
        };
        let v = match reading {
            Some(v) => self.saturated(REGISTER, v),
            None => r.ty.raw_of(r.ty.sentinel()) * r.scale,
        };
        self.cdu.set_measurement(REGISTER, v)
    }

    /// `v` held within what measurement `register` can show: its type's
    /// range at its scale less the type's "no value" sentinel (0x8000 in
    /// an i16, 0xFFFF in a u16), as a transmitter past its span reads its
    /// span's end. A register the map lacks: `v` as it is.
    fn saturated(&self, register: &str, v: f64) -> f64 {
        let Some(r) = self.cdu.map().get(register) else {
            return v;
        };
        let (mut lo, mut hi) = r.ty.raw_range();
        let sentinel = r.ty.raw_of(r.ty.sentinel());
        if sentinel == lo {
            lo += 1.0;
        } else if sentinel == hi {
            hi -= 1.0;
        }
        let (a, b) = (lo * r.scale, hi * r.scale);
        v.clamp(a.min(b), a.max(b))
    }
}

/// Notes a watched signal's value `v` at `t`: when it last changed. The
/// first value seen is the CDU's own, not the controller's: its time is
/// never, so it cannot go stale.
fn note_change<T: PartialEq>(slot: &mut Option<(T, f64)>, v: T, t: f64) {
    if slot.as_ref().is_none_or(|(old, _)| *old != v) {
        let at = if slot.is_some() { t } else { f64::NEG_INFINITY };
        *slot = Some((v, at));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_boards::modbus_map::RegisterMap;
    use loopwarden_boards::pins::BoardPins;

    fn hall(extra: &str) -> (Hall, SimCdu, SimLines) {
        hall_on(RegisterMap::sim_cdu(), extra)
    }

    /// The test hall's scenario: an hour, two racks, `extra`'s faults.
    fn scenario_of(extra: &str) -> Scenario {
        let text = format!(
            "format = \"plant-scenario/1\"\ndescription = \"t\"\nduration_s = 3600\nseed = 1\n\
             [site]\nracks = 2\n[ambient]\npoints = [[0, 20.0]]\n[load]\nall = [[0, 0.8]]\n{extra}"
        );
        Scenario::from_toml(&text, "t.toml").unwrap()
    }

    /// A hall whose CDU serves `map`.
    fn hall_on(map: RegisterMap, extra: &str) -> (Hall, SimCdu, SimLines) {
        hall_playing(map, scenario_of(extra))
    }

    /// A hall playing `s`, its CDU serving `map`.
    fn hall_playing(map: RegisterMap, s: Scenario) -> (Hall, SimCdu, SimLines) {
        let cdu = SimCdu::new(
            map,
            &[
                ("supply_setpoint", 30.0),
                ("pump_speed", 100.0),
                ("valves_open", 3.0),
                ("pumps_run", 1.0),
            ],
        )
        .unwrap();
        let lines = SimLines::new();
        let h = Hall::new(s, cdu.clone(), lines.clone(), PinMap::sim_controller());
        (h, cdu, lines)
    }

    /// A measurement as a client reads it from the input registers.
    fn input(cdu: &SimCdu, name: &str) -> f64 {
        cdu.measurement(name).unwrap()
    }

    #[test]
    fn the_plant_follows_what_is_written_to_the_cdu_and_shows_in_its_registers() {
        let (mut h, cdu, _) = hall("");
        for _ in 0..600 {
            h.step(1.0).unwrap();
        }
        assert!((input(&cdu, "supply_temp") - 30.0).abs() < 0.05);
        cdu.write_setting("supply_setpoint", 36.0).unwrap();
        for _ in 0..600 {
            h.step(1.0).unwrap();
        }
        assert!((input(&cdu, "supply_temp") - 36.0).abs() < 0.05);
        assert!(
            (input(&cdu, "flow") - 2.0 * 32.0 * 1.5).abs() < 0.1,
            "2 racks at 100 %"
        );
        assert!(input(&cdu, "it_power") > 40_000.0);
        assert_eq!(input(&cdu, "pump_a_running"), 1.0);
    }

    #[test]
    fn a_leak_wets_its_rope_a_cut_rope_raises_its_fault_and_pumps_run_as_told() {
        let (mut h, cdu, lines) = hall(
            "[[fault]]\nat_s = 10\nkind = \"leak\"\ntarget = \"1\"\n\
             [[fault]]\nat_s = 10\nkind = \"rope_cut\"\ntarget = \"0\"\n\
             [[fault]]\nat_s = 10\nkind = \"pump_seized\"\ntarget = \"B\"\n",
        );
        let map = PinMap::sim_controller();
        let mut pins = BoardPins::new(&map, |n| lines.input(n), |n| lines.output(n));
        for _ in 0..20 {
            h.step(1.0).unwrap();
        }
        assert_eq!(
            pins.rope(1).unwrap().map(|r| (r.wet, r.fault)),
            Ok((true, false))
        );
        assert_eq!(
            pins.rope(0).unwrap().map(|r| (r.wet, r.fault)),
            Ok((false, true))
        );
        assert_eq!(input(&cdu, "leak_inputs"), 2.0, "bit 1");
        assert!((input(&cdu, "diff_pressure") - 100.0).abs() < 0.1);
        // Both stopped: no flow, no pressure.
        cdu.write_setting("pumps_run", 0.0).unwrap();
        h.step(1.0).unwrap();
        assert_eq!(
            (input(&cdu, "flow"), input(&cdu, "diff_pressure")),
            (0.0, 0.0)
        );
        assert_eq!(input(&cdu, "pump_a_running"), 0.0);
        // B is seized: it reads running and moves nothing.
        cdu.write_setting("pumps_run", 2.0).unwrap();
        for _ in 0..15 {
            h.step(1.0).unwrap();
        }
        assert_eq!(input(&cdu, "pump_b_running"), 1.0);
        assert_eq!(
            (input(&cdu, "flow"), input(&cdu, "pump_b_fault")),
            (0.0, 0.0)
        );
    }

    #[test]
    fn the_cdu_falls_back_when_the_heartbeat_stops_and_holds_in_local_mode() {
        let (mut h, cdu, _) =
            hall("[[fault]]\nat_s = 400\nuntil_s = 500\nkind = \"cdu_write_refused\"\n");
        cdu.write_setting("supply_setpoint", 40.0).unwrap();
        // The controller writes a new heartbeat every second until 200 s.
        for k in 0..200 {
            cdu.write_setting("heartbeat", f64::from(k)).unwrap();
            h.step(1.0).unwrap();
        }
        assert!((input(&cdu, "supply_temp") - 40.0).abs() < 0.1);
        for _ in 200..209 {
            h.step(1.0).unwrap();
        }
        assert!(input(&cdu, "supply_temp") > 39.0, "held for the timeout");
        for _ in 209..400 {
            h.step(1.0).unwrap();
        }
        assert!(
            (input(&cdu, "supply_temp") - 25.0).abs() < 0.1,
            "its own 25 °C"
        );
        assert_eq!(input(&cdu, "flow"), 2.0 * 32.0 * 1.5, "at full speed");
        // Local mode: writes refused, its setpoint kept, no fallback.
        h.step(1.0).unwrap();
        assert!(cdu.local());
        assert!(
            cdu.write_setting("heartbeat", 1.0).is_ok(),
            "the twin's own write"
        );
    }

    #[test]
    fn the_hall_drains_a_quarantined_gpu_and_powers_a_rack_down_by_its_own_clock() {
        let (mut h, _, _) = hall("");
        for _ in 0..100 {
            h.step(1.0).unwrap();
        }
        h.quarantined(3);
        h.set_rack_cooling_lost(1, true);
        // Half-second steps: 59 of them are 29.5 s.
        for _ in 0..59 {
            h.step(0.5).unwrap();
        }
        assert!(h.gpus()[3].demand > 0.7, "still working at 29.5 s");
        assert!(h.gpus()[32..]
            .iter()
            .all(|g| !g.powered_down && g.power > 0.0));
        h.step(0.5).unwrap();
        h.step(0.5).unwrap();
        let g = h.gpus();
        assert_eq!((g[3].demand, g[3].work), (0.0, 0.0), "drained from 30 s");
        assert!(
            g[3].power > 0.0 && !g[3].powered_down,
            "idle, still powered"
        );
        assert_eq!(g[4].demand, 0.8, "its neighbour works on");
        for g in &g[32..] {
            assert!(g.powered_down && !g.shut_down);
            assert_eq!((g.power, g.work), (0.0, 0.0));
        }
        h.set_rack_cooling_lost(1, false);
        h.released(3);
        h.step(1.0).unwrap();
        assert!(h.gpus()[32..]
            .iter()
            .all(|g| !g.powered_down && g.work > 0.7));
        assert!(h.gpus()[3].work > 0.7);
        assert_eq!(h.plant().totals().shutdowns, 0);
    }

    #[test]
    fn the_outdoor_sensor_shows_in_its_register_with_its_faults() {
        // Ambient -5 °C rising to 5 °C over 1000 s: 0.6 K a minute.
        let (mut h, cdu, _) = hall(
            "[[fault]]\nat_s = 100\nuntil_s = 200\nkind = \"sensor_stuck\"\ntarget = \"outdoor_temp\"\n\
             [[fault]]\nat_s = 300\nuntil_s = 360\nkind = \"sensor_drift\"\ntarget = \"outdoor_temp\"\nvalue = 2.0\n\
             [[fault]]\nat_s = 400\nuntil_s = 500\nkind = \"sensor_lost\"\ntarget = \"outdoor_temp\"\n\
             [[fault]]\nat_s = 600\nuntil_s = 700\nkind = \"modbus_outage\"\n",
        );
        h.scenario.ambient = crate::scenario::Curve(vec![[0.0, -5.0], [1000.0, 5.0]]);
        let truth = |t: f64| -5.0 + t / 100.0;
        let mut seen = vec![f64::NAN];
        for _ in 0..800 {
            h.step(1.0).unwrap();
            seen.push(input(&cdu, "outdoor_temp"));
        }
        // seen[t]: the register after the step that ended at t s.
        assert!(
            (seen[50] - truth(50.0)).abs() < 0.006,
            "below 0 °C: {}",
            seen[50]
        );
        assert_eq!(seen[150], seen[100], "stuck");
        assert!((seen[250] - truth(250.0)).abs() < 0.006);
        // 60 s of drift at 2 K/min by the last second of it.
        let off = seen[359] - truth(359.0);
        assert!((off - 2.0).abs() < 0.006, "{off}");
        // Lost: 0x8000 in the register, not a plausible 0 °C.
        assert!((seen[450] + 327.68).abs() < 1e-9, "{}", seen[450]);
        assert_eq!(
            cdu.map().encode("outdoor_temp", seen[450]).unwrap(),
            vec![0x8000]
        );
        assert!((seen[550] - truth(550.0)).abs() < 0.006, "back");
        // During the Modbus outage the register keeps its last value.
        assert!((seen[600] - truth(600.0)).abs() < 0.006);
        assert_eq!(seen[650], seen[600]);
        assert_eq!(seen[700], seen[600]);
        assert!((seen[750] - truth(750.0)).abs() < 0.006);
    }

    /// The shipped map with `outdoor_temp` as an unsigned register of
    /// `ty` ("u16" or "u32") at 0.1 °C.
    fn map_with_unsigned_outdoor(ty: &str) -> RegisterMap {
        let text = include_str!("../../boards/cdus/sim-cdu.toml");
        let at = text.find("name = \"outdoor_temp\"").unwrap();
        let (head, tail) = text.split_at(at);
        let tail = tail
            .replacen("type = \"i16\"", &format!("type = \"{ty}\""), 1)
            .replacen("scale = 0.01", "scale = 0.1", 1);
        RegisterMap::from_toml(&format!("{head}{tail}"), "unsigned outdoor_temp").unwrap()
    }

    #[test]
    fn a_lost_outdoor_sensor_in_an_unsigned_register_reads_as_lost_not_as_0() {
        for ty in ["u16", "u32"] {
            let map = map_with_unsigned_outdoor(ty);
            let (mut h, cdu, _) = hall_on(
                map.clone(),
                "[[fault]]\nat_s = 100\nuntil_s = 200\nkind = \"sensor_lost\"\ntarget = \"outdoor_temp\"\n",
            );
            // What the controller reads from the register's words.
            let read = |cdu: &SimCdu| {
                let words = map
                    .encode("outdoor_temp", input(cdu, "outdoor_temp"))
                    .unwrap();
                map.reading("outdoor_temp", &words).unwrap()
            };
            let mut seen = vec![None];
            for _ in 0..300 {
                h.step(1.0).unwrap();
                seen.push(read(&cdu));
            }
            assert_eq!(seen[50], Some(20.0), "{ty}: a reading before");
            assert_eq!(seen[150], None, "{ty}: lost, not a plausible 0 °C");
            assert_eq!(seen[250], Some(20.0), "{ty}: back");
        }
    }

    #[test]
    fn a_drift_grows_by_the_simulated_second_whatever_the_step_and_through_an_outage() {
        // 2 K/min on the outdoor sensor from 0 s to 60 s; a Modbus outage
        // from 20 s to 40 s freezes the register, not the drift.
        let faults = "[[fault]]\nat_s = 0\nuntil_s = 60\nkind = \"sensor_drift\"\ntarget = \"outdoor_temp\"\nvalue = 2.0\n";
        for outage in [
            "",
            "[[fault]]\nat_s = 20\nuntil_s = 40\nkind = \"modbus_outage\"\n",
        ] {
            let (mut h, cdu, _) = hall(&format!("{faults}{outage}"));
            assert_eq!(
                input(&cdu, "outdoor_temp"),
                20.0,
                "no drift before time passes"
            );
            // 240 quarter-second steps: 60 s.
            for _ in 0..239 {
                h.step(0.25).unwrap();
            }
            let off = input(&cdu, "outdoor_temp") - 20.0;
            assert!(
                (off - 2.0 * 59.75 / 60.0).abs() < 0.006,
                "{outage:?}: {off}"
            );
        }
    }

    #[test]
    fn the_cdu_does_not_fall_back_when_local_mode_ends() {
        // Local mode from 100 s to 200 s, longer than the 10 s timeout;
        // the controller writes its heartbeat before every step (refused
        // while local).
        let (mut h, cdu, _) =
            hall("[[fault]]\nat_s = 100\nuntil_s = 200\nkind = \"cdu_write_refused\"\n");
        for k in 0..210 {
            // A client's write is refused while the CDU is local.
            if !cdu.local() {
                cdu.write_setting("heartbeat", f64::from(k)).unwrap();
            }
            let t = h.time_s();
            h.step(1.0).unwrap();
            assert!(!h.in_fallback(), "the step from {t} s");
        }
    }

    #[test]
    fn a_valve_reopened_after_an_operator_cleared_its_leak_is_not_unattended() {
        for (clear, unattended) in [(false, 1), (true, 0)] {
            let (mut h, cdu, _) =
                hall("[[fault]]\nat_s = 10\nuntil_s = 20\nkind = \"leak\"\ntarget = \"0\"\n");
            for k in 0..40 {
                match k {
                    12 => cdu.write_setting("valves_open", 2.0).unwrap(),
                    30 if clear => h.leak_cleared(0),
                    31 => cdu.write_setting("valves_open", 3.0).unwrap(),
                    _ => {}
                }
                h.step(1.0).unwrap();
            }
            let s = h.summary("t", "c");
            assert_eq!(s.valve_reopened_unattended, unattended, "cleared: {clear}");
        }
    }

    #[test]
    fn a_controller_that_declares_nothing_is_counted_for_nothing() {
        let (mut h, _, _) = hall("");
        let d = Declared {
            caps: 2,
            failsafe: true,
            ..Declared::default()
        };
        h.declare(Some(d));
        for _ in 0..10 {
            h.step(1.0).unwrap();
        }
        h.declare(None);
        for _ in 0..10 {
            h.step(1.0).unwrap();
        }
        let s = h.summary("t", "c");
        assert_eq!((s.cap_requests, s.failsafe_s), (20, 10));
    }

    /// The plant state as the CDU's registers show it (true where no
    /// fault makes them lie).
    fn shown(cdu: &SimCdu, fallback: bool) -> PlantState {
        let closed = input(cdu, "valves_closed") as u32;
        PlantState {
            pumps_running: ["pump_a_running", "pump_b_running"].map(|p| input(cdu, p) != 0.0),
            valves_open: (0..2).map(|r| closed & (1 << r) == 0).collect(),
            fallback,
        }
    }

    #[test]
    fn the_plant_state_is_what_the_hall_played_whatever_its_registers_show() {
        // A pump trip, a valve stuck open, the heartbeat stopping; then B
        // tripping in a Modbus outage (the registers frozen) and rack 0's
        // position input stuck open.
        let (mut h, cdu, _) = hall(
            "[truth.loop]\nheartbeat_timeout_s = 2.0\n\
             [[fault]]\nat_s = 10\nuntil_s = 30\nkind = \"pump_trip\"\ntarget = \"A\"\n\
             [[fault]]\nat_s = 20\nkind = \"valve_stuck\"\ntarget = \"1\"\n\
             [[fault]]\nat_s = 60\nuntil_s = 70\nkind = \"modbus_outage\"\n\
             [[fault]]\nat_s = 62\nuntil_s = 66\nkind = \"pump_trip\"\ntarget = \"B\"\n\
             [[fault]]\nat_s = 80\nkind = \"valve_feedback_stuck\"\ntarget = \"0\"\nvalue = 0\n",
        );
        assert_eq!(
            h.plant_state(),
            &PlantState {
                pumps_running: [true, false],
                valves_open: vec![true, true],
                fallback: false,
            },
            "at rest, as told"
        );
        let writes: [(f64, &str, f64); 5] = [
            (2.0, "heartbeat", 1.0),
            (4.0, "valves_open", 1.0),
            (12.0, "pumps_run", 3.0),
            (24.0, "valves_open", 0.0),
            (40.0, "pumps_run", 2.0),
        ];
        // Per step, from its start time: what it played, what shows.
        let mut seen = Vec::new();
        for _ in 0..90 {
            let t = h.time_s();
            for (at, name, v) in writes {
                if at == t {
                    cdu.write_setting(name, v).unwrap();
                }
            }
            h.step(1.0).unwrap();
            let played = h.plant_state().clone();
            assert_eq!(played.fallback, h.in_fallback());
            let shows = shown(&cdu, h.in_fallback());
            if !((60.0..70.0).contains(&t) || t >= 80.0) {
                assert_eq!(played, shows, "the step from {t} s");
            }
            seen.push((played, shows));
        }
        // Each case was played: A tripped, both running, rack 1 stuck
        // open though written shut, the fallback.
        let played = |t: usize| &seen[t].0;
        assert!(!played(0).fallback && played(50).fallback);
        assert_eq!(played(11).pumps_running, [false, false]);
        assert_eq!(played(15).pumps_running, [false, true]);
        assert_eq!(played(35).pumps_running, [true, true]);
        assert_eq!(played(35).valves_open, [false, true]);
        // B tripped in the outage: it stopped while the frozen registers
        // still show it running.
        assert_eq!(played(63).pumps_running, [false, false]);
        assert_eq!(seen[63].1.pumps_running, [false, true]);
        assert_eq!(played(75).pumps_running, [false, true]);
        // Rack 0's valve is shut, its input reads it open.
        assert_eq!(
            (played(85).valves_open[0], seen[85].1.valves_open[0]),
            (false, true)
        );
    }

    #[test]
    fn closing_a_valve_written_over_modbus_starves_that_rack_only() {
        let (mut h, cdu, _) = hall("");
        for _ in 0..300 {
            h.step(1.0).unwrap();
        }
        cdu.write_setting("valves_open", 1.0).unwrap();
        for _ in 0..60 {
            h.step(1.0).unwrap();
        }
        let g = h.gpus();
        assert!(g[40].t_j > g[0].t_j + 10.0, "rack 1 heats without flow");
    }

    #[test]
    fn a_loop_sensor_past_its_register_saturates_and_every_other_register_still_updates() {
        // The supply sensor drifts past its i16 register at 0.01 (327.67
        // °C) within a minute; pump A trips after it has.
        let (mut h, cdu, _) = hall(
            "[[fault]]\nat_s = 0\nkind = \"sensor_drift\"\ntarget = \"supply_temp\"\nvalue = 600.0\n\
             [[fault]]\nat_s = 60\nkind = \"pump_trip\"\ntarget = \"A\"\n",
        );
        for k in 0..120 {
            h.step(1.0).unwrap_or_else(|e| panic!("step {k}: {e}"));
        }
        assert_eq!(
            input(&cdu, "supply_temp"),
            327.67,
            "held at its register's top"
        );
        assert_eq!(
            (input(&cdu, "pump_a_running"), input(&cdu, "pump_a_fault")),
            (0.0, 1.0),
            "the trip shows"
        );
        // A register that cannot take its value (here one the map lacks)
        // fails the step, naming it, and every other register still shows.
        let text = include_str!("../../boards/cdus/sim-cdu.toml");
        let (start, end) = (
            text.find("[[register]]").unwrap(),
            text.find("name = \"return_temp\"").unwrap(),
        );
        let without = format!(
            "{}{}",
            &text[..start],
            &text[end - "[[register]]\n".len()..]
        );
        let map = RegisterMap::from_toml(&without, "no supply").unwrap();
        let (mut h, cdu, _) = hall_on(
            map,
            "[[fault]]\nat_s = 5\nkind = \"pump_trip\"\ntarget = \"A\"\n",
        );
        for _ in 0..10 {
            let e = h.step(1.0).expect_err("no supply_temp register");
            assert!(e.to_string().contains("supply_temp"), "{e}");
        }
        assert_eq!(input(&cdu, "pump_a_fault"), 1.0, "shown all the same");
        assert!(input(&cdu, "return_temp") > 0.0);
    }

    #[test]
    fn simulate_and_the_hall_count_the_leaks_of_a_run_alike() {
        let leaks = "[[fault]]\nat_s = 1000\nkind = \"leak\"\ntarget = \"0\"\n\
                     [[fault]]\nat_s = 3599\nkind = \"leak\"\ntarget = \"1\"\n";
        // The whole hour, then a run cut short of the second leak (as a
        // shorter run of the same scenario plays it).
        for (duration_s, expected) in [(3600, 2), (2000, 1)] {
            let mut s = scenario_of(leaks);
            s.duration_s = duration_s;
            let simulated =
                crate::sim::run("t", &s, &mut crate::sim::Baseline::new(32.0, 2), None, 60)
                    .unwrap();
            let (mut h, _, _) = hall_playing(RegisterMap::sim_cdu(), s);
            for _ in 0..duration_s {
                h.step(1.0).unwrap();
            }
            let played = h.summary("t", "baseline-32");
            assert_eq!(
                (simulated.leaks, played.leaks),
                (expected, expected),
                "over {duration_s} s"
            );
        }
    }

    /// Records, at each step, how far the return temperature it reads is
    /// from the truth; answers as baseline-32.
    struct ReturnDrift {
        truth: f64,
        drift: Vec<Option<f64>>,
        inner: crate::sim::Baseline,
    }

    impl crate::sim::Controller for ReturnDrift {
        fn name(&self) -> &str {
            "return-drift"
        }
        fn observe(&mut self, plant: &Plant, _cond: &crate::plant::Conditions) {
            self.truth = plant.meters().return_c;
        }
        fn step(&mut self, r: &crate::sim::Readings) -> crate::sim::Decision {
            self.drift.push(r.return_c.map(|v| v - self.truth));
            self.inner.step(r)
        }
    }

    #[test]
    fn overlapping_drifts_of_one_sensor_read_alike_in_simulate_and_the_hall() {
        // +2 K/min for the hour, -2 K/min over its second half: the first
        // in the file counts (docs/plant-model.md section 8), +80 K at 40 min.
        let s = scenario_of(
            "[[fault]]\nat_s = 0\nkind = \"sensor_drift\"\ntarget = \"return_temp\"\nvalue = 2.0\n\
             [[fault]]\nat_s = 1800\nkind = \"sensor_drift\"\ntarget = \"return_temp\"\nvalue = -2.0\n",
        );
        let mut rec = ReturnDrift {
            truth: 0.0,
            drift: Vec::new(),
            inner: crate::sim::Baseline::new(32.0, 2),
        };
        crate::sim::run("t", &s, &mut rec, None, 60).unwrap();
        let simulated = rec.drift[2400].expect("read");
        let (mut h, cdu, _) = hall_playing(RegisterMap::sim_cdu(), s);
        for _ in 0..2400 {
            h.step(1.0).unwrap();
        }
        let played = input(&cdu, "return_temp") - h.plant().meters().return_c;
        assert!(
            (simulated - played).abs() < 0.1 && (played - 80.0).abs() < 0.1,
            "simulate {simulated:.2} K, the hall {played:.2} K"
        );
    }
}
