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
//!   is recorded in the sample's `unsupported` set (and logged once,
//!   by name), then no longer asked for until a reprobe; one that answered
//!   before and then says "not supported" is a lost sensor: a warning, and
//!   asked again at every read of the slow counters (`nvml::support`).
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
use std::sync::Arc;

use loopwarden_protocol::{ThrottleReasons, Unsupported, Watts};

use crate::gpu::{GpuDevice, GpuError, GpuInfo, GpuSample, GpuSource, XidEvent};

mod system;
mod watch;
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
    /// Its kind, as `/metrics` labels it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotSupported => "not_supported",
            Self::NoPermission => "no_permission",
            Self::GpuLost => "gpu_lost",
            Self::Timeout => "timeout",
            Self::InvalidArgument => "invalid_argument",
            Self::Other(_) => "other",
        }
    }

    /// The error of the call `what` that NVML answered so: the call is
    /// named with NVML's answer.
    fn into_gpu_error(self, what: &'static str) -> GpuError {
        match self {
            Self::NotSupported | Self::NoPermission | Self::InvalidArgument => GpuError::Nvml {
                what,
                failure: self,
            },
            Self::GpuLost => GpuError::Lost,
            Self::Timeout => GpuError::Failed {
                what,
                detail: "NVML timeout".into(),
            },
            Self::Other(detail) => GpuError::Failed { what, detail },
        }
    }
}

/// The NVML call that sets a power limit (it needs root).
pub const SET_LIMIT_CALL: &str = "nvmlDeviceSetPowerManagementLimit";

/// NVML's answer, by its name in `nvml.h`, and what it means.
impl std::fmt::Display for NvmlFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NotSupported => "NVML_ERROR_NOT_SUPPORTED (not supported by this GPU or driver)",
            Self::NoPermission => "NVML_ERROR_NO_PERMISSION (the agent lacks the permission)",
            Self::GpuLost => "NVML_ERROR_GPU_IS_LOST (fallen off the bus)",
            Self::Timeout => "NVML_ERROR_TIMEOUT",
            Self::InvalidArgument => {
                "NVML_ERROR_INVALID_ARGUMENT (an argument of the call refused)"
            }
            Self::Other(words) => words,
        })
    }
}

/// NVML's result type.
pub type NvmlResult<T> = Result<T, NvmlFailure>;

mod costs;
/// Field ids of `nvmlDeviceGetFieldValues` (from `nvml.h`), and their
/// names.
pub mod field;
mod probe;
mod sample;
pub use costs::{CallCosts, Cost};
pub use probe::{probe, table as probe_table, Probe};

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
    /// `nvmlDeviceGetPersistenceMode`: whether the driver keeps the GPU
    /// initialized with no client (`nvidia-smi -pm 1`, or
    /// nvidia-persistenced).
    fn persistence_mode(&self, gpu: u32) -> NvmlResult<bool>;
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
    /// `nvmlDeviceGetCurrentClocksThrottleReasons` (what nvml-wrapper
    /// calls; newer drivers also name it `…ClocksEventReasons`, with the
    /// same bits), NVML's bits.
    fn throttle_bits(&self, gpu: u32) -> NvmlResult<u64>;
    /// `nvmlDeviceGetEccMode`: whether ECC is on now.
    fn ecc_enabled(&self, gpu: u32) -> NvmlResult<bool>;
    /// `nvmlDeviceGetTotalEccErrors`.
    fn ecc_total(&self, gpu: u32, corrected: bool, volatile: bool) -> NvmlResult<u64>;
    /// `nvmlDeviceGetFieldValues`: one answer per id, in order.
    fn fields(&self, gpu: u32, ids: &[u32]) -> NvmlResult<Vec<NvmlResult<u64>>>;
    /// Registers `gpus` for critical XID events on one event set and waits
    /// on it until `stop`, calling `deliver` per event. `registered` is
    /// told, per GPU, whether it could be registered; a GPU that could not
    /// is left out of the wait. With no GPU registered it fails instead of
    /// waiting on an empty set.
    fn watch_xids(
        &self,
        gpus: &[u32],
        registered: &mut dyn FnMut(u32, NvmlResult<()>),
        deliver: &mut dyn FnMut(u32, u64),
        stop: &AtomicBool,
    ) -> NvmlResult<()>;
    /// The book in which the calls it makes on its own (handle lookups,
    /// the XID watch's registrations) are counted; [`NvmlSource`] counts
    /// its GPUs' calls in it too. A book of its own by default.
    fn call_book(&self) -> CallCosts {
        CallCosts::default()
    }
}

