//! A pump's clear against a CDU on Modbus TCP that refuses the read of
//! inputs 10-20, where its fault flags are (exception 2), while it
//! answers the rest: a fault flag is a bit word, which no pattern turns
//! into "not available", so it reads no value only when its request
//! failed. The clear is refused naming that read, not the CDU's "not
//! available", which would send the engineer to the pump's drive.
use std::future::{ready, Ready};

use super::*;
use crate::modbus::{Link, ModbusCdu};
use loopwarden_boards::modbus_map::RegisterMap;
use tokio_modbus::server::tcp::{accept_tcp_connection, Server};
use tokio_modbus::{ExceptionCode, Request, Response, SlaveRequest};

/// The simulated CDU's map served as all zeros, but inputs 10-20
/// refused (illegal data address).
#[derive(Clone)]
struct FlagsRefused;

impl tokio_modbus::server::Service for FlagsRefused {
    type Request = SlaveRequest<'static>;
    type Response = Response;
    type Exception = ExceptionCode;
    type Future = Ready<Result<Response, ExceptionCode>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        ready(match req.request {
            Request::ReadInputRegisters(10, _) => Err(ExceptionCode::IllegalDataAddress),
            Request::ReadInputRegisters(_, n) => {
                Ok(Response::ReadInputRegisters(vec![0; n.into()]))
            }
            _ => Err(ExceptionCode::IllegalFunction),
        })
    }
}

/// The shell's devices on a [`FlagsRefused`] CDU, read once.
async fn read_once() -> Devices<ModbusCdu> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let on_connected = |stream, socket_addr| async move {
            accept_tcp_connection(stream, socket_addr, |_| Ok(Some(FlagsRefused)))
        };
        let _ = Server::new(listener)
            .serve(&on_connected, |e| eprintln!("CDU: {e}"))
            .await;
    });
    let cdu = ModbusCdu::new(RegisterMap::sim_cdu(), Link::Tcp(addr.into()))
        .with_timeout(std::time::Duration::from_secs(5));
    assert_eq!(cdu.read_requests(), [(0, 7), (10, 11)]);
    let mut d = Devices::new(cdu, None).seen_held();
    let mut stats = ShellStats::default();
    assert!(d.read_cdu(&mut stats).await.is_some(), "read in part");
    assert_eq!(stats.cdu_read_errors, 1, "the refused request counted");
    d
}

#[tokio::test]
async fn a_pump_clear_whose_fault_flag_read_was_refused_names_the_read_not_the_cdus_not_available()
{
    let d = read_once().await;
    for (pump, flag) in [(0, "pump_a_fault"), (1, "pump_b_fault")] {
        let why = d
            .pump_fault(pump)
            .expect_err("unknown: refused")
            .to_string();
        assert!(
            why.starts_with(&format!("not cleared: {flag} was not read this step"))
                && why.contains("read input 10-20 (it_power to outdoor_temp)")
                && why.contains("exception 2 (illegal data address)")
                && !why.contains("not available"),
            "{why}"
        );
    }
}
