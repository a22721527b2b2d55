//! Frames on a byte stream: what one message looks like on the wire, and
//! how a receiver finds messages again in a stream that can lose, corrupt
//! or repeat bytes.
//!
//! A frame is `0x00 COBS(version, seq, payload, crc) 0x00`:
//! - `version` (1 byte): [`VERSION`]; a frame of another version is
//!   refused whole, never half-read.
//! - `seq` (4 bytes, little-endian): the sender's frame number, from 0 at
//!   its start, one more each frame ([`SeqWatch`] tells a gap, a repeat
//!   and a restart apart).
//! - `payload`: the message, postcard-encoded.
//! - `crc` (4 bytes, little-endian): CRC-32 (ISO-HDLC) of all before it.
//!
//! COBS removes every zero byte from the frame, so `0x00` ends one and a
//! receiver that joins mid-stream, or loses a byte, is back in step at the
//! next zero. Every frame also starts with a `0x00`: line noise, or a
//! frame cut before its end, ends there as one frame that does not read,
//! and never glues onto the good frame after it (two ends in a row make
//! an empty frame, which a receiver passes over).
//!
//! Glossary:
//! - *COBS*: consistent overhead byte stuffing; at most one byte in 254
//!   added.
//! - *deframer*: the receiver's side: bytes in, frames out
//!   ([`Deframer`]).

use crc::{Crc, CRC_32_ISO_HDLC};
use serde::{de::DeserializeOwned, Serialize};

/// The link's version: the first byte of every frame (2: `Up::Offer`;
/// 3: the gateway's layout in `Down::Alive`).
pub const VERSION: u8 = 3;

/// The frame's end.
pub const END: u8 = 0x00;

/// Bytes a frame adds to its payload before COBS: version, seq, CRC.
pub const OVERHEAD: usize = 1 + 4 + 4;

/// The longest encoded frame for a payload of at most `payload` bytes,
/// its leading and closing end bytes included.
pub const fn max_frame(payload: usize) -> usize {
    cobs::max_encoding_length(payload + OVERHEAD) + 2
}

const CRC: Crc<u32> = Crc::<u32>::new(&CRC_32_ISO_HDLC);

/// Why a frame could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodeError {
    /// The message does not fit the buffer (payload bytes the buffer
    /// allows).
    TooLong(usize),
    /// The message could not be encoded.
    Payload,
}

impl core::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::TooLong(n) => write!(f, "a link frame's message is over its {n} bytes"),
            Self::Payload => f.write_str("a link frame's message could not be encoded"),
        }
    }
}

/// Why a frame was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// Longer than the receiver's buffer (bytes dropped up to the next
    /// end).
    Overrun,
    /// Not valid COBS.
    Cobs,
    /// Shorter than a frame's header and CRC.
    Short,
    /// The CRC does not match: corrupted on the way.
    Crc,
    /// Another version of the link (the version it gave).
    Version(u8),
    /// The CRC matched but the message does not decode, or bytes are
    /// left after it: the two sides disagree on a message's shape.
    Payload,
}

impl core::fmt::Display for FrameError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Overrun => f.write_str("link frame longer than the receive buffer: dropped"),
            Self::Cobs => f.write_str("link frame is not valid COBS: dropped"),
            Self::Short => f.write_str("link frame too short for its header: dropped"),
            Self::Crc => f.write_str("link frame fails its CRC: dropped"),
            Self::Version(v) => write!(
                f,
                "link frame of version {v}, this side speaks {VERSION}: dropped"
            ),
            Self::Payload => f.write_str(
                "link frame passed its CRC but its message does not decode whole: dropped",
            ),
        }
    }
}

