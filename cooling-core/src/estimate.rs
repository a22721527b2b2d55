//! Online estimation: what the hall really is, learned from what it
//! measures, so that the optimiser plans on the plant and not on its
//! datasheets.
//!
//! Each estimate has a *confidence* (how well the data pins it down) and
//! a *trust* (how far the optimiser follows it): trust never exceeds the
//! confidence and rises at most `1/TRUST_RAMP_S` per second, so a new
//! estimate takes half an hour to take over from the configured figure.
//! Where an estimate is the more cautious (a host that runs hotter than
//! configured) it is used at once (a facility figure: as far as its
//! confidence); where it is the bolder, it is blended in by its trust.
//!
//! What is estimated, and from what:
//! - **each host's thermal factor** `k_h`: its hottest GPU's resistance to
//!   the supply over the model's at the flow now,
//!   `k_h = (T_hot − T_s) / (P̄ · (R_jc + R_cp(q)))`, filtered over two
//!   minutes rising and ten falling, in steady, loaded operation (a
//!   fouled cold plate, a worse TIM, a hotter GPU model all show as
//!   `k_h > 1`), its rate of rise planned [`RISE_LEAD_S`] ahead;
//! - **the pump's flow curve**: litres per minute per GPU at full speed,
//!   `flow / (n · GPUs)` (a clogged strainer, a smaller impeller);
//! - **the CDU's approach**: `T_s − T_fw` at steady state;
//! - **the dry cooler's UA, the chiller's Carnot fraction, the pump's
//!   power at full speed** and an offset, from the facility power meter,
//!   in [`facility`];
//! - **the outdoor temperature** is measured, not estimated: without a
//!   reading for `OUTDOOR_TIMEOUT_MS` the core plans for
//!   `design_ambient_c` and reports the sensor lost.
//!
//! The estimates persist ([`Learned`]) so that a restart does not throw
//! away hours of learning.
//!
//! Glossary:
//! - *steady*: no transient in the hall view, the supply within 1 K of
//!   its setpoint, heat rejection not short.
//! - *fed*: how long an estimate has been given samples (`fed_s`).

pub mod facility;
pub mod record;

use loopwarden_protocol::message::{Event, Sensor, SensorFault};

use super::config::CoreConfig;
use super::model;
use super::view::{Seen, Tick};
use super::{Log, MAX_HOSTS};
use facility::{FacilityFit, Sample};

/// Seconds for trust to rise from 0 to 1.
pub const TRUST_RAMP_S: f32 = 1800.0;
/// An outdoor temperature older than this is no reading, ms.
pub const OUTDOOR_TIMEOUT_MS: u64 = 60_000;
/// Seconds between two samples for the facility filter.
const FACILITY_EVERY_MS: u64 = 30_000;
/// Settling time (s) and relative spread a host factor's confidence is
/// judged by ([`Scalar::confidence`]).
pub const HOST_CONFIDENCE: (f32, f32) = (900.0, 0.1);
/// The same for the pump's flow per GPU.
pub const FLOW_CONFIDENCE: (f32, f32) = (600.0, 0.1);
/// The same for the CDU's approach.
pub const APPROACH_CONFIDENCE: (f32, f32) = (600.0, 0.5);
/// How far ahead a host's rising factor is planned for, s: a plate that
/// keeps fouling is met by water cooled for where it will be once the
/// search, the filter and the water have caught up (a search a minute,
/// the filter's two minutes, the loop's minutes).
pub const RISE_LEAD_S: f32 = 300.0;
/// Junction temperature the plan ceiling may rise to as the hosts'
/// factors are trusted, °C: 2.5 K below the GPUs' maximum operating
/// temperature and 1 K below the cap target, so that the caps have a
/// band to act in.
pub const TRUSTED_CEILING_C: f32 = 84.5;

/// One filtered figure with its spread, confidence and trust.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scalar {
    /// The estimate.
    pub value: f32,
    /// Filtered squared deviation of the samples from it.
    pub var: f32,
    /// Seconds fed.
    pub fed_s: f32,
    /// How far the optimiser follows it, 0..1.
    pub trust: f32,
}

impl Scalar {
    /// A figure starting at its configured value `v`.
    pub const fn at(v: f32) -> Self {
        Self {
            value: v,
            var: 0.0,
            fed_s: 0.0,
            trust: 0.0,
        }
    }

