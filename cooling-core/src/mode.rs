//! The mode machine, `boot → normal ⇄ degraded → failsafe`, and why it is
//! in its mode.
//!
//! It boots with the pumps on and a conservative setpoint and leaves boot
//! for normal when every required sensor has read plausibly for
//! `boot_settle_ms`. A sensor fault that still stands `boot_settle_ms`
//! after the CDU's first answer (restored from before a restart, or a
//! sensor dead from the start) is judged as after boot: a broken sensor
//! never clears. Once booted, the CDU silent for `sensor_timeout_ms`
//! is failsafe; a required sensor under a fault is degraded while the
//! others stand in for it ([`super::substitute`]), failsafe when they
//! cannot; otherwise it is normal, degraded when a leak is latched, the
//! CDU's heartbeat is held back, the coordination layer caps for
//! capacity or the CDU refuses writes (said in that order). Each step judges the mode from the sensors first
//! ([`ModeMachine::judge`]) and settles it once the caps are known
//! (`ModeMachine::settle`), reporting a change.
//!
//! Glossary:
//! - *reason*: the [`ReasonCode`] reported with the mode.
//! - *since*: when the mode was entered, ms (while the CDU has never
//!   answered in boot: now).
//! - *first answer*: the step the CDU first answered since the start.

use loopwarden_protocol::message::{CduMode, Event, SensorFault};
use loopwarden_protocol::ReasonCode;

use super::sensors::{Supervisor, Trusted, Which};
use super::view::Tick;
use super::Log;

/// The mode, its reason, and what the mode's changes are judged from.
#[derive(Debug, Clone)]
pub struct ModeMachine {
    mode: CduMode,
    reason: ReasonCode,
    since_ms: u64,
    boot_ok_since: Option<u64>,
    cdu_seen_ms: Option<u64>,
    /// When the CDU first answered, ms.
    cdu_first_ms: Option<u64>,
}

impl Default for ModeMachine {
    fn default() -> Self {
        Self::new()
    }
}

impl ModeMachine {
    /// Booting, since the start.
    pub const fn new() -> Self {
        Self {
            mode: CduMode::Boot,
            reason: ReasonCode::BOOTING,
            since_ms: 0,
            boot_ok_since: None,
            cdu_seen_ms: None,
            cdu_first_ms: None,
        }
    }
}

/// What else stands in a step besides what the sensors allow.
#[derive(Debug, Clone, Copy, Default)]
pub struct Standing {
    /// A capacity cap is in force.
    pub capacity_caps: bool,
    /// A leak is latched.
    pub leak_latched: bool,
    /// An isolation has failed (the pumps are stopped).
    pub isolation_failed: bool,
    /// The CDU answers but refuses the controller's writes.
    pub writes_refused: bool,
    /// The CDU's heartbeat is held back: it runs on its own control.
    pub heartbeat_held: bool,
}

impl ModeMachine {
    /// Starts in failsafe for `reason` when a restored state was in
    /// failsafe; boots otherwise.
    pub fn restore(&mut self, failsafe: Option<ReasonCode>) {
        if let Some(reason) = failsafe {
            self.mode = CduMode::Failsafe;
            self.reason = reason;
        }
    }

    /// The mode, why, and since when (ms).
    pub fn get(&self) -> (CduMode, ReasonCode, u64) {
        (self.mode, self.reason, self.since_ms)
    }

    /// The core has left boot.
    pub fn booted(&self) -> bool {
        self.mode != CduMode::Boot
    }

    /// The mode the last step left lets the optimiser search.
    pub fn searching(&self) -> bool {
        matches!(self.mode, CduMode::Normal | CduMode::Degraded)
    }

    /// A step begins at `now`: booting without ever hearing the CDU
    /// counts from now; notes whether the CDU `answered`.
    pub fn begin(&mut self, now: u64, answered: bool) {
        if self.cdu_seen_ms.is_none() && self.mode == CduMode::Boot {
            self.since_ms = now;
        }
        if answered {
            self.cdu_seen_ms = Some(now);
            self.cdu_first_ms.get_or_insert(now);
        }
    }

