//! The running agent: the thin shell around the node's step.
//!
//! Every decision (health, commands, the thermal guard, caps, the cooling
//! loss) is [`node_core::node::Node`]'s. The shell samples the GPUs, hears
//! the bus and the driver, gives each to the node with the time, and
//! carries out what the node returns (`effects`): a limit set and read
//! back, a publish, a line in the log, a record in flash, an action
//! started. One task owns it all and waits on six things: the sampling
//! tick, a frame from the bus, an XID (or the XID watch going down or up)
//! from the driver, a finished quarantine action, a finished cooling-loss
//! step, and the next lease expiry (and, to stop, the shutdown); after
//! each it publishes a snapshot for the console. The GPUs are reached only
//! through their [`Worker`]s, so a hung GPU costs one deadline, never the
//! loop (a GPU that answers from memory, which cannot hang, is called on
//! the loop itself and timed against the same deadline).
//!
//! What it guarantees, with the node:
//! - every limit it reports (ack `in_force`, `caps_applied`) is the value
//!   read back from the GPU after setting it;
//! - a lease it accepted is logged to flash before it is acknowledged, so
//!   after a crash the leases still valid are applied again and those that
//!   expired meanwhile are not;
//! - at a clean exit with no lease in force it sets every GPU back to its
//!   ceiling (the limit the site left on it); with a lease, the caps stay
//!   for the next start;
//! - a quarantine's actions and a cooling-loss step run at least once: one
//!   decided before a crash and not known to have ended well runs again
//!   after the restart, and a clean stop waits for those running (at most
//!   `STOP_WAIT`).
//!
//! Where it lives:
//! - `startup`: the GPUs, the flash stores, the node with what is kept
//!   from before a restart, the bus;
//! - `sampling`: the loop and the sampling round;
//! - `effects`: the node's effects carried out, its answers given back;
//! - `limits`: setting and reading back power limits;
//! - `commands`: frames from the bus, to the node;
//! - `quarantine`: XIDs, the health kept in flash and the quarantine
//!   actions;
//! - `cooling`: the cooling-loss steps' commands and the phase in flash;
//! - `stop`: the clean stop's wait for the running actions;
//! - `publishing`: telemetry, health, events and acks on the bus;
//! - `snapshot`: what the console is given after every step.
//!
//! Glossary:
//! - *effect*: what the node decided for the shell to do.
//! - *jitter*: how late a sampling tick ran against its schedule.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use loopwarden_bus::resend::Resender;
use loopwarden_bus::Bus;
use loopwarden_field::lifecycle::Readers;
use loopwarden_protocol::{GpuIndex, TimestampMs};
use tokio::sync::{mpsc, watch};

use crate::clock::{Clock, Steady, SystemClock};
use crate::config::Config;
use crate::console::{self, Context, Snapshot, Timing};
use crate::gpu::{GpuError, GpuInfo, GpuSample, GpuSource};
use crate::worker::Worker;
use loopwarden_store::agent_flash::{self, SeqFloor, Stores};
use loopwarden_store::check::fnv1a;
use loopwarden_store::recorder::Recorder;
use node_core::caps::GpuRange;
use node_core::node::{Input, Node, Now};

mod commands;
mod cooling;
mod effects;
mod identify;
mod limits;
mod lost_store;
mod publishing;
mod quarantine;
mod replay_floor;
mod sampling;
pub use sampling::observation;
mod snapshot;
mod startup;
mod stop;
#[cfg(test)]
mod test_agent;

/// Ticks kept for the jitter percentiles (10 minutes at 1 s).
const JITTER_WINDOW: usize = 600;
/// Quarantine-action outcomes waiting for the loop (a sender waits for
/// room: an outcome is never dropped).
const ACTION_OUTCOMES: usize = 64;
/// XIDs kept per GPU for `why`.
const RECENT_XIDS: usize = 8;

