//! The controller's flash: the same image, stores and recorder thread as
//! the node agent's (`loopwarden_store::agent_flash`,
//! `loopwarden_store::recorder`): the event log keeps every core event and
//! every lease sent or lifted, so `cooling-ctrl ctl events` shows them
//! across restarts; the outbox keeps the events and leases until the
//! broker has them; the config store keeps the sequence floor. Without a
//! flash file the same stores live in memory and are lost at exit.
//!
//! The control loop never waits for a flash write: it hands [`Journal`]
//! entries to the recorder ([`record`]), which writes them in order.
//!
//! The latched state of the core (leak latches, failed pumps, the lead
//! pump, a failsafe and the sensor faults: `cooling_core::latch`) is kept
//! in the config store under [`LATCHED_KEY`], with its generation
//! ([`LatchRecord`]): the shell writes it with [`Recorder::set_sync`] and
//! waits for it to be in flash before the step's commands reach the CDU,
//! and [`ControllerFlash::open`] reads it back before the first step. A
//! flash file whose config store was lost (`Stores::config_lost`) holds
//! no record and reads as unknown ([`CONFIG_LOST`]), never as nothing
//! latched: the controller relatches as for a record it cannot read.
//! Beside a record it cannot read or believe, the generation its
//! generation item holds ([`relatch_floor`]) is what the records written
//! after the relatch go above, so a cut between the first of them and its
//! generation leaves it one ahead, believed, never behind (damaged). The
//! twin's restarts use the same [`save_latched`] and [`load_latched`] on a
//! simulated flash.
//!
//! What the estimator learned of the hall (`cooling_core::estimate`) is
//! kept under [`LEARNED_KEYS`], one key per part of its record (the
//! loop's and the facility's figures, then the hosts eight by eight): the
//! shell writes them every [`LEARNED_EVERY`] of running and at a clean
//! stop, without waiting ([`learned_records`] through the recorder), and
//! [`ControllerFlash::open`] reads them back ([`LearnedRecords`]), to be
//! decoded against the configuration and restored into the core before
//! the first step. Each part names the hosts its figures were learned on
//! (part 0 their count, a hosts' part a hash of its eight hosts' ids:
//! [`host_ids`]). A part that cannot be read or decoded, or that was kept
//! for other hosts than those now configured in its place, is reported
//! with its key and leaves that part as configured. The twin uses
//! [`save_learned`] and [`load_learned`] (its hosts known by index).
//!
//! The limits the BMS set are kept under [`BMS_LIMITS_KEY`] (`bms`),
//! read back at opening and restored before the first step.
//!
//! Records: an event is kind `MessageKind::Event` with the message's body;
//! a lease is kind `MessageKind::CapLease`, a
//! [`LeaseRecord`]: lift or
//! cap, the host and the signed frame as sent.
//!
//! Glossary:
//! - *recorder*: the thread that writes the flash.
//! - *journal entry*: what the shell asks to be logged.

use std::fmt;
use std::format;
use std::path::Path;
use std::string::String;
use std::vec::Vec;

use cooling_core::estimate::record::{HostIds, MAX_LEN, PARTS};
use cooling_core::{CoreConfig, Learned};
use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use loopwarden_flash::log::WRAPPED;
use loopwarden_flash::{ConfigStore, Outbox, StoreError, Wrapped};
use loopwarden_protocol::{Ident, Message, MessageKind, TimestampMs, MAX_FRAME_LEN};
use loopwarden_store::agent_flash::{self, Flash};
use loopwarden_store::lease_record::LeaseRecord;
pub use loopwarden_store::recorder::{Entry, Recorder};
use serde_json::{json, Value};

use crate::shell::Journal;

mod bms;
pub use bms::{
    decode_bms_limits, encode_bms_limits, open_bms_limits, read_bms_limits, BmsKeeping,
    BMS_LIMITS_GEN_KEY, BMS_LIMITS_KEY,
};

/// The controller's flash, opened: its recorder, and what the bus takes
/// from it when the shell starts it (the outbox and the first sequence
/// number of the block reserved in flash).
pub struct ControllerFlash {
    /// The recorder, attached to the bus by the shell.
    pub recorder: Recorder,
    /// The outbox for the bus.
    pub outbox: Outbox<Flash>,
    /// The bus's first sequence number.
    pub first_seq: u32,
    /// The latched state read back at opening: `Ok(None)` when none was
    /// ever written, an error when it cannot be read or the config store
    /// was lost ([`CONFIG_LOST`]).
    pub latched: Result<Option<LatchRecord>, String>,
    /// Beside a latched state that cannot be read or believed, the
    /// generation the flash's generation item holds: the records written
    /// after the relatch go above it ([`relatch_floor`]).
    pub relatch_floor: Option<u32>,
    /// What the estimator learned, as read back at opening (decoded
    /// against the configuration by [`LearnedRecords::decode`]).
    pub learned: LearnedRecords,
    /// The limits the BMS set, as read back at opening: `Ok(None)` when
    /// none were ever kept ([`BMS_LIMITS_KEY`]).
    pub bms_limits: Result<Option<(f32, f32)>, String>,
    /// The generation of the BMS's limits kept apart in flash after the
    /// opening, for [`BmsKeeping::after`] ([`BMS_LIMITS_GEN_KEY`]).
    pub bms_limits_gen: u32,
    /// The flash file was made at this opening (missing or empty): what
    /// an earlier run latched is not in it ([`NEW_FLASH`], said).
    pub new_file: bool,
}

