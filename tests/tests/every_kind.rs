//! Every message kind through a real mosquitto, read back by
//! `mosquitto_sub`: the frames byte-exact, the retained families retained,
//! the commands delivered to the host's bus shell, and the JSON mirror
//! valid against the committed schemas by Python's `jsonschema`.

use std::collections::BTreeMap;
use std::time::Duration;

use loopwarden_bus::{now_ms, Bus, BusConfig};
use loopwarden_protocol::{samples, Family, Frame, Ident, MessageKind, NodeId, Role};
use loopwarden_system_tests::{
    repo_root, require_python_jsonschema, retained, Mosquitto, Subscriber,
};

const SITE: &str = "t-every";

fn bus(
    broker: &Mosquitto,
    role: Role,
    id: &str,
) -> (Bus, tokio::sync::mpsc::Receiver<loopwarden_bus::Inbound>) {
    let config = BusConfig::new(
        broker.addr(),
        Ident::new(SITE).unwrap(),
        NodeId::new(role, id).unwrap(),
    );
    let (bus, inbound, _task) = Bus::start(config);
    (bus, inbound)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_through_mosquitto() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let Some(python) = require_python_jsonschema() else {
        return;
    };
    let filter = format!("dc/v2/{SITE}/#");
    let Some(mut sub) = Subscriber::start(broker.port(), &[&filter]) else {
        return;
    };

    let (host, mut host_inbound) = bus(&broker, Role::Host, "h07");
    let (cdu, _) = bus(&broker, Role::Cdu, "cdu-a");
    let (operator, _) = bus(&broker, Role::Operator, "jdoe");
    for b in [&host, &cdu, &operator] {
        assert!(
            b.wait_connected(Duration::from_secs(10)).await,
            "bus not connected"
        );
    }
    let h07 = Ident::new("h07").unwrap();

    // topic -> every payload expected there, in order.
    let mut expected: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    let mut json_lines = String::new();
    let mut commands = Vec::new();
    for kind in MessageKind::ALL {
        let message = samples::message(kind);
        let time = now_ms();
        let (frame, owner): (Frame, (&str, &str)) = match kind {
            MessageKind::CapLease => (
                cdu.send_command(Role::Host, &h07, message, time).unwrap(),
                ("host", "h07"),
            ),
            MessageKind::QuarantineRelease => (
                operator
                    .send_command(Role::Host, &h07, message, time)
                    .unwrap(),
                ("host", "h07"),
            ),
            MessageKind::CduTelemetry | MessageKind::CduState => {
                (cdu.publish(message, time).unwrap(), ("cdu", "cdu-a"))
            }
            _ => (host.publish(message, time).unwrap(), ("host", "h07")),
        };
        let family = kind.family().as_str();
        let topic = format!("dc/v2/{SITE}/{}/{}/{family}", owner.0, owner.1);
        expected
            .entry(topic)
            .or_default()
            .push(frame.to_vec().unwrap());
        if kind.family() == Family::Cmd {
            commands.push(frame.clone());
        } else {
            let publisher = if owner.0 == "cdu" { &cdu } else { &host };
            publisher.publish_json(&frame).unwrap();
            let topic = format!("dc/v2/{SITE}/json/{}/{}/{family}", owner.0, owner.1);
            expected
                .entry(topic)
                .or_default()
                .push(frame.to_json().into_bytes());
        }
        json_lines.push_str(&format!("{}\t{}\n", kind.name(), frame.to_json()));
    }

    // Read back everything. Presence frames also arrive on `online` from
    // each connection: there, what was sent must be among them; everywhere
    // else exactly what was sent arrives (the two commands come from two
    // connections, so their order between them is the broker's).
    let grouped = |seen: &[loopwarden_system_tests::Seen]| {
        let mut got: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
        for m in seen {
            got.entry(m.topic.clone())
                .or_default()
                .push(m.payload.clone());
        }
        got
    };
    let complete = |got: &BTreeMap<String, Vec<Vec<u8>>>| {
        expected.iter().all(|(topic, want)| {
            let have = got.get(topic).map(Vec::as_slice).unwrap_or(&[]);
            want.iter().all(|w| have.contains(w))
        })
    };
    let seen = sub.collect_until(Duration::from_secs(20), |s| complete(&grouped(s)));
    let got = grouped(&seen);
    for (topic, want) in &expected {
        let have = got.get(topic).map(Vec::as_slice).unwrap_or(&[]);
        for w in want {
            assert!(
                have.contains(w),
                "{topic}: sent {} bytes never arrived; arrived: {:?}",
                w.len(),
                have.iter().map(|h| h.len()).collect::<Vec<_>>()
            );
        }
    }
    for (topic, payloads) in expected.iter().filter(|(t, _)| !t.ends_with("/online")) {
        let (mut have, mut want) = (got[topic].clone(), payloads.clone());
        have.sort();
        want.sort();
        assert_eq!(have, want, "payloads on {topic} differ from what was sent");
    }
    for frames in expected.iter().filter(|(t, _)| !t.contains("/json/")) {
        for bytes in frames.1 {
            Frame::decode(bytes).expect("what mosquitto delivered decodes");
        }
    }

    // The host's bus shell received both commands on its cmd topic.
    let mut received = Vec::new();
    while received.len() < commands.len() {
        let msg = tokio::time::timeout(Duration::from_secs(10), host_inbound.recv())
            .await
            .expect("commands reach the host")
            .expect("bus running");
        if msg.topic.family == Family::Cmd {
            received.push(msg.frame);
        }
    }
    // From two connections: their order between them is the broker's.
    let key = |f: &Frame| (f.sender.to_string(), f.seq);
    received.sort_by_key(key);
    commands.sort_by_key(key);
    assert_eq!(received, commands);

    // Health and presence are retained: a late subscriber gets them at once.
    let health = format!("dc/v2/{SITE}/+/+/health");
    let online = format!("dc/v2/{SITE}/+/+/online");
    let late = retained(broker.port(), &[&health, &online], Duration::from_secs(1)).unwrap();
    for topic in [
        format!("dc/v2/{SITE}/host/h07/health"),
        format!("dc/v2/{SITE}/cdu/cdu-a/health"),
    ] {
        let m = late
            .iter()
            .find(|m| m.topic == topic)
            .unwrap_or_else(|| panic!("{topic} not retained"));
        assert!(m.retained);
        assert_eq!(&m.payload, expected[&topic].last().unwrap());
    }
    for topic in [
        format!("dc/v2/{SITE}/host/h07/online"),
        format!("dc/v2/{SITE}/cdu/cdu-a/online"),
    ] {
        let m = late
            .iter()
            .find(|m| m.topic == topic)
            .unwrap_or_else(|| panic!("{topic} not retained"));
        match Frame::decode(&m.payload).unwrap().message {
            loopwarden_protocol::Message::Online(o) => assert!(o.online),
            other => panic!("{topic} holds {other:?}"),
        }
    }
    assert!(
        !late
            .iter()
            .any(|m| m.topic.ends_with("/telemetry") || m.topic.ends_with("/event")),
        "telemetry and events must not be retained"
    );

    // The JSON of every kind validates against its committed schema.
    let dir = tempfile::tempdir().unwrap();
    let frames_file = dir.path().join("frames.tsv");
    std::fs::write(&frames_file, json_lines).unwrap();
    let out = std::process::Command::new(python)
        .arg(repo_root().join("tests/validate_json.py"))
        .arg(repo_root().join("docs/schemas"))
        .arg(&frames_file)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "jsonschema: {report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        report.contains(&format!("{} frames valid", MessageKind::ALL.len())),
        "{report}"
    );

    for b in [&host, &cdu, &operator] {
        let m = b.metrics();
        assert_eq!(m.dropped(), 0, "{m}");
    }
}
