//! `loopwarden-hall fleet`: many real host agents and cooling controllers
//! in one process, at 1 Hz real time, measured.
//!
//! It runs `hosts` real node agents (the real shell, bus client, health
//! engine and caps; GPUs from the twin through the same `GpuSource` and
//! `GpuDevice` traits as NVML) and `cdus` real cooling controllers, each
//! with its own simulated CDU on its own loopback Modbus TCP port and its
//! own hall of its share of the hosts (`layout`). Every hall runs full
//! load on a hot day; GPUs fail (XID 79, as a scenario's `gpu_fail`) on a
//! spread of hosts at spread times, and in enough CDUs the lead pump trips
//! with the lag pump seized, so that their controllers cap their hosts.
//!
//! The agents are tasks on one shared multi-thread runtime (`agent-rt`,
//! a few worker threads), not a thread and a runtime each; the hall's GPUs
//! answer from memory, so the agents call them without a thread per GPU
//! (`node_agent::worker`), and one XID watch per hall serves every host
//! of it. The controllers, the simulated CDUs and the halls' stepping run
//! on a runtime of their own (`fleet-rt`), and an independent subscriber
//! (`observer`) on a thread of its own, so that the agents' CPU can be
//! told apart (`procstat`).
//!
//! The order of a run: the broker (embedded unless given), the observer,
//! the halls (stepped once, so that their CDUs read plausibly), the
//! controllers, the agents; once every agent is connected the halls step
//! in real time for `duration_s`; then the agents stop, the controllers
//! stop, and the observer waits for the last messages. What each figure
//! means is in the `report` submodule and `docs/scale.md`.
//!
//! Glossary:
//! - *injection*: a GPU the hall failed; its instant is taken right after
//!   the hall step that failed it.
//! - *shortfall CDU*: one whose pumps fail (see `layout`).

mod agents;
mod figures;
mod isolated;
mod layout;
mod observer;
mod procstat;
mod report;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use loopwarden_bus::embedded::EmbeddedBroker;
use loopwarden_bus::{BrokerAddr, MetricsSnapshot};
use loopwarden_protocol::{Family, Ident};
use loopwarden_twin::scenario::Scenario;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::play::{CapFigures, ControllerSide, PlayOptions};
use crate::sim_side::SimSide;

pub use layout::{plan, CduLayout};
pub use report::FleetReport;

/// The halls' outdoor temperature by default, °C: warm, and cool enough
/// that a CDU of 125 hosts at full load needs no caps unless its pumps
/// fail.
pub const DEFAULT_AMBIENT_C: f64 = 25.0;
/// Hosts the shortfall must cap at least.
const CAPPED_HOSTS_WANTED: usize = 128;
/// How often the halls step, ms.
const STEP_MS: u64 = 100;
/// The longest the agents may take to connect, s.
const CONNECT_LIMIT_S: u64 = 180;

/// What to run.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Host agents.
    pub hosts: usize,
    /// Cooling controllers.
    pub cdus: usize,
    /// Seconds the halls run once every agent is connected.
    pub duration_s: u64,
    /// Brokers (a cluster's nodes); empty: the embedded broker.
    pub brokers: Vec<BrokerAddr>,
    /// The observer's broker (default: the last of `brokers`, or the
    /// embedded one).
    pub observer_broker: Option<BrokerAddr>,
    /// GPUs to fail (default: one host in ten, at least two, at most
    /// `hosts`).
    pub xids: Option<usize>,
    /// CDUs whose pumps fail (default: the fewest that hold 128 hosts).
    pub shortfall_cdus: Option<usize>,
    /// When the pumps fail, s into the run (default: a tenth of it).
    pub shortfall_at_s: Option<u64>,
    /// Worker threads of the agents' runtime.
    pub agent_threads: usize,
    /// Each agent as on a host of its own, for comparison: its own thread
    /// and runtime, a thread per GPU and its own XID watch.
    pub isolated_agents: bool,
    /// Folder for the agents' flash files and console sockets (default: a
    /// fresh one in the temporary folder, removed at the end).
    pub out: Option<PathBuf>,
    /// Each agent's flash in memory, as an agent without a flash file
    /// keeps it, instead of a file: no agent waits on the shared disk.
    pub flash_in_memory: bool,
    /// Outdoor temperature of every hall, °C.
    pub ambient_c: f64,
}

