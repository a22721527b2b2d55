//! The node's step driven through a whole day's worth of trouble with no
//! runtime, no bus and no NVML: a lease (logged before its ack, its limits
//! read back, its events after the ack), a driver stall (no GPU blamed),
//! a quarantine and its release, a cooling loss (drain, then power down
//! after the grace), the lease's lapse and the stop.
//!
//! [`Host`] (in `host/`) plays the shell: it carries out each effect
//! against four fake GPUs, a fake flash and a record of what went on the
//! bus, and answers the node as the agent does.

mod host;

use host::{
    cdu_topic, cmd_topic, healthy_readings, lease, lease_caps, quiet, release, sets_on, Host,
    DEFAULT, GPUS, GRACE_MS,
};
use loopwarden_protocol::samples::{self, demo_signing_key, T0};
use loopwarden_protocol::{
    AckCode, CapSource, CoolingStep, Event, Frame, GpuIndex, GpuSelector, HealthState, Message,
    MessageKind, NodeId, Role, TimestampMs, Watts, WholeCelsius,
};
use node_core::cooling_loss::Phase;
use node_core::health::Observation;
use node_core::node::{Effect, Input, Reading};

/// The CDU's state at `t`, rack 2 without cooling when `lost`.
fn cdu_state(seq: u32, t: u64, lost: bool) -> Frame {
    let mut f = samples::frame(MessageKind::CduState);
    f.seq = seq;
    f.time = TimestampMs(t);
    if let Message::CduState(st) = &mut f.message {
        for r in st.racks.iter_mut() {
            r.cooling = if lost && r.rack.get() == 2 {
                loopwarden_protocol::RackCooling::Lost
            } else {
                loopwarden_protocol::RackCooling::Normal
            };
        }
    }
    sign_state(f)
}

/// `f` signed as `cdu-a` signs its state, with the demo key.
fn sign_state(mut f: Frame) -> Frame {
    f.sign(&cdu_topic(), 1, &demo_signing_key()).unwrap();
    f
}

fn caps_applied(e: &Event) -> Option<(u16, Watts, Option<CapSource>)> {
    match e {
        Event::CapsApplied {
            gpus,
            limit,
            source,
        } => Some((*gpus, *limit, *source)),
        _ => None,
    }
}

#[test]
fn a_lease_is_logged_before_its_ack_and_its_events_follow_the_ack() {
    let mut h = Host::new();
    assert!(
        h.trail.contains(&Effect::ReadLimits),
        "the start reads first"
    );
    assert!(h.events.is_empty(), "nothing changed at start");
    let t = T0.0 + 1_000;
    h.healthy_round(t);
    let f = lease(1, t, 500, 60_000);
    let from = h.trail.len();
    h.step(t, Input::Frame(&cmd_topic(), &f));
    assert_eq!(h.limits, [Watts(500); GPUS], "every GPU set");
    let ack = h.acks.last().expect("an ack");
    assert_eq!(ack.code, AckCode::Ok, "{}", ack.detail.as_str());
    assert_eq!(ack.in_force.len(), GPUS, "every limit read back");
    assert!(ack.in_force.iter().all(|c| c.limit == Watts(500)));
    let order: Vec<&str> = h.trail[from..]
        .iter()
        .filter_map(|e| match e {
            Effect::LogCommand => Some("log"),
            Effect::SetLimits(_) => Some("set"),
            Effect::Ack(_) => Some("ack"),
            Effect::Emit(e) if caps_applied(e).is_some() => Some("caps_applied"),
            _ => None,
        })
        .collect();
    assert_eq!(order, ["log", "set", "ack", "caps_applied"]);
    assert_eq!(
        h.events.iter().filter_map(caps_applied).collect::<Vec<_>>(),
        [(0b1111, Watts(500), Some(CapSource::Cooling))],
        "one event for the four GPUs"
    );

    // Delivered again: answered as it was, nothing set, nothing logged.
    let (logged, trail) = (h.logged_commands, h.trail.len());
    h.step(t + 10, Input::Frame(&cmd_topic(), &f));
    let ack = h.acks.last().unwrap();
    assert_eq!(ack.code, AckCode::Ok);
    assert!(
        ack.detail.as_str().starts_with("a copy of seq"),
        "{}",
        ack.detail.as_str()
    );
    assert_eq!(h.logged_commands, logged);
    assert!(
        !h.trail[trail..]
            .iter()
            .any(|e| matches!(e, Effect::SetLimits(_) | Effect::LogCommand)),
        "{:?}",
        &h.trail[trail..]
    );
}

