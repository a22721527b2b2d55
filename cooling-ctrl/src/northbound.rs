//! The northbound Modbus TCP server: the controller's state and
//! measurements for the building management system (BMS), and the few
//! bounded settings the BMS may ask of it.
//!
//! What it serves is data, like a CDU's map: a [`RegisterMap`]
//! (`boards/northbound/loopwarden-cdu-ctrl.toml`, [`northbound_map`]) names
//! every register with its kind, address, type, scale, unit and, for the
//! settings, the range a write may set; 32-bit values follow the map's word
//! order. [`check_map`] accepts a map whose registers are all known here
//! (by name, of the right kind; bit words at scale 1); a map may leave
//! registers out, and those are not served.
//!
//! How it fits the shell: after every control step the shell fills a
//! [`NorthboundSnapshot`] ([`snapshot_from`]: plain values from the core's
//! [`Commands`], the core itself, the CDU's readings and the hosts'
//! reports) and sends it on a [`watch`] channel ([`snapshot_channel`]);
//! [`serve`] answers every request from the latest snapshot, so a read
//! never waits for the control loop and never sees half a step. Writes,
//! when enabled, are checked against the map and handed to the shell as
//! [`NorthboundWrite`]s on an [`mpsc`] channel; the shell applies them at
//! its next step ([`NorthboundSettings::apply`]) and the holding registers
//! read what is in force, so an accepted write reads back one step later.
//!
//! Answers:
//! - input registers (function 4) and holding registers (function 3):
//!   1 to 125 registers, every one in the map, else exception 2 (a read
//!   may start or end inside a 32-bit value);
//! - writes (functions 6 and 16) while writes are disabled (`serve` got no
//!   sender): exception 1, "illegal function", whatever the address: the
//!   server does not do writes, which is not a matter of the address;
//! - writes while enabled: every register touched whole and in the map
//!   (else exception 2), every value within its `[min, max]` (else
//!   exception 3); all or nothing: one refused register refuses the lot
//!   and nothing is handed on. When the shell's channel is full the write
//!   is refused with exception 6 (busy: try again), when the shell is gone
//!   with exception 4;
//! - any other function: exception 1. Any unit id is answered.
//!
//! Glossary:
//! - *BMS*: the building management system, the site's supervisory
//!   system, a Modbus TCP client of this server.
//! - *northbound*: towards the BMS (southbound is the CDU).
//! - *snapshot*: the plain values of one control step that the registers
//!   show.
//! - *sentinel*: the raw value of "not available" for a type: `0x8000` for
//!   i16, `0xFFFF` for u16, `0xFFFF_FFFF` for u32, `0x8000_0000` for i32.
//!   A value that exists but falls outside its type is clamped to the
//!   nearest value that is not the sentinel. Bit words are never "not
//!   available" and use all their bits.
//! - *in force*: what the control loop runs with now, not what was last
//!   written.
//! - *heartbeat*: the `uptime` register, which advances every step and
//!   stops when the control loop stalls.
//! - *exception 1 / 2 / 3 / 4 / 6*: Modbus illegal function / illegal data
//!   address / illegal data value / server device failure / server device
//!   busy.

use std::collections::BTreeMap;
use std::fmt;
use std::format;
use std::future::{ready, Ready};
use std::io;
use std::net::SocketAddr;
use std::string::String;
use std::sync::Arc;
use std::vec::Vec;

use loopwarden_boards::modbus_map::{Kind, Register, RegisterMap, Type, WordOrder};
use loopwarden_boards::modbus_server::{answer, RegisterFile};
use loopwarden_protocol::message::{CduMode, Pump, SensorFault};
use loopwarden_protocol::ReasonCode;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_modbus::server::tcp::{accept_tcp_connection, Server};
use tokio_modbus::{ExceptionCode, Request, Response};

use crate::modbus::CduReadings;
use cooling_core::sensors::Which;
use cooling_core::{Commands, Core, CoreConfig, HostReport};

/// The shipped northbound map's text.
pub const MAP_TOML: &str = include_str!("../../boards/northbound/loopwarden-cdu-ctrl.toml");

/// The shipped northbound register map
/// (`boards/northbound/loopwarden-cdu-ctrl.toml`).
pub fn northbound_map() -> RegisterMap {
    RegisterMap::from_toml(MAP_TOML, "boards/northbound/loopwarden-cdu-ctrl.toml")
        .expect("the shipped northbound map is valid")
}

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
    /// Supply setpoint in force, °C.
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
    /// Hosts under a cooling cap.
    pub hosts_capped: u16,
    /// The lowest per-GPU cap asked of a host, W (`None`: no cap).
    pub lowest_cap_w: Option<f32>,
    /// The hottest GPU among fresh host reports, °C.
    pub hottest_gpu_c: Option<f32>,
    /// The optimiser's proposed supply setpoint, °C.
    pub proposed_setpoint_c: f32,
    /// The optimiser's proposed pump speed, %.
    pub proposed_speed_pct: f32,
    /// Heat rejection is believed short.
    pub rejection_short: bool,
    /// The alarm beacon is on.
    pub beacon: bool,
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
}

