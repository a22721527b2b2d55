//! Properties of the decision path under faults. A [`Decider`] is driven
//! as the shells drive it (step, keep the latched record, plan, write
//! each setting on its own, written, take the events; an operator's
//! clear between steps, judged on the last step's leak inputs; a restart
//! makes a new decider from what the flash holds, as the Linux shell
//! does, or starts it again in place, as the firmware does) through
//! random sequences: a CDU that answers or not, leaks on the ropes and
//! in the CDU's own leak register, board reads that fail, ropes cut,
//! valve position inputs that lie (stuck closed or open) and valves that
//! seize, latch writes that fail, records at start absent, good or
//! unreadable, restarts with the newest record damaged, writes the CDU
//! refuses (an exception, a timeout), and register maps narrower than
//! the core's limits. After every step, what must hold is derived from
//! the sequence (the test's own model of the hall and the flash), not
//! from the decider's answers:
//! 1. a rack whose leak a working input saw is latched, and its valve is
//!    never planned open, across restarts and unreadable records, until
//!    an operator's clear that the rules allow;
//! 2. no valve is planned open on a step whose latch write failed, and
//!    closing always proceeds;
//! 3. the writes are in safety order, and the heartbeat goes out exactly
//!    when every safety write that was due went in, one past the last sent;
//! 4. every value lies in the map's range, a value asked outside it is
//!    written at the bound, and `SettingLimited` says so once when it
//!    begins and once when it ends;
//! 5. an unreadable record is never overwritten before the valve
//!    positions are read and relatched.
//!
//! What the rules leave open is said where it is checked: a valve input
//! stuck at "open" read at a relatch or before a process's first valve
//! write ([`after_step`], [`check_plan`]), and closing where no valve
//! position can be known ([`check_plan`]). Clears are asked before a
//! process's first step and after a step the CDU did not answer too, and
//! the core must refuse them while an input last heard read wet
//! ([`clear`]).
//!
//! Glossary:
//! - *must-latch*: the racks the sequence says are latched now (a leak
//!   seen by a working input, a record restored, a relatch), less those
//!   an allowed clear released.
//! - *hall*: the test's CDU (its valve register, the valves as they are,
//!   their position inputs), its leak inputs and the board's.
//! - *told*: the CDU's valve register, what it was last told; a seized
//!   valve may stand otherwise.

use std::fmt;

use cooling_core::{Commands, CoreConfig, Latched, LeakInputs};
use cooling_decide::{
    leak_inputs, BoardRead, CduMeasurements, Decider, LatchRecord, MapLimits, Outcome, Plan, Said,
    Setting, StepIn,
};
use loopwarden_protocol::message::{CduSetting, Event, Pump};
use proptest::prelude::*;

/// Racks of the reference hall ([`CoreConfig::default`]).
const RACKS: usize = 4;
/// Every rack, bit n = rack n.
const ALL: u16 = (1 << RACKS) - 1;

/// A valve position input: true, or stuck at one reading.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Feedback {
    Honest,
    StuckClosed,
    StuckOpen,
}

/// Why the CDU refused a write.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    Exception(u8),
    Timeout,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Exception(code) => write!(f, "Modbus exception {code}"),
            Refusal::Timeout => write!(f, "no answer within 500 ms"),
        }
    }
}

/// What the flash held at the first start.
#[derive(Debug, Clone, Copy)]
enum Start {
    Nothing,
    /// A good record with these racks latched (their valves shut).
    Record(u16),
    /// An unreadable record; these valves were shut when it was written.
    Unreadable(u16),
}

/// The site: its CDU's map, its board, its racks without a rope.
#[derive(Debug, Clone)]
struct Site {
    limits: MapLimits,
    board: bool,
    /// The CDU's map has its leak register.
    cdu_leaks: bool,
    unprotected: u16,
    start: Start,
}

