//! The Sparkplug B bridge through a real mosquitto, read by a Sparkplug
//! host application built on a decoder nobody here wrote (Python's
//! `pysparkplug`, `tests/sparkplug_read.py`): a CDU and a host publish
//! their frames as the agents do, and the bridge's NBIRTH, DBIRTHs,
//! DDATA, DDEATH, rebirth and NDEATH (its will after SIGKILL, its own
//! goodbye after SIGTERM) are checked as that reader decodes them.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use loopwarden_bus::tls::{Tls, TlsFiles};
use loopwarden_bus::{now_ms, Bus, BusConfig, BusTask};
use loopwarden_protocol::{
    samples, Celsius, Ident, Message, MessageKind, NodeId, Role, WholeCelsius,
};
use loopwarden_system_tests::{repo_root, require_python_module, CutProxy, Mosquitto, PkiBroker};
use serde_json::Value;

const SITE: &str = "t-spb";
const EDGE: &str = "lw-test";

/// The Python host application: every Sparkplug message it decoded, in
/// order of arrival.
struct Reader {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<Value>,
    seen: Vec<Value>,
}

impl Reader {
    fn start(python: &Path, port: u16) -> Reader {
        let mut child = Command::new(python)
            .arg(repo_root().join("tests/sparkplug_read.py"))
            .arg(port.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start sparkplug_read.py");
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take().expect("piped stdin");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("reader printed {line:?}: {e}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        let mut reader = Reader {
            child,
            stdin,
            lines: rx,
            seen: Vec::new(),
        };
        reader.wait("the reader's subscription", |s| {
            s.iter().any(|m| m["type"] == "READY")
        });
        reader
    }

    /// Reads until `done` holds for everything seen so far (10 s at most).
    fn wait(&mut self, what: &str, done: impl FnMut(&[Value]) -> bool) {
        if !self.wait_for(Duration::from_secs(10), done) {
            panic!("no {what} in 10 s; seen:\n{}", self.dump());
        }
    }

    /// Reads until `done` holds, or `span` passed: whether it holds.
    fn wait_for(&mut self, span: Duration, mut done: impl FnMut(&[Value]) -> bool) -> bool {
        let deadline = Instant::now() + span;
        while !done(&self.seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(m) => {
                    assert_ne!(m["type"], "ERROR", "the reader could not decode: {m}");
                    self.seen.push(m);
                }
                Err(_) => return false,
            }
        }
        true
    }

    /// Waits for the next message (after `from`) of `kind`, for `device`.
    fn next(&mut self, from: usize, kind: &str, device: Option<&str>) -> (usize, Value) {
        let find = |s: &[Value]| {
            s.iter()
                .enumerate()
                .skip(from)
                .find(|(_, m)| m["type"] == kind && m["device"].as_str() == device)
                .map(|(i, m)| (i, m.clone()))
        };
        self.wait(&format!("{kind} of {device:?}"), |s| find(s).is_some());
        find(&self.seen).expect("just seen")
    }