impl Default for NorthboundSnapshot {
    /// Before the first step: booting, nothing measured.
    fn default() -> Self {
        Self {
            mode: CduMode::Boot,
            reason: ReasonCode::BOOTING,
            seconds_in_mode: 0,
            uptime_s: 0,
            setpoint_c: 0.0,
            supply_c: None,
            return_c: None,
            flow_lpm: None,
            facility_supply_c: None,
            sensor_faults: 0,
            pumps: 0,
            lead_pump: 0,
            pump_speed_pct: 0.0,
            valves_open: 0,
            cooling_lost: 0,
            leaks_latched: 0,
            hosts_capped: 0,
            lowest_cap_w: None,
            hottest_gpu_c: None,
            proposed_setpoint_c: 0.0,
            proposed_speed_pct: 0.0,
            rejection_short: false,
            beacon: false,
            pue: None,
            it_w: None,
            facility_w: None,
            cooling_w: None,
            settings: NorthboundSettings::default(),
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
}

impl Default for NorthboundSettings {
    /// No ceiling below the map's highest (45 °C), no offset, nothing
    /// acknowledged.
    fn default() -> Self {
        Self {
            setpoint_ceiling_c: 45.0,
            plan_ceiling_offset_k: 0.0,
            alarm_acknowledged: false,
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
            NorthboundWrite::AlarmAck => self.alarm_acknowledged = true,
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
    /// `alarm_ack` written 1: the standing alarms are acknowledged.
    AlarmAck,
}

/// A snapshot channel: the sender to the shell, the receiver to [`serve`].
pub fn snapshot_channel() -> (
    watch::Sender<NorthboundSnapshot>,
    watch::Receiver<NorthboundSnapshot>,
) {
    watch::channel(NorthboundSnapshot::default())
}

/// The snapshot of the step that decided `cmds`, at `now_ms` (the core's
/// clock, ms since the shell started). `readings`: what the CDU answered
/// (`None`: it did not); `hosts`: the hosts' last reports as the core got
/// them; `settings`: the BMS's settings in force.
///
/// A reading is not available when the CDU did not answer, its map lacks
/// it, it is not a number, or the core holds the sensor lost (as in the
/// shell's telemetry). The hottest GPU counts reports younger than the
/// core's host timeout.
pub fn snapshot_from(
    core: &Core,
    cmds: &Commands,
    now_ms: u64,
    readings: Option<&CduReadings>,
    hosts: &[Option<HostReport>],
    settings: &NorthboundSettings,
) -> NorthboundSnapshot {
    let cfg = core.config();
    let (_, _, since_ms) = core.mode();
    let secs = |ms: u64| (ms / 1000).min(u64::from(u32::MAX)) as u32;
    let mut sensor_faults = 0u16;
    let mut sensor = |w: Which, v: fn(&CduReadings) -> Option<f64>| -> Option<f32> {
        let fault = core.sensor_fault(w);
        if fault.is_some_and(|f| f != SensorFault::Cleared) {
            sensor_faults |= FAULT_BIT << (w as u16);
        }
        let value = readings
            .and_then(v)
            .filter(|x| x.is_finite() && fault != Some(SensorFault::Lost))
            .map(|x| x as f32);
        if value.is_none() {
            sensor_faults |= NOT_AVAILABLE_BIT << (w as u16);
        }
        value
    };
    let supply_c = sensor(Which::Supply, |r| r.supply_c);
    let return_c = sensor(Which::Return, |r| r.return_c);
    let flow_lpm = sensor(Which::Flow, |r| r.flow_lpm);
    let facility_supply_c = sensor(Which::FacilitySupply, |r| r.facility_supply_c);

    let running = |i: usize| readings.and_then(|r| r.pumps_running[i]).unwrap_or(false);
    let failed = core.pumps_failed();
    let mut pumps = 0u16;
    for (on, bit) in [
        (running(0), pump_bits::A_RUNNING),
        (running(1), pump_bits::B_RUNNING),
        (failed[0], pump_bits::A_FAILED),
        (failed[1], pump_bits::B_FAILED),
        (cmds.pump_on[0], pump_bits::A_ON),
        (cmds.pump_on[1], pump_bits::B_ON),
    ] {
        if on {
            pumps |= bit;
        }
    }

    let caps = cmds.caps.iter().flatten();
    let hosts_capped = caps.clone().count().min(usize::from(u16::MAX)) as u16;
    let lowest_cap_w = caps.map(|c| c.watts).reduce(f32::min);
    let hottest_gpu_c = hosts
        .iter()
        .flatten()
        .filter(|r| {
            r.gpus > 0
                && r.hottest_c.is_finite()
                && now_ms.saturating_sub(r.at_ms) <= cfg.timing.host_timeout_ms
        })
        .map(|r| r.hottest_c)
        .reduce(f32::max);

    let meter = |v: fn(&CduReadings) -> Option<f64>| {
        readings.and_then(v).filter(|x| x.is_finite() && *x >= 0.0)
    };
    let it_w = meter(|r| r.it_w);
    let facility_w = meter(|r| r.facility_w);
    let pue = match (it_w, facility_w) {
        (Some(it), Some(f)) if it > 0.0 => Some(f / it),
        _ => None,
    };
    let loops = core.loops();
    NorthboundSnapshot {
        mode: cmds.mode,
        reason: cmds.reason,
        seconds_in_mode: secs(now_ms.saturating_sub(since_ms)),
        uptime_s: secs(now_ms),
        setpoint_c: cmds.setpoint_c,
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
        valves_open: cmds.valves_open,
        cooling_lost: cmds.cooling_lost,
        leaks_latched: core.leaks_latched(),
        hosts_capped,
        lowest_cap_w,
        hottest_gpu_c,
        proposed_setpoint_c: loops.proposal.setpoint_c,
        proposed_speed_pct: loops.proposal.speed * 100.0,
        rejection_short: loops.rejection_short,
        beacon: cmds.beacon,
        pue,
        it_w,
        facility_w,
        cooling_w: meter(|r| r.cooling_w),
        settings: *settings,
    }
}

/// A register's content in a snapshot.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Field {
    /// A value in the register's unit.
    Value(f64),
    /// Raw bits (bit words): exact, all bits usable.
    Bits(u16),
    /// Not available: the type's sentinel.
    NotAvailable,
}

/// Every register the server knows: name, kind, and whether it is a bit
/// word (scale 1, raw bits).
const KNOWN: &[(&str, Kind, bool)] = &[
    ("mode", Kind::Input, true),
    ("reason", Kind::Input, true),
    ("seconds_in_mode", Kind::Input, false),
    ("uptime", Kind::Input, false),
    ("setpoint", Kind::Input, false),
    ("supply_temp", Kind::Input, false),
    ("return_temp", Kind::Input, false),
    ("flow", Kind::Input, false),
    ("facility_supply_temp", Kind::Input, false),
    ("sensor_faults", Kind::Input, true),
    ("pumps", Kind::Input, true),
    ("lead_pump", Kind::Input, true),
    ("pump_speed", Kind::Input, false),
    ("valves_open", Kind::Input, true),
    ("cooling_lost", Kind::Input, true),
    ("leaks_latched", Kind::Input, true),
    ("hosts_capped", Kind::Input, false),
    ("lowest_cap", Kind::Input, false),
    ("hottest_gpu", Kind::Input, false),
    ("proposed_setpoint", Kind::Input, false),
    ("proposed_speed", Kind::Input, false),
    ("rejection_short", Kind::Input, true),
    ("beacon", Kind::Input, true),
    ("pue", Kind::Input, false),
    ("it_power", Kind::Input, false),
    ("facility_power", Kind::Input, false),
    ("cooling_power", Kind::Input, false),
    ("writes_enabled", Kind::Input, true),
    ("setpoint_ceiling", Kind::Holding, false),
    ("plan_ceiling_offset", Kind::Holding, false),
    ("alarm_ack", Kind::Holding, true),
];

fn mode_code(m: CduMode) -> u16 {
    match m {
        CduMode::Boot => 0,
        CduMode::Normal => 1,
        CduMode::Degraded => 2,
        CduMode::Failsafe => 3,
    }
}

fn field(name: &str, s: &NorthboundSnapshot, writes_enabled: bool) -> Option<Field> {
    use Field::{Bits, NotAvailable, Value};
    let opt = |v: Option<f64>| v.map_or(NotAvailable, Value);
    let opt32 = |v: Option<f32>| opt(v.map(f64::from));
    let flag = |b: bool| Bits(u16::from(b));
    Some(match name {
        "mode" => Bits(mode_code(s.mode)),
        "reason" => Bits(s.reason.0),
        "seconds_in_mode" => Value(f64::from(s.seconds_in_mode)),
        "uptime" => Value(f64::from(s.uptime_s)),
        "setpoint" => Value(f64::from(s.setpoint_c)),
        "supply_temp" => opt32(s.supply_c),
        "return_temp" => opt32(s.return_c),
        "flow" => opt32(s.flow_lpm),
        "facility_supply_temp" => opt32(s.facility_supply_c),
        "sensor_faults" => Bits(s.sensor_faults),
        "pumps" => Bits(s.pumps),
        "lead_pump" => Bits(u16::from(s.lead_pump)),
        "pump_speed" => Value(f64::from(s.pump_speed_pct)),
        "valves_open" => Bits(s.valves_open),
        "cooling_lost" => Bits(s.cooling_lost),
        "leaks_latched" => Bits(s.leaks_latched),
        "hosts_capped" => Value(f64::from(s.hosts_capped)),
        "lowest_cap" => opt32(s.lowest_cap_w),
        "hottest_gpu" => opt32(s.hottest_gpu_c),
        "proposed_setpoint" => Value(f64::from(s.proposed_setpoint_c)),
        "proposed_speed" => Value(f64::from(s.proposed_speed_pct)),
        "rejection_short" => flag(s.rejection_short),
        "beacon" => flag(s.beacon),
        "pue" => opt(s.pue),
        "it_power" => opt(s.it_w),
        "facility_power" => opt(s.facility_w),
        "cooling_power" => opt(s.cooling_w),
        "writes_enabled" => flag(writes_enabled),
        "setpoint_ceiling" => Value(f64::from(s.settings.setpoint_ceiling_c)),
        "plan_ceiling_offset" => Value(f64::from(s.settings.plan_ceiling_offset_k)),
        "alarm_ack" => flag(s.settings.alarm_acknowledged),
        _ => return None,
    })
}

/// Why a map cannot be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapError(pub String);

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "northbound register map: {}", self.0)
    }
}

