//! The Modbus TCP server: the register file every connection shares
//! (reads from the latest snapshot, writes handed to the shell) and
//! [`serve`], the tokio-modbus service around it, which answers its own
//! unit id ([`addressed`]). It keeps at most [`Limits::max_connections`]
//! connections open (one more is closed at once, as a Modbus TCP server
//! does when it has no room) and closes one that sends no request for
//! [`Limits::idle`] ([`LIMITS`] by default; `loopwarden_field::listen`).
//! When the listener fails to accept, it serves again on the same socket
//! after a short backoff ([`super::again`]).
//!
//! A write is answered once the holding registers read what it wrote:
//! the shell (or the gateway) takes it from the channel on another task
//! and publishes a snapshot with it, and an answer sent before that would
//! let a BMS that reads back at once (its write-verify) see the old
//! value. It waits for the snapshot's settings to show every value the
//! write handed on ([`shows`](super::NorthboundSettings::shows)), for
//! [`WRITE_SHOWN_WITHIN`] at most; then it answers all the same (the
//! write is taken, and reads back once the loop publishes it). An
//! `alarm_ack` is handed on with what the registers show alarming as it
//! comes ([`NorthboundWrite::seeing`]): the loop takes it later, and an
//! alarm that rose in between is not acknowledged by it.
//!
//! Glossary:
//! - *shown*: the latest snapshot's settings hold a write's value.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::future::{ready, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use std::vec::Vec;

use loopwarden_boards::modbus_map::{Kind, RegisterMap};
use loopwarden_boards::modbus_server::{answer, RegisterFile};
use loopwarden_field::listen::{Gate, Limits, ListenStats};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_modbus::server::tcp::Server;
use tokio_modbus::{ExceptionCode, Response, SlaveRequest};

use super::again::{serve_again, BACKOFF};
use super::guard::Guarded;
use super::{check_map, decode_write, encode_snapshot, NorthboundSnapshot, NorthboundWrite};

/// The log target: the module's path before it was split, so log lines
/// and filters read as they did.
pub(super) const TARGET: &str = "cooling_ctrl::northbound";

/// How long a write's answer waits for the holding registers to read what
/// it wrote. The gateway and `run` show a write within a millisecond or
/// so (`run` between its steps); a loop busy for longer (a step waiting
/// on a silent CDU), or a server whose writes nobody takes, answers after
/// this: well inside the second `mbpoll` waits for an answer by default,
/// as BMS clients commonly do.
pub const WRITE_SHOWN_WITHIN: Duration = Duration::from_millis(200);

/// What every connection shares.
pub(super) struct State {
    pub(super) map: RegisterMap,
    pub(super) snapshots: watch::Receiver<NorthboundSnapshot>,
    pub(super) writes: Option<mpsc::Sender<Vec<NorthboundWrite>>>,
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

    /// Checks the write of `words` from `addr` and hands it on: the
    /// writes handed on (none for `alarm_ack` written 0). An `alarm_ack`
    /// carries what the registers show alarming now, all it acknowledges
    /// ([`NorthboundWrite::seeing`]).
    pub(super) fn write(
        &self,
        addr: u16,
        words: &[u16],
    ) -> Result<Vec<NorthboundWrite>, ExceptionCode> {
        let Some(tx) = &self.writes else {
            return Err(ExceptionCode::IllegalFunction);
        };
        let seen = self.snapshots.borrow().alarms;
        let writes: Vec<_> = decode_write(&self.map, addr, words)?
            .into_iter()
            .map(|w| w.seeing(seen))
            .collect();
        if writes.is_empty() {
            return Ok(writes);
        }
        // One request's writes go as one: the shell applies them together,
        // so no step, read or restart sees half of a block written.
        tx.try_send(writes.clone()).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => ExceptionCode::ServerDeviceBusy,
            mpsc::error::TrySendError::Closed(_) => ExceptionCode::ServerDeviceFailure,
        })?;
        for w in &writes {
            // The shell says the writes that change a setting.
            tracing::debug!(target: TARGET, "northbound: the BMS writes {w}");
        }
        Ok(writes)
    }

    /// Completes once the latest snapshot shows every one of `writes`, or
    /// after [`WRITE_SHOWN_WITHIN`], or at once when the snapshots' sender
    /// is gone (nothing more will show).
    pub(super) fn shown(&self, writes: Vec<NorthboundWrite>) -> impl Future<Output = ()> + Send {
        let mut snapshots = self.snapshots.clone();
        async move {
            if writes.is_empty() {
                return;
            }
            let all_shown = |s: &NorthboundSnapshot| writes.iter().all(|w| s.settings.shows(*w));
            let waited = tokio::time::timeout(WRITE_SHOWN_WITHIN, snapshots.wait_for(all_shown));
            if waited.await.is_err() {
                tracing::debug!(
                    target: TARGET,
                    "northbound: a write does not read back within {} ms: answered all the same",
                    WRITE_SHOWN_WITHIN.as_millis()
                );
            }
        }
    }
}

