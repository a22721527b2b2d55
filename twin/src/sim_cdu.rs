//! The simulated CDU on Modbus TCP or Modbus RTU: the twin's CDU, reached
//! the way a real one is.
//!
//! It serves a [`RegisterMap`]: input registers hold the measurements the
//! twin last wrote ([`SimCdu::set_measurement`]), holding registers the
//! settings a client writes and the twin reads ([`SimCdu::setting`]). A
//! read or write of an address the map does not have is answered with
//! exception 2 (illegal data address), a write outside a setting's range
//! with exception 3 (illegal data value), a function it does not serve
//! with exception 1; a refused write changes nothing (a multiple write is
//! all or nothing). Over RTU it answers only its map's unit id (and does
//! broadcast writes without answering), like a CDU on a shared bus. In
//! local mode ([`SimCdu::set_local`], switched at its panel) it refuses
//! every write with exception 4 (server device failure) and still answers
//! reads. Cut off its bus ([`SimCdu::set_cut`], a Modbus outage), every
//! request gets exception 11 (gateway target device failed to respond),
//! as from the gateway in front of a CDU it cannot reach.
//!
//! What clients write can be watched ([`SimCdu::observe_writes`]): the
//! observer is called with every write a client makes over TCP or RTU,
//! done or refused, in the order they were done, under the lock they are
//! done under; while the twin holds that lock ([`SimCdu::hold_writes`],
//! say around a step of its hall and the account of it), a client's
//! write waits.
//!
//! Glossary:
//! - *image*: the registers' current words, as a client reads them.
//! - *client write*: a write a client sent over Modbus (a single or
//!   multiple register write), as opposed to the twin's own
//!   ([`SimCdu::write_setting`]), which nobody observes.
//! - *RTU*: Modbus on a serial line (RS-485), framed by silence, with a
//!   CRC; the serial device may be a pseudo-terminal in tests.

use std::collections::BTreeMap;
use std::future::{ready, Future, Ready};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio_modbus::server::tcp::{accept_tcp_connection, Server};
use tokio_modbus::{ExceptionCode, Request, Response, SlaveRequest};
use tokio_serial::SerialPort as _;

use loopwarden_boards::modbus_map::{Kind, RegisterMap, ValueError};
use loopwarden_boards::modbus_server::{answer, RegisterFile};

struct Image {
    input: BTreeMap<u16, u16>,
    holding: BTreeMap<u16, u16>,
}

/// What a CDU that has lost its controller runs on: its own safe setpoint
/// (`fallback_setpoint_c`) at full pump speed, the pumps it was told to
/// run (its `lead` pump if none), its valves as they were. Returns the
/// setpoint, the speed and the pumps.
pub fn fallback(
    lp: &loopwarden_boards::site::LoopModel,
    pump_on: [bool; 2],
    lead: usize,
) -> (f64, f64, [bool; 2]) {
    let pumps = if pump_on.iter().any(|&p| p) {
        pump_on
    } else {
        [lead == 0, lead != 0]
    };
    (lp.fallback_setpoint_c, 1.0, pumps)
}

/// A client's write, as the simulated CDU did or refused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientWrite<'a> {
    /// The unit id it was sent to (0: a broadcast over RTU; over TCP,
    /// whichever the client put in: every one is answered).
    pub unit: u8,
    /// The first register's address.
    pub address: u16,
    /// The words from `address` on.
    pub words: &'a [u16],
    /// Done, or refused with this exception (nothing changed).
    pub outcome: Result<(), ExceptionCode>,
}

/// What is called with each client write.
type WriteObserver = Arc<dyn Fn(&ClientWrite<'_>) + Send + Sync>;

/// The simulated CDU's registers (clone it freely: one image).
#[derive(Clone)]
pub struct SimCdu {
    map: Arc<RegisterMap>,
    image: Arc<Mutex<Image>>,
    local: Arc<std::sync::atomic::AtomicBool>,
    cut: Arc<std::sync::atomic::AtomicBool>,
    /// The lock every client write is done under, and its observer.
    writes: Arc<Mutex<Option<WriteObserver>>>,
}

/// Client writes held back ([`SimCdu::hold_writes`]) until it is dropped.
pub struct WritesHeld<'a> {
    _held: MutexGuard<'a, Option<WriteObserver>>,
}

