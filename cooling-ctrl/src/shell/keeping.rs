//! What the shell keeps in the controller's flash besides the latched
//! record (which goes through the decision path): the sequence floor,
//! what the core learned, and the limits the BMS set, each handed to the
//! recorder without waiting; what a full queue did not take goes at the
//! next keep.
use super::*;

/// What the shell keeps in the controller's flash besides the latched
/// record's path through the decision path.
pub(super) struct Keeping {
    pub(super) recorder: Recorder,
    pub(super) seq_floor: SeqFloor,
    /// Which parts of the learned figures changed since they were last
    /// handed to the recorder, and when the next keep is due (the
    /// firmware's keeper, `cooling_decide::learned`).
    pub(super) learned: Box<LearnedKeeper>,
    /// The BMS's limits in force on their way to flash: handed again at
    /// the next step while the queue is full or the flash refuses them.
    pub(super) bms: journal::BmsKeeping,
    /// The mark that a latched record was kept
    /// ([`journal::LATCH_KEPT_KEY`]) went into flash in this process.
    pub(super) latch_marked: bool,
}

/// The keeper of what was learned, knowing what the flash held at start
/// (`records`), so a restart writes again only the parts that changed.
pub(super) fn learned_keeper(records: &LearnedRecords) -> Box<LearnedKeeper> {
    let mut k = Box::new(LearnedKeeper::new());
    for part in 0..journal::LEARNED_KEYS.len() {
        if let Some(bytes) = records.bytes(part) {
            k.held(part, bytes);
        }
    }
    k
}

impl<P: CduPort> Shell<P> {
    /// Hands what the core learned to the recorder when a keep is due at
    /// `now` (shell ms; `stopping`: at once), each part whose bytes
    /// changed since it was last handed over, without waiting (a part the
    /// recorder's full queue dropped goes at the next keep).
    pub(super) fn keep_learned(&mut self, now: u64, stopping: bool) {
        let (k, core) = (&mut self.keeping, self.decider.core());
        if stopping {
            k.learned.begin_now(core, now);
        } else if !k.learned.begin(core, now) {
            return;
        }
        while let ToKeep::Part { part, key, bytes } = k.learned.to_keep() {
            let taken = k.recorder.offer_set(key.to_string(), bytes.to_vec());
            k.learned.kept(part, taken);
        }
    }

    /// Hands the BMS's limits in force to the recorder, if they changed
    /// since they were last kept, without waiting; a full queue or a
    /// flash that refused them leaves them for the next step.
    pub(super) fn keep_bms_limits(&mut self) {
        let k = &mut self.keeping;
        k.bms.offer(&k.recorder);
    }
}
