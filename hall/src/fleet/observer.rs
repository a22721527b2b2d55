//! The fleet's independent subscriber: its own MQTT connection, on its own
//! thread and runtime, subscribed at QoS 1 to the whole site tree
//! (`dc/v2/<site>/#`: frames, JSON mirrors, presence, commands). It
//! counts what arrives, follows every sender's sequence numbers, and
//! notes when it first heard each GPU quarantined.
//!
//! It speaks MQTT through `rumqttc` directly rather than the agents' bus
//! client, so what it counts is what the broker delivered, not what a
//! client of the project chose to pass on.
//!
//! It repairs as any reader may (`docs/bus.md` §4.8): every two seconds it
//! asks each sender with holes to resend them (signed as facility
//! `fleet-observer` with the twin's demonstration key), and counts a
//! resent event that fills a hole as repaired, apart from what the broker
//! delivered itself.
//!
//! Glossary:
//! - *hole*: a sequence number of a sender, between the lowest and the
//!   highest it was heard with, that has not arrived (yet).
//! - *QoS 1 message*: one on a topic of a QoS 1 family (health, event,
//!   cmd, ack, online), frame or JSON mirror.
//! - *repaired*: a frame the broker did not deliver that came as the
//!   sender resent it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loopwarden_bus::resend::{self, Asker};
use loopwarden_bus::BrokerAddr;
use loopwarden_protocol::message::{HealthState, HostHealth};
use loopwarden_protocol::topic::Qos;
use loopwarden_protocol::{Family, Frame, Message, NodeId, Topic};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};

/// One sender's frames as heard: its sequence numbers (the protocol's
/// rules, [`loopwarden_protocol::seq`]) and which QoS 1 frames came.
#[derive(Debug, Clone, Default)]
pub struct SeqTrack {
    seq: loopwarden_protocol::seq::SeqTrack,
    /// The QoS 1 frames heard (health, events, acks, commands).
    qos1: HashSet<u32>,
    /// The frames that came only as resent.
    repaired: HashSet<u32>,
}

impl SeqTrack {
    /// Notes `frame`; false when its number was heard before.
    fn hear(&mut self, frame: &Frame) -> bool {
        self.seq.hear(frame)
    }

    /// Notes a frame the sender resent; true when it filled a hole.
    fn repair(&mut self, frame: &Frame) -> bool {
        if !self.seq.is_hole(frame.seq) {
            return false;
        }
        self.seq.hear(frame);
        self.repaired.insert(frame.seq);
        true
    }

    /// Whether frame `seq` came only as resent.
    pub fn repaired(&self, seq: u32) -> bool {
        self.repaired.contains(&seq)
    }

    /// The highest sequence number heard.
    pub fn highest(&self) -> Option<u32> {
        self.seq.highest()
    }

    /// Whether the QoS 1 frame `seq` was heard.
    pub fn heard_qos1(&self, seq: u32) -> bool {
        self.qos1.contains(&seq)
    }

    /// Numbers missing between the lowest and highest heard that no will
    /// of a heard announcement explains (rule 1 of the protocol's).
    pub fn unexplained(&self) -> u64 {
        self.seq.unexplained()
    }

    /// Frames heard more than once.
    pub fn duplicates(&self) -> u64 {
        self.seq.duplicates()
    }
}

/// What the observer heard.
#[derive(Debug, Default)]
pub struct Heard {
    /// Subscribed (the broker acknowledged the subscription).
    pub subscribed: bool,
    /// Messages received on the site tree, duplicates included.
    pub received: u64,
    /// Distinct QoS 1 messages (frames by sender and sequence number,
    /// mirrors as received).
    pub received_qos1: u64,
    /// Messages on the site tree whose topic or frame did not decode (not
    /// in `received`).
    pub undecodable: u64,
    /// Each sender's frames (`host/c1r0h0`, `cdu/cdu1`).
    pub senders: HashMap<String, SeqTrack>,
    /// When each (host, GPU) was first heard quarantined.
    pub quarantined: HashMap<(String, u8), Instant>,
    /// When the last message came (resend requests, the observer's own
    /// among them, are not counted).
    pub last_at: Option<Instant>,
    /// Connection errors seen.
    pub connection_errors: u64,
    /// Messages by family (`telemetry`, `json/telemetry`, …).
    pub by_family: std::collections::BTreeMap<String, u64>,
    /// Event frames by kind of event (`Xid`, `CapApplied`, …).
    pub events: std::collections::BTreeMap<String, u64>,
    /// Resend requests sent.
    pub resend_requests: u64,
    /// Resend requests the client's channel had no room for (asked again
    /// at their retry).
    pub resend_requests_unsent: u64,
    /// Frames received on `resent` topics (repairs and repeats).
    pub resent_received: u64,
    /// When to ask whom for what.
    asker: Asker,
}

