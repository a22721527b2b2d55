//! The generated traces are what the repository's replay reads, the
//! measured model comes from the engine's verdicts and is the same for a
//! seed, and nothing healthy is flagged.

use std::collections::HashMap;
use std::sync::OnceLock;

use super::host::{COARSE_MS, GPUS, PERIOD_MS};
use super::*;

/// Small enough for a debug build: every mechanism of every mix (10 per
/// class), onset leads up to 1 h, two healthy hosts of 6 h.
const SMALL: Size = Size {
    per_class: 10,
    healthy_hosts: 2,
    healthy_hours: 6,
    max_onset_lead_h: 1.0,
};

/// One measurement of [`SMALL`] for the tests that only read it.
fn small() -> &'static Measurement {
    static M: OnceLock<Measurement> = OnceLock::new();
    M.get_or_init(|| measure(1, SMALL).expect("the generated traces replay"))
}

#[test]
fn generated_traces_parse_with_the_repository_parser() {
    let mut traces: Vec<GenTrace> = (0..MIXES.len())
        .map(|c| failure_trace(3, c, 0, 10, 0.3))
        .collect();
    traces.push(healthy_trace(3, 0, 1));
    for t in &traces {
        let header: node_core::replay::Header =
            serde_json::from_str(t.jsonl.lines().next().expect("a header")).expect("a header");
        assert_eq!((header.format.as_str(), header.gpus), ("gpu-trace/1", GPUS));
        for slow_ms in [0, SLOW_COUNTERS_MS] {
            let mut out = Vec::new();
            let n = node_core::replay::replay_scheduled(
                t.jsonl.as_bytes(),
                node_core::health::Policy::default(),
                slow_ms,
                &mut out,
                &mut std::io::sink(),
            )
            .unwrap_or_else(|e| panic!("{}: {e}", t.name));
            assert_eq!(n, t.records, "{}: every record read", t.name);
        }
        let expect: serde_json::Value = serde_json::from_str(&t.expect_json).expect("JSON");
        assert_eq!(expect["gpus"]["*"]["max"], "healthy", "{}", t.name);
        if let Some(f) = &t.failure {
            let rule = &expect["gpus"][f.gpu.to_string()];
            assert_eq!(rule["must"], "quarantined");
            assert_eq!(rule["after_ms"], f.quarantine_window.0);
            assert_eq!(rule["by_ms"], f.quarantine_window.1);
        }
    }
}

#[test]
fn every_round_samples_every_gpu_together() {
    // The engine judges heat and clocks against the peers' samples of the
    // same round (at most `Policy::round_ms` apart): the thinned schedule
    // must sample, or miss, every GPU in each round it samples one.
    let t = healthy_trace(5, 0, 1);
    let round_ms = node_core::health::Policy::default().round_ms;
    let mut rounds: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    for line in t.jsonl.lines().skip(1) {
        let r: serde_json::Value = serde_json::from_str(line).expect("JSON");
        if let (Some(g), Some(_)) = (r["gpu"].as_u64(), r.get("sample")) {
            let at = r["t_ms"].as_u64().expect("t_ms");
            rounds.entry(at / PERIOD_MS).or_default().push((g, at));
        }
    }
    assert!(rounds.len() >= 720, "{} rounds in an hour", rounds.len());
    for (second, mut round) in rounds {
        round.sort_unstable();
        let gpus: Vec<u64> = round.iter().map(|&(g, _)| g).collect();
        assert_eq!(gpus, (0..GPUS as u64).collect::<Vec<_>>(), "at {second} s");
        let times = round.iter().map(|&(_, at)| at);
        let span = times.clone().max().unwrap() - times.min().unwrap();
        assert!(span <= round_ms, "at {second} s the round spans {span} ms");
    }
}

#[test]
fn every_failure_is_quarantined_in_its_window_and_scored_clean() {
    let m = small();
    assert_eq!(m.failures.len(), MIXES.len() * SMALL.per_class);
    let bad: Vec<String> = m
        .failures
        .iter()
        .filter(|f| !f.score.misses.is_empty() || !f.score.false_alarms.is_empty())
        .map(|f| format!("{:?}: {:?}", f.failure, f.score))
        .collect();
    assert!(bad.is_empty(), "{bad:#?}");
    assert_eq!((m.scorer_misses, m.scorer_false_alarms), (0, 0));
}

