//! The replay floors in flash: the highest sequence number and the latest
//! stamp taken from each signer, so that a command refused (or taken)
//! before a restart is
//! refused as `replayed` after it, not acted on for the minutes its stamp
//! is still fresh; and the last state taken from the host's CDU (its seq
//! and stamp), so that an older state sent again after a restart (a
//! "cooled" that would end a cooling loss) is refused as a replay too.
//!
//! One config-store value per signer, under a key made from a hash of its
//! role and name (a name may be longer than a key), holding the signer and
//! its floor, so a key that two signers share is told apart. It is kept
//! without waiting, before the command's ack in the flash thread's queue.
//! At start the keyring's named signers and the host's CDU are looked up.
//!
//! Each record is kept with its check record under a key of its own
//! ([`check_key`]), both handed over as one: the record's check
//! ([`check_of`]), then a copy of the floor it holds. The store skips a
//! damaged copy and returns the one before it, so a damaged newest record
//! would otherwise read as an older floor, and a command numbered between
//! the two, captured before the restart, would be taken. A record that
//! its check does not match is said, and the higher floor of the two
//! (the record read, the copy in the check record) is taken: the newest
//! kept, whichever of the two was damaged, so every command of that
//! signer numbered at or below the last one taken is still a replay. A
//! record an earlier version kept without a check reads as before (said
//! at info); one that kept the sequence number alone reads as a seq-only
//! floor ([`Node::restore_seq_floor`]).
//!
//! A record the flash refuses to keep is said at error, naming the
//! signer, and counted by the flash thread
//! (`loopwarden_flash_config_refused_total`): after a restart, commands
//! from that signer up to it may be taken again while they are fresh.
//!
//! Glossary:
//! - *floor*: the highest sequence number and the latest stamp taken from
//!   a signer; a command at or below both is a replay.
//! - *check record*: what is kept after a record: its check and a copy of
//!   its floor.

use loopwarden_flash::ConfigStore;
use loopwarden_protocol::{Ident, NodeId, ReplayFloor, Role, TimestampMs};
use loopwarden_store::agent_flash::Flash;
use loopwarden_store::check::{check_of, checked};
use loopwarden_store::recorder::Recorder;
use node_core::node::Node;
use serde::{Deserialize, Serialize};

use super::quarantine::get;
use crate::config::Config;

/// What is kept: the signer, and its floor.
#[derive(Serialize, Deserialize)]
struct Kept {
    sender: NodeId,
    seq: u32,
    time: TimestampMs,
}

/// The record an earlier version kept: the signer and its last seq.
#[derive(Deserialize)]
struct KeptV1 {
    sender: NodeId,
    seq: u32,
}

/// A floor as read: its seq, and its stamp unless an earlier version
/// kept it (seq-only).
type ReadFloor = (u32, Option<TimestampMs>);

impl Kept {
    /// The record in `bytes`, of this version or the one before.
    fn read(bytes: &[u8]) -> postcard::Result<(NodeId, ReadFloor)> {
        match postcard::from_bytes::<Kept>(bytes) {
            Ok(k) => Ok((k.sender, (k.seq, Some(k.time)))),
            Err(_) => {
                let v1 = postcard::from_bytes::<KeptV1>(bytes)?;
                Ok((v1.sender, (v1.seq, None)))
            }
        }
    }

    /// Its floor as copied in its check record: seq and stamp,
    /// little-endian.
    fn copy(floor: ReplayFloor) -> Vec<u8> {
        let mut b = floor.seq.to_le_bytes().to_vec();
        b.extend_from_slice(&floor.time.0.to_le_bytes());
        b
    }

    /// The floor a check record's copy holds (an earlier version's: the
    /// seq alone).
    fn of_copy(b: &[u8]) -> Option<ReadFloor> {
        let seq = u32::from_le_bytes(b.get(..4)?.try_into().ok()?);
        let time = b
            .get(4..12)
            .and_then(|t| Some(TimestampMs(u64::from_le_bytes(t.try_into().ok()?))));
        Some((seq, time))
    }
}

/// The config-store key of `sender`'s floor: `replay.` and the 64-bit
/// FNV-1a hash of its role and name, in hex.
fn key(sender: &NodeId) -> String {
    let h = super::fnv1a(&[
        sender.role.as_str().as_bytes(),
        b"/",
        sender.id.as_str().as_bytes(),
    ]);
    format!("replay.{h:016x}")
}

/// The config-store key of the check record kept after `key`'s record.
fn check_key(key: &str) -> String {
    format!("{key}.c")
}

/// The length of a check ([`check_of`]), at the head of a check record.
const CHECK_LEN: usize = 8;

