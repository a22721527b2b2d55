//! A flood of resend requests cannot make a host publish faster than its
//! budget (docs/bus.md §4.8: 100 frames at once, 10 a second after that,
//! reports included), against mosquitto and a real node agent.
//!
//! The host logs about 40 events (cap leases that change its limits),
//! then a reader with the right sends 40 signed requests at once, each
//! asking for every one of them. An independent subscriber
//! (`mosquitto_sub`) counts what comes on the host's `resent` topic: the
//! first request is served whole, the budget then runs out, and what
//! follows comes no faster than the refill.

use std::time::{Duration, Instant};

use loopwarden_bus::keys::SignKey;
use loopwarden_bus::resend::desk::{FRAMES_BURST, FRAMES_PER_SECOND};
use loopwarden_bus::{Bus, BusConfig};
use loopwarden_field::common::CommonFlags;
use loopwarden_protocol::{samples, Frame, Ident, Message, NodeId, ResendCode, Role};
use loopwarden_system_tests::twin_agent::{run_twin_agent, signed_lease};
use loopwarden_system_tests::{Mosquitto, Seen, Subscriber};

const SITE: &str = "t-limits";

fn ident(s: &str) -> Ident {
    Ident::new(s).unwrap()
}

/// The node agent `h1` on two twin GPUs (the twin's demonstration keyring:
/// facility systems may lease and ask for resends with the demonstration
/// key); stopped when the sender is dropped.
fn start_agent(broker: &Mosquitto, dir: &std::path::Path) -> tokio::sync::oneshot::Sender<()> {
    let flags = node_agent::config::Overrides {
        common: CommonFlags {
            site: Some(SITE.into()),
            broker: Some(broker.addr().to_string()),
            console: Some(dir.join("h1.sock")),
            ..Default::default()
        },
        host: Some("h1".into()),
        twin_gpus: Some(2),
        period_ms: Some(500),
        ..Default::default()
    };
    run_twin_agent(&flags, 2, 5)
}

fn frames(seen: &[Seen]) -> Vec<Frame> {
    seen.iter()
        .filter_map(|s| Frame::decode(&s.payload).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_requests_gets_no_more_than_the_hosts_budget() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let events = format!("dc/v2/{SITE}/host/h1/event");
    let resent = format!("dc/v2/{SITE}/host/h1/resent");
    let Some(mut sub) = Subscriber::start(broker.port(), &[&events]) else {
        return;
    };
    let mut answers = Subscriber::start(broker.port(), &[&resent]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let _agent = start_agent(&broker, dir.path());
    let node = NodeId::new(Role::Facility, "ems1").unwrap();
    let (bus, _inbound, _task) =
        Bus::start(BusConfig::new(broker.addr(), ident(SITE), node.clone()));
    assert!(bus.wait_connected(Duration::from_secs(20)).await);
    let key = SignKey {
        node,
        key_id: 1,
        key: samples::demo_signing_key(),
    };
    // Leases until the host has logged 40 events.
    let mut logged = Vec::new();
    for n in 0..200 {
        let watts = if n % 2 == 0 { 500 } else { 550 };
        signed_lease(&bus, &key, &ident(SITE), &ident("h1"), watts);
        let seen = sub.collect_until(Duration::from_millis(200), |s| !s.is_empty());
        logged.extend(frames(&seen).into_iter().map(|f| f.seq));
        if logged.len() >= 40 {
            break;
        }
    }
    assert!(
        logged.len() >= 40,
        "the leases made {} events",
        logged.len()
    );
    let (from, to) = (logged[0], logged[0] + 999_999);

    let began = Instant::now();
    let mut asked = Vec::new();
    for _ in 0..40 {
        let request =
            loopwarden_bus::resend::request(&bus, &key, Role::Host, &ident("h1"), from, to)
                .unwrap();
        asked.push(request.seq);
    }
    let came = frames(&answers.collect_until(Duration::from_secs(4), |_| false));
    let elapsed = began.elapsed().as_secs_f64();
    let reports: Vec<_> = came
        .iter()
        .filter_map(|f| match &f.message {
            Message::ResendReport(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    let events_resent = came.len() - reports.len();
    eprintln!(
        "{} frames on resent in {elapsed:.1} s: {events_resent} events, {} reports {:?}",
        came.len(),
        reports.len(),
        reports
            .iter()
            .map(|r| (r.code, r.resent))
            .collect::<Vec<_>>()
    );
    let first = reports
        .iter()
        .find(|r| r.correlation.seq == asked[0])
        .expect("the first request was answered");
    assert_eq!(first.code, ResendCode::Ok, "{first:?}");
    assert!(first.resent as usize >= logged.len(), "{first:?}");
    let allowed = f64::from(FRAMES_BURST) + f64::from(FRAMES_PER_SECOND) * (elapsed + 1.0);
    assert!(
        (came.len() as f64) <= allowed,
        "{} frames in {elapsed:.1} s: more than the budget's {allowed:.0}",
        came.len()
    );
    assert!(
        reports.len() < asked.len(),
        "every request answered: no budget held them back"
    );
    assert!(
        reports.iter().any(|r| r.code == ResendCode::Limited),
        "the budget stopped one part way: {reports:?}"
    );
}
