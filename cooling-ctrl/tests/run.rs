//! `cooling-ctrl run` as a process: the simulated CDU served on Modbus TCP
//! from the test, a broker embedded in the test process, a config file.
//! The controller boots, writes its settings into the CDU, answers
//! `ctl status|sensors|loops|caps|events`, closes a leaking rack's valve
//! and caps its hosts, stops with exit 0 on SIGTERM, and after a restart
//! on the same flash file `ctl events` still shows what happened before.

mod bms_client;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use loopwarden_bus::embedded::EmbeddedBroker;
use loopwarden_twin::sim_cdu::SimCdu;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_cooling-ctrl");

/// A CDU at full flow whose supply sits well above the boot setpoint.
use loopwarden_system_tests::{serve_sim_cdu, steady_sim_cdu as sim_cdu};

struct Rig {
    _rt: tokio::runtime::Runtime,
    _broker: EmbeddedBroker,
    cdu: SimCdu,
    dir: tempfile::TempDir,
    config: PathBuf,
    socket: PathBuf,
}

impl Rig {
    fn start() -> Rig {
        Self::start_with("")
    }

    /// A rig whose config file ends with `extra`.
    fn start_with(extra: &str) -> Rig {
        let cdu = sim_cdu();
        let (rt, modbus) = serve_sim_cdu(&cdu);
        let broker = EmbeddedBroker::start("127.0.0.1:0".parse().unwrap()).expect("a broker");
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("cdu.sock");
        let config = dir.path().join("cdu.toml");
        std::fs::write(
            &config,
            format!(
                "# the controller of the test\nsite = \"hall-t\"\ncdu = \"cdu-1\"\n\
                 broker = \"{}\"\ndemo_key = true\ncdu_tcp = \"{modbus}\"\n\
                 hosts_pattern = \"r{{rack}}h{{host}}\"\nperiod_ms = 200\nlease_ms = 3000\n\
                 modbus_timeout_ms = 75\nambient_c = 20\nconsole = {:?}\nflash = {:?}\n{extra}",
                broker.addr(),
                socket,
                dir.path().join("cdu.flash"),
            ),
        )
        .unwrap();
        Rig {
            _rt: rt,
            _broker: broker,
            cdu,
            dir,
            config,
            socket,
        }
    }

