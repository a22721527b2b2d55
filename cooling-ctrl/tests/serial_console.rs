//! `cooling-ctrl run --console-serial` as a process, with a field
//! engineer's terminal on the other end of a `socat` serial line: the
//! banner, `help`, a table, line noise, a state change refused before the
//! login, a wrong password refused, the right one accepted, a latched leak
//! cleared, `logout`; then the flash log (`ctl events`) holds the session,
//! the logins and the command, and the clear is in the serial port's name.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use loopwarden_bus::embedded::EmbeddedBroker;
use loopwarden_system_tests::serial_console::{console_records, PtyPair, Terminal};
use loopwarden_system_tests::{serve_sim_cdu, steady_sim_cdu};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_cooling-ctrl");
const PASSWORD: &str = "pump room 7";
const WAIT: Duration = Duration::from_secs(15);

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ctl_json(socket: &std::path::Path, what: &str) -> Value {
    let out = Command::new(BIN)
        .args(["ctl", "--console"])
        .arg(socket)
        .args([what, "--json"])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

#[test]
fn a_field_engineer_logs_in_on_the_serial_console_and_clears_a_leak() {
    let Some(line) = PtyPair::start() else {
        return;
    };
    let cdu = steady_sim_cdu();
    let (_rt, modbus) = serve_sim_cdu(&cdu);
    let broker = EmbeddedBroker::start("127.0.0.1:0".parse().unwrap()).expect("a broker");
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cdu.sock");
    let config = dir.path().join("cdu.toml");
    let hash = loopwarden_field::serial::password::hash(PASSWORD).unwrap();
    std::fs::write(
        &config,
        format!(
            "site = \"hall-t\"\ncdu = \"cdu-1\"\nbroker = \"{}\"\ndemo_key = true\n\
             cdu_tcp = \"{modbus}\"\nhosts_pattern = \"r{{rack}}h{{host}}\"\nperiod_ms = 200\n\
             lease_ms = 3000\nmodbus_timeout_ms = 75\nconsole = {:?}\nflash = {:?}\n\
             console_password_hash = \"{hash}\"\n",
            broker.addr(),
            socket,
            dir.path().join("cdu.flash"),
        ),
    )
    .unwrap();
    let _child = Guard(
        Command::new(BIN)
            .arg("run")
            .arg("--config")
            .arg(&config)
            .arg("--console-serial")
            .arg(line.agent())
            .env("RUST_LOG", "info,rumqttc=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start cooling-ctrl run"),
    );
    let mut term = Terminal::open(&line.engineer());
    // Its first control step, for the tables to show.
    let t0 = Instant::now();
    while ctl_json(&socket, "sensors")["sensors"]
        .as_array()
        .is_none_or(|a| a.is_empty())
    {
        assert!(t0.elapsed() < WAIT, "no control step in {WAIT:?}");
        std::thread::sleep(Duration::from_millis(100));
    }

    // The banner, then help and a table.
    term.expect("Loopwarden cooling-ctrl", WAIT);
    term.expect("CDU cdu-1 of site hall-t", WAIT);
    term.expect("cdu-1> ", WAIT);
    term.send(b"help\r");
    let help = term.expect("cdu-1> ", WAIT);
    for line in [
        "clear-leak RACK *",
        "clear-pump A|B *",
        "events [--since T]",
        "logout",
    ] {
        assert!(help.contains(line), "{help}");
    }
    term.send(b"sensors\r\n");
    let table = term.expect("cdu-1> ", WAIT);
    assert!(table.contains("SENSOR"), "{table}");

    // Line noise: an arrow key, NUL, 8-bit bytes, BEL; then a command
    // still works, and an unknown one gets one line.
    term.send(b"\x1b[A\x00\xfe\xff\x07stax\x7ftus\r");
    let status = term.expect("cdu-1> ", WAIT);
    assert!(
        status.contains("tus\r\ncdu ") && status.contains("\r\nmode "),
        "{status:?}"
    );
    term.send(b"open-sesame\r");
    term.expect("unknown command \"open-sesame\": type help", WAIT);

    // A leak on rack 2 latches; the rope dries.
    cdu.set_measurement("leak_inputs", 4.0).unwrap();
    let t0 = Instant::now();
    while cdu.setting("valves_open").unwrap() != 11.0 {
        assert!(t0.elapsed() < WAIT, "rack 2's valve still open");
        std::thread::sleep(Duration::from_millis(20));
    }
    cdu.set_measurement("leak_inputs", 0.0).unwrap();
    std::thread::sleep(Duration::from_millis(400));

    // Refused before the login; a wrong password refused, not echoed.
    term.send(b"clear-leak 2\r");
    term.expect("refused: clear-leak changes state: log in first", WAIT);
    term.send(b"login\r");
    term.expect("password: ", WAIT);
    term.send(b"not the password\r");
    let refused = term.expect("cdu-1> ", WAIT);
    assert!(
        refused.contains("login refused (1 in a row)"),
        "{refused:?}"
    );
    assert!(!refused.contains("not the password"), "echoed: {refused:?}");
    // The next try after the 2 s lock.
    std::thread::sleep(Duration::from_millis(2_100));
    term.send(b"login\r");
    term.expect("password: ", WAIT);
    term.send(format!("{PASSWORD}\r").as_bytes());
    term.expect("logged in", WAIT);
    term.expect("cdu-1# ", WAIT);
    assert!(
        !term.transcript().contains(PASSWORD),
        "the password was echoed"
    );

    // The state change, done; then logout.
    term.send(b"clear-leak 2\r");
    let done = term.expect("cdu-1# ", WAIT);
    assert!(done.contains("rack 2: leak cleared"), "{done:?}");
    let t0 = Instant::now();
    while cdu.setting("valves_open").unwrap() != 15.0 {
        assert!(t0.elapsed() < WAIT, "rack 2 not reopened");
        std::thread::sleep(Duration::from_millis(20));
    }
    term.send(b"logout\r");
    term.expect("logged out", WAIT);
    term.expect("cdu-1> ", WAIT);

    // The flash log holds the session, the logins and the command; the
    // clear is in the serial port's name.
    let want = [
        "session_opened",
        "command",
        "login_refused",
        "login_accepted",
        "command",
        "session_closed:logout",
    ];
    let t0 = Instant::now();
    let v = loop {
        let v = ctl_json(&socket, "events");
        if console_records(&v) == want {
            break v;
        }
        assert!(t0.elapsed() < WAIT, "console records: {v:#}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let cleared = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"]["operator_cleared"]["rack"] == 2)
        .unwrap_or_else(|| panic!("no operator_cleared: {v:#}"));
    assert_eq!(
        cleared["event"]["operator_cleared"]["operator"],
        "serial-agent"
    );
    let text = String::from_utf8(
        Command::new(BIN)
            .args(["ctl", "--console"])
            .arg(&socket)
            .arg("events")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let port = line.agent().display().to_string();
    for sentence in [
        format!("serial console {port}: login refused (1 in a row)"),
        format!("serial console {port}: login accepted"),
        format!("serial console {port}: clear-leak 2: done — rack 2: leak cleared"),
        format!("serial console {port}: session closed (logout), was logged in"),
    ] {
        assert!(text.contains(&sentence), "no {sentence:?} in:\n{text}");
    }
}

#[test]
fn console_password_makes_a_hash_the_controller_takes() {
    let mut child = Command::new(BIN)
        .arg("console-password")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"a long password\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let hash = String::from_utf8(out.stdout).unwrap();
    assert!(hash.starts_with("$argon2id$"), "{hash}");
    assert!(loopwarden_field::serial::password::verify(
        hash.trim(),
        "a long password"
    ));
    let out = Command::new(BIN)
        .arg("console-password")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("shorter than 8"));
}
