//! The heat rejection plant as the facility meter shows it: an extended
//! Kalman filter on four figures the datasheets give and the plant may
//! not hold.
//!
//! The state is `θ = [ln a_ua, ln a_cop, ln a_pump, b]`: the dry cooler's
//! UA, the chiller's Carnot fraction and the CDU pump's power at full
//! speed as ratios to their configured values, and a constant `b` (W) for
//! what the model leaves out (fixed loads, meter offsets). The
//! measurement is the facility power meter; its prediction is the
//! model's facility power ([`model::facility_w`]) for the measured IT
//! power, pump speed, facility water and outdoor temperatures:
//!
//! ```text
//! P_fac = IT·(1 + d) + a_pump·P_pump·n³ + P_fan·f³ + Q_ch / (a_cop·COP) + P_fw + P_fix + b
//! f     = Q_dc / (a_ua·UA·Δ),  Δ = T_fwr − T_amb − pinch
//! ```
//!
//! Each update linearises the prediction by finite differences
//! (`H = ∂P_fac/∂θ`), rejects a sample whose innovation is beyond four
//! standard deviations (a chiller trip, a meter glitch), and adds a little
//! process noise so the figures may age. A figure the regime cannot show
//! (the chiller's COP while the chiller is off) keeps its value and its
//! variance grows back towards the prior: its confidence falls.
//!
//! Glossary:
//! - *ratio*: an estimate over its configured value (1: as configured).
//! - *confidence*: `1 − σ/σ₀`, the filter's standard deviation against the
//!   prior's, clamped to 0..1.

use super::super::config::{CoreConfig, FacilityParams};
use super::super::model;
use super::sqrt;

/// Figures the filter estimates.
pub const N: usize = 4;
/// Prior standard deviations: ln-ratios (about ×/÷ 1.5 for the dry cooler
/// and the chiller, ×/÷ 1.2 for the pump, whose curve is tested at the
/// factory) and the offset, W.
const SIGMA0: [f32; N] = [0.4, 0.4, 0.2, 500.0];
/// Process noise per update (variance): lets the figures age.
const Q: [f32; N] = [2e-6, 2e-6, 2e-6, 400.0];
/// Bounds of the state: ratios 1/3..3, offset ±20 kW.
const BOUND: [f32; N] = [1.0986, 1.0986, 1.0986, 20_000.0];
/// Rejected samples in a row that reopen the filter.
const RESET_AFTER: u32 = 4;
/// Finite-difference steps.
const DELTA: [f32; N] = [0.01, 0.01, 0.01, 10.0];

/// One steady sample of the plant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// IT power meter, W.
    pub it_w: f32,
    /// Pump speed, fraction (one pump running).
    pub speed: f32,
    /// Facility water supply, °C (measured).
    pub facility_c: f32,
    /// Outdoor air, °C (measured).
    pub outdoor_c: f32,
    /// Facility power meter, W.
    pub facility_w: f32,
}

/// The filter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FacilityFit {
    /// The state.
    pub theta: [f32; N],
    /// Its covariance.
    pub p: [[f32; N]; N],
    /// Samples taken.
    pub taken: u32,
    /// Samples rejected by the innovation gate.
    pub rejected: u32,
    /// Rejected in a row.
    pub in_a_row: u32,
    /// Samples still to be taken without the gate after a reopening.
    pub ungated: u32,
}

impl Default for FacilityFit {
    fn default() -> Self {
        Self::new()
    }
}

impl FacilityFit {
    /// Nothing fitted: the configured figures, each with its prior spread.
    pub const fn new() -> Self {
        let mut p = [[0.0; N]; N];
        let mut i = 0;
        while i < N {
            p[i][i] = SIGMA0[i] * SIGMA0[i];
            i += 1;
        }
        Self {
            theta: [0.0; N],
            p,
            taken: 0,
            rejected: 0,
            in_a_row: 0,
            ungated: 0,
        }
    }
}

