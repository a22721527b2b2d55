//! One NVML read that fails does not throw away a GPU's whole sample,
//! nor pass on a value that could not be read.
//!
//! Through a small scripted [`NvmlApi`] (healthy answers, any call or
//! field made to fail with a chosen NVML answer), these tests check
//! [`NvmlGpu`] and the health engine fed as the agent feeds it:
//! - an aggregate ECC read that fails with an error about its own data
//!   (`NVML_ERROR_CORRUPTED_INFOROM`, as on a GPU with a bad InfoROM)
//!   costs only the aggregate counts: the sample keeps its temperature,
//!   power and volatile counts, `ecc_aggregate` is unknown, the failure
//!   is said once, and the GPU is never counted as missed;
//! - a lost GPU, an NVML timeout, an uninitialised library or a driver
//!   not loaded still fail the sample, and the GPU is quarantined
//!   `unresponsive` as before;
//! - a slow counter whose read failed stays unknown until the next read
//!   of the slow counters, never held as if read, and a fast one is
//!   unknown in its own sample only;
//! - the whole field-value query failing that way costs only its fields;
//! - an ECC mode whose read failed and answers again at the next read of
//!   the slow counters never sends the volatile counts skipped meanwhile
//!   as read (0): a sample has them unknown or has the GPU's counts;
//! - an energy counter that answered and then says "not supported" (lost)
//!   is sent as 0, not known, never its last value, and comes back when it
//!   answers; a power limit neither limit call answers is 0 W, not known.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use loopwarden_protocol::{HealthState, TimestampMs, Unsupported, Watts, WholeCelsius};
use node_agent::gpu::{GpuDevice, GpuError, GpuSample};
use node_agent::nvml::field;
use node_agent::nvml::{NvmlApi, NvmlFailure, NvmlGpu, NvmlResult};
use node_core::health::{HealthEngine, Limits, Policy};

mod logs;
use logs::{lines_with, logged};

/// NVML's words for `NVML_ERROR_CORRUPTED_INFOROM`, as the agent gets them.
const CORRUPTED_INFOROM: &str = "the infoROM is corrupted";
/// NVML's words for `NVML_ERROR_NO_DATA`.
const NO_DATA: &str = "no data";

/// What the fake answers: healthy values, except the calls (by the keys
/// below) and the fields scripted to fail.
#[derive(Default)]
struct Script {
    /// Call key → the failure it answers.
    fails: BTreeMap<&'static str, NvmlFailure>,
    /// Field id → the failure it answers.
    field_fails: BTreeMap<u32, NvmlFailure>,
    /// Calls made, by key.
    calls: BTreeMap<&'static str, usize>,
}

/// A scripted NVML; clones share the script.
#[derive(Clone, Default)]
struct Fake(Arc<Mutex<Script>>);

impl Fake {
    /// Makes call `key` fail with `e` (`None`: answer again).
    fn fail(&self, key: &'static str, e: Option<NvmlFailure>) {
        let mut s = self.0.lock().expect("script");
        match e {
            Some(e) => s.fails.insert(key, e),
            None => s.fails.remove(key),
        };
    }

    /// Makes field `id` fail with `e` (`None`: answer again).
    fn fail_field(&self, id: u32, e: Option<NvmlFailure>) {
        let mut s = self.0.lock().expect("script");
        match e {
            Some(e) => s.field_fails.insert(id, e),
            None => s.field_fails.remove(&id),
        };
    }

    /// How many times call `key` was made.
    fn calls(&self, key: &str) -> usize {
        let s = self.0.lock().expect("script");
        s.calls.get(key).copied().unwrap_or(0)
    }

    /// Call `key`'s answer: `v`, or the failure scripted for it.
    fn answer<T>(&self, key: &'static str, v: T) -> NvmlResult<T> {
        let mut s = self.0.lock().expect("script");
        *s.calls.entry(key).or_default() += 1;
        match s.fails.get(key) {
            Some(e) => Err(e.clone()),
            None => Ok(v),
        }
    }
}

/// The key of an ECC counter's call.
fn ecc_key(corrected: bool, volatile: bool) -> &'static str {
    match (corrected, volatile) {
        (true, true) => "ecc sbe volatile",
        (false, true) => "ecc dbe volatile",
        (true, false) => "ecc sbe aggregate",
        (false, false) => "ecc dbe aggregate",
    }
}

