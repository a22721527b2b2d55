//! The `measured` precursor model of the job-level twin: what the real
//! health engine (`node_core::health`) flags before a GPU fails, and how
//! long before, on generated traces (`docs/goodput-precursors.md`).
//!
//! For each host-visible class of Llama 3's failure mix (`faulty_gpu`,
//! `hbm3`, `gpu_sram`, `gsp`, `thermal`) this module generates 8-GPU
//! host traces in the repository's `gpu-trace/1` format, each with one
//! GPU failing at a known time, with or without a precursor
//! ([`scenarios`]), and healthy hosts with the benign events of normal
//! days. It replays every trace through
//! `node_core::replay::replay_scheduled`, the function `node-agent replay`
//! runs, with the default policy and the live agent's slow-counter
//! schedule (30 s), reads the verdict lines back as the repository's
//! scorer does, and turns them into:
//!
//! - per class, the share of failures the engine flagged (degraded or
//!   quarantined) after the precursor began and before the failure
//!   (`coverage`), those lead times (`LeadTime::Empirical`), and the share
//!   of them quarantined before they struck (`quarantined`);
//! - the detection latency (the failure's start to the quarantine) over
//!   the failures the job model applies it to: those of the classes the
//!   run's mix plays as hangs a host sees (`gsp` in the default mix); the
//!   hangs of a class it plays as a crash (`faulty_gpu`'s without an XID)
//!   are said apart, a figure it does not use ([`detection`]);
//! - upper bounds on false alarms per GPU-day, every GPU that left
//!   `healthy` without a fault over the GPU-days replayed, counted apart:
//!   false quarantines (it reached `quarantined` before it was healthy
//!   again) and false degrades (it stopped at `degraded`), and their
//!   total.
//!
//! The traces and their `*.expect.json` can be written to disk
//! ([`GenTrace::write`]) and scored with `score.py` like the repository's.
//!
//! Glossary:
//! - *flag*: a GPU's state rising from healthy (degraded or quarantined);
//!   a drain acts on either.
//! - *lead*: failure minus the first flag after the precursor's onset.
//! - *false alarm*: a flag on a GPU with nothing wrong with it (or before
//!   its precursor began): a false quarantine or a false degrade.

pub mod detection;
mod false_flags;
pub mod host;
pub mod scenarios;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use loopwarden_twin::goodput::{LeadTime, Mix, Precursor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;

use false_flags::false_flags;
pub use false_flags::{poisson_upper_95, FalseAlarm};
use host::{Host, GPUS, PERIOD_MS};
use scenarios::{draw, kind_of, log_uniform, Benign, Failure, Mechanism, Running, MIXES};

/// The live agent's slow-counter schedule (`slow_counters_s`, 30 s by
/// default), as `node-agent replay --slow-counters-s 30` replays it.
pub const SLOW_COUNTERS_MS: u64 = 30_000;

/// What the real health engine achieved on generated traces.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredModel {
    /// Per host-visible class name: "faulty_gpu", "hbm3", "gpu_sram",
    /// "gsp", "thermal" — the precursor the real health engine achieved
    /// on generated traces. A class the engine never flagged in time has
    /// [`Precursor::none`] (coverage 0, no lead-time list).
    pub classes: Vec<(String, Precursor)>,
    /// The engine's detection latency (the failure's start, its XID or
    /// its first missed answer -> quarantine), seconds, measured by
    /// replay: the mean over the failures not quarantined before they
    /// struck whose class the run's mix plays as a hang a host sees
    /// ([`detection::applied_classes`]; the default mix's where the traces
    /// hold none of those), the only ones the job model
    /// applies it to (a class it plays as a crash stops the job at once).
    /// The hangs of other classes are in a note, not here.
    pub detection_s: f64,
    /// False degrades per GPU-day (a healthy GPU flagged degraded and
    /// never quarantined: only a drain acts on it): what the 95 % one-sided
    /// Poisson bound on every false flag in the replay of clean GPU-days
    /// leaves after false quarantines' own bound.
    pub false_alarms_per_gpu_day: f64,
    /// Upper bound on false quarantines per GPU-day (a healthy GPU
    /// quarantined), the same way; with the false degrades it sums to the
    /// bound on every false flag.
    pub false_quarantines_per_gpu_day: f64,
    /// How each figure was derived, for the report (one sentence each).
    pub notes: Vec<String>,
}

