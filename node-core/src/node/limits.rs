//! Power limits: each GPU's ceiling (what the site left on it), which
//! GPUs to set (the arbiter's targets against what each GPU was read back
//! at, retrying failures), what a set and its read back mean, and what a
//! stop puts back.
//!
//! The ceiling is decided from the first limit read from a GPU: the limit
//! this agent left on it before a restart (its ceiling, the last limit it
//! asked for, or the one before: see [`KeptLimit`]) keeps the kept
//! ceiling; any other limit was set by someone else and is the ceiling
//! now. A limit found later that differs from the one last read back was
//! set by someone else too: every GPU's limit is read before any is set
//! and at the stop, so such a limit is seen before a set would overwrite
//! it. Either way a configured site limit stays above it all: the
//! ceiling never exceeds it.
//!
//! Glossary:
//! - *applied*: the limit last read back from a GPU; the only value ever
//!   reported as in force.
//! - *source*: who a limit was set for (a lease's sender, the guard);
//!   `None` when nobody, or when the GPU holds another limit than asked.
//! - *ceiling*: the limit a GPU runs at uncapped; never exceeded.

use loopwarden_protocol::{CapSource, Event, GpuIndex, TimestampMs, Watts};
use serde::{Deserialize, Serialize};

use super::{gpu_index, Effect, GpuCaps, GpuSetup, Level, Node, Now, RETRY_MS};

/// What the flash keeps of one GPU's limits, written before every set:
/// whichever of its three limits a restart finds on the GPU, the agent
/// left it there, and the ceiling holds; any other limit is someone
/// else's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptLimit {
    /// The GPU's ceiling.
    pub ceiling: Watts,
    /// The limit last asked for.
    pub asked: Watts,
    /// The limit read back before that ask (`None`: not known).
    pub before: Option<Watts>,
}

impl KeptLimit {
    /// Whether `found` is a limit the agent may have left on the GPU.
    fn left(&self, found: Watts) -> bool {
        found == self.ceiling || found == self.asked || Some(found) == self.before
    }
}

/// `w` as a ceiling of the GPU set up as `g`: within its settable range
/// and never above the site's configured limit.
pub(super) fn within(g: &GpuSetup, w: Watts) -> Watts {
    let w = g.site_limit.map_or(w, |site| w.min(site));
    w.min(g.range.max).max(g.range.min)
}

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

/// What waits for a read of every GPU's limit ([`Effect::ReadLimits`])
/// asked before setting any.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AfterRead {
    /// Put the targets in force (`force`: see [`Node::reconcile`]).
    Reconcile { force: bool },
    /// The stop.
    Stop,
}

impl GpuCaps {
    /// Whether a set of `limit` that failed waits for its retry at
    /// `steady`.
    fn waits(&self, limit: Watts, steady: u64) -> bool {
        self.retry
            .is_some_and(|(target, at)| target == limit && steady < at)
    }
}

/// Limits handed to the shell, waiting for their results.
#[derive(Debug)]
pub(crate) struct Reconciling {
    /// Who each limit is set for.
    sources: Vec<(u8, Option<CapSource>)>,
    /// GPUs whose source changed with their limit already in force.
    changes: Vec<(GpuIndex, Watts, Option<CapSource>)>,
    /// The stop's restoration of the ceilings.
    restoring: bool,
}

