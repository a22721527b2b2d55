//! What the shell reports after every step, for the console and the
//! northbound server to read without asking the control loop: the
//! counters, the core's state, each sensor and each host's last ack.
//!
//! Glossary:
//! - *snapshot*: the core's state copied after a step.
//! - *step number*: the control steps run before it ([`ShellStats::steps`]
//!   when it began): the first step is 0.
use super::*;

/// One supervised sensor after a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SensorStatus {
    /// Which.
    pub which: Which,
    /// Its reading this step, as the CDU gave it (`None`: no answer, or
    /// the map lacks it).
    pub reading: Option<f64>,
    /// The fault the core holds it under.
    pub fault: Option<SensorFault>,
}

/// Sensor `w`'s `reading` as a figure to show, under `fault`: none while
/// it is held lost, or when the value is outside any plausible reading (a
/// CDU's "no value" at once, before its fault is confirmed). What the bus,
/// the northbound registers, `/metrics` and the console show.
pub(crate) fn shown(w: Which, reading: Option<f64>, fault: Option<SensorFault>) -> Option<f64> {
    reading.filter(|&x| w.plausible(x) && fault != Some(SensorFault::Lost))
}

impl SensorStatus {
    /// Its reading as a figure to show.
    pub fn shown(&self) -> Option<f64> {
        shown(self.which, self.reading, self.fault)
    }

    /// Whether the core holds it under a fault now.
    pub fn faulted(&self) -> bool {
        self.fault.is_some_and(|f| f != SensorFault::Cleared)
    }
}

/// The core's state after the last step, for the console.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// When the step ran (Unix ms).
    pub at: TimestampMs,
    /// The mode.
    pub mode: CduMode,
    /// Why.
    pub reason: ReasonCode,
    /// Since when (Unix ms).
    pub since: TimestampMs,
    /// The CDU's readings this step (`None`: it did not answer).
    pub readings: Option<CduMeasurements>,
    /// When the CDU last answered a read (Unix ms).
    pub last_read: Option<TimestampMs>,
    /// Every supervised sensor.
    pub sensors: [SensorStatus; 4],
    /// Racks a leak input that answered this step reads wet, bit n =
    /// rack n.
    pub leaks_now: u16,
    /// Racks no input reads wet this step but one that did not answer
    /// read wet when it last did, bit n = rack n: neither wet nor dry is
    /// known.
    pub leaks_unheard: u16,
    /// Racks whose leak inputs answered this step, bit n = rack n: every
    /// rack when the CDU's leak register was read, else the racks with a
    /// rope when the board's lines were read, else none. Of any other
    /// rack neither wet nor dry is known this step.
    pub leaks_heard: u16,
    /// Latched leaks, bit n = rack n.
    pub leaks_latched: u16,
    /// Racks whose leak sensing is lost, bit n = rack n.
    pub sensing_lost: u16,
    /// Racks declared without a leak rope (`unprotected_racks`), bit n =
    /// rack n: only the CDU's own leak input, if it has one, watches them.
    pub unprotected: u16,
    /// Board pins are configured and the ropes are read; `false`: no rack
    /// has a rope, leaks come from the CDU's register only.
    pub ropes: bool,
    /// Racks whose isolation failed (pumps stopped), bit n = rack n.
    pub isolation_failed: u16,
    /// The valves open, bit n = rack n, as the CDU reads their positions,
    /// else as it last took them (a close it did not take shows open);
    /// `None` while neither is known (no position read, no valve write
    /// of this run taken). What the core commands is in
    /// [`ShellStats::last`].
    pub valves_open: Option<u16>,
    /// Pumps out of service after a trip.
    pub pumps_failed: [bool; 2],
    /// The loops.
    pub loops: LoopStatus,
    /// What the core has learned, and the plant it plans on.
    pub estimates: Box<Estimates>,
    /// Where this step's outdoor temperature came from (`None`: no
    /// source read; the core plans with its last reading for a minute,
    /// then with the configured fallback).
    pub outdoor_source: Option<OutdoorSource>,
    /// Events the core could not fit in a step, since the start.
    pub events_dropped: u32,
    /// The bus is connected.
    pub bus_connected: bool,
    /// The bus's counters (for `/metrics`).
    pub bus: loopwarden_bus::MetricsSnapshot,
    /// What the resender of the logged events has done since the start.
    pub resend: ResendCounts,
    /// This CDU's part in a hall of several CDUs (`None`: its setpoint
    /// alone sets its facility water).
    pub facility: Option<FacilityStatus>,
}

