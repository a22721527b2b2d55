//! # cooling-core: the control core of the CDU controller
//!
//! One CDU's safety, regulation, optimisation and cap coordination as a
//! pure function of what it reads and the time passed in:
//! `Core::step(&Inputs) -> Commands`. No clock, no socket, no heap; it
//! builds for a Cortex-M4F. `cooling-ctrl` runs it in production and in
//! the twin.
//!
//! Each step runs the layers in order of authority; a later layer works
//! inside what an earlier one allows:
//! 1. **safety**: leaks (close the rack's valve at once, cap its hosts to
//!    their minimum, tell them their cooling is lost), supervised leak
//!    sensing and confirmed isolation with its escalation in [`safety`];
//!    tripped and seized pumps (start the lag pump) in [`pumps`]; sensor
//!    supervision in [`sensors`]; the mode `boot → normal ⇄ degraded →
//!    failsafe` in [`mode`]. It boots with the pumps on and a conservative
//!    setpoint, and leaves boot when every required sensor has read
//!    plausibly for `boot_settle_ms`, or, under a sensor fault, that long
//!    after the CDU first answered. What it latches ([`latch`]) the
//!    shell keeps in flash before acting and gives back to
//!    [`Core::restore`] after a restart.
//! 2. **regulation** ([`regulate`]): a margin loop lowers the setpoint
//!    while the hottest GPU runs above the plan ceiling; a supply loop
//!    trims the setpoint the CDU is given so the measured supply meets the
//!    target; a flow loop does the same for the pump speed. PI with
//!    anti-windup, output and slew limits (warming and slowing are slewed,
//!    cooling and speeding up are not; see [`pid`]).
//! 3. **optimisation**: a search over setpoint and pump speed for the least
//!    facility power per unit of GPU work at steady state, every GPU at or
//!    below the plan ceiling even at full demand (see [`optimise`]). Its
//!    slice of the search runs before regulation in a step, so that
//!    regulation follows the proposal a search finishes on that step.
//!    It plans on the hall as [`estimate`] has learned it (each host's
//!    thermal factor, the pump's curve, the dry cooler, the chiller, the
//!    pump's power), as far as each estimate is trusted; a faulty sensor
//!    is stood in for by what the others imply ([`substitute`]).
//! 4. **coordination**: when cooling falls short, a power cap per host
//!    sized from its GPUs' thermal margin at the coolant temperature to
//!    come; lifted when capacity has been back for `cap_release_ms`
//!    (see [`coordinate`]).
//!
//! What every layer works from (fresh host reports, the hottest GPU, the
//! supply the GPUs imply, transients) is in [`view`]; [`config`] and
//! [`model`] support them all.
//!
//! Without the bus (no fresh host reports) it regulates on its own
//! measurements and the IT meter.
//!
//! Glossary:
//! - *host report*: a host's hottest GPU, its GPUs' power and limit, from
//!   the node agent's telemetry.
//! - *fresh*: a host report younger than `host_timeout_ms`.
//! - *plan ceiling*, *cap target*: see [`config`].
//! - *latched leak*: a rack whose leak input fired; its valve stays shut
//!   until an operator clears it with the input dry and supervised.
//! - *escalation*: a leaking rack whose valve does not read closed in
//!   time: both pumps stop and every host is capped (see [`safety`]).

#![no_std]

#[cfg(test)]
extern crate std;

mod beacon;
pub mod config;
pub mod coordinate;
pub mod estimate;
pub mod facility;
pub mod latch;
pub mod mode;
pub mod model;
pub mod optimise;
pub mod pid;
pub mod pumps;
pub mod reference;
pub mod regulate;
pub mod safety;
pub mod sensors;
mod start;
pub mod substitute;
pub mod view;

use heapless::Vec;
use loopwarden_protocol::message::{CduMode, Event, Pump, SensorFault};
use loopwarden_protocol::ReasonCode;

pub use config::{ConfigError, CoreConfig};
use coordinate::Coordinator;
pub use estimate::Learned;
use estimate::{Estimator, Given};
pub use latch::{LatchError, Latched, PumpFault};
use mode::ModeMachine;
use optimise::{Optimiser, Proposal, RejectionWatch};
use pumps::Pumps;
use regulate::Regulator;
pub use safety::LeakInputs;
use safety::Safety;
use sensors::{Supervisor, Which};
use view::{HallView, Seen, Tick};

/// Racks the core can hold.
pub const MAX_RACKS: usize = 16;
/// Hosts the core can hold.
pub const MAX_HOSTS: usize = 128;
/// A set of hosts, bit n = host n (by host index).
pub type HostMask = u128;
/// Events one step can report.
pub const MAX_EVENTS: usize = 16;

/// What the CDU answered this step (`None` in [`Inputs::cdu`]: it did not
/// answer). A sensor the CDU reports as missing is `None`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CduReadings {
    /// Secondary supply temperature, °C.
    pub supply_c: Option<f32>,
    /// Secondary return temperature, °C.
    pub return_c: Option<f32>,
    /// Secondary flow, L/min.
    pub flow_lpm: Option<f32>,
    /// Facility water supply temperature, °C.
    pub facility_supply_c: Option<f32>,
    /// Pumps A and B running (contactor feedback).
    pub pumps_running: [bool; 2],
    /// Pumps A and B report a fault (drive fault, overload relay).
    pub pump_faults: [bool; 2],
    /// Loop differential pressure, kPa.
    pub diff_pressure_kpa: Option<f32>,
    /// Rack valves reading closed (position feedback), bit n = rack n;
    /// `None`: the CDU reports no positions.
    pub valves_closed: Option<u16>,
    /// IT power meter, W.
    pub it_w: Option<f32>,
    /// Facility power meter, W.
    pub facility_w: Option<f32>,
}

/// One host as its node agent last reported it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostReport {
    /// GPUs running (not lost, not powered down).
    pub gpus: u8,
    /// Its hottest GPU, °C.
    pub hottest_c: f32,
    /// Its GPUs' power together, W.
    pub gpu_power_w: f32,
    /// The highest power limit in force on its GPUs, W.
    pub limit_w: f32,
    /// A GPU is in hardware thermal slowdown.
    pub slowdown: bool,
    /// When the report arrived, ms (the core's clock).
    pub at_ms: u64,
}

/// What one step is given.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// Now, ms on a monotonic clock.
    pub now_ms: u64,
    /// The CDU's answer, if it answered.
    pub cdu: Option<CduReadings>,
    /// Outdoor air temperature, °C, where the site reports it.
    pub ambient_c: Option<f32>,
    /// The board's leak ropes.
    pub leaks: LeakInputs,
    /// What the CDU took of the last settings written.
    pub cdu_taken: Taken,
    /// Racks whose valve the last step commanded open but the shell did
    /// not write open (bit n = rack n): it holds openings back while the
    /// latched record is not in flash, and writes no valve while a
    /// relatch is pending. Such a valve reading closed is no fault of
    /// its position input. 0 where every valve commanded was written.
    pub valves_held: u16,
    /// The last report of each host, by host index (rack-major).
    pub hosts: &'a [Option<HostReport>],
}

/// What the CDU took of the last step's settings: each on its own, so
/// that a refused setpoint does not hide a speed that went in (the
/// sensors are judged against the speed the CDU runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// Every setting written went in.
    pub all: bool,
    /// The supply setpoint went in (or was not written).
    pub setpoint: bool,
    /// The pump speed went in (or was not written).
    pub speed: bool,
    /// The valves word went in (or was not written).
    pub valves: bool,
    /// The pumps to run and the lead pump went in (or were not written):
    /// a lead the CDU was never told of is not judged tripped.
    pub pumps: bool,
    /// The heartbeat was held back (not written) this step, or is from
    /// the next step on: the CDU echoed a safety setting it does not
    /// hold, so it runs on its own control.
    pub heartbeat_held: bool,
}

impl Taken {
    /// Everything went in.
    pub const ALL: Taken = Taken {
        all: true,
        setpoint: true,
        speed: true,
        valves: true,
        pumps: true,
        heartbeat_held: false,
    };
    /// Nothing went in.
    pub const NONE: Taken = Taken {
        all: false,
        setpoint: false,
        speed: false,
        valves: false,
        pumps: false,
        heartbeat_held: false,
    };
}

/// A power cap asked of a host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostCap {
    /// Highest power limit for each of its GPUs, W.
    pub watts: f32,
    /// Why.
    pub reason: ReasonCode,
}

/// What one step decides.
#[derive(Debug, Clone, PartialEq)]
pub struct Commands {
    /// Supply setpoint for the CDU, °C.
    pub setpoint_c: f32,
    /// Pump speed, fraction of full.
    pub pump_speed: f32,
    /// Pumps A and B commanded on.
    pub pump_on: [bool; 2],
    /// The lead pump.
    pub lead: Pump,
    /// Rack valves open, bit n = rack n.
    pub valves_open: u16,
    /// Racks whose cooling is lost (their hosts must drain and power down).
    pub cooling_lost: u16,
    /// Racks whose leak sensing is lost by a fault, bit n = rack n.
    pub sensing_lost: u16,
    /// Racks whose isolation failed: both pumps are stopped for them.
    pub isolation_failed: u16,
    /// Racks whose valve position input is not believed (it read closed
    /// while the valve was commanded open), bit n = rack n.
    pub valve_feedback_faults: u16,
    /// Caps per host (index as in [`Inputs::hosts`]).
    pub caps: [Option<HostCap>; MAX_HOSTS],
    /// Alarm beacon on.
    pub beacon: bool,
    /// The mode now.
    pub mode: CduMode,
    /// Why.
    pub reason: ReasonCode,
    /// What happened this step.
    pub events: Vec<Event, MAX_EVENTS>,
}