impl Node {
    /// Every GPU's limit as read at start or now and then: the first one
    /// read decides the GPU's ceiling (kept in flash at once where nothing
    /// was kept: a limit set while the agent is stopped is then told from
    /// its own), a later one that is not the limit last read back was set
    /// by someone else and is the new ceiling.
    pub(super) fn limits_read(&mut self, read: &[Result<Watts, String>], out: &mut Vec<Effect>) {
        let mut moved = Vec::new();
        let mut unkept = false;
        for (i, (r, g)) in read.iter().zip(self.gpus.iter_mut()).enumerate() {
            let found = match r {
                Ok(w) => *w,
                Err(e) => {
                    out.push(Effect::Say(
                        Level::Warn,
                        format!(
                            "GPU {i}: cannot read its power limit ({e}); its uncapped limit stays {} W",
                            g.ceiling.0
                        ),
                    ));
                    continue;
                }
            };
            let was = g.ceiling;
            unkept |= !g.ceiling_read && g.kept.is_none();
            let changed = match (g.ceiling_read, g.applied) {
                (false, _) => first_ceiling(i, g, found, out),
                (true, Some(a)) if a != found => {
                    g.ceiling = within(&g.setup, found);
                    out.push(Effect::Say(
                        Level::Warn,
                        format!(
                            "GPU {i}: its power limit was changed outside the agent ({} W to {} W)",
                            a.0, found.0
                        ),
                    ));
                    g.ceiling != was
                }
                _ => false,
            };
            g.ceiling_read = true;
            g.applied = Some(found);
            self.commands.set_ceiling(gpu_index(i as u8), g.ceiling);
            if changed {
                moved.push((gpu_index(i as u8), g.ceiling, was));
            }
        }
        if !moved.is_empty() || unkept {
            out.push(Effect::KeepLimits(self.kept_limits()));
        }
        out.extend(power_ceiling(&moved).into_iter().map(Effect::Emit));
    }

    /// What the flash is to keep of every GPU: its ceiling and the limit
    /// last read back.
    fn kept_limits(&self) -> Vec<KeptLimit> {
        self.kept_asking(&[])
    }

