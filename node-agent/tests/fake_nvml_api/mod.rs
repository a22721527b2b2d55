//! A fake NVML for the tests of the agent's NVML layer (`nvml_fake.rs`,
//! `nvml_fake_hangs_xids.rs`, `nvml_fake_schedule.rs`): [`FakeNvml`]
//! implements [`NvmlApi`] with scripted answers per GPU ([`Answers`],
//! which a test can change between calls) and counts every call made; and
//! the helpers those tests share.
//!
//! Field ids and throttle bits are written out from `nvml.h` rather than
//! taken from `node_agent::nvml`, so a wrong constant there shows here.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use node_agent::gpu::{GpuError, GpuSample};
use node_agent::nvml::{NvmlApi, NvmlFailure, NvmlGpu, NvmlResult};
use node_agent::worker::Answer;
use NvmlFailure::{InvalidArgument, NotSupported};

/// `nvmlDeviceGetFieldValues` ids, as the agent asks for them.
pub mod fi {
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
pub const GET_TEMPERATURE: &str = "nvmlDeviceGetTemperature";
pub const GET_POWER_USAGE: &str = "nvmlDeviceGetPowerUsage";
pub const GET_ENFORCED_LIMIT: &str = "nvmlDeviceGetEnforcedPowerLimit";
pub const GET_LIMIT: &str = "nvmlDeviceGetPowerManagementLimit";
pub const SET_LIMIT: &str = "nvmlDeviceSetPowerManagementLimit";
pub const GET_ECC_MODE: &str = "nvmlDeviceGetEccMode";
pub const GET_ECC_TOTAL: &str = "nvmlDeviceGetTotalEccErrors";
pub const GET_FIELD_VALUES: &str = "nvmlDeviceGetFieldValues";

/// How long a fake call waits for the test at most (a hang released, a
/// stop set), so a failing test ends instead of hanging.
pub const SAFETY: Duration = Duration::from_secs(10);

/// What one fake GPU answers, per NVML call.
#[derive(Debug, Clone)]
pub struct Answers {
    pub name: NvmlResult<String>,
    pub uuid: NvmlResult<String>,
    pub default_limit_mw: NvmlResult<u32>,
    pub constraints_mw: NvmlResult<(u32, u32)>,
    /// The management limit: `set_limit_mw` writes it, `limit_mw` reads it.
    pub limit_mw: NvmlResult<u32>,
    /// When `Some`, `set_limit_mw` fails with it and changes nothing.
    pub set_limit_fails: Option<NvmlFailure>,
    pub enforced_limit_mw: NvmlResult<u32>,
    pub temperature: NvmlResult<u32>,
    /// The temperature call blocks while the fake's gate is closed.
    pub temperature_hangs: bool,
    pub power_mw: NvmlResult<u32>,
    pub energy_mj: NvmlResult<u64>,
    pub clocks_mhz: NvmlResult<(u32, u32)>,
    pub utilization: NvmlResult<u32>,
    pub throttle_bits: NvmlResult<u64>,
    pub ecc_enabled: NvmlResult<bool>,
    /// Keyed by `(corrected, volatile)`.
    pub ecc_total: BTreeMap<(bool, bool), NvmlResult<u64>>,
    /// `Err` fails the whole field-values call.
    pub fields_call: NvmlResult<()>,
    /// Per field id; an id not here answers NotSupported.
    pub fields: BTreeMap<u32, NvmlResult<u64>>,
    /// The field-values call answers one field fewer than it was asked.
    pub fields_short: bool,
    /// The answer to registering this GPU for XID events.
    pub xid_registration: NvmlResult<()>,
    /// `nvmlDeviceGetPersistenceMode`'s answer.
    pub persistence: NvmlResult<bool>,
}

impl Answers {
    /// An H200 answering everything, every value distinct so a mix-up of
    /// two fields shows.
    pub fn healthy() -> Self {
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
            persistence: Ok(true),
        }
    }
}

/// Scripted NVML. Cloning shares the script, so a test keeps a handle on
/// the fake it handed to the agent.
#[derive(Clone)]
pub struct FakeNvml(Arc<Inner>);

struct Inner {
    state: Mutex<State>,
    /// Closed: hanging calls block. Guarded flag plus its condition.
    gate_closed: Mutex<bool>,
    gate: Condvar,
}