impl FleetConfig {
    /// `hosts` agents on `cdus` controllers for `duration_s`, the rest by
    /// default.
    pub fn new(hosts: usize, cdus: usize, duration_s: u64) -> Self {
        Self {
            hosts,
            cdus,
            duration_s,
            brokers: Vec::new(),
            observer_broker: None,
            xids: None,
            shortfall_cdus: None,
            shortfall_at_s: None,
            agent_threads: 2,
            isolated_agents: false,
            out: None,
            flash_in_memory: false,
            ambient_c: DEFAULT_AMBIENT_C,
        }
    }

    /// GPUs to fail: `xids`, or by default one host in ten, at least two
    /// and at most one per host.
    fn xids(&self) -> usize {
        self.xids
            .unwrap_or_else(|| (self.hosts / 10).max(2).min(self.hosts))
    }

    /// The faults of the run on `layouts`.
    fn fault_plan(&self, layouts: &[CduLayout]) -> layout::FaultPlan {
        let d = self.duration_s;
        let xids = self.xids();
        // From a twentieth of the run (at most 30 s) to 10 s before its end.
        let from = (d / 20).clamp(1, 30);
        let until = d.saturating_sub(10).max(from);
        let k = self
            .shortfall_cdus
            .unwrap_or_else(|| layout::cdus_for_hosts(layouts, CAPPED_HOSTS_WANTED));
        let at = self.shortfall_at_s.unwrap_or((d / 10).max(1));
        layout::faults(layouts, xids, (from, until), k, at)
    }
}

/// Why the run did not happen.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// What was asked cannot be built.
    #[error("{0}")]
    Refused(String),
    /// A part would not start.
    #[error("{0}")]
    Start(String),
}

fn start_err(e: impl std::fmt::Display) -> FleetError {
    FleetError::Start(e.to_string())
}

/// Runs the fleet and measures it.
pub fn run(cfg: &FleetConfig) -> Result<FleetReport, FleetError> {
    let layouts = layout::plan(cfg.hosts, cfg.cdus).map_err(FleetError::Refused)?;
    refuse_flags(cfg)?;
    let plan = cfg.fault_plan(&layouts);
    raise_open_files(cfg.hosts)?;
    let (out, temporary) = out_folder(cfg, &layouts, &std::env::temp_dir())?;
    let measured = run_in(cfg, &layouts, &plan, &out);
    if temporary {
        let _ = std::fs::remove_dir_all(&out);
    }
    measured
}

/// Refuses flags that cannot make a run, naming them.
fn refuse_flags(cfg: &FleetConfig) -> Result<(), FleetError> {
    if cfg.duration_s == 0 || cfg.agent_threads == 0 {
        return Err(FleetError::Refused(
            "--duration and --agent-threads must be at least 1".into(),
        ));
    }
    if !(-20.0..=50.0).contains(&cfg.ambient_c) {
        return Err(FleetError::Refused(format!(
            "--ambient-c {}: from -20 to 50 °C",
            cfg.ambient_c
        )));
    }
    if let Some(at) = cfg.shortfall_at_s.filter(|&at| at >= cfg.duration_s) {
        return Err(FleetError::Refused(format!(
            "--shortfall-at {at}: the pump trip would come at or after the run's end \
             (--duration {}); give a time before it",
            cfg.duration_s
        )));
    }
    if let (Some(o), true) = (&cfg.observer_broker, cfg.brokers.is_empty()) {
        return Err(FleetError::Refused(format!(
            "--observer-broker {o} without --broker: the agents and controllers would \
             publish on the embedded broker, which the observer would not hear; give \
             --broker too, or neither"
        )));
    }
    refuse_faults(cfg)
}

