//! When every birth goes out again: a rebirth an NCMD asks for, or a
//! resync after dropped publishes, each held to its window, with no DATA
//! while births are due.

use super::{Bridge, BridgeConfig, Notice, Now, Publish, REBIRTH, REBIRTH_EVERY_MS, RESYNC_MAX_MS};
use std::collections::BTreeSet;

use crate::payload;
use loopwarden_protocol::Ident;

impl BridgeConfig {
    /// The topic of this edge node's commands (NCMD), the bridge's one
    /// Sparkplug subscription.
    pub fn ncmd_topic(&self) -> String {
        format!("spBv1.0/{}/NCMD/{}", self.group, self.edge_node)
    }
}

impl Bridge {
    pub(super) fn command(&mut self, now: Now, bytes: &[u8]) -> Vec<Publish> {
        // Clearing a retained NCMD is an empty retained publish, which the
        // broker hands to the bridge live: no request, and nothing wrong.
        if bytes.is_empty() {
            self.notify(Notice::EmptyCommand);
            return Vec::new();
        }
        let why = match payload::decode(bytes) {
            Err(e) => Some(format!("cannot be decoded: {e}")),
            Ok(p) if p.metrics.iter().any(is_rebirth) => None,
            Ok(_) => Some(format!("not {REBIRTH} = true")),
        };
        let no_session = || "no Sparkplug session: the next one's births answer it".to_string();
        if let Some(why) = why.or_else(|| (!self.session).then(no_session)) {
            self.counters.commands_refused += 1;
            self.notify(Notice::CommandRefused { why });
            return Vec::new();
        }
        let Some(due) = self.rebirth_due(now.mono) else {
            self.rebirth_at = Some(now.mono);
            return self.births(now);
        };
        self.counters.rebirths_limited += 1;
        if !self.rebirth_waiting {
            self.rebirth_waiting = true;
            let total = self.counters.rebirths_limited;
            let in_ms = due - now.mono;
            self.notify(Notice::RebirthsLimited { in_ms, total });
        }
        Vec::new()
    }

    /// An NCMD the broker kept retained: Sparkplug NCMDs are never
    /// retained, and the broker hands one over at every subscription, so
    /// taking it would send a second round of births at every connection
    /// (whose own births already answer it). Refused, saying how to clear it.
    pub(super) fn retained_command(&mut self, bytes: &[u8]) -> Vec<Publish> {
        let why = format!(
            "retained NCMD ({} bytes): Sparkplug NCMDs are never retained, and the broker \
             hands it over at every connection; clear it with an empty retained publish to {}",
            bytes.len(),
            self.config.ncmd_topic()
        );
        self.counters.commands_refused += 1;
        self.notify(Notice::CommandRefused { why });
        Vec::new()
    }

    /// The broker refused the NCMD subscription of the connection being
    /// made (before its `Connected`): its NBIRTH says so, and the shell
    /// logs it as an error, as the broker's ACL likely drops the births too.
    pub(super) fn ncmd_refused(&mut self) -> Vec<Publish> {
        self.counters.ncmd_refused = true;
        let topic = self.config.ncmd_topic();
        self.notify(Notice::NcmdRefused { topic });
        Vec::new()
    }

    /// When a rebirth asked at `now` (monotonic) may go out, if not now:
    /// the last one plus [`REBIRTH_EVERY_MS`]. A time before the last one
    /// does not hold a request back.
    pub(super) fn rebirth_due(&self, now: u64) -> Option<u64> {
        let last = self.rebirth_at?;
        let due = last.saturating_add(REBIRTH_EVERY_MS);
        (last <= now && now < due).then_some(due)
    }

    /// Publishes could not be queued (at `now`, monotonic): every birth
    /// is due again, and the deaths among them are said again. Drops
    /// within the window of the last births (those births, or what
    /// followed them, did not fit either) double the window, once per
    /// round of births however many sends dropped.
    pub(super) fn dropped(&mut self, now: u64, n: u64, deaths: &[String]) {
        self.counters.publishes_dropped += n;
        // A death a round of births said, dropped: not said.
        let dropped: BTreeSet<&str> = deaths.iter().map(String::as_str).collect();
        let said = |id: &Ident| dropped.contains(id.as_str());
        for (_, d) in self.devices.iter_mut().filter(|(id, _)| said(id)) {
            d.death_said = false;
        }
        if !self.session || self.resync {
            return;
        }
        self.resync = true;
        let window = self.resync_every_ms;
        if (self.rebirth_at).is_some_and(|l| l <= now && now < l.saturating_add(window)) {
            self.resync_every_ms = window.saturating_mul(2).min(RESYNC_MAX_MS);
        }
    }

    /// Whether births are due (a rebirth held back, or a resync): no
    /// DATA goes out meanwhile.
    pub(super) fn held(&self) -> bool {
        self.rebirth_waiting || self.resync
    }

    /// Every birth, when a held rebirth's or a resync's window is over.
    pub(super) fn births_due(&mut self, at: Now) -> Option<Vec<Publish>> {
        let now = at.mono;
        let rebirth = self.rebirth_waiting && self.rebirth_due(now).is_none();
        let window_over = |l: u64| now < l || now >= l.saturating_add(self.resync_every_ms);
        let resync = self.resync && self.rebirth_at.is_none_or(window_over);
        if !rebirth && !resync {
            if !self.resync && self.rebirth_at.is_some_and(window_over) {
                // A window without drops: the next drop is answered at once.
                self.resync_every_ms = REBIRTH_EVERY_MS;
            }
            return None;
        }
        self.rebirth_at = Some(now);
        Some(self.births(at))
    }
}

fn is_rebirth(m: &payload::Metric) -> bool {
    m.name.as_deref() == Some(REBIRTH) && m.value == Some(payload::MetricValue::Boolean(true))
}
