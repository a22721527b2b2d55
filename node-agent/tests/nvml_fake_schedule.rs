//! The NVML layer of the agent, tested without a GPU: which counters a
//! sample reads when (NVLink per link, the slow counters every few
//! samples), `node-agent probe`, and failing closed: a read that fails is
//! never a held "all is well". The fake is `fake_nvml_api/`.

use std::sync::Arc;
use std::time::Duration;

use loopwarden_protocol::{EccCounts, GpuFlags, Unsupported, Watts, WholeCelsius};
use node_agent::gpu::{GpuDevice, GpuError, GpuSample, GpuSource};
use node_agent::nvml::{NvmlFailure, NvmlGpu, NvmlSource};
use node_agent::worker::{Answer, Worker};
use NvmlFailure::{GpuLost, NotSupported};

mod logs;
use logs::{lines_with, logged};

mod fake_nvml_api;
use fake_nvml_api::{
    clean, eventually, failed, fi, now_ok, one_gpu, Answers, FakeNvml, OpenOnDrop, GET_ECC_MODE,
    GET_FIELD_VALUES, GET_POWER_USAGE, GET_TEMPERATURE, SET_LIMIT,
};

// --- NVLink per link --------------------------------------------------

/// NVLink replay (46-51, 108-113) and recovery (53-58, 114-119) fields of
/// links 0 to 11, from `nvml.h`.
fn link_field(l: u32, recovery: bool) -> u32 {
    match (l < 6, recovery) {
        (true, false) => 46 + l,
        (true, true) => 53 + l,
        (false, false) => 108 + l - 6,
        (false, true) => 114 + l - 6,
    }
}

#[test]
fn nvlink_errors_are_read_per_link_where_links_answer_and_named_in_the_evidence() {
    let _one = logs::one_at_a_time();
    use node_core::health::{HealthEngine, Limits, Output, Policy};
    let mut answers = Answers::healthy();
    // Four links answer; links 4 to 11 are "not supported".
    for l in 0..4 {
        answers
            .fields
            .insert(link_field(l, false), Ok(10 * u64::from(l)));
        answers.fields.insert(link_field(l, true), Ok(0));
    }
    let (fake, mut gpu) = one_gpu(answers);
    let first = gpu.sample().expect("samples");
    assert_eq!(first.nvlink_links.read, 0b1111);
    assert_eq!(first.nvlink_links.replay[3], 30);
    // Links that are not there are not asked again.
    let second = gpu.sample().expect("samples");
    let asked = fake.field_requests(0);
    assert!(asked[0].contains(&link_field(11, true)));
    assert!(!asked[1].contains(&link_field(4, false)), "{:?}", asked[1]);
    assert!(asked[1].contains(&link_field(3, true)));
    // Link 2 replays: the totals did not move (a link beyond 11 could have
    // masked it), the link's own counter did.
    fake.set(0, |a| {
        a.fields.insert(link_field(2, false), Ok(23));
    });
    let third = gpu.sample().expect("samples");
    let limits = Limits {
        max_operating_c: 87.0,
    };
    let mut e = HealthEngine::new(
        1,
        limits,
        Policy::default(),
        loopwarden_protocol::TimestampMs(0),
    );
    // Only the links: this fake's healthy GPU has other faults to judge.
    let obs = |s: &GpuSample| node_core::health::Observation {
        nvlink_links: s.nvlink_links,
        ..Default::default()
    };
    assert!(e
        .sample(loopwarden_protocol::TimestampMs(1_000), 0, &obs(&second))
        .is_empty());
    let outs = e.sample(loopwarden_protocol::TimestampMs(2_000), 0, &obs(&third));
    let evidence = outs
        .iter()
        .find_map(|o| match o {
            Output::Change(c) => Some(c.evidence.clone()),
            _ => None,
        })
        .expect("quarantined");
    assert!(evidence.contains("link 2 replays +3"), "{evidence}");
    // A driver reload resets them: no rise, no verdict.
    fake.set(0, |a| {
        a.fields.insert(link_field(2, false), Ok(0));
    });
    let mut e = HealthEngine::new(
        1,
        limits,
        Policy::default(),
        loopwarden_protocol::TimestampMs(0),
    );
    e.sample(loopwarden_protocol::TimestampMs(1_000), 0, &obs(&third));
    let reset = gpu.sample().expect("samples");
    assert!(e
        .sample(loopwarden_protocol::TimestampMs(2_000), 0, &obs(&reset))
        .is_empty());
}