impl SimCdu {
    /// A CDU serving `map`, every register at 0 except the settings given.
    pub fn new(map: RegisterMap, settings: &[(&str, f64)]) -> Result<Self, ValueError> {
        let mut input = BTreeMap::new();
        let mut holding = BTreeMap::new();
        for r in map.registers() {
            let words = match r.kind {
                Kind::Input => &mut input,
                Kind::Holding => &mut holding,
            };
            for a in r.address..r.address + r.ty.words() {
                words.insert(a, 0);
            }
        }
        let cdu = Self {
            map: Arc::new(map),
            image: Arc::new(Mutex::new(Image { input, holding })),
            local: Arc::default(),
            cut: Arc::default(),
            writes: Arc::default(),
        };
        for (name, value) in settings {
            cdu.write_setting(name, *value)?;
        }
        Ok(cdu)
    }

    /// The map it serves.
    pub fn map(&self) -> &RegisterMap {
        &self.map
    }

    /// Calls `observer` with every client write from now on, done or
    /// refused, in the order they are done, each before the next is done
    /// (in place of any observer before). It runs under the lock of
    /// [`SimCdu::hold_writes`]: it must not take that lock, nor one that
    /// is held while waiting for it.
    pub fn observe_writes(&self, observer: impl Fn(&ClientWrite<'_>) + Send + Sync + 'static) {
        *self.writes.lock().expect("client writes") = Some(Arc::new(observer));
    }

    /// Holds every client write back until the guard is dropped (a write
    /// under way is done, and observed, first). Reads go on.
    ///
    /// A held-back write blocks the runtime thread serving its connection,
    /// and a blocked thread may be the one that drives the runtime's
    /// timers and sockets: hold writes for synchronous work only, never
    /// across an `.await` on the runtime serving the CDU.
    pub fn hold_writes(&self) -> WritesHeld<'_> {
        WritesHeld {
            _held: self.writes.lock().expect("client writes"),
        }
    }

    /// A client's write of `words` from `addr` to `unit`: done or
    /// refused, then observed, under the writes' lock.
    fn client_write(&self, unit: u8, addr: u16, words: &[u16]) -> Result<(), ExceptionCode> {
        let observer = self.writes.lock().expect("client writes");
        let outcome = self.write(addr, words);
        if let Some(observe) = observer.as_ref() {
            observe(&ClientWrite {
                unit,
                address: addr,
                words,
                outcome,
            });
        }
        outcome
    }

    /// Switches local mode on (every client write refused) or off.
    pub fn set_local(&self, local: bool) {
        self.local
            .store(local, std::sync::atomic::Ordering::Relaxed);
    }

