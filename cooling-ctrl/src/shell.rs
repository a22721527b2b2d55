//! The controller's real-time shell: the control core ([`cooling_core`]) in
//! charge of one real CDU, on the bus. It only moves bytes; every decision
//! is the decision path's ([`crate::decide`], the same code `simulate`
//! runs) or the core's.
//!
//! Each period (a tokio interval, `ShellConfig::period`, 1 s by default):
//! 1. read the CDU through its [`CduPort`] and the board's leak lines
//!    (`shell/devices.rs`: an error is counted and logged once per change of its
//!    message; "refused" and "no answer" both mean no readings this step);
//!    pick the outdoor temperature (`shell/bms.rs`);
//! 2. run the decision path's step ([`Decider::step`]) with the time in ms
//!    since the shell started (a monotonic clock);
//! 3. write the latched record to flash when it changed, and wait for it;
//! 4. write the planned settings to the CDU, one by one in safety order;
//!    pulse the healthy relay, set the beacon;
//! 5. publish: `CduTelemetry` every period (QoS 0; a lost sensor is null),
//!    `CduState` (retained, family `health`) when the mode, the setpoint
//!    (by 0.5 K or more) or a rack's cooling changes and at least every
//!    60 s (the bus announces the latest again after every reconnection),
//!    every event as an `event` frame, and their JSON mirrors;
//! 6. sign and send the cap leases the decision path says are due
//!    ([`crate::decide::leases`]: source cooling, one lease id per host,
//!    `caps = [all GPUs at the cap]`, duration `ShellConfig::lease`; a
//!    lifted cap goes as a 5-second lease at the GPU's TDP).
//!
//! Between periods it takes the BMS's writes as they come (`shell/bms.rs`:
//! the holding registers read them at once, the limits are the core's from
//! the next step), operators' requests, and what the bus brings: readers'
//! requests to resend logged events, on this CDU's `resend` topic, handed
//! first and unread to the resender ([`loopwarden_bus::resend::Resender`],
//! which checks them against [`BusOptions::readers`] and answers from the
//! flash's event log on the `resent` topic); host telemetry (one
//! subscription per host of its own, at QoS 0 as telemetry is published,
//! so the broker sends it no other CDU's hosts), handed to the decision
//! path, which judges it ([`crate::decide::hosts`]), and acks (every
//! host's `ack` family, one filter: acks are few, and a broker may keep
//! session state per QoS 1 filter) of the commands this CDU sent, counted
//! in [`ShellStats`].
//!
//! Commands take their sequence numbers from the bus's one counter, as
//! every frame of this node does; the counter starts above a block
//! reserved in flash and stays below the reserved floor, so a restarted
//! controller's commands are never refused as replayed (bus.md §4.1).
//! Events and leases go through the flash outbox, by the recorder, and
//! reach the broker after a crash too.
//!
//! Observing it: run it with [`run_with`], giving
//! [`ShellOptions::stats`] a [`watch::Sender`] of [`ShellStats`] (see
//! [`stats_channel`]); the shell replaces the value after every step and
//! every ack. Besides the counters it carries a [`Snapshot`] of the core
//! (mode, sensors, loops, leaks, pumps) taken after each step, when each
//! host was last heard and each host's last ack: what the console shows.
//! [`BusOptions::flash`] is the controller's flash (opened by the
//! caller, in memory when `None`): every core event and every lease
//! sent or lifted goes to its event log as a [`Journal`] entry, off the control
//! loop (the `cooling-ctrl run` command writes them to flash). [`run`] is
//! [`run_with`] without options.
//!
//! What the core learned of the hall (`cooling_core::estimate`) survives
//! restarts: at start the shell restores it from the flash's
//! `cdu.learned.*` keys (logging what it restored, or why not), and keeps
//! it there every [`journal::LEARNED_EVERY`] of running and at a clean
//! stop, handed to the recorder without waiting (a part whose bytes are
//! what the flash held at start or was last handed is not written again:
//! `cooling_decide::learned::LearnedKeeper`, the firmware's keeper).
//!
//! Glossary:
//! - *lease*: a power cap that holds for its duration from the frame's
//!   timestamp unless renewed.
//! - *lift*: the short lease at TDP sent when a cap ends.

use std::boxed::Box;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::format;
use std::future::Future;
use std::string::{String, ToString};
use std::time::Duration;
use std::vec;
use std::vec::Vec;