impl NvmlApi for Fake {
    fn device_count(&self) -> NvmlResult<u32> {
        Ok(1)
    }
    fn name(&self, _: u32) -> NvmlResult<String> {
        Ok("NVIDIA H200".into())
    }
    fn uuid(&self, gpu: u32) -> NvmlResult<String> {
        Ok(format!("GPU-{gpu}"))
    }
    fn default_limit_mw(&self, _: u32) -> NvmlResult<u32> {
        Ok(700_000)
    }
    fn limit_constraints_mw(&self, _: u32) -> NvmlResult<(u32, u32)> {
        Ok((200_000, 700_000))
    }
    fn limit_mw(&self, _: u32) -> NvmlResult<u32> {
        self.answer("limit", 700_000)
    }
    fn enforced_limit_mw(&self, _: u32) -> NvmlResult<u32> {
        self.answer("enforced limit", 650_000)
    }
    fn set_limit_mw(&self, _: u32, _: u32) -> NvmlResult<()> {
        Ok(())
    }
    fn persistence_mode(&self, _: u32) -> NvmlResult<bool> {
        Ok(true)
    }
    fn temperature(&self, _: u32) -> NvmlResult<u32> {
        self.answer("temperature", 61)
    }
    fn power_usage_mw(&self, _: u32) -> NvmlResult<u32> {
        self.answer("power", 312_600)
    }
    fn energy_mj(&self, _: u32) -> NvmlResult<u64> {
        self.answer("energy", 987_654_321)
    }
    fn clocks_mhz(&self, _: u32) -> NvmlResult<(u32, u32)> {
        self.answer("clocks", (1980, 2619))
    }
    fn utilization(&self, _: u32) -> NvmlResult<u32> {
        self.answer("util", 87)
    }
    fn throttle_bits(&self, _: u32) -> NvmlResult<u64> {
        self.answer("throttle", 0)
    }
    fn ecc_enabled(&self, _: u32) -> NvmlResult<bool> {
        self.answer("ecc mode", true)
    }
    fn ecc_total(&self, _: u32, corrected: bool, volatile: bool) -> NvmlResult<u64> {
        let v = match (corrected, volatile) {
            (true, true) => 11,
            (false, true) => 0,
            (true, false) => 1_234,
            (false, false) => 5,
        };
        self.answer(ecc_key(corrected, volatile), v)
    }
    fn fields(&self, _: u32, ids: &[u32]) -> NvmlResult<Vec<NvmlResult<u64>>> {
        self.answer("fields", ())?;
        let s = self.0.lock().expect("script");
        let value = |id: u32| match id {
            field::MEMORY_TEMP => Ok(74),
            field::PCIE_REPLAY_COUNTER => Ok(17),
            field::REMAPPED_COR => Ok(6),
            _ if field::link_of(id).is_some() => Err(NvmlFailure::NotSupported),
            _ => Ok(0),
        };
        let answer = |id: &u32| s.field_fails.get(id).cloned().map_or(value(*id), Err);
        Ok(ids.iter().map(answer).collect())
    }
    fn watch_xids(
        &self,
        _: &[u32],
        _: &mut dyn FnMut(u32, NvmlResult<()>),
        _: &mut dyn FnMut(u32, u64),
        _: &std::sync::atomic::AtomicBool,
    ) -> NvmlResult<()> {
        Err(NvmlFailure::NotSupported)
    }
}

/// Two GPUs, each on its own fake: GPU 0 scripted by the test, GPU 1
/// healthy, its witness.
fn two_gpus() -> (Fake, Vec<NvmlGpu<Fake>>) {
    let fake = Fake::default();
    let gpus = vec![
        NvmlGpu::new(Arc::new(fake.clone()), 0),
        NvmlGpu::new(Arc::new(Fake::default()), 1),
    ];
    (fake, gpus)
}

/// `rounds` rounds of every GPU sampled and fed to a health engine as
/// the agent feeds it; every sample, and the engine.
fn rounds(
    gpus: &mut [NvmlGpu<Fake>],
    n: u64,
) -> (Vec<Vec<Result<GpuSample, GpuError>>>, HealthEngine) {
    let limits = Limits {
        max_operating_c: 87.0,
    };
    let mut engine = HealthEngine::new(gpus.len(), limits, Policy::default(), TimestampMs(0));
    let mut all = Vec::new();
    for r in 1..=n {
        let now = TimestampMs(r * 1_000);
        let mut round = Vec::new();
        for (i, g) in gpus.iter_mut().enumerate() {
            let s = g.sample();
            match &s {
                Ok(s) => engine.sample(now, i as u8, &node_agent::shell::observation(s)),
                Err(_) => engine.missed(now, i as u8),
            };
            round.push(s);
        }
        all.push(round);
    }
    (all, engine)
}