/// What happens at one step.
#[derive(Debug, Clone)]
struct World {
    cdu_answers: bool,
    /// A rope, the CDU's leak input and a rope's supervision that change.
    rope: Option<usize>,
    cdu_leak: Option<usize>,
    rope_fault: Option<usize>,
    board_fails: bool,
    feedback: Option<(usize, Feedback)>,
    /// A valve that seizes or frees.
    seize: Option<usize>,
    latch_ok: bool,
    /// Per [`Setting::ORDER`]: the CDU refuses that write.
    refused: [Option<Refusal>; 6],
    /// An operator asks to clear this rack's leak before the step.
    clear: Option<usize>,
    /// The controller restarts before the step.
    restart: Option<Restart>,
    wobble_c: f64,
}

/// A restart of the controller.
#[derive(Debug, Clone, Copy)]
struct Restart {
    /// The newest record is damaged (a power cut while it was written).
    damaged: bool,
    /// The decider is started again in place (as the firmware does),
    /// else a new one is made (as the Linux shell does).
    in_place: bool,
}

fn rack() -> impl Strategy<Value = Option<usize>> {
    prop::option::weighted(0.04, 0..RACKS)
}

fn limits() -> impl Strategy<Value = MapLimits> {
    // Ranges on the registers' grid (0.5 °C, 1 %), some narrower than
    // the core's own (17 to 45 °C, 30 to 100 %).
    // A map's range is never empty, and the setpoint's reaches above the
    // core's lowest (a map the core cannot work in is refused at start).
    let setpoint = (20u32..60, 50u32..100)
        .prop_map(|(lo, hi)| (f64::from(lo) / 2.0, f64::from(hi.max(lo + 1)) / 2.0));
    let speed =
        (0u32..60, 50u32..=100).prop_map(|(lo, hi)| (f64::from(lo), f64::from(hi.max(lo + 1))));
    (
        prop::array::uniform6(prop::bool::weighted(0.9)),
        prop::option::weighted(0.9, setpoint),
        prop::option::weighted(0.9, speed),
        prop::bool::weighted(0.8),
    )
        .prop_map(|(mut mapped, setpoint_c, speed_pct, positions)| {
            // The valves mapped: without them nothing here can fail.
            mapped[0] = true;
            MapLimits {
                mapped,
                setpoint_c,
                speed_pct,
                positions,
            }
        })
}

fn site() -> impl Strategy<Value = Site> {
    let start = prop_oneof![
        Just(Start::Nothing),
        (0..=ALL).prop_map(Start::Record),
        (0..=ALL).prop_map(Start::Unreadable),
    ];
    (
        limits(),
        prop::bool::weighted(0.8),
        prop::bool::weighted(0.8),
        prop_oneof![4 => Just(0u16), 1 => 0..=ALL],
        start,
    )
        .prop_map(|(limits, board, cdu_leaks, unprotected, start)| Site {
            limits,
            board,
            cdu_leaks,
            unprotected,
            start,
        })
}

fn refusal() -> impl Strategy<Value = Option<Refusal>> {
    prop::option::weighted(
        0.05,
        prop_oneof![
            (1u8..12).prop_map(Refusal::Exception),
            Just(Refusal::Timeout)
        ],
    )
}

fn world() -> impl Strategy<Value = World> {
    let feedback = prop_oneof![
        2 => Just(Feedback::Honest),
        1 => Just(Feedback::StuckClosed),
        1 => Just(Feedback::StuckOpen),
    ];
    (
        (prop::bool::weighted(0.85), rack(), rack(), rack()),
        (
            prop::bool::weighted(0.1),
            prop::option::weighted(0.05, (0..RACKS, feedback)),
            prop::option::weighted(0.03, 0..RACKS),
        ),
        (prop::bool::weighted(0.7), prop::array::uniform6(refusal())),
        (
            prop::option::weighted(0.15, 0..RACKS + 1),
            prop::option::weighted(
                0.04,
                (any::<bool>(), any::<bool>())
                    .prop_map(|(damaged, in_place)| Restart { damaged, in_place }),
            ),
            -0.3f64..0.3,
        ),
    )
        .prop_map(
            |(
                (cdu_answers, rope, cdu_leak, rope_fault),
                (board_fails, feedback, seize),
                (latch_ok, refused),
                (clear, restart, wobble_c),
            )| World {
                cdu_answers,
                rope,
                cdu_leak,
                rope_fault,
                board_fails,
                feedback,
                seize,
                latch_ok,
                refused,
                clear,
                restart,
                wobble_c,
            },
        )
}

