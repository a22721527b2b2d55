//! What the control core knows of its hall: the CDU's limits, the GPUs'
//! datasheet figures, the heat rejection plant, and the controller's own
//! margins and timings. Filled by the shell from the site and board files;
//! every figure has a unit in its name.
//!
//! Glossary:
//! - *plan ceiling*: the junction temperature the optimiser never plans
//!   above, for every GPU at full demand (so a job starting on an idle hall
//!   finds its water ready).
//! - *cap target*: the junction temperature cap leases are sized to hold.
//! - *figures record*: the configuration as bytes, for an image built
//!   with it ([`figures`]).

pub mod figures;

/// The racks, hosts and GPUs the CDU feeds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Layout {
    /// Racks on the loop (at most [`crate::MAX_RACKS`]).
    pub racks: u8,
    /// Hosts per rack.
    pub hosts_per_rack: u8,
    /// GPUs per host.
    pub gpus_per_host: u8,
    /// Racks the site declared without a leak rope, bit n = rack n.
    pub unprotected: u16,
}

impl Layout {
    /// Hosts on the loop.
    pub fn hosts(&self) -> usize {
        self.racks as usize * self.hosts_per_rack as usize
    }
    /// GPUs on the loop.
    pub fn gpus(&self) -> usize {
        self.hosts() * self.gpus_per_host as usize
    }
    /// The rack of host `h`.
    pub fn rack_of(&self, h: usize) -> usize {
        h / (self.hosts_per_rack.max(1) as usize)
    }
}

/// One GPU model's thermal and power figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuParams {
    /// Default (board) power limit, W.
    pub tdp_w: f32,
    /// Lowest settable power limit, W.
    pub min_cap_w: f32,
    /// Static power at 50 °C, W.
    pub static_w: f32,
    /// Leakage growth, fraction of the static power per K above 50 °C.
    pub leak_per_k: f32,
    /// Junction to cold-plate case, K/W.
    pub r_jc_k_per_w: f32,
    /// Cold plate, case to coolant, by flow per GPU: `[L/min, K/W]`,
    /// rising flow, clamped at the ends.
    pub r_cp: [[f32; 2]; 6],
    /// Highest operating temperature, °C.
    pub max_operating_c: f32,
}

/// The CDU: its pumps, heat exchanger and what it accepts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CduParams {
    /// Flow per GPU at 100 % pump speed, L/min.
    pub design_lpm_per_gpu: f32,
    /// Lowest pump speed, fraction.
    pub min_speed: f32,
    /// Electrical power of the running pump at 100 %, W.
    pub pump_max_w: f32,
    /// Heat exchanger approach, K.
    pub approach_k: f32,
    /// Lowest supply setpoint the CDU accepts, °C (dew point + margin).
    pub min_setpoint_c: f32,
    /// Highest supply setpoint the CDU accepts, °C.
    pub max_setpoint_c: f32,
    /// Coolant specific heat, J/(kg·K).
    pub cp_j_per_kg_k: f32,
    /// Coolant density, kg/m³.
    pub density_kg_per_m3: f32,
    /// Loop differential pressure with the pump at full speed, kPa (it
    /// falls with the square of the speed).
    pub design_dp_kpa: f32,
}

/// Host power besides the GPUs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostParams {
    /// At full load, W.
    pub full_w: f32,
    /// Idle, W.
    pub idle_w: f32,
}

/// The heat rejection plant on the facility side.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FacilityParams {
    /// Facility water flow, kg/s.
    pub water_kg_per_s: f32,
    /// Facility water specific heat, J/(kg·K).
    pub water_cp_j_per_kg_k: f32,
    /// Dry cooler conductance at full fans, W/K.
    pub dry_cooler_ua_w_per_k: f32,
    /// Dry cooler fans at 100 %, W.
    pub fan_max_w: f32,
    /// The dry cooler cannot cool below ambient plus this, K.
    pub pinch_k: f32,
    /// Trim chiller capacity, W of heat.
    pub chiller_max_w: f32,
    /// Highest chiller COP.
    pub cop_max: f32,
    /// Chiller COP as a fraction of Carnot's.
    pub carnot_fraction: f32,
    /// Facility pumps, W.
    pub pumps_w: f32,
    /// Distribution losses, fraction of IT power.
    pub distribution_loss: f32,
    /// Fixed loads, W.
    pub fixed_w: f32,
    /// CDUs on this facility water (the figures above are one CDU's
    /// share of the plant); above 1 the water is the facility
    /// coordinator's to set, not this CDU's.
    pub cdus: u8,
}

