//! The controller board's pins: the pin map (`board_pins`) on a GPIO chip
//! (`gpio_chip`), together or neither. The pin map is read and checked
//! here against the hall's racks and `unprotected_racks`; the chip is
//! opened at start (`crate::gpio`).
//!
//! Each rope's `rope_fault` line must be `active_low = true` (its
//! controller holds the "OK" level while healthy, and the line's pull
//! reads a fault when nothing drives it), so that an unplugged harness
//! reads as lost leak sensing, never as a dry, supervised rope. A map
//! with an active-high `rope_fault` is refused unless
//! `rope_fault_active_high = true` ([`ROPE_FAULT_ACTIVE_HIGH`], the file
//! only) says the site's wiring is so on purpose: then an opt-out, said
//! at every start.
//!
//! The gateway (`cooling-ctrl gateway`) takes neither: its
//! microcontroller's firmware reads no rope pins, and the gateway opens
//! no GPIO chip.
//!
//! Without board pins the CDU's `leak_inputs` register is the only leak
//! sensing: a register map without it is refused unless every rack is in
//! `unprotected_racks` ([`leak_sensed`]), as leak sensing would otherwise
//! read lost on every rack, for good.
//!
//! Glossary:
//! - *leak rope*: a rack's leak-detection cable: its `leak` input and
//!   its `rope_fault` input in the pin map.

use std::format;
use std::path::{Path, PathBuf};
use std::string::{String, ToString};
use std::vec::Vec;

use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_boards::pins::PinMap;
use loopwarden_field::config::{ConfigError, Sources};
use loopwarden_field::pick;

use super::file::board_error;
use super::{FileConfig, Overrides, Purpose};
use cooling_core::CoreConfig;

/// The controller board's pins: a pin map on a GPIO chip.
#[derive(Debug, Clone)]
pub struct BoardConfig {
    /// The pin map, checked.
    pub pins: PinMap,
    /// Where it was read.
    pub pins_file: PathBuf,
    /// The GPIO character device.
    pub chip: PathBuf,
}

/// The opt-out key that takes a pin map's active-high `rope_fault`
/// lines.
pub const ROPE_FAULT_ACTIVE_HIGH: &str = "rope_fault_active_high";

/// The board's pins: `board_pins` and `gpio_chip` together or neither;
/// the pin map read, checked, and with no more leak ropes than racks;
/// with the opt-out said at start when `rope_fault_active_high` takes an
/// active-high `rope_fault` ([`rope_polarity`]); without them, leak
/// sensing from `map`, the CDU's map the controller reads (`None` for the
/// gateway, whose microcontroller reads the CDU), on every rack not
/// unprotected ([`leak_sensed`]). The gateway takes neither key
/// ([`not_for_the_gateway`]).
pub(super) fn board_pins(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    (core, purpose): (&CoreConfig, Purpose),
    map: Option<&RegisterMap>,
) -> Result<(Option<BoardConfig>, Option<String>), ConfigError> {
    if purpose == Purpose::Gateway {
        not_for_the_gateway(src, file, flags)?;
    }
    let board = board_config(src, file, flags, core)?;
    if board.is_none() {
        leak_sensed(src, core, map)?;
    }
    let opt_out = rope_polarity(src, file, flags, board.as_ref())?;
    Ok((board, opt_out))
}

/// `board_pins` and `gpio_chip` refused for the gateway, naming the key:
/// its microcontroller's firmware reads no rope pins (leaks come from the
/// CDU's `leak_inputs` only) and the gateway opens no GPIO chip, so a pin
/// map given to it would be ropes nobody reads (and its checks, the racks
/// it demands ropes for, the opt-out it takes, about lines nobody reads).
fn not_for_the_gateway(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
) -> Result<(), ConfigError> {
    let given = [
        (
            "board_pins",
            pick!(flags.board_pins, file.board_pins, "board-pins"),
        ),
        (
            "gpio_chip",
            pick!(flags.gpio_chip, file.gpio_chip, "gpio-chip"),
        ),
    ];
    let Some((key, (_, flag))) = given.into_iter().find(|(_, (v, _))| v.is_some()) else {
        return Ok(());
    };
    Err(src.error(
        flag,
        key,
        format!(
            "{key} is for `cooling-ctrl run`: the gateway's microcontroller reads no rope \
             pins (its firmware sees leaks in the CDU's leak_inputs register only) and the \
             gateway opens no GPIO chip, so no rope on these pins would be read; remove \
             board_pins and gpio_chip from the gateway's configuration"
        ),
    ))
}

