//! Every figure of the goodput report, computed: the headline run, the
//! sensitivities, the precursor sweep and the moonshot's answer.
//!
//! Nothing here reads or writes a file: [`Study::compute`] takes the
//! inputs and returns numbers; `report.rs` and `charts.rs` lay them out.
//!
//! Glossary:
//! - *headline*: the three policies on the inputs as given.
//! - *sweep*: the same run with one input changed, every other as given.
//! - *moonshot*: a 16,384-GPU job at Llama 3's rate reaching ETT ≥ 99 %.
//! - *ceiling*: the drain policy's best in the precursor sweep: nearly
//!   every failure a host sees is drained before it strikes.
//! - *paired difference*: one policy's ETT minus another's, trial by
//!   trial over the same failures, with its mean and 95 % interval
//!   (mean ± t·SD/√n, t Student's quantile up to 30 degrees of freedom,
//!   1.96 beyond): how far a gain between policies can be trusted at the
//!   run's number of trials.

use super::interval::IntervalAdvice;
use loopwarden_twin::goodput::mix::LLAMA3_RATE_PER_GPU_DAY;
use loopwarden_twin::goodput::trials::{each_trial, run_policies, validate};
use loopwarden_twin::goodput::{
    run, Job, LeadTime, Mix, Policy, PolicySummary, Precursor, Settings, Summary,
};

/// Checkpoint intervals swept, minutes.
pub const CHECKPOINT_MIN: [f64; 8] = [2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 240.0];
/// Restart times swept, minutes.
pub const RESTART_MIN: [f64; 6] = [1.0, 2.0, 5.0, 10.0, 20.0, 30.0];
/// Checkpoint writes swept, seconds.
pub const WRITE_S: [f64; 6] = [0.0, 5.0, 10.0, 30.0, 60.0, 120.0];
/// Spare pools swept, hosts.
pub const SPARES: [u32; 8] = [0, 8, 16, 24, 32, 48, 64, 128];
/// False-alarm rates swept, per GPU-day.
pub const FALSE_ALARMS: [f64; 7] = [0.0, 1e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3];
/// Collective timeouts swept, minutes.
pub const HANG_MIN: [f64; 4] = [1.0, 5.0, 10.0, 30.0];
/// Precursor coverages swept.
pub const COVERAGE: [f64; 5] = [0.25, 0.5, 0.75, 0.9, 1.0];
/// Precursor lead times swept, hours (every flag this long before).
pub const LEAD_H: [f64; 7] = [0.1, 0.25, 0.5, 1.0, 2.0, 6.0, 24.0];
/// The moonshot's target.
pub const TARGET: f64 = 0.99;
/// The moonshot's job size.
pub const MOONSHOT_GPUS: u32 = 16_384;

/// What the study is run on.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The job.
    pub job: Job,
    /// The policies' settings.
    pub settings: Settings,
    /// The failure mix (its own precursors for the headline).
    pub mix: Mix,
    /// Whether the mix's visible classes carry the measured precursors
    /// (the real health engine's), rather than their own.
    pub measured: bool,
    /// With `measured`, the host-visible classes the measured model does
    /// not cover by name: they keep the mix's own precursors.
    pub unmeasured: Vec<String>,
    /// Trials of the headline run.
    pub trials: u32,
    /// Trials of every other run (the sweeps, the moonshot), at most
    /// `trials`.
    pub sweep_trials: u32,
    /// The seed of every run.
    pub seed: u64,
}

/// One swept value and the ETT of each policy there.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// The input's value.
    pub x: f64,
    /// ETT of reactive, agent, agent + drain.
    pub ett: [f64; 3],
}

/// A precursor's ETT under the drain policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// Share of visible failures flagged.
    pub coverage: f64,
    /// Hours before.
    pub lead_h: f64,
    /// ETT.
    pub ett: f64,
}

