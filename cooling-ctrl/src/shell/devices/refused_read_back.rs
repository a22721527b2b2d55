//! A CDU that answers the read-back, finds a safety setting not held,
//! then refuses every read-back after with exception 1 or 2: the setting
//! stays not held (the heartbeat held back, the pumps not taken) until a
//! read-back reads it held, and what is said names the refusal.
use super::scripted::{beat, measured, not_held, refused, started, step, Script, Scripted};
use super::*;
use crate::modbus::ReadBack;
use loopwarden_protocol::message::CduMode;
use loopwarden_protocol::ReasonCode;

/// A CDU that echoes every write; its read-back reads the pumps to run
/// not held while `unheld`, and is refused with exception `refuses`
/// (1 or 2) once set.
struct RefusesLater {
    unheld: bool,
    refuses: Option<u8>,
}

impl Script for RefusesLater {
    fn read_back(&mut self, written: &[Write]) -> ReadBack {
        if let Some(code) = self.refuses {
            return refused(written, "read back holding 0-2", code);
        }
        if !self.unheld || !written.iter().any(|w| w.setting == Setting::PumpsRun) {
            return ReadBack::default();
        }
        not_held(vec![Setting::PumpsRun], "pumps_run", 1, "value 0")
    }
}

/// The pumps to run read back not held at step 12; from step 13 every
/// read-back is refused (exception 1, then 2): the heartbeat stays held
/// back, the pumps not taken, the mode `heartbeat-held`, and the write
/// failure said names the refused read-back.
#[test]
fn a_setting_not_held_stays_not_held_over_read_backs_refused_by_exception() {
    for code in [1, 2] {
        let cdu = Scripted(RefusesLater {
            unheld: false,
            refuses: None,
        });
        let (mut decider, mut d) = started(cdu);
        for s in 0..30 {
            d.cdu.unheld = s == 12;
            d.cdu.refuses = (s >= 13).then_some(code);
            let (c, o) = step(&mut decider, &mut d, s, &measured(true, 0));
            if s < 13 {
                continue;
            }
            assert!(!beat(&o), "{code}: step {s}: the heartbeat written: {o:?}");
            assert!(!o.taken().pumps, "{code}: step {s}: pumps taken: {o:?}");
            assert_eq!(
                (c.mode, c.reason),
                (CduMode::Degraded, ReasonCode::HEARTBEAT_HELD),
                "{code}: step {s}"
            );
        }
        let said = d.write_error.0.as_deref().unwrap_or_default();
        assert!(said.contains("refuses the read-back"), "{code}: {said}");
        // What `ctl status` says of the heartbeat held back names the
        // refused read-back.
        let plan = decider.plan_last(Some(0)).expect("stepped");
        let mut stats = ShellStats::default();
        super::scripted::run(d.write(&plan, 0, &mut stats));
        let held = stats.heartbeat_held.unwrap_or_default();
        assert!(
            held.contains("pumps_run") && held.contains(&format!("exception {code}")),
            "{code}: {held}"
        );
    }
}
