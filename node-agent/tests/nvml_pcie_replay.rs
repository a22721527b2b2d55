//! The PCIe replay counter through the agent's NVML layer, tested with the
//! fake NVML (`fake_nvml_api/`): it rides in the field-value query the
//! agent already makes every sample, so the `pcie-replay-rate` rule sees
//! a fresh count at every sample and judges the rate exactly whatever
//! `slow_counters_s` is; only a GPU with no other per-sample field value
//! (no HBM temperature, no NVLink) reads it with the slow counters, as
//! `node-agent probe` says, since carrying it alone would cost a call
//! per sample.

use std::sync::Arc;

use loopwarden_protocol::{HealthState, ReasonCode, TimestampMs, Unsupported};
use node_agent::gpu::GpuDevice;
use node_agent::nvml::{NvmlFailure, NvmlGpu};
use node_agent::shell::observation;
use node_core::health::{HealthEngine, Limits, Policy};

mod fake_nvml_api;
use fake_nvml_api::{clean, fi, Answers, FakeNvml, GET_FIELD_VALUES};

const MINUTE_MS: u64 = 60_000;

/// The replays counted by `t_ms` at `tenths` tenths of a replay a minute.
fn replays(tenths: u64, t_ms: u64) -> u64 {
    tenths * t_ms / (10 * MINUTE_MS)
}

/// The fake's healthy GPU with nothing else to judge.
fn quiet() -> Answers {
    let mut a = clean();
    a.throttle_bits = Ok(0);
    a
}

/// When (ms) one GPU behind the fake, sampled every second with its slow
/// counters read every `slow_s` samples, is degraded for PCIe replays at
/// `tenths`/10 a minute starting at `onset_ms`; `None`: not in 15 minutes.
fn degraded_after(answers: Answers, slow_s: u32, tenths: u64, onset_ms: u64) -> Option<u64> {
    degraded_failing(answers, slow_s, tenths, onset_ms, None)
}

/// As [`degraded_after`], the counter's read in the field-value query
/// failing (NVML's "no data") at every `fail_every`-th sample.
fn degraded_failing(
    answers: Answers,
    slow_s: u32,
    tenths: u64,
    onset_ms: u64,
    fail_every: Option<u64>,
) -> Option<u64> {
    let fake = FakeNvml::new(vec![answers]);
    let mut gpu = NvmlGpu::new(Arc::new(fake.clone()), 0).slow_every(slow_s);
    let limits = Limits {
        max_operating_c: 87.0,
    };
    let mut engine = HealthEngine::new(1, limits, Policy::default(), TimestampMs(0));
    for t in (0..=15 * MINUTE_MS).step_by(1_000) {
        let count = replays(tenths, t.saturating_sub(onset_ms));
        let fails = fail_every.is_some_and(|n| (t / 1_000) % n == n - 1);
        fake.set(0, |a| {
            let answer = match fails {
                true => Err(NvmlFailure::Other("no data".into())),
                false => Ok(count),
            };
            a.fields.insert(fi::PCIE_REPLAY_COUNTER, answer);
        });
        let s = gpu.sample().expect("a sample");
        engine.sample(TimestampMs(t), 0, &observation(&s));
        let st = engine.status(0).expect("GPU 0");
        if st.state == HealthState::Degraded {
            assert_eq!(st.reason, ReasonCode::PCIE_REPLAY_RATE, "{:?}", st.reason);
            return Some(t - onset_ms);
        }
    }
    None
}

/// Read every 27 s, which does not divide the minute, a steady rate just
/// above the limit (8.5/min against 8) was counted between reads and
/// could go undetected; read every sample it is detected at every phase
/// of the schedule within 4 minutes (as `rate_latency` measures it: it
/// counts 9 replays only in some minutes), as soon as with the slow
/// counters read every second, at every `slow_counters_s` tried (some
/// dividing the minute, most not), and the limit itself never is.
#[test]
fn a_replay_rate_just_above_the_limit_is_detected_at_every_slow_counters_setting() {
    let p = Policy::default();
    assert_eq!(
        p.pcie_replays_per_min, 8,
        "the limit these rates are set by"
    );
    let worst = 4 * MINUTE_MS;
    for slow_s in [1, 7, 11, 23, 27, 30, 45, 60] {
        for onset in (0..u64::from(slow_s) * 1_000).step_by(3_000) {
            let at = degraded_after(quiet(), slow_s, 85, onset);
            let at = at.unwrap_or_else(|| {
                panic!("8.5/min from {onset} ms, slow counters every {slow_s} s: never detected")
            });
            assert!(
                at <= worst,
                "8.5/min from {onset} ms, slow {slow_s} s: after {at} ms"
            );
            assert_eq!(
                Some(at),
                degraded_after(quiet(), 1, 85, onset),
                "8.5/min from {onset} ms, slow {slow_s} s: later than read every second"
            );
            let limit = degraded_after(quiet(), slow_s, 80, onset);
            assert_eq!(limit, None, "8/min from {onset} ms, slow {slow_s} s");
        }
    }
}

