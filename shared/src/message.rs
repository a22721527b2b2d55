//! Every message of the bus.
//!
//! | kind | family | from → to | what |
//! |---|---|---|---|
//! | [`HostTelemetry`] | `telemetry` | host → all | every GPU of a host, one sample |
//! | [`HostHealth`] | `health` (retained) | host → all | each GPU's health state and why |
//! | [`Event`] | `event` | host, CDU → all | something happened (XID, state change, cap, leak, …) |
//! | [`CapLease`] | `cmd` | CDU, facility, operator → host | cap these GPUs until the lease expires |
//! | [`QuarantineRelease`] | `cmd` | operator → host | put a quarantined GPU back in service |
//! | [`Ack`] | `ack` | host, CDU → requester | the outcome of a command |
//! | [`CduTelemetry`] | `telemetry` | CDU → all | the loop's measurements and meters |
//! | [`CduState`] | `health` (retained) | CDU → hosts, all | the loop's state, per rack |
//! | [`Online`] | `online` (retained) | any → all | alive or gone (the last will) |
//!
//! Glossary:
//! - *lease*: a power cap that lapses unless its sender renews it, so a
//!   controller that dies never leaves GPUs capped.
//! - *correlation*: the sender and sequence number of a command frame, which
//!   its ack repeats so the requester can match them.
//! - *MAC*: a message authentication code proving a command came from a
//!   holder of the site key.

use heapless::Vec;
use serde::{Deserialize, Serialize};

use crate::flags::name_set;
use crate::ids::{GpuIndex, Ident, NodeId, RackIndex, Text, MAX_GPUS, MAX_RACKS};
use crate::reason::ReasonCode;
use crate::units::{
    Celsius, DurationMs, KiloPascals, LitresPerMinute, MegaHertz, Percent, Pue, TimestampMs, Watts,
    WholeCelsius,
};

mod cdu;
mod class;
mod command_auth;
mod repair;
pub use cdu::{
    CduState, CduTelemetry, FacilityOffer, FacilityPlan, FacilityState, FigureEstimate,
    HallEstimates, LeakSensing, OfferStep, PumpStatus, RackCooling, RackState, RackStatus,
    OFFER_STEPS,
};
pub use class::EventClass;
pub use command_auth::{CommandAuth, ReceivedAs};
pub use repair::{ResendCode, ResendReport, ResendRequest, RESEND_SPAN_MAX};

/// Longest evidence sentence of a health state, in bytes.
pub const EVIDENCE_MAX: usize = 96;
/// Longest free-text reason of an operator, in bytes.
pub const NOTE_MAX: usize = 96;

// ---------------------------------------------------------------- host telemetry

name_set! {
    /// State flags of one GPU sample.
    GpuFlags(u8) {
        /// The GPU answered its queries within the deadline; when clear, the
        /// other fields repeat the last good sample.
        RESPONSIVE = 0 => "responsive",
        /// A page retirement waits for the next reset.
        RETIRED_PENDING = 1 => "retired_pending",
        /// A row remap waits for the next reset.
        REMAP_PENDING = 2 => "remap_pending",
        /// Row remapping failed (no spare rows left).
        REMAP_FAILURE = 3 => "remap_failure",
        /// ECC is enabled on this GPU.
        ECC_ENABLED = 4 => "ecc_enabled",
    }
}

name_set! {
    /// Active clock-event (throttle) reasons, as NVML reports them.
    ThrottleReasons(u16) {
        /// No work: clocks are low because the GPU is idle.
        IDLE = 0 => "idle",
        /// The software power cap (the power limit in force) holds clocks down.
        SW_POWER_CAP = 1 => "sw_power_cap",
        /// Hardware slowdown (thermal or power brake), clocks halved or less.
        HW_SLOWDOWN = 2 => "hw_slowdown",
        /// Hardware slowdown because the GPU is too hot.
        HW_THERMAL_SLOWDOWN = 3 => "hw_thermal_slowdown",
        /// Hardware slowdown asserted by the external power brake.
        HW_POWER_BRAKE = 4 => "hw_power_brake",
        /// The driver holds clocks down because the GPU or memory is hot.
        SW_THERMAL_SLOWDOWN = 5 => "sw_thermal_slowdown",
        /// Clocks are held to match a sync-boost group.
        SYNC_BOOST = 6 => "sync_boost",
        /// Application clocks setting holds clocks down.
        APPLICATIONS_CLOCKS = 7 => "applications_clocks",
    }
}