#[test]
fn no_healthy_gpu_is_flagged() {
    let m = small();
    assert!(m.healthy_gpu_days > 3.9, "{} GPU-days", m.healthy_gpu_days);
    assert!(
        m.false_alarms.is_empty(),
        "flags with nothing wrong: {:#?}",
        m.false_alarms
    );
    // None seen: the rule of three over the clean GPU-days.
    let model = m.model().expect("every failure quarantined");
    for bound in [model.false_quarantines_per_gpu_day, m.false_alarm_bound()] {
        assert!((bound * m.clean_gpu_days - 2.9957).abs() < 1e-3, "{bound}");
    }
}

#[test]
fn the_two_kinds_of_false_flag_never_exceed_the_bound_on_both() {
    let m = small();
    assert!(m.false_alarms.is_empty());
    let model = m.model().expect("every failure quarantined");
    let both = model.false_alarms_per_gpu_day + model.false_quarantines_per_gpu_day;
    let total = m.false_alarm_bound();
    assert!(both <= total + 1e-12, "{both} > {total}");
    // The quarantines, which the agent pays for, take the whole bound.
    assert_eq!(model.false_quarantines_per_gpu_day, total);
    assert_eq!(model.false_alarms_per_gpu_day, 0.0);
}

#[test]
fn abrupt_failures_keep_every_class_below_full_coverage() {
    let model = small().model().expect("every failure quarantined");
    let names: Vec<&str> = model.classes.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["faulty_gpu", "hbm3", "gpu_sram", "gsp", "thermal"]);
    for (name, p) in &model.classes {
        assert!(p.coverage < 1.0, "{name}: {}", p.coverage);
        match &p.lead {
            LeadTime::Empirical { hours } => {
                let flagged = small()
                    .of_class(name)
                    .filter(|f| f.precursor.is_some())
                    .count();
                assert_eq!(hours.len(), flagged, "{name}");
                assert!((p.coverage - flagged as f64 / SMALL.per_class as f64).abs() < 1e-12);
                assert!(
                    hours
                        .iter()
                        .all(|&h| h > 0.0 && h <= SMALL.max_onset_lead_h),
                    "{name}: {hours:?}"
                );
            }
            other => assert_eq!(
                (p.coverage, other),
                (0.0, &LeadTime::Fixed { hours: 0.0 }),
                "{name}"
            ),
        }
    }
    // Every abrupt failure goes unflagged: a flag needs a precursor.
    for f in &small().failures {
        if !f.failure.mechanism.has_precursor() {
            assert!(f.precursor.is_none(), "{f:?}");
        }
    }
}

#[test]
fn the_engine_flags_what_it_has_a_rule_for_and_not_what_it_has_none() {
    for f in &small().failures {
        let flagged = f.precursor.as_ref().map(|(_, r)| r.as_str());
        match f.failure.mechanism {
            Mechanism::RemapPending { .. } => assert_eq!(flagged, Some("remap-pending"), "{f:?}"),
            Mechanism::NvlinkReplays { .. } => assert_eq!(flagged, Some("nvlink-errors"), "{f:?}"),
            // One or two slow NVML calls and single-sample sensor spikes
            // are, by design, not faults.
            Mechanism::GspSlow { .. } | Mechanism::SensorGlitch { .. } => {
                assert_eq!(flagged, None, "{f:?}")
            }
            _ => {}
        }
    }
}

#[test]
fn detection_is_the_xid_itself_or_three_missed_samples() {
    let m = small();
    let det = m.detections_s();
    assert!(det.len() >= m.failures.len() - SMALL.per_class, "{det:?}");
    for f in &m.failures {
        let Detection::After(ms) = f.detection else {
            continue;
        };
        let limit = match f.failure.mechanism {
            Mechanism::AbruptGpu { xid: None } => 5 * PERIOD_MS,
            _ => 0,
        };
        assert!(ms <= limit, "{f:?}");
    }
    let model = m.model().expect("every failure quarantined");
    assert!(
        model.detection_s >= 0.0 && model.detection_s < 5.0,
        "{}",
        model.detection_s
    );
}

