//! Sequence numbers as a subscriber hears them: which numbers of a sender
//! it missed, and which of those it can tell the sender spent without
//! publishing a frame.
//!
//! A sender numbers every frame it builds from one counter ([`Frame::seq`]),
//! so a number a subscriber never hears is either a frame it lost or one
//! the sender built and did not publish on the frame tree. The second kind
//! is not a loss. A subscriber tells them apart with these rules (the
//! protocol's; `docs/bus.md` section 4.7 says them for operators):
//!
//! 1. **A connection's will.** Each connection's `online: true`
//!    announcement is numbered `s` and its last will (`online: false`)
//!    `s + 1`. The broker publishes the will only when the connection is
//!    lost; after a clean goodbye, or a broker node that died with it, it
//!    never comes. So `s + 1` after a heard announcement `s` is not a
//!    loss: [`SeqTrack::unexplained`] leaves it out. An attempt refused
//!    before its CONNECT, or by the broker, spends no number (the next
//!    attempt takes the same pair); any other failed attempt spends a pair
//!    no frame carries, since the broker may still publish its will.
//! 2. **What the sender dropped itself.** Telemetry built while the broker
//!    was away, or with its queue full (QoS 0, renewed by the next
//!    sample): a host counts these in its telemetry (`drops.bus`), and both
//!    agents in `ctl status` and on `/metrics`. A subscriber takes that
//!    count off the holes it sees from that sender.
//! 3. **A presence connection renumbered.** With `json_presence`, a
//!    presence connection that lost its own connection while the main one
//!    stayed up announces again on the JSON tree only, with a fresh pair
//!    (two numbers no frame-tree subscriber hears; `presence_renumbered`
//!    on the sender's metrics).
//! 4. **A restart.** A new process (a new `started` in its announcement)
//!    numbers from above what it reserved in flash before: the numbers
//!    between the last frame of the old process and the first of the new
//!    were never used, except frames the old one lost as it died.
//!
//! What is left is lost on the way, and a subscriber can ask the sender
//! for it again.
//!
//! Glossary:
//! - *hole*: a number between the lowest and highest heard from a sender
//!   that was not heard.
//! - *explained*: a hole that rule 1 accounts for from what was heard.

use std::collections::BTreeSet;

use crate::frame::{Frame, Message};

/// Holes listed one by one at most; a jump past it (a restart's
/// reservation, a sender seen after a long time) is counted, not listed.
pub const HOLES_LISTED: u64 = 100_000;

/// One sender's sequence numbers as heard.
#[derive(Debug, Clone, Default)]
pub struct SeqTrack {
    /// Lowest and highest heard.
    range: Option<(u32, u32)>,
    /// Missing between them.
    holes: BTreeSet<u32>,
    /// Missing but not listed (a jump past [`HOLES_LISTED`]).
    unlisted: u64,
    /// The numbers of wills of announcements heard (rule 1).
    wills: BTreeSet<u32>,
    /// Frames heard again.
    duplicates: u64,
}

impl SeqTrack {
    /// Notes `frame` (from this track's sender); false when its number
    /// was heard before.
    pub fn hear(&mut self, frame: &Frame) -> bool {
        if let Message::Online(o) = &frame.message {
            if o.online {
                if let Some(will) = frame.seq.checked_add(1) {
                    self.wills.insert(will);
                }
            }
        }
        self.hear_seq(frame.seq)
    }

    /// Notes a number alone (a frame whose kind says nothing of others).
    pub fn hear_seq(&mut self, seq: u32) -> bool {
        let Some((lo, hi)) = self.range else {
            self.range = Some((seq, seq));
            return true;
        };
        if seq > hi {
            self.missing(hi + 1, seq);
            self.range = Some((lo, seq));
        } else if seq < lo {
            self.missing(seq + 1, lo);
            self.range = Some((seq, hi));
        } else if !self.holes.remove(&seq) {
            self.duplicates += 1;
            return false;
        }
        true
    }

    fn missing(&mut self, from: u32, until: u32) {
        let n = u64::from(until - from);
        if n > HOLES_LISTED {
            self.unlisted += n;
        } else {
            self.holes.extend(from..until);
        }
    }

    /// Whether `seq` is a listed hole: missing between the lowest and
    /// highest heard.
    pub fn is_hole(&self, seq: u32) -> bool {
        self.holes.contains(&seq)
    }

    /// The lowest and highest numbers heard.
    pub fn range(&self) -> Option<(u32, u32)> {
        self.range
    }

    /// The highest number heard.
    pub fn highest(&self) -> Option<u32> {
        self.range.map(|(_, hi)| hi)
    }

    /// Numbers missing between the lowest and highest heard.
    pub fn holes(&self) -> u64 {
        self.holes.len() as u64 + self.unlisted
    }

    /// Holes that the rule of wills (1) does not account for: lost
    /// frames, and numbers the sender spent as rules 2 to 4 say.
    pub fn unexplained(&self) -> u64 {
        self.holes() - self.holes.iter().filter(|s| self.wills.contains(s)).count() as u64
    }

    /// The listed holes that rule 1 does not account for, lowest first.
    pub fn unexplained_holes(&self) -> impl Iterator<Item = u32> + '_ {
        self.holes
            .iter()
            .copied()
            .filter(|s| !self.wills.contains(s))
    }

    /// Frames heard more than once.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::MessageKind;
    use crate::samples;

    fn frame(kind: MessageKind, seq: u32, online: bool) -> Frame {
        let mut f = samples::frame(kind);
        f.seq = seq;
        if let Message::Online(o) = &mut f.message {
            o.online = online;
        }
        f
    }

    #[test]
    fn holes_are_counted_and_duplicates_told() {
        let mut t = SeqTrack::default();
        assert!(t.hear_seq(10));
        assert!(t.hear_seq(13));
        assert_eq!(t.holes(), 2);
        assert!(t.hear_seq(11));
        assert!(!t.hear_seq(11));
        assert_eq!((t.holes(), t.duplicates()), (1, 1));
        assert!(t.hear_seq(8));
        assert_eq!(t.holes(), 2, "9 and 12");
        assert_eq!(t.range(), Some((8, 13)));
        t.hear_seq(13 + 2 * HOLES_LISTED as u32);
        assert_eq!(t.holes(), 2 + 2 * HOLES_LISTED - 1, "counted, not listed");
    }

    #[test]
    fn the_will_after_a_heard_announcement_is_not_a_loss() {
        let mut t = SeqTrack::default();
        // A connection announced at 100 (its will 101), telemetry, a lost
        // connection whose will came (105) and the next announcement at
        // 106 (will 107) with frames after it; 103 was lost.
        t.hear(&frame(MessageKind::Online, 100, true));
        t.hear(&frame(MessageKind::HostTelemetry, 102, false));
        t.hear(&frame(MessageKind::HostTelemetry, 104, false));
        t.hear(&frame(MessageKind::Online, 105, false));
        t.hear(&frame(MessageKind::Online, 106, true));
        t.hear(&frame(MessageKind::Event, 108, false));
        assert_eq!(t.holes(), 3, "101, 103, 107");
        assert_eq!(t.unexplained(), 1);
        assert_eq!(t.unexplained_holes().collect::<std::vec::Vec<_>>(), [103]);
        // A goodbye (online: false) explains nothing after it.
        t.hear(&frame(MessageKind::Online, 110, false));
        assert_eq!(
            t.unexplained_holes().collect::<std::vec::Vec<_>>(),
            [103, 109]
        );
    }
}