/// How much to generate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Size {
    /// Failure traces per class.
    pub per_class: usize,
    /// Healthy hosts (8 GPUs each).
    pub healthy_hosts: usize,
    /// Hours of each healthy host.
    pub healthy_hours: u64,
    /// The longest onset lead drawn, hours (leads are log-uniform from
    /// 2 minutes to this).
    pub max_onset_lead_h: f64,
}

impl Size {
    /// What [`measured`] generates.
    pub const DEFAULT: Size = Size {
        per_class: 60,
        healthy_hosts: 16,
        healthy_hours: 48,
        max_onset_lead_h: 6.0,
    };
}

/// The precursor model the real health engine achieves today, from
/// traces generated with `seed` ([`Size::DEFAULT`]: 7.7 million records,
/// 3 to 6 s in release on 2 cores, about ten times that in a debug
/// build; tests should call [`measure`] with a small [`Size`]).
pub fn measured(seed: u64, mix: &Mix) -> Result<MeasuredModel, String> {
    measure(seed, Size::DEFAULT)?.model_for(mix)
}

/// One generated trace, its expectation and, for a failure, the truth.
#[derive(Debug, Clone)]
pub struct GenTrace {
    /// File name without extension.
    pub name: String,
    /// The failure it holds (`None`: a healthy host).
    pub failure: Option<Failure>,
    /// The trace, `gpu-trace/1` JSON Lines.
    pub jsonl: String,
    /// The expectation, `NAME.expect.json`.
    pub expect_json: String,
    /// Records after the header.
    pub records: usize,
    /// Simulated seconds.
    pub secs: u64,
}

impl GenTrace {
    /// Writes `NAME.jsonl` and `NAME.expect.json` into `dir`.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::write(dir.join(format!("{}.jsonl", self.name)), &self.jsonl)?;
        std::fs::write(
            dir.join(format!("{}.expect.json", self.name)),
            &self.expect_json,
        )
    }
}

/// A seed for one trace, from the run's seed and the trace's place.
fn trace_seed(seed: u64, what: u64, i: u64) -> u64 {
    let mut z =
        seed ^ what.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03);
    // splitmix64's finaliser.
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Trace `i` of `n` of class `c` (an index of [`MIXES`]), its onset
/// lead at most `max_lead_h` hours.
pub fn failure_trace(seed: u64, c: usize, i: usize, n: usize, max_lead_h: f64) -> GenTrace {
    failure_trace_sampled(seed, c, i, n, max_lead_h, host::COARSE_MS)
}

