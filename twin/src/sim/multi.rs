//! A hall of several CDUs on one facility water loop (`docs/plant-model.md`
//! §4.1): each CDU with its own racks, secondary loop, sensors, faults
//! and controller, as in a run of one CDU; one dry cooler and one chiller
//! plant for all of them, the facility water heading for the target the
//! hall's [`FacilityPolicy`] sets each second.
//!
//! Each second every CDU's controller decides from its own readings,
//! then the facility's target is set (from the setpoints the CDUs were
//! told, or from what the controllers offered a coordinator), then every
//! CDU's secondary side steps on the shared water, the facility loop
//! rejects the heat of all of them, and each CDU's meters carry its share
//! of the fans and the chiller (by its share of the heat). A coordinator's
//! target reaches the controllers over the bus (not during a
//! `bus_outage`) and acts on their next second; so does a fixed water,
//! as the BMS's published setpoint. A BMS that follows its coldest CDU
//! tells the CDUs nothing: their setpoints are what it follows.
//!
//! Glossary:
//! - *fixed*: the facility water held at `[site.facility] fixed_water_c`
//!   (the warmest design day's), as most halls run.
//! - *follow the coldest*: a BMS that sets the facility water to what its
//!   coldest CDU asks (`setpoint − approach`).
//! - *coordinated*: a facility coordinator sets the water and the
//!   chiller's staging from what each controller offers.

use std::any::Any;
use std::io::Write;

use super::{ratio, Controller, RunState, Summary};
use crate::plant::FacilityLoop;
use crate::scenario::Scenario;

/// What the facility coordinator decides for one second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FacilityOrder {
    /// Facility water target, °C.
    pub water_c: f64,
    /// Chiller stages to run (`None`: every stage on demand).
    pub chiller_stages: Option<u32>,
}

/// A facility coordinator: sets the water from what the CDUs' controllers
/// offer ([`Controller::facility_offer`], opaque to the twin).
pub trait FacilityCoordinator {
    /// The order for second `t_s`, outdoors at `ambient_c` as the
    /// facility's own sensor reads it, from the offers of every CDU (in
    /// CDU order; `None`: that controller offers nothing now).
    fn order(&mut self, t_s: f64, ambient_c: f64, offers: &[Option<&dyn Any>]) -> FacilityOrder;
}

/// How the facility water target of a hall of several CDUs is set.
pub enum FacilityPolicy<'a> {
    /// Held at `[site.facility] fixed_water_c`.
    Fixed,
    /// The coldest CDU's `setpoint − approach`.
    FollowColdest,
    /// A facility coordinator's.
    Coordinated(&'a mut dyn FacilityCoordinator),
}

impl FacilityPolicy<'_> {
    /// Its name in the summary.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Fixed => "fixed",
            Self::FollowColdest => "follow-coldest",
            Self::Coordinated(_) => "coordinated",
        }
    }
}

/// The figures of a hall's run: the hall's, and each CDU's.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HallSummary {
    /// The whole hall.
    #[serde(flatten)]
    pub hall: Summary,
    /// CDUs.
    pub cdus: usize,
    /// The facility policy.
    pub facility: String,
    /// Facility water, °C, averaged over the run.
    pub mean_facility_water_c: f64,
    /// Each CDU's figures (its share of the facility's power in its
    /// facility energy).
    pub per_cdu: Vec<Summary>,
}

