//! A BMS on the controller's northbound Modbus TCP server, for the tests
//! that play one (`run`, `gateway_bms_clears`): its client, connected, on
//! a runtime of its own.

use std::net::SocketAddr;

use tokio::runtime::Runtime;
use tokio_modbus::client::Context;

/// A Modbus TCP client connected to the northbound server at `addr`, and
/// the runtime to drive it on.
pub fn connect(addr: SocketAddr) -> (Runtime, Context) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ctx = rt
        .block_on(tokio_modbus::client::tcp::connect(addr))
        .expect("the northbound server answers");
    (rt, ctx)
}
