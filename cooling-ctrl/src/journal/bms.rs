//! The limits the BMS set over the northbound server (the setpoint
//! ceiling and the plan's ceiling offset), as the core holds them, kept
//! in the config store under [`BMS_LIMITS_KEY`]: a BMS writes a limit
//! once, when it changes, so a controller restart (the watchdog's, an
//! upgrade's) must not lift it. The shell hands them to the recorder when
//! the BMS changes them, without waiting, hands them again while the
//! flash refuses them ([`BmsKeeping`]), and restores them before the
//! first step ([`open_bms_limits`]).
//!
//! Each record carries its generation, and the generation is kept apart
//! after it ([`BMS_LIMITS_GEN_KEY`]), as the latched record's is
//! ([`cooling_decide::record`]): a damaged newest record (the store then
//! returns the copy before it) reads one generation behind the one kept
//! apart, and is refused as damaged, never read as the older limits it
//! replaced. A record one generation ahead of the one kept apart is
//! believed: the power went between the two items, and the record passed
//! the store's own check. The opening then writes the generation kept
//! apart again, so the next cut finds the record one ahead again, not
//! two.
//!
//! A flash of the format before generations (a version 1 record, with
//! its check under [`BMS_LIMITS_CHECK_KEY`]) still reads, against that
//! check; the first limits kept after it are of the new format. A version
//! 1 record read while a generation is kept apart is the older copy of a
//! damaged newer record, and is refused.
//!
//! Glossary:
//! - *record*: a version byte (2), the generation (u32), then the ceiling
//!   (°C) and the offset (K) as `f32`s, all little-endian; the config
//!   store keeps its own CRC. Version 1: the version byte and the two
//!   `f32`s, no generation.
//! - *generation*: counts the records written, from 1 (0: none kept apart,
//!   or a version 1 record).
//! - *check*: a version 1 record's hash ([`loopwarden_store::check`]).

use std::format;
use std::string::String;
use std::vec::Vec;

use cooling_decide::record::next_generation;
use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use loopwarden_flash::ConfigStore;
use loopwarden_store::check::checked;

/// The key the BMS's limits are kept under.
pub const BMS_LIMITS_KEY: &str = "cdu.bms_limits";

/// The key of the generation kept apart, after the record.
pub const BMS_LIMITS_GEN_KEY: &str = "cdu.bms_limits.gen";

/// The key of the check a version 1 record was kept with.
pub const BMS_LIMITS_CHECK_KEY: &str = "cdu.bms_limits.check";

/// The record's version.
const VERSION: u8 = 2;

/// The record's length: the version, the generation and two `f32`s.
const LEN: usize = 13;

/// A version 1 record's length: the version and two `f32`s.
const LEN_V1: usize = 9;

/// The record of the setpoint ceiling `ceiling_c` (°C) and the plan's
/// ceiling offset `offset_k` (K), of `generation`.
pub fn encode_bms_limits((ceiling_c, offset_k): (f32, f32), generation: u32) -> [u8; LEN] {
    let mut r = [0u8; LEN];
    r[0] = VERSION;
    r[1..5].copy_from_slice(&generation.to_le_bytes());
    r[5..9].copy_from_slice(&ceiling_c.to_le_bytes());
    r[9..13].copy_from_slice(&offset_k.to_le_bytes());
    r
}

/// The ceiling (°C) and offset (K) in `bytes`, with the record's
/// generation (0 for a version 1 record), or why they are not.
pub fn decode_bms_limits(bytes: &[u8]) -> Result<((f32, f32), u32), String> {
    let (len, at) = match bytes.first() {
        Some(1) => (LEN_V1, 1),
        Some(&VERSION) => (LEN, 5),
        Some(v) => return Err(format!("version {v}, not 1 or {VERSION}")),
        None => return Err("empty".into()),
    };
    if bytes.len() != len {
        return Err(format!("{} bytes, not {len}", bytes.len()));
    }
    let word = |i: usize| [bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]];
    let generation = if at == 5 {
        u32::from_le_bytes(word(1))
    } else {
        0
    };
    let (ceiling_c, offset_k) = (
        f32::from_le_bytes(word(at)),
        f32::from_le_bytes(word(at + 4)),
    );
    if !ceiling_c.is_finite() || !offset_k.is_finite() {
        return Err(format!("{ceiling_c} °C and {offset_k} K are no limits"));
    }
    Ok(((ceiling_c, offset_k), generation))
}

