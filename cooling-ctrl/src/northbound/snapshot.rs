//! The snapshot: one control step as the BMS sees it, in plain values
//! ([`NorthboundSnapshot`], filled by [`snapshot_from`]), the BMS's
//! settings in force ([`NorthboundSettings`]) and the writes it may ask
//! ([`NorthboundWrite`]).

use core::fmt;

use loopwarden_protocol::message::{CduMode, Pump, SensorFault};
use loopwarden_protocol::ReasonCode;
use tokio::sync::watch;

use super::alarms::Alarms;
use crate::modbus::CduMeasurements;
use cooling_core::sensors::Which;
use cooling_core::{Commands, Core, CoreConfig, HostReport};

/// Bit of [`NorthboundSnapshot::sensor_faults`]: the controller holds
/// sensor `n` faulty (`1 << n`, `n` as [`Which`]).
pub const FAULT_BIT: u16 = 1;
/// Bit of [`NorthboundSnapshot::sensor_faults`]: sensor `n` reads not
/// available (`NOT_AVAILABLE_BIT << n`).
pub const NOT_AVAILABLE_BIT: u16 = 1 << 8;

/// Bits of [`NorthboundSnapshot::pumps`].
pub mod pump_bits {
    /// Pump A running (contactor feedback).
    pub const A_RUNNING: u16 = 1 << 0;
    /// Pump B running.
    pub const B_RUNNING: u16 = 1 << 1;
    /// Pump A failed (tripped, out of service).
    pub const A_FAILED: u16 = 1 << 2;
    /// Pump B failed.
    pub const B_FAILED: u16 = 1 << 3;
    /// Pump A commanded on.
    pub const A_ON: u16 = 1 << 4;
    /// Pump B commanded on.
    pub const B_ON: u16 = 1 << 5;
}

/// One control step as the BMS sees it: plain values, filled by the shell
/// after each step (see [`snapshot_from`]). `None`: not available (the
/// register reads its type's sentinel).
#[derive(Debug, Clone, PartialEq)]
pub struct NorthboundSnapshot {
    /// The mode.
    pub mode: CduMode,
    /// Why.
    pub reason: ReasonCode,
    /// Seconds since the mode last changed.
    pub seconds_in_mode: u32,
    /// Seconds since the shell started, at this step (the heartbeat).
    pub uptime_s: u32,
    /// Supply setpoint in force, °C: the last the CDU took, never one it
    /// refused or did not answer (not a number: none taken yet, the
    /// register reads its sentinel).
    pub setpoint_c: f32,
    /// Secondary supply temperature, °C.
    pub supply_c: Option<f32>,
    /// Secondary return temperature, °C.
    pub return_c: Option<f32>,
    /// Secondary flow, L/min.
    pub flow_lpm: Option<f32>,
    /// Facility water supply temperature, °C.
    pub facility_supply_c: Option<f32>,
    /// Bit n ([`FAULT_BIT`] << n): sensor n (as [`Which`]) stands under a
    /// fault; bit 8 + n ([`NOT_AVAILABLE_BIT`] << n): it reads not
    /// available.
    pub sensor_faults: u16,
    /// Pump bits ([`pump_bits`]).
    pub pumps: u16,
    /// Lead pump: 0 A, 1 B.
    pub lead_pump: u8,
    /// Pump speed commanded, %.
    pub pump_speed_pct: f32,
    /// Rack valves open, bit n = rack n.
    pub valves_open: u16,
    /// Racks whose cooling is lost, bit n = rack n.
    pub cooling_lost: u16,
    /// Racks with a latched leak, bit n = rack n.
    pub leaks_latched: u16,
    /// Racks whose leak sensing is lost, bit n = rack n.
    pub leak_sensing_lost: u16,
    /// Racks whose isolation failed, bit n = rack n.
    pub isolation_failed: u16,
    /// Hosts under a cooling cap.
    pub hosts_capped: u16,
    /// The lowest per-GPU cap asked of a host, W (`None`: no cap).
    pub lowest_cap_w: Option<f32>,
    /// The hottest GPU among fresh host reports, °C.
    pub hottest_gpu_c: Option<f32>,
    /// The optimiser's proposed supply setpoint, °C (not a number: not
    /// known).
    pub proposed_setpoint_c: f32,
    /// The optimiser's proposed pump speed, % (not a number: not known).
    pub proposed_speed_pct: f32,
    /// Heat rejection is believed short (`None`: not known, as on a
    /// gateway, where the optimiser's belief stays on the microcontroller).
    pub rejection_short: Option<bool>,
    /// The alarm beacon is on.
    pub beacon: bool,
    /// The CDU answered but did not take every write of the step (the
    /// beacon lights for it whatever reason the mode shows). On a
    /// gateway: as the MCU's status tells it (not every write of its step
    /// went in while the CDU answered).
    pub cdu_refuses_writes: bool,
    /// Live PUE (facility power / IT power).
    pub pue: Option<f64>,
    /// IT power meter, W.
    pub it_w: Option<f64>,
    /// Facility power meter, W.
    pub facility_w: Option<f64>,
    /// Cooling plant power meter, W.
    pub cooling_w: Option<f64>,
    /// The BMS's settings in force.
    pub settings: NorthboundSettings,
    /// What it shows alarming, set as it is published
    /// ([`AlarmAck::shown`](super::AlarmAck::shown)); an `alarm_ack`
    /// written against it acknowledges this ([`NorthboundWrite::AlarmAck`]).
    /// No register reads it.
    pub alarms: Alarms,
}

