//! What the core latches and must never forget across a restart: leak
//! latches, racks whose isolation failed, pumps out of service and the
//! lead pump, the failsafe reason, the sensors under a fault and the
//! valve position inputs not believed.
//!
//! The shell writes [`Latched::encode`]'s bytes to flash whenever they
//! change, before the step's commands reach the CDU, and gives them back
//! to [`crate::Core::restore`] before the first step after a start. The
//! record is 16 bytes with a version byte; anything else is refused with
//! the reason, never read as "nothing latched". Version 1 (before the
//! valve position inputs were kept) still reads, with every input
//! believed, as it was then.
//!
//! Glossary:
//! - *pump fault*: why a pump is out of service: its contactor opened
//!   (`Tripped`) or it ran without moving water (`Seized`).
//! - *isolation failed*: a leaking rack whose valve did not confirm closed
//!   in time; the secondary pumps are stopped for it.
//! - *feedback fault*: a valve position input not believed (it read
//!   closed while the valve was commanded open; see [`crate::safety`]).

use loopwarden_protocol::message::{Pump, SensorFault};
use loopwarden_protocol::ReasonCode;

/// Why a pump is out of service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PumpFault {
    /// Commanded on, its contactor read open.
    Tripped,
    /// Its contactor closed, it moved no water.
    Seized,
}

/// The latched state of the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latched {
    /// Racks with a latched leak, bit n = rack n.
    pub leaks: u16,
    /// Racks whose isolation failed (the pumps are stopped for them).
    pub isolation_failed: u16,
    /// Pumps A and B out of service, and why.
    pub pumps: [Option<PumpFault>; 2],
    /// The lead pump.
    pub lead: Pump,
    /// The failsafe reason, if in failsafe.
    pub failsafe: Option<ReasonCode>,
    /// Each supervised sensor's standing fault, by
    /// [`crate::sensors::Which`].
    pub sensors: [Option<SensorFault>; 4],
    /// Racks whose valve position input is not believed (a feedback
    /// fault), bit n = rack n: its "closed" confirms no isolation.
    pub feedback_faults: u16,
}

impl Default for Latched {
    fn default() -> Self {
        Self {
            leaks: 0,
            isolation_failed: 0,
            pumps: [None; 2],
            lead: Pump::A,
            failsafe: None,
            sensors: [None; 4],
            feedback_faults: 0,
        }
    }
}

/// The record's version.
const VERSION: u8 = 2;
/// The oldest version still read (without the feedback faults).
const OLDEST: u8 = 1;
/// The record's length, bytes.
pub const LEN: usize = 16;

/// Why a latched record was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatchError {
    /// Not [`LEN`] bytes.
    Length(usize),
    /// A version this core does not read.
    Version(u8),
    /// A field holds a value no core writes (which field).
    Field(&'static str),
}

impl core::fmt::Display for LatchError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Length(n) => write!(f, "latched state: {n} bytes, expected {LEN}"),
            Self::Version(v) => write!(
                f,
                "latched state: version {v}, expected {OLDEST} to {VERSION}"
            ),
            Self::Field(w) => write!(f, "latched state: {w} holds a value no controller writes"),
        }
    }
}

fn pump_code(p: Option<PumpFault>) -> u8 {
    match p {
        None => 0,
        Some(PumpFault::Tripped) => 1,
        Some(PumpFault::Seized) => 2,
    }
}

fn pump_of(b: u8) -> Result<Option<PumpFault>, LatchError> {
    Ok(match b {
        0 => None,
        1 => Some(PumpFault::Tripped),
        2 => Some(PumpFault::Seized),
        _ => return Err(LatchError::Field("a pump's fault")),
    })
}

fn sensor_code(f: Option<SensorFault>) -> u8 {
    match f {
        None | Some(SensorFault::Cleared) => 0,
        Some(SensorFault::Stuck) => 1,
        Some(SensorFault::Drift) => 2,
        Some(SensorFault::Lost) => 3,
        Some(SensorFault::Implausible) => 4,
    }
}

