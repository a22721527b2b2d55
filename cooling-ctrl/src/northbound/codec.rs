//! The pure half of the server: a snapshot encoded into register words
//! ([`encode_snapshot`], [`Image`]) and a BMS's write decoded and checked
//! against the map ([`decode_write`]). Scale, sentinels, clamping and
//! word order live here.
//!
//! Glossary:
//! - *raw*: a register's integer value before its scale is applied.
//! - *image*: every register's words for one snapshot.

use std::collections::BTreeMap;
use std::vec::Vec;

use loopwarden_boards::modbus_map::{Kind, Register, RegisterMap, Type};
use loopwarden_protocol::message::CduMode;
use tokio_modbus::ExceptionCode;

use super::{Alarms, NorthboundSnapshot, NorthboundWrite};

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
        "rejection_short" => s.rejection_short.map_or(NotAvailable, flag),
        "beacon" => flag(s.beacon),
        "pue" => opt(s.pue),
        "it_power" => opt(s.it_w),
        "facility_power" => opt(s.facility_w),
        "cooling_power" => opt(s.cooling_w),
        "writes_enabled" => flag(writes_enabled),
        "leak_sensing_lost" => Bits(s.leak_sensing_lost),
        "isolation_failed" => Bits(s.isolation_failed),
        "setpoint_ceiling" => Value(f64::from(s.settings.setpoint_ceiling_c)),
        "plan_ceiling_offset" => Value(f64::from(s.settings.plan_ceiling_offset_k)),
        "alarm_ack" => flag(s.settings.alarm_acknowledged),
        "outdoor_temp" => opt32(s.settings.outdoor_c),
        _ => return None,
    })
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

/// A setting's range in raw units.
fn raw_bounds(r: &Register) -> (i64, i64) {
    let lo = r.min.map_or(i64::MIN, |m| (m / r.scale).round() as i64);
    let hi = r.max.map_or(i64::MAX, |m| (m / r.scale).round() as i64);
    (lo, hi)
}

fn words_of(map: &RegisterMap, r: &Register, f: Field) -> Vec<u16> {
    let bits = match f {
        Field::NotAvailable => r.ty.sentinel(),
        Field::Bits(b) => u32::from(b),
        Field::Value(v) if !v.is_finite() => r.ty.sentinel(),
        Field::Value(v) => {
            let (lo, hi) = usable(r.ty);
            let mut raw = (v / r.scale).round().clamp(lo, hi) as i64;
            if r.kind == Kind::Holding {
                let (lo, hi) = raw_bounds(r);
                raw = raw.clamp(lo, hi);
            }
            r.ty.bits_of(raw as f64)
        }
    };
    map.word_order.split(r.ty, bits).to_vec()
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
        (u32::from(r.address)..u32::from(r.address) + u32::from(r.ty.words()))
            .map(|a| u16::try_from(a).ok().and_then(|a| table.get(&a).copied()))
            .collect()
    }
}

/// Encodes `snap` as `map` lays it out; `writes_enabled` fills the
/// register of that name. Registers the server does not know read 0 (a
/// map that passed [`check_map`](super::map::check_map) has none).
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
/// is to be applied. `alarm_ack` written 0 asks nothing; written 1, an
/// acknowledgement that saw nothing alarming (`seen` empty): the server
/// sets what its registers showed ([`NorthboundWrite::seeing`]).
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
        // Past the last address there is nothing (not address 0 again).
        let r = u16::try_from(a)
            .ok()
            .and_then(|a| map.at(Kind::Holding, a))
            .ok_or(ExceptionCode::IllegalDataAddress)?;
        let n = u32::from(r.ty.words());
        if a + n > end {
            return Err(ExceptionCode::IllegalDataAddress);
        }
        let from = (a - u32::from(addr)) as usize;
        let bits = map.word_order.join(r.ty, &words[from..from + n as usize]);
        // Exact: every raw value of a 32-bit type is an f64.
        let raw = r.ty.raw_of(bits) as i64;
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
            "alarm_ack" if raw != 0 => writes.push(NorthboundWrite::AlarmAck {
                seen: Alarms::default(),
            }),
            "alarm_ack" => {}
            "outdoor_temp" => writes.push(NorthboundWrite::OutdoorTemp {
                celsius: value as f32,
            }),
            _ => return Err(ExceptionCode::IllegalDataAddress),
        }
        a += n;
    }
    Ok(writes)
}
