//! Safety: the first layer, for leaks. A leak closes its rack's valve on
//! the step any working leak input fires, and stays latched until an
//! operator clears it with every input dry and supervised. Two inputs
//! watch each rack and either one latches: the board's rope (wet, and its
//! supervision line) and the CDU's own leak register; one that fails or
//! does not answer never masks the other. The valve must confirm closed
//! (its position read back) within `valve_confirm_ms`; if it does not, the
//! isolation has failed and the core escalates: both secondary pumps stop,
//! every host is capped to its minimum and told its cooling is lost, and
//! the alarm sounds, until the valve confirms closed for
//! `valve_confirm_ms` without a break or the leak is cleared; a rack
//! whose isolation failed escalates again at its first "open" read.
//! Leak sensing is supervised: a rope whose supervision line reports a
//! fault, a failed read of the board's inputs, or a rack without a rope is
//! "leak sensing lost" for that rack, never "dry". Valve position inputs
//! are supervised too: a valve commanded open that reads closed for
//! `valve_confirm_ms` has a lying input (a *feedback fault*); its "closed"
//! confirms nothing, so a leak behind it escalates. The pumps are in
//! [`super::pumps`], sensor supervision in [`super::sensors`].
//!
//! Glossary:
//! - *rope*: the leak-detection cable under a rack, read as a digital
//!   input (wet or dry) with a second supervision input from its
//!   controller (rope fault: cut or shorted).
//! - *CDU leak input*: the CDU's own leak register (its drip tray or its
//!   own rope), read over Modbus with its other measurements.
//! - *latched leak*: a rack whose leak input fired; its valve stays shut
//!   until an operator clears it.
//! - *unprotected rack*: a rack the site declared without a rope on the
//!   board (the CDU's own input, if it has one, still counts).
//! - *escalation*: what the core does when isolation fails (above).
//! - *feedback fault*: a valve position input that reads closed while the
//!   valve is commanded open.

use loopwarden_protocol::message::{Event, Sensor, SensorFault};
use loopwarden_protocol::RackIndex;

use super::latch::Latched;
use super::{bit, Log, MAX_RACKS};

/// What the leak inputs said this step: the board's ropes, and the CDU's
/// own leak register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeakInputs {
    /// Ropes reading wet, bit n = rack n.
    pub wet: u16,
    /// Ropes whose supervision line reports a fault (cut or shorted).
    pub rope_faults: u16,
    /// The board's input lines were read; `false`: the read failed and
    /// nothing is known of any rope this step.
    pub read_ok: bool,
    /// The CDU's own leak register, bit n = rack n; `None`: not read this
    /// step (the CDU did not answer, or its map has no leak register).
    pub cdu: Option<u16>,
}

impl LeakInputs {
    /// Every rope read, dry and supervised; the CDU's register not read.
    pub const DRY: Self = Self {
        wet: 0,
        rope_faults: 0,
        read_ok: true,
        cdu: None,
    };

    /// Ropes reading wet, supervised, read.
    pub fn wet(wet: u16) -> Self {
        Self { wet, ..Self::DRY }
    }

    /// Whether any input that answered reads rack `r` wet.
    pub fn reads_wet(&self, r: usize) -> bool {
        bit(self.wet_now(), r)
    }

    /// The racks any input that answered reads wet, bit n = rack n.
    pub fn wet_now(&self) -> u16 {
        (if self.read_ok { self.wet } else { 0 }) | self.cdu.unwrap_or(0)
    }
}

/// Leak latches, leak sensing and isolation.
#[derive(Debug, Clone)]
pub struct Safety {
    leaks_latched: u16,
    leaks_seen: u16,
    /// What each input read when it last answered: the ropes, the CDU.
    board_seen: u16,
    cdu_seen: u16,
    sensing_lost: u16,
    unconfirmed_since: [Option<u64>; MAX_RACKS],
    isolation_failed: u16,
    /// Per rack whose isolation failed: since when its valve confirms
    /// closed without a break.
    confirmed_since: [Option<u64>; MAX_RACKS],
    /// Latched racks whose isolation has failed since they latched.
    failed_before: u16,
    /// Per rack: since when its valve, commanded open, reads closed.
    closed_while_open_since: [Option<u64>; MAX_RACKS],
    feedback_faults: u16,
}

