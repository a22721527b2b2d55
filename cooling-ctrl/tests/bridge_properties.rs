//! Properties of the gateway's core (`gateway::bridge::Bridge`, with the
//! parts the gateway's loop composes it with: `clears::Pending`,
//! `bms::BmsBridge`, `facility::HallPart`), over random sequences of:
//! the microcontroller's frames (statuses, events, cap leases and lifts,
//! answers to clears, offers, said lines, its hello when it starts again)
//! harmed on the line or not (a bad CRC, truncated, its tail and end
//! lost, another link version, a message that does not decode,
//! duplicated, its numbers skipping), delivered in one read or two; time
//! passing with the loop's 250 ms ticks (silences shorter and longer than
//! 3 s, the MCU stepping every second); the MCU's clock jumping; the
//! gateway's wall clock stepping; what comes down from the bus (the BMS's
//! limits and outdoor temperature, operators' clears, the hall's plan);
//! the broker and the line coming and going; the gateway starting again
//! (a new bridge, a new loop). After every read and tick:
//!
//! 1. a published state lists a rack's cooling as the last status this
//!    gateway took says it (normal only if that status said so), and lists
//!    no rack before it took one; a silent MCU's state keeps them;
//! 2. at every tick 3 s or more after the last status (or the gateway's
//!    start) the bridge is silent and, with the broker connected, the
//!    retained state says `failsafe`, `controller-silent`; before that it
//!    is not silent; only a status ends the silence, and the state after
//!    it (with the broker connected) says the status's mode at once;
//! 3. each lease, event and answer the MCU sent is handed on once, as
//!    sent, in order, and nothing else is (a repeated frame adds none); a
//!    frame the line harmed gives one log line and one count, nothing else;
//! 4. each clear asked gets exactly one outcome: not sent (the line is
//!    closed), done or refused by the MCU's answer to that very clear, no
//!    answer at the first tick 10 s after it was sent, or lost with a
//!    gateway that stopped;
//! 5. a published state's `since` is never after the wall clock it is
//!    published at (within the 1 s the MCU's clock is read to); with the
//!    broker connected a state goes out at least every 60 s (with the
//!    next status, or at the tick while silent).
//!
//! Besides: in a hall, a state carries the MCU's last offer since it last
//! started (none while it is silent), and the water the gateway sends
//! down is a plan it heard; the BMS's limits go down at once, every 30 s
//! and when the MCU's numbers say it started again, its outdoor
//! temperature once per write, and the BMS reads the status's mode and
//! racks (`failsafe`, `controller-silent` while silent).
//!
//! The model ([`Expect`]) derives all this from the sequence: which frames
//! the line delivered whole ([`Run`]), which the gateway takes as new (a
//! frame identical to the last one checked is the line repeating it), when
//! the MCU started again (a hello, or a number at or below the last one
//! checked, as the link's numbering says; a frame whose message does not
//! read counts by its number, and the next frame taken is the start), and
//! what each said. It never asks the bridge what it took.
//!
//! Left out, and why:
//! - An older frame sent again later (not the one just taken): the link
//!   is not authenticated, and its numbering reads a number at or below
//!   the last as the MCU starting again, so such a frame is taken as
//!   new. A serial line does not replay frames; a party on the line can
//!   write any frame it likes.
//! - The MCU's numbers going back with no restart: the same rule.
//! - The MCU's clock going back with no restart: it is a free-running
//!   timer, ms since the MCU started (`loopwarden_link`'s glossary); a
//!   clock that went back would date a mode (its `since`) after the step
//!   that says it, and the gateway reads the MCU's times as it gives
//!   them. Its clock jumps ahead here (a mode then reads as older).
//! - Two clears of one id waiting at once (two operators signing in the
//!   same second, or one clear asked twice): the MCU's answer names the
//!   clear by its id alone (`Up::Answer`), ids are unique per operator
//!   only. The gateway's loop refuses, as not sent, a clear whose id
//!   already waits (`Pending::waits`; its own unit test), a rule of the
//!   loop this test does not play, so each clear here has an id of its
//!   own.
//!
//! Glossary:
//! - *taken*: a frame the line delivered whole, checked and decoded.
//! - *token*: one clear asked, followed to its outcome.

use cooling_core::config::Layout;
use cooling_core::facility::Offer;
use cooling_core::CoreConfig;
use cooling_ctrl::decide::CduMeasurements;
use cooling_ctrl::facility::{offer_msg, FacilityRole};
use cooling_ctrl::gateway::bms::{BmsBridge, Heard, LIMITS_EVERY_MS};
use cooling_ctrl::gateway::bridge::{Act, Bridge, Now, SILENT_AFTER_MS};
use cooling_ctrl::gateway::clears::{Pending, ANSWER_WITHIN_MS};
use cooling_ctrl::gateway::facility::HallPart;
use cooling_ctrl::gateway::TICK;
use cooling_ctrl::northbound::NorthboundWrite;
use cooling_ctrl::shell::STATE_EVERY;
use loopwarden_link::frame::{encode, OVERHEAD, VERSION};
use loopwarden_link::{Cost, Down, Hello, RackBits, ResetCause, Status, Up, MAX_MESSAGE};
use loopwarden_protocol::message::{
    CapLease, CduMode, CduState, Event, FacilityOffer, FacilityPlan, FacilityState, GpuSelector,
    Pump, RackCooling,
};
use loopwarden_protocol::{samples, GpuIndex, Ident, ReasonCode};
use proptest::prelude::*;

/// The gateway's wall clock at the test's start, Unix ms.
const T0: u64 = 1_700_000_000_000;
/// The loop's tick, ms.
const TICK_MS: u64 = TICK.as_millis() as u64;
/// The retained state goes out again at least this often, ms.
const STATE_EVERY_MS: u64 = STATE_EVERY.as_millis() as u64;
/// How far a status's time may read from the anchor before it moves, ms
/// (the bridge's `REANCHOR_AFTER_MS`).
const ANCHOR_SLACK_MS: u64 = 1_000;

// ---------------------------------------------------------------------
// The line: frames as the MCU writes them, and as the line harms them.

/// CRC-32 (ISO-HDLC), as the link computes it.
fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// COBS of `data` (no end byte).
fn cobs(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    let (mut code_at, mut code) = (0, 1u8);
    for &b in data {
        if b != 0 {
            out.push(b);
            code += 1;
        }
        if b == 0 || code == 0xFF {
            out[code_at] = code;
            code_at = out.len();
            out.push(0);
            code = 1;
        }
    }
    out[code_at] = code;
    out
}

