//! The wall clock as the gateway gives it, held from going back: each
//! `Alive` sets it, except that it never goes back more than
//! [`CLEAR_SKEW_MS`] behind the highest it was told, advanced by the
//! MCU's own clock since (less [`DRIFT_PPM`] of that, so a board clock
//! that runs fast is still brought back in the end). A gateway that held
//! a clear back for hours cannot turn the clock back to make it fresh:
//! a clear can be held back at most about twice [`CLEAR_SKEW_MS`].
//! Moving forward is taken as it comes: it only makes clears stale.
//!
//! Glossary:
//! - *high mark*: the highest wall clock told, advanced by the MCU's
//!   clock since, less the drift allowance.

use super::WallClock;
use crate::clears::CLEAR_SKEW_MS;

/// How fast the high mark may fall behind the MCU's clock, parts per
/// million: more than a board's crystal drifts (tens of ppm).
pub const DRIFT_PPM: u64 = 1_000;

/// What an `Alive`'s wall clock did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Told {
    /// Taken as told.
    Taken,
    /// Taken as told, after earlier ones were held: the gateway's clock
    /// agrees again.
    Again,
    /// Held: it went back `back_ms` behind the high mark; the clock was
    /// set `CLEAR_SKEW_MS` behind the mark instead. `first`: the first
    /// of a run of held ones.
    Held {
        /// How far behind the high mark, ms.
        back_ms: u64,
        /// The first of a run.
        first: bool,
    },
}

/// The wall clock and its high mark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wall {
    clock: Option<WallClock>,
    high: Option<WallClock>,
    held: bool,
}

impl Wall {
    /// The wall clock at `now_ms` (MCU clock), if told.
    pub fn at(&self, now_ms: u64) -> Option<u64> {
        self.clock.map(|w| w.at(now_ms))
    }

    /// The high mark at `now_ms`.
    fn high_at(&self, now_ms: u64) -> Option<u64> {
        self.high.map(|h| {
            let e = now_ms.saturating_sub(h.at_ms);
            h.unix_ms.saturating_add(e - e / (1_000_000 / DRIFT_PPM))
        })
    }

    /// The gateway told `unix_ms` at `now_ms`.
    pub fn told(&mut self, unix_ms: u64, now_ms: u64) -> Told {
        let high = self.high_at(now_ms);
        let floor = high.map_or(0, |h| h.saturating_sub(CLEAR_SKEW_MS));
        let was_held = self.held;
        self.held = unix_ms < floor;
        self.clock = Some(WallClock {
            unix_ms: unix_ms.max(floor),
            at_ms: now_ms,
        });
        self.high = Some(WallClock {
            unix_ms: high.map_or(unix_ms, |h| h.max(unix_ms)),
            at_ms: now_ms,
        });
        match (self.held, was_held) {
            (true, _) => Told::Held {
                back_ms: high.unwrap_or(0).saturating_sub(unix_ms),
                first: !was_held,
            },
            (false, true) => Told::Again,
            (false, false) => Told::Taken,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_700_000_000_000;

    #[test]
    fn the_clock_goes_forward_as_told_and_back_at_most_the_skew() {
        let mut w = Wall::default();
        assert_eq!(w.at(0), None);
        assert_eq!(w.told(T, 1_000), Told::Taken);
        assert_eq!(w.at(2_000), Some(T + 1_000));
        // Forward: as told.
        assert_eq!(w.told(T + 3_600_000, 2_000), Told::Taken);
        // Back within the skew: as told.
        assert_eq!(w.told(T + 3_600_000 - 30_000, 3_000), Told::Taken);
        assert_eq!(w.at(3_000), Some(T + 3_570_000));
        // Back an hour: held the skew behind the high mark, said once.
        let h = w.told(T, 4_000);
        assert!(
            matches!(h, Told::Held { first: true, back_ms } if back_ms > 3_600_000),
            "{h:?}"
        );
        let floor = T + 3_600_000 + 2_000 - 2 - CLEAR_SKEW_MS;
        assert_eq!(w.at(4_000), Some(floor));
        assert!(matches!(w.told(T, 5_000), Told::Held { first: false, .. }));
        // Many small steps back cannot add up past the skew.
        for s in 0..100 {
            let now = 6_000 + s * 1_000;
            let back = w.at(now).unwrap() - 50_000;
            w.told(back, now);
            let high = T + 3_600_000 + (now - 2_000) - now / 1_000;
            assert!(w.at(now).unwrap() >= high - CLEAR_SKEW_MS);
        }
        assert_eq!(w.told(T + 3_800_000, 200_000), Told::Again);
    }

    #[test]
    fn a_board_clock_running_fast_never_holds_the_gateways_clock() {
        let mut w = Wall::default();
        // The MCU's clock runs 500 ppm fast; an `Alive` every minute for
        // ten days: without the allowance its high mark would be 432 s
        // ahead of the gateway's clock by then.
        for m in 0..14_400u64 {
            let unix = T + m * 60_000;
            let mcu = m * 60_000 + m * 30;
            assert_eq!(w.told(unix, mcu), Told::Taken, "minute {m}");
            assert_eq!(w.at(mcu), Some(unix));
        }
    }
}