name_set! {
    /// Fields of a GPU sample that this GPU does not support (NVML "not
    /// supported"). Their values are zero and mean nothing.
    Unsupported(u16) {
        /// Memory (HBM) temperature.
        MEM_TEMP = 0 => "mem_temp",
        /// Power usage.
        POWER = 1 => "power",
        /// Clocks.
        CLOCKS = 2 => "clocks",
        /// Utilisation.
        UTIL = 3 => "util",
        /// Clock-event reasons.
        THROTTLE = 4 => "throttle",
        /// ECC: the mode or a volatile count (since the driver loaded),
        /// what the health rules read.
        ECC = 5 => "ecc",
        /// Retired pages.
        RETIRED = 6 => "retired",
        /// Row remapping.
        REMAP = 7 => "remap",
        /// PCIe replay counter.
        PCIE = 8 => "pcie",
        /// NVLink error counters.
        NVLINK = 9 => "nvlink",
        /// The aggregate ECC counts (over the GPU's life): a group of its
        /// own, so a GPU lacking them still shows its volatile counts. Set
        /// with `ecc` when the mode is not supported (no count is read).
        ECC_AGGREGATE = 10 => "ecc_aggregate",
    }
}

/// ECC error counts since the driver loaded (volatile) and over the GPU's
/// life (aggregate), as NVML counts them: cumulative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct EccCounts {
    /// Corrected (single-bit) errors since the driver loaded.
    pub sbe_volatile: u32,
    /// Uncorrected (double-bit) errors since the driver loaded.
    pub dbe_volatile: u32,
    /// Corrected errors over the GPU's life.
    pub sbe_aggregate: u32,
    /// Uncorrected errors over the GPU's life.
    pub dbe_aggregate: u32,
}

/// Memory repair counters: pages retired (pre-Ampere mechanism) and rows
/// remapped (Ampere and newer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct MemoryRepair {
    /// Pages retired for single-bit errors.
    pub retired_sbe: u16,
    /// Pages retired for double-bit errors.
    pub retired_dbe: u16,
    /// Rows remapped for correctable errors.
    pub remap_correctable: u16,
    /// Rows remapped for uncorrectable errors.
    pub remap_uncorrectable: u16,
}

/// NVLink error counters, summed over the GPU's links, cumulative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct NvlinkErrors {
    /// Data CRC errors (NVML's `NVLINK_CRC_DATA` counters).
    pub crc: u32,
    /// Replay errors.
    pub replay: u32,
    /// Recovery errors.
    pub recovery: u32,
}

/// One GPU in a telemetry frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct GpuTelemetry {
    /// The GPU's index on its host.
    pub gpu: GpuIndex,
    /// Responsive, pending repairs, ECC mode.
    pub flags: GpuFlags,
    /// Fields this GPU does not support.
    pub unsupported: Unsupported,
    /// Die temperature.
    pub temp: WholeCelsius,
    /// Memory (HBM) temperature.
    pub mem_temp: WholeCelsius,
    /// Power draw.
    pub power: Watts,
    /// The power limit the GPU enforces now.
    pub power_limit: Watts,
    /// Streaming-multiprocessor clock.
    pub sm_clock: MegaHertz,
    /// Memory clock.
    pub mem_clock: MegaHertz,
    /// Share of the last period a kernel ran.
    pub util: Percent,
    /// Active clock-event reasons.
    pub throttle: ThrottleReasons,
    /// ECC counters.
    pub ecc: EccCounts,
    /// Memory repair counters.
    pub repair: MemoryRepair,
    /// PCIe replay counter, cumulative.
    pub pcie_replay: u32,
    /// NVLink error counters.
    pub nvlink: NvlinkErrors,
}

