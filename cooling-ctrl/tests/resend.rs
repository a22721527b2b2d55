//! A reader asks the controller to resend its logged events, against a
//! real mosquitto and the simulated CDU on Modbus TCP: the controller
//! logs a leak's events and publishes them on its `event` topic; a
//! facility system of its keyring asks for them with a signed request
//! and gets them again on the `resent` topic, byte for byte, then a
//! report; a request signed with a key the keyring does not hold gets a
//! report that says `unauthenticated`, and no frame. What goes over the
//! broker is read by an independent `mosquitto_sub`; the controller counts
//! one request served with its frames and one refused.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

use std::time::Duration;

use cooling_core::CoreConfig;
use cooling_ctrl::modbus::{Link, ModbusCdu};
use cooling_ctrl::shell::{self, ResendCounts, ShellConfig, ShellOptions, ShellStats};
use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_bus::keys::SignKey;
use loopwarden_bus::{resend, Bus, BusConfig};
use loopwarden_protocol::auth::{May, Signer, SigningKey};
use loopwarden_protocol::{
    Family, Frame, Ident, Message, NodeId, ResendCode, ResendReport, Role, Topic,
};
use loopwarden_system_tests::{steady_sim_cdu, Mosquitto, Seen, Subscriber};
use tokio::sync::{oneshot, watch};

const SITE: &str = "hall-r";
const CDU: &str = "cdu-1";
const READER: &str = "bms1";
/// The keyring's key for the reader, and one it does not hold.
const READER_SEED: [u8; 32] = [0x42; 32];
const FORGED_SEED: [u8; 32] = [0x24; 32];

fn id(s: &str) -> Ident {
    Ident::new(s).expect("an ident")
}

fn cdu_topic(family: Family) -> String {
    Topic::new(&id(SITE), Role::Cdu, &id(CDU), family).to_string()
}

fn reader_key(seed: [u8; 32]) -> SignKey {
    SignKey {
        node: NodeId::new(Role::Facility, READER).expect("an ident"),
        key_id: 1,
        key: SigningKey::from_bytes(&seed),
    }
}

/// The keyring the controller is given: the reader, who may resend.
fn readers() -> Vec<Signer> {
    vec![Signer {
        role: Role::Facility,
        name: Some(id(READER)),
        key_id: 1,
        key: SigningKey::from_bytes(&READER_SEED).verifying_key(),
        may: May {
            lease: false,
            release: false,
            resend: true,
        },
    }]
}

/// A running controller: its counters, its stop and its task.
struct Controller {
    stats: watch::Receiver<ShellStats>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), shell::ShellError>>,
}

