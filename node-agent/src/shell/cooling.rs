//! Cooling loss in the shell: the node decides (`node_core::cooling_loss`)
//! from the CDU's word about this host's rack; the steps it hands out run
//! here as the configured commands, one after another on one task, each
//! outcome logged to flash and published as a `cooling_action` event. A
//! drain still running when the power-down is decided is cut (its
//! command killed, the rest not run) and runs again after the power-down:
//! a scheduler that does not answer never holds the power-down past its
//! grace, and one that does still hears of the drain (a power-down that
//! switches the GPUs off leaves the host up for work).
//!
//! The phase is kept in flash together with the steps handed out and not
//! known done, in one record written before their commands start (the
//! runner waits for the flash's word before the first command; the loop
//! does not): a step
//! is done once every one of its commands ended well, and the record is
//! written again (before the outcome is published). At the start, the
//! steps kept pending (the agent was killed before or while they ran, or
//! one failed) are given back to the node, and stay pending here until
//! it decides each (at `Input::Start`, on its own clock): a drain, a
//! power-up and a resume run again at once, each harmless twice (a
//! resume at most once: a scheduler refuses to resume a node already in
//! service, and one run at every start would lift a drain an operator
//! made since; failing then, or cut, it is said and dropped, its record
//! marked [`AGAIN`] while it runs); a power-down once the CDU's first state taken after the start leaves the
//! rack powered down, or at the first round once
//! `node_core::cooling_loss::HELD_WAIT_MS` (or the grace, if longer)
//! passed without one (silence is not cooling), since a host-off command
//! that cut the host before its outcome was kept must not switch the host
//! off again at every start after cooling came back. A kept step the node
//! drops (`Effect::DropCooling`) is pending no more; so is a step undone
//! by a later one (a resume after a drain), and one still waiting behind
//! another in the runner when undone is not run (a power-down queued
//! behind a hanging drain, cooling back meanwhile).
//!
//! The record is kept with its check under a key of its own
//! ([`CHECK_KEY`]), both handed over as one: the store skips a damaged
//! copy and returns the one before it, so a damaged newest record would
//! otherwise read as an older phase (cooled, the grace started again,
//! the power-up never run). A record that cannot be read, or that its
//! check does not match (a power cut between the record and its check
//! makes one on a host simply cooled), is a phase unknown
//! (`Node::restore_cooling_unknown`): nothing runs until the CDU's first
//! word on the rack, silence included; lost, the host drains then and
//! powers down after the grace; cooling, it powers up and resumes. A
//! record an earlier version kept without a check reads as before. None
//! found in a config store lost since an earlier run is the phase the
//! cooling actions in the event log say (`super::lost_store`): cooled
//! when none was logged, unknown only where the log cannot tell.
//!
//! A drain that failed, still pending, runs again while the agent runs,
//! after a wait that doubles with each failure in a row
//! (`actions::retry_at`), one run at a time, until one ends well, a later
//! decision undoes it or decides it again, or the agent stops (the timer's
//! word comes back on the runner's channel, [`StepDone::RetryDue`]).
//!
//! A resume takes the whole node back into service, in the site's
//! scheduler, its quarantined GPUs with it: before its command starts the
//! quarantines in force are kept in flash as not known done (a restart
//! from then on runs their actions again), and once it ended the
//! quarantine actions of every GPU still quarantined run again.
//!
//! Glossary:
//! - *job*: one step's commands, numbered, for the runner.
//! - *pending*: handed out, or kept from before the restart, and not
//!   known done, in order.
//! - *last try*: a resume kept pending from before the restart, run
//!   again at the start: pending no more once it ended, well or not.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use loopwarden_flash::ConfigStore;
use loopwarden_protocol::{CoolingStep, Event, TimestampMs};
use loopwarden_store::agent_flash::Flash;
use loopwarden_store::check::{check_of, checked};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

mod ended;

use super::quarantine::get;
use super::Agent;
use crate::actions;
use crate::config::CoolingLossActions;
use crate::console::ActionKind;
use ended::DrainRetry;
use node_core::cooling_loss::Phase;

/// The config-store key of the cooling-loss phase and pending steps.
const PHASE_KEY: &str = "cooling_loss";
/// The config-store key of the check of the record under [`PHASE_KEY`].
const CHECK_KEY: &str = "cooling_loss_check";
/// Jobs waiting for the runner: a loss hands out at most four steps, and
/// a CDU that says lost and cooled a few times in a row a few more.
const QUEUE: usize = 16;

/// One step for the runner: its commands, already expanded.
pub(crate) struct Job {
    id: u64,
    step: CoolingStep,
    argvs: Vec<Vec<String>>,
    timeout: Duration,
    /// The flash's word that the record naming this step is kept: the
    /// runner waits for it before the first command.
    kept: Option<Kept>,
    /// Set when a later decision undid the step while it waited behind
    /// another (a power-down queued behind a hanging drain, cooling back
    /// meanwhile): its commands not started yet are not run.
    undone: Arc<AtomicBool>,
    /// Set (a drain's) when the power-down is decided while it runs.
    cut: Arc<Cut>,
}

