//! A rack whose cold plates foul while the hall runs: the controller
//! follows the rack's factor as it rises, and once cooling the whole CDU
//! for that rack costs more than capping it, it caps that rack's hosts
//! and no other, and says so in its plan. Its energy per unit of work is
//! then no worse than the oracle's, which never caps by choice.

#![cfg(feature = "twin")]

use cooling_ctrl::simulated::Ours;
use loopwarden_twin::oracle::Oracle;
use loopwarden_twin::scenario::Scenario;
use loopwarden_twin::sim::{self, Controller, Decision, Readings};

/// Ours, noting which hosts it ever capped and its last plan.
struct Watched {
    ours: Ours,
    capped: Vec<bool>,
}

impl Controller for Watched {
    fn name(&self) -> &str {
        "ours"
    }
    fn restart(&mut self) {
        self.ours.restart();
    }
    fn step(&mut self, r: &Readings) -> Decision {
        let d = self.ours.step(r);
        for (seen, cap) in self.capped.iter_mut().zip(&d.host_caps) {
            *seen |= cap.is_some();
        }
        d
    }
}

#[test]
fn a_rack_that_fouls_is_capped_alone_once_that_costs_less_than_colder_water() {
    let sc = Scenario::from_toml(
        "format = \"plant-scenario/1\"\ndescription = \"rack 1 fouls\"\n\
         duration_s = 7200\nseed = 9\n[ambient]\npoints = [[0, 26.0], [7200, 32.0]]\n\
         [load]\nall = [[0, 0.6], [1800, 0.95], [7200, 0.95]]\n\
         [[fault]]\nat_s = 600\nuntil_s = 5400\nkind = \"cold_plate_fouling\"\ntarget = \"1\"\nvalue = 2.0\n",
        "fouling.toml",
    )
    .unwrap();
    let mut w = Watched {
        ours: Ours::new(&sc.site).unwrap(),
        capped: vec![false; 16],
    };
    let ours = sim::run("fouling", &sc, &mut w, None, 60).unwrap();
    let oracle = sim::run("fouling", &sc, &mut Oracle::new(&sc), None, 60).unwrap();
    eprintln!("ours {ours:?}\noracle {oracle:?}");
    assert_eq!(
        (
            ours.shutdowns,
            ours.slowdown_episodes,
            ours.gpu_s_above_max_operating
        ),
        (0, 0, 0)
    );
    // Rack 1's hosts (4 to 7) and no other.
    let capped: Vec<usize> = (0..16).filter(|h| w.capped[*h]).collect();
    assert_eq!(capped, vec![4, 5, 6, 7]);
    let plan = w.ours.core().loops().proposal;
    assert_eq!(plan.capped_mask, 0xF0, "{plan:?}");
    assert!(
        plan.other_cost
            .is_some_and(|c| c > plan.facility_w / plan.work),
        "{plan:?}"
    );
    assert!(
        ours.kwh_per_work_gpu_h <= oracle.kwh_per_work_gpu_h * 1.005,
        "{} against the oracle's {}",
        ours.kwh_per_work_gpu_h,
        oracle.kwh_per_work_gpu_h
    );
}