/// One sample of every GPU of a host (family `telemetry`, QoS 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct HostTelemetry {
    /// Up to 16 GPUs, in index order.
    #[cfg_attr(
        feature = "std",
        schemars(with = "std::vec::Vec<GpuTelemetry>", length(max = 16))
    )]
    pub gpus: Vec<GpuTelemetry, MAX_GPUS>,
    /// What the agent's bounded queues dropped since it started (since
    /// 2.1; a 2.0 frame reads as all 0).
    #[serde(default)]
    pub drops: QueueDrops,
}

/// Counts of what a host agent's bounded queues dropped since it started,
/// each saturating at `u32::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct QueueDrops {
    /// XID events the queue between the driver's watch and the agent's
    /// loop dropped in storms (benign ones only).
    pub xids: u32,
    /// Events neither logged nor published because the flash thread's
    /// queue was full.
    pub flash: u32,
    /// Frames the bus client dropped (its queue full, or stale telemetry
    /// while the broker was away).
    pub bus: u32,
    /// Acks to refused commands withheld by the per-sender rate limit (a
    /// flood of forged commands), since 2.7; a 2.6 frame reads as 0.
    #[serde(default)]
    pub acks_withheld: u32,
}

// ---------------------------------------------------------------- health

/// A GPU's health, in rising order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// In service.
    Healthy,
    /// In service, marked for maintenance: no new long jobs once drained.
    Degraded,
    /// Out of service now.
    Quarantined,
}

/// One GPU's health and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct GpuHealth {
    /// The GPU.
    pub gpu: GpuIndex,
    /// Its state.
    pub state: HealthState,
    /// Why it is in that state.
    pub reason: ReasonCode,
    /// When it entered that state.
    pub since: TimestampMs,
    /// The sentence a field engineer reads.
    pub evidence: Text<EVIDENCE_MAX>,
}

/// The health of every GPU of a host (family `health`, retained, QoS 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct HostHealth {
    /// Up to 16 GPUs, in index order.
    #[cfg_attr(
        feature = "std",
        schemars(with = "std::vec::Vec<GpuHealth>", length(max = 16))
    )]
    pub gpus: Vec<GpuHealth, MAX_GPUS>,
    /// How well the agent can watch them now.
    pub monitoring: Monitoring,
}

/// How well a host's agent can watch its GPUs: what it cannot see is
/// said, not taken for health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct Monitoring {
    /// Since when every GPU has been silent together (the driver or the
    /// host stalls, no GPU is blamed); `None` while they answer.
    pub stalled_since: Option<TimestampMs>,
    /// Since when the XID watch has been down (restarting); `None` while
    /// it runs.
    pub xid_watch_down_since: Option<TimestampMs>,
}

// ---------------------------------------------------------------- events

/// Who asked for a power cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CapSource {
    /// The host's own thermal guard (needs no bus).
    ThermalGuard,
    /// The cooling controller of the host's loop.
    Cooling,
    /// A facility power budget.
    FacilityBudget,
    /// An operator.
    Operator,
}

/// The operating mode of a cooling controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CduMode {
    /// Pumps on, conservative setpoint, waiting for every required sensor.
    Boot,
    /// Optimising within the GPUs' margins.
    Normal,
    /// Capacity short: caps requested.
    Degraded,
    /// Sensors lost or implausible: fixed safe setpoints.
    Failsafe,
}

/// A pump of the CDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub enum Pump {
    /// Pump A.
    A,
    /// Pump B.
    B,
}

/// A sensor of the CDU or its board.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Sensor {
    /// Secondary supply temperature.
    SupplyTemp,
    /// Secondary return temperature.
    ReturnTemp,
    /// Secondary flow.
    Flow,
    /// Loop differential pressure.
    DiffPressure,
    /// Facility water supply temperature.
    FacilitySupplyTemp,
    /// Reservoir level.
    ReservoirLevel,
    /// Pump speed feedback.
    PumpFeedback,
    /// A rack's leak input.
    LeakInput,
    /// IT power meter.
    ItPower,
    /// Cooling plant power meter.
    CoolingPower,
    /// Facility power meter.
    FacilityPower,
    /// Outdoor air temperature (the dry cooler's, or the BMS's).
    OutdoorTemp,
    /// A rack valve's position input (since 2.5).
    ValvePosition,
}