impl FacilityParams {
    /// The whole plant of a hall of `self.cdus` CDUs: flows, conductance,
    /// fans, chiller, pumps and fixed loads that many times one share.
    pub fn whole(&self) -> Self {
        let k = f32::from(self.cdus.max(1));
        Self {
            water_kg_per_s: self.water_kg_per_s * k,
            dry_cooler_ua_w_per_k: self.dry_cooler_ua_w_per_k * k,
            fan_max_w: self.fan_max_w * k,
            chiller_max_w: self.chiller_max_w * k,
            pumps_w: self.pumps_w * k,
            fixed_w: self.fixed_w * k,
            ..*self
        }
    }
}

/// The controller's own margins.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Margins {
    /// The optimiser never plans a GPU above this at full demand, °C.
    pub plan_ceiling_c: f32,
    /// Cap leases are sized to hold the hottest GPU at this, °C.
    pub cap_target_c: f32,
    /// Setpoint while booting, °C.
    pub boot_setpoint_c: f32,
    /// Highest setpoint in failsafe, °C.
    pub failsafe_setpoint_c: f32,
    /// Outdoor temperature assumed when none is reported, °C.
    pub design_ambient_c: f32,
    /// Fastest rise of the setpoint, K/min (falls are not limited).
    pub setpoint_rise_k_per_min: f32,
    /// Fastest fall of the pump speed, fraction per second (rises are not
    /// limited).
    pub speed_fall_per_s: f32,
}

/// How long things take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// A sensor silent this long is lost, ms.
    pub sensor_timeout_ms: u64,
    /// A host report older than this is ignored, ms.
    pub host_timeout_ms: u64,
    /// Every required sensor plausible this long ends booting, ms.
    pub boot_settle_ms: u64,
    /// The optimiser starts a new search this often, ms.
    pub optimise_every_ms: u64,
    /// A disagreement must last this long to be a sensor fault, ms.
    pub fault_confirm_ms: u64,
    /// A faulty sensor must agree this long to be trusted again, ms.
    pub fault_clear_ms: u64,
    /// Capacity must be back this long before a cap is lifted, ms.
    pub cap_release_ms: u64,
    /// A latched rack's valve must read closed within this, ms, or the
    /// isolation has failed (the valve's stroke time and a margin).
    pub valve_confirm_ms: u64,
}

/// Everything the core is configured with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CoreConfig {
    /// Racks, hosts, GPUs.
    pub layout: Layout,
    /// GPU figures.
    pub gpu: GpuParams,
    /// Host figures.
    pub host: HostParams,
    /// CDU figures.
    pub cdu: CduParams,
    /// Heat rejection figures.
    pub facility: FacilityParams,
    /// Margins.
    pub margins: Margins,
    /// Timings.
    pub timing: Timing,
}

impl Default for CoreConfig {
    /// The reference hall ([`CoreConfig::reference`]).
    fn default() -> Self {
        Self::reference()
    }
}

