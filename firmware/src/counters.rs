//! What the firmware counts in its flash besides the latched record: its
//! starts ([`BOOTS_KEY`]), and the last clear id taken from each operator
//! (so a clear replayed after a restart is still refused: the ids only
//! rise). Each in the config store beside the record.
//!
//! An operator's last id is kept under `clear.<n>`, `n` the operator's
//! place in the keyring, with the operator's name before the id: a
//! keyring rebuilt in another order never gives one operator another's
//! count.
//!
//! Glossary:
//! - *boot count*: starts since the flash was formatted, this one
//!   included.

use core::fmt::Write as _;

use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use loopwarden_flash::{ConfigStore, StoreError};

/// The config key of the boot count.
pub const BOOTS_KEY: &str = "fw.boots";

/// Counts this start: the boot count read, plus one, written back.
pub async fn count_boot<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
) -> Result<u32, StoreError<S::Error>> {
    let mut b = [0u8; 8];
    let before = match store.get(BOOTS_KEY, &mut b).await? {
        Some(4) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        _ => 0,
    };
    let now = before.saturating_add(1);
    store.set(BOOTS_KEY, &now.to_le_bytes()).await?;
    Ok(now)
}

/// The config key of the `n`th operator's last clear id.
fn clear_key(n: usize) -> heapless::String<16> {
    let mut k = heapless::String::new();
    // "clear." and at most three digits: fits.
    let _ = write!(k, "clear.{n}");
    k
}

/// The last clear id kept for operator `name`, `n`th in the keyring
/// (`None`: none kept, or kept for another name; a value too short to
/// hold an id is an error, never "none").
pub async fn last_clear<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    n: usize,
    name: &str,
) -> Result<Option<u32>, StoreError<S::Error>> {
    let mut b = [0u8; 64];
    let Some(len) = store.get(&clear_key(n), &mut b).await? else {
        return Ok(None);
    };
    let Some((kept_name, id)) = b[..len].split_last_chunk::<4>() else {
        return Err(StoreError::BadValue);
    };
    Ok((kept_name == name.as_bytes()).then(|| u32::from_le_bytes(*id)))
}

/// Keeps `id` as the last clear taken from operator `name`, `n`th in the
/// keyring.
pub async fn keep_clear<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    n: usize,
    name: &str,
    id: u32,
) -> Result<(), StoreError<S::Error>> {
    let mut v: heapless::Vec<u8, 40> = heapless::Vec::new();
    // An operator's name is at most 32 bytes (the keyring's check).
    let _ = v.extend_from_slice(name.as_bytes());
    let _ = v.extend_from_slice(&id.to_le_bytes());
    store.set(&clear_key(n), &v).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_on::block_on;
    use crate::board::nor::RamNor;

    #[test]
    fn boots_count_up_and_clear_ids_belong_to_their_operator() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = ConfigStore::open(RamNor::new(&mut mem), 0..4 * 4096).unwrap();
        assert_eq!(block_on(count_boot(&mut s)).ok(), Some(1));
        assert_eq!(block_on(count_boot(&mut s)).ok(), Some(2));
        assert_eq!(block_on(last_clear(&mut s, 0, "jdoe")).ok(), Some(None));
        block_on(keep_clear(&mut s, 0, "jdoe", 41)).unwrap();
        block_on(keep_clear(&mut s, 0, "jdoe", 42)).unwrap();
        assert_eq!(block_on(last_clear(&mut s, 0, "jdoe")).ok(), Some(Some(42)));
        // The keyring rebuilt with another operator first.
        assert_eq!(block_on(last_clear(&mut s, 0, "asmith")).ok(), Some(None));
        assert_eq!(block_on(last_clear(&mut s, 1, "jdoe")).ok(), Some(None));
        let _ = s.into_flash();
        let mut s = ConfigStore::open(RamNor::new(&mut mem), 0..4 * 4096).unwrap();
        assert_eq!(block_on(count_boot(&mut s)).ok(), Some(3));
        assert_eq!(block_on(last_clear(&mut s, 0, "jdoe")).ok(), Some(Some(42)));
    }

    #[test]
    fn a_clear_id_too_short_to_read_is_an_error_never_none() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = ConfigStore::open(RamNor::new(&mut mem), 0..4 * 4096).unwrap();
        block_on(s.set("clear.0", &[1, 2])).unwrap();
        assert!(matches!(
            block_on(last_clear(&mut s, 0, "jdoe")),
            Err(StoreError::BadValue)
        ));
    }
}
