//! When a host's cap goes out as a lease: a new cap at once, a cap that
//! moved by [`CAP_RESEND_W`] or more at once, a cap that stays renewed
//! every third of the lease, and a cap that ends lifted by a short lease
//! at TDP. The shell signs and publishes each order; the twin's hosts take
//! each as sent. Pure: time comes in, ms on the caller's clock. The orders
//! due come one at a time ([`LeaseBook::due`]), so that no list of them
//! is held.
//!
//! Glossary:
//! - *lease*: a power cap that holds for its duration from the frame's
//!   timestamp unless renewed.
//! - *lift*: the short lease at TDP sent when a cap ends.
//! - *in force*: the cap last sent to a host (what it holds while the
//!   lease lasts).

use core::time::Duration;

use cooling_core::{HostCap, MAX_HOSTS};
use heapless::Vec;
use loopwarden_protocol::message::{CapLease, CapSource, CommandAuth, GpuCap, GpuSelector};
use loopwarden_protocol::units::{DurationMs, Watts};
use loopwarden_protocol::ReasonCode;

use crate::float::round_f32;

/// How long a cap lease holds unless configured otherwise.
pub const LEASE_DEFAULT: Duration = Duration::from_secs(30);
/// How long the lease that lifts a cap lasts.
pub const LIFT_DURATION: Duration = Duration::from_secs(5);
/// A cap that moves by this much or more is sent again at once, W.
pub const CAP_RESEND_W: f32 = 5.0;

/// One lease to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Order {
    /// The host's index.
    pub host: usize,
    /// The lease, unsigned.
    pub lease: CapLease,
    /// It lifts a cap.
    pub lift: bool,
    /// It is a host's first cap since it was last uncapped.
    pub first: bool,
    /// The cap it puts in force, W (`None`: a lift).
    pub watts: Option<f32>,
}

/// What was last sent to one host.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Sent {
    /// The cap, W (`None`: not capped, or lifted).
    watts: Option<f32>,
    /// When, ms.
    at_ms: u64,
}

/// The leases sent, by host index.
#[derive(Debug, Clone)]
pub struct LeaseBook {
    sent: Vec<Sent, MAX_HOSTS>,
    lease: Duration,
    tdp_w: f32,
}

impl LeaseBook {
    /// Nothing sent yet to any of `hosts` hosts (at most [`MAX_HOSTS`]);
    /// caps hold for `lease`, lifts are at `tdp_w`.
    pub fn new(hosts: usize, lease: Duration, tdp_w: f32) -> Self {
        let mut sent = Vec::new();
        // Within capacity by the bound.
        let _ = sent.resize(hosts.min(MAX_HOSTS), Sent::default());
        Self { sent, lease, tdp_w }
    }

    /// The leases due at `now` for the core's `caps`, by host index, one
    /// at a time.
    pub fn due<'a>(
        &'a self,
        now: u64,
        caps: &'a [Option<HostCap>],
    ) -> impl Iterator<Item = Order> + 'a {
        self.due_from(now, caps, 0)
    }

    /// The leases due at `now` for the core's `caps` to hosts `from` on:
    /// a caller that sends each before it asks for the next holds one
    /// order at a time and reads the book once in all.
    pub fn due_from<'a>(
        &'a self,
        now: u64,
        caps: &'a [Option<HostCap>],
        from: usize,
    ) -> impl Iterator<Item = Order> + 'a {
        let renew_ms = (self.lease.as_millis() / 3) as u64;
        (caps.iter().zip(&self.sent).enumerate())
            .skip(from)
            .filter_map(move |(h, (cap, sent))| self.order(h, cap.as_ref(), sent, now, renew_ms))
    }

    /// The lease due to host `h` for `cap`, after `sent`, if one is.
    fn order(
        &self,
        h: usize,
        cap: Option<&HostCap>,
        sent: &Sent,
        now: u64,
        renew_ms: u64,
    ) -> Option<Order> {
        let id = h as u32 + 1;
        match (cap, sent.watts) {
            (Some(cap), prev) => {
                let due = prev.is_none_or(|w| {
                    (cap.watts - w).abs() >= CAP_RESEND_W
                        || now.saturating_sub(sent.at_ms) >= renew_ms
                });
                due.then(|| Order {
                    host: h,
                    lease: cap_lease(id, cap.reason, cap.watts, self.lease),
                    lift: false,
                    first: prev.is_none(),
                    watts: Some(cap.watts),
                })
            }
            (None, Some(_)) => Some(Order {
                host: h,
                lease: cap_lease(id, ReasonCode::OK, self.tdp_w, LIFT_DURATION),
                lift: true,
                first: false,
                watts: None,
            }),
            (None, None) => None,
        }
    }

    /// `o` went out at `now` (an order the bus did not take is due again
    /// at the next step).
    pub fn sent(&mut self, o: &Order, now: u64) {
        if let Some(s) = self.sent.get_mut(o.host) {
            *s = Sent {
                watts: o.watts,
                at_ms: now,
            };
        }
    }

    /// The cap in force at host `h`, W, as last sent.
    pub fn in_force(&self, h: usize) -> Option<f32> {
        self.sent.get(h).and_then(|s| s.watts)
    }
}

