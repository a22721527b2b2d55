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
//! GPU at that index is quarantined itself (the tag its own). The record
//! keeps the stamp of the quarantine it belongs to: a release in a run
//! ends it then ([`Agent::stale_ended_if_released`]), and a start that
//! finds the GPU quarantined anew (another stamp) drops it. A GPU whose
//! UUID was read late (its record not checked at the start) has its
//! kept quarantine put back under a new stamp: its record is re-stamped
//! to it then, and said ([`Agent::stale_put_back`]).
//!
//! Glossary:
//! - *known done*: every action of the GPU's quarantine in force ended
//!   well, its stamp kept as [`Record::Done`] with the index they ran
//!   under, that GPU's index now (a stamp an earlier version kept, with
//!   no index, counts whatever the index).
//! - *stale index*: an index a GPU's quarantine actions ran under before
//!   the GPUs were numbered otherwise, what they left there (a drain
//!   tagged `gpu{was}`) maybe still standing; kept with the stamp of
//!   the quarantine whose actions ran there ([`Stale`]).

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
/// stale, under its identity `id` ([`stale_payload`]).
fn stale_key(id: u64) -> String {
    format!("stale_index.{id:016x}")
}

/// The mark a stale-index record's payload starts with when it holds the
/// stamp of the quarantine whose actions ran under the indexes; an
/// earlier version's holds the indexes alone (each below
/// [`MAX_GPUS`](loopwarden_protocol::ids::MAX_GPUS)).
const STAMPED: u8 = 0xff;

/// A GPU's stale indexes, as kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Stale {
    /// The stamp of the quarantine whose actions ran under them (wall
    /// ms); `None`: kept by an earlier version without it.
    since: Option<u64>,
    /// The indexes, in order.
    was: Vec<u8>,
}

/// The payload of a stale-index record: [`STAMPED`] and the stamp (8
/// bytes little-endian), then one byte per index; without a stamp, the
/// indexes alone, as an earlier version kept them.
fn stale_payload(stale: &Stale) -> Vec<u8> {
    let mut p = Vec::with_capacity(9 + stale.was.len());
    if let Some(since) = stale.since {
        p.push(STAMPED);
        p.extend_from_slice(&since.to_le_bytes());
    }
    p.extend_from_slice(&stale.was);
    p
}

/// The [`Stale`] of a [`stale_payload`] (empty: none, a record ended in
/// a run); an error says what is wrong with it.
fn read_stale(payload: &[u8]) -> Result<Stale, String> {
    let (since, was) = match payload.split_first() {
        Some((&STAMPED, rest)) => {
            let stamp = rest.get(..8).ok_or("its stamp is cut short")?;
            let stamp = u64::from_le_bytes(stamp.try_into().map_err(|_| "bad stamp")?);
            (Some(stamp), &rest[8..])
        }
        _ => (None, payload),
    };
    let max = loopwarden_protocol::ids::MAX_GPUS;
    if let Some(bad) = was.iter().find(|&&w| w as usize >= max) {
        return Err(format!("index {bad} is not a GPU index (below {max})"));
    }
    Ok(Stale {
        since,
        was: was.to_vec(),
    })
}

/// Whether the GPU of status `st` is released: its kept state read (one
/// unreadable may be quarantined still), not quarantined.
fn released(st: Option<&node_core::health::GpuStatus>) -> bool {
    st.is_some_and(|st| {
        st.state != HealthState::Quarantined
            && st.reason != loopwarden_protocol::ReasonCode::KEPT_STATE_UNREADABLE
    })
}

/// At the start: each GPU's stale indexes (its quarantine actions ran
/// under them before the GPUs were numbered otherwise: what they left
/// there, a drain tagged `gpu{was}`, may still stand), those found at
/// this start (`renumbered`, said then) kept with those kept before, and
/// said at every start while the GPU stays quarantined: the agent cannot
/// see the scheduler undo them. An index whose GPU is quarantined now
/// holds its own tag; a GPU released by an operator ([`released`]), or
/// quarantined anew since (a stamp other than the record's: released in
/// a run), ends its record: neither is said again. A record without a
/// stamp (an earlier version's) is taken as the quarantine in force's.
/// Returns what is said, by GPU.
pub(in crate::shell) async fn stale_tags(
    store: &mut ConfigStore<Flash>,
    health: &node_core::health::HealthEngine,
    uuids: &[&str],
    renumbered: &[(u8, u8)],
) -> Vec<(u8, Vec<u8>)> {
    let mut said = Vec::new();
    for gpu in 0..health.len() as u8 {
        let Some(id) = uuids
            .get(gpu as usize)
            .and_then(|u| crate::shell::identity(u))
        else {
            if !released(health.status(gpu)) {
                tracing::warn!("GPU {gpu}: its UUID is unknown: whether its quarantine actions ran under another index before a renumbering (a drain tagged with that index left standing) is not checked");
            }
            continue;
        };
        let stale = stale_of(store, health, (gpu, id), renumbered).await;
        if !stale.is_empty() {
            said.push((gpu, stale));
        }
    }
    said
}

