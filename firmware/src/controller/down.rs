//! What the gateway says, acted on between steps: bytes from UART1 into
//! the link's deframer ([`Controller::hear`], at most [`HEAR_MAX_BYTES`]
//! a call, so a line that never stops cannot hold a step), each whole
//! frame's [`Down`] to the decision path (every call through `apply`,
//! traced) or to the controller's own state. A frame that fails its
//! checks, or whose message does not decode, is counted and never acted
//! on; so are bytes the receive ring lost. A frame with the last one's
//! number and bytes is a repeat: counted and not acted on again (a
//! repeated `Outdoor` would make an old value look new). These counts
//! are said once a step, on the console's status line, never a line
//! each: the console is slower than a line of garbage. The frames'
//! numbers tell the gaps (frames lost) and the gateway's restarts
//! (numbered from 0 again: a lower number, or the last one's with other
//! bytes), counted and said; the frames after a restart are acted on.
//!
//! - `Alive`: the wall clock (kept as its offset from the MCU clock),
//!   whether the gateway reaches the broker, and the gateway's layout:
//!   one that is not this controller's (the figures built in) is said as
//!   an error to the console and the gateway, naming both and the
//!   figures' digest, at the first `Alive` after each start of either
//!   end and every minute while it lasts;
//! - `Host`: the report judged ([`Decider::heard`], then
//!   `Traced::Heard`; not before the wall clock is known, for its stamp
//!   is judged against it; not while the layouts differ, for its index
//!   would name another host here);
//! - `Limits`: `Traced::SetLimits`; `FacilityTarget`:
//!   `Traced::FacilityTarget`; `Outdoor`: the BMS's value among the
//!   outdoor temperature's sources;
//! - `Clear`: checked by the [`ClearGate`](crate::clears::ClearGate),
//!   its number kept in flash ([`Ports::keep_clear`]) before anything
//!   acts on it, then `Traced::ClearLeak` or `Traced::ClearPump`,
//!   answered with `Up::Answer` (and an `OperatorCleared` event when
//!   done). A clear whose number the flash did not keep is not acted on
//!   (a restart would forget the number, and the same signed clear could
//!   be taken again): refused, and its operator's clears with it until a
//!   later try keeps the number. A step writes one number at most: a
//!   clear that passes every check in a step that wrote one before its
//!   hearing is not acted on, and told why ([`StepKeep`]). A pump's clear while the CDU's pump
//!   faults are not read (no answer since the start, or none at the last
//!   step), or while the pump's fault flag went unread in a read the CDU
//!   answered in part (its request failed or was not asked), is refused,
//!   as on Linux: whether the CDU still shows the fault is unknown.
//!
//! Glossary:
//! - *heard*: the last time any good frame came from the gateway.
//! - *repeat*: a frame whose number and bytes are the last frame's.

use embedded_hal_nb::nb;
use embedded_hal_nb::serial::Read;
use loopwarden_link::{CduLayout, ClearAction, Down, Fed, FrameError, Order, SignedClear, Up};
use loopwarden_protocol::message::Event;
use loopwarden_protocol::units::TimestampMs;
use loopwarden_protocol::RackIndex;

use cooling_decide::{Applied, Traced, Verdict};

use super::wall::{Told, DRIFT_PPM};
use super::{said_words, Controller, Ports, Said};
use crate::clears::{Last, CLEAR_SKEW_MS};
use crate::map;

