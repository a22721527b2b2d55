//! Whether a register map fits the controllers, checked before one runs
//! on it ([`check_fit`]): the Linux controller at start
//! (`cooling_ctrl::modbus::check_map`) and the firmware's build script
//! (which builds no image on a map that does not fit). Every register is
//! one the controllers read (input) or write (holding), of that kind and
//! in the unit they take it in ([`READINGS`], [`SETTINGS`]: they convert
//! nothing); the safety settings, the setpoint and the pump speed are
//! there ([`NEEDED`]), and the supply, return and flow sensors and the
//! pumps' running flags ([`NEEDED_READINGS`]);
//! each setting's range holds what they write. The valve word's range
//! depends on the racks: checked when they are known ([`every_valve`],
//! [`range_holds`]), also on the microcontroller, whose racks come with
//! the hall's figures.
//!
//! Glossary:
//! - *reading*: an input register the controllers read; *setting*: a
//!   holding register they write.
//! - *near*: the known name fewest letters (insertions, deletions,
//!   changes), and at most two, from a name in the map: the name it
//!   probably meant.

use core::fmt;
use std::format;
use std::string::{String, ToString};
use std::vec::Vec;

use crate::{every_valve, range_holds, Kind, Register};

/// The input registers the controllers read, each with the unit they
/// take it in, spelt as in the maps (`boards/cdus/*.toml`); `""` for bit
/// words and flags, which have none.
pub const READINGS: [(&str, &str); 15] = [
    ("supply_temp", "°C"),
    ("return_temp", "°C"),
    ("flow", "L/min"),
    ("facility_supply_temp", "°C"),
    ("pump_a_running", ""),
    ("pump_b_running", ""),
    ("leak_inputs", ""),
    ("it_power", "W"),
    ("cooling_power", "W"),
    ("facility_power", "W"),
    ("diff_pressure", "kPa"),
    ("valves_closed", ""),
    ("pump_a_fault", ""),
    ("pump_b_fault", ""),
    ("outdoor_temp", "°C"),
];

/// The holding registers the controllers write, in the order they write
/// them, each with its unit (`""`: bit words and the heartbeat counter).
pub const SETTINGS: [(&str, &str); 6] = [
    ("valves_open", ""),
    ("pumps_run", ""),
    ("lead_pump", ""),
    ("pump_speed", "%"),
    ("supply_setpoint", "°C"),
    ("heartbeat", ""),
];

/// The settings a map must have, and what the controllers do with each:
/// the safety settings, and the setpoint and the pump speed, whose
/// values the controllers take the CDU to run at once written (a map
/// without them would have the supply, the flow and the pumps judged
/// against settings the CDU never got).
pub const NEEDED: [(&str, &str); 5] = [
    ("valves_open", "it closes a leaking rack's valve"),
    (
        "pumps_run",
        "it stops the pumps when a leak cannot be isolated",
    ),
    (
        "heartbeat",
        "it tells the CDU the controller is alive, or the CDU falls back",
    ),
    (
        "supply_setpoint",
        "it sets the supply temperature the CDU holds, and judges heat rejection against it: \
         without it the supply would be judged against a setpoint the CDU never got, \
         and heat rejection taken for short for good",
    ),
    (
        "pump_speed",
        "it sets the pumps' speed, which the loop's flow and the pumps' health are judged against: \
         without it they would be judged against a speed the CDU never got, \
         and a healthy flow sensor or pump taken out of service",
    ),
];

/// The readings a map must have, and what the controllers do with each:
/// the sensors the control loops cannot run without (the core's required
/// sensors, `cooling_core::sensors::Which::required`) and the pumps'
/// running feedback. Without a sensor's register the sensor never reads:
/// it is taken for lost, and the CDU runs degraded on what the others
/// imply, or in failsafe, for as long as it runs on the map. Without a
/// pump's running flag a pump the controllers run reads as stopped,
/// which they take for a trip: both healthy pumps would be taken out of
/// service in turn.
pub const NEEDED_READINGS: [(&str, &str); 5] = [
    (
        "supply_temp",
        "the secondary supply temperature, which the setpoint is held against: \
         without it the supply sensor is taken for lost for good, and the CDU never runs normal \
         (degraded on an estimate, or failsafe: pumps at full speed, the setpoint lowered)",
    ),
    (
        "return_temp",
        "the secondary return temperature, which with the flow gives the heat the loop carries: \
         without it the return sensor is taken for lost for good, and the CDU never runs normal \
         (degraded on an estimate, or failsafe: pumps at full speed, the setpoint lowered)",
    ),
    (
        "flow",
        "the secondary flow, which the pumps and the heat the loop carries are judged by: \
         without it the flow sensor is taken for lost for good, and the CDU never runs normal \
         (degraded on an estimate, or failsafe: pumps at full speed, the setpoint lowered)",
    ),
    (
        "pump_a_running",
        "pump A's running feedback: without it the pump reads as stopped while it runs, \
         and is taken for tripped and taken out of service",
    ),
    (
        "pump_b_running",
        "pump B's running feedback: without it the pump reads as stopped while it runs, \
         and is taken for tripped and taken out of service",
    ),
];