#[test]
fn a_corrupted_inforom_on_the_aggregate_ecc_read_costs_only_the_aggregate_counts() {
    let _one = logs::one_at_a_time();
    let (fake, mut gpus) = two_gpus();
    for corrected in [true, false] {
        let e = NvmlFailure::Other(CORRUPTED_INFOROM.into());
        fake.fail(ecc_key(corrected, false), Some(e));
    }
    let ((samples, engine), log) = logged(|| rounds(&mut gpus, 8));
    for round in &samples {
        let s = round[0].as_ref().expect("a sample, not a miss");
        assert_eq!(s.temp, WholeCelsius(61), "the thermal guard sees it");
        assert_eq!(s.power, Watts(313));
        assert_eq!(s.power_limit, Watts(650));
        assert_eq!(s.unsupported, Unsupported::ECC_AGGREGATE);
        assert_eq!((s.ecc.sbe_aggregate, s.ecc.dbe_aggregate), (0, 0));
        assert_eq!(s.ecc.sbe_volatile, 11, "the volatile counts still judge");
        assert_eq!(s.pcie_replay, 17, "the other slow counters are read");
    }
    assert_eq!(
        fake.calls("ecc dbe aggregate"),
        8,
        "asked again at every read"
    );
    let status = engine.status(0).expect("GPU 0");
    assert_eq!(status.state, HealthState::Healthy, "{status:?}");
    // Said once per counter and error, with NVML's words.
    for counter in ["(corrected, aggregate)", "(uncorrected, aggregate)"] {
        let said = lines_with(&log, &["GPU 0", counter, CORRUPTED_INFOROM]);
        assert_eq!(said.len(), 1, "{log}");
        assert!(
            said[0].contains("ecc_aggregate reported as unsupported"),
            "{log}"
        );
    }
}

#[test]
fn a_lost_gpu_a_timeout_or_a_driver_gone_still_fail_the_sample() {
    let _one = logs::one_at_a_time();
    let gone = [
        (NvmlFailure::GpuLost, GpuError::Lost),
        (
            NvmlFailure::Timeout,
            GpuError::Failed {
                what: "nvmlDeviceGetTotalEccErrors",
                detail: "NVML timeout".into(),
            },
        ),
    ];
    let words = [
        "NVML was not first initialized with `Nvml::init()`",
        "NVIDIA driver is not loaded",
    ];
    let gone = gone.into_iter().chain(words.map(|w| {
        let e = GpuError::Failed {
            what: "nvmlDeviceGetTotalEccErrors",
            detail: w.into(),
        };
        (NvmlFailure::Other(w.into()), e)
    }));
    for (failure, error) in gone {
        let (fake, mut gpus) = two_gpus();
        fake.fail(ecc_key(false, false), Some(failure));
        let (samples, engine) = rounds(&mut gpus, 8);
        for round in &samples {
            assert_eq!(round[0], Err(error.clone()));
        }
        let status = engine.status(0).expect("GPU 0");
        assert_eq!(
            status.state,
            HealthState::Quarantined,
            "{error}: {status:?}"
        );
        assert_eq!(engine.status(1).expect("GPU 1").state, HealthState::Healthy);
    }
}

#[test]
fn a_slow_counter_that_failed_stays_unknown_until_its_next_read_and_a_fast_one_for_its_sample() {
    let _one = logs::one_at_a_time();
    let fake = Fake::default();
    let mut gpu = NvmlGpu::new(Arc::new(fake.clone()), 0).slow_every(3);
    fake.fail_field(
        field::REMAPPED_COR,
        Some(NvmlFailure::Other(NO_DATA.into())),
    );
    let s = gpu.sample().expect("a sample");
    assert_eq!(
        (s.unsupported, s.repair.remap_correctable),
        (Unsupported::REMAP, 0)
    );
    assert_eq!(s.pcie_replay, 17, "the rest of the query is read");
    fake.fail_field(field::REMAPPED_COR, None);
    for _ in 0..2 {
        let s = gpu.sample().expect("held");
        assert_eq!(
            s.unsupported,
            Unsupported::REMAP,
            "unknown, not held as read"
        );
    }
    let s = gpu.sample().expect("the next read");
    assert_eq!(
        (s.unsupported, s.repair.remap_correctable),
        (Unsupported::empty(), 6)
    );
    // The PCIe replay counter, read every sample: unknown in its own
    // sample only.
    let no_data = Some(NvmlFailure::Other(NO_DATA.into()));
    fake.fail_field(field::PCIE_REPLAY_COUNTER, no_data);
    assert_eq!(
        gpu.sample().expect("a sample").unsupported,
        Unsupported::PCIE
    );
    fake.fail_field(field::PCIE_REPLAY_COUNTER, None);
    let s = gpu.sample().expect("a sample");
    assert_eq!((s.unsupported, s.pcie_replay), (Unsupported::empty(), 17));
    // A fast read: unknown in its own sample only.
    fake.fail("clocks", Some(NvmlFailure::Other(NO_DATA.into())));
    let s = gpu.sample().expect("a sample");
    assert_eq!(s.unsupported, Unsupported::CLOCKS);
    assert_eq!((s.temp, s.util.get()), (WholeCelsius(61), 87));
    fake.fail("clocks", None);
    assert_eq!(
        gpu.sample().expect("a sample").unsupported,
        Unsupported::empty()
    );
}

