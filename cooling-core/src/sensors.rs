//! Sensor supervision: is each of the CDU's sensors to be believed?
//!
//! A sensor is checked three ways, each against something it does not
//! share a fault with:
//! - *range*: a reading no coolant loop can have (a broken 4–20 mA loop
//!   reads 0) is implausible; no reading for the timeout is lost;
//! - *expectation*: each sensor has a value the others imply (supply: the
//!   GPUs' junctions less their power times their thermal resistance;
//!   return: supply plus the IT meter's heat carried by the measured flow;
//!   flow: the pump speed times the design flow). A steady disagreement
//!   beyond the learned bias is drift;
//! - *frozen*: a reading that has not changed by a single count while its
//!   expectation moved is stuck.
//!
//! A disagreement must last `fault_confirm_ms` to become a fault, and a
//! faulty sensor must agree for `fault_clear_ms` to be trusted again; a
//! drifted one must read within its tolerance of an expectation at the
//! start and at the end of that time, in a transient or not, with no
//! disagreement outside a transient between and no stretch of
//! `fault_clear_ms` without an expectation (a reading far from it in a
//! transient holds the agreement; without an expectation it is not
//! trusted again, however long).
//! Expectations are filtered (about a minute) and held off while the loop
//! is in a transient, so that a load step is not taken for a fault.
//!
//! Glossary:
//! - *bias*: the steady difference between a healthy sensor and its
//!   expectation (sensor offset, model error), learned slowly while all
//!   agree.

use loopwarden_protocol::message::{Event, SensorFault};

use super::config::{CoreConfig, Timing};
use super::view::{Seen, Tick};
use super::{CduReadings, Log};

/// The sensors the core supervises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// Secondary supply temperature (required).
    Supply = 0,
    /// Secondary return temperature (required).
    Return = 1,
    /// Secondary flow (required).
    Flow = 2,
    /// Facility water supply temperature (reported, not required).
    FacilitySupply = 3,
}

impl Which {
    /// Every supervised sensor.
    pub const ALL: [Which; 4] = [Self::Supply, Self::Return, Self::Flow, Self::FacilitySupply];

    /// The sensor in the bus's vocabulary.
    pub fn sensor(self) -> loopwarden_protocol::message::Sensor {
        use loopwarden_protocol::message::Sensor;
        match self {
            Self::Supply => Sensor::SupplyTemp,
            Self::Return => Sensor::ReturnTemp,
            Self::Flow => Sensor::Flow,
            Self::FacilitySupply => Sensor::FacilitySupplyTemp,
        }
    }

    /// The control loops cannot run without it.
    pub fn required(self) -> bool {
        !matches!(self, Self::FacilitySupply)
    }

    /// Whether `v` is within the plausible range of a reading: a value
    /// outside it (a CDU's "no value" sentinel, −327.68 °C) is no figure,
    /// before the supervision confirms the fault.
    pub fn plausible(self, v: f64) -> bool {
        let (lo, hi) = self.range();
        (f64::from(lo)..=f64::from(hi)).contains(&v)
    }

    /// Plausible range of a reading.
    fn range(self) -> (f32, f32) {
        match self {
            Self::Flow => (0.0, 10_000.0),
            _ => (2.0, 80.0),
        }
    }

    /// A disagreement with the expectation beyond this is drift (K, or a
    /// fraction of the expectation for flow).
    fn tolerance(self, expected: f32) -> f32 {
        match self {
            Self::Flow => 0.15 * expected.abs().max(1.0),
            Self::Supply => 3.0,
            _ => 2.5,
        }
    }

    /// The expectation must move this much for a frozen reading to be
    /// stuck.
    fn moved(self, expected: f32) -> f32 {
        match self {
            Self::Flow => 0.1 * expected.abs().max(1.0),
            _ => 1.5,
        }
    }
}

/// One sensor's supervision state.
#[derive(Debug, Clone, Copy)]
struct Check {
    fault: Option<SensorFault>,
    /// A fault seen but not yet confirmed, and since when.
    pending: Option<(SensorFault, u64)>,
    /// Agreeing again since (while faulty).
    agreeing_since: Option<u64>,
    /// A drifted sensor's last step in agreement, ms.
    agreed_at: Option<u64>,
    /// The last step's reading agreed with its expectation (filtered,
    /// within the tolerance), in a transient or not.
    agrees: bool,
    last_seen_ms: Option<u64>,
    value: f32,
    changed_ms: u64,
    expected_at_change: Option<f32>,
    filtered: Option<f32>,
    expected_filtered: Option<f32>,
    bias: f32,
    /// The value a stuck sensor froze at.
    stuck_at: Option<f32>,
}