/// A job cut short: the command running is killed, the rest not run.
#[derive(Debug, Default)]
pub(crate) struct Cut {
    flag: AtomicBool,
    now: tokio::sync::Notify,
}

impl Cut {
    /// Cuts the job.
    fn cut(&self) {
        self.flag.store(true, Ordering::Relaxed);
        self.now.notify_one();
    }

    fn is_cut(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }
}

/// Runs `argv` for `job` unless the job is cut first or meanwhile (then
/// it is killed, with what it started).
async fn run_unless_cut(job: &Job, argv: &[String]) -> actions::Outcome {
    let cut = || actions::Outcome {
        program: argv.first().cloned().unwrap_or_default(),
        ok: false,
        exit_code: None,
        detail: "cut: the power-down was decided while it ran, and does not wait for it".into(),
    };
    if job.cut.is_cut() {
        return cut();
    }
    tokio::select! {
        o = actions::run(argv, job.timeout) => o,
        () = job.cut.now.notified() => cut(),
    }
}

/// The answer of the flash to a record handed to it.
type Kept = tokio::sync::oneshot::Receiver<Result<(), String>>;

/// Waits until the record `kept` names is in flash. A record the flash
/// could not keep is said, and the step runs all the same: a power-down
/// for a rack without cooling matters more than the record of it (a
/// restart may then run it again, or not at all).
async fn wait_kept(step: CoolingStep, kept: Kept) {
    let why = match kept.await {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e,
        Err(_) => "the flash thread has ended".to_string(),
    };
    tracing::error!(
        "cooling-loss {step}: the phase was not kept in flash ({why}): its commands run anyway"
    );
}

/// A command of a step ended, or the step was undone before it ran; or
/// the wait before a failed drain runs again is over.
#[derive(Debug)]
pub(crate) enum StepDone {
    /// From the runner.
    Ran(Ran),
    /// The wait after job `id`, a drain that failed, is over (`due`: when,
    /// steady ms).
    RetryDue { id: u64, due: u64 },
}

/// A command of a step ended, or the step was undone before it ran.
#[derive(Debug)]
pub(crate) struct Ran {
    id: u64,
    step: CoolingStep,
    /// `None`: not run, a later decision undid the step first.
    outcome: Option<actions::Outcome>,
    /// After the step's last command: whether every one ended well.
    ended: Option<bool>,
}

/// The steps' state in the shell: the runner, what is pending, and the
/// phase kept with it.
pub(crate) struct Steps {
    jobs: Option<mpsc::Sender<Job>>,
    runner: Option<JoinHandle<()>>,
    pending: Pending,
    /// The phase last kept (its stamps on the wall clock).
    kept: Phase,
    next_id: u64,
    /// Jobs handed to the runner and not ended.
    in_runner: usize,
    /// Each of those jobs' flag that a later decision undid it.
    undo: HashMap<u64, Arc<AtomicBool>>,
    /// The drains among those jobs, to cut when the power-down comes.
    drains: HashMap<u64, Arc<Cut>>,
    /// A resume kept pending from before the restart, not handed out yet.
    resume_kept: bool,
    /// The job of that resume run again at the start: its last try.
    last_try: Option<u64>,
    /// A drain that failed, to run again after a wait.
    drain_retry: Option<DrainRetry>,
    /// The reason of the last drain handed out, for its runs again.
    drain_reason: String,
    /// Where the wait's end comes back to the loop (the runner's channel).
    done_tx: mpsc::Sender<StepDone>,
}

/// Starts the runner; returns the steps' state and where outcomes come
/// back.
pub(crate) fn start_runner() -> (Steps, mpsc::Receiver<StepDone>) {
    let (jobs_tx, mut jobs_rx) = mpsc::channel::<Job>(QUEUE);
    let (done_tx, done_rx) = mpsc::channel(QUEUE * 4);
    let retries = done_tx.clone();
    let runner = tokio::spawn(async move {
        while let Some(mut job) = jobs_rx.recv().await {
            if let Some(kept) = job.kept.take() {
                wait_kept(job.step, kept).await;
            }
            let mut ok = true;
            for (i, argv) in job.argvs.iter().enumerate() {
                let undone = job.undone.load(Ordering::Relaxed);
                let outcome = match undone {
                    true => None,
                    false => Some(run_unless_cut(&job, argv).await),
                };
                ok &= outcome.as_ref().is_some_and(|o| o.ok);
                let cut = job.cut.is_cut();
                let last = undone || cut || i + 1 == job.argvs.len();
                let done = StepDone::Ran(Ran {
                    id: job.id,
                    step: job.step,
                    outcome,
                    ended: last.then_some(ok),
                });
                if done_tx.send(done).await.is_err() {
                    return;
                }
                if undone || cut {
                    break;
                }
            }
        }
    });
    let steps = Steps {
        jobs: Some(jobs_tx),
        runner: Some(runner),
        pending: Pending::default(),
        kept: Phase::Cooled,
        next_id: 0,
        in_runner: 0,
        undo: HashMap::new(),
        drains: HashMap::new(),
        resume_kept: false,
        last_try: None,
        drain_retry: None,
        drain_reason: String::new(),
        done_tx: retries,
    };
    (steps, done_rx)
}