use loopwarden_bus::resend::Resender;
use loopwarden_bus::{now_ms, Brokers, Bus, BusConfig, Inbound, PublishError};
use loopwarden_protocol::auth::{Signer, SigningKey};
use loopwarden_protocol::message::{
    Ack, AckCode, CduMode, CduState, CduTelemetry, Event, GpuCap, LeakSensing, Pump, PumpStatus,
    RackCooling, RackState, RackStatus, SensorFault,
};
use loopwarden_protocol::topic::filter;
use loopwarden_protocol::units::{Celsius, LitresPerMinute, Percent, Pue, TimestampMs, Watts};
use loopwarden_protocol::{
    Family, Frame, Ident, Message, NodeId, RackIndex, ReasonCode, Role, Topic,
};
use loopwarden_store::agent_flash::SeqFloor;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};

use cooling_core::sensors::Which;
use cooling_core::{Commands, ConfigError, Core, CoreConfig, LoopStatus, MAX_HOSTS};

use crate::decide::learned::{LearnedKeeper, ToKeep};
use crate::decide::{self, BoardRead, Decider, MapLimits, Outcome, StepIn};
use crate::estimates::Estimates;
use crate::journal::{self, ControllerFlash, LatchRecord, LearnedRecords, Recorder};
use crate::modbus::{CduError, CduMeasurements, CduPort};
use crate::northbound::{
    snapshot_from, CduTook, NorthboundSettings, NorthboundSnapshot, NorthboundWrite,
};

mod bms;
mod devices;
mod facility;
mod keeping;
mod leases;
mod links;
mod operator;
mod publish;
pub(crate) mod start;
mod stats;

use crate::decide::leases::LeaseBook;
pub use crate::decide::leases::{cap_lease, CAP_RESEND_W, LIFT_DURATION};
use crate::decide::outdoor::{self, OutdoorSource, OutdoorSources};
pub(crate) use bms::last_bms_writes;
pub(crate) use facility::{hall_state, hall_subscription, FacilityLink};
use keeping::{learned_keeper, Keeping};
pub use leases::{host_report, send_lease, LeaseNotSent};
pub use links::{
    BoardIo, NorthboundLink, OperatorAction, OperatorRequest, PendingRequest, RequestOutcome,
};
pub use publish::{cdu_state, cdu_telemetry, send_state, StateKey, StateSent, StepFacts};
pub(crate) use start::{bus_config, start_bus};
use start::{check_ropes, log_said, restore_bms_limits, restore_learned, start_decider};
pub(crate) use stats::shown;
pub use stats::{
    stats_channel, CapSent, FacilityStatus, LastAck, LeakSteps, ResendCounts, SensorStatus,
    ShellStats, Snapshot,
};

/// Why a pump's trip is not cleared while the CDU is not read.
const NOT_READ: &str =
    "not cleared: the CDU has not answered since the start or does not answer now, \
     so whether it still shows the pump's fault is unknown";

/// A setpoint that moves by this much or more republishes the state, K.
pub const STATE_SETPOINT_K: f32 = 0.5;
/// The state is republished at least this often.
pub const STATE_EVERY: Duration = Duration::from_secs(60);

/// What the shell runs with.
#[derive(Debug, Clone)]
pub struct ShellConfig {
    /// The site (first level below `dc/v2`).
    pub site: Ident,
    /// This CDU's id (its node on the bus has role `cdu`).
    pub cdu: Ident,
    /// The broker, or the nodes of a broker cluster: the bus connects to
    /// the first that answers and fails over to the next.
    pub broker: Brokers,
    /// The control core's configuration.
    pub core: CoreConfig,
    /// The control period (1 s by default).
    pub period: Duration,
    /// The id on the bus of each host index (rack-major, as the core's).
    /// At most the layout's hosts; indices past the end have no host.
    pub hosts: Vec<Ident>,
    /// TLS to the broker.
    pub tls: Option<loopwarden_bus::tls::Tls>,
    /// The id of the sign key cap leases are signed with.
    pub key_id: u8,
    /// The sign key itself (`None`: none yet; no lease can be sent).
    pub key: Option<SigningKey>,
    /// How long a cap lease holds (30 s by default); renewed every third
    /// of it while the cap stays.
    pub lease: Duration,
    /// The CDU's heartbeat timeout where the site figures give it: the
    /// most the heartbeat waits after the start for a read-back (else 10 s).
    pub heartbeat_timeout: Option<Duration>,
}