/// What the gateway link brought since the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkCounts {
    /// Good frames.
    pub frames: u32,
    /// Frames dropped: failed their checks, or their message did not
    /// decode.
    pub bad: u32,
    /// Why the last frame was dropped.
    pub last_bad: Option<FrameError>,
    /// Host reports set aside: the wall clock was not known yet.
    pub hosts_early: u32,
    /// Host reports not believed.
    pub hosts_refused: u32,
    /// Clears refused before they reached the decision path (a pump's
    /// among them while the CDU's pump faults are not read).
    pub clears_refused: u32,
    /// Messages to the gateway that found its queue full.
    pub up_dropped: u32,
    /// Frames that came again (the last one's number and bytes): not
    /// acted on again.
    pub repeats: u32,
    /// Gaps in the frames' numbers, and the frames lost in them.
    pub gaps: u32,
    /// Frames lost in the gaps.
    pub lost: u32,
    /// Times the gateway started again (its numbers from 0 again).
    pub restarts: u32,
    /// Times the receive ring was full and bytes from the gateway were
    /// lost.
    pub overruns: u32,
    /// Host reports set aside: the gateway's layout is not this
    /// controller's (or not said yet).
    pub hosts_unmapped: u32,
    /// Steps whose status and leases were held back: the gateway's
    /// layout is not this controller's (or not said yet).
    pub withheld: u32,
}

/// How often a layout the gateway does not share is said again, ms.
pub const DISAGREEMENT_EVERY_MS: u64 = 60_000;

/// The most bytes [`Controller::hear`] takes in one call: the gateway's
/// receive ring whole (`board::uart::GATEWAY_RING_BYTES`), so a call ends
/// however fast the bytes come; what is left waits for the next call.
pub const HEAR_MAX_BYTES: usize = 8192;

