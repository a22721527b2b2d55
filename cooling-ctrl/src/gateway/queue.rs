//! What goes down the MCU's line, in what order. The line's queue
//! ([`link::start`](super::link::start)) holds whole frames, each numbered
//! as it is made; two kinds share it:
//! - control messages (`Alive`, `Clear`, `Limits`, `Outdoor`,
//!   `FacilityTarget`) are framed and queued at once, and find room: host
//!   reports never hold more than [`HOSTS_IN_LINE`] of its places;
//! - host reports wait here, the latest of each host only (a newer report
//!   of a host replaces the one still waiting: counted as superseded),
//!   and are framed and queued as the line takes what it has
//!   ([`DownQueue::feed`], after every frame written), so a line that
//!   cannot carry every host's reports at their rate carries the newest
//!   of each, and never crowds a control message out.
//!
//! Glossary:
//! - *in line*: handed to the line's queue, not yet written.
//! - *superseded*: a host report replaced by a newer one of the same host
//!   before it went.

use std::collections::{HashMap, VecDeque};
use std::vec::Vec;

use loopwarden_link::Down;
use tokio::sync::mpsc;

/// Host reports in the line's queue at most: the line is kept busy, and a
/// control message waits behind at most this many.
pub const HOSTS_IN_LINE: usize = 4;

/// What became of a control message ([`DownQueue::control`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Framed and in the line's queue.
    Queued,
    /// The line's queue had no place (full: the line is stuck; or gone):
    /// not framed.
    NoRoom,
    /// It could not be framed.
    NotFramed,
}

/// The gateway's side of the line's queue (see the module note).
#[derive(Debug)]
pub struct DownQueue {
    to_mcu: mpsc::Sender<Vec<u8>>,
    /// Hosts whose report waits, oldest first.
    order: VecDeque<u16>,
    /// The latest report of each host in `order`.
    latest: HashMap<u16, Down>,
    /// Host reports replaced by a newer one before they went.
    pub superseded: u64,
    /// `superseded` when last said, and when (steady ms).
    said: Option<(u64, u64)>,
}

/// How often superseded host reports are said, at most, ms.
const SAY_EVERY_MS: u64 = 60_000;

impl DownQueue {
    /// Frames go to `to_mcu`.
    pub fn new(to_mcu: mpsc::Sender<Vec<u8>>) -> Self {
        Self {
            to_mcu,
            order: VecDeque::new(),
            latest: HashMap::new(),
            superseded: 0,
            said: None,
        }
    }

    /// Host reports superseded since they were last said, when they are to
    /// be said at `now_ms` (at the first, then once a minute at most).
    pub fn superseded_to_say(&mut self, now_ms: u64) -> Option<u64> {
        let (before, at) = self.said.unwrap_or((0, 0));
        let new = self.superseded - before;
        let due = self.said.is_none() || now_ms.saturating_sub(at) >= SAY_EVERY_MS;
        (new > 0 && due).then(|| {
            self.said = Some((self.superseded, now_ms));
            new
        })
    }

    /// Frames a control message (`frame`) and queues it, once the line's
    /// queue has a place for it: a full queue (the line is stuck) or a
    /// gone one never calls `frame`, so no frame number is spent on a
    /// frame that never goes.
    pub fn control(&mut self, frame: impl FnOnce() -> Option<Vec<u8>>) -> Control {
        let Ok(place) = self.to_mcu.try_reserve() else {
            return Control::NoRoom;
        };
        match frame() {
            Some(f) => {
                place.send(f);
                Control::Queued
            }
            None => Control::NotFramed,
        }
    }

    /// Host `index`'s report `down` waits its turn; true when it replaced
    /// one of the same host that had not gone yet (counted).
    pub fn host(&mut self, index: u16, down: Down) -> bool {
        if self.latest.insert(index, down).is_some() {
            self.superseded += 1;
            return true;
        }
        self.order.push_back(index);
        false
    }

    /// Host reports waiting.
    pub fn waiting(&self) -> usize {
        self.order.len()
    }