// --- The schedule: slow counters every few samples ----------------------

const GET_ENERGY: &str = "nvmlDeviceGetTotalEnergyConsumption";

/// The field ids of the last field-value request.
fn last_request(fake: &FakeNvml) -> Vec<u32> {
    fake.field_requests(0).last().cloned().unwrap_or_default()
}

#[test]
fn slow_counters_are_read_every_n_samples_and_held_between() {
    let _one = logs::one_at_a_time();
    let fake = FakeNvml::new(vec![Answers::healthy()]);
    let mut gpu = NvmlGpu::new(Arc::new(fake.clone()), 0).slow_every(3);
    let first = gpu.sample().expect("a sample");
    assert_eq!((first.pcie_replay, first.ecc.sbe_aggregate), (17, 1_234));
    fake.set(0, |a| {
        a.fields.insert(fi::PCIE_REPLAY_COUNTER, Ok(20));
        a.fields.insert(fi::MEMORY_TEMP, Ok(75));
        a.energy_mj = Ok(1);
    });
    for i in 2..=3 {
        let s = gpu.sample().expect("a sample");
        assert_eq!(s.pcie_replay, 20, "sample {i}: read every sample");
        assert!(!s.pcie_held, "sample {i}: PCIe replays not held");
        assert_eq!(s.energy_mj, 987_654_321, "sample {i}: held");
        assert_eq!(s.mem_temp, WholeCelsius(75), "sample {i}: fast");
        assert_eq!(
            last_request(&fake),
            [
                fi::MEMORY_TEMP,
                fi::NVLINK_CRC_DATA_TOTAL,
                fi::NVLINK_REPLAY_TOTAL,
                fi::NVLINK_RECOVERY_TOTAL,
                fi::PCIE_REPLAY_COUNTER
            ],
            "sample {i}: only the fast fields"
        );
    }
    assert_eq!(fake.calls(0, GET_ENERGY), 1);
    assert_eq!(fake.calls(0, GET_ECC_MODE), 1);
    let fourth = gpu.sample().expect("a sample");
    assert_eq!(
        (fourth.pcie_replay, fourth.energy_mj),
        (20, 1),
        "read again"
    );
    assert_eq!(fake.calls(0, GET_ENERGY), 2);
    // The fast calls every sample: 4 temperatures, 4 field queries.
    assert_eq!(fake.calls(0, GET_TEMPERATURE), 4);
    assert_eq!(fake.calls(0, GET_FIELD_VALUES), 4);
}

#[test]
fn an_ecc_error_or_an_xid_reads_the_slow_counters_at_once() {
    let _one = logs::one_at_a_time();
    let fake = FakeNvml::new(vec![Answers::healthy()]);
    let mut source = NvmlSource::new(fake.clone()).slow_every(100);
    let mut gpu = source.devices().expect("devices").remove(0);
    gpu.sample().expect("the first sample");
    // A corrected error, and the remap it led to.
    fake.set(0, |a| {
        a.ecc_total.insert((true, true), Ok(12));
        a.fields.insert(fi::REMAPPED_PENDING, Ok(1));
    });
    let s = gpu.sample().expect("a sample");
    assert!(
        s.flags.contains(GpuFlags::REMAP_PENDING),
        "read with the ECC error"
    );
    // A row remapped for an uncorrectable error, which the driver reports
    // with an XID, the volatile counts unchanged.
    fake.set(0, |a| {
        a.fields.insert(fi::REMAPPED_UNC, Ok(5));
    });
    let s = gpu.sample().expect("a sample");
    assert_eq!(s.repair.remap_uncorrectable, 4, "held: no reason to read");
    fake.state().xids = vec![(0, 64)];
    let (sink, events) = node_agent::xid_queue::xid_queue(8);
    source.watch_xids(sink).expect("the XID watch starts");
    assert!(
        events.recv_timeout(Duration::from_secs(2)).is_some(),
        "the XID"
    );
    let s = gpu.sample().expect("a sample");
    assert_eq!(s.repair.remap_uncorrectable, 5, "read after the XID");
}