    /// Cuts the CDU off its bus (`true`: a Modbus outage) or joins it
    /// again: while cut, every request is answered by the gateway in
    /// front of it with exception 11 (gateway target device failed to
    /// respond), and nothing is read or written.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::Relaxed);
    }

    fn is_cut(&self) -> bool {
        self.cut.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// In local mode.
    pub fn local(&self) -> bool {
        self.local.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn put(&self, name: &str, value: f64, kind: Kind) -> Result<(), ValueError> {
        let r = self
            .map
            .get(name)
            .filter(|r| r.kind == kind)
            .ok_or_else(|| ValueError::Unknown(name.to_string()))?;
        let words = self.map.encode(name, value)?;
        let mut img = self.image.lock().expect("register image");
        let table = match kind {
            Kind::Input => &mut img.input,
            Kind::Holding => &mut img.holding,
        };
        for (i, w) in words.into_iter().enumerate() {
            table.insert(r.address + i as u16, w);
        }
        Ok(())
    }

    /// The twin writes a measurement (an input register).
    pub fn set_measurement(&self, name: &str, value: f64) -> Result<(), ValueError> {
        self.put(name, value, Kind::Input)
    }

    /// Sets a setting as a client would (checked against its range).
    pub fn write_setting(&self, name: &str, value: f64) -> Result<(), ValueError> {
        self.put(name, value, Kind::Holding)
    }

    fn get(&self, name: &str, kind: Kind) -> Result<f64, ValueError> {
        let r = self
            .map
            .get(name)
            .filter(|r| r.kind == kind)
            .ok_or_else(|| ValueError::Unknown(name.to_string()))?;
        let img = self.image.lock().expect("register image");
        let table = match kind {
            Kind::Input => &img.input,
            Kind::Holding => &img.holding,
        };
        let words: Vec<u16> = (r.address..r.address + r.ty.words())
            .map(|a| table[&a])
            .collect();
        self.map.decode(name, &words)
    }

    /// A setting's value as clients left it.
    pub fn setting(&self, name: &str) -> Result<f64, ValueError> {
        self.get(name, Kind::Holding)
    }

    /// A measurement as clients read it.
    pub fn measurement(&self, name: &str) -> Result<f64, ValueError> {
        self.get(name, Kind::Input)
    }

    fn read(&self, kind: Kind, addr: u16, count: u16) -> Result<Vec<u16>, ExceptionCode> {
        if self.is_cut() {
            return Err(ExceptionCode::GatewayTargetDevice);
        }
        if count == 0 || count > 125 {
            return Err(ExceptionCode::IllegalDataValue);
        }
        let img = self.image.lock().expect("register image");
        let table = match kind {
            Kind::Input => &img.input,
            Kind::Holding => &img.holding,
        };
        (addr..addr.saturating_add(count))
            .map(|a| {
                table
                    .get(&a)
                    .copied()
                    .ok_or(ExceptionCode::IllegalDataAddress)
            })
            .collect()
    }

    /// Writes `words` from `addr`: every register touched whole, every
    /// value in range, or nothing changes.
    fn write(&self, addr: u16, words: &[u16]) -> Result<(), ExceptionCode> {
        if self.is_cut() {
            return Err(ExceptionCode::GatewayTargetDevice);
        }
        if self.local() {
            return Err(ExceptionCode::ServerDeviceFailure);
        }
        if words.is_empty() || words.len() > 123 {
            return Err(ExceptionCode::IllegalDataValue);
        }
        let end = addr as u32 + words.len() as u32;
        let mut updates = Vec::new();
        let mut a = addr as u32;
        while a < end {
            let r = self
                .map
                .at(Kind::Holding, a as u16)
                .ok_or(ExceptionCode::IllegalDataAddress)?;
            let n = r.ty.words() as u32;
            if a + n > end {
                return Err(ExceptionCode::IllegalDataAddress);
            }
            let slice = &words[(a - addr as u32) as usize..(a + n - addr as u32) as usize];
            let value = self
                .map
                .decode(&r.name, slice)
                .map_err(|_| ExceptionCode::ServerDeviceFailure)?;
            self.map.encode(&r.name, value).map_err(|e| match e {
                ValueError::OutOfRange { .. } | ValueError::DoesNotFit { .. } => {
                    ExceptionCode::IllegalDataValue
                }
                ValueError::Unknown(_) => ExceptionCode::IllegalDataAddress,
            })?;
            updates.push((a as u16, slice.to_vec()));
            a += n;
        }
        let mut img = self.image.lock().expect("register image");
        for (start, ws) in updates {
            for (i, w) in ws.into_iter().enumerate() {
                img.holding.insert(start + i as u16, w);
            }
        }
        Ok(())
    }

    /// Serves Modbus TCP on `listener` until the task is dropped.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        let server = Server::new(listener);
        let on_connected = |stream, socket_addr: SocketAddr| {
            let cdu = self.clone();
            async move {
                accept_tcp_connection(stream, socket_addr, move |_| Ok(Some(Service(cdu.clone()))))
            }
        };
        let on_error = |e| tracing::warn!("simulated CDU: Modbus connection failed: {e}");
        server.serve(&on_connected, on_error).await
    }

    /// Serves Modbus RTU on the serial device at `path` (8 data bits, no
    /// parity, 1 stop bit at `baud`) until the task is dropped or the
    /// line fails. Bytes that arrived before it opened the port are
    /// discarded.
    pub fn serve_rtu(
        self,
        path: impl Into<String>,
        baud: u32,
    ) -> impl std::future::Future<Output = std::io::Result<()>> + Send + 'static {
        let path = path.into();
        async move {
            let line = RtuLine::open(&path, baud)?;
            self.serve_rtu_on(line).await
        }
    }

    /// Serves Modbus RTU on a line already opened (so a caller can say at
    /// once why a device would not open) until the task is dropped or the
    /// line fails.
    pub async fn serve_rtu_on(self, line: RtuLine) -> std::io::Result<()> {
        let service = RtuService {
            cdu: self,
            turnaround: line.turnaround,
        };
        tokio_modbus::server::rtu::Server::new(line.port)
            .serve_forever(service)
            .await
    }
}

/// A serial device opened for [`SimCdu::serve_rtu_on`].
pub struct RtuLine {
    port: tokio_serial::SerialStream,
    turnaround: Duration,
}

impl RtuLine {
    /// Opens `path` at `baud`, 8 data bits, no parity, 1 stop bit, and
    /// discards whatever arrived before. Needs a tokio runtime.
    pub fn open(path: &str, baud: u32) -> std::io::Result<Self> {
        let port = open_serial(path, baud)?;
        port.clear(tokio_serial::ClearBuffer::All)?;
        Ok(Self {
            port,
            turnaround: Duration::ZERO,
        })
    }

