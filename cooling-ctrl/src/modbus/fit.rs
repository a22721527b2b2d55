//! Whether a register map fits the controller, checked before it starts
//! on it ([`check_map`]): every register one it reads or writes, of its
//! kind and unit, the safety settings there, and each setting's range
//! holding what is written; and what a map says of the settings
//! ([`map_limits`]).
use super::*;
/// What register map `map` says of the settings the controller writes:
/// which it has as holding registers, the ranges of the setpoint and the
/// pump speed, and whether the CDU reports its valve positions.
pub fn map_limits(map: &RegisterMap) -> MapLimits {
    let holding = |name: &str| map.get(name).filter(|r| r.kind == Kind::Holding);
    let range = |s: Setting| holding(s.register()).and_then(|r| r.min.zip(r.max));
    MapLimits {
        mapped: Setting::ORDER.map(|s| holding(s.register()).is_some()),
        setpoint_c: range(Setting::Setpoint),
        speed_pct: range(Setting::PumpSpeed),
        positions: map.get(VALVES_CLOSED).is_some(),
    }
}

/// Why the controller will not start on a register map ([`check_map`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UnfitMap {
    /// A register the controller neither reads nor writes: a misspelt
    /// name would leave the register it meant unread or unwritten.
    #[error(
        "register {name:?} is not one the controller reads or writes{}",
        near.map(|n| format!(" (did you mean {n:?}?)")).unwrap_or_default()
    )]
    Unknown {
        /// The name in the map.
        name: String,
        /// A known name within two letters of it.
        near: Option<&'static str>,
    },
    /// A known register of the other kind.
    #[error("{name}: the controller needs it as a {wanted} register, the map has it as {found}")]
    WrongKind {
        /// The register.
        name: String,
        /// The kind the controller reads or writes it as.
        wanted: &'static str,
        /// The kind in the map.
        found: &'static str,
    },
    /// A safety setting the map lacks.
    #[error("{name}: the map lacks it; the controller needs it as a holding register: {what}")]
    Missing {
        /// The register.
        name: &'static str,
        /// What the controller does with it.
        what: &'static str,
    },
    /// A setting whose range leaves out values the controller writes.
    #[error("{name}: its range {min} to {max} must hold {lo} to {hi} ({what})")]
    Narrow {
        /// The register.
        name: &'static str,
        /// Its range in the map.
        min: f64,
        /// Its range in the map.
        max: f64,
        /// The values the controller writes, lowest.
        lo: f64,
        /// The values the controller writes, highest.
        hi: f64,
        /// What they are.
        what: String,
    },
    /// A register in another unit than the controller's: it converts
    /// nothing, so kW would be read as W, degF as °C.
    #[error(
        "{name}: the map gives its unit as {}, the controller takes it in {} and converts nothing",
        unit_text(found),
        unit_text(wanted)
    )]
    WrongUnit {
        /// The register.
        name: String,
        /// The unit in the map.
        found: String,
        /// The unit the controller takes it in ([`UNITS`]).
        wanted: &'static str,
    },
    /// A heartbeat range of fewer than two whole values: it cannot change.
    #[error("heartbeat: its range {min} to {max} holds fewer than two whole values: the heartbeat could not change every step")]
    StillHeartbeat {
        /// Its range in the map.
        min: f64,
        /// Its range in the map.
        max: f64,
    },
}

/// A unit as the map spells it, in quotes, or that there is none.
pub(super) fn unit_text(unit: &str) -> String {
    if unit.is_empty() {
        "none (\"\": bits or a count)".to_string()
    } else {
        format!("{unit:?}")
    }
}

/// The unit of each register the controller reads or writes, spelt as in
/// the maps (`boards/cdus/*.toml`); `""` for bit words, flags and the
/// heartbeat counter, which have none.
pub const UNITS: [(&str, &str); 21] = [
    (SUPPLY, "°C"),
    (RETURN, "°C"),
    (FLOW, "L/min"),
    (FACILITY_SUPPLY, "°C"),
    (PUMP_A, ""),
    (PUMP_B, ""),
    (LEAKS, ""),
    (IT_POWER, "W"),
    (COOLING_POWER, "W"),
    (FACILITY_POWER, "W"),
    (DIFF_PRESSURE, "kPa"),
    (VALVES_CLOSED, ""),
    (PUMP_A_FAULT, ""),
    (PUMP_B_FAULT, ""),
    (OUTDOOR, "°C"),
    (VALVES_OPEN, ""),
    (PUMPS_RUN, ""),
    (LEAD_PUMP, ""),
    (PUMP_SPEED, "%"),
    (SETPOINT, "°C"),
    (HEARTBEAT, ""),
];