#[test]
fn the_links_are_read_at_once_when_the_nvlink_totals_move() {
    let _one = logs::one_at_a_time();
    let mut answers = Answers::healthy();
    answers.fields.insert(link_field(2, false), Ok(5));
    answers.fields.insert(link_field(2, true), Ok(0));
    let fake = FakeNvml::new(vec![answers]);
    let mut gpu = NvmlGpu::new(Arc::new(fake.clone()), 0).slow_every(100);
    let first = gpu.sample().expect("a sample");
    assert_eq!(first.nvlink_links.replay[2], 5);
    gpu.sample().expect("a sample");
    assert!(
        !last_request(&fake).contains(&link_field(2, false)),
        "not asked"
    );
    fake.set(0, |a| {
        a.fields.insert(fi::NVLINK_REPLAY_TOTAL, Ok(105));
        a.fields.insert(link_field(2, false), Ok(8));
    });
    let s = gpu.sample().expect("a sample");
    assert_eq!(s.nvlink.replay, 105);
    assert_eq!(
        s.nvlink_links.replay[2], 8,
        "the link named in the same sample"
    );
    assert_ne!(s.nvlink_links.read & (1 << 2), 0);
}

// --- node-agent probe --------------------------------------------------

#[test]
fn probe_says_what_each_call_answers_and_names_the_fields_not_supported() {
    let _one = logs::one_at_a_time();
    let mut answers = Answers::healthy();
    answers.energy_mj = Err(NotSupported);
    answers.utilization = Err(GpuLost);
    let fake = FakeNvml::new(vec![answers]);
    let probes = node_agent::nvml::probe(&fake, 0, 5);
    let answer = |call: &str| {
        probes
            .iter()
            .find(|p| p.call == call)
            .unwrap_or_else(|| panic!("{call} probed: {probes:?}"))
            .answer
            .clone()
    };
    assert_eq!(answer(GET_TEMPERATURE), "supported");
    assert_eq!(answer(GET_ENERGY), "not supported");
    assert_eq!(answer("nvmlDeviceGetUtilizationRates"), "GPU lost");
    assert_eq!(
        answer("nvmlDeviceGetFieldValues NVML_FI_DEV_PCIE_REPLAY_COUNTER (94)"),
        "supported"
    );
    // The healthy fake answers no per-link field: each is named.
    assert_eq!(
        answer("nvmlDeviceGetFieldValues NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L3 (49)"),
        "not supported"
    );
    assert!(probes
        .iter()
        .all(|p| p.tries == 5 && p.median_us <= p.max_us));
    assert_eq!(fake.calls(0, GET_TEMPERATURE), 5);
    assert_eq!(fake.calls(0, SET_LIMIT), 0, "read only");
    let table = node_agent::nvml::probe_table(&probes);
    assert!(table.starts_with("GPU CALL"), "{table}");
    assert_eq!(table.lines().count(), probes.len() + 1);
}

// --- Failing closed: a read that fails is never a held "all is well" ----

#[test]
fn a_slow_read_that_fails_on_its_turn_is_a_miss_and_is_read_again_not_held() {
    let _one = logs::one_at_a_time();
    let fake = FakeNvml::new(vec![Answers::healthy()]);
    let mut gpu = NvmlGpu::new(Arc::new(fake.clone()), 0).slow_every(3);
    for _ in 0..3 {
        gpu.sample().expect("read, then held twice");
    }
    // On its turn the aggregate ECC read fails: the GPU is in trouble.
    fake.set(0, |a| {
        a.ecc_total.insert((false, false), Err(GpuLost));
        a.fields.insert(fi::PCIE_REPLAY_COUNTER, Ok(40));
    });
    assert_eq!(
        gpu.sample(),
        Err(GpuError::Lost),
        "a miss, not the held values"
    );
    // Still failing: the next sample reads the slow counters again instead
    // of passing on what it held for the rest of the period.
    let energy = fake.calls(0, GET_ENERGY);
    assert_eq!(gpu.sample(), Err(GpuError::Lost));
    assert_eq!(fake.calls(0, GET_ENERGY), energy + 1, "read again");
    fake.set(0, |a| {
        a.ecc_total.insert((false, false), Ok(6));
    });
    let s = gpu.sample().expect("answers again");
    assert_eq!((s.ecc.dbe_aggregate, s.pcie_replay), (6, 40), "fresh");
    // A slow field that fails on its turn: the same.
    fake.set(0, |a| {
        a.fields
            .insert(fi::REMAPPED_UNC, Err(NvmlFailure::Other("unknown".into())));
    });
    gpu.sample().expect("held: not its turn");
    gpu.sample().expect("held: not its turn");
    let err = gpu.sample().expect_err("its turn");
    assert_eq!(err, failed(GET_FIELD_VALUES, "unknown"));
    gpu.sample()
        .expect_err("asked again at once, and fails again");
    assert!(last_request(&fake).contains(&fi::REMAPPED_UNC));
}

