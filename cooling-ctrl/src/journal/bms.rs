//! The limits the BMS set over the northbound server (the setpoint
//! ceiling and the plan's ceiling offset), as the core holds them, kept
//! in the config store under [`BMS_LIMITS_KEY`]: a BMS writes a limit
//! once, when it changes, so a controller restart (the watchdog's, an
//! upgrade's) must not lift it. The shell hands them to the recorder when
//! the BMS changes them, without waiting, hands them again while the
//! flash refuses them ([`BmsKeeping`]), and restores them before the
//! first step. Each record is kept with its check after it
//! ([`BMS_LIMITS_CHECK_KEY`]): a damaged newest record reads as
//! unreadable, never as the older limits it replaced.
//!
//! Glossary:
//! - *record*: a version byte (1), then the ceiling (°C) and the offset
//!   (K) as little-endian `f32`s; the config store keeps its own CRC.
//! - *check*: the record's hash ([`loopwarden_store::check`]).

use std::format;
use std::string::String;

use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use loopwarden_flash::ConfigStore;
use loopwarden_store::check::{check_of, checked};

/// The key the BMS's limits are kept under.
pub const BMS_LIMITS_KEY: &str = "cdu.bms_limits";

/// The key of the check kept after the BMS's limits.
pub const BMS_LIMITS_CHECK_KEY: &str = "cdu.bms_limits.check";

/// The record's version.
const VERSION: u8 = 1;

/// The record's length: the version and two `f32`s.
const LEN: usize = 9;

/// The record of the setpoint ceiling `ceiling_c` (°C) and the plan's
/// ceiling offset `offset_k` (K).
pub fn encode_bms_limits((ceiling_c, offset_k): (f32, f32)) -> [u8; LEN] {
    let mut r = [0u8; LEN];
    r[0] = VERSION;
    r[1..5].copy_from_slice(&ceiling_c.to_le_bytes());
    r[5..9].copy_from_slice(&offset_k.to_le_bytes());
    r
}

/// The ceiling (°C) and offset (K) in `bytes`, or why they are not.
pub fn decode_bms_limits(bytes: &[u8]) -> Result<(f32, f32), String> {
    let r: &[u8; LEN] = bytes
        .try_into()
        .map_err(|_| format!("{} bytes, not {LEN}", bytes.len()))?;
    if r[0] != VERSION {
        return Err(format!("version {}, not {VERSION}", r[0]));
    }
    let word = |i: usize| f32::from_le_bytes([r[i], r[i + 1], r[i + 2], r[i + 3]]);
    let (ceiling_c, offset_k) = (word(1), word(5));
    if !ceiling_c.is_finite() || !offset_k.is_finite() {
        return Err(format!("{ceiling_c} °C and {offset_k} K are no limits"));
    }
    Ok((ceiling_c, offset_k))
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
}

impl BmsKeeping {
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
    /// only their answer is waited for).
    pub fn offer(&mut self, recorder: &loopwarden_store::recorder::Recorder) {
        self.answered();
        let Some(limits) = self.unkept else {
            return;
        };
        // A refused record stops its check: the older limits, still
        // agreeing with theirs, read after a restart, not none.
        if let Ok(rx) = recorder.set_in_order_later(bms_limits_items(limits)) {
            self.unkept = None;
            self.pending = Some(Pending { limits, rx });
        }
    }

    /// Takes the flash's answer to the last limits handed over, if it
    /// came: refused, they are to be handed again (unless newer came).
    fn answered(&mut self) {
        if let Some(Pending { limits, rx }) = self.pending.as_mut() {
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
                }
            }
            self.pending = None;
        }
    }
}

/// Limits handed to the recorder, and its answer to come.
#[derive(Debug)]
struct Pending {
    limits: (f32, f32),
    rx: tokio::sync::oneshot::Receiver<Result<(), String>>,
}

/// What keeping `limits` writes, in order: the record, then its check.
pub fn bms_limits_items(limits: (f32, f32)) -> std::vec::Vec<(String, std::vec::Vec<u8>)> {
    let record = encode_bms_limits(limits).to_vec();
    let check = check_of(&record);
    std::vec![
        (BMS_LIMITS_KEY.into(), record),
        (BMS_LIMITS_CHECK_KEY.into(), check),
    ]
}

