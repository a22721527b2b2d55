//! XIDs and quarantines in the shell: XIDs from the driver go to the node
//! (kept for `why` first); a GPU's health is kept in flash as the node
//! asks; a quarantine's actions run on a task of their own, and their
//! outcomes are logged and published.
//!
//! A GPU's health and its quarantine's stamp are kept under its identity
//! (its UUID's hash), so they follow the GPU when the GPUs are numbered
//! otherwise after a reboot; a GPU whose UUID is unknown has nothing kept
//! or restored. Records kept by earlier versions under GPU indexes are
//! moved at the start ([`upgrade_kept`]).
//!
//! A quarantine's actions are *done* once every one of them ended well:
//! then the quarantine's stamp is kept in flash beside the GPU's health
//! (before the last outcome is published). At the start, every GPU kept
//! quarantined whose actions are not known done has them run again
//! ([`kept`]): one never run (the agent killed while they ran, one
//! failed) leaves the scheduler unaware; those known done run again only
//! with `[quarantine] again_at_start` (a drain lifted since by a reboot
//! that resumed the node; a site whose every action bears running again
//! at every restart). A cooling-loss resume lifts every
//! drain: before its command starts, the quarantines in force are kept as
//! known done no more (a run then in flight is not done when it ends
//! well), and once it ended their actions run again, so a restart before
//! those end well runs them again too.
//!
//! A run that failed (one of its actions did not end well) runs again
//! while the agent runs, after a wait that doubles with each failure in a
//! row (`actions::retry_at`: 10 s, then 20 s, up to 5 min), one run at a
//! time, until one ends well, the GPU is released or quarantined anew, or
//! the agent stops (the next start runs it then).
//!
//! A run's actions run one after another, in the order configured, on
//! one task. Each GPU has at most one run in flight: a run asked for again
//! while it runs (a cooling-loss resume ended, a retry) is marked *again*
//! and starts once it ended, not beside it, and a GPU's run of a newer
//! quarantine waits (*queued*, said once) for its run of an older one.
//! Different GPUs' runs run at the same time: a GPU's first run never
//! waits behind another GPU's (a hung action would hold its drain up to
//! the actions' timeouts). A site's drain wrapper that reads and writes
//! the node's reason locks the node itself (`loopwarden-slurm` does).
//!
//! Glossary:
//! - *run*: the actions of one quarantine (a GPU and its stamp) still
//!   running, waiting their turn, or waiting to run again after one
//!   failed.
//! - *in flight*: a run whose actions have not all ended.

use loopwarden_flash::ConfigStore;
use loopwarden_protocol::{Event, HealthState};
use loopwarden_store::agent_flash::Flash;
pub(super) use loopwarden_store::check::{check_of, checked};
use node_core::node::Input;

mod kept;
pub(super) use kept::not_done;

use super::{Agent, RECENT_XIDS};
use crate::actions;
use crate::console::{ActionFailure, ActionKind};
use crate::gpu::XidReport;

/// The longest a quarantine waits to be in flash before it is published
/// and its actions start: a flash slower than this is said, and the
/// quarantine goes on.
const KEEP_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// A quarantine action ended, or the wait after a failed run is over.
#[derive(Debug)]
pub(crate) enum ActionDone {
    /// A quarantine action ended.
    Ended {
        /// The GPU.
        gpu: u8,
        /// The stamp of the quarantine it ran for (wall ms).
        since: u64,
        /// How it ended.
        outcome: actions::Outcome,
    },
    /// The wait before a failed run's actions run again is over.
    RetryDue {
        /// The GPU.
        gpu: u8,
        /// The stamp of the quarantine (wall ms).
        since: u64,
        /// When it was due (steady ms): the run's retry, if it is that.
        due: u64,
    },
}

