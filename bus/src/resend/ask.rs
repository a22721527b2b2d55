//! The asker: when a reader asks a sender for the numbers it missed.
//! Pure: a function of each sender's track and the time passed in.
//!
//! A hole is asked for once the reader has heard past it for a whole
//! round (a frame of another topic may overtake it on the way), and only
//! if rule 1 of the protocol (a will's number) does not account for it.
//! One request per sender at a time covers its holes from the lowest to
//! the highest; it is asked again after [`RETRY_MS`] without a report.
//! A sender that refuses this reader (unauthenticated, forbidden) is not
//! asked for [`REFUSED_RETRY_MS`] from the request it refused, then asked
//! again: a key rotation may have given it this reader's key meanwhile.
//! Holes a report covered are settled: the sender resent what of them
//! were events, and the rest were frames it need not resend (telemetry, or
//! numbers it spent without a frame). Unless fewer resent frames of the
//! range came than the report says went out: the broker lost some of the
//! repair too, and the range is asked for again. Frames are counted by
//! their distinct numbers: a frame heard twice (resent again for another
//! reader that asked an overlapping range) counts once. Only the report
//! of the range asked settles anything: a late report of an earlier,
//! other range was counted against no frames heard.
//!
//! Glossary:
//! - *round*: the time between two calls of [`Asker::due`].
//! - *covered*: the highest number a report has answered for.

use std::collections::{BTreeSet, HashMap};

use loopwarden_protocol::seq::SeqTrack;
use loopwarden_protocol::{NodeId, ResendCode, ResendReport, TimestampMs, RESEND_SPAN_MAX};

/// How long a request waits for its report before it is asked again.
pub const RETRY_MS: u64 = 10_000;

/// How long a sender's refusal of this reader (unauthenticated,
/// forbidden) stands, from the request it answered, before the sender is
/// asked again: its keyring may have changed since (a key rotation).
pub const REFUSED_RETRY_MS: u64 = 10 * 60_000;

/// One sender, as asked.
#[derive(Debug, Clone, Default)]
struct Asking {
    /// The highest number heard at the last round.
    seen_through: Option<u32>,
    /// The highest number a report answered for.
    covered: Option<u32>,
    /// The request waiting for its report: its range and when it went.
    asked: Option<(u32, u32, TimestampMs)>,
    /// The distinct numbers of the asked range heard resent since it
    /// was asked.
    heard: BTreeSet<u32>,
    /// The sender refuses this reader: its answer, and the time of the
    /// request it answered (or of the next round, when none waited).
    refused: Option<(ResendCode, Option<TimestampMs>)>,
    /// The refusal said since the sender last served this reader.
    refusal_said: Option<ResendCode>,
    /// The lowest number the sender's log still holds an event of.
    held_from: Option<u32>,
    /// Our newest request was refused as replayed, and that was said.
    replayed_said: bool,
}

/// A reader's requests, per sender.
#[derive(Debug, Clone, Default)]
pub struct Asker {
    senders: HashMap<NodeId, Asking>,
}

impl Asker {
    /// The range to ask `sender` for now, given its `track`, if any.
    pub fn due(
        &mut self,
        now: TimestampMs,
        sender: &NodeId,
        track: &SeqTrack,
    ) -> Option<(u32, u32)> {
        let a = self.senders.entry(sender.clone()).or_default();
        let seen_through = a.seen_through;
        a.seen_through = track.highest();
        if let Some((_, since)) = &mut a.refused {
            let since = *since.get_or_insert(now);
            if now.0.saturating_sub(since.0) < REFUSED_RETRY_MS {
                return None;
            }
            // Asked afresh: the holes as they are now.
            a.refused = None;
            a.asked = None;
        }
        if let Some((from, to, at)) = a.asked {
            if now.0.saturating_sub(at.0) < RETRY_MS {
                return None;
            }
            a.asked = Some((from, to, now));
            a.heard.clear();
            return Some((from, to));
        }
        let ripe =
            |h: &u32| seen_through.is_some_and(|s| *h <= s) && a.covered.is_none_or(|c| *h > c);
        let mut holes = track.unexplained_holes().filter(ripe);
        let from = holes.next()?;
        let to = holes
            .last()
            .unwrap_or(from)
            .min(from.saturating_add(RESEND_SPAN_MAX - 1));
        a.asked = Some((from, to, now));
        a.heard.clear();
        Some((from, to))
    }

    /// A frame `sender` resent, numbered `seq`, came (filling a hole or
    /// not; a number heard again counts once).
    pub fn resent(&mut self, sender: &NodeId, seq: u32) {
        if let Some(a) = self.senders.get_mut(sender) {
            if a.asked.is_some_and(|(f, t, _)| (f..=t).contains(&seq)) {
                a.heard.insert(seq);
            }
        }
    }

