//! The connection to the broker: one tokio task that owns the MQTT event
//! loop, and a cheap handle ([`Bus`]) the agent publishes through.
//!
//! What it guarantees:
//! - a last will on `online` (retained): the broker tells everyone when we
//!   vanish; on every (re)connection we announce `online` again;
//! - QoS and retention by family, from the protocol crate, never by caller;
//! - reconnects with exponential backoff and jitter;
//! - bounded queues everywhere, and a counter for every message dropped;
//! - QoS 1 publishes not yet acknowledged when the connection drops are
//!   kept (up to `offline_capacity`, oldest dropped first) and sent again
//!   after the reconnection. Telemetry is not: it is stale by then.
//!   Surviving a crash or power cut is the flash outbox's job, not this one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use loopwarden_protocol::topic::filter;
use loopwarden_protocol::{
    Family, Frame, Ident, Message, MessageKind, NodeId, Online, Qos, Role, Text, TimestampMs, Topic,
};
use rand::SeedableRng;
use rumqttc::{
    AsyncClient, ClientError, ConnectionError, Event, EventLoop, LastWill, MqttOptions, Outgoing,
    Packet, QoS, Request, SubscribeReasonCode,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::config::BusConfig;
use crate::durable::{Delivery, DurableOutbox, Pending, StoreFailure};
use crate::metrics::{Metrics, MetricsSnapshot};
use loopwarden_flash::outbox::Class;

/// The most QoS 1 publishes in flight at once. Packet ids wrap at this
/// number; the shell never hands over more than it leaves room for, so a
/// replay after an outage cannot reuse the id of an unacknowledged publish.
const MAX_INFLIGHT: u16 = 1024;
/// Room kept for publishes the shell does not count (presence, mirrors).
const INFLIGHT_MARGIN: usize = 32;

/// A frame received from the bus, with the topic it came on.
#[derive(Debug, Clone, PartialEq)]
pub struct Inbound {
    /// Where it came from.
    pub topic: Topic,
    /// What came.
    pub frame: Frame,
}

/// Why a publish was not queued.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The frame could not be encoded.
    #[error("cannot encode {kind:?} frame: {source}")]
    Encode {
        /// The message kind.
        kind: MessageKind,
        /// Why.
        source: loopwarden_protocol::EncodeError,
    },
    /// A command goes to another node's `cmd` topic: use [`Bus::send_command`].
    #[error("{0:?} is a command: send it to a node with send_command")]
    IsCommand(MessageKind),
    /// Only commands go to another node's `cmd` topic.
    #[error("{0:?} is not a command: publish it on our own topic")]
    NotACommand(MessageKind),
    /// Only hosts and CDUs own a topic subtree to publish in.
    #[error("a {0:?} node owns no topics; it can only send commands")]
    NoOwnTopics(Role),
    /// The topic could not be built.
    #[error("topic: {0}")]
    Topic(loopwarden_protocol::TopicError),
    /// Telemetry while the broker is unreachable: dropped, it would be stale.
    #[error("broker unreachable: telemetry dropped")]
    Offline,
    /// The outgoing queue is full: dropped.
    #[error("outgoing queue full: dropped")]
    QueueFull,
    /// The bus task has stopped.
    #[error("bus stopped")]
    Stopped,
    /// The outbox is full of critical frames: this one was not stored and
    /// not sent. Keep the decision in the log and retry.
    #[error("outbox full of critical frames: frame {0} not stored")]
    OutboxFull(u32),
    /// The outbox's flash failed.
    #[error("outbox: {0}")]
    Outbox(String),
    /// Shutdown ended with publishes the broker had not acknowledged (not
    /// connected, or the timeout passed); with an outbox they are still in
    /// flash and go out after the next start.
    #[error("{count} publishes not acknowledged by the broker at shutdown")]
    Unacknowledged {
        /// How many were handed over and not acknowledged.
        count: usize,
    },
}

struct Shared {
    config: BusConfig,
    started: TimestampMs,
    seq: AtomicU32,
    metrics: Metrics,
    connected: AtomicBool,
    delivery: Mutex<Delivery>,
    /// Nothing handed over is waiting for the broker (kept by the task).
    settled: AtomicBool,
    /// `shutdown` was called: do not reconnect.
    shutting_down: AtomicBool,
}