/// The mean over the failures detected after they struck whose class
/// `keep` takes, and how many.
fn mean_detection(m: &Measurement, keep: impl Fn(&FailureOutcome) -> bool) -> (f64, usize) {
    let det: Vec<f64> = m
        .failures
        .iter()
        .filter(|f| keep(f))
        .filter_map(|f| match f.detection {
            Detection::After(ms) => Some(ms as f64 / 1e3),
            _ => None,
        })
        .collect();
    (det.iter().sum::<f64>() / det.len() as f64, det.len())
}

#[test]
fn detection_is_the_mean_over_the_classes_the_job_model_plays_as_host_visible_hangs() {
    use loopwarden_twin::goodput::{Mix, Onset};
    let m = small();
    let mix = Mix::default();
    let applied: Vec<&str> = mix
        .classes
        .iter()
        .filter(|c| c.host_visible && c.onset == Onset::Hang)
        .map(|c| c.name.as_str())
        .collect();
    assert!(applied.contains(&"gsp"), "{applied:?}");
    let (mean, n) = mean_detection(m, |f| applied.contains(&f.failure.class));
    assert!(n > 0, "no failure of {applied:?} detected after it struck");
    let model = m.model().expect("every failure quarantined");
    assert!(
        (model.detection_s - mean).abs() < 1e-12,
        "{} against {mean} over {applied:?}",
        model.detection_s
    );
    // The hangs of a class the job model plays as a crash (a GPU that
    // stops answering without an XID, in faulty_gpu) are not in it: their
    // figure is said apart, as one the job model does not use.
    let crash_class = |f: &FailureOutcome| !applied.contains(&f.failure.class);
    let (unused, k) = mean_detection(m, |f| f.failure.mechanism.is_hang() && crash_class(f));
    assert!(k > 0 && unused > 1.0, "{unused} s over {k}");
    let note = |start: &str| {
        let found = model.notes.iter().find(|n| n.starts_with(start));
        found.unwrap_or_else(|| panic!("a note on {start}: {:?}", model.notes))
    };
    let applied_note = note("detection_s");
    assert!(
        applied_note.contains(&format!("over the {n} failures")),
        "{applied_note}"
    );
    let unused_note = note("not used by the job model");
    assert!(
        unused_note.contains(&format!("{unused:.3} s")) && unused_note.contains("abrupt-hang"),
        "{unused_note}"
    );
    assert!(unused_note.contains("as crashes"), "{unused_note}");
}

#[test]
fn a_failure_never_quarantined_is_not_left_out_of_the_detection_latency() {
    let mut m = small().clone();
    m.failures.truncate(2);
    for f in &mut m.failures {
        // Hangs of a class the job model plays as one: the detection
        // latency is their mean.
        f.failure.class = "gsp";
        f.failure.mechanism = Mechanism::AbruptGsp { xid: 119 };
    }
    m.failures[0].detection = Detection::After(1_000);
    m.failures[1].detection = Detection::Never;
    assert_eq!(m.detections_s(), [1.0]);
    let e = m.model().unwrap_err();
    assert!(e.contains("never quarantined 1 of 2 failures"), "{e}");
    // Quarantined before it struck: no latency, and the mean is the other's.
    m.failures[1].detection = Detection::Before;
    assert_eq!(m.model().unwrap().detection_s, 1.0);
    m.failures[1].detection = Detection::After(3_000);
    assert_eq!(m.model().unwrap().detection_s, 2.0);
}

#[test]
fn the_measured_model_is_the_same_for_a_seed_and_moves_with_it() {
    let size = Size {
        per_class: 4,
        healthy_hosts: 1,
        healthy_hours: 1,
        max_onset_lead_h: 0.3,
    };
    let a = measure(9, size).expect("replays").model().unwrap();
    let b = measure(9, size).expect("replays").model().unwrap();
    assert_eq!(a, b);
    let c = measure(10, size).expect("replays").model().unwrap();
    assert_ne!(a.classes, c.classes);
}

