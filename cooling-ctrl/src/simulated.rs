//! The control core in charge of the twin, in simulated time: what
//! `cooling-ctrl simulate --controller ours` runs. The scenario runner's
//! readings become the core's inputs, the core's commands the runner's
//! decision; nothing else sits between them, so the figures are the
//! core's own. Built with the `twin` feature only.
//!
//! As the shell does, it keeps the core's latched state in flash (a
//! simulated flash of the controller's geometry, through the same
//! [`save_latched`]) before a step's decision acts, and a
//! `controller_restart` rebuilds the core from what that flash holds after
//! it is opened again ([`load_latched`]), not from a copy in memory.
//! What the core learned of the hall is kept in the same flash every
//! [`LEARNED_EVERY`] of simulated time ([`save_learned`]), as the shell
//! keeps it every ten minutes of running, and restored after a restart
//! ([`load_learned`]): a restart loses what was learned since the last
//! keep, not all of it.
//!
//! Glossary:
//! - *scenario runner*: `loopwarden_twin::sim`, which plays a scenario on
//!   the plant with a controller in charge.

use std::vec;
use std::vec::Vec;

use futures::executor::block_on;
use loopwarden_boards::site::SiteConfig;
use loopwarden_boards::FlashBoard;
use loopwarden_bus::agent_flash::AgentFlash;
use loopwarden_flash::sim::SimFlash;
use loopwarden_flash::ConfigStore;
use loopwarden_protocol::message::CduMode;
use loopwarden_twin::sim::{Controller, Decision, Readings};

use cooling_core::facility::Offer;
use cooling_core::{
    CduReadings, ConfigError, Core, CoreConfig, HostReport, Latched, LeakInputs, MAX_HOSTS,
};

use crate::journal::{load_latched, load_learned, save_latched, save_learned, LEARNED_EVERY};
use crate::site_figures::core_config;

/// The core as a scenario runner's controller.
pub struct Ours {
    core: Core,
    cfg: CoreConfig,
    reports: Vec<Option<HostReport>>,
    racks: usize,
    /// The controller's flash, simulated.
    store: Option<ConfigStore<AgentFlash>>,
    /// The latched state last written to it.
    kept: Latched,
    /// When the learned figures were last written to it, ms of the
    /// scenario.
    learned_at_ms: u64,
    /// The time at the restart, ms: the restarted process counts from it.
    epoch_ms: u64,
    restarting: bool,
    /// What the core offers the hall's facility coordinator.
    offer: Option<Offer>,
}

/// The config store on a fresh simulated flash of the controller's
/// geometry, or on `flash` reopened.
fn open_store(flash: Option<AgentFlash>) -> ConfigStore<AgentFlash> {
    let board = FlashBoard::host_file();
    let flash =
        flash.unwrap_or_else(|| AgentFlash::Memory(SimFlash::new(board.geometry.sectors as usize)));
    match ConfigStore::open(flash, board.layout().config) {
        Ok(s) => s,
        Err(e) => panic!("the host flash board's config range is refused: {e:?}"),
    }
}

impl Ours {
    /// The core configured for `site`.
    pub fn new(site: &SiteConfig) -> Result<Self, ConfigError> {
        let cfg = core_config(site)?;
        let core = Core::new(cfg)?;
        Ok(Self {
            kept: core.latched(),
            core,
            cfg,
            reports: vec![None; cfg.layout.hosts().min(MAX_HOSTS)],
            racks: site.racks,
            store: Some(open_store(None)),
            learned_at_ms: 0,
            epoch_ms: 0,
            restarting: false,
            offer: None,
        })
    }

    /// The core (for tests that look inside).
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// Writes the core's latched state to flash when it changed.
    fn keep_latched(&mut self) {
        let now = self.core.latched();
        if now != self.kept {
            if let Some(store) = self.store.as_mut() {
                if let Err(e) = block_on(save_latched(store, &now)) {
                    panic!("the simulated flash refused the latched state: {e}");
                }
            }
            self.kept = now;
        }
    }

    /// Writes what the core learned to flash every [`LEARNED_EVERY`] of
    /// the scenario's time (`t_ms`).
    fn keep_learned(&mut self, t_ms: u64) {
        if t_ms.saturating_sub(self.learned_at_ms) < LEARNED_EVERY.as_millis() as u64 {
            return;
        }
        self.learned_at_ms = t_ms;
        if let Some(store) = self.store.as_mut() {
            if let Err(e) = block_on(save_learned(store, &self.core.learned())) {
                panic!("the simulated flash refused the learned figures: {e}");
            }
        }
    }

    /// The process starts again at `now_ms`: the flash is opened anew and
    /// the core rebuilt from what it holds (the latched state, then what
    /// was learned); the host reports are gone.
    fn start_again(&mut self, now_ms: u64) {
        let flash = self.store.take().map(ConfigStore::into_flash);
        let mut store = open_store(flash);
        let latched = match block_on(load_latched(&mut store)) {
            Ok(l) => l,
            Err(e) => panic!("the simulated flash lost the latched state: {e}"),
        };
        self.core = match latched {
            Some(l) => Core::restore(self.cfg, &l),
            None => Core::new(self.cfg),
        }
        .unwrap_or_else(|e| panic!("a configuration accepted before is refused: {e}"));
        let learned = block_on(load_learned(&mut store, &self.cfg));
        if let Some(why) = learned.refused.first() {
            panic!("the simulated flash lost the learned figures: {why}");
        }
        if let Some(l) = learned.learned {
            // Refused (out of their bounds): the configured figures, as
            // the shell starts then.
            if let Err(e) = self.core.restore_learned(&l) {
                tracing::warn!("ours: the learned figures kept in flash are not restored: {e}");
            }
        }
        self.kept = self.core.latched();
        self.store = Some(store);
        self.reports.iter_mut().for_each(|r| *r = None);
        self.epoch_ms = now_ms;
        self.learned_at_ms = now_ms;
    }
}

