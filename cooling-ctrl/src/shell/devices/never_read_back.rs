//! A CDU that never answers the read-back after it took none of a
//! step's writes (the controller started while its link was down, or the
//! CDU restarted): its settings are reported not taken (the mode
//! degraded, the write failure counted and logged) until one is read back
//! held, but each is still taken on its echo where the decision path
//! acts on it: the lead pump's trip is judged and hands over to the lag,
//! and the valve word the CDU echoed is the one recorded.
use super::scripted::{measured, not_held, refused, started, step, unanswered, Script, Scripted};
use super::*;
use crate::modbus::{CduError, ReadBack};
use loopwarden_protocol::message::{Event, Pump};

/// A CDU that refuses every write of its first step (exception 4, a
/// device failure; the setpoint its last), echoes every write after, and
/// answers no read-back (or refuses it with exception 1: `not_served`).
#[derive(Default)]
struct NeverReadBack {
    setpoint_refused: bool,
    not_served: bool,
}

impl Script for NeverReadBack {
    fn write(&mut self, w: &Write) -> Result<(), CduError> {
        if self.setpoint_refused {
            return Ok(());
        }
        self.setpoint_refused = w.setting == Setting::Setpoint;
        Err(CduError::Refused {
            op: format!("write {}", w.setting.register()),
            code: 4,
            meaning: crate::modbus::exception_meaning(4),
        })
    }
    fn read_back(&mut self, written: &[Write]) -> ReadBack {
        let op = "read back holding 0-20";
        match self.not_served {
            false => unanswered(written, op),
            true => refused(written, op, 1),
        }
    }
}

/// Every setting refused at the first step, then echoed but never read
/// back: reported not taken (not `all`, the failure said), yet each taken
/// on its echo (the pumps, the setpoint, the speed, the valves). The lead
/// pump's contactor then reads open: the trip is judged and the lag
/// started.
#[test]
fn a_lead_trip_on_a_cdu_that_never_answers_the_read_back_starts_the_lag() {
    let (mut decider, mut d) = started(Scripted(NeverReadBack::default()));
    let mut s = 0;
    let (_, first) = step(&mut decider, &mut d, s, &measured(true, 0));
    assert!(!first.taken().pumps && !first.taken().all);
    for _ in 0..10 {
        s += 1;
        let (_, o) = step(&mut decider, &mut d, s, &measured(true, 0));
        let t = o.taken();
        assert!(t.pumps && t.setpoint && t.speed && t.valves, "{s}: {o:?}");
        assert!(!t.all, "{s}: not read back held since: {o:?}");
    }
    let said = d.write_error.0.as_deref().unwrap_or_default();
    assert!(said.contains("not read back since"), "{said}");
    let mut events = Vec::new();
    for _ in 0..10 {
        s += 1;
        let (c, _) = step(&mut decider, &mut d, s, &measured(false, 0));
        events.extend(c.events.iter().cloned());
        assert!(c.pump_on != [false; 2], "{s}: both pumps told to stop");
    }
    let trip = Event::PumpTrip {
        pump: Pump::A,
        lag_started: true,
    };
    assert!(events.contains(&trip), "{events:?}");
}

/// The same CDU: a leak's valve close the CDU echoes is the valve word
/// recorded, though no read-back reads it held.
#[test]
fn a_valve_close_echoed_but_never_read_back_is_the_word_taken() {
    let (mut decider, mut d) = started(Scripted(NeverReadBack::default()));
    for s in 0..3 {
        step(&mut decider, &mut d, s, &measured(true, 0));
    }
    let mut wet = measured(true, 0);
    wet.leaks = Some(0b0100);
    let (c, o) = step(&mut decider, &mut d, 3, &wet);
    assert_eq!(c.valves_open & 0b0100, 0, "rack 2 told to close");
    assert!(o.taken().valves && !o.taken().all, "{o:?}");
    assert_eq!(decider.valves_taken(), Some(c.valves_open));
}

