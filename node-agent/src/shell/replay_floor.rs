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
use loopwarden_protocol::{Ident, NodeId, Role, TimestampMs};
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

/// The config-store key of the last CDU state taken.
const STATE_KEY: &str = "replay.cdu-state";

/// What is kept of the last CDU state taken: its CDU, seq and stamp.
#[derive(Serialize, Deserialize)]
struct KeptState {
    cdu: Ident,
    seq: u32,
    time: TimestampMs,
}

/// Keeps the last state taken from `cdu`, without waiting.
pub(super) fn keep_state(recorder: &Recorder, cdu: Ident, seq: u32, time: TimestampMs) {
    match postcard::to_allocvec(&KeptState { cdu, seq, time }) {
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
        Ok(Some(n)) => match postcard::from_bytes::<KeptState>(&buf[..n]) {
            Ok(k) if k.cdu == *cdu => node.restore_state_floor(k.seq, k.time),
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
        };
        let bytes = postcard::to_allocvec(&state).unwrap();
        assert!(bytes.len() <= loopwarden_flash::config::MAX_VALUE);
    }
}
