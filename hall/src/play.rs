//! `loopwarden-hall play`: the whole system on one machine. It starts the
//! embedded broker (or uses the one given), the simulated CDU on a
//! loopback Modbus TCP port, the hall stepping in real time (or faster),
//! one real node agent per simulated host (in-process tasks reading their
//! GPUs from the hall) and the real cooling controller driving the CDU over
//! Modbus; it plays a scenario, shows the hall live, and writes the report.
//!
//! Hosts follow their agents as `docs/plant-model.md` §2.6 says: the run listens on
//! the bus like any facility system and tells the hall when an agent
//! quarantined a GPU (drained 30 s later) and when an agent powered its
//! host down because its rack lost cooling (and up when it is back).
//!
//! The run also watches the controller's own counters
//! ([`cooling_ctrl::shell::ShellStats`], replaced after every step and
//! every ack) and returns what they say of cap leases in
//! [`PlayOutcome::caps`]: how many hosts were capped at once, which hosts
//! acknowledged a cap in force, what was still capped at the end, and each
//! *cap episode* with its latencies.
//!
//! Glossary:
//! - *speed*: simulated seconds per wall-clock second (the agents and the
//!   controller keep their own real-time periods).
//! - *observer*: the run's own bus client, role facility.
//! - *cap episode*: from the controller step whose commands first hold a
//!   cap (none before) to the step whose commands hold none again.
//! - *capped* (an ack, a telemetry frame): some GPU's limit in force is
//!   more than 1 W below the TDP.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cooling_ctrl::shell::{ShellConfig, ShellStats};
use loopwarden_bus::embedded::EmbeddedBroker;
use loopwarden_bus::{BrokerAddr, Bus, BusConfig, BusTask, Inbound};
use loopwarden_field::common::CommonFlags;
use loopwarden_protocol::message::{
    CduState, Event, HealthState, HostHealth, HostTelemetry, RackCooling,
};
use loopwarden_protocol::{CoolingStep, Ident, Message, NodeId, Role};
use loopwarden_twin::hall::Hall;
use loopwarden_twin::scenario::Scenario;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::sim_side::{at_speed, Pace, SimSide};

mod controller;
use crate::trace::TraceRow;
use controller::{fresh_file, restarts_of, ControllerRuns};

/// What to play and how.
#[derive(Debug, Clone)]
pub struct PlayConfig {
    /// The scenario.
    pub scenario: Scenario,
    /// Its name in the report.
    pub name: String,
    /// Where the report, the trace and the agents' flash go.
    pub out: PathBuf,
    /// Simulated seconds per wall second.
    pub speed: f64,
    /// Play only this many simulated seconds (default: the scenario's).
    pub duration_s: Option<u64>,
    /// No live view (for tests and logs).
    pub headless: bool,
    /// A broker to use instead of the embedded one.
    pub broker: Option<BrokerAddr>,
    /// Speak TLS to that broker with the identities of this `lwbus pki
    /// init` folder: one per host (`r0h0`, `r0h1`, …), `cdu1` (with its
    /// sign key), the reader `hall-run` for the observer, and the hosts'
    /// `keyring.toml`.
    pub pki: Option<PathBuf>,
    /// An agent config file every host's agent reads (its `[quarantine]`
    /// and `[cooling_loss]` commands, say); what the run sets (site,
    /// broker, host, rack, flash, console) overrides it. Without one, the
    /// agents' cooling-loss power-down is `true` (the simulated host
    /// follows the agent's `cooling_action` event) after 30 simulated
    /// seconds.
    pub agent_config: Option<PathBuf>,
    /// Operators clearing a latched leak: (simulated second, rack), as
    /// `cooling-ctrl ctl clear-leak` would.
    pub clear_leaks: Vec<(u64, usize)>,
}

impl PlayConfig {
    /// `scenario` named `name`, played whole and headless in real time
    /// into `out`, on the embedded broker, with no agent config and no
    /// operator: what the tests play, each changing what it needs.
    pub fn headless(scenario: Scenario, name: &str, out: &Path) -> Self {
        Self {
            scenario,
            name: name.to_string(),
            out: out.to_path_buf(),
            speed: 1.0,
            duration_s: None,
            headless: true,
            broker: None,
            pki: None,
            agent_config: None,
            clear_leaks: Vec::new(),
        }
    }
}

/// The TLS settings of identity `who` from the pki folder `dir`.
fn pki_tls(dir: &Path, who: &str) -> Result<loopwarden_bus::tls::Tls, PlayError> {
    loopwarden_bus::tls::Tls::load(loopwarden_bus::tls::TlsFiles::of_identity(dir, who))
        .map_err(|e| PlayError::Start(format!("TLS identity {who}: {e}")))
}

/// What the run saw.
#[derive(Debug, Clone, Default)]
pub struct PlayOutcome {
    /// The figures of `docs/plant-model.md` §8.3, as `cooling-ctrl simulate`
    /// reports them, of the run as played through the real shell.
    pub summary: Option<loopwarden_twin::sim::Summary>,
    /// Hosts whose telemetry the observer received.
    pub hosts_heard: BTreeSet<String>,
    /// The CDU's telemetry was received.
    pub cdu_heard: bool,
    /// The CDU's setpoint and pump speed at the end, as the controller
    /// last wrote them over Modbus.
    pub cdu_settings: (f64, f64),
    /// GPUs the agents quarantined (global index).
    pub quarantined: BTreeSet<usize>,
    /// Racks the controller declared lost.
    pub racks_lost: BTreeSet<usize>,
    /// Hosts whose agents powered them down for a cooling loss.
    pub hosts_powered_down: BTreeSet<String>,
    /// Events seen, in words.
    pub events: Vec<String>,
    /// The report's files.
    pub report: Vec<PathBuf>,
    /// GPUs of the hall that shut down (at their shutdown temperature).
    pub gpu_shutdowns: u64,
    /// The hottest GPU die the trace saw, °C.
    pub max_gpu_c: f64,
    /// The lowest power limit in the last telemetry of each host, W.
    pub limits_at_end: BTreeMap<String, f64>,
    /// Most hosts whose telemetry showed a cap at the same time.
    pub peak_hosts_capped_telemetry: usize,
    /// What the controller's counters said of caps.
    pub caps: CapFigures,
}