impl Default for NorthboundSnapshot {
    /// Before the first step (and on a gateway before the MCU's first
    /// status): booting, nothing measured, nothing commanded or proposed
    /// yet (the setpoint, the proposals and `rejection_short` read not
    /// available, never 0), no valve known shut: every bit of
    /// `valves_open` set, the racks not known here
    /// ([`NorthboundSnapshot::booting`] sets those of a CDU's racks).
    fn default() -> Self {
        Self {
            mode: CduMode::Boot,
            reason: ReasonCode::BOOTING,
            seconds_in_mode: 0,
            uptime_s: 0,
            setpoint_c: f32::NAN,
            supply_c: None,
            return_c: None,
            flow_lpm: None,
            facility_supply_c: None,
            sensor_faults: sensors(None, [None; 4]).1,
            pumps: 0,
            lead_pump: 0,
            pump_speed_pct: 0.0,
            valves_open: u16::MAX,
            cooling_lost: 0,
            leaks_latched: 0,
            leak_sensing_lost: 0,
            isolation_failed: 0,
            hosts_capped: 0,
            lowest_cap_w: None,
            hottest_gpu_c: None,
            proposed_setpoint_c: f32::NAN,
            proposed_speed_pct: f32::NAN,
            rejection_short: None,
            beacon: false,
            cdu_refuses_writes: false,
            pue: None,
            it_w: None,
            facility_w: None,
            cooling_w: None,
            settings: NorthboundSettings::default(),
            alarms: Alarms::default(),
        }
    }
}

/// What the BMS has set, as the shell holds it (the holding registers read
/// these).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NorthboundSettings {
    /// Highest supply setpoint the optimiser may propose, °C.
    pub setpoint_ceiling_c: f32,
    /// Offset to the plan ceiling, K (0 or below).
    pub plan_ceiling_offset_k: f32,
    /// The standing alarms are acknowledged (the shell clears it when a
    /// new alarm rises).
    pub alarm_acknowledged: bool,
    /// The outdoor temperature the BMS wrote, °C, while it is in force
    /// (the shell drops it 300 s after the last write; `None`: none).
    pub outdoor_c: Option<f32>,
}

impl Default for NorthboundSettings {
    /// No ceiling below the map's highest (45 °C), no offset, nothing
    /// acknowledged, no outdoor temperature.
    fn default() -> Self {
        Self {
            setpoint_ceiling_c: 45.0,
            plan_ceiling_offset_k: 0.0,
            alarm_acknowledged: false,
            outdoor_c: None,
        }
    }
}

impl NorthboundSettings {
    /// The settings before the BMS wrote any: the ceiling at the CDU's
    /// highest setpoint, no offset.
    pub fn new(cfg: &CoreConfig) -> Self {
        Self {
            setpoint_ceiling_c: cfg.cdu.max_setpoint_c,
            ..Self::default()
        }
    }

    /// Takes an accepted write.
    pub fn apply(&mut self, w: NorthboundWrite) {
        match w {
            NorthboundWrite::SetpointCeiling { celsius } => self.setpoint_ceiling_c = celsius,
            NorthboundWrite::PlanCeilingOffset { kelvin } => self.plan_ceiling_offset_k = kelvin,
            NorthboundWrite::AlarmAck { .. } => self.alarm_acknowledged = true,
            NorthboundWrite::OutdoorTemp { celsius } => self.outdoor_c = Some(celsius),
        }
    }

