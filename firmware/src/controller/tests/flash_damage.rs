//! A config-store sector damaged whole at start: the latched record is
//! read as unreadable, whatever older copy the store reads, and relatched;
//! the sector is said by its address on the console and to the gateway.

use super::*;
use crate::block_on::block_on;
use crate::board::nor::RamNor;
use crate::latch::damage::{self, Damage};
use crate::latch::{self, LoadError};
use cooling_core::Latched;
use loopwarden_flash::ConfigStore;

const SECTOR: usize = 4096;
/// The board's config store: 8 sectors from 0.
const RANGE: core::ops::Range<u32> = 0..8 * SECTOR as u32;

fn record(generation: u32, leaks: u16) -> LatchRecord {
    LatchRecord {
        generation,
        latched: Latched {
            leaks,
            ..Latched::default()
        },
    }
}

/// Filler items, as the boot count and the learned parts take room.
fn fill(s: &mut ConfigStore<RamNor<'_>>, n: usize) {
    for i in 0..n {
        block_on(s.set("fill", &[i as u8; 100])).unwrap();
    }
}

/// The start as the shell makes it: the sectors checked, the store
/// opened, the record read and judged.
fn start(
    mem: &mut [u8],
) -> (
    ConfigStore<RamNor<'_>>,
    Damage,
    Result<Option<LatchRecord>, LoadError>,
) {
    let mut nor = RamNor::new(mem);
    let mut d = block_on(damage::check(&mut nor, RANGE));
    let mut s = ConfigStore::open(nor, RANGE).unwrap();
    block_on(d.read_note(&mut s));
    let mut read = block_on(latch::load(&mut s));
    d.judge(&mut read);
    (s, d, read)
}

/// Rack 1's leak latched in generation 2, over generation 1 with nothing
/// latched; the sector holding generation 2 then zeroed. The store reads
/// generation 1 (nothing latched) without an error; the check reads the
/// record as unreadable naming the sector, the controller relatches rack
/// 1 from its valve the CDU reports closed and says the sector on the
/// console and to the gateway. The relatch's record in, the sector is
/// noted: the next start warns and reads the record, rack 1 latched.
#[test]
fn a_zeroed_sector_holding_the_latched_record_relatches_naming_the_sector() {
    let mut mem = std::vec![0xFFu8; 8 * SECTOR];
    {
        let mut s = ConfigStore::open(RamNor::new(&mut mem), RANGE).unwrap();
        block_on(latch::save(&mut s, &record(1, 0))).unwrap();
        block_on(latch::mark(&mut s)).unwrap();
        fill(&mut s, 40);
        let _ = s.into_flash();
    }
    let before = mem.clone();
    {
        let mut s = ConfigStore::open(RamNor::new(&mut mem), RANGE).unwrap();
        block_on(latch::save(&mut s, &record(2, 0b0010))).unwrap();
        let _ = s.into_flash();
    }
    let changed = (0..mem.len()).find(|&i| mem[i] != before[i]).unwrap();
    let sector = changed / SECTOR * SECTOR;
    {
        let mut s = ConfigStore::open(RamNor::new(&mut mem), RANGE).unwrap();
        fill(&mut s, 40);
        let _ = s.into_flash();
    }
    assert_ne!(
        mem[sector + SECTOR - 4..sector + SECTOR],
        [0xFF; 4],
        "closed"
    );
    mem[sector..sector + SECTOR].fill(0);
    {
        // Without the check: the older copy, nothing latched.
        let mut s = ConfigStore::open(RamNor::new(&mut mem), RANGE).unwrap();
        assert_eq!(block_on(latch::load(&mut s)), Ok(Some(record(1, 0))));
    }

    let (mut s, d, read) = start(&mut mem);
    let at = sector as u32;
    assert_eq!(read, Err(LoadError::Damaged { at, more: 0 }));
    let mut console = String::new();
    damage::say(&mut console, &d).unwrap();
    assert!(
        console.contains(&std::format!("the sector at {at:#x} is damaged")),
        "{console}"
    );
    let mut dec = Box::new(Decider::new(CoreConfig::default(), map_limits(), &read).unwrap());
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut dec, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::of(&read));
    let named = std::format!("flash sector {at:#x} damaged");
    assert!(p.said(&named), "{:?}", p.lines);
    assert!(
        p.ups
            .iter()
            .any(|u| matches!(u, Up::Said { error: true, words } if words.starts_with(&named))),
        "said to the gateway"
    );
    c.continue_above(p, block_on(latch::relatch_floor(&mut s, &read)));
    // No valve written before the CDU answers; rack 1's valve reads
    // closed (shut by its latch): latched again.
    c.step(p, None, 0);
    assert_eq!(c.to_keep(p), None, "the record is kept as it is");
    assert_eq!(c.plan(p).value(Setting::Valves), None);
    c.step(p, Some(cdu(0b1101, 0)), 1000);
    assert_eq!(c.decider().core().leaks_latched(), 0b0010);
    let r = c.to_keep(p).expect("the relatch's record");
    block_on(latch::save(&mut s, &r)).unwrap();
    c.kept(p, true);
    assert_eq!(valves(&c.plan(p)), 0b1101, "rack 1 held shut");
    // The shell notes the sector once the relatch's record is in.
    block_on(s.note_damage(d.to_note().unwrap())).unwrap();
    drop(c);
    let _ = s.into_flash();

    let (_, d, read) = start(&mut mem);
    assert_eq!(read.unwrap().unwrap().latched.leaks, 0b0010);
    assert_eq!(d.to_note(), None, "noted already");
    let mut console = String::new();
    damage::say(&mut console, &d).unwrap();
    assert!(
        console.contains("is still damaged, as an earlier start found it"),
        "{console}"
    );
}

/// A start stopped before the relatch's record went in notes nothing:
/// the next start finds the sector new again and relatches again.
#[test]
fn a_damaged_sector_not_yet_relatched_is_found_new_at_the_next_start() {
    let mut mem = std::vec![0xFFu8; 8 * SECTOR];
    {
        let mut s = ConfigStore::open(RamNor::new(&mut mem), RANGE).unwrap();
        block_on(latch::save(&mut s, &record(1, 0b0100))).unwrap();
        block_on(latch::mark(&mut s)).unwrap();
        fill(&mut s, 40);
        let _ = s.into_flash();
    }
    mem[..SECTOR].fill(0xA5);
    for _ in 0..2 {
        let (_, d, read) = start(&mut mem);
        assert_eq!(read, Err(LoadError::Damaged { at: 0, more: 0 }));
        assert!(d.to_note().is_some());
    }
}

/// A store written through many records, boot counts and wraps: no
/// sector is found damaged at any start, and the record reads.
#[test]
fn an_intact_store_after_many_writes_is_never_found_damaged() {
    let mut mem = std::vec![0xFFu8; 8 * SECTOR];
    for g in 1..=60u32 {
        {
            let mut s = ConfigStore::open(RamNor::new(&mut mem), RANGE).unwrap();
            block_on(crate::counters::count_boot(&mut s)).unwrap();
            block_on(latch::save(&mut s, &record(g, (g % 16) as u16))).unwrap();
            block_on(latch::mark(&mut s)).unwrap();
            fill(&mut s, 10);
            let _ = s.into_flash();
        }
        let (_, d, read) = start(&mut mem);
        assert_eq!(d.unreadable(), None, "generation {g}: {d:?}");
        assert_eq!(read, Ok(Some(record(g, (g % 16) as u16))), "generation {g}");
    }
}
