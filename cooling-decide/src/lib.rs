//! # cooling-decide: the one decision path between a CDU and the control core
//!
//! For the Linux controller's shell (`cooling-ctrl`, on Modbus), the twin
//! (`cooling-ctrl`'s simulated hall) and the firmware on a CDU's
//! microcontroller alike: whatever sits below it (a Modbus client, the
//! scenario runner, a UART), the same code turns measurements into the
//! core's inputs, runs the core, says what must be in flash before
//! anything acts, and turns the core's commands into ordered writes.
//! Pure, `no_std` and allocation-free: no clock, no I/O; time comes in
//! with each step. Every input it is given can be recorded and replayed
//! elsewhere through the same code ([`trace`]).
//!
//! Between steps, each host report heard goes to [`Decider::hear_host`],
//! which believes it or says why not ([`hosts`]). A step, as both
//! callers run it:
//! 1. [`Decider::step`]: the CDU's measurements (`None`: it did not
//!    answer), the board's leak lines and the outdoor temperature
//!    ([`outdoor`]) in, with the hosts' believed reports; the core's
//!    commands out. Before the core runs, a relatch that is due
//!    ([`latch`]) latches the racks whose valves read closed; while one
//!    is pending, every rack is treated as latched for its hosts (caps
//!    at their minimum, cooling lost), since any valve may be shut.
//! 2. [`Decider::to_keep`] / [`Decider::kept`]: the latched record to
//!    write to flash, and whether it went in; nothing acts before.
//! 3. [`Decider::plan`]: the ordered writes ([`writes`]), the valves
//!    gated by the latch, the setpoint and speed held to the map.
//! 4. [`Decider::written`]: what the CDU took; the next step's core hears
//!    whether its writes went in. The next heartbeat is the one past the
//!    last that went out on the line: one withheld is not counted.
//! 5. The leases due for the core's caps ([`leases::LeaseBook`]): the
//!    shell signs and sends them, the twin's hosts hold them.
//!
//! What the core's estimator learned is kept in flash under the keys and
//! at the cadence of [`learned`], and restored part by part at start
//! ([`Decider::restore_learned_part`]).
//!
//! In a hall of several CDUs, the core's offer to the hall's facility
//! coordinator is said again when it moves, by one rule ([`facility`]).
//!
//! Glossary:
//! - *board read*: what the controller board's leak lines gave this step
//!   ([`BoardRead`]).
//! - *said*: what the decision path has for the log ([`Said`]).

#![no_std]

#[cfg(test)]
extern crate std;

pub mod facility;
pub mod float;
pub mod hosts;
pub mod inputs;
pub mod latch;
pub mod learned;
pub mod leases;
pub mod outdoor;
pub mod record;
pub mod said;
pub mod trace;
pub mod writes;

use core::fmt::Display;

use cooling_core::{
    Commands, ConfigError, Core, CoreConfig, HostReport, Inputs, LeakInputs, MAX_HOSTS,
};
use heapless::Vec;
use loopwarden_protocol::units::TimestampMs;

pub use hosts::{Heard, Hosts, Verdict, Why};
pub use inputs::{core_readings, leak_inputs, BoardRead, CduMeasurements, StepIn};
use latch::LatchKeeper;
pub use record::LatchRecord;
pub use said::{Said, Words};
pub use trace::{Applied, Opening, Traced};
pub use writes::{Asked, MapLimits, Outcome, Plan, Setting, Write, WriteError};

/// The lines held for the log until taken: three from the map's limits,
/// one of the record at start, one of a relatch.
pub const SAID: usize = 8;

/// Why an operator's leak clear is refused while a relatch is pending.
pub const RELATCH_PENDING: &str =
    "the latched leaks are unknown until the valve positions are read";

