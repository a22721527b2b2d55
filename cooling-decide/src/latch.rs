//! The latched state between the core and the flash: when it is written,
//! what happens when it cannot be, and what a controller that finds its
//! record unreadable does.
//!
//! - After every step whose latched state changed, the new record (with
//!   the next generation, [`LatchRecord`]) goes to flash before any of
//!   the step's writes reach the CDU.
//! - A step whose record did not go to flash opens no valve: the valves
//!   are written as the core asks, less any that is not open now
//!   (closing always proceeds).
//! - A record that cannot be read or believed is never overwritten, and
//!   no valve is written, until the CDU's valve positions have been read:
//!   then every rack whose valve reads closed is latched in place
//!   (*relatch*), and the record is written anew. A CDU whose map has no
//!   valve positions can never be read so: every rack is latched then.
//!
//! Glossary:
//! - *relatch*: latching racks from the valve positions after an
//!   unreadable record.

use core::fmt::Display;

use cooling_core::{Core, Latched};

use crate::record::LatchRecord;
use crate::said::{words, Said};

/// The latched state's keeper.
#[derive(Debug, Clone)]
pub struct LatchKeeper {
    /// The record last kept in flash (`None`: nothing known to be there).
    kept: Option<LatchRecord>,
    /// The record handed out to be kept, not yet confirmed.
    offered: Option<LatchRecord>,
    /// The record read at start was unreadable: relatch at the first
    /// valve positions.
    relatch: bool,
    /// The last record offered did not go to flash.
    failed: bool,
    /// The generation the records go above while none was kept or
    /// offered: the one the flash's generation item held beside a record
    /// that could not be believed ([`LatchKeeper::continue_above`]); 0
    /// otherwise.
    floor: u32,
}

/// What the keeper made of the record read at start.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The keeper.
    pub keeper: LatchKeeper,
    /// The state to restore the core from.
    pub restore: Option<Latched>,
    /// What to say in the log.
    pub said: Option<Said>,
}

impl LatchKeeper {
    /// The keeper for what the flash held at start: a record, none ever
    /// written, or why it cannot be read.
    pub fn open<E: Display>(read: &Result<Option<LatchRecord>, E>) -> Opened {
        let fresh = |kept, relatch| LatchKeeper {
            kept,
            relatch,
            ..LatchKeeper::NOTHING
        };
        match read {
            Ok(Some(r)) => Opened {
                keeper: fresh(Some(*r), false),
                restore: Some(r.latched),
                said: None,
            },
            Ok(None) => Opened {
                keeper: fresh(None, false),
                restore: None,
                said: None,
            },
            Err(e) => Opened {
                keeper: fresh(None, true),
                restore: None,
                said: Some(Said::RecordUnreadable { why: words(e) }),
            },
        }
    }

    /// Nothing known to be in flash, nothing offered, no relatch: the
    /// keeper when none was ever written.
    pub const NOTHING: LatchKeeper = LatchKeeper {
        kept: None,
        offered: None,
        relatch: false,
        failed: false,
        floor: 0,
    };

    /// After a record that could not be believed: the records written
    /// anew go above generation `g`, the one the flash's generation item
    /// holds ([`crate::record::generation_written`]). Without it the first
    /// would be generation 1, behind that item, and a cut between the
    /// record and its generation would read as damaged at the next start:
    /// a relatch again, losing what the record held (a pump tripped since).
    pub fn continue_above(&mut self, g: u32) {
        self.floor = g;
    }

    /// A relatch is pending.
    pub fn relatch_pending(&self) -> bool {
        self.relatch
    }

    /// Relatches `core` from the valve positions the CDU reports closed
    /// (`closed`; `positions`: the map reads them at all) when a relatch
    /// is pending and they are known. Returns the racks latched.
    pub fn relatch(
        &mut self,
        core: &mut Core,
        closed: Option<u16>,
        positions: bool,
    ) -> Option<u16> {
        if !self.relatch {
            return None;
        }
        let racks = if positions { closed? } else { u16::MAX };
        self.relatch = false;
        core.latch_racks(racks);
        Some(racks & cooling_core::safety::all_racks(core.config().layout.racks as usize))
    }

    /// The record to keep after a step that left `core` latched as it is:
    /// `None` when flash already holds it, or while a relatch is pending
    /// (the unreadable record is not overwritten).
    pub fn to_keep(&mut self, core: &Core) -> Option<LatchRecord> {
        if self.relatch {
            return None;
        }
        let l = core.latched();
        if self.kept.is_some_and(|k| k.latched == l) {
            self.failed = false;
            return None;
        }
        let last = (self.offered.or(self.kept)).map_or(self.floor, |k| k.generation);
        let generation = crate::record::next_generation(last);
        let r = LatchRecord {
            generation,
            latched: l,
        };
        self.offered = Some(r);
        Some(r)
    }

    /// The flash took the record offered (`ok`), or did not. A write
    /// that failed may still have left part of the record in flash (its
    /// state without its generation, or a write that went in after it
    /// was given up on), so what flash holds is unknown then: the next
    /// step writes the state it has whatever it is, with a generation
    /// past the one offered.
    pub fn kept(&mut self, ok: bool) {
        self.failed = !ok;
        if ok {
            self.kept = self.offered.take();
        } else {
            self.kept = None;
        }
    }

