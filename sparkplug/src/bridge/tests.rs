//! The core's checks: sessions, numbering, devices, rebirth, refusals.

use super::*;
use crate::payload::{decode, MetricValue, Payload};
use loopwarden_protocol::{
    samples, CduMode, ClockSource, MessageKind, NodeId, Online, ReasonCode, Text, TimestampMs,
    WholeCelsius,
};
use proptest::prelude::*;

pub(super) const T: u64 = 1_795_953_600_000;

pub(super) fn bridge() -> Bridge {
    Bridge::new(BridgeConfig {
        group: "hall-1".into(),
        edge_node: "loopwarden".into(),
        site: "hall-1".into(),
        software: "0.1.0".into(),
        ndata_every_ms: 10_000,
        host_silent_after_ms: SILENT_AFTER_MS,
        cdu_silent_after_ms: SILENT_AFTER_MS,
        max_devices: 2_000,
    })
}

pub(super) fn input(role: Role, id: &str, message: Message) -> Input {
    let site = Ident::new("hall-1").unwrap();
    let node = NodeId::new(role, id).unwrap();
    let family = message.kind().family();
    let topic = Topic::new(&site, role, &node.id, family);
    let frame = Frame {
        sender: node,
        seq: 1,
        time: TimestampMs(T),
        message,
    };
    Input::Frame(topic, frame)
}

pub(super) fn online(role: Role, id: &str, up: bool) -> Input {
    let o = Online {
        online: up,
        software: Text::truncated("0.1.0"),
        started: TimestampMs(T),
        clock: ClockSource::UnixEpoch,
    };
    input(role, id, Message::Online(o))
}

pub(super) fn host_telemetry(id: &str, temp: u8) -> Input {
    let mut t = samples::host_telemetry(2);
    t.gpus[0].temp = WholeCelsius(temp);
    input(Role::Host, id, Message::HostTelemetry(t))
}

pub(super) fn cdu_state() -> Input {
    input(Role::Cdu, "cdu-a", samples::message(MessageKind::CduState))
}

pub(super) fn body(p: &Publish) -> Payload {
    decode(&p.payload).expect("the bridge's payloads decode")
}

pub(super) fn metric(p: &Payload, name: &str) -> Option<MetricValue> {
    let m = p.metrics.iter().find(|m| m.name.as_deref() == Some(name))?;
    m.value.clone()
}

pub(super) fn kinds(out: &[Publish]) -> Vec<(Kind, Option<&str>)> {
    out.iter().map(|p| (p.kind, p.device.as_deref())).collect()
}

pub(super) fn connected(b: &mut Bridge) -> Vec<Publish> {
    b.connecting(T);
    b.step(T, Input::Connected)
}

pub(super) fn rebirth_command() -> Vec<u8> {
    let m = payload::Metric {
        name: Some(REBIRTH.into()),
        value: Some(MetricValue::Boolean(true)),
        ..Default::default()
    };
    payload::encode(T, None, vec![m])
}

#[test]
fn the_birth_carries_seq_0_the_wills_bdseq_and_the_rebirth_control() {
    let mut b = bridge();
    let will = b.connecting(T);
    assert_eq!(will.topic, "spBv1.0/hall-1/NDEATH/loopwarden");
    assert_eq!((will.kind, will.qos), (Kind::NDeath, 1));
    let death = body(&will);
    assert_eq!(death.seq, None, "an NDEATH has no seq");
    assert_eq!(metric(&death, "bdSeq"), Some(MetricValue::Long(0)));
    let will = b.connecting(T);
    assert_eq!(metric(&body(&will), "bdSeq"), Some(MetricValue::Long(1)));
    let out = b.step(T, Input::Connected);
    assert_eq!(kinds(&out), [(Kind::NBirth, None)]);
    assert_eq!(out[0].topic, "spBv1.0/hall-1/NBIRTH/loopwarden");
    let birth = body(&out[0]);
    assert_eq!((birth.seq, birth.timestamp), (Some(0), Some(T)));
    assert_eq!(metric(&birth, "bdSeq"), Some(MetricValue::Long(1)));
    assert_eq!(metric(&birth, REBIRTH), Some(MetricValue::Boolean(false)));
    assert!(birth
        .metrics
        .iter()
        .all(|m| m.datatype.is_some() && m.timestamp == Some(T)));
}

