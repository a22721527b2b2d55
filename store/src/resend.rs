//! What a resend reads: the logged events, by the number of the frame
//! each went out as.
//!
//! The log keeps an event's body (`{seq, time, kind, body}`, see
//! `loopwarden_flash::log`) before the bus numbers its frame. Once the
//! frame is numbered and handed to the outbox, the recorder appends a
//! [`PUBLISHED`] record: "log record `record` went out as frame `seq`".
//! A resend finds the frames asked for through these records and rebuilds
//! each from its event record: the same sender, number, time and body,
//! so the same bytes (under the same protocol version).
//!
//! An event logged and never published (the outbox refused it and the
//! agent stopped) has no such record and is not resent: its frame never
//! had a number for a reader to miss.
//!
//! Glossary:
//! - *record*: an entry of the event log, numbered by the log.
//! - *frame number*: the sequence number the bus gave the event's frame.
//! - *held from*: the lowest frame number whose event the log still
//!   holds; what is older went to a wrap.

use std::collections::HashMap;

use loopwarden_flash::EventLog;
use loopwarden_protocol::{Message, MessageKind, TimestampMs, MAX_FRAME_LEN};

use crate::agent_flash::Flash;

/// The event-log kind of a [`Published`] record. Agent-local: never a
/// bus message.
pub const PUBLISHED: u8 = 0xE1;

/// "Log record `record` went out as frame `seq`."
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// The event's log record.
    pub record: u32,
    /// The number of the frame it went out as.
    pub seq: u32,
}

impl Published {
    const LEN: usize = 8;

    /// The record's body: both numbers, little-endian.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..4].copy_from_slice(&self.record.to_le_bytes());
        b[4..].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Decodes a record's body; `None` if it is not one.
    pub fn decode(body: &[u8]) -> Option<Self> {
        let b: &[u8; Self::LEN] = body.try_into().ok()?;
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Some(Self {
            record: word(0),
            seq: word(4),
        })
    }
}

/// An event's body as the log keeps it.
pub fn event_body(message: &Message) -> Result<Vec<u8>, String> {
    let mut buf = [0u8; MAX_FRAME_LEN];
    message
        .encode_body(&mut buf)
        .map(|n| buf[..n].to_vec())
        .map_err(|e| e.to_string())
}

/// A logged event, with the number of the frame it went out as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    /// The frame's number.
    pub seq: u32,
    /// The frame's time (the event's).
    pub time: TimestampMs,
    /// The event's message.
    pub message: Message,
}

/// What the log holds of a range of frame numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resendable {
    /// The events of the range, in frame order, at most as many as asked.
    pub frames: Vec<Logged>,
    /// The lowest frame number whose event the log still holds.
    pub held_from: Option<u32>,
    /// The first frame number of the range left out for the limit.
    pub next: Option<u32>,
}

