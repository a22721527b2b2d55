//! The job-level twin at Llama 3's scale, timed.
//!
//! `cargo bench -p loopwarden-twin --bench goodput` runs 1,000 trials of a
//! 16,384-GPU job over 54 days at Llama 3's rate and mix (about 419
//! failures a trial), every policy on each trial's draws, as
//! `loopwarden-hall goodput` does for its headline figures. The drain
//! policy has precursors to act on (half the visible failures flagged,
//! 2 hours ahead on average) and false alarms, so every path is timed.
//! Five samples of one run each; divan prints the median.

use loopwarden_twin::goodput::{run, Job, LeadTime, Mix, Precursor, Settings};

fn main() {
    divan::main();
}

#[divan::bench(sample_count = 5, sample_size = 1)]
fn llama3_16384_gpus_54_days_1000_trials() -> f64 {
    let p = Precursor {
        coverage: 0.5,
        lead: LeadTime::Exponential { mean_hours: 2.0 },
        quarantined: 0.0,
    };
    let mix = Mix::default().with_precursor(&p);
    let settings = Settings {
        false_alarms_per_gpu_day: 1e-4,
        ..Settings::default()
    };
    let s = run(&Job::default(), &settings, &mix, 1000, 1).expect("valid inputs");
    divan::black_box(s.policies[2].ett)
}