/// Caps as the controller's counters ([`ShellStats`]) tell them.
#[derive(Debug, Clone, Default)]
pub struct CapFigures {
    /// The counters as the controller last reported them.
    pub last: Option<ShellStats>,
    /// Most hosts the controller's commands capped at once.
    pub peak_hosts_capped: usize,
    /// Hosts whose acks reported a cap in force at some time.
    pub hosts_acked_capped: BTreeSet<String>,
    /// Hosts the controller's last commands capped.
    pub capped_at_end: BTreeSet<String>,
    /// Hosts whose last ack reported a cap in force.
    pub acked_capped_at_end: BTreeSet<String>,
    /// The cap episodes, in order.
    pub episodes: Vec<CapEpisode>,
    /// The longest time between two acks while the commands capped hosts
    /// (leases go out every few seconds then, each acknowledged): how long
    /// the controller went without hearing its hosts.
    pub longest_ack_gap_s: f64,
}

/// One cap episode (see the glossary). Times are wall seconds, taken when
/// the run saw the controller's counters change (they are replaced after
/// the step, before the next await of the shell).
#[derive(Debug, Clone, Default)]
pub struct CapEpisode {
    /// When it began, since the run started.
    pub start_wall_s: f64,
    /// When it began, simulated time.
    pub start_t_s: f64,
    /// When it ended (commands without caps), since the run started.
    pub end_wall_s: Option<f64>,
    /// Most hosts capped at once in it.
    pub hosts_capped: usize,
    /// From its start until the commands capped every host of the run.
    pub all_capped_after_s: Option<f64>,
    /// From its start until acks with a cap in force had come from every
    /// host of the run.
    pub all_acked_after_s: Option<f64>,
    /// For each host capped in it, from the step that first capped it to
    /// its first ack with a cap in force: (host, seconds).
    pub host_ack_s: Vec<(String, f64)>,
}

/// How the run differs from the defaults, for tests and benchmarks.
#[derive(Debug, Clone, Default)]
pub struct PlayOptions {
    /// The controller's `cap_release_ms` (how long capacity must be back
    /// before a cap is lifted), instead of the core's default (60 s).
    pub cap_release_ms: Option<u64>,
    /// Pace the controller to a hall run this many times faster than real
    /// time ([`paced`]); `None`: the controller keeps its real-time
    /// figures.
    pub controller_pace: Option<f64>,
}

/// The core's figures that pace the controller against the plant, for a
/// plant running `speed` times faster than real time: its setpoint rise
/// and pump slow-down per second `speed` times faster, and what it waits
/// for in the plant (boot settle, the optimiser's period, a sensor fault
/// confirmed or cleared, capacity back before a cap is lifted, a valve's
/// stroke) `speed` times shorter. Its host and sensor timeouts stay in
/// real time: the agents report and the CDU answers in real time.
pub fn paced(mut core: cooling_core::CoreConfig, speed: f64) -> cooling_core::CoreConfig {
    let s = speed.clamp(0.01, 100.0);
    let m = &mut core.margins;
    m.setpoint_rise_k_per_min *= s as f32;
    m.speed_fall_per_s *= s as f32;
    let t = &mut core.timing;
    for ms in [
        &mut t.boot_settle_ms,
        &mut t.optimise_every_ms,
        &mut t.fault_confirm_ms,
        &mut t.fault_clear_ms,
        &mut t.cap_release_ms,
        &mut t.valve_confirm_ms,
    ] {
        *ms = (*ms as f64 / s).round() as u64;
    }
    core
}

