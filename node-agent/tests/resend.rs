//! A reader asks the host to resend its logged events, against a real
//! mosquitto: an operator of the demonstration keyring gets the event a
//! lease logged again on the host's `resent` topic, then a report; a
//! request signed with a key nobody holds gets a report that says
//! `unauthenticated`. The agent counts both, on its console (`ctl status`)
//! and on `/metrics`.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

#[path = "system/rig.rs"]
#[allow(dead_code)]
mod rig;

use std::net::SocketAddr;
use std::time::Duration;

use loopwarden_protocol::auth::SigningKey;
use loopwarden_protocol::{
    samples, CommandAuth, Family, Frame, GpuSelector, Ident, Message, NodeId, ResendCode,
    ResendReport, ResendRequest, Role, Topic,
};
use loopwarden_system_tests::prometheus::http_get;
use loopwarden_system_tests::{free_port, Subscriber};
use node_agent::config::Overrides;

use rig::{frame, now, Rig, SITE};

/// A request from operator `ops1` for `from..=to`, number `seq`, signed
/// with `key` (id 1) for the host's `resend` topic, published there.
fn ask(rig: &Rig, seq: u32, from: u32, to: u32, key: &SigningKey) -> Frame {
    let mut request = Frame {
        sender: NodeId::new(Role::Operator, "ops1").expect("node"),
        seq,
        time: now(),
        message: Message::ResendRequest(ResendRequest {
            from,
            to,
            auth: CommandAuth::default(),
        }),
    };
    let topic = Topic::new(
        &Ident::new(SITE).expect("ident"),
        Role::Host,
        &Ident::new(rig.host).expect("ident"),
        Family::Resend,
    );
    request.sign(&topic, 1, key).expect("signs");
    let mut buf = [0u8; 2048];
    let n = request.encode(&mut buf).expect("encodes");
    rig.publish(&rig.topic("resend"), &buf[..n], false);
    request
}

/// The report answering `request` on `sub`, and how many frames came on
/// the `resent` topic before it (within 10 s).
fn answer(rig: &Rig, sub: &mut Subscriber, request: &Frame) -> (usize, ResendReport) {
    let resent = rig.topic("resent");
    let report = |f: &Frame| match &f.message {
        Message::ResendReport(r) if r.correlation.seq == request.seq => Some(r.clone()),
        _ => None,
    };
    let seen = sub.collect_until(Duration::from_secs(10), |s| {
        s.last()
            .and_then(frame)
            .is_some_and(|f| report(&f).is_some())
    });
    let on_resent: Vec<Frame> = seen
        .iter()
        .filter(|s| s.topic == resent)
        .filter_map(frame)
        .collect();
    match on_resent.last().and_then(report) {
        Some(r) => (on_resent.len() - 1, r),
        None => panic!("no report for request {} within 10 s", request.seq),
    }
}

#[test]
fn resend_requests_are_answered_and_counted_on_the_console_and_metrics() {
    let Some(rig) = Rig::start("h41") else {
        return;
    };
    let mut acks = rig.subscribe(&["ack"]);
    let mut sub = rig.subscribe(&["event", "resent"]);
    let metrics: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let agent = rig
        .agent(2)
        .flags(Overrides {
            metrics_listen: Some(metrics.to_string()),
            ..Default::default()
        })
        .start();
    agent.ctl_within(&["status"], Duration::from_secs(20), "no console");

    // A lease logs an event (its caps applied) and publishes it.
    let cdu_a = NodeId::new(Role::Cdu, "cdu-a").expect("node");
    let lease = rig::lease_from(cdu_a, 1, 1, &[(GpuSelector::All, 400)], 60_000);
    rig.ack(&mut acks, &lease);
    let event = rig.topic("event");
    let seen = sub.collect_until(Duration::from_secs(10), |s| {
        s.iter().any(|x| x.topic == event)
    });
    let logged = seen
        .iter()
        .find(|s| s.topic == event)
        .and_then(frame)
        .expect("an event published");

    // An operator asks for it again: served, one frame.
    let request = ask(
        &rig,
        1,
        logged.seq,
        logged.seq,
        &samples::demo_signing_key(),
    );
    let (frames, report) = answer(&rig, &mut sub, &request);
    assert_eq!((report.code, report.resent, frames), (ResendCode::Ok, 1, 1));
    // A key nobody holds: refused, nothing resent.
    let stranger = SigningKey::from_bytes(&[0x66; 32]);
    let request = ask(&rig, 2, logged.seq, logged.seq, &stranger);
    let (frames, report) = answer(&rig, &mut sub, &request);
    assert_eq!((report.code, frames), (ResendCode::Unauthenticated, 0));

    let status = agent.ctl(&["status"]).expect("status");
    assert_eq!(
        status["resend"],
        serde_json::json!({"served": 1, "refused": 1, "withheld": 0, "frames": 1}),
        "{status}"
    );
    let text = agent.ctl_text(&["status"]);
    assert!(
        text.contains("1 served (1 frames), 1 refused, 0 withheld"),
        "{text}"
    );
    let (code, body) = http_get(metrics, "/metrics").expect("/metrics answers");
    assert_eq!(code, 200, "{body}");
    let host = r#"Hostname="h41""#;
    for line in [
        format!(r#"loopwarden_resend_requests_total{{{host},outcome="served"}} 1"#),
        format!(r#"loopwarden_resend_requests_total{{{host},outcome="refused"}} 1"#),
        format!(r#"loopwarden_resend_requests_total{{{host},outcome="withheld"}} 0"#),
        format!("loopwarden_resend_frames_total{{{host}}} 1"),
    ] {
        assert!(body.lines().any(|l| l == line), "{line} in\n{body}");
    }
    agent.stop();
}
