//! The controller's real-time shell against a real mosquitto on a free
//! loopback port and the simulated CDU served on Modbus TCP: it writes
//! its settings into the CDU, publishes telemetry and a retained state,
//! caps hot hosts with signed leases, counts their acks, and closes a
//! leaking rack's valve within a period.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

// The shared rig's Modbus CDU and retained reads are not used here: this
// file serves a CDU whose registers its tests set.
#[allow(dead_code)]
mod shell_rig;

use std::time::{Duration, Instant};

use cooling_core::CoreConfig;
use cooling_ctrl::journal::ControllerFlash;
use cooling_ctrl::modbus::{Link, ModbusCdu};
use cooling_ctrl::northbound::{self, NorthboundWrite};
use cooling_ctrl::shell::{self, ShellConfig, ShellOptions, ShellStats};
use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_bus::{now_ms, BrokerAddr, Bus, BusConfig, Inbound};
use loopwarden_protocol::auth::SigningKey;
use loopwarden_protocol::message::{
    Ack, AckCode, CapSource, CduMode, Correlation, GpuCap, GpuSelector, HostTelemetry, RackCooling,
};
use loopwarden_protocol::units::{Watts, WholeCelsius};
use loopwarden_protocol::{samples, Family, Frame, Ident, Message, NodeId, Role, Text, Topic};
use loopwarden_twin::sim_cdu::SimCdu;
use tokio::sync::mpsc;

const SITE: &str = "hall-t";
const CDU: &str = "cdu-1";
const KEY_ID: u8 = 3;
const SEED: [u8; 32] = *b"shell test sign key, 32 bytes..!";

fn key() -> SigningKey {
    SigningKey::from_bytes(&SEED)
}
const PERIOD: Duration = Duration::from_millis(200);

use loopwarden_system_tests::Mosquitto;
use shell_rig::{id, Running};

// ---- the rig: broker, simulated CDU, shell, and a probe on the bus.

fn host_ids() -> Vec<Ident> {
    (0..16).map(|i| id(&format!("h{i:02}"))).collect()
}

/// A CDU at full flow whose supply sits well above the boot setpoint.
use loopwarden_system_tests::steady_sim_cdu as sim_cdu;

struct Rig {
    broker: Mosquitto,
    cdu: SimCdu,
    shell: Running,
}

impl Rig {
    async fn start() -> Option<Rig> {
        Self::start_with(CoreConfig::default()).await
    }

    async fn start_with(core: CoreConfig) -> Option<Rig> {
        Self::start_full(core, None).await
    }

    async fn start_full(core: CoreConfig, board: Option<Box<dyn shell::BoardIo>>) -> Option<Rig> {
        let broker = Mosquitto::start()?;
        Some(Self::start_on(broker, core, board, None).await)
    }

    /// The shell on `broker`, with the controller's flash when given.
    async fn start_on(
        broker: Mosquitto,
        core: CoreConfig,
        board: Option<Box<dyn shell::BoardIo>>,
        flash: Option<ControllerFlash>,
    ) -> Rig {
        Self::start_prepared(broker, core, board, flash, |_| {}).await
    }

    /// As [`Rig::start_on`], the CDU's registers set by `prepare` first.
    async fn start_prepared(
        broker: Mosquitto,
        core: CoreConfig,
        board: Option<Box<dyn shell::BoardIo>>,
        flash: Option<ControllerFlash>,
        prepare: impl FnOnce(&SimCdu),
    ) -> Rig {
        Self::start_linked(broker, core, board, flash, prepare, None).await
    }

    /// As [`Rig::start_prepared`], with the northbound server's link.
    async fn start_linked(
        broker: Mosquitto,
        core: CoreConfig,
        board: Option<Box<dyn shell::BoardIo>>,
        flash: Option<ControllerFlash>,
        prepare: impl FnOnce(&SimCdu),
        northbound: Option<shell::NorthboundLink>,
    ) -> Rig {
        let cdu = sim_cdu();
        prepare(&cdu);
        Self::start_cdu(broker, core, board, flash, northbound, cdu, Duration::ZERO).await
    }

    /// The shell on `broker` driving `cdu`, which answers nothing for
    /// its first `silent` (connections are taken, requests not answered).
    async fn start_cdu(
        broker: Mosquitto,
        core: CoreConfig,
        board: Option<Box<dyn shell::BoardIo>>,
        flash: Option<ControllerFlash>,
        northbound: Option<shell::NorthboundLink>,
        cdu: SimCdu,
        silent: Duration,
    ) -> Rig {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let served = cdu.clone();
        tokio::spawn(async move {
            tokio::time::sleep(silent).await;
            served.serve(listener).await
        });
        let port = ModbusCdu::new(RegisterMap::sim_cdu(), Link::Tcp(addr.into()))
            .with_timeout(Duration::from_millis(300));
        let mut cfg = ShellConfig::new(id(SITE), id(CDU), broker.addr(), core);
        cfg.period = PERIOD;
        cfg.hosts = host_ids();
        cfg.key_id = KEY_ID;
        cfg.key = Some(key());
        let opts = ShellOptions {
            bus: shell::BusOptions {
                flash,
                ..Default::default()
            },
            board,
            northbound,
            ..Default::default()
        };
        Rig {
            broker,
            cdu,
            shell: Running::start(cfg, opts, port),
        }
    }

