//! A site's figures as data: the hall a CDU serves (racks, hosts, GPUs),
//! the GPU model's power and thermal law, the secondary loop and the CDU,
//! and the facility's heat rejection, with the characteristic curves those
//! figures define (cold-plate resistance against flow, static power against
//! temperature, the chiller's COP). Every field has the default of
//! `docs/plant-model.md` and is a key of a site's TOML; the figures the
//! controller shares with the plant are written once, in
//! `cooling_core::reference`, and only the plant's own (slowdown,
//! shutdown, heat capacities, time constants) are written here.
//!
//! The controller is configured with these figures (`cooling-ctrl`'s
//! `site_figures`); the simulated hall (`loopwarden-twin`) runs its plant
//! on them.
//!
//! Glossary:
//! - *secondary loop*: coolant from the CDU to the racks' cold plates.
//! - *facility loop*: water from the CDU's heat exchanger to the dry
//!   cooler and the trim chiller.
//! - *static power*: what a GPU draws idle; it grows with temperature
//!   (leakage).
//! - *COP*: heat a chiller removes per unit of electric power.

use cooling_core::reference::{cdu, facility, gpu, host, layout};
use serde::Deserialize;

/// A hall as data; every field has the default of `docs/plant-model.md`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SiteConfig {
    /// Racks on the CDU.
    pub racks: usize,
    /// Hosts per rack.
    pub hosts_per_rack: usize,
    /// GPUs per host.
    pub gpus_per_host: usize,
    /// The GPU model.
    pub gpu: GpuModel,
    /// Host power besides the GPUs.
    pub host: HostModel,
    /// The secondary loop and the CDU.
    #[serde(rename = "loop")]
    pub secondary: LoopModel,
    /// Heat rejection.
    pub facility: FacilityModel,
    /// CDUs on the facility water loop, each with these racks and its own
    /// controller (`docs/plant-model.md` §4.1); the dry cooler, the chiller
    /// plant and the facility water flow are this many times the
    /// figures of `facility`, which are one CDU's share.
    pub cdus: usize,
}

impl Default for SiteConfig {
    fn default() -> Self {
        Self {
            racks: usize::from(layout::RACKS),
            hosts_per_rack: usize::from(layout::HOSTS_PER_RACK),
            gpus_per_host: usize::from(layout::GPUS_PER_HOST),
            gpu: GpuModel::default(),
            host: HostModel::default(),
            secondary: LoopModel::default(),
            facility: FacilityModel::default(),
            cdus: usize::from(layout::CDUS),
        }
    }
}

/// One GPU (`docs/plant-model.md` §2).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpuModel {
    /// Default power limit, W.
    pub tdp_w: f64,
    /// Lowest settable limit, W.
    pub min_cap_w: f64,
    /// Static power at 50 °C, W.
    pub static_w: f64,
    /// Leakage growth per K above 50 °C, fraction of `static_w`.
    pub leak_per_k: f64,
    /// Max operating temperature, °C.
    pub max_operating_c: f64,
    /// HW slowdown, °C.
    pub slowdown_c: f64,
    /// HW shutdown, °C.
    pub shutdown_c: f64,
    /// Junction to case, K/W.
    pub r_jc: f64,
    /// Cold plate, case to inlet, K/W, at flows per GPU in L/min.
    pub r_cp: Vec<[f64; 2]>,
    /// Cold plate without flow, K/W.
    pub r_cp_stagnant: f64,
    /// Lumped heat capacity, J/K.
    pub heat_capacity_j_per_k: f64,
}

impl Default for GpuModel {
    fn default() -> Self {
        Self {
            tdp_w: gpu::TDP_W,
            min_cap_w: gpu::MIN_CAP_W,
            static_w: gpu::STATIC_W,
            leak_per_k: gpu::LEAK_PER_K,
            max_operating_c: gpu::MAX_OPERATING_C,
            slowdown_c: 89.0,
            shutdown_c: 92.0,
            r_jc: gpu::R_JC_K_PER_W,
            r_cp: gpu::R_CP.to_vec(),
            r_cp_stagnant: 0.2,
            heat_capacity_j_per_k: 500.0,
        }
    }
}

