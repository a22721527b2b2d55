//! `node-agent run` under a fake service manager: a notify socket bound in
//! a temporary folder, named by `NOTIFY_SOCKET` with `WATCHDOG_USEC` set,
//! as systemd does for a `Type=notify` unit with `WatchdogSec=`. The agent
//! runs simulated GPUs against a broker that is not there (it samples and
//! decides without the bus), so the test needs no tool.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use loopwarden_field::watchdog::NotifyListener;
use loopwarden_system_tests::free_port;

const AGENT: &str = env!("CARGO_BIN_EXE_node-agent");

/// `node-agent run` on two simulated GPUs, sampling every 200 ms, with
/// `env` added to its environment; its log goes to `dir/agent.log`.
fn start(dir: &Path, env: &[(&str, &str)]) -> Child {
    let log = std::fs::File::create(dir.join("agent.log")).expect("the log file");
    let mut cmd = Command::new(AGENT);
    cmd.args(["run", "--twin-gpus", "2", "--site", "wd", "--host", "h1"])
        .args(["--broker", &format!("127.0.0.1:{}", free_port())])
        .args(["--period-ms", "200"])
        .arg("--console")
        .arg(dir.join("agent.sock"))
        .env("RUST_LOG", "info,rumqttc=off")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .stdout(Stdio::null())
        .stderr(log);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("start node-agent")
}

/// The next notice within `within` that does not start with one of
/// `skip`.
fn next_but(l: &NotifyListener, skip: &[&str], within: Duration) -> Option<String> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match l.next(left).expect("the notify socket") {
            Some(n) if skip.iter().any(|s| n.starts_with(s)) => continue,
            other => return other,
        }
    }
}

#[test]
fn the_agent_is_ready_after_sampling_pings_and_says_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let l = NotifyListener::bind(&dir.path().join("notify")).unwrap();
    let socket = l.path().to_str().unwrap().to_string();
    // A 2 s watchdog: a ping every second while rounds complete.
    let mut child = start(
        dir.path(),
        &[("NOTIFY_SOCKET", &socket), ("WATCHDOG_USEC", "2000000")],
    );
    let long = Duration::from_secs(20);
    assert_eq!(l.next(long).unwrap().as_deref(), Some("READY=1"));
    // Pings while it samples. (A machine too busy to run a round in a
    // second would make the agent say STATUS=... stalled, then running:
    // those are not what this test is about.)
    for _ in 0..3 {
        assert_eq!(
            next_but(&l, &["STATUS="], long).as_deref(),
            Some("WATCHDOG=1")
        );
    }
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(kill.success());
    assert_eq!(
        next_but(&l, &["WATCHDOG=", "STATUS="], long).as_deref(),
        Some("STOPPING=1")
    );
    let status = child.wait().expect("wait");
    assert!(status.success(), "a clean stop exits 0: {status}");
    // Nothing after STOPPING=1.
    assert_eq!(l.next(Duration::from_millis(200)).unwrap(), None);
}

#[test]
fn a_malformed_watchdog_timeout_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let l = NotifyListener::bind(&dir.path().join("notify")).unwrap();
    let socket = l.path().to_str().unwrap().to_string();
    let mut child = start(
        dir.path(),
        &[("NOTIFY_SOCKET", &socket), ("WATCHDOG_USEC", "10s")],
    );
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(2), "exit status 2: not restarted");
    let stderr = std::fs::read_to_string(dir.path().join("agent.log")).unwrap();
    assert!(
        stderr.contains("node-agent: WATCHDOG_USEC=\"10s\": not a whole number of microseconds"),
        "{stderr}"
    );
    assert_eq!(l.next(Duration::from_millis(100)).unwrap(), None);
}
