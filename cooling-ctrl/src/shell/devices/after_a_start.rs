//! After a start, the heartbeat waits for a read-back that proves every
//! safety setting the step wrote held, for at most the bound (the CDU's
//! heartbeat timeout, else 10 s): what a read-back found not held went
//! with the restart, so a controller restarted faster than the CDU's
//! heartbeat timeout would otherwise write one heartbeat per start to a
//! CDU that does not hold its valves or pumps, keeping it out of its
//! fallback. The first step's valve and pump writes go out at once; a
//! read-back that reads them held ends the wait at once; one refused
//! (any exception), unanswered or not asked proves nothing, and the
//! heartbeat goes out on the writes' echo once the bound is past, unless
//! a read-back found a setting not held.
use super::scripted::{
    beat, every_setting, measured, not_held, refused, run, started, step, unanswered, Script,
    Scripted,
};
use super::start::DEFAULT_BOUND_MS;
use super::*;
use crate::modbus::{CduError, ReadBack};
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

/// A CDU that echoes every write (but the setpoint's, unanswered where
/// `setpoint_unanswered`), records it, and answers each step's read-back
/// as `back` says.
struct Restarted {
    back: Back,
    setpoint_unanswered: bool,
    writes: Vec<Setting>,
}

impl Restarted {
    fn new(back: Back) -> Scripted<Self> {
        Scripted(Self {
            back,
            setpoint_unanswered: false,
            writes: Vec::new(),
        })
    }
}

