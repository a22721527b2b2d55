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
//! A restart also gives back the steps handed out and not known done
//! ([`CoolingLoss::restore`]); at the start ([`CoolingLoss::resume`]) a
//! drain, a power-up and a resume run again at once, each harmless twice
//! (the shell runs a kept resume again at one start only, and drops it if
//! it fails then: a scheduler refuses to resume a node already back in
//! service, and a resume run at every start would lift a drain made
//! since).
//! A power-down is held: a host-off command that cut the host before its
//! outcome was kept must not switch it off again at every start once
//! cooling is back. It runs once the CDU's first state taken after the
//! start leaves the host powered down ([`CoolingLoss::word_taken`]), or at
//! the first round at or after the wait ([`CoolingLoss::held_due`]:
//! silence is not cooling); it is dropped when that state says cooling is
//! back. All on the time passed in, so a restart replays.
//!
//! A phase that could not be read back is *unknown*
//! ([`CoolingLoss::restore_unknown`]): nothing is done, whatever the
//! time, until the CDU's first word on the rack: lost, the host drains
//! now and powers down after the grace, as from cooled; cooling, it
//! powers up and resumes, undoing whatever a loss before the restart may
//! have done (both harmless twice). A host that was simply cooled is
//! never drained, nor powered down, on a record it cannot read.
//!
//! Glossary:
//! - *grace*: the time between the drain and the power-down.
//! - *phase*: where the host is: cooled, draining (since when), or powered
//!   down (since when).
//! - *step*: one action ([`CoolingStep`]).
//! - *kept pending*: a step handed out before a restart and not known
//!   done (the shell keeps them in flash with the phase).
//! - *held*: a power-down kept pending, waiting for the CDU's word until
//!   the end of the *wait* (`max(`[`HELD_WAIT_MS`]`, grace)` after the
//!   start) at most.

pub use loopwarden_protocol::CoolingStep;

/// How long a power-down held from before a restart waits for the CDU's
/// word at least, ms (the grace, if longer): its retained state comes
/// within a second of the connection. A host switched off by a
/// power-down whose outcome was not kept, started again once cooling is
/// back, is switched off again only if no state is taken within this.
pub const HELD_WAIT_MS: u64 = 5_000;

/// What becomes of a step kept pending from before a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Again {
    /// It runs again now.
    Run(CoolingStep),
    /// The power-down waits for the CDU's word, until `until_ms` at most.
    Held {
        /// When the wait is over (the node's steady clock), ms.
        until_ms: u64,
        /// It was kept pending from before the restart; `false`: it was
        /// done, and the host runs again in the phase "powered down"
        /// (someone powered it on while the rack had no cooling).
        kept: bool,
    },
    /// The grace's power-down (drained before the restart) is not decided
    /// before the CDU's word, until `until_ms` at most: the grace may have
    /// run out while the host was down, and cooling come back meanwhile.
    GraceHeld {
        /// When the wait is over (the node's steady clock), ms.
        until_ms: u64,
    },
    /// It is not run, and is pending no more: a power-down with the host
    /// no longer powered down (undone already, or the CDU said cooling is
    /// back while it was held).
    Dropped(CoolingStep),
}

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
    /// The steps kept pending from before a restart, until the start.
    kept: Vec<CoolingStep>,
    /// The held power-down's end of wait, ms.
    held_until_ms: Option<u64>,
    /// Drained before the restart: the grace's power-down waits for the
    /// CDU's word until then at most, ms.
    grace_held_until_ms: Option<u64>,
    /// The phase kept could not be read back: the CDU's first word on
    /// the rack decides ([`CoolingLoss::restore_unknown`]).
    unknown: bool,
}

impl CoolingLoss {
    /// Cooled, with a grace period of `grace_ms` between the drain and the
    /// power-down.
    pub fn new(grace_ms: u64) -> Self {
        Self {
            grace_ms,
            phase: Phase::Cooled,
            kept: Vec::new(),
            held_until_ms: None,
            grace_held_until_ms: None,
            unknown: false,
        }
    }

    /// Puts back the phase and the steps kept pending from before a
    /// restart (each once, in order), to be decided at the start
    /// ([`CoolingLoss::resume`]).
    pub fn restore(&mut self, phase: Phase, pending: &[CoolingStep]) {
        self.phase = phase;
        self.unknown = false;
        self.kept.clear();
        for &step in pending {
            if !self.kept.contains(&step) {
                self.kept.push(step);
            }
        }
    }

    /// The phase kept before a restart could not be read back (see the
    /// module note): cooled, nothing pending, nothing held; silence does
    /// nothing, and the CDU's first word on the rack decides
    /// ([`CoolingLoss::told`]).
    pub fn restore_unknown(&mut self) {
        self.restore(Phase::Cooled, &[]);
        self.unknown = true;
    }