/// A frame of link version `version`, number `seq`, with `payload`, built
/// here (the link builds only its own version).
fn raw_frame(version: u8, seq: u32, payload: &[u8]) -> Vec<u8> {
    let mut body = vec![version];
    body.extend_from_slice(&seq.to_le_bytes());
    body.extend_from_slice(payload);
    let crc = crc32(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    let mut out = cobs(&body);
    out.push(0);
    out
}

/// `up`'s postcard bytes.
fn message(up: &Up) -> Vec<u8> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let n = postcard::to_slice(up, &mut buf)
        .expect("an Up encodes")
        .len();
    buf.truncate(n);
    buf
}

/// `up` as frame `seq`, by the link's own encoder.
/// `up` framed as number `seq`, without the end byte a sender puts
/// before each frame: the line here is one whose noise the model says
/// (a frame that lost its end glues onto the next one, as it does from
/// a sender that does not lead with an end byte, which the gateway
/// reads all the same); the lead byte's own worth is the link crate's
/// test.
fn frame(up: &Up, seq: u32) -> Vec<u8> {
    let mut scratch = vec![0u8; MAX_MESSAGE + OVERHEAD];
    let mut out = vec![0u8; loopwarden_link::frame::max_frame(MAX_MESSAGE)];
    let n = encode(up, seq, &mut scratch, &mut out).expect("an Up encodes");
    out.truncate(n);
    assert_eq!(out.first(), Some(&0), "a frame leads with an end byte");
    out.remove(0);
    out
}

/// What the line does to one frame.
#[derive(Debug, Clone, Copy)]
enum Harm {
    /// Nothing.
    Clean,
    /// Delivered twice.
    Twice,
    /// One byte changed (`at`, modulo the frame before its end byte).
    Byte { at: u16, mask: u8 },
    /// Cut after `keep` bytes (modulo), its end byte kept.
    Cut { keep: u16 },
    /// Cut after `keep` bytes (modulo), its end byte lost: the next frame
    /// is read with it.
    TailLost { keep: u16 },
    /// Sent by a side of another link version.
    Version(u8),
    /// Its CRC checks but its message does not decode.
    Garbled,
}

/// One run of bytes on the line: a frame as delivered.
#[derive(Debug, Clone)]
struct Piece {
    bytes: Vec<u8>,
    kind: Kind,
    /// What the MCU meant by it.
    said: Said,
}

/// What a run of bytes is to the gateway, read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A frame it takes: checked, its message read.
    Whole,
    /// Checked, numbered, but its message does not read.
    Unread,
    /// No frame of this link.
    Harmed,
}

/// What the MCU meant by a frame.
#[derive(Debug, Clone)]
struct Said {
    seq: u32,
    up: Up,
    /// For an answer: the token of the clear it answers.
    answers: Option<usize>,
}

/// The pieces the line carries for the MCU's frame `said`, harmed by `harm`.
fn harmed(said: Said, harm: Harm) -> Vec<Piece> {
    let bytes = frame(&said.up, said.seq);
    let body = bytes.len() - 1;
    let piece = |bytes, kind| Piece {
        bytes,
        kind,
        said: said.clone(),
    };
    match harm {
        Harm::Clean => vec![piece(bytes, Kind::Whole)],
        Harm::Twice => vec![piece(bytes.clone(), Kind::Whole), piece(bytes, Kind::Whole)],
        Harm::Byte { at, mask } => {
            // Any other byte but the end byte: the frame stays one frame.
            let mut b = bytes;
            let at = usize::from(at) % body;
            let was = b[at];
            b[at] = match was.wrapping_add(mask.max(1)) {
                0 if was == 1 => 2,
                0 => 1,
                v => v,
            };
            vec![piece(b, Kind::Harmed)]
        }
        Harm::Cut { keep } => {
            let mut b = bytes[..1 + usize::from(keep) % (body - 1)].to_vec();
            b.push(0);
            vec![piece(b, Kind::Harmed)]
        }
        Harm::TailLost { keep } => {
            vec![piece(
                bytes[..1 + usize::from(keep) % (body - 1)].to_vec(),
                Kind::Harmed,
            )]
        }
        Harm::Version(v) => {
            let v = if v == VERSION { VERSION + 1 } else { v };
            vec![piece(
                raw_frame(v, said.seq, &message(&said.up)),
                Kind::Harmed,
            )]
        }
        Harm::Garbled => {
            // Variant 250 of an enum of seven, then the message's bytes (so
            // that two such frames differ as their messages do).
            let payload = [&[250, 1], &message(&said.up)[..]].concat();
            vec![piece(raw_frame(VERSION, said.seq, &payload), Kind::Unread)]
        }
    }
}

/// What the gateway's deframer holds, as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    /// Nothing: the next byte starts a frame.
    Empty,
    /// The first `got` bytes of piece `piece`.
    Clean { piece: usize, got: usize },
    /// Bytes that are no whole frame.
    Dirty,
}

/// What the end of a run gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Nothing,
    /// Piece `n`, whole as the MCU's side wrote it (its [`Kind`] says
    /// whether the gateway can take it).
    Piece(usize),
    /// Bytes that are no piece whole.
    Junk,
}

impl Run {
    /// Bytes `from..to` of piece `i` (of `pieces`) arrive.
    fn feed(&mut self, pieces: &[Piece], i: usize, from: usize, to: usize) -> Ended {
        let p = &pieces[i];
        let ends = to == p.bytes.len() && p.bytes.last() == Some(&0);
        let data_to = if ends { to - 1 } else { to };
        if data_to > from {
            *self = match *self {
                Run::Empty if from == 0 => Run::Clean {
                    piece: i,
                    got: data_to,
                },
                Run::Clean { piece, got } if piece == i && got == from => Run::Clean {
                    piece: i,
                    got: data_to,
                },
                _ => Run::Dirty,
            };
        }
        if !ends {
            return Ended::Nothing;
        }
        let ended = match *self {
            Run::Empty => Ended::Nothing,
            Run::Clean { piece, got } if got == data_to && piece == i => Ended::Piece(piece),
            _ => Ended::Junk,
        };
        *self = Run::Empty;
        ended
    }
}

#[test]
fn the_tests_own_frames_are_the_links() {
    let up = Up::Said {
        error: true,
        words: heapless::String::try_from("figures: refused").unwrap(),
    };
    assert_eq!(raw_frame(VERSION, 7, &message(&up)), frame(&up, 7));
}

// ---------------------------------------------------------------------
// The microcontroller, scripted.

/// What the MCU's last step found, as its statuses say it.
#[derive(Debug, Clone, Copy)]
struct Facts {
    mode: CduMode,
    reason: ReasonCode,
    /// Since when, MCU ms.
    since_ms: u64,
    setpoint_c: f32,
    racks: RackBits,
}

/// The MCU.
#[derive(Debug)]
struct Mcu {
    /// Its next frame's number.
    seq: u32,
    boot: u32,
    /// When it started, test ms.
    started: u64,
    /// How far its clock jumped ahead since, ms.
    jumped_ms: u64,
    step: u32,
    facts: Facts,
    /// Clears it received and has not answered: id and token.
    clears: Vec<(u32, usize)>,
}