impl Check {
    /// Nothing seen yet.
    const NEW: Check = Check {
        fault: None,
        pending: None,
        agreeing_since: None,
        agreed_at: None,
        agrees: false,
        last_seen_ms: None,
        value: 0.0,
        changed_ms: 0,
        expected_at_change: None,
        filtered: None,
        expected_filtered: None,
        bias: 0.0,
        stuck_at: None,
    };
}

/// A change of a sensor's standing, for the event log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    /// The sensor.
    pub which: Which,
    /// The fault found, or `Cleared`.
    pub fault: SensorFault,
}

/// The supervision of every sensor.
#[derive(Debug, Clone)]
pub struct Supervisor {
    checks: [Check; 4],
}

impl Default for Supervisor {
    fn default() -> Self {
        Self::new()
    }
}

impl Supervisor {
    /// No sensor seen yet, none under a fault.
    pub const fn new() -> Self {
        Self {
            checks: [Check::NEW; 4],
        }
    }
}

/// First-order filter step with time constant `tau_s` over `dt_s`.
fn follow(prev: Option<f32>, x: f32, dt_s: f32, tau_s: f32) -> f32 {
    match prev {
        None => x,
        Some(p) => p + (x - p) * (dt_s / tau_s).min(1.0),
    }
}

/// What one step of supervision is given for one sensor.
#[derive(Debug, Clone, Copy)]
pub struct Observation {
    /// The reading, if the CDU gave one.
    pub reading: Option<f32>,
    /// What the other sensors imply, if they can say.
    pub expected: Option<f32>,
    /// The loop is in a transient: do not judge drift now.
    pub transient: bool,
}

impl Supervisor {
    /// The fault a sensor stands under, if any.
    pub fn fault(&self, w: Which) -> Option<SensorFault> {
        self.checks[w as usize].fault
    }

    /// The sensor's reading, if it is to be believed: no fault stands and
    /// the reading itself is plausible (an implausible one is never used,
    /// even before it is confirmed as a fault).
    pub fn trusted(&self, w: Which, reading: Option<f32>) -> Option<f32> {
        let (lo, hi) = w.range();
        if self.fault(w).is_some() {
            None
        } else {
            reading.filter(|v| (lo..=hi).contains(v))
        }
    }

    /// No sensor stands under a fault or is suspected of one.
    pub fn quiet(&self) -> bool {
        self.checks
            .iter()
            .all(|c| c.fault.is_none() && c.pending.is_none())
    }

    /// Every required sensor is believed.
    pub fn required_ok(&self) -> bool {
        Which::ALL
            .iter()
            .all(|w| !w.required() || self.fault(*w).is_none())
    }

    /// Sensor faults that stood before a restart (by [`Which`]): they
    /// stand again until the sensor agrees for the clearing time.
    pub fn restore(&mut self, faults: &[Option<SensorFault>; 4]) {
        for (c, f) in self.checks.iter_mut().zip(faults) {
            c.fault = f.filter(|f| *f != SensorFault::Cleared);
        }
    }

    /// The learned bias of a sensor against its expectation.
    pub fn bias(&self, w: Which) -> f32 {
        self.checks[w as usize].bias
    }

    /// Judges one sensor at `now_ms`, `dt_s` after the last step, with the
    /// confirmation, clearing and timeout times of `t`; returns a change of
    /// its standing.
    pub fn observe(
        &mut self,
        w: Which,
        now_ms: u64,
        dt_s: f32,
        obs: Observation,
        t: &Timing,
    ) -> Option<Change> {
        let (confirm_ms, clear_ms, timeout_ms) =
            (t.fault_confirm_ms, t.fault_clear_ms, t.sensor_timeout_ms);
        let c = &mut self.checks[w as usize];
        let (lo, hi) = w.range();
        // What is wrong now, before confirmation.
        let now_wrong: Option<SensorFault> = match obs.reading {
            None => {
                let silent = c.last_seen_ms.map_or(now_ms, |t| now_ms.saturating_sub(t));
                // Lost is confirmed by the timeout, not by `confirm_ms`.
                if silent >= timeout_ms || c.last_seen_ms.is_none() {
                    Some(SensorFault::Lost)
                } else {
                    return None;
                }
            }
            Some(v) if !(lo..=hi).contains(&v) || v.is_nan() => Some(SensorFault::Implausible),
            Some(v) => c.judge(w, v, now_ms, dt_s, obs),
        };
        c.confirm(w, now_wrong, now_ms, obs, confirm_ms, clear_ms)
    }

