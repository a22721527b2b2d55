//! The optimiser: which supply setpoint and pump speed cost the least
//! facility power per unit of GPU work, at steady state, with every GPU at
//! or below the plan ceiling even if its demand rose to full.
//!
//! The search walks a grid (setpoints in 0.5 K steps over what the CDU
//! accepts, pump speeds in 5 % steps from the lowest), one pump speed per
//! step, so a step's work is bounded (a Cortex-M can run it between two
//! Modbus polls); a whole search takes about 15 steps and starts again
//! every `optimise_every_ms`. Each candidate is judged with [`model`] on
//! the plant as the estimator believes it ([`super::estimate`]): the
//! GPUs' junctions and power from the hosts' reports (dynamic power and
//! each host's learned thermal factor), the hosts' other power, and the
//! heat rejection's fans and chiller at the measured outdoor temperature.
//!
//! A candidate must hold every GPU at the ceiling at full demand: by its
//! water, or by caps on the hosts the water alone leaves above it. A plan
//! with such caps must cost [`CAP_PLAN_MARGIN`] less per unit of work than
//! one without, or the whole CDU is cooled for those hosts. Where the
//! plant cannot hold a candidate's setpoint (the chiller at capacity, or
//! believed out because the supply could not be held), the candidate is
//! judged at the supply where the plant does reject the heat
//! ([`settled_supply`]), every host capped to the ceiling there, the heat
//! and the supply solved together; the least cost per unit of work then
//! picks the pump speed (faster pumps, colder plates, fewer caps), and of
//! setpoints alike the warmest.
//!
//! Glossary:
//! - *work*: GPU work rate summed over the hall (one GPU at full demand,
//!   unthrottled, is 1).
//! - *proposal*: the last finished search's choice.
//! - *rejection short*: the supply has stayed 1.5 K above its setpoint for
//!   two minutes without coming down; the search plans without the chiller
//!   until the supply sensor has tracked for ten minutes, a lone spike
//!   above not restarting them ([`RejectionWatch`]).
//! - *host plan*: what a host is planned with: its fresh report, else the
//!   hall's average from the IT meter (`host_plans`).

use super::config::CoreConfig;
use super::facility::{self, Offer, OfferPoint};
use super::model::{self, gpu_steady};
use super::view::{Seen, Tick};
use super::{bit, HostMask, MAX_HOSTS};

/// What the optimiser plans one host with.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HostPlan {
    /// GPUs running (0: the host is left out).
    pub gpus: f32,
    /// Dynamic power per GPU now, W.
    pub dynamic_w: f32,
    /// Its hottest GPU's resistance over the model's (learned; 1: as
    /// configured).
    pub factor: f32,
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
    /// Every constraint held without a cap (false: caps are planned, or
    /// the least bad was taken).
    pub feasible: bool,
    /// The supply the plan expects, °C (above the setpoint where the
    /// plant cannot hold it).
    pub supply_c: f32,
    /// Hosts the plan expects capped to hold the ceiling.
    pub capped_hosts: u8,
    /// Which, bit n = host n (by host index).
    pub capped_mask: HostMask,
    /// The cost per work of the best plan of the other kind (with caps
    /// when this one has none, without when it has), for saying why
    /// this one was chosen; `None`: no plan of that kind held the
    /// ceiling.
    pub other_cost: Option<f32>,
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
    /// It plans caps on hosts the water alone would leave above the
    /// ceiling (not for a shortfall of the plant).
    pub capping: bool,
}

/// What a plan that caps hosts for the water's sake must save against
/// one that does not, as a fraction of its cost: the caps' cost in work
/// is a model's, the water's cost a meter's.
pub const CAP_PLAN_MARGIN: f32 = 0.03;

