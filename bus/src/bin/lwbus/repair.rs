//! What `lwbus watch --sign-key` does with each frame to repair the gaps
//! it sees, and whom it asks for what. Pure: the frames and the time are
//! passed in; the loop in [`super::watch`] prints and publishes.
//!
//! Every frame a host or CDU publishes on the frame tree is numbered from
//! its one counter, so a number never heard from it is a hole
//! (`docs/bus.md` section 4.7). Each round the [`Asker`] says which holes
//! to ask a sender for; the sender publishes the events of them again on
//! its `resent` topic, with their original number, time and CRC, then a
//! report. A resent frame is shown only when it fills a hole: the same
//! frame resent for another reader, or asked twice, is not new.
//!
//! A frame counts only on a topic its sender owns (its role and id are
//! the topic's), but for commands and resend requests, whose topic names
//! the node addressed: anything else is a forgery (a sender writing in
//! another's name where the ACL lets it), tracked and answered never, and
//! said ([`Verdict::NotOwner`]).
//!
//! Glossary:
//! - *track*: one sender's numbers as heard ([`SeqTrack`]).
//! - *repaired*: a frame first heard as resent.

use std::collections::HashMap;

use loopwarden_bus::resend::Asker;
use loopwarden_protocol::seq::SeqTrack;
use loopwarden_protocol::{Family, Frame, Message, NodeId, ResendCode, Role, TimestampMs, Topic};

/// What to do with a frame heard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Print it as usual.
    Print,
    /// Print it, marked resent: it fills a hole.
    Repaired,
    /// Leave it out: a resent frame heard before (or before the watch
    /// began), or one of a sender not tracked.
    Again,
    /// Print it as usual (a report to this reader), and say once that
    /// its sender refuses this reader's requests, and why.
    Refused(ResendCode),
    /// Leave it out and say so: its sender does not own the topic it came
    /// on (see the module note).
    NotOwner,
}

/// The tracks of the senders heard and the requests asked of them.
#[derive(Debug)]
pub struct Repair {
    /// This reader, as its requests are signed.
    me: NodeId,
    tracks: HashMap<NodeId, SeqTrack>,
    asker: Asker,
    repaired: u64,
}

/// Only hosts and CDUs own a subtree and keep a log to resend from.
fn tracked(sender: &NodeId) -> bool {
    matches!(sender.role, Role::Host | Role::Cdu)
}

/// Whether `frame`'s sender may publish on `topic`: its own topics, and
/// commands and resend requests to anyone.
fn may_publish_on(topic: &Topic, frame: &Frame) -> bool {
    let owner = frame.sender.role == topic.role && frame.sender.id == topic.node;
    owner || matches!(topic.family, Family::Cmd | Family::Resend)
}

impl Repair {
    /// Repairs for the reader `me` (the node of its sign key).
    pub fn new(me: NodeId) -> Self {
        Self {
            me,
            tracks: HashMap::new(),
            asker: Asker::default(),
            repaired: 0,
        }
    }

    /// Notes `frame`, received on `topic`, and says what to do with it.
    pub fn hear(&mut self, topic: &Topic, frame: &Frame) -> Verdict {
        if topic.json || !tracked(&frame.sender) {
            return Verdict::Print;
        }
        if !may_publish_on(topic, frame) {
            return Verdict::NotOwner;
        }
        if topic.family != Family::Resent {
            self.hear_live(topic, frame);
            return Verdict::Print;
        }
        if let Message::ResendReport(report) = &frame.message {
            // A report is a new frame of its sender, numbered as any.
            self.track(&frame.sender).hear(frame);
            if report.correlation.from != self.me {
                return Verdict::Print;
            }
            return match self.asker.answered(&self.me, &frame.sender, report) {
                Some(code) => Verdict::Refused(code),
                None => Verdict::Print,
            };
        }
        self.asker.resent(&frame.sender, frame.seq);
        match self.tracks.get_mut(&frame.sender) {
            Some(track) if track.is_hole(frame.seq) => {
                track.hear(frame);
                self.repaired += 1;
                Verdict::Repaired
            }
            _ => Verdict::Again,
        }
    }

    /// Notes a frame of the frame tree. A retained one (health, presence)
    /// may be older than the watch, or than its last connection: it
    /// starts no track and extends none downwards, which would make the
    /// numbers since it holes.
    fn hear_live(&mut self, topic: &Topic, frame: &Frame) {
        let lowest = self
            .tracks
            .get(&frame.sender)
            .and_then(SeqTrack::range)
            .map(|(lo, _)| lo);
        if topic.family.retained() && lowest.is_none_or(|lo| frame.seq < lo) {
            return;
        }
        self.track(&frame.sender).hear(frame);
    }

    fn track(&mut self, sender: &NodeId) -> &mut SeqTrack {
        self.tracks.entry(sender.clone()).or_default()
    }

    /// The requests due at `now`: whom to ask, and for which range.
    pub fn due(&mut self, now: TimestampMs) -> Vec<(NodeId, u32, u32)> {
        let mut due = Vec::new();
        for (sender, track) in &self.tracks {
            if let Some((from, to)) = self.asker.due(now, sender, track) {
                due.push((sender.clone(), from, to));
            }
        }
        due.sort_by_key(|(sender, _, _)| sender.to_string());
        due
    }

