//! The delivery state of the main connection, as a plain struct: what was
//! handed to the MQTT client and in which order, which packet id each QoS 1
//! publish went out with, what the broker acknowledged, what to send again
//! after a lost connection, what the flash outbox still has to hand over,
//! and the node's latest retained state. It does no I/O: the event loop
//! ([`super::event_loop`]) owns it, feeds it what happened (a command, a
//! send, an acknowledgement, a connection won or lost, what the outbox
//! holds) and puts into the client what it answers.
//!
//! What it guarantees:
//! - in order: publishes go to the client in the order they were accepted;
//!   what goes ahead of the client's queue (kept frames, outbox frames,
//!   presence) goes in that order, ahead of anything accepted later;
//! - ack matching: the client tells a QoS 1 publish's packet id only by a
//!   send event, in the order it sends; each send is matched to the front
//!   of `order`, and each PUBACK settles exactly the publish sent with its
//!   packet id; an unknown or repeated PUBACK changes nothing;
//! - bounded: never more QoS 1 publishes in flight than packet ids leave
//!   room for ([`MAX_INFLIGHT`] less [`INFLIGHT_MARGIN`] when handing over
//!   the outbox), so a wrapped packet id is never one still unacknowledged;
//! - across a lost connection: QoS 1 publishes not acknowledged are kept
//!   and sent again first on the next connection (in frame order, at most
//!   `offline_capacity`, the oldest dropped first and counted); telemetry
//!   (QoS 0) is dropped and counted; outbox frames are read from flash
//!   again instead; presence and retained state are announced afresh;
//! - nothing lost silently: every QoS 1 publish accepted is acknowledged,
//!   still pending (waiting, handed over, in flight, kept, or in the
//!   outbox), or counted as dropped.
//!
//! Glossary:
//! - *waiting*: accepted, not yet in the client's queue (it was full).
//! - *order*: handed to the client, its send not seen yet.
//! - *in flight*: sent with a packet id, not acknowledged yet.
//! - *kept*: unacknowledged when the connection dropped, sent again first.
//! - *deferred*: the outbox holds frames not handed over (not connected,
//!   the command channel was full, or the window was full); read from
//!   flash when there is room.
//! - *acking*: acknowledged outbox frames whose removal from flash has not
//!   happened yet; never handed over again meanwhile.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;

use loopwarden_protocol::{Family, Frame, Topic};
use rumqttc::{Publish, QoS};

use super::command::{Class, Outgoing, Unsent};
use super::node::retained_publish;
use super::status::Status;
use super::{INFLIGHT_MARGIN, MAX_INFLIGHT};
use crate::durable::Pending;
use crate::metrics::Metrics;

/// What becomes of a QoS 1 publish if the connection drops before its
/// acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum What {
    /// Kept and sent again after the reconnection.
    Kept,
    /// Outbox frame `seq`: read from flash again; removed from flash once
    /// acknowledged.
    Outbox(u32),
    /// Presence or retained state: announced afresh on every connection.
    Announced,
}

/// A publish and what becomes of it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Handover {
    pub(super) publish: Publish,
    pub(super) what: What,
}

impl Handover {
    pub(super) fn new(publish: Publish, what: What) -> Self {
        Self { publish, what }
    }
}

/// What waits for room in the client's queue.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Queued {
    Publish(Handover),
    /// The goodbye's end: disconnect once everything before it is queued.
    Disconnect,
}

/// The delivery state (see the module note).
#[derive(Debug)]
pub(super) struct Session {
    status: Arc<Status>,
    offline_capacity: usize,
    has_outbox: bool,
    /// Connected (the broker accepted us; subscriptions may be pending).
    link_up: bool,
    /// Connections so far.
    connections: u64,
    waiting: VecDeque<Queued>,
    order: VecDeque<Handover>,
    /// Packet id and publish, in the order they were sent.
    inflight: VecDeque<(u16, Handover)>,
    kept: Vec<Publish>,
    deferred: bool,
    /// A frame of this process waited in the outbox ([`Session::stored`]).
    stored: bool,
    acking: HashSet<u32>,
    /// The newest outbox frame handed over: a command for an older one
    /// comes after its frame was read from flash.
    outbox_seen: Option<u32>,
    /// The latest retained state by topic name.
    retained: BTreeMap<String, Vec<u8>>,
}

impl Session {
    /// A session before the first connection; what an outbox holds from
    /// before goes out on connecting.
    pub(super) fn new(status: Arc<Status>, offline_capacity: usize, has_outbox: bool) -> Self {
        Self {
            status,
            offline_capacity,
            has_outbox,
            link_up: false,
            connections: 0,
            waiting: VecDeque::new(),
            order: VecDeque::new(),
            inflight: VecDeque::new(),
            kept: Vec::new(),
            deferred: has_outbox,
            stored: false,
            acking: HashSet::new(),
            outbox_seen: None,
            retained: BTreeMap::new(),
        }
    }

