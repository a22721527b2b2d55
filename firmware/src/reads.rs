//! A step's read of the CDU's input registers, span by span, as the
//! Linux controller reads them (`cooling_ctrl::modbus`'s `reads`): a
//! span that fails loses its own registers only. The others' readings
//! are kept (a meter sub-device that fails must not take the
//! temperatures and the leak inputs with it), the failed span's
//! registers read no value ([`InputValues`] leaves a span not read
//! unknown), and its failure is said on the console and counted
//! ([`ReadErrors`]). The read fails as a whole when no span answered,
//! or when a span that failed holds a pump's running flag
//! ([`lost_running_flag`]). After a span the CDU did not answer (no answer, a garbled
//! or wrong answer, the UART's error, a line that never fell silent) or
//! that the step's time left unsent, the read's later spans are not
//! asked: each would wait out its own timeout; their registers read no
//! value too. After a refusal (a Modbus exception: the CDU answered) the
//! next span is asked. A read that answers whole takes one transaction a
//! span, as before.
//!
//! Glossary:
//! - *gap*: a span of a read that failed, or was not asked, while
//!   another answered.

use core::fmt::{self, Write};

use cooling_decide::CduMeasurements;

use crate::cdu::InputValues;
use crate::map::{self, Span};
use crate::rtu::{RtuError, MAX_READ};

/// The CDU's input registers, one span a request, within the step's time.
pub trait InputPort {
    /// Reads `span` into `out` (at least `span.count` words).
    fn read_inputs(&mut self, span: &Span, out: &mut [u16]) -> Result<usize, RtuError>;
    /// Whether the step's time still holds a transaction.
    fn time_left(&mut self) -> bool;
}

/// Reads that failed since boot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadErrors {
    /// Reads no span of which answered: the step had no readings.
    pub whole: u32,
    /// Reads some span of which failed (or was not asked) while another
    /// answered: the step had the rest.
    pub in_part: u32,
}

/// What became of one span.
#[derive(Debug, Clone, Copy)]
enum Got {
    Words,
    Failed(RtuError),
    /// Not asked: the step's time ran out.
    NoTime,
    /// Not asked: an earlier span got no answer.
    AfterUnanswered,
}

/// Whether, after `e` failed a span, the next span is worth asking: the
/// CDU answered, and refused only that one.
fn next_worth_asking(e: &RtuError) -> bool {
    matches!(e, RtuError::Refused { .. })
}

/// Reads every span of [`map::SPANS`] through `port`: the measurements
/// of the spans that answered (`None`: none did), each failure said on
/// `console` and counted in `errors`.
pub fn read_spans(
    port: &mut impl InputPort,
    console: &mut impl Write,
    errors: &mut ReadErrors,
) -> Option<CduMeasurements> {
    let mut values = InputValues::default();
    let mut words = [0u16; MAX_READ];
    let mut got = [Got::Words; map::SPANS.len()];
    // What the spans left are, once asking has stopped.
    let mut stopped = None;
    for (span, got) in map::SPANS.iter().zip(got.iter_mut()) {
        *got = if let Some(g) = stopped {
            g
        } else if !port.time_left() {
            stopped = Some(Got::NoTime);
            Got::NoTime
        } else {
            match port.read_inputs(span, &mut words) {
                Ok(_) => {
                    values.take(span, &words[..usize::from(span.count)]);
                    Got::Words
                }
                Err(e) => {
                    if !next_worth_asking(&e) {
                        stopped = Some(Got::AfterUnanswered);
                    }
                    Got::Failed(e)
                }
            }
        };
    }
    if got.iter().all(|g| matches!(g, Got::Words)) {
        return Some(values.measurements());
    }
    let some = got.iter().any(|g| matches!(g, Got::Words));
    let answered = some && !lost_running_flag(&got);
    if some && !answered {
        let _ = writeln!(
            console,
            "cdu: a pump's running flag went unread: the step takes none of this read (a flag not read is no pump stopped)"
        );
    }
    if answered {
        errors.in_part = errors.in_part.wrapping_add(1);
    } else {
        errors.whole = errors.whole.wrapping_add(1);
    }
    for (span, g) in map::SPANS.iter().zip(&got) {
        let _ = say(console, span, g, answered, errors);
    }
    answered.then(|| values.measurements())
}