#[test]
fn the_largest_births_fit_the_loopwarden_brokers_packet_limit() {
    // Every name at its longest, a host of the most GPUs, every GPU
    // with a health entry: the births a shared broker must let through.
    let long = |c: char| std::iter::repeat_n(c, loopwarden_protocol::ids::IDENT_MAX).collect();
    let mut b = Bridge::new(BridgeConfig {
        group: long('g'),
        edge_node: long('e'),
        site: "hall-1".into(),
        software: "0.1.0".into(),
        ndata_every_ms: 10_000,
        host_silent_after_ms: SILENT_AFTER_MS,
        cdu_silent_after_ms: SILENT_AFTER_MS,
        max_devices: 2_000,
    });
    let host: String = long('h');
    let gpus = loopwarden_protocol::MAX_GPUS as u8;
    let telemetry = samples::host_telemetry(gpus);
    let Message::HostHealth(mut health) = samples::message(MessageKind::HostHealth) else {
        unreachable!("the sample is a health report")
    };
    let first = health.gpus[0].clone();
    health.gpus.clear();
    for i in 0..gpus {
        let mut g = first.clone();
        g.gpu = loopwarden_protocol::GpuIndex::new(i).unwrap();
        health.gpus.push(g).unwrap();
    }
    b.step(
        T,
        input(Role::Host, &host, Message::HostTelemetry(telemetry)),
    );
    b.step(T, input(Role::Host, &host, Message::HostHealth(health)));
    b.step(T, cdu_state());
    let out = connected(&mut b);
    assert_eq!(out.len(), 3, "{:?}", kinds(&out));
    let birth = out
        .iter()
        .find(|p| p.device.as_deref() == Some(host.as_str()));
    let gpu_metrics = body(birth.expect("the host is born")).metrics.len();
    assert!(gpu_metrics > 9 * usize::from(gpus), "{gpu_metrics} metrics");
    for p in &out {
        // An MQTT PUBLISH: fixed header (at most 5), topic length (2),
        // packet id (2), topic and payload.
        let packet = 9 + p.topic.len() + p.payload.len();
        assert!(
            packet <= loopwarden_bus::MAX_PACKET_SIZE,
            "{} is {packet} bytes, over the broker's {}",
            p.topic,
            loopwarden_bus::MAX_PACKET_SIZE
        );
    }
}

#[test]
fn bdseq_wraps_from_255_to_0() {
    let mut b = bridge();
    for _ in 0..256 {
        b.connecting(T);
    }
    assert_eq!(b.bd_seq(), Some(255));
    let will = b.connecting(T);
    assert_eq!(metric(&body(&will), "bdSeq"), Some(MetricValue::Long(0)));
}

#[test]
fn a_device_is_born_first_then_sends_only_what_changed() {
    let mut b = bridge();
    assert!(
        b.step(T, host_telemetry("h07", 61)).is_empty(),
        "no session yet"
    );
    let out = connected(&mut b);
    assert_eq!(
        kinds(&out),
        [(Kind::NBirth, None), (Kind::DBirth, Some("h07"))]
    );
    assert_eq!(out[1].topic, "spBv1.0/hall-1/DBIRTH/loopwarden/h07");
    assert_eq!(body(&out[1]).seq, Some(1));
    assert!(
        b.step(T, host_telemetry("h07", 61)).is_empty(),
        "nothing changed"
    );
    let out = b.step(T + 1, host_telemetry("h07", 70));
    assert_eq!(kinds(&out), [(Kind::DData, Some("h07"))]);
    let data = body(&out[0]);
    assert_eq!(data.seq, Some(2));
    let names: Vec<_> = data
        .metrics
        .iter()
        .filter_map(|m| m.name.as_deref())
        .collect();
    assert_eq!(names, ["hottest_gpu_c", "gpu/0/temp_c"]);
    assert_eq!(metric(&data, "gpu/0/temp_c"), Some(MetricValue::Int(70)));
    assert!(data.metrics.iter().all(|m| m.datatype.is_none()));
    // A CDU heard for the first time during the session is born at once.
    let out = b.step(T, cdu_state());
    assert_eq!(kinds(&out), [(Kind::DBirth, Some("cdu-a"))]);
    assert_eq!(
        metric(&body(&out[0]), "mode"),
        Some(MetricValue::String("degraded".into()))
    );
}

