//! The CDU's register map, as the build generated it from the CDU's map
//! file (`LOOPWARDEN_FIRMWARE_CDU_MAP`; without it
//! `boards/cdus/sim-cdu.toml`; the files the Linux controller reads): every
//! register with its kind, address, type, scale, unit and range, the runs
//! of input registers one read takes, and a const for each register the
//! firmware uses. What a register is and how its words become a value and
//! back are `loopwarden_modbus_map`'s, the same code
//! `loopwarden_boards::modbus_map::RegisterMap` runs on Linux; here they
//! take the map's word order and name the register in what they refuse.
//!
//! Glossary:
//! - *raw*: the register's integer; *value*: raw × scale, in the unit.
//! - *word order*: which of the two registers of a 32-bit value holds its
//!   high 16 bits.
//! - *span*: a run of contiguous input registers read in one request.

use core::fmt;

use loopwarden_modbus_map::EncodeError;
pub use loopwarden_modbus_map::{round, Kind, Type, WordOrder, Words};

/// One register (or register pair) of the map, its texts built in.
pub type Register = loopwarden_modbus_map::Register<&'static str>;

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

/// The longest answer the firmware asks of the CDU, bytes: a read of the
/// longest span (unit, function, byte count, the words, CRC), or a
/// write's echo (8 bytes), whichever is longer.
pub const fn longest_answer_bytes() -> u32 {
    let mut longest = 8;
    let mut i = 0;
    while i < SPANS.len() {
        let read = 5 + 2 * SPANS[i].count as u32;
        if read > longest {
            longest = read;
        }
        i += 1;
    }
    longest
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

/// The words of `value` for `r` in the map's word order; for a holding
/// register it must be within the register's range.
pub fn encode(r: &Register, value: f64) -> Result<Words, ValueError> {
    encode_in(WORD_ORDER, r, value)
}

/// The value of `r`'s `words` in the map's word order (as many as its
/// type takes; missing words read 0).
pub fn decode(r: &Register, words: &[u16]) -> f64 {
    r.decode(WORD_ORDER, words)
}

/// The measurement `r`'s `words` carry in the map's word order, or `None`
/// where the CDU says it has none (its type's sentinel; bit words keep
/// every pattern), as the Linux controller reads it.
pub fn reading(r: &Register, words: &[u16]) -> Option<f64> {
    r.reading(WORD_ORDER, words)
}

fn encode_in(order: WordOrder, r: &Register, value: f64) -> Result<Words, ValueError> {
    r.encode(order, value).map_err(|e| match e {
        EncodeError::OutOfRange { min, max } => ValueError::OutOfRange {
            name: r.name,
            value,
            min,
            max,
        },
        EncodeError::DoesNotFit => ValueError::DoesNotFit {
            name: r.name,
            value,
        },
    })
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
        assert_eq!(encode(SUPPLY_SETPOINT, 30.004).unwrap().as_slice(), &[3000]);
        assert_eq!(decode(SUPPLY_TEMP, &[(-1234i16) as u16]), -12.34);
        assert_eq!(decode(IT_POWER, &[0x0001, 0x86A0]), 100_000.0);
        assert_eq!(encode(PUMP_SPEED, 80.0).unwrap().as_slice(), &[800]);
        assert_eq!(
            encode(SUPPLY_SETPOINT, 16.0),
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
        let e = encode(SUPPLY_SETPOINT, 50.0).unwrap_err();
        assert_eq!(
            std::format!("{e}"),
            "supply_setpoint: 50.00 is outside 17.00 to 45.00"
        );
    }

    mod agreed {
        use super::super::{Type, WordOrder};
        use loopwarden_modbus_map::{Kind, Register};
        include!("../../modbus-map/src/cases.rs");
    }

    /// The words and values loopwarden-boards' tests hold the Linux side
    /// to (`modbus-map/src/cases.rs`), through the firmware's calls: the
    /// map's word order through [`encode`] and [`decode`], the other
    /// through the same path with that order.
    #[test]
    fn the_agreed_cases_read_and_write_as_on_linux() {
        for (l, words, want) in agreed::DECODE {
            let r = l.register();
            let got = if l.order == WORD_ORDER {
                decode(&r, words)
            } else {
                r.decode(l.order, words)
            };
            assert_eq!(got.to_bits(), want.to_bits(), "{l:?} {words:04X?}: {got}");
        }
        for (l, value, want) in agreed::ENCODE {
            let r = l.register();
            let got = if l.order == WORD_ORDER {
                encode(&r, *value)
            } else {
                encode_in(l.order, &r, *value)
            };
            let got = match got {
                Ok(w) => agreed::Want::Words(std::vec::Vec::leak(w.to_vec())),
                Err(ValueError::OutOfRange { name, min, max, .. }) => {
                    assert_eq!((name, Some((min, max))), ("case", l.range), "{l:?}");
                    agreed::Want::OutOfRange
                }
                Err(ValueError::DoesNotFit { name, .. }) => {
                    assert_eq!(name, "case");
                    agreed::Want::DoesNotFit
                }
            };
            assert_eq!(got, *want, "{l:?} {value}");
        }
    }
}
