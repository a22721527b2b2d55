//! The event loop: the one task that drives `rumqttc`'s `EventLoop`. It
//! connects and reconnects (backoff with jitter; the next broker of the
//! list after each failure), subscribes, announces
//! presence, hands over what was kept from the last connection and what
//! the outbox holds, matches acknowledgements to outbox frames, and passes
//! inbound frames on.
//!
//! Glossary:
//! - *order*: the outbox sequence number (or none) of every QoS 1 publish
//!   handed over whose send the task has not seen yet, in hand-over order.
//! - *salvage*: what is kept of the unacknowledged publishes after a lost
//!   connection.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use loopwarden_protocol::topic::filter;
use loopwarden_protocol::{Family, Frame, Topic};
use rand::SeedableRng;
use rumqttc::{
    ConnectionError, Event, EventLoop, Outgoing, Packet, QoS, Request, SubscribeReasonCode,
};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::handle::qos_of;
use super::presence::{self, Want};
use super::state::{PresencePair, Shared};
use super::{Inbound, PublishError, INFLIGHT_MARGIN, MAX_INFLIGHT};
use crate::backoff::Backoff;
use crate::durable::{Delivery, Pending, SharedOutbox};
use crate::metrics::Metrics;

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
fn prepare_presence(shared: &Shared, eventloop: &mut EventLoop) -> PresencePair {
    let pair = shared.presence_pair();
    if let Some(will) = shared.will_of(&pair.will, false) {
        eventloop.mqtt_options.set_last_will(will);
    }
    pair
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

/// What the task keeps from one event to the next.
struct Driver {
    shared: Arc<Shared>,
    eventloop: EventLoop,
    inbound: mpsc::Sender<Inbound>,
    connected: watch::Sender<bool>,
    backoff: Backoff,
    rng: rand::rngs::StdRng,
    /// QoS 1 publishes kept from the last connection, sent again first.
    kept: VecDeque<Request>,
    errors_in_a_row: u32,
    /// Ready only once the broker answered the subscriptions.
    awaiting_suback: bool,
    connected_at: Option<tokio::time::Instant>,
    subscriptions: Vec<String>,
    /// The presence of the next connection: its announcement, numbered
    /// before its will so the will is the newer of the two.
    pair: PresencePair,
    /// Removes acknowledged frames from the outbox, off this task.
    acker: Option<Acker>,
}

/// Whether the task goes on after an event.
enum Flow {
    Go,
    Stop,
}

/// The bus task: drives the event loop until a shutdown or until the
/// handles are all gone.
pub(super) async fn run(
    shared: Arc<Shared>,
    eventloop: EventLoop,
    inbound: mpsc::Sender<Inbound>,
    connected: watch::Sender<bool>,
    presence: Option<presence::Task>,
) {
    let control = shared.clone();
    Driver::new(shared, eventloop, inbound, connected)
        .drive()
        .await;
    // The presence connection ends with us: with the goodbye a shutdown
    // asked for, else without one, so its will speaks.
    if let Some(c) = &control.presence {
        c.set(Want::End(None));
    }
    if let Some(task) = presence {
        task.join(Duration::from_secs(3)).await;
    }
}

impl Driver {
    fn new(
        shared: Arc<Shared>,
        mut eventloop: EventLoop,
        inbound: mpsc::Sender<Inbound>,
        connected: watch::Sender<bool>,
    ) -> Self {
        let cfg = &shared.config;
        let backoff = cfg.backoff.clone();
        let rng = rand::rngs::StdRng::from_entropy();
        let mut subscriptions: Vec<String> = cfg.subscriptions.clone();
        if let Ok(cmd) = shared
            .own_topic(Family::Cmd)
            .and_then(|t| t.build().map_err(PublishError::Topic))
        {
            subscriptions.push(cmd.to_string());
        }
        let pair = prepare_presence(&shared, &mut eventloop);
        Driver {
            shared,
            eventloop,
            inbound,
            connected,
            backoff,
            rng,
            kept: VecDeque::new(),
            errors_in_a_row: 0,
            awaiting_suback: false,
            connected_at: None,
            subscriptions,
            pair,
            acker: None,
        }
    }

    async fn drive(mut self) {
        loop {
            let event = self.eventloop.poll().await;
            let settled = self.eventloop.state.inflight() == 0 && {
                let d = self.shared.delivery();
                d.order.is_empty() && !d.deferred && d.acking.is_empty()
            };
            self.shared.settled.store(settled, Ordering::Relaxed);
            let flow = match event {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => self.on_connack(ack),
                Ok(Event::Incoming(Packet::Publish(p))) => self.on_publish(p),
                Ok(Event::Incoming(Packet::PubAck(ack))) => self.on_puback(ack),
                Ok(Event::Outgoing(Outgoing::Publish(pkid))) if pkid != 0 => self.on_sent(pkid),
                Ok(Event::Incoming(Packet::SubAck(ack))) => self.on_suback(ack),
                // At least once per keep-alive: nothing deferred waits longer.
                Ok(Event::Incoming(Packet::PingResp)) => {
                    top_up(&mut self.eventloop, &self.shared);
                    Flow::Go
                }
                Ok(Event::Outgoing(Outgoing::Disconnect)) => self.on_disconnect().await,
                Ok(_) => Flow::Go,
                Err(ConnectionError::RequestsDone) => Flow::Stop,
                Err(e) => self.on_error(e).await,
            };
            if let Flow::Stop = flow {
                return;
            }
            self.hand_over_retained();
        }
    }

    /// Hands over the retained state the client's queue had no room for,
    /// straight to the event loop, once connected.
    fn hand_over_retained(&mut self) {
        if !self.shared.connected.load(Ordering::Relaxed) {
            return;
        }
        let unsent = self.shared.take_unsent_retained();
        if unsent.is_empty() {
            return;
        }
        debug!(
            count = unsent.len(),
            "handing over retained state the queue had no room for"
        );
        let mut delivery = self.shared.delivery();
        hand_over_unsent(
            &mut self.eventloop,
            &mut delivery,
            unsent,
            Vec::new(),
            &self.shared,
        );
    }

    /// Says the connection is ready (or not) to the handles, and to the
    /// presence connection.
    fn set_connected(&self, connected: bool) {
        self.shared.connected.store(connected, Ordering::Relaxed);
        let _ = self.connected.send(connected);
        self.want_presence(if connected {
            Want::Up {
                generation: self.shared.metrics.connects.load(Ordering::Relaxed),
                pair: Box::new(self.pair.clone()),
            }
        } else {
            Want::Down
        });
    }

    /// Asks the presence connection for `want` (when there is one).
    fn want_presence(&self, want: Want) {
        if let Some(control) = &self.shared.presence {
            control.set(want);
        }
    }

    fn on_connack(&mut self, ack: rumqttc::ConnAck) -> Flow {
        let shared = &self.shared;
        let m = &shared.metrics;
        info!(broker = %shared.broker(), session = ack.session_present, "connected to the broker");
        self.connected_at = Some(tokio::time::Instant::now());
        self.errors_in_a_row = 0;
        Metrics::add(&m.connects);
        // Subscriptions first, straight to the event loop (the
        // client's queue may be full after an outage); ready once
        // the broker answered them, so a command sent to us after
        // that reaches us.
        self.awaiting_suback = !self.subscriptions.is_empty();
        if self.awaiting_suback {
            let filters = self
                .subscriptions
                .iter()
                .map(|f| rumqttc::SubscribeFilter::new(f.clone(), qos_of(filter::qos(f))));
            self.eventloop
                .pending
                .push_front(Request::Subscribe(rumqttc::Subscribe::new_many(filters)));
        } else {
            self.set_connected(true);
        }
        // What was kept from the last connection, what the outbox
        // holds, then presence, ahead of anything new.
        let mut delivery = shared.delivery();
        let before: Vec<rumqttc::Publish> = self
            .kept
            .drain(..)
            .filter_map(|r| match r {
                Request::Publish(p) => Some(p),
                _ => None,
            })
            .collect();
        if shared.shutting_down.load(Ordering::Relaxed) {
            // Shut down while disconnected: goodbye, not hello.
            for p in shared.presence(&shared.online_frame(false)) {
                self.eventloop.pending.push_back(Request::Publish(p));
                delivery.order.push_back(None);
            }
            self.eventloop
                .pending
                .push_back(Request::Disconnect(rumqttc::Disconnect));
            return Flow::Go;
        }
        let mut presence = shared.presence(&self.pair.announce);
        // On a re-connection, the node's retained state again after its
        // presence (the broker may have lost it, and the shell need not
        // watch for reconnections to publish it).
        if m.connects.load(Ordering::Relaxed) > 1 {
            presence.extend(shared.retained_state());
        }
        hand_over_unsent(&mut self.eventloop, &mut delivery, before, presence, shared);
        Flow::Go
    }

    fn on_publish(&mut self, p: rumqttc::Publish) -> Flow {
        let m = &self.shared.metrics;
        let topic = match Topic::parse(&p.topic) {
            Ok(t) => t,
            Err(e) => {
                Metrics::add(&m.rejected_topic);
                debug!(topic = %p.topic, error = %e, "message on a foreign topic");
                return Flow::Go;
            }
        };
        if topic.json {
            return Flow::Go;
        }
        match Frame::decode(&p.payload) {
            Ok(frame) => {
                Metrics::add(&m.received);
                if self.inbound.try_send(Inbound { topic, frame }).is_err() {
                    Metrics::add(&m.dropped_inbound_full);
                }
            }
            Err(e) => {
                m.rejected(&e);
                warn!(topic = %p.topic, bytes = p.payload.len(), error = %e, "frame refused");
            }
        }
        Flow::Go
    }

    fn on_puback(&mut self, ack: rumqttc::PubAck) -> Flow {
        Metrics::add(&self.shared.metrics.acked);
        let acked = {
            let mut delivery = self.shared.delivery();
            match (delivery.inflight.remove(&ack.pkid), delivery.outbox.clone()) {
                (Some(seq), Some(outbox)) => {
                    // Marked under the delivery lock (so nothing hands it
                    // over again), removed from flash by the acker thread:
                    // a flash sync never holds up this task, nor the
                    // health frames behind it in the client's queue.
                    delivery.acking.insert(seq);
                    if let Some(l) = delivery.ledger.as_mut() {
                        l.push(seq);
                    }
                    Some((seq, outbox))
                }
                _ => None,
            }
        };
        if let Some((seq, outbox)) = acked {
            self.acker(outbox).ack(seq);
        }
        top_up(&mut self.eventloop, &self.shared);
        Flow::Go
    }

    /// The acker thread, started at the first acknowledgement.
    fn acker(&mut self, outbox: SharedOutbox) -> &Acker {
        let shared = self.shared.clone();
        self.acker
            .get_or_insert_with(|| Acker::start(outbox, shared))
    }

    /// A QoS 1 publish went out with packet id `pkid`: the next place in
    /// `order` is its.
    fn on_sent(&mut self, pkid: u16) -> Flow {
        let mut delivery = self.shared.delivery();
        match delivery.order.pop_front() {
            Some(Some(seq)) => {
                delivery.inflight.insert(pkid, seq);
            }
            Some(None) => {}
            None => {
                Metrics::add(&self.shared.metrics.delivery_mismatch);
                debug!(pkid, "a publish was sent that the shell did not hand over");
            }
        }
        Flow::Go
    }

    fn on_suback(&mut self, ack: rumqttc::SubAck) -> Flow {
        if ack
            .return_codes
            .iter()
            .any(|c| matches!(c, SubscribeReasonCode::Failure))
        {
            warn!(pkid = ack.pkid, "the broker refused a subscription");
        }
        if self.awaiting_suback {
            self.awaiting_suback = false;
            self.set_connected(true);
        }
        // Frames stored while the subscription was pending.
        top_up(&mut self.eventloop, &self.shared);
        Flow::Go
    }

    async fn on_disconnect(&mut self) -> Flow {
        info!("disconnected from the broker on request");
        self.set_connected(false);
        // Let the broker read everything up to the DISCONNECT and
        // close the connection itself: closing first could reset the
        // socket with data unread, and the broker would publish the
        // last will.
        let linger = tokio::time::Instant::now() + Duration::from_millis(500);
        while let Ok(Ok(_)) = tokio::time::timeout_at(linger, self.eventloop.poll()).await {}
        Flow::Stop
    }

    async fn on_error(&mut self, e: ConnectionError) -> Flow {
        let shared = self.shared.clone();
        Metrics::add(&shared.metrics.connection_errors);
        self.set_connected(false);
        {
            let mut delivery = shared.delivery();
            salvage(&mut self.eventloop, &mut self.kept, &shared, &mut delivery);
        }
        if shared.shutting_down.load(Ordering::Relaxed) {
            info!("connection lost during shutdown: not reconnecting");
            return Flow::Stop;
        }
        // The next attempt goes to the next broker of the list (the same
        // one when there is only one), after the backoff's wait; its
        // options are new, so the last will is set after this.
        let failed = shared.broker.load(Ordering::Relaxed);
        let next = shared.config.broker.after(failed);
        if next != failed {
            shared.broker.store(next, Ordering::Relaxed);
            self.eventloop.mqtt_options = shared.mqtt_options(next);
        }
        self.pair = prepare_presence(&shared, &mut self.eventloop);
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
            warn!(broker = %shared.config.broker.get(failed), error = %e, next = %shared.broker(),
                  retry_in_ms = wait.as_millis() as u64, attempts = errors_in_a_row,
                  kept = self.kept.len(), "broker unreachable");
        }
        tokio::time::sleep(wait).await;
        Flow::Go
    }
}