#[test]
fn seq_counts_every_message_and_wraps_from_255_to_0() {
    let mut b = bridge();
    connected(&mut b);
    let mut seqs = Vec::new();
    for i in 0..300u64 {
        let temp = if i % 2 == 0 { 61 } else { 62 };
        for p in b.step(T + i, host_telemetry("h07", temp)) {
            seqs.push(body(&p).seq.unwrap());
        }
    }
    assert_eq!(seqs.len(), 300, "a birth, then one DDATA per change");
    let want: Vec<u64> = (1..=300).map(|s| s % 256).collect();
    assert_eq!(seqs, want);
}

#[test]
fn a_host_whose_gpus_change_is_born_again() {
    let mut b = bridge();
    connected(&mut b);
    b.step(T, host_telemetry("h07", 61));
    let t = samples::host_telemetry(4);
    let out = b.step(T, input(Role::Host, "h07", Message::HostTelemetry(t)));
    assert_eq!(kinds(&out), [(Kind::DBirth, Some("h07"))]);
    assert_eq!(
        metric(&body(&out[0]), "gpu/3/power_limit_w"),
        Some(MetricValue::Int(700))
    );
}

#[test]
fn offline_gives_ddeath_and_only_online_brings_the_device_back() {
    let mut b = bridge();
    connected(&mut b);
    b.step(T, online(Role::Host, "h07", true));
    assert_eq!(
        kinds(&b.step(T, host_telemetry("h07", 61)))[0].0,
        Kind::DBirth
    );
    let out = b.step(T, online(Role::Host, "h07", false));
    assert_eq!(kinds(&out), [(Kind::DDeath, Some("h07"))]);
    let death = body(&out[0]);
    assert!(death.seq.is_some() && death.metrics.is_empty());
    assert!(
        b.step(T, online(Role::Host, "h07", false)).is_empty(),
        "dead once"
    );
    assert!(
        b.step(T, host_telemetry("h07", 62)).is_empty(),
        "a late sample"
    );
    let out = b.step(T, online(Role::Host, "h07", true));
    assert!(
        out.is_empty(),
        "back, but born with its next measurement, not the late one: {:?}",
        kinds(&out)
    );
    let out = b.step(T, host_telemetry("h07", 63));
    assert_eq!(kinds(&out), [(Kind::DBirth, Some("h07"))]);
    let birth = body(&out[0]);
    assert_eq!(metric(&birth, "gpu/0/temp_c"), Some(MetricValue::Int(63)));
    let software = metric(&birth, "properties/software");
    assert_eq!(software, Some(MetricValue::String("0.1.0".into())));
}