impl Steps {
    /// At a stop: no more jobs; those queued still run. Returns the
    /// runner, to wait for (a power-down the node holds stays pending in
    /// flash).
    pub(super) fn close(&mut self) -> Option<JoinHandle<()>> {
        self.jobs = None;
        self.runner.take()
    }

    /// Whether the agent is stopping (no more jobs are taken).
    pub(super) fn stopping(&self) -> bool {
        self.jobs.is_none()
    }

    /// Jobs handed to the runner and not ended.
    pub(super) fn in_runner(&self) -> usize {
        self.in_runner
    }
}

/// The commands of `step`.
fn commands(c: &CoolingLossActions, step: CoolingStep) -> &[Vec<String>] {
    match step {
        CoolingStep::Drain => &c.drain,
        CoolingStep::PowerDown => &c.power_down,
        CoolingStep::PowerUp => &c.power_up,
        CoolingStep::Resume => &c.resume,
    }
}

/// The step that undoes `step`.
fn undoing(step: CoolingStep) -> CoolingStep {
    match step {
        CoolingStep::Drain => CoolingStep::Resume,
        CoolingStep::Resume => CoolingStep::Drain,
        CoolingStep::PowerDown => CoolingStep::PowerUp,
        CoolingStep::PowerUp => CoolingStep::PowerDown,
    }
}

/// Steps handed out and not known done, in order, each with its job's
/// number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Pending(Vec<(u64, CoolingStep)>);

impl Pending {
    /// `step` was decided: the same step or the one it undoes, still
    /// pending, is pending no more (the new decision stands for both).
    /// Gives their jobs' numbers.
    fn supersede(&mut self, step: CoolingStep) -> Vec<u64> {
        let gone = self
            .0
            .iter()
            .filter(|&&(_, s)| s == step || s == undoing(step));
        let ids = gone.map(|&(id, _)| id).collect();
        self.0.retain(|&(_, s)| s != step && s != undoing(step));
        ids
    }

    /// Job `id` of `step` is handed out.
    fn push(&mut self, id: u64, step: CoolingStep) {
        self.0.push((id, step));
    }

    /// Job `id` ended (`ok`: every command well): done and no more
    /// pending, or still pending; whether that changed anything.
    fn ended(&mut self, id: u64, ok: bool) -> bool {
        let before = self.0.len();
        if ok {
            self.0.retain(|&(i, _)| i != id);
        }
        self.0.len() != before
    }

    /// Whether job `id` is pending still (not done, nor undone or decided
    /// again since).
    fn holds(&self, id: u64) -> bool {
        self.0.iter().any(|&(i, _)| i == id)
    }

    /// `step`, kept from before the restart, is dropped unrun.
    fn forget(&mut self, step: CoolingStep) {
        self.0.retain(|&(_, s)| s != step);
    }

    #[cfg(test)]
    fn steps(&self) -> Vec<CoolingStep> {
        self.0.iter().map(|&(_, s)| s).collect()
    }

    /// The steps as kept in flash, job `last_try`'s marked [`AGAIN`].
    fn kept(&self, last_try: Option<u64>) -> Vec<KeptStep> {
        self.0
            .iter()
            .map(|&(id, s)| (s, Some(id) == last_try))
            .collect()
    }
}

fn step_code(step: CoolingStep) -> u8 {
    match step {
        CoolingStep::Drain => 0,
        CoolingStep::PowerDown => 1,
        CoolingStep::PowerUp => 2,
        CoolingStep::Resume => 3,
    }
}

fn step_of(code: u8) -> Option<CoolingStep> {
    Some(match code {
        0 => CoolingStep::Drain,
        1 => CoolingStep::PowerDown,
        2 => CoolingStep::PowerUp,
        3 => CoolingStep::Resume,
        _ => return None,
    })
}

/// A step's byte in flash marked [`AGAIN`]: a resume kept from before a
/// restart, run again at a start (its last try).
const AGAIN: u8 = 0x80;

/// A pending step as kept in flash, and whether it is marked [`AGAIN`].
type KeptStep = (CoolingStep, bool);

