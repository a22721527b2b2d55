//! An operator's clear heard from the gateway: checked by the gate,
//! its number kept in flash before it is acted on, acted on by the
//! decision path, and answered; refused while what it depends on (the
//! CDU's pump faults, the flash) is not known.

use super::*;
use crate::clears::Last;

fn answers(p: &Fake) -> Vec<(u32, Result<(), String>)> {
    (p.ups.iter())
        .filter_map(|u| match u {
            Up::Answer { id, outcome } => {
                Some((*id, outcome.clone().map_err(|e| e.as_str().to_string())))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_clear_is_checked_acted_on_and_answered() {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(Some("cdu1"), ring()), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::Nothing);
    let mut open = 0b1111;
    for s in 0..6 {
        let leaks = if s >= 2 { 0b0100 } else { 0 };
        let plan = step(&mut c, p, Some(cdu(open, leaks)), s);
        open = plan.value(Setting::Valves).map_or(open, |v| v as u16);
    }
    assert_eq!(c.decider().core().leaks_latched(), 0b0100);
    let clear = |id| Down::Clear(signed(id, "cdu1", NOW, ClearAction::Leak(2), SEED));
    // No wall clock yet: refused, the id not used up.
    assert!(hear(&mut c, p, &clear(1), 6_000).is_empty());
    hear(&mut c, p, &alive(6), 6_000);
    // Still wet: the decision path refuses it.
    let taken = hear(&mut c, p, &clear(1), 6_000);
    assert_eq!(taken.len(), 1);
    assert_eq!(c.decider().core().leaks_latched(), 0b0100);
    for s in 6..9 {
        let plan = step(&mut c, p, Some(cdu(open, 0)), s);
        open = plan.value(Setting::Valves).map_or(open, |v| v as u16);
    }
    let taken = hear(&mut c, p, &clear(2), 9_000);
    assert_eq!((taken[0].name, taken[0].id), ("jdoe", 2));
    assert_eq!(c.decider().core().leaks_latched(), 0);
    // The same clear again, and one forged.
    hear(&mut c, p, &clear(2), 9_100);
    let forged = Down::Clear(signed(3, "cdu1", NOW, ClearAction::Pump(Pump::A), [1; 32]));
    hear(&mut c, p, &forged, 9_200);
    let got = answers(p);
    assert_eq!(got.len(), 5, "{got:?}");
    assert!(got[0]
        .1
        .as_ref()
        .unwrap_err()
        .contains("wall clock is not known"));
    assert_eq!(got[1].0, 1);
    assert!(
        got[1]
            .1
            .as_ref()
            .unwrap_err()
            .starts_with("rack 2's leak: "),
        "{got:?}"
    );
    assert_eq!(got[2], (2, Ok(())));
    assert!(got[3].1.as_ref().unwrap_err().contains("a replay"));
    assert!(got[4]
        .1
        .as_ref()
        .unwrap_err()
        .contains("signature does not verify"));
    assert!(p.ups.iter().any(|u| matches!(
        u,
        Up::Event(Event::OperatorCleared { pump: None, operator, .. }) if operator.as_str() == "jdoe"
    )));
    // The valve reopens at the next step, and the run replays.
    let plan = step(&mut c, p, Some(cdu(open, 0)), 9);
    assert_eq!(valves(&plan) & 0b0100, 0b0100);
    let r = replay(&p.wire);
    assert!(r.all_match(), "{:?}", r.first_mismatch);
    assert_eq!(c.link.clears_refused, 3);
}

#[test]
fn a_clear_of_a_rack_with_no_latched_leak_is_refused_and_no_clear_is_said() {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(Some("cdu1"), ring()), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::Nothing);
    for s in 0..3 {
        step(&mut c, p, Some(cdu(0b1111, 0)), s);
    }
    hear(&mut c, p, &alive(3), 3_000);
    // Rack 2 counted from 1 for rack 1: nothing is latched, every rack dry.
    let clear = Down::Clear(signed(1, "cdu1", NOW, ClearAction::Leak(2), SEED));
    hear(&mut c, p, &clear, 3_000);
    let got = answers(p);
    assert_eq!(got.len(), 1, "{got:?}");
    let e = got[0].1.as_ref().unwrap_err();
    assert!(e.contains("no latched leak"), "{e}");
    assert!(!p
        .ups
        .iter()
        .any(|u| matches!(u, Up::Event(Event::OperatorCleared { .. }))));
}

#[test]
fn a_clear_whose_number_the_flash_does_not_keep_is_not_acted_on() {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(Some("cdu1"), ring()), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::Nothing);
    let mut open = 0b1111;
    for s in 0..8 {
        let leaks = if (2..5).contains(&s) { 0b0100 } else { 0 };
        let plan = step(&mut c, p, Some(cdu(open, leaks)), s);
        open = plan.value(Setting::Valves).map_or(open, |v| v as u16);
    }
    assert_eq!(c.decider().core().leaks_latched(), 0b0100);
    hear(&mut c, p, &alive(8), 8_000);
    let clear = |id| Down::Clear(signed(id, "cdu1", NOW, ClearAction::Leak(2), SEED));
    p.unkeepable = true;
    hear(&mut c, p, &clear(1), 8_000);
    assert_eq!(
        c.decider().core().leaks_latched(),
        0b0100,
        "not acted on before its number is kept"
    );
    assert_eq!(c.link.clears_refused, 1);
    assert!(p.said("clear 1 of jdoe refused: not acted on: its number could not be kept in flash"));
    // The operator's next clear too, while the number is not kept.
    p.unkeepable = false;
    hear(&mut c, p, &clear(2), 8_100);
    assert_eq!(c.decider().core().leaks_latched(), 0b0100);
    let got = answers(p);
    assert_eq!(
        got[0],
        (
            1,
            Err("not acted on: its number could not be kept in flash".to_string())
        )
    );
    assert!(
        got[1]
            .1
            .as_ref()
            .unwrap_err()
            .contains("1, could not be kept in flash"),
        "{got:?}"
    );
    assert!(!p
        .ups
        .iter()
        .any(|u| matches!(u, Up::Event(Event::OperatorCleared { .. }))));
    // The shell's retry kept it: the next clear is kept, then acted on.
    c.gate_mut().set(0, Last::Id(1));
    let taken = hear(&mut c, p, &clear(3), 8_200);
    assert_eq!((taken.len(), taken[0].id), (1, 3));
    assert_eq!(c.decider().core().leaks_latched(), 0);
    assert_eq!(answers(p)[2], (3, Ok(())));
    let r = replay(&p.wire);
    assert!(r.all_match(), "{:?}", r.first_mismatch);
}

#[test]
fn a_pump_clear_is_refused_while_the_cdus_pump_fault_is_not_read() {
    let latched = cooling_core::Latched {
        pumps: [Some(cooling_core::PumpFault::Tripped), None],
        lead: Pump::B,
        ..Default::default()
    };
    let read: Result<Option<LatchRecord>, &str> = Ok(Some(LatchRecord {
        generation: 1,
        latched,
    }));
    let mut d = decider(&read);
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(Some("cdu1"), ring()), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::of(&read));
    hear(&mut c, p, &alive(0), 0);
    let clear = |id| Down::Clear(signed(id, "cdu1", NOW, ClearAction::Pump(Pump::A), SEED));
    // A's fault shown, or not, with B running.
    let read_b = |a_fault: bool| {
        let mut m = cdu(0b1111, 0);
        m.pumps_running = [Some(false), Some(true)];
        m.pump_faults = [Some(a_fault), Some(false)];
        Some(m)
    };
    // Before the CDU ever answered, then while it is silent: refused.
    hear(&mut c, p, &clear(1), 0);
    step(&mut c, p, None, 0);
    hear(&mut c, p, &clear(2), 0);
    assert_eq!(c.decider().core().pumps_failed(), [true, false]);
    // Read, the fault shown: the decision path refuses it.
    step(&mut c, p, read_b(true), 1);
    hear(&mut c, p, &clear(3), 1_000);
    // Read clear, then silent again: refused.
    step(&mut c, p, read_b(false), 2);
    step(&mut c, p, None, 3);
    hear(&mut c, p, &clear(4), 3_000);
    assert_eq!(c.decider().core().pumps_failed(), [true, false]);
    // Refused before the decision path: 1, 2 and 4, not 3.
    assert_eq!(c.link.clears_refused, 3);
    // Read with the fault clear: taken.
    step(&mut c, p, read_b(false), 4);
    let taken = hear(&mut c, p, &clear(5), 4_000);
    assert_eq!((taken[0].name, taken[0].id), ("jdoe", 5));
    assert_eq!(c.decider().core().pumps_failed(), [false, false]);
    let got = answers(p);
    let ids: Vec<u32> = got.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [1, 2, 3, 4, 5]);
    for (id, outcome) in &got[..4] {
        let why = outcome.as_ref().unwrap_err();
        let unread = why.contains("the CDU's pump fault has not been read");
        assert_eq!(unread, *id != 3, "clear {id}: {why}");
        assert!(why.starts_with("pump A's fault: "), "clear {id}: {why}");
    }
    assert_eq!(got[4], (5, Ok(())));
    let r = replay(&p.wire);
    assert!(r.all_match(), "{:?}", r.first_mismatch);
}

