//! What the firmware counts in its flash besides the latched record: its
//! starts ([`BOOTS_KEY`]), and the last clear id taken from each operator
//! (so a clear replayed after a restart is still refused: the ids only
//! rise). Each in the config store beside the record.
//!
//! An operator's last id is kept under `clear.<n>`, `n` the operator's
//! place in the keyring, with the operator's name before the id: a
//! keyring rebuilt in another order never gives one operator another's
//! count. At the start every number found in another's place is moved
//! to its own ([`restore`]); in a step, one slot is written at most
//! ([`restore_step`]), so a reordered keyring's moves do not pass the
//! watchdog.
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

/// The slots read at a start ([`restore`]): one for each of the gate's
/// most operators, and one more no operator ever has, so that a number
/// is copied aside before its only copy is written over even when the
/// keyring is full (`clear.16`, `clear.16.n`: two items more in the
/// store).
pub const SLOTS: usize = crate::clears::MAX_OPERATORS + 1;

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
    /// reads back), or an older firmware wrote its own after this one's,
    /// so the last id is unknown.
    Damaged(Damaged),
}

/// A slot whose id item and write count disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damaged {
    /// The slot.
    pub slot: usize,
    /// The write count the id item holds (0: an older firmware's item,
    /// or none).
    pub id_count: u32,
    /// The write count kept beside it.
    pub written: u32,
    /// What the id item that reads back holds (`None`: none reads).
    pub older: Option<Kept>,
}

impl fmt::Display for Damaged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (n, written) = (self.slot, self.written);
        let Some(k) = &self.older else {
            return write!(
                f,
                "clear.{n} holds no number and clear.{n}.n says {written} went in: the newest clear number was lost (a damaged sector?), and whose it was is unknown"
            );
        };
        let (who, id) = (Name(&k.name), k.id);
        if self.id_count == 0 {
            return write!(
                f,
                "clear.{n} holds an older firmware's item ({who}'s number {id}, no count) beside clear.{n}.n = {written}: an older firmware kept a number after this one did (a rollback and forward again), or this firmware's newer items were lost; {who}'s last clear number is unknown"
            );
        }
        write!(
            f,
            "clear.{n} holds write {} ({who}'s number {id}) and clear.{n}.n says {written} went in: the newest clear number was lost (a damaged sector?)",
            self.id_count
        )
    }
}

/// An operator's name as kept, as it reads.
struct Name<'a>(&'a [u8]);

impl fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match core::str::from_utf8(self.0) {
            Ok(name) => f.write_str(name),
            Err(_) => write!(f, "{:02x?}", self.0),
        }
    }
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
            Self::Damaged(d) => d.fmt(f),
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
    Err(ClearError::Damaged(Damaged {
        slot: n,
        id_count,
        written,
        older: item.map(|(k, _)| k),
    }))
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

/// A slot found damaged at a start ([`restore`]) that is a keyring
/// operator's place and whose older item still names someone, and the
/// operators whose clears it leaves refused: the one whose place it is,
/// and the one it names where that one is in the keyring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passed {
    /// What the slot holds.
    pub damaged: Damaged,
    /// The operators left [`Last::Unread`].
    pub refused: heapless::Vec<&'static str, 2>,
}

/// What a read of the operators' last clear ids did.
#[derive(Debug, Default)]
pub struct Restored {
    /// Ids written into their operator's slot.
    pub moved: usize,
    /// Ids not moved to their place: no slot to copy another's aside
    /// first (their operator is left [`Last::Unread`], read again).
    pub unplaced: usize,
    /// Damaged operators' places that still name someone.
    pub damaged: heapless::Vec<Passed, SLOTS>,
    /// Slots written (a number moved to its place or copied aside), gone
    /// in or not: two items each.
    pub writes: usize,
    /// Numbers left for a later call ([`restore_step`]): their operators
    /// are left [`Last::Unread`], read again.
    pub deferred: usize,
}

