//! The control core in charge of the twin, in simulated time: what
//! `cooling-ctrl simulate --controller ours` runs. The scenario runner's
//! readings become what a Modbus client would have read of the twin's CDU
//! ([`CduMeasurements`], the CDU's own leak register and valve positions
//! among them) and what the board's lines gave; from there the decision
//! path is production's ([`crate::decide`]): the same inputs, the same
//! core, the same latched record in flash before anything acts, the same
//! ordered writes held to the simulated CDU's register map. Built with
//! the `twin` feature only.
//!
//! The controller's flash is simulated (the controller's geometry,
//! through the same [`save_latched`]); a `controller_restart` opens it
//! anew and builds the decision path from what it holds ([`load_latched`],
//! which may find it damaged: a `latch_corrupt`), not from a copy in
//! memory. After a record it cannot believe, the records written anew go
//! above the generation the flash held beside it ([`relatch_floor`]), as
//! the shell's do. What the core learned of the hall is kept in the same flash
//! every [`LEARNED_EVERY`] of simulated time ([`save_learned`]), as the
//! shell keeps it every ten minutes of running, and restored after a
//! restart ([`load_learned`]): a restart loses what was learned since the
//! last keep, not all of it.
//!
//! The twin's CDU takes a step's writes together or not at all (Modbus
//! out, or writes refused): the next step's `writes_ok` says which, and is
//! what the decision path hears of the last plan.
//!
//! Glossary:
//! - *scenario runner*: `loopwarden_twin::sim`, which plays a scenario on
//!   the plant with a controller in charge.

use std::vec::Vec;

use futures::executor::block_on;
use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_boards::site::SiteConfig;
use loopwarden_boards::FlashBoard;
use loopwarden_flash::sim::SimFlash;
use loopwarden_flash::ConfigStore;
use loopwarden_protocol::message::CduMode;
use loopwarden_store::agent_flash::AgentFlash;
use loopwarden_twin::sim::{Controller, Decision, Readings};

use cooling_core::facility::Offer;
use cooling_core::{Commands, ConfigError, Core, CoreConfig, HostReport, MAX_HOSTS};
use loopwarden_protocol::units::TimestampMs;

use crate::decide::hosts::OfGpu;
use crate::decide::leases::{LeaseBook, LEASE_DEFAULT};
use crate::decide::outdoor::OutdoorSources;
use crate::decide::{
    BoardRead, Decider, Heard, MapLimits, Outcome, Plan, Setting, StepIn, Verdict,
};
use crate::journal::{
    damage_record, load_latched, load_learned, relatch_floor, save_latched, save_learned,
    LatchRecord, LEARNED_EVERY,
};
use crate::modbus::{map_limits, CduMeasurements};
use crate::shell::start::start_decider;
use crate::site_figures::core_config;

/// The core, through the decision path, as a scenario runner's controller.
pub struct Ours {
    decider: Decider,
    cfg: CoreConfig,
    limits: MapLimits,
    /// The hosts' caps as leased (what each host holds).
    leases: LeaseBook,
    hosts: usize,
    racks: usize,
    /// The controller's flash, simulated.
    store: Option<ConfigStore<AgentFlash>>,
    /// The latched record last written to it.
    kept: Option<LatchRecord>,
    /// The last step's writes, for the next step to hear what became of
    /// them.
    plan: Option<Plan>,
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
    /// The core configured for `site`, on the simulated CDU's register
    /// map.
    pub fn new(site: &SiteConfig) -> Result<Self, ConfigError> {
        let cfg = core_config(site)?;
        let limits = map_limits(&RegisterMap::sim_cdu());
        let decider = Decider::new(cfg, limits, &Ok::<_, &str>(None))?;
        let hosts = cfg.layout.hosts().min(MAX_HOSTS);
        Ok(Self {
            decider,
            cfg,
            limits,
            leases: LeaseBook::new(hosts, LEASE_DEFAULT, cfg.gpu.tdp_w),
            hosts,
            racks: site.racks,
            store: Some(open_store(None)),
            kept: None,
            plan: None,
            learned_at_ms: 0,
            epoch_ms: 0,
            restarting: false,
            offer: None,
        })
    }

