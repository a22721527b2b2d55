//! The secondary pumps: one leads, one stands by. A lead pump that fails
//! hands over to the lag pump, and a failed pump stays out of service
//! until an operator clears it. Two failures are told apart:
//! - a *trip*: commanded on, its contactor reads open on two reads
//!   running (a pump just started gets `PUMP_START_MS` to close it);
//! - a *seizure*: its contactor is closed, but the loop has no flow. The
//!   flow must read far below what the commanded speed gives, confirmed
//!   by the differential pressure reading low as well, or, where one of
//!   the two is missing, by the GPUs heating up. A flow reading that
//!   disagrees with a normal pressure is a sensor fault, judged by
//!   [`super::sensors`], not a pump failure.
//!
//! Both pumps are never commanded off together, except while an isolation
//! has failed ([`super::safety`]): then both stop, on purpose.
//!
//! Glossary:
//! - *lead / lag pump*: the pump commanded on / the one standing by.
//! - *spin-up*: the time a pump just started gets before its flow is
//!   judged (contactor, then the ramp to speed).

use loopwarden_protocol::message::{Event, Pump};

use super::latch::{Latched, PumpFault};
use super::view::Tick;
use super::Log;

/// A pump commanded on gets this long for its contactor to close, ms.
const PUMP_START_MS: u64 = 3_000;
/// The lead pump's contactor must read open this long to be a trip, ms
/// (two reads at a 1 s period).
const PUMP_CONFIRM_MS: u64 = 1_000;
/// A pump just started is not judged for flow before this, ms (the lag
/// pump takes about 10 s to reach speed).
const SPIN_UP_MS: u64 = 15_000;
/// Flow or pressure below this share of what the speed gives is "none".
const NO_FLOW_SHARE: f32 = 0.3;
/// Without two sensors agreeing, the hottest GPU must rise this much, K.
const HEATING_K: f32 = 2.0;
/// No flow must last this long to be a seizure, ms.
const SEIZE_CONFIRM_MS: u64 = 3_000;

/// The pumps' standing.
#[derive(Debug, Clone, Default)]
pub struct Pumps {
    lead: usize,
    lead_since_ms: u64,
    lead_missing_since: Option<u64>,
    /// No flow seen since, with the hottest GPU then.
    no_flow_since: Option<(u64, Option<f32>)>,
    fault: [Option<PumpFault>; 2],
    stopped: bool,
}

/// The pumps as a step leaves them.
#[derive(Debug, Clone, Copy)]
pub struct PumpsNow {
    /// Pumps A and B commanded on.
    pub on: [bool; 2],
    /// A pump commanded on reads running.
    pub running: bool,
    /// The lead pump failed this step (the loop is in a transient).
    pub failed: bool,
}

fn pump(i: usize) -> Pump {
    if i == 0 {
        Pump::A
    } else {
        Pump::B
    }
}

impl Pumps {
    /// The lead pump.
    pub fn lead(&self) -> Pump {
        pump(self.lead)
    }

    /// Pumps A and B out of service, and why.
    pub fn faults(&self) -> [Option<PumpFault>; 2] {
        self.fault
    }

    /// The pumps of a restored state (before any step: the lead counts as
    /// started at time 0, the clock of a fresh process).
    pub fn restore(&mut self, l: &Latched) {
        self.fault = l.pumps;
        self.lead = l.lead as usize;
        // A restored lead that is out of service hands over at once.
        if self.fault[self.lead].is_some() && self.fault[1 - self.lead].is_none() {
            self.lead = 1 - self.lead;
        }
        self.lead_since_ms = 0;
    }