impl RegisterFile for State {
    fn read_registers(&self, kind: Kind, addr: u16, count: u16) -> Result<Vec<u16>, ExceptionCode> {
        self.read(kind, addr, count)
    }
    fn write_registers(&self, addr: u16, words: &[u16]) -> Result<(), ExceptionCode> {
        self.write(addr, words).map(drop)
    }
}

/// One request's view of the register file: as [`State`], keeping the
/// writes it handed on, whose showing its answer waits for.
struct Call<'a> {
    state: &'a State,
    handed: RefCell<Vec<NorthboundWrite>>,
}

impl RegisterFile for Call<'_> {
    fn read_registers(&self, kind: Kind, addr: u16, count: u16) -> Result<Vec<u16>, ExceptionCode> {
        self.state.read(kind, addr, count)
    }
    fn write_registers(&self, addr: u16, words: &[u16]) -> Result<(), ExceptionCode> {
        let handed = self.state.write(addr, words)?;
        self.handed.borrow_mut().extend(handed);
        Ok(())
    }
}

/// The northbound server's bounds unless configured
/// (`northbound_max_connections`, `northbound_idle_s`): a BMS or SCADA
/// poller keeps one connection open and polls every few seconds, a slow
/// poll (trends) every minute; with a historian, a commissioning laptop
/// and a second BMS that is a handful of connections, and 16 leave room.
/// 120 s is twice the slowest common poll, so a poller keeps its
/// connection, while one left open by a client that went away is freed
/// within two minutes.
pub const LIMITS: Limits = Limits {
    max_connections: 16,
    idle: std::time::Duration::from_secs(120),
};

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
    type Future = Pin<Box<dyn Future<Output = Result<Option<Response>, ExceptionCode>> + Send>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        let own = self.state.map.unit_id;
        if addressed(req.slave, own) {
            let call = Call {
                state: &self.state,
                handed: RefCell::default(),
            };
            let answered = answer(&call, req.request).map(Some);
            let shown = self.state.shown(call.handed.into_inner());
            return Box::pin(async move {
                shown.await;
                answered
            });
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
        Box::pin(ready(Ok(None)))
    }
}

/// Serves `map` over Modbus TCP on `listener` from the latest of
/// `snapshots` until the task is dropped, as the map's unit id (requests for other units get no answer, see
/// [`addressed`]). `writes`:
/// where accepted writes go (`None`: writes are disabled and refused with
/// exception 1); each request's writes take one place together, and a
/// full channel refuses with exception 6. A map [`check_map`] refuses is an `InvalidInput`
/// error before anything is served. When the snapshot sender is dropped it
/// goes on serving the last snapshot (its `uptime` no longer advances).
/// When the listener fails to accept, the connections open are closed and
/// it serves again on the same socket after a short backoff, the failure
/// logged (`serve_again`).
/// Its bounds are [`LIMITS`]; [`serve_within`] takes others.
pub async fn serve(
    listener: TcpListener,
    map: RegisterMap,
    snapshots: watch::Receiver<NorthboundSnapshot>,
    writes: Option<mpsc::Sender<Vec<NorthboundWrite>>>,
) -> io::Result<()> {
    let stats = ListenStats::default();
    serve_within(listener, map, snapshots, writes, LIMITS, stats).await
}

