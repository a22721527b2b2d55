//! The handle: the cloneable [`Bus`] the agent publishes and subscribes
//! through, and the [`BusTask`] to join at shutdown. A handle numbers
//! frames, stores durable ones in the outbox, and sends the rest of the
//! work to the event loop over the channels of [`super::command`]; it
//! reads only the frame counter and the counters ([`super::status`]) and
//! what the loop tells it over `watch` (ready, the broker in use).
//!
//! Glossary:
//! - *refused*: a publish the bus did not take, returned as an error and
//!   counted: telemetry while not connected, anything but an outbox frame
//!   or the retained state when the command channel is full.

use std::sync::Arc;
use std::time::Duration;

use loopwarden_flash::outbox::Class as OutboxClass;
use loopwarden_protocol::{Family, Frame, Ident, Message, NodeId, Qos, Role, TimestampMs, Topic};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::warn;

use super::command::{Class, Control, HandleEnds, Outgoing};
use super::node::{qos_of, retained_state, Node};
use super::PublishError;
use crate::config::BrokerAddr;
use crate::durable::{DurableOutbox, SharedOutbox, StoreFailure};
use crate::metrics::{Metrics, MetricsSnapshot};

/// A handle to the bus. Cheap to clone; every clone publishes through the
/// same connection and sequence counter.
#[derive(Clone)]
pub struct Bus {
    node: Arc<Node>,
    ends: HandleEnds,
    outbox: Option<SharedOutbox>,
}

/// The running bus task; await [`BusTask::join`] after [`Bus::shutdown`].
pub struct BusTask(JoinHandle<()>);

impl BusTask {
    /// The task `handle` runs.
    pub(super) fn new(handle: JoinHandle<()>) -> Self {
        Self(handle)
    }

    /// Waits for the task to end (after a shutdown), at most `timeout`.
    pub async fn join(self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.0).await;
    }
}

/// The acknowledged outbox frames, from [`Bus::keep_acked_ledger`] on.
#[derive(Debug)]
pub struct AckedLedger(tokio::sync::mpsc::UnboundedReceiver<(u32, Family)>);

impl AckedLedger {
    /// The sequence numbers of the outbox frames the broker acknowledged
    /// since the last call, with the family of each (`event` or `ack`),
    /// in the order of their acknowledgements (also after the bus
    /// stopped).
    pub fn take(&mut self) -> Vec<(u32, Family)> {
        let mut acked = Vec::new();
        while let Ok(seq) = self.0.try_recv() {
            acked.push(seq);
        }
        acked
    }
}

impl Bus {
    /// A handle over `ends`, storing durable frames in `outbox`.
    pub(super) fn new(node: Arc<Node>, ends: HandleEnds, outbox: Option<SharedOutbox>) -> Self {
        Self { node, ends, outbox }
    }

    /// Who we are on the bus.
    pub fn node(&self) -> &NodeId {
        &self.node.config.node
    }

    /// The broker in use: the one connected to, or, while there is no
    /// connection, the one tried next (one of `config.broker`).
    pub fn broker(&self) -> &BrokerAddr {
        let index = *self.ends.broker.borrow();
        self.node.config.broker.get(index)
    }

    /// Our own topic of `family` (a host's or CDU's; other roles own none).
    pub fn own_topic(&self, family: Family) -> Result<Topic, PublishError> {
        self.node.own_topic(family)
    }

    /// The site.
    pub fn site(&self) -> &Ident {
        &self.node.config.site
    }

    /// The sequence number the next frame will carry.
    pub fn next_seq(&self) -> u32 {
        self.node.status.next_seq()
    }