    /// Judges every sensor in step `t` against what the others imply
    /// (from what the step has `seen`, a pump `pumping` at `speed`),
    /// reports each change of standing in `log`; returns the readings to
    /// be trusted.
    pub(crate) fn supervise(
        &mut self,
        t: &Tick<'_>,
        seen: &Seen,
        pumping: bool,
        speed: f32,
        log: &mut Log,
    ) -> Trusted {
        let (cfg, rd) = (&t.cfg, &t.rd);
        let expected =
            self.expectations(cfg, rd, pumping, speed, seen.gpu_implied_supply, seen.it_w);
        for w in Which::ALL {
            let obs = Observation {
                reading: rd.get(w),
                expected: expected[w as usize],
                transient: seen.transient,
            };
            if let Some(ch) = self.observe(w, t.now, t.dt, obs, &cfg.timing) {
                log.push(Event::SensorFault {
                    sensor: ch.which.sensor(),
                    rack: None,
                    fault: ch.fault,
                });
            }
        }
        Trusted {
            supply: self.trusted(Which::Supply, rd.supply_c),
            flow: self.trusted(Which::Flow, rd.flow_lpm),
            return_c: self.trusted(Which::Return, rd.return_c),
            estimated: Default::default(),
        }
    }

    /// What each sensor should read, by [`Which`], from what it shares no
    /// fault with: supply from the GPUs (`gpu_implied_supply`), return from
    /// the supply and the IT meter's heat `it_w` carried by the flow, flow
    /// from the pump `speed` while a pump is `pumping`.
    pub fn expectations(
        &self,
        cfg: &CoreConfig,
        rd: &Readings,
        pumping: bool,
        speed: f32,
        gpu_implied_supply: Option<f32>,
        it_w: Option<f32>,
    ) -> [Option<f32>; 4] {
        let flow_trusted = self.trusted(Which::Flow, rd.flow_lpm);
        let expected_flow = if pumping && rd.answered {
            Some(cfg.cdu.design_lpm_per_gpu * cfg.layout.gpus() as f32 * speed)
        } else {
            None
        };
        let supply_trusted = self.trusted(Which::Supply, rd.supply_c);
        let expected_return = match (supply_trusted, flow_trusted, it_w) {
            (Some(s), Some(f), Some(it)) if f > 1.0 => {
                let m = f * cfg.cdu.density_kg_per_m3 / 60_000.0;
                Some(s + it / (m * cfg.cdu.cp_j_per_kg_k))
            }
            _ => None,
        };
        [gpu_implied_supply, expected_return, expected_flow, None]
    }
}

impl Check {
    /// What is wrong with a plausible reading `v` of sensor `w`, before
    /// confirmation: stuck or drifting. Learns the bias while it agrees.
    fn judge(
        &mut self,
        w: Which,
        v: f32,
        now_ms: u64,
        dt_s: f32,
        obs: Observation,
    ) -> Option<SensorFault> {
        let c = self;
        c.last_seen_ms = Some(now_ms);
        // Frozen while the expectation moved.
        let frozen = v == c.value;
        if !frozen {
            c.value = v;
            c.changed_ms = now_ms;
            c.expected_at_change = obs.expected;
        }
        let stuck = frozen
            && now_ms.saturating_sub(c.changed_ms) >= 120_000
            && match (c.expected_at_change, obs.expected) {
                (Some(a), Some(b)) => (b - a).abs() > w.moved(b),
                _ => false,
            };
        c.filtered = Some(follow(c.filtered, v, dt_s, 60.0));
        let drift = match obs.expected {
            Some(e) => {
                c.expected_filtered = Some(follow(c.expected_filtered, e, dt_s, 60.0));
                let (f, ef) = (c.filtered.unwrap_or(v), c.expected_filtered.unwrap_or(e));
                let off = f - ef - c.bias;
                let far = off.abs() > w.tolerance(e);
                c.agrees = !far;
                if !far && !obs.transient && c.fault.is_none() && c.pending.is_none() {
                    // Learn the bias slowly (about an hour), bounded.
                    let limit = w.tolerance(e) * 0.5;
                    c.bias = (c.bias + off * (dt_s / 3600.0)).clamp(-limit, limit);
                }
                far && !obs.transient
            }
            None => {
                c.expected_filtered = None;
                c.agrees = false;
                false
            }
        };
        if stuck {
            Some(SensorFault::Stuck)
        } else if drift {
            Some(SensorFault::Drift)
        } else {
            None
        }
    }

