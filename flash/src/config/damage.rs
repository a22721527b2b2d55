//! Finding a config-store sector damaged whole (zeroed, or garbage).
//!
//! The store below keeps every value as an item appended to the sector
//! being written, and reads a key's newest copy, looking back through
//! older sectors when the newer hold none. A sector whose bytes were lost
//! whole still reads closed (its state is in its first and last words:
//! both written is closed, in the store's documented layout), holds no
//! item that reads, and is passed over without an error: each key whose
//! newest copy it held reads as its copy before, or as unset. Nothing the
//! store says tells it apart, so each sector is checked on its own: a
//! closed sector was closed because an item did not fit in it, so it
//! holds items; read alone (the others as erased, through salvage's
//! trial flash), one from which the store reads not one is damaged. Only
//! whole-sector loss is found here: a single damaged record among others
//! that read is what a record's check is for.
//!
//! One blind spot: a closed sector whose every item was removed
//! ([`ConfigStore::remove`] erases every copy of a key) reads the same and
//! is said too; no agent removes that much (the floor, written at every
//! start, is never removed).
//!
//! A damaged sector stays until the store comes round to it and reuses
//! it. So that a start says it once, not at every start until then, the
//! sectors found are noted under [`DAMAGE_KEY`] (address and a
//! fingerprint of their bytes) once what they cost is handled; a sector
//! found again with the same bytes is the one noted.
//!
//! Glossary:
//! - *damaged sector* (config store): closed, yet not one item reads in
//!   it.
//! - *fingerprint*: the 32-bit FNV-1a hash of a sector's bytes.

use core::ops::Range;

use embedded_storage_async::nor_flash::{MultiwriteNorFlash, NorFlash, ReadNorFlash};
use sequential_storage::cache::Cache;
use sequential_storage::map::{MapConfig, MapStorage};

use super::{ConfigStore, Key, MAX_KEY, MAX_VALUE};
use crate::error::StoreError;
use crate::salvage::{Trial, TrialError};

/// The config key under which the damaged sectors found and handled are
/// noted: 8 bytes each, the address then the fingerprint, little-endian.
pub const DAMAGE_KEY: &str = "flash.config_damaged";

/// Damaged sectors a check reports, at most (as many as the note holds).
pub const MAX_DAMAGED: usize = MAX_VALUE / 8;

/// A config-store sector damaged whole (see the module note).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DamagedSector {
    /// Its address in the flash.
    pub at: u32,
    /// The fingerprint of its bytes.
    pub print: u32,
}

/// Damaged sectors.
pub type DamagedSectors = heapless::Vec<DamagedSector, MAX_DAMAGED>;

/// The sectors of the config store in `range` of `flash` that are
/// damaged whole (see the module note), read without writing; the first
/// [`MAX_DAMAGED`] of them.
pub async fn damaged_sectors<S: MultiwriteNorFlash>(
    flash: &mut S,
    range: Range<u32>,
) -> Result<DamagedSectors, StoreError<S::Error>> {
    let size = S::ERASE_SIZE as u32;
    let mut found = DamagedSectors::new();
    for at in range.clone().step_by(S::ERASE_SIZE) {
        if !closed(flash, at, size).await? || reads_an_item(flash, range.clone(), at).await? {
            continue;
        }
        let print = fingerprint(flash, at, size).await?;
        if found.push(DamagedSector { at, print }).is_err() {
            break;
        }
    }
    Ok(found)
}

/// Whether the sector at `at` reads closed: its first and last words
/// both written.
async fn closed<S: ReadNorFlash>(
    flash: &mut S,
    at: u32,
    size: u32,
) -> Result<bool, StoreError<S::Error>> {
    const WORD: usize = 4;
    let mut word = [0u8; WORD];
    for offset in [at, at + size - WORD as u32] {
        (flash.read(offset, &mut word).await).map_err(|error| StoreError::Read { at, error })?;
        if word.iter().all(|&b| b == 0xFF) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether the store reads an item in the sector at `at` of `range`,
/// the other sectors read as erased.
async fn reads_an_item<S: NorFlash>(
    flash: &mut S,
    range: Range<u32>,
    at: u32,
) -> Result<bool, StoreError<S::Error>> {
    let sector = at..at + S::ERASE_SIZE as u32;
    let trial = Trial::only(flash, range.clone(), sector);
    let config = MapConfig::try_new(range).map_err(|_| StoreError::Range("not a map range"))?;
    let mut map: MapStorage<Key, _, _> = MapStorage::new(trial, config, Cache::new_uncached());
    let mut buf = [0u8; MAX_KEY + MAX_VALUE + 16];
    let read = match map.fetch_all_items(&mut buf).await {
        Ok(mut items) => items.next::<&[u8]>(&mut buf).await.map(|i| i.is_some()),
        Err(e) => Err(e),
    };
    match read {
        Ok(read) => Ok(read),
        Err(sequential_storage::Error::Storage {
            value: TrialError::Flash(error),
            ..
        }) => Err(StoreError::Read { at, error }),
        // What does not read as the store's items is not an item.
        Err(_) => Ok(false),
    }
}

/// The fingerprint of the sector at `at`.
async fn fingerprint<S: ReadNorFlash>(
    flash: &mut S,
    at: u32,
    size: u32,
) -> Result<u32, StoreError<S::Error>> {
    let mut hash: u32 = 0x811c_9dc5;
    let mut chunk = [0u8; 64];
    for offset in (at..at + size).step_by(chunk.len()) {
        let n = chunk.len().min((at + size - offset) as usize);
        (flash.read(offset, &mut chunk[..n]).await)
            .map_err(|error| StoreError::Read { at, error })?;
        for &b in &chunk[..n] {
            hash = (hash ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
    }
    Ok(hash)
}

impl<S: MultiwriteNorFlash> ConfigStore<S> {
    /// The damaged sectors noted under [`DAMAGE_KEY`] (none when unset).
    pub async fn damage_noted(&mut self) -> Result<DamagedSectors, StoreError<S::Error>> {
        let mut b = [0u8; MAX_VALUE];
        let Some(len) = self.get(DAMAGE_KEY, &mut b).await? else {
            return Ok(DamagedSectors::new());
        };
        if len % 8 != 0 {
            return Err(StoreError::BadValue);
        }
        let mut noted = DamagedSectors::new();
        for e in b[..len].chunks_exact(8) {
            let word = |r: Range<usize>| u32::from_le_bytes(e[r].try_into().unwrap_or([0; 4]));
            let sector = DamagedSector {
                at: word(0..4),
                print: word(4..8),
            };
            noted.push(sector).map_err(|_| StoreError::BadValue)?;
        }
        Ok(noted)
    }

    /// Notes `sectors` under [`DAMAGE_KEY`] as the damaged sectors found
    /// and handled (none: the note emptied).
    pub async fn note_damage(
        &mut self,
        sectors: &[DamagedSector],
    ) -> Result<(), StoreError<S::Error>> {
        let mut b = [0u8; MAX_VALUE];
        let sectors = &sectors[..sectors.len().min(MAX_DAMAGED)];
        for (e, s) in b.chunks_exact_mut(8).zip(sectors) {
            e[..4].copy_from_slice(&s.at.to_le_bytes());
            e[4..].copy_from_slice(&s.print.to_le_bytes());
        }
        self.set(DAMAGE_KEY, &b[..sectors.len() * 8]).await
    }
}
