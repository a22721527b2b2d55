//! The CDU client over Modbus TCP against CDUs that answer a read in
//! part: a lost request that holds a pump's running flag fails the read
//! as a whole, since a flag not read would be taken as a pump stopped.

use std::future::{ready, Ready};
use std::net::SocketAddr;
use std::time::Duration;

use cooling_ctrl::modbus::{CduPort, Link, ModbusCdu};
use loopwarden_boards::modbus_map::RegisterMap;
use tokio_modbus::server::tcp::{accept_tcp_connection, Server};
use tokio_modbus::{ExceptionCode, Request, Response, SlaveRequest};

/// A CDU busy for the read of inputs 0-6 (temperatures, flow, the pumps'
/// running flags, leaks: exception 6) that answers inputs 10-20.
#[derive(Clone)]
struct FlagsBusy;

impl tokio_modbus::server::Service for FlagsBusy {
    type Request = SlaveRequest<'static>;
    type Response = Response;
    type Exception = ExceptionCode;
    type Future = Ready<Result<Response, ExceptionCode>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        ready(match req.request {
            Request::ReadInputRegisters(0, 7) => Err(ExceptionCode::ServerDeviceBusy),
            Request::ReadInputRegisters(10, n) => {
                Ok(Response::ReadInputRegisters(vec![0; n.into()]))
            }
            _ => Err(ExceptionCode::IllegalFunction),
        })
    }
}

/// Serves `cdu` on a loopback port.
async fn serve<S>(cdu: S) -> SocketAddr
where
    S: tokio_modbus::server::Service<
            Request = SlaveRequest<'static>,
            Response = Response,
            Exception = ExceptionCode,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let on_connected = move |stream, socket_addr| {
            let cdu = cdu.clone();
            async move { accept_tcp_connection(stream, socket_addr, move |_| Ok(Some(cdu.clone()))) }
        };
        let _ = Server::new(listener)
            .serve(&on_connected, |e| eprintln!("CDU: {e}"))
            .await;
    });
    addr
}

#[tokio::test]
async fn a_read_that_loses_the_pump_running_flags_fails_whole() {
    let addr = serve(FlagsBusy).await;
    let mut client = ModbusCdu::new(RegisterMap::sim_cdu(), Link::Tcp(addr.into()))
        .with_timeout(Duration::from_millis(2_000));
    assert_eq!(client.read_requests(), vec![(0, 7), (10, 11)]);
    for _ in 0..6 {
        // Step after step: never a reading with the pumps read as
        // stopped, whatever answered beside.
        let e = client.read().await.expect_err("the running flags lost");
        assert_eq!(e.refused_code(), Some(6), "{e:?}");
        let said = e.to_string();
        assert!(
            said.starts_with(&format!(
                "read input 0-6 (supply_temp to leak_inputs) of unit 1 on Modbus TCP {addr} \
                 (it lost pump_a_running: the whole read fails"
            )) && said.ends_with("exception 6 (server device busy)"),
            "{said}"
        );
        assert!(client.read_gaps().is_empty(), "{:?}", client.read_gaps());
    }
}
