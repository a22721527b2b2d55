//! Power limits: read what the GPUs have, put the arbiter's targets in
//! force and read them back (retrying failures), and put the defaults back
//! at exit.

use loopwarden_protocol::{Event, TimestampMs};

use super::{Agent, RETRY_MS};

impl Agent {
    /// Reads every GPU's limit as it is now.
    pub(super) async fn read_applied(&mut self) {
        let deadline = self.config.deadline;
        for i in 0..self.gpus.len() {
            match self.workers[i].read_limit(deadline).await {
                Ok(w) => {
                    // Anything but the default was set by someone: ours to
                    // restore at exit.
                    self.gpus[i].applied = Some(w);
                    self.gpus[i].changed = w != self.gpus[i].info.default_limit;
                }
                Err(e) => tracing::warn!("GPU {i}: cannot read its power limit ({e})"),
            }
        }
    }

    /// Puts the targets in force; returns the GPUs that failed and why. A
    /// target that failed is tried again after [`RETRY_MS`] (at once when
    /// `force`, for a command that waits for its ack). A `cap_applied`
    /// event goes out when the limit read back, or who set it, changes.
    pub(super) async fn reconcile(
        &mut self,
        now: TimestampMs,
        force: bool,
    ) -> Vec<(usize, String)> {
        let (failures, events) = self.reconcile_quietly(force).await;
        for ev in events {
            self.emit(ev, now).await;
        }
        failures
    }

    /// As [`Self::reconcile`], returning the `cap_applied` events instead
    /// of emitting them (a command's ack goes out first: it then waits for
    /// no event's flash write).
    pub(super) async fn reconcile_quietly(
        &mut self,
        force: bool,
    ) -> (Vec<(usize, String)>, Vec<Event>) {
        let mut events = Vec::new();
        // Leases lapse and retries wait on steady time: a step of the
        // wall clock neither hurries nor holds them off.
        let steady = self.clock.steady().0;
        let targets = self.core.targets(TimestampMs(steady));
        let deadline = self.config.deadline;
        let mut failures = Vec::new();
        for t in targets {
            let i = t.gpu.get() as usize;
            let g = &mut self.gpus[i];
            if g.applied == Some(t.limit) {
                g.retry = None;
                if g.source != t.source {
                    g.source = t.source;
                    events.push(Event::CapApplied {
                        gpu: t.gpu,
                        limit: t.limit,
                        source: t.source,
                    });
                }
                continue;
            }
            if !force
                && g.retry
                    .is_some_and(|(target, at)| target == t.limit && steady < at)
            {
                continue;
            }
            let w = &self.workers[i];
            let set = w.set_limit(t.limit, deadline).await;
            let back = w.read_limit(deadline).await;
            let g = &mut self.gpus[i];
            let before = (g.applied, g.source);
            let why = match (&set, &back) {
                (Ok(()), Ok(b)) if *b == t.limit => None,
                (Err(e), Ok(b)) => Some(format!(
                    "GPU {i}: setting {} W: {e}; {} W stays in force",
                    t.limit.0, b.0
                )),
                (Ok(()), Ok(b)) => Some(format!(
                    "GPU {i}: set {} W but reads back {} W",
                    t.limit.0, b.0
                )),
                (_, Err(e)) => Some(format!(
                    "GPU {i}: limit not confirmed, read-back failed: {e}"
                )),
            };
            match back {
                Ok(b) => {
                    g.applied = Some(b);
                    g.changed = b != g.info.default_limit;
                    g.source = if b == t.limit { t.source } else { None };
                }
                Err(_) => {
                    // The set may have taken: restore the default at exit.
                    g.applied = None;
                    g.changed = true;
                }
            }
            if let Some(why) = why {
                // Said once per target, not every sample.
                if g.retry.is_none_or(|(target, _)| target != t.limit) {
                    tracing::error!("{why}");
                }
                g.retry = Some((t.limit, steady + RETRY_MS));
                failures.push((i, why));
            } else {
                g.retry = None;
            }
            if let Some(limit) = g.applied {
                if (g.applied, g.source) != before {
                    events.push(Event::CapApplied {
                        gpu: t.gpu,
                        limit,
                        source: g.source,
                    });
                }
            }
        }
        (failures, events)
    }

    pub(super) async fn restore_defaults(&mut self) {
        let deadline = self.config.deadline;
        let now = self.clock.wall();
        for i in 0..self.gpus.len() {
            let default = self.gpus[i].info.default_limit;
            if !self.gpus[i].changed || self.gpus[i].applied == Some(default) {
                continue;
            }
            let w = &self.workers[i];
            let set = w.set_limit(default, deadline).await;
            let back = w.read_limit(deadline).await;
            match (set, back) {
                (Ok(()), Ok(b)) if b == default => {
                    self.gpus[i].applied = Some(b);
                    self.emit(
                        Event::CapApplied {
                            gpu: Self::gpu_index(i),
                            limit: b,
                            source: None,
                        },
                        now,
                    )
                    .await;
                }
                (set, back) => tracing::error!(
                    "GPU {i}: default limit {} W not restored (set: {set:?}, read back: {back:?})",
                    default.0
                ),
            }
        }
    }
}
