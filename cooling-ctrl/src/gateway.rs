//! The gateway (`cooling-ctrl gateway`): the Linux side of a CDU
//! controller that runs as firmware on a microcontroller (`firmware/`,
//! docs/firmware.md). The MCU reads and drives the CDU over Modbus RTU and
//! runs the decision path itself; the gateway carries what it says to the
//! bus and what the bus says to it, over a serial line
//! ([`loopwarden_link`]'s frames), and decides nothing.
//!
//! It is on the bus what `cooling-ctrl run` is, with the same
//! configuration ([`ShellConfig`]: this CDU's identity, broker, TLS, sign
//! key, hosts) and the same flash (the event log, the outbox, the
//! sequence floor):
//! - Up: each frame goes through the core ([`bridge::Bridge`]); its
//!   telemetry, retained signed state, events and leases are built, sent
//!   and logged by the functions the shell uses (`crate::shell`), and
//!   answers to readers' requests to resend events come from the same
//!   resender.
//! - Down: host telemetry of this CDU's hosts, as the shell subscribes to
//!   it and maps host ids to indices ([`crate::shell::host_report`]), goes
//!   to the MCU as [`Down::Host`]; every second, and at once when the MCU
//!   starts, [`Down::Alive`] carries the wall clock, whether the broker
//!   is connected and the layout those indices follow
//!   ([`Bridge::alive`]). An MCU whose figures lay the CDU out otherwise
//!   takes no host report and sends no status or lease, and says so (an
//!   error line naming both layouts and its figures' digest, logged at
//!   each of its starts and every minute): the gateway then hears no
//!   status and tells the bus the controller is silent, as for a silent
//!   MCU.
//! - The BMS (with `northbound`): `run`'s northbound Modbus server,
//!   whose reads come from the MCU's last status and whose writes go down
//!   as [`Down::Limits`] and [`Down::Outdoor`] ([`bms`]). At the stop
//!   its writes are closed off, and those already taken are applied and
//!   their limits kept, before the bus is left (as `run`).
//! - Operators' clears, signed by the operator, from the gateway's
//!   console socket, go down as [`Down::Clear`]; the MCU's answer goes
//!   back to the operator's `ctl` ([`clears`]).
//! - A hall of several CDUs (`facility_coordinator`): the MCU's offer
//!   ([`Up::Offer`](loopwarden_link::Up::Offer), sent when it moves) goes
//!   in the retained state as `run` publishes it, and the coordinator's
//!   plan heard on the bus goes down as [`Down::FacilityTarget`]; when
//!   this CDU coordinates, the gateway plans the hall as `run` does
//!   ([`facility`]).
//! - When the MCU is silent for 3 s, the bus is told so: a retained state
//!   in `failsafe`, reason `controller-silent`, with the racks last heard.
//!
//! Nothing goes down a closed line ([`down`]): what is due is sent when
//! it opens.
//!
//! Its counts ([`GatewayStats`]) go to the log and to `/metrics`
//! ([`metrics`]) when `metrics_listen` is set.
//!
//! Glossary:
//! - *MCU*: the microcontroller running the control core.
//! - *up*, *down*: from the MCU to the bus, from the bus to the MCU.
//! - *link*: the serial line between them ([`link`]).

pub mod bms;
pub mod bridge;
pub mod clears;
mod down;
pub mod facility;
pub mod held;
pub mod link;
pub mod metrics;
pub mod queue;

use std::collections::HashMap;
use std::future::Future;
use std::string::String;
use std::time::Duration;
use std::vec::Vec;

use loopwarden_bus::resend::{ResendCounts, Resender};
use loopwarden_bus::{now_ms, Bus, Inbound, MetricsSnapshot, PublishError};
use loopwarden_link::Down;
use loopwarden_protocol::message::CduMode;
use loopwarden_protocol::{Family, Ident, Message, ReasonCode};
use loopwarden_store::agent_flash::SeqFloor;
use loopwarden_store::recorder::Recorder;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};

