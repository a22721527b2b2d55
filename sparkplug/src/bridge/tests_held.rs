//! The core's checks of silence, held births, dropped frames and the
//! notices for the log.

use super::tests::{
    body, bridge, connected, host_telemetry, input, kinds, metric, online, rebirth_command, T,
};
use super::*;
use crate::payload::MetricValue;
use loopwarden_protocol::{samples, CduMode, MessageKind, ReasonCode};

fn cdu_telemetry() -> Input {
    input(
        Role::Cdu,
        "cdu-a",
        samples::message(MessageKind::CduTelemetry),
    )
}

#[test]
fn a_device_that_falls_silent_dies_and_its_next_frame_births_it() {
    let mut b = bridge();
    let out = connected(&mut b);
    let birth = body(&out[0]);
    assert_eq!(
        metric(&birth, "bridge/devices_silent"),
        Some(MetricValue::Long(0)),
        "in every NBIRTH"
    );
    b.step(T, host_telemetry("h07", 61));
    b.step(T, cdu_telemetry());
    assert!(b.step(T + 5_000, Input::Tick).is_empty(), "not yet");
    // The CDU keeps talking; the host's agent stops publishing.
    assert!(b.step(T + 59_000, cdu_telemetry()).is_empty());
    let out = b.step(T + 60_000, Input::Tick);
    assert_eq!(kinds(&out)[0], (Kind::DDeath, Some("h07")));
    assert_eq!(kinds(&out[1..]), [(Kind::NData, None)], "the CDU lives on");
    let data = body(&out[1]);
    assert_eq!(
        metric(&data, "bridge/devices_silent"),
        Some(MetricValue::Long(1))
    );
    assert_eq!(
        b.take_notices(),
        [Notice::Silent {
            device: "h07".into(),
            for_ms: 60_000
        }]
    );
    assert!(b.step(T + 61_000, Input::Tick).is_empty(), "said once");
    // Heard again: born again, with what it says now.
    let out = b.step(T + 62_000, host_telemetry("h07", 63));
    assert_eq!(kinds(&out), [(Kind::DBirth, Some("h07"))]);
    assert_eq!(
        metric(&body(&out[0]), "gpu/0/temp_c"),
        Some(MetricValue::Int(63))
    );
}

/// The DDEATHs of `device` from ticks every second from `from` to `to`
/// (both included), with `frames` stepped at their times: when each went out.
fn deaths(
    b: &mut Bridge,
    device: &str,
    (from, to): (u64, u64),
    frames: &mut dyn FnMut(u64) -> Option<Input>,
) -> Vec<u64> {
    let mut at = Vec::new();
    for now in (from..=to).step_by(1_000) {
        let mut out = frames(now).map_or_else(Vec::new, |f| b.step(now, f));
        out.extend(b.step(now, Input::Tick));
        if kinds(&out).contains(&(Kind::DDeath, Some(device))) {
            at.push(now);
        }
    }
    at
}

#[test]
fn a_host_that_samples_slowly_is_not_dead_between_two_samples() {
    let mut b = bridge();
    connected(&mut b);
    // Samples 30 s apart, the bridge ticking every second.
    let mut samples = |now: u64| {
        (now <= T + 60_000 && (now - T) % 30_000 == 0).then(|| host_telemetry("h07", 61))
    };
    let died = deaths(&mut b, "h07", (T, T + 200_000), &mut samples);
    // Its first silence is judged by the setting (10 s), its pace unknown;
    // from its second sample on, 3 × 30 s: dead 90 s after its last.
    assert_eq!(died, [T + 11_000, T + 151_000]);
}

#[test]
fn a_slow_samplers_pace_survives_its_death_and_a_loss_of_the_bus() {
    let mut b = bridge();
    connected(&mut b);
    let mut samples = |now: u64| {
        (now <= T + 270_000 && (now - T) % 30_000 == 0).then(|| host_telemetry("h07", 61))
    };
    let died = deaths(&mut b, "h07", (T, T + 100_000), &mut samples);
    assert_eq!(died, [T + 11_000]);
    // The bus lost for 150 s: the gap across the loss is no pace, the
    // one before is kept (3 × 30 s, not 3 × 180 s).
    b.step(T + 100_500, Input::LoopwardenConnected(false));
    let died = deaths(&mut b, "h07", (T + 101_000, T + 250_000), &mut samples);
    assert!(died.is_empty(), "{died:?}");
    b.step(T + 250_500, Input::LoopwardenConnected(true));
    let died = deaths(&mut b, "h07", (T + 251_000, T + 400_000), &mut samples);
    assert_eq!(died, [T + 361_000]);
}