    /// The counters.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.node.status.metrics.snapshot()
    }

    /// From now on (once the bus task has it), keeps the sequence number
    /// of every outbox frame (event, lease) the broker acknowledges, in
    /// the returned ledger. For measurements: it grows by one `u32` per
    /// such frame until taken.
    pub fn keep_acked_ledger(&self) -> AckedLedger {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        if self.ends.control.try_send(Control::KeepLedger(tx)).is_err() {
            warn!("the bus task did not take the ledger request: the ledger stays empty");
        }
        AckedLedger(rx)
    }

    /// Connected to the broker now, with every subscription answered. A
    /// filter the broker refused is logged by name, counted
    /// (`subscriptions_refused`) and asked for again; it does not make the
    /// node offline: what it publishes (a CDU's state, its leases) must
    /// not wait on a subscription an ACL refused.
    pub fn is_connected(&self) -> bool {
        *self.ends.ready.borrow()
    }

    /// Waits until connected with every subscription answered, at most
    /// `timeout`. True if connected.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let mut rx = self.ends.ready.clone();
        tokio::time::timeout(timeout, rx.wait_for(|c| *c))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }

    /// Publishes `message` on our own topic of its family, with the next
    /// sequence number. Returns the frame as sent.
    pub fn publish(&self, message: Message, time: TimestampMs) -> Result<Frame, PublishError> {
        self.publish_completed(message, time, |_, _| {})
    }

    /// As [`publish`](Self::publish), with `complete` finishing the frame
    /// for the topic it goes on (a CDU signs its state) before it is sent.
    fn publish_completed(
        &self,
        message: Message,
        time: TimestampMs,
        complete: impl FnOnce(&Topic, &mut Frame),
    ) -> Result<Frame, PublishError> {
        let kind = message.kind();
        if kind.family() == Family::Cmd {
            return Err(PublishError::IsCommand(kind));
        }
        let topic = self.node.own_topic(kind.family())?;
        let mut frame = self.node.next_frame(message, time);
        complete(&topic, &mut frame);
        self.publish_frame(&topic, &frame)?;
        Ok(frame)
    }

    /// Numbers a frame with the next sequence number of this node's one
    /// counter, for the caller to complete (sign a command) and publish
    /// with [`publish_frame`](Self::publish_frame).
    pub fn next_frame(&self, message: Message, time: TimestampMs) -> Frame {
        self.node.next_frame(message, time)
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
        self.publish_signed(message, time, mirror, |_, _| {})
    }

    /// As [`publish_mirrored`](Self::publish_mirrored), with `sign`
    /// completing the frame for the topic it goes on (a CDU's state is
    /// signed for its own `health` topic) before it and its mirror go.
    pub fn publish_signed(
        &self,
        message: Message,
        time: TimestampMs,
        mirror: bool,
        sign: impl FnOnce(&Topic, &mut Frame),
    ) -> Result<Frame, PublishError> {
        let frame = self.publish_completed(message, time, sign)?;
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
        let topic = Topic::new(&self.node.config.site, role, to, Family::Cmd);
        let frame = self.node.next_frame(message, time);
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
        let outbox = match &self.outbox {
            Some(outbox) if self.node.durable(topic) => outbox,
            _ => return self.enqueue(topic, payload, None),
        };
        // Stored and sent under the outbox's lock: durable frames reach
        // the loop in the order they were stored.
        let mut outbox = outbox
            .lock()
            .map_err(|_| PublishError::Outbox("the outbox lock is poisoned".into()))?;
        match self.store(&mut **outbox, topic, frame, &payload) {
            Ok(()) => {}
            Err(PublishError::Outbox(e)) => return self.unstored(topic, frame.seq, payload, e),
            Err(e) => return Err(e),
        }
        if !self.is_connected() {
            // Stored: it goes out when the connection is back, after the
            // older frames still waiting, in sequence order.
            self.ring_outbox();
            return Ok(());
        }
        self.enqueue(topic, payload, Some(frame.seq))
    }

    /// A durable frame the outbox's flash failed to store (`why`): a
    /// failing flash does not stop delivery, so while connected it is sent
    /// as it is (not resent after a restart, since it is not in flash);
    /// otherwise it is refused ([`PublishError::Outbox`]) and the caller
    /// offers it again. Counted either way.
    fn unstored(
        &self,
        topic: &Topic,
        seq: u32,
        payload: Vec<u8>,
        why: String,
    ) -> Result<(), PublishError> {
        let failed = &self.node.status.metrics.outbox_failed;
        let before = failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !self.is_connected() {
            return Err(PublishError::Outbox(why));
        }
        // The first, then one in a hundred: a flash that fails for good
        // fails every frame.
        if before % 100 == 0 {
            tracing::error!(
                seq,
                "outbox: {why}: frame sent without being stored in flash (not resent after a restart; {} such publishes so far)",
                before + 1
            );
        }
        // Not taken now (the queue full): refused, so the caller holds it.
        self.enqueue(topic, payload, None)
            .map_err(|e| PublishError::Outbox(format!("{why}; and not sent: {e}")))
    }

    /// Tells the loop the outbox holds frames no command carries.
    fn ring_outbox(&self) {
        Metrics::add(&self.node.status.metrics.deferred);
        // A full bell has rung already.
        let _ = self.ends.outbox_bell.try_send(());
    }

    /// Stores a durable frame in the outbox (dropping older frames of its
    /// class when full, counted).
    fn store(
        &self,
        outbox: &mut dyn DurableOutbox,
        topic: &Topic,
        frame: &Frame,
        payload: &[u8],
    ) -> Result<(), PublishError> {
        let metrics = &self.node.status.metrics;
        let name = topic.build().map_err(PublishError::Topic)?;
        let class = OutboxClass::of(&frame.message);
        let dropped = match outbox.store(frame.seq, class, &name, payload) {
            Ok(d) => d,
            Err(StoreFailure::Full) => {
                Metrics::add(&metrics.outbox_refused);
                return Err(PublishError::OutboxFull(frame.seq));
            }
            Err(StoreFailure::Flash(e)) => return Err(PublishError::Outbox(e)),
        };
        if dropped.count > 0 {
            metrics
                .dropped_outbox
                .fetch_add(dropped.count as u64, std::sync::atomic::Ordering::Relaxed);
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
        let topic = self.node.own_topic(kind.family())?.mirror();
        self.enqueue(&topic, frame.to_json().into_bytes(), None)
    }

    /// Sends a publish to the loop: `durable` is the seq of a frame
    /// stored in the outbox.
    fn enqueue(
        &self,
        topic: &Topic,
        payload: Vec<u8>,
        durable: Option<u32>,
    ) -> Result<(), PublishError> {
        let metrics = &self.node.status.metrics;
        let family = topic.family;
        if family.qos() == Qos::AtMostOnce && !self.is_connected() {
            Metrics::add(&metrics.dropped_offline);
            return Err(PublishError::Offline);
        }
        let name = topic.build().map_err(PublishError::Topic)?;
        let class = match durable {
            Some(seq) => Class::Durable(seq),
            None if retained_state(topic) => Class::Retained,
            None => Class::Plain,
        };
        let out = Outgoing {
            topic: name.to_string(),
            payload,
            qos: qos_of(family.qos()),
            retain: family.retained(),
            class,
        };
        let out = match self.ends.commands.try_send(out) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Closed(_)) => return Err(PublishError::Stopped),
            Err(TrySendError::Full(out)) => out,
        };
        match out.class {
            // In flash: the loop reads it from there.
            Class::Durable(_) => {
                self.ring_outbox();
                Ok(())
            }
            // Retained state (health): only its latest value matters, and
            // the loop hands that over itself. Never in the outbox, so not
            // counted `deferred` (outbox frames only); it counts
            // `published` once handed over.
            Class::Retained => {
                self.ends.retained.send_modify(|unsent| {
                    unsent.insert(out.topic, out.payload);
                });
                Ok(())
            }
            Class::Plain => {
                Metrics::add(&metrics.dropped_queue_full);
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
    /// acknowledged (not connected, or the timeout passed), and with
    /// [`PublishError::LeftInFlash`] when outbox frames were never handed
    /// over (they stay in flash). Await [`BusTask::join`] afterwards.
    pub async fn shutdown(&self, timeout: Duration) -> Result<(), PublishError> {
        let (answer, rx) = oneshot::channel();
        let asked = Control::Shutdown { timeout, answer };
        self.ends
            .control
            .send(asked)
            .await
            .map_err(|_| PublishError::Stopped)?;
        rx.await.map_err(|_| PublishError::Stopped)?
    }
}

/// The recorder (`loopwarden-store`) publishes events and acks through the
/// bus: a full outbox is the one refusal it holds frames for.
impl loopwarden_store::Publisher for Bus {
    fn publish_message(
        &self,
        message: Message,
        time: TimestampMs,
        mirror: bool,
    ) -> Result<u32, loopwarden_store::Refused> {
        use loopwarden_store::Refused;
        match self.publish_mirrored(message, time, mirror) {
            Ok(frame) => Ok(frame.seq),
            Err(PublishError::OutboxFull(_)) => Err(Refused::OutboxFull),
            Err(PublishError::Offline) => Err(Refused::Offline),
            Err(PublishError::Outbox(e)) => Err(Refused::Unstored(e)),
            Err(e) => Err(Refused::Failed(e.to_string())),
        }
    }

    fn next_seq(&self) -> u32 {
        Bus::next_seq(self)
    }
}

#[cfg(test)]
mod tests {
    use loopwarden_flash::outbox::Dropped;
    use loopwarden_protocol::{samples, MessageKind};

    use super::super::command::{self, LoopEnds};
    use super::*;
    use crate::config::BusConfig;
    use crate::durable::Pending;

    /// An outbox in memory that takes every frame.
    #[derive(Default)]
    struct Memory(Vec<Pending>);

    impl DurableOutbox for Memory {
        fn store(
            &mut self,
            seq: u32,
            _: OutboxClass,
            topic: &str,
            payload: &[u8],
        ) -> Result<Dropped, StoreFailure> {
            let (topic, payload) = (topic.to_string(), payload.to_vec());
            self.0.push(Pending {
                seq,
                topic,
                payload,
            });
            Ok(Dropped::default())
        }

        fn ack(&mut self, seq: u32) -> Result<bool, String> {
            let before = self.0.len();
            self.0.retain(|p| p.seq != seq);
            Ok(self.0.len() < before)
        }

        fn pending(&mut self) -> Result<Vec<Pending>, String> {
            Ok(self.0.clone())
        }
    }

    /// A connected handle of host `h1` with an outbox, whose command
    /// queue (one slot) no loop drains; the loop's ends are returned.
    fn connected_bus() -> (Bus, LoopEnds) {
        let broker: BrokerAddr = "127.0.0.1:1883".parse().expect("an address");
        let site = Ident::new("s1").expect("a site");
        let me = NodeId::new(Role::Host, "h1").expect("a node");
        let mut config = BusConfig::new(broker, site, me);
        config.queue_capacity = 1;
        let (handles, ends) = command::channels(config.queue_capacity);
        let outbox: Box<dyn DurableOutbox> = Box::new(Memory::default());
        let outbox = Some(Arc::new(std::sync::Mutex::new(outbox)));
        let bus = Bus::new(Arc::new(Node::new(config)), handles, outbox);
        ends.ready.send_replace(true);
        (bus, ends)
    }

    #[test]
    fn deferred_counts_outbox_frames_the_full_queue_refused_and_not_health() {
        let (bus, _ends) = connected_bus();
        let time = TimestampMs(1);
        let publish = |kind| bus.publish(samples::message(kind), time);
        publish(MessageKind::HostTelemetry).expect("the queue's one slot takes it");
        assert_eq!(bus.metrics().deferred, 0);
        publish(MessageKind::HostHealth).expect("health is kept for the loop");
        assert_eq!(
            bus.metrics().deferred,
            0,
            "health is never in the outbox: not an outbox frame deferred"
        );
        publish(MessageKind::Event).expect("an event stays in the outbox");
        assert_eq!(bus.metrics().deferred, 1, "the event waits in flash");
        assert_eq!(bus.metrics().dropped_queue_full, 0);
    }
}
