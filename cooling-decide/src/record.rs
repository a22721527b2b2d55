//! The latched state as kept in flash, with its generation
//! ([`LatchRecord`]): the items a config store keeps it in, and how they
//! read back, believed or refused and why ([`RecordError`]).
//!
//! The record under [`LATCHED_KEY`] is the generation (u32 LE) then
//! [`Latched::encode`]'s bytes, and [`LATCHED_GEN_KEY`] holds the same
//! generation alone, written after the record. A store that returns the
//! newest *valid* item of a key would read a damaged newest record as the
//! older state it replaced: its generation then is below the one kept
//! apart, and the record reads as unreadable, never as the older state.
//! A record one generation ahead of the one kept apart is believed: a cut
//! (power lost, a reset) came between the two items, or the newest
//! generation item is damaged, and the record itself passed the store's
//! check and decodes: it is the newest state decided (a tripped pump, a
//! failed isolation), which a relatch from the valve positions would lose.
//! So is the first record ever (generation 1) with no generation item at
//! all: the cut came before the first generation went in. After a record
//! that cannot be believed, the records written anew go above the
//! generation kept apart ([`generation_written`]), so a cut after the
//! relatch's record finds it one ahead too.
//!
//! Glossary:
//! - *generation*: counts the records written, from 1; 0 for a record of
//!   the format before generations.

use core::fmt;

use cooling_core::latch::{LatchError, LEN};
use cooling_core::Latched;
use serde::{Deserialize, Serialize};

/// The config key of the latched state.
pub const LATCHED_KEY: &str = "cdu.latched";
/// The config key of the latched state's generation.
pub const LATCHED_GEN_KEY: &str = "cdu.latched.gen";

/// The bytes of the record's item: the generation, then the state.
pub const RECORD_LEN: usize = 4 + LEN;

/// One item's bytes.
pub type Item = heapless::Vec<u8, RECORD_LEN>;

/// The latched state as kept in flash, with its generation (see the
/// module's note).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatchRecord {
    /// Counts the records written, from 1.
    pub generation: u32,
    /// The state.
    #[serde(with = "latched_bytes")]
    pub latched: Latched,
}

/// Why a latched record read back cannot be believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordError {
    /// The generation item is `len` bytes, not 4.
    GenerationLength(usize),
    /// The record's state does not decode.
    State(LatchError),
    /// A record past the first (generation 1) with no generation beside
    /// it, of a length only a record with one has.
    GenerationMissing,
    /// No record, while its generation `g` was written.
    RecordMissing(u32),
    /// A record of `len` bytes, too short for a generation.
    TooShort(usize),
    /// The newest readable record is generation `record`, but `written`
    /// was written.
    Damaged {
        /// The record's generation.
        record: u32,
        /// The generation written last.
        written: u32,
    },
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::GenerationLength(n) => {
                write!(f, "{LATCHED_GEN_KEY}: {n} bytes, expected 4")
            }
            Self::State(e) => write!(f, "{LATCHED_KEY}: {e}"),
            Self::GenerationMissing => write!(
                f,
                "{LATCHED_KEY}: its generation ({LATCHED_GEN_KEY}) is missing"
            ),
            Self::RecordMissing(g) => write!(
                f,
                "{LATCHED_KEY}: missing, while {LATCHED_GEN_KEY} says generation {g} was written"
            ),
            Self::TooShort(n) => write!(f, "{LATCHED_KEY}: {n} bytes, too short"),
            Self::Damaged { record, written } => write!(
                f,
                "{LATCHED_KEY}: the newest readable record is generation {record}, but generation {written} was written: the newest record is damaged"
            ),
        }
    }
}