#[test]
fn a_per_link_counter_that_fails_leaves_its_link_out_and_is_asked_again_next_sample() {
    let _one = logs::one_at_a_time();
    let mut answers = Answers::healthy();
    for l in 0..3 {
        answers.fields.insert(link_field(l, false), Ok(1));
        answers.fields.insert(link_field(l, true), Ok(0));
    }
    answers.fields.insert(
        link_field(1, false),
        Err(NvmlFailure::Other("unknown".into())),
    );
    let fake = FakeNvml::new(vec![answers]);
    let mut gpu = NvmlGpu::new(Arc::new(fake.clone()), 0).slow_every(100);
    let s = gpu.sample().expect("a per-link failure fails no sample");
    assert_eq!(s.nvlink_links.read, 0b101, "link 1 is not known");
    fake.set(0, |a| {
        a.fields.insert(link_field(1, false), Ok(4));
    });
    let s = gpu.sample().expect("a sample");
    assert!(
        last_request(&fake).contains(&link_field(1, false)),
        "asked again at once: {:?}",
        last_request(&fake)
    );
    assert_eq!(s.nvlink_links.read, 0b111);
    assert_eq!(s.nvlink_links.replay[1], 4);
    gpu.sample().expect("a sample");
    assert!(
        !last_request(&fake).contains(&link_field(1, false)),
        "then on the schedule again"
    );
}

#[test]
fn a_sensor_that_answered_and_then_says_not_supported_is_warned_by_name_and_asked_again() {
    let _one = logs::one_at_a_time();
    let mut answers = Answers::healthy();
    // Never supported here: said once, at info, and left alone.
    answers
        .fields
        .insert(fi::RETIRED_PENDING, Err(NotSupported));
    let fake = FakeNvml::new(vec![answers]);
    let mut gpu = NvmlGpu::new(Arc::new(fake.clone()), 0).slow_every(3);
    let (s, log) = logged(|| gpu.sample().expect("a sample"));
    assert_eq!(s.unsupported, Unsupported::RETIRED);
    let never = lines_with(
        &log,
        &["INFO", "NVML_FI_DEV_RETIRED_PENDING (31) is not supported"],
    );
    assert_eq!(never.len(), 1, "{log}");
    assert!(!log.contains("answered before"), "{log}");

    // A driver change or a GPU in a bad state: the HBM temperature and the
    // power draw, which answered, now say "not supported".
    fake.set(0, |a| {
        a.fields.insert(fi::MEMORY_TEMP, Err(NotSupported));
        a.power_mw = Err(NotSupported);
    });
    let (s, log) = logged(|| gpu.sample().expect("a sample"));
    let lost = Unsupported::RETIRED | Unsupported::MEM_TEMP | Unsupported::POWER;
    assert_eq!(s.unsupported, lost);
    assert_eq!((s.mem_temp, s.power), (WholeCelsius(0), Watts(0)));
    for name in ["NVML_FI_DEV_MEMORY_TEMP (82)", GET_POWER_USAGE] {
        let warned = lines_with(&log, &["WARN", name, "answered before"]);
        assert_eq!(warned.len(), 1, "{name}: {log}");
    }
    // Said once: not again while it stays lost, and not asked until the
    // next scheduled read of the slow counters.
    let (s, log) = logged(|| gpu.sample().expect("a sample"));
    assert_eq!(s.unsupported, lost);
    assert!(log.is_empty(), "{log}");
    assert!(!last_request(&fake).contains(&fi::MEMORY_TEMP));
    let power_calls = fake.calls(0, GET_POWER_USAGE);
    let (s, log) = logged(|| gpu.sample().expect("the scheduled read"));
    assert_eq!(s.unsupported, lost, "still lost");
    assert!(log.is_empty(), "{log}");
    let asked = last_request(&fake);
    assert!(asked.contains(&fi::MEMORY_TEMP), "{asked:?}");
    assert!(
        !asked.contains(&fi::RETIRED_PENDING),
        "never supported: {asked:?}"
    );
    assert_eq!(fake.calls(0, GET_POWER_USAGE), power_calls + 1);
    // They answer again: back at the next scheduled read, without a
    // reprobe, and said so.
    fake.set(0, |a| {
        a.fields.insert(fi::MEMORY_TEMP, Ok(75));
        a.power_mw = Ok(400_000);
    });
    for _ in 0..2 {
        assert_eq!(gpu.sample().expect("a sample").unsupported, lost);
    }
    let (s, log) = logged(|| gpu.sample().expect("the scheduled read"));
    assert_eq!(s.unsupported, Unsupported::RETIRED);
    assert_eq!((s.mem_temp, s.power), (WholeCelsius(75), Watts(400)));
    assert_eq!(lines_with(&log, &["answers again"]).len(), 2, "{log}");
}