/// Raises the open-file limit for `hosts` agents, or refuses the run
/// where the hard limit is too low. Per agent: its two bus sockets, the
/// main one and the presence one (and the broker's ends when embedded),
/// its flash file and its console socket.
fn raise_open_files(hosts: usize) -> Result<(), FleetError> {
    let want = 6 * hosts as libc::rlim_t + 256;
    let nofile = procstat::raise_nofile(want);
    if nofile < want {
        return Err(FleetError::Refused(format!(
            "{hosts} hosts need about {want} open files; the limit is {nofile} (raise `ulimit -Hn`)"
        )));
    }
    Ok(())
}

/// Runs the fleet with the agents' files in `out`: the brokers, the
/// observer, the parts (`run_parts`), the wait for the last messages.
fn run_in(
    cfg: &FleetConfig,
    layouts: &[CduLayout],
    plan: &layout::FaultPlan,
    out: &std::path::Path,
) -> Result<FleetReport, FleetError> {
    let broker = Brokers::start(cfg)?;
    let observer =
        observer::Observer::start(&broker.observer, &broker.site).map_err(FleetError::Start)?;
    let main_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("fleet-rt")
        .enable_all()
        .build()
        .map_err(start_err)?;
    let agents_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.agent_threads)
        .thread_name("agent-rt")
        // Threads that end take their CPU time with them: keep them.
        .thread_keep_alive(Duration::from_secs(86_400))
        .enable_all()
        .build()
        .map_err(start_err)?;
    let ran = main_rt.block_on(run_parts(
        cfg,
        layouts,
        plan,
        &broker,
        out,
        agents_rt.handle(),
        &observer,
    ))?;
    let heard = hear_the_last(observer, &ran);
    agents_rt.shutdown_timeout(Duration::from_secs(5));
    main_rt.shutdown_timeout(Duration::from_secs(5));
    Ok(ran.report(cfg, layouts, plan, &broker, &heard))
}

/// Waits for the last messages of the run, names on stderr the
/// acknowledged events still missing, and stops the observer.
fn hear_the_last(observer: observer::Observer, ran: &Ran) -> observer::Heard {
    let published = ran.published();
    let missing = |h: &observer::Heard| figures::unrepaired_events(&ran.acked, h).count();
    observer.settle(
        |h| h.received >= published && missing(h) == 0,
        Duration::from_secs(3),
        Duration::from_secs(20),
    );
    // A broker sends a QoS 1 message again only after its ack wait (NATS:
    // 30 s, deploy/nats/node.conf): an acknowledged event still missing
    // gets that long to come.
    if observer.with(|h| missing(h)) > 0 {
        observer.settle(
            |h| missing(h) == 0,
            Duration::from_secs(35),
            Duration::from_secs(60),
        );
    }
    observer.with(|h| say_missing(&ran.acked, h));
    observer.stop()
}

/// Refuses more faults than the fleet has room for: one GPU failed per
/// host (`--xids` at most `--hosts`), `--shortfall-cdus` at most
/// `--cdus`. The defaults fit: `FleetConfig::xids` is at most
/// `--hosts`, and the default shortfall CDUs are of those the fleet has.
fn refuse_faults(cfg: &FleetConfig) -> Result<(), FleetError> {
    if let Some(x) = cfg.xids.filter(|&x| x > cfg.hosts) {
        return Err(FleetError::Refused(format!(
            "--xids {x}: one GPU fails per host, so at most --hosts ({})",
            cfg.hosts
        )));
    }
    if let Some(k) = cfg.shortfall_cdus.filter(|&k| k > cfg.cdus) {
        return Err(FleetError::Refused(format!(
            "--shortfall-cdus {k}: at most --cdus ({})",
            cfg.cdus
        )));
    }
    Ok(())
}