#[test]
fn a_gap_across_a_fast_samplers_absence_is_not_its_pace() {
    let mut b = bridge();
    connected(&mut b);
    // Every second for 10 s, silent for 240 s, one sample, then nothing.
    let mut samples =
        |now: u64| (now <= T + 10_000 || now == T + 250_000).then(|| host_telemetry("h07", 61));
    let died = deaths(&mut b, "h07", (T, T + 1_000_000), &mut samples);
    // Its pace (1 s) stays: the 240 s across its death is no pace, so it
    // dies 11 s after its last sample, not 3 × 240 s after.
    assert_eq!(died, [T + 21_000, T + 261_000]);
}

#[test]
fn a_host_set_to_sample_more_slowly_dies_at_most_twice_then_keeps_its_pace() {
    let mut b = bridge();
    connected(&mut b);
    // Every second for 10 s, then every 30 s (its period changed).
    let mut samples = |now: u64| {
        let s = now - T;
        (s <= 10_000 || (s >= 40_000 && s % 30_000 == 10_000)).then(|| host_telemetry("h07", 61))
    };
    let died = deaths(&mut b, "h07", (T, T + 400_000), &mut samples);
    assert!(died.len() <= 3, "{died:?}");
    assert!(died.iter().all(|&d| d < T + 120_000), "{died:?}");
}

#[test]
fn a_clean_stop_and_start_keeps_a_known_pace() {
    let mut b = bridge();
    connected(&mut b);
    // Every second for 5 s, a clean stop, back after 194 s.
    let mut frames = |now: u64| match now - T {
        0..=5_000 => Some(host_telemetry("h07", 61)),
        6_000 => Some(online(Role::Host, "h07", false)),
        200_000 => Some(online(Role::Host, "h07", true)),
        201_000 => Some(host_telemetry("h07", 61)),
        _ => None,
    };
    let died = deaths(&mut b, "h07", (T, T + 1_000_000), &mut frames);
    // Its pace (1 s) stays: dead 11 s after its last sample.
    assert_eq!(died, [T + 6_000, T + 212_000]);
}

#[test]
fn a_forgotten_device_keeps_its_pace_when_heard_again() {
    let mut b = bridge();
    connected(&mut b);
    // A sample every 30 s: its pace learned (no tick until it is).
    for s in [0, 30_000, 60_000] {
        b.step(T + s, host_telemetry("h07", 61));
    }
    b.step(T + 61_000, online(Role::Host, "h07", false));
    let t = T + 62_000;
    let out = b.step(t, Input::Command(rebirth_command()));
    assert_eq!(kinds(&out)[1], (Kind::DDeath, Some("h07")));
    // Away past the pace window: the next round forgets it.
    let later = t + PACE_MAX_MS + 1_000;
    b.step(later, Input::Command(rebirth_command()));
    assert_eq!(b.devices(), 0, "forgotten");
    b.step(later + 1_000, online(Role::Host, "h07", true));
    let out = b.step(later + 1_000, host_telemetry("h07", 62));
    assert_eq!(kinds(&out), [(Kind::DBirth, Some("h07"))]);
    // Its 30 s pace holds: not dead 15 s after that sample.
    let out = b.step(later + 16_000, Input::Tick);
    assert!(
        !kinds(&out).contains(&(Kind::DDeath, Some("h07"))),
        "{:?}",
        kinds(&out)
    );
}

#[test]
fn silence_is_timed_on_the_monotonic_clock_whatever_the_wall_clock_does() {
    const HOUR: u64 = 3_600_000;
    let at = |wall: u64, mono: u64| Now { wall, mono };
    let mut b = bridge();
    b.connecting(T);
    b.step(at(T, 0), Input::Connected);
    let out = b.step(at(T, 1_000), host_telemetry("h07", 61));
    assert_eq!(kinds(&out), [(Kind::DBirth, Some("h07"))]);
    // The wall clock stepped forward an hour (a VM resumed, makestep),
    // 1 s later: the host spoke 1 s ago, it lives.
    let out = b.step(at(T + HOUR, 2_000), Input::Tick);
    assert!(
        !kinds(&out).contains(&(Kind::DDeath, Some("h07"))),
        "{out:?}"
    );
    assert_eq!(b.take_notices(), []);
    // Then back an hour, 11 s after its last frame: dead, as it is.
    let out = b.step(at(T - HOUR, 12_000), Input::Tick);
    assert_eq!(kinds(&out)[0], (Kind::DDeath, Some("h07")));
    assert_eq!(
        body(&out[0]).timestamp,
        Some(T - HOUR),
        "stamped by the wall"
    );
    let silent = Notice::Silent {
        device: "h07".into(),
        for_ms: 11_000,
    };
    assert_eq!(b.take_notices(), [silent]);
}

