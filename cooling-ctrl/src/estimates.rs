//! What the control core has learned of its hall, in the figures people
//! read: the console's table (`ctl loops`), `/metrics` and the CDU
//! telemetry's `learned` all take them from here, so the three agree.
//!
//! Each plant figure is shown three ways: as *configured* (the site's
//! figure), as *estimated* (`Core::learned`) and as *used* now by the
//! optimiser (`Core::believed`: the estimate blended in by its trust, or
//! taken at once where it is the more cautious), with its *confidence*
//! and *trust* (0 to 1).
//!
//! Glossary:
//! - *ratio*: an estimate over its configured figure (1: as configured).
//! - *learned from*: a host the estimator has been fed for (a host never
//!   loaded keeps its configured factor 1 and does not count, as in
//!   `Core::believed`'s plan ceiling).

use cooling_core::estimate::{facility, Scalar};
use cooling_core::{Core, CoreConfig, Learned};
use loopwarden_protocol::message::{FigureEstimate, HallEstimates};
use loopwarden_protocol::units::{LitresPerMinute, Percent};
use loopwarden_protocol::Ident;

use cooling_core::estimate::{APPROACH_CONFIDENCE, FLOW_CONFIDENCE, HOST_CONFIDENCE};

/// The estimator's state after a step, as the shell copies it out.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimates {
    /// What has been learned.
    pub learned: Learned,
    /// The configuration.
    pub configured: CoreConfig,
    /// The plant as the optimiser believes it now (the plan ceiling in
    /// force included).
    pub believed: CoreConfig,
    /// The outdoor temperature planned with, °C.
    pub outdoor_c: f32,
    /// It is the configured fallback: no outdoor sensor reads (an alarm).
    pub outdoor_fallback: bool,
}

/// One plant figure, configured, estimated and used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figure {
    /// Its name in labels and JSON (`dry_cooler_ua`).
    pub key: &'static str,
    /// Its name in words.
    pub name: &'static str,
    /// Its unit (empty: none).
    pub unit: &'static str,
    /// As configured.
    pub configured: f32,
    /// As estimated.
    pub estimated: f32,
    /// As the optimiser uses it now.
    pub used: f32,
    /// How well the data pins it down, 0 to 1.
    pub confidence: f32,
    /// How far the optimiser follows it, 0 to 1.
    pub trust: f32,
}

impl Figure {
    /// The estimate over the configured figure.
    pub fn ratio(&self) -> f32 {
        if self.configured.abs() > f32::EPSILON {
            self.estimated / self.configured
        } else {
            1.0
        }
    }
}

/// One host's thermal factor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostFigure {
    /// As estimated (1: as the configured model).
    pub factor: f32,
    /// As the optimiser plans the host with it now.
    pub used: f32,
    /// How well the data pins it down, 0 to 1.
    pub confidence: f32,
    /// How far the optimiser follows it, 0 to 1.
    pub trust: f32,
    /// Seconds it has been learned from.
    pub learned_s: f32,
}

/// The facility figures that are ratios of a configured figure, with
/// their index in the facility filter's state, in the order of
/// [`Estimates::figures`].
pub const FACILITY_RATIOS: [(&str, usize); 3] =
    [("dry_cooler_ua", 0), ("chiller_cop", 1), ("pump_power", 2)];

/// A filtered figure `s` as a [`Figure`], its confidence judged over
/// `settle` s against a spread of `spread`.
fn filtered(
    s: &Scalar,
    key: &'static str,
    name: &'static str,
    unit: &'static str,
    configured: f32,
    used: f32,
    (settle, spread): (f32, f32),
) -> Figure {
    Figure {
        key,
        name,
        unit,
        configured,
        estimated: s.value,
        used,
        confidence: s.confidence(settle, spread),
        trust: s.trust,
    }
}

