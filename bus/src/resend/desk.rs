//! The desk: which resend requests a node answers, and how much it may
//! publish for them. Pure: every decision is a function of the request,
//! the keyring and the time passed in.
//!
//! A request is answered only if it came on this node's own `resend`
//! topic, signed over that topic by a keyring signer that may `resend`
//! (a request heard on any other topic is refused as unauthenticated,
//! however well signed for it); newer (by sequence
//! number or time) than the last one taken from the same reader; within
//! [`AGE_MAX_MS`] of the node's clock; and asks for a sane range. Then it
//! gets as many frames as the frame budget holds.
//!
//! Two budgets bound what requests can make a node publish, whoever sends
//! them and however fast: the *frame budget* ([`FRAMES_BURST`] frames,
//! refilled at [`FRAMES_PER_SECOND`]) pays for every frame resent and every
//! report on a request served, and a request served costs at least
//! [`REQUEST_COST`] (it reads the whole log); the *refusal budget* ([`REFUSALS_BURST`],
//! refilled at [`REFUSALS_PER_SECOND`]) for the reports of refused ones.
//! A request that finds its budget empty is withheld: no answer (counted;
//! the reader asks again). When both are empty a request is withheld
//! before its signature is checked, so a flood costs little CPU either.
//!
//! Glossary:
//! - *budget*: a token bucket, counted in thousandths of a frame.
//! - *withheld*: a request dropped without an answer.

use std::collections::HashMap;

use loopwarden_protocol::auth::Signer;
use loopwarden_protocol::{
    Correlation, Frame, Message, NodeId, ReplayFloor, ResendCode, ResendReport, TimestampMs, Topic,
    RESEND_SPAN_MAX,
};

/// Frames (resent frames and reports of requests served) a node publishes
/// at once at most.
pub const FRAMES_BURST: u32 = 100;
/// Frames a second, once the burst is spent.
pub const FRAMES_PER_SECOND: u32 = 10;
/// What a request served costs at least, in frames of the budget: it
/// reads the whole log (two passes), whatever it finds.
pub const REQUEST_COST: u32 = 10;
/// Reports of refused requests at once at most.
pub const REFUSALS_BURST: u32 = 10;
/// Reports of refused requests a second, once that burst is spent.
pub const REFUSALS_PER_SECOND: u32 = 1;
/// The oldest (or furthest ahead) a request's time may be, from the node's
/// clock: five minutes.
pub const AGE_MAX_MS: u64 = 300_000;

/// A token bucket, in thousandths of a token.
#[derive(Debug, Clone)]
struct Budget {
    milli: u64,
    burst: u32,
    per_second: u32,
    at: Option<TimestampMs>,
}

impl Budget {
    fn full(burst: u32, per_second: u32) -> Self {
        Self {
            milli: u64::from(burst) * 1000,
            burst,
            per_second,
            at: None,
        }
    }

    /// Refills for the time since the last look. A clock that went back
    /// refills nothing for the step and the refill goes on from the new
    /// time: kept at the old one, it would stop until the clock caught up
    /// (an hour's step, an hour with no resend).
    fn refill(&mut self, now: TimestampMs) {
        let elapsed = self.at.map_or(0, |t| now.0.saturating_sub(t.0));
        let max = u64::from(self.burst) * 1000;
        self.milli = (self.milli + elapsed.saturating_mul(u64::from(self.per_second))).min(max);
        self.at = Some(now);
    }

    fn whole(&self) -> u32 {
        (self.milli / 1000) as u32
    }

    fn take(&mut self, n: u32) {
        self.milli = self.milli.saturating_sub(u64::from(n) * 1000);
    }
}

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Resend the logged events of `from..=to`, at most `budget` frames,
    /// then report (and [`Desk::spent`] what was published).
    Serve {
        /// The request answered.
        correlation: Correlation,
        /// The range asked for.
        from: u32,
        /// The range asked for (inclusive).
        to: u32,
        /// Frames that may be resent for it.
        budget: u32,
    },
    /// Publish this report (a refusal); its budget is already taken.
    Refuse(ResendReport),
    /// Publish nothing: the budget is empty, or it is not a request.
    Withhold,
}

/// The node's resend desk (see the module note).
#[derive(Debug, Clone)]
pub struct Desk {
    /// This node's `resend` topic: the only one requests are taken on.
    own: Option<Topic>,
    signers: Vec<Signer>,
    frames: Budget,
    refusals: Budget,
    /// The floor of each reader's requests taken: the highest number and
    /// the latest time ([`ReplayFloor`]).
    last: HashMap<NodeId, ReplayFloor>,
    withheld: u64,
}

