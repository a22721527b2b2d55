//! The CDU's Modbus client against CDUs that answer wrongly: a write whose
//! echo is not the request (a clamped value, another register), a
//! setting (one word or two) that reads back another value than the one
//! written or cannot be read back, a read request refused while another
//! answers, a garbled RTU answer, a TCP peer that closes
//! the connection; and what a refused write says it tried to write.

use std::collections::BTreeMap;
use std::future::{ready, Ready};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cooling_ctrl::decide::{Setting, Write};
use cooling_ctrl::modbus::{CduError, CduPort, CduSettings, Link, ModbusCdu, SerialLine};
use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_twin::sim_cdu::SimCdu;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_modbus::server::tcp::{accept_tcp_connection, Server};
use tokio_modbus::{ExceptionCode, Request, Response, SlaveRequest};

const MAP: &str = include_str!("../../boards/cdus/sim-cdu.toml");

/// The simulated CDU's map with `from` replaced by `to` (once).
fn map_with(from: &str, to: &str) -> RegisterMap {
    assert!(MAP.contains(from), "the shipped map has {from:?}");
    RegisterMap::from_toml(&MAP.replacen(from, to, 1), "test map").expect("a valid map")
}

/// The simulated CDU's map with `pump_speed` a u32 at holding 10-11: a
/// setting written with function 16.
fn wide_speed() -> RegisterMap {
    map_with(
        "name = \"pump_speed\"\nkind = \"holding\"\naddress = 1\ntype = \"u16\"",
        "name = \"pump_speed\"\nkind = \"holding\"\naddress = 10\ntype = \"u32\"",
    )
}

const SETTINGS: CduSettings = CduSettings {
    setpoint_c: 33.5,
    pump_speed_pct: 72.5,
    lead_pump: 1,
    valves_open: 0b1011,
    pumps_run: 0b10,
    heartbeat: 7,
};

/// How a CDU echoes a write to `address` of `words`.
type Echo = fn(address: u16, words: &[u16]) -> Response;

/// The echo the Modbus specification asks for.
fn right_echo(address: u16, words: &[u16]) -> Response {
    match words {
        [w] => Response::WriteSingleRegister(address, *w),
        _ => Response::WriteMultipleRegisters(address, words.len() as u16),
    }
}

/// What a CDU keeps of a write to `address` of `words`: the words it
/// holds from `address` on. `None`: it keeps nothing and serves no read
/// of its holding registers (function 3 refused with exception 1).
type Keep = Option<fn(address: u16, words: &[u16]) -> Vec<u16>>;

/// A CDU that holds what it is sent.
const AS_SENT: Keep = Some(|_, words| words.to_vec());

/// A Modbus TCP CDU that answers writes with its [`Echo`], holds what its
/// [`Keep`] makes of them and serves that on function 3 (0 where nothing
/// was written), and answers reads of input registers with zeros.
#[derive(Clone)]
struct Echoing {
    echo: Echo,
    keep: Keep,
    held: Arc<Mutex<BTreeMap<u16, u16>>>,
}

impl Echoing {
    fn write(&self, address: u16, words: &[u16]) -> Response {
        if let Some(keep) = self.keep {
            let kept = keep(address, words);
            let mut held = self.held.lock().expect("the held registers");
            for (i, w) in kept.into_iter().enumerate() {
                held.insert(address + i as u16, w);
            }
        }
        (self.echo)(address, words)
    }

    fn read(&self, address: u16, n: u16) -> Result<Response, ExceptionCode> {
        if self.keep.is_none() {
            return Err(ExceptionCode::IllegalFunction);
        }
        let held = self.held.lock().expect("the held registers");
        let words = (address..address + n)
            .map(|a| held.get(&a).copied().unwrap_or(0))
            .collect();
        Ok(Response::ReadHoldingRegisters(words))
    }
}