/// Bytes already on the line, read one by one.
struct Line(std::collections::VecDeque<u8>);

impl embedded_hal_nb::serial::ErrorType for Line {
    type Error = embedded_hal_nb::serial::ErrorKind;
}

impl embedded_hal_nb::serial::Read<u8> for Line {
    fn read(&mut self) -> embedded_hal_nb::nb::Result<u8, Self::Error> {
        self.0
            .pop_front()
            .ok_or(embedded_hal_nb::nb::Error::WouldBlock)
    }
}

#[test]
fn of_clears_back_to_back_the_first_is_checked_and_the_others_answered_to_send_again() {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(Some("cdu1"), ring()), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::Nothing);
    hear(&mut c, p, &alive(1), 1_000);
    let mut bytes = std::collections::VecDeque::new();
    for id in 1..=3 {
        let clear = Down::Clear(signed(id, "cdu1", NOW, ClearAction::Leak(2), SEED));
        bytes.extend(bytes_of(&clear, p.seq));
        p.seq = p.seq.wrapping_add(1);
    }
    bytes.extend(bytes_of(&alive(2), p.seq));
    p.seq = p.seq.wrapping_add(1);
    let mut line = Line(bytes);
    c.hear(p, &mut line, 1_000);
    assert!(line.0.is_empty(), "the whole line read in one call");
    assert_eq!(p.kept.len(), 1, "one number kept: {:?}", p.kept);
    let got = answers(p);
    assert_eq!(got.iter().map(|a| a.0).collect::<Vec<_>>(), [1, 2, 3]);
    for (_, r) in &got[1..] {
        assert_eq!(r.as_ref().unwrap_err(), crate::controller::down::AGAIN);
    }
    // Sent again, the second is checked: its number was not used up.
    hear(
        &mut c,
        p,
        &Down::Clear(signed(2, "cdu1", NOW, ClearAction::Leak(2), SEED)),
        1_100,
    );
    assert_eq!(p.kept.len(), 2);
}