    /// The mode the sensors allow in step `tick`, with the readings
    /// `trusted` after supervision.
    pub fn judge(
        &mut self,
        tick: &Tick<'_>,
        sensors: &Supervisor,
        trusted: &Trusted,
    ) -> (CduMode, ReasonCode) {
        let (now, t) = (tick.now, &tick.cfg.timing);
        let cdu_ok = self
            .cdu_seen_ms
            .is_some_and(|s| now.saturating_sub(s) < t.sensor_timeout_ms);
        let sensors_ok = sensors.required_ok() && cdu_ok;
        let readings = trusted.supply.is_some() && trusted.flow.is_some();
        let readings = readings && trusted.return_c.is_some();
        if self.mode == CduMode::Boot {
            if sensors_ok && readings {
                let since = *self.boot_ok_since.get_or_insert(now);
                if now.saturating_sub(since) >= t.boot_settle_ms {
                    return (CduMode::Normal, ReasonCode::OK);
                }
                return (self.mode, self.reason);
            }
            self.boot_ok_since = None;
            // A fault that stands past the settling time from the CDU's
            // first answer is judged as after boot: a broken sensor never
            // clears, and boot hands over no failed pump.
            let settled = self
                .cdu_first_ms
                .is_some_and(|f| now.saturating_sub(f) >= t.boot_settle_ms);
            if !settled || sensors_ok {
                return (self.mode, self.reason);
            }
        }
        if sensors_ok {
            (CduMode::Normal, ReasonCode::OK)
        } else if cdu_ok && readings {
            // A required sensor is faulty, but the others stand in for it.
            (CduMode::Degraded, ReasonCode::SENSOR_ESTIMATED)
        } else if !cdu_ok {
            (CduMode::Failsafe, ReasonCode::CDU_UNREACHABLE)
        } else if Which::ALL
            .iter()
            .any(|w| sensors.fault(*w) == Some(SensorFault::Lost))
        {
            (CduMode::Failsafe, ReasonCode::SENSOR_LOST)
        } else {
            (CduMode::Failsafe, ReasonCode::SENSOR_IMPLAUSIBLE)
        }
    }

    /// Settles the step's judged `mode` and `reason` at `now` with what
    /// else stands: a failed isolation is failsafe whatever the sensors
    /// say; normal is degraded under a latched leak, a heartbeat held
    /// back, a capacity cap or a CDU that refuses writes, said in that
    /// order. Reports a change.
    pub(crate) fn settle(
        &mut self,
        judged: (CduMode, ReasonCode),
        standing: Standing,
        now: u64,
        log: &mut Log,
    ) -> (CduMode, ReasonCode) {
        let (mut mode, mut reason) = judged;
        if standing.isolation_failed {
            (mode, reason) = (CduMode::Failsafe, ReasonCode::ISOLATION_FAILED);
        } else if mode == CduMode::Normal {
            // A latched leak is said before a capacity cap: it needs a
            // field engineer at the rack, and the cap is often its
            // consequence (a rack isolated, the others carrying its heat).
            // A heartbeat held back before a cap: the CDU runs on its own
            // control, whatever the controller commands.
            let degraded = if standing.leak_latched {
                Some(ReasonCode::LEAK)
            } else if standing.heartbeat_held {
                Some(ReasonCode::HEARTBEAT_HELD)
            } else if standing.capacity_caps {
                Some(ReasonCode::CAPACITY_SHORT)
            } else if standing.writes_refused {
                Some(ReasonCode::CDU_WRITES_REFUSED)
            } else {
                None
            };
            if let Some(r) = degraded {
                (mode, reason) = (CduMode::Degraded, r);
            }
        }
        if mode != self.mode {
            log.push(Event::CduModeChanged {
                from: self.mode,
                to: mode,
                reason,
            });
            self.mode = mode;
            self.since_ms = now;
        }
        self.reason = reason;
        (mode, reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settled(standing: Standing) -> (CduMode, ReasonCode) {
        let mut m = ModeMachine::new();
        let mut log = Log::default();
        m.settle((CduMode::Normal, ReasonCode::OK), standing, 1_000, &mut log)
    }

    #[test]
    fn a_latched_leak_is_the_reason_said_under_a_capacity_cap_too() {
        let leak = Standing {
            leak_latched: true,
            ..Standing::default()
        };
        let both = Standing {
            capacity_caps: true,
            writes_refused: true,
            ..leak
        };
        for s in [leak, both] {
            assert_eq!(settled(s), (CduMode::Degraded, ReasonCode::LEAK), "{s:?}");
        }
        let capped = Standing {
            capacity_caps: true,
            writes_refused: true,
            ..Standing::default()
        };
        assert_eq!(
            settled(capped),
            (CduMode::Degraded, ReasonCode::CAPACITY_SHORT)
        );
        let failed = Standing {
            isolation_failed: true,
            ..both
        };
        assert_eq!(
            settled(failed),
            (CduMode::Failsafe, ReasonCode::ISOLATION_FAILED)
        );
    }

    /// A heartbeat held back is said before a capacity cap and the
    /// refused writes it comes with, a latched leak before it.
    #[test]
    fn a_heartbeat_held_back_is_said_after_a_leak_only() {
        let held = Standing {
            heartbeat_held: true,
            capacity_caps: true,
            writes_refused: true,
            ..Standing::default()
        };
        assert_eq!(
            settled(held),
            (CduMode::Degraded, ReasonCode::HEARTBEAT_HELD)
        );
        let leak = Standing {
            leak_latched: true,
            ..held
        };
        assert_eq!(settled(leak), (CduMode::Degraded, ReasonCode::LEAK));
    }
}
