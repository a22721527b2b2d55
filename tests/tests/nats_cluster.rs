//! Failover between the nodes of a clustered broker: a three-node NATS
//! cluster (JetStream, MQTT; `deploy/nats/cluster.sh`) on loopback, hosts
//! given all three addresses, one node killed while they publish events,
//! then started again.
//!
//! Events carry no counter of their own: a sender numbers every frame it
//! sends (telemetry, health, presence, events) from one counter, the frame
//! header's sequence number. Each host here records the numbers its events
//! were given as it publishes them; the check is that every one of them
//! reaches an independent subscriber (`mosquitto_sub`) on a node that
//! stays up: no gap in any sender's list of events.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use loopwarden_boards::FlashBoard;
use loopwarden_bus::{now_ms, Backoff, Brokers, Bus, BusConfig, BusTask};
use loopwarden_field::common::CommonFlags;
use loopwarden_flash::{Outbox, SharedFlash, SimFlash};
use loopwarden_protocol::{
    samples, Event, Frame, GpuIndex, Ident, Message, MessageKind, NodeId, Role,
};
use loopwarden_system_tests::twin_agent::run_twin_agent;
use loopwarden_system_tests::{retained, NatsCluster, Seen, Subscriber};

/// One cluster at a time: the measured run must not share the machine
/// with the other test's cluster.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const SITE: &str = "t-nats";

fn ident(s: &str) -> Ident {
    Ident::new(s).unwrap()
}

/// A host's bus with a flash outbox (in memory), on the cluster's nodes
/// in `order`; it retries within 2 s at most, so the test stays short.
async fn host_bus(cluster: &NatsCluster, name: &str, order: &[usize]) -> (Bus, BusTask) {
    let board = FlashBoard::host_file();
    let flash = SharedFlash::new(SimFlash::<4, 4096>::new(board.geometry().sectors as usize));
    let outbox = Outbox::open(flash, board.layout().outbox).await.unwrap();
    let brokers: Brokers = cluster.brokers(order).parse().unwrap();
    let mut config = BusConfig::new(brokers, ident(SITE), NodeId::new(Role::Host, name).unwrap());
    config.keep_alive = Duration::from_secs(2);
    config.backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(2));
    let (bus, _inbound, task) = Bus::start_with_outbox(config, Box::new(outbox));
    (bus, task)
}

/// The node agent `name` on two twin GPUs, its `broker` the cluster's
/// three addresses as a field engineer writes them; stopped when the
/// sender is dropped.
fn start_node_agent(
    cluster: &NatsCluster,
    name: &str,
    dir: &std::path::Path,
) -> tokio::sync::oneshot::Sender<()> {
    let flags = node_agent::config::Overrides {
        common: CommonFlags {
            site: Some(SITE.into()),
            broker: Some(cluster.brokers(&[1, 2, 3])),
            console: Some(dir.join(format!("{name}.sock"))),
            ..Default::default()
        },
        host: Some(name.into()),
        twin_gpus: Some(2),
        period_ms: Some(200),
        ..Default::default()
    };
    let config = node_agent::config::load(None, &flags).expect("the agent's config");
    assert_eq!(config.broker.as_ref().map(Brokers::len), Some(3));
    run_twin_agent(&flags, 2, 5)
}

fn xid(n: u32) -> Message {
    Message::Event(Event::Xid {
        gpu: GpuIndex::new(0).unwrap(),
        xid: (n % 100) as u16,
    })
}

