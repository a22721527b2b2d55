//! The CDU over Modbus: what the controller reads from the CDU and the
//! settings it writes, behind the narrow [`CduPort`] trait, and
//! [`ModbusCdu`], its implementation over Modbus TCP or Modbus RTU on a
//! serial line.
//!
//! Everything about registers comes from the CDU model's register map
//! ([`RegisterMap`], `boards/cdus/*.toml`): addresses, types, scale and the
//! word order of 32-bit values. A measurement or setting the map does not
//! have reads `None` and is not written; nothing here judges whether a
//! value is plausible (a lost 4–20 mA sensor reads raw 0, which the control
//! core tells from a real 0). Before the controller starts on a map,
//! [`check_map`] refuses one it does not fit: a name it neither reads nor
//! writes, no `valves_open`, `pumps_run` or `heartbeat`, no pump running
//! flag (`pump_a_running`, `pump_b_running`), a setting's range
//! that leaves out what it writes, a unit other than the one the
//! controller takes the register in (it converts nothing). The
//! heartbeat counter is written within its register's range, wrapping
//! ([`heartbeat_value`]). A pump's running flag reads running
//! only as 1 and stopped only as 0; any other value reads `None`, said
//! once (`flags`).
//!
//! Reads take as few requests as the map allows: one per run of contiguous
//! input registers (at most 125 registers each); a request that fails
//! while another answers loses only its own registers, and is reported
//! beside the readings (`reads`, [`CduPort::read_gaps`]), unless it
//! loses a pump's running flag: then the read fails whole. Writes take one request
//! per setting, one setting at a time ([`CduPort::write_setting`]: the
//! decision path, [`crate::decide`], orders them and holds each to the
//! map's range); [`ModbusCdu::write`] writes a whole [`CduSettings`] for
//! tools, every value checked against the map before the first request
//! goes out, and when one fails after others went in the error names both
//! ([`CduError::Partial`]); its read-back names every setting found
//! not held or not read back ([`CduError::ReadBack`]). A write is done only when the CDU's answer
//! echoes it (the register and the value; for two words the first
//! register and the count) and its registers read back (function 3) hold
//! what was written: neither echo shows what the CDU kept (function 6's
//! is the request itself). A two-word setting is read back right after
//! its echo; a step's one-word settings together after its writes, one
//! request per run of contiguous holding registers
//! ([`CduPort::read_back`], `read_back`), the heartbeat left out; a run
//! whose read-back fails leaves its settings as echoed, said apart
//! ([`ReadBack::unread`]). Every request runs under a timeout (500 ms
//! unless set); after a request that got no answer, a broken link or a
//! garbled answer, the next request opens the link afresh (for RTU: reopens
//! the port and discards whatever arrives until the line is quiet, so a
//! late answer is not taken for the next one).
//!
//! Glossary, for whoever reads the errors in the field:
//! - *refused* ([`CduError::Refused`]): the CDU answered, with a Modbus
//!   exception: it is there and talking, but would not do it. Code 1
//!   (illegal function): it does not serve that request; 2 (illegal data
//!   address): the register is not where the map says, so the map does not
//!   match this CDU or its firmware; 3 (illegal data value): the CDU would
//!   not take the value (outside its own range, which may be narrower than
//!   the map's); 4 (server device failure) and 6 (busy): the CDU's own
//!   fault or load; 10 and 11: a gateway between here and the CDU could not
//!   reach it. Retrying the same thing gives the same answer unless
//!   something changes.
//! - *no answer* ([`CduError::NoAnswer`]): nothing came back within the
//!   timeout. The request may not have arrived (cable, termination, wrong
//!   unit id, baud rate or parity on RTU; a CDU that is off or hung) or its
//!   answer got lost; a write that got no answer may or may not have gone
//!   in.
//! - *garbled* ([`CduError::Garbled`]): on a serial line, bytes came but
//!   never a whole answer before the timeout (a bad CRC, noise): counted
//!   as no answer for what follows, and said as what it is.
//! - *link failure* ([`CduError::Io`]): the link itself failed before or
//!   while asking: the serial port cannot be opened (or another program
//!   holds it past the timeout: "in use by another program"), the TCP connection is
//!   refused or closed ("the CDU closed the connection": the CDU, or a
//!   gateway or firewall on the way, dropped it; the next request
//!   connects again), the serial device hung up ("the serial device hung
//!   up (adapter unplugged or reset)": its reads ended; the next request
//!   opens it again).
//! - *bad answer* ([`CduError::BadAnswer`]): something answered, but not to
//!   this request (another unit, another function, the wrong length, a
//!   write's echo with another register or value, which may be a value the
//!   CDU clamped, a setting that reads back another value than the one
//!   written, or an answer that does not decode, such as a bad RTU
//!   CRC): noise on the line, two masters on one bus, a late answer, or a
//!   CDU that did not write what was asked.
//! - *value* ([`CduError::Value`]): a setting the map says the CDU cannot
//!   take; nothing was sent.
//! - *unit id*: the CDU's Modbus address on its bus (from the map).

extern crate std;

use std::borrow::Cow;
use std::boxed::Box;
use std::fmt;
use std::format;
use std::io;
use std::net::SocketAddr;
use std::string::{String, ToString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use std::vec::Vec;

use crate::decide::{MapLimits, Setting, Write};
use loopwarden_boards::modbus_map::{input_spans, Kind, Register, RegisterMap, ValueError};
use tokio::io::AsyncReadExt as _;
use tokio::time::Instant;
use tokio_modbus::client::{Client as _, Context};
use tokio_modbus::{Request, Response, Slave};
use tokio_serial::{ClearBuffer, SerialPort as _, SerialStream};

pub use tokio_serial::{DataBits, Parity, StopBits};

mod error;
mod fit;
mod flags;
mod link;
mod read_back;
mod reads;

pub use error::{exception_meaning, CduError};
pub use fit::{check_map, map_limits, UnfitMap};
pub use link::{connect_failure, Link, SerialLine, TcpTarget};
use link::{connect_tcp, drain, open_serial, Watched};
pub use read_back::{read_back_runs, ReadBack};

/// What the CDU measures, decoded with the map's scale (the decision
/// path's type, shared with the firmware).
pub use cooling_decide::CduMeasurements;

/// The value written for heartbeat step `counter` to register `r`:
/// `min + counter mod (max - min + 1)` over the whole numbers of its
/// range, so it changes every step whatever the range (a range of 0 to
/// 255 would refuse step 256 on, and the heartbeat would stop for good).
/// Without a range, `counter` as a 16-bit word holds it.
///
/// [`Register::heartbeat`] computes it, for the firmware too. A range with
/// no whole value at all writes `counter`: [`check_map`] refuses such a map.
pub fn heartbeat_value(r: &Register, counter: f64) -> f64 {
    r.heartbeat(counter)
}

/// The settings the controller writes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CduSettings {
    /// Supply temperature setpoint, °C (`supply_setpoint`).
    pub setpoint_c: f64,
    /// Pump speed command, % (`pump_speed`).
    pub pump_speed_pct: f64,
    /// Lead pump, 0 = A, 1 = B (`lead_pump`).
    pub lead_pump: u8,
    /// Rack valves open, bit n = rack n (`valves_open`).
    pub valves_open: u16,
    /// Pumps to run, bit 0 A, bit 1 B (`pumps_run`).
    pub pumps_run: u8,
    /// A value that changes every step (`heartbeat`).
    pub heartbeat: u16,
}

