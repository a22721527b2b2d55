//! A damaged operator's place refuses only the operators it may have
//! held, any other damaged slot every operator; a full keyring's swap
//! copies aside into the slot no operator has.

use super::tests::{damage, open};
use super::*;
use crate::block_on::block_on;
use crate::board::nor::{NorError, RamNor};
use crate::clears::tests::{ring, signed, NOW, SEED};
use crate::clears::Operator;
use embedded_storage_async::nor_flash::{ErrorType, NorFlash, ReadNorFlash};
use loopwarden_link::ClearAction;
use std::string::ToString;

/// A damaged slot that is no operator's place in this keyring may hold
/// any operator's only number (one not yet moved to its new place):
/// every operator is refused, as for a slot whose item is gone.
#[test]
fn a_damaged_slot_beyond_the_keyring_refuses_every_operator() {
    let mut mem = std::vec![0xFFu8; 8 * 4096];
    let mut s = open(&mut mem);
    block_on(keep_clear(&mut s, 0, "jdoe", 42)).unwrap();
    block_on(keep_clear(&mut s, 5, "gone", 9)).unwrap();
    block_on(keep_clear(&mut s, 5, "gone", 9)).unwrap();
    let _ = s.into_flash();
    damage(&mut mem, 2, "gone", 9);
    let mut s = open(&mut mem);
    let mut g = ClearGate::new(Some("cdu1"), ring());
    let e = block_on(restore(&mut s, &mut g)).unwrap_err();
    assert!(
        e.to_string()
            .contains("clear.5 holds write 1 (gone's number 9)"),
        "{e}"
    );
    assert_eq!(
        g.unsettled().collect::<std::vec::Vec<_>>(),
        [(0, "jdoe", Last::Unread), (1, "asmith", Last::Unread)]
    );
    let next = signed(43, "cdu1", NOW, ClearAction::Leak(0), SEED);
    assert!(g.admit(&next, Some(NOW)).is_err());
}

#[test]
fn an_older_firmwares_item_beside_a_count_refuses_that_operator_alone() {
    let mut mem = std::vec![0xFFu8; 8 * 4096];
    let mut s = open(&mut mem);
    block_on(keep_clear(&mut s, 1, "asmith", 7)).unwrap();
    block_on(keep_clear(&mut s, 0, "jdoe", 42)).unwrap();
    // Rolled back: the older firmware keeps jdoe's 30 its own way.
    let mut old = b"jdoe".to_vec();
    old.extend_from_slice(&30u32.to_le_bytes());
    block_on(s.set("clear.0", &old)).unwrap();
    let mut g = ClearGate::new(Some("cdu1"), ring());
    let r = block_on(restore(&mut s, &mut g)).unwrap();
    assert_eq!(r.damaged[0].refused, ["jdoe"]);
    let said = r.damaged[0].damaged.to_string();
    assert!(
        said.contains("an older firmware's item (jdoe's number 30"),
        "{said}"
    );
    assert_eq!(
        g.unsettled().collect::<std::vec::Vec<_>>(),
        [(0, "jdoe", Last::Unread)]
    );
    let c = signed(43, "cdu1", NOW, ClearAction::Leak(0), SEED);
    assert!(g.admit(&c, Some(NOW)).is_err(), "never the lower floor");
    // An id item gone entirely: whose it was is unknown, all refused.
    block_on(s.set("clear.3.n", &1u32.to_le_bytes())).unwrap();
    let mut g = ClearGate::new(Some("cdu1"), ring());
    assert!(block_on(restore(&mut s, &mut g)).is_err());
    assert_eq!(g.unsettled().count(), 2);
}

/// A flash whose writes stop after `left` of them: the power cut.
struct Cut<'a> {
    nor: RamNor<'a>,
    left: usize,
}

impl ErrorType for Cut<'_> {
    type Error = NorError;
}

impl ReadNorFlash for Cut<'_> {
    const READ_SIZE: usize = 1;

    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), NorError> {
        self.nor.read(offset, bytes).await
    }

    fn capacity(&self) -> usize {
        self.nor.capacity()
    }
}

impl NorFlash for Cut<'_> {
    const WRITE_SIZE: usize = RamNor::WRITE_SIZE;
    const ERASE_SIZE: usize = RamNor::ERASE_SIZE;

    async fn erase(&mut self, from: u32, to: u32) -> Result<(), NorError> {
        self.left = self.left.checked_sub(1).ok_or(NorError::OutOfBounds {
            offset: from,
            len: 0,
        })?;
        self.nor.erase(from, to).await
    }

    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), NorError> {
        self.left = self.left.checked_sub(1).ok_or(NorError::OutOfBounds {
            offset,
            len: bytes.len(),
        })?;
        self.nor.write(offset, bytes).await
    }
}

impl MultiwriteNorFlash for Cut<'_> {}

