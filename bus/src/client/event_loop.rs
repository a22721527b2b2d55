//! The event loop: the one task that drives `rumqttc`'s `EventLoop` and
//! owns the delivery state ([`Session`]). It connects and reconnects
//! (backoff with jitter; the next broker of the list after each failure),
//! subscribes, announces presence, takes the handles' commands and puts
//! into the client what the session answers, reads the outbox when the
//! session asks for it, matches sends and acknowledgements, and passes
//! inbound frames on (refused ones counted, and logged as
//! [`LogLimit`] allows).
//!
//! The `EventLoop`'s `poll` is never cancelled: while it waits, the task
//! serves the handles' channels beside it and hands publishes to the
//! client's request queue (the *conduit*, a few requests deep); between
//! two events it puts what must go ahead of that queue (subscriptions,
//! kept and outbox frames, presence) in the `EventLoop`'s pending list.
//!
//! Glossary:
//! - *ready*: connected with every subscription answered; what the
//!   handles see as connected.
//! - *link*: the connection the broker accepted (ready or not yet).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use loopwarden_protocol::topic::filter;
use loopwarden_protocol::{Family, Frame, Topic};
use rumqttc::{AsyncClient, ConnectionError, Event, EventLoop, Outgoing, Packet, QoS, Request};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::acker::Acker;
use super::command::{Control, LoopEnds};
use super::log_limit::LogLimit;
use super::node::{qos_of, Node, PresencePair};
use super::presence::{self, Want};
use super::session::{Queued, Session};
use super::subscribing::Subscribing;
use super::{Inbound, PublishError};
use crate::backoff::{Backoff, ReconnectRng};
use crate::durable::{Pending, SharedOutbox};
use crate::metrics::Metrics;

/// Requests the client's queue holds at most: the command channel is the
/// queue the handles see, this only carries its front to the `EventLoop`.
const CONDUIT: usize = 16;

/// The bus task: drives the event loop until a shutdown or until the
/// handles are all gone.
pub(super) async fn run(
    node: Arc<Node>,
    ends: LoopEnds,
    inbound: mpsc::Sender<Inbound>,
    outbox: Option<SharedOutbox>,
) {
    let owns_online = node.own_topic(Family::Online).is_ok();
    let (control, presence) = if node.config.json_presence && owns_online {
        let (control, want) = presence::Control::new();
        (
            Some(control),
            Some(presence::Task::start(node.clone(), want)),
        )
    } else {
        (None, None)
    };
    let (client, mut eventloop) = AsyncClient::new(node.mqtt_options(0), CONDUIT);
    let core = Core::new(node, client, ends, inbound, outbox, control, &mut eventloop);
    let mut driver = Driver { eventloop, core };
    driver.drive().await;
    driver.core.stopped();
    // The presence connection ends with us: with the goodbye a shutdown
    // asked for, else without one, so its will speaks.
    driver.core.want_presence(Want::End(None));
    if let Some(task) = presence {
        task.join(Duration::from_secs(3)).await;
    }
}

/// The `EventLoop`, and everything else (borrowed apart while `poll`
/// runs).
struct Driver {
    eventloop: EventLoop,
    core: Core,
}

/// A shutdown waiting for the broker's acknowledgements.
struct Leaving {
    deadline: Instant,
    answer: oneshot::Sender<Result<(), PublishError>>,
}

/// What the task keeps from one event to the next, but the `EventLoop`.
struct Core {
    node: Arc<Node>,
    session: Session,
    /// The client's request queue (the conduit).
    client: AsyncClient,
    ends: LoopEnds,
    inbound: mpsc::Sender<Inbound>,
    outbox: Option<SharedOutbox>,
    /// Removes acknowledged frames from the outbox, off this task.
    acker: Option<Acker>,
    removed_tx: mpsc::UnboundedSender<u32>,
    removed: mpsc::UnboundedReceiver<u32>,
    ledger: Option<mpsc::UnboundedSender<(u32, Family)>>,
    presence: Option<presence::Control>,
    backoff: Backoff,
    rng: ReconnectRng,
    errors_in_a_row: u32,
    /// Ready only once the broker answered the subscriptions.
    awaiting_suback: bool,
    ready: bool,
    /// The index of the broker in use in `config.broker`.
    broker: usize,
    connected_at: Option<Instant>,
    subscriptions: Vec<String>,
    /// What the broker was asked to subscribe and refused.
    subscribing: Subscribing,
    /// Which refused inbound frames are logged.
    refusal_log: LogLimit,
    /// The presence of the next connection: its announcement, numbered
    /// before its will so the will is the newer of the two.
    pair: PresencePair,
    /// `shutdown` was asked: do not reconnect.
    shutting_down: bool,
    leaving: Option<Leaving>,
    /// Some handle is left.
    handles: bool,
}

/// Whether the task goes on after an event.
enum Flow {
    Go,
    Stop,
}