impl tokio_modbus::server::Service for Echoing {
    type Request = SlaveRequest<'static>;
    type Response = Response;
    type Exception = ExceptionCode;
    type Future = Ready<Result<Response, ExceptionCode>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        ready(match req.request {
            Request::WriteSingleRegister(a, w) => Ok(self.write(a, &[w])),
            Request::WriteMultipleRegisters(a, words) => Ok(self.write(a, &words)),
            Request::ReadHoldingRegisters(a, n) => self.read(a, n),
            Request::ReadInputRegisters(_, n) => {
                Ok(Response::ReadInputRegisters(vec![0; n.into()]))
            }
            _ => Err(ExceptionCode::IllegalFunction),
        })
    }
}

/// Serves an [`Echoing`] CDU that holds what it is sent on a loopback
/// port.
async fn serve_echoing(echo: Echo) -> SocketAddr {
    serve_keeping(echo, AS_SENT).await
}

/// Serves an [`Echoing`] CDU that holds what `keep` makes of a write on a
/// loopback port; what it holds lasts from one connection to the next.
async fn serve_keeping(echo: Echo, keep: Keep) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cdu = Echoing {
        echo,
        keep,
        held: Arc::default(),
    };
    tokio::spawn(async move {
        let on_connected = move |stream, socket_addr| {
            let cdu = cdu.clone();
            async move { accept_tcp_connection(stream, socket_addr, move |_| Ok(Some(cdu.clone()))) }
        };
        let _ = Server::new(listener)
            .serve(&on_connected, |e| eprintln!("echoing CDU: {e}"))
            .await;
    });
    addr
}

fn tcp_client(map: RegisterMap, addr: SocketAddr) -> ModbusCdu {
    ModbusCdu::new(map, Link::Tcp(addr.into())).with_timeout(Duration::from_millis(2_000))
}

/// `e` is a bad answer to the write of `name` whose detail contains
/// `detail`, after `written` went in.
fn assert_bad_echo(e: &CduError, written: &[&str], name: &str, detail: &str) {
    let CduError::Partial {
        written: w,
        failed,
        cause,
        ..
    } = e
    else {
        panic!("not a partial write: {e:?}");
    };
    assert_eq!((w.as_slice(), *failed), (written, name), "{e}");
    let CduError::BadAnswer { op, detail: d } = cause.as_ref() else {
        panic!("not a bad answer: {cause:?}");
    };
    assert!(op.starts_with(&format!("write {name} at holding")), "{op}");
    assert!(d.contains(detail), "{d}");
}

#[tokio::test]
async fn a_write_whose_echo_is_not_the_request_is_a_bad_answer() {
    // The setpoint (holding 0, 33.5 °C = 0x0D16) echoed clamped to 30 °C.
    let clamped: Echo = |a, w| match (a, w) {
        (0, [_]) => Response::WriteSingleRegister(0, 3000),
        _ => right_echo(a, w),
    };
    // lead_pump (holding 2) echoed as holding 3's.
    let elsewhere: Echo = |a, w| match (a, w) {
        (2, [v]) => Response::WriteSingleRegister(3, *v),
        _ => right_echo(a, w),
    };
    let before = ["valves_open", "pumps_run", "lead_pump", "pump_speed"];
    for (echo, written, name, detail) in [
        (
            clamped,
            &before[..],
            "supply_setpoint",
            "the CDU echoed holding 0 = 0x0bb8, not holding 0 = 0x0d16",
        ),
        (
            elsewhere,
            &before[..2],
            "lead_pump",
            "the CDU echoed holding 3 = 0x0001, not holding 2 = 0x0001",
        ),
    ] {
        let addr = serve_echoing(echo).await;
        let mut client = tcp_client(RegisterMap::sim_cdu(), addr);
        let e = client.write(&SETTINGS).await.unwrap_err();
        assert_bad_echo(&e, written, name, detail);
        // The link is opened afresh for the next request, as after any
        // bad answer, and the next write goes in.
        assert!(
            format!("{client:?}").contains("connected: false"),
            "{client:?}"
        );
        let addr = serve_echoing(right_echo).await;
        tcp_client(RegisterMap::sim_cdu(), addr)
            .write(&SETTINGS)
            .await
            .expect("a write echoed right");
    }
}

