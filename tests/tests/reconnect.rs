//! A network outage between a host and a real mosquitto (the broker stays
//! up; a proxy cuts the connection): the bus shell reconnects with backoff,
//! announces itself again, drops stale telemetry (counted) and delivers the
//! events raised during the outage, in order, at least once.

use std::time::Duration;

use loopwarden_bus::{now_ms, Backoff, Bus, BusConfig, PublishError};
use loopwarden_protocol::{samples, Event, Frame, GpuIndex, Ident, Message, NodeId, Role};
use loopwarden_system_tests::{publish_raw, CutProxy, Mosquitto, Subscriber};

fn xid_event(n: u16) -> Message {
    Message::Event(Event::Xid {
        gpu: GpuIndex::new(1).unwrap(),
        xid: n,
    })
}

/// A host's bus through `proxy` that notices a cut within a second and
/// retries every 100 to 400 ms.
fn quick_to_reconnect(proxy: &CutProxy, site: &str, host: &str) -> BusConfig {
    let mut config = BusConfig::new(
        proxy.addr(),
        Ident::new(site).unwrap(),
        NodeId::new(Role::Host, host).unwrap(),
    );
    config.backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
    config.keep_alive = Duration::from_secs(1);
    config
}

/// Waits until the shell notices a cut (EOF, or a missed keep-alive at
/// worst), at most 5 s.
async fn wait_disconnected(bus: &Bus) {
    for _ in 0..100 {
        if !bus.is_connected() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!bus.is_connected(), "the cut was not noticed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_survive_an_outage_in_order_and_telemetry_is_dropped() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let events = "dc/v2/t-cut/host/h03/event";
    let online = "dc/v2/t-cut/host/h03/online";
    let Some(mut sub) = Subscriber::start(broker.port(), &[events, online]) else {
        return;
    };
    let proxy = CutProxy::start(([127, 0, 0, 1], broker.port()).into());

    let (bus, _inbound, _task) = Bus::start(quick_to_reconnect(&proxy, "t-cut", "h03"));
    assert!(bus.wait_connected(Duration::from_secs(10)).await);

    let mut sent = Vec::new();
    for n in 1..=3 {
        sent.push(bus.publish(xid_event(n), now_ms()).unwrap().seq);
    }
    proxy.cut();
    wait_disconnected(&bus).await;
    for n in 4..=8 {
        sent.push(bus.publish(xid_event(n), now_ms()).unwrap().seq);
    }
    for _ in 0..3 {
        let r = bus.publish(Message::HostTelemetry(samples::host_telemetry(8)), now_ms());
        assert!(matches!(r, Err(PublishError::Offline)), "{r:?}");
    }
    // Several reconnect attempts fail against the closed proxy.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let during = bus.metrics();
    assert!(during.connection_errors >= 2, "{during}");
    assert!(during.dropped_offline >= 3, "{during}");

    proxy.restore();
    assert!(
        bus.wait_connected(Duration::from_secs(10)).await,
        "did not reconnect"
    );

    let seen = sub.collect_until(Duration::from_secs(15), |s| {
        let seqs: Vec<u32> = s
            .iter()
            .filter(|m| m.topic == events)
            .map(|m| Frame::decode(&m.payload).unwrap().seq)
            .collect();
        sent.iter().all(|q| seqs.contains(q))
    });
    let mut event_seqs = Vec::new();
    let mut presence = Vec::new();
    for m in &seen {
        let frame = Frame::decode(&m.payload).unwrap();
        match frame.message {
            Message::Online(o) => presence.push(o.online),
            Message::Event(_) => event_seqs.push(frame.seq),
            other => panic!("unexpected {other:?}"),
        }
    }
    // At least once: duplicates possible (an unacknowledged publish is sent
    // again), identifiable by seq. In order of first arrival.
    let mut first_arrival = event_seqs.clone();
    let mut seen_once = std::collections::HashSet::new();
    first_arrival.retain(|q| seen_once.insert(*q));
    assert_eq!(
        first_arrival, sent,
        "events lost or out of order: {event_seqs:?}"
    );
    // The broker declared us gone (last will) and we came back. (The first
    // announcement may never have left: a cut within milliseconds of
    // connecting drops it, and the next connection announces anew.)
    assert!(
        presence.contains(&false),
        "no last will after the cut: {presence:?}"
    );
    assert_eq!(
        presence.last(),
        Some(&true),
        "not announced again: {presence:?}"
    );
}

/// Regression: after an outage long enough to fill the client's queue, the
/// shell could not renew its subscriptions (they waited behind the full
/// queue), so it never counted as connected and commands never reached it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_filling_outage_still_ends_subscribed_and_ready() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let proxy = CutProxy::start(([127, 0, 0, 1], broker.port()).into());
    let mut config = BusConfig::new(
        proxy.addr(),
        Ident::new("t-fill").unwrap(),
        NodeId::new(Role::Host, "h04").unwrap(),
    );
    config.backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(300));
    config.keep_alive = Duration::from_secs(1);
    let capacity = config.queue_capacity;
    let (bus, mut inbound, _task) = Bus::start(config);
    assert!(bus.wait_connected(Duration::from_secs(10)).await);
    proxy.cut();
    for _ in 0..100 {
        if !bus.is_connected() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // More events than the queue holds: the rest are refused and counted.
    let mut refused = 0;
    for n in 0..capacity + 50 {
        if bus.publish(xid_event(n as u16), now_ms()).is_err() {
            refused += 1;
        }
    }
    assert!(
        refused >= 50,
        "queue of {capacity} took {} events",
        capacity + 50 - refused
    );
    assert!(bus.metrics().dropped_queue_full >= 50);
    proxy.restore();
    assert!(
        bus.wait_connected(Duration::from_secs(10)).await,
        "never ready again: {}",
        bus.metrics()
    );
    // The cmd subscription is back: a command from a third-party client arrives.
    let cmd = samples::frame(loopwarden_protocol::MessageKind::QuarantineRelease);
    publish_raw(
        broker.port(),
        "dc/v2/t-fill/host/h04/cmd",
        &cmd.to_vec().unwrap(),
        false,
    )
    .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), inbound.recv())
        .await
        .expect("command after the outage")
        .unwrap();
    assert_eq!(got.frame, cmd);
    // And telemetry flows again.
    assert!(bus
        .publish(Message::HostTelemetry(samples::host_telemetry(8)), now_ms())
        .is_ok());
}