use crate::facility::FacilityRole;
use crate::northbound::{NorthboundSnapshot, NorthboundWrite};
use crate::shell::{bus_config, hall_state, host_report, last_bms_writes, next};
use crate::shell::{send_lease, send_state, start_bus};
use crate::shell::{BusOptions, LeaseNotSent, NorthboundLink, ShellConfig, ShellError};
use bms::{BmsBridge, Heard};
use bridge::{Act, Bridge, Level, LinkCounts, Now};
use clears::{ClearAsk, ClearOutcome, Pending};
use held::HeldLeases;
use link::{LinkAddr, LinkEvent};
use queue::DownQueue;

/// How often the core looks at the time (silence, the summary).
pub const TICK: Duration = Duration::from_millis(250);
/// How often the MCU is told the gateway is alive.
pub const ALIVE_EVERY: Duration = Duration::from_secs(1);

/// What [`run`] takes besides the config.
#[derive(Debug)]
pub struct GatewayOptions {
    /// Where the MCU is.
    pub link: LinkAddr,
    /// Where the gateway reports its counts after every second; `None`:
    /// nowhere.
    pub stats: Option<watch::Sender<GatewayStats>>,
    /// How it is on the bus: login, keep-alive, flash, readers (as
    /// `run`).
    pub bus: BusOptions,
    /// The northbound server's link (snapshots out, the BMS's writes
    /// in); `None`: no server.
    pub northbound: Option<NorthboundLink>,
    /// Operators' signed clears from the console socket; `None`: none
    /// come.
    pub clears: Option<mpsc::Receiver<ClearAsk>>,
    /// This CDU's part in a hall of several CDUs (`facility_coordinator`);
    /// `None`: not in one.
    pub facility: Option<FacilityRole>,
}

impl GatewayOptions {
    /// Options for an MCU at `link`, everything else by default.
    pub fn new(link: LinkAddr) -> Self {
        Self {
            link,
            stats: None,
            bus: BusOptions::default(),
            northbound: None,
            clears: None,
            facility: None,
        }
    }
}

/// What the gateway has done since it started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GatewayStats {
    /// Seconds of its loop (each sends [`Down::Alive`]).
    pub ticks: u64,
    /// The link's counts.
    pub link: LinkCounts,
    /// The line to the MCU is open.
    pub link_open: bool,
    /// The MCU is silent.
    pub silent: bool,
    /// The mode and reason of the MCU's last status.
    pub mode: Option<(CduMode, ReasonCode)>,
    /// Telemetry frames published.
    pub telemetry_published: u64,
    /// State frames published.
    pub states_published: u64,
    /// Events logged and handed to the bus.
    pub events_published: u64,
    /// Leases signed and sent.
    pub leases_sent: u64,
    /// Publishes the bus did not take.
    pub publish_errors: u64,
    /// Host reports handed to the MCU's line.
    pub host_reports_forwarded: u64,
    /// Host reports replaced by a newer one of the same host before the
    /// line took them (the line does not carry every host's reports at
    /// their rate).
    pub host_reports_superseded: u64,
    /// The BMS's writes handed to the MCU's line (limits, outdoor
    /// temperature; again when due).
    pub bms_forwarded: u64,
    /// The hall's facility water handed to the MCU's line.
    pub facility_forwarded: u64,
    /// Operators' clears, by what became of them.
    pub clears: ClearCounts,
    /// The bus's counters.
    pub bus: MetricsSnapshot,
    /// The bus is connected.
    pub bus_connected: bool,
    /// What the resender of logged events has done.
    pub resend: ResendCounts,
}