impl Score {
    /// Ranks two candidates; `capping_now`: the plan in force caps hosts
    /// for the water's sake (switching between a plan with such caps and
    /// one without takes [`CAP_PLAN_MARGIN`] either way, so that the
    /// plan does not flap between them).
    pub fn better_than(&self, o: &Score, capping_now: bool) -> bool {
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
        if self.capping != o.capping {
            let (capping, other) = if self.capping { (self, o) } else { (o, self) };
            let capping_wins = if capping_now {
                capping.cost * (1.0 - CAP_PLAN_MARGIN) <= other.cost
            } else {
                capping.cost < other.cost * (1.0 - CAP_PLAN_MARGIN)
            };
            return capping_wins == self.capping;
        }
        // The same cost: the warmer water (below a supply the plant
        // cannot hold, every setpoint is the same plan).
        let same = (self.cost - o.cost).abs() <= 1e-6 * o.cost.abs();
        if same {
            self.setpoint_c > o.setpoint_c
        } else {
            self.cost < o.cost
        }
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
    /// The search's best costs per work without caps and with, among
    /// plans that hold the ceiling.
    best_cost: [Option<f32>; 2],
    /// The facility water the hall's coordinator set, °C (a hall of
    /// several CDUs): the supply cannot go below it and the approach.
    water_c: Option<f32>,
    /// What the last search offers the facility coordinator (a hall of
    /// several CDUs).
    offer: Option<Offer>,
}

/// Rows of the grid: pump speeds from `min_speed` to 1 in 5 % steps.
fn speeds(cfg: &CoreConfig) -> usize {
    ((1.0 - cfg.cdu.min_speed) / 0.05 + 1e-3) as usize + 1
}

impl Optimiser {
    /// Proposes the boot setpoint at full speed until a search finishes.
    pub const fn new(cfg: &CoreConfig) -> Self {
        Self {
            proposal: Proposal {
                setpoint_c: cfg.margins.boot_setpoint_c,
                speed: 1.0,
                facility_w: 0.0,
                work: 0.0,
                feasible: false,
                supply_c: cfg.margins.boot_setpoint_c,
                capped_hosts: 0,
                capped_mask: 0,
                other_cost: None,
            },
            row: None,
            started_ms: None,
            best: None,
            best_cost: [None; 2],
            water_c: None,
            offer: None,
        }
    }

    /// What the last finished search offers the facility coordinator;
    /// `None` in a hall of one CDU or before a search has finished.
    pub fn offer(&self) -> Option<Offer> {
        self.offer
    }

    /// The facility water the searches from the next on plan with, °C
    /// (`None`: this CDU's own setpoint sets it).
    pub fn share_water(&mut self, water_c: Option<f32>) {
        self.water_c = water_c;
    }

    /// The last finished search's choice.
    pub fn proposal(&self) -> Proposal {
        self.proposal
    }

    /// Judges one candidate. Where the plant cannot hold the setpoint
    /// (the chiller at capacity, or believed out: `no_chiller`), the
    /// supply settles where the dry cooler and the chiller reject the
    /// heat, and the hosts whose GPUs would pass the plan ceiling there
    /// at full demand are planned capped to it: the candidate's work is
    /// what the caps leave, so that a faster pump that needs fewer caps
    /// wins when its work is worth its power.
    pub fn judge(
        cfg: &CoreConfig,
        plans: &[HostPlan],
        open_gpus: usize,
        ambient_c: f32,
        no_chiller: bool,
        setpoint_c: f32,
        speed: f32,
    ) -> (Score, Proposal) {
        Self::judge_on(
            cfg, plans, open_gpus, ambient_c, no_chiller, None, setpoint_c, speed,
        )
    }