/// Why the run could not go on.
#[derive(Debug, thiserror::Error)]
pub enum PlayError {
    /// A part would not start.
    #[error("{0}")]
    Start(String),
    /// The report could not be written.
    #[error("report: {0}")]
    Report(#[from] crate::report::ReportError),
    /// Writing the trace failed.
    #[error("trace {path}: {source}")]
    Trace {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

fn ident(s: &str) -> Result<Ident, PlayError> {
    Ident::new(s).map_err(|e| PlayError::Start(format!("{s:?} is not a name: {e}")))
}

/// Plays `cfg.scenario` with every part of the system running.
pub async fn play(cfg: PlayConfig) -> Result<PlayOutcome, PlayError> {
    play_with(cfg, PlayOptions::default()).await
}

/// As [`play`], with `opts`.
pub async fn play_with(cfg: PlayConfig, opts: PlayOptions) -> Result<PlayOutcome, PlayError> {
    std::fs::create_dir_all(&cfg.out)
        .map_err(|e| PlayError::Start(format!("{}: {e}", cfg.out.display())))?;
    let site_name = "hall-1";
    let site = ident(site_name)?;
    let sc = cfg.scenario.clone();
    let duration = cfg.duration_s.unwrap_or(sc.duration_s).min(sc.duration_s);
    let (embedded, broker) = start_broker(&cfg)?;
    let sim = SimSide::start(&at_speed(&sc, cfg.speed))
        .await
        .map_err(|e| PlayError::Start(e.to_string()))?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let s = &sc.site;
    let host_ids: Vec<String> = (0..s.racks * s.hosts_per_rack)
        .map(|h| format!("r{}h{}", h / s.hosts_per_rack, h % s.hosts_per_rack))
        .collect();
    let agents = start_agents(&cfg, site_name, &broker, &host_ids, &sim.hall, &stop_rx)?;
    let broker_value = broker.to_string();
    let ctrl = ControllerSide {
        site: &site,
        cdu: "cdu1",
        broker: &broker_value,
        pki: cfg.pki.as_deref(),
        host_ids: &host_ids,
        sim: &sim,
        clear_leaks: &cfg.clear_leaks,
        flash: Some(fresh_file(&cfg.out.join("cdu1.flash"))?),
    };
    let (start, controller, watcher, declared) = ctrl.start(&sc, &opts, &stop_rx)?;
    let observer_tls = cfg
        .pki
        .as_deref()
        .map(|d| pki_tls(d, "hall-run"))
        .transpose()?;
    let (observer, mut inbound, observer_task) = start_observer(&broker, &site, observer_tls)?;
    let running = Running {
        stop_tx,
        agents,
        controller,
        watcher,
        observer,
        observer_task,
    };
    let mut live = Live::open(&cfg, &sc, &sim, &host_ids, duration)?;
    live.declared = Some(declared);
    live.banner = banner(&cfg, &broker, embedded.is_some(), duration);
    if cfg.headless {
        println!("{}", live.banner);
    }
    live.run(&mut inbound, start).await?;
    live.finish(running).await
}

/// Waits until the run is told to stop.
pub(crate) async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// The broker: the one given, or the embedded one started on a loopback
/// port (kept while the run lasts).
fn start_broker(cfg: &PlayConfig) -> Result<(Option<EmbeddedBroker>, BrokerAddr), PlayError> {
    Ok(match &cfg.broker {
        Some(b) => (None, b.clone()),
        None if cfg.pki.is_some() => {
            return Err(PlayError::Start(
                "TLS identities are given but no broker: the embedded broker is plain loopback"
                    .into(),
            ))
        }
        None => {
            let e = EmbeddedBroker::start("127.0.0.1:0".parse().expect("an address"))
                .map_err(|e| PlayError::Start(format!("embedded broker: {e}")))?;
            let b = e.broker_addr();
            (Some(e), b)
        }
    })
}

/// One node agent per host, each on its own thread and runtime, reading
/// its GPUs from the hall.
fn start_agents(
    cfg: &PlayConfig,
    site_name: &str,
    broker: &BrokerAddr,
    host_ids: &[String],
    hall: &Arc<Mutex<Hall>>,
    stop_rx: &watch::Receiver<bool>,
) -> Result<Vec<std::thread::JoinHandle<()>>, PlayError> {
    let s = &cfg.scenario.site;
    let mut agents = Vec::new();
    for (h, id) in host_ids.iter().enumerate() {
        let dir = cfg.out.join("agents").join(id);
        std::fs::create_dir_all(&dir)
            .map_err(|e| PlayError::Start(format!("{}: {e}", dir.display())))?;
        // Every run starts from fresh agents: a flash file of the last run
        // in the same folder would bring back its quarantines and cooling
        // losses at the start of this one.
        let flash = fresh_file(&dir.join("flash.bin"))?;
        let flags = node_agent::config::Overrides {
            common: CommonFlags {
                site: Some(site_name.into()),
                broker: Some(broker.to_string()),
                flash: Some(flash),
                console: Some(dir.join("console.sock")),
                tls_ca: cfg.pki.as_ref().map(|d| d.join("ca.crt")),
                tls_cert: cfg.pki.as_ref().map(|d| d.join(format!("{id}.crt"))),
                tls_key: cfg.pki.as_ref().map(|d| d.join(format!("{id}.key"))),
                ..Default::default()
            },
            host: Some(id.clone()),
            twin_gpus: Some(s.gpus_per_host as u8),
            cdu: Some("cdu1".into()),
            rack: Some((h / s.hosts_per_rack) as u8),
            keyring: cfg.pki.as_ref().map(|d| d.join("keyring.toml")),
            ..hall_cooling_loss(cfg)
        };
        let config = node_agent::config::load(cfg.agent_config.as_deref(), &flags)
            .map_err(|e| PlayError::Start(format!("agent {id}: {e}")))?;
        let source = Box::new(node_agent::hall_gpus::HallSource::new(hall.clone(), h));
        agents.push(spawn_agent(id.clone(), config, source, stop_rx.clone())?);
    }
    Ok(agents)
}

/// Without an agent config file: the agents power their hosts' GPUs down
/// [`loopwarden_twin::hosts::DRAIN_S`] simulated seconds after their rack
/// lost cooling, with `true` as the command (the simulated host follows
/// the agent's `cooling_action` event), and up again when it is back.
fn hall_cooling_loss(cfg: &PlayConfig) -> node_agent::config::Overrides {
    if cfg.agent_config.is_some() {
        return Default::default();
    }
    let grace = (loopwarden_twin::hosts::DRAIN_S / cfg.speed.max(1e-3)).round() as u64;
    node_agent::config::Overrides {
        cooling_power_down: vec!["true".into()],
        cooling_power_up: vec!["true".into()],
        cooling_grace_s: Some(grace),
        ..Default::default()
    }
}

/// An agent on its own thread and runtime, as on its own host.
fn spawn_agent(
    id: String,
    config: node_agent::config::Config,
    source: Box<node_agent::hall_gpus::HallSource>,
    rx: watch::Receiver<bool>,
) -> Result<std::thread::JoinHandle<()>, PlayError> {
    std::thread::Builder::new()
        .name(format!("agent-{id}"))
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("agent {id}: runtime: {e}");
                    return;
                }
            };
            if let Err(e) = rt.block_on(node_agent::shell::run(config, source, stopped(rx))) {
                tracing::error!("agent {id}: {e}");
            }
        })
        .map_err(|e| PlayError::Start(format!("agent thread: {e}")))
}

/// The controller started: when, its task, the watcher of its counters
/// and a receiver of them.
pub(crate) type Started = (
    Instant,
    JoinHandle<()>,
    JoinHandle<CapFigures>,
    watch::Receiver<ShellStats>,
);

