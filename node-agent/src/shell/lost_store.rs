//! What the event log, which survives a lost config store
//! (`Stores::config_lost`), says of what the store kept: the cooling-loss
//! phase, from the cooling actions logged (each command's outcome is
//! logged as a `cooling_action` event when it ends, or when the runner
//! refused it).
//!
//! The phase the actions say, oldest first: a drain is a loss drained
//! (its grace counted from the first drain logged since the last undo), a
//! power-down a host powered down (a drain run again after it, as a drain
//! cut by the power-down is, leaves it so), a resume that ended well
//! cooled (the loss undone): each of its configured commands logged as
//! ended well, one after the other (the runner runs every command of a
//! step and logs each; a step is done only when all ended well). A
//! power-up with no resume after it, a resume with a command that
//! failed, or a log that is not whole (the actions before its oldest
//! record unknown) before any action that says, cannot tell: the phase is
//! unknown, for the CDU's first word to decide. A whole log with no
//! cooling action is cooled: nothing was done to undo.
//!
//! Each GPU index's last health change in the log (`health_changed`,
//! by index: the log names no UUID) stands for the health the store kept
//! of the GPU there: after a loss, a last change to quarantined is
//! quarantined again (`super::startup::restore_health`; where the start
//! sees a GPU missing, the log naming an index not found or fewer GPUs
//! than expected, its evidence says it may be another GPU, renumbered:
//! `super::startup::logged_quarantines_at`). So the log
//! matches the store at every start with the store intact
//! ([`match_log`]): a GPU that starts other than the log's last change of
//! its index says, quarantined or not (another GPU in the slot, the one
//! quarantined renumbered, a change not logged), has its state logged as
//! a health change, for the reason of the state it starts in.
//!
//! A start that found the store lost keeps what it took back (the GPUs'
//! health, the cooling-loss phase when known: [`keep_recovered`]); the
//! store's lost mark is cleared while the agent runs, in order after
//! them, once the phase is known and kept too (at the start, or once the
//! CDU's word decides it: [`PendingClear`]) and each GPU whose UUID was
//! unknown at the start has said it in the run, its state taken back
//! then kept under it (a GPU that never says it keeps the mark, said: its
//! state, a quarantine from the event log maybe, is kept under no UUID,
//! and only the lost store's reading of the log takes it back). Each GPU's limits wait for
//! nothing: the start keeps for each whose limits record the loss took a
//! record that they were not read since the loss (a record that survived
//! a partial loss is kept as it is and read as kept: most often the
//! site's limit, but maybe the limit a start since the loss first read, a
//! cap perhaps, or an older copy of the key the loss left)
//! (`super::limits::unread_record`), read as unreadable at
//! every start until its first limits read are kept over it, so a GPU
//! whose limit never reads keeps only its own limits unreadable, never
//! the store lost. Until the mark clears every start reads the store as
//! lost.
//! A host that manages no cooling (no CDU) has no cooling-loss action to
//! undo: its phase is cooled where the log cannot tell.
//!
//! Glossary:
//! - *whole*: a log that never lost a record: no wrap marker
//!   ([`loopwarden_flash::log::WRAPPED`]), its oldest record numbered 0
//!   (a log starts at 0; a wrap cut before its marker loses the oldest
//!   numbers), no stored item skipped as not a record.
//! - *lost mark*: the config value that makes every start read the store
//!   as lost ([`loopwarden_store::agent_flash::LOST_MARK_KEY`]); *pending
//!   clear*: the mark to clear in this run once all it waits for is kept.

use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use loopwarden_flash::log::WRAPPED;
use loopwarden_flash::EventLog;
use loopwarden_protocol::{
    CoolingStep, Event, GpuIndex, HealthState, Message, MessageKind, ReasonCode, TimestampMs,
};
use loopwarden_store::agent_flash::Flash;
use loopwarden_store::recorder::Recorder;
use node_core::cooling_loss::Phase;
use node_core::health::HealthEngine;

/// A GPU index's last health change in the event log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LastChange {
    /// Its record's number.
    pub seq: u32,
    /// When it was logged.
    pub time: TimestampMs,
    /// The state it changed to.
    pub to: HealthState,
    /// Why.
    pub reason: ReasonCode,
}

/// Each of the first `gpus` GPU indexes' last health change in the event
/// log (`log`), in one pass; `Err` says why the log cannot be read.
pub(super) async fn last_changes(
    log: &mut EventLog<Flash>,
    gpus: usize,
) -> Result<Vec<Option<LastChange>>, String> {
    let mut last = vec![None; gpus];
    log.for_each(|r| {
        if r.kind != MessageKind::Event as u8 {
            return;
        }
        if let Ok(Message::Event(Event::HealthChanged {
            gpu, to, reason, ..
        })) = Message::decode_body(MessageKind::Event, r.body)
        {
            if let Some(slot) = last.get_mut(gpu.get() as usize) {
                *slot = Some(LastChange {
                    seq: r.seq,
                    time: r.time,
                    to,
                    reason,
                });
            }
        }
    })
    .await
    .map_err(|e| format!("event log unreadable ({e:?})"))?;
    Ok(last)
}