/// What became of operators' clears.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClearCounts {
    /// Handed to the MCU's line.
    pub forwarded: u64,
    /// Not sent: the line was not open, or its queue full.
    pub unsent: u64,
    /// Done, as the MCU answered.
    pub done: u64,
    /// Refused, as the MCU answered.
    pub refused: u64,
    /// Not answered in time.
    pub unanswered: u64,
    /// Answers with nobody waiting: after their clear was counted
    /// unanswered, or to a clear sent before this gateway started (not
    /// counted done or refused, so these outcomes add up to forwarded).
    pub late: u64,
}

/// A stats channel for [`GatewayOptions::stats`].
pub fn stats_channel() -> (watch::Sender<GatewayStats>, watch::Receiver<GatewayStats>) {
    watch::channel(GatewayStats::default())
}

/// The gateway's loop, as its log lines and systemd's `STATUS=` name it.
pub const GATEWAY_LOOP: loopwarden_field::watchdog::Progress =
    loopwarden_field::watchdog::Progress {
        program: "cooling-ctrl gateway",
        loop_name: "gateway loop",
        pass: "gateway second",
        count: "second",
    };

struct Gateway {
    cfg: ShellConfig,
    bridge: Bridge,
    bus: Bus,
    recorder: Recorder,
    resender: Resender,
    seq_floor: SeqFloor,
    index: HashMap<Ident, usize>,
    /// The line's queue: control messages first, hosts' latest reports
    /// as it takes them.
    down: DownQueue,
    stats: GatewayStats,
    stats_tx: Option<watch::Sender<GatewayStats>>,
    started: Instant,
    started_unix: u64,
    bms: BmsBridge,
    /// Where the northbound server's snapshots go; `None`: no server.
    snapshots: Option<watch::Sender<NorthboundSnapshot>>,
    /// Clears sent, waiting for the MCU's answer.
    pending: Pending<oneshot::Sender<ClearOutcome>>,
    /// The MCU's latest lease of each host while the bus is down.
    held: HeldLeases,
    /// The BMS's limits on their way to flash (handed again while the
    /// queue is full or the flash refuses them).
    bms_keeping: crate::journal::BmsKeeping,
}

/// Runs the gateway for the CDU of `cfg` until `shutdown` completes, then
/// leaves the bus (waiting up to 3 s for the broker to acknowledge what
/// was handed over).
pub async fn run(
    cfg: ShellConfig,
    mut opts: GatewayOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ShellError> {
    cfg.validate()?;
    let flash = opts.bus.take_flash()?;
    let in_hall = opts.facility.is_some();
    let (_, bc) = bus_config(&cfg, &mut opts.bus, flash.first_seq, in_hall)?;
    let (bus, mut inbound, bus_task, resender) = start_bus(
        bc,
        Box::new(flash.outbox),
        &flash.recorder,
        opts.bus.readers,
    );
    tracing::info!(
        "cooling gateway: CDU {} of site {}, {} hosts, the microcontroller on {}, broker {}",
        cfg.cdu,
        cfg.site,
        cfg.hosts.len(),
        opts.link,
        cfg.broker
    );
    let mut link = link::start(opts.link);
    let on_bus = OnBus {
        bus,
        recorder: flash.recorder,
        resender,
        first_seq: flash.first_seq,
    };
    let (snapshots, mut bms_writes) = match opts.northbound {
        Some(nb) => (Some(nb.snapshots), nb.writes),
        None => (None, None),
    };
    let mut clears = opts.clears;
    let facility = opts.facility.take();
    let mut gw = Gateway::new(cfg, on_bus, link.to_mcu.clone(), opts.stats);
    if let Some(role) = facility {
        let hall = facility::HallPart::new(role, &gw.cfg.cdu, &gw.cfg.core);
        if hall.coordinates() {
            tracing::info!("cooling gateway: this CDU coordinates the hall's facility water");
        }
        gw.bridge = gw.bridge.in_hall(hall);
    }
    gw.snapshots = snapshots;
    // The MCU hears the gateway's layout before anything else of it,
    // when its line opens (`on_link`).
    gw.restore_bms_limits(&flash.bms_limits);
    gw.bms_keeping = crate::journal::BmsKeeping::after(flash.bms_limits_gen);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut alive = tokio::time::interval(ALIVE_EVERY);
    alive.set_missed_tick_behavior(MissedTickBehavior::Skip);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = tick.tick() => gw.tick(),
            _ = alive.tick() => gw.alive().await,
            Some(ev) = link.events.recv() => gw.on_link(ev),
            Some(msg) = inbound.recv() => gw.on_inbound(msg),
            Some(w) = next(&mut bms_writes) => gw.on_bms(w),
            Some(ask) = next(&mut clears) => gw.on_clear(ask),
            _ = &mut shutdown => break,
        }
    }
    // The BMS's writes the server already answered for are taken and
    // their limits kept before the (slow) leaving of the bus; later ones
    // are refused.
    last_bms_writes(bms_writes, |ws| gw.on_bms(ws));
    gw.keep_bms_limits();
    link.task.abort();
    gw.stop(bus_task).await;
    Ok(())
}