/// What the cooling controller is started with.
pub(crate) struct ControllerSide<'a> {
    pub(crate) site: &'a Ident,
    /// Its id on the bus (`cdu1` in a play).
    pub(crate) cdu: &'a str,
    /// The broker, or a cluster's brokers as `host:port,host:port`.
    pub(crate) broker: &'a str,
    /// The `lwbus pki init` folder, for TLS and the sign key.
    pub(crate) pki: Option<&'a Path>,
    pub(crate) host_ids: &'a [String],
    pub(crate) sim: &'a SimSide,
    /// Operators clearing latched leaks: (simulated second, rack).
    pub(crate) clear_leaks: &'a [(u64, usize)],
    /// The controller's flash file (kept across the scenario's
    /// `controller_restart`s); `None`: in memory.
    pub(crate) flash: Option<PathBuf>,
}

impl ControllerSide<'_> {
    /// Its sign key from the pki folder, else the demo key.
    fn sign_key(&self) -> Result<loopwarden_bus::keys::SignKey, PlayError> {
        match self.pki {
            Some(d) => {
                loopwarden_bus::keys::read_sign_key(&d.join(format!("{}.sign.key", self.cdu)))
                    .map_err(|e| PlayError::Start(format!("controller: {e}")))
            }
            None => Ok(loopwarden_bus::keys::SignKey {
                node: NodeId::new(Role::Cdu, self.cdu)
                    .map_err(|e| PlayError::Start(format!("controller id: {e}")))?,
                key_id: 1,
                key: loopwarden_protocol::samples::demo_signing_key(),
            }),
        }
    }

    /// The operators of the run: a task that asks the controller to clear
    /// each leak at its simulated second, and says what it answered.
    fn operator(
        &self,
        stop_rx: &watch::Receiver<bool>,
    ) -> Option<mpsc::Receiver<cooling_ctrl::shell::OperatorRequest>> {
        if self.clear_leaks.is_empty() {
            return None;
        }
        let (tx, rx) = mpsc::channel(4);
        let mut due = self.clear_leaks.to_vec();
        due.sort();
        let hall = self.sim.hall.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            for (at_s, rack) in due {
                while hall.lock().expect("hall lock").time_s() < at_s as f64 {
                    if *stop.borrow() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let (reply, answer) = tokio::sync::oneshot::channel();
                let req = cooling_ctrl::shell::OperatorRequest {
                    action: cooling_ctrl::shell::OperatorAction::ClearLeak { rack },
                    operator: Ident::new("hall-operator").expect("an ident"),
                    reply,
                };
                if tx.send(req).await.is_err() {
                    return;
                }
                match answer.await {
                    Ok(Ok(done)) => tracing::info!("t={at_s}s operator: {done}"),
                    Ok(Err(why)) => {
                        tracing::warn!("t={at_s}s operator: clear-leak {rack} refused: {why}")
                    }
                    Err(_) => return,
                }
            }
        });
        Some(rx)
    }

    /// Starts the cooling controller, driving the CDU over Modbus, and the
    /// watcher of its counters; returns when they started, the
    /// controller's task and the watcher's.
    pub(crate) fn start(
        &self,
        sc: &Scenario,
        opts: &PlayOptions,
        stop_rx: &watch::Receiver<bool>,
    ) -> Result<Started, PlayError> {
        let s = &sc.site;
        let mut core = cooling_ctrl::site_figures::core_config(s)
            .map_err(|e| PlayError::Start(format!("controller config: {e}")))?;
        if let Some(ms) = opts.cap_release_ms {
            core.timing.cap_release_ms = ms;
        }
        if let Some(speed) = opts.controller_pace {
            core = paced(core, speed);
        }
        let key = self.sign_key()?;
        let shell_cfg = ShellConfig {
            site: self.site.clone(),
            cdu: ident(self.cdu)?,
            broker: broker_of(self.broker)?,
            core,
            period: Duration::from_secs(1),
            hosts: self
                .host_ids
                .iter()
                .map(|h| ident(h))
                .collect::<Result<_, _>>()?,
            tls: self.pki.map(|d| pki_tls(d, self.cdu)).transpose()?,
            key_id: key.key_id,
            key: Some(key.key),
            lease: Duration::from_secs(30),
        };
        let sim = self.sim;
        let (stats_tx, stats_rx) = cooling_ctrl::shell::stats_channel();
        let runs = ControllerRuns {
            cfg: shell_cfg,
            map: sim.map.clone(),
            link: sim.link().clone(),
            pins: sim.pins.clone(),
            lines: sim.lines.clone(),
            stats: stats_tx,
            operator: self
                .operator(stop_rx)
                .map(|rx| Arc::new(tokio::sync::Mutex::new(rx))),
            flash: self.flash.clone(),
            hall: sim.hall.clone(),
            restarts: restarts_of(sc),
        };
        let start = Instant::now();
        let watcher = tokio::spawn(watch_caps(
            stats_rx.clone(),
            start,
            sim.hall.clone(),
            self.host_ids.to_vec(),
            s.gpu.tdp_w,
        ));
        let controller = tokio::spawn(runs.run(stop_rx.clone()));
        Ok((start, controller, watcher, stats_rx))
    }
}

/// The broker setting of `joined` (one broker, or a cluster's as
/// `host:port,host:port`): the whole list where the setting takes one,
/// else its first broker.
pub(crate) fn broker_of<T>(joined: &str) -> Result<T, PlayError>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    joined.parse::<T>().or_else(|e| {
        let first = joined.split(',').next().unwrap_or(joined);
        if first == joined {
            return Err(PlayError::Start(format!("broker {joined}: {e}")));
        }
        tracing::warn!("broker {joined}: {e}; using the first, {first}");
        first
            .parse::<T>()
            .map_err(|e| PlayError::Start(format!("broker {first}: {e}")))
    })
}