/// Why the agent could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The GPUs could not be listed.
    #[error("GPUs: {0}")]
    Gpus(GpuError),
    /// No GPU found.
    #[error("no GPU found")]
    NoGpus,
    /// The flash file or its stores.
    #[error("flash: {0}")]
    Flash(String),
    /// The broker.
    #[error("broker: {0}")]
    Broker(String),
    /// The console socket.
    #[error("console socket {path}: {source}")]
    Console {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A thread could not be started.
    #[error("thread: {0}")]
    Thread(std::io::Error),
    /// The signals could not be caught.
    #[error("{0}")]
    Signals(String),
}

/// What the agent shows of one GPU (its decisions are the node's).
pub(crate) struct GpuState {
    pub info: GpuInfo,
    pub range: GpuRange,
    pub last: Option<GpuSample>,
    /// When the agent got `last` (wall ms): a GPU whose call hangs keeps
    /// its last values, which this dates.
    pub sampled_at: Option<TimestampMs>,
    pub responsive: bool,
    pub last_error: Option<String>,
    /// A quarantine action that failed, until its actions end well.
    pub action_failed: Option<String>,
    pub xids: VecDeque<(TimestampMs, u16)>,
}

/// The state the loop owns.
pub(crate) struct Agent {
    pub config: Config,
    pub bus: Bus,
    pub workers: Vec<Arc<Worker>>,
    pub gpus: Vec<GpuState>,
    /// Every decision: health, commands, guard, caps, cooling loss.
    pub node: Node,
    /// Writes the flash (event log, config store) off the loop.
    pub recorder: Recorder,
    pub seq_floor: SeqFloor,
    pub timing: Timing,
    pub last_json: Option<Instant>,
    /// Where finished quarantine actions report.
    pub actions: mpsc::Sender<quarantine::ActionDone>,
    /// The XID queue's counters.
    pub xid_stats: crate::xid_queue::XidStats,
    /// XIDs the queue dropped, as last said in the log.
    pub xids_dropped_said: u64,
    /// Quarantine actions still running (awaited at a clean stop).
    pub running_actions: Vec<tokio::task::JoinHandle<()>>,
    /// The quarantines whose actions run, by GPU and stamp (at most one
    /// in flight per GPU).
    pub quarantine_runs: BTreeMap<(u8, u64), quarantine::Run>,
    /// Where the console's snapshot goes after every step.
    pub snapshots: watch::Sender<Option<Snapshot>>,
    /// The wall clock for stamps, steady time for the decisions.
    pub clock: Steady,
    /// The cooling-loss steps: their runner, and those pending.
    pub cooling: cooling::Steps,
    /// Answers readers' requests to resend logged events.
    pub resender: Resender,
    /// Whether the log said that the limits of a GPU whose UUID is
    /// unknown are not kept.
    pub unkept_limits_said: bool,
    /// The site's commands run, and how they ended.
    pub site_actions: crate::console::SiteActions,
    /// When the GPUs whose UUID is unknown are asked again (steady ms).
    pub identify_at: u64,
    /// The config store's lost mark, to clear once what the lost store
    /// held is kept again (`lost_store`).
    pub lost_mark: Option<lost_store::PendingClear>,
    /// The clear of the lost mark under way off the loop, awaited at a
    /// clean stop before the flash is flushed.
    pub lost_mark_clearing: Option<lost_store::Clearing>,
    /// The stale indexes found at the start: per GPU, those its
    /// quarantine actions ran under before a renumbering (`quarantine`).
    pub stale_indexes: Vec<(u8, Vec<u8>)>,
}

/// What an [`Agent`] starts with; the rest of its state starts empty
/// ([`Agent::new`]).
pub(crate) struct Parts {
    pub config: Config,
    pub bus: Bus,
    pub workers: Vec<Arc<Worker>>,
    pub gpus: Vec<GpuState>,
    pub node: Node,
    pub recorder: Recorder,
    pub resender: Resender,
    pub actions: mpsc::Sender<quarantine::ActionDone>,
    pub xid_stats: crate::xid_queue::XidStats,
    /// The first sequence number the flash gives this run's events.
    pub first_seq: u32,
    pub snapshots: watch::Sender<Option<Snapshot>>,
    pub clock: Steady,
    pub cooling: cooling::Steps,
    pub stale_indexes: Vec<(u8, Vec<u8>)>,
}

