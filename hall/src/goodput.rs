//! `loopwarden-hall goodput`: what a large training job's effective
//! training time (ETT) is under failures, handled reactively, by the host
//! agent, and by the agent with drains (`docs/goodput.md`).
//!
//! The job model and the Monte Carlo engine are `loopwarden_twin::goodput`;
//! this command gathers the inputs (flags, a `--mix` file, the `measured`
//! precursor model of [`loopwarden_hall::precursors`]), computes every
//! figure ([`study`]; the checkpoint interval's advice, paired,
//! [`interval`]) and writes the report: `report.md` ([`report`]) and
//! three SVG charts ([`charts`]), into `--out` (`goodput-run/`).
//!
//! Glossary:
//! - *measured model*: per visible class, the precursor coverage and lead
//!   times the real health engine achieved on generated traces, its
//!   detection latency and a bound on its false alarms.
//! - *swept models*: precursors given as inputs (a coverage, a lead time)
//!   and varied in the report, since no public source gives them.

pub mod charts;
pub mod interval;
pub mod report;
pub mod study;
pub mod verdict;

use std::fs;
use std::path::PathBuf;

use clap::Args;
use loopwarden_twin::goodput::{Job, Mix, PolicySummary, Settings};
use serde_json::{json, Map, Value};

use study::{Inputs, Study};

/// `loopwarden-hall goodput`'s flags: every input of the model.
#[derive(Debug, Args)]
pub struct GoodputArgs {
    /// GPUs in the job (G).
    #[arg(long, default_value_t = Job::default().gpus)]
    gpus: u32,
    /// GPUs to a host.
    #[arg(long, default_value_t = Job::default().gpus_per_host)]
    gpus_per_host: u32,
    /// Spare hosts (S).
    #[arg(long, default_value_t = Job::default().spare_hosts)]
    spare_hosts: u32,
    /// Days of wall-clock time (D).
    #[arg(long, default_value_t = Job::default().days)]
    days: f64,
    /// Minutes between checkpoints, the write included (C).
    #[arg(long, default_value_t = Job::default().checkpoint_min)]
    checkpoint_min: f64,
    /// Seconds the job stops to write a checkpoint (W).
    #[arg(long, default_value_t = Job::default().checkpoint_write_s)]
    checkpoint_write_s: f64,
    /// Minutes from a failure found to training again (R).
    #[arg(long, default_value_t = Job::default().restart_min)]
    restart_min: f64,
    /// Hours until an excluded host is back in the spare pool.
    #[arg(long, default_value_t = Job::default().repair_hours)]
    repair_hours: f64,
    /// Minutes a hung collective waits before the job stops.
    #[arg(long, default_value_t = Settings::default().hang_timeout_min)]
    hang_timeout_min: f64,
    /// Minutes a person or a script takes to exclude a host no agent named.
    #[arg(long, default_value_t = Settings::default().triage_min)]
    triage_min: f64,
    /// Seconds from a failure the agent sees to the GPU quarantined
    /// [default: the measured model's, else 4 s, the stall rule's worst
    /// case at 1 s sampling].
    #[arg(long)]
    detection_s: Option<f64>,
    /// Healthy GPUs flagged degraded per GPU-day, never quarantined: a
    /// degraded GPU stays in service, so only a drain acts on them
    /// [default: what the measured model's bound on every false flag
    /// leaves after false quarantines' bound, else 0].
    #[arg(long)]
    false_alarms_per_gpu_day: Option<f64>,
    /// Healthy GPUs quarantined per GPU-day: under both agent policies the
    /// host is left out of the next restart (a spare, back after the
    /// repair time), and with --quarantine-ends-job the job also stops
    /// at once [default: the measured model's bound, else 0].
    #[arg(long)]
    false_quarantines_per_gpu_day: Option<f64>,
    /// The site's quarantine action ends the job on the host (a scancel
    /// or a requeue among the actions), so a hang the agent sees stops the
    /// job in its detection latency; without it (a drain or a taint) every
    /// hang waits for the collective timeout.
    #[arg(long)]
    quarantine_ends_job: bool,
    /// Interruptions per GPU-day [default: the mix's; Llama 3's is
    /// 419 / (54 × 16,384)].
    #[arg(long)]
    rate_per_gpu_day: Option<f64>,
    /// A failure mix (`goodput-mix/1` TOML) [default: Llama 3's Table 5].
    #[arg(long, value_name = "FILE.toml")]
    mix: Option<PathBuf>,
    /// Trials of the headline run (ETT per policy, where the time goes).
    #[arg(long, default_value_t = 1000)]
    trials: u32,
    /// Trials of each run of the sensitivities, the precursor and
    /// false-alarm sweeps and the moonshot (at most --trials).
    #[arg(long, default_value_t = 200)]
    sweep_trials: u32,
    /// The seed of every run (and of the measured model's traces).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Folder for report.md and the charts (made if missing).
    #[arg(long, default_value = "goodput-run")]
    out: PathBuf,
    /// Leave out the measured precursor model (no trace replay).
    #[arg(long)]
    no_measured: bool,
    /// Print one JSON summary object as the last line.
    #[arg(long)]
    json: bool,
}

