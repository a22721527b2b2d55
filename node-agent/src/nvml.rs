//! Real GPUs through NVML.
//!
//! Two layers, so the logic can be tested without a GPU:
//! - [`NvmlApi`]: the NVML calls the agent makes, one method per call,
//!   with NVML's answers (`NVML_ERROR_NOT_SUPPORTED`, `GPU_IS_LOST`, …)
//!   kept as [`NvmlFailure`]. [`SystemNvml`] implements it with
//!   `nvml-wrapper` over the driver's `libnvidia-ml.so`; tests implement it
//!   with scripted answers.
//! - [`NvmlSource`] / [`NvmlGpu`]: the [`GpuSource`] and [`GpuDevice`] the
//!   agent uses, built on any `NvmlApi`. A field the GPU does not support
//!   is recorded once in the sample's `unsupported` set (and logged once),
//!   then no longer asked for.
//!
//! Glossary:
//! - *field value*: NVML's batched query (`nvmlDeviceGetFieldValues`):
//!   HBM temperature, retired pages, remapped rows, PCIe replays and
//!   NVLink error totals in one call, each with its own answer.
//! - *event set*: NVML's wait queue for driver events; the agent registers
//!   every GPU for critical XIDs on one set, waited on by its own thread.
//! - *enforced limit*: the power limit the GPU applies now (the lowest of
//!   every limit set on it); the *management limit* is the one we set.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;

use loopwarden_protocol::{
    EccCounts, GpuFlags, MegaHertz, NvlinkErrors, Percent, ThrottleReasons, Unsupported, Watts,
    WholeCelsius,
};
use node_core::health::NVLINK_LINKS;

use crate::gpu::{GpuDevice, GpuError, GpuInfo, GpuSample, GpuSource, XidEvent, XidReport};

mod system;
pub use system::SystemNvml;

/// An NVML answer other than success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvmlFailure {
    /// `NVML_ERROR_NOT_SUPPORTED` (or the driver lacks the function).
    NotSupported,
    /// `NVML_ERROR_NO_PERMISSION`.
    NoPermission,
    /// `NVML_ERROR_GPU_IS_LOST`.
    GpuLost,
    /// `NVML_ERROR_TIMEOUT` (an event wait that saw nothing).
    Timeout,
    /// `NVML_ERROR_INVALID_ARGUMENT`.
    InvalidArgument,
    /// Anything else, in NVML's words.
    Other(String),
}

impl NvmlFailure {
    fn into_gpu_error(self, what: &'static str) -> GpuError {
        match self {
            Self::NotSupported => GpuError::NotSupported,
            Self::NoPermission => GpuError::NoPermission,
            Self::GpuLost => GpuError::Lost,
            Self::InvalidArgument => GpuError::InvalidArgument,
            Self::Timeout => GpuError::Failed {
                what,
                detail: "NVML timeout".into(),
            },
            Self::Other(detail) => GpuError::Failed { what, detail },
        }
    }
}

/// NVML's result type.
pub type NvmlResult<T> = Result<T, NvmlFailure>;

