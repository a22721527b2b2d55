//! What the estimator learned of the hall, kept in flash across restarts:
//! the config keys its parts are kept under ([`LEARNED_KEYS`]), how often
//! they are kept ([`LEARNED_EVERY_MS`]), and which parts changed since
//! they were last kept ([`changed`], [`LearnedKeeper`]). The Linux
//! controller (`cooling-ctrl run`) and the firmware keep the same parts
//! under the same keys; the parts' bytes are `cooling_core`'s
//! ([`Learned::encode_part`], `cooling_core::estimate::record`).
//!
//! A keep: every [`LEARNED_EVERY_MS`] of the controller's clock the
//! figures are taken whole ([`LearnedKeeper::begin`]), then each part
//! whose bytes differ from what the flash is known to hold is handed out
//! to be written ([`LearnedKeeper::to_keep`]), one at a time, and confirmed
//! or not ([`LearnedKeeper::kept`]). A caller that runs out of time
//! between two parts asks again later: the keep goes on from the same
//! figures. A part that did not go in is handed out again at the next
//! keep. What the flash held at start ([`LearnedKeeper::held`]) counts as
//! kept, so a restart rewrites nothing that did not change.
//!
//! The keeper holds the figures being kept and each part's bytes (4.6 KB
//! on a 32-bit target): a microcontroller keeps it in a static, made at
//! compile time ([`LearnedKeeper::new`] is `const`), off its stack.
//!
//! Glossary:
//! - *part*: one record of what was learned, under one key (part 0 the
//!   loop's and the facility's figures, part `1 + n` hosts `8n..8n+8`).
//! - *keep*: one pass over the parts, writing those that changed.

use cooling_core::estimate::record::{MAX_LEN, PARTS};
use cooling_core::{Core, CoreConfig, Learned};

/// The config keys of what the estimator learned: part `n` under
/// `cdu.learned.n`.
pub const LEARNED_KEYS: [&str; PARTS] = [
    "cdu.learned.0",
    "cdu.learned.1",
    "cdu.learned.2",
    "cdu.learned.3",
    "cdu.learned.4",
    "cdu.learned.5",
    "cdu.learned.6",
    "cdu.learned.7",
    "cdu.learned.8",
    "cdu.learned.9",
    "cdu.learned.10",
    "cdu.learned.11",
    "cdu.learned.12",
    "cdu.learned.13",
    "cdu.learned.14",
    "cdu.learned.15",
    "cdu.learned.16",
];

/// How often what was learned is kept, ms of the controller's clock.
pub const LEARNED_EVERY_MS: u64 = 600_000;

/// One part's bytes.
pub type PartBytes = heapless::Vec<u8, MAX_LEN>;

/// Whether part bytes `now` differ from what the flash is known to hold
/// (`kept`; `None`: nothing known, so they are written).
pub fn changed(kept: Option<&[u8]>, now: &[u8]) -> bool {
    kept != Some(now)
}

/// What the keeper has to write next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToKeep<'a> {
    /// No keep under way.
    Nothing,
    /// Part `part`, whose bytes changed: write `bytes` under `key`, then
    /// say whether it went in ([`LearnedKeeper::kept`]).
    Part {
        /// The part's number.
        part: usize,
        /// Its config key.
        key: &'static str,
        /// Its bytes now.
        bytes: &'a [u8],
    },
    /// The keep under way is over (given once): what it wrote.
    Done(Tally),
}

/// What one keep wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Parts written.
    pub written: u8,
    /// Parts whose write failed (handed out again at the next keep).
    pub failed: u8,
}

/// The learned figures' keeper (see the module's note).
#[derive(Debug, Clone)]
pub struct LearnedKeeper {
    /// Each part's bytes as the flash holds them, as far as known (empty:
    /// not known; no part is empty).
    kept: [PartBytes; PARTS],
    /// The figures of the keep under way.
    figures: Learned,
    /// The keep under way: the next part to look at.
    next: Option<usize>,
    /// When the last keep began, ms (the first is due one period after
    /// the start).
    began_ms: u64,
    /// The bytes of the part handed out, and their length.
    offered: [u8; MAX_LEN],
    offered_len: usize,
    tally: Tally,
}

impl Default for LearnedKeeper {
    fn default() -> Self {
        Self::new()
    }
}

impl LearnedKeeper {
    /// Nothing known kept, no keep under way, the first due at
    /// [`LEARNED_EVERY_MS`].
    pub const fn new() -> Self {
        Self {
            kept: [const { PartBytes::new() }; PARTS],
            figures: Learned::new(&CoreConfig::reference()),
            next: None,
            began_ms: 0,
            offered: [0; MAX_LEN],
            offered_len: 0,
            tally: Tally {
                written: 0,
                failed: 0,
            },
        }
    }

