//! [`NvmlApi`] on this machine's NVML, through `nvml-wrapper`: each call
//! the agent makes, with the driver's error mapped to an [`NvmlFailure`]
//! (not supported, no permission, GPU lost, timeout, invalid argument,
//! or the driver's own words). A field value of a type `nvml-wrapper`
//! cannot read is that field's "not supported", said once per GPU and
//! field ([`field_value`]).
use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use super::*;

/// NVML of this machine, through `nvml-wrapper` (loads
/// `libnvidia-ml.so.1` at run time, so the agent builds and runs without
/// a driver; [`SystemNvml::init`] says why when there is none).
///
/// Each GPU's handle is looked up once and kept: NVML's handles hold
/// until `nvmlShutdown`, and a lookup per call would add a call to every
/// call a sample makes. NVML is initialised once for the process and
/// lives as long as it (the handles borrow it), so `nvmlShutdown` is left
/// to the process's exit.
pub struct SystemNvml {
    nvml: &'static nvml_wrapper::Nvml,
    /// Each GPU's handle, once looked up (one per GPU NVML counted at
    /// the start; a GPU beyond is looked up at every call).
    handles: Box<[OnceLock<nvml_wrapper::Device<'static>>]>,
    /// The (GPU, field) pairs whose value type was said unreadable.
    unreadable_said: Mutex<HashSet<(u32, u32)>>,
    /// The event set of the last XID wait that was ended (to ask a
    /// refused GPU again), kept until a later start's set has taken the
    /// GPUs: the XIDs that came meanwhile are read out of it.
    held_over: Mutex<Option<EventSet>>,
    /// What its own calls cost (handle lookups, the XID watch's
    /// registrations), in the book its GPUs' calls are counted in.
    costs: CallCosts,
}

impl SystemNvml {
    /// Loads and initialises NVML.
    pub fn init() -> Result<Self, String> {
        let nvml = nvml_wrapper::Nvml::init()
            .map_err(|e| format!("NVML could not be initialised: {e}"))?;
        let nvml: &'static nvml_wrapper::Nvml = Box::leak(Box::new(nvml));
        // A count that fails here fails again where the agent asks for it.
        let n = nvml.device_count().unwrap_or(0) as usize;
        let handles = (0..n).map(|_| OnceLock::new()).collect();
        Ok(Self {
            nvml,
            handles,
            unreadable_said: Mutex::default(),
            held_over: Mutex::default(),
            costs: CallCosts::default(),
        })
    }

    /// Makes `call` (NVML's `what`) and counts what it cost, and its
    /// failure where it failed.
    fn timed<T>(
        &self,
        what: &'static str,
        call: impl FnOnce() -> Result<T, nvml_wrapper::error::NvmlError>,
    ) -> NvmlResult<T> {
        let began = std::time::Instant::now();
        let r = call().map_err(failure);
        let failed = r.as_ref().err().map(NvmlFailure::kind);
        self.costs.record(what, began.elapsed(), failed);
        r
    }

    /// `nvmlDeviceGetHandleByIndex_v2`, counted.
    fn look_up(&self, gpu: u32) -> NvmlResult<nvml_wrapper::Device<'static>> {
        self.timed(LOOKUP_CALL, || self.nvml.device_by_index(gpu))
    }

    /// GPU `gpu`'s handle: the one kept, or looked up (and kept once
    /// found).
    fn device(&self, gpu: u32) -> NvmlResult<DeviceRef<'_>> {
        let Some(slot) = self.handles.get(gpu as usize) else {
            return self.look_up(gpu).map(DeviceRef::Looked);
        };
        if let Some(d) = slot.get() {
            return Ok(DeviceRef::Kept(d));
        }
        let d = self.look_up(gpu)?;
        // Two threads may look it up at once: either handle is the same.
        Ok(DeviceRef::Kept(slot.get_or_init(|| d)))
    }
}

/// NVML's name of a handle lookup.
const LOOKUP_CALL: &str = "nvmlDeviceGetHandleByIndex_v2";

/// NVML's event set, for as long as NVML.
type EventSet = nvml_wrapper::EventSet<'static>;

/// A GPU's handle, kept or looked up for this call.
enum DeviceRef<'a> {
    Kept(&'a nvml_wrapper::Device<'static>),
    Looked(nvml_wrapper::Device<'static>),
}