    /// Confirms what is wrong now (`now_wrong`) into a fault after
    /// `confirm_ms`, or clears a fault after `clear_ms` of agreement;
    /// returns the change.
    fn confirm(
        &mut self,
        w: Which,
        now_wrong: Option<SensorFault>,
        now_ms: u64,
        obs: Observation,
        confirm_ms: u64,
        clear_ms: u64,
    ) -> Option<Change> {
        let c = self;
        match (c.fault, now_wrong) {
            (None, None) => {
                c.pending = None;
                None
            }
            (None, Some(f)) => {
                let since = match c.pending {
                    Some((_, s)) => s,
                    None => now_ms,
                };
                c.pending = Some((f, since));
                let confirm = if matches!(f, SensorFault::Lost) {
                    0
                } else {
                    confirm_ms
                };
                if now_ms.saturating_sub(since) >= confirm {
                    c.fault = Some(f);
                    c.stuck_at = (f == SensorFault::Stuck).then_some(c.value);
                    c.pending = None;
                    c.agreeing_since = None;
                    Some(Change { which: w, fault: f })
                } else {
                    None
                }
            }
            (Some(_), Some(_)) => {
                c.agreeing_since = None;
                None
            }
            (Some(_), None) if c.fault == Some(SensorFault::Drift) && !c.agrees => {
                // Nothing it agrees with now (the hall idle, or far from
                // it in a transient, where far is no disagreement): no
                // agreement now. A transient ends none; a stretch with no
                // expectation ends one `clear_ms` after the last step in
                // agreement (two chance agreements an idle night apart
                // clear nothing).
                let idle = obs.expected.is_none();
                let since = c.agreed_at.map(|at| now_ms.saturating_sub(at));
                if idle && since.is_some_and(|g| g > clear_ms) {
                    c.agreeing_since = None;
                }
                None
            }
            (Some(_), None) => {
                if c.fault == Some(SensorFault::Drift) {
                    c.agreed_at = Some(now_ms);
                }
                // A stuck sensor must first move off the value it froze at.
                if c.fault == Some(SensorFault::Stuck) {
                    if obs.reading == c.stuck_at {
                        c.agreeing_since = None;
                        return None;
                    }
                    c.stuck_at = None;
                }
                let since = *c.agreeing_since.get_or_insert(now_ms);
                if now_ms.saturating_sub(since) >= clear_ms {
                    c.fault = None;
                    c.agreeing_since = None;
                    // The filters restart from what it reads now.
                    c.filtered = obs.reading;
                    c.expected_filtered = obs.expected;
                    Some(Change {
                        which: w,
                        fault: SensorFault::Cleared,
                    })
                } else {
                    None
                }
            }
        }
    }
}

/// The readings to be believed after a step's supervision.
#[derive(Debug, Clone, Copy)]
pub struct Trusted {
    /// Secondary supply temperature, °C.
    pub supply: Option<f32>,
    /// Secondary flow, L/min.
    pub flow: Option<f32>,
    /// Secondary return temperature, °C.
    pub return_c: Option<f32>,
    /// Which of these are estimates, not readings ([`super::substitute`]).
    pub estimated: super::substitute::Estimated,
}

/// The CDU's answer as the core reads it: no answer, or a value that is
/// not a number, is no reading.
#[derive(Debug, Clone, Copy, Default)]
pub struct Readings {
    /// The CDU answered this step.
    pub answered: bool,
    /// Secondary supply temperature, °C.
    pub supply_c: Option<f32>,
    /// Secondary return temperature, °C.
    pub return_c: Option<f32>,
    /// Secondary flow, L/min.
    pub flow_lpm: Option<f32>,
    /// Facility water supply temperature, °C.
    pub facility_supply_c: Option<f32>,
    /// IT power meter, W.
    pub it_w: Option<f32>,
    /// Pumps A and B running (contactor feedback; neither without an
    /// answer).
    pub pumps_running: [bool; 2],
    /// Loop differential pressure, kPa.
    pub diff_pressure_kpa: Option<f32>,
    /// Rack valves reading closed, bit n = rack n (`None`: no answer, or
    /// no positions).
    pub valves_closed: Option<u16>,
}

