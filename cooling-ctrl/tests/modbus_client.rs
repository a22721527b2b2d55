//! The CDU's Modbus client against the simulated CDU: over Modbus TCP on
//! loopback and over Modbus RTU on a pseudo-terminal pair made by `socat`.
//! Scaling, word order, writes read back, exceptions kept apart from
//! silence, and recovery after a timeout.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cooling_ctrl::modbus::{CduError, CduPort, CduSettings, Link, ModbusCdu, SerialLine};
use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_twin::sim_cdu::{open_serial, SimCdu};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MAP: &str = include_str!("../../boards/cdus/sim-cdu.toml");

/// The simulated CDU's map with `from` replaced by `to` (once).
fn map_with(from: &str, to: &str) -> RegisterMap {
    assert!(MAP.contains(from), "the shipped map has {from:?}");
    RegisterMap::from_toml(&MAP.replacen(from, to, 1), "test map").expect("a valid map")
}

fn low_first() -> RegisterMap {
    map_with("word_order = \"high_first\"", "word_order = \"low_first\"")
}

/// The settings in the order they are written.
const SETTINGS: [(&str, f64); 6] = [
    ("valves_open", 15.0),
    ("pumps_run", 1.0),
    ("lead_pump", 0.0),
    ("pump_speed", 80.0),
    ("supply_setpoint", 30.0),
    ("heartbeat", 0.0),
];

/// [`SETTINGS`] after [`NEW`] went in.
const NEW_IN: [f64; 6] = [11.0, 2.0, 1.0, 72.5, 33.5, 7.0];

/// A CDU serving `map` with known measurements: a negative temperature,
/// u32 meters past 65,535 W.
fn sim(map: RegisterMap) -> SimCdu {
    let cdu = SimCdu::new(map, &SETTINGS).expect("settings in range");
    for (name, value) in [
        ("supply_temp", 32.05),
        ("return_temp", -1.5),
        ("flow", 172.8),
        ("facility_supply_temp", 18.25),
        ("pump_a_running", 1.0),
        ("pump_b_running", 0.0),
        ("leak_inputs", 5.0),
        ("it_power", 108_400.0),
        ("cooling_power", 9_120.0),
        ("facility_power", 117_550.0),
        ("outdoor_temp", -7.25),
    ] {
        cdu.set_measurement(name, value).expect("a measurement");
    }
    cdu
}

fn settings_of(cdu: &SimCdu) -> Vec<f64> {
    SETTINGS
        .iter()
        .map(|(n, _)| cdu.setting(n).expect("a setting"))
        .collect()
}

fn assert_known_readings(r: &cooling_ctrl::modbus::CduMeasurements) {
    assert_eq!(r.supply_c, Some(32.05));
    assert_eq!(r.return_c, Some(-1.5));
    assert_eq!(r.flow_lpm, Some(172.8));
    assert_eq!(r.facility_supply_c, Some(18.25));
    assert_eq!(r.pumps_running, [Some(true), Some(false)]);
    assert_eq!(r.leaks, Some(0b101));
    assert_eq!(r.it_w, Some(108_400.0));
    assert_eq!(r.cooling_w, Some(9_120.0));
    assert_eq!(r.facility_w, Some(117_550.0));
    assert_eq!(r.outdoor_c, Some(-7.25));
}

async fn serve_tcp(cdu: SimCdu) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(cdu.serve(listener));
    addr
}

fn tcp_client(map: RegisterMap, addr: SocketAddr) -> ModbusCdu {
    ModbusCdu::new(map, Link::Tcp(addr.into())).with_timeout(Duration::from_millis(300))
}

const NEW: CduSettings = CduSettings {
    setpoint_c: 33.5,
    pump_speed_pct: 72.5,
    lead_pump: 1,
    valves_open: 0b1011,
    pumps_run: 0b10,
    heartbeat: 7,
};

#[tokio::test]
async fn tcp_reads_every_measurement_with_the_maps_scaling() {
    let addr = serve_tcp(sim(RegisterMap::sim_cdu())).await;
    let mut client = tcp_client(RegisterMap::sim_cdu(), addr);
    assert_eq!(client.read_requests(), vec![(0, 7), (10, 11)]);
    let r = client.read().await.expect("read");
    assert_known_readings(&r);
}

