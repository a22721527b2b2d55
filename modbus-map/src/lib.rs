//! What a CDU's Modbus register is and how its words become a value and
//! back: one definition for the Linux controller and the twin (through
//! `loopwarden_boards::modbus_map`, which reads the map files) and for the
//! firmware (which has the map turned into a const table at build time).
//! `no_std`, no allocation; with the `std` feature, the map file's shape
//! and its checks (`MapFile`) and which input registers one read takes
//! (`input_spans`), for the hosts that read the file.
//!
//! Glossary:
//! - *raw*: the register's integer; *value*: raw × scale, in the unit.
//! - *bits*: the raw integer as the 16 or 32 bits the registers carry
//!   (two's complement for the signed types).
//! - *word order*: which of the two registers of a 32-bit value holds the
//!   high 16 bits (`high_first`, the usual Modbus convention, or
//!   `low_first`).
//! - *range*: for a setting (holding register), the values a write may
//!   set; the CDU answers a write outside it with Modbus exception 3.

#![no_std]
#![forbid(unsafe_code)]

#[cfg(feature = "std")]
extern crate std;

#[cfg(feature = "std")]
mod file;

#[cfg(feature = "std")]
pub use file::{MapError, MapFile};

#[cfg(feature = "std")]
pub mod fit;

#[cfg(feature = "std")]
mod spans;

#[cfg(feature = "std")]
pub use spans::{input_spans, Span, MAX_READ};

#[cfg(feature = "std")]
use serde::Deserialize;

/// The registers read or written as bits or as 0/1 flags, and what each
/// is: each must be a `u16` at scale 1 where a map has it.
pub const BIT_REGISTERS: [(&str, &str); 10] = [
    ("leak_inputs", "the leak inputs, bit n = rack n"),
    (
        "valves_closed",
        "the valves' closed feedback, bit n = rack n",
    ),
    ("valves_open", "the rack valves to open, bit n = rack n"),
    ("pumps_run", "the pumps to run, bit 0 A, bit 1 B"),
    ("lead_pump", "the lead pump, 0 A, 1 B"),
    ("pump_a_running", "pump A's running flag"),
    ("pump_b_running", "pump B's running flag"),
    ("pump_a_fault", "pump A's fault flag"),
    ("pump_b_fault", "pump B's fault flag"),
    ("heartbeat", "the heartbeat counter"),
];

/// The valve word's value for every valve of `racks` racks open (bit n =
/// rack n).
pub fn every_valve(racks: u8) -> f64 {
    f64::from((1u32 << racks.min(31)) - 1)
}

/// Whether a setting's range `min` to `max` holds every value from 0 to
/// `hi` (a bit word's every bit clear to every bit wanted set).
pub fn range_holds(min: f64, max: f64, hi: f64) -> bool {
    min <= 0.0 && max >= hi
}

/// Register kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "std", derive(Deserialize), serde(rename_all = "snake_case"))]
pub enum Kind {
    /// Read-only measurement (function 4).
    Input,
    /// Setting (functions 3, 6, 16).
    Holding,
}

/// Register type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "std", derive(Deserialize), serde(rename_all = "snake_case"))]
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
    pub const fn words(self) -> u16 {
        match self {
            Self::U16 | Self::I16 => 1,
            Self::U32 | Self::I32 => 2,
        }
    }

    /// The lowest and highest raw integer it holds.
    pub fn raw_range(self) -> (f64, f64) {
        match self {
            Self::U16 => (0.0, u16::MAX as f64),
            Self::I16 => (i16::MIN as f64, i16::MAX as f64),
            Self::U32 => (0.0, u32::MAX as f64),
            Self::I32 => (i32::MIN as f64, i32::MAX as f64),
        }
    }

    /// The bits a device puts in a measurement of this type to say "not
    /// available": `0xFFFF` (u16), `0x8000` (i16), `0xFFFFFFFF` (u32),
    /// `0x80000000` (i32). The northbound server writes them the same way.
    pub const fn sentinel(self) -> u32 {
        match self {
            Self::U16 => 0xFFFF,
            Self::I16 => 0x8000,
            Self::U32 => 0xFFFF_FFFF,
            Self::I32 => 0x8000_0000,
        }
    }

    /// The raw integer its `bits` carry (the low 16 for one register).
    pub fn raw_of(self, bits: u32) -> f64 {
        match self {
            Self::U16 => f64::from(bits as u16),
            Self::I16 => f64::from(bits as u16 as i16),
            Self::U32 => f64::from(bits),
            Self::I32 => f64::from(bits as i32),
        }
    }

    /// The bits of `raw`, a whole number within [`Type::raw_range`].
    pub fn bits_of(self, raw: f64) -> u32 {
        match self {
            Self::U16 => raw as u16 as u32,
            Self::I16 => raw as i16 as u16 as u32,
            Self::U32 => raw as u32,
            Self::I32 => raw as i32 as u32,
        }
    }
}

