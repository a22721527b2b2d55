//! The bridge's decisions: what to publish on the Sparkplug side, and
//! when, from what the Loopwarden bus and the Sparkplug broker say. No
//! clock, no socket: the shell passes the time in (both clocks, [`Now`])
//! and publishes what [`Bridge::step`] returns, in order.
//!
//! The rules (Sparkplug 3.0, chapters 4 to 6):
//! - each connection attempt registers an NDEATH as its MQTT will, with a
//!   `bdSeq` one more than the last attempt's (0 to 255, wrapping);
//! - once connected and subscribed to NCMD: NBIRTH (`seq` 0, the same
//!   `bdSeq`, `Node Control/Rebirth` false, the bridge's own metrics), then
//!   a DBIRTH for each CDU and host heard, and a DDEATH for each one born
//!   before that is dead now (its DDEATH may have been a dropped publish);
//!   one whose death a round said (that DDEATH not dropped) is forgotten at a
//!   round once unheard for [`PACE_MAX_MS`] (a site's churn does not
//!   grow every round), its pace kept for when it is heard again;
//! - a device is born when first heard with a measurement; its telemetry,
//!   health or state then gives DDATA with the metrics that changed; a
//!   host whose GPUs change is born again; `online: false` gives DDEATH,
//!   and its measurements are not kept until its next `online: true`;
//! - every message after NBIRTH carries the next `seq` (255 wraps to 0);
//! - the bridge's own metrics go out as NDATA when they changed, at most
//!   once per `ndata_every_ms`;
//! - a born device not heard for its silence limit (the role's setting,
//!   or 3 × the gap between its last two samples if longer; for a CDU
//!   whose controller is silent, at least [`CONTROLLER_SILENT_AFTER_MS`]
//!   or 1.5 × the gap between its states) gives DDEATH, counted in
//!   `bridge/devices_silent`; its next frame births it again, its pace
//!   kept;
//! - a host's GPU power or power limit past [`GPU_POWER_MAX_W`] is
//!   published null (counted in `bridge/fields_refused`); the rest of
//!   its sample is taken;
//! - an NCMD the broker kept retained is refused (counted in
//!   `bridge/commands_refused`): it would come again at every connection;
//!   an empty one (the publish that clears it, handed over live) is
//!   ignored, not counted;
//! - a refused NCMD subscription is said (`bridge/ncmd_refused` in the
//!   NBIRTH, an error in the log): no rebirth request can reach the bridge;
//! - NCMD `Node Control/Rebirth` true: NBIRTH and every DBIRTH again, at
//!   most once per [`REBIRTH_EVERY_MS`]: a request sooner than that waits
//!   for the end of the window and is carried out then, once, however
//!   many came (each counted in `bridge/rebirths_limited`); while it
//!   waits no DATA goes out (the births carry the current values);
//! - dropped publishes (the shell's queue full): every birth again at the
//!   next tick, then at most once per window, the window doubling from
//!   [`REBIRTH_EVERY_MS`] to [`RESYNC_MAX_MS`] while drops go on; no DATA
//!   while births are due;
//! - frames the Loopwarden client could not queue: every device dies
//!   (DDEATH) and is born again as it is heard (the shell discards the
//!   frames still queued, older than the drop, before it says so);
//! - a clean stop publishes the NDEATH itself before disconnecting.
//!
//! Glossary:
//! - *session*: the Sparkplug connection from its NBIRTH to its loss.
//! - *born*: a device whose DBIRTH went out in this session; the bridge
//!   keeps what it last published of it to find what changed.
//! - *resync*: publishes the shell could not queue leave hosts with gaps;
//!   a tick sends every birth again.
//! - *held*: a rebirth or resync is due; frames are kept in the views but
//!   no DATA goes out until the births.
//! - *silence limit*: how long a born device may go unheard.
//! - *wall time*: ms since the Unix epoch, for the timestamps published
//!   only; it may be stepped (an NTP correction, a VM resumed).
//! - *monotonic time*: ms on a clock that is never stepped, for every
//!   window and every "how long" (silence, pace, rebirth, resync, NDATA).

use std::collections::BTreeMap;

use loopwarden_protocol::{Family, Frame, Ident, Message, Role, Topic};

mod devices;
mod node;
mod paces;
mod rebirth;