impl Mcu {
    fn new(t: u64, boot: u32) -> Self {
        Self {
            seq: 0,
            boot,
            started: t,
            jumped_ms: 0,
            step: 0,
            facts: Facts {
                mode: CduMode::Boot,
                reason: ReasonCode::BOOTING,
                since_ms: 0,
                setpoint_c: 35.0,
                racks: RackBits::default(),
            },
            clears: Vec::new(),
        }
    }

    /// Its clock at test ms `t`.
    fn clock(&self, t: u64) -> u64 {
        t - self.started + self.jumped_ms
    }

    /// Its next frame, saying `up`.
    fn next(&mut self, up: Up, answers: Option<usize>) -> Said {
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        Said { seq, up, answers }
    }

    /// Its status at test ms `t`: a step with its facts.
    fn status(&mut self, t: u64) -> Up {
        self.step += 1;
        let f = self.facts;
        Up::Status(Status {
            step: self.step,
            at_ms: self.clock(t),
            mode: (f.mode, f.reason, f.since_ms),
            setpoint_c: f.setpoint_c,
            pump_speed: 0.6,
            pump_on: [true, false],
            lead: Pump::A,
            racks: f.racks,
            pumps_failed: [false; 2],
            beacon: f.racks.leaks_wet != 0,
            sensor_faults: [None; 4],
            readings: Some(CduMeasurements {
                supply_c: Some(30.5),
                flow_lpm: Some(420.0),
                ..Default::default()
            }),
            outdoor_c: Some(11.0),
            writes_ok: true,
            events_dropped: 0,
            cost: Cost::default(),
        })
    }

    /// Its hello after a start.
    fn hello(&self, reset: ResetCause, restored: bool) -> Up {
        Up::Hello(Hello {
            boot: self.boot,
            reset,
            firmware: heapless::String::try_from("0.1.0").expect("short"),
            restored,
        })
    }
}

const MODES: [CduMode; 4] = [
    CduMode::Boot,
    CduMode::Normal,
    CduMode::Degraded,
    CduMode::Failsafe,
];

/// A reason an MCU may give (never `controller-silent`, the gateway's).
fn reason(i: u8) -> ReasonCode {
    let named: Vec<ReasonCode> = ReasonCode::NAMED
        .iter()
        .map(|(r, _)| *r)
        .filter(|r| *r != ReasonCode::CONTROLLER_SILENT)
        .take(12)
        .collect();
    named[usize::from(i) % named.len()]
}

/// What the MCU says in one frame.
#[derive(Debug, Clone)]
enum Say {
    /// A status of new facts: the mode and reason (by index), racks'
    /// bits, the setpoint in tenths above 25 °C.
    Status {
        mode: u8,
        reason: u8,
        lost: u16,
        sensing: u16,
        wet: u16,
        setpoint_dc: u8,
    },
    /// A pump's trip.
    Event { pump_b: bool, lag: bool },
    /// A cap lease (or a lift) for host `host`.
    Lease {
        host: u8,
        lease: u32,
        watts: u16,
        gpus: u8,
        duration_s: u8,
        lift: bool,
    },
    /// Its answer to a clear it received (the `which`th, modulo): done,
    /// or refused; to none asked when it received none.
    Answer { which: u8, done: bool },
    /// An answer to a clear id nobody asked.
    Stray(u32),
    /// A line for the log.
    Said(bool),
    /// Its offer to the hall's coordinator (water in tenths above 28 °C).
    Offer(Option<u8>),
}

/// A lease as the MCU asks it.
fn lease(id: u32, watts: u16, gpus: u8, duration_s: u8) -> CapLease {
    let caps: Vec<(GpuSelector, u32)> = (0..gpus % 4)
        .map(|g| match GpuIndex::new(g) {
            Some(i) if g > 0 => (GpuSelector::Gpu(i), u32::from(watts) + u32::from(g)),
            _ => (GpuSelector::All, u32::from(watts)),
        })
        .collect();
    samples::cooling_lease(id, &caps, u32::from(duration_s) * 1000)
}

/// A hall offer accepting `accept_c`.
fn offer(accept_c: f32) -> FacilityOffer {
    offer_msg(&Offer::uncapped(accept_c, 110_000.0, 128.0, 200.0))
}

/// The racks `layout` lists, bit n = rack n.
fn rack_mask(layout: &Layout) -> u16 {
    ((1u32 << layout.racks.min(16)) - 1) as u16
}

impl Mcu {
    /// The frame of `say` at test ms `t`, on a loop laid out as `layout`.
    fn say(&mut self, say: &Say, t: u64, layout: &Layout) -> Said {
        let words = |w: &str| heapless::String::try_from(w).expect("short");
        match *say {
            Say::Status {
                mode,
                reason: r,
                lost,
                sensing,
                wet,
                setpoint_dc,
            } => {
                let (mode, reason) = (MODES[usize::from(mode) % 4], reason(r));
                let now_ms = self.clock(t);
                let f = &mut self.facts;
                if (mode, reason) != (f.mode, f.reason) {
                    f.since_ms = now_ms;
                }
                let all = rack_mask(layout);
                f.mode = mode;
                f.reason = reason;
                f.setpoint_c = 25.0 + f32::from(setpoint_dc) / 10.0;
                f.racks = RackBits {
                    valves_open: all & !lost,
                    cooling_lost: lost & all,
                    sensing_lost: sensing & all,
                    leaks_wet: wet & all,
                    leaks_latched: wet & all,
                    isolation_failed: 0,
                };
                let up = self.status(t);
                self.next(up, None)
            }
            Say::Event { pump_b, lag } => {
                let pump = if pump_b { Pump::B } else { Pump::A };
                let up = Up::Event(Event::PumpTrip {
                    pump,
                    lag_started: lag,
                });
                self.next(up, None)
            }
            Say::Lease {
                host,
                lease: id,
                watts,
                gpus,
                duration_s,
                lift,
            } => {
                let up = Up::Lease {
                    host: u16::from(host),
                    lease: lease(id, watts, gpus, duration_s),
                    lift,
                };
                self.next(up, None)
            }
            Say::Answer { which, done } if !self.clears.is_empty() => {
                let (id, token) = self.clears.remove(usize::from(which) % self.clears.len());
                let outcome = if done { Ok(()) } else { Err(words("refused")) };
                self.next(Up::Answer { id, outcome }, Some(token))
            }
            Say::Answer { .. } => self.say(&Say::Stray(7), t, layout),
            Say::Stray(id) => self.next(
                Up::Answer {
                    id,
                    outcome: Err(words("no such clear")),
                },
                None,
            ),
            Say::Said(error) => {
                let up = Up::Said {
                    error,
                    words: words("figures: refused"),
                };
                self.next(up, None)
            }
            Say::Offer(o) => {
                let up = Up::Offer(o.map(|w| offer(28.0 + f32::from(w) / 10.0)));
                self.next(up, None)
            }
        }
    }
}