    /// Reads for `span` and returns what arrived.
    fn quiet_for(&mut self, span: Duration) -> Vec<Value> {
        let start = self.seen.len();
        let deadline = Instant::now() + span;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if let Ok(m) = self.lines.recv_timeout(left) {
                self.seen.push(m);
            }
        }
        self.seen[start..].to_vec()
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write to the reader");
    }

    fn dump(&self) -> String {
        let lines: Vec<String> = self.seen.iter().map(|m| m.to_string()).collect();
        lines.join("\n")
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The bridge as a process, killed if a failing test leaves it running.
struct BridgeProcess(Child);

impl Drop for BridgeProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_bridge(port: u16) -> BridgeProcess {
    start_bridge_with(port, &[])
}

fn start_bridge_with(port: u16, more: &[&str]) -> BridgeProcess {
    let child = Command::new(env!("CARGO_BIN_EXE_sparkplug-bridge"))
        .args(["--broker", &format!("127.0.0.1:{port}")])
        .args(["--site", SITE, "--edge-node", EDGE])
        .args(more)
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the bridge");
    BridgeProcess(child)
}

/// The value of every metric of `device` as a host application holds
/// it: its latest birth, with the data since applied.
fn values(seen: &[Value], device: &str) -> BTreeMap<String, Value> {
    let mut tags = BTreeMap::new();
    for m in seen.iter().filter(|m| m["device"] == device) {
        if m["type"] == "DBIRTH" {
            tags.clear();
        }
        if m["type"] == "DBIRTH" || m["type"] == "DDATA" {
            for (name, metric) in m["metrics"].as_object().expect("metrics") {
                tags.insert(name.clone(), metric["value"].clone());
            }
        }
    }
    tags
}

/// Sends a sample once a second, as the agents send telemetry, until
/// `done` holds: telemetry is not retained, so a sample sent before the
/// bridge's subscription is live is lost.
fn send_until(
    reader: &mut Reader,
    what: &str,
    mut send: impl FnMut(),
    done: impl Fn(&[Value]) -> bool + Copy,
) {
    for _ in 0..10 {
        send();
        if reader.wait_for(Duration::from_secs(1), done) {
            return;
        }
    }
    panic!("no {what} in 10 s; seen:\n{}", reader.dump());
}

fn holds(seen: &[Value], device: &str, want: &[(&str, Value)]) -> bool {
    let tags = values(seen, device);
    want.iter().all(|(name, v)| tags.get(*name) == Some(v))
}

/// Every message after an NBIRTH numbered one more than the one before
/// it, 255 wrapping to 0; NDEATH unnumbered.
fn check_numbering(seen: &[Value]) {
    let mut last: Option<u64> = None;
    // The NCMD on the edge node's topic is the host application's.
    let ours = |m: &&Value| m["edge"] == EDGE && m["type"] != "NCMD";
    for m in seen.iter().filter(ours) {
        match m["type"].as_str().unwrap() {
            "NDEATH" => {
                assert_eq!(m["has_seq"], false, "{m}");
                last = None;
            }
            "NBIRTH" => {
                assert_eq!(m["seq"], 0, "{m}");
                last = Some(0);
            }
            _ => {
                let prev = last.unwrap_or_else(|| panic!("before any NBIRTH: {m}"));
                assert_eq!(m["seq"].as_u64(), Some((prev + 1) % 256), "{m}");
                last = m["seq"].as_u64();
            }
        }
        assert_eq!(m["retain"], false, "Sparkplug never retains: {m}");
    }
}

fn agent(rt: &tokio::runtime::Runtime, broker: &Mosquitto, role: Role, id: &str) -> (Bus, BusTask) {
    let config = BusConfig::new(
        broker.addr(),
        Ident::new(SITE).unwrap(),
        NodeId::new(role, id).unwrap(),
    );
    let (bus, _inbound, task) = rt.block_on(async { Bus::start(config) });
    assert!(rt.block_on(bus.wait_connected(Duration::from_secs(10))));
    (bus, task)
}

fn publish(bus: &Bus, message: Message) {
    bus.publish(message, now_ms()).expect("published");
}

fn host_telemetry(gpu0_temp: u8) -> Message {
    let Message::HostTelemetry(mut t) = samples::message(MessageKind::HostTelemetry) else {
        unreachable!("the sample is host telemetry")
    };
    t.gpus[0].temp = WholeCelsius(gpu0_temp);
    Message::HostTelemetry(t)
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}

#[test]
fn a_site_as_sparkplug_b_read_by_pysparkplug() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let Some(python) = require_python_module("pysparkplug") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut reader = Reader::start(&python, broker.port());
    let mut bridge = start_bridge(broker.port());

    // The edge node's birth: bdSeq of its first connection, seq 0.
    let (_, nbirth) = reader.next(0, "NBIRTH", None);
    assert_eq!(
        (&nbirth["group"], &nbirth["edge"]),
        (&SITE.into(), &EDGE.into())
    );
    assert_eq!((&nbirth["qos"], &nbirth["seq"]), (&0.into(), &0.into()));
    let m = &nbirth["metrics"];
    assert_eq!(m["bdSeq"]["datatype"], "INT64");
    assert_eq!(m["bdSeq"]["value"], 0);
    assert_eq!(m["Node Control/Rebirth"]["datatype"], "BOOLEAN");
    assert_eq!(m["Node Control/Rebirth"]["value"], false);
    assert_eq!(m["properties/site"]["value"], SITE);

    // A CDU and a host, as the agents publish.
    let (cdu, cdu_task) = agent(&rt, &broker, Role::Cdu, "cdu-a");
    let (host, host_task) = agent(&rt, &broker, Role::Host, "h07");
    publish(&cdu, samples::message(MessageKind::CduState));
    publish(&host, samples::message(MessageKind::HostHealth));
    let both = |s: &[Value]| {
        holds(s, "cdu-a", &[("supply_temp_c", 32.05.into())])
            && holds(s, "h07", &[("gpu/0/temp_c", 61.into())])
    };
    send_until(
        &mut reader,
        "the samples",
        || {
            publish(&cdu, samples::message(MessageKind::CduTelemetry));
            publish(&host, host_telemetry(61));
        },
        both,
    );

    let (_, cdu_birth) = reader.next(0, "DBIRTH", Some("cdu-a"));
    let cm = cdu_birth["metrics"].as_object().unwrap();
    assert_eq!(cm.len(), 26, "every CDU metric in its birth: {cdu_birth}");
    assert_eq!(cm["supply_temp_c"]["datatype"], "DOUBLE");
    assert_eq!(cm["supply_temp_c"]["unit"], "°C");
    assert_eq!(cm["facility_power_w"]["datatype"], "UINT32");
    assert_eq!(cm["facility_power_w"]["unit"], "W");
    assert_eq!(cm["mode"]["datatype"], "STRING");
    let (_, host_birth) = reader.next(0, "DBIRTH", Some("h07"));
    let hm = host_birth["metrics"].as_object().unwrap();
    assert_eq!(hm.len(), 6 + 9 * 8, "every metric of 8 GPUs: {host_birth}");
    assert_eq!(hm["xid_watch_down"]["value"], false);
    assert_eq!(hm["gpu/7/temp_c"]["datatype"], "UINT8");
    assert_eq!(hm["gpu/7/power_limit_w"]["unit"], "W");
    assert_eq!(hm["gpu/3/quarantined"]["datatype"], "BOOLEAN");

    // What a host application then holds, births and data together.
    reader.wait("the CDU's values", |s| {
        holds(
            s,
            "cdu-a",
            &[
                ("supply_temp_c", 32.05.into()),
                ("setpoint_c", 32.0.into()),
                ("flow_lpm", 172.8.into()),
                ("pump_a/speed_pct", 59.into()),
                ("pump_b/speed_pct", Value::Null),
                ("facility_power_w", 117_550.into()),
                ("pue", 1.084.into()),
                ("mode", "degraded".into()),
                ("racks_cooling_lost", 1.into()),
                ("facility_water_target_c", 29.0.into()),
                ("properties/software", env!("CARGO_PKG_VERSION").into()),
            ],
        )
    });
    reader.wait("the host's values", |s| {
        holds(
            s,
            "h07",
            &[
                ("gpu/0/temp_c", 61.into()),
                ("gpu/0/power_limit_w", 700.into()),
                ("gpu/3/quarantined", true.into()),
                ("gpu/3/health", "quarantined".into()),
                ("gpu/3/health_reason", "xid-79".into()),
                ("gpu/5/health", "degraded".into()),
                ("gpus_quarantined", 1.into()),
                ("power_w", 5324.into()),
            ],
        )
    });

    // A new sample: DDATA with what changed, and only that.
    let mark = reader.seen.len();
    publish(&host, host_telemetry(75));
    let (_, ddata) = reader.next(mark, "DDATA", Some("h07"));
    let changed: Vec<&String> = ddata["metrics"].as_object().unwrap().keys().collect();
    assert_eq!(changed, ["gpu/0/temp_c", "hottest_gpu_c"], "{ddata}");
    assert_eq!(ddata["metrics"]["gpu/0/temp_c"]["value"], 75);

    // A rebirth request from the host application (pysparkplug's NCMD):
    // every birth again, the same bdSeq, seq from 0.
    let mark = reader.seen.len();
    reader.send(&format!("rebirth {SITE} {EDGE}"));
    let (at, again) = reader.next(mark, "NBIRTH", None);
    assert_eq!(
        (&again["metrics"]["bdSeq"]["value"], &again["seq"]),
        (&0.into(), &0.into())
    );
    reader.next(at, "DBIRTH", Some("cdu-a"));
    let (_, host_again) = reader.next(at, "DBIRTH", Some("h07"));
    assert_eq!(host_again["metrics"]["gpu/0/temp_c"]["value"], 75);

    // The host leaves: its online false is the device's death.
    let mark = reader.seen.len();
    rt.block_on(host.shutdown(Duration::from_secs(5))).unwrap();
    rt.block_on(host_task.join(Duration::from_secs(5)));
    let (_, ddeath) = reader.next(mark, "DDEATH", Some("h07"));
    assert_eq!(ddeath["has_seq"], true);
    assert_eq!(ddeath["metrics"].as_object().unwrap().len(), 0);

    // SIGKILL: no goodbye; the broker publishes the will, bdSeq 0.
    let mark = reader.seen.len();
    bridge.0.kill().unwrap();
    bridge.0.wait().unwrap();
    let (_, will) = reader.next(mark, "NDEATH", None);
    assert_eq!(will["metrics"]["bdSeq"]["value"], 0);
    assert_eq!((&will["qos"], &will["has_seq"]), (&1.into(), &false.into()));
    check_numbering(&reader.seen);

    // Started again: the CDU is born from its retained state; the host,
    // gone, is not.
    let mark = reader.seen.len();
    let mut bridge = start_bridge(broker.port());
    let (at, _) = reader.next(mark, "NBIRTH", None);
    let (_, cdu_again) = reader.next(at, "DBIRTH", Some("cdu-a"));
    assert_eq!(cdu_again["metrics"]["mode"]["value"], "degraded");
    let later = reader.quiet_for(Duration::from_millis(1500));
    assert!(
        !later.iter().any(|m| m["device"] == "h07"),
        "a host that left was born again: {later:?}"
    );

    // SIGTERM: the bridge says goodbye itself, once, and exits 0.
    let mark = reader.seen.len();
    sigterm(&bridge.0);
    let (_, bye) = reader.next(mark, "NDEATH", None);
    assert_eq!(bye["metrics"]["bdSeq"]["value"], 0);
    assert!(
        bridge.0.wait().unwrap().success(),
        "the bridge failed to stop"
    );
    let after = reader.quiet_for(Duration::from_secs(2));
    assert!(
        !after.iter().any(|m| m["type"] == "NDEATH"),
        "the will fired after a clean stop: {after:?}"
    );
    check_numbering(&reader.seen);
    rt.block_on(cdu.shutdown(Duration::from_secs(5))).unwrap();
    rt.block_on(cdu_task.join(Duration::from_secs(5)));
}

