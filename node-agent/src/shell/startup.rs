//! Startup: everything the loop needs, in order. The GPUs behind their
//! workers, the XID bridge, the flash stores (event log, outbox, config
//! store, the sequence reservation), the node's decisions with the leases
//! and health states kept from before a restart, and the bus.
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
    Event, Family, Frame, GpuHealth, HealthState, Ident, Message, MessageKind, NodeId, ReasonCode,
    Role, TimestampMs, Topic, Watts,
};
use loopwarden_store::agent_flash::Flash;
use node_core::caps::GpuRange;
use node_core::health::{GpuStatus, Limits, Policy};
use node_core::node::{CoolantSource, GpuSetup, Node, Setup};
use tokio::sync::mpsc;

use super::lost_store::LastChange;
use super::quarantine::read_health;
use super::{identity, AgentError, GpuState, UNKNOWN_UUID};
use crate::config::{Config, GpuSourceKind, OptOut};
use crate::gpu::{GpuInfo, GpuSource, XidEvent};
use crate::nvml::UNREAD_LIMIT;
use crate::worker::Worker;
use crate::xid_queue::{xid_queue, XidQueue, XID_QUEUE_CAPACITY};

/// The bus, started.
pub(super) struct BusParts {
    pub bus: Bus,
    pub inbound: mpsc::Receiver<Inbound>,
    pub task: BusTask,
    /// The embedded broker when none is configured; runs while kept.
    pub embedded: Option<EmbeddedBroker>,
}

fn flash_err(what: &str) -> impl FnOnce(StoreError<FlashError>) -> AgentError {
    let what = what.to_string();
    move |e: StoreError<FlashError>| AgentError::Flash(format!("{what}: {e}"))
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
    say_missing(devices.len(), config.expected_gpus);
    let mut workers = Vec::new();
    for (i, d) in devices.into_iter().enumerate() {
        workers.push(Arc::new(
            Worker::start(i as u8, d).map_err(AgentError::Thread)?,
        ));
    }
    // Every GPU asked at once, each on its worker: a driver that hangs
    // holds the start for one deadline, not one per GPU.
    let describe_deadline = Duration::from_secs(5).max(config.deadline);
    let described =
        futures::future::join_all(workers.iter().map(|w| w.describe(describe_deadline))).await;
    let mut gpus = Vec::new();
    for (w, described) in workers.iter().zip(described) {
        // NVML's figures, each [`UNREAD_LIMIT`] where not read: the
        // board's stand in for them only where the agent needs a figure
        // (the range, the default), never in what is shown as the GPU's.
        let info = match described {
            Ok(info) => info,
            Err(e) => {
                tracing::error!(
                    "GPU {}: cannot read its identity and limits ({e}); using the board's (its UUID is asked again while it answers)",
                    w.index()
                );
                GpuInfo {
                    name: config.board.model.clone(),
                    uuid: UNKNOWN_UUID.into(),
                    default_limit: UNREAD_LIMIT,
                    min_limit: UNREAD_LIMIT,
                    max_limit: UNREAD_LIMIT,
                    persistence: None,
                }
            }
        };
        persistence(config, w.index(), info.persistence);
        // What it can be set to, within the board's range, as for a
        // range learned later. Its ceiling (the limit it runs at
        // uncapped) is the node's: the limit found on it, within any
        // site limit. The board's range where NVML gave none.
        let board = &config.board.power;
        let range = super::identify::range_of(&info, config).unwrap_or(GpuRange {
            min: board.min_cap_w,
            max: board.max_cap_w,
        });
        say_range(
            config,
            w.index(),
            &with_board_limits(&info, config),
            range.min,
        );
        gpus.push(GpuState {
            range,
            info,
            last: None,
            sampled_at: None,
            responsive: false,
            last_error: None,
            action_failed: None,
            xids: VecDeque::new(),
        });
    }
    Ok((workers, gpus))
}

/// Says at the start when the GPUs `found` are not the `expected`
/// (`expected_gpus`): fewer is a GPU that failed the driver's probe or fell
/// off the bus before the driver loaded, and this host is not whole.
fn say_missing(found: usize, expected: Option<u8>) {
    let Some(want) = expected.map(usize::from) else {
        return;
    };
    if found < want {
        tracing::error!(
            "{found} GPUs found, {want} expected (expected_gpus): {} missing, failed the \
             driver's probe or off the bus since before it loaded; see `dmesg | grep -i nvrm`, \
             `nvidia-smi -L`, `lspci -d 10de:`; the GPUs found are guarded",
            want - found
        );
    } else if found > want {
        tracing::warn!(
            "{found} GPUs found, more than the {want} of expected_gpus: set it to this host's count"
        );
    }
}

/// On real GPUs, a GPU whose driver does not keep it initialized between
/// clients (persistence mode off, no nvidia-persistenced) is said at
/// every start, as an error unless `persistence = "not_required"` is
/// written (then as a warning beside the opt-out): when the agent, its
/// last client, stops, the driver deinitializes it and the limits the
/// agent left revert to the default; the next start finds the default
/// and takes it for the administrator's limit. Never a refused start: that
/// would leave the host with no agent at all (no cap, no guard, no
/// health, the leases in flash never applied again), each try
/// reinitializing the GPUs. One whose mode is not known (not supported,
/// unread: said by the GPU) is taken.
fn persistence(config: &Config, gpu: u8, on: Option<bool>) {
    if on != Some(false) || config.gpus != GpuSourceKind::Nvml {
        return;
    }
    let what = format!(
        "GPU {gpu}: persistence mode is off and no nvidia-persistenced keeps it initialized: \
         when the agent, its last client, stops or restarts, the driver deinitializes it and \
         the power limits the agent leaves (caps in force) revert to the default until it \
         starts again, and that start takes the default for the administrator's limit"
    );
    if config.persistence_required() {
        tracing::error!(
            "{what}. Start nvidia-persistenced (systemctl enable --now nvidia-persistenced), or \
             `nvidia-smi -pm 1` (until the next reboot); or write persistence = \"not_required\" \
             to take such GPUs on purpose. The agent runs and guards it meanwhile"
        );
    } else {
        tracing::warn!("{what} (persistence = \"not_required\")");
    }
}

/// The protection found off at start rather than written off: on real
/// GPUs, the `gpus` without persistence mode (see [`persistence`]) when
/// `persistence = "not_required"` is not written, for the console and
/// `/metrics` beside the configuration's opt-outs.
pub(super) fn persistence_off(config: &Config, gpus: &[GpuState]) -> Option<OptOut> {
    if config.gpus != GpuSourceKind::Nvml || !config.persistence_required() {
        return None;
    }
    let off: Vec<u8> = (0u8..)
        .zip(gpus)
        .filter(|(_, g)| g.info.persistence == Some(false))
        .map(|(i, _)| i)
        .collect();
    (!off.is_empty()).then(|| OptOut::persistence_off(&off))
}

/// Says what of the configuration a GPU's settable range, as NVML gives
/// it (`info`, the board's figures where unread) and as the agent sets
/// it (from `min`), overrides: a `site_limit_w` below `min` (an error: no
/// such limit can be set, its ceiling is `min` or the limit found if
/// lower), and NVML's maximum above the board's `max_cap_w` (a warning:
/// another board than the one configured; never set above `max_cap_w`).
/// Neither stops the start: a refused start would leave the GPUs with no
/// agent at all, uncapped at their administrator's limit.
fn say_range(config: &Config, gpu: u8, info: &GpuInfo, min: Watts) {
    if let Some(site) = config.site_limit.filter(|&site| site < min) {
        tracing::error!(
            "GPU {gpu}: site_limit_w = {} W is below its lowest settable power limit, {} W \
             (NVML's limit constraints, {} W to {} W): no limit below {} W can be set on it, \
             so its ceiling is {} W (or the limit found on it, if lower), not {} W",
            site.0,
            min.0,
            info.min_limit.0,
            info.max_limit.0,
            min.0,
            min.0,
            site.0
        );
    }
    let board = &config.board;
    if info.max_limit > board.power.max_cap_w {
        tracing::warn!(
            "GPU {gpu} ({}): NVML's limit constraints go up to {} W, above the board's \
             max_cap_w, {} W (board = {}): no limit above {} W is ever set on it; set board to \
             this GPU's model or a board file",
            info.name,
            info.max_limit.0,
            board.power.max_cap_w.0,
            board.model,
            board.power.max_cap_w.0
        );
    }
}

/// `info` with the board's figure for each power limit the GPU could not
/// read ([`UNREAD_LIMIT`]; the GPU said which, and why), for what the
/// start says and decides; never kept as the GPU's own figures.
fn with_board_limits(info: &GpuInfo, config: &Config) -> GpuInfo {
    let p = &config.board.power;
    GpuInfo {
        default_limit: or_board(info.default_limit, p.tdp_w),
        min_limit: or_board(info.min_limit, p.min_cap_w),
        max_limit: or_board(info.max_limit, p.max_cap_w),
        ..info.clone()
    }
}

/// The limit `read`, or the board's figure `board` where NVML did not
/// give it ([`UNREAD_LIMIT`]).
fn or_board(read: Watts, board: Watts) -> Watts {
    if read == UNREAD_LIMIT {
        board
    } else {
        read
    }
}

/// Starts the bridge of XID reports and registers for them. A watch that
/// could not start is said down on the queue, so the host's health says
/// so from the first report.
pub(super) fn watch_xids(source: &mut Box<dyn GpuSource + Send>) -> Result<XidQueue, AgentError> {
    // XIDs: the source's thread feeds a bounded queue the loop reads.
    let (sink, queue) = xid_queue(XID_QUEUE_CAPACITY);
    match source.watch_xids(sink.clone()) {
        Ok(refused) => {
            for (gpu, e) in refused {
                tracing::warn!("GPU {gpu}: XID events cannot be registered ({e})");
            }
        }
        Err(e) => {
            tracing::error!(
                "the XID watch did not start ({e}); XIDs are not seen and it is not retried: \
                 the host's health says the watch is down until the agent restarts"
            );
            let _ = sink.send(XidEvent::WatchDown(format!("it did not start: {e}")));
        }
    }
    Ok(queue)
}

/// Every decision of the agent, as the config and the GPUs say, before
/// anything kept from before a restart.
pub(super) fn node(config: &Config, gpus: &[GpuState], started: TimestampMs) -> Node {
    let setup = Setup {
        own_cmd: Topic::new(&config.site, Role::Host, &config.host, Family::Cmd),
        authority: config.authority.clone(),
        lease_limits: config.lease_limits,
        gpus: gpus
            .iter()
            .map(|g| GpuSetup {
                range: g.range,
                default_limit: or_board(g.info.default_limit, config.board.power.tdp_w),
                site_limit: config.site_limit,
            })
            .collect(),
        guard: config.guard,
        health_limits: Limits {
            max_operating_c: f64::from(config.board.thermal.max_operating_c.0),
        },
        policy: Policy {
            unresponsive_after: config.unresponsive_after,
            quiet_ms: config.quiet_period.as_millis() as u64,
            ..Policy::for_period(config.period.as_millis() as u64)
        },
        cooling_grace_ms: config.cooling_loss.grace.as_millis() as u64,
        coolant: config.cdu.as_ref().map(|cdu| CoolantSource {
            topic: coolant_topic(config, cdu),
            cdu: cdu.clone(),
            rack: config.rack,
        }),
        started,
        volatile_state: config.volatile_state(),
    };
    Node::new(setup)
}

