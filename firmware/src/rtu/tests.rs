//! The master against a scripted CDU on a simulated line and clock.

extern crate std;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::vec::Vec;

use embedded_hal_nb::serial::{ErrorKind, ErrorType};

use super::*;
use crate::map;

/// Simulated time, µs, shared by the line and the clock.
type Now = Rc<Cell<u64>>;

struct TestClock(Now);

impl Clock for TestClock {
    fn now_us(&mut self) -> u64 {
        self.0.get()
    }
    fn idle(&mut self) {
        self.0.set(self.0.get() + 50);
    }
}

/// What the scripted CDU does with the next request.
struct Reply {
    /// Answer after this long, µs (`None`: never).
    after_us: Option<u64>,
    bytes: Vec<u8>,
}

#[derive(Default)]
struct Wire {
    /// Requests as written, with when their first byte went out.
    sent: Vec<(u64, Vec<u8>)>,
    writing: Vec<u8>,
    first_byte_at: u64,
    replies: VecDeque<Reply>,
    /// Bytes on the way in, each readable from its time.
    incoming: VecDeque<(u64, u8)>,
}

struct TestLine {
    now: Now,
    wire: Rc<RefCell<Wire>>,
}

impl ErrorType for TestLine {
    type Error = ErrorKind;
}

impl serial::Read<u8> for TestLine {
    fn read(&mut self) -> nb::Result<u8, ErrorKind> {
        let mut w = self.wire.borrow_mut();
        match w.incoming.front() {
            Some((at, b)) if *at <= self.now.get() => {
                let b = *b;
                w.incoming.pop_front();
                Ok(b)
            }
            _ => Err(nb::Error::WouldBlock),
        }
    }
}

impl serial::Write<u8> for TestLine {
    fn write(&mut self, b: u8) -> nb::Result<(), ErrorKind> {
        let mut w = self.wire.borrow_mut();
        if w.writing.is_empty() {
            w.first_byte_at = self.now.get();
        }
        w.writing.push(b);
        Ok(())
    }
    fn flush(&mut self) -> nb::Result<(), ErrorKind> {
        let now = self.now.get();
        let mut w = self.wire.borrow_mut();
        let req = std::mem::take(&mut w.writing);
        let at = w.first_byte_at;
        w.sent.push((at, req));
        if let Some(Reply {
            after_us: Some(after),
            bytes,
        }) = w.replies.pop_front()
        {
            for (i, b) in bytes.into_iter().enumerate() {
                w.incoming.push_back((now + after + 520 * i as u64, b));
            }
        }
        Ok(())
    }
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = body.to_vec();
    f.extend_from_slice(&rtu::crc16(body).to_be_bytes());
    f
}

fn master(replies: Vec<Reply>) -> (RtuMaster<TestLine, TestClock>, Rc<RefCell<Wire>>, Now) {
    let now: Now = Rc::new(Cell::new(1_000_000));
    let wire = Rc::new(RefCell::new(Wire {
        replies: replies.into(),
        ..Wire::default()
    }));
    let line = TestLine {
        now: now.clone(),
        wire: wire.clone(),
    };
    let m = RtuMaster::new(line, TestClock(now.clone()), 1, 19_200, 200_000);
    (m, wire, now)
}

fn ok(bytes: Vec<u8>) -> Reply {
    Reply {
        after_us: Some(3_000),
        bytes,
    }
}

/// The first span's answer: supply 30.12 °C ... rack 2 leaking.
fn first_span_answer() -> Vec<u8> {
    let mut body = std::vec![1, 4, 14];
    for w in [3012u16, 3850, 1923, 2700, 1, 0, 0b100] {
        body.extend_from_slice(&w.to_be_bytes());
    }
    frame(&body)
}

#[test]
fn the_gap_is_three_and_a_half_characters_of_the_baud_rate() {
    assert_eq!(char_us(19_200), 521);
    assert_eq!(gap_us(19_200), 1_823);
    assert_eq!(gap_us(9_600), 3_646);
}