/// How a controller is on the bus besides its config: the same for
/// [`run_with`] and the gateway (`crate::gateway::run`).
#[derive(Default)]
pub struct BusOptions {
    /// MQTT user name and password, for brokers that require them.
    pub credentials: Option<(String, String)>,
    /// MQTT keep-alive; `None`: the bus's default (5 s).
    pub keep_alive: Option<Duration>,
    /// The JSON `online` on a connection of its own
    /// (`BusConfig::json_presence`); `None`: the bus's default (on).
    pub json_presence: Option<bool>,
    /// The controller's flash (event log, outbox, sequence floor), opened
    /// by the caller so its console can read the log; `None`: one in
    /// memory, lost at exit.
    pub flash: Option<ControllerFlash>,
    /// The readers (operators, facility systems) that may ask this CDU to
    /// resend its logged events, those with the `resend` right (the
    /// keyring's); empty: every request is refused as unauthenticated.
    pub readers: Vec<Signer>,
}

impl BusOptions {
    /// What `config` gives, with the controller's `flash`.
    pub fn of(config: &crate::config::Config, flash: ControllerFlash) -> Self {
        Self {
            credentials: config.credentials.clone(),
            keep_alive: Some(config.keep_alive),
            json_presence: Some(config.json_presence),
            flash: Some(flash),
            readers: config.readers.clone(),
        }
    }

    /// The controller's flash as given, else one in memory (lost at
    /// exit).
    pub(crate) fn take_flash(&mut self) -> Result<ControllerFlash, ShellError> {
        match self.flash.take() {
            Some(f) => Ok(f),
            None => ControllerFlash::open(None).map_err(ShellError::Flash),
        }
    }
}

impl std::fmt::Debug for BusOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BusOptions")
            .field("credentials", &self.credentials.as_ref().map(|(u, _)| u))
            .field("keep_alive", &self.keep_alive)
            .field("json_presence", &self.json_presence)
            .field("flash", &self.flash)
            .field("readers", &self.readers.len())
            .finish()
    }
}

/// What [`run_with`] takes besides the config.
#[derive(Default)]
pub struct ShellOptions {
    /// Where the shell reports its counters (see [`stats_channel`]);
    /// `None`: nowhere.
    pub stats: Option<watch::Sender<ShellStats>>,
    /// How it is on the bus: login, keep-alive, flash, readers.
    pub bus: BusOptions,
    /// The northbound Modbus server's link; `None`: no server.
    pub northbound: Option<NorthboundLink>,
    /// The board's pins; `None`: leaks come from the CDU's leak register
    /// only, and no relay or beacon is driven.
    pub board: Option<Box<dyn BoardIo>>,
    /// Operators' requests (from the console); `None`: none taken.
    pub operator: Option<mpsc::Receiver<OperatorRequest>>,
    /// This CDU's part in a hall of several CDUs (`[facility]`); `None`:
    /// its setpoint alone sets its facility water.
    pub facility: Option<crate::facility::FacilityRole>,
}

impl std::fmt::Debug for ShellOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShellOptions")
            .field("stats", &self.stats.is_some())
            .field("bus", &self.bus)
            .field("northbound", &self.northbound.is_some())
            .field("board", &self.board.is_some())
            .field("operator", &self.operator.is_some())
            .field("facility", &self.facility)
            .finish()
    }
}

/// What the shell logs to the controller's flash.
#[derive(Debug, Clone)]
pub enum Journal {
    /// A core event, as published.
    Event {
        /// When (Unix ms).
        time: TimestampMs,
        /// The event.
        event: Event,
    },
    /// A signed lease the bus took for a host: a cap, or a lift.
    Lease {
        /// The host it went to.
        host: Ident,
        /// The frame as sent (its time is when).
        frame: Box<Frame>,
        /// A lift (the short lease at TDP that ends a cap).
        lift: bool,
    },
}

impl ShellConfig {
    /// A shell for CDU `cdu` of `site` on `broker`, with a 1 s period and
    /// 30 s leases, no hosts, plain MQTT and no sign key (set one before
    /// leases are to be sent).
    pub fn new(site: Ident, cdu: Ident, broker: impl Into<Brokers>, core: CoreConfig) -> Self {
        Self {
            site,
            cdu,
            broker: broker.into(),
            core,
            period: Duration::from_secs(1),
            hosts: Vec::new(),
            tls: None,
            key_id: 1,
            key: None,
            lease: crate::decide::leases::LEASE_DEFAULT,
            heartbeat_timeout: None,
        }
    }

