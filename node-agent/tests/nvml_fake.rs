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
//!   reaches the health rules through the volatile count;
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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use loopwarden_protocol::{
    EccCounts, GpuFlags, MegaHertz, MemoryRepair, NvlinkErrors, Percent, ThrottleReasons,
    Unsupported, Watts, WholeCelsius,
};
use node_agent::gpu::{GpuDevice, GpuError, GpuInfo, GpuSample, GpuSource, XidEvent, XidReport};
use node_agent::nvml::{throttle_from_nvml, NvmlApi, NvmlFailure, NvmlGpu, NvmlResult, NvmlSource};
use node_agent::worker::{Answer, Worker};
use NvmlFailure::{GpuLost, InvalidArgument, NoPermission, NotSupported};

mod logs;
use logs::{lines_with, logged};

/// `nvmlDeviceGetFieldValues` ids, as the agent asks for them.
mod fi {
    pub use node_agent::nvml::field::*;
    /// The NVLink totals.
    pub const NVLINK: [u32; 3] = [
        NVLINK_CRC_DATA_TOTAL,
        NVLINK_REPLAY_TOTAL,
        NVLINK_RECOVERY_TOTAL,
    ];
}

/// NVML function names, as the fake counts calls (and as `GpuError::Failed`
/// names them).
const GET_TEMPERATURE: &str = "nvmlDeviceGetTemperature";
const GET_POWER_USAGE: &str = "nvmlDeviceGetPowerUsage";
const GET_ENFORCED_LIMIT: &str = "nvmlDeviceGetEnforcedPowerLimit";
const GET_LIMIT: &str = "nvmlDeviceGetPowerManagementLimit";
const SET_LIMIT: &str = "nvmlDeviceSetPowerManagementLimit";
const GET_ECC_MODE: &str = "nvmlDeviceGetEccMode";
const GET_ECC_TOTAL: &str = "nvmlDeviceGetTotalEccErrors";
const GET_FIELD_VALUES: &str = "nvmlDeviceGetFieldValues";

/// How long a fake call waits for the test at most (a hang released, a
/// stop set), so a failing test ends instead of hanging.
const SAFETY: Duration = Duration::from_secs(10);

/// What one fake GPU answers, per NVML call.
#[derive(Debug, Clone)]
struct Answers {
    name: NvmlResult<String>,
    uuid: NvmlResult<String>,
    default_limit_mw: NvmlResult<u32>,
    constraints_mw: NvmlResult<(u32, u32)>,
    /// The management limit: `set_limit_mw` writes it, `limit_mw` reads it.
    limit_mw: NvmlResult<u32>,
    /// When `Some`, `set_limit_mw` fails with it and changes nothing.
    set_limit_fails: Option<NvmlFailure>,
    enforced_limit_mw: NvmlResult<u32>,
    temperature: NvmlResult<u32>,
    /// The temperature call blocks while the fake's gate is closed.
    temperature_hangs: bool,
    power_mw: NvmlResult<u32>,
    energy_mj: NvmlResult<u64>,
    clocks_mhz: NvmlResult<(u32, u32)>,
    utilization: NvmlResult<u32>,
    throttle_bits: NvmlResult<u64>,
    ecc_enabled: NvmlResult<bool>,
    /// Keyed by `(corrected, volatile)`.
    ecc_total: BTreeMap<(bool, bool), NvmlResult<u64>>,
    /// `Err` fails the whole field-values call.
    fields_call: NvmlResult<()>,
    /// Per field id; an id not here answers NotSupported.
    fields: BTreeMap<u32, NvmlResult<u64>>,
    /// The field-values call answers one field fewer than it was asked.
    fields_short: bool,
    /// The answer to registering this GPU for XID events.
    xid_registration: NvmlResult<()>,
}

impl Answers {
    /// An H200 answering everything, every value distinct so a mix-up of
    /// two fields shows.
    fn healthy() -> Self {
        Self {
            name: Ok("NVIDIA H200".into()),
            uuid: Ok("GPU-0c1d2e3f-0000-4000-8000-000000000000".into()),
            default_limit_mw: Ok(700_000),
            constraints_mw: Ok((200_000, 725_000)),
            limit_mw: Ok(700_000),
            set_limit_fails: None,
            enforced_limit_mw: Ok(650_000),
            temperature: Ok(61),
            temperature_hangs: false,
            power_mw: Ok(312_600),
            energy_mj: Ok(987_654_321),
            clocks_mhz: Ok((1980, 2619)),
            utilization: Ok(87),
            throttle_bits: Ok(0x4 | 0x40),
            ecc_enabled: Ok(true),
            ecc_total: [
                ((true, true), Ok(11)),
                ((false, true), Ok(2)),
                ((true, false), Ok(1_234)),
                ((false, false), Ok(5)),
            ]
            .into_iter()
            .collect(),
            fields_call: Ok(()),
            fields: [
                (fi::MEMORY_TEMP, 74),
                (fi::RETIRED_SBE, 3),
                (fi::RETIRED_DBE, 1),
                (fi::RETIRED_PENDING, 1),
                (fi::REMAPPED_COR, 6),
                (fi::REMAPPED_UNC, 4),
                (fi::REMAPPED_PENDING, 0),
                (fi::REMAPPED_FAILURE, 1),
                (fi::PCIE_REPLAY_COUNTER, 17),
                (fi::NVLINK_CRC_DATA_TOTAL, 101),
                (fi::NVLINK_REPLAY_TOTAL, 102),
                (fi::NVLINK_RECOVERY_TOTAL, 103),
                (fi::RECOVERY_ACTION, 0),
            ]
            .into_iter()
            .map(|(id, v)| (id, Ok(v)))
            .collect(),
            fields_short: false,
            xid_registration: Ok(()),
        }
    }
}