#[tokio::test]
async fn thirty_two_bit_meters_follow_the_maps_word_order() {
    // A CDU whose meters put the low word first, read with its own map.
    let addr = serve_tcp(sim(low_first())).await;
    let r = tcp_client(low_first(), addr).read().await.expect("read");
    assert_known_readings(&r);
    // The same registers read as high word first: 117,550 W = 0x0001_CB2E
    // becomes 0xCB2E_0001. The order is the map's, not a fixed one.
    let r = tcp_client(RegisterMap::sim_cdu(), addr)
        .read()
        .await
        .expect("read");
    assert_eq!(r.facility_w, Some(f64::from(0xCB2E_0001u32)));
    assert_eq!(r.supply_c, Some(32.05));
}

#[tokio::test]
async fn a_measurement_the_map_lacks_reads_none() {
    // A model without a facility supply sensor.
    let map = map_with("name = \"facility_supply_temp\"", "name = \"other_temp\"");
    let addr = serve_tcp(sim(RegisterMap::sim_cdu())).await;
    let mut client = tcp_client(map, addr);
    assert_eq!(client.unmapped(), vec!["facility_supply_temp"]);
    let r = client.read().await.expect("read");
    assert_eq!(r.facility_supply_c, None);
    assert_eq!(r.supply_c, Some(32.05));
}

#[tokio::test]
async fn the_cdus_not_available_reads_none_never_a_figure() {
    let cdu = sim(RegisterMap::sim_cdu());
    // The values whose words are the types' sentinels: 0x8000 in the i16
    // supply, 0xFFFF in the u16 flow (6,553.5 L/min would pass for a
    // flow), 0xFFFFFFFF in the u32 IT meter; and every leak input wet,
    // 0xFFFF in a bit word, which is bits, not a sentinel.
    for (name, value) in [
        ("supply_temp", -327.68),
        ("flow", 6_553.5),
        ("it_power", f64::from(u32::MAX)),
        ("leak_inputs", 65_535.0),
    ] {
        cdu.set_measurement(name, value).expect("a measurement");
    }
    let addr = serve_tcp(cdu).await;
    let r = tcp_client(RegisterMap::sim_cdu(), addr)
        .read()
        .await
        .expect("read");
    assert_eq!((r.supply_c, r.flow_lpm, r.it_w), (None, None, None));
    assert_eq!(r.leaks, Some(0xFFFF));
    assert_eq!((r.return_c, r.cooling_w), (Some(-1.5), Some(9_120.0)));
}

#[tokio::test]
async fn a_pumps_fault_bit_is_known_mapped_and_all_ones_reads_a_fault_shown() {
    // Pump A's fault flag holds 0xFFFF: a bit word has no "not available",
    // so it reads as a fault shown (a clear is refused), never as no value.
    // This model's map has no fault bit for pump B: it reads none, and the
    // client says the map lacks it (a clear of B goes on the operator's
    // word, and says so).
    let cdu = sim(RegisterMap::sim_cdu());
    cdu.set_measurement("pump_a_fault", 65_535.0)
        .expect("a measurement");
    let addr = serve_tcp(cdu).await;
    let map = map_with("name = \"pump_b_fault\"", "name = \"other_fault\"");
    let mut client = tcp_client(map, addr);
    assert!(client.unmapped().contains(&"pump_b_fault"));
    assert_eq!(client.pump_fault_bits(), [true, false]);
    let r = client.read().await.expect("read");
    assert_eq!(r.pump_faults, [Some(true), None]);
    assert_eq!(r.supply_c, Some(32.05));
    let full = tcp_client(RegisterMap::sim_cdu(), addr);
    assert_eq!(full.pump_fault_bits(), [true, true]);
}

#[tokio::test]
async fn a_pump_running_flag_other_than_0_or_1_reads_no_value() {
    // Pump A's running flag holds the CDU's "not available" (0xFFFF),
    // pump B's a status enum's 2 (fault): neither says the pump runs.
    // They read no value, which the decision path takes as not running.
    let cdu = sim(RegisterMap::sim_cdu());
    cdu.set_measurement("pump_a_running", 65_535.0)
        .expect("a measurement");
    cdu.set_measurement("pump_b_running", 2.0)
        .expect("a measurement");
    let addr = serve_tcp(cdu.clone()).await;
    let mut client = tcp_client(RegisterMap::sim_cdu(), addr);
    let r = client.read().await.expect("read");
    assert_eq!(r.pumps_running, [None, None]);
    assert_eq!(r.supply_c, Some(32.05));
    // Back to a bit: read as it says.
    cdu.set_measurement("pump_a_running", 1.0)
        .expect("a measurement");
    cdu.set_measurement("pump_b_running", 0.0)
        .expect("a measurement");
    let r = client.read().await.expect("read");
    assert_eq!(r.pumps_running, [Some(true), Some(false)]);
}