pub use loopwarden_bus::resend::ResendCounts;

/// This CDU's part in setting the facility water of its hall.
#[derive(Debug, Clone, PartialEq)]
pub struct FacilityStatus {
    /// The hall's coordinator.
    pub coordinator: String,
    /// This controller is it.
    pub coordinates: bool,
    /// What this CDU offers (`None` before its first search).
    pub offer: Option<cooling_core::facility::Offer>,
    /// The facility water the plan in force sets, °C, and how long ago
    /// it was heard, ms (`None`: no plan heard yet).
    pub following: Option<(f32, u64)>,
    /// On the coordinator: its plan and how many offers it was made from.
    pub plan: Option<(cooling_core::facility::FacilityPlan, usize)>,
}

#[cfg(test)]
impl Snapshot {
    /// `core`'s state as a step leaves it, the CDU silent and the bus
    /// down: for the tests of what reads a snapshot.
    pub(crate) fn of_core(core: &Core) -> Self {
        let (mode, reason, since) = core.mode();
        Snapshot {
            at: TimestampMs(0),
            mode,
            reason,
            since: TimestampMs(since),
            readings: None,
            last_read: None,
            sensors: Which::ALL.map(|which| SensorStatus {
                which,
                reading: None,
                fault: core.sensor_fault(which),
            }),
            leaks_now: 0,
            leaks_unheard: 0,
            // The ropes read: every rack that has one.
            leaks_heard: cooling_core::safety::all_racks(usize::from(core.config().layout.racks))
                & !core.config().layout.unprotected,
            leaks_latched: core.leaks_latched(),
            sensing_lost: core.sensing_lost(),
            unprotected: core.config().layout.unprotected,
            ropes: true,
            isolation_failed: core.isolation_failed(),
            valves_open: None,
            pumps_failed: core.pumps_failed(),
            loops: core.loops(),
            estimates: Box::new(Estimates::of(core)),
            outdoor_source: None,
            events_dropped: core.events_dropped(),
            bus_connected: false,
            bus: Default::default(),
            resend: ResendCounts::default(),
            facility: None,
        }
    }
}

/// A cap lease as last sent to a host: whether its cap is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapSent {
    /// The lease frame's sequence number (its ack names it).
    pub seq: u32,
    /// When its life ends: its stamp and its duration (Unix ms).
    pub until: TimestampMs,
    /// The host refused it.
    pub refused: bool,
}

impl CapSent {
    /// Whether its cap is in force at `now` (Unix ms): inside its life,
    /// and not refused.
    pub fn in_force(&self, now: TimestampMs) -> bool {
        !self.refused && now < self.until
    }
}

impl ShellStats {
    /// Hosts capped at `now` (Unix ms): the cap lease last sent to each
    /// is inside its life and was not refused. A host that refused it,
    /// or whose lease lapsed unrenewed (the bus down), is not counted.
    pub fn hosts_capped(&self, now: TimestampMs) -> usize {
        self.caps
            .iter()
            .zip(&self.caps_sent)
            .filter(|(cap, sent)| cap.is_some() && sent.is_some_and(|s| s.in_force(now)))
            .count()
    }
}

impl ShellStats {
    /// Takes what the CDU took of a step's `plan` (`outcome`): the
    /// setpoint and the pump speed as written, for those it took (one it
    /// refused leaves the last it took), and the valves it closed.
    pub(crate) fn took(&mut self, plan: &crate::decide::Plan, outcome: &Outcome) {
        use crate::decide::Setting;
        let taken = |s: Setting| {
            let ok = outcome.tried.iter().any(|(t, r)| *t == s && r.is_ok());
            plan.value(s).filter(|_| ok)
        };
        if let Some(v) = taken(Setting::Setpoint) {
            self.setpoint_written_c = Some(v);
        }
        if let Some(v) = taken(Setting::PumpSpeed) {
            self.speed_written_pct = Some(v);
        }
        if let Some(v) = taken(Setting::Valves) {
            self.leak_steps.valves_taken(self.steps, v as u16);
        }
    }
}

