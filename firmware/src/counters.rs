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

use core::fmt::{self, Write as _};

use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use loopwarden_flash::{ConfigStore, StoreError};

use crate::clears::{ClearGate, Last};

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

/// The most slots read at a start ([`restore`]): the gate's most
/// operators.
pub const SLOTS: usize = crate::clears::MAX_OPERATORS;

/// The first byte of a slot's value in the two-item format: never a
/// name's first byte (a name is printable text), so an older firmware's
/// value (the name, then the id) is told apart.
const PAIRED: u8 = 0;

/// The config key of the `n`th slot's last clear id.
fn clear_key(n: usize) -> heapless::String<16> {
    let mut k = heapless::String::new();
    // "clear." and at most three digits: fits.
    let _ = write!(k, "clear.{n}");
    k
}

/// The config key of the `n`th slot's write count.
fn count_key(n: usize) -> heapless::String<16> {
    let mut k = heapless::String::new();
    // "clear." and at most three digits, then ".n": fits.
    let _ = write!(k, "clear.{n}.n");
    k
}

/// Why a slot's last clear id cannot be believed.
#[derive(Debug)]
pub enum ClearError<E> {
    /// The store failed, or a value is too short to be one.
    Store(StoreError<E>),
    /// The slot's id and its write count disagree: the newest id item
    /// was lost (a damaged sector's item is skipped, and an older one
    /// reads back), so the last id is unknown.
    Damaged {
        /// The slot.
        slot: usize,
        /// The write count the id item holds (0: an older firmware's
        /// item, or none).
        id_count: u32,
        /// The write count kept beside it.
        written: u32,
    },
}

impl<E> From<StoreError<E>> for ClearError<E> {
    fn from(e: StoreError<E>) -> Self {
        Self::Store(e)
    }
}

impl<E: fmt::Display> fmt::Display for ClearError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Store(e) => e.fmt(f),
            Self::Damaged {
                slot,
                id_count,
                written,
            } => write!(
                f,
                "clear.{slot} holds write {id_count} and clear.{slot}.n says {written} went in: the newest clear number was lost (a damaged sector?)"
            ),
        }
    }
}

/// A slot's content: whose last clear id, and the id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// The operator's name, as kept.
    pub name: heapless::Vec<u8, 32>,
    /// The last clear id taken from them.
    pub id: u32,
}

/// A slot's id item read: what it holds and its write count (0: an
/// older firmware's, or none).
async fn read_item<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    n: usize,
) -> Result<Option<(Kept, u32)>, StoreError<S::Error>> {
    let mut b = [0u8; 64];
    let Some(len) = store.get(&clear_key(n), &mut b).await? else {
        return Ok(None);
    };
    let (count, rest) = match b[..len].split_first() {
        Some((&PAIRED, rest)) => {
            let (c, rest) = rest.split_first_chunk::<4>().ok_or(StoreError::BadValue)?;
            (u32::from_le_bytes(*c), rest)
        }
        _ => (0, &b[..len]),
    };
    let (name, id) = rest.split_last_chunk::<4>().ok_or(StoreError::BadValue)?;
    let name = heapless::Vec::from_slice(name).map_err(|_| StoreError::BadValue)?;
    let id = u32::from_le_bytes(*id);
    Ok(Some((Kept { name, id }, count)))
}

/// Slot `n`'s write count (0: none kept).
async fn read_count<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    n: usize,
) -> Result<u32, StoreError<S::Error>> {
    let mut b = [0u8; 8];
    match store.get(&count_key(n), &mut b).await? {
        None => Ok(0),
        Some(4) => Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        Some(_) => Err(StoreError::BadValue),
    }
}

/// What slot `n` holds (`None`: nothing). Its id item is believed when
/// its write count is the one kept beside it, or one ahead (a start cut
/// between the two writes); an older firmware's item with no count
/// beside it is believed as the floor. Any other pair is
/// [`ClearError::Damaged`].
pub async fn read_slot<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    n: usize,
) -> Result<Option<Kept>, ClearError<S::Error>> {
    let item = read_item(store, n).await?;
    let written = read_count(store, n).await?;
    let id_count = item.as_ref().map_or(0, |(_, c)| *c);
    if id_count == written || id_count == written.wrapping_add(1) {
        return Ok(item.map(|(k, _)| k));
    }
    Err(ClearError::Damaged {
        slot: n,
        id_count,
        written,
    })
}

