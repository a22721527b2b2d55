//! The NVML layer of the agent, tested without a GPU.
//!
//! `FakeNvml` implements [`NvmlApi`] with scripted answers per GPU (which
//! a test can change between calls) and counts every call made. Through
//! it, these tests check [`NvmlGpu`], [`NvmlSource`] and the per-GPU
//! [`Worker`]:
//! - a healthy GPU's answers land in every field of a sample, in the bus's
//!   units, and `describe` reports its identity and power range;
//! - a "not supported" answer is recorded once in `unsupported` and never
//!   asked again, while any other failure fails the call with the matching
//!   [`GpuError`]; an aggregate ECC counter the GPU lacks hides only the
//!   aggregate counts (`ecc_aggregate`), so a double-bit error still
//!   reaches the health rules through the volatile count; ECC off
//!   reports both ECC groups unknown, never 0 errors, said once as an
//!   error;
//! - a power limit set in watts reaches NVML in milliwatts and reads back;
//! - a GPU whose NVML call hangs times out on its own while the other GPUs
//!   keep answering, and answers again once the call returns;
//! - when every GPU's call hangs for six rounds (a driver stall), the
//!   health engine fed as the agent feeds it quarantines none and reports
//!   a host stall; the one GPU that stays hung afterwards is quarantined;
//! - XID events reach the agent, and a GPU that cannot be registered for
//!   them is reported; a GPU count that fails at the start, or
//!   registration answers slower than the source waits for, leave the
//!   watch said down (not silent) until it runs;
//! - NVML's clock-event bits map onto the bus's throttle reasons;
//! - it fails closed: a slow read that fails on its turn is a miss and is
//!   read again at the next sample, never held; a field that answered and
//!   then says "not supported" is warned of by name once and asked again
//!   at the next scheduled read; a field-value answer short of the fields
//!   asked fails the sample; counters that go back are a reset to the
//!   health engine, never a huge rise; nothing from before a reprobe or a
//!   reset is held as current, and a reprobe asked while a call hangs is
//!   kept for the GPU's next call.
//!
//! Field ids and throttle bits are written out from `nvml.h` rather than
//! taken from `node_agent::nvml`, so a wrong constant there shows here.
//!
//! Every test takes [`logs::one_at_a_time`] first: one captures the log
//! (ECC off said once), and others reach the same lines on threads of
//! their own, which could leave its capture deaf
//! (`every_test_here_takes_the_log_lock_first` checks it).
//!
//! The fake is in `fake_nvml_api/`. The calls that hang and the XID
//! events are tested in `nvml_fake_hangs_xids.rs`; NVLink per link, the
//! schedule of the slow counters, `node-agent probe` and failing closed
//! in `nvml_fake_schedule.rs`.

use std::sync::Arc;
use std::time::Duration;

use loopwarden_protocol::{
    EccCounts, GpuFlags, MegaHertz, MemoryRepair, NvlinkErrors, Percent, ThrottleReasons,
    Unsupported, Watts, WholeCelsius,
};
use node_agent::gpu::{GpuDevice, GpuError, GpuInfo, GpuSample, GpuSource};
use node_agent::nvml::{throttle_from_nvml, NvmlFailure, NvmlGpu, NvmlSource};
use node_agent::worker::Worker;
use NvmlFailure::{GpuLost, InvalidArgument, NoPermission, NotSupported};

mod fake_nvml_api;
mod logs;
use fake_nvml_api::{
    clean, failed, fi, nvml, one_gpu, Answers, FakeNvml, GET_ECC_MODE, GET_ECC_TOTAL,
    GET_ENFORCED_LIMIT, GET_FIELD_VALUES, GET_LIMIT, GET_POWER_USAGE, GET_TEMPERATURE, SET_LIMIT,
};
use logs::{lines_with, logged};

// --- 1. A healthy GPU ---------------------------------------------------