impl Agent {
    /// The agent of `parts`, nothing yet done: no action running, no
    /// sampling timed, nothing said, no lost mark to clear.
    pub(crate) fn new(parts: Parts) -> Agent {
        Agent {
            config: parts.config,
            bus: parts.bus,
            workers: parts.workers,
            gpus: parts.gpus,
            node: parts.node,
            recorder: parts.recorder,
            seq_floor: SeqFloor::new(parts.first_seq),
            timing: Timing::default(),
            last_json: None,
            actions: parts.actions,
            xid_stats: parts.xid_stats,
            xids_dropped_said: 0,
            running_actions: Vec::new(),
            quarantine_runs: BTreeMap::new(),
            snapshots: parts.snapshots,
            clock: parts.clock,
            cooling: parts.cooling,
            resender: parts.resender,
            unkept_limits_said: false,
            site_actions: Default::default(),
            identify_at: 0,
            lost_mark: None,
            lost_mark_clearing: None,
            stale_indexes: parts.stale_indexes,
        }
    }
}

/// What a process that runs many agents may ask of each (nothing by
/// default).
#[derive(Default)]
pub struct RunHooks {
    /// Given a handle of the agent's bus once it is started, its console
    /// bound and its recorder running (an agent that fails before gives
    /// none); its counters stay readable after the agent stops.
    pub bus: Option<tokio::sync::oneshot::Sender<Bus>>,
    /// Where the loop publishes its snapshot after every step (the
    /// console reads a receiver of it), so the caller can watch the loop
    /// too: `node-agent run`'s watchdog counts its sampling rounds. `None`:
    /// a channel of its own.
    pub snapshots: Option<watch::Sender<Option<Snapshot>>>,
}

/// Runs the agent until `shutdown` completes, then puts the ceilings back
/// (unless a lease is in force) and leaves the bus cleanly.
pub async fn run(
    config: Config,
    source: Box<dyn GpuSource + Send>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    run_with_clock(config, source, Arc::new(SystemClock::new()), shutdown).await
}

/// As [`run`], with `hooks`.
pub async fn run_hooked(
    config: Config,
    source: Box<dyn GpuSource + Send>,
    hooks: RunHooks,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    run_agent(
        config,
        source,
        Arc::new(SystemClock::new()),
        hooks,
        shutdown,
    )
    .await
}

/// As [`run`], on the clocks given (a test steps the wall clock).
pub async fn run_with_clock(
    config: Config,
    source: Box<dyn GpuSource + Send>,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    run_agent(config, source, clock, RunHooks::default(), shutdown).await
}