/// A cap lease as sent (unsigned, `auth` zero).
pub fn cap_lease(lease: u32, reason: ReasonCode, watts: f32, duration: Duration) -> CapLease {
    let mut caps = heapless::Vec::new();
    let _ = caps.push(GpuCap {
        gpus: GpuSelector::All,
        limit: Watts(round_f32(watts).max(0.0) as u32),
    });
    CapLease {
        lease,
        source: CapSource::Cooling,
        reason,
        caps,
        duration: DurationMs(duration.as_millis().min(u128::from(u32::MAX)) as u32),
        auth: CommandAuth::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    const LEASE: Duration = Duration::from_secs(30);

    fn cap(watts: f32) -> Option<HostCap> {
        Some(HostCap {
            watts,
            reason: ReasonCode::COOLING_LOST,
        })
    }

    fn send_all(book: &mut LeaseBook, now: u64, caps: &[Option<HostCap>]) -> Vec<Order> {
        let orders: Vec<Order> = book.due(now, caps).collect();
        orders.iter().for_each(|o| book.sent(o, now));
        orders
    }

    #[test]
    fn a_cap_goes_at_once_is_renewed_every_third_and_lifted_when_it_ends() {
        let mut book = LeaseBook::new(2, LEASE, 700.0);
        let first = send_all(&mut book, 0, &[cap(300.0), None]);
        assert_eq!(first.len(), 1);
        assert!(first[0].first && !first[0].lift);
        assert_eq!(first[0].lease.lease, 1);
        assert_eq!(first[0].lease.duration, DurationMs(30_000));
        assert_eq!(book.in_force(0), Some(300.0));
        assert!(send_all(&mut book, 9_999, &[cap(302.0), None]).is_empty());
        let renewed = send_all(&mut book, 10_000, &[cap(302.0), None]);
        assert_eq!(renewed.len(), 1);
        assert!(!renewed[0].first);
        assert_eq!(renewed[0].lease.caps[0].limit, Watts(302));
        let moved = send_all(&mut book, 10_500, &[cap(296.0), None]);
        assert_eq!(moved.len(), 1, "moved 6 W: at once");
        let lift = send_all(&mut book, 11_000, &[None, None]);
        assert!(lift[0].lift);
        assert_eq!(lift[0].lease.caps[0].limit, Watts(700));
        assert_eq!(lift[0].lease.duration, DurationMs(5_000));
        assert_eq!(book.in_force(0), None);
        assert!(send_all(&mut book, 12_000, &[None, None]).is_empty());
    }

    #[test]
    fn an_order_the_bus_did_not_take_is_due_again() {
        let book = LeaseBook::new(1, LEASE, 700.0);
        assert_eq!(book.due(0, &[cap(300.0)]).count(), 1);
        assert_eq!(book.due(1_000, &[cap(300.0)]).count(), 1);
        assert_eq!(book.in_force(0), None);
    }

    #[test]
    fn leases_asked_for_one_at_a_time_from_a_host_on_are_the_ones_due() {
        let caps = [cap(300.0), None, cap(250.0), cap(400.0), None];
        let mut book = LeaseBook::new(caps.len(), LEASE, 700.0);
        let second = book.due(0, &caps).nth(1).unwrap();
        book.sent(&second, 0);
        let all: Vec<Order> = book.due(0, &caps).collect();
        assert_eq!(all.iter().map(|o| o.host).collect::<Vec<_>>(), [0, 3]);
        assert_eq!(book.due_from(0, &caps, 1).collect::<Vec<_>>(), all[1..]);
        assert_eq!(book.due_from(0, &caps, 4).count(), 0);
        assert_eq!(book.due_from(0, &caps, 9).count(), 0, "past the hosts");
    }
}