/// A handle to the bus. Cheap to clone; every clone publishes through the
/// same connection and sequence counter.
#[derive(Clone)]
pub struct Bus {
    client: AsyncClient,
    shared: Arc<Shared>,
    connected: watch::Receiver<bool>,
}

/// The running bus task; await [`BusTask::join`] after [`Bus::shutdown`].
pub struct BusTask(JoinHandle<()>);

impl BusTask {
    /// Waits for the task to end (after a shutdown), at most `timeout`.
    pub async fn join(self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.0).await;
    }
}

/// The system's real-time clock in milliseconds since the Unix epoch (for
/// shells; cores get their time passed in).
pub fn now_ms() -> TimestampMs {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    TimestampMs(ms)
}

fn qos(family: Family) -> QoS {
    match family.qos() {
        Qos::AtMostOnce => QoS::AtMostOnce,
        Qos::AtLeastOnce => QoS::AtLeastOnce,
    }
}

impl Shared {
    fn delivery(&self) -> MutexGuard<'_, Delivery> {
        // A panic while holding the lock leaves the bookkeeping as it was;
        // go on with it rather than stop delivering.
        self.delivery.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a frame on `topic` goes through the outbox.
    /// Frames that go through the outbox. Not the retained state families
    /// (`online`, `health`): only their latest value matters, the node
    /// publishes it again on every connection from what it keeps itself,
    /// and a decision must not wait behind a flash write to reach the
    /// broker.
    fn durable(&self, topic: &Topic) -> bool {
        !topic.json
            && topic.family.qos() == Qos::AtLeastOnce
            && !matches!(topic.family, Family::Online | Family::Health)
    }

    fn own_topic(&self, family: Family) -> Result<Topic, PublishError> {
        match self.config.node.role {
            role @ (Role::Host | Role::Cdu) => Ok(Topic::new(
                &self.config.site,
                role,
                &self.config.node.id,
                family,
            )),
            role => Err(PublishError::NoOwnTopics(role)),
        }
    }

    fn next_frame(&self, message: Message, time: TimestampMs) -> Frame {
        Frame {
            sender: self.config.node.clone(),
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            time,
            message,
        }
    }

    fn online_frame(&self, online: bool) -> Frame {
        self.next_frame(
            Message::Online(Online {
                online,
                software: Text::truncated(&self.config.software),
                started: self.started,
                clock: self.config.clock,
            }),
            now_ms(),
        )
    }

    /// The last will for the next connection: `online: false` with a fresh
    /// sequence number, so it is newer than everything sent before it.
    fn last_will(&self) -> Option<LastWill> {
        let topic = self.own_topic(Family::Online).ok()?.build().ok()?;
        let payload = self.online_frame(false).to_vec().ok()?;
        Some(LastWill::new(
            topic.as_str(),
            payload,
            QoS::AtLeastOnce,
            true,
        ))
    }

    /// Presence as a frame and as its JSON mirror, both retained, QoS 1.
    fn presence(&self, online: bool) -> Vec<rumqttc::Publish> {
        let (Ok(topic), frame) = (self.own_topic(Family::Online), self.online_frame(online)) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (t, payload) in [
            (topic.build(), frame.to_vec().ok()),
            (topic.mirror().build(), Some(frame.to_json().into_bytes())),
        ] {
            if let (Ok(t), Some(payload)) = (t, payload) {
                let mut p = rumqttc::Publish::new(t.as_str(), QoS::AtLeastOnce, payload);
                p.retain = true;
                out.push(p);
            }
        }
        out
    }
}

impl Bus {
    /// Starts the bus task. Returns at once; the task connects in the
    /// background and keeps reconnecting. Received frames arrive on the
    /// returned channel.
    pub fn start(config: BusConfig) -> (Bus, mpsc::Receiver<Inbound>, BusTask) {
        Self::start_inner(config, None)
    }