#[tokio::test]
async fn a_two_word_write_echoed_with_another_count_or_address_is_a_bad_answer() {
    let short: Echo = |a, w| match (a, w) {
        (10, [_, _]) => Response::WriteMultipleRegisters(10, 1),
        _ => right_echo(a, w),
    };
    let moved: Echo = |a, w| match (a, w) {
        (10, [_, _]) => Response::WriteMultipleRegisters(11, 2),
        _ => right_echo(a, w),
    };
    // The echoes above answer two words at holding 10 only: the failures
    // are pump_speed's, written with function 16.
    let before = ["valves_open", "pumps_run", "lead_pump"];
    for (echo, detail) in [
        (
            short,
            "the CDU echoed holding 10, 1 registers, not holding 10, 2 registers",
        ),
        (
            moved,
            "the CDU echoed holding 11, 2 registers, not holding 10, 2 registers",
        ),
    ] {
        let addr = serve_echoing(echo).await;
        let e = tcp_client(wide_speed(), addr)
            .write(&SETTINGS)
            .await
            .unwrap_err();
        assert_bad_echo(&e, &before, "pump_speed", detail);
    }
    // Echoed right, and the registers read back hold what was written.
    let addr = serve_echoing(right_echo).await;
    tcp_client(wide_speed(), addr)
        .write(&SETTINGS)
        .await
        .expect("a two-word write echoed right");
}

/// The pump speed written to the u32 at holding 10-11 (72.5 %, raw 725).
const SPEED: Write = Write {
    setting: Setting::PumpSpeed,
    value: 72.5,
};

#[tokio::test]
async fn a_two_word_setting_the_cdu_clamps_is_a_bad_answer_naming_both_values() {
    // The CDU clamps the u32 pump speed to 70 % (raw 700) and echoes the
    // write as the specification asks: holding 10, 2 registers.
    let clamps: Keep = Some(|a, w| match (a, w) {
        (10, [_, _]) => vec![0, 700],
        _ => w.to_vec(),
    });
    let addr = serve_keeping(right_echo, clamps).await;
    let mut client = tcp_client(wide_speed(), addr);
    let e = client.write_setting(&SPEED).await.unwrap_err();
    let CduError::BadAnswer { op, detail } = &e else {
        panic!("not a bad answer: {e:?}");
    };
    assert_eq!(
        op,
        &format!(
            "write pump_speed at holding 10 of unit 1 on Modbus TCP {addr}, \
             value 72.5 % (raw 0x0000 0x02d5)"
        )
    );
    assert_eq!(
        detail,
        "the CDU echoed the write, but holding 10-11 reads back value 70 % (raw 0x0000 0x02bc), \
         not the value 72.5 % (raw 0x0000 0x02d5) written: it clamped the value or did not take it"
    );
    // A whole write stops there, naming what went in before.
    let e = client.write(&SETTINGS).await.unwrap_err();
    assert_bad_echo(
        &e,
        &["valves_open", "pumps_run", "lead_pump"],
        "pump_speed",
        "reads back value 70 %",
    );
    // A CDU that holds what it is sent: taken.
    let addr = serve_keeping(right_echo, AS_SENT).await;
    let mut client = tcp_client(wide_speed(), addr);
    client.write_setting(&SPEED).await.expect("taken as sent");
    client.write(&SETTINGS).await.expect("every setting taken");
}

/// The supply setpoint written to the i16 at holding 0 (42 °C, raw 4200).
const SETPOINT: Write = Write {
    setting: Setting::Setpoint,
    value: 42.0,
};