    /// Each answer sent `turnaround` after its request was read, as a
    /// real CDU's controller takes tens of milliseconds (a write is done
    /// at once; only its answer waits).
    pub fn answering_after(self, turnaround: Duration) -> Self {
        Self { turnaround, ..self }
    }
}

/// Opens the serial device `path` at `baud` (8N1), waiting up to 2 s
/// while another holder has it. The port is opened with an exclusive
/// lock: a process being started elsewhere in this program inherits the
/// descriptor until it runs its own program, and keeps a reopen out for
/// that instant. Needs a tokio runtime.
pub fn open_serial(path: &str, baud: u32) -> std::io::Result<tokio_serial::SerialStream> {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        match tokio_serial::SerialStream::open(&tokio_serial::new(path, baud)) {
            Ok(port) => return Ok(port),
            Err(e) if e.kind == tokio_serial::ErrorKind::NoDevice => {
                if std::time::Instant::now() >= deadline {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::ResourceBusy,
                        format!("{path} is in use by another program: {}", e.description),
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The simulated CDU as a client addressing `unit` reaches it.
struct Client<'a> {
    cdu: &'a SimCdu,
    unit: u8,
}

impl RegisterFile for Client<'_> {
    fn read_registers(&self, kind: Kind, addr: u16, count: u16) -> Result<Vec<u16>, ExceptionCode> {
        self.cdu.read(kind, addr, count)
    }
    fn write_registers(&self, addr: u16, words: &[u16]) -> Result<(), ExceptionCode> {
        self.cdu.client_write(self.unit, addr, words)
    }
}

impl SimCdu {
    /// Answers `req` from a client addressing `unit`.
    fn answer(&self, unit: u8, req: Request<'_>) -> Result<Response, ExceptionCode> {
        answer(&Client { cdu: self, unit }, req)
    }
}

/// One TCP connection's service: every unit id is answered.
struct Service(SimCdu);

impl tokio_modbus::server::Service for Service {
    type Request = SlaveRequest<'static>;
    type Response = Response;
    type Exception = ExceptionCode;
    type Future = Ready<Result<Response, ExceptionCode>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        ready(self.0.answer(req.slave, req.request))
    }
}

/// The RTU service: answers its own unit id only, each answer after the
/// line's turnaround.
struct RtuService {
    cdu: SimCdu,
    turnaround: Duration,
}

/// An RTU answer, sent after the turnaround.
type RtuAnswer = Result<Option<Response>, ExceptionCode>;

impl tokio_modbus::server::Service for RtuService {
    type Request = SlaveRequest<'static>;
    type Response = Option<Response>;
    type Exception = ExceptionCode;
    type Future = Pin<Box<dyn Future<Output = RtuAnswer> + Send>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        let answer = self.answer(req);
        let turnaround = self.turnaround;
        if turnaround.is_zero() || matches!(answer, Ok(None)) {
            return Box::pin(ready(answer));
        }
        Box::pin(async move {
            tokio::time::sleep(turnaround).await;
            answer
        })
    }
}