    fn metrics(&self) -> &Metrics {
        &self.status.metrics
    }

    /// Connected: the broker accepted the connection (its subscriptions
    /// may still be unanswered).
    pub(super) fn link_up(&self) -> bool {
        self.link_up
    }

    /// Whether the outbox may hold frames not handed over yet (deferred):
    /// frames that, at a shutdown, stay in flash unsent.
    pub(super) fn deferred(&self) -> bool {
        self.deferred
    }

    /// Whether a frame of this process went to the outbox to wait there
    /// (not connected, or behind older ones).
    pub(super) fn stored(&self) -> bool {
        self.stored
    }

    /// Whether the loop may take another command: connected, and nothing
    /// waiting for room in the client's queue.
    pub(super) fn takes_commands(&self) -> bool {
        self.link_up && self.waiting.is_empty()
    }

    /// Takes a publish from a handle: it waits for the client's queue, or,
    /// an outbox frame that cannot go now, stays in flash (deferred).
    pub(super) fn accept(&mut self, out: Outgoing) {
        let mut publish = Publish::new(out.topic, out.qos, out.payload);
        publish.retain = out.retain;
        let what = match out.class {
            Class::Durable(seq) => {
                let busy = self.is_busy(seq);
                if !self.link_up || self.deferred {
                    // Stored: it goes out from flash, after the older
                    // frames still there, in sequence order.
                    self.deferred = true;
                    self.stored = true;
                    Metrics::add(&self.metrics().deferred);
                    return;
                }
                if busy || self.outbox_seen.is_some_and(|s| seq <= s) {
                    // Handed over from flash already, or to be read from
                    // there again (never twice at once).
                    self.deferred |= !busy;
                    return;
                }
                self.outbox_seen = Some(seq);
                What::Outbox(seq)
            }
            Class::Retained => {
                if !self.hold_retained(&publish.topic, &publish.payload) {
                    // A newer state of the topic came round the full
                    // command channel first and is held (handed over or
                    // to be): the broker must keep that one.
                    return;
                }
                What::Kept
            }
            Class::Plain => What::Kept,
        };
        self.waiting
            .push_back(Queued::Publish(Handover::new(publish, what)));
    }

    /// What goes to the client's queue next, once connected.
    pub(super) fn next_queued(&self) -> Option<&Queued> {
        self.waiting.front().filter(|_| self.link_up)
    }

    /// The client's queue took [`Session::next_queued`].
    pub(super) fn queued(&mut self) {
        if let Some(Queued::Publish(h)) = self.waiting.pop_front() {
            self.count_published(&h.publish);
            if h.publish.qos != QoS::AtMostOnce {
                self.order.push_back(h);
            }
        }
    }

    fn count_published(&self, p: &Publish) {
        Metrics::add(&self.metrics().published);
        if p.qos != QoS::AtMostOnce {
            Metrics::add(&self.metrics().published_qos1);
        }
    }

    /// Drops what [`Session::next_queued`] gave (the client cannot take
    /// it: not a topic to publish on); counted as a bookkeeping error.
    pub(super) fn drop_queued(&mut self) {
        self.waiting.pop_front();
        Metrics::add(&self.metrics().delivery_mismatch);
    }

    /// The client sent a QoS 1 publish with packet id `pkid`: the front of
    /// `order` is it.
    pub(super) fn sent(&mut self, pkid: u16) {
        let Some(h) = self.order.pop_front() else {
            Metrics::add(&self.metrics().delivery_mismatch);
            return;
        };
        if self.inflight.iter().any(|(p, _)| *p == pkid) {
            // The client never reuses the id of an unacknowledged publish.
            Metrics::add(&self.metrics().delivery_mismatch);
        }
        self.inflight.push_back((pkid, h));
    }

    /// The broker acknowledged packet id `pkid`: settles the publish sent
    /// with it. An outbox frame's seq, to remove from flash.
    pub(super) fn acked(&mut self, pkid: u16) -> Option<(u32, Option<Family>)> {
        let at = self.inflight.iter().position(|(p, _)| *p == pkid)?;
        let (_, h) = self.inflight.remove(at)?;
        match h.what {
            What::Outbox(seq) => {
                self.acking.insert(seq);
                let family = Topic::parse(&h.publish.topic).ok().map(|t| t.family);
                Some((seq, family))
            }
            What::Kept | What::Announced => None,
        }
    }

    /// Acknowledged outbox frame `seq` is no longer in flash.
    pub(super) fn removed(&mut self, seq: u32) {
        self.acking.remove(&seq);
    }