impl Controller<'_> {
    /// What the gateway sent, read from `rx` at `now_ms` until it has no
    /// more or [`HEAR_MAX_BYTES`] were taken; bytes lost to a full ring
    /// are counted ([`LinkCounts::overruns`]), not said. One clear a call
    /// is checked (its signature's check and its number's keep in flash
    /// are the slow work here: a burst of them is not done all in one go,
    /// past the watchdog); a further one is answered at once, to be sent
    /// again ([`AGAIN`]). Returns the bytes taken.
    pub fn hear(&mut self, p: &mut impl Ports, rx: &mut impl Read<u8>, now_ms: u64) -> usize {
        self.hear_after_keep(p, rx, now_ms, StepKeep::NoWrite)
    }

    /// As [`Controller::hear`], in a step whose settling of the
    /// operators' clear numbers did `keep` to the flash before its
    /// hearing: after a write, tried or done, a clear that passes every
    /// check is not kept nor acted on ([`StepKeep::refusal`]), so that a
    /// step keeps one number at most (the watchdog's check counts one);
    /// a clear refused by a check is refused as at any other time.
    pub fn hear_after_keep(
        &mut self,
        p: &mut impl Ports,
        rx: &mut impl Read<u8>,
        now_ms: u64,
        keep: StepKeep,
    ) -> usize {
        let mut taken = 0;
        let mut clears = 0;
        while taken < HEAR_MAX_BYTES {
            match rx.read() {
                Ok(b) => {
                    taken += 1;
                    self.on_byte_counting(p, b, now_ms, (keep, &mut clears));
                }
                Err(nb::Error::WouldBlock) => break,
                Err(nb::Error::Other(_)) => {
                    self.link.overruns = self.link.overruns.saturating_add(1);
                }
            }
        }
        taken
    }

    /// One byte from the gateway's UART at `now_ms`.
    pub fn on_byte(&mut self, p: &mut impl Ports, b: u8, now_ms: u64) {
        self.on_byte_counting(p, b, now_ms, (StepKeep::NoWrite, &mut 0));
    }

    /// One byte at `now_ms`, in a step that did `keep` to the flash,
    /// `clears` checked so far in this reading of the line: a clear past
    /// the first is answered to be sent again.
    #[inline(never)]
    fn on_byte_counting(
        &mut self,
        p: &mut impl Ports,
        b: u8,
        now_ms: u64,
        (keep, clears): (StepKeep, &mut u32),
    ) {
        let Some(down) = self.message(p, b) else {
            return;
        };
        self.link.frames = self.link.frames.saturating_add(1);
        self.heard_ms = Some(now_ms);
        if matches!(down, Down::Alive { .. }) {
            // An `Alive` after a silence (timed on `Alive`s alone, for
            // another frame may come first): what went up meanwhile may
            // never have reached the gateway.
            self.resend.alive(now_ms);
        }
        // A clear is checked straight from here, with no other message's
        // frame beneath its signature's check.
        if let Down::Clear(c) = &down {
            *clears += 1;
            if *clears > 1 {
                return self.refuse_clear(p, c, &AGAIN);
            }
            return self.on_clear(p, c, now_ms, keep);
        }
        self.on_down(p, &down, now_ms);
    }

    /// The message of the frame that byte `b` completes, if it passes its
    /// checks and decodes (a frame that does not is counted). In a frame
    /// of its own: decoding takes stack that acting on the message (a
    /// clear's signature checked) need not sit on.
    #[inline(never)]
    fn message(&mut self, p: &mut impl Ports, b: u8) -> Option<Down> {
        match self.deframer.push(b) {
            Fed::More => None,
            Fed::Dropped(e) => {
                self.bad_frame(&e);
                None
            }
            Fed::Frame(f) => {
                let (seq, mark) = (f.seq, fingerprint(f.payload));
                let decoded = f.message::<Down>();
                if !self.numbered(p, seq, mark) {
                    return None;
                }
                match decoded {
                    Ok(d) => Some(d),
                    Err(e) => {
                        self.bad_frame(&e);
                        None
                    }
                }
            }
        }
    }

    /// Frame number `seq`, its bytes' fingerprint `mark`, heard; whether
    /// it is to be acted on (`false`: the last frame again). A gap and a
    /// restart of the gateway are counted and said; the frame is new.
    fn numbered(&mut self, p: &mut impl Ports, seq: u32, mark: u32) -> bool {
        if self.last_in == Some((seq, mark)) {
            // Counted on the status line, not said: a line repeating one
            // frame would flood the console.
            self.link.repeats = self.link.repeats.saturating_add(1);
            return false;
        }
        self.last_in = Some((seq, mark));
        match self.seq.hear(seq) {
            Order::First | Order::Next => {}
            Order::Gap(n) => {
                self.link.gaps = self.link.gaps.saturating_add(1);
                self.link.lost = self.link.lost.saturating_add(n);
                p.say(format_args!(
                    "link: {n} frame(s) from the gateway lost before frame {seq}"
                ));
            }
            Order::Restart => {
                // A layout it does not share is said again at its next
                // `Alive`, for the restarted gateway's log; until that
                // `Alive` says its layout, nothing crosses that a layout
                // reads (host reports, the status, leases). The leases it
                // may have missed go again, and what the read-back finds
                // (and a latched record not in flash) is said again at the
                // next step.
                self.disagreement_said_ms = None;
                self.read_back_again = true;
                self.latch_again = true;
                self.gateway_layout = None;
                self.resend.gateway_back();
                self.link.restarts = self.link.restarts.saturating_add(1);
                p.say(format_args!(
                    "link: the gateway started again (its frames numbered from {seq} again)"
                ));
            }
        }
        true
    }

    /// A frame dropped for `e`: counted, and said only on the status
    /// line, once a step (garbage on the line makes a bad frame every few
    /// bytes, faster than the console prints a line).
    fn bad_frame(&mut self, e: &FrameError) {
        self.link.bad = self.link.bad.saturating_add(1);
        self.link.last_bad = Some(*e);
    }

    /// Acts on `d`, heard at `now_ms`, unless it is a clear.
    #[inline(never)]
    fn on_down(&mut self, p: &mut impl Ports, d: &Down, now_ms: u64) {
        match d {
            Down::Alive {
                unix_ms,
                bus,
                layout,
            } => {
                self.wall_told(p, *unix_ms, now_ms);
                self.bus = *bus;
                self.gateway_laid_out(p, *layout, now_ms);
            }
            Down::Host {
                index,
                stamped,
                telemetry,
            } => self.on_host(p, usize::from(*index), *stamped, telemetry, now_ms),
            Down::Limits {
                ceiling_c,
                offset_k,
            } => {
                let t = Traced::SetLimits {
                    setpoint_ceiling_c: *ceiling_c,
                    plan_offset_k: *offset_k,
                };
                self.apply(p, t);
            }
            Down::Outdoor(c) => self.outdoor.bms_wrote(*c, now_ms),
            Down::FacilityTarget(water_c) => {
                let water_c = *water_c;
                self.apply(p, Traced::FacilityTarget { water_c, now_ms });
            }
            // Taken by the caller, before this.
            Down::Clear(_) => {}
        }
    }

    /// The wall clock `unix_ms` an `Alive` told at `now_ms`: one held
    /// from going back is said at the first of a run, and agreement
    /// again once.
    fn wall_told(&mut self, p: &mut impl Ports, unix_ms: u64, now_ms: u64) {
        match self.wall.told(unix_ms, now_ms) {
            Told::Taken | Told::Held { first: false, .. } => {}
            Told::Held {
                back_ms,
                first: true,
            } => say_held(p, back_ms),
            Told::Again => p.say(format_args!(
                "clock: the gateway's wall clock is taken again"
            )),
        }
    }

    /// The gateway's layout `theirs`, heard at `now_ms`: one that is not
    /// this controller's is said when it is new and every
    /// [`DISAGREEMENT_EVERY_MS`]; agreement again is said once.
    #[inline(never)]
    fn gateway_laid_out(&mut self, p: &mut impl Ports, theirs: CduLayout, now_ms: u64) {
        let was = self.gateway_layout.replace(theirs);
        let ours = self.layout;
        if theirs == ours {
            if self.disagreement_said_ms.take().is_some() {
                p.say(format_args!(
                    "layout: the gateway's is this controller's again ({ours}): host reports, the status and leases cross the link again"
                ));
            }
            return;
        }
        let due = was != Some(theirs)
            || self
                .disagreement_said_ms
                .is_none_or(|at| now_ms.saturating_sub(at) >= DISAGREEMENT_EVERY_MS);
        if !due {
            return;
        }
        self.disagreement_said_ms = Some(now_ms);
        let digest = self.figures_digest;
        p.say(format_args!(
            "error: layout: this controller's figures (digest {digest:#010x}) lay out {ours}, the gateway's configuration {theirs}: host reports are not taken and no status or lease is sent until they agree; the CDU is kept safe on this controller's own figures"
        ));
        let words = said_words(&format_args!(
            "layout differs: mine {}x{}x{} (figures {digest:#010x}), yours {}x{}x{}: no host report, status or lease",
            ours.racks,
            ours.hosts_per_rack,
            ours.gpus_per_host,
            theirs.racks,
            theirs.hosts_per_rack,
            theirs.gpus_per_host
        ));
        if !p.up(&Up::Said { error: true, words }) {
            self.link.up_dropped = self.link.up_dropped.saturating_add(1);
        }
    }

    /// Host `h`'s telemetry, stamped `stamped`, heard at `now_ms`.
    #[inline(never)]
    fn on_host(
        &mut self,
        p: &mut impl Ports,
        h: usize,
        stamped: TimestampMs,
        t: &loopwarden_protocol::message::HostTelemetry,
        now_ms: u64,
    ) {
        if !self.layouts_agree() {
            self.link.hosts_unmapped = self.link.hosts_unmapped.saturating_add(1);
            return;
        }
        let Some(wall) = self.wall_ms(now_ms) else {
            self.link.hosts_early = self.link.hosts_early.saturating_add(1);
            return;
        };
        let heard = self.decider.heard(t, stamped, now_ms);
        let traced = Traced::Heard {
            h: h as u32,
            heard,
            now: TimestampMs(wall),
        };
        let (why, new, refused) = match self.apply(p, traced) {
            Applied::Verdict(Verdict::Refused { why, new }) => (why, new, true),
            Applied::Verdict(Verdict::BelievedWithout { why, new }) => (why, new, false),
            _ => return,
        };
        if refused {
            self.link.hosts_refused = self.link.hosts_refused.saturating_add(1);
        }
        if new {
            let how = if refused {
                "is not believed"
            } else {
                "counts without"
            };
            p.say(format_args!("hosts: a report of host {h} {how}: {why}"));
            let words = said_words(&format_args!("a report of host {h} {how}: {why}"));
            p.up(&Up::Said {
                error: false,
                words,
            });
        }
    }

    /// An operator's clear `c`, heard at `now_ms`: acted on only once the
    /// gate took it and its number is kept in flash.
    #[inline(never)]
    fn on_clear(&mut self, p: &mut impl Ports, c: &SignedClear, now_ms: u64, keep: StepKeep) {
        let taken = match self.gate.check(c, self.wall_ms(now_ms)) {
            Ok(t) => t,
            Err(why) => return self.refuse_clear(p, c, &why),
        };
        if let Some(why) = keep.refusal() {
            // Not taken: its number is not used up.
            return self.refuse_clear(p, c, &why);
        }
        self.gate.take(&taken);
        if p.keep_clear(&taken) {
            return self.clear(p, c);
        }
        // Refused until a later try keeps the number (the shell's, each
        // step): a restart would forget it, and the clear would hold again.
        self.gate.set(taken.slot, Last::Unkept(taken.id));
        self.refuse_clear(p, c, &UNKEPT);
    }

    /// Clear `c` refused before the decision path, for `why`: counted,
    /// said and answered.
    fn refuse_clear(&mut self, p: &mut impl Ports, c: &SignedClear, why: &dyn core::fmt::Display) {
        let (id, who) = (c.clear.id, &c.clear.operator);
        self.link.clears_refused = self.link.clears_refused.saturating_add(1);
        p.say(format_args!("clear {id} of {who} refused: {why}"));
        self.answer(p, id, Err(said_words(&why)));
    }

    /// A clear the gate took, through the decision path and answered (in
    /// a frame of its own, not beneath the signature's check).
    #[inline(never)]
    fn clear(&mut self, p: &mut impl Ports, c: &SignedClear) {
        let (id, who) = (c.clear.id, &c.clear.operator);
        let what = Action(c.clear.action);
        let (traced, rack, pump) = match c.clear.action {
            ClearAction::Leak(rack) => {
                let leaks = self.leaks;
                (
                    Traced::ClearLeak { rack, leaks },
                    RackIndex::new(rack),
                    None,
                )
            }
            ClearAction::Pump(pump) => {
                let fault_shown = match pump_fault(self.pump_faults, pump as usize) {
                    Ok(shown) => shown,
                    Err(why) => {
                        self.link.clears_refused = self.link.clears_refused.saturating_add(1);
                        p.say(format_args!("clear {id} of {who}: {what}: {why}"));
                        self.answer(p, id, Err(said_words(&format_args!("{what}: {why}"))));
                        return;
                    }
                };
                (Traced::ClearPump { pump, fault_shown }, None, Some(pump))
            }
        };
        match self.apply(p, traced) {
            Applied::Cleared(Ok(())) => {
                p.say(format_args!("clear {id} of {who}: {what} cleared"));
                self.answer(p, id, Ok(()));
                let e = Event::OperatorCleared {
                    rack,
                    pump,
                    operator: who.clone(),
                };
                p.say(format_args!("event: {e}"));
                if !p.up(&Up::Event(e)) {
                    self.link.up_dropped = self.link.up_dropped.saturating_add(1);
                }
            }
            Applied::Cleared(Err(why)) => {
                p.say(format_args!("clear {id} of {who}: {what}: {why}"));
                self.answer(p, id, Err(said_words(&format_args!("{what}: {why}"))));
            }
            _ => {}
        }
    }
}

