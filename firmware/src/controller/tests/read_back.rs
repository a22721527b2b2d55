//! The read-back's verdict through the decision path: a pump handover
//! the CDU echoed but never ran, then a read-back that fails.

use std::collections::BTreeMap;
use std::string::String;
use std::vec::Vec;

use super::*;
use crate::map::Register;
use crate::read_back::{HoldingPort, SafetyHeld};
use crate::rtu::{Op, OpKind, RtuError};
use crate::writes::SettingPort;

/// A CDU that echoes every write, holds those not `ignored`, and answers
/// the read-back unless `silent`. With a `watchdog` (its cycles), its
/// fallback runs from the watchdog's end to the next heartbeat written,
/// writing both pumps into the pumps to run at each of its cycles
/// ([`Echoes::cycle`]).
#[derive(Default)]
struct Echoes {
    holding: BTreeMap<u16, u16>,
    ignored: Vec<&'static str>,
    silent: bool,
    watchdog: Option<u32>,
    since_beat: u32,
    fallback: bool,
}

impl Echoes {
    /// One of the CDU's own cycles, between the controller's steps.
    fn cycle(&mut self) {
        let Some(watchdog) = self.watchdog else {
            return;
        };
        self.since_beat += 1;
        self.fallback |= self.since_beat > watchdog;
        if self.fallback {
            self.holding.insert(pumps_run_at(), 0b11);
        }
    }
}

impl SettingPort for Echoes {
    type Error = String;
    fn write(&mut self, r: &Register, words: &[u16]) -> Result<(), String> {
        if r.name == "heartbeat" {
            (self.since_beat, self.fallback) = (0, false);
        }
        if !self.ignored.contains(&r.name) {
            for (i, w) in words.iter().enumerate() {
                self.holding.insert(r.address + i as u16, *w);
            }
        }
        Ok(())
    }
    fn was_sent(_: &String) -> bool {
        false
    }
    fn time_left(&mut self) -> bool {
        true
    }
}

impl HoldingPort for Echoes {
    fn read_holding(
        &mut self,
        first: &Register,
        last: &Register,
        out: &mut [u16],
    ) -> Result<(), RtuError> {
        if self.silent {
            let op = Op {
                kind: OpKind::ReadHolding,
                unit: 1,
                address: first.address,
                count: out.len() as u16,
                first: first.name,
                last: last.name,
                sent: [0; 2],
            };
            return Err(RtuError::NoAnswer {
                op,
                after_us: 200_000,
                got: 0,
                cut: false,
            });
        }
        for (i, w) in out.iter_mut().enumerate() {
            *w = (self.holding.get(&(first.address + i as u16)).copied()).unwrap_or(0);
        }
        Ok(())
    }
}

/// The holding register of the pumps to run.
fn pumps_run_at() -> u16 {
    crate::cdu::holding("pumps_run").unwrap().address
}

/// The CDU's side of a run: the board, what its read-back found, and
/// the console the read-back's failures are said on.
#[derive(Default)]
struct Rig {
    board: Echoes,
    held: SafetyHeld,
    console: String,
}

/// The rest of step `s` after its decision, as the board runs it: the
/// latched record kept, the plan written to the CDU and read back
/// ([`Controller::write_and_read_back`]), what the read-back found said,
/// the outcome heard back and the status reported. Whether the heartbeat
/// went in.
fn write_back(c: &mut Controller<'_>, p: &mut Fake, r: &mut Rig, s: u64) -> bool {
    if c.to_keep(p).is_some() {
        c.kept(p, true);
    }
    let plan = c.plan(p);
    let (o, change) = c.write_and_read_back(&mut r.board, &plan, &mut r.held, &mut r.console);
    if let Some(change) = change {
        c.read_back_changed(p, &change);
    }
    let beat = (o.tried.iter()).any(|(s, r)| *s == Setting::Heartbeat && r.is_ok());
    c.written(p, o);
    c.report(p, s * 1000, true);
    beat
}

/// Lead pump A trips at 10 s; the CDU echoes "B to run and lead" but
/// runs neither, and once the read-back has found that, it answers no
/// read-back. B, which the CDU never started, is not judged tripped (so
/// not both pumps are taken out of service), and the heartbeat stays
/// withheld, so the CDU falls back to its own control.
#[test]
fn a_pump_handover_the_cdu_echoed_but_never_ran_is_not_judged_a_trip_when_its_read_back_fails() {
    booted(|c, p| {
        let mut r = Rig::default();
        let mut found_not_held = false;
        for s in 0..40u64 {
            let mut m = cdu(0b1111, 0);
            if s >= 10 {
                m.pumps_running = [Some(false), Some(false)];
                m.pump_faults = [Some(true), Some(false)];
                r.board.ignored = std::vec!["pumps_run", "lead_pump"];
            }
            found_not_held |= r.held.withholds();
            r.board.silent = found_not_held;
            c.step(p, Some(m), s * 1000);
            write_back(c, p, &mut r, s);
        }
        assert!(found_not_held, "the handover read back not held");
        let faults = c.decider().core().pump_faults();
        assert!(faults[0].is_some(), "A tripped");
        assert_eq!(faults[1], None, "B judged tripped: {}", r.console);
        assert!(r.held.withholds() && r.held.unread > 20);
    });
}

