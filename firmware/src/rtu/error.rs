//! What a Modbus RTU transaction can end in other than an answer, each
//! naming the request and its registers.

use core::fmt;

use embedded_hal_nb::serial::ErrorKind;

/// What a request asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// Read input registers (function 4).
    ReadInput,
    /// Read back holding registers (function 3).
    ReadHolding,
    /// Write one holding register (function 6).
    WriteSingle,
    /// Write holding registers (function 16).
    WriteMultiple,
}

/// One request: what, where and which registers, for the errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    /// What it asked.
    pub kind: OpKind,
    /// The CDU's unit id.
    pub unit: u8,
    /// First address.
    pub address: u16,
    /// Registers (words).
    pub count: u16,
    /// The first register's name.
    pub first: &'static str,
    /// The last register's name (the first's when only one).
    pub last: &'static str,
    /// The words a write sent, its first `count` (none for a read): what
    /// a refusal or a wrong echo is said with.
    pub sent: [u16; 2],
}

impl Op {
    /// The words a write sent, as said: `word 1000`, `words 1, 34464`.
    pub fn words(&self) -> Words<'_> {
        Words(self)
    }
}

/// A write's words as said ([`Op::words`]).
pub struct Words<'a>(&'a Op);

impl fmt::Display for Words<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = usize::from(self.0.count).min(self.0.sent.len());
        let sent = &self.0.sent[..n];
        f.write_str(if n == 1 { "word" } else { "words" })?;
        for (i, w) in sent.iter().enumerate() {
            write!(f, "{}{w}", if i == 0 { " " } else { ", " })?;
        }
        Ok(())
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let end = u32::from(self.address) + u32::from(self.count).max(1) - 1;
        match self.kind {
            OpKind::ReadInput if self.first == self.last => {
                write!(f, "read {} at input {}", self.first, self.address)?
            }
            OpKind::ReadInput => write!(
                f,
                "read input {}-{end} ({} to {})",
                self.address, self.first, self.last
            )?,
            OpKind::ReadHolding if self.first == self.last => {
                write!(f, "read back {} at holding {}", self.first, self.address)?
            }
            OpKind::ReadHolding => write!(
                f,
                "read back holding {}-{end} ({} to {})",
                self.address, self.first, self.last
            )?,
            OpKind::WriteSingle | OpKind::WriteMultiple => {
                write!(f, "write {} at holding {}", self.first, self.address)?
            }
        }
        write!(f, " of unit {}", self.unit)
    }
}

/// How an answer was not the answer to the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mismatch {
    /// Another unit answered.
    Unit(u8),
    /// The answer is to another function.
    Function(u8),
    /// A write's echo differs from what was written: the address it
    /// echoed, and the word (one register written) or the count of
    /// registers (several).
    Echo {
        /// The address echoed.
        address: u16,
        /// The word echoed, or the count of registers.
        word: u16,
    },
    /// The answer has the wrong number of registers or bytes.
    Length,
    /// The frame's CRC matched but its contents do not decode.
    Undecodable,
}

/// Why a transaction failed (see `rtu`'s note for what each means on the
/// line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RtuError {
    /// No whole answer within the response timeout, or by the deadline
    /// when it came first.
    NoAnswer {
        /// The request.
        op: Op,
        /// How long the answer was waited for, µs.
        after_us: u32,
        /// Bytes that did arrive.
        got: u16,
        /// The deadline ended the wait before the timeout.
        cut: bool,
    },
    /// The answer arrived whole but its CRC does not match.
    Crc {
        /// The request.
        op: Op,
        /// The CRC in the frame.
        sent: u16,
        /// The CRC of its bytes.
        computed: u16,
    },
    /// The CDU answered with a Modbus exception.
    Refused {
        /// The request.
        op: Op,
        /// The exception code.
        code: u8,
    },
    /// Something answered, but not to this request.
    BadAnswer {
        /// The request.
        op: Op,
        /// How it differs.
        why: Mismatch,
    },
    /// The line never fell silent for the inter-frame gap before the
    /// request, within the response timeout: nothing was sent.
    LineBusy {
        /// The request not sent.
        op: Op,
    },
    /// Not sent: the deadline left no time for the request, the CDU's
    /// turnaround and the answer (or came while the line was not yet
    /// silent).
    OutOfTime {
        /// The request not sent.
        op: Op,
    },
    /// The UART reported an error (overrun, framing, parity, noise).
    Serial {
        /// The request.
        op: Op,
        /// What the UART said.
        kind: ErrorKind,
    },
}