/// When each rack's leak was seen and its valve closed, by step number:
/// what "the valve is told to close on the step the leak is seen"
/// (docs/safety.md) is read from, whatever the steps' timing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeakSteps {
    /// Rack n: the step whose reads first saw it wet since they last
    /// read it dry (`None`: not read wet since).
    pub seen: Vec<Option<u64>>,
    /// Rack n: the step whose valve word, taken by the CDU, first had
    /// its valve closed since one taken had it open (`None`: open as
    /// last taken, or no valve word taken yet).
    pub closed: Vec<Option<u64>>,
}

impl LeakSteps {
    /// For a layout of `racks` racks (a valve word holds 16).
    pub(crate) fn new(racks: usize) -> Self {
        let racks = racks.min(16);
        Self {
            seen: vec![None; racks],
            closed: vec![None; racks],
        }
    }

    /// Step `step` read the racks `wet` wet (bit n = rack n) and the
    /// racks `unknown` neither wet nor dry (an input that did not answer
    /// read them wet when it last did).
    pub(crate) fn heard(&mut self, step: u64, wet: u16, unknown: u16) {
        for (n, seen) in self.seen.iter_mut().enumerate() {
            if wet & (1 << n) != 0 {
                seen.get_or_insert(step);
            } else if unknown & (1 << n) == 0 {
                *seen = None;
            }
        }
    }

    /// Step `step` wrote the valve word `open` (bit n = rack n open) and
    /// the CDU took it.
    pub(crate) fn valves_taken(&mut self, step: u64, open: u16) {
        for (n, closed) in self.closed.iter_mut().enumerate() {
            if open & (1 << n) == 0 {
                closed.get_or_insert(step);
            } else {
                *closed = None;
            }
        }
    }
}

/// A host's last ack of this CDU's commands.
#[derive(Debug, Clone, PartialEq)]
pub struct LastAck {
    /// When it came (Unix ms).
    pub at: TimestampMs,
    /// The command it answers.
    pub seq: u32,
    /// Its code.
    pub code: AckCode,
    /// Its detail.
    pub detail: String,
}

/// A stats channel for [`ShellOptions::stats`]: the sender goes in the
/// options, the receiver to whoever watches.
pub fn stats_channel() -> (watch::Sender<ShellStats>, watch::Receiver<ShellStats>) {
    watch::channel(ShellStats::default())
}

