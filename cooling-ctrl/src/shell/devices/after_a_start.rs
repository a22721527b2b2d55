//! After a start, the heartbeat waits for a read-back that reads the
//! safety settings held: what a read-back found not held went with the
//! restart, so a controller restarted faster than the CDU's watchdog
//! would otherwise write one heartbeat per start to a CDU that does not
//! hold its valves or pumps, keeping it out of its fallback. The first
//! step's valve and pump writes go out at once; a CDU that refuses the
//! read-back outright (exception 1 or 2) gets the heartbeat from the
//! next step; one whose read-back goes unanswered gets none, and why is
//! said.
use super::scripted::{
    beat, every_setting, measured, not_held, refused, run, started, step, unanswered, Script,
    Scripted,
};
use super::*;
use crate::modbus::ReadBack;
use loopwarden_protocol::message::CduMode;
use loopwarden_protocol::ReasonCode;

/// How a [`Restarted`] CDU answers a step's read-back.
#[derive(Clone, Copy, Debug)]
enum Back {
    /// Every setting held.
    Held,
    /// The pumps to run held at another value (its fallback runs both).
    PumpsNotHeld,
    /// No answer in 500 ms.
    Unanswered,
    /// Refused with this exception.
    Refused(u8),
}

/// A CDU that echoes every write, records it, and answers each step's
/// read-back as `back` says.
struct Restarted {
    back: Back,
    writes: Vec<Setting>,
}

impl Restarted {
    fn new(back: Back) -> Scripted<Self> {
        Scripted(Self {
            back,
            writes: Vec::new(),
        })
    }
}

impl Script for Restarted {
    fn write(&mut self, w: &Write) -> Result<(), crate::modbus::CduError> {
        self.writes.push(w.setting);
        Ok(())
    }
    fn read_back(&mut self, written: &[Write]) -> ReadBack {
        let op = "read back holding 0-5";
        match self.back {
            Back::Held => ReadBack::default(),
            Back::PumpsNotHeld => not_held(vec![Setting::PumpsRun], "pumps_run", 1, "value 3"),
            Back::Unanswered => unanswered(written, op),
            Back::Refused(code) => refused(written, op, code),
        }
    }
}

/// One step of every setting through `d`, its read-back answered as
/// `back`: the outcome, whether its heartbeat was written, and what the
/// stats say of the heartbeat held back.
fn step_as(d: &mut Devices<Scripted<Restarted>>, back: Back) -> (Outcome, bool, Option<String>) {
    d.cdu.back = back;
    d.cdu.writes.clear();
    let mut stats = ShellStats::default();
    let o = run(d.write(&every_setting(), &mut stats));
    let written = d.cdu.writes.contains(&Setting::Heartbeat);
    (o, written, stats.heartbeat_held)
}

/// A controller that starts again on a CDU whose fallback runs both
/// pumps: the first step writes the valves, the pumps and the lead pump
/// at once, but no heartbeat, nor does any step whose read-back finds
/// them not held or goes unanswered; once a read-back reads them held,
/// the heartbeat goes out from the next step.
#[test]
fn after_a_start_the_first_heartbeat_waits_for_a_read_back_that_reads_the_safety_settings_held() {
    let mut d = Devices::new(Restarted::new(Back::PumpsNotHeld), None);
    let (o, written, said) = step_as(&mut d, Back::PumpsNotHeld);
    assert_eq!(
        d.cdu.writes[..3],
        [Setting::Valves, Setting::PumpsRun, Setting::LeadPump],
        "the safety writes first, at once"
    );
    assert!(!written && !beat(&o) && o.heartbeat_held, "{o:?}");
    assert_eq!(said.as_deref(), Some(UNPROVEN));
    let why = failed_why(&o, Setting::Heartbeat);
    assert!(
        why.contains("not written: the safety settings not read back held since the start"),
        "{why}"
    );
    for back in [Back::PumpsNotHeld, Back::Unanswered, Back::Held] {
        let (o, written, said) = step_as(&mut d, back);
        assert!(!written && o.heartbeat_held, "{back:?}: {o:?}");
        // Found not held, it is named; else none read held yet.
        let said = said.unwrap_or_default();
        let named = said.contains("does not hold a safety setting it echoed (pumps_run");
        assert!(named || said.starts_with(UNPROVEN), "{back:?}: {said}");
    }
    // Read back held at the last step: the heartbeat from this one.
    let (o, written, said) = step_as(&mut d, Back::Held);
    assert!(written && beat(&o) && o.all_ok(), "{o:?}");
    assert!(!o.heartbeat_held && said.is_none(), "{said:?}");
}