/// As [`failure_trace`], sampled every `coarse_ms` outside the dense
/// windows (`PERIOD_MS`: every second, as the live agent samples).
pub fn failure_trace_sampled(
    seed: u64,
    c: usize,
    i: usize,
    n: usize,
    max_lead_h: f64,
    coarse_ms: u64,
) -> GenTrace {
    let (class, mix) = MIXES[c];
    let mut rng = StdRng::seed_from_u64(trace_seed(seed, 1 + c as u64, i as u64));
    let mechanism = draw(kind_of(mix, i, n), &mut rng);
    let lead_ms = match mechanism {
        Mechanism::PlateLoss { ramp_s } => ramp_s * 1_000.0,
        _ => log_uniform(
            &mut rng,
            scenarios::MIN_ONSET_LEAD_MS,
            (max_lead_h * 3_600_000.0).max(scenarios::MIN_ONSET_LEAD_MS + 1.0),
        ),
    } as u64;
    let warm_ms = rng.gen_range(10..30) * 60_000;
    let second = (warm_ms + lead_ms) / PERIOD_MS * PERIOD_MS;
    // The XID comes within its second, after that second's samples.
    let failure_ms = second + rng.gen_range(100..900);
    let onset_ms = mechanism
        .has_precursor()
        .then(|| (failure_ms - lead_ms) / PERIOD_MS * PERIOD_MS);
    let gpu = rng.gen_range(0..GPUS);
    let end_ms = second + 150_000;
    let quarantine_window = match mechanism {
        // The first replay quarantines: from the onset to its sample + 3
        // periods.
        Mechanism::NvlinkReplays { .. } => {
            let onset = onset_ms.expect("a precursor has an onset");
            (onset, onset + 1 + 3 * gpu as u64 + 3 * PERIOD_MS)
        }
        m => Failure::window(m, gpu, failure_ms),
    };
    let failure = Failure {
        class,
        mechanism,
        gpu,
        onset_ms,
        failure_ms,
        quarantine_window,
    };
    let name = format!("gen-{class}-{:03}-{}", i, mechanism.name());
    let description = format!(
        "GPU {gpu}: {class} failure by {} at t={failure_ms} ms{}; sampled every 5 s, every 1 s around events",
        mechanism.name(),
        match onset_ms {
            Some(o) => format!(", precursor from t={o} ms"),
            None => ", no precursor".into(),
        }
    );
    let mut host = Host::new(StdRng::seed_from_u64(rng.gen()), &name, &description);
    host.coarse_ms = coarse_ms;
    host.dense(second.saturating_sub(180_000), end_ms);
    let secs = end_ms / PERIOD_MS;
    let mut benign = Benign::draw(&mut host, GPUS, secs, false);
    let mut run = Running::default();
    for s in 0..=secs {
        let t = s * PERIOD_MS;
        benign.apply(&mut host, t);
        failure.apply(&mut host, &mut run, t);
        host.step(t);
    }
    let (lo, hi) = quarantine_window;
    let mechanism_name = mechanism.name();
    let expect_json = format!(
        "{{\"gpus\":{{\n  \"{gpu}\":{{\"must\":\"quarantined\",\"after_ms\":{lo},\"by_ms\":{hi}}},\n  \"*\":{{\"max\":\"healthy\"}}}},\n \"why\":\"GPU {gpu} fails ({class}, {mechanism_name}); flagging it degraded before is the precursor; no other GPU may leave healthy.\"}}\n"
    );
    let (jsonl, records) = host.finish();
    GenTrace {
        name,
        failure: Some(failure),
        jsonl,
        expect_json,
        records,
        secs: secs + 1,
    }
}

/// Healthy host `i`, `hours` long: jobs, checkpoints, idle gaps and the
/// benign events of [`scenarios::rates`].
pub fn healthy_trace(seed: u64, i: usize, hours: u64) -> GenTrace {
    let mut rng = StdRng::seed_from_u64(trace_seed(seed, 0, i as u64));
    let name = format!("gen-healthy-{i:03}");
    let mut host = Host::new(
        StdRng::seed_from_u64(rng.gen()),
        &name,
        "healthy host: training jobs with checkpoints and idle gaps, application XIDs, blips, missed samples, stalls, lowered limits, loop trouble; sampled every 5 s, every 1 s around events",
    );
    let secs = hours * 3_600;
    let mut benign = Benign::draw(&mut host, GPUS, secs, true);
    for s in 0..secs {
        let t = s * PERIOD_MS;
        benign.apply(&mut host, t);
        host.step(t);
    }
    let (jsonl, records) = host.finish();
    GenTrace {
        name,
        failure: None,
        jsonl,
        expect_json: "{\"gpus\":{\"*\":{\"max\":\"healthy\"}},\n \"why\":\"nothing is wrong with any GPU: application XIDs, blips, a missed sample, a stall and the loop's trouble are not GPU faults\"}\n".into(),
        records,
        secs,
    }
}

/// Every trace of a run of `size` from `seed`: the failure traces class
/// by class, then the healthy hosts.
pub fn generate(seed: u64, size: Size) -> Vec<GenTrace> {
    jobs(size)
        .into_iter()
        .map(|j| j.build(seed, size))
        .collect()
}

/// One trace to build.
#[derive(Debug, Clone, Copy)]
enum Job {
    Failure { class: usize, i: usize },
    Healthy { i: usize },
}

impl Job {
    fn build(self, seed: u64, size: Size) -> GenTrace {
        match self {
            Job::Failure { class, i } => {
                failure_trace(seed, class, i, size.per_class, size.max_onset_lead_h)
            }
            Job::Healthy { i } => healthy_trace(seed, i, size.healthy_hours),
        }
    }
}

