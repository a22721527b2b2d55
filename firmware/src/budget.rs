//! A step's time, planned on the worst of what it waits for: a Modbus
//! transaction is sent only while a whole one still fits before the
//! step's deadline ([`transaction_worst_us`]: the silence waited for
//! before the request, the request, the answer's timeout), and the
//! latched record's keep to flash, which must come before the step's
//! writes, does not eat their time ([`StepBudget::kept`]).
//!
//! A NOR part can take [`crate::board`]'s `NOR_ITEM_WORST_US` for one
//! item (450 ms on the reference board) and the record is two items and
//! the mark ([`LATCH_ITEMS`]): more than a step's whole budget. So the
//! step that latches does not wait on the flash to shut a rack: when the
//! keep's worst leaves no room for a write ([`StepBudget::closings_first`]),
//! the valves the decision closes are written closed before the record
//! goes to flash ([`closings`]: a word that closes and opens nothing).
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

/// Config items one keep of the latched record may write: its two
/// (the record and its generation) and the mark that one was kept.
pub const LATCH_ITEMS: u64 = 3;

/// The longest one Modbus transaction can take at `baud` with a response
/// timeout of `timeout_us`, µs: the silence waited for before the
/// request (given up a timeout after the gap, the gap at least
/// [`RESYNC_QUIET_US`] after a failure), the request itself
/// ([`REQUEST_MAX_BYTES`]), then the answer's timeout.
pub const fn transaction_worst_us(baud: u32, timeout_us: u32) -> u64 {
    let need = if gap_us(baud) > RESYNC_QUIET_US {
        gap_us(baud)
    } else {
        RESYNC_QUIET_US
    };
    let quiet = timeout_us as u64 + need as u64;
    let send = REQUEST_MAX_BYTES as u64 * char_us(baud) as u64;
    quiet + send + timeout_us as u64
}

/// One step's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBudget {
    /// The step's start plus its budget.
    deadline_us: u64,
    /// Time the latched record's keep took, given back to the writes.
    kept_us: u64,
    /// One transaction's worst ([`transaction_worst_us`]).
    transaction_us: u64,
}

impl StepBudget {
    /// A step started at `start_us` with `budget_us` for its transactions,
    /// each of which may take `transaction_us`.
    pub const fn new(start_us: u64, budget_us: u64, transaction_us: u64) -> Self {
        Self {
            deadline_us: start_us + budget_us,
            kept_us: 0,
            transaction_us,
        }
    }

    /// Whether a whole transaction started at `now_us` ends by the
    /// deadline (moved by the keep's time, [`StepBudget::kept`]).
    pub fn transaction_fits(&self, now_us: u64) -> bool {
        now_us + self.transaction_us <= self.deadline_us + self.kept_us
    }

    /// Whether a flash item of at most `worst_us`, started at `now_us`,
    /// ends by the step's own deadline (what was learned; the keep's time
    /// is not given back to it).
    pub fn item_fits(&self, now_us: u64, worst_us: u64) -> bool {
        now_us + worst_us <= self.deadline_us
    }

    /// Whether the valves' closings go before the latched record's keep
    /// at `now_us`: its worst (`keep_worst_us`) and a transaction do not
    /// both fit by the deadline.
    pub fn closings_first(&self, now_us: u64, keep_worst_us: u64) -> bool {
        now_us + keep_worst_us + self.transaction_us > self.deadline_us
    }

    /// The latched record's keep took `took_us`: the writes after it keep
    /// the time they had before it, up to the keep's worst
    /// (`worst_us`): a flash slower than its board's figure is not
    /// waited on for more.
    pub fn kept(&mut self, took_us: u64, worst_us: u64) {
        self.kept_us = self.kept_us.saturating_add(took_us.min(worst_us));
    }
}

/// The valve word to write before the latched record's keep: racks open
/// now (`closed_now` read clear, within `racks`) stay as `asked`, racks
/// closed now stay closed, so it closes what `asked` closes and opens
/// nothing. `None` when the positions are not read, or nothing open now
/// is to close.
pub fn closings(asked: u16, closed_now: Option<u16>, racks: u16) -> Option<u16> {
    let open_now = !closed_now? & racks;
    (open_now & !asked != 0).then_some(open_now & asked)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_transaction_is_sent_only_while_a_whole_one_fits() {
        let worst = transaction_worst_us(19_200, TIMEOUT);
        let b = StepBudget::new(1_000, 800_000, worst);
        assert!(b.transaction_fits(801_000 - worst));
        // One timeout left is not a transaction's time: the silence
        // before it and its answer may each take one.
        assert!(!b.transaction_fits(801_000 - u64::from(TIMEOUT)));
        assert!(!b.transaction_fits(801_000 - worst + 1));
    }

    #[test]
    fn the_records_keep_gives_the_writes_after_it_back_their_time_up_to_its_worst() {
        let worst = transaction_worst_us(19_200, TIMEOUT);
        let keep_worst = LATCH_ITEMS * 450_000;
        let mut b = StepBudget::new(0, 800_000, worst);
        // The CDU read by 60 ms; the keep's worst and a write do not fit.
        assert!(b.closings_first(60_000, keep_worst));
        // The keep took 900 ms: the valve write after it still fits, as
        // it did before it.
        assert!(b.transaction_fits(60_000));
        b.kept(900_000, keep_worst);
        assert!(b.transaction_fits(960_000));
        assert!(!b.transaction_fits(960_000 + 800_000 - 60_000));
        // What was learned gets no more than the step's own budget.
        assert!(!b.item_fits(960_000, 450_000));
        // A flash slower than its worst is not waited on for more.
        let mut slow = StepBudget::new(0, 800_000, worst);
        slow.kept(5_000_000, keep_worst);
        assert!(!slow.transaction_fits(5_060_000));
        // A keep whose worst fits with a write leaves the order as it is.
        let b = StepBudget::new(0, 800_000, worst);
        assert!(!b.closings_first(0, 10_000));
    }

    #[test]
    fn the_early_valve_word_closes_what_the_step_closes_and_opens_nothing() {
        let racks = 0b1111;
        // Rack 2 to close, rack 0 closed now (the step opens it again).
        assert_eq!(closings(0b1011, Some(0b0001), racks), Some(0b1010));
        // Nothing open now to close: no early write.
        assert_eq!(closings(0b1111, Some(0b0000), racks), None);
        assert_eq!(closings(0b1011, Some(0b0100), racks), None);
        // Positions unread: nothing known to be open, no early write.
        assert_eq!(closings(0b0000, None, racks), None);
        // Bits past the racks are no valves.
        assert_eq!(closings(0b0111, Some(0b0000), 0b0111), None);
    }
}