pub struct State {
    pub gpus: Vec<Answers>,
    /// Every call made, as (GPU, NVML function).
    pub calls: Vec<(u32, &'static str)>,
    /// The ids asked in each field-values call, per GPU.
    pub field_requests: Vec<(u32, Vec<u32>)>,
    /// XID events `watch_xids` delivers once it has registered the GPUs.
    pub xids: Vec<(u32, u64)>,
    /// The GPUs `watch_xids` was asked to register.
    pub watched: Vec<u32>,
    /// `watch_xids` returned because `stop` was set.
    pub watch_ended: bool,
    /// While set, a running XID wait returns with it and a new one fails
    /// at once (a driver reload, an event set that broke).
    pub watch_fails: Option<NvmlFailure>,
    /// XID waits begun.
    pub watch_starts: u32,
    /// While set, `device_count` fails with it (a driver not ready yet).
    pub count_fails: Option<NvmlFailure>,
    /// The XID registration answers wait at the gate (a busy GPU System
    /// Processor at boot).
    pub registration_hangs: bool,
}

impl FakeNvml {
    pub fn new(gpus: Vec<Answers>) -> Self {
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

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().expect("fake state")
    }

    /// Changes GPU `gpu`'s answers.
    pub fn set(&self, gpu: u32, change: impl FnOnce(&mut Answers)) {
        change(&mut self.state().gpus[gpu as usize]);
    }

    /// GPU `gpu`'s answers now.
    pub fn answers(&self, gpu: u32) -> Answers {
        self.state().gpus[gpu as usize].clone()
    }

    /// How many times `call` was made for GPU `gpu`.
    pub fn calls(&self, gpu: u32, call: &str) -> usize {
        let state = self.state();
        state
            .calls
            .iter()
            .filter(|(g, c)| *g == gpu && *c == call)
            .count()
    }

    /// The ids of each field-values call for GPU `gpu`, in order.
    pub fn field_requests(&self, gpu: u32) -> Vec<Vec<u32>> {
        let state = self.state();
        let requests = state.field_requests.iter().filter(|(g, _)| *g == gpu);
        requests.map(|(_, ids)| ids.clone()).collect()
    }

    pub fn set_gate(&self, closed: bool) {
        *self.0.gate_closed.lock().expect("gate") = closed;
        self.0.gate.notify_all();
    }

    /// Blocks while the gate is closed (at most [`SAFETY`]).
    pub fn wait_at_gate(&self) {
        let closed = self.0.gate_closed.lock().expect("gate");
        let _ = self
            .0
            .gate
            .wait_timeout_while(closed, SAFETY, |closed| *closed);
    }

    /// Records the call and answers it from GPU `gpu`'s script; an unknown
    /// GPU is an invalid argument, as in NVML.
    pub fn answer<T>(
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
    fn persistence_mode(&self, gpu: u32) -> NvmlResult<bool> {
        self.answer(gpu, "nvmlDeviceGetPersistenceMode", |a| {
            a.persistence.clone()
        })
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
pub fn one_gpu(answers: Answers) -> (FakeNvml, NvmlGpu<FakeNvml>) {
    let fake = FakeNvml::new(vec![answers]);
    let gpu = NvmlGpu::new(Arc::new(fake.clone()), 0);
    (fake, gpu)
}

/// Polls `done` every few milliseconds for at most `limit`.
pub fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// NVML's answer `failure` to the call `what`.
pub fn nvml(what: &'static str, failure: NvmlFailure) -> GpuError {
    GpuError::Nvml { what, failure }
}

pub fn failed(what: &'static str, detail: &str) -> GpuError {
    GpuError::Failed {
        what,
        detail: detail.into(),
    }
}

/// Opens the fake's gate when dropped, so a hung worker thread ends even
/// when an assertion fails first.
pub struct OpenOnDrop(pub FakeNvml);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.set_gate(false);
    }
}

/// A sample answered within its deadline.
pub fn now_ok(a: Answer) -> GpuSample {
    match a {
        Answer::Now(Ok(s)) => s,
        other => panic!("expected an answer within the deadline: {other:?}"),
    }
}

/// A GPU with no error, flag or fault for the health engine to judge.
pub fn clean() -> Answers {
    let mut a = Answers::healthy();
    a.ecc_total.insert((false, true), Ok(0));
    for id in [fi::RETIRED_PENDING, fi::REMAPPED_FAILURE] {
        a.fields.insert(id, Ok(0));
    }
    a
}