    /// Whether these settings hold what `w` wrote, so the holding
    /// registers read it back. The values are compared exactly: the shell
    /// and the gateway keep the very value the server decoded.
    pub fn shows(&self, w: NorthboundWrite) -> bool {
        match w {
            NorthboundWrite::SetpointCeiling { celsius } => self.setpoint_ceiling_c == celsius,
            NorthboundWrite::PlanCeilingOffset { kelvin } => self.plan_ceiling_offset_k == kelvin,
            NorthboundWrite::AlarmAck { .. } => self.alarm_acknowledged,
            NorthboundWrite::OutdoorTemp { celsius } => self.outdoor_c == Some(celsius),
        }
    }
}

/// A write the server accepted (within the map's range), for the shell to
/// apply.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NorthboundWrite {
    /// `setpoint_ceiling`: the optimiser proposes no supply setpoint
    /// above this, °C.
    SetpointCeiling {
        /// °C.
        celsius: f32,
    },
    /// `plan_ceiling_offset`: added to the plan ceiling, K (0 or below).
    PlanCeilingOffset {
        /// K.
        kelvin: f32,
    },
    /// `alarm_ack` written 1: the standing alarms are acknowledged, as
    /// far as the BMS had read them.
    AlarmAck {
        /// What the registers showed alarming as the server took the
        /// write ([`NorthboundSnapshot::alarms`]): the acknowledgement
        /// covers no more ([`AlarmAck::acknowledge`](super::AlarmAck::acknowledge)).
        /// [`decode_write`](super::decode_write) leaves it empty, which
        /// acknowledges nothing while anything is alarming; the server
        /// sets it ([`NorthboundWrite::seeing`]).
        seen: Alarms,
    },
    /// `outdoor_temp`: the outdoor temperature as the BMS measures it,
    /// °C; used while the CDU's own sensor does not read, for 300 s after
    /// the write.
    OutdoorTemp {
        /// °C.
        celsius: f32,
    },
}

impl NorthboundWrite {
    /// The write, an `alarm_ack` written against registers that showed
    /// `alarms` alarming; any other as it is.
    pub fn seeing(self, alarms: Alarms) -> Self {
        match self {
            Self::AlarmAck { .. } => Self::AlarmAck { seen: alarms },
            w => w,
        }
    }
}

impl fmt::Display for NorthboundWrite {
    /// The write in words, for the log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SetpointCeiling { celsius } => write!(f, "setpoint ceiling {celsius} °C"),
            Self::PlanCeilingOffset { kelvin } => write!(f, "plan ceiling offset {kelvin} K"),
            Self::AlarmAck { .. } => f.write_str("alarm acknowledged"),
            Self::OutdoorTemp { celsius } => write!(f, "outdoor temperature {celsius} °C"),
        }
    }
}

impl NorthboundSnapshot {
    /// Before the first step (or the MCU's first status) of a CDU of
    /// `racks`: as [`NorthboundSnapshot::default`], every valve of its
    /// racks open ([`valves_shown`]: none is known shut).
    pub fn booting(racks: u8) -> Self {
        Self {
            valves_open: valves_shown(None, racks),
            ..Self::default()
        }
    }
}

/// A snapshot channel: the sender to the shell, the receiver to [`serve`](super::server::serve).
pub fn snapshot_channel() -> (
    watch::Sender<NorthboundSnapshot>,
    watch::Receiver<NorthboundSnapshot>,
) {
    watch::channel(NorthboundSnapshot::default())
}

/// A snapshot channel of a CDU of `racks`, booting
/// ([`NorthboundSnapshot::booting`]) until the shell sends one.
pub fn snapshot_channel_of(
    racks: u8,
) -> (
    watch::Sender<NorthboundSnapshot>,
    watch::Receiver<NorthboundSnapshot>,
) {
    watch::channel(NorthboundSnapshot::booting(racks))
}