/// At a start with the config store intact: every GPU of `health` whose
/// state, as kept, is quarantined where the log's last change of its index
/// (`last`) is not, or the other way round, has its state appended to the
/// log (`log`) as a health change, said (see the module note). The GPUs
/// `unknown` (marked degraded: their kept state unreadable, or their UUID
/// unknown) are left: which GPU they are is not known.
pub(super) async fn match_log(
    log: &mut EventLog<Flash>,
    health: &HealthEngine,
    last: &Result<Vec<Option<LastChange>>, String>,
    unknown: &[u8],
) {
    let Ok(last) = last else {
        return;
    };
    for (gpu, logged) in (0u8..).zip(last) {
        let Some(st) = health.status(gpu).filter(|_| !unknown.contains(&gpu)) else {
            continue;
        };
        let logged_to = logged.as_ref().map_or(HealthState::Healthy, |l| l.to);
        let quarantined = HealthState::Quarantined;
        if (logged_to == quarantined) == (st.state == quarantined) {
            continue;
        }
        let Some(index) = GpuIndex::new(gpu) else {
            continue;
        };
        let change = Message::Event(Event::HealthChanged {
            gpu: index,
            from: logged_to,
            to: st.state,
            reason: st.reason,
        });
        let seq = logged.as_ref().map_or("none".into(), |l| l.seq.to_string());
        let appended = match loopwarden_store::resend::event_body(&change) {
            Ok(body) => log
                .append(loopwarden_bus::now_ms(), MessageKind::Event as u8, &body)
                .await
                .map_err(|e| format!("{e:?}")),
            Err(e) => Err(e),
        };
        match appended {
            Ok(_) => tracing::warn!(
                "GPU {gpu}: starts {} ({}) as kept under its UUID, though the event log's last health change of its index (record {seq}) is to {logged_to} (another GPU in its slot, or a change not logged): logged as a change to {}, so a config store lost later takes the GPU there as it is",
                st.state,
                st.reason,
                st.state
            ),
            Err(e) => tracing::error!(
                "GPU {gpu}: its state, {}, differs from the event log's last health change of its index ({logged_to}), and could not be logged ({e}): a config store lost later takes it as {logged_to}",
                st.state
            ),
        }
    }
}

/// After a start that found the config store lost: keeps, by `recorder`,
/// in order after the GPUs' recovered health states handed over before,
/// the records that each GPU's limits were not read since the loss
/// (`limits_unread`), and the cooling-loss phase taken back (`cooling`,
/// its items; `None` while it is unknown: kept once the CDU's word
/// decides it).
/// `Err` says why the store's lost mark
/// ([`loopwarden_store::agent_flash::LOST_MARK_KEY`]) stays for this run:
/// the phase was refused, or a value was refused since
/// the count `refused_before` ([`Recorder::refused`]); the next start
/// then reads the store as lost again (what was kept is unknown, never
/// nothing kept). `Ok`: the mark is cleared once [`PendingClear`] is
/// ready.
async fn keep_recovered(
    recorder: &Recorder,
    refused_before: u64,
    limits_unread: Vec<(String, Vec<u8>)>,
    cooling: Option<Vec<(String, Vec<u8>)>>,
) -> Result<(), String> {
    let why = MARK_STAYS;
    // Waited for: the health states handed over before are in flash too.
    let items = [limits_unread, cooling.unwrap_or_default()].concat();
    (recorder.set_all_sync(items).await).map_err(|e| {
        format!("the cooling-loss phase taken back, or the GPUs' limits as not read since, not kept ({e}): {why}")
    })?;
    let refused = recorder.refused().saturating_sub(refused_before);
    if refused > 0 {
        return Err(format!(
            "{refused} values recovered were refused by the flash: {why}"
        ));
    }
    Ok(())
}

/// At a start that found the config store lost, the GPUs of `uuids` as
/// `node` started them (`unreadable`: those whose states were taken back,
/// handed to `recorder` before; `limits_unread`: those whose limits record
/// the loss took): keeps, by [`keep_recovered`], the limits of each GPU of
/// `limits_unread` as not read since the loss (a record that survived a
/// partial loss is kept as it is: see the module note) and the cooling-loss `phase` and
/// `steps` where the node knows them; the states of the GPUs
/// `unreadable` whose UUIDs are unknown are not kept: the clear waits for
/// each to say its UUID in the run ([`PendingClear::identified`]).
/// Returns the mark's clear to pend, or (`Err`) why the mark stays for
/// this run.
pub(super) async fn keep_after_loss(
    recorder: &Recorder,
    started: (&node_core::node::Node, &[&str], &[u8], &[u8]),
    (phase, steps): (Phase, &[CoolingStep]),
    refused_before: u64,
) -> Result<PendingClear, String> {
    let (node, uuids, unreadable, limits_unread) = started;
    let items = (!node.cooling_unknown()).then(|| super::cooling::phase_items(phase, steps));
    let unkept: Vec<u8> = (unreadable.iter().copied())
        .filter(|&g| {
            (uuids.get(g as usize))
                .and_then(|u| super::identity(u))
                .is_none()
        })
        .collect();
    let limits_unread = (limits_unread.iter())
        .filter_map(|&g| uuids.get(g as usize))
        .filter_map(|u| super::limits::unread_record(u))
        .collect();
    let phase_kept = items.is_some();
    keep_recovered(recorder, refused_before, limits_unread, items).await?;
    Ok(PendingClear {
        refused_before,
        unkept,
        not_kept: Vec::new(),
        stays: None,
        phase_kept,
    })
}

/// The store's lost mark to clear while the agent runs, once what the
/// start took back is kept ([`keep_recovered`]) and the rest of what the
/// lost store held is known and kept again: the cooling-loss phase (known
/// at the start, or once the CDU's word decides it: kept then,
/// `super::cooling`), and the state taken back of each GPU whose UUID was
/// unknown at the start (no record can name it before): kept once it
/// says its UUID in the run ([`Self::identified`]). A GPU that never says
/// it in the run keeps the mark: its state taken back (a quarantine from
/// the event log) is kept under no UUID, so a start that read the store
/// intact would take the GPU as healthy, its quarantine forgotten, and
/// the limit found on it (maybe a cap) for its ceiling; the next start
/// takes them from the event log again. Each GPU's limits need no wait:
/// the start kept for each whose record the loss took a record that they
/// were not read since the loss, which reads as unreadable (the limit
/// found said as an error, never taken quietly for the GPU's ceiling: it
/// may be a cap a lease left in force) until its first limits read are
/// kept over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingClear {
    /// The flash's refusals counted before the start kept anything.
    refused_before: u64,
    /// The GPUs whose UUIDs were unknown at the start, their states
    /// taken back not kept yet.
    unkept: Vec<u8>,
    /// The GPUs whose records could not be handed to the flash (a queue
    /// full, the flash thread gone: not counted as refused): their limits
    /// when identified since ([`Self::identified`]), or their health
    /// states ([`Self::health_not_kept`]): the mark stays for this run.
    not_kept: Vec<u8>,
    /// Why the mark stays for this run whatever comes (what the start
    /// took back not kept: [`keep_after_loss`] failed), if it does.
    stays: Option<String>,
    /// The cooling-loss phase handed to the flash: at the start where
    /// known, else once the CDU's word decided it ([`Self::phase_kept`]);
    /// a phase decided that could not be handed over waits for its next
    /// change to be kept.
    phase_kept: bool,
}