#[test]
fn a_read_asks_function_4_and_decodes_the_words() {
    let (mut m, wire, _) = master(std::vec![ok(first_span_answer())]);
    let mut out = [0u16; 16];
    assert_eq!(m.read_inputs(&map::SPANS[0], &mut out), Ok(7));
    assert_eq!(&out[..7], &[3012, 3850, 1923, 2700, 1, 0, 0b100]);
    let w = wire.borrow();
    assert_eq!(w.sent[0].1, frame(&[1, 4, 0, 0, 0, 7]));
}

#[test]
fn each_request_waits_for_the_gap_after_the_last_byte_on_the_line() {
    let write_echo = frame(&[1, 6, 0, 3, 0, 0b1011]);
    let (mut m, wire, _) = master(std::vec![ok(first_span_answer()), ok(write_echo)]);
    let mut out = [0u16; 16];
    m.read_inputs(&map::SPANS[0], &mut out).unwrap();
    let last_answer_byte = wire.borrow().incoming.len();
    assert_eq!(last_answer_byte, 0, "the whole answer was read");
    let answered_at = {
        let w = wire.borrow();
        // The answer's last byte: 3 ms after the request, 19 bytes at 520 µs.
        w.sent[0].0 + 3_000 + 18 * 520
    };
    m.write(map::VALVES_OPEN, &[0b1011]).unwrap();
    let w = wire.borrow();
    let second = w.sent[1].0;
    assert!(
        second >= answered_at + u64::from(gap_us(19_200)),
        "sent {} µs after the answer",
        second - answered_at
    );
    assert!(
        second < answered_at + u64::from(gap_us(19_200)) + 200,
        "no longer than the gap and one idle"
    );
    assert_eq!(w.sent[1].1, frame(&[1, 6, 0, 3, 0, 0b1011]));
}

#[test]
fn a_late_answer_is_discarded_before_the_next_request() {
    // The first request's answer comes 10 ms after the timeout; the next
    // request must not take it for its own.
    let late = Reply {
        after_us: Some(210_000),
        bytes: first_span_answer(),
    };
    let echo = frame(&[1, 6, 0, 5, 0, 7]);
    let (mut m, wire, _) = master(std::vec![late, ok(echo)]);
    let mut out = [0u16; 16];
    let e = m.read_inputs(&map::SPANS[0], &mut out).unwrap_err();
    assert!(matches!(e, RtuError::NoAnswer { got: 0, .. }), "{e:?}");
    m.write(map::HEARTBEAT, &[7]).unwrap();
    let w = wire.borrow();
    let late_end = w.sent[0].0 + 210_000 + 18 * 520;
    assert!(w.sent[1].0 >= late_end + u64::from(RESYNC_QUIET_US));
}