#[test]
fn a_dead_hosts_retained_health_is_not_born_as_current_when_it_comes_back() {
    let mut b = bridge();
    // At the bridge's start the broker hands over what it retains: the
    // host left a week ago, with a GPU quarantined then.
    b.step(T, online(Role::Host, "h07", false));
    let health = samples::message(MessageKind::HostHealth);
    b.step(T, input(Role::Host, "h07", health));
    assert_eq!(kinds(&connected(&mut b)), [(Kind::NBirth, None)]);
    assert!(b.step(T, online(Role::Host, "h07", true)).is_empty());
    let out = b.step(T, host_telemetry("h07", 61));
    assert_eq!(kinds(&out), [(Kind::DBirth, Some("h07"))]);
    let birth = body(&out[0]);
    assert_eq!(metric(&birth, "gpu/0/temp_c"), Some(MetricValue::Int(61)));
    for name in ["gpus_quarantined", "gpu/0/health", "gpu/1/quarantined"] {
        let m = birth
            .metrics
            .iter()
            .find(|m| m.name.as_deref() == Some(name));
        let m = m.unwrap_or_else(|| panic!("no metric {name}"));
        assert_eq!((m.is_null, &m.value), (Some(true), &None), "{name}");
    }
}

#[test]
fn a_cdu_whose_controller_is_silent_has_no_loop_and_no_dry_leak_until_its_next_telemetry() {
    let mut b = bridge();
    connected(&mut b);
    let telemetry = || {
        let t = samples::message(MessageKind::CduTelemetry);
        input(Role::Cdu, "cdu-a", t)
    };
    let state = |mode, reason| {
        let Message::CduState(mut s) = samples::message(MessageKind::CduState) else {
            unreachable!("the sample is a CDU state")
        };
        (s.mode, s.reason) = (mode, reason);
        input(Role::Cdu, "cdu-a", Message::CduState(s))
    };
    let out = b.step(T, telemetry());
    assert_eq!(kinds(&out), [(Kind::DBirth, Some("cdu-a"))]);
    let birth = body(&out[0]);
    assert_eq!(
        metric(&birth, "leak"),
        None,
        "no state yet: sensing unknown"
    );
    let out = b.step(T, state(CduMode::Normal, ReasonCode::OK));
    let data = body(&out[0]);
    assert_eq!(
        metric(&data, "mode"),
        Some(MetricValue::String("normal".into()))
    );
    assert!(
        data.metrics.iter().all(|m| m.is_null.is_none()),
        "another state keeps the loop: {data:?}"
    );
    // The gateway hears its microcontroller no more.
    let out = b.step(
        T + 3_000,
        state(CduMode::Failsafe, ReasonCode::CONTROLLER_SILENT),
    );
    assert_eq!(kinds(&out), [(Kind::DData, Some("cdu-a"))]);
    let data = body(&out[0]);
    let null = |p: &Payload, name: &str| {
        let m = p.metrics.iter().find(|m| m.name.as_deref() == Some(name));
        m.is_some_and(|m| m.is_null == Some(true) && m.value.is_none())
    };
    for name in ["leak", "supply_temp_c", "flow_lpm", "pump_a/running"] {
        assert!(null(&data, name), "{name} is not null: {data:?}");
    }
    assert_eq!(
        metric(&data, "mode_reason"),
        Some(MetricValue::String("controller-silent".into()))
    );
    // It speaks again: the loop is back with its telemetry.
    b.step(T + 9_000, state(CduMode::Normal, ReasonCode::OK));
    let out = b.step(T + 9_000, telemetry());
    assert_eq!(kinds(&out), [(Kind::DData, Some("cdu-a"))]);
    let data = body(&out[0]);
    assert_eq!(metric(&data, "leak"), Some(MetricValue::Boolean(false)));
    assert!(metric(&data, "supply_temp_c").is_some());
}

