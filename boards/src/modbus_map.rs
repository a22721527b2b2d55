//! Modbus register maps of CDU models, as data (`boards/cdus/*.toml`).
//!
//! A map names every register a controller reads or writes: its kind
//! (input: a read-only measurement; holding: a setting), address, type,
//! scale and unit, and for settings the range the CDU accepts. The twin's
//! simulated CDU serves a map; the controller's Modbus client reads the
//! same file, so scaling and 32-bit word order live in one place. What a
//! register is, how its words become a value and back, and the file's
//! checks are `loopwarden_modbus_map`'s, which the firmware's build and
//! run time use too; this module reads a file into a map by name.
//!
//! Glossary:
//! - *raw*: the register's integer; *value*: raw × scale, in the unit.
//! - *word order*: which of the two registers of a 32-bit value holds the
//!   high 16 bits (`high_first`, the usual Modbus convention, or
//!   `low_first`).
//! - *exception 3*: Modbus "illegal data value", the answer to a write
//!   outside a setting's range.

use std::collections::BTreeMap;

use loopwarden_modbus_map::{EncodeError, MapFile};

use crate::BoardError;

/// Whether a map fits the controllers (names, kinds, units, the
/// settings' ranges): the check the firmware's build makes too.
pub use loopwarden_modbus_map::fit;
pub use loopwarden_modbus_map::{input_spans, Kind, Span, Type, WordOrder, MAX_READ};

/// One register (or register pair), as read from its map's file. What a
/// register is and how its words become a value are
/// `loopwarden_modbus_map`'s, shared with the firmware.
pub type Register = loopwarden_modbus_map::Register<String>;

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
        let file: MapFile = crate::parse_checked(text, origin, |f: &MapFile| {
            f.check().map_err(|e| e.to_string())
        })?;
        // Checked: every name is unique.
        let by_name = file
            .register
            .into_iter()
            .map(|r| (r.name.clone(), r))
            .collect();
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

    /// Narrows register `name`'s range to within `min..=max` where that
    /// is tighter than its own (a write outside it is then refused, a
    /// read clamped to it). The range it then has; `None` when the map has
    /// no such register or the two ranges do not meet (it is left as it
    /// was).
    pub fn narrow(&mut self, name: &str, min: f64, max: f64) -> Option<(f64, f64)> {
        let r = self.by_name.get_mut(name)?;
        let lo = r.min.map_or(min, |m| m.max(min));
        let hi = r.max.map_or(max, |m| m.min(max));
        if lo > hi {
            return None;
        }
        (r.min, r.max) = (Some(lo), Some(hi));
        Some((lo, hi))
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
        match r.encode(self.word_order, value) {
            Ok(words) => Ok(words.to_vec()),
            Err(EncodeError::OutOfRange { min, max }) => Err(ValueError::OutOfRange {
                name: r.name.clone(),
                value,
                unit: r.unit.clone(),
                min,
                max,
            }),
            Err(EncodeError::DoesNotFit) => Err(ValueError::DoesNotFit {
                name: r.name.clone(),
                value,
                ty: r.ty,
                scale: r.scale,
            }),
        }
    }

    /// The value of register `name` from its words (as many as its type
    /// takes, in the map's word order).
    pub fn decode(&self, name: &str, words: &[u16]) -> Result<f64, ValueError> {
        let r = self
            .get(name)
            .ok_or_else(|| ValueError::Unknown(name.to_string()))?;
        Ok(r.decode(self.word_order, words))
    }

    /// The measurement register `name`'s words carry, or `None` where the
    /// device says it has none (its type's sentinel, bit words excepted:
    /// [`Register::reading`]).
    pub fn reading(&self, name: &str, words: &[u16]) -> Result<Option<f64>, ValueError> {
        let r = self
            .get(name)
            .ok_or_else(|| ValueError::Unknown(name.to_string()))?;
        Ok(r.reading(self.word_order, words))
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

    mod agreed {
        use super::super::{Type, WordOrder};
        use loopwarden_modbus_map::{Kind, Register};
        include!("../../modbus-map/src/cases.rs");
    }

    /// A map of one register laid out as `l`, named "r".
    fn map_of(l: &agreed::Layout) -> RegisterMap {
        let order = match l.order {
            WordOrder::HighFirst => "high_first",
            WordOrder::LowFirst => "low_first",
        };
        let ty = format!("{:?}", l.ty).to_lowercase();
        let (kind, range) = match l.range {
            Some((min, max)) => ("holding", format!("min = {min:?}\nmax = {max:?}\n")),
            None => ("input", String::new()),
        };
        let text = format!(
            "model = \"case\"\nword_order = \"{order}\"\nunit_id = 1\n[[register]]\n\
             name = \"r\"\nkind = \"{kind}\"\naddress = 0\ntype = \"{ty}\"\n\
             scale = {:?}\n{range}",
            l.scale
        );
        RegisterMap::from_toml(&text, "case").expect("a valid map")
    }

    /// The words and values the firmware's tests hold its table to too
    /// (`modbus-map/src/cases.rs`), through a map read from its text.
    #[test]
    fn the_agreed_cases_read_and_write_alike_through_a_map_read_from_its_file() {
        for (l, words, want) in agreed::DECODE {
            let got = map_of(l).decode("r", words).unwrap();
            assert_eq!(got.to_bits(), want.to_bits(), "{l:?} {words:04X?}: {got}");
        }
        for (l, value, want) in agreed::ENCODE {
            let got = match map_of(l).encode("r", *value) {
                Ok(w) => agreed::Want::Words(Vec::leak(w)),
                Err(ValueError::OutOfRange { min, max, .. }) => {
                    assert_eq!(Some((min, max)), l.range, "{l:?} {value}");
                    agreed::Want::OutOfRange
                }
                Err(ValueError::DoesNotFit { ty, scale, .. }) => {
                    assert_eq!((ty, scale), (l.ty, l.scale), "{l:?} {value}");
                    agreed::Want::DoesNotFit
                }
                Err(e) => panic!("{l:?} {value}: {e}"),
            };
            assert_eq!(got, *want, "{l:?} {value}");
        }
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
        // A misspelt field is not taken for a description.
        let e = bad("unit = \"L/min\"", "units = \"L/min\"");
        assert!(e.contains("unknown field `units`"), "{e}");
    }
}