#[test]
fn a_stepped_wall_clock_does_not_move_a_rebirth_window() {
    let at = |wall: u64, mono: u64| Now { wall, mono };
    let mut b = bridge();
    b.connecting(T);
    b.step(at(T, 0), Input::Connected);
    let rebirth = |b: &mut Bridge, now| b.step(now, Input::Command(rebirth_command()));
    assert!(!rebirth(&mut b, at(T, 1_000)).is_empty(), "at once");
    // The wall clock a day on, 1 s later: still within the window.
    assert!(rebirth(&mut b, at(T + 86_400_000, 2_000)).is_empty());
    let notices = b.take_notices();
    let limited = Notice::RebirthsLimited {
        in_ms: REBIRTH_EVERY_MS - 1_000,
        total: 1,
    };
    assert_eq!(notices, [limited]);
}

#[test]
fn a_cdu_whose_controller_is_silent_lives_on_its_gateways_states() {
    let mut b = bridge();
    connected(&mut b);
    let state = |mode, reason| {
        let Message::CduState(mut s) = samples::message(MessageKind::CduState) else {
            unreachable!("the sample is a CDU state")
        };
        (s.mode, s.reason) = (mode, reason);
        input(Role::Cdu, "cdu-a", Message::CduState(s))
    };
    b.step(T, cdu_telemetry());
    b.step(T, state(CduMode::Normal, ReasonCode::OK));
    // The controller falls silent: its gateway says so about once a
    // minute (a little late at times), and sends no telemetry.
    let last = T + 245_000;
    let mut states = |now: u64| {
        let due = [T + 2_000, T + 62_000, T + 123_000, T + 184_000, last];
        due.contains(&now)
            .then(|| state(CduMode::Failsafe, ReasonCode::CONTROLLER_SILENT))
    };
    let died = deaths(&mut b, "cdu-a", (T + 1_000, T + 400_000), &mut states);
    // Dead only once its gateway falls silent too: 1.5 × 61 s later.
    assert_eq!(died, [last + 92_000]);
    let out = b.step(last + 93_000, cdu_telemetry());
    assert_eq!(kinds(&out), [(Kind::DBirth, Some("cdu-a"))], "back");
    // Its controller back, telemetry every second: the setting again.
    let mut telemetry = |now: u64| (now < last + 100_000).then(cdu_telemetry);
    let died = deaths(
        &mut b,
        "cdu-a",
        (last + 94_000, last + 120_000),
        &mut telemetry,
    );
    assert_eq!(died, [last + 110_000]);
}

#[test]
fn notices_past_the_queue_are_counted() {
    let mut b = bridge();
    connected(&mut b);
    let hosts = NOTICES + 6;
    for i in 0..hosts {
        b.step(T, host_telemetry(&format!("h{i:03}"), 61));
    }
    b.take_notices();
    let out = b.step(T + 11_000, Input::Tick);
    let dead = kinds(&out).iter().filter(|k| k.0 == Kind::DDeath).count();
    assert_eq!(dead, hosts, "every one dies");
    let notices = b.take_notices();
    assert_eq!(notices.len(), NOTICES + 1);
    assert!(notices[..NOTICES]
        .iter()
        .all(|n| matches!(n, Notice::Silent { .. })));
    assert_eq!(notices[NOTICES], Notice::NoticesLost { count: 6 });
    assert_eq!(b.take_notices(), [], "counted once");
}