/// The observer: what a facility system sees, and hosts following their
/// agents.
fn start_observer(
    broker: &BrokerAddr,
    site: &Ident,
    tls: Option<loopwarden_bus::tls::Tls>,
) -> Result<(Bus, mpsc::Receiver<Inbound>, BusTask), PlayError> {
    let mut bc = BusConfig::new(
        broker.clone(),
        site.clone(),
        NodeId::new(Role::Facility, "hall-run")
            .map_err(|e| PlayError::Start(format!("observer id: {e}")))?,
    );
    bc.subscriptions = vec![loopwarden_bus::site_filter(site)];
    bc.inbound_capacity = 4096;
    bc.tls = tls;
    Ok(Bus::start(bc))
}

/// The parts the ending stops.
struct Running {
    stop_tx: watch::Sender<bool>,
    agents: Vec<std::thread::JoinHandle<()>>,
    controller: JoinHandle<()>,
    watcher: JoinHandle<CapFigures>,
    observer: Bus,
    observer_task: BusTask,
}

impl Running {
    /// Tells the agents and the controller to stop and waits a while for
    /// each (each leaves the bus: goodbye, then disconnect), then for the
    /// watcher's figures; the observer leaves the bus the same way, and
    /// the CDU's server stops. The embedded broker outlives them all.
    async fn stop(self, served: &JoinHandle<std::io::Result<()>>) -> Option<CapFigures> {
        let _ = self.stop_tx.send(true);
        let agents = self.agents;
        let joined = tokio::task::spawn_blocking(move || {
            for a in agents {
                let _ = a.join();
            }
        });
        let _ = tokio::time::timeout(Duration::from_secs(15), joined).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.controller).await;
        let caps = match tokio::time::timeout(Duration::from_secs(5), self.watcher).await {
            Ok(Ok(caps)) => Some(caps),
            _ => None,
        };
        // It only listens: nothing of its own waits for an ack.
        let _ = self.observer.shutdown(Duration::from_secs(2)).await;
        self.observer_task.join(Duration::from_secs(2)).await;
        served.abort();
        caps
    }
}

/// The run while it plays: the hall stepped in real time (or faster),
/// what the bus says, the trace and what the run saw.
struct Live<'a> {
    cfg: &'a PlayConfig,
    sc: &'a Scenario,
    sim: &'a SimSide,
    host_ids: &'a [String],
    /// Simulated seconds to play.
    duration: u64,
    trace_path: PathBuf,
    trace: std::io::BufWriter<std::fs::File>,
    /// The rows written to the trace.
    rows: Vec<TraceRow>,
    out: PlayOutcome,
    /// The CDU's setpoint as last written, °C.
    setpoint: f64,
    /// The CDU's pump speed as last written, fraction.
    speed: f64,
    /// Per host: its last telemetry showed a cap.
    caps_in_force: BTreeMap<String, bool>,
    /// What is running, the live view's first line.
    banner: String,
    /// The controller's counters, whose last commands say what it
    /// declares (caps, failsafe, lost sensing, lying valve inputs).
    declared: Option<watch::Receiver<ShellStats>>,
}

impl<'a> Live<'a> {
    /// Opens the trace and writes its header.
    fn open(
        cfg: &'a PlayConfig,
        sc: &'a Scenario,
        sim: &'a SimSide,
        host_ids: &'a [String],
        duration: u64,
    ) -> Result<Self, PlayError> {
        let trace_path = cfg.out.join("trace.csv");
        let mut trace =
            std::io::BufWriter::new(std::fs::File::create(&trace_path).map_err(|e| {
                PlayError::Trace {
                    path: trace_path.clone(),
                    source: e,
                }
            })?);
        TraceRow::write_header(&mut trace, true).map_err(|e| PlayError::Trace {
            path: trace_path.clone(),
            source: e,
        })?;
        Ok(Self {
            cfg,
            sc,
            sim,
            host_ids,
            duration,
            trace_path,
            trace,
            rows: Vec::new(),
            out: PlayOutcome::default(),
            setpoint: 18.0,
            speed: 1.0,
            caps_in_force: BTreeMap::new(),
            banner: String::new(),
            declared: None,
        })
    }