/// Field ids of `nvmlDeviceGetFieldValues` (from `nvml.h`).
pub mod field {
    /// HBM temperature, °C.
    pub const MEMORY_TEMP: u32 = 82;
    /// Pages retired for single-bit errors.
    pub const RETIRED_SBE: u32 = 29;
    /// Pages retired for double-bit errors.
    pub const RETIRED_DBE: u32 = 30;
    /// A page retirement waits for the next reset (0 or 1).
    pub const RETIRED_PENDING: u32 = 31;
    /// Rows remapped for correctable errors.
    pub const REMAPPED_COR: u32 = 142;
    /// Rows remapped for uncorrectable errors.
    pub const REMAPPED_UNC: u32 = 143;
    /// A row remap waits for the next reset (0 or 1).
    pub const REMAPPED_PENDING: u32 = 144;
    /// Row remapping failed (0 or 1).
    pub const REMAPPED_FAILURE: u32 = 145;
    /// PCIe replay counter.
    pub const PCIE_REPLAY_COUNTER: u32 = 94;
    /// NVLink CRC data errors, all links.
    pub const NVLINK_CRC_DATA_TOTAL: u32 = 45;
    /// NVLink replay errors, all links.
    pub const NVLINK_REPLAY_TOTAL: u32 = 52;
    /// NVLink recovery errors, all links.
    pub const NVLINK_RECOVERY_TOTAL: u32 = 59;
    /// NVLink replay errors of link 0 (links 0 to 5 follow in order).
    pub const NVLINK_REPLAY_L0: u32 = 46;
    /// NVLink recovery errors of link 0 (links 0 to 5 follow in order).
    pub const NVLINK_RECOVERY_L0: u32 = 53;
    /// NVLink replay errors of link 6 (links 6 to 11 follow in order).
    pub const NVLINK_REPLAY_L6: u32 = 108;
    /// NVLink recovery errors of link 6 (links 6 to 11 follow in order).
    pub const NVLINK_RECOVERY_L6: u32 = 114;

    /// The field of link `l`'s replay (`recovery: false`) or recovery
    /// count, for links 0 to 11.
    pub fn nvlink_link(l: usize, recovery: bool) -> u32 {
        let l = l as u32;
        match (l < 6, recovery) {
            (true, false) => NVLINK_REPLAY_L0 + l,
            (true, true) => NVLINK_RECOVERY_L0 + l,
            (false, false) => NVLINK_REPLAY_L6 + l - 6,
            (false, true) => NVLINK_RECOVERY_L6 + l - 6,
        }
    }

    /// Which link and counter a per-link field is, if it is one.
    pub fn link_of(id: u32) -> Option<(usize, bool)> {
        let span = |base: u32| (base..base + 6).contains(&id).then(|| (id - base) as usize);
        span(NVLINK_REPLAY_L0)
            .map(|l| (l, false))
            .or_else(|| span(NVLINK_RECOVERY_L0).map(|l| (l, true)))
            .or_else(|| span(NVLINK_REPLAY_L6).map(|l| (l + 6, false)))
            .or_else(|| span(NVLINK_RECOVERY_L6).map(|l| (l + 6, true)))
    }
}

/// Throttle (clock-event) reason bits of `nvml.h`.
mod nvml_throttle {
    pub const GPU_IDLE: u64 = 0x1;
    pub const APPLICATIONS_CLOCKS: u64 = 0x2;
    pub const SW_POWER_CAP: u64 = 0x4;
    pub const HW_SLOWDOWN: u64 = 0x8;
    pub const SYNC_BOOST: u64 = 0x10;
    pub const SW_THERMAL: u64 = 0x20;
    pub const HW_THERMAL: u64 = 0x40;
    pub const HW_POWER_BRAKE: u64 = 0x80;
}

/// Translates NVML's clock-event bits into the bus's.
pub fn throttle_from_nvml(bits: u64) -> ThrottleReasons {
    use nvml_throttle as n;
    let map = [
        (n::GPU_IDLE, ThrottleReasons::IDLE),
        (n::APPLICATIONS_CLOCKS, ThrottleReasons::APPLICATIONS_CLOCKS),
        (n::SW_POWER_CAP, ThrottleReasons::SW_POWER_CAP),
        (n::HW_SLOWDOWN, ThrottleReasons::HW_SLOWDOWN),
        (n::SYNC_BOOST, ThrottleReasons::SYNC_BOOST),
        (n::SW_THERMAL, ThrottleReasons::SW_THERMAL_SLOWDOWN),
        (n::HW_THERMAL, ThrottleReasons::HW_THERMAL_SLOWDOWN),
        (n::HW_POWER_BRAKE, ThrottleReasons::HW_POWER_BRAKE),
    ];
    map.iter()
        .filter(|(bit, _)| bits & bit != 0)
        .fold(ThrottleReasons::empty(), |acc, (_, r)| acc | *r)
}