    /// As [`Node::kept_limits`], with the limits of `sets` asked for now.
    fn kept_asking(&self, sets: &[SetLimit]) -> Vec<KeptLimit> {
        self.gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let asked = sets.iter().find(|s| s.gpu as usize == i).map(|s| s.limit);
                KeptLimit {
                    ceiling: g.ceiling,
                    asked: asked.or(g.applied).unwrap_or(g.ceiling),
                    before: g.applied,
                }
            })
            .collect()
    }

    /// Puts the arbiter's targets in force, as [`Node::put_in_force`]
    /// does, after a read of every GPU's limit when one is to be set: a
    /// limit an administrator set since the last read is seen (the new
    /// ceiling) before a set overwrites it.
    pub(super) fn reconcile(&mut self, now: Now, force: bool, out: &mut Vec<Effect>) {
        let steady = now.steady.0;
        let sets = self.commands.targets(TimestampMs(steady)).iter().any(|t| {
            let g = &self.gpus[t.gpu.get() as usize];
            g.applied != Some(t.limit) && (force || !g.waits(t.limit, steady))
        });
        if sets {
            self.after_read = Some(AfterRead::Reconcile { force });
            out.push(Effect::ReadLimits);
        } else {
            self.put_in_force(now, force, out);
        }
    }

    /// Every GPU's limit was read ([`Node::limits_read`]): what waited
    /// for it goes on.
    pub(super) fn read_done(&mut self, now: Now, out: &mut Vec<Effect>) {
        match self.after_read.take() {
            Some(AfterRead::Stop) => self.stopping(now, out),
            Some(AfterRead::Reconcile { force }) => self.put_in_force(now, force, out),
            None => self.put_in_force(now, false, out),
        }
    }

    /// Puts the arbiter's targets in force: a limit already read back is
    /// left alone (a new source is said), one that failed waits
    /// [`RETRY_MS`] unless `force` (a command waits for its ack).
    fn put_in_force(&mut self, now: Now, force: bool, out: &mut Vec<Effect>) {
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
            if g.waits(t.limit, steady) && !force {
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
            out.push(Effect::KeepLimits(self.kept_asking(&sets)));
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
                    g.source = if b == res.limit { source } else { None };
                }
                Err(_) => {
                    // The set may have taken: the ceiling goes back at
                    // the stop.
                    g.applied = None;
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

    /// The stop reads every GPU's limit first: a limit an administrator
    /// set since the last read is the ceiling put back, or kept in flash
    /// for the next start (see [`Node::stopping`]).
    pub(super) fn stop(&mut self, out: &mut Vec<Effect>) {
        self.after_read = Some(AfterRead::Stop);
        out.push(Effect::ReadLimits);
    }

    /// At the stop, the limits read: with a lease in force the limits
    /// stay (the leases are in flash, and the next start applies or lifts
    /// them: a restart in a cooling emergency never runs the GPUs
    /// uncapped); with none, every GPU not at its ceiling is given it
    /// back.
    fn stopping(&mut self, now: Now, out: &mut Vec<Effect>) {
        self.commands.targets(now.steady);
        let leases = self.commands.leases().len();
        if leases > 0 {
            out.push(Effect::Say(
                Level::Info,
                format!(
                    "stopping with {leases} lease(s) in force: the power limits stay as they are, for the next start to keep or lift"
                ),
            ));
            return;
        }
        let sets: Vec<SetLimit> = self
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| g.applied != Some(g.ceiling))
            .map(|(i, g)| SetLimit {
                gpu: i as u8,
                limit: g.ceiling,
            })
            .collect();
        if sets.is_empty() {
            return;
        }
        out.push(Effect::KeepLimits(self.kept_asking(&sets)));
        self.reconciling = Some(Reconciling {
            sources: Vec::new(),
            changes: Vec::new(),
            restoring: true,
        });
        out.push(Effect::SetLimits(sets));
    }

    /// The ceilings set back at the stop: each confirmed one is said in a
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
                    changes.push((gpu_index(res.gpu), *b, None));
                }
                (set, back) => out.push(Effect::Say(
                    Level::Error,
                    format!(
                        "GPU {}: uncapped limit {} W not restored (set: {set:?}, read back: {back:?})",
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

/// The ceiling of GPU `i` (set up as `g`) from the first limit read from
/// it, `found`; whether it moved from a kept one.
fn first_ceiling(i: usize, g: &mut GpuCaps, found: Watts, out: &mut Vec<Effect>) -> bool {
    let was = g.ceiling;
    match g.kept {
        Some(k) if k.left(found) => {
            g.ceiling = within(&g.setup, k.ceiling);
            return g.ceiling != was;
        }
        Some(k) => {
            g.ceiling = within(&g.setup, found);
            out.push(Effect::Say(
                Level::Warn,
                format!(
                    "GPU {i}: found at {} W, not a limit the agent left on it ({} W uncapped, {} W asked): set outside the agent while it was stopped; uncapped limit now {} W",
                    found.0, k.ceiling.0, k.asked.0, g.ceiling.0
                ),
            ));
        }
        None => {
            g.ceiling = within(&g.setup, found);
            out.push(Effect::Say(
                Level::Info,
                format!(
                    "GPU {i}: uncapped limit {} W (found at {} W{})",
                    g.ceiling.0,
                    found.0,
                    g.setup
                        .site_limit
                        .map_or(String::new(), |s| format!("; site limit {} W", s.0))
                ),
            ));
            // Nothing was known before: no change to announce.
            return false;
        }
    }
    g.ceiling != was
}

/// One `power_ceiling` event for each ceiling and former ceiling that
/// some GPUs moved between.
fn power_ceiling(moved: &[(GpuIndex, Watts, Watts)]) -> Vec<Event> {
    alike(
        moved
            .iter()
            .map(|&(gpu, ceiling, was)| (gpu, (ceiling, was))),
    )
    .into_iter()
    .map(|(gpus, (ceiling, was))| Event::PowerCeiling { gpus, ceiling, was })
    .collect()
}

/// The GPUs of `changes` grouped by what changed, as bit sets, in the
/// order each change first appears.
fn alike<K: PartialEq>(changes: impl Iterator<Item = (GpuIndex, K)>) -> Vec<(u16, K)> {
    let mut sets: Vec<(u16, K)> = Vec::new();
    for (gpu, k) in changes {
        let bit = 1u16 << gpu.get();
        match sets.iter_mut().find(|(_, s)| *s == k) {
            Some((gpus, _)) => *gpus |= bit,
            None => sets.push((bit, k)),
        }
    }
    sets
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
    alike(
        changes
            .iter()
            .map(|&(gpu, limit, source)| (gpu, (limit, source))),
    )
    .into_iter()
    .map(|(gpus, (limit, source))| Event::CapsApplied {
        gpus,
        limit,
        source,
    })
    .collect()
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