impl GpuModel {
    /// Cold-plate resistance at `q` L/min (piecewise linear, clamped).
    pub fn r_cold_plate(&self, q: f64) -> f64 {
        let t = &self.r_cp;
        if q <= 0.0 || t.is_empty() {
            return self.r_cp_stagnant;
        }
        if q <= t[0][0] {
            return t[0][1];
        }
        for p in t.windows(2) {
            let ([q0, r0], [q1, r1]) = (p[0], p[1]);
            if q <= q1 {
                return r0 + (r1 - r0) * (q - q0) / (q1 - q0);
            }
        }
        t[t.len() - 1][1]
    }

    /// Static power at `t_j`, W.
    pub fn static_power(&self, t_j: f64) -> f64 {
        self.static_w * (1.0 + self.leak_per_k * (t_j - 50.0))
    }

    /// Whether a GPU at `t_j` is in hardware slowdown, given whether it
    /// `was`: it enters at the slowdown temperature and leaves below the
    /// max operating temperature.
    pub fn slowdown(&self, was: bool, t_j: f64) -> bool {
        if t_j >= self.slowdown_c {
            true
        } else if t_j < self.max_operating_c {
            false
        } else {
            was
        }
    }

    /// The power limit a GPU runs under: `limit`, at most half the TDP in
    /// hardware slowdown, W.
    pub fn limit_under(&self, limit: f64, slowdown: bool) -> f64 {
        if slowdown {
            limit.min(0.5 * self.tdp_w)
        } else {
            limit
        }
    }

    /// The junction temperature after `dt` s of drawing `power_w` with
    /// `r_k_per_w` (junction to case plus cold plate) to coolant at
    /// `t_in_c`, and the heat that went into the coolant meanwhile, W: the
    /// one lumped thermal law of every simulated GPU.
    pub fn junction_step(
        &self,
        t_j: f64,
        power_w: f64,
        t_in_c: f64,
        r_k_per_w: f64,
        dt: f64,
    ) -> (f64, f64) {
        let to_coolant = (t_j - t_in_c) / r_k_per_w;
        let t = t_j + dt * (power_w - to_coolant) / self.heat_capacity_j_per_k;
        (t, to_coolant)
    }

    /// Power drawn and work rate of a GPU at `t_j` with demand `u` under
    /// `limit` (`docs/plant-model.md` §2.2): static plus dynamic power when it fits, else
    /// the limit, with the clocks (work) dropped to fit it.
    pub fn draw(&self, t_j: f64, u: f64, limit: f64) -> (f64, f64) {
        let p_s = self.static_power(t_j);
        let p_d = u * (self.tdp_w - self.static_w);
        if p_s + p_d <= limit {
            (p_s + p_d, u)
        } else if p_d > 0.0 {
            (limit, u * (limit - p_s).max(0.0) / p_d)
        } else {
            (limit, 0.0)
        }
    }
}

/// Host power besides its GPUs (`docs/plant-model.md` §2.5).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HostModel {
    /// At full load, W.
    pub full_w: f64,
    /// Idle, W.
    pub idle_w: f64,
}

impl Default for HostModel {
    fn default() -> Self {
        Self {
            full_w: host::FULL_W,
            idle_w: host::IDLE_W,
        }
    }
}

/// The secondary loop and the CDU (`docs/plant-model.md` §3).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoopModel {
    /// Flow per GPU at pump speed 100 %, L/min.
    pub design_lpm_per_gpu: f64,
    /// Lowest pump speed, fraction.
    pub min_speed: f64,
    /// Electrical power of the running pump at 100 %, W.
    pub pump_max_w: f64,
    /// CDU heat exchanger approach, K.
    pub approach_k: f64,
    /// Supply temperature's time constant, s.
    pub supply_tau_s: f64,
    /// How long the lag pump takes to reach speed, s.
    pub lag_start_s: f64,
    /// Coolant heat capacity, J/(kg·K).
    pub cp_j_per_kg_k: f64,
    /// Coolant density, kg/m³.
    pub density_kg_per_m3: f64,
    /// Room dew point, °C.
    pub dew_point_c: f64,
    /// Highest setpoint, °C.
    pub max_setpoint_c: f64,
    /// How fast a stagnant plate's inlet drifts to the die, K/s.
    pub stagnant_drift_k_per_s: f64,
    /// Loop differential pressure at full pump speed, kPa (it falls with
    /// the square of the flow).
    pub design_dp_kpa: f64,
    /// The CDU's own supply setpoint when its controller's heartbeat stops,
    /// °C (it runs its pumps at full speed then).
    pub fallback_setpoint_c: f64,
    /// The CDU falls back when the heartbeat register has not been written
    /// for this long, s.
    pub heartbeat_timeout_s: f64,
}