    /// Part `part`'s bytes as the flash held them at start (restored or
    /// refused alike: they are what is there).
    pub fn held(&mut self, part: usize, bytes: &[u8]) {
        if let Some(k) = self.kept.get_mut(part) {
            k.clear();
            // A part longer than any record is not kept here: unknown, so
            // written at the next keep.
            let _ = k.extend_from_slice(bytes);
        }
    }

    /// Whether a keep is due at `now_ms` (or one is under way).
    pub fn due(&self, now_ms: u64) -> bool {
        self.next.is_some() || now_ms.saturating_sub(self.began_ms) >= LEARNED_EVERY_MS
    }

    /// Begins a keep of what `core` learned, at `now_ms`, when one is due
    /// and none is under way; whether one is under way now.
    pub fn begin(&mut self, core: &Core, now_ms: u64) -> bool {
        if self.due(now_ms) {
            self.begin_now(core, now_ms);
        }
        self.next.is_some()
    }

    /// Begins a keep of what `core` learned at `now_ms`, due or not (a
    /// clean stop), unless one is under way.
    pub fn begin_now(&mut self, core: &Core, now_ms: u64) {
        if self.next.is_none() {
            self.figures = core.learned();
            self.next = Some(0);
            self.began_ms = now_ms;
            self.tally = Tally::default();
        }
    }