    /// As [`Bus::start`], with every QoS 1 frame of this node stored in
    /// `outbox` before it is sent and removed when the broker acknowledged
    /// it; what the outbox holds from before (a crash, a power cut) is sent
    /// again on the first connection, with its original sequence numbers.
    /// `config.first_seq` should come from a reservation in flash
    /// (`ConfigStore::reserve_seq`) so numbers keep rising across restarts.
    pub fn start_with_outbox(
        config: BusConfig,
        outbox: Box<dyn DurableOutbox>,
    ) -> (Bus, mpsc::Receiver<Inbound>, BusTask) {
        Self::start_inner(config, Some(outbox))
    }

    fn start_inner(
        config: BusConfig,
        outbox: Option<Box<dyn DurableOutbox>>,
    ) -> (Bus, mpsc::Receiver<Inbound>, BusTask) {
        let shared = Arc::new(Shared {
            seq: AtomicU32::new(config.first_seq),
            started: now_ms(),
            config,
            metrics: Metrics::default(),
            connected: AtomicBool::new(false),
            delivery: Mutex::new(Delivery {
                outbox: outbox.map(|o| std::sync::Arc::new(std::sync::Mutex::new(o))),
                deferred: true, // what the outbox holds goes out on connecting
                ..Default::default()
            }),
            settled: AtomicBool::new(true),
            shutting_down: AtomicBool::new(false),
        });
        let cfg = &shared.config;
        let mut options = MqttOptions::new(&cfg.client_id, &cfg.broker.host, cfg.broker.port);
        options.set_keep_alive(cfg.keep_alive.max(Duration::from_secs(1)));
        options.set_clean_session(true);
        options.set_max_packet_size(64 * 1024, 64 * 1024);
        if let Some((user, password)) = &cfg.credentials {
            options.set_credentials(user, password);
        }
        options.set_inflight(MAX_INFLIGHT);
        let (client, eventloop) = AsyncClient::new(options, cfg.queue_capacity.max(1));
        let (inbound_tx, inbound_rx) = mpsc::channel(cfg.inbound_capacity.max(1));
        let (connected_tx, connected_rx) = watch::channel(false);
        let bus = Bus {
            client: client.clone(),
            shared: shared.clone(),
            connected: connected_rx,
        };
        let task = tokio::spawn(run(shared, eventloop, inbound_tx, connected_tx));
        (bus, inbound_rx, BusTask(task))
    }

    /// Who we are on the bus.
    pub fn node(&self) -> &NodeId {
        &self.shared.config.node
    }

    /// The site.
    pub fn site(&self) -> &Ident {
        &self.shared.config.site
    }

    /// The sequence number the next frame will carry.
    pub fn next_seq(&self) -> u32 {
        self.shared.seq.load(Ordering::Relaxed)
    }

    /// The counters.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }

    /// Connected to the broker now, with every subscription in place.
    pub fn is_connected(&self) -> bool {
        self.shared.connected.load(Ordering::Relaxed)
    }

