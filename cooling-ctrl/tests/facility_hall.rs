//! A hall of several CDUs on one facility water loop, one of them hotter
//! than the rest (older cold plates, the hardest job), through a warm
//! afternoon: the facility water set by the coordinator from what each
//! controller offers costs less energy per unit of work than the same
//! hall at a fixed facility water and than a BMS that follows its
//! coldest CDU, with no GPU above its max operating temperature. The
//! whole day (`twin/scenarios/hall_day_hot_cdu.toml`) is measured in
//! docs/twin.md; this is its afternoon, short enough for every test run.

#![cfg(feature = "twin")]

use cooling_ctrl::simulated::{Ours, SimCoordinator};
use loopwarden_twin::scenario::Scenario;
use loopwarden_twin::sim::{self, Controller, FacilityPolicy, HallSummary};

const AFTERNOON: &str = r#"
format = "plant-scenario/1"
description = "a warm afternoon in a hall of three CDUs; CDU 2's racks have older cold plates and run at full demand"
duration_s = 10800
seed = 29

[site]
cdus = 3

[ambient]
points = [[0, 21.0], [5400, 30.0], [10800, 27.0]]

[load]
all = [[0, 0.8], [3600, 0.9]]
"8" = [[0, 1.0]]
"9" = [[0, 1.0]]
"10" = [[0, 1.0]]
"11" = [[0, 1.0]]

[truth.rack_plate_factor]
"8" = 1.3
"9" = 1.3
"10" = 1.3
"11" = 1.3
"#;

fn play(sc: &Scenario, policy: &str) -> HallSummary {
    let mut controllers: Vec<Box<dyn Controller>> = (0..sc.site.cdus)
        .map(|_| Box::new(Ours::new(&sc.site).expect("the site configures")) as Box<dyn Controller>)
        .collect();
    let mut coordinator = SimCoordinator::new(&sc.site).expect("the site configures");
    let mut policy = match policy {
        "fixed" => FacilityPolicy::Fixed,
        "follow-coldest" => FacilityPolicy::FollowColdest,
        _ => FacilityPolicy::Coordinated(&mut coordinator),
    };
    sim::run_hall("afternoon", sc, &mut controllers, &mut policy, None, 60).expect("plays")
}

#[test]
fn the_coordinated_facility_water_costs_less_per_work_than_fixed_or_following_the_coldest() {
    let sc = Scenario::from_toml(AFTERNOON, "afternoon").expect("reads");
    let runs: Vec<HallSummary> = ["fixed", "follow-coldest", "coordinated"]
        .iter()
        .map(|p| play(&sc, p))
        .collect();
    for r in &runs {
        eprintln!(
            "{:>15}: {:.4} kWh/work-GPU-h, PUE {:.4}, water {:.2} °C, hottest {:.2} °C, caps {} host-s",
            r.facility,
            r.hall.kwh_per_work_gpu_h,
            r.hall.pue,
            r.mean_facility_water_c,
            r.hall.max_gpu_temp_c,
            r.hall.cap_requests
        );
        assert_eq!(r.hall.gpu_s_above_max_operating, 0, "{r:?}");
        assert_eq!(r.hall.shutdowns, 0, "{r:?}");
        assert!(r.hall.max_gpu_temp_c <= 87.0, "{r:?}");
    }
    let (fixed, coldest, coordinated) = (&runs[0], &runs[1], &runs[2]);
    let e = |r: &HallSummary| r.hall.kwh_per_work_gpu_h;
    assert!(
        e(coordinated) < e(fixed),
        "against fixed: {} vs {}",
        e(coordinated),
        e(fixed)
    );
    assert!(
        e(coordinated) < e(coldest),
        "against follow-the-coldest: {} vs {}",
        e(coordinated),
        e(coldest)
    );
    // The hotter CDU is the one the others would be cooled for.
    assert!(
        coordinated.per_cdu[2].max_gpu_temp_c > coordinated.per_cdu[0].max_gpu_temp_c,
        "{coordinated:?}"
    );
}
