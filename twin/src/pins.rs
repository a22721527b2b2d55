//! Simulated board pins: the levels of a simulated controller board's
//! lines behind `embedded-hal`'s digital traits, so the controller's
//! [`BoardPins`](loopwarden_boards::pins::BoardPins) drive them as they drive a real board's GPIO lines. The
//! hall makes leak ropes wet, cuts them, reads the controller-healthy
//! relay through them, and can make every input read fail (a board whose
//! input lines fail: [`SimLines::set_failing`]).
//!
//! Glossary:
//! - *line*: an electrical digital signal, high or low.
//! - *assert*: drive a signal to its active level, with its polarity.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use embedded_hal::digital::{ErrorKind, ErrorType, InputPin, OutputPin, StatefulOutputPin};
use loopwarden_boards::pins::Line;
#[cfg(test)]
use loopwarden_boards::pins::{BoardPins, PinMap, RopeState};

/// The electrical levels of a simulated board's lines (clone it freely).
#[derive(Clone)]
pub struct SimLines {
    levels: Arc<Mutex<[bool; 256]>>,
    failing: Arc<AtomicBool>,
}

impl Default for SimLines {
    fn default() -> Self {
        Self::new()
    }
}

impl SimLines {
    /// Lines all low.
    pub fn new() -> Self {
        Self {
            levels: Arc::new(Mutex::new([false; 256])),
            failing: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Makes every input read fail (`true`) or work again.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::Relaxed);
    }

    /// Sets a line's level (the twin driving an input).
    pub fn drive(&self, line: u8, high: bool) {
        self.levels.lock().expect("lines")[line as usize] = high;
    }

    /// A line's level.
    pub fn level(&self, line: u8) -> bool {
        self.levels.lock().expect("lines")[line as usize]
    }

    /// An input pin on `line`.
    pub fn input(&self, line: u8) -> SimPin {
        SimPin {
            lines: self.clone(),
            line,
        }
    }

    /// An output pin on `line`.
    pub fn output(&self, line: u8) -> SimPin {
        self.input(line)
    }

    /// Asserts or clears a signal of `map`'s line, with its polarity (the
    /// twin making a leak rope wet, for instance).
    pub fn assert(&self, l: &Line, on: bool) {
        self.drive(l.line, on != l.active_low);
    }

    /// Whether a signal is asserted, with its polarity (the twin reading
    /// the relay).
    pub fn asserted(&self, l: &Line) -> bool {
        self.level(l.line) != l.active_low
    }
}

/// One simulated line as an `embedded-hal` pin.
pub struct SimPin {
    lines: SimLines,
    line: u8,
}

/// A simulated input read that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineFailed(pub u8);

impl embedded_hal::digital::Error for LineFailed {
    fn kind(&self) -> ErrorKind {
        ErrorKind::Other
    }
}

impl ErrorType for SimPin {
    type Error = LineFailed;
}

impl SimPin {
    fn read(&self) -> Result<bool, LineFailed> {
        if self.lines.failing.load(Ordering::Relaxed) {
            Err(LineFailed(self.line))
        } else {
            Ok(self.lines.level(self.line))
        }
    }
}

impl InputPin for SimPin {
    fn is_high(&mut self) -> Result<bool, LineFailed> {
        self.read()
    }
    fn is_low(&mut self) -> Result<bool, LineFailed> {
        self.read().map(|h| !h)
    }
}

impl OutputPin for SimPin {
    fn set_low(&mut self) -> Result<(), LineFailed> {
        self.lines.drive(self.line, false);
        Ok(())
    }
    fn set_high(&mut self) -> Result<(), LineFailed> {
        self.lines.drive(self.line, true);
        Ok(())
    }
}

impl StatefulOutputPin for SimPin {
    fn is_set_high(&mut self) -> Result<bool, LineFailed> {
        Ok(self.lines.level(self.line))
    }
    fn is_set_low(&mut self) -> Result<bool, LineFailed> {
        Ok(!self.lines.level(self.line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board() -> (PinMap, SimLines, BoardPins<SimPin, SimPin>) {
        let map = PinMap::sim_controller();
        let lines = SimLines::new();
        // Dry, whole ropes: the pulled-up leak lines sit high.
        for r in &map.ropes {
            lines.assert(&r.leak, false);
            lines.assert(&r.fault, false);
        }
        let pins = BoardPins::new(&map, |n| lines.input(n), |n| lines.output(n));
        (map, lines, pins)
    }

    #[test]
    fn a_wet_rope_pulls_its_line_low_and_a_cut_one_raises_its_fault() {
        let (map, lines, mut pins) = board();
        assert_eq!(pins.roped(), 0b1111);
        let dry = RopeState {
            wet: false,
            fault: false,
        };
        assert!((0..4).all(|r| pins.rope(r).unwrap() == Ok(dry)));
        let rope = map.rope(2).unwrap();
        lines.assert(&rope.leak, true);
        assert!(
            !lines.level(rope.leak.line),
            "active low: the line went low"
        );
        assert_eq!(pins.rope(2).unwrap().map(|r| r.wet), Ok(true));
        assert_eq!(pins.rope(1).unwrap(), Ok(dry));
        lines.assert(&map.rope(1).unwrap().fault, true);
        assert_eq!(pins.rope(1).unwrap().map(|r| r.fault), Ok(true));
        assert!(pins.rope(4).is_none(), "no rack 4");
        lines.set_failing(true);
        assert!(
            pins.rope(0).unwrap().is_err(),
            "a failing board reads nothing"
        );
    }

    #[test]
    fn the_healthy_relay_pulses_and_the_beacon_follows_its_polarity() {
        let (map, lines, mut pins) = board();
        pins.pulse_healthy().unwrap();
        let first = lines.level(map.controller_healthy.line);
        pins.pulse_healthy().unwrap();
        assert_ne!(
            first,
            lines.level(map.controller_healthy.line),
            "one edge a step"
        );
        pins.set_alarm(false).unwrap();
        assert!(!lines.asserted(&map.alarm_beacon));
        pins.set_alarm(true).unwrap();
        assert!(lines.asserted(&map.alarm_beacon) && lines.level(map.alarm_beacon.line));
        // The same board with an active-low beacon drives the line low.
        let text = include_str!("../../boards/pins/sim-controller.toml").replace(
            "line = 9\nactive_low = false",
            "line = 9\nactive_low = true",
        );
        let map = PinMap::from_toml(&text, "low.toml").unwrap();
        let lines = SimLines::new();
        let mut pins = BoardPins::new(&map, |n| lines.input(n), |n| lines.output(n));
        pins.set_alarm(true).unwrap();
        assert!(!lines.level(9) && lines.asserted(&map.alarm_beacon));
    }
}