    /// The run loop: every 250 ms, steps the hall, hears the bus and writes
    /// a trace row every 5 simulated seconds, until the end of the run (or
    /// 10 minutes past its due time).
    async fn run(
        &mut self,
        inbound: &mut mpsc::Receiver<Inbound>,
        start: Instant,
    ) -> Result<(), PlayError> {
        let duration = self.duration;
        let mut pace = Pace::new(self.cfg.speed, Instant::now());
        let mut next_row = 0.0;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tick.tick().await;
            let (t, row) = self.step_hall(pace.step_s(Instant::now()));
            let cdu = &self.sim.cdu;
            self.setpoint = cdu.setting("supply_setpoint").unwrap_or(self.setpoint);
            self.speed = cdu.setting("pump_speed").map_or(self.speed, |p| p / 100.0);
            // What the bus says.
            while let Ok(msg) = inbound.try_recv() {
                self.hear(&msg, t);
            }
            self.out.max_gpu_c = self.out.max_gpu_c.max(row.max_gpu_c);
            if t >= next_row {
                next_row = t + 5.0;
                self.record(row)?;
            }
            if t >= duration as f64 {
                break;
            }
            if start.elapsed()
                > Duration::from_secs_f64(duration as f64 / self.cfg.speed.max(1e-3) + 600.0)
            {
                break;
            }
        }
        Ok(())
    }

    /// Steps the hall by `dt` simulated seconds; its time after and the
    /// trace row it shows.
    fn step_hall(&self, dt: f64) -> (f64, TraceRow) {
        let declared = self.declared.as_ref().and_then(|rx| {
            let s = rx.borrow();
            s.last.as_ref().map(|c| declared_by(c, self.host_ids.len()))
        });
        let mut h = self.sim.hall.lock().expect("hall lock");
        if let Some(d) = declared {
            h.declare(d);
        }
        if let Err(e) = h.step(dt) {
            tracing::warn!("hall: {e}");
        }
        let t = h.time_s();
        let m = h.plant().meters();
        let hottest = h
            .gpus()
            .iter()
            .filter(|g| !g.shut_down)
            .map(|g| g.t_j)
            .fold(f64::MIN, f64::max);
        (
            t,
            TraceRow {
                t_s: t,
                ambient_c: self.sc.ambient.at(t),
                setpoint_c: self.setpoint,
                supply_c: m.supply_c,
                return_c: m.return_c,
                flow_lpm: m.flow_lpm,
                pump_speed: self.speed,
                max_gpu_c: hottest,
                it_kw: m.it_w / 1000.0,
                facility_kw: m.facility_w / 1000.0,
                caps: self.caps_in_force.values().filter(|c| **c).count() as u32,
                quarantined: Some(self.out.quarantined.len() as u32),
            },
        )
    }

    /// One frame from the bus, heard at simulated time `t`.
    fn hear(&mut self, msg: &Inbound, t: f64) {
        let node = msg.topic.node.to_string();
        match &msg.frame.message {
            Message::HostTelemetry(ht) => self.host_telemetry(node, ht),
            Message::CduTelemetry(_) => self.out.cdu_heard = true,
            Message::HostHealth(hh) => self.host_health(&node, hh, t),
            Message::CduState(st) => self.cdu_state(st, t),
            Message::Event(e @ Event::CoolingAction { step, ok, .. }) => {
                self.out.events.push(format!("t={t:.0}s {node}: {e}"));
                self.cooling_action(&node, *step, *ok)
            }
            Message::Event(e) => {
                if matches!(
                    e,
                    Event::Leak { .. }
                        | Event::CduModeChanged { .. }
                        | Event::PumpTrip { .. }
                        | Event::PumpSeized { .. }
                        | Event::SensorFault { .. }
                        | Event::LeakSensing { .. }
                        | Event::IsolationFailed { .. }
                        | Event::OperatorCleared { .. }
                        | Event::ControllerRestored { .. }
                        | Event::Xid { .. }
                ) {
                    self.out.events.push(format!("t={t:.0}s {node}: {e}"));
                }
            }
            _ => {}
        }
    }

    /// A host's telemetry: the lowest power limit in force, and whether it
    /// shows a cap.
    fn host_telemetry(&mut self, node: String, ht: &HostTelemetry) {
        let out = &mut self.out;
        out.hosts_heard.insert(node.clone());
        let lowest = ht
            .gpus
            .iter()
            .map(|g| f64::from(g.power_limit.0))
            .fold(f64::INFINITY, f64::min);
        let capped = lowest < self.sc.site.gpu.tdp_w - 1.0;
        if lowest.is_finite() {
            out.limits_at_end.insert(node.clone(), lowest);
        }
        self.caps_in_force.insert(node, capped);
        out.peak_hosts_capped_telemetry = out
            .peak_hosts_capped_telemetry
            .max(self.caps_in_force.values().filter(|c| **c).count());
    }

    /// A host's health: the hall drains the GPUs its agent quarantined.
    fn host_health(&mut self, node: &str, hh: &HostHealth, t: f64) {
        let per_host = self.sc.site.gpus_per_host;
        if let Some(h) = self.host_ids.iter().position(|x| *x == node) {
            for g in &hh.gpus {
                let i = h * per_host + g.gpu.get() as usize;
                if g.state == HealthState::Quarantined && self.out.quarantined.insert(i) {
                    self.sim.hall.lock().expect("hall lock").quarantined(i);
                    self.out
                        .events
                        .push(format!("t={t:.0}s {node}: GPU {} quarantined", g.gpu.get()));
                }
            }
        }
    }

    /// A host's agent ran a cooling-loss command: the simulated host
    /// follows what it did (a power-down that failed leaves it running).
    fn cooling_action(&mut self, node: &str, step: CoolingStep, ok: bool) {
        let Some(h) = self.host_ids.iter().position(|x| *x == node) else {
            return;
        };
        let mut hall = self.sim.hall.lock().expect("hall lock");
        match step {
            CoolingStep::PowerDown if ok => {
                hall.host_powered_down(h);
                self.out.hosts_powered_down.insert(node.to_string());
            }
            CoolingStep::PowerUp | CoolingStep::Resume => hall.host_restored(h),
            _ => {}
        }
    }

    /// The CDU's state: which racks it declared lost (their hosts' agents
    /// act on it; the hall follows the agents).
    fn cdu_state(&mut self, st: &CduState, t: f64) {
        for r in &st.racks {
            let rack = r.rack.get() as usize;
            let lost = r.cooling == RackCooling::Lost;
            if lost && self.out.racks_lost.insert(rack) {
                self.out
                    .events
                    .push(format!("t={t:.0}s cdu1: rack {rack} cooling lost"));
            }
        }
    }

    /// Writes `row` to the trace and shows it live (unless headless).
    fn record(&mut self, row: TraceRow) -> Result<(), PlayError> {
        row.write_row(&mut self.trace, true)
            .map_err(|e| PlayError::Trace {
                path: self.trace_path.clone(),
                source: e,
            })?;
        if !self.cfg.headless {
            live(
                &row,
                &self.out,
                &self.banner,
                &self.sc.description,
                self.duration,
            );
        }
        self.rows.push(row);
        Ok(())
    }

    /// The ending: flushes the trace, stops every part, and writes the
    /// report.
    async fn finish(mut self, running: Running) -> Result<PlayOutcome, PlayError> {
        self.trace.flush().map_err(|e| PlayError::Trace {
            path: self.trace_path.clone(),
            source: e,
        })?;
        self.out.cdu_settings = (self.setpoint, self.speed);
        if let Some(caps) = running.stop(&self.sim.served).await {
            self.out.caps = caps;
        }
        let (it_kwh, fac_kwh, work_gpu_h) = {
            let h = self.sim.hall.lock().expect("hall lock");
            self.out.summary = Some(h.summary(&self.cfg.name, "ours"));
            let tt = h.plant().totals();
            self.out.gpu_shutdowns = u64::from(tt.shutdowns);
            (
                tt.it_j / 3.6e6,
                tt.facility_j / 3.6e6,
                tt.work_gpu_s / 3600.0,
            )
        };
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let cfg = self.cfg;
        // The references on the same scenario and length, in simulated
        // time (well under a second for the demo).
        let (sc, duration) = (self.sc.clone(), self.duration);
        let baselines =
            tokio::task::spawn_blocking(move || crate::compare::baselines(&sc, duration))
                .await
                .map_err(|e| PlayError::Start(format!("baselines: {e}")))?
                .map_err(|e| PlayError::Start(format!("baselines: {e}")))?;
        let out = &mut self.out;
        let mut summary = serde_json::json!({
            "scenario": cfg.name,
            "controller": "ours (live)",
            "duration_s": self.duration,
            "it_kwh": it_kwh,
            "facility_kwh": fac_kwh,
            "pue": ratio(fac_kwh, it_kwh),
            "work_gpu_h": work_gpu_h,
            "kwh_per_work_gpu_h": ratio(fac_kwh, work_gpu_h),
            "hosts_heard": out.hosts_heard.len(),
            "quarantined": out.quarantined.len(),
            "racks_lost": out.racks_lost.len(),
        });
        if let Some(m) = summary.as_object_mut() {
            let b = crate::compare::baselines_json(&baselines);
            m.insert(crate::report::BASELINES.into(), b);
        }
        out.report = crate::report::write_report(
            &cfg.out,
            &format!("{} (live run)", cfg.name),
            &self.rows,
            Some(&summary),
        )?;
        Ok(self.out)
    }
}