impl CoreConfig {
    /// The reference hall ([`crate::reference`]): 4 racks of 4 hosts of 8
    /// H200-class GPUs with one CDU, a dry cooler and a trim chiller.
    /// `const`, so that a microcontroller's static can start from it.
    pub const fn reference() -> Self {
        use crate::reference::{cdu, facility, gpu, host, layout};
        let mut r_cp = [[0.0f32; 2]; gpu::R_CP.len()];
        let mut i = 0;
        while i < r_cp.len() {
            r_cp[i] = [gpu::R_CP[i][0] as f32, gpu::R_CP[i][1] as f32];
            i += 1;
        }
        Self {
            layout: Layout {
                racks: layout::RACKS,
                hosts_per_rack: layout::HOSTS_PER_RACK,
                gpus_per_host: layout::GPUS_PER_HOST,
                unprotected: 0,
            },
            gpu: GpuParams {
                tdp_w: gpu::TDP_W as f32,
                min_cap_w: gpu::MIN_CAP_W as f32,
                static_w: gpu::STATIC_W as f32,
                leak_per_k: gpu::LEAK_PER_K as f32,
                r_jc_k_per_w: gpu::R_JC_K_PER_W as f32,
                r_cp,
                max_operating_c: gpu::MAX_OPERATING_C as f32,
            },
            host: HostParams {
                full_w: host::FULL_W as f32,
                idle_w: host::IDLE_W as f32,
            },
            cdu: CduParams {
                design_lpm_per_gpu: cdu::DESIGN_LPM_PER_GPU as f32,
                min_speed: cdu::MIN_SPEED as f32,
                pump_max_w: cdu::PUMP_MAX_W as f32,
                approach_k: cdu::APPROACH_K as f32,
                min_setpoint_c: 17.0,
                max_setpoint_c: cdu::MAX_SETPOINT_C as f32,
                cp_j_per_kg_k: cdu::CP_J_PER_KG_K as f32,
                density_kg_per_m3: cdu::DENSITY_KG_PER_M3 as f32,
                design_dp_kpa: cdu::DESIGN_DP_KPA as f32,
            },
            facility: FacilityParams {
                water_kg_per_s: facility::WATER_KG_PER_S as f32,
                water_cp_j_per_kg_k: facility::WATER_CP_J_PER_KG_K as f32,
                dry_cooler_ua_w_per_k: facility::DRY_COOLER_UA_W_PER_K as f32,
                fan_max_w: facility::FAN_MAX_W as f32,
                pinch_k: facility::PINCH_K as f32,
                chiller_max_w: facility::CHILLER_MAX_W as f32,
                cop_max: facility::COP_MAX as f32,
                carnot_fraction: facility::CARNOT_FRACTION as f32,
                pumps_w: facility::PUMPS_W as f32,
                distribution_loss: facility::DISTRIBUTION_LOSS as f32,
                fixed_w: facility::FIXED_W as f32,
                cdus: layout::CDUS,
            },
            margins: Margins {
                plan_ceiling_c: 83.0,
                cap_target_c: 85.5,
                boot_setpoint_c: 25.0,
                failsafe_setpoint_c: 35.0,
                design_ambient_c: 35.0,
                setpoint_rise_k_per_min: 6.0,
                speed_fall_per_s: 0.01,
            },
            timing: Timing {
                sensor_timeout_ms: 5_000,
                host_timeout_ms: 15_000,
                boot_settle_ms: 10_000,
                optimise_every_ms: 60_000,
                fault_confirm_ms: 60_000,
                fault_clear_ms: 60_000,
                cap_release_ms: 60_000,
                valve_confirm_ms: 5_000,
            },
        }
    }
}

/// A configuration the core refuses, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigError {
    /// No racks, hosts or GPUs, or more than the core holds.
    Layout(&'static str),
    /// A figure outside what makes physical sense.
    Figure(&'static str),
    /// The CDU's register map takes no range of setpoints the site
    /// allows: held to the map's `supply_setpoint` range (as
    /// `cooling_decide` holds the core), the lowest setpoint would not be
    /// below the highest. Both ranges, lowest and highest, in hundredths
    /// of a °C.
    SetpointOutsideMap {
        /// The map's `supply_setpoint` range.
        map_centi: [i32; 2],
        /// The site's: its lowest (its dew point's), its highest.
        site_centi: [i32; 2],
    },
}

/// A temperature in hundredths of a °C, with one decimal unless it has
/// two (17.0, 30.25).
struct Centi(i32);

impl core::fmt::Display for Centi {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let (whole, part) = (self.0.unsigned_abs() / 100, self.0.unsigned_abs() % 100);
        if part % 10 == 0 {
            write!(f, "{sign}{whole}.{}", part / 10)
        } else {
            write!(f, "{sign}{whole}.{part:02}")
        }
    }
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Layout(w) => write!(f, "layout: {w}"),
            Self::Figure(w) => write!(f, "figure: {w}"),
            Self::SetpointOutsideMap {
                map_centi: [map_lo, map_hi],
                site_centi: [site_lo, site_hi],
            } => write!(
                f,
                "cdu: the register map takes supply_setpoint {} to {} °C, the site's setpoints \
                 run from {} °C (the lowest its dew point allows) to {} °C: no range of \
                 setpoints meets both",
                Centi(*map_lo),
                Centi(*map_hi),
                Centi(*site_lo),
                Centi(*site_hi)
            ),
        }
    }
}