#[test]
fn a_clear_heard_in_a_step_that_kept_a_number_already_is_answered_the_flash_is_busy() {
    // A step keeps one clear's number in flash at most: the number kept
    // again before its hearing, or a clear's heard (the watchdog's check
    // counts one).
    use crate::controller::StepKeep;
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(Some("cdu1"), ring()), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::Nothing);
    hear(&mut c, p, &alive(1), 1_000);
    let clear = Down::Clear(signed(1, "cdu1", NOW, ClearAction::Leak(2), SEED));
    let mut line = Line(bytes_of(&clear, p.seq).into_iter().collect());
    p.seq = p.seq.wrapping_add(1);
    c.hear_after_keep(p, &mut line, 1_000, StepKeep::Wrote);
    assert!(p.kept.is_empty(), "no number kept: {:?}", p.kept);
    let got = answers(p);
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].1.as_ref().unwrap_err(),
        crate::controller::down::BUSY
    );
    // Sent again while the step keeps none, it is checked and kept.
    let mut line = Line(bytes_of(&clear, p.seq).into_iter().collect());
    c.hear_after_keep(p, &mut line, 1_100, StepKeep::NoWrite);
    assert_eq!(p.kept.len(), 1);
}

#[test]
fn a_gateway_cannot_turn_the_wall_clock_back_to_make_a_held_clear_fresh() {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(Some("cdu1"), ring()), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::Nothing);
    let alive_at = |unix_ms| Down::Alive {
        unix_ms,
        bus: true,
        layout: layout(),
    };
    // An hour on, the gateway says it is the hour before, then hands
    // over a clear signed then.
    hear(&mut c, p, &alive_at(NOW + 3_600_000), 6_000);
    hear(&mut c, p, &alive_at(NOW), 7_000);
    hear(&mut c, p, &alive_at(NOW), 8_000);
    let clear = Down::Clear(signed(1, "cdu1", NOW, ClearAction::Pump(Pump::A), SEED));
    assert!(hear(&mut c, p, &clear, 8_000).is_empty());
    let got = answers(p);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0]
            .1
            .as_ref()
            .unwrap_err()
            .contains("a clear holds for 60 s"),
        "{got:?}"
    );
    let held = (p.lines.iter())
        .filter(|l| l.contains("wall clock went back"))
        .count();
    assert_eq!(held, 1, "said once, not each Alive: {:?}", p.lines);
}