impl std::error::Error for MapError {}

/// Checks that every register of `map` is one this server fills, of the
/// right kind, and that bit words are at scale 1 (registers the map leaves
/// out are simply not served).
pub fn check_map(map: &RegisterMap) -> Result<(), MapError> {
    for r in map.registers() {
        let Some(&(_, kind, bits)) = KNOWN.iter().find(|(n, _, _)| *n == r.name) else {
            return Err(MapError(format!(
                "{}: not a register this server fills",
                r.name
            )));
        };
        if r.kind != kind {
            return Err(MapError(format!(
                "{}: must be a {kind:?} register, not {:?}",
                r.name, r.kind
            )));
        }
        if bits && r.scale != 1.0 {
            return Err(MapError(format!("{}: a bit word needs scale 1", r.name)));
        }
    }
    Ok(())
}

/// The raw range of a type short of its sentinel.
fn usable(ty: Type) -> (f64, f64) {
    match ty {
        Type::U16 => (0.0, f64::from(u16::MAX - 1)),
        Type::I16 => (f64::from(i16::MIN + 1), f64::from(i16::MAX)),
        Type::U32 => (0.0, f64::from(u32::MAX - 1)),
        Type::I32 => (f64::from(i32::MIN + 1), f64::from(i32::MAX)),
    }
}