/// The moonshot's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Moonshot {
    /// The job it is asked of (16,384 GPUs, the run's other settings).
    pub job: Job,
    /// The three policies with no precursor.
    pub baseline: [f64; 3],
    /// The drain policy over the precursor grid.
    pub grid: Vec<Cell>,
    /// The drain policy with the measured precursors, if any: at the
    /// run's false-alarm rate, and with none.
    pub measured: Option<(f64, f64)>,
    /// Where a perfect precursor (every visible failure, a day ahead)
    /// takes the job, best first, among the settings tried.
    pub settings_tried: Vec<Tried>,
    /// If every failure, seen by a host or not, were flagged a day ahead:
    /// at the run's settings, and at the best settings tried.
    pub all_flagged: (f64, f64),
    /// What the failures no host sees cost at best: 1 − the ceiling.
    pub ceiling: f64,
}

/// Settings tried for the moonshot, and the ETT there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tried {
    /// Checkpoint interval, minutes.
    pub checkpoint_min: f64,
    /// Checkpoint write, seconds.
    pub write_s: f64,
    /// Restart, minutes.
    pub restart_min: f64,
    /// Collective timeout, minutes.
    pub hang_min: f64,
    /// ETT with drains.
    pub ett: f64,
}

/// Every figure of the report.
#[derive(Debug, Clone)]
pub struct Study {
    /// The inputs.
    pub inputs: Inputs,
    /// The three policies on the inputs as given.
    pub headline: Summary,
    /// The paired differences between policies over the headline's
    /// trials, in [`DIFFERENCES`]' order.
    pub differences: Vec<Difference>,
    /// The drain policy as in the headline, with no false alarm (no false
    /// degrade, no false quarantine).
    pub no_false_alarms: PolicySummary,
    /// The agent alone as in the headline, with no false quarantine.
    pub agent_no_false_quarantines: PolicySummary,
    /// The same over the sweeps' trials (the first `sweep_trials` of the
    /// headline's): what the false-alarm sweep and the precursor grid,
    /// run on those trials, are set against.
    pub agent_swept: PolicySummary,
    /// ETT with drains against the rate of false flags (per GPU-day, all
    /// counted as degrades), with the mix's precursors (else 50 % flagged
    /// an hour ahead), each set against the agent trial by trial.
    pub false_alarms: Vec<Swept>,
    /// ETT against the checkpoint interval (the drain policy's without
    /// false alarms, as in every sweep).
    pub checkpoint: Vec<Point>,
    /// The best checkpoint interval swept set against the run's own (or
    /// the runner-up), paired over the sweep's trials.
    pub checkpoint_advice: Option<IntervalAdvice>,
    /// ETT against the restart time.
    pub restart: Vec<Point>,
    /// ETT against the checkpoint write.
    pub write: Vec<Point>,
    /// ETT against the spare pool.
    pub spares: Vec<Point>,
    /// ETT against the collective timeout.
    pub hang: Vec<Point>,
    /// The drain policy over the precursor grid, on the run's job, with no
    /// false alarm (they are priced on their own).
    pub precursors: Vec<Cell>,
    /// The moonshot.
    pub moonshot: Moonshot,
}

/// The same inputs with no false alarm, degrade or quarantine.
fn quiet(i: &Inputs) -> Inputs {
    let mut q = i.clone();
    q.settings.false_alarms_per_gpu_day = 0.0;
    q.settings.false_quarantines_per_gpu_day = 0.0;
    q
}

/// A precursor flagged `lead_h` ahead for `coverage` of the failures,
/// every flag a degrade.
pub fn fixed(coverage: f64, lead_h: f64) -> Precursor {
    Precursor {
        coverage,
        lead: LeadTime::Fixed { hours: lead_h },
        quarantined: 0.0,
    }
}

