//! The control core: one CDU's safety, regulation, optimisation and cap
//! coordination as a pure function of what it reads and the time passed
//! in: `Core::step(&Inputs) -> Commands`. No clock, no socket, no heap; it
//! builds for a Cortex-M4F.
//!
//! Each step runs the layers in order of authority; a later layer works
//! inside what an earlier one allows:
//! 1. **safety**: leaks (close the rack's valve at once, cap its hosts to
//!    their minimum, tell them their cooling is lost), pump trips (start
//!    the lag pump), sensor supervision (see [`sensors`]) and the mode
//!    `boot → normal ⇄ degraded → failsafe`. It boots with the pumps on
//!    and a conservative setpoint, and leaves boot only when every
//!    required sensor has read plausibly for `boot_settle_ms`.
//! 2. **regulation**: a margin loop lowers the setpoint while the hottest
//!    GPU runs above the plan ceiling; a supply loop trims the setpoint the
//!    CDU is given so the measured supply meets the target; a flow loop
//!    does the same for the pump speed. PI with anti-windup, output and
//!    slew limits (warming and slowing are slewed, cooling and speeding up
//!    are not).
//! 3. **optimisation**: a search over setpoint and pump speed for the least
//!    facility power per unit of GPU work at steady state, every GPU at or
//!    below the plan ceiling even at full demand (see [`optimise`]).
//! 4. **coordination**: when cooling falls short, a power cap per host
//!    sized from its GPUs' thermal margin at the coolant temperature to
//!    come; lifted when capacity has been back for `cap_release_ms`
//!    (see [`coordinate`]).
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
//!   until an operator clears it with the input dry.

pub mod config;
pub mod coordinate;
pub mod model;
pub mod optimise;
pub mod pid;
pub mod sensors;

use heapless::Vec;
use loopwarden_protocol::message::{CduMode, Event, Pump, SensorFault};
use loopwarden_protocol::{RackIndex, ReasonCode};

pub use config::{ConfigError, CoreConfig};
use coordinate::Coordinator;
use optimise::{HostPlan, Optimiser, Proposal};
use pid::{slew, Pi};
use sensors::{Observation, Supervisor, Which};

/// Racks the core can hold.
pub const MAX_RACKS: usize = 16;
/// Hosts the core can hold.
pub const MAX_HOSTS: usize = 64;
/// Events one step can report.
pub const MAX_EVENTS: usize = 16;
/// A pump commanded on gets this long for its contactor to close, ms.
const PUMP_START_MS: u64 = 3_000;
/// The lead pump's contactor must read open this long to be a trip, ms
/// (two reads at a 1 s period).
const PUMP_CONFIRM_MS: u64 = 1_000;

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
    /// Leak inputs from the board, bit n = rack n.
    pub leaks: u16,
    /// The last report of each host, by host index (rack-major).
    pub hosts: &'a [Option<HostReport>],
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
    mode: CduMode,
    reason: ReasonCode,
    since_ms: u64,
    boot_ok_since: Option<u64>,
    sensors: Supervisor,
    leaks_latched: u16,
    leaks_seen: u16,
    lead: usize,
    lead_since_ms: u64,
    lead_missing_since: Option<u64>,
    pump_failed: [bool; 2],
    setpoint_c: f32,
    speed: f32,
    last_good_setpoint_c: f32,
    transient_until_ms: u64,
    it_filtered: Option<f32>,
    offsets: [f32; MAX_HOSTS],
    optimiser: Optimiser,
    margin: Pi,
    supply_trim: Pi,
    flow_trim: Pi,
    short_since: Option<u64>,
    supply_prev: Option<f32>,
    supply_rate: f32,
    tracking_since: Option<u64>,
    rejection_short: bool,
    coordinator: Coordinator,
    setpoint_ceiling_c: f32,
    plan_offset_k: f32,
    cdu_seen_ms: Option<u64>,
    events_dropped: u32,
}

fn bit(mask: u16, i: usize) -> bool {
    i < 16 && mask & (1 << i) != 0
}

fn median(values: &mut [f32]) -> Option<f32> {
    if values.is_empty() {
        return None;
    }
    // Insertion sort: at most MAX_HOSTS values.
    for i in 1..values.len() {
        let mut j = i;
        while j > 0 && values[j - 1] > values[j] {
            values.swap(j - 1, j);
            j -= 1;
        }
    }
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        0.5 * (values[n / 2 - 1] + values[n / 2])
    })
}

