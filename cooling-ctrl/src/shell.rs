//! The controller's real-time shell: the control core ([`cooling_core`]) in
//! charge of one real CDU, on the bus. It only moves bytes; every decision
//! is the core's.
//!
//! Each period (a tokio interval, `ShellConfig::period`, 1 s by default):
//! 1. read the CDU through its [`CduPort`] (an error is logged once per
//!    change of its message and the core gets `cdu: None`: "refused" and
//!    "no answer" both mean no readings this step);
//! 2. map the readings as the twin does (`simulated`): leaks from the
//!    CDU's `leak_inputs` bitmask (the last known bits while the CDU does
//!    not answer), a pump whose feedback the map lacks reads not running;
//! 3. call [`Core::step`] with the time in ms since the shell started (a
//!    monotonic clock) and the latest report of every host;
//! 4. write the core's settings to the CDU (an error is logged, not fatal);
//! 5. publish: `CduTelemetry` every period (QoS 0; a lost sensor is null),
//!    `CduState` (retained, family `health`) when the mode, the setpoint
//!    (by 0.5 K or more) or a rack's cooling changes and at least every
//!    60 s (the bus announces the latest again after every reconnection),
//!    every core event as an `event`
//!    frame, and their JSON mirrors;
//! 6. cap leases: for each host the core caps, a signed `CapLease` (source
//!    cooling, one lease id per host, `caps = [all GPUs at the cap]`,
//!    duration `ShellConfig::lease`) to the host's `cmd` topic when the cap
//!    first appears, when it moves by 5 W or more, and every `lease / 3`
//!    while it stays; when the core lifts a cap, one lease at the GPU's TDP
//!    lasting 5 s, so the host lifts at once rather than at expiry.
//!
//! Between periods it takes what the bus brings: host telemetry (every
//! host's `telemetry` family of the site), kept per host index as the
//! core's [`HostReport`], and acks (every host's `ack` family) of the
//! commands this CDU sent, counted in [`ShellStats`].
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
//! [`ShellOptions::flash`] is the controller's flash (opened by the
//! caller, in memory when `None`): every core event and every lease
//! sent or lifted goes to its event log as a [`Journal`] entry, off the control
//! loop (the `cooling-ctrl run` command writes them to flash). [`run`] is
//! [`run_with`] without options.
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

use loopwarden_bus::agent_flash::SeqFloor;
use loopwarden_bus::{now_ms, BrokerAddr, Bus, BusConfig, Inbound, PublishError};
use loopwarden_protocol::message::{
    Ack, AckCode, CapLease, CapSource, CduMode, CduState, CduTelemetry, CommandAuth, Event, GpuCap,
    GpuFlags, GpuSelector, HostTelemetry, Pump, PumpStatus, RackCooling, RackState, RackStatus,
    SensorFault, ThrottleReasons,
};
use loopwarden_protocol::topic::filter;
use loopwarden_protocol::units::{
    Celsius, DurationMs, LitresPerMinute, Percent, Pue, TimestampMs, Watts,
};
use loopwarden_protocol::{
    Family, Frame, Ident, Message, NodeId, RackIndex, ReasonCode, Role, Topic,
};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};

use cooling_core::sensors::Which;
use cooling_core::{
    CduReadings as CoreReadings, Commands, ConfigError, Core, CoreConfig, HostReport, Inputs,
    LoopStatus, MAX_HOSTS,
};

use crate::journal::{self, ControllerFlash, Recorder};
use crate::modbus::{CduError, CduPort, CduReadings, CduSettings};
use crate::northbound::{snapshot_from, NorthboundSettings, NorthboundSnapshot, NorthboundWrite};

/// How long the lease that lifts a cap lasts.
pub const LIFT_DURATION: Duration = Duration::from_secs(5);
/// A cap that moves by this much or more is sent again at once, W.
pub const CAP_RESEND_W: f32 = 5.0;
/// A setpoint that moves by this much or more republishes the state, K.
pub const STATE_SETPOINT_K: f32 = 0.5;
/// The state is republished at least this often.
pub const STATE_EVERY: Duration = Duration::from_secs(60);

/// What the shell runs with.
#[derive(Debug, Clone)]
pub struct ShellConfig {
    /// The site (first level below `dc/v1`).
    pub site: Ident,
    /// This CDU's id (its node on the bus has role `cdu`).
    pub cdu: Ident,
    /// The broker.
    pub broker: BrokerAddr,
    /// The control core's configuration.
    pub core: CoreConfig,
    /// The control period (1 s by default).
    pub period: Duration,
    /// The id on the bus of each host index (rack-major, as the core's).
    /// At most the layout's hosts; indices past the end have no host.
    pub hosts: Vec<Ident>,
    /// The id of the site key cap leases are signed with.
    pub key_id: u8,
    /// The site key itself.
    pub key: Vec<u8>,
    /// How long a cap lease holds (30 s by default); renewed every third
    /// of it while the cap stays.
    pub lease: Duration,
    /// Outdoor temperature, °C, if the site gives one (else the core's
    /// design value).
    pub ambient_c: Option<f32>,
}