    /// [`Optimiser::judge`] with the facility water set by the hall
    /// (`water_c`): the heat rejection's cost is the plant's at that
    /// water whatever the setpoint (the hall's coordinator weighs it),
    /// so a setpoint pays for its pumps and its GPUs' leakage only.
    #[allow(clippy::too_many_arguments)]
    pub fn judge_on(
        cfg: &CoreConfig,
        plans: &[HostPlan],
        open_gpus: usize,
        ambient_c: f32,
        no_chiller: bool,
        water_c: Option<f32>,
        setpoint_c: f32,
        speed: f32,
    ) -> (Score, Proposal) {
        let g = &cfg.gpu;
        let rejecting = if no_chiller {
            // Believed out: the dry cooler alone.
            let mut c = *cfg;
            c.facility.chiller_max_w = 0.0;
            c
        } else {
            *cfg
        };
        let q = model::flow_per_gpu(cfg, speed, open_gpus);
        let r = g.r_jc_k_per_w + model::r_cold_plate(g, q);
        let mut supply = setpoint_c;
        let mut hall = hall_at(cfg, plans, r, supply, false);
        // Only where the water alone leaves a host above the ceiling is
        // there anything to cap.
        let capped = if hall.over_k > 0.0 {
            hall_at(cfg, plans, r, supply, true)
        } else {
            hall
        };
        let capping = capped.over_k < hall.over_k - 1e-3;
        if capping {
            // Caps on the hosts that run hot hold the ceiling where the
            // water does not (the rest of the hall is not cooled for
            // them); the cost per work decides against colder water.
            hall = capped;
        }
        let fw = water_c.unwrap_or(setpoint_c - cfg.cdu.approach_k);
        let short = model::rejection_at(&rejecting, fw, ambient_c, hall.it_w).short_w > 1.0;
        if short {
            for _ in 0..12 {
                let next = settled_supply(&rejecting, ambient_c, hall.it_w).max(setpoint_c);
                hall = hall_at(cfg, plans, r, next, true);
                let done = (next - supply).abs() < 1e-4;
                supply = next;
                if done {
                    break;
                }
            }
        }
        let fw = water_c.unwrap_or(supply - cfg.cdu.approach_k);
        let rej = model::rejection_at(&rejecting, fw, ambient_c, hall.it_w);
        let facility = model::facility_w(cfg, hall.it_w, speed, &rej);
        let cost = if hall.work > 1e-3 {
            facility / hall.work
        } else {
            facility
        };
        (
            Score {
                over_k: hall.over_k,
                short_w: rej.short_w,
                cost,
                setpoint_c,
                capping: capping && !short,
            },
            Proposal {
                setpoint_c,
                speed,
                facility_w: facility,
                work: hall.work,
                feasible: hall.over_k <= 0.0 && rej.short_w <= 1.0 && hall.capped == 0,
                supply_c: supply,
                capped_hosts: hall.capped,
                capped_mask: hall.mask,
                other_cost: None,
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
            self.best_cost = [None; 2];
        }
        let row = self.row.unwrap_or(0);
        let speed = (cfg.cdu.min_speed + 0.05 * row as f32).min(1.0);
        let hi = cfg.cdu.max_setpoint_c;
        // Below the facility water and the approach no setpoint holds.
        let floor = self.water_c.map_or(f32::MIN, |w| w + cfg.cdu.approach_k);
        let lo = cfg.cdu.min_setpoint_c.max(floor).min(hi);
        let steps = ((hi - lo) / 0.5 + 1e-3) as usize;
        for k in 0..=steps {
            let sp = (lo + 0.5 * k as f32).min(hi);
            let (score, prop) = Self::judge_on(
                cfg,
                plans,
                open_gpus,
                ambient_c,
                no_chiller,
                self.water_c,
                sp,
                speed,
            );
            if score.over_k <= 0.0 && score.short_w <= 1.0 {
                let kind = &mut self.best_cost[usize::from(prop.capped_hosts > 0)];
                *kind = Some(kind.map_or(score.cost, |c| c.min(score.cost)));
            }
            let capping_now = self.proposal.capped_hosts > 0
                && self.proposal.supply_c <= self.proposal.setpoint_c;
            if self
                .best
                .as_ref()
                .is_none_or(|(b, _)| score.better_than(b, capping_now))
            {
                self.best = Some((score, prop));
            }
        }
        if row + 1 >= speeds(cfg) {
            if cfg.facility.cdus > 1 {
                let water = self
                    .water_c
                    .unwrap_or(self.proposal.supply_c - cfg.cdu.approach_k);
                self.offer = Some(offer(cfg, plans, open_gpus, water));
            }
            if let Some((_, mut p)) = self.best.take() {
                p.other_cost = self.best_cost[usize::from(p.capped_hosts == 0)];
                self.proposal = p;
            }
            self.row = None;
        } else {
            self.row = Some(row + 1);
        }
    }
}

impl Optimiser {
    /// The optimisation layer's part of step `t`: one slice of the search
    /// on the plant as `believed`, planning each host from what the step
    /// has `seen` and its learned thermal `factor`, at the outdoor
    /// temperature `ambient_c`, without the chiller when it is believed
    /// out (`no_chiller`).
    pub(crate) fn slice(
        &mut self,
        t: &Tick<'_>,
        believed: &CoreConfig,
        seen: &Seen,
        factor: &dyn Fn(usize) -> f32,
        ambient_c: f32,
        no_chiller: bool,
    ) {
        let plans = host_plans(t, seen, factor);
        let hosts = believed.layout.hosts();
        self.step(
            believed,
            t.now,
            &plans[..hosts],
            t.open_gpus(),
            ambient_c,
            no_chiller,
        );
    }
}

/// The hall at steady state with its GPUs' coolant at `t_in`.
#[derive(Debug, Clone, Copy, Default)]
struct HallAt {
    it_w: f32,
    work: f32,
    over_k: f32,
    capped: u8,
    mask: HostMask,
}

/// The hall of `plans` at resistance `r` (times each host's factor) on
/// coolant at `t_in`: every host must hold the plan ceiling at full
/// demand, by a cap to it where `capping` (a cap below the GPUs' lowest
/// counts what it still leaves above), else by the water.
fn hall_at(cfg: &CoreConfig, plans: &[HostPlan], r: f32, t_in: f32, capping: bool) -> HallAt {
    let (g, h) = (&cfg.gpu, &cfg.host);
    let ceiling = cfg.margins.plan_ceiling_c;
    let full_dyn = (g.tdp_w - g.static_w).max(1.0);
    let mut at = HallAt::default();
    let mut gpu_w = 0.0;
    let mut host_w = 0.0;
    for (i, p) in plans.iter().enumerate().filter(|(_, p)| p.gpus > 0.0) {
        let r_h = r * p.factor.max(0.3);
        let full = gpu_steady(g, t_in, r_h, full_dyn, g.tdp_w);
        let mut limit = g.tdp_w;
        if full.t_j > ceiling && capping {
            limit = ((ceiling - t_in) / r_h).clamp(g.min_cap_w, g.tdp_w);
            at.capped = at.capped.saturating_add(1);
            at.mask |= HostMask::from(1u8).checked_shl(i as u32).unwrap_or(0);
            let floor = gpu_steady(g, t_in, r_h, full_dyn, limit);
            at.over_k += (floor.t_j - ceiling).max(0.0);
        } else {
            at.over_k += (full.t_j - ceiling).max(0.0);
        }
        let now = gpu_steady(g, t_in, r_h, p.dynamic_w, limit);
        gpu_w += p.gpus * now.power_w;
        at.work += p.gpus * now.work;
        let u = p.dynamic_w / full_dyn;
        host_w += h.idle_w + (h.full_w - h.idle_w) * u;
    }
    at.it_w = gpu_w + host_w;
    at
}

/// What the hall of `plans` offers the facility coordinator
/// ([`crate::facility`]), its pumps at full speed over `open_gpus`, its
/// heat and work figured at facility water `water_c`.
pub fn offer(cfg: &CoreConfig, plans: &[HostPlan], open_gpus: usize, water_c: f32) -> Offer {
    let approach = cfg.cdu.approach_k;
    let q = model::flow_per_gpu(cfg, 1.0, open_gpus);
    let r = cfg.gpu.r_jc_k_per_w + model::r_cold_plate(&cfg.gpu, q);
    let at = |w: f32, capping: bool| hall_at(cfg, plans, r, w + approach, capping);
    let (lo, hi) = (
        cfg.cdu.min_setpoint_c - approach,
        cfg.cdu.max_setpoint_c - approach,
    );
    // The ceiling's excess only grows with the water: the first water that
    // passes it ends the walk.
    let mut accept_c = lo;
    let mut w = lo;
    while w <= hi + 1e-3 && at(w, false).over_k <= 0.0 {
        accept_c = w;
        w += facility::WATER_STEP_K;
    }
    let now = at(water_c, false);
    let mut o = Offer {
        heat_w: now.it_w,
        work: now.work,
        at_water_c: water_c,
        heat_per_k_w: (at(water_c + 1.0, false).it_w - now.it_w).max(0.0),
        accept_c,
        ..Offer::default()
    };
    for (i, dk) in facility::OFFER_STEPS_K.iter().enumerate() {
        let w = accept_c + dk;
        let (plain, capped) = (at(w, false), at(w, true));
        if w > hi + 1e-3 || capped.over_k > 0.0 {
            break;
        }
        o.capped[i] = OfferPoint {
            water_c: w,
            work_lost: (plain.work - capped.work).max(0.0),
            power_saved_w: (plain.it_w - capped.it_w).max(0.0),
        };
        o.points = i as u8 + 1;
    }
    o
}

/// The supply at which the plant of `cfg` rejects `heat_w` with the dry
/// cooler's fans at full and the chiller at its capacity, outdoors at
/// `ambient_c`: `T_fw = T_amb + pinch − Q/(ṁ·c) + (Q − Q_ch)/UA`, plus the
/// approach.
pub fn settled_supply(cfg: &CoreConfig, ambient_c: f32, heat_w: f32) -> f32 {
    let f = &cfg.facility;
    let rise = heat_w / (f.water_kg_per_s * f.water_cp_j_per_kg_k).max(1.0);
    let rest = (heat_w - f.chiller_max_w).max(0.0);
    let t_fw = ambient_c + f.pinch_k - rise + rest / f.dry_cooler_ua_w_per_k.max(1.0);
    t_fw + cfg.cdu.approach_k
}

/// Whether the heat rejection is believed short: the supply stays well
/// above its setpoint and is not coming down to it.
#[derive(Debug, Clone)]
pub struct RejectionWatch {
    short_since: Option<u64>,
    supply_prev: Option<f32>,
    supply_rate: f32,
    tracking_since: Option<u64>,
    short: bool,
}

impl Default for RejectionWatch {
    fn default() -> Self {
        Self::new()
    }
}

impl RejectionWatch {
    /// Nothing watched yet.
    pub const fn new() -> Self {
        Self {
            short_since: None,
            supply_prev: None,
            supply_rate: 0.0,
            tracking_since: None,
            short: false,
        }
    }

