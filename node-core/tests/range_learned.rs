//! A GPU's settable range learned after the start (NVML's limit
//! constraints, unread at the start, the board's stood in): a set read
//! back at the new lowest limit is in force, not a failure retried; the
//! lease that asked below it, and its renewals, are acked clamped; a
//! ceiling above the new highest limit comes down to it, said on the bus
//! and kept. [`Host`] (in `host/`) plays the shell, its
//! [`Host::nvml_range`] the range NVML gives.

mod host;

use host::{cmd_topic, lease, sets_on, Boot, Host, DEFAULT, GPUS};
use loopwarden_protocol::samples::T0;
use loopwarden_protocol::{AckCode, CapSource, Event, Frame, Message, Watts};
use node_core::caps::GpuRange;
use node_core::node::{Effect, Input, Level, RETRY_MS};

/// The range NVML gives of GPU 0: its lowest limit is 250 W, not the
/// board's 200 W that stood in for it.
const NVML: GpuRange = GpuRange {
    min: Watts(250),
    max: Watts(800),
};

/// Lease `id` (a cooling lease of every GPU at `watts` for `ms`), sent as
/// the frame `seq` of its sender: a renewal where `id` is already held.
fn lease_seq(id: u32, seq: u32, t: u64, watts: u32, ms: u32) -> Frame {
    let mut f = lease(seq, t, watts, ms);
    if let Message::CapLease(l) = &mut f.message {
        l.lease = id;
    }
    f.sign(
        &loopwarden_protocol::samples::command_topic(),
        1,
        &loopwarden_protocol::samples::demo_signing_key(),
    )
    .unwrap();
    f
}

/// A host whose GPU 0 has NVML's range [`NVML`], given a 200 W cooling
/// lease at `t`.
fn capped_below_the_learned_minimum(t: u64) -> Host {
    let mut h = Host::new();
    h.nvml_range[0] = Some(NVML);
    h.step(t, Input::Frame(&cmd_topic(), &lease(1, t, 200, 600_000)));
    h
}

fn errors(h: &Host) -> Vec<String> {
    h.trail
        .iter()
        .filter_map(|e| match e {
            Effect::Say(Level::Error, line) => Some(line.clone()),
            _ => None,
        })
        .collect()
}

/// A 200 W cap set on GPU 0 reads back at 250 W, its lowest limit as
/// NVML says: the range is learned, the cap is in force at 250 W for the
/// cooling lease, acked clamped naming the minimum, and not set again at
/// its retry.
#[test]
fn a_cap_read_back_at_the_learned_minimum_is_acked_clamped_and_held() {
    let t = T0.0 + 1_000;
    let mut h = capped_below_the_learned_minimum(t);
    let ack = h.acks.last().expect("an ack");
    assert_eq!(ack.code, AckCode::Clamped, "{}", ack.detail.as_str());
    assert_eq!(
        ack.detail.as_str(),
        "GPU 0: 200 W is below its minimum 250 W; clamped to 250 W"
    );
    assert_eq!(h.limits[0], Watts(250));
    assert_eq!(h.limits[1..], [Watts(200); GPUS - 1]);
    assert_eq!(
        h.node.applied(0),
        (Some(Watts(250)), Some(CapSource::Cooling))
    );
    assert!(errors(&h).is_empty(), "no failure said: {:?}", errors(&h));

    let sets = sets_on(&h.trail, 0).len();
    for k in 1..=3 {
        h.healthy_round(t + k * RETRY_MS + 1_000);
    }
    assert_eq!(sets_on(&h.trail, 0).len(), sets, "no set retried");
    assert_eq!(h.limits[0], Watts(250));
    assert_eq!(
        h.node.applied(0),
        (Some(Watts(250)), Some(CapSource::Cooling))
    );
    assert!(errors(&h).is_empty(), "{:?}", errors(&h));
}

/// The lease renewed after the range was learned: acked clamped again,
/// naming the learned minimum, and nothing set.
#[test]
fn a_renewal_below_the_learned_minimum_is_acked_clamped() {
    let t = T0.0 + 1_000;
    let mut h = capped_below_the_learned_minimum(t);
    let sets = sets_on(&h.trail, 0).len();
    let t = t + 10_000;
    h.step(
        t,
        Input::Frame(&cmd_topic(), &lease_seq(1, 2, t, 200, 600_000)),
    );
    let ack = h.acks.last().expect("an ack");
    assert_eq!(ack.code, AckCode::Clamped, "{}", ack.detail.as_str());
    assert!(
        ack.detail
            .as_str()
            .contains("GPU 0: 200 W is below its minimum 250 W; clamped to 250 W"),
        "{}",
        ack.detail.as_str()
    );
    assert!(
        !ack.detail.as_str().contains("GPU 1:"),
        "{}",
        ack.detail.as_str()
    );
    assert_eq!(sets_on(&h.trail, 0).len(), sets, "nothing set");
    assert_eq!(h.limits[0], Watts(250));
}

/// GPU 0's limit could not be read at the start (its ceiling never read,
/// 700 W stood in); NVML then says its highest limit is 600 W: the
/// ceiling comes down to it, the power ceiling event says so, the limits
/// are kept, and once the GPU reads again it is set to 600 W.
#[test]
fn a_learned_range_lowers_a_ceiling_never_read() {
    let mut h = Host::boot_unreadable(Boot::default(), [true, false, false, false]);
    assert_eq!(h.node.ceiling(0), Some(DEFAULT));
    let range = GpuRange {
        min: Watts(200),
        max: Watts(600),
    };
    let effects = h.node.set_range(0, range);
    assert_eq!(h.node.ceiling(0), Some(Watts(600)));
    let moved: Vec<&Event> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Emit(ev @ Event::PowerCeiling { .. }) => Some(ev),
            _ => None,
        })
        .collect();
    assert_eq!(
        moved,
        [&Event::PowerCeiling {
            gpus: 1,
            ceiling: Watts(600),
            was: DEFAULT,
        }]
    );
    assert!(
        effects.iter().any(|e| matches!(e, Effect::KeepLimits(_))),
        "{effects:?}"
    );

    // Read again at the next periodic read: 700 W found, above the
    // ceiling: set to it.
    h.unreadable[0] = false;
    let mut t = T0.0;
    for _ in 0..node_core::node::REREAD_EVERY {
        t += 1_000;
        h.healthy_round(t);
    }
    assert_eq!(h.limits[0], Watts(600), "{:?}", sets_on(&h.trail, 0));
    assert_eq!(h.limits[1..], [DEFAULT; GPUS - 1]);
}