/// The northbound server's side of the shell: where each step's snapshot
/// goes, and the bounded writes the building management system made.
#[derive(Debug)]
pub struct NorthboundLink {
    /// Each step's snapshot for [`crate::northbound::serve`].
    pub snapshots: watch::Sender<NorthboundSnapshot>,
    /// Accepted writes (`None`: writes are disabled).
    pub writes: Option<mpsc::Receiver<NorthboundWrite>>,
}

/// The controller board's own signals: leak ropes in, the pump-enable
/// relay and the alarm beacon out. [`loopwarden_boards::pins::BoardPins`]
/// over any `embedded-hal` pins implements it (Linux GPIO on a board, the
/// simulated lines in the twin).
pub trait BoardIo: Send {
    /// Racks whose leak rope reports a leak, bit n = rack n.
    fn leaks(&mut self) -> Result<u16, String>;
    /// Drives the relay and the beacon.
    fn drive(&mut self, pump_enable: bool, beacon: bool) -> Result<(), String>;
}

impl<I, O> BoardIo for loopwarden_boards::pins::BoardPins<I, O>
where
    I: embedded_hal::digital::InputPin + Send,
    O: embedded_hal::digital::OutputPin + Send,
{
    fn leaks(&mut self) -> Result<u16, String> {
        let mut bits = 0u16;
        for rack in 0..self.racks().min(16) {
            match self.leak(rack) {
                Some(Ok(true)) => bits |= 1 << rack,
                Some(Ok(false)) | None => {}
                Some(Err(e)) => return Err(format!("leak rope of rack {rack}: {e:?}")),
            }
        }
        Ok(bits)
    }

    fn drive(&mut self, pump_enable: bool, beacon: bool) -> Result<(), String> {
        self.set_pump_enable(pump_enable)
            .map_err(|e| format!("pump-enable relay: {e:?}"))?;
        self.set_alarm(beacon)
            .map_err(|e| format!("alarm beacon: {e:?}"))
    }
}

/// What an operator asks of the controller (from the console).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorAction {
    /// Reopen a rack whose leak is latched (refused while its rope or the
    /// CDU's leak input still reads wet).
    ClearLeak {
        /// The rack.
        rack: usize,
    },
    /// Put a tripped pump back in service.
    ClearPumpTrip {
        /// The pump.
        pump: Pump,
    },
}

/// An operator's request and where its answer goes (`Ok`: what was done,
/// `Err`: why not).
#[derive(Debug)]
pub struct OperatorRequest {
    /// What is asked.
    pub action: OperatorAction,
    /// The answer.
    pub reply: tokio::sync::oneshot::Sender<Result<String, String>>,
}

/// What [`run_with`] takes besides the config.
#[derive(Default)]
pub struct ShellOptions {
    /// Where the shell reports its counters (see [`stats_channel`]);
    /// `None`: nowhere.
    pub stats: Option<watch::Sender<ShellStats>>,
    /// MQTT user name and password, for brokers that require them.
    pub credentials: Option<(String, String)>,
    /// The controller's flash (event log, outbox, sequence floor), opened
    /// by the caller so its console can read the log; `None`: the shell
    /// opens one in memory, lost at exit.
    pub flash: Option<ControllerFlash>,
    /// The northbound Modbus server's link; `None`: no server.
    pub northbound: Option<NorthboundLink>,
    /// The board's pins; `None`: leaks come from the CDU's leak register
    /// only, and no relay or beacon is driven.
    pub board: Option<Box<dyn BoardIo>>,
    /// Operators' requests (from the console); `None`: none taken.
    pub operator: Option<mpsc::Receiver<OperatorRequest>>,
}

impl std::fmt::Debug for ShellOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShellOptions")
            .field("stats", &self.stats.is_some())
            .field("credentials", &self.credentials.as_ref().map(|(u, _)| u))
            .field("flash", &self.flash)
            .field("northbound", &self.northbound.is_some())
            .field("board", &self.board.is_some())
            .field("operator", &self.operator.is_some())
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

/// One supervised sensor after a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SensorStatus {
    /// Which.
    pub which: Which,
    /// Its reading this step, as the CDU gave it (`None`: no answer, or
    /// the map lacks it).
    pub reading: Option<f64>,
    /// The fault the core holds it under.
    pub fault: Option<SensorFault>,
}