/// The actions of one quarantine still running, or waiting to run again
/// after a run that failed.
#[derive(Debug, Clone, Default)]
pub(crate) struct Run {
    /// How many have not ended (more than none: in flight).
    left: usize,
    /// Waiting its turn (its GPU's run of an older quarantine is in
    /// flight), with its reason.
    queued: Option<String>,
    /// Asked for again while in flight: it runs again once it ended,
    /// and this run, ended well, is not done.
    again: bool,
    /// In flight when a cooling-loss resume was handed out: the resume
    /// lifts its drain, so ended well it is not done (the resume's end
    /// runs it again).
    before_resume: bool,
    /// Whether every one that ended, ended well.
    ok: bool,
    /// The runs in a row that failed.
    failures: u32,
    /// When its actions run again (steady ms), after a run that failed.
    retry: Option<u64>,
    /// Known done (its [`Record::Done`] holds its stamp and index) and run
    /// again at the start (`again_at_start`): ended well, the record is
    /// not written again; failed, it is kept as none ([`kept`]).
    kept_done: bool,
}

/// A record kept in flash for each GPU, under its identity (its UUID's
/// hash, [`identity`]), so it follows the GPU when the GPUs are numbered
/// otherwise (one pulled, or fallen off the bus, before a reboot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Record {
    /// Its health state (postcard `GpuHealth`).
    Health,
    /// The stamp of its last quarantine whose actions are done (wall ms,
    /// 8 bytes little-endian), then the GPU's index they ran under (1
    /// byte; none in an earlier version's, `kept::done_payload`); none (an
    /// empty payload) once a cooling-loss resume lifted their drain.
    Done,
}

impl Record {
    /// Its config-store key for the GPU of identity `id`.
    pub(super) fn key(self, id: u64) -> String {
        format!("{}.{id:016x}", self.prefix())
    }

    /// Its key under a GPU's index, as earlier versions kept it.
    fn index_key(self, gpu: usize) -> String {
        format!("{}.{gpu}", self.prefix())
    }

    fn prefix(self) -> &'static str {
        match self {
            Record::Health => "health",
            Record::Done => "quarantine_done",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Record::Health => "health state",
            Record::Done => "quarantine-done stamp",
        }
    }
}

/// The key of the check kept after the health record of the GPU of
/// identity `id` ([`check_of`] its value): the store skips a copy whose own
/// check fails and returns the one before it, so without this a damaged
/// newest record (a quarantine) would read as the older state it replaced
/// (healthy).
pub(super) fn health_check_key(id: u64) -> String {
    format!("health_check.{id:016x}")
}

/// The payload of the health record kept for the GPU of identity `id`,
/// checked ([`checked`]).
pub(super) async fn read_health(
    store: &mut ConfigStore<Flash>,
    id: u64,
) -> Result<Option<Vec<u8>>, String> {
    let key = Record::Health.key(id);
    let value = get(store, &key).await?;
    let check = get(store, &health_check_key(id)).await?;
    payload_of(&key, checked(&key, value, check)?, id)
}

/// The first byte of a record kept by identity (never the first byte of an
/// earlier version's record: a GPU index, or an 8-byte stamp).
const TAG: u8 = 0xff;

/// A record's value: [`TAG`], the GPU's identity (8 bytes little-endian),
/// then `payload`.
pub(super) fn tagged(id: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + payload.len());
    v.push(TAG);
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// The identity and payload of a value [`tagged`]; `None`: a value kept by
/// an earlier version, under a GPU's index.
fn untag(value: &[u8]) -> Option<(u64, &[u8])> {
    if value.len() < 9 || value[0] != TAG {
        return None;
    }
    let id = u64::from_le_bytes(value[1..9].try_into().ok()?);
    Some((id, &value[9..]))
}

/// The value kept under `key`, if any; an error names the key.
pub(super) async fn get(
    store: &mut ConfigStore<Flash>,
    key: &str,
) -> Result<Option<Vec<u8>>, String> {
    let mut buf = [0u8; loopwarden_flash::config::MAX_VALUE];
    match store.get(key, &mut buf).await {
        Ok(Some(n)) => Ok(Some(buf[..n].to_vec())),
        Ok(None) => Ok(None),
        Err(e) => Err(format!("{key}: {e:?}")),
    }
}

