//! The replay floors in flash: the last sequence number accepted from each
//! signer, so that a command refused (or taken) before a restart is
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
//! Glossary:
//! - *floor*: the last sequence number accepted from a signer; a command
//!   at or below it is a replay.

use loopwarden_flash::ConfigStore;
use loopwarden_protocol::{Ident, NodeId, ReplayFloor, Role, TimestampMs};
use loopwarden_store::agent_flash::Flash;
use loopwarden_store::recorder::Recorder;
use node_core::node::Node;
use serde::{Deserialize, Serialize};

use crate::config::Config;

/// What is kept: the signer, and its floor.
#[derive(Serialize, Deserialize)]
struct Kept {
    sender: NodeId,
    seq: u32,
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

/// Keeps `sender`'s floor, without waiting.
pub(super) fn keep(recorder: &Recorder, sender: NodeId, seq: u32) {
    let key = key(&sender);
    match postcard::to_allocvec(&Kept { sender, seq }) {
        Ok(value) => recorder.set(key, value),
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
        Ok(value) => recorder.set(STATE_KEY.to_string(), value),
        Err(e) => tracing::error!("{STATE_KEY} not kept: {e}"),
    }
}

/// Gives `node` the last state taken from `cdu` before the restart, if
/// the flash kept one of that CDU (one kept for another CDU, before the
/// configuration changed, is not its).
pub(super) async fn restore_state(node: &mut Node, cdu: &Ident, store: &mut ConfigStore<Flash>) {
    let mut buf = [0u8; loopwarden_flash::config::MAX_VALUE];
    match store.get(STATE_KEY, &mut buf).await {
        Ok(Some(n)) => match KeptState::read(&buf[..n]) {
            Ok(k) if k.cdu == *cdu => {
                node.restore_state_floor(ReplayFloor::new(k.seq, k.time), k.last)
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(
                "the last state of cdu/{cdu} taken: unreadable in flash ({e}); a state sent \
                 before the restart is checked against its time only"
            ),
        },
        Ok(None) => {}
        Err(e) => tracing::warn!("the last state of cdu/{cdu} taken: flash read failed: {e}"),
    }
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
        let mut buf = [0u8; loopwarden_flash::config::MAX_VALUE];
        match store.get(&key(sender), &mut buf).await {
            Ok(Some(n)) => match postcard::from_bytes::<Kept>(&buf[..n]) {
                Ok(k) if k.sender == *sender => node.restore_replay_floor(sender, k.seq),
                Ok(_) => {} // another signer's, under the same key
                Err(e) => tracing::warn!(
                    "replay floor of {}/{}: unreadable in flash ({e}); its commands are \
                     checked against their time only until it sends one",
                    sender.role.as_str(),
                    sender.id
                ),
            },
            Ok(None) => {}
            Err(e) => tracing::warn!(
                "replay floor of {}/{}: flash read failed: {e}",
                sender.role.as_str(),
                sender.id
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_fit_the_store_and_differ_by_role_and_name() {
        let long = "a".repeat(loopwarden_protocol::ids::IDENT_MAX);
        let k = key(&NodeId::new(Role::Operator, &long).unwrap());
        assert!(k.len() <= loopwarden_flash::config::MAX_KEY, "{k}");
        assert_ne!(
            key(&NodeId::new(Role::Cdu, "ops1").unwrap()),
            key(&NodeId::new(Role::Operator, "ops1").unwrap())
        );
        let kept = Kept {
            sender: NodeId::new(Role::Operator, &long).unwrap(),
            seq: u32::MAX,
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