#[test]
fn an_answer_later_still_is_never_taken_for_the_next_ones() {
    let later = Reply {
        after_us: Some(260_000),
        bytes: first_span_answer(),
    };
    let echo = frame(&[1, 6, 0, 5, 0, 7]);
    let (mut m, _, _) = master(std::vec![later, ok(echo)]);
    let mut out = [0u16; 16];
    assert!(m.read_inputs(&map::SPANS[0], &mut out).is_err());
    let e = m.write(map::HEARTBEAT, &[7]).unwrap_err();
    assert!(
        matches!(
            e,
            RtuError::BadAnswer {
                why: Mismatch::Function(4),
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn an_exception_is_refused_with_the_register_named() {
    let (mut m, _, _) = master(std::vec![ok(frame(&[1, 0x86, 3]))]);
    let e = m.write(map::SUPPLY_SETPOINT, &[1000]).unwrap_err();
    assert!(matches!(e, RtuError::Refused { code: 3, .. }), "{e:?}");
    assert_eq!(
        std::format!("{e}"),
        "write supply_setpoint at holding 0 of unit 1: the CDU refused word 1000 with exception 3 (Illegal data value)"
    );
    // Both words of a two-word setting.
    let (mut m, _, _) = master(std::vec![ok(frame(&[1, 0x90, 3]))]);
    let e = m.write(&limit(), &[1, 34_464]).unwrap_err();
    assert_eq!(
        std::format!("{e}"),
        "write limit at holding 8 of unit 1: the CDU refused words 1, 34464 with exception 3 (Illegal data value)"
    );
    // A two-word write's echo of another count.
    let (mut m, _, _) = master(std::vec![ok(frame(&[1, 16, 0, 8, 0, 1]))]);
    let e = m.write(&limit(), &[1, 34_464]).unwrap_err();
    assert!(
        std::format!("{e}")
            .ends_with(": echo 1 registers at holding 8, written words 1, 34464 at holding 8"),
        "{e}"
    );
}

/// A two-word holding register (a power limit, W).
fn limit() -> map::Register {
    map::Register {
        name: "limit",
        kind: map::Kind::Holding,
        address: 8,
        ty: map::Type::U32,
        scale: 1.0,
        unit: "W",
        min: Some(0.0),
        max: Some(1e9),
        description: "",
    }
}

#[test]
fn a_corrupted_answer_is_a_crc_error_naming_the_span() {
    let mut bad = first_span_answer();
    bad[5] ^= 0x01;
    let (mut m, _, _) = master(std::vec![ok(bad)]);
    let mut out = [0u16; 16];
    let e = m.read_inputs(&map::SPANS[0], &mut out).unwrap_err();
    assert!(matches!(e, RtuError::Crc { .. }), "{e:?}");
    let text = std::format!("{e}");
    assert!(
        text.starts_with("read input 0-6 (supply_temp to leak_inputs) of unit 1: the answer's CRC"),
        "{text}"
    );
}

#[test]
fn silence_is_no_answer_after_the_timeout() {
    let (mut m, _, now) = master(std::vec![Reply {
        after_us: None,
        bytes: Vec::new()
    }]);
    let start = now.get();
    let e = m.write(map::PUMPS_RUN, &[1]).unwrap_err();
    assert_eq!(
        std::format!("{e}"),
        "write pumps_run at holding 4 of unit 1: no whole answer within 200 ms (0 bytes came)"
    );
    let waited = now.get() - start;
    assert!(
        (200_000..200_000 + 2_000 + 200).contains(&waited),
        "{waited}"
    );
}

#[test]
fn another_unit_or_function_is_a_bad_answer() {
    let (mut m, _, _) = master(std::vec![ok(frame(&[2, 6, 0, 4, 0, 1]))]);
    let e = m.write(map::PUMPS_RUN, &[1]).unwrap_err();
    assert!(
        matches!(
            e,
            RtuError::BadAnswer {
                why: Mismatch::Unit(2),
                ..
            }
        ),
        "{e:?}"
    );
    let (mut m, _, _) = master(std::vec![ok(frame(&[1, 3, 2, 0, 1]))]);
    let e = m.write(map::PUMPS_RUN, &[1]).unwrap_err();
    assert!(
        matches!(
            e,
            RtuError::BadAnswer {
                why: Mismatch::Function(3),
                ..
            }
        ),
        "{e:?}"
    );
    // An echo of another value: what came back is said beside what went.
    let (mut m, _, _) = master(std::vec![ok(frame(&[1, 6, 0, 4, 0, 2]))]);
    let e = m.write(map::PUMPS_RUN, &[1]).unwrap_err();
    assert!(
        matches!(
            e,
            RtuError::BadAnswer {
                why: Mismatch::Echo {
                    address: 4,
                    word: 2
                },
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        std::format!("{e}"),
        "write pumps_run at holding 4 of unit 1: echo word 2 at holding 4, written word 1 at holding 4"
    );
    // An echo of another register.
    let (mut m, _, _) = master(std::vec![ok(frame(&[1, 6, 0, 5, 0, 1]))]);
    let e = m.write(map::PUMPS_RUN, &[1]).unwrap_err();
    assert!(
        std::format!("{e}").ends_with(": echo word 1 at holding 5, written word 1 at holding 4"),
        "{e}"
    );
}

#[test]
fn a_two_word_setting_goes_as_function_16() {
    let reg = limit();
    let (mut m, wire, _) = master(std::vec![ok(frame(&[1, 16, 0, 8, 0, 2]))]);
    m.write(&reg, &[1, 0x86A0]).unwrap();
    assert_eq!(
        wire.borrow().sent[0].1,
        frame(&[1, 16, 0, 8, 0, 2, 4, 0, 1, 0x86, 0xA0])
    );
}

#[test]
fn no_wait_goes_past_the_deadline_and_an_answer_cut_by_it_says_so() {
    // The CDU answers after 60 ms; the step has 40 ms left when the
    // request goes.
    let slow = Reply {
        after_us: Some(60_000),
        bytes: frame(&[1, 6, 0, 5, 0, 7]),
    };
    let (mut m, wire, now) = master(std::vec![slow]);
    m.set_deadline(now.get() + 40_000);
    let e = m.write(map::HEARTBEAT, &[7]).unwrap_err();
    let sent = wire.borrow().sent[0].0;
    assert!(
        matches!(
            e,
            RtuError::NoAnswer {
                got: 0,
                cut: true,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(now.get() <= sent + 40_000 + 50, "waited past the deadline");
    let said = e.to_string();
    assert!(said.contains("when the step's time ran out"), "{said}");
    // The deadline passed: a silence is not waited for past it either,
    // and nothing is sent.
    let e = m.write(map::HEARTBEAT, &[8]).unwrap_err();
    assert!(matches!(e, RtuError::OutOfTime { .. }), "{e:?}");
    assert!(e.to_string().ends_with("not sent: the step's time ran out"));
    assert_eq!(wire.borrow().sent.len(), 1);
    // The next step, a period later: the late answer came meanwhile and
    // is let pass; the next request's answer is taken.
    now.set(now.get() + 200_000);
    let echo = frame(&[1, 6, 0, 5, 0, 9]);
    wire.borrow_mut().replies.push_back(ok(echo));
    m.set_deadline(now.get() + 800_000);
    m.write(map::HEARTBEAT, &[9]).unwrap();
}

#[test]
fn without_a_deadline_an_answer_is_waited_for_the_whole_timeout() {
    let (mut m, _, now) = master(std::vec![Reply {
        after_us: None,
        bytes: std::vec![],
    }]);
    let began = now.get();
    let e = m.write(map::HEARTBEAT, &[7]).unwrap_err();
    assert!(
        matches!(
            e,
            RtuError::NoAnswer {
                after_us: 200_000,
                cut: false,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!e.to_string().contains("step"), "{e}");
    assert!(now.get() >= began + 200_000);
}

#[test]
fn the_late_answer_of_a_cut_request_is_let_pass_before_the_next_step_asks() {
    // The write's echo comes 60 ms after it; the step ends 30 ms after
    // it, and the next step starts at once (the last one overran).
    let slow = Reply {
        after_us: Some(60_000),
        bytes: frame(&[1, 6, 0, 5, 0, 7]),
    };
    let (mut m, wire, now) = master(std::vec![slow, ok(first_span_answer())]);
    m.set_deadline(now.get() + 30_000);
    let e = m.write(map::HEARTBEAT, &[7]).unwrap_err();
    assert!(matches!(e, RtuError::NoAnswer { cut: true, .. }), "{e:?}");
    m.set_deadline(now.get() + 800_000);
    let mut out = [0u16; 16];
    assert_eq!(m.read_inputs(&map::SPANS[0], &mut out), Ok(7));
    assert_eq!(&out[..7], &[3012, 3850, 1923, 2700, 1, 0, 0b100]);
    let w = wire.borrow();
    assert!(
        w.sent[1].0 >= w.sent[0].0 + 200_000,
        "the read waited out the write's response timeout"
    );
}

#[test]
fn a_request_the_step_has_no_time_left_to_answer_is_not_sent() {
    let (mut m, wire, now) = master(std::vec![ok(frame(&[1, 6, 0, 5, 0, 7]))]);
    // Another talker on the line until 10 ms before the step's end: the
    // silence comes, but a request, 10 ms of turnaround and an echo
    // (16 bytes, 8.3 ms) no longer fit.
    let end = now.get() + 100_000;
    for (i, t) in (now.get()..end - 10_000).step_by(600).enumerate() {
        wire.borrow_mut().incoming.push_back((t, i as u8));
    }
    m.set_deadline(end);
    let e = m.write(map::HEARTBEAT, &[7]).unwrap_err();
    assert!(matches!(e, RtuError::OutOfTime { .. }), "{e:?}");
    assert!(wire.borrow().sent.is_empty());
    assert!(now.get() <= end, "waited past the step's end");
    // With the time, it goes.
    m.set_deadline(now.get() + 100_000);
    m.write(map::HEARTBEAT, &[7]).unwrap();
}

#[test]
fn after_a_stray_first_byte_the_answer_still_coming_is_not_read_as_the_next() {
    // A glitch on the line 1 ms after the write; its echo comes 60 ms
    // after it, when the next request would have been waiting for its own.
    let slow = Reply {
        after_us: Some(60_000),
        bytes: frame(&[1, 6, 0, 5, 0, 7]),
    };
    let (mut m, wire, now) = master(std::vec![slow, ok(frame(&[1, 6, 0, 5, 0, 8]))]);
    now.set(now.get() + 10_000);
    wire.borrow_mut()
        .incoming
        .push_back((now.get() + 1_000, 0x00));
    let e = m.write(map::HEARTBEAT, &[7]).unwrap_err();
    assert!(
        matches!(
            e,
            RtuError::BadAnswer {
                why: Mismatch::Unit(0),
                ..
            }
        ),
        "{e:?}"
    );
    m.write(map::HEARTBEAT, &[8]).unwrap();
    let w = wire.borrow();
    assert!(
        w.sent[1].0 >= w.sent[0].0 + 200_000,
        "waited out the first's timeout"
    );
}

#[test]
fn a_line_that_never_falls_silent_is_busy_even_when_the_step_ends_first() {
    let (mut m, wire, now) = master(std::vec![]);
    let end = now.get() + 100_000;
    for (i, t) in (now.get()..end + 50_000).step_by(600).enumerate() {
        wire.borrow_mut().incoming.push_back((t, i as u8));
    }
    m.set_deadline(end);
    let e = m.write(map::HEARTBEAT, &[7]).unwrap_err();
    assert!(matches!(e, RtuError::LineBusy { .. }), "{e:?}");
    assert!(wire.borrow().sent.is_empty());
}

/// A read's answer with `words` registers (its CRC right).
fn answer_of(words: usize) -> Vec<u8> {
    let mut body = std::vec![1, 4, (2 * words) as u8];
    for w in 0..words as u16 {
        body.extend_from_slice(&w.to_be_bytes());
    }
    frame(&body)
}

#[test]
fn a_read_answered_with_too_few_or_too_many_registers_is_the_wrong_length_at_once() {
    for words in [5, 9] {
        let (mut m, _, now) = master(std::vec![ok(answer_of(words))]);
        let start = now.get();
        let mut out = [0u16; 16];
        let e = m.read_inputs(&map::SPANS[0], &mut out).unwrap_err();
        assert!(
            matches!(
                e,
                RtuError::BadAnswer {
                    why: Mismatch::Length,
                    ..
                }
            ),
            "{words} registers: {e:?}"
        );
        assert!(
            std::format!("{e}").ends_with("the answer has the wrong length"),
            "{e}"
        );
        let waited = now.get() - start;
        assert!(waited < 20_000, "{words} registers: waited {waited} us");
    }
}

#[test]
fn a_read_back_asks_function_3_for_its_run_and_a_refusal_names_it() {
    let lead = crate::cdu::holding("lead_pump").unwrap();
    let pumps = crate::cdu::holding("pumps_run").unwrap();
    let refused = frame(&[1, 0x83, 2]);
    let (mut m, wire, _) = master(std::vec![
        ok(frame(&[1, 3, 6, 0, 0, 0, 11, 0, 1])),
        ok(refused)
    ]);
    let mut out = [0u16; 3];
    m.read_holding(lead, pumps, &mut out).unwrap();
    assert_eq!(out, [0, 11, 1]);
    assert_eq!(wire.borrow().sent[0].1, frame(&[1, 3, 0, 2, 0, 3]));
    let e = m.read_holding(lead, pumps, &mut out).unwrap_err();
    assert_eq!(
        std::format!("{e}"),
        "read back holding 2-4 (lead_pump to pumps_run) of unit 1: the CDU refused it with exception 2 (Illegal data address)"
    );
    let e = m.read_holding(lead, lead, &mut out[..1]).unwrap_err();
    assert!(
        std::format!("{e}")
            .starts_with("read back lead_pump at holding 2 of unit 1: no whole answer"),
        "{e}"
    );
}