fn bit(mask: u16, r: usize) -> u16 {
    1 << r & mask
}

/// The test's CDU and leak inputs.
#[derive(Debug)]
struct Hall {
    ropes_wet: u16,
    cdu_wet: u16,
    rope_faults: u16,
    feedback: [Feedback; RACKS],
    seized: u16,
    /// The valves register: what the CDU was last told.
    valves_told: u16,
    /// The valves as they are.
    valves_open: u16,
    pumps_run: u8,
}

impl Hall {
    fn new(open: u16) -> Self {
        Self {
            ropes_wet: 0,
            cdu_wet: 0,
            rope_faults: 0,
            feedback: [Feedback::Honest; RACKS],
            seized: 0,
            valves_told: open,
            valves_open: open,
            pumps_run: 1,
        }
    }

    fn change(&mut self, w: &World, unprotected: u16) {
        let flip = |m: &mut u16, r: Option<usize>| {
            if let Some(r) = r {
                *m ^= 1 << r;
            }
        };
        flip(&mut self.ropes_wet, w.rope);
        // No rope under a rack declared without one.
        self.ropes_wet &= !unprotected;
        flip(&mut self.cdu_wet, w.cdu_leak);
        flip(&mut self.rope_faults, w.rope_fault);
        flip(&mut self.seized, w.seize);
        if let Some((r, f)) = w.feedback {
            self.feedback[r] = f;
        }
    }

    /// The valves reading closed, as their inputs say.
    fn reads_closed(&self) -> u16 {
        (0..RACKS)
            .map(|r| match self.feedback[r] {
                Feedback::Honest => bit(!self.valves_open, r),
                Feedback::StuckClosed => 1 << r,
                Feedback::StuckOpen => 0,
            })
            .fold(0, |a, b| a | b)
    }

    /// The valves whose input is stuck at "open".
    fn stuck_open(&self) -> u16 {
        (0..RACKS)
            .filter(|r| self.feedback[*r] == Feedback::StuckOpen)
            .fold(0, |a, r| a | 1 << r)
    }

    fn measured(&self, site: &Site, w: &World) -> Option<CduMeasurements> {
        let s = 30.0 + w.wobble_c;
        let running = [self.pumps_run & 1 != 0, self.pumps_run & 2 != 0];
        let flowing = running[0] || running[1];
        w.cdu_answers.then(|| CduMeasurements {
            supply_c: Some(s),
            return_c: Some(s + 8.0),
            flow_lpm: Some(if flowing { 192.0 } else { 3.0 }),
            facility_supply_c: Some(27.0),
            pumps_running: running.map(Some),
            leaks: site.cdu_leaks.then_some(self.cdu_wet),
            diff_pressure_kpa: Some(if flowing { 100.0 } else { 2.0 }),
            valves_closed: site.limits.positions.then(|| self.reads_closed()),
            pump_faults: [Some(false); 2],
            it_w: Some(80_000.0),
            cooling_w: None,
            facility_w: Some(88_000.0),
            outdoor_c: Some(20.0),
        })
    }

    fn board(&self, site: &Site, w: &World) -> BoardRead {
        match (site.board, w.board_fails) {
            (false, _) => BoardRead::Absent,
            (true, true) => BoardRead::Failed,
            (true, false) => BoardRead::Read {
                wet: self.ropes_wet,
                faults: self.rope_faults,
            },
        }
    }