impl PendingClear {
    /// Whether everything is kept that the mark waits for: the phase
    /// known (`cooling_unknown`: not yet), and every GPU unknown at the
    /// start identified since, its records kept.
    pub(super) fn ready(&self, cooling_unknown: bool) -> bool {
        !cooling_unknown
            && self.phase_kept
            && self.unkept.is_empty()
            && self.not_kept.is_empty()
            && self.stays.is_none()
    }

    /// A mark that stays for this run whatever comes (`why`): shown as
    /// such, never cleared.
    fn stays(why: String) -> Self {
        Self {
            refused_before: 0,
            unkept: Vec::new(),
            not_kept: Vec::new(),
            stays: Some(why),
            phase_kept: false,
        }
    }

    /// The cooling-loss phase the CDU's word decided is handed to the
    /// flash, in order before the mark's clear.
    pub(super) fn phase_kept(&mut self) {
        self.phase_kept = true;
    }

    /// What the clear still waits for, as the console and `/metrics`
    /// show it (`cooling_unknown`: the phase not known yet).
    fn view(&self, cooling_unknown: bool) -> crate::console::snapshot::ConfigLost {
        crate::console::snapshot::ConfigLost {
            waiting_for: self.unkept.clone(),
            phase_unknown: cooling_unknown,
            phase_not_kept: !cooling_unknown && !self.phase_kept,
            not_kept: self.not_kept.clone(),
            stays: self.stays.clone(),
            clearing: false,
        }
    }

    /// The GPUs identified since the start whose records were not kept:
    /// the mark stays for this run.
    pub(super) fn not_kept(&self) -> &[u8] {
        &self.not_kept
    }

    /// GPU `gpu`'s health record could not be handed to the flash (a
    /// queue full, the flash thread gone: `super::quarantine::hand_health`)
    /// while the mark waits: it stays for this run, as for a GPU whose
    /// limits record was not kept ([`Self::identified`]): a clear
    /// without it leaves the next start reading the store intact with no
    /// health record for the GPU (healthy, a quarantine from the event
    /// log forgotten).
    pub(super) fn health_not_kept(&mut self, gpu: u8) {
        if !self.not_kept.contains(&gpu) {
            self.not_kept.push(gpu);
        }
    }

    /// The GPUs the clear still waits for to say their UUIDs.
    pub(super) fn unkept(&self) -> &[u8] {
        &self.unkept
    }

    /// GPU `gpu` said its UUID (`uuid`): the clear waits for it no more
    /// once its records are kept, by `recorder`: the limits found kept
    /// for it (`kept_limits`, read through the recorder,
    /// `super::limits::kept_through`) where they read, else the record
    /// that they were not read since the loss; its health state the node
    /// has it kept at its identification, handed to the recorder before
    /// the clear. Whether the clear waited for it. A record not kept
    /// ([`Recorder::set_all_sync`] failing: dropped, the thread gone, or
    /// refused) keeps the mark for this run ([`Self::not_kept`]): a clear
    /// without it leaves the next start reading the store intact with no
    /// limits record for the GPU, the limit found on it taken quietly for
    /// its ceiling.
    pub(super) async fn identified<T>(
        &mut self,
        recorder: &Recorder,
        (gpu, uuid): (u8, &str),
        kept_limits: &Result<Option<T>, String>,
    ) -> bool {
        if !self.unkept.contains(&gpu) {
            return false;
        }
        if !matches!(kept_limits, Ok(Some(_))) {
            let unread = super::limits::unread_record(uuid).into_iter().collect();
            if let Err(e) = recorder.set_all_sync(unread).await {
                tracing::error!(
                    "GPU {gpu}: its power limits as not read since the config store was lost not kept ({e}): {MARK_STAYS}"
                );
                self.not_kept.push(gpu);
            }
        }
        self.unkept.retain(|&g| g != gpu);
        true
    }
}

/// Clears the store's lost mark by `recorder`, in order after everything
/// handed to it before (waited for first), unless the flash refused a
/// value since `pending` began: then it stays, and the next start reads
/// the store as lost again. `Err` says why it stays.
pub(super) async fn clear_mark(recorder: &Recorder, pending: PendingClear) -> Result<(), String> {
    let why = MARK_STAYS;
    (recorder.set_all_sync(Vec::new()).await).map_err(|e| format!("{e}: {why}"))?;
    let refused = recorder.refused().saturating_sub(pending.refused_before);
    if refused > 0 {
        return Err(format!(
            "{refused} values were refused by the flash since the start: {why}"
        ));
    }
    let (key, value) = loopwarden_store::agent_flash::lost_mark_cleared();
    (recorder.set_sync(key, value).await).map_err(|e| format!("{e}: {why}"))
}

impl super::Agent {
    /// At the start: keeps the health state of each GPU whose kept state
    /// was unreadable (`undone`), and after a config store lost
    /// (`config_lost`) what was taken back ([`Self::keep_recovered`]).
    pub(super) async fn keep_taken_back(&mut self, undone: &super::Undone, config_lost: bool) {
        let refused = self.recorder.refused();
        let mut not_handed = Vec::new();
        for &gpu in &undone.unreadable {
            if !self.keep_health(gpu).await {
                not_handed.push(gpu);
            }
        }
        if config_lost {
            let cooling = (undone.phase, &undone.steps[..]);
            let gpus = (&undone.unreadable[..], &undone.limits_unread[..]);
            self.keep_recovered(gpus, &not_handed, cooling, refused)
                .await;
        }
    }

