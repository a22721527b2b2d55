//! N trials from a seed, every policy on the same draws, and their summary.
//!
//! Glossary:
//! - *trial*: one run of the job over its days, with its own failures.
//! - *ETT*: a trial's progress over its wall-clock time (GPU-hours over
//!   GPU-hours); the summary gives the mean over trials and the 5th and
//!   95th percentiles.

use super::draws::{Drawer, Draws};
use super::engine::{replay, Outcome, Policy};
use super::{Job, Lost, Mix, Settings};

/// One policy over every trial: means per trial unless said.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySummary {
    /// The policy.
    pub policy: Policy,
    /// Mean ETT.
    pub ett: f64,
    /// Each trial's ETT, in the trials' order: two policies run together
    /// pair trial by trial over the same failures.
    pub etts: Vec<f64>,
    /// 5th percentile of the trials' ETT.
    pub ett_p05: f64,
    /// 95th percentile.
    pub ett_p95: f64,
    /// Unplanned stops for a failing GPU: failures that struck, and
    /// quarantine stops ([`Outcome::interruptions`]).
    pub interruptions: f64,
    /// The same by class of the mix.
    pub interruptions_by_class: Vec<(String, f64)>,
    /// Failing GPUs' quarantines that ended the job before they struck
    /// (in `interruptions` too).
    pub quarantine_stops: f64,
    /// Planned restarts.
    pub drains: f64,
    /// Failures drained, or left out of a restart, before they struck.
    pub failures_averted: f64,
    /// False alarms drained or left out of a restart.
    pub false_alarms: f64,
    /// False quarantines acted on: hosts left out of a restart or
    /// drained, and jobs a quarantine ended.
    pub false_quarantines: f64,
    /// Times the job waited for a spare.
    pub spare_waits: f64,
    /// GPU-hours lost, by part.
    pub lost: Lost,
    /// GPU-hours lost by cause: each class of the mix, `false_alarm`
    /// (false degrades and false quarantines), `checkpoints`.
    pub lost_by_cause: Vec<(String, f64)>,
    /// The run's GPU-hours.
    pub wall_gpu_h: f64,
}

/// Every policy over N trials.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Trials run.
    pub trials: u32,
    /// The run's seed.
    pub seed: u64,
    /// One per policy, in the order asked.
    pub policies: Vec<PolicySummary>,
}

impl Summary {
    /// The summary of `p`, if it was run.
    pub fn of(&self, p: Policy) -> Option<&PolicySummary> {
        self.policies.iter().find(|s| s.policy == p)
    }
}

/// Checks the inputs.
pub fn validate(job: &Job, settings: &Settings, mix: &Mix, trials: u32) -> Result<(), String> {
    job.validate().map_err(|e| e.to_string())?;
    settings.validate().map_err(|e| e.to_string())?;
    mix.validate()?;
    if trials == 0 {
        return Err("trials = 0: at least 1".to_string());
    }
    Ok(())
}

/// Calls `each` with every trial's outcome under every policy of
/// `policies`, trial by trial.
pub fn each_trial(
    (job, settings, mix): (&Job, &Settings, &Mix),
    trials: u32,
    seed: u64,
    policies: &[Policy],
    mut each: impl FnMut(u32, Policy, &Outcome),
) {
    let drawer = Drawer::new(job, mix, settings, seed);
    let mut d = Draws::default();
    for k in 0..trials {
        drawer.draw(u64::from(k), &mut d);
        for &p in policies {
            each(k, p, &replay(job, settings, mix, p, &d));
        }
    }
}

/// Runs `trials` trials from `seed` under every policy.
pub fn run(
    job: &Job,
    settings: &Settings,
    mix: &Mix,
    trials: u32,
    seed: u64,
) -> Result<Summary, String> {
    run_policies(job, settings, mix, trials, seed, &Policy::ALL)
}

/// Runs `trials` trials from `seed` under these policies.
pub fn run_policies(
    job: &Job,
    settings: &Settings,
    mix: &Mix,
    trials: u32,
    seed: u64,
    policies: &[Policy],
) -> Result<Summary, String> {
    validate(job, settings, mix, trials)?;
    let mut acc: Vec<Acc> = policies.iter().map(|_| Acc::default()).collect();
    each_trial((job, settings, mix), trials, seed, policies, |_, p, o| {
        let i = policies.iter().position(|&q| q == p).expect("asked");
        acc[i].add(o);
    });
    let names = cause_names(mix);
    let policies = policies
        .iter()
        .zip(acc)
        .map(|(&p, a)| a.summary(p, &names))
        .collect();
    Ok(Summary {
        trials,
        seed,
        policies,
    })
}

/// The causes' names, in [`Outcome::lost_by_cause`]'s order.
pub fn cause_names(mix: &Mix) -> Vec<String> {
    mix.classes
        .iter()
        .map(|c| c.name.clone())
        .chain(["false_alarm".to_string(), "checkpoints".to_string()])
        .collect()
}

#[derive(Default)]
struct Acc {
    etts: Vec<f64>,
    sum: Outcome,
}

impl Acc {
    fn add(&mut self, o: &Outcome) {
        self.etts.push(o.ett());
        let s = &mut self.sum;
        s.wall_gpu_h += o.wall_gpu_h;
        s.progress_gpu_h += o.progress_gpu_h;
        s.lost.add(&o.lost);
        s.lost_by_cause.resize(o.lost_by_cause.len(), 0.0);
        for (a, b) in s.lost_by_cause.iter_mut().zip(&o.lost_by_cause) {
            *a += b;
        }
        s.interruptions += o.interruptions;
        s.interruptions_by_class
            .resize(o.interruptions_by_class.len(), 0);
        for (a, b) in s
            .interruptions_by_class
            .iter_mut()
            .zip(&o.interruptions_by_class)
        {
            *a += b;
        }
        s.quarantine_stops += o.quarantine_stops;
        s.drains += o.drains;
        s.failures_averted += o.failures_averted;
        s.false_alarms += o.false_alarms;
        s.false_quarantines += o.false_quarantines;
        s.spare_waits += o.spare_waits;
    }

    fn summary(mut self, policy: Policy, names: &[String]) -> PolicySummary {
        let n = self.etts.len() as f64;
        let etts = self.etts.clone();
        self.etts.sort_by(f64::total_cmp);
        let pct = |q: f64| self.etts[((n - 1.0) * q).round() as usize];
        let s = &self.sum;
        let mean = |x: u32| f64::from(x) / n;
        PolicySummary {
            policy,
            ett: self.etts.iter().sum::<f64>() / n,
            etts,
            ett_p05: pct(0.05),
            ett_p95: pct(0.95),
            interruptions: mean(s.interruptions),
            interruptions_by_class: names
                .iter()
                .cloned()
                .zip(s.interruptions_by_class.iter().map(|&k| mean(k)))
                .collect(),
            quarantine_stops: mean(s.quarantine_stops),
            drains: mean(s.drains),
            failures_averted: mean(s.failures_averted),
            false_alarms: mean(s.false_alarms),
            false_quarantines: mean(s.false_quarantines),
            spare_waits: mean(s.spare_waits),
            lost: s.lost.scaled(1.0 / n),
            lost_by_cause: names
                .iter()
                .cloned()
                .zip(s.lost_by_cause.iter().map(|g| g / n))
                .collect(),
            wall_gpu_h: s.wall_gpu_h / n,
        }
    }
}