    /// The CDU takes `value` for `s` (a valve seized stays as it is).
    fn take(&mut self, s: Setting, value: f64) {
        match s {
            Setting::Valves => {
                let v = value as u16;
                self.valves_told = v;
                self.valves_open = (v & !self.seized) | (self.valves_open & self.seized);
            }
            Setting::PumpsRun => self.pumps_run = value as u8,
            _ => {}
        }
    }
}

/// What the flash holds: a record (with the racks that must be latched
/// when it went in), nothing, or a damaged record.
#[derive(Debug, Clone, Copy)]
enum Flash {
    Nothing,
    Record(LatchRecord, u16),
    Damaged,
}

impl Flash {
    fn read(&self) -> Result<Option<LatchRecord>, &'static str> {
        match self {
            Flash::Nothing => Ok(None),
            Flash::Record(r, _) => Ok(Some(*r)),
            Flash::Damaged => Err(
                "cdu.latched: the newest readable record is generation 3, but generation 4 was written",
            ),
        }
    }
}

/// What the sequence says the decider must hold, per process.
#[derive(Debug)]
struct Model {
    must: u16,
    /// The record read at start was unreadable and no relatch happened.
    pending: bool,
    /// Per clamped setting (setpoint, speed): held to the map now.
    limited: [bool; 2],
    /// A valve write went in since this process started.
    valves_taken: bool,
    /// The leak inputs of the last step, as the shell keeps them for a
    /// clear (none before the first step of a process).
    last_leaks: Option<LeakInputs>,
    /// The process's clock, ms.
    now_ms: u64,
    /// The heartbeat last sent by this process (0: none).
    heartbeat: f64,
}

impl Model {
    fn start(flash: &Flash) -> Self {
        let (must, pending) = match flash {
            Flash::Nothing => (0, false),
            Flash::Record(_, must) => (*must, false),
            Flash::Damaged => (0, true),
        };
        Self {
            must,
            pending,
            limited: [false; 2],
            valves_taken: false,
            last_leaks: None,
            now_ms: 0,
            heartbeat: 0.0,
        }
    }
}

fn config(site: &Site) -> CoreConfig {
    let mut cfg = CoreConfig::default();
    cfg.layout.unprotected = site.unprotected;
    cfg
}

/// The decider started on what `flash` holds: `old` started again in
/// place, or a new one; checks what the start must say.
fn start(
    site: &Site,
    flash: &Flash,
    old: Option<Box<Decider>>,
) -> Result<Box<Decider>, TestCaseError> {
    let (cfg, read) = (config(site), flash.read());
    let refused = |e| TestCaseError::fail(format!("refused: {e}"));
    let mut d = match old {
        Some(mut d) => {
            d.start(cfg, site.limits, &read).map_err(refused)?;
            d
        }
        None => Box::new(Decider::new(cfg, site.limits, &read).map_err(refused)?),
    };
    let said = d.take_said();
    let unreadable = said
        .iter()
        .any(|s| matches!(s, Said::RecordUnreadable { .. }));
    prop_assert_eq!(unreadable, matches!(flash, Flash::Damaged));
    // The tighter of the core's limits and the map's wins, and says so.
    if let Some((lo, hi)) = site.limits.setpoint_c {
        let cdu = &d.core().config().cdu;
        prop_assert_eq!(cdu.min_setpoint_c, (lo as f32).max(17.0));
        prop_assert_eq!(cdu.max_setpoint_c, (hi as f32).min(45.0));
        let said_lo = said
            .iter()
            .any(|s| matches!(s, Said::LowestSetpoint { .. }));
        prop_assert_eq!(said_lo, lo > 17.0);
    }
    Ok(d)
}

/// The first flash and the hall's valves at the start.
fn first(site: &Site) -> (Flash, u16) {
    match site.start {
        Start::Nothing => (Flash::Nothing, ALL),
        Start::Record(leaks) => {
            let latched = Latched {
                leaks,
                ..Latched::default()
            };
            let r = LatchRecord {
                generation: 5,
                latched,
            };
            (Flash::Record(r, leaks), ALL & !leaks)
        }
        Start::Unreadable(closed) => (Flash::Damaged, ALL & !closed),
    }
}

