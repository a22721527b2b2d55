//! `cooling-ctrl run` with its northbound Modbus address and its
//! `/metrics` address taken by another process: the controller still
//! starts and drives the CDU (its console answers with steps run), logs
//! each address and the OS's reason, and serves both once they are free;
//! `/metrics` then counts the northbound server's failed binds.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use loopwarden_bus::embedded::EmbeddedBroker;
use loopwarden_system_tests::{serve_sim_cdu, steady_sim_cdu};

const BIN: &str = env!("CARGO_BIN_EXE_cooling-ctrl");

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The answer to `GET /metrics` on `addr`, if it answers.
fn scrape(addr: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text)
}

/// Waits up to 90 s for `f`, saying `what` and the log if it never holds.
fn wait_for<T>(what: &str, log: &std::path::Path, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "{what}: never; log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn taken_northbound_and_metrics_addresses_do_not_stop_the_controller() {
    let cdu = steady_sim_cdu();
    let (_rt, modbus) = serve_sim_cdu(&cdu);
    let broker = EmbeddedBroker::start("127.0.0.1:0".parse().unwrap()).expect("a broker");
    let dir = tempfile::tempdir().unwrap();
    let taken_nb = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_metrics = TcpListener::bind("127.0.0.1:0").unwrap();
    let (nb, metrics) = (
        taken_nb.local_addr().unwrap(),
        taken_metrics.local_addr().unwrap(),
    );
    let socket = dir.path().join("cdu.sock");
    let config = dir.path().join("cdu.toml");
    std::fs::write(
        &config,
        format!(
            "site = \"hall-t\"\ncdu = \"cdu-1\"\nbroker = \"{}\"\ndemo_key = true\n\
             cdu_tcp = \"{modbus}\"\nhosts_pattern = \"r{{rack}}h{{host}}\"\nperiod_ms = 200\n\
             lease_ms = 3000\nmodbus_timeout_ms = 75\nambient_c = 20\nconsole = {:?}\n\
             flash = {:?}\nnorthbound = \"{nb}\"\nmetrics_listen = \"{metrics}\"\n",
            broker.addr(),
            socket,
            dir.path().join("cdu.flash"),
        ),
    )
    .unwrap();
    let log = dir.path().join("cdu.log");
    let mut child = Guard(
        Command::new(BIN)
            .args(["run", "--config"])
            .arg(&config)
            .env("RUST_LOG", "info,rumqttc=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start cooling-ctrl run"),
    );
    // It drives the CDU: steps complete, the console answers.
    wait_for("steps run", &log, || {
        assert!(child.0.try_wait().unwrap().is_none(), "still running");
        let out = Command::new(BIN)
            .args(["ctl", "--console"])
            .arg(&socket)
            .args(["status", "--json"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        (v["steps"].as_u64() >= Some(2)).then_some(())
    });
    let text = std::fs::read_to_string(&log).unwrap();
    for (name, addr) in [
        ("northbound Modbus server", nb),
        ("metrics listener", metrics),
    ] {
        assert!(
            text.contains(&format!("{name} on {addr}: cannot listen")),
            "{name}: the address and the reason in the log:\n{text}"
        );
    }
    drop((taken_nb, taken_metrics));
    let answer = wait_for("/metrics served", &log, || {
        scrape(metrics).filter(|a| a.contains("loopwarden_cdu_"))
    });
    let failed = answer
        .lines()
        .find(|l| {
            l.starts_with("loopwarden_listener_bind_failures_total")
                && l.contains(r#"listener="northbound""#)
        })
        .unwrap_or_else(|| panic!("no northbound bind failures in:\n{answer}"));
    let n: f64 = failed.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 1.0, "{failed}");
    wait_for("the northbound server listening", &log, || {
        TcpStream::connect_timeout(&nb, Duration::from_secs(2)).ok()
    });
    assert!(child.0.try_wait().unwrap().is_none(), "still running");
}