/// A read of the counter that fails now and then (NVML's "no data" in
/// the per-sample query) leaves that sample without it, and no more: the
/// rate is counted across it, its window and streak go on, so a replay
/// storm is still detected however often such a read fails.
#[test]
fn a_failed_read_now_and_then_does_not_hide_a_replay_storm() {
    for slow_s in [1, 30] {
        let at = degraded_failing(quiet(), slow_s, 240, 0, Some(100));
        let at = at.unwrap_or_else(|| panic!("24/min, slow counters every {slow_s} s: never"));
        assert!(at <= 3 * MINUTE_MS, "after {at} ms");
        let at = degraded_failing(quiet(), slow_s, 240, 0, Some(7));
        assert!(
            at.is_some_and(|at| at <= 3 * MINUTE_MS),
            "every 7th: {at:?}"
        );
        assert_eq!(
            degraded_failing(quiet(), slow_s, 80, 0, Some(7)),
            None,
            "8/min"
        );
    }
}

#[test]
fn the_replay_counter_rides_the_per_sample_field_query_without_a_call_of_its_own() {
    let fake = FakeNvml::new(vec![Answers::healthy()]);
    let mut gpu = NvmlGpu::new(Arc::new(fake.clone()), 0).slow_every(30);
    gpu.sample().expect("the first sample");
    for n in 18..21 {
        fake.set(0, |a| {
            a.fields.insert(fi::PCIE_REPLAY_COUNTER, Ok(n));
        });
        let s = gpu.sample().expect("a sample");
        assert_eq!(s.pcie_replay, n as u32, "fresh");
        assert!(!s.pcie_held, "not held");
        let asked = fake.field_requests(0).last().cloned().expect("asked");
        assert_eq!(
            asked,
            [
                fi::MEMORY_TEMP,
                fi::NVLINK_CRC_DATA_TOTAL,
                fi::NVLINK_REPLAY_TOTAL,
                fi::NVLINK_RECOVERY_TOTAL,
                fi::PCIE_REPLAY_COUNTER,
            ]
        );
    }
    assert_eq!(fake.calls(0, GET_FIELD_VALUES), 4, "one query a sample");
}

/// A GPU with no HBM temperature and no NVLink makes no field-value query
/// between reads of the slow counters: the counter is read with them,
/// held between (said in the sample), and its rate counted between
/// reads, never a call per sample for it alone.
#[test]
fn without_another_per_sample_field_the_counter_is_read_with_the_slow_counters() {
    let mut answers = quiet();
    for id in [fi::MEMORY_TEMP].into_iter().chain(fi::NVLINK) {
        answers.fields.insert(id, Err(NvmlFailure::NotSupported));
    }
    let fake = FakeNvml::new(vec![answers.clone()]);
    let mut gpu = NvmlGpu::new(Arc::new(fake.clone()), 0).slow_every(3);
    let first = gpu.sample().expect("the first sample");
    assert_eq!((first.pcie_replay, first.pcie_held), (17, false));
    let queries = fake.calls(0, GET_FIELD_VALUES);
    fake.set(0, |a| {
        a.fields.insert(fi::PCIE_REPLAY_COUNTER, Ok(30));
    });
    for _ in 0..2 {
        let s = gpu.sample().expect("a sample");
        assert_eq!((s.pcie_replay, s.pcie_held), (17, true), "held");
        assert!(!s.unsupported.contains(Unsupported::PCIE));
    }
    assert_eq!(fake.calls(0, GET_FIELD_VALUES), queries, "no query alone");
    let s = gpu.sample().expect("the slow read");
    assert_eq!((s.pcie_replay, s.pcie_held), (30, false));
    // Its rate is still judged, between reads.
    assert!(degraded_after(answers, 30, 240, 0).is_some(), "24/min");
}