/// Numbers the next connection's announcement, then its last will, and
/// registers the will for the next connection attempt.
fn prepare_presence(node: &Node, eventloop: &mut EventLoop) -> PresencePair {
    let pair = node.presence_pair();
    if let Some(will) = node.will_of(&pair.will, false) {
        eventloop.mqtt_options.set_last_will(will);
    }
    pair
}

/// Whether a connection attempt that failed with `e` surely left no will
/// at the broker: it failed before its CONNECT went out (the broker's
/// name did not resolve, or its TCP connection or TLS handshake failed),
/// or the broker refused the CONNECT. Only errors that come before a TCP
/// connection exists count: a timeout, a reset or a closed connection
/// may come after the CONNECT reached the broker, whose will it may then
/// still publish.
fn no_will_registered(e: &ConnectionError) -> bool {
    match e {
        ConnectionError::Io(io) => before_tcp(io),
        ConnectionError::Tls(_) | ConnectionError::ConnectionRefused(_) => true,
        _ => false,
    }
}

/// Whether `io` is an error of opening a TCP connection that no
/// connection follows: refused, no route to the host or its network, no
/// local address for it, or its name not resolved (the resolver's errors
/// carry no kind of their own: told by the standard library's words; if
/// those ever change, the attempt counts as one that may have left a
/// will, the safe side).
fn before_tcp(io: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    let unresolved = || {
        io.raw_os_error().is_none()
            && io
                .to_string()
                .starts_with("failed to lookup address information")
    };
    match io.kind() {
        K::ConnectionRefused | K::HostUnreachable | K::NetworkUnreachable | K::AddrNotAvailable => {
            true
        }
        // A name that resolves to no address (rumqttc's words).
        K::InvalidInput => io.to_string() == "could not resolve to any address",
        _ => unresolved(),
    }
}

/// A shutdown's answer: `Ok` only when it was connected and nothing waits
/// for the broker (`unacknowledged`) nor in flash (`in_flash`: outbox
/// frames never handed over).
fn leaving_answer(
    connected: bool,
    unacknowledged: usize,
    in_flash: bool,
) -> Result<(), PublishError> {
    let count = unacknowledged;
    match (connected, in_flash) {
        (false, _) => Err(PublishError::Unacknowledged { count }),
        (true, true) => Err(PublishError::LeftInFlash { unacknowledged }),
        (true, false) if count > 0 => Err(PublishError::Unacknowledged { count }),
        (true, false) => Ok(()),
    }
}

/// QoS 1 publishes in the `EventLoop`'s pending list (they go before the
/// conduit's).
fn pending_qos1(eventloop: &EventLoop) -> usize {
    eventloop
        .pending
        .iter()
        .filter(|r| matches!(r, Request::Publish(p) if p.qos != QoS::AtMostOnce))
        .count()
}

fn push_all(eventloop: &mut EventLoop, publishes: Vec<rumqttc::Publish>) {
    eventloop
        .pending
        .extend(publishes.into_iter().map(Request::Publish));
}

impl Driver {
    async fn drive(&mut self) {
        loop {
            let Some(event) = next_event(&mut self.eventloop, &mut self.core).await else {
                return; // every handle is gone
            };
            let flow = self.core.on_event(&mut self.eventloop, event).await;
            if let Flow::Stop = flow {
                return;
            }
        }
    }
}

/// Serves the handles while `poll` waits for the next event; `None` once
/// every handle is gone (and no shutdown is under way).
async fn next_event(
    eventloop: &mut EventLoop,
    core: &mut Core,
) -> Option<Result<Event, ConnectionError>> {
    let poll = eventloop.poll();
    tokio::pin!(poll);
    loop {
        core.place_queued();
        core.check_leaving();
        if !core.handles && !core.shutting_down {
            return None;
        }
        let takes = core.handles && core.session.takes_commands();
        let deadline = core.leaving.as_ref().map(|l| l.deadline);
        let far = Instant::now() + Duration::from_secs(3600);
        let resubscribe = core.subscribing.retry_at();
        tokio::select! {
            biased;
            e = &mut poll => return Some(e),
            Some(c) = core.ends.control.recv() => core.on_control(c),
            Some(seq) = core.removed.recv() => core.session.removed(seq),
            Some(()) = core.ends.outbox_bell.recv() => core.session.outbox_stored(),
            Ok(()) = core.ends.retained.changed() => {
                let unsent = core.ends.retained.borrow_and_update().clone();
                core.session.offer_retained(&unsent);
            }
            c = core.ends.commands.recv(), if takes => match c {
                Some(out) => core.session.accept(out),
                None => core.handles = false,
            },
            () = tokio::time::sleep_until(deadline.unwrap_or(far)), if deadline.is_some() => {
                core.finish_leaving();
            }
            () = tokio::time::sleep_until(resubscribe.unwrap_or(far)), if resubscribe.is_some() => {
                core.resubscribe();
            }
        }
    }
}