/// The core, the latched record's keeper and the writes' limiter.
#[derive(Debug, Clone)]
pub struct Decider {
    core: Core,
    keeper: LatchKeeper,
    /// The hosts' believed reports.
    hosts: Hosts,
    /// The supply temperature of the last step, while its sensor is
    /// believed and its reading in range, °C (what a GPU's reading is
    /// judged against).
    supply_c: Option<f32>,
    /// When each host's last report not refused said every GPU of its
    /// reads under that supply (its vote: [`hosts::supply_outvoted`]),
    /// ms on the decision path's clock.
    colder_at: [Option<u64>; MAX_HOSTS],
    limits: MapLimits,
    limiter: writes::Limiter,
    /// The count of the last heartbeat sent (0: none since the start); a
    /// plan writes the one past it. It moves only when the heartbeat went
    /// out ([`Outcome::heartbeat_sent`]): one withheld, counted, would
    /// make the next equal the last sent in a register of two values.
    /// Wide enough never to wrap (a count of u16 wrapping to 0 wrote the
    /// same value twice in a range of 255 values, 65,535 = 255 × 257).
    heartbeat: u32,
    /// What of the last step's writes went in.
    taken: cooling_core::Taken,
    /// The valves the CDU last took, bit n = rack n open.
    valves_taken: Option<u16>,
    /// The valves planned at the last step, if written.
    valves_planned: Option<u16>,
    /// The valves the last plan was for (the core's, bit n = rack n open).
    valves_asked: u16,
    /// Of those, the ones not written open at the last step (held back
    /// by the latch's keeper, or the valve write failed): told to the
    /// core, which judges no valve position it did not get.
    valves_held: u16,
    /// What the last step asked of the CDU (what a traced plan writes).
    asked: Option<Asked>,
    /// The last step's commands, made here (large: not on the stack);
    /// [`Commands::UNSET`] before the first step (`stepped`).
    last: Commands,
    stepped: bool,
    /// What the step said besides the core's events.
    events: writes::Events,
    /// What to say in the log.
    said: Vec<Said, SAID>,
}

impl Decider {
    /// A decider for `cfg` on a CDU of map `limits`, from the latched
    /// record the flash held at start (`latched`; an error: why it cannot
    /// be read). The core is held to the tighter of its limits and the
    /// map's; what that changed, and what became of the record, are in
    /// [`Decider::take_said`].
    pub fn new<E: Display>(
        cfg: CoreConfig,
        limits: MapLimits,
        latched: &Result<Option<LatchRecord>, E>,
    ) -> Result<Self, ConfigError> {
        let mut d = Self::unstarted();
        d.start(cfg, limits, latched)?;
        Ok(d)
    }

    /// A decider not started: the reference hall's core
    /// ([`Core::reference`]), no host, no map limit, nothing said. Made
    /// at compile time, for a microcontroller's static to start from
    /// before [`Decider::start`] (a decider is some 19 KB, more than its
    /// stack holds).
    pub const fn unstarted() -> Self {
        Self {
            core: Core::reference(),
            keeper: LatchKeeper::NOTHING,
            hosts: Hosts::NONE,
            supply_c: None,
            colder_at: [None; MAX_HOSTS],
            limits: MapLimits {
                mapped: [false; 6],
                setpoint_c: None,
                speed_pct: None,
                positions: false,
            },
            limiter: writes::Limiter::new(),
            heartbeat: 0,
            taken: cooling_core::Taken::ALL,
            valves_taken: None,
            valves_planned: None,
            valves_asked: 0,
            valves_held: 0,
            asked: None,
            last: Commands::UNSET,
            stepped: false,
            events: writes::Events::new(),
            said: Vec::new(),
        }
    }

    /// Starts (again), in place, as [`Decider::new`] makes a decider:
    /// `cfg` held to the map's `limits`, from the latched record the
    /// flash held (`latched`). Nothing as large as a core or a decider is
    /// built on the stack. On an error the decider is as it was.
    pub fn start<E: Display>(
        &mut self,
        mut cfg: CoreConfig,
        limits: MapLimits,
        latched: &Result<Option<LatchRecord>, E>,
    ) -> Result<(), ConfigError> {
        let tightened = writes::tighten(&mut cfg, &limits)?;
        let opened = LatchKeeper::open(latched);
        self.core.reset(cfg, opened.restore.as_ref())?;
        // Every field named: one added and not started here fails to
        // build (a test compares a started decider with a new one).
        let Self {
            core: _,
            keeper,
            hosts,
            supply_c,
            colder_at,
            limits: lim,
            limiter,
            heartbeat,
            taken,
            valves_taken,
            valves_planned,
            valves_asked,
            valves_held,
            asked,
            last,
            stepped,
            events,
            said,
        } = self;
        said.clear();
        for s in tightened.into_iter().chain(opened.said) {
            // At most three, then one: within [`SAID`].
            let _ = said.push(s);
        }
        *keeper = opened.keeper;
        hosts.reset(cfg.layout.hosts().min(MAX_HOSTS));
        *supply_c = None;
        *colder_at = [None; MAX_HOSTS];
        *lim = limits;
        *limiter = writes::Limiter::new();
        *heartbeat = 0;
        *taken = cooling_core::Taken::ALL;
        *valves_taken = None;
        *valves_planned = None;
        *valves_asked = 0;
        *valves_held = 0;
        *asked = None;
        *last = Commands::UNSET;
        *stepped = false;
        events.clear();
        Ok(())
    }