/// A flood of copies of a lease taken (a captured frame sent again and
/// again) is answered at the refusals' rate, never once per copy: the acks
/// go through the flash's priority lane.
#[test]
fn copies_sent_in_a_flood_are_answered_at_the_refusals_rate() {
    let mut h = Host::new();
    let t = T0.0 + 1_000;
    let f = lease(5, t, 500, 60_000);
    h.step(t, Input::Frame(&cmd_topic(), &f));
    assert_eq!(h.acks.len(), 1);
    // Another frame under its seq is a replay, and leaves the copy's
    // answer as it was.
    h.step(t, Input::Frame(&cmd_topic(), &lease(5, t, 400, 60_000)));
    assert_eq!(h.acks.last().unwrap().code, AckCode::Replayed);
    h.step(t, Input::Frame(&cmd_topic(), &f));
    assert_eq!(h.acks.last().unwrap().code, AckCode::Ok);
    h.acks.truncate(1);
    for i in 0..1_000 {
        h.step(t + 1 + i / 2, Input::Frame(&cmd_topic(), &f));
    }
    let answered = h.acks.len() - 1;
    assert!((1..=12).contains(&answered), "{answered} copies answered");
    assert!(h.acks[1..].iter().all(|a| a.code == AckCode::Ok));
}

#[test]
fn a_lease_the_flash_or_the_gpu_refuses_says_so_in_its_ack() {
    let mut h = Host::new();
    let t = T0.0 + 1_000;
    h.flash_ok = false;
    h.step(t, Input::Frame(&cmd_topic(), &lease(1, t, 500, 60_000)));
    let ack = h.acks.last().unwrap();
    assert_eq!(ack.code, AckCode::Ok, "the cap applies all the same");
    assert!(
        ack.detail.as_str().contains("not logged to flash"),
        "{}",
        ack.detail.as_str()
    );
    h.flash_ok = true;
    h.refuse_set = true;
    let second = lease(2, t + 100, 400, 60_000);
    h.step(t + 100, Input::Frame(&cmd_topic(), &second));
    let ack = h.acks.last().unwrap().clone();
    assert_eq!(ack.code, AckCode::Failed);
    assert!(
        ack.detail.as_str().contains("500 W stays in force"),
        "{}",
        ack.detail.as_str()
    );
    // Delivered again: answered as its ack said, failed, not as the
    // core's first verdict.
    h.step(t + 150, Input::Frame(&cmd_topic(), &second));
    let copy = h.acks.last().unwrap();
    assert_eq!(copy.code, AckCode::Failed);
    assert!(
        copy.detail
            .as_str()
            .starts_with("a copy of seq 2, answered already: ")
            && copy.detail.as_str().contains("500 W stays in force"),
        "{}",
        copy.detail.as_str()
    );
    assert!(
        ack.in_force.iter().all(|c| c.limit == Watts(500)),
        "as read back"
    );
    // Retried only after the wait, then taken once the GPU accepts.
    h.refuse_set = false;
    let sets = |h: &Host| {
        h.trail
            .iter()
            .filter(|e| matches!(e, Effect::SetLimits(_)))
            .count()
    };
    let before = sets(&h);
    h.healthy_round(t + 1_100);
    assert_eq!(
        sets(&h),
        before,
        "no retry within {} ms",
        node_core::node::RETRY_MS
    );
    h.healthy_round(t + 100 + node_core::node::RETRY_MS);
    assert_eq!(h.limits, [Watts(400); GPUS]);
    // A command does not wait for the retry: its sender waits for the ack.
    let t = t + 200 + node_core::node::RETRY_MS;
    h.refuse_set = true;
    h.step(t, Input::Frame(&cmd_topic(), &lease(3, t, 300, 60_000)));
    assert_eq!(h.acks.last().unwrap().code, AckCode::Failed);
    h.refuse_set = false;
    h.step(
        t + 100,
        Input::Frame(&cmd_topic(), &lease(4, t + 100, 300, 60_000)),
    );
    assert_eq!(h.acks.last().unwrap().code, AckCode::Ok);
    assert_eq!(h.limits, [Watts(300); GPUS], "set at once");
}

