//! `cooling-ctrl replay-trace`: a microcontroller's trace replayed
//! through this machine's decision path.
//!
//! The firmware writes every input its decision path took, with the
//! digest of what each gave, to its debug port (`loopwarden_link::trace`).
//! This reads such a capture, applies the same inputs to the same code
//! here and says whether every digest agreed, with what the firmware
//! said each step cost. A mismatch means the two machines decided
//! differently on the same inputs, or that a frame of the capture was
//! lost (counted apart, as dropped frames).
//!
//! Glossary:
//! - *capture*: the bytes of the debug port, as written to a file.
//! - *cost*: a step's instructions and the stack's peak, as the firmware
//!   measured them.

use std::collections::BTreeMap;
use std::path::Path;

use cooling_core::CoreConfig;
use cooling_decide::MapLimits;
use loopwarden_link::frame::{max_frame, Deframer, Fed, END};
use loopwarden_link::trace::{Replayer, Trace};
use loopwarden_link::{SeqWatch, MAX_MESSAGE};
use serde::Serialize;

/// What a replay found.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReplayReport {
    /// Trace records read.
    pub records: u64,
    /// Frames dropped, by why.
    pub frames_dropped: BTreeMap<String, u64>,
    /// Starts of the firmware in the capture.
    pub boots: u64,
    /// Inputs applied.
    pub inputs: u64,
    /// Digests compared.
    pub compared: u64,
    /// Digests that agreed.
    pub matched: u64,
    /// Digests with no input before them (a lost frame).
    pub orphans: u64,
    /// The capture ends inside a frame: its bytes are not read.
    pub partial_frame_left: bool,
    /// Frames missing from the numbers heard: dropped on the line (counted
    /// in `frames_dropped` too) or never sent (the firmware's trace queue
    /// full); a digest among them was never compared.
    pub frames_lost: u64,
    /// Every digest agreed, there was at least one, no frame was dropped
    /// and none is left partial at the end (a frame not read may have
    /// held a digest that disagreed).
    pub all_match: bool,
    /// The first disagreement: the input's number, the firmware's digest
    /// and this machine's.
    pub first_mismatch: Option<(u64, u32, u32)>,
    /// Steps the firmware reported.
    pub steps: u64,
    /// Its instructions per step: median and worst.
    pub insn_per_step_median: Option<u32>,
    /// Its instructions per step, worst.
    pub insn_per_step_max: Option<u32>,
    /// The deepest its stack went, bytes.
    pub stack_peak_bytes: Option<u32>,
}

impl ReplayReport {
    /// Why not every digest is known to agree, in words; `None` when
    /// [`ReplayReport::all_match`].
    pub fn why_not(&self) -> Option<String> {
        if self.all_match {
            return None;
        }
        let mut why = Vec::new();
        if let Some((input, theirs, ours)) = self.first_mismatch {
            why.push(format!(
                "input {input}: the firmware's digest {theirs:08x}, this machine's {ours:08x}"
            ));
        }
        if self.orphans > 0 {
            why.push(format!(
                "{} digests with no input before them",
                self.orphans
            ));
        }
        let dropped: u64 = self.frames_dropped.values().sum();
        if dropped > 0 {
            why.push(format!("{dropped} frames dropped unread"));
        }
        if self.partial_frame_left {
            why.push("the capture ends inside a frame".into());
        }
        if self.frames_lost > 0 {
            why.push(format!(
                "{} frames missing from the numbers (dropped, or never sent)",
                self.frames_lost
            ));
        }
        if self.compared == 0 {
            why.push("no digest to compare".into());
        }
        Some(why.join("; "))
    }
}

/// Why a capture could not be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The configuration was refused.
    #[error("the control core's configuration: {0}")]
    Config(cooling_core::ConfigError),
}

/// Replays the capture at `path` for a firmware of configuration `cfg`
/// on a CDU of map `limits`.
pub fn replay_file(
    path: &Path,
    cfg: CoreConfig,
    limits: MapLimits,
) -> Result<ReplayReport, ReplayError> {
    let bytes = std::fs::read(path).map_err(|source| ReplayError::Read {
        path: path.display().to_string(),
        source,
    })?;
    replay(&bytes, cfg, limits)
}

