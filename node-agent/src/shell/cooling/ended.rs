//! A cooling-loss step ended: done and pending no more, or still
//! pending; a resume's last try (kept from before the restart) pending no
//! more whatever its end; a resume's end, the quarantines it lifted kept
//! as known done no more before the record without it; a drain that
//! failed, run again after a wait
//! (`actions::retry_at`), one run at a time (see `shell::cooling`).
//!
//! Glossary:
//! - *retry*: the drain that failed, waiting to run again or running
//!   again.

use std::time::Duration;

use loopwarden_protocol::CoolingStep;

use super::{StepDone, RESUME_BY_HAND};
use crate::actions;
use crate::shell::Agent;

/// A drain that failed, running again until one ends well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DrainRetry {
    /// Its job: the last that failed, or the one running again.
    pub(super) job: u64,
    /// The runs in a row that failed.
    pub(super) failures: u32,
    /// When it runs again (steady ms); `None` while it runs.
    pub(super) due: Option<u64>,
}

impl Agent {
    /// Job `id` of `step` ended (`ok`: every command well): pending no
    /// more, or still pending (a failed drain runs again after a wait); a
    /// resume's end runs the quarantine actions again.
    pub(super) fn step_ended(&mut self, id: u64, step: CoolingStep, ok: bool) {
        if ok {
            // Its failure, if the last, is shown no more (`ctl status`).
            self.site_actions
                .ended_well(&format!("cooling-loss {step}"));
        }
        // A resume's last try is pending no more, whatever its end.
        let last_try = self.cooling.last_try == Some(id);
        if last_try {
            self.cooling.last_try = None;
        }
        if last_try && !ok && self.cooling.pending.holds(id) {
            tracing::error!(
                "cooling-loss resume, kept from before the restart, failed again at this start: not run again; {RESUME_BY_HAND}"
            );
        }
        if step == CoolingStep::Resume {
            // Queued for the flash before the record without the resume:
            // a cut between the two leaves the resume pending, never the
            // resume gone and a quarantine it lifted known done.
            self.undo_quarantines_done();
        }
        if self.cooling.pending.ended(id, ok || last_try) {
            self.keep_cooling();
        }
        if step == CoolingStep::Resume {
            self.quarantine_again_after_resume();
        }
        let retry = self.cooling.drain_retry.filter(|r| r.job == id);
        if ok || !self.cooling.pending.holds(id) {
            if retry.is_some() {
                self.cooling.drain_retry = None;
            }
            return;
        }
        if step != CoolingStep::Drain {
            return tracing::error!(
                "cooling-loss {step} failed: it is not run again while the agent runs, and runs again at the next start unless undone first"
            );
        }
        let failures = retry.map_or(1, |r| r.failures.saturating_add(1));
        let now = self.clock.steady().0;
        let due = actions::retry_at(now, failures);
        self.cooling.drain_retry = Some(DrainRetry {
            job: id,
            failures,
            due: Some(due),
        });
        tracing::error!(
            "cooling-loss drain failed ({failures} runs in a row): run again in {} s, and at the next start unless undone first",
            (due - now) / 1_000
        );
        let tx = self.cooling.done_tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(due - now)).await;
            let _ = tx.send(StepDone::RetryDue { id, due }).await;
        });
    }

    /// The wait after job `id`, a drain that failed, is over (`due`: the
    /// timer's): it runs again, unless undone or decided again since (a
    /// resume, a new drain), the timer is not its last, or the agent is
    /// stopping (the next start runs it).
    pub(super) fn on_drain_retry_due(&mut self, id: u64, due: u64) {
        let Some(retry) = self.cooling.drain_retry else {
            return;
        };
        if retry.job != id || retry.due != Some(due) {
            return;
        }
        if !self.cooling.pending.holds(id) || self.cooling.stopping() {
            self.cooling.drain_retry = None;
            return;
        }
        let reason = self.cooling.drain_reason.clone();
        self.keep_and_run_cooling(None, vec![(CoolingStep::Drain, reason)]);
        self.cooling.drain_retry = Some(DrainRetry {
            job: self.cooling.next_id,
            due: None,
            ..retry
        });
    }
}