/// Why a clear the gate took is refused when its number did not go into
/// flash.
const UNKEPT: &str = "not acted on: its number could not be kept in flash";

/// Why a clear past the first of one reading of the gateway's line is
/// not checked: nothing was taken, its number is not used up.
pub const AGAIN: &str =
    "not checked: another clear was taken in hand just before it; send it again";

/// Why a clear that passed every check, heard in a step that kept an
/// earlier clear's number in flash, is not acted on: its number is not
/// used up.
pub const BUSY: &str = "not acted on: the flash is busy keeping an earlier clear's number; send it again after the next step";

/// Why a clear that passed every check, heard in a step whose keep of an
/// earlier clear's number the flash refused, is not acted on: its number
/// is not used up.
pub const FLASH_FAILING: &str = "not acted on: the flash failed to keep another clear's number this step; send it again after the next step";

/// What a step's settling of the operators' clear numbers did to the
/// flash before its hearing of the gateway (the shell's, each step): a
/// step writes one number at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKeep {
    /// Nothing written (reads alone, or nothing to settle): a clear is
    /// kept and acted on as between steps.
    NoWrite,
    /// A number written: the step's one write is spent.
    Wrote,
    /// A write the flash refused: the step's one write is spent, and the
    /// flash is failing.
    Failed,
}