use crate::device::{measured_at, View};
use crate::payload::{self, DataType, Point, Value};
use devices::{fields_past_any, notice_refused, refusal, Device, Heard};
pub use devices::{CONTROLLER_SILENT_AFTER_MS, GPU_POWER_MAX_W, PACE_MAX_MS};
use node::{point, Counters};
use paces::Paces;

/// The metric a host sets to ask for every birth again.
pub const REBIRTH: &str = "Node Control/Rebirth";

/// The least time between two rebirths asked by NCMD, ms. A rebirth is
/// the heaviest thing the bridge publishes (an NBIRTH and a DBIRTH with
/// every metric of every CDU and host of the site); a host application
/// asks for one when it starts or sees a gap in `seq`, and waits for the
/// births before it would ask again. 5 s is more than a site's births
/// take to go out and less than a host application waits for them, so a
/// request is never lost (it is carried out at the end of the window),
/// while a flood of NCMDs costs at most one round of births per 5 s.
pub const REBIRTH_EVERY_MS: u64 = 5_000;

/// The longest wait between two rounds of births after dropped
/// publishes, ms: the window doubles from [`REBIRTH_EVERY_MS`] while the
/// births themselves are dropped, so a broker that cannot keep up is not
/// fed a round of births every few seconds.
pub const RESYNC_MAX_MS: u64 = 60_000;

/// The default silence limit of a host and of a CDU, ms: 10 of the
/// agents' default 1 s period, so that a few lost QoS 0 samples on a
/// loaded broker do not kill a device, while a dead one is seen dead
/// within seconds, not never.
pub const SILENT_AFTER_MS: u64 = 10_000;

/// When a step happens, on both clocks: the wall clock stamps what is
/// published; the monotonic clock times silences, paces and windows, so
/// that a wall clock stepped forward does not declare every device dead
/// at once, nor one stepped back keep a dead device alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Ms since the Unix epoch.
    pub wall: u64,
    /// Ms on a clock that is never stepped (the shell's: since it started).
    pub mono: u64,
}

impl From<u64> for Now {
    /// Both clocks at `ms`: a clock that is never stepped (a replay, a test).
    fn from(ms: u64) -> Self {
        Now { wall: ms, mono: ms }
    }
}

/// The most notices kept for the shell between two takes.
pub const NOTICES: usize = 64;

/// What the core tells the shell to log (once per occurrence worth a
/// line; the counters say the rest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A rebirth was asked sooner than [`REBIRTH_EVERY_MS`] after the
    /// last: the births go out `in_ms` from now, for every request until
    /// then. Given once per window.
    RebirthsLimited {
        /// How long until the births go out, ms.
        in_ms: u64,
        /// Requests held back since the bridge started.
        total: u64,
    },
    /// An empty NCMD, ignored: the publish that clears a retained one,
    /// which the broker hands over live.
    EmptyCommand,
    /// An NCMD was refused (counted in `bridge/commands_refused`).
    CommandRefused {
        /// Why.
        why: String,
    },
    /// The broker refused the NCMD subscription (`bridge/ncmd_refused`):
    /// this identity may not use Sparkplug's topics on this broker.
    NcmdRefused {
        /// The NCMD topic.
        topic: String,
    },
    /// A Loopwarden frame was refused (counted in `bridge/frames_refused`).
    FrameRefused {
        /// The topic it came on.
        topic: String,
        /// Its sender.
        sender: String,
        /// Why.
        why: String,
    },
    /// A host's sample held GPU figures past any GPU's, published null
    /// (counted in `bridge/fields_refused`); given when which they are
    /// changes.
    FieldsRefused {
        /// The host.
        device: String,
        /// The fields and figures, and what was done.
        why: String,
    },
    /// A born device went unheard past its silence limit: DDEATH.
    Silent {
        /// The device.
        device: String,
        /// How long it was unheard, ms.
        for_ms: u64,
    },
    /// The Loopwarden client dropped frames it could not queue: every
    /// device is declared dead and born again as it is heard.
    InboundDropped {
        /// Dropped since the last count.
        new: u64,
        /// Dropped since the bridge started.
        total: u64,
    },
    /// Notices past the [`NOTICES`] kept between two takes, not kept
    /// (the counters count what they were). Given last.
    NoticesLost {
        /// How many.
        count: u64,
    },
}