/// A CDU that serves no read-back at all (exception 1) after its writes
/// were refused: their echo is taken, and reported taken, from the step
/// they go in.
#[test]
fn a_cdu_that_serves_no_read_back_has_its_echoes_taken_after_a_refusal() {
    let cdu = Scripted(NeverReadBack {
        not_served: true,
        ..NeverReadBack::default()
    });
    // A controller past its first read-back: the heartbeat goes out
    // with the writes that go in.
    let (mut decider, d) = started(cdu);
    let mut d = d.seen_held();
    let all: Vec<bool> = (0..3)
        .map(|s| step(&mut decider, &mut d, s, &measured(true, 0)).1)
        .map(|o| o.taken().all)
        .collect();
    assert_eq!(all, [false, true, true]);
    assert!(d.write_error.0.is_none(), "{:?}", d.write_error.0);
}

/// A CDU that echoes every write and reads back what it holds, but never
/// runs a handover: once the lead pump is written to B, the read-back
/// reads it (and the pumps to run) holding A's, and every read-back after
/// that goes unanswered.
/// With `speed_unanswered`, the pump speed's write goes unanswered once
/// that read-back was made (so no read-back is asked on those steps).
#[derive(Default)]
struct IgnoresHandover {
    lead_b: bool,
    refuted: bool,
    speed_unanswered: bool,
}

impl Script for IgnoresHandover {
    fn write(&mut self, w: &Write) -> Result<(), CduError> {
        if w.setting == Setting::LeadPump {
            self.lead_b |= w.value != 0.0;
        }
        if self.refuted && self.speed_unanswered && w.setting == Setting::PumpSpeed {
            let op = format!("write {}", w.setting.register());
            return Err(CduError::NoAnswer { op, after_ms: 500 });
        }
        Ok(())
    }
    fn read_back(&mut self, written: &[Write]) -> ReadBack {
        if !self.lead_b {
            return ReadBack::default();
        }
        let pumps = |w: &&Write| matches!(w.setting, Setting::LeadPump | Setting::PumpsRun);
        let settings: Vec<Setting> = written.iter().filter(pumps).map(|w| w.setting).collect();
        if !self.refuted && !settings.is_empty() {
            self.refuted = true;
            return not_held(settings, "lead_pump", 2, "word 0");
        }
        unanswered(written, "read back holding 0-20")
    }
}

/// Lead pump A trips; the CDU echoes "B to run and lead" but runs
/// neither, a read-back reads that, and no read-back answers after it.
/// The pumps stay not taken over the unanswered read-backs, so B, never
/// started, is not judged tripped (both pumps out of service), and the
/// heartbeat stays held back: the CDU falls back to its own control.
/// Alike when a later write goes unanswered, so no read-back is asked.
#[test]
fn a_handover_read_back_not_held_is_not_taken_over_read_backs_that_fail() {
    handover_not_held(false);
    handover_not_held(true);
}

fn handover_not_held(speed_unanswered: bool) {
    let cdu = Scripted(IgnoresHandover {
        speed_unanswered,
        ..IgnoresHandover::default()
    });
    let (mut decider, mut d) = started(cdu);
    for s in 0..3 {
        step(&mut decider, &mut d, s, &measured(true, 0));
    }
    let mut events = Vec::new();
    let mut refuted_steps = 0;
    for s in 3..30 {
        let (c, o) = step(&mut decider, &mut d, s, &measured(false, 0));
        events.extend(c.events.iter().cloned());
        if d.cdu.refuted {
            refuted_steps += 1;
            assert!(!o.taken().pumps, "{s}: pumps taken on their echo: {o:?}");
        }
    }
    assert!(refuted_steps > 10, "the handover was read back not held");
    let a = Event::PumpTrip {
        pump: Pump::A,
        lag_started: true,
    };
    assert!(events.contains(&a), "{events:?}");
    let b_tripped = |e: &Event| matches!(e, Event::PumpTrip { pump: Pump::B, .. });
    assert!(!events.iter().any(b_tripped), "{events:?}");
    let said = d.write_error.0.as_deref().unwrap_or_default();
    let first = if speed_unanswered {
        "no answer"
    } else {
        "last read back not held"
    };
    assert!(said.contains(first), "{said}");
}