fn jobs(size: Size) -> Vec<Job> {
    let mut jobs: Vec<Job> = (0..MIXES.len())
        .flat_map(|class| (0..size.per_class).map(move |i| Job::Failure { class, i }))
        .collect();
    jobs.extend((0..size.healthy_hosts).map(|i| Job::Healthy { i }));
    jobs
}

/// A GPU state, ordered as the scorer orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum State {
    /// `healthy`.
    Healthy,
    /// `degraded`.
    Degraded,
    /// `quarantined`.
    Quarantined,
}

/// One verdict line as `node-agent replay` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Simulated time of the decision, ms.
    pub t_ms: u64,
    /// The GPU.
    pub gpu: usize,
    /// Its new state.
    pub state: State,
    /// The reason code.
    pub reason: String,
}

#[derive(Deserialize)]
struct Line {
    t_ms: u64,
    gpu: usize,
    state: String,
    reason: String,
}

/// Replays `jsonl` as `node-agent replay --slow-counters-s 30` does and
/// reads its verdict lines back.
pub fn replay(jsonl: &str) -> Result<Vec<Verdict>, String> {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    node_core::replay::replay_scheduled(
        jsonl.as_bytes(),
        node_core::health::Policy::default(),
        SLOW_COUNTERS_MS,
        &mut out,
        &mut notes,
    )
    .map_err(|e| e.to_string())?;
    let text = String::from_utf8(out).map_err(|e| e.to_string())?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Line = serde_json::from_str(l).map_err(|e| format!("{e}: {l}"))?;
            let state = match v.state.as_str() {
                "healthy" => State::Healthy,
                "degraded" => State::Degraded,
                "quarantined" => State::Quarantined,
                s => return Err(format!("unknown state {s:?}")),
            };
            Ok(Verdict {
                t_ms: v.t_ms,
                gpu: v.gpu,
                state,
                reason: v.reason,
            })
        })
        .collect()
}

/// What the repository's scorer (`score.py`) says of one trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Score {
    /// A `must` not reached in its window.
    pub misses: Vec<String>,
    /// A `max` passed.
    pub false_alarms: Vec<String>,
    /// Verdict time minus `after_ms` of every met `must`, ms.
    pub latencies_ms: Vec<u64>,
}

/// Scores `verdicts` of a trace of `gpus` GPUs against its expectation,
/// as `score.py` does: the failing GPU must be quarantined within its
/// window and may not pass quarantined; every other GPU stays healthy.
pub fn score(failure: Option<&Failure>, gpus: usize, verdicts: &[Verdict]) -> Score {
    let mut s = Score::default();
    for g in 0..gpus {
        let mine: Vec<&Verdict> = verdicts.iter().filter(|v| v.gpu == g).collect();
        let rule = failure.filter(|f| f.gpu == g);
        let max = if rule.is_some() {
            State::Quarantined
        } else {
            State::Healthy
        };
        if let Some(v) = mine.iter().find(|v| v.state > max) {
            s.false_alarms.push(format!(
                "gpu {g}: {:?} at {} ms ({}), allowed at most {max:?}",
                v.state, v.t_ms, v.reason
            ));
        }
        if let Some(f) = rule {
            let (lo, hi) = f.quarantine_window;
            match mine
                .iter()
                .find(|v| v.state >= State::Quarantined && lo <= v.t_ms && v.t_ms <= hi)
            {
                Some(v) => s.latencies_ms.push(v.t_ms - lo),
                None => s.misses.push(format!(
                    "gpu {g}: quarantined not reached between {lo} and {hi} ms"
                )),
            }
        }
    }
    s
}

/// What one failure trace showed.
#[derive(Debug, Clone, PartialEq)]
pub struct FailureOutcome {
    /// The truth.
    pub failure: Failure,
    /// Flagged after the onset and before the failure: the lead (ms) and
    /// the reason of the first flag.
    pub precursor: Option<(u64, String)>,
    /// When the engine quarantined the failing GPU.
    pub detection: Detection,
    /// The scorer's view.
    pub score: Score,
}