    /// At a start that found the config store lost: keeps what it took
    /// back (the GPUs' health states, `unreadable`, handed over before,
    /// but for those `not_handed`: the mark stays for this run; the
    /// limits of the GPUs `limits_unread` as not read since;
    /// the cooling-loss `phase` and `steps`, when known) and leaves the
    /// lost mark to clear once the rest is known and kept
    /// ([`Self::clear_lost_mark_once_kept`]); said.
    pub(super) async fn keep_recovered(
        &mut self,
        (unreadable, limits_unread): (&[u8], &[u8]),
        not_handed: &[u8],
        cooling: (Phase, &[CoolingStep]),
        refused_before: u64,
    ) {
        let uuids: Vec<&str> = self.gpus.iter().map(|g| g.info.uuid.as_str()).collect();
        let started = (&self.node, &uuids[..], unreadable, limits_unread);
        match keep_after_loss(&self.recorder, started, cooling, refused_before).await {
            Ok(mut pending) => {
                for &gpu in not_handed {
                    tracing::error!(
                        "the config store lost: GPU {gpu}: its health state taken back not kept: {MARK_STAYS}"
                    );
                    pending.health_not_kept(gpu);
                }
                tracing::warn!(
                    "the config store lost: what was taken back (GPU health, the cooling-loss phase when known) is kept again, and the power limits of each GPU whose record was lost as not read since (unreadable at a restart until its first limit read is kept); the store's lost mark clears once the cooling-loss phase is known and kept"
                );
                if !pending.unkept().is_empty() {
                    tracing::error!(
                        "the config store lost: GPUs {:?}: their UUIDs unknown at the start, their states taken back are kept once each says it (asked every {} s while it answers); the store's lost mark stays until then: {UNKEPT_WHY}",
                        pending.unkept(),
                        super::identify::ASK_EVERY.as_secs()
                    );
                }
                self.lost_mark = Some(pending);
                self.clear_lost_mark_once_kept();
            }
            Err(e) => {
                tracing::error!("{e}");
                self.lost_mark = Some(PendingClear::stays(e));
            }
        }
    }

    /// GPU `gpu`, whose UUID was unknown at the start, said it (`uuid`;
    /// the limits kept for it, `kept_limits`, as read then): after a
    /// config store lost, the clear of its lost mark waits for it no
    /// more ([`PendingClear::identified`]). Called before the node is
    /// told, so its limits read since are kept over the record that they
    /// were not.
    pub(super) async fn identified_after_loss<T>(
        &mut self,
        gpu: u8,
        uuid: &str,
        kept_limits: &Result<Option<T>, String>,
    ) {
        let Some(pending) = self.lost_mark.as_mut() else {
            return;
        };
        if pending
            .identified(&self.recorder, (gpu, uuid), kept_limits)
            .await
        {
            tracing::warn!(
                "the config store lost: GPU {gpu} said its UUID: its state taken back is kept under it, its power limits as not read since unless a record of them survived; GPUs the lost mark still waits for: {:?}",
                pending.unkept()
            );
        }
    }

    /// GPU `gpu`'s health record could not be handed to the flash
    /// (`super::quarantine::hand_health`, said): a lost mark still
    /// pending stays for this run ([`PendingClear::health_not_kept`]),
    /// said.
    pub(super) fn health_not_kept_after_loss(&mut self, gpu: u8) {
        let Some(pending) = self.lost_mark.as_mut() else {
            return;
        };
        pending.health_not_kept(gpu);
        tracing::error!(
            "the config store lost: GPU {gpu}: its health state not kept: {MARK_STAYS}"
        );
    }

    /// The cooling-loss record is handed to the flash (by
    /// `super::cooling`): once the phase is known (the CDU's word decided
    /// it), the lost mark pending waits for it no more, and clears if all
    /// else is kept.
    pub(super) fn phase_kept_after_loss(&mut self) {
        let known = !self.node.cooling_unknown();
        if let Some(pending) = self.lost_mark.as_mut().filter(|_| known) {
            pending.phase_kept();
        }
        self.clear_lost_mark_once_kept();
    }

    /// Clears the store's lost mark, off the loop and in order after what
    /// was handed to the flash, if one is pending and all it waits for is
    /// kept ([`PendingClear::ready`]); the outcome said. A clean stop
    /// waits for it ([`Self::finish_lost_mark_clear`]). Called when the
    /// cooling-loss phase is kept, and after each step (a GPU identified
    /// late has its health kept by its step).
    pub(super) fn clear_lost_mark_once_kept(&mut self) {
        let unknown = self.node.cooling_unknown();
        if !self.lost_mark.as_ref().is_some_and(|p| p.ready(unknown)) {
            return;
        }
        let Some(pending) = self.lost_mark.take() else {
            return;
        };
        self.lost_mark_clearing = Some(spawn_clear(self.recorder.clone(), pending));
    }

    /// The config store found lost at this start, its lost mark standing:
    /// what its clear waits for (the console's `config_lost`, the
    /// `loopwarden_config_store_lost` gauge); `None` when found intact or
    /// once the clear is done (one that failed said in the log).
    pub(super) fn config_lost_view(&self) -> Option<crate::console::snapshot::ConfigLost> {
        if let Some(pending) = &self.lost_mark {
            return Some(pending.view(self.node.cooling_unknown()));
        }
        self.lost_mark_clearing.as_ref()?.view()
    }

    /// At a clean stop: waits (at most [`CLEAR_WAIT`]) for the lost
    /// mark's clear under way, so it is in flash before the stop (a stop
    /// that cancelled it left the next start reading the store as lost
    /// again, every GPU not quarantined degraded); one not done by then is
    /// said, the mark left as the flash has it. A clear still waiting for
    /// GPUs that never said their UUIDs is said too: the mark stays.
    pub(super) async fn finish_lost_mark_clear(&mut self) {
        for line in self.lost_mark.iter().flat_map(said_at_stop) {
            tracing::error!("{line}");
        }
        if let Some(clearing) = self.lost_mark_clearing.take() {
            finish_clear(clearing).await;
        }
    }
}

/// The lost mark's clear under way ([`spawn_clear`]): its task, and why
/// it failed once it did (the mark then stays: the status still shows it).
pub struct Clearing {
    task: tokio::task::JoinHandle<()>,
    failed: std::sync::Arc<std::sync::OnceLock<String>>,
}

impl Clearing {
    /// What the status says of the clear: under way, or failed (the mark
    /// stays for this run, and why); `None` once done.
    fn view(&self) -> Option<crate::console::snapshot::ConfigLost> {
        if let Some(e) = self.failed.get() {
            return Some(crate::console::snapshot::ConfigLost {
                stays: Some(e.clone()),
                ..Default::default()
            });
        }
        (!self.task.is_finished()).then(|| crate::console::snapshot::ConfigLost {
            clearing: true,
            ..Default::default()
        })
    }
}