    /// Checks what the shell cannot run with, the core's configuration
    /// first.
    pub fn validate(&self) -> Result<(), ShellError> {
        self.core.validate().map_err(ShellError::Core)?;
        let bad = |what: String| Err(ShellError::Config(what));
        let hosts = self.core.layout.hosts().min(MAX_HOSTS);
        if self.hosts.len() > hosts {
            return bad(format!(
                "hosts: {} ids for a layout of {hosts} hosts",
                self.hosts.len()
            ));
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if self.hosts[..i].contains(h) {
                return bad(format!("hosts: {h} appears twice"));
            }
        }
        if self.period.is_zero() {
            return bad("period: must be above 0".into());
        }
        let lease_ms = self.lease.as_millis();
        if lease_ms < 3 || lease_ms > u128::from(u32::MAX) {
            return bad("lease: from 3 ms to 49 days".into());
        }
        if self.key.is_none() && !self.hosts.is_empty() {
            return bad("key: a sign key is needed to sign cap leases".into());
        }
        Ok(())
    }
}

/// Why the shell could not run.
#[derive(Debug)]
#[non_exhaustive]
pub enum ShellError {
    /// The shell's own configuration.
    Config(String),
    /// The core's configuration.
    Core(ConfigError),
    /// The bus: a topic or a subscription it cannot make.
    Bus(String),
    /// The flash in memory could not be opened.
    Flash(String),
}

impl fmt::Display for ShellError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(w) => write!(f, "cooling shell config: {w}"),
            Self::Core(e) => write!(f, "cooling shell config: control core: {e}"),
            Self::Bus(w) => write!(f, "cooling shell bus: {w}"),
            Self::Flash(w) => write!(f, "cooling shell flash: {w}"),
        }
    }
}

impl std::error::Error for ShellError {}

struct Shell<P> {
    cfg: ShellConfig,
    stats_tx: Option<watch::Sender<ShellStats>>,
    stats: ShellStats,
    /// The core and the decision path around it (shared with the twin).
    decider: Decider,
    /// The CDU and the board.
    devices: devices::Devices<P>,
    /// The northbound server and what the BMS set.
    bms: bms::Bms,
    /// The flash: the journal, the sequence floor, what was learned.
    keeping: Keeping,
    bus: Bus,
    me: NodeId,
    started: Instant,
    /// The last step took longer than the period (said once per onset).
    late: bool,
    index: HashMap<Ident, usize>,
    /// The leases sent, and which are due.
    lease_book: LeaseBook,
    /// The state last published.
    state_sent: Option<StateSent>,
    /// What the leak inputs said at the last step, and last heard.
    leak_inputs: publish::HeardLeaks,
    /// This CDU's part in a hall of several CDUs.
    facility: Option<facility::FacilityLink>,
    /// Answers readers' requests to resend logged events.
    resender: Resender,
    /// Hosts whose last ack took a lease for less time than asked (said).
    shortened: std::collections::BTreeSet<String>,
}