#[test]
fn healthy_gpu_sample_maps_every_field() {
    let _one = logs::one_at_a_time();
    let (_fake, mut gpu) = one_gpu(Answers::healthy());
    let sample = gpu.sample().expect("a healthy GPU samples");
    let expected = GpuSample {
        // RETIRED_PENDING 1, REMAPPED_PENDING 0, REMAPPED_FAILURE 1.
        flags: GpuFlags::ECC_ENABLED | GpuFlags::RETIRED_PENDING | GpuFlags::REMAP_FAILURE,
        unsupported: Unsupported::empty(),
        temp: WholeCelsius(61),
        mem_temp: WholeCelsius(74),
        // 312 600 mW rounds to the nearest watt.
        power: Watts(313),
        energy_mj: 987_654_321,
        power_limit: Watts(650),
        enforced_unread: false,
        sm_clock: MegaHertz(1980),
        mem_clock: MegaHertz(2619),
        util: Percent::new(87).unwrap(),
        throttle: ThrottleReasons::SW_POWER_CAP | ThrottleReasons::HW_THERMAL_SLOWDOWN,
        ecc: EccCounts {
            sbe_volatile: 11,
            dbe_volatile: 2,
            sbe_aggregate: 1_234,
            dbe_aggregate: 5,
        },
        repair: MemoryRepair {
            retired_sbe: 3,
            retired_dbe: 1,
            remap_correctable: 6,
            remap_uncorrectable: 4,
        },
        pcie_replay: 17,
        nvlink: NvlinkErrors {
            crc: 101,
            replay: 102,
            recovery: 103,
        },
        // No link answers on its own: the totals stand.
        nvlink_links: Default::default(),
        recovery_action: Some(0),
        // The first sample reads the slow counters.
        pcie_held: false,
    };
    assert_eq!(sample, expected);
}

/// The recovery action the driver names is read with the slow counters
/// (and at once after an XID), held between reads and through a read
/// that fails, and not known (`None`) on a driver without it.
#[test]
fn the_recovery_action_is_read_with_the_slow_counters_and_held() {
    let _one = logs::one_at_a_time();
    let fake = FakeNvml::new(vec![Answers::healthy()]);
    let mut gpu = NvmlGpu::new(Arc::new(fake.clone()), 0).slow_every(3);
    assert_eq!(gpu.sample().expect("a sample").recovery_action, Some(0));
    fake.set(0, |a| {
        a.fields.insert(fi::RECOVERY_ACTION, Ok(1));
    });
    for i in 2..=3 {
        let s = gpu.sample().expect("a sample");
        assert_eq!(s.recovery_action, Some(0), "sample {i}: held");
    }
    assert_eq!(gpu.sample().expect("a sample").recovery_action, Some(1));
    // A read that fails on its own data keeps the action last read.
    fake.set(0, |a| {
        a.fields.insert(
            fi::RECOVERY_ACTION,
            Err(NvmlFailure::Other(
                "an internal driver error occurred".into(),
            )),
        );
    });
    for _ in 0..3 {
        assert_eq!(gpu.sample().expect("a sample").recovery_action, Some(1));
    }
    // A driver older than the field: NVML answers its entry with an
    // invalid argument (an id it does not know), not "not supported". The
    // sample goes on, the action not known, and is not asked again.
    let mut older = Answers::healthy();
    older
        .fields
        .insert(fi::RECOVERY_ACTION, Err(NvmlFailure::InvalidArgument));
    let (fake, mut gpu) = one_gpu(older);
    for _ in 0..3 {
        let s = gpu.sample().expect("a sample on an older driver");
        assert_eq!((s.recovery_action, s.temp), (None, WholeCelsius(61)));
    }
    assert!(
        fake.field_requests(0)
            .iter()
            .skip(1)
            .all(|ids| !ids.contains(&fi::RECOVERY_ACTION)),
        "asked again"
    );
}