/// What the bridge is, for its topics and its birth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeConfig {
    /// The Sparkplug group id (by default the site).
    pub group: String,
    /// The edge node id.
    pub edge_node: String,
    /// The Loopwarden site it bridges.
    pub site: String,
    /// Its software version, published in NBIRTH.
    pub software: String,
    /// The least time between two NDATA of its own metrics, ms.
    pub ndata_every_ms: u64,
    /// A host unheard this long is declared dead (DDEATH), ms; longer
    /// for a host whose samples come further apart (3 × their gap).
    pub host_silent_after_ms: u64,
    /// The same for a CDU, ms.
    pub cdu_silent_after_ms: u64,
    /// The most CDUs and hosts the site has (`--max-devices`): as many
    /// forgotten devices' paces are kept, for when they are heard again.
    pub max_devices: usize,
}

/// The Sparkplug message types the bridge publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The edge node's birth.
    NBirth,
    /// The edge node's death.
    NDeath,
    /// The edge node's own metrics.
    NData,
    /// A device's birth.
    DBirth,
    /// A device's changed metrics.
    DData,
    /// A device's death.
    DDeath,
}

impl Kind {
    /// Its name in the topic.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::NBirth => "NBIRTH",
            Kind::NDeath => "NDEATH",
            Kind::NData => "NDATA",
            Kind::DBirth => "DBIRTH",
            Kind::DData => "DDATA",
            Kind::DDeath => "DDEATH",
        }
    }
}

/// One MQTT publish for the shell (never retained, as Sparkplug says).
#[derive(Debug, Clone, PartialEq)]
pub struct Publish {
    /// What it is.
    pub kind: Kind,
    /// The device it is about, if any.
    pub device: Option<String>,
    /// `spBv1.0/<group>/<TYPE>/<edge node>[/<device>]`.
    pub topic: String,
    /// The encoded Sparkplug B payload.
    pub payload: Vec<u8>,
    /// 1 for NDEATH, 0 for everything else.
    pub qos: u8,
}

/// What happened, for [`Bridge::step`].
// A frame is moved once, straight into `step`: boxing it would cost an
// allocation per frame and save nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// The Sparkplug connection is up and subscribed to NCMD.
    Connected,
    /// The broker refused the NCMD subscription (given before `Connected`).
    NcmdRefused,
    /// The Sparkplug connection was lost.
    ConnectionLost,
    /// A frame from the Loopwarden bus, with the topic it came on.
    Frame(Topic, Frame),
    /// The Loopwarden bus connection went up (`true`) or down.
    LoopwardenConnected(bool),
    /// An NCMD payload for this edge node.
    Command(Vec<u8>),
    /// An NCMD payload the broker kept retained: refused, as Sparkplug
    /// NCMDs are never retained and the broker would hand it over again
    /// at every connection.
    RetainedCommand(Vec<u8>),
    /// Publishes the shell could not queue: how many, and the devices
    /// whose DDEATH was among them.
    Dropped {
        /// How many.
        count: u64,
        /// The devices of the DDEATHs among them.
        deaths: Vec<String>,
    },
    /// Time passes (about once a second).
    Tick,
    /// The Loopwarden client's count of frames it could not queue for
    /// the bridge, since it started (read at each tick).
    InboundDropped(u64),
    /// A clean stop: publish the NDEATH.
    Stop,
}

/// The bridge core.
pub struct Bridge {
    config: BridgeConfig,
    /// The bdSeq of the latest connection attempt (`None` before the first).
    bd_seq: Option<u8>,
    /// The `seq` of the next message.
    seq: u8,
    /// NBIRTH went out on the connection in use.
    session: bool,
    devices: BTreeMap<Ident, Device>,
    /// The paces of devices forgotten.
    paces: Paces,
    counters: Counters,
    /// The node metrics last published, and when (monotonic).
    node_published: Vec<Point>,
    node_published_at: u64,
    /// When the last rebirth an NCMD asked for went out (monotonic).
    rebirth_at: Option<u64>,
    /// A rebirth was asked within the window: it goes out when it ends.
    rebirth_waiting: bool,
    /// Publishes were dropped: every birth is due again.
    resync: bool,
    /// The window between two rounds of births after drops, ms.
    resync_every_ms: u64,
    /// What the shell is to log, oldest first.
    notices: Vec<Notice>,
    /// Notices not kept since the last take: the queue was full.
    notices_lost: u64,
    /// The Loopwarden bus was said down, and not up since: a frame still
    /// coming was taken before the loss and says nothing of the devices
    /// now (their DDEATH went out).
    loopwarden_lost: bool,
}

