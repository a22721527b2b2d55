//! The firmware's controller around the shared decision path
//! ([`cooling_decide::Decider`], the code `cooling-ctrl run` runs): every
//! call into it goes through [`Decider::apply`], and each input it
//! applies is written to the debug port ([`Trace::Input`]) with the
//! digest of what it gave after it ([`Trace::Digest`]), so that a
//! replayer on another machine decides the same step by step
//! (`loopwarden_link::trace::Replayer`). Pure: the board's shell does the
//! I/O (Modbus RTU, flash, the UARTs) between the stages, in the Linux
//! shell's order:
//! 1. what the gateway said since the last step ([`Controller::hear`],
//!    at most [`HEAR_MAX_BYTES`] a call, `controller/down.rs`);
//! 2. the CDU read (the shell's);
//! 3. [`Controller::step`]: `Traced::Step`, its instructions counted;
//! 4. [`Controller::to_keep`], the record to flash (the shell's),
//!    [`Controller::kept`];
//! 5. [`Controller::plan`], the writes and the read-back of the safety
//!    writes (the shell's, [`Controller::read_back_changed`]),
//!    [`Controller::written`];
//! 6. [`Controller::report`]: the step's events and what the decision
//!    path said, the core's offer to the hall's facility coordinator when
//!    it moved ([`OfferWatch`], the rule `run` publishes it by), the
//!    status, then the leases due ([`LeaseBook`]: one not queued is due
//!    again, so they go after what would be lost), and the cost. The
//!    status and the leases go only while the gateway's layout (its
//!    `Alive`) is this controller's: against another, a rack's bit or a
//!    host's index names another rack or host there, so the gateway
//!    hears no status and tells the bus the controller is silent, and
//!    host reports are not taken either (`controller/down.rs`).
//!
//! What the estimator learned goes to flash and back through it too
//! ([`crate::learned`]): restored at start ([`Controller::restore_learned`],
//! traced), kept every ten minutes ([`Controller::learned_to_keep`],
//! [`Controller::learned_kept`]) by its keeper ([`LearnedKeeper`]).
//!
//! Its ports ([`Ports`]) take messages to the gateway, records to the
//! trace and lines for the console; none of them waits.
//!
//! Glossary:
//! - *MCU clock*: ms since the board started (each step's `now_ms`).
//! - *wall clock*: Unix ms, known from the gateway's last `Alive`.

mod down;
mod resend;
mod wall;

use core::fmt;

use cooling_core::sensors::Which;
use cooling_core::{Commands, LeakInputs, MAX_HOSTS};
use cooling_decide::facility::{offer_msg, OfferWatch};
use cooling_decide::learned::{LearnedKeeper, ToKeep, LEARNED_KEYS};
use cooling_decide::leases::{LeaseBook, Order, LEASE_DEFAULT};
use cooling_decide::outdoor::OutdoorSources;
use cooling_decide::{
    leak_inputs, Applied, BoardRead, CduMeasurements, Decider, LatchRecord, Opening, Outcome, Plan,
    StepIn, Traced,
};
use loopwarden_link::trace::Trace;
use loopwarden_link::{CduLayout, Cost, Deframer, Hello, RackBits, SeqWatch, Status, Up};

use crate::clears::{ClearGate, Taken};
use crate::cost::InsnStats;
use crate::outbound::MAX_FRAME;

pub use down::{LinkCounts, StepKeep, HEAR_MAX_BYTES};

/// Said to the gateway at the first latched record that did not go to
/// flash.
pub const LATCH_NOT_KEPT: &str =
    "the latched record is not in flash: no valve opens until one goes in (replace the flash part)";
/// Said to the gateway when a record goes in after failures.
pub const LATCH_KEPT_AGAIN: &str = "the latched record is in flash again";

/// Words of a line to the gateway ([`Up::Said`]).
pub type Said = heapless::String<{ loopwarden_link::message::SAID_MAX }>;

