//! The cooling-loss part of the node's step: the steps
//! [`CoolingLoss`](crate::cooling_loss::CoolingLoss) decides, handed to the
//! shell with the phase to keep in flash first; and after a restart, the
//! steps kept pending from before it: run again at the start, dropped, or
//! (a power-down) held until the CDU's first taken state or the end of the
//! wait, on the node's clock, so a restart replays like every other input.
//!
//! Glossary:
//! - *kept pending*: a step handed out before a restart and not known done
//!   ([`Node::restore_cooling`]).
//! - *held*: a kept power-down waiting for the CDU's word.
//! - *dropped*: a kept step not run, pending no more
//!   ([`Effect::DropCooling`]).

use loopwarden_protocol::{CoolingStep, TimestampMs};

use super::{Effect, Level, Node, Now};
use crate::cooling_loss::{Again, Phase};

impl Node {
    /// The cooling-loss phase and the steps kept pending from before a
    /// restart (the flash's): the steps are decided at [`Input::Start`]
    /// (see the module note).
    ///
    /// [`Input::Start`]: super::Input::Start
    pub fn restore_cooling(&mut self, phase: Phase, pending: &[CoolingStep]) {
        self.cooling.restore(phase, pending);
    }

    /// The cooling-loss phase kept before a restart could not be read
    /// back: nothing is run, whatever the time, until the CDU's first word
    /// on the rack: lost, the host drains now and powers down after the
    /// grace; cooling, it powers up and resumes (undoing whatever a loss
    /// before the restart may have done). Each said.
    pub fn restore_cooling_unknown(&mut self) {
        self.cooling.restore_unknown();
    }

    /// The CDU's word on the rack (`lost`) taken with the phase unknown:
    /// what it decides, said.
    pub(super) fn say_unknown_decided(&self, lost: bool, out: &mut Vec<Effect>) {
        if !self.cooling.is_unknown() {
            return;
        }
        let (_, rack) = self.cdu_and_rack();
        let what = match lost {
            true => "says the rack has no cooling: drained now, powered down after the grace",
            false => {
                "says the rack has cooling: powered up and resumed, undoing whatever a loss \
                 before the restart may have done"
            }
        };
        let why = format!(
            "rack {rack}: the cooling-loss phase kept before the restart was not readable; \
             the CDU {what}"
        );
        out.push(Effect::Say(Level::Warn, why));
    }

    /// When the power-down held from before the restart runs without the
    /// CDU's word (steady time, ms), if one is held.
    pub fn cooling_held_until_ms(&self) -> Option<u64> {
        self.cooling.held_until_ms()
    }

    /// At the start: each step kept pending runs again, is held or is
    /// dropped, each said.
    pub(super) fn resume_cooling(&mut self, now: Now, out: &mut Vec<Effect>) {
        let (cdu, rack) = self.cdu_and_rack();
        if let Some(stamp) = self.cooling.restamp_ahead(now.steady.0) {
            let why = format!(
                "rack {rack}: the cooling-loss phase kept before the restart is stamped {}, \
                 after this start ({}): the clock was ahead then or is behind now; \
                 its grace counts from now",
                crate::health::fmt_time(TimestampMs(stamp)),
                crate::health::fmt_time(now.steady)
            );
            out.push(Effect::Say(Level::Warn, why));
        }
        let mut again = Vec::new();
        for decided in self.cooling.resume(now.steady.0) {
            let step = match decided {
                Again::Run(step) => step,
                Again::Held { until_ms, kept } => {
                    say_held(&rack, until_ms.saturating_sub(now.steady.0), kept, out);
                    continue;
                }
                Again::GraceHeld { until_ms } => {
                    let why = format!(
                        "rack {rack}: drained before the restart: the power-down after the grace \
                         waits for the CDU's word that the rack still has no cooling, {} s at most",
                        until_ms.saturating_sub(now.steady.0) / 1_000
                    );
                    out.push(Effect::Say(Level::Warn, why));
                    continue;
                }
                Again::Dropped(step) => {
                    let why = format!(
                        "rack {rack}: cooling-loss {step} not known done before the restart: \
                         not run, the host is not powered down"
                    );
                    out.push(Effect::Say(Level::Info, why));
                    out.push(Effect::DropCooling(step));
                    continue;
                }
            };
            let why = format!(
                "rack {rack}: cooling-loss {step} not known done before the restart: run again"
            );
            out.push(Effect::Say(Level::Warn, why));
            again.push((step, again_reason(&cdu, &rack, step)));
        }
        self.keep_and_run(now, again, out);
    }

