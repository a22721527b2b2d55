//! The optimiser: which supply setpoint and pump speed cost the least
//! facility power per unit of GPU work, at steady state, with every GPU at
//! or below the plan ceiling even if its demand rose to full.
//!
//! The search walks a grid (setpoints in 0.5 K steps over what the CDU
//! accepts, pump speeds in 5 % steps from the lowest), one pump speed per
//! step, so a step's work is bounded (a Cortex-M can run it between two
//! Modbus polls); a whole search takes about 15 steps and starts again
//! every `optimise_every_ms`. Each candidate is judged with [`model`]:
//! the GPUs' junctions and power from the hosts' reports (dynamic power
//! and learned offset per host), the hosts' other power, and the heat
//! rejection's fans and chiller at the outdoor temperature.
//!
//! A candidate that would leave a GPU above the ceiling at full demand is
//! out. One whose heat the plant cannot reject (the chiller at capacity, or
//! believed out because the supply could not be held) is out too, unless
//! no candidate can: then the warmest water the ceiling allows wins (it
//! rejects the most once the loop has warmed) and the coordination layer
//! caps what the water cannot carry.
//!
//! Glossary:
//! - *work*: GPU work rate summed over the hall (one GPU at full demand,
//!   unthrottled, is 1).
//! - *proposal*: the last finished search's choice.
//! - *rejection short*: the supply has stayed 1.5 K above its setpoint for
//!   two minutes without coming down; the search plans without the chiller
//!   until the supply has tracked for ten minutes ([`RejectionWatch`]).
//! - *host plan*: what a host is planned with: its fresh report, else the
//!   hall's average from the IT meter (`host_plans`).

use super::config::CoreConfig;
use super::model::{self, gpu_steady};
use super::view::{Seen, Tick};
use super::{bit, MAX_HOSTS};

/// What the optimiser plans one host with.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HostPlan {
    /// GPUs running (0: the host is left out).
    pub gpus: f32,
    /// Dynamic power per GPU now, W.
    pub dynamic_w: f32,
    /// Its hottest GPU runs this much above the model, K.
    pub offset_k: f32,
}

/// The optimiser's choice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Proposal {
    /// Supply setpoint, °C.
    pub setpoint_c: f32,
    /// Pump speed, fraction.
    pub speed: f32,
    /// Predicted facility power, W.
    pub facility_w: f32,
    /// Predicted work rate.
    pub work: f32,
    /// Every constraint held (false: the least bad was taken).
    pub feasible: bool,
}

/// A candidate's standing: lower is better, compared in order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Score {
    /// K above the ceiling, summed over hosts.
    pub over_k: f32,
    /// Heat left unrejected, W (any: the candidate is short).
    pub short_w: f32,
    /// Facility power per work (or facility power when there is no work).
    pub cost: f32,
    /// The candidate's setpoint, °C.
    pub setpoint_c: f32,
}

impl Score {
    /// Ranks two candidates.
    pub fn better_than(&self, o: &Score) -> bool {
        const EPS: f32 = 1e-3;
        if (self.over_k - o.over_k).abs() > EPS {
            return self.over_k < o.over_k;
        }
        let (short, o_short) = (self.short_w > 1.0, o.short_w > 1.0);
        if short != o_short {
            return !short;
        }
        if short && (self.setpoint_c - o.setpoint_c).abs() > EPS {
            // Both short: the warmest water rejects the most once the loop
            // has warmed, and asks nothing of a chiller that is out.
            return self.setpoint_c > o.setpoint_c;
        }
        self.cost < o.cost
    }
}

/// The incremental search.
#[derive(Debug, Clone)]
pub struct Optimiser {
    proposal: Proposal,
    /// Next pump-speed row to judge; `None`: idle until the next search.
    row: Option<usize>,
    started_ms: Option<u64>,
    best: Option<(Score, Proposal)>,
}

/// Rows of the grid: pump speeds from `min_speed` to 1 in 5 % steps.
fn speeds(cfg: &CoreConfig) -> usize {
    ((1.0 - cfg.cdu.min_speed) / 0.05 + 1e-3) as usize + 1
}