/// As [`serve`], keeping `limits` (connections at once, idle time),
/// its refusals and idle closes counted in `stats`.
pub async fn serve_within(
    listener: TcpListener,
    map: RegisterMap,
    snapshots: watch::Receiver<NorthboundSnapshot>,
    writes: Option<mpsc::Sender<Vec<NorthboundWrite>>>,
    limits: Limits,
    stats: ListenStats,
) -> io::Result<()> {
    check_map(&map).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(
            target: TARGET,
            "northbound: serving {:?} on {addr} as unit {} (and {ANY_UNIT}), writes {}, \
             at most {} connections, each closed after {} s without a request",
            map.model,
            map.unit_id,
            if writes.is_some() {
                "enabled"
            } else {
                "disabled"
            },
            limits.max_connections,
            limits.idle.as_secs_f64()
        );
    }
    let state = Arc::new(State {
        map,
        snapshots,
        writes,
    });
    let gate = Gate::new(
        "northbound Modbus server",
        "northbound_max_connections",
        limits,
        stats,
    );
    let socket = listener.into_std()?;
    let on_error = |e| tracing::warn!(target: TARGET, "northbound: Modbus connection failed: {e}");
    serve_again(socket, "the Modbus server", BACKOFF, |listener| {
        let (state, gate) = (state.clone(), gate.clone());
        async move {
            let on_connected = |stream: TcpStream, peer: SocketAddr| {
                let state = state.clone();
                let slot = gate.admit(&peer.to_string());
                async move {
                    // Over the cap: `stream` is dropped unread, which closes it.
                    let Some(slot) = slot else {
                        return Ok(None);
                    };
                    let service = Service {
                        state,
                        peer,
                        ignored: Mutex::default(),
                    };
                    // The idle time runs over whole requests: the guard
                    // hands on whole frames only, so bytes that trickle
                    // in without making one are not progress.
                    Ok(Some((
                        service,
                        slot.bound(Guarded::new(stream), peer.to_string()),
                    )))
                }
            };
            Server::new(listener).serve(&on_connected, on_error).await
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream as StdStream;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::northbound::{northbound_map, snapshot_channel};

    /// The server with `limits` on a free loopback port, in `rt`: its
    /// address and counts.
    fn served(rt: &tokio::runtime::Runtime, limits: Limits) -> (SocketAddr, ListenStats) {
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = snapshot_channel();
        // The sender stays: the server reads the last snapshot either way.
        std::mem::forget(tx);
        let stats = ListenStats::default();
        let counted = stats.clone();
        rt.spawn(serve_within(
            listener,
            northbound_map(),
            rx,
            None,
            limits,
            counted,
        ));
        (addr, stats)
    }

    /// A client connected to `addr`, its reads given up after 10 s.
    fn client(addr: SocketAddr) -> StdStream {
        let s = StdStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    /// Reads input register 0 (the mode) of unit 1 on `s`, as a BMS
    /// does: the answer's function code and value.
    fn read_mode(s: &mut StdStream, tid: u16) -> std::io::Result<(u8, u16)> {
        let [t0, t1] = tid.to_be_bytes();
        s.write_all(&[t0, t1, 0, 0, 0, 6, 1, 4, 0, 0, 0, 1])?;
        let mut answer = [0u8; 11];
        s.read_exact(&mut answer)?;
        assert_eq!(&answer[..2], &[t0, t1], "the answer to this request");
        Ok((answer[7], u16::from_be_bytes([answer[9], answer[10]])))
    }

    /// The server with writes enabled on a free loopback port, in `rt`,
    /// beside a stand-in for the shell that takes each write and, after
    /// `delay`, publishes a snapshot that holds it (`None`: it publishes
    /// nothing). Its address.
    fn served_with_writes(rt: &tokio::runtime::Runtime, delay: Option<Duration>) -> SocketAddr {
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = snapshot_channel();
        let (wtx, mut wrx) = mpsc::channel(16);
        rt.spawn(serve(listener, northbound_map(), rx, Some(wtx)));
        rt.spawn(async move {
            while let Some(ws) = wrx.recv().await {
                if let Some(d) = delay {
                    tokio::time::sleep(d).await;
                    tx.send_modify(|s| ws.iter().for_each(|w| s.settings.apply(*w)));
                }
            }
        });
        addr
    }

    /// Writes `value` to holding register `reg` of unit 1 on `s`: the
    /// answer's function code.
    fn write_register(s: &mut StdStream, tid: u16, reg: u16, value: u16) -> std::io::Result<u8> {
        let ([t0, t1], [r0, r1], [v0, v1]) =
            (tid.to_be_bytes(), reg.to_be_bytes(), value.to_be_bytes());
        s.write_all(&[t0, t1, 0, 0, 0, 6, 1, 6, r0, r1, v0, v1])?;
        let mut answer = [0u8; 12];
        s.read_exact(&mut answer[..9])?;
        if answer[7] == 6 {
            s.read_exact(&mut answer[9..])?;
        }
        Ok(answer[7])
    }

    /// Reads holding register `reg` of unit 1 on `s`.
    fn read_holding(s: &mut StdStream, tid: u16, reg: u16) -> std::io::Result<u16> {
        let ([t0, t1], [r0, r1]) = (tid.to_be_bytes(), reg.to_be_bytes());
        s.write_all(&[t0, t1, 0, 0, 0, 6, 1, 3, r0, r1, 0, 1])?;
        let mut answer = [0u8; 11];
        s.read_exact(&mut answer)?;
        assert_eq!(answer[7], 3, "a read, not an exception: {answer:?}");
        Ok(u16::from_be_bytes([answer[9], answer[10]]))
    }

    #[test]
    fn a_write_is_answered_once_the_holding_registers_read_it() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        // The shell takes the write and shows it 50 ms later: the answer
        // waits for it, and a read straight after reads it back.
        let mut bms = client(served_with_writes(&rt, Some(Duration::from_millis(50))));
        let minus_4_50 = (-450i16) as u16;
        let t0 = Instant::now();
        assert_eq!(write_register(&mut bms, 1, 3, minus_4_50).unwrap(), 6);
        let answered = t0.elapsed();
        assert!(
            answered >= Duration::from_millis(50),
            "answered in {answered:?}"
        );
        assert_eq!(
            read_holding(&mut bms, 2, 3).unwrap(),
            minus_4_50,
            "read back"
        );
        // A value already in force is answered, and still reads back
        // (that it is answered at once: `the_answer_waits_only_for_a_write_not_yet_shown`).
        assert_eq!(write_register(&mut bms, 3, 3, minus_4_50).unwrap(), 6);
        assert_eq!(read_holding(&mut bms, 4, 3).unwrap(), minus_4_50);
        // Nobody shows the writes: answered after WRITE_SHOWN_WITHIN all
        // the same, and the register reads what is in force (none).
        let mut bms = client(served_with_writes(&rt, None));
        let t0 = Instant::now();
        assert_eq!(write_register(&mut bms, 1, 3, minus_4_50).unwrap(), 6);
        let answered = t0.elapsed();
        assert!(answered >= WRITE_SHOWN_WITHIN, "answered in {answered:?}");
        assert_eq!(read_holding(&mut bms, 2, 3).unwrap(), 0x8000);
    }

    /// The wait of a write's answer, polled without a clock: ready at
    /// once when the snapshot already shows the writes (a value already
    /// in force, or nothing handed on), pending while it does not, ready
    /// once it does, and ready when the snapshots' sender is gone.
    #[test]
    fn the_answer_waits_only_for_a_write_not_yet_shown() {
        use futures::FutureExt;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _in_rt = rt.enter();
        let (tx, rx) = snapshot_channel();
        let state = State {
            map: northbound_map(),
            snapshots: rx,
            writes: None,
        };
        let outdoor = NorthboundWrite::OutdoorTemp { celsius: -4.5 };
        let ceiling = NorthboundWrite::SetpointCeiling { celsius: 30.0 };
        assert_eq!(state.shown(Vec::new()).now_or_never(), Some(()));
        let mut waiting = Box::pin(state.shown(vec![outdoor, ceiling]));
        assert_eq!((&mut waiting).now_or_never(), None, "not shown yet");
        tx.send_modify(|s| s.settings.apply(outdoor));
        assert_eq!((&mut waiting).now_or_never(), None, "half shown");
        tx.send_modify(|s| s.settings.apply(ceiling));
        assert_eq!(waiting.now_or_never(), Some(()), "shown");
        // Already in force: at once.
        let again = state.shown(vec![outdoor, ceiling]);
        assert_eq!(again.now_or_never(), Some(()), "already in force");
        // Nothing more will show once the sender is gone.
        let mut waiting =
            Box::pin(state.shown(vec![NorthboundWrite::PlanCeilingOffset { kelvin: -1.0 }]));
        assert_eq!((&mut waiting).now_or_never(), None);
        drop(tx);
        assert_eq!(waiting.now_or_never(), Some(()), "sender gone");
    }

    /// An `alarm_ack` handed on carries what the registers showed
    /// alarming as the server took it: the loop, which takes it later,
    /// acknowledges no more.
    #[test]
    fn an_alarm_ack_carries_what_the_registers_showed_alarming() {
        let (tx, rx) = snapshot_channel();
        let (wtx, mut wrx) = mpsc::channel(4);
        let state = State {
            map: northbound_map(),
            snapshots: rx,
            writes: Some(wtx),
        };
        let mut lit = NorthboundSnapshot {
            beacon: true,
            leak_sensing_lost: 1 << 1,
            ..NorthboundSnapshot::default()
        };
        crate::northbound::AlarmAck::default().shown(&mut lit, 87.0);
        let seen = lit.alarms;
        assert_ne!(seen, crate::northbound::Alarms::default());
        tx.send_replace(lit);
        let handed = vec![NorthboundWrite::AlarmAck { seen }];
        assert_eq!(state.write(2, &[1]), Ok(handed.clone()));
        assert_eq!(wrx.try_recv(), Ok(handed));
    }

    /// What the server sends on `s` before it closes: nothing, closed.
    fn closed_unanswered(mut s: StdStream) -> bool {
        let mut rest = Vec::new();
        match s.read_to_end(&mut rest) {
            Ok(_) => rest.is_empty(),
            // A close with the client's bytes unread resets.
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }

    #[test]
    fn a_connection_over_the_cap_is_closed_at_once_while_the_first_still_answers() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let limits = Limits {
            max_connections: 2,
            idle: Duration::from_secs(60),
        };
        let (addr, stats) = served(&rt, limits);
        let mut first = client(addr);
        assert_eq!(read_mode(&mut first, 1).unwrap(), (4, 0), "boot");
        let mut second = client(addr);
        assert_eq!(read_mode(&mut second, 2).unwrap(), (4, 0));
        let third = client(addr);
        assert!(closed_unanswered(third), "the third is closed at once");
        assert_eq!((stats.refused(), stats.open()), (1, 2));
        // The first two still answer.
        assert_eq!(read_mode(&mut first, 3).unwrap(), (4, 0));
        assert_eq!(read_mode(&mut second, 4).unwrap(), (4, 0));
        // One closes: its slot is taken by the next.
        drop(first);
        let deadline = Instant::now() + Duration::from_secs(10);
        while stats.open() > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut fourth = client(addr);
        assert_eq!(read_mode(&mut fourth, 5).unwrap(), (4, 0));
        assert_eq!(stats.refused(), 1);
    }

    #[test]
    fn a_connection_without_a_request_is_closed_after_the_idle_time() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let limits = Limits {
            max_connections: 16,
            idle: Duration::from_secs(1),
        };
        let (addr, stats) = served(&rt, limits);
        let mut bms = client(addr);
        assert_eq!(read_mode(&mut bms, 1).unwrap(), (4, 0));
        let quiet_from = Instant::now();
        assert!(closed_unanswered(bms), "closed by the server");
        // The server's wait began as it sent the answer, a little before
        // the client had it.
        let quiet = quiet_from.elapsed();
        assert!(
            quiet >= Duration::from_millis(900),
            "closed too soon: {quiet:?}"
        );
        assert_eq!((stats.idle_closed(), stats.open()), (1, 0));
        // A poller that asks within the idle time keeps its connection.
        let mut poller = client(addr);
        for tid in 0..4 {
            assert_eq!(read_mode(&mut poller, tid).unwrap(), (4, 0));
            std::thread::sleep(Duration::from_millis(250));
        }
        assert_eq!(stats.idle_closed(), 1);
    }

    #[test]
    fn bytes_that_trickle_in_without_making_a_request_do_not_keep_the_connection() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let limits = Limits {
            max_connections: 16,
            idle: Duration::from_secs(1),
        };
        let (addr, stats) = served(&rt, limits);
        let mut slow = client(addr);
        // A header that promises 254 bytes, then one byte every 300 ms.
        slow.write_all(&[0, 1, 0, 0, 0, 0xFE, 1]).unwrap();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(3) && stats.idle_closed() == 0 {
            std::thread::sleep(Duration::from_millis(300));
            if slow.write_all(&[3]).is_err() {
                break;
            }
        }
        let closed_after = t0.elapsed();
        assert_eq!(stats.idle_closed(), 1, "open after {closed_after:?}");
        assert!(
            closed_after < Duration::from_millis(2_500),
            "{closed_after:?}"
        );
    }
}