    /// A bus client (an operator node) subscribed to `filters`.
    async fn probe(&self, name: &str, filters: &[String]) -> (Bus, mpsc::Receiver<Inbound>) {
        let node = NodeId::new(Role::Operator, name).expect("an ident");
        let mut config = BusConfig::new(self.broker.addr(), id(SITE), node);
        config.subscriptions = filters.to_vec();
        config.inbound_capacity = 1024;
        let (bus, rx, _task) = Bus::start(config);
        assert!(
            bus.wait_connected(Duration::from_secs(5)).await,
            "the probe reaches mosquitto"
        );
        (bus, rx)
    }

    /// Waits for the shell's stats to satisfy `f`: at most 15 s (a step
    /// against a silent CDU waits out a read and its writes, each up to
    /// the Modbus timeout, and a loaded machine stretches that).
    async fn wait_stats(&mut self, what: &str, f: impl FnMut(&ShellStats) -> bool) -> ShellStats {
        self.shell.wait(Duration::from_secs(15), what, f).await
    }

    async fn stop(self) {
        self.stop_keeping_broker().await;
    }

    /// Stops the shell; the broker goes on.
    async fn stop_keeping_broker(self) -> Mosquitto {
        self.shell.stop().await;
        self.broker
    }
}

fn cdu_topic(family: Family) -> String {
    Topic::new(&id(SITE), Role::Cdu, &id(CDU), family).to_string()
}

/// The first message on `rx` for which `f` says something, within `within`.
async fn first<T>(
    rx: &mut mpsc::Receiver<Inbound>,
    within: Duration,
    what: &str,
    mut f: impl FnMut(&Inbound) -> Option<T>,
) -> T {
    let found = tokio::time::timeout(within, async {
        while let Some(m) = rx.recv().await {
            if let Some(t) = f(&m) {
                return Some(t);
            }
        }
        None
    })
    .await;
    match found {
        Ok(Some(t)) => t,
        _ => panic!("{what}: not seen within {within:?}"),
    }
}

/// An 8-GPU host at 650 W per GPU whose hottest GPU is at `hottest` °C.
fn hot_host(hottest: u8) -> HostTelemetry {
    let mut t = samples::host_telemetry(8);
    for (i, g) in t.gpus.iter_mut().enumerate() {
        g.temp = WholeCelsius(if i == 3 { hottest } else { hottest - 4 });
        g.power = Watts(650);
        g.power_limit = Watts(700);
    }
    t
}

// ---- the tests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boots_writes_the_cdu_and_publishes_telemetry_and_a_retained_state() {
    let Some(mut rig) = Rig::start().await else {
        return;
    };
    // Booting: the conservative setpoint and full speed go to the CDU.
    rig.wait_stats("two steps with the CDU answering", |s| s.cdu_reads >= 2)
        .await;
    assert_eq!(rig.cdu.setting("supply_setpoint").unwrap(), 25.0);
    assert_eq!(rig.cdu.setting("pump_speed").unwrap(), 100.0);
    assert_eq!(rig.cdu.setting("lead_pump").unwrap(), 0.0);
    assert_eq!(rig.cdu.setting("valves_open").unwrap(), 15.0);
    let s = rig
        .wait_stats("a state published", |s| s.states_published >= 1)
        .await;
    assert_eq!(s.cdu_read_errors, 0);
    assert_eq!(s.cdu_write_errors, 0);

    // Subscribing after the state went out: it is retained.
    let (probe, mut rx) = rig
        .probe(
            "probe1",
            &[cdu_topic(Family::Health), cdu_topic(Family::Telemetry)],
        )
        .await;
    let state = first(
        &mut rx,
        Duration::from_secs(3),
        "the retained CduState",
        |m| match &m.frame.message {
            Message::CduState(st) => Some(st.clone()),
            _ => None,
        },
    )
    .await;
    assert_eq!(state.mode, CduMode::Boot);
    assert_eq!(state.setpoint.value(), 25.0);
    assert_eq!(state.supply.map(|c| c.value()), Some(40.0));
    assert_eq!(state.racks.len(), 4);
    assert!(state.racks.iter().all(|r| r.cooling == RackCooling::Normal));
    let tel = first(
        &mut rx,
        Duration::from_secs(3),
        "CduTelemetry",
        |m| match &m.frame.message {
            Message::CduTelemetry(t) => Some(t.clone()),
            _ => None,
        },
    )
    .await;
    assert_eq!(tel.supply.map(|c| c.value()), Some(40.0));
    assert_eq!(tel.return_temp.map(|c| c.value()), Some(49.3));
    assert_eq!(tel.flow.map(|f| f.value()), Some(192.0));
    assert_eq!(tel.it_power, Some(Watts(120_000)));
    assert_eq!(tel.facility_power, Some(Watts(135_000)));
    assert_eq!(tel.pue.map(|p| p.value()), Some(1.125));
    assert!(tel.pump_a.running && !tel.pump_b.running);
    assert_eq!(tel.racks.len(), 4);
    assert!(tel.diff_pressure.is_none());
    // The CDU's outdoor sensor, not a configured value.
    assert_eq!(tel.ambient.map(|c| c.value()), Some(20.0));
    // Nothing learned yet: every figure as configured, no host learned
    // from, the outdoor temperature measured.
    let learned = tel.learned.expect("what the controller learned");
    assert!(!learned.outdoor_fallback, "{learned:?}");
    assert_eq!(learned.dry_cooler_ua.ratio_permille, 1000);
    assert_eq!(learned.host_factor_max_host, None);
    assert_eq!(learned.flow_per_gpu_full_lpm.value(), 1.5);
    let _ = probe.shutdown(Duration::from_secs(1)).await;
    rig.stop().await;
}

