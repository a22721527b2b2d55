//! A config-store sector damaged whole (zeroed, garbage), found at
//! opening ([`damaged_sectors`]): the store below reads the copies before
//! of what it held newest, without an error, so a GPU quarantined in it
//! would read as healthy and its check, lost with it, agree. Each is said
//! as an error naming its address, and the store is read as lost, as one
//! found without its floor: what the agent kept there is taken back from
//! elsewhere (the event log), never its older copy believed. The sectors
//! found are noted ([`DAMAGE_KEY`]) once the lost mark is kept, so a
//! later start that finds the same sector still there (until the store
//! reuses it) says it as a warning and does not read the store as lost
//! again.
//!
//! Glossary:
//! - *damage found*: sectors damaged at this opening; *new*: not noted
//!   by an earlier start.

use loopwarden_flash::config::{damaged_sectors, DamagedSector, DamagedSectors, DAMAGE_KEY};
use loopwarden_flash::ConfigStore;

use super::{Flash, LOST_MARK_KEY, MARKED};

/// What the check of the config store's sectors found at opening.
#[derive(Debug)]
pub(super) struct Damage {
    /// The damaged sectors found.
    found: DamagedSectors,
    /// Those noted by an earlier start (the note as read).
    noted: DamagedSectors,
    /// The check failed: why.
    failed: Option<String>,
}

impl Damage {
    /// Found sectors not noted by an earlier start.
    fn unnoted(&self) -> impl Iterator<Item = &DamagedSector> {
        self.found.iter().filter(|s| !self.noted.contains(s))
    }

    /// The store is to be read as lost: a new damaged sector, or the
    /// check failed.
    pub(super) fn lost(&self) -> bool {
        self.failed.is_some() || self.unnoted().next().is_some()
    }

    /// What is said of it, for the flash `name`: errors, then warnings.
    pub(super) fn said(&self, name: &str) -> (Vec<String>, Vec<String>) {
        let mut errors: Vec<String> = self.unnoted().map(|s| new_message(name, s.at)).collect();
        if let Some(e) = &self.failed {
            errors.push(format!(
                "{name}: config store: its sectors could not be checked for damage ({e}): the store is read as lost"
            ));
        }
        let warnings = (self.found.iter())
            .filter(|s| self.noted.contains(s))
            .map(|s| format!(
                "{name}: config store: the sector at {:#x} is still damaged, as an earlier start found it (the store was read as lost then); it is reused when the store comes round to it",
                s.at
            ))
            .collect();
        (errors, warnings)
    }
}

/// The error said of a damaged sector at `at` of the flash `name`, new.
fn new_message(name: &str, at: u32) -> String {
    format!(
        "{name}: config store: the sector at {at:#x} is damaged (zeroed or garbage: it reads closed, yet not one of its records reads): what it held newest is lost, and the store reads the copies before in its place, without an error; the store is read as lost: what was kept in it (GPU health, latched state, limits) is unknown, never its older copy believed; the sector is reused when the store comes round to it"
    )
}

/// Checks the sectors of `store`'s `range` of `flash` (the flash `name`)
/// and says what it finds.
pub(super) async fn check(
    flash: &Flash,
    store: &mut ConfigStore<Flash>,
    name: &str,
    range: core::ops::Range<u32>,
) -> Damage {
    let mut reading = flash.clone();
    let (found, failed) = match damaged_sectors(&mut reading, range).await {
        Ok(found) => (found, None),
        Err(e) => (DamagedSectors::new(), Some(e.to_string())),
    };
    // A note that does not read notes nothing: what is found is new.
    let noted = store.damage_noted().await.unwrap_or_default();
    let damage = Damage {
        found,
        noted,
        failed,
    };
    let (errors, warnings) = damage.said(name);
    for e in errors {
        tracing::error!("{e}");
    }
    for w in warnings {
        tracing::warn!("{w}");
    }
    damage
}