/// Where the controller's output goes; nothing here waits.
pub trait Ports {
    /// A message to the gateway; `false` when it could not be queued.
    fn up(&mut self, up: &Up) -> bool;
    /// A record for the debug port's trace.
    fn trace(&mut self, t: &Trace);
    /// A line for the console.
    fn say(&mut self, line: fmt::Arguments<'_>);
    /// The instruction counter now.
    fn insn_mark(&mut self) -> u32;
    /// Instructions since `mark`.
    fn insn_since(&mut self, mark: u32) -> u32;
    /// The deepest the stack has been since the start, bytes.
    fn stack_peak(&mut self) -> u32;
    /// Keeps clear `t`'s number in flash as its operator's last, before
    /// the clear is acted on; whether it went in (one that did not is
    /// said on the console here).
    fn keep_clear(&mut self, t: &Taken) -> bool;
}

/// `d` as it prints, cut on a character boundary to a [`Said`], marked
/// `…` when cut.
pub fn said_words(d: &impl fmt::Display) -> Said {
    const CUT: &str = "…";
    let w = cooling_decide::said::words(d);
    let room = Said::new().capacity();
    if w.len() <= room {
        return Said::try_from(w.as_str()).unwrap_or_default();
    }
    let mut end = room - CUT.len();
    while !w.is_char_boundary(end) {
        end -= 1;
    }
    let mut said = Said::try_from(&w[..end]).unwrap_or_default();
    // Fits: `end` leaves room for the mark.
    let _ = said.push_str(CUT);
    said
}

/// The wall clock as the gateway last gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WallClock {
    /// Unix ms at `at_ms`.
    pub unix_ms: u64,
    /// When it was told, MCU clock.
    pub at_ms: u64,
}

impl WallClock {
    /// Unix ms at `now_ms` (MCU clock).
    pub fn at(&self, now_ms: u64) -> u64 {
        self.unix_ms
            .saturating_add(now_ms.saturating_sub(self.at_ms))
    }
}

/// The controller between steps.
pub struct Controller<'d> {
    decider: &'d mut Decider,
    /// What the estimator learned, on its way to flash (in a static: it
    /// holds the figures being kept).
    learned: &'d mut LearnedKeeper,
    leases: LeaseBook,
    /// Leases due again: the gateway may have missed them.
    resend: resend::Resend,
    /// Answers to clears the gateway's queue had no room for, sent at
    /// the next step.
    answers: heapless::Deque<(u32, Result<(), Said>), { down::ANSWERS_HELD }>,
    /// When the core's offer to the hall goes to the gateway.
    offers: OfferWatch,
    outdoor: OutdoorSources,
    gate: ClearGate,
    /// The gateway link's receiving side.
    deframer: Deframer<MAX_FRAME>,
    seq: SeqWatch,
    /// The last frame's number and its bytes' fingerprint, to tell a
    /// repeat.
    last_in: Option<(u32, u32)>,
    /// What the link brought.
    pub link: LinkCounts,
    /// The wall clock as the gateway gives it, held from going back.
    wall: wall::Wall,
    /// The gateway's broker connection, as it last said.
    bus: bool,
    /// When the gateway was last heard, MCU clock.
    heard_ms: Option<u64>,
    /// The leak inputs and the pump faults of the last step (what a
    /// clear is judged on); the pump faults `None` while the CDU has not
    /// answered since the start or did not answer at the last step (a
    /// pump's clear is refused then), a bit `None` where the map lacks it.
    leaks: LeakInputs,
    pump_faults: Option<[Option<bool>; 2]>,
    hosts: usize,
    /// The layout of the figures built in, their record's digest, and
    /// the gateway's layout as its last `Alive` gave it (none since the
    /// start, or since it started again): host reports, the status and
    /// the leases cross the link only while the two agree.
    layout: CduLayout,
    figures_digest: u32,
    gateway_layout: Option<CduLayout>,
    /// When the disagreement was last said, MCU clock.
    disagreement_said_ms: Option<u64>,
    /// The last step's input, kept here: the decision path reads it while
    /// its step runs, deepest on the stack.
    input: Traced,
    /// The digest of the last step's commands (the commands themselves
    /// stay in the decider: [`Decider::last_commands`]).
    digest: Option<u32>,
    readings: Option<CduMeasurements>,
    outdoor_c: Option<f32>,
    insn_now: u32,
    /// Instructions of each step's decision.
    pub insn: InsnStats,
    steps: u32,
    /// The last latched record did not go to flash (said to the gateway
    /// at the first of a run of failures, and when one goes in again).
    latch_failing: bool,
    /// The gateway started again since the last step's read-back: what
    /// the read-back finds is said to it again.
    read_back_again: bool,
    /// The gateway started again since the last keep of the latched
    /// record: one that does not go in is said to it again.
    latch_again: bool,
}