/// What the measured model gives the run.
struct Measured {
    classes: Vec<(String, loopwarden_twin::goodput::Precursor)>,
    detection_s: f64,
    false_alarms_per_gpu_day: f64,
    false_quarantines_per_gpu_day: f64,
    notes: Vec<String>,
}

/// The measured model for a run of `mix` (its detection latency over the
/// classes `mix` plays as hangs a host sees).
fn measured(a: &GoodputArgs, mix: &Mix) -> Result<Option<Measured>, String> {
    if a.no_measured {
        return Ok(None);
    }
    let m = loopwarden_hall::precursors::measured(a.seed, mix)
        .map_err(|e| format!("the measured precursor model: {e}"))?;
    Ok(Some(Measured {
        classes: m.classes,
        detection_s: m.detection_s,
        false_alarms_per_gpu_day: m.false_alarms_per_gpu_day,
        false_quarantines_per_gpu_day: m.false_quarantines_per_gpu_day,
        notes: m.notes,
    }))
}

/// The `--mix` file's mix, else Llama 3's.
fn mix(a: &GoodputArgs) -> Result<Mix, String> {
    match &a.mix {
        Some(p) => Mix::load(p).map_err(|e| e.to_string()),
        None => Ok(Mix::default()),
    }
}

fn inputs(a: &GoodputArgs, m: Option<&Measured>) -> Result<Inputs, String> {
    let mut mix = mix(a)?;
    let mut unmeasured = Vec::new();
    if let Some(m) = m {
        // The measured precursors for the classes the mix has by name.
        let known: Vec<_> = m
            .classes
            .iter()
            .filter(|(name, _)| {
                mix.classes
                    .iter()
                    .any(|c| c.host_visible && &c.name == name)
            })
            .cloned()
            .collect();
        let covers = |n: &String| known.iter().any(|(k, _)| k == n);
        unmeasured = mix
            .classes
            .iter()
            .filter(|c| c.host_visible && !covers(&c.name))
            .map(|c| c.name.clone())
            .collect();
        if known.is_empty() {
            let names = |v: Vec<&String>| {
                let v: Vec<&str> = v.into_iter().map(String::as_str).collect();
                if v.is_empty() {
                    "none".to_string()
                } else {
                    v.join(", ")
                }
            };
            return Err(format!(
                "the measured precursor model covers none of the mix's host-visible classes \
                 ({}): it measures {}; name them so in the mix, or pass --no-measured",
                names(unmeasured.iter().collect()),
                names(m.classes.iter().map(|(n, _)| n).collect()),
            ));
        }
        mix = mix.with_precursors(&known)?;
    }
    if let Some(r) = a.rate_per_gpu_day {
        mix.rate_per_gpu_day = r;
    }
    let job = Job {
        gpus: a.gpus,
        gpus_per_host: a.gpus_per_host,
        spare_hosts: a.spare_hosts,
        days: a.days,
        checkpoint_min: a.checkpoint_min,
        checkpoint_write_s: a.checkpoint_write_s,
        restart_min: a.restart_min,
        repair_hours: a.repair_hours,
    };
    let d = Settings::default();
    let settings = Settings {
        hang_timeout_min: a.hang_timeout_min,
        triage_min: a.triage_min,
        detection_s: a
            .detection_s
            .or(m.map(|m| m.detection_s))
            .unwrap_or(d.detection_s),
        false_alarms_per_gpu_day: a
            .false_alarms_per_gpu_day
            .or(m.map(|m| m.false_alarms_per_gpu_day))
            .unwrap_or(d.false_alarms_per_gpu_day),
        false_quarantines_per_gpu_day: a
            .false_quarantines_per_gpu_day
            .or(m.map(|m| m.false_quarantines_per_gpu_day))
            .unwrap_or(d.false_quarantines_per_gpu_day),
        quarantine_ends_job: a.quarantine_ends_job,
    };
    loopwarden_twin::goodput::trials::validate(&job, &settings, &mix, a.trials)?;
    if a.sweep_trials == 0 {
        return Err("sweep_trials = 0: at least 1 (--sweep-trials)".to_string());
    }
    Ok(Inputs {
        job,
        settings,
        mix,
        measured: m.is_some(),
        unmeasured,
        trials: a.trials,
        sweep_trials: a.sweep_trials.min(a.trials),
        seed: a.seed,
    })
}