    /// The core (for tests that look inside).
    pub fn core(&self) -> &Core {
        self.decider.core()
    }

    /// Writes the latched record to flash when it changed; the decision
    /// path hears whether it went in.
    fn keep_latched(&mut self) {
        let Some(r) = self.decider.to_keep() else {
            return;
        };
        let ok = match self.store.as_mut() {
            Some(store) => block_on(save_latched(store, &r)).is_ok(),
            None => false,
        };
        if ok {
            self.kept = Some(r);
        }
        self.decider.kept(ok);
    }

    /// Writes what the core learned to flash every [`LEARNED_EVERY`] of
    /// the scenario's time (`t_ms`).
    fn keep_learned(&mut self, t_ms: u64) {
        if t_ms.saturating_sub(self.learned_at_ms) < LEARNED_EVERY.as_millis() as u64 {
            return;
        }
        self.learned_at_ms = t_ms;
        if let Some(store) = self.store.as_mut() {
            if let Err(e) = block_on(save_learned(store, &self.decider.core().learned())) {
                panic!("the simulated flash refused the learned figures: {e}");
            }
        }
    }

    /// The process starts again at `now_ms`: the flash is opened anew and
    /// the decision path built from what it holds (the latched record,
    /// which may be unreadable, then what was learned); the host reports
    /// and the leases sent are gone.
    fn start_again(&mut self, now_ms: u64) {
        let flash = self.store.take().map(ConfigStore::into_flash);
        let mut store = open_store(flash);
        let latched = block_on(load_latched(&mut store));
        self.kept = latched.as_ref().ok().copied().flatten();
        // Built as the shell builds it: beside a record it cannot believe,
        // the records written anew go above the generation the flash held.
        let floor = block_on(relatch_floor(&mut store, &latched));
        self.decider = start_decider(self.cfg, self.limits, &latched, floor)
            .unwrap_or_else(|e| panic!("a configuration accepted before is refused: {e}"));
        let learned = block_on(load_learned(&mut store, &self.cfg));
        if let Some(why) = learned.refused.first() {
            panic!("the simulated flash lost the learned figures: {why}");
        }
        if let Some(l) = learned.learned {
            // Refused (out of their bounds): the configured figures, as
            // the shell starts then.
            if let Err(e) = self.decider.core_mut().restore_learned(&l) {
                tracing::warn!("ours: the learned figures kept in flash are not restored: {e}");
            }
        }
        self.store = Some(store);
        self.plan = None;
        self.leases = LeaseBook::new(self.hosts, LEASE_DEFAULT, self.cfg.gpu.tdp_w);
        self.epoch_ms = now_ms;
        self.learned_at_ms = now_ms;
    }

    /// The host reports of `r`, each keeping its arrival time (during a
    /// bus outage the core sees them age), judged as the shell judges
    /// what it hears (the twin's hosts report on time: stamped now).
    fn hear_hosts(&mut self, r: &Readings, now_ms: u64) {
        let of_gpu = |x: Option<(usize, f64)>| {
            x.map(|(gpu, value)| OfGpu {
                gpu: gpu.min(255) as u8,
                value: value as f32,
            })
        };
        for h in &r.hosts {
            let heard = Heard {
                report: HostReport {
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
                },
                stamped: TimestampMs(now_ms),
                coldest: of_gpu(h.coldest),
                most_drawn: of_gpu(h.most_drawn),
                left_out: None,
                colder_than_supply: false,
            };
            let verdict = self.decider.hear_host(h.host, &heard, TimestampMs(now_ms));
            if let Verdict::Refused { why, new: true } = verdict {
                tracing::warn!("ours: a report of host {} is not believed: {why}", h.host);
            }
        }
    }

