//! The CDU's register map, as the build generated it from
//! `boards/cdus/sim-cdu.toml` (the file the Linux controller reads): every
//! register with its kind, address, type, scale, unit and range, the runs
//! of input registers one read takes, and a const for each register the
//! firmware uses. Values are decoded and encoded here exactly as
//! `loopwarden_boards::modbus_map::RegisterMap` does it.
//!
//! Glossary:
//! - *raw*: the register's integer; *value*: raw × scale, in the unit.
//! - *word order*: which of the two registers of a 32-bit value holds its
//!   high 16 bits.
//! - *span*: a run of contiguous input registers read in one request.

use core::fmt;

/// Register kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Read-only measurement (function 4).
    Input,
    /// Setting (functions 6 and 16).
    Holding,
}

/// Register type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// Unsigned 16 bits.
    U16,
    /// Signed 16 bits.
    I16,
    /// Unsigned 32 bits, two registers.
    U32,
    /// Signed 32 bits, two registers.
    I32,
}

impl Type {
    /// Registers it takes.
    pub const fn words(self) -> usize {
        match self {
            Type::U16 | Type::I16 => 1,
            Type::U32 | Type::I32 => 2,
        }
    }

    fn raw_range(self) -> (f64, f64) {
        match self {
            Type::U16 => (0.0, u16::MAX as f64),
            Type::I16 => (i16::MIN as f64, i16::MAX as f64),
            Type::U32 => (0.0, u32::MAX as f64),
            Type::I32 => (i32::MIN as f64, i32::MAX as f64),
        }
    }
}

/// Which register of a 32-bit value comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WordOrder {
    /// High 16 bits at the lower address.
    HighFirst,
    /// Low 16 bits at the lower address.
    LowFirst,
}

/// One register (or register pair) of the map.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Register {
    /// Name, unique in the map.
    pub name: &'static str,
    /// Input or holding.
    pub kind: Kind,
    /// First address (0-based).
    pub address: u16,
    /// Type.
    pub ty: Type,
    /// Value per raw unit.
    pub scale: f64,
    /// Unit of the value.
    pub unit: &'static str,
    /// Lowest value a write may set (holding registers).
    pub min: Option<f64>,
    /// Highest value a write may set (holding registers).
    pub max: Option<f64>,
}

/// Input registers read in one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// First address.
    pub start: u16,
    /// Registers (words) asked.
    pub count: u16,
    /// Its registers, as indices into [`REGISTERS`], by address.
    pub registers: &'static [usize],
}

impl Span {
    /// Its first and last register's names.
    pub fn names(&self) -> (&'static str, &'static str) {
        let name = |i: Option<&usize>| i.map_or("", |i| REGISTERS[*i].name);
        (name(self.registers.first()), name(self.registers.last()))
    }
}

/// Why a value cannot go into a register.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ValueError {
    /// Outside the setting's range (the CDU would answer exception 3).
    OutOfRange {
        /// The register.
        name: &'static str,
        /// The value asked.
        value: f64,
        /// Lowest allowed.
        min: f64,
        /// Highest allowed.
        max: f64,
    },
    /// Does not fit the register's type at its scale.
    DoesNotFit {
        /// The register.
        name: &'static str,
        /// The value asked.
        value: f64,
    },
}

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueError::OutOfRange {
                name,
                value,
                min,
                max,
            } => write!(
                f,
                "{name}: {} is outside {} to {}",
                Centi(*value),
                Centi(*min),
                Centi(*max)
            ),
            ValueError::DoesNotFit { name, value } => write!(
                f,
                "{name}: {} does not fit the register at its scale",
                Centi(*value)
            ),
        }
    }
}

/// A value printed with two decimals from an integer, so the firmware
/// carries no float formatting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Centi(pub f64);

impl fmt::Display for Centi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = round(self.0 * 100.0);
        if !c.is_finite() || c.abs() > 9.0e15 {
            return write!(f, "(not a number)");
        }
        let c = c as i64;
        let sign = if c < 0 { "-" } else { "" };
        write!(f, "{sign}{}.{:02}", c.abs() / 100, c.abs() % 100)
    }
}

/// Words of one value: one or two.
pub type Words = heapless::Vec<u16, 2>;