impl RtuError {
    /// Whether the request went out on the line, whatever came back (an
    /// answer, an exception, garbage or nothing); not when the line was
    /// busy or the step had no time left for it.
    pub fn was_sent(&self) -> bool {
        match self {
            RtuError::NoAnswer { .. }
            | RtuError::Crc { .. }
            | RtuError::Refused { .. }
            | RtuError::BadAnswer { .. }
            | RtuError::Serial { .. } => true,
            RtuError::LineBusy { .. } | RtuError::OutOfTime { .. } => false,
        }
    }

    /// The request it concerns.
    pub fn op(&self) -> &Op {
        match self {
            RtuError::NoAnswer { op, .. }
            | RtuError::Crc { op, .. }
            | RtuError::Refused { op, .. }
            | RtuError::BadAnswer { op, .. }
            | RtuError::LineBusy { op }
            | RtuError::OutOfTime { op }
            | RtuError::Serial { op, .. } => op,
        }
    }
}

impl fmt::Display for RtuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.op())?;
        match self {
            RtuError::NoAnswer {
                after_us,
                got,
                cut: false,
                ..
            } => write!(
                f,
                "no whole answer within {} ms ({got} bytes came)",
                after_us / 1000
            ),
            RtuError::NoAnswer { after_us, got, .. } => write!(
                f,
                "no whole answer {} ms after the request, when the step's time ran out \
                 ({got} bytes came)",
                after_us / 1000
            ),
            RtuError::Crc { sent, computed, .. } => write!(
                f,
                "the answer's CRC is {sent:#06x}, its bytes give {computed:#06x}"
            ),
            RtuError::Refused { op, code } => {
                match op.kind {
                    OpKind::ReadInput | OpKind::ReadHolding => f.write_str("the CDU refused it")?,
                    _ => write!(f, "the CDU refused {}", op.words())?,
                }
                write!(f, " with exception {code} (")?;
                // Its meaning as the Modbus codec names it.
                match modbus_core::Exception::try_from(*code) {
                    Ok(e) => write!(f, "{e})"),
                    Err(_) => f.write_str("not an exception Modbus defines)"),
                }
            }
            RtuError::BadAnswer { op, why } => match why {
                Mismatch::Unit(u) => write!(f, "unit {u} answered"),
                Mismatch::Function(c) => write!(f, "the answer is to function {c}"),
                Mismatch::Echo { address, word } => echo(f, op, *address, *word),
                Mismatch::Length => write!(f, "the answer has the wrong length"),
                Mismatch::Undecodable => write!(f, "the answer does not decode"),
            },
            RtuError::LineBusy { .. } => {
                write!(f, "the line never fell silent before the request; not sent")
            }
            RtuError::OutOfTime { .. } => write!(f, "not sent: the step's time ran out"),
            RtuError::Serial { kind, .. } => write!(f, "the UART reported {kind:?}"),
        }
    }
}

/// A write's wrong echo (`address`, `word`: [`Mismatch::Echo`]), beside
/// what `op` wrote: short enough for the words a failed write is kept in
/// (`cooling_decide::said::WORDS`, 128 bytes) with the request before it.
fn echo(f: &mut fmt::Formatter<'_>, op: &Op, address: u16, word: u16) -> fmt::Result {
    match op.kind {
        OpKind::WriteMultiple => write!(f, "echo {word} registers")?,
        _ => write!(f, "echo word {word}")?,
    }
    write!(
        f,
        " at holding {address}, written {} at holding {}",
        op.words(),
        op.address
    )
}