impl StepKeep {
    /// Of a settling that wrote `writes` slots (tried, gone in or not),
    /// `failed`: the flash refused one.
    pub fn of(writes: usize, failed: bool) -> Self {
        match (writes, failed) {
            (0, _) => StepKeep::NoWrite,
            (_, false) => StepKeep::Wrote,
            (_, true) => StepKeep::Failed,
        }
    }

    /// Why a clear that passed every check in such a step is not kept nor
    /// acted on; `None`: it is.
    pub fn refusal(self) -> Option<&'static str> {
        match self {
            StepKeep::NoWrite => None,
            StepKeep::Wrote => Some(BUSY),
            StepKeep::Failed => Some(FLASH_FAILING),
        }
    }
}

/// Why a pump's clear is refused while the CDU's pump faults are not
/// read (as the Linux controller says it, within an answer's words).
const NOT_READ: &str =
    "not cleared: the CDU's pump fault has not been read (no answer since the start, or none now)";

/// Why a pump's fault is not known to its clear.
enum FaultUnknown {
    /// The CDU did not answer the last step's read, or has not since the
    /// start.
    NotRead,
    /// The CDU answered the last step's read, but the request holding
    /// this fault flag (of the map built in, which has both: `NEEDED`)
    /// failed or was not asked, said on the console by `reads`.
    FlagUnread(&'static map::Register),
}

impl core::fmt::Display for FaultUnknown {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let flag = match self {
            Self::NotRead => return f.write_str(NOT_READ),
            Self::FlagUnread(flag) => flag,
        };
        write!(
            f,
            "not cleared: {} was not read this step: its read request failed or was not asked",
            flag.name
        )?;
        let span = map::SPANS
            .iter()
            .find(|s| (s.registers.iter()).any(|&i| core::ptr::eq(&map::REGISTERS[i], *flag)));
        if let Some(s) = span {
            let end = u32::from(s.start) + u32::from(s.count).max(1) - 1;
            write!(
                f,
                " (the console's line for read input {}-{end} says which)",
                s.start
            )?;
        }
        f.write_str(", so whether the CDU still shows the pump's fault is unknown")
    }
}

