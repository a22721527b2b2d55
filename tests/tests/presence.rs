//! Presence through a real mosquitto: a host that is killed (SIGKILL) is
//! declared gone by the broker through its last wills, retained, in the
//! frame tree and in the JSON tree alike; a host whose main connection is
//! lost reads offline in both trees until it is back; a host that leaves
//! cleanly says so itself and leaves no will behind. With `json_presence`
//! off, the JSON mirror of `online` goes over the one connection.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use loopwarden_bus::{now_ms, Bus, BusConfig};
use loopwarden_protocol::{Event, Frame, Ident, Message, NodeId, Pump, Role};
use loopwarden_system_tests::{retained, Mosquitto, Seen, Subscriber};

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
    let json_topic = "dc/v2/t-will/json/host/h09/online";
    let Some(mut sub) = Subscriber::start(broker.port(), &[topic, json_topic]) else {
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

    let hello = sub.collect_until(Duration::from_secs(10), |s| s.len() >= 2);
    let hello = presence_by_tree(&hello);
    assert_eq!(hello.len(), 2, "online announced in both trees: {hello:?}");
    assert!(hello.iter().all(|(_, online, _)| *online), "{hello:?}");
    assert_eq!(
        hello[0].2, hello[1].2,
        "the JSON mirrors the frame: {hello:?}"
    );

    // SIGKILL: no goodbye, no DISCONNECT; both sockets die with the process.
    peer.kill().unwrap();
    peer.wait().unwrap();
    let wills = sub.collect_until(Duration::from_secs(15), |s| s.len() >= 2);
    let wills = presence_by_tree(&wills);
    assert_eq!(wills.len(), 2, "the broker publishes both wills: {wills:?}");
    assert!(wills.iter().all(|(_, online, _)| !online), "{wills:?}");
    assert_eq!(wills[0].2, wills[1].2, "one will, in two trees: {wills:?}");
    assert!(
        wills[0].2 > hello[0].2,
        "the will is newer than the announcement"
    );

    // And they are retained: whoever looks later learns the host is gone.
    let late = retained(broker.port(), &[topic, json_topic], Duration::from_secs(1)).unwrap();
    let late = presence_by_tree(&late);
    assert_eq!(late.len(), 2, "{late:?}");
    assert!(late.iter().all(|(_, online, _)| !online), "{late:?}");
}

/// Presence messages as (JSON tree, online, seq), frames first.
fn presence_by_tree(seen: &[Seen]) -> Vec<(bool, bool, u32)> {
    let mut out: Vec<(bool, bool, u32)> = seen
        .iter()
        .map(|m| {
            let json = m.topic.contains("/json/");
            let frame = if json {
                Frame::from_json(std::str::from_utf8(&m.payload).unwrap()).unwrap()
            } else {
                Frame::decode(&m.payload).unwrap()
            };
            let Message::Online(o) = frame.message else {
                panic!("not presence: {frame:?}")
            };
            (json, o.online, frame.seq)
        })
        .collect();
    out.sort_by_key(|(json, _, _)| *json);
    out
}