// ---------------------------------------------------------------------
// The gateway, and what the sequence says of it.

/// The CDU's part in a hall of several CDUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hall {
    /// None: a hall of one CDU.
    Alone,
    /// `cdu-2`, which follows `cdu-1`'s plan.
    Member,
    /// `cdu-1`, which plans the hall.
    Coordinator,
}

fn id(s: &str) -> Ident {
    Ident::new(s).expect("an ident")
}

/// What became of a clear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    NotSent,
    Done,
    Refused,
    NoAnswer,
    /// The gateway stopped while it waited (the operator's `ctl` loses
    /// its connection).
    Gone,
}

/// One clear asked.
#[derive(Debug)]
struct Token {
    id: u32,
    /// When it went down the line, test ms.
    sent: Option<u64>,
    outcome: Option<Outcome>,
}

/// One life of the gateway: its core and the parts its loop composes
/// with it, as `cooling_ctrl::gateway` composes them.
struct Gateway {
    /// When it started, test ms.
    started: u64,
    /// Its wall clock then, Unix ms (it reads no earlier one).
    started_unix: u64,
    bridge: Bridge,
    bms: BmsBridge,
    pending: Pending<usize>,
    /// Its next tick, test ms.
    next_tick: u64,
}

impl Gateway {
    fn new(core: &CoreConfig, hall: Hall, t: u64, unix_ms: u64) -> Self {
        let now = Now {
            mono_ms: 0,
            unix_ms,
        };
        let bridge = Bridge::new(core.layout, core.margins.failsafe_setpoint_c, now);
        let role = || FacilityRole {
            coordinator: id("cdu-1"),
            cdus: vec![id("cdu-1"), id("cdu-2")],
        };
        let bridge = match hall {
            Hall::Alone => bridge,
            Hall::Member => bridge.in_hall(HallPart::new(role(), &id("cdu-2"), core)),
            Hall::Coordinator => bridge.in_hall(HallPart::new(role(), &id("cdu-1"), core)),
        };
        Self {
            started: t,
            started_unix: unix_ms,
            bridge,
            bms: BmsBridge::new(core),
            pending: Pending::default(),
            next_tick: t,
        }
    }
}

/// What the sequence says of one life of the gateway.
#[derive(Debug)]
struct Expect {
    run: Run,
    /// The last frame checked (taken, or its message unread): its number
    /// and bytes.
    last_in: Option<(u32, Vec<u8>)>,
    /// A frame whose message did not read was numbered at or below the
    /// last: the MCU started again, taken at the next frame taken.
    restart_unread: bool,
    /// The last status taken, and when (test ms).
    last_status: Option<(Status, u64)>,
    /// The MCU's offer since it last started.
    offer: Option<FacilityOffer>,
    /// The last state published, and when (test ms).
    published: Option<(u64, CduState)>,
    /// When the BMS's limits last went down (`None`: it wrote none).
    limits_down: Option<u64>,
    /// Outdoor temperatures the BMS wrote, and sent down.
    outdoor: (u64, u64),
    /// The coordinator's waters heard on the bus, °C.
    waters: Vec<f32>,
}

impl Expect {
    fn new() -> Self {
        Self {
            run: Run::Empty,
            last_in: None,
            restart_unread: false,
            last_status: None,
            offer: None,
            published: None,
            limits_down: None,
            outdoor: (0, 0),
            waters: Vec::new(),
        }
    }
}

/// What a frame taken said, for the checks of what the bridge made of
/// it.
struct Taken<'a> {
    status: Option<&'a Status>,
    /// For an answer: the token of the clear it answers.
    answers: Option<usize>,
}

/// The bus's limits, as the BMS writes them.
#[derive(Debug, Clone, Copy)]
enum BmsWrite {
    Ceiling(u8),
    Offset(u8),
    Outdoor(i8),
    Ack,
}

/// One thing that happens.
#[derive(Debug, Clone)]
enum Op {
    /// After `gap_ms`, the MCU sends `say`, harmed by `harm`, delivered
    /// whole or in two reads (`split`: where, modulo, and ms between).
    Frame {
        gap_ms: u16,
        say: Say,
        harm: Harm,
        split: Option<(u16, u16)>,
    },
    /// The MCU steps `n` times a second apart, its facts unchanged.
    Steps(u8),
    /// The MCU starts again: its hello, harmed by `harm`.
    McuStarts {
        reset: ResetCause,
        restored: bool,
        harm: Harm,
    },
    /// Frames the MCU sent that never reached the line: its numbers skip.
    Skip(u8),
    /// The MCU's clock jumps ahead, ms.
    McuClock(u32),
    /// Time passes, the MCU says nothing, ms.
    Quiet(u32),
    /// The gateway's wall clock steps, s.
    Wall(i32),
    /// An operator asks a clear, its id above every one before (see
    /// the module note); it reaches the MCU or is lost on the line.
    Clear { reaches: bool },
    /// The BMS writes.
    Bms(BmsWrite),
    /// A hall's state heard on the bus: the coordinator's plan (water in
    /// tenths above 20 °C), or, to a coordinator, the other CDU's offer.
    Plan(u16),
    /// The broker connects or goes.
    Bus(bool),
    /// The line to the MCU opens or closes.
    Line(bool),
    /// The gateway stops and starts again after `ms`.
    GatewayStarts(u16),
}

/// The test's world.
struct World {
    /// Now, test ms.
    t: u64,
    /// The wall clock's steps, ms.
    wall_ms: i64,
    core: CoreConfig,
    hall: Hall,
    mcu: Mcu,
    gw: Gateway,
    x: Expect,
    /// Every run of bytes the line carried.
    pieces: Vec<Piece>,
    bus: bool,
    /// When the broker last connected, test ms.
    bus_since: u64,
    line: bool,
    /// The state the broker keeps.
    retained: Option<CduState>,
    tokens: Vec<Token>,
}

type Check = Result<(), TestCaseError>;

impl World {
    fn new(hall: Hall) -> Self {
        let mut core = CoreConfig::default();
        if hall != Hall::Alone {
            core.facility.cdus = 2;
        }
        let gw = Gateway::new(&core, hall, 0, T0);
        Self {
            t: 0,
            wall_ms: 0,
            hall,
            mcu: Mcu::new(0, 1),
            gw,
            x: Expect::new(),
            core,
            pieces: Vec::new(),
            bus: true,
            bus_since: 0,
            line: true,
            retained: None,
            tokens: Vec::new(),
        }
    }

    /// The wall clock, Unix ms.
    fn wall(&self) -> u64 {
        (T0 as i64 + self.t as i64 + self.wall_ms).max(0) as u64
    }

    /// Now, as the gateway's loop reads it (its wall clock never before
    /// its start).
    fn now(&self) -> Now {
        Now {
            mono_ms: self.t - self.gw.started,
            unix_ms: self.wall().max(self.gw.started_unix),
        }
    }