/// What keeps `value` (under `key`) and its floor `copy`: the record,
/// then its check record.
fn items(key: String, value: Vec<u8>, copy: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut check = check_of(&value);
    check.extend_from_slice(copy);
    let check_key = check_key(&key);
    vec![(key, value), (check_key, check)]
}

/// Hands `items` (the floor of `what`) to the flash thread as one,
/// without waiting; a refusal by the flash is said when it comes (and
/// counted by the flash thread).
fn keep_items(recorder: &Recorder, what: String, items: Vec<(String, Vec<u8>)>) {
    // Not handed over: said and counted by the recorder.
    let Ok(done) = recorder.set_all_later(items) else {
        return;
    };
    // Outside a runtime (never in the agent) the flash thread says it.
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        if let Ok(Err(e)) = done.await {
            tracing::error!(
                "replay floor of {what} not kept in flash ({e}): after a restart, its commands \
                 taken since the last floor kept may be taken again while they are fresh"
            );
        }
    });
}

/// A record its check record does not match (or that cannot be read).
struct Mismatch {
    /// Why, naming the key.
    why: String,
    /// The record read, if any (an older copy, or the newest one when the
    /// check record's newest copy is the damaged one).
    value: Option<Vec<u8>>,
    /// The floor copied in the check record, if readable.
    copy: Option<Vec<u8>>,
}

/// The record under `key`, checked against its check record: `Ok` with
/// the record (none kept, or an earlier version's without a check, said
/// at info), or what was found instead.
async fn read_checked(
    store: &mut ConfigStore<Flash>,
    key: &str,
) -> Result<Option<Vec<u8>>, Mismatch> {
    let check = match get(store, &check_key(key)).await {
        Ok(check) => check,
        Err(why) => {
            let value = get(store, key).await.ok().flatten();
            let copy = None;
            return Err(Mismatch { why, value, copy });
        }
    };
    let value = match get(store, key).await {
        Ok(value) => value,
        Err(why) => {
            let copy = check.map(|c| c.get(CHECK_LEN..).unwrap_or_default().to_vec());
            return Err(Mismatch {
                why,
                value: None,
                copy,
            });
        }
    };
    let Some(check) = check else {
        if value.is_some() {
            tracing::info!("{key}: kept without its check (an earlier version): read as it is");
        }
        return Ok(value);
    };
    let (sum, copy) = check.split_at(check.len().min(CHECK_LEN));
    checked(key, value.clone(), Some(sum.to_vec())).map_err(|why| Mismatch {
        why,
        value,
        copy: Some(copy.to_vec()),
    })
}

/// Keeps `sender`'s floor, without waiting.
pub(super) fn keep(recorder: &Recorder, sender: NodeId, floor: ReplayFloor) {
    let key = key(&sender);
    let who = format!("{}/{}", sender.role.as_str(), sender.id);
    let kept = Kept {
        sender,
        seq: floor.seq,
        time: floor.time,
    };
    match postcard::to_allocvec(&kept) {
        Ok(value) => keep_items(recorder, who, items(key, value, &Kept::copy(floor))),
        Err(e) => tracing::error!("replay floor {key} not kept: {e}"),
    }
}

/// The config-store key of the floor of the CDU's states taken.
const STATE_KEY: &str = "replay.cdu-state";

/// What is kept of the CDU's states taken: its CDU, the floor (the
/// highest seq and the latest stamp), then the last state's seq and
/// stamp. A record an earlier version kept ends after the floor, which
/// was then the last state's.
#[derive(Serialize, Deserialize)]
struct KeptState {
    cdu: Ident,
    seq: u32,
    time: TimestampMs,
    last: (u32, TimestampMs),
}

/// The record an earlier version kept: the last state's seq and stamp.
#[derive(Deserialize)]
struct KeptStateV1 {
    cdu: Ident,
    seq: u32,
    time: TimestampMs,
}

impl KeptState {
    /// Its floor and last state as copied in its check record: the seq
    /// and the stamp of each, little-endian.
    fn copy(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(24);
        b.extend_from_slice(&self.seq.to_le_bytes());
        b.extend_from_slice(&self.time.0.to_le_bytes());
        b.extend_from_slice(&self.last.0.to_le_bytes());
        b.extend_from_slice(&self.last.1 .0.to_le_bytes());
        b
    }

