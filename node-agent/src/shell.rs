//! The running agent: the thin shell around the pure cores.
//!
//! One task owns everything that changes (the command core, the limits
//! applied, the last samples, the flash stores) and waits on five things:
//! the sampling tick, a command from the bus, an XID from the driver, a
//! console request, and the next lease expiry. The GPUs are reached only
//! through their [`Worker`]s, so a hung GPU costs one deadline, never the
//! loop.
//!
//! What it guarantees:
//! - every limit it reports (ack `in_force`, `cap_applied`) is the value
//!   read back from the GPU after setting it;
//! - a lease it accepted is logged to flash before it is acknowledged, so
//!   after a crash the leases still valid are applied again and those that
//!   expired meanwhile are not;
//! - at a clean exit it sets every GPU whose limit it changed back to its
//!   default limit.
//!
//! Glossary:
//! - *reconcile*: set every GPU whose applied limit differs from its
//!   target, then read it back.
//! - *jitter*: how late a sampling tick ran against its schedule.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use loopwarden_boards::FlashBoard;
use loopwarden_bus::{now_ms, Bus, BusConfig, Inbound};
use loopwarden_flash::{ConfigStore, EventLog, FileFlash, Outbox, SharedFlash, SimFlash};
use loopwarden_protocol::{
    Ack, AckCode, CapSource, CduMode, Correlation, Event, Family, Frame, GpuCap, GpuFlags,
    GpuHealth, GpuIndex, GpuSelector, GpuTelemetry, HealthState, HostHealth, HostTelemetry,
    Message, MessageKind, NodeId, RackCooling, Role, Text, TimestampMs, Topic, Watts,
    MAX_FRAME_LEN,
};
use tokio::sync::{mpsc, oneshot};

use crate::actions;
use crate::caps::GpuRange;
use crate::config::{Config, GpuSourceKind};
use crate::console::{self, Request};
use crate::core::CommandCore;
use crate::gpu::{GpuError, GpuInfo, GpuSample, GpuSource, XidReport};
use crate::guard::ThermalGuard;
use crate::health::{
    Coolant, GpuStatus, HealthEngine, Limits, LoopState, Observation, Output, Policy,
};
use crate::recorder::Recorder;
use crate::store::HostFlash;
use crate::worker::Worker;

/// Frame sequence numbers reserved in flash at a time.
const SEQ_BLOCK: u32 = 10_000;
/// Ticks kept for the jitter percentiles (10 minutes at 1 s).
const JITTER_WINDOW: usize = 600;
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
    /// A target that could not be set, and when to try it again (ms).
    pub retry: Option<(Watts, u64)>,
    pub guard: ThermalGuard,
    pub xids: VecDeque<(TimestampMs, u16)>,
}

/// Timing of the sampling loop, for the console and the benchmarks.
#[derive(Default)]
pub(crate) struct Timing {
    pub samples: u64,
    pub jitter_us: VecDeque<u64>,
    pub last_jitter_us: u64,
    pub max_jitter_us: u64,
    pub last_sample_us: u64,
    pub max_sample_us: u64,
}

impl Timing {
    /// The `p`-th percentile of the jitter window, µs.
    pub fn jitter_percentile(&self, p: f64) -> u64 {
        let mut v: Vec<u64> = self.jitter_us.iter().copied().collect();
        if v.is_empty() {
            return 0;
        }
        v.sort_unstable();
        let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
        v[i.min(v.len() - 1)]
    }
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
    pub seq_floor: u32,
    pub timing: Timing,
    pub started: TimestampMs,
    pub flash_path: Option<String>,
    pub last_json: Option<Instant>,
    /// Connections seen; a new one gets the retained health again (a
    /// broker restarted without persistence has lost it).
    pub connects: u64,
    /// The health engine.
    pub health: HealthEngine,
    /// Where finished quarantine actions report.
    pub actions: mpsc::UnboundedSender<(u8, actions::Outcome)>,
    /// The CDU state topic this host's cooling context comes from.
    pub coolant_topic: Option<Topic>,
    /// Quarantine actions still running (awaited at a clean stop).
    pub running_actions: Vec<tokio::task::JoinHandle<()>>,
}