impl Study {
    /// Runs everything.
    pub fn compute(inputs: Inputs) -> Result<Study, String> {
        let headline = run(
            &inputs.job,
            &inputs.settings,
            &inputs.mix,
            inputs.trials,
            inputs.seed,
        )?;
        let swept = Inputs {
            trials: inputs.sweep_trials.min(inputs.trials),
            ..inputs.clone()
        };
        let i = &swept;
        let no_false_alarms = drain_only(&quiet(&inputs), &inputs.job, &inputs.mix)?;
        let agent_no_false_quarantines =
            policy_only(&quiet(&inputs), &inputs.job, &inputs.mix, Policy::Agent)?;
        let differences = paired(&headline, &agent_no_false_quarantines, &no_false_alarms);
        let agent_swept = policy_only(&quiet(i), &i.job, &i.mix, Policy::Agent)?;
        let flagged = if i.mix.classes.iter().any(|c| c.precursor.coverage > 0.0) {
            i.mix.clone()
        } else {
            i.mix.with_precursor(&fixed(0.5, 1.0))
        };
        let false_alarms = false_alarm_sweep(i, &flagged)?;
        let q = &quiet(i);
        let [checkpoint, restart, write, spares, hang] = sensitivities(q)?;
        let checkpoint_advice = IntervalAdvice::of(q, &checkpoint)?;
        let precursors = grid(q, &i.job, &i.mix)?;
        let moonshot = moonshot(i)?;
        Ok(Study {
            headline,
            differences,
            no_false_alarms,
            agent_no_false_quarantines,
            agent_swept,
            false_alarms,
            checkpoint,
            checkpoint_advice,
            restart,
            write,
            spares,
            hang,
            precursors,
            moonshot,
            inputs,
        })
    }
}

/// The paired differences reported, by key: what each sets against what.
pub const DIFFERENCES: [(&str, &str); 4] = [
    ("agent_minus_reactive", "agent − reactive"),
    ("agent_drain_minus_reactive", "agent + drain − reactive"),
    ("agent_drain_minus_agent", "agent + drain − agent"),
    (
        "agent_drain_minus_agent_with_neither",
        "agent + drain without false alarms − agent without false quarantines",
    ),
];

/// One policy's ETT minus another's over the same trials.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    /// Its key in [`DIFFERENCES`] (and the JSON).
    pub key: &'static str,
    /// What it sets against what, in words.
    pub name: &'static str,
    /// The mean of the per-trial differences, a fraction.
    pub mean: f64,
    /// t times the sample standard deviation (n − 1) of the per-trial
    /// differences over √n, t Student's 95 % quantile at n − 1 degrees of
    /// freedom up to 30 and 1.96 beyond: the 95 % interval is the mean ±
    /// this. None with one trial.
    pub half_width: Option<f64>,
    /// The trials paired.
    pub trials: u32,
}

impl Difference {
    /// From the per-trial ETTs of two policies over the same trials.
    pub(super) fn paired(
        (key, name): (&'static str, &'static str),
        a: &[f64],
        b: &[f64],
    ) -> Difference {
        let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
        let n = d.len() as f64;
        let mean = d.iter().sum::<f64>() / n;
        let half_width = (d.len() > 1).then(|| {
            let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
            t95(d.len() - 1) * var.sqrt() / n.sqrt()
        });
        Difference {
            key,
            name,
            mean,
            half_width,
            trials: d.len() as u32,
        }
    }

    /// The interval's lower end (the mean with one trial).
    pub fn low(&self) -> f64 {
        self.mean - self.half_width.unwrap_or(0.0)
    }

    /// The interval's upper end (the mean with one trial).
    pub fn high(&self) -> f64 {
        self.mean + self.half_width.unwrap_or(0.0)
    }
}

/// Student's t two-sided 95 % quantile at 1 to 30 degrees of freedom.
const T95: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042,
];

/// The multiplier of SD/√n of a 95 % interval at `df` degrees of freedom
/// (trials − 1): Student's t up to 30, the normal's 1.96 beyond (t is
/// 2.04 at 31, 2.00 at 60: the interval then covers 94 to 95 %).
fn t95(df: usize) -> f64 {
    T95.get(df.wrapping_sub(1)).copied().unwrap_or(1.96)
}