/// The pump bits ([`pump_bits`]) of the readings, the pumps out of
/// service (`failed`) and the pumps commanded `on`.
pub(crate) fn pump_word(
    readings: Option<&CduMeasurements>,
    failed: [bool; 2],
    on: [bool; 2],
) -> u16 {
    let running = |i: usize| readings.and_then(|r| r.pumps_running[i]).unwrap_or(false);
    [
        (running(0), pump_bits::A_RUNNING),
        (running(1), pump_bits::B_RUNNING),
        (failed[0], pump_bits::A_FAILED),
        (failed[1], pump_bits::B_FAILED),
        (on[0], pump_bits::A_ON),
        (on[1], pump_bits::B_ON),
    ]
    .iter()
    .filter(|(set, _)| *set)
    .fold(0, |w, (_, bit)| w | bit)
}

/// The four supervised sensors as the BMS reads them, from `readings`
/// and the fault each stands under (`faults`, in [`Which`]'s order):
/// supply, return, flow and facility supply (°C, L/min), and the sensor
/// fault word ([`FAULT_BIT`], [`NOT_AVAILABLE_BIT`]). A reading is not
/// available when there is none, it is outside any plausible reading
/// (not a number, or a CDU's sentinel), or its sensor is held lost.
pub(crate) fn sensors(
    readings: Option<&CduMeasurements>,
    faults: [Option<SensorFault>; 4],
) -> ([Option<f32>; 4], u16) {
    let value: [fn(&CduMeasurements) -> Option<f64>; 4] = [
        |r| r.supply_c,
        |r| r.return_c,
        |r| r.flow_lpm,
        |r| r.facility_supply_c,
    ];
    let mut word = 0u16;
    let mut out = [None; 4];
    for w in Which::ALL {
        let i = w as usize;
        let fault = faults[i];
        if fault.is_some_and(|f| f != SensorFault::Cleared) {
            word |= FAULT_BIT << (w as u16);
        }
        // A value out of the plausible range (a sentinel) is none, at
        // once: the supervision confirms its fault only later.
        out[i] = crate::shell::shown(w, readings.and_then(value[i]), fault).map(|x| x as f32);
        if out[i].is_none() {
            word |= NOT_AVAILABLE_BIT << (w as u16);
        }
    }
    (out, word)
}

/// The power meters as the BMS reads them (one that is not a number, or
/// below 0, is not available) and the PUE.
pub(crate) struct Meters {
    /// IT power, W.
    pub(crate) it_w: Option<f64>,
    /// Facility power, W.
    pub(crate) facility_w: Option<f64>,
    /// Cooling plant power, W.
    pub(crate) cooling_w: Option<f64>,
    /// Facility power over IT power.
    pub(crate) pue: Option<f64>,
}

impl Meters {
    /// The meters of `readings`.
    pub(crate) fn of(readings: Option<&CduMeasurements>) -> Self {
        let meter = |v: fn(&CduMeasurements) -> Option<f64>| {
            readings.and_then(v).filter(|x| x.is_finite() && *x >= 0.0)
        };
        let it_w = meter(|r| r.it_w);
        let facility_w = meter(|r| r.facility_w);
        let pue = match (it_w, facility_w) {
            (Some(it), Some(f)) if it > 0.0 => Some(f / it),
            _ => None,
        };
        Self {
            it_w,
            facility_w,
            cooling_w: meter(|r| r.cooling_w),
            pue,
        }
    }
}

/// The hottest GPU among the host reports at most `timeout_ms` old at
/// `now_ms`, °C.
fn hottest_fresh(hosts: &[Option<HostReport>], now_ms: u64, timeout_ms: u64) -> Option<f32> {
    hosts
        .iter()
        .flatten()
        .filter(|r| {
            r.gpus > 0 && r.hottest_c.is_finite() && now_ms.saturating_sub(r.at_ms) <= timeout_ms
        })
        .map(|r| r.hottest_c)
        .reduce(f32::max)
}

/// The valves open as the CDU has them (bit n = rack n, of `racks`): as
/// `r` reads their positions, else as it last took them (`taken`; with
/// the CDU silent too: the last it took); `None` when neither is known
/// (before a valve write went in, on a map without positions). A close
/// the CDU did not take is not shown as done. `ctl status` and the
/// `valves_open` register both show this.
pub fn valves_held(r: Option<&CduMeasurements>, taken: Option<u16>, racks: u8) -> Option<u16> {
    let all = cooling_core::safety::all_racks(usize::from(racks));
    r.and_then(|r| r.valves_closed)
        .map(|closed| !closed & all)
        .or(taken)
}