impl RtuService {
    /// The answer to `req`, its write done.
    fn answer(&self, req: SlaveRequest<'static>) -> RtuAnswer {
        match req.slave {
            // Broadcast: writes are done, nobody answers.
            0 => match req.request {
                Request::WriteSingleRegister(..) | Request::WriteMultipleRegisters(..) => {
                    let _ = self.cdu.answer(0, req.request);
                    Ok(None)
                }
                _ => Ok(None),
            },
            id if id == self.cdu.map.unit_id => self.cdu.answer(id, req.request).map(Some),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;
    use std::time::Duration;
    use tokio_modbus::server::Service as _;

    /// What an observer saw: unit, address, words, outcome.
    type Seen = Arc<Mutex<Vec<(u8, u16, Vec<u16>, Result<(), ExceptionCode>)>>>;

    /// The shipped map's CDU (unit id 1), its writes observed.
    fn observed() -> (SimCdu, Seen) {
        let cdu = SimCdu::new(RegisterMap::sim_cdu(), &[("supply_setpoint", 30.0)]).unwrap();
        let seen: Seen = Arc::default();
        let s = seen.clone();
        cdu.observe_writes(move |w| {
            s.lock()
                .unwrap()
                .push((w.unit, w.address, w.words.to_vec(), w.outcome));
        });
        (cdu, seen)
    }

    fn to(slave: u8, request: Request<'static>) -> SlaveRequest<'static> {
        SlaveRequest { slave, request }
    }

    #[test]
    fn every_client_write_is_observed_in_order_done_or_refused() {
        use ExceptionCode::*;
        let (cdu, seen) = observed();
        cdu.write_setting("pump_speed", 50.0).unwrap();
        let tcp = Service(cdu.clone());
        let call = |slave, req| tcp.call(to(slave, req)).into_inner();
        assert!(call(7, Request::WriteSingleRegister(3, 1)).is_ok());
        let both = Request::WriteMultipleRegisters(0, Cow::Owned(vec![9900, 800]));
        assert_eq!(call(7, both), Err(IllegalDataValue));
        assert!(call(7, Request::ReadHoldingRegisters(0, 2)).is_ok());
        cdu.set_local(true);
        assert_eq!(
            call(2, Request::WriteSingleRegister(5, 9)),
            Err(ServerDeviceFailure)
        );
        cdu.set_local(false);
        cdu.set_cut(true);
        assert_eq!(
            call(2, Request::WriteSingleRegister(5, 9)),
            Err(GatewayTargetDevice)
        );
        // The twin's own write and the read are not clients' writes.
        assert_eq!(
            *seen.lock().unwrap(),
            vec![
                (7, 3, vec![1], Ok(())),
                (7, 0, vec![9900, 800], Err(IllegalDataValue)),
                (2, 5, vec![9], Err(ServerDeviceFailure)),
                (2, 5, vec![9], Err(GatewayTargetDevice)),
            ]
        );
        assert_eq!(cdu.setting("valves_open").unwrap(), 1.0);
        assert_eq!(
            cdu.setting("supply_setpoint").unwrap(),
            30.0,
            "refused whole"
        );
        assert_eq!(cdu.setting("pump_speed").unwrap(), 50.0);
    }

    #[test]
    fn over_rtu_its_own_unit_and_broadcasts_are_observed_and_no_other() {
        let (cdu, seen) = observed();
        let rtu = RtuService {
            cdu: cdu.clone(),
            turnaround: Duration::ZERO,
        };
        let call = |slave, req| rtu.answer(to(slave, req));
        assert!(call(1, Request::WriteSingleRegister(3, 1))
            .unwrap()
            .is_some());
        assert_eq!(call(0, Request::WriteSingleRegister(4, 2)), Ok(None));
        assert_eq!(call(9, Request::WriteSingleRegister(3, 0)), Ok(None));
        assert_eq!(
            *seen.lock().unwrap(),
            vec![(1, 3, vec![1], Ok(())), (0, 4, vec![2], Ok(()))]
        );
        assert_eq!(cdu.setting("valves_open").unwrap(), 1.0, "unit 9 ignored");
        assert_eq!(cdu.setting("pumps_run").unwrap(), 2.0, "the broadcast done");
    }

    #[tokio::test]
    async fn over_rtu_a_write_is_done_at_once_and_answered_after_the_turnaround() {
        let (cdu, _) = observed();
        let rtu = RtuService {
            cdu: cdu.clone(),
            turnaround: Duration::from_millis(30),
        };
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let began = std::time::Instant::now();
        let mut answer = rtu.call(to(1, Request::WriteSingleRegister(3, 1)));
        assert_eq!(cdu.setting("valves_open").unwrap(), 1.0, "done at once");
        assert!(
            answer.as_mut().poll(&mut cx).is_pending(),
            "answered at once"
        );
        assert!(answer.await.unwrap().is_some());
        assert!(began.elapsed() >= Duration::from_millis(30));
        // Nothing to say (another unit): nothing waits.
        let mut none = rtu.call(to(9, Request::WriteSingleRegister(3, 0)));
        assert_eq!(
            none.as_mut().poll(&mut cx),
            std::task::Poll::Ready(Ok(None))
        );
    }

    #[test]
    fn a_client_write_waits_while_the_twin_holds_writes_and_reads_go_on() {
        let (cdu, seen) = observed();
        let held = cdu.hold_writes();
        let client = cdu.clone();
        let writer = std::thread::spawn(move || {
            Service(client)
                .call(to(1, Request::WriteSingleRegister(3, 1)))
                .into_inner()
        });
        std::thread::sleep(Duration::from_millis(200));
        let read = Service(cdu.clone())
            .call(to(1, Request::ReadHoldingRegisters(3, 1)))
            .into_inner();
        assert_eq!(read, Ok(Response::ReadHoldingRegisters(vec![0])));
        assert!(seen.lock().unwrap().is_empty(), "not done while held");
        drop(held);
        assert!(writer.join().unwrap().is_ok());
        assert_eq!(*seen.lock().unwrap(), vec![(1, 3, vec![1], Ok(()))]);
        assert_eq!(cdu.setting("valves_open").unwrap(), 1.0);
    }
}