/// What the controller's commands `c` declare, for a hall of `hosts`
/// hosts.
fn declared_by(c: &cooling_core::Commands, hosts: usize) -> loopwarden_twin::tally::Declared {
    let racks = |mask: u16| (0..16).map(|r| mask & (1 << r) != 0).collect::<Vec<bool>>();
    loopwarden_twin::tally::Declared {
        caps: c.caps.iter().take(hosts).flatten().count(),
        failsafe: c.mode == loopwarden_protocol::message::CduMode::Failsafe,
        sensing_lost: racks(c.sensing_lost),
        feedback_alarms: racks(c.valve_feedback_faults),
    }
}

/// Follows the controller's counters until the controller stops: caps in
/// its commands, acks with a cap in force, and the cap episodes.
pub(crate) async fn watch_caps(
    mut rx: watch::Receiver<ShellStats>,
    start: Instant,
    hall: Arc<Mutex<Hall>>,
    hosts: Vec<String>,
    tdp_w: f64,
) -> CapFigures {
    let mut f = CapFigures::default();
    let mut episode: Option<CapEpisode> = None;
    // Per host, in the episode: when first capped, and whether its ack
    // then already showed a cap (an older ack: wait for a new one).
    let mut capped_at: Vec<Option<(Instant, bool)>> = vec![None; hosts.len()];
    let mut acked: Vec<bool> = vec![false; hosts.len()];
    let mut last_ack_at: Option<Instant> = None;
    let mut last_in_force: BTreeMap<String, Vec<loopwarden_protocol::message::GpuCap>> =
        BTreeMap::new();
    let capped_ack = |caps: &[loopwarden_protocol::message::GpuCap]| {
        caps.iter().any(|c| f64::from(c.limit.0) < tdp_w - 1.0)
    };
    while rx.changed().await.is_ok() {
        let now = Instant::now();
        let st = rx.borrow_and_update().clone();
        let wall = (now - start).as_secs_f64();
        for (h, caps) in &st.in_force {
            if capped_ack(caps) {
                f.hosts_acked_capped.insert(h.clone());
            }
        }
        let in_cmds: Vec<bool> = (0..hosts.len())
            .map(|h| {
                st.last
                    .as_ref()
                    .and_then(|c| c.caps.get(h).copied().flatten())
                    .is_some()
            })
            .collect();
        let n = in_cmds.iter().filter(|c| **c).count();
        f.peak_hosts_capped = f.peak_hosts_capped.max(n);
        if n > 0 && episode.is_none() {
            let t = hall.lock().map(|h| h.time_s()).unwrap_or(0.0);
            episode = Some(CapEpisode {
                start_wall_s: wall,
                start_t_s: t,
                ..Default::default()
            });
            capped_at.iter_mut().for_each(|c| *c = None);
            acked.iter_mut().for_each(|a| *a = false);
        }
        if let Some(e) = episode.as_mut() {
            e.hosts_capped = e.hosts_capped.max(n);
            if n == hosts.len() && e.all_capped_after_s.is_none() {
                e.all_capped_after_s = Some(wall - e.start_wall_s);
            }
            for (h, id) in hosts.iter().enumerate() {
                let ack = st.in_force.get(id);
                let ack_capped = ack.is_some_and(|c| capped_ack(c));
                if in_cmds[h] && capped_at[h].is_none() {
                    capped_at[h] = Some((now, ack_capped));
                }
                let Some((at, stale)) = capped_at[h] else {
                    continue;
                };
                // An ack that was already capped when the host was capped
                // counts once the host's in-force list changes.
                let fresh = !stale || last_in_force.get(id) != ack;
                if !acked[h] && ack_capped && fresh && (at != now || !stale) {
                    acked[h] = true;
                    e.host_ack_s.push((id.clone(), (now - at).as_secs_f64()));
                }
            }
            if e.all_acked_after_s.is_none() && acked.iter().all(|a| *a) {
                e.all_acked_after_s = Some(wall - e.start_wall_s);
            }
            if n == 0 {
                e.end_wall_s = Some(wall);
                f.episodes.extend(episode.take());
            }
        }
        let acks_before = f.last.as_ref().map_or(0, |l| l.acks);
        if n == 0 {
            last_ack_at = None;
        } else if st.acks > acks_before {
            if let Some(t) = last_ack_at {
                f.longest_ack_gap_s = f.longest_ack_gap_s.max((now - t).as_secs_f64());
            }
            last_ack_at = Some(now);
        }
        last_in_force = st.in_force.clone();
        f.last = Some(st);
    }
    f.episodes.extend(episode);
    if let Some(st) = &f.last {
        for (h, id) in hosts.iter().enumerate() {
            if st
                .last
                .as_ref()
                .and_then(|c| c.caps.get(h).copied().flatten())
                .is_some()
            {
                f.capped_at_end.insert(id.clone());
            }
            if st.in_force.get(id).is_some_and(|c| capped_ack(c)) {
                f.acked_capped_at_end.insert(id.clone());
            }
        }
    }
    f
}