/// Replays `capture` (see [`replay_file`]).
pub fn replay(
    capture: &[u8],
    cfg: CoreConfig,
    limits: MapLimits,
) -> Result<ReplayReport, ReplayError> {
    let mut r = Replayer::new(cfg, limits).map_err(ReplayError::Config)?;
    let mut d = Box::new(Deframer::<{ max_frame(MAX_MESSAGE) }>::default());
    let mut dropped = BTreeMap::new();
    let mut numbers = SeqWatch::default();
    let (mut records, mut insn, mut stack) = (0u64, Vec::new(), None::<u32>);
    // Bytes after the last end of frame: a frame cut off.
    let partial = capture.last().is_some_and(|b| *b != END);
    for b in capture {
        let t = match d.push(*b) {
            Fed::More => continue,
            Fed::Dropped(e) => Err(e),
            Fed::Frame(f) => {
                numbers.hear(f.seq);
                f.message::<Trace>()
            }
        };
        match t {
            Ok(t) => {
                records += 1;
                if let Some((_, cost)) = r.hear(&t) {
                    insn.push(cost.insn);
                    stack = stack.max(Some(cost.stack_peak));
                }
            }
            Err(e) => *dropped.entry(e.to_string()).or_insert(0) += 1,
        }
    }
    Ok(ReplayReport {
        records,
        boots: r.boots,
        inputs: r.inputs,
        compared: r.compared,
        matched: r.matched,
        orphans: r.orphans,
        all_match: r.all_match() && dropped.is_empty() && !partial && numbers.lost == 0,
        partial_frame_left: partial,
        frames_lost: numbers.lost,
        frames_dropped: dropped,
        first_mismatch: r.first_mismatch.map(|m| (m.input, m.theirs, m.ours)),
        steps: insn.len() as u64,
        insn_per_step_median: median(&mut insn),
        insn_per_step_max: insn.iter().copied().max(),
        stack_peak_bytes: stack,
    })
}