/// Sixteen operators, the keyring full; `swapped`: the first two in
/// each other's places.
fn full(swapped: bool) -> &'static [Operator] {
    let key = ring()[0].public_key;
    let mut ops: std::vec::Vec<Operator> = (0..crate::clears::MAX_OPERATORS)
        .map(|i| Operator {
            name: std::boxed::Box::leak(std::format!("op{i}").into_boxed_str()),
            key_id: 1,
            public_key: key,
        })
        .collect();
    if swapped {
        ops.swap(0, 1);
    }
    std::boxed::Box::leak(ops.into_boxed_slice())
}

#[test]
fn a_swap_in_a_full_keyring_cut_at_any_write_loses_no_number() {
    let mut mem = std::vec![0xFFu8; 8 * 4096];
    let mut s = open(&mut mem);
    for i in 0..crate::clears::MAX_OPERATORS {
        block_on(keep_clear(
            &mut s,
            i,
            &std::format!("op{i}"),
            100 + i as u32,
        ))
        .unwrap();
    }
    let _ = s.into_flash();
    let first = mem.clone();
    let mut cuts = 0;
    for left in 0.. {
        let mut mem = first.clone();
        let nor = Cut {
            nor: RamNor::new(&mut mem),
            left,
        };
        let mut s = ConfigStore::open(nor, 0..4 * 4096).unwrap();
        let mut g = ClearGate::new(Some("cdu1"), full(true));
        let done = block_on(restore(&mut s, &mut g)).is_ok_and(|r| r.moved == 2);
        let _ = s.into_flash();
        // Power back: every operator's number is read, in its place.
        let mut s = open(&mut mem);
        let mut g = ClearGate::new(Some("cdu1"), full(true));
        let r = block_on(restore(&mut s, &mut g)).unwrap();
        assert_eq!(g.unsettled().count(), 0, "cut after {left} writes: {r:?}");
        assert_eq!(block_on(last_clear(&mut s, 0, "op1")).ok(), Some(Some(101)));
        assert_eq!(block_on(last_clear(&mut s, 1, "op0")).ok(), Some(Some(100)));
        if !done {
            cuts += 1;
            continue;
        }
        assert!(
            cuts > 4,
            "the restore was cut at each of its writes: {cuts}"
        );
        // The one copied aside went to the slot no operator has.
        let aside = block_on(read_slot(&mut s, SLOTS - 1)).unwrap().unwrap();
        assert_eq!((&aside.name[..], aside.id), (&b"op0"[..], 100));
        break;
    }
}

/// A full keyring's swap cut after op1's number went into op0's old
/// place and before op0's went into its new one: op0's number is only
/// in the slot kept aside. That slot's newest item then lost, the one
/// before it (another operator's, copied aside at an earlier swap)
/// reads back: op0 is refused, never left with no floor.
#[test]
fn a_damaged_aside_slot_holding_an_operators_only_number_refuses_them() {
    let mut mem = std::vec![0xFFu8; 8 * 4096];
    let mut s = open(&mut mem);
    for i in 0..crate::clears::MAX_OPERATORS {
        let id = 100 + i as u32;
        block_on(keep_clear(&mut s, i, &std::format!("op{i}"), id)).unwrap();
    }
    // An earlier swap copied op5's older number aside.
    block_on(keep_clear(&mut s, SLOTS - 1, "op5", 90)).unwrap();
    let _ = s.into_flash();
    let first = mem.clone();
    let aside_only = |s: &mut ConfigStore<Cut<'_>>| {
        let op0 = |k: Option<Kept>| k.is_some_and(|k| k.name == b"op0");
        let aside = block_on(read_slot(s, SLOTS - 1)).ok().flatten();
        (0..SLOTS - 1).all(|n| !block_on(read_slot(s, n)).is_ok_and(op0))
            && aside.is_some_and(|k| k.name == b"op0" && k.id == 100)
    };
    let mut mem = (0..200)
        .find_map(|left| {
            let mut mem = first.clone();
            let nor = Cut {
                nor: RamNor::new(&mut mem),
                left,
            };
            let mut s = ConfigStore::open(nor, 0..4 * 4096).unwrap();
            let mut g = ClearGate::new(Some("cdu1"), full(true));
            let _ = block_on(restore(&mut s, &mut g));
            let only = aside_only(&mut s);
            let _ = s.into_flash();
            only.then_some(mem)
        })
        .expect("a cut that leaves op0's number only aside");
    damage(&mut mem, 2, "op0", 100);
    let mut s = open(&mut mem);
    let mut g = ClearGate::new(Some("cdu1"), full(true));
    let e = block_on(restore(&mut s, &mut g)).unwrap_err();
    assert!(e.to_string().contains("(op5's number 90)"), "{e}");
    let unsettled: std::vec::Vec<_> = g.unsettled().collect();
    assert!(
        unsettled.contains(&(1, "op0", Last::Unread)),
        "{unsettled:?}"
    );
    assert_eq!(unsettled.len(), crate::clears::MAX_OPERATORS);
}
