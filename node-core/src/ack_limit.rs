//! How many refusals a host answers: acks to refused commands, rate-limited
//! per sender.
//!
//! Every command gets an ack, but anyone who can publish on a host's `cmd`
//! topic can send it thousands of forged commands a second, and each
//! refusal costs the host a log line, a flash-queue job and a QoS 1
//! publish (whose broker round trip, behind the flood, holds one of the
//! bus client's few in-flight slots). A sender's refusals are answered
//! while its bucket holds a token ([`BURST`] at most, one back every
//! [`REFILL_MS`]) and the host's bucket for all senders does too
//! ([`BURST_ALL`], one back every [`REFILL_ALL_MS`]); the rest are
//! withheld and counted ([`AckLimit::withheld`], published in the host's
//! telemetry). Acks that say a command was done (`ok`, `clamped`) are never
//! withheld: only a signer can earn one, and it must not wait behind
//! answers to forgeries. A copy of a command answered already (the same
//! frame delivered again, which anyone who reads the topic can send) is
//! answered at this rate whatever its code: it says nothing new.
//!
//! The sender named in a refused frame is not authenticated: a forger can
//! spend a real signer's bucket, and that signer's own refusals are then
//! withheld too, for as long as the flood lasts (they are counted, and its
//! accepted commands are still answered). The table of senders is bounded
//! ([`SENDERS_MAX`]): a full bucket is as good as none and is forgotten
//! (all senders' bucket keeps fewer than that from being spent at once),
//! and should every slot still be in use, a new name is not answered.
//!
//! Glossary:
//! - *bucket*: a sender's tokens: one spent per refusal answered.
//! - *withheld*: a refusal not answered (the command is still refused, and
//!   still changes nothing).

use std::collections::HashMap;

use loopwarden_protocol::{NodeId, TimestampMs};

/// Refusals answered in a row to one sender before the limit holds.
pub const BURST: u32 = 10;

/// Time for one token to come back, ms: one refusal a second goes on
/// being answered.
pub const REFILL_MS: u64 = 1_000;

/// Refusals answered in a row, all senders together.
pub const BURST_ALL: u32 = 20;

/// Time for one token of all senders' bucket to come back, ms: ten
/// refusals a second at most, whoever sends.
pub const REFILL_ALL_MS: u64 = 100;

/// Senders with a bucket at most.
pub const SENDERS_MAX: usize = 64;

/// Tokens, as of `at` (steady ms), up to `burst`, one back every `refill`
/// ms.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: u32,
    at: u64,
    burst: u32,
    refill: u64,
}

impl Bucket {
    fn full(now: u64, burst: u32, refill: u64) -> Self {
        Self {
            tokens: burst,
            at: now,
            burst,
            refill,
        }
    }

    /// A sender's, full.
    fn sender(now: u64) -> Self {
        Self::full(now, BURST, REFILL_MS)
    }

    /// Its tokens at `now`, refilled for the time since `at`.
    fn refill(&mut self, now: u64) {
        let back = now.saturating_sub(self.at) / self.refill;
        if back > 0 {
            let back = u32::try_from(back).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(back).min(self.burst);
            self.at = if self.tokens == self.burst {
                now
            } else {
                self.at + u64::from(back) * self.refill
            };
        }
    }
}

/// The limit on one host's refusals.
#[derive(Debug, Clone, Default)]
pub struct AckLimit {
    buckets: HashMap<NodeId, Bucket>,
    /// All senders' bucket.
    all: Option<Bucket>,
    withheld: u64,
}

impl AckLimit {
    /// Whether a refusal to `sender` at `now` (steady time) is answered;
    /// one not answered is counted. A token is spent only when both the
    /// sender's bucket and all senders' hold one.
    pub fn answer(&mut self, sender: &NodeId, now: TimestampMs) -> bool {
        let now = now.0;
        if !self.buckets.contains_key(sender) && self.buckets.len() >= SENDERS_MAX {
            self.forget_full(now);
        }
        let all = (self.all).get_or_insert_with(|| Bucket::full(now, BURST_ALL, REFILL_ALL_MS));
        all.refill(now);
        let bucket = if self.buckets.len() < SENDERS_MAX || self.buckets.contains_key(sender) {
            let b = (self.buckets.entry(sender.clone())).or_insert_with(|| Bucket::sender(now));
            b.refill(now);
            Some(b)
        } else {
            None
        };
        let Some(bucket) = bucket.filter(|b| b.tokens > 0 && all.tokens > 0) else {
            self.withheld = self.withheld.saturating_add(1);
            return false;
        };
        bucket.tokens -= 1;
        all.tokens -= 1;
        true
    }