/// Scripted NVML. Cloning shares the script, so a test keeps a handle on
/// the fake it handed to the agent.
#[derive(Clone)]
struct FakeNvml(Arc<Inner>);

struct Inner {
    state: Mutex<State>,
    /// Closed: hanging calls block. Guarded flag plus its condition.
    gate_closed: Mutex<bool>,
    gate: Condvar,
}

struct State {
    gpus: Vec<Answers>,
    /// Every call made, as (GPU, NVML function).
    calls: Vec<(u32, &'static str)>,
    /// The ids asked in each field-values call, per GPU.
    field_requests: Vec<(u32, Vec<u32>)>,
    /// XID events `watch_xids` delivers once it has registered the GPUs.
    xids: Vec<(u32, u64)>,
    /// The GPUs `watch_xids` was asked to register.
    watched: Vec<u32>,
    /// `watch_xids` returned because `stop` was set.
    watch_ended: bool,
    /// While set, a running XID wait returns with it and a new one fails
    /// at once (a driver reload, an event set that broke).
    watch_fails: Option<NvmlFailure>,
    /// XID waits begun.
    watch_starts: u32,
    /// While set, `device_count` fails with it (a driver not ready yet).
    count_fails: Option<NvmlFailure>,
    /// The XID registration answers wait at the gate (a busy GPU System
    /// Processor at boot).
    registration_hangs: bool,
}

impl FakeNvml {
    fn new(gpus: Vec<Answers>) -> Self {
        Self(Arc::new(Inner {
            state: Mutex::new(State {
                gpus,
                calls: Vec::new(),
                field_requests: Vec::new(),
                xids: Vec::new(),
                watched: Vec::new(),
                watch_ended: false,
                watch_fails: None,
                watch_starts: 0,
                count_fails: None,
                registration_hangs: false,
            }),
            gate_closed: Mutex::new(false),
            gate: Condvar::new(),
        }))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().expect("fake state")
    }

    /// Changes GPU `gpu`'s answers.
    fn set(&self, gpu: u32, change: impl FnOnce(&mut Answers)) {
        change(&mut self.state().gpus[gpu as usize]);
    }

    /// GPU `gpu`'s answers now.
    fn answers(&self, gpu: u32) -> Answers {
        self.state().gpus[gpu as usize].clone()
    }

    /// How many times `call` was made for GPU `gpu`.
    fn calls(&self, gpu: u32, call: &str) -> usize {
        let state = self.state();
        state
            .calls
            .iter()
            .filter(|(g, c)| *g == gpu && *c == call)
            .count()
    }

    /// The ids of each field-values call for GPU `gpu`, in order.
    fn field_requests(&self, gpu: u32) -> Vec<Vec<u32>> {
        let state = self.state();
        let requests = state.field_requests.iter().filter(|(g, _)| *g == gpu);
        requests.map(|(_, ids)| ids.clone()).collect()
    }

    fn set_gate(&self, closed: bool) {
        *self.0.gate_closed.lock().expect("gate") = closed;
        self.0.gate.notify_all();
    }

    /// Blocks while the gate is closed (at most [`SAFETY`]).
    fn wait_at_gate(&self) {
        let closed = self.0.gate_closed.lock().expect("gate");
        let _ = self
            .0
            .gate
            .wait_timeout_while(closed, SAFETY, |closed| *closed);
    }

