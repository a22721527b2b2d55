//! The controller's shell on a real mosquitto (the rig: `shell_cdu`)
//! caps hot hosts with signed leases, lifts the caps when they cool,
//! counts their acks, and drops acks from hosts it does not cool.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

// The shared rigs' parts other files use.
#[allow(dead_code)]
mod shell_cdu;
#[allow(dead_code)]
mod shell_rig;

use std::time::{Duration, Instant};

use cooling_core::CoreConfig;
use loopwarden_bus::{now_ms, Bus};
use loopwarden_protocol::message::{Ack, AckCode, CapSource, Correlation, GpuCap, GpuSelector};
use loopwarden_protocol::units::Watts;
use loopwarden_protocol::{Family, Frame, Message, NodeId, Role, Text, Topic};
use shell_cdu::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_hosts_get_signed_cap_leases_and_their_acks_are_counted_and_a_lifted_cap_is_said() {
    // Capacity back for 1 s lifts a cap (60 s in the field).
    let mut core = CoreConfig::default();
    core.timing.cap_release_ms = 1_000;
    let Some(mut rig) = Rig::start_with(core).await else {
        return;
    };
    let cmd_filter = loopwarden_protocol::topic::filter::family(&id(SITE), Role::Host, Family::Cmd)
        .unwrap()
        .to_string();
    let (probe, mut rx) = rig.probe("fakehosts", &[cmd_filter]).await;
    rig.wait_stats("the shell running", |s| s.steps >= 1).await;

    // Two hosts of rack 0 run hot on water well above its setpoint.
    let hot = ["h00", "h01"];
    let publish_reports_at = |probe: &Bus, hottest: u8| {
        for (i, h) in hot.iter().enumerate() {
            let frame = Frame {
                sender: NodeId::new(Role::Host, h).unwrap(),
                seq: i as u32,
                time: now_ms(),
                message: Message::HostTelemetry(hot_host(hottest)),
            };
            let topic = Topic::new(&id(SITE), Role::Host, &id(h), Family::Telemetry);
            probe.publish_frame(&topic, &frame).expect("published");
        }
    };
    let publish_reports = |probe: &Bus| publish_reports_at(probe, 86);
    publish_reports(&probe);
    let mut leases = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while leases.len() < hot.len() && Instant::now() < deadline {
        if let Ok(Some(m)) = tokio::time::timeout(PERIOD, rx.recv()).await {
            if let Message::CapLease(_) = &m.frame.message {
                if !leases.iter().any(|(t, _): &(Topic, Frame)| t == &m.topic) {
                    leases.push((m.topic.clone(), m.frame.clone()));
                }
            }
        } else {
            publish_reports(&probe);
        }
    }
    assert_eq!(leases.len(), 2, "a lease for each hot host");
    let cdu_node = NodeId::new(Role::Cdu, CDU).unwrap();
    let public = key().verifying_key();
    for (topic, frame) in &leases {
        assert!(
            hot.contains(&topic.node.as_str()),
            "only the hot hosts: {topic}"
        );
        assert_eq!(topic.family, Family::Cmd);
        assert_eq!(frame.sender, cdu_node);
        frame
            .verify(topic, |_, k| (k == KEY_ID).then_some(&public))
            .expect("the lease verifies for its host's cmd topic");
        let other = Topic::new(&id(SITE), Role::Host, &id("h05"), Family::Cmd);
        assert!(
            frame
                .verify(&other, |_, k| (k == KEY_ID).then_some(&public))
                .is_err(),
            "and for no other host"
        );
        let Message::CapLease(l) = &frame.message else {
            unreachable!()
        };
        assert_eq!(l.source, CapSource::Cooling);
        assert_eq!(l.duration.0, 30_000);
        assert_eq!(l.caps.len(), 1);
        assert_eq!(l.caps[0].gpus, GpuSelector::All);
        let w = l.caps[0].limit.get();
        assert!((200..700).contains(&w), "a cap between min and TDP: {w} W");
        assert!(frame.time.0.abs_diff(now_ms().0) < 5_000);
    }
    let s = rig
        .wait_stats("leases counted", |s| s.leases_sent >= 2)
        .await;
    assert!(s.caps[0].is_some() && s.caps[1].is_some());
    assert!(s.caps[2..].iter().all(Option::is_none));

    // The host acks: the shell counts it with the limits in force.
    let (topic, frame) = &leases[0];
    let mut in_force = heapless::Vec::new();
    let _ = in_force.push(GpuCap {
        gpus: GpuSelector::All,
        limit: Watts(640),
    });
    let ack = Frame {
        sender: NodeId::new(Role::Host, topic.node.as_str()).unwrap(),
        seq: 100,
        time: now_ms(),
        message: Message::Ack(Ack {
            correlation: Correlation {
                from: cdu_node.clone(),
                seq: frame.seq,
            },
            code: AckCode::Ok,
            in_force,
            detail: Text::default(),
        }),
    };
    let ack_topic = Topic::new(&id(SITE), Role::Host, &topic.node, Family::Ack);
    probe
        .publish_frame(&ack_topic, &ack)
        .expect("ack published");
    let s = rig.wait_stats("the ack counted", |s| s.acks >= 1).await;
    assert_eq!(s.acks_ok, 1);
    assert_eq!(
        s.in_force.get(topic.node.as_str()).map(|v| v[0].limit),
        Some(Watts(640))
    );
    // The same ack again (the bus delivers at least once), then a refusal
    // of an older lease arriving late: neither counts, nor hides the
    // answer in force; the ack to a newer lease counts.
    let with = |seq: u32, code: AckCode| {
        let mut f = ack.clone();
        if let Message::Ack(a) = &mut f.message {
            (a.correlation.seq, a.code) = (seq, code);
        }
        f
    };
    for f in [
        ack.clone(),
        with(frame.seq - 1, AckCode::Replayed),
        with(frame.seq + 1_000, AckCode::Ok),
    ] {
        probe.publish_frame(&ack_topic, &f).expect("ack published");
    }
    let s = rig
        .wait_stats("the newer ack counted", |s| s.acks >= 2)
        .await;
    assert_eq!((s.acks, s.acks_ok, s.acks_refused), (2, 2, 0));
    assert_eq!(s.last_ack[topic.node.as_str()].seq, frame.seq + 1_000);

    // The hosts cool down: the caps rise, then are lifted with one short
    // lease at TDP each.
    let mut lifts: Vec<(Topic, Frame)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(8);
    while lifts.len() < hot.len() && Instant::now() < deadline {
        publish_reports_at(&probe, 60);
        let until = tokio::time::Instant::now() + PERIOD;
        while let Ok(Some(m)) = tokio::time::timeout_at(until, rx.recv()).await {
            if let Message::CapLease(l) = &m.frame.message {
                if l.duration.0 == 5_000 && !lifts.iter().any(|(t, _)| t == &m.topic) {
                    lifts.push((m.topic.clone(), m.frame.clone()));
                }
            }
        }
    }
    assert_eq!(lifts.len(), 2, "a lift for each host capped");
    let public = key().verifying_key();
    for (topic, frame) in &lifts {
        frame
            .verify(topic, |_, k| (k == KEY_ID).then_some(&public))
            .expect("the lift verifies");
        let Message::CapLease(l) = &frame.message else {
            unreachable!()
        };
        assert_eq!(l.caps[0].limit, Watts(700), "a lift is a lease at TDP");
        let first = leases
            .iter()
            .find(|(t, _)| t == topic)
            .expect("leased before");
        let Message::CapLease(f) = &first.1.message else {
            unreachable!()
        };
        assert_eq!(l.lease, f.lease, "one lease id per host");
        assert!(frame.seq > first.1.seq, "command numbers rise");
    }
    let s = rig.wait_stats("lifts counted", |s| s.lifts_sent >= 2).await;
    assert!(s.caps.iter().all(Option::is_none));
    let _ = probe.shutdown(Duration::from_secs(1)).await;
    rig.stop().await;
}