/// The racks a working input reads wet this step: a rope read and
/// supervised, or the CDU's own leak register where it answered.
fn wet_seen(site: &Site, h: &Hall, w: &World) -> u16 {
    let ropes = if site.board && !w.board_fails {
        h.ropes_wet & !h.rope_faults & !site.unprotected
    } else {
        0
    };
    let cdu = if w.cdu_answers && site.cdu_leaks {
        h.cdu_wet
    } else {
        0
    };
    (ropes | cdu) & ALL
}

/// An operator's clear of `rack` before the step, as the shell asks it
/// (on the last step's leak inputs): if the core takes it, the rules
/// must allow it, and the rack is released.
fn clear(d: &mut Decider, m: &mut Model, site: &Site, rack: usize) -> Result<(), TestCaseError> {
    // Before a process's first step both shells judge a clear on
    // `LeakInputs::DRY`; after a step the CDU did not answer, on the ropes
    // alone. The core refuses either while an input last heard read the
    // rack wet.
    let last = m.last_leaks.unwrap_or(LeakInputs::DRY);
    if d.core_mut().clear_leak(rack, &last).is_err() {
        return Ok(());
    }
    prop_assert!(rack < RACKS);
    let b = 1u16 << rack;
    prop_assert!(last.read_ok, "cleared with the leak inputs unread");
    prop_assert!(
        last.rope_faults & b & !site.unprotected == 0,
        "cleared with the rope cut"
    );
    prop_assert!(last.wet_now() & b == 0, "cleared while it reads wet");
    m.must &= !b;
    Ok(())
}

/// After the step: the relatch and the leaks seen, then what the core
/// and the decider must hold.
fn after_step(
    d: &Decider,
    m: &mut Model,
    site: &Site,
    cdu: Option<&CduMeasurements>,
    wet: u16,
    c: &Commands,
) -> Result<(), TestCaseError> {
    let closed = cdu.and_then(|r| r.valves_closed);
    if m.pending && (!site.limits.positions || closed.is_some()) {
        // A lying "open" input here loses its rack's latch: the rules
        // relatch from the positions read, all they can know.
        m.must |= if site.limits.positions {
            closed.unwrap_or(0) & ALL
        } else {
            ALL
        };
        m.pending = false;
    }
    m.must |= wet;
    prop_assert_eq!(d.relatch_pending(), m.pending);
    let latched = d.core().leaks_latched();
    prop_assert_eq!(latched & m.must, m.must, "latched {:04b}", latched);
    prop_assert_eq!(c.valves_open & m.must, 0, "asked open while latched");
    Ok(())
}

/// Keeps the latched record as the shell does; returns whether a write
/// this step failed.
fn keep(d: &mut Decider, m: &Model, flash: &mut Flash, ok: bool) -> Result<bool, TestCaseError> {
    let Some(r) = d.to_keep() else {
        if !m.pending {
            // Nothing to keep: the flash holds what must be latched.
            let Flash::Record(k, _) = flash else {
                return Err(TestCaseError::fail(format!(
                    "nothing to keep while the flash holds {flash:?}"
                )));
            };
            prop_assert_eq!(k.latched.leaks & m.must, m.must);
        }
        return Ok(false);
    };
    prop_assert!(!m.pending, "an unreadable record overwritten");
    prop_assert_eq!(r.latched.leaks & m.must, m.must);
    if let Flash::Record(k, _) = flash {
        prop_assert!(
            r.generation > k.generation,
            "{} after {}",
            r.generation,
            k.generation
        );
    }
    if ok {
        *flash = Flash::Record(r, m.must);
    }
    d.kept(ok);
    Ok(!ok)
}

