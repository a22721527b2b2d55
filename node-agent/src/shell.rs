//! The running agent: the thin shell around the pure cores.
//!
//! One task owns everything that changes (the command core, the limits
//! applied, the last samples, the flash stores) and waits on six things:
//! the sampling tick, a frame from the bus, an XID (or the XID watch going
//! down or up) from the driver, a finished quarantine action, a finished
//! cooling-loss step, and the next lease expiry (and, to stop, the
//! shutdown); after each it publishes a snapshot for the console. The GPUs are reached only
//! through their [`Worker`]s, so a hung GPU costs one deadline, never the
//! loop (a GPU that answers from memory, which cannot hang, is called on
//! the loop itself and timed against the same deadline).
//!
//! What it guarantees:
//! - every limit it reports (ack `in_force`, `caps_applied`) is the value
//!   read back from the GPU after setting it;
//! - a lease it accepted is logged to flash before it is acknowledged, so
//!   after a crash the leases still valid are applied again and those that
//!   expired meanwhile are not;
//! - at a clean exit it sets every GPU whose limit it changed back to its
//!   default limit.
//!
//! Where it lives:
//! - `startup`: the GPUs, the flash stores, what is kept from before a
//!   restart, the bus;
//! - `sampling`: the loop and the sampling round;
//! - `limits`: setting and reading back power limits;
//! - `commands`: frames from the bus (leases, releases, the cooling
//!   context) and their acks;
//! - `quarantine`: XIDs, the health engine's decisions and the quarantine
//!   actions;
//! - `publishing`: telemetry, health, events and acks on the bus;
//! - `snapshot`: what the console is given after every step.
//!
//! Glossary:
//! - *reconcile*: set every GPU whose applied limit differs from its
//!   target, then read it back.
//! - *jitter*: how late a sampling tick ran against its schedule.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use loopwarden_bus::Bus;
use loopwarden_protocol::{CapSource, GpuIndex, TimestampMs, Topic, Watts};
use tokio::sync::{mpsc, watch};

use crate::actions;
use crate::caps::GpuRange;
use crate::clock::{Clock, Steady, SystemClock};
use crate::commands::CommandCore;
use crate::config::Config;
use crate::console::{self, Context, Snapshot, Timing};
use crate::cooling_loss::CoolingLoss;
use crate::gpu::{GpuError, GpuInfo, GpuSample, GpuSource};
use crate::guard::ThermalGuard;
use crate::health::HealthEngine;
use crate::worker::Worker;
use loopwarden_store::agent_flash::{self, SeqFloor, Stores};
use loopwarden_store::recorder::Recorder;

mod commands;
mod cooling;
mod limits;
mod publishing;
mod quarantine;
mod sampling;
pub use sampling::observation;
mod snapshot;
mod startup;

/// Frame sequence numbers reserved in flash at a time.
/// Ticks kept for the jitter percentiles (10 minutes at 1 s).
const JITTER_WINDOW: usize = 600;
/// Quarantine-action outcomes waiting for the loop (a sender waits for
/// room: an outcome is never dropped).
const ACTION_OUTCOMES: usize = 64;
/// XIDs kept per GPU for `why`.
const RECENT_XIDS: usize = 8;
/// Every this many samples the retained health is published again.
const HEALTH_EVERY: u64 = 60;
/// How long a limit that could not be set waits before the next try, ms.
const RETRY_MS: u64 = 30_000;
/// Every this many samples the limits are read back again, so a limit
/// changed behind the agent's back (`nvidia-smi -pl`) is put right.
const REREAD_EVERY: u64 = 60;

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
    /// The metrics address (`metrics_listen`) could not be bound.
    #[error("{0}")]
    Metrics(loopwarden_bus::prometheus::BindError),
}

/// What the agent knows of one GPU.
pub(crate) struct GpuState {
    pub info: GpuInfo,
    pub range: GpuRange,
    pub last: Option<GpuSample>,
    pub responsive: bool,
    pub missed: u32,
    pub unresponsive_reported: bool,
    pub last_error: Option<String>,
    /// The limit read back after our last set (or at start).
    pub applied: Option<Watts>,
    pub source: Option<CapSource>,
    /// Whether we changed its limit (restored at exit).
    pub changed: bool,
    /// A target that could not be set, and when to try it again (steady
    /// ms).
    pub retry: Option<(Watts, u64)>,
    pub guard: ThermalGuard,
    pub xids: VecDeque<(TimestampMs, u16)>,
}

