//! The detection latency the job model takes from the replay, and the one
//! it does not use, each said in a note.
//!
//! The job model (`loopwarden_twin::goodput::engine`) applies its
//! detection latency only to a class it plays as a hang a host sees
//! (`Onset::Hang`, `host_visible`); a class it plays as a crash stops the
//! job at once, whatever the agent sees. So `detection_s` is the mean over
//! the failures of those classes, read from the run's mix (the default
//! mix's where the traces hold no failure of any of them), not over every
//! hang the traces hold.
//!
//! Glossary:
//! - *applied class*: a class the run's mix plays as a hang a host sees
//!   (`gsp` in Llama 3's); the job model applies `detection_s` to it.
//! - *unused hang*: a hang ([`Mechanism::is_hang`]) of any other class
//!   (`faulty_gpu`'s GPUs that stop answering without an XID): the job
//!   model plays its class as a crash, so its detection is not used.
//!
//! [`Mechanism::is_hang`]: super::scenarios::Mechanism::is_hang

use loopwarden_twin::goodput::{Mix, Onset};

use super::{median, Detection, FailureOutcome, Measurement};

/// The classes of `mix` the job model applies the detection latency to:
/// those it plays as hangs a host sees.
pub fn applied_classes(mix: &Mix) -> Vec<&str> {
    mix.classes
        .iter()
        .filter(|c| c.host_visible && c.onset == Onset::Hang)
        .map(|c| c.name.as_str())
        .collect()
}

/// The latencies, seconds, of `failures` quarantined after they struck.
fn after_s(failures: &[&FailureOutcome]) -> Vec<f64> {
    failures.iter().filter_map(|f| latency_s(f)).collect()
}

/// The failure-to-quarantine latency, seconds, of `f`, where it was
/// quarantined after it struck.
pub(super) fn latency_s(f: &FailureOutcome) -> Option<f64> {
    match f.detection {
        Detection::After(ms) => Some(ms as f64 / 1e3),
        _ => None,
    }
}

/// The distinct names `name` gives `failures`, sorted, joined.
fn names<'a>(
    failures: &[&'a FailureOutcome],
    name: impl Fn(&'a FailureOutcome) -> &'a str,
) -> String {
    let mut v: Vec<&str> = failures.iter().map(|f| name(f)).collect();
    v.sort();
    v.dedup();
    v.join(", ")
}

/// "mean s (median, max)" of a non-empty `det`.
fn spread(det: &[f64]) -> (f64, String) {
    let mean = det.iter().sum::<f64>() / det.len() as f64;
    let max = det.iter().copied().fold(0.0, f64::max);
    (
        mean,
        format!("median {:.1} s, max {:.1} s", median(det), max),
    )
}

impl Measurement {
    /// The classes the detection latency is the mean over, and a sentence
    /// on where they come from: the run's `mix`'s applied classes the
    /// traces hold failures of; where they hold none of them, the default
    /// mix's (the latency then applies to none of the run's hangs, or to
    /// classes with no measured latency, and the note says so).
    fn latency_classes(&self, mix: &Mix) -> (Vec<String>, String) {
        let applied = applied_classes(mix);
        let held = |c: &&str| self.failures.iter().any(|f| f.failure.class == *c);
        let (measured, not): (Vec<&str>, Vec<&str>) = applied.iter().partition(|c| held(c));
        if !measured.is_empty() {
            let how = if not.is_empty() {
                "the run's mix plays as hangs a host sees".to_string()
            } else {
                format!(
                    "the run's mix plays as hangs a host sees (it plays {} so too, of which the \
                     traces hold no failure: they take this mean)",
                    not.join(", ")
                )
            };
            return (measured.iter().map(|c| c.to_string()).collect(), how);
        }
        let default = Mix::default();
        let classes: Vec<String> = applied_classes(&default)
            .iter()
            .map(|c| c.to_string())
            .collect();
        let how = if applied.is_empty() {
            "the default mix plays as hangs a host sees (the run's mix plays no class so, and \
             applies it to none)"
                .to_string()
        } else {
            format!(
                "the default mix plays as hangs a host sees (the traces hold no failure of the \
                 classes the run's mix plays so, {}, which take it unmeasured)",
                applied.join(", ")
            )
        };
        (classes, how)
    }

    /// The detection latency the job model takes, with its note, and a
    /// note on the hangs' it does not use: the mean over the failures of
    /// `mix`'s applied classes not quarantined before they struck (the
    /// default mix's where the traces hold none of those); an error if
    /// none was measured.
    pub(super) fn hang_detection(&self, mix: &Mix) -> Result<(f64, Vec<String>), String> {
        let (applied, whose) = self.latency_classes(mix);
        let (of_applied, others): (Vec<&FailureOutcome>, Vec<&FailureOutcome>) = self
            .failures
            .iter()
            .partition(|f| applied.iter().any(|c| c == f.failure.class));
        let det = after_s(&of_applied);
        if det.is_empty() {
            return Err(format!(
                "none of the {} failures generated is of a class the job model plays as a hang \
                 a host sees ({}) and quarantined after it struck: the detection latency has no \
                 mean",
                self.failures.len(),
                applied.join(", ")
            ));
        }
        let (mean, how) = spread(&det);
        let all = self.detections_s();
        let applied_note = format!(
            "detection_s: the mean, over the {} failures of {} ({}) not quarantined before they struck, the classes {whose}, of the time from the failure's start (its XID, or the first sample it misses) to the quarantine verdict in the replay ({how}). The job model applies it to the classes it plays as hangs a host sees only (one it plays as a crash stops the job at once); over all {} failures, crashes quarantined on their XID included, the mean is {:.3} s. The driver's own delay in delivering an XID is not in the traces.",
            det.len(),
            applied.join(", "),
            names(&of_applied, |f| f.failure.mechanism.name()),
            all.len(),
            all.iter().sum::<f64>() / all.len().max(1) as f64,
        );
        let hangs: Vec<&FailureOutcome> = others
            .into_iter()
            .filter(|f| f.failure.mechanism.is_hang())
            .collect();
        let unused = after_s(&hangs);
        let unused_note = if unused.is_empty() {
            "not used by the job model: no hang of a class it plays as a crash was quarantined after it struck.".to_string()
        } else {
            let (m, how) = spread(&unused);
            format!(
                "not used by the job model: the {} hangs of classes it plays as crashes ({}: {}) take {m:.3} s from the first sample missed to the quarantine ({how}). The job model plays these classes' failures as crashes, stopping the job at once, so it counts no time for them to be found; a real hang without an XID stalls the job until its collective timeout, or until the agent's quarantine where that ends the job, so here the model understates what the agent is worth.",
                unused.len(),
                names(&hangs, |f| f.failure.class),
                names(&hangs, |f| f.failure.mechanism.name()),
            )
        };
        Ok((mean, vec![applied_note, unused_note]))
    }
}