async fn run_agent(
    config: Config,
    mut source: Box<dyn GpuSource + Send>,
    clock: Arc<dyn Clock>,
    hooks: RunHooks,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    let clock = Steady::new(clock);
    let started = clock.wall();
    // GPUs first: an agent without GPUs has nothing to do.
    let nvml_costs = source.call_costs();
    let (workers, gpus) = startup::gpus(&config, &mut source).await?;
    let mut xid_rx = startup::watch_xids(&mut source)?;
    // Flash: the event log, the outbox, the config store.
    let Stores {
        mut store,
        mut log,
        outbox,
        first_seq,
        path: flash_path,
        config_lost,
        ..
    } = agent_flash::open(config.flash.as_deref()).map_err(AgentError::Flash)?;
    // The decisions, with what was kept from before a restart.
    let mut node = startup::node(&config, &gpus, started);
    startup::restore_leases(&mut node, &mut log).await?;
    let undone = restore_kept(&mut node, &config, &gpus, &mut store, &mut log, config_lost).await;
    let startup::BusParts {
        bus,
        mut inbound,
        task: bus_task,
        embedded: _embedded,
    } = startup::start_bus(&config, first_seq, outbox, gpus.len())?;

    // The console.
    let (listener, console_path) = bind_console(&config)?;
    let (actions_tx, mut actions_rx) = mpsc::channel(ACTION_OUTCOMES);
    let (cooling, mut cooling_rx) = cooling::start_runner();
    let recorder = Recorder::start_on(log, store, flash_path.as_deref(), bus.clone())
        .map_err(AgentError::Thread)?;
    // The bus goes to whoever waits for it only once the console is bound
    // and the recorder runs: an agent that fails at its start hands none.
    if let Some(tx) = hooks.bus {
        let _ = tx.send(bus.clone());
    }
    let (snapshots, snapshot_rx) = snapshot_channel(hooks.snapshots);
    let resender = Resender::start(
        bus.clone(),
        recorder.clone(),
        config.authority.signers.clone(),
    );
    let flash_path = flash_path.map(|p| p.display().to_string());
    let counted = (&bus, &recorder, &resender);
    let mut context = console_context(&config, started, flash_path, counted, snapshot_rx);
    context.nvml_costs = nvml_costs;
    // Found off on the GPUs, and action programs not found, shown beside
    // the opt-outs written.
    context
        .protection_off
        .extend(startup::persistence_off(&config, &gpus));
    let missing = config.programs_missing.iter().cloned();
    context.protection_off.extend(missing);
    let readers = start_readers(listener, console_path, &config, context);
    let mut agent = Agent::new(Parts {
        config,
        bus,
        workers,
        gpus,
        node,
        recorder,
        resender,
        actions: actions_tx,
        xid_stats: xid_rx.stats_reader(),
        first_seq,
        snapshots,
        clock,
        cooling,
        stale_indexes: undone.stale.clone(),
    });
    agent.keep_taken_back(&undone, config_lost).await;
    // What a crash (or a failure) left undone runs again.
    agent.resume_actions(&undone.quarantines);
    agent.resume_cooling(undone.phase, undone.steps);

    // Start from what the GPUs have now, then put the targets in force.
    agent.step(Input::Start).await;
    agent.publish_snapshot();

    agent
        .run_loop(
            &mut inbound,
            (&mut actions_rx, &mut cooling_rx),
            &mut xid_rx,
            shutdown,
        )
        .await;

    let outcomes = (&mut actions_rx, &mut cooling_rx);
    agent.stop(outcomes, &xid_rx, readers, bus_task).await;
    Ok(())
}

/// The site actions a restart found not done.
struct Undone {
    /// The GPUs kept quarantined whose actions are not known done.
    quarantines: Vec<u8>,
    /// The stale indexes of the GPUs kept quarantined (`quarantine`).
    stale: Vec<(u8, Vec<u8>)>,
    /// The GPUs whose kept health state was unreadable, marked degraded
    /// (or quarantined again from the event log, the config store lost):
    /// their new state is kept, replacing the record that failed.
    unreadable: Vec<u8>,
    /// The GPUs whose kept limits were unreadable (after a loss, those
    /// whose limits record did not survive it).
    limits_unread: Vec<u8>,
    /// The cooling-loss phase kept.
    phase: node_core::cooling_loss::Phase,
    /// The cooling-loss steps kept pending.
    steps: Vec<loopwarden_protocol::CoolingStep>,
}