/// The raw bits of "not available" for a type.
pub fn sentinel(ty: Type) -> u32 {
    match ty {
        Type::U16 => 0xFFFF,
        Type::I16 => 0x8000,
        Type::U32 => 0xFFFF_FFFF,
        Type::I32 => 0x8000_0000,
    }
}

fn split(ty: Type, order: WordOrder, bits: u32) -> Vec<u16> {
    match (ty.words(), order) {
        (1, _) => std::vec![bits as u16],
        (_, WordOrder::HighFirst) => std::vec![(bits >> 16) as u16, bits as u16],
        (_, WordOrder::LowFirst) => std::vec![bits as u16, (bits >> 16) as u16],
    }
}

fn join(ty: Type, order: WordOrder, words: &[u16]) -> u32 {
    let w = |i: usize| u32::from(words.get(i).copied().unwrap_or(0));
    match (ty.words(), order) {
        (1, _) => w(0),
        (_, WordOrder::HighFirst) => (w(0) << 16) | w(1),
        (_, WordOrder::LowFirst) => (w(1) << 16) | w(0),
    }
}

fn raw_of(ty: Type, bits: u32) -> i64 {
    match ty {
        Type::U16 => i64::from(bits as u16),
        Type::I16 => i64::from(bits as u16 as i16),
        Type::U32 => i64::from(bits),
        Type::I32 => i64::from(bits as i32),
    }
}

fn bits_of(ty: Type, raw: i64) -> u32 {
    match ty {
        Type::U16 | Type::U32 => raw as u32,
        Type::I16 => raw as i16 as u16 as u32,
        Type::I32 => raw as i32 as u32,
    }
}

/// A setting's range in raw units.
fn raw_bounds(r: &Register) -> (i64, i64) {
    let lo = r.min.map_or(i64::MIN, |m| (m / r.scale).round() as i64);
    let hi = r.max.map_or(i64::MAX, |m| (m / r.scale).round() as i64);
    (lo, hi)
}

fn words_of(map: &RegisterMap, r: &Register, f: Field) -> Vec<u16> {
    let bits = match f {
        Field::NotAvailable => sentinel(r.ty),
        Field::Bits(b) => u32::from(b),
        Field::Value(v) if !v.is_finite() => sentinel(r.ty),
        Field::Value(v) => {
            let (lo, hi) = usable(r.ty);
            let mut raw = (v / r.scale).round().clamp(lo, hi) as i64;
            if r.kind == Kind::Holding {
                let (lo, hi) = raw_bounds(r);
                raw = raw.clamp(lo, hi);
            }
            bits_of(r.ty, raw)
        }
    };
    split(r.ty, map.word_order, bits)
}

/// The registers' words for one snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Image {
    /// Input registers by address.
    pub input: BTreeMap<u16, u16>,
    /// Holding registers by address.
    pub holding: BTreeMap<u16, u16>,
}

impl Image {
    /// The words of register `name` (`None`: not in the map).
    pub fn words(&self, map: &RegisterMap, name: &str) -> Option<Vec<u16>> {
        let r = map.get(name)?;
        let table = match r.kind {
            Kind::Input => &self.input,
            Kind::Holding => &self.holding,
        };
        (r.address..r.address + r.ty.words())
            .map(|a| table.get(&a).copied())
            .collect()
    }
}

/// Encodes `snap` as `map` lays it out; `writes_enabled` fills the
/// register of that name. Registers the server does not know read 0 (a
/// map that passed [`check_map`] has none).
pub fn encode_snapshot(
    map: &RegisterMap,
    snap: &NorthboundSnapshot,
    writes_enabled: bool,
) -> Image {
    let mut img = Image::default();
    for r in map.registers() {
        let f = field(&r.name, snap, writes_enabled).unwrap_or(Field::Bits(0));
        let table = match r.kind {
            Kind::Input => &mut img.input,
            Kind::Holding => &mut img.holding,
        };
        for (i, w) in words_of(map, r, f).into_iter().enumerate() {
            table.insert(r.address + i as u16, w);
        }
    }
    img
}

