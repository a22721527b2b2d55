//! The CDU's register map (`boards/cdus/*.toml`, in the format of
//! `boards/src/modbus_map.rs`, with its checks) as a const table: every
//! register, the runs of contiguous input registers a read takes, and a
//! const per register the firmware reads or writes. A map without one of
//! [`NEEDED`] is refused with its name; one of [`OPTIONAL`] it may lack
//! (it then reads `None`, as on the Linux controller).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;

/// Registers the firmware cannot do without: what the control core's
/// safety and regulation read, and every setting it writes.
pub const NEEDED: [(&str, Kind); 17] = [
    ("supply_temp", Kind::Input),
    ("return_temp", Kind::Input),
    ("flow", Kind::Input),
    ("facility_supply_temp", Kind::Input),
    ("pump_a_running", Kind::Input),
    ("pump_b_running", Kind::Input),
    ("pump_a_fault", Kind::Input),
    ("pump_b_fault", Kind::Input),
    ("leak_inputs", Kind::Input),
    ("valves_closed", Kind::Input),
    ("it_power", Kind::Input),
    ("valves_open", Kind::Holding),
    ("pumps_run", Kind::Holding),
    ("lead_pump", Kind::Holding),
    ("heartbeat", Kind::Holding),
    ("pump_speed", Kind::Holding),
    ("supply_setpoint", Kind::Holding),
];

/// Registers read when the map has them.
pub const OPTIONAL: [(&str, Kind); 4] = [
    ("cooling_power", Kind::Input),
    ("facility_power", Kind::Input),
    ("diff_pressure", Kind::Input),
    ("outdoor_temp", Kind::Input),
];

/// The most registers one read may ask for.
const MAX_READ: u16 = 125;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Input,
    Holding,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Type {
    U16,
    I16,
    U32,
    I32,
}

