//! The northbound register map: the shipped map ([`northbound_map`]),
//! the check that a map names only registers this server fills
//! ([`check_map`]), and the ceiling's range held to the controller's
//! setpoints ([`fit_setpoint_ceiling`]).

use std::fmt;
use std::format;
use std::string::String;

use loopwarden_boards::modbus_map::{Kind, RegisterMap};

/// The shipped northbound map's text.
pub const MAP_TOML: &str = include_str!("../../../boards/northbound/loopwarden-cdu-ctrl.toml");

/// The shipped northbound register map
/// (`boards/northbound/loopwarden-cdu-ctrl.toml`).
pub fn northbound_map() -> RegisterMap {
    RegisterMap::from_toml(MAP_TOML, "boards/northbound/loopwarden-cdu-ctrl.toml")
        .expect("the shipped northbound map is valid")
}

/// Every register the server knows: name, kind, and whether it is a bit
/// word (scale 1, raw bits).
pub(super) const KNOWN: &[(&str, Kind, bool)] = &[
    ("mode", Kind::Input, true),
    ("reason", Kind::Input, true),
    ("seconds_in_mode", Kind::Input, false),
    ("uptime", Kind::Input, false),
    ("setpoint", Kind::Input, false),
    ("supply_temp", Kind::Input, false),
    ("return_temp", Kind::Input, false),
    ("flow", Kind::Input, false),
    ("facility_supply_temp", Kind::Input, false),
    ("sensor_faults", Kind::Input, true),
    ("pumps", Kind::Input, true),
    ("lead_pump", Kind::Input, true),
    ("pump_speed", Kind::Input, false),
    ("valves_open", Kind::Input, true),
    ("cooling_lost", Kind::Input, true),
    ("leaks_latched", Kind::Input, true),
    ("hosts_capped", Kind::Input, false),
    ("lowest_cap", Kind::Input, false),
    ("hottest_gpu", Kind::Input, false),
    ("proposed_setpoint", Kind::Input, false),
    ("proposed_speed", Kind::Input, false),
    ("rejection_short", Kind::Input, true),
    ("beacon", Kind::Input, true),
    ("pue", Kind::Input, false),
    ("it_power", Kind::Input, false),
    ("facility_power", Kind::Input, false),
    ("cooling_power", Kind::Input, false),
    ("writes_enabled", Kind::Input, true),
    ("leak_sensing_lost", Kind::Input, true),
    ("isolation_failed", Kind::Input, true),
    ("setpoint_ceiling", Kind::Holding, false),
    ("plan_ceiling_offset", Kind::Holding, false),
    ("alarm_ack", Kind::Holding, true),
    ("outdoor_temp", Kind::Holding, false),
];

/// Why a map cannot be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapError(pub String);

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "northbound register map: {}", self.0)
    }
}

impl std::error::Error for MapError {}

/// Checks that every register of `map` is one this server fills, of the
/// right kind, and that bit words are at scale 1 (registers the map leaves
/// out are simply not served).
pub fn check_map(map: &RegisterMap) -> Result<(), MapError> {
    for r in map.registers() {
        let Some(&(_, kind, bits)) = KNOWN.iter().find(|(n, _, _)| *n == r.name) else {
            return Err(MapError(format!(
                "{}: not a register this server fills",
                r.name
            )));
        };
        if r.kind != kind {
            return Err(MapError(format!(
                "{}: must be a {kind:?} register, not {:?}",
                r.name, r.kind
            )));
        }
        if bits && r.scale != 1.0 {
            return Err(MapError(format!("{}: a bit word needs scale 1", r.name)));
        }
    }
    Ok(())
}

/// Holds `map`'s `setpoint_ceiling` to the setpoints the controller may
/// ask for, `lo_c` to `hi_c` (the site's, tightened to the CDU's map): a
/// BMS writing a ceiling outside them is refused with exception 3, not
/// answered as taken and then held elsewhere. What the map cannot show
/// (a site whose highest setpoint is above the map's register) is
/// returned, for the log at start; an error when the two do not meet.
pub fn fit_setpoint_ceiling(
    map: &mut RegisterMap,
    lo_c: f32,
    hi_c: f32,
) -> Result<Option<String>, MapError> {
    const NAME: &str = "setpoint_ceiling";
    let Some(was) = map.get(NAME).map(|r| (r.min, r.max)) else {
        return Ok(None);
    };
    let (lo, hi) = (f64::from(lo_c), f64::from(hi_c));
    let Some(_) = map.narrow(NAME, lo, hi) else {
        return Err(MapError(format!(
            "{NAME}: the register's range ({} to {} °C) and the controller's setpoints ({lo_c:.2} to {hi_c:.2} °C) do not meet",
            was.0.map_or("-".into(), |v| format!("{v:.2}")),
            was.1.map_or("-".into(), |v| format!("{v:.2}")),
        )));
    };
    Ok(was.1.filter(|m| *m < hi).map(|m| {
        format!(
            "{NAME}: the controller's highest setpoint is {hi_c:.2} °C, above the {m:.2} °C the register holds: the BMS can set a ceiling of at most {m:.2} °C, and the register reads {m:.2} while none is set"
        )
    }))
}