impl std::ops::Deref for DeviceRef<'_> {
    type Target = nvml_wrapper::Device<'static>;
    fn deref(&self) -> &Self::Target {
        match self {
            DeviceRef::Kept(d) => d,
            DeviceRef::Looked(d) => d,
        }
    }
}

fn failure(e: nvml_wrapper::error::NvmlError) -> NvmlFailure {
    use nvml_wrapper::error::NvmlError as E;
    match e {
        E::NotSupported | E::FunctionNotFound => NvmlFailure::NotSupported,
        E::NoPermission => NvmlFailure::NoPermission,
        E::GpuLost => NvmlFailure::GpuLost,
        E::Timeout => NvmlFailure::Timeout,
        E::InvalidArg => NvmlFailure::InvalidArgument,
        other => NvmlFailure::Other(other.to_string()),
    }
}

/// A field value as a count. A negative or non-finite value is no count:
/// it fails the field (a miss), never reads as 0, which the health engine
/// would take for "no errors" or for a counter reset.
fn count(v: nvml_wrapper::enums::device::SampleValue) -> NvmlResult<u64> {
    use nvml_wrapper::enums::device::SampleValue;
    match v {
        SampleValue::U32(v) => Ok(u64::from(v)),
        SampleValue::U64(v) => Ok(v),
        SampleValue::I64(v) => {
            u64::try_from(v).map_err(|_| NvmlFailure::Other(format!("negative field value {v}")))
        }
        SampleValue::F64(v) if v.is_finite() && v >= 0.0 => Ok(v.round() as u64),
        SampleValue::F64(v) => Err(NvmlFailure::Other(format!(
            "field value {v} is not a count"
        ))),
    }
}

/// One field's answer as a count. A value of a type `nvml-wrapper` 0.13
/// does not know (`NVML_VALUE_TYPE_SIGNED_INT` (5) and
/// `NVML_VALUE_TYPE_UNSIGNED_SHORT` (6), which newer drivers may give; the
/// wrapper's `UnexpectedVariant`, the only error it makes of a field's own
/// answer) is that field's "not supported": reported as such, not read as
/// 0, and not a failure of the whole sample every round.
fn field_value(
    s: Result<
        nvml_wrapper::struct_wrappers::device::FieldValueSample,
        nvml_wrapper::error::NvmlError,
    >,
) -> NvmlResult<u64> {
    match s {
        Ok(s) => count(s.value.map_err(failure)?),
        Err(nvml_wrapper::error::NvmlError::UnexpectedVariant(_)) => Err(NvmlFailure::NotSupported),
        Err(e) => Err(failure(e)),
    }
}

impl SystemNvml {
    /// Says, once per GPU and field, that field `id` came with value type
    /// `t`, which cannot be read.
    fn say_unreadable(&self, gpu: u32, id: u32, t: u32) {
        let mut said = self
            .unreadable_said
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if said.insert((gpu, id)) {
            tracing::warn!(
                "GPU {gpu}: field value {} came with NVML value type {t}, which this build cannot read; it is reported as not supported",
                super::field::name(id)
            );
        }
    }
}