/// Runs the shell for the CDU behind `cdu` until `shutdown` completes,
/// then leaves the bus (announcing `online: false`, waiting up to 3 s for
/// the broker to acknowledge what was handed over). Caps in force stay
/// until their leases expire.
pub async fn run<P: CduPort>(
    cfg: ShellConfig,
    cdu: P,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ShellError> {
    run_with(cfg, ShellOptions::default(), cdu, shutdown).await
}

/// As [`run`], reporting to `opts.stats` and on the bus as `opts.bus`
/// says.
pub async fn run_with<P: CduPort>(
    cfg: ShellConfig,
    mut opts: ShellOptions,
    cdu: P,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ShellError> {
    cfg.validate()?;
    check_ropes(&cfg.core, opts.board.as_ref().map(|b| b.roped()))?;
    let flash = opts.bus.take_flash()?;
    let floor = flash.relatch_floor;
    let mut decider = start_decider(cfg.core, cdu.limits(), &flash.latched, floor)?;
    restore_learned(decider.core_mut(), &flash.learned, &cfg.hosts);
    let bms_limits = restore_bms_limits(decider.core_mut(), &flash.bms_limits);
    let in_hall = opts.facility.is_some();
    let (me, bus_config) = bus_config(&cfg, &mut opts.bus, flash.first_seq, in_hall)?;
    let facility = opts
        .facility
        .map(|role| facility::FacilityLink::new(role, &cfg.cdu, &cfg.core));
    let (bus, mut inbound, bus_task, resender) = start_bus(
        bus_config,
        Box::new(flash.outbox),
        &flash.recorder,
        opts.bus.readers,
    );
    tracing::info!(
        "cooling shell: CDU {} of site {}, {} hosts, period {} ms, broker {}",
        cfg.cdu,
        cfg.site,
        cfg.hosts.len(),
        cfg.period.as_millis(),
        cfg.broker
    );
    let started = Started {
        decider,
        bus,
        me,
        recorder: flash.recorder.clone(),
        first_seq: flash.first_seq,
        resender,
        learned: learned_keeper(&flash.learned),
    };
    let mut shell = Shell::new(cfg, started, cdu, opts.stats, opts.northbound, opts.board);
    // The holding registers read the limits in force: those restored, or
    // the core's own, tightened to the CDU's map (a map whose setpoint
    // tops out below the site's highest reads that, not the site's).
    let in_force = bms_limits.unwrap_or_else(|| shell.decider.core().limits());
    shell.bms.restored(in_force);
    shell.keeping.bms = journal::BmsKeeping::after(flash.bms_limits_gen);
    shell.facility = facility;
    let mut operator = opts.operator;
    let mut bms_writes = shell.bms.writes();
    let mut tick = tokio::time::interval(shell.cfg.period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let began = Instant::now();
                shell.step().await;
                shell.timed(began.elapsed());
            }
            Some(msg) = inbound.recv() => shell.on_inbound(msg),
            Some(req) = next(&mut operator) => shell.on_operator(req),
            Some(w) = next(&mut bms_writes) => shell.on_bms(w),
            _ = &mut shutdown => break,
        }
    }
    tracing::info!("cooling shell: stopping");
    shell.last_bms_writes(bms_writes);
    // What was learned is kept, and everything decided is written and
    // handed to the bus, before it stops.
    let now = shell.now_ms();
    shell.keep_learned(now, true);
    shell.keep_bms_limits();
    shell.keeping.recorder.flush().await;
    if let Err(e) = shell.bus.shutdown(Duration::from_secs(3)).await {
        tracing::warn!("cooling shell: leaving the bus: {e}");
    }
    bus_task.join(Duration::from_secs(3)).await;
    // The last counters carry every publish, the leaving ones included.
    if let Some(st) = shell.stats.status.as_mut() {
        st.bus = shell.bus.metrics();
    }
    shell.report();
    Ok(())
}

/// The next of `rx`, never when there is none.
pub(crate) async fn next<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// What the shell starts with besides its config and its links.
struct Started {
    decider: Decider,
    bus: Bus,
    me: NodeId,
    recorder: Recorder,
    first_seq: u32,
    resender: Resender,
    learned: Box<LearnedKeeper>,
}

impl<P: CduPort> Shell<P> {
    /// A shell for `cfg` on what was `started`, reading `cdu`.
    fn new(
        cfg: ShellConfig,
        started: Started,
        cdu: P,
        stats_tx: Option<watch::Sender<ShellStats>>,
        northbound: Option<NorthboundLink>,
        board: Option<Box<dyn BoardIo>>,
    ) -> Self {
        let hosts = cfg.core.layout.hosts().min(MAX_HOSTS);
        let timeout = cfg.heartbeat_timeout;
        Shell {
            index: cfg
                .hosts
                .iter()
                .enumerate()
                .map(|(i, h)| (h.clone(), i))
                .collect(),
            lease_book: LeaseBook::new(hosts, cfg.lease, cfg.core.gpu.tdp_w),
            stats: ShellStats {
                caps: vec![None; hosts],
                caps_sent: vec![None; hosts],
                leak_steps: LeakSteps::new(usize::from(cfg.core.layout.racks)),
                heard: vec![None; hosts],
                ..Default::default()
            },
            bms: bms::Bms::new(northbound, &cfg.core),
            cfg,
            stats_tx,
            keeping: Keeping {
                recorder: started.recorder,
                seq_floor: SeqFloor::new(started.first_seq),
                learned: started.learned,
                bms: Default::default(),
                latch_marked: false,
            },
            devices: devices::Devices::new(cdu, board).start_bound(timeout),
            decider: started.decider,
            bus: started.bus,
            me: started.me,
            started: Instant::now(),
            late: false,
            state_sent: None,
            leak_inputs: publish::HeardLeaks::default(),
            facility: None,
            resender: started.resender,
            shortened: Default::default(),
        }
    }
}

