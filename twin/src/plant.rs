//! The simulated hall: GPUs on cold plates, the CDU's secondary loop, the
//! facility water loop with its dry cooler and trim chiller, and the power
//! meters (`docs/plant-model.md` §2 to §5).
//!
//! Pure: the plant is stepped with a time step, what the actuators are
//! told and the outdoor conditions; it reads no clock. Every default of
//! the model is a field of [`SiteConfig`], so a site describes its own
//! hall in TOML. The controller never reads this state directly: it sees
//! sensors (the simulated CDU) that a scenario's faults may falsify.
//!
//! Glossary:
//! - *u*: a GPU's workload demand, 0 to 1.
//! - *w*: the work rate it delivers under its power limit; one GPU at
//!   w = 1 for an hour is one work-GPU-hour.
//! - *secondary loop*: coolant from the CDU to the racks' cold plates.
//! - *facility loop*: water from the CDU's heat exchanger to the dry
//!   cooler and the trim chiller.
//! - *approach*: how far the heat exchanger's cold side stays above the
//!   facility water.

pub use loopwarden_boards::site::{FacilityModel, GpuModel, HostModel, LoopModel, SiteConfig};

/// Pumps of the CDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PumpId {
    /// Pump A.
    A,
    /// Pump B.
    B,
}

/// What the CDU and the hosts are told to do this step.
#[derive(Debug, Clone, PartialEq)]
pub struct Actuation {
    /// Supply setpoint, °C (the CDU clamps it to its range).
    pub setpoint_c: f64,
    /// Pump speed command, fraction (clamped to `min_speed`..1).
    pub pump_speed: f64,
    /// Pumps commanded on.
    pub pump_on: [bool; 2],
    /// Per rack: valve open.
    pub valves: Vec<bool>,
    /// Per GPU: power cap in force, W (`None`: its TDP).
    pub caps: Vec<Option<f64>>,
    /// Per GPU: powered down by its host (P = 0, w = 0; not a shutdown).
    /// Missing entries (an empty list) mean powered.
    pub powered_down: Vec<bool>,
}

/// What the plant is subjected to this step.
#[derive(Debug, Clone, PartialEq)]
pub struct Conditions {
    /// Outdoor dry-bulb, °C.
    pub ambient_c: f64,
    /// Per GPU: workload demand, 0 to 1.
    pub demand: Vec<f64>,
    /// Pumps that move no water whatever they are told (tripped, or
    /// seized: the contactor feedback is the scenario runner's business).
    pub pump_tripped: [bool; 2],
    /// Per rack: its cold plates' resistance as a multiple of the model's
    /// (fouling); missing entries are 1.
    pub plate_factor: Vec<f64>,
    /// The chiller is tripped.
    pub chiller_tripped: bool,
    /// Share of the dry cooler's UA available.
    pub dry_cooler_fraction: f64,
}

/// One GPU's state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuState {
    /// Junction temperature, °C.
    pub t_j: f64,
    /// Inlet (after its rack's valve), °C.
    pub t_in: f64,
    /// Power, W.
    pub power: f64,
    /// Work rate, 0 to 1.
    pub work: f64,
    /// Workload demand of the last step, 0 to 1.
    pub demand: f64,
    /// Power limit in force in the last step (cap, slowdown), W.
    pub limit: f64,
    /// In HW slowdown.
    pub slowdown: bool,
    /// Shut down for good.
    pub shut_down: bool,
    /// Powered down by its host in the last step (P = 0, w = 0, its
    /// temperature relaxing to its coolant; not a shutdown).
    pub powered_down: bool,
}

/// Energy and safety accounts of a run.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Totals {
    /// Seconds simulated.
    pub seconds: f64,
    /// IT energy, J.
    pub it_j: f64,
    /// Facility energy, J.
    pub facility_j: f64,
    /// Work, GPU-seconds at w = 1.
    pub work_gpu_s: f64,
    /// Heat the IT put into the coolant, J.
    pub heat_in_j: f64,
    /// Heat rejected by the dry cooler and the chiller, J.
    pub heat_out_j: f64,
    /// Hottest junction seen, °C.
    pub max_gpu_c: f64,
    /// GPU-seconds above the max operating temperature.
    pub gpu_s_above_max_operating: f64,
    /// HW slowdown episodes started.
    pub slowdown_episodes: u32,
    /// GPUs shut down.
    pub shutdowns: u32,
    /// GPU-seconds powered down by their hosts.
    pub powered_down_gpu_s: f64,
}

/// The meters and loop readings of the last step.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Meters {
    /// IT power (GPUs and hosts), W.
    pub it_w: f64,
    /// Heat into the coolant, W (all IT heat goes into the liquid).
    pub heat_w: f64,
    /// Running pump, W.
    pub pump_w: f64,
    /// Dry cooler fans, W.
    pub fans_w: f64,
    /// Chiller, W.
    pub chiller_w: f64,
    /// Heat the dry cooler rejects, W.
    pub dry_cooler_heat_w: f64,
    /// Heat the chiller rejects, W.
    pub chiller_heat_w: f64,
    /// Facility total, W.
    pub facility_w: f64,
    /// Secondary flow, L/min.
    pub flow_lpm: f64,
    /// Loop differential pressure, kPa.
    pub diff_pressure_kpa: f64,
    /// Supply temperature, °C.
    pub supply_c: f64,
    /// Return temperature, °C.
    pub return_c: f64,
    /// Facility water supply, °C.
    pub facility_supply_c: f64,
}

