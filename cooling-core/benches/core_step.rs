//! What one step of the control core costs: `Core::step` for the default
//! hall (4 racks × 4 hosts of 8 GPUs, 16 host reports) in steady
//! operation.
//!
//! `cargo bench -p cooling-core --bench core_step` first prints the sizes
//! of the core's types, then times:
//! - `step`: one step a second of a warmed-up core in normal mode, fresh
//!   reports from every host and CDU readings that follow what the core
//!   commanded. The optimiser starts a search every minute and judges one
//!   grid row per step until the search is done, so most steps judge no
//!   row; divan's mean is the mean over that cycle.
//! - `step_with_search_row`: the same, with a search started every second,
//!   so every step judges a grid row: the most a steady step does.
//! - `minute_of_steps`: 60 consecutive steps (a whole optimiser cycle).
//!
//! The readings come from a small closed loop written here (supply at the
//! commanded setpoint, flow at the commanded speed times the design flow,
//! return and hottest GPU from the heat carried), not from the plant
//! model, so that only the core is timed.
//!
//! Glossary:
//! - *warmed-up*: stepped for 10 simulated minutes first, past booting
//!   and the first searches.

use std::time::Duration;

use cooling_core::{
    model, CduReadings, Commands, Core, CoreConfig, HostReport, Inputs, LeakInputs, MAX_HOSTS,
};
use divan::{black_box, Bencher};
use loopwarden_protocol::message::CduMode;

/// Each GPU's power in the steady hall, W.
const GPU_W: f32 = 650.0;

/// A core and the world it is stepped in.
struct Hall {
    core: Core,
    cfg: CoreConfig,
    now_ms: u64,
    setpoint_c: f32,
    speed: f32,
    hosts: [Option<HostReport>; MAX_HOSTS],
}

impl Hall {
    fn new(cfg: CoreConfig) -> Self {
        let mut h = Self {
            core: Core::new(cfg).expect("default config is valid"),
            cfg,
            now_ms: 0,
            setpoint_c: cfg.margins.boot_setpoint_c,
            speed: 1.0,
            hosts: [None; MAX_HOSTS],
        };
        // Warm up: past booting and several optimiser searches.
        for _ in 0..600 {
            h.step();
        }
        h.assert_normal();
        h
    }

    fn assert_normal(&self) {
        let (mode, why, _) = self.core.mode();
        assert_eq!(
            mode,
            CduMode::Normal,
            "the benchmark must time a core in normal mode ({why:?})"
        );
    }

    /// One second later: readings from the last commands, then a step.
    fn step(&mut self) -> Commands {
        self.now_ms += 1000;
        let cfg = &self.cfg;
        let gpus = cfg.layout.gpus() as f32;
        let hpr = cfg.layout.hosts_per_rack as usize;
        let gph = f32::from(cfg.layout.gpus_per_host);
        let host_w = gph * GPU_W + cfg.host.full_w;
        let it_w = cfg.layout.hosts() as f32 * host_w;
        let flow_lpm = self.speed * cfg.cdu.design_lpm_per_gpu * gpus;
        let kg_s = flow_lpm / 60_000.0 * cfg.cdu.density_kg_per_m3;
        let rise_k = it_w / (kg_s * cfg.cdu.cp_j_per_kg_k);
        let supply = self.setpoint_c;
        let ret = supply + rise_k;
        // Junction over the coolant through the die and the cold plate at
        // this flow, as the core's model has it.
        let q = model::flow_per_gpu(cfg, self.speed, cfg.layout.gpus());
        let hottest = supply + GPU_W * (cfg.gpu.r_jc_k_per_w + model::r_cold_plate(&cfg.gpu, q));
        for (i, slot) in self.hosts.iter_mut().take(cfg.layout.hosts()).enumerate() {
            *slot = Some(HostReport {
                gpus: cfg.layout.gpus_per_host,
                // Hosts differ a little, as real ones do.
                hottest_c: hottest + 0.1 * (i % hpr) as f32,
                gpu_power_w: gph * GPU_W,
                limit_w: cfg.gpu.tdp_w,
                slowdown: false,
                at_ms: self.now_ms,
            });
        }
        let c = self.core.step(&Inputs {
            now_ms: self.now_ms,
            cdu: Some(CduReadings {
                supply_c: Some(supply),
                return_c: Some(ret),
                flow_lpm: Some(flow_lpm),
                facility_supply_c: Some(supply - cfg.cdu.approach_k),
                pumps_running: [true, false],
                it_w: Some(it_w),
                facility_w: Some(it_w * 1.08),
                ..Default::default()
            }),
            ambient_c: Some(22.0),
            leaks: LeakInputs::DRY,
            cdu_taken: cooling_core::Taken::ALL,
            valves_held: 0,
            hosts: &self.hosts,
        });
        self.setpoint_c = c.setpoint_c;
        self.speed = c.pump_speed;
        c
    }
}

#[divan::bench]
fn step(bencher: Bencher) {
    let mut hall = Hall::new(CoreConfig::default());
    bencher.bench_local(|| black_box(hall.step()));
    hall.assert_normal();
}

#[divan::bench]
fn step_with_search_row(bencher: Bencher) {
    let mut cfg = CoreConfig::default();
    cfg.timing.optimise_every_ms = 1000;
    let mut hall = Hall::new(cfg);
    bencher.bench_local(|| black_box(hall.step()));
    hall.assert_normal();
}

#[divan::bench]
fn minute_of_steps(bencher: Bencher) {
    let mut hall = Hall::new(CoreConfig::default());
    bencher.bench_local(|| {
        for _ in 0..60 {
            black_box(hall.step());
        }
    });
    hall.assert_normal();
}

fn main() {
    println!(
        "size_of: Core {} B, Commands {} B, Inputs {} B, HostReport {} B, \
         [Option<HostReport>; MAX_HOSTS] {} B, CoreConfig {} B",
        size_of::<Core>(),
        size_of::<Commands>(),
        size_of::<Inputs<'_>>(),
        size_of::<HostReport>(),
        size_of::<[Option<HostReport>; MAX_HOSTS]>(),
        size_of::<CoreConfig>(),
    );
    let mut hall = Hall::new(CoreConfig::default());
    let c = hall.step();
    println!(
        "warmed up: setpoint {:.1} °C, pump speed {:.2}, {} hosts capped",
        c.setpoint_c,
        c.pump_speed,
        c.caps.iter().filter(|c| c.is_some()).count()
    );
    // As `divan::main()`, but each benchmark samples for at least 0.5 s.
    divan::Divan::default()
        .min_time(Duration::from_millis(500))
        .config_with_args()
        .main();
}
