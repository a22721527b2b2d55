//! The supply setpoint the controller publishes as in force
//! (`cdu_telemetry`, `cdu_state`, the BMS's `setpoint` register) is the
//! one the CDU last took, never one it refused: the controller's
//! real-time shell against a real mosquitto and the simulated CDU on
//! Modbus TCP (the rig: `shell_cdu`).
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

// The shared rigs' parts other files use.
#[allow(dead_code)]
mod shell_cdu;
#[allow(dead_code)]
mod shell_rig;

use std::time::Duration;

use cooling_core::CoreConfig;
use loopwarden_protocol::{Family, Message};
use loopwarden_system_tests::Mosquitto;
use shell_cdu::*;

/// The CDU takes the boot setpoint, then is switched to local mode at
/// its panel (every write refused with an exception) while the core
/// raises the setpoint: what the core commands after is not in force,
/// and the bus and the BMS are told the setpoint the CDU took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_setpoint_in_force_is_the_last_the_cdu_took_not_one_it_refused() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let mut core = CoreConfig::default();
    core.timing.boot_settle_ms = 1_000;
    let boot = core.margins.boot_setpoint_c;
    let (link, snap_rx, _bms) = bms_link();
    let cdu = sim_cdu();
    let mut rig = Rig::start_cdu(broker, core, None, None, Some(link), cdu, None).await;
    rig.wait_stats("the boot setpoint taken", |s| {
        s.setpoint_written_c == Some(f64::from(boot))
    })
    .await;
    rig.cdu.set_local(true);
    // Past the state's republishing step (0.5 K): a state saying the
    // commanded setpoint would have gone out by now.
    let commanded =
        |s: &cooling_ctrl::shell::ShellStats| s.last.as_ref().map_or(boot, |c| c.setpoint_c);
    let s = rig
        .wait_stats("a setpoint 0.6 K above the one taken commanded", |s| {
            commanded(s) >= boot + 0.6
        })
        .await;
    assert!(s.cdu_write_errors > 0, "the CDU refused the writes");
    assert_eq!(s.setpoint_written_c, Some(f64::from(boot)));
    assert_eq!(rig.cdu.setting("supply_setpoint").unwrap(), f64::from(boot));

    let topics = [cdu_topic(Family::Health), cdu_topic(Family::Telemetry)];
    let (probe, mut rx) = rig.probe("probe-sp", &topics).await;
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
    assert_eq!(state.setpoint.value(), f64::from(boot), "{state:?}");
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
    assert_eq!(tel.setpoint.value(), f64::from(boot));
    let s = rig.wait_stats("a step after", |s| s.steps > 0).await;
    assert!(commanded(&s) >= boot + 0.6, "still commanded higher");
    // The BMS's register says the same.
    let snap = snap_rx.borrow().clone();
    assert_eq!(snap.setpoint_c, boot);
    // The pumps' command stays what is commanded, as it is named.
    assert!(tel.pump_a.command.get() < 100, "{:?}", tel.pump_a);
    let _ = probe.shutdown(Duration::from_secs(1)).await;
    rig.stop().await;
}