/// What is wrong with a sensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SensorFault {
    /// Its reading stopped changing while others moved.
    Stuck,
    /// Its reading drifts away from what the others imply.
    Drift,
    /// It stopped answering.
    Lost,
    /// Its reading is impossible (out of range, against physics).
    Implausible,
    /// It reads plausibly again.
    Cleared,
}

/// Something that happened (family `event`, QoS 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// The driver reported an XID on a GPU.
    Xid {
        /// The GPU.
        gpu: GpuIndex,
        /// The XID number.
        xid: u16,
    },
    /// A GPU's health state changed.
    HealthChanged {
        /// The GPU.
        gpu: GpuIndex,
        /// The state before.
        from: HealthState,
        /// The state now.
        to: HealthState,
        /// Why.
        reason: ReasonCode,
    },
    /// The power limit in force on a GPU changed (read back from the GPU).
    /// Hosts of 2.4 send [`Event::CapsApplied`] instead.
    CapApplied {
        /// The GPU.
        gpu: GpuIndex,
        /// The limit in force now.
        limit: Watts,
        /// The source whose cap is the lowest, or `None` when no cap is in force.
        source: Option<CapSource>,
    },
    /// A quarantine action (drain command) ran.
    QuarantineAction {
        /// The GPU.
        gpu: GpuIndex,
        /// It exited with status 0 within its timeout.
        ok: bool,
        /// Its exit status, if it exited.
        exit_code: Option<i32>,
    },
    /// An operator released a quarantined GPU.
    QuarantineReleased {
        /// The GPU.
        gpu: GpuIndex,
        /// Who released it.
        operator: Ident,
        /// Why, in the operator's words.
        note: Text<NOTE_MAX>,
    },
    /// GPUs heat up because of the cooling, not because of a GPU fault:
    /// none of them is degraded or quarantined for it.
    CoolingAttributed {
        /// The GPUs affected, one bit per index.
        gpus: u16,
        /// What the cooling reported.
        reason: ReasonCode,
    },
    /// A leak was detected or cleared on a rack.
    Leak {
        /// The rack.
        rack: RackIndex,
        /// Detected (`true`) or cleared (`false`).
        active: bool,
    },
    /// The cooling controller changed mode (including into failsafe).
    CduModeChanged {
        /// The mode before.
        from: CduMode,
        /// The mode now.
        to: CduMode,
        /// Why.
        reason: ReasonCode,
    },
    /// A pump tripped.
    PumpTrip {
        /// The pump that tripped.
        pump: Pump,
        /// The lag pump was started.
        lag_started: bool,
    },
    /// A sensor fault was found or cleared.
    SensorFault {
        /// The sensor.
        sensor: Sensor,
        /// Its rack, for per-rack sensors.
        rack: Option<RackIndex>,
        /// What is wrong.
        fault: SensorFault,
    },
    /// A pump reported running but moved no water: it is out of service
    /// until an operator clears it.
    PumpSeized {
        /// The pump.
        pump: Pump,
        /// The lag pump was started.
        lag_started: bool,
    },
    /// A rack's leak sensing was lost (its rope cut or shorted, the board's
    /// input lines failing) or came back.
    LeakSensing {
        /// The rack.
        rack: RackIndex,
        /// Lost (`true`) or back (`false`).
        lost: bool,
    },
    /// A leaking rack's valve did not confirm closed in time: the
    /// secondary pumps were stopped and every host capped (`active`), or
    /// the rack is isolated at last (`!active`).
    IsolationFailed {
        /// The rack.
        rack: RackIndex,
        /// The escalation began (`true`) or ended (`false`).
        active: bool,
    },
    /// The controller started and restored what it had latched from its
    /// flash before its first command.
    ControllerRestored {
        /// Racks with a latched leak, bit n = rack n.
        leaks_latched: u16,
        /// Pumps out of service (bit 0: A, bit 1: B).
        pumps_out: u8,
        /// The lead pump.
        lead: Pump,
    },
    /// An operator cleared a latch: a rack's leak, or a pump's fault.
    OperatorCleared {
        /// The rack whose leak was cleared, if a leak.
        rack: Option<RackIndex>,
        /// The pump put back in service, if a pump.
        pump: Option<Pump>,
        /// Who asked (a console peer's user, or a serial login).
        operator: Ident,
    },
    /// Every GPU of the host stopped answering together: a driver or host
    /// stall, not a GPU fault.
    HostStalled {
        /// The silent GPUs, one bit per index.
        gpus: u16,
        /// The first missed sample.
        since: TimestampMs,
    },
    /// The host's GPUs answer again after a stall.
    HostResumed {
        /// When the stall began.
        stalled_since: TimestampMs,
    },
    /// The XID watch stopped (`running: false`; it is being restarted,
    /// and XIDs are not seen meanwhile) or runs again.
    XidWatch {
        /// Whether it runs now.
        running: bool,
    },
    /// The host ran one of its cooling-loss actions (since 2.1): its
    /// CDU said its rack lost cooling, or that cooling is back.
    CoolingAction {
        /// Which action.
        step: CoolingStep,
        /// It exited with status 0 within its timeout.
        ok: bool,
        /// Its exit status, if it exited.
        exit_code: Option<i32>,
    },
    /// The power limit in force on some GPUs changed, to the same limit
    /// and source on each (read back from each GPU), as one change (since
    /// 2.4; a host of 2.3 or older sends a `CapApplied` per GPU instead).
    CapsApplied {
        /// The GPUs, one bit per index.
        gpus: u16,
        /// The limit in force now on each.
        limit: Watts,
        /// The source whose cap is the lowest, or `None` when no cap is in force.
        source: Option<CapSource>,
    },
    /// A setting the cooling controller wanted lies outside what the CDU's
    /// register map accepts: the map's nearest bound is written instead
    /// (`active`), or the wanted value fits again (`!active`). Since 2.5.
    SettingLimited {
        /// Which setting.
        setting: CduSetting,
        /// What the controller wanted, in hundredths of the setting's
        /// unit (°C for the setpoint, % for the pump speed).
        wanted_centi: i32,
        /// What was written instead, in the same hundredths.
        written_centi: i32,
        /// The limit began (`true`) or ended (`false`).
        active: bool,
    },
    /// The highest limit a host sets on some GPUs (its *ceiling*: the
    /// limit they run at uncapped) changed, because a limit was found on
    /// them that the host did not set (an administrator's `nvidia-smi
    /// -pl`, while it ran or while it was stopped). The host never sets
    /// them above `ceiling` and puts it back when it stops with no lease
    /// in force. Since 2.6.
    PowerCeiling {
        /// The GPUs, one bit per index.
        gpus: u16,
        /// The ceiling now (within the board's settable range and any
        /// configured site limit).
        ceiling: Watts,
        /// The ceiling before.
        was: Watts,
    },
}

