//! The report's advice on the checkpoint interval: the best interval
//! swept for reactive handling set against the run's own, trial by trial
//! over the same failures, with the paired difference's 95 % interval. A
//! best mean alone is no advice: where the interval holds 0 the report
//! says there is no clear difference.
//!
//! Glossary:
//! - *best swept*: the swept interval with the highest mean ETT under
//!   reactive handling (the sweep's other policies as in the sweep).
//! - *set against*: the run's own interval (`--checkpoint-min`); where
//!   that is the best swept, the runner-up (the next highest mean), so
//!   the advice still says how far ahead the best is.
//! - *clear difference*: a paired difference whose 95 % interval lies
//!   wholly above 0 or wholly below it.

use loopwarden_twin::goodput::trials::run_policies;
use loopwarden_twin::goodput::Policy;

use super::study::{Difference, Inputs, Point};

/// The key and words of the advice's paired difference.
pub const BEST_MINUS_OTHER: (&str, &str) = (
    "best_interval_minus_other",
    "reactive at the best checkpoint interval swept − at the one set against",
);

/// The best interval swept, the one it is set against, and the paired
/// difference between them under reactive handling.
#[derive(Debug, Clone, PartialEq)]
pub struct IntervalAdvice {
    /// The best swept, minutes.
    pub best_min: f64,
    /// The one set against, minutes.
    pub against_min: f64,
    /// Whether `against_min` is the run's own interval (else the
    /// runner-up, the run's own being the best).
    pub against_the_runs: bool,
    /// Best minus set against, over the sweep's trials.
    pub difference: Difference,
}

impl IntervalAdvice {
    /// Sets the best of `points` (the checkpoint sweep of `i`, whose
    /// trials it reruns under reactive handling) against the run's own
    /// interval or the runner-up. None with fewer than two points.
    pub fn of(i: &Inputs, points: &[Point]) -> Result<Option<IntervalAdvice>, String> {
        let ranked = ranked(points);
        let (Some(best), Some(runner_up)) = (ranked.first(), ranked.get(1)) else {
            return Ok(None);
        };
        let own = i.job.checkpoint_min;
        let runs_swept = points.iter().any(|p| p.x == own);
        let against_the_runs = runs_swept && best.x != own;
        let against_min = if against_the_runs { own } else { runner_up.x };
        let best_etts = reactive_etts(i, best.x)?;
        let other_etts = reactive_etts(i, against_min)?;
        Ok(Some(IntervalAdvice {
            best_min: best.x,
            against_min,
            against_the_runs,
            difference: Difference::paired(BEST_MINUS_OTHER, &best_etts, &other_etts),
        }))
    }

    /// Whether the paired interval lies wholly on one side of 0.
    pub fn clear(&self) -> bool {
        self.difference.half_width.is_some()
            && (self.difference.low() > 0.0 || self.difference.high() < 0.0)
    }

    /// The advice in words, for the report: the difference with its
    /// interval, and "no clear difference" where the interval holds 0.
    pub fn sentence(&self) -> String {
        let d = &self.difference;
        let figure = match d.half_width {
            Some(h) => format!("{:+.2} ± {:.2} points (95 %)", d.mean * 100.0, h * 100.0),
            None => format!("{:+.2} points (one trial: no interval)", d.mean * 100.0),
        };
        let against = if self.against_the_runs {
            format!("the run's {} min", num(self.against_min))
        } else {
            format!(
                "the runner-up, {} min (the run's own is the best)",
                num(self.against_min)
            )
        };
        let verdict = if self.clear() {
            "a clear difference"
        } else {
            "no clear difference: the interval holds 0, so either will do at this number of trials"
        };
        format!(
            "Against {against}, paired over the same {} trials: {figure}, {verdict}.",
            d.trials
        )
    }
}

/// The checkpoint sweep's points, best first: highest ETT under reactive
/// handling, the first swept of equals first. The report's best and the
/// advice's are both the first of these, so a tie cannot part them.
pub fn ranked(points: &[Point]) -> Vec<&Point> {
    let mut ranked: Vec<&Point> = points.iter().collect();
    ranked.sort_by(|a, b| b.ett[0].total_cmp(&a.ett[0]));
    ranked
}

/// Each trial's ETT under reactive handling with checkpoints every
/// `checkpoint_min`, `i` otherwise as given.
fn reactive_etts(i: &Inputs, checkpoint_min: f64) -> Result<Vec<f64>, String> {
    let mut job = i.job.clone();
    job.checkpoint_min = checkpoint_min;
    let s = run_policies(
        &job,
        &i.settings,
        &i.mix,
        i.trials,
        i.seed,
        &[Policy::Reactive],
    )?;
    Ok(s.policies
        .into_iter()
        .next()
        .map(|p| p.etts)
        .unwrap_or_default())
}

