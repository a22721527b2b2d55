//! The bridge's decisions: what to publish on the Sparkplug side, and
//! when, from what the Loopwarden bus and the Sparkplug broker say. No
//! clock, no socket: the shell passes the time in and publishes what
//! [`Bridge::step`] returns, in order.
//!
//! The rules (Sparkplug 3.0, chapters 4 to 6):
//! - each connection attempt registers an NDEATH as its MQTT will, with a
//!   `bdSeq` one more than the last attempt's (0 to 255, wrapping);
//! - once connected and subscribed to NCMD: NBIRTH (`seq` 0, the same
//!   `bdSeq`, `Node Control/Rebirth` false, the bridge's own metrics), then
//!   a DBIRTH for each CDU and host heard, and a DDEATH for each one born
//!   before that is dead now (its DDEATH may have been a dropped publish);
//! - a device is born when first heard with a measurement; its telemetry,
//!   health or state then gives DDATA with the metrics that changed; a
//!   host whose GPUs change is born again; `online: false` gives DDEATH,
//!   and its measurements are not kept until its next `online: true`;
//! - every message after NBIRTH carries the next `seq` (255 wraps to 0);
//! - the bridge's own metrics go out as NDATA when they changed, at most
//!   once per `ndata_every_ms`;
//! - NCMD `Node Control/Rebirth` true: NBIRTH and every DBIRTH again, at
//!   most once per [`REBIRTH_EVERY_MS`]: a request sooner than that waits
//!   for the end of the window and is carried out then, once, however
//!   many came (each counted in `bridge/rebirths_limited`);
//! - a clean stop publishes the NDEATH itself before disconnecting.
//!
//! Glossary:
//! - *session*: the Sparkplug connection from its NBIRTH to its loss.
//! - *born*: a device whose DBIRTH went out in this session; the bridge
//!   keeps what it last published of it to find what changed.
//! - *resync*: publishes the shell could not queue leave hosts with gaps;
//!   the next tick sends every birth again.

use std::collections::BTreeMap;

use loopwarden_protocol::{Family, Frame, Ident, Message, Role, Topic};

use crate::device::{measured_at, View};
use crate::payload::{self, DataType, Point, Value};

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

/// What the core tells the shell to log (once per occurrence worth a
/// line; the counters say the rest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A rebirth was asked sooner than [`REBIRTH_EVERY_MS`] after the
    /// last: the births go out at `due` (ms since the epoch), for every
    /// request until then. Given once per window.
    RebirthsLimited {
        /// When the births go out.
        due: u64,
        /// Requests held back since the bridge started.
        total: u64,
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
    /// The Sparkplug connection was lost.
    ConnectionLost,
    /// A frame from the Loopwarden bus, with the topic it came on.
    Frame(Topic, Frame),
    /// The Loopwarden bus connection went up (`true`) or down.
    LoopwardenConnected(bool),
    /// An NCMD payload for this edge node.
    Command(Vec<u8>),
    /// This many publishes could not be queued by the shell.
    Dropped(u64),
    /// Time passes (about once a second).
    Tick,
    /// A clean stop: publish the NDEATH.
    Stop,
}

/// A metric of the bridge itself: always a value, no unit.
fn point(name: &str, datatype: DataType, value: Value, time: u64) -> Point {
    Point {
        name: name.into(),
        datatype,
        value: Some(value),
        unit: None,
        time,
    }
}

/// One Loopwarden node as a Sparkplug device.
struct Device {
    role: Role,
    view: View,
    /// What its `online` said last (`None`: nothing yet). While it says
    /// false, the node's measurements are not kept.
    alive: Option<bool>,
    /// What was last published of it in this session, if born.
    published: Option<Vec<Point>>,
    /// It was born at least once since the bridge started: a host
    /// application knows it, and every round of births says it is dead
    /// while it is.
    ever_born: bool,
}

/// The bridge's own counters, its NDATA metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Counters {
    frames_received: u64,
    frames_refused: u64,
    commands_refused: u64,
    rebirths_limited: u64,
    publishes_dropped: u64,
    loopwarden_connected: bool,
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
    resync: bool,
    devices: BTreeMap<Ident, Device>,
    counters: Counters,
    /// The node metrics last published, and when.
    node_published: Vec<Point>,
    node_published_at: u64,
    /// When the last rebirth an NCMD asked for went out.
    rebirth_at: Option<u64>,
    /// A rebirth was asked within the window: it goes out when it ends.
    rebirth_waiting: bool,
    /// What the shell is to log.
    notice: Option<Notice>,
    /// The Loopwarden bus was said down, and not up since: a frame still
    /// coming was taken before the loss and says nothing of the devices
    /// now (their DDEATH went out).
    loopwarden_lost: bool,
}

impl Bridge {
    /// A bridge that has not connected yet.
    pub fn new(config: BridgeConfig) -> Self {
        Self {
            config,
            bd_seq: None,
            seq: 0,
            session: false,
            resync: false,
            devices: BTreeMap::new(),
            counters: Counters::default(),
            node_published: Vec::new(),
            node_published_at: 0,
            rebirth_at: None,
            rebirth_waiting: false,
            notice: None,
            loopwarden_lost: false,
        }
    }

