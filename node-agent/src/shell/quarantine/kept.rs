//! At the start, the GPUs kept quarantined: the actions of those not
//! known done run again (the agent killed while they ran or before they
//! started, or one failed). Those known done run again only with
//! `[quarantine] again_at_start`: a drain known done may have been lifted
//! since, with no word to the agent (Slurm returns a node to service
//! after the reboot an XID 79 asks for, `scontrol reboot ASAP
//! nextstate=RESUME`; a cold start of its controller or an operator's
//! `State=RESUME` clears every drain), and run again it puts the node back
//! out; but an action that cancels jobs or files a ticket would do so at
//! every restart, so the site says its actions bear it. Such a run that
//! fails makes them known done no more. The log says which were not
//! known done, which run again, and which were left.
//!
//! The record of actions done keeps the GPU's index they ran under: a
//! reboot that numbers the GPUs otherwise (one pulled, or fallen off the
//! bus) leaves what they did naming the old index (the shipped drain's
//! tag `gpu{gpu}`), so a GPU known done under another index is not known
//! done, and the log names the stale index for an operator to undo. The
//! agent cannot see the scheduler undo it: the stale index is kept under
//! the GPU's identity and said at every start while the GPU stays
//! quarantined ([`stale_tags`]), until an operator releases it or the
//! GPU at that index is quarantined itself (the tag its own).
//!
//! Glossary:
//! - *known done*: every action of the GPU's quarantine in force ended
//!   well, its stamp kept as [`Record::Done`] with the index they ran
//!   under, that GPU's index now (a stamp an earlier version kept, with
//!   no index, counts whatever the index).
//! - *stale index*: an index a GPU's quarantine actions ran under before
//!   the GPUs were numbered otherwise, what they left there (a drain
//!   tagged `gpu{was}`) maybe still standing.

use loopwarden_flash::ConfigStore;
use loopwarden_protocol::HealthState;
use loopwarden_store::agent_flash::Flash;

use super::{read_kept, Record};
use crate::shell::Agent;

/// The payload of a GPU's [`Record::Done`]: the stamp of the quarantine
/// whose actions ended well (wall ms, 8 bytes little-endian), then the
/// GPU's index they ran under (what they left may name it: a drain's
/// tag `gpu{gpu}`).
pub(super) fn done_payload(since: u64, gpu: u8) -> [u8; 9] {
    let mut p = [gpu; 9];
    p[..8].copy_from_slice(&since.to_le_bytes());
    p
}

/// The stamp and index of a [`done_payload`]; an earlier version's holds
/// the stamp alone (index `None`); `None`: neither.
fn read_done(payload: &[u8]) -> Option<(u64, Option<u8>)> {
    let stamp = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
    match payload.len() {
        8 => Some((stamp, None)),
        9 => Some((stamp, Some(payload[8]))),
        _ => None,
    }
}

/// The GPUs kept quarantined (`health`; `uuids`: every GPU's, in index
/// order) whose quarantine's actions are not known done: a stamp other
/// than theirs, or none, kept as [`Record::Done`], or theirs kept under
/// another index (the GPUs numbered otherwise since: said, with what to
/// undo by hand); and each GPU's stale indexes ([`stale_tags`]).
pub(in crate::shell) async fn not_done(
    store: &mut ConfigStore<Flash>,
    health: &node_core::health::HealthEngine,
    uuids: &[&str],
) -> (Vec<u8>, Vec<(u8, Vec<u8>)>) {
    let mut gpus = Vec::new();
    let mut renumbered = Vec::new();
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
                Ok(Some(payload)) => read_done(&payload),
                Ok(None) => None,
                Err(e) => {
                    tracing::error!("GPU {gpu}: whether its quarantine actions ran is unreadable ({e}): taken as not");
                    None
                }
            },
            None => None,
        };
        match done {
            Some((stamp, None)) if stamp == st.since.0 => {}
            Some((stamp, Some(was))) if stamp == st.since.0 && was == gpu => {}
            Some((stamp, Some(was))) if stamp == st.since.0 => {
                if say_renumbered(gpu, was, health) {
                    renumbered.push((gpu, was));
                }
                gpus.push(gpu);
            }
            _ => gpus.push(gpu),
        }
    }
    let stale = stale_tags(store, health, uuids, &renumbered).await;
    (gpus, stale)
}

/// The key of the record of the indexes a GPU's quarantine actions ran
/// under before the GPUs were numbered otherwise, what they left there
/// stale (one byte each), under its identity `id`.
fn stale_key(id: u64) -> String {
    format!("stale_index.{id:016x}")
}

