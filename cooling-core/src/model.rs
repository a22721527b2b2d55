//! The hall at steady state, as the optimiser and the cap sizing see it:
//! a GPU's junction temperature and power for a coolant temperature and a
//! flow, and the facility power it takes to reject a heat load at a
//! setpoint. Plain arithmetic on the figures of [`CoreConfig`], no state.
//!
//! Glossary:
//! - *dynamic power*: what a GPU's work draws above its static power.
//! - *facility water*: the primary loop between the CDU's heat exchanger
//!   and the dry cooler and chiller.

use super::config::{CoreConfig, FacilityParams, GpuParams};

/// Cold-plate resistance at `q` L/min per GPU (piecewise linear, clamped).
pub fn r_cold_plate(g: &GpuParams, q: f32) -> f32 {
    let t = &g.r_cp;
    if q <= t[0][0] {
        return t[0][1];
    }
    for w in t.windows(2) {
        let ([q0, r0], [q1, r1]) = (w[0], w[1]);
        if q <= q1 {
            return r0 + (r1 - r0) * (q - q0) / (q1 - q0);
        }
    }
    t[t.len() - 1][1]
}

/// Static power at `t_j`, W.
pub fn static_power(g: &GpuParams, t_j: f32) -> f32 {
    g.static_w * (1.0 + g.leak_per_k * (t_j - 50.0))
}

/// One GPU at steady state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuPoint {
    /// Junction temperature, °C.
    pub t_j: f32,
    /// Power, W.
    pub power_w: f32,
    /// Work rate, 0..1.
    pub work: f32,
}

/// A GPU with `dynamic_w` of demand under `limit_w`, its coolant at `t_in`
/// through a total resistance `r` (junction to coolant, K/W).
pub fn gpu_steady(g: &GpuParams, t_in: f32, r: f32, dynamic_w: f32, limit_w: f32) -> GpuPoint {
    // Static power is linear in T: P_s = a + b·T.
    let b = g.static_w * g.leak_per_k;
    let a = g.static_w - 50.0 * b;
    let full_dynamic = (g.tdp_w - g.static_w).max(1.0);
    let denom = (1.0 - r * b).max(0.05);
    let t_j = (t_in + r * (a + dynamic_w)) / denom;
    let p = a + b * t_j + dynamic_w;
    if p <= limit_w {
        return GpuPoint {
            t_j,
            power_w: p,
            work: dynamic_w / full_dynamic,
        };
    }
    // Clocks drop to fit the limit.
    let t_j = t_in + r * limit_w;
    let p_s = static_power(g, t_j);
    GpuPoint {
        t_j,
        power_w: limit_w,
        work: (limit_w - p_s).max(0.0) / full_dynamic,
    }
}

/// The facility side at steady state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rejection {
    /// Dry cooler fans, W.
    pub fans_w: f32,
    /// Chiller, W (electrical).
    pub chiller_w: f32,
    /// Heat neither can take, W (above zero: the setpoint cannot be held).
    pub short_w: f32,
}

/// Chiller COP at facility water `t_fw` and outdoor `t_amb` (°C).
pub fn cop(f: &FacilityParams, t_fw: f32, t_amb: f32) -> f32 {
    let lift = t_amb + 10.0 - t_fw;
    if lift <= 0.0 {
        return f.cop_max;
    }
    (f.carnot_fraction * (t_fw + 273.15) / lift).clamp(0.5, f.cop_max)
}

/// What rejecting `heat_w` costs with the supply at `setpoint_c` and the
/// outdoor air at `ambient_c`.
pub fn rejection(cfg: &CoreConfig, setpoint_c: f32, ambient_c: f32, heat_w: f32) -> Rejection {
    rejection_at(cfg, setpoint_c - cfg.cdu.approach_k, ambient_c, heat_w)
}