impl Core {
    fn new(
        node: Arc<Node>,
        client: AsyncClient,
        ends: LoopEnds,
        inbound: mpsc::Sender<Inbound>,
        outbox: Option<SharedOutbox>,
        presence: Option<presence::Control>,
        eventloop: &mut EventLoop,
    ) -> Self {
        let cfg = &node.config;
        let mut subscriptions: Vec<String> = cfg.subscriptions.clone();
        // A host's or CDU's own commands, and readers' requests to resend.
        for family in [Family::Cmd, Family::Resend] {
            if let Ok(own) = node
                .own_topic(family)
                .and_then(|t| t.build().map_err(PublishError::Topic))
            {
                subscriptions.push(own.to_string());
            }
        }
        let session = Session::new(node.status.clone(), cfg.offline_capacity, outbox.is_some());
        let (removed_tx, removed) = mpsc::unbounded_channel();
        let pair = prepare_presence(&node, eventloop);
        Core {
            backoff: cfg.backoff.clone(),
            session,
            client,
            ends,
            inbound,
            outbox,
            acker: None,
            removed_tx,
            removed,
            ledger: None,
            presence,
            rng: ReconnectRng::new(),
            errors_in_a_row: 0,
            awaiting_suback: false,
            ready: false,
            broker: 0,
            connected_at: None,
            subscriptions,
            subscribing: Subscribing::default(),
            refusal_log: LogLimit::default(),
            pair,
            shutting_down: false,
            leaving: None,
            handles: true,
            node,
        }
    }

    /// Puts what waits into the client's queue, while it has room.
    fn place_queued(&mut self) {
        while let Some(q) = self.session.next_queued() {
            let taken = match q {
                Queued::Publish(h) => {
                    let p = &h.publish;
                    if !rumqttc::valid_topic(&p.topic) {
                        warn!(topic = %p.topic, "not a topic to publish on: dropped");
                        self.session.drop_queued();
                        continue;
                    }
                    let payload = p.payload.to_vec();
                    self.client
                        .try_publish(p.topic.clone(), p.qos, p.retain, payload)
                }
                Queued::Disconnect => self.client.try_disconnect(),
            };
            if taken.is_err() {
                return; // full: again after the next event
            }
            self.session.queued();
        }
    }

    fn on_control(&mut self, control: Control) {
        match control {
            Control::KeepLedger(tx) => self.ledger = Some(tx),
            Control::Shutdown { timeout, answer } => {
                self.shutting_down = true;
                if let Some(earlier) = self.leaving.take() {
                    let _ = earlier.answer.send(Err(PublishError::Stopped));
                }
                self.leaving = Some(Leaving {
                    deadline: Instant::now() + timeout,
                    answer,
                });
                self.check_leaving();
            }
        }
    }

    /// Ends a shutdown once nothing waits for the broker (nor in the
    /// command channel), the connection is not ready, or the time is up (see [`Core::finish_leaving`]).
    fn check_leaving(&mut self) {
        // What the handles sent before asking to leave is still in the
        // command channel (the control channel is read first): it goes
        // out before the goodbye, or it would be lost uncounted.
        let settled = self.session.settled() && self.ends.commands.is_empty();
        if self.leaving.is_some() && (!self.ready || settled) {
            self.finish_leaving();
        }
    }

    /// The task ends: what the session still kept to send is lost, counted
    /// and said.
    fn stopped(&mut self) {
        let lost = self.session.stopped();
        if lost > 0 {
            warn!(
                count = lost,
                "the bus stopped with QoS 1 publishes never acknowledged and not in the outbox: dropped (dropped_at_stop)"
            );
        }
    }

    /// Says goodbye (`online: false`, frame and JSON; the JSON over the
    /// presence connection with `json_presence`) when connected, queues
    /// the disconnection, and answers the shutdown.
    fn finish_leaving(&mut self) {
        let Some(leaving) = self.leaving.take() else {
            return;
        };
        let unacknowledged = self.session.unacknowledged();
        let connected = self.session.link_up();
        let mut goodbye = None;
        if connected {
            // Ready or still waiting for the SUBACK: the announcement is
            // queued already, and the DISCONNECT drops the will, so the
            // goodbye goes behind the one and ahead of the other.
            let bye = self.node.online_frame(false);
            self.session.leave(self.node.presence(&bye));
            goodbye = Some(bye);
        } else {
            // Not connected: the next connection says goodbye and leaves
            // (`on_connack`).
            self.session.leave(Vec::new());
        }
        self.want_presence(Want::End(goodbye.map(Box::new)));
        self.place_queued();
        // Ready, the outbox was read after the subscription: frames still
        // deferred were not read back, or found no room. Before it, the
        // outbox is not read yet: frames are known left there only if
        // this process stored some.
        let in_flash = self.session.deferred() && (self.ready || self.session.stored());
        let _ = leaving
            .answer
            .send(leaving_answer(connected, unacknowledged, in_flash));
    }