impl CduSettings {
    /// Register name and value of each setting, in the order
    /// [`ModbusCdu::write`] writes them: the valves and the pumps first
    /// (what isolates a leak must not wait behind a setpoint the CDU
    /// refuses), the heartbeat last.
    pub fn registers(&self) -> [(&'static str, f64); 6] {
        [
            (VALVES_OPEN, f64::from(self.valves_open)),
            (PUMPS_RUN, f64::from(self.pumps_run)),
            (LEAD_PUMP, f64::from(self.lead_pump)),
            (PUMP_SPEED, self.pump_speed_pct),
            (SETPOINT, self.setpoint_c),
            (HEARTBEAT, f64::from(self.heartbeat)),
        ]
    }
}

const SUPPLY: &str = "supply_temp";
const RETURN: &str = "return_temp";
const FLOW: &str = "flow";
const FACILITY_SUPPLY: &str = "facility_supply_temp";
const PUMP_A: &str = "pump_a_running";
const PUMP_B: &str = "pump_b_running";
const LEAKS: &str = "leak_inputs";
const IT_POWER: &str = "it_power";
const COOLING_POWER: &str = "cooling_power";
const FACILITY_POWER: &str = "facility_power";
const SETPOINT: &str = "supply_setpoint";
const PUMP_SPEED: &str = "pump_speed";
const LEAD_PUMP: &str = "lead_pump";
const VALVES_OPEN: &str = "valves_open";
const DIFF_PRESSURE: &str = "diff_pressure";
const VALVES_CLOSED: &str = "valves_closed";
const PUMP_A_FAULT: &str = "pump_a_fault";
const PUMP_B_FAULT: &str = "pump_b_fault";
const PUMPS_RUN: &str = "pumps_run";
const HEARTBEAT: &str = "heartbeat";
const OUTDOOR: &str = "outdoor_temp";

/// The input registers [`CduMeasurements`] is made of.
pub const READING_REGISTERS: [&str; 15] = [
    SUPPLY,
    RETURN,
    FLOW,
    FACILITY_SUPPLY,
    PUMP_A,
    PUMP_B,
    LEAKS,
    IT_POWER,
    COOLING_POWER,
    FACILITY_POWER,
    DIFF_PRESSURE,
    VALVES_CLOSED,
    PUMP_A_FAULT,
    PUMP_B_FAULT,
    OUTDOOR,
];

/// The holding registers [`CduSettings`] goes to, in the order written.
pub const SETTING_REGISTERS: [&str; 6] = [
    VALVES_OPEN,
    PUMPS_RUN,
    LEAD_PUMP,
    PUMP_SPEED,
    SETPOINT,
    HEARTBEAT,
];

/// Access to one CDU: its measurements in, its settings out, one at a
/// time (the decision path orders them: [`crate::decide`]).
#[allow(async_fn_in_trait)]
pub trait CduPort {
    /// Reads every measurement the map has (the others are `None`). A
    /// request that fails while another answers leaves its registers
    /// `None` and its failure in [`CduPort::read_gaps`]; the read fails
    /// only when no request answered.
    async fn read(&mut self) -> Result<CduMeasurements, CduError>;
    /// The requests of the last read that failed while another answered
    /// (empty after a read that read everything, or that failed whole).
    fn read_gaps(&self) -> &[CduError] {
        &[]
    }
    /// Reads back the settings of `written` (this step's writes that were
    /// echoed right) whose echo does not show what the CDU holds: one
    /// request per run of contiguous holding registers. Settings holding
    /// another value are not taken; a run whose read-back failed leaves
    /// its settings taken, reported apart ([`ReadBack`]). None by default.
    async fn read_back(&mut self, written: &[Write]) -> ReadBack {
        let _ = written;
        ReadBack::default()
    }
    /// Writes one setting. A value the map cannot encode fails with
    /// [`CduError::Value`] and nothing is sent.
    async fn write_setting(&mut self, w: &Write) -> Result<(), CduError>;
    /// What the CDU's register map says of the settings.
    fn limits(&self) -> MapLimits;
    /// Whether the CDU's register map has pump A's and pump B's fault
    /// bit (`pump_a_fault`, `pump_b_fault`): where it has one, a fault
    /// that reads `None` is unknown (no value read), not missing.
    fn pump_fault_bits(&self) -> [bool; 2];
}

/// A run of contiguous input registers read in one request.
#[derive(Debug, Clone)]
struct Span {
    start: u16,
    count: u16,
    /// Name and first address of each register in it.
    registers: Vec<(String, u16, u16)>,
}

/// The default timeout of one request.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);

/// A CDU over Modbus, TCP or RTU, as its register map describes it.
pub struct ModbusCdu {
    map: RegisterMap,
    link: Link,
    timeout: Duration,
    spans: Vec<Span>,
    ctx: Option<Context>,
    /// What the reads of the link `ctx` is on showed.
    seen: Option<link::Seen>,
    /// The last request got no answer or a garbled one: clear the line
    /// before the next.
    resync: bool,
    /// The serial port was still held by another program at the end of
    /// the last opening's wait: the next opening tries once, without
    /// waiting, so a port held for good costs a step one timeout, not one
    /// per request.
    port_held: bool,
    /// The CDU's addresses as its name was last looked up (TCP).
    resolved: Vec<std::net::SocketAddr>,
    /// Each pump's running flag value last said as neither 0 nor 1.
    odd_flags: [Option<f64>; 2],
    /// The requests of the last read that failed while another answered.
    gaps: Vec<CduError>,
}

impl fmt::Debug for ModbusCdu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModbusCdu")
            .field("model", &self.map.model)
            .field("link", &self.link)
            .field("unit_id", &self.map.unit_id)
            .field("timeout", &self.timeout)
            .field("connected", &self.ctx.is_some())
            .field("resync", &self.resync)
            .finish()
    }
}

