//! Leases taken before a restart are taken back under the rules they
//! were taken with: a host whose lease limits were lowered since keeps a
//! cooling emergency's caps (the lease shortened, not dropped), and says
//! so, naming the lease.
//!
//! [`Host`] (in `host/`) plays the shell.

mod host;

use host::{lease, Host, Kept, Start, DEFAULT, GPUS};
use loopwarden_protocol::samples::{self, T0};
use loopwarden_protocol::{DurationMs, Watts};
use node_core::caps::LeaseLimits;
use node_core::node::{Effect, Input, Level};

/// The warnings said that contain `part`.
fn warned(h: &Host, part: &str) -> Vec<String> {
    h.trail
        .iter()
        .filter_map(|e| match e {
            Effect::Say(Level::Warn, line) if line.contains(part) => Some(line.clone()),
            _ => None,
        })
        .collect()
}

/// `h` started again at `at` from its flash, taking leases within
/// `limits`.
fn restarted_with(h: &Host, at: u64, limits: LeaseLimits) -> Host {
    Host::start_limited(
        Start {
            limits: h.limits,
            site_limit: None,
            kept: h.flash_limits,
            logged: h.logged.clone(),
            at,
        },
        Kept::default(),
        limits,
    )
}

#[test]
fn a_lease_longer_than_the_new_maximum_is_shortened_not_dropped() {
    let mut h = Host::new();
    let t = T0.0 + 1_000;
    // A ten-minute cooling emergency lease: 300 W on every GPU.
    h.step(
        t,
        Input::Frame(&samples::command_topic(), &lease(1, t, 300, 600_000)),
    );
    assert_eq!(h.limits, [Watts(300); GPUS]);

    // max_lease_ms lowered to five minutes, the agent restarted a minute
    // on: the cap holds, until five minutes from its sending (as a lease
    // taken under that limit would), not from the restart.
    let five_min = LeaseLimits {
        max_duration: DurationMs(300_000),
        ..LeaseLimits::default()
    };
    let at = t + 60_000;
    let mut after = restarted_with(&h, at, five_min);
    assert_eq!(after.limits, [Watts(300); GPUS], "the cap in force");
    let lines = warned(&after, "lease 1 from cdu/cdu-a (seq 1");
    assert_eq!(lines.len(), 1, "{:?}", after.trail);
    assert!(
        lines[0].contains("taken back for 240 s, not the 540 s it had left"),
        "{lines:?}"
    );
    after.step(t + 299_999, Input::Expiry);
    assert_eq!(after.limits, [Watts(300); GPUS]);
    after.step(t + 300_000, Input::Expiry);
    assert_eq!(after.limits, [DEFAULT; GPUS], "lifted at its new end");
    // Restarted past five minutes from its sending, within the ten it
    // was taken for: not taken back, and said.
    let past = restarted_with(&h, t + 360_000, five_min);
    assert_eq!(past.limits, [DEFAULT; GPUS]);
    let lines = warned(&past, "lease 1 from cdu/cdu-a (seq 1");
    assert_eq!(lines.len(), 1, "{:?}", past.trail);
    assert!(
        lines[0].contains("240 s before the end it asked"),
        "{lines:?}"
    );
}

#[test]
fn a_lease_shortened_when_taken_is_not_back_after_a_restart() {
    let short = LeaseLimits {
        max_duration: DurationMs(20_000),
        ..LeaseLimits::default()
    };
    let mut h = Host::start_limited(
        Start {
            limits: [DEFAULT; GPUS],
            site_limit: None,
            kept: Default::default(),
            logged: Vec::new(),
            at: T0.0,
        },
        Kept::default(),
        short,
    );
    let t = T0.0 + 1_000;
    // 30 s asked of a host that takes 20 s: Clamped, ends at t + 20 s.
    h.step(
        t,
        Input::Frame(&samples::command_topic(), &lease(1, t, 300, 30_000)),
    );
    assert_eq!(h.limits, [Watts(300); GPUS]);
    assert!(
        h.trail.iter().any(|e| format!("{e:?}").contains("Clamped")),
        "{:?}",
        h.trail
    );
    // Restarted at t + 24 s: past its shortened end, so not in force;
    // said, as it asked for 6 s more.
    let after = restarted_with(&h, t + 24_000, short);
    assert_eq!(after.limits, [DEFAULT; GPUS], "{:?}", after.trail);
    let lines = warned(&after, "lease 1");
    assert_eq!(lines.len(), 1, "{:?}", after.trail);
    assert!(
        lines[0].contains("not taken back: it ran 20000 ms"),
        "{lines:?}"
    );
    // Restarted within it: it holds until its shortened end only.
    let mut within = restarted_with(&h, t + 10_000, short);
    assert_eq!(within.limits, [Watts(300); GPUS]);
    within.step(t + 20_000, Input::Expiry);
    assert_eq!(within.limits, [DEFAULT; GPUS]);
}

#[test]
fn a_lease_taken_back_as_it_was_is_not_said() {
    let mut h = Host::new();
    let t = T0.0 + 1_000;
    h.step(
        t,
        Input::Frame(&samples::command_topic(), &lease(1, t, 300, 600_000)),
    );
    let after = restarted_with(&h, t + 60_000, LeaseLimits::default());
    assert_eq!(after.limits, [Watts(300); GPUS]);
    assert!(warned(&after, "lease 1").is_empty(), "{:?}", after.trail);
}