impl<'d> Controller<'d> {
    /// A controller of `decider` (built for the board's configuration and
    /// map), taking clears through `gate`, keeping what was learned
    /// through `learned`.
    pub fn new(decider: &'d mut Decider, gate: ClearGate, learned: &'d mut LearnedKeeper) -> Self {
        let cfg = *decider.core().config();
        let hosts = cfg.layout.hosts().min(MAX_HOSTS);
        Self {
            leases: LeaseBook::new(hosts, LEASE_DEFAULT, cfg.gpu.tdp_w),
            resend: resend::Resend::new(),
            answers: heapless::Deque::new(),
            offers: OfferWatch::new(),
            decider,
            learned,
            outdoor: OutdoorSources::new(),
            gate,
            deframer: Deframer::default(),
            seq: SeqWatch::default(),
            last_in: None,
            link: LinkCounts::default(),
            wall: wall::Wall::default(),
            bus: false,
            heard_ms: None,
            leaks: LeakInputs::DRY,
            pump_faults: None,
            hosts,
            layout: CduLayout::from(&cfg.layout),
            figures_digest: 0,
            gateway_layout: None,
            disagreement_said_ms: None,
            latch_failing: false,
            read_back_again: false,
            latch_again: false,
            input: Traced::ToKeep,
            digest: None,
            readings: None,
            outdoor_c: None,
            insn_now: 0,
            insn: InsnStats::new(),
            steps: 0,
        }
    }

    /// The digest of the figures record built in
    /// ([`crate::figures::digest`]), said with a layout the gateway does
    /// not share.
    pub fn set_digest(&mut self, digest: u32) {
        self.figures_digest = digest;
    }

    /// This controller's layout, and the gateway's as it last said it.
    pub fn layouts(&self) -> (CduLayout, Option<CduLayout>) {
        (self.layout, self.gateway_layout)
    }

    /// The gateway said its layout, and it is this controller's: host
    /// indices and rack bits mean the same hosts and racks on both ends.
    pub fn layouts_agree(&self) -> bool {
        self.gateway_layout == Some(self.layout)
    }

    /// The decision path.
    pub fn decider(&self) -> &Decider {
        self.decider
    }

    /// The last step's commands.
    pub fn commands(&self) -> Option<&Commands> {
        self.decider.last_commands()
    }

    /// What the CDU answered at the last step (`None`: it did not).
    pub fn readings(&self) -> Option<&CduMeasurements> {
        self.readings.as_ref()
    }

    /// The last step's decision, instructions.
    pub fn insn_last(&self) -> u32 {
        self.insn_now
    }

    /// The wall clock at `now_ms`, if the gateway gave it.
    pub fn wall_ms(&self, now_ms: u64) -> Option<u64> {
        self.wall.at(now_ms)
    }

    /// When the gateway was last heard, MCU clock, and whether it said
    /// it was connected to the broker.
    pub fn gateway(&self) -> (Option<u64>, bool) {
        (self.heard_ms, self.bus)
    }

    /// The clears' gate (to restore the operators' last ids at start).
    pub fn gate_mut(&mut self) -> &mut ClearGate {
        &mut self.gate
    }

    /// `t` applied through the decision path, written to the trace with
    /// its digest after it.
    #[inline(never)]
    fn apply(&mut self, p: &mut impl Ports, t: Traced) -> Applied {
        self.apply_counted(p, t).0
    }

    /// As [`Controller::apply`], with the instructions the decision path
    /// took.
    fn apply_counted(&mut self, p: &mut impl Ports, t: Traced) -> (Applied, u32) {
        // The record is made first and the input applied from it: one
        // copy of the input on the stack.
        let record = Trace::Input(t);
        let Trace::Input(t) = &record else {
            unreachable!("made as an input above")
        };
        let mark = p.insn_mark();
        let a = self.decider.apply(t);
        let insn = p.insn_since(mark);
        p.trace(&record);
        if let Some(d) = a.digest() {
            p.trace(&Trace::Digest(d));
        }
        (a, insn)
    }