impl ModbusCdu {
    /// A CDU of the model `map` describes, on `link`, with the map's unit
    /// id and the default timeout. Nothing is opened until the first
    /// request.
    pub fn new(map: RegisterMap, link: Link) -> Self {
        let spans = spans(&map);
        Self {
            map,
            link,
            timeout: DEFAULT_TIMEOUT,
            spans,
            ctx: None,
            seen: None,
            resync: false,
            port_held: false,
            resolved: Vec::new(),
            odd_flags: [None; 2],
            gaps: Vec::new(),
        }
    }

    /// Each request's timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The register map.
    pub fn map(&self) -> &RegisterMap {
        &self.map
    }

    /// The link.
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// Each request's timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Measurements and settings the map lacks (they read `None` and are
    /// not written).
    pub fn unmapped(&self) -> Vec<&'static str> {
        let has = |name: &str, kind: Kind| self.map.get(name).is_some_and(|r| r.kind == kind);
        READING_REGISTERS
            .iter()
            .filter(|n| !has(n, Kind::Input))
            .chain(SETTING_REGISTERS.iter().filter(|n| !has(n, Kind::Holding)))
            .copied()
            .collect()
    }

    /// Requests a read takes: (first address, count) of each.
    pub fn read_requests(&self) -> Vec<(u16, u16)> {
        self.spans.iter().map(|s| (s.start, s.count)).collect()
    }

    /// Closes the link (the next request opens it again).
    pub async fn disconnect(&mut self) {
        if let Some(mut ctx) = self.ctx.take() {
            let _ = ctx.disconnect().await;
        }
    }

    fn op(&self, what: fmt::Arguments<'_>) -> String {
        format!("{what} of unit {} on {}", self.map.unit_id, self.link)
    }

    /// Opens the link if it is not open, by `deadline`.
    async fn connect(&mut self, op: &str, deadline: Instant) -> Result<(), CduError> {
        if self.ctx.is_some() {
            return Ok(());
        }
        let slave = Slave(self.map.unit_id);
        let no_answer = || CduError::NoAnswer {
            op: format!("{op}: connecting"),
            after_ms: self.timeout.as_millis() as u64,
        };
        let io = |source: io::Error| CduError::Io {
            op: format!("{op}: connecting"),
            source,
        };
        let ctx = match &self.link {
            Link::Tcp(target) => {
                let stream = connect_tcp(target, &mut self.resolved, deadline)
                    .await
                    .map_err(|e| e.map_or_else(no_answer, io))?;
                let _ = stream.set_nodelay(true);
                let (stream, seen) = Watched::new(stream);
                self.seen = Some(seen);
                tokio_modbus::client::tcp::attach_slave(stream, slave)
            }
            Link::Rtu(line) => {
                let builder = tokio_serial::new(line.path.as_str(), line.baud)
                    .parity(line.parity)
                    .data_bits(line.data_bits)
                    .stop_bits(line.stop_bits);
                let wait_until = if self.port_held {
                    Instant::now()
                } else {
                    deadline
                };
                let opened = open_serial(&builder, &line.path, wait_until).await;
                self.port_held =
                    matches!(&opened, Err(e) if e.kind() == io::ErrorKind::ResourceBusy);
                let mut port = opened.map_err(io)?;
                if self.resync {
                    // A late answer to the request that timed out must not
                    // be read as the answer to the next: wait for a quiet
                    // line (at least 3.5 characters, the RTU frame gap),
                    // discarding what comes.
                    let quiet = (line.char_time() * 4).max(Duration::from_millis(20));
                    drain(&mut port, quiet, self.timeout).await;
                }
                port.clear(ClearBuffer::All).map_err(|e| io(e.into()))?;
                let (port, seen) = Watched::new(port);
                self.seen = Some(seen);
                tokio_modbus::client::rtu::attach_slave(port, slave)
            }
        };
        self.ctx = Some(ctx);
        self.resync = false;
        Ok(())
    }

    /// One request and its answer, within the timeout. After no answer, a
    /// bad answer or a failed link the next request opens the link afresh
    /// and, on a serial line, waits for it to be quiet first (`resync`).
    async fn exchange(&mut self, op: String, req: Request<'_>) -> Result<Response, CduError> {
        let mut deadline = Instant::now() + self.timeout;
        if self.ctx.is_none() {
            self.connect(&op, deadline).await?;
            if matches!(self.link, Link::Rtu(_)) {
                // Opening the port and waiting for a quiet line is not the
                // CDU's time to answer.
                deadline = Instant::now() + self.timeout;
            }
        }
        let ctx = self.ctx.as_mut().expect("connected");
        if let Some(seen) = &self.seen {
            seen.read.store(0, Ordering::Relaxed);
        }
        let failure = match tokio::time::timeout_at(deadline, ctx.call(req)).await {
            Ok(Ok(Ok(response))) => return Ok(response),
            Ok(Ok(Err(code))) => {
                let code = u8::from(code);
                return Err(CduError::Refused {
                    op,
                    code,
                    meaning: exception_meaning(code),
                });
            }
            Err(_) => self.unanswered(op),
            Ok(Err(tokio_modbus::Error::Protocol(e))) => CduError::BadAnswer {
                op,
                detail: e.to_string(),
            },
            Ok(Err(tokio_modbus::Error::Transport(e))) => {
                let closed = self
                    .seen
                    .as_ref()
                    .is_some_and(|s| s.closed.load(Ordering::Relaxed));
                transport_failure(op, e, closed, &self.link)
            }
        };
        // Open afresh next time: no late answer read as the next one. A
        // serial line that failed mid-answer may still carry its rest.
        self.ctx = None;
        let rtu = matches!(self.link, Link::Rtu(_));
        self.resync |= rtu || !matches!(failure, CduError::Io { .. });
        Err(failure)
    }

    /// The failure of a request that timed out: no answer, or, when bytes
    /// came on the serial line, garbled ones (none of them made a whole
    /// answer: a bad CRC, a frame cut or garbled by noise).
    fn unanswered(&self, op: String) -> CduError {
        let after_ms = self.timeout.as_millis() as u64;
        let serial = matches!(self.link, Link::Rtu(_));
        let read = self.seen.as_ref().map(|s| s.read.load(Ordering::Relaxed));
        match read.filter(|_| serial) {
            Some(bytes @ 1..) => CduError::Garbled {
                op,
                bytes,
                after_ms,
            },
            _ => CduError::NoAnswer { op, after_ms },
        }
    }

    /// Reads one span of input registers.
    async fn read_span(&mut self, span: &Span) -> Result<Vec<u16>, CduError> {
        let names = match span.registers.as_slice() {
            [only] => only.0.clone(),
            [first, .., last] => format!("{} to {}", first.0, last.0),
            [] => String::new(),
        };
        let op = self.op(format_args!(
            "read input {}-{} ({names})",
            span.start,
            u32::from(span.start) + u32::from(span.count) - 1
        ));
        match self
            .exchange(
                op.clone(),
                Request::ReadInputRegisters(span.start, span.count),
            )
            .await?
        {
            Response::ReadInputRegisters(words) if words.len() == usize::from(span.count) => {
                Ok(words)
            }
            Response::ReadInputRegisters(words) => Err(self.bad_answer(
                op,
                format!("{} registers for {} asked", words.len(), span.count),
            )),
            other => Err(self.bad_answer(op, format!("{other:?}"))),
        }
    }

    /// A bad answer to `op`: the link is opened afresh and, for RTU, the
    /// line cleared before the next request.
    fn bad_answer(&mut self, op: String, detail: String) -> CduError {
        self.ctx = None;
        self.resync = true;
        CduError::BadAnswer { op, detail }
    }

    /// Writes `value`, as `words`, to holding register `r` (one or two
    /// words); every error names the value and the words. Done only when the
    /// CDU echoes the request: the address and the value for one word
    /// (function 6), the address and the count for two (function 16). Any
    /// other echo (a value it clamped, another register's) is a bad answer.
    /// Two words are then read back ([`ModbusCdu::read_back_wide`]): their
    /// echo does not carry the value. One word is read back with the
    /// step's others ([`CduPort::read_back`]): its echo is the request,
    /// whatever the CDU kept.
    async fn write_register(
        &mut self,
        r: &Register,
        value: f64,
        words: Vec<u16>,
    ) -> Result<(), CduError> {
        let op = format!(
            "{}, {}",
            self.op(format_args!("write {} at holding {}", r.name, r.address)),
            written(value, &r.unit, &words)
        );
        let (req, echo) = if let [w] = *words.as_slice() {
            (
                Request::WriteSingleRegister(r.address, w),
                Response::WriteSingleRegister(r.address, w),
            )
        } else {
            let n = words.len() as u16;
            (
                Request::WriteMultipleRegisters(r.address, Cow::Owned(words.clone())),
                Response::WriteMultipleRegisters(r.address, n),
            )
        };
        let answer = self.exchange(op.clone(), req).await?;
        if answer == echo && words.len() == 1 {
            return Ok(());
        }
        if answer == echo {
            return self.read_back_wide(r, value, &words, op).await;
        }
        let detail = format!(
            "the CDU echoed {}, not {}: the value it holds is unknown",
            echo_text(&answer),
            echo_text(&echo)
        );
        Err(self.bad_answer(op, detail))
    }
}