#[tokio::test]
async fn a_one_word_setting_the_cdu_clamps_is_a_bad_answer() {
    // The CDU clamps the setpoint to 40 °C (raw 4000) and echoes the
    // write as the specification asks: holding 0 = 4200, the value sent.
    // It holds lead pump A (0) whatever is written.
    let clamps: Keep = Some(|a, w| match (a, w) {
        (0, [_]) => vec![4000],
        (2, [_]) => vec![0],
        _ => w.to_vec(),
    });
    let addr = serve_keeping(right_echo, clamps).await;
    let mut client = tcp_client(RegisterMap::sim_cdu(), addr);
    client.write_setting(&SETPOINT).await.expect("echoed right");
    // The step's read-back: one request over what it wrote.
    let speed = Write {
        setting: Setting::PumpSpeed,
        value: 72.5,
    };
    client.write_setting(&speed).await.expect("echoed right");
    let failed = client.read_back(&[SETPOINT, speed]).await.not_held;
    let [(settings, e)] = failed.as_slice() else {
        panic!("one setting not held: {failed:?}");
    };
    assert_eq!(settings, &[Setting::Setpoint]);
    let CduError::BadAnswer { op, detail } = e else {
        panic!("not a bad answer: {e:?}");
    };
    assert_eq!(
        op,
        &format!(
            "write supply_setpoint at holding 0 of unit 1 on Modbus TCP {addr}, \
             value 42 °C (raw 0x1068)"
        )
    );
    assert_eq!(
        detail,
        "the CDU echoed the write, but holding 0 reads back value 40 °C (raw 0x0fa0), \
         not the value 42 °C (raw 0x1068) written: it clamped the value or did not take it"
    );
    // A whole write names every setting not held, each with its cause.
    let e = client.write(&SETTINGS).await.unwrap_err();
    let CduError::ReadBack {
        written,
        failed,
        not_known,
        causes,
    } = &e
    else {
        panic!("not a read-back failure: {e:?}");
    };
    assert_eq!(
        written,
        &["valves_open", "pumps_run", "pump_speed", "heartbeat"]
    );
    assert_eq!(failed, &["lead_pump", "supply_setpoint"]);
    assert!(not_known.is_empty(), "{e}");
    assert_eq!(causes.len(), 2, "{e}");
    for (cause, name) in causes.iter().zip(["lead_pump", "supply_setpoint"]) {
        assert!(
            cause
                .to_string()
                .starts_with(&format!("write {name} at holding")),
            "{cause}"
        );
    }
    assert!(
        e.to_string().starts_with(
            "wrote valves_open, pumps_run, pump_speed, heartbeat; lead_pump, supply_setpoint \
             read back another value; none not read back (taken as echoed): write lead_pump"
        ),
        "{e}"
    );
    // A CDU that holds what it is sent: taken.
    let addr = serve_keeping(right_echo, AS_SENT).await;
    let mut client = tcp_client(RegisterMap::sim_cdu(), addr);
    for w in [SETPOINT, speed] {
        client.write_setting(&w).await.expect("echoed right");
    }
    let back = client.read_back(&[SETPOINT, speed]).await;
    assert!(
        back.not_held.is_empty() && back.unread.is_empty(),
        "{back:?}"
    );
    // What it holds is read, not what was last sent: a setting this step
    // did not write reads back as the CDU holds it.
    let lead = Write {
        setting: Setting::LeadPump,
        value: 1.0,
    };
    let failed = client.read_back(&[SETPOINT, lead]).await.not_held;
    assert!(
        matches!(failed.as_slice(), [(s, CduError::BadAnswer { .. })] if s == &[Setting::LeadPump]),
        "{failed:?}"
    );
    client.write(&SETTINGS).await.expect("every setting taken");
}