/// At the start: each GPU's stale indexes (its quarantine actions ran
/// under them before the GPUs were numbered otherwise: what they left
/// there, a drain tagged `gpu{was}`, may still stand), those found at
/// this start (`renumbered`, said then) kept with those kept before, and
/// said at every start while the GPU stays quarantined: the agent cannot
/// see the scheduler undo them. An index whose GPU is quarantined now
/// holds its own tag, and a GPU released by an operator (not quarantined,
/// its kept state read: one unreadable may be quarantined still) ends
/// its record: neither is said again. Returns what is said, by GPU.
pub(in crate::shell) async fn stale_tags(
    store: &mut ConfigStore<Flash>,
    health: &node_core::health::HealthEngine,
    uuids: &[&str],
    renumbered: &[(u8, u8)],
) -> Vec<(u8, Vec<u8>)> {
    let quarantined = |g: u8| {
        health
            .status(g)
            .is_some_and(|st| st.state == HealthState::Quarantined)
    };
    let mut said = Vec::new();
    for gpu in 0..health.len() as u8 {
        let Some(id) = uuids
            .get(gpu as usize)
            .and_then(|u| crate::shell::identity(u))
        else {
            continue;
        };
        let key = stale_key(id);
        let kept = match super::get(store, &key)
            .await
            .and_then(|v| super::payload_of(&key, v, id))
        {
            Ok(kept) => kept,
            Err(e) => {
                tracing::error!("GPU {gpu}: the indexes its quarantine actions ran under before a renumbering are unreadable ({e}): check by hand that no drain of another index is left for it");
                continue;
            }
        };
        let mut stale = kept.clone().unwrap_or_default();
        stale.extend(renumbered.iter().filter(|r| r.0 == gpu).map(|r| r.1));
        stale.sort_unstable();
        stale.dedup();
        stale.retain(|&was| !quarantined(was));
        // Released (its kept state read, not quarantined): resolved. One
        // whose kept state was unreadable may be quarantined still.
        let released = health.status(gpu).is_some_and(|st| {
            st.state != HealthState::Quarantined
                && st.reason != loopwarden_protocol::ReasonCode::KEPT_STATE_UNREADABLE
        });
        if released {
            stale.clear();
        }
        if kept.as_deref().unwrap_or_default() != stale.as_slice() {
            let written = match stale.is_empty() {
                true => store.remove(&key).await,
                false => store.set(&key, &super::tagged(id, &stale)).await,
            };
            if let Err(e) = written {
                tracing::error!("GPU {gpu}: {key} not kept ({e:?}): the stale indexes {stale:?} may not be said at the next start");
            }
        }
        let before: Vec<u8> = (stale.iter().copied())
            .filter(|was| !renumbered.contains(&(gpu, *was)))
            .collect();
        for was in &before {
            tracing::error!(
                "GPU {gpu}: its quarantine actions ran as GPU {was} before the GPUs were numbered otherwise (found at an earlier start): what they left under index {was} may still stand (a drain tagged gpu{was}): undo it by hand if not yet (with the shipped actions: loopwarden-slurm resume NODE gpu{was}); said at every start until GPU {gpu} is released"
            );
        }
        if !stale.is_empty() {
            said.push((gpu, stale));
        }
    }
    said
}

/// Says that `gpu`'s quarantine actions ran last as GPU `was`: what they
/// left naming that index (a Slurm drain's tag `gpu{was}`) is stale,
/// unless GPU `was` is quarantined now too (the tag is its own). Whether
/// it is stale (then kept, [`stale_tags`], and said at every start).
fn say_renumbered(gpu: u8, was: u8, health: &node_core::health::HealthEngine) -> bool {
    let theirs = health
        .status(was)
        .is_some_and(|st| st.state == HealthState::Quarantined);
    if theirs {
        tracing::warn!(
            "GPU {gpu}: its quarantine actions ran as GPU {was}, before the GPUs were numbered otherwise: they run again as GPU {gpu}; GPU {was} is quarantined too, so what they left under index {was} (a drain tagged gpu{was}) is its own now: leave it"
        );
        return false;
    }
    tracing::error!(
        "GPU {gpu}: its quarantine actions ran as GPU {was}, before the GPUs were numbered otherwise: they run again as GPU {gpu}; what they left under index {was} is stale: undo it by hand once they ended well (with the shipped actions: loopwarden-slurm resume NODE gpu{was}, which keeps the node drained for gpu{gpu}); said at every start until GPU {gpu} is released"
    );
    true
}

impl Agent {
    /// At the start: the actions of each GPU kept quarantined whose
    /// actions are not known done (`not_done`, [`not_done`]) run again;
    /// those known done run again only with `[quarantine] again_at_start`
    /// (a site whose every action is harmless run again), else are said
    /// and left: an action that cancels jobs or files a ticket is not run
    /// at every restart.
    pub(in crate::shell) fn resume_actions(&mut self, not_done: &[u8]) {
        if self.config.quarantine_actions.is_empty() {
            return;
        }
        for gpu in self.quarantined() {
            if not_done.contains(&gpu) {
                let why =
                    "quarantined before the restart, its actions not known to have ended well";
                self.run_actions_again(gpu, why);
            } else if self.config.quarantine_again_at_start {
                let why = "quarantined still at this start (its actions ended well before it; again_at_start: the scheduler may have put the node back in service since: a reboot, a resume)";
                self.run_actions_again(gpu, why);
                let since = self.node.gpu_health(gpu).since.0;
                if let Some(run) = self.quarantine_runs.get_mut(&(gpu, since)) {
                    run.kept_done = true;
                }
            } else {
                tracing::warn!("GPU {gpu}: quarantined still at this start, its actions known done: not run again ([quarantine] again_at_start is off; a node the scheduler put back in service since, by a reboot or a resume, stays so until drained by hand or the GPU is released)");
            }
        }
    }

