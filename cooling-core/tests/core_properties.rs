//! Properties of the control core under random readings, sensor faults,
//! rope faults, failed input reads, valves that do not confirm and
//! restarts at random steps (the core rebuilt from its latched record, as
//! the shell does from flash): its commands stay within the CDU's limits;
//! a leaking rack's valve is shut on the very step its rope fires and is
//! never reopened, restarts included; both pumps are never commanded off
//! except while an isolation has failed; and a rack whose leak sensing is
//! lost is always reported so, never as dry.

use cooling_core::{
    CduReadings, Core, CoreConfig, HostReport, Inputs, Latched, LeakInputs, MAX_HOSTS,
};
use proptest::prelude::*;

/// One step's worth of random world.
#[derive(Debug, Clone)]
struct World {
    cdu_answers: bool,
    supply: Option<f32>,
    ret: Option<f32>,
    flow: Option<f32>,
    pumps: [bool; 2],
    it_w: Option<f32>,
    leaks: u16,
    rope_faults: u16,
    read_ok: bool,
    dp: Option<f32>,
    valves_confirm: bool,
    restart: bool,
    hosts_hot: Option<f32>,
    host_power: f32,
    ambient: Option<f32>,
    dt_ms: u64,
}

fn reading(lo: f32, hi: f32) -> impl Strategy<Value = Option<f32>> {
    prop_oneof![
        6 => (lo..hi).prop_map(Some),
        1 => Just(None),
        1 => Just(Some(0.0)),
        1 => prop_oneof![Just(f32::NAN), Just(-40.0f32), Just(500.0f32)].prop_map(Some),
    ]
}

fn world() -> impl Strategy<Value = World> {
    (
        prop::bool::weighted(0.9),
        reading(10.0, 60.0),
        reading(10.0, 70.0),
        reading(0.0, 250.0),
        (any::<bool>(), any::<bool>()),
        reading(0.0, 150_000.0),
        prop::bool::weighted(0.05).prop_flat_map(|leak| {
            if leak {
                (0u16..16).prop_map(|r| 1u16 << r).boxed()
            } else {
                Just(0u16).boxed()
            }
        }),
        prop::option::weighted(0.8, 20.0f32..95.0),
        0.0f32..5600.0,
        prop::option::of(-20.0f32..50.0),
        prop_oneof![Just(1000u64), 0u64..5000],
        faults(),
    )
        .prop_map(
            |(
                cdu_answers,
                supply,
                ret,
                flow,
                (a, b),
                it_w,
                leaks,
                hosts_hot,
                host_power,
                ambient,
                dt_ms,
                (rope_faults, read_ok, dp, valves_confirm, restart),
            )| World {
                cdu_answers,
                supply,
                ret,
                flow,
                pumps: [a, b],
                it_w,
                leaks,
                rope_faults,
                read_ok,
                dp,
                valves_confirm,
                restart,
                hosts_hot,
                host_power,
                ambient,
                dt_ms,
            },
        )
}

/// Rope faults, a failed read of the inputs, the pressure, whether the
/// valves confirm what they are told, and a restart.
fn faults() -> impl Strategy<Value = (u16, bool, Option<f32>, bool, bool)> {
    (
        prop_oneof![8 => Just(0u16), 1 => any::<u16>()],
        prop::bool::weighted(0.95),
        reading(0.0, 150.0),
        prop::bool::weighted(0.9),
        prop::bool::weighted(0.02),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn latched_valves_stay_shut_pumps_never_both_stop_and_lost_sensing_is_reported(
        steps in prop::collection::vec(world(), 1..400),
    ) {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let racks = cfg.layout.racks as usize;
        let mut now = 0u64;
        let mut hosts = [None; MAX_HOSTS];
        let mut latched = 0u16;
        let mut closed = 0u16;
        for w in &steps {
            now += w.dt_ms;
            if w.restart {
                // What the shell wrote to flash after the last step.
                let record = core.latched().encode();
                core = Core::restore(cfg, &Latched::decode(&record).unwrap()).unwrap();
                now = 0;
                hosts = [None; MAX_HOSTS];
            }
            if let Some(hot) = w.hosts_hot {
                for h in hosts.iter_mut().take(cfg.layout.hosts()) {
                    *h = Some(HostReport {
                        gpus: 8,
                        hottest_c: hot,
                        gpu_power_w: w.host_power,
                        limit_w: 700.0,
                        slowdown: hot > 89.0,
                        at_ms: now,
                    });
                }
            }
            let c = core.step(&Inputs {
                now_ms: now,
                cdu: w.cdu_answers.then_some(CduReadings {
                    supply_c: w.supply,
                    return_c: w.ret,
                    flow_lpm: w.flow,
                    facility_supply_c: w.supply.map(|s| s - 3.0),
                    pumps_running: w.pumps,
                    diff_pressure_kpa: w.dp,
                    // A valve that confirms reads as it was last told.
                    valves_closed: w.valves_confirm.then_some(closed),
                    it_w: w.it_w,
                    facility_w: w.it_w.map(|p| p * 1.1),
                    ..Default::default()
                }),
                ambient_c: w.ambient,
                leaks: LeakInputs { wet: w.leaks, rope_faults: w.rope_faults, read_ok: w.read_ok, cdu: None },
                cdu_taken: cooling_core::Taken::ALL,
                valves_held: 0,
                hosts: &hosts,
            });
            let all = (1u16 << racks) - 1;
            closed = !c.valves_open & all;
            prop_assert!(c.setpoint_c.is_finite());
            prop_assert!(c.setpoint_c >= cfg.cdu.min_setpoint_c && c.setpoint_c <= cfg.cdu.max_setpoint_c, "{}", c.setpoint_c);
            prop_assert!(c.pump_speed >= cfg.cdu.min_speed && c.pump_speed <= 1.0, "{}", c.pump_speed);
            prop_assert!(
                c.pump_on[0] || c.pump_on[1] || c.isolation_failed != 0,
                "both pumps stopped without a failed isolation"
            );
            prop_assert!(c.isolation_failed & !latched == 0);
            // Lost sensing is reported, never read as dry.
            let lost = if w.read_ok { w.rope_faults & all } else { all };
            prop_assert_eq!(c.sensing_lost, lost);
            for (h, cap) in c.caps.iter().enumerate() {
                if let Some(cap) = cap {
                    prop_assert!(h < cfg.layout.hosts());
                    prop_assert!(cap.watts >= cfg.gpu.min_cap_w && cap.watts <= cfg.gpu.tdp_w, "{}", cap.watts);
                }
            }
            // A leak input shuts its rack's valve on this very step, and it
            // stays shut (latched) afterwards.
            if w.read_ok {
                latched |= w.leaks & all;
            }
            prop_assert_eq!(c.valves_open & latched, 0);
            prop_assert_eq!(c.cooling_lost & latched, latched);
            // Racks that never leaked stay open.
            prop_assert_eq!(c.valves_open | latched, all);
        }
    }
}
