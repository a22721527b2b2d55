//! Properties of the estimator inside the core, under sensor noise,
//! spikes, lost readings and a CDU that stops answering: every learned
//! figure stays finite and within its bounds, trust never exceeds 1, and
//! on a plant whose hosts run `k` times the configured resistance the
//! learned factors stay near `k` whatever the noise does.

use cooling_core::model;
use cooling_core::{CduReadings, Core, CoreConfig, HostReport, Inputs, LeakInputs, MAX_HOSTS};
use proptest::prelude::*;

/// One step's disturbance of a consistent plant.
#[derive(Debug, Clone, Copy)]
struct Noise {
    /// Added to every temperature reading, K.
    temp_k: f32,
    /// A spike on the supply sensor, K (0: none).
    spike_k: f32,
    /// The supply reading is lost.
    supply_lost: bool,
    /// The CDU does not answer.
    silent: bool,
    /// Each host's hottest GPU reads this much off, K.
    host_k: f32,
}

fn noise() -> impl Strategy<Value = Noise> {
    (
        -0.3f32..0.3,
        prop_oneof![20 => Just(0.0f32), 1 => -25.0f32..25.0],
        prop::bool::weighted(0.02),
        prop::bool::weighted(0.02),
        -0.5f32..0.5,
    )
        .prop_map(|(temp_k, spike_k, supply_lost, silent, host_k)| Noise {
            temp_k,
            spike_k,
            supply_lost,
            silent,
            host_k,
        })
}

/// Steps a 16-host plant whose GPUs run `k` (per rack) times the
/// configured resistance, the supply following what the core commands,
/// under `noises` (one per second); returns the core.
fn run(k: [f32; 4], noises: &[Noise]) -> Core {
    let cfg = CoreConfig::default();
    let mut core = Core::new(cfg).unwrap();
    let mut hosts = [None; MAX_HOSTS];
    let (mut sp, mut speed) = (cfg.margins.boot_setpoint_c, 1.0f32);
    for (s, n) in noises.iter().enumerate() {
        let now = s as u64 * 1000;
        let flow = cfg.cdu.design_lpm_per_gpu * 128.0 * speed;
        let r = cfg.gpu.r_jc_k_per_w + model::r_cold_plate(&cfg.gpu, flow / 128.0);
        let p = 600.0;
        for (h, slot) in hosts.iter_mut().take(16).enumerate() {
            *slot = Some(HostReport {
                gpus: 8,
                hottest_c: sp + p * r * k[h / 4] + n.host_k,
                gpu_power_w: 8.0 * p,
                limit_w: 700.0,
                slowdown: false,
                at_ms: now,
            });
        }
        let it = 16.0 * (8.0 * p + 1100.0);
        let supply = (!n.supply_lost).then_some(sp + n.temp_k + n.spike_k);
        let c = core.step(&Inputs {
            now_ms: now,
            cdu: (!n.silent).then_some(CduReadings {
                supply_c: supply,
                return_c: Some(sp + it / (flow * 1030.0 / 60_000.0 * 3900.0) + n.temp_k),
                flow_lpm: Some(flow),
                facility_supply_c: Some(sp - 3.0 + n.temp_k),
                pumps_running: [true, false],
                it_w: Some(it),
                facility_w: Some(it * 1.08),
                ..Default::default()
            }),
            ambient_c: Some(25.0),
            leaks: LeakInputs::DRY,
            cdu_taken: cooling_core::Taken::ALL,
            valves_held: 0,
            hosts: &hosts,
        });
        (sp, speed) = (c.setpoint_c, c.pump_speed);
        let l = core.learned();
        assert!(l.sane(), "step {s}: {l:?}");
    }
    core
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn the_learned_factors_stay_bounded_and_near_the_truth_under_noise_and_faults(
        k in prop::array::uniform4(0.8f32..1.8),
        noises in prop::collection::vec(noise(), 2400),
    ) {
        let core = run(k, &noises);
        let l = core.learned();
        for h in 0..16 {
            let got = l.hosts[h].value;
            let want = k[h / 4];
            prop_assert!((got / want - 1.0).abs() < 0.1, "host {h}: {got} against {want}");
            prop_assert!((0.0..=1.0).contains(&l.hosts[h].trust));
        }
    }
}

#[test]
fn a_quiet_plant_is_learned_within_five_percent_in_forty_minutes() {
    let quiet = Noise {
        temp_k: 0.0,
        spike_k: 0.0,
        supply_lost: false,
        silent: false,
        host_k: 0.0,
    };
    let k = [1.0, 1.4, 1.1, 0.9];
    let core = run(k, &[quiet; 2400]);
    let l = core.learned();
    for h in 0..16 {
        let got = l.hosts[h].value;
        assert!((got / k[h / 4] - 1.0).abs() < 0.05, "host {h}: {got}");
    }
}