/// The phase and the pending steps as kept in flash: a tag, the
/// wall-clock stamp, then one byte per pending step (none in a record
/// kept before steps were), [`AGAIN`] added to a last try's.
fn encode(phase: Phase, pending: &[KeptStep]) -> Vec<u8> {
    let (tag, since) = match phase {
        Phase::Cooled => (0u8, 0u64),
        Phase::Draining { since } => (1, since),
        Phase::PoweredDown { since } => (2, since),
    };
    let mut b = vec![tag];
    b.extend_from_slice(&since.to_le_bytes());
    b.extend(
        pending
            .iter()
            .map(|&(s, again)| step_code(s) | if again { AGAIN } else { 0 }),
    );
    b
}

fn decode(b: &[u8]) -> Option<(Phase, Vec<KeptStep>)> {
    let since = u64::from_le_bytes(b.get(1..9)?.try_into().ok()?);
    let phase = match b.first()? {
        0 => Phase::Cooled,
        1 => Phase::Draining { since },
        2 => Phase::PoweredDown { since },
        _ => return None,
    };
    let pending = b[9..]
        .iter()
        .map(|&c| Some((step_of(c & !AGAIN)?, c & AGAIN != 0)))
        .collect::<Option<_>>()?;
    Some((phase, pending))
}

/// What keeps `phase` and `pending` in flash: the record, then its check.
pub(super) fn phase_items(phase: Phase, pending: &[CoolingStep]) -> Vec<(String, Vec<u8>)> {
    let pending: Vec<KeptStep> = pending.iter().map(|&s| (s, false)).collect();
    kept_items(phase, &pending)
}

/// [`phase_items`] of steps each marked [`AGAIN`] or not.
fn kept_items(phase: Phase, pending: &[KeptStep]) -> Vec<(String, Vec<u8>)> {
    let record = encode(phase, pending);
    let check = check_of(&record);
    vec![
        (PHASE_KEY.to_string(), record),
        (CHECK_KEY.to_string(), check),
    ]
}

/// The phase and the pending steps kept from before a restart: cooled
/// and none when nothing was kept; `None` (the phase unknown, said) when
/// the record cannot be read, or its check does not match it. When none
/// is found in a config store lost since an earlier run (`logged`: the
/// phase the event log says then, [`super::lost_store::logged_phase`]),
/// the phase is the log's, with no step pending (the usual undo runs at
/// the CDU's word), or unknown where the log cannot tell: never cooled
/// on the store's silence alone (a host powered down then would never be
/// powered up), never unknown where the log says cooled (the CDU's word
/// would resume the host, lifting an operator's drain).
pub(super) async fn restore(
    store: &mut ConfigStore<Flash>,
    logged: Option<Result<Phase, String>>,
) -> Option<(Phase, Vec<CoolingStep>)> {
    let kept = match (read_kept(store).await, logged) {
        (Ok(None), Some(Ok(phase))) => {
            tracing::warn!(
                "cooling-loss phase: {}; taken from the cooling actions in the event log: {phase}",
                super::startup::STORE_LOST
            );
            Ok(Some((phase, Vec::new())))
        }
        (Ok(None), Some(Err(why))) => Err(format!(
            "{}, and the event log cannot tell it: {why}",
            super::startup::STORE_LOST
        )),
        (other, _) => other,
    };
    let (phase, pending) = match kept {
        Ok(Some(kept)) => kept,
        Ok(None) => (Phase::Cooled, Vec::new()),
        Err(why) => {
            tracing::error!(
                "cooling-loss phase in flash unreadable ({why}): taken as unknown: nothing is \
                 run until the CDU's first word on the rack (none, however long); if it says \
                 the rack lost cooling, the host drains then and powers down after the grace; \
                 if it says cooling is there, the host is powered up and resumed"
            );
            return None;
        }
    };
    if phase != Phase::Cooled {
        tracing::warn!("a cooling loss from before the restart: {phase}; waiting for the CDU");
    }
    Some((phase, drop_last_tries(store, phase, pending)))
}

/// What the resume says when its last try did not end well: where the
/// node may be, and what to do.
const RESUME_BY_HAND: &str = "the node may be in service already (a scheduler refuses to \
     resume a node that is not drained, and an operator may have resumed it by hand); check \
     its state in the scheduler (`sinfo -R`, `kubectl get node`) and resume it by hand if it is \
     still drained for the cooling loss";

/// The steps kept pending, but for a resume kept from before a restart
/// and run again at a start already (marked [`AGAIN`]: the agent was
/// killed while it ran): said and dropped, the record kept without it, so
/// a resume never runs at every start (it would lift a drain an operator
/// made since).
///
/// It blocks for the flash's writes (once, at the start): the store's
/// writes are not futures an agent's task may hold (not `Send`).
fn drop_last_tries(
    store: &mut ConfigStore<Flash>,
    phase: Phase,
    kept: Vec<KeptStep>,
) -> Vec<CoolingStep> {
    let steps: Vec<CoolingStep> = kept.iter().filter(|k| !k.1).map(|k| k.0).collect();
    if steps.len() == kept.len() {
        return steps;
    }
    tracing::error!(
        "cooling-loss resume, kept from before the restart and run again at an earlier start, \
         cut then: not run again; {RESUME_BY_HAND}"
    );
    for (key, value) in phase_items(phase, &steps) {
        if let Err(e) = futures::executor::block_on(store.set(&key, &value)) {
            tracing::error!(
                "{key}: the resume dropped is not kept so ({e:?}): said again at the next start"
            );
        }
    }
    steps
}

