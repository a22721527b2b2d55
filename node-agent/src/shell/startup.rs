//! Startup: everything the loop needs, in order. The GPUs behind their
//! workers, the XID bridge, the flash stores (event log, outbox, config
//! store, the sequence reservation), the leases and health states kept from
//! before a restart, and the bus.
//!
//! Glossary:
//! - *bridge*: the thread that moves XID reports from the source's own
//!   thread onto the runtime.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use loopwarden_bus::embedded::EmbeddedBroker;
use loopwarden_bus::{now_ms, Bus, BusConfig, BusTask, Inbound};
use loopwarden_flash::{ConfigStore, EventLog, FlashError, Outbox, StoreError};
use loopwarden_protocol::{
    Family, Frame, GpuHealth, HealthState, Message, MessageKind, NodeId, Role, Topic,
};
use loopwarden_store::agent_flash::Flash;
use tokio::sync::mpsc;

use super::{health_key, AgentError, GpuState};
use crate::caps::GpuRange;
use crate::commands::CommandCore;
use crate::config::{Config, GpuSourceKind};
use crate::gpu::{GpuInfo, GpuSource};
use crate::guard::ThermalGuard;
use crate::health::{GpuStatus, HealthEngine, Limits, Policy};
use crate::worker::Worker;
use crate::xid_queue::{xid_queue, XidQueue, XID_QUEUE_CAPACITY};

/// The bus, started.
pub(super) struct BusParts {
    pub bus: Bus,
    pub inbound: mpsc::Receiver<Inbound>,
    pub task: BusTask,
    /// The CDU state topic this host's cooling context comes from.
    pub coolant_topic: Option<Topic>,
    /// The embedded broker when none is configured; runs while kept.
    pub embedded: Option<EmbeddedBroker>,
}

fn flash_err(what: &str) -> impl FnOnce(StoreError<FlashError>) -> AgentError {
    let what = what.to_string();
    move |e: StoreError<FlashError>| AgentError::Flash(format!("{what}: {e:?}"))
}

/// Every GPU of the source, each on its own worker (a thread, unless the
/// device answers from memory), with what it says
/// about itself (or the board's figures when it cannot say).
pub(super) async fn gpus(
    config: &Config,
    source: &mut Box<dyn GpuSource + Send>,
) -> Result<(Vec<Arc<Worker>>, Vec<GpuState>), AgentError> {
    // GPUs first: an agent without GPUs has nothing to do.
    let devices = source.devices().map_err(AgentError::Gpus)?;
    if devices.is_empty() {
        return Err(AgentError::NoGpus);
    }
    let mut workers = Vec::new();
    for (i, d) in devices.into_iter().enumerate() {
        workers.push(Arc::new(
            Worker::start(i as u8, d).map_err(AgentError::Thread)?,
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
    Ok((workers, gpus))
}

/// Starts the bridge of XID reports and registers for them.
pub(super) fn watch_xids(source: &mut Box<dyn GpuSource + Send>) -> Result<XidQueue, AgentError> {
    // XIDs: the source's thread feeds a bounded queue the loop reads.
    let (sink, queue) = xid_queue(XID_QUEUE_CAPACITY);
    match source.watch_xids(sink) {
        Ok(refused) => {
            for (gpu, e) in refused {
                tracing::warn!("GPU {gpu}: XID events cannot be registered ({e})");
            }
        }
        Err(e) => tracing::error!(
            "the XID watch did not start ({e}); it is retried, and the host's health says so until it runs"
        ),
    }
    Ok(queue)
}

/// The command core, with the leases logged before a restart that are
/// still valid (and the releases logged since).
pub(super) async fn restore_leases(
    config: &Config,
    gpus: &[GpuState],
    log: &mut EventLog<Flash>,
) -> Result<CommandCore, AgentError> {
    // Leases that were in force before a restart, if still valid.
    let ranges: Vec<GpuRange> = gpus.iter().map(|g| g.range).collect();
    let own_cmd = Topic::new(&config.site, Role::Host, &config.host, Family::Cmd);
    let mut core = CommandCore::with_limits(
        own_cmd,
        ranges,
        config.authority.clone(),
        config.lease_limits,
    );
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
    Ok(core)
}

/// The health engine: every GPU healthy unless the flash kept a state.
pub(super) async fn restore_health(
    config: &Config,
    gpu_count: usize,
    store: &mut ConfigStore<Flash>,
    started: loopwarden_protocol::TimestampMs,
) -> HealthEngine {
    // Health: every GPU healthy unless the flash kept a state.
    let policy = Policy {
        unresponsive_after: config.unresponsive_after,
        quiet_ms: config.quiet_period.as_millis() as u64,
        ..Policy::default()
    };
    let limits = Limits {
        max_operating_c: f64::from(config.board.thermal.max_operating_c.0),
    };
    let mut health = HealthEngine::new(gpu_count, limits, policy, started);
    for i in 0..gpu_count {
        let mut buf = [0u8; 128];
        match store.get(&health_key(i), &mut buf).await {
            Ok(Some(n)) => match postcard::from_bytes::<GpuHealth>(&buf[..n]) {
                Ok(h) if h.state != HealthState::Healthy => {
                    tracing::warn!(
                        "GPU {i}: {} since before the restart ({})",
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
    health
}

/// Starts the bus (the embedded broker when none is configured), with
/// the outbox and the subscription to the CDU's state.
pub(super) fn start_bus(
    config: &Config,
    first_seq: u32,
    outbox: Outbox<Flash>,
    gpu_count: usize,
) -> Result<BusParts, AgentError> {
    // The bus.
    let (broker, embedded) =
        loopwarden_bus::embedded::configured_or_embedded(config.broker.clone())
            .map_err(|e| AgentError::Broker(e.to_string()))?;
    let node = NodeId::new(Role::Host, config.host.as_str()).expect("host is an ident");
    let mut bus_config = BusConfig::new(broker.clone(), config.site.clone(), node.clone());
    bus_config.credentials = config.credentials.clone();
    bus_config.tls = config.tls.clone();
    bus_config.keep_alive = config.keep_alive;
    bus_config.json_presence = config.json_presence;
    bus_config.first_seq = first_seq;
    let coolant_topic = config
        .cdu
        .as_ref()
        .map(|cdu| Topic::new(&config.site, Role::Cdu, cdu, Family::Health));
    if let Some(t) = &coolant_topic {
        bus_config.subscriptions.push(t.to_string());
    }
    let (bus, inbound, bus_task) = Bus::start_with_outbox(bus_config, Box::new(outbox));
    tracing::info!(
        "host {} of site {} with {} {} GPUs; broker {}:{}",
        config.host.as_str(),
        config.site.as_str(),
        gpu_count,
        match config.gpus {
            GpuSourceKind::Nvml => "NVML",
            GpuSourceKind::Twin(_) => "twin",
        },
        broker.host,
        broker.port
    );
    if config.demo_key {
        tracing::warn!(
            "commands are checked against the public demonstration key (twin GPUs, no keyring)"
        );
    } else if config.authority.signers.is_empty() {
        tracing::warn!(
            "no keyring: every command (cap lease, quarantine release) will be refused as unauthenticated"
        );
    }
    Ok(BusParts {
        bus,
        inbound,
        task: bus_task,
        coolant_topic,
        embedded,
    })
}