/// With no board pins, the CDU's `leak_inputs` is the only leak sensing:
/// a `map` without it, with a rack not in `unprotected_racks`, is
/// refused, naming the racks. Run so, the decision path reads leak
/// sensing lost on every rack at every step, for good, and refuses every
/// clear-leak.
fn leak_sensed(
    src: &Sources,
    core: &CoreConfig,
    map: Option<&RegisterMap>,
) -> Result<(), ConfigError> {
    let Some(map) = map.filter(|m| m.get("leak_inputs").is_none()) else {
        return Ok(());
    };
    let sensed: Vec<String> = (0..core.layout.racks.min(16))
        .filter(|r| core.layout.unprotected & (1 << r) == 0)
        .map(|r| r.to_string())
        .collect();
    if sensed.is_empty() {
        return Ok(());
    }
    Err(src.error(
        None,
        "board_pins",
        format!(
            "no leak sensing for racks {}: no board_pins (no leak rope is read) and the \
             register map of {:?} has no leak_inputs, so leak sensing would read lost on \
             every rack at every step, for good, and no leak could be cleared; give \
             board_pins and gpio_chip, a register map with the CDU's leak_inputs, or name \
             every rack run without leak sensing in unprotected_racks",
            sensed.join(", "),
            map.model
        ),
    ))
}

/// Every `rope_fault` line of `board`'s map active low, else refused at
/// `board_pins` unless `rope_fault_active_high = true`, which then is the
/// opt-out said at start; the key with nothing active high to take (or
/// no board) is refused as contradicting the configuration.
fn rope_polarity(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    board: Option<&BoardConfig>,
) -> Result<Option<String>, ConfigError> {
    let opted = file.rope_fault_active_high.unwrap_or(false);
    let high: Vec<usize> = board.map_or(Vec::new(), |b| {
        let ropes = b.pins.ropes.iter();
        ropes
            .filter(|r| !r.fault.active_low)
            .map(|r| r.rack)
            .collect()
    });
    let (key, path) = (ROPE_FAULT_ACTIVE_HIGH, board.map(|b| b.pins_file.as_path()));
    let said = |p: &Path| {
        format!(
            "{}: rope_fault of racks {high:?} has active_low = false",
            p.display()
        )
    };
    match (path, high.is_empty(), opted) {
        (_, true, false) | (None, _, false) => Ok(None),
        (Some(p), false, true) => Ok(Some(format!(
            "{key} = true: {}: an unplugged rope harness or an unpowered rope controller reads as a dry, supervised rope, not as lost leak sensing",
            said(p)
        ))),
        (Some(p), false, false) => {
            let (_, flag) = pick!(flags.board_pins, file.board_pins, "board-pins");
            Err(src.error(
                flag,
                "board_pins",
                format!(
                    "{}: an unplugged rope harness would read as a dry, supervised rope; wire rope_fault to hold its \"OK\" level while healthy with the line pulled to the fault level, and set active_low = true, or set {key} = true if this site's rope controllers drive rope_fault active high on purpose",
                    said(p)
                ),
            ))
        }
        (_, _, true) => Err(src.error(
            None,
            key,
            format!("{key} = true goes only with board_pins whose map has a rope_fault with active_low = false, and this configuration has none: remove it"),
        )),
    }
}