    /// The last step's commands (`None` before the first).
    pub fn last_commands(&self) -> Option<&Commands> {
        self.stepped.then_some(&self.last)
    }

    /// The core.
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// The core, to change (an operator's clear, the BMS's limits, what
    /// was learned). A change made here is not in a trace: a caller that
    /// traces makes it through [`Decider::apply`].
    pub fn core_mut(&mut self) -> &mut Core {
        &mut self.core
    }

    /// The map's limits the decider holds the writes to.
    pub fn limits(&self) -> &MapLimits {
        &self.limits
    }

    /// Host `h`'s telemetry `t`, stamped `stamped`, heard at `at_ms` (the
    /// decision path's clock) and `now` (the clock of its stamp): its
    /// GPUs that no working GPU could be left out ([`hosts::Bounds`]), the
    /// rest judged as [`Decider::hear_host`] does.
    pub fn hear_telemetry(
        &mut self,
        h: usize,
        t: &loopwarden_protocol::message::HostTelemetry,
        stamped: TimestampMs,
        (at_ms, now): (u64, TimestampMs),
    ) -> Verdict {
        let heard = self.heard(t, stamped, at_ms);
        self.hear_host(h, &heard, now)
    }

    /// Telemetry `t`, stamped `stamped`, heard at `at_ms`, as
    /// [`Decider::hear_host`] takes it: its GPUs that no working GPU
    /// could be left out, by the TDP and the supply believed now.
    pub fn heard(
        &self,
        t: &loopwarden_protocol::message::HostTelemetry,
        stamped: TimestampMs,
        at_ms: u64,
    ) -> Heard {
        let bounds = hosts::Bounds {
            tdp_w: self.core.config().gpu.tdp_w,
            supply_c: self.supply_c,
            supply_outvoted: self.supply_outvoted(at_ms),
        };
        hosts::heard_of(t, stamped, at_ms, &bounds)
    }

    /// Host `h`'s report as `heard` at `now` (the clock of its stamp):
    /// believed, or refused and why ([`hosts::implausible`]); its vote on
    /// the supply reading counts while it is not refused.
    pub fn hear_host(&mut self, h: usize, heard: &Heard, now: TimestampMs) -> Verdict {
        let tdp = self.core.config().gpu.tdp_w;
        let at_ms = heard.report.at_ms;
        let supply_c = self.supply_c.filter(|_| !self.supply_outvoted(at_ms));
        let verdict = self.hosts.hear(h, heard, now, supply_c, tdp);
        if let Some(vote) = self.colder_at.get_mut(h) {
            let counts = !matches!(verdict, Verdict::Refused { .. });
            *vote = (counts && heard.colder_than_supply).then_some(at_ms);
        }
        verdict
    }

    /// Whether the hosts heard within the host timeout of `at_ms` outvote
    /// the supply reading ([`hosts::supply_outvoted`]).
    fn supply_outvoted(&self, at_ms: u64) -> bool {
        let timeout = self.core.config().timing.host_timeout_ms;
        let recent = |at: u64| at_ms.saturating_sub(at) <= timeout;
        let voted = |h: usize| self.colder_at.get(h).copied().flatten().is_some_and(recent);
        let colder = (0..self.colder_at.len()).filter(|&h| voted(h)).count();
        let others = self.hosts().iter().enumerate();
        let others = others
            .filter(|(h, r)| !voted(*h) && r.is_some_and(|r| recent(r.at_ms)))
            .count();
        hosts::supply_outvoted(colder, others)
    }

    /// The hosts' believed reports, by host index.
    pub fn hosts(&self) -> &[Option<HostReport>] {
        self.hosts.reports()
    }

    /// Writes the map limited, since the start.
    pub fn settings_limited(&self) -> u64 {
        self.limiter.count
    }

    /// The valves the CDU last took (bit n = rack n open); `None` before
    /// a valve write of this run went in.
    pub fn valves_taken(&self) -> Option<u16> {
        self.valves_taken
    }

