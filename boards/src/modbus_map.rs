//! Modbus register maps of CDU models, as data (`boards/cdus/*.toml`).
//!
//! A map names every register a controller reads or writes: its kind
//! (input: a read-only measurement; holding: a setting), address, type,
//! scale and unit, and for settings the range the CDU accepts. The twin's
//! simulated CDU serves a map; the controller's Modbus client reads the
//! same file, so scaling and 32-bit word order live in one place.
//!
//! Glossary:
//! - *raw*: the register's integer; *value*: raw × scale, in the unit.
//! - *word order*: which of the two registers of a 32-bit value holds the
//!   high 16 bits (`high_first`, the usual Modbus convention, or
//!   `low_first`).
//! - *exception 3*: Modbus "illegal data value", the answer to a write
//!   outside a setting's range.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::BoardError;

/// Register kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Read-only measurement (function 4).
    Input,
    /// Setting (functions 3, 6, 16).
    Holding,
}

/// Register type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
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
    pub fn words(self) -> u16 {
        match self {
            Self::U16 | Self::I16 => 1,
            Self::U32 | Self::I32 => 2,
        }
    }

    fn raw_range(self) -> (f64, f64) {
        match self {
            Self::U16 => (0.0, u16::MAX as f64),
            Self::I16 => (i16::MIN as f64, i16::MAX as f64),
            Self::U32 => (0.0, u32::MAX as f64),
            Self::I32 => (i32::MIN as f64, i32::MAX as f64),
        }
    }
}

/// Which register of a 32-bit value comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WordOrder {
    /// High 16 bits at the lower address.
    HighFirst,
    /// Low 16 bits at the lower address.
    LowFirst,
}

/// One register (or register pair).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Register {
    /// Name, unique in the map.
    pub name: String,
    /// Input or holding.
    pub kind: Kind,
    /// First address (0-based).
    pub address: u16,
    /// Type.
    #[serde(rename = "type")]
    pub ty: Type,
    /// Value per raw unit.
    pub scale: f64,
    /// Unit of the value.
    #[serde(default)]
    pub unit: String,
    /// Lowest value a write may set (holding registers).
    pub min: Option<f64>,
    /// Highest value a write may set (holding registers).
    pub max: Option<f64>,
    /// What it is.
    #[serde(default)]
    pub description: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    model: String,
    word_order: WordOrder,
    unit_id: u8,
    register: Vec<Register>,
}

/// Why a value cannot go into a register.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValueError {
    /// No register of that name.
    #[error("no register named {0:?}")]
    Unknown(String),
    /// Outside the setting's range (Modbus exception 3).
    #[error("{name}: {value} {unit} is outside {min} to {max} {unit}")]
    OutOfRange {
        /// The register.
        name: String,
        /// The value asked.
        value: f64,
        /// Its unit.
        unit: String,
        /// Lowest allowed.
        min: f64,
        /// Highest allowed.
        max: f64,
    },
    /// Does not fit the register's type at its scale.
    #[error("{name}: {value} does not fit a {ty:?} at scale {scale}")]
    DoesNotFit {
        /// The register.
        name: String,
        /// The value asked.
        value: f64,
        /// Its type.
        ty: Type,
        /// Its scale.
        scale: f64,
    },
}

/// A CDU model's register map.
#[derive(Debug, Clone, PartialEq)]
pub struct RegisterMap {
    /// Model name.
    pub model: String,
    /// Word order of 32-bit values.
    pub word_order: WordOrder,
    /// Modbus unit id.
    pub unit_id: u8,
    by_name: BTreeMap<String, Register>,
}

