//! The handle: the cloneable [`Bus`] the agent publishes and subscribes
//! through, and the [`BusTask`] to join at shutdown. Publishing hands
//! frames to `rumqttc`'s client queue (or to the outbox); the event loop
//! ([`super::event_loop`]) does the rest.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loopwarden_flash::outbox::Class;
use loopwarden_protocol::{Family, Frame, Ident, Message, NodeId, Qos, Role, TimestampMs, Topic};
use rumqttc::{AsyncClient, ClientError, QoS};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::warn;

use super::event_loop::run;
use super::presence::{Control, Task as PresenceTask, Want};
use super::state::Shared;
use super::{now_ms, Inbound, PublishError};
use crate::config::{BrokerAddr, BusConfig};
use crate::durable::{Delivery, DurableOutbox, SharedOutbox, StoreFailure};
use crate::metrics::{Metrics, MetricsSnapshot};

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

fn qos(family: Family) -> QoS {
    qos_of(family.qos())
}

/// The MQTT client's QoS for the protocol's.
pub(super) fn qos_of(q: Qos) -> QoS {
    match q {
        Qos::AtMostOnce => QoS::AtMostOnce,
        Qos::AtLeastOnce => QoS::AtLeastOnce,
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
        let owns_online = matches!(config.node.role, Role::Host | Role::Cdu);
        let (control, want) = match config.json_presence && owns_online {
            true => {
                let (c, w) = Control::new();
                (Some(c), Some(w))
            }
            false => (None, None),
        };
        let mut shared = Shared {
            seq: AtomicU32::new(config.first_seq),
            started: now_ms(),
            config,
            metrics: Metrics::default(),
            connected: AtomicBool::new(false),
            broker: AtomicUsize::new(0),
            delivery: Mutex::new(Delivery {
                outbox: outbox.map(|o| std::sync::Arc::new(std::sync::Mutex::new(o))),
                deferred: true, // what the outbox holds goes out on connecting
                ..Default::default()
            }),
            settled: AtomicBool::new(true),
            shutting_down: AtomicBool::new(false),
            retained: Mutex::new(Default::default()),
            retained_unsent: Mutex::new(Default::default()),
            durable_order: Mutex::new(()),
            presence: None,
        };
        shared.presence = control;
        let shared = Arc::new(shared);
        let presence = want.map(|w| PresenceTask::start(shared.clone(), w));
        let options = shared.mqtt_options(0);
        let cfg = &shared.config;
        let (client, eventloop) = AsyncClient::new(options, cfg.queue_capacity.max(1));
        let (inbound_tx, inbound_rx) = mpsc::channel(cfg.inbound_capacity.max(1));
        let (connected_tx, connected_rx) = watch::channel(false);
        let bus = Bus {
            client: client.clone(),
            shared: shared.clone(),
            connected: connected_rx,
        };
        let task = tokio::spawn(run(shared, eventloop, inbound_tx, connected_tx, presence));
        (bus, inbound_rx, BusTask(task))
    }

    /// Who we are on the bus.
    pub fn node(&self) -> &NodeId {
        &self.shared.config.node
    }

    /// The broker in use: the one connected to, or, while there is no
    /// connection, the one tried next (one of `config.broker`).
    pub fn broker(&self) -> &BrokerAddr {
        self.shared.broker()
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

    /// From now on, keeps the sequence number of every outbox frame
    /// (event, lease) the broker acknowledges, for [`Bus::acked_ledger`].
    /// For measurements: it grows by one `u32` per such frame.
    pub fn keep_acked_ledger(&self) {
        self.shared.delivery().ledger.get_or_insert_with(Vec::new);
    }

    /// The outbox frames the broker acknowledged since
    /// [`Bus::keep_acked_ledger`], by sequence number, in the order of
    /// their acknowledgements (empty when it was never called).
    pub fn acked_ledger(&self) -> Vec<u32> {
        self.shared.delivery().ledger.clone().unwrap_or_default()
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

    /// Numbers a frame with the next sequence number of this node's one
    /// counter, for the caller to complete (sign a command) and publish
    /// with [`publish_frame`](Self::publish_frame).
    pub fn next_frame(&self, message: Message, time: TimestampMs) -> Frame {
        self.shared.next_frame(message, time)
    }

    /// Publishes `message` as [`publish`](Self::publish) does and, when
    /// `mirror`, its JSON mirror too. A mirror the bus does not take is
    /// logged, not returned: the frame itself went out.
    pub fn publish_mirrored(
        &self,
        message: Message,
        time: TimestampMs,
        mirror: bool,
    ) -> Result<Frame, PublishError> {
        let frame = self.publish(message, time)?;
        if mirror {
            if let Err(e) = self.publish_json(&frame) {
                tracing::debug!("JSON mirror of {:?} not sent: {e}", frame.message.kind());
            }
        }
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
        let outbox = self.shared.delivery().outbox.clone();
        let Some(outbox) = outbox else {
            let mut delivery = self.shared.delivery();
            return self.hand_over(&mut delivery, topic, payload, None);
        };
        // Durable frames are stored and handed over one at a time, in
        // sequence order; the flash write happens without the delivery
        // lock, so a health frame never waits for it.
        let _in_order = self
            .shared
            .durable_order
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.store(&outbox, topic, frame, &payload)?;
        let mut delivery = self.shared.delivery();
        if !self.is_connected() || delivery.deferred {
            // Stored: it goes out when the connection is back, after
            // the older frames still waiting, in sequence order.
            delivery.deferred = true;
            Metrics::add(&self.shared.metrics.deferred);
            return Ok(());
        }
        let seq = frame.seq;
        let handed = delivery.order.contains(&Some(seq))
            || delivery.inflight.values().any(|s| *s == seq)
            || delivery.acking.contains(&seq);
        if handed {
            return Ok(()); // the task handed it over from the outbox meanwhile
        }
        self.hand_over(&mut delivery, topic, payload, Some(seq))
    }

    /// Stores a durable frame in the outbox (dropping older frames of its
    /// class when full, counted).
    fn store(
        &self,
        outbox: &SharedOutbox,
        topic: &Topic,
        frame: &Frame,
        payload: &[u8],
    ) -> Result<(), PublishError> {
        let mut outbox = outbox
            .lock()
            .map_err(|_| PublishError::Outbox("the outbox lock is poisoned".into()))?;
        let name = topic.build().map_err(PublishError::Topic)?;
        let dropped = match outbox.store(frame.seq, Class::of(&frame.message), &name, payload) {
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
        Ok(())
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
            // Retained state (health): only its latest value matters, and
            // the task hands that over itself at its next event.
            Err(PublishError::QueueFull) if retained_state(topic) => {
                let name = topic.build().map_err(PublishError::Topic)?;
                self.shared.retained_handed(name.as_str(), false);
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
        self.shared
            .remember_retained(topic, name.as_str(), &payload);
        match self
            .client
            .try_publish(name.as_str(), qos(family), family.retained(), payload)
        {
            Ok(()) => {
                if retained_state(topic) {
                    self.shared.retained_handed(name.as_str(), true);
                }
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
    /// `online: false` (retained, frame and JSON; the JSON over the
    /// presence connection with `json_presence`), disconnects, and stops
    /// reconnecting; the broker then drops the last will. Fails with
    /// [`PublishError::Unacknowledged`] when not everything was
    /// acknowledged (not connected, or the timeout passed). Await
    /// [`BusTask::join`] afterwards.
    pub async fn shutdown(&self, timeout: Duration) -> Result<(), PublishError> {
        self.shared.shutting_down.store(true, Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + timeout;
        // `settled` is what the task saw at its last event: publishes
        // handed over since then are in `order` until they are sent.
        let busy = || {
            !self.shared.settled.load(Ordering::Relaxed) || !self.shared.delivery().order.is_empty()
        };
        while self.is_connected() && busy() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let unacknowledged = {
            let d = self.shared.delivery();
            d.order.len() + d.inflight.len()
        };
        let connected = self.is_connected();
        let mut goodbye = None;
        if connected {
            let bye = self.shared.online_frame(false);
            for p in self.shared.presence(&bye) {
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
            goodbye = Some(bye);
        }
        // The presence connection says the same goodbye in the JSON tree.
        if let Some(control) = &self.shared.presence {
            control.set(Want::End(goodbye.map(Box::new)));
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

/// Whether `topic` is retained state the task announces again (`health`,
/// frame or mirror; not presence, which is rebuilt).
fn retained_state(topic: &Topic) -> bool {
    topic.family.retained() && topic.family != Family::Online
}