    /// A start: `hello` to the trace and the gateway, then the decision
    /// path's start from what the flash held (`opening`), as
    /// `Traced::Start` applies it. The decider was built from the same
    /// `opening` ([`Decider::new`], in its static); the start is traced
    /// for the replayer, whose own fresh decider it starts alike.
    pub fn boot(&mut self, p: &mut impl Ports, hello: Hello, opening: Opening) {
        p.trace(&Trace::Boot(hello.clone()));
        if !p.up(&Up::Hello(hello)) {
            p.say(format_args!("link: the gateway's hello was not queued"));
        }
        p.trace(&Trace::Input(Traced::Start { latched: opening }));
        self.said(p);
    }

    /// After [`Controller::boot`] from a record that could not be read or
    /// believed: the records written anew go above generation `g` (the
    /// flash's generation item, `latch::relatch_floor`), traced for the
    /// replayer. Nothing when `g` is `None`.
    pub fn continue_above(&mut self, p: &mut impl Ports, g: Option<u32>) {
        if let Some(g) = g {
            self.apply(p, Traced::GenerationWritten(g));
        }
    }

    /// Step 3: the decision path's step on what the CDU answered
    /// (`readings`; `None`: it did not) at `now_ms`.
    #[inline(never)]
    pub fn step(&mut self, p: &mut impl Ports, readings: Option<CduMeasurements>, now_ms: u64) {
        let cdu_leaks = readings.as_ref().and_then(|m| m.leaks);
        self.leaks = leak_inputs(BoardRead::Absent, cdu_leaks);
        self.pump_faults = readings.as_ref().map(|m| m.pump_faults);
        let outdoor = readings.as_ref().and_then(|m| m.outdoor_c);
        self.outdoor_c = self.outdoor.pick(outdoor, now_ms).map(|(c, _)| c);
        self.readings = readings;
        self.input = Traced::Step {
            cdu: readings,
            inp: StepIn {
                now_ms,
                board: BoardRead::Absent,
                ambient_c: self.outdoor_c,
            },
        };
        let mark = p.insn_mark();
        self.digest = self.decider.apply(&self.input).digest();
        self.insn_now = p.insn_since(mark);
        self.trace_step(p);
    }

    /// The last step's input and digest to the trace (in a frame of its
    /// own, beside the step's).
    #[inline(never)]
    fn trace_step(&mut self, p: &mut impl Ports) {
        p.trace(&Trace::Input(self.input.clone()));
        if let Some(d) = self.digest {
            p.trace(&Trace::Digest(d));
        }
    }

    /// Step 4: the latched record to write to flash before anything acts.
    #[inline(never)]
    pub fn to_keep(&mut self, p: &mut impl Ports) -> Option<LatchRecord> {
        match self.apply(p, Traced::ToKeep) {
            Applied::ToKeep(r) => r,
            _ => None,
        }
    }

    /// Step 4, done: the record went to flash (`ok`) or did not. The
    /// first failure of a run, and the record going in again after one,
    /// are said to the gateway as well as the console: its log and the
    /// bus show that no valve opens meanwhile. A gateway that started
    /// again hears a failure in force again at the next keep.
    #[inline(never)]
    pub fn kept(&mut self, p: &mut impl Ports, ok: bool) {
        self.apply(p, Traced::Kept(ok));
        let again = core::mem::take(&mut self.latch_again);
        let (error, words) = match (ok, self.latch_failing) {
            (false, false) => (true, LATCH_NOT_KEPT),
            (false, true) if again => (true, LATCH_NOT_KEPT),
            (true, true) => (false, LATCH_KEPT_AGAIN),
            _ => return,
        };
        self.latch_failing = !ok;
        let words = said_words(&words);
        if !p.up(&Up::Said { error, words }) {
            self.link.up_dropped = self.link.up_dropped.saturating_add(1);
        }
    }