impl Core {
    /// A core for `cfg`, booting.
    pub fn new(cfg: CoreConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let boot = cfg.margins.boot_setpoint_c;
        Ok(Self {
            cfg,
            last_ms: None,
            mode: CduMode::Boot,
            reason: ReasonCode::BOOTING,
            since_ms: 0,
            boot_ok_since: None,
            sensors: Supervisor::default(),
            leaks_latched: 0,
            leaks_seen: 0,
            lead: 0,
            lead_since_ms: 0,
            lead_missing_since: None,
            pump_failed: [false; 2],
            setpoint_c: boot,
            speed: 1.0,
            last_good_setpoint_c: boot,
            transient_until_ms: 0,
            it_filtered: None,
            offsets: [0.0; MAX_HOSTS],
            optimiser: Optimiser::new(&cfg),
            margin: Pi::new(0.5, 0.01, 0.0, 20.0),
            supply_trim: Pi::new(0.0, 0.005, -2.0, 2.0),
            flow_trim: Pi::new(0.0, 0.002, -0.1, 0.1),
            short_since: None,
            supply_prev: None,
            supply_rate: 0.0,
            tracking_since: None,
            rejection_short: false,
            coordinator: Coordinator::default(),
            setpoint_ceiling_c: cfg.cdu.max_setpoint_c,
            plan_offset_k: 0.0,
            cdu_seen_ms: None,
            events_dropped: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    /// The mode, why, and since when (ms).
    pub fn mode(&self) -> (CduMode, ReasonCode, u64) {
        (self.mode, self.reason, self.since_ms)
    }

    /// The fault a sensor stands under.
    pub fn sensor_fault(&self, w: Which) -> Option<SensorFault> {
        self.sensors.fault(w)
    }

    /// Racks with a latched leak, bit n = rack n.
    pub fn leaks_latched(&self) -> u16 {
        self.leaks_latched
    }

    /// Pumps taken out of service by a trip.
    pub fn pumps_failed(&self) -> [bool; 2] {
        self.pump_failed
    }

    /// Events that did not fit in a step's list, since the start.
    pub fn events_dropped(&self) -> u32 {
        self.events_dropped
    }

    /// The loops' state.
    pub fn loops(&self) -> LoopStatus {
        LoopStatus {
            proposal: self.optimiser.proposal(),
            margin_k: self.margin.integral(),
            supply_trim_k: self.supply_trim.integral(),
            flow_trim: self.flow_trim.integral(),
            coolant_c: self.coordinator.coolant_c(),
            rejection_short: self.rejection_short,
        }
    }

    /// An operator clears rack `rack`'s latched leak; refused while its
    /// input still reads wet.
    pub fn clear_leak(&mut self, rack: usize, leaks_now: u16) -> Result<(), &'static str> {
        if rack >= self.cfg.layout.racks as usize {
            return Err("no such rack");
        }
        if bit(leaks_now, rack) {
            return Err("the rack's leak input still reads wet");
        }
        self.leaks_latched &= !(1 << rack);
        Ok(())
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

    /// An operator puts a tripped pump back in service.
    pub fn clear_pump_trip(&mut self, pump: Pump) {
        let i = pump as usize;
        self.pump_failed[i] = false;
        // A lead that has itself tripped hands over to the repaired pump.
        if self.pump_failed[self.lead] {
            self.lead = i;
            self.lead_since_ms = self.last_ms.unwrap_or(0);
            self.lead_missing_since = None;
        }
    }

    fn push(&mut self, events: &mut Vec<Event, MAX_EVENTS>, e: Event) {
        if events.push(e).is_err() {
            self.events_dropped = self.events_dropped.saturating_add(1);
        }
    }

    /// One step at `inp.now_ms`.
    pub fn step(&mut self, inp: &Inputs<'_>) -> Commands {
        let now = inp.now_ms;
        let dt = match self.last_ms {
            Some(t) if now > t => ((now - t) as f32 / 1000.0).min(10.0),
            Some(_) => 0.0,
            None => 1.0,
        };
        self.last_ms = Some(now);
        if self.cdu_seen_ms.is_none() && self.mode == CduMode::Boot {
            self.since_ms = now;
        }
        // The configuration with the limits the BMS set.
        let mut cfg = self.cfg;
        cfg.cdu.max_setpoint_c = self.setpoint_ceiling_c;
        cfg.margins.plan_ceiling_c += self.plan_offset_k;
        let lay = cfg.layout;
        let racks = lay.racks as usize;
        let hosts = lay.hosts();
        let per_rack_gpus = lay.hosts_per_rack as usize * lay.gpus_per_host as usize;
        let mut events: Vec<Event, MAX_EVENTS> = Vec::new();
        if inp.cdu.is_some() {
            self.cdu_seen_ms = Some(now);
        }
        let cdu = inp.cdu.unwrap_or_default();
        // Not a number is no reading.
        let reading = |x: Option<f32>| {
            if inp.cdu.is_some() {
                x.filter(|v| v.is_finite())
            } else {
                None
            }
        };

        // ---- safety: leaks (the board's inputs, not the CDU's).
        for r in 0..racks {
            let wet = bit(inp.leaks, r);
            let was = bit(self.leaks_seen, r);
            if wet && !was {
                self.leaks_latched |= 1 << r;
                if let Some(rack) = RackIndex::new(r as u8) {
                    self.push(&mut events, Event::Leak { rack, active: true });
                }
            } else if !wet && was {
                if let Some(rack) = RackIndex::new(r as u8) {
                    self.push(
                        &mut events,
                        Event::Leak {
                            rack,
                            active: false,
                        },
                    );
                }
            }
        }
        self.leaks_seen = inp.leaks & ((1u32 << racks) - 1) as u16;
        let all_racks = ((1u32 << racks) - 1) as u16;
        let valves_open = all_racks & !self.leaks_latched;
        let open_gpus = (valves_open.count_ones() as usize) * per_rack_gpus;

        // ---- safety: pumps. The lead pump commanded on for a while whose
        // contactor reads open on two reads running is tripped (a pump just
        // started gets its contactor the time to close).
        let lead_missing = inp.cdu.is_some()
            && !self.pump_failed[self.lead]
            && !cdu.pumps_running[self.lead]
            && self.mode != CduMode::Boot
            && now.saturating_sub(self.lead_since_ms) >= PUMP_START_MS;
        let tripped_now = if lead_missing {
            let since = *self.lead_missing_since.get_or_insert(now);
            now.saturating_sub(since) >= PUMP_CONFIRM_MS
        } else {
            self.lead_missing_since = None;
            false
        };
        if tripped_now {
            self.lead_missing_since = None;
            let tripped = self.lead;
            self.pump_failed[tripped] = true;
            let other = 1 - tripped;
            let lag_started = !self.pump_failed[other];
            if lag_started {
                self.lead = other;
                self.lead_since_ms = now;
            }
            let pump = if tripped == 0 { Pump::A } else { Pump::B };
            self.push(&mut events, Event::PumpTrip { pump, lag_started });
            self.transient_until_ms = now + 120_000;
        }
        let pump_on = if self.pump_failed[0] && self.pump_failed[1] {
            // Both tripped: ask both, never neither.
            [true, true]
        } else {
            [self.lead == 0, self.lead == 1]
        };
        let running = (pump_on[0] && cdu.pumps_running[0]) || (pump_on[1] && cdu.pumps_running[1]);

        // ---- what the readings should be, from the others.
        let it_w = reading(cdu.it_w).filter(|w| (0.0..=1.0e8).contains(w));
        if let Some(it) = it_w {
            let f = *self.it_filtered.get_or_insert(it);
            if (it - f).abs() > 0.05 * f.max(1000.0) {
                self.transient_until_ms = self.transient_until_ms.max(now + 120_000);
            }
            self.it_filtered = Some(f + (it - f) * (dt / 60.0).min(1.0));
        }
        let transient = now < self.transient_until_ms;
        let flow_trusted = self.sensors.trusted(Which::Flow, reading(cdu.flow_lpm));
        let expected_flow = if running && inp.cdu.is_some() {
            Some(cfg.cdu.design_lpm_per_gpu * lay.gpus() as f32 * self.speed)
        } else {
            None
        };
        let q_now = model::flow_per_gpu(&cfg, self.speed, open_gpus)
            .max(flow_trusted.map_or(0.0, |f| f / open_gpus.max(1) as f32));
        let r_now = cfg.gpu.r_jc_k_per_w + model::r_cold_plate(&cfg.gpu, q_now);
        let fresh = |h: usize| -> Option<HostReport> {
            let r = inp.hosts.get(h).copied().flatten()?;
            // A report no GPU could make is no report.
            let sane = (-20.0..=150.0).contains(&r.hottest_c)
                && (0.0..=1.0e5).contains(&r.gpu_power_w)
                && (0.0..=1.0e4).contains(&r.limit_w);
            let open = sane && bit(valves_open, lay.rack_of(h));
            (open && r.gpus > 0 && now.saturating_sub(r.at_ms) <= cfg.timing.host_timeout_ms)
                .then_some(r)
        };
        let mut implied = [0.0f32; MAX_HOSTS];
        let mut n_implied = 0;
        let mut hottest: Option<f32> = None;
        for h in 0..hosts {
            if let Some(r) = fresh(h) {
                hottest = Some(hottest.map_or(r.hottest_c, |t: f32| t.max(r.hottest_c)));
                let p = r.gpu_power_w / r.gpus as f32;
                if p > 150.0 {
                    implied[n_implied] = r.hottest_c - p * r_now - self.offsets[h];
                    n_implied += 1;
                }
            }
        }
        let gpu_implied_supply = if n_implied >= 2 {
            median(&mut implied[..n_implied])
        } else {
            None
        };
        let supply_trusted_prev = self.sensors.trusted(Which::Supply, reading(cdu.supply_c));
        let expected_return = match (supply_trusted_prev, flow_trusted, it_w) {
            (Some(s), Some(f), Some(it)) if f > 1.0 => {
                let m = f * cfg.cdu.density_kg_per_m3 / 60_000.0;
                Some(s + it / (m * cfg.cdu.cp_j_per_kg_k))
            }
            _ => None,
        };

        // ---- sensor supervision.
        let t = cfg.timing;
        let checks = [
            (Which::Supply, reading(cdu.supply_c), gpu_implied_supply),
            (Which::Return, reading(cdu.return_c), expected_return),
            (Which::Flow, reading(cdu.flow_lpm), expected_flow),
            (Which::FacilitySupply, reading(cdu.facility_supply_c), None),
        ];
        for (w, value, expected) in checks {
            let obs = Observation {
                reading: value,
                expected,
                transient,
            };
            if let Some(ch) = self.sensors.observe(w, now, dt, obs, &t) {
                self.push(
                    &mut events,
                    Event::SensorFault {
                        sensor: ch.which.sensor(),
                        rack: None,
                        fault: ch.fault,
                    },
                );
            }
        }
        let supply = self.sensors.trusted(Which::Supply, reading(cdu.supply_c));
        let flow = self.sensors.trusted(Which::Flow, reading(cdu.flow_lpm));

        // Learn how much hotter each host runs than the model says.
        if let (Some(s), false) = (supply, transient) {
            for h in 0..hosts {
                if let Some(r) = fresh(h) {
                    let p = r.gpu_power_w / r.gpus as f32;
                    let off = r.hottest_c - (s + p * r_now);
                    let o = &mut self.offsets[h];
                    *o = (*o + (off - *o) * (dt / 300.0).min(1.0)).clamp(-5.0, 15.0);
                }
            }
        }

        // Heat rejection short: the supply stays well above its setpoint
        // and is not coming down to it.
        if let Some(s) = supply {
            if let (Some(prev), true) = (self.supply_prev, dt > 0.0) {
                let rate = (s - prev) / dt;
                self.supply_rate += (rate - self.supply_rate) * (dt / 30.0).min(1.0);
            }
            self.supply_prev = Some(s);
            let cmd = self.setpoint_c;
            if s > cmd + 1.5 && self.supply_rate > -0.005 {
                let since = *self.short_since.get_or_insert(now);
                if now - since >= 120_000 && !self.rejection_short {
                    self.rejection_short = true;
                }
                self.tracking_since = None;
            } else if s < cmd + 0.5 {
                self.short_since = None;
                let since = *self.tracking_since.get_or_insert(now);
                if now - since >= 600_000 {
                    self.rejection_short = false;
                }
            }
        }

        // ---- mode.
        let cdu_ok = self
            .cdu_seen_ms
            .is_some_and(|s| now.saturating_sub(s) < t.sensor_timeout_ms);
        let sensors_ok = self.sensors.required_ok() && cdu_ok;
        let (mut mode, mut reason) = (self.mode, self.reason);
        if self.mode == CduMode::Boot {
            let plausible = sensors_ok
                && supply.is_some()
                && flow.is_some()
                && self
                    .sensors
                    .trusted(Which::Return, reading(cdu.return_c))
                    .is_some();
            if plausible {
                let since = *self.boot_ok_since.get_or_insert(now);
                if now - since >= t.boot_settle_ms {
                    mode = CduMode::Normal;
                    reason = ReasonCode::OK;
                }
            } else {
                self.boot_ok_since = None;
            }
        } else if !sensors_ok {
            mode = CduMode::Failsafe;
            reason = if !cdu_ok {
                ReasonCode::CDU_UNREACHABLE
            } else if Which::ALL
                .iter()
                .any(|w| self.sensors.fault(*w) == Some(SensorFault::Lost))
            {
                ReasonCode::SENSOR_LOST
            } else {
                ReasonCode::SENSOR_IMPLAUSIBLE
            };
        } else {
            mode = CduMode::Normal;
            reason = ReasonCode::OK;
        }

        // ---- optimisation: one slice of the search per step.
        if matches!(self.mode, CduMode::Normal | CduMode::Degraded) {
            let plans = self.host_plans(inp, &fresh, it_w, hottest);
            self.optimiser.step(
                &cfg,
                now,
                &plans[..hosts],
                open_gpus,
                inp.ambient_c
                    .filter(|a| (-60.0..=70.0).contains(a))
                    .unwrap_or(cfg.margins.design_ambient_c),
                self.rejection_short,
            );
        }

        // ---- regulation.
        let prop = self.optimiser.proposal();
        let (mut target_sp, mut target_speed) = match mode {
            CduMode::Boot => (cfg.margins.boot_setpoint_c, 1.0),
            CduMode::Failsafe => (
                self.last_good_setpoint_c
                    .min(cfg.margins.failsafe_setpoint_c),
                1.0,
            ),
            _ => (prop.setpoint_c, prop.speed),
        };
        if mode != CduMode::Boot {
            // The GPUs' own word: hotter than planned takes water off.
            // While the supply sits well above its setpoint the water is
            // short, not the setpoint: the loop may only give back then.
            let capacity = supply.is_some_and(|s| s > self.setpoint_c + 1.5);
            match hottest {
                Some(h) => {
                    let e = h - cfg.margins.plan_ceiling_c;
                    let m = self.margin.step(if capacity { e.min(0.0) } else { e }, dt);
                    target_sp -= m;
                    if h > cfg.margins.cap_target_c {
                        target_speed = 1.0;
                    }
                }
                None => {
                    // No GPU speaks: hold what was learned, forget slowly.
                    self.margin.step(-0.2, dt);
                    target_sp -= self.margin.integral();
                }
            }
        }
        if matches!(mode, CduMode::Normal | CduMode::Degraded) {
            self.last_good_setpoint_c = target_sp;
        }
        // Supply and flow loops trim what the CDU is told, while tracking
        // closely (a big error is capacity, not an offset).
        let mut sp_cmd = target_sp;
        if let Some(s) = supply {
            let e = target_sp - s;
            let e = if e.abs() < 1.5 && !transient { e } else { 0.0 };
            sp_cmd += self.supply_trim.step(e, dt);
        }
        let mut speed_cmd = target_speed;
        if let (Some(f), true) = (flow, running) {
            let want = cfg.cdu.design_lpm_per_gpu * lay.gpus() as f32 * target_speed;
            let e = (want - f) / (cfg.cdu.design_lpm_per_gpu * lay.gpus() as f32);
            let e = if e.abs() < 0.1 && !transient { e } else { 0.0 };
            speed_cmd += self.flow_trim.step(e, dt);
        }
        // Bounds, then slews: warming and slowing slowly, the rest at once.
        let sp_cmd = sp_cmd.clamp(cfg.cdu.min_setpoint_c, cfg.cdu.max_setpoint_c);
        let speed_cmd = speed_cmd.clamp(cfg.cdu.min_speed, 1.0);
        let new_sp = slew(
            self.setpoint_c,
            sp_cmd,
            cfg.margins.setpoint_rise_k_per_min / 60.0,
            f32::MAX,
            dt,
        );
        let new_speed = slew(
            self.speed,
            speed_cmd,
            f32::MAX,
            cfg.margins.speed_fall_per_s,
            dt,
        );
        if (new_speed - self.speed).abs() > 0.02 {
            self.transient_until_ms = self.transient_until_ms.max(now + 60_000);
        }
        self.setpoint_c = new_sp;
        self.speed = new_speed;

        // ---- coordination.
        let coolant = supply.or(gpu_implied_supply);
        let mut caps = [None; MAX_HOSTS];
        let capacity_caps = self.coordinator.step(
            &cfg,
            now,
            dt,
            coolant,
            self.setpoint_c,
            r_now,
            &|h| fresh(h),
            &self.offsets,
            self.leaks_latched,
            &mut caps,
        );
        if mode == CduMode::Normal {
            if capacity_caps {
                mode = CduMode::Degraded;
                reason = ReasonCode::CAPACITY_SHORT;
            } else if self.leaks_latched != 0 {
                mode = CduMode::Degraded;
                reason = ReasonCode::LEAK;
            }
        }
        if mode != self.mode {
            self.push(
                &mut events,
                Event::CduModeChanged {
                    from: self.mode,
                    to: mode,
                    reason,
                },
            );
            self.mode = mode;
            self.since_ms = now;
        }
        self.reason = reason;

        let beacon = self.leaks_latched != 0
            || self.pump_failed.iter().any(|f| *f)
            || mode == CduMode::Failsafe
            || hottest.is_some_and(|h| h > cfg.gpu.max_operating_c);
        Commands {
            setpoint_c: self.setpoint_c,
            pump_speed: self.speed,
            pump_on,
            lead: if self.lead == 0 { Pump::A } else { Pump::B },
            valves_open,
            cooling_lost: self.leaks_latched,
            caps,
            beacon,
            mode,
            reason,
            events,
        }
    }

    /// What the optimiser plans each host with: its report when fresh, else
    /// the hall's average from the IT meter.
    fn host_plans(
        &self,
        inp: &Inputs<'_>,
        fresh: &dyn Fn(usize) -> Option<HostReport>,
        it_w: Option<f32>,
        hottest: Option<f32>,
    ) -> [HostPlan; MAX_HOSTS] {
        let cfg = &self.cfg;
        let lay = cfg.layout;
        let g = &cfg.gpu;
        let gph = lay.gpus_per_host as f32;
        let full_dyn = (g.tdp_w - g.static_w).max(1.0);
        // Hall average demand from the IT meter: IT = GPUs·(P_s + u·D) +
        // hosts·(idle + u·(full − idle)).
        let t_est = hottest.unwrap_or(60.0);
        let hall_u = it_w.map_or(1.0, |it| {
            let n_g = lay.gpus() as f32;
            let n_h = lay.hosts() as f32;
            let ps = model::static_power(g, t_est);
            let num = it - n_g * ps - n_h * cfg.host.idle_w;
            let den = n_g * full_dyn + n_h * (cfg.host.full_w - cfg.host.idle_w);
            (num / den).clamp(0.0, 1.0)
        });
        let mut plans = [HostPlan::default(); MAX_HOSTS];
        for (h, plan) in plans.iter_mut().enumerate().take(lay.hosts()) {
            let open = bit(!self.leaks_latched, lay.rack_of(h));
            if !open {
                continue;
            }
            let (gpus, dynamic_w) = match fresh(h) {
                Some(r) => {
                    let p = r.gpu_power_w / r.gpus as f32;
                    let capped = r.limit_w < g.tdp_w - 1.0 && p >= r.limit_w - 5.0;
                    let d = if capped {
                        // Its demand is hidden under the cap: plan for all.
                        full_dyn
                    } else {
                        (p - model::static_power(g, r.hottest_c)).clamp(0.0, full_dyn)
                    };
                    (r.gpus as f32, d)
                }
                None => {
                    let _ = inp;
                    (gph, hall_u * full_dyn)
                }
            };
            *plan = HostPlan {
                gpus,
                dynamic_w,
                offset_k: self.offsets[h],
            };
        }
        plans
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                }),
                ambient_c: Some(30.0),
                leaks: 0,
                hosts: &hosts,
            }));
        }
        last.expect("at least one step")
    }

    /// One step of a steady hall with these pumps running.
    fn step_with_pumps(core: &mut Core, s: u64, running: [bool; 2]) -> Commands {
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
            }),
            ambient_c: Some(20.0),
            leaks: 0,
            hosts: &hosts,
        })
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
        // A repaired: it leads again.
        core.clear_pump_trip(Pump::A);
        let c = step_with_pumps(&mut core, 42, [true, false]);
        assert_eq!(c.pump_on, [true, false]);
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
}