impl Bridge {
    /// A bridge that has not connected yet.
    pub fn new(config: BridgeConfig) -> Self {
        Self {
            paces: Paces::new(config.max_devices),
            config,
            bd_seq: None,
            seq: 0,
            session: false,
            resync: false,
            resync_every_ms: REBIRTH_EVERY_MS,
            devices: BTreeMap::new(),
            counters: Counters::default(),
            node_published: Vec::new(),
            node_published_at: 0,
            rebirth_at: None,
            rebirth_waiting: false,
            notices: Vec::new(),
            notices_lost: 0,
            loopwarden_lost: false,
        }
    }

    /// What the last steps left for the shell to log, oldest first, and
    /// last how many more were not kept.
    pub fn take_notices(&mut self) -> Vec<Notice> {
        let mut notices = std::mem::take(&mut self.notices);
        let count = std::mem::take(&mut self.notices_lost);
        if count > 0 {
            notices.push(Notice::NoticesLost { count });
        }
        notices
    }

    /// Keeps a notice for the shell; past [`NOTICES`] untaken, it is
    /// counted, and the counters say what it was.
    fn notify(&mut self, notice: Notice) {
        if self.notices.len() < NOTICES {
            self.notices.push(notice);
        } else {
            self.notices_lost += 1;
        }
    }

    /// The will for the next connection attempt: the NDEATH with the next
    /// `bdSeq` (0 for the first attempt). Register it in that attempt's
    /// MQTT CONNECT; the NBIRTH that follows carries the same `bdSeq`.
    pub fn connecting(&mut self, now: u64) -> Publish {
        self.bd_seq = Some(self.bd_seq.map_or(0, |b| b.wrapping_add(1)));
        self.session = false;
        self.counters.ncmd_refused = false;
        self.ndeath(now)
    }

    /// The `bdSeq` of the latest connection attempt.
    pub fn bd_seq(&self) -> Option<u8> {
        self.bd_seq
    }

    /// How many CDUs and hosts it has heard.
    pub fn devices(&self) -> usize {
        self.devices.len()
    }

    /// Whether an NBIRTH went out on the connection in use.
    pub fn in_session(&self) -> bool {
        self.session
    }

    /// Decides what to publish after `input`, at `now` (see [`Now`]; a
    /// plain `u64` is both clocks at once).
    pub fn step(&mut self, now: impl Into<Now>, input: Input) -> Vec<Publish> {
        let now: Now = now.into();
        match input {
            Input::Connected => self.births(now),
            Input::NcmdRefused => self.ncmd_refused(),
            Input::ConnectionLost => {
                self.end_session();
                Vec::new()
            }
            Input::Frame(topic, frame) => self.frame(now, &topic, frame),
            Input::LoopwardenConnected(up) => self.loopwarden(now.wall, up),
            Input::Command(bytes) => self.command(now, &bytes),
            Input::RetainedCommand(bytes) => self.retained_command(&bytes),
            Input::Dropped { count, deaths } => {
                self.dropped(now.mono, count, &deaths);
                Vec::new()
            }
            Input::Tick => self.tick(now),
            Input::InboundDropped(total) => self.inbound_dropped(now.wall, total),
            Input::Stop => {
                let out = if self.session {
                    vec![self.ndeath(now.wall)]
                } else {
                    Vec::new()
                };
                self.end_session();
                out
            }
        }
    }

    fn end_session(&mut self) {
        self.session = false;
        self.resync = false;
        // The next session's births answer a waiting rebirth.
        self.rebirth_waiting = false;
        for d in self.devices.values_mut() {
            d.published = None;
        }
    }

    fn next_seq(&mut self) -> u8 {
        let s = self.seq;
        self.seq = self.seq.wrapping_add(1);
        s
    }

    fn topic(&self, kind: Kind, device: Option<&str>) -> String {
        let c = &self.config;
        match device {
            Some(d) => format!("spBv1.0/{}/{}/{}/{d}", c.group, kind.as_str(), c.edge_node),
            None => format!("spBv1.0/{}/{}/{}", c.group, kind.as_str(), c.edge_node),
        }
    }