/// Plays `scenario`, a hall of `[site] cdus` CDUs, with `controllers` in
/// charge (one per CDU, in order) and the facility water set by `policy`;
/// writes a row of the hall every `trace_every_s` to `trace` when given.
pub fn run_hall(
    name: &str,
    scenario: &Scenario,
    controllers: &mut [Box<dyn Controller>],
    policy: &mut FacilityPolicy<'_>,
    mut trace: Option<&mut dyn Write>,
    trace_every_s: u64,
) -> std::io::Result<HallSummary> {
    let n = scenario.site.cdus.max(1);
    assert_eq!(controllers.len(), n, "one controller per CDU");
    let views: Vec<Scenario> = (0..n).map(|c| scenario.cdu_view(c)).collect();
    let mut states: Vec<RunState<'_>> = views.iter().map(RunState::new).collect();
    let start_c = scenario.ambient.at(0.0).max(20.0);
    let mut water = FacilityLoop::new(&scenario.truth, start_c);
    let approach = scenario.truth.secondary.approach_k;
    let mut water_sum = 0.0;
    if let Some(w) = trace.as_deref_mut() {
        writeln!(w, "t_s,ambient_c,water_target_c,facility_supply_c,chiller_stages,max_gpu_c,it_kw,facility_kw,caps")?;
    }
    for sec in 0..scenario.duration_s {
        let mut seconds = Vec::with_capacity(n);
        for (c, st) in states.iter_mut().enumerate() {
            st.plant.set_facility_c(water.water_c());
            seconds.push(st.cdu_second(sec, &views[c], controllers[c].as_mut()));
        }
        let ambient = scenario.ambient.at(sec as f64);
        let order = match policy {
            FacilityPolicy::Fixed => FacilityOrder {
                water_c: scenario.truth.facility.fixed_water_c,
                chiller_stages: None,
            },
            FacilityPolicy::FollowColdest => FacilityOrder {
                water_c: seconds
                    .iter()
                    .map(|s| s.act.setpoint_c - approach)
                    .fold(f64::INFINITY, f64::min),
                chiller_stages: None,
            },
            FacilityPolicy::Coordinated(co) => {
                let offers: Vec<Option<&dyn Any>> =
                    controllers.iter().map(|c| c.facility_offer()).collect();
                co.order(sec as f64, ambient, &offers)
            }
        };
        let heats: Vec<f64> = states
            .iter_mut()
            .zip(&seconds)
            .map(|(st, s)| st.plant.step_secondary(1.0, &s.act, &s.cond))
            .collect();
        let total: f64 = heats.iter().sum();
        let rej = water.step(
            1.0,
            total,
            order.water_c,
            &seconds[0].cond,
            order.chiller_stages,
        );
        water_sum += water.water_c();
        for ((st, s), heat) in states.iter_mut().zip(&seconds).zip(&heats) {
            let share = if total > 0.0 {
                heat / total
            } else {
                1.0 / n as f64
            };
            st.plant.finish_step(1.0, &rej.share(share));
            st.last = st.plant.meters();
            st.account(&s.second, &s.act);
        }
        // A fixed water is the BMS's published setpoint and the
        // coordinator's plan is on the bus; a BMS that follows the coldest
        // CDU follows what the CDUs ask, and tells them nothing.
        let told = !matches!(policy, FacilityPolicy::FollowColdest);
        if told && !seconds[0].second.bus_out {
            for c in controllers.iter_mut() {
                c.hear_facility_target(order.water_c, sec as f64);
            }
        }
        if let Some(w) = trace.as_deref_mut() {
            if super::trace_due(sec, trace_every_s, scenario.duration_s) {
                hall_row(w, sec + 1, ambient, &order, &water, &states)?;
            }
        }
    }
    let per_cdu: Vec<Summary> = states
        .iter()
        .zip(&views)
        .zip(controllers.iter())
        .map(|((st, v), c)| st.summary(name, c.name(), leaks_of(v)))
        .collect();
    Ok(HallSummary {
        hall: hall_of(name, scenario, &per_cdu),
        cdus: n,
        facility: policy.name().to_string(),
        mean_facility_water_c: water_sum / scenario.duration_s.max(1) as f64,
        per_cdu,
    })
}

/// Leaks that begin within a scenario's run.
fn leaks_of(s: &Scenario) -> u32 {
    s.leaks_before(s.duration_s as f64)
}

/// The hall's figures: the CDUs' energy, work and counters together.
fn hall_of(name: &str, scenario: &Scenario, per_cdu: &[Summary]) -> Summary {
    let sum = |f: fn(&Summary) -> f64| per_cdu.iter().map(f).sum::<f64>();
    let (it_kwh, facility_kwh, work_gpu_h) = (
        sum(|s| s.it_kwh),
        sum(|s| s.facility_kwh),
        sum(|s| s.work_gpu_h),
    );
    let count = |f: fn(&Summary) -> u64| per_cdu.iter().map(f).sum::<u64>();
    let count32 = |f: fn(&Summary) -> u32| per_cdu.iter().map(f).sum::<u32>();
    let first = &per_cdu[0];
    Summary {
        scenario: name.to_string(),
        controller: first.controller.clone(),
        duration_s: scenario.duration_s,
        it_kwh,
        facility_kwh,
        pue: ratio(facility_kwh, it_kwh),
        work_gpu_h,
        kwh_per_work_gpu_h: ratio(facility_kwh, work_gpu_h),
        max_gpu_temp_c: per_cdu
            .iter()
            .map(|s| s.max_gpu_temp_c)
            .fold(f64::MIN, f64::max),
        gpu_s_above_max_operating: count(|s| s.gpu_s_above_max_operating),
        slowdown_episodes: count32(|s| s.slowdown_episodes),
        shutdowns: count32(|s| s.shutdowns),
        cap_requests: count(|s| s.cap_requests),
        failsafe_s: count(|s| s.failsafe_s),
        leaks: count32(|s| s.leaks),
        leak_pumped_s: count(|s| s.leak_pumped_s),
        pump_switchovers: count32(|s| s.pump_switchovers),
        valve_reopened_unattended: count32(|s| s.valve_reopened_unattended),
        leak_sensing_alarms: count32(|s| s.leak_sensing_alarms),
        controller_restarts: count32(|s| s.controller_restarts),
        valve_feedback_alarms: count32(|s| s.valve_feedback_alarms),
    }
}