/// A CDU setting the cooling controller writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CduSetting {
    /// The supply temperature setpoint, °C.
    SupplySetpoint,
    /// The pump speed command, %.
    PumpSpeed,
}

/// A host's actions on cooling loss, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CoolingStep {
    /// The rack lost cooling: take no new work (a scheduler drain).
    Drain,
    /// The grace period is over: power the GPUs down or the host off.
    PowerDown,
    /// Cooling is back: power up what was powered down.
    PowerUp,
    /// Cooling is back: take work again (undo the drain).
    Resume,
}

// ---------------------------------------------------------------- commands

/// Which GPUs a cap applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum GpuSelector {
    /// Every GPU of the host.
    All,
    /// One GPU.
    Gpu(GpuIndex),
}

/// A power limit for some GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct GpuCap {
    /// The GPUs.
    pub gpus: GpuSelector,
    /// The highest power limit allowed.
    pub limit: Watts,
}

/// Cap these GPUs until the lease expires (family `cmd`, QoS 1). A new lease
/// from the same sender with the same id renews or replaces it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct CapLease {
    /// The sender's lease id.
    pub lease: u32,
    /// Who asks.
    pub source: CapSource,
    /// Why.
    pub reason: ReasonCode,
    /// The caps, per GPU or for all.
    #[cfg_attr(
        feature = "std",
        schemars(with = "std::vec::Vec<GpuCap>", length(max = 16))
    )]
    pub caps: Vec<GpuCap, MAX_GPUS>,
    /// How long the lease holds from the frame's timestamp.
    pub duration: DurationMs,
    /// The sender's proof of authority.
    pub auth: CommandAuth,
}