/// What the core learned survives a restart: the shell restores it from
/// the flash at start (a part it cannot read starts as configured), its
/// telemetry says so, and a clean stop keeps it in flash again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learned_figures_are_restored_from_flash_at_start_and_kept_at_a_clean_stop() {
    use cooling_core::estimate::Scalar;
    use cooling_core::Learned;
    use cooling_ctrl::journal::{save_learned, LEARNED_KEYS};
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cdu.flash");
    let cfg = CoreConfig::default();
    let mut l = Learned::new(&cfg);
    // Learned on the rig's hosts, by their ids.
    l.ids = cooling_ctrl::journal::host_ids(&host_ids());
    l.hosts[5] = Scalar {
        value: 1.37,
        var: 0.0004,
        fed_s: 3600.0,
        trust: 0.8,
    };
    l.hosts[9].value = 1.25;
    l.facility.theta = [-0.3, 0.0, 0.0, 0.0];
    l.facility_trust = [0.6, 0.0, 0.0, 0.0];
    {
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).expect("the flash file");
        futures::executor::block_on(save_learned(&mut stores.store, &l)).expect("written");
        // Hosts 8 to 15 in a record no controller writes.
        futures::executor::block_on(stores.store.set(LEARNED_KEYS[2], &[9u8; 89]))
            .expect("written");
    }
    let flash = ControllerFlash::open(Some(&path)).expect("the flash file again");
    let mut rig = Rig::start_on(broker, cfg, None, Some(flash)).await;
    let (probe, mut rx) = rig.probe("probe-l", &[cdu_topic(Family::Telemetry)]).await;
    let s = rig.wait_stats("a step", |s| s.status.is_some()).await;
    let restored = s.status.unwrap().estimates.learned;
    assert_eq!(restored.hosts[5].value, 1.37);
    assert_eq!(restored.hosts[9].value, 1.0, "its part was refused");
    assert_eq!(restored.facility.theta[0], -0.3);
    let learned = first(
        &mut rx,
        Duration::from_secs(3),
        "CduTelemetry",
        |m| match &m.frame.message {
            Message::CduTelemetry(t) => t.learned.clone(),
            _ => None,
        },
    )
    .await;
    assert_eq!(learned.host_factor_max_host, Some(id("h05")));
    assert_eq!(learned.host_factor_max_permille, 1370);
    assert_eq!(
        learned.dry_cooler_ua.ratio_permille,
        (f64::from(-0.3f32).exp() * 1000.0).round() as u16
    );
    let _ = probe.shutdown(Duration::from_secs(1)).await;
    rig.stop().await;

    // The clean stop kept what was learned: every part reads, the refused
    // one written anew.
    let flash = ControllerFlash::open(Some(&path)).expect("the flash file after the stop");
    let read = flash
        .learned
        .decode_on(&cfg, cooling_ctrl::journal::host_ids(&host_ids()));
    assert!(read.refused.is_empty(), "{:?}", read.refused);
    assert_eq!(read.read, LEARNED_KEYS);
    let kept = read.learned.unwrap();
    assert_eq!(kept.hosts[5].value, 1.37);
    assert_eq!(kept.hosts[9].value, 1.0);
    assert_eq!(kept.facility.theta[0], -0.3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outdoor_temperature_is_the_cdus_sensor_else_what_the_bms_wrote() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let (link, mut snap_rx, bms) = bms_link();
    // The CDU's outdoor sensor lost from the start: 0x8000.
    let rig = Rig::start_linked(
        broker,
        CoreConfig::default(),
        None,
        None,
        |cdu| cdu.set_measurement("outdoor_temp", -327.68).unwrap(),
        Some(link),
    )
    .await;
    let (probe, mut rx) = rig.probe("probe-o", &[cdu_topic(Family::Telemetry)]).await;
    let mut ambient = async |what: &str, want: Option<f64>| {
        first(&mut rx, Duration::from_secs(3), what, |m| {
            match &m.frame.message {
                Message::CduTelemetry(t) if t.ambient.map(|c| c.value()) == want => Some(()),
                _ => None,
            }
        })
        .await
    };
    ambient("no outdoor temperature", None).await;
    // The BMS writes one: in force while the CDU's sensor does not read,
    // and the holding register reads it back.
    bms.send(vec![NorthboundWrite::OutdoorTemp { celsius: 18.5 }])
        .await
        .unwrap();
    ambient("the BMS's 18.5 °C", Some(18.5)).await;
    let in_force = tokio::time::timeout(
        Duration::from_secs(3),
        snap_rx.wait_for(|s| s.settings.outdoor_c.is_some()),
    )
    .await
    .expect("the BMS's value in the northbound snapshot")
    .unwrap()
    .settings
    .outdoor_c;
    assert_eq!(in_force, Some(18.5));
    // The CDU's sensor reads again: it comes first.
    rig.cdu.set_measurement("outdoor_temp", -3.25).unwrap();
    ambient("the CDU's -3.25 °C", Some(-3.25)).await;
    let _ = probe.shutdown(Duration::from_secs(1)).await;
    rig.stop().await;
}