impl Readings {
    /// The readings of the CDU's answer `cdu`.
    pub fn of(cdu: Option<CduReadings>) -> Self {
        let answered = cdu.is_some();
        let c = cdu.unwrap_or_default();
        let reading = |x: Option<f32>| {
            if answered {
                x.filter(|v| v.is_finite())
            } else {
                None
            }
        };
        Self {
            answered,
            supply_c: reading(c.supply_c),
            return_c: reading(c.return_c),
            flow_lpm: reading(c.flow_lpm),
            facility_supply_c: reading(c.facility_supply_c),
            it_w: reading(c.it_w),
            pumps_running: c.pumps_running,
            diff_pressure_kpa: reading(c.diff_pressure_kpa),
            valves_closed: c.valves_closed.filter(|_| answered),
        }
    }

    /// The reading of a supervised sensor.
    pub fn get(&self, w: Which) -> Option<f32> {
        match w {
            Which::Supply => self.supply_c,
            Which::Return => self.return_c,
            Which::Flow => self.flow_lpm,
            Which::FacilitySupply => self.facility_supply_c,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(
        s: &mut Supervisor,
        w: Which,
        from_s: u64,
        to_s: u64,
        f: impl Fn(u64) -> (Option<f32>, Option<f32>),
    ) -> std::vec::Vec<(u64, SensorFault)> {
        let mut out = std::vec::Vec::new();
        for t in from_s..to_s {
            let (reading, expected) = f(t);
            let obs = Observation {
                reading,
                expected,
                transient: false,
            };
            if let Some(c) = s.observe(w, t * 1000, 1.0, obs, &crate::CoreConfig::default().timing)
            {
                out.push((t, c.fault));
            }
        }
        out
    }

    #[test]
    fn a_healthy_sensor_tracking_its_expectation_is_never_faulted() {
        let mut s = Supervisor::default();
        let ch = run(&mut s, Which::Return, 0, 7200, |t| {
            let e = 40.0 + 5.0 * ((t / 600) % 2) as f32;
            (Some(e + 0.8), Some(e))
        });
        assert!(ch.is_empty(), "{ch:?}");
        assert!(s.bias(Which::Return) > 0.0, "a steady offset is learned");
    }

    #[test]
    fn drift_is_found_after_confirmation_and_cleared_after_agreement() {
        let mut s = Supervisor::default();
        // 0.5 K/min from t = 600 s to 1800 s, then reads true again.
        let ch = run(&mut s, Which::Return, 0, 3000, |t| {
            let drift = if (600..1800).contains(&t) {
                (t - 600) as f32 / 120.0
            } else {
                0.0
            };
            (Some(40.0 + drift), Some(40.0))
        });
        assert_eq!(ch.len(), 2, "{ch:?}");
        assert_eq!(ch[0].1, SensorFault::Drift);
        // 2.5 K takes 5 min of drift, the filter and the confirmation
        // another two or so.
        assert!((900..1200).contains(&ch[0].0), "{ch:?}");
        assert_eq!(ch[1].1, SensorFault::Cleared);
        assert!(ch[1].0 >= 1800 + 60, "{ch:?}");
    }

    #[test]
    fn a_lost_or_broken_sensor_is_faulted_after_the_timeout_or_confirmation() {
        let mut s = Supervisor::default();
        let ch = run(&mut s, Which::Flow, 0, 100, |t| {
            (if t < 50 { Some(190.0) } else { None }, Some(190.0))
        });
        assert_eq!(
            &ch[..],
            &[(54, SensorFault::Lost)],
            "5 s after the last reading at 49 s"
        );
        let mut s = Supervisor::default();
        let ch = run(&mut s, Which::Supply, 0, 200, |t| {
            (Some(if t < 50 { 30.0 } else { 0.0 }), None)
        });
        assert_eq!(&ch[..], &[(110, SensorFault::Implausible)]);
    }

    #[test]
    fn a_frozen_reading_is_stuck_only_when_its_expectation_moved() {
        let mut s = Supervisor::default();
        let ch = run(&mut s, Which::Supply, 0, 1000, |_| (Some(30.0), Some(30.0)));
        assert!(ch.is_empty(), "steady loop, steady reading: {ch:?}");
        let mut s = Supervisor::default();
        let ch = run(&mut s, Which::Supply, 0, 1000, |t| {
            let truth = 30.0 + if t > 300 { 2.0 } else { 0.0 };
            (Some(30.0), Some(truth))
        });
        assert_eq!(ch.first().map(|c| c.1), Some(SensorFault::Stuck), "{ch:?}");
    }

    #[test]
    fn a_drift_fault_stands_while_there_is_nothing_to_compare_with() {
        let mut s = Supervisor::default();
        // 5 K high against the GPUs' word: a drift fault.
        let ch = run(&mut s, Which::Supply, 0, 600, |_| (Some(35.0), Some(30.0)));
        assert_eq!(ch.first().map(|c| c.1), Some(SensorFault::Drift), "{ch:?}");
        // The hall goes idle: the GPUs no longer say what the supply is.
        // Nothing agrees with the sensor, so it is not trusted again.
        let ch = run(&mut s, Which::Supply, 600, 720, |_| (Some(35.0), None));
        assert!(ch.is_empty(), "{ch:?}");
        assert_eq!(s.fault(Which::Supply), Some(SensorFault::Drift));
        // Nor does a transient, when drift is not judged, count.
        for t in 720..900 {
            let obs = Observation {
                reading: Some(35.0),
                expected: Some(30.0),
                transient: true,
            };
            let timing = crate::CoreConfig::default().timing;
            assert_eq!(s.observe(Which::Supply, t * 1000, 1.0, obs, &timing), None);
        }
        assert_eq!(s.fault(Which::Supply), Some(SensorFault::Drift));
        // It reads true again once there is something to agree with.
        let ch = run(&mut s, Which::Supply, 900, 1100, |_| {
            (Some(30.0), Some(30.0))
        });
        assert_eq!(ch.last().map(|c| c.1), Some(SensorFault::Cleared), "{ch:?}");
    }

    /// A transient neither agrees nor ends an agreement: a sensor that
    /// reads true again clears in a hall never still for a whole minute.
    #[test]
    fn a_transient_holds_a_drifted_sensors_agreement() {
        let mut s = Supervisor::default();
        let ch = run(&mut s, Which::Supply, 0, 600, |_| (Some(35.0), Some(30.0)));
        assert_eq!(ch.first().map(|c| c.1), Some(SensorFault::Drift), "{ch:?}");
        let timing = crate::CoreConfig::default().timing;
        let mut t = 600;
        let mut step = |t: u64, transient: bool| {
            let obs = Observation {
                reading: Some(30.0),
                expected: Some(30.0),
                transient,
            };
            s.observe(Which::Supply, t * 1000, 1.0, obs, &timing)
        };
        // Reads true again, in a hall whose load moves every 40 s.
        let mut cleared = None;
        while cleared.is_none() && t < 900 {
            let transient = (t / 40) % 2 == 1;
            if step(t, transient).is_some_and(|c| c.fault == SensorFault::Cleared) {
                cleared = Some(t);
            }
            t += 1;
        }
        assert!(cleared.is_some(), "never cleared");
    }

    /// Two agreements an idle night apart (nothing judged between them)
    /// do not clear a drifted sensor.
    #[test]
    fn agreements_far_apart_do_not_clear_a_drift_fault() {
        let mut s = Supervisor::default();
        let ch = run(&mut s, Which::Supply, 0, 600, |_| (Some(35.0), Some(30.0)));
        assert_eq!(ch.first().map(|c| c.1), Some(SensorFault::Drift), "{ch:?}");
        let timing = crate::CoreConfig::default().timing;
        let step = |s: &mut Supervisor, t: u64, expected: Option<f32>| {
            let obs = Observation {
                reading: Some(30.0),
                expected,
                transient: false,
            };
            s.observe(Which::Supply, t * 1000, 1.0, obs, &timing)
        };
        // When it would clear, judged in agreement all along.
        let mut dry = s.clone();
        let clears = (600..1_200)
            .find(|&t| {
                step(&mut dry, t, Some(30.0)).is_some_and(|c| c.fault == SensorFault::Cleared)
            })
            .expect("it clears");
        // Agreeing until just before that, then an idle night, then one
        // agreement: not cleared.
        for t in 600..clears - 5 {
            step(&mut s, t, Some(30.0));
        }
        for t in clears - 5..clears + 3_600 {
            assert_eq!(step(&mut s, t, None), None, "{t}");
        }
        assert_eq!(
            step(&mut s, clears + 3_600, Some(30.0)),
            None,
            "not cleared"
        );
    }
}