/// The phase and the pending steps kept, checked against the check kept
/// after them; `None` when none were kept.
async fn read_kept(
    store: &mut ConfigStore<Flash>,
) -> Result<Option<(Phase, Vec<KeptStep>)>, String> {
    let value = get(store, PHASE_KEY).await?;
    let check = get(store, CHECK_KEY).await?;
    if value.is_some() && check.is_none() {
        tracing::info!("{PHASE_KEY}: kept without its check (an earlier version): read as it is");
    }
    let Some(bytes) = checked(PHASE_KEY, value, check)? else {
        return Ok(None);
    };
    decode(&bytes)
        .map(Some)
        .ok_or_else(|| format!("{PHASE_KEY}: {} bytes that are no phase", bytes.len()))
}

impl Agent {
    /// Keeps `phase` (when given) and hands out `steps` (each with its
    /// reason): the phase and every pending step are kept in one record
    /// before any command starts.
    pub(super) fn keep_and_run_cooling(
        &mut self,
        phase: Option<Phase>,
        steps: Vec<(CoolingStep, String)>,
    ) {
        if let Some(p) = phase {
            self.cooling.kept = p;
        }
        let mut jobs = Vec::new();
        let mut steps: std::collections::VecDeque<_> = steps.into();
        while let Some((step, reason)) = steps.pop_front() {
            if step == CoolingStep::PowerDown && self.cut_drains() {
                // The scheduler still has to hear it (a power-down that
                // only switches the GPUs off leaves the host up for work).
                steps.push_front((CoolingStep::Drain, reason.clone()));
            }
            // A superseded job still waiting in the runner's queue is not
            // run: the new decision stands for it.
            for id in self.cooling.pending.supersede(step) {
                if let Some(undone) = self.cooling.undo.remove(&id) {
                    undone.store(true, Ordering::Relaxed);
                }
            }
            if step == CoolingStep::Drain {
                self.cooling.drain_reason.clone_from(&reason);
            }
            if let Some(job) = self.cooling_job(step, &reason) {
                if step == CoolingStep::Resume {
                    // In flash before the phase the runner waits for.
                    self.undo_quarantines_done();
                }
                // Only the resume takes the mark: a power-up handed out
                // before it in the same record leaves it for the resume.
                if step == CoolingStep::Resume && std::mem::take(&mut self.cooling.resume_kept) {
                    self.cooling.last_try = Some(job.id);
                }
                self.cooling.pending.push(job.id, step);
                jobs.push(job);
            }
        }
        let mut kept = self.keep_cooling();
        // The phase decided by the CDU's word is handed to the flash: a
        // lost mark waiting for it clears after it (not if not handed).
        if kept.is_some() {
            self.phase_kept_after_loss();
        }
        for mut job in jobs {
            // The runner takes jobs in order: the first waits for all.
            job.kept = kept.take();
            self.submit_cooling(job);
        }
    }

    /// The power-down is decided: a drain still in the runner is cut, so
    /// a scheduler that does not answer never holds it back; whether one
    /// was (it runs again after the power-down).
    fn cut_drains(&mut self) -> bool {
        let drains = std::mem::take(&mut self.cooling.drains);
        for cut in drains.values() {
            tracing::warn!(
                "cooling-loss drain cut: the power-down does not wait for it (it runs again after it)"
            );
            cut.cut();
        }
        !drains.is_empty()
    }

    /// Keeps the phase and the pending steps in flash, then their check,
    /// handed over as one (written off the loop, in order with everything
    /// else); the flash's word once both are kept (`None`: not handed to
    /// the flash thread, said).
    fn keep_cooling(&self) -> Option<Kept> {
        let pending = self.cooling.pending.kept(self.cooling.last_try);
        let items = kept_items(self.cooling.kept, &pending);
        self.recorder.set_all_later(items).ok()
    }

    /// The job of a step: its configured commands, expanded; none (said)
    /// when it has no command.
    fn cooling_job(&mut self, step: CoolingStep, reason: &str) -> Option<Job> {
        let rack = self.config.rack.map_or(String::new(), |r| r.to_string());
        let cmds = commands(&self.config.cooling_loss, step);
        if cmds.is_empty() {
            tracing::warn!("rack {rack}: cooling-loss {step}: no command configured");
            return None;
        }
        let cdu = self.config.cdu.as_ref().map_or("", |c| c.as_str());
        let vars: [(&str, &str); 5] = [
            ("{host}", self.config.host.as_str()),
            ("{site}", self.config.site.as_str()),
            ("{cdu}", cdu),
            ("{rack}", &rack),
            ("{reason}", reason),
        ];
        self.cooling.next_id += 1;
        Some(Job {
            id: self.cooling.next_id,
            step,
            argvs: cmds
                .iter()
                .map(|a| actions::expand_with(a, &vars))
                .collect(),
            timeout: self.config.cooling_loss.timeout,
            kept: None,
            undone: Arc::default(),
            cut: Arc::default(),
        })
    }

