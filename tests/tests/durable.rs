//! What an agent decided survives a crash and a broker outage: the event
//! log and the outbox in flash, through a real mosquitto.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loopwarden_boards::FlashBoard;
use loopwarden_bus::{now_ms, Backoff, Bus, BusConfig};
use loopwarden_flash::{EventLog, FileFlash, Outbox, SharedFlash, SimFlash};
use loopwarden_protocol::{Event, Frame, GpuIndex, Ident, Message, NodeId, Role};
use loopwarden_system_tests::{CutProxy, Mosquitto, Seen, Subscriber};

/// A `bus-peer --flash` process and what it printed so far.
struct Peer {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Peer {
    fn start(broker: &str, flash: &std::path::Path) -> Peer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_bus-peer"))
            .args([broker, "t-durable", "h11", "--flash"])
            .arg(flash)
            .args(["--period", "10"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start bus-peer");
        let out = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                l.lock().unwrap().push(line);
            }
        });
        Peer { child, lines }
    }

    /// SIGKILL: no chance to flush or say goodbye.
    fn kill(mut self) -> Vec<String> {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        std::thread::sleep(Duration::from_millis(200)); // the reader drains the pipe
        let lines = self.lines.lock().unwrap().clone();
        lines
    }

    fn count(&self, prefix: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with(prefix))
            .count()
    }
}

