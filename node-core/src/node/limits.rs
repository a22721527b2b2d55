//! Power limits: which GPUs to set (the arbiter's targets against what
//! each GPU was read back at, retrying failures), what a set and its read
//! back mean, and the defaults put back at the stop.
//!
//! Glossary:
//! - *applied*: the limit last read back from a GPU; the only value ever
//!   reported as in force.
//! - *source*: who a limit was set for (a lease's sender, the guard);
//!   `None` when nobody, or when the GPU holds another limit than asked.

use loopwarden_protocol::{CapSource, Event, GpuIndex, TimestampMs, Watts};

use super::{gpu_index, Effect, Level, Node, Now, RETRY_MS};

/// A limit for the shell to set, then read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetLimit {
    /// The GPU.
    pub gpu: u8,
    /// The limit.
    pub limit: Watts,
}

/// What became of a [`SetLimit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitResult {
    /// The GPU.
    pub gpu: u8,
    /// The limit asked for.
    pub limit: Watts,
    /// The set: `Err` says why it failed.
    pub set: Result<(), String>,
    /// The limit read back after it: `Err` says why it could not be read.
    pub back: Result<Watts, String>,
}

/// Limits handed to the shell, waiting for their results.
#[derive(Debug)]
pub(crate) struct Reconciling {
    /// Who each limit is set for.
    sources: Vec<(u8, Option<CapSource>)>,
    /// GPUs whose source changed with their limit already in force.
    changes: Vec<(GpuIndex, Watts, Option<CapSource>)>,
    /// The stop's restoration of the defaults.
    restoring: bool,
}

impl Node {
    /// Every GPU's limit as read at start or now and then: anything but
    /// the default was set by someone, and is put back at the stop.
    pub(super) fn limits_read(&mut self, read: &[Result<Watts, String>], out: &mut Vec<Effect>) {
        for (i, (r, g)) in read.iter().zip(self.gpus.iter_mut()).enumerate() {
            match r {
                Ok(w) => {
                    g.applied = Some(*w);
                    g.changed = *w != g.setup.default_limit;
                }
                Err(e) => out.push(Effect::Say(
                    Level::Warn,
                    format!("GPU {i}: cannot read its power limit ({e})"),
                )),
            }
        }
    }

    /// Puts the arbiter's targets in force: a limit already read back is
    /// left alone (a new source is said), one that failed waits
    /// [`RETRY_MS`] unless `force` (a command waits for its ack).
    pub(super) fn reconcile(&mut self, now: Now, force: bool, out: &mut Vec<Effect>) {
        // Leases lapse and retries wait on steady time: a step of the
        // wall clock neither hurries nor holds them off.
        let steady = now.steady.0;
        let mut changes = Vec::new();
        let mut sets = Vec::new();
        let mut sources = Vec::new();
        for t in self.commands.targets(TimestampMs(steady)) {
            let i = t.gpu.get();
            let g = &mut self.gpus[i as usize];
            if g.applied == Some(t.limit) {
                g.retry = None;
                if g.source != t.source {
                    g.source = t.source;
                    changes.push((t.gpu, t.limit, t.source));
                }
                continue;
            }
            let waits = g
                .retry
                .is_some_and(|(target, at)| target == t.limit && steady < at);
            if waits && !force {
                continue;
            }
            sets.push(SetLimit {
                gpu: i,
                limit: t.limit,
            });
            sources.push((i, t.source));
        }
        if sets.is_empty() {
            self.caps_applied(&changes, out);
        } else {
            self.reconciling = Some(Reconciling {
                sources,
                changes,
                restoring: false,
            });
            out.push(Effect::SetLimits(sets));
        }
    }