/// The BMS's limits in `store`: `None` when none were ever kept; an
/// error that names the key and says why when they cannot be read,
/// decoded or believed (not the record last kept: its check disagrees).
pub async fn read_bms_limits<S: MultiwriteNorFlash<Error: core::fmt::Display>>(
    store: &mut ConfigStore<S>,
) -> Result<Option<(f32, f32)>, String> {
    let mut get = async |key: &str| {
        let mut buf = [0u8; 16];
        let n = (store.get(key, &mut buf).await)
            .map_err(|e| format!("{key}: unreadable in flash: {e}"))?;
        Ok::<_, String>(n.map(|n| buf[..n].to_vec()))
    };
    let record = get(BMS_LIMITS_KEY).await?;
    let check = get(BMS_LIMITS_CHECK_KEY).await?;
    let record = checked(BMS_LIMITS_KEY, record, check)?;
    record
        .map(|r| decode_bms_limits(&r).map_err(|e| format!("{BMS_LIMITS_KEY}: {e}")))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_read_back_as_kept_and_a_damaged_record_says_why() {
        let r = encode_bms_limits((30.5, -2.25));
        assert_eq!(decode_bms_limits(&r), Ok((30.5, -2.25)));
        assert_eq!(decode_bms_limits(&r[..8]), Err("8 bytes, not 9".into()));
        let mut other = r;
        other[0] = 2;
        assert_eq!(decode_bms_limits(&other), Err("version 2, not 1".into()));
        let nan = encode_bms_limits((f32::NAN, 0.0));
        assert!(decode_bms_limits(&nan).unwrap_err().contains("no limits"));
    }

    /// A flash that refuses the limits (a power cut standing in for a
    /// failing disk): they are handed again until they are kept, and read
    /// back after; newer limits go in their place.
    #[test]
    fn limits_the_flash_refused_are_handed_again_until_kept() {
        use loopwarden_store::agent_flash::AgentFlash;
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
        let flush = || futures::executor::block_on(r.flush());
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
        let read = |key: &str| futures::executor::block_on(r.get(key.into())).unwrap();
        assert_eq!(
            (read(BMS_LIMITS_KEY), read(BMS_LIMITS_CHECK_KEY)),
            (
                Some(bms_limits_items((27.0, 0.5))[0].1.clone()),
                Some(bms_limits_items((27.0, 0.5))[1].1.clone())
            ),
            "the record and its check"
        );
        // The same limits written again (a BMS's block on a cycle) are
        // not kept again.
        k.changed((27.0, 0.5));
        assert!(!k.waiting(), "nothing to keep: {k:?}");
        k.changed((26.0, 0.5));
        assert!(k.waiting());
    }

    #[test]
    fn a_store_without_them_reads_none_and_with_them_reads_them() {
        let mut stores = loopwarden_store::agent_flash::open(None).expect("a memory flash");
        let s = &mut stores.store;
        assert_eq!(futures::executor::block_on(read_bms_limits(s)), Ok(None));
        let r = encode_bms_limits((28.0, 1.5));
        futures::executor::block_on(s.set(BMS_LIMITS_KEY, &r)).unwrap();
        assert_eq!(
            futures::executor::block_on(read_bms_limits(s)),
            Ok(Some((28.0, 1.5)))
        );
        futures::executor::block_on(s.set(BMS_LIMITS_KEY, &[1, 2, 3])).unwrap();
        let e = futures::executor::block_on(read_bms_limits(s)).unwrap_err();
        assert_eq!(e, "cdu.bms_limits: 3 bytes, not 9");
    }

    /// The store skips a damaged copy and returns the one before it: the
    /// looser limits a BMS tightened must read as unreadable, not as the
    /// limits in force.
    #[test]
    fn a_record_older_than_its_check_is_not_believed() {
        let mut stores = loopwarden_store::agent_flash::open(None).expect("a memory flash");
        let s = &mut stores.store;
        let keep = |s: &mut ConfigStore<_>, items: &[(String, std::vec::Vec<u8>)]| {
            for (k, v) in items {
                futures::executor::block_on(s.set(k, v)).unwrap();
            }
        };
        let (looser, tighter) = (bms_limits_items((32.0, 2.0)), bms_limits_items((28.0, 1.0)));
        keep(s, &looser);
        assert_eq!(
            futures::executor::block_on(read_bms_limits(s)),
            Ok(Some((32.0, 2.0)))
        );
        // The tighter record damaged: only its check reads.
        keep(s, &tighter[1..]);
        let e = futures::executor::block_on(read_bms_limits(s)).unwrap_err();
        assert!(
            e.starts_with("cdu.bms_limits: ") && e.contains("damaged"),
            "{e}"
        );
        keep(s, &tighter);
        assert_eq!(
            futures::executor::block_on(read_bms_limits(s)),
            Ok(Some((28.0, 1.0)))
        );
    }
}
