//! One trial's failures, drawn once and replayed by every policy.
//!
//! Hardware fails on the wall clock whatever the job is doing, so a
//! trial's failures are one Poisson stream over the run: the times between
//! them are drawn from the job's total rate (rate per GPU-day × GPUs), not
//! GPU by GPU and step by step. Each failure draws its class by share and,
//! from its class's precursor, whether it is flagged and how long before.
//! False alarms (healthy GPUs flagged degraded) are a second Poisson
//! stream and false quarantines (healthy GPUs quarantined) a third, each
//! from a generator of its own, so a change in their rates leaves the
//! failures, and each other, as they were.
//!
//! Glossary:
//! - *trial seed*: the run's seed mixed with the trial's number
//!   (SplitMix64), one generator per stream: trial k draws the same
//!   failures whatever N is.
//! - *flag*: the time the health engine flags a failing GPU, the failure's
//!   time minus its lead time (not before the run starts); a quarantine
//!   for the precursor's `quarantined` share of the flagged, drawn from
//!   the same uniform as the flag itself.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{FailureClass, Job, LeadTime, Mix, Settings};

/// One failure of a trial.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Failure {
    /// When it strikes, seconds from the start.
    pub at_s: f64,
    /// Its class, an index into the mix.
    pub class: usize,
    /// When the health engine flags it, seconds from the start; `None`
    /// when it shows no precursor.
    pub flagged_at_s: Option<f64>,
    /// Whether that flag is a quarantine (else the GPU is marked
    /// degraded); never without a flag.
    pub quarantined: bool,
}

/// What happens to a trial's job, before any policy acts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Draws {
    /// The failures, in time order.
    pub failures: Vec<Failure>,
    /// The false alarms' times, in order.
    pub false_alarms: Vec<f64>,
    /// The false quarantines' times, in order.
    pub false_quarantines: Vec<f64>,
}

/// Draws trials of one job and mix.
#[derive(Debug, Clone)]
pub struct Drawer {
    seed: u64,
    horizon_s: f64,
    /// Failures per second of the whole job.
    per_s: f64,
    /// False alarms per second of the whole job.
    false_per_s: f64,
    /// False quarantines per second of the whole job.
    quarantines_per_s: f64,
    /// Cumulative shares, the last one 1.
    cumulative: Vec<f64>,
    classes: Vec<FailureClass>,
}