/// What rejecting `heat_w` costs with the facility water at `t_fw` and the
/// outdoor air at `ambient_c`.
pub fn rejection_at(cfg: &CoreConfig, t_fw: f32, ambient_c: f32, heat_w: f32) -> Rejection {
    let f = &cfg.facility;
    let t_fwr = t_fw + heat_w / (f.water_kg_per_s * f.water_cp_j_per_kg_k);
    let drive = (t_fwr - ambient_c - f.pinch_k).max(0.0);
    let dc_max = f.dry_cooler_ua_w_per_k * drive;
    let q_dc = heat_w.min(dc_max);
    let frac = if dc_max > 0.0 { q_dc / dc_max } else { 0.0 };
    let rest = heat_w - q_dc;
    let q_ch = rest.min(f.chiller_max_w);
    Rejection {
        fans_w: f.fan_max_w * frac * frac * frac,
        chiller_w: q_ch / cop(f, t_fw, ambient_c),
        short_w: rest - q_ch,
    }
}

/// Flow per GPU at pump speed `speed` with `open_gpus` of `all_gpus`
/// GPUs on open racks, L/min.
pub fn flow_per_gpu(cfg: &CoreConfig, speed: f32, open_gpus: usize) -> f32 {
    if open_gpus == 0 {
        return 0.0;
    }
    cfg.cdu.design_lpm_per_gpu * speed * cfg.layout.gpus() as f32 / open_gpus as f32
}

/// Facility power besides the heat rejection, for `it_w` of IT and one
/// pump at `speed`.
pub fn facility_w(cfg: &CoreConfig, it_w: f32, speed: f32, rej: &Rejection) -> f32 {
    let f = &cfg.facility;
    let pump = cfg.cdu.pump_max_w * speed * speed * speed;
    it_w * (1.0 + f.distribution_loss) + pump + rej.fans_w + rej.chiller_w + f.pumps_w + f.fixed_w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f32, b: f32, tol: f32) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn a_full_gpu_on_45_c_water_runs_near_76_c_as_the_calibration_says() {
        let cfg = CoreConfig::default();
        let g = &cfg.gpu;
        // 1.5 L/min: R_cp between 1.4 and 2.0.
        let r = g.r_jc_k_per_w + r_cold_plate(g, 1.5);
        let p = gpu_steady(g, 45.0, r, g.tdp_w - g.static_w, g.tdp_w);
        // Demand is 610 W dynamic plus static above 90 W at 76 °C: the
        // 700 W limit binds, so T = 45 + 700·R.
        assert!(close(p.power_w, 700.0, 1e-3), "{p:?}");
        assert!(close(p.t_j, 45.0 + 700.0 * r, 1e-3));
        assert!(p.t_j > 74.0 && p.t_j < 78.0, "{p:?}");
        assert!(p.work < 1.0 && p.work > 0.9);
    }

    #[test]
    fn below_the_limit_the_fixed_point_holds() {
        let cfg = CoreConfig::default();
        let g = &cfg.gpu;
        let r = 0.045;
        let p = gpu_steady(g, 30.0, r, 300.0, g.tdp_w);
        // T = T_in + R·(P_s(T) + P_d), solved exactly.
        let back = 30.0 + r * (static_power(g, p.t_j) + 300.0);
        assert!(close(p.t_j, back, 1e-3), "{p:?} {back}");
        assert!(close(p.work, 300.0 / 610.0, 1e-6));
    }

    #[test]
    fn cold_water_on_a_hot_day_needs_the_chiller_and_warm_water_does_not() {
        let cfg = CoreConfig::default();
        let cold = rejection(&cfg, 18.0, 30.0, 100_000.0);
        let warm = rejection(&cfg, 45.0, 30.0, 100_000.0);
        assert!(cold.chiller_w > 10_000.0, "{cold:?}");
        assert_eq!(warm.chiller_w, 0.0, "{warm:?}");
        assert!(warm.fans_w > 0.0 && warm.fans_w < cfg.facility.fan_max_w);
        assert_eq!((cold.short_w, warm.short_w), (0.0, 0.0));
        // Beyond the chiller's capacity the rest is short.
        let hot = rejection(&cfg, 20.0, 45.0, 200_000.0);
        assert!(close(hot.short_w, 40_000.0, 1.0), "{hot:?}");
    }

    #[test]
    fn resistance_is_clamped_at_both_ends_and_linear_between() {
        let g = CoreConfig::default().gpu;
        assert_eq!(r_cold_plate(&g, 0.1), 0.0389);
        assert_eq!(r_cold_plate(&g, 9.0), 0.0197);
        assert!(close(r_cold_plate(&g, 0.8), 0.02725, 1e-6));
    }
}
