//! Board pins: the controller's digital inputs and outputs, as data and
//! behind `embedded-hal`'s digital traits.
//!
//! A pin map (`boards/pins/*.toml`) says which line carries which signal
//! and with which polarity: a leak rope per rack (input), the pump-enable
//! relay and the alarm beacon (outputs). [`BoardPins`] reads and drives
//! them in logical terms (a leak, the relay on) over any `InputPin` and
//! `OutputPin`: a Linux GPIO implementation on a real board, or the
//! twin's simulated pins (`loopwarden_twin::pins`), behind the same traits.
//!
//! Glossary:
//! - *line*: an electrical digital signal, high or low.
//! - *active low*: the signal is asserted when the line is low (a leak
//!   rope pulling a pulled-up line to ground).

use embedded_hal::digital::{InputPin, OutputPin};
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
