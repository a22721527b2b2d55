//! `cooling-ctrl gateway` in a hall of several CDUs, as a process against
//! a real mosquitto, with a scripted microcontroller (as in
//! `gateway.rs`). The MCU's `Up::Offer` appears in the CDU's retained
//! state on the bus, and in its JSON mirror, as `run` publishes its
//! offer; the hall's coordinator's plan, published on the bus, reaches
//! the MCU as `Down::FacilityTarget`. And when the gateway's own CDU is
//! the coordinator, it plans from its MCU's offer and another CDU's, and
//! publishes the plan and sends its water down. A plan heard while the
//! line to the MCU is down is not counted as forwarded, and goes down
//! when the line opens again.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

mod gateway_mcu;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::{Duration, Instant};

use gateway_mcu::{config, spawn, status, topic, Mcu, Running, CDU, SITE};
use loopwarden_link::{Down, Up};
use loopwarden_protocol::message::OfferStep;
use loopwarden_protocol::message::{CduState, FacilityOffer, FacilityPlan, FacilityState};
use loopwarden_protocol::units::{Celsius, Watts};
use loopwarden_protocol::{samples, Family, Frame, Message, MessageKind, NodeId, Role};
use loopwarden_system_tests::prometheus::http_get;
use loopwarden_system_tests::{free_port, publish_raw, retained, Mosquitto, Seen, Subscriber};

/// The MCU's offer: 31.5 °C uncapped, one capped step.
fn offer() -> FacilityOffer {
    FacilityOffer {
        accept: Celsius::new(31.5).unwrap(),
        heat: Watts(118_000),
        at_water: Celsius::new(31.5).unwrap(),
        heat_per_k: Watts(210),
        work_centigpus: 12_800,
        capped: [OfferStep {
            water: Celsius::new(32.5).unwrap(),
            work_lost_centigpus: 40,
            power_saved: Watts(400),
        }]
        .into_iter()
        .collect(),
    }
}

/// The gateway of `CDU` in a hall of two CDUs coordinated by
/// `coordinator`, with `extra` config lines; the MCU said hello on the
/// port of the listener returned.
fn start(
    broker: &Mosquitto,
    dir: &Path,
    coordinator: &str,
    extra: &str,
) -> (Running, Mcu, TcpListener) {
    let figures = dir.join("site.toml");
    std::fs::write(&figures, "cdus = 2\n").unwrap();
    let lines =
        format!("site_figures = {figures:?}\nfacility_coordinator = \"{coordinator}\"\n{extra}");
    let config = config(dir, broker, &lines);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let gateway = spawn(&config, listener.local_addr().unwrap());
    let mut mcu = Mcu::accept(&listener);
    mcu.hello();
    (gateway, mcu, listener)
}

/// This CDU's state in `s`, if that is what it is.
fn own_state(s: &Seen) -> Option<CduState> {
    if s.topic != topic(Role::Cdu, CDU, Family::Health) {
        return None;
    }
    match Frame::decode(&s.payload).ok()?.message {
        Message::CduState(st) => Some(st),
        _ => None,
    }
}

/// Sends a status every 300 ms (a live MCU speaks every step) until the
/// bus shows this CDU's state of which `want` holds; the downs heard
/// meanwhile. Panics after `within`.
fn state_until(
    sub: &mut Subscriber,
    mcu: &mut Mcu,
    within: Duration,
    what: &str,
    want: impl Fn(&CduState) -> bool,
) -> (CduState, Vec<Down>) {
    let deadline = Instant::now() + within;
    let mut downs = Vec::new();
    let mut step = 10;
    while Instant::now() < deadline {
        mcu.send(&status(step, 32.0));
        step += 1;
        downs.extend(
            mcu.downs(Duration::from_millis(50))
                .into_iter()
                .map(|(_, d)| d),
        );
        let tick = Instant::now() + Duration::from_millis(250);
        while let Some(left) = tick.checked_duration_since(Instant::now()) {
            match sub.next(left).as_ref().map(own_state) {
                Some(Some(st)) if want(&st) => return (st, downs),
                Some(_) => {}
                None => break,
            }
        }
    }
    panic!("{what}: not seen within {within:?}");
}

