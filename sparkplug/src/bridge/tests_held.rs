//! The core's checks of silence, held births, dropped frames and the
//! notices for the log.

use super::tests::{
    body, bridge, connected, host_telemetry, input, kinds, metric, rebirth_command, T,
};
use super::*;
use crate::payload::MetricValue;
use loopwarden_protocol::{samples, MessageKind};

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

#[test]
fn a_host_that_samples_slowly_is_not_dead_between_two_samples() {
    let mut b = bridge();
    connected(&mut b);
    b.step(T, host_telemetry("h07", 61));
    b.step(T + 30_000, host_telemetry("h07", 61));
    // Samples 30 s apart: 90 s of silence before it is dead.
    let out = b.step(T + 110_000, Input::Tick);
    assert!(!kinds(&out).contains(&(Kind::DDeath, Some("h07"))));
    let out = b.step(T + 121_000, Input::Tick);
    assert_eq!(kinds(&out)[0], (Kind::DDeath, Some("h07")));
}

#[test]
fn dropped_publishes_give_births_once_per_window_and_no_data_until_then() {
    let mut b = bridge();
    connected(&mut b);
    b.step(T, host_telemetry("h07", 61));
    b.step(T + 1_000, Input::Dropped(1));
    let out = b.step(T + 1_000, Input::Tick);
    assert_eq!(
        kinds(&out),
        [(Kind::NBirth, None), (Kind::DBirth, Some("h07"))]
    );
    // Those births did not fit either: one doubling, however many sends.
    b.step(T + 1_000, Input::Dropped(1));
    b.step(T + 1_000, Input::Dropped(1));
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
    b.step(T + 11_000, Input::Dropped(1));
    b.step(T + 12_000, host_telemetry("h07", 71));
    assert!(b.step(T + 30_000, Input::Tick).is_empty(), "nor NDATA");
    let out = b.step(T + 31_000, Input::Tick);
    assert_eq!(kinds(&out)[0], (Kind::NBirth, None));
    // A window without drops: the next drop is answered at the next tick.
    b.step(T + 60_000, host_telemetry("h07", 72));
    assert!(b.step(T + 60_000, Input::Tick).len() <= 1, "NDATA at most");
    b.step(T + 61_000, Input::Dropped(1));
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