impl Desk {
    /// A desk answering, on `own` (this node's `resend` topic; `None` for
    /// a node without one, whose requests are all refused), the readers
    /// of `signers` that may resend.
    pub fn new(own: Option<Topic>, signers: Vec<Signer>) -> Self {
        Self {
            own,
            signers,
            frames: Budget::full(FRAMES_BURST, FRAMES_PER_SECOND),
            refusals: Budget::full(REFUSALS_BURST, REFUSALS_PER_SECOND),
            last: HashMap::new(),
            withheld: 0,
        }
    }

    /// Requests withheld so far (no budget, or not a request).
    pub fn withheld(&self) -> u64 {
        self.withheld
    }

    /// Decides on `frame`, received on `on` (this node's `resend` topic),
    /// at `now`.
    pub fn hear(&mut self, now: TimestampMs, frame: &Frame, on: &Topic) -> Answer {
        self.frames.refill(now);
        self.refusals.refill(now);
        let Message::ResendRequest(req) = &frame.message else {
            return self.withhold();
        };
        if self.frames.whole() < REQUEST_COST && self.refusals.whole() == 0 {
            return self.withhold();
        }
        let correlation = Correlation {
            from: frame.sender.clone(),
            seq: frame.seq,
        };
        if let Err(code) = self.check(now, frame, on) {
            return self.refuse(correlation, req.from, req.to, code);
        }
        self.last
            .entry(frame.sender.clone())
            .and_modify(|f| f.raise(frame.seq, frame.time))
            .or_insert(ReplayFloor::new(frame.seq, frame.time));
        if req.to < req.from || req.to - req.from >= RESEND_SPAN_MAX {
            return self.refuse(correlation, req.from, req.to, ResendCode::Malformed);
        }
        if self.frames.whole() < REQUEST_COST {
            return self.withhold();
        }
        // One token stays for the report.
        let budget = self.frames.whole() - 1;
        Answer::Serve {
            correlation,
            from: req.from,
            to: req.to,
            budget,
        }
    }

    /// What a served request published: `frames` resent and its report
    /// (at least [`REQUEST_COST`]).
    pub fn spent(&mut self, frames: u32) {
        self.frames.take(frames.saturating_add(1).max(REQUEST_COST));
    }

    /// Authentic, allowed and fresh, or why not.
    fn check(&self, now: TimestampMs, frame: &Frame, on: &Topic) -> Result<(), ResendCode> {
        // Signed for another topic, it is not a request to this node.
        if self.own.as_ref() != Some(on) {
            return Err(ResendCode::Unauthenticated);
        }
        let key_id = frame.signed_auth().map(|a| a.key_id);
        let signer = key_id.and_then(|id| self.signers.iter().find(|s| s.is(&frame.sender, id)));
        frame
            .verify(on, |_, _| signer.map(|s| &s.key))
            .map_err(|_| ResendCode::Unauthenticated)?;
        if !signer.is_some_and(|s| s.may.resend) {
            return Err(ResendCode::Forbidden);
        }
        if now.0.abs_diff(frame.time.0) > AGE_MAX_MS {
            return Err(ResendCode::Replayed);
        }
        match self.last.get(&frame.sender) {
            Some(floor) if floor.replays(frame.seq, frame.time) => Err(ResendCode::Replayed),
            _ => Ok(()),
        }
    }

    fn refuse(&mut self, correlation: Correlation, from: u32, to: u32, code: ResendCode) -> Answer {
        if self.refusals.whole() == 0 {
            return self.withhold();
        }
        self.refusals.take(1);
        Answer::Refuse(ResendReport {
            correlation,
            code,
            from,
            to,
            resent: 0,
            held_from: None,
            next: None,
        })
    }

