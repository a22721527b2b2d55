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
//! Glossary:
//! - *image*: the registers' current words, as a client reads them.
//! - *RTU*: Modbus on a serial line (RS-485), framed by silence, with a
//!   CRC; the serial device may be a pseudo-terminal in tests.

use std::collections::BTreeMap;
use std::future::{ready, Ready};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

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

/// The simulated CDU's registers (clone it freely: one image).
#[derive(Clone)]
pub struct SimCdu {
    map: Arc<RegisterMap>,
    image: Arc<Mutex<Image>>,
    local: Arc<std::sync::atomic::AtomicBool>,
    cut: Arc<std::sync::atomic::AtomicBool>,
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
        tokio_modbus::server::rtu::Server::new(line.0)
            .serve_forever(RtuService(self))
            .await
    }
}

/// A serial device opened for [`SimCdu::serve_rtu_on`].
pub struct RtuLine(tokio_serial::SerialStream);

impl RtuLine {
    /// Opens `path` at `baud`, 8 data bits, no parity, 1 stop bit, and
    /// discards whatever arrived before. Needs a tokio runtime.
    pub fn open(path: &str, baud: u32) -> std::io::Result<Self> {
        let port = tokio_serial::SerialStream::open(&tokio_serial::new(path, baud))?;
        port.clear(tokio_serial::ClearBuffer::All)?;
        Ok(Self(port))
    }
}

impl RegisterFile for SimCdu {
    fn read_registers(&self, kind: Kind, addr: u16, count: u16) -> Result<Vec<u16>, ExceptionCode> {
        self.read(kind, addr, count)
    }
    fn write_registers(&self, addr: u16, words: &[u16]) -> Result<(), ExceptionCode> {
        self.write(addr, words)
    }
}

/// One connection's service.
struct Service(SimCdu);

impl tokio_modbus::server::Service for Service {
    type Request = Request<'static>;
    type Response = Response;
    type Exception = ExceptionCode;
    type Future = Ready<Result<Response, ExceptionCode>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        ready(answer(&self.0, req))
    }
}

/// The RTU service: answers its own unit id only.
struct RtuService(SimCdu);

impl tokio_modbus::server::Service for RtuService {
    type Request = SlaveRequest<'static>;
    type Response = Option<Response>;
    type Exception = ExceptionCode;
    type Future = Ready<Result<Option<Response>, ExceptionCode>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        ready(match req.slave {
            // Broadcast: writes are done, nobody answers.
            0 => match req.request {
                Request::WriteSingleRegister(..) | Request::WriteMultipleRegisters(..) => {
                    let _ = answer(&self.0, req.request);
                    Ok(None)
                }
                _ => Ok(None),
            },
            id if id == self.0.map.unit_id => answer(&self.0, req.request).map(Some),
            _ => Ok(None),
        })
    }
}
