//! The CDU's Modbus client against CDUs that answer wrongly: a write whose
//! echo is not the request (a clamped value, another register), a garbled
//! RTU answer, a TCP peer that closes the connection; and what a refused
//! write says it tried to write.

use std::future::{ready, Ready};
use std::net::SocketAddr;
use std::time::Duration;

use cooling_ctrl::modbus::{CduError, CduSettings, Link, ModbusCdu};
use loopwarden_boards::modbus_map::RegisterMap;
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

/// A Modbus TCP CDU that answers writes with its [`Echo`] (and takes
/// nothing), and reads with zeros.
#[derive(Clone, Copy)]
struct Echoing(Echo);

impl tokio_modbus::server::Service for Echoing {
    type Request = SlaveRequest<'static>;
    type Response = Response;
    type Exception = ExceptionCode;
    type Future = Ready<Result<Response, ExceptionCode>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        ready(match req.request {
            Request::WriteSingleRegister(a, w) => Ok((self.0)(a, &[w])),
            Request::WriteMultipleRegisters(a, words) => Ok((self.0)(a, &words)),
            Request::ReadInputRegisters(_, n) => {
                Ok(Response::ReadInputRegisters(vec![0; n.into()]))
            }
            _ => Err(ExceptionCode::IllegalFunction),
        })
    }
}

/// Serves an [`Echoing`] CDU on a loopback port.
async fn serve_echoing(echo: Echo) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let on_connected = move |stream, socket_addr| async move {
            accept_tcp_connection(stream, socket_addr, move |_| Ok(Some(Echoing(echo))))
        };
        let _ = Server::new(listener)
            .serve(&on_connected, |e| eprintln!("echoing CDU: {e}"))
            .await;
    });
    addr
}

fn tcp_client(map: RegisterMap, addr: SocketAddr) -> ModbusCdu {
    ModbusCdu::new(map, Link::Tcp(addr)).with_timeout(Duration::from_millis(2_000))
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
    let addr = serve_echoing(right_echo).await;
    tcp_client(wide_speed(), addr)
        .write(&SETTINGS)
        .await
        .expect("a two-word write echoed right");
}