fn cdu_telemetry(supply: f64) -> Message {
    let Message::CduTelemetry(mut t) = samples::message(MessageKind::CduTelemetry) else {
        unreachable!("the sample is CDU telemetry")
    };
    t.supply = Some(Celsius::new(supply).unwrap());
    Message::CduTelemetry(t)
}

#[test]
fn a_lost_sparkplug_connection_ends_in_the_will_and_comes_back_as_a_new_session() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let Some(python) = require_python_module("pysparkplug") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut reader = Reader::start(&python, broker.port());
    // The Sparkplug side through a proxy that can cut it; the Loopwarden
    // side straight to the broker.
    let proxy = CutProxy::start(([127, 0, 0, 1], broker.port()).into());
    let via = proxy.addr().to_string();
    let mut bridge = start_bridge_with(broker.port(), &["--sparkplug-broker", &via]);
    let (_, first) = reader.next(0, "NBIRTH", None);
    assert_eq!(first["metrics"]["bdSeq"]["value"], 0);
    let (cdu, cdu_task) = agent(&rt, &broker, Role::Cdu, "cdu-a");
    let supply = |s: &[Value]| holds(s, "cdu-a", &[("supply_temp_c", 32.05.into())]);
    send_until(
        &mut reader,
        "the CDU",
        || publish(&cdu, cdu_telemetry(32.05)),
        supply,
    );

    // The network between the bridge and the broker fails: the broker
    // publishes the will of that connection.
    let mark = reader.seen.len();
    proxy.cut();
    let (_, will) = reader.next(mark, "NDEATH", None);
    assert_eq!(will["metrics"]["bdSeq"]["value"], 0);
    // The hall goes on meanwhile; the bridge still reads it.
    publish(&cdu, cdu_telemetry(33.5));
    std::thread::sleep(Duration::from_millis(500));
    proxy.restore();

    // Back: a new session, a new bdSeq, every birth with current values.
    let (at, birth) = reader.next(mark, "NBIRTH", None);
    let bd_seq = birth["metrics"]["bdSeq"]["value"].as_u64().unwrap();
    assert!(bd_seq >= 1, "a new connection, a new bdSeq: {birth}");
    assert_eq!(birth["seq"], 0);
    let (_, cdu_birth) = reader.next(at, "DBIRTH", Some("cdu-a"));
    assert_eq!(cdu_birth["metrics"]["supply_temp_c"]["value"], 33.5);

    // Its will is the one that matches this birth.
    let mark = reader.seen.len();
    bridge.0.kill().unwrap();
    bridge.0.wait().unwrap();
    let (_, will) = reader.next(mark, "NDEATH", None);
    assert_eq!(will["metrics"]["bdSeq"]["value"].as_u64(), Some(bd_seq));
    check_numbering(&reader.seen);
    rt.block_on(cdu.shutdown(Duration::from_secs(5))).unwrap();
    rt.block_on(cdu_task.join(Duration::from_secs(5)));
}

