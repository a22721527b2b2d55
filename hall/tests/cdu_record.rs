//! `loopwarden-hall cdu --record` as a process: a Modbus client
//! (tokio-modbus) writes the CDU's registers while a scenario with a leak
//! and a pump trip runs at 50 times real time, and the record holds each
//! write in order with its value (a refused one marked refused, with its
//! exception), the faults as they begin, and the CDU's own state changing
//! after the writes that change it: the leaking rack's valve closing, the
//! other pump starting, the fallback when the heartbeat stops and the
//! return when it changes again. Over RTU the record holds the writes to
//! its own unit id and broadcasts, and nothing sent to another unit.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use loopwarden_system_tests::serial_console::PtyPair;
use serde_json::Value;
use tokio::time::timeout;
use tokio_modbus::client::Context;
use tokio_modbus::prelude::*;

const HALL: &str = env!("CARGO_BIN_EXE_loopwarden-hall");

/// A leak on rack 1 at 30 s, pump A tripping at 120 s; the CDU falls
/// back 2 s (wall, at any speed above 1) after its heartbeat stops
/// changing.
const SCENARIO: &str = r#"
format = "plant-scenario/1"
description = "a leak on rack 1, then pump A trips"
duration_s = 3600
seed = 1

[truth.loop]
heartbeat_timeout_s = 2.0

[ambient]
points = [[0, 25.0]]

[load]
all = [[0, 0.5]]

[[fault]]
at_s = 30
kind = "leak"
target = "1"

[[fault]]
at_s = 120
kind = "pump_trip"
target = "A"
"#;

/// A child process, killed if the test ends early.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The CDU recording to `record`, serving where `listen` says, at 50
/// times real time: the process and its banner's first line.
fn start_cdu(dir: &Path, listen: &[&str], record: &Path) -> (Guard, String) {
    let scenario = dir.join("leak-and-trip.toml");
    std::fs::write(&scenario, SCENARIO).unwrap();
    let mut child = Guard(
        Command::new(HALL)
            .arg("cdu")
            .args(listen)
            .arg("--scenario")
            .arg(&scenario)
            .args(["--speed", "50", "--status-every", "1"])
            .arg("--record")
            .arg(record)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start loopwarden-hall cdu"),
    );
    let mut out = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let first = out
        .next()
        .expect("a banner")
        .expect("the banner reads as text");
    // Keep draining its standard output so it never blocks on a full pipe.
    std::thread::spawn(move || out.for_each(drop));
    (child, first)
}

