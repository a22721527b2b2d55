//! The latched record in the board's flash: the decision path's
//! [`LatchRecord`] (its format, its generation and how it reads back are
//! `cooling_decide::record`'s, the Linux controller's) written as its
//! config items ([`LatchRecord::items`]: the record, then its
//! generation) through `loopwarden-flash`'s config store, and read back
//! before the first step. The decision path says when to write it and
//! hears whether it went in; this module only moves the bytes.
//!
//! Once a record has gone in, a mark ([`KEPT_KEY`]) is kept beside it:
//! a store that holds the mark but no record has lost the record (the
//! store skips an item whose check fails, a damaged sector's), and reads
//! as unreadable ([`LoadError::Lost`]), never as "nothing latched". A
//! store with neither is one no record ever went into (a boot count
//! alone does not say so: a start may stop before its first step).
//!
//! Glossary:
//! - *item*: one key and its bytes in the config store.
//! - *mark*: the item saying a record was kept in this store.

use core::fmt;

use cooling_decide::record::{
    generation_written, RecordError, LATCHED_GEN_KEY, LATCHED_KEY, RECORD_LEN,
};
use cooling_decide::LatchRecord;
use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use loopwarden_flash::{ConfigStore, StoreError};

/// The config key of the mark that a record was kept in this store.
pub const KEPT_KEY: &str = "fw.latch.kept";

/// The longest cause of an item that could not be read kept, bytes: the
/// store's words, cut there.
pub const CAUSE: usize = 96;

/// Why an item of the record could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadCause {
    /// It is longer than the bytes read for it (`room`): readable, but a
    /// newer, longer format than this firmware's, or another's item.
    TooLong {
        /// The bytes read for it.
        room: usize,
    },
    /// The flash or its store failed (a bus error, a corrupt store), in
    /// the store's words, cut to [`CAUSE`] bytes.
    Store(heapless::String<CAUSE>),
}

impl ReadCause {
    /// The cause of `e`, a read into a buffer of `room` bytes.
    fn of<E: fmt::Display>(e: &StoreError<E>, room: usize) -> Self {
        if matches!(e, StoreError::BadValue) {
            return Self::TooLong { room };
        }
        let mut words = heapless::String::new();
        let _ = fmt::write(&mut Cut(&mut words), format_args!("{e}"));
        Self::Store(words)
    }
}

impl fmt::Display for ReadCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLong { room } => write!(
                f,
                "too long: more than the {room} bytes read for it (a newer, longer format?)"
            ),
            Self::Store(words) => f.write_str(words),
        }
    }
}

/// Writes into a string up to its room, the rest cut.
struct Cut<'a>(&'a mut heapless::String<CAUSE>);

impl fmt::Write for Cut<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            if self.0.push(c).is_err() {
                break;
            }
        }
        Ok(())
    }
}

/// Why the kept record cannot be believed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// The flash store failed reading `key`.
    Unreadable {
        /// The key.
        key: &'static str,
        /// Why.
        cause: ReadCause,
    },
    /// The items read back, but do not make a record that can be
    /// believed.
    Record(RecordError),
    /// Neither the record nor its generation is in the store, and the
    /// mark says one was kept: the flash lost it.
    Lost,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreadable { key, cause } => write!(f, "{key}: unreadable in flash: {cause}"),
            Self::Record(e) => e.fmt(f),
            Self::Lost => write!(
                f,
                "the latched record is missing from flash, though an earlier start kept one ({KEPT_KEY} is set): the flash lost it (a damaged sector?), so what was latched is unknown"
            ),
        }
    }
}

/// Writes `r` to `store`: its items in order, stopping at the first that
/// fails.
pub async fn save<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    r: &LatchRecord,
) -> Result<(), StoreError<S::Error>> {
    for (key, bytes) in r.items() {
        store.set(key, &bytes).await?;
    }
    Ok(())
}

/// Keeps the mark that a record went into `store` ([`KEPT_KEY`]), unless
/// it is there already.
pub async fn mark<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
) -> Result<(), StoreError<S::Error>> {
    let mut b = [0u8; 4];
    if store.get(KEPT_KEY, &mut b).await?.is_none() {
        store.set(KEPT_KEY, &[1]).await?;
    }
    Ok(())
}