#[tokio::test]
async fn tcp_writes_settings_that_the_cdu_takes() {
    let cdu = sim(RegisterMap::sim_cdu());
    let addr = serve_tcp(cdu.clone()).await;
    let mut client = tcp_client(RegisterMap::sim_cdu(), addr);
    client.write(&NEW).await.expect("write");
    assert_eq!(settings_of(&cdu), NEW_IN);
}

#[tokio::test]
async fn a_setpoint_the_cdu_refuses_is_exception_3_and_changes_nothing() {
    let cdu = sim(RegisterMap::sim_cdu());
    let addr = serve_tcp(cdu.clone()).await;
    // This client's map lets the setpoint go to 60 °C; the CDU stops at 45.
    let mut client = tcp_client(map_with("max = 45.0", "max = 60.0"), addr);
    let e = client
        .write(&CduSettings {
            setpoint_c: 50.0,
            ..NEW
        })
        .await
        .unwrap_err();
    // The valves and the pumps went in before it: a refused setpoint
    // never holds back what isolates a leak.
    assert_eq!(e.refused_code(), Some(3), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("write supply_setpoint at holding 0")
            && text.contains("exception 3 (illegal data value)")
            && text.contains(&addr.to_string()),
        "{text}"
    );
    assert_eq!(settings_of(&cdu), vec![11.0, 2.0, 1.0, 72.5, 30.0, 0.0]);
    // The link is still good.
    client.read().await.expect("read after a refusal");
}

#[tokio::test]
async fn a_write_refused_halfway_says_which_settings_went_in() {
    let cdu = sim(RegisterMap::sim_cdu());
    let addr = serve_tcp(cdu.clone()).await;
    // This client's map allows 10 % pump speed; the CDU's minimum is 30 %.
    let mut client = tcp_client(map_with("min = 30.0", "min = 10.0"), addr);
    let e = client
        .write(&CduSettings {
            pump_speed_pct: 20.0,
            ..NEW
        })
        .await
        .unwrap_err();
    let CduError::Partial {
        written,
        failed,
        not_tried,
        ..
    } = &e
    else {
        panic!("not a partial write: {e:?}");
    };
    assert_eq!(written, &vec!["valves_open", "pumps_run", "lead_pump"]);
    assert_eq!(*failed, "pump_speed");
    assert_eq!(not_tried, &vec!["supply_setpoint", "heartbeat"]);
    assert_eq!(e.refused_code(), Some(3));
    assert!(
        e.to_string()
            .starts_with("wrote valves_open, pumps_run, lead_pump; pump_speed failed; did not try supply_setpoint, heartbeat: write pump_speed at holding 1"),
        "{e}"
    );
    assert_eq!(settings_of(&cdu), vec![11.0, 2.0, 1.0, 80.0, 30.0, 0.0]);
}