/// Runs the agent until `shutdown` completes, then restores the default
/// limits it changed and leaves the bus cleanly.
pub async fn run(
    config: Config,
    mut source: Box<dyn GpuSource + Send>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    let started = now_ms();
    // GPUs first: an agent without GPUs has nothing to do.
    let devices = source.devices().map_err(AgentError::Gpus)?;
    if devices.is_empty() {
        return Err(AgentError::NoGpus);
    }
    let mut workers = Vec::new();
    for (i, d) in devices.into_iter().enumerate() {
        workers.push(Arc::new(
            Worker::spawn(i as u8, d).map_err(AgentError::Thread)?,
        ));
    }
    let describe_deadline = Duration::from_secs(5).max(config.deadline);
    let mut gpus = Vec::new();
    for w in &workers {
        let info = match w.describe(describe_deadline).await {
            Ok(info) => info,
            Err(e) => {
                tracing::error!(
                    "GPU {}: cannot read its identity and limits ({e}); using the board's",
                    w.index()
                );
                let p = &config.board.power;
                GpuInfo {
                    name: config.board.model.clone(),
                    uuid: "unknown".into(),
                    default_limit: p.tdp_w,
                    min_limit: p.min_cap_w,
                    max_limit: p.max_cap_w,
                }
            }
        };
        // The uncapped limit is the GPU's default, within the board's range.
        let max = info
            .default_limit
            .min(info.max_limit)
            .min(config.board.power.max_cap_w);
        let min = info.min_limit.max(config.board.power.min_cap_w).min(max);
        gpus.push(GpuState {
            range: GpuRange { min, max },
            info,
            last: None,
            responsive: false,
            missed: 0,
            unresponsive_reported: false,
            last_error: None,
            applied: None,
            source: None,
            changed: false,
            retry: None,
            guard: ThermalGuard::default(),
            xids: VecDeque::new(),
        });
    }

    // XIDs: the source's thread feeds a std channel; one bridge thread
    // moves them onto the runtime.
    let (xid_std_tx, xid_std_rx) = std::sync::mpsc::channel::<XidReport>();
    let (xid_tx, mut xid_rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("xid-bridge".into())
        .spawn(move || {
            for x in xid_std_rx {
                if xid_tx.send(x).is_err() {
                    break;
                }
            }
        })
        .map_err(AgentError::Thread)?;
    match source.watch_xids(xid_std_tx) {
        Ok(refused) => {
            for (gpu, e) in refused {
                tracing::warn!("GPU {gpu}: XID events cannot be registered ({e})");
            }
        }
        Err(e) => tracing::error!("XID events are not available ({e}); XIDs will not be seen"),
    }

    // Flash: the event log, the outbox, the config store.
    let board = FlashBoard::host_file();
    let layout = board.layout();
    let (flash, flash_path) = match &config.flash {
        Some(path) => {
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let f = FileFlash::open(path, &board.geometry())
                .map_err(|e| AgentError::Flash(format!("{}: {e}", path.display())))?;
            (HostFlash::File(f), Some(path.display().to_string()))
        }
        None => {
            tracing::warn!(
                "no flash file configured: the event log, the outbox and the leases are kept in memory only and lost at exit"
            );
            (
                HostFlash::Memory(SimFlash::new(board.geometry.sectors as usize)),
                None,
            )
        }
    };
    let flash = SharedFlash::new(flash);
    let flash_err = |what: &str| {
        let what = what.to_string();
        move |e: loopwarden_flash::StoreError<loopwarden_flash::FlashError>| {
            AgentError::Flash(format!("{what}: {e:?}"))
        }
    };
    let mut store = ConfigStore::open(flash.clone(), layout.config.clone())
        .map_err(flash_err("config store"))?;
    let first_seq = store
        .reserve_seq(SEQ_BLOCK)
        .await
        .map_err(flash_err("sequence reservation"))?;
    let mut log = EventLog::open(flash.clone(), layout.log.clone())
        .await
        .map_err(flash_err("event log"))?;
    let outbox = Outbox::open(flash.clone(), layout.outbox)
        .await
        .map_err(flash_err("outbox"))?;
    if log.skipped() > 0 || outbox.skipped() > 0 {
        tracing::warn!(
            "flash: {} event-log and {} outbox items were unreadable and skipped (a power cut mid-write, or damage)",
            log.skipped(),
            outbox.skipped()
        );
    }

    // Leases that were in force before a restart, if still valid.
    let ranges: Vec<GpuRange> = gpus.iter().map(|g| g.range).collect();
    let own_cmd = Topic::new(&config.site, Role::Host, &config.host, Family::Cmd);
    let mut core = CommandCore::new(own_cmd, ranges, config.keys.clone());
    let mut logged_leases = Vec::new();
    log.for_each(|r| {
        if r.kind == MessageKind::CapLease as u8 || r.kind == MessageKind::QuarantineRelease as u8 {
            if let Ok(f) = Frame::decode(r.body) {
                logged_leases.push(f);
            }
        }
    })
    .await
    .map_err(flash_err("event log"))?;
    let now = now_ms();
    let restored = logged_leases
        .iter()
        .filter(|f| core.restore(now, f))
        .count();
    let logged_leases: Vec<_> = logged_leases
        .into_iter()
        .filter(|f| matches!(f.message, Message::CapLease(_)))
        .collect();
    if !logged_leases.is_empty() {
        tracing::info!(
            "{} leases in the log; {restored} still valid and applied again",
            logged_leases.len()
        );
    }

    // Health: every GPU healthy unless the flash kept a state.
    let policy = Policy {
        unresponsive_after: config.unresponsive_after,
        quiet_ms: config.quiet_period.as_millis() as u64,
        ..Policy::default()
    };
    let limits = Limits {
        max_operating_c: f64::from(config.board.thermal.max_operating_c.0),
    };
    let mut health = HealthEngine::new(gpus.len(), limits, policy, started);
    for i in 0..gpus.len() {
        let mut buf = [0u8; 128];
        match store.get(&health_key(i), &mut buf).await {
            Ok(Some(n)) => match postcard::from_bytes::<GpuHealth>(&buf[..n]) {
                Ok(h) if h.state != HealthState::Healthy => {
                    tracing::warn!(
                        "GPU {i}: {:?} since before the restart ({})",
                        h.state,
                        h.evidence.as_str()
                    );
                    health.restore(
                        i as u8,
                        GpuStatus {
                            state: h.state,
                            reason: h.reason,
                            since: h.since,
                            evidence: h.evidence.as_str().to_string(),
                        },
                    );
                }
                Ok(_) => {}
                Err(e) => tracing::error!("GPU {i}: kept health state unreadable ({e}); healthy"),
            },
            Ok(None) => {}
            Err(e) => tracing::error!("GPU {i}: kept health state unreadable ({e:?}); healthy"),
        }
    }

    // The bus.
    let (broker, _embedded) =
        loopwarden_bus::embedded::configured_or_embedded(config.broker.clone())
            .map_err(|e| AgentError::Broker(e.to_string()))?;
    let node = NodeId::new(Role::Host, config.host.as_str()).expect("host is an ident");
    let mut bus_config = BusConfig::new(broker.clone(), config.site.clone(), node.clone());
    bus_config.credentials = config.credentials.clone();
    bus_config.first_seq = first_seq;
    let coolant_topic = config
        .cdu
        .as_ref()
        .map(|cdu| Topic::new(&config.site, Role::Cdu, cdu, Family::Health));
    if let Some(t) = &coolant_topic {
        bus_config.subscriptions.push(t.to_string());
    }
    let (bus, mut inbound, bus_task) = Bus::start_with_outbox(bus_config, Box::new(outbox));
    tracing::info!(
        "host {} of site {} with {} {} GPUs; broker {}:{}",
        config.host.as_str(),
        config.site.as_str(),
        gpus.len(),
        match config.gpus {
            GpuSourceKind::Nvml => "NVML",
            GpuSourceKind::Twin(_) => "twin",
        },
        broker.host,
        broker.port
    );
    if config.demo_key {
        tracing::warn!(
            "commands are checked against the public demonstration key (twin GPUs, no keys file)"
        );
    } else if config.keys.is_empty() {
        tracing::warn!(
            "no keys file: every command (cap lease, quarantine release) will be refused as unauthenticated"
        );
    }

    // The console.
    let (ctl_tx, mut ctl_rx) = mpsc::channel::<(Request, oneshot::Sender<serde_json::Value>)>(16);
    let console_path = config.console.clone();
    let listener = console::bind(&console_path).map_err(|source| AgentError::Console {
        path: console_path.display().to_string(),
        source,
    })?;
    let console_task = tokio::spawn(console::serve(listener, ctl_tx));

    let (actions_tx, mut actions_rx) = mpsc::unbounded_channel();
    let recorder = Recorder::start(log, store, bus.clone()).map_err(AgentError::Thread)?;
    let mut agent = Agent {
        health,
        actions: actions_tx,
        coolant_topic,
        running_actions: Vec::new(),
        config,
        bus,
        workers,
        gpus,
        core,
        recorder,
        seq_floor: first_seq.saturating_add(SEQ_BLOCK),
        timing: Timing::default(),
        started,
        flash_path,
        last_json: None,
        connects: 0,
    };

    // Start from what the GPUs have now, then put the targets in force.
    agent.read_applied().await;
    agent.reconcile(now_ms(), false).await;

    let mut tick = tokio::time::interval(agent.config.period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tokio::pin!(shutdown);
    loop {
        let expiry = agent
            .core
            .next_expiry()
            .map(|t| Duration::from_millis(now_ms().until(t)));
        tokio::select! {
            scheduled = tick.tick() => {
                let jitter = Instant::now().saturating_duration_since(scheduled.into_std());
                agent.sample_round(jitter).await;
            }
            Some(msg) = inbound.recv() => agent.on_inbound(msg).await,
            Some((gpu, outcome)) = actions_rx.recv() => agent.on_action(gpu, outcome).await,
            Some(x) = xid_rx.recv() => agent.on_xid(x).await,
            Some((req, reply)) = ctl_rx.recv() => {
                let answer = agent.answer(req).await;
                let _ = reply.send(answer);
            }
            _ = sleep_opt(expiry) => {
                agent.reconcile(now_ms(), false).await;
            }
            _ = &mut shutdown => break,
        }
    }

    // A drain that is running finishes (within its timeout) and its outcome
    // is logged: a quarantine kept in flash does not run its actions again.
    let pending: Vec<_> = std::mem::take(&mut agent.running_actions)
        .into_iter()
        .filter(|h| !h.is_finished())
        .collect();
    if !pending.is_empty() {
        tracing::info!("stopping: waiting for {} quarantine actions", pending.len());
        let wait = agent.config.quarantine_timeout + Duration::from_secs(1);
        let _ = tokio::time::timeout(wait, futures::future::join_all(pending)).await;
    }
    while let Ok((gpu, outcome)) = actions_rx.try_recv() {
        agent.on_action(gpu, outcome).await;
    }
    tracing::info!("stopping: restoring default power limits");
    agent.restore_defaults().await;
    // Everything decided is written and handed to the bus before it stops.
    agent.recorder.flush().await;
    console_task.abort();
    let _ = std::fs::remove_file(&console_path);
    if let Err(e) = agent.bus.shutdown(Duration::from_secs(3)).await {
        tracing::warn!("leaving the bus: {e}");
    }
    bus_task.join(Duration::from_secs(3)).await;
    Ok(())
}

/// The config-store key of a GPU's health.
fn health_key(gpu: usize) -> String {
    format!("health.{gpu}")
}

/// A sample as the health engine reads it.
fn observation(s: &GpuSample) -> Observation {
    Observation {
        temp: f64::from(s.temp.0),
        power: f64::from(s.power.0),
        power_limit: f64::from(s.power_limit.0),
        sm_clock: f64::from(s.sm_clock.0),
        util: f64::from(s.util.get()),
        sbe_volatile: u64::from(s.ecc.sbe_volatile),
        dbe_volatile: u64::from(s.ecc.dbe_volatile),
        retired_sbe: u64::from(s.repair.retired_sbe),
        retired_dbe: u64::from(s.repair.retired_dbe),
        retired_pending: s.flags.contains(GpuFlags::RETIRED_PENDING),
        remap_pending: s.flags.contains(GpuFlags::REMAP_PENDING),
        remap_failure: s.flags.contains(GpuFlags::REMAP_FAILURE),
        pcie_replay: u64::from(s.pcie_replay),
        nvlink_crc: u64::from(s.nvlink.crc),
        nvlink_replay: u64::from(s.nvlink.replay),
        nvlink_recovery: u64::from(s.nvlink.recovery),
        throttle: s.throttle,
    }
}

async fn sleep_opt(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

impl Agent {
    fn gpu_index(i: usize) -> GpuIndex {
        GpuIndex::new(i as u8).expect("at most 16 GPUs")
    }

    /// Publishes a message and its JSON mirror; logs what the bus refused.
    /// Publishes a message and its JSON mirror. Telemetry and health
    /// (outside the outbox) go out from here at once; events and acks go
    /// through the recorder, which stores them in the outbox.
    fn publish(&mut self, message: Message, time: TimestampMs, mirror: bool) {
        if matches!(message, Message::Event(_) | Message::Ack(_)) {
            self.recorder.publish(message, time, mirror);
            return;
        }
        let kind = message.kind();
        match self.bus.publish(message, time) {
            Ok(frame) => {
                if mirror {
                    if let Err(e) = self.bus.publish_json(&frame) {
                        tracing::debug!("JSON mirror of {kind:?} not sent: {e}");
                    }
                }
            }
            Err(loopwarden_bus::PublishError::Offline) => {}
            Err(e) => tracing::warn!("{kind:?} not published: {e}"),
        }
    }

    /// Logs an event to flash and publishes it, both through the
    /// recorder, in decision order.
    async fn emit(&mut self, event: Event, time: TimestampMs) {
        let mut buf = [0u8; MAX_FRAME_LEN];
        let message = Message::Event(event);
        match message.encode_body(&mut buf) {
            Ok(n) => self
                .recorder
                .append(time, MessageKind::Event as u8, buf[..n].to_vec()),
            Err(e) => tracing::error!("event not encodable: {e:?}"),
        }
        self.publish(message, time, true);
    }

    /// Reads every GPU's limit as it is now.
    async fn read_applied(&mut self) {
        let deadline = self.config.deadline;
        for i in 0..self.gpus.len() {
            match self.workers[i].read_limit(deadline).await {
                Ok(w) => {
                    // Anything but the default was set by someone: ours to
                    // restore at exit.
                    self.gpus[i].applied = Some(w);
                    self.gpus[i].changed = w != self.gpus[i].info.default_limit;
                }
                Err(e) => tracing::warn!("GPU {i}: cannot read its power limit ({e})"),
            }
        }
    }

    /// Puts the targets in force; returns the GPUs that failed and why. A
    /// target that failed is tried again after [`RETRY_MS`] (at once when
    /// `force`, for a command that waits for its ack). A `cap_applied`
    /// event goes out when the limit read back, or who set it, changes.
    async fn reconcile(&mut self, now: TimestampMs, force: bool) -> Vec<(usize, String)> {
        let targets = self.core.targets(now);
        let deadline = self.config.deadline;
        let mut failures = Vec::new();
        for t in targets {
            let i = t.gpu.get() as usize;
            let g = &mut self.gpus[i];
            if g.applied == Some(t.limit) {
                g.retry = None;
                if g.source != t.source {
                    g.source = t.source;
                    let ev = Event::CapApplied {
                        gpu: t.gpu,
                        limit: t.limit,
                        source: t.source,
                    };
                    self.emit(ev, now).await;
                }
                continue;
            }
            if !force
                && g.retry
                    .is_some_and(|(target, at)| target == t.limit && now.0 < at)
            {
                continue;
            }
            let w = &self.workers[i];
            let set = w.set_limit(t.limit, deadline).await;
            let back = w.read_limit(deadline).await;
            let g = &mut self.gpus[i];
            let before = (g.applied, g.source);
            let why = match (&set, &back) {
                (Ok(()), Ok(b)) if *b == t.limit => None,
                (Err(e), Ok(b)) => Some(format!(
                    "GPU {i}: setting {} W: {e}; {} W stays in force",
                    t.limit.0, b.0
                )),
                (Ok(()), Ok(b)) => Some(format!(
                    "GPU {i}: set {} W but reads back {} W",
                    t.limit.0, b.0
                )),
                (_, Err(e)) => Some(format!(
                    "GPU {i}: limit not confirmed, read-back failed: {e}"
                )),
            };
            match back {
                Ok(b) => {
                    g.applied = Some(b);
                    g.changed = b != g.info.default_limit;
                    g.source = if b == t.limit { t.source } else { None };
                }
                Err(_) => {
                    // The set may have taken: restore the default at exit.
                    g.applied = None;
                    g.changed = true;
                }
            }
            if let Some(why) = why {
                // Said once per target, not every sample.
                if g.retry.is_none_or(|(target, _)| target != t.limit) {
                    tracing::error!("{why}");
                }
                g.retry = Some((t.limit, now.0 + RETRY_MS));
                failures.push((i, why));
            } else {
                g.retry = None;
            }
            if let Some(limit) = g.applied {
                if (g.applied, g.source) != before {
                    let ev = Event::CapApplied {
                        gpu: t.gpu,
                        limit,
                        source: g.source,
                    };
                    self.emit(ev, now).await;
                }
            }
        }
        failures
    }

    /// Samples every GPU, each on its own worker, within the deadline.
    async fn sample_round(&mut self, jitter: Duration) {
        let began = Instant::now();
        let deadline = self.config.deadline;
        let mut set = tokio::task::JoinSet::new();
        for w in &self.workers {
            let w = w.clone();
            set.spawn(async move { (w.index(), w.sample(deadline).await) });
        }
        let mut results: Vec<Option<Result<GpuSample, GpuError>>> = vec![None; self.gpus.len()];
        while let Some(r) = set.join_next().await {
            if let Ok((i, r)) = r {
                results[i as usize] = Some(r);
            }
        }
        let now = now_ms();
        let settings = self.config.guard;
        for (i, r) in results.into_iter().enumerate() {
            let g = &mut self.gpus[i];
            match r {
                Some(Ok(s)) => {
                    g.last = Some(s);
                    g.responsive = true;
                    g.missed = 0;
                    if g.unresponsive_reported {
                        tracing::info!("GPU {i} answers again");
                        g.unresponsive_reported = false;
                    }
                    let cap = g.guard.update(&settings, g.range, s.temp, s.power);
                    self.core.guard(Self::gpu_index(i), cap);
                    let outs = self.health.sample(now, i as u8, &observation(&s));
                    self.on_health(outs, now).await;
                }
                other => {
                    let e = match other {
                        Some(Err(e)) => e,
                        _ => GpuError::Timeout,
                    };
                    g.responsive = false;
                    g.missed += 1;
                    g.last_error = Some(e.to_string());
                    if g.missed >= self.config.unresponsive_after && !g.unresponsive_reported {
                        g.unresponsive_reported = true;
                        tracing::error!(
                            "GPU {i} unresponsive: {} samples in a row missed ({e})",
                            g.missed
                        );
                    }
                    let outs = self.health.missed(now, i as u8);
                    self.on_health(outs, now).await;
                }
            }
        }
        if self.timing.samples % REREAD_EVERY == REREAD_EVERY - 1 {
            self.read_applied().await;
        }
        self.reconcile(now, false).await;
        let connects = self.bus.metrics().connects;
        // Again on every new connection, and every minute in case that
        // publish was lost in a full queue after a long outage.
        if connects != self.connects || self.timing.samples % HEALTH_EVERY == 0 {
            self.connects = connects;
            self.publish_health(now);
        }
        self.publish_telemetry(now);
        self.keep_seq_reserved().await;

        let t = &mut self.timing;
        let jitter_us = jitter.as_micros() as u64;
        let took_us = began.elapsed().as_micros() as u64;
        t.samples += 1;
        t.last_jitter_us = jitter_us;
        t.max_jitter_us = t.max_jitter_us.max(jitter_us);
        t.last_sample_us = took_us;
        t.max_sample_us = t.max_sample_us.max(took_us);
        if t.jitter_us.len() == JITTER_WINDOW {
            t.jitter_us.pop_front();
        }
        t.jitter_us.push_back(jitter_us);
    }

    fn publish_telemetry(&mut self, now: TimestampMs) {
        let mut telemetry = HostTelemetry {
            gpus: heapless::Vec::new(),
        };
        for (i, g) in self.gpus.iter().enumerate() {
            let s = g.last.unwrap_or_default();
            let _ = telemetry.gpus.push(GpuTelemetry {
                gpu: Self::gpu_index(i),
                flags: s.flags.with(GpuFlags::RESPONSIVE, g.responsive),
                unsupported: s.unsupported,
                temp: s.temp,
                mem_temp: s.mem_temp,
                power: s.power,
                power_limit: s.power_limit,
                sm_clock: s.sm_clock,
                mem_clock: s.mem_clock,
                util: s.util,
                throttle: s.throttle,
                ecc: s.ecc,
                repair: s.repair,
                pcie_replay: s.pcie_replay,
                nvlink: s.nvlink,
            });
        }
        let mirror = self
            .last_json
            .is_none_or(|t| t.elapsed() + Duration::from_millis(50) >= self.config.json_period);
        if mirror {
            self.last_json = Some(Instant::now());
        }
        self.publish(Message::HostTelemetry(telemetry), now, mirror);
    }

    /// Keeps the flash reservation of sequence numbers ahead of the bus.
    async fn keep_seq_reserved(&mut self) {
        if self.bus.next_seq().saturating_add(SEQ_BLOCK / 2) >= self.seq_floor {
            match self.recorder.reserve_seq(SEQ_BLOCK).await {
                Ok(floor) => self.seq_floor = floor.saturating_add(SEQ_BLOCK),
                Err(e) => tracing::error!("sequence numbers not reserved in flash: {e:?}"),
            }
        }
    }

    fn publish_health(&mut self, now: TimestampMs) {
        let mut health = HostHealth {
            gpus: heapless::Vec::new(),
        };
        for i in 0..self.gpus.len() {
            let _ = health.gpus.push(self.gpu_health(i));
        }
        self.publish(Message::HostHealth(health), now, true);
    }

    async fn on_xid(&mut self, x: XidReport) {
        let now = now_ms();
        let Some(gpu) = GpuIndex::new(x.gpu).filter(|g| (g.get() as usize) < self.gpus.len())
        else {
            tracing::warn!("XID {} for unknown GPU {}", x.xid, x.gpu);
            return;
        };
        tracing::warn!("GPU {}: XID {}", x.gpu, x.xid);
        let g = &mut self.gpus[x.gpu as usize];
        if g.xids.len() == RECENT_XIDS {
            g.xids.pop_front();
        }
        g.xids.push_back((now, x.xid));
        // The decision first: the quarantine is what the hall waits for.
        let outs = self.health.xid(now, x.gpu, x.xid);
        self.on_health(outs, now).await;
        self.emit(Event::Xid { gpu, xid: x.xid }, now).await;
    }

    /// One GPU's health as the bus carries it.
    fn gpu_health(&self, i: usize) -> GpuHealth {
        let st = self.health.status(i as u8).expect("one status per GPU");
        GpuHealth {
            gpu: Self::gpu_index(i),
            state: st.state,
            reason: st.reason,
            since: st.since,
            evidence: Text::truncated(&st.evidence),
        }
    }

    /// Carries out what the health engine decided: log and publish each
    /// change, keep the state in flash, publish the retained health, and
    /// start the quarantine actions.
    async fn on_health(&mut self, outs: Vec<Output>, now: TimestampMs) {
        if outs.is_empty() {
            return;
        }
        let mut changed = false;
        for o in outs {
            match o {
                Output::Change(c) => {
                    changed = true;
                    let name = serde_json::to_value(c.reason)
                        .ok()
                        .and_then(|v| v.as_str().map(String::from))
                        .unwrap_or_default();
                    if c.to == HealthState::Quarantined {
                        tracing::error!("GPU {} quarantined ({name}): {}", c.gpu, c.evidence);
                    } else {
                        tracing::warn!(
                            "GPU {}: {:?} -> {:?} ({name}): {}",
                            c.gpu,
                            c.from,
                            c.to,
                            c.evidence
                        );
                    }
                    // The retained state first: it is what the hall waits
                    // for, and it needs no flash write to go out. Then the
                    // actions, the state in flash, the event.
                    self.publish_health(now);
                    if c.to == HealthState::Quarantined {
                        self.start_actions(c.gpu, &name, &c.evidence);
                    }
                    self.keep_health(c.gpu as usize).await;
                    let ev = Event::HealthChanged {
                        gpu: Self::gpu_index(c.gpu as usize),
                        from: c.from,
                        to: c.to,
                        reason: c.reason,
                    };
                    self.emit(ev, now).await;
                }
                Output::CoolingAttributed { gpus, reason, .. } => {
                    tracing::warn!(
                        "the cooling explains the heat of GPUs {gpus:#06x}; no GPU is marked for it"
                    );
                    self.emit(Event::CoolingAttributed { gpus, reason }, now)
                        .await;
                }
            }
        }
        let _ = changed;
    }

    /// Keeps a GPU's health in flash, so a restart does not forget a
    /// quarantine.
    async fn keep_health(&mut self, i: usize) {
        let h = self.gpu_health(i);
        match postcard::to_allocvec(&h) {
            Ok(bytes) => self.recorder.set(health_key(i), bytes),
            Err(e) => tracing::error!("GPU {i}: health state not encodable: {e}"),
        }
    }

    /// Starts every configured action for a quarantine of `gpu`, each on
    /// its own task; outcomes come back to the loop.
    fn start_actions(&mut self, gpu: u8, reason: &str, evidence: &str) {
        let vars = actions::Vars {
            host: self.config.host.as_str().to_string(),
            site: self.config.site.as_str().to_string(),
            gpu,
            uuid: self.gpus[gpu as usize].info.uuid.clone(),
            reason: format!("{reason}: {evidence}"),
        };
        for action in &self.config.quarantine_actions {
            let argv = actions::expand(action, &vars);
            let timeout = self.config.quarantine_timeout;
            let tx = self.actions.clone();
            self.running_actions.retain(|h| !h.is_finished());
            self.running_actions.push(tokio::spawn(async move {
                let outcome = actions::run(&argv, timeout).await;
                let _ = tx.send((gpu, outcome));
            }));
        }
    }

    async fn on_action(&mut self, gpu: u8, o: actions::Outcome) {
        if o.ok {
            tracing::info!("GPU {gpu}: quarantine action {} done", o.program);
        } else {
            tracing::error!(
                "GPU {gpu}: quarantine action {} failed: {}",
                o.program,
                o.detail
            );
        }
        let ev = Event::QuarantineAction {
            gpu: Self::gpu_index(gpu as usize),
            ok: o.ok,
            exit_code: o.exit_code,
        };
        self.emit(ev, now_ms()).await;
    }

    /// A frame from the bus: a command, or the cooling context.
    async fn on_inbound(&mut self, msg: Inbound) {
        if self.coolant_topic.as_ref() == Some(&msg.topic) {
            if let Message::CduState(st) = &msg.frame.message {
                let now = now_ms();
                let rack_lost = self.config.rack.is_some_and(|r| {
                    st.racks
                        .iter()
                        .any(|x| x.rack.get() == r && x.cooling == RackCooling::Lost)
                });
                let state = match st.mode {
                    _ if rack_lost => LoopState::Failsafe,
                    CduMode::Normal => LoopState::Normal,
                    CduMode::Degraded | CduMode::Boot => LoopState::Degraded,
                    CduMode::Failsafe => LoopState::Failsafe,
                };
                let c = Coolant {
                    supply_c: st.supply.map(|c| c.value()),
                    flow_lpm_per_gpu: st.flow_per_gpu.map(|f| f.value()),
                    state,
                };
                let outs = self.health.coolant(now, c);
                self.on_health(outs, now).await;
            }
            return;
        }
        if msg.topic.family != Family::Cmd {
            return;
        }
        self.on_command(msg).await;
    }

    async fn on_command(&mut self, msg: Inbound) {
        let now = now_ms();
        let frame = msg.frame;
        let verdict = self.core.command(now, &frame);
        let mut code = verdict.code;
        let mut detail = verdict.detail;
        if let (Some(gpu), Message::QuarantineRelease(r)) = (verdict.release, &frame.message) {
            match self
                .health
                .release(now, gpu, r.operator.as_str(), r.note.as_str())
            {
                Ok(change) => {
                    let mut buf = [0u8; MAX_FRAME_LEN];
                    let logged = match frame.encode(&mut buf) {
                        Ok(n) => self
                            .recorder
                            .append_sync(
                                frame.time,
                                MessageKind::QuarantineRelease as u8,
                                buf[..n].to_vec(),
                            )
                            .await
                            .map(|_| ()),
                        Err(e) => Err(format!("{e:?}")),
                    };
                    if let Err(e) = logged {
                        tracing::error!("release not logged to flash: {e}");
                        detail = format!(
                            "released, but not logged to flash ({e}): the quarantine may come back after a restart"
                        );
                    }
                    tracing::warn!(
                        "GPU {gpu} released by {}: {}",
                        r.operator.as_str(),
                        r.note.as_str()
                    );
                    self.publish_health(now);
                    self.keep_health(gpu as usize).await;
                    let ev = Event::QuarantineReleased {
                        gpu: r.gpu,
                        operator: r.operator.clone(),
                        note: r.note.clone(),
                    };
                    self.emit(ev, now).await;
                    let ev = Event::HealthChanged {
                        gpu: r.gpu,
                        from: change.from,
                        to: change.to,
                        reason: change.reason,
                    };
                    self.emit(ev, now).await;
                }
                Err(state) => {
                    code = AckCode::NotQuarantined;
                    let state = format!("{state:?}").to_lowercase();
                    detail = format!("GPU {gpu} is {state}, not quarantined");
                }
            }
        }
        if verdict.changed_caps {
            // Logged before it is acknowledged: a crash now still knows it.
            let mut buf = [0u8; MAX_FRAME_LEN];
            let logged = match frame.encode(&mut buf) {
                Ok(n) => self
                    .recorder
                    .append_sync(frame.time, MessageKind::CapLease as u8, buf[..n].to_vec())
                    .await
                    .map(|_| ()),
                Err(e) => Err(format!("{e:?}")),
            };
            if let Err(e) = logged {
                // The cap still applies (the sender needs it now); the ack
                // says it will not survive a restart.
                tracing::error!("lease not logged to flash: {e}");
                detail = format!("not logged to flash ({e}): lost if the agent restarts");
            }
            let failures = self.reconcile(now, true).await;
            if !failures.is_empty() {
                code = AckCode::Failed;
                detail = failures
                    .into_iter()
                    .map(|(_, why)| why)
                    .collect::<Vec<_>>()
                    .join("; ");
            }
        }
        tracing::info!(
            "{:?} from {} seq {}: {code:?} {detail}",
            frame.message.kind(),
            frame.sender.id.as_str(),
            frame.seq
        );
        let mut in_force = heapless::Vec::new();
        for (i, g) in self.gpus.iter().enumerate() {
            if let Some(limit) = g.applied {
                let _ = in_force.push(GpuCap {
                    gpus: GpuSelector::Gpu(Self::gpu_index(i)),
                    limit,
                });
            }
        }
        let ack = Ack {
            correlation: Correlation {
                from: frame.sender.clone(),
                seq: frame.seq,
            },
            code,
            in_force,
            detail: Text::truncated(&detail),
        };
        self.publish(Message::Ack(ack), now, true);
    }

    async fn restore_defaults(&mut self) {
        let deadline = self.config.deadline;
        let now = now_ms();
        for i in 0..self.gpus.len() {
            let default = self.gpus[i].info.default_limit;
            if !self.gpus[i].changed || self.gpus[i].applied == Some(default) {
                continue;
            }
            let w = &self.workers[i];
            let set = w.set_limit(default, deadline).await;
            let back = w.read_limit(deadline).await;
            match (set, back) {
                (Ok(()), Ok(b)) if b == default => {
                    self.gpus[i].applied = Some(b);
                    self.emit(
                        Event::CapApplied {
                            gpu: Self::gpu_index(i),
                            limit: b,
                            source: None,
                        },
                        now,
                    )
                    .await;
                }
                (set, back) => tracing::error!(
                    "GPU {i}: default limit {} W not restored (set: {set:?}, read back: {back:?})",
                    default.0
                ),
            }
        }
    }
}