/// The hall.
#[derive(Debug, Clone)]
pub struct Plant {
    site: SiteConfig,
    gpus: Vec<GpuState>,
    /// Supply temperature, °C.
    supply_c: f64,
    /// Facility water supply, °C.
    fw_c: f64,
    /// How far each pump has come up to speed, fraction.
    pump_ramp: [f64; 2],
    meters: Meters,
    totals: Totals,
    /// The secondary side of the step under way, waiting for the facility
    /// loop's rejection ([`Plant::step_secondary`], [`Plant::finish_step`]).
    pending: Option<Pending>,
}

/// A step's secondary side, before the facility loop has rejected its heat.
#[derive(Debug, Clone, Copy)]
struct Pending {
    pumps: Pumps,
    it: ItLoad,
}

impl Plant {
    /// A hall at rest: everything at `start_c` (water and GPUs alike).
    pub fn new(site: SiteConfig, start_c: f64) -> Self {
        let n = site.racks * site.hosts_per_rack * site.gpus_per_host;
        let gpu = GpuState {
            t_j: start_c,
            t_in: start_c,
            power: 0.0,
            work: 0.0,
            demand: 0.0,
            limit: site.gpu.tdp_w,
            slowdown: false,
            shut_down: false,
            powered_down: false,
        };
        Self {
            gpus: vec![gpu; n],
            supply_c: start_c,
            fw_c: start_c - site.secondary.approach_k,
            pump_ramp: [1.0, 0.0],
            meters: Meters::default(),
            totals: Totals::default(),
            pending: None,
            site,
        }
    }

    /// The site.
    pub fn site(&self) -> &SiteConfig {
        &self.site
    }

    /// Every GPU, rack by rack, host by host.
    pub fn gpus(&self) -> &[GpuState] {
        &self.gpus
    }

    /// The readings of the last step.
    pub fn meters(&self) -> Meters {
        self.meters
    }

    /// The run's accounts so far.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// GPUs per rack.
    pub fn gpus_per_rack(&self) -> usize {
        self.site.hosts_per_rack * self.site.gpus_per_host
    }

    /// Advances the hall by `dt` seconds (at most 1 s; longer steps are cut).
    pub fn step(&mut self, dt: f64, act: &Actuation, cond: &Conditions) {
        let mut left = dt;
        while left > 1e-9 {
            let h = left.min(1.0);
            self.step_once(h, act, cond);
            left -= h;
        }
    }

    fn step_once(&mut self, dt: f64, act: &Actuation, cond: &Conditions) {
        let heat_w = self.step_secondary(dt, act, cond);
        // One CDU's hall: its facility water follows its own setpoint.
        let lp = &self.site.secondary;
        let sp = act.setpoint_c.clamp(lp.min_setpoint_c(), lp.max_setpoint_c);
        let f = &self.site.facility;
        let rej = step_facility(
            f,
            &mut self.fw_c,
            sp - lp.approach_k,
            heat_w,
            dt,
            cond,
            f.chiller_max_w,
        );
        self.finish_step(dt, &rej);
    }

    /// The first half of a step of `dt` seconds (at most 1 s) in a hall
    /// whose facility loop is shared ([`FacilityLoop`]): pumps, coolant
    /// and GPUs on the facility water last set ([`Plant::set_facility_c`]).
    /// Returns the heat into the coolant, W, for the facility loop;
    /// [`Plant::finish_step`] ends the step with this CDU's share of what
    /// the loop rejected.
    pub fn step_secondary(&mut self, dt: f64, act: &Actuation, cond: &Conditions) -> f64 {
        let per_rack = self.gpus_per_rack();
        let s = &self.site;
        let lp = &s.secondary;
        let n = self.gpus.len();

        let pumps = step_pumps(lp, &mut self.pump_ramp, n, dt, act, cond);
        // Flow splits evenly over the open racks.
        let open: Vec<bool> = (0..s.racks)
            .map(|r| act.valves.get(r).copied().unwrap_or(true))
            .collect();
        let open_gpus = open.iter().filter(|&&o| o).count() * per_rack;
        let q_gpu = if open_gpus > 0 {
            pumps.flow_lpm / open_gpus as f64
        } else {
            0.0
        };

        // Supply follows the setpoint, never below facility water + approach.
        let sp = act.setpoint_c.clamp(lp.min_setpoint_c(), lp.max_setpoint_c);
        self.supply_c += (sp - self.supply_c) * (dt / lp.supply_tau_s).min(1.0);
        self.supply_c = self.supply_c.max(self.fw_c + lp.approach_k);

        let coolant = Coolant {
            open: &open,
            q_gpu,
            supply_c: self.supply_c,
            per_rack,
        };
        let it = step_gpus(s, &mut self.gpus, &mut self.totals, &coolant, dt, act, cond);
        self.pending = Some(Pending { pumps, it });
        it.heat_w
    }