/// The BMS's limits on their way to flash: those not handed to the
/// recorder yet, and those handed and not known kept. A write the flash
/// refused is handed again at the next turn (`run`'s step, the gateway's
/// tick), unless newer limits came meanwhile; said once until one is
/// kept again.
#[derive(Debug, Default)]
pub struct BmsKeeping {
    /// Not handed over yet (the queue was full, or the flash refused).
    unkept: Option<(f32, f32)>,
    /// The last handed over, with the answer to wait for.
    pending: Option<Pending>,
    /// A write failed, and none was kept since.
    failing: bool,
    /// The limits last given to [`BmsKeeping::changed`].
    last: Option<(f32, f32)>,
    /// The generation of the record last handed over, or kept apart in
    /// flash at the opening ([`open_bms_limits`]).
    generation: u32,
}

impl BmsKeeping {
    /// A keeper whose flash keeps generation `generation` apart (as
    /// [`open_bms_limits`] left it): the next record is the one after.
    pub fn after(generation: u32) -> Self {
        Self {
            generation,
            ..Self::default()
        }
    }

    /// The BMS's limits in force are `limits`: kept unless they are the
    /// ones last given (a BMS that writes its whole block every few
    /// seconds, the outdoor temperature's refresh with it, would
    /// otherwise sync the flash at every write).
    pub fn changed(&mut self, limits: (f32, f32)) {
        if self.last == Some(limits) {
            return;
        }
        self.last = Some(limits);
        self.unkept = Some(limits);
    }

    /// Whether limits wait for flash (handed over or not).
    pub fn waiting(&self) -> bool {
        self.unkept.is_some() || self.pending.is_some()
    }

    /// Takes the flash's answer to the last limits handed over, if it
    /// came, then hands over the newest not kept, without waiting (they
    /// are written after those handed before, so the newest stands, and
    /// only their answer is waited for). Each record handed over is one
    /// generation ahead of the one before it.
    pub fn offer(&mut self, recorder: &loopwarden_store::recorder::Recorder) {
        self.answered();
        let Some(limits) = self.unkept else {
            return;
        };
        let generation = next_generation(self.generation);
        // A refused record stops its generation: the older limits, still
        // agreeing with theirs, read after a restart, not none.
        if let Ok(rx) = recorder.set_in_order_later(bms_limits_items(limits, generation)) {
            self.unkept = None;
            let before = std::mem::replace(&mut self.generation, generation);
            self.pending = Some(Pending { limits, before, rx });
        }
    }

    /// Takes the flash's answer to the last limits handed over, if it
    /// came: refused, they are to be handed again (unless newer came),
    /// with the generation they had: the flash may hold their record
    /// without its generation, which the next record, one ahead of the
    /// generation kept apart, then replaces.
    fn answered(&mut self) {
        if let Some(Pending { limits, before, rx }) = self.pending.as_mut() {
            match rx.try_recv() {
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => return,
                Ok(Ok(())) => {
                    if std::mem::take(&mut self.failing) {
                        tracing::info!(
                            "{BMS_LIMITS_KEY}: the BMS's limits are kept in flash again"
                        );
                    }
                }
                answer => {
                    let why = match answer {
                        Ok(Err(e)) => e,
                        _ => "the flash thread is gone".into(),
                    };
                    if !std::mem::replace(&mut self.failing, true) {
                        tracing::error!(
                            "{BMS_LIMITS_KEY}: the BMS's limits were not kept ({why}): a restart would lift them; tried again at every step"
                        );
                    }
                    self.unkept = self.unkept.or(Some(*limits));
                    self.generation = *before;
                }
            }
            self.pending = None;
        }
    }
}