/// Whether a span that did not answer holds a pump's running flag. A
/// read that lost one fails whole, as when nothing answered: the
/// decision path takes a flag of no value as a pump not running, so a
/// refused span would have tripped healthy pumps, both in turn, and kept
/// them out of service, where a CDU not read is the loss of the CDU.
fn lost_running_flag(got: &[Got]) -> bool {
    let flag = |i: usize| {
        let name = map::REGISTERS[i].name;
        name == map::PUMP_A_RUNNING.name || name == map::PUMP_B_RUNNING.name
    };
    (map::SPANS.iter().zip(got))
        .any(|(span, g)| !matches!(g, Got::Words) && span.registers.iter().any(|&i| flag(i)))
}

/// One span's failure on the console (nothing for one that answered).
fn say(
    console: &mut impl Write,
    span: &Span,
    got: &Got,
    answered: bool,
    errors: &ReadErrors,
) -> fmt::Result {
    let end = u32::from(span.start) + u32::from(span.count).max(1) - 1;
    match got {
        Got::Words => return Ok(()),
        Got::Failed(e) if answered => write!(console, "cdu (in part): {e}")?,
        Got::Failed(e) => write!(console, "cdu: {e}")?,
        Got::NoTime => write!(
            console,
            "cdu: read input {}-{end} not asked: the step's time ran out",
            span.start
        )?,
        Got::AfterUnanswered => write!(
            console,
            "cdu: read input {}-{end} not asked: a read before it got no answer",
            span.start
        )?,
    }
    if answered {
        write!(
            console,
            "; its registers read no value this step, the rest was read"
        )?;
    }
    writeln!(
        console,
        " (reads failed since boot: {} whole, {} in part)",
        errors.whole, errors.in_part
    )
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::collections::VecDeque;
    use std::string::String;
    use std::vec::Vec;

    use super::*;
    use crate::rtu::{Op, OpKind};

    /// A scripted CDU: each request's answer in turn (`Ok`: the words).
    struct Scripted {
        answers: VecDeque<Result<Vec<u16>, RtuError>>,
        asked: Vec<u16>,
        time: bool,
    }

    impl Scripted {
        fn new(answers: impl IntoIterator<Item = Result<Vec<u16>, RtuError>>) -> Self {
            Self {
                answers: answers.into_iter().collect(),
                asked: Vec::new(),
                time: true,
            }
        }
    }

    impl InputPort for Scripted {
        fn read_inputs(&mut self, span: &Span, out: &mut [u16]) -> Result<usize, RtuError> {
            self.asked.push(span.start);
            let words = self.answers.pop_front().expect("a request scripted")?;
            out[..words.len()].copy_from_slice(&words);
            Ok(words.len())
        }
        fn time_left(&mut self) -> bool {
            self.time
        }
    }

    fn op(span: &Span) -> Op {
        let (first, last) = span.names();
        Op {
            kind: OpKind::ReadInput,
            unit: map::UNIT_ID,
            address: span.start,
            count: span.count,
            first,
            last,
            sent: [0; 2],
        }
    }

    fn refused(span: &Span, code: u8) -> RtuError {
        RtuError::Refused { op: op(span), code }
    }

    fn no_answer(span: &Span) -> RtuError {
        RtuError::NoAnswer {
            op: op(span),
            after_us: 200_000,
            got: 0,
            cut: false,
        }
    }

    /// Supply 30.12 °C, return 38.5 °C, flow 192.3 L/min, facility 27 °C,
    /// pump A running, B not, rack 2 wet.
    fn temperatures() -> Vec<u16> {
        std::vec![3012, 3850, 1923, 2700, 1, 0, 0b100]
    }

    /// IT 80 kW, cooling 5 kW, facility 86 kW, 100 kPa, rack 2 closed,
    /// pump A faulted, outdoor -3.5 °C.
    fn meters() -> Vec<u16> {
        std::vec![
            1,
            14_464,
            0,
            5000,
            1,
            20_464,
            1000,
            0b100,
            1,
            0,
            (-350i16) as u16
        ]
    }

    #[test]
    fn a_span_the_cdu_refuses_loses_only_its_own_registers() {
        for code in [2, 4, 11] {
            let mut cdu = Scripted::new([Ok(temperatures()), Err(refused(&map::SPANS[1], code))]);
            let (mut console, mut errors) = (String::new(), ReadErrors::default());
            let m = read_spans(&mut cdu, &mut console, &mut errors).expect("one span answered");
            // What answered is kept: the temperatures, the pumps, the leaks.
            assert_eq!(m.supply_c, Some(30.12));
            assert_eq!(m.pumps_running, [Some(true), Some(false)]);
            assert_eq!(m.leaks, Some(0b100));
            // What the refused span holds is unknown.
            assert_eq!((m.it_w, m.valves_closed, m.outdoor_c), (None, None, None));
            assert_eq!(m.pump_faults, [None, None]);
            // The refusal is counted and said.
            assert_eq!(
                errors,
                ReadErrors {
                    whole: 0,
                    in_part: 1
                }
            );
            let want = std::format!(
                "cdu (in part): read input 10-20 (it_power to outdoor_temp) of unit 1: the CDU \
                 refused it with exception {code} ("
            );
            assert!(console.starts_with(&want), "{console}");
            assert!(
                console.ends_with(
                    "; its registers read no value this step, the rest was read \
                     (reads failed since boot: 0 whole, 1 in part)\n"
                ),
                "{console}"
            );
            assert_eq!(cdu.asked, [0, 10], "no transaction added");
        }
    }

    #[test]
    fn a_refused_span_holding_the_running_flags_fails_the_read_whole() {
        // Exception 6 (busy) is a transient: the pumps run on. A step
        // that took the meters without the flags would read both pumps
        // stopped and trip them in turn.
        let mut cdu = Scripted::new([Err(refused(&map::SPANS[0], 6)), Ok(meters())]);
        let (mut console, mut errors) = (String::new(), ReadErrors::default());
        assert!(read_spans(&mut cdu, &mut console, &mut errors).is_none());
        assert_eq!(
            errors,
            ReadErrors {
                whole: 1,
                in_part: 0
            }
        );
        assert!(
            console.contains("a pump's running flag went unread"),
            "{console}"
        );
        assert_eq!(cdu.asked, [0, 10]);
    }

    #[test]
    fn a_read_that_answers_whole_is_said_nowhere_and_counts_nothing() {
        let mut cdu = Scripted::new([Ok(temperatures()), Ok(meters())]);
        let (mut console, mut errors) = (String::new(), ReadErrors::default());
        let m = read_spans(&mut cdu, &mut console, &mut errors).expect("read");
        assert_eq!((m.supply_c, m.it_w), (Some(30.12), Some(80_000.0)));
        assert_eq!((console.as_str(), errors), ("", ReadErrors::default()));
        assert_eq!(cdu.asked, [0, 10]);
    }

    #[test]
    fn after_no_answer_the_later_spans_are_not_asked() {
        // The first span unanswered: nothing read, the read fails whole.
        let mut cdu = Scripted::new([Err(no_answer(&map::SPANS[0]))]);
        let (mut console, mut errors) = (String::new(), ReadErrors::default());
        assert!(read_spans(&mut cdu, &mut console, &mut errors).is_none());
        assert_eq!(cdu.asked, [0], "the second would wait out its own timeout");
        assert_eq!(
            errors,
            ReadErrors {
                whole: 1,
                in_part: 0
            }
        );
        assert!(
            console.contains("cdu: read input 0-6 (supply_temp to leak_inputs) of unit 1: no whole answer within 200 ms"),
            "{console}"
        );
        assert!(
            console.contains("cdu: read input 10-20 not asked: a read before it got no answer"),
            "{console}"
        );
        // The second unanswered: the first kept.
        let mut cdu = Scripted::new([Ok(temperatures()), Err(no_answer(&map::SPANS[1]))]);
        let m = read_spans(&mut cdu, &mut console, &mut errors).expect("the first answered");
        assert_eq!((m.leaks, m.it_w), (Some(0b100), None));
        assert_eq!(
            errors,
            ReadErrors {
                whole: 1,
                in_part: 1
            }
        );
    }

    #[test]
    fn every_span_refused_fails_the_read_whole() {
        let mut cdu = Scripted::new([
            Err(refused(&map::SPANS[0], 4)),
            Err(refused(&map::SPANS[1], 4)),
        ]);
        let (mut console, mut errors) = (String::new(), ReadErrors::default());
        assert!(read_spans(&mut cdu, &mut console, &mut errors).is_none());
        assert_eq!(
            errors,
            ReadErrors {
                whole: 1,
                in_part: 0
            }
        );
        assert_eq!(console.lines().count(), 2, "{console}");
        assert!(!console.contains("cdu (in part)"), "{console}");
    }

    #[test]
    fn a_span_the_steps_time_leaves_unsent_is_not_asked_nor_those_after_it() {
        let mut cdu = Scripted::new([]);
        cdu.time = false;
        let (mut console, mut errors) = (String::new(), ReadErrors::default());
        assert!(read_spans(&mut cdu, &mut console, &mut errors).is_none());
        assert!(cdu.asked.is_empty());
        assert!(
            console.starts_with("cdu: read input 0-6 not asked: the step's time ran out"),
            "{console}"
        );
        assert!(
            console.contains("cdu: read input 10-20 not asked: the step's time ran out"),
            "{console}"
        );
    }
}