/// The core's state after the last step, for the console.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// When the step ran (Unix ms).
    pub at: TimestampMs,
    /// The mode.
    pub mode: CduMode,
    /// Why.
    pub reason: ReasonCode,
    /// Since when (Unix ms).
    pub since: TimestampMs,
    /// The CDU's readings this step (`None`: it did not answer).
    pub readings: Option<CduReadings>,
    /// When the CDU last answered a read (Unix ms).
    pub last_read: Option<TimestampMs>,
    /// Every supervised sensor.
    pub sensors: [SensorStatus; 4],
    /// Leak inputs as last read, bit n = rack n.
    pub leaks_now: u16,
    /// Latched leaks, bit n = rack n.
    pub leaks_latched: u16,
    /// Pumps out of service after a trip.
    pub pumps_failed: [bool; 2],
    /// The loops.
    pub loops: LoopStatus,
    /// Events the core could not fit in a step, since the start.
    pub events_dropped: u32,
    /// The bus is connected.
    pub bus_connected: bool,
}

/// A host's last ack of this CDU's commands.
#[derive(Debug, Clone, PartialEq)]
pub struct LastAck {
    /// When it came (Unix ms).
    pub at: TimestampMs,
    /// The command it answers.
    pub seq: u32,
    /// Its code.
    pub code: AckCode,
    /// Its detail.
    pub detail: String,
}

impl ShellConfig {
    /// A shell for CDU `cdu` of `site` on `broker`, with a 1 s period and
    /// 30 s leases, no hosts and key id 1 with an empty key (set one
    /// before leases are to be sent).
    pub fn new(site: Ident, cdu: Ident, broker: BrokerAddr, core: CoreConfig) -> Self {
        Self {
            site,
            cdu,
            broker,
            core,
            period: Duration::from_secs(1),
            hosts: Vec::new(),
            key_id: 1,
            key: Vec::new(),
            lease: Duration::from_secs(30),
            ambient_c: None,
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
        if self.key.is_empty() && !self.hosts.is_empty() {
            return bad("key: a site key is needed to sign cap leases".into());
        }
        Ok(())
    }
}

/// A stats channel for [`ShellOptions::stats`]: the sender goes in the
/// options, the receiver to whoever watches.
pub fn stats_channel() -> (watch::Sender<ShellStats>, watch::Receiver<ShellStats>) {
    watch::channel(ShellStats::default())
}

/// What the shell has done since it started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShellStats {
    /// Control steps run.
    pub steps: u64,
    /// CDU reads that answered.
    pub cdu_reads: u64,
    /// CDU reads that failed.
    pub cdu_read_errors: u64,
    /// CDU writes that failed.
    pub cdu_write_errors: u64,
    /// The CDU's last error, while it lasts.
    pub cdu_error: Option<String>,
    /// The core's last commands.
    pub last: Option<Commands>,
    /// Host telemetry frames taken.
    pub host_reports: u64,
    /// Cap leases sent (not counting lifts).
    pub leases_sent: u64,
    /// Lifting leases sent.
    pub lifts_sent: u64,
    /// The cap last sent to each host index while it is capped, W.
    pub caps: Vec<Option<f32>>,
    /// Telemetry frames published.
    pub telemetry_published: u64,
    /// State frames published.
    pub states_published: u64,
    /// Event frames published.
    pub events_published: u64,
    /// Publishes the bus did not take.
    pub publish_errors: u64,
    /// Acks received for this CDU's commands.
    pub acks: u64,
    /// Of which `ok` or `clamped`.
    pub acks_ok: u64,
    /// Of which anything else.
    pub acks_refused: u64,
    /// The limits in force the last ack of each host reported, by host id.
    pub in_force: BTreeMap<String, Vec<GpuCap>>,
    /// The last refusal: host id, code and detail.
    pub last_refusal: Option<(String, AckCode, String)>,
    /// The core's state after the last step.
    pub status: Option<Snapshot>,
    /// When each host index last sent telemetry (Unix ms).
    pub heard: Vec<Option<TimestampMs>>,
    /// The last ack of each host, by host id.
    pub last_ack: BTreeMap<String, LastAck>,
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

/// A host's telemetry as the core's report, at `at_ms` (shell time).
/// GPUs that did not answer their queries are left out; a GPU in hardware
/// slowdown (thermal or not) sets `slowdown`.
pub fn host_report(t: &HostTelemetry, at_ms: u64) -> HostReport {
    let mut r = HostReport {
        gpus: 0,
        hottest_c: 0.0,
        gpu_power_w: 0.0,
        limit_w: 0.0,
        slowdown: false,
        at_ms,
    };
    let slow = ThrottleReasons::HW_SLOWDOWN | ThrottleReasons::HW_THERMAL_SLOWDOWN;
    for g in t
        .gpus
        .iter()
        .filter(|g| g.flags.contains(GpuFlags::RESPONSIVE))
    {
        let temp = f32::from(g.temp.get());
        r.hottest_c = if r.gpus == 0 {
            temp
        } else {
            r.hottest_c.max(temp)
        };
        r.gpus = r.gpus.saturating_add(1);
        r.gpu_power_w += g.power.get() as f32;
        r.limit_w = r.limit_w.max(g.power_limit.get() as f32);
        r.slowdown |= g.throttle.bits() & slow.bits() != 0;
    }
    r
}

/// The core's readings from the CDU's.
pub fn core_readings(r: &CduReadings) -> CoreReadings {
    let f = |x: Option<f64>| x.map(|v| v as f32);
    CoreReadings {
        supply_c: f(r.supply_c),
        return_c: f(r.return_c),
        flow_lpm: f(r.flow_lpm),
        facility_supply_c: f(r.facility_supply_c),
        pumps_running: [
            r.pumps_running[0].unwrap_or(false),
            r.pumps_running[1].unwrap_or(false),
        ],
        it_w: f(r.it_w),
        facility_w: f(r.facility_w),
    }
}

/// The settings for the CDU from the core's commands, rounded to the
/// resolution of the simulated map (0.01 °C, 0.1 %).
pub fn settings(c: &Commands) -> CduSettings {
    CduSettings {
        setpoint_c: (f64::from(c.setpoint_c) * 100.0).round() / 100.0,
        pump_speed_pct: (f64::from(c.pump_speed) * 1000.0).round() / 10.0,
        lead_pump: match c.lead {
            loopwarden_protocol::message::Pump::A => 0,
            loopwarden_protocol::message::Pump::B => 1,
        },
        valves_open: c.valves_open,
    }
}

/// A cap lease as the shell sends it (unsigned, `auth` zero).
pub fn cap_lease(lease: u32, reason: ReasonCode, watts: f32, duration: Duration) -> CapLease {
    let mut caps = heapless::Vec::new();
    let _ = caps.push(GpuCap {
        gpus: GpuSelector::All,
        limit: Watts(watts.round().max(0.0) as u32),
    });
    CapLease {
        lease,
        source: CapSource::Cooling,
        reason,
        caps,
        duration: DurationMs(duration.as_millis().min(u128::from(u32::MAX)) as u32),
        auth: CommandAuth::default(),
    }
}

/// What was last sent to one host.
#[derive(Debug, Clone, Copy, Default)]
struct LeaseSent {
    /// The cap, W (`None`: not capped, or lifted).
    watts: Option<f32>,
    /// When, shell ms.
    at_ms: u64,
}

struct Shell<P> {
    cfg: ShellConfig,
    stats_tx: Option<watch::Sender<ShellStats>>,
    recorder: Recorder,
    seq_floor: SeqFloor,
    last_read: Option<TimestampMs>,
    cdu: P,
    core: Core,
    bus: Bus,
    me: NodeId,
    started: Instant,
    started_unix: u64,
    index: HashMap<Ident, usize>,
    reports: Vec<Option<HostReport>>,
    leaks: u16,
    cdu_error: Option<String>,
    write_error: Option<String>,
    sent: Vec<LeaseSent>,
    state_sent: Option<(Commands, u64)>,

