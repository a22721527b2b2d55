//! The floor a signed frame of one sender must rise above to be taken
//! ([`ReplayFloor`]): the highest sequence number and the latest stamp
//! taken from it, each kept on its own.
//!
//! A frame at or below both is a replay. A sender that lost its counter
//! numbers again from low, but its clock goes on; one whose clock stepped
//! back numbers on: each rises above one of the two, and is taken. Kept
//! apart, a frame from before a counter's restart, sent again after it,
//! is at or below both (the highest number from before, the latest stamp
//! from after) and is refused. A floor of the last frame alone, its number
//! and stamp together, would take it, then the frame after the restart
//! again, and so on for as long as they are fresh.
//!
//! Glossary:
//! - *stamp*: a frame's time ([`crate::Frame::time`]), the sender's clock.

use crate::units::TimestampMs;

/// The highest sequence number and the latest stamp taken from a sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayFloor {
    /// The highest sequence number taken.
    pub seq: u32,
    /// The latest stamp taken.
    pub time: TimestampMs,
}

impl ReplayFloor {
    /// The floor of one frame taken, numbered `seq` and stamped `time`.
    pub const fn new(seq: u32, time: TimestampMs) -> Self {
        Self { seq, time }
    }

    /// Whether a frame numbered `seq` and stamped `time` is at or below
    /// the floor on both: a replay (or a copy of the frame that set both).
    pub fn replays(&self, seq: u32, time: TimestampMs) -> bool {
        seq <= self.seq && time <= self.time
    }

    /// A frame numbered `seq` and stamped `time` was taken: the floor
    /// rises to it where it is higher, never lower.
    pub fn raise(&mut self, seq: u32, time: TimestampMs) {
        self.seq = self.seq.max(seq);
        self.time = self.time.max(time);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: TimestampMs = TimestampMs(1_800_000_000_000);

    fn at(ms: u64) -> TimestampMs {
        TimestampMs(T.0 + ms)
    }

    #[test]
    fn a_restarted_counter_or_a_clock_stepped_back_is_taken_and_a_replay_is_not() {
        let mut f = ReplayFloor::new(50, at(100));
        // The counter restarted; its clock went on.
        assert!(!f.replays(0, at(120)));
        f.raise(0, at(120));
        assert_eq!(f, ReplayFloor::new(50, at(120)));
        // The frame from before the restart, sent again, and the one
        // after it: both at or below the floor.
        assert!(f.replays(50, at(100)));
        assert!(f.replays(0, at(120)));
        // The clock stepped back; the counter went on.
        assert!(!f.replays(51, at(90)));
        f.raise(51, at(90));
        assert_eq!(f, ReplayFloor::new(51, at(120)), "never lower");
    }
}