/// CDU `cdu`'s retained state with its part in the hall `facility`, as
/// its controller publishes it.
fn publish_state(broker: &Mosquitto, cdu: &str, facility: FacilityState, seq: u32) {
    let Message::CduState(mut st) = samples::message(MessageKind::CduState) else {
        unreachable!("a sample state")
    };
    st.facility = Some(facility);
    let frame = Frame {
        sender: NodeId::new(Role::Cdu, cdu).unwrap(),
        seq,
        time: loopwarden_bus::now_ms(),
        message: Message::CduState(st),
    };
    let t = topic(Role::Cdu, cdu, Family::Health);
    publish_raw(broker.port(), &t, &frame.to_vec().unwrap(), true).expect("mosquitto_pub");
}

/// The facility water the MCU is sent within `within`, statuses going up
/// meanwhile.
fn target_within(mcu: &mut Mcu, within: Duration) -> Option<f32> {
    let deadline = Instant::now() + within;
    let mut step = 500;
    while Instant::now() < deadline {
        mcu.send(&status(step, 32.0));
        step += 1;
        for (_, d) in mcu.downs(Duration::from_millis(300)) {
            if let Down::FacilityTarget(w) = d {
                return Some(w);
            }
        }
    }
    None
}

#[test]
fn the_mcus_offer_is_in_its_retained_state_and_the_coordinators_plan_comes_down() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut sub =
        Subscriber::start(broker.port(), &[&format!("dc/v2/{SITE}/#")]).expect("mosquitto_sub");
    let (_gateway, mut mcu, _mcu_port) = start(&broker, dir.path(), "cdu-0", "");

    // Before any offer the state says none; then the MCU's offer is in
    // the retained state, as it sent it.
    let (first, _) = state_until(
        &mut sub,
        &mut mcu,
        Duration::from_secs(20),
        "a state",
        |_| true,
    );
    let none = FacilityState {
        offer: None,
        plan: None,
    };
    assert_eq!(first.facility, Some(none), "a hall's CDU with no offer yet");
    mcu.send(&Up::Offer(Some(offer())));
    let (st, _) = state_until(
        &mut sub,
        &mut mcu,
        Duration::from_secs(5),
        "the offer in the state",
        |st| st.facility.as_ref().is_some_and(|f| f.offer.is_some()),
    );
    let f = st.facility.expect("its part in the hall");
    assert_eq!(f.offer, Some(offer()), "the offer as the MCU sent it");
    assert_eq!(f.plan, None, "cdu-0 plans, not this CDU");

    // Retained, in the binary state and its JSON mirror, for the
    // coordinator and the BMS.
    let port = broker.port();
    let states = retained(
        port,
        &[
            &topic(Role::Cdu, CDU, Family::Health),
            &format!("dc/v2/{SITE}/json/cdu/{CDU}/health"),
        ],
        Duration::from_secs(2),
    )
    .expect("mosquitto_sub is installed");
    assert!(
        states
            .iter()
            .filter_map(own_state)
            .any(|st| st.facility.is_some_and(|f| f.offer == Some(offer()))),
        "the retained state carries the offer"
    );
    let json = states
        .iter()
        .find(|s| s.topic.contains("/json/"))
        .expect("the JSON mirror, retained");
    let v: serde_json::Value = serde_json::from_slice(&json.payload).expect("JSON");
    let o = &v["body"]["facility"]["offer"];
    assert_eq!(o["accept"].as_f64(), Some(31.5), "{v}");
    assert_eq!(o["heat"].as_f64(), Some(118_000.0), "{v}");

    // The coordinator's plan on the bus comes down to the MCU.
    let plan = FacilityPlan {
        water: Celsius::new(29.75).unwrap(),
        chiller_stages: 1,
        offers: 2,
        capping: 0,
    };
    let planned = FacilityState {
        offer: None,
        plan: Some(plan),
    };
    publish_state(&broker, "cdu-0", planned, 1);
    let water = target_within(&mut mcu, Duration::from_secs(10));
    assert_eq!(
        water,
        Some(29.75),
        "Down::FacilityTarget with the plan's water"
    );
}

