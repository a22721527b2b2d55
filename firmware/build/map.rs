//! The CDU's register map (`boards/cdus/*.toml`) as a const table: every
//! register, the runs of contiguous input registers a read takes, and a
//! const per register the firmware reads or writes. The file is read and
//! checked by `loopwarden_modbus_map` (its `MapFile`, the shape and checks
//! `loopwarden_boards::modbus_map::RegisterMap` uses on Linux) and held to
//! what the controllers read and write (`fit::check_fit`, the Linux
//! controller's check at start: names, kinds, units, the settings'
//! ranges but the valve word's, which the firmware judges at start
//! against the racks of its figures). A map without one of [`NEEDED`] is
//! refused with its name; one of [`OPTIONAL`] it may lack (it then reads
//! `None`, as on the Linux controller). The figures built in are then
//! held to the map as the firmware holds them at start
//! ([`Map::check_figures`]: the valve word against their racks, the
//! setpoint's range against theirs), so that a map the firmware would
//! refuse to run on stops the build.
//!
//! Glossary:
//! - *span*: a run of contiguous input registers read in one request.

use std::fmt::Write as _;
use std::path::Path;

use cooling_core::CoreConfig;
use cooling_decide::writes::tighten;
use cooling_decide::{MapLimits, Setting};
use loopwarden_modbus_map::fit::{check_fit, check_serial_unit_id};
use loopwarden_modbus_map::{input_spans, Kind, MapFile, Register};

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

/// A checked map file and where it came from.
pub struct Map {
    file: MapFile,
    origin: String,
}

impl Map {
    /// Reads and checks the map at `path`.
    pub fn load(path: &Path) -> Result<Self, String> {
        let m = Map {
            file: super::read_toml(path)?,
            origin: path.display().to_string(),
        };
        m.file.check().map_err(|e| format!("{}: {e}", m.origin))?;
        // The valve word's range is judged against the racks at start,
        // when the hall's figures give them (`cdu::valves_fit`).
        check_fit(&m.file.register, None).map_err(|e| format!("{}: {e}", m.origin))?;
        // The firmware reaches the CDU on a serial line only.
        check_serial_unit_id(m.file.unit_id).map_err(|e| format!("{}: {e}", m.origin))?;
        m.check_needed()
            .map_err(|why| format!("{}: {why}", m.origin))?;
        Ok(m)
    }

    /// The valve word holds every valve of the `racks` racks of the
    /// figures built in (from `figures`), open to all closed, as the
    /// firmware checks at start (`cdu::valves_fit`): a map that cannot
    /// is refused here, not by an image that would never run.
    pub fn check_racks(&self, racks: u8, figures: &str) -> Result<(), String> {
        check_fit(&self.file.register, Some(racks)).map_err(|e| {
            format!(
                "{}: {e} (the {racks} racks of the figures {figures})",
                self.origin
            )
        })
    }

    /// The figures built in (`cfg`, from `figures`) held to the map as
    /// the firmware holds them at start, where it refuses to run on what
    /// fails: the valve word holds their racks ([`Map::check_racks`]);
    /// the map's supply_setpoint (and pump_speed) range leaves the site's
    /// setpoints a range, the configuration so held one the core takes
    /// (`cooling_decide::writes::tighten`, as `run` checks its map at
    /// start).
    pub fn check_figures(&self, cfg: &CoreConfig, figures: &str) -> Result<(), String> {
        self.check_racks(cfg.layout.racks, figures)?;
        let mut held = *cfg;
        tighten(&mut held, &self.limits())
            .and_then(|_| held.validate())
            .map_err(|e| {
                format!(
                    "{}: {e} (the figures {figures}): the firmware would refuse to run on them",
                    self.origin
                )
            })
    }

    /// What the map says of the settings, as the firmware reads it at
    /// start (`cdu::map_limits`): which it has, the setpoint's and the
    /// speed's ranges, and whether it reads the valve positions.
    fn limits(&self) -> MapLimits {
        let holding = |name: &str| self.get(name).filter(|r| r.kind == Kind::Holding);
        let range = |s: Setting| holding(s.register()).and_then(|r| r.min.zip(r.max));
        MapLimits {
            mapped: Setting::ORDER.map(|s| holding(s.register()).is_some()),
            setpoint_c: range(Setting::Setpoint),
            speed_pct: range(Setting::PumpSpeed),
            positions: self.get("valves_closed").is_some(),
        }
    }

    /// Every register of [`NEEDED`] is there, of its kind, and every
    /// setting one word: a two-word write's echo carries the register and
    /// the count, never the value, so a CDU that clamped it would answer
    /// as if it took it, and the firmware reads nothing back.
    fn check_needed(&self) -> Result<(), String> {
        for (name, kind) in NEEDED {
            match self.get(name) {
                Some(r) if r.kind == Kind::Holding && r.kind == kind && r.ty.words() > 1 => {
                    return Err(format!(
                        "{name}: a {:?} setting takes two words, whose write's echo does not carry the value; the firmware writes one-word settings only (a CDU that clamped it would answer as if it took it)",
                        r.ty
                    ))
                }
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

    fn get(&self, name: &str) -> Option<&Register<String>> {
        self.file.register.iter().find(|r| r.name == name)
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.file.register.iter().position(|r| r.name == name)
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
            self.file.model
        );
        let _ = writeln!(
            s,
            "/// The CDU's Modbus unit id.\npub const UNIT_ID: u8 = {};",
            self.file.unit_id
        );
        let _ = writeln!(
            s,
            "/// Word order of 32-bit values.\npub const WORD_ORDER: WordOrder = WordOrder::{:?};",
            self.file.word_order
        );
        let _ = writeln!(
            s,
            "/// Every register of the map; their descriptions stay in the file,\n/// out of the image.\npub const REGISTERS: [Register; {}] = [",
            self.file.register.len()
        );
        for r in &self.file.register {
            let opt = |v: Option<f64>| v.map_or("None".to_string(), |v| format!("Some({v:?})"));
            let _ = writeln!(
                s,
                "    Register {{ name: {:?}, kind: Kind::{:?}, address: {}, ty: Type::{:?}, scale: {:?}, unit: {:?}, min: {}, max: {}, description: \"\" }},",
                r.name, r.kind, r.address, r.ty, r.scale, r.unit, opt(r.min), opt(r.max)
            );
        }
        s.push_str("];\n");
        let spans = input_spans(&self.file.register);
        let _ = writeln!(s, "/// The input registers in runs a read takes one request each for.\npub const SPANS: [Span; {}] = [", spans.len());
        for span in &spans {
            let (start, count) = (span.start, span.count);
            let list: Vec<String> = span.registers.iter().map(|i| i.to_string()).collect();
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
                Some(i) if self.file.register[i].kind == kind => format!("Some(&REGISTERS[{i}])"),
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
