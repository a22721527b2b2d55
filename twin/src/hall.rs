//! The hall as its controller meets it: the plant behind the simulated
//! CDU's registers and the simulated board pins.
//!
//! Each step the hall reads what clients left in the CDU's holding
//! registers (setpoint, pump speed, lead pump, rack valves) and the
//! pump-enable relay on the board, steps the plant under the scenario's
//! conditions and faults, and writes back what a real CDU would show: its
//! measurements in the input registers (with the scenario's sensor faults)
//! and the leak ropes on the board's lines. The power caps come from the
//! hosts, and the hosts follow their agents ([`crate::hosts`]): the run
//! tells the hall when an agent quarantined a GPU or a rack's hosts were
//! told their cooling is lost, and the hall drains and powers down by its
//! own clock. Time is passed in.
//!
//! Glossary:
//! - *hall*: plant + simulated CDU + simulated pins + scenario clock.

use crate::hosts::HostFollow;
use loopwarden_boards::modbus_map::ValueError;
use loopwarden_boards::pins::PinMap;

use crate::pins::SimLines;
use crate::plant::{Actuation, GpuState, Plant};
use crate::scenario::{FaultKind, Scenario, SensorName};
use crate::sim_cdu::SimCdu;

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
    stuck: [Option<f64>; 4],
    drift: [f64; 4],
}

impl Hall {
    /// A hall playing `scenario`, its CDU serving `cdu`'s registers and its
    /// board on `lines` mapped by `pins`.
    pub fn new(scenario: Scenario, cdu: SimCdu, lines: SimLines, pins: PinMap) -> Self {
        let plant = Plant::new(scenario.site.clone(), scenario.ambient.at(0.0).max(20.0));
        let n = plant.gpus().len();
        let site = plant.site();
        let follow = HostFollow::new(site.racks * site.hosts_per_rack, site.gpus_per_host);
        // Dry ropes at start; the relay starts closed (pumps allowed).
        for l in &pins.leaks {
            lines.assert(l, false);
        }
        lines.assert(&pins.pump_enable, true);
        Self {
            plant,
            scenario,
            cdu,
            lines,
            pins,
            caps: vec![None; n],
            follow,
            failed: vec![false; n],
            t: 0.0,
            stuck: [None; 4],
            drift: [0.0; 4],
        }
    }