#[test]
fn a_lease_is_acked_failed_only_for_a_gpu_it_caps() {
    let mut h = Host::new();
    let gpu = |i| GpuSelector::Gpu(GpuIndex::new(i).unwrap());
    let t = T0.0 + 1_000;
    h.refuses[1] = true;
    let on_1 = lease_caps(1, t, &[(gpu(1), 500)], 60_000);
    h.step(t, Input::Frame(&cmd_topic(), &on_1));
    let ack = h.acks.last().unwrap();
    assert_eq!(ack.code, AckCode::Failed, "{}", ack.detail.as_str());
    // Every command retries GPU 1's failed target; a lease that does not
    // cap GPU 1 is not answered with its failure.
    let on_0 = lease_caps(2, t + 100, &[(gpu(0), 400)], 60_000);
    h.step(t + 100, Input::Frame(&cmd_topic(), &on_0));
    let ack = h.acks.last().unwrap();
    assert_eq!(ack.code, AckCode::Ok, "{}", ack.detail.as_str());
    assert!(
        !ack.detail.as_str().contains("GPU 1"),
        "{}",
        ack.detail.as_str()
    );
    assert_eq!(h.limits[0], Watts(400));
    assert_eq!(sets_on(&h.trail, 1), [Watts(500); 2], "GPU 1 retried");
    // A clamp of its own is said, not wiped by another GPU's failure.
    let low = lease_caps(3, t + 200, &[(gpu(0), 100)], 60_000);
    h.step(t + 200, Input::Frame(&cmd_topic(), &low));
    let ack = h.acks.last().unwrap();
    assert_eq!(ack.code, AckCode::Clamped, "{}", ack.detail.as_str());
    assert!(ack
        .detail
        .as_str()
        .contains("GPU 0: 100 W is below its minimum"));
    // A lease that caps GPU 1 is still answered with its failure.
    let again = lease_caps(4, t + 300, &[(gpu(0), 450), (gpu(1), 450)], 60_000);
    h.step(t + 300, Input::Frame(&cmd_topic(), &again));
    let ack = h.acks.last().unwrap();
    assert_eq!(ack.code, AckCode::Failed);
    assert!(
        ack.detail.as_str().contains("GPU 1"),
        "{}",
        ack.detail.as_str()
    );
}

#[test]
fn a_driver_stall_blames_no_gpu_and_a_fatal_xid_quarantines_one_until_released() {
    let mut h = Host::new();
    let mut t = T0.0;
    for _ in 0..30 {
        t += 1_000;
        h.healthy_round(t);
    }
    // Every GPU silent together, for two minutes: a stall, not four
    // failures.
    for _ in 0..120 {
        t += 1_000;
        h.silent_round(t);
    }
    assert!(
        h.events
            .iter()
            .any(|e| matches!(e, Event::HostStalled { gpus: 0b1111, .. })),
        "{:?}",
        h.events
    );
    assert!(h.node.health().stalled_since().is_some());
    for g in 0..GPUS as u8 {
        assert_eq!(h.state(g), HealthState::Healthy, "GPU {g} not blamed");
    }
    assert!(h.quarantined.is_empty());
    t += 1_000;
    h.healthy_round(t);
    assert!(h
        .events
        .iter()
        .any(|e| matches!(e, Event::HostResumed { .. })));
    assert!(
        h.trail.contains(&Effect::Reprobe),
        "a reloaded driver is asked again"
    );

    // XID 79: the GPU fell off the bus.
    t += 500;
    let published = h.health_published;
    let trail = h.trail.len();
    h.step(t, Input::Xid { gpu: 2, xid: 79 });
    assert_eq!(h.state(2), HealthState::Quarantined);
    assert_eq!(h.quarantined, [2], "its actions started");
    // In flash before it is published or acted on: a crash right after
    // the fault does not bring the GPU back healthy.
    let new = &h.trail[trail..];
    let at = |f: &dyn Fn(&Effect) -> bool| new.iter().position(f).expect("in the step's effects");
    let kept = at(&|e| *e == Effect::KeepHealth(2));
    assert!(kept < at(&|e| *e == Effect::PublishHealth), "{new:?}");
    assert!(
        kept < at(&|e| matches!(e, Effect::Quarantine { gpu: 2, .. })),
        "{new:?}"
    );
    // The actions' `{reason}`: the reason's name, then the evidence.
    let reason = h.trail.iter().find_map(|e| match e {
        Effect::Quarantine { reason, .. } => Some(reason.clone()),
        _ => None,
    });
    assert!(
        reason
            .as_deref()
            .is_some_and(|r| r.starts_with("xid-79: XID 79")),
        "{reason:?}"
    );
    assert_eq!(h.kept_health.last(), Some(&2), "kept in flash");
    assert!(
        h.health_published > published,
        "the retained health went out"
    );
    let xid_at = h
        .events
        .iter()
        .position(|e| matches!(e, Event::Xid { .. }))
        .unwrap();
    let change_at = h
        .events
        .iter()
        .position(|e| {
            matches!(
                e,
                Event::HealthChanged {
                    to: HealthState::Quarantined,
                    ..
                }
            )
        })
        .unwrap();
    assert!(change_at < xid_at, "the decision before the XID's event");

    // Released by an operator, logged before the ack.
    t += 60_000;
    let logged = h.logged_commands;
    h.step(t, Input::Frame(&cmd_topic(), &release(1, t, 2)));
    assert_eq!(h.acks.last().unwrap().code, AckCode::Ok);
    assert_eq!(h.logged_commands, logged + 1);
    assert_eq!(h.state(2), HealthState::Healthy);
    assert!(h
        .events
        .iter()
        .any(|e| matches!(e, Event::QuarantineReleased { .. })));
    // A second release finds nothing to release.
    h.step(t + 10, Input::Frame(&cmd_topic(), &release(2, t + 10, 2)));
    let ack = h.acks.last().unwrap();
    assert_eq!(ack.code, AckCode::NotQuarantined, "{}", ack.detail.as_str());
}