/// The state the loop owns.
pub(crate) struct Agent {
    pub config: Config,
    pub bus: Bus,
    pub workers: Vec<Arc<Worker>>,
    pub gpus: Vec<GpuState>,
    pub core: CommandCore,
    /// Writes the flash (event log, config store) off the loop.
    pub recorder: Recorder,
    pub seq_floor: SeqFloor,
    pub timing: Timing,
    pub last_json: Option<Instant>,
    /// Connections seen; a new one gets the retained health again (a
    /// broker restarted without persistence has lost it).

    /// The health engine.
    pub health: HealthEngine,
    /// Where finished quarantine actions report.
    pub actions: mpsc::Sender<(u8, actions::Outcome)>,
    /// Since when the XID watch has been down, if it is.
    pub xid_watch_down: Option<TimestampMs>,
    /// The XID queue's counters.
    pub xid_stats: crate::xid_queue::XidStats,
    /// The CDU state topic this host's cooling context comes from.
    pub coolant_topic: Option<Topic>,
    /// Quarantine actions still running (awaited at a clean stop).
    pub running_actions: Vec<tokio::task::JoinHandle<()>>,
    /// Where the console's snapshot goes after every step.
    pub snapshots: watch::Sender<Option<Snapshot>>,
    /// The wall clock for stamps, steady time for the health engine.
    pub clock: Steady,
    /// The cooling-loss decisions.
    pub cooling: CoolingLoss,
    /// Where cooling-loss steps go to be run, in order.
    pub cooling_jobs: mpsc::Sender<cooling::Job>,
    /// How many XID lines the log takes a second.
    pub xid_log: quarantine::XidLog,
}

/// What a process that runs many agents may ask of each (nothing by
/// default).
#[derive(Default)]
pub struct RunHooks {
    /// Given a handle of the agent's bus once it is started; its counters
    /// stay readable after the agent stops.
    pub bus: Option<tokio::sync::oneshot::Sender<Bus>>,
    /// Where the loop publishes its snapshot after every step (the
    /// console reads a receiver of it), so the caller can watch the loop
    /// too: `node-agent run`'s watchdog counts its sampling rounds. `None`:
    /// a channel of its own.
    pub snapshots: Option<watch::Sender<Option<Snapshot>>>,
}

/// Runs the agent until `shutdown` completes, then restores the default
/// limits it changed and leaves the bus cleanly.
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
    let (workers, gpus) = startup::gpus(&config, &mut source).await?;
    let mut xid_rx = startup::watch_xids(&mut source)?;
    // Flash: the event log, the outbox, the config store.
    let Stores {
        mut store,
        mut log,
        outbox,
        first_seq,
        path: flash_path,
    } = agent_flash::open(config.flash.as_deref()).map_err(AgentError::Flash)?;
    // Leases that were in force before a restart, if still valid.
    let core = startup::restore_leases(&config, &gpus, &mut log).await?;
    let health = startup::restore_health(&config, gpus.len(), &mut store, started).await;
    let mut cooling_loss = CoolingLoss::new(config.cooling_loss.grace.as_millis() as u64);
    cooling_loss.restore(cooling::restore(&mut store).await);
    let startup::BusParts {
        bus,
        mut inbound,
        task: bus_task,
        coolant_topic,
        embedded: _embedded,
    } = startup::start_bus(&config, first_seq, outbox, gpus.len())?;
    if let Some(tx) = hooks.bus {
        let _ = tx.send(bus.clone());
    }

    // The console.
    let console_path = config.console.clone();
    let listener = console::bind(&console_path).map_err(|source| AgentError::Console {
        path: console_path.display().to_string(),
        source,
    })?;
    let (actions_tx, mut actions_rx) = mpsc::channel(ACTION_OUTCOMES);
    let (cooling_jobs, mut cooling_rx) = cooling::start_runner();
    let recorder = Recorder::start_on(log, store, flash_path.as_deref(), bus.clone())
        .map_err(AgentError::Thread)?;
    let (snapshots, snapshot_rx) = match hooks.snapshots {
        Some(tx) => {
            let rx = tx.subscribe();
            (tx, rx)
        }
        None => console::snapshot_channel(),
    };
    let flash_path = flash_path.map(|p| p.display().to_string());
    let context = console_context(&config, started, flash_path, &bus, &recorder, snapshot_rx);
    let readers = Readers::start(listener, console_path, &config, context).await?;
    let mut agent = Agent {
        health,
        actions: actions_tx,
        xid_watch_down: None,
        xid_stats: xid_rx.stats_reader(),
        coolant_topic,
        running_actions: Vec::new(),
        config,
        bus,
        workers,
        gpus,
        core,
        recorder,
        seq_floor: SeqFloor::new(first_seq),
        timing: Timing::default(),
        last_json: None,
        snapshots,
        clock,
        cooling: cooling_loss,
        cooling_jobs,
        xid_log: Default::default(),
    };

    // Start from what the GPUs have now, then put the targets in force.
    agent.read_applied().await;
    agent.reconcile(agent.clock.wall(), false).await;
    agent.publish_snapshot();

    agent
        .run_loop(
            &mut inbound,
            &mut actions_rx,
            &mut cooling_rx,
            &mut xid_rx,
            shutdown,
        )
        .await;

    agent.stop(&mut actions_rx, readers, bus_task).await;
    Ok(())
}

