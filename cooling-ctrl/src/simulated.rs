//! The control core in charge of the twin, in simulated time: what
//! `cooling-ctrl simulate --controller ours` runs. The scenario runner's
//! readings become the core's inputs, the core's commands the runner's
//! decision; nothing else sits between them, so the figures are the
//! core's own. Built with the `twin` feature only.
//!
//! Glossary:
//! - *scenario runner*: `loopwarden_twin::sim`, which plays a scenario on
//!   the plant with a controller in charge.

use std::vec;
use std::vec::Vec;

use loopwarden_boards::site::SiteConfig;
use loopwarden_protocol::message::CduMode;
use loopwarden_twin::sim::{Controller, Decision, Readings};

use cooling_core::{CduReadings, ConfigError, Core, HostReport, MAX_HOSTS};

use crate::site_figures::core_config;

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