/// Why a controller will not run on a register map ([`check_fit`]).
#[derive(Debug, Clone, PartialEq)]
pub enum UnfitMap {
    /// A register the controllers neither read nor write: a misspelt
    /// name would leave the register it meant unread or unwritten.
    Unknown {
        /// The name in the map.
        name: String,
        /// The known name nearest it, within two letters.
        near: Option<&'static str>,
    },
    /// A known register of the other kind.
    WrongKind {
        /// The register.
        name: String,
        /// The kind the controllers read or write it as.
        wanted: &'static str,
        /// The kind in the map.
        found: &'static str,
    },
    /// A setting the map lacks that the controllers cannot do without
    /// ([`NEEDED`]).
    Missing {
        /// The register.
        name: &'static str,
        /// What the controllers do with it.
        what: &'static str,
    },
    /// A reading the map lacks that the controllers cannot do without
    /// ([`NEEDED_READINGS`]).
    MissingReading {
        /// The register.
        name: &'static str,
        /// What the controllers read it for.
        what: &'static str,
    },
    /// A setting whose range leaves out values the controllers write.
    Narrow {
        /// The register.
        name: &'static str,
        /// Its range in the map.
        min: f64,
        /// Its range in the map.
        max: f64,
        /// The values the controllers write, lowest.
        lo: f64,
        /// The values the controllers write, highest.
        hi: f64,
        /// What they are.
        what: String,
    },
    /// A register in another unit than the controllers': they convert
    /// nothing, so kW would be read as W, degF as °C.
    WrongUnit {
        /// The register.
        name: String,
        /// The unit in the map.
        found: String,
        /// The unit the controllers take it in.
        wanted: &'static str,
    },
    /// A heartbeat range of fewer than two whole values: it cannot change.
    StillHeartbeat {
        /// Its range in the map.
        min: f64,
        /// Its range in the map.
        max: f64,
    },
    /// A unit id that addresses no one device on a serial line: 0 is the
    /// broadcast (every device on the line carries out a write, none
    /// answers), 248 to 255 are reserved.
    SerialUnitId {
        /// The map's `unit_id`.
        id: u8,
    },
}

impl fmt::Display for UnfitMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown { name, near } => {
                write!(f, "register {name:?} is not one the controller reads or writes")?;
                match near {
                    Some(n) => write!(f, " (did you mean {n:?}?)"),
                    None => Ok(()),
                }
            }
            Self::WrongKind {
                name,
                wanted,
                found,
            } => {
                let a = if wanted.starts_with('i') { "an" } else { "a" };
                write!(
                    f,
                    "{name}: the controller needs it as {a} {wanted} register, the map has it as {found}"
                )
            }
            Self::Missing { name, what } => write!(
                f,
                "{name}: the map lacks it; the controller needs it as a holding register: {what}"
            ),
            Self::MissingReading { name, what } => write!(
                f,
                "{name}: the map lacks it; the controller needs it as an input register, {what}"
            ),
            Self::Narrow {
                name,
                min,
                max,
                lo,
                hi,
                what,
            } => write!(f, "{name}: its range {min} to {max} must hold {lo} to {hi} ({what})"),
            Self::WrongUnit {
                name,
                found,
                wanted,
            } => write!(
                f,
                "{name}: the map gives its unit as {}, the controller takes it in {} and converts nothing",
                unit_text(found),
                unit_text(wanted)
            ),
            Self::SerialUnitId { id } => write!(
                f,
                "unit_id {id}: on a serial line the CDU needs an address of its own, 1 to 247{}",
                if *id == 0 {
                    " (0 is the broadcast: every device on the line would carry out the controller's writes, and none answers)"
                } else {
                    " (248 to 255 are reserved)"
                }
            ),
            Self::StillHeartbeat { min, max } => write!(
                f,
                "heartbeat: its range {min} to {max} holds fewer than two whole values: \
                 the heartbeat could not change every step"
            ),
        }
    }
}

impl std::error::Error for UnfitMap {}

/// Checks that unit id `id` addresses one CDU on a serial line (Modbus
/// RTU): 1 to 247. (Over TCP a device reached directly answers 0 or 255
/// too, so there any id goes.)
pub fn check_serial_unit_id(id: u8) -> Result<(), UnfitMap> {
    match id {
        1..=247 => Ok(()),
        _ => Err(UnfitMap::SerialUnitId { id }),
    }
}

