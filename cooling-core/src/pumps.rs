//! The secondary pumps: one leads, one stands by. A lead pump that fails
//! hands over to the lag pump, and a failed pump stays out of service
//! until an operator clears it. Two failures are told apart:
//! - a *trip*: commanded on, its contactor reads open on two reads
//!   running (a pump just started, or the lead at the first step the CDU
//!   answers, and again when it answers after a silence, gets
//!   `PUMP_START_MS` to close it), judged in boot too. A lead the CDU
//!   was never told to run (it refused the pump writes, or restarted
//!   since) is not judged until a write that asks it goes in;
//! - a *seizure*: its contactor is closed, but the loop has no flow. The
//!   flow must read far below what the commanded speed gives, confirmed
//!   by the differential pressure reading low as well. Where one of the
//!   two is missing, under a sensor fault, or reads normal while the
//!   other reads none, the loop itself must witness it within 30 s: the
//!   hottest GPU or the return temperature rising by 2 K, or the
//!   return-to-supply difference collapsing (the water no longer brings
//!   the racks' heat back). A flow reading of none against a normal
//!   pressure is a flow sensor fault, judged by [`super::sensors`], not a
//!   pump failure; a flow sensor supervision has faulted is not read at
//!   all (a stuck one reads normal flow through a seizure).
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
/// A suspicion of no flow must be witnessed within this long, ms.
const WITNESS_WINDOW_MS: u64 = 30_000;
/// The return-to-supply difference has collapsed when it falls below this
/// share of what it was, from at least [`HEATING_K`].
const COLLAPSED_SHARE: f32 = 0.2;

/// The sensors under a fault in supervision's judgement: their readings
/// witness nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faulted {
    /// The flow sensor.
    pub flow: bool,
    /// The supply temperature sensor.
    pub supply: bool,
    /// The return temperature sensor.
    pub return_c: bool,
}

/// The pumps' standing.
#[derive(Debug, Clone)]
pub struct Pumps {
    lead: usize,
    lead_since_ms: u64,
    lead_missing_since: Option<u64>,
    /// No flow seen since, with what the loop read just before.
    no_flow_since: Option<(u64, Witness)>,
    /// What the loop read at the last step without a suspicion.
    before: Option<Witness>,
    fault: [Option<PumpFault>; 2],
    /// Neither pump was commanded on by the last step (an isolation had
    /// failed, or no step yet): the lead counts as started at the next
    /// step the CDU answers.
    stopped: bool,
    /// Since when the CDU has not answered, ms.
    silent_since: Option<u64>,
    /// The lead the last step asked to run.
    asked: Option<usize>,
    /// The CDU took a pumps write that asked the lead (a lead it was
    /// never told of is not judged tripped), and since when, ms (the
    /// step before the one that heard it took the write).
    told: bool,
    told_since_ms: u64,
}

impl Default for Pumps {
    fn default() -> Self {
        Self::new()
    }
}