/// Runs the command: the report's files, then (with `--json`) the
/// summary, one line each, for standard output.
pub fn run(a: &GoodputArgs) -> Result<Vec<String>, String> {
    let m = measured(a, &mix(a)?)?;
    let inputs = inputs(a, m.as_ref())?;
    let study = Study::compute(inputs)?;
    fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    charts::write(&a.out, &study)?;
    let notes = m.map(|m| m.notes).unwrap_or_default();
    let page = a.out.join(report::REPORT);
    fs::write(&page, report::markdown(&study, &notes))
        .map_err(|e| format!("{}: {e}", page.display()))?;
    let mut lines: Vec<String> = charts::CHARTS
        .iter()
        .map(|c| a.out.join(c).display().to_string())
        .collect();
    lines.push(page.display().to_string());
    if a.json {
        lines.push(summary_json(&study).to_string());
    } else {
        lines.push(headline(&study));
    }
    Ok(lines)
}

fn headline(s: &Study) -> String {
    let p = &s.headline.policies;
    let mut line = format!(
        "ETT over {} trials: reactive {:.2} %, agent {:.2} %, agent + drain {:.2} %",
        s.inputs.trials,
        p[0].ett * 100.0,
        p[1].ett * 100.0,
        p[2].ett * 100.0
    );
    let quiet = s.no_false_alarms.ett * 100.0;
    let agent = s.agent_no_false_quarantines.ett * 100.0;
    line += &format!(
        " (agent {agent:.2} % without false quarantines, agent + drain {quiet:.2} % without false alarms; \
         the drain needs the site's scheduler to requeue at a checkpoint, which Loopwarden does not ship)"
    );
    line
}

fn per_policy(s: &Study, f: impl Fn(&PolicySummary) -> Value) -> Value {
    let mut m = Map::new();
    for p in &s.headline.policies {
        m.insert(p.policy.name().to_string(), f(p));
    }
    m.insert(
        "agent_no_false_quarantines".to_string(),
        f(&s.agent_no_false_quarantines),
    );
    m.insert(
        "agent_drain_no_false_alarms".to_string(),
        f(&s.no_false_alarms),
    );
    Value::Object(m)
}

fn by_name(pairs: &[(String, f64)]) -> Value {
    Value::Object(pairs.iter().map(|(k, v)| (k.clone(), json!(v))).collect())
}