/// [`stale_tags`] of the GPU `gpu` of identity `id`: its record read,
/// brought up to date and kept, its indexes found before said.
async fn stale_of(
    store: &mut ConfigStore<Flash>,
    health: &node_core::health::HealthEngine,
    (gpu, id): (u8, u64),
    renumbered: &[(u8, u8)],
) -> Vec<u8> {
    let key = stale_key(id);
    let kept = match super::get(store, &key)
        .await
        .and_then(|v| super::payload_of(&key, v, id))
        .and_then(|p| {
            p.map(|p| read_stale(&p).map_err(|e| format!("{key}: {e}")))
                .transpose()
        }) {
        Ok(kept) => Ok(kept),
        Err(e) => {
            tracing::error!("GPU {gpu}: the indexes its quarantine actions ran under before a renumbering are unreadable ({e}): check by hand that no drain of another index is left for it; the record is replaced by what this start found (none: removed)");
            Err(())
        }
    };
    let quarantined = |g: u8| {
        health
            .status(g)
            .is_some_and(|st| st.state == HealthState::Quarantined)
    };
    let since = (health.status(gpu))
        .filter(|st| st.state == HealthState::Quarantined)
        .map(|st| st.since.0);
    let mut stale = kept.clone().ok().flatten().unwrap_or_default();
    if let (Some(was_for), Some(now)) = (stale.since, since) {
        if was_for != now && !stale.was.is_empty() {
            tracing::warn!("GPU {gpu}: the stale indexes {:?} kept for its quarantine of {was_for} (wall ms) are dropped: it was released since and is quarantined anew (since {now})", stale.was);
            stale.was.clear();
        }
    }
    stale.since = since.or(stale.since);
    stale
        .was
        .extend(renumbered.iter().filter(|r| r.0 == gpu).map(|r| r.1));
    stale.was.sort_unstable();
    stale.was.dedup();
    stale.was.retain(|&was| !quarantined(was));
    if released(health.status(gpu)) {
        stale.was.clear();
    }
    keep_stale(store, gpu, id, kept.as_ref().map(Option::as_ref), &stale).await;
    let before = (stale.was.iter().copied()).filter(|was| !renumbered.contains(&(gpu, *was)));
    for was in before {
        tracing::error!(
            "GPU {gpu}: its quarantine actions ran as GPU {was} before the GPUs were numbered otherwise (found at an earlier start): what they left under index {was} may still stand (a drain tagged gpu{was}): undo it by hand if not yet (with the shipped actions: loopwarden-slurm resume NODE gpu{was}); said at every start until GPU {gpu} is released"
        );
    }
    stale.was
}

/// A GPU identified late (its stale indexes not checked at the start,
/// [`stale_tags`]), its kept quarantine of `kept_since` put back and
/// quarantined now (`health`): its stale-index record (`value`, as kept
/// for identity `id`) of that quarantine (its stamp, or none: an earlier
/// version's) is its quarantine's in force, put back under a later
/// stamp: re-stamped to it, so a later start does not take it as
/// quarantined anew, and its indexes said. A record of another stamp
/// (released since) is left for the next start to drop, said then.
/// Returns the value to keep (`None`: unchanged) and the indexes said.
fn put_back(
    (gpu, id): (u8, u64),
    value: Result<Option<Vec<u8>>, String>,
    kept_since: u64,
    health: &node_core::health::HealthEngine,
) -> (Option<Vec<u8>>, Vec<u8>) {
    let quarantined = |g: u8| (health.status(g)).filter(|st| st.state == HealthState::Quarantined);
    let Some(now) = quarantined(gpu).map(|st| st.since.0) else {
        return (None, Vec::new());
    };
    let key = stale_key(id);
    let kept = value
        .and_then(|v| super::payload_of(&key, v, id))
        .and_then(|p| {
            p.map(|p| read_stale(&p).map_err(|e| format!("{key}: {e}")))
                .transpose()
        });
    let stale = match kept {
        Ok(Some(stale)) if stale.since.is_none_or(|s| s == kept_since) => stale,
        Ok(_) => return (None, Vec::new()),
        Err(e) => {
            tracing::error!("GPU {gpu}: its UUID read late, the indexes its quarantine actions ran under before a renumbering are unreadable ({e}): check by hand that no drain of another index is left for it");
            return (None, Vec::new());
        }
    };
    let restamped = Stale {
        since: Some(now),
        was: (stale.was.iter().copied())
            .filter(|&w| quarantined(w).is_none())
            .collect(),
    };
    for was in &restamped.was {
        tracing::error!(
            "GPU {gpu}: its quarantine actions ran as GPU {was} before the GPUs were numbered otherwise (found at an earlier start; its UUID read late at this one): what they left under index {was} may still stand (a drain tagged gpu{was}): undo it by hand if not yet (with the shipped actions: loopwarden-slurm resume NODE gpu{was}); said at every start until GPU {gpu} is released"
        );
    }
    let keep = (restamped != stale).then(|| super::tagged(id, &stale_payload(&restamped)));
    (keep, restamped.was)
}