impl Script for Restarted {
    fn write(&mut self, w: &Write) -> Result<(), CduError> {
        self.writes.push(w.setting);
        if self.setpoint_unanswered && w.setting == Setting::Setpoint {
            let op = "write supply_setpoint".to_string();
            return Err(CduError::NoAnswer { op, after_ms: 500 });
        }
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

/// One step of every setting through `d` at `ms` since the start, its
/// read-back answered as `back`: the outcome, whether its heartbeat was
/// written, and what the stats say of the heartbeat held back.
fn step_at(
    d: &mut Devices<Scripted<Restarted>>,
    ms: u64,
    back: Back,
) -> (Outcome, bool, Option<String>) {
    d.cdu.back = back;
    d.cdu.writes.clear();
    let mut stats = ShellStats::default();
    let o = run(d.write(&every_setting(), ms, &mut stats));
    let written = d.cdu.writes.contains(&Setting::Heartbeat);
    (o, written, stats.heartbeat_held)
}

/// A controller that starts again on a CDU whose fallback runs both
/// pumps: the first step writes the valves, the pumps and the lead pump
/// at once, but no heartbeat, nor does any step while a read-back has
/// found the pumps not held and none read them held since, the pumps
/// named; once a read-back reads them held, the heartbeat goes out from
/// the next step.
#[test]
fn after_a_start_the_first_heartbeat_waits_for_a_read_back_that_reads_the_safety_settings_held() {
    let mut d = Devices::new(Restarted::new(Back::PumpsNotHeld), None);
    let (o, written, said) = step_at(&mut d, 0, Back::PumpsNotHeld);
    assert_eq!(
        d.cdu.writes[..3],
        [Setting::Valves, Setting::PumpsRun, Setting::LeadPump],
        "the safety writes first, at once"
    );
    assert!(!written && !beat(&o) && o.heartbeat_held, "{o:?}");
    assert!(said.unwrap_or_default().starts_with(UNPROVEN));
    let why = failed_why(&o, Setting::Heartbeat);
    assert!(
        why.contains("not written: the safety settings not read back held since the start"),
        "{why}"
    );
    for (s, back) in [Back::PumpsNotHeld, Back::Unanswered, Back::Held]
        .into_iter()
        .enumerate()
    {
        let (o, written, said) = step_at(&mut d, 1000 * (s as u64 + 1), back);
        assert!(!written && o.heartbeat_held, "{back:?}: {o:?}");
        let said = said.unwrap_or_default();
        assert!(
            said.starts_with("the CDU does not hold a safety setting it echoed (pumps_run"),
            "{back:?}: {said}"
        );
    }
    // Read back held at the last step: the heartbeat from this one.
    let (o, written, said) = step_at(&mut d, 4000, Back::Held);
    assert!(written && beat(&o) && o.all_ok(), "{o:?}");
    assert!(!o.heartbeat_held && said.is_none(), "{said:?}");
}

/// A read-back that reads every safety setting held ends the wait at
/// once: the heartbeat from the next step, long before the bound.
#[test]
fn after_a_start_a_read_back_that_reads_the_settings_held_ends_the_wait_at_once() {
    let mut d = Devices::new(Restarted::new(Back::Held), None);
    let (_, written, said) = step_at(&mut d, 0, Back::Held);
    assert!(!written && said.is_some());
    let (o, written, said) = step_at(&mut d, 1000, Back::Held);
    assert!(written && beat(&o) && said.is_none(), "{o:?}");
}

/// A read-back that proves nothing (refused by any exception, 1 and 2
/// included, unanswered, or not asked after an unanswered setpoint
/// write) gets no heartbeat before the bound, its why said, and one from
/// the first step past it, on the writes' echo: a reset loop faster than
/// the bound never writes one unproven, a CDU that answers slowly or
/// refuses the read-back is not locked out.
#[test]
fn after_a_start_a_read_back_that_proves_nothing_waits_for_the_bound_then_the_heartbeat_goes() {
    let cases = [
        (Back::Refused(1), false, "refused: exception 1"),
        (Back::Refused(2), false, "refused: exception 2"),
        (Back::Refused(4), false, "refused: exception 4"),
        (Back::Refused(6), false, "refused: exception 6"),
        (Back::Unanswered, false, "unanswered"),
        (
            Back::Held,
            true,
            "not asked: the CDU did not answer the supply_setpoint write",
        ),
    ];
    for (back, setpoint_unanswered, why) in cases {
        let case = format!("{back:?}, setpoint unanswered {setpoint_unanswered}");
        let mut d =
            Devices::new(Restarted::new(back), None).start_bound(Some(Duration::from_secs(4)));
        d.cdu.setpoint_unanswered = setpoint_unanswered;
        let beats: Vec<bool> = (0..6)
            .map(|s| {
                let (_, written, said) = step_at(&mut d, s * 1000, back);
                if s > 0 && s < 4 {
                    let said = said.unwrap_or_default();
                    assert!(
                        said.starts_with(UNPROVEN) && said.contains(why) && said.contains("4 s"),
                        "{case}: step {s}: {said}"
                    );
                }
                written
            })
            .collect();
        assert_eq!(beats, [false, false, false, false, true, true], "{case}");
    }
    // Unbound, the bound is the CDU's usual heartbeat timeout.
    let mut d = Devices::new(Restarted::new(Back::Unanswered), None);
    step_at(&mut d, 0, Back::Unanswered);
    let before = step_at(&mut d, DEFAULT_BOUND_MS - 1, Back::Unanswered);
    let said_before = d.start.echo_said;
    let after = step_at(&mut d, DEFAULT_BOUND_MS, Back::Unanswered);
    assert_eq!((before.1, after.1), (false, true));
    assert_eq!((said_before, d.start.echo_said), (false, true));
}

/// A read-back that finds a safety setting not held keeps the heartbeat
/// withheld past the bound, until a read-back reads it held.
#[test]
fn after_a_start_a_setting_read_back_not_held_keeps_the_heartbeat_withheld_past_the_bound() {
    let mut d = Devices::new(Restarted::new(Back::PumpsNotHeld), None)
        .start_bound(Some(Duration::from_secs(2)));
    let beats: Vec<bool> = [Back::PumpsNotHeld, Back::Unanswered, Back::Refused(1)]
        .into_iter()
        .cycle()
        .take(9)
        .enumerate()
        .map(|(s, back)| {
            let written = step_at(&mut d, s as u64 * 1000, back).1;
            // Never said sent while it is withheld.
            assert!(!d.start.echo_said, "step {s}: heartbeat said sent");
            written
        })
        .collect();
    assert_eq!(beats, [false; 9]);
    let (_, held_now, _) = step_at(&mut d, 9000, Back::Held);
    let (_, next, _) = step_at(&mut d, 10_000, Back::Held);
    assert_eq!((held_now, next), (false, true));
}

/// Started on a CDU that holds what it takes: no heartbeat at the first
/// step, one at every step after, and the mode never names a heartbeat
/// held back. On one whose read-back goes unanswered: no heartbeat
/// before the bound, one from it on. On one that does not hold its pumps:
/// none, and once the boot's settling time is past the mode reads
/// degraded `heartbeat-held`.
#[test]
fn after_a_start_the_heartbeat_and_the_mode_follow_the_first_read_back() {
    for back in [Back::Held, Back::Unanswered, Back::PumpsNotHeld] {
        let (mut decider, mut d) = started(Restarted::new(back));
        let mut seen = Vec::new();
        for s in 0..20 {
            let (c, o) = step(&mut decider, &mut d, s, &measured(true, 0));
            seen.push((beat(&o), c.mode, c.reason));
        }
        let held = |s: &(bool, CduMode, ReasonCode)| s.2 == ReasonCode::HEARTBEAT_HELD;
        let last = seen[19];
        match back {
            Back::Held => {
                assert!(!seen[0].0 && seen[1..].iter().all(|s| s.0), "{seen:?}");
                assert!(!seen.iter().any(held), "{seen:?}");
                assert_eq!((last.1, last.2), (CduMode::Normal, ReasonCode::OK));
            }
            Back::Unanswered => {
                let bound = (DEFAULT_BOUND_MS / 1000) as usize;
                assert!(!seen[..bound].iter().any(|s| s.0), "{seen:?}");
                assert!(seen[bound..].iter().all(|s| s.0), "{seen:?}");
                assert!(!seen[bound + 1..].iter().any(held), "{seen:?}");
            }
            _ => {
                assert!(!seen.iter().any(|s| s.0), "{seen:?}");
                assert_eq!(
                    (last.1, last.2),
                    (CduMode::Degraded, ReasonCode::HEARTBEAT_HELD)
                );
            }
        }
    }
}

/// A CDU whose read-back goes unanswered gets no heartbeat before the
/// bound, and why is said: in the heartbeat's write failure, and in the
/// stats (`ctl status`' `HEARTBEAT HELD` row, the gauge) naming the
/// read-back unanswered; the wait said once in the log.
#[test]
fn after_a_start_a_cdu_whose_read_back_goes_unanswered_gets_no_heartbeat_and_says_why() {
    let mut d = Devices::new(Restarted::new(Back::Unanswered), None);
    for s in 0..5 {
        let (o, written, said) = step_at(&mut d, s * 1000, Back::Unanswered);
        assert!(!written && o.heartbeat_held, "step {s}: {o:?}");
        let said = said.unwrap_or_default();
        let why = if s == 0 {
            "none read back yet"
        } else {
            ": unanswered;"
        };
        assert!(
            said.starts_with(UNPROVEN) && said.contains(why) && said.contains("10 s after"),
            "step {s}: {said}"
        );
        let why = failed_why(&o, Setting::Heartbeat);
        assert!(why.contains("read back first"), "step {s}: {why}");
    }
}

/// The failure recorded for `s` in `o` (empty: none).
fn failed_why(o: &Outcome, s: Setting) -> String {
    let failed = o.tried.iter().find(|(t, _)| *t == s);
    let why = failed.and_then(|(_, r)| r.as_ref().err());
    why.map(|w| w.to_string()).unwrap_or_default()
}