/// The thread that removes acknowledged frames from the outbox, in the
/// order they were acknowledged. It ends when the task drops it.
struct Acker {
    tx: std::sync::mpsc::Sender<u32>,
}

impl Acker {
    fn start(outbox: SharedOutbox, shared: Arc<Shared>) -> Acker {
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        let spawned = std::thread::Builder::new()
            .name("bus-acker".into())
            .spawn(move || {
                for seq in rx {
                    remove_acked(&outbox, &shared, seq);
                }
            });
        if let Err(e) = spawned {
            warn!(error = %e, "no acker thread: acknowledged frames stay in the outbox until resent");
        }
        Acker { tx }
    }

    /// Hands `seq` to the thread. Every seq waiting is a frame still in
    /// the outbox, so the flash's capacity bounds the channel.
    fn ack(&self, seq: u32) {
        let _ = self.tx.send(seq);
    }
}

/// Removes acknowledged frame `seq` from the outbox, then lets it be
/// forgotten by the delivery bookkeeping.
fn remove_acked(outbox: &SharedOutbox, shared: &Shared, seq: u32) {
    let m = &shared.metrics;
    let result = match outbox.lock() {
        Ok(mut o) => o.ack(seq),
        Err(_) => Err("the outbox lock is poisoned".to_string()),
    };
    match result {
        Ok(true) => Metrics::add(&m.outbox_acked),
        Ok(false) => {} // dropped to make room meanwhile
        Err(e) => warn!(seq, error = %e, "cannot remove an acknowledged frame from the outbox"),
    }
    shared.delivery().acking.remove(&seq);
}