    /// The second half of a step of `dt` seconds: the meters and the
    /// accounts with `rej`, this CDU's share of the facility loop's
    /// rejection. Without a [`Plant::step_secondary`] before, nothing.
    pub fn finish_step(&mut self, dt: f64, rej: &Rejection) {
        let Some(p) = self.pending.take() else {
            return;
        };
        self.meters = meters_of(&self.site, &p.pumps, &p.it, rej, self.supply_c, self.fw_c);
        add_step(&mut self.totals, &self.meters, dt);
    }

    /// The facility water this CDU's heat exchanger sees, °C (a hall of
    /// several CDUs: the shared loop's).
    pub fn set_facility_c(&mut self, fw_c: f64) {
        self.fw_c = fw_c;
    }

    /// A GPU falls off the bus (a scenario's fault, XID 79): it stops for
    /// the rest of the run; not counted as a thermal shutdown.
    pub fn fail_gpu(&mut self, i: usize) {
        if let Some(g) = self.gpus.get_mut(i) {
            g.shut_down = true;
        }
    }

    /// Heat stored in the GPUs' dies relative to `reference_c`, J.
    pub fn gpu_stored_j(&self, reference_c: f64) -> f64 {
        let c = self.site.gpu.heat_capacity_j_per_k;
        self.gpus.iter().map(|g| c * (g.t_j - reference_c)).sum()
    }

    /// Heat stored in the facility loop relative to `reference_c`, J.
    pub fn facility_stored_j(&self, reference_c: f64) -> f64 {
        self.site.facility.heat_capacity_j_per_k * (self.fw_c - reference_c)
    }
}

/// The pumps in one step.
#[derive(Debug, Clone, Copy)]
struct Pumps {
    /// Secondary flow, L/min.
    flow_lpm: f64,
    /// Running pumps, W.
    pump_w: f64,
    /// Loop differential pressure, kPa.
    dp_kpa: f64,
}

/// Pumps: a running pump at its speed; a pump starting comes up to speed
/// over `lag_start_s`; a tripped one stops at once.
fn step_pumps(
    lp: &LoopModel,
    pump_ramp: &mut [f64; 2],
    n: usize,
    dt: f64,
    act: &Actuation,
    cond: &Conditions,
) -> Pumps {
    let speed = act.pump_speed.clamp(lp.min_speed, 1.0);
    for (i, ramp) in pump_ramp.iter_mut().enumerate() {
        if act.pump_on[i] && !cond.pump_tripped[i] {
            *ramp = (*ramp + dt / lp.lag_start_s.max(1e-9)).min(1.0);
        } else {
            *ramp = 0.0;
        }
    }
    let effective = pump_ramp.iter().fold(0.0f64, |a, &r| a.max(r)) * speed;
    let flow_lpm = lp.design_lpm_per_gpu * n as f64 * effective;
    let pump_w: f64 = pump_ramp
        .iter()
        .map(|&r| {
            if r > 0.0 {
                lp.pump_max_w * (r * speed).powi(3)
            } else {
                0.0
            }
        })
        .sum();
    let dp_kpa = lp.design_dp_kpa * effective * effective;
    Pumps {
        flow_lpm,
        pump_w,
        dp_kpa,
    }
}

/// What the secondary loop brings the GPUs this step.
struct Coolant<'a> {
    /// Per rack: valve open.
    open: &'a [bool],
    /// Flow per GPU of an open rack, L/min.
    q_gpu: f64,
    /// Supply temperature, °C.
    supply_c: f64,
    /// GPUs per rack.
    per_rack: usize,
}

/// The IT side of one step.
#[derive(Debug, Clone, Copy)]
struct ItLoad {
    /// IT power (GPUs and hosts), W.
    it_w: f64,
    /// Heat into the coolant, W.
    heat_w: f64,
}

