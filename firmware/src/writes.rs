//! A step's writes carried out: the decision path's [`Plan`] (its
//! settings in safety order, held to the map) written to the CDU one at a
//! time, each on its own, as the Linux controller writes them
//! (`cooling_ctrl::modbus::ModbusCdu::write`). Each setting goes to the
//! map's holding register of its name ([`Setting::register`]); the
//! heartbeat only when [`Outcome::due`] says so (every safety write that
//! was due went in, and no safety setting is read back not held:
//! [`crate::read_back`]), its counter cycled through the register's range
//! ([`Register::heartbeat`], as Linux writes it; the count moves only
//! with a heartbeat that went out on the line); a write that fails never holds back
//! the next, and one the step has no time left for is not sent. What became of each
//! goes back to the decision path as an [`Outcome`].
//!
//! Glossary:
//! - *setting port*: what takes one register's words (the RTU master on
//!   the board, a script in the tests).

use core::fmt;

use cooling_decide::{Outcome, Plan, Setting};

use crate::cdu::holding;
use crate::map::{self, Register, ValueError};

/// What writes one holding register.
pub trait SettingPort {
    /// Why a write failed on the line or at the CDU.
    type Error: fmt::Display;
    /// Writes `words` to `r`.
    fn write(&mut self, r: &Register, words: &[u16]) -> Result<(), Self::Error>;
    /// Whether a write that failed with `e` went out on the line (the
    /// CDU answered it, refused it, or did not answer); not when it was
    /// never sent.
    fn was_sent(e: &Self::Error) -> bool;
    /// Whether the step has time left for another transaction, at its
    /// least ([`crate::budget`]).
    fn time_left(&mut self) -> bool;
}

/// Why a write did not go in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WriteFailure<E> {
    /// The CDU or the line failed it.
    Port(E),
    /// The value does not fit the register.
    Value(ValueError),
    /// The map has no holding register of the setting's name.
    NotInMap(&'static str),
    /// Not sent: a safety write failed (the heartbeat only).
    Withheld,
    /// Not sent: a safety setting was read back not held, and none has
    /// read it held since (the heartbeat only, [`crate::read_back`]).
    NotHeld,
    /// Not sent: the step's time ran out.
    OutOfTime,
}

impl<E: fmt::Display> fmt::Display for WriteFailure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriteFailure::Port(e) => write!(f, "{e}"),
            WriteFailure::Value(e) => write!(f, "{e}"),
            WriteFailure::NotInMap(name) => {
                write!(f, "{name}: the CDU's register map has no such setting")
            }
            WriteFailure::Withheld => write!(f, "withheld: a safety write failed"),
            WriteFailure::NotHeld => write!(
                f,
                "withheld: the CDU does not hold a safety setting it echoed (read back)"
            ),
            WriteFailure::OutOfTime => write!(f, "not sent: the step's time ran out"),
        }
    }
}

/// Writes `plan` through `port`, in order, each write on its own; the
/// heartbeat withheld after a safety write that failed, and while
/// `unheld` (a safety setting read back not held, none read held since).
/// The outcome says whether the heartbeat went out on the line
/// ([`Outcome::heartbeat_sent`]): the decision path counts only those.
pub fn execute<P: SettingPort>(port: &mut P, plan: &Plan, unheld: bool) -> Outcome {
    let mut outcome = Outcome::default();
    for w in &plan.writes {
        let r = if !outcome.due(w) {
            Err(WriteFailure::Withheld)
        } else if unheld && w.setting == Setting::Heartbeat {
            Err(WriteFailure::NotHeld)
        } else {
            write_one(port, w.setting, w.value)
        };
        // On the line, whatever its answer: the next heartbeat is one past
        // it (one unanswered may have gone in; one refused, perhaps for
        // its value, is not sent again). One never sent does not count.
        let on_line = match &r {
            Ok(()) => true,
            Err(WriteFailure::Port(e)) => P::was_sent(e),
            Err(_) => false,
        };
        outcome.heartbeat_sent |= w.setting == Setting::Heartbeat && on_line;
        outcome.record(w.setting, r);
    }
    outcome
}

/// Writes `value` of setting `s` to its register, when the step has
/// time for it.
pub fn write_one<P: SettingPort>(
    port: &mut P,
    s: Setting,
    value: f64,
) -> Result<(), WriteFailure<P::Error>> {
    let reg = holding(s.register()).ok_or(WriteFailure::NotInMap(s.register()))?;
    write_to(port, reg, s, value)
}