impl<P: CduPort> Shell<P> {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Shell ms as a Unix timestamp: as long before the wall clock's now
    /// as it is before the shell's, so a wall clock stepped since the
    /// start (NTP after a boot without a real-time clock) is followed, as
    /// the frames' own stamps and other nodes' follow it.
    fn unix(&self, shell_ms: u64) -> TimestampMs {
        let ago = self.now_ms().saturating_sub(shell_ms);
        TimestampMs(now_ms().0.saturating_sub(ago))
    }

    fn report(&self) {
        if let Some(tx) = &self.stats_tx {
            tx.send_replace(self.stats.clone());
        }
    }

    /// A step took `took`: one longer than the period is counted, and
    /// said when the steps begin to run late and when they fit again.
    fn timed(&mut self, took: Duration) {
        let late = took > self.cfg.period;
        if late {
            self.stats.steps_late += 1;
        }
        if late != self.late {
            self.late = late;
            if late {
                tracing::warn!(
                    "cooling shell: a control step took {} ms, more than the period of {} ms (waiting on the CDU or the flash): steps are skipped, and caps, leases and relay pulses come late",
                    took.as_millis(),
                    self.cfg.period.as_millis()
                );
            } else {
                tracing::info!("cooling shell: control steps fit their period again");
            }
        }
    }

    async fn step(&mut self) {
        let now = self.now_ms();
        let readings = self.devices.read_cdu(&mut self.stats).await;
        let board = self.devices.read_board(&mut self.stats);
        self.bms.refresh(now);
        let fallback = self.cfg.core.margins.design_ambient_c;
        let first = self.stats.steps == 0;
        self.bms
            .pick_outdoor(now, readings.as_ref(), first, fallback);
        let c = self.decider.step(
            readings.as_ref(),
            &StepIn {
                now_ms: now,
                board,
                ambient_c: self.bms.outdoor_c.map(|(c, _)| c),
            },
        );
        log_said(&mut self.decider);
        self.leak_inputs.hear(board, readings.as_ref());
        let (wet, unknown) = (self.leak_inputs.wet_now(), self.leak_inputs.unheard_wet());
        self.stats.leak_steps.heard(self.stats.steps, wet, unknown);
        // What the step latched is in flash before anything acts on it.
        self.keep_latched().await;
        let closed = readings.as_ref().and_then(|r| r.valves_closed);
        let all_in = self.write_cdu(&c, closed).await;
        self.devices.pulse(c.beacon, &mut self.stats);
        let estimates = Estimates::of(self.decider.core());
        self.publish_telemetry(&c, readings.as_ref(), &estimates);
        self.publish_state(now, &c, readings.as_ref());
        for e in c.events.iter().cloned().chain(self.decider.take_events()) {
            self.announce(e);
        }
        self.leases(now, &c);
        let k = &mut self.keeping;
        k.seq_floor.keep_ahead(&self.bus, &k.recorder).await;
        self.keep_learned(now, false);
        self.keep_bms_limits();
        self.stats.status = Some(self.snapshot(readings.as_ref(), estimates));
        let hosts = self.decider.hosts();
        let took = CduTook {
            valves: self.decider.valves_taken(),
            all: all_in,
            setpoint_c: self.stats.setpoint_written_c.map(|v| v as f32),
        };
        let r = readings.as_ref();
        self.bms
            .publish(self.decider.core(), &c, now, r, took, hosts);
        self.stats.steps += 1;
        self.stats.settings_limited = self.decider.settings_limited();
        self.stats.relatch_pending = self.decider.relatch_pending();
        self.stats.cdu_error = self.devices.cdu_error().cloned();
        self.stats.last = Some(c);
        self.report();
    }