impl CduPort for ModbusCdu {
    async fn read(&mut self) -> Result<CduMeasurements, CduError> {
        let mut values: Vec<(String, f64)> = Vec::new();
        for (span, words) in self.read_spans().await? {
            let Some(words) = words else {
                continue;
            };
            for (name, address, n) in &span.registers {
                let at = usize::from(address - span.start);
                let value = self
                    .map
                    .reading(name, &words[at..at + usize::from(*n)])
                    .map_err(|source| CduError::Value {
                        op: self.op(format_args!("decode {name} at input {address}")),
                        source,
                    })?;
                // The CDU's "not available" (its sentinel) is no reading:
                // a sensor it names lost reads lost, never a figure.
                if let Some(value) = value {
                    values.push((name.clone(), value));
                }
            }
        }
        let get = |name: &str| values.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
        Ok(CduMeasurements {
            supply_c: get(SUPPLY),
            return_c: get(RETURN),
            flow_lpm: get(FLOW),
            facility_supply_c: get(FACILITY_SUPPLY),
            pumps_running: self.running_flags([get(PUMP_A), get(PUMP_B)]),
            leaks: get(LEAKS).map(|v| v as u16),
            diff_pressure_kpa: get(DIFF_PRESSURE),
            valves_closed: get(VALVES_CLOSED).map(|v| v as u16),
            pump_faults: [
                get(PUMP_A_FAULT).map(|v| v != 0.0),
                get(PUMP_B_FAULT).map(|v| v != 0.0),
            ],
            it_w: get(IT_POWER),
            cooling_w: get(COOLING_POWER),
            facility_w: get(FACILITY_POWER),
            outdoor_c: get(OUTDOOR),
        })
    }

    async fn write_setting(&mut self, w: &Write) -> Result<(), CduError> {
        let name = w.setting.register();
        let Some(r) = self.map.get(name).filter(|r| r.kind == Kind::Holding) else {
            return Ok(());
        };
        let r = r.clone();
        let value = match w.setting {
            Setting::Heartbeat => heartbeat_value(&r, w.value),
            _ => w.value,
        };
        let words = self
            .map
            .encode(name, value)
            .map_err(|source| CduError::Value {
                op: self.op(format_args!("write {name} at holding {}", r.address)),
                source,
            })?;
        self.write_register(&r, value, words).await
    }

    fn read_gaps(&self) -> &[CduError] {
        &self.gaps
    }

    async fn read_back(&mut self, written: &[Write]) -> ReadBack {
        self.read_back_settings(written).await
    }

    fn limits(&self) -> MapLimits {
        map_limits(&self.map)
    }