    /// The phase kept before the restart could not be read back and the
    /// CDU has not said yet whether the rack has cooling.
    pub fn is_unknown(&self) -> bool {
        self.unknown
    }

    /// The start, at `t_ms`: what becomes of each step kept pending, in
    /// order. A drain, a power-up and a resume run again; a power-down is
    /// dropped if the host is no longer powered down (nothing to power
    /// down). In the phase "powered down" a power-down is held, last,
    /// whether kept pending or done: a host running again while its rack
    /// has no cooling (powered on by an operator or by its BMC) is
    /// powered down again unless the CDU says cooling is back.
    pub fn resume(&mut self, t_ms: u64) -> Vec<Again> {
        let kept = std::mem::take(&mut self.kept);
        let powered_down = matches!(self.phase, Phase::PoweredDown { .. });
        let mut again = Vec::new();
        let mut power_down_kept = false;
        for step in kept {
            match step {
                CoolingStep::PowerDown if powered_down => power_down_kept = true,
                CoolingStep::PowerDown => again.push(Again::Dropped(step)),
                _ => again.push(Again::Run(step)),
            }
        }
        let until_ms = t_ms.saturating_add(self.held_wait_ms());
        match self.phase {
            Phase::PoweredDown { .. } => {
                self.held_until_ms = Some(until_ms);
                again.push(Again::Held {
                    until_ms,
                    kept: power_down_kept,
                });
            }
            Phase::Draining { .. } => {
                self.grace_held_until_ms = Some(until_ms);
                again.push(Again::GraceHeld { until_ms });
            }
            Phase::Cooled => {}
        }
        again
    }

    /// At the start, at `t_ms`: a phase kept with a stamp after `t_ms`
    /// (the clock was ahead when it was kept, or is behind now, as a host
    /// booted before its time is synchronised) is stamped `t_ms`, so the
    /// grace runs out one grace from now at the latest, never waits for a
    /// time to come. Returns the stamp it had.
    pub fn restamp_ahead(&mut self, t_ms: u64) -> Option<u64> {
        let since = match &mut self.phase {
            Phase::Draining { since } | Phase::PoweredDown { since } if *since > t_ms => since,
            _ => return None,
        };
        Some(core::mem::replace(since, t_ms))
    }

    /// How long a held power-down waits for the CDU's word, ms.
    pub fn held_wait_ms(&self) -> u64 {
        HELD_WAIT_MS.max(self.grace_ms)
    }

    /// When the held power-down's wait is over, ms; `None`: none held.
    pub fn held_until_ms(&self) -> Option<u64> {
        self.held_until_ms
    }

    /// A state of the CDU was taken (after [`CoolingLoss::told`], or one
    /// that does not list the rack): the held power-down runs if the host
    /// is still powered down, else it is dropped. `None`: none held.
    pub fn word_taken(&mut self) -> Option<Again> {
        // The grace's power-down is decided by the next round's tick.
        self.grace_held_until_ms = None;
        self.held_until_ms.take()?;
        Some(self.held_decided())
    }

    /// A round at `t_ms`: the held power-down whose wait is over runs
    /// (silence is not cooling). `None`: none held, or still waiting.
    pub fn held_due(&mut self, t_ms: u64) -> Option<Again> {
        if self.grace_held_until_ms.is_some_and(|until| until <= t_ms) {
            self.grace_held_until_ms = None;
        }
        if self.held_until_ms? > t_ms {
            return None;
        }
        self.held_until_ms = None;
        Some(self.held_decided())
    }

    /// The held power-down, decided now: run while powered down.
    fn held_decided(&self) -> Again {
        match self.phase {
            Phase::PoweredDown { .. } => Again::Run(CoolingStep::PowerDown),
            _ => Again::Dropped(CoolingStep::PowerDown),
        }
    }