impl Register {
    /// The words of `value`; for a holding register it must be within
    /// the register's range.
    pub fn encode(&self, value: f64) -> Result<Words, ValueError> {
        if let (Some(min), Some(max)) = (self.min, self.max) {
            if !(min..=max).contains(&value) {
                return Err(ValueError::OutOfRange {
                    name: self.name,
                    value,
                    min,
                    max,
                });
            }
        }
        let raw = round(value / self.scale);
        let (lo, hi) = self.ty.raw_range();
        if !raw.is_finite() || raw < lo || raw > hi {
            return Err(ValueError::DoesNotFit {
                name: self.name,
                value,
            });
        }
        let bits: u32 = match self.ty {
            Type::U16 => raw as u16 as u32,
            Type::I16 => raw as i16 as u16 as u32,
            Type::U32 => raw as u32,
            Type::I32 => raw as i32 as u32,
        };
        let words: &[u16] = match (self.ty.words(), WORD_ORDER) {
            (1, _) => &[bits as u16],
            (_, WordOrder::HighFirst) => &[(bits >> 16) as u16, bits as u16],
            (_, WordOrder::LowFirst) => &[bits as u16, (bits >> 16) as u16],
        };
        Ok(Words::from_slice(words).unwrap_or_default())
    }

    /// The value of its `words` (as many as its type takes; missing
    /// words read 0).
    pub fn decode(&self, words: &[u16]) -> f64 {
        let w = |i: usize| u32::from(words.get(i).copied().unwrap_or(0));
        let bits = match (self.ty.words(), WORD_ORDER) {
            (1, _) => w(0),
            (_, WordOrder::HighFirst) => (w(0) << 16) | w(1),
            (_, WordOrder::LowFirst) => (w(1) << 16) | w(0),
        };
        let raw = match self.ty {
            Type::U16 => f64::from(bits as u16),
            Type::I16 => f64::from(bits as u16 as i16),
            Type::U32 => f64::from(bits),
            Type::I32 => f64::from(bits as i32),
        };
        raw * self.scale
    }
}

/// Rounds half away from zero, as `f64::round` (which `core` lacks).
pub fn round(x: f64) -> f64 {
    if !x.is_finite() || x.abs() >= 4_503_599_627_370_496.0 {
        return x;
    }
    let t = x as i64 as f64;
    let frac = x - t;
    if frac >= 0.5 {
        t + 1.0
    } else if frac <= -0.5 {
        t - 1.0
    } else {
        t
    }
}

include!(concat!(env!("OUT_DIR"), "/cdu_map.rs"));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_table_is_the_shipped_map() {
        assert_eq!(UNIT_ID, 1);
        assert_eq!(WORD_ORDER, WordOrder::HighFirst);
        assert_eq!(SUPPLY_TEMP.address, 0);
        assert_eq!(SUPPLY_TEMP.ty, Type::I16);
        assert_eq!(SUPPLY_SETPOINT.min, Some(17.0));
        assert_eq!(SUPPLY_SETPOINT.max, Some(45.0));
        assert_eq!(PUMP_SPEED.scale, 0.1);
        assert_eq!(HEARTBEAT.kind, Kind::Holding);
        assert!(OUTDOOR_TEMP.is_some());
        // The same two reads as the Linux controller (`reads_take_one_request_per_contiguous_run`).
        let spans: [(u16, u16); 2] = SPANS.map(|s| (s.start, s.count));
        assert_eq!(spans, [(0, 7), (10, 11)]);
        assert_eq!(SPANS[0].names(), ("supply_temp", "leak_inputs"));
        assert_eq!(SPANS[1].names(), ("it_power", "outdoor_temp"));
    }

    #[test]
    fn values_round_trip_at_the_maps_scale_and_word_order() {
        assert_eq!(SUPPLY_SETPOINT.encode(30.004).unwrap().as_slice(), &[3000]);
        assert_eq!(SUPPLY_TEMP.decode(&[(-1234i16) as u16]), -12.34);
        assert_eq!(IT_POWER.decode(&[0x0001, 0x86A0]), 100_000.0);
        assert_eq!(PUMP_SPEED.encode(80.0).unwrap().as_slice(), &[800]);
        assert_eq!(
            SUPPLY_SETPOINT.encode(16.0),
            Err(ValueError::OutOfRange {
                name: "supply_setpoint",
                value: 16.0,
                min: 17.0,
                max: 45.0
            })
        );
        assert_eq!(round(2.5), 3.0);
        assert_eq!(round(-2.5), -3.0);
        assert_eq!(round(-0.4), 0.0);
        assert_eq!(std::format!("{}", Centi(-3.456)), "-3.46");
        assert_eq!(std::format!("{}", Centi(17.0)), "17.00");
        let e = SUPPLY_SETPOINT.encode(50.0).unwrap_err();
        assert_eq!(
            std::format!("{e}"),
            "supply_setpoint: 50.00 is outside 17.00 to 45.00"
        );
    }
}