/// Encodes `msg` as frame number `seq` into `out` (an end byte before
/// it and one after it included), using `scratch` for the unstuffed
/// frame. Returns the frame's length.
pub fn encode<T: Serialize>(
    msg: &T,
    seq: u32,
    scratch: &mut [u8],
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    let room = scratch.len().saturating_sub(OVERHEAD);
    if room == 0 {
        return Err(EncodeError::TooLong(0));
    }
    scratch[0] = VERSION;
    scratch[1..5].copy_from_slice(&seq.to_le_bytes());
    let body = &mut scratch[5..5 + room];
    let n = match postcard::to_slice(msg, body) {
        Ok(b) => b.len(),
        Err(postcard::Error::SerializeBufferFull) => return Err(EncodeError::TooLong(room)),
        Err(_) => return Err(EncodeError::Payload),
    };
    let crc = CRC.checksum(&scratch[..5 + n]);
    scratch[5 + n..9 + n].copy_from_slice(&crc.to_le_bytes());
    let Some((lead, body)) = out.split_first_mut() else {
        return Err(EncodeError::TooLong(room));
    };
    *lead = END;
    let len = cobs::try_encode(&scratch[..9 + n], body).map_err(|_| EncodeError::TooLong(room))?;
    if len >= body.len() {
        return Err(EncodeError::TooLong(room));
    }
    body[len] = END;
    Ok(len + 2)
}

/// One frame as received: its number and its message's bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct Received<'a> {
    /// The sender's frame number.
    pub seq: u32,
    /// The postcard-encoded message.
    pub payload: &'a [u8],
}

impl Received<'_> {
    /// The message, decoded: [`FrameError::Payload`] when it does not
    /// decode, or when bytes are left after it (a sender whose message
    /// has a field more under the same [`VERSION`]: refused, not read
    /// with the field dropped).
    pub fn message<T: DeserializeOwned>(&self) -> Result<T, FrameError> {
        match postcard::take_from_bytes(self.payload) {
            Ok((m, [])) => Ok(m),
            _ => Err(FrameError::Payload),
        }
    }
}

/// Checks one frame's bytes (COBS-stuffed, without its end byte), in
/// place.
pub fn open(stuffed: &mut [u8]) -> Result<Received<'_>, FrameError> {
    let n = cobs::decode_in_place(stuffed).map_err(|_| FrameError::Cobs)?;
    let f = &stuffed[..n];
    if n < OVERHEAD {
        return Err(FrameError::Short);
    }
    let (body, crc) = f.split_at(n - 4);
    let want = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if CRC.checksum(body) != want {
        return Err(FrameError::Crc);
    }
    if body[0] != VERSION {
        return Err(FrameError::Version(body[0]));
    }
    Ok(Received {
        seq: u32::from_le_bytes([body[1], body[2], body[3], body[4]]),
        payload: &body[5..],
    })
}

/// The receiving side of a stream: bytes in, whole frames out, holding at
/// most `N` bytes of one frame.
#[derive(Debug)]
pub struct Deframer<const N: usize> {
    buf: [u8; N],
    len: usize,
    /// Dropping bytes up to the next end (the frame overran `N`).
    skipping: bool,
}

impl<const N: usize> Default for Deframer<N> {
    fn default() -> Self {
        Self {
            buf: [0; N],
            len: 0,
            skipping: false,
        }
    }
}

/// What one byte did to a [`Deframer`].
#[derive(Debug, PartialEq, Eq)]
pub enum Fed<'a> {
    /// Nothing yet: inside a frame, or an empty one between two ends.
    More,
    /// A frame, checked.
    Frame(Received<'a>),
    /// A frame dropped, and why.
    Dropped(FrameError),
}

impl<const N: usize> Deframer<N> {
    /// Feeds one byte.
    pub fn push(&mut self, b: u8) -> Fed<'_> {
        if b != END {
            if self.len == N {
                self.skipping = true;
                self.len = 0;
            }
            if !self.skipping {
                self.buf[self.len] = b;
                self.len += 1;
            }
            return Fed::More;
        }
        let (len, skipped) = (self.len, self.skipping);
        self.len = 0;
        self.skipping = false;
        if skipped {
            return Fed::Dropped(FrameError::Overrun);
        }
        if len == 0 {
            return Fed::More;
        }
        match open(&mut self.buf[..len]) {
            Ok(r) => Fed::Frame(r),
            Err(e) => Fed::Dropped(e),
        }
    }
}

