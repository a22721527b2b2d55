//! The gateway's core: what a microcontroller's frames mean for the bus,
//! and when it has gone silent. No I/O and no clock: the shell hands it
//! the bytes as they came with the time ([`Now`]), and performs what it
//! returns ([`Act`]). It decides nothing of the CDU: every state,
//! telemetry, event and lease it returns is what the MCU said, turned
//! into the bus's messages by the same functions `cooling-ctrl run` uses
//! ([`crate::shell::cdu_state`], [`crate::shell::cdu_telemetry`]) and
//! published by the same rule ([`StateSent::due`]).
//!
//! Up (MCU → bus), per [`Up`] message:
//! - `Status`: the CDU's telemetry, and its retained state when due;
//! - `Event`: the event, to log and publish;
//! - `Lease`: the lease, to sign and send to that host;
//! - `Offer`: in a hall of several CDUs, kept for the retained state
//!   ([`HallPart`], which is also told the coordinator's plan heard on
//!   the bus: [`Bridge::hall_state`]), whose `facility` carries it as
//!   `run`'s does; the state is due when it moved by `run`'s rule;
//! - `Hello`, `Said`: log lines;
//! - `Answer`: a log line, and the answer for the operator who waits.
//!
//! When no frame it can read has come for [`SILENT_AFTER_MS`] (from its
//! start, or the last one), it says so once in the log and returns a
//! state in `failsafe`, reason `controller-silent`, with the racks of the
//! last status heard (due again by the same rule until frames come back);
//! the next status after that is due at once, its mode differing.
//!
//! Every frame is counted ([`LinkCounts`]): taken, dropped by reason
//! ([`FrameError`]), frames lost in gaps of the MCU's numbers, the MCU's
//! restarts (its numbers starting again) and silences; and frames sent
//! to it. A frame that comes again (the same number and message as the
//! last one checked: the line repeated it) is counted and not taken
//! again: its lease, event or answer is not handed on twice, and it is
//! not read as the MCU starting again. A frame whose message does not
//! read still counts by its number: a gap before it is counted and said
//! as any other, and when that number says the MCU started again, the
//! next frame that reads is taken as its start.
//!
//! Glossary:
//! - *MCU clock*: ms since the MCU started; a status's times are on it.
//!   The first status after a start anchors it to the wall clock
//!   (`unix − at_ms`), so a mode's `since` reads in Unix ms; a status
//!   that reads the anchor more than a second off (the MCU's crystal
//!   drifting) anchors it anew.
//! - *silent*: no status (a completed step's report) for
//!   [`SILENT_AFTER_MS`]: an MCU that only says hello or errors (one that
//!   refuses to run its core) is not controlling, and stays silent.

use std::boxed::Box;
use std::format;
use std::string::String;
use std::vec;
use std::vec::Vec;

use cooling_core::config::Layout;
use loopwarden_link::frame::{encode, max_frame, OVERHEAD};
use loopwarden_link::{CduLayout, Down, Status, Up, MAX_MESSAGE};
use loopwarden_link::{Deframer, EncodeError, Fed, FrameError, Hello, Order, ResetCause, SeqWatch};
use loopwarden_protocol::message::{CapLease, CduMode, CduState, CduTelemetry, Event};
use loopwarden_protocol::message::{FacilityOffer, FacilityState};
use loopwarden_protocol::{Ident, ReasonCode, TimestampMs};

use super::bms::valves_of;
use super::facility::HallPart;
use crate::northbound::valves_shown;
use crate::shell::{cdu_state, cdu_telemetry, StateKey, StateSent, StepFacts};

/// A status whose time reads the MCU clock's anchor this far off moves
/// it, ms.
const REANCHOR_AFTER_MS: i128 = 1_000;

/// No status for this long and the MCU is silent, ms.
pub const SILENT_AFTER_MS: u64 = 3_000;

/// The longest frame on the link, its end byte included.
pub const FRAME_MAX: usize = max_frame(MAX_MESSAGE);

/// A summary of what went wrong on the link is logged at most this often,
/// ms (each kind of drop is logged on its own the first time).
pub const SUMMARY_EVERY_MS: u64 = 60_000;

/// The time, twice: the gateway's steady clock (ms since it started) for
/// intervals, and the wall clock for what goes on the bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Steady ms.
    pub mono_ms: u64,
    /// Unix ms.
    pub unix_ms: u64,
}

/// How loud a log line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Routine, rare.
    Info,
    /// Worth a look.
    Warn,
    /// Something is wrong.
    Error,
    /// Details, for a developer.
    Debug,
}

/// What the shell does for the core.
#[derive(Debug, Clone, PartialEq)]
pub enum Act {
    /// Publish the CDU's telemetry.
    Telemetry(Box<CduTelemetry>),
    /// Publish the retained state (signed), when the broker is connected;
    /// tell [`Bridge::state_published`] with its key and its `facility`
    /// once it went.
    State(Box<CduState>, StateKey),
    /// Send the hall's facility water to the MCU, °C
    /// ([`Down::FacilityTarget`]).
    FacilityTarget(f32),
    /// Log the event to flash and publish it.
    Event(Event),
    /// Sign this lease and send it to host `host` (its index).
    Lease {
        /// The host's index (rack-major).
        host: usize,
        /// The lease, unsigned.
        lease: CapLease,
        /// A lift (ends a cap).
        lift: bool,
    },
    /// The MCU started (its hello, or its numbers starting again): it
    /// forgot what it was told (the BMS's limits), which goes down again.
    Started,
    /// A line for the log.
    Say(Level, String),
    /// The MCU's answer to operator's clear `id`: done, or why not; for
    /// the operator who waits for it.
    Answer {
        /// The clear's id.
        id: u32,
        /// Done, or the refusal's words.
        outcome: Result<(), String>,
    },
}

/// Frames dropped, by why ([`FrameError`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Longer than the receive buffer.
    pub overrun: u64,
    /// Not valid COBS.
    pub cobs: u64,
    /// Shorter than a frame's header and CRC.
    pub short: u64,
    /// The CRC does not match.
    pub crc: u64,
    /// Another version of the link.
    pub version: u64,
    /// Checked, but its message does not decode.
    pub payload: u64,
}

