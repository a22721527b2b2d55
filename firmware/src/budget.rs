//! A step's time: a Modbus transaction is sent only while the step has
//! time left for the least one ([`transaction_least_us`]: the silence
//! before the request, the request, the CDU's least turnaround and the
//! longest answer on the line), and no wait of it goes past the step's
//! deadline (the RTU master's, [`crate::rtu::RtuMaster::set_deadline`]):
//! a CDU that answers in 60 ms gets every write of a step, one that is
//! silent costs the step no more than its budget. Planning each
//! transaction at its worst instead ([`transaction_worst_us`], 429 ms at
//! 19,200 baud) would leave the heartbeat and the settings after it
//! unsent at every step of a CDU that takes 60 ms to answer. The
//! latched record's keep to flash, which must come before the step's
//! writes, does not eat their time ([`StepBudget::kept`]).
//!
//! The read-back of the step's safety writes ([`crate::read_back`]: one
//! request per run of holding registers, one for the shipped map, a
//! request of 8 bytes and an answer of 11) goes after every write of the
//! step, the heartbeat and the writes after it included: whatever it
//! takes, up to its worst, they have had their time. It is asked, as any
//! transaction, while the step has time for the least one, and its wait
//! ends at the step's end: a CDU that answers in 60 ms gets both reads,
//! the six writes and the read-back in a step, one answering in 85 ms
//! the six writes but not the read-back, and at no answer time does the
//! read-back go before a write or cost one (the step's writes and
//! read-back driven through [`crate::read_back::write_step`] on a timed
//! port:
//! `a_cdu_that_answers_in_60_ms_gets_both_reads_every_write_and_the_read_back_of_a_step`).
//! A step with no time left for it does not ask it (its settings are
//! taken on their echo, said as the step's time ran out), and the next
//! step does not ask it before its writes: at its worst it would leave
//! that step's heartbeat or the writes after it unsent, which is what a
//! read-back must never cost.
//!
//! A NOR part can take [`crate::board`]'s `NOR_ITEM_WORST_US` for one
//! item (450 ms on the reference board) and the record is two items and
//! the mark ([`LATCH_ITEMS`]): more than a step's whole budget. So the
//! step that latches does not wait on the flash to shut a rack: when the
//! keep's worst leaves no room for a write at its worst
//! ([`StepBudget::closings_first`]),
//! the valves the decision closes are written closed before the record
//! goes to flash ([`closings`]: a word that closes what the decision
//! closes, opens nothing, and takes what is open from the valve word the
//! CDU last took, as the decision path does, before the position inputs).
//! The latch's rule allows it: the record goes to flash before any
//! write reaches the CDU, closing excepted, which always proceeds
//! (`cooling_decide::latch`). The pumps, the lead and the heartbeat
//! stay after the record, and keep the time the step had before it.
//!
//! Glossary:
//! - *deadline*: the step's start plus its budget, µs of the board's
//!   clock.
//! - *item*: one key and its bytes in the config store.

use crate::rtu::{char_us, gap_us, RESYNC_QUIET_US};

/// The longest request the firmware sends, bytes: a write of four
/// registers (unit, function, address, count, byte count, 8 bytes, CRC).
pub const REQUEST_MAX_BYTES: u32 = 17;

/// The part of a control period a step's transactions may take, µs.
pub const STEP_BUDGET_US: u64 = 800_000;

/// The CDU's turnaround a transaction is sent only with time for, µs: the
/// least time between a request's last byte and its answer's first.
pub const TURNAROUND_LEAST_US: u64 = 10_000;

/// Config items one keep of the latched record may write: its two
/// (the record and its generation) and the mark that one was kept.
pub const LATCH_ITEMS: u64 = 3;

/// Config items one keep of an operator's last clear number writes: the
/// number and its slot's write count (`counters::keep_clear`). A step
/// keeps one number at most: one kept again before its hearing, or a
/// clear's heard (`Controller::hear_after_keep`).
pub const CLEAR_ITEMS: u64 = 2;

/// The longest silence asked before a request at `baud`, µs: the gap, or
/// [`RESYNC_QUIET_US`] after a failure, whichever is longer.
const fn silence_us(baud: u32) -> u64 {
    if gap_us(baud) > RESYNC_QUIET_US {
        gap_us(baud) as u64
    } else {
        RESYNC_QUIET_US as u64
    }
}