/// The NVML calls the agent makes. GPU arguments are NVML indices.
pub trait NvmlApi: Send + Sync + 'static {
    /// `nvmlDeviceGetCount`.
    fn device_count(&self) -> NvmlResult<u32>;
    /// `nvmlDeviceGetName`.
    fn name(&self, gpu: u32) -> NvmlResult<String>;
    /// `nvmlDeviceGetUUID`.
    fn uuid(&self, gpu: u32) -> NvmlResult<String>;
    /// `nvmlDeviceGetPowerManagementDefaultLimit`, mW.
    fn default_limit_mw(&self, gpu: u32) -> NvmlResult<u32>;
    /// `nvmlDeviceGetPowerManagementLimitConstraints`, (min, max) mW.
    fn limit_constraints_mw(&self, gpu: u32) -> NvmlResult<(u32, u32)>;
    /// `nvmlDeviceGetPowerManagementLimit`, mW: the limit set.
    fn limit_mw(&self, gpu: u32) -> NvmlResult<u32>;
    /// `nvmlDeviceGetEnforcedPowerLimit`, mW.
    fn enforced_limit_mw(&self, gpu: u32) -> NvmlResult<u32>;
    /// `nvmlDeviceSetPowerManagementLimit`, mW. Needs root.
    fn set_limit_mw(&self, gpu: u32, mw: u32) -> NvmlResult<()>;
    /// `nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)`, °C.
    fn temperature(&self, gpu: u32) -> NvmlResult<u32>;
    /// `nvmlDeviceGetPowerUsage`, mW.
    fn power_usage_mw(&self, gpu: u32) -> NvmlResult<u32>;
    /// `nvmlDeviceGetTotalEnergyConsumption`, mJ.
    fn energy_mj(&self, gpu: u32) -> NvmlResult<u64>;
    /// `nvmlDeviceGetClockInfo` for SM and memory, MHz.
    fn clocks_mhz(&self, gpu: u32) -> NvmlResult<(u32, u32)>;
    /// `nvmlDeviceGetUtilizationRates`, the GPU part, %.
    fn utilization(&self, gpu: u32) -> NvmlResult<u32>;
    /// `nvmlDeviceGetCurrentClocksEventReasons`, NVML's bits.
    fn throttle_bits(&self, gpu: u32) -> NvmlResult<u64>;
    /// `nvmlDeviceGetEccMode`: whether ECC is on now.
    fn ecc_enabled(&self, gpu: u32) -> NvmlResult<bool>;
    /// `nvmlDeviceGetTotalEccErrors`.
    fn ecc_total(&self, gpu: u32, corrected: bool, volatile: bool) -> NvmlResult<u64>;
    /// `nvmlDeviceGetFieldValues`: one answer per id, in order.
    fn fields(&self, gpu: u32, ids: &[u32]) -> NvmlResult<Vec<NvmlResult<u64>>>;
    /// Registers `gpus` for critical XID events on one event set and waits
    /// on it until `stop`, calling `deliver` per event. `registered` is
    /// told, per GPU, whether it could be registered.
    fn watch_xids(
        &self,
        gpus: &[u32],
        registered: &mut dyn FnMut(u32, NvmlResult<()>),
        deliver: &mut dyn FnMut(u32, u64),
        stop: &AtomicBool,
    ) -> NvmlResult<()>;
}

/// The GPUs of this host through an [`NvmlApi`].
pub struct NvmlSource<A: NvmlApi> {
    api: Arc<A>,
    stop: Arc<AtomicBool>,
}