/// The last clear id kept in slot `n` for operator `name` (`None`: none
/// kept, or kept for another name; a value too short to hold an id, or
/// an id item the slot's count says is not the newest, is an error,
/// never "none").
pub async fn last_clear<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    n: usize,
    name: &str,
) -> Result<Option<u32>, ClearError<S::Error>> {
    let kept = read_slot(store, n).await?;
    Ok(kept.filter(|k| k.name == name.as_bytes()).map(|k| k.id))
}

/// Keeps `id` as the last clear taken from operator `name`, in slot
/// `n`: the id item with the slot's next write count, then the count.
pub async fn keep_clear<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    n: usize,
    name: &str,
    id: u32,
) -> Result<(), StoreError<S::Error>> {
    keep_named(store, n, name.as_bytes(), id).await
}

async fn keep_named<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    n: usize,
    name: &[u8],
    id: u32,
) -> Result<(), StoreError<S::Error>> {
    let before = read_item(store, n).await?.map_or(0, |(_, c)| c);
    let count = before.max(read_count(store, n).await?).wrapping_add(1);
    let mut v: heapless::Vec<u8, 48> = heapless::Vec::new();
    let _ = v.push(PAIRED);
    let _ = v.extend_from_slice(&count.to_le_bytes());
    // An operator's name is at most 32 bytes (the keyring's check).
    let _ = v.extend_from_slice(name);
    let _ = v.extend_from_slice(&id.to_le_bytes());
    store.set(&clear_key(n), &v).await?;
    store.set(&count_key(n), &count.to_le_bytes()).await
}