#[tokio::test]
async fn a_value_outside_the_maps_range_is_not_sent() {
    let cdu = sim(RegisterMap::sim_cdu());
    let addr = serve_tcp(cdu.clone()).await;
    let mut client = tcp_client(RegisterMap::sim_cdu(), addr);
    // The valves come first: a bad lead pump must stop them too.
    let e = client
        .write(&CduSettings {
            lead_pump: 2,
            ..NEW
        })
        .await
        .unwrap_err();
    assert!(matches!(e, CduError::Value { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("write lead_pump at holding 2 of unit 1"),
        "{e}"
    );
    assert_eq!(settings_of(&cdu), vec![15.0, 1.0, 0.0, 80.0, 30.0, 0.0]);
}

#[tokio::test]
async fn an_address_the_cdu_lacks_is_exception_2() {
    let addr = serve_tcp(sim(RegisterMap::sim_cdu())).await;
    // This client's map puts a register at input 7, where the CDU has none.
    let map = map_with(
        "name = \"it_power\"\nkind = \"input\"\naddress = 10",
        "name = \"it_power\"\nkind = \"input\"\naddress = 7",
    );
    let mut client = tcp_client(map, addr);
    // The request of inputs 0-8 is refused; that of 11-20 answers, but
    // the refused one holds the pumps' running flags: the read fails
    // whole, saying so.
    let e = client.read().await.expect_err("the running flags lost");
    assert!(client.read_gaps().is_empty(), "{:?}", client.read_gaps());
    assert!(e.to_string().contains("it lost pump_a_running"), "{e}");
    assert!(
        matches!(
            e,
            CduError::Refused {
                code: 2,
                meaning: "illegal data address",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("read input 0-8 (supply_temp to it_power) of unit 1"),
        "{e}"
    );
}

/// A TCP peer that takes connections and never answers; dropped with the
/// returned task.
async fn silent_peer(addr: &str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    (addr, task)
}

#[tokio::test]
async fn a_tcp_peer_that_never_answers_is_no_answer_within_the_timeout() {
    let (addr, peer) = silent_peer("127.0.0.1:0").await;
    let mut client = tcp_client(RegisterMap::sim_cdu(), addr);
    let t0 = Instant::now();
    let e = client.read().await.unwrap_err();
    let took = t0.elapsed();
    assert!(
        matches!(e, CduError::NoAnswer { after_ms: 300, .. }),
        "{e:?}"
    );
    assert!(e.refused_code().is_none() && e.is_no_answer());
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_millis(1_500),
        "{took:?}"
    );
    assert!(
        e.to_string().contains("read input 0-6")
            && e.to_string().contains("no answer within 300 ms"),
        "{e}"
    );
    // The CDU comes back on the same address: the client works again.
    peer.abort();
    let _ = peer.await;
    let cdu = sim(RegisterMap::sim_cdu());
    let listener = tokio::net::TcpListener::bind(addr).await.expect("rebind");
    tokio::spawn(cdu.clone().serve(listener));
    assert_known_readings(&client.read().await.expect("read after the timeout"));
    client.write(&NEW).await.expect("write after the timeout");
    assert_eq!(settings_of(&cdu), NEW_IN);
}

#[tokio::test]
async fn nobody_listening_is_a_link_failure_not_a_refusal() {
    let (addr, peer) = silent_peer("127.0.0.1:0").await;
    peer.abort();
    let _ = peer.await;
    let e = tcp_client(RegisterMap::sim_cdu(), addr)
        .read()
        .await
        .unwrap_err();
    assert!(matches!(e, CduError::Io { .. }), "{e:?}");
    // The cause in words, with the address: not the system's
    // "operation now in progress" of a connection being made.
    let text = e.to_string();
    assert!(text.contains("connecting"), "{text}");
    assert!(
        text.contains(&format!("connection refused by {addr}: nothing listens")),
        "{text}"
    );
    assert!(!text.contains("progress"), "{text}");
}

// ---- RTU on a pseudo-terminal pair ----

/// `socat`, or `None` (skip, said on stderr) outside CI; under CI a
/// missing socat is a failure.
fn require_socat() -> Option<PathBuf> {
    loopwarden_system_tests::require_tool("socat")
}

/// Two pseudo-terminals joined by socat: what goes into one comes out of
/// the other, like the two ends of an RS-485 cable. socat is killed when
/// this is dropped.
struct PtyPair {
    socat: Child,
    dir: tempfile::TempDir,
}

impl PtyPair {
    fn start() -> Option<PtyPair> {
        let socat = require_socat()?;
        let dir = tempfile::tempdir().expect("temp dir");
        let end = |n: &str| format!("pty,raw,echo=0,link={}", dir.path().join(n).display());
        let child = Command::new(socat)
            .args(["-d", "-d", &end("a"), &end("b")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start socat");
        let pair = PtyPair { socat: child, dir };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !(pair.a().exists() && pair.b().exists()) {
            assert!(
                Instant::now() < deadline,
                "socat made no pseudo-terminals at {} in 5 s",
                pair.dir.path().display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(pair)
    }

    /// The controller's end.
    fn a(&self) -> PathBuf {
        self.dir.path().join("a")
    }

    /// The CDU's end.
    fn b(&self) -> PathBuf {
        self.dir.path().join("b")
    }
}

impl Drop for PtyPair {
    fn drop(&mut self) {
        let _ = self.socat.kill();
        let _ = self.socat.wait();
    }
}

fn path_str(p: &Path) -> String {
    p.to_str().expect("a UTF-8 path").to_string()
}

fn rtu_client(map: RegisterMap, pair: &PtyPair) -> ModbusCdu {
    ModbusCdu::new(map, Link::Rtu(SerialLine::new(path_str(&pair.a()))))
        .with_timeout(Duration::from_millis(300))
}

fn serve_rtu(cdu: SimCdu, pair: &PtyPair) -> tokio::task::JoinHandle<std::io::Result<()>> {
    tokio::spawn(cdu.serve_rtu(path_str(&pair.b()), 19_200))
}

#[tokio::test]
async fn rtu_reads_writes_and_exceptions_as_over_tcp() {
    let Some(pair) = PtyPair::start() else {
        return;
    };
    let cdu = sim(RegisterMap::sim_cdu());
    let server = serve_rtu(cdu.clone(), &pair);
    let mut client = rtu_client(RegisterMap::sim_cdu(), &pair);
    assert_known_readings(&client.read().await.expect("read over RTU"));
    client.write(&NEW).await.expect("write over RTU");
    assert_eq!(settings_of(&cdu), NEW_IN);

    // Refused setpoint: exception 3, nothing changed.
    let mut wide = rtu_client(map_with("max = 45.0", "max = 60.0"), &pair);
    client.disconnect().await;
    let e = wide
        .write(&CduSettings {
            setpoint_c: 50.0,
            ..NEW
        })
        .await
        .unwrap_err();
    assert_eq!(e.refused_code(), Some(3), "{e:?}");
    assert!(
        e.to_string()
            .contains("write supply_setpoint at holding 0 of unit 1 on Modbus RTU")
            && e.to_string().contains("19200 8N1"),
        "{e}"
    );
    assert_eq!(settings_of(&cdu), NEW_IN);
    wide.disconnect().await;

    // An address the CDU lacks: exception 2.
    let mut off = rtu_client(
        map_with(
            "name = \"it_power\"\nkind = \"input\"\naddress = 10",
            "name = \"it_power\"\nkind = \"input\"\naddress = 7",
        ),
        &pair,
    );
    // Inputs 11-20 answer, but the refused 0-8 hold the running flags.
    let e = off.read().await.expect_err("the running flags lost");
    assert!(matches!(e, CduError::Refused { code: 2, .. }), "{e:?}");
    off.disconnect().await;

    // Another unit id on the bus: the CDU keeps quiet.
    let mut other = rtu_client(map_with("unit_id = 1", "unit_id = 7"), &pair);
    let e = other.read().await.unwrap_err();
    assert!(matches!(e, CduError::NoAnswer { .. }), "{e:?}");
    assert!(e.to_string().contains("of unit 7"), "{e}");
    other.disconnect().await;

    // And the right one still answers.
    assert_known_readings(&client.read().await.expect("read again"));
    assert!(!server.is_finished(), "the RTU server stopped: {server:?}");
    server.abort();
}

#[tokio::test]
async fn rtu_with_nobody_serving_is_no_answer_and_recovers_when_the_cdu_is_back() {
    let Some(pair) = PtyPair::start() else {
        return;
    };
    let mut client = rtu_client(RegisterMap::sim_cdu(), &pair);
    let t0 = Instant::now();
    let e = client.read().await.unwrap_err();
    assert!(
        matches!(e, CduError::NoAnswer { after_ms: 300, .. }),
        "{e:?}"
    );
    assert!(
        t0.elapsed() < Duration::from_millis(1_500),
        "{:?}",
        t0.elapsed()
    );
    let cdu = sim(RegisterMap::sim_cdu());
    let server = serve_rtu(cdu.clone(), &pair);
    assert_known_readings(&client.read().await.expect("read once the CDU is back"));
    client
        .write(&NEW)
        .await
        .expect("write once the CDU is back");
    assert_eq!(settings_of(&cdu), NEW_IN);
    server.abort();
}

/// The controller's end opened by another program, as minicom or mbpoll
/// open it: exclusively.
fn hold(pair: &PtyPair) -> tokio_serial::SerialStream {
    open_serial(&path_str(&pair.a()), 19_200).expect("open the controller's end")
}

#[tokio::test]
async fn a_serial_port_another_program_lets_go_of_within_the_timeout_is_waited_for() {
    let Some(pair) = PtyPair::start() else {
        return;
    };
    let server = serve_rtu(sim(RegisterMap::sim_cdu()), &pair);

    // Let go within the timeout (a process being started that inherited
    // the port for an instant): the read waits for it and goes through.
    let mut patient =
        rtu_client(RegisterMap::sim_cdu(), &pair).with_timeout(Duration::from_secs(5));
    let held = hold(&pair);
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(held);
    });
    assert_known_readings(&patient.read().await.expect("read once the port is let go"));
    release.await.expect("released");
    patient.disconnect().await;
    server.abort();
}

/// Held for good: a link failure naming the port in use after the
/// timeout, not a CDU that does not answer; the step's next request
/// tries once without waiting again; once let go, the port opens. On a
/// paused clock, so the waits are counted, not timed.
#[tokio::test(start_paused = true)]
async fn a_serial_port_held_for_good_costs_one_timeout_then_none() {
    let Some(pair) = PtyPair::start() else {
        return;
    };
    let mut client = rtu_client(RegisterMap::sim_cdu(), &pair);
    let held = hold(&pair);
    let t0 = tokio::time::Instant::now();
    let e = client.read().await.unwrap_err();
    assert_eq!(
        t0.elapsed(),
        Duration::from_millis(300),
        "waited the timeout"
    );
    let CduError::Io { source, .. } = &e else {
        panic!("not a link failure: {e:?}");
    };
    assert_eq!(source.kind(), std::io::ErrorKind::ResourceBusy, "{e:?}");
    assert!(
        e.to_string().contains(&format!(
            "{} is in use by another program",
            path_str(&pair.a())
        )),
        "{e}"
    );
    let t1 = tokio::time::Instant::now();
    let again = client.write(&NEW).await.unwrap_err();
    assert_eq!(t1.elapsed(), Duration::ZERO, "no second wait: {again}");
    assert!(
        again.to_string().contains("is in use by another program"),
        "{again}"
    );
    drop(held);
    // Let go: the port opens (nobody serves it here: no answer).
    let e = client.read().await.unwrap_err();
    assert!(e.is_no_answer(), "{e:?}");
}

/// Modbus RTU CRC-16 (polynomial 0xA001, initial 0xFFFF), low byte first.
fn crc16(bytes: &[u8]) -> [u8; 2] {
    let mut crc: u16 = 0xFFFF;
    for b in bytes {
        crc ^= u16::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xA001
            } else {
                crc >> 1
            };
        }
    }
    crc.to_le_bytes()
}

#[tokio::test]
async fn a_late_rtu_answer_is_not_taken_for_the_next_one() {
    let Some(pair) = PtyPair::start() else {
        return;
    };
    // A slow CDU: it answers the first read after 500 ms, past the 300 ms
    // timeout, with every register at 0x0101.
    let b = path_str(&pair.b());
    let slow = tokio::spawn(async move {
        let mut port = open_serial(&b, 19_200).expect("open b");
        let mut req = [0u8; 8];
        port.read_exact(&mut req).await.expect("a request");
        assert_eq!(&req[..2], &[1, 4], "a read of input registers of unit 1");
        assert_eq!(crc16(&req[..6]), [req[6], req[7]]);
        let count = u16::from_be_bytes([req[4], req[5]]);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut answer = vec![1, 4, (count * 2) as u8];
        answer.extend(std::iter::repeat_n(1u8, usize::from(count) * 2));
        let crc = crc16(&answer);
        answer.extend(crc);
        port.write_all(&answer).await.expect("late answer");
        port.flush().await.expect("flush");
        // Give socat time to pass it on before the port closes.
        tokio::time::sleep(Duration::from_millis(100)).await;
    });
    let mut client = rtu_client(RegisterMap::sim_cdu(), &pair);
    let e = client.read().await.unwrap_err();
    assert!(e.is_no_answer(), "{e:?}");
    slow.await.expect("the slow CDU");
    // The late answer now waits on the controller's end; the real CDU
    // takes over the line.
    let cdu = sim(RegisterMap::sim_cdu());
    let server = serve_rtu(cdu, &pair);
    assert_known_readings(&client.read().await.expect("read after the late answer"));
    server.abort();
}