    fn publish(
        &mut self,
        kind: Kind,
        device: Option<&str>,
        now: u64,
        metrics: Vec<payload::Metric>,
    ) -> Publish {
        let seq = (kind != Kind::NDeath).then(|| self.next_seq());
        Publish {
            kind,
            device: device.map(str::to_string),
            topic: self.topic(kind, device),
            payload: payload::encode(now, seq, metrics),
            qos: u8::from(kind == Kind::NDeath),
        }
    }

    fn bd_seq_point(&self, now: u64) -> Point {
        let bd_seq = Value::Int64(i64::from(self.bd_seq.unwrap_or(0)));
        point("bdSeq", DataType::Int64, bd_seq, now)
    }

    fn ndeath(&mut self, now: u64) -> Publish {
        let metrics = vec![self.bd_seq_point(now).to_birth()];
        self.publish(Kind::NDeath, None, now, metrics)
    }

    /// NBIRTH (`seq` 0) and every DBIRTH, for a new session or a rebirth.
    fn births(&mut self, at: Now) -> Vec<Publish> {
        let now = at.wall;
        self.end_session();
        self.session = true;
        self.seq = 0;
        let c = &self.config;
        let fixed = [
            self.bd_seq_point(now),
            point(REBIRTH, DataType::Boolean, Value::Boolean(false), now),
            point(
                "properties/site",
                DataType::String,
                Value::String(c.site.clone()),
                now,
            ),
            point(
                "properties/software",
                DataType::String,
                Value::String(c.software.clone()),
                now,
            ),
        ];
        // The devices are marked born first, so that the NBIRTH counts
        // them online; their DBIRTHs are numbered after it.
        let ids: Vec<Ident> = self.devices.keys().cloned().collect();
        let mut dbirths = Vec::new();
        let mut dead = Vec::new();
        for id in &ids {
            match self.dbirth_if_ready(now, id) {
                Some(birth) => dbirths.push(birth),
                None if self.devices[id].ever_born => dead.push(id.clone()),
                None => {}
            }
        }
        let dead = self.deaths_to_say(at.mono, dead);
        let node = self.node_metrics(now);
        let metrics = fixed.iter().chain(&node).map(Point::to_birth).collect();
        let mut out = vec![self.publish(Kind::NBirth, None, now, metrics)];
        self.node_published = node;
        self.node_published_at = at.mono;
        for (id, points) in dbirths {
            let metrics = points.iter().map(Point::to_birth).collect();
            out.push(self.publish(Kind::DBirth, Some(id.as_str()), now, metrics));
        }
        // A death the host application may have missed (a dropped
        // publish) is said again, so it never shows a dead device alive.
        for id in dead {
            out.push(self.publish(Kind::DDeath, Some(id.as_str()), now, Vec::new()));
        }
        out
    }

    /// Marks a device born and returns its birth metrics when it may be
    /// born now (alive or not yet said otherwise, with a measurement).
    fn dbirth_if_ready(&mut self, now: u64, id: &Ident) -> Option<(Ident, Vec<Point>)> {
        let d = self.devices.get_mut(id)?;
        if !self.session || d.alive == Some(false) || !d.view.has_data() {
            return None;
        }
        let points = d.view.metrics(now);
        d.published = Some(points.clone());
        (d.ever_born, d.death_said) = (true, false);
        Some((id.clone(), points))
    }

    /// What a device's new view makes: a birth if it is not born or its
    /// metric set changed, the changed metrics otherwise, or nothing.
    fn device_update(&mut self, now: u64, id: &Ident) -> Vec<Publish> {
        // Held: the births that are due carry what the view holds now.
        if self.held() {
            return Vec::new();
        }
        let Some(d) = self.devices.get_mut(id) else {
            return Vec::new();
        };
        let (Some(before), true) = (d.published.as_mut(), self.session) else {
            return self.dbirth_now(now, id);
        };
        let after = d.view.metrics(now);
        let same_set =
            before.len() == after.len() && before.iter().zip(&after).all(|(a, b)| a.name == b.name);
        if !same_set {
            return self.dbirth_now(now, id);
        }
        let changed: Vec<payload::Metric> = before
            .iter()
            .zip(&after)
            .filter(|(a, b)| a.value != b.value)
            .map(|(_, b)| b.to_data())
            .collect();
        *before = after;
        if changed.is_empty() {
            return Vec::new();
        }
        vec![self.publish(Kind::DData, Some(id.as_str()), now, changed)]
    }