/// Put a quarantined GPU back in service (family `cmd`, QoS 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct QuarantineRelease {
    /// The GPU.
    pub gpu: GpuIndex,
    /// Who releases it.
    pub operator: Ident,
    /// Why, in the operator's words (required, logged and published).
    pub note: Text<NOTE_MAX>,
    /// The operator's proof of authority.
    pub auth: CommandAuth,
}

/// The outcome of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum AckCode {
    /// Done as asked; the values in force follow.
    Ok,
    /// Done, but a cap below the GPU's minimum was raised to the minimum,
    /// or the lease shortened to the host's longest (the detail says
    /// which).
    Clamped,
    /// No such GPU on this host.
    UnknownGpu,
    /// The command could not be decoded or makes no sense.
    Malformed,
    /// The lease had already expired when it arrived.
    Expired,
    /// The signature did not verify, or the key is unknown.
    Unauthenticated,
    /// The sequence number was not above the last one seen from the sender.
    Replayed,
    /// The device refused or failed to apply it (the detail says what).
    Failed,
    /// This node does not take this command.
    Unsupported,
    /// The GPU is not quarantined (nothing to release).
    NotQuarantined,
    /// The lease is longer than this host takes (hosts now shorten such a
    /// lease and answer [`AckCode::Clamped`]; kept for older hosts).
    TooLong,
    /// This host already holds as many leases as it takes.
    TooMany,
    /// Authentic, but its signer may not do this (for this host).
    Forbidden,
}

/// How the detail of a [`AckCode::Clamped`] ack begins when the host took
/// the lease for less time than it asked (its `max_lease_ms`): its sender
/// tells it from a cap raised to a GPU's minimum by this.
pub const LEASE_SHORTENED: &str = "shortened from ";

/// Whose command an ack answers: the command frame's sender and sequence.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct Correlation {
    /// The command's sender.
    pub from: NodeId,
    /// The command frame's sequence number.
    pub seq: u32,
}

/// The outcome of a command (family `ack`, QoS 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct Ack {
    /// The command answered.
    pub correlation: Correlation,
    /// The outcome.
    pub code: AckCode,
    /// The power limits in force after the command, read back from the GPUs.
    #[cfg_attr(
        feature = "std",
        schemars(with = "std::vec::Vec<GpuCap>", length(max = 16))
    )]
    pub in_force: Vec<GpuCap, MAX_GPUS>,
    /// What went wrong, in words, when `code` is not `ok`.
    pub detail: Text<NOTE_MAX>,
}

// ---------------------------------------------------------------- presence

/// Where a sender's timestamps come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ClockSource {
    /// Milliseconds since the Unix epoch, from a synchronised clock.
    UnixEpoch,
    /// Milliseconds since the sender booted (no real-time clock).
    SinceBoot,
}

/// Alive or gone (family `online`, retained, QoS 1). The broker publishes
/// the sender's `online: false` copy as its last will when it vanishes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct Online {
    /// Alive.
    pub online: bool,
    /// The sender's software version.
    pub software: Text<24>,
    /// When the sender started.
    pub started: TimestampMs,
    /// Where its timestamps come from.
    pub clock: ClockSource,
}