/// The payload of the record `what` kept for the GPU of identity `id`.
pub(super) async fn read_kept(
    store: &mut ConfigStore<Flash>,
    what: Record,
    id: u64,
) -> Result<Option<Vec<u8>>, String> {
    let key = what.key(id);
    let value = get(store, &key).await?;
    payload_of(&key, value, id)
}

/// The payload of `value`, read under `key` for the GPU of identity `id`:
/// an error when it names another GPU or none.
pub(super) fn payload_of(
    key: &str,
    value: Option<Vec<u8>>,
    id: u64,
) -> Result<Option<Vec<u8>>, String> {
    match value.as_deref().map(untag) {
        None => Ok(None),
        Some(Some((kept, payload))) if kept == id => Ok(Some(payload.to_vec())),
        Some(Some((kept, _))) => Err(format!("{key} holds the record of GPU {kept:016x}")),
        Some(None) => Err(format!("{key} holds no GPU identity")),
    }
}

/// At the start, before anything kept is read: the records that earlier
/// versions kept under GPU indexes are moved under the GPUs' identities,
/// each taken (as before) for the GPU at its index now, unless that GPU
/// has a record under its identity already (the identity's wins). The
/// move first tags the record in place with the GPU's identity, then
/// writes it under the identity's key, then removes it: a power cut at
/// any point leaves records the next start moves to the right GPU.
///
/// It blocks for the flash's reads and writes, once, at the start,
/// before anything else is read or the loop runs.
pub(super) fn upgrade_kept(store: &mut ConfigStore<Flash>, uuids: &[&str]) {
    futures::executor::block_on(upgrade(store, uuids));
}

async fn upgrade(store: &mut ConfigStore<Flash>, uuids: &[&str]) {
    for what in [Record::Health, Record::Done] {
        for (i, uuid) in uuids.iter().enumerate() {
            if let Err(e) = claim(store, what, i, uuid).await {
                tracing::error!(
                    "GPU {i}: the {} an earlier version kept under its index is not taken ({e}): left as it is, the next start tries again",
                    what.what()
                );
            }
        }
        for i in 0..loopwarden_protocol::ids::MAX_GPUS {
            if let Err(e) = move_claimed(store, what, i).await {
                tracing::error!("{} of GPU index {i}: not moved under its GPU's UUID ({e}); the next start tries again", what.what());
            }
        }
    }
}

/// An earlier version's record `what` under index `gpu`, tagged in place
/// with the identity of the GPU at that index now (`uuid`), unless that
/// GPU has a record under its identity already.
async fn claim(
    store: &mut ConfigStore<Flash>,
    what: Record,
    gpu: usize,
    uuid: &str,
) -> Result<(), String> {
    let index_key = what.index_key(gpu);
    let Some(old) = get(store, &index_key).await? else {
        return Ok(());
    };
    if untag(&old).is_some() {
        return Ok(());
    }
    let Some(id) = super::identity(uuid) else {
        tracing::error!("GPU {gpu}: its UUID is unknown: the {} an earlier version kept under its index ({index_key}) is left as it is, not applied", what.what());
        return Ok(());
    };
    if get(store, &what.key(id)).await?.is_some() {
        tracing::warn!("GPU {gpu} ({uuid}): has a {} under its UUID; the one an earlier version kept under its index ({index_key}) is left as it is, not applied", what.what());
        return Ok(());
    }
    tracing::warn!("GPU {gpu} ({uuid}): the {} an earlier version kept under its index ({index_key}) is taken for it, as before, and kept under its UUID from now on", what.what());
    store
        .set(&index_key, &tagged(id, &old))
        .await
        .map_err(|e| format!("{index_key}: {e:?}"))
}

/// A record `what` under index `gpu` tagged with a GPU's identity: written
/// under the identity's key (unless one is there: it wins), then removed.
async fn move_claimed(
    store: &mut ConfigStore<Flash>,
    what: Record,
    gpu: usize,
) -> Result<(), String> {
    let index_key = what.index_key(gpu);
    let Some(value) = get(store, &index_key).await? else {
        return Ok(());
    };
    let Some((id, _)) = untag(&value) else {
        return Ok(());
    };
    let key = what.key(id);
    if get(store, &key).await?.is_none() {
        store
            .set(&key, &value)
            .await
            .map_err(|e| format!("{key}: {e:?}"))?;
    }
    store
        .remove(&index_key)
        .await
        .map_err(|e| format!("{index_key}: {e:?}"))
}