impl<A: NvmlApi> NvmlSource<A> {
    /// A source over `api`.
    pub fn new(api: A) -> Self {
        Self {
            api: Arc::new(api),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl<A: NvmlApi> Drop for NvmlSource<A> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl<A: NvmlApi> GpuSource for NvmlSource<A> {
    fn devices(&mut self) -> Result<Vec<Box<dyn GpuDevice>>, GpuError> {
        let count = self
            .api
            .device_count()
            .map_err(|e| e.into_gpu_error("nvmlDeviceGetCount"))?;
        Ok((0..count.min(loopwarden_protocol::MAX_GPUS as u32))
            .map(|i| Box::new(NvmlGpu::new(self.api.clone(), i)) as Box<dyn GpuDevice>)
            .collect())
    }

    fn watch_xids(
        &mut self,
        sink: crate::xid_queue::XidSink,
    ) -> Result<Vec<(u8, GpuError)>, GpuError> {
        let count = self
            .api
            .device_count()
            .map_err(|e| e.into_gpu_error("nvmlDeviceGetCount"))?
            .min(loopwarden_protocol::MAX_GPUS as u32);
        let gpus: Vec<u32> = (0..count).collect();
        let (reg_tx, reg_rx) = std::sync::mpsc::channel();
        let api = self.api.clone();
        let stop = self.stop.clone();
        std::thread::Builder::new()
            .name("nvml-xid".into())
            .spawn(move || keep_watching(&*api, &gpus, &sink, &reg_tx, &stop))
            .map_err(|e| GpuError::Failed {
                what: "XID thread",
                detail: e.to_string(),
            })?;
        // Registration answers come first; a `None` means the watch ended.
        let mut refused = Vec::new();
        let mut answered = 0;
        while answered < count {
            match reg_rx.recv_timeout(std::time::Duration::from_secs(10)) {
                Ok(Some((gpu, r))) => {
                    answered += 1;
                    if let Err(e) = r {
                        refused.push((gpu as u8, e.into_gpu_error("nvmlDeviceRegisterEvents")));
                    }
                }
                Ok(None) | Err(_) => {
                    return Err(GpuError::Failed {
                        what: "nvmlEventSetCreate/nvmlDeviceRegisterEvents",
                        detail: "the XID event set could not be set up".into(),
                    })
                }
            }
        }
        Ok(refused)
    }
}

/// The first wait after a watch ended; it doubles up to [`WATCH_RETRY_MAX`].
pub const WATCH_RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest wait between restarts of the XID watch.
pub const WATCH_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs the XID watch until `stop`, restarting it with backoff whenever it
/// ends: each end is sent as [`XidEvent::WatchDown`], each restart whose
/// registrations all answered as [`XidEvent::WatchUp`]. The first
/// registration answers go to `first_registrations` (then `None` if the
/// first watch ended).
fn keep_watching<A: NvmlApi>(
    api: &A,
    gpus: &[u32],
    sink: &crate::xid_queue::XidSink,
    first_registrations: &Sender<Option<(u32, NvmlResult<()>)>>,
    stop: &AtomicBool,
) {
    let mut wait = WATCH_RETRY_FIRST;
    let mut restarts = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let mut answered = 0;
        let mut registered = |gpu: u32, r: NvmlResult<()>| {
            answered += 1;
            if restarts == 0 {
                let _ = first_registrations.send(Some((gpu, r)));
            } else if answered == gpus.len() {
                let _ = sink.send(XidEvent::WatchUp);
            }
        };
        let mut deliver = |gpu: u32, xid: u64| {
            let report = XidReport {
                gpu: gpu as u8,
                xid: xid.min(u16::MAX as u64) as u16,
            };
            let _ = sink.send(XidEvent::Xid(report));
        };
        let began = std::time::Instant::now();
        let outcome = api.watch_xids(gpus, &mut registered, &mut deliver, stop);
        if restarts == 0 {
            let _ = first_registrations.send(None);
        }
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let why = match outcome {
            Err(e) => format!("{e:?}"),
            Ok(()) => "the event wait returned".into(),
        };
        tracing::error!("NVML XID watch ended ({why}); restarting it in {wait:?}");
        if sink.send(XidEvent::WatchDown(why)).is_err() {
            return;
        }
        // A watch that ran for a while earns a quick restart.
        if began.elapsed() > WATCH_RETRY_MAX {
            wait = WATCH_RETRY_FIRST;
        }
        sleep_unless(stop, wait);
        wait = (wait * 2).min(WATCH_RETRY_MAX);
        restarts += 1;
    }
}

/// Sleeps `d`, or less if `stop` is set meanwhile.
fn sleep_unless(stop: &AtomicBool, d: std::time::Duration) {
    let until = std::time::Instant::now() + d;
    while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Groups of fields that are asked for together and reported unsupported
/// together.
const FIELD_GROUPS: [(u32, Unsupported); 11] = [
    (field::MEMORY_TEMP, Unsupported::MEM_TEMP),
    (field::RETIRED_SBE, Unsupported::RETIRED),
    (field::RETIRED_DBE, Unsupported::RETIRED),
    (field::RETIRED_PENDING, Unsupported::RETIRED),
    (field::REMAPPED_COR, Unsupported::REMAP),
    (field::REMAPPED_UNC, Unsupported::REMAP),
    (field::REMAPPED_PENDING, Unsupported::REMAP),
    (field::REMAPPED_FAILURE, Unsupported::REMAP),
    (field::PCIE_REPLAY_COUNTER, Unsupported::PCIE),
    (field::NVLINK_CRC_DATA_TOTAL, Unsupported::NVLINK),
    (field::NVLINK_REPLAY_TOTAL, Unsupported::NVLINK),
];

/// Single NVML calls, each skipped once it answered "not supported".
mod call {
    pub const POWER_USAGE: u16 = 1 << 0;
    pub const ENFORCED_LIMIT: u16 = 1 << 1;
    pub const LIMIT: u16 = 1 << 2;
    pub const ENERGY: u16 = 1 << 3;
    pub const CLOCKS: u16 = 1 << 4;
    pub const UTIL: u16 = 1 << 5;
    pub const THROTTLE: u16 = 1 << 6;
    pub const ECC_MODE: u16 = 1 << 7;
    /// Four bits from here: the ECC counters.
    pub const ECC_COUNT: u16 = 1 << 8;
}

/// One GPU through NVML.
pub struct NvmlGpu<A: NvmlApi> {
    api: Arc<A>,
    index: u32,
    /// Field groups reported unsupported.
    unsupported: Unsupported,
    /// Calls found unsupported ([`call`] bits); never made again.
    skipped: u16,
    /// Links whose per-link counters answered "not supported" (a link the
    /// GPU does not have); not asked again until a driver reload.
    links_skipped: u16,
}

impl<A: NvmlApi> NvmlGpu<A> {
    /// GPU `index` of `api`.
    pub fn new(api: Arc<A>, index: u32) -> Self {
        Self {
            api,
            index,
            unsupported: Unsupported::empty(),
            skipped: 0,
            links_skipped: 0,
        }
    }

    /// Makes `call` unless it answered "not supported" before. A "not
    /// supported" answer is logged once, marks `group` (if any) unsupported
    /// and yields `None`; any other failure is an error.
    fn ask<T>(
        &mut self,
        bit: u16,
        group: Option<Unsupported>,
        what: &'static str,
        call: impl FnOnce(&A, u32) -> NvmlResult<T>,
    ) -> Result<Option<T>, GpuError> {
        if self.skipped & bit != 0 {
            return Ok(None);
        }
        match call(&self.api, self.index) {
            Ok(v) => Ok(Some(v)),
            Err(NvmlFailure::NotSupported) => {
                self.skipped |= bit;
                match group {
                    Some(g) => self.mark(g, what),
                    None => tracing::info!("GPU {}: {what} is not supported", self.index),
                }
                Ok(None)
            }
            Err(e) => Err(e.into_gpu_error(what)),
        }
    }

    fn mark(&mut self, group: Unsupported, what: &str) {
        if !self.unsupported.contains(group) {
            tracing::info!(
                "GPU {}: {what} is not supported; reported as unsupported from now on",
                self.index
            );
            self.unsupported = self.unsupported | group;
        }
    }

    /// Zeroes every field of a group marked unsupported, so a sample never
    /// carries a value next to an `unsupported` bit that says it means
    /// nothing.
    fn zero_unsupported(&self, s: &mut GpuSample) {
        let u = self.unsupported;
        if u.contains(Unsupported::MEM_TEMP) {
            s.mem_temp = WholeCelsius(0);
        }
        if u.contains(Unsupported::POWER) {
            s.power = Watts(0);
        }
        if u.contains(Unsupported::CLOCKS) {
            s.sm_clock = MegaHertz(0);
            s.mem_clock = MegaHertz(0);
        }
        if u.contains(Unsupported::UTIL) {
            s.util = Percent::ZERO;
        }
        if u.contains(Unsupported::THROTTLE) {
            s.throttle = ThrottleReasons::empty();
        }
        if u.contains(Unsupported::ECC) {
            s.ecc = EccCounts::default();
        }
        if u.contains(Unsupported::RETIRED) {
            s.repair.retired_sbe = 0;
            s.repair.retired_dbe = 0;
            s.flags = s.flags.with(GpuFlags::RETIRED_PENDING, false);
        }
        if u.contains(Unsupported::REMAP) {
            s.repair.remap_correctable = 0;
            s.repair.remap_uncorrectable = 0;
            s.flags = s
                .flags
                .with(GpuFlags::REMAP_PENDING, false)
                .with(GpuFlags::REMAP_FAILURE, false);
        }
        if u.contains(Unsupported::PCIE) {
            s.pcie_replay = 0;
        }
        if u.contains(Unsupported::NVLINK) {
            s.nvlink = NvlinkErrors::default();
        }
    }

    fn batched_fields(&mut self, s: &mut GpuSample) -> Result<(), GpuError> {
        let mut ids: Vec<u32> = FIELD_GROUPS
            .iter()
            .filter(|(_, g)| !self.unsupported.contains(*g))
            .map(|(id, _)| *id)
            .collect();
        if !self.unsupported.contains(Unsupported::NVLINK) {
            ids.push(field::NVLINK_RECOVERY_TOTAL);
            for l in (0..NVLINK_LINKS).filter(|l| self.links_skipped & (1 << l) == 0) {
                ids.push(field::nvlink_link(l, false));
                ids.push(field::nvlink_link(l, true));
            }
            // Read unless one of its fields fails below.
            s.nvlink_links.read = !self.links_skipped & ((1 << NVLINK_LINKS) - 1);
        }
        if ids.is_empty() {
            return Ok(());
        }
        let answers = match self.api.fields(self.index, &ids) {
            Ok(a) => a,
            Err(NvmlFailure::NotSupported) => {
                for (_, g) in FIELD_GROUPS {
                    self.mark(g, "nvmlDeviceGetFieldValues");
                }
                self.mark(Unsupported::NVLINK, "nvmlDeviceGetFieldValues");
                return Ok(());
            }
            Err(e) => return Err(e.into_gpu_error("nvmlDeviceGetFieldValues")),
        };
        let group_of = |id: u32| {
            FIELD_GROUPS
                .iter()
                .find(|(f, _)| *f == id)
                .map_or(Unsupported::NVLINK, |(_, g)| *g)
        };
        let sat16 = |v: u64| v.min(u16::MAX as u64) as u16;
        let sat32 = |v: u64| v.min(u32::MAX as u64) as u32;
        for (id, answer) in ids.iter().zip(answers) {
            if let Some((l, recovery)) = field::link_of(*id) {
                self.link_answer(s, l, recovery, answer);
                continue;
            }
            let v = match answer {
                Ok(v) => v,
                Err(NvmlFailure::NotSupported) => {
                    self.mark(group_of(*id), "a field value");
                    continue;
                }
                Err(e) => return Err(e.into_gpu_error("nvmlDeviceGetFieldValues")),
            };
            match *id {
                field::MEMORY_TEMP => s.mem_temp = WholeCelsius(v.min(255) as u8),
                field::RETIRED_SBE => s.repair.retired_sbe = sat16(v),
                field::RETIRED_DBE => s.repair.retired_dbe = sat16(v),
                field::RETIRED_PENDING => s.flags = s.flags.with(GpuFlags::RETIRED_PENDING, v != 0),
                field::REMAPPED_COR => s.repair.remap_correctable = sat16(v),
                field::REMAPPED_UNC => s.repair.remap_uncorrectable = sat16(v),
                field::REMAPPED_PENDING => s.flags = s.flags.with(GpuFlags::REMAP_PENDING, v != 0),
                field::REMAPPED_FAILURE => s.flags = s.flags.with(GpuFlags::REMAP_FAILURE, v != 0),
                field::PCIE_REPLAY_COUNTER => s.pcie_replay = sat32(v),
                field::NVLINK_CRC_DATA_TOTAL => s.nvlink.crc = sat32(v),
                field::NVLINK_REPLAY_TOTAL => s.nvlink.replay = sat32(v),
                field::NVLINK_RECOVERY_TOTAL => s.nvlink.recovery = sat32(v),
                _ => {}
            }
        }
        Ok(())
    }
}

impl<A: NvmlApi> NvmlGpu<A> {
    /// One per-link NVLink counter's answer: a value, or that link left
    /// out of this sample (and of every later one when not supported).
    /// A per-link failure never fails the sample: the totals stand in.
    fn link_answer(&mut self, s: &mut GpuSample, l: usize, recovery: bool, a: NvmlResult<u64>) {
        let bit = 1u16 << l;
        match a {
            Ok(v) => {
                let v = v.min(u64::from(u32::MAX)) as u32;
                if recovery {
                    s.nvlink_links.recovery[l] = v;
                } else {
                    s.nvlink_links.replay[l] = v;
                }
            }
            Err(NvmlFailure::NotSupported) => {
                self.links_skipped |= bit;
                s.nvlink_links.read &= !bit;
            }
            Err(_) => s.nvlink_links.read &= !bit,
        }
    }
}

impl<A: NvmlApi> GpuDevice for NvmlGpu<A> {
    fn reprobe(&mut self) {
        if !self.unsupported.is_empty() || self.skipped != 0 {
            tracing::info!(
                "GPU {}: asking again what answered \"not supported\" (after a driver reload)",
                self.index
            );
        }
        self.unsupported = Unsupported::empty();
        self.skipped = 0;
        self.links_skipped = 0;
    }

    fn describe(&mut self) -> Result<GpuInfo, GpuError> {
        let a = &self.api;
        let i = self.index;
        let name = a
            .name(i)
            .map_err(|e| e.into_gpu_error("nvmlDeviceGetName"))?;
        let uuid = a
            .uuid(i)
            .map_err(|e| e.into_gpu_error("nvmlDeviceGetUUID"))?;
        let default = a
            .default_limit_mw(i)
            .map_err(|e| e.into_gpu_error("nvmlDeviceGetPowerManagementDefaultLimit"))?;
        let (min, max) = a
            .limit_constraints_mw(i)
            .map_err(|e| e.into_gpu_error("nvmlDeviceGetPowerManagementLimitConstraints"))?;
        Ok(GpuInfo {
            name,
            uuid,
            default_limit: Watts::from_milliwatts(default),
            min_limit: Watts::from_milliwatts(min),
            max_limit: Watts::from_milliwatts(max),
        })
    }

    fn sample(&mut self) -> Result<GpuSample, GpuError> {
        let mut s = GpuSample::default();
        let temp = self
            .api
            .temperature(self.index)
            .map_err(|e| e.into_gpu_error("nvmlDeviceGetTemperature"))?;
        s.temp = WholeCelsius(temp.min(255) as u8);
        let power = Some(Unsupported::POWER);
        if let Some(mw) = self.ask(
            call::POWER_USAGE,
            power,
            "nvmlDeviceGetPowerUsage",
            |a, i| a.power_usage_mw(i),
        )? {
            s.power = Watts::from_milliwatts(mw);
        }
        // The enforced limit, else the limit set (what the agent caps).
        let enforced = self.ask(
            call::ENFORCED_LIMIT,
            None,
            "nvmlDeviceGetEnforcedPowerLimit",
            |a, i| a.enforced_limit_mw(i),
        )?;
        let limit = match enforced {
            Some(mw) => Some(mw),
            None => self.ask(
                call::LIMIT,
                None,
                "nvmlDeviceGetPowerManagementLimit",
                |a, i| a.limit_mw(i),
            )?,
        };
        s.power_limit = limit.map_or(Watts(0), Watts::from_milliwatts);
        if let Some(mj) = self.ask(
            call::ENERGY,
            None,
            "nvmlDeviceGetTotalEnergyConsumption",
            |a, i| a.energy_mj(i),
        )? {
            s.energy_mj = mj;
        }
        let clocks = Some(Unsupported::CLOCKS);
        if let Some((sm, mem)) =
            self.ask(call::CLOCKS, clocks, "nvmlDeviceGetClockInfo", |a, i| {
                a.clocks_mhz(i)
            })?
        {
            s.sm_clock = MegaHertz(sm.min(u16::MAX as u32) as u16);
            s.mem_clock = MegaHertz(mem.min(u16::MAX as u32) as u16);
        }
        let util = Some(Unsupported::UTIL);
        if let Some(u) = self.ask(call::UTIL, util, "nvmlDeviceGetUtilizationRates", |a, i| {
            a.utilization(i)
        })? {
            s.util = Percent::new(u.min(100) as u8).unwrap_or(Percent::FULL);
        }
        let throttle = Some(Unsupported::THROTTLE);
        if let Some(bits) = self.ask(
            call::THROTTLE,
            throttle,
            "nvmlDeviceGetCurrentClocksEventReasons",
            |a, i| a.throttle_bits(i),
        )? {
            s.throttle = throttle_from_nvml(bits);
        }
        let ecc = Some(Unsupported::ECC);
        let ecc_on = self
            .ask(call::ECC_MODE, ecc, "nvmlDeviceGetEccMode", |a, i| {
                a.ecc_enabled(i)
            })?
            .unwrap_or(false);
        s.flags = s.flags.with(GpuFlags::ECC_ENABLED, ecc_on);
        if ecc_on {
            let mut counts = [0u32; 4];
            let counters = [(true, true), (false, true), (true, false), (false, false)];
            for (slot, (corrected, volatile)) in counters.into_iter().enumerate() {
                let bit = call::ECC_COUNT << slot;
                if let Some(v) = self.ask(bit, ecc, "nvmlDeviceGetTotalEccErrors", |a, i| {
                    a.ecc_total(i, corrected, volatile)
                })? {
                    counts[slot] = v.min(u32::MAX as u64) as u32;
                }
            }
            s.ecc = EccCounts {
                sbe_volatile: counts[0],
                dbe_volatile: counts[1],
                sbe_aggregate: counts[2],
                dbe_aggregate: counts[3],
            };
        }
        self.batched_fields(&mut s)?;
        self.zero_unsupported(&mut s);
        s.unsupported = self.unsupported;
        Ok(s)
    }

    fn set_power_limit(&mut self, limit: Watts) -> Result<(), GpuError> {
        self.api
            .set_limit_mw(self.index, limit.milliwatts())
            .map_err(|e| e.into_gpu_error("nvmlDeviceSetPowerManagementLimit"))
    }

    fn power_limit(&mut self) -> Result<Watts, GpuError> {
        self.api
            .limit_mw(self.index)
            .map(Watts::from_milliwatts)
            .map_err(|e| e.into_gpu_error("nvmlDeviceGetPowerManagementLimit"))
    }
}