impl Controller for Ours {
    fn name(&self) -> &str {
        "ours"
    }

    fn restart(&mut self) {
        self.restarting = true;
    }

    fn facility_offer(&self) -> Option<&dyn std::any::Any> {
        self.offer.as_ref().map(|o| o as &dyn std::any::Any)
    }

    fn hear_facility_target(&mut self, water_c: f64, t_s: f64) {
        let t_ms = (t_s * 1000.0).round() as u64;
        self.core
            .facility_target(water_c as f32, t_ms.saturating_sub(self.epoch_ms));
    }

    fn step(&mut self, r: &Readings) -> Decision {
        let t_ms = (r.t_s * 1000.0).round() as u64;
        if std::mem::take(&mut self.restarting) {
            self.start_again(t_ms);
        }
        // The process's monotonic clock starts at its start.
        let now_ms = t_ms - self.epoch_ms;
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
        let f = |x: Option<f64>| x.map(|v| v as f32);
        let cdu = r.modbus_ok.then(|| CduReadings {
            supply_c: f(r.supply_c),
            return_c: f(r.return_c),
            flow_lpm: f(r.flow_lpm),
            facility_supply_c: f(r.facility_supply_c),
            pumps_running: r.pumps_running,
            pump_faults: r.pump_faults,
            diff_pressure_kpa: f(r.diff_pressure_kpa),
            valves_closed: r.valves_closed.as_deref().map(mask),
            it_w: Some(r.it_w as f32),
            facility_w: Some(r.facility_w as f32),
        });
        let c = self.core.step(&cooling_core::Inputs {
            now_ms,
            cdu,
            ambient_c: crate::shell::outdoor::cdu_outdoor(r.ambient_c, r.modbus_ok),
            leaks: LeakInputs {
                wet: mask(&r.leaks),
                rope_faults: mask(&r.rope_faults),
                read_ok: r.board_ok,
            },
            cdu_writes_ok: r.writes_ok,
            hosts: &self.reports,
        });
        self.offer = self.core.offer();
        // In flash before it acts.
        self.keep_latched();
        self.keep_learned(t_ms);
        Decision {
            setpoint_c: c.setpoint_c as f64,
            pump_speed: c.pump_speed as f64,
            pump_on: c.pump_on,
            valves: per_rack(c.valves_open, self.racks),
            host_caps: self
                .reports
                .iter()
                .enumerate()
                .map(|(h, _)| c.caps[h].map(|cap| cap.watts as f64))
                .collect(),
            rack_cooling_lost: per_rack(c.cooling_lost, self.racks),
            failsafe: c.mode == CduMode::Failsafe,
            heartbeat: true,
            leak_sensing_lost: per_rack(c.sensing_lost, self.racks),
        }
    }
}

/// A mask, bit n = rack n, as a list for `racks` racks (racks past 16
/// read clear).
fn per_rack(mask: u16, racks: usize) -> Vec<bool> {
    (0..racks).map(|i| i < 16 && mask & (1 << i) != 0).collect()
}

/// A per-rack list as a mask, bit n = rack n (racks past 16 left out).
fn mask(per_rack: &[bool]) -> u16 {
    per_rack
        .iter()
        .enumerate()
        .filter(|(i, on)| **on && *i < 16)
        .fold(0u16, |m, (i, _)| m | (1 << i))
}

/// The facility coordinator ([`crate::facility::Coordinator`]) as the
/// twin's: the offers of the `Ours` controllers of a hall of several
/// CDUs in, the facility water and the chiller's staging out.
pub struct SimCoordinator {
    inner: crate::facility::Coordinator,
}

impl SimCoordinator {
    /// The coordinator of a hall of `site` (its `cdus` CDUs).
    pub fn new(site: &SiteConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            inner: crate::facility::Coordinator::new(&core_config(site)?),
        })
    }
}

impl loopwarden_twin::sim::FacilityCoordinator for SimCoordinator {
    fn order(
        &mut self,
        t_s: f64,
        ambient_c: f64,
        offers: &[Option<&dyn std::any::Any>],
    ) -> loopwarden_twin::sim::FacilityOrder {
        let now_ms = (t_s * 1000.0).round() as u64;
        for (cdu, o) in offers.iter().enumerate() {
            if let Some(o) = o.and_then(|o| o.downcast_ref::<Offer>()) {
                if let Err(e) = self.inner.hear(cdu, *o, now_ms) {
                    panic!("the twin's hall and its coordinator disagree: {e}");
                }
            }
        }
        match self.inner.plan(now_ms, ambient_c as f32) {
            Some(p) => loopwarden_twin::sim::FacilityOrder {
                water_c: f64::from(p.water_c),
                chiller_stages: Some(u32::from(p.chiller_stages)),
            },
            // No offer yet: the water as cold as the CDUs go, every stage.
            None => loopwarden_twin::sim::FacilityOrder {
                water_c: f64::from(self.inner.coldest_c()),
                chiller_stages: None,
            },
        }
    }
}