#[test]
fn a_rebirth_command_sends_every_birth_again_with_the_same_bdseq() {
    let mut b = bridge();
    connected(&mut b);
    b.step(T, host_telemetry("h07", 61));
    b.step(T, cdu_state());
    b.step(T, host_telemetry("h07", 65));
    let out = b.step(T, Input::Command(rebirth_command()));
    let want = [
        (Kind::NBirth, None),
        (Kind::DBirth, Some("cdu-a")),
        (Kind::DBirth, Some("h07")),
    ];
    assert_eq!(kinds(&out), want);
    let seqs: Vec<_> = out.iter().map(|p| body(p).seq).collect();
    assert_eq!(seqs, [Some(0), Some(1), Some(2)]);
    assert_eq!(metric(&body(&out[0]), "bdSeq"), Some(MetricValue::Long(0)));
    assert_eq!(
        metric(&body(&out[2]), "gpu/0/temp_c"),
        Some(MetricValue::Int(65))
    );
    // Anything else is refused and counted in the next NDATA.
    assert!(b.step(T, Input::Command(vec![0xff, 0xff])).is_empty());
    let out = b.step(T + 10_000, Input::Tick);
    assert_eq!(kinds(&out), [(Kind::NData, None)]);
    let data = body(&out[0]);
    assert_eq!(
        metric(&data, "bridge/commands_refused"),
        Some(MetricValue::Long(1))
    );
    // Both still heard, saying nothing new.
    assert!(b.step(T + 14_000, host_telemetry("h07", 65)).is_empty());
    assert!(b.step(T + 14_000, cdu_state()).is_empty());
    assert!(
        b.step(T + 15_000, Input::Tick).is_empty(),
        "too soon, and nothing new"
    );
}

#[test]
fn rebirths_go_out_at_most_once_per_window_and_those_held_back_wait_and_are_counted() {
    let mut b = bridge();
    connected(&mut b);
    b.step(T, host_telemetry("h07", 61));
    let rebirth = |b: &mut Bridge, at: u64| b.step(at, Input::Command(rebirth_command()));
    let births = [(Kind::NBirth, None), (Kind::DBirth, Some("h07"))];
    assert_eq!(kinds(&rebirth(&mut b, T)), births, "the first at once");
    assert_eq!(b.take_notices(), []);
    // Two more within 5 s: nothing now, one notice for the window.
    assert!(rebirth(&mut b, T + 1_000).is_empty());
    let due = T + REBIRTH_EVERY_MS;
    let notice = Notice::RebirthsLimited {
        in_ms: REBIRTH_EVERY_MS - 1_000,
        total: 1,
    };
    assert_eq!(b.take_notices(), [notice]);
    assert!(rebirth(&mut b, T + 2_000).is_empty());
    assert_eq!(b.take_notices(), [], "once per window");
    assert!(b.step(due - 1, Input::Tick).is_empty());
    // The window ends: one round of births for both.
    let out = b.step(due, Input::Tick);
    assert_eq!(kinds(&out), births);
    let held = metric(&body(&out[0]), "bridge/rebirths_limited");
    assert_eq!(held, Some(MetricValue::Long(2)));
    assert!(b.step(due + 1_000, Input::Tick).is_empty(), "nothing waits");
    // The births at the window's end start the next window.
    assert!(rebirth(&mut b, due + 4_999).is_empty());
    let notice = Notice::RebirthsLimited { in_ms: 1, total: 3 };
    assert_eq!(b.take_notices(), [notice]);
    let out = b.step(due + REBIRTH_EVERY_MS, Input::Tick);
    assert_eq!(kinds(&out), births);
    // A quiet minute later, a request is carried out at once.
    let later = due + 60_000;
    assert_eq!(kinds(&rebirth(&mut b, later)), births);
}

#[test]
fn a_clock_set_back_or_a_new_session_does_not_hold_a_rebirth_back() {
    let mut b = bridge();
    connected(&mut b);
    b.step(T, host_telemetry("h07", 61));
    let rebirth = |b: &mut Bridge, at: u64| b.step(at, Input::Command(rebirth_command()));
    assert!(!rebirth(&mut b, T + 60_000).is_empty());
    assert!(
        !rebirth(&mut b, T).is_empty(),
        "the clock went back a minute"
    );
    assert!(rebirth(&mut b, T + 1).is_empty(), "held back");
    // The connection is lost and made again: its births answer the
    // waiting request, and no second round follows at the window's end.
    b.step(T + 2, Input::ConnectionLost);
    b.connecting(T + 3);
    let out = b.step(T + 3, Input::Connected);
    assert_eq!(kinds(&out)[0], (Kind::NBirth, None));
    assert!(b.step(T + REBIRTH_EVERY_MS, Input::Tick).is_empty());
}