impl Estimates {
    /// `core`'s, after its last step.
    pub fn of(core: &Core) -> Self {
        let (outdoor_c, outdoor_fallback) = core.outdoor();
        Self {
            learned: core.learned(),
            configured: *core.config(),
            believed: core.believed(),
            outdoor_c,
            outdoor_fallback,
        }
    }

    /// The plant's figures besides the hosts': the facility filter's
    /// (dry cooler UA, chiller Carnot fraction, pump power at full
    /// speed, fixed loads), then the pump's flow and the CDU's approach.
    pub fn figures(&self) -> [Figure; 6] {
        let (c, b, l) = (&self.configured, &self.believed, &self.learned);
        // The filter's state on the configuration, as the core applies it.
        let e = &facility::apply(c, &l.facility.theta, &[1.0; facility::N]);
        let conf = l.facility.confidence();
        let trust = l.facility_trust;
        let fig = |cfg: &CoreConfig, i: usize| match i {
            0 => cfg.facility.dry_cooler_ua_w_per_k,
            1 => cfg.facility.carnot_fraction,
            2 => cfg.cdu.pump_max_w,
            _ => cfg.facility.fixed_w,
        };
        let facility = |i: usize, key, name, unit| Figure {
            key,
            name,
            unit,
            configured: fig(c, i),
            estimated: fig(e, i),
            used: fig(b, i),
            confidence: conf[i],
            trust: trust[i],
        };
        [
            facility(0, "dry_cooler_ua", "dry cooler UA", "W/K"),
            facility(1, "chiller_cop", "chiller COP (Carnot fraction)", ""),
            facility(2, "pump_power", "CDU pump power at full speed", "W"),
            facility(3, "fixed_loads", "fixed loads (facility meter offset)", "W"),
            filtered(
                &l.flow,
                "flow_per_gpu_full",
                "flow per GPU at full pump speed",
                "L/min",
                c.cdu.design_lpm_per_gpu,
                b.cdu.design_lpm_per_gpu,
                FLOW_CONFIDENCE,
            ),
            filtered(
                &l.approach,
                "approach",
                "CDU approach",
                "K",
                c.cdu.approach_k,
                b.cdu.approach_k,
                APPROACH_CONFIDENCE,
            ),
        ]
    }

    /// Host index `h`'s thermal factor.
    pub fn host(&self, h: usize) -> HostFigure {
        let s = self
            .learned
            .hosts
            .get(h)
            .copied()
            .unwrap_or(Scalar::at(1.0));
        HostFigure {
            factor: s.value,
            used: s.used(1.0, true),
            confidence: s.confidence(HOST_CONFIDENCE.0, HOST_CONFIDENCE.1),
            trust: s.trust,
            learned_s: s.fed_s,
        }
    }

    /// The plan ceiling in force, °C.
    pub fn plan_ceiling_c(&self) -> f32 {
        self.believed.margins.plan_ceiling_c
    }

    /// The summary the CDU telemetry carries, over the hosts named
    /// `hosts` (index order) that have been learned from.
    pub fn summary(&self, hosts: &[Ident]) -> HallEstimates {
        let learned: Vec<(&Ident, &Scalar)> = hosts
            .iter()
            .zip(&self.learned.hosts)
            .filter(|(_, s)| s.fed_s > 0.0)
            .collect();
        let min = learned.iter().map(|(_, s)| s.value).reduce(f32::min);
        let max = learned
            .iter()
            .copied()
            .reduce(|a, b| if b.1.value > a.1.value { b } else { a });
        let trust = learned.iter().map(|(_, s)| s.trust).reduce(f32::min);
        let figures = self.figures();
        let facility = |i: usize| {
            let f = &figures[i];
            FigureEstimate {
                ratio_permille: permille(f.ratio()),
                confidence_pct: pct(f.confidence),
                trust_pct: pct(f.trust),
            }
        };
        HallEstimates {
            host_factor_min_permille: permille(min.unwrap_or(1.0)),
            host_factor_max_permille: permille(max.map_or(1.0, |(_, s)| s.value)),
            host_factor_max_host: max.map(|(h, _)| h.clone()),
            host_trust_min_pct: pct(trust.unwrap_or(0.0)),
            dry_cooler_ua: facility(0),
            chiller_cop: facility(1),
            pump_power: facility(2),
            flow_per_gpu_full_lpm: LitresPerMinute::new(f64::from(self.learned.flow.value))
                .unwrap_or_default(),
            approach_centikelvin: (self.learned.approach.value * 100.0)
                .round()
                .clamp(0.0, f32::from(u16::MAX)) as u16,
            outdoor_fallback: self.outdoor_fallback,
        }
    }
}