/// The CDU echoes the pumps' run flags but never takes them: from the
/// step after the read-back finds that, the mode is degraded
/// `heartbeat-held` (2016), as the Linux controller says it, never
/// `cdu-writes-refused` (which sends people to the CDU's panel).
#[test]
fn a_safety_setting_the_cdu_does_not_hold_degrades_the_mode_as_heartbeat_held_from_its_first_step()
{
    use loopwarden_protocol::ReasonCode;
    booted(|c, p| {
        let mut r = Rig::default();
        let mut found = None;
        let mut last = ReasonCode::OK;
        for s in 0..60u64 {
            if s == 45 {
                // It holds what it is told again.
                r.board.ignored = std::vec![];
            }
            if s == 30 {
                // It stops pump A on its own, and takes no run flag since.
                r.board.holding.remove(&pumps_run_at());
                r.board.ignored = std::vec!["pumps_run"];
            }
            c.step(p, Some(cdu(0b1111, 0)), s * 1000);
            let (_, reason, _) = c.decider().core().mode();
            if s == 30 {
                assert_eq!(reason, ReasonCode::OK, "settled before");
            }
            if found.is_some() && s <= 45 {
                let held = ReasonCode::HEARTBEAT_HELD;
                assert_eq!(reason, held, "step {s}: {}", r.console);
            }
            assert_ne!(
                reason,
                ReasonCode::CDU_WRITES_REFUSED,
                "step {s}: {}",
                r.console
            );
            last = reason;
            write_back(c, p, &mut r, s);
            if r.held.withholds() {
                found.get_or_insert(s);
            }
        }
        assert_eq!(found, Some(30), "not held found");
        assert!(!r.held.withholds(), "held again: {}", r.console);
        assert_eq!(
            last,
            ReasonCode::OK,
            "back to normal, never the refused writes"
        );
    });
}

/// The read-back fails from the start and is said to the gateway once;
/// the gateway starts again (its frames numbered from 0 again): the
/// next step says it again, for the restarted gateway's log, then no
/// more. So does a setting not held.
#[test]
fn a_failing_read_back_and_a_setting_not_held_are_said_again_to_a_restarted_gateway() {
    booted(|c, p| {
        let mut r = Rig::default();
        r.board.silent = true;
        let said = |p: &Fake, from: usize, what: &str| {
            (p.ups[from..].iter())
                .filter(|u| matches!(u, Up::Said { words, .. } if words.starts_with(what)))
                .count()
        };
        let run = |c: &mut Controller<'_>, p: &mut Fake, r: &mut Rig, s: u64, seq: u32| {
            hear_numbered(c, p, &alive(s), seq, s * 1000);
            c.step(p, Some(cdu(0b1111, 0)), s * 1000);
            write_back(c, p, r, s);
        };
        for s in 0..5u64 {
            run(c, p, &mut r, s, 10 + s as u32);
        }
        assert_eq!(said(p, 0, "read-back failing (no answer)"), 1, "once a run");
        let before = p.ups.len();
        for s in 5..8u64 {
            run(c, p, &mut r, s, (s - 5) as u32);
        }
        assert_eq!(c.link.restarts, 1);
        assert_eq!(
            said(p, before, "read-back failing (no answer)"),
            1,
            "said again once"
        );
        // A setting not held: said again to a gateway started again.
        r.board.silent = false;
        r.board.ignored = std::vec!["pumps_run"];
        r.board.holding.remove(&pumps_run_at());
        let before = p.ups.len();
        for s in 8..11u64 {
            run(c, p, &mut r, s, (s - 5) as u32);
        }
        assert_eq!(said(p, before, "heartbeat withheld"), 1);
        let before = p.ups.len();
        for s in 11..14u64 {
            run(c, p, &mut r, s, (s - 11) as u32);
        }
        assert_eq!(c.link.restarts, 2);
        assert_eq!(said(p, before, "heartbeat withheld"), 1, "said again once");
    });
}

/// The CDU holds no pumps to run for 6 steps: the heartbeat is withheld,
/// the CDU's watchdog runs out and its fallback writes both pumps into
/// the register at each of its cycles. Once it takes writes again, the
/// controller's pumps to run, written again each step, read back held:
/// the heartbeat goes out, the CDU leaves its fallback, and the mode
/// reads normal (as the Linux controller's
/// `shell::devices::fallback::a_cdu_whose_fallback_overwrites_the_pumps_gets_its_heartbeat_back`).
#[test]
fn a_cdu_whose_fallback_overwrites_the_pumps_gets_its_heartbeat_back() {
    use loopwarden_protocol::ReasonCode;
    booted(|c, p| {
        let mut r = Rig::default();
        r.board.watchdog = Some(3);
        let (mut fell_back, mut beat) = (false, false);
        for s in 0..40u64 {
            if s == 20 {
                r.board.holding.insert(pumps_run_at(), 0);
                r.board.ignored = std::vec!["pumps_run"];
            }
            if s == 26 {
                r.board.ignored = std::vec![];
            }
            r.board.cycle();
            fell_back |= r.board.fallback;
            c.step(p, Some(cdu(0b1111, 0)), s * 1000);
            beat = write_back(c, p, &mut r, s);
        }
        let console = &r.console;
        assert!(fell_back, "the CDU's watchdog ran out: {console}");
        assert!(
            beat && !r.board.fallback && !r.held.withholds(),
            "{console}"
        );
        let (_, reason, _) = c.decider().core().mode();
        assert_eq!(reason, ReasonCode::OK, "{console}");
    });
}