    /// The hosts' caps as the leases due at `now_ms` put them in force
    /// (the twin's bus takes every lease).
    fn lease(&mut self, c: &Commands, now_ms: u64) -> Vec<Option<f64>> {
        let caps = &c.caps[..self.hosts.min(c.caps.len())];
        let due: Vec<_> = self.leases.due(now_ms, caps).collect();
        for o in due {
            self.leases.sent(&o, now_ms);
        }
        (0..self.hosts)
            .map(|h| self.leases.in_force(h).map(f64::from))
            .collect()
    }
}

/// What a Modbus client would have read of the twin's CDU (`None`: it
/// did not answer).
fn measurements(r: &Readings) -> Option<CduMeasurements> {
    r.modbus_ok.then(|| CduMeasurements {
        supply_c: r.supply_c,
        return_c: r.return_c,
        flow_lpm: r.flow_lpm,
        facility_supply_c: r.facility_supply_c,
        pumps_running: r.pumps_running.map(Some),
        leaks: r.cdu_leaks.as_deref().map(mask),
        diff_pressure_kpa: r.diff_pressure_kpa,
        valves_closed: r.valves_closed.as_deref().map(mask),
        pump_faults: r.pump_faults.map(Some),
        it_w: Some(r.it_w),
        cooling_w: None,
        facility_w: Some(r.facility_w),
        outdoor_c: r.ambient_c,
    })
}

/// What the board's lines gave.
fn board(r: &Readings) -> BoardRead {
    match r.board_ok {
        true => BoardRead::Read {
            wet: mask(&r.leaks),
            faults: mask(&r.rope_faults),
        },
        false => BoardRead::Failed,
    }
}

impl Controller for Ours {
    fn name(&self) -> &str {
        "ours"
    }

    fn restart(&mut self) {
        self.restarting = true;
    }

    fn damage_latch(&mut self) {
        let (Some(store), Some(r)) = (self.store.take(), self.kept) else {
            return;
        };
        let mut flash = store.into_flash();
        let damaged = match &mut flash {
            AgentFlash::Memory(f) => damage_record(f.bytes_mut(), &r),
            AgentFlash::File(_) => false,
        };
        if !damaged {
            tracing::warn!("ours: latch_corrupt: the newest latched record is not in the flash");
        }
        self.store = Some(open_store(Some(flash)));
    }

    fn facility_offer(&self) -> Option<&dyn std::any::Any> {
        self.offer.as_ref().map(|o| o as &dyn std::any::Any)
    }

    fn hear_facility_target(&mut self, water_c: f64, t_s: f64) {
        let t_ms = (t_s * 1000.0).round() as u64;
        self.decider
            .core_mut()
            .facility_target(water_c as f32, t_ms.saturating_sub(self.epoch_ms));
    }