/// Hands `gpu`'s health `record` (the record, then its check) to
/// `recorder` as one: a quarantine (`quarantined`) is waited for, at
/// most [`KEEP_WAIT`] (one not known in flash by then is said, and lands
/// in order after); other states are not. `Err` (said): not handed over
/// (the queue full, the flash thread gone), or the flash refused it.
pub(super) async fn hand_health(
    recorder: &loopwarden_store::recorder::Recorder,
    gpu: u8,
    record: Vec<(String, Vec<u8>)>,
    quarantined: bool,
) -> Result<(), String> {
    if !quarantined {
        return recorder.set_all_later(record).map(drop).map_err(|e| {
            tracing::error!("GPU {gpu}: its health state is not kept in flash ({e})");
            e
        });
    }
    match tokio::time::timeout(KEEP_WAIT, recorder.set_all_sync(record)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            tracing::error!(
                "GPU {gpu}: its quarantine is not in flash ({e}): a restart would not restore it"
            );
            Err(e)
        }
        Err(_) => {
            tracing::error!(
                "GPU {gpu}: its quarantine is not known in flash after {} ms (the flash is slow or failing): a restart may not restore it",
                KEEP_WAIT.as_millis()
            );
            Ok(())
        }
    }
}

impl Agent {
    /// An XID from the driver: kept for `why`, and decided by the node.
    pub(super) async fn on_xid(&mut self, x: XidReport) {
        let now = self.clock.wall();
        if let Some(g) = self.gpus.get_mut(x.gpu as usize) {
            if g.xids.len() == RECENT_XIDS {
                g.xids.pop_front();
            }
            g.xids.push_back((now, x.xid));
        }
        self.step(Input::Xid {
            gpu: x.gpu,
            xid: x.xid,
        })
        .await;
    }

    /// The XID watch stopped (`Some(why)`) or runs again (`None`).
    pub(super) async fn on_xid_watch(&mut self, down: Option<String>) {
        self.step(Input::XidWatch(down.as_deref())).await;
    }

    /// After the driver came back (a stall ended, the XID watch runs
    /// again): every GPU asks again what answered "not supported", since a
    /// reloaded driver may answer otherwise.
    pub(super) async fn reprobe_gpus(&self) {
        let deadline = self.config.deadline;
        let asks = self.workers.iter().map(|w| w.reprobe(deadline));
        for (i, r) in futures::future::join_all(asks)
            .await
            .into_iter()
            .enumerate()
        {
            if let Err(e) = r {
                tracing::warn!("GPU {i}: cannot ask again what was not supported: {e}");
            }
        }
    }