impl std::fmt::Debug for ControllerFlash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerFlash")
            .field("recorder", &self.recorder)
            .field("first_seq", &self.first_seq)
            .finish()
    }
}

impl ControllerFlash {
    /// Opens the flash file at `path` (made if missing), or memory, and
    /// starts the recorder thread.
    pub fn open(path: Option<&Path>) -> Result<Self, String> {
        let mut stores = agent_flash::open(path)?;
        let latched = futures::executor::block_on(load_latched(&mut stores.store));
        let latched = unknown_if_lost(latched, stores.config_lost);
        if let Ok(Some(r)) = &latched {
            futures::executor::block_on(catch_up_latched(&mut stores.store, r));
        }
        let relatch_floor = futures::executor::block_on(relatch_floor(&mut stores.store, &latched));
        if matches!(latched, Ok(Some(_))) || stores.config_lost {
            // A record kept before the mark was gets its mark now; after
            // a store lost, the mark keeps the next start from reading
            // "nothing latched" until a record is written anew.
            match futures::executor::block_on(mark_latch_kept(&mut stores.store)) {
                Err(e) => tracing::error!("{e}: should the latched record be lost from flash later, a restart would read it as nothing latched"),
                // The latch's mark stands for the loss from here.
                Ok(()) if stores.config_lost => {
                    let cleared = agent_flash::clear_lost(&mut stores.store);
                    if let Err(e) = futures::executor::block_on(cleared) {
                        tracing::error!("{e}: the next start reads the config store as lost again");
                    }
                }
                Ok(()) => {}
            }
        }
        let new_file = path.is_some() && stores.blank;
        if let (Some(p), true) = (path, new_file) {
            tracing::warn!("{}: {NEW_FLASH}", p.display());
        }
        let learned = futures::executor::block_on(read_learned(&mut stores.store));
        let (bms_limits, bms_limits_gen) =
            futures::executor::block_on(open_bms_limits(&mut stores.store));
        let recorder = Recorder::start(stores.log, stores.store, path)
            .map_err(|e| format!("the recorder thread: {e}"))?;
        Ok(Self {
            recorder,
            outbox: stores.outbox,
            first_seq: stores.first_seq,
            latched,
            relatch_floor,
            learned,
            bms_limits,
            bms_limits_gen,
            new_file,
        })
    }
}

/// Why the latched state is unknown when the config store was lost from
/// the flash file ([`agent_flash::Stores::config_lost`]).
pub const CONFIG_LOST: &str = "the config store was lost from the flash file (it holds records but no sequence floor, which every start writes before any other: a sector erased by a repair, a board layout that moved its range, a damaged disk), so what was latched (racks isolated for a leak, pumps failed) is unknown";

/// The latched record as read (`read`), unless the config store was lost
/// (`lost`): then "none ever written" is unknown, an error
/// ([`CONFIG_LOST`]), which the controller treats as a record it cannot
/// read (`cooling_decide::latch`: relatch from the valve positions).
pub fn unknown_if_lost(
    read: Result<Option<LatchRecord>, String>,
    lost: bool,
) -> Result<Option<LatchRecord>, String> {
    match read {
        Ok(None) if lost => Err(CONFIG_LOST.into()),
        other => other,
    }
}

/// Said at the start on a flash file made at this opening: what an
/// earlier controller latched is not in it.
pub const NEW_FLASH: &str = "a new flash file: no latched state is in it, so a rack an earlier run isolated for a leak (before a disk was replaced, a state folder went unmounted or the path changed) would reopen; at a first commissioning nothing was latched, otherwise check every rack isolated for a leak and close its manual valve before this start, or restore the old flash file";

/// The latched state as kept in flash, with its generation, and the keys
/// it is kept under: the decision path's, with the firmware's
/// ([`cooling_decide::record`]).
pub use cooling_decide::record::{LatchRecord, LATCHED_GEN_KEY, LATCHED_KEY};

/// The config key of the mark that a latched record went into this
/// store, kept after the record: a store that holds the mark and no
/// record has lost the record (the store skips an item whose check
/// fails, a damaged sector's), which reads as unreadable, never as
/// "nothing latched".
pub const LATCH_KEPT_KEY: &str = "cdu.latch.kept";

/// Writes the latched record `r` to `store`: the record, its generation,
/// then the mark that a record was kept ([`LATCH_KEPT_KEY`]) unless it is
/// there.
pub async fn save_latched<S: MultiwriteNorFlash<Error: fmt::Display>>(
    store: &mut ConfigStore<S>,
    r: &LatchRecord,
) -> Result<(), String> {
    for (key, value) in r.items() {
        store.set(key, &value).await.map_err(not_kept::<S>(key))?;
    }
    mark_latch_kept(store).await
}