/// The loops' state, for the console.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoopStatus {
    /// The optimiser's last proposal.
    pub proposal: Proposal,
    /// Setpoint taken off by the margin loop, K.
    pub margin_k: f32,
    /// Setpoint trim of the supply loop, K.
    pub supply_trim_k: f32,
    /// Speed trim of the flow loop, fraction.
    pub flow_trim: f32,
    /// Coolant temperature the caps are sized for, °C.
    pub coolant_c: Option<f32>,
    /// Heat rejection is believed short (the supply cannot be held).
    pub rejection_short: bool,
}

/// The control core of one CDU.
#[derive(Debug, Clone)]
pub struct Core {
    cfg: CoreConfig,
    last_ms: Option<u64>,
    modes: ModeMachine,
    sensors: Supervisor,
    safety: Safety,
    pumps: Pumps,
    restored: Option<Latched>,
    /// The setpoint and speed the CDU last took (°C, fraction).
    applied: (f32, f32),
    hall: HallView,
    regulator: Regulator,
    optimiser: Optimiser,
    rejection: RejectionWatch,
    coordinator: Coordinator,
    estimator: Estimator,
    setpoint_ceiling_c: f32,
    plan_offset_k: f32,
    events_dropped: u32,
    /// The facility water the hall's coordinator last set, °C, and until
    /// when it stands, ms.
    facility_target: Option<(f32, u64)>,
    /// The valves the last step commanded open (`None` before the first).
    valves_commanded: Option<u16>,
    /// The hosts heard since this core started, bit n = host n (a slot of
    /// the layout no host fills is never heard).
    heard: HostMask,
}

/// A facility water target not renewed for this long is dropped: the
/// CDU plans as if its setpoint set the water (the BMS falls back to its
/// own policy when the coordinator is silent).
pub const FACILITY_TARGET_STALE_MS: u64 = 300_000;

/// The hottest GPU of the fresh reports of the hosts in `hosts` (bit n =
/// host n) in step `t`, °C.
fn hottest_of(t: &Tick<'_>, hosts: HostMask) -> Option<f32> {
    (0..t.cfg.layout.hosts().min(MAX_HOSTS))
        .filter(|h| hosts & (1 << h) != 0)
        .filter_map(|h| t.fresh(h))
        .map(|r| r.hottest_c)
        .reduce(f32::max)
}

/// What a step made of the sensors.
#[derive(Debug, Clone, Copy)]
struct Sensed {
    /// The hall as the step sees it.
    seen: Seen,
    /// The readings supervision trusts.
    read: sensors::Trusted,
    /// Those, with a stand-in for each faulty required sensor that has one.
    trusted: sensors::Trusted,
    /// The facility water supply, if trusted, °C.
    facility: Option<f32>,
}

/// Bit `i` of `mask` (a rack's bit).
pub(crate) fn bit(mask: u16, i: usize) -> bool {
    i < 16 && mask & (1 << i) != 0
}

/// The events of one step, and how many did not fit.
#[derive(Debug, Default)]
pub(crate) struct Log {
    events: Vec<Event, MAX_EVENTS>,
    dropped: u32,
}

impl Log {
    /// Reports `e`, or counts it as dropped when the list is full.
    pub(crate) fn push(&mut self, e: Event) {
        if self.events.push(e).is_err() {
            self.dropped = self.dropped.saturating_add(1);
        }
    }
}

impl Core {
    /// The hall's facility coordinator set the facility water to
    /// `water_c` at `now_ms` (a hall of several CDUs): the optimiser plans
    /// with it until [`FACILITY_TARGET_STALE_MS`] passes without another.
    pub fn facility_target(&mut self, water_c: f32, now_ms: u64) {
        self.facility_target_aged(water_c, now_ms, 0);
    }

    /// The hall's facility coordinator set the facility water to
    /// `water_c`, told at `now_ms` in a plan already `age_ms` old (a
    /// retained plan delivered again at a connection): it stands what is
    /// left of [`FACILITY_TARGET_STALE_MS`] from when it was made.
    pub fn facility_target_aged(&mut self, water_c: f32, now_ms: u64, age_ms: u64) {
        if water_c.is_finite() && age_ms < FACILITY_TARGET_STALE_MS {
            let until = now_ms.saturating_add(FACILITY_TARGET_STALE_MS - age_ms);
            self.facility_target = Some((water_c, until));
        }
    }

    /// What this CDU offers the hall's facility coordinator (a hall of
    /// several CDUs, after the first search). While it does not search
    /// (failsafe) its last offer stands without capped points (no search
    /// stands behind their caps) and accepts no warmer water than the
    /// setpoint it holds allows (the setpoint less the approach).
    pub fn offer(&self) -> Option<facility::Offer> {
        let o = self.optimiser.offer()?;
        if self.modes.searching() {
            return Some(o);
        }
        let held_c = self.applied.0 - self.cfg.cdu.approach_k;
        Some(facility::Offer {
            points: 0,
            accept_c: o.accept_c.min(held_c),
            ..o
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    /// The mode, why, and since when (ms).
    pub fn mode(&self) -> (CduMode, ReasonCode, u64) {
        self.modes.get()
    }

    /// The supply setpoint (°C) and the pump speed (a share of full speed)
    /// the core takes the CDU to run at: the last of each the CDU took, as
    /// its step heard it (a step judges the writes of the step before);
    /// before one went in, the boot setpoint and full speed.
    pub fn applied(&self) -> (f32, f32) {
        self.applied
    }

    /// The fault a sensor stands under.
    pub fn sensor_fault(&self, w: Which) -> Option<SensorFault> {
        self.sensors.fault(w)
    }

    /// Racks with a latched leak, bit n = rack n.
    pub fn leaks_latched(&self) -> u16 {
        self.safety.leaks_latched()
    }

    /// Latches the racks of `racks` (bit n = rack n) as leaks, in place:
    /// what the shell does after an unreadable latched record, for the
    /// racks whose valve the CDU reports closed. Everything else the core
    /// holds (the BMS's limits, what it learned, its loops) stays.
    pub fn latch_racks(&mut self, racks: u16) {
        self.safety.latch(racks, self.cfg.layout.racks as usize);
    }

    /// Racks whose valve position input is not believed, bit n = rack n.
    pub fn valve_feedback_faults(&self) -> u16 {
        self.safety.feedback_faults()
    }

    /// What the core has latched now: what must be in flash before the
    /// step's commands act.
    pub fn latched(&self) -> Latched {
        let (mode, reason, _) = self.modes.get();
        Latched {
            leaks: self.safety.leaks_latched(),
            isolation_failed: self.safety.isolation_failed(),
            pumps: self.pumps.faults(),
            lead: self.pumps.lead(),
            failsafe: (mode == CduMode::Failsafe).then_some(reason),
            sensors: Which::ALL.map(|w| self.sensors.fault(w)),
            feedback_faults: self.safety.feedback_faults(),
        }
    }

    /// Pumps out of service.
    pub fn pumps_failed(&self) -> [bool; 2] {
        self.pumps.faults().map(|f| f.is_some())
    }

    /// Pumps A and B out of service, and why.
    pub fn pump_faults(&self) -> [Option<PumpFault>; 2] {
        self.pumps.faults()
    }

    /// Racks whose leak sensing is lost by a fault, bit n = rack n.
    pub fn sensing_lost(&self) -> u16 {
        self.safety.sensing_lost()
    }

    /// Racks whose isolation failed, bit n = rack n.
    pub fn isolation_failed(&self) -> u16 {
        self.safety.isolation_failed()
    }

    /// Events that did not fit in a step's list, since the start.
    pub fn events_dropped(&self) -> u32 {
        self.events_dropped
    }

    /// What the estimator has learned of the hall.
    pub fn learned(&self) -> Learned {
        *self.estimator.learned()
    }

    /// The plant as the optimiser believes it now: the configuration with
    /// the learned figures blended in by their trust, and the plan
    /// ceiling raised by the least trust among the hosts it plans for.
    pub fn believed(&self) -> CoreConfig {
        let racks = self.cfg.layout.racks as usize;
        let lost = if self.safety.isolation_failed() != 0 {
            safety::all_racks(racks)
        } else {
            self.safety.leaks_latched()
        };
        self.believed_under(&self.limited_config(), lost)
    }

    /// `cfg` as the optimiser believes it while the racks of
    /// `cooling_lost` have lost their cooling: the plan ceiling raised by
    /// the least trust among the hosts of the other racks heard since the
    /// start or learned before, reporting now or not (one silent is still
    /// planned for, and seen by neither the margin loop nor the caps).
    fn believed_under(&self, cfg: &CoreConfig, cooling_lost: u16) -> CoreConfig {
        // A host is planned for once heard since the start, or learned
        // before it; a slot of the layout no host fills never is (its
        // trust, 0 for ever, would hold every hall with room to spare at
        // the configured ceiling).
        let learned = self.estimator.learned();
        let known = |h: usize| self.heard & (1 << h) != 0 || learned.hosts[h].trust > 0.0;
        let planned = |h: usize| known(h) && !bit(cooling_lost, cfg.layout.rack_of(h));
        let base = self.cfg.margins.plan_ceiling_c;
        self.estimator.believed(cfg, &planned, base)
    }

    /// Starts from what an earlier run learned (read back from flash);
    /// refused, and the configured figures kept, when it is not sane.
    pub fn restore_learned(&mut self, l: &Learned) -> Result<(), &'static str> {
        if !l.sane() {
            return Err("learned figures out of their bounds");
        }
        self.estimator = Estimator::from_learned(*l);
        Ok(())
    }

    /// The outdoor temperature planned with, °C, and whether it is the
    /// configured fallback (no sensor reads).
    pub fn outdoor(&self) -> (f32, bool) {
        self.estimator.outdoor(&self.cfg)
    }

    /// The loops' state.
    pub fn loops(&self) -> LoopStatus {
        let (margin_k, supply_trim_k, flow_trim) = self.regulator.trims();
        LoopStatus {
            proposal: self.optimiser.proposal(),
            margin_k,
            supply_trim_k,
            flow_trim,
            coolant_c: self.coordinator.coolant_c(),
            rejection_short: self.rejection.short(),
        }
    }

    /// An operator clears rack `rack`'s latched leak; refused while its
    /// rope or the CDU's leak input reads wet in `leaks_now`, an input
    /// read it wet when last heard, or its leak sensing is lost.
    pub fn clear_leak(&mut self, rack: usize, leaks_now: &LeakInputs) -> Result<(), &'static str> {
        let racks = self.cfg.layout.racks as usize;
        self.safety.clear_leak(rack, racks, leaks_now)
    }

    /// Limits the building management system may set: the warmest supply
    /// setpoint the controller may ask for (kept within the CDU's range,
    /// never below its lowest setpoint) and a tightening of the plan
    /// ceiling (K, at most 0: the BMS may only make the GPUs' margin wider).
    pub fn set_limits(&mut self, setpoint_ceiling_c: f32, plan_offset_k: f32) {
        let c = &self.cfg.cdu;
        if setpoint_ceiling_c.is_finite() {
            self.setpoint_ceiling_c = setpoint_ceiling_c.clamp(c.min_setpoint_c, c.max_setpoint_c);
        }
        if plan_offset_k.is_finite() {
            self.plan_offset_k = plan_offset_k.clamp(-20.0, 0.0);
        }
    }

    /// The limits in force: setpoint ceiling, °C, and plan ceiling offset, K.
    pub fn limits(&self) -> (f32, f32) {
        (self.setpoint_ceiling_c, self.plan_offset_k)
    }

    /// An operator puts a failed pump back in service; refused while the
    /// CDU still reports its fault (`fault_shown`) or it is in service.
    pub fn clear_pump(&mut self, pump: Pump, fault_shown: bool) -> Result<(), &'static str> {
        self.pumps
            .clear(pump, fault_shown, self.last_ms.unwrap_or(0))
    }