/// A northbound link: its snapshots, and the BMS's side of its writes.
fn bms_link() -> (
    shell::NorthboundLink,
    tokio::sync::watch::Receiver<northbound::NorthboundSnapshot>,
    mpsc::Sender<Vec<NorthboundWrite>>,
) {
    let (snapshots, snap_rx) = northbound::snapshot_channel();
    let (bms, writes) = mpsc::channel(4);
    let link = shell::NorthboundLink {
        snapshots,
        writes: Some(writes),
    };
    (link, snap_rx, bms)
}

/// The limits the BMS set survive a restart of the controller (a BMS
/// writes a limit once, when it changes): kept in flash as it writes
/// them, restored before the first step, and the holding registers read
/// them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limits_the_bms_set_survive_a_controller_restart() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cdu.flash");
    let flash = ControllerFlash::open(Some(&path)).expect("the flash file");
    assert_eq!(flash.bms_limits, Ok(None));
    let (link, mut snap_rx, bms) = bms_link();
    let cfg = CoreConfig::default();
    let mut rig = Rig::start_linked(broker, cfg, None, Some(flash), |_| {}, Some(link)).await;
    rig.wait_stats("a step", |s| s.steps >= 1).await;
    bms.send(vec![NorthboundWrite::SetpointCeiling { celsius: 30.0 }])
        .await
        .unwrap();
    bms.send(vec![NorthboundWrite::PlanCeilingOffset { kelvin: -2.0 }])
        .await
        .unwrap();
    let limits = |s: &northbound::NorthboundSnapshot| {
        (
            s.settings.setpoint_ceiling_c,
            s.settings.plan_ceiling_offset_k,
        )
    };
    tokio::time::timeout(
        Duration::from_secs(3),
        snap_rx.wait_for(|s| limits(s) == (30.0, -2.0)),
    )
    .await
    .expect("the BMS's limits in force")
    .unwrap();
    let broker = rig.stop_keeping_broker().await;

    let flash = ControllerFlash::open(Some(&path)).expect("the flash file again");
    assert_eq!(flash.bms_limits, Ok(Some((30.0, -2.0))));
    let (link, mut snap_rx, _bms) = bms_link();
    let mut rig = Rig::start_linked(broker, cfg, None, Some(flash), |_| {}, Some(link)).await;
    rig.wait_stats("a step", |s| s.steps >= 1).await;
    assert_eq!(limits(&snap_rx.borrow_and_update()), (30.0, -2.0));
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_hosts_get_signed_cap_leases_and_their_acks_are_counted_and_a_lifted_cap_is_said() {
    // Capacity back for 1 s lifts a cap (60 s in the field).
    let mut core = CoreConfig::default();
    core.timing.cap_release_ms = 1_000;
    let Some(mut rig) = Rig::start_with(core).await else {
        return;
    };
    let cmd_filter = loopwarden_protocol::topic::filter::family(&id(SITE), Role::Host, Family::Cmd)
        .unwrap()
        .to_string();
    let (probe, mut rx) = rig.probe("fakehosts", &[cmd_filter]).await;
    rig.wait_stats("the shell running", |s| s.steps >= 1).await;

    // Two hosts of rack 0 run hot on water well above its setpoint.
    let hot = ["h00", "h01"];
    let publish_reports_at = |probe: &Bus, hottest: u8| {
        for (i, h) in hot.iter().enumerate() {
            let frame = Frame {
                sender: NodeId::new(Role::Host, h).unwrap(),
                seq: i as u32,
                time: now_ms(),
                message: Message::HostTelemetry(hot_host(hottest)),
            };
            let topic = Topic::new(&id(SITE), Role::Host, &id(h), Family::Telemetry);
            probe.publish_frame(&topic, &frame).expect("published");
        }
    };
    let publish_reports = |probe: &Bus| publish_reports_at(probe, 86);
    publish_reports(&probe);
    let mut leases = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while leases.len() < hot.len() && Instant::now() < deadline {
        if let Ok(Some(m)) = tokio::time::timeout(PERIOD, rx.recv()).await {
            if let Message::CapLease(_) = &m.frame.message {
                if !leases.iter().any(|(t, _): &(Topic, Frame)| t == &m.topic) {
                    leases.push((m.topic.clone(), m.frame.clone()));
                }
            }
        } else {
            publish_reports(&probe);
        }
    }
    assert_eq!(leases.len(), 2, "a lease for each hot host");
    let cdu_node = NodeId::new(Role::Cdu, CDU).unwrap();
    let public = key().verifying_key();
    for (topic, frame) in &leases {
        assert!(
            hot.contains(&topic.node.as_str()),
            "only the hot hosts: {topic}"
        );
        assert_eq!(topic.family, Family::Cmd);
        assert_eq!(frame.sender, cdu_node);
        frame
            .verify(topic, |_, k| (k == KEY_ID).then_some(&public))
            .expect("the lease verifies for its host's cmd topic");
        let other = Topic::new(&id(SITE), Role::Host, &id("h05"), Family::Cmd);
        assert!(
            frame
                .verify(&other, |_, k| (k == KEY_ID).then_some(&public))
                .is_err(),
            "and for no other host"
        );
        let Message::CapLease(l) = &frame.message else {
            unreachable!()
        };
        assert_eq!(l.source, CapSource::Cooling);
        assert_eq!(l.duration.0, 30_000);
        assert_eq!(l.caps.len(), 1);
        assert_eq!(l.caps[0].gpus, GpuSelector::All);
        let w = l.caps[0].limit.get();
        assert!((200..700).contains(&w), "a cap between min and TDP: {w} W");
        assert!(frame.time.0.abs_diff(now_ms().0) < 5_000);
    }
    let s = rig
        .wait_stats("leases counted", |s| s.leases_sent >= 2)
        .await;
    assert!(s.caps[0].is_some() && s.caps[1].is_some());
    assert!(s.caps[2..].iter().all(Option::is_none));

    // The host acks: the shell counts it with the limits in force.
    let (topic, frame) = &leases[0];
    let mut in_force = heapless::Vec::new();
    let _ = in_force.push(GpuCap {
        gpus: GpuSelector::All,
        limit: Watts(640),
    });
    let ack = Frame {
        sender: NodeId::new(Role::Host, topic.node.as_str()).unwrap(),
        seq: 100,
        time: now_ms(),
        message: Message::Ack(Ack {
            correlation: Correlation {
                from: cdu_node.clone(),
                seq: frame.seq,
            },
            code: AckCode::Ok,
            in_force,
            detail: Text::default(),
        }),
    };
    let ack_topic = Topic::new(&id(SITE), Role::Host, &topic.node, Family::Ack);
    probe
        .publish_frame(&ack_topic, &ack)
        .expect("ack published");
    let s = rig.wait_stats("the ack counted", |s| s.acks >= 1).await;
    assert_eq!(s.acks_ok, 1);
    assert_eq!(
        s.in_force.get(topic.node.as_str()).map(|v| v[0].limit),
        Some(Watts(640))
    );
    // The same ack again (the bus delivers at least once), then a refusal
    // of an older lease arriving late: neither counts, nor hides the
    // answer in force; the ack to a newer lease counts.
    let with = |seq: u32, code: AckCode| {
        let mut f = ack.clone();
        if let Message::Ack(a) = &mut f.message {
            (a.correlation.seq, a.code) = (seq, code);
        }
        f
    };
    for f in [
        ack.clone(),
        with(frame.seq - 1, AckCode::Replayed),
        with(frame.seq + 1_000, AckCode::Ok),
    ] {
        probe.publish_frame(&ack_topic, &f).expect("ack published");
    }
    let s = rig
        .wait_stats("the newer ack counted", |s| s.acks >= 2)
        .await;
    assert_eq!((s.acks, s.acks_ok, s.acks_refused), (2, 2, 0));
    assert_eq!(s.last_ack[topic.node.as_str()].seq, frame.seq + 1_000);

    // The hosts cool down: the caps rise, then are lifted with one short
    // lease at TDP each.
    let mut lifts: Vec<(Topic, Frame)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(8);
    while lifts.len() < hot.len() && Instant::now() < deadline {
        publish_reports_at(&probe, 60);
        let until = tokio::time::Instant::now() + PERIOD;
        while let Ok(Some(m)) = tokio::time::timeout_at(until, rx.recv()).await {
            if let Message::CapLease(l) = &m.frame.message {
                if l.duration.0 == 5_000 && !lifts.iter().any(|(t, _)| t == &m.topic) {
                    lifts.push((m.topic.clone(), m.frame.clone()));
                }
            }
        }
    }
    assert_eq!(lifts.len(), 2, "a lift for each host capped");
    let public = key().verifying_key();
    for (topic, frame) in &lifts {
        frame
            .verify(topic, |_, k| (k == KEY_ID).then_some(&public))
            .expect("the lift verifies");
        let Message::CapLease(l) = &frame.message else {
            unreachable!()
        };
        assert_eq!(l.caps[0].limit, Watts(700), "a lift is a lease at TDP");
        let first = leases
            .iter()
            .find(|(t, _)| t == topic)
            .expect("leased before");
        let Message::CapLease(f) = &first.1.message else {
            unreachable!()
        };
        assert_eq!(l.lease, f.lease, "one lease id per host");
        assert!(frame.seq > first.1.seq, "command numbers rise");
    }
    let s = rig.wait_stats("lifts counted", |s| s.lifts_sent >= 2).await;
    assert!(s.caps.iter().all(Option::is_none));
    let _ = probe.shutdown(Duration::from_secs(1)).await;
    rig.stop().await;
}