/// The operators' last clear ids, into `gate`: every slot read; each
/// keyring operator takes the highest id kept under its name in any slot
/// (the keyring may have changed since: an operator removed, a key
/// rotated, one added ahead), and that id is written into its own slot
/// before any clear is taken ([`Last::Unkept`] where that write failed).
/// A damaged slot that is a keyring operator's place, whose older item
/// still reads, leaves [`Last::Unread`] the operator it names and the one
/// whose place it is, and no other (see [`Passed`]); a damaged slot that
/// is no operator's place (the one kept aside, or one beyond the
/// keyring: it may hold any operator's only number, copied aside or not
/// yet moved), a slot whose id item is gone (whose it was is unknown), or
/// one that cannot be read, leaves every operator [`Last::Unread`]. An operator [`Last::Unkept`] now keeps that: the
/// flash's number is older.
pub async fn restore<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    gate: &mut ClearGate,
) -> Result<Restored, ClearError<S::Error>> {
    restore_within(store, gate, usize::MAX).await
}

/// As [`restore`], within a step: one slot written at most (a number
/// moved to its place, or one copied aside first), as the step's other
/// keeps: each is two items at the NOR part's worst, and a reordered
/// keyring's every move in one step would pass the watchdog. The
/// operators whose number is not in place yet stay [`Last::Unread`]
/// (their clears refused) and are read again at the next call; each
/// call moves one more, or copies one aside that the next moves.
pub async fn restore_step<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    gate: &mut ClearGate,
) -> Result<Restored, ClearError<S::Error>> {
    restore_within(store, gate, 1).await
}