/// `board_pins` and `gpio_chip` together or neither; the pin map read,
/// checked, and with no more leak ropes than racks.
fn board_config(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    core: &CoreConfig,
) -> Result<Option<BoardConfig>, ConfigError> {
    match (
        pick!(flags.board_pins, file.board_pins, "board-pins"),
        pick!(flags.gpio_chip, file.gpio_chip, "gpio-chip"),
    ) {
        ((None, _), (None, _)) => Ok(None),
        ((Some(p), flag), (Some(chip), _)) => {
            let t = std::fs::read_to_string(&p).map_err(|e| {
                src.error(
                    flag,
                    "board_pins",
                    format!("cannot read {}: {e}", p.display()),
                )
            })?;
            let pins = PinMap::from_toml(&t, &p.display().to_string())
                .map_err(|e| board_error(&p, &t, e))?;
            let racks = usize::from(core.layout.racks);
            let bare = (0..racks)
                .find(|r| pins.rope(*r).is_none() && core.layout.unprotected & (1 << r) == 0);
            if let Some(r) = bare {
                return Err(src.error(
                    flag,
                    "board_pins",
                    format!(
                        "{} gives rack {r} no leak rope: wire one, or name the rack in unprotected_racks to run it without leak sensing",
                        p.display()
                    ),
                ));
            }
            if let Some(r) = pins.ropes.iter().find(|r| r.rack >= racks) {
                return Err(src.error(
                    flag,
                    "board_pins",
                    format!(
                        "{} has a leak rope for rack {}; the hall has racks 0 to {}",
                        p.display(),
                        r.rack,
                        racks - 1
                    ),
                ));
            }
            if let Some(r) = pins
                .ropes
                .iter()
                .find(|r| core.layout.unprotected & (1 << r.rack.min(15)) != 0)
            {
                return Err(src.error(
                    flag,
                    "board_pins",
                    format!(
                        "{} gives rack {} a leak rope, but unprotected_racks names it",
                        p.display(),
                        r.rack
                    ),
                ));
            }
            Ok(Some(BoardConfig {
                pins,
                pins_file: p,
                chip,
            }))
        }
        ((Some(_), flag), (None, _)) => Err(src.error(
            flag,
            "board_pins",
            "board_pins needs gpio_chip, the GPIO device of those pins (e.g. \"/dev/gpiochip0\")"
                .into(),
        )),
        ((None, _), (Some(_), flag)) => Err(src.error(
            flag,
            "gpio_chip",
            "gpio_chip needs board_pins, the pin map saying which line is which signal".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{resolve, resolve_for, Config, ConfigError, Overrides, Purpose};

    /// A controller with no board pins and a CDU map without
    /// `leak_inputs`, on a hall of 4 racks, `extra` added.
    fn unsensed(extra: &str, purpose: Purpose) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let figures = dir.path().join("site.toml");
        std::fs::write(&figures, "racks = 4\nhosts_per_rack = 4\n").unwrap();
        let sim = include_str!("../../../boards/cdus/sim-cdu.toml");
        let at = sim.find("[[register]]\nname = \"leak_inputs\"").unwrap();
        let next = at + 1 + sim[at + 1..].find("[[register]]").unwrap();
        let map = dir.path().join("no-leaks.toml");
        std::fs::write(&map, format!("{}{}", &sim[..at], &sim[next..])).unwrap();
        let text = format!(
            "cdu = \"cdu-1\"\ndemo_key = true\ncdu_tcp = \"127.0.0.1:5020\"\n\
             embedded_broker = true\nregister_map = {map:?}\nsite_figures = {figures:?}\n{extra}"
        );
        resolve_for(
            Some(Path::new("cdu.toml")),
            &text,
            &Overrides::default(),
            purpose,
        )
    }

    /// Without board pins the CDU's `leak_inputs` is the only leak
    /// sensing; a map without it would lose leak sensing on every rack
    /// for good (and every clear-leak refused), unless every rack runs
    /// without it on purpose.
    #[test]
    fn no_board_pins_and_a_map_without_leak_inputs_is_refused_unless_every_rack_is_unprotected() {
        let e = unsensed("", Purpose::Run).unwrap_err();
        for key in ["leak_inputs", "board_pins", "unprotected_racks"] {
            assert!(e.message.contains(key), "{key}: {e}");
        }
        assert!(e.message.contains("racks 0, 1, 2, 3:"), "{e}");
        let e = unsensed("unprotected_racks = [0, 2, 3]\n", Purpose::Run).unwrap_err();
        assert!(e.message.contains("racks 1:"), "{e}");
        let all = unsensed("unprotected_racks = [0, 1, 2, 3]\n", Purpose::Run);
        assert_eq!(
            all.expect("every rack unprotected").core.layout.unprotected,
            0xF
        );
        // The gateway's microcontroller reads its own board.
        assert!(unsensed("", Purpose::Gateway).is_ok());
        // The shipped map has leak_inputs.
        let min = "cdu = \"cdu-1\"\ndemo_key = true\ncdu_tcp = \"127.0.0.1:5020\"\nembedded_broker = true\n";
        assert!(resolve(Some(Path::new("cdu.toml")), min, &Overrides::default()).is_ok());
    }

    /// A hall of 16 racks, rack 15 unprotected, with a pin map of ropes
    /// for racks 0 to 14 and for `extra`, if any, each rope's lines
    /// active low.
    fn sixteen_racks(extra: Option<usize>, purpose: Purpose) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let figures = dir.path().join("site.toml");
        std::fs::write(&figures, "racks = 16\nhosts_per_rack = 2\n").unwrap();
        let mut map = String::from("board = \"sixteen racks\"\n");
        for (i, rack) in (0..15).chain(extra).enumerate() {
            for (signal, line) in [("leak", 2 * i), ("rope_fault", 2 * i + 1)] {
                map.push_str(&format!(
                    "[[input]]\nsignal = \"{signal}\"\nrack = {rack}\nline = {line}\nactive_low = true\n"
                ));
            }
        }
        for (signal, line) in [("controller_healthy", 40), ("alarm_beacon", 41)] {
            map.push_str(&format!(
                "[[output]]\nsignal = \"{signal}\"\nline = {line}\nactive_low = false\n"
            ));
        }
        let pins = dir.path().join("pins.toml");
        std::fs::write(&pins, map).unwrap();
        let text = format!(
            "cdu = \"cdu-1\"\ndemo_key = true\ncdu_tcp = \"127.0.0.1:5020\"\n\
             embedded_broker = true\nsite_figures = {figures:?}\nunprotected_racks = [15]\n\
             board_pins = {pins:?}\ngpio_chip = \"/dev/gpiochip0\"\n"
        );
        resolve_for(
            Some(Path::new("cdu.toml")),
            &text,
            &Overrides::default(),
            purpose,
        )
    }

    /// A rope for a rack outside the hall is refused as such, not blamed
    /// on `unprotected_racks` (rack 20 read as the last rack's bit).
    #[test]
    fn a_rope_for_a_rack_outside_the_hall_is_refused_as_outside_it() {
        let c = sixteen_racks(None, Purpose::Run).expect("racks 0 to 14 roped, 15 unprotected");
        assert_eq!(c.core.layout.unprotected, 1 << 15);
        let e = sixteen_racks(Some(20), Purpose::Run).unwrap_err();
        assert!(
            e.message
                .contains("a leak rope for rack 20; the hall has racks 0 to 15"),
            "{e}"
        );
        let e = sixteen_racks(Some(15), Purpose::Run).unwrap_err();
        assert!(
            e.message
                .contains("gives rack 15 a leak rope, but unprotected_racks names it"),
            "{e}"
        );
    }

    /// The gateway's microcontroller reads no rope pins (its firmware
    /// sees leaks in the CDU's `leak_inputs` only) and the gateway opens
    /// no GPIO chip: `board_pins` or `gpio_chip` given to it are refused,
    /// naming the key, not taken as ropes something reads.
    #[test]
    fn the_gateway_refuses_board_pins_for_its_microcontroller_reads_no_rope_pins() {
        assert!(sixteen_racks(None, Purpose::Run).is_ok());
        let e = sixteen_racks(None, Purpose::Gateway).unwrap_err();
        assert_eq!(e.line, Some(7), "at board_pins: {e}");
        for said in ["board_pins", "reads no rope pins", "leak_inputs"] {
            assert!(e.message.contains(said), "{said}: {e}");
        }
        let gateway = |text: &str, flags: &Overrides| {
            resolve_for(Some(Path::new("cdu.toml")), text, flags, Purpose::Gateway)
        };
        let none = Overrides::default();
        let min = "cdu = \"cdu-1\"\ndemo_key = true\nembedded_broker = true\n";
        assert!(gateway(min, &none).expect("no board").board.is_none());
        let e = gateway(&format!("{min}gpio_chip = \"/dev/gpiochip0\"\n"), &none).unwrap_err();
        assert_eq!(e.line, Some(4), "at gpio_chip: {e}");
        assert!(e.message.starts_with("gpio_chip"), "{e}");
        assert!(e.message.contains("reads no rope pins"), "{e}");
        let flag = Overrides {
            board_pins: Some("/etc/loopwarden/pins.toml".into()),
            ..Default::default()
        };
        let e = gateway(min, &flag).unwrap_err();
        assert_eq!(e.origin, "flag --board-pins", "{e}");
        assert!(e.message.contains("reads no rope pins"), "{e}");
    }
}