    /// Frames (`frame`) and queues waiting host reports while the line's
    /// queue holds fewer than [`HOSTS_IN_LINE`] frames; the reports queued
    /// (a report `frame` could not make is dropped, as `frame` says).
    pub fn feed(&mut self, mut frame: impl FnMut(&Down) -> Option<Vec<u8>>) -> u64 {
        let mut queued = 0;
        while self.in_line() < HOSTS_IN_LINE {
            let Some(index) = self.order.pop_front() else {
                break;
            };
            let Ok(place) = self.to_mcu.try_reserve() else {
                // No place (or the line gone): the report waits, unframed.
                self.order.push_front(index);
                break;
            };
            let Some(down) = self.latest.remove(&index) else {
                continue;
            };
            let Some(f) = frame(&down) else { continue };
            place.send(f);
            queued += 1;
        }
        queued
    }

    /// Frames in the line's queue, of either kind.
    fn in_line(&self) -> usize {
        self.to_mcu.max_capacity() - self.to_mcu.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_link::{Clear, ClearAction, SignedClear};
    use loopwarden_protocol::message::{HostTelemetry, QueueDrops};
    use loopwarden_protocol::units::TimestampMs;
    use loopwarden_protocol::Ident;

    fn report(index: u16, time: u64) -> Down {
        Down::Host {
            index,
            stamped: TimestampMs(time),
            telemetry: HostTelemetry {
                gpus: heapless::Vec::new(),
                drops: QueueDrops::default(),
            },
        }
    }

    fn frame(d: &Down) -> Option<Vec<u8>> {
        Some(postcard::to_allocvec(d).unwrap())
    }

    /// A stuck line (its queue full): a control message offered at every
    /// tick is never framed, so it spends no frame number; the queue
    /// takes it once it has a place again.
    #[test]
    fn a_full_line_frames_no_control_message() {
        let (tx, mut rx) = mpsc::channel(2);
        let mut q = DownQueue::new(tx);
        let alive = Down::Outdoor(12.0);
        let mut framed = 0;
        let mut offer = |q: &mut DownQueue| {
            q.control(|| {
                framed += 1;
                frame(&alive)
            })
        };
        assert_eq!(offer(&mut q), Control::Queued);
        assert_eq!(offer(&mut q), Control::Queued);
        for _ in 0..10 {
            assert_eq!(offer(&mut q), Control::NoRoom);
        }
        rx.try_recv().unwrap();
        assert_eq!(offer(&mut q), Control::Queued);
        assert_eq!(framed, 3, "only the frames queued were made");
        drop(rx);
        assert_eq!(q.control(|| unreachable!("a gone line")), Control::NoRoom);
    }

    /// The line's reader does not read: 64 host reports, then a clear;
    /// the clear is queued, and each host's latest report waits.
    #[test]
    fn host_reports_never_crowd_a_control_message_off_the_line() {
        let (tx, mut rx) = mpsc::channel(64);
        let mut q = DownQueue::new(tx);
        for i in 0..64u16 {
            q.host(i, report(i, 1));
            q.feed(frame);
        }
        assert_eq!(q.waiting(), 64 - HOSTS_IN_LINE);
        let clear = Down::Clear(SignedClear {
            clear: Clear {
                id: 1,
                cdu: Ident::new("cdu-1").unwrap(),
                operator: Ident::new("jdoe").unwrap(),
                at: TimestampMs(1),
                action: ClearAction::Leak(1),
            },
            key_id: 1,
            signature: [[7; 32]; 2],
        });
        assert_eq!(
            q.control(|| frame(&clear)),
            Control::Queued,
            "the clear is queued"
        );
        // A newer report of a host waiting replaces it.
        assert!(q.host(63, report(63, 2)));
        assert_eq!((q.waiting(), q.superseded), (64 - HOSTS_IN_LINE, 1));
        assert_eq!(q.superseded_to_say(5_000), Some(1), "said at once");
        q.host(62, report(62, 2));
        assert_eq!(q.superseded_to_say(6_000), None, "once a minute");
        assert_eq!(q.superseded_to_say(65_000), Some(1));
        // The line takes what it has: the next reports go, oldest first,
        // the newest of host 63 last.
        let mut went = Vec::new();
        while let Ok(f) = rx.try_recv() {
            went.push(postcard::from_bytes::<Down>(&f).unwrap());
            q.feed(frame);
        }
        assert_eq!(went.len(), 65);
        assert_eq!(went[HOSTS_IN_LINE], clear);
        assert_eq!(went[0], report(0, 1));
        assert_eq!(went[63], report(62, 2));
        assert_eq!(went[64], report(63, 2));
        assert_eq!(q.waiting(), 0);
    }
}
