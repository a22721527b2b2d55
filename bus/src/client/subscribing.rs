//! Subscriptions the broker refused, asked for again. A plain struct: no
//! I/O, the time passed in.
//!
//! A broker may answer a SUBSCRIBE with a failure code for some filters
//! (NATS does while a node that came back is still rebuilding the
//! JetStream state a QoS 1 subscription needs). A node that let that pass
//! would go on without ever hearing what the filter carries: a controller
//! its hosts' acks, a host its CDU's state. So the filters refused are
//! asked for again, after 1 s, then twice as long each time up to 30 s,
//! for as long as the connection lasts; a new connection subscribes to
//! everything anew.
//!
//! Glossary:
//! - *asked*: a SUBSCRIBE sent and not yet answered; the broker answers
//!   them in order (MQTT 3.1.1 §4.6), so each SUBACK goes with the oldest.

use std::collections::VecDeque;
use std::time::Duration;

use rumqttc::SubscribeReasonCode;
use tokio::time::Instant;

/// The first wait before a refused filter is asked for again.
const FIRST_WAIT: Duration = Duration::from_secs(1);
/// The longest wait.
const LONGEST_WAIT: Duration = Duration::from_secs(30);

/// The state of a connection's subscriptions.
#[derive(Debug)]
pub(super) struct Subscribing {
    asked: VecDeque<Vec<String>>,
    refused: Vec<String>,
    retry_at: Option<Instant>,
    wait: Duration,
}

impl Default for Subscribing {
    fn default() -> Self {
        Self {
            asked: VecDeque::new(),
            refused: Vec::new(),
            retry_at: None,
            wait: FIRST_WAIT,
        }
    }
}

impl Subscribing {
    /// A new connection asks for `filters`; what the last one asked for
    /// or had refused is forgotten.
    pub(super) fn connected(&mut self, filters: Vec<String>) {
        *self = Self::default();
        if !filters.is_empty() {
            self.asked.push_back(filters);
        }
    }

    /// The broker answered the oldest SUBSCRIBE with `codes`, at `now`;
    /// returns the filters it refused (asked for again later).
    pub(super) fn answered(&mut self, now: Instant, codes: &[SubscribeReasonCode]) -> Vec<String> {
        let asked = self.asked.pop_front().unwrap_or_default();
        let refused: Vec<String> = asked
            .into_iter()
            .zip(codes)
            .filter(|(_, c)| matches!(c, SubscribeReasonCode::Failure))
            .map(|(f, _)| f)
            .collect();
        if !refused.is_empty() {
            self.refused.extend(refused.iter().cloned());
            self.retry_at = Some(now + self.wait);
            self.wait = (self.wait * 2).min(LONGEST_WAIT);
        }
        refused
    }

    /// When to ask again, if anything was refused.
    pub(super) fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// The filters to ask for again now; they count as asked.
    pub(super) fn retry(&mut self) -> Vec<String> {
        self.retry_at = None;
        let filters = std::mem::take(&mut self.refused);
        if !filters.is_empty() {
            self.asked.push_back(filters.clone());
        }
        filters
    }

    /// The retry could not be handed to the client: try again in a second.
    pub(super) fn retry_failed(&mut self, now: Instant, filters: Vec<String>) {
        self.asked.pop_back();
        self.refused = filters;
        self.retry_at = Some(now + FIRST_WAIT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rumqttc::QoS;
    use rumqttc::SubscribeReasonCode::{Failure, Success};

    fn ok() -> SubscribeReasonCode {
        Success(QoS::AtLeastOnce)
    }

    fn filters(f: &[&str]) -> Vec<String> {
        f.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_refused_filter_is_asked_again_with_a_growing_wait_until_granted() {
        let mut s = Subscribing::default();
        s.connected(filters(&["a", "b", "c"]));
        let t0 = Instant::now();
        assert_eq!(s.answered(t0, &[ok(), Failure, ok()]), ["b"]);
        assert_eq!(s.retry_at(), Some(t0 + Duration::from_secs(1)));
        assert_eq!(s.retry(), ["b"]);
        assert_eq!(s.retry_at(), None, "asked: wait for the answer");
        assert_eq!(s.answered(t0, &[Failure]), ["b"]);
        assert_eq!(s.retry_at(), Some(t0 + Duration::from_secs(2)));
        s.retry();
        assert!(s.answered(t0, &[ok()]).is_empty());
        assert_eq!(s.retry_at(), None);
        assert!(s.retry().is_empty());
    }

    #[test]
    fn the_wait_stops_growing_at_30_s_and_a_new_connection_starts_over() {
        let mut s = Subscribing::default();
        s.connected(filters(&["a"]));
        let t0 = Instant::now();
        for _ in 0..10 {
            s.answered(t0, &[Failure]);
            s.retry();
        }
        s.answered(t0, &[Failure]);
        assert_eq!(s.retry_at(), Some(t0 + LONGEST_WAIT));
        s.connected(filters(&["a"]));
        assert_eq!(s.retry_at(), None);
        s.answered(t0, &[Failure]);
        assert_eq!(s.retry_at(), Some(t0 + FIRST_WAIT));
    }

    #[test]
    fn a_retry_the_client_could_not_take_is_tried_again_in_a_second() {
        let mut s = Subscribing::default();
        s.connected(filters(&["a"]));
        let t0 = Instant::now();
        s.answered(t0, &[Failure]);
        let f = s.retry();
        s.retry_failed(t0, f);
        assert_eq!(s.retry_at(), Some(t0 + FIRST_WAIT));
        assert_eq!(s.retry(), ["a"]);
    }
}
