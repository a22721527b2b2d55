//! Plays a scenario on the plant in simulated time, with a controller in
//! charge of the CDU, and keeps the figures of `PLANT_MODEL.md` section 8.
//!
//! The controller sees what a real one would see (the CDU's sensors, with
//! the scenario's sensor faults applied, and the hosts' GPU reports) and
//! answers with what a CDU accepts (setpoint, pump speed and pumps, rack
//! valves) and the power caps it asks the hosts for. The plant model
//! stays hidden from it. One step is one second of simulated time.
//!
//! Glossary:
//! - *reference controller*: a fixed policy to compare against
//!   (`baseline-18`, `baseline-32`: the vendors' usual fixed setpoint, or
//!   static warm water, pumps at 100 %, no caps).
//! - *pumped leak second*: a second in which a leaking rack's valve was
//!   still open.

use std::io::Write;

use crate::plant::{Actuation, Plant};
use crate::scenario::{FaultKind, Scenario, SensorName};

/// What the controller reads each second.
#[derive(Debug, Clone, PartialEq)]
pub struct Readings {
    /// Simulated time, s.
    pub t_s: f64,
    /// Supply temperature, °C (`None`: the sensor is lost).
    pub supply_c: Option<f64>,
    /// Return temperature, °C.
    pub return_c: Option<f64>,
    /// Secondary flow, L/min.
    pub flow_lpm: Option<f64>,
    /// Facility water supply, °C.
    pub facility_supply_c: Option<f64>,
    /// Outdoor air, °C.
    pub ambient_c: f64,
    /// Leak input per rack.
    pub leaks: Vec<bool>,
    /// Pumps running (contactor feedback).
    pub pumps_running: [bool; 2],
    /// Hottest GPU as the hosts report it, °C (`None`: no reports, the
    /// bus is out).
    pub hottest_gpu_c: Option<f64>,
    /// IT power meter, W.
    pub it_w: f64,
    /// Facility power meter, W.
    pub facility_w: f64,
}

/// What the controller decides each second.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Supply setpoint, °C.
    pub setpoint_c: f64,
    /// Pump speed, fraction.
    pub pump_speed: f64,
    /// Pumps commanded on.
    pub pump_on: [bool; 2],
    /// Per rack: valve open.
    pub valves: Vec<bool>,
    /// Per rack: power cap per GPU asked of its hosts, W.
    pub rack_caps: Vec<Option<f64>>,
}

/// A controller in charge of the CDU.
pub trait Controller {
    /// Its name in the summary.
    fn name(&self) -> &str;
    /// One second's decision.
    fn step(&mut self, r: &Readings) -> Decision;
}

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
            rack_caps: vec![None; self.racks],
        }
    }
}

/// The figures of a run (section 8).
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
    /// Facility energy / IT energy.
    pub pue: f64,
    /// Work done, GPU-hours at w = 1.
    pub work_gpu_h: f64,
    /// Facility kWh per work-GPU-hour.
    pub kwh_per_work_gpu_h: f64,
    /// Hottest junction, °C.
    pub max_gpu_temp_c: f64,
    /// GPU-seconds above the max operating temperature.
    pub gpu_s_above_max_operating: u64,
    /// HW slowdown episodes.
    pub slowdown_episodes: u32,
    /// GPU shutdowns (excluding GPUs failed by the scenario).
    pub shutdowns: u32,
    /// Seconds with caps asked of any host.
    pub cap_requests: u64,
    /// Seconds in failsafe (not tracked for the reference controllers).
    pub failsafe_s: u64,
    /// Leaks in the scenario.
    pub leaks: u32,
    /// Seconds a leaking rack's valve stayed open.
    pub leak_pumped_s: u64,
}

/// A sensor as the controller sees it, with the scenario's faults.
#[derive(Debug, Clone, Copy, Default)]
struct SensorState {
    stuck: Option<f64>,
    drift: f64,
}

fn sensor(
    s: &Scenario,
    t: f64,
    name: SensorName,
    truth: f64,
    state: &mut SensorState,
) -> Option<f64> {
    let mut stuck = false;
    let mut drift_rate = None;
    for f in s.active(t) {
        match f {
            FaultKind::SensorLost(n) if *n == name => return None,
            FaultKind::SensorStuck(n) if *n == name => stuck = true,
            FaultKind::SensorDrift(n, rate) if *n == name => drift_rate = Some(*rate),
            _ => {}
        }
    }
    if stuck {
        return Some(*state.stuck.get_or_insert(truth));
    }
    state.stuck = None;
    match drift_rate {
        Some(rate) => state.drift += rate / 60.0,
        None => state.drift = 0.0,
    }
    Some(truth + state.drift)
}