/// Which register of a 32-bit value comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "std", derive(Deserialize), serde(rename_all = "snake_case"))]
pub enum WordOrder {
    /// High 16 bits at the lower address.
    HighFirst,
    /// Low 16 bits at the lower address.
    LowFirst,
}

impl WordOrder {
    /// The bits of a `ty` from its `words`, by address; a missing word
    /// reads 0.
    pub fn join(self, ty: Type, words: &[u16]) -> u32 {
        let w = |i: usize| u32::from(words.get(i).copied().unwrap_or(0));
        match (ty.words(), self) {
            (1, _) => w(0),
            (_, Self::HighFirst) => (w(0) << 16) | w(1),
            (_, Self::LowFirst) => (w(1) << 16) | w(0),
        }
    }

    /// The words, by address, that carry the `bits` of a `ty`.
    pub fn split(self, ty: Type, bits: u32) -> Words {
        let (high, low) = ((bits >> 16) as u16, bits as u16);
        match (ty.words(), self) {
            (1, _) => Words::one(low),
            (_, Self::HighFirst) => Words::two(high, low),
            (_, Self::LowFirst) => Words::two(low, high),
        }
    }
}

/// The words of one value: one or two registers, by address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Words {
    words: [u16; 2],
    len: usize,
}

impl Words {
    fn one(w: u16) -> Self {
        Self {
            words: [w, 0],
            len: 1,
        }
    }

    fn two(first: u16, second: u16) -> Self {
        Self {
            words: [first, second],
            len: 2,
        }
    }

    /// The words, by address.
    pub fn as_slice(&self) -> &[u16] {
        &self.words[..self.len]
    }
}

impl core::ops::Deref for Words {
    type Target = [u16];

    fn deref(&self) -> &[u16] {
        self.as_slice()
    }
}

/// One register (or register pair) of a map. `S` is its texts' type:
/// `String` where the map is read from its file at run time
/// (`loopwarden_boards::modbus_map::Register`), `&'static str` in a
/// table built in (the firmware's).
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "std", derive(Deserialize), serde(deny_unknown_fields))]
pub struct Register<S> {
    /// Name, unique in the map.
    pub name: S,
    /// Input or holding.
    pub kind: Kind,
    /// First address (0-based).
    pub address: u16,
    /// Type.
    #[cfg_attr(feature = "std", serde(rename = "type"))]
    pub ty: Type,
    /// Value per raw unit.
    pub scale: f64,
    /// Unit of the value.
    #[cfg_attr(feature = "std", serde(default))]
    pub unit: S,
    /// Lowest value a write may set (holding registers).
    pub min: Option<f64>,
    /// Highest value a write may set (holding registers).
    pub max: Option<f64>,
    /// What it is.
    #[cfg_attr(feature = "std", serde(default))]
    pub description: S,
}

/// Why a value cannot go into a register.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EncodeError {
    /// Outside the setting's range (Modbus exception 3).
    OutOfRange {
        /// Lowest allowed.
        min: f64,
        /// Highest allowed.
        max: f64,
    },
    /// Does not fit the register's type at its scale (or is not a
    /// number).
    DoesNotFit,
}

impl<S> Register<S> {
    /// The words of `value`, in `order`: value / scale rounded half away
    /// from zero. For a register with a range (a setting) the value must be
    /// within it, and a value that is not a number is outside every range.
    pub fn encode(&self, order: WordOrder, value: f64) -> Result<Words, EncodeError> {
        if let (Some(min), Some(max)) = (self.min, self.max) {
            if !(min..=max).contains(&value) {
                return Err(EncodeError::OutOfRange { min, max });
            }
        }
        let raw = round(value / self.scale);
        let (lo, hi) = self.ty.raw_range();
        if !raw.is_finite() || raw < lo || raw > hi {
            return Err(EncodeError::DoesNotFit);
        }
        Ok(order.split(self.ty, self.ty.bits_of(raw)))
    }