/// The fault of pump `pump` (0: A) a clear is judged on, from the last
/// step's fault flags (`faults`; `None`: the CDU did not answer): a flag
/// that read no value is unknown, never "no fault shown", so the clear
/// is refused (as on Linux, which names the failed request).
fn pump_fault(faults: Option<[Option<bool>; 2]>, pump: usize) -> Result<bool, FaultUnknown> {
    let faults = faults.ok_or(FaultUnknown::NotRead)?;
    let flag = [map::PUMP_A_FAULT, map::PUMP_B_FAULT][pump % 2];
    faults[pump % 2].ok_or(FaultUnknown::FlagUnread(flag))
}

/// Says, once at the first of a run, that the gateway's wall clock went
/// back `back_ms` behind the high mark and this controller's is held
/// [`CLEAR_SKEW_MS`] behind that. A clear signed at the gateway's time is
/// then `back_ms - CLEAR_SKEW_MS` behind this controller's clock, so it
/// is stale only when the gateway went back more than twice the skew;
/// that gap past twice the skew closes at the drift allowance.
fn say_held(p: &mut impl Ports, back_ms: u64) {
    let (back_s, skew_s) = (back_ms / 1000, CLEAR_SKEW_MS / 1000);
    let gap_ms = back_ms.saturating_sub(2 * CLEAR_SKEW_MS);
    if gap_ms == 0 {
        p.say(format_args!(
            "error: clock: the gateway's wall clock went back {back_s} s; this controller's is held {skew_s} s behind its own (it never goes back further, so a clear held back cannot be made fresh): clears signed at the gateway's time are still taken (they are refused as stale only when it goes back more than {} s)",
            2 * skew_s
        ));
        return;
    }
    let hours = gap_ms * (1_000_000 / DRIFT_PPM) / 3_600_000;
    p.say(format_args!(
        "error: clock: the gateway's wall clock went back {back_s} s; this controller's is held {skew_s} s behind its own (it never goes back further, so a clear held back cannot be made fresh): clears signed at the gateway's time are refused as stale until the 0.1 % drift allowance closes the {} s past {} s (about {hours} h); if the gateway's clock was corrected, restart the board to take the gateway's clock",
        gap_ms / 1000,
        2 * skew_s
    ));
}

