//! False flags of the measured precursor model: GPUs that left `healthy`
//! with nothing wrong with them, and the 95 % bounds per clean GPU-day the
//! twin takes from how many were seen.
//!
//! Glossary:
//! - *false quarantine*: a false flag that reached `quarantined` before
//!   the GPU was healthy again.
//! - *false degrade*: a false flag that stopped at `degraded`.
//! - *clean GPU-day*: a day of one GPU with nothing wrong with it (a
//!   failing GPU counts only before its precursor began).

use super::{Measurement, State, Verdict};

/// A GPU that left healthy with nothing wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FalseAlarm {
    /// The trace.
    pub trace: String,
    /// The GPU.
    pub gpu: usize,
    /// When, ms.
    pub t_ms: u64,
    /// The engine's reason.
    pub reason: String,
    /// Whether it reached `quarantined` before it was healthy again (a
    /// false quarantine); else it stopped at `degraded` (a false
    /// degrade).
    pub quarantined: bool,
}

/// The false flags of GPU `gpu` of trace `trace` before `before_ms`:
/// each rise from healthy, marked quarantined when the GPU reached
/// `quarantined` before it was healthy again.
pub(super) fn false_flags(
    trace: &str,
    verdicts: &[Verdict],
    gpu: usize,
    before_ms: u64,
) -> Vec<FalseAlarm> {
    let mut prev = State::Healthy;
    let mut out: Vec<FalseAlarm> = Vec::new();
    for v in verdicts
        .iter()
        .filter(|v| v.gpu == gpu && v.t_ms < before_ms)
    {
        if prev == State::Healthy && v.state > State::Healthy {
            out.push(FalseAlarm {
                trace: trace.to_string(),
                gpu,
                t_ms: v.t_ms,
                reason: v.reason.clone(),
                quarantined: false,
            });
        }
        if v.state == State::Quarantined {
            if let Some(last) = out.last_mut() {
                last.quarantined = true;
            }
        }
        prev = v.state;
    }
    out
}

/// The 95 % one-sided upper bound on a Poisson mean when `k` events were
/// seen: the mean at which seeing `k` or fewer has probability 5 % (for
/// `k` = 0, −ln 0.05 ≈ 3.0, the "rule of three").
pub fn poisson_upper_95(k: usize) -> f64 {
    let cdf = |mean: f64| {
        let mut term = (-mean).exp();
        let mut sum = term;
        for i in 1..=k {
            term *= mean / i as f64;
            sum += term;
        }
        sum
    };
    let (mut lo, mut hi) = (0.0, 10.0 + 10.0 * k as f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if cdf(mid) > 0.05 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

impl Measurement {
    /// The false-alarm bound per GPU-day, quarantines and degrades
    /// together.
    pub fn false_alarm_bound(&self) -> f64 {
        self.bound(self.false_alarms.len())
    }

    /// False quarantines seen.
    pub fn false_quarantines(&self) -> usize {
        self.false_alarms.iter().filter(|f| f.quarantined).count()
    }

    /// False degrades seen (flags that never reached quarantined).
    pub fn false_degrades(&self) -> usize {
        self.false_alarms.len() - self.false_quarantines()
    }

    /// The false-quarantine bound per GPU-day.
    pub fn false_quarantine_bound(&self) -> f64 {
        self.bound(self.false_quarantines())
    }

    /// The false-degrade bound per GPU-day.
    pub fn false_degrade_bound(&self) -> f64 {
        self.bound(self.false_degrades())
    }

    /// The false-degrade rate the twin takes: what the bound on every
    /// false flag leaves once false quarantines take their own bound, so
    /// the two together never exceed the bound on the total.
    pub fn false_degrade_share(&self) -> f64 {
        (self.false_alarm_bound() - self.false_quarantine_bound()).max(0.0)
    }

    /// The 95 % bound per clean GPU-day when `k` were seen.
    fn bound(&self, k: usize) -> f64 {
        poisson_upper_95(k) / self.clean_gpu_days.max(1e-9)
    }
}
