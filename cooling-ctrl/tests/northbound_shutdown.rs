//! The BMS's writes while the controller stops, on a real mosquitto and
//! the simulated CDU: a write the northbound server could hand on is
//! applied and kept in flash before the controller stops; once it stops
//! taking them, the channel is closed, and the server refuses a write
//! (exception 4) rather than answer it as taken and lose it.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

// The shared rig's retained reads are not used here.
#[allow(dead_code)]
mod shell_rig;

use std::time::Duration;

use cooling_core::CoreConfig;
use cooling_ctrl::journal::ControllerFlash;
use cooling_ctrl::northbound::{self, NorthboundWrite};
use cooling_ctrl::shell::{self, ShellConfig, ShellOptions};
use loopwarden_system_tests::Mosquitto;
use shell_rig::{id, sim_cdu, Running};
use tokio::sync::mpsc::{self, error::TrySendError};

/// A BMS that writes a new setpoint ceiling every millisecond on `bms`
/// until the channel closes: the last ceiling the channel took, °C.
async fn write_until_closed(bms: mpsc::Sender<Vec<NorthboundWrite>>) -> Option<f32> {
    let mut last = None;
    for k in 0u32.. {
        // 25.00 to 34.95 °C, within the site's setpoints.
        let celsius = 25.0 + (k % 200) as f32 * 0.05;
        match bms.try_send(vec![NorthboundWrite::SetpointCeiling { celsius }]) {
            Ok(()) => last = Some(celsius),
            Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Closed(_)) => return last,
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    last
}

/// A BMS writes the ceiling on while the controller is told to stop:
/// every write the channel took is applied before it stops, so the last
/// one is in flash for the next start (a BMS writes a limit once, when
/// it changes); after that the channel is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bms_write_while_the_controller_stops_is_kept_or_refused() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cdu.flash");
    let flash = ControllerFlash::open(Some(&path)).expect("the flash file");
    let (snapshots, _snap_rx) = northbound::snapshot_channel();
    let (bms, writes) = mpsc::channel(4);
    let mut cfg = ShellConfig::new(
        id("hall-s"),
        id("cdu-1"),
        broker.addr(),
        CoreConfig::default(),
    );
    cfg.period = Duration::from_millis(200);
    let opts = ShellOptions {
        bus: shell::BusOptions {
            flash: Some(flash),
            ..Default::default()
        },
        northbound: Some(shell::NorthboundLink {
            snapshots,
            writes: Some(writes),
        }),
        ..Default::default()
    };
    let mut ctrl = Running::start(cfg, opts, sim_cdu().await);
    ctrl.wait(Duration::from_secs(15), "a step", |s| s.steps >= 1)
        .await;
    let writer = tokio::spawn(write_until_closed(bms));
    tokio::time::sleep(Duration::from_millis(50)).await;
    ctrl.stop().await;
    let last = tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .expect("the channel closed once the controller stopped")
        .unwrap()
        .expect("a write taken before the stop");

    let flash = ControllerFlash::open(Some(&path)).expect("the flash file again");
    assert_eq!(
        flash.bms_limits,
        Ok(Some((last, 0.0))),
        "the last write the channel took is kept"
    );
}