/// Frames from the bus waiting for the loop: a tenth of a second of a
/// flood of 10,000 commands a second.
const INBOUND_CAPACITY: usize = 1024;

/// The CDU state topic this host's cooling context comes from.
fn coolant_topic(config: &Config, cdu: &Ident) -> Topic {
    Topic::new(&config.site, Role::Cdu, cdu, Family::Health)
}

/// The leases logged before a restart that are still valid (and the
/// releases logged since), taken back by `node`.
pub(super) async fn restore_leases(
    node: &mut Node,
    log: &mut EventLog<Flash>,
) -> Result<(), AgentError> {
    let mut logged = Vec::new();
    log.for_each(|r| {
        if r.kind == MessageKind::CapLease as u8 || r.kind == MessageKind::QuarantineRelease as u8 {
            match Frame::decode(r.body) {
                Ok(f) => logged.push((r.time, f)),
                Err(e) => tracing::warn!(
                    "event log record {}: a logged command that does not decode ({e}): not applied again",
                    r.seq
                ),
            }
        }
    })
    .await
    .map_err(flash_err("event log"))?;
    let now = now_ms();
    let restored = logged
        .iter()
        .filter(|(taken, f)| node.restore_command(now, *taken, f))
        .count();
    let leases = logged
        .iter()
        .filter(|(_, f)| matches!(f.message, Message::CapLease(_)))
        .count();
    if leases > 0 {
        tracing::info!("{leases} leases in the log; {restored} still valid and applied again");
    }
    Ok(())
}

/// Every GPU healthy unless the flash kept a state for it, by its UUID
/// (`uuids`: every GPU's, in index order). A GPU whose kept state cannot
/// be read, or whose UUID is unknown so that none can be matched to it,
/// may have been quarantined before the restart: it is marked degraded
/// (reason `kept-state-unreadable`) rather than taken as healthy. When
/// the config store was lost since an earlier run (`lost`: `Some`, with
/// each GPU's quarantine found in the event log, [`logged_quarantines`])
/// "none kept" and "healthy" may be what is left of a quarantine: every
/// GPU not found kept unhealthy (its UUID unknown or its state unreadable
/// included: the log names GPUs by index) is quarantined again where the
/// event log says it was, else marked degraded. Returns the GPUs so marked or
/// quarantined, for the caller to keep their new state.
pub(super) async fn restore_health(
    node: &mut Node,
    uuids: &[&str],
    store: &mut ConfigStore<Flash>,
    lost: Option<&[Option<GpuStatus>]>,
) -> Vec<u8> {
    let mut marked = Vec::new();
    for (i, uuid) in uuids.iter().enumerate().take(node.len()) {
        let kept = match identity(uuid) {
            Some(id) => match read_health(store, id).await {
                Ok(Some(bytes)) => kept_status(&bytes).map(Some),
                Ok(None) => Ok(None),
                Err(e) => Err(e),
            },
            None => Err("its UUID is unknown, so no kept state can be matched to it".into()),
        };
        // The log names GPUs by index: read whenever no unhealthy state is
        // kept, a GPU whose UUID is unknown (or whose record is damaged)
        // included.
        let kept_unhealthy = matches!(&kept, Ok(Some(h)) if h.state != HealthState::Healthy);
        let kept = match lost {
            Some(logged) if !kept_unhealthy => {
                if let Some(q) = logged.get(i).cloned().flatten() {
                    tracing::error!(
                        "GPU {i}: quarantined before the restart, as the event log says ({}); {STORE_LOST}, so the quarantine is taken back from the log: quarantined again, its actions run again",
                        q.evidence
                    );
                    marked.push(i as u8);
                    node.restore_health(i as u8, q);
                    continue;
                }
                Err(kept.err().unwrap_or_else(|| {
                    format!("{STORE_LOST}, so what was kept of this GPU is unknown")
                }))
            }
            _ => kept,
        };
        let status = match kept {
            Ok(Some(h)) if h.state != HealthState::Healthy => {
                tracing::warn!(
                    "GPU {i}: {} since before the restart ({})",
                    h.state,
                    h.evidence
                );
                h
            }
            Ok(_) => continue,
            Err(why) => {
                tracing::error!(
                    "GPU {i}: kept health state unreadable ({why}); it may have been quarantined before the restart: marked degraded until the quiet period passes without evidence"
                );
                marked.push(i as u8);
                unreadable(now_ms())
            }
        };
        node.restore_health(i as u8, status);
    }
    marked
}

/// At a start that found the config store lost with `found` GPUs
/// (`expected`: `expected_gpus`): each GPU's quarantine the event log
/// (`log`; `last`, each index's last health change) holds
/// ([`logged_quarantines`]). The log names GPUs by index: where it names
/// an index this start does not find, or fewer GPUs than expected are
/// found, a GPU was taken out or lost and those after it may be
/// renumbered, so each quarantine taken back says it may sit on another
/// GPU than the one that failed, and how to release it; one logged at an
/// index not found is said, not taken back.
pub(super) async fn logged_quarantines_at(
    log: &mut EventLog<Flash>,
    last: &Result<Vec<Option<LastChange>>, String>,
    found: usize,
    expected: Option<u8>,
) -> Vec<Option<GpuStatus>> {
    let highest = match highest_logged_index(log).await {
        Ok(h) => h,
        Err(e) => {
            tracing::error!("{e}: which GPU indexes it names is unknown");
            None
        }
    };
    let doubt = renumbering(highest, found, expected);
    if let Some(h) = highest.filter(|&h| usize::from(h) >= found) {
        let beyond = super::lost_store::last_changes(log, usize::from(h) + 1).await;
        for (i, q) in logged_quarantines(&beyond, usize::from(h) + 1, None)
            .into_iter()
            .enumerate()
            .skip(found)
        {
            if let Some(q) = q {
                tracing::error!(
                    "GPU index {i}: {}; this start finds {found} GPUs, none at that index: the quarantine is not taken back: the GPU that failed is out of the host, or among those found, renumbered (each GPU not found kept unhealthy is marked degraded): drain by hand a GPU you know failed",
                    q.evidence
                );
            }
        }
    }
    logged_quarantines(last, found, doubt.as_deref())
}

/// The highest GPU index an event of the log (`log`) names: a health
/// change, an XID, a cap, a quarantine's action or release, or a bit of
/// a set of GPUs capped or stalled together. `None`: none named.
async fn highest_logged_index(log: &mut EventLog<Flash>) -> Result<Option<u8>, String> {
    let mut highest: Option<u8> = None;
    log.for_each(|r| {
        if r.kind != MessageKind::Event as u8 {
            return;
        }
        let Ok(Message::Event(e)) = Message::decode_body(MessageKind::Event, r.body) else {
            return;
        };
        let named = match e {
            Event::HealthChanged { gpu, .. }
            | Event::Xid { gpu, .. }
            | Event::CapApplied { gpu, .. }
            | Event::QuarantineAction { gpu, .. }
            | Event::QuarantineReleased { gpu, .. } => Some(gpu.get()),
            Event::CapsApplied { gpus, .. } | Event::HostStalled { gpus, .. } => {
                (gpus != 0).then(|| (15 - gpus.leading_zeros()) as u8)
            }
            _ => None,
        };
        highest = highest.max(named);
    })
    .await
    .map_err(|e| format!("event log unreadable ({e:?})"))?;
    Ok(highest)
}

/// Why the `found` GPUs of this start may be numbered otherwise than
/// when the event log was written: it names an index up to `highest`,
/// or fewer than `expected` are found. `None`: no sign of it.
fn renumbering(highest: Option<u8>, found: usize, expected: Option<u8>) -> Option<String> {
    let beyond = highest.filter(|&h| usize::from(h) >= found);
    let short = expected.filter(|&e| usize::from(e) > found);
    match (beyond, short) {
        (Some(h), _) => Some(format!(
            "the event log names GPU index {h}, and this start finds {found} GPUs"
        )),
        (None, Some(e)) => Some(format!(
            "this start finds {found} GPUs of the {e} expected (expected_gpus)"
        )),
        (None, None) => None,
    }
}

/// Each of the first `gpus` GPUs' quarantine, where the last health change
/// the event log holds of it, by its index (`last`,
/// [`super::lost_store::last_changes`]), is to quarantined: what is left
/// of the health kept when the config store was lost. A log that cannot
/// be read finds none (said: every GPU is marked degraded). `doubt`: why
/// the GPUs may be renumbered since ([`renumbering`]), said in each
/// quarantine's evidence with how to release it.
pub(super) fn logged_quarantines(
    last: &Result<Vec<Option<LastChange>>, String>,
    gpus: usize,
    doubt: Option<&str>,
) -> Vec<Option<GpuStatus>> {
    let last = match last {
        Ok(last) => last,
        Err(e) => {
            tracing::error!(
                "{e}: no quarantine from before the restart is found in it; every GPU not found kept unhealthy is marked degraded"
            );
            return vec![None; gpus];
        }
    };
    let doubt = |i: usize| {
        match doubt {
        Some(why) => format!(
            "; but {why}: a GPU was taken out or lost and those after it renumbered since, so this may not be the GPU that failed: check it (nvidia-smi -q -i {i}: its serial against the one taken out); a healthy one is released by a signed quarantine_release command (docs/health.md section 7), its drain undone with loopwarden-slurm resume"
        ),
        None => String::new(),
    }
    };
    (last.iter().enumerate())
        .take(gpus)
        .map(|(i, l)| match l {
            Some(LastChange {
                seq,
                time,
                to: HealthState::Quarantined,
                reason,
            }) => Some(GpuStatus {
                state: HealthState::Quarantined,
                reason: *reason,
                since: *time,
                evidence: format!(
                    "quarantined ({reason}) as event log record {seq} says, the last health change it holds of this GPU index; the config store that kept it was lost{}",
                    doubt(i)
                ),
            }),
            _ => None,
        })
        .collect()
}

/// Why what was kept is unknown when the config store was lost.
pub(super) const STORE_LOST: &str = "the config store was lost from the flash file (it holds records but no sequence floor, which every start writes first)";

