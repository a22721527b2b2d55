//! The firmware's trace on its debug port, and its replay on another
//! machine.
//!
//! The firmware drives its decision path ([`cooling_decide::Decider`])
//! only through [`Decider::apply`](cooling_decide::Decider::apply), and
//! writes every input it applies to the debug port, in order, with the
//! digest of what each gave ([`Trace`], in the link's frames). A
//! [`Replayer`] on any machine applies the same inputs to the same code
//! and compares digests: a mismatch means the two machines decided
//! differently on the same inputs (a compiler's or an FPU's difference, a
//! lost trace frame), and the first is kept.
//!
//! Glossary:
//! - *input*: one call into the decider ([`Traced`]).
//! - *digest*: CRC-32 of a step's commands or a plan's writes
//!   (`cooling_decide::trace`).

use cooling_core::CoreConfig;
use cooling_decide::trace::Traced;
use cooling_decide::{Decider, MapLimits};
use serde::{Deserialize, Serialize};

use crate::message::{Cost, Hello};

/// One record of the debug port's trace.
// No allocator to box the large input in: records are made and read
// one at a time, in static buffers.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Trace {
    /// The firmware started (its first record after every start).
    Boot(Hello),
    /// A call into the decider, in the order made.
    Input(Traced),
    /// The digest of what the input before it gave.
    Digest(u32),
    /// A step ended, and what it cost.
    Cost {
        /// The step's number since the start.
        step: u32,
        /// Its cost.
        cost: Cost,
    },
}

/// Where a replay first disagreed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// The input's number in the trace (from 0).
    pub input: u64,
    /// The firmware's digest.
    pub theirs: u32,
    /// This machine's.
    pub ours: u32,
}

/// A trace replayed through this machine's decision path.
pub struct Replayer {
    decider: Decider,
    /// The digest of the last input applied here, if it gave one.
    last: Option<u32>,
    /// Inputs applied.
    pub inputs: u64,
    /// Digests compared, and how many agreed.
    pub compared: u64,
    /// Digests that agreed.
    pub matched: u64,
    /// The first disagreement.
    pub first_mismatch: Option<Mismatch>,
    /// A digest with no input before it that gave one (a lost frame).
    pub orphans: u64,
    /// Starts of the firmware seen.
    pub boots: u64,
}

impl Replayer {
    /// A replayer for a firmware built with `cfg` on a CDU of map
    /// `limits`.
    pub fn new(cfg: CoreConfig, limits: MapLimits) -> Result<Self, cooling_core::ConfigError> {
        let none: Result<Option<cooling_decide::LatchRecord>, &str> = Ok(None);
        Ok(Self {
            decider: Decider::new(cfg, limits, &none)?,
            last: None,
            inputs: 0,
            compared: 0,
            matched: 0,
            first_mismatch: None,
            orphans: 0,
            boots: 0,
        })
    }

    /// Hears one record. Returns the record's cost, if it was one.
    pub fn hear(&mut self, t: &Trace) -> Option<(u32, Cost)> {
        match t {
            Trace::Boot(_) => {
                self.boots += 1;
                self.last = None;
            }
            Trace::Input(i) => {
                self.last = self.decider.apply(i).digest();
                self.inputs += 1;
            }
            Trace::Digest(theirs) => self.compare(*theirs),
            Trace::Cost { step, cost } => return Some((*step, *cost)),
        }
        None
    }

    fn compare(&mut self, theirs: u32) {
        let Some(ours) = self.last.take() else {
            self.orphans += 1;
            return;
        };
        self.compared += 1;
        if ours == theirs {
            self.matched += 1;
        } else if self.first_mismatch.is_none() {
            self.first_mismatch = Some(Mismatch {
                input: self.inputs.saturating_sub(1),
                theirs,
                ours,
            });
        }
    }

