//! The controller on every public plant scenario, against both baselines:
//! no GPU shutdown, no hardware slowdown, no GPU-second above 87 °C; every
//! leaking rack pumped at most 2 s per leak, or 10 s where its valve is
//! seized open or its position input lies; no valve closed for a leak
//! reopened unattended; the lag
//! pump leading within 10 s of a seized lead pump; less facility energy
//! per unit of GPU work than `baseline-18` and `baseline-32` where the
//! baselines are a fair comparison (no leak: a baseline that keeps pumping
//! a leak and keeps its hosts working is not); within 1 % of the `oracle`
//! on the scenarios without faults whose plant is as configured, within
//! 2 % on the others without a leak (sensor faults, a chiller trip, a
//! plant unlike its configuration); and capping at most 1.2 times the
//! oracle's host-seconds plus 60 (plus the host-seconds of a rack whose
//! leak ended: it stays latched until an operator clears it, where the
//! oracle reopens it), except where a leak's isolation failed (the
//! escalation caps every host to its minimum by design).

#![cfg(feature = "twin")]

use std::path::{Path, PathBuf};

use cooling_ctrl::simulated::Ours;
use loopwarden_twin::oracle::Oracle;
use loopwarden_twin::scenario::{self, FaultKind, Scenario};
use loopwarden_twin::sim::{self, Baseline, Controller, Decision, Readings, Summary};

/// The repository's own demo scenario, and the public set the goldens
/// keep (`tests/goldens/plant/`).
fn scenarios() -> Vec<PathBuf> {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut v = vec![here.join("../hall/scenarios/demo.toml")];
    let public = here.join("../tests/goldens/plant");
    match std::fs::read_dir(&public) {
        Ok(dir) => {
            let mut found: Vec<PathBuf> = dir
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .collect();
            found.sort();
            v.extend(found);
        }
        Err(e) => panic!("public plant scenarios: {}: {e}", public.display()),
    }
    v
}

/// Ours, noting when the lead pump it asks for changes.
struct Watched {
    ours: Ours,
    lead: Option<usize>,
    changes: Vec<f64>,
}

impl Controller for Watched {
    fn name(&self) -> &str {
        "ours"
    }
    fn restart(&mut self) {
        self.ours.restart();
    }
    fn damage_latch(&mut self) {
        self.ours.damage_latch();
    }
    fn step(&mut self, r: &Readings) -> Decision {
        let d = self.ours.step(r);
        let lead = sim::lead_of(d.pump_on);
        if lead.is_some() && lead != self.lead {
            if self.lead.is_some() {
                self.changes.push(r.t_s);
            }
            self.lead = lead;
        }
        d
    }
}

/// What a scenario allows and asks beyond the summary: leak-pumped
/// seconds (2 per leak, 10 where the rack's valve is stuck) and when
/// each lead pump seizes.
fn bounds(sc: &Scenario) -> (u64, Vec<f64>) {
    // A valve seized open, or a position input that lies: the isolation
    // cannot be confirmed and escalates.
    let stuck = |r: usize| {
        sc.faults.iter().any(|f| {
            f.kind == FaultKind::ValveStuck(r)
                || matches!(f.kind, FaultKind::ValveFeedbackStuck(k, _) if k == r)
        })
    };
    let pumped = sc
        .faults
        .iter()
        .map(|f| match f.kind {
            FaultKind::Leak(r) if stuck(r) => 10,
            FaultKind::Leak(_) => 2,
            _ => 0,
        })
        .sum();
    let seized = sc
        .faults
        .iter()
        .filter(|f| matches!(f.kind, FaultKind::PumpSeized(_)))
        .map(|f| f.at_s as f64)
        .collect();
    (pumped, seized)
}

/// A scenario played by every controller, with what it allows.
struct Played {
    ours: Summary,
    b18: Summary,
    b32: Summary,
    oracle: Summary,
    no_faults: bool,
    /// The plant is as configured (no `[truth]`).
    as_configured: bool,
    /// A leak on a rack whose valve is stuck open: the isolation fails.
    isolation_fails: bool,
    leaks: bool,
    pumped_allowed: u64,
    /// Seconds from each seizure to the next lead change.
    takeovers: Vec<Option<f64>>,
    /// Host-seconds of racks whose leak ended before the scenario did.
    latched_after_s: u64,
}