    /// The floor and the last state a check record's [`KeptState::copy`]
    /// holds.
    fn of_copy(b: &[u8]) -> Option<(ReplayFloor, (u32, TimestampMs))> {
        let u32_at = |i: usize| Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?));
        let u64_at = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
        let floor = ReplayFloor::new(u32_at(0)?, TimestampMs(u64_at(4)?));
        Some((floor, (u32_at(12)?, TimestampMs(u64_at(16)?))))
    }

    /// The record in `bytes`, of this version or the one before.
    fn read(bytes: &[u8]) -> postcard::Result<Self> {
        postcard::from_bytes::<KeptState>(bytes).or_else(|_| {
            let v1 = postcard::from_bytes::<KeptStateV1>(bytes)?;
            let last = (v1.seq, v1.time);
            Ok(KeptState {
                cdu: v1.cdu,
                seq: v1.seq,
                time: v1.time,
                last,
            })
        })
    }
}

/// Keeps the floor of the states taken from `cdu` and the last one's seq
/// and stamp, without waiting.
pub(super) fn keep_state(
    recorder: &Recorder,
    cdu: Ident,
    floor: ReplayFloor,
    last: (u32, TimestampMs),
) {
    let kept = KeptState {
        cdu,
        seq: floor.seq,
        time: floor.time,
        last,
    };
    match postcard::to_allocvec(&kept) {
        Ok(value) => {
            let what = format!("cdu/{}'s states", kept.cdu);
            keep_items(recorder, what, items(STATE_KEY.into(), value, &kept.copy()))
        }
        Err(e) => tracing::error!("{STATE_KEY} not kept: {e}"),
    }
}

/// Gives `node` the last state taken from `cdu` before the restart, if
/// the flash kept one of that CDU (one kept for another CDU, before the
/// configuration changed, is not its).
pub(super) async fn restore_state(node: &mut Node, cdu: &Ident, store: &mut ConfigStore<Flash>) {
    if let Some((floor, last)) = state_of(cdu, store).await {
        node.restore_state_floor(floor, last);
    }
}

/// The floor of the states taken from `cdu` and the last one's seq and
/// stamp, as kept. A record its check does not match gives the higher of
/// the two floors (the record read, the copy in the check record), and
/// the last state of that one.
async fn state_of(
    cdu: &Ident,
    store: &mut ConfigStore<Flash>,
) -> Option<(ReplayFloor, (u32, TimestampMs))> {
    let read = |bytes: &[u8]| KeptState::read(bytes).map_err(|e| e.to_string());
    let Mismatch { why, value, copy } = match read_checked(store, STATE_KEY).await {
        Ok(Some(bytes)) => match read(&bytes) {
            Ok(k) if k.cdu == *cdu => return Some((ReplayFloor::new(k.seq, k.time), k.last)),
            Ok(_) => return None,
            Err(e) => {
                tracing::warn!(
                    "the last state of cdu/{cdu} taken: unreadable in flash ({e}); a state \
                     sent before the restart is checked against its time only"
                );
                return None;
            }
        },
        Ok(None) => return None,
        Err(m) => m,
    };
    let value = value.and_then(|b| read(&b).ok()).filter(|k| k.cdu == *cdu);
    let value = value.map(|k| (ReplayFloor::new(k.seq, k.time), k.last));
    let copy = copy.as_deref().and_then(KeptState::of_copy);
    let found = || [value, copy].into_iter().flatten();
    let Some((mut floor, last)) = found().max_by_key(|(f, _)| (f.seq, f.time)) else {
        tracing::error!(
            "the last state of cdu/{cdu} taken: {why}, and no floor readable; a state sent \
             before the restart is checked against its time only"
        );
        return None;
    };
    for (f, _) in found() {
        floor.raise(f.seq, f.time);
    }
    tracing::error!(
        "the last state of cdu/{cdu} taken: {why}: the higher floor found is taken, seq {} \
         stamped {}",
        floor.seq,
        floor.time.0
    );
    Some((floor, last))
}

/// The signers whose floors are looked up at start: the keyring's, by
/// name, and the host's CDU (the twin's demonstration keyring names none).
pub(super) fn signers(config: &Config) -> Vec<NodeId> {
    let mut named: Vec<NodeId> = (config.authority.signers.iter())
        .filter_map(|s| s.name.clone().map(|id| NodeId { role: s.role, id }))
        .collect();
    if let Some(cdu) = &config.cdu {
        let cdu = NodeId {
            role: Role::Cdu,
            id: cdu.clone(),
        };
        if !named.contains(&cdu) {
            named.push(cdu);
        }
    }
    named
}

/// Gives `node` the floors kept for `signers`.
pub(super) async fn restore(node: &mut Node, signers: &[NodeId], store: &mut ConfigStore<Flash>) {
    for sender in signers {
        match floor_of(sender, store).await {
            Some((seq, Some(time))) => {
                node.restore_replay_floor(sender, ReplayFloor::new(seq, time))
            }
            Some((seq, None)) => node.restore_seq_floor(sender, seq),
            None => {}
        }
    }
}