    /// Every digest compared agreed, and there was at least one.
    pub fn all_match(&self) -> bool {
        self.compared > 0 && self.matched == self.compared && self.orphans == 0
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use cooling_decide::{BoardRead, CduMeasurements, StepIn};
    use std::vec::Vec;

    fn limits() -> MapLimits {
        MapLimits {
            mapped: [true; 6],
            setpoint_c: Some((17.0, 45.0)),
            speed_pct: Some((30.0, 100.0)),
            positions: true,
        }
    }

    /// What a firmware writes for `steps` steps, with a leak on rack 2 from
    /// step 20, through its decider.
    fn firmware_trace(steps: u64) -> Vec<Trace> {
        let mut d = Decider::new(CoreConfig::default(), limits(), &Ok::<_, &str>(None)).unwrap();
        let mut out = Vec::new();
        let apply = |d: &mut Decider, out: &mut Vec<Trace>, t: Traced| {
            let a = d.apply(&t);
            out.push(Trace::Input(t));
            if let Some(dg) = a.digest() {
                out.push(Trace::Digest(dg));
            }
        };
        for s in 0..steps {
            let cdu = CduMeasurements {
                supply_c: Some(30.0),
                return_c: Some(38.0),
                flow_lpm: Some(190.0 + (s % 3) as f64),
                facility_supply_c: Some(26.0),
                pumps_running: [Some(true), Some(false)],
                pump_faults: [Some(false); 2],
                leaks: Some(if s >= 20 { 0b0100 } else { 0 }),
                diff_pressure_kpa: Some(100.0),
                valves_closed: Some(0),
                it_w: Some(80_000.0),
                cooling_w: Some(4_000.0),
                facility_w: Some(88_000.0),
                outdoor_c: Some(15.0),
            };
            let inp = StepIn {
                now_ms: s * 1000,
                board: BoardRead::Absent,
                ambient_c: Some(15.0),
            };
            apply(
                &mut d,
                &mut out,
                Traced::Step {
                    cdu: Some(cdu),
                    inp,
                },
            );
            apply(&mut d, &mut out, Traced::Plan { closed: Some(0) });
            out.push(Trace::Cost {
                step: s as u32,
                cost: Cost::default(),
            });
        }
        out
    }

    fn replay(trace: &[Trace]) -> Replayer {
        let mut r = Replayer::new(CoreConfig::default(), limits()).unwrap();
        for t in trace {
            r.hear(t);
        }
        r
    }

    #[test]
    fn a_trace_through_the_link_replays_to_the_same_digests() {
        let trace = firmware_trace(40);
        let mut scratch = [0u8; crate::MAX_MESSAGE + crate::frame::OVERHEAD];
        let mut wire = Vec::new();
        for (seq, t) in trace.iter().enumerate() {
            let mut out = [0u8; crate::frame::max_frame(crate::MAX_MESSAGE)];
            let n = crate::frame::encode(t, seq as u32, &mut scratch, &mut out).unwrap();
            wire.extend_from_slice(&out[..n]);
        }
        let mut d = crate::Deframer::<{ crate::frame::max_frame(crate::MAX_MESSAGE) }>::default();
        let mut r = Replayer::new(CoreConfig::default(), limits()).unwrap();
        for b in wire {
            if let crate::Fed::Frame(f) = d.push(b) {
                r.hear(&f.message::<Trace>().unwrap());
            }
        }
        assert_eq!((r.inputs, r.compared), (80, 80));
        assert!(r.all_match(), "{:?}", r.first_mismatch);
    }

    #[test]
    fn a_different_decision_is_found_at_its_input() {
        let mut trace = firmware_trace(30);
        // The firmware "decided" differently at step 25's commands.
        let at = trace
            .iter()
            .enumerate()
            .filter(|(_, t)| matches!(t, Trace::Digest(_)))
            .nth(50)
            .map(|(i, _)| i)
            .unwrap();
        if let Trace::Digest(d) = &mut trace[at] {
            *d ^= 1;
        }
        let r = replay(&trace);
        assert!(!r.all_match());
        assert_eq!(r.first_mismatch.map(|m| m.input), Some(50));
        assert_eq!(r.compared, 60);
    }

    #[test]
    fn a_lost_input_shows_as_an_orphan_digest_or_a_mismatch() {
        let mut trace = firmware_trace(30);
        let at = trace
            .iter()
            .position(|t| matches!(t, Trace::Input(Traced::Step { .. })))
            .unwrap();
        trace.remove(at);
        assert!(!replay(&trace).all_match());
    }
}