/// Writes `value` of `s` to `reg`: the heartbeat's counter within the
/// register's range, as the Linux controller writes it
/// ([`Register::heartbeat`]).
fn write_to<P: SettingPort>(
    port: &mut P,
    reg: &Register,
    s: Setting,
    value: f64,
) -> Result<(), WriteFailure<P::Error>> {
    let value = match s {
        Setting::Heartbeat => reg.heartbeat(value),
        _ => value,
    };
    let words = map::encode(reg, value).map_err(WriteFailure::Value)?;
    if !port.time_left() {
        return Err(WriteFailure::OutOfTime);
    }
    port.write(reg, &words).map_err(WriteFailure::Port)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cooling_decide::Write;
    use std::string::{String, ToString};
    use std::vec::Vec;

    /// A CDU that refuses the registers named, and a step with `budget`
    /// transactions of time.
    struct Script {
        refuse: &'static [&'static str],
        /// Registers whose write goes out and is never answered, or, with
        /// `busy`, is never sent (the line busy).
        silent: &'static [&'static str],
        busy: bool,
        budget: usize,
        written: Vec<(&'static str, Vec<u16>)>,
    }

    impl SettingPort for Script {
        type Error = String;
        fn write(&mut self, r: &Register, words: &[u16]) -> Result<(), String> {
            self.budget -= 1;
            if self.refuse.contains(&r.name) {
                return Err(std::format!("{}: exception 4", r.name));
            }
            if self.silent.contains(&r.name) {
                let why = if self.busy { "line busy" } else { "no answer" };
                return Err(std::format!("{}: {why}", r.name));
            }
            self.written.push((r.name, words.to_vec()));
            Ok(())
        }
        fn was_sent(e: &String) -> bool {
            e.contains("exception") || e.contains("no answer")
        }
        fn time_left(&mut self) -> bool {
            self.budget > 0
        }
    }

    fn plan() -> Plan {
        let values = [11.0, 1.0, 1.0, 7.0, 80.0, 30.13];
        Plan {
            writes: Setting::ORDER
                .iter()
                .zip(values)
                .map(|(s, v)| Write {
                    setting: *s,
                    value: v,
                })
                .collect(),
        }
    }

    #[test]
    fn each_setting_goes_to_its_register_in_order() {
        let mut cdu = Script {
            refuse: &[],
            silent: &[],
            busy: false,
            budget: 10,
            written: Vec::new(),
        };
        let o = execute(&mut cdu, &plan(), false);
        assert!(o.all_ok());
        let names: Vec<&str> = cdu.written.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "valves_open",
                "pumps_run",
                "lead_pump",
                "heartbeat",
                "pump_speed",
                "supply_setpoint"
            ]
        );
        assert_eq!(cdu.written[4].1, [800], "80 % at the map's 0.1");
        assert_eq!(cdu.written[5].1, [3013]);
    }

    #[test]
    fn a_refused_safety_write_withholds_the_heartbeat_only() {
        let mut cdu = Script {
            refuse: &["pumps_run"],
            silent: &[],
            busy: false,
            budget: 10,
            written: Vec::new(),
        };
        let o = execute(&mut cdu, &plan(), false);
        let failed: Vec<(Setting, String)> = (o.tried.iter())
            .filter_map(|(s, r)| r.as_ref().err().map(|w| (*s, w.to_string())))
            .collect();
        assert_eq!(
            failed,
            [
                (Setting::PumpsRun, "pumps_run: exception 4".into()),
                (Setting::Heartbeat, "withheld: a safety write failed".into())
            ]
        );
        let names: Vec<&str> = cdu.written.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            ["valves_open", "lead_pump", "pump_speed", "supply_setpoint"]
        );
    }

    /// The decision path counts the heartbeat only when it went out on
    /// the line, answered or not (`Outcome::heartbeat_sent`): a register
    /// of two values would otherwise get the last one sent again.
    #[test]
    fn the_outcome_says_the_heartbeat_went_out_only_when_it_was_sent() {
        let sent = |refuse: &'static [&'static str], budget: usize, unheld: bool| {
            let mut cdu = Script {
                refuse,
                silent: &[],
                busy: false,
                budget,
                written: Vec::new(),
            };
            execute(&mut cdu, &plan(), unheld).heartbeat_sent
        };
        assert!(sent(&[], 10, false), "taken");
        assert!(sent(&["heartbeat"], 10, false), "sent, refused");
        let line = |busy: bool| {
            let mut silent = Script {
                refuse: &[],
                silent: &["heartbeat"],
                busy,
                budget: 10,
                written: Vec::new(),
            };
            execute(&mut silent, &plan(), false).heartbeat_sent
        };
        assert!(line(false), "unanswered: it may have gone in");
        assert!(!line(true), "the line busy: never sent");
        assert!(!sent(&["valves_open"], 10, false), "valves failed");
        assert!(!sent(&[], 10, true), "withheld: a setting not held");
        assert!(!sent(&[], 3, false), "no time left for it");
    }

    #[test]
    fn a_write_with_no_time_left_is_not_sent() {
        let mut cdu = Script {
            refuse: &[],
            silent: &[],
            busy: false,
            budget: 2,
            written: Vec::new(),
        };
        let o = execute(&mut cdu, &plan(), false);
        assert_eq!(cdu.written.len(), 2);
        let e = o.first_error().unwrap();
        assert_eq!(
            (e.setting, e.why.as_str()),
            (Setting::LeadPump, "not sent: the step's time ran out")
        );
    }

    #[test]
    fn the_heartbeat_cycles_through_a_narrow_range_instead_of_leaving_it() {
        let byte = Register {
            min: Some(0.0),
            max: Some(255.0),
            ..*holding("heartbeat").unwrap()
        };
        let mut cdu = Script {
            refuse: &[],
            silent: &[],
            busy: false,
            budget: 10,
            written: Vec::new(),
        };
        for counter in [255.0, 256.0, 257.0] {
            write_to(&mut cdu, &byte, Setting::Heartbeat, counter).unwrap();
        }
        let words: Vec<u16> = cdu.written.iter().map(|(_, w)| w[0]).collect();
        assert_eq!(words, [255, 0, 1], "step 256 writes 0, not out of range");
        // Other settings are written as they are, and held to the range.
        let e = write_to(&mut cdu, &byte, Setting::PumpSpeed, 256.0).unwrap_err();
        assert!(matches!(e, WriteFailure::Value(_)), "{e}");
    }

    #[test]
    fn a_value_the_register_cannot_take_fails_that_write_alone() {
        let mut p = plan();
        p.writes[5].value = 50.0;
        let mut cdu = Script {
            refuse: &[],
            silent: &[],
            busy: false,
            budget: 10,
            written: Vec::new(),
        };
        let o = execute(&mut cdu, &p, false);
        assert_eq!(cdu.written.len(), 5);
        assert_eq!(
            o.first_error().map(|e| e.to_string()),
            Some("supply_setpoint: supply_setpoint: 50.00 is outside 17.00 to 45.00".into())
        );
    }
}