impl LatchRecord {
    /// The config items that keep this record, in the order they are
    /// written: the record, then its generation.
    pub fn items(&self) -> [(&'static str, Item); 2] {
        let gen = self.generation.to_le_bytes();
        let mut record = Item::new();
        let mut alone = Item::new();
        // Both fit by construction (4 + LEN and 4 bytes).
        let _ = record.extend_from_slice(&gen);
        let _ = record.extend_from_slice(&self.latched.encode());
        let _ = alone.extend_from_slice(&gen);
        [(LATCHED_KEY, record), (LATCHED_GEN_KEY, alone)]
    }

    /// The record of the two items as read back (`record` under
    /// [`LATCHED_KEY`], `gen` under [`LATCHED_GEN_KEY`]; `None`: absent):
    /// `Ok(None)` when neither was ever written; why not when they cannot
    /// be believed. A record of [`LEN`] bytes with no generation is the
    /// format before generations, read as it is; one of generation 1 with
    /// none is the first record, cut from its generation, believed.
    pub fn decode(record: Option<&[u8]>, gen: Option<&[u8]>) -> Result<Option<Self>, RecordError> {
        let gen = gen
            .map(|g| {
                <[u8; 4]>::try_from(g)
                    .map(u32::from_le_bytes)
                    .map_err(|_| RecordError::GenerationLength(g.len()))
            })
            .transpose()?;
        let decoded = |b: &[u8]| Latched::decode(b).map_err(RecordError::State);
        match (record, gen) {
            (None, None) => Ok(None),
            (Some(b), None) if b.len() == LEN => Ok(Some(Self {
                generation: 0,
                latched: decoded(b)?,
            })),
            // The first record ever, cut from its generation: no
            // generation item was ever written.
            (Some(b), None) => match b.split_first_chunk::<4>() {
                Some((head, body)) if b.len() == RECORD_LEN && u32::from_le_bytes(*head) == 1 => {
                    Ok(Some(Self {
                        generation: 1,
                        latched: decoded(body)?,
                    }))
                }
                _ => Err(RecordError::GenerationMissing),
            },
            (None, Some(g)) => Err(RecordError::RecordMissing(g)),
            (Some(b), Some(g)) => {
                let Some((head, body)) = b.split_first_chunk::<4>() else {
                    return Err(RecordError::TooShort(b.len()));
                };
                let r = u32::from_le_bytes(*head);
                if r != g && r != next_generation(g) {
                    return Err(RecordError::Damaged {
                        record: r,
                        written: g,
                    });
                }
                Ok(Some(Self {
                    generation: r,
                    latched: decoded(body)?,
                }))
            }
        }
    }
}

impl LatchRecord {
    /// The generation item to write at a start, when this record (read
    /// with `gen` kept apart) was believed one ahead of it: the write a
    /// cut interrupted, completed. Without it the next record would be
    /// two ahead of the generation kept apart until its own generation
    /// went in, and a cut between those two would be refused as damaged.
    /// The first record ever, believed with no generation item beside
    /// it, gets its generation 1 written alike. `None` when the two
    /// agree, or for a record of the format before generations.
    pub fn catch_up(&self, gen: Option<&[u8]>) -> Option<(&'static str, Item)> {
        let [_, alone] = self.items();
        let Some(gen) = gen else {
            return (self.generation == 1).then_some(alone);
        };
        let g = u32::from_le_bytes(<[u8; 4]>::try_from(gen).ok()?);
        (g != self.generation).then_some(alone)
    }
}

/// The generation the generation item (`gen`, under [`LATCHED_GEN_KEY`]
/// as read back) says was written last; `None` when it is absent or does
/// not read as one. After a record that cannot be believed, the records
/// written anew go above it ([`crate::latch::LatchKeeper::continue_above`]).
pub fn generation_written(gen: Option<&[u8]>) -> Option<u32> {
    <[u8; 4]>::try_from(gen?).ok().map(u32::from_le_bytes)
}

/// The generation written after `g` (from 1 again after `u32::MAX`).
pub fn next_generation(g: u32) -> u32 {
    g.wrapping_add(1).max(1)
}

/// [`Latched`] in a trace: its flash encoding's bytes.
mod latched_bytes {
    use cooling_core::latch::LEN;
    use cooling_core::Latched;
    use serde::{de::Error as _, Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(l: &Latched, s: S) -> Result<S::Ok, S::Error> {
        l.encode().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Latched, D::Error> {
        let b = <[u8; LEN]>::deserialize(d)?;
        Latched::decode(&b).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    #[test]
    fn a_record_reads_back_as_written_and_a_damaged_one_says_why() {
        let latched = Latched {
            leaks: 0b0101,
            ..Latched::default()
        };
        let r = LatchRecord {
            generation: 7,
            latched,
        };
        let [(k1, rec), (k2, gen)] = r.items();
        assert_eq!((k1, k2), (LATCHED_KEY, LATCHED_GEN_KEY));
        assert_eq!(rec.len(), RECORD_LEN);
        assert_eq!(LatchRecord::decode(Some(&rec), Some(&gen)), Ok(Some(r)));
        assert_eq!(LatchRecord::decode(None, None), Ok(None));
        let newer = 8u32.to_le_bytes();
        let e = LatchRecord::decode(Some(&rec), Some(&newer)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cdu.latched: the newest readable record is generation 7, but generation 8 was written: the newest record is damaged"
        );
        // A cut between the two items (or the newest generation item
        // damaged): the record is one ahead, and believed.
        let one_behind = 6u32.to_le_bytes();
        assert_eq!(
            LatchRecord::decode(Some(&rec), Some(&one_behind)),
            Ok(Some(r))
        );
        // Believed one ahead, the generation kept apart is caught up at
        // the start; in step, or of the older format, nothing is written.
        assert_eq!(
            r.catch_up(Some(&one_behind)),
            Some((LATCHED_GEN_KEY, gen.clone()))
        );
        assert_eq!(r.catch_up(Some(&gen)), None);
        assert_eq!(r.catch_up(None), None);
        let far = 5u32.to_le_bytes();
        assert!(LatchRecord::decode(Some(&rec), Some(&far)).is_err());
        let wrapped = LatchRecord {
            generation: 1,
            latched,
        };
        let [(_, rec1), _] = wrapped.items();
        let max = u32::MAX.to_le_bytes();
        assert_eq!(
            LatchRecord::decode(Some(&rec1), Some(&max)),
            Ok(Some(wrapped))
        );
        let e = LatchRecord::decode(None, Some(&gen)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cdu.latched: missing, while cdu.latched.gen says generation 7 was written"
        );
        let e = LatchRecord::decode(Some(&rec[..3]), Some(&gen)).unwrap_err();
        assert_eq!(e, RecordError::TooShort(3));
        let e = LatchRecord::decode(Some(&rec), Some(&gen[..2])).unwrap_err();
        assert_eq!(e.to_string(), "cdu.latched.gen: 2 bytes, expected 4");
        let before = LatchRecord::decode(Some(&rec[4..]), None).unwrap();
        assert_eq!(
            before.map(|b| (b.generation, b.latched)),
            Some((0, latched))
        );
        assert_eq!(
            LatchRecord::decode(Some(&rec), None),
            Err(RecordError::GenerationMissing)
        );
    }

    /// The first record ever (at commissioning, or after the config
    /// store was erased), cut from its generation: no generation item
    /// was ever written, and the record, generation 1, is believed, its
    /// generation caught up at the start. Any other record without its
    /// generation is not.
    #[test]
    fn a_first_record_cut_from_its_generation_is_believed() {
        let first = LatchRecord {
            generation: 1,
            latched: Latched {
                pumps: [Some(cooling_core::PumpFault::Tripped), None],
                lead: loopwarden_protocol::message::Pump::B,
                ..Latched::default()
            },
        };
        let [(_, rec), (_, gen)] = first.items();
        assert_eq!(LatchRecord::decode(Some(&rec), None), Ok(Some(first)));
        assert_eq!(first.catch_up(None), Some((LATCHED_GEN_KEY, gen.clone())));
        assert_eq!(first.catch_up(Some(&gen)), None);
        let later = LatchRecord {
            generation: 2,
            ..first
        };
        let [(_, rec2), _] = later.items();
        assert_eq!(
            LatchRecord::decode(Some(&rec2), None),
            Err(RecordError::GenerationMissing)
        );
        // A record of the format before generations is not one to catch up.
        let before = LatchRecord::decode(Some(&rec[4..]), None).unwrap().unwrap();
        assert_eq!(before.catch_up(None), None);
    }

    #[test]
    fn the_generation_written_is_read_from_its_item_alone() {
        assert_eq!(generation_written(Some(&7u32.to_le_bytes())), Some(7));
        assert_eq!(generation_written(Some(&[1, 2])), None);
        assert_eq!(generation_written(None), None);
    }
}