impl CoreConfig {
    /// Checks the figures the core divides by or plans with.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let l = &self.layout;
        if l.racks == 0 || l.hosts_per_rack == 0 || l.gpus_per_host == 0 {
            return Err(ConfigError::Layout(
                "racks, hosts_per_rack and gpus_per_host must be at least 1",
            ));
        }
        if l.racks as usize > super::MAX_RACKS {
            return Err(ConfigError::Layout("more racks than the core holds (16)"));
        }
        if l.hosts() > super::MAX_HOSTS {
            return Err(ConfigError::Layout("more hosts than the core holds (128)"));
        }
        let g = &self.gpu;
        if !(g.min_cap_w > 0.0 && g.min_cap_w <= g.tdp_w && g.static_w < g.tdp_w) {
            return Err(ConfigError::Figure(
                "gpu: need 0 < min_cap_w <= tdp_w and static_w < tdp_w",
            ));
        }
        if g.r_cp.windows(2).any(|w| w[1][0] <= w[0][0]) || g.r_cp.iter().any(|p| p[1] <= 0.0) {
            return Err(ConfigError::Figure(
                "gpu.r_cp: flows must rise and resistances be positive",
            ));
        }
        let c = &self.cdu;
        if c.min_setpoint_c >= c.max_setpoint_c {
            return Err(ConfigError::Figure(
                "cdu: min_setpoint_c must be below max_setpoint_c",
            ));
        }
        if !(c.min_speed > 0.0 && c.min_speed <= 1.0) || c.design_lpm_per_gpu <= 0.0 {
            return Err(ConfigError::Figure(
                "cdu: min_speed in (0, 1] and a positive design flow",
            ));
        }
        if c.design_dp_kpa <= 0.0 {
            return Err(ConfigError::Figure(
                "cdu: the design differential pressure must be positive",
            ));
        }
        // `>> 16` would overflow a u16: a mask of the racks on the loop.
        if l.unprotected & !crate::safety::all_racks(usize::from(l.racks)) != 0 {
            return Err(ConfigError::Layout(
                "an unprotected rack is not on the loop",
            ));
        }
        if c.cp_j_per_kg_k <= 0.0 || c.density_kg_per_m3 <= 0.0 {
            return Err(ConfigError::Figure(
                "cdu: coolant cp and density must be positive",
            ));
        }
        let f = &self.facility;
        if f.water_kg_per_s <= 0.0 || f.water_cp_j_per_kg_k <= 0.0 || f.cop_max <= 0.0 {
            return Err(ConfigError::Figure(
                "facility: water flow, its cp and cop_max must be positive",
            ));
        }
        let m = &self.margins;
        if m.plan_ceiling_c >= g.max_operating_c || m.cap_target_c >= g.max_operating_c {
            return Err(ConfigError::Figure("margins: plan ceiling and cap target must be below the GPU's max operating temperature"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unprotected_racks_are_checked_against_the_loop_up_to_sixteen_racks() {
        let mut cfg = CoreConfig::default();
        cfg.layout.racks = 16;
        cfg.layout.hosts_per_rack = 8;
        cfg.layout.unprotected = 1 << 15;
        assert_eq!(cfg.validate(), Ok(()), "rack 15 of 16");
        cfg.layout.racks = 3;
        cfg.layout.unprotected = 1 << 5;
        assert_eq!(
            cfg.validate(),
            Err(ConfigError::Layout(
                "an unprotected rack is not on the loop"
            ))
        );
    }
}