    async fn on_event(
        &mut self,
        eventloop: &mut EventLoop,
        event: Result<Event, ConnectionError>,
    ) -> Flow {
        match event {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => self.on_connack(eventloop, ack),
            Ok(Event::Incoming(Packet::Publish(p))) => self.on_publish(p),
            Ok(Event::Incoming(Packet::PubAck(ack))) => {
                self.on_puback(ack.pkid);
                self.top_up(eventloop);
            }
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) if pkid != 0 => self.session.sent(pkid),
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                self.on_suback(ack);
                // Frames stored while the subscription was pending.
                self.top_up(eventloop);
            }
            // At least once per keep-alive: nothing deferred waits longer.
            Ok(Event::Incoming(Packet::PingResp)) => self.top_up(eventloop),
            Ok(Event::Outgoing(Outgoing::Disconnect)) => {
                return self.on_disconnect(eventloop).await
            }
            Ok(_) => {}
            Err(ConnectionError::RequestsDone) => return Flow::Stop,
            Err(e) => return self.on_error(eventloop, e).await,
        }
        Flow::Go
    }

    /// Reads the outbox (a flash read); `None` when it cannot be read.
    fn read_outbox(&self) -> Option<Vec<Pending>> {
        let outbox = self.outbox.as_ref()?;
        let read = match outbox.lock() {
            Ok(mut o) => o.pending(),
            Err(_) => Err("the outbox lock is poisoned".to_string()),
        };
        read.inspect_err(|e| warn!(error = %e, "cannot read the outbox; will retry"))
            .ok()
    }

    /// Hands over outbox frames still deferred, once ready and once at
    /// least half the in-flight window is free.
    fn top_up(&mut self, eventloop: &mut EventLoop) {
        if !self.ready || !self.session.wants_outbox(true) {
            return;
        }
        let outbox = self.read_outbox();
        let at = pending_qos1(eventloop);
        let first = self
            .session
            .hand_over_first(at, Vec::new(), outbox, Vec::new());
        if !first.is_empty() {
            debug!(count = first.len(), "handing over outbox frames");
        }
        push_all(eventloop, first);
    }

    /// Says the connection is ready (or not) to the handles, and to the
    /// presence connection.
    fn set_ready(&mut self, ready: bool) {
        self.ready = ready;
        self.ends.ready.send_replace(ready);
        let metrics = &self.node.status.metrics;
        self.want_presence(if ready {
            Want::Up {
                generation: metrics.connects.load(std::sync::atomic::Ordering::Relaxed),
                broker: self.broker,
                pair: Box::new(self.pair.clone()),
            }
        } else {
            Want::Down
        });
    }

    /// Asks the presence connection for `want` (when there is one).
    fn want_presence(&self, want: Want) {
        if let Some(control) = &self.presence {
            control.set(want);
        }
    }

    fn on_connack(&mut self, eventloop: &mut EventLoop, ack: rumqttc::ConnAck) {
        let node = self.node.clone();
        let broker = node.config.broker.get(self.broker);
        info!(broker = %broker, session = ack.session_present, "connected to the broker");
        self.connected_at = Some(Instant::now());
        self.errors_in_a_row = 0;
        Metrics::add(&node.status.metrics.connects);
        // Subscriptions first, straight to the event loop; ready once the
        // broker answered them, so a command sent to us after that
        // reaches us.
        self.awaiting_suback = !self.subscriptions.is_empty();
        self.subscribing.connected(self.subscriptions.clone());
        if self.awaiting_suback {
            let filters = self
                .subscriptions
                .iter()
                .map(|f| rumqttc::SubscribeFilter::new(f.clone(), qos_of(filter::qos(f))));
            eventloop
                .pending
                .push_front(Request::Subscribe(rumqttc::Subscribe::new_many(filters)));
        } else {
            self.set_ready(true);
        }
        if self.shutting_down {
            // Shut down while disconnected: goodbye, not hello.
            let bye = node.presence(&node.online_frame(false));
            let first = self.session.connected_to_leave(bye);
            push_all(eventloop, first);
            eventloop
                .pending
                .push_back(Request::Disconnect(rumqttc::Disconnect));
            return;
        }
        // What was kept from the last connection, what the outbox holds,
        // then presence (and the retained state), ahead of anything new.
        let presence = node.presence(&self.pair.announce);
        let outbox = match self.session.wants_outbox(false) {
            true => self.read_outbox(),
            false => None,
        };
        let first = self.session.connected(presence, outbox);
        push_all(eventloop, first);
    }

    fn on_publish(&mut self, p: rumqttc::Publish) {
        let m = &self.node.status.metrics;
        let topic = match Topic::parse(&p.topic) {
            Ok(t) => t,
            Err(e) => {
                Metrics::add(&m.rejected_topic);
                debug!(topic = %p.topic, error = %e, "message on a foreign topic");
                return;
            }
        };
        if topic.json {
            return;
        }
        match Frame::decode(&p.payload) {
            Ok(frame) => {
                Metrics::add(&m.received);
                if self.inbound.try_send(Inbound { topic, frame }).is_err() {
                    Metrics::add(&m.dropped_inbound_full);
                }
            }
            Err(e) => {
                let reason = m.rejected(&e);
                let now = Instant::now();
                if let Some(unlogged) = self.refusal_log.hit(now, &p.topic, reason) {
                    warn!(topic = %p.topic, bytes = p.payload.len(), error = %e, reason, unlogged,
                          "frame refused (each counted; logged the first of its topic and reason, then at most once a minute with those unlogged since)");
                }
            }
        }
    }

    fn on_puback(&mut self, pkid: u16) {
        Metrics::add(&self.node.status.metrics.acked);
        let Some((seq, family)) = self.session.acked(pkid) else {
            return;
        };
        if let (Some(ledger), Some(family)) = (&self.ledger, family) {
            let _ = ledger.send((seq, family));
        }
        if let Some(outbox) = &self.outbox {
            let acker = self.acker.get_or_insert_with(|| {
                Acker::start(outbox.clone(), self.node.clone(), self.removed_tx.clone())
            });
            acker.ack(seq);
        }
    }

    fn on_suback(&mut self, ack: rumqttc::SubAck) {
        let refused = self.subscribing.answered(Instant::now(), &ack.return_codes);
        if !refused.is_empty() {
            let metrics = &self.node.status.metrics;
            metrics
                .subscriptions_refused
                .fetch_add(refused.len() as u64, std::sync::atomic::Ordering::Relaxed);
            for filter in &refused {
                tracing::error!(
                    %filter,
                    "the broker refused a subscription (its ACL?): what it carries is not heard until it grants it; asking again"
                );
            }
        }
        if self.awaiting_suback {
            self.awaiting_suback = false;
            self.set_ready(true);
        }
    }

    /// Asks again for the subscriptions the broker refused.
    fn resubscribe(&mut self) {
        let filters = self.subscribing.retry();
        if filters.is_empty() {
            return;
        }
        let subscribe = filters
            .iter()
            .map(|f| rumqttc::SubscribeFilter::new(f.clone(), qos_of(filter::qos(f))));
        if self.client.try_subscribe_many(subscribe).is_err() {
            self.subscribing.retry_failed(Instant::now(), filters);
        }
    }

    async fn on_disconnect(&mut self, eventloop: &mut EventLoop) -> Flow {
        info!("disconnected from the broker on request");
        self.set_ready(false);
        // Let the broker read everything up to the DISCONNECT and close
        // the connection itself: closing first could reset the socket
        // with data unread, and the broker would publish the last will.
        let linger = Instant::now() + Duration::from_millis(500);
        while let Ok(Ok(_)) = tokio::time::timeout_at(linger, eventloop.poll()).await {}
        Flow::Stop
    }

    /// Takes what still counts of the events the client parsed before its
    /// connection was lost (it read a batch, then the connection failed):
    /// acknowledgements (frames the broker has, not to be sent again),
    /// frames received (a command, a lease), and the sends they follow.
    /// Packets it queued to send are gone with the connection.
    fn take_leftovers(&mut self, events: VecDeque<Event>) {
        for event in events {
            match event {
                Event::Incoming(Packet::PubAck(ack)) => self.on_puback(ack.pkid),
                Event::Incoming(Packet::Publish(p)) => self.on_publish(p),
                Event::Outgoing(Outgoing::Publish(pkid)) if pkid != 0 => self.session.sent(pkid),
                _ => {}
            }
        }
    }

    /// After a lost connection: the session keeps what it must, the
    /// client's leftovers of the old session go, and the next attempt
    /// waits the backoff, at the next broker of the list.
    async fn on_error(&mut self, eventloop: &mut EventLoop, e: ConnectionError) -> Flow {
        let node = self.node.clone();
        Metrics::add(&node.status.metrics.connection_errors);
        self.set_ready(false);
        // The client gave back what it had not got acknowledged; the
        // session has its own copy of every QoS 1 publish. Telemetry is
        // dropped (counted). What the client read before the connection
        // failed is taken first: a frame the broker acknowledged is not
        // sent again, and a command that came is not lost.
        let telemetry = eventloop
            .pending
            .iter()
            .filter(|r| matches!(r, Request::Publish(p) if p.qos == QoS::AtMostOnce))
            .count();
        eventloop.pending.clear();
        self.take_leftovers(std::mem::take(&mut eventloop.state.events));
        self.session.connection_lost(telemetry);
        if self.shutting_down {
            self.finish_leaving();
            info!("connection lost during shutdown: not reconnecting");
            return Flow::Stop;
        }
        // The next attempt goes to the next broker of the list (the same
        // one when there is only one), after the backoff's wait; its
        // options are new, so the last will is set after this.
        let failed = self.broker;
        let next = node.config.broker.after(failed);
        if next != failed {
            self.broker = next;
            self.ends.broker.send_replace(next);
            eventloop.mqtt_options = node.mqtt_options(next);
        }
        // A new announcement and will unless the broker surely never held
        // this pair's will: an attempt refused before its CONNECT, or
        // refused by the broker, published neither, and the next attempt
        // takes the same pair, so a subscriber sees no numbers spent on
        // announcements never made. After anything else the broker may
        // still publish that will, and the next announcement must be
        // newer than it.
        if self.connected_at.is_none() && no_will_registered(&e) {
            if let Some(will) = node.will_of(&self.pair.will, false) {
                eventloop.mqtt_options.set_last_will(will);
            }
        } else {
            self.pair = prepare_presence(&node, eventloop);
        }
        // A connection that did not last (a broker that accepts, then
        // drops us) does not reset the backoff.
        if self
            .connected_at
            .take()
            .is_some_and(|t| t.elapsed() > Duration::from_secs(10))
        {
            self.backoff.reset();
        }
        let wait = self.backoff.next_wait(&mut self.rng);
        self.errors_in_a_row += 1;
        // Say it loudly once, then only now and then: an outage of an
        // hour must not fill the journal.
        let errors_in_a_row = self.errors_in_a_row;
        if errors_in_a_row == 1 || errors_in_a_row % 20 == 0 {
            warn!(broker = %node.config.broker.get(failed), error = %e,
                  next = %node.config.broker.get(next),
                  retry_in_ms = wait.as_millis() as u64, attempts = errors_in_a_row,
                  "broker unreachable");
            // A certificate that ended while the agent ran is the likelier
            // cause: said by name.
            if let Some(tls) = &node.config.tls {
                for (_, note) in tls
                    .validity_notes(crate::now_ms())
                    .into_iter()
                    .filter(|n| n.0)
                {
                    tracing::error!("TLS: {note}");
                }
            }
        }
        // A shutdown asked meanwhile is answered at once (not connected).
        let until = Instant::now() + wait;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => break,
                Some(c) = self.ends.control.recv() => self.on_control(c),
            }
        }
        Flow::Go
    }
}

