//! The gateway, what the sequence says of it, the things that happen,
//! and the test's world.

use super::*;

/// The CDU's part in a hall of several CDUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hall {
    /// None: a hall of one CDU.
    Alone,
    /// `cdu-2`, which follows `cdu-1`'s plan.
    Member,
    /// `cdu-1`, which plans the hall.
    Coordinator,
}

pub(crate) fn id(s: &str) -> Ident {
    Ident::new(s).expect("an ident")
}

/// What became of a clear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
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
pub(crate) struct Token {
    pub(crate) id: u32,
    /// When it went down the line, test ms.
    pub(crate) sent: Option<u64>,
    pub(crate) outcome: Option<Outcome>,
}

/// One life of the gateway: its core and the parts its loop composes
/// with it, as `cooling_ctrl::gateway` composes them.
pub(crate) struct Gateway {
    /// When it started, test ms.
    pub(crate) started: u64,
    /// Its wall clock then, Unix ms (it reads no earlier one).
    pub(crate) started_unix: u64,
    pub(crate) bridge: Bridge,
    pub(crate) bms: BmsBridge,
    pub(crate) pending: Pending<usize>,
    /// Its next tick, test ms.
    pub(crate) next_tick: u64,
}

impl Gateway {
    pub(crate) fn new(core: &CoreConfig, hall: Hall, t: u64, unix_ms: u64) -> Self {
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
pub(crate) struct Expect {
    pub(crate) run: Run,
    /// The last frame checked (taken, or its message unread): its number
    /// and bytes.
    pub(crate) last_in: Option<(u32, Vec<u8>)>,
    /// A frame whose message did not read was numbered at or below the
    /// last: the MCU started again, taken at the next frame taken.
    pub(crate) restart_unread: bool,
    /// The last status taken, and when (test ms).
    pub(crate) last_status: Option<(Status, u64)>,
    /// The MCU's offer since it last started.
    pub(crate) offer: Option<FacilityOffer>,
    /// The last state published, and when (test ms).
    pub(crate) published: Option<(u64, CduState)>,
    /// When the BMS's limits last went down (`None`: it wrote none).
    pub(crate) limits_down: Option<u64>,
    /// Outdoor temperatures the BMS wrote, and sent down.
    pub(crate) outdoor: (u64, u64),
    /// The coordinator's waters heard on the bus, °C.
    pub(crate) waters: Vec<f32>,
    /// What the BMS last read alarming, which its `alarm_ack` carries.
    pub(crate) alarms_shown: Alarms,
}

impl Expect {
    pub(crate) fn new() -> Self {
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
            alarms_shown: Alarms::default(),
        }
    }
}

/// What a frame taken said, for the checks of what the bridge made of
/// it.
pub(crate) struct Taken<'a> {
    pub(crate) status: Option<&'a Status>,
    /// For an answer: the token of the clear it answers.
    pub(crate) answers: Option<usize>,
}

/// The bus's limits, as the BMS writes them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum BmsWrite {
    Ceiling(u8),
    Offset(u8),
    Outdoor(i8),
    Ack,
}

/// One thing that happens.
#[derive(Debug, Clone)]
pub(crate) enum Op {
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
pub(crate) struct World {
    /// Now, test ms.
    pub(crate) t: u64,
    /// The wall clock's steps, ms.
    pub(crate) wall_ms: i64,
    pub(crate) core: CoreConfig,
    pub(crate) hall: Hall,
    pub(crate) mcu: Mcu,
    pub(crate) gw: Gateway,
    pub(crate) x: Expect,
    /// Every run of bytes the line carried.
    pub(crate) pieces: Vec<Piece>,
    pub(crate) bus: bool,
    /// When the broker last connected, test ms.
    pub(crate) bus_since: u64,
    pub(crate) line: bool,
    /// The state the broker keeps.
    pub(crate) retained: Option<CduState>,
    pub(crate) tokens: Vec<Token>,
}

pub(crate) type Check = Result<(), TestCaseError>;

impl World {
    pub(crate) fn new(hall: Hall) -> Self {
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
    pub(crate) fn wall(&self) -> u64 {
        (T0 as i64 + self.t as i64 + self.wall_ms).max(0) as u64
    }

    /// Now, as the gateway's loop reads it (its wall clock never before
    /// its start).
    pub(crate) fn now(&self) -> Now {
        Now {
            mono_ms: self.t - self.gw.started,
            unix_ms: self.wall().max(self.gw.started_unix),
        }
    }

    /// Time passes `ms`, with the loop's ticks.
    pub(crate) fn advance(&mut self, ms: u64) -> Check {
        let end = self.t + ms;
        while self.gw.next_tick <= end {
            self.t = self.gw.next_tick;
            self.gw.next_tick += TICK_MS;
            self.tick()?;
        }
        self.t = end;
        Ok(())
    }

    pub(crate) fn play(&mut self, op: &Op) -> Check {
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
    pub(crate) fn gateway_starts(&mut self, ms: u64) -> Check {
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
    pub(crate) fn send(&mut self, said: Said, harm: Harm, split: Option<(u16, u16)>) -> Check {
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