#[tokio::test]
async fn a_two_word_setting_that_cannot_be_read_back_is_not_taken() {
    // The CDU echoes every write right but refuses reads of its holding
    // registers: whether it took the two-word speed is not known.
    let addr = serve_keeping(right_echo, None).await;
    let e = tcp_client(wide_speed(), addr)
        .write_setting(&SPEED)
        .await
        .unwrap_err();
    assert_eq!(e.refused_code(), Some(1), "{e:?}");
    assert!(
        e.to_string().starts_with(&format!(
            "write pump_speed at holding 10 of unit 1 on Modbus TCP {addr}, value 72.5 % \
             (raw 0x0000 0x02d5), read back from holding 10-11: the CDU refused it with \
             exception 1"
        )),
        "{e}"
    );
    // One-word settings are read back too, each step's in one request
    // (the echo of function 6 is the request, whatever the CDU kept): not
    // served, they stay as their echo said, the failure reported apart.
    let mut client = tcp_client(RegisterMap::sim_cdu(), addr);
    client.write_setting(&SETPOINT).await.expect("echoed right");
    let back = client.read_back(&[SETPOINT]).await;
    assert!(back.not_held.is_empty(), "{back:?}");
    let [(settings, e)] = back.unread.as_slice() else {
        panic!("the setpoint unread: {back:?}");
    };
    assert_eq!(settings, &[Setting::Setpoint]);
    assert_eq!(e.refused_code(), Some(1), "{e:?}");
    let e = client.write(&SETTINGS).await.unwrap_err();
    assert_eq!(e.refused_code(), Some(1), "{e:?}");
    // Every setting the run holds is named as not known, and taken.
    assert!(
        e.to_string().starts_with(
            "wrote valves_open, pumps_run, lead_pump, pump_speed, supply_setpoint, heartbeat; \
             none read back another value; valves_open, pumps_run, lead_pump, pump_speed, \
             supply_setpoint not read back (taken as echoed): "
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains(&format!(
            "read back holding 0-4 (supply_setpoint to pumps_run) of unit 1 on Modbus TCP {addr}: \
             the CDU refused it with exception 1"
        )),
        "{e}"
    );
}

#[tokio::test]
async fn a_refused_write_names_the_value_and_the_raw_words_it_tried() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cdu = SimCdu::new(RegisterMap::sim_cdu(), &[]).expect("a CDU");
    tokio::spawn(cdu.serve(listener));
    // This client's map lets the setpoint go to 60 °C; the CDU stops at 45.
    let wide = map_with("max = 45.0", "max = 60.0");
    let e = tcp_client(wide, addr)
        .write(&CduSettings {
            setpoint_c: 50.0,
            ..SETTINGS
        })
        .await
        .unwrap_err();
    assert_eq!(e.refused_code(), Some(3), "{e:?}");
    let want = format!(
        "write supply_setpoint at holding 0 of unit 1 on Modbus TCP {addr}, value 50 °C \
         (raw 0x1388): the CDU refused it with exception 3 (illegal data value)"
    );
    assert!(e.to_string().ends_with(&want), "{e}");
}

/// A CDU that answers the read of inputs 0-6 (temperatures, flow, pumps,
/// leaks) and refuses every other read of input registers with
/// exception 4 (a meter sub-device that failed).
#[derive(Clone)]
struct MetersFailed;

impl tokio_modbus::server::Service for MetersFailed {
    type Request = SlaveRequest<'static>;
    type Response = Response;
    type Exception = ExceptionCode;
    type Future = Ready<Result<Response, ExceptionCode>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        ready(match req.request {
            // Supply 30.12 °C, return 38.5 °C, flow 192.3 L/min, facility
            // 27 °C, pump A running, B not, rack 2 wet.
            Request::ReadInputRegisters(0, 7) => Ok(Response::ReadInputRegisters(vec![
                3012, 3850, 1923, 2700, 1, 0, 0b100,
            ])),
            Request::ReadInputRegisters(..) => Err(ExceptionCode::ServerDeviceFailure),
            _ => Err(ExceptionCode::IllegalFunction),
        })
    }
}

