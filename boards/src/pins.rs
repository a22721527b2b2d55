//! Board pins: the controller's digital inputs and outputs, as data and
//! behind `embedded-hal`'s digital traits.
//!
//! A pin map (`boards/pins/*.toml`) says which line carries which signal
//! and with which polarity: per rack, a leak rope's input (`leak`) and its
//! rope controller's supervision input (`rope_fault`: the rope is cut or
//! shorted); and two outputs, the `controller_healthy` relay and the alarm
//! beacon. [`BoardPins`] reads and drives them in logical terms (a leak, a
//! rope fault, the relay pulsed) over any `InputPin` and `OutputPin`: a
//! Linux GPIO implementation on a real board, or the twin's simulated pins
//! (`loopwarden_twin::pins`), behind the same traits.
//!
//! The `controller_healthy` line is toggled once per completed control
//! step. It drives a retriggerable watchdog relay whose contact is the
//! CDU's "controller healthy" input: when the pulses stop (the loop hangs,
//! the process dies, the board loses power) the relay drops out and the
//! CDU falls back to its local control.
//!
//! Glossary:
//! - *line*: an electrical digital signal, high or low.
//! - *active low*: the signal is asserted when the line is low (a leak
//!   rope pulling a pulled-up line to ground).
//! - *rope*: a rack's leak-detection cable: its `leak` input and its
//!   `rope_fault` supervision input.

use embedded_hal::digital::{InputPin, OutputPin};
use serde::Deserialize;

use crate::BoardError;

/// One mapped line.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Line {
    /// `leak` or `rope_fault` (inputs), `controller_healthy` or
    /// `alarm_beacon` (outputs).
    pub signal: String,
    /// The rack, for rope inputs.
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

/// A rack's leak rope: its leak input and its supervision input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rope {
    /// The rack.
    pub rack: usize,
    /// Asserted: the rope is wet.
    pub leak: Line,
    /// Asserted: the rope is cut or shorted.
    pub fault: Line,
}

/// A board's pin map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinMap {
    /// Board name.
    pub board: String,
    /// The ropes, by rack (racks without a rope are absent).
    pub ropes: Vec<Rope>,
    /// The controller-healthy relay (pulsed once per control step).
    pub controller_healthy: Line,
    /// The alarm beacon.
    pub alarm_beacon: Line,
}

type Invalid<'a> = &'a dyn Fn(String) -> BoardError;

/// The ropes of a map's inputs: every rack's `leak` with its `rope_fault`.
fn ropes(inputs: &[Line], invalid: Invalid<'_>) -> Result<Vec<Rope>, BoardError> {
    let mut found: std::collections::BTreeMap<usize, [Option<Line>; 2]> = Default::default();
    for l in inputs {
        let k = match l.signal.as_str() {
            "leak" => 0,
            "rope_fault" => 1,
            other => {
                return Err(invalid(format!(
                    "input signal {other:?}: inputs are a rope's \"leak\" or \"rope_fault\""
                )))
            }
        };
        let Some(rack) = l.rack else {
            return Err(invalid(format!(
                "{} input on line {} names no rack",
                l.signal, l.line
            )));
        };
        if found.entry(rack).or_default()[k]
            .replace(l.clone())
            .is_some()
        {
            return Err(invalid(format!("rack {rack} has two {} inputs", l.signal)));
        }
    }
    found
        .into_iter()
        .map(|(rack, pair)| match pair {
            [Some(leak), Some(fault)] => Ok(Rope { rack, leak, fault }),
            [Some(_), None] => Err(invalid(format!(
                "rack {rack}'s rope has no rope_fault input: an unsupervised rope reads dry when cut"
            ))),
            _ => Err(invalid(format!("rack {rack} has a rope_fault input but no leak input"))),
        })
        .collect()
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
        let ropes = ropes(&file.input, &invalid)?;
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
            .find(|l| l.signal != "controller_healthy" && l.signal != "alarm_beacon")
        {
            let hint = if l.signal == "pump_enable" {
                " (the relay is now \"controller_healthy\": pulsed while the control loop runs)"
            } else {
                ""
            };
            return Err(invalid(format!(
                "output signal {:?}: controller_healthy or alarm_beacon{hint}",
                l.signal
            )));
        }
        Ok(Self {
            board: file.board,
            ropes,
            controller_healthy: output("controller_healthy")?,
            alarm_beacon: output("alarm_beacon")?,
        })
    }

    /// The rope of `rack`, if it has one.
    pub fn rope(&self, rack: usize) -> Option<&Rope> {
        self.ropes.iter().find(|r| r.rack == rack)
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

/// A rope's two inputs, with their polarity.
struct RopePins<I> {
    rack: usize,
    leak: (I, bool),
    fault: (I, bool),
}

/// The controller's board signals in logical terms, over any pins.
pub struct BoardPins<I, O> {
    ropes: Vec<RopePins<I>>,
    healthy: (O, bool),
    healthy_level: bool,
    alarm_beacon: (O, bool),
}

/// What one rope reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeState {
    /// The rope is wet.
    pub wet: bool,
    /// The rope controller reports the rope cut or shorted.
    pub fault: bool,
}