/// What the gateway is given on the bus.
struct OnBus {
    bus: Bus,
    recorder: Recorder,
    resender: Resender,
    /// The first sequence number of the block reserved in flash.
    first_seq: u32,
}

impl Gateway {
    fn new(
        cfg: ShellConfig,
        on: OnBus,
        to_mcu: mpsc::Sender<Vec<u8>>,
        stats_tx: Option<watch::Sender<GatewayStats>>,
    ) -> Self {
        let started_unix = now_ms().0;
        let bms = BmsBridge::new(&cfg.core);
        let bridge = Bridge::new(
            cfg.core.layout,
            cfg.core.margins.failsafe_setpoint_c,
            Now {
                mono_ms: 0,
                unix_ms: started_unix,
            },
        );
        Gateway {
            index: cfg
                .hosts
                .iter()
                .enumerate()
                .map(|(i, h)| (h.clone(), i))
                .collect(),
            cfg,
            bridge,
            bus: on.bus,
            recorder: on.recorder,
            resender: on.resender,
            seq_floor: SeqFloor::new(on.first_seq),
            down: DownQueue::new(to_mcu),
            stats: GatewayStats::default(),
            stats_tx,
            started: Instant::now(),
            started_unix,
            bms,
            snapshots: None,
            pending: Pending::default(),
            held: HeldLeases::default(),
            bms_keeping: Default::default(),
        }
    }

    /// Says what crossed the link, hands everything to the bus and
    /// leaves it, waiting up to 3 s for the broker's acknowledgements.
    async fn stop(mut self, bus_task: loopwarden_bus::BusTask) {
        tracing::info!(
            "cooling gateway: stopping; link to the microcontroller: {}",
            self.bridge.counts().words()
        );
        self.recorder.flush().await;
        if let Err(e) = self.bus.shutdown(Duration::from_secs(3)).await {
            tracing::warn!("cooling gateway: leaving the bus: {e}");
        }
        bus_task.join(Duration::from_secs(3)).await;
        self.report();
    }
}

impl Gateway {
    fn now(&self) -> Now {
        let mono_ms = self.started.elapsed().as_millis() as u64;
        Now {
            mono_ms,
            // Unix ms as the bus stamps its frames, so a mode's `since`
            // and the frame's time agree.
            unix_ms: now_ms().0.max(self.started_unix),
        }
    }

    fn report(&mut self) {
        let s = &mut self.stats;
        s.link = self.bridge.counts();
        s.silent = self.bridge.silent();
        s.mode = self.bridge.last_mode();
        s.bus = self.bus.metrics();
        s.bus_connected = self.bus.is_connected();
        s.resend = self.resender.counts().snapshot();
        if let Some(tx) = &self.stats_tx {
            tx.send_replace(self.stats.clone());
        }
    }