    stats: ShellStats,
    northbound: Option<NorthboundLink>,
    nb_settings: NorthboundSettings,
    beacon: bool,
    board: Option<Box<dyn BoardIo>>,
    board_error: Option<String>,
    ropes: u16,
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

/// As [`run`], reporting to `opts.stats` and logging in to the broker with
/// `opts.credentials`.
pub async fn run_with<P: CduPort>(
    cfg: ShellConfig,
    opts: ShellOptions,
    cdu: P,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ShellError> {
    cfg.validate()?;
    let core = Core::new(cfg.core).map_err(ShellError::Core)?;
    let cfg_core = cfg.core;
    let me = NodeId::new(Role::Cdu, cfg.cdu.as_str())
        .map_err(|e| ShellError::Config(format!("cdu: {e}")))?;
    let mut bus_config = BusConfig::new(cfg.broker.clone(), cfg.site.clone(), me.clone());
    bus_config.credentials = opts.credentials.clone();
    for family in [Family::Telemetry, Family::Ack] {
        let f = filter::family(&cfg.site, Role::Host, family)
            .map_err(|e| ShellError::Bus(format!("the host {family:?} filter: {e:?}")))?;
        bus_config.subscriptions.push(f.to_string());
    }
    // Every command topic must build before anything runs.
    for h in &cfg.hosts {
        Topic::new(&cfg.site, Role::Host, h, Family::Cmd)
            .build()
            .map_err(|e| ShellError::Bus(format!("the cmd topic of host {h}: {e:?}")))?;
    }
    let flash = match opts.flash {
        Some(f) => f,
        None => ControllerFlash::open(None).map_err(ShellError::Flash)?,
    };
    bus_config.first_seq = flash.first_seq;
    let (bus, mut inbound, bus_task) = Bus::start_with_outbox(bus_config, Box::new(flash.outbox));
    flash.recorder.attach(bus.clone());
    tracing::info!(
        "cooling shell: CDU {} of site {}, {} hosts, period {} ms, broker {}",
        cfg.cdu,
        cfg.site,
        cfg.hosts.len(),
        cfg.period.as_millis(),
        cfg.broker
    );
    let hosts = cfg.core.layout.hosts().min(MAX_HOSTS);
    let mut shell = Shell {
        index: cfg
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| (h.clone(), i))
            .collect(),
        reports: vec![None; hosts],
        sent: vec![LeaseSent::default(); hosts],
        stats: ShellStats {
            caps: vec![None; hosts],
            heard: vec![None; hosts],
            ..Default::default()
        },
        cfg,
        stats_tx: opts.stats,
        recorder: flash.recorder.clone(),
        seq_floor: SeqFloor::new(flash.first_seq),
        last_read: None,
        cdu,
        core,
        bus,
        me,
        started: Instant::now(),
        started_unix: now_ms().0,
        leaks: 0,
        cdu_error: None,
        write_error: None,
        state_sent: None,
        northbound: opts.northbound,
        nb_settings: NorthboundSettings::new(&cfg_core),
        beacon: false,
        board: opts.board,
        board_error: None,
        ropes: 0,
    };
    let mut operator = opts.operator;
    let mut tick = tokio::time::interval(shell.cfg.period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = tick.tick() => shell.step().await,
            Some(msg) = inbound.recv() => shell.on_inbound(msg),
            Some(req) = async {
                match operator.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            } => shell.on_operator(req),
            _ = &mut shutdown => break,
        }
    }
    tracing::info!("cooling shell: stopping");
    // Everything decided is written and handed to the bus before it stops.
    shell.recorder.flush().await;
    if let Err(e) = shell.bus.shutdown(Duration::from_secs(3)).await {
        tracing::warn!("cooling shell: leaving the bus: {e}");
    }
    bus_task.join(Duration::from_secs(3)).await;
    Ok(())
}

impl<P: CduPort> Shell<P> {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Shell ms as a Unix timestamp.
    fn unix(&self, shell_ms: u64) -> TimestampMs {
        TimestampMs(self.started_unix.saturating_add(shell_ms))
    }