    /// A relatch is pending (the record at start was unreadable and the
    /// valve positions are not read yet).
    pub fn relatch_pending(&self) -> bool {
        self.keeper.relatch_pending()
    }

    /// An operator's clear of rack `rack`'s latched leak, on the leak
    /// inputs `leaks` (the core's rules: it has one, and every input
    /// reads it dry); refused while a relatch is pending
    /// ([`RELATCH_PENDING`]): what is latched is unknown until the valve
    /// positions are read, and the relatch would latch the rack again.
    pub fn clear_leak(&mut self, rack: usize, leaks: &LeakInputs) -> Result<(), &'static str> {
        if self.relatch_pending() {
            return Err(RELATCH_PENDING);
        }
        self.core_mut().clear_leak(rack, leaks)
    }

    /// What to log since the last call.
    pub fn take_said(&mut self) -> Vec<Said, SAID> {
        core::mem::take(&mut self.said)
    }

    /// Step 1: the core's step on the CDU's measurements `cdu` (`None`:
    /// no answer) and `inp`; a due relatch first. The commands are also
    /// kept ([`Decider::last_commands`]).
    pub fn step(&mut self, cdu: Option<&CduMeasurements>, inp: &StepIn) -> Commands {
        self.step_kept(cdu, inp).clone()
    }

    /// [`Decider::step`], its commands made where they are kept (in a
    /// frame of its own: the deepest of a step).
    #[inline(never)]
    pub fn step_kept(&mut self, cdu: Option<&CduMeasurements>, inp: &StepIn) -> &Commands {
        let closed = cdu.and_then(|r| r.valves_closed);
        let positions = self.limits.positions;
        if let Some(racks) = self.keeper.relatch(&mut self.core, closed, positions) {
            // Once per decider, after at most four at its start.
            let _ = self.said.push(Said::Relatched { racks, positions });
        }
        let inputs = Inputs {
            now_ms: inp.now_ms,
            cdu: cdu.map(core_readings),
            ambient_c: inp.ambient_c,
            leaks: leak_inputs(inp.board, cdu.and_then(|r| r.leaks)),
            cdu_taken: self.taken,
            valves_held: self.valves_held,
            hosts: self.hosts.reports(),
        };
        self.core.step_into(&inputs, &mut self.last);
        self.stepped = true;
        // Only a reading the core would use: no fault stands and it is in
        // range (one out of range is no figure before its fault is
        // confirmed, `fault_confirm_ms` later).
        let supply = cooling_core::sensors::Which::Supply;
        let supply_fault = self.core.sensor_fault(supply);
        self.supply_c = cdu
            .and_then(|r| r.supply_c)
            .filter(|s| supply_fault.is_none() && supply.plausible(*s))
            .map(|s| s as f32);
        if self.keeper.relatch_pending() {
            unknown_racks(self.core.config(), &mut self.last);
        }
        self.asked = Some(Asked::of(&self.last));
        &self.last
    }

    /// Starts again from what the flash holds (`latched`), with the same
    /// configuration and map limits: as a process that restarts.
    #[inline(never)]
    pub fn restart(&mut self, latched: &Opening) -> Result<(), ConfigError> {
        let (cfg, limits) = (*self.core.config(), self.limits);
        self.start(cfg, limits, &latched.read())
    }

    /// Restores part `part` of what an earlier run learned, as the flash
    /// held it (`bytes`: `cooling_core::estimate::record`), over what the
    /// core holds now. Restored at start, part by part, it gives what
    /// restoring the whole gives when every part is believed. (In a frame
    /// of its own: what was learned is copied through it, 2 KB.)
    #[inline(never)]
    pub fn restore_learned_part(
        &mut self,
        part: usize,
        bytes: &[u8],
    ) -> Result<(), trace::LearnedRefused> {
        let mut l = self.core.learned();
        l.decode_part(part, bytes)
            .map_err(trace::LearnedRefused::Record)?;
        self.core
            .restore_learned(&l)
            .map_err(trace::LearnedRefused::Bounds)
    }

    /// Step 2: the latched record to write to flash before anything acts,
    /// if it changed.
    pub fn to_keep(&mut self) -> Option<LatchRecord> {
        self.keeper.to_keep(&self.core)
    }

    /// Step 2, done: the record went to flash (`ok`) or did not.
    pub fn kept(&mut self, ok: bool) {
        self.keeper.kept(ok);
    }

    /// Step 3: the writes for `c`, with the valve positions the CDU read
    /// this step (`closed`). A setting the map limits is reported in
    /// [`Decider::take_events`].
    pub fn plan(&mut self, c: &Commands, closed: Option<u16>) -> Plan {
        self.plan_asked(&Asked::of(c), closed)
    }

    /// Step 3 for the commands of the last step (`None`: no step yet).
    pub fn plan_last(&mut self, closed: Option<u16>) -> Option<Plan> {
        let asked = self.asked?;
        Some(self.plan_asked(&asked, closed))
    }

    /// Step 3 for what the commands ask (`c`).
    fn plan_asked(&mut self, c: &Asked, closed: Option<u16>) -> Plan {
        let heartbeat = self.heartbeat.wrapping_add(1);
        let racks = cooling_core::safety::all_racks(self.core.config().layout.racks as usize);
        let open_now = self.valves_taken.or(closed.map(|c| !c & racks));
        let valves = self.keeper.valves(c.valves_open, open_now);
        self.valves_planned = valves;
        self.valves_asked = c.valves_open;
        self.limiter
            .plan(c, valves, heartbeat, &self.limits, &mut self.events)
    }

    /// Step 4: what the CDU took of the plan; the heartbeat, if it went
    /// out, counted ([`Outcome::heartbeat_sent`]).
    pub fn written(&mut self, o: &Outcome) {
        self.taken = o.taken();
        if o.heartbeat_sent {
            self.heartbeat = self.heartbeat.wrapping_add(1);
        }
        let valves_in = o
            .tried
            .iter()
            .any(|(s, r)| *s == Setting::Valves && r.is_ok());
        if valves_in {
            self.valves_taken = self.valves_planned;
        }
        let opened = self.valves_planned.filter(|_| valves_in).unwrap_or(0);
        self.valves_held = self.valves_asked & !opened;
    }

    /// Step 2, before the record's keep: the CDU took `valves` (bit n =
    /// rack n open), the word a shell whose flash is slow writes before
    /// the keep, closings only. It is the valve word taken until another
    /// goes in: a planned write that fails after it leaves the racks it
    /// closed shut, and not opened while the record is not in flash.
    pub fn took_early_valves(&mut self, valves: u16) {
        self.valves_taken = Some(valves);
    }

    /// The events of the decision path itself (a setting limited), since
    /// the last call (the newest [`writes::EVENTS`] of them).
    pub fn take_events(&mut self) -> writes::Events {
        core::mem::take(&mut self.events)
    }
}