    fn tick(&mut self) {
        let now = self.now();
        let acts = self.bridge.tick(now);
        self.perform(acts);
        self.feed_hosts();
        for (id, reply) in self.pending.expired(now.mono_ms) {
            tracing::warn!(
                "cooling gateway: the microcontroller did not answer operator's clear {id} within {} s",
                clears::ANSWER_WITHIN_MS / 1000
            );
            self.stats.clears.unanswered += 1;
            let _ = reply.send(ClearOutcome::NoAnswer);
        }
        // Limits due while the line is closed go when it opens
        // (`on_link`): the closed line is not said as refusing them.
        let open = self.stats.link_open;
        if let Some(limits) = open.then(|| self.bms.due(now.mono_ms, false)).flatten() {
            self.send_bms(&limits);
        }
        self.keep_bms_limits();
        if !self.held.is_empty() && self.bus.is_connected() {
            for (host, lease, lift) in self.held.take(now.mono_ms) {
                self.lease(host, lease, lift);
            }
        }
        self.publish_snapshot(now);
        self.report();
    }

    /// Every second: the MCU hears the gateway is alive, and the bus's
    /// sequence floor is kept ahead.
    async fn alive(&mut self) {
        self.send_alive();
        self.seq_floor.keep_ahead(&self.bus, &self.recorder).await;
        self.stats.ticks += 1;
        self.report();
    }

    fn on_link(&mut self, ev: LinkEvent) {
        match ev {
            LinkEvent::Open(open) => {
                self.stats.link_open = open;
                if open {
                    let water = self.bridge.line_opened(self.now());
                    // Its layout first, then what the line carries.
                    self.send_alive();
                    if let Some(water_c) = water {
                        self.facility_down(water_c);
                    }
                }
                // A line opened (again): the MCU behind it may have
                // started meanwhile, or the limits restored at the start
                // found it closed.
                if let (true, Some(limits)) = (open, self.bms.due(self.now().mono_ms, true)) {
                    self.send_bms(&limits);
                }
            }
            LinkEvent::Wrote(ok) => {
                self.bridge.wrote(ok);
                self.feed_hosts();
            }
            LinkEvent::Bytes(b) => {
                let now = self.now();
                let acts = self.bridge.hear(&b, now);
                self.perform(acts);
                if let Some(limits) = self.bms.due(now.mono_ms, false) {
                    self.send_bms(&limits);
                }
                self.publish_snapshot(now);
            }
        }
    }

    fn on_inbound(&mut self, msg: Inbound) {
        // Readers' requests to resend go to the resender, unread here.
        if msg.topic.family == Family::Resend {
            self.resender.offer(msg);
            return;
        }
        let now = self.now();
        if let Some((from, st, age_ms)) = hall_state(&msg, &self.cfg.cdu, now.unix_ms) {
            let acts = self.bridge.hall_state(from, st, now, age_ms);
            self.perform(acts);
            return;
        }
        let Some((h, t)) = host_report(&msg, &self.index) else {
            return;
        };
        let down = Down::Host {
            index: h as u16,
            stamped: msg.frame.time,
            telemetry: t.clone(),
        };
        self.down.host(h as u16, down);
        self.feed_hosts();
        self.stats.host_reports_superseded = self.down.superseded;
        if let Some(n) = self.down.superseded_to_say(now.mono_ms) {
            tracing::warn!(
                "cooling gateway: the line to the microcontroller does not carry every host's reports at their rate: {n} report(s) replaced by a newer one of the same host before they went (the latest of each goes)"
            );
        }
    }