    /// Waits until connected with every subscription in place, at most
    /// `timeout`. True if connected.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let mut rx = self.connected.clone();
        tokio::time::timeout(timeout, rx.wait_for(|c| *c))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }

    /// Publishes `message` on our own topic of its family, with the next
    /// sequence number. Returns the frame as sent.
    pub fn publish(&self, message: Message, time: TimestampMs) -> Result<Frame, PublishError> {
        let kind = message.kind();
        if kind.family() == Family::Cmd {
            return Err(PublishError::IsCommand(kind));
        }
        let topic = self.shared.own_topic(kind.family())?;
        let frame = self.shared.next_frame(message, time);
        self.publish_frame(&topic, &frame)?;
        Ok(frame)
    }

    /// Sends a command to a host or CDU's `cmd` topic. Returns the frame as
    /// sent; its sequence number is the correlation its ack will carry.
    pub fn send_command(
        &self,
        role: Role,
        to: &Ident,
        message: Message,
        time: TimestampMs,
    ) -> Result<Frame, PublishError> {
        if message.kind().family() != Family::Cmd {
            return Err(PublishError::NotACommand(message.kind()));
        }
        let topic = Topic::new(&self.shared.config.site, role, to, Family::Cmd);
        let frame = self.shared.next_frame(message, time);
        self.publish_frame(&topic, &frame)?;
        Ok(frame)
    }

    /// Publishes an already numbered frame on `topic` (the outbox resends
    /// frames with their original sequence numbers this way).
    pub fn publish_frame(&self, topic: &Topic, frame: &Frame) -> Result<(), PublishError> {
        let kind = frame.message.kind();
        let payload = frame
            .to_vec()
            .map_err(|source| PublishError::Encode { kind, source })?;
        if !self.shared.durable(topic) {
            return self.enqueue(topic, payload, None);
        }
        let mut delivery = self.shared.delivery();
        if let Some(outbox) = delivery.outbox.clone() {
            let mut outbox = outbox
                .lock()
                .map_err(|_| PublishError::Outbox("the outbox lock is poisoned".into()))?;
            let name = topic.build().map_err(PublishError::Topic)?;
            let dropped = match outbox.store(frame.seq, Class::of(&frame.message), &name, &payload)
            {
                Ok(d) => d,
                Err(StoreFailure::Full) => {
                    Metrics::add(&self.shared.metrics.outbox_refused);
                    return Err(PublishError::OutboxFull(frame.seq));
                }
                Err(StoreFailure::Flash(e)) => return Err(PublishError::Outbox(e)),
            };
            if dropped.count > 0 {
                self.shared
                    .metrics
                    .dropped_outbox
                    .fetch_add(dropped.count as u64, Ordering::Relaxed);
                warn!(dropped = dropped.count, first_seq = ?dropped.first_seq, class = ?dropped.worst,
                      "outbox full: oldest frames of the class dropped");
            }
            if !self.is_connected() || delivery.deferred {
                // Stored: it goes out when the connection is back, after
                // the older frames still waiting, in sequence order.
                delivery.deferred = true;
                Metrics::add(&self.shared.metrics.deferred);
                return Ok(());
            }
            return self.hand_over(&mut delivery, topic, payload, Some(frame.seq));
        }
        self.hand_over(&mut delivery, topic, payload, None)
    }

    /// Publishes the JSON mirror of `frame` on the mirror of our own topic.
    /// Commands have no mirror: they are addressed to another node.
    pub fn publish_json(&self, frame: &Frame) -> Result<(), PublishError> {
        let kind = frame.message.kind();
        if kind.family() == Family::Cmd {
            return Err(PublishError::IsCommand(kind));
        }
        let topic = self.shared.own_topic(kind.family())?.mirror();
        self.enqueue(&topic, frame.to_json().into_bytes(), None)
    }

    fn enqueue(
        &self,
        topic: &Topic,
        payload: Vec<u8>,
        seq: Option<u32>,
    ) -> Result<(), PublishError> {
        if topic.family.qos() == Qos::AtMostOnce {
            if !self.is_connected() {
                Metrics::add(&self.shared.metrics.dropped_offline);
                return Err(PublishError::Offline);
            }
            return self.try_publish(topic, payload).inspect_err(|e| {
                if matches!(e, PublishError::QueueFull) {
                    Metrics::add(&self.shared.metrics.dropped_queue_full);
                }
            });
        }
        let mut delivery = self.shared.delivery();
        self.hand_over(&mut delivery, topic, payload, seq)
    }

    /// Hands a QoS 1 publish to the client, noting its place in `order`
    /// under the same lock. An outbox frame the queue cannot take stays
    /// deferred in the outbox.
    fn hand_over(
        &self,
        delivery: &mut Delivery,
        topic: &Topic,
        payload: Vec<u8>,
        seq: Option<u32>,
    ) -> Result<(), PublishError> {
        match self.try_publish(topic, payload) {
            Ok(()) => {
                delivery.order.push_back(seq);
                Ok(())
            }
            Err(PublishError::QueueFull) if seq.is_some() => {
                delivery.deferred = true;
                Metrics::add(&self.shared.metrics.deferred);
                Ok(())
            }
            Err(PublishError::QueueFull) => {
                Metrics::add(&self.shared.metrics.dropped_queue_full);
                Err(PublishError::QueueFull)
            }
            Err(e) => Err(e),
        }
    }

    fn try_publish(&self, topic: &Topic, payload: Vec<u8>) -> Result<(), PublishError> {
        let m = &self.shared.metrics;
        let name = topic.build().map_err(PublishError::Topic)?;
        let family = topic.family;
        match self
            .client
            .try_publish(name.as_str(), qos(family), family.retained(), payload)
        {
            Ok(()) => {
                Metrics::add(&m.published);
                if family.qos() == Qos::AtLeastOnce {
                    Metrics::add(&m.published_qos1);
                }
                Ok(())
            }
            Err(ClientError::TryRequest(_)) | Err(ClientError::Request(_)) => {
                if self.connected.has_changed().is_err() {
                    return Err(PublishError::Stopped);
                }
                Err(PublishError::QueueFull)
            }
        }
    }

    /// Leaves cleanly: waits (at most `timeout`) until the broker has
    /// acknowledged every QoS 1 publish handed over, announces
    /// `online: false` (retained, frame and JSON), disconnects, and stops
    /// reconnecting; the broker then drops the last will. Fails with
    /// [`PublishError::Unacknowledged`] when not everything was
    /// acknowledged (not connected, or the timeout passed). Await
    /// [`BusTask::join`] afterwards.
    pub async fn shutdown(&self, timeout: Duration) -> Result<(), PublishError> {
        self.shared.shutting_down.store(true, Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + timeout;
        while self.is_connected()
            && !self.shared.settled.load(Ordering::Relaxed)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let unacknowledged = {
            let d = self.shared.delivery();
            d.order.len() + d.inflight.len()
        };
        let connected = self.is_connected();
        if connected {
            for p in self.shared.presence(false) {
                let mut delivery = self.shared.delivery();
                if self
                    .client
                    .try_publish(p.topic.clone(), p.qos, p.retain, p.payload.to_vec())
                    .is_ok()
                {
                    delivery.order.push_back(None);
                    Metrics::add(&self.shared.metrics.published);
                    Metrics::add(&self.shared.metrics.published_qos1);
                }
            }
        }
        // Never waits: with the queue full the task is told by the flag.
        let _ = self.client.try_disconnect();
        if !connected || unacknowledged > 0 {
            return Err(PublishError::Unacknowledged {
                count: unacknowledged,
            });
        }
        Ok(())
    }
}