#[test]
fn dropped_publishes_give_births_once_per_window_and_no_data_until_then() {
    let mut b = bridge();
    connected(&mut b);
    b.step(T, host_telemetry("h07", 61));
    b.step(
        T + 1_000,
        Input::Dropped {
            count: 1,
            deaths: Vec::new(),
        },
    );
    let out = b.step(T + 1_000, Input::Tick);
    assert_eq!(
        kinds(&out),
        [(Kind::NBirth, None), (Kind::DBirth, Some("h07"))]
    );
    // Those births did not fit either: one doubling, however many sends.
    b.step(
        T + 1_000,
        Input::Dropped {
            count: 1,
            deaths: Vec::new(),
        },
    );
    b.step(
        T + 1_000,
        Input::Dropped {
            count: 1,
            deaths: Vec::new(),
        },
    );
    assert!(
        b.step(T + 2_000, Input::Tick).is_empty(),
        "within the window"
    );
    assert!(
        b.step(T + 2_000, host_telemetry("h07", 70)).is_empty(),
        "no DDATA while the births are due"
    );
    // The window doubled to 10 s: births again with the current values.
    let out = b.step(T + 11_000, Input::Tick);
    assert_eq!(
        kinds(&out),
        [(Kind::NBirth, None), (Kind::DBirth, Some("h07"))]
    );
    assert_eq!(
        metric(&body(&out[1]), "gpu/0/temp_c"),
        Some(MetricValue::Int(70))
    );
    let dropped = metric(&body(&out[0]), "bridge/publishes_dropped");
    assert_eq!(dropped, Some(MetricValue::Long(3)));
    // Dropped again at once: 20 s now.
    b.step(
        T + 11_000,
        Input::Dropped {
            count: 1,
            deaths: Vec::new(),
        },
    );
    b.step(T + 12_000, host_telemetry("h07", 71));
    assert!(b.step(T + 30_000, Input::Tick).is_empty(), "nor NDATA");
    let out = b.step(T + 31_000, Input::Tick);
    assert_eq!(kinds(&out)[0], (Kind::NBirth, None));
    // A window without drops: the next drop is answered at the next tick.
    b.step(T + 60_000, host_telemetry("h07", 72));
    assert!(b.step(T + 60_000, Input::Tick).len() <= 1, "NDATA at most");
    b.step(
        T + 61_000,
        Input::Dropped {
            count: 1,
            deaths: Vec::new(),
        },
    );
    let out = b.step(T + 61_000, Input::Tick);
    assert_eq!(kinds(&out)[0], (Kind::NBirth, None));
}

#[test]
fn a_rebirth_held_back_stops_data_until_its_births() {
    let mut b = bridge();
    connected(&mut b);
    b.step(T, host_telemetry("h07", 61));
    let out = b.step(T, Input::Command(rebirth_command()));
    assert_eq!(kinds(&out)[0], (Kind::NBirth, None));
    let out = b.step(T + 1_000, Input::Command(rebirth_command()));
    assert!(out.is_empty(), "held back");
    let out = b.step(T + 2_000, host_telemetry("h07", 66));
    assert!(out.is_empty(), "no DDATA once a rebirth is asked");
    assert!(b.step(T + 4_000, Input::Tick).is_empty());
    let out = b.step(T + 5_000, Input::Tick);
    assert_eq!(
        kinds(&out),
        [(Kind::NBirth, None), (Kind::DBirth, Some("h07"))]
    );
    assert_eq!(
        metric(&body(&out[1]), "gpu/0/temp_c"),
        Some(MetricValue::Int(66)),
        "the births carry what came meanwhile"
    );
    let out = b.step(T + 6_000, host_telemetry("h07", 67));
    assert_eq!(kinds(&out), [(Kind::DData, Some("h07"))], "data again");
}

#[test]
fn a_retained_ncmd_is_refused_and_says_how_to_clear_it() {
    let mut b = bridge();
    connected(&mut b);
    b.step(T, host_telemetry("h07", 61));
    // The broker hands a retained NCMD over at every subscription: were it
    // taken, every connection would send a second round of births.
    let out = b.step(T + 6_000, Input::RetainedCommand(rebirth_command()));
    assert!(out.is_empty(), "no births: {:?}", kinds(&out));
    let notices = b.take_notices();
    let [Notice::CommandRefused { why }] = &notices[..] else {
        panic!("{notices:?}")
    };
    assert!(why.contains("retained"), "{why}");
    assert!(
        why.contains("empty retained publish to spBv1.0/hall-1/NCMD/loopwarden"),
        "{why}"
    );
    let out = b.step(T + 10_000, Input::Tick);
    assert_eq!(
        metric(&body(&out[0]), "bridge/commands_refused"),
        Some(MetricValue::Long(1))
    );
    // The same request, not retained, is a rebirth.
    let out = b.step(T + 11_000, Input::Command(rebirth_command()));
    assert_eq!(kinds(&out)[0], (Kind::NBirth, None));
}