/// How a key not kept in `S` is said.
fn not_kept<S: MultiwriteNorFlash<Error: fmt::Display>>(
    key: &'static str,
) -> impl Fn(StoreError<S::Error>) -> String {
    move |e| format!("{key} not kept in flash: {e}")
}

/// Keeps the mark that a latched record went into `store`
/// ([`LATCH_KEPT_KEY`]) unless it is there.
async fn mark_latch_kept<S: MultiwriteNorFlash<Error: fmt::Display>>(
    store: &mut ConfigStore<S>,
) -> Result<(), String> {
    let mut b = [0u8; 4];
    let marked = store.get(LATCH_KEPT_KEY, &mut b).await;
    if marked.map_err(not_kept::<S>(LATCH_KEPT_KEY))?.is_none() {
        store
            .set(LATCH_KEPT_KEY, &[1])
            .await
            .map_err(not_kept::<S>(LATCH_KEPT_KEY))?;
    }
    Ok(())
}

/// The latched record in `store`: `None` when none was ever written (no
/// record and no mark); an error that says why when it cannot be read,
/// decoded or believed, or was lost since it was kept.
pub async fn load_latched<S: MultiwriteNorFlash<Error: fmt::Display>>(
    store: &mut ConfigStore<S>,
) -> Result<Option<LatchRecord>, String> {
    let mut rec = [0u8; 64];
    let mut gen = [0u8; 16];
    let unreadable = |key: &'static str| {
        move |e: StoreError<S::Error>| format!("{key}: unreadable in flash: {e}")
    };
    let n = (store.get(LATCHED_KEY, &mut rec).await).map_err(unreadable(LATCHED_KEY))?;
    let g = (store.get(LATCHED_GEN_KEY, &mut gen).await).map_err(unreadable(LATCHED_GEN_KEY))?;
    let read = LatchRecord::decode(n.map(|n| &rec[..n]), g.map(|g| &gen[..g]));
    if !matches!(read, Ok(None)) {
        return read.map_err(|e| e.to_string());
    }
    match store.get(LATCH_KEPT_KEY, &mut gen).await {
        Ok(None) => Ok(None),
        Ok(Some(_)) => Err(format!("the latched record is missing from flash, though an earlier start kept one ({LATCH_KEPT_KEY} is set): the flash lost it (a damaged sector?), so what was latched is unknown")),
        Err(e) => Err(unreadable(LATCH_KEPT_KEY)(e)),
    }
}

/// At a start, after [`load_latched`] believed `r`: the generation a cut
/// left behind it (`r` one ahead of the one kept apart) is written, so a
/// cut in the next record's write finds it one ahead again, never two
/// ([`LatchRecord::catch_up`]). The record read is right whatever comes
/// of this write: one that fails leaves only a second cut's window open,
/// and is said.
pub async fn catch_up_latched<S: MultiwriteNorFlash<Error: fmt::Display>>(
    store: &mut ConfigStore<S>,
    r: &LatchRecord,
) {
    let mut gen = [0u8; 16];
    let g = match store.get(LATCHED_GEN_KEY, &mut gen).await {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!("{LATCHED_GEN_KEY}: unreadable in flash: {e}");
            return;
        }
    };
    if let Some((key, item)) = r.catch_up(g.map(|g| &gen[..g])) {
        if let Err(e) = store.set(key, &item).await {
            tracing::warn!("{key}: the generation a cut left behind not written back: {e}");
        }
    }
}

/// The generation the generation item in `store` holds beside a latched
/// record that could not be read or believed (`read`): the records
/// written after the relatch go above it
/// (`cooling_decide::Decider::continue_above`), so a cut between the
/// first of them and its generation leaves the record one ahead,
/// believed, never behind it (read as damaged, a relatch again that
/// loses what the record held). `None` after a record believed or none
/// ever written, or where the item is absent, unreadable or does not read
/// as a generation (the records then start from generation 1).
pub async fn relatch_floor<S: MultiwriteNorFlash<Error: fmt::Display>>(
    store: &mut ConfigStore<S>,
    read: &Result<Option<LatchRecord>, String>,
) -> Option<u32> {
    read.as_ref().err()?;
    let mut gen = [0u8; 16];
    let n = store.get(LATCHED_GEN_KEY, &mut gen).await.ok()??;
    cooling_decide::record::generation_written(Some(&gen[..n]))
}

/// Damages the newest copy of record `r` in the raw flash `bytes` (one
/// byte of its latched state inverted), as a fault of the flash would:
/// what the twin's `latch_corrupt` does. False when the record is not
/// found in the bytes.
pub fn damage_record(bytes: &mut [u8], r: &LatchRecord) -> bool {
    let [(_, record), _] = r.items();
    let Some(at) = bytes
        .windows(record.len())
        .rposition(|w| w == record.as_slice())
    else {
        return false;
    };
    // A byte of the state (past the generation).
    bytes[at + 5] ^= 0xff;
    true
}