/// An ack from `host` of command `seq` of the rig's CDU, with a limit in
/// force of 640 W, as the host publishes it on its own ack topic.
fn ack_from(host: &str, seq: u32) -> (Topic, Frame) {
    let mut in_force = heapless::Vec::new();
    let _ = in_force.push(GpuCap {
        gpus: GpuSelector::All,
        limit: Watts(640),
    });
    let frame = Frame {
        sender: NodeId::new(Role::Host, host).unwrap(),
        seq: 7,
        time: now_ms(),
        message: Message::Ack(Ack {
            correlation: Correlation {
                from: NodeId::new(Role::Cdu, CDU).unwrap(),
                seq,
            },
            code: AckCode::Ok,
            in_force,
            detail: Text::default(),
        }),
    };
    let topic = Topic::new(&id(SITE), Role::Host, &id(host), Family::Ack);
    (topic, frame)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_from_hosts_not_in_the_host_list_are_counted_and_dropped() {
    let Some(mut rig) = Rig::start().await else {
        return;
    };
    let (probe, _rx) = rig.probe("otherhosts", &[]).await;
    rig.wait_stats("the shell running", |s| s.steps >= 1).await;
    // One of its own hosts acks until the shell has heard it: its
    // subscription to the hosts' acks is live from then on (a step
    // comes before the broker has answered the subscription).
    let (topic, frame) = ack_from("h03", 44);
    let heard = async {
        loop {
            probe.publish_frame(&topic, &frame).expect("published");
            let wait = tokio::time::timeout(
                Duration::from_millis(300),
                rig.shell.stats.wait_for(|s| s.acks >= 1),
            );
            if wait.await.is_ok() {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(15), heard)
        .await
        .expect("the shell hears its host's ack");
    // Hosts of the site this CDU does not cool, each acking a command
    // "of" this CDU.
    for (i, host) in ["h16", "x-r9h3", "zz99"].iter().enumerate() {
        let (topic, frame) = ack_from(host, 40 + i as u32);
        probe.publish_frame(&topic, &frame).expect("published");
    }
    let s = rig
        .wait_stats("the acks counted", |s| s.acks_foreign >= 3)
        .await;
    assert_eq!(s.acks_foreign, 3);
    assert_eq!(s.acks, s.acks_ok, "its own host's acks, all ok");
    let kept: Vec<&String> = s.in_force.keys().chain(s.last_ack.keys()).collect();
    assert_eq!(kept, ["h03", "h03"], "only its own host is kept");
    assert_eq!(s.last_ack["h03"].seq, 44);
    let _ = probe.shutdown(Duration::from_secs(1)).await;
    rig.stop().await;
}