#[cfg(test)]
mod tests {
    use loopwarden_protocol::{samples, Ident, Message, MessageKind, NodeId, Role};
    use rumqttc::{ConnAck, ConnectReturnCode, PubAck, SubAck, SubscribeReasonCode};

    use super::super::command::{self, Class, HandleEnds};
    use super::*;
    use crate::config::{BrokerAddr, BusConfig};
    use crate::durable::{DurableOutbox, StoreFailure};

    const EVENTS: &str = "dc/v2/s1/host/h1/event";

    /// A core for host `h1`, never connected to anything: what it puts in
    /// the client is read back from the `EventLoop`'s queue.
    struct Harness {
        core: Core,
        eventloop: EventLoop,
        inbound: mpsc::Receiver<Inbound>,
        _handles: HandleEnds,
    }

    fn harness(outbox: Option<SharedOutbox>) -> Harness {
        let broker: BrokerAddr = "127.0.0.1:1883".parse().expect("an address");
        let site = Ident::new("s1").expect("a site");
        let me = NodeId::new(Role::Host, "h1").expect("a node");
        let node = Arc::new(Node::new(BusConfig::new(broker, site, me)));
        let (handles, ends) = command::channels(8);
        let (inbound_tx, inbound) = mpsc::channel(8);
        let (client, mut eventloop) = AsyncClient::new(node.mqtt_options(0), CONDUIT);
        let core = Core::new(node, client, ends, inbound_tx, outbox, None, &mut eventloop);
        Harness {
            core,
            eventloop,
            inbound,
            _handles: handles,
        }
    }