fn play(path: &Path) -> Option<Played> {
    let sc = match Scenario::load(path) {
        Ok(sc) => sc,
        Err(m) if scenario::is_later_model(&m) => {
            eprintln!("SKIP (later model): {m}");
            return None;
        }
        Err(m) => panic!("{m}"),
    };
    let name = path.file_stem().unwrap().to_string_lossy().into_owned();
    let racks = sc.site.racks;
    let b18 = sim::run(&name, &sc, &mut Baseline::new(18.0, racks), None, 60).unwrap();
    let b32 = sim::run(&name, &sc, &mut Baseline::new(32.0, racks), None, 60).unwrap();
    let oracle = sim::run(&name, &sc, &mut Oracle::new(&sc), None, 60).unwrap();
    let mut watched = Watched {
        ours: Ours::new(&sc.site).unwrap(),
        lead: None,
        changes: Vec::new(),
    };
    let ours = sim::run(&name, &sc, &mut watched, None, 60).unwrap();
    let (pumped_allowed, seized) = bounds(&sc);
    let takeovers = seized
        .iter()
        .map(|at| watched.changes.iter().find(|t| **t >= *at).map(|t| t - at))
        .collect();
    Some(Played {
        ours,
        b18,
        b32,
        oracle,
        no_faults: sc.faults.is_empty(),
        as_configured: sc.truth == sc.site && sc.plate_factor.iter().all(|f| *f == 1.0),
        isolation_fails: sc.faults.iter().any(|f| match f.kind {
            FaultKind::Leak(r) => sc.faults.iter().any(|g| {
                g.kind == FaultKind::ValveStuck(r)
                    || matches!(g.kind, FaultKind::ValveFeedbackStuck(k, _) if k == r)
            }),
            _ => false,
        }),
        leaks: sc
            .faults
            .iter()
            .any(|f| matches!(f.kind, FaultKind::Leak(_))),
        pumped_allowed,
        takeovers,
        latched_after_s: sc
            .faults
            .iter()
            .filter(|f| matches!(f.kind, FaultKind::Leak(_)))
            .filter_map(|f| f.until_s)
            .map(|u| sc.duration_s.saturating_sub(u) * sc.site.hosts_per_rack as u64)
            .sum(),
    })
}

/// Public scenarios whose faults the controller does not handle yet, with
/// what goes wrong: their failures are printed as known gaps, not hidden,
/// and every other scenario must pass.
const KNOWN_GAPS: &[(&str, &str)] = &[];