    fn report(&self) {
        if let Some(tx) = &self.stats_tx {
            tx.send_replace(self.stats.clone());
        }
    }

    async fn step(&mut self) {
        let now = self.now_ms();
        let readings = match self.cdu.read().await {
            Ok(r) => {
                if let Some(e) = self.cdu_error.take() {
                    tracing::info!("cooling shell: the CDU answers again (was: {e})");
                }
                self.stats.cdu_reads += 1;
                self.last_read = Some(now_ms());
                Some(r)
            }
            Err(e) => {
                self.stats.cdu_read_errors += 1;
                self.cdu_failed(&e);
                None
            }
        };
        if let Some(l) = readings.and_then(|r| r.leaks) {
            self.leaks = l;
        }
        // The board's ropes count as much as the CDU's leak inputs.
        let ropes = match self.board.as_mut().map(|b| b.leaks()) {
            Some(Ok(bits)) => bits,
            Some(Err(e)) => {
                self.board_failed(e);
                0
            }
            None => 0,
        };
        self.ropes = ropes;
        self.northbound_writes();
        let c = self.core.step(&Inputs {
            now_ms: now,
            cdu: readings.as_ref().map(core_readings),
            ambient_c: self.cfg.ambient_c,
            leaks: self.leaks | ropes,
            hosts: &self.reports,
        });
        if let Some(b) = self.board.as_mut() {
            if let Err(e) = b.drive(c.pump_on[0] || c.pump_on[1], c.beacon) {
                self.board_failed(e);
            }
        }
        match self.cdu.write(&settings(&c)).await {
            Ok(()) => {
                if let Some(e) = self.write_error.take() {
                    tracing::info!("cooling shell: the CDU takes its settings again (was: {e})");
                }
            }
            Err(e) => {
                self.stats.cdu_write_errors += 1;
                let msg = e.to_string();
                if self.write_error.as_deref() != Some(msg.as_str()) {
                    tracing::error!("cooling shell: writing the CDU's settings: {msg}");
                    self.write_error = Some(msg);
                }
            }
        }
        self.publish_telemetry(&c, readings.as_ref());
        self.publish_state(now, &c, readings.as_ref());
        for e in &c.events {
            tracing::info!("cooling shell: event {e:?}");
            let time = now_ms();
            self.journal(Journal::Event {
                time,
                event: e.clone(),
            });
            // Through the outbox, after its log entry.
            self.recorder.publish(Message::Event(e.clone()), time, true);
            self.stats.events_published += 1;
        }
        self.leases(now, &c);
        self.seq_floor.keep_ahead(&self.bus, &self.recorder).await;
        self.stats.status = Some(self.snapshot(readings.as_ref()));
        // A new alarm needs a new acknowledgement.
        if c.beacon && !self.beacon {
            self.nb_settings.alarm_acknowledged = false;
        }
        self.beacon = c.beacon;
        if let Some(nb) = &self.northbound {
            nb.snapshots.send_replace(snapshot_from(
                &self.core,
                &c,
                now,
                readings.as_ref(),
                &self.reports,
                &self.nb_settings,
            ));
        }
        self.stats.steps += 1;
        self.stats.cdu_error = self.cdu_error.clone();
        self.stats.last = Some(c);
        self.report();
    }