impl Optimiser {
    /// Proposes the boot setpoint at full speed until a search finishes.
    pub fn new(cfg: &CoreConfig) -> Self {
        Self {
            proposal: Proposal {
                setpoint_c: cfg.margins.boot_setpoint_c,
                speed: 1.0,
                facility_w: 0.0,
                work: 0.0,
                feasible: false,
            },
            row: None,
            started_ms: None,
            best: None,
        }
    }

    /// The last finished search's choice.
    pub fn proposal(&self) -> Proposal {
        self.proposal
    }

    /// Judges one candidate.
    pub fn judge(
        cfg: &CoreConfig,
        plans: &[HostPlan],
        open_gpus: usize,
        ambient_c: f32,
        no_chiller: bool,
        setpoint_c: f32,
        speed: f32,
    ) -> (Score, Proposal) {
        let g = &cfg.gpu;
        let h = &cfg.host;
        let q = model::flow_per_gpu(cfg, speed, open_gpus);
        let r = g.r_jc_k_per_w + model::r_cold_plate(g, q);
        let full_dyn = (g.tdp_w - g.static_w).max(1.0);
        let mut over_k = 0.0;
        let mut gpu_w = 0.0;
        let mut host_w = 0.0;
        let mut work = 0.0;
        for p in plans.iter().filter(|p| p.gpus > 0.0) {
            let t_in = setpoint_c + p.offset_k;
            // The ceiling must hold at full demand.
            let full = gpu_steady(g, t_in, r, full_dyn, g.tdp_w);
            over_k += (full.t_j - cfg.margins.plan_ceiling_c).max(0.0);
            let now = gpu_steady(g, setpoint_c, r, p.dynamic_w, g.tdp_w);
            gpu_w += p.gpus * now.power_w;
            work += p.gpus * now.work;
            let u = p.dynamic_w / full_dyn;
            host_w += h.idle_w + (h.full_w - h.idle_w) * u;
        }
        let it = gpu_w + host_w;
        let mut rej = model::rejection(cfg, setpoint_c, ambient_c, it);
        if no_chiller {
            // Believed out: everything the dry cooler cannot take is short.
            let dc = model::rejection(
                &CoreConfig {
                    facility: super::config::FacilityParams {
                        chiller_max_w: 0.0,
                        ..cfg.facility
                    },
                    ..*cfg
                },
                setpoint_c,
                ambient_c,
                it,
            );
            rej = dc;
        }
        let facility = model::facility_w(cfg, it, speed, &rej);
        let cost = if work > 1e-3 {
            facility / work
        } else {
            facility
        };
        (
            Score {
                over_k,
                short_w: rej.short_w,
                cost,
                setpoint_c,
            },
            Proposal {
                setpoint_c,
                speed,
                facility_w: facility,
                work,
                feasible: over_k <= 0.0 && rej.short_w <= 0.0,
            },
        )
    }

    /// One step of the search at `now_ms`: judges one row of the grid.
    pub fn step(
        &mut self,
        cfg: &CoreConfig,
        now_ms: u64,
        plans: &[HostPlan],
        open_gpus: usize,
        ambient_c: f32,
        no_chiller: bool,
    ) {
        let due = self
            .started_ms
            .is_none_or(|s| now_ms.saturating_sub(s) >= cfg.timing.optimise_every_ms);
        if self.row.is_none() {
            if !due {
                return;
            }
            self.row = Some(0);
            self.started_ms = Some(now_ms);
            self.best = None;
        }
        let row = self.row.unwrap_or(0);
        let speed = (cfg.cdu.min_speed + 0.05 * row as f32).min(1.0);
        let lo = cfg.cdu.min_setpoint_c;
        let hi = cfg.cdu.max_setpoint_c;
        let steps = ((hi - lo) / 0.5 + 1e-3) as usize;
        for k in 0..=steps {
            let sp = (lo + 0.5 * k as f32).min(hi);
            let (score, prop) =
                Self::judge(cfg, plans, open_gpus, ambient_c, no_chiller, sp, speed);
            if self.best.as_ref().is_none_or(|(b, _)| score.better_than(b)) {
                self.best = Some((score, prop));
            }
        }
        if row + 1 >= speeds(cfg) {
            if let Some((_, p)) = self.best.take() {
                self.proposal = p;
            }
            self.row = None;
        } else {
            self.row = Some(row + 1);
        }
    }
}