/// The gateway's clock back less than twice the skew: the controller's
/// clock is held, yet a clear signed at the gateway's new time is within
/// the skew of it and taken, and the console says so; back 300 s, the
/// line says clears are refused for the 180 s past twice the skew at
/// the drift allowance: 180,000 s, 50 h.
#[test]
fn the_held_clock_s_line_says_refused_only_past_twice_the_skew() {
    let (taken, line) = clock_turned_back(100_000);
    assert!(taken);
    assert!(line.contains("went back 100 s"), "{line}");
    assert!(line.contains("still taken"), "{line}");
    assert!(!line.contains("refused as stale until"), "{line}");
    assert!(!line.contains("restart the board"), "{line}");
    let (taken, line) = clock_turned_back(300_000);
    assert!(!taken);
    assert!(line.contains("went back 300 s"), "{line}");
    assert!(
        line.contains("closes the 180 s past 120 s (about 50 h)"),
        "{line}"
    );
    assert!(line.contains("restart the board"), "{line}");
}

/// The gateway's wall clock told an hour ahead, then `back_ms` less, and
/// a clear signed at that time: whether it was taken, and the one line
/// said of the clock held back.
fn clock_turned_back(back_ms: u64) -> (bool, String) {
    let alive_at = |unix_ms| Down::Alive {
        unix_ms,
        bus: true,
        layout: layout(),
    };
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(Some("cdu1"), ring()), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::Nothing);
    hear(&mut c, p, &alive_at(NOW + 3_600_000), 6_000);
    let at = NOW + 3_600_000 - back_ms;
    hear(&mut c, p, &alive_at(at), 6_000);
    let clear = Down::Clear(signed(1, "cdu1", at, ClearAction::Pump(Pump::A), SEED));
    let taken = hear(&mut c, p, &clear, 6_000).len() == 1;
    let lines: Vec<String> = (p.lines.iter())
        .filter(|l| l.contains("wall clock went back"))
        .map(|l| l.to_string())
        .collect();
    assert_eq!(lines.len(), 1, "{:?}", p.lines);
    (taken, lines[0].clone())
}