/// Notes the sectors `damage` found in `store` (of the flash `name`)
/// where the note differs; a new one only once the lost mark is kept, so
/// that a start stopped between the two finds it new again.
pub(super) async fn note(store: &mut ConfigStore<Flash>, name: &str, damage: &Damage) {
    if damage.failed.is_some() || damage.found == damage.noted {
        return;
    }
    let mut b = [0u8; 1];
    let marked = matches!(store.get(LOST_MARK_KEY, &mut b).await, Ok(Some(1)) if b[0] == MARKED);
    if damage.lost() && !marked {
        return;
    }
    if let Err(e) = store.note_damage(&damage.found).await {
        tracing::error!(
            "{name}: {DAMAGE_KEY}: the damaged sectors found are not noted ({e}): the next start says them again and reads the store as lost again"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;
    use std::path::Path;

    use loopwarden_boards::FlashBoard;
    use loopwarden_flash::{SharedFlash, StoreError};

    use super::super::{image, open};
    use super::*;

    fn set(store: &mut ConfigStore<Flash>, key: &str, value: &[u8]) {
        futures::executor::block_on(store.set(key, value)).unwrap();
    }

    /// The sectors of the config store in the file at `path` holding a
    /// copy of `needle`, in address order.
    fn sectors_with(path: &Path, needle: &[u8]) -> Vec<u32> {
        let bytes = std::fs::read(path).unwrap();
        let config = FlashBoard::host_file().layout().config;
        let mut at: Vec<u32> = (config.start as usize..config.end as usize - needle.len())
            .filter(|&i| &bytes[i..i + needle.len()] == needle)
            .map(|i| i as u32 / 4096 * 4096)
            .collect();
        at.dedup();
        at
    }

    fn damage_of(path: &Path) -> Damage {
        let board = FlashBoard::host_file();
        let flash = SharedFlash::new(image(Some(path), &board).unwrap());
        let range = board.layout().config;
        let mut store = ConfigStore::open(flash.clone(), range.clone()).unwrap();
        futures::executor::block_on(check(&flash, &mut store, "host.flash", range))
    }

    /// The sector holding a GPU's newest health record and its check,
    /// zeroed, an older copy of the floor kept in the sector before: the
    /// store would read the older pair (here: none) and believe it. The
    /// start reads the store as lost and names the sector.
    #[test]
    fn a_zeroed_config_sector_reads_the_store_as_lost_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        let mut first = open(Some(&path)).unwrap();
        // Past the sector the floor went in at this opening, so that its
        // copy there is kept: the floor alone would not say the loss.
        for i in 0..60u32 {
            set(&mut first.store, "test.fill", &[i as u8; 100]);
        }
        set(
            &mut first.store,
            "bus.seq_floor",
            &(first.first_seq + 20_000).to_le_bytes(),
        );
        set(&mut first.store, "health.1", &[0xC7; 12]);
        set(&mut first.store, "health_check.1", &[0x5A; 8]);
        drop(first);
        let at = sectors_with(&path, b"health.1")[0];
        let floors = sectors_with(&path, b"bus.seq_floor");
        assert!(
            floors.contains(&at) && floors[0] < at,
            "{floors:x?} {at:#x}"
        );
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&[0u8; 4096], at.into()).unwrap();
        drop(file);
        let damage = damage_of(&path);
        let (errors, _) = damage.said("host.flash");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with(&format!(
                "host.flash: config store: the sector at {at:#x} is damaged"
            )) && errors[0].contains("read as lost"),
            "{errors:?}"
        );
        let mut again = open(Some(&path)).unwrap();
        assert!(
            again.config_lost,
            "the damaged sector reads the store as lost"
        );
        let mut b = [0u8; 16];
        let health = futures::executor::block_on(again.store.get("health.1", &mut b)).unwrap();
        assert_eq!(
            health, None,
            "what the store reads: the record before (none)"
        );
        drop(again);
        // Said once: the next start finds it noted, still lost until the
        // agent clears the mark, and not after.
        let (errors, warnings) = damage_of(&path).said("host.flash");
        assert!(
            errors.is_empty() && warnings.len() == 1,
            "{errors:?} {warnings:?}"
        );
        let mut kept = open(Some(&path)).unwrap();
        assert!(kept.config_lost, "the mark holds until cleared");
        futures::executor::block_on(super::super::clear_lost(&mut kept.store)).unwrap();
        drop(kept);
        assert!(!open(Some(&path)).unwrap().config_lost, "said once");
    }

    /// Many writes, the store wrapped round several times, and restarts
    /// between: no sector is found damaged, the store not lost.
    #[test]
    fn an_intact_config_store_is_never_found_damaged_after_wraps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        for start in 0..4u32 {
            let mut s = open(Some(&path)).unwrap();
            assert!(!s.config_lost, "start {start}");
            for i in 0..300u32 {
                let key = format!("health.{}", i % 24);
                set(&mut s.store, &key, &[(i + start) as u8; 40]);
                if i % 50 == 0 {
                    futures::executor::block_on(s.store.remove("health.3")).unwrap();
                }
            }
        }
        let damage = damage_of(&path);
        assert!(!damage.lost() && damage.found.is_empty(), "{damage:?}");
    }

    /// A check that fails (a read error) is said, and reads the store as
    /// lost.
    #[test]
    fn a_check_that_fails_reads_the_store_as_lost() {
        let damage = Damage {
            found: DamagedSectors::new(),
            noted: DamagedSectors::new(),
            failed: Some(StoreError::<std::io::Error>::Full.to_string()),
        };
        assert!(damage.lost());
        let (errors, _) = damage.said("host.flash");
        assert!(errors[0].contains("could not be checked"), "{errors:?}");
    }
}