/// A controller of `cdu` (served on Modbus TCP here) on `broker`, whose
/// keyring holds [`readers`].
async fn controller(broker: &Mosquitto, cdu: &loopwarden_twin::sim_cdu::SimCdu) -> Controller {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(cdu.clone().serve(listener));
    let port = ModbusCdu::new(RegisterMap::sim_cdu(), Link::Tcp(addr.into()))
        // The CDU is never silenced here: this only bounds how late an
        // answer from the simulated CDU on this runtime may come on a
        // loaded machine before a step goes without its measurements.
        .with_timeout(Duration::from_secs(5));
    let mut cfg = ShellConfig::new(id(SITE), id(CDU), broker.addr(), CoreConfig::default());
    cfg.period = Duration::from_millis(200);
    let (tx, stats) = shell::stats_channel();
    let opts = ShellOptions {
        stats: Some(tx),
        bus: shell::BusOptions {
            readers: readers(),
            ..Default::default()
        },
        ..Default::default()
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(shell::run_with(cfg, opts, port, async {
        let _ = stopped.await;
    }));
    Controller { stats, stop, task }
}

/// The reader's bus: a facility system, subscribed to nothing.
async fn reader_bus(broker: &Mosquitto) -> Bus {
    let node = NodeId::new(Role::Facility, READER).expect("an ident");
    let (bus, _rx, _task) = Bus::start(BusConfig::new(broker.addr(), id(SITE), node));
    assert!(
        bus.wait_connected(Duration::from_secs(5)).await,
        "the reader reaches mosquitto"
    );
    bus
}

fn decode(seen: &Seen) -> Frame {
    Frame::decode(&seen.payload).unwrap_or_else(|e| panic!("a frame on {}: {e:?}", seen.topic))
}

/// What `sub` sees on the `resent` topic up to the report answering
/// `request`: the frames resent before it, and the report (within 10 s).
fn answer(sub: &mut Subscriber, request: &Frame) -> (Vec<Seen>, ResendReport) {
    let resent = cdu_topic(Family::Resent);
    let answers = |s: &Seen| match decode(s).message {
        Message::ResendReport(r) => Some(r),
        _ => None,
    };
    let ours =
        |r: &ResendReport| r.correlation.seq == request.seq && r.correlation.from == request.sender;
    let seen = tokio::task::block_in_place(|| {
        sub.collect_until(Duration::from_secs(10), |seen| {
            seen.last()
                .is_some_and(|s| s.topic == resent && answers(s).is_some_and(|r| ours(&r)))
        })
    });
    let mut frames = Vec::new();
    for s in seen.into_iter().filter(|s| s.topic == resent) {
        match answers(&s) {
            Some(r) if ours(&r) => return (frames, r),
            Some(r) => panic!("a report of another request: {r:?}"),
            None => frames.push(s),
        }
    }
    panic!("no report for request {} within 10 s", request.seq)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_gets_logged_events_again_byte_for_byte_and_a_forged_request_nothing() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let (event, resent) = (cdu_topic(Family::Event), cdu_topic(Family::Resent));
    let port = broker.port();
    let mut sub = tokio::task::block_in_place(|| Subscriber::start(port, &[&event, &resent]))
        .expect("mosquitto_sub is installed");
    let cdu = steady_sim_cdu();
    let mut ctl = controller(&broker, &cdu).await;
    tokio::time::timeout(
        Duration::from_secs(15),
        ctl.stats.wait_for(|s| s.cdu_reads >= 2),
    )
    .await
    .expect("the controller reads its CDU")
    .expect("the controller runs");

    // A leak in rack 2: its events are logged and published.
    cdu.set_measurement("leak_inputs", 4.0).unwrap();
    let first = tokio::task::block_in_place(|| {
        sub.collect_until(Duration::from_secs(15), |seen| {
            seen.iter().any(|s| s.topic == event)
        })
    });
    // The leak's other events of the same step, if any, come right after.
    let more =
        tokio::task::block_in_place(|| sub.collect_until(Duration::from_millis(1500), |_| false));
    let events: Vec<Seen> = first
        .into_iter()
        .chain(more)
        .filter(|s| s.topic == event)
        .collect();
    assert!(!events.is_empty(), "the leak's event on {event}");
    let seqs: Vec<u32> = events.iter().map(|s| decode(s).seq).collect();
    for s in &events {
        let f = decode(s);
        assert!(matches!(f.message, Message::Event(_)), "{f:?}");
        assert_eq!(f.sender, NodeId::new(Role::Cdu, CDU).unwrap());
    }
    let (from, to) = (seqs[0], *seqs.last().unwrap());

    // The reader of the keyring asks for them again.
    let bus = reader_bus(&broker).await;
    let key = reader_key(READER_SEED);
    let request = resend::request(&bus, &key, Role::Cdu, &id(CDU), from, to).expect("sent");
    let (frames, report) = answer(&mut sub, &request);
    assert_eq!(report.code, ResendCode::Ok, "{report:?}");
    assert!(report.resent >= 1, "{report:?}");
    assert_eq!(report.resent as usize, frames.len(), "{report:?}");
    assert_eq!((report.from, report.to), (from, to));
    let payloads = |v: &[Seen]| v.iter().map(|s| s.payload.clone()).collect::<Vec<_>>();
    assert_eq!(
        payloads(&frames),
        payloads(&events),
        "the logged event frames {seqs:?} again, unchanged"
    );

    // A request signed with a key the keyring does not hold: refused,
    // and nothing resent.
    let forged = reader_key(FORGED_SEED);
    let request = resend::request(&bus, &forged, Role::Cdu, &id(CDU), from, to).expect("sent");
    let (frames, report) = answer(&mut sub, &request);
    assert_eq!(report.code, ResendCode::Unauthenticated, "{report:?}");
    assert_eq!(report.resent, 0, "{report:?}");
    assert!(frames.is_empty(), "no frame for a forged request");
    let quiet =
        tokio::task::block_in_place(|| sub.collect_until(Duration::from_millis(500), |_| false));
    assert!(
        quiet.iter().all(|s| s.topic != resent),
        "nothing more resent: {quiet:?}"
    );
    // The console and `/metrics` count both: one served with its frames,
    // one refused, none withheld.
    let want = ResendCounts {
        served: 1,
        refused: 1,
        withheld: 0,
        frames: events.len() as u64,
    };
    let counted = tokio::time::timeout(
        Duration::from_secs(5),
        ctl.stats
            .wait_for(|s| s.status.as_ref().is_some_and(|s| s.resend == want)),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    let last = ctl.stats.borrow().status.as_ref().map(|s| s.resend);
    assert!(counted, "resends counted {last:?}, not {want:?}");

    let _ = ctl.stop.send(());
    let stopped = tokio::time::timeout(Duration::from_secs(8), ctl.task)
        .await
        .expect("the controller stops");
    stopped.expect("no panic").expect("a clean stop");
    let _ = bus.shutdown(Duration::from_secs(1)).await;
}
