//! `cooling-ctrl gateway` as a process, against a real mosquitto on a
//! free loopback port. A scripted microcontroller (this test, speaking
//! `loopwarden-link` frames on a TCP port the gateway connects to, as it
//! connects to QEMU's UART) says hello, its status, an event and a cap
//! lease: the bus shows the state signed with the demonstration key, the
//! telemetry, the event and the lease on the host's `cmd` topic. Host
//! telemetry published on the bus reaches the microcontroller as
//! `Down::Host`, and `Down::Alive` comes every second with the layout the
//! gateway maps host ids by. A corrupt frame is
//! counted in `/metrics` and never published. Then the microcontroller
//! goes silent, and within 5 s the bus shows the retained state in
//! `failsafe`, reason `controller-silent`, with the racks it last said.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

mod gateway_mcu;

use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::time::{Duration, Instant};

use gateway_mcu::{config, spawn, status, topic, Mcu, CDU, HOST_5, SITE};
use loopwarden_link::{CduLayout, Down, Up};
use loopwarden_protocol::message::{CduMode, Event, Pump, RackCooling};
use loopwarden_protocol::{samples, Family, Frame, Message, NodeId, ReasonCode, Role, Topic};
use loopwarden_system_tests::prometheus::http_get;
use loopwarden_system_tests::{free_port, publish_raw, Mosquitto, Seen, Subscriber};

/// The layout of the gateway's configuration (the reference hall's:
/// hosts `r{rack}h{host}`, four a rack).
const LAYOUT: CduLayout = CduLayout {
    racks: 4,
    hosts_per_rack: 4,
    gpus_per_host: 8,
};

fn decode(s: &Seen) -> Frame {
    Frame::decode(&s.payload).unwrap_or_else(|e| panic!("a frame on {}: {e:?}", s.topic))
}

/// Reads `sub` until `want` has seen what it waits for, sending a status
/// every 300 ms (a live MCU speaks every step); panics after `within`.
fn until(
    sub: &mut Subscriber,
    mcu: &mut Mcu,
    within: Duration,
    what: &str,
    mut want: impl FnMut(&Seen) -> bool,
) {
    let deadline = Instant::now() + within;
    let mut step = 100;
    while Instant::now() < deadline {
        mcu.send(&status(step, 32.0));
        step += 1;
        let tick = Instant::now() + Duration::from_millis(300);
        while let Some(left) = tick.checked_duration_since(Instant::now()) {
            match sub.next(left) {
                Some(s) if want(&s) => return,
                Some(_) => {}
                None => break,
            }
        }
    }
    panic!("{what}: not seen within {within:?}");
}

/// A host's telemetry frame as host `host` publishes it.
fn host_report(host: &str, seq: u32) -> Vec<u8> {
    Frame {
        sender: NodeId::new(Role::Host, host).unwrap(),
        seq,
        time: loopwarden_bus::now_ms(),
        message: Message::HostTelemetry(samples::host_telemetry(8)),
    }
    .to_vec()
    .unwrap()
}