    /// Heat rejection is believed short.
    pub fn short(&self) -> bool {
        self.short
    }

    /// Watches the `supply` sensor against the setpoint last commanded,
    /// `setpoint_c`, in step `t`.
    pub(crate) fn watch(&mut self, t: &Tick<'_>, supply: Option<f32>, setpoint_c: f32) {
        if let Some(s) = supply {
            self.watch_at(t.now, t.dt, s, setpoint_c);
        }
    }

    /// One reading `s` at `now` (ms), `dt` s after the last step. Short
    /// after [`SHORT_AFTER_MS`] well above the setpoint and not coming
    /// down; no longer once it tracked for [`TRACKED_AFTER_MS`]. The
    /// tracking restarts only when the supply stays well above for
    /// [`TRACK_BROKEN_AFTER_MS`]: one sample off (a spike on the line) is
    /// no evidence either way.
    fn watch_at(&mut self, now: u64, dt: f32, s: f32, setpoint_c: f32) {
        if let (Some(prev), true) = (self.supply_prev, dt > 0.0) {
            let rate = (s - prev) / dt;
            self.supply_rate += (rate - self.supply_rate) * (dt / 30.0).min(1.0);
        }
        self.supply_prev = Some(s);
        if s > setpoint_c + 1.5 && self.supply_rate > -0.005 {
            let above_ms = now.saturating_sub(*self.short_since.get_or_insert(now));
            if above_ms >= SHORT_AFTER_MS {
                self.short = true;
            }
            if above_ms >= TRACK_BROKEN_AFTER_MS {
                self.tracking_since = None;
            }
        } else if s < setpoint_c + 0.5 {
            self.short_since = None;
            let since = *self.tracking_since.get_or_insert(now);
            if now.saturating_sub(since) >= TRACKED_AFTER_MS {
                self.short = false;
            }
        }
    }
}

/// How long the supply stays well above its setpoint before rejection is
/// believed short, ms.
const SHORT_AFTER_MS: u64 = 120_000;
/// How long the supply tracks its setpoint before rejection is no longer
/// believed short, ms.
const TRACKED_AFTER_MS: u64 = 600_000;
/// How long the supply stays well above its setpoint before the tracking
/// starts again, ms.
const TRACK_BROKEN_AFTER_MS: u64 = 30_000;

/// What the optimiser plans each host with in step `t`: its fresh report,
/// else the hall's average from the IT meter `seen.it_w`. Hosts of racks
/// with a latched leak are left out; `factor` gives each host's learned
/// thermal factor.
pub(crate) fn host_plans(
    t: &Tick<'_>,
    seen: &Seen,
    factor: &dyn Fn(usize) -> f32,
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
            factor: factor(h),
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
                factor: 1.0,
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

    #[test]
    fn the_settled_supply_rejects_the_heat_with_the_fans_full_and_the_chiller_at_capacity() {
        let cfg = CoreConfig::default();
        let mut out = cfg;
        out.facility.chiller_max_w = 0.0;
        let s = settled_supply(&out, 45.0, 110_000.0);
        // At that supply the dry cooler alone takes the heat, no more.
        let rej = model::rejection(&out, s, 45.0, 110_000.0);
        assert!(rej.short_w.abs() < 1.0, "{s} {rej:?}");
        let colder = model::rejection(&out, s - 0.5, 45.0, 110_000.0);
        assert!(colder.short_w > 1_000.0, "{colder:?}");
    }

    #[test]
    fn short_of_rejection_the_faster_pump_keeps_more_work_and_wins() {
        let cfg = CoreConfig::default();
        let plans = hall(&cfg, 1.0);
        let p = search(&cfg, &plans, 45.0, true);
        // Every host is planned capped at a supply above the setpoint.
        assert!(
            p.supply_c > p.setpoint_c + 1.0 && p.capped_hosts == 16,
            "{p:?}"
        );
        let slow = Optimiser::judge(
            &cfg,
            &plans,
            128,
            45.0,
            true,
            p.setpoint_c,
            cfg.cdu.min_speed,
        )
        .1;
        assert!(
            p.speed > 0.8 && p.work > slow.work,
            "{p:?} against {slow:?}"
        );
    }

    #[test]
    fn rejection_is_short_after_two_minutes_above_and_spikes_do_not_keep_it_so() {
        let mut w = RejectionWatch::new();
        let sp = 40.0;
        // Two minutes well above, not coming down: short.
        for s in 0..=120u64 {
            w.watch_at(s * 1000, 1.0, sp + 3.0, sp);
        }
        assert!(w.short());
        // Back on the setpoint, with a 20 K spike every 45 s: the ten
        // minutes of tracking still end it.
        let t0 = 121u64;
        for s in t0..t0 + 601 {
            let spike = if (s - t0) % 45 == 44 { 20.0 } else { 0.0 };
            w.watch_at(s * 1000, 1.0, sp + spike, sp);
        }
        assert!(!w.short(), "one sample off is no evidence");
        // Short again, then half a minute well above while tracking: the
        // ten minutes start again.
        let mut w = RejectionWatch::new();
        for s in 0..=120u64 {
            w.watch_at(s * 1000, 1.0, sp + 3.0, sp);
        }
        for s in 121..421u64 {
            w.watch_at(s * 1000, 1.0, sp, sp);
        }
        for s in 421..452u64 {
            w.watch_at(s * 1000, 1.0, sp + 3.0, sp);
        }
        for s in 452..1100u64 {
            w.watch_at(s * 1000, 1.0, sp, sp);
            assert_eq!(w.short(), s < 452 + 600, "at {s} s");
        }
    }
}