/// The config keys of what the estimator learned: part `n` of its record
/// (`cooling_core::estimate::record`) under `cdu.learned.n`; the decision
/// path's, which the firmware keeps its parts under too
/// ([`cooling_decide::learned`]).
pub use cooling_decide::learned::LEARNED_KEYS;

/// How often the shell keeps what the estimator learned (and at a clean
/// stop); the twin's fast mode keeps it as often in simulated time. The
/// decision path's cadence, which the firmware keeps too
/// ([`cooling_decide::learned::LEARNED_EVERY_MS`]).
pub const LEARNED_EVERY: std::time::Duration =
    std::time::Duration::from_millis(cooling_decide::learned::LEARNED_EVERY_MS);

/// Each part of what `l` holds, with its key, as it is kept.
pub fn learned_records(l: &Learned) -> Vec<(&'static str, Vec<u8>)> {
    let mut buf = [0u8; MAX_LEN];
    LEARNED_KEYS
        .iter()
        .enumerate()
        .filter_map(|(part, key)| match l.encode_part(part, &mut buf) {
            Ok(n) => Some((*key, buf[..n].to_vec())),
            // Every part below PARTS encodes; a refusal is a layout bug.
            Err(e) => {
                tracing::error!("cooling-ctrl: {key} not encoded: {e}");
                None
            }
        })
        .collect()
}

/// Writes what `l` holds to `store`, every part.
pub async fn save_learned<S: MultiwriteNorFlash<Error: fmt::Display>>(
    store: &mut ConfigStore<S>,
    l: &Learned,
) -> Result<(), String> {
    for (key, value) in learned_records(l) {
        store
            .set(key, &value)
            .await
            .map_err(|e| format!("{key} not kept in flash: {e}"))?;
    }
    Ok(())
}

/// What the flash held of the learned figures: each part's bytes, `None`
/// when it was never written, or why it could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearnedRecords {
    parts: Vec<Result<Option<Vec<u8>>, String>>,
}

impl Default for LearnedRecords {
    /// Nothing kept.
    fn default() -> Self {
        Self {
            parts: vec![Ok(None); PARTS],
        }
    }
}

/// The learned figures read back and decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct LearnedRead {
    /// The figures: the parts that read, the others as configured; `None`
    /// when no part could be read (or none was ever kept).
    pub learned: Option<Learned>,
    /// The parts read, by key.
    pub read: Vec<&'static str>,
    /// The parts refused, each as `key: why`.
    pub refused: Vec<String>,
}

impl LearnedRecords {
    /// The parts read as figures for a core configured as `cfg`, its
    /// hosts known by index (see [`LearnedRecords::decode_on`]).
    pub fn decode(&self, cfg: &CoreConfig) -> LearnedRead {
        self.decode_on(cfg, Learned::new(cfg).ids)
    }

    /// The parts read as figures for a core configured as `cfg` whose
    /// hosts are `ids` ([`host_ids`]): a part that cannot be read or
    /// decoded, or that was kept for other hosts (a hosts' part for
    /// others than those now in its place, part 0 for another host
    /// count), is reported and left as configured. The figures name
    /// `ids`, whatever was read.
    pub fn decode_on(&self, cfg: &CoreConfig, ids: HostIds) -> LearnedRead {
        let mut l = Learned::new(cfg);
        l.ids = ids;
        let mut read = Vec::new();
        let mut refused = Vec::new();
        for (part, (key, got)) in LEARNED_KEYS.iter().zip(&self.parts).enumerate() {
            match got {
                Ok(None) => {}
                Ok(Some(b)) => match l.decode_part(part, b) {
                    Ok(()) => read.push(*key),
                    Err(e) => refused.push(format!("{key}: {e}")),
                },
                Err(e) => refused.push(format!("{key}: {e}")),
            }
        }
        LearnedRead {
            learned: (!read.is_empty()).then_some(l),
            read,
            refused,
        }
    }

    /// Part `part`'s bytes as read, if it read.
    pub fn bytes(&self, part: usize) -> Option<&[u8]> {
        self.parts.get(part)?.as_ref().ok()?.as_deref()
    }
}

/// Whose figures the learned records of a CDU of `hosts` (its configured
/// host ids, in order) hold: what they are kept with and checked against.
pub fn host_ids(hosts: &[Ident]) -> HostIds {
    HostIds::named(hosts.iter().map(|h| h.as_str().as_bytes()))
}

/// Reads every part of the learned figures from `store`, as bytes.
pub async fn read_learned<S: MultiwriteNorFlash<Error: fmt::Display>>(
    store: &mut ConfigStore<S>,
) -> LearnedRecords {
    let mut parts = Vec::with_capacity(PARTS);
    for key in LEARNED_KEYS {
        let mut buf = [0u8; MAX_LEN];
        let got = match store.get(key, &mut buf).await {
            Ok(n) => Ok(n.map(|n| buf[..n].to_vec())),
            Err(e) => Err(format!("unreadable in flash: {e}")),
        };
        parts.push(got);
    }
    LearnedRecords { parts }
}