    fn spawn(&self) -> Child {
        Command::new(BIN)
            .arg("run")
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "info,rumqttc=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start cooling-ctrl run")
    }

    fn ctl(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("ctl")
            .arg("--console")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run cooling-ctrl ctl")
    }

    fn json(&self, args: &[&str]) -> Option<Value> {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.ctl(&a);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Asks until `f` holds, for up to 15 s.
    fn wait(&self, what: &str, args: &[&str], mut f: impl FnMut(&Value) -> bool) -> Value {
        let t0 = Instant::now();
        loop {
            if let Some(v) = self.json(args) {
                if f(&v) {
                    return v;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(15),
                    "{what}: still {v:#}"
                );
            } else {
                assert!(
                    t0.elapsed() < Duration::from_secs(15),
                    "{what}: the console does not answer"
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn stop(child: &mut Child) {
    let pid = child.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit after SIGTERM: {status}");
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "still running 10 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn has_event(v: &Value, f: impl Fn(&Value) -> bool) -> bool {
    v["events"]
        .as_array()
        .is_some_and(|a| a.iter().any(|e| f(&e["event"])))
}

#[test]
fn run_boots_drives_the_cdu_answers_the_console_and_stops_on_sigterm() {
    let rig = Rig::start();
    let mut child = Guard(rig.spawn());

    // It boots and the console says so.
    let status = rig.wait("a status with a mode", &["status"], |v| {
        v["mode"].is_string()
            && v["steps"].as_u64() >= Some(2)
            && v["cdu_link"]["answering"] == true
    });
    assert_eq!(status["cdu"], "cdu-1");
    assert_eq!(status["hosts"], 16);
    assert_eq!(status["demo_key"], true);
    assert!(status["supply_c"]
        .as_f64()
        .is_some_and(|t| (t - 40.0).abs() < 0.01));
    assert!(status["pue"]
        .as_f64()
        .is_some_and(|p| (p - 1.125).abs() < 0.001));

    // It wrote its settings into the CDU: the setpoint it reports, and
    // every valve open.
    let setpoint = status["setpoint_c"].as_f64().unwrap();
    let t0 = Instant::now();
    while (rig.cdu.setting("supply_setpoint").unwrap() - setpoint).abs() > 0.6 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the CDU's setpoint {} is not the controller's {setpoint}",
            rig.cdu.setting("supply_setpoint").unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(rig.cdu.setting("valves_open").unwrap(), 15.0);

    // The other views answer, as JSON and as tables.
    let sensors = rig.json(&["sensors"]).expect("sensors");
    let list = sensors["sensors"].as_array().unwrap();
    assert_eq!(list.len(), 4, "{sensors:#}");
    assert_eq!(list[0]["sensor"], "supply_temp");
    assert_eq!(list[0]["reading"], 40.0);
    let loops = rig.json(&["loops"]).expect("loops");
    assert!(loops["proposal"]["setpoint_c"].is_number(), "{loops:#}");
    let caps = rig.json(&["caps"]).expect("caps");
    assert_eq!(caps["hosts"].as_array().unwrap().len(), 16, "{caps:#}");
    assert_eq!(caps["hosts"][5]["host"], "r1h1");
    for (args, header) in [
        (&["status"][..], "mode"),
        (&["sensors"][..], "SENSOR"),
        (&["loops"][..], "optimiser"),
        (&["caps"][..], "CAP ASKED"),
    ] {
        let out = rig.ctl(args);
        assert!(out.status.success(), "ctl {args:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains(header), "ctl {args:?}:\n{text}");
        assert_no_debug_text(&text);
    }

    // A leak on rack 2: its valve closes, its hosts are capped, and the
    // console shows both.
    rig.cdu.set_measurement("leak_inputs", 4.0).unwrap();
    let t0 = Instant::now();
    while rig.cdu.setting("valves_open").unwrap() != 11.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "rack 2's valve still open"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let caps = rig.wait("rack 2's hosts capped", &["caps"], |v| {
        (8..12).all(|h| v["hosts"][h]["sent_w"].is_number())
    });
    assert_eq!(caps["hosts"][8]["asked_w"], 200.0, "{caps:#}");
    assert_eq!(caps["hosts"][8]["reason"], "cooling-lost", "{caps:#}");
    let status = rig.json(&["status"]).unwrap();
    assert_eq!(
        status["leaks_latched"],
        serde_json::json!([2]),
        "{status:#}"
    );
    rig.wait("the leak and the leases in the log", &["events"], |v| {
        has_event(v, |e| e["leak"]["rack"] == 2)
            && has_event(v, |e| e["lease_sent"]["host"] == "r2h0")
    });

    // The operator cannot reopen the rack while its input reads wet; once
    // it is dry, they can.
    let out = rig.ctl(&["clear-leak", "2"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("refused") && text.contains("wet"), "{text}");
    assert_eq!(rig.cdu.setting("valves_open").unwrap(), 11.0);
    rig.cdu.set_measurement("leak_inputs", 0.0).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(rig.cdu.setting("valves_open").unwrap(), 11.0, "latched");
    let out = rig.ctl(&["clear-leak", "2"]);
    assert!(out.status.success(), "{out:?}");
    let t0 = Instant::now();
    while rig.cdu.setting("valves_open").unwrap() != 15.0 {
        assert!(t0.elapsed() < Duration::from_secs(3), "rack 2 not reopened");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The clear is in the flash log, with who asked.
    let uid = String::from_utf8(Command::new("id").arg("-u").output().unwrap().stdout).unwrap();
    let who = format!("uid-{}", uid.trim());
    rig.wait("the clear in the log", &["events"], |v| {
        has_event(v, |e| {
            e["operator_cleared"]["rack"] == 2 && e["operator_cleared"]["operator"] == who.as_str()
        })
    });
    let out = rig.ctl(&["clear-pump", "C"]);
    assert_eq!(out.status.code(), Some(1), "no pump C: {out:?}");
    // While the CDU does not answer, whether it still shows a pump's
    // fault is unknown: no clear is taken.
    rig.cdu.set_cut(true);
    rig.wait("the CDU silent", &["status"], |v| {
        v["cdu_link"]["answering"] == false
    });
    let out = rig.ctl(&["clear-pump", "A"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("unknown"), "{text}");
    rig.cdu.set_cut(false);
    rig.wait("the CDU answering again", &["status"], |v| {
        v["cdu_link"]["answering"] == true
    });

    stop(&mut child.0);
    assert!(
        !Path::new(&rig.socket).exists(),
        "the console socket is removed at exit"
    );

    // A restart on the same flash still shows what happened.
    let mut child = Guard(rig.spawn());
    let events = rig.wait("the log after a restart", &["events"], |v| {
        has_event(v, |e| e["leak"]["rack"] == 2)
    });
    assert!(has_event(&events, |e| e["lease_sent"]["host"] == "r2h0"));
    let out = rig.ctl(&["events"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("r2h0: lease "), "{text}");
    assert!(text.contains("all GPUs to 200 W for "), "{text}");
    assert!(text.contains("rack 2: leak detected"), "{text}");
    assert_no_debug_text(&text);
    let since_now = rig.json(&["events", "--since", "0s"]).unwrap();
    assert!(
        since_now["events"].as_array().unwrap().len() < events["events"].as_array().unwrap().len()
    );
    stop(&mut child.0);
    drop(rig.dir);
}

#[test]
fn run_refuses_a_bad_config_with_file_and_line_and_without_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    // `run` with `text` as its configuration file: refused (status 2),
    // and what it said.
    let refused = |text: &str| {
        std::fs::write(&config, text).unwrap();
        let out = Command::new(BIN)
            .args(["run", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = refused(
        "cdu = \"c\"\ndemo_key = true\ncdu_tcp = \"127.0.0.1:1\"\nembedded_broker = true\nperiod_ms = 5\n",
    );
    assert!(
        err.contains("bad.toml line 5: period_ms = 5 is out of range"),
        "{err}"
    );
    let err = refused("cdu = \"c\"\ncdu_tcp = \"127.0.0.1:1\"\n");
    assert!(
        err.contains("no sign key") && err.contains("--demo-key"),
        "{err}"
    );
}

#[test]
fn ctl_without_a_controller_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["ctl", "--console"])
        .arg(dir.path().join("none.sock"))
        .arg("status")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the controller"));
}

#[test]
fn run_serves_the_bms_on_northbound_modbus_and_takes_a_bounded_ceiling() {
    use tokio_modbus::client::{Reader, Writer};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let rig = Rig::start_with(&format!(
        "northbound = \"{addr}\"\nnorthbound_writes = true\n"
    ));
    let mut child = Guard(rig.spawn());
    rig.wait("a status with a mode", &["status"], |v| {
        v["steps"].as_u64() >= Some(2)
    });
    let (rt, mut ctx) = bms_client::connect(addr);
    rt.block_on(async {
        let regs = ctx
            .read_input_registers(0, 33)
            .await
            .unwrap()
            .expect("no exception");
        assert!(regs[0] <= 3, "a mode: {regs:?}");
        assert_eq!(regs[7], 4000, "supply 40.00 °C as the CDU reads it");
        assert_eq!(regs[32], 1, "writes enabled");
        // The BMS bounds the setpoint at 20 °C: the CDU is asked no more.
        ctx.write_single_register(0, 2000)
            .await
            .unwrap()
            .expect("accepted");
        // Out of range: exception 3, nothing changes.
        let refused = ctx.write_single_register(0, 5000).await.unwrap();
        assert!(refused.is_err(), "{refused:?}");
    });
    let t0 = Instant::now();
    while rig.cdu.setting("supply_setpoint").unwrap() > 20.0 + 1e-6 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the CDU's setpoint {} is above the BMS's ceiling",
            rig.cdu.setting("supply_setpoint").unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    stop(&mut child.0);
}

/// The twin's hall behind the simulated CDU, stepped ten times faster than
/// real time (one simulated second per 100 ms) until dropped.
struct HallRunning {
    hall: std::sync::Arc<std::sync::Mutex<loopwarden_twin::hall::Hall>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl HallRunning {
    fn start(scenario: &str, cdu: SimCdu) -> Self {
        use loopwarden_boards::pins::PinMap;
        use loopwarden_twin::hall::Hall;
        use loopwarden_twin::pins::SimLines;
        use loopwarden_twin::scenario::Scenario;
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        let sc = Scenario::from_toml(scenario, "kill.toml").expect("a scenario");
        let hall = Arc::new(Mutex::new(Hall::new(
            sc,
            cdu,
            SimLines::new(),
            PinMap::sim_controller(),
        )));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, s) = (hall.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                h.lock().unwrap().step(1.0).expect("the hall steps");
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Self { hall, stop }
    }

    fn time_s(&self) -> f64 {
        self.hall.lock().unwrap().time_s()
    }

    fn in_fallback(&self) -> bool {
        self.hall.lock().unwrap().in_fallback()
    }

    /// Waits up to `real` for `f` to hold.
    fn wait(&self, what: &str, real: Duration, mut f: impl FnMut(&Self) -> bool) {
        let t0 = Instant::now();
        while !f(self) {
            assert!(t0.elapsed() < real, "{what}: not within {real:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for HallRunning {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success(), "kill {sig}");
}

#[test]
fn a_killed_controller_keeps_a_latched_valve_shut_and_a_hung_one_hands_the_cdu_its_fallback() {
    let rig = Rig::start();
    // Rack 2 leaks from 30 s to 80 s of the hall's time, then its rope dries.
    let hall = HallRunning::start(
        "format = \"plant-scenario/1\"\ndescription = \"kill\"\nduration_s = 100000\nseed = 1\n\
         [ambient]\npoints = [[0, 22.0]]\n[load]\nall = [[0, 0.6]]\n\
         [[fault]]\nat_s = 30\nuntil_s = 80\nkind = \"leak\"\ntarget = \"2\"\n",
        rig.cdu.clone(),
    );
    let mut child = Guard(rig.spawn());
    let valves = || rig.cdu.setting("valves_open").unwrap();
    hall.wait(
        "rack 2's valve shut for its leak",
        Duration::from_secs(15),
        |_| valves() == 11.0,
    );
    rig.wait("the leak latched", &["status"], |v| {
        v["leaks_latched"] == serde_json::json!([2])
    });
    // Its position confirms: no escalation, the pumps keep running.
    std::thread::sleep(Duration::from_millis(800));
    assert_ne!(rig.cdu.setting("pumps_run").unwrap(), 0.0);

    // kill -9, and the rope dries while it is down.
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    hall.wait("the rope dry", Duration::from_secs(15), |h| {
        h.time_s() > 85.0
    });
    assert!(
        hall.in_fallback(),
        "the CDU runs on its own without the heartbeat"
    );
    assert_eq!(valves(), 11.0, "the CDU keeps its valves");

    // Restarted: the valve stays shut, and the log shows the restart.
    let mut child = Guard(rig.spawn());
    rig.wait("running again", &["status"], |v| {
        v["steps"].as_u64() >= Some(10)
    });
    hall.wait("the CDU under control again", Duration::from_secs(5), |h| {
        !h.in_fallback()
    });
    for _ in 0..10 {
        assert_eq!(valves(), 11.0, "a restart never reopens a latched valve");
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = rig.json(&["status"]).unwrap();
    assert_eq!(
        status["leaks_latched"],
        serde_json::json!([2]),
        "{status:#}"
    );
    rig.wait("the restore in the flash log", &["events"], |v| {
        has_event(v, |e| e["controller_restored"]["leaks_latched"] == 4)
    });

    // Hung (SIGSTOP): no heartbeat, no relay pulse; the CDU falls back
    // within its timeout, and is taken back when the loop runs again.
    signal(&child.0, "-STOP");
    hall.wait("the CDU's fallback", Duration::from_secs(4), |h| {
        h.in_fallback()
    });
    assert_eq!(valves(), 11.0);
    signal(&child.0, "-CONT");
    hall.wait("control back", Duration::from_secs(5), |h| !h.in_fallback());
    stop(&mut child.0);
}

/// What a person reads has no Rust debug text or raw JSON in it.
fn assert_no_debug_text(text: &str) {
    for bad in ["{", "}", "Some(", "None", "\"auth\""] {
        assert!(
            !text.contains(bad),
            "{bad:?} in the console's answer:\n{text}"
        );
    }
}
