//! Frames out of a UART without ever waiting on it: each message is
//! encoded as the link's frame (`loopwarden_link::frame`: numbered,
//! checked, COBS) into one shared static buffer and queued whole, or
//! dropped whole and counted when the queue has no room for it (a dead
//! or stalled gateway, a debug port no one reads). The board's main loop
//! moves queued bytes into the UART as it takes them ([`TxQueue::pop`]);
//! no step ever waits for a byte to go out.
//!
//! Glossary:
//! - *queue*: the bytes of whole frames waiting for the UART.
//! - *frame number*: counts every frame made since the start, queued or
//!   not, so a receiver sees a dropped one as a gap.

use loopwarden_link::frame::{encode, max_frame, OVERHEAD};
use loopwarden_link::{EncodeError, MAX_MESSAGE};
use serde::Serialize;

/// The longest frame either port sends.
pub const MAX_FRAME: usize = max_frame(MAX_MESSAGE);

/// Bytes of frames waiting for the gateway: a step's status, events and
/// leases several times over (the leases of a CDU of 128 hosts capped at
/// once do not all fit: those not queued are due again at the next
/// step, and the step's events and status are queued before them).
pub const GATEWAY_QUEUE: usize = 8192;

/// The buffers a frame is made in: one pair for every port, used one
/// frame at a time.
#[derive(Debug)]
pub struct FrameBuffers {
    scratch: [u8; MAX_MESSAGE + OVERHEAD],
    out: [u8; MAX_FRAME],
}

impl FrameBuffers {
    /// Empty buffers.
    pub const fn new() -> Self {
        Self {
            scratch: [0; MAX_MESSAGE + OVERHEAD],
            out: [0; MAX_FRAME],
        }
    }
}

impl Default for FrameBuffers {
    fn default() -> Self {
        Self::new()
    }
}

/// Bytes of whole frames waiting for a UART, at most `N`.
#[derive(Debug)]
pub struct TxQueue<const N: usize> {
    bytes: heapless::Deque<u8, N>,
}

impl<const N: usize> TxQueue<N> {
    /// An empty queue.
    pub const fn new() -> Self {
        Self {
            bytes: heapless::Deque::new(),
        }
    }

    /// Queues `frame` whole; `false` (nothing queued) when it does not fit.
    pub fn push_frame(&mut self, frame: &[u8]) -> bool {
        if N - self.bytes.len() < frame.len() {
            return false;
        }
        for b in frame {
            // Room checked above.
            let _ = self.bytes.push_back(*b);
        }
        true
    }

    /// The next byte to send, if any.
    pub fn front(&self) -> Option<u8> {
        self.bytes.front().copied()
    }

    /// Takes the byte [`TxQueue::front`] gave: it went out.
    pub fn pop(&mut self) -> Option<u8> {
        self.bytes.pop_front()
    }

    /// Bytes waiting.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Nothing waiting.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

impl<const N: usize> Default for TxQueue<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// One port's frames: their numbers, their queue, and what was lost.
#[derive(Debug)]
pub struct FramedPort<const N: usize> {
    /// The next frame's number.
    seq: u32,
    /// Frames waiting for the UART.
    pub queue: TxQueue<N>,
    /// Frames dropped: no room in the queue.
    pub dropped: u32,
    /// Frames never made: the message did not encode.
    pub unencodable: u32,
}

impl<const N: usize> FramedPort<N> {
    /// A port with nothing sent.
    pub const fn new() -> Self {
        Self {
            seq: 0,
            queue: TxQueue::new(),
            dropped: 0,
            unencodable: 0,
        }
    }

    /// Frames `msg` in `buf` and queues it; `Ok(false)` when the queue had
    /// no room (counted), an error when it did not encode (counted).
    pub fn send<T: Serialize>(
        &mut self,
        msg: &T,
        buf: &mut FrameBuffers,
    ) -> Result<bool, EncodeError> {
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        let n = encode(msg, seq, &mut buf.scratch, &mut buf.out).inspect_err(|_| {
            self.unencodable = self.unencodable.saturating_add(1);
        })?;
        // Every frame leads with an end byte of its own (the link's
        // frame): a frame the receiver was taking when this side started
        // again (a reset mid-frame), or line noise, ends there as one that
        // does not read, and this one reads whole.
        let queued = self.queue.push_frame(&buf.out[..n]);
        if !queued {
            self.dropped = self.dropped.saturating_add(1);
        }
        Ok(queued)
    }
}

impl<const N: usize> Default for FramedPort<N> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_link::frame::END;
    use loopwarden_link::{Deframer, Fed, SeqWatch, Up};
    use std::vec::Vec;