/// Clears the store's lost mark by `recorder` ([`clear_mark`]) on a task
/// of its own, off the loop; the outcome said, a failure kept for the
/// status. The caller holds it, for a clean stop to wait for
/// ([`finish_clear`]).
pub(super) fn spawn_clear(recorder: Recorder, pending: PendingClear) -> Clearing {
    let failed = std::sync::Arc::new(std::sync::OnceLock::new());
    let said = failed.clone();
    let task = tokio::spawn(async move {
        match clear_mark(&recorder, pending).await {
            Ok(()) => tracing::warn!(
                "the config store lost: what the lost store held is kept again: its lost mark is cleared, the next start reads the store as intact"
            ),
            Err(e) => {
                tracing::error!("{e}");
                let _ = said.set(e.to_string());
            }
        }
    });
    Clearing { task, failed }
}

/// Waits (at most [`CLEAR_WAIT`]) for the lost mark's clear under way
/// (`clearing`, [`spawn_clear`]); one not done by then is said.
pub(super) async fn finish_clear(clearing: Clearing) {
    match tokio::time::timeout(CLEAR_WAIT, clearing.task).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(
            "the config store lost: clearing its lost mark failed ({e}): the next start may read the store as lost again"
        ),
        Err(_) => tracing::error!(
            "the config store lost: its lost mark's clear not done after {} s (the flash is slow or failing): the next start may read the store as lost again",
            CLEAR_WAIT.as_secs()
        ),
    }
}

/// What a clean stop says of the lost mark's clear still pending
/// (`pending`): the GPUs that never said their UUIDs, and those whose
/// records were not kept when they did; the mark stays.
fn said_at_stop(pending: &PendingClear) -> Vec<String> {
    let mut said = Vec::new();
    if let unkept @ [_, ..] = pending.unkept() {
        said.push(format!(
            "the config store lost: GPUs {unkept:?} never said their UUIDs in this run: {MARK_STAYS}: {UNKEPT_WHY}"
        ));
    }
    if let not_kept @ [_, ..] = pending.not_kept() {
        said.push(format!(
            "the config store lost: GPUs {not_kept:?}: their records were not kept in this run (when they said their UUIDs, or their health states taken back): {MARK_STAYS}"
        ));
    }
    said
}

/// How an error says the store's lost mark stays (the operator docs'
/// messages table quotes it).
const MARK_STAYS: &str =
    "the store's lost mark stays: the next start reads the config store as lost again";

/// Why the lost mark waits for a GPU whose UUID is unknown: said at the
/// start and at a stop before it said it.
const UNKEPT_WHY: &str = "such a GPU's state taken back (a quarantine from the event log included) is kept under no UUID, so a start that read the store intact would take it as healthy, its quarantine forgotten, and the limit found on it (maybe a cap) for its site's limit; a start that reads the store lost takes its quarantine from the event log again, and marks every other GPU not quarantined degraded (kept-state-unreadable) until its quiet period passes; a GPU off the bus for good: take it out of the host and restart, but the next start still reads the store as lost and takes the event log's quarantines by index: where the GPUs after it are renumbered, its quarantine lands on the GPU now at its index (said in that GPU's evidence when the log names an index not found or fewer than expected_gpus are found: check it, release it if healthy)";

/// How long a clean stop waits for the lost mark's clear under way: the
/// flash's writes handed before it, then the mark.
const CLEAR_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The phase the cooling actions logged say, as they are read oldest
/// first (see the module note); `Err` says why it cannot be told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PhaseFold {
    phase: Result<Phase, String>,
    /// The resume's configured commands: each logs its own action.
    resume_commands: usize,
    /// Resumes that ended well logged one after the other, last.
    resumes_ok: usize,
}

impl PhaseFold {
    /// Before the oldest record: cooled for a whole log. A resume is
    /// `resume_commands` commands (one at least), each logged.
    fn new(resume_commands: usize) -> Self {
        Self {
            phase: Ok(Phase::Cooled),
            resume_commands: resume_commands.max(1),
            resumes_ok: 0,
        }
    }

    /// The log is not whole (`why`): what came before its oldest record
    /// is unknown, until an action that says. Called before any action is
    /// taken.
    fn not_whole(&mut self, why: String) {
        self.phase = Err(why);
    }

    /// A cooling action `step` logged at `t` (wall clock, ms), which
    /// ended well or not (`ok`). A resume is done only when its last
    /// `resume_commands` actions logged all ended well (the runner runs
    /// every command of a step, even after one failed, and logs each): as
    /// with the store intact, where a resume with a command that failed
    /// stays pending.
    fn take(&mut self, t: u64, step: CoolingStep, ok: bool) {
        self.resumes_ok = match (step, ok) {
            (CoolingStep::Resume, true) => self.resumes_ok + 1,
            _ => 0,
        };
        self.phase = match (step, &self.phase) {
            (CoolingStep::Drain, Ok(Phase::Cooled)) => Ok(Phase::Draining { since: t }),
            (CoolingStep::Drain, other) => other.clone(),
            (CoolingStep::PowerDown, Ok(Phase::PoweredDown { since })) => {
                Ok(Phase::PoweredDown { since: *since })
            }
            (CoolingStep::PowerDown, _) => Ok(Phase::PoweredDown { since: t }),
            (CoolingStep::PowerUp, _) => Err(
                "the last power-up logged has no resume after it: the host's return to work is not known done"
                    .into(),
            ),
            (CoolingStep::Resume, _) if self.resumes_ok >= self.resume_commands => {
                Ok(Phase::Cooled)
            }
            (CoolingStep::Resume, _) if ok => Err(format!(
                "the last resume logged has {} of its {} commands logged as ended well one after the other: the host's return to work is not known done",
                self.resumes_ok, self.resume_commands
            )),
            (CoolingStep::Resume, _) => {
                Err("the last resume logged failed: the host's return to work is not known done".into())
            }
        };
    }

    /// The phase, or why it cannot be told.
    pub(super) fn phase(self) -> Result<Phase, String> {
        self.phase
    }
}