    /// The phase now.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The CDU said at `t` (ms) whether this host's rack has lost cooling
    /// (the phase unknown: its first word that cooling is there powers up
    /// and resumes).
    pub fn told(&mut self, t: u64, lost: bool) -> Vec<CoolingStep> {
        if core::mem::take(&mut self.unknown) && !lost {
            self.phase = Phase::Cooled;
            return vec![CoolingStep::PowerUp, CoolingStep::Resume];
        }
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

    /// Time passed: at `t` (ms) the grace period may be over (not decided
    /// while the grace's power-down waits for the CDU's word).
    pub fn tick(&mut self, t: u64) -> Vec<CoolingStep> {
        if self.grace_held_until_ms.is_some() {
            return Vec::new();
        }
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
            Phase::Draining { since } => Some(
                since
                    .saturating_add(self.grace_ms)
                    .max(self.grace_held_until_ms.unwrap_or(0)),
            ),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CoolingStep::*;

    /// A phase unknown at the start: silence past the wait and the grace
    /// does nothing; the CDU's word that the rack is lost drains now and
    /// powers down after the grace, as from cooled.
    #[test]
    fn an_unknown_phase_waits_for_the_cdu_and_a_loss_runs_from_cooled() {
        let grace = 30_000;
        let mut c = CoolingLoss::new(grace);
        c.restore_unknown();
        assert_eq!(c.resume(1_000), vec![], "nothing run or held at the start");
        assert_eq!(c.phase(), Phase::Cooled);
        assert!(c.is_unknown());
        let late = 1_000 + HELD_WAIT_MS.max(grace) + 60_000;
        assert_eq!(c.held_due(late), None);
        assert_eq!(c.tick(late), vec![]);
        assert_eq!(c.word_taken(), None, "a state not naming the rack");
        assert_eq!(c.next_due(), None);
        assert!(c.is_unknown(), "only a word on the rack decides");
        assert_eq!(c.told(late, true), vec![Drain]);
        assert!(!c.is_unknown());
        assert_eq!(c.tick(late + grace - 1), vec![]);
        assert_eq!(c.tick(late + grace), vec![PowerDown]);
        // Only the first word is special: cooling back now undoes as ever.
        assert_eq!(c.told(late + grace + 1, false), vec![PowerUp, Resume]);
        assert_eq!(c.told(late + grace + 2, false), vec![]);
    }

    /// A phase unknown at the start, the CDU's first word that the rack
    /// has cooling: power-up and resume (whatever a loss before the
    /// restart may have done is undone), once; later words as ever.
    #[test]
    fn an_unknown_phase_told_cooled_powers_up_and_resumes_once() {
        let mut c = CoolingLoss::new(30_000);
        c.restore_unknown();
        assert_eq!(c.resume(0), vec![]);
        assert_eq!(c.told(2_000, false), vec![PowerUp, Resume]);
        assert_eq!(c.phase(), Phase::Cooled);
        assert!(!c.is_unknown());
        assert_eq!(c.told(3_000, false), vec![], "only the first word");
        assert_eq!(c.told(4_000, true), vec![Drain]);
        // A phase read back afterwards is no longer unknown.
        c.restore_unknown();
        c.restore(Phase::Cooled, &[]);
        assert_eq!(c.told(5_000, false), vec![]);
    }

    #[test]
    fn a_phase_stamped_after_the_start_counts_its_grace_from_the_start() {
        let mut c = CoolingLoss::new(30_000);
        c.restore(Phase::Draining { since: 900_000 }, &[Drain]);
        assert_eq!(c.restamp_ahead(100_000), Some(900_000));
        assert_eq!(c.phase(), Phase::Draining { since: 100_000 });
        assert_eq!(c.tick(129_999), vec![]);
        assert_eq!(
            c.tick(130_000),
            vec![PowerDown],
            "one grace after the start"
        );
        // A stamp at or before the start is kept as it is.
        c.restore(Phase::PoweredDown { since: 5 }, &[]);
        assert_eq!(c.restamp_ahead(100_000), None);
        assert_eq!(c.phase(), Phase::PoweredDown { since: 5 });
        c.restore(Phase::Cooled, &[]);
        assert_eq!(c.restamp_ahead(0), None);
    }

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
        c.restore(Phase::Draining { since: 1_000 }, &[]);
        assert_eq!(
            c.tick(40_000),
            vec![PowerDown],
            "the grace ran across the restart"
        );
        let mut c = CoolingLoss::new(30_000);
        c.restore(Phase::PoweredDown { since: 1_000 }, &[]);
        assert_eq!(c.tick(1_000_000), vec![], "silence is not cooling");
        assert_eq!(c.told(1_000_001, false), vec![PowerUp, Resume]);
    }

    #[test]
    fn a_restart_runs_the_kept_steps_again_and_holds_the_power_down() {
        let mut c = CoolingLoss::new(30_000);
        c.restore(Phase::PoweredDown { since: 1_000 }, &[Drain, PowerDown]);
        assert_eq!(
            c.resume(100_000),
            vec![
                Again::Run(Drain),
                Again::Held {
                    until_ms: 130_000,
                    kept: true
                }
            ],
            "the wait is the grace, longer than 5 s"
        );
        assert_eq!(c.held_due(129_999), None);
        assert_eq!(c.held_due(130_000), Some(Again::Run(PowerDown)));
        assert_eq!(c.held_due(200_000), None, "once");
        assert_eq!(c.word_taken(), None, "no longer held");
    }

    #[test]
    fn the_cdus_first_word_decides_the_held_power_down() {
        let held = || {
            let mut c = CoolingLoss::new(0);
            c.restore(Phase::PoweredDown { since: 1_000 }, &[PowerDown]);
            assert_eq!(
                c.resume(50_000),
                vec![Again::Held {
                    until_ms: 55_000,
                    kept: true
                }]
            );
            c
        };
        let mut c = held();
        assert_eq!(c.told(51_000, true), vec![]);
        assert_eq!(c.word_taken(), Some(Again::Run(PowerDown)), "still lost");
        let mut c = held();
        assert_eq!(
            c.tick(51_000),
            vec![],
            "a state that does not list the rack"
        );
        assert_eq!(c.word_taken(), Some(Again::Run(PowerDown)), "still down");
        let mut c = held();
        assert_eq!(c.told(51_000, false), vec![PowerUp, Resume]);
        assert_eq!(c.word_taken(), Some(Again::Dropped(PowerDown)));
        assert_eq!(c.held_due(90_000), None, "dropped: never runs later");
        // The word comes after the wait, before any round: it decides.
        let mut c = held();
        assert_eq!(c.told(60_000, false), vec![PowerUp, Resume]);
        assert_eq!(c.word_taken(), Some(Again::Dropped(PowerDown)));
    }

    #[test]
    fn a_host_running_again_in_the_phase_powered_down_is_powered_down_again_unless_cooled() {
        // Powered down, the outcome kept; then powered on by someone
        // while the rack still has no cooling.
        let start = || {
            let mut c = CoolingLoss::new(30_000);
            c.restore(Phase::PoweredDown { since: 1_000 }, &[]);
            let held = Again::Held {
                until_ms: 130_000,
                kept: false,
            };
            assert_eq!(c.resume(100_000), vec![held]);
            c
        };
        let mut c = start();
        assert_eq!(c.told(101_000, true), vec![]);
        assert_eq!(c.word_taken(), Some(Again::Run(PowerDown)), "still lost");
        let mut c = start();
        assert_eq!(c.held_due(130_000), Some(Again::Run(PowerDown)), "silence");
        let mut c = start();
        assert_eq!(c.told(101_000, false), vec![PowerUp, Resume]);
        assert_eq!(c.word_taken(), Some(Again::Dropped(PowerDown)), "cooled");
        // Cooled: nothing held.
        let mut c = CoolingLoss::new(30_000);
        c.restore(Phase::Cooled, &[]);
        assert_eq!(c.resume(100_000), vec![]);
        assert_eq!(c.held_until_ms(), None);
    }

    #[test]
    fn a_grace_that_ran_out_while_the_host_was_down_waits_for_the_cdus_word() {
        // Drained at 1 s, grace 30 s; the host starts again at 100 s.
        let start = || {
            let mut c = CoolingLoss::new(30_000);
            c.restore(Phase::Draining { since: 1_000 }, &[]);
            let held = Again::GraceHeld { until_ms: 130_000 };
            assert_eq!(c.resume(100_000), vec![held]);
            assert_eq!(c.tick(100_001), vec![], "not at the first round");
            c
        };
        // Cooling came back meanwhile: resumed, never powered down.
        let mut c = start();
        assert_eq!(c.told(101_000, false), vec![Resume]);
        assert_eq!(c.word_taken(), None);
        assert_eq!(c.tick(102_000), vec![]);
        // Still lost: the power-down at the next round.
        let mut c = start();
        assert_eq!(c.told(101_000, true), vec![]);
        assert_eq!(c.word_taken(), None);
        assert_eq!(c.tick(101_500), vec![PowerDown]);
        // No word: silence is not cooling, the power-down after the wait.
        let mut c = start();
        assert_eq!(c.next_due(), Some(130_000));
        assert_eq!(c.held_due(129_999), None);
        assert_eq!(c.tick(129_999), vec![]);
        assert_eq!(c.held_due(130_000), None);
        assert_eq!(c.tick(130_000), vec![PowerDown]);
    }

    #[test]
    fn a_power_down_kept_with_the_host_not_powered_down_is_dropped() {
        let mut c = CoolingLoss::new(30_000);
        c.restore(Phase::Cooled, &[PowerDown, Resume, Resume]);
        assert_eq!(
            c.resume(0),
            vec![Again::Dropped(PowerDown), Again::Run(Resume)],
            "each kept step once"
        );
        assert_eq!(c.held_until_ms(), None);
        assert_eq!(c.held_due(u64::MAX), None);
    }

    #[test]
    fn the_held_wait_is_five_seconds_or_the_grace_if_longer() {
        assert_eq!(CoolingLoss::new(0).held_wait_ms(), HELD_WAIT_MS);
        assert_eq!(CoolingLoss::new(4_000).held_wait_ms(), 5_000);
        assert_eq!(CoolingLoss::new(30_000).held_wait_ms(), 30_000);
        let mut c = CoolingLoss::new(0);
        c.restore(Phase::PoweredDown { since: 0 }, &[PowerDown]);
        assert_eq!(
            c.resume(u64::MAX - 1),
            vec![Again::Held {
                until_ms: u64::MAX,
                kept: true
            }]
        );
    }
}