/// The paired differences between policies: per key, the mean (a
/// fraction), the 95 % interval's half-width (null with one trial) and
/// the trials.
fn differences_json(s: &Study) -> Value {
    let m = s.differences.iter().map(|d| {
        let v = json!({"mean": d.mean, "ci95_half_width": d.half_width, "trials": d.trials});
        (d.key.to_string(), v)
    });
    Value::Object(m.collect())
}

/// The `--json` summary.
pub fn summary_json(s: &Study) -> Value {
    let mo = &s.moonshot;
    json!({
        "ett": per_policy(s, |p| json!(p.ett)),
        "ett_p05": per_policy(s, |p| json!(p.ett_p05)),
        "ett_p95": per_policy(s, |p| json!(p.ett_p95)),
        "interruptions": per_policy(s, |p| json!(p.interruptions)),
        "interruptions_by_cause": per_policy(s, |p| by_name(&p.interruptions_by_class)),
        "quarantine_stops": per_policy(s, |p| json!(p.quarantine_stops)),
        "lost_gpu_h_by_cause": per_policy(s, |p| by_name(&p.lost_by_cause)),
        "lost_gpu_h_by_part": per_policy(s, |p| serde_json::to_value(&p.lost).unwrap_or(Value::Null)),
        "ett_differences": differences_json(s),
        "moonshot": {
            "gpus": mo.job.gpus,
            "target": study::TARGET,
            "best_precursor": {"coverage": mo.best().coverage, "lead_h": mo.best().lead_h, "ett": mo.best().ett},
            "reaching": mo.reaching().iter().map(|c| json!({"coverage": c.coverage, "lead_h": c.lead_h, "ett": c.ett})).collect::<Vec<_>>(),
            "measured_ett": mo.measured.map(|(bound, none)| json!({
                "at_false_alarm_bound": bound,
                "without_false_alarms": none,
            })),
        },
        "precursors": if s.inputs.measured { "measured" } else { "mix" },
        "unmeasured_classes": s.inputs.unmeasured,
        "detection_s": s.inputs.settings.detection_s,
        "false_alarms_per_gpu_day": s.inputs.settings.false_alarms_per_gpu_day,
        "false_quarantines_per_gpu_day": s.inputs.settings.false_quarantines_per_gpu_day,
        "quarantine_ends_job": s.inputs.settings.quarantine_ends_job,
        "trials": s.inputs.trials,
        "seed": s.inputs.seed,
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use loopwarden_twin::goodput::{LeadTime, Precursor};

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: GoodputArgs,
    }

    fn args(flags: &[&str]) -> GoodputArgs {
        let argv = std::iter::once("goodput").chain(flags.iter().copied());
        Cli::try_parse_from(argv).unwrap().args
    }

    fn model() -> Measured {
        let p = Precursor {
            coverage: 0.4,
            lead: LeadTime::Empirical {
                hours: vec![0.5, 1.5],
            },
            quarantined: 0.0,
        };
        Measured {
            classes: vec![
                ("hbm3".into(), p),
                ("no_such_class".into(), Precursor::none()),
            ],
            detection_s: 0.25,
            false_alarms_per_gpu_day: 1e-3,
            false_quarantines_per_gpu_day: 2e-3,
            notes: Vec::new(),
        }
    }

    #[test]
    fn the_measured_model_gives_the_visible_classes_their_precursors_and_the_agent_its_figures() {
        let i = inputs(&args(&[]), Some(&model())).unwrap();
        let hbm = i.mix.classes.iter().find(|c| c.name == "hbm3").unwrap();
        assert_eq!(hbm.precursor.coverage, 0.4);
        let gpu = i
            .mix
            .classes
            .iter()
            .find(|c| c.name == "faulty_gpu")
            .unwrap();
        assert_eq!(gpu.precursor, Precursor::none());
        assert_eq!(i.settings.detection_s, 0.25);
        assert_eq!(i.settings.false_alarms_per_gpu_day, 1e-3);
        assert_eq!(i.settings.false_quarantines_per_gpu_day, 2e-3);
        assert!(i.measured);
        // The test model covers hbm3 alone: Llama 3's other visible
        // classes keep the mix's own precursors, and are named.
        assert_eq!(i.unmeasured, ["faulty_gpu", "gpu_sram", "gsp", "thermal"]);
        // Flags given win over the model.
        let flags = [
            "--detection-s",
            "2",
            "--false-alarms-per-gpu-day",
            "0",
            "--false-quarantines-per-gpu-day",
            "0",
        ];
        let i = inputs(&args(&flags), Some(&model())).unwrap();
        assert_eq!(i.settings.detection_s, 2.0);
        assert_eq!(i.settings.false_alarms_per_gpu_day, 0.0);
        assert_eq!(i.settings.false_quarantines_per_gpu_day, 0.0);
        // Without it: the flags' defaults and the mix's own precursors.
        let i = inputs(&args(&[]), None).unwrap();
        assert_eq!(i.settings.detection_s, Settings::default().detection_s);
        assert!(!i.measured && i.mix.classes.iter().all(|c| c.precursor.coverage == 0.0));
    }

    #[test]
    fn the_quarantine_ends_no_job_unless_the_flag_says_it_does() {
        let i = inputs(&args(&[]), None).unwrap();
        assert!(!i.settings.quarantine_ends_job);
        let i = inputs(&args(&["--quarantine-ends-job"]), None).unwrap();
        assert!(i.settings.quarantine_ends_job);
    }

    #[test]
    fn an_input_out_of_range_is_refused_by_its_flag() {
        let e = inputs(&args(&["--gpus", "100"]), None).unwrap_err();
        assert_eq!(e, "gpus = 100: a whole number of hosts");
        let e = inputs(&args(&["--trials", "0"]), None).unwrap_err();
        assert_eq!(e, "trials = 0: at least 1");
        let e = inputs(&args(&["--rate-per-gpu-day", "2"]), None).unwrap_err();
        assert!(e.contains("rate_per_gpu_day = 2"), "{e}");
        let e = inputs(&args(&["--sweep-trials", "0"]), None).unwrap_err();
        assert!(e.contains("--sweep-trials"), "{e}");
        // Above --trials it is --trials, as its help says.
        let i = inputs(&args(&["--trials", "5", "--sweep-trials", "9"]), None).unwrap();
        assert_eq!(i.sweep_trials, 5);
    }

    /// A mix of two host-visible classes, `a` and `b`, and a switch.
    fn mix_file(dir: &std::path::Path, a: &str, b: &str) -> std::path::PathBuf {
        let class = |name: &str, share: f64, visible: bool| {
            format!(
                "[[class]]\nname = \"{name}\"\nshare = {share}\nhost_visible = {visible}\n\
                 onset = \"crash\"\n"
            )
        };
        let text = format!(
            "format = \"goodput-mix/1\"\nsource = \"three classes\"\n\
             rate_per_gpu_day = 0.0005\n{}{}{}",
            class(a, 0.4, true),
            class(b, 0.3, true),
            class("switch", 0.3, false)
        );
        let path = dir.join(format!("{a}-{b}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn the_measured_model_is_applied_only_to_the_classes_it_covers() {
        let dir = tempfile::tempdir().unwrap();
        let none = mix_file(dir.path(), "gpu", "memory");
        let flags = ["--mix", none.to_str().unwrap()];
        let e = inputs(&args(&flags), Some(&model())).unwrap_err();
        assert!(
            e.contains("covers none of the mix's host-visible classes (gpu, memory)"),
            "{e}"
        );
        assert!(e.contains("--no-measured"), "{e}");
        // Without the model the same mix is the mix's own.
        assert!(!inputs(&args(&flags), None).unwrap().measured);
        let some = mix_file(dir.path(), "hbm3", "gpu");
        let i = inputs(&args(&["--mix", some.to_str().unwrap()]), Some(&model())).unwrap();
        assert!(i.measured);
        assert_eq!(i.unmeasured, ["gpu"]);
        let hbm = i.mix.classes.iter().find(|c| c.name == "hbm3").unwrap();
        assert_eq!(hbm.precursor.coverage, 0.4);
    }
}
