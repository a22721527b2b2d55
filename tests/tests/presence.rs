//! Presence through a real mosquitto: a host that is killed (SIGKILL) is
//! declared gone by the broker through its last will, retained; a host that
//! leaves cleanly says so itself and leaves no will behind.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use loopwarden_bus::{now_ms, Bus, BusConfig};
use loopwarden_protocol::{Event, Frame, Ident, Message, NodeId, Pump, Role};
use loopwarden_system_tests::{retained, Mosquitto, Subscriber};

fn online_of(payload: &[u8]) -> bool {
    match Frame::decode(payload).expect("a presence frame").message {
        Message::Online(o) => o.online,
        other => panic!("not a presence frame: {other:?}"),
    }
}

#[test]
fn killed_host_is_declared_gone_by_its_last_will() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let topic = "dc/v2/t-will/host/h09/online";
    let Some(mut sub) = Subscriber::start(broker.port(), &[topic]) else {
        return;
    };

    let mut peer = Command::new(env!("CARGO_BIN_EXE_bus-peer"))
        .args([&format!("127.0.0.1:{}", broker.port()), "t-will", "h09"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start bus-peer");
    let mut line = String::new();
    BufReader::new(peer.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "connected");

    let hello = sub.next(Duration::from_secs(10)).expect("online announced");
    assert!(online_of(&hello.payload), "first presence is online");

    // SIGKILL: no goodbye, no DISCONNECT; the socket dies with the process.
    peer.kill().unwrap();
    peer.wait().unwrap();
    let will = sub
        .next(Duration::from_secs(15))
        .expect("the broker publishes the last will");
    assert_eq!(will.topic, topic);
    assert!(!online_of(&will.payload), "the will says offline");

    // And it is retained: whoever looks later learns the host is gone.
    let late = retained(broker.port(), &[topic], Duration::from_secs(1)).unwrap();
    assert_eq!(late.len(), 1, "{late:?}");
    assert!(late[0].retained && !online_of(&late[0].payload));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_shutdown_delivers_everything_then_says_goodbye_once() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let topic = "dc/v2/t-bye/cdu/cdu-b/online";
    let json_topic = "dc/v2/t-bye/json/cdu/cdu-b/online";
    let events = "dc/v2/t-bye/cdu/cdu-b/event";
    let Some(mut sub) = Subscriber::start(broker.port(), &[topic, json_topic, events]) else {
        return;
    };
    let config = BusConfig::new(
        broker.addr(),
        Ident::new("t-bye").unwrap(),
        NodeId::new(Role::Cdu, "cdu-b").unwrap(),
    );
    let (bus, _inbound, task) = Bus::start(config);
    assert!(bus.wait_connected(Duration::from_secs(10)).await);
    // Events queued right before leaving are delivered, not cut off.
    let mut sent = Vec::new();
    for _ in 0..50 {
        let event = Event::PumpTrip {
            pump: Pump::A,
            lag_started: true,
        };
        sent.push(bus.publish(Message::Event(event), now_ms()).unwrap().seq);
    }
    bus.shutdown(Duration::from_secs(5)).await.unwrap();
    task.join(Duration::from_secs(5)).await;

    let seen = sub.collect_until(Duration::from_secs(10), |s| {
        s.iter()
            .filter(|m| m.topic == topic || m.topic == json_topic)
            .count()
            >= 4
    });
    // Nothing more arrives: a clean disconnect fires no will.
    assert_eq!(
        sub.next(Duration::from_secs(2)),
        None,
        "a last will after a clean shutdown"
    );
    let got: Vec<u32> = seen
        .iter()
        .filter(|m| m.topic == events)
        .map(|m| Frame::decode(&m.payload).unwrap().seq)
        .collect();
    assert_eq!(got, sent, "events queued before shutdown were lost");
    let presence: Vec<bool> = seen
        .iter()
        .filter(|m| m.topic == topic)
        .map(|m| online_of(&m.payload))
        .collect();
    assert_eq!(presence, [true, false]);
    let json: Vec<String> = seen
        .iter()
        .filter(|m| m.topic == json_topic)
        .map(|m| String::from_utf8(m.payload.clone()).unwrap())
        .collect();
    assert_eq!(json.len(), 2, "{json:?}");
    assert!(
        json[0].contains(r#""online":true"#) && json[1].contains(r#""online":false"#),
        "{json:?}"
    );

    let late = retained(broker.port(), &[topic], Duration::from_secs(1)).unwrap();
    assert!(late.len() == 1 && !online_of(&late[0].payload));
}

#[test]
fn the_test_peer_says_how_to_call_it_rather_than_panic() {
    for args in [
        &[][..],
        &["127.0.0.1:1883", "hall-1"][..],
        &["h:0", "hall-1", "h01"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_bus-peer"))
            .args(args)
            .output()
            .expect("bus-peer runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("usage: bus-peer BROKER SITE HOST"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