impl Type {
    fn words(self) -> u16 {
        match self {
            Type::U16 | Type::I16 => 1,
            Type::U32 | Type::I32 => 2,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum WordOrder {
    HighFirst,
    LowFirst,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Register {
    name: String,
    kind: Kind,
    address: u16,
    #[serde(rename = "type")]
    ty: Type,
    scale: f64,
    #[serde(default)]
    unit: String,
    min: Option<f64>,
    max: Option<f64>,
    #[serde(default)]
    #[allow(dead_code)]
    description: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Map {
    model: String,
    word_order: WordOrder,
    unit_id: u8,
    register: Vec<Register>,
    #[serde(skip)]
    origin: String,
}

impl Map {
    /// Reads and checks the map at `path`.
    pub fn load(path: &Path) -> Result<Self, String> {
        let mut m: Map = crate::read_toml(path)?;
        m.origin = path.display().to_string();
        m.check().map_err(|why| format!("{}: {why}", m.origin))?;
        Ok(m)
    }

    /// The checks of `RegisterMap::from_toml`.
    fn check(&self) -> Result<(), String> {
        let mut names = BTreeMap::new();
        let mut taken: BTreeMap<(bool, u32), &str> = BTreeMap::new();
        for r in &self.register {
            if !(r.scale.is_finite() && r.scale > 0.0) {
                return Err(format!("{}: scale must be above 0", r.name));
            }
            match (r.kind, r.min, r.max) {
                (Kind::Holding, Some(lo), Some(hi)) if lo <= hi => {}
                (Kind::Holding, _, _) => {
                    return Err(format!("{}: a holding register needs min <= max", r.name))
                }
                (Kind::Input, None, None) => {}
                (Kind::Input, _, _) => {
                    return Err(format!("{}: min and max are for holding registers", r.name))
                }
            }
            let end = u32::from(r.address) + u32::from(r.ty.words());
            if end > 65_536 {
                return Err(format!("{}: runs past address 65535", r.name));
            }
            for a in u32::from(r.address)..end {
                if let Some(other) = taken.insert((r.kind == Kind::Holding, a), &r.name) {
                    return Err(format!(
                        "{} and {other} both use {:?} register {a}",
                        r.name, r.kind
                    ));
                }
            }
            if names.insert(r.name.as_str(), ()).is_some() {
                return Err(format!("register {:?} appears twice", r.name));
            }
        }
        for (name, kind) in NEEDED {
            match self.get(name) {
                Some(r) if r.kind == kind => {}
                Some(r) => {
                    return Err(format!(
                    "{name}: the firmware needs it as an {kind:?} register, the map has it as {:?}",
                    r.kind
                ))
                }
                None => {
                    return Err(format!(
                        "{name}: the firmware needs this {kind:?} register and the map lacks it"
                    ))
                }
            }
        }
        Ok(())
    }

    fn get(&self, name: &str) -> Option<&Register> {
        self.register.iter().find(|r| r.name == name)
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.register.iter().position(|r| r.name == name)
    }

    /// Runs of contiguous input registers, each at most [`MAX_READ`]
    /// registers: (start, count, indices of its registers).
    fn spans(&self) -> Vec<(u16, u16, Vec<usize>)> {
        let mut inputs: Vec<usize> = (0..self.register.len())
            .filter(|i| self.register[*i].kind == Kind::Input)
            .collect();
        inputs.sort_by_key(|i| self.register[*i].address);
        let mut spans: Vec<(u16, u16, Vec<usize>)> = Vec::new();
        for i in inputs {
            let r = &self.register[i];
            let n = r.ty.words();
            match spans.last_mut() {
                Some((start, count, regs))
                    if u32::from(*start) + u32::from(*count) == u32::from(r.address)
                        && *count + n <= MAX_READ =>
                {
                    *count += n;
                    regs.push(i);
                }
                _ => spans.push((r.address, n, vec![i])),
            }
        }
        spans
    }

    /// The generated Rust table.
    pub fn table(&self) -> Result<String, String> {
        let mut s = format!(
            "// Generated by firmware/build.rs from {}: do not edit.\n",
            self.origin
        );
        let _ = writeln!(
            s,
            "/// The CDU model.\npub const MODEL: &str = {:?};",
            self.model
        );
        let _ = writeln!(
            s,
            "/// The CDU's Modbus unit id.\npub const UNIT_ID: u8 = {};",
            self.unit_id
        );
        let _ = writeln!(
            s,
            "/// Word order of 32-bit values.\npub const WORD_ORDER: WordOrder = WordOrder::{:?};",
            self.word_order
        );
        let _ = writeln!(
            s,
            "/// Every register of the map.\npub const REGISTERS: [Register; {}] = [",
            self.register.len()
        );
        for r in &self.register {
            let opt = |v: Option<f64>| v.map_or("None".to_string(), |v| format!("Some({v:?})"));
            let _ = writeln!(
                s,
                "    Register {{ name: {:?}, kind: Kind::{:?}, address: {}, ty: Type::{:?}, scale: {:?}, unit: {:?}, min: {}, max: {} }},",
                r.name, r.kind, r.address, r.ty, r.scale, r.unit, opt(r.min), opt(r.max)
            );
        }
        s.push_str("];\n");
        let spans = self.spans();
        let _ = writeln!(s, "/// The input registers in runs a read takes one request each for.\npub const SPANS: [Span; {}] = [", spans.len());
        for (start, count, regs) in &spans {
            let list: Vec<String> = regs.iter().map(|i| i.to_string()).collect();
            let _ = writeln!(
                s,
                "    Span {{ start: {start}, count: {count}, registers: &[{}] }},",
                list.join(", ")
            );
        }
        s.push_str("];\n");
        for (name, _) in NEEDED {
            let i = self.index(name).ok_or_else(|| format!("{name}: missing"))?;
            let _ = writeln!(
                s,
                "/// `{name}`.\npub const {}: &Register = &REGISTERS[{i}];",
                name.to_uppercase()
            );
        }
        for (name, kind) in OPTIONAL {
            let v = match self.index(name) {
                Some(i) if self.register[i].kind == kind => format!("Some(&REGISTERS[{i}])"),
                _ => "None".to_string(),
            };
            let _ = writeln!(
                s,
                "/// `{name}`, if the map has it.\npub const {}: Option<&Register> = {v};",
                name.to_uppercase()
            );
        }
        Ok(s)
    }
}
