//! The host agent's presence as a facility reader of the JSON tree sees
//! it: `node-agent run --twin-gpus 2` as a process against a real
//! mosquitto, with a 2 s keep-alive, and a paho-mqtt subscriber
//! (`tests/json_presence_watch.py`) on the host's JSON `online`. Hung
//! (SIGSTOP), the host reads offline within 1.5 × the keep-alive and a
//! margin, and online again once resumed; killed (SIGKILL), offline within
//! the same bound.
//!
//! Skipped when mosquitto, Python or paho-mqtt is missing, except under
//! CI (`CI=true`), where that fails the test.

use std::process::{Command, Stdio};
use std::time::Duration;

use loopwarden_system_tests::json_presence::{check_hang_and_kill, JsonPresenceWatch};
use loopwarden_system_tests::Mosquitto;

const AGENT: &str = env!("CARGO_BIN_EXE_node-agent");
const SITE: &str = "jp";
const HOST: &str = "h05";
/// The agent's keep-alive in this test.
const KEEP_ALIVE: Duration = Duration::from_secs(2);
/// On top of 1.5 × the keep-alive: the broker's own check interval and a
/// loaded two-core machine (docs/bus.md section 3).
const MARGIN: Duration = Duration::from_secs(5);

#[test]
fn a_killed_or_hung_host_reads_offline_in_the_json_tree_within_its_keep_alive() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let topic = format!("dc/v2/{SITE}/json/host/{HOST}/online");
    let Some(mut reader) = JsonPresenceWatch::start(broker.port(), &[&topic]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Command::new(AGENT)
        .args(["run", "--twin-gpus", "2", "--site", SITE, "--host", HOST])
        .args(["--broker", &format!("127.0.0.1:{}", broker.port())])
        .args(["--keep-alive-s", &KEEP_ALIVE.as_secs().to_string()])
        .arg("--console")
        .arg(dir.path().join("agent.sock"))
        .env("RUST_LOG", "info,rumqttc=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start node-agent");
    check_hang_and_kill(&mut reader, &mut agent, KEEP_ALIVE, MARGIN);
}