    /// The value of its `words` in `order` (as many as its type takes; a
    /// missing word reads 0). Every pattern of bits has a value: a
    /// "no value" sentinel (`0x8000` in an i16) decodes as the number it
    /// is, for the caller to judge.
    pub fn decode(&self, order: WordOrder, words: &[u16]) -> f64 {
        self.ty.raw_of(order.join(self.ty, words)) * self.scale
    }

    /// The value written for heartbeat step `counter` (a whole number):
    /// `min + counter mod (max - min + 1)` over the whole numbers of its
    /// range, so it changes every step whatever the range (a range of 0
    /// to 255 would refuse step 256 on, and the heartbeat would stop for
    /// good). Without a range, or with one that holds no whole number or
    /// reaches past ±2^53, `counter` as a 16-bit word holds it (modulo
    /// 65,536); a `counter` that is not a whole number within ±2^53
    /// itself.
    pub fn heartbeat(&self, counter: f64) -> f64 {
        let word = |c: f64| exact_whole(c).map_or(c, |c| c.rem_euclid(65_536) as f64);
        let Some((min, max)) = self.min.zip(self.max) else {
            return word(counter);
        };
        let whole = (
            whole_at_least(min),
            whole_at_most(max),
            exact_whole(counter),
        );
        let (Some(lo), Some(hi), Some(c)) = whole else {
            return word(counter);
        };
        // Within ±2^53 each: no overflow, and every result is exact.
        let values = hi - lo + 1;
        if values < 1 {
            return word(counter);
        }
        (lo + c.rem_euclid(values)) as f64
    }
}

/// 2^53: up to it every whole number is an f64, and an i64 holds it.
const EXACT: f64 = 9_007_199_254_740_992.0;

/// The least whole number at or above `x` (`x.ceil()`), where it lies
/// within ±2^53.
fn whole_at_least(x: f64) -> Option<i64> {
    if x.is_nan() || x.abs() > EXACT {
        return None;
    }
    // Cut toward zero, exactly.
    let t = x as i64;
    Some(if (t as f64) < x { t + 1 } else { t })
}

/// The greatest whole number at or below `x` (`x.floor()`), where it
/// lies within ±2^53.
fn whole_at_most(x: f64) -> Option<i64> {
    if x.is_nan() || x.abs() > EXACT {
        return None;
    }
    let t = x as i64;
    Some(if (t as f64) > x { t - 1 } else { t })
}

/// `x` as an integer, where it is a whole number within ±2^53.
fn exact_whole(x: f64) -> Option<i64> {
    whole_at_least(x).filter(|t| *t as f64 == x)
}

impl<S: AsRef<str>> Register<S> {
    /// The measurement its `words` in `order` carry, as [`Register::decode`]
    /// reads it, or `None` where the device says it has none: a register
    /// that is not a bit word ([`BIT_REGISTERS`]) holding its type's
    /// [`Type::sentinel`]. A bit word keeps every pattern (`0xFFFF` is
    /// every leak input wet).
    pub fn reading(&self, order: WordOrder, words: &[u16]) -> Option<f64> {
        let bit_word = BIT_REGISTERS.iter().any(|(n, _)| *n == self.name.as_ref());
        if !bit_word && order.join(self.ty, words) == self.ty.sentinel() {
            return None;
        }
        Some(self.decode(order, words))
    }
}

/// Rounds half away from zero, as `f64::round` (which `core` lacks) does,
/// but for the sign of a zero: -0.4 rounds to +0.0 here, -0.0 there (the
/// same words either way).
pub fn round(x: f64) -> f64 {
    // From 2^52 up every f64 is a whole number.
    if !x.is_finite() || x.abs() >= 4_503_599_627_370_496.0 {
        return x;
    }
    let t = x as i64 as f64;
    // Exact: t is x with its fraction cut off.
    let frac = x - t;
    if frac >= 0.5 {
        t + 1.0
    } else if frac <= -0.5 {
        t - 1.0
    } else {
        t
    }
}

#[cfg(test)]
mod tests;
