//! Modbus RTU master: one transaction at a time with the CDU on a serial
//! line, the functions the Linux controller uses (read input registers,
//! 4; read holding registers, 3, for the read-back of the safety writes;
//! write single register, 6; write multiple registers, 16, for 32-bit
//! settings). Frames are encoded and checked by `modbus-core`; the
//! timing is this module's, on a microsecond clock:
//! - before each request the line must have been silent for 3.5
//!   characters (the RTU inter-frame gap, [`gap_us`], from the baud
//!   rate and the 10 bits of an 8N1 character), timed from the last byte
//!   seen either way; bytes that arrive meanwhile (a late answer) are
//!   discarded and restart the wait;
//!   after a failed transaction the silence asked is at least
//!   [`RESYNC_QUIET_US`] from the failure, as the Linux controller asks
//!   (an answer later still is read as a bad answer to the next request,
//!   never as its answer);
//! - an answer ends when it has the length the request implies (or an
//!   exception's five bytes), or fails after the response timeout;
//! - no wait goes past the deadline the caller set ([`RtuMaster::set_deadline`],
//!   the step's end): a request is sent only while the deadline leaves
//!   time for it, the CDU's least turnaround and its answer
//!   ([`crate::budget::TURNAROUND_LEAST_US`]); an answer not whole by the
//!   deadline is no answer, said as the step's time ran out, and the
//!   next request waits until that answer could no longer come (its
//!   response timeout after its request), so it is never read as the
//!   next one's.
//!
//! Everything else is typed ([`RtuError`]), naming the request and its
//! registers: a CRC mismatch, an exception (refused), an answer from
//! another unit or to another function, no whole answer in time.
//!
//! Glossary:
//! - *character time*: the time one character takes on the line.
//! - *gap*: the silence that delimits frames (3.5 character times).
//! - *idle*: what the master does while it waits: the board sleeps until
//!   an interrupt (a byte, a clock tick).

mod error;

use embedded_hal_nb::nb;
use embedded_hal_nb::serial::{self, Error as _};
use modbus_core::rtu::{self, Header, RequestAdu};
use modbus_core::{Data, Request, RequestPdu, Response};

pub use error::{Mismatch, Op, OpKind, RtuError};

use crate::map::{Register, Span};

/// The clock the master times with, and how it waits.
pub trait Clock {
    /// Microseconds on a monotonic clock.
    fn now_us(&mut self) -> u64;
    /// Waits a little: until an interrupt on the board.
    fn idle(&mut self);
}

/// Bits one character takes on the line: start, 8 data, stop (8N1).
pub const BITS_PER_CHAR: u32 = 10;

/// One character time at `baud`, µs (rounded up).
pub const fn char_us(baud: u32) -> u32 {
    (BITS_PER_CHAR * 1_000_000).div_ceil(baud)
}

/// The inter-frame gap at `baud`: 3.5 character times, µs (rounded up).
pub const fn gap_us(baud: u32) -> u32 {
    (BITS_PER_CHAR * 3_500_000).div_ceil(baud)
}

/// The least silence asked after a failed transaction, µs.
pub const RESYNC_QUIET_US: u32 = 20_000;

/// Registers one read may ask for.
pub const MAX_READ: usize = 125;

/// A Modbus RTU master on serial line `S`, timed by `C`.
pub struct RtuMaster<S, C> {
    serial: S,
    clock: C,
    unit: u8,
    gap_us: u32,
    timeout_us: u32,
    /// When the last byte was seen on the line, either way.
    last_activity_us: u64,
    /// The last transaction failed: ask for a longer silence.
    resync: bool,
    /// No wait goes past this, µs of the clock (`u64::MAX`: none).
    by_us: u64,
    /// Until when the answer to a request given up on (cut short by the
    /// deadline, or failed before its answer could have come whole) may
    /// still come, µs: no request goes before then.
    late_until_us: u64,
    /// One character's time on the line, µs.
    char_us: u32,
    buf: [u8; rtu::MAX_FRAME_LEN],
}

