//! A config-store sector damaged whole (zeroed, garbage), found at start
//! (`loopwarden_flash::config::damaged_sectors`, each sector read alone,
//! nothing written). The store below reads a key's newest copy and looks
//! back through older sectors when the newer hold none, so a sector lost
//! whole is passed over without an error: a latched leak or a pump's trip
//! whose record it held reads as the record before (not latched), and the
//! mark ([`super::KEPT_KEY`]) an older copy of which survives agrees. So
//! a damaged sector not noted by an earlier start makes the record read
//! as unreadable ([`LoadError::Damaged`], naming the sector), whatever
//! the store reads: the decision path's rule for an unreadable record
//! then applies (the record kept as it is, no valve written until the
//! CDU answers, each rack whose valve it reports closed latched), and
//! says so on the console and to the gateway. A check that fails reads
//! the record as unreadable too ([`LoadError::Unchecked`]).
//!
//! The sectors found are noted
//! (`loopwarden_flash::config::DAMAGE_KEY`) once the relatch's record
//! has gone in ([`Damage::to_note`]), so that a later start finding the
//! same sector (until the store reuses it) says it as a warning and reads
//! the record; a start stopped before then finds it new again.
//!
//! Glossary:
//! - *damage found*: sectors damaged at this start; *new*: not noted by
//!   an earlier start.

use core::fmt;

use cooling_decide::LatchRecord;
use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use loopwarden_flash::config::{damaged_sectors, DamagedSectors};
use loopwarden_flash::ConfigStore;

use super::{LoadError, ReadCause};

/// What the check of the config store's sectors found at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// The damaged sectors found.
    pub found: DamagedSectors,
    /// Those noted by an earlier start (a note that does not read notes
    /// none).
    pub noted: DamagedSectors,
    /// The check failed: why.
    pub failed: Option<ReadCause>,
}

/// Checks the config store's sectors in `range` of `flash`, before the
/// store is opened on it: what [`Damage::noted`] holds is read with
/// [`Damage::read_note`] once it is.
pub async fn check<S: MultiwriteNorFlash>(flash: &mut S, range: core::ops::Range<u32>) -> Damage
where
    S::Error: fmt::Display,
{
    let (found, failed) = match damaged_sectors(flash, range).await {
        Ok(found) => (found, None),
        Err(e) => (DamagedSectors::new(), Some(ReadCause::of(&e, 0))),
    };
    Damage {
        found,
        noted: DamagedSectors::new(),
        failed,
    }
}

impl Damage {
    /// Reads the sectors an earlier start noted from `store`.
    pub async fn read_note<S: MultiwriteNorFlash>(&mut self, store: &mut ConfigStore<S>) {
        self.noted = store.damage_noted().await.unwrap_or_default();
    }

    /// Found sectors not noted by an earlier start.
    pub fn new_sectors(&self) -> impl Iterator<Item = u32> + '_ {
        let noted = &self.noted;
        (self.found.iter())
            .filter(move |s| !noted.contains(s))
            .map(|s| s.at)
    }

    /// Found sectors an earlier start noted.
    pub fn known_sectors(&self) -> impl Iterator<Item = u32> + '_ {
        let noted = &self.noted;
        (self.found.iter())
            .filter(move |s| noted.contains(s))
            .map(|s| s.at)
    }

    /// Why the record cannot be believed, whatever the store reads: a
    /// new damaged sector, or the check failed. `None`: the record reads
    /// as the store has it.
    pub fn unreadable(&self) -> Option<LoadError> {
        if let Some(cause) = &self.failed {
            return Some(LoadError::Unchecked(cause.clone()));
        }
        let mut new = self.new_sectors();
        let at = new.next()?;
        Some(LoadError::Damaged {
            at,
            more: new.count() as u8,
        })
    }

    /// What the flash held of the record (`read`, as [`super::load`] read
    /// it) once this is heard: unreadable on a new damaged sector.
    pub fn judge(&self, read: &mut Result<Option<LatchRecord>, LoadError>) {
        if let Some(e) = self.unreadable() {
            *read = Err(e);
        }
    }

    /// The sectors to note, when the note differs from what was found
    /// (none after a check that failed): at start when the record was
    /// read ([`Damage::unreadable`] is `None`), else once the relatch's
    /// record has gone in.
    pub fn to_note(&self) -> Option<&DamagedSectors> {
        (self.failed.is_none() && self.found != self.noted).then_some(&self.found)
    }
}

/// Says what `damage` found on `out`, a line each: a new sector as an
/// error, one an earlier start noted as a warning, a check that failed.
pub fn say(out: &mut impl fmt::Write, damage: &Damage) -> fmt::Result {
    for at in damage.new_sectors() {
        writeln!(
            out,
            "flash: error: config store: the sector at {at:#x} is damaged (zeroed or garbage: it reads closed, yet not one of its items reads): what it held newest is lost and the store reads the copies before in its place, so the latched record is read as unreadable, never its older copy believed; the sector is reused when the store comes round to it"
        )?;
    }
    for at in damage.known_sectors() {
        writeln!(
            out,
            "flash: warning: config store: the sector at {at:#x} is still damaged, as an earlier start found it (the latched record was relatched then); it is reused when the store comes round to it"
        )?;
    }
    if let Some(cause) = &damage.failed {
        writeln!(
            out,
            "flash: error: config store: its sectors could not be checked for damage ({cause}): the latched record is read as unreadable"
        )?;
    }
    Ok(())
}
