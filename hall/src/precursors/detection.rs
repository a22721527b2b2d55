//! The detection latency the job model takes from the replay, and the one
//! it does not use, each said in a note.
//!
//! The job model (`loopwarden_twin::goodput::engine`) applies its
//! detection latency only to a class it plays as a hang a host sees
//! (`Onset::Hang`, `host_visible`); a class it plays as a crash stops the
//! job at once, whatever the agent sees. So `detection_s` is the mean over
//! the failures of those classes, read from the twin's default mix, not
//! over every hang the traces hold.
//!
//! Glossary:
//! - *applied class*: a class the default mix plays as a hang a host sees
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
    /// The detection latency the job model takes, with its note, and a
    /// note on the hangs' it does not use: the mean over the failures of
    /// the default mix's applied classes not quarantined before they
    /// struck; an error if none was measured.
    pub(super) fn hang_detection(&self) -> Result<(f64, Vec<String>), String> {
        let mix = Mix::default();
        let applied = applied_classes(&mix);
        let (of_applied, others): (Vec<&FailureOutcome>, Vec<&FailureOutcome>) = self
            .failures
            .iter()
            .partition(|f| applied.contains(&f.failure.class));
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
            "detection_s: the mean, over the {} failures of the classes the default mix plays as hangs a host sees ({}: {}) not quarantined before they struck, of the time from the failure's start (its XID, or the first sample it misses) to the quarantine verdict in the replay ({how}). The job model applies it to those classes only (one it plays as a crash stops the job at once); over all {} failures, crashes quarantined on their XID included, the mean is {:.3} s. The driver's own delay in delivering an XID is not in the traces.",
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