#[test]
fn thinned_sampling_flags_as_sampling_every_second_does() {
    // The same failures sampled every second, as the live agent does:
    // the same precursors flagged, within a coarse period or two of the
    // thinned trace (a rate or a streak seen a sample later). Not
    // faulty_gpu 0: a link at 6.3 replays a minute, below the limit on
    // average, whose bursts (drawn anew for each sampling) carry the
    // 2-minute average above the limit in one trace and not the other.
    let mut compared = 0;
    for (c, i) in [(0, 1), (0, 2), (1, 0), (1, 3), (2, 0), (4, 0)] {
        let thin = failure_trace(11, c, i, 10, 0.25);
        let every = failure_trace_sampled(11, c, i, 10, 0.25, PERIOD_MS);
        assert_eq!(thin.failure, every.failure);
        let f = thin.failure.as_ref().expect("a failure");
        let first = |tr: &GenTrace| {
            replay(&tr.jsonl)
                .expect("replays")
                .into_iter()
                .find(|v| v.gpu == f.gpu && v.state > State::Healthy)
                .map(|v| (v.t_ms, v.reason))
        };
        let (a, b) = (first(&thin), first(&every));
        assert!(every.records > thin.records * 2);
        match (&a, &b) {
            (Some((ta, ra)), Some((tb, rb))) => {
                assert_eq!(ra, rb, "{}", thin.name);
                assert!(
                    ta.abs_diff(*tb) <= 2 * COARSE_MS + SLOW_COUNTERS_MS,
                    "{}: {a:?} {b:?}",
                    thin.name
                );
                compared += 1;
            }
            _ => panic!("{}: thinned {a:?}, every second {b:?}", thin.name),
        }
    }
    assert!(compared >= 6);
}

#[test]
fn the_poisson_bound_is_the_rule_of_three_at_zero() {
    assert!((poisson_upper_95(0) - 2.9957).abs() < 1e-3);
    assert!((poisson_upper_95(1) - 4.7439).abs() < 1e-3);
    assert!((poisson_upper_95(2) - 6.2958).abs() < 1e-3);
}

#[test]
fn the_mix_is_applied_exactly() {
    for (class, mix) in MIXES {
        let total: f64 = mix.iter().map(|(_, s)| s).sum();
        assert!((total - 1.0).abs() < 1e-9, "{class}");
        for &(k, share) in *mix {
            let n = (0..100).filter(|&i| kind_of(mix, i, 100) == k).count();
            assert_eq!(n as f64, (share * 100.0).round(), "{class} {k:?}");
        }
    }
}

/// Writes a run's traces for `score.py` (`LOOPWARDEN_PRECURSOR_DIR=DIR
/// cargo test -p loopwarden-hall --lib precursors::tests::write -- --ignored`).
#[test]
#[ignore]
fn write_traces_for_the_scorer() {
    let dir = std::env::var("LOOPWARDEN_PRECURSOR_DIR").expect("set LOOPWARDEN_PRECURSOR_DIR");
    let dir = std::path::Path::new(&dir);
    std::fs::create_dir_all(dir).expect("a directory");
    for t in generate(1, SMALL) {
        t.write(dir).expect("written");
    }
}