    /// The valves to write for `asked` (the core's, bit n = rack n open):
    /// `None` (not written) while a relatch is pending; after a record
    /// that did not go to flash, only closings: `asked` less every valve
    /// not open now (`open_now`, as last written or read; unknown: not
    /// written).
    pub fn valves(&self, asked: u16, open_now: Option<u16>) -> Option<u16> {
        if self.relatch {
            return None;
        }
        if self.failed {
            return open_now.map(|o| asked & o);
        }
        Some(asked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cooling_core::CoreConfig;

    fn core() -> Core {
        Core::new(CoreConfig::default()).unwrap()
    }

    #[test]
    fn an_unreadable_record_is_kept_and_no_valve_written_until_the_positions_are_read() {
        let o = LatchKeeper::open(&Err("cdu.latched: damaged"));
        let mut k = o.keeper;
        assert!(o.restore.is_none() && o.said.as_ref().is_some_and(|s| s.error()));
        let mut c = core();
        assert_eq!(k.to_keep(&c), None, "nothing overwrites it");
        assert_eq!(k.valves(0b1111, Some(0b1111)), None);
        assert_eq!(k.relatch(&mut c, None, true), None, "the CDU is silent");
        assert!(k.relatch_pending());
        assert_eq!(k.relatch(&mut c, Some(0b0010), true), Some(0b0010));
        assert_eq!(c.leaks_latched(), 0b0010);
        let r = k.to_keep(&c).expect("written anew");
        assert_eq!(r.latched.leaks, 0b0010);
        assert_eq!(r.generation, 1);
        k.kept(true);
        assert_eq!(k.valves(0b1101, None), Some(0b1101));
    }

    #[test]
    fn no_valve_opens_after_a_failed_write_and_closing_proceeds() {
        let mut k = LatchKeeper::open(&Ok::<_, &str>(None)).keeper;
        let mut c = core();
        c.latch_racks(0b0001);
        let r = k.to_keep(&c).unwrap();
        k.kept(false);
        assert_eq!(k.valves(0b1110, Some(0b0110)), Some(0b0110));
        assert_eq!(k.valves(0b1110, None), None);
        // The next try takes the next generation and, once in, opens.
        let again = k.to_keep(&c).unwrap();
        assert_eq!(again.generation, r.generation + 1);
        k.kept(true);
        assert_eq!(k.valves(0b1110, Some(0)), Some(0b1110));
        assert_eq!(k.to_keep(&c), None);
    }

    #[test]
    fn after_a_failed_write_the_state_is_written_again_even_when_it_came_back_to_the_kept_one() {
        let mut k = LatchKeeper::open(&Ok::<_, &str>(None)).keeper;
        let mut c = core();
        c.latch_racks(0b100);
        let first = k.to_keep(&c).unwrap();
        k.kept(true);
        let dry = cooling_core::safety::LeakInputs {
            wet: 0,
            rope_faults: 0,
            read_ok: true,
            cdu: Some(0),
        };
        c.clear_leak(2, &dry).unwrap();
        let cleared = k.to_keep(&c).expect("the clear is kept");
        assert_eq!(cleared.latched.leaks, 0);
        // The write failed, but its state may have reached flash without
        // its generation: flash may now read as the clear.
        k.kept(false);
        // The rope reads wet again before the next write: the core holds
        // what was kept before the clear, and that is written anew.
        c.latch_racks(0b100);
        let again = k.to_keep(&c).expect("written again, flash is unknown");
        assert_eq!(again.latched.leaks, 0b100);
        assert_eq!(again.generation, cleared.generation + 1);
        assert!(again.generation > first.generation);
        assert_eq!(
            k.valves(0b011, Some(0b001)),
            Some(0b001),
            "no valve opens yet"
        );
        k.kept(true);
        assert_eq!(k.to_keep(&c), None);
    }

    #[test]
    fn without_valve_positions_a_relatch_latches_every_rack() {
        let mut k = LatchKeeper::open(&Err("unreadable")).keeper;
        let mut c = core();
        let racks = c.config().layout.racks as usize;
        assert_eq!(
            k.relatch(&mut c, None, false),
            Some(cooling_core::safety::all_racks(racks))
        );
    }

    /// A relatch after a record that did not read, while the flash's
    /// generation item holds 7: the record written anew is generation 8,
    /// so a cut between it and its generation leaves it one ahead,
    /// believed, not behind (a relatch again, losing what it latched).
    #[test]
    fn after_an_unreadable_record_the_records_go_above_the_generation_written() {
        let mut k = LatchKeeper::open(&Err("cdu.latched: damaged")).keeper;
        k.continue_above(7);
        let mut c = core();
        assert_eq!(k.relatch(&mut c, Some(0b0001), true), Some(0b0001));
        let r = k.to_keep(&c).expect("written anew");
        assert_eq!(r.generation, 8);
        let [(_, record), _] = r.items();
        assert_eq!(
            LatchRecord::decode(Some(&record), Some(&7u32.to_le_bytes())),
            Ok(Some(r))
        );
        // Without it the record would start at 1, behind the 7 kept.
        let mut k = LatchKeeper::open(&Err("cdu.latched: damaged")).keeper;
        let mut c = core();
        k.relatch(&mut c, Some(0b0001), true);
        let [(_, record), _] = k.to_keep(&c).unwrap().items();
        assert!(LatchRecord::decode(Some(&record), Some(&7u32.to_le_bytes())).is_err());
    }
}
