//! The latched state of the core (leak latches, failed pumps, the lead
//! pump, a failsafe, the sensor faults: `cooling_core::latch`) in the
//! board's flash, through `loopwarden-flash`'s config store, in the
//! Linux controller's format (`cooling_ctrl::journal`): the record under
//! [`LATCHED_KEY`] is its generation (u32 LE) then [`Latched::encode`]'s
//! 16 bytes; [`LATCHED_GEN_KEY`] holds the generation alone, written
//! after the record, so a damaged newest record (which the store would
//! skip for the older one) reads as unreadable, never as the older
//! state. It is written whenever the state changes, before the step's
//! writes reach the CDU, and read back before the first step.
//!
//! Glossary:
//! - *generation*: counts the records written, from 1.
//! - *keeper*: what remembers the state last kept, so a step writes the
//!   flash only when the state changed.

use core::fmt;

use cooling_core::latch::{LatchError, LEN};
use cooling_core::Latched;
use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use loopwarden_flash::{ConfigStore, StoreError};

/// The config key of the latched state.
pub const LATCHED_KEY: &str = "cdu.latched";
/// The config key of its generation.
pub const LATCHED_GEN_KEY: &str = "cdu.latched.gen";

/// The latched state as kept, with its generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatchRecord {
    /// Counts the records written, from 1.
    pub generation: u32,
    /// The state.
    pub latched: Latched,
}

/// Why the kept record cannot be believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatchReadError {
    /// The flash store failed reading `key`.
    Unreadable {
        /// The key.
        key: &'static str,
    },
    /// The generation is not 4 bytes.
    GenerationLength(usize),
    /// A record without its generation.
    NoGeneration,
    /// A generation without its record.
    NoRecord {
        /// The generation written.
        generation: u32,
    },
    /// The newest readable record is not the generation last written.
    Damaged {
        /// The record's generation.
        record: u32,
        /// The generation last written.
        written: u32,
    },
    /// The record is shorter than its generation.
    TooShort(usize),
    /// The state does not decode.
    State(LatchError),
}

impl fmt::Display for LatchReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (k, g) = (LATCHED_KEY, LATCHED_GEN_KEY);
        match self {
            Self::Unreadable { key } => write!(f, "{key}: unreadable in flash"),
            Self::GenerationLength(n) => write!(f, "{g}: {n} bytes, expected 4"),
            Self::NoGeneration => write!(f, "{k}: its generation ({g}) is missing"),
            Self::NoRecord { generation } => {
                write!(f, "{k}: missing, while {g} says generation {generation} was written")
            }
            Self::Damaged { record, written } => write!(
                f,
                "{k}: the newest readable record is generation {record}, but generation {written} was written: the newest record is damaged"
            ),
            Self::TooShort(n) => write!(f, "{k}: {n} bytes, too short"),
            Self::State(e) => write!(f, "{k}: {e}"),
        }
    }
}

impl LatchRecord {
    /// The record's bytes under [`LATCHED_KEY`].
    pub fn record_bytes(&self) -> [u8; 4 + LEN] {
        let mut b = [0u8; 4 + LEN];
        b[..4].copy_from_slice(&self.generation.to_le_bytes());
        b[4..].copy_from_slice(&self.latched.encode());
        b
    }

    /// The record of the two items as read (`None`: absent): `Ok(None)`
    /// when neither was ever written. A 16-byte record with no generation
    /// is the format before generations, read as it is.
    pub fn decode(
        record: Option<&[u8]>,
        gen: Option<&[u8]>,
    ) -> Result<Option<Self>, LatchReadError> {
        let gen = match gen {
            None => None,
            Some(g) => Some(
                <[u8; 4]>::try_from(g)
                    .map(u32::from_le_bytes)
                    .map_err(|_| LatchReadError::GenerationLength(g.len()))?,
            ),
        };
        let state = |b: &[u8]| Latched::decode(b).map_err(LatchReadError::State);
        match (record, gen) {
            (None, None) => Ok(None),
            (Some(b), None) if b.len() == LEN => Ok(Some(Self {
                generation: 0,
                latched: state(b)?,
            })),
            (Some(_), None) => Err(LatchReadError::NoGeneration),
            (None, Some(generation)) => Err(LatchReadError::NoRecord { generation }),
            (Some(b), Some(written)) => {
                let Some((head, body)) = b.split_first_chunk::<4>() else {
                    return Err(LatchReadError::TooShort(b.len()));
                };
                let record = u32::from_le_bytes(*head);
                if record != written {
                    return Err(LatchReadError::Damaged { record, written });
                }
                Ok(Some(Self {
                    generation: record,
                    latched: state(body)?,
                }))
            }
        }
    }
}