/// The cooling-loss phase the event log (`log`) says (see the module
/// note), for a resume of `resume_commands` commands; `Err` says why it
/// cannot tell (the log unreadable included). Whether the log is whole is settled before the actions are folded: a
/// log that is not whole starts the fold unknown, and only the actions
/// that say (a power-down, a resume that ended well) settle it; a wrap
/// marker read after them changes nothing (markers stay until their own
/// sector is erased, about one every sector of a wrapped log).
pub(super) async fn logged_phase<S: MultiwriteNorFlash>(
    log: &mut EventLog<S>,
    resume_commands: usize,
) -> Result<Phase, String> {
    let mut actions = Vec::new();
    let mut oldest = None;
    let mut wrapped = None;
    let mut undecoded = None;
    let skipped = log
        .for_each(|r| {
            oldest.get_or_insert(r.seq);
            if r.kind == WRAPPED {
                wrapped.get_or_insert(r.seq);
            }
            if r.kind != MessageKind::Event as u8 {
                return;
            }
            match Message::decode_body(MessageKind::Event, r.body) {
                Ok(Message::Event(Event::CoolingAction { step, ok, .. })) => {
                    actions.push((r.time.0, step, ok))
                }
                Ok(_) => {}
                Err(_) => undecoded = Some(r.seq),
            }
        })
        .await
        .map_err(|e| format!("the event log is unreadable ({e:?})"))?;
    if let Some(seq) = undecoded {
        return Err(format!(
            "event log record {seq} is an event that does not decode: it may be a cooling action"
        ));
    }
    let mut fold = PhaseFold::new(resume_commands);
    if let Some(why) = not_whole(oldest, wrapped, skipped) {
        fold.not_whole(why);
    }
    for (t, step, ok) in actions {
        fold.take(t, step, ok);
    }
    fold.phase()
}