#[test]
fn ours_is_safe_and_cheaper_than_both_baselines_on_every_public_scenario() {
    let list = scenarios();
    let mut failures = Vec::new();
    for p in &list {
        let Some(played) = play(p) else {
            continue;
        };
        let Played {
            ours: o,
            b18,
            b32,
            oracle,
            no_faults,
            ..
        } = &played;
        eprintln!(
            "{:24} ours pue {:.3} kwh/w {:.4} max {:.1} C | b18 {:.4} | b32 {:.4} | oracle {:.4} | caps {} failsafe {} leak_pumped {}",
            o.scenario, o.pue, o.kwh_per_work_gpu_h, o.max_gpu_temp_c, b18.kwh_per_work_gpu_h,
            b32.kwh_per_work_gpu_h, oracle.kwh_per_work_gpu_h, o.cap_requests, o.failsafe_s, o.leak_pumped_s
        );
        let gap = KNOWN_GAPS.iter().find(|(name, _)| *name == o.scenario);
        let mut bad = |what: String| match gap {
            Some((_, why)) => eprintln!("KNOWN GAP {}: {what} ({why})", o.scenario),
            None => failures.push(format!("{}: {what}", o.scenario)),
        };
        if o.shutdowns > 0 {
            bad(format!("{} shutdowns", o.shutdowns));
        }
        if o.slowdown_episodes > 0 {
            bad(format!("{} slowdown episodes", o.slowdown_episodes));
        }
        if o.gpu_s_above_max_operating > 0 {
            bad(format!("{} GPU-s above 87 C", o.gpu_s_above_max_operating));
        }
        // A leak is seen at the second it starts; its valve closes at that
        // step: within 2 s means at most 2 pumped seconds per leak.
        if o.leak_pumped_s > played.pumped_allowed {
            bad(format!(
                "leaking racks pumped {} s, {} s allowed",
                o.leak_pumped_s, played.pumped_allowed
            ));
        }
        if o.valve_reopened_unattended > 0 {
            bad(format!(
                "{} valves reopened unattended",
                o.valve_reopened_unattended
            ));
        }
        for t in &played.takeovers {
            if !t.is_some_and(|t| t <= 10.0) {
                bad(format!("the lag pump took over {t:?} s after a seizure"));
            }
        }
        // A leak that ends stays latched until an operator clears it: its
        // rack's hosts stay capped, where the oracle reopens the valve.
        let cap_bound = 1.2 * oracle.cap_requests as f64 + 60.0 + played.latched_after_s as f64;
        if o.cap_requests as f64 > cap_bound && !played.isolation_fails {
            bad(format!(
                "{} cap host-s, the oracle's {} allow {cap_bound:.0}",
                o.cap_requests, oracle.cap_requests
            ));
        }
        if played.leaks {
            continue;
        }
        if o.kwh_per_work_gpu_h >= b18.kwh_per_work_gpu_h {
            bad(format!(
                "{:.4} kWh/work-GPU-h, baseline-18 {:.4}",
                o.kwh_per_work_gpu_h, b18.kwh_per_work_gpu_h
            ));
        }
        if o.kwh_per_work_gpu_h >= b32.kwh_per_work_gpu_h {
            bad(format!(
                "{:.4} kWh/work-GPU-h, baseline-32 {:.4}",
                o.kwh_per_work_gpu_h, b32.kwh_per_work_gpu_h
            ));
        }
        let within = if *no_faults && played.as_configured {
            0.01
        } else {
            0.02
        };
        if o.kwh_per_work_gpu_h > (1.0 + within) * oracle.kwh_per_work_gpu_h {
            bad(format!(
                "{:.4} kWh/work-GPU-h, more than {:.0} % above the oracle's {:.4}",
                o.kwh_per_work_gpu_h,
                within * 100.0,
                oracle.kwh_per_work_gpu_h
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A dry cooler at half its capacity on a warm afternoon at full load
/// (no public scenario has one): the chiller and, where it is short, the
/// caps carry the heat; no GPU overheats, slows down or shuts down.
#[test]
fn a_degraded_dry_cooler_is_met_with_the_chiller_and_caps_not_heat() {
    let sc = Scenario::from_toml(
        "format = \"plant-scenario/1\"\ndescription = \"half a dry cooler\"\n\
         duration_s = 3600\nseed = 5\n[ambient]\npoints = [[0, 30.0], [3600, 36.0]]\n\
         [load]\nall = [[0, 0.9]]\n\
         [[fault]]\nat_s = 900\nkind = \"dry_cooler_degraded\"\nvalue = 0.5\n",
        "dry_cooler.toml",
    )
    .unwrap();
    let mut ours = Ours::new(&sc.site).unwrap();
    let configured = ours.core().config().facility.dry_cooler_ua_w_per_k;
    let o = sim::run("dry_cooler", &sc, &mut ours, None, 60).unwrap();
    eprintln!("{o:?}");
    // The controller saw the dry cooler lose conductance (half of it, in
    // truth) and plans with it: more of the chiller, caps where short.
    let believed = ours.core().believed().facility.dry_cooler_ua_w_per_k;
    eprintln!("dry cooler UA: configured {configured:.0} W/K, believed {believed:.0} W/K");
    assert!(
        believed < 0.85 * configured,
        "the degradation is not learned: {believed} of {configured} W/K"
    );
    assert_eq!(
        (
            o.shutdowns,
            o.slowdown_episodes,
            o.gpu_s_above_max_operating
        ),
        (0, 0, 0),
        "{o:?}"
    );
    assert!(o.max_gpu_temp_c < 87.0, "{o:?}");
}