#[test]
fn pending_flags_follow_their_own_fields_and_ecc_off_skips_the_counters() {
    let _one = logs::one_at_a_time();
    let mut answers = Answers::healthy();
    answers.ecc_enabled = Ok(false);
    for (id, v) in [
        (fi::RETIRED_PENDING, 0),
        (fi::REMAPPED_PENDING, 1),
        (fi::REMAPPED_FAILURE, 0),
    ] {
        answers.fields.insert(id, Ok(v));
    }
    let (fake, mut gpu) = one_gpu(answers);
    let sample = gpu.sample().expect("sample");
    assert_eq!(sample.flags, GpuFlags::REMAP_PENDING);
    assert_eq!(sample.ecc, EccCounts::default());
    assert_eq!(
        sample.unsupported,
        Unsupported::ECC | Unsupported::ECC_AGGREGATE,
        "ECC off: no count known, never 0 errors"
    );
    assert_eq!(
        fake.calls(0, GET_ECC_TOTAL),
        0,
        "no ECC counters asked with ECC off"
    );
}

/// ECC off counts no memory error: its groups are unknown (the health
/// rules hold them, `/metrics` leaves their series out), never "0
/// errors", and an error names the GPU once. ECC off is still not ECC
/// unsupported: the mode is asked again at every read of the slow
/// counters, so ECC turned on (at a reset) is read at once.
#[test]
fn ecc_off_is_said_once_and_its_counts_are_unknown_never_no_errors() {
    let _one = logs::one_at_a_time();
    let mut answers = Answers::healthy();
    answers.ecc_enabled = Ok(false);
    let (fake, mut gpu) = one_gpu(answers);
    let (samples, log) = logged(|| {
        (0..3)
            .map(|_| gpu.sample().expect("sample"))
            .collect::<Vec<_>>()
    });
    for s in &samples {
        assert_eq!(s.unsupported, Unsupported::ECC | Unsupported::ECC_AGGREGATE);
        assert!(!s.flags.contains(GpuFlags::ECC_ENABLED));
        assert_eq!(s.ecc, EccCounts::default(), "no count beside its bit");
    }
    let said = lines_with(&log, &["ERROR", "GPU 0", "ECC is off"]);
    assert_eq!(said.len(), 1, "said once:\n{log}");
    assert_eq!(fake.calls(0, GET_ECC_MODE), 3, "asked at every slow read");
    fake.set(0, |a| a.ecc_enabled = Ok(true));
    let s = gpu.sample().expect("sample");
    assert!(s.flags.contains(GpuFlags::ECC_ENABLED));
    assert_eq!(s.unsupported, Unsupported::empty());
    assert_eq!((s.ecc.sbe_volatile, s.ecc.dbe_volatile), (11, 2));
}

#[test]
fn describe_maps_identity_and_limits_per_gpu() {
    let _one = logs::one_at_a_time();
    let mut second = Answers::healthy();
    second.uuid = Ok("GPU-second".into());
    second.default_limit_mw = Ok(600_400);
    second.constraints_mw = Ok((150_000, 699_500));
    let fake = FakeNvml::new(vec![Answers::healthy(), second]);
    let mut devices = NvmlSource::new(fake).devices().expect("devices");
    assert_eq!(devices.len(), 2);
    assert_eq!(
        devices[0].describe(),
        Ok(GpuInfo {
            name: "NVIDIA H200".into(),
            uuid: "GPU-0c1d2e3f-0000-4000-8000-000000000000".into(),
            default_limit: Watts(700),
            min_limit: Watts(200),
            max_limit: Watts(725),
            persistence: Some(true),
        })
    );
    // The second device is GPU 1; the limits are whole watts inside
    // NVML's: the default and the maximum rounded down, the minimum up.
    assert_eq!(
        devices[1].describe(),
        Ok(GpuInfo {
            name: "NVIDIA H200".into(),
            uuid: "GPU-second".into(),
            default_limit: Watts(600),
            min_limit: Watts(150),
            max_limit: Watts(699),
            persistence: Some(true),
        })
    );
}

// --- 2. Not supported: recorded once, not an error every sample ----------