    /// Simulated time, s.
    pub fn time_s(&self) -> f64 {
        self.t
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

    fn sensor(
        &mut self,
        active: &[FaultKind],
        k: usize,
        name: SensorName,
        truth: f64,
    ) -> Option<f64> {
        if active.contains(&FaultKind::SensorLost(name)) {
            return None;
        }
        if active.contains(&FaultKind::SensorStuck(name)) {
            return Some(*self.stuck[k].get_or_insert(truth));
        }
        self.stuck[k] = None;
        match active.iter().find_map(|f| match f {
            FaultKind::SensorDrift(n, rate) if *n == name => Some(*rate),
            _ => None,
        }) {
            Some(rate) => self.drift[k] += rate / 60.0,
            None => self.drift[k] = 0.0,
        }
        Some(truth + self.drift[k])
    }

    /// Advances the hall by `dt` seconds.
    pub fn step(&mut self, dt: f64) -> Result<(), ValueError> {
        let site = self.plant.site();
        let (racks, per_host) = (site.racks, site.gpus_per_host);
        let per_rack = site.hosts_per_rack * per_host;
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
        let modbus_out = active.contains(&FaultKind::ModbusOutage);
        // What the CDU was told (valves: bit n = rack n).
        let valves_bits = self.cdu.setting("valves_open")? as u32;
        let lead = self.cdu.setting("lead_pump")? as usize;
        let relay = self.lines.asserted(&self.pins.pump_enable);
        let mut pump_on = [false; 2];
        pump_on[lead.min(1)] = relay;
        // The hosts drain and power down by the hall's clock.
        let mut cond = self.scenario.conditions(self.t, &self.failed);
        let powered_down = self.follow.apply(self.t, &mut cond.demand);
        let act = Actuation {
            setpoint_c: self.cdu.setting("supply_setpoint")?,
            pump_speed: self.cdu.setting("pump_speed")? / 100.0,
            pump_on,
            valves: (0..racks)
                .map(|r| active.contains(&FaultKind::ValveStuck(r)) || valves_bits & (1 << r) != 0)
                .collect(),
            caps: self.caps.clone(),
            powered_down,
        };
        self.plant.step(dt, &act, &cond);
        self.t += dt;

        // What the CDU and the board show. During a Modbus outage the
        // registers keep their last values (the controller's reads fail
        // on its side of the link).
        let m = self.plant.meters();
        for (l, rack) in self.pins.leaks.clone().iter().zip(0..) {
            self.lines
                .assert(l, active.contains(&FaultKind::Leak(rack)));
        }
        if modbus_out {
            return Ok(());
        }
        // The sensors read at the new time, as they always have.
        let sensing: Vec<FaultKind> = self.scenario.active(self.t).cloned().collect();
        let readings = [
            (0, SensorName::SupplyTemp, m.supply_c, "supply_temp"),
            (1, SensorName::ReturnTemp, m.return_c, "return_temp"),
            (2, SensorName::Flow, m.flow_lpm, "flow"),
            (
                3,
                SensorName::FacilitySupplyTemp,
                m.facility_supply_c,
                "facility_supply_temp",
            ),
        ];
        for (k, name, truth, register) in readings {
            // A lost sensor reads as its register's floor (0), as a broken
            // 4-20 mA loop does; the controller must tell it from a reading.
            let v = self.sensor(&sensing, k, name, truth).unwrap_or(0.0);
            self.cdu.set_measurement(register, v.max(0.0))?;
        }
        let running = |i: usize| f64::from(u8::from(act.pump_on[i] && !cond.pump_tripped[i]));
        self.cdu.set_measurement("pump_a_running", running(0))?;
        self.cdu.set_measurement("pump_b_running", running(1))?;
        let leak_bits: u32 = (0..racks)
            .filter(|r| active.contains(&FaultKind::Leak(*r)))
            .map(|r| 1 << r)
            .sum();
        self.cdu
            .set_measurement("leak_inputs", f64::from(leak_bits))?;
        self.cdu.set_measurement("it_power", m.it_w.round())?;
        self.cdu
            .set_measurement("cooling_power", (m.pump_w + m.fans_w + m.chiller_w).round())?;
        self.cdu
            .set_measurement("facility_power", m.facility_w.round())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_boards::modbus_map::RegisterMap;
    use loopwarden_boards::pins::BoardPins;

    fn hall(extra: &str) -> (Hall, SimCdu, SimLines) {
        let text = format!(
            "format = \"plant-scenario/1\"\ndescription = \"t\"\nduration_s = 3600\nseed = 1\n\
             [site]\nracks = 2\n[ambient]\npoints = [[0, 20.0]]\n[load]\nall = [[0, 0.8]]\n{extra}"
        );
        let s = Scenario::from_toml(&text, "t.toml").unwrap();
        let cdu = SimCdu::new(
            RegisterMap::sim_cdu(),
            &[
                ("supply_setpoint", 30.0),
                ("pump_speed", 100.0),
                ("valves_open", 3.0),
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
    fn the_relay_stops_the_pumps_and_a_leak_wets_its_rope() {
        let (mut h, cdu, lines) = hall("[[fault]]\nat_s = 10\nkind = \"leak\"\ntarget = \"1\"\n");
        let map = PinMap::sim_controller();
        let mut pins = BoardPins::new(&map, |n| lines.input(n), |n| lines.output(n));
        for _ in 0..20 {
            h.step(1.0).unwrap();
        }
        assert_eq!(pins.leak(1).unwrap(), Ok(true));
        assert_eq!(pins.leak(0).unwrap(), Ok(false));
        assert_eq!(input(&cdu, "leak_inputs"), 2.0, "bit 1");
        pins.set_pump_enable(false).unwrap();
        h.step(1.0).unwrap();
        assert_eq!(input(&cdu, "flow"), 0.0);
        assert_eq!(input(&cdu, "pump_a_running"), 0.0);
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
}
