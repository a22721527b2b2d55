//! What the agent needs from a GPU, behind one narrow trait.
//!
//! [`GpuDevice`] is one GPU: describe it once, sample it every period,
//! set and read back its power limit. Two implementations live side by
//! side: NVML ([`crate::nvml`]) for real GPUs and the twin
//! ([`crate::sim_gpus`]) for simulated ones. Neither is trusted to return in
//! time: the agent calls them from a [`crate::worker`] with a deadline (on
//! the worker's own thread, unless the device answers from memory).
//!
//! Glossary:
//! - *sample*: every reading of one GPU at one instant (temperatures,
//!   power, clocks, counters), in the units of the bus.
//! - *not supported*: a field this GPU (or its driver) cannot report. It is
//!   recorded once in the sample's `unsupported` set, never an error.
//! - *XID*: an error report from the NVIDIA driver, numbered by cause.

use std::fmt;

use loopwarden_protocol::{
    EccCounts, GpuFlags, MegaHertz, MemoryRepair, NvlinkErrors, Percent, ThrottleReasons,
    Unsupported, Watts, WholeCelsius,
};

/// What a GPU says about itself once, at start.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GpuInfo {
    /// Product name (`NVIDIA H200`).
    pub name: String,
    /// Stable identity (`GPU-…`), for the field engineer's records.
    pub uuid: String,
    /// NVML's default power limit, the one the GPU comes up with. Not
    /// what a clean exit puts back: that is the GPU's ceiling, the limit
    /// the site left on it (docs/node-agent.md section 5.1).
    pub default_limit: Watts,
    /// Lowest settable power limit.
    pub min_limit: Watts,
    /// Highest settable power limit.
    pub max_limit: Watts,
    /// Whether the driver keeps the GPU initialized with no client
    /// (persistence mode, nvidia-persistenced): without it the limits the
    /// agent leaves revert to the default when the agent, its last
    /// client, stops. `None`: not known (not supported, or unread).
    pub persistence: Option<bool>,
}

/// One reading of every field of a GPU. Fields in `unsupported` are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuSample {
    /// Status bits other than `responsive` (which the agent sets).
    pub flags: GpuFlags,
    /// Fields this GPU does not support.
    pub unsupported: Unsupported,
    /// Die temperature.
    pub temp: WholeCelsius,
    /// HBM temperature.
    pub mem_temp: WholeCelsius,
    /// Power draw.
    pub power: Watts,
    /// Energy since the driver loaded, millijoules; 0: not known (no
    /// `unsupported` bit covers it, and a GPU that ran has used energy).
    pub energy_mj: u64,
    /// The limit the GPU enforces now; 0 W: not known (no `unsupported`
    /// bit covers it, and no GPU is limited to 0 W). Where the enforced
    /// limit did not answer, the limit set stands in (`enforced_unread`).
    pub power_limit: Watts,
    /// The enforced limit did not answer: `power_limit` is the limit set
    /// (NVML's management limit) standing in for it, or 0 W; never to be
    /// shown as the limit the driver enforces. `false` (the default): the
    /// enforced limit (or 0 W, not known).
    pub enforced_unread: bool,
    /// SM clock.
    pub sm_clock: MegaHertz,
    /// Memory clock.
    pub mem_clock: MegaHertz,
    /// Share of the last period a kernel ran.
    pub util: Percent,
    /// Active clock-event reasons.
    pub throttle: ThrottleReasons,
    /// ECC error counts, cumulative.
    pub ecc: EccCounts,
    /// Retired pages and remapped rows.
    pub repair: MemoryRepair,
    /// PCIe replay counter, cumulative.
    pub pcie_replay: u32,
    /// NVLink error counters summed over links, cumulative.
    pub nvlink: NvlinkErrors,
    /// NVLink replays and recoveries per link, where reported.
    pub nvlink_links: node_core::health::NvlinkLinks,
    /// The recovery action the driver names for the GPU, as last read
    /// (with the slow counters); `None`: never read (not supported, or an
    /// older driver).
    pub recovery_action: Option<u8>,
    /// The PCIe replay counter is as last read at an earlier sample, not
    /// read in this one (the other slow counters, read every few samples,
    /// are said in no field: `nvml::sample`): only on a GPU whose
    /// per-sample field-value query
    /// cannot carry it (it answers none of that query's other fields), which
    /// reads it with the slow counters; `false` (the default): read in
    /// this one.
    pub pcie_held: bool,
}

/// An XID the driver reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidReport {
    /// Index of the GPU that reported it.
    pub gpu: u8,
    /// The XID number.
    pub xid: u16,
}

/// What an XID watch delivers: the XIDs, and its own state, so that a
/// watch that died is seen and said rather than read as "no XIDs".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XidEvent {
    /// An XID.
    Xid(XidReport),
    /// The watch stopped (why); it is being restarted.
    WatchDown(String),
    /// The watch runs again after a restart.
    WatchUp,
}