/// The settings a map must have, as holding registers, and what the
/// controller does with each.
const NEEDED: [(&str, &str); 3] = [
    (VALVES_OPEN, "it closes a leaking rack's valve"),
    (
        PUMPS_RUN,
        "it stops the pumps when a leak cannot be isolated",
    ),
    (
        HEARTBEAT,
        "it tells the CDU the controller is alive, or the CDU falls back",
    ),
];

/// Checks, before the controller starts on it, that `map` fits a CDU of
/// `racks` racks: every register one the controller reads (input) or
/// writes (holding), of that kind and in its unit ([`UNITS`]);
/// `valves_open`, `pumps_run` and `heartbeat` there; each setting's range
/// holding every value the controller writes (every valve of the racks
/// open to all closed, both pumps, either lead pump) and the heartbeat's
/// at least two values.
/// That bit words are `u16` at scale 1 the map's own check says
/// ([`RegisterMap::from_toml`]).
pub fn check_map(map: &RegisterMap, racks: u8) -> Result<(), UnfitMap> {
    for r in map.registers() {
        check_name(r)?;
    }
    for (name, what) in NEEDED {
        if map.get(name).is_none() {
            return Err(UnfitMap::Missing { name, what });
        }
    }
    let all = f64::from((1u32 << racks.min(31)) - 1);
    let wanted = [
        (
            VALVES_OPEN,
            all,
            format!("every valve of {racks} racks, bit n = rack n"),
        ),
        (
            PUMPS_RUN,
            3.0,
            "0 both pumps stopped, 3 both running".into(),
        ),
        (LEAD_PUMP, 1.0, "0 pump A, 1 pump B".into()),
    ];
    for (name, hi, what) in wanted {
        let Some((min, max)) = map.get(name).and_then(|r| r.min.zip(r.max)) else {
            continue;
        };
        if min > 0.0 || max < hi {
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
    if let Some((min, max)) = map.get(HEARTBEAT).and_then(|r| r.min.zip(r.max)) {
        if max.floor() - min.ceil() < 1.0 {
            return Err(UnfitMap::StillHeartbeat { min, max });
        }
    }
    // The core's full speed is the register's 100 %: a map that stops
    // short would have a failsafe's full speed written lower, and the
    // loop's flow judged against a speed the pumps do not run.
    if let Some((min, max)) = map.get(PUMP_SPEED).and_then(|r| r.min.zip(r.max)) {
        if max < 100.0 {
            return Err(UnfitMap::Narrow {
                name: PUMP_SPEED,
                min,
                max,
                lo: min,
                hi: 100.0,
                what: "full speed, which a failsafe asks for and the loop's flow is judged against"
                    .into(),
            });
        }
    }
    Ok(())
}

/// `r` is a register the controller reads or writes, of its kind.
fn check_name(r: &Register) -> Result<(), UnfitMap> {
    let kind = |k: Kind| if k == Kind::Input { "input" } else { "holding" };
    let wanted = if READING_REGISTERS.contains(&r.name.as_str()) {
        Kind::Input
    } else if SETTING_REGISTERS.contains(&r.name.as_str()) {
        Kind::Holding
    } else {
        let known = READING_REGISTERS.iter().chain(&SETTING_REGISTERS);
        let near = known.copied().find(|k| edits(k, &r.name) <= 2);
        return Err(UnfitMap::Unknown {
            name: r.name.clone(),
            near,
        });
    };
    if r.kind != wanted {
        return Err(UnfitMap::WrongKind {
            name: r.name.clone(),
            wanted: kind(wanted),
            found: kind(r.kind),
        });
    }
    // Every known name has its unit: a test holds UNITS to the names.
    let unit = UNITS.iter().find(|(n, _)| *n == r.name).map(|(_, u)| *u);
    match unit {
        Some(wanted) if r.unit == wanted => Ok(()),
        wanted => Err(UnfitMap::WrongUnit {
            name: r.name.clone(),
            found: r.unit.clone(),
            wanted: wanted.unwrap_or("?"),
        }),
    }
}

/// Letters to insert, delete or change to make `a` into `b`
/// (Levenshtein distance).
pub(super) fn edits(a: &str, b: &str) -> usize {
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
