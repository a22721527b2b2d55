//! The cooling controller's presence as a facility reader of the JSON
//! tree sees it: `cooling-ctrl run` as a process on a simulated CDU
//! (Modbus TCP, served from the test) against a real mosquitto, with a
//! 2 s keep-alive, and a paho-mqtt subscriber
//! (`tests/json_presence_watch.py`) on the CDU's JSON `online`. Hung
//! (SIGSTOP), the controller reads offline within 1.5 × the keep-alive
//! and a margin, and online again once resumed; killed (SIGKILL), offline
//! within the same bound.
//!
//! Skipped when mosquitto, Python or paho-mqtt is missing, except under
//! CI (`CI=true`), where that fails the test.

use std::process::{Command, Stdio};
use std::time::Duration;

use loopwarden_system_tests::json_presence::{check_hang_and_kill, JsonPresenceWatch};
use loopwarden_system_tests::{serve_sim_cdu, steady_sim_cdu, Mosquitto};

const BIN: &str = env!("CARGO_BIN_EXE_cooling-ctrl");
const SITE: &str = "jp";
const CDU: &str = "cdu-7";
/// The controller's keep-alive in this test.
const KEEP_ALIVE: Duration = Duration::from_secs(2);
/// On top of 1.5 × the keep-alive: the broker's own check interval and a
/// loaded two-core machine (docs/bus.md section 3).
const MARGIN: Duration = Duration::from_secs(5);

#[test]
fn a_killed_or_hung_controller_reads_offline_in_the_json_tree_within_its_keep_alive() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let topic = format!("dc/v2/{SITE}/json/cdu/{CDU}/online");
    let Some(mut reader) = JsonPresenceWatch::start(broker.port(), &[&topic]) else {
        return;
    };
    // The simulated CDU on Modbus TCP, served by this process.
    let cdu = steady_sim_cdu();
    let (_rt, modbus) = serve_sim_cdu(&cdu);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cdu.toml");
    std::fs::write(
        &config,
        format!(
            "site = \"{SITE}\"\ncdu = \"{CDU}\"\nbroker = \"{}\"\ndemo_key = true\n\
             cdu_tcp = \"{modbus}\"\nhosts_pattern = \"r{{rack}}h{{host}}\"\nperiod_ms = 200\n\
             modbus_timeout_ms = 75\nambient_c = 20\nkeep_alive_s = {}\nconsole = {:?}\n",
            broker.addr(),
            KEEP_ALIVE.as_secs(),
            dir.path().join("cdu.sock"),
        ),
    )
    .unwrap();
    let mut ctrl = Command::new(BIN)
        .arg("run")
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "info,rumqttc=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start cooling-ctrl run");
    check_hang_and_kill(&mut reader, &mut ctrl, KEEP_ALIVE, MARGIN);
}