    /// `sender` answered with `report`, heard by this reader, `me`.
    /// Returns the code when the sender refuses this reader (no key it
    /// knows, or no right), for the caller to say: once until the sender
    /// serves this reader again or refuses it otherwise, though it is
    /// asked again every [`REFUSED_RETRY_MS`]; and, once
    /// per sender, when it refuses our newest request as replayed (a clock
    /// far from the sender's is the likely cause: asked again meanwhile).
    /// Every reader hears every report on the sender's `resent` topic: one
    /// for another reader's request tells only where the sender's log
    /// starts, and settles and refuses nothing of this reader's.
    pub fn answered(
        &mut self,
        me: &NodeId,
        sender: &NodeId,
        report: &ResendReport,
    ) -> Option<ResendCode> {
        let a = self.senders.entry(sender.clone()).or_default();
        if report.held_from.is_some() {
            a.held_from = report.held_from;
        }
        if report.correlation.from != *me {
            return None;
        }
        let asked_at = a.asked.map(|(_, _, at)| at);
        let ours = a
            .asked
            .is_some_and(|(f, t, _)| (f, t) == (report.from, report.to));
        if ours {
            a.asked = None;
        }
        let served = matches!(report.code, ResendCode::Ok | ResendCode::Limited);
        if served {
            a.refusal_said = None;
        }
        let heard = u32::try_from(a.heard.len()).unwrap_or(u32::MAX);
        if ours && served && heard < report.resent {
            // Some of the repair was lost on the way: ask again.
            return None;
        }
        let through = match report.code {
            // A report of another range than the one asked (a late one
            // of an earlier request) was counted against no frames heard:
            // it settles nothing.
            ResendCode::Ok | ResendCode::Malformed | ResendCode::Limited if !ours => None,
            ResendCode::Ok | ResendCode::Malformed => Some(report.to),
            ResendCode::Limited => Some(report.next.map_or(report.to, |n| n.saturating_sub(1))),
            ResendCode::Unauthenticated | ResendCode::Forbidden => {
                // A refusal heard again keeps the time of the first.
                let since = asked_at.or_else(|| a.refused.and_then(|(_, s)| s));
                a.refused = Some((report.code, since));
                let said = a.refusal_said.replace(report.code);
                return (said != Some(report.code)).then_some(report.code);
            }
            ResendCode::Replayed if ours => {
                let first = !std::mem::replace(&mut a.replayed_said, true);
                return first.then_some(ResendCode::Replayed);
            }
            ResendCode::Replayed | ResendCode::Unavailable => None,
        };
        if let Some(t) = through {
            a.covered = Some(a.covered.map_or(t, |c| c.max(t)));
        }
        None
    }

    /// The lowest number `sender`'s log held an event of, as last reported.
    pub fn held_from(&self, sender: &NodeId) -> Option<u32> {
        self.senders.get(sender).and_then(|a| a.held_from)
    }