    /// Hands a job to the runner; one it cannot take (its queue full, or
    /// the agent stopping) is said, published as a failed `cooling_action`
    /// and stays pending in flash, to run at the next start.
    fn submit_cooling(&mut self, job: Job) {
        let (step, n) = (job.step, job.argvs.len());
        let (id, undone, cut) = (job.id, job.undone.clone(), job.cut.clone());
        let refused = match &self.cooling.jobs {
            Some(jobs) => jobs.try_send(job).err().map(|e| e.to_string()),
            None => Some("the agent is stopping".to_string()),
        };
        let rack = self.config.rack.map_or(String::new(), |r| r.to_string());
        if refused.is_none() {
            self.cooling.in_runner += 1;
            self.cooling.undo.insert(id, undone);
            if step == CoolingStep::Drain {
                self.cooling.drains.insert(id, cut);
            }
            tracing::warn!("rack {rack}: cooling-loss {step}: running {n} commands");
        }
        if let Some(why) = refused {
            tracing::error!(
                "rack {rack}: cooling-loss {step} not run now ({why}): it runs at the next start"
            );
            let ev = Event::CoolingAction {
                step,
                ok: false,
                exit_code: None,
            };
            self.recorder.emit(ev, self.clock.wall());
        }
    }

    /// At the start, before the node's: the phase and the steps kept
    /// pending from before the restart, pending still (in flash) until the
    /// node runs each again or drops it (see the module note).
    pub(super) fn resume_cooling(&mut self, phase: Phase, pending: Vec<CoolingStep>) {
        self.cooling.kept = phase;
        self.cooling.resume_kept = pending.contains(&CoolingStep::Resume);
        for step in pending {
            self.cooling.next_id += 1;
            self.cooling.pending.push(self.cooling.next_id, step);
        }
    }

    /// The node dropped `step`, kept pending from before the restart: it
    /// is not run, and the record is kept without it.
    pub(super) fn drop_cooling(&mut self, step: CoolingStep) {
        self.cooling.pending.forget(step);
        self.keep_cooling();
    }

    /// A cooling-loss command ended: logged, the step's state kept in
    /// flash once it ended, and the outcome published.
    pub(super) async fn on_cooling_action(&mut self, done: StepDone) {
        let Ran {
            id,
            step,
            outcome,
            ended,
        } = match done {
            StepDone::Ran(ran) => ran,
            StepDone::RetryDue { id, due } => return self.on_drain_retry_due(id, due),
        };
        if ended.is_some() {
            self.cooling.in_runner = self.cooling.in_runner.saturating_sub(1);
            self.cooling.undo.remove(&id);
            self.cooling.drains.remove(&id);
        }
        let Some(o) = outcome else {
            tracing::warn!(
                "cooling-loss {step}: not run: a later decision undid it while it waited for the runner"
            );
            return;
        };
        if o.ok {
            tracing::info!("cooling-loss {step}: {} done", o.program);
        } else {
            tracing::error!("cooling-loss {step}: {} failed: {}", o.program, o.detail);
        }
        self.count_action(ActionKind::CoolingLoss, &format!("cooling-loss {step}"), &o);
        if let Some(ok) = ended {
            self.step_ended(id, step, ok);
        }
        let ev = Event::CoolingAction {
            step,
            ok: o.ok,
            exit_code: o.exit_code,
        };
        let now: TimestampMs = self.clock.wall();
        self.emit(ev, now).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CoolingStep::*;

    /// A command's word from the runner.
    fn ran(done: StepDone) -> Ran {
        match done {
            StepDone::Ran(ran) => ran,
            other => panic!("not from the runner: {other:?}"),
        }
    }

    #[tokio::test]
    async fn the_runner_runs_a_step_once_its_record_is_kept_or_said_lost() {
        let (steps, mut done) = start_runner();
        let dir = tempfile::tempdir().expect("a temp dir");
        let job = |id: u64, kept: Kept| Job {
            id,
            step: Drain,
            argvs: vec![vec![
                "touch".into(),
                dir.path().join(format!("ran-{id}")).display().to_string(),
            ]],
            timeout: Duration::from_secs(10),
            kept: Some(kept),
            undone: Arc::default(),
            cut: Arc::default(),
        };
        let (tell, kept) = tokio::sync::oneshot::channel();
        let jobs = steps.jobs.as_ref().expect("the runner's queue");
        jobs.try_send(job(1, kept)).expect("queued");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !dir.path().join("ran-1").exists(),
            "ran before its record was kept"
        );
        tell.send(Ok(())).expect("the runner waits");
        let d = ran(done.recv().await.expect("an outcome"));
        assert!(d.outcome.is_some_and(|o| o.ok) && dir.path().join("ran-1").exists());
        // A record the flash refused: the step runs all the same.
        let (tell, kept) = tokio::sync::oneshot::channel();
        jobs.try_send(job(2, kept)).expect("queued");
        tell.send(Err("flash full".into()))
            .expect("the runner waits");
        let d = ran(done.recv().await.expect("an outcome"));
        assert!(d.outcome.is_some_and(|o| o.ok) && dir.path().join("ran-2").exists());
    }