/// Prints what [`measured`] gives for a seed (`LOOPWARDEN_SEED`, 1 by
/// default), for the docs: `cargo test --release -p loopwarden-hall --lib
/// precursors::tests::print -- --ignored --nocapture`.
#[test]
#[ignore]
fn print_the_measured_model() {
    let seed = std::env::var("LOOPWARDEN_SEED").map_or(1, |s| s.parse().expect("a seed"));
    let t0 = std::time::Instant::now();
    let m = measure(seed, Size::DEFAULT).expect("replays");
    let model = m.model().expect("every failure quarantined");
    println!(
        "measured({seed}) in {:.1} s, {} records",
        t0.elapsed().as_secs_f64(),
        m.records
    );
    for (name, p) in &model.classes {
        let hours = match &p.lead {
            LeadTime::Empirical { hours } => {
                let mut h = hours.clone();
                h.sort_by(f64::total_cmp);
                h.iter()
                    .map(|x| format!("{x:.3}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            }
            other => format!("{other:?}"),
        };
        println!("{name}: coverage {:.3}; lead h: {hours}", p.coverage);
    }
    for f in &m.failures {
        println!(
            "  {} {:?} gpu {} onset_lead {:?} h flagged {:?}",
            f.failure.class,
            f.failure.mechanism,
            f.failure.gpu,
            f.failure
                .onset_ms
                .map(|o| (f.failure.failure_ms - o) as f64 / 3.6e6),
            f.precursor
                .as_ref()
                .map(|(l, r)| (*l as f64 / 3.6e6, r.clone()))
        );
    }
    println!("detection_s {:.3}", model.detection_s);
    println!(
        "false_alarms_per_gpu_day {:.5}, false_quarantines_per_gpu_day {:.5}",
        model.false_alarms_per_gpu_day, model.false_quarantines_per_gpu_day
    );
    for n in &model.notes {
        println!("- {n}");
    }
}

/// False alarms over many healthy GPU-days, to tighten the bound the
/// default model gives (382 GPU-days): `LOOPWARDEN_HEALTHY_HOSTS` hosts of
/// 8 GPUs for 48 h each (6,250 hosts: 100,000 GPU-days). Run by hand in
/// release: `cargo test --release -p loopwarden-hall --lib
/// precursors::tests::false_alarms_at_scale -- --ignored --nocapture`.
#[test]
#[ignore]
fn false_alarms_at_scale() {
    let hosts =
        std::env::var("LOOPWARDEN_HEALTHY_HOSTS").map_or(6_250, |s| s.parse().expect("a count"));
    let size = Size {
        per_class: 0,
        healthy_hosts: hosts,
        ..Size::DEFAULT
    };
    let t0 = std::time::Instant::now();
    let m = measure(1, size).expect("replays");
    println!(
        "{} healthy GPU-days ({} clean GPU-days) in {:.0} s, {} records: {} false alarms ({} quarantines, bound {:.2e} per GPU-day; {} degrades, bound {:.2e}), bound {:.2e} per GPU-day",
        m.healthy_gpu_days,
        m.clean_gpu_days,
        t0.elapsed().as_secs_f64(),
        m.records,
        m.false_alarms.len(),
        m.false_quarantines(),
        m.false_quarantine_bound(),
        m.false_degrades(),
        m.false_degrade_bound(),
        m.false_alarm_bound()
    );
    for f in m.false_alarms.iter().take(20) {
        println!("{f:?}");
    }
}

#[test]
fn a_precursor_says_what_share_of_its_flags_were_quarantines() {
    let mut m = small().clone();
    m.failures.truncate(3);
    for f in &mut m.failures {
        f.failure.class = "hbm3";
        f.precursor = Some((3_600_000, "ecc".into()));
        f.detection = Detection::After(1_000);
    }
    // One flagged failure quarantined before it struck, one after, and one
    // never flagged but quarantined before (its flag, not a precursor's).
    m.failures[0].detection = Detection::Before;
    m.failures[2].precursor = None;
    m.failures[2].detection = Detection::Before;
    let p = m.precursor("hbm3");
    assert!((p.coverage - 2.0 / 3.0).abs() < 1e-12, "{p:?}");
    assert_eq!(p.quarantined, 0.5, "{p:?}");
}

#[test]
fn the_detection_latency_is_taken_over_the_hangs_of_the_runs_mix() {
    use loopwarden_twin::goodput::Onset;
    let mut m = small().clone();
    m.failures.truncate(2);
    m.failures[0].failure.class = "gsp";
    m.failures[0].failure.mechanism = Mechanism::AbruptGsp { xid: 119 };
    m.failures[0].detection = Detection::After(1_000);
    m.failures[1].failure.class = "faulty_gpu";
    m.failures[1].failure.mechanism = Mechanism::AbruptGpu { xid: None };
    m.failures[1].detection = Detection::After(3_000);
    let playing = |hangs: &[&str]| {
        let mut mix = Mix::default();
        for c in &mut mix.classes {
            if c.host_visible {
                c.onset = if hangs.contains(&c.name.as_str()) {
                    Onset::Hang
                } else {
                    Onset::Crash
                };
            }
        }
        mix
    };
    let latency = |mix: &Mix| m.model_for(mix).unwrap().detection_s;
    assert_eq!(latency(&Mix::default()), 1.0);
    assert_eq!(latency(&playing(&["gsp"])), 1.0);
    // A mix that plays the faulty GPUs as hangs and the GSP's as crashes.
    assert_eq!(latency(&playing(&["faulty_gpu"])), 3.0);
    assert_eq!(latency(&playing(&["faulty_gpu", "gsp"])), 2.0);
    // A mix whose hangs a host sees the traces hold none of keeps the
    // default mix's, and says so.
    let none = m.model_for(&playing(&[])).unwrap();
    assert_eq!(none.detection_s, 1.0);
    assert!(
        none.notes.iter().any(|n| n.contains("applies it to none")),
        "{:?}",
        none.notes
    );
}