    fn said(words: &str) -> Up {
        Up::Said {
            error: false,
            words: heapless::String::try_from(words).unwrap(),
        }
    }

    fn drain<const N: usize>(q: &mut TxQueue<N>) -> Vec<u8> {
        core::iter::from_fn(|| q.pop()).collect()
    }

    #[test]
    fn frames_go_whole_or_not_at_all_and_a_dropped_one_leaves_a_gap() {
        let mut buf = std::boxed::Box::new(FrameBuffers::new());
        let mut port = FramedPort::<64>::new();
        assert_eq!(port.send(&said("one"), &mut buf), Ok(true));
        let long = "x".repeat(60);
        assert_eq!(
            port.send(&said(&long), &mut buf),
            Ok(false),
            "no room: dropped whole"
        );
        assert_eq!(port.dropped, 1);
        let mut wire = drain(&mut port.queue);
        assert_eq!(port.send(&said("three"), &mut buf), Ok(true));
        wire.extend(drain(&mut port.queue));
        let mut d = Deframer::<MAX_FRAME>::default();
        let mut seq = SeqWatch::default();
        let mut got = Vec::new();
        for b in wire {
            if let Fed::Frame(f) = d.push(b) {
                seq.hear(f.seq);
                got.push(f.message::<Up>().unwrap());
            }
        }
        assert_eq!(got, [said("one"), said("three")]);
        assert_eq!(seq.lost, 1, "the receiver sees the dropped frame");
    }

    /// The gateway holds half a frame from before a reset: the first
    /// frame after it (the hello) still reads whole, and so does every
    /// frame after line noise.
    #[test]
    fn the_first_frame_after_a_start_ends_what_the_receiver_was_taking() {
        let mut buf = std::boxed::Box::new(FrameBuffers::new());
        let mut before = FramedPort::<256>::new();
        assert_eq!(before.send(&said("whole"), &mut buf), Ok(true));
        assert_eq!(before.send(&said("cut"), &mut buf), Ok(true));
        let old = drain(&mut before.queue);
        let mut port = FramedPort::<256>::new();
        assert_eq!(port.send(&said("hello"), &mut buf), Ok(true));
        let hello = drain(&mut port.queue);
        assert_eq!(port.send(&said("next"), &mut buf), Ok(true));
        let next = drain(&mut port.queue);
        for f in [&hello, &next] {
            assert_eq!(f[0], END, "every frame leads with an end");
            assert_eq!(f.iter().filter(|b| **b == END).count(), 2);
        }
        let mut wire = old[..old.len() - 3].to_vec();
        wire.extend(&hello);
        // Idle-line noise between two frames, no end after it.
        wire.extend([0x55, 0x13, 0x7f]);
        wire.extend(&next);
        let mut d = Deframer::<MAX_FRAME>::default();
        let mut got = Vec::new();
        let mut dropped = 0;
        for b in &wire {
            match d.push(*b) {
                Fed::Frame(f) => got.push(f.message::<Up>().unwrap()),
                Fed::Dropped(_) => dropped += 1,
                Fed::More => {}
            }
        }
        assert_eq!(got, [said("whole"), said("hello"), said("next")]);
        assert_eq!(dropped, 2, "the frame cut by the reset, the noise");
    }

    #[test]
    fn a_queue_takes_what_fits_and_gives_it_back_in_order() {
        let mut q = TxQueue::<8>::new();
        assert!(q.push_frame(&[1, 2, 3, 4, 5]));
        assert!(!q.push_frame(&[6, 7, 8, 9]));
        assert!(q.push_frame(&[6, 7, 8]));
        assert_eq!(q.len(), 8);
        assert_eq!(q.front(), Some(1));
        assert_eq!(drain(&mut q), [1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(q.is_empty());
    }
}
