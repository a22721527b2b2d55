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
use std::sync::Arc;
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
use crate::metrics::{Metrics, MetricsSnapshot};

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
}

struct Shared {
    config: BusConfig,
    started: TimestampMs,
    seq: AtomicU32,
    metrics: Metrics,
    connected: AtomicBool,
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
        let shared = Arc::new(Shared {
            seq: AtomicU32::new(config.first_seq),
            started: now_ms(),
            config,
            metrics: Metrics::default(),
            connected: AtomicBool::new(false),
        });
        let cfg = &shared.config;
        let mut options = MqttOptions::new(&cfg.client_id, &cfg.broker.host, cfg.broker.port);
        options.set_keep_alive(cfg.keep_alive.max(Duration::from_secs(1)));
        options.set_clean_session(true);
        options.set_max_packet_size(64 * 1024, 64 * 1024);
        if let Some((user, password)) = &cfg.credentials {
            options.set_credentials(user, password);
        }
        if let Some(will) = shared.last_will() {
            options.set_last_will(will);
        }
        let (client, eventloop) = AsyncClient::new(options, cfg.queue_capacity.max(1));
        let (inbound_tx, inbound_rx) = mpsc::channel(cfg.inbound_capacity.max(1));
        let (connected_tx, connected_rx) = watch::channel(false);
        let bus = Bus {
            client: client.clone(),
            shared: shared.clone(),
            connected: connected_rx,
        };
        let task = tokio::spawn(run(shared, client, eventloop, inbound_tx, connected_tx));
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
        self.enqueue(topic, payload)
    }

    /// Publishes the JSON mirror of `frame` on the mirror of our own topic.
    /// Commands have no mirror: they are addressed to another node.
    pub fn publish_json(&self, frame: &Frame) -> Result<(), PublishError> {
        let kind = frame.message.kind();
        if kind.family() == Family::Cmd {
            return Err(PublishError::IsCommand(kind));
        }
        let topic = self.shared.own_topic(kind.family())?.mirror();
        self.enqueue(&topic, frame.to_json().into_bytes())
    }

    fn enqueue(&self, topic: &Topic, payload: Vec<u8>) -> Result<(), PublishError> {
        let m = &self.shared.metrics;
        if topic.family.qos() == Qos::AtMostOnce && !self.is_connected() {
            Metrics::add(&m.dropped_offline);
            return Err(PublishError::Offline);
        }
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
                Metrics::add(&m.dropped_queue_full);
                Err(PublishError::QueueFull)
            }
        }
    }

    /// Leaves cleanly: waits (at most `timeout`) until the broker has
    /// acknowledged every QoS 1 publish, announces `online: false`
    /// (retained, frame and JSON) and disconnects, so the broker does not
    /// publish the last will. Await [`BusTask::join`] afterwards.
    pub async fn shutdown(&self, timeout: Duration) -> Result<(), PublishError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let unacked = |m: MetricsSnapshot| m.published_qos1 > m.acked;
        while self.is_connected()
            && unacked(self.metrics())
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for p in self.shared.presence(false) {
            self.client
                .publish(p.topic.clone(), p.qos, p.retain, p.payload.to_vec())
                .await
                .map_err(|_| PublishError::Stopped)?;
            Metrics::add(&self.shared.metrics.published);
            Metrics::add(&self.shared.metrics.published_qos1);
        }
        self.client
            .disconnect()
            .await
            .map_err(|_| PublishError::Stopped)
    }
}

/// Keeps the QoS 1 publishes the event loop had not got acknowledged when
/// the connection dropped, drops the rest (counted), and bounds the lot.
fn salvage(eventloop: &mut EventLoop, kept: &mut VecDeque<Request>, shared: &Shared) {
    let m = &shared.metrics;
    for request in eventloop.pending.drain(..) {
        match request {
            Request::Publish(mut p) if p.qos != QoS::AtMostOnce => {
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
    while kept.len() > shared.config.offline_capacity {
        kept.pop_front();
        Metrics::add(&m.dropped_offline_overflow);
    }
}

async fn run(
    shared: Arc<Shared>,
    client: AsyncClient,
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
    let mut awaiting_subacks = 0usize;
    let mut subscriptions: Vec<String> = cfg.subscriptions.clone();
    if let Ok(cmd) = shared
        .own_topic(Family::Cmd)
        .and_then(|t| t.build().map_err(PublishError::Topic))
    {
        subscriptions.push(cmd.to_string());
    }
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                info!(broker = %cfg.broker, session = ack.session_present, "connected to the broker");
                backoff.reset();
                errors_in_a_row = 0;
                Metrics::add(&m.connects);
                // Ready once every subscription is acknowledged: a command
                // sent to us after that reaches us.
                awaiting_subacks = subscriptions.len();
                if awaiting_subacks == 0 {
                    shared.connected.store(true, Ordering::Relaxed);
                    let _ = connected.send(true);
                }
                // Presence, then what was kept from the last connection, in
                // order, ahead of anything new; kept frames carry lower
                // sequence numbers, so they go first.
                for p in shared.presence(true).into_iter().rev() {
                    eventloop.pending.push_front(Request::Publish(p));
                    Metrics::add(&m.published);
                    Metrics::add(&m.published_qos1);
                }
                for request in kept.drain(..).rev() {
                    eventloop.pending.push_front(request);
                }
                for filter in &subscriptions {
                    if let Err(e) = client.try_subscribe(filter.as_str(), QoS::AtLeastOnce) {
                        warn!(%filter, error = %e, "cannot queue subscription");
                    }
                }
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
            Ok(Event::Incoming(Packet::PubAck(_))) => Metrics::add(&m.acked),
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                if ack
                    .return_codes
                    .iter()
                    .any(|c| matches!(c, SubscribeReasonCode::Failure))
                {
                    warn!(pkid = ack.pkid, "the broker refused a subscription");
                }
                if awaiting_subacks > 0 {
                    awaiting_subacks -= 1;
                    if awaiting_subacks == 0 {
                        shared.connected.store(true, Ordering::Relaxed);
                        let _ = connected.send(true);
                    }
                }
            }
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
                salvage(&mut eventloop, &mut kept, &shared);
                if let Some(will) = shared.last_will() {
                    eventloop.mqtt_options.set_last_will(will);
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