    /// Records the call and answers it from GPU `gpu`'s script; an unknown
    /// GPU is an invalid argument, as in NVML.
    fn answer<T>(
        &self,
        gpu: u32,
        call: &'static str,
        pick: impl FnOnce(&Answers) -> NvmlResult<T>,
    ) -> NvmlResult<T> {
        let mut state = self.state();
        state.calls.push((gpu, call));
        state
            .gpus
            .get(gpu as usize)
            .map_or(Err(InvalidArgument), pick)
    }
}

impl NvmlApi for FakeNvml {
    fn device_count(&self) -> NvmlResult<u32> {
        let state = self.state();
        match state.count_fails.clone() {
            Some(e) => Err(e),
            None => Ok(state.gpus.len() as u32),
        }
    }
    fn name(&self, gpu: u32) -> NvmlResult<String> {
        self.answer(gpu, "nvmlDeviceGetName", |a| a.name.clone())
    }
    fn uuid(&self, gpu: u32) -> NvmlResult<String> {
        self.answer(gpu, "nvmlDeviceGetUUID", |a| a.uuid.clone())
    }
    fn default_limit_mw(&self, gpu: u32) -> NvmlResult<u32> {
        self.answer(gpu, "nvmlDeviceGetPowerManagementDefaultLimit", |a| {
            a.default_limit_mw.clone()
        })
    }
    fn limit_constraints_mw(&self, gpu: u32) -> NvmlResult<(u32, u32)> {
        self.answer(gpu, "nvmlDeviceGetPowerManagementLimitConstraints", |a| {
            a.constraints_mw.clone()
        })
    }
    fn limit_mw(&self, gpu: u32) -> NvmlResult<u32> {
        self.answer(gpu, GET_LIMIT, |a| a.limit_mw.clone())
    }
    fn enforced_limit_mw(&self, gpu: u32) -> NvmlResult<u32> {
        self.answer(gpu, GET_ENFORCED_LIMIT, |a| a.enforced_limit_mw.clone())
    }
    fn set_limit_mw(&self, gpu: u32, mw: u32) -> NvmlResult<()> {
        let mut state = self.state();
        state.calls.push((gpu, SET_LIMIT));
        let answers = state.gpus.get_mut(gpu as usize).ok_or(InvalidArgument)?;
        match answers.set_limit_fails.clone() {
            Some(failure) => Err(failure),
            None => {
                answers.limit_mw = Ok(mw);
                Ok(())
            }
        }
    }
    fn temperature(&self, gpu: u32) -> NvmlResult<u32> {
        let (answer, hangs) = self.answer(gpu, GET_TEMPERATURE, |a| {
            Ok((a.temperature.clone(), a.temperature_hangs))
        })?;
        // Hang outside the state lock: the other GPUs must still answer.
        if hangs {
            self.wait_at_gate();
        }
        answer
    }
    fn power_usage_mw(&self, gpu: u32) -> NvmlResult<u32> {
        self.answer(gpu, GET_POWER_USAGE, |a| a.power_mw.clone())
    }
    fn energy_mj(&self, gpu: u32) -> NvmlResult<u64> {
        self.answer(gpu, "nvmlDeviceGetTotalEnergyConsumption", |a| {
            a.energy_mj.clone()
        })
    }
    fn clocks_mhz(&self, gpu: u32) -> NvmlResult<(u32, u32)> {
        self.answer(gpu, "nvmlDeviceGetClockInfo", |a| a.clocks_mhz.clone())
    }
    fn utilization(&self, gpu: u32) -> NvmlResult<u32> {
        self.answer(gpu, "nvmlDeviceGetUtilizationRates", |a| {
            a.utilization.clone()
        })
    }
    fn throttle_bits(&self, gpu: u32) -> NvmlResult<u64> {
        self.answer(gpu, "nvmlDeviceGetCurrentClocksThrottleReasons", |a| {
            a.throttle_bits.clone()
        })
    }
    fn ecc_enabled(&self, gpu: u32) -> NvmlResult<bool> {
        self.answer(gpu, GET_ECC_MODE, |a| a.ecc_enabled.clone())
    }
    fn ecc_total(&self, gpu: u32, corrected: bool, volatile: bool) -> NvmlResult<u64> {
        self.answer(gpu, GET_ECC_TOTAL, |a| {
            let answer = a.ecc_total.get(&(corrected, volatile));
            answer.cloned().unwrap_or(Err(NotSupported))
        })
    }
    fn fields(&self, gpu: u32, ids: &[u32]) -> NvmlResult<Vec<NvmlResult<u64>>> {
        self.state().field_requests.push((gpu, ids.to_vec()));
        self.answer(gpu, GET_FIELD_VALUES, |a| {
            a.fields_call.clone()?;
            let answer = |id| a.fields.get(id).cloned().unwrap_or(Err(NotSupported));
            let asked = ids.len() - usize::from(a.fields_short && !ids.is_empty());
            Ok(ids[..asked].iter().map(answer).collect())
        })
    }
    fn watch_xids(
        &self,
        gpus: &[u32],
        registered: &mut dyn FnMut(u32, NvmlResult<()>),
        deliver: &mut dyn FnMut(u32, u64),
        stop: &AtomicBool,
    ) -> NvmlResult<()> {
        // Answer outside the state lock, as NVML would call back.
        let (registrations, xids, hangs) = {
            let mut state = self.state();
            state.watch_starts += 1;
            if let Some(e) = state.watch_fails.clone() {
                return Err(e);
            }
            state.watched = gpus.to_vec();
            let registration = |&gpu: &u32| {
                let answers = state.gpus.get(gpu as usize);
                (
                    gpu,
                    answers.map_or(Err(InvalidArgument), |a| a.xid_registration.clone()),
                )
            };
            let registrations: Vec<_> = gpus.iter().map(registration).collect();
            (registrations, state.xids.clone(), state.registration_hangs)
        };
        if hangs {
            self.wait_at_gate();
        }
        for (gpu, answer) in registrations {
            registered(gpu, answer);
        }
        for (gpu, xid) in xids {
            deliver(gpu, xid);
        }
        let give_up = Instant::now() + SAFETY;
        while !stop.load(Ordering::Relaxed) {
            if Instant::now() > give_up {
                return Err(NvmlFailure::Other("stop was never set".into()));
            }
            if let Some(e) = self.state().watch_fails.clone() {
                return Err(e);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.state().watch_ended = true;
        Ok(())
    }
}

/// One fake GPU (index 0) and the agent's device over it.
fn one_gpu(answers: Answers) -> (FakeNvml, NvmlGpu<FakeNvml>) {
    let fake = FakeNvml::new(vec![answers]);
    let gpu = NvmlGpu::new(Arc::new(fake.clone()), 0);
    (fake, gpu)
}

/// Polls `done` every few milliseconds for at most `limit`.
fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

// --- 1. A healthy GPU ---------------------------------------------------

#[test]
fn healthy_gpu_sample_maps_every_field() {
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
    };
    assert_eq!(sample, expected);
}

/// The recovery action the driver names is read with the slow counters
/// (and at once after an XID), held between reads and through a read
/// that fails, and not known (`None`) on a driver without it.
#[test]
fn the_recovery_action_is_read_with_the_slow_counters_and_held() {
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
        Unsupported::empty(),
        "ECC off is not ECC unsupported"
    );
    assert_eq!(
        fake.calls(0, GET_ECC_TOTAL),
        0,
        "no ECC counters asked with ECC off"
    );
}

#[test]
fn describe_maps_identity_and_limits_per_gpu() {
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
        })
    );
}