    /// Time passes `ms`, with the loop's ticks.
    fn advance(&mut self, ms: u64) -> Check {
        let end = self.t + ms;
        while self.gw.next_tick <= end {
            self.t = self.gw.next_tick;
            self.gw.next_tick += TICK_MS;
            self.tick()?;
        }
        self.t = end;
        Ok(())
    }

    fn play(&mut self, op: &Op) -> Check {
        match *op {
            Op::Frame {
                gap_ms,
                ref say,
                harm,
                split,
            } => {
                self.advance(u64::from(gap_ms))?;
                let said = self.mcu.say(say, self.t, &self.core.layout);
                self.send(said, harm, split)
            }
            Op::Steps(n) => {
                for _ in 0..n {
                    self.advance(1_000)?;
                    let up = self.mcu.status(self.t);
                    let said = self.mcu.next(up, None);
                    self.send(said, Harm::Clean, None)?;
                }
                Ok(())
            }
            Op::McuStarts {
                reset,
                restored,
                harm,
            } => {
                self.mcu = Mcu::new(self.t, self.mcu.boot + 1);
                let up = self.mcu.hello(reset, restored);
                let said = self.mcu.next(up, None);
                self.send(said, harm, None)
            }
            Op::Skip(n) => {
                self.mcu.seq = self.mcu.seq.wrapping_add(u32::from(n));
                Ok(())
            }
            Op::McuClock(ms) => {
                self.mcu.jumped_ms += u64::from(ms);
                Ok(())
            }
            Op::Quiet(ms) => self.advance(u64::from(ms)),
            Op::Wall(s) => {
                self.wall_ms += i64::from(s) * 1_000;
                Ok(())
            }
            Op::Clear { reaches } => self.clear(1_000 + self.tokens.len() as u32, reaches),
            Op::Bms(w) => self.bms_write(w),
            Op::Plan(w) => self.plan(20.0 + f32::from(w % 150) / 10.0),
            Op::Bus(on) => {
                if on && !self.bus {
                    self.bus_since = self.t;
                }
                self.bus = on;
                Ok(())
            }
            Op::Line(open) => {
                self.line = open;
                Ok(())
            }
            Op::GatewayStarts(ms) => self.gateway_starts(u64::from(ms)),
        }
    }

    /// The gateway stops, and starts again `ms` later: what waited for
    /// the MCU's answer is lost with it; the MCU steps on unheard.
    fn gateway_starts(&mut self, ms: u64) -> Check {
        for token in &mut self.tokens {
            if token.outcome.is_none() {
                token.outcome = Some(Outcome::Gone);
            }
        }
        self.t += ms;
        let steps = (ms / 1_000) as u32;
        self.mcu.seq = self.mcu.seq.wrapping_add(steps);
        self.mcu.step += steps;
        let unix = self.wall();
        self.gw = Gateway::new(&self.core, self.hall, self.t, unix);
        self.x = Expect::new();
        Ok(())
    }