#[test]
fn unsupported_fields_are_recorded_once_and_not_asked_again() {
    let _one = logs::one_at_a_time();
    let mut answers = Answers::healthy();
    answers.power_mw = Err(NotSupported);
    answers.fields.insert(fi::MEMORY_TEMP, Err(NotSupported));
    for id in fi::NVLINK {
        answers.fields.insert(id, Err(NotSupported));
    }
    let (fake, mut gpu) = one_gpu(answers);

    for round in 0..3 {
        let s = gpu
            .sample()
            .unwrap_or_else(|e| panic!("sample {round}: {e}"));
        assert_eq!(
            s.unsupported,
            Unsupported::POWER | Unsupported::MEM_TEMP | Unsupported::NVLINK,
            "sample {round}"
        );
        assert_eq!(s.power, Watts(0), "sample {round}");
        assert_eq!(s.mem_temp, WholeCelsius(0), "sample {round}");
        assert_eq!(s.nvlink, NvlinkErrors::default(), "sample {round}");
        // Everything else is still read.
        assert_eq!(s.temp, WholeCelsius(61), "sample {round}");
        assert_eq!(s.pcie_replay, 17, "sample {round}");
        assert_eq!(s.repair.remap_correctable, 6, "sample {round}");
        assert!(
            s.flags.contains(GpuFlags::RETIRED_PENDING),
            "sample {round}"
        );
    }

    assert_eq!(fake.calls(0, GET_TEMPERATURE), 3);
    assert_eq!(
        fake.calls(0, GET_POWER_USAGE),
        1,
        "power usage asked once only"
    );
    let requests = fake.field_requests(0);
    assert_eq!(requests.len(), 3);
    let dropped = [fi::MEMORY_TEMP, fi::NVLINK[0], fi::NVLINK[1], fi::NVLINK[2]];
    assert!(
        dropped.iter().all(|id| requests[0].contains(id)),
        "{:?}",
        requests[0]
    );
    for later in &requests[1..] {
        assert!(
            !later.iter().any(|id| dropped.contains(id)),
            "asked again: {later:?}"
        );
        assert!(later.contains(&fi::PCIE_REPLAY_COUNTER), "{later:?}");
        assert!(later.contains(&fi::REMAPPED_COR), "{later:?}");
    }
}

#[test]
fn after_a_reprobe_what_was_not_supported_is_asked_again() {
    let _one = logs::one_at_a_time();
    let mut answers = Answers::healthy();
    answers.power_mw = Err(NotSupported);
    answers.fields.insert(fi::MEMORY_TEMP, Err(NotSupported));
    let (fake, mut gpu) = one_gpu(answers);
    let s = gpu.sample().expect("a sample");
    assert_eq!(s.unsupported, Unsupported::POWER | Unsupported::MEM_TEMP);
    // A new driver supports them.
    fake.set(0, |a| {
        a.power_mw = Ok(312_600);
        a.fields.insert(fi::MEMORY_TEMP, Ok(74));
    });
    assert_eq!(
        gpu.sample().unwrap().unsupported,
        s.unsupported,
        "not asked"
    );
    gpu.reprobe();
    let s = gpu.sample().expect("a sample");
    assert_eq!(s.unsupported, Unsupported::empty());
    assert_eq!((s.power, s.mem_temp), (Watts(313), WholeCelsius(74)));
    assert_eq!(fake.calls(0, GET_POWER_USAGE), 2);
}

#[test]
fn unsupported_field_values_call_marks_every_field_group_once() {
    let _one = logs::one_at_a_time();
    let mut answers = Answers::healthy();
    answers.fields_call = Err(NotSupported);
    let (fake, mut gpu) = one_gpu(answers);
    for round in 0..3 {
        let s = gpu
            .sample()
            .unwrap_or_else(|e| panic!("sample {round}: {e}"));
        assert_eq!(
            s.unsupported,
            Unsupported::MEM_TEMP
                | Unsupported::RETIRED
                | Unsupported::REMAP
                | Unsupported::PCIE
                | Unsupported::NVLINK,
            "sample {round}"
        );
        assert_eq!(s.flags, GpuFlags::ECC_ENABLED, "sample {round}");
        assert_eq!(s.mem_temp, WholeCelsius(0));
        assert_eq!(s.repair, MemoryRepair::default());
        assert_eq!(s.pcie_replay, 0);
        assert_eq!(s.nvlink, NvlinkErrors::default());
        assert_eq!(s.power, Watts(313), "the other calls still answer");
    }
    assert_eq!(
        fake.field_requests(0).len(),
        1,
        "field values asked once only"
    );
}