/// A unit as the map spells it, in quotes, or that there is none.
pub fn unit_text(unit: &str) -> String {
    if unit.is_empty() {
        "none (\"\": bits or a count)".to_string()
    } else {
        format!("{unit:?}")
    }
}

/// Checks that `registers` fit the controllers: every register one they
/// read (input) or write (holding), of that kind and in its unit; the
/// [`NEEDED`] settings and the [`NEEDED_READINGS`] there; each setting's
/// range holding every value
/// the controllers write (both pumps, either lead pump, full pump speed,
/// and with `racks` known every valve of them open to all closed) and the
/// heartbeat's at least two values. That bit words are `u16` at scale 1
/// the map's own check says (`MapFile::check`).
pub fn check_fit<'a, S: AsRef<str> + 'a>(
    registers: impl IntoIterator<Item = &'a Register<S>>,
    racks: Option<u8>,
) -> Result<(), UnfitMap> {
    let registers: Vec<&Register<S>> = registers.into_iter().collect();
    for r in &registers {
        check_name(r)?;
    }
    let get = |name: &str| registers.iter().find(|r| r.name.as_ref() == name);
    for (name, what) in NEEDED {
        if get(name).is_none() {
            return Err(UnfitMap::Missing { name, what });
        }
    }
    for (name, what) in NEEDED_READINGS {
        if get(name).is_none() {
            return Err(UnfitMap::MissingReading { name, what });
        }
    }
    let range = |name: &str| get(name).and_then(|r| r.min.zip(r.max));
    let mut wanted: Vec<(&'static str, f64, String)> = Vec::new();
    if let Some(racks) = racks {
        let what = format!("every valve of {racks} racks, bit n = rack n");
        wanted.push(("valves_open", every_valve(racks), what));
    }
    wanted.push((
        "pumps_run",
        3.0,
        "0 both pumps stopped, 3 both running".into(),
    ));
    wanted.push(("lead_pump", 1.0, "0 pump A, 1 pump B".into()));
    for (name, hi, what) in wanted {
        let Some((min, max)) = range(name) else {
            continue;
        };
        if !range_holds(min, max, hi) {
            let lo = 0.0;
            return Err(UnfitMap::Narrow {
                name,
                min,
                max,
                lo,
                hi,
                what,
            });
        }
    }
    if let Some((min, max)) = range("heartbeat") {
        if max.floor() - min.ceil() < 1.0 {
            return Err(UnfitMap::StillHeartbeat { min, max });
        }
    }
    check_full_speed(range("pump_speed"))
}

/// The core's full speed is the register's 100 %: a map that stops short
/// would have a failsafe's full speed written lower, and the loop's flow
/// judged against a speed the pumps do not run.
fn check_full_speed(range: Option<(f64, f64)>) -> Result<(), UnfitMap> {
    match range {
        Some((min, max)) if max < 100.0 => Err(UnfitMap::Narrow {
            name: "pump_speed",
            min,
            max,
            lo: min,
            hi: 100.0,
            what: "full speed, which a failsafe asks for and the loop's flow is judged against"
                .into(),
        }),
        _ => Ok(()),
    }
}

/// `r` is a register the controllers read or write, of its kind and in
/// its unit.
fn check_name<S: AsRef<str>>(r: &Register<S>) -> Result<(), UnfitMap> {
    let kind = |k: Kind| if k == Kind::Input { "input" } else { "holding" };
    let name = r.name.as_ref();
    let find =
        |list: &[(&'static str, &'static str)]| list.iter().find(|(n, _)| *n == name).copied();
    let (wanted, unit) = match (find(&READINGS), find(&SETTINGS)) {
        (Some((_, unit)), _) => (Kind::Input, unit),
        (None, Some((_, unit))) => (Kind::Holding, unit),
        (None, None) => {
            let known = READINGS.iter().chain(&SETTINGS).map(|(n, _)| *n);
            // The nearest; of two as near, the first listed.
            let near = known
                .map(|k| (edits(k, name), k))
                .filter(|(d, _)| *d <= 2)
                .min_by_key(|(d, _)| *d)
                .map(|(_, k)| k);
            return Err(UnfitMap::Unknown {
                name: name.to_string(),
                near,
            });
        }
    };
    if r.kind != wanted {
        return Err(UnfitMap::WrongKind {
            name: name.to_string(),
            wanted: kind(wanted),
            found: kind(r.kind),
        });
    }
    if r.unit.as_ref() != unit {
        return Err(UnfitMap::WrongUnit {
            name: name.to_string(),
            found: r.unit.as_ref().to_string(),
            wanted: unit,
        });
    }
    Ok(())
}

/// Letters to insert, delete or change to make `a` into `b`
/// (Levenshtein distance).
pub fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = (diag + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = here;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests;