    /// Frames were stored in the outbox that no command carries.
    pub(super) fn outbox_stored(&mut self) {
        self.deferred |= self.has_outbox;
    }

    /// Whether outbox frame `seq` is handed over, in flight or being
    /// removed.
    fn is_busy(&self, seq: u32) -> bool {
        let outbox = |h: &Handover| h.what == What::Outbox(seq);
        self.acking.contains(&seq)
            || self.order.iter().any(outbox)
            || self.inflight.iter().any(|(_, h)| outbox(h))
            || self
                .waiting
                .iter()
                .any(|q| matches!(q, Queued::Publish(h) if outbox(h)))
    }

    /// QoS 1 publishes handed over, waiting, or kept from a lost
    /// connection, not acknowledged.
    pub(super) fn unacknowledged(&self) -> usize {
        let waiting = self
            .waiting
            .iter()
            .filter(|q| matches!(q, Queued::Publish(h) if h.publish.qos != QoS::AtMostOnce));
        self.order.len() + self.inflight.len() + waiting.count() + self.kept.len()
    }

    /// The bus task ends: the QoS 1 publishes still kept from a lost
    /// connection, or waiting for the client's queue, are never sent
    /// again; they are counted as dropped (`dropped_at_stop`), and their
    /// number returned. Outbox frames stay in flash; presence is not
    /// counted (the will or the goodbye says it).
    pub(super) fn stopped(&mut self) -> usize {
        let waiting = self.waiting.drain(..).filter(|q| {
            matches!(q, Queued::Publish(h) if h.publish.qos != QoS::AtMostOnce && h.what == What::Kept)
        });
        let lost = waiting.count() + self.kept.drain(..).count();
        self.metrics()
            .dropped_at_stop
            .fetch_add(lost as u64, std::sync::atomic::Ordering::Relaxed);
        lost
    }

    /// Nothing waits for the broker or for flash.
    pub(super) fn settled(&self) -> bool {
        self.unacknowledged() == 0
            && self.waiting.is_empty()
            && !self.deferred
            && self.acking.is_empty()
    }

    /// Whether the loop should read the outbox now: frames are deferred
    /// and, for a top-up (`top_up`, once ready), at least half the window
    /// is free, so the outbox is read in batches.
    pub(super) fn wants_outbox(&self, top_up: bool) -> bool {
        self.has_outbox
            && self.deferred
            && (!top_up || self.unacknowledged() < MAX_INFLIGHT as usize / 2)
    }

    /// Hands over `before`, then the outbox frames not handed over yet
    /// (`outbox`: what the outbox holds, when it was read), then `after`,
    /// ahead of the client's queue but behind the `at` QoS 1 publishes
    /// already ahead of it. The publishes to put ahead of the queue, in
    /// order.
    pub(super) fn hand_over_first(
        &mut self,
        at: usize,
        before: Vec<Handover>,
        outbox: Option<Vec<Pending>>,
        after: Vec<Handover>,
    ) -> Vec<Publish> {
        // Room for the outbox frames: never more in flight than packet ids.
        let busy = self.unacknowledged() + before.len() + after.len();
        let room = (MAX_INFLIGHT as usize).saturating_sub(busy + INFLIGHT_MARGIN);
        let mut unsent: Vec<Pending> = Vec::new();
        if let (Some(all), true) = (outbox, self.deferred) {
            unsent = all.into_iter().filter(|p| !self.is_busy(p.seq)).collect();
            if unsent.len() > room {
                unsent.truncate(room); // the rest on later acknowledgements
            } else {
                self.deferred = false;
            }
        }
        let mut all = before;
        for u in unsent {
            Metrics::add(&self.metrics().resent);
            self.outbox_seen = self.outbox_seen.max(Some(u.seq));
            let mut p = Publish::new(u.topic, QoS::AtLeastOnce, u.payload);
            p.retain = Topic::parse(&p.topic).is_ok_and(|t| t.family.retained());
            all.push(Handover::new(p, What::Outbox(u.seq)));
        }
        all.extend(after);
        let mut out = Vec::with_capacity(all.len());
        for (k, h) in all.into_iter().enumerate() {
            self.count_published(&h.publish);
            out.push(h.publish.clone());
            self.order.insert((at + k).min(self.order.len()), h);
        }
        out
    }

    /// The broker accepted a connection: what goes ahead of everything,
    /// in order: the frames kept from the last connection, what the outbox
    /// holds (`outbox`, when read), then `presence` and, on a
    /// re-connection, the latest retained state.
    pub(super) fn connected(
        &mut self,
        presence: Vec<Publish>,
        outbox: Option<Vec<Pending>>,
    ) -> Vec<Publish> {
        self.link_up = true;
        self.connections += 1;
        let kept = self.kept.drain(..).map(|p| Handover::new(p, What::Kept));
        let before: Vec<Handover> = kept.collect();
        let mut after: Vec<Handover> = presence
            .into_iter()
            .map(|p| Handover::new(p, What::Announced))
            .collect();
        if self.connections > 1 {
            let retained = self.retained.iter().map(|(t, p)| retained_publish(t, p));
            after.extend(retained.map(|p| Handover::new(p, What::Announced)));
        }
        self.hand_over_first(0, before, outbox, after)
    }