/// The operators' last clear ids at a start, into `gate`: every slot
/// read; each keyring operator takes the highest id kept under its name
/// in any slot (the keyring may have changed since: an operator removed,
/// a key rotated, one added ahead), and that id is written into its own
/// slot before any clear is taken ([`Last::Unkept`] where that write
/// failed). A slot that cannot be read leaves every operator
/// [`Last::Unread`]: whose id it held is unknown. Returns how many ids
/// were written into their operator's slot.
pub async fn restore<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    gate: &mut ClearGate,
) -> Result<usize, ClearError<S::Error>> {
    let ring: heapless::Vec<(usize, &'static str), SLOTS> = gate.slots().collect();
    let mut kept: [Option<Kept>; SLOTS] = Default::default();
    for (n, k) in kept.iter_mut().enumerate() {
        match read_slot(store, n).await {
            Ok(v) => *k = v,
            Err(e) => {
                ring.iter()
                    .for_each(|&(slot, _)| gate.set(slot, Last::Unread));
                return Err(e);
            }
        }
    }
    let mut todo: heapless::Vec<(usize, &'static str, u32), SLOTS> = heapless::Vec::new();
    for &(slot, name) in &ring {
        let best = (kept.iter().flatten())
            .filter(|k| k.name == name.as_bytes())
            .map(|k| k.id)
            .max();
        gate.set(slot, best.map_or(Last::Nothing, Last::Id));
        match best {
            Some(id) if !holds(&kept[slot], name.as_bytes(), id) => {
                let _ = todo.push((slot, name, id));
            }
            _ => {}
        }
    }
    let mut moved = 0;
    while !todo.is_empty() {
        let i = match todo.iter().position(|t| free(&kept, t.0, &ring)) {
            Some(i) => i,
            // Each slot to write holds another operator's only copy (the
            // keyring reordered): one is copied to a slot no operator
            // has first, so a start cut meanwhile loses nothing.
            None => match spare_copy(store, &mut kept, todo[0].0, &ring).await {
                Ok(()) => 0,
                Err(_) => {
                    let (slot, _, id) = todo.swap_remove(0);
                    gate.set(slot, Last::Unkept(id));
                    continue;
                }
            },
        };
        let (slot, name, id) = todo.swap_remove(i);
        match keep_clear(store, slot, name, id).await {
            Ok(()) => {
                kept[slot] = Some(Kept::of(name.as_bytes(), id));
                moved += 1;
            }
            Err(_) => gate.set(slot, Last::Unkept(id)),
        }
    }
    Ok(moved)
}

impl Kept {
    fn of(name: &[u8], id: u32) -> Self {
        Self {
            name: heapless::Vec::from_slice(name).unwrap_or_default(),
            id,
        }
    }
}

/// Whether `k` is `name`'s `id`.
fn holds(k: &Option<Kept>, name: &[u8], id: u32) -> bool {
    k.as_ref().is_some_and(|k| k.name == name && k.id == id)
}

/// Whether slot `n` may be written over: it holds nothing, or an id of
/// an operator not in the keyring, or one another slot holds as well
/// (or a higher one of the same operator).
fn free(kept: &[Option<Kept>], n: usize, ring: &[(usize, &str)]) -> bool {
    let Some(k) = &kept[n] else { return true };
    let in_ring = ring.iter().any(|r| r.1.as_bytes() == k.name.as_slice());
    let elsewhere = (kept.iter().enumerate())
        .any(|(j, o)| j != n && o.as_ref().is_some_and(|o| o.name == k.name && o.id >= k.id));
    !in_ring || elsewhere
}

/// Copies what slot `n` holds to a slot no keyring operator has and that
/// may be written over (none: written over anyway).
async fn spare_copy<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    kept: &mut [Option<Kept>; SLOTS],
    n: usize,
    ring: &[(usize, &str)],
) -> Result<(), StoreError<S::Error>> {
    let spare = (0..SLOTS).find(|&j| ring.iter().all(|r| r.0 != j) && free(kept, j, ring));
    let (Some(j), Some(k)) = (spare, kept[n].clone()) else {
        return Ok(());
    };
    keep_named(store, j, &k.name, k.id).await?;
    kept[j] = Some(k);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_on::block_on;
    use crate::board::nor::RamNor;
    use crate::clears::tests::{ring, signed, NOW, SEED};
    use crate::clears::Refusal;
    use loopwarden_link::ClearAction;
    use std::string::ToString;

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
            Err(ClearError::Store(StoreError::BadValue))
        ));
    }

    fn open(mem: &mut [u8]) -> ConfigStore<RamNor<'_>> {
        ConfigStore::open(RamNor::new(mem), 0..4 * 4096).unwrap()
    }

    /// Flips the id's first byte in the newest item holding `name` with
    /// write count `count` and id `id`, as a damaged sector would: the
    /// store skips it.
    fn damage(mem: &mut [u8], count: u32, name: &str, id: u32) {
        let mut v = std::vec![PAIRED];
        v.extend_from_slice(&count.to_le_bytes());
        v.extend_from_slice(name.as_bytes());
        v.extend_from_slice(&id.to_le_bytes());
        let at = (0..mem.len() - v.len())
            .rfind(|&i| mem[i..i + v.len()] == v[..])
            .expect("the item is in flash");
        mem[at + v.len() - 4] ^= 0x01;
    }

    #[test]
    fn a_lost_newest_clear_number_is_an_error_never_the_one_before() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = open(&mut mem);
        block_on(keep_clear(&mut s, 0, "jdoe", 41)).unwrap();
        block_on(keep_clear(&mut s, 0, "jdoe", 42)).unwrap();
        let _ = s.into_flash();
        damage(&mut mem, 2, "jdoe", 42);
        let mut s = open(&mut mem);
        let e = block_on(last_clear(&mut s, 0, "jdoe")).unwrap_err();
        assert!(
            matches!(
                e,
                ClearError::Damaged {
                    slot: 0,
                    id_count: 1,
                    written: 2
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("the newest clear number was lost"),
            "{e}"
        );
        // At a start: every operator's clears are refused, said as such.
        let mut g = ClearGate::new(Some("cdu1"), ring());
        assert!(block_on(restore(&mut s, &mut g)).is_err());
        assert_eq!(
            g.unsettled().collect::<std::vec::Vec<_>>(),
            [(0, "jdoe", Last::Unread), (1, "asmith", Last::Unread)]
        );
    }

    #[test]
    fn a_start_cut_between_the_two_writes_or_an_older_firmwares_item_is_believed() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = open(&mut mem);
        // An older firmware's item: the name, then the id; no count.
        let mut old = b"jdoe".to_vec();
        old.extend_from_slice(&40u32.to_le_bytes());
        block_on(s.set("clear.0", &old)).unwrap();
        assert_eq!(block_on(last_clear(&mut s, 0, "jdoe")).ok(), Some(Some(40)));
        block_on(keep_clear(&mut s, 0, "jdoe", 41)).unwrap();
        // The id item of write 2 went in, its count did not.
        let mut v = std::vec![PAIRED];
        v.extend_from_slice(&2u32.to_le_bytes());
        v.extend_from_slice(b"jdoe");
        v.extend_from_slice(&42u32.to_le_bytes());
        block_on(s.set("clear.0", &v)).unwrap();
        assert_eq!(block_on(last_clear(&mut s, 0, "jdoe")).ok(), Some(Some(42)));
        // An older firmware's item beside a count: a newer item was lost.
        block_on(s.set("clear.0", &old)).unwrap();
        assert!(block_on(last_clear(&mut s, 0, "jdoe")).is_err());
        // A count with no id item at all: lost too.
        block_on(s.set("clear.3.n", &1u32.to_le_bytes())).unwrap();
        assert!(block_on(last_clear(&mut s, 3, "jdoe")).is_err());
    }

    /// The tests' keyring with another operator put ahead of jdoe.
    fn asmith_first() -> &'static [crate::clears::Operator] {
        let r = ring();
        std::boxed::Box::leak(std::boxed::Box::new([r[1], r[0]]))
    }

    #[test]
    fn an_operators_last_clear_number_follows_them_to_another_place_in_the_keyring() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = open(&mut mem);
        block_on(keep_clear(&mut s, 0, "jdoe", 42)).unwrap();
        // Rebuilt with asmith ahead of jdoe.
        let mut g = ClearGate::new(Some("cdu1"), asmith_first());
        assert_eq!(block_on(restore(&mut s, &mut g)).ok(), Some(1));
        let c = signed(5, "cdu1", NOW, ClearAction::Leak(0), SEED);
        assert_eq!(
            g.admit(&c, Some(NOW)),
            Err(Refusal::Replayed { id: 5, last: 42 })
        );
        // Kept in jdoe's own slot now; asmith has none.
        assert_eq!(block_on(last_clear(&mut s, 1, "jdoe")).ok(), Some(Some(42)));
        assert_eq!(block_on(last_clear(&mut s, 0, "asmith")).ok(), Some(None));
        let _ = s.into_flash();
        let mut s = open(&mut mem);
        let mut g = ClearGate::new(Some("cdu1"), asmith_first());
        assert_eq!(block_on(restore(&mut s, &mut g)).ok(), Some(0));
        assert!(g.admit(&c, Some(NOW)).is_err());
        let next = signed(43, "cdu1", NOW, ClearAction::Leak(0), SEED);
        assert!(g.admit(&next, Some(NOW)).is_ok());
    }

    #[test]
    fn two_operators_swapped_in_the_keyring_each_keep_their_number() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = open(&mut mem);
        block_on(keep_clear(&mut s, 0, "asmith", 7)).unwrap();
        block_on(keep_clear(&mut s, 1, "jdoe", 42)).unwrap();
        let mut g = ClearGate::new(Some("cdu1"), ring());
        assert_eq!(block_on(restore(&mut s, &mut g)).ok(), Some(2));
        assert_eq!(block_on(last_clear(&mut s, 0, "jdoe")).ok(), Some(Some(42)));
        assert_eq!(
            block_on(last_clear(&mut s, 1, "asmith")).ok(),
            Some(Some(7))
        );
        // One of them was copied aside first, into a slot no operator has.
        let aside = block_on(read_slot(&mut s, 2)).unwrap().unwrap();
        assert!([(&b"asmith"[..], 7), (&b"jdoe"[..], 42)].contains(&(&aside.name[..], aside.id)));
        let c = signed(42, "cdu1", NOW, ClearAction::Leak(0), SEED);
        assert_eq!(
            g.admit(&c, Some(NOW)),
            Err(Refusal::Replayed { id: 42, last: 42 })
        );
    }
}