/// An ack from `host` of command `seq` of the rig's CDU, with a limit in
/// force of 640 W, as the host publishes it on its own ack topic.
fn ack_from(host: &str, seq: u32) -> (Topic, Frame) {
    let mut in_force = heapless::Vec::new();
    let _ = in_force.push(GpuCap {
        gpus: GpuSelector::All,
        limit: Watts(640),
    });
    let frame = Frame {
        sender: NodeId::new(Role::Host, host).unwrap(),
        seq: 7,
        time: now_ms(),
        message: Message::Ack(Ack {
            correlation: Correlation {
                from: NodeId::new(Role::Cdu, CDU).unwrap(),
                seq,
            },
            code: AckCode::Ok,
            in_force,
            detail: Text::default(),
        }),
    };
    let topic = Topic::new(&id(SITE), Role::Host, &id(host), Family::Ack);
    (topic, frame)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_from_hosts_not_in_the_host_list_are_counted_and_dropped() {
    let Some(mut rig) = Rig::start().await else {
        return;
    };
    let (probe, _rx) = rig.probe("otherhosts", &[]).await;
    rig.wait_stats("the shell running", |s| s.steps >= 1).await;
    // One of its own hosts acks until the shell has heard it: its
    // subscription to the hosts' acks is live from then on (a step
    // comes before the broker has answered the subscription).
    let (topic, frame) = ack_from("h03", 44);
    let heard = async {
        loop {
            probe.publish_frame(&topic, &frame).expect("published");
            let wait = tokio::time::timeout(
                Duration::from_millis(300),
                rig.shell.stats.wait_for(|s| s.acks >= 1),
            );
            if wait.await.is_ok() {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(15), heard)
        .await
        .expect("the shell hears its host's ack");
    // Hosts of the site this CDU does not cool, each acking a command
    // "of" this CDU.
    for (i, host) in ["h16", "x-r9h3", "zz99"].iter().enumerate() {
        let (topic, frame) = ack_from(host, 40 + i as u32);
        probe.publish_frame(&topic, &frame).expect("published");
    }
    let s = rig
        .wait_stats("the acks counted", |s| s.acks_foreign >= 3)
        .await;
    assert_eq!(s.acks_foreign, 3);
    assert_eq!(s.acks, s.acks_ok, "its own host's acks, all ok");
    let kept: Vec<&String> = s.in_force.keys().chain(s.last_ack.keys()).collect();
    assert_eq!(kept, ["h03", "h03"], "only its own host is kept");
    assert_eq!(s.last_ack["h03"].seq, 44);
    let _ = probe.shutdown(Duration::from_secs(1)).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leak_closes_its_racks_valve_within_a_period_and_the_state_says_so() {
    let Some(mut rig) = Rig::start().await else {
        return;
    };
    let (probe, mut rx) = rig.probe("probe3", &[cdu_topic(Family::Health)]).await;
    rig.wait_stats("the shell running", |s| s.cdu_reads >= 2)
        .await;
    assert_eq!(rig.cdu.setting("valves_open").unwrap(), 15.0);

    rig.cdu.set_measurement("leak_inputs", 4.0).unwrap(); // rack 2
    let t0 = Instant::now();
    while rig.cdu.setting("valves_open").unwrap() != 11.0 {
        assert!(
            t0.elapsed() < PERIOD + Duration::from_millis(300),
            "rack 2's valve still open after {:?}",
            t0.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let st = first(
        &mut rx,
        Duration::from_secs(3),
        "a state with rack 2 lost",
        |m| match &m.frame.message {
            Message::CduState(st) if st.racks.iter().any(|r| r.cooling == RackCooling::Lost) => {
                Some(st.clone())
            }
            _ => None,
        },
    )
    .await;
    let lost: Vec<u8> = st
        .racks
        .iter()
        .filter(|r| r.cooling == RackCooling::Lost)
        .map(|r| r.rack.get())
        .collect();
    assert_eq!(lost, vec![2]);
    // Its hosts are capped to their minimum, for the leak.
    let s = rig
        .wait_stats("the leaking rack's hosts capped", |s| {
            (8..12).all(|h| s.caps[h].is_some())
        })
        .await;
    assert!((8..12).all(|h| s.caps[h] == Some(200.0)));
    assert!(s
        .last
        .as_ref()
        .is_some_and(|c| c.cooling_lost == 4 && c.beacon));
    let _ = probe.shutdown(Duration::from_secs(1)).await;
    rig.stop().await;
}

#[tokio::test]
async fn a_leak_rope_on_the_board_closes_its_valve_and_the_beacon_lights() {
    use loopwarden_boards::pins::{BoardPins, PinMap};
    use loopwarden_twin::pins::SimLines;
    let map = PinMap::sim_controller();
    let lines = SimLines::new();
    for r in &map.ropes {
        lines.assert(&r.leak, false);
        lines.assert(&r.fault, false);
    }
    let pins = BoardPins::new(&map, |l| lines.input(l), |l| lines.output(l));
    let Some(mut rig) = Rig::start_full(CoreConfig::default(), Some(Box::new(pins))).await else {
        return;
    };
    rig.wait_stats("the shell running", |s| s.cdu_reads >= 2)
        .await;
    // The healthy relay gets one edge per step.
    let level = lines.asserted(&map.controller_healthy);
    let steps = rig.shell.stats.borrow().steps;
    rig.wait_stats("one more step", |s| s.steps > steps).await;
    assert_ne!(
        lines.asserted(&map.controller_healthy),
        level,
        "the relay is pulsed"
    );
    assert!(!lines.asserted(&map.alarm_beacon), "no alarm yet");
    assert_eq!(rig.cdu.setting("valves_open").unwrap(), 15.0);
    // Rack 1's rope gets wet: the CDU's own leak register says nothing.
    lines.assert(&map.rope(1).unwrap().leak, true);
    let t0 = Instant::now();
    while rig.cdu.setting("valves_open").unwrap() != 13.0 {
        assert!(
            t0.elapsed() < PERIOD + Duration::from_millis(300),
            "rack 1's valve still open after {:?}",
            t0.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    rig.wait_stats("the beacon commanded", |s| {
        s.last.as_ref().is_some_and(|c| c.beacon)
    })
    .await;
    tokio::time::sleep(PERIOD).await;
    assert!(lines.asserted(&map.alarm_beacon), "the beacon is lit");
    rig.stop().await;
}

#[tokio::test]
async fn a_config_it_cannot_run_with_is_refused_before_anything_starts() {
    let broker = BrokerAddr {
        host: "127.0.0.1".into(),
        port: 1,
    };
    let port = ModbusCdu::new(
        RegisterMap::sim_cdu(),
        Link::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 1)).into()),
    );
    let mut cfg = ShellConfig::new(id(SITE), id(CDU), broker, CoreConfig::default());
    cfg.hosts = (0..17).map(|i| id(&format!("h{i:02}"))).collect();
    cfg.key = Some(key());
    let e = shell::run(cfg.clone(), port, std::future::pending())
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "cooling shell config: hosts: 17 ids for a layout of 16 hosts"
    );
    cfg.hosts = vec![id("h00"), id("h01"), id("h00")];
    let e = cfg.validate().unwrap_err();
    assert_eq!(
        e.to_string(),
        "cooling shell config: hosts: h00 appears twice"
    );
    cfg.hosts.pop();
    cfg.key = None;
    assert!(cfg.validate().unwrap_err().to_string().contains("sign key"));
    cfg.key = Some(key());
    cfg.lease = Duration::ZERO;
    assert!(cfg.validate().unwrap_err().to_string().contains("lease"));
    cfg.lease = Duration::from_secs(30);
    cfg.core.layout.racks = 0;
    assert!(matches!(
        shell::run(
            cfg,
            ModbusCdu::new(
                RegisterMap::sim_cdu(),
                Link::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 1)).into())
            ),
            std::future::pending()
        )
        .await,
        Err(shell::ShellError::Core(_))
    ));
}

/// A restarted controller numbers its frames above everything it sent
/// before (the floor is reserved in its flash), so receivers that drop
/// duplicates by sender and seq take its state and events; its events
/// are in its flash event log across the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_controller_numbers_its_frames_above_its_last_run() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cdu.flash");
    let flash = ControllerFlash::open(Some(&path)).expect("the flash file");
    let recorder = flash.recorder.clone();
    let mut rig = Rig::start_on(broker, CoreConfig::default(), None, Some(flash)).await;
    let (_probe, mut rx) = rig.probe("probe-r", &[cdu_topic(Family::Telemetry)]).await;
    rig.wait_stats("the shell running", |s| s.cdu_reads >= 2)
        .await;
    // A leak: an event, logged and published through the outbox.
    rig.cdu.set_measurement("leak_inputs", 4.0).unwrap();
    rig.wait_stats("the leak's event", |s| s.events_published >= 1)
        .await;
    let mut last = 0;
    for _ in 0..3 {
        last = first(&mut rx, Duration::from_secs(3), "telemetry", |m| {
            Some(m.frame.seq)
        })
        .await;
    }
    let broker = rig.stop_keeping_broker().await;
    recorder.flush().await;
    let logged = recorder.read().await.expect("the event log").entries.len();
    assert!(logged >= 1, "the first run's events are in flash");
    drop(recorder);

    let flash = ControllerFlash::open(Some(&path)).expect("the flash file again");
    let again = flash.recorder.clone();
    let rig = Rig::start_on(broker, CoreConfig::default(), None, Some(flash)).await;
    let (_probe, mut rx) = rig.probe("probe-s", &[cdu_topic(Family::Telemetry)]).await;
    let next = first(
        &mut rx,
        Duration::from_secs(3),
        "telemetry after the restart",
        |m| Some(m.frame.seq),
    )
    .await;
    assert!(
        next > last,
        "after a restart seq {next} is not above the last run's {last}"
    );
    let entries = again.read().await.expect("the event log").entries;
    assert!(entries.len() >= logged, "the log survives the restart");
    rig.stop().await;
}