/// The record in `store`: `None` when none was ever written (no record
/// and no mark); a record lost since it was kept is [`LoadError::Lost`].
pub async fn load<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
) -> Result<Option<LatchRecord>, LoadError>
where
    S::Error: fmt::Display,
{
    // Room for more than a record: a longer item reads back, and the
    // record's decoding says what is wrong with it.
    let mut rec = [0u8; 2 * RECORD_LEN];
    let mut gen = [0u8; 16];
    let unreadable = |key, room| {
        move |e: StoreError<S::Error>| LoadError::Unreadable {
            key,
            cause: ReadCause::of(&e, room),
        }
    };
    let n = (store.get(LATCHED_KEY, &mut rec).await).map_err(unreadable(LATCHED_KEY, rec.len()))?;
    let g = (store.get(LATCHED_GEN_KEY, &mut gen).await)
        .map_err(unreadable(LATCHED_GEN_KEY, gen.len()))?;
    let read = LatchRecord::decode(n.map(|n| &rec[..n]), g.map(|g| &gen[..g]));
    if let Ok(Some(r)) = &read {
        if let Some((key, item)) = r.catch_up(g.map(|g| &gen[..g])) {
            // The record read is right whatever comes of this write; one
            // that fails leaves only a second cut's window open, and a
            // store that cannot write says so at the next record.
            let _ = store.set(key, &item).await;
        }
    }
    if !matches!(read, Ok(None)) {
        return read.map_err(LoadError::Record);
    }
    match store.get(KEPT_KEY, &mut gen).await {
        Ok(None) => Ok(None),
        Ok(Some(_)) => Err(LoadError::Lost),
        Err(e) => Err(unreadable(KEPT_KEY, gen.len())(e)),
    }
}