/// GPUs and hosts: each GPU's power, work and junction temperature, the
/// safety accounts, and the hosts' own power.
fn step_gpus(
    s: &SiteConfig,
    gpus: &mut [GpuState],
    totals: &mut Totals,
    c: &Coolant,
    dt: f64,
    act: &Actuation,
    cond: &Conditions,
) -> ItLoad {
    let lp = &s.secondary;
    let g = &s.gpu;
    let n = gpus.len();
    let mut gpu_power = 0.0;
    let mut gpu_to_coolant = 0.0;
    let mut host_load = vec![0.0; n / s.gpus_per_host.max(1)];
    for (i, gs) in gpus.iter_mut().enumerate() {
        let rack = i / c.per_rack;
        gs.powered_down = !gs.shut_down && act.powered_down.get(i).copied().unwrap_or(false);
        let u = if gs.powered_down {
            0.0
        } else {
            cond.demand.get(i).copied().unwrap_or(0.0).clamp(0.0, 1.0)
        };
        gs.demand = u;
        host_load[i / s.gpus_per_host] += u / s.gpus_per_host as f64;
        let (q, t_in) = if c.open[rack] {
            (c.q_gpu, c.supply_c)
        } else {
            let drift = lp.stagnant_drift_k_per_s * dt;
            let t = if gs.t_in < gs.t_j {
                (gs.t_in + drift).min(gs.t_j)
            } else {
                (gs.t_in - drift).max(gs.t_j)
            };
            (0.0, t)
        };
        gs.t_in = t_in;
        gpu_draw(g, gs, totals, act.caps.get(i).copied().flatten(), u);
        // Heat into the coolant through the plate; the rest is stored.
        let fouling = cond.plate_factor.get(rack).copied().unwrap_or(1.0);
        let r = g.r_jc + g.r_cold_plate(q) * fouling;
        let to_coolant;
        (gs.t_j, to_coolant) = g.junction_step(gs.t_j, gs.power, t_in, r, dt);
        // A closed rack's stagnant plates keep their heat in the rack.
        if c.open[rack] {
            gpu_to_coolant += to_coolant;
        }
        gpu_power += gs.power;
        gpu_safety(g, gs, totals, dt);
    }
    let host_w: f64 = host_load
        .iter()
        .map(|&l| s.host.idle_w + (s.host.full_w - s.host.idle_w) * l.clamp(0.0, 1.0))
        .sum();
    ItLoad {
        it_w: gpu_power + host_w,
        // All IT heat goes into the liquid: the GPUs' through their plates
        // (what a die stores meanwhile is its own), the hosts' directly.
        heat_w: gpu_to_coolant + host_w,
    }
}

/// A GPU's power and work under its limit (its cap, or half its TDP in
/// HW slowdown); none when shut down or powered down.
fn gpu_draw(g: &GpuModel, gs: &mut GpuState, totals: &mut Totals, cap: Option<f64>, u: f64) {
    if gs.shut_down {
        gs.power = 0.0;
        gs.work = 0.0;
    } else if gs.powered_down {
        gs.power = 0.0;
        gs.work = 0.0;
        gs.slowdown = false;
    } else {
        let slowdown = g.slowdown(gs.slowdown, gs.t_j);
        if slowdown && !gs.slowdown {
            totals.slowdown_episodes += 1;
        }
        gs.slowdown = slowdown;
        let limit = g.limit_under(cap.unwrap_or(g.tdp_w).clamp(g.min_cap_w, g.tdp_w), slowdown);
        gs.limit = limit;
        (gs.power, gs.work) = g.draw(gs.t_j, u, limit);
    }
}

/// A GPU's safety accounts after its step: the hottest junction, time
/// powered down or above the max operating temperature, shutdowns, work.
fn gpu_safety(g: &GpuModel, gs: &mut GpuState, totals: &mut Totals, dt: f64) {
    totals.max_gpu_c = totals.max_gpu_c.max(gs.t_j);
    if gs.powered_down {
        // Off by its host: no slowdown, no shutdown, not operating.
        totals.powered_down_gpu_s += dt;
    } else {
        if gs.t_j >= g.shutdown_c && !gs.shut_down {
            gs.shut_down = true;
            totals.shutdowns += 1;
        }
        if gs.t_j > g.max_operating_c {
            totals.gpu_s_above_max_operating += dt;
        }
    }
    totals.work_gpu_s += gs.work * dt;
}

/// Heat rejection in one step.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Rejection {
    /// Heat the dry cooler rejects, W.
    pub q_dc: f64,
    /// Heat the chiller rejects, W.
    pub q_ch: f64,
    /// Dry cooler fans, W.
    pub fans_w: f64,
    /// Chiller, W.
    pub chiller_w: f64,
}

impl Rejection {
    /// The share `k` (0 to 1) of it: one CDU's part of a shared loop's.
    pub fn share(&self, k: f64) -> Self {
        Self {
            q_dc: self.q_dc * k,
            q_ch: self.q_ch * k,
            fans_w: self.fans_w * k,
            chiller_w: self.chiller_w * k,
        }
    }
}

/// The facility loop: the dry cooler first, the chiller takes the rest up
/// to `chiller_max_w` (its capacity, or what is staged), the facility
/// loop stores what neither takes; the water heads for `target`, °C.
fn step_facility(
    f: &FacilityModel,
    fw_c: &mut f64,
    target: f64,
    heat_w: f64,
    dt: f64,
    cond: &Conditions,
    chiller_max_w: f64,
) -> Rejection {
    let fw_return = *fw_c + heat_w / (f.water_kg_per_s * f.water_cp_j_per_kg_k);
    let ua = f.dry_cooler_ua_w_per_k * cond.dry_cooler_fraction.clamp(0.0, 1.0);
    let drive = (fw_return - cond.ambient_c - f.pinch_k).max(0.0);
    // Towards the target the loop should shed this much heat.
    let follow = f.heat_capacity_j_per_k * (*fw_c - target) / f.follow_tau_s.max(dt);
    let wanted = (heat_w + follow).max(0.0);
    let q_dc = wanted.min(ua * drive);
    let fan_frac = if ua * drive > 0.0 {
        q_dc / (ua * drive)
    } else {
        0.0
    };
    let fans_w = f.fan_max_w * fan_frac.powi(3);
    let q_ch = if cond.chiller_tripped {
        0.0
    } else {
        (wanted - q_dc).clamp(0.0, chiller_max_w.max(0.0))
    };
    let chiller_w = q_ch / f.cop(*fw_c, cond.ambient_c);
    *fw_c += dt * (heat_w - q_dc - q_ch) / f.heat_capacity_j_per_k;
    Rejection {
        q_dc,
        q_ch,
        fans_w,
        chiller_w,
    }
}