/// Presence as a tree saw it, in order: (online, seq).
fn presence_in(seen: &[Seen], topic: &str) -> Vec<(bool, u32)> {
    seen.iter()
        .filter(|m| m.topic == topic)
        .map(|m| {
            let frame = if topic.contains("/json/") {
                Frame::from_json(std::str::from_utf8(&m.payload).unwrap()).unwrap()
            } else {
                Frame::decode(&m.payload).unwrap()
            };
            match frame.message {
                Message::Online(o) => (o.online, frame.seq),
                other => panic!("not presence: {other:?}"),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_main_connection_takes_the_json_presence_with_it() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let topic = "dc/v2/t-kick/host/h03/online";
    let json_topic = "dc/v2/t-kick/json/host/h03/online";
    let Some(mut sub) = Subscriber::start(broker.port(), &[topic, json_topic]) else {
        return;
    };
    let config = BusConfig::new(
        broker.addr(),
        Ident::new("t-kick").unwrap(),
        NodeId::new(Role::Host, "h03").unwrap(),
    );
    let client_id = config.client_id.clone();
    let (bus, _inbound, task) = Bus::start(config);
    assert!(bus.wait_connected(Duration::from_secs(10)).await);
    let hello = sub.collect_until(Duration::from_secs(10), |s| s.len() >= 2);
    assert_eq!(presence_in(&hello, json_topic).len(), 1, "{hello:?}");

    // Another client takes the main connection's client id: the broker
    // drops the main connection (its will speaks in the frame tree), and
    // the presence connection must follow it down, then come back after
    // the main one did.
    let kicked = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &broker.port().to_string()])
        .args(["-i", &client_id, "-q", "1", "-t", "t-kick/other", "-m", "x"])
        .status()
        .expect("run mosquitto_pub");
    assert!(kicked.success());
    let seen = sub.collect_until(Duration::from_secs(20), |s| {
        presence_in(s, topic).len() >= 2 && presence_in(s, json_topic).len() >= 2
    });
    bus.shutdown(Duration::from_secs(5)).await.unwrap();
    task.join(Duration::from_secs(5)).await;
    let bye = sub.collect_until(Duration::from_secs(10), |s| s.len() >= 2);
    assert_eq!(
        sub.next(Duration::from_secs(1)),
        None,
        "a will after the goodbye"
    );

    let all: Vec<Seen> = hello.into_iter().chain(seen).chain(bye).collect();
    let frames = presence_in(&all, topic);
    let json = presence_in(&all, json_topic);
    let states = |v: &[(bool, u32)]| v.iter().map(|(o, _)| *o).collect::<Vec<_>>();
    assert_eq!(states(&frames), [true, false, true, false], "{frames:?}");
    assert_eq!(states(&json), [true, false, true, false], "{json:?}");
    assert_eq!(
        json, frames,
        "the JSON tree mirrors the frame tree, seq for seq"
    );
    assert!(
        json.windows(2).all(|w| w[0].1 < w[1].1),
        "each JSON presence newer than the last: {json:?}"
    );
    let late = retained(broker.port(), &[json_topic], Duration::from_secs(1)).unwrap();
    assert_eq!(presence_in(&late, json_topic), [json[3]]);
    let m = bus.metrics();
    assert_eq!(
        (m.connects, m.presence_connects, m.presence_renumbered),
        (2, 2, 0),
        "one presence connection per main connection, each with the main one's pair\n{m}"
    );
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
    // Online in both trees first: the JSON mirror's presence has a
    // connection of its own, which may come up after the main one (on a
    // loaded machine, after the goodbye below: then only that is said).
    let on = |m: &Seen| m.topic == topic || m.topic == json_topic;
    let hello = sub.collect_until(Duration::from_secs(10), |s| {
        s.iter().filter(|m| on(m)).count() >= 2
    });
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

    let bye = sub.collect_until(Duration::from_secs(10), |s| {
        s.iter().filter(|m| on(m)).count() >= 2
            && s.iter().filter(|m| m.topic == events).count() >= sent.len()
    });
    let seen: Vec<Seen> = hello.into_iter().chain(bye).collect();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_json_presence_the_mirror_goes_over_the_one_connection() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let json_topic = "dc/v2/t-one/json/host/h04/online";
    let Some(mut sub) = Subscriber::start(broker.port(), &[json_topic]) else {
        return;
    };
    let mut config = BusConfig::new(
        broker.addr(),
        Ident::new("t-one").unwrap(),
        NodeId::new(Role::Host, "h04").unwrap(),
    );
    config.json_presence = false;
    let (bus, _inbound, task) = Bus::start(config);
    assert!(bus.wait_connected(Duration::from_secs(10)).await);
    let hello = sub.collect_until(Duration::from_secs(10), |s| !s.is_empty());
    bus.shutdown(Duration::from_secs(5)).await.unwrap();
    task.join(Duration::from_secs(5)).await;
    let bye = sub.collect_until(Duration::from_secs(10), |s| !s.is_empty());
    let all: Vec<Seen> = hello.into_iter().chain(bye).collect();
    let json = presence_in(&all, json_topic);
    assert_eq!(
        json.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        [true, false]
    );
    let m = bus.metrics();
    assert_eq!((m.presence_connects, m.presence_errors), (0, 0), "{m}");
}