/// The plan's order, its valves and pumps.
fn check_plan(
    p: &Plan,
    c: &Commands,
    m: &Model,
    site: &Site,
    h: &Hall,
    (failed, positions_read): (bool, bool),
) -> Result<(), TestCaseError> {
    let at = |s: Setting| Setting::ORDER.iter().position(|o| *o == s).unwrap();
    let order: Vec<usize> = p.writes.iter().map(|w| at(w.setting)).collect();
    prop_assert!(order.windows(2).all(|w| w[0] < w[1]), "{:?}", order);
    for (i, s) in Setting::ORDER.iter().enumerate() {
        let planned = p.value(*s).is_some();
        let want = site.limits.mapped[i] && *s != Setting::Valves;
        prop_assert!(
            planned == want || *s == Setting::Valves,
            "{s:?} planned {planned}"
        );
    }
    prop_assert_eq!(
        p.value(Setting::PumpsRun),
        Some(f64::from(
            u8::from(c.pump_on[0]) | u8::from(c.pump_on[1]) << 1
        ))
        .filter(|_| site.limits.mapped[1])
    );
    let lead = if c.lead == Pump::B { 1.0 } else { 0.0 };
    prop_assert_eq!(
        p.value(Setting::LeadPump),
        Some(lead).filter(|_| site.limits.mapped[2])
    );
    let valves = p.value(Setting::Valves).map(|v| v as u16);
    if m.pending {
        prop_assert_eq!(valves, None, "a valve written before the relatch");
        return Ok(());
    }
    // Closing proceeds wherever the decider can know which valves are
    // open: the positions read this step, or a valve write of this
    // process gone in. Left open by the rules: where it cannot (the CDU
    // silent, or a map without positions before the first valve write
    // of the process goes in), a step whose latch write failed can only
    // close a valve by writing the whole register, so it would close
    // every rack or open some; the decider writes none until a latch
    // write goes in (and a leak behind it escalates after 5 s).
    let known = positions_read || m.valves_taken;
    prop_assert!(valves.is_some() || !known, "closing held back");
    let Some(v) = valves else {
        return Ok(());
    };
    prop_assert_eq!(v & m.must, 0, "a latched rack's valve planned open");
    prop_assert_eq!(
        v & !c.valves_open,
        0,
        "a valve the core closes planned open"
    );
    if failed {
        // A valve opens when it is told open while it is shut and told
        // shut (one told open already, seized shut, opens nothing new).
        // Left open by the rules: before this process's first valve write
        // goes in, the positions read are all it knows of them, and an
        // input stuck at "open" on a shut valve is not found out (only
        // "closed" on a valve told open is).
        let lying = if m.valves_taken { 0 } else { h.stuck_open() };
        let open = h.valves_told | h.valves_open | lying;
        prop_assert_eq!(v & !open, 0, "opened after a failed latch write");
    } else {
        prop_assert_eq!(v, c.valves_open);
    }
    Ok(())
}

/// The setpoint and speed in the map's range, at the bound when asked
/// outside it; the events a limit that begins or ends must give.
fn check_limits(
    p: &Plan,
    c: &Commands,
    m: &mut Model,
    site: &Site,
) -> Result<Vec<Event>, TestCaseError> {
    let asked = [
        (f64::from(c.setpoint_c) * 100.0).round() / 100.0,
        (f64::from(c.pump_speed) * 1000.0).round() / 10.0,
    ];
    let ranges = [site.limits.setpoint_c, site.limits.speed_pct];
    let settings = [Setting::Setpoint, Setting::PumpSpeed];
    let names = [CduSetting::SupplySetpoint, CduSetting::PumpSpeed];
    let mut events = Vec::new();
    for i in 0..2 {
        let (lo, hi) = ranges[i].unwrap_or((f64::NEG_INFINITY, f64::INFINITY));
        let written = if asked[i] < lo {
            lo
        } else if asked[i] > hi {
            hi
        } else {
            asked[i]
        };
        let mapped = site.limits.mapped[if i == 0 { 5 } else { 4 }];
        prop_assert_eq!(p.value(settings[i]), Some(written).filter(|_| mapped));
        let limited = written != asked[i];
        if limited != m.limited[i] {
            events.push(Event::SettingLimited {
                setting: names[i],
                wanted_centi: (asked[i] * 100.0).round() as i32,
                written_centi: (written * 100.0).round() as i32,
                active: limited,
            });
        }
        m.limited[i] = limited;
    }
    Ok(events)
}