/// `x` in thousandths, within a u16.
fn permille(x: f32) -> u16 {
    if x.is_finite() {
        (x * 1000.0).round().clamp(0.0, f32::from(u16::MAX)) as u16
    } else {
        0
    }
}

/// A share 0 to 1 in whole percent.
fn pct(x: f32) -> Percent {
    let p = if x.is_finite() {
        (x * 100.0).round().clamp(0.0, 100.0) as u8
    } else {
        0
    };
    Percent::new(p).unwrap_or(Percent::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Ident {
        Ident::new(s).unwrap()
    }

    #[test]
    fn figures_and_the_summary_say_what_was_learned_against_the_configuration() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let mut l = Learned::new(&cfg);
        l.hosts[1] = Scalar {
            value: 1.42,
            var: 0.0,
            fed_s: 3600.0,
            trust: 0.6,
        };
        l.hosts[2] = Scalar {
            value: 0.97,
            var: 0.0,
            fed_s: 3600.0,
            trust: 0.9,
        };
        l.facility.theta = [0.65f32.ln(), 0.0, 0.0, 500.0];
        l.facility_trust = [0.5, 0.0, 0.0, 0.0];
        core.restore_learned(&l).unwrap();
        let e = Estimates::of(&core);
        let f = e.figures();
        assert_eq!(f[0].key, "dry_cooler_ua");
        assert!((f[0].ratio() - 0.65).abs() < 1e-4, "{:?}", f[0]);
        // Followed half way (in ratio) by its trust.
        let ua = cfg.facility.dry_cooler_ua_w_per_k;
        assert!((f[0].used / ua - 0.65f32.sqrt()).abs() < 1e-3, "{:?}", f[0]);
        assert!((f[3].estimated - (cfg.facility.fixed_w + 500.0)).abs() < 1e-3);
        assert_eq!(f[4].estimated, cfg.cdu.design_lpm_per_gpu);
        // A host that runs hotter than configured is planned hot at once.
        assert_eq!(e.host(1).used, 1.42);
        // Hosts 0 and 3 were never learned from: they do not count.
        let hosts: Vec<Ident> = ["r0h0", "r0h1", "r0h2", "r0h3"].map(id).to_vec();
        let s = e.summary(&hosts);
        assert_eq!(
            (s.host_factor_min_permille, s.host_factor_max_permille),
            (970, 1420)
        );
        assert_eq!(s.host_factor_max_host, Some(id("r0h1")));
        assert_eq!(s.host_trust_min_pct.get(), 60);
        assert_eq!(s.dry_cooler_ua.ratio_permille, 650);
        assert_eq!(s.dry_cooler_ua.trust_pct.get(), 50);
        assert_eq!(s.chiller_cop.ratio_permille, 1000);
        assert_eq!(s.approach_centikelvin, (cfg.cdu.approach_k * 100.0) as u16);
        // A core that has read no outdoor temperature plans with the
        // fallback.
        assert!(s.outdoor_fallback);
        // No host learned from yet.
        let s = Estimates::of(&Core::new(cfg).unwrap()).summary(&hosts);
        assert_eq!(s.host_factor_max_host, None);
        assert_eq!(s.host_trust_min_pct.get(), 0);
    }
}