/// A fingerprint of a frame's message bytes (FNV-1a, 32 bits): with its
/// number, what tells a repeated frame from a restarted gateway's.
fn fingerprint(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// What a clear clears, as it reads.
struct Action(ClearAction);

impl core::fmt::Display for Action {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.0 {
            ClearAction::Leak(rack) => write!(f, "rack {rack}'s leak"),
            ClearAction::Pump(pump) => write!(f, "{pump}'s fault"),
        }
    }
}

/// Answers held while the gateway's queue has no room for them.
pub const ANSWERS_HELD: usize = 4;

impl Controller<'_> {
    /// The answer to clear `id`: queued after those held before it; one
    /// the gateway's queue has no room for (full of leases) is held and
    /// sent at the next step ([`Controller::answers_again`]).
    fn answer(&mut self, p: &mut impl Ports, id: u32, outcome: Result<(), Said>) {
        if self.answers.is_full() {
            if let Some((old, _)) = self.answers.pop_front() {
                self.link.up_dropped = self.link.up_dropped.saturating_add(1);
                p.say(format_args!(
                    "link: the answer to clear {old} was dropped: {ANSWERS_HELD} answers wait for room in the gateway's queue"
                ));
            }
        }
        // Room made above.
        let _ = self.answers.push_back((id, outcome));
        if !self.answers_again(p) {
            p.say(format_args!(
                "link: the answer to clear {id} was not queued: it goes at the next step"
            ));
        }
    }

    /// The answers held go to the gateway, oldest first, while its queue
    /// takes them; whether none is left.
    pub(super) fn answers_again(&mut self, p: &mut impl Ports) -> bool {
        while let Some((id, outcome)) = self.answers.front() {
            let up = Up::Answer {
                id: *id,
                outcome: outcome.clone(),
            };
            if !p.up(&up) {
                return false;
            }
            self.answers.pop_front();
        }
        true
    }
}