impl Optimiser {
    /// The optimisation layer's part of step `t`: one slice of the search,
    /// planning each host from what the step has `seen` and its learned
    /// `offsets`, without the chiller when it is believed out
    /// (`no_chiller`).
    pub(crate) fn slice(
        &mut self,
        t: &Tick<'_>,
        seen: &Seen,
        offsets: &[f32; MAX_HOSTS],
        no_chiller: bool,
    ) {
        let cfg = &t.cfg;
        let plans = host_plans(t, seen, offsets);
        let ambient = (t.inp.ambient_c)
            .filter(|a| (-60.0..=70.0).contains(a))
            .unwrap_or(cfg.margins.design_ambient_c);
        let hosts = cfg.layout.hosts();
        self.step(
            cfg,
            t.now,
            &plans[..hosts],
            t.open_gpus(),
            ambient,
            no_chiller,
        );
    }
}

/// Whether the heat rejection is believed short: the supply stays well
/// above its setpoint and is not coming down to it.
#[derive(Debug, Clone, Default)]
pub struct RejectionWatch {
    short_since: Option<u64>,
    supply_prev: Option<f32>,
    supply_rate: f32,
    tracking_since: Option<u64>,
    short: bool,
}

impl RejectionWatch {
    /// Heat rejection is believed short.
    pub fn short(&self) -> bool {
        self.short
    }

    /// Watches the trusted `supply` against the setpoint last commanded,
    /// `setpoint_c`, in step `t`.
    pub(crate) fn watch(&mut self, t: &Tick<'_>, supply: Option<f32>, setpoint_c: f32) {
        let (now, dt) = (t.now, t.dt);
        if let Some(s) = supply {
            if let (Some(prev), true) = (self.supply_prev, dt > 0.0) {
                let rate = (s - prev) / dt;
                self.supply_rate += (rate - self.supply_rate) * (dt / 30.0).min(1.0);
            }
            self.supply_prev = Some(s);
            let cmd = setpoint_c;
            if s > cmd + 1.5 && self.supply_rate > -0.005 {
                let since = *self.short_since.get_or_insert(now);
                if now.saturating_sub(since) >= 120_000 && !self.short {
                    self.short = true;
                }
                self.tracking_since = None;
            } else if s < cmd + 0.5 {
                self.short_since = None;
                let since = *self.tracking_since.get_or_insert(now);
                if now.saturating_sub(since) >= 600_000 {
                    self.short = false;
                }
            }
        }
    }
}