impl NvmlApi for SystemNvml {
    fn call_book(&self) -> CallCosts {
        self.costs.clone()
    }
    fn device_count(&self) -> NvmlResult<u32> {
        self.nvml.device_count().map_err(failure)
    }
    fn name(&self, gpu: u32) -> NvmlResult<String> {
        self.device(gpu)?.name().map_err(failure)
    }
    fn uuid(&self, gpu: u32) -> NvmlResult<String> {
        self.device(gpu)?.uuid().map_err(failure)
    }
    fn default_limit_mw(&self, gpu: u32) -> NvmlResult<u32> {
        self.device(gpu)?
            .power_management_limit_default()
            .map_err(failure)
    }
    fn limit_constraints_mw(&self, gpu: u32) -> NvmlResult<(u32, u32)> {
        let c = self
            .device(gpu)?
            .power_management_limit_constraints()
            .map_err(failure)?;
        Ok((c.min_limit, c.max_limit))
    }
    fn limit_mw(&self, gpu: u32) -> NvmlResult<u32> {
        self.device(gpu)?.power_management_limit().map_err(failure)
    }
    fn enforced_limit_mw(&self, gpu: u32) -> NvmlResult<u32> {
        self.device(gpu)?.enforced_power_limit().map_err(failure)
    }
    fn set_limit_mw(&self, gpu: u32, mw: u32) -> NvmlResult<()> {
        // The setter takes its handle mutably: a handle of its own (sets
        // are rare), its lookup counted on its own too.
        self.look_up(gpu)?
            .set_power_management_limit(mw)
            .map_err(failure)
    }
    fn persistence_mode(&self, gpu: u32) -> NvmlResult<bool> {
        self.device(gpu)?.is_in_persistent_mode().map_err(failure)
    }
    fn temperature(&self, gpu: u32) -> NvmlResult<u32> {
        self.device(gpu)?
            .temperature(nvml_wrapper::enum_wrappers::device::TemperatureSensor::Gpu)
            .map_err(failure)
    }
    fn power_usage_mw(&self, gpu: u32) -> NvmlResult<u32> {
        self.device(gpu)?.power_usage().map_err(failure)
    }
    fn energy_mj(&self, gpu: u32) -> NvmlResult<u64> {
        self.device(gpu)?
            .total_energy_consumption()
            .map_err(failure)
    }
    fn clocks_mhz(&self, gpu: u32) -> NvmlResult<(u32, u32)> {
        use nvml_wrapper::enum_wrappers::device::Clock;
        let d = self.device(gpu)?;
        Ok((
            d.clock_info(Clock::SM).map_err(failure)?,
            d.clock_info(Clock::Memory).map_err(failure)?,
        ))
    }
    fn utilization(&self, gpu: u32) -> NvmlResult<u32> {
        Ok(self.device(gpu)?.utilization_rates().map_err(failure)?.gpu)
    }
    fn throttle_bits(&self, gpu: u32) -> NvmlResult<u64> {
        Ok(self
            .device(gpu)?
            .current_throttle_reasons()
            .map_err(failure)?
            .bits())
    }
    fn ecc_enabled(&self, gpu: u32) -> NvmlResult<bool> {
        Ok(self
            .device(gpu)?
            .is_ecc_enabled()
            .map_err(failure)?
            .currently_enabled)
    }
    fn ecc_total(&self, gpu: u32, corrected: bool, volatile: bool) -> NvmlResult<u64> {
        use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
        let kind = if corrected {
            MemoryError::Corrected
        } else {
            MemoryError::Uncorrected
        };
        let counter = if volatile {
            EccCounter::Volatile
        } else {
            EccCounter::Aggregate
        };
        self.device(gpu)?
            .total_ecc_errors(kind, counter)
            .map_err(failure)
    }
    fn fields(&self, gpu: u32, ids: &[u32]) -> NvmlResult<Vec<NvmlResult<u64>>> {
        use nvml_wrapper::structs::device::FieldId;
        let asked: Vec<FieldId> = ids.iter().map(|&i| FieldId(i)).collect();
        let samples = self
            .device(gpu)?
            .field_values_for(&asked)
            .map_err(failure)?;
        Ok(ids
            .iter()
            .zip(samples)
            .map(|(&id, s)| {
                if let Err(nvml_wrapper::error::NvmlError::UnexpectedVariant(t)) = &s {
                    self.say_unreadable(gpu, id, *t);
                }
                field_value(s)
            })
            .collect())
    }
    fn watch_xids(
        &self,
        gpus: &[u32],
        registered: &mut dyn FnMut(u32, NvmlResult<()>),
        deliver: &mut dyn FnMut(u32, u64),
        stop: &AtomicBool,
    ) -> NvmlResult<()> {
        let set = super::watch::register_all(self, gpus, registered);
        // The set before is freed only once this one took the GPUs, so no
        // XID is missed between the two (one that came while the GPUs were
        // registered again may be read from both); where this one failed,
        // it is kept, and read out again at the next start.
        let before = self.hold(None);
        let before = before.filter(|b| self.read_out(b, deliver));
        let set = match set {
            Ok(set) => set,
            Err(e) => {
                self.hold(before);
                return Err(e);
            }
        };
        drop(before);
        let ended = self.wait_xids(&set, deliver, stop);
        // A failed wait (GPU_IS_LOST for one GPU fallen off the bus) says
        // nothing of the XIDs the others queued on the set: they are read
        // out now, and the set is held over as after a stop, for those
        // that come until the next start has taken the GPUs.
        if ended.is_err() {
            self.read_out(&set, deliver);
        }
        self.hold(Some(set));
        ended
    }
}