/// Each trial's ETT under each of `policies`, one list per policy.
fn per_trial(i: &Inputs, policies: &[Policy]) -> Result<Vec<Vec<f64>>, String> {
    validate(&i.job, &i.settings, &i.mix, i.trials)?;
    let mut etts = vec![Vec::with_capacity(i.trials as usize); policies.len()];
    let three = (&i.job, &i.settings, &i.mix);
    each_trial(three, i.trials, i.seed, policies, |_, p, o| {
        let k = policies.iter().position(|&q| q == p).expect("asked");
        etts[k].push(o.ett());
    });
    Ok(etts)
}

/// The paired differences of [`DIFFERENCES`] over the same trials, from
/// each trial's ETT kept by the runs: the headline (reactive, agent,
/// drain policy), the agent with no false quarantine and the drain policy
/// with no false flag (the same failures: false flags are streams of
/// their own).
fn paired(headline: &Summary, agent: &PolicySummary, drain: &PolicySummary) -> Vec<Difference> {
    let [reactive, agent_all, drain_all] = [0, 1, 2].map(|k| &headline.policies[k].etts);
    vec![
        Difference::paired(DIFFERENCES[0], agent_all, reactive),
        Difference::paired(DIFFERENCES[1], drain_all, reactive),
        Difference::paired(DIFFERENCES[2], drain_all, agent_all),
        Difference::paired(DIFFERENCES[3], &drain.etts, &agent.etts),
    ]
}

/// ETT against C, R, W, the spare pool and the collective timeout.
fn sensitivities(i: &Inputs) -> Result<[Vec<Point>; 5], String> {
    let job = |f: &dyn Fn(&mut Job)| {
        let mut j = i.job.clone();
        f(&mut j);
        (j, i.settings.clone())
    };
    let mut cs: Vec<f64> = CHECKPOINT_MIN.to_vec();
    if !cs.contains(&i.job.checkpoint_min) {
        cs.push(i.job.checkpoint_min);
        cs.sort_by(f64::total_cmp);
    }
    let min_c = i.job.checkpoint_write_s / 60.0;
    let cs = cs.into_iter().filter(|&c| c > min_c);
    let max_w = i.job.checkpoint_min * 60.0;
    let ws = WRITE_S.into_iter().filter(|&w| w < max_w);
    Ok([
        sweep(i, cs, |c| job(&|j| j.checkpoint_min = c))?,
        sweep(i, RESTART_MIN, |r| job(&|j| j.restart_min = r))?,
        sweep(i, ws, |w| job(&|j| j.checkpoint_write_s = w))?,
        sweep(i, SPARES.map(f64::from), |s| {
            job(&|j| j.spare_hosts = s as u32)
        })?,
        sweep(i, HANG_MIN, |h| {
            let mut s = i.settings.clone();
            s.hang_timeout_min = h;
            (i.job.clone(), s)
        })?,
    ])
}

fn ett3(s: &Summary) -> [f64; 3] {
    [0, 1, 2].map(|k| s.policies[k].ett)
}

fn sweep(
    i: &Inputs,
    xs: impl IntoIterator<Item = f64>,
    at: impl Fn(f64) -> (Job, Settings),
) -> Result<Vec<Point>, String> {
    xs.into_iter()
        .map(|x| {
            let (job, settings) = at(x);
            let s = run(&job, &settings, &i.mix, i.trials, i.seed)?;
            Ok(Point { x, ett: ett3(&s) })
        })
        .collect()
}

fn drain_only(i: &Inputs, job: &Job, mix: &Mix) -> Result<PolicySummary, String> {
    policy_only(i, job, mix, Policy::AgentDrain)
}

/// One policy over the inputs' trials.
fn policy_only(i: &Inputs, job: &Job, mix: &Mix, p: Policy) -> Result<PolicySummary, String> {
    let s = run_policies(job, &i.settings, mix, i.trials, i.seed, &[p])?;
    Ok(s.policies.into_iter().next().expect("one policy"))
}

