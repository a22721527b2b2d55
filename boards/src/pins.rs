//! Board pins: the controller's digital inputs and outputs, as data and
//! behind `embedded-hal`'s digital traits.
//!
//! A pin map (`boards/pins/*.toml`) says which line carries which signal
//! and with which polarity: a leak rope per rack (input), the pump-enable
//! relay and the alarm beacon (outputs). [`BoardPins`] reads and drives
//! them in logical terms (a leak, the relay on) over any `InputPin` and
//! `OutputPin`: the simulated pins here ([`SimLines`]), or a Linux GPIO
//! implementation on a real board, behind the same traits.
//!
//! Glossary:
//! - *line*: an electrical digital signal, high or low.
//! - *active low*: the signal is asserted when the line is low (a leak
//!   rope pulling a pulled-up line to ground).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use embedded_hal::digital::{ErrorType, InputPin, OutputPin, StatefulOutputPin};
use serde::Deserialize;

use crate::BoardError;

/// One mapped line.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Line {
    /// `leak` (inputs), `pump_enable` or `alarm_beacon` (outputs).
    pub signal: String,
    /// The rack, for leak inputs.
    pub rack: Option<usize>,
    /// The line's number on the board.
    pub line: u8,
    /// Asserted when low.
    pub active_low: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    board: String,
    #[serde(default)]
    input: Vec<Line>,
    #[serde(default)]
    output: Vec<Line>,
}

/// A board's pin map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinMap {
    /// Board name.
    pub board: String,
    /// Leak inputs, by rack (index = rack).
    pub leaks: Vec<Line>,
    /// The pump-enable relay.
    pub pump_enable: Line,
    /// The alarm beacon.
    pub alarm_beacon: Line,
}

impl PinMap {
    /// Parses and checks a pin map; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, BoardError> {
        let file: File = crate::parse_checked(text, origin, |_| Ok(()))?;
        let invalid = |message: String| BoardError::Invalid {
            origin: origin.to_string(),
            message,
        };
        let mut used = std::collections::BTreeMap::new();
        for l in file.input.iter().chain(&file.output) {
            if let Some(other) = used.insert(l.line, l.signal.clone()) {
                return Err(invalid(format!(
                    "line {} carries both {other} and {}",
                    l.line, l.signal
                )));
            }
        }
        let mut leaks: Vec<Line> = Vec::new();
        for l in &file.input {
            if l.signal != "leak" {
                return Err(invalid(format!(
                    "input signal {:?}: inputs are leak ropes (\"leak\")",
                    l.signal
                )));
            }
            let Some(rack) = l.rack else {
                return Err(invalid(format!(
                    "leak input on line {} names no rack",
                    l.line
                )));
            };
            if leaks.iter().any(|x| x.rack == Some(rack)) {
                return Err(invalid(format!("rack {rack} has two leak inputs")));
            }
            leaks.push(l.clone());
        }
        leaks.sort_by_key(|l| l.rack);
        if let Some((i, l)) = leaks.iter().enumerate().find(|(i, l)| l.rack != Some(*i)) {
            return Err(invalid(format!(
                "leak inputs must cover racks 0 to {} without a gap; rack {i} is missing (found {:?})",
                leaks.len() - 1,
                l.rack
            )));
        }
        let output = |signal: &str| {
            let mut found = file.output.iter().filter(|l| l.signal == signal);
            match (found.next(), found.next()) {
                (Some(l), None) => Ok(l.clone()),
                (None, _) => Err(invalid(format!("no output {signal:?}"))),
                (Some(_), Some(_)) => Err(invalid(format!("output {signal:?} appears twice"))),
            }
        };
        if let Some(l) = file
            .output
            .iter()
            .find(|l| l.signal != "pump_enable" && l.signal != "alarm_beacon")
        {
            return Err(invalid(format!(
                "output signal {:?}: pump_enable or alarm_beacon",
                l.signal
            )));
        }
        Ok(Self {
            board: file.board,
            leaks,
            pump_enable: output("pump_enable")?,
            alarm_beacon: output("alarm_beacon")?,
        })
    }

    /// The simulated controller board's map, shipped with this crate.
    pub fn sim_controller() -> Self {
        Self::from_toml(
            include_str!("../pins/sim-controller.toml"),
            "pins/sim-controller.toml",
        )
        .expect("the shipped pin map is valid")
    }
}

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

/// The controller's board signals in logical terms, over any pins.
pub struct BoardPins<I, O> {
    leaks: Vec<(I, bool)>,
    pump_enable: (O, bool),
    alarm_beacon: (O, bool),
}

impl<I: InputPin, O: OutputPin> BoardPins<I, O> {
    /// Pins for `map`; `input` and `output` open a line.
    pub fn new(
        map: &PinMap,
        mut input: impl FnMut(u8) -> I,
        mut output: impl FnMut(u8) -> O,
    ) -> Self {
        Self {
            leaks: map
                .leaks
                .iter()
                .map(|l| (input(l.line), l.active_low))
                .collect(),
            pump_enable: (output(map.pump_enable.line), map.pump_enable.active_low),
            alarm_beacon: (output(map.alarm_beacon.line), map.alarm_beacon.active_low),
        }
    }

    /// Racks with a leak input.
    pub fn racks(&self) -> usize {
        self.leaks.len()
    }

    /// Whether `rack`'s leak rope reports a leak (`None`: no such rack).
    pub fn leak(&mut self, rack: usize) -> Option<Result<bool, I::Error>> {
        let (pin, active_low) = self.leaks.get_mut(rack)?;
        Some(pin.is_high().map(|high| high != *active_low))
    }

    fn drive(pin: &mut (O, bool), on: bool) -> Result<(), O::Error> {
        if on != pin.1 {
            pin.0.set_high()
        } else {
            pin.0.set_low()
        }
    }

    /// Closes (`true`) or opens the pump-enable relay.
    pub fn set_pump_enable(&mut self, on: bool) -> Result<(), O::Error> {
        Self::drive(&mut self.pump_enable, on)
    }

    /// Lights (`true`) or darkens the alarm beacon.
    pub fn set_alarm(&mut self, on: bool) -> Result<(), O::Error> {
        Self::drive(&mut self.alarm_beacon, on)
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
        let text = include_str!("../pins/sim-controller.toml").replace(
            "line = 8\nactive_low = false",
            "line = 8\nactive_low = true",
        );
        let map = PinMap::from_toml(&text, "low.toml").unwrap();
        let lines = SimLines::new();
        let mut pins = BoardPins::new(&map, |n| lines.input(n), |n| lines.output(n));
        pins.set_pump_enable(true).unwrap();
        assert!(!lines.level(8) && lines.asserted(&map.pump_enable));
    }

    #[test]
    fn broken_pin_maps_are_refused_with_the_reason() {
        let base = include_str!("../pins/sim-controller.toml");
        let bad = |from: &str, to: &str| {
            PinMap::from_toml(&base.replacen(from, to, 1), "p.toml")
                .unwrap_err()
                .to_string()
        };
        assert!(bad("line = 9", "line = 8").contains("line 8 carries both"));
        assert!(bad("rack = 1\n", "rack = 0\n").contains("rack 0 has two leak inputs"));
        assert!(bad("rack = 3\n", "rack = 5\n").contains("without a gap"));
        assert!(bad("signal = \"alarm_beacon\"", "signal = \"siren\"").contains("siren"));
        assert!(bad("active_low = true", "activ_low = true").contains("activ_low"));
    }
}