/// Sends SIGTERM and waits up to 10 s for exit 0.
fn stop(child: &mut Guard) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            assert!(
                status.success(),
                "loopwarden-hall cdu after SIGTERM: {status}"
            );
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "still runs");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The record's whole lines so far.
fn record(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

/// Waits up to 20 s for a line of the record that `pred` accepts, after
/// the first `after` lines; its index.
async fn await_line(path: &Path, after: usize, what: &str, pred: impl Fn(&Value) -> bool) -> usize {
    let t0 = Instant::now();
    loop {
        if let Some(i) = record(path).iter().skip(after).position(&pred) {
            return after + i;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no {what} in the record: {:#?}",
            record(path)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn is<'a>(kind: &'a str, field: &'a str, v: Value) -> impl Fn(&Value) -> bool + 'a {
    move |l: &Value| l["kind"] == kind && l[field] == v
}

/// Writes one register; `true` when the CDU did it.
async fn write(ctx: &mut Context, addr: u16, words: &[u16]) -> bool {
    let answered = match words {
        [w] => ctx.write_single_register(addr, *w).await,
        _ => ctx.write_multiple_registers(addr, words).await,
    };
    answered.expect("the CDU answers").is_ok()
}

/// The port of `simulated CDU: serving Modbus TCP 127.0.0.1:PORT (…`.
fn served_addr(line: &str) -> SocketAddr {
    let rest = line
        .strip_prefix("simulated CDU: serving Modbus TCP ")
        .unwrap_or_else(|| panic!("{line}"));
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_holds_every_write_in_order_the_faults_and_what_the_cdu_did() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cdu.jsonl");
    let (mut cdu, first) = start_cdu(dir.path(), &["--modbus", "127.0.0.1:0"], &path);
    let addr = served_addr(&first);
    let mut ctx = tokio_modbus::client::tcp::connect_slave(addr, Slave(1))
        .await
        .expect("connect to the CDU");

    // Every valve open, a heartbeat; then the leak on rack 1.
    assert!(write(&mut ctx, 3, &[15]).await);
    assert!(write(&mut ctx, 5, &[1]).await);
    let leak = await_line(&path, 0, "leak", is("fault_begins", "fault", "leak".into())).await;
    // Rack 1's valve shut; the heartbeat changes (the hall saw its first
    // value as the CDU's own); a setpoint out of range (99 °C); setpoint
    // and pump speed in one write.
    assert!(write(&mut ctx, 3, &[13]).await);
    assert!(write(&mut ctx, 5, &[2]).await);
    assert!(!write(&mut ctx, 0, &[9900]).await);
    assert!(write(&mut ctx, 0, &[2500, 800]).await);
    // Pump A trips: pump B started.
    let trip = await_line(&path, 0, "pump A stopping", is("pump", "pump", "A".into())).await;
    assert!(write(&mut ctx, 4, &[2]).await);
    // The heartbeat stopped after its one change: the CDU falls back; a
    // new heartbeat brings it back.
    let beat = await_line(&path, leak, "heartbeat 2", |l| {
        is("write", "register", "heartbeat".into())(l) && l["value"] == 2
    })
    .await;
    let fell = await_line(&path, beat, "fallback", is("fallback", "on", true.into())).await;
    assert!(write(&mut ctx, 5, &[3]).await);
    let back = await_line(
        &path,
        fell,
        "the end of the fallback",
        is("fallback", "on", false.into()),
    )
    .await;
    stop(&mut cdu);

    let lines = record(&path);
    let writes: Vec<(usize, String, Value, bool)> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l["kind"] == "write")
        .map(|(i, l)| {
            let name = l["register"].as_str().unwrap().to_string();
            (i, name, l["value"].clone(), l["ok"].as_bool().unwrap())
        })
        .collect();
    let said: Vec<(&str, Value, bool)> = writes
        .iter()
        .map(|(_, r, v, ok)| (r.as_str(), v.clone(), *ok))
        .collect();
    assert_eq!(
        said,
        [
            ("valves_open", 15.into(), true),
            ("heartbeat", 1.into(), true),
            ("valves_open", 13.into(), true),
            ("heartbeat", 2.into(), true),
            ("supply_setpoint", 99.into(), false),
            ("supply_setpoint", 25.into(), true),
            ("pump_speed", 80.into(), true),
            ("pumps_run", 2.into(), true),
            ("heartbeat", 3.into(), true),
        ],
        "{lines:#?}"
    );
    let at = |k: usize| writes[k].0;
    let refused = &lines[at(4)];
    assert_eq!(refused["exception"], "Illegal data value");
    assert_eq!(refused["exception_code"], 3);
    assert!(lines[at(2)].get("exception").is_none());

    // The leak began before the write that shut its valve; the valve
    // closed as the plant moved, after that write.
    assert_eq!(lines[leak]["target"], "1");
    assert_eq!(lines[leak]["at_s"], 30);
    assert!(leak < at(2));
    let shut = lines
        .iter()
        .position(|l| l["kind"] == "valve" && l["rack"] == 1 && l["open"] == false)
        .expect("rack 1's valve closing");
    assert!(shut > at(2), "{lines:#?}");
    // Pump A stopped when its trip began; pump B started after the
    // write that told it to.
    assert_eq!(lines[trip]["running"], false);
    let tripped = lines
        .iter()
        .position(is("fault_begins", "fault", "pump_trip".into()))
        .unwrap();
    assert!(tripped <= trip && lines[tripped]["sim_ms"] == lines[trip]["sim_ms"]);
    let b = lines
        .iter()
        .position(|l| l["kind"] == "pump" && l["pump"] == "B" && l["running"] == true)
        .expect("pump B starting");
    assert!(b > at(7));
    // The fallback ended after the heartbeat changed again.
    assert!(fell > at(3) && back > at(8));

    // First the start, last the stop; both clocks never run backwards.
    assert_eq!(lines[0]["kind"], "start");
    assert_eq!(lines[0]["serving"], format!("Modbus TCP {addr}"));
    assert_eq!(
        lines[0]["valves_open"],
        serde_json::json!([false, false, false, false])
    );
    assert_eq!(lines.last().unwrap()["kind"], "stop");
    for clock in ["sim_ms", "wall_ms"] {
        let t: Vec<u64> = lines.iter().map(|l| l[clock].as_u64().unwrap()).collect();
        assert!(t.windows(2).all(|w| w[0] <= w[1]), "{clock}: {t:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_rtu_the_record_holds_its_own_unit_and_broadcasts_only() {
    let dir = tempfile::tempdir().unwrap();
    // The CDU serves on one end; the client (a BMS) opens the other.
    let Some(pair) = PtyPair::start() else {
        return;
    };
    let (cdu_end, bms_end) = (pair.agent(), pair.engineer());
    let path = dir.path().join("cdu.jsonl");
    let listen = ["--serial", cdu_end.to_str().unwrap(), "--unit", "7"];
    let (mut cdu, first) = start_cdu(dir.path(), &listen, &path);
    assert!(first.contains("(unit id 7;"), "{first}");
    let port =
        tokio_serial::SerialStream::open(&tokio_serial::new(bms_end.to_str().unwrap(), 19_200))
            .expect("open the client's end");
    let mut ctx = tokio_modbus::client::rtu::attach_slave(port, Slave(7));
    let wait = Duration::from_millis(500);

    // Its own unit: done and answered.
    assert_eq!(timeout(wait, write(&mut ctx, 3, &[13])).await, Ok(true));
    // Another unit: no answer. A broadcast: done, unanswered.
    ctx.set_slave(Slave(8));
    assert!(timeout(wait, ctx.write_single_register(3, 1))
        .await
        .is_err());
    ctx.set_slave(Slave::broadcast());
    assert!(timeout(wait, ctx.write_single_register(5, 42))
        .await
        .is_err());
    await_line(
        &path,
        0,
        "the broadcast",
        is("write", "register", "heartbeat".into()),
    )
    .await;
    stop(&mut cdu);

    let lines = record(&path);
    let writes: Vec<(Value, Value)> = lines
        .iter()
        .filter(|l| l["kind"] == "write")
        .map(|l| (l["register"].clone(), l["value"].clone()))
        .collect();
    assert_eq!(
        writes,
        [
            ("valves_open".into(), 13.into()),
            ("heartbeat".into(), 42.into()),
        ],
        "{lines:#?}"
    );
    assert!(lines[0]["serving"]
        .as_str()
        .unwrap()
        .starts_with(&format!("Modbus RTU {}", cdu_end.display())));
}

#[test]
fn a_record_that_cannot_be_created_stops_the_cdu_before_it_serves() {
    let out = Command::new(HALL)
        .args([
            "cdu",
            "--modbus",
            "127.0.0.1:0",
            "--record",
            "/nonexistent/dir/cdu.jsonl",
        ])
        .output()
        .expect("run loopwarden-hall cdu");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(
            "loopwarden-hall cdu: --record /nonexistent/dir/cdu.jsonl: cannot create it: "
        ),
        "{err}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