/// A figure to 3 decimals without trailing zeros, as the report writes
/// them.
fn num(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goodput::report::markdown;
    use crate::goodput::study::{fixed, Study};
    use loopwarden_twin::goodput::{Job, Mix, Settings};

    /// A small job (1,024 GPUs, 3 days), checkpoints every `checkpoint_min`,
    /// 10 trials.
    fn inputs(checkpoint_min: f64) -> Inputs {
        Inputs {
            job: Job {
                gpus: 1024,
                days: 3.0,
                checkpoint_min,
                ..Job::default()
            },
            settings: Settings::default(),
            mix: Mix::default().with_precursor(&fixed(1e-12, 1.0)),
            measured: false,
            unmeasured: Vec::new(),
            trials: 10,
            sweep_trials: 10,
            seed: 3,
        }
    }

    fn difference(mean: f64, half_width: Option<f64>) -> Difference {
        Difference {
            key: BEST_MINUS_OTHER.0,
            name: BEST_MINUS_OTHER.1,
            mean,
            half_width,
            trials: 10,
        }
    }

    fn advice(mean: f64, half_width: Option<f64>) -> IntervalAdvice {
        IntervalAdvice {
            best_min: 10.0,
            against_min: 15.0,
            against_the_runs: true,
            difference: difference(mean, half_width),
        }
    }

    #[test]
    fn an_interval_holding_0_is_no_clear_difference() {
        let a = advice(0.002, Some(0.003));
        assert!(!a.clear());
        assert_eq!(
            a.sentence(),
            "Against the run's 15 min, paired over the same 10 trials: +0.20 ± 0.30 points \
             (95 %), no clear difference: the interval holds 0, so either will do at this \
             number of trials."
        );
        let a = advice(0.002, Some(0.001));
        assert!(a.clear());
        assert!(a
            .sentence()
            .ends_with("+0.20 ± 0.10 points (95 %), a clear difference."));
        // One trial has no interval: never a clear difference.
        let a = advice(0.002, None);
        assert!(!a.clear());
        assert!(
            a.sentence().contains("no clear difference"),
            "{}",
            a.sentence()
        );
    }

    #[test]
    fn the_best_is_paired_with_the_runs_own_interval_or_the_runner_up() {
        let i = inputs(240.0);
        let points = [10.0, 240.0].map(|x| Point {
            x,
            ett: [
                reactive_etts(&i, x).unwrap().iter().sum::<f64>() / 10.0,
                0.0,
                0.0,
            ],
        });
        let a = IntervalAdvice::of(&i, &points).unwrap().unwrap();
        assert_eq!(
            (a.best_min, a.against_min, a.against_the_runs),
            (10.0, 240.0, true)
        );
        // Paired trial by trial: the mean difference is the means'.
        let d = &a.difference;
        assert!((d.mean - (points[0].ett[0] - points[1].ett[0])).abs() < 1e-12);
        assert_eq!(d.trials, 10);
        // Four-hour checkpoints on a job interrupted every few hours lose
        // far more than the noise of 10 trials.
        assert!(a.clear(), "{}", a.sentence());
        // The run's own interval the best: set against the runner-up.
        let a = IntervalAdvice::of(&inputs(10.0), &points).unwrap().unwrap();
        assert_eq!(
            (a.best_min, a.against_min, a.against_the_runs),
            (10.0, 240.0, false)
        );
        assert!(
            a.sentence().contains("the runner-up, 240 min"),
            "{}",
            a.sentence()
        );
        assert_eq!(IntervalAdvice::of(&i, &points[..1]).unwrap(), None);
    }

    #[test]
    fn the_report_gives_the_checkpoint_advice_its_paired_interval() {
        let s = Study::compute(inputs(15.0)).unwrap();
        let a = s
            .checkpoint_advice
            .as_ref()
            .expect("a sweep of several intervals");
        assert_eq!(a.difference.trials, 10);
        let md = markdown(&s, &[]);
        let para = md
            .lines()
            .find(|l| l.starts_with("**Choosing the checkpoint interval.**"))
            .expect("the checkpoint advice");
        assert!(para.ends_with(&a.sentence()), "{para}");
        assert!(para.contains("paired over the same 10 trials"), "{para}");
    }

    #[test]
    fn on_a_tie_the_report_names_the_best_the_advice_pairs() {
        let mut s = Study::compute(inputs(15.0)).unwrap();
        assert!(s.checkpoint.len() >= 2, "a sweep of several intervals");
        // Every interval swept equally good: the first of them is the best.
        for p in &mut s.checkpoint {
            p.ett[0] = 0.9;
        }
        s.checkpoint_advice = IntervalAdvice::of(&s.inputs, &s.checkpoint).unwrap();
        let a = s.checkpoint_advice.as_ref().expect("the advice");
        assert_eq!(a.best_min, s.checkpoint[0].x);
        let md = markdown(&s, &[]);
        let want = format!(
            "The best swept for reactive handling is {} min",
            num(a.best_min)
        );
        assert!(md.contains(&want), "{want}\n{md}");
    }
}