    /// Requests waiting for their report.
    pub fn waiting(&self) -> usize {
        self.senders.values().filter(|a| a.asked.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::{Correlation, Role};

    fn h1() -> NodeId {
        NodeId::new(Role::Host, "h1").unwrap()
    }

    fn track(seqs: &[u32]) -> SeqTrack {
        let mut t = SeqTrack::default();
        for s in seqs {
            t.hear_seq(*s);
        }
        t
    }

    /// The reader.
    fn me() -> NodeId {
        NodeId::new(Role::Facility, "r").unwrap()
    }

    fn report(code: ResendCode, from: u32, to: u32, next: Option<u32>) -> ResendReport {
        ResendReport {
            correlation: Correlation { from: me(), seq: 1 },
            code,
            from,
            to,
            resent: 0,
            held_from: Some(1),
            next,
        }
    }

    const T: TimestampMs = TimestampMs(1_000_000);

    fn at(ms: u64) -> TimestampMs {
        TimestampMs(T.0 + ms)
    }

    #[test]
    fn a_hole_is_asked_for_after_a_round_and_once_until_answered() {
        let mut a = Asker::default();
        let t = track(&[1, 2, 4, 5, 8]);
        assert_eq!(a.due(T, &h1(), &t), None, "first round: may still come");
        assert_eq!(a.due(at(1), &h1(), &t), Some((3, 7)));
        assert_eq!(a.due(at(2), &h1(), &t), None, "waiting for the report");
        assert_eq!(
            a.due(at(RETRY_MS + 1), &h1(), &t),
            Some((3, 7)),
            "no report: asked again"
        );
        assert_eq!(
            a.answered(&me(), &h1(), &report(ResendCode::Ok, 3, 7, None)),
            None
        );
        assert_eq!(a.due(at(RETRY_MS + 2), &h1(), &t), None, "settled");
        let t = track(&[1, 2, 4, 5, 8, 9, 11, 12]);
        assert_eq!(a.due(at(RETRY_MS + 3), &h1(), &t), None, "10 is new");
        assert_eq!(a.due(at(RETRY_MS + 4), &h1(), &t), Some((10, 10)));
    }

    #[test]
    fn a_repair_the_broker_lost_part_of_is_asked_for_again() {
        let mut a = Asker::default();
        let t = track(&[1, 5]);
        a.due(T, &h1(), &t);
        assert_eq!(a.due(at(1), &h1(), &t), Some((2, 4)));
        a.resent(&h1(), 3);
        let mut r = report(ResendCode::Ok, 2, 4, None);
        r.resent = 2;
        a.answered(&me(), &h1(), &r);
        assert_eq!(a.due(at(2), &h1(), &t), Some((2, 4)), "one of two came");
        a.resent(&h1(), 2);
        a.resent(&h1(), 9); // not of the range
        a.resent(&h1(), 4);
        a.answered(&me(), &h1(), &r);
        assert_eq!(a.due(at(3), &h1(), &t), None, "both came: settled");
    }

    /// Another reader asked an overlapping range: the sender resent 12
    /// twice, once for each, and our 15 was lost (10 and 20 were no
    /// events). Two frames heard, but one number: the report's two are
    /// not all here.
    #[test]
    fn a_frame_resent_twice_counts_once() {
        let mut a = Asker::default();
        let t = track(&[9, 11, 12, 13, 14, 16, 17, 18, 19, 21]);
        a.due(T, &h1(), &t);
        assert_eq!(a.due(at(1), &h1(), &t), Some((10, 20)));
        a.resent(&h1(), 12);
        a.resent(&h1(), 12);
        let mut r = report(ResendCode::Ok, 10, 20, None);
        r.resent = 2;
        a.answered(&me(), &h1(), &r);
        assert_eq!(
            a.due(at(2), &h1(), &t),
            Some((10, 20)),
            "15 never came: asked again"
        );
        a.resent(&h1(), 12);
        a.resent(&h1(), 15);
        a.answered(&me(), &h1(), &r);
        let t = track(&[9, 11, 12, 13, 14, 15, 16, 17, 18, 19, 21]);
        assert_eq!(a.due(at(3), &h1(), &t), None, "both came: settled");
    }

    /// A late report of an earlier, wider request settles nothing: no
    /// frames were counted against its range, so a hole in it found
    /// later is still asked for.
    #[test]
    fn a_late_report_of_another_range_settles_nothing() {
        let mut a = Asker::default();
        let t = track(&[1, 5]);
        a.due(T, &h1(), &t);
        assert_eq!(a.due(at(1), &h1(), &t), Some((2, 4)));
        let late = report(ResendCode::Ok, 1, 20, None);
        a.answered(&me(), &h1(), &late);
        assert_eq!(a.waiting(), 1, "ours still waits for its report");
        a.answered(&me(), &h1(), &report(ResendCode::Ok, 2, 4, None));
        let t = track(&[1, 5, 6, 7, 8, 9, 11, 12]);
        assert_eq!(a.due(at(2), &h1(), &t), None, "10 is new");
        assert_eq!(a.due(at(3), &h1(), &t), Some((10, 10)), "not settled");
    }

    #[test]
    fn a_limited_answer_is_asked_again_from_where_it_stopped() {
        let mut a = Asker::default();
        let t = track(&[1, 5, 9]);
        a.due(T, &h1(), &t);
        assert_eq!(a.due(at(1), &h1(), &t), Some((2, 8)));
        a.answered(&me(), &h1(), &report(ResendCode::Limited, 2, 8, Some(6)));
        assert_eq!(a.due(at(2), &h1(), &t), Some((6, 8)));
    }

    /// A refusal stands for [`REFUSED_RETRY_MS`] from the request it
    /// answered, then the sender is asked again (its keyring may have
    /// changed in a rotation); a node that still refuses is not said
    /// again, one that served us since, or that refuses otherwise, is.
    #[test]
    fn a_refusal_stands_for_a_while_and_is_said_once_while_it_lasts() {
        let mut a = Asker::default();
        let t = track(&[1, 5]);
        a.due(T, &h1(), &t);
        assert_eq!(a.due(at(1), &h1(), &t), Some((2, 4)));
        let r = report(ResendCode::Forbidden, 2, 4, None);
        assert_eq!(a.answered(&me(), &h1(), &r), Some(ResendCode::Forbidden));
        assert_eq!(a.answered(&me(), &h1(), &r), None, "said once");
        assert_eq!(a.due(at(RETRY_MS * 2), &h1(), &t), None, "refused");
        assert_eq!(a.due(at(REFUSED_RETRY_MS), &h1(), &t), None, "refused");
        assert_eq!(
            a.due(at(REFUSED_RETRY_MS + 1), &h1(), &t),
            Some((2, 4)),
            "the refusal expired: asked again"
        );
        assert_eq!(
            a.answered(&me(), &h1(), &r),
            None,
            "still refuses: not said"
        );
        let again = at(2 * REFUSED_RETRY_MS);
        assert_eq!(a.due(again, &h1(), &t), None, "from the second request on");
        assert_eq!(a.due(at(2 * REFUSED_RETRY_MS + 2), &h1(), &t), Some((2, 4)));
        let other = report(ResendCode::Unauthenticated, 2, 4, None);
        assert_eq!(
            a.answered(&me(), &h1(), &other),
            Some(ResendCode::Unauthenticated),
            "another refusal is said"
        );
        assert_eq!(a.due(at(3 * REFUSED_RETRY_MS + 3), &h1(), &t), Some((2, 4)));
        a.answered(&me(), &h1(), &report(ResendCode::Limited, 2, 4, Some(3)));
        assert_eq!(a.due(at(3 * REFUSED_RETRY_MS + 4), &h1(), &t), Some((3, 4)));
        assert_eq!(
            a.answered(
                &me(),
                &h1(),
                &report(ResendCode::Unauthenticated, 3, 4, None)
            ),
            Some(ResendCode::Unauthenticated),
            "served in between: a new refusal, said again"
        );
    }

    /// Every reader hears the sender's reports: a refusal of another
    /// reader's request (the same range, even) neither stops this one
    /// asking nor settles its holes.
    #[test]
    fn a_report_for_another_readers_request_is_not_this_readers() {
        let mut a = Asker::default();
        let t = track(&[1, 5]);
        a.due(T, &h1(), &t);
        assert_eq!(a.due(at(1), &h1(), &t), Some((2, 4)));
        let other = NodeId::new(Role::Facility, "other").unwrap();
        for code in [ResendCode::Forbidden, ResendCode::Ok] {
            let mut r = report(code, 2, 4, None);
            r.correlation.from = other.clone();
            r.held_from = Some(3);
            assert_eq!(a.answered(&me(), &h1(), &r), None, "{code}");
        }
        assert_eq!(
            a.held_from(&h1()),
            Some(3),
            "the sender's log, whoever asked"
        );
        assert_eq!(a.waiting(), 1, "ours still waits for its report");
        assert_eq!(
            a.due(at(RETRY_MS + 1), &h1(), &t),
            Some((2, 4)),
            "asked again: not refused, not settled"
        );
        let r = report(ResendCode::Forbidden, 2, 4, None);
        assert_eq!(
            a.answered(&me(), &h1(), &r),
            Some(ResendCode::Forbidden),
            "our own refusal is said"
        );
    }

    /// Our request refused as replayed (this machine's clock far from the
    /// sender's): said once, and asked again.
    #[test]
    fn a_request_refused_as_replayed_is_said_once_and_asked_again() {
        let mut a = Asker::default();
        let t = track(&[1, 5]);
        a.due(T, &h1(), &t);
        assert_eq!(a.due(at(1), &h1(), &t), Some((2, 4)));
        let r = report(ResendCode::Replayed, 2, 4, None);
        assert_eq!(a.answered(&me(), &h1(), &r), Some(ResendCode::Replayed));
        assert_eq!(
            a.due(at(RETRY_MS + 2), &h1(), &t),
            Some((2, 4)),
            "asked again"
        );
        assert_eq!(a.answered(&me(), &h1(), &r), None, "said once");
        let other = report(ResendCode::Replayed, 7, 8, None);
        assert_eq!(a.answered(&me(), &h1(), &other), None, "not ours");
    }

    #[test]
    fn the_will_after_an_announcement_is_never_asked_for() {
        use loopwarden_protocol::{samples, Message, MessageKind};
        let mut t = SeqTrack::default();
        let mut online = samples::frame(MessageKind::Online);
        online.seq = 10;
        if let Message::Online(o) = &mut online.message {
            o.online = true;
        }
        t.hear(&online);
        t.hear_seq(12);
        let mut a = Asker::default();
        a.due(T, &h1(), &t);
        assert_eq!(a.due(at(1), &h1(), &t), None, "11 is the will's number");
    }
}