    /// The BMS wrote `ws` in one request (the northbound server checked
    /// them against the map): what they mean goes down, the limits once
    /// for the whole request (both as written, never one without the
    /// other); an outdoor temperature is in force once the line took it.
    fn on_bms(&mut self, ws: Vec<NorthboundWrite>) {
        let now = self.now();
        let mut limits = None;
        for w in ws {
            tracing::info!("cooling gateway: the BMS wrote {w}");
            match self.bms.write(w) {
                Some(down @ Down::Limits { .. }) => limits = Some(down),
                Some(Down::Outdoor(celsius)) => self.outdoor_down(celsius, now.mono_ms),
                Some(down) => {
                    self.send_bms(&down);
                }
                None => {}
            }
        }
        if let Some(down) = limits {
            if let Some(limits) = self.bms.limits_set() {
                self.bms_keeping.changed(limits);
            }
            self.keep_bms_limits();
            self.send_bms(&down);
        }
        self.publish_snapshot(now);
    }

    /// The northbound server's snapshot of what the MCU said, at `now`.
    fn publish_snapshot(&mut self, now: Now) {
        let Some(tx) = &self.snapshots else {
            return;
        };
        let heard = match (self.bridge.silent(), self.bridge.last_status()) {
            (true, last) => Heard::Silent {
                last,
                quiet_ms: self.bridge.quiet_ms(now),
            },
            (false, Some(s)) => Heard::Speaking(s),
            (false, None) => Heard::Nothing,
        };
        tx.send_replace(self.bms.snapshot(heard, now.mono_ms));
    }

    /// An operator's signed clear: down to the MCU, its answer awaited.
    fn on_clear(&mut self, ask: ClearAsk) {
        let c = &ask.clear.clear;
        let what = format!(
            "operator {}'s clear {} ({}, asked by {})",
            c.operator,
            c.id,
            clears::action_words(c.action),
            ask.caller
        );
        let unsent = if !self.stats.link_open {
            Some("the line to the microcontroller is not open")
        } else if self.pending.waits(c.id) {
            Some("a clear of the same id (signed in the same second) waits for the microcontroller's answer: ask again")
        } else if !self.send_down(&Down::Clear(ask.clear.clone())) {
            Some("the line to the microcontroller does not take it (its queue is full)")
        } else {
            None
        };
        if let Some(why) = unsent {
            tracing::warn!("cooling gateway: {what}: not sent: {why}");
            self.stats.clears.unsent += 1;
            let _ = ask.reply.send(ClearOutcome::NotSent(why.into()));
            return;
        }
        tracing::info!("cooling gateway: {what}: sent to the microcontroller");
        self.stats.clears.forwarded += 1;
        self.pending.wait(c.id, self.now().mono_ms, ask.reply);
    }

    /// The MCU answered clear `id`.
    fn answered(&mut self, id: u32, outcome: Result<(), String>) {
        let Some(reply) = self.pending.answered(id) else {
            self.stats.clears.late += 1;
            let what = outcome
                .as_ref()
                .map_or_else(|w| format!("refused: {w}"), |()| "done".into());
            tracing::warn!(
                "cooling gateway: the microcontroller answered clear {id} ({what}) with nobody waiting (after it was said unanswered, or sent before this gateway started): counted late"
            );
            return;
        };
        match &outcome {
            Ok(()) => self.stats.clears.done += 1,
            Err(_) => self.stats.clears.refused += 1,
        }
        let _ = reply.send(match outcome {
            Ok(()) => ClearOutcome::Done,
            Err(why) => ClearOutcome::Refused(why),
        });
    }