    /// Carries out an operator's request between two steps.
    fn on_operator(&mut self, req: OperatorRequest) {
        let answer = match req.action {
            OperatorAction::ClearLeak { rack } => self
                .core
                .clear_leak(rack, self.leaks | self.ropes)
                .map(|()| format!("rack {rack}: leak cleared, its valve reopens at the next step"))
                .map_err(|e| format!("rack {rack}: {e}")),
            OperatorAction::ClearPumpTrip { pump } => {
                self.core.clear_pump_trip(pump);
                Ok(format!("pump {pump:?} back in service"))
            }
        };
        match &answer {
            Ok(done) => tracing::warn!("cooling shell: operator: {done}"),
            Err(why) => tracing::info!("cooling shell: operator request refused: {why}"),
        }
        // The console may have stopped waiting: nothing to do then.
        let _ = req.reply.send(answer);
    }

    fn board_failed(&mut self, e: String) {
        if self.board_error.as_deref() != Some(e.as_str()) {
            tracing::error!("cooling shell: board pins: {e}");
            self.board_error = Some(e);
        }
    }

    /// Takes the bounded writes the BMS made since the last step.
    fn northbound_writes(&mut self) {
        let Some(rx) = self.northbound.as_mut().and_then(|nb| nb.writes.as_mut()) else {
            return;
        };
        let mut changed = false;
        while let Ok(w) = rx.try_recv() {
            tracing::info!("cooling shell: the BMS wrote {w:?}");
            self.nb_settings.apply(w);
            changed = true;
        }
        if changed {
            let s = &self.nb_settings;
            self.core
                .set_limits(s.setpoint_ceiling_c, s.plan_ceiling_offset_k);
        }
    }

    fn journal(&self, entry: Journal) {
        journal::record(&self.recorder, &entry);
    }

    fn snapshot(&self, r: Option<&CduReadings>) -> Snapshot {
        let (mode, reason, since) = self.core.mode();
        let sensors = Which::ALL.map(|which| SensorStatus {
            which,
            reading: r.and_then(|r| match which {
                Which::Supply => r.supply_c,
                Which::Return => r.return_c,
                Which::Flow => r.flow_lpm,
                Which::FacilitySupply => r.facility_supply_c,
            }),
            fault: self.core.sensor_fault(which),
        });
        Snapshot {
            at: now_ms(),
            mode,
            reason,
            since: self.unix(since),
            readings: r.copied(),
            last_read: self.last_read,
            sensors,
            leaks_now: self.leaks,
            leaks_latched: self.core.leaks_latched(),
            pumps_failed: self.core.pumps_failed(),
            loops: self.core.loops(),
            events_dropped: self.core.events_dropped(),
            bus_connected: self.bus.is_connected(),
        }
    }

    fn cdu_failed(&mut self, e: &CduError) {
        let msg = e.to_string();
        if self.cdu_error.as_deref() != Some(msg.as_str()) {
            let what = if e.refused_code().is_some() {
                "refused"
            } else if e.is_no_answer() {
                "no answer"
            } else {
                "failed"
            };
            tracing::error!("cooling shell: reading the CDU ({what}): {msg}");
            self.cdu_error = Some(msg);
        }
    }

    /// Publishes on our own topic (and its JSON mirror); counts.
    fn publish(
        &mut self,
        message: Message,
        time: TimestampMs,
        mirror: bool,
        count: impl FnOnce(&mut ShellStats) -> &mut u64,
    ) -> bool {
        let kind = message.kind();
        match self.bus.publish(message, time) {
            Ok(frame) => {
                *count(&mut self.stats) += 1;
                if mirror {
                    if let Err(e) = self.bus.publish_json(&frame) {
                        tracing::debug!("cooling shell: JSON mirror of {kind:?}: {e}");
                    }
                }
                true
            }
            Err(PublishError::Offline) => {
                self.stats.publish_errors += 1;
                false
            }
            Err(e) => {
                self.stats.publish_errors += 1;
                tracing::warn!("cooling shell: publishing {kind:?}: {e}");
                false
            }
        }
    }

    /// A reading for the bus: null when the CDU did not answer, the map
    /// lacks it, or the core holds the sensor lost.
    fn sensor(
        &self,
        r: Option<&CduReadings>,
        w: Which,
        v: impl Fn(&CduReadings) -> Option<f64>,
    ) -> Option<f64> {
        if self.core.sensor_fault(w) == Some(loopwarden_protocol::message::SensorFault::Lost) {
            return None;
        }
        r.and_then(v).filter(|x| x.is_finite())
    }

