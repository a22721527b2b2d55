//! Safety: the first layer. Leaks close their rack's valve on the step the
//! input fires and stay latched until an operator clears them with the
//! input dry; a tripped lead pump hands over to the lag pump on the step
//! the trip is confirmed, and both pumps are never off together. Sensor
//! supervision is in [`super::sensors`], the mode in [`super::mode`].
//!
//! Glossary:
//! - *latched leak*: a rack whose leak input fired; its valve stays shut
//!   until an operator clears it with the input dry.
//! - *lead / lag pump*: the pump commanded on / the one standing by.
//! - *trip*: the lead pump commanded on for a while whose contactor reads
//!   open on two reads running.

use loopwarden_protocol::message::{Event, Pump};
use loopwarden_protocol::RackIndex;

use super::view::Tick;
use super::{bit, Log};

/// A pump commanded on gets this long for its contactor to close, ms.
const PUMP_START_MS: u64 = 3_000;
/// The lead pump's contactor must read open this long to be a trip, ms
/// (two reads at a 1 s period).
const PUMP_CONFIRM_MS: u64 = 1_000;

/// Leak latches and the pumps' standing.
#[derive(Debug, Clone, Default)]
pub struct Safety {
    leaks_latched: u16,
    leaks_seen: u16,
    lead: usize,
    lead_since_ms: u64,
    lead_missing_since: Option<u64>,
    pump_failed: [bool; 2],
}

/// The pumps as this step leaves them.
#[derive(Debug, Clone, Copy)]
pub struct Pumps {
    /// Pumps A and B commanded on.
    pub on: [bool; 2],
    /// A pump commanded on reads running.
    pub running: bool,
    /// The lead pump's trip was confirmed this step.
    pub tripped: bool,
}

impl Safety {
    /// Racks with a latched leak, bit n = rack n.
    pub fn leaks_latched(&self) -> u16 {
        self.leaks_latched
    }

    /// Pumps taken out of service by a trip.
    pub fn pumps_failed(&self) -> [bool; 2] {
        self.pump_failed
    }

    /// The lead pump.
    pub fn lead(&self) -> Pump {
        if self.lead == 0 {
            Pump::A
        } else {
            Pump::B
        }
    }

    /// Clears rack `rack`'s latched leak (of `racks`); refused while its
    /// input still reads wet.
    pub fn clear_leak(
        &mut self,
        rack: usize,
        racks: usize,
        leaks_now: u16,
    ) -> Result<(), &'static str> {
        if rack >= racks {
            return Err("no such rack");
        }
        if bit(leaks_now, rack) {
            return Err("the rack's leak input still reads wet");
        }
        self.leaks_latched &= !(1 << rack);
        Ok(())
    }

    /// Puts a tripped pump back in service at `now_ms`.
    pub fn clear_pump_trip(&mut self, pump: Pump, now_ms: u64) {
        let i = pump as usize;
        self.pump_failed[i] = false;
        // A lead that has itself tripped hands over to the repaired pump.
        if self.pump_failed[self.lead] {
            self.lead = i;
            self.lead_since_ms = now_ms;
            self.lead_missing_since = None;
        }
    }

    /// The board's leak inputs (bit n = rack n) for `racks` racks: latches
    /// new leaks and reports every change; returns the valves open.
    pub(crate) fn leaks(&mut self, leaks: u16, racks: usize, log: &mut Log) -> u16 {
        for r in 0..racks {
            let wet = bit(leaks, r);
            let was = bit(self.leaks_seen, r);
            if wet && !was {
                self.leaks_latched |= 1 << r;
                if let Some(rack) = RackIndex::new(r as u8) {
                    log.push(Event::Leak { rack, active: true });
                }
            } else if !wet && was {
                if let Some(rack) = RackIndex::new(r as u8) {
                    log.push(Event::Leak {
                        rack,
                        active: false,
                    });
                }
            }
        }
        self.leaks_seen = leaks & ((1u32 << racks) - 1) as u16;
        let all_racks = ((1u32 << racks) - 1) as u16;
        all_racks & !self.leaks_latched
    }

    /// The pumps in step `t`, from the contactor feedback when the CDU
    /// answered; a trip is only judged once `booted`. A pump just started
    /// gets its contactor the time to close.
    pub(crate) fn pumps(&mut self, t: &Tick<'_>, booted: bool, log: &mut Log) -> Pumps {
        let (now, running) = (t.now, t.rd.pumps_running);
        let lead_missing = t.rd.answered
            && !self.pump_failed[self.lead]
            && !running[self.lead]
            && booted
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
            log.push(Event::PumpTrip { pump, lag_started });
        }
        let on = if self.pump_failed[0] && self.pump_failed[1] {
            // Both tripped: ask both, never neither.
            [true, true]
        } else {
            [self.lead == 0, self.lead == 1]
        };
        Pumps {
            on,
            running: (on[0] && running[0]) || (on[1] && running[1]),
            tripped: tripped_now,
        }
    }
}