/// While a relatch is pending, which racks' valves are shut is not
/// known: any of them may be, so every rack's hosts are treated as a
/// latched rack's (capped to their minimum, told their cooling is lost)
/// and the alarm sounds, until the valve positions are read (`c`, the
/// commands of a core of `cfg`).
fn unknown_racks(cfg: &CoreConfig, c: &mut Commands) {
    c.cooling_lost = cooling_core::safety::all_racks(cfg.layout.racks as usize);
    let cap = cooling_core::HostCap {
        watts: cfg.gpu.min_cap_w,
        reason: loopwarden_protocol::ReasonCode::COOLING_LOST,
    };
    let hosts = cfg.layout.hosts().min(MAX_HOSTS);
    c.caps.iter_mut().take(hosts).for_each(|h| *h = Some(cap));
    c.beacon = true;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(valves_closed: u16) -> CduMeasurements {
        CduMeasurements {
            supply_c: Some(30.0),
            return_c: Some(38.0),
            flow_lpm: Some(192.0),
            facility_supply_c: Some(27.0),
            pumps_running: [Some(true), Some(false)],
            leaks: Some(0),
            diff_pressure_kpa: Some(100.0),
            valves_closed: Some(valves_closed),
            pump_faults: [Some(false); 2],
            it_w: Some(80_000.0),
            cooling_w: None,
            facility_w: Some(88_000.0),
            outdoor_c: Some(20.0),
        }
    }

    fn step(d: &mut Decider, s: u64, cdu: Option<&CduMeasurements>) -> (Plan, Commands) {
        let c = d.step(
            cdu,
            &StepIn {
                now_ms: s * 1000,
                board: BoardRead::Absent,
                ambient_c: Some(20.0),
            },
        );
        if let Some(r) = d.to_keep() {
            assert!(r.latched.leaks != 0 || !d.relatch_pending());
            d.kept(true);
        }
        let p = d.plan(&c, cdu.and_then(|m| m.valves_closed));
        d.written(&Outcome::whole(&p, true));
        (p, c)
    }

    #[test]
    fn a_decider_started_again_in_place_is_the_one_new_makes() {
        let lim = writes::tests::sim_cdu();
        let cfg = CoreConfig::default();
        let shown = |d: &Decider| std::format!("{d:?}");
        let unread: Result<Option<LatchRecord>, &str> = Err("cdu.latched: damaged");
        let mut d = Decider::new(cfg, lim, &unread).unwrap();
        d.core_mut().set_limits(30.0, -2.0);
        for s in 0..5 {
            step(&mut d, s, Some(&measured(0b0010)));
        }
        let record = LatchRecord {
            generation: 7,
            latched: d.core().latched(),
        };
        assert_ne!(record.latched.leaks, 0, "the relatch latched rack 1");
        assert!(d.last_commands().is_some());
        for read in [Ok(Some(record)), Ok(None), unread] {
            d.start(cfg, lim, &read).unwrap();
            assert_eq!(shown(&d), shown(&Decider::new(cfg, lim, &read).unwrap()));
            assert!(d.last_commands().is_none(), "no step since the start");
            step(&mut d, 9, Some(&measured(0)));
        }
        // A configuration refused leaves the decider as it was.
        let before = shown(&d);
        let mut bad = cfg;
        bad.gpu.tdp_w = f32::NAN;
        assert!(d.start(bad, lim, &unread).is_err());
        assert_eq!(shown(&d), before);
    }

    #[test]
    fn the_heartbeat_count_goes_on_past_a_words_range() {
        let lim = writes::tests::sim_cdu();
        let fresh: Result<Option<LatchRecord>, &str> = Ok(None);
        let mut d = Decider::new(CoreConfig::default(), lim, &fresh).unwrap();
        d.heartbeat = u32::from(u16::MAX) - 1;
        let m = measured(0);
        let beats: std::vec::Vec<Option<f64>> = (0..3)
            .map(|s| step(&mut d, s, Some(&m)).0.value(Setting::Heartbeat))
            .collect();
        // The register's range takes it from there (0 to 254: 0, 1, 2).
        assert_eq!(beats, [Some(65_535.0), Some(65_536.0), Some(65_537.0)]);
    }

    /// A heartbeat register of two values (0 to 1, the map's range): the
    /// value written is the count mod 2 (`Register::heartbeat`).
    fn on_a_toggle(plan: &Plan) -> Option<f64> {
        plan.value(Setting::Heartbeat).map(|count| count % 2.0)
    }

    #[test]
    fn a_heartbeat_withheld_does_not_count_so_the_next_differs_from_the_last_sent() {
        let lim = writes::tests::sim_cdu();
        let fresh: Result<Option<LatchRecord>, &str> = Ok(None);
        let mut d = Decider::new(CoreConfig::default(), lim, &fresh).unwrap();
        let m = measured(0);
        let (first, _) = step(&mut d, 0, Some(&m));
        // The next step's valve write is refused: the heartbeat is not
        // due, so it is not sent.
        let inp = StepIn {
            now_ms: 1000,
            board: BoardRead::Absent,
            ambient_c: Some(20.0),
        };
        let c = d.step(Some(&m), &inp);
        let p = d.plan(&c, m.valves_closed);
        let mut o = Outcome::default();
        for w in &p.writes {
            if o.due(w) {
                let refused = w.setting == Setting::Valves;
                o.record(w.setting, if refused { Err("exception 4") } else { Ok(()) });
            }
        }
        assert!(!o.tried.iter().any(|(s, _)| *s == Setting::Heartbeat));
        d.written(&o);
        let (third, _) = step(&mut d, 2, Some(&m));
        assert!(on_a_toggle(&first).is_some());
        assert_ne!(
            on_a_toggle(&third),
            on_a_toggle(&first),
            "the CDU would read the same heartbeat for three periods"
        );
        // One sent, answered or not, counts: the next differs from it.
        let (fourth, _) = step(&mut d, 3, Some(&m));
        assert_ne!(on_a_toggle(&fourth), on_a_toggle(&third));
    }

    /// The valve-position faults among a step's events.
    fn position_faults(c: &Commands) -> usize {
        use loopwarden_protocol::{Event, Sensor};
        let fault = |e: &&Event| {
            matches!(
                e,
                Event::SensorFault {
                    sensor: Sensor::ValvePosition,
                    ..
                }
            )
        };
        c.events.iter().filter(fault).count()
    }

    #[test]
    fn a_valve_held_shut_while_the_record_is_not_in_flash_is_no_position_fault() {
        let lim = writes::tests::sim_cdu();
        let fresh: Result<Option<LatchRecord>, &str> = Ok(None);
        let mut d = Decider::new(CoreConfig::default(), lim, &fresh).unwrap();
        // Commissioning: every valve reads closed, and the flash keeps no
        // record, so only closings are written: the core's openings wait.
        let shut = measured(0b1111);
        let step_at = |d: &mut Decider, s: u64, keeps: bool| {
            let c = d.step(
                Some(&shut),
                &StepIn {
                    now_ms: s * 1000,
                    board: BoardRead::Absent,
                    ambient_c: Some(20.0),
                },
            );
            if d.to_keep().is_some() {
                d.kept(keeps);
            }
            let p = d.plan(&c, shut.valves_closed);
            d.written(&Outcome::whole(&p, true));
            (p, c)
        };
        for s in 0..30 {
            let (p, c) = step_at(&mut d, s, false);
            assert_eq!(p.value(Setting::Valves), Some(0.0), "step {s}: held shut");
            assert_eq!(position_faults(&c), 0, "step {s}: {:?}", c.events);
        }
        // Kept: the openings are written, and a valve that still reads
        // closed then is a fault of its position input.
        let mut faults = 0;
        for s in 30..40 {
            let (p, c) = step_at(&mut d, s, true);
            assert_eq!(
                p.value(Setting::Valves),
                Some(15.0),
                "step {s}: written open"
            );
            faults += position_faults(&c);
        }
        assert_eq!(faults, 4, "one per rack");
    }

    #[test]
    fn a_relatch_keeps_the_bms_limits_and_writes_no_valve_before_it() {
        let lim = writes::tests::sim_cdu();
        let mut d = Decider::new(CoreConfig::default(), lim, &Err("cdu.latched: damaged")).unwrap();
        assert!(d
            .take_said()
            .iter()
            .any(|s| s.error()
                && matches!(s, Said::RecordUnreadable { why } if why.contains("damaged"))));
        d.core_mut().set_limits(30.0, -2.0);
        // The CDU is silent: nothing to keep, no valve written, and
        // every rack's hosts held as a latched rack's.
        let racks = cooling_core::safety::all_racks(4);
        for s in 0..3 {
            let (p, c) = step(&mut d, s, None);
            assert_eq!(p.value(Setting::Valves), None, "{s}");
            assert_eq!(c.cooling_lost, racks);
            assert!(c.caps[..16].iter().all(|h| h.is_some()) && c.beacon);
        }
        assert!(d.relatch_pending());
        // An operator's clear now would be undone by the relatch.
        let clear = Traced::ClearLeak {
            rack: 1,
            leaks: LeakInputs::DRY,
        };
        assert_eq!(d.apply(&clear), Applied::Cleared(Err(RELATCH_PENDING)));
        // It answers: rack 1's valve reads closed and stays so.
        let m = measured(0b0010);
        let (p, c) = step(&mut d, 3, Some(&m));
        assert_eq!(p.value(Setting::Valves), Some(f64::from(0b1101u16)));
        assert!(!d.relatch_pending());
        assert_eq!(d.core().limits(), (30.0, -2.0), "the BMS's limits stand");
        assert_eq!(d.core().leaks_latched(), 0b0010);
        assert_eq!(c.cooling_lost, 0b0010, "the other racks are cooled again");
    }

    /// A sample host's telemetry (GPUs at 61–64 °C) heard by `d` as host
    /// `h`, at 1 s on its clock.
    fn hear_sample_as(d: &mut Decider, h: usize) -> Verdict {
        let t = loopwarden_protocol::samples::host_telemetry(8);
        let now = TimestampMs(1_800_000_000_000);
        d.hear_telemetry(h, &t, now, (1_000, now))
    }

    fn hear_sample(d: &mut Decider) -> Verdict {
        hear_sample_as(d, 0)
    }

    #[test]
    fn a_supply_reading_out_of_range_judges_no_gpu() {
        let lim = writes::tests::sim_cdu();
        let fresh: Result<Option<LatchRecord>, &str> = Ok(None);
        let mut d = Decider::new(CoreConfig::default(), lim, &fresh).unwrap();
        // A 4–20 mA loop shorted high: 150 °C, not yet confirmed as a
        // fault (that takes `fault_confirm_ms`), but no figure already.
        let mut m = measured(0);
        m.supply_c = Some(150.0);
        step(&mut d, 0, Some(&m));
        assert_eq!(
            d.core().sensor_fault(cooling_core::sensors::Which::Supply),
            None
        );
        assert_eq!(hear_sample(&mut d), Verdict::Believed);
        assert_eq!(d.hosts()[0].map(|r| r.gpus), Some(8));
    }

    /// A supply reading in range, but 11 K above the warmest GPU it
    /// cools: one host alone cannot outvote it (its agent may be broken
    /// or lying), two hosts, more than those that say otherwise, do.
    #[test]
    fn the_hall_outvotes_a_supply_reading_above_every_gpu_one_host_does_not() {
        let lim = writes::tests::sim_cdu();
        let fresh: Result<Option<LatchRecord>, &str> = Ok(None);
        let mut d = Decider::new(CoreConfig::default(), lim, &fresh).unwrap();
        let mut m = measured(0);
        m.supply_c = Some(75.0);
        step(&mut d, 0, Some(&m));
        for _ in 0..3 {
            assert!(matches!(
                hear_sample(&mut d),
                Verdict::BelievedWithout { .. }
            ));
            assert_eq!(d.hosts()[0].map(|r| r.gpus), Some(0), "one host alone");
        }
        // A second host says the same: the next reports keep their GPUs.
        assert!(matches!(
            hear_sample_as(&mut d, 1),
            Verdict::BelievedWithout { .. }
        ));
        assert_eq!(hear_sample(&mut d), Verdict::Believed);
        assert_eq!(hear_sample_as(&mut d, 1), Verdict::Believed);
        assert_eq!(d.hosts()[0].map(|r| r.gpus), Some(8));
        assert_eq!(d.hosts()[1].map(|r| r.gpus), Some(8));
        // One GPU under a supply the others stand above is still left
        // out once the hosts voted on that reading (each report votes
        // anew): no host votes against it.
        m.supply_c = Some(67.0);
        step(&mut d, 1, Some(&m));
        hear_sample_as(&mut d, 0);
        for h in [1, 0] {
            let v = hear_sample_as(&mut d, h);
            assert!(matches!(v, Verdict::BelievedWithout { .. }), "{v:?}");
        }
        assert_eq!(d.hosts()[0].map(|r| r.gpus), Some(6), "the two at 61 °C");
    }

    #[test]
    fn valves_closed_before_the_records_keep_are_taken_and_not_opened_before_it_goes_in() {
        let lim = writes::tests::sim_cdu();
        let fresh: Result<Option<LatchRecord>, &str> = Ok(None);
        let mut d = Decider::new(CoreConfig::default(), lim, &fresh).unwrap();
        step(&mut d, 0, Some(&measured(0)));
        assert_eq!(d.valves_taken(), Some(0b1111));
        // Rack 2 leaks: the record to keep, and the shell writes the
        // closings first (its flash is slow), which the CDU takes.
        let mut wet = measured(0);
        wet.leaks = Some(0b0100);
        let inp = StepIn {
            now_ms: 1000,
            board: BoardRead::Absent,
            ambient_c: Some(20.0),
        };
        let c = d.step(Some(&wet), &inp);
        assert!(d.to_keep().is_some());
        assert_eq!(c.valves_open, 0b1011);
        assert_eq!(d.apply(&Traced::EarlyValves(0b1011)), Applied::Done);
        assert_eq!(d.valves_taken(), Some(0b1011), "what the CDU holds");
        // The record does not go in, nor does the planned valve write.
        d.kept(false);
        let p = d.plan(&c, wet.valves_closed);
        d.written(&Outcome::whole(&p, false));
        assert_eq!(d.valves_taken(), Some(0b1011), "still what the CDU holds");
        // While the record is not in flash, rack 2 is not written open
        // again, whatever is asked.
        let mut reopen = c.clone();
        reopen.valves_open = 0b1111;
        let p = d.plan(&reopen, wet.valves_closed);
        assert_eq!(p.value(Setting::Valves), Some(11.0));
    }
}