/// Plays `scenario` with `controller` in charge; writes the time series to
/// `trace` (CSV, one row every `trace_every_s`) when given.
pub fn run(
    name: &str,
    scenario: &Scenario,
    controller: &mut dyn Controller,
    mut trace: Option<&mut dyn Write>,
    trace_every_s: u64,
) -> std::io::Result<Summary> {
    let site = scenario.site.clone();
    let racks = site.racks;
    let per_rack = site.hosts_per_rack * site.gpus_per_host;
    let per_host = site.gpus_per_host;
    let mut plant = Plant::new(site, scenario.ambient.at(0.0).max(20.0));
    let n = plant.gpus().len();
    let mut sensors = [SensorState::default(); 4];
    let mut failed = vec![false; n];
    let mut cap_s = 0u64;
    let mut leak_pumped_s = 0u64;
    let leaks = scenario
        .faults
        .iter()
        .filter(|f| matches!(f.kind, FaultKind::Leak(_)))
        .count() as u32;
    if let Some(w) = trace.as_deref_mut() {
        writeln!(w, "t_s,ambient_c,setpoint_c,supply_c,return_c,flow_lpm,pump_speed,max_gpu_c,it_kw,facility_kw,caps")?;
    }
    let mut last = plant.meters();
    for sec in 0..scenario.duration_s {
        let t = sec as f64;
        let ambient = scenario.ambient.at(t);
        let active: Vec<FaultKind> = scenario.active(t).cloned().collect();
        let bus_out = active.iter().any(|f| matches!(f, FaultKind::BusOutage));
        let leaking: Vec<bool> = (0..racks)
            .map(|r| active.contains(&FaultKind::Leak(r)))
            .collect();
        for f in &active {
            if let FaultKind::GpuFail(r, h, g) = f {
                let i = r * per_rack + h * per_host + g;
                if !failed[i] {
                    failed[i] = true;
                    plant.fail_gpu(i);
                }
            }
        }
        let hottest = plant
            .gpus()
            .iter()
            .filter(|g| !g.shut_down)
            .map(|g| g.t_j)
            .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t))));
        let readings = Readings {
            t_s: t,
            supply_c: sensor(
                scenario,
                t,
                SensorName::SupplyTemp,
                last.supply_c,
                &mut sensors[0],
            ),
            return_c: sensor(
                scenario,
                t,
                SensorName::ReturnTemp,
                last.return_c,
                &mut sensors[1],
            ),
            flow_lpm: sensor(
                scenario,
                t,
                SensorName::Flow,
                last.flow_lpm,
                &mut sensors[2],
            ),
            facility_supply_c: sensor(
                scenario,
                t,
                SensorName::FacilitySupplyTemp,
                last.facility_supply_c,
                &mut sensors[3],
            ),
            ambient_c: ambient,
            leaks: leaking.clone(),
            pumps_running: [0, 1].map(|i| !active.contains(&FaultKind::PumpTrip(i))),
            hottest_gpu_c: if bus_out { None } else { hottest },
            it_w: last.it_w,
            facility_w: last.facility_w,
        };
        let d = controller.step(&readings);
        let valves: Vec<bool> = (0..racks)
            .map(|r| {
                // A stuck valve keeps its position: open, as at the start.
                let stuck = active.contains(&FaultKind::ValveStuck(r));
                stuck || d.valves.get(r).copied().unwrap_or(true)
            })
            .collect();
        if d.rack_caps.iter().any(Option::is_some) {
            cap_s += 1;
        }
        leak_pumped_s += leaking
            .iter()
            .zip(&valves)
            .filter(|(l, v)| **l && **v)
            .count() as u64;
        let act = Actuation {
            setpoint_c: d.setpoint_c,
            pump_speed: d.pump_speed,
            pump_on: d.pump_on,
            valves,
            caps: (0..n)
                .map(|i| d.rack_caps.get(i / per_rack).copied().flatten())
                .collect(),
        };
        let cond = scenario.conditions(t, &failed);
        plant.step(1.0, &act, &cond);
        last = plant.meters();
        if let Some(w) = trace.as_deref_mut() {
            if sec % trace_every_s.max(1) == 0 {
                let max_gpu = plant.gpus().iter().map(|g| g.t_j).fold(f64::MIN, f64::max);
                let caps = d.rack_caps.iter().filter(|c| c.is_some()).count();
                writeln!(
                    w,
                    "{t},{ambient:.2},{:.2},{:.2},{:.2},{:.1},{:.2},{max_gpu:.2},{:.2},{:.2},{caps}",
                    d.setpoint_c,
                    last.supply_c,
                    last.return_c,
                    last.flow_lpm,
                    d.pump_speed,
                    last.it_w / 1000.0,
                    last.facility_w / 1000.0
                )?;
            }
        }
    }
    let t = plant.totals();
    let it_kwh = t.it_j / 3.6e6;
    let facility_kwh = t.facility_j / 3.6e6;
    let work_gpu_h = t.work_gpu_s / 3600.0;
    Ok(Summary {
        scenario: name.to_string(),
        controller: controller.name().to_string(),
        duration_s: scenario.duration_s,
        it_kwh,
        facility_kwh,
        pue: if it_kwh > 0.0 {
            facility_kwh / it_kwh
        } else {
            0.0
        },
        work_gpu_h,
        kwh_per_work_gpu_h: if work_gpu_h > 0.0 {
            facility_kwh / work_gpu_h
        } else {
            0.0
        },
        max_gpu_temp_c: t.max_gpu_c,
        gpu_s_above_max_operating: t.gpu_s_above_max_operating.round() as u64,
        slowdown_episodes: t.slowdown_episodes,
        shutdowns: t.shutdowns,
        cap_requests: cap_s,
        failsafe_s: 0,
        leaks,
        leak_pumped_s,
    })
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
    fn the_trace_has_a_header_and_a_row_per_interval() {
        let s = scenario("");
        let mut out = Vec::new();
        run("t", &s, &mut Baseline::new(32.0, 2), Some(&mut out), 60).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("t_s,ambient_c,setpoint_c,supply_c"));
        assert_eq!(lines.len(), 1 + 1800 / 60);
        assert_eq!(lines[1].split(',').count(), lines[0].split(',').count());
    }
}