#[test]
fn a_gateway_whose_cdu_coordinates_plans_from_its_mcus_offer_and_sends_its_water_down() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut sub =
        Subscriber::start(broker.port(), &[&format!("dc/v2/{SITE}/#")]).expect("mosquitto_sub");
    let cdus = format!("facility_cdus = [\"{CDU}\", \"cdu-2\"]\n");
    let (_gateway, mut mcu, _mcu_port) = start(&broker, dir.path(), CDU, &cdus);
    let theirs = FacilityState {
        offer: Some(FacilityOffer {
            accept: Celsius::new(30.0).unwrap(),
            ..offer()
        }),
        plan: None,
    };
    publish_state(&broker, "cdu-2", theirs, 1);
    mcu.send(&Up::Offer(Some(offer())));
    let (st, mut downs) = state_until(
        &mut sub,
        &mut mcu,
        Duration::from_secs(20),
        "a plan from both offers",
        |st| {
            let plan = st.facility.as_ref().and_then(|f| f.plan);
            plan.is_some_and(|p| p.offers == 2)
        },
    );
    let f = st.facility.expect("its part in the hall");
    assert_eq!(f.offer, Some(offer()), "its own offer beside the plan");
    let water = f.plan.expect("the plan").water.value() as f32;
    // The water goes down with the state that carries its plan.
    downs.extend(
        mcu.downs(Duration::from_secs(1))
            .into_iter()
            .map(|(_, d)| d),
    );
    let sent = downs.iter().rev().find_map(|d| match d {
        Down::FacilityTarget(w) => Some(*w),
        _ => None,
    });
    assert_eq!(sent, Some(water), "its own plan's water, down to its MCU");
}

/// The sum of metric `name`'s samples at `addr`'s `/metrics` once `done`
/// holds of it; panics after 5 s.
fn metric_when(addr: SocketAddr, name: &str, done: impl Fn(f64) -> bool) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, text) = http_get(addr, "/metrics").expect("/metrics answers");
        let sum = text
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        if done(sum) {
            return sum;
        }
        assert!(Instant::now() < deadline, "{name} stays {sum}:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn water_planned_while_the_line_is_down_is_not_counted_and_goes_down_when_it_opens() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let metrics: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let extra = format!("metrics_listen = \"{metrics}\"\n");
    let (_gateway, mut mcu, listener) = start(&broker, dir.path(), "cdu-0", &extra);
    mcu.send(&status(1, 32.0));
    mcu.downs(Duration::from_millis(500));
    metric_when(metrics, "loopwarden_gateway_link_open", |v| v == 1.0);

    // The MCU's line goes down (a serial server restarting): the gateway
    // cannot open it again meanwhile.
    let at = listener.local_addr().unwrap();
    drop((mcu, listener));
    metric_when(metrics, "loopwarden_gateway_link_open", |v| v == 0.0);
    let plan = FacilityPlan {
        water: Celsius::new(29.75).unwrap(),
        chiller_stages: 1,
        offers: 2,
        capping: 0,
    };
    let planned = FacilityState {
        offer: None,
        plan: Some(plan),
    };
    publish_state(&broker, "cdu-0", planned, 1);
    // Heard on the bus, not handed to a closed line: not counted.
    std::thread::sleep(Duration::from_secs(2));
    let forwarded = "loopwarden_gateway_facility_targets_forwarded_total";
    assert_eq!(metric_when(metrics, forwarded, |_| true), 0.0);

    // The line opens again (the MCU did not restart: no hello); the
    // water in force goes down at once.
    let listener = TcpListener::bind(at).expect("the MCU's port again");
    let mut mcu = Mcu::accept(&listener);
    // Nothing sent up: frames numbered from 0 again would be a restart,
    // which sends the water down too.
    let water = mcu
        .downs(Duration::from_secs(3))
        .into_iter()
        .find_map(|(_, d)| match d {
            Down::FacilityTarget(w) => Some(w),
            _ => None,
        });
    assert_eq!(water, Some(29.75), "the plan heard meanwhile, on reopening");
    metric_when(metrics, forwarded, |v| v == 1.0);
}