/// Limits handed to the recorder, the generation before theirs, and its
/// answer to come.
#[derive(Debug)]
struct Pending {
    limits: (f32, f32),
    before: u32,
    rx: tokio::sync::oneshot::Receiver<Result<(), String>>,
}

/// What keeping `limits` as record `generation` writes, in order: the
/// record, then its generation alone.
pub fn bms_limits_items(limits: (f32, f32), generation: u32) -> Vec<(String, Vec<u8>)> {
    std::vec![
        (
            BMS_LIMITS_KEY.into(),
            encode_bms_limits(limits, generation).to_vec()
        ),
        (BMS_LIMITS_GEN_KEY.into(), generation.to_le_bytes().to_vec()),
    ]
}

/// The items as read from the store (`None`: absent).
#[derive(Debug, Default)]
struct Items {
    record: Option<Vec<u8>>,
    generation: Option<Vec<u8>>,
    check: Option<Vec<u8>>,
}

/// The limits believed, with their record's generation.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Kept {
    limits: (f32, f32),
    generation: u32,
}

/// The items of the BMS's limits in `store`, or why they cannot be read.
async fn read_items<S: MultiwriteNorFlash<Error: core::fmt::Display>>(
    store: &mut ConfigStore<S>,
) -> Result<Items, String> {
    let mut get = async |key: &str| {
        let mut buf = [0u8; 16];
        let n = (store.get(key, &mut buf).await)
            .map_err(|e| format!("{key}: unreadable in flash: {e}"))?;
        Ok::<_, String>(n.map(|n| buf[..n].to_vec()))
    };
    Ok(Items {
        record: get(BMS_LIMITS_KEY).await?,
        generation: get(BMS_LIMITS_GEN_KEY).await?,
        check: get(BMS_LIMITS_CHECK_KEY).await?,
    })
}

/// The generation kept apart in `items` (0: none, or not 4 bytes).
fn generation_kept(items: &Items) -> u32 {
    let g = items
        .generation
        .as_deref()
        .and_then(|g| <[u8; 4]>::try_from(g).ok());
    g.map_or(0, u32::from_le_bytes)
}

/// The limits `items` hold: `None` when none were ever kept; why not
/// when they cannot be decoded or believed (see the module note).
fn believe(items: &Items) -> Result<Option<Kept>, String> {
    let k = BMS_LIMITS_KEY;
    if let Some(g) = &items.generation {
        if g.len() != 4 {
            return Err(format!("{BMS_LIMITS_GEN_KEY}: {} bytes, not 4", g.len()));
        }
    }
    let (g, apart) = (generation_kept(items), items.generation.is_some());
    let Some(record) = &items.record else {
        if apart {
            return Err(format!("{k}: missing, while {BMS_LIMITS_GEN_KEY} says generation {g} was written (lost from flash)"));
        }
        // A check without its record: lost since it was kept.
        return checked(k, None, items.check.clone()).map(|_| None);
    };
    let (limits, r) = decode_bms_limits(record).map_err(|e| format!("{k}: {e}"))?;
    if r == 0 && apart {
        return Err(format!("{k}: the newest readable record is of the format before generations, but generation {g} was written: the newest record is damaged"));
    }
    if r == 0 {
        checked(k, Some(record.clone()), items.check.clone())?;
    } else if r != g && r != next_generation(g) {
        return Err(format!("{k}: the newest readable record is generation {r}, but generation {g} was written: the newest record is damaged"));
    }
    Ok(Some(Kept {
        limits,
        generation: r,
    }))
}

/// The BMS's limits in `store`: `None` when none were ever kept; an
/// error that names the key and says why when they cannot be read,
/// decoded or believed (not the record last kept: one generation behind
/// the one kept apart, or a version 1 record against its check).
pub async fn read_bms_limits<S: MultiwriteNorFlash<Error: core::fmt::Display>>(
    store: &mut ConfigStore<S>,
) -> Result<Option<(f32, f32)>, String> {
    let items = read_items(store).await?;
    Ok(believe(&items)?.map(|k| k.limits))
}