    /// One step at `inp.now_ms`: the layers in order of authority.
    pub fn step(&mut self, inp: &Inputs<'_>) -> Commands {
        let mut out = Commands::UNSET;
        self.step_into(inp, &mut out);
        out
    }

    /// [`Core::step`], its commands written over `out`, every field: a
    /// caller that keeps the last step's commands has them made in place,
    /// with no second [`Commands`] on its stack.
    pub fn step_into(&mut self, inp: &Inputs<'_>, out: &mut Commands) {
        let (dt, mut log) = self.begin(inp);
        for (h, r) in inp.hosts.iter().enumerate().take(MAX_HOSTS) {
            if r.is_some() {
                self.heard |= 1 << h;
            }
        }

        // 1. Safety: leaks (the board's ropes and the CDU's own input), isolation,
        // pumps; then the sensors and the mode they allow.
        let (t, pumps) = self.safety_step(inp, dt, &mut log);
        let escalated = self.safety.isolation_failed() != 0;
        let sensed = self.sense(&t, &pumps, &mut log);
        let judged = self.modes.judge(&t, &self.sensors, &sensed.trusted);

        // What the hall really is, learned from this step.
        let (believed, short) = self.learn(&t, &sensed, &pumps, &mut log);

        // 3. Optimisation, then 2. regulation.
        self.plan_and_regulate(&t, &sensed, &believed, short, judged.0, &pumps);

        // 4. Coordination, and the mode it leaves.
        out.caps = [None; MAX_HOSTS];
        let (supply, setpoint_c) = (sensed.trusted.supply, self.regulator.setpoint_c());
        let est = &self.estimator;
        let factor = |h| est.factor(h);
        let seen = sensed.seen;
        let capacity = self
            .coordinator
            .caps(&t, &seen, supply, setpoint_c, &factor, &mut out.caps);
        let standing = mode::Standing {
            capacity_caps: capacity,
            leak_latched: self.safety.leaks_latched() != 0,
            isolation_failed: escalated,
            writes_refused: inp.cdu.is_some() && !inp.cdu_taken.all,
            heartbeat_held: inp.cdu.is_some() && inp.cdu_taken.heartbeat_held,
        };
        let settled = self.modes.settle(judged, standing, t.now, &mut log);
        self.events_dropped = self.events_dropped.saturating_add(log.dropped);
        self.commands(&t, settled, pumps.on, seen.hottest, log.events, out);
    }

    /// The start of a step: the clock, what the CDU runs on, and the
    /// restored state's event. Returns the seconds since the last step and
    /// the step's event log.
    fn begin(&mut self, inp: &Inputs<'_>) -> (f32, Log) {
        if self.last_ms.is_none() {
            // The CDU runs on settings this core did not give (its own, or
            // an earlier process's) until its first write goes in.
            self.hall
                .restart_transient(inp.now_ms.saturating_add(120_000));
        }
        let dt = self.clock(inp.now_ms);
        self.modes.begin(inp.now_ms, inp.cdu.is_some());
        // What of the last step's settings went in: the CDU runs on it.
        if inp.cdu_taken.setpoint {
            self.applied.0 = self.regulator.setpoint_c();
        }
        if inp.cdu_taken.speed {
            self.applied.1 = self.regulator.speed();
        }
        let mut log = Log::default();
        if let Some(l) = self.restored.take() {
            log.push(Event::ControllerRestored {
                leaks_latched: l.leaks,
                pumps_out: l.pumps_out(),
                lead: l.lead,
            });
        }
        (dt, log)
    }

    /// Sensor supervision in step `t` against what the hall implies (at
    /// the speed the CDU runs), and a faulty sensor's reading replaced by
    /// what the others imply.
    fn sense(&mut self, t: &Tick<'_>, pumps: &pumps::PumpsNow, log: &mut Log) -> Sensed {
        let speed = self.applied.1;
        let est = &self.estimator;
        let seen = self.hall.see(t, &self.sensors, speed, &|h| est.factor(h));
        let fresh = |h| t.fresh(h).is_some();
        let facility = self
            .sensors
            .trusted(Which::FacilitySupply, t.rd.facility_supply_c);
        let judged_by = Seen {
            gpu_implied_supply: est.supply_expectation(
                &t.cfg,
                &fresh,
                seen.gpu_implied_supply,
                facility,
            ),
            ..seen
        };
        let read = self
            .sensors
            .supervise(t, &judged_by, pumps.running, speed, log);
        let sources = substitute::Sources {
            cfg: &t.cfg,
            seen: &seen,
            flow_full_per_gpu: est.flow_per_gpu_full(),
            speed,
            pumping: pumps.running,
        };
        let (trusted, _) = substitute::fill(read, &sources);
        Sensed {
            seen,
            read,
            trusted,
            facility,
        }
    }

    /// The estimator's part of step `t`: learns from what was `sensed`
    /// (the readings themselves, never the stand-ins). Returns the plant
    /// as now believed and whether heat rejection is believed short.
    fn learn(
        &mut self,
        t: &Tick<'_>,
        sensed: &Sensed,
        pumps: &pumps::PumpsNow,
        log: &mut Log,
    ) -> (CoreConfig, bool) {
        // Judged on the supply sensor itself: a stand-in for a lost one
        // (the GPUs' word on factors not yet learned) is no evidence that
        // the supply cannot be held, and a short believed holds for ten
        // minutes.
        self.rejection.watch(t, sensed.read.supply, self.applied.0);
        let short = self.rejection.short();
        let running = t.rd.pumps_running.iter().filter(|r| **r).count();
        let given = Given {
            supply: sensed.read.supply,
            flow: sensed.read.flow,
            facility: sensed.facility,
            speed: self.applied.1,
            one_pump: pumps.running && running == 1,
            setpoint_c: self.applied.0,
            short,
            sensors_quiet: self.sensors.quiet(),
        };
        self.estimator.learn(t, &sensed.seen, &given, log);
        (self.believed_under(&t.cfg, t.cooling_lost), short)
    }