#[test]
fn over_tls_with_a_readers_certificate_to_the_facilitys_own_broker() {
    // The site's broker: TLS, client certificates, and an ACL under which
    // the reader spb1 reads the whole site and publishes nothing.
    let Some(site) = PkiBroker::start(SITE, ["h07@cdu-a", "cdu-a", "ops1", "spb1"]) else {
        return;
    };
    // The facility's broker, plain, where Sparkplug goes.
    let Some(facility) = Mosquitto::start() else {
        return;
    };
    let Some(python) = require_python_module("pysparkplug") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut reader = Reader::start(&python, facility.port());
    let dir = site.dir();
    let file = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let tls_broker = format!("127.0.0.1:{}", site.port());
    let sparkplug = format!("127.0.0.1:{}", facility.port());
    let bridge = Command::new(env!("CARGO_BIN_EXE_sparkplug-bridge"))
        .args(["--broker", &tls_broker, "--site", SITE, "--edge-node", EDGE])
        .args(["--tls-ca", &file("ca.crt")])
        .args([
            "--tls-cert",
            &file("spb1.crt"),
            "--tls-key",
            &file("spb1.key"),
        ])
        .args(["--sparkplug-broker", &sparkplug])
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the bridge");
    let _bridge = BridgeProcess(bridge);
    reader.next(0, "NBIRTH", None);

    let mut config = BusConfig::new(
        tls_broker.parse::<loopwarden_bus::BrokerAddr>().unwrap(),
        Ident::new(SITE).unwrap(),
        NodeId::new(Role::Cdu, "cdu-a").unwrap(),
    );
    config.tls = Some(Tls::load(TlsFiles::of_identity(dir, "cdu-a")).expect("cdu-a's identity"));
    let (cdu, _inbound, cdu_task) = rt.block_on(async { Bus::start(config) });
    assert!(
        rt.block_on(cdu.wait_connected(Duration::from_secs(10))),
        "cdu-a connects over TLS\n{}",
        site.log()
    );
    publish(&cdu, samples::message(MessageKind::CduState));
    let supply = |s: &[Value]| {
        holds(
            s,
            "cdu-a",
            &[("supply_temp_c", 32.05.into()), ("mode", "degraded".into())],
        )
    };
    let telemetry = || publish(&cdu, samples::message(MessageKind::CduTelemetry));
    send_until(&mut reader, "the CDU over TLS", telemetry, supply);
    check_numbering(&reader.seen);
    rt.block_on(cdu.shutdown(Duration::from_secs(5))).unwrap();
    rt.block_on(cdu_task.join(Duration::from_secs(5)));
}