fn grid(i: &Inputs, job: &Job, mix: &Mix) -> Result<Vec<Cell>, String> {
    let mut out = Vec::new();
    for coverage in COVERAGE {
        for lead_h in LEAD_H {
            let m = mix.with_precursor(&fixed(coverage, lead_h));
            let ett = drain_only(i, job, &m)?.ett;
            out.push(Cell {
                coverage,
                lead_h,
                ett,
            });
        }
    }
    Ok(out)
}

/// The drain policy at one rate of false flags in the false-alarm sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct Swept {
    /// False flags per GPU-day, all false degrades.
    pub rate: f64,
    /// The drain policy's ETT.
    pub ett: f64,
    /// Its ETT minus the agent's (no false quarantine; a false degrade
    /// costs the agent nothing), trial by trial over the same failures.
    pub vs_agent: Difference,
}

/// The key and words of [`Swept::vs_agent`].
pub const SWEPT_VS_AGENT: (&str, &str) = (
    "agent_drain_minus_agent_no_false_quarantines",
    "agent + drain − agent without false quarantines",
);

/// The drain policy against the rate of false flags, every one counted
/// as a false degrade (no false quarantine): where the quarantine ends
/// no job a drain costs the two the same.
fn false_alarm_sweep(i: &Inputs, mix: &Mix) -> Result<Vec<Swept>, String> {
    let mut rates = FALSE_ALARMS.to_vec();
    let own = false_flags(&i.settings);
    if !rates.contains(&own) {
        rates.push(own);
        rates.sort_by(f64::total_cmp);
    }
    rates
        .into_iter()
        .map(|r| {
            let i2 = Inputs {
                settings: Settings {
                    false_alarms_per_gpu_day: r,
                    false_quarantines_per_gpu_day: 0.0,
                    ..i.settings.clone()
                },
                mix: mix.clone(),
                ..i.clone()
            };
            let both = per_trial(&i2, &[Policy::Agent, Policy::AgentDrain])?;
            let (agent, drain) = (&both[0], &both[1]);
            Ok(Swept {
                rate: r,
                ett: drain.iter().sum::<f64>() / drain.len() as f64,
                vs_agent: Difference::paired(SWEPT_VS_AGENT, drain, agent),
            })
        })
        .collect()
}

/// Every false flag per GPU-day the drain policy acts on: false degrades
/// and false quarantines.
pub fn false_flags(t: &Settings) -> f64 {
    t.false_alarms_per_gpu_day + t.false_quarantines_per_gpu_day
}

/// The moonshot's job: 16,384 GPUs at Llama 3's rate, the run's mix and
/// settings otherwise.
fn moonshot_job(i: &Inputs) -> (Job, Mix) {
    let job = Job {
        gpus: MOONSHOT_GPUS,
        ..i.job.clone()
    };
    let mix = Mix {
        rate_per_gpu_day: LLAMA3_RATE_PER_GPU_DAY,
        ..i.mix.clone()
    };
    (job, mix)
}

/// Precursors are priced without false alarms here; the run's own
/// precursors (the measured ones) with and without.
fn moonshot(with_false_alarms: &Inputs) -> Result<Moonshot, String> {
    let i = &quiet(with_false_alarms);
    let (job, mix) = moonshot_job(i);
    let plain = mix.with_precursor(&Precursor::none());
    let baseline = ett3(&run(&job, &i.settings, &plain, i.trials, i.seed)?);
    let grid = grid(i, &job, &mix)?;
    let measured = if i.measured {
        let bound = drain_only(with_false_alarms, &job, &mix)?.ett;
        Some((bound, drain_only(i, &job, &mix)?.ett))
    } else {
        None
    };
    let best = grid.iter().map(|c| c.ett).fold(0.0, f64::max);
    let perfect = mix.with_precursor(&fixed(1.0, 24.0));
    let settings_tried = settings_tried(i, &job, &perfect)?;
    let all = every_class_flagged(&mix);
    let at_best = settings_tried.first().map_or(Ok(0.0), |t| {
        let (j, i2) = tried(i, &job, t);
        drain_only(&i2, &j, &all).map(|s| s.ett)
    })?;
    let all_flagged = (drain_only(i, &job, &all)?.ett, at_best);
    Ok(Moonshot {
        job,
        baseline,
        grid,
        measured,
        settings_tried,
        all_flagged,
        ceiling: 1.0 - best,
    })
}

