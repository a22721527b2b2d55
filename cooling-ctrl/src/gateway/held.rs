//! The leases the gateway holds while the bus is down: the latest the
//! MCU sent for each host, sent at the reconnection for what is left of
//! its life. A lease kept in the outbox instead would go out stale, every
//! renewal of every capped host, and fill the outbox's part that never
//! drops anything ahead of a leak's event.
//!
//! Glossary:
//! - *life*: a lease's duration from when the MCU sent it; what is left
//!   of it at the reconnection is the duration sent then.

use std::collections::BTreeMap;
use std::vec::Vec;

use loopwarden_protocol::message::CapLease;
use loopwarden_protocol::DurationMs;

/// A lease that shorter than this at the reconnection is not sent: the
/// MCU renews it within its own period anyway.
const SHORTEST_MS: u64 = 1_000;

/// The latest lease of each host, held while the bus is down.
#[derive(Debug, Default)]
pub struct HeldLeases {
    by_host: BTreeMap<usize, (CapLease, bool, u64)>,
}

impl HeldLeases {
    /// Holds `lease` (a `lift` when it ends a cap) for `host`, sent by
    /// the MCU at `now_ms` (steady): it replaces the one held for that
    /// host. True when it is the first held since the bus went down.
    pub fn hold(&mut self, host: usize, lease: CapLease, lift: bool, now_ms: u64) -> bool {
        let first = self.by_host.is_empty();
        self.by_host.insert(host, (lease, lift, now_ms));
        first
    }

    /// A newer lease of `host` went out: the one held for it is older and
    /// must never follow it (a held cap sent after the lift that ended
    /// it would cap the host again, and the MCU, which sent the lift,
    /// would renew nothing).
    pub fn forget(&mut self, host: usize) {
        self.by_host.remove(&host);
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.by_host.is_empty()
    }

    /// Every lease held, each with the life it has left at `now_ms` as its
    /// duration; one with less than a second left is dropped. Nothing
    /// stays held.
    pub fn take(&mut self, now_ms: u64) -> Vec<(usize, CapLease, bool)> {
        std::mem::take(&mut self.by_host)
            .into_iter()
            .filter_map(|(host, (mut lease, lift, at_ms))| {
                let left = u64::from(lease.duration.0).checked_sub(now_ms.saturating_sub(at_ms))?;
                (left >= SHORTEST_MS).then(|| {
                    lease.duration = DurationMs(left as u32);
                    (host, lease, lift)
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::{samples, Message, MessageKind};

    fn lease(ms: u32) -> CapLease {
        let Message::CapLease(mut l) = samples::message(MessageKind::CapLease) else {
            unreachable!("a cap lease sample");
        };
        l.duration = DurationMs(ms);
        l
    }

    #[test]
    fn a_held_lease_is_forgotten_once_a_newer_one_of_its_host_went_out() {
        let mut h = HeldLeases::default();
        h.hold(3, lease(30_000), false, 1_000);
        h.hold(5, lease(30_000), false, 1_000);
        // The bus is back; the MCU's lift of host 3 goes out before the
        // held leases are sent.
        h.forget(3);
        let hosts: Vec<usize> = h.take(2_000).into_iter().map(|(host, ..)| host).collect();
        assert_eq!(hosts, [5]);
    }

    #[test]
    fn the_latest_of_each_host_goes_at_the_reconnection_for_the_life_it_has_left() {
        let mut h = HeldLeases::default();
        assert!(h.hold(3, lease(30_000), false, 1_000), "the first held");
        assert!(!h.hold(3, lease(30_000), false, 11_000), "a renewal");
        assert!(!h.hold(5, lease(2_000), true, 11_000));
        assert!(!h.hold(7, lease(30_000), false, 1_000));
        let sent = h.take(21_000);
        // Host 3's renewal of 11 s has 20 s left; host 5's lift ran out;
        // host 7's lease has 10 s left.
        let got: Vec<_> = sent
            .iter()
            .map(|(h, l, lift)| (*h, l.duration.0, *lift))
            .collect();
        assert_eq!(got, vec![(3, 20_000, false), (7, 10_000, false)]);
        assert!(h.is_empty() && h.take(21_000).is_empty(), "nothing stays");
    }
}