impl Dropped {
    /// Each count with its reason's name, as `/metrics` labels it.
    pub fn by_reason(&self) -> [(&'static str, u64); 6] {
        [
            ("overrun", self.overrun),
            ("cobs", self.cobs),
            ("short", self.short),
            ("crc", self.crc),
            ("version", self.version),
            ("payload", self.payload),
        ]
    }

    /// Every frame dropped.
    pub fn total(&self) -> u64 {
        self.by_reason().iter().map(|(_, n)| n).sum()
    }

    fn count(&mut self, e: FrameError) -> u64 {
        let n = match e {
            FrameError::Overrun => &mut self.overrun,
            FrameError::Cobs => &mut self.cobs,
            FrameError::Short => &mut self.short,
            FrameError::Crc => &mut self.crc,
            FrameError::Version(_) => &mut self.version,
            FrameError::Payload => &mut self.payload,
        };
        *n += 1;
        *n
    }
}

/// What crossed the link since the gateway started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkCounts {
    /// Frames from the MCU taken (checked and decoded).
    pub frames_in: u64,
    /// Frames to the MCU written.
    pub frames_out: u64,
    /// Frames to the MCU not written (the link was down, or the write
    /// failed).
    pub frames_unsent: u64,
    /// Frames from the MCU dropped, by why.
    pub dropped: Dropped,
    /// Gaps in the MCU's frame numbers.
    pub gaps: u64,
    /// Frames lost in those gaps.
    pub lost: u64,
    /// The MCU's restarts (its frame numbers started again).
    pub restarts: u64,
    /// Frames that came again as the last one checked (not taken again).
    pub repeats: u64,
    /// Times the MCU fell silent.
    pub silences: u64,
}

impl LinkCounts {
    /// The counts in words, for the log.
    pub fn words(&self) -> String {
        let d = &self.dropped;
        let dropped: Vec<String> = d
            .by_reason()
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        format!(
            "{} frames in, {} out ({} unsent), {} dropped{}, {} repeated, {} lost in {} gaps, {} restarts, {} silences",
            self.frames_in,
            self.frames_out,
            self.frames_unsent,
            d.total(),
            if dropped.is_empty() {
                String::new()
            } else {
                format!(" ({})", dropped.join(", "))
            },
            self.repeats,
            self.lost,
            self.gaps,
            self.restarts,
            self.silences
        )
    }

    /// What went wrong, without the routine counts: two counts with the
    /// same trouble are equal.
    fn trouble(&self) -> (Dropped, [u64; 4]) {
        let n = [self.lost, self.restarts, self.repeats, self.silences];
        (self.dropped, n)
    }
}

/// The gateway's core (see the module note).
#[derive(Debug)]
pub struct Bridge {
    layout: Layout,
    /// The setpoint a silent MCU's state shows when it never said one, °C.
    failsafe_setpoint_c: f32,
    deframer: Box<Deframer<FRAME_MAX>>,
    seq: SeqWatch,
    /// The last frame checked (taken, or its message unread): its number
    /// and message bytes.
    last_in: Option<(u32, Vec<u8>)>,
    /// A frame whose message did not read was numbered as the MCU
    /// starting again: the next frame that reads is taken as its start.
    restart_unread: bool,
    out_seq: u32,
    counts: LinkCounts,
    started: Now,
    /// When the last status came.
    last_frame: Option<Now>,
    /// The last status heard.
    last: Option<Box<Status>>,
    /// Unix ms minus MCU ms, from the first status after a start.
    anchor_ms: Option<i128>,
    silent: bool,
    state_sent: Option<StateSent>,
    /// The trouble counts at the last summary, and when it was logged.
    summarised: ((Dropped, [u64; 4]), u64),
    /// This CDU's part in a hall of several CDUs; `None`: not in one.
    hall: Option<HallPart>,
    /// An offer came with no hall configured (said once).
    offer_unplaced: bool,
}

impl Bridge {
    /// A bridge for a CDU laid out as `layout`, started at `now`; a silent
    /// MCU that never said a setpoint shows `failsafe_setpoint_c`.
    pub fn new(layout: Layout, failsafe_setpoint_c: f32, now: Now) -> Self {
        Self {
            layout,
            failsafe_setpoint_c,
            deframer: Box::default(),
            seq: SeqWatch::default(),
            last_in: None,
            restart_unread: false,
            out_seq: 0,
            counts: LinkCounts::default(),
            started: now,
            last_frame: None,
            last: None,
            anchor_ms: None,
            silent: false,
            state_sent: None,
            summarised: (LinkCounts::default().trouble(), now.mono_ms),
            hall: None,
            offer_unplaced: false,
        }
    }

    /// The bridge of a CDU in a hall of several, its part `hall`.
    pub fn in_hall(mut self, hall: HallPart) -> Self {
        self.hall = Some(hall);
        self
    }

    /// CDU `from`'s retained state `st`, heard on the bus at `now` and
    /// `age_ms` old (`crate::shell::hall_state`): in a
    /// hall, the coordinator's plan goes down when due.
    pub fn hall_state(&mut self, from: &Ident, st: &CduState, now: Now, age_ms: u64) -> Vec<Act> {
        let water = self
            .hall
            .as_mut()
            .and_then(|h| h.heard(from, st, now.mono_ms, age_ms));
        water.map(Act::FacilityTarget).into_iter().collect()
    }