impl Default for LoopModel {
    fn default() -> Self {
        Self {
            design_lpm_per_gpu: cdu::DESIGN_LPM_PER_GPU,
            min_speed: cdu::MIN_SPEED,
            pump_max_w: cdu::PUMP_MAX_W,
            approach_k: cdu::APPROACH_K,
            supply_tau_s: 30.0,
            lag_start_s: 10.0,
            cp_j_per_kg_k: cdu::CP_J_PER_KG_K,
            density_kg_per_m3: cdu::DENSITY_KG_PER_M3,
            dew_point_c: 15.0,
            max_setpoint_c: cdu::MAX_SETPOINT_C,
            stagnant_drift_k_per_s: 1.0,
            design_dp_kpa: cdu::DESIGN_DP_KPA,
            fallback_setpoint_c: 25.0,
            heartbeat_timeout_s: 10.0,
        }
    }
}

impl LoopModel {
    /// The lowest setpoint the CDU accepts (dew point + 2 K), °C.
    pub fn min_setpoint_c(&self) -> f64 {
        self.dew_point_c + 2.0
    }
}

/// Heat rejection and the facility's own loads (`docs/plant-model.md` §4 and §5).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FacilityModel {
    /// Facility water flow, kg/s.
    pub water_kg_per_s: f64,
    /// Water heat capacity, J/(kg·K).
    pub water_cp_j_per_kg_k: f64,
    /// Dry cooler at full fans, W/K.
    pub dry_cooler_ua_w_per_k: f64,
    /// Dry cooler fans at 100 %, W.
    pub fan_max_w: f64,
    /// The dry cooler cannot cool below ambient + this, K.
    pub pinch_k: f64,
    /// Trim chiller capacity, W.
    pub chiller_max_w: f64,
    /// Best chiller COP.
    pub cop_max: f64,
    /// Share of the Carnot COP the chiller reaches.
    pub carnot_fraction: f64,
    /// Heat capacity of the facility loop, J/K.
    pub heat_capacity_j_per_k: f64,
    /// Time constant of the facility water following its target, s.
    pub follow_tau_s: f64,
    /// Facility pumps, W.
    pub pumps_w: f64,
    /// Distribution losses, share of IT power.
    pub distribution_loss: f64,
    /// Fixed loads, W.
    pub fixed_w: f64,
    /// The facility water a hall of several CDUs is held at when its
    /// target is fixed (the warmest design day's), °C.
    pub fixed_water_c: f64,
}

impl Default for FacilityModel {
    fn default() -> Self {
        Self {
            water_kg_per_s: facility::WATER_KG_PER_S,
            water_cp_j_per_kg_k: facility::WATER_CP_J_PER_KG_K,
            dry_cooler_ua_w_per_k: facility::DRY_COOLER_UA_W_PER_K,
            fan_max_w: facility::FAN_MAX_W,
            pinch_k: facility::PINCH_K,
            chiller_max_w: facility::CHILLER_MAX_W,
            cop_max: facility::COP_MAX,
            carnot_fraction: facility::CARNOT_FRACTION,
            heat_capacity_j_per_k: 3_000_000.0,
            follow_tau_s: 60.0,
            pumps_w: facility::PUMPS_W,
            distribution_loss: facility::DISTRIBUTION_LOSS,
            fixed_w: facility::FIXED_W,
            fixed_water_c: 20.0,
        }
    }
}

impl FacilityModel {
    /// The chiller's COP with facility water at `t_fw` and outdoor air at
    /// `t_amb` (°C): a Carnot fraction, at most `cop_max`.
    pub fn cop(&self, t_fw: f64, t_amb: f64) -> f64 {
        let lift = t_amb + 10.0 - t_fw;
        if lift <= 0.0 {
            return self.cop_max;
        }
        (self.carnot_fraction * (t_fw + 273.15) / lift).min(self.cop_max)
    }
}