/// The learned figures in `store`, decoded for a core configured as
/// `cfg` (see [`LearnedRecords::decode`]).
pub async fn load_learned<S: MultiwriteNorFlash<Error: fmt::Display>>(
    store: &mut ConfigStore<S>,
    cfg: &CoreConfig,
) -> LearnedRead {
    read_learned(store).await.decode(cfg)
}

/// Logs one of the shell's entries through `recorder`, without waiting.
pub fn record(recorder: &Recorder, entry: &Journal) {
    if let Some((time, kind, body)) = encode(entry) {
        recorder.append(time, kind, body);
    }
}

/// A journal entry as a record: time, kind and body.
pub fn encode(entry: &Journal) -> Option<(TimestampMs, u8, Vec<u8>)> {
    let mut buf = [0u8; MAX_FRAME_LEN];
    match entry {
        Journal::Event { time, event } => {
            let n = match Message::Event(event.clone()).encode_body(&mut buf) {
                Ok(n) => n,
                Err(e) => {
                    tracing::error!("cooling-ctrl: event not logged: {e:?}");
                    return None;
                }
            };
            Some((*time, MessageKind::Event as u8, buf[..n].to_vec()))
        }
        Journal::Lease { host, frame, lift } => {
            let record = LeaseRecord {
                host: host.clone(),
                lift: *lift,
                frame: (**frame).clone(),
            };
            let body = match record.encode() {
                Ok(body) => body,
                Err(e) => {
                    tracing::error!("cooling-ctrl: lease not logged: {e:?}");
                    return None;
                }
            };
            Some((frame.time, MessageKind::CapLease as u8, body))
        }
    }
}

/// An entry for the console, as JSON: `{"seq", "time_ms", "event",
/// "text"}` where `event` is the event's JSON, `{"lease_sent": …}` /
/// `{"lift_sent": …}` or `{"wrapped": …}`, and `text` the same as a
/// sentence.
pub fn describe(e: &Entry) -> Value {
    let (what, text) = if e.kind == MessageKind::Event as u8 {
        match Message::decode_body(MessageKind::Event, &e.body) {
            Ok(Message::Event(ev)) => (
                serde_json::to_value(&ev).unwrap_or(Value::Null),
                ev.to_string(),
            ),
            _ => unreadable("undecodable event"),
        }
    } else if e.kind == MessageKind::CapLease as u8 {
        decode_lease(&e.body).unwrap_or_else(|e| unreadable(&format!("undecodable lease: {e}")))
    } else if e.kind == WRAPPED {
        match Wrapped::decode(&e.body) {
            Some(w) => (
                json!({ "wrapped": {
                    "lost": w.lost, "first_seq": w.first_seq, "last_seq": w.last_seq,
                }}),
                w.to_string(),
            ),
            None => unreadable("undecodable wrap marker"),
        }
    } else {
        unreadable(&format!("record of kind {}", e.kind))
    };
    json!({ "seq": e.seq, "time_ms": e.time.0, "event": what, "text": text })
}

/// A record that cannot be read, as JSON and as words.
fn unreadable(what: &str) -> (Value, String) {
    (json!(what), what.to_string())
}