#[test]
fn unsupported_ecc_mode_reports_ecc_unsupported_and_off() {
    let _one = logs::one_at_a_time();
    let mut answers = Answers::healthy();
    answers.ecc_enabled = Err(NotSupported);
    let (fake, mut gpu) = one_gpu(answers);
    for _ in 0..2 {
        let s = gpu.sample().expect("sample");
        // No count of either kind is read without the mode.
        assert_eq!(s.unsupported, Unsupported::ECC | Unsupported::ECC_AGGREGATE);
        assert!(!s.flags.contains(GpuFlags::ECC_ENABLED));
        assert_eq!(s.ecc, EccCounts::default());
    }
    assert_eq!(fake.calls(0, GET_ECC_MODE), 1);
    assert_eq!(fake.calls(0, GET_ECC_TOTAL), 0);
}

// --- 3. Other failures are errors ----------------------------------------

/// The error of one sample of a healthy GPU changed by `change`.
fn sample_error(change: impl FnOnce(&mut Answers)) -> GpuError {
    let mut answers = Answers::healthy();
    change(&mut answers);
    let (_fake, mut gpu) = one_gpu(answers);
    gpu.sample().expect_err("the sample must fail")
}

/// A GPU whose die temperature NVML does not support, and one whose
/// enforced limit it reads as an invalid argument: each error names the
/// call with NVML's answer, and says nothing of a range or of root.
#[test]
fn an_nvml_refusal_names_the_call_and_nvmls_answer() {
    let _one = logs::one_at_a_time();
    let temp = sample_error(|a| a.temperature = Err(NotSupported));
    assert_eq!(temp, nvml("nvmlDeviceGetTemperature", NotSupported));
    let limit = sample_error(|a| a.enforced_limit_mw = Err(InvalidArgument));
    assert_eq!(
        limit,
        nvml("nvmlDeviceGetEnforcedPowerLimit", InvalidArgument)
    );
    for (e, call, answer) in [
        (temp, "nvmlDeviceGetTemperature", "NVML_ERROR_NOT_SUPPORTED"),
        (
            limit,
            "nvmlDeviceGetEnforcedPowerLimit",
            "NVML_ERROR_INVALID_ARGUMENT",
        ),
    ] {
        let text = e.to_string();
        assert!(text.contains(call) && text.contains(answer), "{text}");
        for wrong in ["out of range", "setting limits", "root"] {
            assert!(!text.contains(wrong), "{text}");
        }
    }
    let (fake, mut gpu) = one_gpu(Answers::healthy());
    fake.set(0, |a| a.uuid = Err(NotSupported));
    let text = gpu.describe().expect_err("no UUID").to_string();
    assert!(
        text.contains("nvmlDeviceGetUUID: NVML_ERROR_NOT_SUPPORTED"),
        "{text}"
    );
}

#[test]
fn failures_other_than_not_supported_fail_the_sample() {
    let _one = logs::one_at_a_time();
    let x = || NvmlFailure::Other("x".into());
    assert_eq!(
        sample_error(|a| a.temperature = Err(GpuLost)),
        GpuError::Lost
    );
    assert_eq!(sample_error(|a| a.power_mw = Err(GpuLost)), GpuError::Lost);
    assert_eq!(
        sample_error(|a| a.fields_call = Err(GpuLost)),
        GpuError::Lost
    );
    assert_eq!(
        sample_error(|a| {
            a.fields.insert(fi::REMAPPED_UNC, Err(GpuLost));
        }),
        GpuError::Lost
    );
    assert_eq!(
        sample_error(|a| a.utilization = Err(NoPermission)),
        nvml("nvmlDeviceGetUtilizationRates", NoPermission)
    );
    assert_eq!(
        sample_error(|a| a.clocks_mhz = Err(x())),
        failed("nvmlDeviceGetClockInfo", "x")
    );
    assert_eq!(
        sample_error(|a| {
            a.ecc_total.insert((false, false), Err(x()));
        }),
        failed(GET_ECC_TOTAL, "x")
    );
    assert_eq!(
        sample_error(|a| {
            a.fields.insert(fi::PCIE_REPLAY_COUNTER, Err(x()));
        }),
        failed(GET_FIELD_VALUES, "x")
    );
    // An NVML timeout is a failed call, not the worker's deadline.
    assert!(matches!(
        sample_error(|a| a.throttle_bits = Err(NvmlFailure::Timeout)),
        GpuError::Failed {
            what: "nvmlDeviceGetCurrentClocksThrottleReasons",
            ..
        }
    ));
}