    /// Puts `p` back in service at `now`; a trip is refused while the CDU
    /// still reports the pump's fault (`fault_shown`).
    pub fn clear(&mut self, p: Pump, fault_shown: bool, now: u64) -> Result<(), &'static str> {
        let i = p as usize;
        match self.fault[i] {
            None => return Err("the pump is in service"),
            Some(PumpFault::Tripped) if fault_shown => {
                return Err("the CDU still reports the pump's fault")
            }
            Some(_) => {}
        }
        self.fault[i] = None;
        // A lead that has itself failed hands over to the repaired pump.
        if self.fault[self.lead].is_some() {
            self.lead = i;
            self.lead_since_ms = now;
            self.lead_missing_since = None;
            self.no_flow_since = None;
        }
        Ok(())
    }

    /// The pumps in step `t`, from the contactor feedback, the flow and
    /// the pressure when the CDU answered, at the `speed` commanded, with
    /// the `hottest` GPU; failures are only judged once `booted`. `stop`:
    /// an isolation has failed, both pumps stop.
    pub(crate) fn step(
        &mut self,
        t: &Tick<'_>,
        booted: bool,
        stop: bool,
        speed: f32,
        hottest: Option<f32>,
        log: &mut Log,
    ) -> PumpsNow {
        if stop {
            self.stopped = true;
            self.lead_missing_since = None;
            self.no_flow_since = None;
            return PumpsNow {
                on: [false, false],
                running: false,
                failed: false,
            };
        }
        if core::mem::take(&mut self.stopped) {
            self.lead_since_ms = t.now;
        }
        let failure = if self.tripped(t, booted) {
            Some(PumpFault::Tripped)
        } else if booted && self.seized(t, speed, hottest) {
            Some(PumpFault::Seized)
        } else {
            None
        };
        if let Some(f) = failure {
            self.fail(f, t.now, log);
        }
        let on = if self.fault[0].is_some() && self.fault[1].is_some() {
            // Both out of service: ask both, never neither.
            [true, true]
        } else {
            [self.lead == 0, self.lead == 1]
        };
        let running = t.rd.pumps_running;
        PumpsNow {
            on,
            running: (on[0] && running[0]) || (on[1] && running[1]),
            failed: failure.is_some(),
        }
    }

    /// Takes the lead out of service for `f` and starts the lag pump.
    fn fail(&mut self, f: PumpFault, now: u64, log: &mut Log) {
        self.lead_missing_since = None;
        self.no_flow_since = None;
        let failed = self.lead;
        self.fault[failed] = Some(f);
        let other = 1 - failed;
        let lag_started = self.fault[other].is_none();
        if lag_started {
            self.lead = other;
            self.lead_since_ms = now;
        }
        let pump = pump(failed);
        log.push(match f {
            PumpFault::Tripped => Event::PumpTrip { pump, lag_started },
            PumpFault::Seized => Event::PumpSeized { pump, lag_started },
        });
    }

    /// The lead's contactor has read open long enough to be a trip.
    fn tripped(&mut self, t: &Tick<'_>, booted: bool) -> bool {
        let now = t.now;
        let missing = t.rd.answered
            && booted
            && self.fault[self.lead].is_none()
            && !t.rd.pumps_running[self.lead]
            && now.saturating_sub(self.lead_since_ms) >= PUMP_START_MS;
        if !missing {
            self.lead_missing_since = None;
            return false;
        }
        let since = *self.lead_missing_since.get_or_insert(now);
        now.saturating_sub(since) >= PUMP_CONFIRM_MS
    }

    /// The lead reads running but the loop has had no flow long enough,
    /// confirmed by a second witness (above).
    fn seized(&mut self, t: &Tick<'_>, speed: f32, hottest: Option<f32>) -> bool {
        let (rd, now) = (&t.rd, t.now);
        let judging = rd.answered
            && self.fault[self.lead].is_none()
            && rd.pumps_running[self.lead]
            && now.saturating_sub(self.lead_since_ms) >= SPIN_UP_MS;
        let c = &t.cfg.cdu;
        let flow_low = rd
            .flow_lpm
            .map(|f| f < NO_FLOW_SHARE * c.design_lpm_per_gpu * t.cfg.layout.gpus() as f32 * speed);
        let dp_low = rd
            .diff_pressure_kpa
            .map(|p| p < NO_FLOW_SHARE * c.design_dp_kpa * speed * speed);
        let suspect = flow_low.unwrap_or(false) || (flow_low.is_none() && dp_low == Some(true));
        if !(judging && suspect) {
            self.no_flow_since = None;
            return false;
        }
        let (since, hot0) = *self.no_flow_since.get_or_insert((now, hottest));
        let heating = matches!((hot0, hottest), (Some(a), Some(b)) if b - a >= HEATING_K);
        // A pressure that reads normal says the water moves: the flow
        // reading is the one at fault.
        let witnessed = match dp_low {
            Some(true) => flow_low == Some(true) || heating,
            Some(false) => false,
            None => heating,
        };
        witnessed && now.saturating_sub(since) >= SEIZE_CONFIRM_MS
    }
}