/// The writes that `words` from `addr` ask, checked against `map`: every
/// register touched whole and in the map (else exception 2), every value
/// within its range (else exception 3). All or nothing: on an error none
/// is to be applied. `alarm_ack` written 0 asks nothing.
pub fn decode_write(
    map: &RegisterMap,
    addr: u16,
    words: &[u16],
) -> Result<Vec<NorthboundWrite>, ExceptionCode> {
    if words.is_empty() || words.len() > 123 {
        return Err(ExceptionCode::IllegalDataValue);
    }
    let end = u32::from(addr) + words.len() as u32;
    let mut writes = Vec::new();
    let mut a = u32::from(addr);
    while a < end {
        let r = map
            .at(Kind::Holding, a as u16)
            .ok_or(ExceptionCode::IllegalDataAddress)?;
        let n = u32::from(r.ty.words());
        if a + n > end {
            return Err(ExceptionCode::IllegalDataAddress);
        }
        let from = (a - u32::from(addr)) as usize;
        let raw = raw_of(
            r.ty,
            join(r.ty, map.word_order, &words[from..from + n as usize]),
        );
        let (lo, hi) = raw_bounds(r);
        if raw < lo || raw > hi {
            return Err(ExceptionCode::IllegalDataValue);
        }
        let value = raw as f64 * r.scale;
        match r.name.as_str() {
            "setpoint_ceiling" => writes.push(NorthboundWrite::SetpointCeiling {
                celsius: value as f32,
            }),
            "plan_ceiling_offset" => writes.push(NorthboundWrite::PlanCeilingOffset {
                kelvin: value as f32,
            }),
            "alarm_ack" if raw != 0 => writes.push(NorthboundWrite::AlarmAck),
            "alarm_ack" => {}
            _ => return Err(ExceptionCode::IllegalDataAddress),
        }
        a += n;
    }
    Ok(writes)
}

/// What every connection shares.
struct State {
    map: RegisterMap,
    snapshots: watch::Receiver<NorthboundSnapshot>,
    writes: Option<mpsc::Sender<NorthboundWrite>>,
}

impl State {
    fn read(&self, kind: Kind, addr: u16, count: u16) -> Result<Vec<u16>, ExceptionCode> {
        if count == 0 || count > 125 {
            return Err(ExceptionCode::IllegalDataValue);
        }
        let img = encode_snapshot(&self.map, &self.snapshots.borrow(), self.writes.is_some());
        let table = match kind {
            Kind::Input => &img.input,
            Kind::Holding => &img.holding,
        };
        (u32::from(addr)..u32::from(addr) + u32::from(count))
            .map(|a| {
                u16::try_from(a)
                    .ok()
                    .and_then(|a| table.get(&a).copied())
                    .ok_or(ExceptionCode::IllegalDataAddress)
            })
            .collect()
    }

    fn write(&self, addr: u16, words: &[u16]) -> Result<(), ExceptionCode> {
        let Some(tx) = &self.writes else {
            return Err(ExceptionCode::IllegalFunction);
        };
        let writes = decode_write(&self.map, addr, words)?;
        if writes.is_empty() {
            return Ok(());
        }
        let permits = tx.try_reserve_many(writes.len()).map_err(|e| match e {
            mpsc::error::TrySendError::Full(()) => ExceptionCode::ServerDeviceBusy,
            mpsc::error::TrySendError::Closed(()) => ExceptionCode::ServerDeviceFailure,
        })?;
        for (permit, w) in permits.zip(writes) {
            tracing::info!("northbound: the BMS writes {w:?}");
            permit.send(w);
        }
        Ok(())
    }
}

impl RegisterFile for State {
    fn read_registers(&self, kind: Kind, addr: u16, count: u16) -> Result<Vec<u16>, ExceptionCode> {
        self.read(kind, addr, count)
    }
    fn write_registers(&self, addr: u16, words: &[u16]) -> Result<(), ExceptionCode> {
        self.write(addr, words)
    }
}

/// One connection's service.
struct Service(Arc<State>);

impl tokio_modbus::server::Service for Service {
    type Request = Request<'static>;
    type Response = Response;
    type Exception = ExceptionCode;
    type Future = Ready<Result<Response, ExceptionCode>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        ready(answer(&*self.0, req))
    }
}