#[test]
fn a_failure_is_not_recorded_as_unsupported() {
    let _one = logs::one_at_a_time();
    let mut answers = Answers::healthy();
    answers.power_mw = Err(GpuLost);
    let (fake, mut gpu) = one_gpu(answers);
    assert_eq!(gpu.sample(), Err(GpuError::Lost));
    fake.set(0, |a| a.power_mw = Ok(400_000));
    let s = gpu.sample().expect("the GPU is back");
    assert_eq!(s.power, Watts(400));
    assert_eq!(s.unsupported, Unsupported::empty());
}

#[test]
fn describe_and_limit_failures_map_to_gpu_errors() {
    let _one = logs::one_at_a_time();
    let (fake, mut gpu) = one_gpu(Answers::healthy());
    fake.set(0, |a| a.name = Err(NvmlFailure::Other("x".into())));
    assert_eq!(gpu.describe(), Err(failed("nvmlDeviceGetName", "x")));
    fake.set(0, |a| {
        a.name = Ok("NVIDIA H200".into());
        a.constraints_mw = Err(GpuLost);
    });
    assert_eq!(gpu.describe(), Err(GpuError::Lost));

    fake.set(0, |a| a.set_limit_fails = Some(NoPermission));
    let refused = gpu.set_power_limit(Watts(450));
    assert_eq!(
        refused,
        Err(nvml("nvmlDeviceSetPowerManagementLimit", NoPermission))
    );
    let text = refused.unwrap_err().to_string();
    assert!(
        text.ends_with(
            "NVML_ERROR_NO_PERMISSION (the agent lacks the permission): setting limits needs root"
        ),
        "{text}"
    );
    fake.set(0, |a| a.set_limit_fails = Some(InvalidArgument));
    assert_eq!(
        gpu.set_power_limit(Watts(5_000)),
        Err(GpuError::InvalidArgument)
    );
    fake.set(0, |a| {
        a.set_limit_fails = Some(NvmlFailure::Other("x".into()))
    });
    assert_eq!(gpu.set_power_limit(Watts(450)), Err(failed(SET_LIMIT, "x")));

    fake.set(0, |a| a.limit_mw = Err(GpuLost));
    assert_eq!(gpu.power_limit(), Err(GpuError::Lost));
}

// --- 4. Set and read back ---------------------------------------------------

#[tokio::test]
async fn set_limit_reaches_nvml_in_milliwatts_and_reads_back_in_watts() {
    let (fake, mut gpu) = one_gpu(Answers::healthy());
    gpu.set_power_limit(Watts(450)).expect("set");
    assert_eq!(fake.answers(0).limit_mw, Ok(450_000));
    // Read back is the management limit (the enforced one is 650 W here).
    assert_eq!(gpu.power_limit(), Ok(Watts(450)));
    assert_eq!(fake.calls(0, GET_LIMIT), 1);
    // A limit the driver holds in non-whole watts rounds down: taken as
    // a ceiling, it is never put back above what was set.
    fake.set(0, |a| a.limit_mw = Ok(449_600));
    assert_eq!(gpu.power_limit(), Ok(Watts(449)));

    // The same through the GPU's worker thread.
    let deadline = Duration::from_secs(2);
    let worker = Worker::spawn(0, Box::new(gpu)).expect("worker thread");
    worker.set_limit(Watts(300), deadline).await.expect("set");
    assert_eq!(fake.answers(0).limit_mw, Ok(300_000));
    assert_eq!(worker.read_limit(deadline).await, Ok(Watts(300)));
}

