//! `loopwarden-hall cdu` as a process, with the real `cooling-ctrl run`
//! process driving it over Modbus TCP through a broker embedded in the
//! test, on the committed example config (`deploy/examples/sim-cdu.toml`,
//! its addresses given as flags). The controller reads the CDU (its
//! console shows the CDU's supply), writes its settings (the CDU's
//! setpoint register and the status line carry the controller's setpoint,
//! its heartbeat register counts), both stop with exit 0 on SIGTERM.
//!
//! The `cooling-ctrl` binary is the one beside `loopwarden-hall` in the
//! target directory: `cargo test --workspace` builds it (its own package's
//! tests need it); for `cargo test -p loopwarden-hall`, build it first with
//! `cargo build -p cooling-ctrl`. Without it the test is skipped, and fails
//! under CI=true.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loopwarden_bus::embedded::EmbeddedBroker;
use loopwarden_system_tests::{mbpoll, mbpoll_values, require_tool};
use serde_json::Value;

const HALL: &str = env!("CARGO_BIN_EXE_loopwarden-hall");

/// The `cooling-ctrl` binary beside `loopwarden-hall`, or `None` (skip)
/// when it was not built, outside CI.
fn cooling_ctrl() -> Option<PathBuf> {
    let bin = Path::new(HALL).with_file_name("cooling-ctrl");
    if bin.is_file() {
        return Some(bin);
    }
    let why = format!(
        "{} is missing: build it with `cargo build -p cooling-ctrl` (cargo test --workspace does)",
        bin.display()
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{why}");
    }
    eprintln!("skipped: {why}");
    None
}