    fn withhold(&mut self) -> Answer {
        self.withheld += 1;
        Answer::Withhold
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::auth::{May, SigningKey};
    use loopwarden_protocol::{samples, CommandAuth, Family, Ident, ResendRequest, Role};

    const T0: TimestampMs = TimestampMs(1_800_000_000_000);

    fn topic() -> Topic {
        samples::resend_topic()
    }

    fn reader(name: &str, seed: u8, resend: bool) -> Signer {
        Signer {
            role: Role::Facility,
            name: Some(Ident::new(name).unwrap()),
            key_id: 1,
            key: SigningKey::from_bytes(&[seed; 32]).verifying_key(),
            may: May {
                lease: !resend,
                release: false,
                resend,
            },
        }
    }

    fn desk() -> Desk {
        Desk::new(
            Some(topic()),
            vec![reader("bms1", 1, true), reader("ems1", 2, false)],
        )
    }

    fn request(name: &str, seed: u8, seq: u32, time: TimestampMs, range: (u32, u32)) -> Frame {
        let mut f = Frame {
            sender: NodeId::new(Role::Facility, name).unwrap(),
            seq,
            time,
            message: Message::ResendRequest(ResendRequest {
                from: range.0,
                to: range.1,
                auth: CommandAuth::default(),
            }),
        };
        f.sign(&topic(), 1, &SigningKey::from_bytes(&[seed; 32]))
            .unwrap();
        f
    }

    fn code(a: &Answer) -> Option<ResendCode> {
        match a {
            Answer::Refuse(r) => Some(r.code),
            _ => None,
        }
    }

    #[test]
    fn a_signed_request_is_served_from_the_frame_budget() {
        let mut d = desk();
        let a = d.hear(T0, &request("bms1", 1, 5, T0, (10, 20)), &topic());
        let Answer::Serve {
            correlation,
            from,
            to,
            budget,
        } = a
        else {
            panic!("{a:?}")
        };
        assert_eq!((correlation.seq, from, to), (5, 10, 20));
        assert_eq!(budget, FRAMES_BURST - 1, "one token stays for the report");
    }

    #[test]
    fn requests_without_the_right_are_refused_and_say_why() {
        let mut d = desk();
        let t = topic();
        let forged = request("bms1", 9, 5, T0, (1, 2));
        assert_eq!(
            code(&d.hear(T0, &forged, &t)),
            Some(ResendCode::Unauthenticated)
        );
        let unknown = request("dcim", 1, 5, T0, (1, 2));
        assert_eq!(
            code(&d.hear(T0, &unknown, &t)),
            Some(ResendCode::Unauthenticated)
        );
        let lease_only = request("ems1", 2, 5, T0, (1, 2));
        assert_eq!(
            code(&d.hear(T0, &lease_only, &t)),
            Some(ResendCode::Forbidden)
        );
        let mut other = t.clone();
        other.family = Family::Cmd;
        let for_cmd = {
            let mut f = request("bms1", 1, 6, T0, (1, 2));
            f.sign(&other, 1, &SigningKey::from_bytes(&[1; 32]))
                .unwrap();
            f
        };
        assert_eq!(
            code(&d.hear(T0, &for_cmd, &t)),
            Some(ResendCode::Unauthenticated),
            "signed for another topic"
        );
        let old = request("bms1", 1, 7, TimestampMs(T0.0 - AGE_MAX_MS - 1), (1, 2));
        assert_eq!(code(&d.hear(T0, &old, &t)), Some(ResendCode::Replayed));
        let backwards = request("bms1", 1, 8, T0, (9, 2));
        assert_eq!(
            code(&d.hear(T0, &backwards, &t)),
            Some(ResendCode::Malformed)
        );
        let wide = request("bms1", 1, 9, T0, (0, RESEND_SPAN_MAX));
        assert_eq!(code(&d.hear(T0, &wide, &t)), Some(ResendCode::Malformed));
    }

    /// A request signed well, but over another node's `resend` topic (or
    /// this node's on another site, or another family): not one to this
    /// node, refused however it came here.
    #[test]
    fn a_request_on_another_topic_than_this_nodes_resend_is_refused() {
        let mut d = desk();
        let mut seq = 5;
        let mut others = Vec::new();
        let mut node = topic();
        node.node = Ident::new("h08").unwrap();
        others.push(node);
        let mut site = topic();
        site.site = Ident::new("hall-2").unwrap();
        others.push(site);
        let mut family = topic();
        family.family = Family::Cmd;
        others.push(family);
        for on in others {
            let mut f = request("bms1", 1, seq, T0, (1, 2));
            f.sign(&on, 1, &SigningKey::from_bytes(&[1; 32])).unwrap();
            assert_eq!(
                code(&d.hear(T0, &f, &on)),
                Some(ResendCode::Unauthenticated),
                "{on:?}"
            );
            seq += 1;
        }
        let ours = request("bms1", 1, seq, T0, (1, 2));
        assert!(matches!(d.hear(T0, &ours, &topic()), Answer::Serve { .. }));
        let mut nowhere = Desk::new(None, vec![reader("bms1", 1, true)]);
        let again = request("bms1", 1, seq + 1, T0, (1, 2));
        assert_eq!(
            code(&nowhere.hear(T0, &again, &topic())),
            Some(ResendCode::Unauthenticated),
            "a node without a resend topic takes no request"
        );
    }

    #[test]
    fn a_request_heard_again_is_replayed() {
        let mut d = desk();
        let t = topic();
        let r = request("bms1", 1, 5, T0, (1, 2));
        assert!(matches!(d.hear(T0, &r, &t), Answer::Serve { .. }));
        assert_eq!(
            code(&d.hear(TimestampMs(T0.0 + 10), &r, &t)),
            Some(ResendCode::Replayed)
        );
        // A reader whose counter restarted still counts by time.
        let restarted = request("bms1", 1, 1, TimestampMs(T0.0 + 20), (1, 2));
        assert!(matches!(
            d.hear(TimestampMs(T0.0 + 20), &restarted, &t),
            Answer::Serve { .. }
        ));
        // Its requests from before the restart and after it, sent again
        // in turn: neither is served (each would let the other in).
        for (i, again) in [&r, &restarted, &r].into_iter().enumerate() {
            assert_eq!(
                code(&d.hear(TimestampMs(T0.0 + 30 + i as u64), again, &t)),
                Some(ResendCode::Replayed)
            );
        }
    }

    #[test]
    fn no_flood_of_requests_makes_a_node_publish_faster_than_its_budget() {
        let mut d = desk();
        let t = topic();
        let mut published = 0u64;
        // 1,000 signed requests a second for 60 s, each asking for 1,000
        // frames (and served as if the log held them all), and as many
        // forged ones.
        for i in 0..60_000u32 {
            let now = TimestampMs(T0.0 + u64::from(i));
            let good = request("bms1", 1, i + 1, now, (0, 999));
            if let Answer::Serve { budget, .. } = d.hear(now, &good, &t) {
                let sent = budget.min(1000);
                d.spent(sent);
                published += u64::from(sent) + 1;
            }
            let forged = request("bms1", 7, i + 1, now, (0, 999));
            if let Answer::Refuse(_) = d.hear(now, &forged, &t) {
                published += 1;
            }
        }
        let allowed = u64::from(FRAMES_BURST + FRAMES_PER_SECOND * 60)
            + u64::from(REFUSALS_BURST + REFUSALS_PER_SECOND * 60);
        assert!(published <= allowed, "{published} > {allowed}");
        assert!(
            published >= u64::from(FRAMES_BURST + FRAMES_PER_SECOND * 59),
            "the budget is used, not starved: {published}"
        );
        assert!(d.withheld() > 100_000);
    }

    #[test]
    fn a_request_costs_a_read_of_the_log_even_when_it_finds_nothing() {
        let mut d = desk();
        let t = topic();
        let mut served = 0;
        for seq in 1..=100 {
            if let Answer::Serve { .. } = d.hear(T0, &request("bms1", 1, seq, T0, (5, 5)), &t) {
                d.spent(0);
                served += 1;
            }
        }
        assert_eq!(served, FRAMES_BURST / REQUEST_COST);
    }

    #[test]
    fn the_budget_refills_with_time_and_never_beyond_its_burst() {
        let mut d = desk();
        let t = topic();
        let r = |seq, now| request("bms1", 1, seq, now, (0, 10));
        let Answer::Serve { budget, .. } = d.hear(T0, &r(1, T0), &t) else {
            panic!()
        };
        d.spent(budget);
        assert_eq!(d.hear(T0, &r(2, T0), &t), Answer::Withhold);
        let later = TimestampMs(T0.0 + 2_000);
        let Answer::Serve { budget, .. } = d.hear(later, &r(3, later), &t) else {
            panic!()
        };
        assert_eq!(budget, 2 * FRAMES_PER_SECOND - 1);
        let much_later = TimestampMs(T0.0 + 3_600_000);
        let Answer::Serve { budget, .. } = d.hear(much_later, &r(4, much_later), &t) else {
            panic!()
        };
        assert_eq!(budget, FRAMES_BURST - 1);
    }

    #[test]
    fn the_budget_refills_again_after_the_clock_steps_back() {
        let mut d = desk();
        let t = topic();
        let r = |seq, now| request("bms1", 1, seq, now, (0, 10));
        let Answer::Serve { budget, .. } = d.hear(T0, &r(1, T0), &t) else {
            panic!()
        };
        d.spent(budget);
        // The clock steps back an hour (NTP, an operator): nothing is
        // refilled for the step, and the refill goes on from there.
        let back = TimestampMs(T0.0 - 3_600_000);
        assert_eq!(d.hear(back, &r(2, back), &t), Answer::Withhold);
        let later = TimestampMs(back.0 + 2_000);
        let Answer::Serve { budget, .. } = d.hear(later, &r(3, later), &t) else {
            panic!("the budget stays empty until the clock is back at {T0:?}")
        };
        assert_eq!(budget, 2 * FRAMES_PER_SECOND - 1);
    }
}
