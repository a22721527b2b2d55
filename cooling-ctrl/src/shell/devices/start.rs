//! After a start, the heartbeat waits, for at most the bound, for a
//! read-back that proves the safety settings held. What a read-back found
//! not held went with the restart, so a controller restarted faster than
//! the CDU's heartbeat timeout would otherwise write one heartbeat per
//! start to a CDU that does not hold its valves or pumps, keeping it out
//! of its fallback. Past the bound with no such proof the running rule
//! applies: the writes' echo is taken and the heartbeat written, unless a
//! read-back found a safety setting not held (withheld until read held).
//!
//! Glossary:
//! - *safety settings*: the valves, the pumps to run, the lead pump.
//! - *proof*: a step's read-back that reads every safety setting of its
//!   plan held, each written and gone in; a read-back refused (any
//!   exception, 1 and 2 included) or unanswered, or not asked (a write
//!   unanswered, a safety write not gone in) proves nothing.
//! - *bound* (B): the CDU's heartbeat timeout (the site figures'
//!   `[loop] heartbeat_timeout_s`), else [`DEFAULT_BOUND_MS`], counted
//!   from the start's first write, on the step's time passed in.
//! - *the wait*: from the start to proof or the bound, whichever first;
//!   the heartbeat is not written during it.
use super::UNPROVEN;
use crate::decide::{Plan, Setting, Write};
use crate::modbus::ReadBack;

/// The bound where the CDU's heartbeat timeout is not known: 10 s, the
/// timeout of the CDUs the controller is built for.
pub(in crate::shell) const DEFAULT_BOUND_MS: u64 = 10_000;

/// The wait for proof after a start.
#[derive(Debug)]
pub(super) struct StartWait {
    /// The bound, ms.
    bound_ms: u64,
    /// The step time of the start's first write, ms.
    started_ms: Option<u64>,
    /// Proven, or past the bound: the running rule applies.
    pub(super) over: bool,
    /// Why the last step's read-back proved nothing.
    why: Option<String>,
    /// The wait said in the log (once).
    said: bool,
    /// The heartbeat said sent on the writes' echo past the bound (once).
    pub(super) echo_said: bool,
}

impl StartWait {
    pub(super) fn new(bound_ms: u64) -> Self {
        Self {
            bound_ms,
            started_ms: None,
            over: false,
            why: None,
            said: false,
            echo_said: false,
        }
    }

    /// A step at `now_ms`: the first starts the wait; one past the bound
    /// ends it without proof. `true`: it ended at this step, for the
    /// caller to say ([`StartWait::say_echo`], or that the heartbeat is
    /// still withheld by a setting read back not held).
    pub(super) fn tick(&mut self, now_ms: u64) -> bool {
        let start = *self.started_ms.get_or_insert(now_ms);
        if self.over || now_ms.saturating_sub(start) < self.bound_ms {
            return false;
        }
        self.over = true;
        true
    }

    /// The wait over without proof and the heartbeat written on the
    /// writes' echo: said once, with why.
    pub(super) fn say_echo(&mut self) {
        if self.echo_said {
            return;
        }
        self.echo_said = true;
        tracing::warn!(
            "cooling shell: heartbeat sent on the writes' echo: no read-back proved the safety \
             settings held within {} s of the start: {}",
            self.bound_s(),
            self.why()
        );
    }

    /// The heartbeat withheld for the wait: said once.
    pub(super) fn say(&mut self) {
        if !self.over && !self.said {
            self.said = true;
            tracing::info!(
                "cooling shell: the heartbeat is not written: {UNPROVEN}, for at most {} s; \
                 the valves and pumps are written as planned",
                self.bound_s()
            );
        }
    }

    /// A step's read-back judged: `Ok` proof ends the wait (said),
    /// `Err` keeps why it proved nothing.
    pub(super) fn judge(&mut self, proof: Result<(), String>) {
        if self.over {
            return;
        }
        match proof {
            Ok(()) => {
                self.over = true;
                tracing::info!(
                    "cooling shell: the CDU's safety settings read back held since the start: \
                     the heartbeat is written from the next step"
                );
            }
            Err(why) => self.why = Some(why),
        }
    }

    /// Why the heartbeat waits, for `ctl status` and the stats.
    pub(super) fn held_why(&self) -> String {
        format!(
            "{UNPROVEN}: {}; written on the writes' echo {} s after the start unless a \
             read-back finds one not held",
            self.why(),
            self.bound_s()
        )
    }

    fn why(&self) -> &str {
        self.why.as_deref().unwrap_or("none read back yet")
    }

    fn bound_s(&self) -> f64 {
        self.bound_ms as f64 / 1000.0
    }
}

/// Whether a step's read-back `back` of the writes of `plan` that went in
/// (`went_in`) proves the plan's safety settings held: each went in, none
/// read back holding another value, none whose read-back failed in any
/// way. `Err`: why not (`not asked: …`, `refused: exception N`,
/// `unanswered`, `failed: …`, `read back not held`). A plan with none of
/// them has nothing to read back.
pub(super) fn proof(plan: &Plan, went_in: &[Write], back: &ReadBack) -> Result<(), String> {
    let safety = |set: &[Setting]| set.iter().any(|s| s.safety());
    let went = |s: Setting| went_in.iter().any(|w| w.setting == s);
    let missing = (plan.writes.iter()).find(|w| w.setting.safety() && !went(w.setting));
    if let Some(w) = missing {
        return Err(format!(
            "not asked: the {} write did not go in",
            w.setting.register()
        ));
    }
    if let Some((_, e)) = back.unread.iter().find(|(set, _)| safety(set)) {
        return Err(match e.refused_code() {
            Some(code) => format!("refused: exception {code}"),
            None if e.is_unanswered() => "unanswered".to_string(),
            None => format!("failed: {e}"),
        });
    }
    if back.not_held.iter().any(|(set, _)| safety(set)) {
        return Err("read back not held".to_string());
    }
    Ok(())
}

/// Why a step whose read-back was not asked proved nothing: a write went
/// unanswered (`held`: "not tried: the CDU did not answer the X write").
pub(super) fn not_asked(held: &str) -> String {
    let what = held.strip_prefix("not tried: ").unwrap_or(held);
    format!("not asked: {what}")
}