/// Gives `node` what the config store kept from before a restart (the
/// health states, the limits, the cooling-loss phase, the replay floors);
/// returns the site actions found not done. `log`: the event log, read
/// for each GPU index's last health change; when the store was lost
/// since an earlier run (`config_lost`, [`Stores::config_lost`]) the
/// quarantines and the cooling-loss phase are taken back from it, else
/// it is brought to match the health each GPU starts in
/// ([`lost_store::match_log`]).
async fn restore_kept(
    node: &mut Node,
    config: &Config,
    gpus: &[GpuState],
    store: &mut loopwarden_flash::ConfigStore<loopwarden_store::agent_flash::Flash>,
    log: &mut loopwarden_flash::EventLog<loopwarden_store::agent_flash::Flash>,
    config_lost: bool,
) -> Undone {
    let uuids: Vec<&str> = gpus.iter().map(|g| g.info.uuid.as_str()).collect();
    quarantine::upgrade_kept(store, &uuids);
    let last = lost_store::last_changes(log, gpus.len()).await;
    let (logged, logged_phase) = match config_lost {
        true => (
            Some(
                startup::logged_quarantines_at(log, &last, gpus.len(), config.expected_gpus).await,
            ),
            Some(logged_phase(log, config).await),
        ),
        false => (None, None),
    };
    let unreadable = startup::restore_health(node, &uuids, store, logged.as_deref()).await;
    if !config_lost {
        lost_store::match_log(log, node.health(), &last, &unreadable).await;
    }
    let (quarantines, stale) = quarantine::not_done(store, node.health(), &uuids).await;
    let limits_unread = limits::restore(node, gpus, store, config_lost).await;
    let (phase, steps) = match cooling::restore(store, logged_phase).await {
        Some((phase, steps)) => {
            node.restore_cooling(phase, &steps);
            (phase, steps)
        }
        None => {
            node.restore_cooling_unknown();
            (node_core::cooling_loss::Phase::Cooled, Vec::new())
        }
    };
    replay_floor::restore(node, &replay_floor::signers(config), store).await;
    if let Some(cdu) = &config.cdu {
        replay_floor::restore_state(node, cdu, store).await;
    }
    Undone {
        quarantines,
        stale,
        unreadable,
        limits_unread,
        phase,
        steps,
    }
}

/// The cooling-loss phase the event log `log` says, after the config
/// store was lost ([`lost_store::logged_phase`]). On a host that manages
/// no cooling (no CDU: `cooling = "not_managed"`) no cooling-loss action
/// can run, and no CDU's word would ever decide an unknown phase: where
/// the log cannot tell, the phase is cooled, said.
async fn logged_phase(
    log: &mut loopwarden_flash::EventLog<loopwarden_store::agent_flash::Flash>,
    config: &Config,
) -> Result<node_core::cooling_loss::Phase, String> {
    let logged = lost_store::logged_phase(log, config.cooling_loss.resume.len()).await;
    match logged {
        Err(why) if config.cdu.is_none() => {
            tracing::warn!(
                "the event log cannot tell the cooling-loss phase ({why}); this host manages no cooling (no CDU), so no cooling-loss action can have run: cooled"
            );
            Ok(node_core::cooling_loss::Phase::Cooled)
        }
        other => other,
    }
}

/// Where the outcomes of quarantine actions and cooling-loss commands come
/// back to the loop.
type Outcomes<'a> = (
    &'a mut mpsc::Receiver<quarantine::ActionDone>,
    &'a mut mpsc::Receiver<cooling::StepDone>,
);

impl Agent {
    /// The clean stop: the running actions and cooling-loss steps end
    /// (within [`stop::STOP_WAIT`]) and the XIDs reported meanwhile are
    /// decided, the ceilings are put back unless a lease is in force,
    /// everything decided is written and handed to the bus, then the
    /// readers stop and the agent leaves the bus.
    async fn stop(
        &mut self,
        outcomes: Outcomes<'_>,
        xid_rx: &crate::xid_queue::XidQueue,
        readers: Readers,
        bus_task: loopwarden_bus::BusTask,
    ) {
        self.finish_actions(outcomes, xid_rx).await;
        tracing::info!("stopping");
        self.step(Input::Stop).await;
        self.finish_lost_mark_clear().await;
        self.recorder.flush().await;
        readers.stop();
        if let Err(e) = self.bus.shutdown(Duration::from_secs(3)).await {
            tracing::warn!("leaving the bus: {e}");
        }
        bus_task.join(Duration::from_secs(3)).await;
    }
}

/// The console socket bound at `config.console`, and its path.
fn bind_console(
    config: &Config,
) -> Result<(tokio::net::UnixListener, std::path::PathBuf), AgentError> {
    let path = config.console.clone();
    let listener = console::bind(&path).map_err(|source| AgentError::Console {
        path: path.display().to_string(),
        source,
    })?;
    Ok((listener, path))
}