impl Heard {
    fn message(&mut self, topic: &str, payload: &[u8], now: Instant) {
        let Ok(t) = Topic::parse(topic) else {
            self.last_at = Some(now);
            self.undecodable += 1;
            return;
        };
        if t.family == Family::Resend {
            // The observer's own requests (asked again every 10 s), or
            // another reader's: no message of the run, so not `last_at`,
            // which would keep the wait for the last messages going.
            return;
        }
        self.last_at = Some(now);
        let qos1 = t.family.qos() == Qos::AtLeastOnce;
        let family = format!("{}{:?}", if t.json { "json/" } else { "" }, t.family);
        if t.json {
            self.counted(family, qos1);
            return;
        }
        // A frame that does not decode is counted apart, never as received.
        let Ok(f) = Frame::decode(payload) else {
            self.undecodable += 1;
            return;
        };
        self.received += 1;
        *self.by_family.entry(family.to_lowercase()).or_default() += 1;
        if t.family == Family::Resent {
            self.resent(f);
            return;
        }
        let track = self.senders.entry(f.sender.to_string()).or_default();
        let fresh = track.hear(&f);
        if qos1 {
            track.qos1.insert(f.seq);
        }
        if !fresh {
            return;
        }
        self.received_qos1 += u64::from(qos1);
        match &f.message {
            Message::HostHealth(h) => self.health(f.sender.id.as_str(), h, now),
            Message::Event(e) => {
                let name = format!("{e:?}");
                let kind = name.split([' ', '(', '{']).next().unwrap_or("?");
                *self.events.entry(kind.to_string()).or_default() += 1;
            }
            _ => {}
        }
    }

    /// A JSON mirror received on `family`'s topic.
    fn counted(&mut self, family: String, qos1: bool) {
        self.received += 1;
        *self.by_family.entry(family.to_lowercase()).or_default() += 1;
        self.received_qos1 += u64::from(qos1);
    }

    /// A frame on a `resent` topic: the report of a request, numbered as
    /// any frame of its sender, or an old frame resent.
    fn resent(&mut self, f: Frame) {
        let track = self.senders.entry(f.sender.to_string()).or_default();
        if let Message::ResendReport(r) = &f.message {
            if track.hear(&f) {
                self.received_qos1 += 1;
            }
            if let Some(code) = self.asker.answered(&observer_id(), &f.sender, r) {
                tracing::error!("observer: {} refuses to resend: {code}", f.sender);
            }
            return;
        }
        self.resent_received += 1;
        self.asker.resent(&f.sender, f.seq);
        track.repair(&f);
    }

    /// The requests due now: sender and range.
    fn due(&mut self, now: loopwarden_protocol::TimestampMs) -> Vec<(NodeId, u32, u32)> {
        let mut due = Vec::new();
        for (name, track) in &self.senders {
            let Some(node) = name.split_once('/').and_then(|(r, id)| {
                let role = match r {
                    "host" => loopwarden_protocol::Role::Host,
                    "cdu" => loopwarden_protocol::Role::Cdu,
                    _ => return None,
                };
                NodeId::new(role, id).ok()
            }) else {
                continue;
            };
            if let Some((from, to)) = self.asker.due(now, &node, &track.seq) {
                due.push((node, from, to));
            }
        }
        due
    }

    /// Requests still waiting for their report.
    pub fn repairs_waiting(&self) -> usize {
        self.asker.waiting()
    }

    fn health(&mut self, host: &str, h: &HostHealth, now: Instant) {
        for g in &h.gpus {
            if g.state == HealthState::Quarantined {
                self.quarantined
                    .entry((host.to_string(), g.gpu.get()))
                    .or_insert(now);
            }
        }
    }
}