    /// The next part of the keep under way whose bytes changed since it
    /// was last kept; [`ToKeep::Done`] once all are looked at.
    pub fn to_keep(&mut self) -> ToKeep<'_> {
        let Some(mut part) = self.next else {
            return ToKeep::Nothing;
        };
        while part < PARTS {
            // Every part below PARTS encodes.
            if let Ok(n) = self.figures.encode_part(part, &mut self.offered) {
                if changed(Some(&self.kept[part]), &self.offered[..n]) {
                    self.next = Some(part);
                    self.offered_len = n;
                    return ToKeep::Part {
                        part,
                        key: LEARNED_KEYS[part],
                        bytes: &self.offered[..n],
                    };
                }
            }
            part += 1;
        }
        self.next = None;
        ToKeep::Done(self.tally)
    }

    /// The part last handed out went to flash (`ok`) or did not; the
    /// keep moves on to the next part either way.
    pub fn kept(&mut self, part: usize, ok: bool) {
        if self.next != Some(part) {
            return;
        }
        if ok {
            // What was handed out for this part is still in `offered`.
            let k = &mut self.kept[part];
            k.clear();
            let _ = k.extend_from_slice(&self.offered[..self.offered_len]);
            self.tally.written = self.tally.written.saturating_add(1);
        } else {
            self.tally.failed = self.tally.failed.saturating_add(1);
        }
        self.next = Some(part + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    fn core() -> Core {
        Core::new(CoreConfig::default()).unwrap()
    }

    /// Every part a keep at `now_ms` hands out, each taken (`ok`).
    fn keep(k: &mut LearnedKeeper, c: &Core, now_ms: u64, ok: bool) -> (Vec<usize>, Tally) {
        let mut parts = Vec::new();
        k.begin(c, now_ms);
        loop {
            match k.to_keep() {
                ToKeep::Nothing => return (parts, Tally::default()),
                ToKeep::Done(t) => return (parts, t),
                ToKeep::Part { part, key, bytes } => {
                    assert_eq!(key, LEARNED_KEYS[part]);
                    let mut want = [0; MAX_LEN];
                    let n = c.learned().encode_part(part, &mut want).unwrap();
                    assert_eq!(bytes, &want[..n], "part {part} as the core has it");
                    parts.push(part);
                    k.kept(part, ok);
                }
            }
        }
    }

    /// A core whose host `h` learned a thermal factor of `f`.
    fn learned_host(c: &mut Core, h: usize, f: f32) {
        let mut l = c.learned();
        l.hosts[h].value = f;
        l.hosts[h].fed_s = 3_600.0;
        c.restore_learned(&l).unwrap();
    }

    #[test]
    fn the_keys_are_cdu_learned_and_the_part_number() {
        for (n, key) in LEARNED_KEYS.iter().enumerate() {
            assert_eq!(*key, std::format!("cdu.learned.{n}"));
        }
        assert_eq!(LEARNED_EVERY_MS, 600_000);
    }

    #[test]
    fn a_part_is_changed_unless_the_flash_is_known_to_hold_its_bytes() {
        assert!(changed(None, &[1, 2]));
        assert!(changed(Some(&[1, 3]), &[1, 2]));
        assert!(changed(Some(&[1, 2, 0]), &[1, 2]));
        assert!(!changed(Some(&[1, 2]), &[1, 2]));
    }

    #[test]
    fn the_first_keep_is_due_one_period_after_the_start_and_writes_every_part() {
        let c = core();
        let mut k = LearnedKeeper::new();
        assert!(!k.begin(&c, LEARNED_EVERY_MS - 1));
        assert_eq!(k.to_keep(), ToKeep::Nothing);
        let (parts, t) = keep(&mut k, &c, LEARNED_EVERY_MS, true);
        assert_eq!(parts, (0..PARTS).collect::<Vec<_>>());
        assert_eq!(
            t,
            Tally {
                written: PARTS as u8,
                failed: 0
            }
        );
        // Not again before the next period.
        assert!(!k.begin(&c, 2 * LEARNED_EVERY_MS - 1));
    }

    #[test]
    fn only_the_parts_whose_bytes_changed_are_written_again() {
        let mut c = core();
        let mut k = LearnedKeeper::new();
        keep(&mut k, &c, LEARNED_EVERY_MS, true);
        let (parts, _) = keep(&mut k, &c, 2 * LEARNED_EVERY_MS, true);
        assert!(parts.is_empty(), "nothing changed: {parts:?}");
        // Host 9 is in part 2 (hosts 8..16).
        learned_host(&mut c, 9, 1.3);
        let (parts, t) = keep(&mut k, &c, 3 * LEARNED_EVERY_MS, true);
        assert_eq!(parts, [2]);
        assert_eq!(
            t,
            Tally {
                written: 1,
                failed: 0
            }
        );
    }

    #[test]
    fn a_part_that_did_not_go_in_is_written_at_the_next_keep() {
        let mut c = core();
        let mut k = LearnedKeeper::new();
        keep(&mut k, &c, LEARNED_EVERY_MS, true);
        learned_host(&mut c, 0, 1.2);
        let (parts, t) = keep(&mut k, &c, 2 * LEARNED_EVERY_MS, false);
        assert_eq!((parts.as_slice(), t.failed), ([1].as_slice(), 1));
        let (parts, _) = keep(&mut k, &c, 3 * LEARNED_EVERY_MS, true);
        assert_eq!(parts, [1]);
    }

    #[test]
    fn what_the_flash_held_at_start_is_not_written_again_unless_it_changed() {
        let mut c = core();
        learned_host(&mut c, 20, 0.8);
        let mut k = LearnedKeeper::new();
        let mut buf = [0; MAX_LEN];
        for part in 0..PARTS {
            let n = c.learned().encode_part(part, &mut buf).unwrap();
            k.held(part, &buf[..n]);
        }
        // Part 5 held damaged bytes: it is written anew.
        k.held(5, &[9; 89]);
        let (parts, _) = keep(&mut k, &c, LEARNED_EVERY_MS, true);
        assert_eq!(parts, [5]);
    }

    #[test]
    fn a_keep_left_between_parts_goes_on_from_the_figures_it_began_with() {
        let mut c = core();
        let mut k = LearnedKeeper::new();
        assert!(k.begin(&c, LEARNED_EVERY_MS));
        let ToKeep::Part { part: 0, .. } = k.to_keep() else {
            panic!("part 0 first");
        };
        k.kept(0, true);
        // Out of time; meanwhile the core learns more.
        learned_host(&mut c, 0, 1.5);
        let before = c.learned();
        assert!(k.begin(&c, LEARNED_EVERY_MS + 1_000), "still under way");
        let ToKeep::Part { part: 1, bytes, .. } = k.to_keep() else {
            panic!("part 1 next");
        };
        let mut now = [0; MAX_LEN];
        let n = before.encode_part(1, &mut now).unwrap();
        assert_ne!(bytes, &now[..n], "the figures the keep began with");
        // Asking again without an answer hands out the same part.
        let ToKeep::Part { part: 1, .. } = k.to_keep() else {
            panic!("part 1 again");
        };
        // An answer for another part is not taken.
        k.kept(7, true);
        let ToKeep::Part { part: 1, .. } = k.to_keep() else {
            panic!("part 1 still");
        };
        for part in 1..PARTS {
            k.kept(part, true);
            let _ = k.to_keep();
        }
        assert_eq!(k.to_keep(), ToKeep::Nothing);
        // The next keep takes the new figures: part 1 changed.
        let (parts, _) = keep(&mut k, &c, 2 * LEARNED_EVERY_MS + 1_000, true);
        assert_eq!(parts, [1]);
    }
}