/// Hands over outbox frames still deferred, once connected and once at
/// least half the in-flight window is free (so the outbox is read in
/// batches, not once per acknowledgement).
fn top_up(eventloop: &mut EventLoop, shared: &Shared) {
    if !shared.connected.load(Ordering::Relaxed) {
        return;
    }
    let mut delivery = shared.delivery();
    let busy = delivery.inflight.len() + delivery.order.len();
    if delivery.deferred && busy < MAX_INFLIGHT as usize / 2 {
        hand_over_unsent(eventloop, &mut delivery, Vec::new(), Vec::new(), shared);
    }
}

/// Numbers the next connection's announcement, then its last will, and
/// registers the will for the next connection attempt.
fn prepare_presence(shared: &Shared, eventloop: &mut EventLoop) -> Vec<rumqttc::Publish> {
    let announcement = shared.presence(true);
    if let Some(will) = shared.last_will() {
        eventloop.mqtt_options.set_last_will(will);
    }
    announcement
}

/// After a lost connection: keeps the QoS 1 publishes the event loop had
/// not got acknowledged that are not in the outbox (the outbox resends its
/// own), drops the rest (counted), bounds the lot, and forgets the packet
/// ids of the old session. Runs under the delivery lock.
fn salvage(
    eventloop: &mut EventLoop,
    kept: &mut VecDeque<Request>,
    shared: &Shared,
    delivery: &mut Delivery,
) {
    let m = &shared.metrics;
    let has_outbox = delivery.outbox.is_some();
    // Every QoS 1 publish back in `pending` whose send event the shell has
    // not seen (drained from the client's queue, or handled just before the
    // connection broke) still has its place at the front of `order`, in the
    // same order. Send events of the broken connection still buffered in the
    // client are stale: drop them so they cannot be matched after the
    // reconnection.
    let unseen = eventloop
        .pending
        .iter()
        .filter(|r| {
            matches!(r, Request::Publish(p)
                if p.qos != QoS::AtMostOnce && (p.pkid == 0 || !delivery.inflight.contains_key(&p.pkid)))
        })
        .count();
    delivery.order.drain(..unseen.min(delivery.order.len()));
    delivery.inflight.clear();
    eventloop.state.events.clear();
    for request in eventloop.pending.drain(..) {
        match request {
            Request::Publish(mut p) if p.qos != QoS::AtMostOnce => {
                let topic = Topic::parse(&p.topic).ok();
                let in_outbox = has_outbox && topic.as_ref().is_some_and(|t| shared.durable(t));
                let presence = topic.as_ref().is_some_and(|t| t.family == Family::Online);
                if in_outbox || presence {
                    continue; // resent from the outbox / announced again
                }
                // The next session is a clean one: the old packet id means
                // nothing there and could collide with a new one.
                p.pkid = 0;
                kept.push_back(Request::Publish(p));
            }
            Request::Publish(_) => Metrics::add(&m.dropped_offline),
            // Subscriptions are renewed on the next connection; acks and
            // pings belong to the old session.
            _ => {}
        }
    }
    if has_outbox {
        delivery.deferred = true;
    }
    // The client gives unacknowledged publishes back by packet id, not in
    // the order they were sent: restore the frames' order.
    let mut sorted: Vec<Request> = kept.drain(..).collect();
    sorted.sort_by_key(|r| match r {
        Request::Publish(p) => seq_of(&p.payload),
        _ => None,
    });
    kept.extend(sorted);
    while kept.len() > shared.config.offline_capacity {
        kept.pop_front();
        Metrics::add(&m.dropped_offline_overflow);
    }
}