/// When a failing GPU was quarantined, against its failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detection {
    /// Before the failure struck (a precursor's doing): no latency.
    Before,
    /// This many ms after the failure.
    After(u64),
    /// Never, in the whole trace.
    Never,
}

/// Every figure of a run, before it is reduced to a [`MeasuredModel`].
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// The seed.
    pub seed: u64,
    /// What was generated.
    pub size: Size,
    /// Each failure trace's outcome, class by class.
    pub failures: Vec<FailureOutcome>,
    /// Flags on GPUs with nothing wrong.
    pub false_alarms: Vec<FalseAlarm>,
    /// GPU-days replayed with nothing wrong (healthy hosts, the other
    /// GPUs of failure traces, failing GPUs before their onset).
    pub clean_gpu_days: f64,
    /// GPU-days of the healthy hosts alone.
    pub healthy_gpu_days: f64,
    /// Records replayed.
    pub records: usize,
    /// Misses the repository's scorer counts.
    pub scorer_misses: usize,
    /// False alarms the repository's scorer counts (a GPU past its `max`).
    pub scorer_false_alarms: usize,
}

/// What one trace contributes.
enum Outcome {
    Failure(FailureOutcome, Vec<FalseAlarm>, f64),
    Healthy(Vec<FalseAlarm>, f64, Score),
}

/// A job's outcome and its records, or why it could not be replayed.
type JobResult = Result<(Outcome, usize), String>;

/// Builds and replays job `j`.
fn run_job(seed: u64, size: Size, j: Job) -> JobResult {
    let tr = j.build(seed, size);
    let verdicts = replay(&tr.jsonl).map_err(|e| format!("{}: {e}", tr.name))?;
    let day_s = 86_400.0;
    let flags_of = |g: usize, before: u64| false_flags(&tr.name, &verdicts, g, before);
    let outcome = match &tr.failure {
        None => {
            let alarms = (0..GPUS).flat_map(|g| flags_of(g, u64::MAX)).collect();
            Outcome::Healthy(
                alarms,
                GPUS as f64 * tr.secs as f64 / day_s,
                score(None, GPUS, &verdicts),
            )
        }
        Some(f) => {
            let mut alarms: Vec<_> = (0..GPUS)
                .filter(|&g| g != f.gpu)
                .flat_map(|g| flags_of(g, u64::MAX))
                .collect();
            let clean_until = f.onset_ms.unwrap_or(f.failure_ms);
            alarms.extend(flags_of(f.gpu, clean_until));
            let clean_s = (GPUS - 1) as f64 * tr.secs as f64 + clean_until as f64 / 1e3;
            let mine: Vec<&Verdict> = verdicts.iter().filter(|v| v.gpu == f.gpu).collect();
            let precursor = f.onset_ms.and_then(|onset| {
                mine.iter()
                    .find(|v| v.state > State::Healthy && v.t_ms >= onset)
                    .filter(|v| v.t_ms < f.failure_ms)
                    .map(|v| (f.failure_ms - v.t_ms, v.reason.clone()))
            });
            let quarantined_before = mine
                .iter()
                .any(|v| v.state == State::Quarantined && v.t_ms < f.failure_ms);
            let detection = if quarantined_before {
                Detection::Before
            } else {
                mine.iter()
                    .find(|v| v.state == State::Quarantined)
                    .map_or(Detection::Never, |v| {
                        Detection::After(v.t_ms - f.failure_ms)
                    })
            };
            let outcome = FailureOutcome {
                failure: f.clone(),
                precursor,
                detection,
                score: score(Some(f), GPUS, &verdicts),
            };
            Outcome::Failure(outcome, alarms, clean_s / day_s)
        }
    };
    Ok((outcome, tr.records))
}