/// The folder for the agents' flash files and console sockets, and
/// whether it is the run's own (removed at the end): `--out`, refused
/// where it holds an earlier run's flash, or by default a fresh folder
/// under `tmp`.
fn out_folder(
    cfg: &FleetConfig,
    layouts: &[CduLayout],
    tmp: &std::path::Path,
) -> Result<(PathBuf, bool), FleetError> {
    match &cfg.out {
        Some(d) => {
            if !cfg.flash_in_memory {
                refuse_used_out(d, layouts)?;
            }
            Ok((d.clone(), false))
        }
        None => fresh_folder(tmp).map(|d| (d, true)),
    }
}

/// A folder under `tmp` made here, `loopwarden-fleet-<pid>-<n>`: never one
/// an earlier run left (one killed before its end keeps its folder, and
/// a later run may get the same process id), whose flash would restore
/// that run's quarantines.
fn fresh_folder(tmp: &std::path::Path) -> Result<PathBuf, FleetError> {
    let pid = std::process::id();
    for n in 0..1000 {
        let d = tmp.join(format!("loopwarden-fleet-{pid}-{n}"));
        match std::fs::create_dir(&d) {
            Ok(()) => return Ok(d),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(FleetError::Start(format!(
                    "the run's folder {}: {e}",
                    d.display()
                )))
            }
        }
    }
    Err(FleetError::Start(format!(
        "no new folder for the run in {}: loopwarden-fleet-{pid}-0 to -999 are taken \
         (left by killed runs); remove them or give --out",
        tmp.display()
    )))
}

/// Refuses an `--out` that holds a host's flash file from an earlier run:
/// its agent would restore that run's quarantines (the GPUs are named the
/// same in every run) and publish them before the hall fails anything.
/// Nothing of the user's is deleted: an empty folder is asked for.
fn refuse_used_out(out: &std::path::Path, layouts: &[CduLayout]) -> Result<(), FleetError> {
    let used = layouts
        .iter()
        .flat_map(|l| &l.host_ids)
        .map(|id| out.join(id).join("flash.bin"))
        .find(|f| f.exists());
    match used {
        Some(f) => Err(FleetError::Refused(format!(
            "--out {}: it holds an earlier run's flash ({}), whose quarantines the \
             agents would restore; give an empty or new folder",
            out.display(),
            f.display()
        ))),
        None => Ok(()),
    }
}

/// The brokers of the run.
struct Brokers {
    /// The embedded broker, kept while the run lasts.
    _embedded: Option<EmbeddedBroker>,
    /// What the agents and the controllers are given.
    value: String,
    /// What the report says.
    label: String,
    /// The observer's.
    observer: BrokerAddr,
    /// The site's name on the bus (fresh for every run, so nothing
    /// retained by an earlier run is counted).
    site: String,
}

impl Brokers {
    fn start(cfg: &FleetConfig) -> Result<Self, FleetError> {
        let site = format!("fleet-{}", std::process::id());
        if cfg.brokers.is_empty() {
            let e = EmbeddedBroker::start("127.0.0.1:0".parse().expect("an address"))
                .map_err(|e| FleetError::Start(format!("embedded broker: {e}")))?;
            let b = e.broker_addr();
            return Ok(Self {
                value: b.to_string(),
                label: format!("embedded ({b})"),
                observer: cfg.observer_broker.clone().unwrap_or(b),
                _embedded: Some(e),
                site,
            });
        }
        let value = cfg
            .brokers
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let last = cfg.brokers.last().expect("not empty").clone();
        Ok(Self {
            _embedded: None,
            label: value.clone(),
            value,
            observer: cfg.observer_broker.clone().unwrap_or(last),
            site,
        })
    }
}