    #[tokio::test]
    async fn a_step_undone_while_it_waits_behind_another_is_not_run() {
        // A drain that hangs, a power-down queued behind it, and cooling
        // back before the drain ends: the power-down must not run.
        let (steps, mut done) = start_runner();
        let dir = tempfile::tempdir().expect("a temp dir");
        let off = dir.path().join("powered-off");
        let job = |id: u64, step: CoolingStep, argv: Vec<String>| Job {
            id,
            step,
            argvs: vec![argv],
            timeout: Duration::from_secs(10),
            kept: None,
            undone: Arc::default(),
            cut: Arc::default(),
        };
        let hangs = job(1, Drain, vec!["sleep".into(), "1".into()]);
        let power_down = job(
            2,
            PowerDown,
            vec!["touch".into(), off.display().to_string()],
        );
        let undone = power_down.undone.clone();
        let jobs = steps.jobs.as_ref().expect("the runner's queue");
        jobs.try_send(hangs).expect("queued");
        jobs.try_send(power_down).expect("queued");
        undone.store(true, Ordering::Relaxed);
        let d = ran(done.recv().await.expect("the drain's outcome"));
        assert!(d.outcome.is_some_and(|o| o.ok));
        let d = ran(done.recv().await.expect("the power-down's word"));
        assert_eq!((d.id, d.step, d.ended), (2, PowerDown, Some(false)));
        assert!(d.outcome.is_none(), "not run");
        assert!(!off.exists(), "the host was not powered off");
    }