/// `cfg` with the figures of `theta` applied, each weighted by `w`
/// (0: as configured, 1: as estimated).
pub fn apply(cfg: &CoreConfig, theta: &[f32; N], w: &[f32; N]) -> CoreConfig {
    let mut c = *cfg;
    let f: &mut FacilityParams = &mut c.facility;
    f.dry_cooler_ua_w_per_k *= libm_exp(w[0] * theta[0]);
    f.carnot_fraction *= libm_exp(w[1] * theta[1]);
    c.cdu.pump_max_w *= libm_exp(w[2] * theta[2]);
    c.facility.fixed_w += w[3] * theta[3];
    c
}

/// The model's facility power for sample `s` under `cfg`, W.
pub fn predict(cfg: &CoreConfig, s: &Sample) -> f32 {
    let rej = model::rejection_at(cfg, s.facility_c, s.outdoor_c, s.it_w);
    model::facility_w(cfg, s.it_w, s.speed, &rej)
}

impl FacilityFit {
    /// The figures' confidences, 0..1.
    pub fn confidence(&self) -> [f32; N] {
        core::array::from_fn(|i| {
            let sd = sqrt(self.p[i][i].max(0.0));
            (1.0f32 - sd / SIGMA0[i]).clamp(0.0, 1.0)
        })
    }

    /// One update on sample `s` against the configuration `cfg`; false
    /// when the gate rejected it.
    pub fn update(&mut self, cfg: &CoreConfig, s: &Sample) -> bool {
        let full = [1.0; N];
        let here = predict(&apply(cfg, &self.theta, &full), s);
        let mut h = [0.0f32; N];
        for (i, hi) in h.iter_mut().enumerate() {
            let mut th = self.theta;
            th[i] += DELTA[i];
            *hi = (predict(&apply(cfg, &th, &full), s) - here) / DELTA[i];
        }
        let y = s.facility_w - here;
        // Meter noise and what a steady-state model misses of a plant
        // that is never quite steady: 1 % of the reading and 1 kW.
        let r = (0.01 * s.facility_w) * (0.01 * s.facility_w) + 1000.0 * 1000.0;
        let ph: [f32; N] = core::array::from_fn(|i| (0..N).map(|j| self.p[i][j] * h[j]).sum());
        let s_var = (0..N).map(|i| h[i] * ph[i]).sum::<f32>() + r;
        if !(s_var.is_finite() && y.is_finite()) {
            return false;
        }
        self.taken = self.taken.saturating_add(1);
        let open = self.ungated > 0;
        self.ungated = self.ungated.saturating_sub(1);
        if y * y > 16.0 * s_var && !open {
            self.rejected = self.rejected.saturating_add(1);
            self.in_a_row = self.in_a_row.saturating_add(1);
            if self.in_a_row >= RESET_AFTER {
                // The plant has moved away from the state, or the state
                // was wrong: back to the prior's uncertainty, keeping
                // the values, so that the next samples can move them.
                for (i, (row, s0)) in self.p.iter_mut().zip(SIGMA0).enumerate() {
                    *row = [0.0; N];
                    row[i] = s0 * s0;
                }
                self.in_a_row = 0;
                // And believes the next few samples, far as they are:
                // the gate is for glitches, not for a plant that changed.
                self.ungated = RESET_AFTER;
            }
            self.age();
            return false;
        }
        self.in_a_row = 0;
        let k: [f32; N] = core::array::from_fn(|i| ph[i] / s_var);
        for ((th, k), b) in self.theta.iter_mut().zip(k).zip(BOUND) {
            *th = (*th + k * y).clamp(-b, b);
        }
        let mut p = self.p;
        for (i, row) in p.iter_mut().enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v -= k[i] * ph[j];
            }
        }
        // Keep it symmetric and its variances positive.
        #[allow(clippy::needless_range_loop)]
        for i in 0..N {
            for j in 0..i {
                let m = 0.5 * (p[i][j] + p[j][i]);
                p[i][j] = m;
                p[j][i] = m;
            }
            p[i][i] = p[i][i].max(1e-9);
        }
        self.p = p;
        self.age();
        true
    }

    /// Process noise: the figures may drift, and none is ever more
    /// uncertain than the prior.
    fn age(&mut self) {
        for i in 0..N {
            let cap = SIGMA0[i] * SIGMA0[i];
            self.p[i][i] = (self.p[i][i] + Q[i]).min(cap);
        }
    }
}

