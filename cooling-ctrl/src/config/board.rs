//! The controller board's pins: the pin map (`board_pins`) on a GPIO chip
//! (`gpio_chip`), together or neither. The pin map is read and checked
//! here against the hall's racks and `unprotected_racks`; the chip is
//! opened at start (`crate::gpio`).
//!
//! Glossary:
//! - *leak rope*: a rack's leak-detection cable: its `leak` input and
//!   its `rope_fault` input in the pin map.

use std::format;
use std::path::PathBuf;
use std::string::ToString;

use loopwarden_boards::pins::PinMap;
use loopwarden_field::config::{ConfigError, Sources};
use loopwarden_field::pick;

use super::file::board_error;
use super::{FileConfig, Overrides};
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

/// The board's pins: `board_pins` and `gpio_chip` together or neither;
/// the pin map read, checked, and with no more leak ropes than racks.
pub(super) fn board_pins(
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
