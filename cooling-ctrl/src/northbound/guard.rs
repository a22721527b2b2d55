//! A guard in front of tokio-modbus's request decoder: it hands the
//! decoder whole Modbus TCP frames only, and fails the connection on the
//! requests that decoder (0.17) panics on instead of refusing.
//!
//! The decoder takes a request once its frame is whole. Two requests make
//! it panic: a write of multiple coils (function 15) whose quantity is
//! more than its data bytes hold (it indexes past them), and a write of
//! multiple registers (16, or 23's write part) of 32768 registers or more
//! (doubling the count overflows 16 bits; a build with overflow checks
//! panics). Neither is a request any BMS sends: the guard fails the
//! connection on them, as the decoder fails it on any other malformed
//! frame, and on a frame longer than any Modbus request, so nobody can
//! make a connection hold more than one frame's bytes.
//!
//! Glossary:
//! - *frame*: the MBAP header (transaction id, protocol id, length, unit
//!   id: 7 bytes) and the PDU; the length counts the unit id and the PDU.
//! - *PDU*: the function code and its data.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::vec::Vec;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The longest Modbus TCP frame: the header and a PDU of 253 bytes.
const MAX_FRAME: usize = 7 + 253;

/// A client's stream, read frame by frame (see the module's note).
#[derive(Debug)]
pub(super) struct Guarded<T> {
    inner: T,
    /// Bytes read from the client and not yet handed on.
    held: Vec<u8>,
    /// How many of them, from the front, are checked whole frames.
    checked: usize,
    /// The client closed its side.
    eof: bool,
}

impl<T> Guarded<T> {
    /// `inner`, guarded.
    pub(super) fn new(inner: T) -> Self {
        Guarded {
            inner,
            held: Vec::new(),
            checked: 0,
            eof: false,
        }
    }
}

/// What the bytes held start with.
#[derive(Debug, PartialEq, Eq)]
enum Frame {
    /// Not a whole frame yet.
    Partial,
    /// A whole frame of this many bytes, safe to decode.
    Whole(usize),
    /// A frame the connection fails on, and why.
    Refused(&'static str),
}

fn frame(bytes: &[u8]) -> Frame {
    let Some(header) = bytes.get(..7) else {
        return Frame::Partial;
    };
    let len = usize::from(u16::from_be_bytes([header[4], header[5]]));
    if !(2..=MAX_FRAME - 6).contains(&len) {
        return Frame::Refused("a frame length no Modbus request has");
    }
    match bytes.get(7..6 + len) {
        None => Frame::Partial,
        Some(pdu) => refused(pdu).map_or(Frame::Whole(6 + len), Frame::Refused),
    }
}

/// Why the decoder would panic on `pdu`, if it would.
fn refused(pdu: &[u8]) -> Option<&'static str> {
    let word = |i: usize| pdu.get(i..i + 2).map(|w| u16::from_be_bytes([w[0], w[1]]));
    match pdu.first() {
        Some(0x0F) => match (word(3), pdu.get(5)) {
            (Some(quantity), Some(&bytes)) if quantity > 8 * u16::from(bytes) => {
                Some("a coil write of more coils than its bytes hold")
            }
            _ => None,
        },
        Some(0x10) if word(3).is_some_and(|q| q >= 0x8000) => {
            Some("a register write of 32768 registers or more")
        }
        Some(0x17) if word(7).is_some_and(|q| q >= 0x8000) => {
            Some("a register write of 32768 registers or more")
        }
        _ => None,
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.checked > 0 {
                let n = this.checked.min(out.remaining());
                out.put_slice(&this.held[..n]);
                this.held.drain(..n);
                this.checked -= n;
                return Poll::Ready(Ok(()));
            }
            match frame(&this.held) {
                Frame::Whole(n) => this.checked = n,
                Frame::Refused(why) => {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, why)))
                }
                // The client closed with a frame cut short: the decoder
                // would wait for the rest, so the end is all it gets.
                Frame::Partial if this.eof => return Poll::Ready(Ok(())),
                Frame::Partial => {
                    let mut chunk = [0u8; MAX_FRAME];
                    let mut read = ReadBuf::new(&mut chunk);
                    ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
                    this.eof = read.filled().is_empty();
                    this.held.extend_from_slice(read.filled());
                }
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt as _;

    /// What a reader of `bytes` through the guard gets: the bytes handed
    /// on, or the error.
    fn through(bytes: &[u8]) -> io::Result<Vec<u8>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut out = Vec::new();
        rt.block_on(Guarded::new(bytes).read_to_end(&mut out))
            .map(|_| out)
    }

    #[test]
    fn whole_requests_pass_and_a_frame_cut_short_is_held_back() {
        let read = [0, 1, 0, 0, 0, 6, 1, 4, 0, 0, 0, 10];
        let write = [0, 2, 0, 0, 0, 9, 1, 16, 0, 0, 0, 1, 2, 0x0F, 0xA0];
        let both = [&read[..], &write[..]].concat();
        assert_eq!(through(&both).unwrap(), both);
        assert_eq!(through(&both[..both.len() - 1]).unwrap(), read);
        assert!(through(&[]).unwrap().is_empty());
    }

    /// Found by the `northbound_server` fuzz target: each made
    /// tokio-modbus's decoder panic in the connection's task.
    #[test]
    fn the_requests_the_decoder_panics_on_fail_the_connection() {
        // Function 15, 0x0F02 coils in 0 bytes: an index past the data.
        let coils = [0, 0, 0, 0, 0, 10, 1, 0x0F, 2, 0xC5, 0x0F, 2, 0, 0, 0x0F, 2];
        // Function 16, 0x8004 registers in 8 bytes: 0x8004 * 2 overflows.
        let registers = [
            0, 0, 0, 0, 0, 11, 2, 0x10, 0, 0, 0x80, 4, 8, 0x0F, 0xA0, 0xFF, 0xE7, 0,
        ];
        // Function 23, writing 0x8001 registers.
        let read_write = [
            0, 0, 0, 0, 0, 13, 1, 0x17, 0, 0, 0, 1, 0, 0, 0x80, 1, 2, 0, 0,
        ];
        for bad in [&coils[..], &registers[..], &read_write[..]] {
            let e = through(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{bad:?}");
        }
        // A frame longer than any request is refused from its header.
        let e = through(&[0, 0, 0, 0, 0xFF, 0xFF, 1]).unwrap_err();
        assert_eq!(e.to_string(), "a frame length no Modbus request has");
    }
}