/// The mix as if a host saw every class and flagged each a day ahead.
fn every_class_flagged(mix: &Mix) -> Mix {
    let mut m = mix.clone();
    for c in &mut m.classes {
        c.host_visible = true;
    }
    m.with_precursor(&fixed(1.0, 24.0))
}

/// The job and inputs of a row of the settings tried.
fn tried(i: &Inputs, job: &Job, t: &Tried) -> (Job, Inputs) {
    let j = Job {
        checkpoint_min: t.checkpoint_min,
        checkpoint_write_s: t.write_s,
        restart_min: t.restart_min,
        ..job.clone()
    };
    let mut i2 = i.clone();
    i2.settings.hang_timeout_min = t.hang_min;
    (j, i2)
}

fn settings_tried(i: &Inputs, job: &Job, perfect: &Mix) -> Result<Vec<Tried>, String> {
    let mut out = Vec::new();
    let mut writes = vec![job.checkpoint_write_s, 1.0];
    writes.dedup();
    for checkpoint_min in [15.0, 10.0, 5.0, 3.0, 2.0, 1.0] {
        for &write_s in &writes {
            for restart_min in [5.0, 2.0, 1.0, 0.5] {
                for hang_min in [10.0, 2.0, 0.5] {
                    let mut t = Tried {
                        checkpoint_min,
                        write_s,
                        restart_min,
                        hang_min,
                        ett: 0.0,
                    };
                    let (j, i2) = tried(i, job, &t);
                    if j.validate().is_err() {
                        continue;
                    }
                    t.ett = drain_only(&i2, &j, perfect)?.ett;
                    out.push(t);
                }
            }
        }
    }
    out.sort_by(|a, b| b.ett.total_cmp(&a.ett));
    Ok(out)
}

impl Moonshot {
    /// The cells of the grid at or above the target, the fewest flagged
    /// and the shortest lead first.
    pub fn reaching(&self) -> Vec<&Cell> {
        let mut c: Vec<&Cell> = self.grid.iter().filter(|c| c.ett >= TARGET).collect();
        c.sort_by(|a, b| {
            a.coverage
                .total_cmp(&b.coverage)
                .then(a.lead_h.total_cmp(&b.lead_h))
        });
        c
    }

