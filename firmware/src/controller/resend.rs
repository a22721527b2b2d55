//! Leases sent again when the gateway may have missed them: the MCU
//! counts a lease as sent once its UART queue takes it, whether or not a
//! gateway listens. When the gateway is back (it started again, or its
//! `Alive` comes more than [`SILENCE_MS`] after the one before, whatever
//! other frames came between), every cap in force is due at
//! once, and so is every lift sent within a cap lease's life (a host that
//! missed it holds its cap until the lease runs out); each goes at the
//! next step the leases go (one not queued stays due).
//!
//! Glossary:
//! - *in force*: the cap last sent to a host ([`LeaseBook::in_force`]).
//! - *back*: the gateway heard again after it may have missed frames.

use cooling_core::{HostCap, MAX_HOSTS};
use cooling_decide::leases::{cap_lease, LeaseBook, Order, LIFT_DURATION};
use loopwarden_protocol::ReasonCode;

/// Time without an `Alive` after which the next `Alive` is taken as the
/// gateway back, ms. Timed on `Alive`s alone: after a silence the first
/// frame may be a host report, the BMS's outdoor temperature or a clear,
/// and the `Alive` after it still finds the gateway back.
pub const SILENCE_MS: u64 = 3_000;

const WORDS: usize = MAX_HOSTS.div_ceil(32);

/// Which hosts' leases are due again, and when each host's last lift
/// went (see the module note).
#[derive(Debug)]
pub struct Resend {
    /// The gateway is back: what is in force is marked due at the next
    /// step.
    back: bool,
    /// When the gateway's last `Alive` came, MCU clock ms.
    alive_ms: Option<u64>,
    /// Hosts whose lease is due again.
    due: [u32; WORDS],
    /// Hosts whose last lease was a lift.
    lifted: [u32; WORDS],
    /// When each host's last lift went, MCU clock ms (wrapping).
    lifted_ms: [u32; MAX_HOSTS],
}

fn bit(set: &[u32; WORDS], h: usize) -> bool {
    set[h / 32] & (1 << (h % 32)) != 0
}

fn put(set: &mut [u32; WORDS], h: usize, on: bool) {
    if on {
        set[h / 32] |= 1 << (h % 32);
    } else {
        set[h / 32] &= !(1 << (h % 32));
    }
}

impl Resend {
    /// Nothing due again, no lift sent.
    pub const fn new() -> Self {
        Self {
            back: false,
            alive_ms: None,
            due: [0; WORDS],
            lifted: [0; WORDS],
            lifted_ms: [0; MAX_HOSTS],
        }
    }

    /// The gateway is back: what is in force goes again.
    pub fn gateway_back(&mut self) {
        self.back = true;
    }

    /// The gateway's `Alive` came at `now_ms`: the first, or one more
    /// than [`SILENCE_MS`] after the one before, is the gateway back.
    pub fn alive(&mut self, now_ms: u64) {
        let before = self.alive_ms.replace(now_ms);
        if before.is_none_or(|b| now_ms.saturating_sub(b) > SILENCE_MS) {
            self.gateway_back();
        }
    }

    /// Host `h`'s lease went at `now_ms` (`lift`: it lifted the cap).
    pub fn sent(&mut self, h: usize, lift: bool, now_ms: u64) {
        if h >= MAX_HOSTS {
            return;
        }
        put(&mut self.due, h, false);
        put(&mut self.lifted, h, lift);
        if lift {
            self.lifted_ms[h] = now_ms as u32;
        }
    }

    /// The next host from `from` on (of `hosts`) whose lease is due again
    /// at `now_ms`, and its lease, for `caps` as the core has them now:
    /// its cap, or a lift when it is uncapped and its lift went within
    /// `life_ms`; a host due for neither is passed and forgotten.
    pub fn next(
        &mut self,
        from: usize,
        now_ms: u64,
        (book, caps, life_ms, tdp_w): (&LeaseBook, &[Option<HostCap>], u64, f32),
    ) -> Option<Order> {
        let hosts = caps.len().min(MAX_HOSTS);
        self.mark_if_back(book, hosts, now_ms, life_ms);
        for (h, cap) in caps.iter().enumerate().take(hosts).skip(from) {
            if !bit(&self.due, h) {
                continue;
            }
            let id = h as u32 + 1;
            let order = match cap {
                Some(cap) => Order {
                    host: h,
                    lease: cap_lease(id, cap.reason, cap.watts, book_lease(life_ms)),
                    lift: false,
                    first: false,
                    watts: Some(cap.watts),
                },
                None if self.lift_recent(h, now_ms, life_ms) => Order {
                    host: h,
                    lease: cap_lease(id, ReasonCode::OK, tdp_w, LIFT_DURATION),
                    lift: true,
                    first: false,
                    watts: None,
                },
                None => {
                    put(&mut self.due, h, false);
                    continue;
                }
            };
            return Some(order);
        }
        None
    }

    /// When the gateway is back: each of `hosts` with a cap in force in
    /// `book` at `now_ms`, or whose lift went within `life_ms`, is due
    /// again. Called before the step's own leases go (one that goes
    /// with them is not due again).
    pub fn mark_if_back(&mut self, book: &LeaseBook, hosts: usize, now_ms: u64, life_ms: u64) {
        if !core::mem::take(&mut self.back) {
            return;
        }
        for h in 0..hosts.min(MAX_HOSTS) {
            let due = book.in_force(h).is_some() || self.lift_recent(h, now_ms, life_ms);
            put(&mut self.due, h, due);
        }
    }

    /// Host `h`'s last lease was a lift, sent within `life_ms` of
    /// `now_ms`.
    fn lift_recent(&self, h: usize, now_ms: u64, life_ms: u64) -> bool {
        let age = (now_ms as u32).wrapping_sub(self.lifted_ms[h]);
        bit(&self.lifted, h) && u64::from(age) < life_ms
    }
}

fn book_lease(life_ms: u64) -> core::time::Duration {
    core::time::Duration::from_millis(life_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cooling_decide::leases::LEASE_DEFAULT;

    #[test]
    fn a_lift_within_a_lease_s_life_goes_again_when_the_gateway_is_back() {
        let book = LeaseBook::new(2, LEASE_DEFAULT, 700.0);
        let mut r = Resend::new();
        r.sent(1, true, 1_000);
        let caps = [None, None];
        let life = LEASE_DEFAULT.as_millis() as u64;
        assert_eq!(r.next(0, 2_000, (&book, &caps, life, 700.0)), None);
        r.gateway_back();
        let o = r.next(0, 5_000, (&book, &caps, life, 700.0)).unwrap();
        assert_eq!((o.host, o.lift, o.watts), (1, true, None));
        // Not queued: still due; sent: no more.
        assert_eq!(r.next(0, 6_000, (&book, &caps, life, 700.0)), Some(o));
        r.sent(1, true, 6_000);
        assert_eq!(r.next(0, 7_000, (&book, &caps, life, 700.0)), None);
        // A lift older than a lease's life is not sent again.
        r.gateway_back();
        assert_eq!(r.next(0, 6_000 + life, (&book, &caps, life, 700.0)), None);
    }
}