/// The median (the lower of the middle two for an even count).
fn median(v: &mut [u32]) -> Option<u32> {
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cooling_decide::trace::Traced;
    use cooling_decide::{BoardRead, CduMeasurements, Decider, StepIn};
    use loopwarden_link::frame::{encode, OVERHEAD};
    use loopwarden_link::Cost;

    fn limits() -> MapLimits {
        crate::modbus::map_limits(&loopwarden_boards::modbus_map::RegisterMap::sim_cdu())
    }

    /// A capture as a firmware writes it: `steps` steps of a quiet CDU
    /// whose rack 0 leaks from step 10.
    fn capture(steps: u64) -> Vec<u8> {
        let none: Result<Option<cooling_decide::LatchRecord>, &str> = Ok(None);
        let mut d = Decider::new(CoreConfig::default(), limits(), &none).unwrap();
        let (mut out, mut seq) = (Vec::new(), 0u32);
        let mut put = |t: &Trace, out: &mut Vec<u8>| {
            let mut scratch = vec![0u8; MAX_MESSAGE + OVERHEAD];
            let mut frame = vec![0u8; max_frame(MAX_MESSAGE)];
            let n = encode(t, seq, &mut scratch, &mut frame).unwrap();
            seq += 1;
            out.extend_from_slice(&frame[..n]);
        };
        for s in 0..steps {
            let cdu = CduMeasurements {
                supply_c: Some(30.0),
                return_c: Some(38.0),
                flow_lpm: Some(190.0),
                pumps_running: [Some(true), Some(false)],
                pump_faults: [Some(false); 2],
                leaks: Some(u16::from(s >= 10)),
                valves_closed: Some(0),
                it_w: Some(80_000.0),
                ..CduMeasurements::default()
            };
            let step = Traced::Step {
                cdu: Some(cdu),
                inp: StepIn {
                    now_ms: s * 1000,
                    board: BoardRead::Absent,
                    ambient_c: None,
                },
            };
            for t in [step, Traced::Plan { closed: Some(0) }] {
                let dg = d.apply(&t).digest();
                put(&Trace::Input(t), &mut out);
                if let Some(dg) = dg {
                    put(&Trace::Digest(dg), &mut out);
                }
            }
            let cost = Cost {
                insn: 1000 + s as u32,
                insn_max: 1000 + s as u32,
                stack_peak: 4000,
            };
            put(
                &Trace::Cost {
                    step: s as u32,
                    cost,
                },
                &mut out,
            );
        }
        out
    }

    #[test]
    fn a_capture_replays_with_every_digest_agreeing_and_its_costs_summed_up() {
        let r = replay(&capture(21), CoreConfig::default(), limits()).unwrap();
        assert!(r.all_match, "{r:?}");
        assert_eq!((r.inputs, r.compared, r.steps), (42, 42, 21));
        assert_eq!(r.insn_per_step_median, Some(1010));
        assert_eq!(r.insn_per_step_max, Some(1020));
        assert_eq!(r.stack_peak_bytes, Some(4000));
        assert!(r.frames_dropped.is_empty());
    }

    #[test]
    fn a_corrupt_byte_is_a_dropped_frame_and_no_longer_all_match() {
        let mut c = capture(12);
        let mid = c.len() / 2;
        c[mid] ^= 0x21;
        let r = replay(&c, CoreConfig::default(), limits()).unwrap();
        assert_eq!(r.frames_dropped.values().sum::<u64>(), 1, "{r:?}");
        assert!(!r.all_match);
    }

    /// Where the last frame holding `which` lies in `capture`: its first
    /// byte and the end's.
    fn last_frame(capture: &[u8], which: fn(&Trace) -> bool) -> (usize, usize) {
        let mut d = Box::new(Deframer::<{ max_frame(MAX_MESSAGE) }>::default());
        let (mut start, mut found) = (0, None);
        for (i, b) in capture.iter().enumerate() {
            if let Fed::Frame(f) = d.push(*b) {
                if f.message::<Trace>().is_ok_and(|t| which(&t)) {
                    found = Some((start, i));
                }
            }
            if *b == END {
                start = i + 1;
            }
        }
        found.expect("such a frame")
    }

    #[test]
    fn a_last_digest_dropped_is_no_longer_all_match() {
        let mut c = capture(12);
        let (start, end) = last_frame(&c, |t| matches!(t, Trace::Digest(_)));
        c[(start + end) / 2] ^= 0x21;
        let r = replay(&c, CoreConfig::default(), limits()).unwrap();
        assert_eq!(r.frames_dropped.values().sum::<u64>(), 1, "{r:?}");
        // Every digest heard agreed: the one not heard may not have.
        assert_eq!(r.matched, r.compared, "{r:?}");
        assert!(!r.all_match, "{r:?}");
    }

    /// A digest the firmware numbered and never sent (its trace queue
    /// full) leaves a gap in the numbers, never a frame to drop.
    #[test]
    fn a_digest_never_sent_is_no_longer_all_match() {
        let mut c = capture(12);
        let (start, end) = last_frame(&c, |t| matches!(t, Trace::Digest(_)));
        c.drain(start..=end);
        let r = replay(&c, CoreConfig::default(), limits()).unwrap();
        assert!(
            r.frames_dropped.is_empty() && !r.partial_frame_left,
            "{r:?}"
        );
        assert_eq!(r.frames_lost, 1, "{r:?}");
        assert!(!r.all_match, "{r:?}");
        assert_eq!(
            r.why_not().as_deref(),
            Some("1 frames missing from the numbers (dropped, or never sent)")
        );
    }

    #[test]
    fn a_frame_cut_off_at_the_end_is_no_longer_all_match() {
        let c = capture(12);
        let (start, end) = last_frame(&c, |t| matches!(t, Trace::Cost { .. }));
        assert_eq!(end, c.len() - 1, "the last frame");
        let r = replay(&c[..(start + end) / 2], CoreConfig::default(), limits()).unwrap();
        assert!(r.partial_frame_left, "{r:?}");
        assert!(r.frames_dropped.is_empty(), "{r:?}");
        assert_eq!(r.matched, r.compared, "{r:?}");
        assert!(!r.all_match, "{r:?}");
        assert_eq!(
            r.why_not().as_deref(),
            Some("the capture ends inside a frame")
        );
        // Whole, it matches.
        let r = replay(&c, CoreConfig::default(), limits()).unwrap();
        assert!(!r.partial_frame_left && r.all_match, "{r:?}");
    }

    #[test]
    fn another_configuration_disagrees() {
        let mut cfg = CoreConfig::default();
        cfg.margins.boot_setpoint_c -= 3.0;
        let r = replay(&capture(5), cfg, limits()).unwrap();
        assert!(!r.all_match);
        assert_eq!(r.first_mismatch.map(|m| m.0), Some(0));
    }
}