    /// Writes the latched record to flash when it changed, and waits for
    /// it to be there (the record, its generation, and once in a process
    /// the mark that one was kept) for at most half a period; the
    /// decision path hears whether it went in.
    async fn keep_latched(&mut self) {
        let Some(r) = self.decider.to_keep() else {
            return;
        };
        let mark = !self.keeping.latch_marked;
        // A flash that does not answer (a hung fsync on a failing card)
        // holds no valve open: past half a period the record counts as
        // not kept, and only closings are written.
        let wait = self.cfg.period / 2;
        // Every item handed over before the wait: a wait given up on
        // leaves them to land together, never a record without its
        // generation (which a restart would read as damaged).
        let mut items: Vec<(String, Vec<u8>)> = r
            .items()
            .into_iter()
            .map(|(key, value)| (key.to_string(), value.to_vec()))
            .collect();
        if mark {
            items.push((journal::LATCH_KEPT_KEY.into(), vec![1]));
        }
        let write = self.keeping.recorder.set_all_sync(items);
        let result = tokio::time::timeout(wait, write).await.unwrap_or_else(|_| {
            Err(format!(
                "the flash did not answer within {} ms",
                wait.as_millis()
            ))
        });
        if let Err(e) = &result {
            tracing::error!(
                "cooling shell: the latched state is not in flash ({e}); no valve opens until it is"
            );
            self.stats.latch_write_errors += 1;
        }
        self.keeping.latch_marked |= result.is_ok();
        self.decider.kept(result.is_ok());
    }

    /// Writes the step's settings to the CDU in safety order, each on its
    /// own ([`decide::writes`]), with the valve positions it read
    /// (`closed`); the first failure is logged whole once per change.
    /// Whether every write went in.
    async fn write_cdu(&mut self, c: &Commands, closed: Option<u16>) -> bool {
        let plan = self.decider.plan(c, closed);
        let now = self.now_ms();
        let outcome = self.devices.write(&plan, now, &mut self.stats).await;
        self.stats.took(&plan, &outcome);
        self.decider.written(&outcome);
        outcome.all_ok()
    }

    /// Logs an event to flash and publishes it through the outbox.
    fn announce(&mut self, e: Event) {
        tracing::info!("cooling shell: {e}");
        // Logged, then published through the outbox (its frame's number
        // logged too, for a reader that asks for it again).
        // One the flash queue had no room for is counted there
        // (`flash_queue_dropped`), not as published.
        if self.keeping.recorder.emit(e, now_ms()) {
            self.stats.events_published += 1;
        }
    }

    /// The BMS wrote `ws` in one request (the server checked them against
    /// the map), between two steps: the limits are the core's from the
    /// next step, set and kept once for the whole request, and the
    /// holding registers read what is in force (the core holds a limit
    /// within the site's setpoints, said when that differs).
    fn on_bms(&mut self, ws: Vec<NorthboundWrite>) {
        let now = self.now_ms();
        if let Some((ceiling, offset)) = self.bms.wrote(&ws, now) {
            let core = self.decider.core_mut();
            core.set_limits(ceiling, offset);
            self.bms.in_force(core.limits());
            self.keeping.bms.changed(core.limits());
            self.keep_bms_limits();
        }
    }

    /// Carries out an operator's request between two steps.
    fn on_operator(&mut self, req: OperatorRequest) {
        if !req.take() {
            tracing::warn!(
                "cooling shell: operator {}: {:?} withdrawn by the console before the loop took it: not carried out",
                req.operator,
                req.action
            );
            return;
        }
        let (answer, cleared) = match req.action {
            OperatorAction::ClearLeak { rack } => {
                let done = operator::clear_leak(&mut self.decider, rack, self.leak_inputs.now());
                (done, (RackIndex::new(rack as u8), None))
            }
            OperatorAction::ClearPumpTrip { pump } => {
                // A map without the pump's fault bit cannot show it: the
                // clear goes on the operator's word, and says so. A bit
                // not read (its read request failed) is unknown: refused.
                let done = self
                    .devices
                    .pump_fault(pump as usize)
                    .and_then(|fault| {
                        self.decider
                            .core_mut()
                            .clear_pump(pump, fault.unwrap_or(false))
                            .map(|()| devices::pump_cleared(&format!("{pump:?}"), fault))
                            .map_err(String::from)
                    })
                    .map_err(|e| format!("pump {pump:?}: {e}"));
                (done, (None, Some(pump)))
            }
        };
        let who = req.operator.clone();
        match &answer {
            Ok(done) => {
                tracing::warn!("cooling shell: operator {who}: {done}");
                // In the flash log with who asked; the new latched state
                // goes to flash at the next step, before it acts.
                self.announce(Event::OperatorCleared {
                    rack: cleared.0,
                    pump: cleared.1,
                    operator: who,
                });
            }
            Err(why) => tracing::info!("cooling shell: operator {who}: request refused: {why}"),
        }
        // Taken: the asker waits for this answer.
        let _ = req.reply.send(answer);
    }
}