    /// An outbox whose flash cannot be read.
    struct Unreadable;

    impl DurableOutbox for Unreadable {
        fn store(
            &mut self,
            _: u32,
            _: loopwarden_flash::outbox::Class,
            _: &str,
            _: &[u8],
        ) -> Result<loopwarden_flash::outbox::Dropped, StoreFailure> {
            Err(StoreFailure::Flash("unwritable".into()))
        }

        fn ack(&mut self, _: u32) -> Result<bool, String> {
            Err("unwritable".into())
        }

        fn pending(&mut self) -> Result<Vec<Pending>, String> {
            Err("unreadable".into())
        }
    }

    fn frame(seq: u32) -> Vec<u8> {
        let frame = Frame {
            seq,
            ..samples::frame(MessageKind::Event)
        };
        frame.to_vec().expect("a sample frame encodes")
    }

    fn event(seq: u32) -> command::Outgoing {
        command::Outgoing {
            topic: EVENTS.into(),
            payload: frame(seq),
            qos: QoS::AtLeastOnce,
            retain: false,
            class: Class::Plain,
        }
    }

    fn seqs(publishes: &[rumqttc::Publish]) -> Vec<u32> {
        let seq = |p: &rumqttc::Publish| Frame::decode(&p.payload).expect("a frame").seq;
        publishes.iter().map(seq).collect()
    }

    fn shutdown(core: &mut Core) -> oneshot::Receiver<Result<(), PublishError>> {
        let (answer, rx) = oneshot::channel();
        let timeout = Duration::from_secs(3);
        core.on_control(Control::Shutdown { timeout, answer });
        rx
    }