/// The facility water loop of a hall of several CDUs
/// ([`SiteConfig::cdus`], `docs/plant-model.md` §4.1): one dry cooler and one
/// chiller plant, each `cdus` times one CDU's figures, the water heading
/// for the target the hall's facility policy sets. The chiller plant is
/// `cdus` stages of one CDU's chiller each.
#[derive(Debug, Clone)]
pub struct FacilityLoop {
    model: FacilityModel,
    fw_c: f64,
    stages: u32,
}

impl FacilityLoop {
    /// The loop of `site` (one CDU's share of it in `site.facility`), its
    /// water at `start_c` less the approach, as [`Plant::new`] starts.
    pub fn new(site: &SiteConfig, start_c: f64) -> Self {
        let k = site.cdus.max(1) as f64;
        let mut model = site.facility.clone();
        model.water_kg_per_s *= k;
        model.dry_cooler_ua_w_per_k *= k;
        model.fan_max_w *= k;
        model.chiller_max_w *= k;
        model.heat_capacity_j_per_k *= k;
        Self {
            model,
            fw_c: start_c - site.secondary.approach_k,
            stages: site.cdus.max(1) as u32,
        }
    }

    /// The whole loop's figures.
    pub fn model(&self) -> &FacilityModel {
        &self.model
    }

    /// Facility water supply, °C.
    pub fn water_c(&self) -> f64 {
        self.fw_c
    }

    /// Chiller stages in the plant.
    pub fn stages(&self) -> u32 {
        self.stages
    }

    /// One step of `dt` seconds with `heat_w` from every CDU together, the
    /// water heading for `target_c`, with `staged` chiller stages running
    /// (`None`: every stage on demand, as a BMS stages them).
    pub fn step(
        &mut self,
        dt: f64,
        heat_w: f64,
        target_c: f64,
        cond: &Conditions,
        staged: Option<u32>,
    ) -> Rejection {
        let stages = staged.unwrap_or(self.stages).min(self.stages);
        let capacity = self.model.chiller_max_w * f64::from(stages) / f64::from(self.stages);
        step_facility(
            &self.model,
            &mut self.fw_c,
            target_c,
            heat_w,
            dt,
            cond,
            capacity,
        )
    }
}

/// The meters of the step, with the return temperature.
fn meters_of(
    s: &SiteConfig,
    pumps: &Pumps,
    it: &ItLoad,
    rej: &Rejection,
    supply_c: f64,
    fw_c: f64,
) -> Meters {
    let lp = &s.secondary;
    let f = &s.facility;
    let (it_w, heat_w, flow_lpm) = (it.it_w, it.heat_w, pumps.flow_lpm);
    // Return temperature.
    let m_dot = flow_lpm * lp.density_kg_per_m3 / 60_000.0;
    let return_c = if m_dot > 0.0 {
        supply_c + heat_w / (m_dot * lp.cp_j_per_kg_k)
    } else {
        supply_c
    };
    let facility_w = it_w
        + pumps.pump_w
        + rej.fans_w
        + rej.chiller_w
        + f.pumps_w
        + f.distribution_loss * it_w
        + f.fixed_w;
    Meters {
        it_w,
        heat_w,
        pump_w: pumps.pump_w,
        fans_w: rej.fans_w,
        chiller_w: rej.chiller_w,
        dry_cooler_heat_w: rej.q_dc,
        chiller_heat_w: rej.q_ch,
        facility_w,
        flow_lpm,
        diff_pressure_kpa: pumps.dp_kpa,
        supply_c,
        return_c,
        facility_supply_c: fw_c,
    }
}

