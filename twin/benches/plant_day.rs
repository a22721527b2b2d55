//! A day of the default hall (128 GPUs) at 1 s steps, timed.
//!
//! `cargo bench -p loopwarden-twin --bench plant_day` steps the plant
//! model alone (no controller, no sensors) through 86,400 one-second steps
//! of a load that follows the day (idle nights, a training job by day)
//! and the outdoor temperature, three times, and prints the median.

use std::time::Instant;

use loopwarden_twin::plant::{Actuation, Conditions, Plant, SiteConfig};

fn main() {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..3 {
        let mut p = Plant::new(SiteConfig::default(), 30.0);
        let n = p.gpus().len();
        let act = Actuation {
            setpoint_c: 32.0,
            pump_speed: 0.8,
            pump_on: [true, false],
            valves: vec![true; p.site().racks],
            caps: vec![None; n],
            powered_down: vec![false; n],
        };
        let mut cond = Conditions {
            ambient_c: 20.0,
            demand: vec![0.1; n],
            pump_tripped: [false; 2],
            plate_factor: Vec::new(),
            chiller_tripped: false,
            dry_cooler_fraction: 1.0,
        };
        let start = Instant::now();
        for t in 0..86_400u32 {
            let hour = f64::from(t) / 3600.0;
            cond.ambient_c = 18.0 + 8.0 * ((hour - 9.0) / 24.0 * std::f64::consts::TAU).sin();
            let u = if (8.0..20.0).contains(&hour) {
                0.92
            } else {
                0.1
            };
            cond.demand.iter_mut().for_each(|d| *d = u);
            p.step(1.0, &act, &cond);
        }
        times.push(start.elapsed().as_secs_f64());
        last = Some(p.totals());
    }
    times.sort_by(f64::total_cmp);
    let t = last.expect("ran");
    println!(
        "a day of 128 GPUs at 1 s steps: median {:.3} s (min {:.3}, max {:.3}); PUE {:.3}, {:.0} work-GPU-h",
        times[1],
        times[0],
        times[2],
        t.facility_j / t.it_j,
        t.work_gpu_s / 3600.0
    );
}
