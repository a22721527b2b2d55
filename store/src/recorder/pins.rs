//! Leases kept in the event log through its wraps. The log is a ring: an
//! XID storm (two records an XID) can recycle a lease's record within the
//! lease's life (a facility's or an operator's may hold an hour), and a
//! restart then would not find it and lift its caps. The latest lease of
//! each sender and lease id (what identifies a lease) still in force is
//! held here and logged again before the log's next wrap erases its
//! record (`EventLog::kept_by_next_wrap`): its copy is in flash before
//! the erase, so a power cut between that erase and the write after it
//! loses neither. Should the log wrap past one all the same (more leases
//! in force than the sector being written holds, or a log that erred),
//! it is logged again as soon as the log has wrapped past its record.
//!
//! Glossary:
//! - *pinned*: a lease record held to be logged again while it lasts.
//! - *recycled*: a record whose sector the log erased for room.

use std::collections::HashMap;

use loopwarden_protocol::{Frame, Message, MessageKind, NodeId, TimestampMs};

/// A lease record held to be logged again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pinned {
    /// Its number in the log.
    pub(crate) seq: u32,
    /// Its record's time (when the lease was taken).
    pub(crate) time: TimestampMs,
    /// The lease's frame, as logged.
    pub(crate) body: Vec<u8>,
    /// When the lease ends at the latest.
    until: TimestampMs,
}

/// The latest lease of each sender and lease id, while it lasts.
#[derive(Debug, Default)]
pub(crate) struct Pins(HashMap<(NodeId, u32), Pinned>);

impl Pins {
    /// Notes the record `seq` logged at `time` (of `kind`, `body`): a lease
    /// is pinned, in place of an older one of its sender and id (a lift
    /// replaces the cap it lifts).
    pub(crate) fn logged(&mut self, seq: u32, time: TimestampMs, kind: u8, body: &[u8]) {
        if kind != MessageKind::CapLease as u8 {
            return;
        }
        let Ok(frame) = Frame::decode(body) else {
            return;
        };
        let Message::CapLease(lease) = &frame.message else {
            return;
        };
        // From the later of its stamp and its taking: never shorter than
        // the host holds it.
        let until = time.max(frame.time).after(lease.duration);
        let key = (frame.sender.clone(), lease.lease);
        let newer = self.0.get(&key).is_none_or(|p| p.seq < seq);
        if newer {
            let body = body.to_vec();
            self.0.insert(
                key,
                Pinned {
                    seq,
                    time,
                    body,
                    until,
                },
            );
        }
    }

    /// The pinned records numbered below `first` (the log's oldest: those
    /// it no longer holds; or the first its next wrap keeps: those it
    /// would erase) whose lease lasts past `now`, oldest first; those that
    /// ended are let go.
    pub(crate) fn recycled(&mut self, first: u32, now: TimestampMs) -> Vec<Pinned> {
        self.0.retain(|_, p| p.until > now);
        let mut gone: Vec<Pinned> = self.0.values().filter(|p| p.seq < first).cloned().collect();
        gone.sort_by_key(|p| p.seq);
        gone
    }

    /// No lease is pinned.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many leases are pinned.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}