#[test]
fn counters_that_go_back_are_a_reset_to_the_engine_never_a_huge_rise() {
    let _one = logs::one_at_a_time();
    use loopwarden_protocol::TimestampMs;
    use node_core::health::{HealthEngine, Limits, Output, Policy};
    let (fake, mut gpu) = one_gpu(clean());
    let limits = Limits {
        max_operating_c: 87.0,
    };
    let mut engine = HealthEngine::new(1, limits, Policy::default(), TimestampMs(0));
    let changes = |outs: Vec<Output>| -> Vec<String> {
        outs.into_iter()
            .filter_map(|o| match o {
                Output::Change(c) => Some(c.evidence.to_string()),
                _ => None,
            })
            .collect()
    };
    let mut judge = |t: u64, s: &GpuSample| {
        changes(engine.sample(TimestampMs(t), 0, &node_agent::shell::observation(s)))
    };
    let s = gpu.sample().expect("a sample");
    assert_eq!(judge(1_000, &s), Vec::<String>::new());
    // A driver reload: every counter starts again from 0.
    fake.set(0, |a| {
        for k in [(true, true), (true, false), (false, false)] {
            a.ecc_total.insert(k, Ok(0));
        }
        for id in [fi::PCIE_REPLAY_COUNTER].into_iter().chain(fi::NVLINK) {
            a.fields.insert(id, Ok(0));
        }
    });
    let s = gpu.sample().expect("a sample");
    assert_eq!(
        (
            s.ecc.sbe_aggregate,
            s.ecc.sbe_volatile,
            s.pcie_replay,
            s.nvlink.replay
        ),
        (0, 0, 0, 0),
        "read as they are"
    );
    assert_eq!(judge(2_000, &s), Vec::<String>::new(), "no rise");
    // A real rise after the reset counts from the reset.
    fake.set(0, |a| {
        a.fields.insert(fi::NVLINK_REPLAY_TOTAL, Ok(1));
    });
    let s = gpu.sample().expect("a sample");
    let evidence = judge(3_000, &s);
    assert_eq!(evidence.len(), 1, "{evidence:?}");
    assert!(evidence[0].contains("replays +1,"), "{evidence:?}");
    // A count past 32 bits stays at the top rather than wrap to a small
    // number, which would read as a reset.
    fake.set(0, |a| {
        a.fields
            .insert(fi::NVLINK_CRC_DATA_TOTAL, Ok((1 << 32) + 5));
    });
    assert_eq!(gpu.sample().expect("a sample").nvlink.crc, u32::MAX);
}