/// The longest one Modbus transaction can take at `baud` with a response
/// timeout of `timeout_us`, µs: the silence waited for before the
/// request (given up a timeout after the gap, the gap at least
/// [`RESYNC_QUIET_US`] after a failure), the request itself
/// ([`REQUEST_MAX_BYTES`]), then the answer's timeout.
pub const fn transaction_worst_us(baud: u32, timeout_us: u32) -> u64 {
    let quiet = timeout_us as u64 + silence_us(baud);
    let send = REQUEST_MAX_BYTES as u64 * char_us(baud) as u64;
    quiet + send + timeout_us as u64
}

/// The least one Modbus transaction can take at `baud` with answers of
/// at most `answer_bytes`, µs: the silence before the request (the
/// longer one asked after a failure), the request ([`REQUEST_MAX_BYTES`]),
/// the CDU's least turnaround ([`TURNAROUND_LEAST_US`]), the answer.
pub const fn transaction_least_us(baud: u32, answer_bytes: u32) -> u64 {
    let line = (REQUEST_MAX_BYTES + answer_bytes) as u64 * char_us(baud) as u64;
    silence_us(baud) + line + TURNAROUND_LEAST_US
}

/// A transaction's least and worst, µs ([`transaction_least_us`],
/// [`transaction_worst_us`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transaction {
    /// The least: one is sent only with this much time left.
    pub least_us: u64,
    /// The worst: what a write after the latched record's keep is
    /// planned on.
    pub worst_us: u64,
}

/// One step's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBudget {
    /// The step's start plus its budget.
    deadline_us: u64,
    /// Time the latched record's keep took, given back to the writes.
    kept_us: u64,
    /// One transaction's least and worst.
    transaction: Transaction,
    /// The step wrote a flash item past its budget already: the latched
    /// record's keep, or a part of what was learned.
    over_budget_write: bool,
}

impl StepBudget {
    /// A step started at `start_us` with `budget_us` for its
    /// transactions, each of which takes `transaction`.
    pub const fn new(start_us: u64, budget_us: u64, transaction: Transaction) -> Self {
        Self {
            deadline_us: start_us + budget_us,
            kept_us: 0,
            transaction,
            over_budget_write: false,
        }
    }

    /// When the transactions' time ends, µs: the deadline, moved by the
    /// keep's time ([`StepBudget::kept`]). No wait goes past it.
    pub fn end_us(&self) -> u64 {
        self.deadline_us + self.kept_us
    }

    /// Whether a transaction started at `now_us` has at least its least
    /// time before the end ([`StepBudget::end_us`]).
    pub fn transaction_fits(&self, now_us: u64) -> bool {
        now_us + self.transaction.least_us <= self.end_us()
    }

    /// Whether a flash item of at most `worst_us`, started at `now_us`,
    /// ends by the step's own deadline (what was learned; the keep's time
    /// is not given back to it).
    pub fn item_fits(&self, now_us: u64, worst_us: u64) -> bool {
        now_us + worst_us <= self.deadline_us
    }

    /// Whether the valves' closings go before the latched record's keep
    /// at `now_us`: its worst (`keep_worst_us`) and a transaction at its
    /// worst do not both fit by the deadline.
    pub fn closings_first(&self, now_us: u64, keep_worst_us: u64) -> bool {
        now_us + keep_worst_us + self.transaction.worst_us > self.deadline_us
    }

    /// The latched record's keep took `took_us`: the writes after it keep
    /// the time they had before it, up to the keep's worst
    /// (`worst_us`): a flash slower than its board's figure is not
    /// waited on for more.
    pub fn kept(&mut self, took_us: u64, worst_us: u64) {
        self.kept_us = self.kept_us.saturating_add(took_us.min(worst_us));
        self.over_budget_write = true;
    }

    /// Whether a part of what was learned (a flash item of at most
    /// `worst_us`) is written at `now_us`: while it fits the step's own
    /// budget ([`StepBudget::item_fits`]), and otherwise one a step,
    /// unless the step kept the latched record. A CDU that takes tens of
    /// milliseconds to answer leaves no step the time for an item at its
    /// worst: without the one a step, what was learned would never be
    /// kept. The step then runs past its budget by one item at most,
    /// less than the record's keep ([`LATCH_ITEMS`]) would.
    pub fn learned_part_fits(&mut self, now_us: u64, worst_us: u64) -> bool {
        if self.item_fits(now_us, worst_us) {
            return true;
        }
        !core::mem::replace(&mut self.over_budget_write, true)
    }
}