#[test]
fn a_refused_ncmd_subscription_is_said_and_shown_in_the_birth() {
    let mut b = bridge();
    b.connecting(T);
    b.step(T, Input::NcmdRefused);
    let out = b.step(T, Input::Connected);
    assert_eq!(
        metric(&body(&out[0]), "bridge/ncmd_refused"),
        Some(MetricValue::Boolean(true))
    );
    let notices = b.take_notices();
    let [Notice::NcmdRefused { topic }] = &notices[..] else {
        panic!("{notices:?}")
    };
    assert_eq!(topic, "spBv1.0/hall-1/NCMD/loopwarden");
    // The next connection, subscribed, says so.
    b.step(T + 1, Input::ConnectionLost);
    b.connecting(T + 2);
    let out = b.step(T + 2, Input::Connected);
    assert_eq!(
        metric(&body(&out[0]), "bridge/ncmd_refused"),
        Some(MetricValue::Boolean(false))
    );
}

#[test]
fn frames_on_another_nodes_topic_or_of_a_foreign_kind_are_refused() {
    let mut b = bridge();
    connected(&mut b);
    let Input::Frame(topic, mut frame) = host_telemetry("h07", 61) else {
        unreachable!()
    };
    frame.sender = NodeId::new(Role::Host, "h08").unwrap();
    assert!(b.step(T, Input::Frame(topic.clone(), frame)).is_empty());
    // A CDU state on a host's health topic.
    let Input::Frame(_, state) = cdu_state() else {
        unreachable!()
    };
    let health = Topic {
        family: Family::Health,
        ..topic
    };
    let frame = Frame {
        sender: NodeId::new(Role::Host, "h07").unwrap(),
        ..state
    };
    assert!(b.step(T, Input::Frame(health, frame)).is_empty());
    let out = b.step(T + 10_000, Input::Tick);
    assert_eq!(
        metric(&body(&out[0]), "bridge/frames_refused"),
        Some(MetricValue::Long(2))
    );
}

/// A sample of `id` whose GPU 0 draws `gpu0_w`, GPU 1 at `temp`.
fn host_drawing(id: &str, gpu0_w: u32, temp: u8) -> Input {
    let mut t = samples::host_telemetry(2);
    t.gpus[0].power = loopwarden_protocol::Watts(gpu0_w);
    t.gpus[1].temp = WholeCelsius(temp);
    input(Role::Host, id, Message::HostTelemetry(t))
}

#[test]
fn a_gpu_power_past_any_gpus_is_null_and_its_host_lives_on() {
    let mut b = bridge();
    connected(&mut b);
    let out = b.step(T, host_drawing("h07", 200_000, 60));
    assert_eq!(kinds(&out), [(Kind::DBirth, Some("h07"))]);
    let birth = body(&out[0]);
    assert_eq!(metric(&birth, "gpu/0/power_w"), None, "malformed: null");
    let gpu1 = metric(&birth, "gpu/1/power_w").expect("gpu 1 has its power");
    assert_eq!(metric(&birth, "power_w"), Some(gpu1), "gpu 0 left out");
    let notices = b.take_notices();
    let [Notice::FieldsRefused { device, why }] = &notices[..] else {
        panic!("the bad field is noticed: {notices:?}")
    };
    assert_eq!(device, "h07");
    assert!(
        why.contains("gpu 0 power 200000 W"),
        "names the field: {why}"
    );
    // Each second for 15 s the same: the host lives, its other GPUs'
    // figures go out, and the bad field is said once, not every second.
    let mut data = Vec::new();
    for s in 1..=15u8 {
        let now = T + u64::from(s) * 1_000;
        let mut out = b.step(now, host_drawing("h07", 200_000, 60 + s));
        out.extend(b.step(now, Input::Tick));
        assert!(!kinds(&out).contains(&(Kind::DDeath, Some("h07"))), "{s} s");
        data.extend(out.into_iter().filter(|p| p.kind == Kind::DData));
    }
    assert!(b.take_notices().is_empty(), "said once per change");
    assert!(data
        .iter()
        .any(|p| metric(&body(p), "gpu/1/temp_c").is_some()));
    let out = b.step(T + 20_000, Input::Tick);
    let node = body(&out[0]);
    assert_eq!(
        metric(&node, "bridge/fields_refused"),
        Some(MetricValue::Long(16))
    );
    assert_eq!(metric(&node, "bridge/frames_refused"), None, "none refused");
}