    /// Feeds sample `x` over `dt` s with time constant `tau_s`.
    pub fn feed(&mut self, x: f32, dt: f32, tau_s: f32) {
        if !x.is_finite() {
            return;
        }
        let a = (dt / tau_s).min(1.0);
        let d = x - self.value;
        self.value += a * d;
        self.var += a * (d * d - self.var);
        self.fed_s = (self.fed_s + dt).min(1.0e6);
    }

    /// Confidence 0..1: fed for `settle_s`, with a spread well below
    /// `spread` (relative to the value).
    pub fn confidence(&self, settle_s: f32, spread: f32) -> f32 {
        let fed = (self.fed_s / settle_s).min(1.0);
        let rel = sqrt(self.var.max(0.0)) / self.value.abs().max(1e-6);
        fed * (1.0f32 - rel / spread).clamp(0.0, 1.0)
    }

    /// Lets trust follow confidence `c` over `dt` s: down at once, up at
    /// most `dt / TRUST_RAMP_S`.
    pub fn trust_towards(&mut self, c: f32, dt: f32) {
        self.trust = ramp(self.trust, c, dt);
    }

    /// The figure the optimiser uses in place of `configured`: the
    /// estimate where it is the more cautious (`cautious_above`: a larger
    /// value is the cautious one), else blended in by trust.
    pub fn used(&self, configured: f32, cautious_above: bool) -> f32 {
        let cautious = if cautious_above {
            self.value > configured
        } else {
            self.value < configured
        };
        if cautious && self.fed_s >= 60.0 {
            self.value
        } else {
            configured + self.trust * (self.value - configured)
        }
    }
}

/// Square root of `x ≥ 0` (no_std): Newton's method from an exponent
/// halving first guess.
pub(crate) fn sqrt(x: f32) -> f32 {
    if x <= 0.0 || !x.is_finite() {
        return 0.0;
    }
    let mut y = f32::from_bits((x.to_bits() >> 1) + 0x1fc0_0000);
    for _ in 0..4 {
        y = 0.5 * (y + x / y);
    }
    y
}

fn ramp(trust: f32, c: f32, dt: f32) -> f32 {
    if c <= trust {
        c
    } else {
        (trust + dt / TRUST_RAMP_S).min(c)
    }
}

/// What the estimator keeps across a restart.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Learned {
    /// Each host's thermal factor.
    pub hosts: [Scalar; MAX_HOSTS],
    /// Litres per minute per GPU at full speed.
    pub flow: Scalar,
    /// The CDU's approach, K.
    pub approach: Scalar,
    /// The facility filter.
    pub facility: FacilityFit,
    /// The facility figures' trust.
    pub facility_trust: [f32; facility::N],
    /// Whose figures these are: kept with them, and what a kept record
    /// must match to be read back ([`record`]).
    pub ids: record::HostIds,
}

impl Learned {
    /// Nothing learned yet: everything as configured in `cfg`, its hosts
    /// known by index ([`record::HostIds::indices`]; a controller that
    /// knows their names sets [`Learned::ids`]).
    pub const fn new(cfg: &CoreConfig) -> Self {
        Self {
            hosts: [Scalar::at(1.0); MAX_HOSTS],
            flow: Scalar::at(cfg.cdu.design_lpm_per_gpu),
            approach: Scalar::at(cfg.cdu.approach_k),
            facility: FacilityFit::new(),
            facility_trust: [0.0; facility::N],
            ids: record::HostIds::indices(
                cfg.layout.racks as usize * cfg.layout.hosts_per_rack as usize,
            ),
        }
    }

    /// Every figure finite and within its bounds (a corrupt record is not
    /// restored).
    pub fn sane(&self) -> bool {
        let ok = |s: &Scalar, lo: f32, hi: f32| {
            (lo..=hi).contains(&s.value)
                && s.var.is_finite()
                && s.fed_s.is_finite()
                && (0.0..=1.0).contains(&s.trust)
        };
        self.hosts.iter().all(|h| ok(h, 0.3, 4.0))
            && ok(&self.flow, 0.01, 20.0)
            && ok(&self.approach, 0.0, 20.0)
            && self.facility.theta.iter().all(|v| v.is_finite())
            && self.facility.p.iter().flatten().all(|v| v.is_finite())
            && self.facility_trust.iter().all(|t| (0.0..=1.0).contains(t))
    }
}