/// Generates and replays every trace of `size` from `seed`, on up to 8
/// threads; the result does not depend on how many.
pub fn measure(seed: u64, size: Size) -> Result<Measurement, String> {
    let jobs = jobs(size);
    let results: Vec<Mutex<Option<JobResult>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 8);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&j) = jobs.get(i) else { break };
                let r = run_job(seed, size, j);
                *results[i].lock().expect("no worker panics holding it") = Some(r);
            });
        }
    });
    let mut m = Measurement {
        seed,
        size,
        failures: Vec::new(),
        false_alarms: Vec::new(),
        clean_gpu_days: 0.0,
        healthy_gpu_days: 0.0,
        records: 0,
        scorer_misses: 0,
        scorer_false_alarms: 0,
    };
    for r in results {
        let (outcome, records) = r
            .into_inner()
            .expect("no worker panics holding it")
            .expect("every job ran")?;
        m.records += records;
        match outcome {
            Outcome::Failure(f, alarms, days) => {
                m.scorer_misses += f.score.misses.len();
                m.scorer_false_alarms += f.score.false_alarms.len();
                m.failures.push(f);
                m.false_alarms.extend(alarms);
                m.clean_gpu_days += days;
            }
            Outcome::Healthy(alarms, days, s) => {
                m.scorer_false_alarms += s.false_alarms.len();
                m.false_alarms.extend(alarms);
                m.clean_gpu_days += days;
                m.healthy_gpu_days += days;
            }
        }
    }
    Ok(m)
}

/// The median of `v` (0 when empty).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => 0.5 * (v[n / 2 - 1] + v[n / 2]),
    }
}