#[test]
fn a_field_value_query_that_fails_on_its_data_costs_only_its_fields() {
    let _one = logs::one_at_a_time();
    let fake = Fake::default();
    let mut gpu = NvmlGpu::new(Arc::new(fake.clone()), 0).slow_every(100);
    gpu.sample().expect("the first sample");
    fake.fail("fields", Some(NvmlFailure::Other(NO_DATA.into())));
    let s = gpu.sample().expect("a sample");
    let fast = Unsupported::MEM_TEMP | Unsupported::NVLINK | Unsupported::PCIE;
    assert_eq!(s.unsupported, fast);
    assert_eq!((s.temp, s.power), (WholeCelsius(61), Watts(313)));
    assert_eq!(s.repair.remap_correctable, 6, "held from its read");
    // With the slow counters, every group it asked for.
    let mut gpu = NvmlGpu::new(Arc::new(fake.clone()), 0);
    let s = gpu.sample().expect("a sample");
    let asked = Unsupported::MEM_TEMP
        | Unsupported::NVLINK
        | Unsupported::RETIRED
        | Unsupported::REMAP
        | Unsupported::PCIE;
    assert_eq!(s.unsupported, asked);
}

#[test]
fn a_lost_energy_counter_is_sent_as_not_known_never_held_and_so_is_an_unread_limit() {
    let _one = logs::one_at_a_time();
    let fake = Fake::default();
    let mut gpu = NvmlGpu::new(Arc::new(fake.clone()), 0);
    assert_eq!(gpu.sample().expect("a sample").energy_mj, 987_654_321);
    fake.fail("energy", Some(NvmlFailure::NotSupported));
    for _ in 0..3 {
        let s = gpu.sample().expect("a sample");
        assert_eq!(s.energy_mj, 0, "not known, never the last value read");
    }
    fake.fail("energy", None);
    let s = gpu.sample().expect("asked again at the next read");
    assert_eq!(s.energy_mj, 987_654_321);
    // Neither limit call answers: 0 W, not known; the power still is.
    fake.fail("enforced limit", Some(NvmlFailure::NotSupported));
    fake.fail("limit", Some(NvmlFailure::NotSupported));
    let s = gpu.sample().expect("a sample");
    assert_eq!((s.power_limit, s.power), (Watts(0), Watts(313)));
}

/// The enforced limit that does not answer has the limit set stand in
/// for it (what the agent caps), marked so: never taken for the limit the
/// driver enforces (`DCGM_FI_DEV_ENFORCED_POWER_LIMIT`).
#[test]
fn the_limit_set_standing_in_for_an_unread_enforced_limit_is_marked() {
    let _one = logs::one_at_a_time();
    let fake = Fake::default();
    let mut gpu = NvmlGpu::new(Arc::new(fake.clone()), 0);
    let s = gpu.sample().expect("a sample");
    assert_eq!((s.power_limit, s.enforced_unread), (Watts(650), false));
    for e in [
        NvmlFailure::NotSupported,
        NvmlFailure::Other(NO_DATA.into()),
    ] {
        fake.fail("enforced limit", Some(e.clone()));
        let s = gpu.sample().expect("a sample");
        assert_eq!(
            (s.power_limit, s.enforced_unread),
            (Watts(700), true),
            "{e:?}: the limit set, marked"
        );
    }
    fake.fail("enforced limit", None);
    let s = gpu.sample().expect("asked again");
    assert_eq!((s.power_limit, s.enforced_unread), (Watts(650), false));
}

/// NVML's words for `NVML_ERROR_UNKNOWN`.
const UNKNOWN_ERROR: &str = "an internal driver error occurred";

#[test]
fn an_ecc_mode_read_again_is_never_sent_with_volatile_counts_not_read_under_it() {
    let _one = logs::one_at_a_time();
    let fake = Fake::default();
    let mut gpu = NvmlGpu::new(Arc::new(fake.clone()), 0).slow_every(3);
    fake.fail("ecc mode", Some(NvmlFailure::Other(UNKNOWN_ERROR.into())));
    let s = gpu.sample().expect("a sample");
    assert!(s.unsupported.contains(Unsupported::ECC), "{s:?}");
    fake.fail("ecc mode", None);
    // The mode answers again at the next read of the slow counters: from
    // then on the counts are the GPU's, never 0 sent as read.
    let mut last = s;
    for n in 2..=8 {
        let s = gpu.sample().expect("a sample");
        assert!(
            s.unsupported.contains(Unsupported::ECC) || s.ecc.sbe_volatile == 11,
            "sample {n}: {s:?}"
        );
        last = s;
    }
    assert_eq!(last.ecc.sbe_volatile, 11, "known again: {last:?}");
    assert!(!last.unsupported.contains(Unsupported::ECC));
}
