//! The controller board's real pins on Linux: the lines of a pin map
//! (`loopwarden_boards::pins::PinMap`) requested from a GPIO character
//! device (`/dev/gpiochipN`), as [`BoardPins`] over `linux-embedded-hal`'s
//! [`CdevPin`], so `cooling-ctrl run` drives the same `BoardIo` as the twin
//! does over the simulated lines.
//!
//! Every line is requested at start, under the consumer label
//! `cooling-ctrl` (what `gpioinfo` shows), and held until the controller
//! exits. The ropes' leak and fault lines are inputs; the
//! controller-healthy relay and the alarm beacon are outputs whose first
//! level is set in the request itself: the relay line low (it is pulsed
//! once per control step from then on) and the beacon dark. The lines are
//! requested without the kernel's active-low flag: the pin map's polarity
//! is applied by [`BoardPins`], once.
//!
//! Glossary:
//! - *GPIO chip*: one GPIO controller as the kernel exposes it, a
//!   character device whose lines are numbered from 0 (the pin map's
//!   `line`).
//! - *request*: taking a line for this process, as input or output; the
//!   kernel refuses a line another consumer holds.

use std::collections::BTreeMap;
use std::fmt;
use std::format;
use std::path::{Path, PathBuf};
use std::string::{String, ToString};
use std::vec::Vec;

use linux_embedded_hal::gpio_cdev::{Chip, LineRequestFlags};
use linux_embedded_hal::CdevPin;
use loopwarden_boards::pins::{BoardPins, Line, PinMap};

/// The consumer label of the requested lines.
pub const CONSUMER: &str = "cooling-ctrl";

/// The board's pins on a GPIO chip.
pub type GpioBoard = BoardPins<CdevPin, CdevPin>;

/// A chip or a line that cannot be had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpioError {
    /// The chip's device path.
    pub chip: PathBuf,
    /// The line and its signal (`leak rope of rack 2`, `controller-healthy relay`),
    /// when a line failed.
    pub line: Option<(u8, String)>,
    /// Why.
    pub reason: String,
}

impl fmt::Display for GpioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GPIO chip {}", self.chip.display())?;
        if let Some((line, signal)) = &self.line {
            write!(f, " line {line} ({signal})")?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for GpioError {}

/// What a line carries, in words.
fn signal_name(l: &Line) -> String {
    match (l.signal.as_str(), l.rack) {
        ("leak", Some(rack)) => format!("leak rope of rack {rack}"),
        ("rope_fault", Some(rack)) => format!("rope fault input of rack {rack}"),
        ("controller_healthy", _) => "controller-healthy relay".into(),
        ("alarm_beacon", _) => "alarm beacon".into(),
        (other, _) => other.to_string(),
    }
}

/// Opens `chip` and requests `map`'s lines: the ropes' leak and fault lines
/// as inputs, the relay and the beacon (dark) as outputs.
pub fn open(chip: &Path, map: &PinMap) -> Result<GpioBoard, GpioError> {
    let chip_error = |reason: String| GpioError {
        chip: chip.to_path_buf(),
        line: None,
        reason,
    };
    let mut dev = Chip::new(chip).map_err(|e| {
        let reason = match std::fs::metadata(chip) {
            Err(io) => format!("cannot open: {io}"),
            Ok(_) if std::fs::File::open(chip).is_err() => {
                format!("cannot open: {e} (run as a user allowed to use the GPIO chip)")
            }
            Ok(_) => format!("not a GPIO character device ({e})"),
        };
        chip_error(reason)
    })?;
    let lines = dev.num_lines();
    // Each line with its direction and, for outputs, its first raw level.
    let mut wanted: Vec<(&Line, Option<bool>)> = map
        .ropes
        .iter()
        .flat_map(|r| [(&r.leak, None), (&r.fault, None)])
        .collect();
    wanted.push((&map.controller_healthy, Some(false)));
    wanted.push((&map.alarm_beacon, Some(false)));
    let mut pins = BTreeMap::new();
    for (l, output) in wanted {
        let line_error = |reason: String| GpioError {
            chip: chip.to_path_buf(),
            line: Some((l.line, signal_name(l))),
            reason,
        };
        if u32::from(l.line) >= lines {
            return Err(line_error(format!(
                "the chip ({} {:?}) has lines 0 to {}",
                dev.name(),
                dev.label(),
                lines.saturating_sub(1)
            )));
        }
        let line = dev
            .get_line(u32::from(l.line))
            .map_err(|e| line_error(e.to_string()))?;
        let handle = match output {
            None => line.request(LineRequestFlags::INPUT, 0, CONSUMER),
            Some(on) => {
                // The level that asserts the signal or clears it, with its
                // polarity.
                let high = on != l.active_low;
                line.request(LineRequestFlags::OUTPUT, u8::from(high), CONSUMER)
            }
        }
        .map_err(|e| {
            let held = line
                .info()
                .ok()
                .filter(|i| i.is_used())
                .map(|i| match i.consumer() {
                    Some(c) if !c.is_empty() => format!(" (held by {c:?})"),
                    _ => " (held by the kernel or another consumer)".to_string(),
                })
                .unwrap_or_default();
            line_error(format!("cannot request: {e}{held}"))
        })?;
        let pin = CdevPin::new(handle).map_err(|e| line_error(e.to_string()))?;
        pins.insert(l.line, pin);
    }
    let mut take = |n: u8| {
        pins.remove(&n)
            .expect("every mapped line was requested once")
    };
    // The pin map refuses a line used twice, so `take` finds each one.
    let mut pins_for_outputs = BTreeMap::new();
    for l in [&map.controller_healthy, &map.alarm_beacon] {
        pins_for_outputs.insert(l.line, take(l.line));
    }
    Ok(BoardPins::new(map, take, |n| {
        pins_for_outputs
            .remove(&n)
            .expect("every mapped line was requested once")
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chip_that_does_not_exist_is_named_with_the_reason() {
        let chip = Path::new("/dev/gpiochip-loopwarden-none");
        let e = open(chip, &PinMap::sim_controller())
            .err()
            .expect("no such chip");
        assert_eq!(e.chip, chip);
        assert_eq!(e.line, None);
        let text = e.to_string();
        assert!(
            text.starts_with("GPIO chip /dev/gpiochip-loopwarden-none: cannot open: "),
            "{text}"
        );
        assert!(text.contains("No such file or directory"), "{text}");
    }

    #[test]
    fn a_file_that_is_not_a_gpio_chip_is_refused_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpiochip0");
        std::fs::write(&path, b"").unwrap();
        let e = open(&path, &PinMap::sim_controller())
            .err()
            .expect("not a chip");
        let text = e.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("not a GPIO character device"), "{text}");
    }

    #[test]
    fn a_failed_line_is_named_with_its_signal() {
        let e = GpioError {
            chip: "/dev/gpiochip0".into(),
            line: Some((8, "controller-healthy relay".into())),
            reason: "cannot request: Device or resource busy (held by \"other\")".into(),
        };
        assert_eq!(
            e.to_string(),
            "GPIO chip /dev/gpiochip0 line 8 (controller-healthy relay): cannot request: \
             Device or resource busy (held by \"other\")"
        );
        let map = PinMap::sim_controller();
        assert_eq!(
            signal_name(&map.rope(2).unwrap().leak),
            "leak rope of rack 2"
        );
        assert_eq!(
            signal_name(&map.rope(2).unwrap().fault),
            "rope fault input of rack 2"
        );
        assert_eq!(signal_name(&map.alarm_beacon), "alarm beacon");
    }
}
