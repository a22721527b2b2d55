//! Power limits: read what the GPUs have, put the arbiter's targets in
//! force and read them back (retrying failures), and put the defaults back
//! at exit.

use loopwarden_protocol::message::CapSource;
use loopwarden_protocol::{Event, GpuIndex, TimestampMs, Watts};

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
    /// `force`, for a command that waits for its ack). A `caps_applied`
    /// event goes out when the limit read back, or who set it, changes:
    /// one for every GPU that changed to the same limit and source.
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

    /// As [`Self::reconcile`], returning the `caps_applied` events instead
    /// of emitting them (a command's ack goes out first: it then waits for
    /// no event's flash write).
    pub(super) async fn reconcile_quietly(
        &mut self,
        force: bool,
    ) -> (Vec<(usize, String)>, Vec<Event>) {
        let mut changes = Vec::new();
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
                    changes.push((t.gpu, t.limit, t.source));
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
                    changes.push((t.gpu, limit, g.source));
                }
            }
        }
        (failures, caps_applied(&changes))
    }

    pub(super) async fn restore_defaults(&mut self) {
        let deadline = self.config.deadline;
        let now = self.clock.wall();
        let mut restored = Vec::new();
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
                    restored.push((Self::gpu_index(i), b, None));
                }
                (set, back) => tracing::error!(
                    "GPU {i}: default limit {} W not restored (set: {set:?}, read back: {back:?})",
                    default.0
                ),
            }
        }
        for ev in caps_applied(&restored) {
            self.emit(ev, now).await;
        }
    }
}

/// One `caps_applied` event for each limit and source that some GPUs
/// changed to, in the order each first appears.
fn caps_applied(changes: &[(GpuIndex, Watts, Option<CapSource>)]) -> Vec<Event> {
    let mut events: Vec<Event> = Vec::new();
    for &(gpu, limit, source) in changes {
        let bit = 1u16 << gpu.get();
        let same = events.iter_mut().find_map(|e| match e {
            Event::CapsApplied {
                gpus,
                limit: l,
                source: s,
            } if *l == limit && *s == source => Some(gpus),
            _ => None,
        });
        match same {
            Some(gpus) => *gpus |= bit,
            None => events.push(Event::CapsApplied {
                gpus: bit,
                limit,
                source,
            }),
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(i: u8) -> GpuIndex {
        GpuIndex::new(i).unwrap()
    }

    #[test]
    fn gpus_changed_alike_make_one_event() {
        let lease = Some(CapSource::Cooling);
        let changes = [
            (gpu(0), Watts(500), lease),
            (gpu(3), Watts(700), None),
            (gpu(1), Watts(500), lease),
            (gpu(7), Watts(500), lease),
            (gpu(2), Watts(500), None),
        ];
        assert_eq!(
            caps_applied(&changes),
            [
                Event::CapsApplied {
                    gpus: 0b1000_0011,
                    limit: Watts(500),
                    source: lease
                },
                Event::CapsApplied {
                    gpus: 0b1000,
                    limit: Watts(700),
                    source: None
                },
                Event::CapsApplied {
                    gpus: 0b100,
                    limit: Watts(500),
                    source: None
                },
            ]
        );
        assert!(caps_applied(&[]).is_empty());
    }
}