    /// Keeps a GPU's health in flash, so a restart does not forget a
    /// quarantine: a quarantine is waited for (at most [`KEEP_WAIT`]),
    /// so it is in flash before it is published or acted on; other states
    /// are handed to the recorder without waiting ([`hand_health`]).
    /// Whether it was handed over (`false`, said: a config store's lost
    /// mark pending stays for this run); a GPU whose UUID is unknown has
    /// none to hand over (said; such a GPU holds the mark until it says
    /// it).
    pub(super) async fn keep_health(&mut self, gpu: u8) -> bool {
        self.stale_ended_if_released(gpu);
        let health = self.node.gpu_health(gpu);
        let bytes = match postcard::to_allocvec(&health) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::error!("GPU {gpu}: health state not encodable: {e}");
                self.health_not_kept_after_loss(gpu);
                return false;
            }
        };
        let Some((id, key, value)) = self.record_of(gpu, Record::Health, &bytes) else {
            return true;
        };
        // The record, then its check: a cut between the two reads as
        // damaged at the next start (degraded), never as the older state.
        let check = (health_check_key(id), check_of(&value));
        let quarantined = health.state == HealthState::Quarantined;
        let record = vec![(key, value), check];
        let handed = hand_health(&self.recorder, gpu, record, quarantined).await;
        if handed.is_err() {
            self.health_not_kept_after_loss(gpu);
        }
        handed.is_ok()
    }

    /// Keeps `payload` as `gpu`'s record `what`, under its identity;
    /// nothing (said) when its UUID is unknown.
    fn keep_record(&self, gpu: u8, what: Record, payload: &[u8]) {
        if let Some((_, key, value)) = self.record_of(gpu, what, payload) {
            self.recorder.set(key, value);
        }
    }

    /// The identity, key and value of `gpu`'s record `what` holding
    /// `payload`; `None` (said) when its UUID is unknown.
    fn record_of(&self, gpu: u8, what: Record, payload: &[u8]) -> Option<(u64, String, Vec<u8>)> {
        let uuid = self.gpus.get(gpu as usize).map(|g| g.info.uuid.as_str());
        match uuid.and_then(super::identity) {
            Some(id) => Some((id, what.key(id), tagged(id, payload))),
            None => {
                tracing::error!(
                    "GPU {gpu}: its UUID is unknown: its {} is not kept in flash, and a restart does not restore it",
                    what.what()
                );
                None
            }
        }
    }

    /// Runs the configured actions for the quarantine of `gpu` in force:
    /// at once, unless a run of `gpu` is in flight (then once it ended:
    /// one run at a time per GPU; other GPUs' runs do not hold it);
    /// outcomes come back to the loop.
    pub(super) fn start_actions(&mut self, gpu: u8, reason: &str) {
        if self.config.quarantine_actions.is_empty() {
            return;
        }
        let since = self.node.gpu_health(gpu).since.0;
        let busy = self.in_flight(gpu);
        let run = self.quarantine_runs.entry((gpu, since)).or_default();
        if run.left > 0 {
            run.again = true;
            return tracing::info!(
                "GPU {gpu}: its quarantine actions are running: they run again once they end"
            );
        }
        if run.queued.replace(reason.to_string()).is_none() && busy {
            tracing::info!(
                "GPU {gpu}: the actions of its earlier quarantine are running: this quarantine's run once they end"
            );
        }
        self.start_next_run(gpu);
    }

    /// Whether a run of `gpu` is in flight.
    fn in_flight(&self, gpu: u8) -> bool {
        self.runs_of(gpu).any(|(_, r)| r.left > 0)
    }

    /// The runs of `gpu`, oldest quarantine first.
    fn runs_of(&self, gpu: u8) -> impl Iterator<Item = (&(u8, u64), &Run)> {
        self.quarantine_runs.range((gpu, 0)..=(gpu, u64::MAX))
    }

    /// Starts `gpu`'s first run waiting its turn, unless a run of `gpu` is
    /// in flight or the agent is stopping (the next start runs it); a run
    /// whose GPU was released or quarantined anew meanwhile is dropped,
    /// said.
    fn start_next_run(&mut self, gpu: u8) {
        if self.in_flight(gpu) || self.cooling.stopping() {
            return;
        }
        let queued: Vec<_> = self
            .runs_of(gpu)
            .filter(|(_, r)| r.queued.is_some())
            .map(|(&k, _)| k)
            .collect();
        for (gpu, since) in queued {
            let st = self.node.health().status(gpu);
            if !st.is_some_and(|st| st.state == HealthState::Quarantined && st.since.0 == since) {
                self.quarantine_runs.remove(&(gpu, since));
                tracing::info!(
                    "GPU {gpu}: released or quarantined anew: the actions of its quarantine waiting their turn do not run"
                );
                continue;
            }
            return self.spawn_run(gpu, since);
        }
    }

    /// Spawns run `(gpu, since)`, queued: its actions one after another.
    fn spawn_run(&mut self, gpu: u8, since: u64) {
        let actions = &self.config.quarantine_actions;
        let Some(run) = self.quarantine_runs.get_mut(&(gpu, since)) else {
            return;
        };
        let vars = actions::Vars {
            host: self.config.host.as_str().to_string(),
            site: self.config.site.as_str().to_string(),
            gpu,
            uuid: self.gpus[gpu as usize].info.uuid.clone(),
            reason: run.queued.take().unwrap_or_default(),
        };
        // A new run: the one before it, if any, ended.
        run.ok = true;
        run.retry = None;
        run.again = false;
        run.before_resume = false;
        run.left = actions.len();
        let argvs: Vec<_> = actions.iter().map(|a| actions::expand(a, &vars)).collect();
        let timeout = self.config.quarantine_timeout;
        let tx = self.actions.clone();
        self.running_actions.retain(|h| !h.is_finished());
        self.running_actions.push(tokio::spawn(async move {
            for argv in argvs {
                let outcome = actions::run(&argv, timeout).await;
                let done = ActionDone::Ended {
                    gpu,
                    since,
                    outcome,
                };
                if tx.send(done).await.is_err() {
                    return;
                }
            }
        }));
    }

    /// Runs the actions of `gpu`'s quarantine in force again, saying why.
    fn run_actions_again(&mut self, gpu: u8, why: &str) {
        let Some(reason) = self.reason_of(gpu) else {
            return;
        };
        tracing::warn!("GPU {gpu}: {why}: running its quarantine actions again");
        self.start_actions(gpu, &reason);
    }

    /// The `{reason}` of `gpu`'s quarantine in force.
    fn reason_of(&self, gpu: u8) -> Option<String> {
        let st = self.node.health().status(gpu)?;
        Some(format!("{}: {}", st.reason, st.evidence))
    }

    /// A cooling-loss resume ended: it took the node back into service
    /// in the site's scheduler (`scontrol ... State=RESUME` clears every
    /// drain, a quarantine's too), so the actions of each GPU still
    /// quarantined run again (each bears running twice), known done no
    /// more (kept so first, [`Agent::undo_quarantines_done`]) until they
    /// end well again.
    pub(super) fn quarantine_again_after_resume(&mut self) {
        if self.config.quarantine_actions.is_empty() {
            return;
        }
        for gpu in self.quarantined() {
            let why = "quarantined still, and the cooling-loss resume put the node back in service";
            self.run_actions_again(gpu, why);
        }
    }

    /// A cooling-loss resume is handed out, or ended: the quarantines in
    /// force are known done no more in flash (their stamp replaced by
    /// none), since the resume lifts their drains, and a run in flight
    /// will not be done when it ends. Kept before the resume's command
    /// starts (the runner waits for the flash's word on the phase, kept
    /// after), a restart at any point after it runs their actions again,
    /// until a run after the resume ends well.
    pub(super) fn undo_quarantines_done(&mut self) {
        if self.config.quarantine_actions.is_empty() {
            return;
        }
        for run in self.quarantine_runs.values_mut() {
            run.before_resume |= run.left > 0;
            run.kept_done = false;
        }
        for gpu in self.quarantined() {
            self.keep_record(gpu, Record::Done, &[]);
        }
    }

    /// The GPUs quarantined now.
    fn quarantined(&self) -> Vec<u8> {
        (0..self.gpus.len())
            .filter_map(|g| u8::try_from(g).ok())
            .filter(|&g| {
                let st = self.node.health().status(g);
                st.is_some_and(|st| st.state == HealthState::Quarantined)
            })
            .collect()
    }

    /// A quarantine action ended, or a failed run's wait is over.
    pub(super) async fn on_action(&mut self, done: ActionDone) {
        match done {
            ActionDone::Ended {
                gpu,
                since,
                outcome,
            } => self.on_action_ended(gpu, since, outcome).await,
            ActionDone::RetryDue { gpu, since, due } => self.on_retry_due(gpu, since, due),
        }
    }

    /// A quarantine action ended: logged, and published; once every action
    /// of its quarantine ended well, the quarantine's stamp is kept in
    /// flash first (so a restart knows them done); once they all
    /// ended and one failed, they run again after a wait.
    async fn on_action_ended(&mut self, gpu: u8, since: u64, o: actions::Outcome) {
        if o.ok {
            tracing::info!("GPU {gpu}: quarantine action {} done", o.program);
        } else {
            tracing::error!(
                "GPU {gpu}: quarantine action {} failed: {}",
                o.program,
                o.detail
            );
        }
        self.count_action(
            ActionKind::Quarantine,
            &format!("quarantine of GPU {gpu}"),
            &o,
        );
        let shown = self.gpus.get_mut(gpu as usize);
        if let (false, Some(g)) = (o.ok, shown) {
            g.action_failed = Some(format!("{} failed: {}", o.program, o.detail));
        }
        if let Some(run) = self.quarantine_runs.get_mut(&(gpu, since)) {
            run.left = run.left.saturating_sub(1);
            run.ok &= o.ok;
            if run.left == 0 {
                self.run_ended(gpu, since);
            }
        }
        let ev = Event::QuarantineAction {
            gpu: Self::gpu_index(gpu as usize),
            ok: o.ok,
            exit_code: o.exit_code,
        };
        self.emit(ev, self.clock.wall()).await;
    }

    /// Every action of the run of `gpu`'s quarantine `since` ended: the
    /// next run of `gpu` waiting its turn starts, this one's own again
    /// first if it was asked for again while in flight.
    fn run_ended(&mut self, gpu: u8, since: u64) {
        let again = self
            .quarantine_runs
            .get(&(gpu, since))
            .is_some_and(|r| r.again);
        let reason = self.reason_of(gpu);
        match (again, self.quarantine_runs.get_mut(&(gpu, since))) {
            (true, Some(run)) => {
                tracing::warn!("GPU {gpu}: asked for again while they ran: running its quarantine actions again");
                run.again = false;
                run.queued = Some(reason.unwrap_or_default());
            }
            _ => self.run_outcome(gpu, since),
        }
        self.start_next_run(gpu);
    }

    /// Run `(gpu, since)` ended, not asked for again: all well, it is
    /// done (kept in flash); else its actions run again after a wait
    /// ([`actions::retry_at`]), the timer's word coming back to the loop
    /// ([`ActionDone::RetryDue`]).
    fn run_outcome(&mut self, gpu: u8, since: u64) {
        let Some(run) = self.quarantine_runs.get_mut(&(gpu, since)) else {
            return;
        };
        if run.ok {
            let (before_resume, kept_done) = (run.before_resume, run.kept_done);
            self.quarantine_runs.remove(&(gpu, since));
            if let Some(g) = self.gpus.get_mut(gpu as usize) {
                g.action_failed = None;
            }
            self.site_actions
                .ended_well(&format!("quarantine of GPU {gpu}"));
            if before_resume {
                // The resume's end runs them again; a restart before then
                // runs them at the start.
                return tracing::info!(
                    "GPU {gpu}: its quarantine actions ended well, begun before a cooling-loss resume that lifts their drain: not known done until they run after it"
                );
            }
            if kept_done {
                return;
            }
            return self.keep_record(gpu, Record::Done, &kept::done_payload(since, gpu));
        }
        let kept_done = std::mem::take(&mut run.kept_done);
        run.failures = run.failures.saturating_add(1);
        let now = self.clock.steady().0;
        let due = actions::retry_at(now, run.failures);
        run.retry = Some(due);
        tracing::error!(
            "GPU {gpu}: a quarantine action failed ({} runs in a row): its actions run again in {} s, and at the next start; drain the GPU by hand if they keep failing",
            run.failures,
            (due - now) / 1_000
        );
        if kept_done {
            self.done_no_more(gpu);
        }
        let tx = self.actions.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(due - now)).await;
            let _ = tx.send(ActionDone::RetryDue { gpu, since, due }).await;
        });
    }

    /// The wait after a failed run of `gpu`'s quarantine `since` is over
    /// (`due`: the timer's): its actions run again, unless a run is under
    /// way or waiting its turn (one at a time per GPU), the timer is not the run's last, the GPU was
    /// released or quarantined anew meanwhile, or the agent is stopping
    /// (the next start runs them).
    fn on_retry_due(&mut self, gpu: u8, since: u64, due: u64) {
        let Some(run) = self.quarantine_runs.get(&(gpu, since)).cloned() else {
            return;
        };
        if run.left > 0 || run.queued.is_some() || run.retry != Some(due) {
            return;
        }
        let st = self.node.health().status(gpu);
        if !st.is_some_and(|st| st.state == HealthState::Quarantined && st.since.0 == since) {
            self.quarantine_runs.remove(&(gpu, since));
            if st.is_some_and(|st| st.state != HealthState::Quarantined) {
                self.site_actions
                    .forget(&format!("quarantine of GPU {gpu}"));
            }
            return tracing::info!(
                "GPU {gpu}: released or quarantined anew: the actions of its quarantine that failed do not run again"
            );
        }
        if self.cooling.stopping() {
            return;
        }
        let why = format!(
            "its quarantine actions failed {} runs in a row",
            run.failures
        );
        self.run_actions_again(gpu, &why);
    }

    /// Counts a site command's outcome for `/metrics` and the console.
    pub(super) fn count_action(&mut self, kind: ActionKind, what: &str, o: &actions::Outcome) {
        let at = self.clock.wall();
        self.site_actions.count(kind, o.ok, || ActionFailure {
            at,
            what: what.to_string(),
            program: o.program.clone(),
            detail: o.detail.clone(),
        });
    }

    /// Says in the log when the XID queue dropped events since it last
    /// said so (at most once a round).
    pub(super) fn say_xids_dropped(&mut self) {
        let (_, dropped) = self.xid_stats.get();
        if dropped > self.xids_dropped_said {
            tracing::warn!(
                "{} XIDs dropped by the full XID queue ({dropped} since the start): application XIDs and repeats in a storm; the first fatal and the first degrading XID of every GPU are kept",
                dropped - self.xids_dropped_said
            );
            self.xids_dropped_said = dropped;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_flash::config::{MAX_KEY, MAX_VALUE};
    use loopwarden_protocol::{GpuHealth, GpuIndex, ReasonCode, Text, TimestampMs};

    #[test]
    fn identities_are_fnv1a_of_the_uuid_and_none_when_unknown() {
        assert_eq!(super::super::identity("a"), Some(0xaf63_dc4c_8601_ec8c));
        assert_eq!(super::super::identity("unknown"), None);
        let a = super::super::identity("GPU-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa");
        let b = super::super::identity("GPU-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaab");
        assert_ne!(a, b);
    }

    #[test]
    fn keys_and_the_longest_records_fit_the_store() {
        for what in [Record::Health, Record::Done] {
            let k = what.key(u64::MAX);
            assert!(k.len() <= MAX_KEY, "{k}");
            assert_ne!(what.key(0), what.index_key(0));
        }
        let h = GpuHealth {
            gpu: GpuIndex::new(15).unwrap(),
            state: HealthState::Quarantined,
            reason: ReasonCode(u16::MAX),
            since: TimestampMs(u64::MAX),
            evidence: Text::truncated(&"é".repeat(200)),
        };
        let v = tagged(u64::MAX, &postcard::to_allocvec(&h).unwrap());
        assert!(v.len() <= MAX_VALUE, "{}", v.len());
        assert_eq!(untag(&v).map(|(id, _)| id), Some(u64::MAX));
    }

    #[test]
    fn records_of_earlier_versions_are_told_from_tagged_ones() {
        let h = GpuHealth {
            gpu: GpuIndex::new(3).unwrap(),
            state: HealthState::Quarantined,
            reason: ReasonCode(79),
            since: TimestampMs(1),
            evidence: Text::truncated("x"),
        };
        assert_eq!(untag(&postcard::to_allocvec(&h).unwrap()), None);
        assert_eq!(untag(&u64::MAX.to_le_bytes()), None, "a stamp");
        let v = tagged(7, &5u64.to_le_bytes());
        assert_eq!(untag(&v), Some((7, &5u64.to_le_bytes()[..])));
    }
}