#[test]
fn a_refused_command_is_said_with_why_and_one_outside_a_session_is_counted() {
    let mut b = bridge();
    b.step(T, Input::Command(rebirth_command()));
    let notices = b.take_notices();
    assert!(
        matches!(&notices[..], [Notice::CommandRefused { why }] if why.contains("no Sparkplug session")),
        "{notices:?}"
    );
    connected(&mut b);
    assert!(b.step(T, Input::Command(vec![0xff, 0xff])).is_empty());
    let notices = b.take_notices();
    assert!(
        matches!(&notices[..], [Notice::CommandRefused { why }] if why.contains("cannot be decoded")),
        "{notices:?}"
    );
    let other = payload::encode(T, None, Vec::new());
    b.step(T, Input::Command(other));
    let notices = b.take_notices();
    let want = format!("not {REBIRTH} = true");
    assert!(
        matches!(&notices[..], [Notice::CommandRefused { why }] if *why == want),
        "{notices:?}"
    );
    let out = b.step(T + 10_000, Input::Tick);
    let refused = metric(&body(&out[0]), "bridge/commands_refused");
    assert_eq!(refused, Some(MetricValue::Long(3)));
}

#[test]
fn the_empty_publish_that_clears_a_retained_ncmd_is_ignored_not_refused() {
    let mut b = bridge();
    connected(&mut b);
    // Clearing a retained NCMD is an empty retained publish, which the
    // broker hands to its subscribers live, not retained.
    assert!(b.step(T + 6_000, Input::Command(Vec::new())).is_empty());
    assert_eq!(b.take_notices(), [Notice::EmptyCommand]);
    let out = b.step(T + 7_000, Input::Command(rebirth_command()));
    assert_eq!(kinds(&out)[0], (Kind::NBirth, None));
    let refused = metric(&body(&out[0]), "bridge/commands_refused");
    assert_eq!(refused, Some(MetricValue::Long(0)));
}

#[test]
fn a_host_using_a_cdus_id_is_said_once_naming_both() {
    let mut b = bridge();
    connected(&mut b);
    let out = b.step(T, cdu_telemetry());
    assert_eq!(kinds(&out), [(Kind::DBirth, Some("cdu-a"))]);
    assert!(b.step(T, host_telemetry("cdu-a", 61)).is_empty());
    let notices = b.take_notices();
    let [Notice::FrameRefused { topic, sender, why }] = &notices[..] else {
        panic!("one refusal: {notices:?}")
    };
    assert!(topic.contains("host/cdu-a"), "{topic}");
    assert!(sender.contains("cdu-a"), "{sender}");
    assert!(why.contains("cdu cdu-a") && why.contains("a host"), "{why}");
    assert!(b.step(T, host_telemetry("cdu-a", 62)).is_empty());
    assert_eq!(b.take_notices(), [], "once per id");
    // A frame on another node's topic is said too.
    let Input::Frame(topic, mut frame) = host_telemetry("h07", 61) else {
        unreachable!("a frame")
    };
    frame.sender = loopwarden_protocol::NodeId::new(Role::Host, "h08").unwrap();
    b.step(T, Input::Frame(topic, frame));
    let notices = b.take_notices();
    assert!(
        matches!(&notices[..], [Notice::FrameRefused { why, .. }] if why.contains("another node")),
        "{notices:?}"
    );
}

#[test]
fn frames_the_loopwarden_client_dropped_kill_every_device_until_heard() {
    let mut b = bridge();
    let out = connected(&mut b);
    let birth = body(&out[0]);
    let dropped = metric(&birth, "bridge/frames_dropped_inbound");
    assert_eq!(dropped, Some(MetricValue::Long(0)), "in every NBIRTH");
    b.step(T, host_telemetry("h07", 61));
    b.step(T, cdu_telemetry());
    assert!(b.step(T, Input::InboundDropped(0)).is_empty());
    let out = b.step(T + 1_000, Input::InboundDropped(3));
    assert_eq!(
        kinds(&out),
        [(Kind::DDeath, Some("cdu-a")), (Kind::DDeath, Some("h07"))]
    );
    assert_eq!(
        b.take_notices(),
        [Notice::InboundDropped { new: 3, total: 3 }]
    );
    assert!(b.step(T + 1_000, Input::InboundDropped(3)).is_empty());
    let out = b.step(T + 2_000, host_telemetry("h07", 62));
    assert_eq!(kinds(&out), [(Kind::DBirth, Some("h07"))]);
    let out = b.step(T + 11_000, Input::Tick);
    assert_eq!(kinds(&out), [(Kind::NData, None)]);
    let data = body(&out[0]);
    let dropped = metric(&data, "bridge/frames_dropped_inbound");
    assert_eq!(dropped, Some(MetricValue::Long(3)));
}

