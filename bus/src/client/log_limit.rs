//! Which refused inbound frames the loop logs: the first of each topic and
//! reason, then at most one a minute, with how many went unlogged since.
//! Every one is counted in the metrics whatever is logged, so a flood of
//! garbage on a `cmd` topic costs a few lines, not thousands a second. A
//! plain struct: no I/O, the time passed in.
//!
//! Glossary:
//! - *key*: a topic and a reason (the metric's label: `bad_crc`, …).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// The shortest time between two lines of one key.
pub(super) const EVERY: Duration = Duration::from_secs(60);
/// Keys remembered at most; past them, what is new shares one key per
/// reason ([`OTHER_TOPICS`]).
pub(super) const KEYS_MAX: usize = 256;
/// The topic of that shared key.
pub(super) const OTHER_TOPICS: &str = "(other topics)";

/// One key's last line and what went unlogged since.
#[derive(Debug)]
struct Seen {
    logged_at: Instant,
    unlogged: u64,
}

/// The keys seen (see the module note).
#[derive(Debug, Default)]
pub(super) struct LogLimit {
    seen: HashMap<(String, &'static str), Seen>,
}

impl LogLimit {
    /// A frame refused for `reason` on `topic` at `now`: `Some(n)` when it
    /// is to be logged, `n` the refusals of its key left unlogged since
    /// the key's last line; `None` when it is only counted.
    pub(super) fn hit(&mut self, now: Instant, topic: &str, reason: &'static str) -> Option<u64> {
        let key = self.key(now, topic, reason);
        match self.seen.get_mut(&key) {
            Some(seen) if now.duration_since(seen.logged_at) < EVERY => {
                seen.unlogged += 1;
                None
            }
            Some(seen) => {
                let unlogged = std::mem::take(&mut seen.unlogged);
                seen.logged_at = now;
                Some(unlogged)
            }
            None => {
                let seen = Seen {
                    logged_at: now,
                    unlogged: 0,
                };
                self.seen.insert(key, seen);
                Some(0)
            }
        }
    }

    /// The key of `topic` and `reason`: its own while there is room (keys
    /// whose minute is over make room), else the shared one.
    fn key(&mut self, now: Instant, topic: &str, reason: &'static str) -> (String, &'static str) {
        let own = (topic.to_string(), reason);
        if self.seen.contains_key(&own) || self.seen.len() < KEYS_MAX {
            return own;
        }
        self.seen
            .retain(|(t, _), s| t == OTHER_TOPICS || now.duration_since(s.logged_at) < EVERY);
        if self.seen.len() < KEYS_MAX {
            return own;
        }
        (OTHER_TOPICS.to_string(), reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CMD: &str = "dc/v2/lab/host/h01/cmd";

    #[test]
    fn the_first_of_a_topic_and_reason_is_logged_then_one_a_minute_with_the_count() {
        let mut l = LogLimit::default();
        let t0 = Instant::now();
        assert_eq!(l.hit(t0, CMD, "bad_crc"), Some(0));
        let flood =
            (1..=10_000).filter_map(|i| l.hit(t0 + Duration::from_millis(i), CMD, "bad_crc"));
        assert_eq!(
            flood.count(),
            0,
            "a flood within the minute is counted only"
        );
        // Another reason, another topic: their own first line.
        assert_eq!(l.hit(t0, CMD, "malformed"), Some(0));
        assert_eq!(l.hit(t0, "dc/v2/lab/host/h01/resend", "bad_crc"), Some(0));
        assert_eq!(l.hit(t0 + EVERY, CMD, "bad_crc"), Some(10_000));
        assert_eq!(l.hit(t0 + EVERY, CMD, "bad_crc"), None);
        assert_eq!(l.hit(t0 + 2 * EVERY, CMD, "bad_crc"), Some(1));
    }

    #[test]
    fn past_the_keys_remembered_new_topics_share_one_key_per_reason() {
        let mut l = LogLimit::default();
        let t0 = Instant::now();
        for i in 0..KEYS_MAX {
            assert_eq!(l.hit(t0, &format!("t/{i}"), "bad_crc"), Some(0));
        }
        assert_eq!(
            l.hit(t0, "t/new", "bad_crc"),
            Some(0),
            "the shared key's first"
        );
        assert_eq!(l.hit(t0, "t/newer", "bad_crc"), None);
        assert_eq!(l.hit(t0, "t/newer", "malformed"), Some(0));
        assert_eq!(l.seen.len(), KEYS_MAX + 2);
        // Once their minute is over, the old keys make room.
        let later = t0 + EVERY;
        assert_eq!(l.hit(later, "t/newest", "bad_crc"), Some(0));
        assert!(l.seen.len() <= 3, "{}", l.seen.len());
        assert_eq!(l.hit(later, "t/newest", "bad_crc"), None);
    }
}