#[test]
fn a_cooling_loss_drains_then_powers_down_after_the_grace_and_undoes_when_cooled() {
    let mut h = Host::new();
    let mut t = T0.0 + 1_000;
    h.healthy_round(t);
    // Another rack's loss is not this host's.
    let mut other = cdu_state(1, t, false);
    if let Message::CduState(st) = &mut other.message {
        st.racks[0].cooling = loopwarden_protocol::RackCooling::Lost;
    }
    h.step(t, Input::Frame(&cdu_topic(), &sign_state(other)));
    assert!(h.cooling.is_empty());
    h.step(t, Input::Frame(&cdu_topic(), &cdu_state(2, t, true)));
    assert_eq!(h.cooling, [CoolingStep::Drain]);
    assert!(matches!(h.kept_phase.last(), Some(Phase::Draining { .. })));
    while t < T0.0 + 1_000 + GRACE_MS - 1_000 {
        t += 1_000;
        h.healthy_round(t);
    }
    assert_eq!(h.cooling, [CoolingStep::Drain], "still within the grace");
    t += 2_000;
    h.healthy_round(t);
    assert_eq!(h.cooling, [CoolingStep::Drain, CoolingStep::PowerDown]);
    assert!(matches!(
        h.kept_phase.last(),
        Some(Phase::PoweredDown { .. })
    ));
    // A state from another controller on the same topic is not taken.
    let mut forged = cdu_state(3, t, false);
    forged.sender = NodeId::new(Role::Cdu, "cdu-b").unwrap();
    h.step(t, Input::Frame(&cdu_topic(), &forged));
    assert!(matches!(h.node.cooling_phase(), Phase::PoweredDown { .. }));
    // Cooled again: powered up and resumed.
    t += 1_000;
    h.step(t, Input::Frame(&cdu_topic(), &cdu_state(4, t, false)));
    assert_eq!(
        h.cooling,
        [
            CoolingStep::Drain,
            CoolingStep::PowerDown,
            CoolingStep::PowerUp,
            CoolingStep::Resume
        ]
    );
    assert_eq!(h.kept_phase.last(), Some(&Phase::Cooled));
}

