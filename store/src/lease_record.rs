//! A cap lease a controller sent or lifted, as its event log keeps it.
//!
//! The record is kind `MessageKind::CapLease`; its body is a byte for
//! lift (1) or cap (0), the host id's length and bytes, then the signed
//! frame as it went on the bus. The controller writes it
//! (`cooling-ctrl`'s journal) and reads it back for its console; the
//! field tool (`lwbus flash`) reads it from a copy of the flash file. One
//! encoder and one decoder, so the two readers cannot disagree.
//!
//! An agent's log keeps the commands it accepted under the same kind, as
//! the bare frame: [`LeaseRecord::decode`] refuses those (a frame's CRC
//! does not hold over a lease record, nor a record's lengths over a
//! frame), so a reader tries the frame first and this second.
//!
//! Glossary:
//! - *lift*: a lease of zero caps that ends an earlier one early.

use std::fmt;

use loopwarden_protocol::{DecodeError, EncodeError, Frame, Ident, Message, MAX_FRAME_LEN};

/// A lease sent to one host, or lifted from it, with the frame as sent.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRecord {
    /// The host the lease went to.
    pub host: Ident,
    /// Whether it lifted the host's caps (true) or capped them.
    pub lift: bool,
    /// The signed frame as published.
    pub frame: Frame,
}

/// Why a lease record's body could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LeaseRecordError {
    /// The body ends before its host id does.
    #[error("lease record of {len} bytes ends inside its header or host id")]
    Truncated {
        /// The body's length.
        len: usize,
    },
    /// The lift byte is neither 0 nor 1.
    #[error("lease record's lift byte is {0}, not 0 or 1")]
    BadLift(u8),
    /// The host id is not a valid id.
    #[error("lease record's host id {0:?} is not a valid id")]
    BadHost(String),
    /// The frame after the host id does not decode.
    #[error("lease record's frame: {0}")]
    Frame(#[from] DecodeError),
}

impl LeaseRecord {
    /// The record's body.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let mut buf = [0u8; MAX_FRAME_LEN];
        let n = self.frame.encode(&mut buf)?;
        let h = self.host.as_str().as_bytes();
        let mut body = Vec::with_capacity(2 + h.len() + n);
        body.push(u8::from(self.lift));
        // An id is at most `IDENT_MAX` (32) bytes, so its length fits a byte.
        body.push(h.len() as u8);
        body.extend_from_slice(h);
        body.extend_from_slice(&buf[..n]);
        Ok(body)
    }

    /// Reads a record's body back.
    pub fn decode(body: &[u8]) -> Result<LeaseRecord, LeaseRecordError> {
        let truncated = LeaseRecordError::Truncated { len: body.len() };
        let [lift, len, rest @ ..] = body else {
            return Err(truncated);
        };
        let lift = match lift {
            0 => false,
            1 => true,
            other => return Err(LeaseRecordError::BadLift(*other)),
        };
        let (host, frame) = rest.split_at_checked(usize::from(*len)).ok_or(truncated)?;
        let host = String::from_utf8_lossy(host);
        let host = Ident::new(&host).map_err(|_| LeaseRecordError::BadHost(host.to_string()))?;
        Ok(LeaseRecord {
            host,
            lift,
            frame: Frame::decode(frame)?,
        })
    }
}

/// In words, as the console and the field tool show it: `cap lifted on
/// h03 (lease 7, seq 12)` or `h03: <the lease> (seq 12)`.
impl fmt::Display for LeaseRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (host, seq) = (&self.host, self.frame.seq);
        match &self.frame.message {
            Message::CapLease(l) if self.lift => {
                write!(f, "cap lifted on {host} (lease {}, seq {seq})", l.lease)
            }
            Message::CapLease(l) => write!(f, "{host}: {l} (seq {seq})"),
            other => write!(f, "{host}: a {} frame (seq {seq})", other.kind().name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::{samples, MessageKind};

    fn record(lift: bool) -> LeaseRecord {
        LeaseRecord {
            host: Ident::new("h03").unwrap(),
            lift,
            frame: samples::frame(MessageKind::CapLease),
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        for lift in [false, true] {
            let r = record(lift);
            let body = r.encode().unwrap();
            assert_eq!(LeaseRecord::decode(&body).unwrap(), r);
            assert!(matches!(r.frame.message, Message::CapLease(_)));
        }
    }

    #[test]
    fn a_bare_frame_is_not_read_as_a_record_nor_a_record_as_a_frame() {
        let r = record(true);
        let mut frame = [0u8; MAX_FRAME_LEN];
        let n = r.frame.encode(&mut frame).unwrap();
        assert!(LeaseRecord::decode(&frame[..n]).is_err());
        assert!(Frame::decode(&r.encode().unwrap()).is_err());
    }

    #[test]
    fn every_cut_of_a_record_is_an_error_that_says_what() {
        let body = record(false).encode().unwrap();
        for cut in 0..body.len() {
            let err = LeaseRecord::decode(&body[..cut]).unwrap_err();
            assert!(!err.to_string().is_empty());
        }
        let mut bad = body.clone();
        bad[0] = 7;
        assert_eq!(LeaseRecord::decode(&bad), Err(LeaseRecordError::BadLift(7)));
    }
}