/// What the optimiser plans each host with in step `t`: its fresh report,
/// else the hall's average from the IT meter `seen.it_w`. Hosts of racks
/// with a latched leak are left out; `offsets` are the hosts' learned
/// offsets.
pub(crate) fn host_plans(
    t: &Tick<'_>,
    seen: &Seen,
    offsets: &[f32; MAX_HOSTS],
) -> [HostPlan; MAX_HOSTS] {
    let cfg = &t.cfg;
    let lay = cfg.layout;
    let g = &cfg.gpu;
    let gph = lay.gpus_per_host as f32;
    let full_dyn = (g.tdp_w - g.static_w).max(1.0);
    // Hall average demand from the IT meter: IT = GPUs·(P_s + u·D) +
    // hosts·(idle + u·(full − idle)).
    let t_est = seen.hottest.unwrap_or(60.0);
    let hall_u = seen.it_w.map_or(1.0, |it| {
        let n_g = lay.gpus() as f32;
        let n_h = lay.hosts() as f32;
        let ps = model::static_power(g, t_est);
        let num = it - n_g * ps - n_h * cfg.host.idle_w;
        let den = n_g * full_dyn + n_h * (cfg.host.full_w - cfg.host.idle_w);
        (num / den).clamp(0.0, 1.0)
    });
    let mut plans = [HostPlan::default(); MAX_HOSTS];
    for (h, plan) in plans.iter_mut().enumerate().take(lay.hosts()) {
        let open = bit(!t.cooling_lost, lay.rack_of(h));
        if !open {
            continue;
        }
        let (gpus, dynamic_w) = match t.fresh(h) {
            Some(r) => {
                let p = r.gpu_power_w / r.gpus as f32;
                let capped = r.limit_w < g.tdp_w - 1.0 && p >= r.limit_w - 5.0;
                let d = if capped {
                    // Its demand is hidden under the cap: plan for all.
                    full_dyn
                } else {
                    (p - model::static_power(g, r.hottest_c)).clamp(0.0, full_dyn)
                };
                (r.gpus as f32, d)
            }
            None => (gph, hall_u * full_dyn),
        };
        *plan = HostPlan {
            gpus,
            dynamic_w,
            offset_k: offsets[h],
        };
    }
    plans
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hall(cfg: &CoreConfig, u: f32) -> std::vec::Vec<HostPlan> {
        let d = u * (cfg.gpu.tdp_w - cfg.gpu.static_w);
        (0..cfg.layout.hosts())
            .map(|_| HostPlan {
                gpus: cfg.layout.gpus_per_host as f32,
                dynamic_w: d,
                offset_k: 0.0,
            })
            .collect()
    }

    fn search(cfg: &CoreConfig, plans: &[HostPlan], ambient: f32, no_chiller: bool) -> Proposal {
        let mut o = Optimiser::new(cfg);
        for s in 0..speeds(cfg) {
            o.step(
                cfg,
                s as u64 * 1000,
                plans,
                cfg.layout.gpus(),
                ambient,
                no_chiller,
            );
        }
        o.proposal()
    }

    #[test]
    fn the_search_finds_the_grid_minimum() {
        let cfg = CoreConfig::default();
        let plans = hall(&cfg, 0.9);
        let p = search(&cfg, &plans, 25.0, false);
        assert!(p.feasible, "{p:?}");
        // Brute force over the same grid.
        let mut best = f32::MAX;
        for row in 0..speeds(&cfg) {
            let speed = (cfg.cdu.min_speed + 0.05 * row as f32).min(1.0);
            for k in 0..=56 {
                let sp = 17.0 + 0.5 * k as f32;
                let (s, _) = Optimiser::judge(&cfg, &plans, 128, 25.0, false, sp, speed);
                if s.over_k == 0.0 && s.short_w == 0.0 {
                    best = best.min(s.cost);
                }
            }
        }
        let (s, _) = Optimiser::judge(&cfg, &plans, 128, 25.0, false, p.setpoint_c, p.speed);
        assert_eq!(s.cost, best);
    }

    #[test]
    fn a_warm_day_at_full_load_gets_warm_water_and_slow_pumps() {
        let cfg = CoreConfig::default();
        let p = search(&cfg, &hall(&cfg, 0.95), 30.0, false);
        assert!(p.setpoint_c >= 35.0, "{p:?}");
        assert!(p.speed < 1.0, "{p:?}");
        // The ceiling holds at full demand.
        let (s, _) = Optimiser::judge(
            &cfg,
            &hall(&cfg, 1.0),
            128,
            30.0,
            false,
            p.setpoint_c,
            p.speed,
        );
        assert_eq!(s.over_k, 0.0);
    }

    #[test]
    fn a_frosty_night_does_not_run_the_water_as_warm_as_it_can() {
        // Cooling is free: leakage decides, colder is better.
        let cfg = CoreConfig::default();
        let p = search(&cfg, &hall(&cfg, 0.5), -5.0, false);
        assert!(p.setpoint_c < 40.0, "{p:?}");
    }

    #[test]
    fn with_the_chiller_believed_out_the_least_short_candidate_wins() {
        let cfg = CoreConfig::default();
        let p = search(&cfg, &hall(&cfg, 1.0), 45.0, true);
        assert!(!p.feasible);
        // The warmest water the ceiling allows rejects the most heat.
        let (s, _) = Optimiser::judge(
            &cfg,
            &hall(&cfg, 1.0),
            128,
            45.0,
            true,
            p.setpoint_c,
            p.speed,
        );
        assert_eq!(s.over_k, 0.0);
        assert!(p.setpoint_c >= 40.0, "{p:?}");
    }
}
