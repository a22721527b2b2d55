//! The control core in charge of the twin, in simulated time: what
//! `cooling-ctrl simulate --controller ours` runs. The scenario runner's
//! readings become the core's inputs, the core's commands the runner's
//! decision; nothing else sits between them, so the figures are the
//! core's own.
//!
//! Glossary:
//! - *site figures*: the hall's datasheet constants (the twin's site
//!   config), which the core is configured with as a real site would be.

use std::vec;
use std::vec::Vec;

use loopwarden_boards::plant::SiteConfig;
use loopwarden_boards::sim::{Controller, Decision, Readings};
use loopwarden_protocol::message::CduMode;

use cooling_core::config::{CduParams, FacilityParams, GpuParams, HostParams, Layout};
use cooling_core::{CduReadings, ConfigError, Core, CoreConfig, HostReport, MAX_HOSTS};

/// The core's configuration for a hall described by `site`, with the
/// core's default margins and timings.
pub fn core_config(site: &SiteConfig) -> Result<CoreConfig, ConfigError> {
    let d = CoreConfig::default();
    let g = &site.gpu;
    let mut r_cp = d.gpu.r_cp;
    if g.r_cp.len() != r_cp.len() {
        return Err(ConfigError::Figure(
            "gpu.r_cp: the core takes exactly 6 points",
        ));
    }
    for (dst, src) in r_cp.iter_mut().zip(&g.r_cp) {
        *dst = [src[0] as f32, src[1] as f32];
    }
    let l = &site.secondary;
    let f = &site.facility;
    let narrow =
        |n: usize, what: &'static str| u8::try_from(n).map_err(|_| ConfigError::Layout(what));
    let cfg = CoreConfig {
        layout: Layout {
            racks: narrow(site.racks, "too many racks")?,
            hosts_per_rack: narrow(site.hosts_per_rack, "too many hosts per rack")?,
            gpus_per_host: narrow(site.gpus_per_host, "too many GPUs per host")?,
        },
        gpu: GpuParams {
            tdp_w: g.tdp_w as f32,
            min_cap_w: g.min_cap_w as f32,
            static_w: g.static_w as f32,
            leak_per_k: g.leak_per_k as f32,
            r_jc_k_per_w: g.r_jc as f32,
            r_cp,
            max_operating_c: g.max_operating_c as f32,
        },
        host: HostParams {
            full_w: site.host.full_w as f32,
            idle_w: site.host.idle_w as f32,
        },
        cdu: CduParams {
            design_lpm_per_gpu: l.design_lpm_per_gpu as f32,
            min_speed: l.min_speed as f32,
            pump_max_w: l.pump_max_w as f32,
            approach_k: l.approach_k as f32,
            min_setpoint_c: l.min_setpoint_c() as f32,
            max_setpoint_c: l.max_setpoint_c as f32,
            cp_j_per_kg_k: l.cp_j_per_kg_k as f32,
            density_kg_per_m3: l.density_kg_per_m3 as f32,
        },
        facility: FacilityParams {
            water_kg_per_s: f.water_kg_per_s as f32,
            water_cp_j_per_kg_k: f.water_cp_j_per_kg_k as f32,
            dry_cooler_ua_w_per_k: f.dry_cooler_ua_w_per_k as f32,
            fan_max_w: f.fan_max_w as f32,
            pinch_k: f.pinch_k as f32,
            chiller_max_w: f.chiller_max_w as f32,
            cop_max: f.cop_max as f32,
            carnot_fraction: f.carnot_fraction as f32,
            pumps_w: f.pumps_w as f32,
            distribution_loss: f.distribution_loss as f32,
            fixed_w: f.fixed_w as f32,
        },
        margins: d.margins,
        timing: d.timing,
    };
    cfg.validate()?;
    Ok(cfg)
}

/// The core as a scenario runner's controller.
pub struct Ours {
    core: Core,
    reports: Vec<Option<HostReport>>,
    racks: usize,
}

impl Ours {
    /// The core configured for `site`.
    pub fn new(site: &SiteConfig) -> Result<Self, ConfigError> {
        let cfg = core_config(site)?;
        Ok(Self {
            core: Core::new(cfg)?,
            reports: vec![None; cfg.layout.hosts().min(MAX_HOSTS)],
            racks: site.racks,
        })
    }

    /// The core (for tests that look inside).
    pub fn core(&self) -> &Core {
        &self.core
    }
}

impl Controller for Ours {
    fn name(&self) -> &str {
        "ours"
    }

    fn step(&mut self, r: &Readings) -> Decision {
        let now_ms = (r.t_s * 1000.0).round() as u64;
        // A report keeps its arrival time: during a bus outage the core
        // sees them age.
        for h in &r.hosts {
            if let Some(slot) = self.reports.get_mut(h.host) {
                *slot = Some(HostReport {
                    gpus: h.gpus.min(255) as u8,
                    hottest_c: if h.hottest_c.is_finite() {
                        h.hottest_c as f32
                    } else {
                        0.0
                    },
                    gpu_power_w: h.gpu_power_w as f32,
                    limit_w: h.limit_w as f32,
                    slowdown: h.slowdown,
                    at_ms: now_ms,
                });
            }
        }
        let leaks = r
            .leaks
            .iter()
            .enumerate()
            .filter(|(i, l)| **l && *i < 16)
            .fold(0u16, |m, (i, _)| m | (1 << i));
        let f = |x: Option<f64>| x.map(|v| v as f32);
        let cdu = r.modbus_ok.then(|| CduReadings {
            supply_c: f(r.supply_c),
            return_c: f(r.return_c),
            flow_lpm: f(r.flow_lpm),
            facility_supply_c: f(r.facility_supply_c),
            pumps_running: r.pumps_running,
            it_w: Some(r.it_w as f32),
            facility_w: Some(r.facility_w as f32),
        });
        let c = self.core.step(&cooling_core::Inputs {
            now_ms,
            cdu,
            ambient_c: Some(r.ambient_c as f32),
            leaks,
            hosts: &self.reports,
        });
        Decision {
            setpoint_c: c.setpoint_c as f64,
            pump_speed: c.pump_speed as f64,
            pump_on: c.pump_on,
            valves: (0..self.racks)
                .map(|i| i < 16 && c.valves_open & (1 << i) != 0)
                .collect(),
            host_caps: self
                .reports
                .iter()
                .enumerate()
                .map(|(h, _)| c.caps[h].map(|cap| cap.watts as f64))
                .collect(),
            rack_cooling_lost: (0..self.racks)
                .map(|i| i < 16 && c.cooling_lost & (1 << i) != 0)
                .collect(),
            failsafe: c.mode == CduMode::Failsafe,
        }
    }
}