    /// Step 4, before the keep: the CDU took the valve word written
    /// first (`valves`, closings only); the decision path holds it as the
    /// valve word taken until another goes in.
    #[inline(never)]
    pub fn took_early_valves(&mut self, p: &mut impl Ports, valves: u16) {
        self.apply(p, Traced::EarlyValves(valves));
    }

    /// Step 5: the writes of the step, with the valve positions read.
    #[inline(never)]
    pub fn plan(&mut self, p: &mut impl Ports) -> Plan {
        let closed = self.readings.as_ref().and_then(|m| m.valves_closed);
        let (a, insn) = self.apply_counted(p, Traced::Plan { closed });
        self.insn_now = self.insn_now.saturating_add(insn);
        match a {
            Applied::Planned { plan, .. } => plan,
            _ => Plan::default(),
        }
    }

    /// Step 5, the writes of `plan` and their read-back through `port`
    /// ([`crate::read_back::write_step`], what it found in `held`, each
    /// failure on `console`). After the gateway started again, what the
    /// read-back finds (a setting not held, a read-back failing) is said
    /// again at this step, for the restarted gateway's log, as the leases
    /// go again ([`crate::read_back::SafetyHeld::gateway_back`]). The
    /// outcome, and the change to say ([`Controller::read_back_changed`]).
    pub fn write_and_read_back<P: crate::read_back::HoldingPort>(
        &mut self,
        port: &mut P,
        plan: &Plan,
        held: &mut crate::read_back::SafetyHeld,
        console: &mut impl fmt::Write,
    ) -> (Outcome, Option<crate::read_back::Change>) {
        if core::mem::take(&mut self.read_back_again) {
            held.gateway_back();
        }
        crate::read_back::write_step(port, plan, held, console)
    }

    /// Step 5, its read-back (`crate::read_back`): the CDU does not hold
    /// a safety setting it echoed (at each change of which), or holds
    /// them all again; the read-back fails, the first of a run, or reads again:
    /// said on the console and to the gateway, as a latched record not
    /// kept is (a setting not held as an error).
    #[inline(never)]
    pub fn read_back_changed(&mut self, p: &mut impl Ports, c: &crate::read_back::Change) {
        let error = matches!(c, crate::read_back::Change::NotHeld(_));
        p.say(format_args!(
            "{}: {c}",
            if error { "error" } else { "info" }
        ));
        let words = said_words(c);
        if !p.up(&Up::Said { error, words }) {
            self.link.up_dropped = self.link.up_dropped.saturating_add(1);
        }
    }

    /// Step 5, done: what the CDU took of the plan.
    #[inline(never)]
    pub fn written(&mut self, p: &mut impl Ports, o: Outcome) {
        self.apply(p, Traced::Written(o));
    }

    /// Part `part` of what an earlier run learned, before the first step:
    /// its bytes as the flash held them (`read`), or why they could not
    /// be read. Restored through the decision path (traced), or refused
    /// and said with its key, that part left as configured; whether it
    /// was restored. The keeper hears what the flash holds.
    #[inline(never)]
    pub fn restore_learned(
        &mut self,
        p: &mut impl Ports,
        part: usize,
        read: Result<&[u8], &dyn fmt::Display>,
    ) -> bool {
        let key = LEARNED_KEYS.get(part).copied().unwrap_or("cdu.learned.?");
        let bytes = match read {
            Ok(b) => b,
            Err(why) => {
                self.refuse_learned(p, key, &format_args!("unreadable in flash: {why}"));
                return false;
            }
        };
        self.learned.held(part, bytes);
        let (Ok(part8), Ok(bytes)) = (u8::try_from(part), heapless::Vec::from_slice(bytes)) else {
            self.refuse_learned(
                p,
                key,
                &format_args!("{} bytes, more than a part", bytes.len()),
            );
            return false;
        };
        match self.apply(p, Traced::LearnedPart { part: part8, bytes }) {
            Applied::Learned(Ok(())) => true,
            Applied::Learned(Err(why)) => {
                self.refuse_learned(p, key, &why);
                false
            }
            _ => false,
        }
    }