// --- 2. Not supported: recorded once, not an error every sample ----------

#[test]
fn unsupported_fields_are_recorded_once_and_not_asked_again() {
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

/// NVML's answer `failure` to the call `what`.
fn nvml(what: &'static str, failure: NvmlFailure) -> GpuError {
    GpuError::Nvml { what, failure }
}

/// A GPU whose die temperature NVML does not support, and one whose
/// enforced limit it reads as an invalid argument: each error names the
/// call with NVML's answer, and says nothing of a range or of root.
#[test]
fn an_nvml_refusal_names_the_call_and_nvmls_answer() {
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

fn failed(what: &'static str, detail: &str) -> GpuError {
    GpuError::Failed {
        what,
        detail: detail.into(),
    }
}

#[test]
fn failures_other_than_not_supported_fail_the_sample() {
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

// --- 5. A hanging call ------------------------------------------------------

/// Opens the fake's gate when dropped, so a hung worker thread ends even
/// when an assertion fails first.
struct OpenOnDrop(FakeNvml);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.set_gate(false);
    }
}

/// One sample through `worker`, and how long it took.
async fn timed_sample(worker: &Worker, deadline: Duration) -> (Answer, Duration) {
    let start = Instant::now();
    let result = worker.sample(deadline).await;
    (result, start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_gpu_times_out_alone_and_answers_once_released() {
    const DEADLINE: Duration = Duration::from_millis(100);
    /// Far under the hang (which lasts until released, at most SAFETY).
    const BOUND: Duration = Duration::from_secs(2);

    let mut hanging = Answers::healthy();
    hanging.temperature = Ok(70);
    hanging.temperature_hangs = true;
    let fake = FakeNvml::new(vec![Answers::healthy(), hanging, Answers::healthy()]);
    fake.set_gate(true);
    let release = OpenOnDrop(fake.clone());
    let api = Arc::new(fake.clone());
    let workers: Vec<Worker> = (0..3u8)
        .map(|i| {
            let device = NvmlGpu::new(api.clone(), u32::from(i));
            Worker::spawn(i, Box::new(device)).expect("worker thread")
        })
        .collect();
    assert_eq!(workers[1].index(), 1);

    // Round 1: GPU 1 hangs in NVML past its deadline: not answered yet,
    // not a miss; 0 and 2 answer.
    let ((r0, _), (r1, t1), (r2, _)) = tokio::join!(
        timed_sample(&workers[0], DEADLINE),
        timed_sample(&workers[1], DEADLINE),
        timed_sample(&workers[2], DEADLINE),
    );
    assert_eq!(now_ok(r0).temp, WholeCelsius(61));
    assert_eq!(now_ok(r2).temp, WholeCelsius(61));
    assert!(matches!(r1, Answer::Pending), "{r1:?}");
    assert!(
        t1 >= DEADLINE,
        "GPU 1 gave up after {t1:?}, before its deadline"
    );
    assert!(t1 < BOUND, "GPU 1 took {t1:?} to give up");

    // Round 2, straight after, still stuck: no answer within a whole round
    // is a miss, at once, without a second NVML call queued behind the
    // first; 0 and 2 still answer.
    assert!(workers[1].is_stuck(DEADLINE));
    assert!(!workers[0].is_stuck(DEADLINE));
    let ((r0, _), (r1, t1), (r2, _)) = tokio::join!(
        timed_sample(&workers[0], DEADLINE),
        timed_sample(&workers[1], DEADLINE),
        timed_sample(&workers[2], DEADLINE),
    );
    now_ok(r0);
    now_ok(r2);
    assert!(matches!(r1, Answer::Now(Err(GpuError::Timeout))), "{r1:?}");
    assert!(t1 < DEADLINE, "a stuck GPU must fail at once, took {t1:?}");
    assert_eq!(fake.calls(1, GET_TEMPERATURE), 1);
    assert_eq!(fake.calls(0, GET_TEMPERATURE), 2);

    // Released: the stuck call returns; its answer is the next round's,
    // without a new call; the round after asks again.
    drop(release);
    assert!(eventually(BOUND, || !workers[1].is_stuck(DEADLINE)));
    match workers[1].sample(DEADLINE).await {
        Answer::Late(Ok(s)) => assert_eq!(s.temp, WholeCelsius(70)),
        other => panic!("the late answer: {other:?}"),
    }
    assert_eq!(fake.calls(1, GET_TEMPERATURE), 1);
    assert_eq!(
        now_ok(workers[1].sample(DEADLINE).await).temp,
        WholeCelsius(70)
    );
    assert_eq!(fake.calls(1, GET_TEMPERATURE), 2);
    assert_eq!(workers[1].call_times().late, 1);
}

/// A sample answered within its deadline.
fn now_ok(a: Answer) -> GpuSample {
    match a {
        Answer::Now(Ok(s)) => s,
        other => panic!("expected an answer within the deadline: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_answer_is_not_a_missed_one() {
    // A busy GSP: GPU 0's calls take longer than the deadline but less
    // than a period. Every answer is used, a round later; none is a miss.
    const DEADLINE: Duration = Duration::from_millis(50);
    let mut slow = Answers::healthy();
    slow.temperature_hangs = true;
    let fake = FakeNvml::new(vec![slow]);
    let _release = OpenOnDrop(fake.clone());
    let api = Arc::new(fake.clone());
    let w = Worker::spawn(0, Box::new(NvmlGpu::new(api, 0))).expect("worker thread");
    let mut samples = 0;
    for round in 0..6 {
        fake.set_gate(true);
        let a = w.sample(DEADLINE).await;
        // The GPU answers 100 ms after it was asked, inside the period.
        tokio::time::sleep(Duration::from_millis(100)).await;
        fake.set_gate(false);
        tokio::time::sleep(Duration::from_millis(100)).await;
        match a {
            Answer::Pending if round % 2 == 0 => {}
            Answer::Late(Ok(_)) if round % 2 == 1 => samples += 1,
            other => panic!("round {round}: {other:?}"),
        }
    }
    assert_eq!(samples, 3, "every slow answer used");
    assert_eq!(w.call_times().late, 3);
    assert!(w.call_times().max_us >= 100_000, "{:?}", w.call_times());
}

/// One sampling round as the agent runs it: every worker sampled at once,
/// each answer or miss fed to `engine` in index order at one time.
async fn round_into(
    workers: &[Worker],
    engine: &mut node_core::health::HealthEngine,
    t_ms: u64,
) -> Vec<node_core::health::Output> {
    let deadline = Duration::from_millis(50);
    let results = futures::future::join_all(workers.iter().map(|w| w.sample(deadline))).await;
    let now = loopwarden_protocol::TimestampMs(t_ms);
    let mut outs = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        outs.extend(match r {
            Answer::Now(Ok(s)) | Answer::Late(Ok(s)) => {
                engine.sample(now, i as u8, &node_agent::shell::observation(&s))
            }
            Answer::Now(Err(_)) | Answer::Late(Err(_)) => engine.missed(now, i as u8),
            Answer::Pending => Vec::new(),
        });
    }
    outs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_stall_of_six_rounds_quarantines_no_gpu_and_one_left_hung_is() {
    use loopwarden_protocol::HealthState;
    use node_core::health::{HealthEngine, Limits, Output, Policy};

    let mut hanging = Answers::healthy();
    hanging.temperature_hangs = true;
    // No errors, flags or link counters: nothing but the stall to judge.
    hanging.ecc_total.insert((false, true), Ok(0));
    hanging.fields = [(fi::MEMORY_TEMP, Ok(70))].into_iter().collect();
    let fake = FakeNvml::new(vec![hanging.clone(); 4]);
    let _release = OpenOnDrop(fake.clone());
    let api = Arc::new(fake.clone());
    let workers: Vec<Worker> = (0..4u8)
        .map(|i| Worker::spawn(i, Box::new(NvmlGpu::new(api.clone(), u32::from(i)))).unwrap())
        .collect();
    let limits = Limits {
        max_operating_c: 87.0,
    };
    let mut engine = HealthEngine::new(
        4,
        limits,
        Policy::default(),
        loopwarden_protocol::TimestampMs(0),
    );
    let mut outs = Vec::new();
    // A round with every GPU answering, then six with every call hung.
    outs.extend(round_into(&workers, &mut engine, 1_000).await);
    fake.set_gate(true);
    for r in 2..8 {
        outs.extend(round_into(&workers, &mut engine, r * 1_000).await);
    }
    let state = |e: &HealthEngine, g: u8| e.status(g).unwrap().state;
    assert!(
        (0..4).all(|g| state(&engine, g) == HealthState::Healthy),
        "{outs:?}"
    );
    assert!(engine.stalled_since().is_some(), "a host stall: {outs:?}");
    // The driver comes back for GPUs 0, 1 and 3; GPU 2 stays hung.
    for g in [0, 1, 3] {
        fake.set(g, |a| a.temperature_hangs = false);
    }
    fake.set_gate(false);
    assert!(eventually(Duration::from_secs(5), || {
        workers
            .iter()
            .all(|w| !w.is_stuck(Duration::from_millis(50)))
    }));
    fake.set_gate(true);
    for r in 8..13 {
        outs.extend(round_into(&workers, &mut engine, r * 1_000).await);
    }
    assert_eq!(engine.stalled_since(), None);
    assert!(outs
        .iter()
        .any(|o| matches!(o, Output::HostStallEnded { .. })));
    assert_eq!(state(&engine, 2), HealthState::Quarantined, "{outs:?}");
    for g in [0, 1, 3] {
        assert_eq!(state(&engine, g), HealthState::Healthy);
    }
}

// --- Partly supported groups -------------------------------------------

#[test]
fn an_unsupported_enforced_limit_hides_neither_power_nor_the_limit() {
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

// --- 6. XID events ----------------------------------------------------------

#[test]
fn xid_events_reach_the_agent_and_refused_gpus_are_reported() {
    let mut refusing = Answers::healthy();
    refusing.xid_registration = Err(NotSupported);
    let fake = FakeNvml::new(vec![Answers::healthy(), refusing, Answers::healthy()]);
    fake.state().xids = vec![(0, 79), (2, 48), (0, 94)];

    let mut source = NvmlSource::new(fake.clone());
    let (sink, events) = node_agent::xid_queue::xid_queue(64);
    let refused = source.watch_xids(sink).expect("the XID watch starts");
    assert_eq!(
        refused,
        vec![(1, nvml("nvmlDeviceRegisterEvents", NotSupported))]
    );
    assert_eq!(fake.state().watched, vec![0, 1, 2]);

    let timeout = Duration::from_secs(2);
    let received: Vec<XidEvent> = (0..4)
        .map(|_| events.recv_timeout(timeout).expect("an XID report"))
        .collect();
    // GPU 1's XIDs are not seen: the watch is said down, naming it,
    // and the other GPUs' XIDs still come.
    match &received[0] {
        XidEvent::WatchDown(why) => assert!(why.contains("GPU 1"), "{why}"),
        other => panic!("expected the watch down first, got {other:?}"),
    }
    assert_eq!(
        received[1..],
        vec![
            XidEvent::Xid(XidReport { gpu: 0, xid: 79 }),
            XidEvent::Xid(XidReport { gpu: 2, xid: 48 }),
            XidEvent::Xid(XidReport { gpu: 0, xid: 94 }),
        ]
    );
    assert!(
        !fake.state().watch_ended,
        "the watch runs until the source goes"
    );

    // Dropping the source stops the watch; its thread ends, and nothing
    // more arrives.
    drop(source);
    assert!(eventually(timeout, || fake.state().watch_ended));
    assert_eq!(events.recv_timeout(Duration::from_millis(100)), None);
}

#[test]
fn a_watch_that_ends_is_said_and_restarted_with_backoff() {
    let fake = FakeNvml::new(vec![Answers::healthy(); 2]);
    let mut source = NvmlSource::new(fake.clone());
    let (sink, events) = node_agent::xid_queue::xid_queue(64);
    source.watch_xids(sink).expect("the XID watch starts");
    // The driver goes away: the wait ends, and restarts fail for a while.
    fake.state().watch_fails = Some(NvmlFailure::Other("driver reloading".into()));
    let timeout = Duration::from_secs(5);
    match events.recv_timeout(timeout) {
        Some(XidEvent::WatchDown(why)) => assert!(why.contains("driver reloading"), "{why}"),
        other => panic!("expected the watch down, got {other:?}"),
    }
    // The first restart comes after 1 s and fails too: said again.
    assert!(matches!(
        events.recv_timeout(timeout),
        Some(XidEvent::WatchDown(_))
    ));
    // The driver is back: the next restart (2 s later) registers again.
    fake.state().watch_fails = None;
    assert_eq!(events.recv_timeout(timeout), Some(XidEvent::WatchUp));
    assert!(fake.state().watch_starts >= 3);
    fake.state().xids = vec![];
    drop(source);
    assert!(eventually(timeout, || fake.state().watch_ended));
}

#[test]
fn a_gpu_count_that_fails_at_the_start_is_said_down_and_retried() {
    let fake = FakeNvml::new(vec![Answers::healthy(); 2]);
    fake.state().count_fails = Some(NvmlFailure::Other("driver not ready".into()));
    let mut source = NvmlSource::new(fake.clone());
    let (sink, events) = node_agent::xid_queue::xid_queue(64);
    let refused = source.watch_xids(sink).expect("the watch runs, said down");
    assert_eq!(refused, vec![]);
    let timeout = Duration::from_secs(5);
    match events.recv_timeout(timeout) {
        Some(XidEvent::WatchDown(why)) => {
            assert!(why.contains("nvmlDeviceGetCount"), "{why}");
            assert!(why.contains("driver not ready"), "{why}");
        }
        other => panic!("expected the watch down, got {other:?}"),
    }
    // The driver is ready: a restart counts the GPUs and registers them
    // (a restart before this line is said down again).
    fake.state().count_fails = None;
    let next = (0..3).find_map(|_| match events.recv_timeout(timeout) {
        Some(XidEvent::WatchDown(_)) => None,
        other => Some(other),
    });
    assert_eq!(next, Some(Some(XidEvent::WatchUp)));
    assert_eq!(fake.state().watched, vec![0, 1]);
    drop(source);
    assert!(eventually(timeout, || fake.state().watch_ended));
}

#[test]
fn registration_answers_slower_than_the_wait_are_said_down_then_up() {
    let fake = FakeNvml::new(vec![Answers::healthy(); 2]);
    fake.state().registration_hangs = true;
    fake.state().xids = vec![(1, 79)];
    fake.set_gate(true);
    let mut source = NvmlSource::new(fake.clone()).first_answers_wait(Duration::ZERO);
    let (sink, events) = node_agent::xid_queue::xid_queue(64);
    let refused = source.watch_xids(sink).expect("the watch runs, said down");
    assert_eq!(refused, vec![]);
    match events.try_recv() {
        Some(XidEvent::WatchDown(why)) => assert!(why.contains("did not come"), "{why}"),
        other => panic!("expected the watch down at once, got {other:?}"),
    }
    // The answers come: every GPU registered, the watch is up.
    fake.set_gate(false);
    let timeout = Duration::from_secs(5);
    assert_eq!(events.recv_timeout(timeout), Some(XidEvent::WatchUp));
    assert_eq!(
        events.recv_timeout(timeout),
        Some(XidEvent::Xid(XidReport { gpu: 1, xid: 79 }))
    );
    assert_eq!(
        fake.state().watch_starts,
        1,
        "the first start, not a restart"
    );
    drop(source);
    assert!(eventually(timeout, || fake.state().watch_ended));
}

#[test]
fn a_gpu_refused_for_a_reason_that_may_pass_is_asked_again_until_the_watch_is_up() {
    let mut refusing = Answers::healthy();
    refusing.xid_registration = Err(NvmlFailure::Other("Unknown Error".into()));
    let fake = FakeNvml::new(vec![Answers::healthy(), refusing]);
    let mut source = NvmlSource::new(fake.clone());
    let (sink, events) = node_agent::xid_queue::xid_queue(64);
    let refused = source.watch_xids(sink).expect("the XID watch starts");
    let unknown = failed("nvmlDeviceRegisterEvents", "Unknown Error");
    assert_eq!(refused, vec![(1, unknown)]);
    let timeout = Duration::from_secs(5);
    match events.recv_timeout(timeout) {
        Some(XidEvent::WatchDown(why)) => assert!(why.contains("GPU 1"), "{why}"),
        other => panic!("expected the watch down, got {other:?}"),
    }
    // The GPU System Processor is ready: the wait ends after the backoff
    // (1 s) and a new start registers GPU 1 (a start before this line is
    // said down again).
    fake.set(1, |a| a.xid_registration = Ok(()));
    fake.state().xids = vec![(1, 79)];
    let up = (0..4).find_map(|_| match events.recv_timeout(timeout) {
        Some(XidEvent::WatchDown(_) | XidEvent::Xid(_)) => None,
        other => Some(other),
    });
    assert_eq!(up, Some(Some(XidEvent::WatchUp)));
    assert!(fake.state().watch_starts >= 2, "the watch started again");
    // GPU 1's XIDs are seen now.
    let xid = XidEvent::Xid(XidReport { gpu: 1, xid: 79 });
    assert_eq!(events.recv_timeout(timeout), Some(xid));
    // Every GPU registered: the watch runs on, and is not started again.
    let starts = fake.state().watch_starts;
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(fake.state().watch_starts, starts);
    drop(source);
    assert!(eventually(timeout, || fake.state().watch_ended));
}

/// A GPU refused alike at every retry (one fallen off the bus) is asked
/// again, but the watch is said down once, not at every retry: the event
/// log keeps the incident, not a line a minute.
#[test]
fn a_gpu_refused_alike_at_each_retry_is_said_down_once() {
    let mut refusing = Answers::healthy();
    refusing.xid_registration = Err(NvmlFailure::GpuLost);
    let fake = FakeNvml::new(vec![Answers::healthy(), refusing]);
    let mut source = NvmlSource::new(fake.clone());
    let (sink, events) = node_agent::xid_queue::xid_queue(64);
    source.watch_xids(sink).expect("the XID watch starts");
    assert!(matches!(
        events.recv_timeout(Duration::from_secs(5)),
        Some(XidEvent::WatchDown(_))
    ));
    // Retries after 1 s and 2 s more: asked again, nothing said again.
    assert!(eventually(Duration::from_secs(10), || fake
        .state()
        .watch_starts
        >= 3));
    assert_eq!(events.recv_timeout(Duration::from_millis(200)), None);
    drop(source);
    assert!(eventually(Duration::from_secs(5), || fake
        .state()
        .watch_ended));
}

#[test]
fn a_gpu_that_does_not_support_xid_events_is_not_asked_again() {
    let mut refusing = Answers::healthy();
    refusing.xid_registration = Err(NotSupported);
    let fake = FakeNvml::new(vec![Answers::healthy(), refusing]);
    let mut source = NvmlSource::new(fake.clone());
    let (sink, events) = node_agent::xid_queue::xid_queue(64);
    let refused = source.watch_xids(sink).expect("the XID watch starts");
    assert_eq!(
        refused,
        vec![(1, nvml("nvmlDeviceRegisterEvents", NotSupported))]
    );
    assert!(matches!(
        events.recv_timeout(Duration::from_secs(5)),
        Some(XidEvent::WatchDown(_))
    ));
    // Past the first backoff (1 s): still the first start, nothing said.
    assert_eq!(events.recv_timeout(Duration::from_millis(1500)), None);
    assert_eq!(fake.state().watch_starts, 1);
    drop(source);
    assert!(eventually(Duration::from_secs(5), || fake
        .state()
        .watch_ended));
}

// --- 7. Throttle bits -------------------------------------------------------

#[test]
fn throttle_bits_map_to_reasons_and_unknown_bits_are_ignored() {
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
        assert_eq!(s.pcie_replay, 17, "sample {i}: held");
        assert_eq!(s.energy_mj, 987_654_321, "sample {i}: held");
        assert_eq!(s.mem_temp, WholeCelsius(75), "sample {i}: fast");
        assert_eq!(
            last_request(&fake),
            [
                fi::MEMORY_TEMP,
                fi::NVLINK_CRC_DATA_TOTAL,
                fi::NVLINK_REPLAY_TOTAL,
                fi::NVLINK_RECOVERY_TOTAL
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

/// A GPU with no error, flag or fault for the health engine to judge.
fn clean() -> Answers {
    let mut a = Answers::healthy();
    a.ecc_total.insert((false, true), Ok(0));
    for id in [fi::RETIRED_PENDING, fi::REMAPPED_FAILURE] {
        a.fields.insert(id, Ok(0));
    }
    a
}

#[test]
fn counters_that_go_back_are_a_reset_to_the_engine_never_a_huge_rise() {
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
    let (fake, mut gpu) = one_gpu(Answers::healthy());
    let mut gpu_slow = NvmlGpu::new(Arc::new(fake.clone()), 0).slow_every(100);
    gpu_slow.sample().expect("a sample");
    fake.set(0, |a| {
        a.fields.insert(fi::PCIE_REPLAY_COUNTER, Ok(30));
        a.fields.insert(fi::RETIRED_PENDING, Ok(0));
    });
    let s = gpu_slow.sample().expect("a sample");
    assert_eq!(s.pcie_replay, 17, "held between reads");
    gpu_slow.reprobe();
    let s = gpu_slow.sample().expect("a sample");
    assert_eq!(s.pcie_replay, 30, "read after the reprobe");
    assert!(!s.flags.contains(GpuFlags::RETIRED_PENDING));

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