/// What a frame's number says of the frames before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The first frame heard.
    First,
    /// The next one.
    Next,
    /// This many frames between the last and this one were lost.
    Gap(u32),
    /// A number at or below the last: the sender started again (or
    /// repeated itself).
    Restart,
}

/// The receiver's watch on frame numbers.
#[derive(Debug, Default, Clone, Copy)]
pub struct SeqWatch {
    last: Option<u32>,
    /// Frames lost, counted from the gaps.
    pub lost: u64,
    /// Restarts seen.
    pub restarts: u64,
}

impl SeqWatch {
    /// Hears frame number `seq`.
    pub fn hear(&mut self, seq: u32) -> Order {
        let order = match self.last {
            None => Order::First,
            Some(l) if seq == l.wrapping_add(1) => Order::Next,
            Some(l) if seq > l => Order::Gap(seq - l - 1),
            Some(_) => Order::Restart,
        };
        match order {
            Order::Gap(n) => self.lost += u64::from(n),
            Order::Restart => self.restarts += 1,
            Order::First | Order::Next => {}
        }
        self.last = Some(seq);
        order
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;
    use std::vec::Vec;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Msg {
        a: u32,
        b: heapless::Vec<u8, 64>,
        c: Option<f32>,
    }

    fn msg(n: u8) -> Msg {
        Msg {
            a: 0xdead_0000 | u32::from(n),
            b: (0..n % 64).collect(),
            c: Some(f32::from(n) / 3.0),
        }
    }

    fn frame(m: &Msg, seq: u32) -> Vec<u8> {
        let mut scratch = [0u8; 128];
        let mut out = [0u8; max_frame(119)];
        let n = encode(m, seq, &mut scratch, &mut out).unwrap();
        out[..n].to_vec()
    }

    fn receive(bytes: &[u8]) -> Vec<Result<(u32, Msg), FrameError>> {
        let mut d = Deframer::<160>::default();
        let mut got = Vec::new();
        for b in bytes {
            match d.push(*b) {
                Fed::More => {}
                Fed::Frame(r) => got.push(r.message().map(|m| (r.seq, m))),
                Fed::Dropped(e) => got.push(Err(e)),
            }
        }
        got
    }

    #[test]
    fn frames_carry_no_zero_but_their_ends_and_come_back_whole() {
        let f = frame(&msg(40), 7);
        assert_eq!(f.iter().filter(|b| **b == 0).count(), 2);
        assert_eq!((f[0], *f.last().unwrap()), (END, END));
        assert_eq!(receive(&f), [Ok((7, msg(40)))]);
    }

    #[test]
    fn a_corrupt_byte_loses_one_frame_and_the_next_is_read() {
        let mut bytes = frame(&msg(10), 1);
        bytes[6] ^= 0x40;
        bytes.extend(frame(&msg(11), 2));
        let got = receive(&bytes);
        assert!(matches!(got[0], Err(FrameError::Crc | FrameError::Cobs)));
        assert_eq!(got[1], Ok((2, msg(11))));
    }

    #[test]
    fn joining_mid_frame_and_overruns_are_dropped_and_said() {
        let first = frame(&msg(30), 1);
        let mut bytes = first[10..].to_vec();
        bytes.extend([0x55; 300]);
        bytes.push(END);
        bytes.extend(frame(&msg(3), 2));
        let got = receive(&bytes);
        assert_eq!(got.len(), 3);
        assert!(got[0].is_err());
        assert_eq!(got[1], Err(FrameError::Overrun));
        assert_eq!(got[2], Ok((2, msg(3))));
    }

    /// Idle-line noise with no end after it, then a frame: the noise is
    /// dropped at the frame's leading end, the frame reads whole.
    #[test]
    fn noise_before_a_frame_does_not_glue_onto_it() {
        let mut bytes = std::vec![0x55, 0x13, 0x7f];
        bytes.extend(frame(&msg(9), 5));
        let got = receive(&bytes);
        assert_eq!(got.last().cloned(), Some(Ok((5, msg(9)))));
        // A frame cut before its end, then the next one.
        let mut bytes = frame(&msg(20), 1);
        bytes.truncate(bytes.len() - 4);
        bytes.extend(frame(&msg(21), 2));
        assert_eq!(receive(&bytes).last().cloned(), Some(Ok((2, msg(21)))));
    }

    #[test]
    fn another_version_is_refused_whole() {
        let mut raw = [0u8; 32];
        raw[0] = VERSION + 1;
        let crc = CRC.checksum(&raw[..10]);
        raw[10..14].copy_from_slice(&crc.to_le_bytes());
        let mut out = [0u8; 40];
        let n = cobs::encode(&raw[..14], &mut out);
        assert_eq!(open(&mut out[..n]), Err(FrameError::Version(VERSION + 1)));
    }

    #[test]
    fn a_message_with_bytes_after_it_is_refused_not_cut() {
        // A sender of the same version whose message has a field more:
        // the frame passes its CRC, the message is refused whole.
        let mut raw = [0u8; 128];
        raw[0] = VERSION;
        raw[1..5].copy_from_slice(&9u32.to_le_bytes());
        let n = postcard::to_slice(&msg(12), &mut raw[5..]).unwrap().len();
        raw[5 + n] = 0x2a;
        let body = 5 + n + 1;
        let crc = CRC.checksum(&raw[..body]);
        raw[body..body + 4].copy_from_slice(&crc.to_le_bytes());
        let mut out = [0u8; 160];
        let len = cobs::encode(&raw[..body + 4], &mut out);
        let r = open(&mut out[..len]).unwrap();
        assert_eq!(r.seq, 9);
        assert_eq!(r.message::<Msg>(), Err(FrameError::Payload));
        // Without the byte after it, the same message reads.
        let mut whole = frame(&msg(12), 9);
        let end = whole.len() - 1;
        assert_eq!(open(&mut whole[1..end]).unwrap().message(), Ok(msg(12)));
    }

    #[test]
    fn a_message_that_does_not_fit_is_refused_not_cut() {
        let mut scratch = [0u8; 20];
        let mut out = [0u8; 64];
        assert_eq!(
            encode(&msg(40), 0, &mut scratch, &mut out),
            Err(EncodeError::TooLong(11))
        );
    }

    #[test]
    fn frame_numbers_tell_gaps_and_restarts() {
        let mut w = SeqWatch::default();
        let got: Vec<Order> = [5, 6, 9, 10, 0, 1].iter().map(|s| w.hear(*s)).collect();
        assert_eq!(
            got,
            [
                Order::First,
                Order::Next,
                Order::Gap(2),
                Order::Next,
                Order::Restart,
                Order::Next
            ]
        );
        assert_eq!((w.lost, w.restarts), (2, 1));
        let mut w = SeqWatch::default();
        w.hear(u32::MAX);
        assert_eq!(w.hear(0), Order::Next, "numbers wrap");
    }

    proptest! {
        #[test]
        fn noise_never_hides_the_next_frame(
            noise in proptest::collection::vec(any::<u8>(), 0..200),
            n in any::<u8>(),
        ) {
            let mut bytes = noise.clone();
            bytes.extend(frame(&msg(n), 42));
            // Noise is dropped (or, one chance in 2^32, passes its CRC);
            // it never hides the frame after it, and never panics.
            let got = receive(&bytes);
            prop_assert_eq!(got.last().cloned(), Some(Ok((42, msg(n)))));
        }
    }
}