// --- Partly supported groups -------------------------------------------

#[test]
fn an_unsupported_enforced_limit_hides_neither_power_nor_the_limit() {
    let _one = logs::one_at_a_time();
    let mut answers = Answers::healthy();
    answers.enforced_limit_mw = Err(NotSupported);
    let (fake, mut gpu) = one_gpu(answers);
    for round in 0..3 {
        let s = gpu.sample().expect("samples");
        assert_eq!(s.power, Watts(313), "sample {round}: power still read");
        assert_eq!(
            s.power_limit,
            Watts(700),
            "sample {round}: the limit set stands in"
        );
        assert!(
            !s.unsupported.contains(Unsupported::POWER),
            "sample {round}"
        );
    }
    assert_eq!(fake.calls(0, GET_ENFORCED_LIMIT), 1, "asked once only");
    assert_eq!(fake.calls(0, GET_POWER_USAGE), 3);
}

/// A GPU whose ECC counter `counter` (corrected, volatile) answers "not
/// supported": every sample reports `group` and the counts `ecc`, and the
/// mode is still read.
fn one_ecc_counter_unsupported(counter: (bool, bool), group: Unsupported, ecc: EccCounts) {
    let mut answers = Answers::healthy();
    answers.ecc_total.insert(counter, Err(NotSupported));
    let (fake, mut gpu) = one_gpu(answers);
    for round in 0..3 {
        let s = gpu.sample().expect("samples");
        assert!(
            s.flags.contains(GpuFlags::ECC_ENABLED),
            "sample {round}: ECC is on"
        );
        assert_eq!(s.unsupported, group, "sample {round}");
        assert_eq!(s.ecc, ecc, "sample {round}: no count beside its bit");
    }
    assert_eq!(fake.calls(0, GET_ECC_MODE), 3, "the mode is still read");
}

#[test]
fn one_unsupported_aggregate_ecc_counter_hides_only_the_aggregates() {
    let _one = logs::one_at_a_time();
    // The volatile counts stand.
    one_ecc_counter_unsupported(
        (true, false),
        Unsupported::ECC_AGGREGATE,
        EccCounts {
            sbe_volatile: 11,
            dbe_volatile: 2,
            sbe_aggregate: 0,
            dbe_aggregate: 0,
        },
    );
}

#[test]
fn unsupported_aggregate_ecc_counters_leave_a_dbe_rise_to_the_rules() {
    let _one = logs::one_at_a_time();
    use loopwarden_protocol::{HealthState, ReasonCode, TimestampMs};
    use node_core::health::{HealthEngine, Limits, Output, Policy};
    let mut answers = clean();
    for corrected in [true, false] {
        answers
            .ecc_total
            .insert((corrected, false), Err(NotSupported));
    }
    let (fake, mut gpu) = one_gpu(answers);
    let limits = Limits {
        max_operating_c: 87.0,
    };
    let mut engine = HealthEngine::new(1, limits, Policy::default(), TimestampMs(0));
    let s = gpu.sample().expect("a sample");
    assert_eq!(s.unsupported, Unsupported::ECC_AGGREGATE, "not ecc");
    assert_eq!((s.ecc.sbe_volatile, s.ecc.dbe_volatile), (11, 0));
    let observed = |s: &GpuSample| node_agent::shell::observation(s);
    let outs = engine.sample(TimestampMs(1_000), 0, &observed(&s));
    assert!(outs.is_empty(), "{outs:?}");
    // A double-bit error: the volatile count rises.
    fake.set(0, |a| {
        a.ecc_total.insert((false, true), Ok(1));
    });
    let s = gpu.sample().expect("a sample");
    assert_eq!(s.unsupported, Unsupported::ECC_AGGREGATE);
    assert_eq!(s.ecc.dbe_volatile, 1, "the rise reaches the sample");
    let outs = engine.sample(TimestampMs(2_000), 0, &observed(&s));
    assert!(
        outs.iter().any(|o| matches!(o, Output::Change(c)
            if c.reason == ReasonCode::DBE_VOLATILE && c.to == HealthState::Quarantined)),
        "{outs:?}"
    );
    // Each aggregate counter was asked once; the volatile ones every sample.
    assert_eq!(fake.calls(0, GET_ECC_TOTAL), 2 + 2 * 2);
}