/// Writes the plan as the shell does, each setting on its own, the
/// heartbeat only when due; checks that it went out exactly when every
/// safety write planned went in.
fn write(p: &Plan, h: &mut Hall, m: &mut Model, w: &World) -> Result<Outcome, TestCaseError> {
    let mut o = Outcome::default();
    let mut safety_in = true;
    let beat = p.value(Setting::Heartbeat).unwrap_or(m.heartbeat + 1.0);
    prop_assert_eq!(beat, m.heartbeat + 1.0, "not one past the last sent");
    for wr in &p.writes {
        if !o.due(wr) {
            prop_assert_eq!(wr.setting, Setting::Heartbeat);
            prop_assert!(!safety_in, "the heartbeat held back, safety writes in");
            continue;
        }
        if wr.setting == Setting::Heartbeat {
            prop_assert!(safety_in, "heartbeat after a safety write failed");
            (o.heartbeat_sent, m.heartbeat) = (true, wr.value);
        }
        let i = Setting::ORDER.iter().position(|s| *s == wr.setting);
        let i = i.unwrap();
        let refused = w.refused[i].filter(|_| w.cdu_answers);
        let silent = (!w.cdu_answers).then_some(Refusal::Timeout);
        match refused.or(silent) {
            Some(why) => {
                safety_in &= !wr.setting.safety();
                o.record(wr.setting, Err(why));
            }
            None => {
                h.take(wr.setting, wr.value);
                m.valves_taken |= wr.setting == Setting::Valves;
                o.record(wr.setting, Ok::<(), Refusal>(()));
            }
        }
    }
    Ok(o)
}

/// One step of the shell, and every check after it.
fn play(
    d: &mut Decider,
    m: &mut Model,
    site: &Site,
    h: &mut Hall,
    flash: &mut Flash,
    w: &World,
) -> Result<(), TestCaseError> {
    h.change(w, site.unprotected);
    if let Some(r) = w.clear {
        clear(d, m, site, r)?;
    }
    let cdu = h.measured(site, w);
    let board = h.board(site, w);
    let c = d.step(
        cdu.as_ref(),
        &StepIn {
            now_ms: m.now_ms,
            board,
            ambient_c: Some(20.0),
        },
    );
    m.now_ms += 1000;
    m.last_leaks = Some(leak_inputs(board, cdu.and_then(|r| r.leaks)));
    after_step(d, m, site, cdu.as_ref(), wet_seen(site, h, w), &c)?;
    let failed = keep(d, m, flash, w.latch_ok)?;
    let closed = cdu.and_then(|r| r.valves_closed);
    let p = d.plan(&c, closed);
    check_plan(&p, &c, m, site, h, (failed, closed.is_some()))?;
    let events = check_limits(&p, &c, m, site)?;
    let o = write(&p, h, m, w)?;
    d.written(&o);
    let said = d.take_events();
    prop_assert_eq!(said.as_slice(), events.as_slice());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn leaks_stay_latched_writes_go_in_order_and_within_the_map_under_faults(
        site in site(),
        steps in prop::collection::vec(world(), 1..120),
    ) {
        let (mut flash, open) = first(&site);
        let mut hall = Hall::new(open);
        let mut d = start(&site, &flash, None)?;
        let mut m = Model::start(&flash);
        for w in &steps {
            if let Some(r) = w.restart {
                if r.damaged {
                    flash = Flash::Damaged;
                }
                d = start(&site, &flash, r.in_place.then_some(d))?;
                m = Model::start(&flash);
            }
            play(&mut d, &mut m, &site, &mut hall, &mut flash, w)?;
        }
    }
}