    /// The limits set and read back: what is in force now, each failure
    /// said once per target and retried later, and the `caps_applied`
    /// events of what changed.
    pub(super) fn limits_set(&mut self, now: Now, results: &[LimitResult], out: &mut Vec<Effect>) {
        let Some(r) = self.reconciling.take() else {
            return;
        };
        if r.restoring {
            return self.restored(results, out);
        }
        let mut changes = r.changes;
        for res in results {
            let i = res.gpu as usize;
            let Some(g) = self.gpus.get_mut(i) else {
                continue;
            };
            let source = r
                .sources
                .iter()
                .find(|(gpu, _)| *gpu == res.gpu)
                .and_then(|(_, s)| *s);
            let before = (g.applied, g.source);
            let why = failure(res);
            match res.back {
                Ok(b) => {
                    g.applied = Some(b);
                    g.changed = b != g.setup.default_limit;
                    g.source = if b == res.limit { source } else { None };
                }
                Err(_) => {
                    // The set may have taken: put the default back at the
                    // stop.
                    g.applied = None;
                    g.changed = true;
                }
            }
            if let Some(why) = why {
                // Said once per target, not every round.
                if g.retry.is_none_or(|(target, _)| target != res.limit) {
                    out.push(Effect::Say(Level::Error, why.clone()));
                }
                g.retry = Some((res.limit, now.steady.0 + RETRY_MS));
                if let Some(p) = self.pending.as_mut() {
                    p.failed(why);
                }
            } else {
                g.retry = None;
            }
            if let Some(limit) = g.applied {
                if (g.applied, g.source) != before {
                    changes.push((gpu_index(res.gpu), limit, g.source));
                }
            }
        }
        self.caps_applied(&changes, out);
    }

    /// At the stop: every GPU whose limit was changed is given back its
    /// default.
    pub(super) fn restore_defaults(&mut self, out: &mut Vec<Effect>) {
        let sets: Vec<SetLimit> = self
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| g.changed && g.applied != Some(g.setup.default_limit))
            .map(|(i, g)| SetLimit {
                gpu: i as u8,
                limit: g.setup.default_limit,
            })
            .collect();
        if sets.is_empty() {
            return;
        }
        self.reconciling = Some(Reconciling {
            sources: Vec::new(),
            changes: Vec::new(),
            restoring: true,
        });
        out.push(Effect::SetLimits(sets));
    }

    /// The defaults set back at the stop: each confirmed one is said in a
    /// `caps_applied` event, each other one in the log.
    fn restored(&mut self, results: &[LimitResult], out: &mut Vec<Effect>) {
        let mut changes = Vec::new();
        for res in results {
            let Some(g) = self.gpus.get_mut(res.gpu as usize) else {
                continue;
            };
            match (&res.set, &res.back) {
                (Ok(()), Ok(b)) if *b == res.limit => {
                    g.applied = Some(*b);
                    g.changed = false;
                    changes.push((gpu_index(res.gpu), *b, None));
                }
                (set, back) => out.push(Effect::Say(
                    Level::Error,
                    format!(
                        "GPU {}: default limit {} W not restored (set: {set:?}, read back: {back:?})",
                        res.gpu, res.limit.0
                    ),
                )),
            }
        }
        self.caps_applied(&changes, out);
    }

    /// The `caps_applied` events of `changes`: after the ack of a pending
    /// command, at once otherwise.
    fn caps_applied(
        &mut self,
        changes: &[(GpuIndex, Watts, Option<CapSource>)],
        out: &mut Vec<Effect>,
    ) {
        let events = caps_applied(changes);
        match self.pending.as_mut() {
            Some(p) => p.events.extend(events),
            None => out.extend(events.into_iter().map(Effect::Emit)),
        }
    }
}

/// Why a limit is not in force as asked, if it is not.
fn failure(res: &LimitResult) -> Option<String> {
    let i = res.gpu;
    let limit = res.limit.0;
    match (&res.set, &res.back) {
        (Ok(()), Ok(b)) if *b == res.limit => None,
        (Err(e), Ok(b)) => Some(format!(
            "GPU {i}: setting {limit} W: {e}; {} W stays in force",
            b.0
        )),
        (Ok(()), Ok(b)) => Some(format!("GPU {i}: set {limit} W but reads back {} W", b.0)),
        (_, Err(e)) => Some(format!(
            "GPU {i}: limit not confirmed, read-back failed: {e}"
        )),
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