fn numbers(lines: &[String], prefix: &str) -> Vec<u32> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix(prefix))
        .map(|n| n.trim().parse().unwrap())
        .collect()
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    for _ in 0..200 {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

#[test]
fn sigkill_loses_no_completed_record_and_every_queued_frame_arrives() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let topic = "dc/v2/t-durable/host/h11/event";
    let Some(mut sub) = Subscriber::start(broker.port(), &[topic]) else {
        return;
    };
    let proxy = CutProxy::start(([127, 0, 0, 1], broker.port()).into());
    let dir = tempfile::tempdir().unwrap();
    let flash = dir.path().join("h11.flash");
    let via_proxy = proxy.addr().to_string();

    // Run 1: connected for a while, then the network goes and frames pile
    // up in the outbox, then the process is killed mid-stride.
    let peer = Peer::start(&via_proxy, &flash);
    wait_until("run 1 to queue 30 frames", || peer.count("queued") >= 30);
    proxy.cut();
    let queued_before_cut = peer.count("queued");
    wait_until("run 1 to queue 40 more while cut off", || {
        peer.count("queued") >= queued_before_cut + 40
    });
    let run1 = peer.kill();
    assert!(
        run1[0].starts_with("opened next_record=0 first_frame=0 pending=0"),
        "{}",
        run1[0]
    );

    // Run 2 on the same flash, the network back.
    proxy.restore();
    let peer = Peer::start(&via_proxy, &flash);
    wait_until("run 2 to queue 30 frames", || peer.count("queued") >= 30);
    let run2 = peer.kill();
    // Run 3 sends what run 2 left in the outbox when it was killed.
    let peer = Peer::start(&via_proxy, &flash);
    wait_until("run 3 to queue 10 frames", || peer.count("queued") >= 10);
    let run3 = peer.kill();
    assert!(numbers(&run3, "queued ")[0] > *numbers(&run2, "queued ").iter().max().unwrap());

    // The outbox carried frames across the kill.
    let opened = &run2[0];
    let pending: usize = opened.rsplit("pending=").next().unwrap().parse().unwrap();
    assert!(
        pending >= 30,
        "the outbox held only {pending} frames across the kill: {opened}"
    );
    let first_frame: u32 = opened
        .split("first_frame=")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();

    // Every record whose append completed is in the log, in order.
    let logged: Vec<u32> = numbers(&run1, "logged ")
        .into_iter()
        .chain(numbers(&run2, "logged "))
        .collect();
    let board = FlashBoard::host_file();
    let file = FileFlash::<4, 4096>::open(&flash, &board.geometry()).unwrap();
    let mut in_log = Vec::new();
    futures::executor::block_on(async {
        let mut log = EventLog::open(file, board.layout().log).await.unwrap();
        log.for_each(|r| in_log.push(r.seq)).await.unwrap();
    });
    for seq in &logged {
        assert!(
            in_log.contains(seq),
            "record {seq} completed but is not in the log"
        );
    }
    assert!(in_log.windows(2).all(|w| w[0] < w[1]), "log out of order");
    let run2_first_record = numbers(&run2, "logged ")[0];
    assert!(
        run2_first_record > *numbers(&run1, "logged ").last().unwrap(),
        "record numbers went back"
    );

    // Every frame that reached the outbox (in runs 1 and 2; run 3's last
    // ones may still wait) arrives at least once; a frame seen twice is the
    // same frame (same seq, same bytes); numbers rise across the restart.
    let queued: BTreeSet<u32> = numbers(&run1, "queued ")
        .into_iter()
        .chain(numbers(&run2, "queued "))
        .collect();
    let max1 = *numbers(&run1, "queued ").iter().max().unwrap();
    assert!(
        first_frame > max1 && numbers(&run2, "queued ")[0] >= first_frame,
        "frame numbers went back"
    );
    let mut by_seq: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
    let seen: Vec<Seen> = sub.collect_until(Duration::from_secs(20), |s| {
        let got: BTreeSet<u32> = s
            .iter()
            .map(|m| Frame::decode(&m.payload).unwrap().seq)
            .collect();
        queued.is_subset(&got)
    });
    for m in &seen {
        by_seq
            .entry(Frame::decode(&m.payload).unwrap().seq)
            .or_default()
            .push(m.payload.clone());
    }
    let missing: Vec<u32> = queued
        .iter()
        .filter(|q| !by_seq.contains_key(q))
        .copied()
        .collect();
    assert!(
        missing.is_empty(),
        "queued frames never delivered: {missing:?}"
    );
    for (seq, copies) in &by_seq {
        assert!(
            copies.iter().all(|c| c == &copies[0]),
            "frame {seq} delivered with different bytes"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_raised_while_the_broker_is_down_all_arrive_in_order() {
    let Some(mut broker) = Mosquitto::start() else {
        return;
    };
    let topic = "dc/v2/t-outage/host/h12/event";
    let Some(mut before) = Subscriber::start(broker.port(), &[topic]) else {
        return;
    };
    // The agent reaches the broker through a proxy, so the test decides when
    // it may reconnect: after the restarted broker has its subscriber.
    let proxy = CutProxy::start(([127, 0, 0, 1], broker.port()).into());
    // The outbox of the host board: room for the whole outage.
    let board = FlashBoard::host_file();
    let flash = SharedFlash::new(SimFlash::<4, 4096>::new(board.geometry().sectors as usize));
    let layout = board.layout().outbox;
    let outbox = Outbox::open(flash, layout).await.unwrap();
    let mut config = BusConfig::new(
        proxy.addr(),
        Ident::new("t-outage").unwrap(),
        NodeId::new(Role::Host, "h12").unwrap(),
    );
    config.backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(300));
    config.keep_alive = Duration::from_secs(1);
    let (bus, _inbound, _task) = Bus::start_with_outbox(config, Box::new(outbox));
    assert!(bus.wait_connected(Duration::from_secs(10)).await);
    let gpu = GpuIndex::new(2).unwrap();
    let publish = |n: u16| {
        bus.publish(Message::Event(Event::Xid { gpu, xid: n }), now_ms())
            .unwrap()
            .seq
    };
    let mut sent: Vec<u32> = (0..20).map(publish).collect();
    // Delivered before the outage (what the old broker acknowledged but had
    // not yet passed on would be lost with it, outside the outbox's reach).
    let first: Vec<u32> = sent.clone();
    let delivered_before = before.collect_until(Duration::from_secs(10), |s| {
        first.iter().all(|q| {
            s.iter()
                .any(|m| Frame::decode(&m.payload).unwrap().seq == *q)
        })
    });
    // The broker stops; the agent keeps deciding. (The first subscriber
    // goes with the broker: mosquitto_sub would reconnect to the new one.)
    broker.stop();
    proxy.cut();
    drop(before);
    for _ in 0..100 {
        if !bus.is_connected() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!bus.is_connected());
    sent.extend((20..200).map(publish));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let m = bus.metrics();
    assert!(
        m.deferred >= 180,
        "events did not pile up in the outbox: {m}"
    );
    assert!(m.connection_errors >= 2, "{m}");

    broker.restart();
    let Some(mut after) = Subscriber::start(broker.port(), &[topic]) else {
        return;
    };
    proxy.restore();
    assert!(
        bus.wait_connected(Duration::from_secs(15)).await,
        "did not reconnect"
    );

    let seq_of = |m: &Seen| Frame::decode(&m.payload).unwrap().seq;
    let mut first_arrival: Vec<u32> = Vec::new();
    for m in delivered_before.iter().chain(
        after
            .collect_until(Duration::from_secs(20), |s| {
                sent.iter()
                    .skip(20)
                    .all(|q| s.iter().any(|m| seq_of(m) == *q))
            })
            .iter(),
    ) {
        let seq = seq_of(m);
        if !first_arrival.contains(&seq) {
            first_arrival.push(seq);
        }
    }
    assert_eq!(first_arrival, sent, "events lost or out of order");
    // Everything was acknowledged: the outbox is empty again.
    for _ in 0..50 {
        if bus.metrics().outbox_acked as usize >= sent.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let m = bus.metrics();
    assert!(m.outbox_acked as usize >= sent.len(), "{m}");
}

/// An outbox whose flash refuses every write (a card gone read-only).
struct FailingOutbox;

impl loopwarden_bus::DurableOutbox for FailingOutbox {
    fn store(
        &mut self,
        _: u32,
        _: loopwarden_flash::outbox::Class,
        _: &str,
        _: &[u8],
    ) -> Result<loopwarden_flash::outbox::Dropped, loopwarden_bus::StoreFailure> {
        Err(loopwarden_bus::StoreFailure::Flash(
            "writing at 0x1000: Read-only file system (os error 30)".into(),
        ))
    }

    fn ack(&mut self, _: u32) -> Result<bool, String> {
        Ok(false)
    }

    fn pending(&mut self) -> Result<Vec<loopwarden_bus::Pending>, String> {
        Ok(Vec::new())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_the_failing_outbox_cannot_store_is_sent_while_connected_and_refused_while_not() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let topic = "dc/v2/t-failing/host/h13/event";
    let Some(mut sub) = Subscriber::start(broker.port(), &[topic]) else {
        return;
    };
    let proxy = CutProxy::start(([127, 0, 0, 1], broker.port()).into());
    let mut config = BusConfig::new(
        proxy.addr(),
        Ident::new("t-failing").unwrap(),
        NodeId::new(Role::Host, "h13").unwrap(),
    );
    config.backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(300));
    config.keep_alive = Duration::from_secs(1);
    let (bus, _inbound, _task) = Bus::start_with_outbox(config, Box::new(FailingOutbox));
    assert!(bus.wait_connected(Duration::from_secs(10)).await);
    let gpu = GpuIndex::new(1).unwrap();
    let xid = |n: u16| Message::Event(Event::Xid { gpu, xid: n });
    let sent = bus
        .publish(xid(79), now_ms())
        .expect("sent without the outbox");
    let seen = sub.collect_until(Duration::from_secs(10), |s| {
        s.iter()
            .any(|m| Frame::decode(&m.payload).unwrap().seq == sent.seq)
    });
    assert!(
        seen.iter()
            .any(|m| Frame::decode(&m.payload).unwrap().seq == sent.seq),
        "the event reached the broker"
    );
    assert_eq!(bus.metrics().outbox_failed, 1);
    // Not connected: neither stored nor sent, so refused for the caller
    // to offer again.
    proxy.cut();
    for _ in 0..100 {
        if !bus.is_connected() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!bus.is_connected());
    let e = bus.publish(xid(48), now_ms()).unwrap_err();
    assert!(
        matches!(e, loopwarden_bus::PublishError::Outbox(ref why) if why.contains("Read-only")),
        "{e}"
    );
    assert_eq!(bus.metrics().outbox_failed, 2);
}