#[test]
fn losing_the_loopwarden_bus_declares_every_device_dead() {
    let mut b = bridge();
    connected(&mut b);
    b.step(T, Input::LoopwardenConnected(true));
    b.step(T, host_telemetry("h07", 61));
    b.step(T, cdu_state());
    let out = b.step(T, Input::LoopwardenConnected(false));
    assert_eq!(
        kinds(&out),
        [(Kind::DDeath, Some("cdu-a")), (Kind::DDeath, Some("h07"))]
    );
    // A frame the bus took before the loss, stepped after it: not
    // the device now, and no birth over its DDEATH.
    assert!(b.step(T, host_telemetry("h07", 61)).is_empty());
    assert!(b.step(T, Input::LoopwardenConnected(true)).is_empty());
    let out = b.step(T, host_telemetry("h07", 62));
    assert_eq!(
        kinds(&out),
        [(Kind::DBirth, Some("h07"))],
        "heard again: born again"
    );
}

#[test]
fn a_clean_stop_publishes_the_ndeath_and_a_lost_queue_resyncs() {
    let mut b = bridge();
    connected(&mut b);
    b.step(T, host_telemetry("h07", 61));
    assert!(b
        .step(
            T,
            Input::Dropped {
                count: 3,
                deaths: Vec::new()
            }
        )
        .is_empty());
    let out = b.step(T + 1, Input::Tick);
    assert_eq!(
        kinds(&out),
        [(Kind::NBirth, None), (Kind::DBirth, Some("h07"))]
    );
    let out = b.step(T + 2, Input::Stop);
    assert_eq!(kinds(&out), [(Kind::NDeath, None)]);
    assert_eq!(metric(&body(&out[0]), "bdSeq"), Some(MetricValue::Long(0)));
    assert!(
        b.step(T + 3, host_telemetry("h07", 70)).is_empty(),
        "no session"
    );
    assert!(b.step(T + 4, Input::Stop).is_empty(), "one goodbye");
}

#[test]
fn a_dropped_ddeath_is_said_again_by_the_births_that_follow() {
    let mut b = bridge();
    b.step(T, online(Role::Host, "h09", false));
    b.step(T, host_telemetry("h09", 61));
    connected(&mut b);
    b.step(T, host_telemetry("h07", 61));
    b.step(T, cdu_state());
    let out = b.step(T, online(Role::Host, "h07", false));
    assert_eq!(kinds(&out), [(Kind::DDeath, Some("h07"))]);
    // The shell could not queue that DDEATH.
    let deaths = vec!["h07".to_string()];
    b.step(T, Input::Dropped { count: 1, deaths });
    let out = b.step(T + 1, Input::Tick);
    let want = [
        (Kind::NBirth, None),
        (Kind::DBirth, Some("cdu-a")),
        (Kind::DDeath, Some("h07")),
    ];
    assert_eq!(kinds(&out), want, "h09 was never born: no death");
    let seqs: Vec<_> = out.iter().map(|p| body(p).seq).collect();
    assert_eq!(seqs, [Some(0), Some(1), Some(2)]);
    let online_now = metric(&body(&out[0]), "bridge/devices_online");
    assert_eq!(online_now, Some(MetricValue::Int(1)));
    // Back and born again: the births that follow say it is alive.
    b.step(T + 2, online(Role::Host, "h07", true));
    b.step(T + 2, host_telemetry("h07", 62));
    // A rebirth asked within the resync's window waits for its end.
    let out = b.step(T + 3, Input::Command(rebirth_command()));
    assert_eq!(kinds(&out), [], "held: births went out 2 ms ago");
    let out = b.step(T + 1 + REBIRTH_EVERY_MS, Input::Tick);
    let want = [
        (Kind::NBirth, None),
        (Kind::DBirth, Some("cdu-a")),
        (Kind::DBirth, Some("h07")),
    ];
    assert_eq!(kinds(&out), want);
}