/// Keeps `stale` as the record of the GPU `gpu` of identity `id` where it
/// differs from the one `kept` (`Err`: unreadable, replaced) (none: the
/// record removed); a write that fails is said.
async fn keep_stale(
    store: &mut ConfigStore<Flash>,
    gpu: u8,
    id: u64,
    kept: Result<Option<&Stale>, &()>,
    stale: &Stale,
) {
    let key = stale_key(id);
    let written = match (kept, stale.was.is_empty()) {
        (Ok(None), true) => return,
        (Ok(Some(kept)), false) if kept == stale => return,
        (_, true) => store.remove(&key).await,
        (_, false) => (store.set(&key, &super::tagged(id, &stale_payload(stale)))).await,
    };
    if let Err(e) = written {
        tracing::error!(
            "GPU {gpu}: {key} not kept ({e:?}): the stale indexes {:?} may not be said at the next start",
            stale.was
        );
    }
}

/// `gpu`'s stale indexes found at the start, taken out of `stale` once
/// `gpu` is released ([`released`]); `None`: not released, or none.
fn take_released(
    stale: &mut Vec<(u8, Vec<u8>)>,
    health: &node_core::health::HealthEngine,
    gpu: u8,
) -> Option<Vec<u8>> {
    if !released(health.status(gpu)) {
        return None;
    }
    let at = stale.iter().position(|(g, _)| *g == gpu)?;
    Some(stale.remove(at).1)
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

    /// After `gpu`'s health changed in this run: a GPU released
    /// ([`released`]) ends its stale indexes found at the start: said no
    /// more, here or in `ctl status`, and its record kept empty (the
    /// recorder writes, never removes; the next start removes it), so a
    /// quarantine anew in this run does not bring them back.
    pub(in crate::shell) fn stale_ended_if_released(&mut self, gpu: u8) {
        let Some(was) = take_released(&mut self.stale_indexes, self.node.health(), gpu) else {
            return;
        };
        tracing::info!("GPU {gpu}: released: its stale indexes {was:?} are said no more (what its quarantine actions left under them, a drain tagged gpu<index>, is for an operator to undo)");
        let uuid = self.gpus.get(gpu as usize).map(|g| g.info.uuid.as_str());
        if let Some(id) = uuid.and_then(crate::shell::identity) {
            self.recorder.set(stale_key(id), super::tagged(id, &[]));
        }
    }

    /// GPU `gpu` of `uuid`, identified late, its kept quarantine of
    /// `kept_since` put back ([`put_back`]): its stale indexes, not
    /// checked at the start, are re-stamped to the quarantine in force,
    /// said, and shown as those found at the start are.
    pub(in crate::shell) async fn stale_put_back(&mut self, gpu: u8, uuid: &str, kept_since: u64) {
        let Some(id) = crate::shell::identity(uuid) else {
            return;
        };
        let value = self.recorder.get(stale_key(id)).await;
        let (keep, was) = put_back((gpu, id), value, kept_since, self.node.health());
        if let Some(value) = keep {
            self.recorder.set(stale_key(id), value);
        }
        if !was.is_empty() {
            self.stale_indexes.retain(|(g, _)| *g != gpu);
            self.stale_indexes.push((gpu, was));
            self.stale_indexes.sort_unstable();
        }
    }

    /// The stale indexes found at the start ([`stale_tags`]) of the GPUs
    /// still quarantined now (one released in this run is ended,
    /// [`stale_ended_if_released`](Self::stale_ended_if_released)), as
    /// `ctl status` shows them.
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
    use crate::test_log::logged;
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

    /// GPU 1 quarantined since `since`.
    fn quarantined_since(since: u64) -> HealthEngine {
        let mut h = health(&[]);
        let st = GpuStatus {
            state: HealthState::Quarantined,
            reason: ReasonCode(79),
            since: TimestampMs(since),
            evidence: "XID 79".into(),
        };
        h.restore(1, st);
        h
    }

    /// A's stale index 2, kept for its quarantine of [`SINCE`], is not said
    /// for a later quarantine (released in a run, quarantined again: no
    /// start saw the release), and the record goes.
    #[test]
    fn a_stale_index_is_dropped_once_the_gpu_is_quarantined_anew() {
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        let uuids = [X, A, B];
        let mut said = |h: &HealthEngine, renumbered: &[(u8, u8)]| {
            futures::executor::block_on(stale_tags(&mut store, h, &uuids, renumbered))
        };
        assert_eq!(said(&health(&[1]), &[(1, 2)]), vec![(1, vec![2])]);
        assert_eq!(said(&quarantined_since(SINCE), &[]), vec![(1, vec![2])]);
        assert_eq!(said(&quarantined_since(SINCE + 1), &[]), vec![]);
        assert_eq!(said(&quarantined_since(SINCE), &[]), vec![], "gone");
    }

    /// A's stale index 2 kept for its quarantine of [`SINCE`]; at a start
    /// A's UUID unread (not checked), its kept state unreadable; its UUID
    /// read later, its quarantine put back under a new stamp: the record
    /// is re-stamped to it and said, so the next start (A quarantined
    /// since the new stamp, never released) says it still.
    #[test]
    fn a_stale_index_of_a_gpu_identified_late_is_kept_for_the_quarantine_put_back() {
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        let uuids = [X, A, B];
        let id = crate::shell::identity(A).unwrap();
        let said = |store: &mut ConfigStore<Flash>, h: &HealthEngine, r: &[(u8, u8)]| {
            futures::executor::block_on(stale_tags(store, h, &uuids, r))
        };
        assert_eq!(
            said(&mut store, &health(&[1]), &[(1, 2)]),
            vec![(1, vec![2])]
        );
        let mut h = health(&[]);
        let unreadable = GpuStatus {
            state: HealthState::Degraded,
            reason: ReasonCode::KEPT_STATE_UNREADABLE,
            since: TimestampMs(SINCE),
            evidence: "kept state unreadable".into(),
        };
        h.restore(1, unreadable);
        let kept = GpuStatus {
            state: HealthState::Quarantined,
            reason: ReasonCode(79),
            since: TimestampMs(SINCE),
            evidence: "XID 79".into(),
        };
        h.identified(TimestampMs(SINCE + 5_000), 1, &kept);
        let since = h.status(1).unwrap().since.0;
        assert_ne!(since, SINCE, "put back under a new stamp");
        // The late path, as the agent runs it on its recorder.
        let value = futures::executor::block_on(super::super::get(&mut store, &stale_key(id)));
        let (keep, was) = put_back((1, id), value, SINCE, &h);
        assert_eq!(was, vec![2], "said");
        let keep = keep.expect("re-stamped");
        futures::executor::block_on(store.set(&stale_key(id), &keep)).unwrap();
        assert_eq!(
            said(&mut store, &quarantined_since(since), &[]),
            vec![(1, vec![2])]
        );
        assert_eq!(
            said(&mut store, &quarantined_since(since), &[]),
            vec![(1, vec![2])]
        );
        // A record of an earlier quarantine (released since) is left for
        // the next start to drop.
        let value = futures::executor::block_on(super::super::get(&mut store, &stale_key(id)));
        assert_eq!(put_back((1, id), value, SINCE - 1, &h), (None, Vec::new()));
        // Not quarantined now: nothing said.
        let value = futures::executor::block_on(super::super::get(&mut store, &stale_key(id)));
        assert_eq!(
            put_back((1, id), value, since, &health(&[])),
            (None, Vec::new())
        );
    }

    /// Released in a run, GPU 1's stale indexes found at the start are
    /// taken out (said no more, its record ended); quarantined still, or
    /// its kept state unreadable (maybe quarantined), they stay.
    #[test]
    fn a_release_in_a_run_ends_the_stale_indexes() {
        let mut stale = vec![(1, vec![2])];
        assert_eq!(take_released(&mut stale, &health(&[1]), 1), None);
        let mut unreadable = health(&[]);
        let st = GpuStatus {
            state: HealthState::Degraded,
            reason: ReasonCode::KEPT_STATE_UNREADABLE,
            since: TimestampMs(SINCE),
            evidence: "kept state unreadable".into(),
        };
        unreadable.restore(1, st);
        assert_eq!(take_released(&mut stale, &unreadable, 1), None);
        assert_eq!(take_released(&mut stale, &health(&[]), 0), None);
        assert_eq!(stale, vec![(1, vec![2])]);
        assert_eq!(take_released(&mut stale, &health(&[]), 1), Some(vec![2]));
        assert_eq!(stale, vec![]);
    }

    /// The longest record fits the store and reads back; one naming no
    /// GPU index, or its stamp cut short, is refused, said.
    #[test]
    fn stale_records_fit_the_store_and_read_back() {
        let stale = Stale {
            since: Some(u64::MAX),
            was: (0..loopwarden_protocol::ids::MAX_GPUS as u8).collect(),
        };
        let value = super::super::tagged(u64::MAX, &stale_payload(&stale));
        assert!(value.len() <= loopwarden_flash::config::MAX_VALUE);
        assert_eq!(read_stale(&stale_payload(&stale)), Ok(stale));
        let e = read_stale(&[16]).unwrap_err();
        assert!(e.contains("index 16"), "{e}");
        let e = read_stale(&[STAMPED, 1, 2]).unwrap_err();
        assert!(e.contains("stamp"), "{e}");
    }

    /// A's stale-index record unreadable (damaged): said, and replaced by
    /// what this start found (removed once A is released), so the next
    /// start reads it again; a GPU whose UUID is unknown is said not
    /// checked.
    #[test]
    fn an_unreadable_stale_index_record_is_replaced_by_what_the_start_found() {
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        let id = crate::shell::identity(A).unwrap();
        let junk = |store: &mut ConfigStore<Flash>| {
            futures::executor::block_on(store.set(&stale_key(id), b"junk")).unwrap();
        };
        let uuids = [X, A, B];
        let said = |store: &mut ConfigStore<Flash>, h: &HealthEngine, r: &[(u8, u8)]| {
            logged(|| futures::executor::block_on(stale_tags(store, h, &uuids, r)))
        };
        junk(&mut store);
        let (tags, log) = said(&mut store, &health(&[]), &[]);
        assert_eq!(tags, vec![]);
        assert!(
            log.contains("GPU 1: the indexes") && log.contains("unreadable"),
            "{log}"
        );
        let kept = futures::executor::block_on(super::super::get(&mut store, &stale_key(id)));
        assert_eq!(kept, Ok(None), "removed");
        // Quarantined, renumbered at this start: what it found is kept.
        junk(&mut store);
        let (tags, _) = said(&mut store, &health(&[1]), &[(1, 2)]);
        assert_eq!(tags, vec![(1, vec![2])]);
        let (tags, log) = said(&mut store, &health(&[1]), &[]);
        assert_eq!(tags, vec![(1, vec![2])]);
        assert!(!log.contains("unreadable"), "{log}");
        // A GPU whose UUID is unknown: not checked, said.
        let unknown = [X, crate::shell::UNKNOWN_UUID, B];
        let (tags, log) = logged(|| {
            futures::executor::block_on(stale_tags(&mut store, &health(&[1]), &unknown, &[]))
        });
        assert_eq!(tags, vec![]);
        assert!(log.contains("GPU 1: its UUID is unknown"), "{log}");
        let (_, log) = logged(|| {
            futures::executor::block_on(stale_tags(&mut store, &health(&[]), &unknown, &[]))
        });
        assert!(
            !log.contains("UUID is unknown"),
            "released: nothing to check\n{log}"
        );
    }

    /// A record an earlier version kept (the indexes alone, no stamp) is
    /// read as the quarantine in force's: kept and said, as before.
    #[test]
    fn a_stale_index_kept_without_its_stamp_is_said_as_before() {
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        let id = crate::shell::identity(A).unwrap();
        let value = super::super::tagged(id, &[2]);
        futures::executor::block_on(store.set(&stale_key(id), &value)).unwrap();
        let uuids = [X, A, B];
        let mut said =
            |h: &HealthEngine| futures::executor::block_on(stale_tags(&mut store, h, &uuids, &[]));
        assert_eq!(said(&quarantined_since(SINCE + 1)), vec![(1, vec![2])]);
        assert_eq!(said(&quarantined_since(SINCE + 1)), vec![(1, vec![2])]);
        assert_eq!(said(&quarantined_since(SINCE + 2)), vec![]);
    }
}