    /// Frames repaired so far.
    pub fn repaired(&self) -> u64 {
        self.repaired
    }

    /// The line that says `frame`, heard on `topic`, counts for nothing.
    pub fn not_owner(topic: &Topic, frame: &Frame) -> String {
        let on = topic
            .build()
            .map_or_else(|e| format!("a topic ({e})"), |t| t.to_string());
        format!(
            "lwbus: a frame of {} (seq {}) on {on} ignored: a sender publishes only on its own \
             topics; not shown, not counted, not answered",
            frame.sender, frame.seq
        )
    }

    /// The line that says `sender` refuses this reader's requests.
    pub fn refusal(&self, sender: &NodeId, code: ResendCode) -> String {
        if code == ResendCode::Replayed {
            return format!(
                "lwbus: {sender} refuses this reader's resend request as replayed: is this \
                 machine's clock within 5 minutes of {sender}'s? (a request stamped further off \
                 is refused); asked again"
            );
        }
        let why = match code {
            ResendCode::Forbidden => format!(
                "its keyring does not let {} ask for resends (`may = [\"resend\"]`)",
                self.me
            ),
            _ => format!(
                "its keyring holds no key of {} that verifies this one (a key id or key \
                 it does not know)",
                self.me
            ),
        };
        let minutes = loopwarden_bus::resend::ask::REFUSED_RETRY_MS / 60_000;
        format!(
            "lwbus: {sender} refuses this reader's resend requests ({code}): {why}; its gaps are \
             not repaired while it refuses (asked again every {minutes} minutes)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::{samples, Correlation, Ident, MessageKind, ResendReport};

    fn h1() -> NodeId {
        NodeId::new(Role::Host, "h1").unwrap()
    }

    fn me() -> NodeId {
        NodeId::new(Role::Facility, "bms1").unwrap()
    }

    fn topic(node: &NodeId, family: Family) -> Topic {
        Topic::new(&Ident::new("lab").unwrap(), node.role, &node.id, family)
    }

    fn event(seq: u32) -> (Topic, Frame) {
        let mut f = samples::frame(MessageKind::Event);
        f.sender = h1();
        f.seq = seq;
        (topic(&h1(), Family::Event), f)
    }

    fn resent(seq: u32) -> (Topic, Frame) {
        let (_, f) = event(seq);
        (topic(&h1(), Family::Resent), f)
    }

    fn report(seq: u32, to: &NodeId, code: ResendCode, range: (u32, u32)) -> (Topic, Frame) {
        let message = Message::ResendReport(ResendReport {
            correlation: Correlation {
                from: to.clone(),
                seq: 1,
            },
            code,
            from: range.0,
            to: range.1,
            resent: 0,
            held_from: Some(1),
            next: None,
        });
        let (t, mut f) = resent(seq);
        f.message = message;
        (t, f)
    }

    fn hear(r: &mut Repair, (t, f): (Topic, Frame)) -> Verdict {
        r.hear(&t, &f)
    }

    const T: TimestampMs = TimestampMs(1_800_000_000_000);

    #[test]
    fn a_resent_frame_is_shown_once_and_only_when_it_fills_a_hole() {
        let mut r = Repair::new(me());
        for seq in [10, 11, 14] {
            assert_eq!(hear(&mut r, event(seq)), Verdict::Print);
        }
        assert_eq!(hear(&mut r, resent(12)), Verdict::Repaired);
        assert_eq!(hear(&mut r, resent(12)), Verdict::Again, "resent twice");
        assert_eq!(hear(&mut r, resent(11)), Verdict::Again, "heard before");
        assert_eq!(hear(&mut r, resent(9)), Verdict::Again, "before the watch");
        assert_eq!(
            hear(&mut r, resent(20)),
            Verdict::Again,
            "not yet heard past"
        );
        assert_eq!(r.repaired(), 1);
        // A frame resent on another node's topic fills nothing.
        let (mut t, f) = resent(13);
        t.node = Ident::new("h2").unwrap();
        assert_eq!(r.hear(&t, &f), Verdict::NotOwner);
        assert_eq!(hear(&mut r, resent(13)), Verdict::Repaired);
        // Nor one in another's name.
        let (t, mut f) = resent(5);
        f.sender = NodeId::new(Role::Cdu, "cdu-a").unwrap();
        assert_eq!(r.hear(&t, &f), Verdict::NotOwner);
    }

    #[test]
    fn frames_in_another_nodes_name_are_neither_tracked_nor_answered() {
        let mut r = Repair::new(me());
        for seq in [1, 3] {
            hear(&mut r, event(seq));
        }
        r.due(T);
        assert_eq!(r.due(TimestampMs(T.0 + 2_000)), [(h1(), 2, 2)]);
        // h2, on its own topics, in h1's name: a report refusing this
        // reader and a live event. Neither answers nor extends h1's track.
        let h2 = NodeId::new(Role::Host, "h2").unwrap();
        let (_, f) = report(4, &me(), ResendCode::Forbidden, (2, 2));
        let on_h2 = topic(&h2, Family::Resent);
        assert_eq!(r.hear(&on_h2, &f), Verdict::NotOwner);
        let (_, f) = event(500);
        assert_eq!(r.hear(&topic(&h2, Family::Event), &f), Verdict::NotOwner);
        assert_eq!(r.tracks[&h1()].range(), Some((1, 3)), "h1's track as heard");
        assert!(!r.tracks.contains_key(&h2), "nothing of h2's heard");
        // The refusal was not taken: h1 is asked again.
        assert_eq!(r.due(TimestampMs(T.0 + 60_000)), [(h1(), 2, 2)]);
        // h1's own report on its own topic is taken.
        assert_eq!(
            hear(&mut r, report(5, &me(), ResendCode::Forbidden, (2, 2))),
            Verdict::Refused(ResendCode::Forbidden)
        );
        let line = Repair::not_owner(&on_h2, &f);
        assert!(
            line.contains("host/h1") && line.contains("host/h2"),
            "{line}"
        );
        // A CDU's command to a host is the CDU's, on the host's topic.
        let mut lease = samples::frame(MessageKind::CapLease);
        lease.sender = NodeId::new(Role::Cdu, "cdu-a").unwrap();
        assert_eq!(r.hear(&topic(&h1(), Family::Cmd), &lease), Verdict::Print);
    }

    #[test]
    fn holes_are_asked_for_after_a_round_and_a_report_numbers_as_a_frame() {
        let mut r = Repair::new(me());
        for seq in [1, 2, 5] {
            hear(&mut r, event(seq));
        }
        assert!(r.due(T).is_empty(), "the first round: they may still come");
        assert_eq!(r.due(TimestampMs(T.0 + 2_000)), [(h1(), 3, 4)]);
        assert_eq!(hear(&mut r, resent(3)), Verdict::Repaired);
        let ok = report(6, &me(), ResendCode::Ok, (3, 4));
        assert_eq!(hear(&mut r, ok), Verdict::Print);
        hear(&mut r, event(7));
        assert!(
            r.due(TimestampMs(T.0 + 4_000)).is_empty(),
            "6 was the report"
        );
        assert!(r.due(TimestampMs(T.0 + 6_000)).is_empty(), "4 is settled");
    }

    #[test]
    fn a_refusal_is_said_once_and_only_when_it_answers_this_reader() {
        let mut r = Repair::new(me());
        for seq in [1, 3] {
            hear(&mut r, event(seq));
        }
        r.due(T);
        assert_eq!(r.due(TimestampMs(T.0 + 2_000)), [(h1(), 2, 2)]);
        let other = NodeId::new(Role::Operator, "ops1").unwrap();
        let theirs = report(4, &other, ResendCode::Forbidden, (2, 2));
        assert_eq!(hear(&mut r, theirs), Verdict::Print);
        let mine = report(5, &me(), ResendCode::Unauthenticated, (2, 2));
        assert_eq!(
            hear(&mut r, mine),
            Verdict::Refused(ResendCode::Unauthenticated)
        );
        let again = report(6, &me(), ResendCode::Unauthenticated, (2, 2));
        assert_eq!(hear(&mut r, again), Verdict::Print, "said once");
        assert!(
            r.due(TimestampMs(T.0 + 60_000)).is_empty(),
            "not while the refusal stands"
        );
        let line = r.refusal(&h1(), ResendCode::Forbidden);
        assert!(line.contains("host/h1 refuses"), "{line}");
        assert!(line.contains("facility/bms1"), "{line}");
        assert!(line.contains("asked again every 10 minutes"), "{line}");
    }

    #[test]
    fn a_retained_frame_older_than_the_watch_makes_no_holes() {
        let mut r = Repair::new(me());
        let mut health = samples::frame(MessageKind::HostHealth);
        health.sender = h1();
        let on_health = topic(&h1(), Family::Health);
        // Retained from long before: no track yet.
        health.seq = 100;
        assert_eq!(r.hear(&on_health, &health), Verdict::Print);
        for seq in [5_000, 5_002] {
            hear(&mut r, event(seq));
        }
        // After a reconnection, the same retained frame again.
        assert_eq!(r.hear(&on_health, &health), Verdict::Print);
        r.due(T);
        assert_eq!(r.due(TimestampMs(T.0 + 2_000)), [(h1(), 5_001, 5_001)]);
        // A live one fills the hole it is.
        health.seq = 5_001;
        r.hear(&on_health, &health);
        assert_eq!(r.tracks[&h1()].holes(), 0);
    }

    #[test]
    fn readers_and_operators_are_not_tracked() {
        let mut r = Repair::new(me());
        let ops = NodeId::new(Role::Operator, "ops1").unwrap();
        let mut f = samples::frame(MessageKind::ResendRequest);
        f.sender = ops;
        for seq in [1, 1_000, 5_000] {
            f.seq = seq;
            assert_eq!(r.hear(&topic(&h1(), Family::Resend), &f), Verdict::Print);
        }
        r.due(T);
        assert!(r.due(TimestampMs(T.0 + 2_000)).is_empty());
    }
}
