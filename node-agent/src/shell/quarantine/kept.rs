//! At the start, the GPUs kept quarantined: the actions of every one of
//! them run again, whether they were known done or not. A drain known
//! done may have been lifted since, with no word to the agent: Slurm
//! returns a node to service after the reboot an XID 79 asks for
//! (`scontrol reboot ASAP nextstate=RESUME`), a cold start of its
//! controller or an operator's `State=RESUME` clears every drain. Run
//! again, the drain puts the node back out for the GPU the agent still
//! holds quarantined; on a node still drained for it, `loopwarden-slurm`
//! writes nothing. The log says which were not known done (the agent
//! killed while they ran or before they started, or one failed) and which
//! were.
//!
//! Glossary:
//! - *known done*: every action of the GPU's quarantine in force ended
//!   well, its stamp kept as [`Record::Done`].

use loopwarden_flash::ConfigStore;
use loopwarden_protocol::HealthState;
use loopwarden_store::agent_flash::Flash;

use super::{read_kept, Record};
use crate::shell::Agent;

/// The GPUs kept quarantined (`health`; `uuids`: every GPU's, in index
/// order) whose quarantine's actions are not known done (a stamp other
/// than theirs, or none, kept as [`Record::Done`]).
pub(in crate::shell) async fn not_done(
    store: &mut ConfigStore<Flash>,
    health: &node_core::health::HealthEngine,
    uuids: &[&str],
) -> Vec<u8> {
    let mut gpus = Vec::new();
    for gpu in 0..health.len() as u8 {
        let Some(st) = health.status(gpu) else {
            continue;
        };
        if st.state != HealthState::Quarantined {
            continue;
        }
        let id = uuids
            .get(gpu as usize)
            .and_then(|u| crate::shell::identity(u));
        let done = match id {
            Some(id) => match read_kept(store, Record::Done, id).await {
                Ok(Some(stamp)) => <[u8; 8]>::try_from(stamp.as_slice())
                    .ok()
                    .map(u64::from_le_bytes),
                Ok(None) => None,
                Err(e) => {
                    tracing::error!("GPU {gpu}: whether its quarantine actions ran is unreadable ({e}): taken as not");
                    None
                }
            },
            None => None,
        };
        if done != Some(st.since.0) {
            gpus.push(gpu);
        }
    }
    gpus
}

impl Agent {
    /// At the start: the actions of every GPU kept quarantined run again;
    /// `not_done`: those whose actions are not known done ([`not_done`]),
    /// said apart from those that were.
    pub(in crate::shell) fn resume_actions(&mut self, not_done: &[u8]) {
        if self.config.quarantine_actions.is_empty() {
            return;
        }
        for gpu in self.quarantined() {
            let why = if not_done.contains(&gpu) {
                "quarantined before the restart, its actions not known to have ended well"
            } else {
                "quarantined still at this start (its actions ended well before it; the scheduler may have put the node back in service since: a reboot, a resume)"
            };
            self.run_actions_again(gpu, why);
        }
    }
}