    fn perform(&mut self, acts: Vec<Act>) {
        for act in acts {
            match act {
                Act::Telemetry(t) => {
                    let m = Message::CduTelemetry(*t);
                    match self.bus.publish_mirrored(m, now_ms(), true) {
                        Ok(_) => self.stats.telemetry_published += 1,
                        Err(e) => self.publish_failed("cdu_telemetry", &e),
                    }
                }
                Act::State(st, key) => {
                    if !self.bus.is_connected() {
                        continue;
                    }
                    let signing = self.cfg.key.as_ref().map(|k| (self.cfg.key_id, k));
                    let facility = st.facility.clone();
                    match send_state(&self.bus, *st, signing, "cooling gateway") {
                        Ok(_) => {
                            self.stats.states_published += 1;
                            let at = self.now().mono_ms;
                            self.bridge.state_published(key, facility, at);
                        }
                        Err(e) => self.publish_failed("cdu_state", &e),
                    }
                }
                Act::Event(e) => {
                    tracing::info!("cooling gateway: {e}");
                    self.recorder.emit(e, now_ms());
                    self.stats.events_published += 1;
                }
                Act::Lease { host, lease, lift } => self.lease(host, lease, lift),
                Act::FacilityTarget(water_c) => self.facility_down(water_c),
                Act::Started => {
                    // A started MCU has forgotten the gateway's layout
                    // (it sends no status until it hears one that is its
                    // own), the BMS's limits and its outdoor temperature
                    // (not sent again: it would look new).
                    self.send_alive();
                    let now_ms = self.now().mono_ms;
                    if let Some(limits) = self.bms.due(now_ms, true) {
                        self.send_bms(&limits);
                    }
                    if let Some(c) = self.bms.mcu_started(now_ms) {
                        tracing::warn!(
                            "cooling gateway: the BMS's outdoor temperature, {c} °C, is no longer in force: the microcontroller started again and forgot it; the BMS must write it again"
                        );
                    }
                }
                Act::Say(level, words) => say(level, &words),
                Act::Answer { id, outcome } => self.answered(id, outcome),
            }
        }
    }

    fn publish_failed(&mut self, kind: &str, e: &PublishError) {
        self.stats.publish_errors += 1;
        if !matches!(e, PublishError::Offline) {
            tracing::warn!("cooling gateway: publishing {kind}: {e}");
        }
    }

    /// Signs and sends the MCU's lease for host index `host`.
    fn lease(&mut self, host: usize, lease: loopwarden_protocol::message::CapLease, lift: bool) {
        let Some(id) = self.cfg.hosts.get(host) else {
            tracing::warn!(
                "cooling gateway: the microcontroller sent a lease for host {host}, which has no host id in the configuration: dropped"
            );
            return;
        };
        let Some(key) = &self.cfg.key else {
            tracing::error!("cooling gateway: no sign key: the lease for {id} is not sent");
            return;
        };
        let to = (&self.cfg.site, id);
        let signing = (self.cfg.key_id, key);
        let lease_kept = lease.clone();
        match send_lease(&self.bus, &self.recorder, to, lease, lift, signing) {
            Ok(f) => {
                self.stats.leases_sent += 1;
                // What was held for the host is older than this one.
                self.held.forget(host);
                let now = self.now().mono_ms;
                self.bms.lease_sent(host, &lease_kept, lift, now);
                let what = if lift { "lift" } else { "cap lease" };
                tracing::debug!("cooling gateway: {what} for {id} sent as seq {}", f.seq);
            }
            Err(e @ LeaseNotSent::Sign(_)) => {
                tracing::error!("cooling gateway: a lease for {id}: {e}")
            }
            Err(LeaseNotSent::Offline) => {
                let now = self.now().mono_ms;
                if self.held.hold(host, lease_kept, lift, now) {
                    tracing::info!(
                        "cooling gateway: the bus is down: the microcontroller's latest lease of each host is held, and sent at the reconnection for the life it has left"
                    );
                }
            }
            Err(e) => {
                self.stats.publish_errors += 1;
                tracing::warn!("cooling gateway: cap lease for {id} {e}");
            }
        }
    }
}

/// Logs what the core says.
fn say(level: Level, words: &str) {
    match level {
        Level::Error => tracing::error!("cooling gateway: {words}"),
        Level::Warn => tracing::warn!("cooling gateway: {words}"),
        Level::Info => tracing::info!("cooling gateway: {words}"),
        Level::Debug => tracing::debug!("cooling gateway: {words}"),
    }
}