impl Default for Safety {
    fn default() -> Self {
        Self::new()
    }
}

/// Why a clear of a rack with neither a latched leak nor a failed
/// isolation is refused.
pub const NOT_LATCHED: &str = "the rack has no latched leak";

impl Safety {
    /// Nothing latched or seen.
    pub const fn new() -> Self {
        Self {
            leaks_latched: 0,
            leaks_seen: 0,
            board_seen: 0,
            cdu_seen: 0,
            sensing_lost: 0,
            unconfirmed_since: [None; MAX_RACKS],
            isolation_failed: 0,
            confirmed_since: [None; MAX_RACKS],
            failed_before: 0,
            closed_while_open_since: [None; MAX_RACKS],
            feedback_faults: 0,
        }
    }
}

fn rack_index(r: usize) -> Option<RackIndex> {
    RackIndex::new(r as u8)
}

impl Safety {
    /// Racks with a latched leak, bit n = rack n.
    pub fn leaks_latched(&self) -> u16 {
        self.leaks_latched
    }

    /// Racks whose leak sensing is lost by a fault (not counting racks
    /// declared unprotected).
    pub fn sensing_lost(&self) -> u16 {
        self.sensing_lost
    }

    /// Racks whose isolation failed.
    pub fn isolation_failed(&self) -> u16 {
        self.isolation_failed
    }

    /// Racks whose valve position input is not believed (a feedback
    /// fault), bit n = rack n.
    pub fn feedback_faults(&self) -> u16 {
        self.feedback_faults
    }

    /// The leak latches and the position inputs not believed of a
    /// restored state.
    pub fn restore(&mut self, l: &Latched, racks: usize) {
        let all = all_racks(racks);
        // A lying input found before the restart still confirms nothing.
        self.feedback_faults = l.feedback_faults & all;
        self.leaks_latched = l.leaks & all;
        self.isolation_failed = l.isolation_failed & self.leaks_latched;
        self.failed_before = self.isolation_failed;
        // A rope still wet at the start is not a new leak.
        self.leaks_seen = self.leaks_latched;
        self.board_seen = self.leaks_latched;
    }

    /// Latches the racks of `racks_closed` (bit n = rack n, of `racks`) as
    /// leaks in place: after an unreadable latched record, the racks whose
    /// valve the CDU reports closed. Nothing else the core holds changes.
    pub fn latch(&mut self, racks_closed: u16, racks: usize) {
        let add = racks_closed & all_racks(racks);
        self.leaks_latched |= add;
        // Latched without a leak seen: an input wet now is not news.
        self.leaks_seen |= add;
    }