fn sensor_of(b: u8) -> Result<Option<SensorFault>, LatchError> {
    Ok(match b {
        0 => None,
        1 => Some(SensorFault::Stuck),
        2 => Some(SensorFault::Drift),
        3 => Some(SensorFault::Lost),
        4 => Some(SensorFault::Implausible),
        _ => return Err(LatchError::Field("a sensor's fault")),
    })
}

impl Latched {
    /// The record: version, leaks, isolation failed (u16 LE each), pump
    /// faults A and B, lead (0 A, 1 B), failsafe reason (u16 LE, 0 none),
    /// the four sensors' faults, the feedback faults (u16 LE; version 2).
    pub fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[0] = VERSION;
        b[1..3].copy_from_slice(&self.leaks.to_le_bytes());
        b[3..5].copy_from_slice(&self.isolation_failed.to_le_bytes());
        b[5] = pump_code(self.pumps[0]);
        b[6] = pump_code(self.pumps[1]);
        b[7] = u8::from(self.lead == Pump::B);
        b[8..10].copy_from_slice(&self.failsafe.map_or(0, |r| r.0).to_le_bytes());
        for (i, f) in self.sensors.iter().enumerate() {
            b[10 + i] = sensor_code(*f);
        }
        b[14..16].copy_from_slice(&self.feedback_faults.to_le_bytes());
        b
    }

    /// The latched state of a record [`Latched::encode`] wrote, or one of
    /// version 1 (no feedback faults then).
    pub fn decode(b: &[u8]) -> Result<Self, LatchError> {
        if b.len() != LEN {
            return Err(LatchError::Length(b.len()));
        }
        if !(OLDEST..=VERSION).contains(&b[0]) {
            return Err(LatchError::Version(b[0]));
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let lead = match b[7] {
            0 => Pump::A,
            1 => Pump::B,
            _ => return Err(LatchError::Field("the lead pump")),
        };
        let failsafe = match u16_at(8) {
            0 => None,
            r => Some(ReasonCode(r)),
        };
        let mut sensors = [None; 4];
        for (i, s) in sensors.iter_mut().enumerate() {
            *s = sensor_of(b[10 + i])?;
        }
        Ok(Self {
            leaks: u16_at(1),
            isolation_failed: u16_at(3),
            pumps: [pump_of(b[5])?, pump_of(b[6])?],
            lead,
            failsafe,
            sensors,
            // A version 1 record did not keep them: every input believed,
            // as then (a failed isolation says its input read open, no
            // evidence of one that lies "closed").
            feedback_faults: if b[0] == OLDEST { 0 } else { u16_at(14) },
        })
    }

    /// Pumps out of service as a mask, bit 0 A, bit 1 B.
    pub fn pumps_out(&self) -> u8 {
        u8::from(self.pumps[0].is_some()) | (u8::from(self.pumps[1].is_some()) << 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written_and_a_bad_one_says_why() {
        let l = Latched {
            leaks: 0b1001,
            isolation_failed: 0b1000,
            pumps: [Some(PumpFault::Seized), None],
            lead: Pump::B,
            failsafe: Some(ReasonCode::SENSOR_LOST),
            sensors: [
                None,
                Some(SensorFault::Drift),
                Some(SensorFault::Lost),
                None,
            ],
            feedback_faults: 0b1000_0000_0000_0010,
        };
        assert_eq!(Latched::decode(&l.encode()), Ok(l));
        // A record of version 1 (before the feedback faults were kept)
        // reads with every position input believed.
        let mut v1 = l.encode();
        v1[0] = 1;
        v1[14..16].fill(0);
        let old = Latched {
            feedback_faults: 0,
            ..l
        };
        assert_eq!(Latched::decode(&v1), Ok(old));
        assert_eq!(Latched::decode(&[1, 2]), Err(LatchError::Length(2)));
        let mut b = l.encode();
        b[0] = 9;
        assert_eq!(Latched::decode(&b), Err(LatchError::Version(9)));
        b[0] = 0;
        assert_eq!(Latched::decode(&b), Err(LatchError::Version(0)));
        let mut b = l.encode();
        b[7] = 2;
        assert_eq!(Latched::decode(&b), Err(LatchError::Field("the lead pump")));
        assert_eq!(l.pumps_out(), 0b01);
    }
}
