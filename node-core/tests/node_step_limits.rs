//! The node's step and the GPUs' power limits, with no runtime, no bus
//! and no NVML: an administrator's limit as the ceiling, a limit changed
//! while running, the site limit, a restart telling its own limits from
//! an administrator's, every set and replay floor kept in flash first, a
//! GPU identified late, a cap undone outside the agent and a set answered
//! past its deadline. [`Host`] (in `host/`) plays the shell.

mod host;

use host::{cmd_topic, lease, quiet, sets_on, Boot, Host, DEFAULT, GPUS};
use loopwarden_protocol::samples::T0;
use loopwarden_protocol::{
    AckCode, CapSource, Event, HealthState, NodeId, ReplayFloor, Role, TimestampMs, Watts,
    WholeCelsius,
};
use node_core::health::Observation;
use node_core::node::{Effect, Input, KeptLimit, Level, Reading, REREAD_EVERY};

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
    assert_eq!(kept[1].map(|k| k.ceiling), Some(Watts(450)));
    assert_eq!(kept[0].map(|k| k.ceiling), Some(DEFAULT));

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

/// With volatile state (no flash file) the leases are gone at a stop: a
/// cap left on would be found by the next start as the GPUs' uncapped
/// limit, and nothing would ever lift it. The stop puts the ceilings back
/// even with a lease in force, and says so; with a flash the cap stays,
/// for the next start to keep or lift as the kept leases say.
#[test]
fn a_volatile_node_stopping_with_a_lease_puts_the_ceilings_back() {
    for volatile in [true, false] {
        let mut h = match volatile {
            true => Host::boot_volatile(Boot::default()),
            false => Host::new(),
        };
        let t = T0.0 + 1_000;
        h.step(t, Input::Frame(&cmd_topic(), &lease(1, t, 300, 600_000)));
        assert_eq!(h.limits, [Watts(300); GPUS], "volatile {volatile}");
        h.trail.clear();
        h.step(t + 1_000, Input::Stop);
        let said: Vec<&String> = h
            .trail
            .iter()
            .filter_map(|e| match e {
                Effect::Say(_, line) if line.contains("lease(s) in force") => Some(line),
                _ => None,
            })
            .collect();
        assert_eq!(said.len(), 1, "volatile {volatile}: {:?}", h.trail);
        if volatile {
            assert_eq!(h.limits, [DEFAULT; GPUS], "the ceilings put back");
            assert!(
                said[0].contains("volatile_state") && said[0].contains("put back"),
                "{}",
                said[0]
            );
        } else {
            assert_eq!(h.limits, [Watts(300); GPUS], "left for the next start");
            assert!(said[0].contains("stay as they are"), "{}", said[0]);
        }
    }
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
            let k = kept[s.gpu as usize].expect("kept");
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
    let floor = ReplayFloor::new(7, TimestampMs(t));
    assert_eq!(h.kept_floors, [(cdu_a.clone(), floor)]);
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
    after.node.restore_replay_floor(&cdu_a, floor);
    after.step(t + 10, Input::Frame(&cmd_topic(), &long));
    assert_eq!(after.acks.last().unwrap().code, AckCode::Replayed);
    // A floor an earlier version kept, its seq alone: the same, as every
    // command numbered at or below it is a replay, whatever its stamp.
    let mut before = Host::new();
    before.node.restore_seq_floor(&cdu_a, 7);
    before.step(t + 10, Input::Frame(&cmd_topic(), &long));
    assert_eq!(before.acks.last().unwrap().code, AckCode::Replayed);
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
    assert_eq!(
        kept_limits.and_then(|l| l[1]).map(|k| k.ceiling),
        Some(Watts(700))
    );
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
        Effect::KeepLimits(l) => l[1],
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
                        first: None,
                        range: None,
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

/// A cap above a GPU's highest settable limit (800 W here; a cap sent in
/// milliwatts, say) caps nothing: acked clamped, its maximum named. A
/// cap at or below it (the CDU's lift at the board's TDP) is taken as
/// sent.
#[test]
fn a_cap_above_the_highest_settable_limit_is_acked_clamped_naming_it() {
    let mut h = Host::new();
    let t = T0.0 + 1_000;
    h.step(t, Input::Frame(&cmd_topic(), &lease(1, t, 450_000, 60_000)));
    let ack = h.acks.last().unwrap();
    assert_eq!(ack.code, AckCode::Clamped, "{}", ack.detail.as_str());
    assert!(
        ack.detail
            .as_str()
            .starts_with("GPU 0: 450000 W is above its maximum 800 W"),
        "{}",
        ack.detail.as_str()
    );
    assert_eq!(h.limits, [DEFAULT; GPUS], "nothing capped");
    for (seq, w) in [(2, 800), (3, DEFAULT.0)] {
        let t = t + 100 * seq as u64;
        h.step(t, Input::Frame(&cmd_topic(), &lease(seq, t, w, 5_000)));
        let ack = h.acks.last().unwrap();
        assert_eq!(ack.code, AckCode::Ok, "{w} W: {}", ack.detail.as_str());
        assert!(ack.detail.is_empty(), "{}", ack.detail.as_str());
    }
}

/// A cap above a GPU's highest settable limit on a host whose site limit
/// (600 W) holds its ceiling below that maximum (800 W): the ack names the
/// limit in force, the ceiling, not the maximum the GPU never reaches.
#[test]
fn a_cap_above_the_highest_settable_limit_names_the_ceiling_in_force() {
    let mut h = Host::boot(Boot {
        site_limit: Some(Watts(600)),
        ..Boot::default()
    });
    let t = T0.0 + 1_000;
    h.step(t, Input::Frame(&cmd_topic(), &lease(1, t, 450_000, 60_000)));
    let ack = h.acks.last().unwrap();
    assert_eq!(ack.code, AckCode::Clamped, "{}", ack.detail.as_str());
    assert!(
        ack.detail
            .as_str()
            .starts_with("GPU 0: 450000 W is above its maximum 800 W; clamped to 600 W"),
        "{}",
        ack.detail.as_str()
    );
    assert!(
        !ack.detail.as_str().contains("to 800 W"),
        "{}",
        ack.detail.as_str()
    );
    assert_eq!(h.limits, [Watts(600); GPUS], "the site limit in force");
    assert!(ack.in_force.iter().all(|c| c.limit == Watts(600)));
}
