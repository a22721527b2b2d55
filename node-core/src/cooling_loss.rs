//! Cooling loss: what a host does when its CDU says its rack lost cooling
//! (a leak isolated the rack, or its valve cannot reopen), and how it
//! undoes it when cooling is back.
//!
//! The order is fixed: drain at once, so the scheduler sends no new work;
//! after the grace period (running jobs checkpoint or end), power the GPUs
//! down or the host off; when the CDU says the rack has cooling again,
//! power up what was powered down, then resume. Only the CDU ends a loss:
//! a controller that falls silent leaves the host as it was (it does not
//! read silence as "cooling is back").
//!
//! Pure: the CDU's word and a time go in, the steps to run come out. The
//! agent runs each step as the configured command, logs it to flash and
//! publishes it (`cooling_action`); the phase is kept in flash, so a
//! restart in the middle of a loss still undoes it.
//!
//! Glossary:
//! - *grace*: the time between the drain and the power-down.
//! - *phase*: where the host is: cooled, draining (since when), or powered
//!   down (since when).
//! - *step*: one action ([`CoolingStep`]).

pub use loopwarden_protocol::CoolingStep;

/// Where the host is in a cooling loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    /// Cooled: nothing done.
    #[default]
    Cooled,
    /// Drained at `since` (ms), waiting for the grace period to end.
    Draining {
        /// When the drain was decided, ms.
        since: u64,
    },
    /// Powered down at `since` (ms).
    PoweredDown {
        /// When the power-down was decided, ms.
        since: u64,
    },
}

impl core::fmt::Display for Phase {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Phase::Cooled => f.write_str("cooled"),
            Phase::Draining { since } => {
                write!(
                    f,
                    "drained at {since} ms, in the grace before the power-down"
                )
            }
            Phase::PoweredDown { since } => write!(f, "powered down at {since} ms"),
        }
    }
}

/// The cooling-loss decisions of one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoolingLoss {
    grace_ms: u64,
    phase: Phase,
}

impl CoolingLoss {
    /// Cooled, with a grace period of `grace_ms` between the drain and the
    /// power-down.
    pub fn new(grace_ms: u64) -> Self {
        Self {
            grace_ms,
            phase: Phase::Cooled,
        }
    }

    /// Puts back the phase kept from before a restart.
    pub fn restore(&mut self, phase: Phase) {
        self.phase = phase;
    }

    /// The phase now.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The CDU said at `t` (ms) whether this host's rack has lost cooling.
    pub fn told(&mut self, t: u64, lost: bool) -> Vec<CoolingStep> {
        match (self.phase, lost) {
            (Phase::Cooled, true) => {
                self.phase = Phase::Draining { since: t };
                let mut steps = vec![CoolingStep::Drain];
                steps.extend(self.tick(t));
                steps
            }
            (Phase::Draining { .. }, false) => {
                self.phase = Phase::Cooled;
                vec![CoolingStep::Resume]
            }
            (Phase::PoweredDown { .. }, false) => {
                self.phase = Phase::Cooled;
                vec![CoolingStep::PowerUp, CoolingStep::Resume]
            }
            _ => self.tick(t),
        }
    }

    /// Time passed: at `t` (ms) the grace period may be over.
    pub fn tick(&mut self, t: u64) -> Vec<CoolingStep> {
        match self.phase {
            Phase::Draining { since } if t.saturating_sub(since) >= self.grace_ms => {
                self.phase = Phase::PoweredDown { since: t };
                vec![CoolingStep::PowerDown]
            }
            _ => Vec::new(),
        }
    }

    /// When the next step falls due without news from the CDU (ms).
    pub fn next_due(&self) -> Option<u64> {
        match self.phase {
            Phase::Draining { since } => Some(since.saturating_add(self.grace_ms)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CoolingStep::*;

    #[test]
    fn drain_at_once_power_down_after_the_grace_undo_in_reverse() {
        let mut c = CoolingLoss::new(30_000);
        assert_eq!(c.told(1_000, false), vec![], "cooled and told so");
        assert_eq!(c.told(2_000, true), vec![Drain]);
        assert_eq!(c.told(3_000, true), vec![], "told again: nothing new");
        assert_eq!(c.next_due(), Some(32_000));
        assert_eq!(c.tick(31_999), vec![]);
        assert_eq!(c.tick(32_000), vec![PowerDown]);
        assert_eq!(c.tick(90_000), vec![], "once");
        assert_eq!(c.phase(), Phase::PoweredDown { since: 32_000 });
        assert_eq!(c.told(100_000, false), vec![PowerUp, Resume]);
        assert_eq!(c.phase(), Phase::Cooled);
        assert_eq!(c.next_due(), None);
    }

    #[test]
    fn cooling_back_within_the_grace_only_resumes() {
        let mut c = CoolingLoss::new(30_000);
        assert_eq!(c.told(0, true), vec![Drain]);
        assert_eq!(c.told(10_000, false), vec![Resume]);
        assert_eq!(c.tick(60_000), vec![], "no power-down after the return");
        assert_eq!(c.told(70_000, true), vec![Drain], "a second loss");
    }

    #[test]
    fn no_grace_powers_down_with_the_drain() {
        let mut c = CoolingLoss::new(0);
        assert_eq!(c.told(5, true), vec![Drain, PowerDown]);
    }

    #[test]
    fn a_restart_in_a_loss_still_undoes_it_and_waits_for_the_cdu() {
        let mut c = CoolingLoss::new(30_000);
        c.restore(Phase::Draining { since: 1_000 });
        assert_eq!(
            c.tick(40_000),
            vec![PowerDown],
            "the grace ran across the restart"
        );
        let mut c = CoolingLoss::new(30_000);
        c.restore(Phase::PoweredDown { since: 1_000 });
        assert_eq!(c.tick(1_000_000), vec![], "silence is not cooling");
        assert_eq!(c.told(1_000_001, false), vec![PowerUp, Resume]);
    }
}