/// The GPUs of this host through an [`NvmlApi`].
pub struct NvmlSource<A: NvmlApi> {
    api: Arc<A>,
    stop: Arc<AtomicBool>,
    slow_every: u32,
    /// Per GPU index: an XID came since its last sample.
    nudges: Arc<[AtomicBool]>,
    /// What its GPUs' calls cost.
    costs: CallCosts,
    /// How long `watch_xids` waits for the first registration answers.
    first_answers_wait: std::time::Duration,
}

impl<A: NvmlApi> NvmlSource<A> {
    /// A source over `api`, its GPUs reading every counter at every
    /// sample.
    pub fn new(api: A) -> Self {
        let costs = api.call_book();
        Self {
            api: Arc::new(api),
            stop: Arc::new(AtomicBool::new(false)),
            slow_every: 1,
            nudges: (0..loopwarden_protocol::MAX_GPUS)
                .map(|_| AtomicBool::new(false))
                .collect(),
            costs,
            first_answers_wait: FIRST_ANSWERS_WAIT,
        }
    }

    /// `watch_xids` waits `limit` for the first registration answers
    /// (default [`FIRST_ANSWERS_WAIT`]).
    pub fn first_answers_wait(mut self, limit: std::time::Duration) -> Self {
        self.first_answers_wait = limit;
        self
    }

    /// Its GPUs read the slow counters every `samples` samples.
    pub fn slow_every(mut self, samples: u32) -> Self {
        self.slow_every = samples.max(1);
        self
    }
}

impl<A: NvmlApi> Drop for NvmlSource<A> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl<A: NvmlApi> GpuSource for NvmlSource<A> {
    fn call_costs(&self) -> Option<CallCosts> {
        Some(self.costs.clone())
    }

    fn devices(&mut self) -> Result<Vec<Box<dyn GpuDevice>>, GpuError> {
        let count = self
            .api
            .device_count()
            .map_err(|e| e.into_gpu_error("nvmlDeviceGetCount"))?;
        Ok((0..count.min(loopwarden_protocol::MAX_GPUS as u32))
            .map(|i| {
                let mut gpu = NvmlGpu::new(self.api.clone(), i)
                    .slow_every(self.slow_every)
                    .call_costs(self.costs.clone());
                gpu.nudge = Some((self.nudges.clone(), i as usize));
                Box::new(gpu) as Box<dyn GpuDevice>
            })
            .collect())
    }

    fn watch_xids(
        &mut self,
        sink: crate::xid_queue::XidSink,
    ) -> Result<Vec<(u8, GpuError)>, GpuError> {
        let first = Arc::new(watch::FirstStart::default());
        let said = sink.clone();
        let (api, stop, nudges) = (self.api.clone(), self.stop.clone(), self.nudges.clone());
        let answers = first.clone();
        std::thread::Builder::new()
            .name("nvml-xid".into())
            .spawn(move || {
                let out = Deliver {
                    sink: &sink,
                    nudges: &nudges,
                };
                watch::keep_watching(&*api, out, &answers, &stop)
            })
            .map_err(|e| GpuError::Failed {
                what: "XID thread",
                detail: e.to_string(),
            })?;
        // The first registration answers, or the watch said down without
        // them; it says itself up once they come.
        let limit = self.first_answers_wait;
        let gave_up = || {
            let why = format!(
                "the GPUs' registration answers did not come within {limit:?} (a busy \
                 driver or GPU System Processor); the watch is down until they do"
            );
            tracing::error!("NVML XID watch: {why}");
            let _ = said.send(XidEvent::WatchDown(why));
        };
        let refused = first.wait(limit, gave_up).unwrap_or_default();
        Ok(refused
            .into_iter()
            .map(|(gpu, e)| (gpu as u8, e.into_gpu_error("nvmlDeviceRegisterEvents")))
            .collect())
    }
}