/// Serves `map` over Modbus TCP on `listener` from the latest of
/// `snapshots` until the task is dropped or the listener fails. `writes`:
/// where accepted writes go (`None`: writes are disabled and refused with
/// exception 1); give it room for a few (a multiple write of every setting
/// takes 2 places, the alarm acknowledge a third), a full channel refuses
/// with exception 6. A map [`check_map`] refuses is an `InvalidInput`
/// error before anything is served. When the snapshot sender is dropped it
/// goes on serving the last snapshot (its `uptime` no longer advances).
pub async fn serve(
    listener: TcpListener,
    map: RegisterMap,
    snapshots: watch::Receiver<NorthboundSnapshot>,
    writes: Option<mpsc::Sender<NorthboundWrite>>,
) -> io::Result<()> {
    check_map(&map).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(
            "northbound: serving {:?} on {addr}, writes {}",
            map.model,
            if writes.is_some() {
                "enabled"
            } else {
                "disabled"
            }
        );
    }
    let state = Arc::new(State {
        map,
        snapshots,
        writes,
    });
    let server = Server::new(listener);
    let on_connected = |stream, socket_addr: SocketAddr| {
        let state = state.clone();
        async move {
            accept_tcp_connection(stream, socket_addr, move |_| {
                Ok(Some(Service(state.clone())))
            })
        }
    };
    let on_error = |e| tracing::warn!("northbound: Modbus connection failed: {e}");
    server.serve(&on_connected, on_error).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use cooling_core::{HostCap, Inputs};
    use std::string::ToString;
    use std::vec;

    fn snap() -> NorthboundSnapshot {
        NorthboundSnapshot {
            mode: CduMode::Degraded,
            reason: ReasonCode::CAPACITY_SHORT,
            seconds_in_mode: 70_000,
            uptime_s: 123,
            setpoint_c: 32.05,
            supply_c: Some(-1.5),
            return_c: None,
            flow_lpm: Some(172.8),
            facility_supply_c: Some(400.0),
            sensor_faults: 0x0202,
            pumps: pump_bits::A_RUNNING | pump_bits::A_ON | pump_bits::B_FAILED,
            lead_pump: 0,
            pump_speed_pct: 80.0,
            valves_open: 0xFFFF,
            cooling_lost: 0,
            leaks_latched: 0,
            hosts_capped: 3,
            lowest_cap_w: Some(450.0),
            hottest_gpu_c: None,
            proposed_setpoint_c: 34.5,
            proposed_speed_pct: 60.0,
            rejection_short: true,
            beacon: false,
            pue: Some(1.0845),
            it_w: Some(108_400.0),
            facility_w: Some(117_550.0),
            cooling_w: None,
            settings: NorthboundSettings {
                setpoint_ceiling_c: 40.0,
                plan_ceiling_offset_k: -2.5,
                alarm_acknowledged: false,
            },
        }
    }

    #[test]
    fn the_shipped_map_is_served_whole() {
        let m = northbound_map();
        check_map(&m).unwrap();
        assert_eq!(m.registers().count(), KNOWN.len());
        // Input registers run without a gap from 0.
        let mut next = 0;
        let mut inputs: Vec<_> = m.registers().filter(|r| r.kind == Kind::Input).collect();
        inputs.sort_by_key(|r| r.address);
        for r in inputs {
            assert_eq!(r.address, next, "{}", r.name);
            next += r.ty.words();
        }
    }

    #[test]
    fn snapshot_encoding_follows_scale_sentinels_and_clamps() {
        let m = northbound_map();
        let img = encode_snapshot(&m, &snap(), false);
        let w = |n: &str| img.words(&m, n).unwrap();
        assert_eq!(w("mode"), vec![2]);
        assert_eq!(w("reason"), vec![2005]);
        // 70,000 s = 0x0001_1170, high word first.
        assert_eq!(w("seconds_in_mode"), vec![0x0001, 0x1170]);
        assert_eq!(w("setpoint"), vec![3205]);
        assert_eq!(w("supply_temp"), vec![(-150i16) as u16]);
        assert_eq!(w("return_temp"), vec![0x8000]);
        assert_eq!(w("flow"), vec![1728]);
        // 400 °C does not fit at 0.01: clamped short of nothing-to-say.
        assert_eq!(w("facility_supply_temp"), vec![32767]);
        assert_eq!(w("sensor_faults"), vec![0x0202]);
        assert_eq!(w("pumps"), vec![0b1_1001]);
        assert_eq!(w("pump_speed"), vec![800]);
        // A bit word keeps all 16 bits, although 0xFFFF is u16's sentinel.
        assert_eq!(w("valves_open"), vec![0xFFFF]);
        assert_eq!(w("hosts_capped"), vec![3]);
        assert_eq!(w("lowest_cap"), vec![450]);
        assert_eq!(w("hottest_gpu"), vec![0x8000]);
        assert_eq!(w("proposed_setpoint"), vec![3450]);
        assert_eq!(w("proposed_speed"), vec![600]);
        assert_eq!(w("rejection_short"), vec![1]);
        assert_eq!(w("pue"), vec![1085]);
        // 108,400 W = 0x0001_A770; 117,550 W = 0x0001_CB2E.
        assert_eq!(w("it_power"), vec![0x0001, 0xA770]);
        assert_eq!(w("facility_power"), vec![0x0001, 0xCB2E]);
        assert_eq!(w("cooling_power"), vec![0xFFFF, 0xFFFF]);
        assert_eq!(w("writes_enabled"), vec![0]);
        assert_eq!(w("setpoint_ceiling"), vec![4000]);
        assert_eq!(w("plan_ceiling_offset"), vec![(-25i16) as u16]);
        assert_eq!(w("alarm_ack"), vec![0]);
        assert_eq!(encode_snapshot(&m, &snap(), true).input[&32], 1);
        // Nothing is not a number, and a snapshot's setting outside the
        // map's range reads the nearest end.
        let mut s = snap();
        s.setpoint_c = f32::NAN;
        s.settings.setpoint_ceiling_c = 50.0;
        let img = encode_snapshot(&m, &s, false);
        assert_eq!(img.words(&m, "setpoint").unwrap(), vec![0x8000]);
        assert_eq!(img.words(&m, "setpoint_ceiling").unwrap(), vec![4500]);
    }

    #[test]
    fn thirty_two_bit_values_follow_the_map_word_order() {
        let low =
            RegisterMap::from_toml(&MAP_TOML.replace("high_first", "low_first"), "low").unwrap();
        let img = encode_snapshot(&low, &snap(), false);
        assert_eq!(img.words(&low, "it_power").unwrap(), vec![0xA770, 0x0001]);
        assert_eq!(
            img.words(&low, "seconds_in_mode").unwrap(),
            vec![0x1170, 0x0001]
        );
    }

    #[test]
    fn maps_with_registers_the_server_cannot_fill_are_refused() {
        let m = RegisterMap::from_toml(
            &MAP_TOML.replace("name = \"beacon\"", "name = \"bacon\""),
            "m",
        )
        .unwrap();
        assert!(check_map(&m).unwrap_err().to_string().contains("bacon"));
        let m = RegisterMap::from_toml(
            &MAP_TOML.replace(
                "name = \"pumps\"\nkind = \"input\"\naddress = 12\ntype = \"u16\"\nscale = 1.0",
                "name = \"pumps\"\nkind = \"input\"\naddress = 12\ntype = \"u16\"\nscale = 0.5",
            ),
            "m",
        )
        .unwrap();
        assert!(check_map(&m).unwrap_err().0.contains("scale 1"));
        // Leaving a register out is fine: it is not served.
        let cut = MAP_TOML
            .split("[[register]]\nname = \"cooling_power\"")
            .next()
            .unwrap();
        let m = RegisterMap::from_toml(cut, "m").unwrap();
        check_map(&m).unwrap();
        assert!(!encode_snapshot(&m, &snap(), false).input.contains_key(&30));
    }

    #[test]
    fn writes_are_checked_whole_against_the_map() {
        let m = northbound_map();
        assert_eq!(
            decode_write(&m, 0, &[3550]).unwrap(),
            vec![NorthboundWrite::SetpointCeiling { celsius: 35.5 }]
        );
        assert_eq!(
            decode_write(&m, 0, &[2000, (-100i16) as u16, 1]).unwrap(),
            vec![
                NorthboundWrite::SetpointCeiling { celsius: 20.0 },
                NorthboundWrite::PlanCeilingOffset { kelvin: -10.0 },
                NorthboundWrite::AlarmAck,
            ]
        );
        assert_eq!(decode_write(&m, 2, &[0]).unwrap(), vec![]);
        assert_eq!(
            decode_write(&m, 0, &[4501]),
            Err(ExceptionCode::IllegalDataValue)
        );
        assert_eq!(
            decode_write(&m, 0, &[1999]),
            Err(ExceptionCode::IllegalDataValue)
        );
        assert_eq!(
            decode_write(&m, 1, &[1]),
            Err(ExceptionCode::IllegalDataValue)
        );
        assert_eq!(
            decode_write(&m, 2, &[2]),
            Err(ExceptionCode::IllegalDataValue)
        );
        // One bad register refuses the lot.
        assert_eq!(
            decode_write(&m, 0, &[3000, 5, 1]),
            Err(ExceptionCode::IllegalDataValue)
        );
        assert_eq!(
            decode_write(&m, 3, &[0]),
            Err(ExceptionCode::IllegalDataAddress)
        );
        assert_eq!(
            decode_write(&m, 1, &[0, 1, 0]),
            Err(ExceptionCode::IllegalDataAddress)
        );
        assert_eq!(
            decode_write(&m, 0, &[]),
            Err(ExceptionCode::IllegalDataValue)
        );
        let mut s = NorthboundSettings::new(&CoreConfig::default());
        assert_eq!(s.setpoint_ceiling_c, 45.0);
        for w in decode_write(&m, 0, &[3000, (-30i16) as u16, 1]).unwrap() {
            s.apply(w);
        }
        assert_eq!(
            s,
            NorthboundSettings {
                setpoint_ceiling_c: 30.0,
                plan_ceiling_offset_k: -3.0,
                alarm_acknowledged: true,
            }
        );
    }

    fn readings() -> CduReadings {
        CduReadings {
            supply_c: Some(30.0),
            return_c: Some(38.0),
            flow_lpm: Some(190.0),
            facility_supply_c: None,
            pumps_running: [Some(true), Some(false)],
            leaks: Some(0),
            it_w: Some(100_000.0),
            cooling_w: Some(4_000.0),
            facility_w: Some(110_000.0),
        }
    }

    #[test]
    fn snapshot_from_a_core_step() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let r = readings();
        let hot = HostReport {
            gpus: 8,
            hottest_c: 71.5,
            gpu_power_w: 8.0 * 500.0,
            limit_w: 700.0,
            slowdown: false,
            at_ms: 2_000,
        };
        let hosts = [
            Some(hot),
            Some(HostReport {
                hottest_c: 90.0,
                at_ms: 0,
                ..hot
            }),
            None,
        ];
        let mut cmds = None;
        for s in 0..=12u64 {
            cmds = Some(core.step(&Inputs {
                now_ms: s * 1000,
                cdu: Some(crate::shell::core_readings(&r)),
                ambient_c: None,
                leaks: 0,
                hosts: &hosts,
            }));
        }
        let mut cmds = cmds.unwrap();
        cmds.caps = [None; cooling_core::MAX_HOSTS];
        cmds.caps[5] = Some(HostCap {
            watts: 420.0,
            reason: ReasonCode::CAPACITY_SHORT,
        });
        cmds.caps[9] = Some(HostCap {
            watts: 380.0,
            reason: ReasonCode::CAPACITY_SHORT,
        });
        let settings = NorthboundSettings::new(&cfg);
        // At 16 s the second host's report (at 0 ms) is stale.
        let s = snapshot_from(&core, &cmds, 16_000, Some(&r), &hosts, &settings);
        assert_eq!(s.mode, cmds.mode);
        assert_eq!(s.uptime_s, 16);
        assert_eq!(s.supply_c, Some(30.0));
        assert_eq!(s.facility_supply_c, None);
        assert_eq!(
            s.sensor_faults & (NOT_AVAILABLE_BIT << 3),
            NOT_AVAILABLE_BIT << 3
        );
        assert_eq!(s.sensor_faults & (NOT_AVAILABLE_BIT * 0b111), 0);
        assert_eq!(s.pumps & pump_bits::A_RUNNING, pump_bits::A_RUNNING);
        assert_eq!(s.pumps & pump_bits::B_RUNNING, 0);
        assert_eq!(s.pumps & pump_bits::A_ON, pump_bits::A_ON);
        assert_eq!(s.lead_pump, 0);
        assert_eq!(s.hosts_capped, 2);
        assert_eq!(s.lowest_cap_w, Some(380.0));
        assert_eq!(s.hottest_gpu_c, Some(71.5));
        assert!((s.pue.unwrap() - 1.1).abs() < 1e-9);
        assert_eq!(s.cooling_w, Some(4_000.0));
        assert_eq!(s.valves_open, 0b1111);
        assert_eq!(s.settings, settings);
        assert!((s.pump_speed_pct - cmds.pump_speed * 100.0).abs() < 1e-4);
        // The CDU silent: every reading and meter not available.
        let s = snapshot_from(&core, &cmds, 16_000, None, &hosts, &settings);
        assert_eq!((s.supply_c, s.it_w, s.pue), (None, None, None));
        assert_eq!(s.sensor_faults & 0x0F00, 0x0F00);
        assert_eq!(s.pumps & (pump_bits::A_RUNNING | pump_bits::B_RUNNING), 0);
    }

    #[test]
    fn a_lost_sensor_reads_not_available_with_its_fault_bit() {
        let mut core = Core::new(CoreConfig::default()).unwrap();
        let mut r = readings();
        let mut cmds = None;
        for s in 0..=30u64 {
            if s >= 15 {
                r.flow_lpm = None;
            }
            cmds = Some(core.step(&Inputs {
                now_ms: s * 1000,
                cdu: Some(crate::shell::core_readings(&r)),
                ambient_c: None,
                leaks: 0,
                hosts: &[],
            }));
        }
        let cmds = cmds.unwrap();
        assert_eq!(core.sensor_fault(Which::Flow), Some(SensorFault::Lost));
        // Even were the CDU to give a number again, the core holds it lost.
        let s = snapshot_from(
            &core,
            &cmds,
            30_000,
            Some(&readings()),
            &[],
            &NorthboundSettings::default(),
        );
        assert_eq!(s.flow_lpm, None);
        // The facility supply never read: lost too (not required).
        let (flow, fac) = (Which::Flow as u16, Which::FacilitySupply as u16);
        assert_eq!(
            core.sensor_fault(Which::FacilitySupply),
            Some(SensorFault::Lost)
        );
        assert_eq!(
            s.sensor_faults,
            (FAULT_BIT << flow)
                | (FAULT_BIT << fac)
                | (NOT_AVAILABLE_BIT << flow)
                | (NOT_AVAILABLE_BIT << fac)
        );
        assert_eq!(s.mode, CduMode::Failsafe);
        let img = encode_snapshot(&northbound_map(), &s, false);
        assert_eq!(img.input[&9], 0xFFFF);
        assert_eq!(img.input[&0], 3);
    }

    #[tokio::test]
    async fn a_full_channel_is_busy_and_a_gone_shell_a_device_failure() {
        let (_tx, rx) = snapshot_channel();
        let (wtx, mut wrx) = mpsc::channel(1);
        let state = State {
            map: northbound_map(),
            snapshots: rx,
            writes: Some(wtx),
        };
        // Two writes do not fit a channel of one: nothing goes in.
        assert_eq!(
            state.write(0, &[3000, 0]),
            Err(ExceptionCode::ServerDeviceBusy)
        );
        assert!(wrx.try_recv().is_err());
        assert_eq!(state.write(0, &[3000]), Ok(()));
        assert_eq!(
            wrx.try_recv().unwrap(),
            NorthboundWrite::SetpointCeiling { celsius: 30.0 }
        );
        drop(wrx);
        assert_eq!(
            state.write(0, &[3000]),
            Err(ExceptionCode::ServerDeviceFailure)
        );
        assert_eq!(
            answer(&state, Request::ReadCoils(0, 1)),
            Err(ExceptionCode::IllegalFunction)
        );
        let disabled = State {
            writes: None,
            ..state
        };
        assert_eq!(disabled.write(7, &[1]), Err(ExceptionCode::IllegalFunction));
        assert_eq!(
            disabled.read(Kind::Input, 32, 2),
            Err(ExceptionCode::IllegalDataAddress)
        );
        assert_eq!(disabled.read(Kind::Input, 31, 2), Ok(vec![0xFFFF, 0]));
    }
}
