//! The config store: settings a field engineer changes on the device
//! (key → bytes), and the reservation that keeps frame sequence numbers
//! rising across restarts.
//!
//! Glossary:
//! - *key*: up to 32 bytes of text, `area.name` by convention
//!   (`bus.seq_floor`, `guard.max_c`).
//! - *sequence floor*: the lowest frame sequence number a restarted agent
//!   may use; reserved in blocks so the flash is written once per block,
//!   not once per frame.
//! - *damaged sector*: one whose bytes were lost whole (zeroed, garbage),
//!   found by [`damaged_sectors`] (see `damage`): the store below reads
//!   older copies of what it held, without an error.

use core::ops::Range;

use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use sequential_storage::cache::{Cache, Uncached};
use sequential_storage::map::{MapConfig, MapConfigError, MapStorage};

use crate::error::StoreError;

mod damage;
pub use damage::{damaged_sectors, DamagedSector, DamagedSectors, DAMAGE_KEY, MAX_DAMAGED};

/// Longest key, in bytes.
pub const MAX_KEY: usize = 32;
/// Longest value, in bytes.
pub const MAX_VALUE: usize = 128;

/// A key.
pub type Key = heapless::String<MAX_KEY>;

/// The key of the frame sequence floor.
pub const SEQ_FLOOR_KEY: &str = "bus.seq_floor";

/// The config store over a flash range (see the module note).
pub struct ConfigStore<S: MultiwriteNorFlash> {
    map: MapStorage<Key, S, Cache<Uncached, Uncached, Uncached, Key>>,
    buf: [u8; MAX_KEY + MAX_VALUE + 16],
}

fn key<E>(k: &str) -> Result<Key, StoreError<E>> {
    let mut s = Key::new();
    s.push_str(k)
        .map_err(|_| StoreError::TooLarge { len: k.len() })?;
    Ok(s)
}

impl<S: MultiwriteNorFlash> ConfigStore<S> {
    /// Opens the store in `range` of `flash` (whole sectors, at least two).
    pub fn open(flash: S, range: Range<u32>) -> Result<Self, StoreError<S::Error>> {
        let config = MapConfig::try_new(range).map_err(|e| {
            StoreError::Range(match e {
                MapConfigError::StartRangeNotAtPageBoundary => "start is not at a sector boundary",
                MapConfigError::EndRangeNotAtPageBoundary => "end is not at a sector boundary",
                MapConfigError::RangeTooSmall => "the config store needs at least two sectors",
                MapConfigError::PagesTooSmall => "sectors too small",
                _ => "not accepted by the store",
            })
        })?;
        Ok(Self {
            map: MapStorage::new(flash, config, Cache::new_uncached()),
            buf: [0; MAX_KEY + MAX_VALUE + 16],
        })
    }

    /// The value of `k`, copied into `out`; its length, or `None` if unset.
    pub async fn get(
        &mut self,
        k: &str,
        out: &mut [u8],
    ) -> Result<Option<usize>, StoreError<S::Error>> {
        let k = key(k)?;
        match self.map.fetch_item::<&[u8]>(&mut self.buf, &k).await? {
            None => Ok(None),
            Some(v) => {
                let dst = out.get_mut(..v.len()).ok_or(StoreError::BadValue)?;
                dst.copy_from_slice(v);
                Ok(Some(v.len()))
            }
        }
    }

    /// Sets `k` to `value`.
    pub async fn set(&mut self, k: &str, value: &[u8]) -> Result<(), StoreError<S::Error>> {
        if value.len() > MAX_VALUE {
            return Err(StoreError::TooLarge { len: value.len() });
        }
        let k = key(k)?;
        // Generic, not the crate's `dyn Value`: a `&dyn Value` held across
        // the await would make every future that sets a key not `Send`.
        self.map
            .store_item_generic(&mut self.buf, &k, &value)
            .await?;
        Ok(())
    }

    /// Removes `k`.
    pub async fn remove(&mut self, k: &str) -> Result<(), StoreError<S::Error>> {
        let k = key(k)?;
        self.map.remove_item(&mut self.buf, &k).await?;
        Ok(())
    }

    /// Reserves `block` frame sequence numbers: returns the first, and
    /// stores the floor after the block before returning, so a restart (or
    /// a power cut) never hands out a number twice. Call it at start and
    /// again each time the block is used up. A block that would pass
    /// `u32::MAX` is [`StoreError::SeqExhausted`]: numbers never go down,
    /// so none is given.
    pub async fn reserve_seq(&mut self, block: u32) -> Result<u32, StoreError<S::Error>> {
        let mut b = [0u8; 4];
        let floor = match self.get(SEQ_FLOOR_KEY, &mut b).await? {
            Some(4) => u32::from_le_bytes(b),
            Some(_) => return Err(StoreError::BadValue),
            None => 0,
        };
        let next = (floor.checked_add(block)).ok_or(StoreError::SeqExhausted { floor, block })?;
        self.set(SEQ_FLOOR_KEY, &next.to_le_bytes()).await?;
        Ok(floor)
    }

    /// Raises the floor of sequence numbers to at least `min` (a store
    /// that starts empty at every start, such as one in memory, is given
    /// a floor from the clock so numbers still rise across restarts).
    pub async fn raise_seq_floor(&mut self, min: u32) -> Result<(), StoreError<S::Error>> {
        let mut b = [0u8; 4];
        let floor = match self.get(SEQ_FLOOR_KEY, &mut b).await? {
            Some(4) => u32::from_le_bytes(b),
            Some(_) => return Err(StoreError::BadValue),
            None => 0,
        };
        if floor < min {
            self.set(SEQ_FLOOR_KEY, &min.to_le_bytes()).await?;
        }
        Ok(())
    }

    /// The flash back.
    pub fn into_flash(self) -> S {
        self.map.destroy().0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimFlash;

    fn sent<T: Send>(_: T) {}

    #[test]
    fn setting_a_key_can_be_awaited_on_any_thread() {
        let mut c = ConfigStore::open(SimFlash::<4, 1024>::new(2), 0..2048).unwrap();
        sent(c.set("guard.max_c", b"85"));
    }
}