    /// The drain policy's best in the grid.
    pub fn best(&self) -> &Cell {
        self.grid
            .iter()
            .max_by(|a, b| a.ett.total_cmp(&b.ett))
            .expect("a grid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The paired differences as [`Study::compute`] takes them, without
    /// the sweeps.
    fn differences(i: &Inputs) -> Result<Vec<Difference>, String> {
        let headline = run(&i.job, &i.settings, &i.mix, i.trials, i.seed)?;
        let q = quiet(i);
        let agent = policy_only(&q, &i.job, &i.mix, Policy::Agent)?;
        Ok(paired(&headline, &agent, &drain_only(&q, &i.job, &i.mix)?))
    }

    /// The drain policy's inputs over `trials`: the default job for 10
    /// days, half of each visible class flagged an hour ahead.
    fn inputs(trials: u32) -> Inputs {
        let mix = Mix::default().with_precursor(&fixed(0.5, 1.0));
        Inputs {
            job: Job {
                days: 10.0,
                ..Job::default()
            },
            settings: Settings::default(),
            mix,
            measured: false,
            unmeasured: Vec::new(),
            trials,
            sweep_trials: trials,
            seed: 1,
        }
    }

    #[test]
    fn paired_differences_carry_an_interval_that_narrows_with_trials() {
        let at = |trials| differences(&inputs(trials)).expect("runs");
        let (few, many) = (at(40), at(400));
        assert_eq!(
            few.iter().map(|d| d.key).collect::<Vec<_>>(),
            DIFFERENCES.map(|(k, _)| k)
        );
        for (a, b) in few.iter().zip(&many) {
            assert_eq!((a.trials, b.trials), (40, 400));
            let (ha, hb) = (a.half_width.expect("40 trials"), b.half_width.expect("400"));
            assert!(ha.is_finite() && hb.is_finite(), "{a:?} {b:?}");
            assert!(a.low() <= a.mean && a.mean <= a.high(), "{a:?}");
            assert!(b.low() <= b.mean && b.mean <= b.high(), "{b:?}");
            if a.key == "agent_minus_reactive" {
                // At triage 0 with no quarantine ending a job the agent
                // and reactive handling lose the same time, trial by trial.
                assert_eq!((a.mean, ha, b.mean, hb), (0.0, 0.0, 0.0, 0.0));
                continue;
            }
            assert!(ha > 0.0, "{a:?}");
            // Ten times the trials: about a third of the width.
            assert!(hb < ha / 2.0, "{a:?} {b:?}");
            // The 40 trials' interval holds the 400 trials' mean.
            assert!(a.low() <= b.mean && b.mean <= a.high(), "{a:?} {b:?}");
        }
        // The drains' gain is measured on the same trials: the mean of
        // the differences is the difference of the means.
        let s = run(
            &inputs(40).job,
            &inputs(40).settings,
            &inputs(40).mix,
            40,
            1,
        )
        .unwrap();
        let d = &few[1];
        assert_eq!(d.key, "agent_drain_minus_reactive");
        assert!((d.mean - (s.policies[2].ett - s.policies[0].ett)).abs() < 1e-12);
        // One trial has no interval.
        assert!(differences(&inputs(1)).unwrap()[1].half_width.is_none());
    }

    const KEY: (&str, &str) = DIFFERENCES[0];

    #[test]
    fn a_paired_difference_takes_the_sample_sd_and_student_t_at_few_trials() {
        // Differences 1, 2, 3: mean 2, sample SD (n − 1) 1, t at 2 degrees
        // of freedom 4.303.
        let d = Difference::paired(KEY, &[1.0, 2.0, 3.0], &[0.0; 3]);
        assert_eq!((d.mean, d.trials), (2.0, 3));
        let h = d.half_width.expect("three trials");
        assert!((h - 4.303 / 3f64.sqrt()).abs() < 1e-9, "{h}");
        // Beyond 30 degrees of freedom, 1.96: differences 0, 2, 0, 2 ...
        // over 100 trials, mean 1, sample variance 100/99.
        let a: Vec<f64> = (0..100).map(|k| f64::from(k % 2) * 2.0).collect();
        let d = Difference::paired(KEY, &a, &[0.0; 100]);
        let want = 1.96 * (100.0f64 / 99.0).sqrt() / 10.0;
        assert!((d.half_width.unwrap() - want).abs() < 1e-12, "{d:?}");
        assert_eq!((t95(30), t95(31)), (2.042, 1.96));
    }

    #[test]
    fn the_interval_covers_the_true_mean_95_percent_of_the_time_at_4_trials() {
        // Normal differences of mean 0 from a fixed-seed generator, 4 to a
        // run: with 1.96 in place of t at 3 degrees of freedom the interval
        // covers about 86 % of runs.
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut normal = move || {
            let (u, v): (f64, f64) = (rng.gen_range(f64::EPSILON..1.0), rng.gen());
            (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
        };
        let runs = 20_000;
        let covered = (0..runs)
            .filter(|_| {
                let a: Vec<f64> = (0..4).map(|_| normal()).collect();
                let d = Difference::paired(KEY, &a, &[0.0; 4]);
                d.low() <= 0.0 && 0.0 <= d.high()
            })
            .count();
        let share = covered as f64 / f64::from(runs);
        assert!((0.94..0.96).contains(&share), "{share}");
    }
}