/// The loop's snapshot channel: the sender `given` (its caller watches
/// the loop too, [`RunHooks::snapshots`]), else one of its own.
fn snapshot_channel(
    given: Option<watch::Sender<Option<Snapshot>>>,
) -> (
    watch::Sender<Option<Snapshot>>,
    watch::Receiver<Option<Snapshot>>,
) {
    match given {
        Some(tx) => {
            let rx = tx.subscribe();
            (tx, rx)
        }
        None => console::snapshot_channel(),
    }
}

/// What the console, the serial console and `/metrics` answer from:
/// `counted`, the bus, the recorder and the resender whose counters they
/// show, besides the loop's `snapshot`.
fn console_context(
    config: &Config,
    started: TimestampMs,
    flash_path: Option<String>,
    counted: (&Bus, &Recorder, &Resender),
    snapshot: watch::Receiver<Option<Snapshot>>,
) -> Context {
    let (bus, recorder, resender) = counted;
    Context {
        site: config.site.as_str().to_string(),
        host: config.host.as_str().to_string(),
        gpu_source: config.gpus.clone(),
        expected_gpus: config.expected_gpus,
        period: config.period,
        started,
        flash_path,
        demo_key: config.demo_key,
        protection_off: config.opt_outs.clone(),
        bus: bus.clone(),
        recorder: recorder.clone(),
        snapshot,
        nvml_costs: None,
        console_stats: Default::default(),
        resender: resender.clone(),
    }
}

/// What answers people while the agent runs, from what the loop
/// publishes: the console socket (bound at `console_path`), and the
/// serial console and Prometheus's `/metrics` when `config` asks for them
/// (each only read; the loop is never asked). A metrics address that
/// cannot be bound is logged and tried again in the background: the agent
/// guards its GPUs without `/metrics` meanwhile.
fn start_readers(
    listener: tokio::net::UnixListener,
    console_path: std::path::PathBuf,
    config: &Config,
    context: Context,
) -> Readers {
    let metrics = crate::metrics::start(config.metrics_listen, context.clone());
    let serial = console::start_serial(config.serial.clone(), context.clone());
    let console = tokio::spawn(console::serve(listener, context, config.console_limits));
    Readers::new(console_path, console, [serial, metrics])
}

/// What a GPU's UUID reads as when its description failed.
pub(crate) const UNKNOWN_UUID: &str = "unknown";

/// A GPU's identity in the keys of its kept records (its health, its
/// quarantine's stamp): the 64-bit FNV-1a hash of its UUID, since a UUID
/// is longer than a config-store key may be. `None` when its UUID is
/// unknown: nothing is kept or restored for it under a guessed identity.
fn identity(uuid: &str) -> Option<u64> {
    (uuid != UNKNOWN_UUID).then(|| fnv1a(&[uuid.as_bytes()]))
}

impl Agent {
    fn gpu_index(i: usize) -> GpuIndex {
        GpuIndex::new(i as u8).expect("at most 16 GPUs")
    }

    /// The time of a step: steady time for the decisions, and the wall
    /// clock's offset from it for stamps.
    fn now(&self) -> Now {
        let (steady, offset) = self.clock.read();
        Now { steady, offset }
    }
}

/// The store over `store`'s memory flash with the last byte of the newest
/// copy of `value` flipped: damaged, as a power cut mid-write leaves it.
#[cfg(test)]
fn damage_newest(
    store: loopwarden_flash::ConfigStore<loopwarden_store::agent_flash::Flash>,
    value: &[u8],
) -> loopwarden_flash::ConfigStore<loopwarden_store::agent_flash::Flash> {
    use loopwarden_store::agent_flash::AgentFlash;
    let flash = store.into_flash();
    flash.with(|f| {
        let AgentFlash::Memory(m) = f else {
            panic!("a memory flash");
        };
        let bytes = m.bytes_mut();
        let at = bytes
            .windows(value.len())
            .rposition(|w| w == value)
            .expect("the record in flash");
        bytes[at + value.len() - 1] ^= 0xff;
    });
    let layout = loopwarden_boards::FlashBoard::host_file().layout().config;
    loopwarden_flash::ConfigStore::open(flash, layout).expect("the store opened again")
}