impl Measurement {
    /// The failures of class `class`.
    pub fn of_class<'a>(&'a self, class: &'a str) -> impl Iterator<Item = &'a FailureOutcome> + 'a {
        self.failures
            .iter()
            .filter(move |f| f.failure.class == class)
    }

    /// Class `class`'s precursor: coverage, the leads in hours, and the
    /// share of the flagged failures quarantined before they struck.
    pub fn precursor(&self, class: &str) -> Precursor {
        let all: Vec<&FailureOutcome> = self.of_class(class).collect();
        let flagged: Vec<&&FailureOutcome> = all.iter().filter(|f| f.precursor.is_some()).collect();
        let hours: Vec<f64> = flagged
            .iter()
            .filter_map(|f| f.precursor.as_ref())
            .map(|(lead, _)| *lead as f64 / 3_600_000.0)
            .collect();
        if hours.is_empty() || all.is_empty() {
            return Precursor::none();
        }
        let before = flagged
            .iter()
            .filter(|f| f.detection == Detection::Before)
            .count();
        Precursor {
            coverage: hours.len() as f64 / all.len() as f64,
            quarantined: before as f64 / hours.len() as f64,
            lead: LeadTime::Empirical { hours },
        }
    }

    /// Failure-to-quarantine latencies, seconds, of the failures
    /// quarantined after they struck.
    pub fn detections_s(&self) -> Vec<f64> {
        self.failures
            .iter()
            .filter_map(detection::latency_s)
            .collect()
    }

    /// The failures the engine never quarantined.
    pub fn never_quarantined(&self) -> impl Iterator<Item = &FailureOutcome> + '_ {
        self.failures
            .iter()
            .filter(|f| f.detection == Detection::Never)
    }

    /// The model the twin takes, with a sentence on each figure; an error
    /// if the engine never quarantined some failure (a miss has no
    /// detection latency, and leaving it out would credit the engine with
    /// it), or if no hang was quarantined after it struck.
    pub fn model(&self) -> Result<MeasuredModel, String> {
        self.model_for(&Mix::default())
    }

    /// [`Measurement::model`] for a run of `mix`: its detection latency is
    /// the mean over the classes `mix` plays as hangs a host sees
    /// ([`detection`]).
    pub fn model_for(&self, mix: &Mix) -> Result<MeasuredModel, String> {
        let missed: Vec<String> = self
            .never_quarantined()
            .map(|f| format!("{} on gpu {}", f.failure.class, f.failure.gpu))
            .collect();
        if !missed.is_empty() {
            return Err(format!(
                "the engine never quarantined {} of {} failures ({}{}): the detection \
                 latency has no mean over them",
                missed.len(),
                self.failures.len(),
                missed[..missed.len().min(5)].join(", "),
                if missed.len() > 5 { ", …" } else { "" },
            ));
        }
        let mut notes = Vec::new();
        let mut classes = Vec::new();
        for (class, mix) in MIXES {
            let p = self.precursor(class);
            let all: Vec<&FailureOutcome> = self.of_class(class).collect();
            let with: usize = all
                .iter()
                .filter(|f| f.failure.mechanism.has_precursor())
                .count();
            let mut reasons: Vec<String> = all
                .iter()
                .filter_map(|f| f.precursor.as_ref().map(|(_, r)| r.clone()))
                .collect();
            reasons.sort();
            reasons.dedup();
            let shares: Vec<String> = mix
                .iter()
                .map(|(k, s)| format!("{k:?} {:.0} %", s * 100.0))
                .collect();
            let leads = match &p.lead {
                LeadTime::Empirical { hours } => format!(
                    "median lead {:.2} h (min {:.3} h, max {:.2} h)",
                    median(hours),
                    hours.iter().copied().fold(f64::INFINITY, f64::min),
                    hours.iter().copied().fold(0.0, f64::max)
                ),
                _ => "no lead".into(),
            };
            notes.push(format!(
                "{class}: the engine flagged {} of {} generated failures after their precursor began and before they struck (coverage {:.2}; {with} had a precursor, mix {}; first flags {}), {leads}; it quarantined {:.0} % of those flagged before they struck (`quarantined`, which ends the job at the flag with --quarantine-ends-job).",
                all.iter().filter(|f| f.precursor.is_some()).count(),
                all.len(),
                p.coverage,
                shares.join(", "),
                if reasons.is_empty() { "none".into() } else { reasons.join(", ") },
                p.quarantined * 100.0,
            ));
            classes.push((class.to_string(), p));
        }
        let (detection_s, said) = self.hang_detection(mix)?;
        notes.extend(said);
        let (q, d) = (self.false_quarantines(), self.false_degrades());
        notes.push(format!(
            "false alarms: {} GPUs flagged with nothing wrong in {:.1} clean GPU-days replayed ({:.1} on healthy hosts with application XIDs, blips, missed samples, stalls, lowered limits and loop trouble; the rest the other GPUs of failure traces): {q} quarantined and {d} that stopped at degraded, counted apart.",
            self.false_alarms.len(),
            self.clean_gpu_days,
            self.healthy_gpu_days,
        ));
        notes.push(format!(
            "false_quarantines_per_gpu_day: the 95 % one-sided Poisson bound on {q} seen, {:.3} / {:.1} = {:.4} per GPU-day; false_alarms_per_gpu_day (false degrades, which only a drain acts on): the rest of the same bound on all {} false flags seen, {:.3} / {:.1} = {:.4} per GPU-day, less the quarantines' share, {:.4} per GPU-day. The replay supports no more than the total bound for both kinds together, so the two sum to it: false quarantines, which the agent pays for, are taken at their own bound, and false degrades at what is left (their own bound alone, {:.4}, would double count).",
            poisson_upper_95(q),
            self.clean_gpu_days,
            self.false_quarantine_bound(),
            q + d,
            poisson_upper_95(q + d),
            self.clean_gpu_days,
            self.false_alarm_bound(),
            self.false_degrade_share(),
            self.false_degrade_bound(),
        ));
        notes.push(format!(
            "traces: {} failure traces and {} healthy hosts generated from seed {} ({} records), replayed by node_core::replay::replay_scheduled with the default policy and slow counters every {} s as the live agent reads them; the repository's scorer counts {} misses and {} false alarms on them.",
            self.failures.len(),
            self.size.healthy_hosts,
            self.seed,
            self.records,
            SLOW_COUNTERS_MS / 1000,
            self.scorer_misses,
            self.scorer_false_alarms
        ));
        notes.push(
            format!("assumed, not measured: each class's mix of failures with and without a precursor, and the onset leads (log-uniform 2 min to {} h); measured: whether and when the engine flags them.", self.size.max_onset_lead_h),
        );
        Ok(MeasuredModel {
            classes,
            detection_s,
            false_alarms_per_gpu_day: self.false_degrade_share(),
            false_quarantines_per_gpu_day: self.false_quarantine_bound(),
            notes,
        })
    }
}

#[cfg(test)]
mod tests;