/// The running observer.
pub struct Observer {
    heard: Arc<Mutex<Heard>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Observer {
    /// Connects to `broker` on a thread of its own and subscribes to
    /// `site`'s tree; returns once subscribed (or an error after 15 s).
    pub fn start(broker: &BrokerAddr, site: &str) -> Result<Self, String> {
        let heard = Arc::new(Mutex::new(Heard::default()));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let mut opts = MqttOptions::new(
            format!("fleet-observer-{}", std::process::id()),
            broker.host.clone(),
            broker.port,
        );
        opts.set_keep_alive(Duration::from_secs(30));
        opts.set_clean_session(true);
        opts.set_max_packet_size(64 * 1024, 64 * 1024);
        let filter = format!("dc/v2/{site}/#");
        let site = loopwarden_protocol::Ident::new(site).map_err(|e| format!("site: {e}"))?;
        let h = heard.clone();
        let thread = std::thread::Builder::new()
            .name("observer".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the observer's runtime");
                rt.block_on(listen(opts, filter, site, h, stopped));
            })
            .map_err(|e| format!("observer thread: {e}"))?;
        let o = Self {
            heard,
            stop: Some(stop),
            thread: Some(thread),
        };
        let until = Instant::now() + Duration::from_secs(15);
        while !o.heard.lock().expect("heard").subscribed {
            if Instant::now() > until {
                return Err(format!("the observer could not subscribe at {broker}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(o)
    }

    /// Reads what it heard.
    pub fn with<R>(&self, f: impl FnOnce(&Heard) -> R) -> R {
        f(&self.heard.lock().expect("heard"))
    }

    /// Waits until `enough` holds, or nothing came for `quiet`, or
    /// `limit` passed.
    pub fn settle(&self, enough: impl Fn(&Heard) -> bool, quiet: Duration, limit: Duration) {
        let until = Instant::now() + limit;
        loop {
            let (done, last) = self.with(|h| (enough(h), h.last_at));
            let idle = last.is_none_or(|t| t.elapsed() > quiet);
            if done || idle || Instant::now() > until {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Disconnects and returns what it heard.
    pub fn stop(mut self) -> Heard {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.heard.lock().expect("heard"))
    }
}

/// The observer's loop: (re)subscribes on every connection and hears
/// every message until told to stop.
async fn listen(
    opts: MqttOptions,
    filter: String,
    site: loopwarden_protocol::Ident,
    heard: Arc<Mutex<Heard>>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    // Only `events.poll()` below takes requests from the client's
    // channel: a request that waited for room in it would wait for good,
    // so every request is tried and one the channel has no room for goes
    // again later.
    let (client, mut events) = AsyncClient::new(opts, 1024);
    let mut repair = tokio::time::interval(REPAIR_EVERY);
    let mut asked = 0u32;
    let mut subscribe = false;
    loop {
        if subscribe {
            subscribe = client
                .try_subscribe(filter.clone(), QoS::AtLeastOnce)
                .is_err();
        }
        let ev = tokio::select! {
            ev = events.poll() => ev,
            _ = repair.tick() => {
                ask(&client, &site, &heard, &mut asked);
                continue;
            }
            _ = &mut stopped => break,
        };
        match ev {
            Ok(Event::Incoming(Packet::ConnAck(_))) => subscribe = true,
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                let refused = ack
                    .return_codes
                    .iter()
                    .any(|c| matches!(c, rumqttc::SubscribeReasonCode::Failure));
                if refused {
                    // Counted as subscribed no more: the run stops at its
                    // start rather than measure nothing.
                    tracing::error!("observer: the broker refused the subscription to {filter}");
                } else {
                    heard.lock().expect("heard").subscribed = true;
                }
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                let now = Instant::now();
                heard
                    .lock()
                    .expect("heard")
                    .message(&p.topic, &p.payload, now);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("observer: {e}");
                heard.lock().expect("heard").connection_errors += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let _ = client.try_disconnect();
}

/// How often the observer asks senders for the holes it sees.
const REPAIR_EVERY: Duration = Duration::from_secs(2);

/// The node the observer asks as: facility `fleet-observer`.
fn observer_id() -> NodeId {
    NodeId::new(loopwarden_protocol::Role::Facility, "fleet-observer").expect("an id")
}

/// Sends the resend requests due now, signed as facility `fleet-observer`
/// with the demonstration key (the twin agents' keyring takes it). With
/// the client's channel full the rest wait for their retry
/// ([`resend::RETRY_MS`]) and are counted.
fn ask(
    client: &AsyncClient,
    site: &loopwarden_protocol::Ident,
    heard: &Mutex<Heard>,
    asked: &mut u32,
) {
    let now = loopwarden_bus::now_ms();
    let due = heard.lock().expect("heard").due(now);
    let me = observer_id();
    let key = loopwarden_protocol::samples::demo_signing_key();
    for (node, from, to) in due {
        *asked += 1;
        let topic = Topic::new(site, node.role, &node.id, Family::Resend);
        let mut frame = Frame {
            sender: me.clone(),
            seq: *asked,
            time: now,
            message: resend::request_message(from, to),
        };
        if frame.sign(&topic, 1, &key).is_err() {
            continue;
        }
        let (Ok(name), Ok(bytes)) = (topic.build(), frame.to_vec()) else {
            continue;
        };
        let sent = client.try_publish(name.to_string(), QoS::AtLeastOnce, false, bytes);
        let mut h = heard.lock().expect("heard");
        if sent.is_err() {
            h.resend_requests_unsent += 1;
            continue;
        }
        h.resend_requests += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::{samples, MessageKind};

    #[test]
    fn resend_requests_never_wait_for_room_in_the_clients_channel() {
        // Five senders with a hole each; a channel of two that nothing
        // empties, as while the observer's own loop is busy asking.
        let mut heard = Heard::default();
        for h in 1..=5 {
            let mut track = SeqTrack::default();
            for seq in [1, 3] {
                let mut f = samples::frame(MessageKind::HostTelemetry);
                f.seq = seq;
                track.hear(&f);
            }
            heard.senders.insert(format!("host/h{h}"), track);
        }
        let heard = Mutex::new(heard);
        let (client, _events) = AsyncClient::new(MqttOptions::new("o", "127.0.0.1", 1), 2);
        let site = loopwarden_protocol::Ident::new("lab").unwrap();
        let mut asked = 0;
        // The first round hears past the holes; the second asks.
        ask(&client, &site, &heard, &mut asked);
        assert_eq!(asked, 0);
        ask(&client, &site, &heard, &mut asked);
        let h = heard.lock().unwrap();
        assert_eq!(
            (asked, h.resend_requests, h.resend_requests_unsent),
            (5, 2, 3)
        );
    }

    #[test]
    fn a_frame_that_does_not_decode_is_counted_apart_not_as_received() {
        let mut heard = Heard::default();
        let now = Instant::now();
        let topic = "dc/v2/lab/host/h1/telemetry";
        let f = samples::frame(MessageKind::HostTelemetry);
        heard.message(topic, &f.to_vec().unwrap(), now);
        heard.message(topic, b"\x00 not a frame", now);
        heard.message("dc/v2/lab/no/such/topic/at/all", b"x", now);
        assert_eq!((heard.received, heard.undecodable), (1, 2));
        assert_eq!(heard.by_family.values().sum::<u64>(), 1);
    }

    #[test]
    fn a_resend_request_heard_back_is_no_sign_of_traffic() {
        // The observer hears its own requests (it subscribes to the whole
        // tree): they must not keep the wait for the last messages going.
        let mut heard = Heard::default();
        let site = loopwarden_protocol::Ident::new("lab").unwrap();
        let node = loopwarden_protocol::Ident::new("h1").unwrap();
        let topic = Topic::new(
            &site,
            loopwarden_protocol::Role::Host,
            &node,
            Family::Resend,
        );
        let name = topic.build().unwrap();
        heard.message(&name, b"a request", Instant::now());
        assert_eq!(heard.last_at, None);
        assert_eq!((heard.received, heard.undecodable), (0, 0));
    }

    #[test]
    fn holes_fill_as_late_frames_come_and_repeats_are_duplicates() {
        let mut t = SeqTrack::default();
        let at = |seq| {
            let mut f = samples::frame(MessageKind::HostTelemetry);
            f.seq = seq;
            f
        };
        assert!(t.hear(&at(10)));
        assert!(t.hear(&at(13)));
        assert_eq!(t.unexplained(), 2);
        assert!(t.hear(&at(11)));
        assert!(!t.hear(&at(11)));
        assert_eq!((t.unexplained(), t.duplicates()), (1, 1));
        assert!(t.hear(&at(8)));
        assert_eq!(t.unexplained(), 2, "12 and 9");
    }
}