    /// Part `key` of what was learned refused (`why`), to the console and
    /// the gateway.
    fn refuse_learned(&mut self, p: &mut impl Ports, key: &str, why: &dyn fmt::Display) {
        let line = RefusedPart { key, why };
        p.say(format_args!("{line}"));
        let words = said_words(&line);
        if !p.up(&Up::Said { error: true, words }) {
            self.link.up_dropped = self.link.up_dropped.saturating_add(1);
        }
    }

    /// After the step's writes: the next part of what was learned to
    /// write to flash at `now_ms` (a keep begins when one is due).
    pub fn learned_to_keep(&mut self, now_ms: u64) -> ToKeep<'_> {
        self.learned.begin(self.decider.core(), now_ms);
        self.learned.to_keep()
    }

    /// The part [`Controller::learned_to_keep`] gave went to flash (`ok`)
    /// or did not.
    pub fn learned_kept(&mut self, part: usize, ok: bool) {
        self.learned.kept(part, ok);
    }

    /// Step 6: the step's events, what the decision path said, the offer
    /// when due, the status, then the leases due (these two only while
    /// the gateway's layout is this controller's), and the step's cost;
    /// `writes_ok`: every write of the step went in. The leases go last:
    /// one the gateway's queue has no room for is due again at the next
    /// step, while an event or a status not queued is lost, so the
    /// leases of a step that caps many hosts never crowd them out.
    #[inline(never)]
    pub fn report(&mut self, p: &mut impl Ports, now_ms: u64, writes_ok: bool) {
        self.insn.add(self.insn_now);
        self.answers_again(p);
        self.events(p);
        self.said(p);
        self.offer(p, now_ms);
        let cost = Cost {
            insn: self.insn_now,
            insn_max: self.insn.max(),
            stack_peak: p.stack_peak(),
        };
        // Read against another layout, the racks' bits and the hosts'
        // leases would name other racks and hosts: neither goes up (the
        // gateway then tells the bus the controller is silent), and the
        // leases stay due.
        if self.layouts_agree() {
            if let Some(s) = self.status(now_ms, writes_ok, cost) {
                if !p.up(&Up::Status(s)) {
                    self.link.up_dropped = self.link.up_dropped.saturating_add(1);
                }
            }
            self.leases(p, now_ms);
        } else {
            self.link.withheld = self.link.withheld.saturating_add(1);
        }
        p.trace(&Trace::Cost {
            step: self.steps,
            cost,
        });
        self.steps = self.steps.wrapping_add(1);
    }

    /// The leases due for the step's caps, each to the gateway; one that
    /// could not be queued is due again at the next step. Then those due
    /// again because the gateway may have missed them ([`resend`]).
    #[inline(never)]
    fn leases(&mut self, p: &mut impl Ports, now_ms: u64) {
        let Some(c) = self.decider.last_commands() else {
            return;
        };
        let caps = &c.caps[..self.hosts];
        let life_ms = LEASE_DEFAULT.as_millis() as u64;
        (self.resend).mark_if_back(&self.leases, self.hosts, now_ms, life_ms);
        // One order at a time, from the host after the last one's: one
        // not queued is passed, and due again at the next step.
        let mut from = 0;
        loop {
            let Some(o) = self.leases.due_from(now_ms, caps, from).next() else {
                break;
            };
            from = o.host + 1;
            if !lease_up(p, (&mut self.leases, &mut self.resend), &o, now_ms) {
                continue;
            }
            match o.watts {
                Some(w) if o.first => p.say(format_args!(
                    "lease: capping host {} at {} W per GPU ({})",
                    o.host, w as u32, o.lease.reason.0
                )),
                None => p.say(format_args!("lease: lifting the cap of host {}", o.host)),
                Some(_) => {}
            }
        }
        let tdp_w = self.decider.core().config().gpu.tdp_w;
        let mut from = 0;
        loop {
            let Some(c) = self.decider.last_commands() else {
                return;
            };
            let caps = &c.caps[..self.hosts];
            let Some(o) = (self.resend).next(from, now_ms, (&self.leases, caps, life_ms, tdp_w))
            else {
                return;
            };
            from = o.host + 1;
            lease_up(p, (&mut self.leases, &mut self.resend), &o, now_ms);
        }
    }

    /// The step's events, the core's then the decision path's, each to
    /// the gateway and the console.
    fn events(&mut self, p: &mut impl Ports) {
        let core = self.decider.last_commands().map(|c| c.events.as_slice());
        for e in core.unwrap_or_default() {
            event(p, &mut self.link, e.clone());
        }
        for e in self.decider.take_events() {
            event(p, &mut self.link, e);
        }
    }

    /// What the decision path has to say, to the gateway and the console.
    fn said(&mut self, p: &mut impl Ports) {
        for s in self.decider.take_said() {
            let error = s.error();
            p.say(format_args!(
                "{}: {s}",
                if error { "error" } else { "warning" }
            ));
            let words = said_words(&s);
            if !p.up(&Up::Said { error, words }) {
                self.link.up_dropped = self.link.up_dropped.saturating_add(1);
            }
        }
    }

    /// The core's offer to the hall's facility coordinator, to the
    /// gateway when it moved (or a minute after it was last sent); one
    /// not queued is due again at the next step.
    #[inline(never)]
    fn offer(&mut self, p: &mut impl Ports, now_ms: u64) {
        let offer = self.decider.core().offer();
        if !self.offers.due(offer.as_ref(), now_ms) {
            return;
        }
        if p.up(&Up::Offer(offer.as_ref().map(offer_msg))) {
            self.offers.said(offer, now_ms);
        } else {
            self.link.up_dropped = self.link.up_dropped.saturating_add(1);
        }
    }

    /// The state after the step, as the gateway publishes it: the valves
    /// as the CDU last took them (every valve open before a valve write
    /// of this run went in), as `run` shows them.
    #[inline(never)]
    fn status(&self, now_ms: u64, writes_ok: bool, cost: Cost) -> Option<Status> {
        let c = self.commands()?;
        let core = self.decider.core();
        let all_racks = cooling_core::safety::all_racks(usize::from(self.layout.racks));
        Some(Status {
            step: self.steps,
            at_ms: now_ms,
            mode: core.mode(),
            setpoint_c: c.setpoint_c,
            pump_speed: c.pump_speed,
            pump_on: c.pump_on,
            lead: c.lead,
            racks: RackBits {
                // What the CDU took, not the command: a close whose write
                // did not go in (or was never tried) is not shown done.
                valves_open: self.decider.valves_taken().unwrap_or(all_racks),
                cooling_lost: c.cooling_lost,
                sensing_lost: c.sensing_lost,
                isolation_failed: c.isolation_failed,
                leaks_latched: core.leaks_latched(),
                leaks_wet: self.leaks.wet_now(),
            },
            pumps_failed: core.pumps_failed(),
            beacon: c.beacon,
            sensor_faults: [
                Which::Supply,
                Which::Return,
                Which::Flow,
                Which::FacilitySupply,
            ]
            .map(|w| core.sensor_fault(w)),
            readings: self.readings,
            outdoor_c: self.outdoor_c,
            writes_ok,
            events_dropped: core.events_dropped(),
            cost,
        })
    }
}