    fn publish_telemetry(&mut self, c: &Commands, r: Option<&CduReadings>) {
        let lay = self.cfg.core.layout;
        let celsius = |x: Option<f64>| x.and_then(|v| Celsius::new(v).ok());
        let watts = |x: Option<f64>| {
            x.filter(|v| v.is_finite() && *v >= 0.0)
                .map(|v| Watts(v.round().min(f64::from(u32::MAX)) as u32))
        };
        let meter = |f: fn(&CduReadings) -> Option<f64>| r.and_then(f);
        let it = meter(|r| r.it_w);
        let facility = meter(|r| r.facility_w);
        let pue = match (it, facility) {
            (Some(it), Some(f)) if it > 0.0 && f.is_finite() => Pue::new(f / it).ok(),
            _ => None,
        };
        let speed = Percent::new((c.pump_speed * 100.0).round().clamp(0.0, 100.0) as u8)
            .unwrap_or(Percent::FULL);
        let pump = |i: usize| PumpStatus {
            running: r.and_then(|r| r.pumps_running[i]).unwrap_or(false),
            command: if c.pump_on[i] { speed } else { Percent::ZERO },
            feedback: None,
        };
        let mut racks = heapless::Vec::new();
        for i in 0..usize::from(lay.racks).min(16) {
            if let Some(rack) = RackIndex::new(i as u8) {
                let _ = racks.push(RackStatus {
                    rack,
                    valve: if c.valves_open & (1 << i) != 0 {
                        Percent::FULL
                    } else {
                        Percent::ZERO
                    },
                    leak: r.is_some() && self.leaks & (1 << i) != 0,
                });
            }
        }
        let t = CduTelemetry {
            supply: celsius(self.sensor(r, Which::Supply, |r| r.supply_c)),
            return_temp: celsius(self.sensor(r, Which::Return, |r| r.return_c)),
            setpoint: Celsius::new(f64::from(c.setpoint_c)).unwrap_or_default(),
            flow: self
                .sensor(r, Which::Flow, |r| r.flow_lpm)
                .and_then(|v| LitresPerMinute::new(v).ok()),
            diff_pressure: None,
            facility_supply: celsius(
                self.sensor(r, Which::FacilitySupply, |r| r.facility_supply_c),
            ),
            ambient: self
                .cfg
                .ambient_c
                .and_then(|a| Celsius::new(f64::from(a)).ok()),
            reservoir: None,
            pump_a: pump(0),
            pump_b: pump(1),
            racks,
            it_power: watts(it),
            cooling_power: watts(meter(|r| r.cooling_w)),
            facility_power: watts(facility),
            pue,
        };
        self.publish(Message::CduTelemetry(t), now_ms(), true, |s| {
            &mut s.telemetry_published
        });
    }

    fn publish_state(&mut self, now: u64, c: &Commands, r: Option<&CduReadings>) {
        let due = match &self.state_sent {
            None => true,
            Some((last, at)) => {
                last.mode != c.mode
                    || last.reason != c.reason
                    || (last.setpoint_c - c.setpoint_c).abs() >= STATE_SETPOINT_K
                    || last.cooling_lost != c.cooling_lost
                    || now.saturating_sub(*at) >= STATE_EVERY.as_millis() as u64
            }
        };
        if !due || !self.bus.is_connected() {
            return;
        }
        let lay = self.cfg.core.layout;
        let (_, _, since) = self.core.mode();
        let open_gpus = c.valves_open.count_ones() as f64
            * f64::from(lay.hosts_per_rack)
            * f64::from(lay.gpus_per_host);
        let flow_per_gpu = self
            .sensor(r, Which::Flow, |r| r.flow_lpm)
            .filter(|_| open_gpus > 0.0)
            .and_then(|f| LitresPerMinute::new(f / open_gpus).ok());
        let mut racks = heapless::Vec::new();
        for i in 0..usize::from(lay.racks).min(16) {
            if let Some(rack) = RackIndex::new(i as u8) {
                let _ = racks.push(RackState {
                    rack,
                    cooling: if c.cooling_lost & (1 << i) != 0 {
                        RackCooling::Lost
                    } else {
                        RackCooling::Normal
                    },
                });
            }
        }
        let st = CduState {
            mode: c.mode,
            reason: c.reason,
            since: self.unix(since),
            setpoint: Celsius::new(f64::from(c.setpoint_c)).unwrap_or_default(),
            supply: self
                .sensor(r, Which::Supply, |r| r.supply_c)
                .and_then(|v| Celsius::new(v).ok()),
            flow_per_gpu,
            racks,
        };
        if self.publish(Message::CduState(st), now_ms(), true, |s| {
            &mut s.states_published
        }) {
            self.state_sent = Some((c.clone(), now));
        }
    }