/// One CDU of the run: its hall behind its simulated CDU, its controller
/// and the watcher of the controller's counters.
struct CduPart {
    sim: SimSide,
    /// Each GPU failed so far.
    failed: Vec<bool>,
    controller: JoinHandle<()>,
    watcher: JoinHandle<CapFigures>,
}

/// Names the first acknowledged events the observer never had, neither
/// from the broker nor resent, with the highest frame it heard from their
/// senders: an error (printed at the fleet command's default log level),
/// since the broker took them.
fn say_missing(acked: &[(String, Vec<u32>)], heard: &observer::Heard) {
    let mut said = 0;
    for (id, seq) in figures::unrepaired_events(acked, heard) {
        if said < 20 {
            let last = heard
                .senders
                .get(&format!("host/{id}"))
                .and_then(observer::SeqTrack::highest);
            tracing::error!(
                "fleet: host {id}'s event, frame {seq}, was acknowledged by the broker and never received, nor resent (last frame heard: {last:?})"
            );
        }
        said += 1;
    }
    if said > 20 {
        tracing::error!(
            "fleet: {} more acknowledged events never received",
            said - 20
        );
    }
}

/// What the run left to report.
struct Ran {
    agents_start_s: f64,
    wall_s: f64,
    agent_cpu_s: f64,
    agent_threads: usize,
    cpu_by_part_s: Vec<(String, f64)>,
    rss_before_kib: u64,
    rss_end_kib: u64,
    load_start: f64,
    load_end: f64,
    /// Each agent's bus counters at the end, by host id.
    agents: Vec<(String, MetricsSnapshot)>,
    /// Each agent's events the broker acknowledged, by host id and
    /// sequence number.
    acked: Vec<(String, Vec<u32>)>,
    /// The same for its acks (the other frames of its outbox).
    acks_acked: Vec<(String, Vec<u32>)>,
    /// Each controller's caps and bus counters at the end.
    controllers: Vec<(String, CapFigures)>,
    /// CDUs whose cap watcher did not end (their figures are empty).
    caps_lost: Vec<String>,
    /// When each (host, GPU) was failed.
    injected: HashMap<(String, u8), Instant>,
    /// Agents that ended before the stop, or whose task failed.
    agents_ended_early: Vec<String>,
    /// The same of the controllers, by CDU.
    controllers_ended_early: Vec<String>,
}