    fn connack() -> ConnAck {
        ConnAck::new(ConnectReturnCode::Success, false)
    }

    fn suback(core: &mut Core) {
        let granted = SubscribeReasonCode::Success(QoS::AtLeastOnce);
        let codes = vec![granted; core.subscriptions.len()];
        core.on_suback(SubAck::new(1, codes));
    }

    /// The `online` values and the disconnection put in the client, in
    /// the order they go out.
    fn presence_out(eventloop: &mut EventLoop) -> Vec<Option<bool>> {
        eventloop.clean(); // the client's queue, behind the pending list
        let online = |r: &Request| match r {
            Request::Publish(p) => match Frame::decode(&p.payload).map(|f| f.message) {
                Ok(Message::Online(o)) => Some(Some(o.online)),
                _ => None,
            },
            Request::Disconnect(_) => Some(None),
            _ => None,
        };
        eventloop.pending.iter().filter_map(online).collect()
    }

    #[test]
    fn what_the_client_read_before_the_connection_failed_still_counts() {
        let mut h = harness(None);
        let core = &mut h.core;
        core.session.connected(Vec::new(), None);
        core.session.accept(event(1));
        core.session.accept(event(2));
        core.place_queued();
        core.session.sent(1);
        // Its last read: event 2 sent, event 1 acknowledged, a command
        // came (and was acknowledged); then the connection failed.
        let cmd = rumqttc::Publish::new("dc/v2/s1/host/h1/cmd", QoS::AtLeastOnce, frame(77));
        let events = VecDeque::from([
            Event::Outgoing(Outgoing::Publish(2)),
            Event::Incoming(Packet::PubAck(PubAck::new(1))),
            Event::Incoming(Packet::Publish(cmd)),
            Event::Outgoing(Outgoing::PubAck(5)),
        ]);
        core.take_leftovers(events);
        core.session.connection_lost(0);
        let again = core.session.connected(Vec::new(), None);
        assert_eq!(seqs(&again), [2], "event 1 is at the broker: not again");
        assert_eq!(core.node.status.metrics.snapshot().acked, 1);
        let inbound = h.inbound.try_recv().expect("the command is passed on");
        assert_eq!(inbound.frame.seq, 77);
    }

    /// Connected, subscriptions not answered yet: the announcement is
    /// queued, so the goodbye must follow it before the DISCONNECT, which
    /// drops the will.
    #[test]
    fn a_shutdown_before_the_suback_says_goodbye_behind_the_announcement() {
        let mut h = harness(None);
        h.core.on_connack(&mut h.eventloop, connack());
        assert!(!h.core.ready);
        let answer = shutdown(&mut h.core);
        assert_eq!(
            presence_out(&mut h.eventloop),
            [Some(true), Some(false), None],
            "announcement, goodbye, disconnection"
        );
        let answer = answer.blocking_recv().expect("answered");
        assert!(
            matches!(answer, Err(PublishError::Unacknowledged { count: 1 })),
            "the announcement is not acknowledged: {answer:?}"
        );
        // With an outbox not read yet (it is read after the subscription):
        // nothing is said left in flash that may not be there.
        let outbox: Box<dyn DurableOutbox> = Box::new(Unreadable);
        let mut h = harness(Some(Arc::new(std::sync::Mutex::new(outbox))));
        h.core.on_connack(&mut h.eventloop, connack());
        let answer = shutdown(&mut h.core).blocking_recv().expect("answered");
        assert!(
            matches!(answer, Err(PublishError::Unacknowledged { count: 1 })),
            "{answer:?}"
        );
        // A frame of this process stored before the connection: known to
        // be left in flash.
        let outbox: Box<dyn DurableOutbox> = Box::new(Unreadable);
        let mut h = harness(Some(Arc::new(std::sync::Mutex::new(outbox))));
        h.core.session.accept(command::Outgoing {
            class: Class::Durable(5),
            ..event(5)
        });
        h.core.on_connack(&mut h.eventloop, connack());
        let answer = shutdown(&mut h.core).blocking_recv().expect("answered");
        assert!(
            matches!(answer, Err(PublishError::LeftInFlash { .. })),
            "{answer:?}"
        );
    }

    #[test]
    fn a_shutdown_ready_says_goodbye_then_disconnects() {
        let mut h = harness(None);
        h.core.on_connack(&mut h.eventloop, connack());
        suback(&mut h.core);
        h.core.session.sent(1);
        h.core.on_puback(1);
        let answer = shutdown(&mut h.core);
        assert_eq!(
            presence_out(&mut h.eventloop),
            [Some(true), Some(false), None]
        );
        assert!(matches!(answer.blocking_recv(), Ok(Ok(()))));
    }