    /// A state of the CDU was taken (the loss told first): the held
    /// power-down runs if the rack is still powered down, else is dropped.
    pub(super) fn cooling_word_taken(&mut self, now: Now, out: &mut Vec<Effect>) {
        let decided = self.cooling.word_taken();
        let ran = "the CDU still says the rack has no cooling: cooling-loss power-down run again";
        let dropped = "the CDU says the rack has cooling again: \
                       the power-down held at the start is not run";
        self.held_decided(now, decided, ran, dropped, out);
    }

    /// A round: the held power-down whose wait is over runs (silence is
    /// not cooling); then the grace may be over.
    pub(super) fn cooling_round(&mut self, now: Now, out: &mut Vec<Effect>) {
        let decided = self.cooling.held_due(now.steady.0);
        let ran = "no word from the CDU since the start: cooling-loss power-down run again";
        let dropped = "the host is no longer powered down: \
                       the power-down held at the start is not run";
        self.held_decided(now, decided, ran, dropped, out);
        let steps = self.cooling.tick(now.steady.0);
        self.run_cooling(now, steps, out);
    }

    /// The held power-down decided (`None`: none was, or still waits):
    /// run again, or dropped; said either way.
    fn held_decided(
        &mut self,
        now: Now,
        decided: Option<Again>,
        ran: &str,
        dropped: &str,
        out: &mut Vec<Effect>,
    ) {
        match decided {
            Some(Again::Run(step)) => {
                out.push(Effect::Say(Level::Warn, ran.to_string()));
                let (cdu, rack) = self.cdu_and_rack();
                let reason = again_reason(&cdu, &rack, step);
                self.keep_and_run(now, vec![(step, reason)], out);
            }
            Some(Again::Dropped(step)) => {
                out.push(Effect::Say(Level::Info, dropped.to_string()));
                out.push(Effect::DropCooling(step));
            }
            Some(Again::Held { .. } | Again::GraceHeld { .. }) | None => {}
        }
    }

    /// Hands cooling-loss `steps`, decided now, to the shell (see
    /// [`Node::keep_and_run`]), each with the loss as its reason.
    pub(super) fn run_cooling(&mut self, now: Now, steps: Vec<CoolingStep>, out: &mut Vec<Effect>) {
        let (cdu, rack) = self.cdu_and_rack();
        let reason = format!(
            "cooling-lost: rack {rack} of {cdu} lost cooling at {}",
            crate::health::fmt_time(now.wall())
        );
        let steps = steps.into_iter().map(|s| (s, reason.clone())).collect();
        self.keep_and_run(now, steps, out);
    }

    /// Hands `steps` (each with its reason) to the shell: the phase kept
    /// in flash first (its stamps on the wall clock), then each step's
    /// commands. Nothing when there is no step.
    fn keep_and_run(&mut self, now: Now, steps: Vec<(CoolingStep, String)>, out: &mut Vec<Effect>) {
        if steps.is_empty() {
            return;
        }
        let wall = |t: u64| t.saturating_add_signed(now.offset);
        out.push(Effect::KeepCooling(match self.cooling.phase() {
            Phase::Cooled => Phase::Cooled,
            Phase::Draining { since } => Phase::Draining { since: wall(since) },
            Phase::PoweredDown { since } => Phase::PoweredDown { since: wall(since) },
        }));
        for (step, reason) in steps {
            out.push(Effect::RunCooling { step, reason });
        }
    }

    /// This host's CDU and rack, for the log and the commands' reason.
    fn cdu_and_rack(&self) -> (String, String) {
        self.coolant
            .as_ref()
            .map_or((String::new(), String::new()), |c| {
                (
                    c.cdu.as_str().to_string(),
                    c.rack.map_or(String::new(), |r| r.to_string()),
                )
            })
    }
}

/// Says the power-down held at the start, waiting `wait_ms` at most for
/// the CDU's word: kept pending from before the restart (`kept`), or
/// done, with the host running again in the phase "powered down".
fn say_held(rack: &str, wait_ms: u64, kept: bool, out: &mut Vec<Effect>) {
    let why = match kept {
        true => format!(
            "rack {rack}: cooling-loss {} not known done before the restart: run again",
            CoolingStep::PowerDown
        ),
        false => format!(
            "rack {rack}: the host runs again, powered down for the rack's cooling loss \
             before the restart (powered on by someone?)"
        ),
    };
    out.push(Effect::Say(Level::Warn, why));
    let why = format!(
        "rack {rack}: the power-down waits for the CDU's word that the rack still has no \
         cooling, {} s at most",
        wait_ms / 1_000
    );
    out.push(Effect::Say(Level::Warn, why));
}

/// The reason of a step run again after a restart.
fn again_reason(cdu: &str, rack: &str, step: CoolingStep) -> String {
    format!("cooling-lost: rack {rack} of {cdu}: {step} run again after a restart")
}