    /// The line carries frame `said`, harmed by `harm`: the gateway reads
    /// it whole or in two (`split`), unless the line is closed.
    fn send(&mut self, said: Said, harm: Harm, split: Option<(u16, u16)>) -> Check {
        if !self.line {
            return Ok(());
        }
        for p in harmed(said, harm) {
            let (i, len) = (self.pieces.len(), p.bytes.len());
            self.pieces.push(p);
            match split {
                Some((at, ms)) if len > 2 => {
                    let k = 1 + usize::from(at) % (len - 1);
                    self.hear(i, 0, k)?;
                    self.advance(u64::from(ms))?;
                    self.hear(i, k, len)?;
                }
                _ => self.hear(i, 0, len)?,
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------
// The gateway's loop, as `cooling_ctrl::gateway` runs its core, and the
// checks of what comes out.

impl World {
    /// The loop's tick.
    fn tick(&mut self) -> Check {
        let now = self.now();
        let acts = self.gw.bridge.tick(now);
        let handed = self.perform(acts, None, now)?;
        prop_assert!(handed.is_empty(), "a tick hands on {handed:?}");
        for (id, token) in self.gw.pending.expired(now.mono_ms) {
            let sent = self.tokens[token].sent.expect("it was sent");
            let waited = self.t - sent;
            prop_assert!(
                (ANSWER_WITHIN_MS..ANSWER_WITHIN_MS + TICK_MS).contains(&waited),
                "clear {id} given up after {waited} ms"
            );
            self.outcome(token, Outcome::NoAnswer)?;
        }
        if let Some(down) = self.gw.bms.due(now.mono_ms, false) {
            self.bms_down(&down)?;
        }
        self.check_quiet()?;
        self.check_bms(now)
    }

    /// Bytes `from..to` of piece `i` reach the gateway.
    fn hear(&mut self, i: usize, from: usize, to: usize) -> Check {
        let ended = self.x.run.feed(&self.pieces, i, from, to);
        let now = self.now();
        let before = self.gw.bridge.counts();
        let bytes = self.pieces[i].bytes[from..to].to_vec();
        let acts = self.gw.bridge.hear(&bytes, now);
        let after = self.gw.bridge.counts();
        let started_acts = acts.iter().filter(|a| matches!(a, Act::Started)).count();
        let (mut renumbered, mut hello) = (false, false);
        match ended {
            Ended::Nothing => prop_assert!(acts.is_empty(), "no frame ended: {acts:?}"),
            Ended::Piece(p) if self.pieces[p].kind == Kind::Whole => {
                (renumbered, hello) = self.taken(p, acts, now)?
            }
            Ended::Piece(_) | Ended::Junk => {
                // A frame that passes its CRC and does not read is
                // numbered: frames lost before it are said too.
                let gap = usize::from(after.gaps > before.gaps);
                prop_assert!(
                    acts.len() == 1 + gap && acts.iter().all(|a| matches!(a, Act::Say(..))),
                    "a harmed frame gives a log line, nothing else: {acts:?}"
                );
                prop_assert!(
                    gap == 0
                        || matches!(ended, Ended::Piece(p) if self.pieces[p].kind == Kind::Unread),
                    "only a frame that passes its CRC is numbered: {acts:?}"
                );
                prop_assert_eq!(after.dropped.total(), before.dropped.total() + 1);
                prop_assert_eq!(after.frames_in, before.frames_in);
                match ended {
                    Ended::Piece(p) if self.pieces[p].kind == Kind::Unread => self.unread(p),
                    _ => {}
                }
            }
        }
        let restarted = after.restarts > before.restarts;
        prop_assert_eq!(restarted, renumbered, "an MCU restart by its numbers");
        // A hello or numbers starting again: the MCU started, once.
        let started = renumbered || hello;
        prop_assert_eq!(started_acts, usize::from(started), "started once");
        // The gateway's loop: a started MCU has forgotten the limits.
        if started {
            if let Some(down) = self.gw.bms.due(now.mono_ms, true) {
                self.bms_down(&down)?;
            }
        }
        if let Some(down) = self.gw.bms.due(now.mono_ms, false) {
            self.bms_down(&down)?;
        }
        if started && self.x.limits_down.is_some() {
            prop_assert_eq!(self.x.limits_down, Some(self.t), "limits again at a start");
        }
        self.check_bms(now)
    }

    /// Piece `p` was taken whole, its acts `acts`: checks them against
    /// what the MCU said. Whether its numbers say the MCU started again,
    /// and whether it was a hello.
    fn taken(&mut self, p: usize, acts: Vec<Act>, now: Now) -> Result<(bool, bool), TestCaseError> {
        let said = self.pieces[p].said.clone();
        let bytes = self.pieces[p].bytes.clone();
        if self.x.last_in.as_ref() == Some(&(said.seq, bytes.clone())) {
            prop_assert!(
                acts.iter().all(|a| matches!(a, Act::Say(..))),
                "a frame the line repeated is taken again: {acts:?}"
            );
            return Ok((false, false));
        }
        let renumbered = std::mem::take(&mut self.x.restart_unread)
            || self
                .x
                .last_in
                .as_ref()
                .is_some_and(|(seq, _)| said.seq <= *seq);
        if renumbered || matches!(said.up, Up::Hello(_)) {
            self.x.offer = None;
        }
        self.x.last_in = Some((said.seq, bytes));
        let mut want = Vec::new();
        let mut status = None;
        match &said.up {
            Up::Status(s) => {
                self.x.last_status = Some((s.clone(), self.t));
                status = Some(s);
            }
            Up::Lease { host, lease, lift } => want.push(Act::Lease {
                host: usize::from(*host),
                lease: lease.clone(),
                lift: *lift,
            }),
            Up::Event(e) => want.push(Act::Event(e.clone())),
            Up::Answer { id, outcome } => want.push(Act::Answer {
                id: *id,
                outcome: outcome.clone().map_err(|w| w.as_str().to_string()),
            }),
            Up::Offer(o) => self.x.offer = o.clone(),
            Up::Hello(_) | Up::Said { .. } => {}
        }
        let published_before = self.x.published.as_ref().map(|(at, _)| *at);
        let taken = Taken {
            status,
            answers: said.answers,
        };
        let handed = self.perform(acts, Some(&taken), now)?;
        prop_assert_eq!(&handed, &want, "handed on once, as the MCU said it");
        if let Some(s) = status {
            prop_assert!(!self.gw.bridge.silent(), "a status ends the silence");
            if self.bus {
                self.check_retained(s)?;
                if published_before.is_some_and(|at| self.t - at >= STATE_EVERY_MS) {
                    let at = self.x.published.as_ref().map(|(at, _)| *at);
                    prop_assert_eq!(at, Some(self.t), "a state every 60 s");
                }
            }
        }
        Ok((renumbered, matches!(said.up, Up::Hello(_))))
    }

    /// Piece `p` was checked, and its message did not read: its number
    /// counts.
    fn unread(&mut self, p: usize) {
        let seq = self.pieces[p].said.seq;
        let x = &mut self.x;
        x.restart_unread |= x.last_in.as_ref().is_some_and(|(last, _)| seq <= *last);
        x.last_in = Some((seq, self.pieces[p].bytes.clone()));
    }

    /// With the broker connected, after status `s`: the state it keeps
    /// says what `s` says, by `run`'s rule (the setpoint within 0.5 K).
    fn check_retained(&self, s: &Status) -> Check {
        let r = self.retained.as_ref();
        let r = r.ok_or_else(|| TestCaseError::fail("no state on the bus after a status"))?;
        prop_assert_eq!((r.mode, r.reason), (s.mode.0, s.mode.1), "{:?}", r);
        prop_assert!((r.setpoint.value() - f64::from(s.setpoint_c)).abs() < 0.5);
        prop_assert_eq!(
            lost_bits(r),
            s.racks.cooling_lost & rack_mask(&self.core.layout)
        );
        Ok(())
    }

    /// Performs `acts` as the gateway's loop does, checking each; `taken`:
    /// the frame they came of (none: a tick, or the bus). Returns what
    /// the MCU said that was handed on (leases, events, answers).
    fn perform(
        &mut self,
        acts: Vec<Act>,
        taken: Option<&Taken<'_>>,
        now: Now,
    ) -> Result<Vec<Act>, TestCaseError> {
        let mut handed = Vec::new();
        let mut telemetry = 0;
        for act in acts {
            match act {
                Act::Telemetry(_) => telemetry += 1,
                Act::State(st, key) => {
                    self.check_state(&st, taken, now)?;
                    if self.bus {
                        let facility = st.facility.clone();
                        self.gw.bridge.state_published(key, facility, now.mono_ms);
                        self.retained = Some((*st).clone());
                        self.x.published = Some((self.t, *st));
                    }
                }
                Act::FacilityTarget(water_c) => self.check_water(water_c)?,
                Act::Say(..) | Act::Started => {}
                Act::Answer { id, outcome } => {
                    self.answered(id, &outcome, taken)?;
                    handed.push(Act::Answer { id, outcome });
                }
                a @ (Act::Lease { .. } | Act::Event(_)) => handed.push(a),
            }
        }
        let statuses = usize::from(taken.is_some_and(|t| t.status.is_some()));
        prop_assert_eq!(telemetry, statuses, "telemetry once a status");
        Ok(handed)
    }

    /// A state the bridge gives at `now`.
    fn check_state(&self, st: &CduState, taken: Option<&Taken<'_>>, now: Now) -> Check {
        let silent = st.reason == ReasonCode::CONTROLLER_SILENT;
        match taken.and_then(|t| t.status) {
            Some(s) => prop_assert_eq!((st.mode, st.reason), (s.mode.0, s.mode.1)),
            None => prop_assert!(
                silent && st.mode == CduMode::Failsafe && taken.is_none(),
                "only a status, or silence at a tick, makes a state: {st:?}"
            ),
        }
        // 1. The racks as the last status taken says them, or none.
        match &self.x.last_status {
            None => prop_assert!(st.racks.is_empty(), "racks from no status: {st:?}"),
            Some((s, _)) => {
                let layout = &self.core.layout;
                prop_assert_eq!(st.racks.len(), usize::from(layout.racks.min(16)));
                prop_assert_eq!(lost_bits(st), s.racks.cooling_lost & rack_mask(layout));
            }
        }
        // 5. A mode never begins after the state that says it.
        prop_assert!(
            st.since.0 <= now.unix_ms + ANCHOR_SLACK_MS,
            "since {} ms after the wall clock: {st:?}",
            st.since.0 - now.unix_ms
        );
        if self.hall == Hall::Alone {
            prop_assert!(st.facility.is_none());
        } else {
            let f = st.facility.as_ref();
            let offer = f.and_then(|f| f.offer.clone());
            let want = if silent { None } else { self.x.offer.clone() };
            prop_assert_eq!(offer, want, "the MCU's offer since its start");
        }
        Ok(())
    }

    /// The MCU answered clear `id`: to whoever waits for it (the
    /// gateway's loop).
    fn answered(
        &mut self,
        id: u32,
        outcome: &Result<(), String>,
        taken: Option<&Taken<'_>>,
    ) -> Check {
        let Some(token) = self.gw.pending.answered(id) else {
            return Ok(());
        };
        let meant = taken.and_then(|t| t.answers);
        prop_assert_eq!(
            Some(token),
            meant,
            "the answer to clear {} went to another clear of that id",
            id
        );
        prop_assert_eq!(self.tokens[token].id, id);
        let o = if outcome.is_ok() {
            Outcome::Done
        } else {
            Outcome::Refused
        };
        self.outcome(token, o)
    }

    fn outcome(&mut self, token: usize, o: Outcome) -> Check {
        let t = &mut self.tokens[token];
        prop_assert!(
            t.outcome.is_none(),
            "clear {} {:?}, then {:?}",
            t.id,
            t.outcome,
            o
        );
        t.outcome = Some(o);
        Ok(())
    }

    /// The hall's water going down to the MCU.
    fn check_water(&self, water_c: f32) -> Check {
        match self.hall {
            Hall::Alone => prop_assert!(false, "water {water_c} °C outside a hall"),
            Hall::Member => prop_assert!(
                self.x.waters.iter().any(|w| (w - water_c).abs() < 0.01),
                "water {water_c} °C is no plan heard: {:?}",
                self.x.waters
            ),
            Hall::Coordinator => prop_assert!((5.0..=60.0).contains(&water_c)),
        }
        Ok(())
    }

    /// An operator asks clear `id`: down the line if it is open, awaited.
    fn clear(&mut self, id: u32, reaches: bool) -> Check {
        let token = self.tokens.len();
        self.tokens.push(Token {
            id,
            sent: None,
            outcome: None,
        });
        if !self.line {
            return self.outcome(token, Outcome::NotSent);
        }
        let framed = self.gw.bridge.frame(&Down::Clear(signed_clear(id)));
        prop_assert!(framed.is_ok(), "{framed:?}");
        self.gw.bridge.wrote(true);
        self.gw.pending.wait(id, self.now().mono_ms, token);
        self.tokens[token].sent = Some(self.t);
        if reaches {
            self.mcu.clears.push((id, token));
        }
        Ok(())
    }

    fn bms_write(&mut self, w: BmsWrite) -> Check {
        let w = match w {
            BmsWrite::Ceiling(c) => NorthboundWrite::SetpointCeiling {
                celsius: 30.0 + f32::from(c % 100) / 10.0,
            },
            BmsWrite::Offset(k) => NorthboundWrite::PlanCeilingOffset {
                kelvin: -f32::from(k % 50) / 10.0,
            },
            BmsWrite::Outdoor(c) => {
                self.x.outdoor.0 += 1;
                NorthboundWrite::OutdoorTemp {
                    celsius: f32::from(c) / 4.0,
                }
            }
            BmsWrite::Ack => NorthboundWrite::AlarmAck,
        };
        if let Some(down) = self.gw.bms.write(w, self.now().mono_ms) {
            self.bms_down(&down)?;
        }
        Ok(())
    }

    fn bms_down(&mut self, down: &Down) -> Check {
        match down {
            Down::Limits { .. } => self.x.limits_down = Some(self.t),
            Down::Outdoor(_) => self.x.outdoor.1 += 1,
            other => prop_assert!(false, "the BMS sends {other:?}"),
        }
        let framed = self.gw.bridge.frame(down);
        prop_assert!(framed.is_ok(), "{framed:?}");
        Ok(())
    }

    /// A hall's state heard on the bus: the coordinator's plan of `water_c`
    /// (to a coordinator: the other CDU's offer).
    fn plan(&mut self, water_c: f32) -> Check {
        let (from, st) = match self.hall {
            Hall::Coordinator => (id("cdu-2"), hall_state(Some(offer(water_c + 8.0)), None)),
            _ => (id("cdu-1"), hall_state(None, Some(water_c))),
        };
        if self.hall == Hall::Member {
            self.x.waters.push(water_c);
        }
        let now = self.now();
        let acts = self.gw.bridge.hall_state(&from, &st, now, 0);
        prop_assert!(
            acts.iter().all(|a| matches!(a, Act::FacilityTarget(_))),
            "{acts:?}"
        );
        self.perform(acts, None, now).map(drop)
    }

    /// At a tick: the silence (2) and the states' pace (5), the BMS's.
    fn check_quiet(&self) -> Check {
        let last = self.x.last_status.as_ref().map(|(_, at)| *at);
        let quiet = self.t - last.unwrap_or(self.gw.started);
        let silent = quiet >= SILENT_AFTER_MS;
        prop_assert_eq!(self.gw.bridge.silent(), silent, "quiet for {} ms", quiet);
        if silent && self.bus {
            let r = self.retained.as_ref();
            prop_assert!(
                r.is_some_and(
                    |s| s.mode == CduMode::Failsafe && s.reason == ReasonCode::CONTROLLER_SILENT
                ),
                "quiet for {quiet} ms, the bus keeps {r:?}"
            );
        }
        if self.bus {
            let from = self
                .x
                .published
                .as_ref()
                .map_or(self.gw.started, |(at, _)| *at);
            let from = from.max(self.bus_since);
            let every = STATE_EVERY_MS + SILENT_AFTER_MS + TICK_MS;
            prop_assert!(self.t - from <= every, "no state for {} ms", self.t - from);
        }
        if let Some(at) = self.x.limits_down {
            prop_assert!(
                self.t - at < LIMITS_EVERY_MS + TICK_MS,
                "limits not renewed"
            );
        }
        prop_assert_eq!(self.x.outdoor.0, self.x.outdoor.1, "outdoor once per write");
        Ok(())
    }

    /// What the BMS reads at `now`: the status's mode and racks, or the
    /// silence.
    fn check_bms(&mut self, now: Now) -> Check {
        let g = &mut self.gw;
        let silent = g.bridge.silent();
        let heard = match (silent, g.bridge.last_status()) {
            (true, last) => Heard::Silent {
                last,
                quiet_ms: g.bridge.quiet_ms(now),
            },
            (false, Some(s)) => Heard::Speaking(s),
            (false, None) => Heard::Nothing,
        };
        let snap = g.bms.snapshot(heard, now.mono_ms);
        let last = self.x.last_status.as_ref().map(|(s, _)| s);
        if silent {
            prop_assert_eq!(
                (snap.mode, snap.reason),
                (CduMode::Failsafe, ReasonCode::CONTROLLER_SILENT)
            );
            prop_assert_eq!(snap.cooling_lost, last.map_or(0, |s| s.racks.cooling_lost));
        } else if let Some(s) = last {
            let said = (s.mode.0, s.mode.1, s.racks.cooling_lost);
            prop_assert_eq!((snap.mode, snap.reason, snap.cooling_lost), said);
        }
        Ok(())
    }

    /// The end: every clear waited for is given up, so each has its
    /// outcome.
    fn finish(&mut self) -> Check {
        self.advance(ANSWER_WITHIN_MS + 2 * TICK_MS)?;
        for t in &self.tokens {
            prop_assert!(t.outcome.is_some(), "clear {} has no outcome", t.id);
        }
        Ok(())
    }
}

/// The racks a state lists as cooling lost, bit n = rack n.
fn lost_bits(st: &CduState) -> u16 {
    st.racks
        .iter()
        .filter(|r| r.cooling == RackCooling::Lost)
        .fold(0, |bits, r| bits | 1 << r.rack.get())
}

/// A clear as an operator signs it (the gateway checks no signature).
fn signed_clear(id: u32) -> loopwarden_link::SignedClear {
    loopwarden_link::SignedClear {
        clear: loopwarden_link::Clear {
            id,
            cdu: self::id("cdu-1"),
            operator: self::id("jdoe"),
            at: loopwarden_protocol::TimestampMs(T0),
            action: loopwarden_link::ClearAction::Leak(1),
        },
        key_id: 1,
        signature: [[0; 32]; 2],
    }
}

/// Another CDU's retained state, with its part in the hall.
fn hall_state(offer: Option<FacilityOffer>, water_c: Option<f32>) -> CduState {
    let loopwarden_protocol::Message::CduState(mut st) =
        samples::message(loopwarden_protocol::MessageKind::CduState)
    else {
        unreachable!("a sample state")
    };
    st.facility = Some(FacilityState {
        offer,
        plan: water_c.map(|w| FacilityPlan {
            water: cooling_ctrl::decide::facility::celsius(w),
            chiller_stages: 1,
            offers: 2,
            capping: 0,
        }),
    });
    st
}

// ---------------------------------------------------------------------
// The sequences.

fn bits() -> impl Strategy<Value = u16> {
    prop_oneof![3 => Just(0u16), 1 => 1u16..16, 1 => any::<u16>()]
}

fn harm() -> impl Strategy<Value = Harm> {
    prop_oneof![
        14 => Just(Harm::Clean),
        1 => Just(Harm::Twice),
        1 => (any::<u16>(), any::<u8>()).prop_map(|(at, mask)| Harm::Byte { at, mask }),
        1 => any::<u16>().prop_map(|keep| Harm::Cut { keep }),
        1 => any::<u16>().prop_map(|keep| Harm::TailLost { keep }),
        1 => any::<u8>().prop_map(Harm::Version),
        1 => Just(Harm::Garbled),
    ]
}

fn say() -> impl Strategy<Value = Say> {
    let status = (any::<u8>(), 0u8..4, bits(), bits(), bits(), any::<u8>()).prop_map(
        |(mode, reason, lost, sensing, wet, setpoint_dc)| Say::Status {
            mode,
            reason,
            lost,
            sensing,
            wet,
            setpoint_dc,
        },
    );
    let lease = (
        0u8..20,
        0u32..4,
        300u16..700,
        any::<u8>(),
        1u8..60,
        any::<bool>(),
    )
        .prop_map(|(host, lease, watts, gpus, duration_s, lift)| Say::Lease {
            host,
            lease,
            watts,
            gpus,
            duration_s,
            lift,
        });
    prop_oneof![
        6 => status,
        1 => (any::<bool>(), any::<bool>()).prop_map(|(pump_b, lag)| Say::Event { pump_b, lag }),
        2 => lease,
        4 => (any::<u8>(), any::<bool>()).prop_map(|(which, done)| Say::Answer { which, done }),
        1 => (5_000u32..5_004).prop_map(Say::Stray),
        1 => any::<bool>().prop_map(Say::Said),
        1 => prop::option::of(any::<u8>()).prop_map(Say::Offer),
    ]
}

fn reset() -> impl Strategy<Value = ResetCause> {
    prop_oneof![
        Just(ResetCause::PowerOn),
        Just(ResetCause::Watchdog),
        Just(ResetCause::Fault)
    ]
}

fn bms() -> impl Strategy<Value = BmsWrite> {
    prop_oneof![
        any::<u8>().prop_map(BmsWrite::Ceiling),
        any::<u8>().prop_map(BmsWrite::Offset),
        any::<i8>().prop_map(BmsWrite::Outdoor),
        Just(BmsWrite::Ack),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let gap_ms = prop_oneof![3 => 0u16..1_200, 1 => 1_200u16..5_000];
    let split = prop::option::weighted(0.2, (any::<u16>(), 0u16..1_500));
    let frame = (gap_ms, say(), harm(), split).prop_map(|(gap_ms, say, harm, split)| Op::Frame {
        gap_ms,
        say,
        harm,
        split,
    });
    let quiet = prop_oneof![
        3 => 100u32..2_900,
        2 => 2_900u32..3_500,
        2 => 3_500u32..15_000,
        1 => 15_000u32..70_000,
    ];
    prop_oneof![
        14 => frame,
        3 => (1u8..70).prop_map(Op::Steps),
        2 => (reset(), any::<bool>(), harm()).prop_map(|(reset, restored, harm)| Op::McuStarts {
            reset,
            restored,
            harm
        }),
        1 => (1u8..5).prop_map(Op::Skip),
        // Forward only: see the module note.
        1 => prop_oneof![0u32..5_000, 0u32..100_000].prop_map(Op::McuClock),
        3 => quiet.prop_map(Op::Quiet),
        1 => (-7_200i32..7_200).prop_map(Op::Wall),
        3 => prop::bool::weighted(0.8).prop_map(|reaches| Op::Clear { reaches }),
        2 => bms().prop_map(Op::Bms),
        1 => any::<u16>().prop_map(Op::Plan),
        1 => prop::bool::weighted(0.7).prop_map(Op::Bus),
        1 => prop::bool::weighted(0.7).prop_map(Op::Line),
        1 => (0u16..5_000).prop_map(Op::GatewayStarts),
    ]
}

fn hall() -> impl Strategy<Value = Hall> {
    prop_oneof![
        2 => Just(Hall::Alone),
        1 => Just(Hall::Member),
        1 => Just(Hall::Coordinator)
    ]
}

proptest! {
    // About 1 ms a case in a debug build.
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn the_gateway_says_what_its_mcu_said_once_and_its_silence_in_time(
        hall in hall(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let mut w = World::new(hall);
        for op in &ops {
            w.play(op)?;
        }
        w.finish()?;
    }
}