/// Writes `r` to `store`: the record, then its generation.
pub async fn save<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    r: &LatchRecord,
) -> Result<(), StoreError<S::Error>> {
    store.set(LATCHED_KEY, &r.record_bytes()).await?;
    store
        .set(LATCHED_GEN_KEY, &r.generation.to_le_bytes())
        .await
}

/// The record in `store`: `None` when none was ever written.
pub async fn load<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
) -> Result<Option<LatchRecord>, LatchReadError> {
    let mut rec = [0u8; 64];
    let mut gen = [0u8; 16];
    let n = store
        .get(LATCHED_KEY, &mut rec)
        .await
        .map_err(|_| LatchReadError::Unreadable { key: LATCHED_KEY })?;
    let g = store
        .get(LATCHED_GEN_KEY, &mut gen)
        .await
        .map_err(|_| LatchReadError::Unreadable {
            key: LATCHED_GEN_KEY,
        })?;
    LatchRecord::decode(n.map(|n| &rec[..n]), g.map(|g| &gen[..g]))
}

/// Remembers the state last kept; says when a step must keep a new one.
#[derive(Debug, Clone, Copy)]
pub struct Keeper {
    kept: Option<LatchRecord>,
}

impl Keeper {
    /// A keeper that last kept `r` (`None`: nothing, or unreadable).
    pub fn new(r: Option<LatchRecord>) -> Self {
        Self { kept: r }
    }

    /// The record to write when `now` differs from what was kept.
    pub fn to_keep(&self, now: Latched) -> Option<LatchRecord> {
        match self.kept {
            Some(k) if k.latched == now => None,
            None if now == Latched::default() => None,
            k => Some(LatchRecord {
                generation: k.map_or(0, |k| k.generation) + 1,
                latched: now,
            }),
        }
    }

    /// `r` is in flash.
    pub fn kept(&mut self, r: LatchRecord) {
        self.kept = Some(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_on::block_on;
    use crate::board::nor::RamNor;
    use cooling_core::PumpFault;
    use loopwarden_protocol::message::Pump;

    fn store(mem: &mut [u8]) -> ConfigStore<RamNor<'_>> {
        ConfigStore::open(RamNor::new(mem), 0..4 * 4096).unwrap()
    }

    #[test]
    fn a_record_survives_a_reopen_through_the_flash_crate() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = store(&mut mem);
        assert_eq!(block_on(load(&mut s)), Ok(None));
        let keeper = Keeper::new(None);
        assert_eq!(
            keeper.to_keep(Latched::default()),
            None,
            "nothing latched, nothing to keep"
        );
        let now = Latched {
            leaks: 0b100,
            pumps: [Some(PumpFault::Tripped), None],
            lead: Pump::B,
            ..Latched::default()
        };
        let r = keeper.to_keep(now).unwrap();
        assert_eq!(r.generation, 1);
        block_on(save(&mut s, &r)).unwrap();
        let _ = s.into_flash();
        let mut s = store(&mut mem);
        let back = block_on(load(&mut s)).unwrap().unwrap();
        assert_eq!(back, r);
        let mut keeper = Keeper::new(Some(back));
        assert_eq!(keeper.to_keep(now), None);
        let cleared = Latched { leaks: 0, ..now };
        let r2 = keeper.to_keep(cleared).unwrap();
        assert_eq!(r2.generation, 2);
        block_on(save(&mut s, &r2)).unwrap();
        keeper.kept(r2);
        assert_eq!(block_on(load(&mut s)).unwrap(), Some(r2));
    }

    #[test]
    fn a_damaged_newest_record_reads_as_damaged_never_as_the_older_state() {
        let older = LatchRecord {
            generation: 1,
            latched: Latched {
                leaks: 0b10,
                ..Latched::default()
            },
        };
        let newer = LatchRecord {
            generation: 2,
            latched: Latched::default(),
        };
        let e = LatchRecord::decode(Some(&older.record_bytes()), Some(&2u32.to_le_bytes()));
        assert_eq!(
            e,
            Err(LatchReadError::Damaged {
                record: 1,
                written: 2
            })
        );
        assert_eq!(
            std::format!("{}", e.unwrap_err()),
            "cdu.latched: the newest readable record is generation 1, but generation 2 was written: the newest record is damaged"
        );
        assert_eq!(
            LatchRecord::decode(Some(&newer.record_bytes()), Some(&2u32.to_le_bytes())),
            Ok(Some(newer))
        );
        assert_eq!(
            LatchRecord::decode(None, Some(&[1, 0, 0])),
            Err(LatchReadError::GenerationLength(3))
        );
        // The format before generations.
        assert_eq!(
            LatchRecord::decode(Some(&older.latched.encode()), None),
            Ok(Some(LatchRecord {
                generation: 0,
                ..older
            }))
        );
    }
}
