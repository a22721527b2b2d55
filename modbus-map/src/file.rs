//! The register map file (`boards/cdus/*.toml`) as serde reads it, and
//! the checks a map must pass before anyone reads a CDU with it: the same
//! for the Linux controller (`loopwarden_boards::modbus_map::RegisterMap`)
//! and for the firmware's build script.
//!
//! Glossary:
//! - *model*: the CDU model the map is for; *unit id*: its Modbus address.
//! - *overlap*: two registers of one kind that share an address.
//! - *raw range*: the integers a register's type holds (0 to 65535 for a
//!   `u16`); a setting's range, divided by its scale, must lie within it.
//! - *bit word*: a register the controller reads or writes as bits or as
//!   a 0/1 flag ([`BIT_REGISTERS`]): it must carry its bits as they are,
//!   a `u16` at scale 1 (a signed or scaled one would misread a leak bit
//!   as dry).

use std::collections::BTreeMap;
use std::string::String;
use std::vec::Vec;

use serde::Deserialize;

use crate::{round, Kind, Register, Type, WordOrder, BIT_REGISTERS};

/// A map file as written: its registers in the file's order.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MapFile {
    /// Model name.
    pub model: String,
    /// Word order of 32-bit values.
    pub word_order: WordOrder,
    /// Modbus unit id.
    pub unit_id: u8,
    /// Every register, in the file's order.
    pub register: Vec<Register<String>>,
}

/// Why a map is refused: the first register that fails a check.
#[derive(Debug, Clone, PartialEq)]
pub enum MapError {
    /// Its scale is not a number above 0.
    Scale {
        /// The register.
        name: String,
    },
    /// A holding register without a range (min and max, min <= max).
    NoRange {
        /// The register.
        name: String,
    },
    /// A holding register whose range reaches past what its type holds
    /// at its scale: a write near an end of the range could not be sent.
    PastType {
        /// The register.
        name: String,
        /// Its range, in its unit.
        min: f64,
        /// The range's top.
        max: f64,
        /// Its scale.
        scale: f64,
        /// Its type.
        ty: Type,
    },
    /// An input register with a min or a max.
    InputRange {
        /// The register.
        name: String,
    },
    /// It runs past address 65535.
    PastEnd {
        /// The register.
        name: String,
    },
    /// It uses an address an earlier register of its kind uses.
    Overlap {
        /// The register.
        name: String,
        /// The earlier register.
        other: String,
        /// Their kind.
        kind: Kind,
        /// The first address both use.
        address: u16,
    },
    /// A second register of the same name.
    Twice {
        /// The name.
        name: String,
    },
    /// A bit word ([`BIT_REGISTERS`]) that is not a `u16` at scale 1.
    NotBits {
        /// The register.
        name: String,
        /// What it is.
        what: &'static str,
        /// Its type and scale, as the map gives them.
        found: String,
    },
}

impl core::fmt::Display for MapError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Scale { name } => write!(f, "{name}: scale must be above 0"),
            Self::NoRange { name } => write!(
                f,
                "{name}: a holding register needs min <= max, the range a write may set"
            ),
            Self::PastType {
                name,
                min,
                max,
                scale,
                ty,
            } => {
                let (lo, hi) = ty.raw_range();
                let (min_raw, max_raw) = (round(min / scale), round(max / scale));
                let a = if matches!(ty, Type::I16 | Type::I32) {
                    "an"
                } else {
                    "a"
                };
                let ty = std::format!("{ty:?}").to_lowercase();
                write!(
                    f,
                    "{name}: its range {min} to {max} is raw {min_raw} to {max_raw} at scale \
                     {scale}, past what {a} {ty} holds (raw {lo} to {hi}): a write near its end \
                     could not be sent"
                )
            }
            Self::InputRange { name } => write!(
                f,
                "{name}: min and max are for holding registers (input registers are read-only)"
            ),
            Self::PastEnd { name } => write!(f, "{name}: runs past address 65535"),
            Self::Overlap {
                name,
                other,
                kind,
                address,
            } => write!(f, "{name} and {other} both use {kind:?} register {address}"),
            Self::Twice { name } => write!(f, "register {name:?} appears twice"),
            Self::NotBits { name, what, found } => write!(
                f,
                "{name}: {what}, read as bits: a bit word needs type u16 at scale 1, not {found}"
            ),
        }
    }
}

impl std::error::Error for MapError {}

impl MapFile {
    /// Checks every register in the file's order: a scale above 0, a
    /// range for each setting, within what its type holds at its scale,
    /// and none for a measurement, each bit word a `u16` at scale 1, no
    /// address past 65535, no address two registers of one kind share, no
    /// name twice.
    pub fn check(&self) -> Result<(), MapError> {
        let mut names: BTreeMap<&str, ()> = BTreeMap::new();
        let mut taken: BTreeMap<(bool, u16), &str> = BTreeMap::new();
        for r in &self.register {
            let name = || r.name.clone();
            if !(r.scale.is_finite() && r.scale > 0.0) {
                return Err(MapError::Scale { name: name() });
            }
            check_bits(r)?;
            match (r.kind, r.min, r.max) {
                (Kind::Holding, Some(lo), Some(hi)) if lo <= hi => check_type_holds(r, lo, hi)?,
                (Kind::Holding, _, _) => return Err(MapError::NoRange { name: name() }),
                (Kind::Input, None, None) => {}
                (Kind::Input, _, _) => return Err(MapError::InputRange { name: name() }),
            }
            let end = u32::from(r.address) + u32::from(r.ty.words());
            if end > 65_536 {
                return Err(MapError::PastEnd { name: name() });
            }
            // `end` is at most 65536: each of the register's addresses fits.
            for a in (u32::from(r.address)..end).map(|a| a as u16) {
                if let Some(other) = taken.insert((r.kind == Kind::Holding, a), &r.name) {
                    return Err(MapError::Overlap {
                        name: name(),
                        other: other.into(),
                        kind: r.kind,
                        address: a,
                    });
                }
            }
            if names.insert(&r.name, ()).is_some() {
                return Err(MapError::Twice { name: name() });
            }
        }
        Ok(())
    }
}

/// Every value of setting `r`'s range `min` to `max` encodes: the raw
/// integers its ends round to ([`round`], as [`Register::encode`] does)
/// lie within its type's ([`Type::raw_range`]), and so do those of every
/// value between.
fn check_type_holds(r: &Register<String>, min: f64, max: f64) -> Result<(), MapError> {
    let (lo, hi) = r.ty.raw_range();
    if round(min / r.scale) >= lo && round(max / r.scale) <= hi {
        return Ok(());
    }
    Err(MapError::PastType {
        name: r.name.clone(),
        min,
        max,
        scale: r.scale,
        ty: r.ty,
    })
}

/// A bit word ([`BIT_REGISTERS`]) is a `u16` at scale 1; other registers
/// pass.
fn check_bits(r: &Register<String>) -> Result<(), MapError> {
    let Some((_, what)) = BIT_REGISTERS.iter().find(|(n, _)| *n == r.name) else {
        return Ok(());
    };
    if r.ty == Type::U16 && r.scale == 1.0 {
        return Ok(());
    }
    Err(MapError::NotBits {
        name: r.name.clone(),
        what,
        found: std::format!("{:?} at scale {}", r.ty, r.scale).to_lowercase(),
    })
}