/// A child process, killed if the test ends early.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends SIGTERM and waits up to 10 s for exit 0.
fn stop(child: &mut Guard, what: &str) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success(), "kill {what}");
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            assert!(status.success(), "{what} after SIGTERM: {status}");
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{what} still runs");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The simulated CDU: the process, its TCP port (0 on a serial line) and
/// every line it printed.
struct Cdu {
    child: Guard,
    port: u16,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Cdu {
    /// On a free loopback port.
    fn start() -> Cdu {
        Self::start_with(&["--modbus", "127.0.0.1:0"])
    }

    /// Serving where `listen` says, 10 times real time.
    fn start_with(listen: &[&str]) -> Cdu {
        let mut child = Guard(
            Command::new(HALL)
                .arg("cdu")
                .args(listen)
                .args(["--speed", "10", "--status-every", "0.5"])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start loopwarden-hall cdu"),
        );
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let out = BufReader::new(child.0.stdout.take().unwrap());
        let kept = lines.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if line.starts_with("simulated CDU: serving ") {
                    let _ = tx.send(served_port(&line).unwrap_or(0));
                }
                kept.lock().unwrap().push(line);
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no serving line: {:?}", lines.lock().unwrap()));
        let cdu = Cdu { child, port, lines };
        // The banner is whole once the first status line follows it.
        let t0 = Instant::now();
        while !cdu.printed().iter().any(|l| l.starts_with("t=")) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "no status line: {:?}",
                cdu.printed()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        cdu
    }

    fn printed(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

/// The port of `simulated CDU: serving Modbus TCP 127.0.0.1:PORT (…`.
fn served_port(line: &str) -> Option<u16> {
    let rest = line.strip_prefix("simulated CDU: serving Modbus TCP 127.0.0.1:")?;
    rest.split_whitespace().next()?.parse().ok()
}

/// `cooling-ctrl ctl --console SOCK status --json`, if it answers.
fn status(bin: &Path, socket: &Path) -> Option<Value> {
    let out = Command::new(bin)
        .arg("ctl")
        .arg("--console")
        .arg(socket)
        .args(["status", "--json"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())?
}

/// The CDU's holding registers 0-5 (setpoint, speed, lead, valves, pumps,
/// heartbeat) as `mbpoll` reads them.
fn holding(port: u16) -> Vec<i64> {
    let (ok, text) = mbpoll(port, &["-t", "4", "-r", "0", "-c", "6", "127.0.0.1"]);
    assert!(ok, "{text}");
    let v = mbpoll_values(&text);
    assert_eq!(v.len(), 6, "{text}");
    v
}

#[test]
fn cooling_ctrl_run_reads_and_drives_the_simulated_cdu_of_loopwarden_hall_cdu() {
    let Some(ctrl) = cooling_ctrl() else { return };
    if require_tool("mbpoll").is_none() {
        return;
    }
    let cdu = Cdu::start();
    let banner = cdu.printed();
    assert!(banner.iter().any(|l| l.contains("unit id 1")), "{banner:?}");
    assert!(
        banner
            .iter()
            .any(|l| l.starts_with("register map: boards/cdus/sim-cdu.toml")),
        "{banner:?}"
    );
    // At rest, before any controller: 18 °C, pumps at 100 %, pump A.
    assert_eq!(holding(cdu.port)[..5], [1800, 1000, 0, 0, 1]);

    let broker = EmbeddedBroker::start("127.0.0.1:0".parse().unwrap()).expect("a broker");
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cdu.sock");
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/sim-cdu.toml");
    let mut controller = Guard(
        Command::new(&ctrl)
            .args(["run", "--config"])
            .arg(&config)
            .args(["--broker", &broker.addr().to_string()])
            .args(["--cdu-tcp", &format!("127.0.0.1:{}", cdu.port)])
            .args(["--northbound", "127.0.0.1:0"])
            .arg("--console")
            .arg(&socket)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start cooling-ctrl run"),
    );

    // The controller reads the CDU: its console shows the link answering
    // and the supply the CDU reports.
    let t0 = Instant::now();
    let st = loop {
        if let Some(v) = status(&ctrl, &socket) {
            if v["cdu_link"]["answering"] == true && v["supply_c"].is_f64() {
                break v;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the controller does not read the CDU: {:?}",
            status(&ctrl, &socket)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let supply = st["supply_c"].as_f64().unwrap();
    assert!((10.0..40.0).contains(&supply), "supply {supply} °C");

    // It writes: the setpoint register and the CDU's status line carry
    // the controller's setpoint, and the heartbeat register counts.
    let t0 = Instant::now();
    let (setpoint, first) = loop {
        let st = status(&ctrl, &socket).expect("the console answers");
        let setpoint = st["setpoint_c"].as_f64().unwrap();
        let regs = holding(cdu.port);
        if (regs[0] as f64 / 100.0 - setpoint).abs() < 0.6 && regs[0] != 1800 {
            break (setpoint, regs);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the CDU's setpoint {regs:?} is not the controller's {setpoint}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(first[3], 15, "every rack's valve open");
    let t0 = Instant::now();
    while holding(cdu.port)[5] == first[5] {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the heartbeat stays {}",
            first[5]
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let t0 = Instant::now();
    let shown = format!("setpoint {:.2} °C", first[0] as f64 / 100.0);
    while !cdu.printed().iter().any(|l| l.contains(&shown)) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no status line with {shown}: {:?}",
            cdu.printed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    stop(&mut controller, "cooling-ctrl run");
    let mut cdu = cdu;
    stop(&mut cdu.child, "loopwarden-hall cdu");
    // Its last line, once the reader has it.
    let t0 = Instant::now();
    while cdu.printed().last().map(String::as_str) != Some("simulated CDU: stopped") {
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", cdu.printed());
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = setpoint;
}

/// `loopwarden-hall cdu ARGS` run to its end: exit status and stderr.
fn refused(args: &[&str]) -> (bool, String) {
    let out = Command::new(HALL)
        .arg("cdu")
        .args(args)
        .output()
        .expect("run loopwarden-hall cdu");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_port_in_use_a_missing_device_and_a_bad_unit_say_what_failed() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (ok, err) = refused(&["--modbus", &addr]);
    assert!(!ok, "{err}");
    assert!(
        err.starts_with(&format!(
            "loopwarden-hall cdu: Modbus TCP {addr}: cannot listen: Address already in use"
        )),
        "{err}"
    );
    let (ok, err) = refused(&["--serial", "/nonexistent/ttyCDU"]);
    assert!(!ok, "{err}");
    assert!(
        err.starts_with(
            "loopwarden-hall cdu: Modbus RTU /nonexistent/ttyCDU: cannot open the serial device: "
        ),
        "{err}"
    );
    let (ok, err) = refused(&["--modbus", "127.0.0.1:0", "--unit", "0"]);
    assert!(!ok, "{err}");
    assert_eq!(
        err,
        "loopwarden-hall cdu: --unit 0: a unit id is 1 to 247\n"
    );
}

#[test]
fn on_a_serial_line_it_answers_its_unit_id_only() {
    let (Some(socat), Some(_)) = (require_tool("socat"), require_tool("mbpoll")) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let end = |n: &str| format!("pty,raw,echo=0,link={}", dir.path().join(n).display());
    let _socat = Guard(
        Command::new(socat)
            .args([&end("cdu"), &end("bms")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start socat"),
    );
    let (cdu_end, bms_end) = (dir.path().join("cdu"), dir.path().join("bms"));
    let t0 = Instant::now();
    while !(cdu_end.exists() && bms_end.exists()) {
        assert!(t0.elapsed() < Duration::from_secs(5), "no pseudo-terminals");
        std::thread::sleep(Duration::from_millis(20));
    }
    let cdu = Cdu::start_with(&["--serial", cdu_end.to_str().unwrap(), "--unit", "7"]);
    let banner = cdu.printed();
    assert!(
        banner[0].starts_with(&format!(
            "simulated CDU: serving Modbus RTU {} 19200 8N1 (unit id 7;",
            cdu_end.display()
        )),
        "{banner:?}"
    );
    let poll = |unit: &str| {
        let out = Command::new("mbpoll")
            .args([
                "-m", "rtu", "-b", "19200", "-P", "none", "-0", "-1", "-o", "0.5",
            ])
            .args(["-a", unit, "-t", "4", "-r", "0", "-c", "2"])
            .arg(&bms_end)
            .output()
            .expect("run mbpoll");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    // Its own unit: the setpoint and the pump speed at rest.
    let (ok, text) = poll("7");
    assert!(ok, "{text}");
    assert_eq!(mbpoll_values(&text), vec![1800, 1000], "{text}");
    // Another unit on the same line: no answer.
    let (ok, text) = poll("8");
    assert!(!ok, "{text}");
    assert!(mbpoll_values(&text).is_empty(), "{text}");
    let mut cdu = cdu;
    stop(&mut cdu.child, "loopwarden-hall cdu");
}
