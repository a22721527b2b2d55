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
//!
//! Here are what a play is given and returns, and the play loop: the hall
//! stepped, the trace written, the ending and the report. The parts:
//! `play/spawn.rs` starts the broker, the agents and the controller;
//! `play/controller.rs` runs and restarts the controller;
//! `play/observer.rs` hears the bus and tallies what it and the
//! controller's counters say; `play/view.rs` is the live view.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cooling_ctrl::shell::ShellStats;
use loopwarden_bus::{BrokerAddr, Bus, BusTask, Inbound};
use loopwarden_protocol::Ident;
use loopwarden_twin::scenario::Scenario;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::sim_side::{at_speed, Pace, SimSide};
use crate::trace::TraceRow;

mod controller;
mod observer;
mod spawn;
mod summary;
mod view;

use controller::fresh_file;
use observer::start_observer;
pub(crate) use spawn::ControllerSide;
use spawn::{start_agents, start_broker};
use view::{banner, live};

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
    /// Simulated seconds played (whole): the run's length, or less where
    /// it stopped 10 minutes past its due time with the hall behind.
    pub played_s: u64,
}

/// Caps as the controller's counters ([`ShellStats`]) tell them.
#[derive(Debug, Clone, Default)]
pub struct CapFigures {
    /// The counters as the controller last reported them.
    pub last: Option<ShellStats>,
    /// Most hosts the controller's commands capped at once.
    pub peak_hosts_capped: usize,
    /// Hosts the controller's commands capped at some time.
    pub hosts_ever_capped: BTreeSet<String>,
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
    /// The hosts capped in it, in the order first capped.
    pub hosts: Vec<String>,
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
        // Waited for here, not joined on a blocking thread: the runtime
        // would wait for that thread at its end, with no limit.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        for a in self.agents {
            while !a.is_finished() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if a.is_finished() {
                let _ = a.join();
            } else {
                tracing::warn!("play: a node agent did not stop within 15 s: left running");
            }
        }
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
    /// The hall's time when the run loop last stepped it, s.
    hall_s: f64,
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
    /// GPUs quarantined now (global index), as their hosts' health last
    /// said.
    quarantined_now: BTreeSet<usize>,
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
            hall_s: 0.0,
            trace_path,
            trace,
            rows: Vec::new(),
            out: PlayOutcome::default(),
            setpoint: 18.0,
            speed: 1.0,
            caps_in_force: BTreeMap::new(),
            quarantined_now: BTreeSet::new(),
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
            // The last step ends at the run's length, not past it: the
            // figures and the baselines then cover the same seconds.
            let left = (duration as f64 - self.hall_s).max(0.0);
            let (t, row) = self.step_hall(pace.step_s(Instant::now()).min(left));
            self.hall_s = t;
            let cdu = &self.sim.cdu;
            self.setpoint = cdu.setting("supply_setpoint").unwrap_or(self.setpoint);
            self.speed = cdu.setting("pump_speed").map_or(self.speed, |p| p / 100.0);
            // What the bus says.
            while let Ok(msg) = inbound.try_recv() {
                self.hear(&msg, t);
            }
            if let Some(c) = row.max_gpu_c {
                self.out.max_gpu_c = self.out.max_gpu_c.max(c);
            }
            if t >= next_row {
                next_row = t + 5.0;
                self.record(row)?;
            }
            if t >= duration as f64 - END_SLACK_S {
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
        // Only a running controller's commands declare anything: while
        // it is down (or before its first commands) nothing is counted.
        let declared = self.declared.as_ref().and_then(|rx| {
            let s = rx.borrow();
            s.last.as_ref().map(|c| declared_by(c, self.host_ids.len()))
        });
        let mut h = self.sim.hall.lock().expect("hall lock");
        h.declare(declared);
        if let Err(e) = h.step(dt) {
            tracing::warn!("hall: {e}");
        }
        let t = h.time_s();
        let m = h.plant().meters();
        let hottest = summary::hottest(h.gpus());
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
                quarantined: Some(self.hosts_quarantined()),
            },
        )
    }

    /// Hosts with a GPU quarantined now.
    fn hosts_quarantined(&self) -> u32 {
        let per_host = self.sc.site.gpus_per_host.max(1);
        let hosts: BTreeSet<usize> = self.quarantined_now.iter().map(|i| i / per_host).collect();
        hosts.len() as u32
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
        let hall_summary = {
            let h = self.sim.hall.lock().expect("hall lock");
            self.out.gpu_shutdowns = u64::from(h.plant().totals().shutdowns);
            h.summary(&self.cfg.name, "ours")
        };
        self.out.summary = Some(hall_summary.clone());
        let cfg = self.cfg;
        // The references on the same scenario and the length played, in
        // simulated time (well under a second for the demo).
        let (played_s, short) = played(self.hall_s, self.duration);
        self.out.played_s = played_s;
        let sc = self.sc.clone();
        let baselines =
            tokio::task::spawn_blocking(move || crate::compare::baselines(&sc, played_s))
                .await
                .map_err(|e| PlayError::Start(format!("baselines: {e}")))?
                .map_err(|e| PlayError::Start(format!("baselines: {e}")))?;
        let out = &mut self.out;
        let summary = summary::report_summary(
            &hall_summary,
            &summary::LiveFigures {
                played_s,
                note: short,
                hosts_heard: out.hosts_heard.len(),
                quarantined: out.quarantined.len(),
                racks_lost: out.racks_lost.len(),
                baselines: &crate::compare::baselines_json(&baselines),
            },
        );
        out.report = crate::report::write_report(
            &cfg.out,
            &format!("{} (live run)", cfg.name),
            &self.rows,
            Some(&summary),
        )?;
        Ok(self.out)
    }
}

/// How close to its length a run's hall time counts as the whole length:
/// the last step, cut to end there, may fall short by a rounding.
const END_SLACK_S: f64 = 1e-6;

/// The whole simulated seconds a run played when the hall reached
/// `hall_s` of a planned `duration`, at most `duration`; and, for a run
/// that stopped short, a note saying so.
fn played(hall_s: f64, duration: u64) -> (u64, Option<String>) {
    let whole = (hall_s + END_SLACK_S).max(0.0).floor();
    let played = if whole >= duration as f64 {
        duration
    } else {
        whole as u64
    };
    let short = (played < duration).then(|| {
        format!(
            "incomplete: stopped after {played} of {duration} simulated seconds, 10 minutes \
             past its due time with the hall behind; every figure and the baselines cover \
             the {played} s played"
        )
    });
    (played, short)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_that_stops_short_reports_the_seconds_it_played() {
        let (s, note) = played(1234.7, 3600);
        assert_eq!(s, 1234);
        let note = note.expect("a note");
        assert!(
            note.contains("stopped after 1234 of 3600 simulated seconds"),
            "{note}"
        );
        // The last step ends at the run's length, or a rounding short of it.
        assert_eq!(played(3_599.999_999_9, 3600), (3600, None));
        assert_eq!(played(3600.0, 3600), (3600, None));
        assert_eq!(played(0.0, 60).0, 0);
    }

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
}