#[test]
fn field_values_short_of_the_fields_asked_fail_the_sample_instead_of_reading_zero() {
    let _one = logs::one_at_a_time();
    let mut answers = Answers::healthy();
    answers.fields_short = true;
    let (fake, mut gpu) = one_gpu(answers);
    match gpu.sample() {
        Err(GpuError::Failed { what, detail }) => {
            assert_eq!(what, GET_FIELD_VALUES);
            assert!(detail.contains("answers for"), "{detail}");
        }
        other => panic!("the sample must fail: {other:?}"),
    }
    fake.set(0, |a| a.fields_short = false);
    let s = gpu.sample().expect("answers whole again");
    assert_eq!(s.nvlink.recovery, 103, "the last field asked");
}

#[test]
fn no_value_from_before_a_reprobe_or_a_reset_is_held_as_current() {
    let _one = logs::one_at_a_time();
    let (fake, mut gpu) = one_gpu(Answers::healthy());
    let mut gpu_slow = NvmlGpu::new(Arc::new(fake.clone()), 0).slow_every(100);
    gpu_slow.sample().expect("a sample");
    fake.set(0, |a| {
        a.fields.insert(fi::RETIRED_PENDING, Ok(0));
    });
    let s = gpu_slow.sample().expect("a sample");
    assert!(
        s.flags.contains(GpuFlags::RETIRED_PENDING),
        "held between reads"
    );
    gpu_slow.reprobe();
    let s = gpu_slow.sample().expect("a sample");
    assert!(
        !s.flags.contains(GpuFlags::RETIRED_PENDING),
        "read after the reprobe"
    );

    // A reset that turns ECC off: no count from before it went off.
    let s = gpu.sample().expect("a sample");
    assert_eq!((s.ecc.sbe_aggregate, s.ecc.dbe_aggregate), (1_234, 5));
    fake.set(0, |a| a.temperature = Err(GpuLost));
    assert_eq!(gpu.sample(), Err(GpuError::Lost), "the reset");
    fake.set(0, |a| {
        a.temperature = Ok(40);
        a.ecc_enabled = Ok(false);
    });
    let s = gpu.sample().expect("back after the reset");
    assert!(!s.flags.contains(GpuFlags::ECC_ENABLED));
    assert_eq!(s.ecc, EccCounts::default(), "no stale aggregate count");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reprobe_asked_while_a_call_hangs_is_done_before_the_next_call() {
    const DEADLINE: Duration = Duration::from_millis(50);
    let mut answers = Answers::healthy();
    answers.power_mw = Err(NotSupported);
    let fake = FakeNvml::new(vec![answers]);
    let release = OpenOnDrop(fake.clone());
    let api = Arc::new(fake.clone());
    let w = Worker::spawn(0, Box::new(NvmlGpu::new(api, 0))).expect("worker thread");
    let s = now_ok(w.sample(DEADLINE).await);
    assert_eq!(s.unsupported, Unsupported::POWER);
    // The driver stalls and comes back, supporting power now; this GPU's
    // call still hangs when the agent asks every GPU to probe again.
    fake.set(0, |a| {
        a.power_mw = Ok(312_600);
        a.temperature_hangs = true;
    });
    fake.set_gate(true);
    assert!(matches!(w.sample(DEADLINE).await, Answer::Pending));
    assert_eq!(w.reprobe(DEADLINE).await, Ok(()), "kept, not refused");
    drop(release);
    assert!(eventually(Duration::from_secs(2), || !w.is_stuck(DEADLINE)));
    fake.set(0, |a| a.temperature_hangs = false);
    match w.sample(DEADLINE).await {
        Answer::Late(Ok(s)) => assert_eq!(s.unsupported, Unsupported::POWER, "asked before"),
        other => panic!("the late answer: {other:?}"),
    }
    let s = now_ok(w.sample(DEADLINE).await);
    assert_eq!(s.unsupported, Unsupported::empty(), "asked again");
    assert_eq!(s.power, Watts(313));
}

/// Every test of this binary takes the log lock first: a log line first
/// reached on another test's thread can be remembered as unheard and the
/// capture miss it (`logs/mod.rs`).
#[test]
fn every_test_here_takes_the_log_lock_first() {
    let _one = logs::one_at_a_time();
    logs::every_test_takes_the_lock_first(include_str!("nvml_fake_schedule.rs"));
}
