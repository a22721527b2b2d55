//! An operator's release of a quarantined GPU, and the quarantine-level
//! evidence that comes while a GPU is quarantined.
//!
//! A quarantined GPU is still sampled and judged. Evidence that would
//! quarantine it (an NVLink counter that rises, a fatal XID, a double-bit
//! error) changes no state while it is out, but it is kept, the latest of
//! it: an operator who signed a release before it came judged the GPU
//! without it, so that release is refused and says why. A release signed
//! after it goes through; the GPU's last sample is kept across it, so a
//! counter that rises after the release is still judged against the
//! sample before.
//!
//! Glossary:
//! - *later evidence*: the latest quarantine-level evidence that came
//!   while the GPU was already quarantined: when (engine time), its
//!   reason and its words.
//! - *signed*: the release frame's stamp, on its sender's clock.

use loopwarden_protocol::{HealthState, ReasonCode, TimestampMs};

use super::{fit, fmt_time, Change, HealthEngine, Track};

/// Why a release was not carried out (nothing changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The GPU is not quarantined (a GPU the host does not have reads
    /// as healthy): nothing to release.
    NotQuarantined(HealthState),
    /// Quarantine-level evidence came after the release was signed, or
    /// within the clocks' skew before its stamp: the words say which, when,
    /// and after when to sign again.
    NewerEvidence(String),
}

/// Quarantine-level evidence that came while a GPU was quarantined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaterEvidence {
    /// When it came (the engine's stamp, wall clock).
    pub time: TimestampMs,
    /// Its reason.
    pub reason: ReasonCode,
    /// Its words.
    pub evidence: String,
}

impl HealthEngine {
    /// The latest quarantine-level evidence that came while `gpu` was
    /// already quarantined, if any since it was quarantined.
    pub fn later_evidence(&self, gpu: u8) -> Option<LaterEvidence> {
        let tr = self.gpus.get(gpu as usize)?;
        let (at, reason, evidence) = tr.later.as_ref()?;
        Some(LaterEvidence {
            time: self.stamp(*at),
            reason: *reason,
            evidence: evidence.clone(),
        })
    }

    /// Keeps `gpu`'s new quarantine-level evidence at `now` if it is
    /// already quarantined (it changes no state).
    pub(super) fn keep_later(
        &mut self,
        now: u64,
        gpu: usize,
        reason: ReasonCode,
        evidence: impl FnOnce() -> String,
    ) {
        let tr = &mut self.gpus[gpu];
        if tr.status.state == HealthState::Quarantined {
            tr.later = Some((now, reason, fit(evidence())));
        }
    }

    /// An operator releases a quarantined GPU at `now` with a release
    /// `signed` at that stamp. Refused when the GPU is not quarantined, or
    /// when quarantine-level evidence came after the release was signed,
    /// or within the clocks' allowed skew before (the operator may not
    /// have seen it). The GPU's last sample is kept, so a
    /// counter that rises after the release is judged.
    pub fn release(
        &mut self,
        now: TimestampMs,
        signed: TimestampMs,
        gpu: u8,
        operator: &str,
        note: &str,
    ) -> Result<Change, Refusal> {
        let at = self.stamp(now.0);
        let later = self.later_evidence(gpu);
        let Some(tr) = self.gpus.get_mut(gpu as usize) else {
            return Err(Refusal::NotQuarantined(HealthState::Healthy));
        };
        if tr.status.state != HealthState::Quarantined {
            return Err(Refusal::NotQuarantined(tr.status.state));
        }
        // On two clocks: evidence up to the skew allowed before the
        // release's stamp may still have come after the operator signed
        // (their clock ahead), so it refuses too (fail closed: sign again).
        let skew = crate::commands::CLOCK_SKEW_MS;
        if let Some(l) = later.filter(|l| l.time.0.saturating_add(skew) > signed.0) {
            let again = TimestampMs(l.time.0.saturating_add(skew));
            return Err(Refusal::NewerEvidence(fit(format!(
                "GPU {gpu}: {} at {}; sign after {}",
                l.reason,
                fmt_time(l.time),
                fmt_time(again)
            ))));
        }
        let evidence = fit(format!(
            "released by {operator} at {}: {note}",
            fmt_time(at)
        ));
        let change = Change {
            time: at,
            gpu,
            from: HealthState::Quarantined,
            to: HealthState::Healthy,
            reason: ReasonCode::OPERATOR_RELEASE,
            evidence: evidence.clone(),
        };
        let last = tr.last;
        *tr = Track::new(at);
        tr.last = last;
        tr.status.reason = ReasonCode::OPERATOR_RELEASE;
        tr.status.evidence = evidence;
        Ok(change)
    }
}
