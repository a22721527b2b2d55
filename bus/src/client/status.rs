//! What every handle reads and writes without asking the event loop: the
//! frame counter and the counters. Nothing else is shared between the
//! handles and the loop; all delivery state is the loop's own
//! ([`super::session`]), and the handles reach it over the channels of
//! [`super::command`] only.
//!
//! Why these two stay atomics:
//! - the frame counter: [`crate::Bus::publish`] returns the numbered frame
//!   at once, from any clone of the handle, and the loop numbers presence
//!   frames from the same counter, so numbers never repeat;
//! - the counters ([`Metrics`]): read at any time for `/metrics` and the
//!   console, and bumped where a drop is seen (a handle refusing telemetry
//!   while offline, the loop dropping what overflowed).
//!
//! Whether the bus is connected and which broker is in use are told by the
//! loop over `watch` channels ([`super::command`]), not kept here.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::metrics::Metrics;

/// The counter and the counters (see the module note).
#[derive(Debug, Default)]
pub(super) struct Status {
    seq: AtomicU32,
    /// What the bus did and dropped.
    pub(super) metrics: Metrics,
}

impl Status {
    /// A status whose first frame carries `first_seq`.
    pub(super) fn new(first_seq: u32) -> Self {
        Self {
            seq: AtomicU32::new(first_seq),
            metrics: Metrics::default(),
        }
    }

    /// Takes the next sequence number.
    pub(super) fn take_seq(&self) -> u32 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// The sequence number the next frame will carry.
    pub(super) fn next_seq(&self) -> u32 {
        self.seq.load(Ordering::Relaxed)
    }
}