/// Reads the logged events published as frames `from..=to`, at most `max`.
/// Two passes over the log: the [`PUBLISHED`] records, then the events
/// they name.
pub fn read(
    log: &mut EventLog<Flash>,
    from: u32,
    to: u32,
    max: usize,
) -> Result<Resendable, String> {
    let mut numbers: HashMap<u32, u32> = HashMap::new();
    let scan = log.for_each(|r| {
        if let Some(p) = (r.kind == PUBLISHED)
            .then(|| Published::decode(r.body))
            .flatten()
        {
            numbers.insert(p.record, p.seq);
        }
    });
    futures::executor::block_on(scan).map_err(|e| format!("the event log: {e}"))?;
    let mut held_from: Option<u32> = None;
    let mut found = Vec::new();
    let mut undecodable = 0u32;
    let scan = log.for_each(|r| {
        let Some(&seq) = (r.kind == MessageKind::Event as u8)
            .then(|| numbers.get(&r.seq))
            .flatten()
        else {
            return;
        };
        held_from = Some(held_from.map_or(seq, |h| h.min(seq)));
        if !(from..=to).contains(&seq) {
            return;
        }
        match Message::decode_body(MessageKind::Event, r.body) {
            Ok(message) => found.push(Logged {
                seq,
                time: r.time,
                message,
            }),
            Err(_) => undecodable += 1,
        }
    });
    futures::executor::block_on(scan).map_err(|e| format!("the event log: {e}"))?;
    if undecodable > 0 {
        tracing::warn!(
            "{undecodable} logged events of frames {from}..={to} could not be decoded: not resent"
        );
    }
    found.sort_by_key(|l| l.seq);
    let next = found.get(max).map(|l| l.seq);
    found.truncate(max);
    Ok(Resendable {
        frames: found,
        held_from,
        next,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};

    use loopwarden_protocol::{Event, GpuIndex};

    use crate::recorder::Recorder;
    use crate::{Publisher, Refused};

    /// Numbers frames from 1000 on; refuses (outbox full) while `full`.
    #[derive(Clone, Default)]
    struct Numbering {
        next: Arc<AtomicU32>,
        full: Arc<Mutex<bool>>,
    }

    impl Publisher for Numbering {
        fn publish_message(&self, _: Message, _: TimestampMs, _: bool) -> Result<u32, Refused> {
            if *self.full.lock().unwrap() {
                return Err(Refused::OutboxFull);
            }
            Ok(1000 + self.next.fetch_add(1, Ordering::Relaxed))
        }

        fn next_seq(&self) -> u32 {
            1000 + self.next.load(Ordering::Relaxed)
        }
    }

    fn xid(n: u16) -> Event {
        Event::Xid {
            gpu: GpuIndex::new(0).unwrap(),
            xid: n,
        }
    }

    fn recorder(bus: &Numbering) -> Recorder {
        let stores = crate::agent_flash::open(None).unwrap();
        Recorder::start_on(stores.log, stores.store, None, bus.clone()).unwrap()
    }

    /// Waits for `f` (the recorder's thread answers it).
    fn wait<T>(f: impl std::future::Future<Output = T>) -> T {
        futures::executor::block_on(f)
    }

    #[test]
    fn logged_events_are_found_again_by_the_number_their_frame_took() {
        let bus = Numbering::default();
        let r = recorder(&bus);
        // A telemetry frame between events takes a number the log never sees.
        r.emit(xid(1), TimestampMs(10));
        r.emit(xid(2), TimestampMs(20));
        wait(r.flush());
        bus.next.fetch_add(1, Ordering::Relaxed);
        r.emit(xid(3), TimestampMs(30));
        let got = wait(r.resendable(0, u32::MAX, 10)).unwrap();
        let seqs: Vec<(u32, u64)> = got.frames.iter().map(|l| (l.seq, l.time.0)).collect();
        assert_eq!(seqs, [(1000, 10), (1001, 20), (1003, 30)]);
        assert_eq!(got.frames[2].message, Message::Event(xid(3)));
        assert_eq!((got.held_from, got.next), (Some(1000), None));
        let part = wait(r.resendable(1001, 1003, 1)).unwrap();
        assert_eq!(part.frames.len(), 1);
        assert_eq!((part.frames[0].seq, part.next), (1001, Some(1003)));
        let none = wait(r.resendable(1002, 1002, 10)).unwrap();
        assert!(none.frames.is_empty(), "1002 was no event");
    }

    #[test]
    fn events_emitted_before_the_bus_is_attached_go_out_once_it_is() {
        let bus = Numbering::default();
        let stores = crate::agent_flash::open(None).unwrap();
        let r = Recorder::start(stores.log, stores.store, None).unwrap();
        for n in 1..=3 {
            r.emit(xid(n), TimestampMs(u64::from(n)));
        }
        r.append(TimestampMs(4), 1, vec![1]);
        wait(r.flush());
        r.attach(bus.clone());
        wait(r.flush());
        let got = wait(r.resendable(0, u32::MAX, 10)).unwrap();
        let seqs: Vec<u32> = got.frames.iter().map(|l| l.seq).collect();
        assert_eq!(seqs, [1000, 1001, 1002], "none lost while waiting");
        assert_eq!(got.frames[2].message, Message::Event(xid(3)));
    }

    #[test]
    fn an_event_held_for_a_full_outbox_is_numbered_when_it_goes() {
        let bus = Numbering::default();
        let r = recorder(&bus);
        *bus.full.lock().unwrap() = true;
        r.emit(xid(1), TimestampMs(10));
        wait(r.flush());
        assert!(
            wait(r.resendable(0, u32::MAX, 10))
                .unwrap()
                .frames
                .is_empty(),
            "not published yet: no number a reader could miss"
        );
        *bus.full.lock().unwrap() = false;
        r.emit(xid(2), TimestampMs(20));
        wait(r.flush());
        let got = wait(r.resendable(0, u32::MAX, 10)).unwrap();
        let seqs: Vec<u32> = got.frames.iter().map(|l| l.seq).collect();
        assert_eq!(seqs, [1000, 1001], "in order, each with its own number");
        assert_eq!(got.frames[0].message, Message::Event(xid(1)));
    }

    #[test]
    fn a_published_record_round_trips_and_refuses_other_lengths() {
        let p = Published {
            record: 7,
            seq: 0xDEAD_BEEF,
        };
        assert_eq!(Published::decode(&p.encode()), Some(p));
        assert_eq!(Published::decode(&[0; 7]), None);
        assert_eq!(Published::decode(&[0; 9]), None);
    }
}