    fn pump_fault_bits(&self) -> [bool; 2] {
        [PUMP_A_FAULT, PUMP_B_FAULT]
            .map(|name| self.map.get(name).is_some_and(|r| r.kind == Kind::Input))
    }
}

impl ModbusCdu {
    /// Writes every setting of `settings` the map has, in the order of
    /// its fields (for tools and commissioning; the shell writes through
    /// the decision path). A value the map cannot encode fails with
    /// [`CduError::Value`] before anything is sent; a failure after some
    /// settings went in is a [`CduError::Partial`] naming them.
    pub async fn write(&mut self, settings: &CduSettings) -> Result<(), CduError> {
        // Every value checked before the first request.
        let mut plan: Vec<(Register, f64, Vec<u16>)> = Vec::new();
        for (name, value) in settings.registers() {
            let Some(r) = self.map.get(name).filter(|r| r.kind == Kind::Holding) else {
                continue;
            };
            let value = if name == HEARTBEAT {
                heartbeat_value(r, value)
            } else {
                value
            };
            let words = self
                .map
                .encode(name, value)
                .map_err(|source| CduError::Value {
                    op: self.op(format_args!("write {name} at holding {}", r.address)),
                    source,
                })?;
            plan.push((r.clone(), value, words));
        }
        let names: Vec<&'static str> = settings
            .registers()
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| plan.iter().any(|(r, _, _)| r.name == *n))
            .collect();
        let mut writes: Vec<Write> = Vec::new();
        for (i, (r, value, words)) in plan.into_iter().enumerate() {
            if let Some(setting) = Setting::ORDER.into_iter().find(|s| s.register() == r.name) {
                writes.push(Write { setting, value });
            }
            if let Err(cause) = self.write_register(&r, value, words).await {
                if i == 0 {
                    return Err(cause);
                }
                return Err(CduError::Partial {
                    written: names[..i].to_vec(),
                    failed: names[i],
                    not_tried: names[i + 1..].to_vec(),
                    cause: Box::new(cause),
                });
            }
        }
        let back = self.read_back(&writes).await;
        read_back::whole_write(names, back)
    }
}

/// A failure of the transport under a request, as the controller reports
/// it: an answer the codec could not decode (tokio-modbus reports a bad
/// RTU CRC or a malformed frame as `InvalidData`) is a bad answer, the
/// rest a link failure; where the stream had `closed` ([`Watched`]), it
/// says so in place of whatever errno tokio-modbus put there: on TCP the
/// CDU closed the connection, on a serial `link` the device hung up (its
/// reads end when a USB-RS485 adapter is unplugged or reset).
fn transport_failure(op: String, e: io::Error, closed: bool, link: &Link) -> CduError {
    if e.kind() == io::ErrorKind::InvalidData {
        return CduError::BadAnswer {
            op,
            detail: format!("it could not be decoded ({e})"),
        };
    }
    let source = match (closed, link) {
        (false, _) => e,
        (true, Link::Tcp(_)) => io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the CDU closed the connection before a whole answer came",
        ),
        (true, Link::Rtu(_)) => io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the serial device hung up (adapter unplugged or reset) before a whole answer came",
        ),
    };
    CduError::Io { op, source }
}

/// The value a write tries, in `unit`, and the raw words that carry it:
/// `value 50 °C (raw 0x1388)`.
fn written(value: f64, unit: &str, words: &[u16]) -> String {
    let unit = if unit.is_empty() {
        String::new()
    } else {
        format!(" {unit}")
    };
    let raw: Vec<String> = words.iter().map(|w| format!("{w:#06x}")).collect();
    format!("value {value}{unit} (raw {})", raw.join(" "))
}

/// A write's echo in words: the register and the value written, or the
/// first register and the count.
fn echo_text(echo: &Response) -> String {
    match echo {
        Response::WriteSingleRegister(a, v) => format!("holding {a} = {v:#06x}"),
        Response::WriteMultipleRegisters(a, n) => format!("holding {a}, {n} registers"),
        other => format!("{other:?}"),
    }
}