    /// The stale indexes found at the start ([`stale_tags`]) of the GPUs
    /// still quarantined now (one released in this run is shown no more:
    /// its record goes at the next start), as `ctl status` shows them.
    pub(in crate::shell) fn stale_indexes_now(&self) -> Vec<(u8, Vec<u8>)> {
        let quarantined = |g: u8| {
            (self.node.health().status(g)).is_some_and(|st| st.state == HealthState::Quarantined)
        };
        (self.stale_indexes.iter())
            .filter(|(gpu, _)| quarantined(*gpu))
            .map(|(gpu, was)| {
                (
                    *gpu,
                    was.iter().copied().filter(|&w| !quarantined(w)).collect(),
                )
            })
            .filter(|(_, was): &(u8, Vec<u8>)| !was.is_empty())
            .collect()
    }

    /// A run of `gpu`'s actions known done, run again at the start, failed:
    /// its [`Record::Done`] is kept as none, so a restart does not say
    /// they ended well.
    pub(super) fn done_no_more(&self, gpu: u8) {
        tracing::warn!("GPU {gpu}: its quarantine actions, known done, failed when run again at this start: known done no more");
        self.keep_record(gpu, Record::Done, &[]);
    }
}

#[cfg(test)]
mod tests {
    //! The stale indexes a renumbering leaves, said at every start until
    //! the GPU is released.

    use super::*;
    use loopwarden_protocol::{ReasonCode, TimestampMs};
    use node_core::health::{GpuStatus, HealthEngine};

    const X: &str = "GPU-00000000-0000-0000-0000-00000000000x";
    const A: &str = "GPU-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa";
    const B: &str = "GPU-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb";
    const SINCE: u64 = 1_764_000_000_000;

    /// Three GPUs, those of `quarantined` quarantined since [`SINCE`].
    fn health(quarantined: &[u8]) -> HealthEngine {
        let limits = node_core::health::Limits {
            max_operating_c: 87.0,
        };
        let mut h = HealthEngine::new(3, limits, Default::default(), TimestampMs(0));
        for &gpu in quarantined {
            let st = GpuStatus {
                state: HealthState::Quarantined,
                reason: ReasonCode(79),
                since: TimestampMs(SINCE),
                evidence: "XID 79".into(),
            };
            h.restore(gpu, st);
        }
        h
    }

    /// A's quarantine actions known done, as GPU `at`.
    fn done_as(store: &mut ConfigStore<Flash>, at: u8) {
        let id = crate::shell::identity(A).unwrap();
        let value = super::super::tagged(id, &done_payload(SINCE, at));
        futures::executor::block_on(store.set(&Record::Done.key(id), &value)).unwrap();
    }

    /// A, quarantined as GPU 2, is GPU 1 after a reboot: its actions run
    /// again as GPU 1 (not known done), and the drain left as GPU 2 is
    /// stale. Once they ended well as GPU 1 (known done there), later
    /// starts still say it, until A is released; an index whose GPU is
    /// quarantined holds its own tag, not said.
    #[test]
    fn a_stale_index_is_said_at_every_start_until_the_gpu_is_released() {
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        let uuids = [X, A, B];
        let run = |store: &mut ConfigStore<Flash>, h: &HealthEngine| {
            futures::executor::block_on(not_done(store, h, &uuids)).0
        };
        let said = |store: &mut ConfigStore<Flash>, h: &HealthEngine| {
            futures::executor::block_on(stale_tags(store, h, &uuids, &[]))
        };
        done_as(&mut store, 2);
        assert_eq!(run(&mut store, &health(&[1])), vec![1]);
        done_as(&mut store, 1);
        assert_eq!(run(&mut store, &health(&[1])), Vec::<u8>::new());
        assert_eq!(said(&mut store, &health(&[1])), vec![(1, vec![2])]);
        assert_eq!(said(&mut store, &health(&[1])), vec![(1, vec![2])]);
        // Its kept state unreadable at a start (marked degraded, maybe
        // still quarantined): the record stays, said.
        let mut unreadable = health(&[]);
        unreadable.restore(
            1,
            GpuStatus {
                state: HealthState::Degraded,
                reason: ReasonCode::KEPT_STATE_UNREADABLE,
                since: TimestampMs(SINCE),
                evidence: "kept state unreadable".into(),
            },
        );
        assert_eq!(said(&mut store, &unreadable), vec![(1, vec![2])]);
        assert_eq!(said(&mut store, &health(&[1])), vec![(1, vec![2])]);
        // GPU 2 quarantined too: the tag is its own.
        assert_eq!(said(&mut store, &health(&[1, 2])), vec![]);
        // Released, then quarantined again: the record is gone.
        done_as(&mut store, 2);
        assert_eq!(run(&mut store, &health(&[1])), vec![1]);
        assert_eq!(said(&mut store, &health(&[])), vec![]);
        assert_eq!(said(&mut store, &health(&[1])), vec![]);
    }
}
