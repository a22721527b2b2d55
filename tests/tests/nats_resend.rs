//! Repair from the source through a clustered broker: a node agent
//! publishes events through node 2 of a three-node NATS cluster while an
//! independent subscriber (`mosquitto_sub`) listens on node 1. Node 1 is
//! killed while the events flow and started again: the broker
//! acknowledged the events of that outage to the agent and never
//! delivered them to the subscriber (its session is clean); not every
//! outage costs an event, so it is repeated, up to three times, until one
//! does. A reader asks the agent to resend the numbers the subscriber
//! missed; the subscriber then holds every event, the repaired ones byte
//! for byte as a witness on node 3 heard them first.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use loopwarden_bus::keys::SignKey;
use loopwarden_bus::{Brokers, Bus, BusConfig};
use loopwarden_field::common::CommonFlags;
use loopwarden_protocol::{samples, Frame, Ident, Message, NodeId, ResendCode, Role};
use loopwarden_system_tests::twin_agent::{run_twin_agent, signed_lease};
use loopwarden_system_tests::{NatsCluster, Seen, Subscriber};

const SITE: &str = "t-resend";

fn ident(s: &str) -> Ident {
    Ident::new(s).unwrap()
}

/// The node agent `h1` on two twin GPUs, through node 2 (then 3): the
/// twin's demonstration keyring lets facility systems lease and ask for
/// resends with the demonstration key. Stopped when the sender is dropped.
fn start_agent(cluster: &NatsCluster, dir: &std::path::Path) -> tokio::sync::oneshot::Sender<()> {
    let flags = node_agent::config::Overrides {
        common: CommonFlags {
            site: Some(SITE.into()),
            broker: Some(cluster.brokers(&[2, 3])),
            console: Some(dir.join("h1.sock")),
            flash: Some(dir.join("h1.flash")),
            ..Default::default()
        },
        host: Some("h1".into()),
        twin_gpus: Some(2),
        period_ms: Some(200),
        ..Default::default()
    };
    run_twin_agent(&flags, 2, 5)
}

/// The reader's bus and key: facility `ems1`, on node 2.
async fn reader(cluster: &NatsCluster) -> (Bus, SignKey) {
    let node = NodeId::new(Role::Facility, "ems1").unwrap();
    let brokers: Brokers = cluster.brokers(&[2, 3]).parse().unwrap();
    let (bus, _inbound, _task) = Bus::start(BusConfig::new(brokers, ident(SITE), node.clone()));
    assert!(bus.wait_connected(Duration::from_secs(20)).await);
    let key = SignKey {
        node,
        key_id: 1,
        key: samples::demo_signing_key(),
    };
    (bus, key)
}

/// h1's event frames in `seen` on `family`, by sequence number.
fn frames(seen: &[Seen], family: &str) -> BTreeMap<u32, (Vec<u8>, Frame)> {
    seen.iter()
        .filter(|s| s.topic == format!("dc/v2/{SITE}/host/h1/{family}"))
        .filter_map(|s| {
            Frame::decode(&s.payload)
                .ok()
                .map(|f| (s.payload.clone(), f))
        })
        .filter(|(_, f)| matches!(f.message, Message::Event(_)) || family == "resent")
        .map(|(p, f)| (f.seq, (p, f)))
        .collect()
}

/// Leases every 250 ms for 10 s, 500 W and 550 W in turn (each makes an
/// event), with node 1 (the subscriber's) down from the 8th to the 24th;
/// then 3 s for the last to arrive.
async fn outage(cluster: &NatsCluster, bus: &Bus, key: &SignKey) {
    let started = Instant::now();
    for n in 1..=40u32 {
        let watts = if n % 2 == 0 { 500 } else { 550 };
        signed_lease(bus, key, &ident(SITE), &ident("h1"), watts);
        if n == 8 {
            cluster.kill_node(1);
            eprintln!("{:>6} ms: node 1 killed", started.elapsed().as_millis());
        }
        if n == 24 {
            cluster.start_node(1);
            eprintln!("{:>6} ms: node 1 started", started.elapsed().as_millis());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_a_broker_node_lost_reaches_an_independent_subscriber_through_the_repair() {
    let Some(cluster) = NatsCluster::start() else {
        return;
    };
    let tree = format!("dc/v2/{SITE}/host/h1/#");
    let Some(mut sub) = Subscriber::start(cluster.mqtt_port(1), &[&tree]) else {
        return;
    };
    let mut witness = Subscriber::start(cluster.mqtt_port(3), &[&tree]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let _agent = start_agent(&cluster, dir.path());
    let (bus, key) = reader(&cluster).await;
    // The agent is up once its telemetry flows.
    let first = sub.collect_until(Duration::from_secs(30), |s| {
        s.iter().any(|s| s.topic.ends_with("/telemetry"))
    });
    assert!(!first.is_empty(), "the agent never published");

    // An outage of node 1 does not always cost the subscriber an event
    // (it depends on where the broker stands when the node dies): up to
    // three outages, until one did.
    let mut heard = first;
    let mut all = Vec::new();
    let (mut published, mut missed) = (BTreeMap::new(), BTreeSet::new());
    for round in 1..=3 {
        outage(&cluster, &bus, &key).await;
        all.extend(witness.collect_until(Duration::from_secs(5), |_| false));
        heard.extend(sub.collect_until(Duration::from_secs(5), |_| false));
        published = frames(&all, "event");
        let delivered = frames(&heard, "event");
        missed = published
            .keys()
            .filter(|s| !delivered.contains_key(s))
            .copied()
            .collect();
        eprintln!(
            "outage {round}: {} events at the witness, {} at the subscriber, missed {missed:?}",
            published.len(),
            delivered.len()
        );
        if !missed.is_empty() {
            break;
        }
    }
    assert!(
        published.len() >= 20,
        "the leases made events: {}",
        published.len()
    );
    assert!(
        !missed.is_empty(),
        "three outages of node 1 cost the subscriber no event: nothing to repair"
    );

    // The reader asks for the range the subscriber missed.
    let (from, to) = (*missed.first().unwrap(), *missed.last().unwrap());
    let request = loopwarden_bus::resend::request(&bus, &key, Role::Host, &ident("h1"), from, to)
        .expect("the request is sent");
    let repaired = sub.collect_until(Duration::from_secs(20), |s| {
        s.iter().any(|s| {
            Frame::decode(&s.payload).is_ok_and(|f| {
                matches!(&f.message, Message::ResendReport(r) if r.correlation.seq == request.seq)
            })
        })
    });
    let resent = frames(&repaired, "resent");
    let report = resent
        .values()
        .find_map(|(_, f)| match &f.message {
            Message::ResendReport(r) => Some(r.clone()),
            _ => None,
        })
        .expect("a report came");
    assert_eq!(report.code, ResendCode::Ok, "{report:?}");
    assert!(report.held_from.is_some_and(|h| h <= from), "{report:?}");
    for seq in &missed {
        let (bytes, _) = resent
            .get(seq)
            .unwrap_or_else(|| panic!("event {seq} was not resent: {resent:?}"));
        assert_eq!(
            bytes, &published[seq].0,
            "event {seq} resent differs from the original"
        );
    }
    assert_eq!(report.resent as usize, resent.len() - 1, "{report:?}");
}