    /// One slice of the search on the `believed` plant (before regulation,
    /// so that regulation follows a proposal finished on this step), then
    /// regulation in `mode` to the plan ceiling the estimates allow: the
    /// hosts the plan holds by caps rather than by the water are the
    /// caps' to hold, not the margin loop's.
    fn plan_and_regulate(
        &mut self,
        t: &Tick<'_>,
        sensed: &Sensed,
        believed: &CoreConfig,
        short: bool,
        mode: CduMode,
        pumps: &pumps::PumpsNow,
    ) {
        let est = &self.estimator;
        let seen = sensed.seen;
        if self.modes.searching() {
            let (ambient, _) = est.outdoor(&t.cfg);
            let water = self
                .facility_target
                .filter(|(_, until)| t.now < *until)
                .map(|(w, _)| w);
            self.optimiser.share_water(water);
            let factor = |h| est.factor_used(h);
            self.optimiser
                .slice(t, believed, &seen, &factor, ambient, short);
        }
        let prop = self.optimiser.proposal();
        let mut t_reg = *t;
        t_reg.cfg.margins.plan_ceiling_c = believed.margins.plan_ceiling_c;
        let by_water = Seen {
            hottest: hottest_of(t, !prop.capped_mask)
                .or(seen.hottest.filter(|_| prop.capped_mask == 0)),
            ..seen
        };
        let trusted = &sensed.trusted;
        if self
            .regulator
            .step(&t_reg, mode, &prop, trusted, &by_water, pumps.running)
        {
            self.hall.extend_transient(t.now + 60_000);
        }
    }