#[test]
fn one_unsupported_volatile_ecc_counter_reports_ecc_and_keeps_the_aggregates() {
    let _one = logs::one_at_a_time();
    // The aggregates stand.
    one_ecc_counter_unsupported(
        (true, true),
        Unsupported::ECC,
        EccCounts {
            sbe_volatile: 0,
            dbe_volatile: 0,
            sbe_aggregate: 1_234,
            dbe_aggregate: 5,
        },
    );
}

#[test]
fn a_partly_unsupported_group_reports_nothing_of_it() {
    let _one = logs::one_at_a_time();
    let mut answers = Answers::healthy();
    answers
        .fields
        .insert(fi::REMAPPED_PENDING, Err(NotSupported));
    let (_fake, mut gpu) = one_gpu(answers);
    for round in 0..2 {
        let s = gpu.sample().expect("samples");
        assert!(s.unsupported.contains(Unsupported::REMAP), "sample {round}");
        assert_eq!(s.repair.remap_correctable, 0, "sample {round}");
        assert_eq!(s.repair.remap_uncorrectable, 0, "sample {round}");
        assert!(!s.flags.contains(GpuFlags::REMAP_FAILURE), "sample {round}");
        // The other groups of the same call are untouched.
        assert_eq!(s.repair.retired_sbe, 3, "sample {round}");
        assert_eq!(s.pcie_replay, 17, "sample {round}");
    }
}

// --- 7. Throttle bits -------------------------------------------------------

#[test]
fn throttle_bits_map_to_reasons_and_unknown_bits_are_ignored() {
    let _one = logs::one_at_a_time();
    // nvmlClocksEventReason* bits, from nvml.h.
    let table = [
        (0x1, ThrottleReasons::IDLE),
        (0x2, ThrottleReasons::APPLICATIONS_CLOCKS),
        (0x4, ThrottleReasons::SW_POWER_CAP),
        (0x8, ThrottleReasons::HW_SLOWDOWN),
        (0x10, ThrottleReasons::SYNC_BOOST),
        (0x20, ThrottleReasons::SW_THERMAL_SLOWDOWN),
        (0x40, ThrottleReasons::HW_THERMAL_SLOWDOWN),
        (0x80, ThrottleReasons::HW_POWER_BRAKE),
    ];
    for (bit, reason) in table {
        assert_eq!(throttle_from_nvml(bit), reason, "bit {bit:#x}");
    }
    let all = table
        .iter()
        .fold(ThrottleReasons::empty(), |acc, (_, r)| acc | *r);
    assert_eq!(throttle_from_nvml(0xff), all);
    assert_eq!(throttle_from_nvml(0), ThrottleReasons::empty());
    assert_eq!(
        throttle_from_nvml(0x4 | 0x40),
        ThrottleReasons::SW_POWER_CAP | ThrottleReasons::HW_THERMAL_SLOWDOWN
    );
    // 0x100 (display clock setting) and bits NVML may add later are dropped.
    let unknown = 0x100 | 0x200 | 1 << 40 | 1 << 63;
    assert_eq!(throttle_from_nvml(unknown), ThrottleReasons::empty());
    assert_eq!(
        throttle_from_nvml(unknown | 0x4),
        ThrottleReasons::SW_POWER_CAP
    );
}

/// A test of this binary that captures log lines can miss its own if
/// another reaches the same line on a thread of its own first
/// (`logs/mod.rs`): every test here takes the lock first, this one too.
#[test]
fn every_test_here_takes_the_log_lock_first() {
    let _one = logs::one_at_a_time();
    logs::every_test_takes_the_lock_first(include_str!("nvml_fake.rs"));
}
