//! The agent's two clocks: the wall clock for stamps, a monotonic clock
//! for every window, rate and timeout.
//!
//! A host's wall clock steps: chrony or ntpd corrects it at boot, an
//! operator sets it, a leap or a bad time source moves it by hours. A
//! window measured on it would complete at once on a step forward and
//! never on a step back. So the health engine runs on the *steady* time
//! (the wall clock read once at start, advanced by the monotonic clock
//! since), and is told how far the wall clock is from it, which it applies
//! only to the stamps it gives.
//!
//! The trait is narrow so that a test can step the wall clock under a
//! running agent ([`Stepped`]); the agent itself uses [`SystemClock`].
//!
//! Glossary:
//! - *wall*: ms since the Unix epoch, as the host's clock says now.
//! - *steady*: ms in the wall's epoch, as it was at start, plus the
//!   monotonic time since; it never steps.
//! - *offset*: wall minus steady; 0 until the wall clock steps or drifts.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use loopwarden_protocol::TimestampMs;

/// The clocks the agent reads.
pub trait Clock: Send + Sync {
    /// The wall clock, ms since the Unix epoch.
    fn wall(&self) -> TimestampMs;
    /// Monotonic time since an arbitrary start; never goes back.
    fn monotonic(&self) -> Duration;
}

/// The host's clocks.
#[derive(Debug)]
pub struct SystemClock {
    start: Instant,
}

impl SystemClock {
    /// The host's clocks, the monotonic one counted from now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn wall(&self) -> TimestampMs {
        loopwarden_bus::now_ms()
    }
    fn monotonic(&self) -> Duration {
        self.start.elapsed()
    }
}

/// The host's clocks with a wall clock a test can step.
#[derive(Debug, Clone, Default)]
pub struct Stepped {
    inner: Arc<(SystemClock, AtomicI64)>,
}

impl Stepped {
    /// The host's clocks, not yet stepped.
    pub fn new() -> Self {
        Self::default()
    }

    /// Steps the wall clock by `ms` (negative: back).
    pub fn step(&self, ms: i64) {
        self.inner.1.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for Stepped {
    fn wall(&self) -> TimestampMs {
        let TimestampMs(t) = self.inner.0.wall();
        TimestampMs(t.saturating_add_signed(self.inner.1.load(Ordering::SeqCst)))
    }
    fn monotonic(&self) -> Duration {
        self.inner.0.monotonic()
    }
}

/// Steady time from a clock: the wall clock at start, advanced by the
/// monotonic clock since.
#[derive(Clone)]
pub struct Steady {
    clock: Arc<dyn Clock>,
    /// The wall clock at monotonic 0, ms.
    anchor: i128,
}

impl Steady {
    /// Steady time on `clock`, anchored to its wall clock now.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        let anchor = i128::from(clock.wall().0) - clock.monotonic().as_millis() as i128;
        Self { clock, anchor }
    }

    /// The wall clock now.
    pub fn wall(&self) -> TimestampMs {
        self.clock.wall()
    }

    /// Steady time now.
    pub fn steady(&self) -> TimestampMs {
        let t = self.anchor + self.clock.monotonic().as_millis() as i128;
        TimestampMs(t.clamp(0, i128::from(u64::MAX)) as u64)
    }

    /// Steady time now and the wall clock's offset from it, ms.
    pub fn read(&self) -> (TimestampMs, i64) {
        let steady = self.steady();
        let wall = self.wall();
        let offset = i128::from(wall.0) - i128::from(steady.0);
        (
            steady,
            offset.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64,
        )
    }
}

impl std::fmt::Debug for Steady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steady")
            .field("anchor", &self.anchor)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_moves_the_wall_and_not_steady_time() {
        let clock = Stepped::new();
        let steady = Steady::new(Arc::new(clock.clone()));
        let (s0, off0) = steady.read();
        assert!(off0.abs() < 50, "starts together: {off0} ms");
        clock.step(3_600_000);
        let (s1, off1) = steady.read();
        assert!(
            s1.0 >= s0.0 && s1.0 - s0.0 < 1_000,
            "steady kept on: {s0:?} {s1:?}"
        );
        assert!((off1 - 3_600_000).abs() < 50, "offset {off1}");
        clock.step(-7_200_000);
        let (s2, off2) = steady.read();
        assert!(s2.0 >= s1.0, "steady never goes back");
        assert!((off2 + 3_600_000).abs() < 50, "offset {off2}");
    }
}