    /// Everything handed over is acknowledged, but the outbox could not be
    /// read back from flash: its frames were never sent.
    #[test]
    fn a_shutdown_with_outbox_frames_left_in_flash_fails_and_says_so() {
        let outbox: Box<dyn DurableOutbox> = Box::new(Unreadable);
        let mut h = harness(Some(Arc::new(std::sync::Mutex::new(outbox))));
        h.core.on_connack(&mut h.eventloop, connack());
        suback(&mut h.core);
        h.core.session.sent(1);
        h.core.on_puback(1);
        assert_eq!(h.core.session.unacknowledged(), 0);
        let mut answer = shutdown(&mut h.core);
        assert!(answer.try_recv().is_err(), "waits for the outbox");
        h.core.finish_leaving(); // the timeout passed
        let answer = answer.blocking_recv().expect("answered");
        assert!(
            matches!(answer, Err(PublishError::LeftInFlash { unacknowledged: 0 })),
            "{answer:?}"
        );
        let said = answer.unwrap_err().to_string();
        assert!(said.contains("left unsent in flash"), "{said}");
    }

    #[test]
    fn a_shutdown_while_not_connected_fails_unacknowledged() {
        let mut h = harness(None);
        let answer = shutdown(&mut h.core).blocking_recv().expect("answered");
        assert!(matches!(
            answer,
            Err(PublishError::Unacknowledged { count: 0 })
        ));
    }

    /// Attempts that never had a TCP connection keep their pair; any that
    /// may have sent its CONNECT spends it.
    #[test]
    fn only_attempts_failed_before_a_connection_keep_their_presence_pair() {
        use std::io::{Error, ErrorKind as K};
        let io = |kind| ConnectionError::Io(Error::from(kind));
        for kind in [
            K::ConnectionRefused,
            K::HostUnreachable,
            K::NetworkUnreachable,
            K::AddrNotAvailable,
        ] {
            assert!(no_will_registered(&io(kind)), "{kind:?}");
        }
        let nowhere = Error::new(K::InvalidInput, "could not resolve to any address");
        assert!(no_will_registered(&ConnectionError::Io(nowhere)));
        for kind in [
            K::TimedOut,
            K::ConnectionReset,
            K::ConnectionAborted,
            K::BrokenPipe,
            K::UnexpectedEof,
            K::InvalidInput,
            K::Other,
        ] {
            assert!(!no_will_registered(&io(kind)), "{kind:?}");
        }
        assert!(!no_will_registered(&ConnectionError::NetworkTimeout));
        let reset = rumqttc::StateError::Io(Error::from(K::HostUnreachable));
        assert!(
            !no_will_registered(&ConnectionError::MqttState(reset)),
            "after the TCP connection: the CONNECT may have gone"
        );
        assert!(!no_will_registered(&ConnectionError::MqttState(
            rumqttc::StateError::ConnectionAborted
        )));
    }

    /// A broker name the resolver does not know: no connection was made.
    #[test]
    fn an_unresolved_broker_name_keeps_the_presence_pair() {
        use std::net::ToSocketAddrs;
        match ("no-such-broker.invalid", 1883).to_socket_addrs() {
            Err(e) => assert!(no_will_registered(&ConnectionError::Io(e))),
            // A resolver that answers every name: nothing to see here.
            Ok(_) => eprintln!("no-such-broker.invalid resolved: not checked"),
        }
    }

    /// Sent and not acknowledged when the connection drops during a
    /// shutdown: kept, never sent again (no reconnection), so counted in
    /// the answer and, when the task ends, as dropped.
    #[tokio::test]
    async fn a_shutdown_that_loses_the_connection_counts_what_was_kept() {
        let mut h = harness(None);
        h.core.on_connack(&mut h.eventloop, connack());
        suback(&mut h.core);
        h.core.session.accept(event(1));
        h.core.place_queued();
        h.core.session.sent(1);
        let mut answer = shutdown(&mut h.core);
        assert!(answer.try_recv().is_err(), "waits for the acknowledgement");
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let flow = h
            .core
            .on_error(&mut h.eventloop, ConnectionError::Io(reset))
            .await;
        assert!(matches!(flow, Flow::Stop));
        let answer = answer.await.expect("answered");
        assert!(
            matches!(answer, Err(PublishError::Unacknowledged { count: 1 })),
            "{answer:?}"
        );
        h.core.stopped();
        let m = h.core.node.status.metrics.snapshot();
        assert_eq!(m.dropped_at_stop, 1);
        assert_eq!(m.dropped(), 1);
    }

    /// Shut down during an outage with publishes kept: counted in the
    /// answer, then as dropped.
    #[tokio::test]
    async fn a_shutdown_during_an_outage_counts_what_was_kept() {
        let mut h = harness(None);
        h.core.on_connack(&mut h.eventloop, connack());
        suback(&mut h.core);
        h.core.session.accept(event(1));
        h.core.session.accept(event(2));
        h.core.place_queued();
        h.core.session.connection_lost(0);
        h.core.set_ready(false);
        let answer = shutdown(&mut h.core).await.expect("answered");
        assert!(
            matches!(answer, Err(PublishError::Unacknowledged { count: 2 })),
            "{answer:?}"
        );
        h.core.stopped();
        assert_eq!(h.core.node.status.metrics.snapshot().dropped_at_stop, 2);
    }
}