impl super::watch::EventSets for SystemNvml {
    type Set = EventSet;

    fn create(&self) -> NvmlResult<EventSet> {
        self.timed("nvmlEventSetCreate", || self.nvml.create_event_set())
    }

    /// A refused `nvmlDeviceRegisterEvents` releases the set
    /// (`nvml-wrapper` frees it on any error, as NVML asks after an
    /// unknown error), so the GPU's event types are asked first.
    fn register(
        &self,
        gpu: u32,
        set: EventSet,
    ) -> Result<EventSet, (Option<EventSet>, NvmlFailure)> {
        use nvml_wrapper::bitmasks::event::EventTypes;
        let device = match self.device(gpu) {
            Ok(d) => d,
            Err(e) => return Err((Some(set), e)),
        };
        let types = self.timed("nvmlDeviceGetSupportedEventTypes", || {
            device.supported_event_types()
        });
        match types {
            Ok(t) if t.contains(EventTypes::CRITICAL_XID_ERROR) => {}
            Ok(_) => return Err((Some(set), NvmlFailure::NotSupported)),
            Err(e) => return Err((Some(set), e)),
        }
        let began = std::time::Instant::now();
        let r = device
            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
            .map_err(|e| (None, failure(e.error)));
        let failed = r.as_ref().err().map(|(_, e)| e.kind());
        self.costs
            .record("nvmlDeviceRegisterEvents", began.elapsed(), failed);
        r
    }
}

impl SystemNvml {
    /// Waits on `set` until `stop`, delivering each XID; an event that
    /// names no GPU or carries no XID value is dropped and said
    /// ([`watch::Unread`]).
    fn wait_xids(
        &self,
        set: &EventSet,
        deliver: &mut dyn FnMut(u32, u64),
        stop: &AtomicBool,
    ) -> NvmlResult<()> {
        let mut unread = super::watch::Unread::default();
        while !stop.load(Ordering::Relaxed) {
            match set.wait(500) {
                Ok(data) => self.take(data, deliver, &mut unread),
                Err(nvml_wrapper::error::NvmlError::Timeout) => continue,
                Err(e) => return Err(failure(e)),
            };
        }
        Ok(())
    }

    /// Keeps `set` as the event set held over (`None`: none); returns the
    /// one held before.
    fn hold(&self, set: Option<EventSet>) -> Option<EventSet> {
        let mut held = self.held_over.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut *held, set)
    }

    /// Delivers what the ended wait's `set` still holds; `false` when it
    /// could not be read (said).
    fn read_out(&self, set: &EventSet, deliver: &mut dyn FnMut(u32, u64)) -> bool {
        let mut unread = super::watch::Unread::default();
        loop {
            match set.wait(0) {
                Ok(data) => self.take(data, deliver, &mut unread),
                Err(nvml_wrapper::error::NvmlError::Timeout) => return true,
                Err(e) => {
                    tracing::warn!(
                        "NVML XID watch: the event set of the wait before could not be read \
                         out ({e}); an XID that came while the GPUs were registered again may \
                         be missed"
                    );
                    return false;
                }
            }
        }
    }

    /// Delivers the XID of event `data`; one that names no GPU or carries
    /// no XID value is dropped and said.
    fn take(
        &self,
        data: nvml_wrapper::struct_wrappers::event::EventData<'_>,
        deliver: &mut dyn FnMut(u32, u64),
        unread: &mut super::watch::Unread,
    ) {
        // A GPU fallen off the bus (XID 79) cannot say its index any more:
        // its handle, kept since the watch began, still names it.
        let gpu = data.device.index().map_err(failure);
        let gpu = gpu.or_else(|e| self.kept_index(&data.device).ok_or(e));
        match xid_of(data.event_data, gpu) {
            Ok((gpu, xid)) => deliver(gpu, xid),
            Err(why) => {
                if let Some(line) = unread.dropped(std::time::Instant::now(), &why) {
                    tracing::warn!("{line}");
                }
            }
        }
    }
}

impl SystemNvml {
    /// The index of the GPU whose kept handle is `device`'s; `None` when
    /// none is.
    fn kept_index(&self, device: &nvml_wrapper::Device<'_>) -> Option<u32> {
        // SAFETY: the raw handles are compared, never passed to NVML or
        // dereferenced.
        let handle = unsafe { device.handle() };
        let kept = |slot: &OnceLock<nvml_wrapper::Device<'static>>| {
            slot.get().is_some_and(|d| unsafe { d.handle() } == handle)
        };
        self.handles.iter().position(kept).map(|i| i as u32)
    }
}

