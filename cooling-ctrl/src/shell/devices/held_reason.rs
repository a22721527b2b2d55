//! The mode's reason while the heartbeat is held back: one of its own
//! (`heartbeat-held`: the CDU runs on its own control, whatever its
//! panel says), not the refused writes' (`cdu-writes-refused`: a CDU in
//! local mode at its panel), unless a latched leak is the reason.
use super::scripted::{beat, measured, started, step, valves_not_held, Script, Scripted};
use super::*;
use crate::modbus::{CduError, ReadBack};
use loopwarden_protocol::message::{CduMode, Event};
use loopwarden_protocol::ReasonCode;

/// A CDU that echoes every write, refuses the setpoint with exception 3
/// (`refuses`), and whose read-back finds the valve word not held
/// (`drops_valves`).
struct Cdu {
    refuses: bool,
    drops_valves: bool,
}

impl Script for Cdu {
    fn write(&mut self, w: &Write) -> Result<(), CduError> {
        if self.refuses && w.setting == Setting::Setpoint {
            return Err(CduError::Refused {
                op: "write supply_setpoint at holding 0".into(),
                code: 3,
                meaning: crate::modbus::exception_meaning(3),
            });
        }
        Ok(())
    }
    fn read_back(&mut self, written: &[Write]) -> ReadBack {
        let valves = written.iter().any(|w| w.setting == Setting::Valves);
        if !(self.drops_valves && valves) {
            return ReadBack::default();
        }
        valves_not_held()
    }
}

/// The mode and its reason after 20 steps against `cdu`, rack 1 leaking
/// from the 10th (`leak`), and whether the last step's heartbeat was
/// held back.
fn after(cdu: Cdu, leak: bool) -> (CduMode, ReasonCode, bool) {
    let (mut decider, mut d) = started(Scripted(cdu));
    let mut last = None;
    for s in 0..20 {
        // Rack 1's valve reads closed from the step after its leak.
        let mut m = measured(true, u16::from(leak && s > 10) << 1);
        m.leaks = Some(u16::from(leak && s >= 10) << 1);
        let (c, o) = step(&mut decider, &mut d, s, &m);
        last = Some((c.mode, c.reason, !beat(&o)));
    }
    last.expect("20 steps")
}

#[test]
fn a_heartbeat_held_back_has_a_reason_of_its_own_under_no_leak() {
    let refused = after(
        Cdu {
            refuses: true,
            drops_valves: false,
        },
        false,
    );
    assert_eq!(
        refused,
        (CduMode::Degraded, ReasonCode::CDU_WRITES_REFUSED, false)
    );
    let held = Cdu {
        refuses: false,
        drops_valves: true,
    };
    let (mode, reason, beat_held) = after(held, false);
    assert!(beat_held);
    assert_eq!(mode, CduMode::Degraded);
    assert_ne!(
        reason, refused.1,
        "a held heartbeat is no refusal at the panel"
    );
    assert_eq!(reason.name(), Some("heartbeat-held"));
    let leaking = Cdu {
        refuses: false,
        drops_valves: true,
    };
    assert_eq!(
        after(leaking, true),
        (CduMode::Degraded, ReasonCode::LEAK, true)
    );
}

/// The mode's change when a read-back first finds the valve word not
/// held, after the CDU ran normally, names the held heartbeat, never the
/// refused writes: the step that found it says the heartbeat is held
/// from the next one on; and once read back held, the mode goes back to
/// normal without the refused writes said on the way (the step that read
/// it held still held the heartbeat back).
#[test]
fn the_mode_change_of_a_heartbeat_held_back_names_it_from_its_first_step() {
    let cdu = Cdu {
        refuses: false,
        drops_valves: false,
    };
    let (mut decider, mut d) = started(Scripted(cdu));
    let mut changes = Vec::new();
    let mut reasons = Vec::new();
    for s in 0..60 {
        d.cdu.drops_valves = (20..40).contains(&s);
        let (c, _) = step(&mut decider, &mut d, s, &measured(true, 0));
        let changed = |e: &&Event| matches!(e, Event::CduModeChanged { .. });
        changes.extend(c.events.iter().filter(changed).cloned());
        reasons.push(c.reason);
    }
    let held = Event::CduModeChanged {
        from: CduMode::Normal,
        to: CduMode::Degraded,
        reason: ReasonCode::HEARTBEAT_HELD,
    };
    assert_eq!(changes.get(1), Some(&held), "{changes:?}");
    // Held again once read back held: back to normal, never said as the
    // refused writes on the way.
    assert!(
        !reasons.contains(&ReasonCode::CDU_WRITES_REFUSED),
        "{reasons:?}"
    );
    assert_eq!(changes.last().map(|_| reasons[59]), Some(ReasonCode::OK));
}