/// The energy accounts of a step of `dt` seconds with meters `m`.
fn add_step(t: &mut Totals, m: &Meters, dt: f64) {
    t.seconds += dt;
    t.it_j += m.it_w * dt;
    t.facility_j += m.facility_w * dt;
    t.heat_in_j += m.heat_w * dt;
    t.heat_out_j += (m.dry_cooler_heat_w + m.chiller_heat_w) * dt;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site() -> SiteConfig {
        SiteConfig::default()
    }

    fn act(p: &Plant, setpoint: f64, speed: f64) -> Actuation {
        Actuation {
            setpoint_c: setpoint,
            pump_speed: speed,
            pump_on: [true, false],
            valves: vec![true; p.site().racks],
            caps: vec![None; p.gpus().len()],
            powered_down: Vec::new(),
        }
    }

    fn cond(p: &Plant, ambient: f64, u: f64) -> Conditions {
        Conditions {
            ambient_c: ambient,
            demand: vec![u; p.gpus().len()],
            pump_tripped: [false; 2],
            plate_factor: Vec::new(),
            chiller_tripped: false,
            dry_cooler_fraction: 1.0,
        }
    }

    /// Runs `secs` seconds at 1 s steps.
    fn run(p: &mut Plant, secs: usize, a: &Actuation, c: &Conditions) {
        for _ in 0..secs {
            p.step(1.0, a, c);
        }
    }

    fn close(got: f64, want: f64, tol: f64, what: &str) {
        assert!(
            (got - want).abs() <= tol,
            "{what}: got {got:.4}, by hand {want:.4} (±{tol})"
        );
    }

    /// Steady state at three operating points against `docs/plant-model.md` §2, §3 and §5
    /// evaluated by hand (the arithmetic is written out below).
    #[test]
    fn steady_states_match_the_formulas_by_hand() {
        // (supply °C, pump speed, demand u, ambient °C)
        struct Point {
            supply: f64,
            speed: f64,
            u: f64,
            ambient: f64,
            // By hand:
            t_j: f64,
            power: f64,
            work: f64,
            pump_w: f64,
        }
        let points = [
            // 1. Supply 32 °C, pump 100 %: q = 1.5 L/min per GPU.
            //    R_cp(1.5) = 0.0220 + (0.0204 - 0.0220) * (0.1 / 0.6) = 0.021733
            //    R = 0.022 + 0.021733 = 0.043733 K/W
            //    u = 0.9: P_d = 0.9 * (700 - 90) = 549 W
            //    P = 549 + 90 * (1 + 0.015 * (T - 50)) = 571.5 + 1.35 T
            //    T = 32 + R * P  =>  T * (1 - 1.35 R) = 32 + 571.5 R
            //    T = (32 + 24.9936) / 0.940960 = 60.569 °C; P = 653.27 W
            //    (below the 700 W limit: w = u = 0.9). Pump: 1400 W * 1.0^3.
            Point {
                supply: 32.0,
                speed: 1.0,
                u: 0.9,
                ambient: 20.0,
                t_j: 60.569,
                power: 653.27,
                work: 0.9,
                pump_w: 1400.0,
            },
            // 2. Supply 45 °C, pump 50 %: q = 0.75 L/min.
            //    R_cp(0.75) = 0.0300 + (0.0245 - 0.0300) * (0.15 / 0.4) = 0.0279375
            //    R = 0.0499375 K/W; u = 1: P_s + P_d = 700 + 1.35 (T - 50)
            //    exceeds 700 W for any T above 50 °C, so P = 700 W (capped):
            //    T = 45 + 700 R = 79.956 °C
            //    w = (700 - 90 * (1 + 0.015 * 29.956)) / 610 = 0.93373
            //    Pump: 1400 W * 0.5^3 = 175 W.
            Point {
                supply: 45.0,
                speed: 0.5,
                u: 1.0,
                ambient: 20.0,
                t_j: 79.956,
                power: 700.0,
                work: 0.93373,
                pump_w: 175.0,
            },
            // 3. Supply 18 °C, pump 30 %: q = 0.45 L/min.
            //    R_cp(0.45) = 0.0389 + (0.0300 - 0.0389) * (0.05 / 0.2) = 0.036675
            //    R = 0.058675 K/W; u = 0.5: P_d = 305 W, P = 327.5 + 1.35 T
            //    T * (1 - 1.35 R) = 18 + 327.5 R  =>  T = 37.2161 / 0.920789 = 40.418 °C
            //    P = 327.5 + 1.35 * 40.418 = 382.06 W. Pump: 1400 * 0.3^3 = 37.8 W.
            Point {
                supply: 18.0,
                speed: 0.3,
                u: 0.5,
                ambient: 5.0,
                t_j: 40.418,
                power: 382.06,
                work: 0.5,
                pump_w: 37.8,
            },
        ];
        for (k, pt) in points.iter().enumerate() {
            let mut p = Plant::new(site(), pt.supply);
            let a = act(&p, pt.supply, pt.speed);
            let c = cond(&p, pt.ambient, pt.u);
            run(&mut p, 1800, &a, &c);
            let g = p.gpus()[0];
            let m = p.meters();
            close(m.supply_c, pt.supply, 0.01, &format!("point {k}: supply"));
            close(g.t_j, pt.t_j, 0.05, &format!("point {k}: junction"));
            close(g.power, pt.power, 0.1, &format!("point {k}: power"));
            close(g.work, pt.work, 0.001, &format!("point {k}: work"));
            close(m.pump_w, pt.pump_w, 0.01, &format!("point {k}: pump"));
            // docs/plant-model.md §3.4: return = supply + Q / (m_dot c_p), with
            // Q = 128 GPUs' power + 16 hosts at 500 + 700 u W (steady: all
            // of it reaches the coolant), flow 1.5 * speed * 128 L/min.
            let q = 128.0 * pt.power + 16.0 * (500.0 + 700.0 * pt.u);
            let m_dot = 1.5 * pt.speed * 128.0 * 1030.0 / 60_000.0;
            close(m.heat_w, q, 1.0, &format!("point {k}: heat"));
            close(
                m.return_c,
                pt.supply + q / (m_dot * 3900.0),
                0.01,
                &format!("point {k}: return"),
            );
            // docs/plant-model.md §5: facility = IT + pump + fans + chiller + 1.5 kW
            // facility pumps + 3 % of IT + 2 kW.
            let want = m.it_w + m.pump_w + m.fans_w + m.chiller_w + 1500.0 + 0.03 * m.it_w + 2000.0;
            close(m.facility_w, want, 0.01, &format!("point {k}: facility"));
            // At steady state the heat rejected is the heat taken in.
            close(
                m.dry_cooler_heat_w + m.chiller_heat_w,
                q,
                0.005 * q,
                &format!("point {k}: rejection"),
            );
        }
    }

    #[test]
    fn energy_balances_over_an_eventful_run() {
        let mut p = Plant::new(site(), 30.0);
        // At rest at 30 °C: dies at 30 °C, facility water 3 K below.
        let start_c = 30.0;
        let fw_start = 30.0 - 3.0;
        let mut a = act(&p, 30.0, 0.8);
        let mut c = cond(&p, 25.0, 0.2);
        for t in 0..7200 {
            c.demand
                .iter_mut()
                .for_each(|u| *u = if t < 600 { 0.2 } else { 0.95 });
            c.ambient_c = 25.0 + 10.0 * t as f64 / 7200.0;
            c.chiller_tripped = (3000..3600).contains(&t);
            a.setpoint_c = if t < 4000 { 30.0 } else { 36.0 };
            p.step(1.0, &a, &c);
        }
        let t = p.totals();
        let stored = p.gpu_stored_j(start_c) + p.facility_stored_j(fw_start);
        let balance = t.it_j - (t.heat_out_j + stored);
        assert!(
            balance.abs() < 0.01 * t.it_j,
            "IT {:.1} MJ vs rejected {:.1} MJ + stored {:.1} MJ: off by {:.3} %",
            t.it_j / 1e6,
            t.heat_out_j / 1e6,
            stored / 1e6,
            100.0 * balance / t.it_j
        );
        // The chiller trip left heat in the facility loop for a while.
        assert!(t.heat_out_j < t.it_j);
    }

    #[test]
    fn identical_cdus_on_a_shared_loop_run_as_one_cdu_alone() {
        // Three CDUs on a loop three times one CDU's plant, every CDU told
        // the same, the water heading where one CDU's setpoint sends its
        // own: each CDU's meters are the lone CDU's.
        let mut alone = Plant::new(site(), 30.0);
        let hall_site = SiteConfig { cdus: 3, ..site() };
        let mut cdus: Vec<Plant> = (0..3).map(|_| Plant::new(site(), 30.0)).collect();
        let mut water = FacilityLoop::new(&hall_site, 30.0);
        let a = act(&alone, 31.0, 0.8);
        let mut c = cond(&alone, 27.0, 0.9);
        for t in 0..3600 {
            c.chiller_tripped = (1200..1500).contains(&t);
            alone.step(1.0, &a, &c);
            let heat: f64 = cdus
                .iter_mut()
                .map(|p| {
                    p.set_facility_c(water.water_c());
                    p.step_secondary(1.0, &a, &c)
                })
                .sum();
            let rej = water.step(1.0, heat, 31.0 - 3.0, &c, None);
            for p in cdus.iter_mut() {
                p.finish_step(1.0, &rej.share(1.0 / 3.0));
            }
        }
        let (m, one) = (alone.meters(), cdus[1].meters());
        close(
            one.facility_w,
            m.facility_w,
            1e-6 * m.facility_w,
            "facility W",
        );
        close(one.chiller_w, m.chiller_w, 1e-3, "chiller W");
        close(one.supply_c, m.supply_c, 1e-9, "supply");
        close(water.water_c(), m.facility_supply_c, 1e-9, "facility water");
        let (ta, tc) = (alone.totals(), cdus[2].totals());
        close(
            tc.facility_j,
            ta.facility_j,
            1e-6 * ta.facility_j,
            "facility energy",
        );
    }

    #[test]
    fn a_chiller_plant_staged_short_leaves_the_water_warm() {
        let hall_site = SiteConfig { cdus: 4, ..site() };
        let p = Plant::new(site(), 30.0);
        let c = cond(&p, 30.0, 1.0);
        let heat = 4.0 * 120_000.0;
        let mut all = FacilityLoop::new(&hall_site, 30.0);
        let mut one = FacilityLoop::new(&hall_site, 30.0);
        for _ in 0..1800 {
            all.step(1.0, heat, 22.0, &c, None);
            one.step(1.0, heat, 22.0, &c, Some(1));
        }
        close(all.water_c(), 22.0, 0.05, "every stage holds the target");
        assert!(
            one.water_c() > 24.0,
            "one stage of four: {:.2} °C",
            one.water_c()
        );
        // Asking for more stages than the plant has runs them all.
        let r = all.step(1.0, heat, 22.0, &c, Some(9));
        assert!(r.q_ch > 0.0);
    }

    #[test]
    fn a_pump_trip_without_lag_heats_gpus_at_the_model_rate() {
        let mut p = Plant::new(site(), 32.0);
        let a = act(&p, 32.0, 1.0);
        let mut c = cond(&p, 20.0, 0.9);
        run(&mut p, 1800, &a, &c);
        let before = p.gpus()[0];
        c.pump_tripped = [true, false];
        p.step(1.0, &a, &c);
        let after = p.gpus()[0];
        assert_eq!(p.meters().flow_lpm, 0.0, "no pump, no flow");
        // First second, by the model: the plate goes stagnant (0.2 K/W) and
        // its inlet starts drifting to the die at 1 K/s:
        // dT/dt = (P - (T_j - T_in) / (R_jc + 0.2)) / C_j.
        let g = &p.site().gpu;
        let t_in = before.t_in + 1.0;
        let p_w = after.power;
        let rate =
            (p_w - (before.t_j - t_in) / (g.r_jc + g.r_cp_stagnant)) / g.heat_capacity_j_per_k;
        close(after.t_j - before.t_j, rate, 0.02, "first-second rise");
        assert!(
            rate > 0.9,
            "a loaded GPU heats about 1 K/s without flow: {rate:.2}"
        );
        // And it keeps climbing into slowdown, then shutdown.
        run(&mut p, 120, &a, &c);
        assert!(p.totals().slowdown_episodes > 0);
        run(&mut p, 600, &a, &c);
        assert!(
            p.totals().shutdowns > 0,
            "without any pump the GPUs shut down"
        );
    }

    #[test]
    fn the_lag_pump_restores_flow_over_its_start_time() {
        let mut p = Plant::new(site(), 32.0);
        let mut a = act(&p, 32.0, 1.0);
        let mut c = cond(&p, 20.0, 0.9);
        run(&mut p, 600, &a, &c);
        c.pump_tripped = [true, false];
        a.pump_on = [true, true];
        p.step(1.0, &a, &c);
        let first = p.meters().flow_lpm;
        run(&mut p, 10, &a, &c);
        close(
            first,
            192.0 / 10.0,
            0.01,
            "a tenth of the flow after 1 s of 10",
        );
        close(p.meters().flow_lpm, 192.0, 0.01, "full flow after 10 s");
    }

    #[test]
    fn warmer_water_heats_gpus_raises_static_power_and_saves_the_chiller() {
        // A warm afternoon: the dry cooler alone cannot reach cold water.
        let steady = |setpoint: f64| {
            let mut p = Plant::new(site(), setpoint);
            let a = act(&p, setpoint, 1.0);
            let c = cond(&p, 30.0, 0.9);
            run(&mut p, 2400, &a, &c);
            let g = p.gpus()[0];
            (
                g.t_j,
                p.site().gpu.static_power(g.t_j),
                p.meters().chiller_w,
            )
        };
        let (t_cold, ps_cold, ch_cold) = steady(25.0);
        let (t_warm, ps_warm, ch_warm) = steady(35.0);
        assert!(t_warm > t_cold + 9.0, "GPU {t_cold:.1} -> {t_warm:.1} °C");
        assert!(ps_warm > ps_cold, "static {ps_cold:.1} -> {ps_warm:.1} W");
        assert!(ch_warm < ch_cold, "chiller {ch_cold:.0} -> {ch_warm:.0} W");
        assert!(
            ch_cold > 1000.0,
            "25 °C water on a 30 °C day needs the chiller"
        );
    }

    #[test]
    fn setpoints_are_held_to_the_cdu_range_and_the_approach() {
        let mut p = Plant::new(site(), 30.0);
        let a = act(&p, 5.0, 1.0);
        let c = cond(&p, 20.0, 0.5);
        run(&mut p, 600, &a, &c);
        assert!(p.meters().supply_c >= 17.0 - 1e-6, "dew point + 2 K");
        let a = act(&p, 60.0, 1.0);
        run(&mut p, 600, &a, &c);
        close(p.meters().supply_c, 45.0, 0.01, "at most 45 °C");
    }

    #[test]
    fn a_site_is_described_in_toml_and_typos_are_refused() {
        let s: SiteConfig =
            toml::from_str("racks = 2\n[gpu]\ntdp_w = 1000.0\n[loop]\napproach_k = 2.0\n")
                .expect("valid");
        assert_eq!(
            (s.racks, s.gpu.tdp_w, s.secondary.approach_k),
            (2, 1000.0, 2.0)
        );
        assert_eq!(
            s.facility.chiller_max_w, 160_000.0,
            "the rest keeps its default"
        );
        let e = toml::from_str::<SiteConfig>("[gpu]\ntdp = 1000.0\n").unwrap_err();
        assert!(e.to_string().contains("tdp"), "{e}");
    }
}