/// A read of the counter that fails at the first sample of a GPU that
/// then reads it with the slow counters (the agent learns only at that
/// sample that the GPU answers no other per-sample field) leaves the
/// samples held until its next read without it, never with 0 as if read.
#[test]
fn a_failed_read_before_the_counter_is_held_leaves_the_held_samples_without_it() {
    let mut answers = quiet();
    for id in [fi::MEMORY_TEMP].into_iter().chain(fi::NVLINK) {
        answers.fields.insert(id, Err(NvmlFailure::NotSupported));
    }
    answers.fields.insert(
        fi::PCIE_REPLAY_COUNTER,
        Err(NvmlFailure::Other("no data".into())),
    );
    let fake = FakeNvml::new(vec![answers]);
    let mut gpu = NvmlGpu::new(Arc::new(fake.clone()), 0).slow_every(3);
    let first = gpu.sample().expect("the first sample");
    assert!(first.unsupported.contains(Unsupported::PCIE), "failed");
    fake.set(0, |a| {
        a.fields.insert(fi::PCIE_REPLAY_COUNTER, Ok(40));
    });
    for n in 2..4 {
        let s = gpu.sample().expect("a held sample");
        assert!(s.pcie_held, "sample {n}: held");
        assert!(
            s.unsupported.contains(Unsupported::PCIE),
            "sample {n}: the failed read held as 0 replays: {:?}",
            s.unsupported
        );
    }
    let s = gpu.sample().expect("the next read");
    assert_eq!((s.pcie_replay, s.pcie_held), (40, false));
    assert!(!s.unsupported.contains(Unsupported::PCIE));
    let s = gpu.sample().expect("held again");
    assert_eq!((s.pcie_replay, s.pcie_held), (40, true));
    assert!(!s.unsupported.contains(Unsupported::PCIE));
}

/// `node-agent probe` says the counter is read every sample exactly where
/// the agent reads it every sample, whichever per-sample fields and query
/// a GPU answers.
#[test]
fn probe_and_agent_agree_on_how_the_counter_is_read() {
    use NvmlFailure::{InvalidArgument, NotSupported};
    let without = |ids: &[u32], e: NvmlFailure| {
        let mut a = quiet();
        for &id in ids {
            a.fields.insert(id, Err(e.clone()));
        }
        a
    };
    let mut no_call = quiet();
    no_call.fields_call = Err(NotSupported);
    let mut cases = vec![
        ("all", quiet()),
        (
            "no HBM temperature",
            without(&[fi::MEMORY_TEMP], NotSupported),
        ),
        ("no NVLink", without(&fi::NVLINK, NotSupported)),
        (
            "one NVLink total",
            without(&fi::NVLINK[..2], InvalidArgument),
        ),
        ("no query", no_call),
    ];
    let none: Vec<u32> = [fi::MEMORY_TEMP].into_iter().chain(fi::NVLINK).collect();
    cases.push(("none", without(&none, NotSupported)));
    cases.push((
        "none, no data",
        without(&none, NvmlFailure::Other("no data".into())),
    ));
    for (name, answers) in cases {
        let fake = FakeNvml::new(vec![answers.clone()]);
        let row = node_agent::nvml::probe(&fake, 0, 1).pop().expect("rows");
        let fake = FakeNvml::new(vec![answers]);
        let mut gpu = NvmlGpu::new(Arc::new(fake), 0).slow_every(30);
        gpu.sample().expect("the first sample");
        let s = gpu.sample().expect("a sample between slow reads");
        let every = !s.pcie_held && !s.unsupported.contains(Unsupported::PCIE);
        assert_eq!(
            row.call.ends_with("PCIe replays read every sample"),
            every,
            "{name}: {} / held {}, unsupported {:?}",
            row.call,
            s.pcie_held,
            s.unsupported
        );
    }
}

/// `node-agent probe` names the query made every sample and says how the
/// counter is read: in it, or with the slow counters (no query made).
#[test]
fn probe_says_whether_the_counter_is_read_every_sample() {
    let row = |answers: Answers| {
        let fake = FakeNvml::new(vec![answers]);
        let probes = node_agent::nvml::probe(&fake, 0, 3);
        let last = probes.last().cloned().expect("rows");
        (last.call, last.answer, last.tries)
    };
    let (call, answer, tries) = row(Answers::healthy());
    assert_eq!(
        call,
        "nvmlDeviceGetFieldValues every sample (82, 45, 52, 59, 94): PCIe replays read every sample"
    );
    assert_eq!((answer.as_str(), tries), ("supported", 3));
    let mut alone = Answers::healthy();
    for id in [fi::MEMORY_TEMP].into_iter().chain(fi::NVLINK) {
        alone.fields.insert(id, Err(NvmlFailure::NotSupported));
    }
    let (call, answer, tries) = row(alone);
    assert_eq!(
        call,
        "nvmlDeviceGetFieldValues every sample (none): PCIe replays read with the slow counters"
    );
    assert_eq!((answer.as_str(), tries), ("not made", 0));
}