    /// Connected while shutting down: only the goodbye (`presence`), ahead
    /// of everything; nothing kept is sent (what was kept is counted as
    /// dropped when the task ends: [`Session::stopped`]).
    pub(super) fn connected_to_leave(&mut self, goodbye: Vec<Publish>) -> Vec<Publish> {
        self.link_up = true;
        self.connections += 1;
        let after = goodbye
            .into_iter()
            .map(|p| Handover::new(p, What::Announced))
            .collect();
        self.hand_over_first(0, Vec::new(), None, after)
    }

    /// Queues `goodbye` (presence) and then the disconnection.
    pub(super) fn leave(&mut self, goodbye: Vec<Publish>) {
        for p in goodbye {
            let h = Handover::new(p, What::Announced);
            self.waiting.push_back(Queued::Publish(h));
        }
        self.waiting.push_back(Queued::Disconnect);
    }

    /// The connection was lost; `telemetry` QoS 0 publishes the client
    /// still held were dropped with it (counted here).
    pub(super) fn connection_lost(&mut self, telemetry: usize) {
        let m = &self.status.metrics;
        self.link_up = false;
        m.dropped_offline
            .fetch_add(telemetry as u64, std::sync::atomic::Ordering::Relaxed);
        let mut unacked: Vec<Handover> = self.inflight.drain(..).map(|(_, h)| h).collect();
        unacked.extend(self.order.drain(..));
        for q in self.waiting.drain(..) {
            match q {
                Queued::Publish(h) if h.publish.qos == QoS::AtMostOnce => {
                    Metrics::add(&m.dropped_offline)
                }
                Queued::Publish(h) => unacked.push(h),
                Queued::Disconnect => {}
            }
        }
        for h in unacked {
            match h.what {
                What::Outbox(_) => self.deferred = true,
                What::Announced => {}
                What::Kept => {
                    let mut p = h.publish;
                    // The next session is a clean one: an old packet id
                    // means nothing there.
                    p.pkid = 0;
                    p.dup = false;
                    self.kept.push(p);
                }
            }
        }
        // Frame order (stable: a mirror stays behind its frame).
        self.kept.sort_by_key(|p| seq_of(&p.payload));
        let over = self.kept.len().saturating_sub(self.offline_capacity);
        self.kept.drain(..over);
        m.dropped_offline_overflow
            .fetch_add(over as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Retained state the command channel refused (`unsent`): what is
    /// newer than the latest the session has is kept and handed over (or,
    /// while disconnected after a first connection, announced with the
    /// rest on the next one).
    pub(super) fn offer_retained(&mut self, unsent: &Unsent) {
        for (name, payload) in unsent {
            if !self.hold_retained(name, payload) {
                continue;
            }
            if self.link_up || self.connections == 0 {
                let h = Handover::new(retained_publish(name, payload), What::Kept);
                self.waiting.push_back(Queued::Publish(h));
            }
        }
    }

    /// Keeps `payload` as the latest retained state of topic `name` if it
    /// is newer (a later sequence number, [`later`]) than the one held;
    /// false, and nothing kept, when it is not: an older state must never
    /// go out after a newer, or the broker would keep the older.
    fn hold_retained(&mut self, name: &str, payload: &[u8]) -> bool {
        let newer = self
            .retained
            .get(name)
            .is_none_or(|old| later(seq_of(payload), seq_of(old)));
        if newer {
            self.retained.insert(name.to_string(), payload.to_vec());
        }
        newer
    }
}

/// Whether sequence number `new` comes after `old` on the node's frame
/// counter, which wraps (u32::MAX, then 0): by serial-number arithmetic
/// (RFC 1982), within half the counter's range. One that is not known
/// (a payload that does not decode) comes before any that is.
fn later(new: Option<u32>, old: Option<u32>) -> bool {
    match (new, old) {
        (Some(n), Some(o)) => (n.wrapping_sub(o) as i32) > 0,
        (n, o) => n > o,
    }
}

/// The sequence number of a frame or of its JSON mirror.
fn seq_of(payload: &[u8]) -> Option<u32> {
    Frame::decode(payload)
        .ok()
        .or_else(|| Frame::from_json(std::str::from_utf8(payload).ok()?).ok())
        .map(|f| f.seq)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::atomic::Ordering;

    use loopwarden_protocol::{samples, MessageKind};
    use proptest::prelude::*;

    use super::*;

    const EVENTS: &str = "dc/v2/s1/host/h1/event";
    const TELEMETRY: &str = "dc/v2/s1/host/h1/telemetry";
    const HEALTH: &str = "dc/v2/s1/host/h1/health";

    fn payload(seq: u32) -> Vec<u8> {
        let frame = Frame {
            seq,
            ..samples::frame(MessageKind::Event)
        };
        frame.to_vec().expect("a sample frame encodes")
    }

    fn event(seq: u32) -> Outgoing {
        Outgoing {
            topic: EVENTS.into(),
            payload: payload(seq),
            qos: QoS::AtLeastOnce,
            retain: false,
            class: Class::Plain,
        }
    }

    fn durable(seq: u32) -> Outgoing {
        Outgoing {
            class: Class::Durable(seq),
            ..event(seq)
        }
    }

    fn telemetry(seq: u32) -> Outgoing {
        Outgoing {
            topic: TELEMETRY.into(),
            qos: QoS::AtMostOnce,
            ..event(seq)
        }
    }

    fn stored(seq: u32) -> Pending {
        Pending {
            seq,
            topic: EVENTS.into(),
            payload: payload(seq),
        }
    }

    fn presence() -> Publish {
        retained_publish("dc/v2/s1/host/h1/online", &payload(0))
    }

    fn session(offline_capacity: usize, outbox: bool) -> Session {
        Session::new(Arc::new(Status::new(0)), offline_capacity, outbox)
    }

    fn count(s: &Session, counter: fn(&Metrics) -> &std::sync::atomic::AtomicU64) -> u64 {
        counter(s.metrics()).load(Ordering::Relaxed)
    }

    fn seqs(publishes: &[Publish]) -> Vec<Option<u32>> {
        publishes.iter().map(|p| seq_of(&p.payload)).collect()
    }

    /// Everything the client's queue takes now, in order.
    fn drain(s: &mut Session) -> Vec<Publish> {
        let mut out = Vec::new();
        while let Some(q) = s.next_queued() {
            if let Queued::Publish(h) = q {
                out.push(h.publish.clone());
            }
            s.queued();
        }
        out
    }

    fn some(seqs: impl IntoIterator<Item = u32>) -> Vec<Option<u32>> {
        seqs.into_iter().map(Some).collect()
    }

    #[test]
    fn publishes_go_to_the_client_in_the_order_they_were_accepted() {
        let mut s = session(100, false);
        s.connected(Vec::new(), None);
        for seq in 1..=5 {
            s.accept(event(seq));
        }
        assert!(!s.takes_commands(), "a waiting publish holds the commands");
        assert_eq!(seqs(&drain(&mut s)), some(1..=5));
        assert!(s.takes_commands());
        assert_eq!(count(&s, |m| &m.published_qos1), 5);
    }

    #[test]
    fn nothing_goes_to_the_client_while_disconnected() {
        let mut s = session(100, false);
        s.accept(event(1));
        assert!(s.next_queued().is_none());
        assert!(!s.takes_commands());
        s.connected(Vec::new(), None);
        assert_eq!(seqs(&drain(&mut s)), some([1]));
    }

    #[test]
    fn the_outbox_and_presence_go_ahead_of_newer_frames_in_sequence_order() {
        let mut s = session(100, true);
        let first = s.connected(vec![presence()], Some((7..=9).map(stored).collect()));
        assert_eq!(seqs(&first), vec![Some(7), Some(8), Some(9), Some(0)]);
        assert_eq!(count(&s, |m| &m.resent), 3);
        // A command for a frame handed over from flash already: not twice.
        s.accept(durable(8));
        s.accept(durable(10));
        assert_eq!(seqs(&drain(&mut s)), some([10]));
        // Sends match in hand-over order: the outbox frames first.
        for pkid in 1..=5 {
            s.sent(pkid);
        }
        assert_eq!(s.acked(1).map(|a| a.0), Some(7));
        assert_eq!(s.acked(4).map(|a| a.0), None, "presence is no outbox frame");
        assert_eq!(s.acked(5).map(|a| a.0), Some(10));
        assert_eq!(count(&s, |m| &m.delivery_mismatch), 0);
    }

    #[test]
    fn a_frame_stored_while_older_ones_wait_in_flash_stays_behind_them() {
        let mut s = session(100, true);
        s.connected(Vec::new(), None); // the outbox was not read
        s.accept(durable(3));
        assert!(drain(&mut s).is_empty(), "it must not overtake 1 and 2");
        assert_eq!(count(&s, |m| &m.deferred), 1);
        assert!(s.wants_outbox(true));
        let first = s.hand_over_first(
            0,
            Vec::new(),
            Some((1..=3).map(stored).collect()),
            Vec::new(),
        );
        assert_eq!(seqs(&first), some(1..=3));
        assert!(!s.wants_outbox(false));
    }

    #[test]
    fn unacknowledged_qos1_is_sent_again_after_a_reconnection_and_telemetry_is_not() {
        let mut s = session(100, false);
        s.connected(vec![presence()], None);
        s.accept(event(1));
        s.accept(telemetry(2));
        s.accept(event(3));
        s.accept(event(4));
        drain(&mut s);
        s.sent(1); // presence
        s.sent(2); // event 1
        s.sent(3); // event 3
        assert_eq!(s.acked(2).map(|a| a.0), None);
        // Lost with event 3 in flight, event 4 not yet sent, and the
        // telemetry still in the client's queue.
        s.connection_lost(1);
        assert_eq!(count(&s, |m| &m.dropped_offline), 1);
        let first = s.connected(vec![presence()], None);
        assert_eq!(seqs(&first), vec![Some(3), Some(4), Some(0)]);
        assert_eq!(count(&s, |m| &m.dropped_offline_overflow), 0);
    }

    #[test]
    fn telemetry_waiting_at_a_lost_connection_is_dropped_and_counted() {
        let mut s = session(100, false);
        s.connected(Vec::new(), None);
        s.accept(telemetry(1));
        s.connection_lost(0);
        assert_eq!(count(&s, |m| &m.dropped_offline), 1);
        assert!(s.connected(Vec::new(), None).is_empty());
        assert!(drain(&mut s).is_empty());
    }

    #[test]
    fn the_offline_buffer_keeps_the_newest_and_counts_the_oldest_it_drops() {
        let mut s = session(2, false);
        s.connected(Vec::new(), None);
        for seq in 1..=5 {
            s.accept(event(seq));
        }
        drain(&mut s);
        s.sent(1);
        s.sent(2);
        s.connection_lost(0);
        assert_eq!(count(&s, |m| &m.dropped_offline_overflow), 3);
        assert_eq!(seqs(&s.connected(Vec::new(), None)), some([4, 5]));
    }

    #[test]
    fn kept_frames_go_out_in_frame_order_whatever_the_client_gave_back() {
        let mut s = session(10, false);
        s.connected(Vec::new(), None);
        for seq in [1, 2, 3] {
            s.accept(event(seq));
        }
        drain(&mut s);
        s.sent(9);
        s.sent(4);
        s.sent(7);
        assert_eq!(s.acked(4).map(|a| a.0), None);
        s.connection_lost(0);
        let first = s.connected(Vec::new(), None);
        assert_eq!(seqs(&first), some([1, 3]));
        assert!(
            first.iter().all(|p| p.pkid == 0),
            "no packet id of the old session"
        );
    }

    #[test]
    fn outbox_frames_unacknowledged_at_a_lost_connection_come_again_from_flash() {
        let mut s = session(10, true);
        s.connected(Vec::new(), Some((1..=2).map(stored).collect()));
        s.sent(1);
        s.sent(2);
        assert_eq!(s.acked(1).map(|a| a.0), Some(1));
        s.connection_lost(0);
        assert!(s.wants_outbox(false));
        // Frame 1 is acknowledged and being removed: not handed over again.
        let first = s.connected(Vec::new(), Some((1..=2).map(stored).collect()));
        assert_eq!(seqs(&first), some([2]), "2 from flash, nothing kept twice");
        s.removed(1);
        s.sent(3);
        assert_eq!(s.acked(3).map(|a| a.0), Some(2));
        s.removed(2);
        assert!(s.settled());
    }

    #[test]
    fn a_puback_settles_exactly_the_publish_sent_with_its_packet_id() {
        let mut s = session(10, true);
        s.connected(Vec::new(), Some((1..=3).map(stored).collect()));
        s.sent(11);
        s.sent(12);
        s.sent(13);
        assert_eq!(s.acked(12).map(|a| a.0), Some(2));
        assert_eq!(s.unacknowledged(), 2);
        // Unknown and repeated acknowledgements change nothing.
        assert_eq!(s.acked(12).map(|a| a.0), None);
        assert_eq!(s.acked(99).map(|a| a.0), None);
        assert_eq!(s.unacknowledged(), 2);
        assert_eq!(s.acked(13).map(|a| a.0), Some(3));
        assert_eq!(s.acked(11).map(|a| a.0), Some(1));
        assert_eq!(s.unacknowledged(), 0);
        assert!(!s.settled(), "removal from flash still pending");
        for seq in 1..=3 {
            s.removed(seq);
        }
        assert!(s.settled());
    }

    #[test]
    fn a_wrapped_packet_id_settles_the_publish_sent_with_it_last() {
        let mut s = session(10, false);
        s.connected(Vec::new(), None);
        let max = MAX_INFLIGHT as u32;
        for seq in 1..=max + 1 {
            s.accept(event(seq));
        }
        drain(&mut s);
        for pkid in 1..=MAX_INFLIGHT {
            s.sent(pkid);
            s.acked(pkid);
        }
        // The id wrapped: 1 again, free since its publish was settled.
        s.sent(1);
        assert_eq!(s.unacknowledged(), 1);
        assert_eq!(count(&s, |m| &m.delivery_mismatch), 0);
        s.connection_lost(0);
        assert_eq!(seqs(&s.connected(Vec::new(), None)), some([max + 1]));
    }

    #[test]
    fn an_id_still_in_flight_sent_again_is_counted_as_a_bookkeeping_error() {
        let mut s = session(10, false);
        s.connected(Vec::new(), None);
        s.accept(event(1));
        s.accept(event(2));
        drain(&mut s);
        s.sent(5);
        s.sent(5);
        assert_eq!(count(&s, |m| &m.delivery_mismatch), 1);
        s.sent(6);
        assert_eq!(
            count(&s, |m| &m.delivery_mismatch),
            2,
            "a send nobody handed over"
        );
    }

    #[test]
    fn the_outbox_never_fills_more_of_the_window_than_packet_ids_leave_room_for() {
        let mut s = session(10, true);
        let all: Vec<Pending> = (1..=3000).map(stored).collect();
        let first = s.connected(vec![presence()], Some(all.clone()));
        let room = MAX_INFLIGHT as usize - INFLIGHT_MARGIN;
        assert_eq!(first.len(), room);
        assert!(s.wants_outbox(false), "the rest waits in flash");
        assert!(!s.wants_outbox(true), "not before half the window is free");
        for pkid in 1..=room as u16 {
            s.sent(pkid);
        }
        for pkid in 1..=(room / 2 + 1) as u16 {
            s.acked(pkid);
        }
        assert!(s.wants_outbox(true));
        let more = s.hand_over_first(0, Vec::new(), Some(all), Vec::new());
        assert!(s.unacknowledged() <= room, "{}", s.unacknowledged());
        // Frames 1 to room - 1 went first (with presence): the next one on.
        assert_eq!(seq_of(&more[0].payload), Some(room as u32));
    }

    #[test]
    fn retained_state_the_queue_refused_goes_out_only_when_newer() {
        let mut s = session(10, false);
        s.connected(Vec::new(), None);
        let health = |seq| Outgoing {
            topic: HEALTH.into(),
            retain: true,
            class: Class::Retained,
            ..event(seq)
        };
        s.accept(health(5));
        drain(&mut s);
        let mut unsent = Unsent::new();
        unsent.insert(HEALTH.into(), payload(4));
        s.offer_retained(&unsent);
        assert!(
            drain(&mut s).is_empty(),
            "an older state never goes after a newer"
        );
        unsent.insert(HEALTH.into(), payload(6));
        s.offer_retained(&unsent);
        assert_eq!(seqs(&drain(&mut s)), some([6]));
        // After a reconnection, the latest is announced again after presence.
        s.connection_lost(0);
        let first = s.connected(vec![presence()], None);
        assert_eq!(seqs(&first).last(), Some(&Some(6)));
    }

    /// The frame counter wrapped (u32::MAX, then 0): the state numbered 0
    /// is the newer, and goes out; one from before the wrap does not.
    #[test]
    fn retained_state_after_the_counter_wraps_is_newer() {
        let mut s = session(10, false);
        s.connected(Vec::new(), None);
        let health = |seq| Outgoing {
            topic: HEALTH.into(),
            retain: true,
            class: Class::Retained,
            ..event(seq)
        };
        s.accept(health(u32::MAX));
        assert_eq!(seqs(&drain(&mut s)), some([u32::MAX]));
        s.accept(health(0));
        assert_eq!(seqs(&drain(&mut s)), some([0]));
        s.accept(health(u32::MAX - 1));
        assert!(drain(&mut s).is_empty(), "from before the wrap: older");
    }

    /// Health seq 6 went round the full command channel (the watch is
    /// read first); seq 5, taken from the channel after it, is older.
    #[test]
    fn retained_state_older_than_the_one_held_is_not_published_after_it() {
        let mut s = session(10, false);
        s.connected(Vec::new(), None);
        let mut unsent = Unsent::new();
        unsent.insert(HEALTH.into(), payload(6));
        s.offer_retained(&unsent);
        assert_eq!(seqs(&drain(&mut s)), some([6]));
        s.sent(1);
        s.acked(1);
        s.accept(Outgoing {
            topic: HEALTH.into(),
            retain: true,
            class: Class::Retained,
            ..event(5)
        });
        assert!(
            drain(&mut s).is_empty(),
            "an older state never goes after a newer"
        );
        s.connection_lost(0);
        let first = s.connected(vec![presence()], None);
        assert_eq!(seqs(&first), vec![Some(0), Some(6)], "seq 6 announced");
    }

    #[test]
    fn leaving_queues_the_goodbye_then_the_disconnection() {
        let mut s = session(10, false);
        s.connected(Vec::new(), None);
        s.leave(vec![presence()]);
        assert!(matches!(s.next_queued(), Some(Queued::Publish(_))));
        s.queued();
        assert_eq!(s.next_queued(), Some(&Queued::Disconnect));
    }

    /// One step of the property test.
    #[derive(Debug, Clone)]
    enum Step {
        Accept,
        Telemetry,
        Place,
        Send,
        Ack(usize),
        AckUnknown,
        Lose,
        Reconnect,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => Just(Step::Accept),
            1 => Just(Step::Telemetry),
            3 => Just(Step::Place),
            3 => Just(Step::Send),
            3 => any::<usize>().prop_map(Step::Ack),
            1 => Just(Step::AckUnknown),
            1 => Just(Step::Lose),
            1 => Just(Step::Reconnect),
        ]
    }

    /// The QoS 1 frames the session still holds, in any state.
    fn held(s: &Session) -> Vec<u32> {
        let waiting = s.waiting.iter().filter_map(|q| match q {
            Queued::Publish(h) if h.publish.qos != QoS::AtMostOnce => Some(&h.publish),
            _ => None,
        });
        waiting
            .chain(s.order.iter().map(|h| &h.publish))
            .chain(s.inflight.iter().map(|(_, h)| &h.publish))
            .chain(s.kept.iter())
            .filter_map(|p| seq_of(&p.payload))
            .collect()
    }

    fn check_sent(sent: &[Publish], acked: &BTreeSet<u32>) -> Result<(), TestCaseError> {
        for seq in sent.iter().filter_map(|p| seq_of(&p.payload)) {
            prop_assert!(!acked.contains(&seq), "{} sent again after its ack", seq);
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn no_qos1_frame_is_lost_silently_nor_resent_once_acknowledged(
            steps in proptest::collection::vec(step(), 1..200),
            capacity in 1usize..20,
        ) {
            let mut s = session(capacity, false);
            s.connected(Vec::new(), None);
            let mut next = 1u32;
            let mut accepted = BTreeSet::new();
            let mut acked = BTreeSet::new();
            let mut pkid = 0u16;
            let mut lost_links = 0;
            for st in steps {
                match st {
                    Step::Accept => {
                        s.accept(event(next));
                        accepted.insert(next);
                        next += 1;
                    }
                    Step::Telemetry => {
                        s.accept(telemetry(next));
                        next += 1;
                    }
                    Step::Place => {
                        let sent = drain(&mut s);
                        check_sent(&sent, &acked)?;
                    }
                    Step::Send => {
                        if !s.order.is_empty() {
                            // The client's ids: the next one not in flight.
                            loop {
                                pkid = pkid % MAX_INFLIGHT + 1;
                                if !s.inflight.iter().any(|(p, _)| *p == pkid) {
                                    break;
                                }
                            }
                            s.sent(pkid);
                        }
                    }
                    Step::Ack(i) => {
                        if !s.inflight.is_empty() {
                            let (id, h) = s.inflight[i % s.inflight.len()].clone();
                            s.acked(id);
                            if let Some(seq) = seq_of(&h.publish.payload) {
                                acked.insert(seq);
                            }
                        }
                    }
                    Step::AckUnknown => {
                        let before = s.unacknowledged();
                        s.acked(MAX_INFLIGHT + 1);
                        prop_assert_eq!(s.unacknowledged(), before);
                    }
                    Step::Lose => {
                        if s.link_up {
                            s.connection_lost(0);
                            lost_links += 1;
                        }
                    }
                    Step::Reconnect => {
                        if !s.link_up {
                            let sent = s.connected(Vec::new(), None);
                            check_sent(&sent, &acked)?;
                        }
                    }
                }
            }
            prop_assert_eq!(count(&s, |m| &m.delivery_mismatch), 0);
            let held: BTreeSet<u32> = held(&s).into_iter().collect();
            let dropped = count(&s, |m| &m.dropped_offline_overflow) as usize;
            let missing: Vec<u32> = accepted
                .iter()
                .filter(|q| !acked.contains(q) && !held.contains(q))
                .copied()
                .collect();
            prop_assert_eq!(
                missing.len(), dropped,
                "neither acknowledged, nor held, nor counted: {:?} ({} links lost)",
                missing, lost_links
            );
            prop_assert!(acked.iter().all(|q| !held.contains(q)), "an acknowledged frame is still held");
        }
    }
}