/// What the run is: the hall, the broker, the pace and where the results
/// go (the live view's first line; printed once when headless).
fn banner(cfg: &PlayConfig, broker: &BrokerAddr, embedded: bool, duration: u64) -> String {
    let s = &cfg.scenario.site;
    let hosts = s.racks * s.hosts_per_rack;
    let cdus = match s.cdus {
        1 => "one CDU".to_string(),
        n => format!("{n} CDUs"),
    };
    let which = if embedded { "the embedded" } else { "the" };
    format!(
        "Loopwarden: {}: one simulated hall, {hosts} hosts ({} GPUs), {cdus}, {which} MQTT broker at {broker}, speed ×{} ({duration} s of scenario in {}), results in {}/",
        cfg.name,
        hosts * s.gpus_per_host,
        cfg.speed,
        wall_time(duration as f64 / cfg.speed),
        cfg.out.display()
    )
}

/// A wall-clock length as people say it: `about 3 min`, `about 45 s`.
fn wall_time(s: f64) -> String {
    if s >= 90.0 {
        format!("about {:.0} min", s / 60.0)
    } else {
        format!("about {:.0} s", s.max(1.0))
    }
}

/// What the live view's figures mean, in one line.
const LEGEND: &str = "PUE: facility power ÷ IT power (1 would be no cooling at all) · setpoint: the supply water the controller asks the CDU for · capped: hosts whose GPUs are power-capped · quarantined: GPUs their host's agent took out of service";

/// The live view: one screen, redrawn.
fn live(r: &TraceRow, o: &PlayOutcome, banner: &str, what: &str, duration: u64) {
    let pue = if r.it_kw > 0.0 {
        r.facility_kw / r.it_kw
    } else {
        0.0
    };
    let mut s = String::new();
    s.push_str("\x1b[2J\x1b[H");
    s.push_str(&format!(
        "{banner}\n{what}\n  simulated time {:>5.0} / {duration} s\n\n",
        r.t_s
    ));
    s.push_str(&format!(
        "  hall PUE        {pue:>7.3}      IT {:>7.1} kW   facility {:>7.1} kW\n",
        r.it_kw, r.facility_kw
    ));
    s.push_str(&format!(
        "  setpoint        {:>7.1} °C   supply {:>5.1} °C   return {:>5.1} °C\n",
        r.setpoint_c, r.supply_c, r.return_c
    ));
    s.push_str(&format!(
        "  pump speed      {:>7.0} %    flow {:>7.0} L/min   outdoor {:>5.1} °C\n",
        r.pump_speed * 100.0,
        r.flow_lpm,
        r.ambient_c
    ));
    s.push_str(&format!("  hottest GPU     {:>7.1} °C\n", r.max_gpu_c));
    s.push_str(&format!(
        "  hosts capped    {:>7}      GPUs quarantined {:>3}   hosts heard {:>3}\n\n",
        r.caps,
        o.quarantined.len(),
        o.hosts_heard.len()
    ));
    s.push_str(&format!("  {LEGEND}\n\n"));
    s.push_str("  events:\n");
    for e in o
        .events
        .iter()
        .rev()
        .take(8)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
    {
        s.push_str(&format!("    {e}\n"));
    }
    print!("{s}");
    let _ = std::io::stdout().flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controller_is_paced_in_plant_time_and_waits_for_messages_in_real_time() {
        let real = cooling_core::CoreConfig::default();
        let fast = paced(real, 4.0);
        assert_eq!(
            fast.margins.setpoint_rise_k_per_min,
            real.margins.setpoint_rise_k_per_min * 4.0
        );
        assert_eq!(
            fast.margins.speed_fall_per_s,
            real.margins.speed_fall_per_s * 4.0
        );
        assert_eq!(fast.timing.boot_settle_ms, real.timing.boot_settle_ms / 4);
        assert_eq!(
            fast.timing.optimise_every_ms,
            real.timing.optimise_every_ms / 4
        );
        assert_eq!(fast.timing.cap_release_ms, real.timing.cap_release_ms / 4);
        assert_eq!(fast.timing.host_timeout_ms, real.timing.host_timeout_ms);
        assert_eq!(fast.timing.sensor_timeout_ms, real.timing.sensor_timeout_ms);
        assert_eq!(paced(real, 1.0), real);
    }

    #[test]
    fn wall_times_read_as_people_say_them() {
        assert_eq!(wall_time(600.0 / 3.3), "about 3 min");
        assert_eq!(wall_time(9.0), "about 9 s");
        assert_eq!(wall_time(0.2), "about 1 s");
    }
}
