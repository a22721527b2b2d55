//! The Modbus TCP server: the register file every connection shares
//! (reads from the latest snapshot, writes handed to the shell) and
//! [`serve`], the tokio-modbus service around it, which answers its own
//! unit id ([`addressed`]).

use std::collections::BTreeSet;
use std::future::{ready, Ready};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::vec::Vec;

use loopwarden_boards::modbus_map::{Kind, RegisterMap};
use loopwarden_boards::modbus_server::{answer, RegisterFile};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_modbus::server::tcp::{accept_tcp_connection, Server};
use tokio_modbus::{ExceptionCode, Response, SlaveRequest};

use super::{check_map, decode_write, encode_snapshot, NorthboundSnapshot, NorthboundWrite};

/// The log target: the module's path before it was split, so log lines
/// and filters read as they did.
const TARGET: &str = "cooling_ctrl::northbound";

/// What every connection shares.
pub(super) struct State {
    pub(super) map: RegisterMap,
    pub(super) snapshots: watch::Receiver<NorthboundSnapshot>,
    pub(super) writes: Option<mpsc::Sender<NorthboundWrite>>,
}

impl State {
    pub(super) fn read(
        &self,
        kind: Kind,
        addr: u16,
        count: u16,
    ) -> Result<Vec<u16>, ExceptionCode> {
        if count == 0 || count > 125 {
            return Err(ExceptionCode::IllegalDataValue);
        }
        let img = encode_snapshot(&self.map, &self.snapshots.borrow(), self.writes.is_some());
        let table = match kind {
            Kind::Input => &img.input,
            Kind::Holding => &img.holding,
        };
        (u32::from(addr)..u32::from(addr) + u32::from(count))
            .map(|a| {
                u16::try_from(a)
                    .ok()
                    .and_then(|a| table.get(&a).copied())
                    .ok_or(ExceptionCode::IllegalDataAddress)
            })
            .collect()
    }

    pub(super) fn write(&self, addr: u16, words: &[u16]) -> Result<(), ExceptionCode> {
        let Some(tx) = &self.writes else {
            return Err(ExceptionCode::IllegalFunction);
        };
        let writes = decode_write(&self.map, addr, words)?;
        if writes.is_empty() {
            return Ok(());
        }
        let permits = tx.try_reserve_many(writes.len()).map_err(|e| match e {
            mpsc::error::TrySendError::Full(()) => ExceptionCode::ServerDeviceBusy,
            mpsc::error::TrySendError::Closed(()) => ExceptionCode::ServerDeviceFailure,
        })?;
        for (permit, w) in permits.zip(writes) {
            tracing::info!(target: TARGET, "northbound: the BMS writes {w:?}");
            permit.send(w);
        }
        Ok(())
    }
}

impl RegisterFile for State {
    fn read_registers(&self, kind: Kind, addr: u16, count: u16) -> Result<Vec<u16>, ExceptionCode> {
        self.read(kind, addr, count)
    }
    fn write_registers(&self, addr: u16, words: &[u16]) -> Result<(), ExceptionCode> {
        self.write(addr, words)
    }
}

/// The unit id that reaches a Modbus TCP server itself, whatever its own
/// (the Modbus TCP implementation guide's "non-significant" value).
pub const ANY_UNIT: u8 = 255;

/// Whether a request for `unit` is for the server of unit id `own`: its
/// own id, or [`ANY_UNIT`]. Any other (0, the serial line's broadcast,
/// included) is for a device this server is not, and gets no answer.
pub fn addressed(unit: u8, own: u8) -> bool {
    unit == own || unit == ANY_UNIT
}

/// One connection's service: answers the requests [`addressed`] to it,
/// and logs the first request for each other unit id.
struct Service {
    state: Arc<State>,
    peer: SocketAddr,
    ignored: Mutex<BTreeSet<u8>>,
}

impl tokio_modbus::server::Service for Service {
    type Request = SlaveRequest<'static>;
    type Response = Option<Response>;
    type Exception = ExceptionCode;
    type Future = Ready<Result<Option<Response>, ExceptionCode>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        let own = self.state.map.unit_id;
        if addressed(req.slave, own) {
            return ready(answer(&*self.state, req.request).map(Some));
        }
        let first = self
            .ignored
            .lock()
            .map(|mut seen| seen.insert(req.slave))
            .unwrap_or(false);
        if first {
            tracing::warn!(
                target: TARGET,
                "northbound: {} asks unit {}; this server is unit {own} (northbound_unit_id, \
                 or {ANY_UNIT}): no answer",
                self.peer,
                req.slave
            );
        }
        ready(Ok(None))
    }
}

/// Serves `map` over Modbus TCP on `listener` from the latest of
/// `snapshots` until the task is dropped or the listener fails, as the
/// map's unit id (requests for other units get no answer, see
/// [`addressed`]). `writes`:
/// where accepted writes go (`None`: writes are disabled and refused with
/// exception 1); give it room for a few (a multiple write of every
/// register takes 4 places, 3 when the alarm acknowledge is written 0), a
/// full channel refuses with exception 6. A map [`check_map`] refuses is an `InvalidInput`
/// error before anything is served. When the snapshot sender is dropped it
/// goes on serving the last snapshot (its `uptime` no longer advances).
pub async fn serve(
    listener: TcpListener,
    map: RegisterMap,
    snapshots: watch::Receiver<NorthboundSnapshot>,
    writes: Option<mpsc::Sender<NorthboundWrite>>,
) -> io::Result<()> {
    check_map(&map).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(
            target: TARGET,
            "northbound: serving {:?} on {addr} as unit {} (and {ANY_UNIT}), writes {}",
            map.model,
            map.unit_id,
            if writes.is_some() {
                "enabled"
            } else {
                "disabled"
            }
        );
    }
    let state = Arc::new(State {
        map,
        snapshots,
        writes,
    });
    let server = Server::new(listener);
    let on_connected = |stream, socket_addr: SocketAddr| {
        let state = state.clone();
        async move {
            accept_tcp_connection(stream, socket_addr, move |peer| {
                Ok(Some(Service {
                    state: state.clone(),
                    peer,
                    ignored: Mutex::default(),
                }))
            })
        }
    };
    let on_error = |e| tracing::warn!(target: TARGET, "northbound: Modbus connection failed: {e}");
    server.serve(&on_connected, on_error).await
}