/// Why a log whose oldest record is `oldest`, whose first wrap marker is
/// `wrapped`, and which skipped `skipped` items is not whole; `None` for
/// a whole one.
fn not_whole(oldest: Option<u32>, wrapped: Option<u32>, skipped: u32) -> Option<String> {
    match (oldest, wrapped) {
        (Some(seq), _) if seq != 0 => Some(format!(
            "the event log's oldest record is number {seq}, not 0: older records were lost"
        )),
        (_, Some(seq)) => Some(format!(
            "the event log wrapped (record {seq}): its oldest records were erased"
        )),
        _ if skipped > 0 => Some(format!("{skipped} items of the event log are not records")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    //! The phase the cooling actions logged say, action by action.

    use super::*;
    use CoolingStep::*;

    fn folded(whole: bool, actions: &[(u64, CoolingStep, bool)]) -> Result<Phase, String> {
        folded_with(1, whole, actions)
    }

    fn folded_with(
        resume_commands: usize,
        whole: bool,
        actions: &[(u64, CoolingStep, bool)],
    ) -> Result<Phase, String> {
        let mut fold = PhaseFold::new(resume_commands);
        if !whole {
            fold.not_whole("wrapped".into());
        }
        for &(t, step, ok) in actions {
            fold.take(t, step, ok);
        }
        fold.phase()
    }

    /// Nothing logged in a whole log is cooled; in one that wrapped, it
    /// cannot be told, until an action that says.
    #[test]
    fn no_cooling_action_is_cooled_only_in_a_whole_log() {
        assert_eq!(folded(true, &[]), Ok(Phase::Cooled));
        assert!(folded(false, &[]).is_err());
        assert!(folded(false, &[(5, Drain, true)]).is_err());
        let down = folded(false, &[(5, PowerDown, true)]);
        assert_eq!(down, Ok(Phase::PoweredDown { since: 5 }));
        assert_eq!(folded(false, &[(5, Resume, true)]), Ok(Phase::Cooled));
    }

    /// A drain, then a power-down, then the drain cut by it run again:
    /// powered down since the power-down; a resume that ended well
    /// undoes it all, one that failed or a power-up alone cannot tell.
    #[test]
    fn the_phase_follows_the_actions_logged() {
        assert_eq!(
            folded(true, &[(1, Drain, false), (2, Drain, true)]),
            Ok(Phase::Draining { since: 1 })
        );
        let loss = [(1, Drain, false), (9, PowerDown, true), (10, Drain, true)];
        assert_eq!(folded(true, &loss), Ok(Phase::PoweredDown { since: 9 }));
        let mut undone = loss.to_vec();
        undone.push((20, PowerUp, true));
        assert!(folded(true, &undone).is_err(), "powered up, not resumed");
        undone.push((21, Resume, false));
        assert!(folded(true, &undone).is_err(), "the resume failed");
        undone.push((22, Resume, true));
        assert_eq!(folded(true, &undone), Ok(Phase::Cooled));
        undone.push((30, Drain, true));
        assert_eq!(folded(true, &undone), Ok(Phase::Draining { since: 30 }));
    }

    /// With two resume commands (remove the taint, then uncordon), a
    /// resume is done only when both logged ended well, one after the
    /// other: one that failed, the other that ended well, cannot tell
    /// (with the store intact, the resume would stay pending and run
    /// again).
    #[test]
    fn a_resume_of_several_commands_is_cooled_only_when_each_ended_well() {
        let taint_failed = [(1, Drain, true), (2, Resume, false), (3, Resume, true)];
        assert!(folded_with(2, true, &taint_failed).is_err());
        assert!(folded_with(2, true, &[(1, Drain, true), (2, Resume, true)]).is_err());
        let again = [(4, Resume, true), (5, Resume, true)];
        let both = [taint_failed.as_slice(), &again].concat();
        assert_eq!(folded_with(2, true, &both), Ok(Phase::Cooled));
        let wrapped = folded_with(2, false, &[(2, Resume, true), (3, Resume, true)]);
        assert_eq!(wrapped, Ok(Phase::Cooled));
        assert!(folded_with(2, false, &[(3, Resume, true)]).is_err());
        let power_up_between = [(2, Resume, true), (3, PowerUp, true), (4, Resume, true)];
        assert!(folded_with(2, true, &power_up_between).is_err());
    }

    /// A small event log (three sectors) over simulated flash.
    async fn small_log() -> EventLog<loopwarden_flash::SimFlash<4, 1024>> {
        let flash = loopwarden_flash::SimFlash::<4, 1024>::new(3);
        EventLog::open(flash, 0..3072)
            .await
            .expect("a log over blank flash")
    }

    async fn append<S: MultiwriteNorFlash>(log: &mut EventLog<S>, t: u64, ev: Event) -> u32 {
        let body = loopwarden_store::resend::event_body(&Message::Event(ev)).expect("encodes");
        let kind = MessageKind::Event as u8;
        log.append(TimestampMs(t), kind, &body)
            .await
            .expect("appended")
    }

    /// A health change, to fill the log.
    fn filler() -> Event {
        Event::HealthChanged {
            gpu: GpuIndex::new(0).expect("index 0"),
            from: HealthState::Healthy,
            to: HealthState::Degraded,
            reason: ReasonCode::KEPT_STATE_UNREADABLE,
        }
    }

    /// Whether the log holds record `seq`, and a wrap marker after it.
    async fn holds_then_wrapped<S: MultiwriteNorFlash>(
        log: &mut EventLog<S>,
        seq: u32,
    ) -> (bool, bool) {
        let (mut held, mut wrapped) = (false, false);
        log.for_each(|r| {
            held |= r.seq == seq;
            wrapped |= r.kind == WRAPPED && r.seq > seq;
        })
        .await
        .expect("readable");
        (held, wrapped)
    }

    /// A loss undone (drain, power-down, power-up, a resume that ended
    /// well) in a log that wrapped before and after it, the resume still
    /// held: cooled. A wrap marker after the resume says nothing of what
    /// came before the oldest record.
    #[test]
    fn a_resume_held_in_a_log_that_wraps_again_is_cooled() {
        futures::executor::block_on(async {
            let mut log = small_log().await;
            let mut t = 0;
            while log.wraps() == 0 {
                t += 1;
                append(&mut log, t, filler()).await;
            }
            let mut resume = 0;
            for (step, ok) in [
                (Drain, true),
                (PowerDown, true),
                (PowerUp, true),
                (Resume, true),
            ] {
                t += 1;
                let exit_code = Some(0);
                resume = append(
                    &mut log,
                    t,
                    Event::CoolingAction {
                        step,
                        ok,
                        exit_code,
                    },
                )
                .await;
            }
            loop {
                t += 1;
                append(&mut log, t, filler()).await;
                let (held, wrapped) = holds_then_wrapped(&mut log, resume).await;
                assert!(
                    held,
                    "the resume (record {resume}) was erased before a wrap after it"
                );
                if wrapped {
                    break;
                }
            }
            assert_eq!(logged_phase(&mut log, 1).await, Ok(Phase::Cooled));
        });
    }

    /// The CDU's word decided the phase the log could not tell, but it
    /// could not be handed to the flash: the mark is not ready (a clear
    /// would leave the next start reading the store intact with the phase
    /// from before the loss) and the status says what it waits for; kept
    /// at its next change, it is.
    #[test]
    fn a_phase_decided_but_not_kept_holds_the_mark_and_says_so() {
        let mut pending = PendingClear {
            refused_before: 0,
            unkept: Vec::new(),
            not_kept: Vec::new(),
            stays: None,
            phase_kept: false,
        };
        assert!(!pending.ready(true) && pending.view(true).phase_unknown);
        assert!(!pending.ready(false), "the phase known, not kept");
        let view = pending.view(false);
        assert!(view.phase_not_kept && !view.phase_unknown, "{view:?}");
        pending.phase_kept();
        assert!(pending.ready(false));
        assert_eq!(pending.view(false), Default::default());
    }

    /// What a clean stop says of a mark still waiting for GPUs ends as
    /// the operator docs' messages table quotes it.
    #[test]
    fn the_stops_word_on_a_mark_that_stays_is_as_the_docs_quote_it() {
        let pending = PendingClear {
            refused_before: 0,
            unkept: vec![1],
            not_kept: vec![2],
            stays: None,
            phase_kept: true,
        };
        let said = said_at_stop(&pending);
        assert_eq!(said.len(), 2, "{said:?}");
        let quoted =
            "the store's lost mark stays: the next start reads the config store as lost again";
        for line in &said {
            assert!(line.contains(&format!(": {quoted}")), "{line}");
        }
        let doc = include_str!("../../../docs/node-agent.md");
        assert!(doc.contains(&format!("| `…: {quoted}` (error) |")));
    }

    /// A clear that fails (a value refused by the flash since the start)
    /// leaves the mark standing in the status, saying why, where it read
    /// as cleared: the next start reads the store as lost again.
    #[test]
    fn a_clear_that_fails_keeps_the_mark_in_the_status() {
        let stores = loopwarden_store::agent_flash::open(None).unwrap();
        let r = Recorder::start(stores.log, stores.store, None).unwrap();
        let too_big = futures::executor::block_on(r.set_sync("big".into(), vec![0; 1 << 20]));
        assert!(too_big.is_err() && r.refused() == 1, "{too_big:?}");
        let pending = PendingClear {
            refused_before: 0,
            unkept: Vec::new(),
            not_kept: Vec::new(),
            stays: None,
            phase_kept: true,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let view = rt.block_on(async {
            let clearing = spawn_clear(r.clone(), pending);
            while !clearing.task.is_finished() {
                tokio::task::yield_now().await;
            }
            clearing.view()
        });
        let stays = view.and_then(|v| v.stays).unwrap_or_default();
        assert!(stays.contains("lost mark stays"), "{stays}");
    }

    /// A publisher that holds the recorder's thread in its first publish
    /// until the test lets it go: what is handed over meanwhile waits.
    struct Held {
        entered: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
        go: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    }

    impl loopwarden_store::Publisher for Held {
        fn publish_message(
            &self,
            _: Message,
            _: TimestampMs,
            _: bool,
        ) -> Result<u32, loopwarden_store::Refused> {
            let _ = self.entered.lock().unwrap().send(());
            let _ = self.go.lock().unwrap().recv();
            Ok(0)
        }

        fn next_seq(&self) -> u32 {
            0
        }
    }

    /// GPU 1, unknown at a start after a loss, says its UUID while the
    /// flash thread has fallen so far behind that the record of its
    /// limits as not read since cannot be handed over (dropped, not a
    /// flash refusal: never counted in [`Recorder::refused`]): the clear
    /// no longer waits for its UUID, but it is not ready for this run,
    /// and says why: a clear then would leave the next start reading the
    /// store intact with no limits record for GPU 1, the limit found on
    /// it (maybe a lease's cap) taken quietly for its ceiling.
    #[test]
    fn a_gpu_whose_record_is_not_kept_at_its_identification_keeps_the_mark() {
        let stores = loopwarden_store::agent_flash::open(None).unwrap();
        let r = Recorder::start(stores.log, stores.store, None).unwrap();
        let (entered, entered_rx) = std::sync::mpsc::channel();
        let (go_tx, go) = std::sync::mpsc::channel();
        r.attach(Held {
            entered: std::sync::Mutex::new(entered),
            go: std::sync::Mutex::new(go),
        });
        r.publish(Message::Event(filler()), TimestampMs(1), false);
        entered_rx.recv().unwrap();
        for _ in 0..loopwarden_store::recorder::VITAL_MAX {
            r.set("filler".into(), vec![0]);
        }
        let mut pending = PendingClear {
            refused_before: r.refused(),
            unkept: vec![1],
            not_kept: Vec::new(),
            stays: None,
            phase_kept: true,
        };
        const A: &str = "GPU-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa";
        let found: Result<Option<()>, String> = Ok(None);
        assert!(futures::executor::block_on(pending.identified(
            &r,
            (1, A),
            &found
        )));
        assert_eq!(pending.unkept(), &[] as &[u8]);
        assert!(
            !pending.ready(false),
            "GPU 1's record not kept: the mark stays"
        );
        assert_eq!(pending.not_kept(), &[1]);
        assert_eq!(r.refused(), 0, "not a refusal the clear would count");
        go_tx.send(()).unwrap();
    }

    /// As above, GPU 1 identified late with its limits record kept, but
    /// its health record (quarantined from the event log, or not) cannot
    /// be handed to the flash thread: the mark stays for this run as for
    /// its limits, never cleared with the GPU's state kept under no
    /// record (the next start would read the store intact and take GPU 1
    /// as healthy, its quarantine forgotten).
    #[test]
    fn a_gpu_whose_health_record_is_not_handed_over_keeps_the_mark() {
        let stores = loopwarden_store::agent_flash::open(None).unwrap();
        let r = Recorder::start(stores.log, stores.store, None).unwrap();
        let (entered, entered_rx) = std::sync::mpsc::channel();
        let (go_tx, go) = std::sync::mpsc::channel();
        r.attach(Held {
            entered: std::sync::Mutex::new(entered),
            go: std::sync::Mutex::new(go),
        });
        r.publish(Message::Event(filler()), TimestampMs(1), false);
        entered_rx.recv().unwrap();
        let mut pending = PendingClear {
            refused_before: r.refused(),
            unkept: Vec::new(),
            not_kept: Vec::new(),
            stays: None,
            phase_kept: true,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        // Room for one more: handed over, the mark not held.
        for _ in 1..loopwarden_store::recorder::VITAL_MAX {
            r.set("filler".into(), vec![0]);
        }
        let record = || vec![("health.1".to_string(), vec![1]), ("check".into(), vec![2])];
        let handed = rt.block_on(super::super::quarantine::hand_health(
            &r,
            1,
            record(),
            false,
        ));
        assert_eq!(handed, Ok(()));
        for quarantined in [false, true] {
            let handed = rt.block_on(super::super::quarantine::hand_health(
                &r,
                1,
                record(),
                quarantined,
            ));
            let e = handed.expect_err("the queue is full: not handed over");
            pending.health_not_kept(1);
            assert!(!pending.ready(false), "{e}: the mark stays");
            assert_eq!(pending.not_kept(), &[1]);
        }
        go_tx.send(()).unwrap();
    }

    /// After a loss, the agent keeps GPU 1's health (`keep_health`, as
    /// every health change does) while the flash thread is held and its
    /// queue full: not handed over, the lost mark pending stays for this
    /// run, GPU 1 named. And the GPUs whose states taken back at the start
    /// were not handed over (`not_handed`) are named as not kept when
    /// what was taken back is kept (`keep_recovered`).
    #[test]
    fn the_agent_keeps_the_mark_for_a_health_record_not_handed_over() {
        let stores = loopwarden_store::agent_flash::open(None).unwrap();
        let r = Recorder::start(stores.log, stores.store, None).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut agent = rt.block_on(super::super::test_agent::agent(r.clone()));
        let pending = |r: &Recorder| PendingClear {
            refused_before: r.refused(),
            unkept: Vec::new(),
            not_kept: Vec::new(),
            stays: None,
            phase_kept: true,
        };
        // Taken back at the start, GPU 1's state not handed over.
        let cooling = (Phase::Cooled, &[][..]);
        rt.block_on(agent.keep_recovered((&[1], &[]), &[1], cooling, r.refused()));
        let mark = agent.lost_mark.take().expect("a mark pending");
        assert_eq!(mark.not_kept(), &[1]);
        assert!(!mark.ready(false), "GPU 1 not kept: the mark stays");
        // In the run: the flash thread held, its queue full.
        let (entered, entered_rx) = std::sync::mpsc::channel();
        let (go_tx, go) = std::sync::mpsc::channel();
        r.attach(Held {
            entered: std::sync::Mutex::new(entered),
            go: std::sync::Mutex::new(go),
        });
        r.publish(Message::Event(filler()), TimestampMs(1), false);
        entered_rx.recv().unwrap();
        for _ in 0..loopwarden_store::recorder::VITAL_MAX {
            r.set("filler".into(), vec![0]);
        }
        agent.lost_mark = Some(pending(&r));
        assert!(!rt.block_on(agent.keep_health(1)), "not handed over");
        let mark = agent.lost_mark.as_ref().expect("a mark pending");
        assert_eq!(mark.not_kept(), &[1]);
        assert!(!mark.ready(false), "GPU 1 not kept: the mark stays");
        go_tx.send(()).unwrap();
    }
}