/// Why a GPU call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuError {
    /// The call did not return before its deadline.
    Timeout,
    /// The GPU has fallen off the bus or is otherwise lost to the driver.
    Lost,
    /// The operation is not supported by this GPU (a source that names no
    /// call, as the twins; NVML's answer is [`GpuError::Nvml`]).
    NotSupported,
    /// The agent lacks the permission (a source that names no call; NVML's
    /// answer is [`GpuError::Nvml`]).
    NoPermission,
    /// A power limit outside what the GPU accepts: refused by a twin, or
    /// by NVML as invalid and still outside the limit constraints read
    /// again.
    InvalidArgument,
    /// NVML answered the call `what` with "not supported", "no permission"
    /// or "invalid argument" (its other answers are [`GpuError::Lost`] and
    /// [`GpuError::Failed`]).
    Nvml {
        /// The NVML call (`nvmlDeviceGetTemperature`).
        what: &'static str,
        /// NVML's answer.
        failure: crate::nvml::NvmlFailure,
    },
    /// Any other failure, as the driver worded it; `what` names the call.
    Failed {
        /// The call that failed.
        what: &'static str,
        /// The driver's words.
        detail: String,
    },
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout => f.write_str("did not answer before its deadline"),
            Self::Lost => f.write_str("GPU lost (fallen off the bus)"),
            Self::NotSupported => f.write_str("not supported by this GPU"),
            Self::NoPermission => f.write_str("permission denied"),
            Self::InvalidArgument => f.write_str("power limit refused by the GPU as out of range"),
            Self::Nvml { what, failure } => {
                write!(f, "{what}: {failure}")?;
                let set = *what == crate::nvml::SET_LIMIT_CALL;
                match failure {
                    crate::nvml::NvmlFailure::NoPermission if set => {
                        f.write_str(": setting limits needs root")
                    }
                    _ => Ok(()),
                }
            }
            Self::Failed { what, detail } => write!(f, "{what} failed: {detail}"),
        }
    }
}

impl std::error::Error for GpuError {}

/// One GPU, as the agent uses it. Implementations may block (NVML can
/// hang); the agent only calls them from a worker with a deadline.
pub trait GpuDevice: Send + 'static {
    /// Identity and power-limit range; called at start, and again while
    /// its UUID is unknown (a description that failed at start).
    fn describe(&mut self) -> Result<GpuInfo, GpuError>;
    /// One reading of every field.
    fn sample(&mut self) -> Result<GpuSample, GpuError>;
    /// Asks for a power limit.
    fn set_power_limit(&mut self, limit: Watts) -> Result<(), GpuError>;
    /// The power limit set now (read back after a set).
    fn power_limit(&mut self) -> Result<Watts, GpuError>;
    /// Forgets what answered "not supported", so it is asked again: after
    /// a driver reload the answer may differ. Nothing to forget by default.
    fn reprobe(&mut self) {}
    /// Whether every call answers from memory at once: no driver, no
    /// device, no lock held for long, so no call can hang. The agent then
    /// calls it without a thread of its own, timing each call against the
    /// same deadline ([`crate::worker`]). `false` by default; NVML never.
    fn answers_in_memory(&self) -> bool {
        false
    }
}

/// Boxed devices are devices too, so the agent can hold either kind.
impl GpuDevice for Box<dyn GpuDevice> {
    fn describe(&mut self) -> Result<GpuInfo, GpuError> {
        (**self).describe()
    }
    fn sample(&mut self) -> Result<GpuSample, GpuError> {
        (**self).sample()
    }
    fn set_power_limit(&mut self, limit: Watts) -> Result<(), GpuError> {
        (**self).set_power_limit(limit)
    }
    fn power_limit(&mut self) -> Result<Watts, GpuError> {
        (**self).power_limit()
    }
    fn reprobe(&mut self) {
        (**self).reprobe()
    }
    fn answers_in_memory(&self) -> bool {
        (**self).answers_in_memory()
    }
}

/// A source of GPUs: the devices of this host and their XID events.
pub trait GpuSource {
    /// Every GPU of the host, in index order.
    fn devices(&mut self) -> Result<Vec<Box<dyn GpuDevice>>, GpuError>;
    /// Starts delivering XID events to `sink` from a thread of the
    /// source's own (a blocking wait, never on the agent's runtime), and
    /// keeps the watch running: a watch that ends is said
    /// ([`XidEvent::WatchDown`]) and restarted, and one that cannot start
    /// or register a GPU is said down on `sink` and retried (a GPU that
    /// does not support XID events is not asked again: the watch stays
    /// down), then said up ([`XidEvent::WatchUp`]) once every GPU is
    /// registered. Returns which GPUs
    /// could not be registered at the start, and why (those known, when
    /// the answers are slow). `Err` only when no watch runs at all (its
    /// thread could not start): nothing retries it, nothing is said on
    /// `sink`, and the caller says it down.
    fn watch_xids(
        &mut self,
        sink: crate::xid_queue::XidSink,
    ) -> Result<Vec<(u8, GpuError)>, GpuError>;
    /// What each driver call has cost, where the source counts it (NVML);
    /// `None` by default.
    fn call_costs(&self) -> Option<crate::nvml::CallCosts> {
        None
    }
}