/// One row of the hall's trace, after the step: the state at `t_s`.
fn hall_row(
    w: &mut dyn Write,
    t_s: u64,
    ambient: f64,
    order: &FacilityOrder,
    water: &FacilityLoop,
    states: &[RunState<'_>],
) -> std::io::Result<()> {
    let max_gpu = states
        .iter()
        .flat_map(|st| st.plant.gpus().iter().map(|g| g.t_j))
        .fold(f64::MIN, f64::max);
    let it: f64 = states.iter().map(|st| st.last.it_w).sum();
    let facility: f64 = states.iter().map(|st| st.last.facility_w).sum();
    let caps: usize = states.iter().map(|st| st.caps_now).sum();
    let stages = order
        .chiller_stages
        .map_or_else(|| "all".to_string(), |s| s.to_string());
    writeln!(
        w,
        "{t_s},{ambient:.2},{:.2},{:.2},{stages},{max_gpu:.2},{:.2},{:.2},{caps}",
        order.water_c,
        water.water_c(),
        it / 1000.0,
        facility / 1000.0
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::Baseline;

    fn hall(extra: &str) -> Scenario {
        let text = format!(
            r#"
format = "plant-scenario/1"
description = "two CDUs"
duration_s = 1800
seed = 3
[site]
cdus = 2
racks = 2
[ambient]
points = [[0, 24.0]]
[load]
all = [[0, 0.8]]
{extra}
"#
        );
        Scenario::from_toml(&text, "t").expect("reads")
    }

    fn controllers() -> Vec<Box<dyn Controller>> {
        vec![
            Box::new(Baseline::new(18.0, 2)),
            Box::new(Baseline::new(32.0, 2)),
        ]
    }

    #[test]
    fn the_policies_set_the_water_and_the_hall_adds_up_its_cdus() {
        let sc = hall("");
        let fixed = run_hall(
            "t",
            &sc,
            &mut controllers(),
            &mut FacilityPolicy::Fixed,
            None,
            1,
        )
        .expect("runs");
        let coldest = run_hall(
            "t",
            &sc,
            &mut controllers(),
            &mut FacilityPolicy::FollowColdest,
            None,
            1,
        )
        .expect("runs");
        assert_eq!(fixed.facility, "fixed");
        assert_eq!(fixed.cdus, 2);
        // Fixed: 20 °C; the coldest CDU asks 18 °C less the approach.
        assert!(
            (fixed.mean_facility_water_c - 20.0).abs() < 0.3,
            "{fixed:?}"
        );
        assert!(
            (coldest.mean_facility_water_c - 15.0).abs() < 0.5,
            "{coldest:?}"
        );
        for s in [&fixed, &coldest] {
            let sum: f64 = s.per_cdu.iter().map(|c| c.facility_kwh).sum();
            assert!((s.hall.facility_kwh - sum).abs() < 1e-9);
            let work: f64 = s.per_cdu.iter().map(|c| c.work_gpu_h).sum();
            assert!((s.hall.kwh_per_work_gpu_h - sum / work).abs() < 1e-9);
        }
        // Colder water for everyone costs the chiller more.
        assert!(
            coldest.hall.facility_kwh > fixed.hall.facility_kwh,
            "{coldest:?}"
        );
    }

    #[test]
    fn a_fault_of_one_cdu_acts_on_it_alone() {
        let sc = hall("[[fault]]\nat_s = 300\nkind = \"pump_trip\"\ntarget = \"A\"\ncdu = 1\n");
        let s = run_hall(
            "t",
            &sc,
            &mut controllers(),
            &mut FacilityPolicy::Fixed,
            None,
            1,
        )
        .expect("runs");
        // The baselines never start the lag pump: CDU 1's GPUs shut down.
        assert_eq!(s.per_cdu[0].shutdowns, 0, "{:?}", s.per_cdu[0]);
        assert!(s.per_cdu[1].shutdowns > 0, "{:?}", s.per_cdu[1]);
    }

    struct Told {
        heard: Vec<f64>,
    }

    impl FacilityCoordinator for Told {
        fn order(&mut self, t_s: f64, _: f64, offers: &[Option<&dyn Any>]) -> FacilityOrder {
            assert_eq!(offers.len(), 2);
            self.heard.push(t_s);
            FacilityOrder {
                water_c: 26.0,
                chiller_stages: Some(1),
            }
        }
    }

    #[test]
    fn a_coordinator_is_asked_every_second_and_the_loop_follows_it() {
        let sc = hall("");
        let mut co = Told { heard: Vec::new() };
        let s = run_hall(
            "t",
            &sc,
            &mut controllers(),
            &mut FacilityPolicy::Coordinated(&mut co),
            None,
            1,
        )
        .expect("runs");
        assert_eq!(co.heard.len(), 1800);
        assert_eq!(s.facility, "coordinated");
        // From 21 °C at rest to 26 °C within the loop's minute or two.
        assert!(s.mean_facility_water_c > 25.0, "{s:?}");
    }
}