#[tokio::test]
async fn a_read_request_the_cdu_refuses_loses_only_its_own_registers() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let on_connected = |stream, socket_addr| async move {
            accept_tcp_connection(stream, socket_addr, |_| Ok(Some(MetersFailed)))
        };
        let _ = Server::new(listener)
            .serve(&on_connected, |e| eprintln!("CDU: {e}"))
            .await;
    });
    let mut client = tcp_client(RegisterMap::sim_cdu(), addr);
    assert_eq!(client.read_requests(), vec![(0, 7), (10, 11)]);
    let r = client.read().await.expect("one request answered");
    // What answered is kept: the temperatures, the pumps, the leaks.
    assert_eq!(r.supply_c, Some(30.12));
    assert_eq!(r.pumps_running, [Some(true), Some(false)]);
    assert_eq!(r.leaks, Some(0b100));
    // What the refused request holds is unknown.
    assert_eq!((r.it_w, r.facility_w, r.outdoor_c), (None, None, None));
    assert_eq!(r.pump_faults, [None, None]);
    // The refusal is reported beside the readings.
    let gaps = client.read_gaps();
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    assert_eq!(gaps[0].refused_code(), Some(4), "{gaps:?}");
    assert_eq!(
        gaps[0].to_string(),
        format!(
            "read input 10-20 (it_power to outdoor_temp) of unit 1 on Modbus TCP {addr}: \
             the CDU refused it with exception 4 (server device failure)"
        )
    );
}

/// A TCP peer that takes one connection, reads a request, writes `answer`
/// and closes the connection.
async fn closing_peer(answer: &'static [u8]) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("a connection");
        let mut request = [0u8; 12];
        stream.read_exact(&mut request).await.expect("a request");
        stream.write_all(answer).await.expect("the answer");
        stream.shutdown().await.expect("close");
    });
    addr
}