impl RegisterMap {
    /// Parses and checks a map; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, BoardError> {
        let file: File = crate::parse_checked(text, origin, |_| Ok(()))?;
        let invalid = |message: String| BoardError::Invalid {
            origin: origin.to_string(),
            message,
        };
        let mut by_name = BTreeMap::new();
        let mut taken: BTreeMap<(bool, u16), String> = BTreeMap::new();
        for r in file.register {
            if !(r.scale.is_finite() && r.scale > 0.0) {
                return Err(invalid(format!("{}: scale must be above 0", r.name)));
            }
            match (r.kind, r.min, r.max) {
                (Kind::Holding, Some(lo), Some(hi)) if lo <= hi => {}
                (Kind::Holding, _, _) => {
                    return Err(invalid(format!(
                        "{}: a holding register needs min <= max, the range a write may set",
                        r.name
                    )))
                }
                (Kind::Input, None, None) => {}
                (Kind::Input, _, _) => {
                    return Err(invalid(format!(
                        "{}: min and max are for holding registers (input registers are read-only)",
                        r.name
                    )))
                }
            }
            let end = u32::from(r.address) + u32::from(r.ty.words());
            if end > 65_536 {
                return Err(invalid(format!("{}: runs past address 65535", r.name)));
            }
            // `end` is at most 65536: each of the register's addresses fits.
            for a in (u32::from(r.address)..end).map(|a| a as u16) {
                let key = (r.kind == Kind::Holding, a);
                if let Some(other) = taken.insert(key, r.name.clone()) {
                    return Err(invalid(format!(
                        "{} and {other} both use {:?} register {a}",
                        r.name, r.kind
                    )));
                }
            }
            if by_name.insert(r.name.clone(), r.clone()).is_some() {
                return Err(invalid(format!("register {:?} appears twice", r.name)));
            }
        }
        Ok(Self {
            model: file.model,
            word_order: file.word_order,
            unit_id: file.unit_id,
            by_name,
        })
    }

    /// The simulated CDU's map, shipped with this crate.
    pub fn sim_cdu() -> Self {
        Self::from_toml(include_str!("../cdus/sim-cdu.toml"), "cdus/sim-cdu.toml")
            .expect("the shipped map is valid")
    }

    /// A register by name.
    pub fn get(&self, name: &str) -> Option<&Register> {
        self.by_name.get(name)
    }

    /// Every register, by name.
    pub fn registers(&self) -> impl Iterator<Item = &Register> {
        self.by_name.values()
    }

    /// The register of `kind` that starts at `address`.
    pub fn at(&self, kind: Kind, address: u16) -> Option<&Register> {
        self.by_name
            .values()
            .find(|r| r.kind == kind && r.address == address)
    }

    /// The words of `value` for register `name`; for a holding register
    /// the value must be within its range.
    pub fn encode(&self, name: &str, value: f64) -> Result<Vec<u16>, ValueError> {
        let r = self
            .get(name)
            .ok_or_else(|| ValueError::Unknown(name.to_string()))?;
        if let (Some(min), Some(max)) = (r.min, r.max) {
            if !(min..=max).contains(&value) {
                return Err(ValueError::OutOfRange {
                    name: r.name.clone(),
                    value,
                    unit: r.unit.clone(),
                    min,
                    max,
                });
            }
        }
        let raw = (value / r.scale).round();
        let (lo, hi) = r.ty.raw_range();
        if !raw.is_finite() || raw < lo || raw > hi {
            return Err(ValueError::DoesNotFit {
                name: r.name.clone(),
                value,
                ty: r.ty,
                scale: r.scale,
            });
        }
        let bits: u32 = match r.ty {
            Type::U16 => raw as u16 as u32,
            Type::I16 => raw as i16 as u16 as u32,
            Type::U32 => raw as u32,
            Type::I32 => raw as i32 as u32,
        };
        Ok(match (r.ty.words(), self.word_order) {
            (1, _) => vec![bits as u16],
            (_, WordOrder::HighFirst) => vec![(bits >> 16) as u16, bits as u16],
            (_, WordOrder::LowFirst) => vec![bits as u16, (bits >> 16) as u16],
        })
    }

    /// The value of register `name` from its words (as many as its type
    /// takes, in the map's word order).
    pub fn decode(&self, name: &str, words: &[u16]) -> Result<f64, ValueError> {
        let r = self
            .get(name)
            .ok_or_else(|| ValueError::Unknown(name.to_string()))?;
        let w = |i: usize| u32::from(words.get(i).copied().unwrap_or(0));
        let bits = match (r.ty.words(), self.word_order) {
            (1, _) => w(0),
            (_, WordOrder::HighFirst) => (w(0) << 16) | w(1),
            (_, WordOrder::LowFirst) => (w(1) << 16) | w(0),
        };
        let raw = match r.ty {
            Type::U16 => f64::from(bits as u16),
            Type::I16 => f64::from(bits as u16 as i16),
            Type::U32 => f64::from(bits),
            Type::I32 => f64::from(bits as i32),
        };
        Ok(raw * r.scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_map_encodes_and_decodes_with_its_scale() {
        let m = RegisterMap::sim_cdu();
        assert_eq!(m.unit_id, 1);
        assert_eq!(m.encode("supply_temp", 32.05).unwrap(), vec![3205]);
        assert_eq!(
            m.encode("supply_temp", -1.5).unwrap(),
            vec![(-150i16) as u16]
        );
        assert_eq!(m.decode("supply_temp", &[(-150i16) as u16]).unwrap(), -1.5);
        assert_eq!(m.encode("flow", 172.8).unwrap(), vec![1728]);
        assert_eq!(m.at(Kind::Holding, 0).unwrap().name, "supply_setpoint");
        assert_eq!(m.at(Kind::Input, 0).unwrap().name, "supply_temp");
        // The dry cooler's outdoor sensor, below 0 °C too; 0x8000 is a lost
        // sensor's "no value".
        assert_eq!(m.at(Kind::Input, 20).unwrap().name, "outdoor_temp");
        assert_eq!(
            m.encode("outdoor_temp", -12.34).unwrap(),
            vec![(-1234i16) as u16]
        );
        assert_eq!(m.encode("outdoor_temp", -327.68).unwrap(), vec![0x8000]);
    }

    /// Found by the `modbus_client` fuzz target: a register at the last
    /// address overflowed the parser's count of its addresses.
    #[test]
    fn a_register_may_end_at_the_last_address_and_not_past_it() {
        let map = |address: u32, ty: &str| {
            let text = format!(
                "model = \"edge\"\nword_order = \"high_first\"\nunit_id = 1\n\
                 [[register]]\nname = \"a\"\nkind = \"input\"\naddress = {address}\n\
                 type = \"{ty}\"\nscale = 1.0\nunit = \"\"\n"
            );
            RegisterMap::from_toml(&text, "edge.toml")
        };
        assert_eq!(
            map(65_535, "u16")
                .unwrap()
                .at(Kind::Input, 65_535)
                .unwrap()
                .name,
            "a"
        );
        assert_eq!(
            map(65_534, "u32").unwrap().get("a").unwrap().address,
            65_534
        );
        let e = map(65_535, "i32").unwrap_err();
        assert!(e.to_string().contains("a: runs past address 65535"), "{e}");
    }

    #[test]
    fn thirty_two_bit_values_follow_the_word_order() {
        let m = RegisterMap::sim_cdu();
        // 117,550 W = 0x0001_CB2E: high word 0x0001 first.
        assert_eq!(
            m.encode("facility_power", 117_550.0).unwrap(),
            vec![0x0001, 0xCB2E]
        );
        assert_eq!(
            m.decode("facility_power", &[0x0001, 0xCB2E]).unwrap(),
            117_550.0
        );
        let low = RegisterMap::from_toml(
            &include_str!("../cdus/sim-cdu.toml").replace("high_first", "low_first"),
            "low.toml",
        )
        .unwrap();
        assert_eq!(
            low.encode("facility_power", 117_550.0).unwrap(),
            vec![0xCB2E, 0x0001]
        );
        assert_eq!(
            low.decode("facility_power", &[0xCB2E, 0x0001]).unwrap(),
            117_550.0
        );
    }

    #[test]
    fn writes_outside_a_setting_range_are_refused() {
        let m = RegisterMap::sim_cdu();
        assert_eq!(m.encode("supply_setpoint", 32.0).unwrap(), vec![3200]);
        let e = m.encode("supply_setpoint", 50.0).unwrap_err();
        assert!(matches!(e, ValueError::OutOfRange { .. }));
        assert_eq!(
            e.to_string(),
            "supply_setpoint: 50 °C is outside 17 to 45 °C"
        );
        assert!(m.encode("pump_speed", 20.0).is_err());
        assert!(matches!(
            m.encode("flow", -1.0),
            Err(ValueError::DoesNotFit { .. })
        ));
        assert!(matches!(m.encode("nope", 1.0), Err(ValueError::Unknown(_))));
    }

    #[test]
    fn broken_maps_are_refused_with_the_reason() {
        let base = include_str!("../cdus/sim-cdu.toml");
        let bad = |from: &str, to: &str| {
            RegisterMap::from_toml(&base.replacen(from, to, 1), "m.toml")
                .unwrap_err()
                .to_string()
        };
        // return_temp moved onto supply_temp's address.
        let e = bad("address = 1\ntype = \"i16\"\nscale = 0.01\nunit = \"°C\"\ndescription = \"secondary return", "address = 0\ntype = \"i16\"\nscale = 0.01\nunit = \"°C\"\ndescription = \"secondary return");
        assert!(e.contains("both use"), "{e}");
        // it_power (u32 at 10-11) overlapping cooling_power at 11.
        let e = bad(
            "address = 12\ntype = \"u32\"",
            "address = 11\ntype = \"u32\"",
        );
        assert!(e.contains("both use"), "{e}");
        let e = bad("min = 17.0\n", "");
        assert!(e.contains("needs min <= max"), "{e}");
        let e = bad(
            "scale = 0.1\nunit = \"L/min\"",
            "scale = 0.0\nunit = \"L/min\"",
        );
        assert!(e.contains("scale must be above 0"), "{e}");
        let e = bad("type = \"u16\"", "type = \"u8\"");
        assert!(e.contains("u8"), "{e}");
        let e = bad("word_order = \"high_first\"", "word_order = \"big\"");
        assert!(e.contains("big"), "{e}");
    }
}