impl<I: InputPin, O: OutputPin> BoardPins<I, O> {
    /// Pins for `map`; `input` and `output` open a line.
    pub fn new(
        map: &PinMap,
        mut input: impl FnMut(u8) -> I,
        mut output: impl FnMut(u8) -> O,
    ) -> Self {
        Self {
            ropes: map
                .ropes
                .iter()
                .map(|r| RopePins {
                    rack: r.rack,
                    leak: (input(r.leak.line), r.leak.active_low),
                    fault: (input(r.fault.line), r.fault.active_low),
                })
                .collect(),
            healthy: (
                output(map.controller_healthy.line),
                map.controller_healthy.active_low,
            ),
            healthy_level: false,
            alarm_beacon: (output(map.alarm_beacon.line), map.alarm_beacon.active_low),
        }
    }

    /// Racks with a rope, bit n = rack n.
    pub fn roped(&self) -> u16 {
        self.ropes
            .iter()
            .filter(|r| r.rack < 16)
            .fold(0, |m, r| m | (1 << r.rack))
    }

    fn asserted(pin: &mut (I, bool)) -> Result<bool, I::Error> {
        pin.0.is_high().map(|high| high != pin.1)
    }

    /// What `rack`'s rope reads (`None`: the rack has no rope).
    pub fn rope(&mut self, rack: usize) -> Option<Result<RopeState, I::Error>> {
        let r = self.ropes.iter_mut().find(|r| r.rack == rack)?;
        let state = Self::asserted(&mut r.leak)
            .and_then(|wet| Self::asserted(&mut r.fault).map(|fault| RopeState { wet, fault }));
        Some(state)
    }

    fn drive(pin: &mut (O, bool), on: bool) -> Result<(), O::Error> {
        if on != pin.1 {
            pin.0.set_high()
        } else {
            pin.0.set_low()
        }
    }

    /// Toggles the controller-healthy line: one pulse edge per completed
    /// control step.
    pub fn pulse_healthy(&mut self) -> Result<(), O::Error> {
        self.healthy_level = !self.healthy_level;
        Self::drive(&mut self.healthy, self.healthy_level)
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
        assert!(bad("signal = \"rope_fault\"", "signal = \"leak_fault\"").contains("leak_fault"));
        assert!(bad("signal = \"alarm_beacon\"", "signal = \"siren\"").contains("siren"));
        assert!(bad(
            "signal = \"controller_healthy\"",
            "signal = \"pump_enable\""
        )
        .contains("now \"controller_healthy\""));
        // A rope without supervision is refused; a rack without a rope is
        // the controller config's business.
        let no_fault = base.replacen(
            "[[input]]\nsignal = \"rope_fault\"\nrack = 0\nline = 4\nactive_low = false\n",
            "",
            1,
        );
        let e = PinMap::from_toml(&no_fault, "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("rack 0's rope has no rope_fault input"), "{e}");
        let map = PinMap::sim_controller();
        assert_eq!(map.ropes.len(), 4);
        assert_eq!(map.rope(2).map(|r| r.fault.line), Some(6));
        assert!(bad("active_low = true", "activ_low = true").contains("activ_low"));
    }
}
