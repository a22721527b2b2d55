//! One NVML read that fails or is lost does not pass on a value that
//! could not be read.
//!
//! Through a small scripted [`NvmlApi`] (healthy answers, any call or
//! field made to fail with a chosen NVML answer), these tests check
//! [`NvmlGpu`]:
//! - an energy counter that answered and then says "not supported" (lost)
//!   is sent as 0, not known, never its last value, and comes back when it
//!   answers; a power limit neither limit call answers is 0 W, not known.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use loopwarden_protocol::Watts;
use node_agent::gpu::GpuDevice;
use node_agent::nvml::field;
use node_agent::nvml::{NvmlApi, NvmlFailure, NvmlGpu, NvmlResult};

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

#[test]
fn a_lost_energy_counter_is_sent_as_not_known_never_held_and_so_is_an_unread_limit() {
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
