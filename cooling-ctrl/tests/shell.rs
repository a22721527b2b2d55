//! The controller's real-time shell against a real mosquitto on a free
//! loopback port and the simulated CDU served on Modbus TCP (the rig:
//! `shell_cdu`): it writes its settings into the CDU, publishes telemetry
//! and a retained state, takes the outdoor temperature from the CDU else
//! the BMS, keeps what it learned and the BMS's limits across a restart,
//! numbers its frames above its last run, and refuses a config it cannot
//! run with. Its cap leases are tested in `shell_leases`, leaks and the
//! CDU's writes in `shell_leaks`.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

// The shared rigs' parts other files use.
#[allow(dead_code)]
mod shell_cdu;
#[allow(dead_code)]
mod shell_rig;

use std::time::Duration;

use cooling_core::CoreConfig;
use cooling_ctrl::journal::ControllerFlash;
use cooling_ctrl::modbus::{Link, ModbusCdu};
use cooling_ctrl::northbound::{self, NorthboundWrite};
use cooling_ctrl::shell::{self, ShellConfig};
use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_bus::BrokerAddr;
use loopwarden_protocol::message::{CduMode, RackCooling};
use loopwarden_protocol::units::Watts;
use loopwarden_protocol::{Family, Message};
use loopwarden_system_tests::Mosquitto;
use shell_cdu::*;

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