/// SplitMix64: a trial's and a stream's seed from the run's.
fn mixed(seed: u64, trial: u64, stream: u64) -> u64 {
    let mut z = seed ^ trial.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (stream << 62);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// An exponential time with this rate, seconds.
fn exponential(rng: &mut StdRng, per_s: f64) -> f64 {
    -(1.0 - rng.gen::<f64>()).ln() / per_s
}

/// One uniform draw whatever the kind, so the kind moves no later draw.
fn lead_s(lead: &LeadTime, rng: &mut StdRng) -> f64 {
    let u: f64 = rng.gen();
    let hours = match lead {
        LeadTime::Fixed { hours } => *hours,
        LeadTime::Exponential { mean_hours } => -(1.0 - u).ln() * mean_hours,
        LeadTime::Empirical { hours } => {
            hours[((u * hours.len() as f64) as usize).min(hours.len() - 1)]
        }
    };
    hours * 3600.0
}

impl Drawer {
    /// For this job, mix, the settings' false-alarm and false-quarantine
    /// rates and the run seed.
    pub fn new(job: &Job, mix: &Mix, settings: &Settings, seed: u64) -> Self {
        let g = f64::from(job.gpus);
        let total: f64 = mix.classes.iter().map(|c| c.share).sum();
        let mut sum = 0.0;
        let mut cumulative: Vec<f64> = mix
            .classes
            .iter()
            .map(|c| {
                sum += c.share;
                sum / total
            })
            .collect();
        if let Some(last) = cumulative.last_mut() {
            *last = 1.0;
        }
        Drawer {
            seed,
            horizon_s: job.horizon_s(),
            per_s: mix.rate_per_gpu_day * g / 86_400.0,
            false_per_s: settings.false_alarms_per_gpu_day * g / 86_400.0,
            quarantines_per_s: settings.false_quarantines_per_gpu_day * g / 86_400.0,
            cumulative,
            classes: mix.classes.clone(),
        }
    }

    /// Trial `trial`'s draws, into `out` (its vectors reused).
    pub fn draw(&self, trial: u64, out: &mut Draws) {
        out.failures.clear();
        out.false_alarms.clear();
        out.false_quarantines.clear();
        let mut rng = StdRng::seed_from_u64(mixed(self.seed, trial, 0));
        let mut t = exponential(&mut rng, self.per_s);
        while self.per_s > 0.0 && t < self.horizon_s {
            out.failures.push(self.failure(t, &mut rng));
            t += exponential(&mut rng, self.per_s);
        }
        self.times(trial, 1, self.false_per_s, &mut out.false_alarms);
        self.times(trial, 2, self.quarantines_per_s, &mut out.false_quarantines);
    }

    /// A Poisson stream at `per_s` over the run, from stream `stream`'s
    /// generator of trial `trial`, into `out`.
    fn times(&self, trial: u64, stream: u64, per_s: f64, out: &mut Vec<f64>) {
        if per_s <= 0.0 {
            return;
        }
        let mut rng = StdRng::seed_from_u64(mixed(self.seed, trial, stream));
        let mut t = exponential(&mut rng, per_s);
        while t < self.horizon_s {
            out.push(t);
            t += exponential(&mut rng, per_s);
        }
    }

    /// A failure at `at_s`: its class, and whether and when it is flagged.
    fn failure(&self, at_s: f64, rng: &mut StdRng) -> Failure {
        let u: f64 = rng.gen();
        let class = self
            .cumulative
            .partition_point(|&c| c <= u)
            .min(self.classes.len() - 1);
        let p = &self.classes[class].precursor;
        // Always two more draws, flagged or not, so a change of coverage
        // moves no later failure.
        // One uniform says both whether it is flagged and whether the flag
        // is a quarantine, so the share quarantined moves no later draw.
        let v = rng.gen::<f64>();
        let flagged = v < p.coverage;
        let lead = lead_s(&p.lead, rng);
        Failure {
            at_s,
            class,
            flagged_at_s: flagged.then(|| (at_s - lead).max(0.0)),
            quarantined: v < p.coverage * p.quarantined,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_trial_and_the_rate_holds() {
        let job = Job::default();
        let d = Drawer::new(&job, &Mix::default(), &Settings::default(), 7);
        let (mut a, mut b) = (Draws::default(), Draws::default());
        d.draw(3, &mut a);
        d.draw(3, &mut b);
        assert_eq!(a, b);
        let mut n = 0;
        for k in 0..200 {
            d.draw(k, &mut a);
            n += a.failures.len();
            assert!(a.failures.windows(2).all(|w| w[0].at_s <= w[1].at_s));
        }
        // 419 expected per trial; 200 trials give a standard error of 1.4.
        let mean = n as f64 / 200.0;
        assert!((mean - 419.0).abs() < 6.0, "{mean}");
    }

    #[test]
    fn coverage_moves_no_failure() {
        let job = Job::default();
        let plain = Mix::default();
        let p = super::super::Precursor {
            coverage: 0.7,
            lead: LeadTime::Exponential { mean_hours: 3.0 },
            quarantined: 0.5,
        };
        let flagged = plain.with_precursor(&p);
        let (mut a, mut b) = (Draws::default(), Draws::default());
        let noisy = Settings {
            false_alarms_per_gpu_day: 0.01,
            false_quarantines_per_gpu_day: 0.01,
            ..Settings::default()
        };
        Drawer::new(&job, &plain, &Settings::default(), 1).draw(0, &mut a);
        Drawer::new(&job, &flagged, &noisy, 1).draw(0, &mut b);
        let times = |d: &Draws| {
            d.failures
                .iter()
                .map(|f| (f.at_s, f.class))
                .collect::<Vec<_>>()
        };
        assert!(times(&a) == times(&b), "the failures moved");
        assert!(b.failures.iter().any(|f| f.flagged_at_s.is_some()));
        assert!(!b.false_alarms.is_empty());
        assert!(!b.false_quarantines.is_empty());
        assert!(b.false_alarms != b.false_quarantines, "one stream each");
    }
}