/// `e^x` for the small arguments of the ratios (|x| ≤ 1.1), no_std.
fn libm_exp(x: f32) -> f32 {
    // e^x = (e^(x/8))^8, the inner by its Taylor series to x⁵.
    let y = x / 8.0;
    let mut s = 1.0 + y * (1.0 + y / 2.0 * (1.0 + y / 3.0 * (1.0 + y / 4.0 * (1.0 + y / 5.0))));
    for _ in 0..3 {
        s *= s;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqrt_is_close() {
        for x in [0.0f32, 1e-9, 0.01, 0.5, 2.0, 9.0, 1.0e6, 3.3e9] {
            let want = (x as f64).sqrt();
            let got = sqrt(x) as f64;
            assert!(
                (got - want).abs() <= 1e-5 * want.max(1e-6),
                "{x}: {got} {want}"
            );
        }
    }

    #[test]
    fn exp_is_close_over_the_bounds() {
        for k in -22..=22 {
            let x = k as f32 * 0.05;
            let e = libm_exp(x) as f64;
            let want = (x as f64).exp();
            assert!((e - want).abs() / want < 1e-5, "{x}: {e} {want}");
        }
    }

    /// Samples taken: one every 30 s is about 8 hours.
    const N_SAMPLES: usize = 1000;

    /// Samples of a plant whose truth is `truth` over a day's spread of
    /// weather and load.
    fn samples(truth: &CoreConfig) -> std::vec::Vec<Sample> {
        let mut v = std::vec::Vec::new();
        for k in 0..N_SAMPLES {
            let t = k as f32;
            let outdoor = 28.0 + 10.0 * libm_sin(t / 37.0);
            let it = 80_000.0 + 25_000.0 * libm_sin(t / 11.0).abs();
            let speed = 0.6 + 0.3 * libm_sin(t / 7.0).abs();
            let facility_c = 26.0 + 8.0 * libm_sin(t / 23.0);
            let mut s = Sample {
                it_w: it,
                speed,
                facility_c,
                outdoor_c: outdoor,
                facility_w: 0.0,
            };
            s.facility_w = predict(truth, &s);
            v.push(s);
        }
        v
    }

    fn libm_sin(x: f32) -> f32 {
        (x as f64).sin() as f32
    }

    #[test]
    fn a_small_dry_cooler_and_a_weak_chiller_are_found() {
        let cfg = CoreConfig::default();
        let mut truth = cfg;
        truth.facility.dry_cooler_ua_w_per_k = 8_400.0;
        truth.facility.carnot_fraction = 0.35;
        let mut fit = FacilityFit::default();
        for s in samples(&truth) {
            fit.update(&cfg, &s);
        }
        let got = apply(&cfg, &fit.theta, &[1.0; N]);
        let ua = got.facility.dry_cooler_ua_w_per_k;
        let cf = got.facility.carnot_fraction;
        assert!((ua / 8_400.0 - 1.0).abs() < 0.05, "UA {ua}");
        assert!((cf / 0.35 - 1.0).abs() < 0.05, "Carnot fraction {cf}");
        let c = fit.confidence();
        assert!(c[0] > 0.8 && c[1] > 0.8, "{c:?}");
    }

    #[test]
    fn a_sample_far_from_the_model_is_rejected_and_moves_nothing() {
        let cfg = CoreConfig::default();
        let mut fit = FacilityFit::default();
        let mut s = samples(&cfg)[3];
        s.facility_w += 60_000.0;
        assert!(!fit.update(&cfg, &s));
        assert_eq!(fit.theta, [0.0; N]);
        assert_eq!(fit.rejected, 1);
    }
}