#[test]
fn dead_devices_are_forgotten_once_a_round_of_births_said_so_and_they_stay_unheard() {
    let mut b = bridge();
    connected(&mut b);
    b.step(T, host_telemetry("keep", 60));
    // Churn: 5,000 hosts come and go.
    for i in 0..5_000 {
        let id = format!("h{i}");
        b.step(T, host_telemetry(&id, 61));
        b.step(T, online(Role::Host, &id, false));
    }
    assert_eq!(b.devices(), 5_001);
    // The next round of births says every death again.
    let out = b.step(T + 1_000, Input::Command(rebirth_command()));
    assert_eq!(out.len(), 2 + 5_000, "NBIRTH, keep's DBIRTH, 5,000 DDEATH");
    assert_eq!(kinds(&out[2..3]), [(Kind::DDeath, Some("h0"))]);
    // Past the pace window unheard, a round forgets them, unsaid.
    let later = T + 1_000 + PACE_MAX_MS;
    b.step(later, host_telemetry("keep", 62));
    let out = b.step(later, Input::Command(rebirth_command()));
    assert_eq!(out.len(), 2, "{:?}", kinds(&out[..out.len().min(4)]));
    assert_eq!(
        kinds(&out),
        [(Kind::NBirth, None), (Kind::DBirth, Some("keep"))]
    );
    assert_eq!(b.devices(), 1);
    // One that comes back is born as a new device.
    b.step(later, online(Role::Host, "h7", true));
    let out = b.step(later, host_telemetry("h7", 63));
    assert_eq!(kinds(&out), [(Kind::DBirth, Some("h7"))]);
}

#[test]
fn a_death_is_said_again_before_it_is_forgotten_when_its_round_may_have_been_dropped() {
    let mut b = bridge();
    connected(&mut b);
    b.step(T, host_telemetry("h07", 61));
    b.step(T, online(Role::Host, "h07", false));
    let out = b.step(T + 1_000, Input::Command(rebirth_command()));
    assert_eq!(kinds(&out)[1], (Kind::DDeath, Some("h07")));
    // Publishes dropped after that round: it may not have gone out.
    let later = T + 1_000 + PACE_MAX_MS;
    let deaths = vec!["h07".to_string()];
    b.step(later, Input::Dropped { count: 1, deaths });
    let out = b.step(later, Input::Tick);
    assert_eq!(
        kinds(&out),
        [(Kind::NBirth, None), (Kind::DDeath, Some("h07"))],
        "said again"
    );
    let out = b.step(later + REBIRTH_EVERY_MS, Input::Command(rebirth_command()));
    assert_eq!(kinds(&out), [(Kind::NBirth, None)], "then forgotten");
    assert_eq!(b.devices(), 0);
}

#[test]
fn dead_devices_are_forgotten_though_other_publishes_are_dropped() {
    let mut b = bridge();
    connected(&mut b);
    b.step(T, host_telemetry("keep", 60));
    for i in 0..10 {
        let id = format!("h{i}");
        b.step(T, host_telemetry(&id, 61));
        b.step(T, online(Role::Host, &id, false));
    }
    let out = b.step(T + 1_000, Input::Command(rebirth_command()));
    assert_eq!(out.len(), 2 + 10, "NBIRTH, keep's DBIRTH, 10 DDEATH");
    // Publishes dropped, none of them a DDEATH: each drop gives a round
    // of births, which need not say those deaths again.
    let mut at = T + PACE_MAX_MS;
    for _ in 0..3 {
        b.step(at, host_telemetry("keep", 61));
        b.step(
            at,
            Input::Dropped {
                count: 1,
                deaths: Vec::new(),
            },
        );
        at += RESYNC_MAX_MS;
        b.step(at, host_telemetry("keep", 61));
        let out = b.step(at, Input::Tick);
        assert_eq!(kinds(&out)[0], (Kind::NBirth, None));
    }
    assert_eq!(b.devices(), 1);
}