/// Starts every part, runs the halls for the duration and stops the
/// parts, in the order of the module's description.
async fn run_parts(
    cfg: &FleetConfig,
    layouts: &[CduLayout],
    plan: &layout::FaultPlan,
    broker: &Brokers,
    out: &std::path::Path,
    agents_rt: &tokio::runtime::Handle,
    observer: &observer::Observer,
) -> Result<Ran, FleetError> {
    let (ctrl_stop, ctrl_stop_rx) = watch::channel(false);
    let mut cdus = start_cdus(cfg, layouts, plan, broker, &ctrl_stop_rx).await?;
    let pre: HashMap<u32, procstat::ThreadTicks> = procstat::threads()
        .into_iter()
        .map(|t| (t.tid, t))
        .collect();
    let rss_before_kib = procstat::rss_kib();
    let begun = Instant::now();
    let agents = agents::Agents::start(
        layouts,
        &cdus,
        broker,
        out,
        agents_rt,
        (cfg.isolated_agents, !cfg.flash_in_memory),
    )
    .await?;
    let agents_start_s = begun.elapsed().as_secs_f64();
    let cpu_start = procstat::threads();
    let load_start = report::load_avg();
    // A progress line, whatever the log level: a procedure times its
    // steps from it (docs/scale.md, "Broker cluster").
    eprintln!(
        "fleet: every agent connected in {agents_start_s:.1} s; the halls run for {} s",
        cfg.duration_s
    );
    let t0 = Instant::now();
    let injected = step_halls(&mut cdus, layouts, cfg.duration_s).await;
    let wall_s = t0.elapsed().as_secs_f64();
    let cpu_end = procstat::threads();
    let rss_end_kib = procstat::rss_kib();
    let load_end = report::load_avg();
    let_repairs_finish(observer).await;
    let (agent_cpu_s, agent_threads) = procstat::agent_cpu_s(&pre, &cpu_start, &cpu_end);
    let cpu_by_part_s = procstat::cpu_by_group(&pre, &cpu_start, &cpu_end);
    let mut acked = Vec::new();
    let mut acks_acked = Vec::new();
    let mut metrics = Vec::new();
    let (stopped, agents_ended_early) = agents.stop().await;
    for (id, m, ledger) in stopped {
        let of = |f| {
            ledger
                .iter()
                .filter(|(_, g)| *g == f)
                .map(|(s, _)| *s)
                .collect()
        };
        acked.push((id.clone(), of(Family::Event)));
        acks_acked.push((id.clone(), of(Family::Ack)));
        metrics.push((id, m));
    }
    let agents = metrics;
    let controllers_ended = cdus
        .iter()
        .zip(layouts)
        .filter(|(c, _)| c.controller.is_finished())
        .map(|(_, l)| l.name.clone())
        .collect();
    let _ = ctrl_stop.send(true);
    let (controllers, caps_lost, controllers_ended_early) =
        stop_controllers(cdus, layouts, controllers_ended).await;
    Ok(Ran {
        agents_start_s,
        wall_s,
        agent_cpu_s,
        agent_threads,
        cpu_by_part_s,
        rss_before_kib,
        rss_end_kib,
        load_start,
        load_end,
        agents,
        acked,
        acks_acked,
        controllers,
        caps_lost,
        injected,
        agents_ended_early,
        controllers_ended_early,
    })
}

/// Gives the observer's requests to resend time to be answered while the
/// agents still run: until none has waited at two looks 2.5 s apart (its
/// asker looks every 2 s), at most 30 s.
async fn let_repairs_finish(observer: &observer::Observer) {
    let until = Instant::now() + Duration::from_secs(30);
    let mut quiet = 0;
    while quiet < 2 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        quiet = match observer.with(|h| h.repairs_waiting()) {
            0 => quiet + 1,
            _ => 0,
        };
    }
}

/// Starts every CDU's hall behind its simulated CDU, and its controller;
/// returns once every controller runs (and has its flash threads).
async fn start_cdus(
    cfg: &FleetConfig,
    layouts: &[CduLayout],
    plan: &layout::FaultPlan,
    broker: &Brokers,
    stop_rx: &watch::Receiver<bool>,
) -> Result<Vec<CduPart>, FleetError> {
    let site = Ident::new(&broker.site).map_err(start_err)?;
    let mut cdus = Vec::new();
    for (c, l) in layouts.iter().enumerate() {
        let toml = layout::scenario_toml(c, l, plan, cfg.duration_s, cfg.ambient_c);
        let sc = Scenario::from_toml(&toml, &format!("{}.toml", l.name)).map_err(start_err)?;
        let sim = SimSide::start(&sc).await.map_err(start_err)?;
        // One millisecond, so that the CDU's registers read plausibly
        // while the agents start.
        let n = {
            let mut h = sim.hall.lock().expect("hall");
            h.step(1e-3).map_err(start_err)?;
            h.gpus().len()
        };
        let side = ControllerSide {
            site: &site,
            cdu: &l.name,
            broker: &broker.value,
            pki: None,
            host_ids: &l.host_ids,
            sim: &sim,
            clear_leaks: &[],
            flash: None,
        };
        let (_, controller, watcher, _) = side
            .start(&sc, &PlayOptions::default(), stop_rx)
            .map_err(start_err)?;
        cdus.push(CduPart {
            sim,
            failed: vec![false; n],
            controller,
            watcher,
        });
    }
    controllers_settled(layouts.len()).await;
    match cdus
        .iter()
        .zip(layouts)
        .find(|(c, _)| c.controller.is_finished())
    {
        Some((_, l)) => Err(FleetError::Start(format!(
            "the controller of {} ended at its start (see the log above)",
            l.name
        ))),
        None => Ok(cdus),
    }
}