/// The bus announces the node's latest retained state (`health`) again
/// after a re-connection, after its presence, without the agent asking: a
/// broker that lost it (a restart without persistence) has it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_latest_retained_state_is_announced_again_after_a_reconnection() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let health = "dc/v2/t-ret/host/h04/health";
    let Some(mut sub) = Subscriber::start(broker.port(), &[health]) else {
        return;
    };
    let proxy = CutProxy::start(([127, 0, 0, 1], broker.port()).into());
    let (bus, _inbound, _task) = Bus::start(quick_to_reconnect(&proxy, "t-ret", "h04"));
    assert!(bus.wait_connected(Duration::from_secs(10)).await);
    let kind = loopwarden_protocol::MessageKind::HostHealth;
    let older = bus.publish(samples::message(kind), now_ms()).unwrap().seq;
    let latest = bus.publish(samples::message(kind), now_ms()).unwrap().seq;
    let first = sub.collect_until(Duration::from_secs(10), |s| {
        s.iter()
            .any(|m| Frame::decode(&m.payload).unwrap().seq == latest)
    });
    assert!(!first.is_empty(), "the health frame never arrived");

    proxy.cut();
    wait_disconnected(&bus).await;
    proxy.restore();
    assert!(bus.wait_connected(Duration::from_secs(10)).await);
    let again = sub.collect_until(Duration::from_secs(10), |s| {
        s.iter()
            .any(|m| Frame::decode(&m.payload).unwrap().seq == latest)
    });
    let seqs: Vec<u32> = again
        .iter()
        .map(|m| Frame::decode(&m.payload).unwrap().seq)
        .collect();
    assert!(seqs.contains(&latest), "not announced again: {seqs:?}");
    assert!(
        !seqs.contains(&older),
        "an older state came again: {seqs:?}"
    );
}