impl Pumps {
    /// Pump A leads, none out of service.
    pub const fn new() -> Self {
        Self {
            lead: 0,
            lead_since_ms: 0,
            lead_missing_since: None,
            no_flow_since: None,
            before: None,
            fault: [None; 2],
            stopped: true,
            silent_since: None,
            asked: None,
            told: false,
            told_since_ms: 0,
        }
    }
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
    /// started at the first step the CDU answers).
    pub fn restore(&mut self, l: &Latched) {
        self.fault = l.pumps;
        self.lead = l.lead as usize;
        // A restored lead that is out of service hands over at once.
        if self.fault[self.lead].is_some() && self.fault[1 - self.lead].is_none() {
            self.lead = 1 - self.lead;
        }
        self.lead_since_ms = 0;
        self.told = false;
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
            self.told = false;
        }
        Ok(())
    }

    /// The pumps in step `t`, from the contactor feedback, the flow and
    /// the pressure when the CDU answered, at the `speed` commanded, with
    /// the `hottest` GPU and the sensors supervision has `faulted`. A trip
    /// is judged from the first step the CDU answers (the lead just started
    /// gets `PUMP_START_MS`, again after the CDU was silent); a seizure
    /// only once `booted`. `stop`: an
    /// isolation has failed, both pumps stop.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn step(
        &mut self,
        t: &Tick<'_>,
        booted: bool,
        stop: bool,
        speed: f32,
        hottest: Option<f32>,
        faulted: Faulted,
        log: &mut Log,
    ) -> PumpsNow {
        if stop {
            self.stopped = true;
            self.lead_missing_since = None;
            self.no_flow_since = None;
            (self.asked, self.told) = (None, false);
            return PumpsNow {
                on: [false, false],
                running: false,
                failed: false,
            };
        }
        // The lead's start counts from the first step the CDU answered
        // (a board that boots before the CDU's controller does not judge
        // a pump that was never told to start), and again after the CDU
        // was silent `PUMP_START_MS` or more (its controller restarted,
        // its pumps starting again).
        match (t.rd.answered, self.silent_since) {
            (false, None) => self.silent_since = Some(t.now),
            (true, Some(since)) => {
                self.silent_since = None;
                if t.now.saturating_sub(since) >= PUMP_START_MS {
                    // A CDU restarted runs what it runs by itself until
                    // it takes the controller's pump writes again.
                    (self.stopped, self.told) = (true, false);
                }
            }
            _ => {}
        }
        if self.stopped && t.rd.answered {
            self.stopped = false;
            self.lead_since_ms = t.now;
        }
        self.hear_told(t);
        let failure = if self.tripped(t) {
            Some(PumpFault::Tripped)
        } else if booted && self.seized(t, speed, hottest, faulted) {
            Some(PumpFault::Seized)
        } else {
            None
        };
        if let Some(f) = failure {
            self.fail(f, t.now, log);
        }
        // A lead asked of a CDU that did not answer is not known asked.
        self.asked = t.rd.answered.then_some(self.lead);
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
            self.told = false;
        }
        let pump = pump(failed);
        log.push(match f {
            PumpFault::Tripped => Event::PumpTrip { pump, lag_started },
            PumpFault::Seized => Event::PumpSeized { pump, lag_started },
        });
    }

    /// Whether the CDU took the write that asked the lead to run: until
    /// it does (the CDU in local mode, a register that refuses it, a CDU
    /// just restarted), a trip is not judged, and the start it gets
    /// counts from the write that went in, so a pump the CDU was never
    /// told to start is not taken for tripped. The refusal itself is
    /// said as a write refused. A seizure (a pump running without flow)
    /// is judged whoever started the pump.
    fn hear_told(&mut self, t: &Tick<'_>) {
        if t.inp.cdu_taken.pumps && self.asked == Some(self.lead) {
            self.told = true;
        }
        if !self.told {
            self.told_since_ms = t.now;
            self.lead_missing_since = None;
        }
    }

    /// The lead's contactor has read open long enough to be a trip.
    fn tripped(&mut self, t: &Tick<'_>) -> bool {
        let now = t.now;
        let missing = t.rd.answered
            && self.fault[self.lead].is_none()
            && !t.rd.pumps_running[self.lead]
            && self.told
            && now.saturating_sub(self.lead_since_ms.max(self.told_since_ms)) >= PUMP_START_MS;
        if !missing {
            self.lead_missing_since = None;
            return false;
        }
        let since = *self.lead_missing_since.get_or_insert(now);
        now.saturating_sub(since) >= PUMP_CONFIRM_MS
    }

    /// The lead reads running but the loop has had no flow long enough,
    /// confirmed by a second witness (above).
    fn seized(&mut self, t: &Tick<'_>, speed: f32, hottest: Option<f32>, faulted: Faulted) -> bool {
        let (rd, now) = (&t.rd, t.now);
        let judging = rd.answered
            && self.fault[self.lead].is_none()
            && rd.pumps_running[self.lead]
            && now.saturating_sub(self.lead_since_ms) >= SPIN_UP_MS;
        let c = &t.cfg.cdu;
        let flow_low = rd
            .flow_lpm
            .filter(|_| !faulted.flow)
            .map(|f| f < NO_FLOW_SHARE * c.design_lpm_per_gpu * t.cfg.layout.gpus() as f32 * speed);
        let dp_low = rd
            .diff_pressure_kpa
            .map(|p| p < NO_FLOW_SHARE * c.design_dp_kpa * speed * speed);
        let suspect = flow_low == Some(true) || dp_low == Some(true);
        let now_seen = Witness {
            hottest,
            return_c: rd.return_c.filter(|_| !faulted.return_c),
            delta_k: rd
                .return_c
                .zip(rd.supply_c)
                .filter(|_| !faulted.return_c && !faulted.supply)
                .map(|(r, s)| r - s),
        };
        if !(judging && suspect) {
            self.no_flow_since = None;
            self.before = Some(now_seen);
            return false;
        }
        // A witness must come soon: a suspicion left unwitnessed for a
        // window starts again, so a slow drift is never taken for one.
        if self
            .no_flow_since
            .is_some_and(|(since, _)| now.saturating_sub(since) > WITNESS_WINDOW_MS)
        {
            self.no_flow_since = None;
            self.before = Some(now_seen);
        }
        // Judged from the step before the suspicion began.
        let before = self.before.unwrap_or(now_seen);
        let (since, then) = *self.no_flow_since.get_or_insert((now, before));
        let heating = then.heating_to(&now_seen);
        let witnessed = match (flow_low, dp_low) {
            // Both say the water stands.
            (Some(true), Some(true)) => true,
            // A pressure that reads normal says the water moves: the flow
            // reading is the one at fault.
            (Some(true), Some(false)) => false,
            // One says so, the other is missing, under a fault, or
            // disagrees: the loop itself must say it heats up, or carry
            // no heat any more.
            (Some(true), None) | (_, Some(true)) => heating,
            _ => false,
        };
        witnessed && now.saturating_sub(since) >= SEIZE_CONFIRM_MS
    }
}

/// What says the loop heats up, or carries no heat: the hottest GPU
/// (from the hosts), the return temperature and the return-to-supply
/// difference (the CDU's), when read and believed.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Witness {
    hottest: Option<f32>,
    return_c: Option<f32>,
    delta_k: Option<f32>,
}

impl Witness {
    /// From `self` to `now`: either temperature rose by [`HEATING_K`] or
    /// more, or the return-to-supply difference collapsed (the water no
    /// longer brings the racks' heat back).
    fn heating_to(&self, now: &Witness) -> bool {
        let rose = |a: Option<f32>, b: Option<f32>| matches!((a, b), (Some(a), Some(b)) if b - a >= HEATING_K);
        let collapsed = matches!((self.delta_k, now.delta_k),
            (Some(a), Some(b)) if a >= HEATING_K && b < COLLAPSED_SHARE * a);
        rose(self.hottest, now.hottest) || rose(self.return_c, now.return_c) || collapsed
    }
}
