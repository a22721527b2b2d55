//! The reference hall's figures, written once: a hall of 4 racks of 4
//! hosts of 8 H200-class GPUs on one CDU, with a dry cooler and a trim
//! chiller (`docs/plant-model.md`, which gives each figure's source).
//!
//! The control core's default configuration ([`crate::config::CoreConfig`])
//! and the simulated plant's default site (`loopwarden-boards`'s
//! `SiteConfig`) both take them from here, so the controller and the hall
//! it is tested against start from the same figures. They are `f64`, as
//! the plant computes; the core narrows them to its `f32`.
//!
//! Glossary:
//! - *reference hall*: the hall every default describes; a site's TOML
//!   overrides any figure.

/// The hall's layout.
pub mod layout {
    /// Racks on the CDU.
    pub const RACKS: u8 = 4;
    /// Hosts per rack.
    pub const HOSTS_PER_RACK: u8 = 4;
    /// GPUs per host.
    pub const GPUS_PER_HOST: u8 = 8;
    /// CDUs on the facility water.
    pub const CDUS: u8 = 1;
}

/// One GPU (`docs/plant-model.md` §2).
pub mod gpu {
    /// Default power limit, W.
    pub const TDP_W: f64 = 700.0;
    /// Lowest settable power limit, W.
    pub const MIN_CAP_W: f64 = 200.0;
    /// Static power at 50 °C, W.
    pub const STATIC_W: f64 = 90.0;
    /// Leakage growth per K above 50 °C, fraction of the static power.
    pub const LEAK_PER_K: f64 = 0.015;
    /// Junction to cold-plate case, K/W.
    pub const R_JC_K_PER_W: f64 = 0.022;
    /// Cold plate, case to coolant, by flow per GPU: `[L/min, K/W]`.
    pub const R_CP: [[f64; 2]; 6] = [
        [0.4, 0.0389],
        [0.6, 0.0300],
        [1.0, 0.0245],
        [1.4, 0.0220],
        [2.0, 0.0204],
        [2.4, 0.0197],
    ];
    /// Highest operating temperature, °C.
    pub const MAX_OPERATING_C: f64 = 87.0;
}

/// A host besides its GPUs.
pub mod host {
    /// At full load, W.
    pub const FULL_W: f64 = 1200.0;
    /// Idle, W.
    pub const IDLE_W: f64 = 500.0;
}

/// The secondary loop and the CDU (`docs/plant-model.md` §3).
pub mod cdu {
    /// Flow per GPU at 100 % pump speed, L/min.
    pub const DESIGN_LPM_PER_GPU: f64 = 1.5;
    /// Lowest pump speed, fraction.
    pub const MIN_SPEED: f64 = 0.3;
    /// Electrical power of the running pump at 100 %, W.
    pub const PUMP_MAX_W: f64 = 1400.0;
    /// Heat exchanger approach, K.
    pub const APPROACH_K: f64 = 3.0;
    /// Highest supply setpoint the CDU accepts, °C.
    pub const MAX_SETPOINT_C: f64 = 45.0;
    /// Coolant specific heat, J/(kg·K).
    pub const CP_J_PER_KG_K: f64 = 3900.0;
    /// Coolant density, kg/m³.
    pub const DENSITY_KG_PER_M3: f64 = 1030.0;
    /// Loop differential pressure with the pump at full speed, kPa.
    pub const DESIGN_DP_KPA: f64 = 100.0;
}

/// The facility's heat rejection (`docs/plant-model.md` §4).
pub mod facility {
    /// Facility water flow, kg/s.
    pub const WATER_KG_PER_S: f64 = 6.0;
    /// Facility water specific heat, J/(kg·K).
    pub const WATER_CP_J_PER_KG_K: f64 = 4180.0;
    /// Dry cooler conductance at full fans, W/K.
    pub const DRY_COOLER_UA_W_PER_K: f64 = 12_000.0;
    /// Dry cooler fans at 100 %, W.
    pub const FAN_MAX_W: f64 = 4500.0;
    /// The dry cooler cannot cool below ambient plus this, K.
    pub const PINCH_K: f64 = 2.0;
    /// Trim chiller capacity, W of heat.
    pub const CHILLER_MAX_W: f64 = 160_000.0;
    /// Highest chiller COP.
    pub const COP_MAX: f64 = 8.0;
    /// Chiller COP as a fraction of Carnot's.
    pub const CARNOT_FRACTION: f64 = 0.5;
    /// Facility pumps, W.
    pub const PUMPS_W: f64 = 1500.0;
    /// Distribution losses, fraction of IT power.
    pub const DISTRIBUTION_LOSS: f64 = 0.03;
    /// Fixed loads, W.
    pub const FIXED_W: f64 = 2000.0;
}