/// Where the XID watch delivers: the agent's queue, and the GPUs' flags
/// asking for their slow counters.
#[derive(Clone, Copy)]
struct Deliver<'a> {
    sink: &'a crate::xid_queue::XidSink,
    nudges: &'a [AtomicBool],
}

/// The first wait after a watch ended, or before the GPUs it refused are
/// asked again; it doubles up to [`WATCH_RETRY_MAX`].
pub const WATCH_RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest wait between restarts of the XID watch (and between two
/// registrations of a GPU refused for a reason that may pass).
pub const WATCH_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(60);
/// How long [`NvmlSource`]'s `watch_xids` waits for the first registration
/// answers before it says the watch down and returns without them.
pub const FIRST_ANSWERS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Single NVML calls, each an item of [`support::Support`].
mod call {
    use loopwarden_protocol::Unsupported;

    pub const POWER_USAGE: u16 = 1 << 0;
    pub const ENFORCED_LIMIT: u16 = 1 << 1;
    pub const LIMIT: u16 = 1 << 2;
    pub const ENERGY: u16 = 1 << 3;
    pub const CLOCKS: u16 = 1 << 4;
    pub const UTIL: u16 = 1 << 5;
    pub const THROTTLE: u16 = 1 << 6;
    pub const ECC_MODE: u16 = 1 << 7;
    /// The four ECC counters: corrected (SBE) and uncorrected (DBE), since
    /// the driver loaded (volatile) and over the GPU's life (aggregate).
    pub const ECC_SBE_VOLATILE: u16 = 1 << 8;
    pub const ECC_DBE_VOLATILE: u16 = 1 << 9;
    pub const ECC_SBE_AGGREGATE: u16 = 1 << 10;
    pub const ECC_DBE_AGGREGATE: u16 = 1 << 11;

    /// The group call `bit` is reported unsupported with (none for the
    /// limits and energy, which have no bit of their own). The aggregate
    /// ECC counters have a group of their own: a GPU lacking one still
    /// reports its volatile counts, which the health rules read.
    pub fn group(bit: u16) -> Unsupported {
        match bit {
            POWER_USAGE => Unsupported::POWER,
            CLOCKS => Unsupported::CLOCKS,
            UTIL => Unsupported::UTIL,
            THROTTLE => Unsupported::THROTTLE,
            // Without the mode no ECC count is read, of either kind.
            ECC_MODE => Unsupported::ECC | Unsupported::ECC_AGGREGATE,
            ECC_SBE_VOLATILE | ECC_DBE_VOLATILE => Unsupported::ECC,
            ECC_SBE_AGGREGATE | ECC_DBE_AGGREGATE => Unsupported::ECC_AGGREGATE,
            _ => Unsupported::empty(),
        }
    }
}

mod support;
use support::{Change, Item};

/// One GPU through NVML.
pub struct NvmlGpu<A: NvmlApi> {
    api: Arc<A>,
    index: u32,
    /// What answered "not supported", and whether it answered before.
    support: support::Support,
    /// Samples from one read of the slow counters to the next.
    slow_every: u32,
    /// Samples since the slow counters were read (`None`: never).
    since_slow: Option<u32>,
    /// The slow counters as last read.
    held: sample::Held,
    /// Set by the XID watch when this GPU reports an XID: its slow
    /// counters are read at its next sample. (The source's flags, and
    /// this GPU's index in them.)
    nudge: Option<(Arc<[AtomicBool]>, usize)>,
    /// What its calls cost (shared with the source's other GPUs).
    costs: CallCosts,
    /// Its power limit constraints (min, max) as read after NVML refused
    /// a set: a limit outside them is set to the nearer end. (Those its
    /// description read bound the shell's range, and need no keeping.)
    late: Option<(Watts, Watts)>,
    /// The last limit set otherwise than asked, or refused with its
    /// constraints unreadable, that was said (and what was set instead).
    said: Option<(Watts, Option<Watts>)>,
}

/// What [`NvmlGpu`]'s `describe` gives for a power limit NVML could not
/// read (no GPU's limit is 0 W): the shell puts the board's figure in
/// its place.
pub const UNREAD_LIMIT: Watts = Watts(0);

/// NVML's answer `e` as NVML names it.
fn nvml_said(e: &NvmlFailure) -> String {
    match e {
        NvmlFailure::NotSupported => "NVML_ERROR_NOT_SUPPORTED".into(),
        NvmlFailure::NoPermission => "NVML_ERROR_NO_PERMISSION".into(),
        NvmlFailure::GpuLost => "NVML_ERROR_GPU_IS_LOST".into(),
        NvmlFailure::Timeout => "NVML_ERROR_TIMEOUT".into(),
        NvmlFailure::InvalidArgument => "NVML_ERROR_INVALID_ARGUMENT".into(),
        NvmlFailure::Other(s) => s.clone(),
    }
}

impl<A: NvmlApi> NvmlGpu<A> {
    /// GPU `index` of `api`, reading every counter at every sample.
    pub fn new(api: Arc<A>, index: u32) -> Self {
        Self {
            api,
            index,
            support: support::Support::default(),
            slow_every: 1,
            since_slow: None,
            held: sample::Held::default(),
            nudge: None,
            costs: CallCosts::default(),
            late: None,
            said: None,
        }
    }

    /// Makes `call` (NVML's `what`) and counts what it cost, and its
    /// failure where it failed.
    fn timed<T>(
        &self,
        what: &'static str,
        call: impl FnOnce(&A, u32) -> NvmlResult<T>,
    ) -> NvmlResult<T> {
        let began = std::time::Instant::now();
        let r = call(&self.api, self.index);
        let failed = r.as_ref().err().map(NvmlFailure::kind);
        self.costs.record(what, began.elapsed(), failed);
        r
    }

    /// Reads the slow counters only every `samples` samples (at least 1;
    /// see [`sample`](GpuDevice::sample)).
    pub fn slow_every(mut self, samples: u32) -> Self {
        self.slow_every = samples.max(1);
        self
    }

    /// Counts what its calls cost on `costs` (shared with other GPUs and
    /// the XID watch; its own book otherwise).
    pub fn call_costs(mut self, costs: CallCosts) -> Self {
        self.costs = costs;
        self
    }

    /// Makes call `bit` (NVML's `what`) unless it is not to be asked now
    /// ([`support`]). "Not supported" yields `None` and is said once; any
    /// other failure is an error.
    fn ask<T>(
        &mut self,
        bit: u16,
        what: &'static str,
        call: impl FnOnce(&A, u32) -> NvmlResult<T>,
    ) -> Result<Option<T>, GpuError> {
        let item = Item::Call(bit);
        if !self.support.asks(item) {
            return Ok(None);
        }
        match self.timed(what, call) {
            Ok(v) => {
                if let Some(c) = self.support.answered(item) {
                    self.say(c, what, Unsupported::empty());
                }
                Ok(Some(v))
            }
            Err(NvmlFailure::NotSupported) => {
                if let Some(c) = self.support.not_supported(item) {
                    self.say(c, what, call::group(bit));
                }
                Ok(None)
            }
            Err(e) => Err(e.into_gpu_error(what)),
        }
    }

    /// Says `change` of `what`, which is reported with `group`.
    fn say(&self, change: Change, what: &str, group: Unsupported) {
        let i = self.index;
        let names: Vec<&str> = Unsupported::NAMES
            .iter()
            .filter(|(g, _)| group.contains(*g))
            .map(|(_, n)| *n)
            .collect();
        let reported = if names.is_empty() {
            String::new()
        } else {
            format!("; {} reported as unsupported", names.join(", "))
        };
        match change {
            Change::Unsupported if names.is_empty() => {
                tracing::info!("GPU {i}: {what} is not supported")
            }
            Change::Unsupported => {
                tracing::info!("GPU {i}: {what} is not supported{reported} from now on")
            }
            Change::Lost => tracing::warn!(
                "GPU {i}: {what} answered before and now is not supported (a driver \
                 change, or the GPU in a bad state){reported}; asked again at every \
                 read of the slow counters"
            ),
            Change::Back => tracing::info!("GPU {i}: {what} answers again"),
        }
    }
}

/// Its description's power limit reads, and its limit sets.
impl<A: NvmlApi> NvmlGpu<A> {
    /// A read of the description other than its name and UUID (a power
    /// limit, the persistence mode): `None` where NVML fails it (said,
    /// naming the call, NVML's answer and what stands `instead`), except
    /// a lost GPU, which fails the description.
    fn limit_read<T>(
        &self,
        what: &'static str,
        instead: &str,
        call: impl FnOnce(&A, u32) -> NvmlResult<T>,
    ) -> Result<Option<T>, GpuError> {
        match self.timed(what, call) {
            Ok(v) => Ok(Some(v)),
            Err(NvmlFailure::GpuLost) => Err(GpuError::Lost),
            Err(e) => {
                let i = self.index;
                tracing::warn!("GPU {i}: {what} failed ({}): {instead}", nvml_said(&e));
                Ok(None)
            }
        }
    }

    /// Sets `limit` as it is.
    fn set(&self, limit: Watts) -> Result<(), GpuError> {
        let what = SET_LIMIT_CALL;
        self.timed(what, |a, i| a.set_limit_mw(i, limit.milliwatts()))
            .map_err(|e| e.into_gpu_error(what))
    }

    /// `limit` within the constraints read after the start, where they
    /// were: the nearer end when outside them, said once per limit.
    fn within_late(&mut self, limit: Watts) -> Watts {
        let Some((min, max)) = self.late else {
            return limit;
        };
        let target = limit.max(min).min(max);
        if target != limit && self.said != Some((limit, Some(target))) {
            self.said = Some((limit, Some(target)));
            tracing::warn!(
                "GPU {}: {} W is outside its limit constraints, {} W to {} W (read after NVML \
                 refused a set): {} W is set instead",
                self.index,
                limit.0,
                min.0,
                max.0,
                target.0
            );
        }
        target
    }

    /// NVML refused `tried` (for `limit`) as invalid: the limit
    /// constraints are read again and `limit` is set within them. The refusal stands where they cannot
    /// be read (said once per limit), or where `tried` is within them.
    fn set_after_refusal(&mut self, limit: Watts, tried: Watts) -> Result<(), GpuError> {
        let what = "nvmlDeviceGetPowerManagementLimitConstraints";
        match self.timed(what, |a, i| a.limit_constraints_mw(i)) {
            Ok((min, max)) => {
                self.late = Some((
                    Watts::from_milliwatts_up(min),
                    Watts::from_milliwatts_down(max),
                ));
            }
            Err(e) => {
                if self.said != Some((limit, None)) {
                    self.said = Some((limit, None));
                    tracing::warn!(
                        "GPU {}: NVML refused {} W as invalid, and its limit constraints \
                         cannot be read ({what} failed: {}): the limit is not set",
                        self.index,
                        tried.0,
                        nvml_said(&e)
                    );
                }
                return Err(GpuError::InvalidArgument);
            }
        }
        match self.within_late(limit) {
            target if target == tried => Err(GpuError::InvalidArgument),
            target => self.set(target),
        }
    }
}

impl<A: NvmlApi> GpuDevice for NvmlGpu<A> {
    fn reprobe(&mut self) {
        if self.support.forget() {
            tracing::info!(
                "GPU {}: asking again what answered \"not supported\" (after a driver reload)",
                self.index
            );
        }
        // Everything is asked again at the next sample.
        self.since_slow = None;
        self.held = sample::Held::default();
    }

    /// The name and the UUID are read on their own: a power limit that
    /// cannot be read costs neither, and is [`UNREAD_LIMIT`] (said, with
    /// NVML's answer); a persistence mode that cannot be read is `None`
    /// (said too). Only a failed name or UUID, or a lost GPU, fails
    /// the description.
    fn describe(&mut self) -> Result<GpuInfo, GpuError> {
        let name = self
            .timed("nvmlDeviceGetName", |a, i| a.name(i))
            .map_err(|e| e.into_gpu_error("nvmlDeviceGetName"))?;
        let uuid = self
            .timed("nvmlDeviceGetUUID", |a, i| a.uuid(i))
            .map_err(|e| e.into_gpu_error("nvmlDeviceGetUUID"))?;
        let default = self.limit_read(
            "nvmlDeviceGetPowerManagementDefaultLimit",
            "the board's tdp_w stands in for its default limit",
            |a, i| a.default_limit_mw(i),
        )?;
        let range = self.limit_read(
            "nvmlDeviceGetPowerManagementLimitConstraints",
            "the board's min_cap_w to max_cap_w stands in for its range; a limit NVML \
             refuses as invalid has them read again and is set within them",
            |a, i| a.limit_constraints_mw(i),
        )?;
        let persistence = self.limit_read(
            "nvmlDeviceGetPersistenceMode",
            "whether the driver keeps this GPU initialized between the agent's runs is not \
             known (the limits it leaves may revert to the default at a restart); the start \
             is not refused for it",
            |a, i| a.persistence_mode(i),
        )?;
        // Limits in whole watts inside NVML's: a ceiling read as 450.6 W
        // is never put back as 451 W. The range just read bounds the
        // shell's limits from now on (constraints read after an earlier
        // refusal are old); unread, those read after a refusal, if any,
        // are the GPU's range.
        let (min, max) = match (range, self.late) {
            (Some((min, max)), _) => {
                self.late = None;
                (
                    Watts::from_milliwatts_up(min),
                    Watts::from_milliwatts_down(max),
                )
            }
            (None, Some(late)) => late,
            (None, None) => (UNREAD_LIMIT, UNREAD_LIMIT),
        };
        Ok(GpuInfo {
            name,
            uuid,
            default_limit: default.map_or(UNREAD_LIMIT, Watts::from_milliwatts_down),
            min_limit: min,
            max_limit: max,
            persistence,
        })
    }

    fn sample(&mut self) -> Result<GpuSample, GpuError> {
        self.read_sample()
    }

    /// A limit NVML refuses as invalid has the limit constraints read
    /// again, and is set within them (`set_after_refusal`).
    fn set_power_limit(&mut self, limit: Watts) -> Result<(), GpuError> {
        let target = self.within_late(limit);
        // Whatever was read at a description: the shell may not hold that
        // range (a description past its deadline, a GPU identified late).
        match self.set(target) {
            Err(GpuError::Nvml {
                failure: NvmlFailure::InvalidArgument,
                ..
            }) => self.set_after_refusal(limit, target),
            r => r,
        }
    }

    fn power_limit(&mut self) -> Result<Watts, GpuError> {
        let what = "nvmlDeviceGetPowerManagementLimit";
        self.timed(what, |a, i| a.limit_mw(i))
            .map(Watts::from_milliwatts_down)
            .map_err(|e| e.into_gpu_error(what))
    }
}