    fn step(&mut self, r: &Readings) -> Decision {
        let t_ms = (r.t_s * 1000.0).round() as u64;
        if std::mem::take(&mut self.restarting) {
            self.start_again(t_ms);
        }
        if let Some(p) = self.plan.take() {
            self.decider.written(&Outcome::whole(&p, r.writes_ok));
        }
        // The process's monotonic clock starts at its start.
        let now_ms = t_ms - self.epoch_ms;
        self.hear_hosts(r, now_ms);
        let cdu = measurements(r);
        let c = self.decider.step(
            cdu.as_ref(),
            &StepIn {
                now_ms,
                board: board(r),
                // As the shell picks it, with no BMS to write one.
                ambient_c: OutdoorSources::new()
                    .pick(cdu.as_ref().and_then(|m| m.outdoor_c), now_ms)
                    .map(|(c, _)| c),
            },
        );
        self.offer = self.decider.core().offer();
        // In flash before it acts.
        self.keep_latched();
        self.keep_learned(t_ms);
        let plan = self
            .decider
            .plan(&c, cdu.as_ref().and_then(|m| m.valves_closed));
        self.decider.take_events();
        let valves = plan.value(Setting::Valves).map(|v| v as u16);
        let d = Decision {
            setpoint_c: plan.value(Setting::Setpoint).unwrap_or(c.setpoint_c as f64),
            pump_speed: plan
                .value(Setting::PumpSpeed)
                .map_or(c.pump_speed as f64, |p| p / 100.0),
            pump_on: c.pump_on,
            valves: per_rack(valves.unwrap_or(0), self.racks),
            hold_valves: valves.is_none(),
            host_caps: self.lease(&c, now_ms),
            rack_cooling_lost: per_rack(c.cooling_lost, self.racks),
            failsafe: c.mode == CduMode::Failsafe,
            heartbeat: plan.value(Setting::Heartbeat).is_some(),
            leak_sensing_lost: per_rack(c.sensing_lost, self.racks),
            valve_feedback_alarms: per_rack(c.valve_feedback_faults, self.racks),
        };
        self.plan = Some(plan);
        d
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
            inner: {
                let core = core_config(site)?;
                let cdus = usize::from(core.facility.cdus);
                crate::facility::Coordinator::new(&core, cdus, None)
            },
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
                if let Err(e) = self.inner.hear(cdu, *o, now_ms, 0) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_twin::scenario::Scenario;
    use loopwarden_twin::sim;

    /// Ours, noting the generation of the last latched record it kept
    /// before its restart and of the first it keeps after.
    struct Watched {
        ours: Ours,
        restarted: bool,
        before: Option<u32>,
        after: Option<LatchRecord>,
    }

    impl Controller for Watched {
        fn name(&self) -> &str {
            "ours"
        }
        fn restart(&mut self) {
            self.restarted = true;
            self.ours.restart();
        }
        fn damage_latch(&mut self) {
            self.ours.damage_latch();
        }
        fn step(&mut self, r: &Readings) -> Decision {
            let d = self.ours.step(r);
            match self.restarted {
                false => self.before = self.ours.kept.map(|k| k.generation),
                true => self.after = self.after.or(self.ours.kept),
            }
            d
        }
    }

    /// Rack 1 leaks and is latched, then the controller restarts with that
    /// record damaged: the relatch's record goes above the generation the
    /// flash's generation item held, as the shell's does
    /// (`journal::relatch_floor`), and reads back from the flash as kept.
    #[test]
    fn a_restart_after_a_damaged_latch_writes_above_the_old_generation() {
        let sc = Scenario::from_toml(
            "format = \"plant-scenario/1\"\ndescription = \"damaged latch\"\n\
             duration_s = 400\nseed = 3\n[ambient]\npoints = [[0, 21.0]]\n\
             [load]\nall = [[0, 0.6]]\n\
             [[fault]]\nat_s = 60\nuntil_s = 120\nkind = \"leak\"\ntarget = \"1\"\n\
             [[fault]]\nat_s = 200\nkind = \"latch_corrupt\"\n\
             [[fault]]\nat_s = 200\nkind = \"controller_restart\"\nvalue = 5.0\n",
            "damaged_latch.toml",
        )
        .unwrap();
        let mut w = Watched {
            ours: Ours::new(&sc.site).unwrap(),
            restarted: false,
            before: None,
            after: None,
        };
        sim::run("damaged_latch", &sc, &mut w, None, 60).unwrap();
        let before = w.before.expect("a record kept before the restart");
        let after = w.after.expect("the relatch's record kept after it");
        assert!(
            after.generation > before,
            "the relatch's record is generation {}, not above the {before} the flash held",
            after.generation
        );
        assert_eq!(after.latched.leaks & 0b10, 0b10, "rack 1 relatched");
        let mut store = w.ours.store.take().expect("the flash");
        let read = block_on(load_latched(&mut store)).expect("the record reads back");
        assert_eq!(
            read.map(|r| r.generation),
            w.ours.kept.map(|r| r.generation)
        );
    }
}