    #[tokio::test]
    async fn a_drain_cut_for_the_power_down_holds_it_back_no_longer() {
        // A drain whose scheduler hangs (10 s), then the power-down
        // decided: the drain is cut, the power-down runs at once.
        let (steps, mut done) = start_runner();
        let dir = tempfile::tempdir().expect("a temp dir");
        let off = dir.path().join("powered-off");
        let job = |id: u64, step: CoolingStep, argvs: Vec<Vec<String>>| Job {
            id,
            step,
            argvs,
            timeout: Duration::from_secs(30),
            kept: None,
            undone: Arc::default(),
            cut: Arc::default(),
        };
        let sleep = vec!["sleep".to_string(), "10".to_string()];
        let drain = job(1, Drain, vec![sleep.clone(), sleep]);
        let touch = vec!["touch".into(), off.display().to_string()];
        let power_down = job(2, PowerDown, vec![touch]);
        let cut = drain.cut.clone();
        let jobs = steps.jobs.as_ref().expect("the runner's queue");
        jobs.try_send(drain).expect("queued");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let began = std::time::Instant::now();
        cut.cut();
        jobs.try_send(power_down).expect("queued");
        let d = ran(done.recv().await.expect("the drain's word"));
        assert_eq!(
            (d.id, d.ended),
            (1, Some(false)),
            "its second command not run"
        );
        let o = d.outcome.expect("its first command, cut");
        assert!(!o.ok && o.detail.starts_with("cut"), "{o:?}");
        let d = ran(done.recv().await.expect("the power-down's outcome"));
        assert!(d.outcome.is_some_and(|o| o.ok) && off.exists());
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "{:?}",
            began.elapsed()
        );
    }

    /// The start's restore, on a runtime as the agent's (it blocks for
    /// its own flash writes, which a futures executor would refuse).
    fn restored(store: &mut ConfigStore<Flash>) -> Option<(Phase, Vec<CoolingStep>)> {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(restore(store, None))
    }

    fn keep(store: &mut ConfigStore<Flash>, phase: Phase, pending: &[CoolingStep]) {
        for (key, value) in phase_items(phase, pending) {
            futures::executor::block_on(store.set(&key, &value)).unwrap();
        }
    }

    /// The phase unknown: neither cooled as read nor a loss, for the
    /// CDU's first word to decide.
    fn unknown() -> Option<(Phase, Vec<CoolingStep>)> {
        None
    }

    /// A record kept, with its check or without (an earlier version's),
    /// reads as it was; one that is no phase is unknown, never cooled.
    #[test]
    fn an_undecodable_phase_is_unknown_not_cooled() {
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        assert_eq!(
            restored(&mut store),
            Some((Phase::Cooled, vec![])),
            "none kept"
        );
        let draining = Phase::Draining { since: 1_000 };
        keep(&mut store, draining, &[Drain]);
        assert_eq!(restored(&mut store), Some((draining, vec![Drain])));
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        let old = encode(draining, &[]);
        futures::executor::block_on(store.set(PHASE_KEY, &old)).unwrap();
        assert_eq!(restored(&mut store), Some((draining, vec![])), "no check");
        for junk in [vec![7u8; 9], vec![1, 2], vec![1, 0, 0, 0, 0, 0, 0, 0, 0, 9]] {
            let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
            futures::executor::block_on(store.set(PHASE_KEY, &junk)).unwrap();
            assert_eq!(restored(&mut store), unknown(), "{junk:?} without a check");
            futures::executor::block_on(store.set(CHECK_KEY, &check_of(&junk))).unwrap();
            assert_eq!(restored(&mut store), unknown(), "{junk:?} with its check");
        }
    }

    /// Kept draining, then powered down; the newest copy damaged: the
    /// store reads the older (draining), which the check does not match:
    /// unknown, neither the older phase nor cooled.
    #[test]
    fn a_damaged_newest_phase_is_not_read_as_the_older() {
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        keep(&mut store, Phase::Draining { since: 1_000 }, &[Drain]);
        let down = Phase::PoweredDown { since: 31_000 };
        keep(&mut store, down, &[PowerDown]);
        assert_eq!(restored(&mut store), Some((down, vec![PowerDown])));
        let mut store = super::super::damage_newest(store, &encode(down, &[(PowerDown, false)]));
        assert_eq!(restored(&mut store), unknown());
        // Lost altogether, its check kept: unknown too.
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        let check = check_of(&encode(down, &[]));
        futures::executor::block_on(store.set(CHECK_KEY, &check)).unwrap();
        assert_eq!(restored(&mut store), unknown());
    }

    /// A resume kept as run again at a start already (the agent was
    /// killed while it ran then) is not given back: dropped, and the
    /// record kept without it, so it never runs at every start.
    #[test]
    fn a_resume_run_again_at_a_start_already_is_dropped_at_the_next() {
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        let cooled = Phase::Cooled;
        for (key, value) in kept_items(cooled, &[(Drain, false), (Resume, true)]) {
            futures::executor::block_on(store.set(&key, &value)).unwrap();
        }
        assert_eq!(restored(&mut store), Some((cooled, vec![Drain])));
        let kept = futures::executor::block_on(read_kept(&mut store));
        assert_eq!(kept, Ok(Some((cooled, vec![(Drain, false)]))));
        // Not marked: given back, to run again (its last try).
        keep(&mut store, cooled, &[Resume]);
        assert_eq!(restored(&mut store), Some((cooled, vec![Resume])));
    }

    #[test]
    fn phases_and_pending_steps_round_trip_through_flash_bytes() {
        for p in [
            Phase::Cooled,
            Phase::Draining {
                since: 1_764_000_000_123,
            },
            Phase::PoweredDown { since: 7 },
        ] {
            assert_eq!(decode(&encode(p, &[])), Some((p, vec![])));
            let steps = [Drain, PowerDown, PowerUp, Resume].map(|s| (s, false));
            assert_eq!(decode(&encode(p, &steps)), Some((p, steps.to_vec())));
            let again = [(Drain, false), (Resume, true)];
            assert_eq!(encode(p, &again)[9..], [0, 0x83]);
            assert_eq!(decode(&encode(p, &again)), Some((p, again.to_vec())));
        }
        assert_eq!(decode(&[9, 0, 0, 0, 0, 0, 0, 0, 0]), None);
        assert_eq!(decode(&[1, 2]), None);
        assert_eq!(decode(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 4]), None, "no step 4");
    }

    #[test]
    fn a_step_is_pending_until_it_ended_well_or_is_undone() {
        let mut p = Pending::default();
        p.push(1, Drain);
        p.push(2, PowerDown);
        assert!(!p.ended(1, false), "failed: still pending");
        assert!(p.ended(2, true));
        assert_eq!(p.steps(), [Drain]);
        // Cooling is back: the resume undoes the failed drain.
        assert_eq!(p.supersede(Resume), [1], "the drain's job");
        p.push(3, Resume);
        assert_eq!(p.steps(), [Resume]);
        // Lost again before the resume ran: the new drain stands alone.
        p.supersede(Drain);
        p.push(4, Drain);
        assert_eq!(p.steps(), [Drain]);
        assert!(
            !p.ended(3, true),
            "the undone resume ended: nothing left of it"
        );
        p.supersede(PowerUp);
        p.push(5, PowerDown);
        p.supersede(PowerUp);
        assert_eq!(p.steps(), [Drain], "a power-up undoes a power-down");
        p.forget(Drain);
        assert_eq!(p.steps(), []);
    }
}