/// The sum of a metric's samples in a `/metrics` text.
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Scrapes `/metrics` at `addr` until `done` holds of its text (the
/// gateway reports its counts four times a second), for up to 5 s.
fn scrape_until(addr: SocketAddr, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (code, text) = http_get(addr, "/metrics").expect("/metrics answers");
        assert_eq!(code, 200);
        if done(&text) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "/metrics never showed it:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_gateway_carries_the_mcu_to_the_bus_and_back_and_says_when_it_falls_silent() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let metrics: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let state_topic = topic(Role::Cdu, CDU, Family::Health);
    let mut sub =
        Subscriber::start(broker.port(), &[&format!("dc/v2/{SITE}/#")]).expect("mosquitto_sub");
    let config = config(
        dir.path(),
        &broker,
        &format!("metrics_listen = \"{metrics}\"\n"),
    );
    let mut gateway = spawn(&config, listener.local_addr().unwrap());
    let mut mcu = Mcu::accept(&listener);

    // Hello, then statuses until the bus has the signed state.
    mcu.hello();
    let demo = samples::demo_signing_key().verifying_key();
    let cdu_node = NodeId::new(Role::Cdu, CDU).unwrap();
    until(
        &mut sub,
        &mut mcu,
        Duration::from_secs(20),
        "the CDU state",
        |s| {
            if s.topic != state_topic {
                return false;
            }
            let f = decode(s);
            let Message::CduState(st) = &f.message else {
                return false;
            };
            assert_eq!((st.mode, st.reason), (CduMode::Normal, ReasonCode::OK));
            assert_eq!(st.racks[1].cooling, RackCooling::Lost);
            assert_eq!(st.racks[0].cooling, RackCooling::Normal);
            let t = Topic::parse(&s.topic).unwrap();
            f.verify(&t, |n, k| (n == &cdu_node && k == 1).then_some(&demo))
                .expect("the state verifies with the demonstration key");
            true
        },
    );
    let telemetry = topic(Role::Cdu, CDU, Family::Telemetry);
    until(
        &mut sub,
        &mut mcu,
        Duration::from_secs(5),
        "the CDU telemetry",
        |s| {
            s.topic == telemetry
                && matches!(decode(s).message, Message::CduTelemetry(t) if t.setpoint.value() == 32.0)
        },
    );

    // An event, and a lease for host 5.
    mcu.send(&Up::Event(Event::PumpTrip {
        pump: Pump::A,
        lag_started: true,
    }));
    let events = topic(Role::Cdu, CDU, Family::Event);
    until(
        &mut sub,
        &mut mcu,
        Duration::from_secs(10),
        "the event",
        |s| {
            s.topic == events
                && matches!(
                    decode(s).message,
                    Message::Event(Event::PumpTrip { pump: Pump::A, .. })
                )
        },
    );
    let Message::CapLease(lease) = samples::message(loopwarden_protocol::MessageKind::CapLease)
    else {
        unreachable!()
    };
    mcu.send(&Up::Lease {
        host: 5,
        lease: lease.clone(),
        lift: false,
    });
    let cmd = topic(Role::Host, HOST_5, Family::Cmd);
    until(
        &mut sub,
        &mut mcu,
        Duration::from_secs(10),
        "the lease",
        |s| {
            if s.topic != cmd {
                return false;
            }
            let f = decode(s);
            let Message::CapLease(l) = &f.message else {
                return false;
            };
            assert_eq!((l.lease, &l.caps), (lease.lease, &lease.caps));
            f.verify(&Topic::parse(&s.topic).unwrap(), |n, k| {
                (n == &cdu_node && k == 1).then_some(&demo)
            })
            .expect("the lease verifies for its host's cmd topic");
            true
        },
    );

    // Host telemetry on the bus comes down to the MCU with the host's
    // index; the gateway says it is alive, with the broker connected.
    let host_topic = topic(Role::Host, HOST_5, Family::Telemetry);
    let mut heard_host = None;
    let mut alive = false;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut n = 0;
    while (heard_host.is_none() || !alive) && Instant::now() < deadline {
        publish_raw(broker.port(), &host_topic, &host_report(HOST_5, n), false);
        n += 1;
        for (_, d) in mcu.downs(Duration::from_millis(400)) {
            match d {
                Down::Host {
                    index, telemetry, ..
                } => heard_host = Some((index, telemetry.gpus.len())),
                Down::Alive { bus, layout, .. } => {
                    assert_eq!(layout, LAYOUT, "the layout the gateway maps host ids by");
                    alive |= bus
                }
                _ => {}
            }
        }
    }
    assert_eq!(heard_host, Some((5, 8)), "host 5's report, as Down::Host");
    assert!(
        alive,
        "Down::Alive with the broker connected and the gateway's layout"
    );

    // A corrupt frame is dropped and counted; the next is read.
    mcu.send_corrupt(&status(900, 44.0));
    mcu.send(&status(901, 33.0));
    until(
        &mut sub,
        &mut mcu,
        Duration::from_secs(5),
        "the status after the corrupt one",
        |s| {
            if s.topic != telemetry {
                return false;
            }
            let Message::CduTelemetry(t) = decode(s).message else {
                return false;
            };
            assert_ne!(t.setpoint.value(), 44.0, "the corrupt frame was published");
            t.setpoint.value() == 33.0
        },
    );
    let text = scrape_until(metrics, |t| {
        metric_sum(t, "loopwarden_gateway_link_frames_dropped_total") == 1.0
    });
    assert!(metric_sum(&text, "loopwarden_gateway_link_frames_total") > 5.0);

    // Silence: the bus hears failsafe, controller-silent, within 5 s.
    let quiet = Instant::now();
    let mut silent = None;
    while silent.is_none() && quiet.elapsed() < Duration::from_secs(8) {
        let Some(s) = sub.next(Duration::from_millis(200)) else {
            continue;
        };
        if s.topic != state_topic {
            continue;
        }
        if let Message::CduState(st) = decode(&s).message {
            if st.reason == ReasonCode::CONTROLLER_SILENT {
                silent = Some((quiet.elapsed(), st));
            }
        }
    }
    let (after, st) = silent.expect("a controller-silent state");
    assert!(after < Duration::from_secs(5), "said after {after:?}");
    assert_eq!(st.mode, CduMode::Failsafe);
    assert_eq!(
        st.racks[1].cooling,
        RackCooling::Lost,
        "the racks last heard"
    );
    scrape_until(metrics, |t| {
        metric_sum(t, "loopwarden_gateway_mcu_silent") == 1.0
    });

    // SIGTERM: a clean stop.
    let _ = Command::new("kill")
        .args(["-TERM", &gateway.0.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    let code = loop {
        if let Some(s) = gateway.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the gateway did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(code.success(), "{code}");
}
