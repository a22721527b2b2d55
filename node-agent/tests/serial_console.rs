//! `node-agent run --console-serial` as a process on simulated GPUs, with
//! a field engineer's terminal on the other end of a `socat` serial line:
//! the banner, `help`, tables, line noise, a wrong password refused, the
//! right one accepted, `logout`; then the flash log (`ctl events`) holds
//! the session and the logins. The host's serial console is read-only:
//! `help` offers no state change.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use loopwarden_bus::embedded::EmbeddedBroker;
use loopwarden_system_tests::serial_console::{console_records, PtyPair, Terminal};
use serde_json::Value;

const AGENT: &str = env!("CARGO_BIN_EXE_node-agent");
const PASSWORD: &str = "rack 4 host 1";
const WAIT: Duration = Duration::from_secs(20);

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ctl_json(socket: &std::path::Path, args: &[&str]) -> Option<Value> {
    let out = Command::new(AGENT)
        .args(["ctl", "--json", "--console"])
        .arg(socket)
        .args(args)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).ok()
}

#[test]
fn a_field_engineer_reads_the_host_on_the_serial_console_after_a_refused_login() {
    let Some(line) = PtyPair::start() else {
        return;
    };
    let broker = EmbeddedBroker::start("127.0.0.1:0".parse().unwrap()).expect("a broker");
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("h01.sock");
    let config = dir.path().join("agent.toml");
    let hash = loopwarden_field::serial::password::hash(PASSWORD).unwrap();
    std::fs::write(&config, format!("console_password_hash = \"{hash}\"\n")).unwrap();
    let _agent = Guard(
        Command::new(AGENT)
            .args(["run", "--config"])
            .arg(&config)
            .args(["--twin-gpus", "2", "--site", "hall-t", "--host", "h01"])
            .args(["--broker", &broker.addr().to_string()])
            .args(["--period-ms", "200", "--console"])
            .arg(&socket)
            .args(["--flash"])
            .arg(dir.path().join("h01.flash"))
            .arg("--console-serial")
            .arg(line.agent())
            .env("RUST_LOG", "info,rumqttc=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start node-agent"),
    );
    let t0 = Instant::now();
    while ctl_json(&socket, &["status"]).is_none() {
        assert!(t0.elapsed() < WAIT, "the agent's console never answered");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut term = Terminal::open(&line.engineer());
    term.expect("Loopwarden node-agent", WAIT);
    term.expect("host h01 of site hall-t", WAIT);
    term.expect("h01> ", WAIT);

    term.send(b"help\r");
    let help = term.expect("h01> ", WAIT);
    assert!(
        help.contains("why GPU") && help.contains("logout"),
        "{help}"
    );
    assert!(
        !help.lines().any(|l| l.trim_end().ends_with(" *")),
        "a state change offered: {help}"
    );
    // Noise, then a table; a bad argument says how to type it.
    term.send(b"\x00\xff\x1bOPgpus\r\n");
    let gpus = term.expect("h01> ", WAIT);
    assert!(gpus.contains("\r\nGPU "), "{gpus:?}");
    term.send(b"why two\r");
    term.expect("why \"two\": the GPU is a number (0-based)", WAIT);
    term.send(&[b'x'; 250]);
    term.send(b"\r");
    term.expect("line too long (over 200 characters), discarded", WAIT);

    term.send(b"login\r");
    term.expect("password: ", WAIT);
    term.send(b"rack 4 host 2\r");
    term.expect("login refused (1 in a row); the next try in 2 s", WAIT);
    // Within the lock, the line after login is still hidden, and refused
    // unchecked.
    term.send(b"login\r");
    term.expect("password: ", WAIT);
    term.send(b"typed-in-the-lock\r");
    term.expect("login refused: wait", WAIT);
    assert!(
        !term.transcript().contains("typed-in-the-lock"),
        "a password typed in the lock was echoed"
    );
    std::thread::sleep(Duration::from_millis(2_100));
    term.send(b"login\r");
    term.expect("password: ", WAIT);
    term.send(format!("{PASSWORD}\r").as_bytes());
    term.expect(
        "logged in: this console offers no state-changing commands",
        WAIT,
    );
    term.expect("h01# ", WAIT);
    term.send(b"caps\r");
    let caps = term.expect("h01# ", WAIT);
    assert!(caps.contains("LIMIT"), "{caps:?}");
    term.send(b"exit\r");
    term.expect("logged out", WAIT);
    assert!(
        !term.transcript().contains(PASSWORD),
        "the password was echoed"
    );

    let want = [
        "session_opened",
        "login_refused",
        "login_accepted",
        "session_closed:logout",
    ];
    let t0 = Instant::now();
    loop {
        let v = ctl_json(&socket, &["events"]).unwrap_or(Value::Null);
        if console_records(&v) == want {
            break;
        }
        assert!(t0.elapsed() < WAIT, "console records: {v:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