fn decode_lease(body: &[u8]) -> Result<(Value, String), String> {
    let record = LeaseRecord::decode(body).map_err(|e| e.to_string())?;
    let Message::CapLease(l) = &record.frame.message else {
        let kind = record.frame.message.kind().name();
        return Err(format!("lease record holds a {kind} frame"));
    };
    let name = if record.lift {
        "lift_sent"
    } else {
        "lease_sent"
    };
    let (host, frame) = (&record.host, &record.frame);
    let json = json!({ name: {
        "host": host,
        "seq": frame.seq,
        "lease": l.lease,
        "reason": l.reason,
        "limit_w": l.caps.first().map(|c| c.limit.0),
        "duration_ms": l.duration.0,
    }});
    Ok((json, record.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cooling_core::Latched;
    use loopwarden_protocol::message::{CduMode, Event};
    use loopwarden_protocol::{Frame, Ident, NodeId, ReasonCode, Role};
    use std::boxed::Box;

    fn event() -> Event {
        Event::CduModeChanged {
            from: CduMode::Boot,
            to: CduMode::Normal,
            reason: ReasonCode::OK,
        }
    }

    /// A config store on a simulated flash of the controller's geometry,
    /// fresh or `flash` reopened.
    fn sim_store(
        flash: Option<loopwarden_store::agent_flash::AgentFlash>,
    ) -> ConfigStore<loopwarden_store::agent_flash::AgentFlash> {
        use loopwarden_store::agent_flash::AgentFlash;
        let board = loopwarden_boards::FlashBoard::host_file();
        let flash = flash.unwrap_or_else(|| {
            AgentFlash::Memory(loopwarden_flash::sim::SimFlash::new(
                board.geometry.sectors as usize,
            ))
        });
        ConfigStore::open(flash, board.layout().config).unwrap()
    }

    #[test]
    fn learned_figures_survive_a_reopen_and_a_corrupt_part_is_refused_with_its_key() {
        use cooling_core::estimate::Scalar;
        use futures::executor::block_on;
        let cfg = CoreConfig::default();
        let configured = Learned::new(&cfg);
        let mut store = sim_store(None);
        // Nothing kept yet: nothing read, nothing refused.
        let read = block_on(load_learned(&mut store, &cfg));
        assert_eq!((read.learned, read.refused.len()), (None, 0));

        let mut l = configured;
        l.hosts[5] = Scalar {
            value: 1.37,
            var: 0.0004,
            fed_s: 3600.0,
            trust: 0.8,
        };
        l.hosts[12] = Scalar {
            value: 1.21,
            var: 0.0001,
            fed_s: 1200.0,
            trust: 0.4,
        };
        l.flow.value = 1.41;
        l.approach.value = 2.6;
        l.facility.theta = [-0.3, -0.2, 0.05, 700.0];
        l.facility_trust = [0.9, 0.5, 0.1, 0.7];
        block_on(save_learned(&mut store, &l)).unwrap();

        // After the flash is opened again, every part reads back.
        let mut store = sim_store(Some(store.into_flash()));
        let read = block_on(load_learned(&mut store, &cfg));
        assert!(read.refused.is_empty(), "{:?}", read.refused);
        assert_eq!(read.read, LEARNED_KEYS);
        let back = read.learned.unwrap();
        assert_eq!((back.flow, back.approach), (l.flow, l.approach));
        assert_eq!(back.facility, l.facility);
        assert_eq!(back.facility_trust, l.facility_trust);
        assert_eq!(back.hosts[5].value, 1.37);
        assert!((back.hosts[5].trust - 0.8).abs() < 0.005);
        assert_eq!(back.hosts[0], configured.hosts[0]);
        let mut core = cooling_core::Core::new(cfg).unwrap();
        core.restore_learned(&back).unwrap();
        assert_eq!(core.learned().hosts[12].value, 1.21);

        // Part 1 (hosts 0 to 7) written by no controller: refused with its
        // key and why, hosts 0 to 7 as configured, the rest as kept.
        block_on(store.set("cdu.learned.1", &[9u8; 93])).unwrap();
        let read = block_on(load_learned(&mut store, &cfg));
        assert_eq!(
            read.refused,
            ["cdu.learned.1: a learned record of version 9, not 2"]
        );
        assert!(!read.read.contains(&"cdu.learned.1"));
        let back = read.learned.unwrap();
        assert_eq!(back.hosts[5], configured.hosts[5]);
        assert_eq!(back.hosts[12].value, 1.21);
        assert_eq!(back.facility, l.facility);
        // A part cut short says its length.
        block_on(store.set("cdu.learned.0", &[2u8; 7])).unwrap();
        let read = block_on(load_learned(&mut store, &cfg));
        assert_eq!(
            read.refused[0],
            "cdu.learned.0: a learned record of 7 bytes"
        );
        assert_eq!(read.learned.unwrap().flow, configured.flow);
    }

    #[test]
    fn learned_host_factors_follow_the_host_not_its_place_in_the_list() {
        use cooling_core::estimate::Scalar;
        use futures::executor::block_on;
        let cfg = CoreConfig::default();
        let hosts = |swap: bool| {
            let mut h: Vec<Ident> = (0..16)
                .map(|i| Ident::new(&format!("h{i:02}")).unwrap())
                .collect();
            if swap {
                h.swap(5, 9);
            }
            host_ids(&h)
        };
        let mut l = Learned::new(&cfg);
        l.ids = hosts(false);
        // Host h05's plate fouled, its factor trusted; h09 as designed.
        l.hosts[5] = Scalar {
            value: 1.37,
            var: 0.0004,
            fed_s: 3600.0,
            trust: 0.8,
        };
        l.hosts[9].fed_s = 3600.0;
        l.hosts[13].value = 1.2;
        let mut store = sim_store(None);
        block_on(save_learned(&mut store, &l)).unwrap();
        let records = block_on(read_learned(&mut store));

        // The same list: every part as kept.
        let read = records.decode_on(&cfg, hosts(false));
        assert!(read.refused.is_empty(), "{:?}", read.refused);
        let back = read.learned.unwrap();
        assert_eq!((back.hosts[5].value, back.hosts[13].value), (1.37, 1.2));
        assert_eq!(back.ids, hosts(false));

        // h05 and h09 exchange places: neither part is read, so h09 is not
        // planned as fouled nor h05 as clean, each as configured.
        let read = records.decode_on(&cfg, hosts(true));
        assert_eq!(read.refused.len(), 2, "{:?}", read.refused);
        assert!(
            read.refused[0].starts_with(
                "cdu.learned.1: learned on other hosts than those configured as hosts 0 to 7"
            ),
            "{:?}",
            read.refused
        );
        assert!(read.refused[1].starts_with("cdu.learned.2: "));
        let back = read.learned.unwrap();
        let configured = Learned::new(&cfg);
        assert_eq!(back.hosts[..16], configured.hosts[..16]);
        assert_eq!(back.ids, hosts(true), "kept next under the new list");
        // Read by a core that knows its hosts by index only, the named
        // hosts' parts are other hosts' too.
        assert_eq!(records.decode(&cfg).refused.len(), 2);
    }

    #[test]
    fn a_flash_file_made_at_opening_is_said_new_and_a_reopened_one_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cdu.flash");
        let first = ControllerFlash::open(Some(&path)).unwrap();
        assert!(first.new_file && matches!(first.latched, Ok(None)));
        drop(first);
        assert!(!ControllerFlash::open(Some(&path)).unwrap().new_file);
        assert!(!ControllerFlash::open(None).unwrap().new_file, "memory");
    }

    /// A record an earlier version kept, with no mark beside it, gets its
    /// mark at the next opening: should it be lost later, a restart reads
    /// it as lost, not as nothing latched.
    #[test]
    fn a_record_kept_before_the_mark_gets_it_at_opening() {
        use futures::executor::block_on;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cdu.flash");
        let r = LatchRecord {
            generation: 1,
            latched: Latched {
                leaks: 0b0010,
                ..Latched::default()
            },
        };
        let marked = |stores: &mut agent_flash::Stores| {
            let mut b = [0u8; 4];
            block_on(stores.store.get(LATCH_KEPT_KEY, &mut b))
                .unwrap()
                .is_some()
        };
        {
            let mut stores = agent_flash::open(Some(&path)).unwrap();
            for (key, value) in r.items() {
                block_on(stores.store.set(key, &value)).unwrap();
            }
            assert!(!marked(&mut stores));
        }
        let opened = ControllerFlash::open(Some(&path)).unwrap();
        assert_eq!(opened.latched, Ok(Some(r)));
        drop(opened);
        assert!(marked(&mut agent_flash::open(Some(&path)).unwrap()));
    }

    #[test]
    fn entries_survive_a_reopen_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cdu.flash");
        let rt = tokio::runtime::Runtime::new().unwrap();
        let lease = crate::decide::leases::cap_lease(
            3,
            ReasonCode::CAPACITY_SHORT,
            550.0,
            std::time::Duration::from_secs(30),
        );
        let frame = Frame {
            sender: NodeId::new(Role::Cdu, "cdu-1").unwrap(),
            seq: 77,
            time: TimestampMs(1_800_000_000_000),
            message: Message::CapLease(lease),
        };
        {
            let r = ControllerFlash::open(Some(&path)).unwrap().recorder;
            record(
                &r,
                &Journal::Event {
                    time: TimestampMs(1_800_000_000_000),
                    event: event(),
                },
            );
            record(
                &r,
                &Journal::Lease {
                    host: Ident::new("h03").unwrap(),
                    frame: Box::new(frame),
                    lift: false,
                },
            );
            rt.block_on(r.flush());
        }
        let r = ControllerFlash::open(Some(&path)).unwrap().recorder;
        assert_eq!(r.path(), Some(path.as_path()));
        let entries = rt.block_on(r.read()).unwrap().entries;
        assert_eq!(entries.len(), 2);
        let v: Vec<Value> = entries.iter().map(describe).collect();
        assert_eq!(v[0]["event"]["cdu_mode_changed"]["to"], "normal", "{v:?}");
        assert_eq!(v[1]["event"]["lease_sent"]["host"], "h03", "{v:?}");
        assert_eq!(v[1]["event"]["lease_sent"]["limit_w"], 550, "{v:?}");
        assert_eq!(v[1]["event"]["lease_sent"]["reason"], "capacity-short");
    }

    #[test]
    fn a_record_lost_after_it_was_kept_is_unreadable_never_nothing_latched() {
        use futures::executor::block_on;
        use loopwarden_store::agent_flash::AgentFlash;
        let mut store = sim_store(None);
        let r = LatchRecord {
            generation: 1,
            latched: Latched {
                leaks: 0b0100,
                ..Latched::default()
            },
        };
        block_on(save_latched(&mut store, &r)).unwrap();
        block_on(save_latched(&mut store, &r)).unwrap();
        let mut flash = store.into_flash();
        let AgentFlash::Memory(f) = &mut flash else {
            panic!("a simulated flash");
        };
        // Every copy of the record and its generation loses its key, as a
        // damaged sector's items are skipped; the mark is elsewhere.
        let key = LATCHED_KEY.as_bytes();
        let bytes = f.bytes_mut();
        let at: Vec<usize> = (0..bytes.len() - key.len())
            .filter(|&i| &bytes[i..i + key.len()] == key)
            .collect();
        assert_eq!(at.len(), 4, "two records and two generations");
        for i in at {
            bytes[i] ^= 0x01;
        }
        let mut store = sim_store(Some(flash));
        let e = block_on(load_latched(&mut store)).unwrap_err();
        assert!(
            e.contains("missing from flash") && e.contains(LATCH_KEPT_KEY),
            "{e}"
        );
        // A store no record went into is nothing latched.
        assert_eq!(block_on(load_latched(&mut sim_store(None))), Ok(None));
    }

    /// A flash file whose config store was lost since a controller ran on
    /// it (its sectors erased: a repair, a board layout that moved the
    /// range, a damaged disk) while the file and its log stay: what was
    /// latched is unknown, never "nothing latched", and so stays at the
    /// next start, the mark kept anew.
    #[test]
    fn a_lost_config_store_is_an_unreadable_latch_never_nothing_latched() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cdu.flash");
        let rt = tokio::runtime::Runtime::new().unwrap();
        let r = LatchRecord {
            generation: 3,
            latched: Latched {
                leaks: 0b0101,
                ..Latched::default()
            },
        };
        {
            let opened = ControllerFlash::open(Some(&path)).unwrap();
            let mut items: Vec<(String, Vec<u8>)> = (r.items().iter())
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect();
            items.push((LATCH_KEPT_KEY.into(), vec![1]));
            rt.block_on(opened.recorder.set_all_sync(items)).unwrap();
            let time = TimestampMs(1_800_000_000_000);
            record(
                &opened.recorder,
                &Journal::Event {
                    time,
                    event: event(),
                },
            );
            rt.block_on(opened.recorder.flush());
        }
        assert_eq!(
            ControllerFlash::open(Some(&path)).unwrap().latched,
            Ok(Some(r))
        );
        let config = loopwarden_boards::FlashBoard::host_file().layout().config;
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let erased = vec![0xFF; (config.end - config.start) as usize];
        file.write_all_at(&erased, config.start.into()).unwrap();
        drop(file);
        let opened = ControllerFlash::open(Some(&path)).unwrap();
        let e = opened.latched.clone().unwrap_err();
        assert!(e.contains("config store") && e.contains("lost"), "{e}");
        assert!(!opened.new_file, "{e}");
        drop(opened);
        // The latch's mark stands for the loss from here: the store's own
        // lost mark is cleared, no loss said at every start.
        assert!(!agent_flash::open(Some(&path)).unwrap().config_lost);
        // Restarted before a record was written anew: unknown still.
        let e = ControllerFlash::open(Some(&path))
            .unwrap()
            .latched
            .unwrap_err();
        assert!(e.contains("missing from flash"), "{e}");
    }

    #[test]
    fn loading_the_latched_record_may_move_between_threads() {
        fn send<T: Send>(_: &T) {}
        let mut store = sim_store(None);
        send(&load_latched(&mut store));
    }

    #[test]
    fn two_starts_each_cut_between_record_and_generation_read_the_newest_state() {
        use futures::executor::block_on;
        let mut store = sim_store(None);
        let record = |generation, leaks| LatchRecord {
            generation,
            latched: Latched {
                leaks,
                ..Latched::default()
            },
        };
        block_on(save_latched(&mut store, &record(1, 0))).unwrap();
        // Each time only the record goes in before the power goes: the
        // start believes it one ahead and writes the generation it left
        // behind, so the next cut (two ahead otherwise) reads too.
        for (generation, leaks) in [(2, 0b01), (3, 0b11)] {
            let [(key, item), _] = record(generation, leaks).items();
            block_on(store.set(key, &item)).unwrap();
            let read = block_on(load_latched(&mut store));
            assert_eq!(read, Ok(Some(record(generation, leaks))));
            block_on(catch_up_latched(&mut store, &record(generation, leaks)));
        }
    }

    #[test]
    fn a_damaged_newest_record_is_unreadable_never_the_older_state() {
        use futures::executor::block_on;
        use loopwarden_store::agent_flash::AgentFlash;
        let mut store = sim_store(None);
        assert_eq!(block_on(load_latched(&mut store)), Ok(None));
        let older = LatchRecord {
            generation: 1,
            latched: Latched {
                leaks: 0b0010,
                ..Latched::default()
            },
        };
        let newer = LatchRecord {
            generation: 2,
            latched: Latched::default(),
        };
        for r in [older, newer] {
            block_on(save_latched(&mut store, &r)).unwrap();
        }
        assert_eq!(block_on(load_latched(&mut store)), Ok(Some(newer)));
        // The newest record's bytes change in the flash.
        let mut flash = store.into_flash();
        let AgentFlash::Memory(f) = &mut flash else {
            panic!("a simulated flash");
        };
        assert!(damage_record(f.bytes_mut(), &newer));
        let mut store = sim_store(Some(flash));
        let e = block_on(load_latched(&mut store)).unwrap_err();
        assert!(
            e.contains("generation 1") && e.contains("generation 2"),
            "{e}"
        );
        // A record of the format before generations reads as it is.
        let mut store = sim_store(None);
        block_on(store.set(LATCHED_KEY, &older.latched.encode())).unwrap();
        let read = block_on(load_latched(&mut store)).unwrap().unwrap();
        assert_eq!(read.latched, older.latched);
    }
}