/// A GPU's health as kept (`bytes`, its record's payload), as the health
/// engine takes it back.
pub(super) fn kept_status(bytes: &[u8]) -> Result<GpuStatus, String> {
    let h = postcard::from_bytes::<GpuHealth>(bytes)
        .map_err(|e| format!("{} bytes that do not decode: {e}", bytes.len()))?;
    Ok(GpuStatus {
        state: h.state,
        reason: h.reason,
        since: h.since,
        evidence: h.evidence.as_str().to_string(),
    })
}

/// The state of a GPU whose kept health state cannot be read, from `now`.
fn unreadable(now: TimestampMs) -> GpuStatus {
    GpuStatus {
        state: HealthState::Degraded,
        reason: ReasonCode::KEPT_STATE_UNREADABLE,
        since: now,
        evidence: "its health state from before the restart could not be read from flash"
            .to_string(),
    }
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
    // A burst on the `cmd` topic (a flood of forgeries) waits here while
    // the loop checks it, rather than pushing a valid command out.
    bus_config.inbound_capacity = INBOUND_CAPACITY;
    if let Some(cdu) = &config.cdu {
        let topic = coolant_topic(config, cdu);
        bus_config.subscriptions.push(topic.to_string());
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
    for o in &config.opt_outs {
        tracing::warn!("protection switched off on purpose: {o}");
    }
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
        embedded,
    })
}

#[cfg(test)]
mod tests {
    //! What a restart restores of each GPU's health and quarantine stamp,
    //! through the shell's own restore, when the GPUs are numbered
    //! otherwise, after an upgrade from the records kept by index, and for
    //! a GPU whose UUID is unknown; and an XID watch that did not start,
    //! said down to the loop.

    use super::super::quarantine::{check_of, health_check_key, tagged, Record};
    use super::super::restore_kept;
    use super::*;
    use crate::gpu::GpuError;
    use loopwarden_protocol::{Event, GpuIndex, Text, Watts};

    const X: &str = "GPU-00000000-0000-0000-0000-00000000000x";
    const A: &str = "GPU-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa";
    const B: &str = "GPU-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb";
    const SINCE: u64 = 1_764_000_000_000;

    /// A host that manages no cooling (no CDU).
    fn config() -> Config {
        config_with("")
    }

    /// A host whose rack 2 of CDU `cdu1` cools it.
    fn managed() -> Config {
        config_with("cdu = \"cdu1\"\nrack = 2\n")
    }

    fn config_with(more: &str) -> Config {
        let text = format!("site = \"s1\"\nhost = \"h1\"\ntwin_gpus = 3\n{more}");
        let flags = crate::config::Overrides::default();
        crate::config::resolve(Some(std::path::Path::new("agent.toml")), &text, &flags)
            .expect("valid")
    }

    fn gpu(uuid: &str) -> GpuState {
        GpuState {
            info: GpuInfo {
                name: "twin".into(),
                uuid: uuid.into(),
                default_limit: Watts(700),
                min_limit: Watts(200),
                max_limit: Watts(700),
                persistence: Some(true),
            },
            range: GpuRange {
                min: Watts(200),
                max: Watts(700),
            },
            last: None,
            sampled_at: None,
            responsive: true,
            last_error: None,
            action_failed: None,
            xids: VecDeque::new(),
        }
    }

    /// A GPU whose driver hangs: its description never comes (its
    /// thread sleeps past the test).
    struct Hung;

    impl crate::gpu::GpuDevice for Hung {
        fn describe(&mut self) -> Result<GpuInfo, GpuError> {
            std::thread::sleep(Duration::from_secs(60));
            Err(GpuError::Timeout)
        }
        fn sample(&mut self) -> Result<crate::gpu::GpuSample, GpuError> {
            Err(GpuError::Timeout)
        }
        fn set_power_limit(&mut self, _: Watts) -> Result<(), GpuError> {
            Err(GpuError::Timeout)
        }
        fn power_limit(&mut self) -> Result<Watts, GpuError> {
            Err(GpuError::Timeout)
        }
    }

    struct HungSource(usize);

    impl crate::gpu::GpuSource for HungSource {
        fn devices(&mut self) -> Result<Vec<Box<dyn crate::gpu::GpuDevice>>, GpuError> {
            Ok((0..self.0)
                .map(|_| Box::new(Hung) as Box<dyn crate::gpu::GpuDevice>)
                .collect())
        }
        fn watch_xids(
            &mut self,
            _: crate::xid_queue::XidSink,
        ) -> Result<Vec<(u8, GpuError)>, GpuError> {
            Ok(Vec::new())
        }
    }

