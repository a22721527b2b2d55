//! Whether a register map fits the controller, checked before it starts
//! on it ([`check_map`]: `loopwarden_modbus_map::fit`, the check the
//! firmware's build makes too): every register one it reads or writes,
//! of its kind and unit, the safety settings and the pumps' running
//! flags there, and each setting's
//! range holding what is written; and what a map says of the settings
//! ([`map_limits`]).
use loopwarden_boards::modbus_map::fit::check_fit;
pub use loopwarden_boards::modbus_map::fit::UnfitMap;

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

/// Checks, before the controller starts on it, that `map` fits a CDU of
/// `racks` racks: every register one the controller reads (input) or
/// writes (holding), of that kind and in its unit; `valves_open`,
/// `pumps_run`, `heartbeat`, `supply_setpoint`, `pump_speed` and the
/// pumps' running flags there; each setting's range holding every
/// value the controller writes (every valve of the racks open to all
/// closed, both pumps, either lead pump, full pump speed) and the
/// heartbeat's at least two values: the check the firmware's build makes
/// too ([`check_fit`]). That bit words are `u16` at scale 1 the map's own
/// check says ([`RegisterMap::from_toml`]).
pub fn check_map(map: &RegisterMap, racks: u8) -> Result<(), UnfitMap> {
    check_fit(map.registers(), Some(racks))
}
