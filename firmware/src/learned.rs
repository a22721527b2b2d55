//! What the estimator learned of the hall, in the board's flash across
//! restarts, as the Linux controller keeps it (the parts, their keys and
//! their cadence are `cooling_decide::learned`'s; the parts' bytes
//! `cooling_core::estimate::record`'s):
//! - [`restore`], before the first step: each part the flash holds is
//!   restored through the decision path ([`Controller::restore_learned`],
//!   traced, so a replay restores it alike); a part that does not read or
//!   decode is refused, said with its key, and left as configured; the
//!   rest are restored.
//! - [`keep`], after the step's writes: every
//!   [`LEARNED_EVERY_MS`](cooling_decide::learned::LEARNED_EVERY_MS) of
//!   the board's clock, the parts whose bytes changed since they were
//!   last kept are written, one at a time while a write still fits in the
//!   step's time ([`LearnedFlash::time_for_learned`]); what is left goes
//!   on at the next step.
//!
//! The board gives its flash through [`LearnedFlash`]; the parts travel
//! through the controller's keeper, which lives in a static
//! (`cooling_decide::learned::LearnedKeeper`).
//!
//! Glossary:
//! - *part*: one record of what was learned, under one config key.

use core::fmt;

use cooling_core::estimate::record::MAX_LEN;
use cooling_decide::learned::{ToKeep, LEARNED_KEYS};
use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use loopwarden_flash::{ConfigStore, StoreError};

pub use cooling_decide::learned::Tally;

use crate::block_on::block_on;
use crate::controller::{Controller, Ports};

/// The board's flash as keeping what was learned needs it, beside its
/// ports.
pub trait LearnedFlash: Ports {
    /// Why the flash failed.
    type Error: fmt::Display;
    /// The bytes kept under `key`, into `out`: their length; `None` when
    /// none were ever written.
    fn read_learned(
        &mut self,
        key: &str,
        out: &mut [u8; MAX_LEN],
    ) -> Result<Option<usize>, Self::Error>;
    /// Keeps `bytes` under `key`.
    fn write_learned(&mut self, key: &str, bytes: &[u8]) -> Result<(), Self::Error>;
    /// Whether one more part is written in this step
    /// ([`crate::budget::StepBudget::learned_part_fits`]).
    fn time_for_learned(&mut self) -> bool;
}

/// [`LearnedFlash::read_learned`] on a config store.
pub fn read_part<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    key: &str,
    out: &mut [u8; MAX_LEN],
) -> Result<Option<usize>, StoreError<S::Error>> {
    block_on(store.get(key, out))
}

/// [`LearnedFlash::write_learned`] on a config store.
pub fn write_part<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    key: &str,
    bytes: &[u8],
) -> Result<(), StoreError<S::Error>> {
    block_on(store.set(key, bytes))
}

/// What [`restore`] made of the flash.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Restored {
    /// Parts restored.
    pub restored: u8,
    /// Parts refused: unreadable, or not decoding, or out of bounds.
    pub refused: u8,
}

/// Restores into `ctl`'s decision path each part of what was learned
/// that `b`'s flash holds (see the module's note), and says what it did.
pub fn restore(ctl: &mut Controller<'_>, b: &mut impl LearnedFlash) -> Restored {
    let mut r = Restored::default();
    for (part, key) in LEARNED_KEYS.iter().enumerate() {
        let mut buf = [0u8; MAX_LEN];
        let ok = match b.read_learned(key, &mut buf) {
            Ok(None) => continue,
            Ok(Some(n)) => ctl.restore_learned(b, part, Ok(&buf[..n])),
            Err(e) => ctl.restore_learned(b, part, Err(&e)),
        };
        if ok {
            r.restored += 1;
        } else {
            r.refused += 1;
        }
    }
    let parts = LEARNED_KEYS.len();
    match r {
        Restored {
            restored: 0,
            refused: 0,
        } => b.say(format_args!(
            "learned: none in flash: the hall is learned from the configured figures"
        )),
        Restored { restored, refused } => b.say(format_args!(
            "learned: {restored} of {parts} parts restored from flash, {refused} refused"
        )),
    }
    r
}

/// Keeps in `b`'s flash what `ctl`'s decision path learned, at `now_ms`
/// (the board's clock), when a keep is due or under way: each changed
/// part while the step's time allows. What a keep wrote, once it is over.
pub fn keep(ctl: &mut Controller<'_>, b: &mut impl LearnedFlash, now_ms: u64) -> Option<Tally> {
    loop {
        let (part, ok) = match ctl.learned_to_keep(now_ms) {
            ToKeep::Nothing => return None,
            ToKeep::Done(t) => {
                say_kept(b, t);
                return Some(t);
            }
            ToKeep::Part { part, key, bytes } => {
                if !b.time_for_learned() {
                    return None;
                }
                match b.write_learned(key, bytes) {
                    Ok(()) => (part, true),
                    Err(e) => {
                        b.say(format_args!(
                            "learned: {key} not kept in flash: {e}; written again at the next keep"
                        ));
                        (part, false)
                    }
                }
            }
        };
        ctl.learned_kept(part, ok);
    }
}

/// A keep's tally on the console, when it wrote or tried to.
fn say_kept(b: &mut impl LearnedFlash, t: Tally) {
    if t.written == 0 && t.failed == 0 {
        return;
    }
    b.say(format_args!(
        "learned: {} parts kept in flash, {} not (of {}; the rest unchanged)",
        t.written,
        t.failed,
        LEARNED_KEYS.len()
    ));
}

#[cfg(test)]
mod tests;
