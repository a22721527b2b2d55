//! Properties of the control core under random readings and sensor
//! faults: its commands stay within the CDU's limits, it never stops both
//! pumps, and a leaking rack's valve is shut on the very step its input
//! fires.

use cooling_core::{CduReadings, Core, CoreConfig, HostReport, Inputs, MAX_HOSTS};
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
            )| World {
                cdu_answers,
                supply,
                ret,
                flow,
                pumps: [a, b],
                it_w,
                leaks,
                hosts_hot,
                host_power,
                ambient,
                dt_ms,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn commands_stay_within_the_cdus_limits_and_both_pumps_never_stop(
        steps in prop::collection::vec(world(), 1..400),
    ) {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let racks = cfg.layout.racks as usize;
        let mut now = 0u64;
        let mut hosts = [None; MAX_HOSTS];
        let mut latched = 0u16;
        for w in &steps {
            now += w.dt_ms;
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
                    it_w: w.it_w,
                    facility_w: w.it_w.map(|p| p * 1.1),
                }),
                ambient_c: w.ambient,
                leaks: w.leaks,
                hosts: &hosts,
            });
            prop_assert!(c.setpoint_c.is_finite());
            prop_assert!(c.setpoint_c >= cfg.cdu.min_setpoint_c && c.setpoint_c <= cfg.cdu.max_setpoint_c, "{}", c.setpoint_c);
            prop_assert!(c.pump_speed >= cfg.cdu.min_speed && c.pump_speed <= 1.0, "{}", c.pump_speed);
            prop_assert!(c.pump_on[0] || c.pump_on[1], "both pumps stopped");
            for (h, cap) in c.caps.iter().enumerate() {
                if let Some(cap) = cap {
                    prop_assert!(h < cfg.layout.hosts());
                    prop_assert!(cap.watts >= cfg.gpu.min_cap_w && cap.watts <= cfg.gpu.tdp_w, "{}", cap.watts);
                }
            }
            // A leak input shuts its rack's valve on this very step, and it
            // stays shut (latched) afterwards.
            latched |= w.leaks & ((1u16 << racks) - 1);
            prop_assert_eq!(c.valves_open & latched, 0);
            prop_assert_eq!(c.cooling_lost & latched, latched);
            // Racks that never leaked stay open.
            prop_assert_eq!(c.valves_open | latched, (1u16 << racks) - 1);
        }
    }
}