#[test]
fn a_lease_lapses_at_its_end_and_only_a_stop_with_no_lease_lifts_the_caps() {
    let mut h = Host::new();
    let t = T0.0 + 1_000;
    h.step(t, Input::Frame(&cmd_topic(), &lease(1, t, 500, 20_000)));
    assert_eq!(h.limits, [Watts(500); GPUS]);
    let end = h.node.next_expiry().expect("a lease in force");
    assert_eq!(end.0, t + 20_000);
    h.step(end.0, Input::Expiry);
    assert_eq!(h.limits, [DEFAULT; GPUS], "lifted at its end");
    assert_eq!(
        h.events.iter().filter_map(caps_applied).next_back(),
        Some((0b1111, DEFAULT, None))
    );

    // A lease in force at the stop: its caps stay on for the next start
    // (a restart in a cooling emergency never runs the GPUs uncapped).
    let t = end.0 + 1_000;
    h.step(t, Input::Frame(&cmd_topic(), &lease(2, t, 300, 600_000)));
    assert_eq!(h.limits, [Watts(300); GPUS]);
    h.step(t + 5_000, Input::Stop);
    assert_eq!(h.limits, [Watts(300); GPUS], "kept through the stop");

    // None in force: the ceiling goes back.
    let mut h = Host::new();
    h.step(t, Input::Frame(&cmd_topic(), &lease(3, t, 300, 20_000)));
    h.step(t + 25_000, Input::Stop);
    assert_eq!(h.limits, [DEFAULT; GPUS], "the lapsed lease's caps lifted");
}

#[test]
fn a_hot_gpu_is_capped_by_the_guard_without_the_bus() {
    let mut h = Host::new();
    let mut t = T0.0;
    for _ in 0..4 {
        t += 1_000;
        let mut readings: Vec<Reading> = (0..GPUS)
            .map(|_| Reading::Sample {
                observation: quiet(),
                temp: WholeCelsius(60),
                power: Watts(450),
            })
            .collect();
        readings[3] = Reading::Sample {
            observation: Observation {
                temp: 90.0,
                ..quiet()
            },
            temp: WholeCelsius(90),
            power: Watts(650),
        };
        h.step(t, Input::Round(&readings));
    }
    assert_eq!(
        h.node.guard_cap(3),
        Some(Watts(550)),
        "25 W a round from 650 W"
    );
    assert_eq!(h.limits[3], Watts(550), "in force, read back");
    assert_eq!(
        h.node.applied(3),
        (Some(Watts(550)), Some(CapSource::ThermalGuard))
    );
    assert_eq!(h.limits[..3], [DEFAULT; 3]);
}

/// A driver reload that begins mid-round: GPUs 0 and 1 answer and 2 and 3
/// fail in the same round, every reading at the round's time as the agent
/// gives them; then all four stall; then 0, 1 and 3 come back and GPU 2
/// comes back one round later. No GPU is blamed: the misses of the round
/// the stall began in were the host's.
#[test]
fn a_stall_that_begins_mid_round_blames_no_gpu() {
    let mut h = Host::new();
    let mut t = T0.0;
    for _ in 0..5 {
        t += 1_000;
        h.healthy_round(t);
    }
    let sample = || healthy_readings()[0].clone();
    let missed = || Reading::Missed("NVML error: driver not loaded".into());
    t += 1_000;
    h.step(t, Input::Round(&[sample(), sample(), missed(), missed()]));
    for _ in 0..4 {
        t += 1_000;
        h.silent_round(t);
    }
    assert!(h.node.health().stalled_since().is_some());
    t += 1_000;
    h.step(t, Input::Round(&[sample(), sample(), missed(), sample()]));
    t += 1_000;
    h.healthy_round(t);
    for g in 0..GPUS as u8 {
        assert_eq!(h.state(g), HealthState::Healthy, "GPU {g} not blamed");
    }
    assert!(h.quarantined.is_empty());
}

/// The CDU's last state delivered again (a host that reconnects, or its
/// signed frame sent again) renews nothing: it counts for 180 s from when
/// it was first taken, never 180 s from each copy.
#[test]
fn a_copy_of_the_cdus_state_does_not_renew_it() {
    let mut h = Host::new();
    let t = T0.0 + 1_000;
    h.healthy_round(t);
    let state = cdu_state(1, t, false);
    h.step(t, Input::Frame(&cdu_topic(), &state));
    assert!(h.node.health().fresh_coolant(t).is_some(), "taken");
    h.step(t + 170_000, Input::Frame(&cdu_topic(), &state));
    assert!(h.node.health().fresh_coolant(t + 170_000).is_some());
    assert_eq!(
        h.node.health().fresh_coolant(t + 200_000),
        None,
        "180 s after it was first taken"
    );
    // A state stamped long before it arrives counts from its stamp plus
    // the clocks' allowed skew: this one, 150 s old, for 90 s more.
    let t = t + 250_000;
    h.step(
        t,
        Input::Frame(&cdu_topic(), &cdu_state(2, t - 150_000, false)),
    );
    assert!(h.node.health().fresh_coolant(t + 80_000).is_some());
    assert_eq!(h.node.health().fresh_coolant(t + 100_000), None);
}