/// What the `valves_open` register shows of the valves `held`
/// ([`valves_held`]): them, or, when they are not known, every valve of
/// `racks` open (a bit word has no "not available", and a valve not
/// known shut is never shown shut).
pub fn valves_shown(held: Option<u16>, racks: u8) -> u16 {
    held.unwrap_or_else(|| cooling_core::safety::all_racks(usize::from(racks)))
}

/// What the CDU took of a step's writes, as the decision path holds it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CduTook {
    /// The valves the CDU last took (`None` before a valve write of this
    /// run went in).
    pub valves: Option<u16>,
    /// Every write of the step went in (or there was none to fail).
    pub all: bool,
    /// The supply setpoint the CDU last took, as written, °C (`None`
    /// before a setpoint write of this run went in): the one in force.
    pub setpoint_c: Option<f32>,
}

impl CduTook {
    /// Every write went in, no valve or setpoint write yet.
    pub const ALL: CduTook = CduTook {
        valves: None,
        all: true,
        setpoint_c: None,
    };
}

/// The snapshot of the step that decided `cmds`, at `now_ms` (the core's
/// clock, ms since the shell started). `readings`: what the CDU answered
/// (`None`: it did not); `hosts`: the hosts' last reports as the core got
/// them; `settings`: the BMS's settings in force.
///
/// A reading is not available when the CDU did not answer, its map lacks
/// it, it is not a number, or the core holds the sensor lost (as in the
/// shell's telemetry). The hottest GPU counts reports younger than the
/// core's host timeout. `took`: what the CDU took of the step's writes
/// ([`CduTook`]), for the valves it has ([`valves_shown`]), the setpoint
/// in force (the last it took, not `cmds`'s) and whether it refuses
/// writes (it answered, and a write did not go in).
pub fn snapshot_from(
    core: &Core,
    cmds: &Commands,
    now_ms: u64,
    readings: Option<&CduMeasurements>,
    took: CduTook,
    hosts: &[Option<HostReport>],
    settings: &NorthboundSettings,
) -> NorthboundSnapshot {
    let cfg = core.config();
    let (_, _, since_ms) = core.mode();
    let secs = |ms: u64| (ms / 1000).min(u64::from(u32::MAX)) as u32;
    let faults = Which::ALL.map(|w| core.sensor_fault(w));
    let ([supply_c, return_c, flow_lpm, facility_supply_c], sensor_faults) =
        sensors(readings, faults);

    let pumps = pump_word(readings, core.pumps_failed(), cmds.pump_on);
    let caps = cmds.caps.iter().flatten();
    let hosts_capped = caps.clone().count().min(usize::from(u16::MAX)) as u16;
    let lowest_cap_w = caps.map(|c| c.watts).reduce(f32::min);
    let hottest_gpu_c = hottest_fresh(hosts, now_ms, cfg.timing.host_timeout_ms);
    let m = Meters::of(readings);
    let loops = core.loops();
    NorthboundSnapshot {
        mode: cmds.mode,
        reason: cmds.reason,
        seconds_in_mode: secs(now_ms.saturating_sub(since_ms)),
        uptime_s: secs(now_ms),
        setpoint_c: took.setpoint_c.unwrap_or(f32::NAN),
        supply_c,
        return_c,
        flow_lpm,
        facility_supply_c,
        sensor_faults,
        pumps,
        lead_pump: match cmds.lead {
            Pump::A => 0,
            Pump::B => 1,
        },
        pump_speed_pct: cmds.pump_speed * 100.0,
        valves_open: valves_shown(
            valves_held(readings, took.valves, cfg.layout.racks),
            cfg.layout.racks,
        ),
        cooling_lost: cmds.cooling_lost,
        leaks_latched: core.leaks_latched(),
        leak_sensing_lost: cmds.sensing_lost,
        isolation_failed: cmds.isolation_failed,
        hosts_capped,
        lowest_cap_w,
        hottest_gpu_c,
        proposed_setpoint_c: loops.proposal.setpoint_c,
        proposed_speed_pct: loops.proposal.speed * 100.0,
        rejection_short: Some(loops.rejection_short),
        beacon: cmds.beacon,
        cdu_refuses_writes: readings.is_some() && !took.all,
        pue: m.pue,
        it_w: m.it_w,
        facility_w: m.facility_w,
        cooling_w: m.cooling_w,
        settings: *settings,
        alarms: Alarms::default(),
    }
}