#[tokio::test]
async fn an_unreadable_latched_record_latches_the_racks_whose_valves_read_closed() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cdu.flash");
    {
        // A record no controller writes (version 9).
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).expect("the flash file");
        futures::executor::block_on(
            stores
                .store
                .set(cooling_ctrl::journal::LATCHED_KEY, &[9u8; 16]),
        )
        .expect("written");
    }
    let flash = ControllerFlash::open(Some(&path)).expect("the flash file again");
    let e = flash.latched.clone().unwrap_err();
    assert!(e.contains("version 9"), "{e}");
    // The CDU kept rack 2's valve shut while the controller was away.
    let mut rig = Rig::start_prepared(broker, CoreConfig::default(), None, Some(flash), |cdu| {
        cdu.set_measurement("valves_closed", 4.0).unwrap();
    })
    .await;
    let s = rig
        .wait_stats("rack 2 latched", |s| {
            s.status.as_ref().is_some_and(|st| st.leaks_latched == 4)
        })
        .await;
    assert_eq!(s.last.map(|c| c.valves_open), Some(0b1011));
    tokio::time::sleep(PERIOD * 3).await;
    assert_eq!(
        rig.cdu.setting("valves_open").unwrap(),
        11.0,
        "it stays shut"
    );
    rig.stop().await;
    // The record written anew has the mark beside it: should both of its
    // items be lost later, a restart reads it as lost, not as none.
    let mut stores = loopwarden_store::agent_flash::open(Some(&path)).expect("the flash file");
    let mut b = [0u8; 4];
    let mark = stores
        .store
        .get(cooling_ctrl::journal::LATCH_KEPT_KEY, &mut b);
    assert!(
        futures::executor::block_on(mark).unwrap().is_some(),
        "the mark that a record was kept"
    );
}