/// The sequence number of a frame or of its JSON mirror.
fn seq_of(payload: &[u8]) -> Option<u32> {
    Frame::decode(payload)
        .ok()
        .or_else(|| Frame::from_json(std::str::from_utf8(payload).ok()?).ok())
        .map(|f| f.seq)
}

/// Hands the outbox frames not yet handed over to the event loop, ahead of
/// the client's queue, between `before` (kept frames) and `after`
/// (presence).
fn hand_over_unsent(
    eventloop: &mut EventLoop,
    delivery: &mut Delivery,
    before: Vec<rumqttc::Publish>,
    after: Vec<rumqttc::Publish>,
    shared: &Shared,
) {
    let m = &shared.metrics;
    // Room for the outbox frames: never more in flight than packet ids.
    let busy = delivery.inflight.len() + delivery.order.len() + before.len() + after.len();
    let room = (MAX_INFLIGHT as usize).saturating_sub(busy + INFLIGHT_MARGIN);
    let unsent: Vec<Pending> = if delivery.deferred {
        match delivery.unsent() {
            Ok(mut u) => {
                if u.len() > room {
                    u.truncate(room); // the rest on later acknowledgements
                } else {
                    delivery.deferred = false;
                }
                u
            }
            Err(e) => {
                warn!(error = %e, "cannot read the outbox; will retry");
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };
    if let (Some(first), Some(last)) = (unsent.first(), unsent.last()) {
        debug!(
            count = unsent.len(),
            first = first.seq,
            last = last.seq,
            "handing over outbox frames"
        );
    }
    // Requests already in `pending` come first; then these; then the queue.
    let at = eventloop
        .pending
        .iter()
        .filter(|r| matches!(r, Request::Publish(p) if p.qos != QoS::AtMostOnce))
        .count();
    let mut entries = Vec::new();
    let mut requests = Vec::new();
    for p in before {
        entries.push(None);
        requests.push(Request::Publish(p));
    }
    for u in unsent {
        let mut p = rumqttc::Publish::new(u.topic, QoS::AtLeastOnce, u.payload);
        p.retain = Topic::parse(&p.topic).is_ok_and(|t| t.family.retained());
        entries.push(Some(u.seq));
        requests.push(Request::Publish(p));
        Metrics::add(&m.resent);
    }
    for p in after {
        entries.push(None);
        requests.push(Request::Publish(p));
    }
    for (k, (entry, request)) in entries.into_iter().zip(requests).enumerate() {
        delivery
            .order
            .insert((at + k).min(delivery.order.len()), entry);
        eventloop.pending.push_back(request);
        Metrics::add(&m.published);
        Metrics::add(&m.published_qos1);
    }
}

async fn run(
    shared: Arc<Shared>,
    mut eventloop: EventLoop,
    inbound: mpsc::Sender<Inbound>,
    connected: watch::Sender<bool>,
) {
    let cfg = &shared.config;
    let m = &shared.metrics;
    let mut backoff = cfg.backoff.clone();
    let mut rng = rand::rngs::StdRng::from_entropy();
    let mut kept: VecDeque<Request> = VecDeque::new();
    let mut errors_in_a_row = 0u32;
    let mut awaiting_suback = false;
    let mut connected_at: Option<tokio::time::Instant> = None;
    let mut subscriptions: Vec<String> = cfg.subscriptions.clone();
    if let Ok(cmd) = shared
        .own_topic(Family::Cmd)
        .and_then(|t| t.build().map_err(PublishError::Topic))
    {
        subscriptions.push(cmd.to_string());
    }
    // The announcement of the next connection, numbered before its will so
    // the will is the newer of the two.
    let mut announcement = prepare_presence(&shared, &mut eventloop);
    loop {
        let event = eventloop.poll().await;
        let settled = eventloop.state.inflight() == 0 && {
            let d = shared.delivery();
            d.order.is_empty() && !d.deferred
        };
        shared.settled.store(settled, Ordering::Relaxed);
        match event {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                info!(broker = %cfg.broker, session = ack.session_present, "connected to the broker");
                connected_at = Some(tokio::time::Instant::now());
                errors_in_a_row = 0;
                Metrics::add(&m.connects);
                // Subscriptions first, straight to the event loop (the
                // client's queue may be full after an outage); ready once
                // the broker answered them, so a command sent to us after
                // that reaches us.
                awaiting_suback = !subscriptions.is_empty();
                if awaiting_suback {
                    let filters = subscriptions
                        .iter()
                        .map(|f| rumqttc::SubscribeFilter::new(f.clone(), QoS::AtLeastOnce));
                    eventloop
                        .pending
                        .push_front(Request::Subscribe(rumqttc::Subscribe::new_many(filters)));
                } else {
                    shared.connected.store(true, Ordering::Relaxed);
                    let _ = connected.send(true);
                }
                // What was kept from the last connection, what the outbox
                // holds, then presence, ahead of anything new.
                let mut delivery = shared.delivery();
                let before: Vec<rumqttc::Publish> = kept
                    .drain(..)
                    .filter_map(|r| match r {
                        Request::Publish(p) => Some(p),
                        _ => None,
                    })
                    .collect();
                if shared.shutting_down.load(Ordering::Relaxed) {
                    // Shut down while disconnected: goodbye, not hello.
                    for p in shared.presence(false) {
                        eventloop.pending.push_back(Request::Publish(p));
                        delivery.order.push_back(None);
                    }
                    eventloop
                        .pending
                        .push_back(Request::Disconnect(rumqttc::Disconnect));
                    continue;
                }
                let presence = std::mem::take(&mut announcement);
                hand_over_unsent(&mut eventloop, &mut delivery, before, presence, &shared);
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                let topic = match Topic::parse(&p.topic) {
                    Ok(t) => t,
                    Err(e) => {
                        Metrics::add(&m.rejected_topic);
                        debug!(topic = %p.topic, error = %e, "message on a foreign topic");
                        continue;
                    }
                };
                if topic.json {
                    continue;
                }
                match Frame::decode(&p.payload) {
                    Ok(frame) => {
                        Metrics::add(&m.received);
                        if inbound.try_send(Inbound { topic, frame }).is_err() {
                            Metrics::add(&m.dropped_inbound_full);
                        }
                    }
                    Err(e) => {
                        m.rejected(&e);
                        warn!(topic = %p.topic, bytes = p.payload.len(), error = %e, "frame refused");
                    }
                }
            }
            Ok(Event::Incoming(Packet::PubAck(ack))) => {
                Metrics::add(&m.acked);
                let mut delivery = shared.delivery();
                if let Some(seq) = delivery.inflight.remove(&ack.pkid) {
                    // The outbox lock is taken before the delivery lock is
                    // let go (so nothing resends the frame meanwhile); the
                    // flash write happens without the delivery lock.
                    let outbox = delivery.outbox.clone();
                    let mut guard = outbox.as_ref().map(|o| o.lock());
                    drop(delivery);
                    let result = guard.as_mut().map(|g| match g {
                        Ok(o) => o.ack(seq),
                        Err(_) => Err("the outbox lock is poisoned".to_string()),
                    });
                    match result {
                        Some(Ok(true)) => Metrics::add(&m.outbox_acked),
                        Some(Ok(false)) => {} // dropped to make room meanwhile
                        Some(Err(e)) => {
                            warn!(seq, error = %e, "cannot remove an acknowledged frame from the outbox")
                        }
                        None => {}
                    }
                } else {
                    drop(delivery);
                }
                top_up(&mut eventloop, &shared);
            }
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) if pkid != 0 => {
                let mut delivery = shared.delivery();
                match delivery.order.pop_front() {
                    Some(Some(seq)) => {
                        delivery.inflight.insert(pkid, seq);
                    }
                    Some(None) => {}
                    None => {
                        Metrics::add(&m.delivery_mismatch);
                        debug!(pkid, "a publish was sent that the shell did not hand over");
                    }
                }
            }
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                if ack
                    .return_codes
                    .iter()
                    .any(|c| matches!(c, SubscribeReasonCode::Failure))
                {
                    warn!(pkid = ack.pkid, "the broker refused a subscription");
                }
                if awaiting_suback {
                    awaiting_suback = false;
                    shared.connected.store(true, Ordering::Relaxed);
                    let _ = connected.send(true);
                }
                // Frames stored while the subscription was pending.
                top_up(&mut eventloop, &shared);
            }
            // At least once per keep-alive: nothing deferred waits longer.
            Ok(Event::Incoming(Packet::PingResp)) => top_up(&mut eventloop, &shared),
            Ok(Event::Outgoing(Outgoing::Disconnect)) => {
                info!("disconnected from the broker on request");
                shared.connected.store(false, Ordering::Relaxed);
                let _ = connected.send(false);
                // Let the broker read everything up to the DISCONNECT and
                // close the connection itself: closing first could reset the
                // socket with data unread, and the broker would publish the
                // last will.
                let linger = tokio::time::Instant::now() + Duration::from_millis(500);
                while let Ok(Ok(_)) = tokio::time::timeout_at(linger, eventloop.poll()).await {}
                return;
            }
            Ok(_) => {}
            Err(ConnectionError::RequestsDone) => return,
            Err(e) => {
                Metrics::add(&m.connection_errors);
                shared.connected.store(false, Ordering::Relaxed);
                let _ = connected.send(false);
                {
                    let mut delivery = shared.delivery();
                    salvage(&mut eventloop, &mut kept, &shared, &mut delivery);
                }
                if shared.shutting_down.load(Ordering::Relaxed) {
                    info!("connection lost during shutdown: not reconnecting");
                    return;
                }
                announcement = prepare_presence(&shared, &mut eventloop);
                // A connection that did not last (a broker that accepts, then
                // drops us) does not reset the backoff.
                if connected_at
                    .take()
                    .is_some_and(|t| t.elapsed() > Duration::from_secs(10))
                {
                    backoff.reset();
                }
                let wait = backoff.next_wait(&mut rng);
                errors_in_a_row += 1;
                // Say it loudly once, then only now and then: an outage of an
                // hour must not fill the journal.
                if errors_in_a_row == 1 || errors_in_a_row % 20 == 0 {
                    warn!(broker = %cfg.broker, error = %e, retry_in_ms = wait.as_millis() as u64,
                          attempts = errors_in_a_row, kept = kept.len(), "broker unreachable");
                }
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Subscription filter for every frame of a site.
pub fn site_filter(site: &Ident) -> String {
    filter::site_frames(site)
        .map(|s| s.to_string())
        .unwrap_or_else(|_| format!("dc/v1/{site}/+/+/+"))
}