/// At the opening: the BMS's limits in `store` ([`read_bms_limits`]), and
/// the generation kept apart to hand [`BmsKeeping::after`]. A record
/// believed one ahead of the generation kept apart (a cut between its
/// two items) gets its generation written apart now, so that the next
/// cut leaves the newest record one ahead again; a failure to write it
/// is said, and the next record takes that generation again.
pub async fn open_bms_limits<S: MultiwriteNorFlash<Error: core::fmt::Display>>(
    store: &mut ConfigStore<S>,
) -> (Result<Option<(f32, f32)>, String>, u32) {
    let items = match read_items(store).await {
        Ok(items) => items,
        Err(e) => return (Err(e), 0),
    };
    let (read, g) = (believe(&items), generation_kept(&items));
    let ahead = match read {
        Ok(Some(k)) if k.generation != g && k.generation != 0 => k.generation,
        _ => return (read.map(|k| k.map(|k| k.limits)), g),
    };
    let kept = match store.set(BMS_LIMITS_GEN_KEY, &ahead.to_le_bytes()).await {
        Ok(()) => ahead,
        Err(e) => {
            tracing::error!("{BMS_LIMITS_GEN_KEY}: generation {ahead} not kept in flash ({e}): the next limits are kept as that generation again");
            g
        }
    };
    (read.map(|k| k.map(|k| k.limits)), kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;
    use loopwarden_store::agent_flash::AgentFlash;
    use loopwarden_store::check::check_of;

    /// A config store on a simulated flash of the controller's geometry,
    /// fresh or `flash` reopened.
    fn sim_store(flash: Option<AgentFlash>) -> ConfigStore<AgentFlash> {
        let board = loopwarden_boards::FlashBoard::host_file();
        let flash = flash.unwrap_or_else(|| {
            AgentFlash::Memory(loopwarden_flash::sim::SimFlash::new(
                board.geometry.sectors as usize,
            ))
        });
        ConfigStore::open(flash, board.layout().config).unwrap()
    }

    fn keep(s: &mut ConfigStore<AgentFlash>, items: &[(String, Vec<u8>)]) {
        for (k, v) in items {
            block_on(s.set(k, v)).unwrap();
        }
    }

    #[test]
    fn the_limits_read_back_as_kept_and_a_damaged_record_says_why() {
        let r = encode_bms_limits((30.5, -2.25), 7);
        assert_eq!(decode_bms_limits(&r), Ok(((30.5, -2.25), 7)));
        assert_eq!(decode_bms_limits(&r[..12]), Err("12 bytes, not 13".into()));
        let mut other = r;
        other[0] = 3;
        assert_eq!(
            decode_bms_limits(&other),
            Err("version 3, not 1 or 2".into())
        );
        let nan = encode_bms_limits((f32::NAN, 0.0), 1);
        assert!(decode_bms_limits(&nan).unwrap_err().contains("no limits"));
        // The format before generations.
        let mut v1 = std::vec![1u8];
        v1.extend_from_slice(&30.5f32.to_le_bytes());
        v1.extend_from_slice(&(-2.25f32).to_le_bytes());
        assert_eq!(decode_bms_limits(&v1), Ok(((30.5, -2.25), 0)));
        assert_eq!(decode_bms_limits(&v1[..8]), Err("8 bytes, not 9".into()));
    }

    /// A flash that refuses the limits (a power cut standing in for a
    /// failing disk): they are handed again until they are kept, and read
    /// back after; newer limits go in their place.
    #[test]
    fn limits_the_flash_refused_are_handed_again_until_kept() {
        let mut stores = loopwarden_store::agent_flash::open(None).expect("a memory flash");
        let flash = stores.log.flash().clone();
        let power = |on: bool| {
            flash.with(|f| match f {
                AgentFlash::Memory(m) if on => m.restore_power(),
                AgentFlash::Memory(m) => m.cut_power_after(0),
                AgentFlash::File(_) => unreachable!("in memory"),
            })
        };
        let r = loopwarden_store::recorder::Recorder::start(stores.log, stores.store, None)
            .expect("the recorder");
        let flush = || block_on(r.flush());
        let mut k = BmsKeeping::default();
        power(false);
        k.changed((28.0, 1.0));
        k.offer(&r);
        flush();
        k.offer(&r);
        assert!(k.waiting() && k.failing, "refused, handed again");
        k.changed((27.0, 0.5));
        power(true);
        for _ in 0..3 {
            k.offer(&r);
            flush();
        }
        assert!(!k.waiting() && !k.failing, "{k:?}");
        let read = |key: &str| block_on(r.get(key.into())).unwrap();
        // A refused record's generation is taken again: the newest is
        // generation 1, or 2 when the second try of (28.0, 1.0) went in
        // as the power came back.
        let g = read(BMS_LIMITS_GEN_KEY).expect("a generation");
        let g = u32::from_le_bytes(g.try_into().unwrap());
        assert!(g == 1 || g == 2, "{g}");
        let items = bms_limits_items((27.0, 0.5), g);
        assert_eq!(
            read(BMS_LIMITS_KEY),
            Some(items[0].1.clone()),
            "the record of its generation"
        );
        // The same limits written again (a BMS's block on a cycle) are
        // not kept again.
        k.changed((27.0, 0.5));
        assert!(!k.waiting(), "nothing to keep: {k:?}");
        k.changed((26.0, 0.5));
        assert!(k.waiting());
        k.offer(&r);
        flush();
        assert_eq!(
            read(BMS_LIMITS_GEN_KEY),
            Some((g + 1).to_le_bytes().to_vec()),
            "the next generation"
        );
    }

    #[test]
    fn a_store_without_them_reads_none_and_with_them_reads_them() {
        let mut s = sim_store(None);
        assert_eq!(block_on(read_bms_limits(&mut s)), Ok(None));
        keep(&mut s, &bms_limits_items((28.0, 1.5), 1));
        assert_eq!(block_on(read_bms_limits(&mut s)), Ok(Some((28.0, 1.5))));
        block_on(s.set(BMS_LIMITS_KEY, &[1, 2, 3])).unwrap();
        let e = block_on(read_bms_limits(&mut s)).unwrap_err();
        assert_eq!(e, "cdu.bms_limits: 3 bytes, not 9");
        block_on(s.set(BMS_LIMITS_GEN_KEY, &[1, 2])).unwrap();
        let e = block_on(read_bms_limits(&mut s)).unwrap_err();
        assert_eq!(e, "cdu.bms_limits.gen: 2 bytes, not 4");
    }

    /// The store skips a damaged copy and returns the one before it: the
    /// looser limits a BMS tightened must read as unreadable, not as the
    /// limits in force.
    #[test]
    fn a_record_behind_its_generation_is_not_believed() {
        let mut s = sim_store(None);
        let (looser, tighter) = (
            bms_limits_items((32.0, 2.0), 1),
            bms_limits_items((28.0, 1.0), 2),
        );
        keep(&mut s, &looser);
        assert_eq!(block_on(read_bms_limits(&mut s)), Ok(Some((32.0, 2.0))));
        // The tighter record damaged: only its generation reads.
        keep(&mut s, &tighter[1..]);
        let e = block_on(read_bms_limits(&mut s)).unwrap_err();
        assert_eq!(
            e,
            "cdu.bms_limits: the newest readable record is generation 1, but generation 2 was written: the newest record is damaged"
        );
        keep(&mut s, &tighter);
        assert_eq!(block_on(read_bms_limits(&mut s)), Ok(Some((28.0, 1.0))));
        // Two ahead is no cut between two items either.
        keep(&mut s, &bms_limits_items((27.0, 0.0), 4)[..1]);
        let e = block_on(read_bms_limits(&mut s)).unwrap_err();
        assert!(e.contains("generation 4, but generation 2"), "{e}");
    }

    /// A flash kept by the format before generations: its record reads
    /// against its check; once a generation is kept apart, a version 1
    /// record is the older copy of a damaged newer one.
    #[test]
    fn a_flash_of_the_format_before_generations_still_reads() {
        let mut s = sim_store(None);
        let mut v1 = std::vec![1u8];
        v1.extend_from_slice(&32.0f32.to_le_bytes());
        v1.extend_from_slice(&0.0f32.to_le_bytes());
        let old = [
            (BMS_LIMITS_KEY.into(), v1.clone()),
            (BMS_LIMITS_CHECK_KEY.into(), check_of(&v1)),
        ];
        keep(&mut s, &old);
        assert_eq!(block_on(read_bms_limits(&mut s)), Ok(Some((32.0, 0.0))));
        let (read, g) = block_on(open_bms_limits(&mut s));
        assert_eq!((read, g), (Ok(Some((32.0, 0.0))), 0));
        // Its own check disagreeing: damaged, as before.
        keep(&mut s, &[(BMS_LIMITS_CHECK_KEY.into(), check_of(&[9]))]);
        let e = block_on(read_bms_limits(&mut s)).unwrap_err();
        assert!(e.contains("damaged"), "{e}");
        keep(&mut s, &old[1..]);
        // The first record of the new format, cut before its generation:
        // one ahead of none, believed.
        keep(&mut s, &bms_limits_items((28.0, -2.0), 1)[..1]);
        assert_eq!(block_on(read_bms_limits(&mut s)), Ok(Some((28.0, -2.0))));
        // A version 1 record under a generation kept apart.
        keep(&mut s, &bms_limits_items((28.0, -2.0), 1)[1..]);
        keep(&mut s, &old[..1]);
        let e = block_on(read_bms_limits(&mut s)).unwrap_err();
        assert!(
            e.contains("format before generations") && e.contains("damaged"),
            "{e}"
        );
    }

    /// The power goes after the record and before its generation: at the
    /// restart the new limits read (never none), the opening keeps their
    /// generation apart, and the next cut reads the next limits again.
    #[test]
    fn a_power_cut_between_the_record_and_its_generation_keeps_the_limits() {
        let cut_after_record = |mut s: ConfigStore<AgentFlash>, items: &[(String, Vec<u8>)]| {
            keep(&mut s, &items[..1]);
            let mut flash = s.into_flash();
            let AgentFlash::Memory(m) = &mut flash else {
                unreachable!("in memory")
            };
            m.cut_power_after(1);
            let mut s = sim_store(Some(flash));
            assert!(block_on(s.set(&items[1].0, &items[1].1)).is_err(), "cut");
            let mut flash = s.into_flash();
            let AgentFlash::Memory(m) = &mut flash else {
                unreachable!("in memory")
            };
            m.restore_power();
            sim_store(Some(flash))
        };
        let mut s = sim_store(None);
        let mut k = BmsKeeping::after(0);
        let next = |k: &mut BmsKeeping, limits| {
            k.generation = next_generation(k.generation);
            bms_limits_items(limits, k.generation)
        };
        keep(&mut s, &next(&mut k, (32.0, 0.0)));
        let items = next(&mut k, (28.0, -2.0));
        let mut s = cut_after_record(s, &items);
        assert_eq!(block_on(read_bms_limits(&mut s)), Ok(Some((28.0, -2.0))));
        let (read, g) = block_on(open_bms_limits(&mut s));
        assert_eq!((read, g), (Ok(Some((28.0, -2.0))), 2), "kept apart now");
        let mut k = BmsKeeping::after(g);
        let items = next(&mut k, (26.0, -3.0));
        let mut s = cut_after_record(s, &items);
        assert_eq!(block_on(read_bms_limits(&mut s)), Ok(Some((26.0, -3.0))));
    }
}