/// The simulated CDU's register map with `edit` applied to its TOML.
fn sim_map_edited(edit: impl FnOnce(&str) -> String) -> RegisterMap {
    let text = edit(include_str!("../../boards/cdus/sim-cdu.toml"));
    RegisterMap::from_toml(&text, "sim-cdu.toml, edited").expect("the edited map")
}

/// Waits until the CDU's `valves_open` reads `want`, for at most `within`.
async fn valves_become(cdu: &SimCdu, want: f64, within: Duration) {
    let t0 = Instant::now();
    while cdu.setting("valves_open").unwrap() != want {
        assert!(
            t0.elapsed() < within,
            "valves_open {} after {:?}, {want} wanted",
            cdu.setting("valves_open").unwrap(),
            t0.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setpoint_below_the_maps_range_is_held_to_it_and_a_leaking_racks_valve_still_closes() {
    // A site whose 12 °C dew point allows 14 °C water; the CDU's map
    // takes no less than 17 °C.
    let mut core = CoreConfig::default();
    core.cdu.min_setpoint_c = 14.0;
    core.margins.boot_setpoint_c = 14.0;
    let Some(mut rig) = Rig::start_with(core).await else {
        return;
    };
    rig.wait_stats("the shell running", |s| s.cdu_reads >= 2)
        .await;
    valves_become(&rig.cdu, 15.0, Duration::from_secs(2)).await;
    let setpoint = rig.cdu.setting("supply_setpoint").unwrap();
    assert!((17.0..=45.0).contains(&setpoint), "{setpoint}");
    rig.cdu.set_measurement("leak_inputs", 4.0).unwrap(); // rack 2
    valves_become(&rig.cdu, 11.0, PERIOD + Duration::from_millis(300)).await;
    let s = rig.wait_stats("steps", |s| s.steps >= 4).await;
    assert_eq!(s.cdu_write_errors, 0, "nothing refused: {:?}", s.cdu_error);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_setpoint_holds_back_neither_the_valves_nor_the_heartbeat() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    // The CDU's own range is narrower than its map says: every setpoint
    // the controller asks is refused with exception 3.
    let cdu = loopwarden_system_tests::steady_sim_cdu_on(sim_map_edited(|t| {
        t.replace("min = 17.0", "min = 44.0")
    }));
    let mut rig = Rig::start_cdu(
        broker,
        CoreConfig::default(),
        None,
        None,
        None,
        cdu,
        Duration::ZERO,
    )
    .await;
    rig.wait_stats("a refused write", |s| s.cdu_write_errors >= 2)
        .await;
    valves_become(&rig.cdu, 15.0, Duration::from_secs(2)).await;
    let beat = rig.cdu.setting("heartbeat").unwrap();
    let steps = rig.shell.stats.borrow().steps;
    rig.wait_stats("two more steps", |s| s.steps >= steps + 2)
        .await;
    assert_ne!(
        rig.cdu.setting("heartbeat").unwrap(),
        beat,
        "the heartbeat goes on"
    );
    assert_eq!(
        rig.cdu.setting("supply_setpoint").unwrap(),
        0.0,
        "the setpoint never went in"
    );
    rig.cdu.set_measurement("leak_inputs", 2.0).unwrap(); // rack 1
    valves_become(&rig.cdu, 13.0, PERIOD + Duration::from_millis(300)).await;
    rig.stop().await;
}

/// A flash file whose latched record no controller can read (version 9).
fn unreadable_flash(path: &std::path::Path) -> ControllerFlash {
    {
        let mut stores = loopwarden_store::agent_flash::open(Some(path)).expect("the flash file");
        futures::executor::block_on(
            stores
                .store
                .set(cooling_ctrl::journal::LATCHED_KEY, &[9u8; 16]),
        )
        .expect("written");
    }
    let flash = ControllerFlash::open(Some(path)).expect("the flash file again");
    assert!(flash.latched.is_err());
    flash
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_record_is_not_overwritten_while_the_cdu_is_silent() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cdu.flash");
    let flash = unreadable_flash(&path);
    let cdu = sim_cdu();
    let mut rig = Rig::start_cdu(
        broker,
        CoreConfig::default(),
        None,
        Some(flash),
        None,
        cdu,
        Duration::from_secs(30),
    )
    .await;
    rig.wait_stats("steps with the CDU silent", |s| {
        s.steps >= 3 && s.cdu_read_errors >= 3
    })
    .await;
    rig.stop().await;
    let again = ControllerFlash::open(Some(&path)).expect("the flash file");
    let e = again.latched.clone().unwrap_err();
    assert!(e.contains("version 9"), "still the unreadable record: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_valve_is_written_after_an_unreadable_record_until_the_positions_are_read() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let flash = unreadable_flash(&dir.path().join("cdu.flash"));
    // Every read fails (the CDU lacks a register its map has), every
    // write goes in; rack 2's valve was shut for a leak.
    let served = sim_map_edited(|t| {
        let cut = t.find("[[register]]\nname = \"outdoor_temp\"").unwrap();
        let end = cut + t[cut..].find("\n\n").unwrap() + 2;
        format!("{}{}", &t[..cut], &t[end..])
    });
    let cdu = loopwarden_system_tests::steady_sim_cdu_on(served);
    cdu.write_setting("valves_open", 11.0).unwrap();
    let mut rig = Rig::start_cdu(
        broker,
        CoreConfig::default(),
        None,
        Some(flash),
        None,
        cdu,
        Duration::ZERO,
    )
    .await;
    rig.wait_stats("steps with every read failing", |s| {
        s.steps >= 5 && s.cdu_read_errors >= 5
    })
    .await;
    assert_eq!(
        rig.cdu.setting("valves_open").unwrap(),
        11.0,
        "rack 2's valve stays shut"
    );
    rig.stop().await;
}