    /// A hung driver holds the start for one description's deadline (5 s),
    /// not one per GPU (40 s on eight, past systemd's patience), and each
    /// GPU starts with the board's figures.
    #[test]
    fn gpus_that_never_describe_themselves_hold_the_start_once() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        let mut source: Box<dyn crate::gpu::GpuSource + Send> = Box::new(HungSource(4));
        let began = std::time::Instant::now();
        let (_, gpus) = rt.block_on(gpus(&config(), &mut source)).expect("GPUs");
        let took = began.elapsed();
        assert!(
            took < Duration::from_secs(15),
            "{took:?} for 4 GPUs of 5 s each"
        );
        assert_eq!(gpus.len(), 4);
        assert!(gpus.iter().all(|g| g.info.uuid == UNKNOWN_UUID));
    }

    /// The health an agent keeps of a GPU quarantined at `index`.
    fn quarantined(index: u8) -> Vec<u8> {
        let h = GpuHealth {
            gpu: GpuIndex::new(index).unwrap(),
            state: HealthState::Quarantined,
            reason: ReasonCode(79),
            since: TimestampMs(SINCE),
            evidence: Text::truncated("XID 79: fallen off the bus"),
        };
        postcard::to_allocvec(&h).unwrap()
    }

    fn id(uuid: &str) -> u64 {
        identity(uuid).unwrap()
    }

    fn set(store: &mut ConfigStore<Flash>, key: &str, value: &[u8]) {
        futures::executor::block_on(store.set(key, value)).unwrap();
    }

    fn has(store: &mut ConfigStore<Flash>, key: &str) -> bool {
        let mut buf = [0u8; loopwarden_flash::config::MAX_VALUE];
        futures::executor::block_on(store.get(key, &mut buf))
            .unwrap()
            .is_some()
    }

    /// A start with the GPUs `uuids`: the node, with what it restored,
    /// and what the start found undone.
    fn restored(store: &mut ConfigStore<Flash>, uuids: [&str; 3]) -> (Node, super::super::Undone) {
        restored_from(store, uuids, None)
    }

    /// [`restored`] from a config store lost since an earlier run (`lost`:
    /// the event log then) or not (an empty log).
    fn restored_from(
        store: &mut ConfigStore<Flash>,
        uuids: [&str; 3],
        lost: Option<&mut EventLog<Flash>>,
    ) -> (Node, super::super::Undone) {
        match lost {
            Some(log) => restored_with(store, uuids, log, true),
            None => {
                let mut log = loopwarden_store::agent_flash::open(None).unwrap().log;
                restored_with(store, uuids, &mut log, false)
            }
        }
    }

    /// [`restored`] with the event log `log`, from a config store lost
    /// since an earlier run (`lost`) or not.
    fn restored_with(
        store: &mut ConfigStore<Flash>,
        uuids: [&str; 3],
        log: &mut EventLog<Flash>,
        lost: bool,
    ) -> (Node, super::super::Undone) {
        restored_on(&config(), store, uuids, log, lost)
    }

    /// [`restored_with`] on a host set up as `config`.
    fn restored_on(
        config: &Config,
        store: &mut ConfigStore<Flash>,
        uuids: [&str; 3],
        log: &mut EventLog<Flash>,
        lost: bool,
    ) -> (Node, super::super::Undone) {
        let gpus: Vec<GpuState> = uuids.iter().map(|u| gpu(u)).collect();
        let mut node = node(config, &gpus, TimestampMs(SINCE + 10_000));
        // On the agent's runtime, as at a start (the move of records kept
        // by index blocks inside it).
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let undone = rt.block_on(restore_kept(&mut node, config, &gpus, store, log, lost));
        (node, undone)
    }

    /// A start with the GPUs `uuids`: the state of each, and the GPUs
    /// whose quarantine actions run again.
    fn start(store: &mut ConfigStore<Flash>, uuids: [&str; 3]) -> (Vec<HealthState>, Vec<u8>) {
        let (node, undone) = restored(store, uuids);
        let states = (0..3)
            .map(|i| node.health().status(i).unwrap().state)
            .collect();
        (states, undone.quarantines)
    }

    use HealthState::{Degraded, Healthy, Quarantined};

    /// GPU `a` kept quarantined (as GPU 2 once was), under its identity.
    fn keep_quarantined(store: &mut ConfigStore<Flash>, a: u64) {
        set(store, &Record::Health.key(a), &tagged(a, &quarantined(2)));
    }

    /// A source whose XID watch cannot start.
    struct NoWatch;

    impl GpuSource for NoWatch {
        fn devices(&mut self) -> Result<Vec<Box<dyn crate::gpu::GpuDevice>>, GpuError> {
            Ok(Vec::new())
        }
        fn watch_xids(
            &mut self,
            _sink: crate::xid_queue::XidSink,
        ) -> Result<Vec<(u8, GpuError)>, GpuError> {
            Err(GpuError::Failed {
                what: "XID thread",
                detail: "no more threads".into(),
            })
        }
    }

    #[test]
    fn an_xid_watch_that_did_not_start_is_said_down_to_the_loop() {
        let mut source: Box<dyn GpuSource + Send> = Box::new(NoWatch);
        let queue = watch_xids(&mut source).expect("the queue");
        match queue.try_recv() {
            Some(XidEvent::WatchDown(why)) => {
                assert!(why.contains("did not start"), "{why}");
                assert!(why.contains("no more threads"), "{why}");
            }
            other => panic!("expected the watch down, got {other:?}"),
        }
    }

    #[test]
    fn a_quarantine_and_its_stamp_follow_the_gpu_renumbered() {
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        // A quarantined at index 2, its actions done.
        let a = id(A);
        keep_quarantined(&mut store, a);
        set(
            &mut store,
            &Record::Done.key(a),
            &tagged(a, &SINCE.to_le_bytes()),
        );
        assert_eq!(
            start(&mut store, [X, B, A]),
            (vec![Healthy, Healthy, Quarantined], vec![])
        );
        // A is 1 now, B 2: A stays out, B in service, A's actions done.
        assert_eq!(
            start(&mut store, [X, A, B]),
            (vec![Healthy, Quarantined, Healthy], vec![])
        );
        // A absent: its record stays for when it is back.
        assert_eq!(start(&mut store, [X, B, B]).0, vec![Healthy; 3]);
        assert_eq!(
            start(&mut store, [A, X, B]),
            (vec![Quarantined, Healthy, Healthy], vec![])
        );
        // Not known done: A's actions run again, wherever it is.
        let other = tagged(a, &(SINCE - 1).to_le_bytes());
        set(&mut store, &Record::Done.key(a), &other);
        assert_eq!(start(&mut store, [X, A, B]).1, vec![1]);
        // Done as GPU 2 (the index kept with the stamp; the stamp alone
        // above is an earlier version's): at index 2 still, done; at 1,
        // not done, what its actions left naming index 2.
        let done_at_2 = [&SINCE.to_le_bytes()[..], &[2]].concat();
        set(&mut store, &Record::Done.key(a), &tagged(a, &done_at_2));
        assert_eq!(start(&mut store, [X, B, A]).1, Vec::<u8>::new());
        assert_eq!(start(&mut store, [X, A, B]).1, vec![1]);
    }

    #[test]
    fn records_kept_by_index_are_taken_for_the_gpu_there_and_moved() {
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        // An earlier version kept A's quarantine, at index 2.
        set(&mut store, "health.2", &quarantined(2));
        set(&mut store, "quarantine_done.2", &SINCE.to_le_bytes());
        assert_eq!(
            start(&mut store, [X, B, A]),
            (vec![Healthy, Healthy, Quarantined], vec![])
        );
        assert!(!has(&mut store, "health.2") && !has(&mut store, "quarantine_done.2"));
        assert!(has(&mut store, &Record::Health.key(id(A))));
        // Moved: it follows A from now on.
        assert_eq!(
            start(&mut store, [X, A, B]),
            (vec![Healthy, Quarantined, Healthy], vec![])
        );
    }

    #[test]
    fn a_gpu_with_a_record_under_its_uuid_takes_no_record_by_index() {
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        let b = id(B);
        let healthy = GpuHealth {
            state: Healthy,
            ..postcard::from_bytes(&quarantined(2)).unwrap()
        };
        let healthy = postcard::to_allocvec(&healthy).unwrap();
        set(&mut store, &Record::Health.key(b), &tagged(b, &healthy));
        set(&mut store, "health.2", &quarantined(2));
        assert_eq!(start(&mut store, [X, A, B]).0, vec![Healthy; 3]);
        assert!(has(&mut store, "health.2"), "left as it is");
    }

    #[test]
    fn a_move_cut_by_a_power_loss_ends_at_the_next_start_on_the_right_gpu() {
        let a = id(A);
        let record = tagged(a, &quarantined(2));
        // Cut after the record was tagged in place with A's identity, and
        // after it was written under A's key too; the GPUs renumbered.
        for written in [false, true] {
            let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
            set(&mut store, "health.2", &record);
            if written {
                set(&mut store, &Record::Health.key(a), &record);
            }
            let (states, _) = start(&mut store, [X, A, B]);
            assert_eq!(
                states,
                vec![Healthy, Quarantined, Healthy],
                "written: {written}"
            );
            assert!(!has(&mut store, "health.2"));
        }
    }

    /// A source whose GPUs describe themselves as `0`, one by one.
    struct Described(Vec<GpuInfo>);

    /// A GPU that describes itself as `0`.
    struct Describes(GpuInfo);

    impl crate::gpu::GpuDevice for Describes {
        fn describe(&mut self) -> Result<GpuInfo, GpuError> {
            Ok(self.0.clone())
        }
        fn sample(&mut self) -> Result<crate::gpu::GpuSample, GpuError> {
            Err(GpuError::NotSupported)
        }
        fn set_power_limit(&mut self, _: Watts) -> Result<(), GpuError> {
            Err(GpuError::NotSupported)
        }
        fn power_limit(&mut self) -> Result<Watts, GpuError> {
            Err(GpuError::NotSupported)
        }
        fn answers_in_memory(&self) -> bool {
            true
        }
    }

    impl GpuSource for Described {
        fn devices(&mut self) -> Result<Vec<Box<dyn crate::gpu::GpuDevice>>, GpuError> {
            Ok(self
                .0
                .iter()
                .map(|i| Box::new(Describes(i.clone())) as Box<dyn crate::gpu::GpuDevice>)
                .collect())
        }
        fn watch_xids(
            &mut self,
            _sink: crate::xid_queue::XidSink,
        ) -> Result<Vec<(u8, GpuError)>, GpuError> {
            Ok(Vec::new())
        }
    }

    #[test]
    fn a_gpu_whose_limits_cannot_be_read_keeps_its_uuid_and_its_quarantine() {
        let config = config();
        let p = config.board.power.clone();
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        keep_quarantined(&mut store, id(A));
        // A's default limit and constraints could not be read.
        let unread = GpuInfo {
            default_limit: UNREAD_LIMIT,
            min_limit: UNREAD_LIMIT,
            max_limit: UNREAD_LIMIT,
            ..gpu(A).info
        };
        let mut source: Box<dyn GpuSource + Send> =
            Box::new(Described(vec![gpu(X).info, gpu(B).info, unread]));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        let (_, found) = rt.block_on(gpus(&config, &mut source)).expect("GPUs");
        let a = &found[2];
        assert_eq!((a.info.uuid.as_str(), a.info.name.as_str()), (A, "twin"));
        assert_eq!(
            (a.info.default_limit, a.info.min_limit, a.info.max_limit),
            (UNREAD_LIMIT, UNREAD_LIMIT, UNREAD_LIMIT),
            "NVML's, none read"
        );
        assert_eq!(
            a.range,
            GpuRange {
                min: p.min_cap_w,
                max: p.max_cap_w
            }
        );
        // Known by its UUID: its quarantine is restored as it was.
        let mut node = node(&config, &found, TimestampMs(SINCE + 10_000));
        let mut log = loopwarden_store::agent_flash::open(None).unwrap().log;
        let kept = restore_kept(&mut node, &config, &found, &mut store, &mut log, false);
        let undone = rt.block_on(kept);
        assert_eq!(node.health().status(2).unwrap().state, Quarantined);
        assert_eq!(undone.unreadable, Vec::<u8>::new());
    }

    /// The DCGM limit series of GPU `g` as found at the start.
    fn limit_series(g: &GpuState) -> String {
        let mut view = crate::console::snapshot::test_view();
        view.info = g.info.clone();
        view.range = g.range;
        let mut out = loopwarden_bus::prometheus::Exposition::new();
        crate::metrics::dcgm::write(&mut out, &view, true, &[("gpu", "0")]);
        let text = out.finish();
        text.lines()
            .filter(|l| l.starts_with("DCGM_FI_DEV_POWER_MGMT_LIMIT_"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A GPU that says its UUID but not its limits is guarded within the
    /// board's figures, and those are never exported as the GPU's own: no
    /// DCGM limit series for a limit NVML did not give; each given is.
    #[test]
    fn the_limits_a_gpu_did_not_give_are_not_exported_as_its_own() {
        let config = config();
        let unread = GpuInfo {
            default_limit: UNREAD_LIMIT,
            min_limit: UNREAD_LIMIT,
            max_limit: UNREAD_LIMIT,
            ..gpu(A).info
        };
        let partly = GpuInfo {
            default_limit: Watts(650),
            ..unread.clone()
        };
        let found = described(&config, vec![unread, partly, gpu(B).info]).expect("GPUs");
        assert_eq!(found[0].info.uuid, A);
        assert_eq!(limit_series(&found[0]), "", "none read");
        assert_eq!(
            limit_series(&found[1]),
            "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF{gpu=\"0\"} 650",
            "only the default read"
        );
        assert_eq!(limit_series(&found[2]).lines().count(), 3, "all read");
    }

    /// A real host's configuration, with `more`.
    fn nvml_config(more: &str) -> Config {
        let text = format!(
            "site = \"s1\"\nhost = \"h1\"\nbroker = \"10.0.0.5\"\ncommands = \"none\"\n\
             cooling = \"not_managed\"\nvolatile_state = true\n{more}\
             [quarantine]\nreported_only = true\n"
        );
        let flags = crate::config::Overrides::default();
        crate::config::resolve(None, &text, &flags).expect("valid")
    }

    /// The GPUs `infos` described at the start under `config`.
    fn described(config: &Config, infos: Vec<GpuInfo>) -> Result<Vec<GpuState>, AgentError> {
        let mut source: Box<dyn GpuSource + Send> = Box::new(Described(infos));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        rt.block_on(gpus(config, &mut source)).map(|(_, g)| g)
    }

    /// A real GPU whose driver would deinitialize it when the agent stops
    /// (its caps reverting to the default) is taken, never refused (that
    /// would leave the host with no agent), and shown as a protection
    /// that is off, not on purpose, naming it and the fix; with the
    /// opt-out written (said as one), or its mode not known, or on twin
    /// GPUs, no such entry.
    #[test]
    fn a_real_gpu_without_persistence_mode_is_taken_and_shown_as_a_protection_off() {
        let off = GpuInfo {
            persistence: Some(false),
            ..gpu(B).info
        };
        let infos = vec![gpu(A).info, off.clone()];
        let real = nvml_config("");
        let taken = described(&real, infos.clone()).expect("taken");
        assert_eq!(taken.len(), 2);
        let shown = persistence_off(&real, &taken).expect("shown");
        assert_eq!(shown.key, "persistence");
        assert!(
            shown.said.starts_with("persistence mode is off on GPU 1,")
                && shown.said.contains("not on purpose")
                && shown.said.contains("revert to the default")
                && shown.said.contains("nvidia-persistenced")
                && shown.said.contains("nvidia-smi -pm 1"),
            "{shown}"
        );
        let opted = nvml_config("persistence = \"not_required\"\n");
        assert!(!opted.persistence_required());
        let taken = described(&opted, infos).expect("taken");
        assert_eq!(persistence_off(&opted, &taken), None, "said as an opt-out");
        let unknown = GpuInfo {
            persistence: None,
            ..off.clone()
        };
        let taken = described(&real, vec![unknown]).expect("taken");
        assert_eq!(persistence_off(&real, &taken), None, "its mode unknown");
        let twin = config();
        let taken = described(&twin, vec![off]).expect("taken");
        assert_eq!(persistence_off(&twin, &taken), None, "twin GPUs");
    }

    #[test]
    fn a_gpu_whose_uuid_is_unknown_has_nothing_restored_or_moved_and_is_marked() {
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        let a = id(A);
        keep_quarantined(&mut store, a);
        set(&mut store, "health.1", &quarantined(1));
        assert_eq!(identity("unknown"), None);
        let (states, _) = start(&mut store, [X, "unknown", A]);
        // It may be the GPU kept quarantined: not taken as healthy.
        assert_eq!(states, vec![Healthy, Degraded, Quarantined]);
        assert!(has(&mut store, "health.1"), "left as it is");
    }

    #[test]
    fn a_kept_state_that_cannot_be_read_marks_its_gpu_degraded_not_healthy() {
        let a = id(A);
        let b = id(B);
        let undecodable = tagged(a, &[0xff; 5]);
        let someone_elses = tagged(b, &quarantined(2));
        for (record, why) in [
            (undecodable, "does not decode"),
            (someone_elses, "another GPU's"),
        ] {
            let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
            set(&mut store, &Record::Health.key(a), &record);
            let (node, undone) = restored(&mut store, [X, A, B]);
            assert_eq!(undone.unreadable, vec![1], "{why}");
            assert_eq!(undone.quarantines, Vec::<u8>::new(), "{why}");
            let st = node.health().status(1).unwrap();
            assert_eq!(
                (st.state, st.reason),
                (Degraded, ReasonCode::KEPT_STATE_UNREADABLE),
                "{why}"
            );
            for other in [0, 2] {
                assert_eq!(node.health().status(other).unwrap().state, Healthy);
            }
        }
    }

    /// GPU A kept healthy, then quarantined, each record with its check
    /// as the agent keeps them; then the quarantine's newest copy is
    /// damaged in flash: the store skips it and reads the healthy one,
    /// which its check does not match, so GPU A starts degraded, never
    /// healthy. A check whose record is lost altogether reads so too.
    #[test]
    fn a_damaged_newest_health_record_marks_its_gpu_degraded_not_the_older_state() {
        let a = id(A);
        let healthy = GpuHealth {
            state: Healthy,
            ..postcard::from_bytes(&quarantined(2)).unwrap()
        };
        let healthy = tagged(a, &postcard::to_allocvec(&healthy).unwrap());
        let quarantine = tagged(a, &quarantined(2));
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        for v in [&healthy, &quarantine] {
            set(&mut store, &Record::Health.key(a), v);
            set(&mut store, &health_check_key(a), &check_of(v));
        }
        assert_eq!(
            start(&mut store, [X, A, B]).0,
            vec![Healthy, Quarantined, Healthy]
        );
        let mut store = super::super::damage_newest(store, &quarantine);
        let (node, undone) = restored(&mut store, [X, A, B]);
        assert_eq!(undone.unreadable, vec![1]);
        let st = node.health().status(1).unwrap();
        assert_eq!(
            (st.state, st.reason),
            (Degraded, ReasonCode::KEPT_STATE_UNREADABLE)
        );
        // A check kept with no record at all: lost, not "never kept".
        let mut store = loopwarden_store::agent_flash::open(None).unwrap().store;
        set(&mut store, &health_check_key(a), &check_of(&quarantine));
        assert_eq!(
            start(&mut store, [X, A, B]).0,
            vec![Healthy, Degraded, Healthy]
        );
    }

    /// A flash file whose config store was lost since an earlier run (its
    /// sectors erased: a repair, a board layout that moved the range, a
    /// damaged disk) while the file and its log stay: no GPU is taken as
    /// healthy, the one kept quarantined least of all; each is marked
    /// degraded, its kept state unreadable.
    #[test]
    fn a_lost_config_store_marks_every_gpu_degraded_never_healthy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        let a = id(A);
        {
            let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
            let quarantine = tagged(a, &quarantined(2));
            set(&mut stores.store, &Record::Health.key(a), &quarantine);
            set(
                &mut stores.store,
                &health_check_key(a),
                &check_of(&quarantine),
            );
            let kind = MessageKind::Event as u8;
            futures::executor::block_on(stores.log.append(TimestampMs(SINCE), kind, &[1, 2]))
                .unwrap();
            let (node, _) = restored_from(
                &mut stores.store,
                [X, A, B],
                stores.config_lost.then_some(&mut stores.log),
            );
            assert_eq!(node.health().status(1).unwrap().state, Quarantined);
        }
        erase_config_store(&path);
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        assert!(stores.config_lost && !stores.blank);
        let (node, undone) = restored_from(&mut stores.store, [X, A, B], Some(&mut stores.log));
        assert_eq!(undone.unreadable, vec![0, 1, 2]);
        for i in 0..3 {
            let st = node.health().status(i).unwrap();
            assert_eq!(
                (st.state, st.reason),
                (Degraded, ReasonCode::KEPT_STATE_UNREADABLE),
                "GPU {i}"
            );
        }
    }

    /// The file at `path` with its config store erased (its sectors, as a
    /// repair or a moved layout leaves them), the event log left.
    fn erase_config_store(path: &std::path::Path) {
        use std::os::unix::fs::FileExt;
        let config = loopwarden_boards::FlashBoard::host_file().layout().config;
        let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        let erased = vec![0xFF; (config.end - config.start) as usize];
        file.write_all_at(&erased, config.start.into()).unwrap();
    }

    /// The node's start, then its first read of every GPU's limit at
    /// `found`: the lines it says at an error.
    fn first_read(node: &mut Node, found: u32) -> Vec<String> {
        use node_core::node::{Effect, Input, Level, Now};
        let now = Now::at(SINCE + 10_000);
        let mut effects = node.step(now, Input::Start);
        let read = vec![Ok(Watts(found)); 3];
        effects.extend(node.step(now, Input::LimitsRead(&read)));
        effects
            .into_iter()
            .filter_map(|e| match e {
                Effect::Say(Level::Error, line) => Some(line),
                _ => None,
            })
            .collect()
    }

    /// On a host a CDU cools: the limits kept with a cap in force (700 W
    /// uncapped, 450 W asked) and a host powered down for a cooling loss,
    /// then the config store
    /// lost, the event log holding an event that does not decode (it may
    /// be a cooling action): the phase is unknown, for the CDU's word to
    /// decide (never cooled, which would leave the host down for good; a
    /// log that says is read in
    /// `a_lost_config_store_takes_the_cooling_phase_from_the_event_log`), and the limits
    /// are unreadable: the 450 W found is the ceiling, said as an error
    /// per GPU (never taken quietly for the site's limit).
    #[test]
    fn a_lost_config_store_leaves_the_cooling_phase_unknown_and_the_limits_unreadable() {
        use node_core::cooling_loss::Phase;
        use node_core::node::KeptLimit;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        let down = Phase::PoweredDown { since: SINCE };
        {
            let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
            let kept = KeptLimit {
                ceiling: Watts(700),
                asked: Watts(450),
                before: None,
            };
            for uuid in [X, A, B] {
                let (key, value) = super::super::limits::record(uuid, kept).unwrap().unwrap();
                set(&mut stores.store, &key, &value);
            }
            for (key, value) in super::super::cooling::phase_items(down, &[]) {
                set(&mut stores.store, &key, &value);
            }
            let kind = MessageKind::Event as u8;
            futures::executor::block_on(stores.log.append(TimestampMs(SINCE), kind, &[1, 2]))
                .unwrap();
            let (mut node, undone) = restored(&mut stores.store, [X, A, B]);
            assert_eq!((undone.phase, node.cooling_unknown()), (down, false));
            assert_eq!(first_read(&mut node, 450), Vec::<String>::new());
            assert_eq!(node.ceiling(0), Some(Watts(700)), "the kept ceiling");
        }
        erase_config_store(&path);
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        assert!(stores.config_lost);
        let (mut node, _) = restored_on(
            &managed(),
            &mut stores.store,
            [X, A, B],
            &mut stores.log,
            stores.config_lost,
        );
        assert!(node.cooling_unknown(), "the phase is unknown, not cooled");
        let said = first_read(&mut node, 450);
        for i in 0..3u8 {
            assert_eq!(node.ceiling(i), Some(Watts(450)), "GPU {i}");
            assert!(
                said.iter()
                    .any(|l| l.starts_with(&format!("GPU {i}:")) && l.contains("unreadable")),
                "GPU {i}: {said:?}"
            );
        }
    }

    /// A healthy sample of every GPU, as a round reads it.
    fn healthy_round() -> Vec<node_core::node::Reading> {
        let observation = node_core::health::Observation {
            temp: 60.0,
            power: 450.0,
            power_limit: 700.0,
            sm_clock: 1_980.0,
            util: 95.0,
            ..Default::default()
        };
        let sample = node_core::node::Reading::Sample {
            observation,
            temp: loopwarden_protocol::WholeCelsius(60),
            power: Watts(450),
        };
        vec![sample; 3]
    }

    /// The config store lost, the event log left: GPU 1, whose last health
    /// change in the log is to quarantined, is quarantined again (for the
    /// reason the log gives; its actions run again) and stays so past the
    /// quiet period; GPU 0, quarantined then released, and GPU 2, never
    /// changed, are marked degraded and heal after it.
    #[test]
    fn a_lost_config_store_takes_a_quarantine_back_from_the_event_log() {
        use loopwarden_protocol::{Event, Message};
        use node_core::node::{Input, Now};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        {
            let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
            let changes = [
                (0, Healthy, Quarantined, ReasonCode(79)),
                (1, Healthy, Quarantined, ReasonCode::DBE_VOLATILE),
                (0, Quarantined, Healthy, ReasonCode::OPERATOR_RELEASE),
            ];
            for (n, (gpu, from, to, reason)) in changes.into_iter().enumerate() {
                let event = Message::Event(Event::HealthChanged {
                    gpu: GpuIndex::new(gpu).unwrap(),
                    from,
                    to,
                    reason,
                });
                let body = loopwarden_store::resend::event_body(&event).unwrap();
                let kind = MessageKind::Event as u8;
                let at = TimestampMs(SINCE + n as u64);
                futures::executor::block_on(stores.log.append(at, kind, &body)).unwrap();
            }
        }
        erase_config_store(&path);
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        assert!(stores.config_lost);
        let lost = stores.config_lost.then_some(&mut stores.log);
        let (mut node, undone) = restored_from(&mut stores.store, [X, A, B], lost);
        let state = |node: &Node, i| {
            let st = node.health().status(i).unwrap();
            (st.state, st.reason)
        };
        let unreadable = (Degraded, ReasonCode::KEPT_STATE_UNREADABLE);
        assert_eq!(state(&node, 0), unreadable, "released since");
        assert_eq!(state(&node, 1), (Quarantined, ReasonCode::DBE_VOLATILE));
        assert_eq!(state(&node, 2), unreadable, "never changed");
        assert_eq!(undone.unreadable, vec![0, 1, 2], "each state kept anew");
        assert_eq!(undone.quarantines, vec![1], "its actions run again");
        let quiet_ms = config().quiet_period.as_millis() as u64;
        // The mark is stamped with the clock's time, after SINCE.
        let later = Now::at(now_ms().0 + quiet_ms + 60_000);
        node.step(later, Input::Round(&healthy_round()));
        assert_eq!(state(&node, 0).0, Healthy, "the quiet period passed");
        assert_eq!(state(&node, 1).0, Quarantined, "never healed by it");
    }

    /// `events` logged in order at `SINCE` plus their index, then the
    /// config store lost: a start from the file at `path`.
    fn lost_after(
        path: &std::path::Path,
        events: &[loopwarden_protocol::Event],
    ) -> (Node, super::super::Undone) {
        lost_after_on(path, events, [X, A, B])
    }

    /// [`lost_after`], the start with the GPUs `uuids`.
    fn lost_after_on(
        path: &std::path::Path,
        events: &[loopwarden_protocol::Event],
        uuids: [&str; 3],
    ) -> (Node, super::super::Undone) {
        {
            let mut stores = loopwarden_store::agent_flash::open(Some(path)).unwrap();
            for (n, event) in events.iter().enumerate() {
                let body =
                    loopwarden_store::resend::event_body(&Message::Event(event.clone())).unwrap();
                let at = TimestampMs(SINCE + n as u64);
                let kind = MessageKind::Event as u8;
                futures::executor::block_on(stores.log.append(at, kind, &body)).unwrap();
            }
        }
        erase_config_store(path);
        let mut stores = loopwarden_store::agent_flash::open(Some(path)).unwrap();
        assert!(stores.config_lost);
        let lost = stores.config_lost.then_some(&mut stores.log);
        restored_from(&mut stores.store, uuids, lost)
    }

    /// The steps the CDU's first word that the rack has cooling decides,
    /// from the cooling-loss phase a start restored.
    fn cooled_word(
        node: &Node,
        undone: &super::super::Undone,
    ) -> Vec<loopwarden_protocol::CoolingStep> {
        let mut c = node_core::cooling_loss::CoolingLoss::new(60_000);
        if node.cooling_unknown() {
            c.restore_unknown();
        } else {
            c.restore(undone.phase, &undone.steps);
        }
        c.told(SINCE + 60_000, false)
    }

    /// The config store lost, the cooling-loss phase taken from the
    /// cooling actions in the event log: none logged (a log never
    /// wrapped) is cooled, so the CDU's first word that the rack has
    /// cooling runs nothing (no resume lifting an operator's drain); a
    /// power-down logged with no resume after it is a host powered down,
    /// powered up and resumed at that word.
    #[test]
    fn a_lost_config_store_takes_the_cooling_phase_from_the_event_log() {
        use loopwarden_protocol::CoolingStep::{Drain, PowerDown, PowerUp, Resume};
        let action = |step, ok| Event::CoolingAction {
            step,
            ok,
            exit_code: Some(0),
        };
        let health = Event::HealthChanged {
            gpu: GpuIndex::new(0).unwrap(),
            from: Healthy,
            to: Degraded,
            reason: ReasonCode::STRAGGLER,
        };
        let dir = tempfile::tempdir().unwrap();
        let (node, undone) = lost_after(
            &dir.path().join("none.flash"),
            std::slice::from_ref(&health),
        );
        assert!(!node.cooling_unknown(), "no cooling action: cooled");
        assert_eq!(cooled_word(&node, &undone), vec![]);
        let undone_loss = [
            action(Drain, true),
            action(PowerDown, true),
            action(PowerUp, true),
            action(Resume, true),
        ];
        let (node, undone) = lost_after(&dir.path().join("undone.flash"), &undone_loss);
        assert_eq!(
            (node.cooling_unknown(), undone.phase),
            (false, node_core::cooling_loss::Phase::Cooled)
        );
        assert_eq!(cooled_word(&node, &undone), vec![]);
        let down = [action(Drain, true), action(PowerDown, true), health];
        let (node, undone) = lost_after(&dir.path().join("down.flash"), &down);
        assert!(!node.cooling_unknown());
        assert_eq!(
            undone.phase,
            node_core::cooling_loss::Phase::PoweredDown { since: SINCE + 1 }
        );
        assert_eq!(cooled_word(&node, &undone), vec![PowerUp, Resume]);
    }

    /// The health changes `changes` (GPU, from, to, reason) logged in
    /// order at `SINCE` plus their index.
    fn health_changes(changes: &[(u8, HealthState, HealthState, ReasonCode)]) -> Vec<Event> {
        changes
            .iter()
            .map(|&(gpu, from, to, reason)| Event::HealthChanged {
                gpu: GpuIndex::new(gpu).unwrap(),
                from,
                to,
                reason,
            })
            .collect()
    }

    /// The recorder over the flash at `path` (`stores`), as the agent
    /// starts it.
    fn recorder_of(
        stores: loopwarden_store::agent_flash::Stores,
        path: &std::path::Path,
    ) -> loopwarden_store::recorder::Recorder {
        loopwarden_store::recorder::Recorder::start(stores.log, stores.store, Some(path)).unwrap()
    }

    /// The node's start and its first read of every GPU's limit (450 W
    /// found, or the read failing where `answers` says not), and the
    /// limits it keeps after that read kept by `r` under the GPUs'
    /// UUIDs (`uuids`), waited for.
    fn keep_first_read(
        r: &loopwarden_store::recorder::Recorder,
        node: &mut Node,
        uuids: [&str; 3],
        answers: [bool; 3],
    ) {
        use node_core::node::{Effect, Input, Now};
        let now = Now::at(SINCE + 10_000);
        node.step(now, Input::Start);
        let found: Vec<Result<Watts, String>> = (answers.iter())
            .map(|&a| {
                a.then_some(Watts(450))
                    .ok_or_else(|| "timed out".to_string())
            })
            .collect();
        for e in node.step(now, Input::LimitsRead(&found)) {
            let Effect::KeepLimits(limits) = e else {
                continue;
            };
            let records: Vec<_> = (limits.into_iter().enumerate())
                .filter_map(|(i, l)| super::super::limits::record(uuids[i], l?))
                .map(Result::unwrap)
                .collect();
            futures::executor::block_on(r.set_all_sync(records)).unwrap();
        }
    }

    /// GPU `gpu`'s health as `node` has it kept by `r` under its UUID
    /// (`uuid`), as the agent's `keep_health` keeps it.
    fn keep_health_of(r: &loopwarden_store::recorder::Recorder, node: &Node, gpu: u8, uuid: &str) {
        let id = id(uuid);
        let value = tagged(id, &postcard::to_allocvec(&node.gpu_health(gpu)).unwrap());
        let check = check_of(&value);
        r.set(Record::Health.key(id), value);
        r.set(health_check_key(id), check);
    }

    /// After a start from the flash at `path` (`stores`) that found the
    /// config store lost (`node`, `undone`, on the GPUs `uuids`): what the
    /// agent keeps (the health states taken back, kept here as the
    /// agent's `keep_health` keeps them; each GPU's limits as not read
    /// since and the cooling-loss phase when known, by the agent's own
    /// `lost_store::keep_after_loss`);
    /// then, where `answers` (whether each GPU's limit read answers), the
    /// limits the node keeps after that first read; and the lost mark
    /// cleared where its pending clear is ready. Whether it was.
    fn keep_after_loss(
        stores: loopwarden_store::agent_flash::Stores,
        path: &std::path::Path,
        (node, undone): (&mut Node, &super::super::Undone),
        uuids: [&str; 3],
        answers: Option<[bool; 3]>,
    ) -> bool {
        use super::super::lost_store::clear_mark;
        let r = recorder_of(stores, path);
        let before = r.refused();
        for &g in &undone.unreadable {
            keep_health_of(&r, node, g, uuids[g as usize]);
        }
        let started = (
            &*node,
            &uuids[..],
            &undone.unreadable[..],
            &undone.limits_unread[..],
        );
        let cooling = (undone.phase, &undone.steps[..]);
        let keep = super::super::lost_store::keep_after_loss(&r, started, cooling, before);
        let kept = futures::executor::block_on(keep);
        let pending = kept.unwrap();
        if let Some(answers) = answers {
            keep_first_read(&r, node, uuids, answers);
        }
        let cleared = pending.ready(node.cooling_unknown());
        if cleared {
            futures::executor::block_on(clear_mark(&r, pending)).unwrap();
        }
        futures::executor::block_on(r.flush());
        cleared
    }

    /// The errors said at the first read of every GPU's limit, at `found`,
    /// by a node started from the flash at `path`; whether the store was
    /// read as lost; the GPUs marked degraded as their kept state
    /// unreadable.
    fn said_at_start(path: &std::path::Path, found: u32) -> (bool, Vec<String>, Vec<u8>) {
        let mut stores = loopwarden_store::agent_flash::open(Some(path)).unwrap();
        let lost = stores.config_lost;
        let (mut node, undone) = restored_with(&mut stores.store, [X, A, B], &mut stores.log, lost);
        (lost, first_read(&mut node, found), undone.unreadable)
    }

    /// The GPUs said at a first read to have their kept limits unreadable.
    fn unreadable_limits(said: &[String]) -> Vec<u8> {
        (0..3u8)
            .filter(|i| {
                (said.iter())
                    .any(|l| l.starts_with(&format!("GPU {i}:")) && l.contains("unreadable"))
            })
            .collect()
    }

    /// The config store lost on a host with a lease's cap (say 350 W)
    /// left on its GPUs (no CDU: the phase known at the start). A start
    /// that kept what it took back and stopped before the GPUs' limits
    /// were first read clears the store's lost mark, yet the next start
    /// still reads every GPU's kept limits as unreadable and says the
    /// limit found as an error (it may be a leftover cap), never takes it
    /// quietly for the ceiling. GPU 2, whose limit never reads (hung,
    /// off the bus), holds no mark: the next start reads the store
    /// intact, degrades no other GPU, and says GPU 2's limit found as an
    /// error until its first read is kept.
    #[test]
    fn a_gpu_whose_limit_never_reads_keeps_only_its_own_limits_unreadable_after_a_loss() {
        let dir = tempfile::tempdir().unwrap();
        let logged = health_changes(&[(1, Healthy, Quarantined, ReasonCode::DBE_VOLATILE)]);
        let loss_and_start = |name: &str, answers: Option<[bool; 3]>| {
            let path = dir.path().join(name);
            lost_after(&path, &logged);
            let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
            assert!(stores.config_lost);
            let (mut node, undone) =
                restored_with(&mut stores.store, [X, A, B], &mut stores.log, true);
            let cleared = keep_after_loss(stores, &path, (&mut node, &undone), [X, A, B], answers);
            assert!(cleared, "{name}: the phase kept: the mark clears");
            path
        };
        let stopped = loss_and_start("stopped.flash", None);
        let (lost, said, degraded) = said_at_start(&stopped, 350);
        assert!(!lost && degraded.is_empty(), "{degraded:?}");
        assert_eq!(unreadable_limits(&said), vec![0, 1, 2], "{said:?}");

        let path = loss_and_start("hung.flash", Some([true, true, false]));
        let (lost, said, degraded) = said_at_start(&path, 450);
        assert!(!lost, "GPU 2's limit unread holds no mark");
        assert_eq!(degraded, Vec::<u8>::new(), "no GPU degraded anew");
        assert_eq!(unreadable_limits(&said), vec![2], "{said:?}");
        // GPU 2 answers at last: its first limits kept, over the record.
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        let (mut node, _) = restored_with(&mut stores.store, [X, A, B], &mut stores.log, false);
        let r = recorder_of(stores, &path);
        keep_first_read(&r, &mut node, [X, A, B], [true; 3]);
        futures::executor::block_on(r.flush());
        drop(r);
        let (_, said, _) = said_at_start(&path, 450);
        assert_eq!(unreadable_limits(&said), Vec::<u8>::new(), "{said:?}");
    }

    /// The config store lost in part: GPU 1's limits record survives
    /// (its site's limit 700 W, a lease's 450 W asked and left on it), the
    /// other GPUs' are gone. The start keeps the records that their limits
    /// were not read since the loss for GPUs 0 and 2 only, never over GPU
    /// 1's: a start that stopped before the first limit read (or whose
    /// GPU 1 never answers it) leaves the next start reading GPU 1's
    /// ceiling as kept, 700 W, not the 450 W cap found on it, and the
    /// other two's limits unreadable, said.
    #[test]
    fn a_limits_record_that_survives_a_partial_loss_is_not_overwritten() {
        use node_core::node::KeptLimit;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        let logged = health_changes(&[(2, Healthy, Degraded, ReasonCode::STRAGGLER)]);
        lost_after(&path, &logged);
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        assert!(stores.config_lost);
        let kept = KeptLimit {
            ceiling: Watts(700),
            asked: Watts(450),
            before: None,
        };
        let (key, value) = super::super::limits::record(A, kept).unwrap().unwrap();
        set(&mut stores.store, &key, &value);
        let (mut node, undone) = restored_with(&mut stores.store, [X, A, B], &mut stores.log, true);
        assert_eq!(undone.limits_unread, vec![0, 2], "GPU 1's record read");
        let cleared = keep_after_loss(stores, &path, (&mut node, &undone), [X, A, B], None);
        assert!(cleared, "no CDU: the phase known, the mark clears");
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        assert!(!stores.config_lost);
        let (mut node, _) = restored_with(&mut stores.store, [X, A, B], &mut stores.log, false);
        let said = first_read(&mut node, 450);
        assert_eq!(unreadable_limits(&said), vec![0, 2], "{said:?}");
        assert_eq!(node.ceiling(1), Some(Watts(700)), "GPU 1's kept ceiling");
        assert_eq!(
            node.ceiling(0),
            Some(Watts(450)),
            "GPU 0's: the limit found"
        );
    }

    /// A start that found the config store lost and stopped before it
    /// kept what it took back (its bus refused, a crash, a power cut), or
    /// kept it and stopped before the lost mark was cleared: the next
    /// start finds the store lost still and quarantines GPU 1 again from
    /// the event log, never healthy (nor logs it so). Once the states
    /// taken back are kept and the cooling-loss phase known and kept with
    /// them, the mark is cleared, and the next start reads them kept. On
    /// this host, which manages no cooling (no CDU), the phase is known at
    /// the start (cooled, whatever the log says: no cooling-loss action
    /// can have run), so the mark clears in the start that took them
    /// back; one a CDU cools waits for its word
    /// (`lost_store_run.rs`).
    #[test]
    fn a_start_stopped_after_finding_the_store_lost_quarantines_again_at_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        let logged = health_changes(&[(1, Healthy, Quarantined, ReasonCode::DBE_VOLATILE)]);
        let (node, _) = lost_after(&path, &logged);
        assert_eq!(node.health().status(1).unwrap().state, Quarantined);
        let state = |node: &Node| node.health().status(1).unwrap().state;
        // `keep`: what was taken back kept (the mark cleared), or the
        // start stopped before keeping anything.
        let restart = |keep: bool| {
            let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
            let lost = stores.config_lost;
            let (mut node, undone) =
                restored_with(&mut stores.store, [X, A, B], &mut stores.log, lost);
            if keep {
                assert!(!node.cooling_unknown(), "no CDU: cooled");
                let cleared = keep_after_loss(stores, &path, (&mut node, &undone), [X, A, B], None);
                assert!(cleared, "no CDU: the phase known, the mark clears");
            }
            (lost, node)
        };
        let (lost, node) = restart(false);
        assert!(lost, "the loss is not forgotten");
        assert_eq!(state(&node), Quarantined, "never healthy");
        let (lost, node) = restart(true);
        assert!(lost && state(&node) == Quarantined);
        let (lost, node) = restart(false);
        assert!(!lost, "what was taken back is kept");
        assert_eq!(state(&node), Quarantined, "as kept");
        let mut log = loopwarden_store::agent_flash::open(Some(&path))
            .unwrap()
            .log;
        let last = futures::executor::block_on(super::super::lost_store::last_changes(&mut log, 3));
        assert_eq!(last.unwrap()[1].as_ref().map(|l| l.to), Some(Quarantined));
    }

    /// The config store lost on a host that manages no cooling (no CDU),
    /// its event log not whole (its first sector erased, as a wrap cut
    /// before its marker leaves it: the oldest record is not 0), so the
    /// log cannot tell the cooling-loss phase: the phase is cooled (no
    /// cooling-loss action can have run, and no CDU's word would ever
    /// decide it), the mark clears in the start that took the GPUs back,
    /// and the start after it reads the store intact, GPU 0 not degraded
    /// (its kept state unreadable at every start, for ever, before).
    #[test]
    fn a_lost_store_with_a_log_not_whole_on_a_host_without_cdu_is_kept_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        let filler = health_changes(&[(2, Healthy, Degraded, ReasonCode::STRAGGLER)]);
        let events: Vec<Event> = std::iter::repeat_n(filler[0].clone(), 400).collect();
        lost_after(&path, &events);
        {
            use std::os::unix::fs::FileExt;
            let log = loopwarden_boards::FlashBoard::host_file().layout().log;
            let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            file.write_all_at(&[0xFF; 4096], log.start.into()).unwrap();
        }
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        assert!(stores.config_lost);
        let oldest = futures::executor::block_on(stores.log.oldest()).unwrap();
        assert!(oldest.is_some_and(|s| s > 0), "{oldest:?}");
        let (mut node, undone) = restored_with(&mut stores.store, [X, A, B], &mut stores.log, true);
        assert_eq!(undone.unreadable, vec![0, 1, 2], "the store lost");
        assert!(!node.cooling_unknown(), "no CDU: cooled");
        let taken_back = node.gpu_health(0);
        assert!(keep_after_loss(
            stores,
            &path,
            (&mut node, &undone),
            [X, A, B],
            Some([true; 3])
        ));
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        assert!(!stores.config_lost, "the mark is cleared");
        let (node, undone) = restored_with(&mut stores.store, [X, A, B], &mut stores.log, false);
        assert_eq!(undone.unreadable, Vec::<u8>::new(), "no GPU degraded anew");
        let kept = node.gpu_health(0);
        assert_eq!(
            (kept.state, kept.since),
            (taken_back.state, taken_back.since),
            "GPU 0 as kept: its quiet period counts from the first start"
        );
    }

    /// The config store lost and GPU 1, quarantined before as the event
    /// log says, not saying its UUID at the start (the sick GPU is the
    /// likeliest not to answer): it is quarantined again from the log,
    /// which names it by index, its actions run again, never only marked
    /// degraded (which heals after the quiet period, and the UUID read
    /// later finds nothing in the lost store).
    #[test]
    fn a_lost_config_store_quarantines_again_a_gpu_whose_uuid_is_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let logged = health_changes(&[(1, Healthy, Quarantined, ReasonCode::DBE_VOLATILE)]);
        let path = dir.path().join("host.flash");
        let (node, undone) = lost_after_on(&path, &logged, [X, UNKNOWN_UUID, B]);
        let st = node.health().status(1).unwrap();
        assert_eq!(
            (st.state, st.reason),
            (Quarantined, ReasonCode::DBE_VOLATILE)
        );
        assert_eq!(undone.quarantines, vec![1], "its actions run again");
    }

    /// The config store lost, the event log saying GPU 1 (A) quarantined
    /// and naming GPU index 2 (a cap applied to GPUs 0 to 2): a start that
    /// finds two GPUs, X and B (A taken out of the host, B renumbered from
    /// 2 into 1), cannot tell from the log, which names GPUs by index,
    /// whether GPU 1 is the GPU that failed. It keeps the quarantine (the
    /// GPU that failed may be there, a GPU after it gone) but never
    /// silently: its evidence, in the log and `ctl why 1`, names the
    /// renumbering and how to release it. With three GPUs found, the
    /// quarantine is taken back with no such doubt said.
    #[test]
    fn a_quarantine_from_the_log_at_a_start_finding_fewer_gpus_says_it_may_be_another_gpu() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        let mut logged = health_changes(&[(1, Healthy, Quarantined, ReasonCode::DBE_VOLATILE)]);
        logged.push(Event::CapsApplied {
            gpus: 0b111,
            limit: Watts(450),
            source: None,
        });
        let (started, _) = lost_after_on(&path, &logged, [X, A, B]);
        let three = started.health().status(1).unwrap();
        assert_eq!(three.state, Quarantined);
        assert!(!three.evidence.contains("renumbered"), "{}", three.evidence);

        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        assert!(stores.config_lost);
        let gpus = vec![gpu(X), gpu(B)];
        let mut two = node(&config(), &gpus, TimestampMs(SINCE + 10_000));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (store, log) = (&mut stores.store, &mut stores.log);
        rt.block_on(restore_kept(&mut two, &config(), &gpus, store, log, true));
        let st = two.health().status(1).unwrap();
        assert_eq!(st.state, Quarantined, "in doubt, kept");
        assert!(
            st.evidence.contains("event log names GPU index 2")
                && st.evidence.contains("finds 2 GPUs")
                && st.evidence.contains("renumbered")
                && st.evidence.contains("quarantine_release"),
            "{}",
            st.evidence
        );
    }

    /// The config store lost, the event log saying GPU 1 quarantined and
    /// the host draining for a cooling loss, GPU 1 not saying its UUID at
    /// the start: its state cannot be kept (no record names it), so the
    /// store's lost mark waits for it to say its UUID (a stop before then
    /// leaves the mark for the next start, said); the cooling-loss phase
    /// taken back is kept all the same, so a start that finds the store
    /// intact later reads the host draining, never cooled on the store's
    /// silence.
    #[test]
    fn a_lost_store_keeps_the_phase_taken_back_while_a_gpus_uuid_is_unknown() {
        use node_core::cooling_loss::Phase;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        let mut logged = health_changes(&[(1, Healthy, Quarantined, ReasonCode::DBE_VOLATILE)]);
        logged.push(Event::CoolingAction {
            step: loopwarden_protocol::CoolingStep::Drain,
            ok: true,
            exit_code: Some(0),
        });
        let uuids = [X, UNKNOWN_UUID, B];
        lost_after_on(&path, &logged, uuids);
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        let (node, undone) = restored_with(&mut stores.store, uuids, &mut stores.log, true);
        let draining = Phase::Draining { since: SINCE + 1 };
        assert_eq!((node.cooling_unknown(), undone.phase), (false, draining));
        let r = recorder_of(stores, &path);
        let started = (
            &node,
            &uuids[..],
            &undone.unreadable[..],
            &undone.limits_unread[..],
        );
        let cooling = (undone.phase, &undone.steps[..]);
        let keep = super::super::lost_store::keep_after_loss(&r, started, cooling, 0);
        let pending = futures::executor::block_on(keep).unwrap();
        assert_eq!(pending.unkept(), &[1]);
        assert!(!pending.ready(false), "the mark waits for GPU 1");
        futures::executor::block_on(r.flush());
        drop(r);
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        assert!(
            stores.config_lost,
            "stopped before GPU 1 said it: the mark stays"
        );
        let cannot_tell = Some(Err("the log is not read".to_string()));
        let kept = futures::executor::block_on(super::super::cooling::restore(
            &mut stores.store,
            cannot_tell,
        ));
        assert_eq!(kept.map(|k| k.0), Some(draining), "the phase is in flash");
    }

    /// The config store lost on a host without CDU (the phase known at
    /// the start): the lost mark's clear is spawned off the loop as the
    /// agent spawns it, and a clean stop right after, on a runtime that
    /// has not run it yet, waits for it as the agent's stop does: the next
    /// start reads the store intact (a stop that did not wait dropped the
    /// clear with the runtime, and the next start read the store as lost
    /// again, every GPU not quarantined degraded).
    #[test]
    fn a_clean_stop_waits_for_the_lost_marks_clear_under_way() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        let logged = health_changes(&[(1, Healthy, Quarantined, ReasonCode::DBE_VOLATILE)]);
        lost_after(&path, &logged);
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        assert!(stores.config_lost);
        let (node, undone) = restored_with(&mut stores.store, [X, A, B], &mut stores.log, true);
        let r = recorder_of(stores, &path);
        for &g in &undone.unreadable {
            keep_health_of(&r, &node, g, [X, A, B][g as usize]);
        }
        let started = (
            &node,
            &[X, A, B][..],
            &undone.unreadable[..],
            &undone.limits_unread[..],
        );
        let cooling = (undone.phase, &undone.steps[..]);
        let keep = super::super::lost_store::keep_after_loss(&r, started, cooling, 0);
        let pending = futures::executor::block_on(keep).unwrap();
        assert!(pending.ready(node.cooling_unknown()));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let clearing = super::super::lost_store::spawn_clear(r.clone(), pending);
            super::super::lost_store::finish_clear(clearing).await;
        });
        drop(rt);
        futures::executor::block_on(r.flush());
        drop(r);
        let stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        assert!(!stores.config_lost, "the clear was waited for");
    }

    /// The config store lost, the event log saying GPU 1 quarantined, GPU
    /// 1 (A) not saying its UUID at the start: the lost mark waits for it
    /// (its state can be kept under no UUID before). It says it later in
    /// the run: its state (quarantined again from the log) is kept under
    /// its UUID, by the node's step that takes its identity, and its
    /// limits as not read since the loss (no record of them survived),
    /// and the mark, which waited for GPU 1 last, clears: the next start
    /// reads the store intact, GPU 1 quarantined as kept, no GPU degraded
    /// anew, every GPU's limit found said as an error (never taken
    /// quietly for its ceiling: it may be a cap a lease left).
    #[test]
    fn a_gpu_identified_late_after_a_loss_is_kept_and_clears_the_lost_mark() {
        use node_core::node::{Effect, Input, Now};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        let logged = health_changes(&[(1, Healthy, Quarantined, ReasonCode::DBE_VOLATILE)]);
        let uuids = [X, UNKNOWN_UUID, B];
        lost_after_on(&path, &logged, uuids);
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        assert!(stores.config_lost);
        let (mut node, undone) = restored_with(&mut stores.store, uuids, &mut stores.log, true);
        assert_eq!(node.health().status(1).unwrap().state, Quarantined);
        let r = recorder_of(stores, &path);
        let before = r.refused();
        for &g in undone.unreadable.iter().filter(|&&g| g != 1) {
            keep_health_of(&r, &node, g, uuids[g as usize]);
        }
        let started = (
            &node,
            &uuids[..],
            &undone.unreadable[..],
            &undone.limits_unread[..],
        );
        let cooling = (undone.phase, &undone.steps[..]);
        let keep = super::super::lost_store::keep_after_loss(&r, started, cooling, before);
        let mut pending = futures::executor::block_on(keep).unwrap();
        assert!(!pending.ready(node.cooling_unknown()), "waits for GPU 1");
        // GPU 1 says its UUID, A, as the agent's late identification
        // takes it.
        let found = futures::executor::block_on(super::super::limits::kept_through(&r, A));
        assert_eq!(found, Ok(None), "no record of A's limits survived");
        let waited = pending.identified(&r, (1, A), &found);
        assert!(futures::executor::block_on(waited));
        let now = Now::at(SINCE + 20_000);
        let identified = Input::Identified {
            gpu: 1,
            kept: None,
            limit: None,
        };
        assert!(node.step(now, identified).contains(&Effect::KeepHealth(1)));
        keep_health_of(&r, &node, 1, A);
        assert!(pending.ready(node.cooling_unknown()), "GPU 1 was the last");
        futures::executor::block_on(super::super::lost_store::clear_mark(&r, pending)).unwrap();
        futures::executor::block_on(r.flush());
        drop(r);
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        assert!(!stores.config_lost, "the mark is cleared");
        let (mut node, undone) =
            restored_with(&mut stores.store, [X, A, B], &mut stores.log, false);
        assert_eq!(undone.unreadable, Vec::<u8>::new(), "no GPU degraded anew");
        assert_eq!(node.health().status(1).unwrap().state, Quarantined);
        let said = first_read(&mut node, 450);
        assert_eq!(unreadable_limits(&said), vec![0, 1, 2], "{said:?}");
    }

    /// The config store lost in part, GPU 1 (A) not saying its UUID at the
    /// start, its limits record surviving (its site's limit 700 W, a
    /// lease's 450 W asked and left on it): when it says its UUID later
    /// in the run, the record read through the recorder is kept as it is,
    /// never overwritten by the record that its limits were not read
    /// since, and the mark clears; with no limit read in the run, the
    /// next start, reading the store intact, has GPU 1's ceiling 700 W as
    /// kept, not the 450 W cap found on it.
    #[test]
    fn a_gpu_identified_late_whose_limits_record_survived_keeps_it() {
        use node_core::node::{Input, KeptLimit, Now};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        let logged = health_changes(&[(2, Healthy, Degraded, ReasonCode::STRAGGLER)]);
        let uuids = [X, UNKNOWN_UUID, B];
        lost_after_on(&path, &logged, uuids);
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        assert!(stores.config_lost);
        let kept = KeptLimit {
            ceiling: Watts(700),
            asked: Watts(450),
            before: None,
        };
        let (key, value) = super::super::limits::record(A, kept).unwrap().unwrap();
        set(&mut stores.store, &key, &value);
        let (mut node, undone) = restored_with(&mut stores.store, uuids, &mut stores.log, true);
        let r = recorder_of(stores, &path);
        let before = r.refused();
        for &g in undone.unreadable.iter().filter(|&&g| g != 1) {
            keep_health_of(&r, &node, g, uuids[g as usize]);
        }
        let started = (
            &node,
            &uuids[..],
            &undone.unreadable[..],
            &undone.limits_unread[..],
        );
        let cooling = (undone.phase, &undone.steps[..]);
        let keep = super::super::lost_store::keep_after_loss(&r, started, cooling, before);
        let mut pending = futures::executor::block_on(keep).unwrap();
        let found = futures::executor::block_on(super::super::limits::kept_through(&r, A));
        assert_eq!(found, Ok(Some(kept)), "A's record survived");
        assert!(futures::executor::block_on(pending.identified(
            &r,
            (1, A),
            &found
        )));
        let identified = Input::Identified {
            gpu: 1,
            kept: None,
            limit: found.clone().unwrap(),
        };
        node.step(Now::at(SINCE + 20_000), identified);
        keep_health_of(&r, &node, 1, A);
        assert!(pending.ready(node.cooling_unknown()), "GPU 1 was the last");
        futures::executor::block_on(super::super::lost_store::clear_mark(&r, pending)).unwrap();
        futures::executor::block_on(r.flush());
        drop(r);
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        assert!(!stores.config_lost, "the mark is cleared");
        let (mut node, _) = restored_with(&mut stores.store, [X, A, B], &mut stores.log, false);
        let said = first_read(&mut node, 450);
        assert_eq!(node.ceiling(1), Some(Watts(700)), "A's kept ceiling");
        assert_eq!(unreadable_limits(&said), vec![0, 2], "{said:?}");
    }

    /// GPU 1 (A) quarantined, as the store and the event log say; then
    /// another GPU (C) in its slot, which starts healthy from the intact
    /// store: the start logs GPU 1's change back to healthy, so a config
    /// store lost later does not quarantine C for A's quarantine. GPU 2
    /// (A moved there) starts quarantined: logged so, it is quarantined
    /// again after the loss.
    #[test]
    fn a_gpu_in_the_slot_of_one_quarantined_is_logged_as_it_starts() {
        const C: &str = "GPU-cccccccc-cccc-cccc-cccc-cccccccccccc";
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        {
            let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
            let logged = health_changes(&[(1, Healthy, Quarantined, ReasonCode::DBE_VOLATILE)]);
            let body = |e: &Event| {
                loopwarden_store::resend::event_body(&Message::Event(e.clone())).unwrap()
            };
            let kind = MessageKind::Event as u8;
            let body = body(&logged[0]);
            let append = stores.log.append(TimestampMs(SINCE), kind, &body);
            futures::executor::block_on(append).unwrap();
            let a = id(A);
            let quarantine = tagged(a, &quarantined(1));
            set(&mut stores.store, &Record::Health.key(a), &quarantine);
            set(
                &mut stores.store,
                &health_check_key(a),
                &check_of(&quarantine),
            );
            let states = |node: &Node| {
                (0..3)
                    .map(|i| node.health().status(i).unwrap().state)
                    .collect::<Vec<_>>()
            };
            let (node, _) = restored_with(&mut stores.store, [X, A, B], &mut stores.log, false);
            assert_eq!(states(&node), vec![Healthy, Quarantined, Healthy]);
            let (node, _) = restored_with(&mut stores.store, [X, C, A], &mut stores.log, false);
            assert_eq!(states(&node), vec![Healthy, Healthy, Quarantined]);
        }
        erase_config_store(&path);
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).unwrap();
        assert!(stores.config_lost);
        let (node, _) = restored_with(&mut stores.store, [X, C, A], &mut stores.log, true);
        let state = |i| node.health().status(i).unwrap().state;
        assert_ne!(state(1), Quarantined, "C, in the slot A left");
        assert_eq!(state(2), Quarantined, "A, moved");
    }
}