/// The map's input registers in runs of contiguous addresses, each at most
/// [`MAX_READ`](loopwarden_boards::modbus_map::MAX_READ) registers
/// ([`input_spans`], as the firmware reads them).
fn spans(map: &RegisterMap) -> Vec<Span> {
    let regs: Vec<&Register> = map.registers().collect();
    input_spans(regs.iter().copied())
        .into_iter()
        .map(|s| Span {
            start: s.start,
            count: s.count,
            registers: s
                .registers
                .into_iter()
                .map(|i| (regs[i].name.clone(), regs[i].address, regs[i].ty.words()))
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulated_cdus_map_limits_are_those_the_decision_path_is_tested_on() {
        // cooling-decide's tests hold writes to these (writes::tests::sim_cdu).
        let want = MapLimits {
            mapped: [true; 6],
            setpoint_c: Some((17.0, 45.0)),
            speed_pct: Some((30.0, 100.0)),
            positions: true,
        };
        assert_eq!(map_limits(&RegisterMap::sim_cdu()), want);
        // A map with the setpoint alone to write, the pump speed only to
        // read, and no valve positions.
        let bare = r#"
            model = "bare"
            word_order = "high_first"
            unit_id = 1
            [[register]]
            name = "supply_setpoint"
            kind = "holding"
            address = 0
            type = "i16"
            scale = 0.01
            unit = "°C"
            min = 20.0
            max = 40.0
            description = "setpoint"
            [[register]]
            name = "pump_speed"
            kind = "input"
            address = 0
            type = "u16"
            scale = 0.1
            unit = "%"
            description = "pump speed"
        "#;
        let lim = map_limits(&RegisterMap::from_toml(bare, "bare").unwrap());
        assert_eq!(lim.mapped, [false, false, false, false, false, true]);
        assert_eq!(lim.setpoint_c, Some((20.0, 40.0)));
        assert_eq!((lim.speed_pct, lim.positions), (None, false));
    }

    /// The simulated CDU's map with `from` replaced by `to` once.
    fn sim_edited(from: &str, to: &str) -> Result<RegisterMap, String> {
        let text = include_str!("../../boards/cdus/sim-cdu.toml");
        assert!(text.contains(from), "{from:?}");
        RegisterMap::from_toml(&text.replacen(from, to, 1), "edited.toml")
            .map_err(|e| e.to_string())
    }

    /// `check_map`'s answer, as text, for the simulated CDU's map edited.
    fn unfit(from: &str, to: &str, racks: u8) -> String {
        let map = sim_edited(from, to).expect("the map reads");
        check_map(&map, racks).expect_err("refused").to_string()
    }

    #[test]
    fn the_shipped_map_fits_the_controller_up_to_sixteen_racks() {
        for racks in 1..=16 {
            assert_eq!(check_map(&RegisterMap::sim_cdu(), racks), Ok(()));
        }
    }

    #[test]
    fn every_register_read_as_bits_must_be_a_plain_u16() {
        // The map's own check, which the controller's map goes through;
        // each name this module reads as bits or a flag is among them.
        let bits = [
            LEAKS,
            VALVES_CLOSED,
            PUMP_A,
            PUMP_B,
            PUMP_A_FAULT,
            PUMP_B_FAULT,
            VALVES_OPEN,
            PUMPS_RUN,
            LEAD_PUMP,
            HEARTBEAT,
        ];
        let text = include_str!("../../boards/cdus/sim-cdu.toml");
        for name in bits {
            let at = text.find(&format!("name = \"{name}\"")).unwrap();
            let edited = format!(
                "{}{}",
                &text[..at],
                text[at..].replacen("type = \"u16\"", "type = \"i16\"", 1)
            );
            let e = RegisterMap::from_toml(&edited, "m.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("{name}: ")), "{e}");
            assert!(
                e.contains("a bit word needs type u16 at scale 1, not i16 at scale 1"),
                "{e}"
            );
        }
        let e = sim_edited(
            "type = \"u16\"\nscale = 1.0\nunit = \"\"\ndescription = \"leak",
            "type = \"u16\"\nscale = 0.1\nunit = \"\"\ndescription = \"leak",
        )
        .unwrap_err();
        assert!(e.contains("leak_inputs: the leak inputs, bit n = rack n, read as bits: a bit word needs type u16 at scale 1, not u16 at scale 0.1"), "{e}");
    }

    #[test]
    fn a_map_without_a_safety_setting_or_with_a_misspelt_name_is_refused() {
        for (name, typo) in [
            ("valves_open", "valve_open"),
            ("pumps_run", "pump_run"),
            ("heartbeat", "hearbeat"),
        ] {
            let e = unfit(
                &format!("name = \"{name}\""),
                &format!("name = \"{typo}\""),
                4,
            );
            assert_eq!(
                e,
                format!("register \"{typo}\" is not one the controller reads or writes (did you mean \"{name}\"?)")
            );
        }
        let e = unfit("name = \"heartbeat\"", "name = \"watchdog_word\"", 4);
        assert_eq!(
            e,
            "register \"watchdog_word\" is not one the controller reads or writes"
        );
        // Left out altogether: refused, naming what it is for.
        let text = include_str!("../../boards/cdus/sim-cdu.toml");
        let cut = text.find("[[register]]\nname = \"heartbeat\"").unwrap();
        let map = RegisterMap::from_toml(&text[..cut], "m.toml").unwrap();
        assert_eq!(
            check_map(&map, 4).unwrap_err().to_string(),
            "heartbeat: the map lacks it; the controller needs it as a holding register: \
             it tells the CDU the controller is alive, or the CDU falls back"
        );
        // A pump's running flag left out: refused, or the pump would read
        // stopped while it runs and be taken for tripped.
        for pump in [PUMP_A, PUMP_B] {
            let at = text
                .find(&format!("[[register]]\nname = \"{pump}\""))
                .unwrap();
            let end = at + text[at..].find("\n\n").unwrap() + 2;
            let cut = format!("{}{}", &text[..at], &text[end..]);
            let map = RegisterMap::from_toml(&cut, "m.toml").unwrap();
            let e = check_map(&map, 4).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!(
                    "{pump}: the map lacks it; the controller needs it as an input register, \
                     pump {}'s running feedback",
                    if pump == PUMP_A { 'A' } else { 'B' }
                )),
                "{e}"
            );
        }
        // Of the wrong kind: an input valves_open would never be written.
        let e = unfit(
            "name = \"valves_open\"\nkind = \"holding\"\naddress = 3\ntype = \"u16\"\nscale = 1.0\nunit = \"\"\nmin = 0.0\nmax = 65535.0",
            "name = \"valves_open\"\nkind = \"input\"\naddress = 7\ntype = \"u16\"\nscale = 1.0\nunit = \"\"",
            4,
        );
        assert_eq!(
            e,
            "valves_open: the controller needs it as a holding register, the map has it as input"
        );
    }

    #[test]
    fn every_register_the_controller_reads_or_writes_has_its_unit() {
        use loopwarden_boards::modbus_map::fit::{READINGS, SETTINGS};
        let names = |list: &[(&'static str, &'static str)]| {
            list.iter().map(|(n, _)| *n).collect::<Vec<_>>()
        };
        assert_eq!(names(&READINGS), READING_REGISTERS);
        assert_eq!(names(&SETTINGS), SETTING_REGISTERS);
        // The shipped map spells each unit as the check does.
        let map = RegisterMap::sim_cdu();
        for (name, unit) in READINGS.iter().chain(&SETTINGS) {
            assert_eq!(
                map.get(name).map(|r| r.unit.as_str()),
                Some(*unit),
                "{name}"
            );
        }
    }

    #[test]
    fn a_register_in_another_unit_is_refused_naming_both_units() {
        use loopwarden_boards::modbus_map::fit::unit_text;
        let hb = "min = 0.0\nmax = 65535.0\ndescription = \"written";
        // Each register's unit in the shipped map and the text after it
        // (to find it), and the unit put there.
        let cases = [
            ("it_power", "W", "\ndescription = \"IT", "kW"),
            ("flow", "L/min", "", "m3/h"),
            ("supply_setpoint", "°C", "\nmin = 17.0", "degF"),
            ("pump_speed", "%", "", "rpm"),
            // No unit where one is taken, and one where none is.
            ("diff_pressure", "kPa", "", ""),
            ("heartbeat", "", &format!("\n{hb}"), "s"),
        ];
        for (name, unit, after, found) in cases {
            let from = format!("unit = \"{unit}\"{after}");
            let to = format!("unit = \"{found}\"{after}");
            let (found, wanted) = (unit_text(found), unit_text(unit));
            assert_eq!(
                unfit(&from, &to, 4),
                format!(
                    "{name}: the map gives its unit as {found}, the controller takes it in \
                     {wanted} and converts nothing"
                )
            );
        }
    }

    #[test]
    fn a_setting_range_that_leaves_out_what_the_controller_writes_is_refused() {
        let from = "min = 0.0\nmax = 65535.0\ndescription = \"rack valves";
        let to = "min = 0.0\nmax = 255.0\ndescription = \"rack valves";
        assert_eq!(check_map(&sim_edited(from, to).unwrap(), 8), Ok(()));
        assert_eq!(
            unfit(from, to, 10),
            "valves_open: its range 0 to 255 must hold 0 to 1023 (every valve of 10 racks, bit n = rack n)"
        );
        let e = unfit("min = 0.0\nmax = 3.0", "min = 0.0\nmax = 1.0", 4);
        assert_eq!(
            e,
            "pumps_run: its range 0 to 1 must hold 0 to 3 (0 both pumps stopped, 3 both running)"
        );
        let e = unfit("min = 0.0\nmax = 3.0", "min = 1.0\nmax = 3.0", 4);
        assert!(
            e.starts_with("pumps_run: its range 1 to 3 must hold 0 to 3"),
            "{e}"
        );
        let speed = "min = 30.0\nmax = 100.0\ndescription = \"pump speed";
        let e = unfit(
            speed,
            "min = 30.0\nmax = 80.0\ndescription = \"pump speed",
            4,
        );
        assert!(
            e.starts_with("pump_speed: its range 30 to 80 must hold 30 to 100 (full speed"),
            "{e}"
        );
        let faster = "min = 30.0\nmax = 110.0\ndescription = \"pump speed";
        assert_eq!(check_map(&sim_edited(speed, faster).unwrap(), 4), Ok(()));
        let hb = "min = 0.0\nmax = 65535.0\ndescription = \"written";
        let e = unfit(hb, "min = 7.0\nmax = 7.5\ndescription = \"written", 4);
        assert!(
            e.starts_with("heartbeat: its range 7 to 7.5 holds fewer than two whole values"),
            "{e}"
        );
    }

    #[test]
    fn the_heartbeat_wraps_within_its_register_range_and_keeps_changing() {
        let map = sim_edited(
            "min = 0.0\nmax = 65535.0\ndescription = \"written",
            "min = 10.0\nmax = 265.0\ndescription = \"written",
        )
        .unwrap();
        assert_eq!(check_map(&map, 4), Ok(()));
        let r = map.get(HEARTBEAT).unwrap();
        // 256 values, 10 to 265: step 255 writes 265, step 256 writes 10.
        let written: Vec<f64> = (254..=258)
            .map(|c| heartbeat_value(r, f64::from(c)))
            .collect();
        assert_eq!(written, [264.0, 265.0, 10.0, 11.0, 12.0]);
        for c in 0..=u16::MAX {
            let v = heartbeat_value(r, f64::from(c));
            assert!(map.encode(HEARTBEAT, v).is_ok(), "step {c}: {v}");
            assert_ne!(v, heartbeat_value(r, f64::from(c) + 1.0), "step {c}");
        }
        // The full range writes the counter as it is, then wraps.
        let full = RegisterMap::sim_cdu();
        let r = full.get(HEARTBEAT).unwrap();
        assert_eq!(heartbeat_value(r, 65_535.0), 65_535.0);
        assert_eq!(heartbeat_value(r, 65_536.0), 0.0);
        assert_eq!(heartbeat_value(r, 1.0), 1.0);
        // 255 values divide 65,535: the count past 65,535 still changes
        // the value written (a count that wrapped to 0 wrote 0 twice).
        let map = sim_edited(
            "min = 0.0\nmax = 65535.0\ndescription = \"written",
            "min = 0.0\nmax = 254.0\ndescription = \"written",
        )
        .unwrap();
        let r = map.get(HEARTBEAT).unwrap();
        assert_eq!(heartbeat_value(r, 65_535.0), 0.0);
        assert_eq!(heartbeat_value(r, 65_536.0), 1.0);
    }

    /// Every map shipped in `boards/cdus/`, by file name.
    fn shipped_maps() -> Vec<(String, RegisterMap)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../boards/cdus");
        let mut maps = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("boards/cdus") {
            let path = entry.expect("an entry of boards/cdus").path();
            if path.extension().is_some_and(|e| e == "toml") {
                let name = path.display().to_string();
                let text = std::fs::read_to_string(&path).expect("a map file");
                let map = RegisterMap::from_toml(&text, &name).unwrap_or_else(|e| panic!("{e}"));
                maps.push((name, map));
            }
        }
        assert!(!maps.is_empty(), "no map in {}", dir.display());
        maps
    }

    #[test]
    fn every_shipped_map_writes_its_heartbeat_every_step_of_a_whole_cycle() {
        for (name, map) in shipped_maps() {
            assert_eq!(check_map(&map, 16), Ok(()), "{name}");
            let r = map.get(HEARTBEAT).expect("a heartbeat");
            let (lo, hi) = r.min.zip(r.max).expect("a range");
            // One whole cycle and a step past it, where the count wraps.
            let steps = (hi.floor() - lo.ceil() + 2.0) as u32;
            for c in 0..=steps {
                let v = heartbeat_value(r, f64::from(c));
                let words = map.encode(HEARTBEAT, v);
                assert!(words.is_ok(), "{name} step {c}: {v}: {words:?}");
                assert_ne!(v, heartbeat_value(r, f64::from(c + 1)), "{name} step {c}");
            }
        }
    }

    #[test]
    fn a_write_names_its_value_in_the_registers_unit_and_its_raw_words() {
        assert_eq!(written(50.0, "°C", &[5000]), "value 50 °C (raw 0x1388)");
        assert_eq!(written(-5.0, "°C", &[0xFE0C]), "value -5 °C (raw 0xfe0c)");
        assert_eq!(written(11.0, "", &[11]), "value 11 (raw 0x000b)");
        assert_eq!(
            written(117_550.0, "W", &[0x0001, 0xCB2E]),
            "value 117550 W (raw 0x0001 0xcb2e)"
        );
    }

    #[test]
    fn a_closed_tcp_connection_says_so_in_place_of_a_stray_errno() {
        let tcp = Link::Tcp("127.0.0.1:502".parse().unwrap());
        // What tokio-modbus makes of the end of the stream: errno as it was.
        for code in [0, libc::EAGAIN, libc::EINPROGRESS] {
            let errno = io::Error::from_raw_os_error(code);
            let e = transport_failure("read".into(), errno, true, &tcp);
            assert_eq!(
                e.to_string(),
                "read: the CDU closed the connection before a whole answer came"
            );
        }
        let reset = io::Error::from_raw_os_error(libc::ECONNRESET);
        let e = transport_failure("read".into(), reset, false, &tcp);
        assert!(matches!(e, CduError::Io { .. }), "{e:?}");
        assert!(e.to_string().contains("(os error"), "{e}");
        let garbled = io::Error::new(io::ErrorKind::InvalidData, "Invalid CRC");
        let e = transport_failure("read".into(), garbled, true, &tcp);
        assert!(matches!(e, CduError::BadAnswer { .. }), "{e:?}");
    }

    /// A serial device whose reads end (a USB-RS485 adapter unplugged or
    /// reset) hung up: no CDU closed any connection, and the engineer
    /// is sent to the adapter, not the CDU.
    #[test]
    fn a_hung_up_serial_device_says_so_not_a_closed_connection() {
        let rtu = Link::Rtu(SerialLine::new("/dev/ttyUSB0"));
        for code in [0, libc::EAGAIN, libc::EIO] {
            let errno = io::Error::from_raw_os_error(code);
            let e = transport_failure("read".into(), errno, true, &rtu);
            assert!(matches!(e, CduError::Io { .. }), "{e:?}");
            assert_eq!(
                e.to_string(),
                "read: the serial device hung up (adapter unplugged or reset) before a whole answer came"
            );
        }
        let garbled = io::Error::new(io::ErrorKind::InvalidData, "Invalid CRC");
        let e = transport_failure("read".into(), garbled, true, &rtu);
        assert!(matches!(e, CduError::BadAnswer { .. }), "{e:?}");
    }

    #[test]
    fn reads_take_one_request_per_contiguous_run() {
        let cdu = ModbusCdu::new(
            RegisterMap::sim_cdu(),
            Link::Tcp("127.0.0.1:502".parse().unwrap()),
        );
        // 0-6 (temperatures, flow, pumps, leaks), 10-20 (three u32 meters,
        // pressure, valve positions, pump faults, outdoor temperature).
        assert_eq!(cdu.read_requests(), std::vec![(0, 7), (10, 11)]);
        assert!(cdu.unmapped().is_empty());
    }

    #[test]
    fn a_cdu_can_move_between_tasks() {
        fn send<T: Send>() {}
        send::<ModbusCdu>();
        send::<CduError>();
    }

    #[test]
    fn the_line_names_itself_and_its_framing() {
        let line = SerialLine::new("/dev/ttyUSB0");
        assert_eq!(line.to_string(), "/dev/ttyUSB0 19200 8N1");
        // 10 bits a character at 19200 baud.
        assert_eq!(line.char_time(), Duration::from_micros(520));
    }

    /// A CDU named, not numbered: the name is looked up at connection
    /// (`localhost`, from the hosts file), and the connection made.
    #[test]
    fn a_cdu_given_by_name_is_looked_up_when_connecting() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let target: TcpTarget = format!("localhost:{port}").parse().unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut known = Vec::new();
            let stream = connect_tcp(&target, &mut known, deadline)
                .await
                .expect("connected");
            assert!(!known.is_empty(), "its addresses kept");
            drop(stream);
            // Known now: connected again without a lookup, to the same port.
            let again = connect_tcp(&target, &mut known, deadline)
                .await
                .expect("again");
            assert_eq!(again.peer_addr().unwrap().port(), port);
            // The CDU moved: its old address refuses; the name is looked
            // up again and its new addresses kept.
            let gone = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let old = gone.local_addr().unwrap();
            drop(gone);
            known = std::vec![old];
            let moved = connect_tcp(&target, &mut known, deadline)
                .await
                .expect("found again");
            assert_eq!(moved.peer_addr().unwrap().port(), port);
            assert!(known.iter().all(|a| a.port() == port), "{known:?}");
        });
    }

    #[test]
    fn a_failed_connection_says_refused_or_unanswered_never_in_progress() {
        let addr: SocketAddr = "10.0.3.20:502".parse().unwrap();
        let refused = connect_failure(addr, &io::Error::from_raw_os_error(libc::ECONNREFUSED));
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
        assert_eq!(
            refused.to_string(),
            "connection refused by 10.0.3.20:502: nothing listens on port 502 there (the CDU's \
             Modbus TCP server is off, or the address or the port is wrong)"
        );
        for code in [libc::EINPROGRESS, libc::EALREADY] {
            let e = connect_failure(addr, &io::Error::from_raw_os_error(code));
            assert_eq!(e.kind(), io::ErrorKind::TimedOut);
            let text = e.to_string();
            assert!(text.starts_with("10.0.3.20:502 did not accept the connection: no answer"));
            assert!(!text.contains("progress"), "{text}");
        }
        let e = connect_failure(addr, &io::Error::from_raw_os_error(libc::EHOSTUNREACH));
        assert!(
            e.to_string().starts_with("10.0.3.20:502 is unreachable ("),
            "{e}"
        );
        let e = connect_failure(addr, &io::Error::from_raw_os_error(libc::EMFILE));
        assert!(
            e.to_string().starts_with("connecting to 10.0.3.20:502: "),
            "{e}"
        );
    }

    #[test]
    fn a_partial_write_names_what_went_in() {
        let e = CduError::Partial {
            written: std::vec!["supply_setpoint"],
            failed: "pump_speed",
            not_tried: std::vec!["lead_pump", "valves_open"],
            cause: Box::new(CduError::Refused {
                op: "write pump_speed at holding 1 of unit 1 on Modbus TCP 127.0.0.1:502"
                    .to_string(),
                code: 3,
                meaning: exception_meaning(3),
            }),
        };
        assert_eq!(
            e.to_string(),
            "wrote supply_setpoint; pump_speed failed; did not try lead_pump, valves_open: \
             write pump_speed at holding 1 of unit 1 on Modbus TCP 127.0.0.1:502: \
             the CDU refused it with exception 3 (illegal data value)"
        );
        assert_eq!(e.refused_code(), Some(3));
        assert!(!e.is_no_answer());
    }
}