/// Started on a CDU that holds what it takes: no heartbeat at the first
/// step, one at every step after, and the mode never names a heartbeat
/// held back. On one whose read-back goes unanswered: no heartbeat, and
/// once the boot's settling time is past the mode reads degraded
/// `heartbeat-held`.
#[test]
fn after_a_start_the_heartbeat_and_the_mode_follow_the_first_read_back() {
    for back in [Back::Held, Back::Unanswered] {
        let (mut decider, mut d) = started(Restarted::new(back));
        let mut seen = Vec::new();
        for s in 0..20 {
            let (c, o) = step(&mut decider, &mut d, s, &measured(true, 0));
            seen.push((beat(&o), c.mode, c.reason));
        }
        let held = |s: &(bool, CduMode, ReasonCode)| s.2 == ReasonCode::HEARTBEAT_HELD;
        let last = seen[19];
        if let Back::Held = back {
            assert!(!seen[0].0 && seen[1..].iter().all(|s| s.0), "{seen:?}");
            assert!(!seen.iter().any(held), "{seen:?}");
            assert_eq!((last.1, last.2), (CduMode::Normal, ReasonCode::OK));
        } else {
            assert!(!seen.iter().any(|s| s.0), "{seen:?}");
            assert_eq!(
                (last.1, last.2),
                (CduMode::Degraded, ReasonCode::HEARTBEAT_HELD)
            );
        }
    }
}

/// A CDU that refuses the read-back outright from the start (exception
/// 1 or 2: it serves none) has its echo taken as before: the heartbeat
/// from the second step. One refused otherwise (exception 4, 6) reads
/// nothing held: none.
#[test]
fn after_a_start_a_cdu_that_serves_no_read_back_gets_the_heartbeat_from_the_next_step() {
    for code in [1, 2, 4, 6] {
        let mut d = Devices::new(Restarted::new(Back::Refused(code)), None);
        let (o, written, _) = step_as(&mut d, Back::Refused(code));
        assert!(!written && o.heartbeat_held, "{code}: {o:?}");
        let (o, written, said) = step_as(&mut d, Back::Refused(code));
        let served = matches!(code, 1 | 2);
        assert_eq!(written, served, "{code}: {o:?}");
        assert_eq!(said.is_none(), served, "{code}: {said:?}");
    }
}

/// A CDU whose read-back goes unanswered never gets a heartbeat after a
/// start, and why is said: in the heartbeat's write failure, and in the
/// stats (`ctl status`' `HEARTBEAT HELD` row, the gauge) naming the
/// read-back not answered.
#[test]
fn after_a_start_a_cdu_whose_read_back_goes_unanswered_gets_no_heartbeat_and_says_why() {
    let mut d = Devices::new(Restarted::new(Back::Unanswered), None);
    for s in 0..5 {
        let (o, written, said) = step_as(&mut d, Back::Unanswered);
        assert!(!written && o.heartbeat_held, "step {s}: {o:?}");
        let said = said.unwrap_or_default();
        assert!(
            said.starts_with(UNPROVEN)
                && said.contains("not read back since")
                && said.contains("no answer"),
            "step {s}: {said}"
        );
        let why = failed_why(&o, Setting::Heartbeat);
        assert!(why.contains("read back first"), "step {s}: {why}");
    }
    assert_eq!(d.unproven.0.as_deref(), Some(UNPROVEN), "said once");
}

/// The failure recorded for `s` in `o` (empty: none).
fn failed_why(o: &Outcome, s: Setting) -> String {
    let failed = o.tried.iter().find(|(t, _)| *t == s);
    let why = failed.and_then(|(_, r)| r.as_ref().err());
    why.map(|w| w.to_string()).unwrap_or_default()
}