    /// What the last steps left for the shell to log, if anything.
    pub fn take_notice(&mut self) -> Option<Notice> {
        self.notice.take()
    }

    /// The will for the next connection attempt: the NDEATH with the next
    /// `bdSeq` (0 for the first attempt). Register it in that attempt's
    /// MQTT CONNECT; the NBIRTH that follows carries the same `bdSeq`.
    pub fn connecting(&mut self, now: u64) -> Publish {
        self.bd_seq = Some(self.bd_seq.map_or(0, |b| b.wrapping_add(1)));
        self.session = false;
        self.ndeath(now)
    }

    /// The `bdSeq` of the latest connection attempt.
    pub fn bd_seq(&self) -> Option<u8> {
        self.bd_seq
    }

    /// Whether an NBIRTH went out on the connection in use.
    pub fn in_session(&self) -> bool {
        self.session
    }

    /// Decides what to publish after `input`, at `now` (ms since the Unix
    /// epoch).
    pub fn step(&mut self, now: u64, input: Input) -> Vec<Publish> {
        match input {
            Input::Connected => self.births(now),
            Input::ConnectionLost => {
                self.end_session();
                Vec::new()
            }
            Input::Frame(topic, frame) => self.frame(now, &topic, frame),
            Input::LoopwardenConnected(up) => self.loopwarden(now, up),
            Input::Command(bytes) => self.command(now, &bytes),
            Input::Dropped(n) => {
                self.counters.publishes_dropped += n;
                self.resync = self.session;
                Vec::new()
            }
            Input::Tick => self.tick(now),
            Input::Stop => {
                let out = if self.session {
                    vec![self.ndeath(now)]
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

    /// The bridge's own metrics (those NDATA may carry).
    fn node_metrics(&self, now: u64) -> Vec<Point> {
        let c = &self.counters;
        let point = |name, datatype, value| point(name, datatype, value, now);
        let online = self
            .devices
            .values()
            .filter(|d| d.published.is_some())
            .count();
        vec![
            point(
                "bridge/loopwarden_connected",
                DataType::Boolean,
                Value::Boolean(c.loopwarden_connected),
            ),
            point(
                "bridge/devices_online",
                DataType::UInt32,
                Value::UInt32(online as u32),
            ),
            point(
                "bridge/frames_received",
                DataType::UInt64,
                Value::UInt64(c.frames_received),
            ),
            point(
                "bridge/frames_refused",
                DataType::UInt64,
                Value::UInt64(c.frames_refused),
            ),
            point(
                "bridge/commands_refused",
                DataType::UInt64,
                Value::UInt64(c.commands_refused),
            ),
            point(
                "bridge/rebirths_limited",
                DataType::UInt64,
                Value::UInt64(c.rebirths_limited),
            ),
            point(
                "bridge/publishes_dropped",
                DataType::UInt64,
                Value::UInt64(c.publishes_dropped),
            ),
        ]
    }

    /// NBIRTH (`seq` 0) and every DBIRTH, for a new session or a rebirth.
    fn births(&mut self, now: u64) -> Vec<Publish> {
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
                None if self.devices[id].ever_born => dead.push(id),
                None => {}
            }
        }
        let node = self.node_metrics(now);
        let metrics = fixed.iter().chain(&node).map(Point::to_birth).collect();
        let mut out = vec![self.publish(Kind::NBirth, None, now, metrics)];
        self.node_published = node;
        self.node_published_at = now;
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
        d.ever_born = true;
        Some((id.clone(), points))
    }

    /// What a device's new view makes: a birth if it is not born or its
    /// metric set changed, the changed metrics otherwise, or nothing.
    fn device_update(&mut self, now: u64, id: &Ident) -> Vec<Publish> {
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

    fn frame(&mut self, now: u64, topic: &Topic, frame: Frame) -> Vec<Publish> {
        self.counters.frames_received += 1;
        if self.loopwarden_lost {
            return Vec::new();
        }
        let owner_sent_it = frame.sender.role == topic.role && frame.sender.id == topic.node;
        let fits = matches!(
            (topic.role, topic.family, &frame.message),
            (Role::Host, Family::Telemetry, Message::HostTelemetry(_))
                | (Role::Host, Family::Health, Message::HostHealth(_))
                | (Role::Cdu, Family::Telemetry, Message::CduTelemetry(_))
                | (Role::Cdu, Family::Health, Message::CduState(_))
                | (Role::Host | Role::Cdu, Family::Online, Message::Online(_))
        );
        // Events, commands and acks are not published; a frame on another
        // node's topic, or of the wrong kind for it, is refused.
        if !matches!(
            topic.family,
            Family::Telemetry | Family::Health | Family::Online
        ) {
            return Vec::new();
        }
        if !owner_sent_it || !fits {
            self.counters.frames_refused += 1;
            return Vec::new();
        }
        let id = topic.node.clone();
        let device = self.devices.entry(id.clone()).or_insert_with(|| Device {
            role: topic.role,
            view: if topic.role == Role::Cdu {
                View::cdu()
            } else {
                View::host()
            },
            alive: None,
            published: None,
            ever_born: false,
        });
        if device.role != topic.role {
            // A host and a CDU may not share an id in one site: the first
            // one heard keeps it.
            self.counters.frames_refused += 1;
            return Vec::new();
        }
        if matches!(&frame.message, Message::Online(o) if !o.online) {
            device.alive = Some(false);
            return self.ddeath(now, &id);
        }
        let time = measured_at(frame.time.0, now);
        match frame.message {
            Message::Online(o) => {
                device.alive = Some(true);
                device.view.set_software(o.software.as_str().into(), time);
            }
            // Heard while it is said dead (a late sample, or its retained
            // health from before it left): not current. It is born again
            // with what it measures after its next `online: true`.
            _ if device.alive == Some(false) => return Vec::new(),
            message => {
                if !device.view.record(message, time) {
                    return Vec::new();
                }
            }
        }
        self.device_update(now, &id)
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
        let ids: Vec<Ident> = self.devices.keys().cloned().collect();
        let mut out = Vec::new();
        for id in ids {
            out.extend(self.ddeath(now, &id));
            if let Some(d) = self.devices.get_mut(&id) {
                d.alive = None;
            }
        }
        out
    }

    fn command(&mut self, now: u64, bytes: &[u8]) -> Vec<Publish> {
        let rebirth = match payload::decode(bytes) {
            Ok(p) => p.metrics.iter().any(|m| {
                m.name.as_deref() == Some(REBIRTH)
                    && m.value == Some(payload::MetricValue::Boolean(true))
            }),
            Err(_) => false,
        };
        if !rebirth {
            self.counters.commands_refused += 1;
            return Vec::new();
        }
        if !self.session {
            return Vec::new();
        }
        let Some(due) = self.rebirth_due(now) else {
            self.rebirth_at = Some(now);
            return self.births(now);
        };
        self.counters.rebirths_limited += 1;
        if !self.rebirth_waiting {
            self.rebirth_waiting = true;
            self.notice = Some(Notice::RebirthsLimited {
                due,
                total: self.counters.rebirths_limited,
            });
        }
        Vec::new()
    }

    /// When a rebirth asked at `now` may go out, if not now: the last
    /// one plus [`REBIRTH_EVERY_MS`]. A clock set back before the last
    /// one does not hold a request back.
    fn rebirth_due(&self, now: u64) -> Option<u64> {
        let last = self.rebirth_at?;
        let due = last.saturating_add(REBIRTH_EVERY_MS);
        (last <= now && now < due).then_some(due)
    }

    fn tick(&mut self, now: u64) -> Vec<Publish> {
        if !self.session {
            return Vec::new();
        }
        if self.rebirth_waiting && self.rebirth_due(now).is_none() {
            self.rebirth_at = Some(now);
            return self.births(now);
        }
        if self.resync {
            return self.births(now);
        }
        if now.saturating_sub(self.node_published_at) < self.config.ndata_every_ms {
            return Vec::new();
        }
        let now_metrics = self.node_metrics(now);
        let changed: Vec<payload::Metric> = self
            .node_published
            .iter()
            .zip(&now_metrics)
            .filter(|(a, b)| a.value != b.value)
            .map(|(_, b)| b.to_data())
            .collect();
        if changed.is_empty() {
            return Vec::new();
        }
        self.node_published = now_metrics;
        self.node_published_at = now;
        vec![self.publish(Kind::NData, None, now, changed)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::{decode, MetricValue, Payload};
    use loopwarden_protocol::{
        samples, CduMode, ClockSource, MessageKind, NodeId, Online, ReasonCode, Text, TimestampMs,
        WholeCelsius,
    };
    use proptest::prelude::*;

    const T: u64 = 1_795_953_600_000;

    fn bridge() -> Bridge {
        Bridge::new(BridgeConfig {
            group: "hall-1".into(),
            edge_node: "loopwarden".into(),
            site: "hall-1".into(),
            software: "0.1.0".into(),
            ndata_every_ms: 10_000,
        })
    }

    fn input(role: Role, id: &str, message: Message) -> Input {
        let site = Ident::new("hall-1").unwrap();
        let node = NodeId::new(role, id).unwrap();
        let family = message.kind().family();
        let topic = Topic::new(&site, role, &node.id, family);
        let frame = Frame {
            sender: node,
            seq: 1,
            time: TimestampMs(T),
            message,
        };
        Input::Frame(topic, frame)
    }

    fn online(role: Role, id: &str, up: bool) -> Input {
        let o = Online {
            online: up,
            software: Text::truncated("0.1.0"),
            started: TimestampMs(T),
            clock: ClockSource::UnixEpoch,
        };
        input(role, id, Message::Online(o))
    }

    fn host_telemetry(id: &str, temp: u8) -> Input {
        let mut t = samples::host_telemetry(2);
        t.gpus[0].temp = WholeCelsius(temp);
        input(Role::Host, id, Message::HostTelemetry(t))
    }

    fn cdu_state() -> Input {
        input(Role::Cdu, "cdu-a", samples::message(MessageKind::CduState))
    }

    fn body(p: &Publish) -> Payload {
        decode(&p.payload).expect("the bridge's payloads decode")
    }

    fn metric(p: &Payload, name: &str) -> Option<MetricValue> {
        let m = p.metrics.iter().find(|m| m.name.as_deref() == Some(name))?;
        m.value.clone()
    }

    fn kinds(out: &[Publish]) -> Vec<(Kind, Option<&str>)> {
        out.iter().map(|p| (p.kind, p.device.as_deref())).collect()
    }

    fn connected(b: &mut Bridge) -> Vec<Publish> {
        b.connecting(T);
        b.step(T, Input::Connected)
    }

    fn rebirth_command() -> Vec<u8> {
        let m = payload::Metric {
            name: Some(REBIRTH.into()),
            value: Some(MetricValue::Boolean(true)),
            ..Default::default()
        };
        payload::encode(T, None, vec![m])
    }

    #[test]
    fn the_birth_carries_seq_0_the_wills_bdseq_and_the_rebirth_control() {
        let mut b = bridge();
        let will = b.connecting(T);
        assert_eq!(will.topic, "spBv1.0/hall-1/NDEATH/loopwarden");
        assert_eq!((will.kind, will.qos), (Kind::NDeath, 1));
        let death = body(&will);
        assert_eq!(death.seq, None, "an NDEATH has no seq");
        assert_eq!(metric(&death, "bdSeq"), Some(MetricValue::Long(0)));
        let will = b.connecting(T);
        assert_eq!(metric(&body(&will), "bdSeq"), Some(MetricValue::Long(1)));
        let out = b.step(T, Input::Connected);
        assert_eq!(kinds(&out), [(Kind::NBirth, None)]);
        assert_eq!(out[0].topic, "spBv1.0/hall-1/NBIRTH/loopwarden");
        let birth = body(&out[0]);
        assert_eq!((birth.seq, birth.timestamp), (Some(0), Some(T)));
        assert_eq!(metric(&birth, "bdSeq"), Some(MetricValue::Long(1)));
        assert_eq!(metric(&birth, REBIRTH), Some(MetricValue::Boolean(false)));
        assert!(birth
            .metrics
            .iter()
            .all(|m| m.datatype.is_some() && m.timestamp == Some(T)));
    }

    #[test]
    fn the_largest_births_fit_the_loopwarden_brokers_packet_limit() {
        // Every name at its longest, a host of the most GPUs, every GPU
        // with a health entry: the births a shared broker must let through.
        let long = |c: char| std::iter::repeat_n(c, loopwarden_protocol::ids::IDENT_MAX).collect();
        let mut b = Bridge::new(BridgeConfig {
            group: long('g'),
            edge_node: long('e'),
            site: "hall-1".into(),
            software: "0.1.0".into(),
            ndata_every_ms: 10_000,
        });
        let host: String = long('h');
        let gpus = loopwarden_protocol::MAX_GPUS as u8;
        let telemetry = samples::host_telemetry(gpus);
        let Message::HostHealth(mut health) = samples::message(MessageKind::HostHealth) else {
            unreachable!("the sample is a health report")
        };
        let first = health.gpus[0].clone();
        health.gpus.clear();
        for i in 0..gpus {
            let mut g = first.clone();
            g.gpu = loopwarden_protocol::GpuIndex::new(i).unwrap();
            health.gpus.push(g).unwrap();
        }
        b.step(
            T,
            input(Role::Host, &host, Message::HostTelemetry(telemetry)),
        );
        b.step(T, input(Role::Host, &host, Message::HostHealth(health)));
        b.step(T, cdu_state());
        let out = connected(&mut b);
        assert_eq!(out.len(), 3, "{:?}", kinds(&out));
        let birth = out
            .iter()
            .find(|p| p.device.as_deref() == Some(host.as_str()));
        let gpu_metrics = body(birth.expect("the host is born")).metrics.len();
        assert!(gpu_metrics > 9 * usize::from(gpus), "{gpu_metrics} metrics");
        for p in &out {
            // An MQTT PUBLISH: fixed header (at most 5), topic length (2),
            // packet id (2), topic and payload.
            let packet = 9 + p.topic.len() + p.payload.len();
            assert!(
                packet <= loopwarden_bus::MAX_PACKET_SIZE,
                "{} is {packet} bytes, over the broker's {}",
                p.topic,
                loopwarden_bus::MAX_PACKET_SIZE
            );
        }
    }

    #[test]
    fn bdseq_wraps_from_255_to_0() {
        let mut b = bridge();
        for _ in 0..256 {
            b.connecting(T);
        }
        assert_eq!(b.bd_seq(), Some(255));
        let will = b.connecting(T);
        assert_eq!(metric(&body(&will), "bdSeq"), Some(MetricValue::Long(0)));
    }

    #[test]
    fn a_device_is_born_first_then_sends_only_what_changed() {
        let mut b = bridge();
        assert!(
            b.step(T, host_telemetry("h07", 61)).is_empty(),
            "no session yet"
        );
        let out = connected(&mut b);
        assert_eq!(
            kinds(&out),
            [(Kind::NBirth, None), (Kind::DBirth, Some("h07"))]
        );
        assert_eq!(out[1].topic, "spBv1.0/hall-1/DBIRTH/loopwarden/h07");
        assert_eq!(body(&out[1]).seq, Some(1));
        assert!(
            b.step(T, host_telemetry("h07", 61)).is_empty(),
            "nothing changed"
        );
        let out = b.step(T + 1, host_telemetry("h07", 70));
        assert_eq!(kinds(&out), [(Kind::DData, Some("h07"))]);
        let data = body(&out[0]);
        assert_eq!(data.seq, Some(2));
        let names: Vec<_> = data
            .metrics
            .iter()
            .filter_map(|m| m.name.as_deref())
            .collect();
        assert_eq!(names, ["hottest_gpu_c", "gpu/0/temp_c"]);
        assert_eq!(metric(&data, "gpu/0/temp_c"), Some(MetricValue::Int(70)));
        assert!(data.metrics.iter().all(|m| m.datatype.is_none()));
        // A CDU heard for the first time during the session is born at once.
        let out = b.step(T, cdu_state());
        assert_eq!(kinds(&out), [(Kind::DBirth, Some("cdu-a"))]);
        assert_eq!(
            metric(&body(&out[0]), "mode"),
            Some(MetricValue::String("degraded".into()))
        );
    }

    #[test]
    fn seq_counts_every_message_and_wraps_from_255_to_0() {
        let mut b = bridge();
        connected(&mut b);
        let mut seqs = Vec::new();
        for i in 0..300u64 {
            let temp = if i % 2 == 0 { 61 } else { 62 };
            for p in b.step(T + i, host_telemetry("h07", temp)) {
                seqs.push(body(&p).seq.unwrap());
            }
        }
        assert_eq!(seqs.len(), 300, "a birth, then one DDATA per change");
        let want: Vec<u64> = (1..=300).map(|s| s % 256).collect();
        assert_eq!(seqs, want);
    }

    #[test]
    fn a_host_whose_gpus_change_is_born_again() {
        let mut b = bridge();
        connected(&mut b);
        b.step(T, host_telemetry("h07", 61));
        let t = samples::host_telemetry(4);
        let out = b.step(T, input(Role::Host, "h07", Message::HostTelemetry(t)));
        assert_eq!(kinds(&out), [(Kind::DBirth, Some("h07"))]);
        assert_eq!(
            metric(&body(&out[0]), "gpu/3/power_limit_w"),
            Some(MetricValue::Int(700))
        );
    }

    #[test]
    fn offline_gives_ddeath_and_only_online_brings_the_device_back() {
        let mut b = bridge();
        connected(&mut b);
        b.step(T, online(Role::Host, "h07", true));
        assert_eq!(
            kinds(&b.step(T, host_telemetry("h07", 61)))[0].0,
            Kind::DBirth
        );
        let out = b.step(T, online(Role::Host, "h07", false));
        assert_eq!(kinds(&out), [(Kind::DDeath, Some("h07"))]);
        let death = body(&out[0]);
        assert!(death.seq.is_some() && death.metrics.is_empty());
        assert!(
            b.step(T, online(Role::Host, "h07", false)).is_empty(),
            "dead once"
        );
        assert!(
            b.step(T, host_telemetry("h07", 62)).is_empty(),
            "a late sample"
        );
        let out = b.step(T, online(Role::Host, "h07", true));
        assert!(
            out.is_empty(),
            "back, but born with its next measurement, not the late one: {:?}",
            kinds(&out)
        );
        let out = b.step(T, host_telemetry("h07", 63));
        assert_eq!(kinds(&out), [(Kind::DBirth, Some("h07"))]);
        let birth = body(&out[0]);
        assert_eq!(metric(&birth, "gpu/0/temp_c"), Some(MetricValue::Int(63)));
        let software = metric(&birth, "properties/software");
        assert_eq!(software, Some(MetricValue::String("0.1.0".into())));
    }

    #[test]
    fn a_dead_hosts_retained_health_is_not_born_as_current_when_it_comes_back() {
        let mut b = bridge();
        // At the bridge's start the broker hands over what it retains: the
        // host left a week ago, with a GPU quarantined then.
        b.step(T, online(Role::Host, "h07", false));
        let health = samples::message(MessageKind::HostHealth);
        b.step(T, input(Role::Host, "h07", health));
        assert_eq!(kinds(&connected(&mut b)), [(Kind::NBirth, None)]);
        assert!(b.step(T, online(Role::Host, "h07", true)).is_empty());
        let out = b.step(T, host_telemetry("h07", 61));
        assert_eq!(kinds(&out), [(Kind::DBirth, Some("h07"))]);
        let birth = body(&out[0]);
        assert_eq!(metric(&birth, "gpu/0/temp_c"), Some(MetricValue::Int(61)));
        for name in ["gpus_quarantined", "gpu/0/health", "gpu/1/quarantined"] {
            let m = birth
                .metrics
                .iter()
                .find(|m| m.name.as_deref() == Some(name));
            let m = m.unwrap_or_else(|| panic!("no metric {name}"));
            assert_eq!((m.is_null, &m.value), (Some(true), &None), "{name}");
        }
    }

    #[test]
    fn a_cdu_whose_controller_is_silent_has_no_loop_and_no_dry_leak_until_its_next_telemetry() {
        let mut b = bridge();
        connected(&mut b);
        let telemetry = || {
            let t = samples::message(MessageKind::CduTelemetry);
            input(Role::Cdu, "cdu-a", t)
        };
        let state = |mode, reason| {
            let Message::CduState(mut s) = samples::message(MessageKind::CduState) else {
                unreachable!("the sample is a CDU state")
            };
            (s.mode, s.reason) = (mode, reason);
            input(Role::Cdu, "cdu-a", Message::CduState(s))
        };
        let out = b.step(T, telemetry());
        assert_eq!(kinds(&out), [(Kind::DBirth, Some("cdu-a"))]);
        let birth = body(&out[0]);
        assert_eq!(metric(&birth, "leak"), Some(MetricValue::Boolean(false)));
        let out = b.step(T, state(CduMode::Normal, ReasonCode::OK));
        let data = body(&out[0]);
        assert_eq!(
            metric(&data, "mode"),
            Some(MetricValue::String("normal".into()))
        );
        assert!(
            data.metrics.iter().all(|m| m.is_null.is_none()),
            "another state keeps the loop: {data:?}"
        );
        // The gateway hears its microcontroller no more.
        let out = b.step(
            T + 3_000,
            state(CduMode::Failsafe, ReasonCode::CONTROLLER_SILENT),
        );
        assert_eq!(kinds(&out), [(Kind::DData, Some("cdu-a"))]);
        let data = body(&out[0]);
        let null = |p: &Payload, name: &str| {
            let m = p.metrics.iter().find(|m| m.name.as_deref() == Some(name));
            m.is_some_and(|m| m.is_null == Some(true) && m.value.is_none())
        };
        for name in ["leak", "supply_temp_c", "flow_lpm", "pump_a/running"] {
            assert!(null(&data, name), "{name} is not null: {data:?}");
        }
        assert_eq!(
            metric(&data, "mode_reason"),
            Some(MetricValue::String("controller-silent".into()))
        );
        // It speaks again: the loop is back with its telemetry.
        b.step(T + 9_000, state(CduMode::Normal, ReasonCode::OK));
        let out = b.step(T + 9_000, telemetry());
        assert_eq!(kinds(&out), [(Kind::DData, Some("cdu-a"))]);
        let data = body(&out[0]);
        assert_eq!(metric(&data, "leak"), Some(MetricValue::Boolean(false)));
        assert!(metric(&data, "supply_temp_c").is_some());
    }

    #[test]
    fn a_rebirth_command_sends_every_birth_again_with_the_same_bdseq() {
        let mut b = bridge();
        connected(&mut b);
        b.step(T, host_telemetry("h07", 61));
        b.step(T, cdu_state());
        b.step(T, host_telemetry("h07", 65));
        let out = b.step(T, Input::Command(rebirth_command()));
        let want = [
            (Kind::NBirth, None),
            (Kind::DBirth, Some("cdu-a")),
            (Kind::DBirth, Some("h07")),
        ];
        assert_eq!(kinds(&out), want);
        let seqs: Vec<_> = out.iter().map(|p| body(p).seq).collect();
        assert_eq!(seqs, [Some(0), Some(1), Some(2)]);
        assert_eq!(metric(&body(&out[0]), "bdSeq"), Some(MetricValue::Long(0)));
        assert_eq!(
            metric(&body(&out[2]), "gpu/0/temp_c"),
            Some(MetricValue::Int(65))
        );
        // Anything else is refused and counted in the next NDATA.
        assert!(b.step(T, Input::Command(vec![0xff, 0xff])).is_empty());
        let out = b.step(T + 10_000, Input::Tick);
        assert_eq!(kinds(&out), [(Kind::NData, None)]);
        let data = body(&out[0]);
        assert_eq!(
            metric(&data, "bridge/commands_refused"),
            Some(MetricValue::Long(1))
        );
        assert!(
            b.step(T + 15_000, Input::Tick).is_empty(),
            "too soon, and nothing new"
        );
    }

    #[test]
    fn rebirths_go_out_at_most_once_per_window_and_those_held_back_wait_and_are_counted() {
        let mut b = bridge();
        connected(&mut b);
        b.step(T, host_telemetry("h07", 61));
        let rebirth = |b: &mut Bridge, at: u64| b.step(at, Input::Command(rebirth_command()));
        let births = [(Kind::NBirth, None), (Kind::DBirth, Some("h07"))];
        assert_eq!(kinds(&rebirth(&mut b, T)), births, "the first at once");
        assert_eq!(b.take_notice(), None);
        // Two more within 5 s: nothing now, one notice for the window.
        assert!(rebirth(&mut b, T + 1_000).is_empty());
        let due = T + REBIRTH_EVERY_MS;
        let notice = Notice::RebirthsLimited { due, total: 1 };
        assert_eq!(b.take_notice(), Some(notice));
        assert!(rebirth(&mut b, T + 2_000).is_empty());
        assert_eq!(b.take_notice(), None, "once per window");
        assert!(b.step(due - 1, Input::Tick).is_empty());
        // The window ends: one round of births for both.
        let out = b.step(due, Input::Tick);
        assert_eq!(kinds(&out), births);
        let held = metric(&body(&out[0]), "bridge/rebirths_limited");
        assert_eq!(held, Some(MetricValue::Long(2)));
        assert!(b.step(due + 1_000, Input::Tick).is_empty(), "nothing waits");
        // The births at the window's end start the next window.
        assert!(rebirth(&mut b, due + 4_999).is_empty());
        let notice = Notice::RebirthsLimited {
            due: due + REBIRTH_EVERY_MS,
            total: 3,
        };
        assert_eq!(b.take_notice(), Some(notice));
        let out = b.step(due + REBIRTH_EVERY_MS, Input::Tick);
        assert_eq!(kinds(&out), births);
        // A quiet minute later, a request is carried out at once.
        let later = due + 60_000;
        assert_eq!(kinds(&rebirth(&mut b, later)), births);
    }

    #[test]
    fn a_clock_set_back_or_a_new_session_does_not_hold_a_rebirth_back() {
        let mut b = bridge();
        connected(&mut b);
        b.step(T, host_telemetry("h07", 61));
        let rebirth = |b: &mut Bridge, at: u64| b.step(at, Input::Command(rebirth_command()));
        assert!(!rebirth(&mut b, T + 60_000).is_empty());
        assert!(
            !rebirth(&mut b, T).is_empty(),
            "the clock went back a minute"
        );
        assert!(rebirth(&mut b, T + 1).is_empty(), "held back");
        // The connection is lost and made again: its births answer the
        // waiting request, and no second round follows at the window's end.
        b.step(T + 2, Input::ConnectionLost);
        b.connecting(T + 3);
        let out = b.step(T + 3, Input::Connected);
        assert_eq!(kinds(&out)[0], (Kind::NBirth, None));
        assert!(b.step(T + REBIRTH_EVERY_MS, Input::Tick).is_empty());
    }

    #[test]
    fn frames_on_another_nodes_topic_or_of_a_foreign_kind_are_refused() {
        let mut b = bridge();
        connected(&mut b);
        let Input::Frame(topic, mut frame) = host_telemetry("h07", 61) else {
            unreachable!()
        };
        frame.sender = NodeId::new(Role::Host, "h08").unwrap();
        assert!(b.step(T, Input::Frame(topic.clone(), frame)).is_empty());
        // A CDU state on a host's health topic.
        let Input::Frame(_, state) = cdu_state() else {
            unreachable!()
        };
        let health = Topic {
            family: Family::Health,
            ..topic
        };
        let frame = Frame {
            sender: NodeId::new(Role::Host, "h07").unwrap(),
            ..state
        };
        assert!(b.step(T, Input::Frame(health, frame)).is_empty());
        let out = b.step(T + 10_000, Input::Tick);
        assert_eq!(
            metric(&body(&out[0]), "bridge/frames_refused"),
            Some(MetricValue::Long(2))
        );
    }

    #[test]
    fn losing_the_loopwarden_bus_declares_every_device_dead() {
        let mut b = bridge();
        connected(&mut b);
        b.step(T, Input::LoopwardenConnected(true));
        b.step(T, host_telemetry("h07", 61));
        b.step(T, cdu_state());
        let out = b.step(T, Input::LoopwardenConnected(false));
        assert_eq!(
            kinds(&out),
            [(Kind::DDeath, Some("cdu-a")), (Kind::DDeath, Some("h07"))]
        );
        // A frame the bus took before the loss, stepped after it: not
        // the device now, and no birth over its DDEATH.
        assert!(b.step(T, host_telemetry("h07", 61)).is_empty());
        assert!(b.step(T, Input::LoopwardenConnected(true)).is_empty());
        let out = b.step(T, host_telemetry("h07", 62));
        assert_eq!(
            kinds(&out),
            [(Kind::DBirth, Some("h07"))],
            "heard again: born again"
        );
    }

    #[test]
    fn a_clean_stop_publishes_the_ndeath_and_a_lost_queue_resyncs() {
        let mut b = bridge();
        connected(&mut b);
        b.step(T, host_telemetry("h07", 61));
        assert!(b.step(T, Input::Dropped(3)).is_empty());
        let out = b.step(T + 1, Input::Tick);
        assert_eq!(
            kinds(&out),
            [(Kind::NBirth, None), (Kind::DBirth, Some("h07"))]
        );
        let out = b.step(T + 2, Input::Stop);
        assert_eq!(kinds(&out), [(Kind::NDeath, None)]);
        assert_eq!(metric(&body(&out[0]), "bdSeq"), Some(MetricValue::Long(0)));
        assert!(
            b.step(T + 3, host_telemetry("h07", 70)).is_empty(),
            "no session"
        );
        assert!(b.step(T + 4, Input::Stop).is_empty(), "one goodbye");
    }

    #[test]
    fn a_dropped_ddeath_is_said_again_by_the_births_that_follow() {
        let mut b = bridge();
        b.step(T, online(Role::Host, "h09", false));
        b.step(T, host_telemetry("h09", 61));
        connected(&mut b);
        b.step(T, host_telemetry("h07", 61));
        b.step(T, cdu_state());
        let out = b.step(T, online(Role::Host, "h07", false));
        assert_eq!(kinds(&out), [(Kind::DDeath, Some("h07"))]);
        // The shell could not queue that DDEATH.
        b.step(T, Input::Dropped(1));
        let out = b.step(T + 1, Input::Tick);
        let want = [
            (Kind::NBirth, None),
            (Kind::DBirth, Some("cdu-a")),
            (Kind::DDeath, Some("h07")),
        ];
        assert_eq!(kinds(&out), want, "h09 was never born: no death");
        let seqs: Vec<_> = out.iter().map(|p| body(p).seq).collect();
        assert_eq!(seqs, [Some(0), Some(1), Some(2)]);
        let online_now = metric(&body(&out[0]), "bridge/devices_online");
        assert_eq!(online_now, Some(MetricValue::Int(1)));
        // Back and born again: the births that follow say it is alive.
        b.step(T + 2, online(Role::Host, "h07", true));
        b.step(T + 2, host_telemetry("h07", 62));
        let out = b.step(T + 3, Input::Command(rebirth_command()));
        let want = [
            (Kind::NBirth, None),
            (Kind::DBirth, Some("cdu-a")),
            (Kind::DBirth, Some("h07")),
        ];
        assert_eq!(kinds(&out), want);
    }

    /// A random input among the few that matter.
    fn any_input() -> impl Strategy<Value = Input> {
        let host = prop::sample::select(vec!["h01", "h02", "h03"]);
        prop_oneof![
            1 => Just(Input::Connected),
            1 => Just(Input::ConnectionLost),
            1 => Just(Input::Tick),
            1 => Just(Input::Command(rebirth_command())),
            1 => Just(Input::Dropped(1)),
            1 => any::<bool>().prop_map(Input::LoopwardenConnected),
            2 => (host.clone(), any::<bool>()).prop_map(|(h, up)| online(Role::Host, h, up)),
            12 => (host, 40u8..90).prop_map(|(h, t)| host_telemetry(h, t)),
            1 => Just(cdu_state()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever happens: births come first in a session, `seq` counts
        /// up by one (255 wraps to 0) from each NBIRTH's 0, every NBIRTH
        /// carries the will's bdSeq, and device messages only follow that
        /// device's birth.
        #[test]
        fn sessions_keep_their_order_and_numbering(inputs in prop::collection::vec(any_input(), 1..700)) {
            let mut b = bridge();
            let mut will_bd = None;
            let mut last_seq: Option<u64> = None;
            let mut born: std::collections::BTreeSet<String> = Default::default();
            let mut ever_born = born.clone();
            for (i, input) in inputs.into_iter().enumerate() {
                let now = T + i as u64 * 1000;
                if matches!(input, Input::ConnectionLost) || i == 0 {
                    let will = b.connecting(now);
                    will_bd = metric(&body(&will), "bdSeq");
                    last_seq = None;
                    born.clear();
                }
                let lost = matches!(input, Input::ConnectionLost);
                let out = b.step(now, input);
                let births = out.first().is_some_and(|p| p.kind == Kind::NBirth);
                for p in out {
                    let pl = body(&p);
                    match p.kind {
                        Kind::NBirth => {
                            prop_assert_eq!(pl.seq, Some(0));
                            prop_assert_eq!(metric(&pl, "bdSeq"), will_bd.clone());
                            born.clear();
                        }
                        Kind::NDeath => unreachable!("only a stop publishes it"),
                        _ => {
                            let last = last_seq.expect("an NBIRTH first");
                            prop_assert_eq!(pl.seq, Some((last + 1) % 256));
                        }
                    }
                    match (p.kind, p.device.clone()) {
                        (Kind::DBirth, Some(d)) => { born.insert(d.clone()); ever_born.insert(d); }
                        (Kind::DData, Some(d)) => prop_assert!(born.contains(&d), "DDATA before DBIRTH"),
                        // A round of births says again that a device once
                        // born is dead.
                        (Kind::DDeath, Some(d)) => prop_assert!(
                            born.remove(&d) || (births && ever_born.contains(&d)),
                            "DDEATH of a device never born"
                        ),
                        _ => {}
                    }
                    last_seq = pl.seq;
                }
                if lost {
                    prop_assert!(!b.in_session());
                }
            }
        }
    }
}
