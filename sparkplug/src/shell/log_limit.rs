//! The bridge's log limiter: at most one line per source and minute, a
//! flood counted rather than logged line by line, and the last
//! refused-fields notice of a host held back logged once its minute ends.
//!
//! Glossary:
//! - *source*: what a line is limited by (a topic and sender, a host's
//!   fields, all NCMD refusals).
//! - *held*: a line not logged now, counted in the next one.

use std::collections::HashMap;

use tracing::warn;

/// The least time between two log lines of one kind of refusal from one
/// source, ms: a flood is counted, not logged line by line.
pub(super) const LOG_EVERY_MS: u64 = 60_000;

/// The most sources the log limiter tracks one by one; past that, new
/// sources share one line per [`LOG_EVERY_MS`].
pub(super) const LOG_SOURCES: usize = 1024;

/// At most one log line per source and [`LOG_EVERY_MS`]; the lines held
/// back are counted in the next one. Past [`LOG_SOURCES`] sources (each
/// sender named in a frame is one, and costs a forger nothing), the
/// sources not tracked share one line per [`LOG_EVERY_MS`], so a flood
/// from many sources is logged no more than from one.
#[derive(Default)]
pub(super) struct LogLimit {
    /// Per source: when it was last logged, and the lines held since.
    sources: HashMap<String, (u64, u64)>,
    /// The untracked sources: when their shared line went out, and the
    /// lines held since.
    others: Option<(u64, u64)>,
    /// Per host (at most [`LOG_SOURCES`]): the last refused-fields
    /// notice held back, when it came, and when its host's window ends:
    /// logged then ([`LogLimit::fields_due`]), since the core says which
    /// fields are refused only when that changes.
    fields_held: HashMap<String, HeldFields>,
}

/// A refused-fields notice held back: why, when it came, when it may go.
struct HeldFields {
    why: String,
    at: u64,
    due: u64,
}

/// A refused-fields line to log: the host, why, the lines held back
/// since its last, and how long ago the notice came (0: now).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct FieldsLine {
    pub(super) device: String,
    pub(super) why: String,
    pub(super) held_back: u64,
    pub(super) noticed_ms_ago: u64,
}

/// What [`LogLimit::allow`] lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Allow {
    /// This source's line, with the count of its lines held back since
    /// its last.
    Line(u64),
    /// One line for every source not tracked, with the count of their
    /// lines held back since the last such line.
    Others(u64),
    /// Nothing now: counted in the next line.
    Held,
}

impl LogLimit {
    /// Whether `source` may log now, and how.
    pub(super) fn allow(&mut self, source: String, now: u64) -> Allow {
        let recent = |at: u64| now.saturating_sub(at) < LOG_EVERY_MS;
        if self.sources.len() >= LOG_SOURCES && !self.sources.contains_key(&source) {
            // Sources quiet for a window are forgotten, their held lines
            // going to the shared count.
            let mut forgotten = 0;
            self.sources.retain(|_, (at, held)| {
                let keep = recent(*at);
                if !keep {
                    forgotten += *held;
                }
                keep
            });
            if forgotten > 0 {
                self.others.get_or_insert((0, 0)).1 += forgotten;
            }
        }
        if self.sources.len() >= LOG_SOURCES && !self.sources.contains_key(&source) {
            return match self.others.as_mut() {
                Some((at, held)) if recent(*at) => {
                    *held += 1;
                    Allow::Held
                }
                Some((at, held)) => {
                    *at = now;
                    Allow::Others(std::mem::take(held))
                }
                None => {
                    self.others = Some((now, 0));
                    Allow::Others(0)
                }
            };
        }
        match self.sources.get_mut(&source) {
            Some((at, held)) if recent(*at) => {
                *held += 1;
                Allow::Held
            }
            Some((at, held)) => {
                *at = now;
                Allow::Line(std::mem::take(held))
            }
            None => {
                self.sources.insert(source, (now, 0));
                Allow::Line(0)
            }
        }
    }
}

impl LogLimit {
    /// When the window of `source`, held back now, ends.
    fn window_end(&self, source: &str) -> u64 {
        let at = match self.sources.get(source) {
            Some((at, _)) => *at,
            None => self.others.map_or(0, |(at, _)| at),
        };
        at.saturating_add(LOG_EVERY_MS)
    }