/// A part of what was learned, refused, as it is said.
struct RefusedPart<'a> {
    key: &'a str,
    why: &'a dyn fmt::Display,
}

impl fmt::Display for RefusedPart<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "learned: {} refused ({}): that part starts as configured",
            self.key, self.why
        )
    }
}

/// Event `e` to the console and the gateway (`link` counts it if it
/// could not be queued).
fn event(p: &mut impl Ports, link: &mut LinkCounts, e: loopwarden_protocol::message::Event) {
    p.say(format_args!("event: {e}"));
    if !p.up(&Up::Event(e)) {
        link.up_dropped = link.up_dropped.saturating_add(1);
    }
}

/// Lease order `o` to the gateway at `now_ms`; whether it was queued
/// (and so counted as sent in the book and in what goes again).
fn lease_up(
    p: &mut impl Ports,
    (book, resend): (&mut LeaseBook, &mut resend::Resend),
    o: &Order,
    now_ms: u64,
) -> bool {
    let up = Up::Lease {
        host: o.host as u16,
        lease: o.lease.clone(),
        lift: o.lift,
    };
    if !p.up(&up) {
        return false;
    }
    book.sent(o, now_ms);
    resend.sent(o.host, o.lift, now_ms);
    true
}

#[cfg(test)]
mod tests;