/// GPU 2 quarantined (it stopped answering); it answers again with an
/// NVLink replay count that rose. A release signed before that sample
/// (the operator judged the GPU on what was known then) is refused, and
/// says why; one signed after it releases, and a rise after the release
/// is judged against the last sample before it.
#[test]
fn a_release_signed_before_newer_quarantine_evidence_is_refused() {
    let mut h = Host::new();
    let mut t = T0.0;
    let with_replays = |n: u64| {
        let mut r = healthy_readings();
        if let Reading::Sample { observation, .. } = &mut r[2] {
            observation.nvlink_replay = n;
        }
        r
    };
    for _ in 0..3 {
        t += 1_000;
        h.step(t, Input::Round(&with_replays(10)));
    }
    let missed = Reading::Missed("timed out".into());
    for _ in 0..5 {
        t += 1_000;
        let mut r = healthy_readings();
        r[2] = missed.clone();
        h.step(t, Input::Round(&r));
    }
    assert_eq!(h.state(2), HealthState::Quarantined);
    let signed = t + 500;
    t += 1_000;
    h.step(t, Input::Round(&with_replays(20)));
    h.step(t + 100, Input::Frame(&cmd_topic(), &release(1, signed, 2)));
    let ack = h.acks.last().unwrap();
    assert_ne!(ack.code, AckCode::Ok, "{}", ack.detail.as_str());
    assert!(
        ack.detail.as_str().contains("nvlink-errors"),
        "{}",
        ack.detail.as_str()
    );
    assert_eq!(h.state(2), HealthState::Quarantined);
    // Stamped 30 s after it, within the clocks' allowed skew (the
    // operator's clock may be that far ahead): refused too.
    h.step(
        t + 200,
        Input::Frame(&cmd_topic(), &release(2, t + 30_000, 2)),
    );
    assert_ne!(h.acks.last().unwrap().code, AckCode::Ok);
    assert_eq!(h.state(2), HealthState::Quarantined);
    // Signed past the skew after it: released.
    t += 61_000;
    h.step(t + 200, Input::Frame(&cmd_topic(), &release(3, t + 150, 2)));
    assert_eq!(h.acks.last().unwrap().code, AckCode::Ok);
    assert_eq!(h.state(2), HealthState::Healthy);
    // The first sample after the release is judged against the last
    // before it: a rise across the release quarantines.
    t += 1_000;
    h.step(t, Input::Round(&with_replays(25)));
    assert_eq!(
        h.state(2),
        HealthState::Quarantined,
        "a rise after the release"
    );
}

/// GPUs 1 then 3 quarantined by XID 79: the site's drain reason names
/// the last (GPU 3). Releasing GPU 3 runs GPU 1's quarantine actions
/// again, with its own reason, so the scheduler's reason names a GPU
/// still out, not the one just released; GPU 3's are not run.
#[test]
fn a_release_runs_again_the_quarantine_actions_of_every_gpu_still_quarantined() {
    let mut h = Host::new();
    let mut t = T0.0;
    for _ in 0..3 {
        t += 1_000;
        h.healthy_round(t);
    }
    for gpu in [1, 3] {
        t += 500;
        h.step(t, Input::Xid { gpu, xid: 79 });
        assert_eq!(h.state(gpu), HealthState::Quarantined);
    }
    assert_eq!(h.quarantined, [1, 3]);
    t += 60_000;
    let trail = h.trail.len();
    h.step(t, Input::Frame(&cmd_topic(), &release(1, t, 3)));
    assert_eq!(h.acks.last().unwrap().code, AckCode::Ok);
    assert_eq!(h.state(3), HealthState::Healthy);
    assert_eq!(h.quarantined, [1, 3, 1], "GPU 1's actions again, only");
    let again = h.trail[trail..].iter().find_map(|e| match e {
        Effect::Quarantine { gpu: 1, reason } => Some(reason.clone()),
        _ => None,
    });
    assert!(
        again
            .as_deref()
            .is_some_and(|r| r.starts_with("xid-79: XID 79")),
        "{again:?}"
    );
    // A release with none left quarantined runs nothing.
    t += 1_000;
    h.step(t, Input::Frame(&cmd_topic(), &release(2, t, 1)));
    assert_eq!(h.acks.last().unwrap().code, AckCode::Ok);
    assert_eq!(h.quarantined, [1, 3, 1]);
}