/// [`restore`], writing at most `writes` slots.
async fn restore_within<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    gate: &mut ClearGate,
    writes: usize,
) -> Result<Restored, ClearError<S::Error>> {
    let ring: heapless::Vec<(usize, &'static str), SLOTS> = gate.slots().collect();
    let mut out = Restored::default();
    let mut kept = match read_all(store, &ring, &mut out).await {
        Ok(k) => k,
        Err(e) => {
            ring.iter()
                .for_each(|&(slot, _)| gate.set(slot, Last::Unread));
            return Err(e);
        }
    };
    let unkept: heapless::Vec<usize, SLOTS> = (gate.unsettled())
        .filter(|u| matches!(u.2, Last::Unkept(_)))
        .map(|u| u.0)
        .collect();
    let mut todo: heapless::Vec<(usize, &'static str, u32), SLOTS> = heapless::Vec::new();
    for &(slot, name) in &ring {
        if unkept.contains(&slot) {
            continue;
        }
        if out.damaged.iter().any(|d| d.refused.contains(&name)) {
            gate.set(slot, Last::Unread);
            continue;
        }
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
    let damaged = (out.damaged.iter()).fold(0u32, |m, d| m | 1 << d.damaged.slot);
    let aside = (&ring[..], damaged);
    move_all(store, gate, &mut kept, (todo, writes), aside, &mut out).await;
    Ok(out)
}

/// Every slot read; a damaged one that is a keyring operator's place and
/// whose older item still reads is noted in `out` and read as empty. Any
/// other damaged slot is an error: it may hold any operator's only
/// number.
async fn read_all<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    ring: &[(usize, &'static str)],
    out: &mut Restored,
) -> Result<[Option<Kept>; SLOTS], ClearError<S::Error>> {
    let mut kept: [Option<Kept>; SLOTS] = Default::default();
    for (n, k) in kept.iter_mut().enumerate() {
        match read_slot(store, n).await {
            Ok(v) => *k = v,
            Err(ClearError::Damaged(d)) if d.older.is_some() && ring.iter().any(|r| r.0 == n) => {
                let named =
                    |name: &str| d.older.as_ref().is_some_and(|o| o.name == name.as_bytes());
                let refused = (ring.iter())
                    .filter(|r| r.0 == n || named(r.1))
                    .map(|r| r.1)
                    .take(2)
                    .collect();
                let _ = out.damaged.push(Passed {
                    damaged: d,
                    refused,
                });
            }
            Err(e) => return Err(e),
        }
    }
    Ok(kept)
}

/// Each of `todo` (slot, name, id) written into its slot: first those
/// whose slot may be written over, else one's slot is copied aside first
/// (none copied: that operator is left [`Last::Unread`], never its
/// slot's only copy of another's number written over). At most `writes`
/// slots are written; the operators of the numbers left then are left
/// [`Last::Unread`] ([`Restored::deferred`]).
async fn move_all<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    gate: &mut ClearGate,
    kept: &mut [Option<Kept>; SLOTS],
    (mut todo, writes): (heapless::Vec<(usize, &'static str, u32), SLOTS>, usize),
    aside: (&[(usize, &str)], u32),
    out: &mut Restored,
) {
    while !todo.is_empty() {
        if out.writes >= writes {
            for (slot, _, _) in todo.drain(..) {
                gate.set(slot, Last::Unread);
                out.deferred += 1;
            }
            return;
        }
        let i = match todo.iter().position(|t| free(kept, t.0, aside.0)) {
            Some(i) => i,
            // Each slot to write holds another operator's only copy (the
            // keyring reordered): one is copied to a slot no operator
            // has first, so a start cut meanwhile loses nothing.
            None => match spare_copy(store, kept, todo[0].0, aside).await {
                Aside::Copied if out.writes + 1 < writes => {
                    out.writes += 1;
                    0
                }
                // Copied, and no write left for the move: the next call
                // moves it.
                Aside::Copied => {
                    out.writes += 1;
                    continue;
                }
                how => {
                    out.writes += usize::from(how == Aside::Failed);
                    let (slot, _, _) = todo.swap_remove(0);
                    gate.set(slot, Last::Unread);
                    out.unplaced += 1;
                    continue;
                }
            },
        };
        let (slot, name, id) = todo.swap_remove(i);
        out.writes += 1;
        match keep_clear(store, slot, name, id).await {
            Ok(()) => {
                kept[slot] = Some(Kept::of(name.as_bytes(), id));
                out.moved += 1;
            }
            Err(_) => gate.set(slot, Last::Unkept(id)),
        }
    }
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

/// What became of a copy aside ([`spare_copy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Aside {
    /// Copied.
    Copied,
    /// No slot to copy to: nothing written.
    NoSlot,
    /// The write failed.
    Failed,
}

/// Copies what slot `n` holds to a slot no keyring operator has, not
/// damaged, and that may be written over (the one beyond the most
/// operators is kept for this). Not copied (no such slot, or the write
/// failed): `n` is not to be written over.
async fn spare_copy<S: MultiwriteNorFlash>(
    store: &mut ConfigStore<S>,
    kept: &mut [Option<Kept>; SLOTS],
    n: usize,
    (ring, damaged): (&[(usize, &str)], u32),
) -> Aside {
    let spare = (0..SLOTS)
        .rev()
        .find(|&j| damaged & (1 << j) == 0 && ring.iter().all(|r| r.0 != j) && free(kept, j, ring));
    let (Some(j), Some(k)) = (spare, kept[n].clone()) else {
        return Aside::NoSlot;
    };
    if keep_named(store, j, &k.name, k.id).await.is_err() {
        return Aside::Failed;
    }
    kept[j] = Some(k);
    Aside::Copied
}

#[cfg(test)]
mod damaged_tests;

#[cfg(test)]
pub(crate) mod tests {
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
    fn a_clears_number_kept_is_clear_items_items_in_flash() {
        // The watchdog's check counts a clear's number kept as
        // `budget::CLEAR_ITEMS` items' writes: the number and its count.
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let mut s = ConfigStore::open(RamNor::new(&mut mem), 0..4 * 4096).unwrap();
        block_on(keep_clear(&mut s, 3, "jdoe", 42)).unwrap();
        let keys = (0..SLOTS).flat_map(|n| [clear_key(n), count_key(n)]);
        let mut b = [0u8; 64];
        let mut written = 0u64;
        for k in keys.chain([heapless::String::try_from(BOOTS_KEY).unwrap()]) {
            if block_on(s.get(&k, &mut b)).unwrap().is_some() {
                written += 1;
            }
        }
        assert_eq!(written, crate::budget::CLEAR_ITEMS);
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

    pub(super) fn open(mem: &mut [u8]) -> ConfigStore<RamNor<'_>> {
        ConfigStore::open(RamNor::new(mem), 0..4 * 4096).unwrap()
    }

    /// Flips the id's first byte in the newest item holding `name` with
    /// write count `count` and id `id`, as a damaged sector would: the
    /// store skips it.
    pub(super) fn damage(mem: &mut [u8], count: u32, name: &str, id: u32) {
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
                ClearError::Damaged(Damaged {
                    slot: 0,
                    id_count: 1,
                    written: 2,
                    ..
                })
            ),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("the newest clear number was lost"),
            "{e}"
        );
        // At a start: jdoe's clears are refused, said as such; asmith's
        // are not.
        let mut g = ClearGate::new(Some("cdu1"), ring());
        let r = block_on(restore(&mut s, &mut g)).unwrap();
        assert_eq!(r.damaged[0].refused, ["jdoe"]);
        assert_eq!(
            g.unsettled().collect::<std::vec::Vec<_>>(),
            [(0, "jdoe", Last::Unread)]
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
        assert_eq!(
            block_on(restore(&mut s, &mut g)).ok().map(|r| r.moved),
            Some(1)
        );
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
        assert_eq!(
            block_on(restore(&mut s, &mut g)).ok().map(|r| r.moved),
            Some(0)
        );
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
        assert_eq!(
            block_on(restore(&mut s, &mut g)).ok().map(|r| r.moved),
            Some(2)
        );
        assert_eq!(block_on(last_clear(&mut s, 0, "jdoe")).ok(), Some(Some(42)));
        assert_eq!(
            block_on(last_clear(&mut s, 1, "asmith")).ok(),
            Some(Some(7))
        );
        // One of them was copied aside first, into a slot no operator has.
        let aside = block_on(read_slot(&mut s, SLOTS - 1)).unwrap().unwrap();
        assert!([(&b"asmith"[..], 7), (&b"jdoe"[..], 42)].contains(&(&aside.name[..], aside.id)));
        let c = signed(42, "cdu1", NOW, ClearAction::Leak(0), SEED);
        assert_eq!(
            g.admit(&c, Some(NOW)),
            Err(Refusal::Replayed { id: 42, last: 42 })
        );
    }

    /// Four operators' numbers, each slot holding another's after the
    /// keyring was rotated by one.
    fn rotated(mem: &mut [u8]) -> &'static [crate::clears::Operator] {
        let key = ring()[0].public_key;
        let mut s = open(mem);
        let ops: std::vec::Vec<crate::clears::Operator> = (0..4)
            .map(|i| {
                let name = std::boxed::Box::leak(std::format!("op{i}").into_boxed_str());
                block_on(keep_clear(&mut s, i, name, 100 + i as u32)).unwrap();
                crate::clears::Operator {
                    name,
                    key_id: 1,
                    public_key: key,
                }
            })
            .collect();
        let mut ops = ops;
        ops.rotate_left(1);
        std::boxed::Box::leak(ops.into_boxed_slice())
    }

    /// Every slot's content and write count.
    fn slots(s: &mut ConfigStore<RamNor<'_>>) -> std::vec::Vec<(Option<Kept>, u32)> {
        (0..SLOTS)
            .map(|n| {
                let kept = block_on(read_slot(s, n)).unwrap();
                (kept, block_on(read_count(s, n)).unwrap())
            })
            .collect()
    }

    #[test]
    fn a_restore_in_a_step_writes_one_slot_and_every_number_reaches_its_place_over_steps() {
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let ops = rotated(&mut mem);
        let mut s = open(&mut mem);
        let mut g = ClearGate::new(Some("cdu1"), ops);
        let mut steps = 0;
        while g.unsettled().count() > 0 || steps == 0 {
            assert!(steps < 3 * ops.len(), "not settled in {steps} steps");
            let before = slots(&mut s);
            let r = block_on(restore_step(&mut s, &mut g)).unwrap();
            let after = slots(&mut s);
            let changed = (before.iter().zip(&after)).filter(|(b, a)| b != a).count();
            assert!(changed <= 1, "step {steps}: {changed} slots written: {r:?}");
            assert_eq!(r.writes, changed, "step {steps}");
            // An operator not in place yet takes no clear meanwhile.
            for (slot, name, last) in g.unsettled() {
                assert_eq!(last, Last::Unread, "step {steps}: {name} of slot {slot}");
            }
            steps += 1;
        }
        assert!(steps > ops.len(), "one slot a step: {steps} steps");
        for (i, op) in ops.iter().enumerate() {
            let id = 100 + (i as u32 + 1) % 4;
            assert_eq!(
                block_on(last_clear(&mut s, i, op.name)).ok(),
                Some(Some(id))
            );
        }
        // At the start, all at once.
        let mut mem = std::vec![0xFFu8; 8 * 4096];
        let ops = rotated(&mut mem);
        let mut s = open(&mut mem);
        let mut g = ClearGate::new(Some("cdu1"), ops);
        let r = block_on(restore(&mut s, &mut g)).unwrap();
        assert_eq!((r.moved, g.unsettled().count()), (4, 0), "{r:?}");
    }
}