impl Agent {
    /// The clean stop: the running actions end, the default limits are
    /// restored, everything decided is written and handed to the bus,
    /// then the readers stop and the agent leaves the bus.
    async fn stop(
        &mut self,
        actions_rx: &mut mpsc::Receiver<(u8, actions::Outcome)>,
        readers: Readers,
        bus_task: loopwarden_bus::BusTask,
    ) {
        self.finish_actions(actions_rx).await;
        tracing::info!("stopping: restoring default power limits");
        self.restore_defaults().await;
        self.recorder.flush().await;
        readers.stop();
        if let Err(e) = self.bus.shutdown(Duration::from_secs(3)).await {
            tracing::warn!("leaving the bus: {e}");
        }
        bus_task.join(Duration::from_secs(3)).await;
    }
}

/// What the console, the serial console and `/metrics` answer from.
fn console_context(
    config: &Config,
    started: TimestampMs,
    flash_path: Option<String>,
    bus: &Bus,
    recorder: &Recorder,
    snapshot: watch::Receiver<Option<Snapshot>>,
) -> Context {
    Context {
        site: config.site.as_str().to_string(),
        host: config.host.as_str().to_string(),
        gpu_source: config.gpus.clone(),
        period: config.period,
        started,
        flash_path,
        demo_key: config.demo_key,
        bus: bus.clone(),
        recorder: recorder.clone(),
        snapshot,
    }
}

/// What answers people while the agent runs, from what the loop
/// publishes: the console socket, the serial console and Prometheus's
/// `/metrics` (each only read; the loop is never asked).
struct Readers {
    console_path: std::path::PathBuf,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Readers {
    /// Serves the console on `listener` (bound at `console_path`), and the
    /// metrics listener and serial console when `config` asks for them.
    async fn start(
        listener: tokio::net::UnixListener,
        console_path: std::path::PathBuf,
        config: &Config,
        context: Context,
    ) -> Result<Readers, AgentError> {
        let metrics = crate::metrics::start(config.metrics_listen, context.clone())
            .await
            .map_err(AgentError::Metrics)?;
        let serial = console::start_serial(config.serial.clone(), context.clone());
        let console = tokio::spawn(console::serve(listener, context));
        let tasks = [Some(console), serial, metrics]
            .into_iter()
            .flatten()
            .collect();
        Ok(Readers {
            console_path,
            tasks,
        })
    }

    /// Stops them and removes the console socket.
    fn stop(self) {
        for t in &self.tasks {
            t.abort();
        }
        let _ = std::fs::remove_file(&self.console_path);
    }
}

/// The config-store key of a GPU's health.
fn health_key(gpu: usize) -> String {
    format!("health.{gpu}")
}

impl Agent {
    fn gpu_index(i: usize) -> GpuIndex {
        GpuIndex::new(i as u8).expect("at most 16 GPUs")
    }

    /// Steady time for the decisions. The health engine (for its stamps)
    /// and the command core (to turn a lease's end into steady time) are
    /// told the wall clock's offset from it.
    fn engine_now(&mut self) -> TimestampMs {
        let (steady, offset) = self.clock.read();
        self.health.set_wall_offset(offset);
        self.core.set_wall_offset(offset);
        steady
    }
}