    /// The hall's water last handed out ([`Act::FacilityTarget`]) did
    /// not reach the MCU's line: it goes down again at the next word.
    pub fn facility_not_sent(&mut self) {
        if let Some(h) = self.hall.as_mut() {
            h.not_sent();
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> LinkCounts {
        self.counts
    }

    /// The MCU is silent now.
    pub fn silent(&self) -> bool {
        self.silent
    }

    /// The last status heard.
    pub fn last_status(&self) -> Option<&Status> {
        self.last.as_deref()
    }

    /// How long the MCU has been quiet at `now`: since its last status,
    /// or the gateway's start, ms.
    pub fn quiet_ms(&self, now: Now) -> u64 {
        let from = self.last_frame.unwrap_or(self.started);
        now.mono_ms.saturating_sub(from.mono_ms)
    }

    /// The mode and reason of the last status heard.
    pub fn last_mode(&self) -> Option<(CduMode, ReasonCode)> {
        self.last.as_ref().map(|s| (s.mode.0, s.mode.1))
    }

    /// Takes the bytes the link brought at `now`.
    pub fn hear(&mut self, bytes: &[u8], now: Now) -> Vec<Act> {
        let mut acts = Vec::new();
        for &b in bytes {
            let got = match self.deframer.push(b) {
                Fed::More => continue,
                Fed::Dropped(e) => Err(e),
                Fed::Frame(r)
                    if self
                        .last_in
                        .as_ref()
                        .is_some_and(|(seq, m)| *seq == r.seq && m[..] == *r.payload) =>
                {
                    Ok((r.seq, None))
                }
                Fed::Frame(r) => {
                    self.last_in = Some((r.seq, r.payload.to_vec()));
                    Ok((r.seq, Some(r.message::<Up>())))
                }
            };
            match got {
                Err(e) => self.dropped(e, &mut acts),
                Ok((seq, None)) => self.repeated(seq, &mut acts),
                Ok((seq, Some(Err(e)))) => {
                    // Checked, so its number is the MCU's: a gap is real,
                    // and a restart is taken at the next frame that reads.
                    self.restart_unread |= self.number(seq, &mut acts);
                    self.dropped(e, &mut acts);
                }
                Ok((seq, Some(Ok(up)))) => {
                    self.counts.frames_in += 1;
                    let restarted = self.numbered(seq, &mut acts);
                    if matches!(up, Up::Status(_)) {
                        self.heard_from(now, &mut acts);
                    }
                    if restarted || matches!(up, Up::Hello(_)) {
                        self.mcu_started(now, &mut acts);
                    }
                    self.take(up, now, &mut acts);
                }
            }
        }
        acts
    }

    /// Time passes: says when the MCU falls silent, and the silent state
    /// while it is due; logs a summary of the link's trouble, when there
    /// was any, at most every [`SUMMARY_EVERY_MS`].
    pub fn tick(&mut self, now: Now) -> Vec<Act> {
        let mut acts = Vec::new();
        let quiet_ms = self.quiet_ms(now);
        if !self.silent && quiet_ms >= SILENT_AFTER_MS {
            self.silent = true;
            self.counts.silences += 1;
            let heard = if self.last_frame.is_some() {
                "since its last"
            } else {
                "since the gateway started"
            };
            acts.push(Act::Say(
                Level::Error,
                format!(
                    "the microcontroller has sent no status for {} s {heard}: the bus is told failsafe (controller-silent), keeping the racks last heard; the CDU falls back on its heartbeat",
                    quiet_ms / 1000
                ),
            ));
        }
        if self.silent {
            self.silent_state(now, &mut acts);
        }
        let trouble = self.counts.trouble();
        let (was, at) = self.summarised;
        if trouble != was && now.mono_ms.saturating_sub(at) >= SUMMARY_EVERY_MS {
            self.summarised = (trouble, now.mono_ms);
            let words = format!("link to the microcontroller: {}", self.counts.words());
            acts.push(Act::Say(Level::Warn, words));
        }
        acts
    }

    /// The state of key `key`, with its part in the hall `facility`, went
    /// on the bus at `mono_ms`.
    pub fn state_published(
        &mut self,
        key: StateKey,
        facility: Option<FacilityState>,
        mono_ms: u64,
    ) {
        self.state_sent = Some(StateSent {
            key,
            at_ms: mono_ms,
        });
        if let (Some(h), Some(f)) = (self.hall.as_mut(), facility) {
            h.sent(f);
        }
    }

    /// The gateway's [`Down::Alive`] at Unix ms `unix_ms`, `bus` saying
    /// whether the broker is connected, with the layout this gateway maps
    /// host ids and racks by: an MCU whose figures lay the CDU out
    /// otherwise takes no host report and sends no status or lease (its
    /// silence is then said on the bus as any other), and says why as
    /// an error line naming both layouts and its figures' digest.
    pub fn alive(&self, unix_ms: u64, bus: bool) -> Down {
        Down::Alive {
            unix_ms,
            bus,
            layout: CduLayout::from(&self.layout),
        }
    }

    /// `down` as the next frame to the MCU.
    pub fn frame(&mut self, down: &Down) -> Result<Vec<u8>, EncodeError> {
        let mut scratch = vec![0u8; MAX_MESSAGE + OVERHEAD];
        let mut out = vec![0u8; FRAME_MAX];
        let n = encode(down, self.out_seq, &mut scratch, &mut out)?;
        self.out_seq = self.out_seq.wrapping_add(1);
        out.truncate(n);
        Ok(out)
    }

    /// The line opened (again): bytes of a frame begun on the line before
    /// (a serial adapter unplugged, a TCP line's server restarted) are
    /// dropped, not glued onto the first frame of this one (the MCU's
    /// hello, after its own restart). (The line writes an end byte
    /// first, for the MCU's side: `super::link`.) In a hall, the water
    /// in force at `now` goes down again: nothing went down the closed
    /// line.
    pub fn line_opened(&mut self, now: Now) -> Option<f32> {
        *self.deframer = Deframer::default();
        self.hall.as_mut().and_then(|h| h.in_force(now.mono_ms))
    }

    /// A frame to the MCU was written (`true`), or not.
    pub fn wrote(&mut self, written: bool) {
        if written {
            self.counts.frames_out += 1;
        } else {
            self.counts.frames_unsent += 1;
        }
    }

    fn dropped(&mut self, e: FrameError, acts: &mut Vec<Act>) {
        let n = self.counts.dropped.count(e);
        // The first of each kind is a warning; the rest are in the
        // summary and at debug.
        let level = if n == 1 { Level::Warn } else { Level::Debug };
        acts.push(Act::Say(level, format!("{e} (the {} of its kind)", nth(n))));
    }

    /// Frame `seq` came again as the last one checked: counted, not taken.
    fn repeated(&mut self, seq: u32, acts: &mut Vec<Act>) {
        self.counts.repeats += 1;
        let level = if self.counts.repeats == 1 {
            Level::Warn
        } else {
            Level::Debug
        };
        acts.push(Act::Say(
            level,
            format!("frame {seq} from the microcontroller came again: not taken again"),
        ));
    }

    /// Frame number `seq` heard, its message read or not: a gap is
    /// counted and said; whether the number says the MCU started again.
    fn number(&mut self, seq: u32, acts: &mut Vec<Act>) -> bool {
        match self.seq.hear(seq) {
            Order::First | Order::Next => false,
            Order::Gap(n) => {
                self.counts.gaps += 1;
                self.counts.lost = self.seq.lost;
                acts.push(Act::Say(
                    Level::Warn,
                    format!(
                        "{n} frame{} from the microcontroller lost before frame {seq}",
                        if n == 1 { "" } else { "s" }
                    ),
                ));
                false
            }
            Order::Restart => true,
        }
    }

    /// Frame number `seq`, whose message read, heard; whether the MCU
    /// started again (by this number, or by that of a frame before it
    /// that did not read).
    fn numbered(&mut self, seq: u32, acts: &mut Vec<Act>) -> bool {
        let unread = std::mem::take(&mut self.restart_unread);
        if !self.number(seq, acts) && !unread {
            return false;
        }
        self.counts.restarts = self.seq.restarts;
        self.anchor_ms = None;
        acts.push(Act::Say(
            Level::Warn,
            format!("the microcontroller started again (its frames are numbered from {seq} again)"),
        ));
        true
    }

    /// The MCU started (its hello, or its numbers starting again): what
    /// the gateway told it goes down again ([`Act::Started`] for the BMS's
    /// limits); in a hall, it has no offer until it sends one, and the
    /// water it followed goes down again.
    fn mcu_started(&mut self, now: Now, acts: &mut Vec<Act>) {
        acts.push(Act::Started);
        if let Some(water) = self.hall.as_mut().and_then(|h| h.restarted(now.mono_ms)) {
            acts.push(Act::FacilityTarget(water));
        }
    }

    /// The MCU's offer to the hall's coordinator, kept for the state.
    fn offered(&mut self, offer: Option<FacilityOffer>, acts: &mut Vec<Act>) {
        match self.hall.as_mut() {
            Some(h) => h.offered(offer.as_ref()),
            None if !self.offer_unplaced => {
                self.offer_unplaced = true;
                acts.push(Act::Say(
                    Level::Warn,
                    "the microcontroller offers facility water to a hall's coordinator, but no facility_coordinator is configured: its offer is not published".into(),
                ));
            }
            None => {}
        }
    }

    fn heard_from(&mut self, now: Now, acts: &mut Vec<Act>) {
        if self.silent {
            self.silent = false;
            let quiet_s = self
                .last_frame
                .map(|f| now.mono_ms.saturating_sub(f.mono_ms) / 1000);
            let words = match quiet_s {
                Some(s) => format!("the microcontroller speaks again after {s} s of silence"),
                None => {
                    "the microcontroller speaks, after a silence from the gateway's start".into()
                }
            };
            acts.push(Act::Say(Level::Warn, words));
        }
        self.last_frame = Some(now);
    }

    fn take(&mut self, up: Up, now: Now, acts: &mut Vec<Act>) {
        match up {
            Up::Hello(h) => {
                self.anchor_ms = None;
                acts.push(hello(&h));
            }
            Up::Status(s) => self.status(Box::new(s), now, acts),
            Up::Event(e) => acts.push(Act::Event(e)),
            Up::Lease { host, lease, lift } => acts.push(Act::Lease {
                host: usize::from(host),
                lease,
                lift,
            }),
            Up::Answer { id, outcome } => {
                let outcome = outcome.map_err(|why| String::from(why.as_str()));
                acts.push(match &outcome {
                    Ok(()) => Act::Say(Level::Warn, format!("operator's clear {id}: done")),
                    Err(why) => Act::Say(
                        Level::Info,
                        format!("operator's clear {id}: refused: {why}"),
                    ),
                });
                acts.push(Act::Answer { id, outcome });
            }
            Up::Said { error, words } => {
                let level = if error { Level::Error } else { Level::Warn };
                acts.push(Act::Say(
                    level,
                    format!("the microcontroller says: {words}"),
                ));
            }
            Up::Offer(offer) => self.offered(offer, acts),
        }
    }

    /// MCU ms `mcu_ms` on the wall clock.
    fn unix(&self, mcu_ms: u64) -> TimestampMs {
        let anchor = self.anchor_ms.unwrap_or(0);
        let unix = (anchor + i128::from(mcu_ms)).clamp(0, i128::from(u64::MAX));
        TimestampMs(unix as u64)
    }

    fn status(&mut self, s: Box<Status>, now: Now, acts: &mut Vec<Act>) {
        // Anchored at the first status after a start, and again when a
        // status reads it more than REANCHOR_AFTER_MS off: the MCU's
        // crystal drifts from the wall clock (50 ppm is 4 s a day), or the
        // wall clock stepped. The link's own delay stays well inside it.
        let heard = i128::from(now.unix_ms) - i128::from(s.at_ms);
        match self.anchor_ms {
            Some(a) if (heard - a).abs() <= REANCHOR_AFTER_MS => {}
            _ => self.anchor_ms = Some(heard),
        }
        let facts = StepFacts {
            mode: s.mode.0,
            reason: s.mode.1,
            since: self.unix(s.mode.2),
            setpoint_c: s.setpoint_c,
            pump_speed: s.pump_speed,
            pump_on: s.pump_on,
            valves_open: valves_of(&s, self.layout.racks),
            cooling_lost: s.racks.cooling_lost,
            sensing_lost: s.racks.sensing_lost,
            leaks_wet: s.racks.leaks_wet,
            readings: s.readings.as_ref(),
            sensor_faults: s.sensor_faults,
            outdoor_c: s.outdoor_c,
        };
        // What the MCU has learned of its hall stays on it.
        let telemetry = cdu_telemetry(&facts, &self.layout, None);
        acts.push(Act::Telemetry(Box::new(telemetry)));
        self.state_if_due(&facts, true, now, acts);
        self.last = Some(s);
    }

    /// The state of `facts` at `now`, when due by `run`'s rule: the
    /// state's own, or, in a hall, its part moved (and the water of this
    /// gateway's own plan, when it coordinates and it is due to go down).
    /// Without `racks_known` (no status heard since the gateway started)
    /// the state lists no rack: hosts then know nothing of their rack's
    /// cooling, as from silence, and neither end a cooling loss (a rack
    /// may still be shut after a leak) nor start one.
    fn state_if_due(
        &mut self,
        facts: &StepFacts<'_>,
        racks_known: bool,
        now: Now,
        acts: &mut Vec<Act>,
    ) {
        let key = facts.state_key();
        let speaks = !self.silent;
        let (facility, moved) = match self.hall.as_mut() {
            Some(h) => {
                let (state, moved, water) = h.state(speaks, facts.outdoor_c, now.mono_ms);
                acts.extend(water.map(Act::FacilityTarget));
                (Some(state), moved)
            }
            None => (None, false),
        };
        if !moved && !StateSent::due(self.state_sent.as_ref(), &key, now.mono_ms) {
            return;
        }
        let mut st = cdu_state(facts, &self.layout, facility);
        if !racks_known {
            st.racks.clear();
        }
        acts.push(Act::State(Box::new(st), key));
    }

    /// The state that says the MCU is silent, when due: failsafe since
    /// its last frame (or the gateway's start), with the racks and the
    /// setpoint of its last status (no rack, and the failsafe setpoint,
    /// before any status), offering nothing to the hall. The silence is
    /// timed on the steady clock and read on the wall clock now, so a
    /// wall clock stepped back since never dates it after now.
    fn silent_state(&mut self, now: Now, acts: &mut Vec<Act>) {
        let since = now.unix_ms.saturating_sub(self.quiet_ms(now));
        let (racks, setpoint_c) = match &self.last {
            Some(s) => (s.racks, s.setpoint_c),
            None => (Default::default(), self.failsafe_setpoint_c),
        };
        let facts = StepFacts {
            mode: CduMode::Failsafe,
            reason: ReasonCode::CONTROLLER_SILENT,
            since: TimestampMs(since),
            setpoint_c,
            pump_speed: 0.0,
            pump_on: [false; 2],
            valves_open: self.last.as_deref().map_or_else(
                || valves_shown(None, self.layout.racks),
                |s| valves_of(s, self.layout.racks),
            ),
            cooling_lost: racks.cooling_lost,
            sensing_lost: racks.sensing_lost,
            leaks_wet: racks.leaks_wet,
            readings: None,
            sensor_faults: [None; 4],
            outdoor_c: None,
        };
        let racks_known = self.last.is_some();
        self.state_if_due(&facts, racks_known, now, acts);
    }
}

/// The MCU's hello, for the log: a restart by its watchdog or a fault is
/// a warning.
fn hello(h: &Hello) -> Act {
    let (level, cause) = match h.reset {
        ResetCause::PowerOn => (Level::Info, "power on"),
        ResetCause::Watchdog => (
            Level::Warn,
            "its watchdog (a step did not complete in time)",
        ),
        ResetCause::Fault => (Level::Warn, "a fault (a panic or a hard fault)"),
    };
    let restored = if h.restored {
        "its latched record restored from its flash"
    } else {
        // False also for a record kept but unreadable (damaged, or lost
        // with the config store): the microcontroller says which next.
        "its latched record not restored (none kept, or unreadable: see what it says next)"
    };
    Act::Say(
        level,
        format!(
            "the microcontroller started: firmware {}, boot {}, reset by {cause}, {restored}",
            h.firmware, h.boot
        ),
    )
}

/// 1st, 2nd, 3rd, 4th…
fn nth(n: u64) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, 11) | (2, 12) | (3, 13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use cooling_core::CoreConfig;
    use loopwarden_link::{Cost, RackBits};
    use loopwarden_protocol::message::{LeakSensing, Pump, RackCooling};

    const T0: u64 = 1_700_000_000_000;

    fn at(ms: u64) -> Now {
        Now {
            mono_ms: ms,
            unix_ms: T0 + ms,
        }
    }

    fn bridge() -> Bridge {
        let core = CoreConfig::default();
        Bridge::new(core.layout, core.margins.failsafe_setpoint_c, at(0))
    }

    fn frame(up: &Up, seq: u32) -> Vec<u8> {
        let mut scratch = vec![0u8; MAX_MESSAGE + OVERHEAD];
        let mut out = vec![0u8; FRAME_MAX];
        let n = encode(up, seq, &mut scratch, &mut out).unwrap();
        out.truncate(n);
        out
    }

    /// A status of step `step` at MCU ms `at_ms`, in `mode` since MCU ms
    /// 500, with rack 1's cooling lost when `lost`.
    fn status(step: u32, at_ms: u64, mode: CduMode, lost: bool) -> Up {
        Up::Status(Status {
            step,
            at_ms,
            mode: (mode, ReasonCode::OK, 500),
            setpoint_c: 32.0,
            pump_speed: 0.5,
            pump_on: [true, false],
            lead: Pump::A,
            racks: RackBits {
                valves_open: 0b1101,
                cooling_lost: if lost { 0b0010 } else { 0 },
                ..RackBits::default()
            },
            pumps_failed: [false; 2],
            beacon: false,
            sensor_faults: [None; 4],
            readings: Some(cooling_decide::CduMeasurements {
                supply_c: Some(31.5),
                flow_lpm: Some(480.0),
                ..Default::default()
            }),
            outdoor_c: Some(12.0),
            writes_ok: true,
            events_dropped: 0,
            cost: Cost::default(),
        })
    }

    fn states(acts: &[Act]) -> Vec<(&CduState, StateKey)> {
        acts.iter()
            .filter_map(|a| match a {
                Act::State(s, k) => Some((&**s, *k)),
                _ => None,
            })
            .collect()
    }

    fn publishes(acts: &[Act]) -> usize {
        acts.iter().filter(|a| !matches!(a, Act::Say(..))).count()
    }

    #[test]
    fn a_status_is_telemetry_each_time_and_a_state_when_due_by_the_shells_rule() {
        let mut b = bridge();
        let acts = b.hear(
            &frame(&status(1, 10_000, CduMode::Normal, false), 0),
            at(1_000),
        );
        let Some(Act::Telemetry(t)) = acts.first() else {
            panic!("{acts:?}")
        };
        assert_eq!(t.setpoint.value(), 32.0);
        assert_eq!(t.supply.map(|c| c.value()), Some(31.5));
        assert_eq!(t.ambient.map(|c| c.value()), Some(12.0));
        assert!(t.learned.is_none(), "what the MCU learned stays on it");
        let st = states(&acts);
        assert_eq!(st.len(), 1);
        let (s, key) = st[0];
        assert_eq!((s.mode, s.reason), (CduMode::Normal, ReasonCode::OK));
        // Heard at T0 + 1 s as MCU ms 10,000: MCU ms 500 is 9.5 s earlier.
        assert_eq!(s.since, TimestampMs(T0 + 1_000 - 9_500));
        assert_eq!(s.racks.len(), CoreConfig::default().layout.racks as usize);
        b.state_published(key, None, 1_000);
        // The same again: telemetry only; a change of a rack's cooling: a
        // state; a minute without one: a state.
        let acts = b.hear(
            &frame(&status(2, 11_000, CduMode::Normal, false), 1),
            at(2_000),
        );
        assert_eq!((publishes(&acts), states(&acts).len()), (1, 0));
        let acts = b.hear(
            &frame(&status(3, 12_000, CduMode::Normal, true), 2),
            at(3_000),
        );
        let st = states(&acts);
        assert_eq!(st[0].0.racks[1].cooling, RackCooling::Lost);
        assert_eq!(st[0].0.racks[0].cooling, RackCooling::Normal);
        b.state_published(st[0].1, None, 3_000);
        let later = at(3_000 + STATE_EVERY_MS);
        let acts = b.hear(&frame(&status(4, 72_000, CduMode::Normal, true), 3), later);
        assert_eq!(states(&acts).len(), 1);
        assert_eq!(b.counts().frames_in, 4);
    }

    const STATE_EVERY_MS: u64 = crate::shell::STATE_EVERY.as_millis() as u64;

    #[test]
    fn the_bus_shows_the_valves_the_mcu_says_the_cdu_took() {
        let mut b = bridge();
        let Up::Status(mut s) = status(1, 10_000, CduMode::Normal, false) else {
            unreachable!()
        };
        let mut shown = |s: &Status, seq: u32| {
            let acts = b.hear(
                &frame(&Up::Status(s.clone()), seq),
                at(1_000 * (u64::from(seq) + 1)),
            );
            let Some(Act::Telemetry(t)) = acts.first() else {
                panic!("{acts:?}")
            };
            t.racks.iter().map(|r| r.valve.get()).collect::<Vec<u8>>()
        };
        // Rack 2 leaks; its close did not go in: the MCU says every valve
        // the CDU took is open.
        s.racks.valves_open = 0b1111;
        assert_eq!(shown(&s, 0), [100; 4], "a close not known done shows open");
        // The close went in; another write of the step failed: shut all
        // the same, as the CDU has it.
        s.racks.valves_open = 0b1011;
        s.writes_ok = false;
        assert_eq!(shown(&s, 1), [100, 100, 0, 100]);
    }

    #[test]
    fn events_leases_and_words_pass_through_as_the_mcu_said_them() {
        let mut b = bridge();
        let said = |error, w: &str| Up::Said {
            error,
            words: heapless::String::try_from(w).unwrap(),
        };
        let lease =
            loopwarden_protocol::samples::message(loopwarden_protocol::MessageKind::CapLease);
        let loopwarden_protocol::Message::CapLease(lease) = lease else {
            panic!()
        };
        let ups = [
            Up::Hello(Hello {
                boot: 4,
                reset: ResetCause::Watchdog,
                firmware: heapless::String::try_from("0.1.0").unwrap(),
                restored: true,
            }),
            Up::Event(Event::PumpTrip {
                pump: Pump::A,
                lag_started: true,
            }),
            Up::Lease {
                host: 5,
                lease: lease.clone(),
                lift: true,
            },
            said(true, "the latched record is not in flash"),
        ];
        let bytes: Vec<u8> = ups
            .iter()
            .enumerate()
            .flat_map(|(i, u)| frame(u, i as u32))
            .collect();
        let acts = b.hear(&bytes, at(100));
        assert_eq!(acts[0], Act::Started, "the hello: what it forgot goes down");
        let acts = &acts[1..];
        assert!(
            matches!(&acts[0], Act::Say(Level::Warn, w) if w.contains("boot 4") && w.contains("watchdog") && w.contains("restored")),
            "{acts:?}"
        );
        assert!(matches!(
            &acts[1],
            Act::Event(Event::PumpTrip { pump: Pump::A, .. })
        ));
        assert_eq!(
            acts[2],
            Act::Lease {
                host: 5,
                lease,
                lift: true
            }
        );
        assert!(
            matches!(&acts[3], Act::Say(Level::Error, w) if w == "the microcontroller says: the latched record is not in flash")
        );
        assert_eq!(acts.len(), 4);
    }

    #[test]
    fn the_mcus_answers_to_clears_are_logged_and_handed_on_for_the_operator() {
        let mut b = bridge();
        let refusal = heapless::String::try_from("its signature does not verify").unwrap();
        let ups = [
            Up::Answer {
                id: 41,
                outcome: Ok(()),
            },
            Up::Answer {
                id: 42,
                outcome: Err(refusal),
            },
        ];
        let bytes: Vec<u8> = ups
            .iter()
            .enumerate()
            .flat_map(|(i, u)| frame(u, i as u32))
            .collect();
        let acts = b.hear(&bytes, at(100));
        assert!(matches!(&acts[0], Act::Say(Level::Warn, w) if w == "operator's clear 41: done"));
        assert_eq!(
            acts[1],
            Act::Answer {
                id: 41,
                outcome: Ok(())
            }
        );
        assert!(
            matches!(&acts[2], Act::Say(Level::Info, w) if w.ends_with("refused: its signature does not verify"))
        );
        assert_eq!(
            acts[3],
            Act::Answer {
                id: 42,
                outcome: Err("its signature does not verify".into())
            }
        );
        assert_eq!(acts.len(), 4, "nothing for the bus: {acts:?}");
    }

    #[test]
    fn a_corrupt_frame_is_counted_and_dropped_never_published() {
        let mut b = bridge();
        let mut bad = frame(&status(1, 1_000, CduMode::Failsafe, true), 0);
        bad[9] ^= 0x21;
        let acts = b.hear(&bad, at(100));
        assert_eq!(publishes(&acts), 0, "{acts:?}");
        assert!(matches!(&acts[..], [Act::Say(Level::Warn, w)] if w.contains("dropped")));
        assert_eq!(b.counts().dropped.total(), 1);
        assert_eq!(b.counts().frames_in, 0);
        // The next frame is read; its number shows the one lost.
        let acts = b.hear(
            &frame(&status(2, 2_000, CduMode::Normal, false), 1),
            at(200),
        );
        assert_eq!(publishes(&acts), 2);
        // A frame whose message does not decode is dropped as such.
        let mut scratch = [0u8; 64];
        let mut out = [0u8; 80];
        let n = encode(&(250u8, 1u8), 2, &mut scratch, &mut out).unwrap();
        let acts = b.hear(&out[..n], at(300));
        assert_eq!(publishes(&acts), 0);
        assert_eq!(b.counts().dropped.payload, 1);
    }

    #[test]
    fn gaps_and_restarts_of_the_mcus_numbers_are_counted() {
        let mut b = bridge();
        for seq in [0, 1, 4] {
            b.hear(
                &frame(&status(seq, 1_000, CduMode::Normal, false), seq),
                at(100),
            );
        }
        assert_eq!((b.counts().gaps, b.counts().lost), (1, 2));
        let acts = b.hear(&frame(&status(0, 10, CduMode::Boot, false), 0), at(200));
        assert!(acts
            .iter()
            .any(|a| matches!(a, Act::Say(Level::Warn, w) if w.contains("started again"))));
        assert_eq!(b.counts().restarts, 1);
        // The restarted MCU's clock is anchored anew: its mode's `since`
        // (MCU ms 500) is after its step at 10 ms, heard at T0 + 200.
        let st = states(&acts);
        assert_eq!(st[0].0.since, TimestampMs(T0 + 200 - 10 + 500));
    }

    #[test]
    fn a_frame_begun_before_the_line_opened_again_is_not_glued_to_the_next() {
        let mut b = bridge();
        let whole = frame(&status(10, 1_000, CduMode::Normal, false), 10);
        // Half a frame, then the line goes and comes back.
        b.hear(&whole[..whole.len() / 2], at(100));
        assert_eq!(b.line_opened(at(150)), None, "not in a hall");
        let next = frame(&status(11, 1_300, CduMode::Normal, false), 11);
        let acts = b.hear(&next, at(200));
        assert!(
            acts.iter().any(|a| matches!(a, Act::Telemetry(..))),
            "the status is taken: {acts:?}"
        );
        let c = b.counts();
        assert_eq!((c.frames_in, c.dropped.total()), (1, 0), "{c:?}");
    }

    #[test]
    fn a_gap_before_a_frame_that_does_not_read_is_counted_and_said() {
        let mut b = bridge();
        b.hear(
            &frame(&status(10, 1_000, CduMode::Normal, false), 10),
            at(100),
        );
        // A message of a newer firmware: checked, numbered, not read.
        let mut scratch = [0u8; 64];
        let mut out = [0u8; 80];
        let n = encode(&(250u8, 1u8), 13, &mut scratch, &mut out).unwrap();
        let acts = b.hear(&out[..n], at(200));
        assert!(
            acts.iter().any(|a| matches!(a, Act::Say(Level::Warn, w)
                if w.contains("2 frames from the microcontroller lost before frame 13"))),
            "{acts:?}"
        );
        assert_eq!(b.counts().dropped.payload, 1);
        b.hear(
            &frame(&status(11, 1_300, CduMode::Normal, false), 14),
            at(300),
        );
        let c = b.counts();
        assert_eq!((c.gaps, c.lost, c.restarts), (1, 2, 0));
    }

    #[test]
    fn a_frame_the_line_repeats_is_counted_and_not_taken_again() {
        let mut b = bridge();
        let lease = Up::Lease {
            host: 2,
            lease: loopwarden_protocol::samples::cooling_lease(3, &[], 30_000),
            lift: false,
        };
        let once = frame(&lease, 7);
        let acts = b.hear(&[once.clone(), once.clone()].concat(), at(100));
        let leases = acts.iter().filter(|a| matches!(a, Act::Lease { .. }));
        assert_eq!(leases.count(), 1, "{acts:?}");
        assert!(acts
            .iter()
            .any(|a| matches!(a, Act::Say(Level::Warn, w) if w.contains("came again"))));
        let c = b.counts();
        assert_eq!((c.frames_in, c.repeats, c.restarts), (1, 1, 0));
        // The same message under the next number is the MCU's own: taken.
        let acts = b.hear(&frame(&lease, 8), at(200));
        assert_eq!(publishes(&acts), 1);
    }

    #[test]
    fn silence_for_3_s_says_failsafe_controller_silent_with_the_racks_last_heard() {
        let mut b = bridge();
        let acts = b.hear(
            &frame(&status(1, 1_000, CduMode::Normal, true), 0),
            at(1_000),
        );
        b.state_published(states(&acts)[0].1, None, 1_000);
        assert!(b.tick(at(3_999)).is_empty());
        let acts = b.tick(at(4_000));
        assert!(
            matches!(&acts[0], Act::Say(Level::Error, w) if w.contains("no status for 3 s since its last")),
            "{acts:?}"
        );
        let st = states(&acts);
        let (s, key) = st[0];
        assert_eq!(
            (s.mode, s.reason),
            (CduMode::Failsafe, ReasonCode::CONTROLLER_SILENT)
        );
        assert_eq!(s.since, TimestampMs(T0 + 1_000), "since its last frame");
        assert_eq!(s.racks[1].cooling, RackCooling::Lost);
        assert_eq!(s.racks[0].sensing, LeakSensing::Supervised);
        assert_eq!(s.setpoint.value(), 32.0);
        assert_eq!((s.supply, s.flow_per_gpu), (None, None));
        assert!(b.silent());
        // Not published (the broker was away): due again at the next tick.
        assert_eq!(states(&b.tick(at(4_250))).len(), 1);
        b.state_published(key, None, 4_250);
        assert!(b.tick(at(5_000)).is_empty());
        assert_eq!(b.counts().silences, 1);
        // Frames again: said, and the next status is a state at once.
        let acts = b.hear(
            &frame(&status(9, 9_000, CduMode::Normal, true), 1),
            at(9_000),
        );
        assert!(
            matches!(&acts[0], Act::Say(Level::Warn, w) if w.contains("speaks again after 8 s"))
        );
        assert_eq!(states(&acts)[0].0.mode, CduMode::Normal);
        assert!(!b.silent());
    }

    #[test]
    fn a_drifting_mcu_clock_is_anchored_anew_past_a_second_and_not_for_the_links_delay() {
        let mut b = bridge();
        let mode_since = |acts: &[Act]| states(acts)[0].0.since;
        let heard = |mono_ms: u64, unix_ms: u64| Now { mono_ms, unix_ms };
        // Anchored: MCU ms 0 is T0 (its mode since MCU ms 500).
        let acts = b.hear(
            &frame(&status(1, 1_000, CduMode::Normal, false), 0),
            at(1_000),
        );
        assert_eq!(mode_since(&acts), TimestampMs(T0 + 500));
        // A status 400 ms late (the link): the anchor stays.
        let acts = b.hear(
            &frame(&status(2, 2_000, CduMode::Failsafe, false), 1),
            heard(2_400, T0 + 2_400),
        );
        assert_eq!(mode_since(&acts), TimestampMs(T0 + 500));
        // A day on, the MCU's clock 4.3 s behind the wall's: anchored anew.
        let day = 86_400_000;
        let acts = b.hear(
            &frame(&status(3, day, CduMode::Normal, false), 2),
            heard(day + 4_300, T0 + day + 4_300),
        );
        assert_eq!(mode_since(&acts), TimestampMs(T0 + 4_300 + 500));
    }

    #[test]
    fn an_mcu_that_says_hello_and_errors_but_no_status_stays_silent() {
        // A firmware that refuses to run its core (figures it cannot
        // believe) says why every minute, and never steps.
        let mut b = bridge();
        let acts = b.hear(
            &frame(&status(1, 1_000, CduMode::Normal, true), 0),
            at(1_000),
        );
        b.state_published(states(&acts)[0].1, None, 1_000);
        assert!(!b.tick(at(4_000)).is_empty());
        assert!(b.silent());
        let hello = Up::Hello(Hello {
            boot: 5,
            reset: ResetCause::PowerOn,
            firmware: heapless::String::try_from("0.1.0").unwrap(),
            restored: false,
        });
        let refused = Up::Said {
            error: true,
            words: heapless::String::try_from("figures: refused").unwrap(),
        };
        for (i, up) in [hello, refused].iter().enumerate() {
            let acts = b.hear(&frame(up, i as u32), at(60_000 + i as u64));
            assert!(
                !acts
                    .iter()
                    .any(|a| matches!(a, Act::Say(_, w) if w.contains("speaks again"))),
                "{acts:?}"
            );
            assert!(b.silent(), "a hello or an error is not a step");
        }
        assert_eq!(b.counts().silences, 1, "one silence, not one a minute");
        // Its first status ends it.
        b.hear(
            &frame(&status(2, 70_000, CduMode::Normal, true), 2),
            at(70_000),
        );
        assert!(!b.silent());
    }

    /// A hello without a restored record does not say none was kept: a
    /// record kept but unreadable reads the same in the hello.
    #[test]
    fn a_hello_without_a_restored_record_does_not_say_there_was_none() {
        let said = |restored| match hello(&Hello {
            boot: 5,
            reset: ResetCause::Watchdog,
            firmware: heapless::String::try_from("0.1.0").unwrap(),
            restored,
        }) {
            Act::Say(_, words) => words,
            other => panic!("{other:?}"),
        };
        let not = said(false);
        assert!(!not.contains("no latched record"), "{not}");
        assert!(
            not.contains("not restored") && not.contains("unreadable"),
            "{not}"
        );
        assert!(said(true).contains("restored from its flash"));
    }

    #[test]
    fn an_mcu_silent_from_the_start_is_said_at_its_failsafe_setpoint_with_no_rack() {
        let mut b = bridge();
        assert!(b.tick(at(2_999)).is_empty());
        let acts = b.tick(at(3_000));
        let (s, _) = states(&acts)[0];
        assert_eq!(s.reason, ReasonCode::CONTROLLER_SILENT);
        assert_eq!(s.since, TimestampMs(T0));
        let core = CoreConfig::default();
        assert_eq!(
            s.setpoint.value(),
            f64::from(core.margins.failsafe_setpoint_c)
        );
        // Nothing is known of the racks: none is listed, so no host reads
        // "cooling back" (a rack may still be shut after a leak) or "lost".
        assert!(s.racks.is_empty(), "{:?}", s.racks);
    }

    #[test]
    fn the_gateways_alive_carries_the_layout_it_maps_hosts_by() {
        let mut core = CoreConfig::default();
        core.layout.racks = 6;
        core.layout.hosts_per_rack = 3;
        core.layout.gpus_per_host = 4;
        let b = Bridge::new(core.layout, core.margins.failsafe_setpoint_c, at(0));
        let want = CduLayout {
            racks: 6,
            hosts_per_rack: 3,
            gpus_per_host: 4,
        };
        assert_eq!(
            b.alive(T0, true),
            Down::Alive {
                unix_ms: T0,
                bus: true,
                layout: want
            }
        );
        // An MCU of another layout says so as an error, which is logged
        // as one with both layouts and its figures' digest.
        let said = Up::Said {
            error: true,
            words: heapless::String::try_from(
                "layout differs: mine 4x4x8 (figures 0x1a2b3c4d), yours 6x3x4: no host report, status or lease",
            )
            .unwrap(),
        };
        let mut b = b;
        let acts = b.hear(&frame(&said, 0), at(100));
        assert!(
            matches!(&acts[..], [Act::Say(Level::Error, w)] if w.contains("mine 4x4x8 (figures 0x1a2b3c4d), yours 6x3x4")),
            "{acts:?}"
        );
    }

    #[test]
    fn frames_down_are_numbered_in_turn_and_read_back_whole() {
        let mut b = bridge();
        let downs = [
            b.alive(T0, true),
            Down::Host {
                index: 3,
                stamped: TimestampMs(T0),
                telemetry: loopwarden_protocol::samples::host_telemetry(16),
            },
        ];
        let mut d = Deframer::<FRAME_MAX>::default();
        for (i, down) in downs.iter().enumerate() {
            let bytes = b.frame(down).unwrap();
            let mut got = None;
            for x in bytes {
                if let Fed::Frame(r) = d.push(x) {
                    got = Some((r.seq, r.message::<Down>().unwrap()));
                }
            }
            assert_eq!(got, Some((i as u32, down.clone())));
            b.wrote(true);
        }
        b.wrote(false);
        assert_eq!((b.counts().frames_out, b.counts().frames_unsent), (2, 1));
    }

    #[test]
    fn trouble_on_the_link_is_summed_up_in_the_log_at_most_every_minute() {
        let mut b = bridge();
        b.hear(&[1, 2, 3, 0], at(10));
        let acts = b.tick(at(SUMMARY_EVERY_MS));
        let summary: Vec<_> = acts
            .iter()
            .filter(|a| matches!(a, Act::Say(Level::Warn, w) if w.starts_with("link to the microcontroller")))
            .collect();
        assert_eq!(summary.len(), 1, "{acts:?}");
        assert!(format!("{summary:?}").contains("1 dropped"));
        // Nothing new: no summary.
        let acts = b.tick(at(2 * SUMMARY_EVERY_MS + 10));
        assert!(!acts
            .iter()
            .any(|a| matches!(a, Act::Say(Level::Warn, w) if w.starts_with("link"))));
    }

    fn offer(accept_c: f32) -> FacilityOffer {
        let o = cooling_core::facility::Offer::uncapped(accept_c, 110_000.0, 128.0, 200.0);
        crate::facility::offer_msg(&o)
    }

    #[test]
    fn in_a_hall_the_mcus_offer_rides_in_the_state_and_a_restart_has_the_plan_again() {
        use crate::facility::FacilityRole;
        use loopwarden_protocol::Ident;
        let mut core = CoreConfig::default();
        core.facility.cdus = 2;
        let id = |s: &str| Ident::new(s).unwrap();
        let role = FacilityRole {
            coordinator: id("cdu-1"),
            cdus: vec![id("cdu-1"), id("cdu-2")],
        };
        let mut b = bridge().in_hall(HallPart::new(role, &id("cdu-2"), &core));
        let acts = b.hear(&frame(&status(1, 1_000, CduMode::Normal, false), 0), at(0));
        let (s, key) = states(&acts)[0];
        assert_eq!(s.facility.as_ref().map(|f| &f.offer), Some(&None));
        b.state_published(key, s.facility.clone(), 0);
        // The offer, then a status: a state at once, carrying it.
        b.hear(&frame(&Up::Offer(Some(offer(31.5))), 1), at(500));
        let acts = b.hear(
            &frame(&status(2, 2_000, CduMode::Normal, false), 2),
            at(1_000),
        );
        let (s, key) = states(&acts)[0];
        let f = s.facility.clone().expect("its part in the hall");
        assert_eq!(f.offer, Some(offer(31.5)), "as the MCU sent it");
        assert_eq!(f.plan, None, "cdu-1 plans");
        b.state_published(key, Some(f), 1_000);
        let acts = b.hear(
            &frame(&status(3, 3_000, CduMode::Normal, false), 3),
            at(2_000),
        );
        assert!(states(&acts).is_empty(), "nothing moved");
        // The coordinator's plan goes down, and again after a restart.
        let mut plan = samples_state();
        plan.facility = Some(FacilityState {
            offer: None,
            plan: Some(loopwarden_protocol::message::FacilityPlan {
                water: cooling_decide::facility::celsius(30.0),
                chiller_stages: 1,
                offers: 2,
                capping: 0,
            }),
        });
        let acts = b.hall_state(&id("cdu-1"), &plan, at(2_500), 0);
        assert_eq!(acts, [Act::FacilityTarget(30.0)]);
        let acts = b.hear(&frame(&status(0, 10, CduMode::Boot, false), 0), at(3_000));
        assert!(acts.contains(&Act::FacilityTarget(30.0)), "{acts:?}");
        let st = states(&acts);
        assert_eq!(
            st[0].0.facility.as_ref().map(|f| &f.offer),
            Some(&None),
            "no offer yet"
        );
    }

    #[test]
    fn an_offer_outside_a_hall_is_said_once_and_not_published() {
        let mut b = bridge();
        let said = |acts: &[Act]| {
            acts.iter()
                .filter(
                    |a| matches!(a, Act::Say(Level::Warn, w) if w.contains("facility_coordinator")),
                )
                .count()
        };
        let acts = b.hear(&frame(&Up::Offer(Some(offer(31.5))), 0), at(0));
        assert_eq!(said(&acts), 1);
        let acts = b.hear(&frame(&Up::Offer(Some(offer(32.5))), 1), at(100));
        assert_eq!(said(&acts), 0);
        let acts = b.hear(
            &frame(&status(1, 1_000, CduMode::Normal, false), 2),
            at(200),
        );
        assert_eq!(states(&acts)[0].0.facility, None);
    }

    fn samples_state() -> CduState {
        match loopwarden_protocol::samples::message(loopwarden_protocol::MessageKind::CduState) {
            loopwarden_protocol::Message::CduState(s) => s,
            other => panic!("{other:?}"),
        }
    }
}
