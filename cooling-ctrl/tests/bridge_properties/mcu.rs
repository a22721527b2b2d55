//! The microcontroller, scripted.

use super::*;

/// What the MCU's last step found, as its statuses say it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Facts {
    pub(crate) mode: CduMode,
    pub(crate) reason: ReasonCode,
    /// Since when, MCU ms.
    pub(crate) since_ms: u64,
    pub(crate) setpoint_c: f32,
    pub(crate) racks: RackBits,
}

/// The MCU.
#[derive(Debug)]
pub(crate) struct Mcu {
    /// Its next frame's number.
    pub(crate) seq: u32,
    pub(crate) boot: u32,
    /// When it started, test ms.
    pub(crate) started: u64,
    /// How far its clock jumped ahead since, ms.
    pub(crate) jumped_ms: u64,
    pub(crate) step: u32,
    pub(crate) facts: Facts,
    /// Clears it received and has not answered: id and token.
    pub(crate) clears: Vec<(u32, usize)>,
}

impl Mcu {
    pub(crate) fn new(t: u64, boot: u32) -> Self {
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
    pub(crate) fn clock(&self, t: u64) -> u64 {
        t - self.started + self.jumped_ms
    }

    /// Its next frame, saying `up`.
    pub(crate) fn next(&mut self, up: Up, answers: Option<usize>) -> Said {
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        Said { seq, up, answers }
    }

    /// Its status at test ms `t`: a step with its facts.
    pub(crate) fn status(&mut self, t: u64) -> Up {
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
    pub(crate) fn hello(&self, reset: ResetCause, restored: bool) -> Up {
        Up::Hello(Hello {
            boot: self.boot,
            reset,
            firmware: heapless::String::try_from("0.1.0").expect("short"),
            restored,
        })
    }
}

pub(crate) const MODES: [CduMode; 4] = [
    CduMode::Boot,
    CduMode::Normal,
    CduMode::Degraded,
    CduMode::Failsafe,
];

/// A reason an MCU may give (never `controller-silent`, the gateway's).
pub(crate) fn reason(i: u8) -> ReasonCode {
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
pub(crate) enum Say {
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
pub(crate) fn lease(id: u32, watts: u16, gpus: u8, duration_s: u8) -> CapLease {
    let caps: Vec<(GpuSelector, u32)> = (0..gpus % 4)
        .map(|g| match GpuIndex::new(g) {
            Some(i) if g > 0 => (GpuSelector::Gpu(i), u32::from(watts) + u32::from(g)),
            _ => (GpuSelector::All, u32::from(watts)),
        })
        .collect();
    samples::cooling_lease(id, &caps, u32::from(duration_s) * 1000)
}

/// A hall offer accepting `accept_c`.
pub(crate) fn offer(accept_c: f32) -> FacilityOffer {
    offer_msg(&Offer::uncapped(accept_c, 110_000.0, 128.0, 200.0))
}

/// The racks `layout` lists, bit n = rack n.
pub(crate) fn rack_mask(layout: &Layout) -> u16 {
    ((1u32 << layout.racks.min(16)) - 1) as u16
}

impl Mcu {
    /// The frame of `say` at test ms `t`, on a loop laid out as `layout`.
    pub(crate) fn say(&mut self, say: &Say, t: u64, layout: &Layout) -> Said {
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