/// The estimator.
#[derive(Debug, Clone, Copy)]
pub struct Estimator {
    learned: Learned,
    outdoor_at: Option<(f32, u64)>,
    outdoor_lost: bool,
    /// The last facility sample's time, facility water and IT power.
    facility_prev: Option<(u64, f32, f32)>,
    /// How fast each host's factor rises, per second (filtered over ten
    /// minutes; not kept across a restart).
    host_rate: [f32; MAX_HOSTS],
}

/// What the estimator is given besides the tick.
#[derive(Debug, Clone, Copy)]
pub struct Given {
    /// The supply, if a sensor is trusted, °C.
    pub supply: Option<f32>,
    /// The flow, if its sensor is trusted, L/min.
    pub flow: Option<f32>,
    /// The facility water supply, if trusted, °C.
    pub facility: Option<f32>,
    /// The pump speed the CDU runs, fraction.
    pub speed: f32,
    /// Exactly one pump moves water.
    pub one_pump: bool,
    /// The setpoint the CDU runs, °C.
    pub setpoint_c: f32,
    /// Heat rejection is believed short.
    pub short: bool,
    /// No sensor is under a fault or suspected of one: what the
    /// estimates learn from is sound.
    pub sensors_quiet: bool,
}

impl Estimator {
    /// Nothing learned: the configured figures.
    pub const fn new(cfg: &CoreConfig) -> Self {
        Self::from_learned(Learned::new(cfg))
    }

    /// Starts from what an earlier run learned.
    pub const fn from_learned(learned: Learned) -> Self {
        Self {
            learned,
            outdoor_at: None,
            outdoor_lost: false,
            facility_prev: None,
            host_rate: [0.0; MAX_HOSTS],
        }
    }

    /// What has been learned.
    pub fn learned(&self) -> &Learned {
        &self.learned
    }

    /// Host `h`'s thermal factor as estimated (for judging sensors and
    /// reading the GPUs: the best estimate, not the trusted one).
    pub fn factor(&self, h: usize) -> f32 {
        self.learned.hosts.get(h).map_or(1.0, |s| s.value)
    }

    /// Host `h`'s thermal factor the optimiser plans with.
    pub fn factor_used(&self, h: usize) -> f32 {
        let rising = self.host_rate.get(h).map_or(0.0, |r| r.max(0.0));
        self.learned
            .hosts
            .get(h)
            .map_or(1.0, |s| s.used(1.0, true) + rising * RISE_LEAD_S)
    }

    /// Litres per minute per GPU at full speed, as estimated.
    pub fn flow_per_gpu_full(&self) -> f32 {
        self.learned.flow.value
    }

    /// The outdoor temperature to plan with, °C, and whether it is the
    /// configured fallback.
    pub fn outdoor(&self, cfg: &CoreConfig) -> (f32, bool) {
        match self.outdoor_at {
            Some((v, _)) if !self.outdoor_lost => (v, false),
            _ => (cfg.margins.design_ambient_c, true),
        }
    }

    /// `cfg` as the optimiser should believe it: the plant's figures
    /// where they are trusted, and the plan ceiling raised by the least
    /// trusted loaded host's trust (`hosts`: which hosts count) times
    /// the distance from the configured ceiling `base_ceiling_c` to
    /// [`TRUSTED_CEILING_C`] (a ceiling the BMS tightened stays as much
    /// tighter).
    pub fn believed(
        &self,
        cfg: &CoreConfig,
        hosts: &dyn Fn(usize) -> bool,
        base_ceiling_c: f32,
    ) -> CoreConfig {
        let l = &self.learned;
        // The trust ramp holds back a bold figure (a bigger dry cooler, a
        // better chiller, a cheaper pump); a cautious one is used as far
        // as the data pins it down.
        let conf = l.facility.confidence();
        let th = &l.facility.theta;
        let cautious = [th[0] < 0.0, th[1] < 0.0, th[2] > 0.0, th[3] > 0.0];
        let w: [f32; facility::N] = core::array::from_fn(|i| {
            if cautious[i] {
                conf[i].max(l.facility_trust[i])
            } else {
                l.facility_trust[i]
            }
        });
        let mut c = facility::apply(cfg, th, &w);
        c.cdu.design_lpm_per_gpu = l.flow.used(cfg.cdu.design_lpm_per_gpu, false);
        c.cdu.approach_k = l.approach.used(cfg.cdu.approach_k, true);
        let trust = self.hosts_trust(cfg, hosts);
        c.margins.plan_ceiling_c += trust * (TRUSTED_CEILING_C - base_ceiling_c).max(0.0);
        c
    }