    /// Signs and sends a lease to host `h`; true when the bus took it.
    fn send_lease(&mut self, h: usize, lease: CapLease, lift: bool) -> bool {
        let Some(host) = self.cfg.hosts.get(h).cloned() else {
            return false;
        };
        let topic = Topic::new(&self.cfg.site, Role::Host, &host, Family::Cmd);
        let mut frame = self.bus.next_frame(Message::CapLease(lease), now_ms());
        if let Err(e) = frame.sign(&topic, self.cfg.key_id, &self.cfg.key) {
            tracing::error!("cooling shell: signing a lease for {host}: {e:?}");
            return false;
        }
        match self.bus.publish_frame(&topic, &frame) {
            Ok(()) => {
                self.journal(Journal::Lease {
                    host,
                    frame: Box::new(frame),
                    lift,
                });
                true
            }
            Err(e) => {
                self.stats.publish_errors += 1;
                tracing::warn!("cooling shell: cap lease for {host} not sent: {e}");
                false
            }
        }
    }

    fn leases(&mut self, now: u64, c: &Commands) {
        let renew_ms = (self.cfg.lease.as_millis() / 3) as u64;
        let tdp = self.cfg.core.gpu.tdp_w;
        for h in 0..self.cfg.hosts.len().min(self.sent.len()) {
            let sent = self.sent[h];
            let id = h as u32 + 1;
            match (c.caps[h], sent.watts) {
                (Some(cap), prev) => {
                    let due = match prev {
                        None => true,
                        Some(w) => {
                            (cap.watts - w).abs() >= CAP_RESEND_W
                                || now.saturating_sub(sent.at_ms) >= renew_ms
                        }
                    };
                    if due {
                        let lease = cap_lease(id, cap.reason, cap.watts, self.cfg.lease);
                        if self.send_lease(h, lease, false) {
                            if prev.is_none() {
                                tracing::info!(
                                    "cooling shell: capping {} at {:.0} W per GPU ({})",
                                    self.cfg.hosts[h],
                                    cap.watts,
                                    cap.reason.0
                                );
                            }
                            self.sent[h] = LeaseSent {
                                watts: Some(cap.watts),
                                at_ms: now,
                            };
                            self.stats.leases_sent += 1;
                            self.stats.caps[h] = Some(cap.watts);
                        }
                    }
                }
                (None, Some(_)) => {
                    let lease = cap_lease(id, ReasonCode::OK, tdp, LIFT_DURATION);
                    if self.send_lease(h, lease, true) {
                        tracing::info!("cooling shell: lifting the cap of {}", self.cfg.hosts[h]);
                        self.sent[h] = LeaseSent {
                            watts: None,
                            at_ms: now,
                        };
                        self.stats.lifts_sent += 1;
                        self.stats.caps[h] = None;
                    }
                }
                (None, None) => {}
            }
        }
    }

    fn on_inbound(&mut self, msg: Inbound) {
        if msg.topic.role != Role::Host || msg.topic.json {
            return;
        }
        let sender_ok =
            msg.frame.sender.role == Role::Host && msg.frame.sender.id == msg.topic.node;
        match (&msg.frame.message, msg.topic.family) {
            (Message::HostTelemetry(t), Family::Telemetry) if sender_ok => {
                let Some(&h) = self.index.get(&msg.topic.node) else {
                    return;
                };
                let at = self.now_ms();
                if let Some(slot) = self.reports.get_mut(h) {
                    *slot = Some(host_report(t, at));
                    self.stats.host_reports += 1;
                }
                if let Some(slot) = self.stats.heard.get_mut(h) {
                    *slot = Some(now_ms());
                }
            }
            (Message::Ack(a), Family::Ack) if sender_ok && a.correlation.from == self.me => {
                self.on_ack(msg.topic.node.as_str(), a);
            }
            _ => {}
        }
    }

    fn on_ack(&mut self, host: &str, a: &Ack) {
        self.stats.acks += 1;
        match a.code {
            AckCode::Ok | AckCode::Clamped => self.stats.acks_ok += 1,
            code => {
                self.stats.acks_refused += 1;
                tracing::warn!(
                    "cooling shell: {host} refused lease seq {}: {code:?} {}",
                    a.correlation.seq,
                    a.detail.as_str()
                );
                self.stats.last_refusal =
                    Some((host.to_string(), code, a.detail.as_str().to_string()));
            }
        }
        self.stats
            .in_force
            .insert(host.to_string(), a.in_force.iter().copied().collect());
        self.stats.last_ack.insert(
            host.to_string(),
            LastAck {
                at: now_ms(),
                seq: a.correlation.seq,
                code: a.code,
                detail: a.detail.as_str().to_string(),
            },
        );
        self.report();
    }
}