/// The XID NVML reports when it cannot name the XID (`eventData` 999 in
/// `nvml.h`; `nvml-wrapper`'s `XidError::Unknown`).
const UNKNOWN_XID: u64 = 999;

/// An event's GPU and XID, from its XID data and its GPU's index; or why
/// it cannot be read. An XID NVML cannot name is still an XID of that GPU:
/// it is delivered as [`UNKNOWN_XID`], never dropped.
fn xid_of(
    data: Option<nvml_wrapper::enums::event::XidError>,
    gpu: NvmlResult<u32>,
) -> Result<(u32, u64), String> {
    use nvml_wrapper::enums::event::XidError;
    match (data, gpu) {
        (Some(XidError::Value(xid)), Ok(gpu)) => Ok((gpu, xid)),
        (Some(XidError::Unknown), Ok(gpu)) => Ok((gpu, UNKNOWN_XID)),
        (_, Err(e)) => Err(format!("no GPU index: {e:?}")),
        (None, Ok(gpu)) => Err(format!("GPU {gpu}: no XID in it")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper::enums::device::SampleValue;

    #[test]
    fn a_field_value_that_is_no_count_fails_instead_of_reading_as_zero() {
        assert_eq!(count(SampleValue::U32(7)), Ok(7));
        assert_eq!(count(SampleValue::U64(1 << 40)), Ok(1 << 40));
        assert_eq!(count(SampleValue::I64(12)), Ok(12));
        assert_eq!(count(SampleValue::F64(3.0)), Ok(3));
        for bad in [
            SampleValue::I64(-1),
            SampleValue::F64(-2.0),
            SampleValue::F64(f64::NAN),
            SampleValue::F64(f64::INFINITY),
        ] {
            assert!(
                matches!(count(bad.clone()), Err(NvmlFailure::Other(_))),
                "{bad:?}"
            );
        }
    }

    /// A field as the driver answers it, read by `nvml-wrapper` as the
    /// agent's NVML does.
    fn answered(value_type: u32, value: u32) -> NvmlResult<u64> {
        use nvml_wrapper::struct_wrappers::device::FieldValueSample;
        use nvml_wrapper_sys::bindings::{nvmlFieldValue_t, nvmlValue_t};
        let raw = nvmlFieldValue_t {
            fieldId: 82,
            scopeId: 0,
            timestamp: 0,
            latencyUsec: 0,
            valueType: value_type,
            nvmlReturn: 0,
            value: nvmlValue_t { uiVal: value },
        };
        field_value(FieldValueSample::try_from(raw))
    }

    #[test]
    fn a_field_of_a_value_type_the_wrapper_cannot_read_is_not_supported_not_a_failure() {
        // NVML_VALUE_TYPE_UNSIGNED_INT, which it reads.
        assert_eq!(answered(1, 41), Ok(41));
        // NVML_VALUE_TYPE_SIGNED_INT and _UNSIGNED_SHORT, which it does not:
        // that field is not supported, not a failed sample.
        assert_eq!(answered(5, 41), Err(NvmlFailure::NotSupported));
        assert_eq!(answered(6, 41), Err(NvmlFailure::NotSupported));
        // A field's own failure is still a failure.
        let failed = Err(nvml_wrapper::error::NvmlError::Unknown);
        assert!(matches!(field_value(failed), Err(NvmlFailure::Other(_))));
    }

    #[test]
    fn an_xid_nvml_cannot_name_is_delivered_as_999_not_dropped() {
        use nvml_wrapper::enums::event::XidError;
        assert_eq!(xid_of(Some(XidError::Value(79)), Ok(2)), Ok((2, 79)));
        assert_eq!(xid_of(Some(XidError::Unknown), Ok(5)), Ok((5, 999)));
        // What cannot be read is still dropped (and said).
        let lost = xid_of(Some(XidError::Unknown), Err(NvmlFailure::GpuLost));
        assert_eq!(lost, Err("no GPU index: GpuLost".into()));
        assert_eq!(xid_of(None, Ok(1)), Err("GPU 1: no XID in it".into()));
    }
}
