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

use host::{cdu_topic, lease, quiet, release, sets_on, Boot, Host, DEFAULT, GPUS, GRACE_MS};
use loopwarden_protocol::samples::{self, demo_signing_key, T0};
use loopwarden_protocol::{
    AckCode, CapSource, CoolingStep, Event, Frame, HealthState, Message, MessageKind, NodeId, Role,
    TimestampMs, Topic, Watts, WholeCelsius,
};
use node_core::cooling_loss::Phase;
use node_core::health::Observation;
use node_core::node::{Effect, Input, KeptLimit, Level, Reading, REREAD_EVERY};

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

fn cmd_topic() -> Topic {
    samples::command_topic()
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

/// Rounds until the next periodic read of the limits has been answered.
fn until_reread(h: &mut Host, mut t: u64) -> u64 {
    for _ in 0..REREAD_EVERY {
        t += 1_000;
        h.healthy_round(t);
    }
    t
}

fn power_ceiling(e: &Event) -> Option<(u16, Watts, Watts)> {
    match e {
        Event::PowerCeiling { gpus, ceiling, was } => Some((*gpus, *ceiling, *was)),
        _ => None,
    }
}

#[test]
fn an_administrators_limit_is_the_ceiling_never_raised_and_left_at_the_stop() {
    // `nvidia-smi -pl 500` before the agent started: NVML's default is
    // 700 W, and 500 W is the site's.
    let mut h = Host::boot(Boot {
        limits: Watts(500),
        ..Boot::default()
    });
    assert_eq!(h.node.ceiling(0), Some(Watts(500)));
    assert_eq!(h.limits, [Watts(500); GPUS], "nothing set at start");
    let t = T0.0 + 1_000;
    h.step(t, Input::Frame(&cmd_topic(), &lease(1, t, 600, 20_000)));
    assert_eq!(
        h.limits,
        [Watts(500); GPUS],
        "a cap above it raises nothing"
    );
    h.step(t, Input::Frame(&cmd_topic(), &lease(2, t, 300, 20_000)));
    assert_eq!(h.limits, [Watts(300); GPUS]);
    h.step(t + 20_000, Input::Expiry);
    assert_eq!(
        h.limits,
        [Watts(500); GPUS],
        "lifted to the ceiling, not the default"
    );
    let t = until_reread(&mut h, t + 20_000);
    assert_eq!(h.limits, [Watts(500); GPUS]);
    h.step(t, Input::Stop);
    assert_eq!(h.limits, [Watts(500); GPUS], "back at 500 W after the stop");
    assert!(h.events.iter().all(|e| power_ceiling(e).is_none()));
    assert!(h
        .trail
        .iter()
        .flat_map(|e| match e {
            Effect::SetLimits(sets) => sets.clone(),
            _ => Vec::new(),
        })
        .all(|s| s.limit <= Watts(500)));
}

#[test]
fn a_limit_changed_while_running_is_the_new_ceiling_and_an_event_says_so() {
    let mut h = Host::new();
    let t = until_reread(&mut h, T0.0);
    assert!(h.events.iter().all(|e| power_ceiling(e).is_none()));
    // An administrator lowers GPU 1 and GPU 2 to 450 W.
    h.limits[1] = Watts(450);
    h.limits[2] = Watts(450);
    let t = until_reread(&mut h, t);
    assert_eq!(
        h.events
            .iter()
            .filter_map(power_ceiling)
            .collect::<Vec<_>>(),
        [(0b110, Watts(450), DEFAULT)],
        "one event for the GPUs changed alike"
    );
    assert_eq!(h.node.ceiling(1), Some(Watts(450)));
    assert_eq!(
        h.limits,
        [DEFAULT, Watts(450), Watts(450), DEFAULT],
        "not undone"
    );
    let kept = h.kept_limits.last().expect("the new ceilings kept");
    assert_eq!(kept[1].ceiling, Watts(450));
    assert_eq!(kept[0].ceiling, DEFAULT);

    // A cap below it still holds; one above it does not raise it.
    h.step(t, Input::Frame(&cmd_topic(), &lease(1, t, 600, 600_000)));
    assert_eq!(h.limits, [Watts(600), Watts(450), Watts(450), Watts(600)]);
    // Raised by hand while capped: the new ceiling, and the cap is set
    // again.
    h.limits[0] = Watts(650);
    until_reread(&mut h, t);
    assert_eq!(h.node.ceiling(0), Some(Watts(650)));
    assert_eq!(h.limits[0], Watts(600), "the cap below it set again");
    assert_eq!(
        h.events.iter().filter_map(power_ceiling).next_back(),
        Some((0b1, Watts(650), DEFAULT))
    );
}

#[test]
fn a_site_limit_is_a_ceiling_above_everything_found() {
    let mut h = Host::boot(Boot {
        site_limit: Some(Watts(600)),
        ..Boot::default()
    });
    assert_eq!(
        h.limits,
        [Watts(600); GPUS],
        "set down to the site limit at start"
    );
    h.limits[3] = Watts(700);
    let t = until_reread(&mut h, T0.0);
    assert_eq!(h.node.ceiling(3), Some(Watts(600)));
    assert_eq!(h.limits[3], Watts(600), "raised by hand above it: set back");
    h.step(t, Input::Stop);
    assert_eq!(h.limits, [Watts(600); GPUS]);
}

#[test]
fn a_restart_tells_its_own_limits_from_an_administrators() {
    // Stopped with a 300 W lease in force under a 500 W ceiling.
    let kept = KeptLimit {
        ceiling: Watts(500),
        asked: Watts(300),
        before: Some(Watts(500)),
    };
    let h = Host::boot(Boot {
        limits: Watts(300),
        kept: Some(kept),
        ..Boot::default()
    });
    assert_eq!(h.node.ceiling(0), Some(Watts(500)), "the agent's own cap");
    assert_eq!(
        h.limits,
        [Watts(500); GPUS],
        "its lease gone: lifted to the ceiling"
    );
    assert!(h.events.iter().all(|e| power_ceiling(e).is_none()));

    // Set to 450 W while it was stopped: the new ceiling, said.
    let h = Host::boot(Boot {
        limits: Watts(450),
        kept: Some(kept),
        ..Boot::default()
    });
    assert_eq!(h.node.ceiling(0), Some(Watts(450)));
    assert_eq!(h.limits, [Watts(450); GPUS]);
    assert_eq!(
        h.events
            .iter()
            .filter_map(power_ceiling)
            .collect::<Vec<_>>(),
        [(0b1111, Watts(450), Watts(500))]
    );
}

#[test]
fn every_set_is_kept_in_flash_before_it_is_made() {
    let mut h = Host::new();
    let t = T0.0 + 1_000;
    h.step(t, Input::Frame(&cmd_topic(), &lease(1, t, 400, 20_000)));
    h.step(t + 20_000, Input::Expiry);
    h.step(
        t + 21_000,
        Input::Frame(&cmd_topic(), &lease(2, t, 350, 600_000)),
    );
    let mut sets = 0;
    for (i, e) in h.trail.iter().enumerate() {
        let Effect::SetLimits(set) = e else { continue };
        sets += 1;
        let Some(Effect::KeepLimits(kept)) = i.checked_sub(1).map(|j| &h.trail[j]) else {
            panic!("set {sets} not kept first: {:?}", &h.trail[..i]);
        };
        for s in set {
            let k = kept[s.gpu as usize];
            assert_eq!(k.asked, s.limit);
            assert!(k.before.is_some() && k.ceiling == DEFAULT);
        }
    }
    assert_eq!(sets, 3);
}

#[test]
fn a_floor_is_kept_for_every_command_past_its_seq_check_and_restored_after_a_restart() {
    let mut h = Host::new();
    let t = T0.0 + 1_000;
    // Lasting 0 ms: refused as malformed, after its seq counted.
    let long = lease(7, t, 400, 0);
    h.step(t, Input::Frame(&cmd_topic(), &long));
    assert_eq!(h.acks.last().unwrap().code, AckCode::Malformed);
    let cdu_a = NodeId::new(Role::Cdu, "cdu-a").unwrap();
    assert_eq!(h.kept_floors, [(cdu_a.clone(), 7)]);
    let kept = h
        .trail
        .iter()
        .position(|e| matches!(e, Effect::KeepReplayFloor { .. }));
    let acked = h.trail.iter().position(|e| matches!(e, Effect::Ack(_)));
    assert!(kept < acked, "kept before the ack goes: {:?}", h.trail);
    // A forgery (signed by another key) keeps nothing.
    let mut forged = lease(8, t, 400, 60_000);
    forged
        .sign(
            &cmd_topic(),
            1,
            &loopwarden_protocol::auth::SigningKey::from_bytes(&[9; 32]),
        )
        .unwrap();
    h.step(t, Input::Frame(&cmd_topic(), &forged));
    assert_eq!(h.acks.last().unwrap().code, AckCode::Unauthenticated);
    assert_eq!(h.kept_floors.len(), 1);
    // After a restart that took the floor back, the same command is a
    // replay; without it, it would be judged afresh.
    let mut after = Host::new();
    after.node.restore_replay_floor(&cdu_a, 7);
    after.step(t + 10, Input::Frame(&cmd_topic(), &long));
    assert_eq!(after.acks.last().unwrap().code, AckCode::Replayed);
    let mut forgetful = Host::new();
    forgetful.step(t + 10, Input::Frame(&cmd_topic(), &long));
    assert_eq!(forgetful.acks.last().unwrap().code, AckCode::Malformed);
}

/// A GPU that could not say its UUID at start (marked degraded for a kept
/// state not read) and says it later: a quarantine kept for it applies
/// again, its actions run, and its health and the limits are kept in
/// flash from then on; a GPU with nothing kept is only kept.
#[test]
fn a_gpu_identified_late_gets_the_quarantine_kept_for_it() {
    use loopwarden_protocol::ReasonCode;
    use node_core::health::GpuStatus;
    let mut h = Host::new();
    let mark = GpuStatus {
        state: HealthState::Degraded,
        reason: ReasonCode::KEPT_STATE_UNREADABLE,
        since: T0,
        evidence: "its health state from before the restart could not be read".into(),
    };
    for g in [0, 1] {
        h.node.restore_health(g, mark.clone());
    }
    let mut t = T0.0;
    for _ in 0..5 {
        t += 1_000;
        h.healthy_round(t);
    }
    assert!(h.quarantined.is_empty());
    let kept = GpuStatus {
        state: HealthState::Quarantined,
        reason: ReasonCode(79),
        since: TimestampMs(T0.0 - 3_600_000),
        evidence: "XID 79 (GPU has fallen off the bus)".into(),
    };
    let trail = h.trail.len();
    h.step(
        t,
        Input::Identified {
            gpu: 1,
            kept: Some(&kept),
            limit: None,
        },
    );
    assert_eq!(h.state(1), HealthState::Quarantined);
    assert_eq!(h.quarantined, [1], "its actions run again");
    assert!(h.events.iter().any(|e| matches!(
        e,
        Event::HealthChanged {
            to: HealthState::Quarantined,
            ..
        }
    )));
    let new = &h.trail[trail..];
    let keeps = |n: u8| new.iter().filter(|e| **e == Effect::KeepHealth(n)).count();
    assert_eq!(keeps(1), 1, "kept once: {new:?}");
    assert!(new
        .iter()
        .any(|e| matches!(e, Effect::KeepLimits(l) if l.len() == GPUS)));

    let trail = h.trail.len();
    h.step(
        t + 10,
        Input::Identified {
            gpu: 0,
            kept: None,
            limit: None,
        },
    );
    assert_eq!(
        h.state(0),
        HealthState::Degraded,
        "the mark heals in its time"
    );
    let new = &h.trail[trail..];
    assert!(new.contains(&Effect::KeepHealth(0)), "{new:?}");
    assert!(!new.iter().any(|e| matches!(e, Effect::Quarantine { .. })));
}

/// A GPU identified late whose kept limits say the 300 W found on it was
/// a cap the agent left (stopped with a lease in force): its ceiling is
/// the kept 700 W again, said, lifted once no lease holds it, and kept so;
/// a GPU whose found limit is not one the agent left keeps it.
#[test]
fn a_gpu_identified_late_gets_its_kept_ceiling_back_where_the_cap_was_the_agents() {
    let mut h = Host::boot(Boot {
        limits: Watts(300),
        ..Boot::default()
    });
    assert_eq!(h.node.ceiling(1), Some(Watts(300)), "taken as found");
    let kept = KeptLimit {
        ceiling: Watts(700),
        asked: Watts(300),
        before: Some(Watts(700)),
    };
    let trail = h.trail.len();
    h.step(
        T0.0 + 1_000,
        Input::Identified {
            gpu: 1,
            kept: None,
            limit: Some(kept),
        },
    );
    assert_eq!(h.node.ceiling(1), Some(Watts(700)));
    assert_eq!(h.limits[1], Watts(700), "no lease holds it: lifted");
    assert_eq!(h.limits[0], Watts(300), "the others as they were");
    assert!(h
        .events
        .iter()
        .filter_map(power_ceiling)
        .any(|(gpus, now, was)| gpus == 0b0010 && now == Watts(700) && was == Watts(300)));
    let kept_limits = h.trail[trail..].iter().rev().find_map(|e| match e {
        Effect::KeepLimits(l) => Some(l.clone()),
        _ => None,
    });
    assert_eq!(kept_limits.map(|l| l[1].ceiling), Some(Watts(700)));
    // Found at 450 W: not the agent's: it stands.
    let other = KeptLimit {
        ceiling: Watts(700),
        asked: Watts(200),
        before: None,
    };
    h.step(
        T0.0 + 2_000,
        Input::Identified {
            gpu: 2,
            kept: None,
            limit: Some(KeptLimit {
                asked: Watts(250),
                ..other
            }),
        },
    );
    assert_eq!(h.node.ceiling(2), Some(Watts(300)));
}

/// A GPU identified late under a lease in force: its limits are kept
/// before the set its kept ceiling brings, so the last record kept holds
/// the limit set (a restart would otherwise take it for an
/// administrator's).
#[test]
fn a_late_ceiling_under_a_lease_is_kept_before_the_set_it_brings() {
    let mut h = Host::boot(Boot {
        limits: Watts(300),
        ..Boot::default()
    });
    let t = T0.0 + 1_000;
    h.step(t, Input::Frame(&cmd_topic(), &lease(1, t, 350, 60_000)));
    assert_eq!(h.limits[1], Watts(300), "under its 300 W ceiling");
    let trail = h.trail.len();
    let kept = KeptLimit {
        ceiling: Watts(700),
        asked: Watts(300),
        before: Some(Watts(700)),
    };
    h.step(
        t + 1_000,
        Input::Identified {
            gpu: 1,
            kept: None,
            limit: Some(kept),
        },
    );
    assert_eq!(h.limits[1], Watts(350), "the lease's cap under 700 W");
    let last = h.trail[trail..].iter().rev().find_map(|e| match e {
        Effect::KeepLimits(l) => Some(l[1]),
        _ => None,
    });
    assert_eq!(
        last.map(|l| (l.ceiling, l.asked)),
        Some((Watts(700), Watts(350)))
    );
}

/// A round in which GPU `i` answers a quiet sample with `seen[i]` in
/// force (the enforced limit the sample reads).
fn round_seeing(h: &mut Host, t: u64, seen: [Watts; GPUS]) {
    let readings: Vec<Reading> = seen
        .iter()
        .map(|w| Reading::Sample {
            observation: Observation {
                power_limit: f64::from(w.0),
                ..quiet()
            },
            temp: WholeCelsius(60),
            power: Watts(350),
        })
        .collect();
    h.step(t, Input::Round(&readings));
}

fn reads(trail: &[Effect]) -> usize {
    trail.iter().filter(|e| **e == Effect::ReadLimits).count()
}

#[test]
fn a_cap_undone_outside_the_agent_is_read_and_set_again_at_once() {
    let mut h = Host::new();
    let mut t = T0.0 + 1_000;
    h.step(t, Input::Frame(&cmd_topic(), &lease(1, t, 400, 600_000)));
    assert_eq!(h.limits, [Watts(400); GPUS]);
    for _ in 0..3 {
        t += 1_000;
        round_seeing(&mut h, t, [Watts(400); GPUS]);
    }
    // `nvidia-smi -pl 700` on GPU 0 while capped: every sample sees it.
    h.limits[0] = Watts(700);
    let from = h.trail.len();
    for _ in 0..2 {
        t += 1_000;
        let seen = h.limits;
        round_seeing(&mut h, t, seen);
    }
    let trail = &h.trail[from..];
    let read = trail
        .iter()
        .position(|e| *e == Effect::ReadLimits)
        .expect("a read within 2 rounds");
    assert_eq!(
        sets_on(&trail[read..], 0),
        [Watts(400)],
        "the cap set again"
    );
    assert_eq!(h.limits, [Watts(400); GPUS]);
    assert_eq!(
        h.node.ceiling(0),
        Some(Watts(700)),
        "the administrator's 700 W is the ceiling"
    );

    // A GPU whose enforced limit keeps reading above its limit (a driver
    // that says otherwise): read once per figure, not every round; one
    // below it (a board's cap) asks nothing.
    let from = h.trail.len();
    for _ in 0..20 {
        t += 1_000;
        round_seeing(&mut h, t, [Watts(700), Watts(300), Watts(400), Watts(400)]);
    }
    assert_eq!(reads(&h.trail[from..]), 1, "one read for the 700 W seen");
    assert_eq!(h.limits, [Watts(400); GPUS]);
}

#[test]
fn a_set_answered_past_its_deadline_that_took_is_in_force() {
    use node_core::node::{push_front, LimitResult, Now};
    use std::collections::VecDeque;

    let mut h = Host::new();
    let t = T0.0 + 1_000;
    let now = Now::at(t);
    let frame = lease(1, t, 400, 60_000);
    let late = "did not answer before its deadline";
    let (mut acks, mut said) = (Vec::new(), Vec::new());
    let mut queue = VecDeque::from(h.node.step(now, Input::Frame(&cmd_topic(), &frame)));
    while let Some(effect) = queue.pop_front() {
        let answer = match effect {
            // The set runs past the worker's deadline, then takes.
            Effect::SetLimits(sets) => {
                let results: Vec<LimitResult> = sets
                    .iter()
                    .map(|s| LimitResult {
                        gpu: s.gpu,
                        limit: s.limit,
                        set: Err(late.to_string()),
                        back: Ok(s.limit),
                    })
                    .collect();
                h.node.step(now, Input::LimitsSet(&results))
            }
            Effect::ReadLimits => h
                .node
                .step(now, Input::LimitsRead(&vec![Ok(DEFAULT); GPUS])),
            Effect::LogCommand => h.node.step(now, Input::Logged(Ok(()))),
            Effect::Acknowledge => h.node.step(now, Input::Acknowledge),
            Effect::Ack(ack) => {
                acks.push(ack);
                continue;
            }
            Effect::Say(level, line) => {
                said.push((level, line));
                continue;
            }
            _ => continue,
        };
        push_front(&mut queue, answer);
    }
    let ack = acks.last().expect("an ack");
    assert_eq!(ack.code, AckCode::Ok, "{}", ack.detail.as_str());
    assert!(ack.in_force.iter().all(|c| c.limit == Watts(400)));
    assert!(
        said.iter().all(|(level, _)| *level != Level::Error),
        "no error said: {said:?}"
    );
    assert_eq!(
        h.node.applied(0),
        (Some(Watts(400)), Some(CapSource::Cooling))
    );
}