/// Publishes an event every 40 ms until `stop`; the sequence numbers
/// the events were given.
fn keep_publishing(bus: Bus, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<u32>> {
    tokio::spawn(async move {
        let mut sent = Vec::new();
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            let frame = bus
                .publish(xid(n), now_ms())
                .unwrap_or_else(|e| panic!("{}: event {n} not taken: {e}", bus.node().id));
            sent.push(frame.seq);
            n += 1;
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        sent
    })
}

fn frame_of(seen: &Seen) -> Frame {
    Frame::decode(&seen.payload)
        .unwrap_or_else(|e| panic!("a frame on {} does not decode: {e}", seen.topic))
}

/// The retained frames under `filters` on node `n`, by topic, once every
/// one of `want` is there as `ok` says (the node may still be catching up
/// after a restart), at most 15 s.
fn retained_on(
    cluster: &NatsCluster,
    n: usize,
    filters: &[&str],
    mut ok: impl FnMut(&BTreeMap<String, Frame>) -> bool,
) -> BTreeMap<String, Frame> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let seen = retained(cluster.mqtt_port(n), filters, Duration::from_secs(1))
            .expect("mosquitto_sub was found before");
        let by_topic: BTreeMap<String, Frame> = seen
            .iter()
            .filter(|s| s.retained)
            .map(|s| (s.topic.clone(), frame_of(s)))
            .collect();
        if ok(&by_topic) || Instant::now() > deadline {
            return by_topic;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_dies_and_no_event_is_lost_and_retained_state_stays_right() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(cluster) = NatsCluster::start() else {
        return;
    };
    let started = Instant::now();
    let events = format!("dc/v2/{SITE}/host/+/event");
    // The independent subscriber, on node 3, which stays up.
    let Some(mut sub) = Subscriber::start(cluster.mqtt_port(3), &[&events]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();

    // h01 and h02 start on node 1, the one to die, and move on to nodes 2
    // and 3; h03 starts on node 2 and stays there. h10 is a whole node
    // agent on the three addresses in order.
    let orders: [(&str, [usize; 3]); 3] =
        [("h01", [1, 2, 3]), ("h02", [1, 3, 2]), ("h03", [2, 3, 1])];
    let mut hosts = Vec::new();
    for (name, order) in orders {
        hosts.push(host_bus(&cluster, name, &order).await);
    }
    let _agent = start_node_agent(&cluster, "h10", dir.path());
    for (bus, _) in &hosts {
        assert!(
            bus.wait_connected(Duration::from_secs(20)).await,
            "{} never connected to {}:\n{}",
            bus.node().id,
            bus.broker(),
            cluster.log(1)
        );
    }
    let health = samples::message(MessageKind::HostHealth);
    for (bus, _) in &hosts {
        bus.publish(health.clone(), now_ms()).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let publishers: Vec<_> = hosts
        .iter()
        .map(|(bus, _)| keep_publishing(bus.clone(), stop.clone()))
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Node 1 crashes while they publish; they go on publishing through the
    // failover.
    let dead = cluster.brokers(&[1]);
    eprintln!("{:>6} ms: node 1 killed", started.elapsed().as_millis());
    cluster.kill_node(1);
    let killed = Instant::now();
    let mut latest_health = BTreeMap::new();
    while latest_health.len() < hosts.len() {
        for (bus, _) in &hosts {
            let name = bus.node().id.to_string();
            if latest_health.contains_key(&name)
                || !bus.is_connected()
                || bus.broker().to_string() == dead
            {
                continue;
            }
            eprintln!(
                "{name} on {} {} ms after the kill",
                bus.broker(),
                killed.elapsed().as_millis()
            );
            // A state change during the failover: the newest is what counts.
            let seq = bus.publish(health.clone(), now_ms()).unwrap().seq;
            latest_health.insert(name, seq);
        }
        assert!(
            killed.elapsed() < Duration::from_secs(40),
            "not every host moved off node 1 within 40 s (these did: {:?}):\n{}",
            latest_health.keys().collect::<Vec<_>>(),
            cluster.log(2)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Relaxed);
    let mut sent = BTreeMap::new();
    for ((bus, _), p) in hosts.iter().zip(publishers) {
        sent.insert(bus.node().id.to_string(), p.await.unwrap());
    }
    for (name, seqs) in &sent {
        assert!(
            seqs.len() > 50,
            "{name} published only {} events",
            seqs.len()
        );
    }

    // Every event of every host reaches the subscriber: each sender's list
    // of event numbers arrives whole (duplicates allowed: at least once).
    let arrived = |seen: &[Seen]| {
        let mut got: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        let mut copies = 0;
        for s in seen {
            let f = frame_of(s);
            if !got
                .entry(f.sender.id.to_string())
                .or_default()
                .insert(f.seq)
            {
                copies += 1;
            }
        }
        (got, copies)
    };
    let seen = sub.collect_until(Duration::from_secs(20), |seen| {
        let (got, _) = arrived(seen);
        sent.iter().all(|(name, seqs)| {
            got.get(name)
                .is_some_and(|g| seqs.iter().all(|q| g.contains(q)))
        })
    });
    let (got, copies) = arrived(&seen);
    for (name, seqs) in &sent {
        let got = got.get(name.as_str()).cloned().unwrap_or_default();
        let lost: Vec<u32> = seqs.iter().filter(|q| !got.contains(q)).copied().collect();
        assert!(
            lost.is_empty(),
            "{name}: {} of {} events lost: {lost:?}",
            lost.len(),
            seqs.len()
        );
    }
    eprintln!(
        "{:>6} ms: {} events from {} hosts all arrived ({copies} sent twice)",
        started.elapsed().as_millis(),
        sent.values().map(Vec::len).sum::<usize>(),
        sent.len()
    );

    // Node 1 comes back, after the events (publishing through a node's
    // rejoin is measured at scale by the fleet, docs/scale.md). The hosts
    // stay where they are.
    eprintln!(
        "{:>6} ms: node 1 started again",
        started.elapsed().as_millis()
    );
    cluster.start_node(1);
    eprint!("{}", cluster.status());

    // Every node, node 1 included, holds each host online and its latest
    // health.
    let online = format!("dc/v2/{SITE}/host/+/online");
    let health_filter = format!("dc/v2/{SITE}/host/+/health");
    let names = ["h01", "h02", "h03", "h10"];
    let right = |kept: &BTreeMap<String, Frame>| {
        names.iter().all(|h| {
            let on = kept.get(&format!("dc/v2/{SITE}/host/{h}/online"));
            let health = kept.get(&format!("dc/v2/{SITE}/host/{h}/health"));
            let online = matches!(on.map(|f| &f.message), Some(Message::Online(o)) if o.online);
            let fresh = match (health, latest_health.get(*h)) {
                (Some(f), Some(seq)) => f.seq == *seq,
                (Some(f), None) => matches!(f.message, Message::HostHealth(_)),
                (None, _) => false,
            };
            online && fresh
        })
    };
    for n in 1..=3 {
        let kept = retained_on(&cluster, n, &[&online, &health_filter], right);
        let summary: Vec<String> = kept
            .iter()
            .map(|(t, f)| format!("{t} seq {} {:?}", f.seq, f.message.kind()))
            .collect();
        assert!(
            right(&kept),
            "node {n}'s retained state is not every host online with its latest health \
             (latest health {latest_health:?}):\n{}",
            summary.join("\n")
        );
    }
    eprintln!("wall time {} ms", started.elapsed().as_millis());
}

/// The figure docs/brokers.md quotes: how fast the surviving nodes are
/// asked for connections when a node with 200 hosts on it dies. Each host
/// has the bus's default backoff (250 ms, doubling to 30 s, each wait a
/// random half to whole of the step) and the three addresses in the same
/// order, so all 200 start on node 1 and move on to node 2 together, the
/// worst case. Measured two ways: each bus's own state, polled every
/// 5 ms (when it is connected again, subscriptions answered), and the
/// survivors' accepted-connection counters (`/varz` `total_connections`,
/// every 20 ms), which also count attempts the cluster refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reconnections_after_a_node_dies_are_spread_by_the_jittered_backoff() {
    const HOSTS: usize = 200;
    let _one = ONE_CLUSTER.lock().await;
    let Some(cluster) = NatsCluster::start() else {
        return;
    };
    let started = Instant::now();
    let brokers: Brokers = cluster.brokers(&[1, 2, 3]).parse().unwrap();
    let mut buses = Vec::new();
    for i in 0..HOSTS {
        let node = NodeId::new(Role::Host, &format!("m{i:03}")).unwrap();
        let config = BusConfig::new(brokers.clone(), ident(SITE), node);
        let (bus, _inbound, task) = Bus::start(config);
        buses.push((bus, task));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while buses.iter().any(|(b, _)| !b.is_connected()) {
        assert!(
            Instant::now() < deadline,
            "{} of {HOSTS} hosts not connected after 60 s:\n{}",
            buses.iter().filter(|(b, _)| !b.is_connected()).count(),
            cluster.log(1)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = brokers.get(0).to_string();
    assert!(
        buses.iter().all(|(b, _)| b.broker().to_string() == first),
        "every host starts on node 1"
    );
    eprintln!(
        "{HOSTS} hosts on node 1 after {} ms",
        started.elapsed().as_millis()
    );

    // The survivors' counters, sampled on a thread of their own.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (ports, on) = (
            [cluster.http_port(2), cluster.http_port(3)],
            sampling.clone(),
        );
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            let t0 = Instant::now();
            let sample = |samples: &mut Vec<(Duration, u64)>| {
                let total: u64 = ports.iter().map(|p| varz_connections(*p)).sum();
                samples.push((t0.elapsed(), total));
            };
            while on.load(Ordering::Relaxed) {
                sample(&mut samples);
                std::thread::sleep(Duration::from_millis(20));
            }
            // One more once every host is back, however late this thread
            // ran: the counts end with all of their connections.
            sample(&mut samples);
            (t0, samples)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let killed = Instant::now();
    cluster.kill_node(1);
    let mut back: Vec<Option<Duration>> = vec![None; HOSTS];
    let deadline = killed + Duration::from_secs(90);
    while back.iter().any(Option::is_none) && Instant::now() < deadline {
        for (i, (bus, _)) in buses.iter().enumerate() {
            if back[i].is_none() && bus.is_connected() && bus.broker().to_string() != first {
                back[i] = Some(killed.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    sampling.store(false, Ordering::Relaxed);
    let (t0, counted) = sampler.join().unwrap();
    let missing = back.iter().filter(|b| b.is_none()).count();
    assert_eq!(
        missing,
        0,
        "{missing} of {HOSTS} hosts never reconnected:\n{}",
        cluster.log(2)
    );
    let mut back: Vec<Duration> = back.into_iter().flatten().collect();
    back.sort();

    // Reconnections per 100 ms after the kill, and the busiest second.
    let per_100ms = |times: &[Duration]| {
        let mut buckets = BTreeMap::new();
        for t in times {
            *buckets.entry(t.as_millis() / 100).or_insert(0usize) += 1;
        }
        buckets
    };
    let busiest_second = |times: &[Duration]| {
        (0..times.len())
            .map(|i| {
                times[i..]
                    .iter()
                    .take_while(|t| **t - times[i] < Duration::from_secs(1))
                    .count()
            })
            .max()
            .unwrap_or(0)
    };
    // Accepted connections at the survivors after the kill, as times.
    let since_kill = killed.saturating_duration_since(t0);
    let base = counted
        .iter()
        .rev()
        .find(|(t, _)| *t <= since_kill)
        .map_or(0, |(_, c)| *c);
    let mut accepted = Vec::new();
    let mut last = base;
    for (t, c) in &counted {
        if *t > since_kill && *c > last {
            accepted.extend(std::iter::repeat_n(
                t.saturating_sub(since_kill),
                (c - last) as usize,
            ));
            last = *c;
        }
    }
    let mut per_20ms: BTreeMap<u128, usize> = BTreeMap::new();
    for t in accepted.iter().filter(|t| t.as_millis() < 500) {
        *per_20ms.entry(t.as_millis() / 20 * 20).or_default() += 1;
    }
    eprintln!("survivors' accepted connections by 20 ms, first 500 ms (ms: count): {per_20ms:?}");
    // Each host's errors: the lost connection, then every refused attempt.
    let refused: u64 = buses
        .iter()
        .map(|(b, _)| b.metrics().connection_errors.saturating_sub(1))
        .sum();
    eprintln!(
        "node 1 killed with {HOSTS} hosts on it: all back after {} ms (first {} ms, median {} ms)",
        back.last().unwrap().as_millis(),
        back[0].as_millis(),
        back[HOSTS / 2].as_millis()
    );
    eprintln!(
        "reconnected per 100 ms after the kill: {:?}",
        per_100ms(&back)
    );
    eprintln!(
        "busiest second: {} reconnections; survivors accepted {} connections, busiest second {} \
         (per 100 ms: {:?}); attempts refused while the cluster recovered: {refused}",
        busiest_second(&back),
        accepted.len(),
        busiest_second(&accepted),
        per_100ms(&accepted)
    );

    // Nobody comes back before half the first step (125 ms): the hosts
    // waited their backoff, which a busy machine can only lengthen.
    assert!(
        back[0] >= Duration::from_millis(120),
        "a host reconnected {} ms after the kill, before its backoff's least wait",
        back[0].as_millis()
    );
    // The survivors count connections, and each host holds two (its
    // frames and its JSON presence).
    assert!(
        accepted.len() >= HOSTS,
        "the survivors counted {} connections for {HOSTS} hosts",
        accepted.len()
    );
    // How spread the survivors saw the wave: the most accepted in one
    // sample (20 to 40 ms apart) and the time from the first to the last.
    // Printed, not asserted: a stall of the server or of this machine
    // bunches acceptances into one sample whatever the hosts did; the
    // backoff's spread of a wave is asserted in its unit test
    // (`the_first_wave_of_200_agents_is_spread_over_the_first_steps_half`).
    let (crowd, span) = acceptance_spread(&counted, since_kill);
    eprintln!(
        "survivors' acceptances: at most {crowd} of {} connections in one sample, over {} ms",
        accepted.len(),
        span.as_millis()
    );
    eprintln!("wall time {} ms", started.elapsed().as_millis());
}

/// From the survivors' connection counts sampled after `since`: the most
/// accepted between two samples at most 40 ms apart, and the time from
/// the first sample that saw one to the one that saw the last.
fn acceptance_spread(counted: &[(Duration, u64)], since: Duration) -> (usize, Duration) {
    let after: Vec<&(Duration, u64)> = counted.iter().filter(|(t, _)| *t > since).collect();
    let mut crowd = 0;
    for w in after.windows(2) {
        let ((t0, c0), (t1, c1)) = (w[0], w[1]);
        if *t1 - *t0 <= Duration::from_millis(40) {
            crowd = crowd.max(c1.saturating_sub(*c0) as usize);
        }
    }
    let first = after
        .iter()
        .zip(after.iter().skip(1))
        .find(|(a, b)| b.1 > a.1);
    let last = after.last().map(|l| l.1);
    let span = match (first, last) {
        (Some((_, b)), Some(total)) => {
            let done = after.iter().find(|(_, c)| *c == total).map_or(b.0, |d| d.0);
            done.saturating_sub(b.0)
        }
        _ => Duration::ZERO,
    };
    (crowd, span)
}

/// `total_connections` of the node whose monitoring port is `port` (0 when
/// it does not answer).
fn varz_connections(port: u16) -> u64 {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    s.set_read_timeout(Some(Duration::from_secs(2))).ok();
    if s.write_all(b"GET /varz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return 0;
    }
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split_once("\r\n\r\n")
        .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(body).ok())
        .and_then(|v| v["total_connections"].as_u64())
        .unwrap_or(0)
}