/// A random input among the few that matter.
fn any_input() -> impl Strategy<Value = Input> {
    let host = prop::sample::select(vec!["h01", "h02", "h03"]);
    prop_oneof![
        1 => Just(Input::Connected),
        1 => Just(Input::NcmdRefused),
        1 => Just(Input::ConnectionLost),
        1 => Just(Input::Tick),
        1 => Just(Input::Command(rebirth_command())),
        1 => Just(Input::RetainedCommand(rebirth_command())),
        1 => Just(Input::Dropped { count: 1, deaths: Vec::new() }),
        1 => (0u64..4).prop_map(Input::InboundDropped),
        1 => any::<bool>().prop_map(Input::LoopwardenConnected),
        2 => (host.clone(), any::<bool>()).prop_map(|(h, up)| online(Role::Host, h, up)),
        12 => (host, 40u8..90).prop_map(|(h, t)| host_telemetry(h, t)),
        1 => Just(cdu_state()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever happens: births come first in a session, `seq` counts
    /// up by one (255 wraps to 0) from each NBIRTH's 0, every NBIRTH
    /// carries the will's bdSeq, and device messages only follow that
    /// device's birth.
    #[test]
    fn sessions_keep_their_order_and_numbering(inputs in prop::collection::vec(any_input(), 1..700)) {
        let mut b = bridge();
        let mut will_bd = None;
        let mut last_seq: Option<u64> = None;
        let mut born: std::collections::BTreeSet<String> = Default::default();
        let mut ever_born = born.clone();
        for (i, input) in inputs.into_iter().enumerate() {
            let now = T + i as u64 * 1000;
            if matches!(input, Input::ConnectionLost) || i == 0 {
                let will = b.connecting(now);
                will_bd = metric(&body(&will), "bdSeq");
                last_seq = None;
                born.clear();
            }
            let lost = matches!(input, Input::ConnectionLost);
            let out = b.step(now, input);
            let births = out.first().is_some_and(|p| p.kind == Kind::NBirth);
            for p in out {
                let pl = body(&p);
                match p.kind {
                    Kind::NBirth => {
                        prop_assert_eq!(pl.seq, Some(0));
                        prop_assert_eq!(metric(&pl, "bdSeq"), will_bd.clone());
                        born.clear();
                    }
                    Kind::NDeath => unreachable!("only a stop publishes it"),
                    _ => {
                        let last = last_seq.expect("an NBIRTH first");
                        prop_assert_eq!(pl.seq, Some((last + 1) % 256));
                    }
                }
                match (p.kind, p.device.clone()) {
                    (Kind::DBirth, Some(d)) => { born.insert(d.clone()); ever_born.insert(d); }
                    (Kind::DData, Some(d)) => prop_assert!(born.contains(&d), "DDATA before DBIRTH"),
                    // A round of births says again that a device once
                    // born is dead.
                    (Kind::DDeath, Some(d)) => prop_assert!(
                        born.remove(&d) || (births && ever_born.contains(&d)),
                        "DDEATH of a device never born"
                    ),
                    _ => {}
                }
                last_seq = pl.seq;
            }
            if lost {
                prop_assert!(!b.in_session());
            }
        }
    }
}
