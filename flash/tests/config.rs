//! The config store's check for a sector damaged whole: found when zeroed
//! or garbage, never in a store written, wrapped, and cut off mid-write.

use futures::executor::block_on;
use loopwarden_flash::config::damaged_sectors;
use loopwarden_flash::{ConfigStore, SharedFlash, SimFlash};

const SECTOR: usize = 1024;
type Flash = SharedFlash<SimFlash<4, SECTOR>>;
const RANGE: core::ops::Range<u32> = 0..4 * SECTOR as u32;

fn flash() -> Flash {
    SharedFlash::new(SimFlash::new(4))
}

fn found(flash: &Flash) -> Vec<u32> {
    let mut reading = flash.clone();
    let found = block_on(damaged_sectors(&mut reading, RANGE)).unwrap();
    found.iter().map(|s| s.at).collect()
}

/// The sector holding `needle`'s last copy.
fn sector_of(flash: &Flash, needle: &[u8]) -> usize {
    flash.with(|f| {
        let bytes = f.bytes_mut();
        let at = (0..bytes.len() - needle.len())
            .rev()
            .find(|&i| &bytes[i..i + needle.len()] == needle)
            .unwrap();
        at / SECTOR * SECTOR
    })
}

/// Writes past the first sector, then a record: the sector it is in.
fn written(flash: &Flash) -> usize {
    let mut c = ConfigStore::open(flash.clone(), RANGE).unwrap();
    block_on(async {
        c.set("bus.seq_floor", &7u32.to_le_bytes()).await.unwrap();
        for i in 0..12u8 {
            c.set("test.fill", &[i; 100]).await.unwrap();
        }
        c.set("health.1", &[0xC7; 12]).await.unwrap();
    });
    let at = sector_of(flash, b"health.1");
    assert!(at > 0, "past the first sector");
    at
}

#[test]
fn a_zeroed_or_garbage_sector_is_found_by_its_address() {
    let f = flash();
    let at = written(&f);
    assert_eq!(found(&f), Vec::<u32>::new(), "intact");
    f.with(|s| s.bytes_mut()[at..at + SECTOR].fill(0));
    assert_eq!(found(&f), vec![at as u32], "zeroed");
    // What the store reads meanwhile: the older copy, without an error.
    let mut c = ConfigStore::open(f.clone(), RANGE).unwrap();
    let mut b = [0u8; 16];
    assert_eq!(block_on(c.get("health.1", &mut b)).unwrap(), None);
    let mut x = 0x2545_f491_u32;
    f.with(|s| {
        for b in &mut s.bytes_mut()[at..at + SECTOR] {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *b = x as u8;
        }
    });
    let garbage = found(&f);
    assert_eq!(garbage, vec![at as u32], "garbage");
    let mut reading = f.clone();
    let a = block_on(damaged_sectors(&mut reading, RANGE)).unwrap();
    let b = block_on(damaged_sectors(&mut reading, RANGE)).unwrap();
    assert_eq!(a, b, "the same bytes, the same fingerprint");
}

#[test]
fn the_damage_noted_reads_back_as_noted() {
    let f = flash();
    let at = written(&f);
    f.with(|s| s.bytes_mut()[at..at + SECTOR].fill(0));
    let mut reading = f.clone();
    let damaged = block_on(damaged_sectors(&mut reading, RANGE)).unwrap();
    let mut c = ConfigStore::open(f.clone(), RANGE).unwrap();
    assert!(block_on(c.damage_noted()).unwrap().is_empty());
    block_on(c.note_damage(&damaged)).unwrap();
    assert_eq!(block_on(c.damage_noted()).unwrap(), damaged);
    block_on(c.note_damage(&[])).unwrap();
    assert!(block_on(c.damage_noted()).unwrap().is_empty());
}

/// A power cut at every point of a run of writes that wraps the store:
/// after each, the store reads on, and no sector is found damaged.
#[test]
fn no_sector_is_found_damaged_after_a_power_cut_anywhere() {
    for cut in (1..9_000u64).step_by(37).chain([u64::MAX]) {
        let mut sim = SimFlash::<4, SECTOR>::new(4);
        sim.cut_power_after(cut);
        let f = SharedFlash::new(sim);
        let mut c = ConfigStore::open(f.clone(), RANGE).unwrap();
        block_on(async {
            for i in 0..120u32 {
                let key = ["health.1", "health.2", "bus.seq_floor"][i as usize % 3];
                if c.set(key, &[i as u8; 50]).await.is_err() {
                    break;
                }
            }
        });
        let (cut_off, erases) = f.with(|s| (s.power_is_cut(), s.stats().erases));
        assert!(cut_off || erases >= 4, "not wrapped: {erases} erases");
        f.with(|s| s.restore_power());
        let mut c = ConfigStore::open(f.clone(), RANGE).unwrap();
        block_on(c.set("health.3", &[1])).unwrap();
        assert_eq!(found(&f), Vec::<u32>::new(), "power cut after {cut} bytes");
    }
}
