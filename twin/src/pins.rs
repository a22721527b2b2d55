//! Simulated board pins: the levels of a simulated controller board's
//! lines behind `embedded-hal`'s digital traits, so the controller's
//! [`BoardPins`](loopwarden_boards::pins::BoardPins) drive them as they drive a real board's GPIO lines. The
//! hall makes leak ropes wet and reads the pump relay through them.
//!
//! Glossary:
//! - *line*: an electrical digital signal, high or low.
//! - *assert*: drive a signal to its active level, with its polarity.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use embedded_hal::digital::{ErrorType, InputPin, OutputPin, StatefulOutputPin};
use loopwarden_boards::pins::Line;
#[cfg(test)]
use loopwarden_boards::pins::{BoardPins, PinMap};

/// The electrical levels of a simulated board's lines (clone it freely).
#[derive(Clone)]
pub struct SimLines {
    levels: Arc<Mutex<[bool; 256]>>,
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
        }
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

impl ErrorType for SimPin {
    type Error = Infallible;
}

impl InputPin for SimPin {
    fn is_high(&mut self) -> Result<bool, Infallible> {
        Ok(self.lines.level(self.line))
    }
    fn is_low(&mut self) -> Result<bool, Infallible> {
        Ok(!self.lines.level(self.line))
    }
}

impl OutputPin for SimPin {
    fn set_low(&mut self) -> Result<(), Infallible> {
        self.lines.drive(self.line, false);
        Ok(())
    }
    fn set_high(&mut self) -> Result<(), Infallible> {
        self.lines.drive(self.line, true);
        Ok(())
    }
}

impl StatefulOutputPin for SimPin {
    fn is_set_high(&mut self) -> Result<bool, Infallible> {
        Ok(self.lines.level(self.line))
    }
    fn is_set_low(&mut self) -> Result<bool, Infallible> {
        Ok(!self.lines.level(self.line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board() -> (PinMap, SimLines, BoardPins<SimPin, SimPin>) {
        let map = PinMap::sim_controller();
        let lines = SimLines::new();
        // Dry ropes: the pulled-up lines sit high.
        for l in &map.leaks {
            lines.assert(l, false);
        }
        let pins = BoardPins::new(&map, |n| lines.input(n), |n| lines.output(n));
        (map, lines, pins)
    }

    #[test]
    fn a_wet_rope_pulls_its_line_low_and_reads_as_a_leak_of_its_rack_only() {
        let (map, lines, mut pins) = board();
        assert_eq!(pins.racks(), 4);
        assert!((0..4).all(|r| pins.leak(r).unwrap() == Ok(false)));
        lines.assert(&map.leaks[2], true);
        assert!(
            !lines.level(map.leaks[2].line),
            "active low: the line went low"
        );
        assert_eq!(pins.leak(2).unwrap(), Ok(true));
        assert_eq!(pins.leak(1).unwrap(), Ok(false));
        assert!(pins.leak(4).is_none(), "no rack 4");
    }

    #[test]
    fn the_relay_and_the_beacon_follow_their_polarity() {
        let (map, lines, mut pins) = board();
        pins.set_pump_enable(true).unwrap();
        pins.set_alarm(false).unwrap();
        assert!(lines.asserted(&map.pump_enable) && lines.level(map.pump_enable.line));
        assert!(!lines.asserted(&map.alarm_beacon));
        // The same board with an active-low relay drives the line low.
        let text = include_str!("../../boards/pins/sim-controller.toml").replace(
            "line = 8\nactive_low = false",
            "line = 8\nactive_low = true",
        );
        let map = PinMap::from_toml(&text, "low.toml").unwrap();
        let lines = SimLines::new();
        let mut pins = BoardPins::new(&map, |n| lines.input(n), |n| lines.output(n));
        pins.set_pump_enable(true).unwrap();
        assert!(!lines.level(8) && lines.asserted(&map.pump_enable));
    }
}