    /// A host's refused fields noticed at `now`: its line if the limit
    /// lets it through; else held, the last one per host, until its
    /// window ends ([`LogLimit::fields_due`]).
    pub(super) fn fields(&mut self, device: String, why: String, now: u64) -> Option<FieldsLine> {
        let source = format!("fields {device}");
        match self.allow(source.clone(), now) {
            Allow::Line(held_back) | Allow::Others(held_back) => {
                self.fields_held.remove(&device);
                Some(FieldsLine {
                    device,
                    why,
                    held_back,
                    noticed_ms_ago: 0,
                })
            }
            Allow::Held => {
                let due = self.window_end(&source);
                if self.fields_held.len() < LOG_SOURCES || self.fields_held.contains_key(&device) {
                    let held = HeldFields { why, at: now, due };
                    self.fields_held.insert(device, held);
                }
                None
            }
        }
    }

    /// The held refused-fields notices whose host's window has ended by
    /// `now`, as lines (their `held_back` not counting the line itself).
    pub(super) fn fields_due(&mut self, now: u64) -> Vec<FieldsLine> {
        let due: Vec<String> = (self.fields_held.iter())
            .filter(|(_, h)| now >= h.due)
            .map(|(d, _)| d.clone())
            .collect();
        let mut lines = Vec::new();
        for device in due {
            let Some(mut held) = self.fields_held.remove(&device) else {
                continue;
            };
            let source = format!("fields {device}");
            match self.allow(source.clone(), now) {
                Allow::Line(held_back) | Allow::Others(held_back) => lines.push(FieldsLine {
                    device,
                    why: held.why,
                    held_back: held_back.saturating_sub(1),
                    noticed_ms_ago: now.saturating_sub(held.at),
                }),
                Allow::Held => {
                    // Untracked, and the others' line went out since.
                    held.due = self.window_end(&source);
                    self.fields_held.insert(device, held);
                }
            }
        }
        lines
    }
}

/// Logs a refused-fields line.
pub(super) fn warn_fields(line: FieldsLine) {
    let FieldsLine {
        device,
        why,
        held_back,
        noticed_ms_ago,
    } = line;
    warn!(
        %device, %why, held_back, noticed_s_ago = noticed_ms_ago / 1000,
        "GPU figures past any GPU's published null (bridge/fields_refused)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_refusals_from_one_source_is_logged_once_a_minute() {
        let mut log = LogLimit::default();
        assert_eq!(log.allow("a".into(), 0), Allow::Line(0));
        assert_eq!(log.allow("a".into(), 1), Allow::Held);
        assert_eq!(log.allow("b".into(), 1), Allow::Line(0), "another source");
        assert_eq!(log.allow("a".into(), LOG_EVERY_MS - 1), Allow::Held);
        assert_eq!(
            log.allow("a".into(), LOG_EVERY_MS),
            Allow::Line(2),
            "2 held back"
        );
    }

    #[test]
    fn a_flood_from_many_sources_is_one_line_a_minute_for_the_untracked() {
        let mut log = LogLimit::default();
        let lines = |log: &mut LogLimit, from: usize, to: usize, now: u64| {
            (from..to)
                .map(|i| log.allow(format!("s{i}"), now))
                .filter(|a| *a != Allow::Held)
                .count()
        };
        assert_eq!(lines(&mut log, 0, LOG_SOURCES, 0), LOG_SOURCES);
        // The table is full: new senders share one line, not one each.
        assert_eq!(log.allow("x0".into(), 1), Allow::Others(0));
        assert_eq!(lines(&mut log, LOG_SOURCES, 10 * LOG_SOURCES, 2), 0);
        assert_eq!(log.allow("s0".into(), 3), Allow::Held, "still tracked");
        assert_eq!(log.sources.len(), LOG_SOURCES, "bounded");
        let held = 9 * LOG_SOURCES as u64;
        assert_eq!(
            log.allow("x1".into(), LOG_EVERY_MS - 1),
            Allow::Held,
            "within the minute"
        );
        // A minute on, the quiet sources are forgotten (s0's held line
        // counted with the others), and a new one is tracked again.
        assert_eq!(log.allow("x2".into(), 4 + LOG_EVERY_MS), Allow::Line(0));
        assert_eq!(log.sources.len(), 1);
        assert_eq!(log.others, Some((1, held + 1 + 1)));
        let full = lines(&mut log, 0, LOG_SOURCES - 1, 5 + LOG_EVERY_MS);
        assert_eq!(full, LOG_SOURCES - 1, "the table fills again");
        assert_eq!(
            log.allow("x3".into(), 6 + LOG_EVERY_MS),
            Allow::Others(held + 2),
            "everything held back since, counted"
        );
    }
}
