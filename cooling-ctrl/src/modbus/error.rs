//! What can go wrong on the CDU's Modbus link, as the controller reports
//! it: [`CduError`] (the glossary of `modbus.rs` says what each kind
//! means), and a Modbus exception code in words
//! ([`exception_meaning`]).
use super::*;

/// Why a read or write of the CDU failed. Every message says what was
/// asked (register names, kind, addresses) and of which CDU.
#[derive(Debug, thiserror::Error)]
pub enum CduError {
    /// The CDU answered with a Modbus exception.
    #[error("{op}: the CDU refused it with exception {code} ({meaning})")]
    Refused {
        /// What was asked, and where.
        op: String,
        /// The exception code.
        code: u8,
        /// What the code means.
        meaning: &'static str,
    },
    /// Nothing came back within the timeout.
    #[error("{op}: no answer within {after_ms} ms")]
    NoAnswer {
        /// What was asked, and where.
        op: String,
        /// The timeout, ms.
        after_ms: u64,
    },
    /// On a serial line, bytes came within the timeout but never a whole
    /// answer: a bad CRC, a frame garbled or cut by noise. A request that
    /// waited out its timeout, as an unanswered one does.
    #[error(
        "{op}: {bytes} bytes came within {after_ms} ms, none of them a whole answer to it \
         (a bad CRC or a garbled frame: noise, the line's termination or biasing, another \
         device talking, or a CDU answering just past the timeout)"
    )]
    Garbled {
        /// What was asked, and where.
        op: String,
        /// The bytes that came.
        bytes: usize,
        /// The timeout, ms.
        after_ms: u64,
    },
    /// The link failed (port, connection).
    #[error("{op}: {source}")]
    Io {
        /// What was asked, and where.
        op: String,
        /// The failure.
        source: io::Error,
    },
    /// An answer that does not belong to the request.
    #[error("{op}: the answer does not match the request: {detail}")]
    BadAnswer {
        /// What was asked, and where.
        op: String,
        /// How it does not match.
        detail: String,
    },
    /// A value the map cannot encode (outside the setting's write range,
    /// or not representable); nothing was sent.
    #[error("{op}: {source}")]
    Value {
        /// What was asked, and where.
        op: String,
        /// Why the value does not go in.
        source: ValueError,
    },
    /// A write of several settings that failed after some went in.
    #[error(
        "wrote {}; {failed} failed; did not try {}: {cause}",
        list(.written),
        list(.not_tried)
    )]
    Partial {
        /// Settings (register names) the CDU took.
        written: Vec<&'static str>,
        /// The setting that failed (after no answer it may have gone in).
        failed: &'static str,
        /// Settings not sent.
        not_tried: Vec<&'static str>,
        /// Why it failed.
        #[source]
        cause: Box<CduError>,
    },
    /// A write of several settings, every one echoed, whose read-back
    /// found some holding another value (`failed`: not taken) or could
    /// not be read (`not_known`: taken as their echo said, unverified).
    #[error(
        "wrote {}; {} read back another value; {} not read back (taken as echoed): {}",
        list(.written),
        list(.failed),
        list(.not_known),
        said(.causes)
    )]
    ReadBack {
        /// Settings (register names) the CDU took, those not read back
        /// among them.
        written: Vec<&'static str>,
        /// Settings that read back another value than written.
        failed: Vec<&'static str>,
        /// Settings whose read-back failed.
        not_known: Vec<&'static str>,
        /// Each failure, in the order of the settings.
        causes: Vec<CduError>,
    },
}

fn said(causes: &[CduError]) -> String {
    let said: Vec<String> = causes.iter().map(ToString::to_string).collect();
    said.join("; ")
}

fn list(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

impl CduError {
    /// The failure itself: the cause of a [`CduError::Partial`], the
    /// first of a [`CduError::ReadBack`], else this.
    pub fn root(&self) -> &CduError {
        match self {
            Self::Partial { cause, .. } => cause.root(),
            Self::ReadBack { causes, .. } => causes.first().map_or(self, CduError::root),
            other => other,
        }
    }

    /// The exception code when the CDU refused.
    pub fn refused_code(&self) -> Option<u8> {
        match self.root() {
            Self::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// True when nothing came back in time.
    pub fn is_no_answer(&self) -> bool {
        matches!(self.root(), Self::NoAnswer { .. })
    }

    /// True when no answer came in time (nothing, or on a serial line
    /// only garbled bytes), the link failed, or a gateway on the way
    /// answered that it could not reach the CDU (exception 10 or 11, after
    /// its own timeout), as opposed to an answer of the CDU that refused
    /// or made no sense: another request would wait out its own timeout
    /// too.
    pub fn is_unanswered(&self) -> bool {
        matches!(
            self.root(),
            Self::NoAnswer { .. }
                | Self::Garbled { .. }
                | Self::Io { .. }
                | Self::Refused { code: 10 | 11, .. }
        )
    }
}

/// What a Modbus exception code means.
pub fn exception_meaning(code: u8) -> &'static str {
    match code {
        1 => "illegal function",
        2 => "illegal data address",
        3 => "illegal data value",
        4 => "server device failure",
        5 => "acknowledge",
        6 => "server device busy",
        8 => "memory parity error",
        10 => "gateway path unavailable",
        11 => "gateway target device failed to respond",
        _ => "unknown exception",
    }
}