/// The generation the generation item in `store` holds beside a record
/// that could not be read or believed (`read`): the records written after
/// the relatch go above it (`Decider::continue_above`), so a cut between
/// the first of them and its generation leaves it one ahead, believed.
/// `None` after a record believed or none ever written, or where the item
/// is absent or does not read as a generation.
pub async fn relatch_floor<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    read: &Result<Option<LatchRecord>, LoadError>,
) -> Option<u32> {
    read.as_ref().err()?;
    let mut gen = [0u8; 16];
    let n = store.get(LATCHED_GEN_KEY, &mut gen).await.ok()??;
    generation_written(Some(&gen[..n]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_on::block_on;
    use crate::board::nor::RamNor;
    use cooling_core::{Latched, PumpFault};
    use loopwarden_protocol::message::Pump;
    use std::string::ToString;

    fn store(mem: &mut [u8]) -> ConfigStore<RamNor<'_>> {
        ConfigStore::open(RamNor::new(mem), 0..4 * 4096).unwrap()
    }

    #[test]
    fn a_record_survives_a_reopen_through_the_flash_crate() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = store(&mut mem);
        assert_eq!(block_on(load(&mut s)), Ok(None));
        let r = LatchRecord {
            generation: 1,
            latched: Latched {
                leaks: 0b100,
                pumps: [Some(PumpFault::Tripped), None],
                lead: Pump::B,
                ..Latched::default()
            },
        };
        block_on(save(&mut s, &r)).unwrap();
        let _ = s.into_flash();
        let mut s = store(&mut mem);
        assert_eq!(block_on(load(&mut s)), Ok(Some(r)));
        let r2 = LatchRecord {
            generation: 2,
            latched: Latched::default(),
        };
        block_on(save(&mut s, &r2)).unwrap();
        assert_eq!(block_on(load(&mut s)), Ok(Some(r2)));
    }

    #[test]
    fn a_generation_that_is_not_the_records_reads_as_damaged() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = store(&mut mem);
        let r = LatchRecord {
            generation: 3,
            latched: Latched {
                leaks: 0b10,
                ..Latched::default()
            },
        };
        block_on(save(&mut s, &r)).unwrap();
        // A newer generation went in, and its record did not.
        block_on(s.set(LATCHED_GEN_KEY, &4u32.to_le_bytes())).unwrap();
        let e = block_on(load(&mut s)).unwrap_err();
        assert_eq!(
            e,
            LoadError::Record(RecordError::Damaged {
                record: 3,
                written: 4
            })
        );
        assert!(
            e.to_string().ends_with("the newest record is damaged"),
            "{e}"
        );
    }

    /// Power lost between the first record ever (commissioning, or a
    /// config store erased) and its generation: the record is believed,
    /// its tripped pump stays tripped with the lead on the other, and
    /// the start writes its generation.
    #[test]
    fn a_first_record_cut_from_its_generation_is_believed() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = store(&mut mem);
        let r = LatchRecord {
            generation: 1,
            latched: Latched {
                pumps: [Some(PumpFault::Tripped), None],
                lead: Pump::B,
                ..Latched::default()
            },
        };
        let [(key, record), _] = r.items();
        block_on(s.set(key, &record)).unwrap();
        assert_eq!(block_on(load(&mut s)), Ok(Some(r)));
        let mut gen = [0u8; 4];
        let n = block_on(s.get(LATCHED_GEN_KEY, &mut gen)).unwrap();
        assert_eq!(n.map(|n| &gen[..n]), Some(&1u32.to_le_bytes()[..]));
    }

    /// A record that does not read: the generation its item holds is
    /// what the records after the relatch go above; none where the item
    /// is absent or does not read as one.
    #[test]
    fn the_generation_written_is_read_beside_an_unreadable_record() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = store(&mut mem);
        let read = block_on(load(&mut s));
        assert_eq!(block_on(relatch_floor(&mut s, &read)), None);
        block_on(s.set(LATCHED_GEN_KEY, &7u32.to_le_bytes())).unwrap();
        let read = block_on(load(&mut s));
        assert!(read.is_err());
        assert_eq!(block_on(relatch_floor(&mut s, &read)), Some(7));
        block_on(s.set(LATCHED_GEN_KEY, &[7])).unwrap();
        let read = block_on(load(&mut s));
        assert!(read.is_err());
        assert_eq!(block_on(relatch_floor(&mut s, &read)), None);
        // Beside a record believed, nothing.
        let r = LatchRecord {
            generation: 8,
            latched: Latched::default(),
        };
        block_on(save(&mut s, &r)).unwrap();
        let read = block_on(load(&mut s));
        assert_eq!(read, Ok(Some(r)));
        assert_eq!(block_on(relatch_floor(&mut s, &read)), None);
    }

    /// Power lost (or a reset) between a record and its generation: the
    /// record, one generation ahead, is believed, and a pump tripped in it
    /// stays tripped with the lead on the other.
    #[test]
    fn a_record_cut_from_its_generation_is_believed() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = store(&mut mem);
        let first = LatchRecord {
            generation: 1,
            latched: Latched::default(),
        };
        block_on(save(&mut s, &first)).unwrap();
        let tripped = LatchRecord {
            generation: 2,
            latched: Latched {
                pumps: [Some(PumpFault::Tripped), None],
                lead: Pump::B,
                ..Latched::default()
            },
        };
        let [(key, record), _] = tripped.items();
        block_on(s.set(key, &record)).unwrap();
        assert_eq!(block_on(load(&mut s)), Ok(Some(tripped)));
        // The start wrote the generation the cut left behind: the next
        // record, cut from its generation too, is one ahead again.
        let next = LatchRecord {
            generation: 3,
            ..tripped
        };
        let [(key, record), _] = next.items();
        block_on(s.set(key, &record)).unwrap();
        assert_eq!(block_on(load(&mut s)), Ok(Some(next)));
    }

    /// Flips a byte in every item whose key starts `cdu.latched` (the
    /// record and its generation), as a damaged sector would: the store
    /// skips them.
    fn damage_record(mem: &mut [u8]) -> usize {
        let key = LATCHED_KEY.as_bytes();
        let at: std::vec::Vec<usize> = (0..mem.len() - key.len())
            .filter(|&i| &mem[i..i + key.len()] == key)
            .collect();
        for &i in &at {
            mem[i] ^= 0x01;
        }
        at.len()
    }

    #[test]
    fn a_record_lost_after_it_was_kept_reads_as_unreadable_never_as_none() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = store(&mut mem);
        let r = LatchRecord {
            generation: 1,
            latched: Latched {
                leaks: 0b1,
                ..Latched::default()
            },
        };
        block_on(save(&mut s, &r)).unwrap();
        block_on(mark(&mut s)).unwrap();
        let _ = s.into_flash();
        assert_eq!(damage_record(&mut mem), 2, "the record and its generation");
        let mut s = store(&mut mem);
        let e = block_on(load(&mut s)).unwrap_err();
        assert_eq!(e, LoadError::Lost);
        assert!(e.to_string().contains("missing from flash"), "{e}");
    }

    #[test]
    fn a_store_no_record_went_into_reads_as_none_whatever_its_boot_count() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = store(&mut mem);
        // Starts that stopped before their first step kept no record.
        block_on(crate::counters::count_boot(&mut s)).unwrap();
        block_on(crate::counters::count_boot(&mut s)).unwrap();
        assert_eq!(block_on(load(&mut s)), Ok(None));
    }

    #[test]
    fn an_item_longer_than_its_buffer_fails_naming_its_cause() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = store(&mut mem);
        // A newer, longer format: readable, but more than is read for it.
        block_on(s.set(LATCHED_KEY, &[0x11; 2 * RECORD_LEN + 1])).unwrap();
        let e = block_on(load(&mut s)).unwrap_err();
        let said = e.to_string();
        assert!(said.starts_with(LATCHED_KEY), "{said}");
        assert!(said.contains("too long"), "{said}");
        assert!(
            said.contains(&std::format!("{} bytes", 2 * RECORD_LEN)),
            "{said}"
        );
        // The same for the generation.
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = store(&mut mem);
        block_on(s.set(LATCHED_GEN_KEY, &[0x22; 17])).unwrap();
        let said = block_on(load(&mut s)).unwrap_err().to_string();
        assert!(said.starts_with(LATCHED_GEN_KEY), "{said}");
        assert!(said.contains("too long"), "{said}");
    }

    #[test]
    fn the_mark_is_written_once() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = store(&mut mem);
        block_on(mark(&mut s)).unwrap();
        let _ = s.into_flash();
        let before = mem.clone();
        let mut s = store(&mut mem);
        block_on(mark(&mut s)).unwrap();
        let _ = s.into_flash();
        assert!(before == mem, "a mark already there is not written again");
    }
}