/// The valve word to write before the latched record's keep: of the
/// racks open now, those `asked` open stay open and the rest close; a
/// rack shut now stays shut. So it closes only what `asked` closes,
/// opens nothing, and closes nothing `asked` leaves open. What is open
/// now is the valve word the CDU last took (`taken`), and only without
/// one the racks whose position input reads clear (`closed_now`), as the
/// decision path judges it: an input can read closed while its valve is
/// open, or open on a valve held shut. Bits past `racks` are no valves.
/// `None` when neither is known, or nothing open now is to close.
pub fn closings(
    asked: u16,
    taken: Option<u16>,
    closed_now: Option<u16>,
    racks: u16,
) -> Option<u16> {
    let open_now = taken.or(closed_now.map(|c| !c))? & racks;
    (open_now & !asked != 0).then_some(open_now & asked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::String;
    use std::vec::Vec;

    use cooling_decide::{Plan, Setting, Write};

    use crate::map::Register;
    use crate::read_back::{write_step, HoldingPort, SafetyHeld};
    use crate::rtu::RtuError;
    use crate::writes::SettingPort;

    const TIMEOUT: u32 = 200_000;

    #[test]
    fn a_transactions_worst_is_its_silence_its_request_and_its_answers_timeout() {
        // 19,200 baud: a character 521 µs, the gap 1,823 µs (less than
        // the 20 ms asked after a failure).
        let want = (200_000 + 20_000) + 17 * 521 + 200_000;
        assert_eq!(transaction_worst_us(19_200, TIMEOUT), want);
        // At 1,200 baud the gap (29,167 µs) is the longer silence.
        let slow = (200_000 + 29_167) + 17 * 8_334 + 200_000;
        assert_eq!(transaction_worst_us(1_200, TIMEOUT), slow);
    }

    /// The reference board's: 19,200 baud, answers of at most 27 bytes.
    fn tx() -> Transaction {
        Transaction {
            least_us: transaction_least_us(19_200, 27),
            worst_us: transaction_worst_us(19_200, TIMEOUT),
        }
    }

    #[test]
    fn a_transactions_least_is_its_silence_its_request_a_turnaround_and_its_answer() {
        let want = 20_000 + (17 + 27) * 521 + 10_000;
        assert_eq!(transaction_least_us(19_200, 27), want);
        let slow = 29_167 + (17 + 27) * 8_334 + 10_000;
        assert_eq!(transaction_least_us(1_200, 27), slow);
    }

    #[test]
    fn a_transaction_is_sent_only_while_its_least_fits() {
        let b = StepBudget::new(1_000, 800_000, tx());
        assert_eq!(b.end_us(), 801_000);
        assert!(b.transaction_fits(801_000 - tx().least_us));
        assert!(!b.transaction_fits(801_000 - tx().least_us + 1));
    }

    /// A CDU on the reference line (19,200 baud, a character 521 µs, the
    /// gap 1,823 µs) that answers `answer_us` after each request, the
    /// step's two reads already taken (each at the longest: 17 bytes out,
    /// 27 back); what the step then sends, in order, within its budget.
    struct Timed {
        budget: StepBudget,
        now: u64,
        answer_us: u64,
        sent: Vec<&'static str>,
    }

    impl Timed {
        fn new(answer_us: u64) -> Self {
            let read = 1_823 + (17 + 27) * 521 + answer_us;
            Self {
                budget: StepBudget::new(0, 800_000, tx()),
                now: 2 * read,
                answer_us,
                sent: Vec::new(),
            }
        }

        /// One transaction: `out` bytes sent, `back` bytes answered.
        fn go(&mut self, out: u64, back: u64) {
            self.now += 1_823 + (out + back) * 521 + self.answer_us;
        }
    }

    impl SettingPort for Timed {
        type Error = &'static str;
        fn write(&mut self, r: &Register, words: &[u16]) -> Result<(), &'static str> {
            // Function 6 (8 out, its echo 8 back), or 16 for two words.
            let out = if words.len() == 1 {
                8
            } else {
                9 + 2 * words.len() as u64
            };
            self.go(out, 8);
            self.sent.push(r.name);
            Ok(())
        }
        fn was_sent(_: &&'static str) -> bool {
            false
        }
        fn time_left(&mut self) -> bool {
            self.budget.transaction_fits(self.now)
        }
    }

    impl HoldingPort for Timed {
        fn read_holding(
            &mut self,
            _: &Register,
            _: &Register,
            out: &mut [u16],
        ) -> Result<(), RtuError> {
            self.go(8, 5 + 2 * out.len() as u64);
            self.sent.push("read back");
            Ok(())
        }
    }

    /// One step's writes and read-back ([`crate::read_back::write_step`])
    /// at a CDU answering in `answer_ms`: what went, and the console.
    fn step(answer_ms: u64) -> (Vec<&'static str>, String) {
        step_held(answer_ms, &mut SafetyHeld::seen_held())
    }

    /// The same, with what the read-back said since the start in `held`.
    fn step_held(answer_ms: u64, held: &mut SafetyHeld) -> (Vec<&'static str>, String) {
        let values = [15.0, 1.0, 0.0, 7.0, 80.0, 30.13];
        let plan = Plan {
            writes: (Setting::ORDER.iter().zip(values))
                .map(|(s, v)| Write {
                    setting: *s,
                    value: v,
                })
                .collect(),
        };
        let mut port = Timed::new(answer_ms * 1_000);
        let mut console = String::new();
        write_step(&mut port, &plan, held, &mut console);
        (port.sent, console)
    }

    /// After a start, a CDU that answers in 100 ms gets every write but
    /// its step has no time for the read-back, so none proves the safety
    /// settings held: the heartbeat waits for the bound
    /// ([`crate::read_back::START_BOUND_MS`], the CDU's heartbeat timeout
    /// built in), never going before it, and
    /// goes at every step from it on, not withheld for good.
    #[test]
    fn after_a_start_a_cdu_answering_in_100_ms_gets_its_heartbeat_once_past_the_bound() {
        let mut held = SafetyHeld::default();
        let bound_s = crate::read_back::START_BOUND_MS.div_ceil(1000);
        let beats: Vec<bool> = (0..bound_s + 3)
            .map(|s| {
                held.tick(s * 1000);
                let (sent, _) = step_held(100, &mut held);
                sent.contains(&"heartbeat")
            })
            .collect();
        let first = beats.iter().position(|b| *b);
        assert_eq!(first, Some(bound_s as usize), "{beats:?}");
        assert!(beats[bound_s as usize..].iter().all(|b| *b), "{beats:?}");
    }

    const WRITES: [&str; 6] = [
        "valves_open",
        "pumps_run",
        "lead_pump",
        "heartbeat",
        "pump_speed",
        "supply_setpoint",
    ];

    #[test]
    fn a_cdu_that_answers_in_60_ms_gets_both_reads_every_write_and_the_read_back_of_a_step() {
        // After both reads, the six writes, then the read-back (one run).
        let (sent, _) = step(60);
        assert_eq!(sent[..6], WRITES);
        assert_eq!(sent[6..], ["read back"]);
        // At 85 ms the writes all go, the read-back does not: it is the
        // one the step's time runs out on, said so.
        let (sent, console) = step(85);
        assert_eq!(sent, WRITES);
        assert!(
            console.contains("not asked: the step's time ran out"),
            "{console}"
        );
        // At every answer time, the read-back goes only after all six
        // writes, and last: it never costs the heartbeat or the writes
        // after it.
        for ms in 0..=200 {
            let (sent, _) = step(ms);
            if let Some(at) = sent.iter().position(|s| *s == "read back") {
                assert_eq!(sent[..at], WRITES, "{ms} ms");
                assert_eq!(at + 1, sent.len(), "{ms} ms");
            }
            assert!(sent.len() <= 7, "{ms} ms: {sent:?}");
        }
        // Planned at each one's worst, the heartbeat and what follows it
        // would never go after the two reads.
        let worst = tx().worst_us;
        let mut now = 0;
        let mut planned = 0;
        while now + worst <= 800_000 {
            now += 1_823 + (17 + 27) * 521 + 60_000;
            planned += 1;
        }
        assert_eq!(planned, 5, "two reads, then the valves, pumps and lead");
    }

    #[test]
    fn the_records_keep_gives_the_writes_after_it_back_their_time_up_to_its_worst() {
        let keep_worst = LATCH_ITEMS * 450_000;
        let mut b = StepBudget::new(0, 800_000, tx());
        // The CDU read by 60 ms; the keep's worst and a write do not fit.
        assert!(b.closings_first(60_000, keep_worst));
        // The keep took 900 ms: the valve write after it still fits, as
        // it did before it.
        assert!(b.transaction_fits(60_000));
        b.kept(900_000, keep_worst);
        assert_eq!(b.end_us(), 1_700_000);
        assert!(b.transaction_fits(960_000));
        assert!(!b.transaction_fits(1_700_000 - tx().least_us + 1));
        // What was learned gets no more than the step's own budget.
        assert!(!b.item_fits(960_000, 450_000));
        // A flash slower than its worst is not waited on for more.
        let mut slow = StepBudget::new(0, 800_000, tx());
        slow.kept(5_000_000, keep_worst);
        assert!(!slow.transaction_fits(5_060_000));
        // A keep whose worst fits with a write at its worst leaves the
        // order as it is.
        let b = StepBudget::new(0, 800_000, tx());
        assert!(!b.closings_first(0, 10_000));
        assert!(b.closings_first(800_000 - tx().worst_us - 10_000 + 1, 10_000));
    }

    #[test]
    fn a_step_without_time_writes_one_part_of_what_was_learned_and_none_after_the_record() {
        let worst = 450_000;
        // The writes of a CDU answering in 60 ms end at 680 ms.
        let mut b = StepBudget::new(0, 800_000, tx());
        assert!(!b.item_fits(680_000, worst));
        assert!(b.learned_part_fits(680_000, worst), "one part a step");
        assert!(!b.learned_part_fits(700_000, worst), "one only");
        // Time within the budget: as many parts as fit.
        let mut b = StepBudget::new(0, 800_000, tx());
        assert!(b.learned_part_fits(100_000, worst));
        assert!(b.learned_part_fits(300_000, worst));
        assert!(b.learned_part_fits(600_000, worst), "then the one past it");
        assert!(!b.learned_part_fits(700_000, worst));
        // A step that kept the latched record writes none past its budget.
        let mut b = StepBudget::new(0, 800_000, tx());
        b.kept(900_000, LATCH_ITEMS * worst);
        assert!(!b.learned_part_fits(1_600_000, worst));
    }

    #[test]
    fn the_early_valve_word_closes_what_the_step_closes_and_opens_nothing() {
        let racks = 0b1111;
        // Rack 2 to close; rack 0's position input reads closed while the
        // CDU took its valve open: what the CDU took is what is open, so
        // rack 0 stays open and only rack 2 closes.
        assert_eq!(
            closings(0b1011, Some(0b1111), Some(0b0001), racks),
            Some(0b1011)
        );
        // No valve word taken yet: the inputs say what is open, and rack
        // 0, read closed, is not opened by the early word.
        assert_eq!(closings(0b1011, None, Some(0b0001), racks), Some(0b1010));
        // Rack 1 held shut (taken closed) while its input lies "open": the
        // early word does not open it, though the step asks it open.
        assert_eq!(
            closings(0b1011, Some(0b1101), Some(0b0000), racks),
            Some(0b1001)
        );
        // Nothing open now to close: no early write.
        assert_eq!(closings(0b1111, Some(0b1111), Some(0b1111), racks), None);
        assert_eq!(closings(0b1011, Some(0b1011), Some(0b0000), racks), None);
        assert_eq!(closings(0b1111, None, Some(0b0000), racks), None);
        assert_eq!(closings(0b1011, None, Some(0b0100), racks), None);
        // Neither taken nor read: nothing known to be open, no early write.
        assert_eq!(closings(0b0000, None, None, racks), None);
        // Bits past the racks are no valves.
        assert_eq!(closings(0b0111, None, Some(0b0000), 0b0111), None);
        assert_eq!(closings(0b0111, Some(0xffff), None, 0b0111), None);
        // Every word written closes only racks asked closed, and opens
        // none, for every word asked, taken and read.
        for asked in 0..16u16 {
            for taken in (0..16u16).map(Some).chain([None]) {
                for read in (0..16u16).map(Some).chain([None]) {
                    let Some(w) = closings(asked, taken, read, racks) else {
                        continue;
                    };
                    let open = taken.or(read.map(|c| !c & racks)).unwrap();
                    assert_eq!(w & !open, 0, "opens none");
                    assert_eq!(open & asked & !w, 0, "closes none asked open");
                    assert_ne!(open & !w, 0, "closes one at least");
                }
            }
        }
    }
}
