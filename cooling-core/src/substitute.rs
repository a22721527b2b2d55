//! Substitutes for lost sensors: when a required sensor stands under a
//! fault, the loops run on what the others imply, and the core degrades
//! instead of falling back to failsafe. Failsafe is kept for when no
//! estimate can be trusted.
//!
//! - **supply**: the GPUs' word, `T_hot − P̄ · R(q) · k_h` (median over
//!   loaded hosts; [`Seen::gpu_implied_supply`]), else the heat balance
//!   `T_r − IT / (ṁ · c_p)` on a trusted return and flow;
//! - **return**: the heat balance the other way, `T_s + IT / (ṁ · c_p)`;
//! - **flow**: the pump's learned curve, `q_full · n · GPUs`, while a pump
//!   reads running.
//!
//! Glossary:
//! - *estimated*: a reading the loops use that no sensor gave.

use super::config::CoreConfig;
use super::sensors::Trusted;
use super::view::Seen;

/// Which readings are estimates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Estimated {
    /// The supply temperature.
    pub supply: bool,
    /// The return temperature.
    pub return_c: bool,
    /// The flow.
    pub flow: bool,
}

impl Estimated {
    /// Any reading is an estimate.
    pub fn any(&self) -> bool {
        self.supply || self.return_c || self.flow
    }
}

/// What fills the gaps: the hall `seen`, the pump's learned flow per GPU
/// at full speed `flow_full_per_gpu` (L/min), the pump `speed` and
/// whether a pump is `pumping`.
#[derive(Debug, Clone, Copy)]
pub struct Sources<'a> {
    /// The configuration.
    pub cfg: &'a CoreConfig,
    /// The hall this step.
    pub seen: &'a Seen,
    /// Litres per minute per GPU at full speed.
    pub flow_full_per_gpu: f32,
    /// The pump speed the CDU runs, fraction.
    pub speed: f32,
    /// A pump reads running.
    pub pumping: bool,
}

/// Heat carried per kelvin by `flow_lpm` of coolant, W/K.
fn capacity_w_per_k(cfg: &CoreConfig, flow_lpm: f32) -> f32 {
    flow_lpm * cfg.cdu.density_kg_per_m3 / 60_000.0 * cfg.cdu.cp_j_per_kg_k
}

/// `trusted` with each missing required reading replaced by an estimate
/// where one can be made, and which were.
pub fn fill(mut trusted: Trusted, src: &Sources<'_>) -> (Trusted, Estimated) {
    let mut est = Estimated::default();
    let cfg = src.cfg;
    if trusted.flow.is_none() && src.pumping {
        trusted.flow = Some(src.flow_full_per_gpu * src.speed * cfg.layout.gpus() as f32);
        est.flow = true;
    }
    let heat = src.seen.it_w;
    let per_k = trusted
        .flow
        .map(|f| capacity_w_per_k(cfg, f))
        .filter(|c| *c > 1.0);
    if trusted.supply.is_none() {
        let balance = match (trusted.return_c, heat, per_k, est.flow) {
            (Some(r), Some(q), Some(c), false) => Some(r - q / c),
            _ => None,
        };
        trusted.supply = src.seen.gpu_implied_supply.or(balance);
        est.supply = trusted.supply.is_some();
    }
    if trusted.return_c.is_none() {
        if let (Some(s), Some(q), Some(c)) = (trusted.supply, heat, per_k) {
            trusted.return_c = Some(s + q / c);
            est.return_c = true;
        }
    }
    trusted.estimated = est;
    (trusted, est)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What fills the gaps on the default hall: the hall `seen`, the
    /// pump's curve, its speed and whether it pumps.
    fn sources<'a>(
        cfg: &'a CoreConfig,
        seen: &'a Seen,
        flow_full_per_gpu: f32,
        speed: f32,
    ) -> Sources<'a> {
        Sources {
            cfg,
            seen,
            flow_full_per_gpu,
            speed,
            pumping: true,
        }
    }

    fn seen(implied: Option<f32>) -> Seen {
        Seen {
            it_w: Some(100_000.0),
            transient: false,
            r_now: 0.045,
            hottest: Some(70.0),
            gpu_implied_supply: implied,
        }
    }

    #[test]
    fn a_lost_supply_is_the_gpus_word_else_the_heat_balance() {
        let cfg = CoreConfig::default();
        let trusted = Trusted {
            supply: None,
            flow: Some(192.0),
            return_c: Some(45.0),
            estimated: Estimated::default(),
        };
        let s = seen(Some(37.5));
        let src = sources(&cfg, &s, 1.5, 1.0);
        let (t, e) = fill(trusted, &src);
        assert_eq!((t.supply, e.supply), (Some(37.5), true));
        // No loaded GPU speaks: 100 kW over 192 L/min of PG25 is 7.7 K.
        let s = seen(None);
        let (t, e) = fill(trusted, &Sources { seen: &s, ..src });
        let c = 192.0 * 1030.0 / 60_000.0 * 3900.0;
        assert!((t.supply.unwrap() - (45.0 - 100_000.0 / c)).abs() < 1e-3);
        assert!(e.supply && !e.flow && !e.return_c);
    }

    #[test]
    fn a_lost_flow_is_the_pump_curve_and_nothing_without_a_pump() {
        let cfg = CoreConfig::default();
        let trusted = Trusted {
            supply: Some(35.0),
            flow: None,
            return_c: Some(43.0),
            estimated: Estimated::default(),
        };
        let s = seen(Some(35.0));
        let src = sources(&cfg, &s, 1.4, 0.5);
        let (t, e) = fill(trusted, &src);
        assert!((t.flow.unwrap() - 1.4 * 0.5 * 128.0).abs() < 1e-3);
        assert!(e.flow && !e.supply);
        let (t, e) = fill(
            trusted,
            &Sources {
                pumping: false,
                ..src
            },
        );
        assert_eq!((t.flow, e.any()), (None, false));
    }

    #[test]
    fn nothing_to_estimate_from_leaves_the_gap() {
        let cfg = CoreConfig::default();
        let trusted = Trusted {
            supply: None,
            flow: Some(150.0),
            return_c: None,
            estimated: Estimated::default(),
        };
        let s = seen(None);
        let src = sources(&cfg, &s, 1.5, 1.0);
        let (t, e) = fill(trusted, &src);
        assert_eq!((t.supply, t.return_c, e.any()), (None, None, false));
    }
}