/// Waits (at most 10 s) until every controller has its flash recorder
/// and its outbox acker, so that those threads started before the
/// agents' and are not counted as theirs.
async fn controllers_settled(cdus: usize) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let t = procstat::threads();
        let count = |n: &str| t.iter().filter(|t| t.name == n).count();
        if (count("recorder") >= cdus && count("bus-acker") >= cdus) || Instant::now() > until {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Steps every hall in real time for `duration_s`; returns when each GPU
/// the halls failed was failed (right after the step that failed it).
async fn step_halls(
    cdus: &mut [CduPart],
    layouts: &[CduLayout],
    duration_s: u64,
) -> HashMap<(String, u8), Instant> {
    let mut injected = HashMap::new();
    let start = Instant::now();
    let mut last = start;
    let mut tick = tokio::time::interval(Duration::from_millis(STEP_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while start.elapsed() < Duration::from_secs(duration_s) {
        tick.tick().await;
        let now = Instant::now();
        let dt = (now - last).as_secs_f64();
        last = now;
        for (part, l) in cdus.iter_mut().zip(layouts) {
            step_one(part, l, dt, &mut injected);
        }
    }
    injected
}

/// Steps one hall by `dt` s and notes the GPUs it failed.
fn step_one(
    part: &mut CduPart,
    l: &CduLayout,
    dt: f64,
    injected: &mut HashMap<(String, u8), Instant>,
) {
    let mut h = part.sim.hall.lock().expect("hall");
    if let Err(e) = h.step(dt) {
        tracing::warn!("{}: hall: {e}", l.name);
    }
    let now = Instant::now();
    let per_host = h.plant().site().gpus_per_host;
    for (i, (was, is)) in part.failed.iter_mut().zip(h.failed()).enumerate() {
        if *is && !*was {
            *was = true;
            let host = l.host_ids[i / per_host].clone();
            injected.insert((host, (i % per_host) as u8), now);
        }
    }
}

/// Stops the controllers (already told) and their watchers; their caps
/// and bus counters, by CDU, the CDUs whose watcher did not end (the
/// report names them: their figures are lost, not zero), and `ended`
/// (the CDUs whose controller ended before it was told to stop) with
/// those whose controller's task failed.
async fn stop_controllers(
    cdus: Vec<CduPart>,
    layouts: &[CduLayout],
    mut ended: Vec<String>,
) -> (Vec<(String, CapFigures)>, Vec<String>, Vec<String>) {
    let (mut out, mut lost) = (Vec::new(), Vec::new());
    for (part, l) in cdus.into_iter().zip(layouts) {
        match tokio::time::timeout(Duration::from_secs(10), part.controller).await {
            Err(_) => tracing::error!("{}: the controller did not stop within 10 s", l.name),
            Ok(Err(e)) => {
                tracing::error!("{}: the controller: {e}", l.name);
                if !ended.contains(&l.name) {
                    ended.push(l.name.clone());
                }
            }
            Ok(Ok(())) => {}
        }
        let caps = match tokio::time::timeout(Duration::from_secs(5), part.watcher).await {
            Ok(Ok(caps)) => caps,
            _ => {
                tracing::warn!("{}: the cap watcher did not end", l.name);
                lost.push(l.name.clone());
                CapFigures::default()
            }
        };
        part.sim.served.abort();
        out.push((l.name.clone(), caps));
    }
    (out, lost, ended)
}

impl Ran {
    /// Messages every client handed to the broker.
    fn published(&self) -> u64 {
        self.agents.iter().map(|(_, m)| m.published).sum::<u64>()
            + self
                .controllers
                .iter()
                .map(|(_, c)| ctrl_bus(c).published)
                .sum::<u64>()
    }
}

/// A controller's bus counters, as its last counters tell them.
fn ctrl_bus(c: &CapFigures) -> MetricsSnapshot {
    c.last
        .as_ref()
        .and_then(|s| s.status.as_ref())
        .map(|s| s.bus)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shortfall_at_or_past_the_end_of_the_run_is_refused_by_its_flag() {
        for at in [60, 900] {
            let cfg = FleetConfig {
                shortfall_at_s: Some(at),
                ..FleetConfig::new(4, 1, 60)
            };
            match run(&cfg) {
                Err(FleetError::Refused(e)) => {
                    assert!(e.contains(&format!("--shortfall-at {at}")), "{e}");
                    assert!(e.contains("--duration 60"), "{e}");
                }
                other => panic!("--shortfall-at {at}: {other:?}"),
            }
        }
    }

    #[test]
    fn more_faults_than_the_fleet_holds_are_refused_by_their_flags() {
        let xids = FleetConfig {
            xids: Some(5),
            ..FleetConfig::new(4, 1, 60)
        };
        let cdus = FleetConfig {
            shortfall_cdus: Some(3),
            ..FleetConfig::new(4, 2, 60)
        };
        for (cfg, want) in [
            (
                xids,
                "--xids 5: one GPU fails per host, so at most --hosts (4)",
            ),
            (cdus, "--shortfall-cdus 3: at most --cdus (2)"),
        ] {
            match run(&cfg) {
                Err(FleetError::Refused(e)) => assert_eq!(e, want),
                other => panic!("{want}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_default_xids_fit_the_fleet_and_fail_as_many_gpus_as_said() {
        for (hosts, want) in [(1, 1), (2, 2), (5, 2), (40, 4)] {
            let cfg = FleetConfig::new(hosts, 1, 60);
            assert_eq!(cfg.xids(), want, "--hosts {hosts}");
            assert!(refuse_faults(&cfg).is_ok(), "--hosts {hosts}");
            let layouts = layout::plan(hosts, 1).unwrap();
            assert_eq!(cfg.fault_plan(&layouts).injections.len(), want);
        }
    }

    #[test]
    fn the_default_folder_is_new_never_one_a_killed_run_left() {
        // A run killed before its end leaves its folder and flash; a later
        // run may get the same process id.
        let tmp = std::env::temp_dir().join(format!("fleet-tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let pid = std::process::id();
        let left = [
            format!("loopwarden-fleet-{pid}"),
            format!("loopwarden-fleet-{pid}-0"),
        ]
        .map(|d| tmp.join(d));
        for d in &left {
            std::fs::create_dir_all(d.join("c1r0h0")).unwrap();
            std::fs::write(d.join("c1r0h0/flash.bin"), b"kept").unwrap();
        }
        let cfg = FleetConfig::new(2, 1, 60);
        let layouts = layout::plan(2, 1).unwrap();
        let (out, temporary) = out_folder(&cfg, &layouts, &tmp).unwrap();
        let entries = std::fs::read_dir(&out).map(|d| d.count());
        let _ = std::fs::remove_dir_all(&tmp);
        assert!(temporary);
        assert!(!left.contains(&out), "{}", out.display());
        assert!(out.starts_with(&tmp), "{}", out.display());
        assert_eq!(
            entries.ok(),
            Some(0),
            "{}: made new and empty",
            out.display()
        );
    }

    #[test]
    fn an_observer_broker_without_brokers_is_refused_by_its_flags() {
        let cfg = FleetConfig {
            observer_broker: Some("127.0.0.1:1".parse().unwrap()),
            ..FleetConfig::new(4, 1, 60)
        };
        match run(&cfg) {
            Err(FleetError::Refused(e)) => {
                assert!(e.contains("--observer-broker 127.0.0.1:1"), "{e}");
                assert!(e.contains("without --broker"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
}