/// What the shell has done since it started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShellStats {
    /// Control steps run.
    pub steps: u64,
    /// Control steps that took longer than the period (a CDU that does
    /// not answer, a slow flash): the next tick was skipped.
    pub steps_late: u64,
    /// CDU reads that answered.
    pub cdu_reads: u64,
    /// CDU reads that failed.
    pub cdu_read_errors: u64,
    /// Steps with a CDU write that failed.
    pub cdu_write_errors: u64,
    /// Reads and writes of the board's pins that failed (leak lines,
    /// healthy relay, beacon).
    pub board_errors: u64,
    /// The latched record was unreadable at start and the racks are not
    /// yet relatched from the CDU's valve positions: no valve is written,
    /// and what the core commands is not what the CDU has.
    pub relatch_pending: bool,
    /// The last step's heartbeat was held back (not written) because a
    /// read-back found a safety setting (valves, pumps to run, lead pump)
    /// that the CDU echoed but does not hold, and none had read it held
    /// since (`the CDU does not hold a safety setting it echoed (which:
    /// why)`), or because none has read them held since the start (`the
    /// safety settings not read back held since the start (read back
    /// first)`), followed by `; not read back since: …` when the step's
    /// read-back failed (`None`: that step's heartbeat was not held
    /// back). Set after each step's writes, for that step; the CDU
    /// falls back to its own control after its heartbeat timeout while
    /// it is held back.
    pub heartbeat_held: Option<String>,
    /// Writes of the setpoint or the pump speed held to the CDU's
    /// register map (the core asked for more than it takes).
    pub settings_limited: u64,
    /// Latched records that did not go to flash.
    pub latch_write_errors: u64,
    /// The CDU's last error, while it lasts.
    pub cdu_error: Option<String>,
    /// The core's last commands.
    pub last: Option<Commands>,
    /// The supply setpoint last written to the CDU and taken, °C, as
    /// written: held to the map's range (`None`: none taken yet, or the
    /// map has no setpoint register). What the core asked is in
    /// [`ShellStats::last`].
    pub setpoint_written_c: Option<f64>,
    /// The pump speed last written to the CDU and taken, %, as written
    /// (held to the map's range), as [`ShellStats::setpoint_written_c`].
    pub speed_written_pct: Option<f64>,
    /// When each rack's leak was seen and its valve closed, by step.
    pub leak_steps: LeakSteps,
    /// Host telemetry frames taken.
    pub host_reports: u64,
    /// Host telemetry frames refused as implausible.
    pub host_reports_refused: u64,
    /// Host telemetry frames believed with some GPUs left out as
    /// implausible.
    pub host_gpus_left_out: u64,
    /// Cap leases sent (not counting lifts).
    pub leases_sent: u64,
    /// Lifting leases sent.
    pub lifts_sent: u64,
    /// Leases are held because the bus is down (sent fresh once it is
    /// back; said once per outage).
    pub leases_held_offline: bool,
    /// The cap last sent to each host index while it is capped, W
    /// (sent: whether the host took it is [`ShellStats::caps_sent`]'s and
    /// [`ShellStats::in_force`]'s).
    pub caps: Vec<Option<f32>>,
    /// The cap lease last sent to each host index while it is capped: its
    /// life and whether the host refused it ([`ShellStats::hosts_capped`]).
    pub caps_sent: Vec<Option<CapSent>>,
    /// Telemetry frames published.
    pub telemetry_published: u64,
    /// State frames published.
    pub states_published: u64,
    /// Event frames published.
    pub events_published: u64,
    /// Publishes the bus did not take.
    pub publish_errors: u64,
    /// Acks received for this CDU's commands.
    pub acks: u64,
    /// Of which `ok` or `clamped` (a cap raised to a GPU's minimum).
    pub acks_ok: u64,
    /// Of which `clamped` for a lease taken for less time than asked (the
    /// host's `max_lease_ms` below this controller's `lease_ms`): its caps
    /// lapse between renewals.
    pub acks_shortened: u64,
    /// Of which anything else.
    pub acks_refused: u64,
    /// Acks naming this CDU's commands from hosts not in its host list,
    /// dropped (not in `acks`).
    pub acks_foreign: u64,
    /// The limits in force the last ack of each host reported, by host id.
    pub in_force: BTreeMap<String, Vec<GpuCap>>,
    /// The last refusal: host id, code and detail.
    pub last_refusal: Option<(String, AckCode, String)>,
    /// The core's state after the last step.
    pub status: Option<Snapshot>,
    /// When each host index last sent telemetry (Unix ms).
    pub heard: Vec<Option<TimestampMs>>,
    /// The last ack of each host, by host id.
    pub last_ack: BTreeMap<String, LastAck>,
}

#[cfg(test)]
mod tests {
    use super::LeakSteps;

    /// A rack is seen from the first step an input reads it wet until one
    /// reads it dry (not while its input is unheard), and closed from the
    /// first valve word taken shut until one taken open.
    #[test]
    fn leak_steps_hold_from_the_first_step_until_the_rack_reads_dry_or_opens() {
        let mut s = LeakSteps::new(4);
        s.valves_taken(0, 0b1111);
        s.heard(3, 0b0100, 0);
        s.valves_taken(3, 0b1011);
        s.heard(4, 0b0100, 0);
        s.valves_taken(4, 0b1011);
        assert_eq!((s.seen[2], s.closed[2]), (Some(3), Some(3)));
        assert_eq!((s.seen[1], s.closed[1]), (None, None));
        // Unheard: still seen; read dry: not.
        s.heard(5, 0, 0b0100);
        assert_eq!(s.seen[2], Some(3));
        s.heard(6, 0, 0);
        assert_eq!(s.seen[2], None);
        s.valves_taken(7, 0b1111);
        assert_eq!(s.closed[2], None);
        assert_eq!(LeakSteps::new(40).seen.len(), 16, "a valve word holds 16");
    }
}