/// The higher of two floors read: seq-only if either is (no stamp of it
/// known, so every command at or below its number is a replay until one
/// above is taken).
fn higher(a: ReadFloor, b: ReadFloor) -> ReadFloor {
    (a.0.max(b.0), a.1.zip(b.1).map(|(x, y)| x.max(y)))
}

/// The floor kept for `sender`. A record its check does not match gives
/// the higher of the two floors found (the record read, the copy in the
/// check record), said.
async fn floor_of(sender: &NodeId, store: &mut ConfigStore<Flash>) -> Option<ReadFloor> {
    let who = format!("{}/{}", sender.role.as_str(), sender.id);
    let key = key(sender);
    let read = |bytes: &[u8]| Kept::read(bytes).map_err(|e| e.to_string());
    let Mismatch { why, value, copy } = match read_checked(store, &key).await {
        Ok(Some(bytes)) => match read(&bytes) {
            Ok((s, floor)) if s == *sender => return Some(floor),
            Ok(_) => return None, // another signer's, under the same key
            Err(e) => {
                tracing::warn!(
                    "replay floor of {who}: unreadable in flash ({e}); its commands \
                     stamped before this start are replays"
                );
                return None;
            }
        },
        Ok(None) => return None,
        Err(m) => m,
    };
    let value = value.and_then(|b| read(&b).ok());
    let value = value.filter(|(s, _)| s == sender).map(|(_, f)| f);
    let copy = copy.as_deref().and_then(Kept::of_copy);
    let Some(floor) = [value, copy].into_iter().flatten().reduce(higher) else {
        tracing::error!(
            "replay floor of {who}: {why}, and no floor readable; its commands stamped \
             before this start are replays"
        );
        return None;
    };
    tracing::error!(
        "replay floor of {who}: {why}: the higher floor found, seq {}{}, is taken: its \
         commands at or below it are replays",
        floor.0,
        floor
            .1
            .map_or(String::new(), |t| format!(" stamped {}", t.0))
    );
    Some(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_fit_the_store_and_differ_by_role_and_name() {
        let long = "a".repeat(loopwarden_protocol::ids::IDENT_MAX);
        let k = key(&NodeId::new(Role::Operator, &long).unwrap());
        assert!(
            check_key(&k).len() <= loopwarden_flash::config::MAX_KEY,
            "{k}"
        );
        assert!(check_key(STATE_KEY).len() <= loopwarden_flash::config::MAX_KEY);
        assert_ne!(
            key(&NodeId::new(Role::Cdu, "ops1").unwrap()),
            key(&NodeId::new(Role::Operator, "ops1").unwrap())
        );
        let kept = Kept {
            sender: NodeId::new(Role::Operator, &long).unwrap(),
            seq: u32::MAX,
            time: TimestampMs(u64::MAX),
        };
        let bytes = postcard::to_allocvec(&kept).unwrap();
        assert!(bytes.len() <= loopwarden_flash::config::MAX_VALUE);
        assert!(STATE_KEY.len() <= loopwarden_flash::config::MAX_KEY);
        let state = KeptState {
            cdu: Ident::new(&long).unwrap(),
            seq: u32::MAX,
            time: TimestampMs(u64::MAX),
            last: (u32::MAX, TimestampMs(u64::MAX)),
        };
        let bytes = postcard::to_allocvec(&state).unwrap();
        assert!(bytes.len() <= loopwarden_flash::config::MAX_VALUE);
    }

    fn set_all(store: &mut ConfigStore<Flash>, items: Vec<(String, Vec<u8>)>) {
        for (key, value) in items {
            futures::executor::block_on(store.set(&key, &value)).unwrap();
        }
    }

    /// Floor 5 kept, then floor 9, each with its check record as `keep`
    /// hands them over; the newest copy of the record damaged: the store
    /// reads floor 5, which the check does not match, and 9 is taken from
    /// the check record, never 5. A record with no check (an earlier
    /// version's) reads as it is.
    #[test]
    fn a_damaged_newest_floor_is_not_read_as_the_older() {
        let ops = NodeId::new(Role::Operator, "ops1").unwrap();
        let t = |seq: u32| TimestampMs(1_000 * u64::from(seq));
        let record = |seq| {
            let kept = Kept {
                sender: ops.clone(),
                seq,
                time: t(seq),
            };
            let value = postcard::to_allocvec(&kept).unwrap();
            items(key(&ops), value, &Kept::copy(ReplayFloor::new(seq, t(seq))))
        };
        let floor =
            |store: &mut ConfigStore<Flash>| futures::executor::block_on(floor_of(&ops, store));
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        assert_eq!(floor(&mut store), None);
        set_all(&mut store, record(5));
        set_all(&mut store, record(9));
        assert_eq!(floor(&mut store), Some((9, Some(t(9)))));
        let newest = record(9).remove(0).1;
        let mut store = super::super::damage_newest(store, &newest);
        assert_eq!(floor(&mut store), Some((9, Some(t(9)))), "not the older, 5");
        // The check record's newest copy damaged instead: the record is
        // the newest.
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        set_all(&mut store, record(5));
        set_all(&mut store, record(9));
        let check = record(9).remove(1).1;
        let mut store = super::super::damage_newest(store, &check);
        assert_eq!(floor(&mut store), Some((9, Some(t(9)))));
        // An earlier version's record, no check record.
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        set_all(&mut store, vec![record(7).remove(0)]);
        assert_eq!(floor(&mut store), Some((7, Some(t(7)))));
    }

    /// A floor the version before kept (the seq alone, in the record and
    /// in its check record's copy) reads as a seq-only floor, damaged or
    /// not; a record of this version reads with its stamp.
    #[test]
    fn a_floor_of_the_version_before_reads_as_seq_only() {
        #[derive(Serialize)]
        struct Before {
            sender: NodeId,
            seq: u32,
        }
        let ops = NodeId::new(Role::Operator, "ops1").unwrap();
        let record = |seq| {
            let before = Before {
                sender: ops.clone(),
                seq,
            };
            let value = postcard::to_allocvec(&before).unwrap();
            items(key(&ops), value, &u32::to_le_bytes(seq))
        };
        let floor =
            |store: &mut ConfigStore<Flash>| futures::executor::block_on(floor_of(&ops, store));
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        set_all(&mut store, record(5));
        set_all(&mut store, record(9));
        assert_eq!(floor(&mut store), Some((9, None)));
        let newest = record(9).remove(0).1;
        let mut store = super::super::damage_newest(store, &newest);
        assert_eq!(floor(&mut store), Some((9, None)), "from the check's copy");
        let now = Kept {
            sender: ops.clone(),
            seq: 3,
            time: TimestampMs(42),
        };
        let bytes = postcard::to_allocvec(&now).unwrap();
        assert_eq!(
            Kept::read(&bytes).unwrap(),
            (ops, (3, Some(TimestampMs(42))))
        );
    }

    /// The floor of the CDU's states: a damaged newest record is not read
    /// as the older floor and last state.
    #[test]
    fn a_damaged_newest_state_floor_is_not_read_as_the_older() {
        let cdu = Ident::new("cdu1").unwrap();
        let record = |seq, time| {
            let kept = KeptState {
                cdu: cdu.clone(),
                seq,
                time: TimestampMs(time),
                last: (seq, TimestampMs(time)),
            };
            let value = postcard::to_allocvec(&kept).unwrap();
            items(STATE_KEY.into(), value, &kept.copy())
        };
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        set_all(&mut store, record(5, 1_000));
        set_all(&mut store, record(9, 2_000));
        let newest = record(9, 2_000).remove(0).1;
        let mut store = super::super::damage_newest(store, &newest);
        let kept = futures::executor::block_on(state_of(&cdu, &mut store));
        let nine = (9, TimestampMs(2_000));
        assert_eq!(kept, Some((ReplayFloor::new(9, TimestampMs(2_000)), nine)));
    }

    /// A record an earlier version kept (the last state's seq and stamp
    /// alone) reads as a floor and a last state both of them.
    #[test]
    fn a_state_record_of_the_version_before_reads_as_its_floor_and_last() {
        #[derive(Serialize)]
        struct Before {
            cdu: Ident,
            seq: u32,
            time: TimestampMs,
        }
        let cdu = Ident::new("cdu1").unwrap();
        let old = Before {
            cdu: cdu.clone(),
            seq: 7,
            time: TimestampMs(1_000),
        };
        let k = KeptState::read(&postcard::to_allocvec(&old).unwrap()).unwrap();
        assert_eq!(
            (k.seq, k.time, k.last),
            (7, TimestampMs(1_000), (7, TimestampMs(1_000)))
        );
        let new = KeptState {
            cdu,
            seq: 100,
            time: TimestampMs(2_000),
            last: (3, TimestampMs(2_000)),
        };
        let k = KeptState::read(&postcard::to_allocvec(&new).unwrap()).unwrap();
        assert_eq!(
            (k.seq, k.time, k.last),
            (100, TimestampMs(2_000), (3, TimestampMs(2_000)))
        );
    }
}