    /// The least trust among the hosts that count (`hosts`); 0 when none
    /// does.
    pub fn hosts_trust(&self, cfg: &CoreConfig, hosts: &dyn Fn(usize) -> bool) -> f32 {
        (0..cfg.layout.hosts())
            .filter(|h| hosts(*h))
            .map(|h| self.learned.hosts[h].trust)
            .reduce(f32::min)
            .unwrap_or(0.0)
    }

    /// What the supply sensor is judged against: the GPUs' word once
    /// their factors are trusted and two or more hosts are heard
    /// (`gpu_implied`; none while fewer than two of them are loaded),
    /// otherwise the facility water plus the CDU's
    /// approach (`facility`): the GPUs' word on an unlearned hall cannot
    /// tell a hotter hall from a supply sensor reading low. Not the
    /// facility water once the hosts are trusted: the CDU holds its supply
    /// while the facility water swings (a chiller staging, free cooling),
    /// and a learned approach judged against it would fault a true sensor
    /// in an idle hall.
    pub fn supply_expectation(
        &self,
        cfg: &CoreConfig,
        hosts: &dyn Fn(usize) -> bool,
        gpu_implied: Option<f32>,
        facility: Option<f32>,
    ) -> Option<f32> {
        // Fewer than two hosts heard is not an idle hall (the rest may run
        // unheard): the facility water judges then.
        let heard = (0..cfg.layout.hosts()).filter(|h| hosts(*h)).count();
        if heard >= 2 && self.hosts_trust(cfg, hosts) >= 0.5 {
            gpu_implied
        } else {
            facility.map(|fw| fw + self.learned.approach.value)
        }
    }

    /// Learns from step `t`.
    pub(crate) fn learn(&mut self, t: &Tick<'_>, seen: &Seen, g: &Given, log: &mut Log) {
        self.watch_outdoor(t, log);
        let steady = !seen.transient
            && g.sensors_quiet
            && !g.short
            && g.supply.is_some_and(|s| (s - g.setpoint_c).abs() < 1.0);
        if steady {
            self.learn_hosts(t, g);
            self.learn_loop(t, g);
            self.learn_facility(t, seen, g);
        }
        let dt = t.dt;
        let l = &mut self.learned;
        for s in l.hosts.iter_mut() {
            let c = s.confidence(HOST_CONFIDENCE.0, HOST_CONFIDENCE.1);
            s.trust_towards(c, dt);
        }
        let c = l.flow.confidence(FLOW_CONFIDENCE.0, FLOW_CONFIDENCE.1);
        l.flow.trust_towards(c, dt);
        let c = l
            .approach
            .confidence(APPROACH_CONFIDENCE.0, APPROACH_CONFIDENCE.1);
        l.approach.trust_towards(c, dt);
        let c = l.facility.confidence();
        for (tr, c) in l.facility_trust.iter_mut().zip(c) {
            *tr = ramp(*tr, c, dt);
        }
    }

    fn watch_outdoor(&mut self, t: &Tick<'_>, log: &mut Log) {
        if let Some(v) = t.inp.ambient_c.filter(|v| (-60.0..=70.0).contains(v)) {
            self.outdoor_at = Some((v, t.now));
        }
        let fresh = self
            .outdoor_at
            .is_some_and(|(_, at)| t.now.saturating_sub(at) < OUTDOOR_TIMEOUT_MS);
        // Without a reading from the start, the timeout counts from boot.
        let lost = !fresh && (self.outdoor_at.is_some() || t.now >= OUTDOOR_TIMEOUT_MS);
        if lost != self.outdoor_lost {
            self.outdoor_lost = lost;
            log.push(Event::SensorFault {
                sensor: Sensor::OutdoorTemp,
                rack: None,
                fault: if lost {
                    SensorFault::Lost
                } else {
                    SensorFault::Cleared
                },
            });
        }
    }