    /// Clears rack `rack`'s latched leak (of `racks`); refused when it has
    /// none ([`NOT_LATCHED`]), while any
    /// input reads it wet, or read it wet when last heard (the CDU did not
    /// answer the last step, or no step has read the inputs since the
    /// start), or its sensing is lost (`unprotected` racks can only be
    /// cleared when the operator has seen them dry). An input not heard
    /// since it read wet is taken as still wet: a wet input the core has
    /// seen is no new leak, so a clear taken then would not latch it
    /// again, and the valve would reopen onto the leak.
    pub fn clear_leak(
        &mut self,
        rack: usize,
        racks: usize,
        leaks: &LeakInputs,
    ) -> Result<(), &'static str> {
        if rack >= racks {
            return Err("no such rack");
        }
        if !leaks.read_ok || bit(leaks.rope_faults, rack) || bit(self.sensing_lost, rack) {
            return Err("the rack's leak sensing is lost: it cannot be seen dry");
        }
        if leaks.reads_wet(rack) {
            return Err("the rack's leak input still reads wet");
        }
        if bit(self.board_seen | self.cdu_seen, rack) {
            return Err(
                "a leak input read the rack wet when last heard and has not read it dry since",
            );
        }
        // A clear that would do nothing (a rack numbered from 1 by
        // mistake, say) is no clear: the operator is told, not thanked.
        if !bit(self.leaks_latched | self.isolation_failed, rack) {
            return Err(NOT_LATCHED);
        }
        self.leaks_latched &= !(1 << rack);
        self.isolation_failed &= !(1 << rack);
        self.failed_before &= !(1 << rack);
        self.unconfirmed_since[rack] = None;
        self.confirmed_since[rack] = None;
        Ok(())
    }

    /// The leak inputs for `racks` racks, of which `unprotected` have no
    /// rope on the board: latches new leaks seen by any input that
    /// answered (an input that did not answer keeps what it last said),
    /// supervises the ropes and reports every change; returns the valves
    /// open.
    pub(crate) fn leaks(
        &mut self,
        inp: &LeakInputs,
        racks: usize,
        unprotected: u16,
        log: &mut Log,
    ) -> u16 {
        let all = all_racks(racks);
        let lost = if inp.read_ok {
            inp.rope_faults & !unprotected & all
        } else {
            !unprotected & all
        };
        for r in (0..racks).filter(|r| bit(lost ^ self.sensing_lost, *r)) {
            if let Some(rack) = rack_index(r) {
                log.push(Event::LeakSensing {
                    rack,
                    lost: bit(lost, r),
                });
            }
        }
        self.sensing_lost = lost;
        // A failed read says nothing of the ropes: what was seen stands.
        if inp.read_ok {
            self.board_seen = inp.wet & !unprotected & all;
        }
        if let Some(c) = inp.cdu {
            self.cdu_seen = c & all;
        }
        self.wet(self.board_seen | self.cdu_seen, racks, log);
        all & !self.leaks_latched
    }

    /// Latches the racks newly `wet` and reports every change.
    fn wet(&mut self, wet: u16, racks: usize, log: &mut Log) {
        for r in (0..racks).filter(|r| bit(wet ^ self.leaks_seen, *r)) {
            let active = bit(wet, r);
            if active {
                self.leaks_latched |= 1 << r;
            }
            if let Some(rack) = rack_index(r) {
                log.push(Event::Leak { rack, active });
            }
        }
        self.leaks_seen = wet;
    }

    /// Judges at `now` whether each latched rack's valve reads closed
    /// (`valves_closed`, `None`: no position was read) within `confirm_ms`;
    /// reports an isolation that fails or is restored. A failed isolation
    /// ends only once the valve has confirmed closed for `confirm_ms`
    /// without a break, and a rack whose isolation failed since it
    /// latched fails again at its first read of "open" (no read still
    /// gets `confirm_ms`): a bouncing limit switch never restarts the
    /// pumps onto the leak. True while any isolation has failed.
    pub(crate) fn isolation(
        &mut self,
        now: u64,
        valves_closed: Option<u16>,
        confirm_ms: u64,
        log: &mut Log,
    ) -> bool {
        for r in 0..MAX_RACKS {
            if !bit(self.leaks_latched, r) {
                self.unconfirmed_since[r] = None;
                self.confirmed_since[r] = None;
                self.failed_before &= !(1 << r);
                continue;
            }
            // A lying position input confirms nothing.
            let confirmed =
                valves_closed.is_some_and(|v| bit(v, r)) && !bit(self.feedback_faults, r);
            let reads_open = valves_closed.is_some_and(|v| !bit(v, r));
            let change = if bit(self.isolation_failed, r) {
                self.ended(r, now, confirmed, confirm_ms).then_some(false)
            } else {
                let read = (confirmed, reads_open);
                self.failed(r, now, read, confirm_ms).then_some(true)
            };
            if let Some(active) = change {
                self.isolation_failed ^= 1 << r;
                self.failed_before |= self.isolation_failed;
                if let Some(rack) = rack_index(r) {
                    log.push(Event::IsolationFailed { rack, active });
                }
            }
        }
        self.isolation_failed != 0
    }

    /// Rack `r`, its isolation not failed, fails it at `now`: not
    /// `confirmed` closed for `confirm_ms`, or at once where its valve
    /// `reads_open` and its isolation failed before since it latched.
    fn failed(
        &mut self,
        r: usize,
        now: u64,
        (confirmed, reads_open): (bool, bool),
        confirm_ms: u64,
    ) -> bool {
        let since = &mut self.unconfirmed_since[r];
        if confirmed {
            *since = None;
            return false;
        }
        let from = *since.get_or_insert(now);
        (reads_open && bit(self.failed_before, r)) || now.saturating_sub(from) >= confirm_ms
    }

    /// Rack `r`, its isolation failed, ends it at `now`: `confirmed`
    /// closed for `confirm_ms` without a break.
    fn ended(&mut self, r: usize, now: u64, confirmed: bool, confirm_ms: u64) -> bool {
        self.unconfirmed_since[r] = None;
        let since = &mut self.confirmed_since[r];
        if !confirmed {
            *since = None;
            return false;
        }
        let from = *since.get_or_insert(now);
        now.saturating_sub(from) >= confirm_ms
    }
}

