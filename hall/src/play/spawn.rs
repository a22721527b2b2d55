//! Starting the parts of a play: the broker (the one given, or the
//! embedded one on a loopback port), one real node agent per simulated
//! host, each on its own thread and runtime with its config, its own
//! folder and a fresh flash file there, and the cooling controller
//! ([`ControllerSide`]) with its sign key, its shell config, its operators
//! and the watcher of its counters. The controller's runs and restarts
//! themselves are in `play/controller.rs`.
//!
//! Glossary:
//! - *agent config*: the `node_agent::config::Config` an agent reads; the
//!   run's settings (site, broker, host, rack, flash, console, TLS)
//!   override the file's.
//! - *operator*: the run's task that asks the controller to clear a latched
//!   leak at its simulated second, as `cooling-ctrl ctl clear-leak` would.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cooling_ctrl::shell::{RequestOutcome, ShellConfig, ShellStats};
use loopwarden_bus::embedded::EmbeddedBroker;
use loopwarden_bus::BrokerAddr;
use loopwarden_field::common::CommonFlags;
use loopwarden_protocol::{Ident, NodeId, Role};
use loopwarden_twin::hall::Hall;
use loopwarden_twin::scenario::Scenario;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::controller::{fresh_file, restarts_of, ControllerRuns};
use super::observer::watch_caps;
use super::{ident, paced, pki_tls, stopped, CapFigures, PlayConfig, PlayError, PlayOptions};
use crate::sim_side::SimSide;

/// The broker: the one given, or the embedded one started on a loopback
/// port (kept while the run lasts).
pub(super) fn start_broker(
    cfg: &PlayConfig,
) -> Result<(Option<EmbeddedBroker>, BrokerAddr), PlayError> {
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
pub(super) fn start_agents(
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
                let (req, pending) = cooling_ctrl::shell::OperatorRequest::new(
                    cooling_ctrl::shell::OperatorAction::ClearLeak { rack },
                    Ident::new("hall-operator").expect("an ident"),
                );
                if tx.send(req).await.is_err() {
                    return;
                }
                // The scenario's operator waits as long as it takes.
                let answer = pending.outcome(Duration::MAX).await;
                match answer {
                    RequestOutcome::Answered(Ok(done)) => {
                        // The valve it reopens now is the operator's word.
                        hall.lock().expect("hall lock").leak_cleared(rack);
                        tracing::info!("t={at_s}s operator: {done}")
                    }
                    RequestOutcome::Answered(Err(why)) => {
                        tracing::warn!("t={at_s}s operator: clear-leak {rack} refused: {why}")
                    }
                    RequestOutcome::Withdrawn | RequestOutcome::Dropped => return,
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
            heartbeat_timeout: None,
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