    /// The safety layer's part of a step `dt` s after the last: leaks and
    /// their sensing, the isolation of latched racks, the pumps. Returns
    /// the step's tick (with every rack's cooling lost while an isolation
    /// has failed) and the pumps.
    fn safety_step<'a>(
        &mut self,
        inp: &'a Inputs<'a>,
        dt: f32,
        log: &mut Log,
    ) -> (Tick<'a>, pumps::PumpsNow) {
        let cfg = self.limited_config();
        let racks = cfg.layout.racks as usize;
        let valves_open = self
            .safety
            .leaks(&inp.leaks, racks, cfg.layout.unprotected, log);
        let latched = self.safety.leaks_latched();
        let mut t = Tick::new(inp, dt, cfg, valves_open, latched);
        let closed = t.rd.valves_closed;
        let confirm_ms = cfg.timing.valve_confirm_ms;
        if let Some(was) = self.valves_commanded {
            let (written, opened) = (inp.cdu_taken.valves, was & !inp.valves_held);
            self.safety
                .feedback(t.now, opened, written, closed, confirm_ms, log);
        }
        self.valves_commanded = Some(valves_open);
        if self.safety.isolation(t.now, closed, confirm_ms, log) {
            t.cooling_lost = safety::all_racks(racks);
        }
        let stop = self.safety.isolation_failed() != 0;
        let (booted, speed) = (self.modes.booted(), self.applied.1);
        let hottest = t.hottest();
        let faulted = pumps::Faulted {
            flow: self.sensors.fault(Which::Flow).is_some(),
            supply: self.sensors.fault(Which::Supply).is_some(),
            return_c: self.sensors.fault(Which::Return).is_some(),
        };
        let pumps = self
            .pumps
            .step(&t, booted, stop, speed, hottest, faulted, log);
        if pumps.failed {
            self.hall.restart_transient(t.now + 120_000);
        }
        (t, pumps)
    }

    /// What step `t` commands, in mode `(mode, reason)`, into `out`
    /// (its caps, the coordinator's, are there already).
    fn commands(
        &self,
        t: &Tick<'_>,
        (mode, reason): (CduMode, ReasonCode),
        pump_on: [bool; 2],
        hottest: Option<f32>,
        events: Vec<Event, MAX_EVENTS>,
        out: &mut Commands,
    ) {
        // Every field named: one added and not written here fails to build.
        let Commands {
            setpoint_c,
            pump_speed,
            pump_on: on,
            lead,
            valves_open,
            cooling_lost,
            sensing_lost,
            isolation_failed,
            valve_feedback_faults,
            caps: _,
            beacon,
            mode: m,
            reason: r,
            events: e,
        } = out;
        *setpoint_c = self.regulator.setpoint_c();
        *pump_speed = self.regulator.speed();
        *on = pump_on;
        *lead = self.pumps.lead();
        *valves_open = t.valves_open;
        *cooling_lost = t.cooling_lost;
        *sensing_lost = self.safety.sensing_lost();
        *isolation_failed = self.safety.isolation_failed();
        *valve_feedback_faults = self.safety.feedback_faults();
        *beacon = self.beacon(t, mode, hottest);
        *m = mode;
        *r = reason;
        *e = events;
    }

    /// Advances the clock to `now`; returns the seconds since the last
    /// step (1 on the first, 0 if time stood still or ran back, at most 10).
    fn clock(&mut self, now: u64) -> f32 {
        let dt = match self.last_ms {
            Some(t) if now > t => ((now - t) as f32 / 1000.0).min(10.0),
            Some(_) => 0.0,
            None => 1.0,
        };
        self.last_ms = Some(now);
        dt
    }

    /// The configuration with the limits the BMS set.
    fn limited_config(&self) -> CoreConfig {
        let mut cfg = self.cfg;
        cfg.cdu.max_setpoint_c = self.setpoint_ceiling_c;
        cfg.margins.plan_ceiling_c += self.plan_offset_k;
        cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::RackIndex;

    /// Steps a steady hall of 16 hosts for `secs` seconds.
    fn settle(core: &mut Core, from_s: u64, secs: u64) -> Commands {
        let mut hosts = [None; MAX_HOSTS];
        let mut last = None;
        for s in from_s..from_s + secs {
            let now = s * 1000;
            for h in hosts.iter_mut().take(16) {
                *h = Some(HostReport {
                    gpus: 8,
                    hottest_c: 65.0,
                    gpu_power_w: 8.0 * 500.0,
                    limit_w: 700.0,
                    slowdown: false,
                    at_ms: now,
                });
            }
            let sp = last.as_ref().map_or(25.0, |c: &Commands| c.setpoint_c);
            last = Some(core.step(&Inputs {
                now_ms: now,
                cdu: Some(CduReadings {
                    supply_c: Some(sp),
                    return_c: Some(sp + 8.0),
                    flow_lpm: Some(150.0),
                    facility_supply_c: Some(sp - 3.0),
                    pumps_running: [true, false],
                    it_w: Some(80_000.0),
                    facility_w: Some(88_000.0),
                    ..Default::default()
                }),
                ambient_c: Some(30.0),
                leaks: LeakInputs::DRY,
                cdu_taken: Taken::ALL,
                valves_held: 0,
                hosts: &hosts,
            }));
        }
        last.expect("at least one step")
    }

    /// One step of a steady hall with these pumps running.
    /// The CDU took every write but the pumps' (local mode at its panel).
    const PUMPS_REFUSED: Taken = Taken {
        all: false,
        pumps: false,
        ..Taken::ALL
    };

    fn step_with_pumps(core: &mut Core, s: u64, running: [bool; 2]) -> Commands {
        step_pumps_taken(core, s, running, Taken::ALL)
    }

    fn step_pumps_taken(core: &mut Core, s: u64, running: [bool; 2], taken: Taken) -> Commands {
        let hosts = [None; MAX_HOSTS];
        core.step(&Inputs {
            now_ms: s * 1000,
            cdu: Some(CduReadings {
                supply_c: Some(30.0),
                return_c: Some(38.0),
                flow_lpm: Some(192.0),
                facility_supply_c: Some(27.0),
                pumps_running: running,
                it_w: Some(80_000.0),
                facility_w: Some(88_000.0),
                ..Default::default()
            }),
            ambient_c: Some(20.0),
            leaks: LeakInputs::DRY,
            cdu_taken: taken,
            valves_held: 0,
            hosts: &hosts,
        })
    }

    /// The lead trips and the lag pump is asked, but the CDU (in local
    /// mode) refuses the pump writes: the lag pump it was never told to
    /// start is not taken for tripped, however long the refusal lasts;
    /// once a write that asks it goes in, it gets its start, and a pump
    /// that then does not close is a trip.
    #[test]
    fn a_lag_pump_the_cdu_was_never_told_to_start_is_not_tripped() {
        let mut core = Core::new(CoreConfig::default()).unwrap();
        for s in 0..30 {
            step_with_pumps(&mut core, s, [true, false]);
        }
        step_with_pumps(&mut core, 30, [false, false]);
        let c = step_with_pumps(&mut core, 31, [false, false]);
        assert_eq!(c.pump_on, [false, true], "the lag pump is asked");
        for s in 32..60 {
            let c = step_pumps_taken(&mut core, s, [false, false], PUMPS_REFUSED);
            assert_eq!(c.pump_on, [false, true], "{s}");
        }
        assert_eq!(core.pumps_failed(), [true, false], "B was never told");
        // The write goes in: B gets its start, then a contactor that
        // stays open is a trip.
        for s in 60..63 {
            step_with_pumps(&mut core, s, [false, false]);
            assert_eq!(core.pumps_failed(), [true, false], "{s}");
        }
        for s in 63..66 {
            step_with_pumps(&mut core, s, [false, false]);
        }
        assert_eq!(core.pumps_failed(), [true, true]);
    }

    #[test]
    fn a_lead_pump_trip_starts_the_lag_pump_and_a_starting_pump_gets_time_to_close() {
        let mut core = Core::new(CoreConfig::default()).unwrap();
        for s in 0..30 {
            step_with_pumps(&mut core, s, [true, false]);
        }
        assert_eq!(core.mode().0, CduMode::Normal);
        // A's contactor opens: one read is not yet a trip, the second is.
        let c = step_with_pumps(&mut core, 30, [false, false]);
        assert_eq!(c.pump_on, [true, false]);
        let c = step_with_pumps(&mut core, 31, [false, false]);
        assert_eq!(c.pump_on, [false, true], "the lag pump takes over");
        assert!(c.events.iter().any(|e| matches!(
            e,
            Event::PumpTrip {
                pump: Pump::A,
                lag_started: true
            }
        )));
        // B's contactor takes two seconds to close: not a trip.
        for s in 32..34 {
            let c = step_with_pumps(&mut core, s, [false, false]);
            assert_eq!(c.pump_on, [false, true], "{s}");
        }
        for s in 34..40 {
            step_with_pumps(&mut core, s, [false, true]);
        }
        assert_eq!(core.pumps_failed(), [true, false]);
        // B trips too: both are asked, never neither.
        step_with_pumps(&mut core, 40, [false, false]);
        let c = step_with_pumps(&mut core, 41, [false, false]);
        assert_eq!(core.pumps_failed(), [true, true]);
        assert_eq!(c.pump_on, [true, true]);
        // A still shows its fault: it stays out. Repaired, it leads again.
        assert_eq!(
            core.clear_pump(Pump::A, true),
            Err("the CDU still reports the pump's fault")
        );
        core.clear_pump(Pump::A, false).unwrap();
        let c = step_with_pumps(&mut core, 42, [true, false]);
        assert_eq!(c.pump_on, [true, false]);
    }

    /// The CDU refuses the setpoint (outside its own range) but takes the
    /// speed: the core judges its sensors against the speed it runs, and
    /// keeps the setpoint it last took; a mode says writes are refused.
    #[test]
    fn a_refused_setpoint_leaves_the_speed_that_went_in_applied() {
        let mut core = Core::new(CoreConfig::default()).unwrap();
        settle(&mut core, 0, 30);
        let before = core.applied;
        let asked = (core.regulator.setpoint_c(), core.regulator.speed());
        assert_ne!(before.1, asked.1, "the speed moves: {before:?} {asked:?}");
        assert_ne!(
            before.0, asked.0,
            "the setpoint moves: {before:?} {asked:?}"
        );
        let hosts = [None; MAX_HOSTS];
        let taken = Taken {
            all: false,
            setpoint: false,
            ..Taken::ALL
        };
        core.step(&Inputs {
            now_ms: 30_000,
            cdu: Some(CduReadings {
                supply_c: Some(25.0),
                return_c: Some(33.0),
                flow_lpm: Some(150.0),
                pumps_running: [true, false],
                ..Default::default()
            }),
            ambient_c: Some(30.0),
            leaks: LeakInputs::DRY,
            cdu_taken: taken,
            valves_held: 0,
            hosts: &hosts,
        });
        assert_eq!(core.applied, (before.0, asked.1));
        // Neither went in: both stay as they were.
        let kept = core.applied;
        core.step(&Inputs {
            now_ms: 31_000,
            cdu: None,
            ambient_c: Some(30.0),
            leaks: LeakInputs::DRY,
            cdu_taken: Taken::NONE,
            valves_held: 0,
            hosts: &hosts,
        });
        assert_eq!(core.applied, kept);
    }

    #[test]
    fn the_bms_setpoint_ceiling_bounds_what_the_cdu_is_asked() {
        let mut core = Core::new(CoreConfig::default()).unwrap();
        let free = settle(&mut core, 0, 600);
        assert!(free.setpoint_c > 32.0, "{}", free.setpoint_c);
        core.set_limits(30.0, 0.0);
        let bounded = settle(&mut core, 600, 120);
        assert!(bounded.setpoint_c <= 30.0 + 1e-3, "{}", bounded.setpoint_c);
        assert_eq!(core.limits(), (30.0, 0.0));
        // Out-of-range limits are held within what the CDU accepts, and
        // the plan ceiling may only be tightened.
        core.set_limits(80.0, 5.0);
        assert_eq!(core.limits(), (45.0, 0.0));
        core.set_limits(f32::NAN, -3.0);
        assert_eq!(core.limits(), (45.0, -3.0));
    }

    /// A steady hall the tests change one reading at a time.
    #[derive(Clone)]
    struct Hall {
        cdu: CduReadings,
        leaks: LeakInputs,
        hottest_c: f32,
        ambient_c: Option<f32>,
        answers: bool,
        /// Hosts whose agents report nothing, bit n = host n.
        silent: HostMask,
        /// What of the last step's writes the CDU took.
        taken: Taken,
    }

    impl Hall {
        fn new() -> Self {
            Self {
                cdu: CduReadings {
                    supply_c: Some(30.0),
                    return_c: Some(38.0),
                    flow_lpm: Some(192.0),
                    facility_supply_c: Some(27.0),
                    pumps_running: [true, false],
                    diff_pressure_kpa: Some(100.0),
                    valves_closed: Some(0),
                    it_w: Some(80_000.0),
                    facility_w: Some(88_000.0),
                    ..Default::default()
                },
                leaks: LeakInputs::DRY,
                hottest_c: 60.0,
                ambient_c: Some(20.0),
                answers: true,
                silent: 0,
                taken: Taken::ALL,
            }
        }

        fn step(&self, core: &mut Core, s: u64) -> Commands {
            self.with_inputs(s, |i| core.step(i))
        }

        /// The hall's inputs at second `s`, to `f`.
        fn with_inputs<R>(&self, s: u64, f: impl FnOnce(&Inputs<'_>) -> R) -> R {
            let mut hosts = [None; MAX_HOSTS];
            let heard = hosts.iter_mut().enumerate().take(16);
            for (_, h) in heard.filter(|(n, _)| self.silent & (1 << n) == 0) {
                *h = Some(HostReport {
                    gpus: 8,
                    hottest_c: self.hottest_c,
                    gpu_power_w: 8.0 * 500.0,
                    limit_w: 700.0,
                    slowdown: false,
                    at_ms: s * 1000,
                });
            }
            // The pumps run as commanded unless a test says otherwise.
            f(&Inputs {
                now_ms: s * 1000,
                cdu: self.answers.then_some(self.cdu),
                ambient_c: self.ambient_c,
                leaks: self.leaks,
                cdu_taken: self.taken,
                valves_held: 0,
                hosts: &hosts,
            })
        }
    }

    /// A core as its `Debug` shows it: every field.
    fn shown(core: &Core) -> std::string::String {
        std::format!("{core:?}")
    }

    #[test]
    fn a_core_reset_in_place_is_the_core_new_or_restore_gives() {
        let cfg = CoreConfig::default();
        assert_eq!(shown(&Core::reference()), shown(&Core::new(cfg).unwrap()));
        let mut core = Core::new(cfg).unwrap();
        let mut hall = Hall::new();
        for s in 0..40 {
            hall.step(&mut core, s);
        }
        hall.leaks = LeakInputs::wet(0b0100);
        hall.cdu.valves_closed = Some(0b0100);
        hall.step(&mut core, 40);
        core.set_limits(30.0, -1.0);
        let latched = core.latched();
        assert_ne!(latched.leaks, 0);
        let mut other = cfg;
        other.cdu.max_setpoint_c = 40.0;
        core.reset(other, Some(&latched)).unwrap();
        assert_eq!(
            shown(&core),
            shown(&Core::restore(other, &latched).unwrap())
        );
        hall.step(&mut core, 41);
        core.reset(cfg, None).unwrap();
        assert_eq!(shown(&core), shown(&Core::new(cfg).unwrap()));
        // A configuration refused leaves the core as it was.
        hall.step(&mut core, 42);
        let before = shown(&core);
        let mut bad = cfg;
        bad.layout.racks = 0;
        assert!(core.reset(bad, None).is_err());
        assert_eq!(shown(&core), before);
    }

    /// The CDU refusing writes lights the beacon while a capacity cap
    /// stands (the mode's reason then says capacity-short, not the
    /// refused writes).
    /// Steps a new core in a hall whose CDU answers from second 0 with
    /// its pumps running, is silent over `silent`, then answers with its
    /// pumps stopped for 3 s (their start) before they run again; the
    /// pumps' faults at
    /// second `silent.end + 20`.
    fn pumps_after_silence(silent: core::ops::Range<u64>) -> [Option<PumpFault>; 2] {
        let mut core = Core::new(CoreConfig::default()).unwrap();
        let mut hall = Hall::new();
        for s in 0..silent.end + 20 {
            hall.answers = !silent.contains(&s);
            let starting = (silent.end..silent.end + 3).contains(&s);
            hall.cdu.pumps_running = [!starting, false];
            hall.step(&mut core, s);
        }
        core.pump_faults()
    }

    /// The CDU's controller restarts mid-run: silent 10 s, then its
    /// pumps start again within their 3 s: no trip.
    #[test]
    fn a_cdu_silent_then_starting_its_pumps_again_trips_no_pump() {
        assert_eq!(pumps_after_silence(30..40), [None, None]);
    }

    #[test]
    fn refused_writes_light_the_beacon_behind_a_capacity_cap() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let mut hall = Hall::new();
        hall.hottest_c = 86.0;
        let mut c = hall.step(&mut core, 0);
        for s in 1..60 {
            c = hall.step(&mut core, s);
        }
        assert_eq!(c.reason, ReasonCode::CAPACITY_SHORT, "{c:?}");
        assert!(!c.beacon);
        hall.taken = Taken::NONE;
        let c = hall.step(&mut core, 60);
        assert_eq!(c.reason, ReasonCode::CAPACITY_SHORT);
        assert!(c.beacon, "the CDU refuses writes");
    }

    #[test]
    fn commands_written_in_place_are_the_step_s_whatever_was_there() {
        let cfg = CoreConfig::default();
        let (mut by_value, mut in_place) = (Core::new(cfg).unwrap(), Core::new(cfg).unwrap());
        let mut hall = Hall::new();
        let mut out = Commands::UNSET;
        let mut capped = false;
        for s in 0..120 {
            if s == 50 {
                hall.leaks = LeakInputs::wet(0b0001);
                hall.cdu.valves_closed = Some(0b0001);
            }
            // Repaired at 80; cleared once a step has read it dry.
            if s == 80 {
                hall.leaks = LeakInputs::DRY;
            }
            if s == 82 {
                in_place.clear_leak(0, &LeakInputs::DRY).unwrap();
                by_value.clear_leak(0, &LeakInputs::DRY).unwrap();
                hall.cdu.valves_closed = Some(0);
            }
            let c = hall.step(&mut by_value, s);
            hall.with_inputs(s, |i| in_place.step_into(i, &mut out));
            assert_eq!(out, c, "step {s}");
            capped |= c.caps.iter().any(Option::is_some);
        }
        assert!(capped, "caps were set, and lifted over them");
        assert!(out.caps.iter().all(Option::is_none));
    }

    /// A CDU that refuses the pump writes from the first step (its panel
    /// in local mode) still has a seizure of the pump it runs judged:
    /// a pump running without flow is seized whoever started it.
    #[test]
    fn a_seizure_is_judged_while_the_cdu_refuses_the_pump_writes() {
        let mut core = Core::new(CoreConfig::default()).unwrap();
        let mut hall = Hall::new();
        hall.taken = PUMPS_REFUSED;
        for s in 0..60 {
            hall.step(&mut core, s);
        }
        hall.cdu.flow_lpm = Some(2.0);
        hall.cdu.diff_pressure_kpa = Some(1.0);
        for s in 60..70 {
            hall.step(&mut core, s);
        }
        assert_eq!(core.pump_faults(), [Some(PumpFault::Seized), None]);
    }

    /// The CDU restarts and comes back in local mode, refusing the pump
    /// writes and running B by itself: A, told before the restart, is
    /// not taken for tripped; once the CDU takes the writes again, A
    /// gets its start and a contactor that stays open is a trip.
    #[test]
    fn a_lead_told_before_the_cdu_restarted_is_told_again_before_a_trip() {
        let mut core = Core::new(CoreConfig::default()).unwrap();
        let mut hall = Hall::new();
        for s in 0..30 {
            hall.step(&mut core, s);
        }
        hall.answers = false;
        for s in 30..40 {
            hall.step(&mut core, s);
        }
        (hall.answers, hall.cdu.pumps_running) = (true, [false, true]);
        hall.taken = PUMPS_REFUSED;
        for s in 40..60 {
            hall.step(&mut core, s);
        }
        assert_eq!(core.pumps_failed(), [false, false], "A was not asked since");
        hall.taken = Taken::ALL;
        for s in 60..63 {
            hall.step(&mut core, s);
        }
        assert_eq!(core.pumps_failed(), [false, false], "A's start");
        for s in 63..67 {
            hall.step(&mut core, s);
        }
        assert_eq!(core.pumps_failed(), [true, false]);
    }

    #[test]
    fn a_seized_lead_pump_hands_over_within_seconds_and_a_lying_flow_sensor_does_not() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let mut hall = Hall::new();
        for s in 0..60 {
            hall.step(&mut core, s);
        }
        // A seizes: its contactor stays closed, flow and pressure fall.
        hall.cdu.flow_lpm = Some(2.0);
        hall.cdu.diff_pressure_kpa = Some(1.0);
        let mut switched = None;
        for s in 60..70 {
            let c = hall.step(&mut core, s);
            if c.pump_on == [false, true] && switched.is_none() {
                switched = Some(s);
                hall.cdu.pumps_running = [false, true];
                assert!(c.events.iter().any(|e| matches!(
                    e,
                    Event::PumpSeized {
                        pump: Pump::A,
                        lag_started: true
                    }
                )));
            }
        }
        assert_eq!(switched, Some(63), "3 s of no flow on two witnesses");
        assert_eq!(core.pump_faults(), [Some(PumpFault::Seized), None]);
        // On another core, only the flow reading falls: the pressure says
        // the water moves, so no pump is failed for it.
        let mut core = Core::new(cfg).unwrap();
        let mut hall = Hall::new();
        for s in 0..60 {
            hall.step(&mut core, s);
        }
        hall.cdu.flow_lpm = Some(2.0);
        for s in 60..200 {
            let c = hall.step(&mut core, s);
            assert_eq!(c.pump_on, [true, false], "{s}");
        }
        assert!(
            core.sensor_fault(Which::Flow).is_some(),
            "the flow sensor is at fault"
        );
        // Without a pressure reading, the GPUs heating confirms it.
        let mut core = Core::new(cfg).unwrap();
        let mut hall = Hall::new();
        hall.cdu.diff_pressure_kpa = None;
        for s in 0..60 {
            hall.step(&mut core, s);
        }
        hall.cdu.flow_lpm = Some(0.0);
        let mut lead_b = None;
        for s in 60..75 {
            hall.hottest_c = 60.0 + (s - 60) as f32;
            if hall.step(&mut core, s).pump_on == [false, true] && lead_b.is_none() {
                lead_b = Some(s);
            }
        }
        assert_eq!(lead_b, Some(63));
    }

    #[test]
    fn a_seizure_behind_a_stuck_flow_sensor_is_found_from_pressure_and_temperatures() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let mut hall = Hall::new();
        for s in 0..60 {
            hall.step(&mut core, s);
        }
        // A seizes; the flow sensor, stuck, still reads the flow it had.
        // The pressure falls and the return water no longer brings the
        // racks' heat back.
        hall.cdu.diff_pressure_kpa = Some(0.0);
        hall.cdu.return_c = hall.cdu.supply_c;
        let mut lead_b = None;
        for s in 60..75 {
            if hall.step(&mut core, s).pump_on == [false, true] && lead_b.is_none() {
                lead_b = Some(s);
            }
        }
        assert_eq!(lead_b, Some(63), "3 s of no flow, witnessed by the loop");
        // The pressure sensor alone failing low, the loop still carrying
        // its heat: no pump is failed for it.
        let mut core = Core::new(cfg).unwrap();
        let mut hall = Hall::new();
        for s in 0..60 {
            hall.step(&mut core, s);
        }
        hall.cdu.diff_pressure_kpa = Some(0.0);
        for s in 60..400 {
            assert_eq!(hall.step(&mut core, s).pump_on, [true, false], "{s}");
        }
        assert_eq!(core.pump_faults(), [None, None]);
    }

    #[test]
    fn a_relatch_keeps_what_the_bms_set_and_what_was_learned() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        core.set_limits(30.0, -2.0);
        let learned = core.learned();
        core.latch_racks(0b0010);
        assert_eq!(core.limits(), (30.0, -2.0));
        assert_eq!(core.leaks_latched(), 0b0010);
        assert_eq!(core.learned(), learned);
        let hall = Hall::new();
        let c = hall.step(&mut core, 0);
        assert_eq!(c.valves_open & 0b0010, 0, "the latched rack stays shut");
    }

    #[test]
    fn a_restored_core_keeps_its_valves_shut_and_never_leads_with_a_failed_pump() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let mut hall = Hall::new();
        for s in 0..30 {
            hall.step(&mut core, s);
        }
        hall.leaks = LeakInputs::wet(0b0100);
        hall.cdu.valves_closed = Some(0b0100);
        hall.step(&mut core, 30);
        hall.cdu.pumps_running = [false, false];
        hall.step(&mut core, 31);
        let c = hall.step(&mut core, 32);
        assert_eq!(c.pump_on, [false, true]);
        let latched = core.latched();
        assert_eq!((latched.leaks, latched.lead), (0b0100, Pump::B));
        assert_eq!(latched.pumps, [Some(PumpFault::Tripped), None]);
        // The controller restarts: the rope has dried meanwhile.
        let bytes = latched.encode();
        let mut core = Core::restore(cfg, &Latched::decode(&bytes).unwrap()).unwrap();
        hall.leaks = LeakInputs::DRY;
        hall.cdu.pumps_running = [false, true];
        let c = hall.step(&mut core, 0);
        assert_eq!(c.valves_open, 0b1011, "the valve stays shut");
        assert_eq!(c.pump_on, [false, true], "B leads");
        assert!(c.events.iter().any(|e| matches!(
            e,
            Event::ControllerRestored {
                leaks_latched: 0b0100,
                pumps_out: 0b01,
                lead: Pump::B
            }
        )));
        for s in 1..120 {
            let c = hall.step(&mut core, s);
            assert_eq!((c.valves_open, c.pump_on), (0b1011, [false, true]), "{s}");
        }
        // Cleared by an operator, with the rope dry and supervised.
        core.clear_leak(2, &LeakInputs::DRY).unwrap();
        assert_eq!(hall.step(&mut core, 120).valves_open, 0b1111);
    }

    /// Restarted with the flow sensor lost (the pump curve standing in):
    /// the core does not wait in boot for a sensor that cannot clear, and
    /// a trip then is handed over as after any boot.
    #[test]
    fn a_core_restored_with_a_lost_sensor_leaves_boot_degraded_and_hands_over_a_trip() {
        let cfg = CoreConfig::default();
        let lost_flow = Latched {
            sensors: [None, None, Some(SensorFault::Lost), None],
            ..Latched::default()
        };
        let mut core = Core::restore(cfg, &lost_flow).unwrap();
        let mut hall = Hall::new();
        hall.cdu.flow_lpm = None;
        let mut c = hall.step(&mut core, 0);
        for s in 1..30 {
            c = hall.step(&mut core, s);
        }
        assert_eq!(
            (c.mode, c.reason),
            (CduMode::Degraded, ReasonCode::SENSOR_ESTIMATED)
        );
        // The lead's contactor opens: the lag pump takes over.
        hall.cdu.pumps_running = [false, false];
        let handed = (30..33).any(|s| hall.step(&mut core, s).pump_on == [false, true]);
        assert!(handed, "the lag pump started within 3 s");
        assert_eq!(core.pump_faults(), [Some(PumpFault::Tripped), None]);
        // A first start with the flow sensor dead leaves boot alike.
        let mut core = Core::new(cfg).unwrap();
        hall.cdu.pumps_running = [true, false];
        for s in 0..30 {
            c = hall.step(&mut core, s);
        }
        assert_eq!(
            (c.mode, c.reason),
            (CduMode::Degraded, ReasonCode::SENSOR_ESTIMATED)
        );
    }

    /// A board that boots before the CDU's controller: the lead's start
    /// counts from the CDU's first answer, not from the first step, so a
    /// contactor that closes within its 3 s is no trip.
    #[test]
    fn the_leads_start_counts_from_the_cdus_first_answer() {
        // Silent 2 s only (under the 3 s a silence restarts the window).
        assert_eq!(pumps_after_silence(0..2), [None, None]);
    }

    #[test]
    fn a_valve_that_does_not_confirm_stops_both_pumps_and_caps_every_host() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let mut hall = Hall::new();
        for s in 0..30 {
            hall.step(&mut core, s);
        }
        // Rack 3 leaks; its valve stays open whatever it is told.
        hall.leaks = LeakInputs::wet(0b1000);
        for s in 30..35 {
            let c = hall.step(&mut core, s);
            assert_eq!(c.pump_on, [true, false], "{s}");
            assert_eq!(c.valves_open, 0b0111);
        }
        let c = hall.step(&mut core, 35);
        assert_eq!(c.pump_on, [false, false], "escalated after 5 s");
        assert_eq!(
            (c.mode, c.reason),
            (CduMode::Failsafe, ReasonCode::ISOLATION_FAILED)
        );
        assert_eq!(c.cooling_lost, 0b1111);
        assert!(c.beacon);
        for h in 0..16 {
            assert_eq!(c.caps[h].map(|c| c.watts), Some(cfg.gpu.min_cap_w), "{h}");
        }
        // The pumps stopped on purpose: no trip is read into it.
        hall.cdu.pumps_running = [false, false];
        for s in 36..60 {
            hall.step(&mut core, s);
        }
        assert_eq!(core.pumps_failed(), [false, false]);
        // The valve is freed and confirms closed for 5 s without a break:
        // the other racks are fed.
        hall.cdu.valves_closed = Some(0b1000);
        for s in 60..65 {
            assert_eq!(hall.step(&mut core, s).pump_on, [false, false], "{s}");
        }
        let c = hall.step(&mut core, 65);
        assert_eq!((c.pump_on, c.cooling_lost), ([true, false], 0b1000));
    }

    /// A valve position input found lying before a restart is not
    /// believed after it: its "closed" confirms no isolation, and the
    /// pumps stay stopped for the leak behind it.
    #[test]
    fn a_lying_valve_input_is_remembered_across_a_restart() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let mut hall = Hall::new();
        for s in 0..30 {
            hall.step(&mut core, s);
        }
        // Rack 1's input sticks at "closed" while its valve is open.
        hall.cdu.valves_closed = Some(0b0010);
        for s in 30..40 {
            hall.step(&mut core, s);
        }
        assert_eq!(core.valve_feedback_faults(), 0b0010);
        // Rack 1 leaks, its valve seized open: the escalation stops the
        // pumps.
        hall.leaks = LeakInputs::wet(0b0010);
        for s in 40..46 {
            hall.step(&mut core, s);
        }
        assert_eq!(core.isolation_failed(), 0b0010);
        let bytes = core.latched().encode();
        let mut core = Core::restore(cfg, &Latched::decode(&bytes).unwrap()).unwrap();
        hall.cdu.pumps_running = [false, false];
        for s in 0..30 {
            let c = hall.step(&mut core, s);
            assert_eq!(
                (c.isolation_failed, c.pump_on),
                (0b0010, [false, false]),
                "{s}"
            );
            assert_eq!(c.valve_feedback_faults, 0b0010, "{s}");
        }
    }

    /// Every host learned but one: the plan ceiling stays where that
    /// one's trust holds it, whether its agent reports or not (the
    /// optimiser plans for it either way, and a silent host's GPUs are
    /// seen by neither the margin loop nor the caps).
    #[test]
    fn a_host_that_stops_reporting_still_holds_the_plan_ceiling_to_its_trust() {
        let cfg = CoreConfig::default();
        let learned = |unlearned: Option<usize>| {
            let mut l = Learned::new(&cfg);
            for (h, s) in l.hosts.iter_mut().enumerate().take(16) {
                let trusted = Some(h) != unlearned;
                s.trust = if trusted { 1.0 } else { 0.0 };
                s.fed_s = if trusted { 3_600.0 } else { 0.0 };
            }
            l
        };
        // `silent` report for the first 10 s only when `heard_first`, else
        // never (a slot of the layout no host fills).
        let ceiling = |l: &Learned, silent: HostMask, heard_first: bool| {
            let mut core = Core::new(cfg).unwrap();
            core.restore_learned(l).unwrap();
            let mut hall = Hall::new();
            for s in 0..20 {
                hall.silent = if heard_first && s < 10 { 0 } else { silent };
                hall.step(&mut core, s);
            }
            core.believed().margins.plan_ceiling_c
        };
        let base = cfg.margins.plan_ceiling_c;
        let unlearned_5 = learned(Some(5));
        assert!(
            ceiling(&learned(None), 0, false) > base + 1.0,
            "all learned"
        );
        assert_eq!(ceiling(&unlearned_5, 0, false), base, "host 5 reports");
        assert_eq!(ceiling(&unlearned_5, 1 << 5, true), base, "host 5 silent");
        assert!(
            ceiling(&unlearned_5, 1 << 5, false) > base + 1.0,
            "slot 5 never filled: not planned for"
        );
    }

    #[test]
    fn a_cut_rope_is_reported_and_sounds_the_alarm_but_keeps_the_rack_cooled() {
        let mut core = Core::new(CoreConfig::default()).unwrap();
        let mut hall = Hall::new();
        for s in 0..30 {
            hall.step(&mut core, s);
        }
        hall.leaks.rope_faults = 0b0001;
        let c = hall.step(&mut core, 30);
        assert_eq!(
            (c.sensing_lost, c.valves_open, c.cooling_lost),
            (0b0001, 0b1111, 0)
        );
        assert!(c.beacon);
        assert!(c.events.contains(&Event::LeakSensing {
            rack: RackIndex::new(0).unwrap(),
            lost: true
        }));
    }

    #[test]
    fn implausible_or_stale_host_reports_are_not_believed() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let mut hall = Hall::new();
        hall.hottest_c = 500.0;
        for s in 0..120 {
            let c = hall.step(&mut core, s);
            assert!(
                c.caps.iter().all(|c| c.is_none()),
                "{s}: no cap from a mad report"
            );
            assert!(!c.beacon, "{s}: no alarm from a mad report");
        }
        // A report 16 s old is stale: a host at 90 °C that stopped
        // reporting is not capped from it, nor held as the hottest.
        let mut core = Core::new(cfg).unwrap();
        let mut hosts = [None; MAX_HOSTS];
        hosts[0] = Some(HostReport {
            gpus: 8,
            hottest_c: 90.0,
            gpu_power_w: 5600.0,
            limit_w: 700.0,
            slowdown: false,
            at_ms: 0,
        });
        let c = core.step(&Inputs {
            now_ms: 16_000,
            cdu: Some(Hall::new().cdu),
            ambient_c: Some(20.0),
            leaks: LeakInputs::DRY,
            cdu_taken: Taken::ALL,
            valves_held: 0,
            hosts: &hosts,
        });
        assert!(!c.beacon && c.caps[0].is_none());
    }

    #[test]
    fn a_step_forward_integrates_at_most_ten_seconds() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let hall = Hall::new();
        // Normal, and the setpoint warming at its slew.
        let mut last = hall.step(&mut core, 0);
        for s in 1..60 {
            last = hall.step(&mut core, s);
        }
        assert_eq!(last.mode, CduMode::Normal);
        let next = hall.step(&mut core, 60);
        assert!(next.setpoint_c > last.setpoint_c, "warming");
        // The clock jumps an hour forward: 10 s of slew at most.
        let jumped = hall.step(&mut core, 3_661);
        let ten_s = cfg.margins.setpoint_rise_k_per_min * 10.0 / 60.0;
        assert!(
            jumped.setpoint_c - next.setpoint_c <= ten_s + 1e-3,
            "{} -> {}",
            next.setpoint_c,
            jumped.setpoint_c
        );
    }

    #[test]
    fn a_clock_step_back_or_forward_changes_no_verdict() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let hall = Hall::new();
        for s in 0..120 {
            hall.step(&mut core, s);
        }
        let before = hall.step(&mut core, 120);
        assert_eq!(before.mode, CduMode::Normal);
        // The clock jumps back an hour, then forward a day: no panic, no
        // new fault, no latch, the same mode and pumps.
        for s in (0..60).map(|k| 10 + k).chain((0..60).map(|k| 86_400 + k)) {
            let c = hall.step(&mut core, s);
            assert_eq!(
                (c.mode, c.pump_on, c.valves_open),
                (before.mode, before.pump_on, 0b1111),
                "{s}"
            );
            assert!(c.events.is_empty(), "{s}: {:?}", c.events);
        }
        assert_eq!(core.latched(), Latched::default());
    }

    #[test]
    fn a_lost_outdoor_reading_plans_for_the_design_day_and_changes_no_verdict() {
        let cfg = CoreConfig::default();
        let (mut known, mut lost) = (Core::new(cfg).unwrap(), Core::new(cfg).unwrap());
        let mut hall = Hall::new();
        for s in 0..600 {
            hall.ambient_c = Some(20.0);
            let a = hall.step(&mut known, s);
            hall.ambient_c = None;
            let b = hall.step(&mut lost, s);
            assert_eq!(
                (a.mode, a.pump_on, a.valves_open),
                (b.mode, b.pump_on, b.valves_open),
                "{s}"
            );
            assert!(b.caps.iter().all(|c| c.is_none()), "{s}");
        }
        // Planned for 35 °C outdoors: a different plan (warmer water
        // rejects more on a hot day), every GPU still within the plan
        // ceiling; only the energy differs.
        let (a, b) = (known.loops().proposal, lost.loops().proposal);
        assert!(a.feasible && b.feasible, "{a:?} {b:?}");
    }

    #[test]
    fn a_lost_supply_sensor_is_stood_in_for_by_the_gpus_and_failsafe_needs_every_estimate_gone() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let mut hall = Hall::new();
        for s in 0..120 {
            hall.step(&mut core, s);
        }
        assert_eq!(core.mode().0, CduMode::Normal);
        // The supply's 4–20 mA loop breaks: the GPUs say what it is.
        hall.cdu.supply_c = None;
        let mut c = hall.step(&mut core, 120);
        for s in 121..140 {
            c = hall.step(&mut core, s);
        }
        assert_eq!(core.sensor_fault(Which::Supply), Some(SensorFault::Lost));
        assert_eq!(
            (c.mode, c.reason),
            (CduMode::Degraded, ReasonCode::SENSOR_ESTIMATED)
        );
        assert!(c.beacon, "a sensor stood in for is still an alarm");
        // The return goes too: the GPUs still stand in for the supply,
        // and the heat balance on it for the return.
        hall.cdu.return_c = None;
        for s in 140..160 {
            c = hall.step(&mut core, s);
        }
        assert_eq!(
            (c.mode, c.reason),
            (CduMode::Degraded, ReasonCode::SENSOR_ESTIMATED)
        );
        // No GPU speaks any more (reports stop), nothing stands in for the
        // supply: failsafe, pumps at full.
        let silent = [None; MAX_HOSTS];
        for s in 160..200 {
            c = core.step(&Inputs {
                now_ms: s * 1000,
                cdu: Some(hall.cdu),
                ambient_c: Some(20.0),
                leaks: LeakInputs::DRY,
                cdu_taken: Taken::ALL,
                valves_held: 0,
                hosts: &silent,
            });
        }
        assert_eq!(
            (c.mode, c.reason),
            (CduMode::Failsafe, ReasonCode::SENSOR_LOST)
        );
        assert_eq!(c.pump_speed, 1.0);
    }

    /// A CDU gone to failsafe offers no caps to the hall and no warmer
    /// water than its failsafe setpoint holds.
    #[test]
    fn a_cdu_in_failsafe_offers_no_caps_and_no_warmer_water_than_it_holds() {
        let mut cfg = CoreConfig::default();
        cfg.facility.cdus = 2;
        // A ceiling the hall's GPUs reach below the warmest water: caps
        // are offered past the accept.
        cfg.margins.plan_ceiling_c = 70.0;
        let mut core = Core::new(cfg).unwrap();
        let mut hall = Hall::new();
        for s in 0..200 {
            hall.step(&mut core, s);
        }
        let searched = core.offer().expect("an offer after the first searches");
        assert!(searched.points > 0, "{searched:?}");
        // The CDU stops answering: failsafe.
        hall.answers = false;
        let mut c = hall.step(&mut core, 200);
        for s in 201..260 {
            c = hall.step(&mut core, s);
        }
        assert_eq!(c.mode, CduMode::Failsafe);
        let held = core.offer().expect("the last offer stands");
        assert_eq!(held.points, 0, "{held:?}");
        assert!(
            held.accept_c <= c.setpoint_c - cfg.cdu.approach_k + 1e-3,
            "{held:?} {c:?}"
        );
        assert_eq!(held.heat_w, searched.heat_w, "its last heat still counts");
    }

    #[test]
    fn a_lost_flow_sensor_is_stood_in_for_by_the_pump_curve() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let mut hall = Hall::new();
        for s in 0..120 {
            hall.step(&mut core, s);
        }
        hall.cdu.flow_lpm = None;
        let mut c = hall.step(&mut core, 120);
        for s in 121..140 {
            c = hall.step(&mut core, s);
        }
        assert_eq!(core.sensor_fault(Which::Flow), Some(SensorFault::Lost));
        assert_eq!(
            (c.mode, c.reason),
            (CduMode::Degraded, ReasonCode::SENSOR_ESTIMATED)
        );
        assert!(c.pump_speed < 1.0, "no failsafe speed: {}", c.pump_speed);
    }

    #[test]
    fn no_outdoor_reading_for_a_minute_is_an_alarm_and_a_reading_clears_it() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let mut hall = Hall::new();
        let outdoor_events = |c: &Commands| {
            c.events
                .iter()
                .filter_map(|e| match e {
                    Event::SensorFault {
                        sensor: loopwarden_protocol::message::Sensor::OutdoorTemp,
                        fault,
                        ..
                    } => Some(*fault),
                    _ => None,
                })
                .collect::<std::vec::Vec<_>>()
        };
        for s in 0..100 {
            assert!(outdoor_events(&hall.step(&mut core, s)).is_empty(), "{s}");
        }
        assert_eq!(core.outdoor(), (20.0, false));
        hall.ambient_c = None;
        let mut seen = std::vec::Vec::new();
        for s in 100..170 {
            seen.extend(outdoor_events(&hall.step(&mut core, s)));
        }
        assert_eq!(seen, [SensorFault::Lost]);
        assert_eq!(core.outdoor(), (cfg.margins.design_ambient_c, true));
        hall.ambient_c = Some(18.0);
        let c = hall.step(&mut core, 170);
        assert_eq!(outdoor_events(&c), [SensorFault::Cleared]);
        assert_eq!(core.outdoor(), (18.0, false));
    }

    #[test]
    fn a_leak_while_the_cdu_is_silent_caps_and_powers_down_every_host() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let mut hall = Hall::new();
        for s in 0..30 {
            hall.step(&mut core, s);
        }
        // Modbus is out; rack 1's rope (a board input) fires.
        hall.answers = false;
        hall.leaks = LeakInputs::wet(0b0010);
        let c = hall.step(&mut core, 30);
        assert_eq!((c.valves_open, c.cooling_lost), (0b1101, 0b0010));
        for h in 4..8 {
            assert_eq!(c.caps[h].map(|c| c.watts), Some(cfg.gpu.min_cap_w));
        }
        // No position can come back: after 5 s every host is capped and
        // told its cooling is lost, and the pumps are ordered off for
        // when the CDU hears again.
        for s in 31..35 {
            hall.step(&mut core, s);
        }
        let c = hall.step(&mut core, 35);
        assert_eq!(
            (c.cooling_lost, c.pump_on, c.isolation_failed),
            (0b1111, [false, false], 0b0010)
        );
        assert!((0..16).all(|h| c.caps[h].map(|c| c.watts) == Some(cfg.gpu.min_cap_w)));
        assert!(c.beacon);
    }
}