#[tokio::test]
async fn a_cdu_that_closes_the_connection_says_so_with_no_stray_system_error() {
    // Nothing, or the first 9 of the 23 bytes a read of 7 registers takes.
    let half: &[u8] = &[0, 0, 0, 0, 0, 17, 1, 4, 14];
    for answer in [&[][..], half] {
        let addr = closing_peer(answer).await;
        let mut client = tcp_client(RegisterMap::sim_cdu(), addr);
        let e = client.read().await.unwrap_err();
        assert!(matches!(e, CduError::Io { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "read input 0-6 (supply_temp to leak_inputs) of unit 1 on Modbus TCP {addr}: \
                 the CDU closed the connection before a whole answer came"
            )
        );
        // Still a link failure: the next request connects again.
        assert!(
            format!("{client:?}").contains("connected: false"),
            "{client:?}"
        );
    }
}

// ---- RTU on a pseudo-terminal pair ----

/// Two pseudo-terminals joined by `socat` (the two ends of an RS-485
/// cable), or `None` (skip, said on stderr) without socat outside CI.
/// socat is killed when this is dropped.
struct PtyPair {
    socat: Child,
    dir: tempfile::TempDir,
}

impl PtyPair {
    fn start() -> Option<PtyPair> {
        let socat = loopwarden_system_tests::require_tool("socat")?;
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
        while !(pair.end("a").exists() && pair.end("b").exists()) {
            assert!(
                Instant::now() < deadline,
                "socat made no pseudo-terminals in 5 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(pair)
    }

    /// End `a` (the controller's) or `b` (the CDU's), as a path.
    fn end(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn path(&self, name: &str) -> String {
        self.end(name).to_str().expect("a UTF-8 path").to_string()
    }
}

impl Drop for PtyPair {
    fn drop(&mut self) {
        let _ = self.socat.kill();
        let _ = self.socat.wait();
    }
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

/// A CDU on end `b` that answers one request with `answer`.
fn answer_once(pair: &PtyPair, answer: Vec<u8>) -> tokio::task::JoinHandle<()> {
    let b = pair.path("b");
    tokio::spawn(async move {
        let mut port =
            tokio_serial::SerialStream::open(&tokio_serial::new(b, 19_200)).expect("open b");
        let mut req = [0u8; 8];
        port.read_exact(&mut req).await.expect("a request");
        assert_eq!(&req[..2], &[1, 4], "a read of input registers of unit 1");
        port.write_all(&answer).await.expect("the answer");
        port.flush().await.expect("flush");
        // Give socat time to pass it on before the port closes.
        tokio::time::sleep(Duration::from_millis(100)).await;
    })
}

#[tokio::test]
async fn a_garbled_rtu_answer_is_a_bad_answer_and_the_line_is_cleared_before_the_next() {
    let Some(pair) = PtyPair::start() else {
        return;
    };
    // A frame with a right CRC whose register bytes are odd in number, and
    // a run of bytes no CRC fits.
    let mut odd = vec![1, 4, 3, 0x12, 0x34, 0x56];
    odd.extend(crc16(&odd));
    let noise = vec![0u8; 200];
    let line = SerialLine::new(pair.path("a"));
    let mut client = ModbusCdu::new(RegisterMap::sim_cdu(), Link::Rtu(line))
        .with_timeout(Duration::from_millis(2_000));
    for (answer, why) in [(odd, "invalid quantity"), (noise, "Too many retries")] {
        let cdu = answer_once(&pair, answer);
        let e = client.read().await.unwrap_err();
        let CduError::BadAnswer { detail, .. } = &e else {
            panic!("not a bad answer: {e:?}");
        };
        assert_eq!(detail, &format!("it could not be decoded ({why})"));
        assert!(
            e.to_string()
                .starts_with("read input 0-6 (supply_temp to leak_inputs) of unit 1 on Modbus RTU"),
            "{e}"
        );
        // The next request reopens the port and waits for a quiet line.
        let state = format!("{client:?}");
        assert!(state.contains("connected: false, resync: true"), "{state}");
        cdu.await.expect("the garbling CDU");
    }
    // A whole answer of the right length with one byte flipped on the
    // way (its CRC no longer fits): the decoder waits for more, and the
    // request ends at its timeout, but bytes came: garbled, never said as
    // "no answer" (which sends the engineer to the cable and the unit id).
    let mut flipped = vec![1, 4, 14];
    flipped.extend([
        0x0b, 0xc4, 0x0f, 0x0a, 0x07, 0x83, 0x0a, 0x8c, 0, 1, 0, 0, 0, 0,
    ]);
    flipped.extend(crc16(&flipped));
    flipped[5] ^= 0x10;
    let line = SerialLine::new(pair.path("a"));
    let mut quick = ModbusCdu::new(RegisterMap::sim_cdu(), Link::Rtu(line))
        .with_timeout(Duration::from_millis(500));
    let cdu = answer_once(&pair, flipped);
    let e = quick.read().await.unwrap_err();
    assert!(
        matches!(
            e,
            CduError::Garbled {
                bytes: 19,
                after_ms: 500,
                ..
            }
        ),
        "not garbled: {e:?}"
    );
    assert!(
        e.to_string()
            .contains(": 19 bytes came within 500 ms, none of them a whole answer to it"),
        "{e}"
    );
    // It waited out its timeout: a step tries no more writes after it.
    assert!(e.is_unanswered());
    cdu.await.expect("the garbling CDU");
    drop(quick);

    // The real CDU takes the line over: the client reads it.
    let cdu = SimCdu::new(RegisterMap::sim_cdu(), &[]).expect("a CDU");
    cdu.set_measurement("supply_temp", 32.05)
        .expect("a measurement");
    let server = tokio::spawn(cdu.serve_rtu(pair.path("b"), 19_200));
    let r = client.read().await.expect("a read after the garbled ones");
    assert_eq!(r.supply_c, Some(32.05));
    server.abort();
}