/// The gateway's queue full of leases when a clear comes: it is acted
/// on, its answer held and sent at the next step, the event it could not
/// queue counted.
#[test]
fn a_clear_s_answer_the_queue_had_no_room_for_goes_at_the_next_step() {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(Some("cdu1"), ring()), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::Nothing);
    hear(&mut c, p, &alive(0), 0);
    let mut open = 0b1111;
    for s in 0..9 {
        let leaks = if (2..6).contains(&s) { 0b0100 } else { 0 };
        let plan = step(&mut c, p, Some(cdu(open, leaks)), s);
        open = plan.value(Setting::Valves).map_or(open, |v| v as u16);
    }
    assert_eq!(c.decider().core().leaks_latched(), 0b0100);
    p.gateway = Some(Box::new(FramedPort::new()));
    let lease = Up::Lease {
        host: 0,
        lease: cooling_decide::leases::cap_lease(
            1,
            loopwarden_protocol::ReasonCode::OK,
            300.0,
            LEASE_DEFAULT,
        ),
        lift: false,
    };
    let g = p.gateway.as_mut().unwrap();
    while g.send(&lease, &mut p.buf) == Ok(true) {}
    let dropped = c.link.up_dropped;
    let clear = Down::Clear(signed(1, "cdu1", NOW, ClearAction::Leak(2), SEED));
    assert_eq!(hear(&mut c, p, &clear, 9_000).len(), 1);
    assert_eq!(c.decider().core().leaks_latched(), 0, "acted on");
    assert!(answers(p).is_empty(), "no room for its answer");
    assert_eq!(c.link.up_dropped, dropped + 1, "its event counted");
    while p.gateway.as_mut().unwrap().queue.pop().is_some() {}
    step(&mut c, p, Some(cdu(open, 0)), 9);
    assert_eq!(answers(p), [(1, Ok(()))], "sent at the next step");
}

/// The answer to jdoe's clear `id` heard alone in a step whose settling
/// of the clears' numbers did `keep`, with `gate` set first; the numbers
/// the hearing kept.
fn heard_in_step(
    id: u32,
    keep: crate::controller::StepKeep,
    gate: impl FnOnce(&mut ClearGate),
) -> (Result<(), String>, usize) {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(Some("cdu1"), ring()), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::Nothing);
    hear(&mut c, p, &alive(1), 1_000);
    gate(c.gate_mut());
    let clear = Down::Clear(signed(id, "cdu1", NOW, ClearAction::Leak(2), SEED));
    let mut line = Line(bytes_of(&clear, p.seq).into_iter().collect());
    c.hear_after_keep(p, &mut line, 1_000, keep);
    let got = answers(p);
    assert_eq!(got.len(), 1, "{got:?}");
    (got[0].1.clone(), p.kept.len())
}

#[test]
fn a_clear_of_an_operator_whose_number_the_step_failed_to_keep_is_refused_until_it_is_kept() {
    use crate::controller::StepKeep;
    // jdoe's number 5 was not kept; the step's try failed again: jdoe's
    // next clear is told why, as between steps, not to send it again.
    let (answer, kept) = heard_in_step(6, StepKeep::of(1, true), |g| g.set(0, Last::Unkept(5)));
    let why = crate::clears::Refusal::LastUnkept {
        operator: loopwarden_protocol::Ident::new("jdoe").unwrap(),
        id: 5,
    };
    assert_eq!(answer.unwrap_err(), said_words(&why).as_str());
    assert_eq!(kept, 0);
}