impl<S, C> RtuMaster<S, C>
where
    S: serial::Read<u8> + serial::Write<u8>,
    C: Clock,
{
    /// A master for `unit` on `serial` at `baud`, each answer awaited
    /// `timeout_us`.
    pub fn new(serial: S, mut clock: C, unit: u8, baud: u32, timeout_us: u32) -> Self {
        let now = clock.now_us();
        Self {
            serial,
            clock,
            unit,
            gap_us: gap_us(baud),
            timeout_us,
            last_activity_us: now,
            resync: false,
            by_us: u64::MAX,
            late_until_us: 0,
            char_us: char_us(baud),
            buf: [0; rtu::MAX_FRAME_LEN],
        }
    }

    /// The clock.
    pub fn clock(&mut self) -> &mut C {
        &mut self.clock
    }

    /// The response timeout, µs.
    pub fn timeout_us(&self) -> u32 {
        self.timeout_us
    }

    /// No wait of the transactions from now on goes past `by_us` (µs of
    /// the clock; `u64::MAX`: none): the step's end.
    pub fn set_deadline(&mut self, by_us: u64) {
        self.by_us = by_us;
    }

    /// Reads `span`'s input registers into `out` (at least `span.count`
    /// words); returns the words read.
    pub fn read_inputs(&mut self, span: &Span, out: &mut [u16]) -> Result<usize, RtuError> {
        let (first, last) = span.names();
        let op = self.op(OpKind::ReadInput, span.start, span.count, first, last);
        let n = usize::from(span.count);
        if n == 0 || n > MAX_READ || out.len() < n {
            return Err(RtuError::BadAnswer {
                op,
                why: Mismatch::Length,
            });
        }
        let req = Request::ReadInputRegisters(span.start, span.count);
        let pdu = self.transact(&op, req, 2 + 2 * n)?;
        match Response::try_from(pdu) {
            Ok(Response::ReadInputRegisters(data)) if data.len() == n => {
                for (i, w) in out.iter_mut().take(n).enumerate() {
                    *w = data.get(i).unwrap_or(0);
                }
                Ok(n)
            }
            Ok(_) => Err(self.failed(RtuError::BadAnswer {
                op,
                why: Mismatch::Length,
            })),
            Err(_) => Err(self.failed(RtuError::BadAnswer {
                op,
                why: Mismatch::Undecodable,
            })),
        }
    }

    /// Reads back the holding registers from `first`'s address to
    /// `last`'s last word into `out` (function 3, `out.len()` registers):
    /// the step's read-back of its safety writes ([`crate::read_back`]).
    pub fn read_holding(
        &mut self,
        first: &Register,
        last: &Register,
        out: &mut [u16],
    ) -> Result<(), RtuError> {
        let n = out.len();
        let count = n.min(usize::from(u16::MAX)) as u16;
        let op = self.op(
            OpKind::ReadHolding,
            first.address,
            count,
            first.name,
            last.name,
        );
        if n == 0 || n > MAX_READ {
            return Err(RtuError::BadAnswer {
                op,
                why: Mismatch::Length,
            });
        }
        let req = Request::ReadHoldingRegisters(first.address, count);
        let pdu = self.transact(&op, req, 2 + 2 * n)?;
        match Response::try_from(pdu) {
            Ok(Response::ReadHoldingRegisters(data)) if data.len() == n => {
                for (i, w) in out.iter_mut().enumerate() {
                    *w = data.get(i).unwrap_or(0);
                }
                Ok(())
            }
            Ok(_) => Err(self.failed(RtuError::BadAnswer {
                op,
                why: Mismatch::Length,
            })),
            Err(_) => Err(self.failed(RtuError::BadAnswer {
                op,
                why: Mismatch::Undecodable,
            })),
        }
    }

    /// Writes holding register `r` (one word: function 6; two: 16).
    pub fn write(&mut self, r: &Register, words: &[u16]) -> Result<(), RtuError> {
        let kind = if words.len() == 1 {
            OpKind::WriteSingle
        } else {
            OpKind::WriteMultiple
        };
        let mut op = self.op(kind, r.address, words.len() as u16, r.name, r.name);
        for (to, w) in op.sent.iter_mut().zip(words) {
            *to = *w;
        }
        let mut packed = [0u8; 4];
        let req = match words {
            [w] => Request::WriteSingleRegister(r.address, *w),
            _ => match Data::from_words(words, &mut packed) {
                Ok(d) => Request::WriteMultipleRegisters(r.address, d),
                Err(_) => {
                    return Err(RtuError::BadAnswer {
                        op,
                        why: Mismatch::Length,
                    })
                }
            },
        };
        let pdu = self.transact(&op, req, 5)?;
        // What came back: the address and the word (function 6) or the
        // count of registers (16).
        let (address, word, echo) = match Response::try_from(pdu) {
            Ok(Response::WriteSingleRegister(a, v)) => (a, v, a == r.address && [v] == words),
            Ok(Response::WriteMultipleRegisters(a, q)) => {
                (a, q, a == r.address && usize::from(q) == words.len())
            }
            // The function was checked on receipt: another answer of it
            // does not decode as the write's.
            Ok(_) | Err(_) => {
                return Err(self.failed(RtuError::BadAnswer {
                    op,
                    why: Mismatch::Undecodable,
                }))
            }
        };
        if !echo {
            return Err(self.failed(RtuError::BadAnswer {
                op,
                why: Mismatch::Echo { address, word },
            }));
        }
        Ok(())
    }

    fn op(
        &self,
        kind: OpKind,
        address: u16,
        count: u16,
        first: &'static str,
        last: &'static str,
    ) -> Op {
        Op {
            kind,
            unit: self.unit,
            address,
            count,
            first,
            last,
            sent: [0; 2],
        }
    }

    /// Notes a failed transaction: the next request waits for a longer
    /// silence, counted from now, for a late answer to come and go.
    fn failed(&mut self, e: RtuError) -> RtuError {
        self.resync = true;
        self.last_activity_us = self.clock.now_us();
        e
    }

    /// One request and its answer; returns the answer's PDU. `ok_pdu`: the
    /// PDU length of a good answer.
    fn transact(&mut self, op: &Op, req: Request<'_>, ok_pdu: usize) -> Result<&[u8], RtuError> {
        let fc = modbus_core::FunctionCode::from(req).value();
        self.quiet(op)?;
        let adu = RequestAdu {
            hdr: Header { slave: self.unit },
            pdu: RequestPdu(req),
        };
        let n =
            rtu::client::encode_request(adu, &mut self.buf).map_err(|_| RtuError::BadAnswer {
                op: *op,
                why: Mismatch::Length,
            })?;
        if !self.time_for(n + ok_pdu + 3) {
            return Err(RtuError::OutOfTime { op: *op });
        }
        self.send(op, n)?;
        let got = self.receive(op, fc, ok_pdu);
        let len = got.map_err(|e| self.failed(e))?;
        let pdu_len = len - 3;
        match rtu::extract_frame(&self.buf[..len], pdu_len) {
            Ok(Some(frame)) if frame.pdu[0] & 0x80 != 0 => {
                let code = frame.pdu.get(1).copied().unwrap_or(0);
                Err(RtuError::Refused { op: *op, code })
            }
            Ok(Some(_)) => Ok(&self.buf[1..1 + pdu_len]),
            Ok(None) => Err(self.failed(RtuError::BadAnswer {
                op: *op,
                why: Mismatch::Length,
            })),
            Err(modbus_core::Error::Crc(sent, computed)) => Err(self.failed(RtuError::Crc {
                op: *op,
                sent,
                computed,
            })),
            Err(_) => Err(self.failed(RtuError::BadAnswer {
                op: *op,
                why: Mismatch::Undecodable,
            })),
        }
    }

    /// The answer to the request just given up on may still come until
    /// `timeout_at` (its response timeout after it): no request goes
    /// before then, so that answer is never read as the next one's.
    fn answer_may_follow(&mut self, timeout_at: u64) {
        self.late_until_us = self.late_until_us.max(timeout_at);
    }

    /// Whether the deadline leaves time for `bytes` on the line (a
    /// request and its answer) and the CDU's least turnaround, from now.
    fn time_for(&mut self, bytes: usize) -> bool {
        let line = bytes as u64 * u64::from(self.char_us);
        let least = line + crate::budget::TURNAROUND_LEAST_US;
        self.clock.now_us().saturating_add(least) <= self.by_us
    }

    /// Waits until the line has been silent for the gap (longer after a
    /// failure) and a cut-short request's answer can no longer come,
    /// discarding what arrives meanwhile.
    fn quiet(&mut self, op: &Op) -> Result<(), RtuError> {
        let need = if self.resync {
            self.gap_us.max(RESYNC_QUIET_US)
        } else {
            self.gap_us
        };
        let natural = self.clock.now_us() + u64::from(self.timeout_us) + u64::from(need);
        // A late answer's window ends one timeout after an earlier send,
        // so before the natural end of this wait.
        debug_assert!(natural >= self.late_until_us);
        let give_up = natural.min(self.by_us);
        // Whether the line spoke while it was waited on: a line that
        // never fell silent is busy, whoever's deadline came first.
        let mut heard = false;
        loop {
            let now = self.clock.now_us();
            match self.serial.read() {
                Ok(_) | Err(nb::Error::Other(_)) => {
                    self.last_activity_us = now;
                    heard = true;
                }
                Err(nb::Error::WouldBlock) => {
                    let silent = now >= self.last_activity_us + u64::from(need);
                    if silent && now >= self.late_until_us {
                        self.resync = false;
                        return Ok(());
                    }
                    if now >= give_up && (heard || give_up < self.by_us) && !silent {
                        return Err(RtuError::LineBusy { op: *op });
                    }
                    if now >= give_up {
                        return Err(RtuError::OutOfTime { op: *op });
                    }
                    self.clock.idle();
                }
            }
        }
    }

    /// Sends the first `n` bytes of the buffer.
    fn send(&mut self, op: &Op, n: usize) -> Result<(), RtuError> {
        let serial_error = |e: S::Error| RtuError::Serial {
            op: *op,
            kind: e.kind(),
        };
        for i in 0..n {
            let b = self.buf[i];
            nb::block!(self.serial.write(b)).map_err(serial_error)?;
        }
        nb::block!(self.serial.flush()).map_err(serial_error)?;
        self.last_activity_us = self.clock.now_us();
        Ok(())
    }

    /// Reads an answer to function `fc` into the buffer until it has its
    /// length: `ok_pdu` + 3 bytes, or 5 for an exception. Returns its
    /// length. A read's answer whose byte count is not `ok_pdu` - 2 is a
    /// bad answer ([`Mismatch::Length`]) as soon as that byte comes.
    fn receive(&mut self, op: &Op, fc: u8, ok_pdu: usize) -> Result<usize, RtuError> {
        let sent = self.clock.now_us();
        let timeout = sent + u64::from(self.timeout_us);
        let deadline = timeout.min(self.by_us.max(sent));
        let mut got = 0usize;
        let mut want = ok_pdu + 3;
        loop {
            let now = self.clock.now_us();
            match self.serial.read() {
                Ok(b) => {
                    self.last_activity_us = now;
                    self.buf[got] = b;
                    got += 1;
                }
                Err(nb::Error::Other(e)) => {
                    self.last_activity_us = now;
                    self.answer_may_follow(timeout);
                    return Err(RtuError::Serial {
                        op: *op,
                        kind: e.kind(),
                    });
                }
                Err(nb::Error::WouldBlock) if now >= deadline => {
                    let got = got.min(usize::from(u16::MAX)) as u16;
                    if deadline < timeout {
                        self.answer_may_follow(timeout);
                    }
                    return Err(RtuError::NoAnswer {
                        op: *op,
                        after_us: (deadline - sent).min(u64::from(u32::MAX)) as u32,
                        got,
                        cut: deadline < timeout,
                    });
                }
                Err(nb::Error::WouldBlock) => self.clock.idle(),
            }
            if got == 1 && self.buf[0] != self.unit {
                self.answer_may_follow(timeout);
                return Err(RtuError::BadAnswer {
                    op: *op,
                    why: Mismatch::Unit(self.buf[0]),
                });
            }
            if got == 2 {
                want = match self.buf[1] {
                    f if f == fc => want,
                    f if f == fc | 0x80 => 5,
                    f => {
                        self.answer_may_follow(timeout);
                        return Err(RtuError::BadAnswer {
                            op: *op,
                            why: Mismatch::Function(f),
                        });
                    }
                };
            }
            if got == 3 && want == ok_pdu + 3 && has_byte_count(fc) {
                // A read's answer says its length in its third byte: one
                // that is not the registers asked for is known wrong now,
                // not after the whole timeout or a CRC read at the wrong
                // place (the rest of it passes in the resync's quiet).
                if usize::from(self.buf[2]) != ok_pdu - 2 {
                    return Err(RtuError::BadAnswer {
                        op: *op,
                        why: Mismatch::Length,
                    });
                }
            }
            if got >= 2 && got == want {
                return Ok(got);
            }
        }
    }
}

/// Whether an answer to function `fc` gives its data's length in its
/// third byte (the reads: coils, inputs, holding and input registers).
fn has_byte_count(fc: u8) -> bool {
    matches!(fc, 1..=4)
}

#[cfg(test)]
mod tests;