impl Safety {
    /// Supervises the valve position inputs at `now`: each rack whose
    /// valve was commanded open (`commanded_open`, the last settings, which
    /// went in: `written`) and reads closed (`valves_closed`) for
    /// `confirm_ms` has a feedback fault, reported; it clears when the
    /// valve reads open while commanded open. Unknown positions judge
    /// nothing.
    pub(crate) fn feedback(
        &mut self,
        now: u64,
        commanded_open: u16,
        written: bool,
        valves_closed: Option<u16>,
        confirm_ms: u64,
        log: &mut Log,
    ) {
        let Some(closed) = valves_closed else {
            return;
        };
        for r in 0..MAX_RACKS {
            let since = &mut self.closed_while_open_since[r];
            let open = bit(commanded_open, r);
            if !(open && written) {
                *since = None;
                continue;
            }
            let fault = bit(self.feedback_faults, r);
            let change = if bit(closed, r) {
                let from = *since.get_or_insert(now);
                (!fault && now.saturating_sub(from) >= confirm_ms).then_some(true)
            } else {
                *since = None;
                fault.then_some(false)
            };
            if let Some(active) = change {
                self.feedback_faults ^= 1 << r;
                log.push(Event::SensorFault {
                    sensor: Sensor::ValvePosition,
                    rack: rack_index(r),
                    fault: if active {
                        SensorFault::Implausible
                    } else {
                        SensorFault::Cleared
                    },
                });
            }
        }
    }
}