    fn learn_hosts(&mut self, t: &Tick<'_>, g: &Given) {
        let Some(s) = g.supply else { return };
        let cfg = &t.cfg;
        let q = model::flow_per_gpu(cfg, g.speed, t.open_gpus())
            .max(g.flow.map_or(0.0, |f| f / t.open_gpus().max(1) as f32));
        let r_model = cfg.gpu.r_jc_k_per_w + model::r_cold_plate(&cfg.gpu, q);
        for h in 0..cfg.layout.hosts() {
            if let Some(r) = t.fresh(h) {
                let p = r.gpu_power_w / r.gpus as f32;
                if p > 150.0 {
                    let k = ((r.hottest_c - s) / (p * r_model)).clamp(0.3, 4.0);
                    // A host getting hotter (a plate fouling) is
                    // followed in two minutes, one getting cooler in
                    // ten: the cautious side first.
                    let s = &mut self.learned.hosts[h];
                    let tau = if k > s.value { 120.0 } else { 600.0 };
                    let before = s.value;
                    s.feed(k, t.dt, tau);
                    if t.dt > 0.0 {
                        let rate = (s.value - before) / t.dt;
                        let r = &mut self.host_rate[h];
                        *r += (rate - *r) * (t.dt / 600.0).min(1.0);
                    }
                }
            }
        }
    }

    fn learn_loop(&mut self, t: &Tick<'_>, g: &Given) {
        let gpus = t.cfg.layout.gpus() as f32;
        if let (Some(f), true) = (g.flow, g.one_pump && g.speed > 0.2) {
            // Slowly, and within ±30 % of the datasheet: a flow meter
            // drifting for an hour is not taken for a worn pump.
            let d = t.cfg.cdu.design_lpm_per_gpu;
            let x = (f / (g.speed * gpus)).clamp(0.7 * d, 1.3 * d);
            self.learned.flow.feed(x, t.dt, 3600.0);
        }
        if let (Some(s), Some(fw)) = (g.supply, g.facility) {
            self.learned.approach.feed(s - fw, t.dt, 600.0);
        }
    }

    fn learn_facility(&mut self, t: &Tick<'_>, seen: &Seen, g: &Given) {
        let due = self
            .facility_prev
            .is_none_or(|(at, _, _)| t.now.saturating_sub(at) >= FACILITY_EVERY_MS);
        let (Some(it), Some(fw), Some(fac), false) = (
            seen.it_w,
            g.facility,
            t.inp.cdu.and_then(|c| c.facility_w),
            self.outdoor_lost,
        ) else {
            return;
        };
        let Some((outdoor, _)) = self.outdoor_at else {
            return;
        };
        if !due || !g.one_pump || fac <= it || fac.is_nan() {
            return;
        }
        // The facility loop must be steady too: while its water warms or
        // cools, the dry cooler and the chiller shed less or more than
        // the heat (its heat capacity is megajoules per kelvin).
        let before = self.facility_prev.replace((t.now, fw, it));
        let steady = before.is_some_and(|(at, fw0, it0)| {
            t.now.saturating_sub(at) <= 2 * FACILITY_EVERY_MS
                && (fw - fw0).abs() <= 0.05
                && (it - it0).abs() <= 0.01 * it
        });
        if !steady {
            return;
        }
        let s = Sample {
            it_w: it,
            speed: g.speed,
            facility_c: fw,
            outdoor_c: outdoor,
            facility_w: fac,
        };
        self.learned.facility.update(&t.cfg, &s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trusted_hosts_judge_the_supply_and_the_facility_water_does_not() {
        let cfg = CoreConfig::default();
        let mut learned = Learned::new(&cfg);
        for s in learned.hosts.iter_mut() {
            s.trust = 1.0;
        }
        let est = Estimator::from_learned(learned);
        let all = |_: usize| true;
        // Trusted hosts: the GPUs' word.
        assert_eq!(
            est.supply_expectation(&cfg, &all, Some(31.0), Some(27.0)),
            Some(31.0)
        );
        // The hall idle (fewer than two loaded hosts): nothing to judge
        // by; a drift fault standing then stands (sensors.rs).
        assert_eq!(est.supply_expectation(&cfg, &all, None, Some(27.0)), None);
        // One host heard: not an idle hall, the facility water judges.
        let one = |h: usize| h == 0;
        assert_eq!(
            est.supply_expectation(&cfg, &one, None, Some(27.0)),
            Some(27.0 + Learned::new(&cfg).approach.value)
        );
        // Untrusted hosts: the facility water plus the approach.
        let est = Estimator::from_learned(Learned::new(&cfg));
        let approach = Learned::new(&cfg).approach.value;
        assert_eq!(
            est.supply_expectation(&cfg, &all, Some(31.0), Some(27.0)),
            Some(27.0 + approach)
        );
    }
}