    /// Refusals withheld since the host started.
    pub fn withheld(&self) -> u64 {
        self.withheld
    }

    /// Drops the buckets that have refilled: they say nothing a new one
    /// would not.
    fn forget_full(&mut self, now: u64) {
        self.buckets.retain(|_, b| {
            b.refill(now);
            b.tokens < b.burst
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::Role;

    fn cdu(name: &str) -> NodeId {
        NodeId::new(Role::Cdu, name).unwrap()
    }

    #[test]
    fn a_sender_gets_its_burst_then_one_a_second() {
        let mut l = AckLimit::default();
        let a = cdu("cdu-a");
        let answered = (0..100)
            .filter(|_| l.answer(&a, TimestampMs(1_000)))
            .count();
        assert_eq!(answered, BURST as usize);
        assert_eq!(l.withheld(), 100 - u64::from(BURST));
        // A second later, one more; 3.5 s later, three more.
        assert!(l.answer(&a, TimestampMs(2_000)));
        assert!(!l.answer(&a, TimestampMs(2_500)));
        let later = (0..10).filter(|_| l.answer(&a, TimestampMs(5_500))).count();
        assert_eq!(later, 3);
        // Another sender is not held by a's flood.
        assert!(l.answer(&cdu("cdu-b"), TimestampMs(5_500)));
    }

    #[test]
    fn all_senders_together_get_ten_a_second() {
        let mut l = AckLimit::default();
        let names: Vec<NodeId> = (0..40).map(|i| cdu(&format!("n{i}"))).collect();
        let answered =
            |l: &mut AckLimit, t| names.iter().filter(|n| l.answer(n, TimestampMs(t))).count();
        assert_eq!(answered(&mut l, 1_000), BURST_ALL as usize);
        assert_eq!(answered(&mut l, 1_000), 0);
        // A second later, ten more, whoever asks.
        assert_eq!(answered(&mut l, 2_000), (1_000 / REFILL_ALL_MS) as usize);
    }

    #[test]
    fn a_flood_of_names_keeps_the_table_bounded_and_ten_a_second_answered() {
        let mut l = AckLimit::default();
        let mut answered = 0;
        for i in 0..10_000 {
            if l.answer(&cdu(&format!("f{i}")), TimestampMs(1_000)) {
                answered += 1;
            }
        }
        assert!(l.buckets.len() <= SENDERS_MAX);
        assert_eq!(
            answered, BURST_ALL as usize,
            "all senders' bucket holds first"
        );
        // A name a millisecond for ten seconds: ten a second answered.
        let mut l = AckLimit::default();
        let answered = (0..10_000u64)
            .filter(|i| l.answer(&cdu(&format!("g{i}")), TimestampMs(1_000 + i)))
            .count();
        assert_eq!(answered, BURST_ALL as usize + 99);
        assert!(l.buckets.len() <= SENDERS_MAX);
        // Once the forged names' buckets have refilled, they are forgotten
        // and a real sender has its own again.
        assert!(l.answer(
            &cdu("cdu-a"),
            TimestampMs(1_000 + u64::from(BURST) * REFILL_MS)
        ));
        assert!(l.buckets.contains_key(&cdu("cdu-a")));
    }

    #[test]
    fn time_going_back_or_far_forward_never_panics() {
        let mut l = AckLimit::default();
        let a = cdu("cdu-a");
        for t in [u64::MAX, 0, u64::MAX - 1, 5] {
            l.answer(&a, TimestampMs(t));
        }
        assert!(l.withheld() <= 4);
    }
}