#[test]
fn a_step_that_only_read_the_flash_keeps_a_clear_heard_in_it() {
    use crate::controller::StepKeep;
    // Every slot read again and unreadable (an error, nothing written):
    // the step's write is not spent, and the gate's own answer stands.
    assert_eq!(StepKeep::of(0, false), StepKeep::NoWrite);
    assert_eq!(StepKeep::of(0, true), StepKeep::NoWrite);
    let (answer, kept) = heard_in_step(1, StepKeep::of(0, false), |_| {});
    // Taken, its number kept, and acted on: no latched leak to clear.
    assert!(answer.unwrap_err().starts_with("rack 2's leak: "));
    assert_eq!(kept, 1);
    let (answer, kept) = heard_in_step(1, StepKeep::of(0, false), |g| g.set(0, Last::Unread));
    assert!(answer.unwrap_err().contains("could not be read from flash"));
    assert_eq!(kept, 0);
}

#[test]
fn a_clear_heard_in_a_step_whose_keep_failed_is_told_the_flash_fails() {
    use crate::controller::{down, StepKeep};
    assert_eq!(StepKeep::of(1, false), StepKeep::Wrote);
    assert_eq!(StepKeep::of(1, true), StepKeep::Failed);
    // asmith's number keeps failing to be kept; jdoe's clear, fine by
    // every check, is not acted on, and told why.
    let (answer, kept) = heard_in_step(3, StepKeep::of(1, true), |g| g.set(1, Last::Unkept(9)));
    assert_eq!(answer.unwrap_err(), down::FLASH_FAILING);
    // Both answers go whole to the operator's `ctl`.
    for why in [down::BUSY, down::FLASH_FAILING] {
        assert_eq!(said_words(&why).as_str(), why);
    }
    assert_eq!(kept, 0);
    // A replay is a replay, whatever the step wrote.
    let (answer, _) = heard_in_step(3, StepKeep::Wrote, |g| g.set(0, Last::Id(3)));
    assert!(answer.unwrap_err().contains("a replay"));
}

#[test]
fn a_pump_clear_whose_fault_flag_went_unread_in_a_partial_read_is_refused_naming_the_read() {
    let latched = cooling_core::Latched {
        pumps: [Some(cooling_core::PumpFault::Tripped); 2],
        ..Default::default()
    };
    let read: Result<Option<LatchRecord>, &str> = Ok(Some(LatchRecord {
        generation: 1,
        latched,
    }));
    let mut d = decider(&read);
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(Some("cdu1"), ring()), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::of(&read));
    hear(&mut c, p, &alive(0), 0);
    let clear = |id, pump| Down::Clear(signed(id, "cdu1", NOW, ClearAction::Pump(pump), SEED));
    // A read in part: the CDU answered, but pump A's fault flag read no
    // value (its request failed), B's read clear.
    let mut m = cdu(0b1111, 0);
    m.pump_faults = [None, Some(false)];
    step(&mut c, p, Some(m), 1);
    assert_eq!(c.decider().core().pumps_failed(), [true, true]);
    hear(&mut c, p, &clear(1, Pump::A), 1_000);
    hear(&mut c, p, &clear(2, Pump::B), 1_000);
    // A stays out of service: whether the CDU still shows its fault is
    // unknown. B, read clear, is back.
    assert_eq!(c.decider().core().pumps_failed(), [true, false]);
    assert_eq!(c.link.clears_refused, 1);
    let got = answers(p);
    assert_eq!(got.len(), 2, "{got:?}");
    // Answered within an answer's words, said whole on the console,
    // naming the request that holds the flag.
    let why = got[0].1.as_ref().unwrap_err();
    assert_eq!(got[0].0, 1);
    let unread = "pump A's fault: not cleared: pump_a_fault was not read this step: its read \
                  request failed or was not asked";
    assert!(why.starts_with(unread), "{why}");
    let line = (p.lines.iter())
        .find(|l| l.starts_with("clear 1 of jdoe: "))
        .expect("said");
    assert!(
        line.contains(unread)
            && line.contains("the console's line for read input 10-20 says which")
            && line.ends_with("whether the CDU still shows the pump's fault is unknown"),
        "{line}"
    );
    assert_eq!(got[1], (2, Ok(())));
    let r = replay(&p.wire);
    assert!(r.all_match(), "{:?}", r.first_mismatch);
}