    fn dbirth_now(&mut self, now: u64, id: &Ident) -> Vec<Publish> {
        match self.dbirth_if_ready(now, id) {
            Some((id, points)) => {
                let metrics = points.iter().map(Point::to_birth).collect();
                vec![self.publish(Kind::DBirth, Some(id.as_str()), now, metrics)]
            }
            None => Vec::new(),
        }
    }

    fn ddeath(&mut self, now: u64, id: &Ident) -> Vec<Publish> {
        let Some(d) = self.devices.get_mut(id) else {
            return Vec::new();
        };
        // What was learned of its pace is kept: a slow sampler's next
        // sample measures its gap from the one before the death.
        let was_born = d.published.take().is_some();
        d.view = match d.role {
            Role::Cdu => View::cdu(),
            _ => View::host(),
        };
        if was_born && self.session {
            vec![self.publish(Kind::DDeath, Some(id.as_str()), now, Vec::new())]
        } else {
            Vec::new()
        }
    }

    fn frame(&mut self, at: Now, topic: &Topic, frame: Frame) -> Vec<Publish> {
        let now = at.wall;
        self.counters.frames_received += 1;
        if self.loopwarden_lost {
            return Vec::new();
        }
        // Events, commands and acks are not published.
        if !matches!(
            topic.family,
            Family::Telemetry | Family::Health | Family::Online
        ) {
            return Vec::new();
        }
        if let Some(why) = refusal(topic, &frame) {
            self.refuse(topic, &frame, why);
            return Vec::new();
        }
        let id = topic.node.clone();
        let paces = &mut self.paces;
        let device = (self.devices.entry(id.clone()))
            .or_insert_with(|| Device::new(topic.role, at.mono).with_pace(paces.take(&id)));
        if device.role != topic.role {
            // A host and a CDU may not share an id in one site: the first
            // one heard keeps it, and the clash is said once.
            let holder = device.role;
            let told = std::mem::replace(&mut device.id_shared_told, true);
            self.counters.frames_refused += 1;
            if !told {
                let why = format!(
                    "{} {id} was heard first: a {} may not share its id (one of the two is missing from SCADA)",
                    holder.as_str(),
                    topic.role.as_str()
                );
                self.notify(notice_refused(topic, &frame, why));
            }
            return Vec::new();
        }
        if matches!(&frame.message, Message::Online(o) if !o.online) {
            device.alive = Some(false);
            device.absent();
            return self.ddeath(now, &id);
        }
        let time = measured_at(frame.time.0, now);
        match frame.message {
            Message::Online(o) => {
                device.alive = Some(true);
                device.heard(at.mono, Heard::Presence);
                device.view.set_software(o.software.as_str().into(), time);
            }
            // Heard while it is said dead (a late sample, or its retained
            // health from before it left): not current. It is born again
            // with what it measures after its next `online: true`.
            _ if device.alive == Some(false) => return Vec::new(),
            message => {
                let (heard, bad) = (Heard::of(&message), fields_past_any(&message));
                if !device.view.record(message, time) {
                    return Vec::new();
                }
                device.heard(at.mono, heard);
                self.gpu_fields(&id, bad);
            }
        }
        self.device_update(now, &id)
    }

    fn refuse(&mut self, topic: &Topic, frame: &Frame, why: String) {
        self.counters.frames_refused += 1;
        self.notify(notice_refused(topic, frame, why));
    }

    /// The Loopwarden bus went up or down. Down: the bridge no longer
    /// sees its devices, so each is declared dead; they are born again
    /// when heard again.
    fn loopwarden(&mut self, now: u64, up: bool) -> Vec<Publish> {
        self.counters.loopwarden_connected = up;
        self.loopwarden_lost = !up;
        if up {
            return Vec::new();
        }
        self.forget_devices(now)
    }

    fn tick(&mut self, now: Now) -> Vec<Publish> {
        let silent = self.silences(now);
        if !self.session {
            return Vec::new();
        }
        // The births say the silent ones dead too.
        if let Some(births) = self.births_due(now) {
            return births;
        }
        if self.held() {
            return silent;
        }
        let mut out = silent;
        out.extend(self.ndata(now));
        out
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_held;