/// Every rack of `racks`, bit n = rack n.
pub fn all_racks(racks: usize) -> u16 {
    ((1u32 << racks.min(16)) - 1) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_rope_or_a_failed_read_is_sensing_lost_never_dry() {
        let mut s = Safety::default();
        let mut log = Log::default();
        let cut = LeakInputs {
            rope_faults: 0b0001,
            ..LeakInputs::DRY
        };
        assert_eq!(s.leaks(&cut, 4, 0, &mut log), 0b1111);
        assert_eq!(s.sensing_lost(), 0b0001);
        let failed = LeakInputs {
            wet: 0,
            rope_faults: 0,
            read_ok: false,
            cdu: None,
        };
        s.leaks(&failed, 4, 0b1000, &mut log);
        assert_eq!(
            s.sensing_lost(),
            0b0111,
            "an unprotected rack is not lost by a fault"
        );
        assert_eq!(
            s.clear_leak(1, 4, &failed),
            Err("the rack's leak sensing is lost: it cannot be seen dry")
        );
        s.leaks(&LeakInputs::DRY, 4, 0b1000, &mut log);
        assert_eq!(s.sensing_lost(), 0);
        let ev: std::vec::Vec<_> = log.events.iter().cloned().collect();
        assert_eq!(ev.len(), 1 + 2 + 3, "{ev:?}");
    }

    #[test]
    fn a_valve_that_does_not_confirm_closed_escalates_and_a_confirmation_ends_it() {
        let mut s = Safety::default();
        let mut log = Log::default();
        assert_eq!(s.leaks(&LeakInputs::wet(0b0100), 4, 0, &mut log), 0b1011);
        for t in 0..5 {
            assert!(!s.isolation(t * 1000, Some(0), 5_000, &mut log), "{t}");
        }
        assert!(s.isolation(5_000, Some(0), 5_000, &mut log));
        assert_eq!(s.isolation_failed(), 0b0100);
        // Closed without a break for the confirmation time: it ends.
        for t in 6..11 {
            assert!(s.isolation(t * 1000, Some(0b0100), 5_000, &mut log), "{t}");
        }
        assert!(!s.isolation(11_000, Some(0b0100), 5_000, &mut log));
        let n = log
            .events
            .iter()
            .filter(|e| matches!(e, Event::IsolationFailed { .. }))
            .count();
        assert_eq!(n, 2);
        // A valve that confirms at once never escalates.
        let mut s = Safety::default();
        s.leaks(&LeakInputs::wet(0b0001), 4, 0, &mut log);
        for t in 0..20 {
            assert!(!s.isolation(t * 1000, Some(0b0001), 5_000, &mut log));
        }
    }

    /// A valve seized part-open whose limit switch bounces: its "closed"
    /// reads never hold for the confirmation time, so the escalation
    /// never ends on them, and an "open" read after one is at once an
    /// escalation again.
    #[test]
    fn a_bouncing_limit_switch_never_ends_an_escalation() {
        let mut s = Safety::default();
        let mut log = Log::default();
        s.leaks(&LeakInputs::wet(0b0001), 4, 0, &mut log);
        for t in 0..=5 {
            s.isolation(t * 1000, None, 5_000, &mut log);
        }
        assert_eq!(s.isolation_failed(), 0b0001);
        for t in 6..66 {
            let closed = (t / 2) % 2 == 1;
            let read = Some(u16::from(closed));
            let failed = s.isolation(t * 1000, read, 5_000, &mut log);
            if !closed {
                assert!(failed, "{t}: an open read after a failed isolation");
            }
        }
        // Closed without a break for the confirmation time: it ends.
        for t in 66..71 {
            assert!(s.isolation(t * 1000, Some(1), 5_000, &mut log), "{t}");
        }
        assert!(!s.isolation(71_000, Some(1), 5_000, &mut log));
        // The rack failed once: its next "open" escalates at once; no
        // read at all still gets the confirmation time.
        assert!(s.isolation(72_000, Some(0), 5_000, &mut log));
        for t in 73..78 {
            s.isolation(t * 1000, Some(1), 5_000, &mut log);
        }
        assert!(!s.isolation(78_000, None, 5_000, &mut log));
    }

    #[test]
    fn a_failed_board_read_never_masks_the_cdus_own_leak_input() {
        let mut s = Safety::default();
        let mut log = Log::default();
        let failed_board = LeakInputs {
            read_ok: false,
            cdu: Some(0b0001),
            ..LeakInputs::DRY
        };
        assert_eq!(s.leaks(&failed_board, 4, 0, &mut log), 0b1110);
        assert_eq!(s.leaks_latched(), 0b0001);
        assert_eq!(
            s.sensing_lost(),
            0b1111,
            "the ropes are still reported lost"
        );
        // A CDU that stops answering keeps what it last said.
        let silent = LeakInputs {
            cdu: None,
            ..failed_board
        };
        assert_eq!(s.leaks(&silent, 4, 0, &mut log), 0b1110);
        let leaks = log
            .events
            .iter()
            .filter(|e| matches!(e, Event::Leak { .. }))
            .count();
        assert_eq!(leaks, 1, "no leak reported cleared by a silent input");
        // Cleared only with every input dry.
        let wet_cdu = LeakInputs {
            cdu: Some(0b0001),
            ..LeakInputs::DRY
        };
        s.leaks(&wet_cdu, 4, 0, &mut log);
        assert_eq!(
            s.clear_leak(0, 4, &wet_cdu),
            Err("the rack's leak input still reads wet")
        );
    }

    #[test]
    fn a_clear_waits_for_every_input_last_heard_wet_to_read_dry() {
        let mut s = Safety::default();
        let mut log = Log::default();
        let wet_cdu = LeakInputs {
            cdu: Some(0b0010),
            ..LeakInputs::DRY
        };
        s.leaks(&wet_cdu, 4, 0, &mut log);
        assert_eq!(s.leaks_latched(), 0b0010);
        // The CDU does not answer a step: the ropes alone read dry, and
        // its last word was wet. Taken, the clear would not latch the
        // still wet input again (seen before): the valve would reopen.
        let silent = LeakInputs {
            cdu: None,
            ..LeakInputs::DRY
        };
        s.leaks(&silent, 4, 0, &mut log);
        let last_heard =
            "a leak input read the rack wet when last heard and has not read it dry since";
        assert_eq!(s.clear_leak(1, 4, &silent), Err(last_heard));
        let dry = LeakInputs {
            cdu: Some(0),
            ..LeakInputs::DRY
        };
        s.leaks(&dry, 4, 0, &mut log);
        assert_eq!(s.clear_leak(1, 4, &dry), Ok(()));

        // Restored latched from flash, before any step has read the
        // inputs: the shells judge a clear on dry inputs then.
        let mut r = Safety::default();
        r.restore(
            &Latched {
                leaks: 0b0100,
                ..Latched::default()
            },
            4,
        );
        assert_eq!(r.clear_leak(2, 4, &LeakInputs::DRY), Err(last_heard));
        r.leaks(&dry, 4, 0, &mut log);
        assert_eq!(r.clear_leak(2, 4, &dry), Ok(()));
    }

    #[test]
    fn a_rack_without_a_rope_still_latches_on_the_cdus_own_input() {
        let mut s = Safety::default();
        let mut log = Log::default();
        let inp = LeakInputs {
            cdu: Some(0b1000),
            ..LeakInputs::DRY
        };
        // Rack 3 is declared unprotected: no rope on the board.
        assert_eq!(s.leaks(&inp, 4, 0b1000, &mut log), 0b0111);
        assert_eq!(s.leaks_latched(), 0b1000);
    }

    #[test]
    fn a_valve_input_that_reads_closed_while_open_is_not_believed_and_its_leak_escalates() {
        let mut s = Safety::default();
        let mut log = Log::default();
        // Rack 0 commanded open, its input reads closed for 5 s.
        for t in 0..=5 {
            s.feedback(t * 1000, 0b1111, true, Some(0b0001), 5_000, &mut log);
        }
        assert_eq!(s.feedback_faults(), 0b0001);
        assert!(log.events.iter().any(|e| matches!(
            e,
            Event::SensorFault {
                sensor: Sensor::ValvePosition,
                fault: SensorFault::Implausible,
                ..
            }
        )));
        // Rack 0 leaks: its "closed" confirms nothing.
        s.leaks(&LeakInputs::wet(0b0001), 4, 0, &mut log);
        for t in 6..11 {
            assert!(!s.isolation(t * 1000, Some(0b0001), 5_000, &mut log));
        }
        assert!(s.isolation(11_000, Some(0b0001), 5_000, &mut log));
        // Writes that did not go in judge nothing; an input that reads
        // open while commanded open is believed again.
        let mut s = Safety::default();
        for t in 0..20 {
            s.feedback(t * 1000, 0b0001, false, Some(0b0001), 5_000, &mut log);
        }
        assert_eq!(s.feedback_faults(), 0);
        for t in 20..26 {
            s.feedback(t * 1000, 0b0001, true, Some(0b0001), 5_000, &mut log);
        }
        assert_eq!(s.feedback_faults(), 0b0001);
        s.feedback(26_000, 0b0001, true, Some(0), 5_000, &mut log);
        assert_eq!(s.feedback_faults(), 0);
    }

    #[test]
    fn a_valve_whose_position_is_not_read_back_is_not_taken_for_closed() {
        let mut s = Safety::default();
        let mut log = Log::default();
        s.leaks(&LeakInputs::wet(0b0001), 4, 0, &mut log);
        for t in 0..5 {
            assert!(!s.isolation(t * 1000, None, 5_000, &mut log), "{t}");
        }
        assert!(
            s.isolation(5_000, None, 5_000, &mut log),
            "no position: escalated"
        );
        assert_eq!(s.isolation_failed(), 0b0001);
    }
}
