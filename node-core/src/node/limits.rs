//! Power limits: each GPU's ceiling (what the site left on it), which
//! GPUs to set (the arbiter's targets against what each GPU was read back
//! at, retrying failures), what a set and its read back mean, and what a
//! stop puts back.
//!
//! The ceiling is decided from the first limit read from a GPU: the limit
//! this agent left on it before a restart (its ceiling, the last limit it
//! asked for, or the one before: see [`KeptLimit`]) keeps the kept
//! ceiling; any other limit was set by someone else and is the ceiling
//! now. A GPU whose kept limits could not be read (a damaged record, a
//! lost config store) takes the first limit read as its ceiling too, said
//! as an error: it may be a cap left in force. A limit found later that differs from the one last read back was
//! set by someone else too: every GPU's limit is read before any is set
//! and at the stop, so such a limit is seen before a set would overwrite
//! it. Either way a configured site limit stays above it all: the
//! ceiling never exceeds it. A limit found below the GPU's lowest cap is
//! never raised: it is the ceiling, and the lowest cap while it holds
//! (said). A sample that sees a limit in force above the one read back
//! (one raised since) has every GPU's limit read at that round's end,
//! not at the next periodic read.
//!
//! A set read back at the limit asked is in force, whatever the set
//! answered (one past its deadline that took all the same is said).
//!
//! A GPU whose limit could not be read in that read is set only to a
//! limit no higher than the lowest the agent may have left on it (a cap
//! goes down: safety wins, even over a limit set since the last good
//! read, unseen); a raise waits [`RETRY_MS`] for a good read, said once
//! per target, as a failed set does (it could overwrite an
//! administrator's lower limit unseen). After a failed read-back the
//! agent may have left any limit asked since the last good read (a set
//! past its deadline may land after a later one never made) or the one
//! read before them: a later read finding none of them finds an
//! administrator's. A GPU not read since the start keeps what the flash
//! kept for it in every write of the limits until it is read, and nothing
//! is kept for one with nothing kept. A set on a GPU whose ceiling was
//! never read has its limit read just before it ([`SetLimit::read_first`]):
//! that read decides the ceiling before the set's read-back is judged, and
//! a limit found below the one to set is left as it is.
//!
//! Glossary:
//! - *applied*: the limit last read back from a GPU; the only value ever
//!   reported as in force.
//! - *left*: a limit the agent may have left on a GPU: the one read back,
//!   or, after failed read-backs, those asked since or the one read
//!   before them.
//! - *source*: who a limit was set for (a lease's sender, the guard);
//!   `None` when nobody (the GPU at its ceiling or above). A set read
//!   back at another limit than asked leaves the source as it was where
//!   the limit did not change, and below the ceiling names the cap's.
//! - *ceiling*: the limit a GPU runs at uncapped; never exceeded.

use loopwarden_protocol::{CapSource, Event, GpuIndex, TimestampMs, Watts};
use serde::{Deserialize, Serialize};

use super::{gpu_index, Effect, GpuCaps, GpuSetup, Level, Node, Now, RETRY_MS};
use crate::caps::GpuRange;

mod ceiling;
mod range;
mod reads;
mod stop;
mod unconfirmed;

pub(crate) use unconfirmed::Unconfirmed;
use unconfirmed::ASKED_MAX;

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
/// and never above the site's configured limit; but a limit `w` below
/// its lowest cap stays as it is (never raised), and the lowest cap comes
/// down to it ([`GpuCaps::min_cap`]).
pub(super) fn within(g: &GpuSetup, w: Watts) -> Watts {
    let capped = g.site_limit.map_or(w, |site| w.min(site));
    capped.min(g.range.max).max(g.range.min.min(w))
}

/// A limit for the shell to set, then read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetLimit {
    /// The GPU.
    pub gpu: u8,
    /// The limit.
    pub limit: Watts,
    /// Its ceiling was never read from it: its limit is read just before
    /// the set ([`LimitResult::first`]), and the set is not made where
    /// that read finds a lower limit (an administrator's, which the set
    /// would raise).
    pub read_first: bool,
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
    /// The limit read just before it, where [`SetLimit::read_first`]
    /// asked (`None`: not asked).
    pub first: Option<Result<Watts, String>>,
    /// The GPU's settable range where the set learned it (NVML's limit
    /// constraints, unread at the start, read after it refused the
    /// limit): the GPU's from now on ([`Node::set_range`]), before the
    /// read-back is judged.
    pub range: Option<GpuRange>,
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
    /// The lowest limit the GPU is capped to: its configured lowest cap,
    /// or its ceiling where that is lower (a limit found below it is
    /// never raised).
    pub(super) fn min_cap(&self) -> Watts {
        self.setup.range.min.min(self.ceiling)
    }

    /// Whether a set of `limit` that failed waits for its retry at
    /// `steady`.
    fn waits(&self, limit: Watts, steady: u64) -> bool {
        self.retry
            .is_some_and(|(target, at)| target == limit && steady < at)
    }

    /// Whether `found` is a limit the agent asked for and may have left
    /// on the GPU: one not read back yet, or one read back as asked. Not a
    /// limit read back after a set that did not take, which was the GPU's
    /// before it (a cap that later comes out at that limit asks no set,
    /// and does not make it the agent's).
    fn asked_since_start(&self, found: Watts) -> bool {
        match (self.applied, self.unconfirmed) {
            (Some(a), _) => a == found && self.asked_back,
            (None, Some(u)) => u.asked().contains(&found),
            (None, None) => false,
        }
    }

    /// Whether `found` is a limit the agent may have left on the GPU.
    fn left(&self, found: Watts) -> bool {
        match (self.applied, self.unconfirmed) {
            (Some(a), _) => a == found,
            (None, Some(u)) => u.left(found),
            (None, None) => false,
        }
    }

    /// The lowest limit the agent may have left on the GPU (`None`: not
    /// known); before its first read, the lowest of those kept in flash.
    fn lowest_left(&self) -> Option<Watts> {
        match (self.applied, self.unconfirmed, self.kept) {
            (Some(a), ..) => Some(a),
            (None, Some(u), _) => u.lowest(),
            (None, None, Some(k)) if !self.ceiling_read => {
                Some(k.before.map_or(k.asked, |b| b.min(k.asked)).min(k.ceiling))
            }
            (None, None, _) => None,
        }
    }

    /// Whether `limit` may be set with the GPU's limit not read just
    /// now: only a cap that goes down from every limit the agent may have
    /// left on it (a raise could overwrite an administrator's lower
    /// limit unseen).
    fn settable_unread(&self, limit: Watts) -> bool {
        self.lowest_left().is_some_and(|low| limit <= low)
    }

    /// Why `limit` is not set with the GPU's limit not read, in words.
    fn unread_raise(&self, limit: Watts) -> String {
        match self.lowest_left() {
            Some(low) => format!(
                "its power limit could not be read, and {} W is above {} W, the lowest the agent may have left on it",
                limit.0, low.0
            ),
            None => "its power limit could not be read, and no limit the agent left on it is known"
                .to_string(),
        }
    }

    /// The limits the agent may have left on the GPU, in words.
    fn left_words(&self) -> String {
        match (self.applied, self.unconfirmed) {
            (Some(a), _) => format!("{} W", a.0),
            (None, Some(u)) => u.words(),
            (None, None) => "not known".to_string(),
        }
    }
}

/// Whether GPU `i`'s limit was read just now (`read`: one flag per GPU,
/// in index order; a GPU missing from it was not).
fn was_read(read: &[bool], i: usize) -> bool {
    read.get(i).copied().unwrap_or(false)
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
    /// The limits kept for GPU `gpu` before the restart, read once it
    /// said its UUID (none could be matched to it at start). Where its
    /// limits were not read yet, as at a start ([`Node::restore_limit`]);
    /// where the limit found on it (its ceiling since) is one the agent
    /// left, that was a cap left in force: the kept ceiling is its ceiling
    /// again, said. Whether the ceiling moved (the caller keeps the limits,
    /// then puts the targets in force).
    pub(super) fn identified_limit(
        &mut self,
        gpu: u8,
        kept: KeptLimit,
        out: &mut Vec<Effect>,
    ) -> bool {
        let Some(g) = self.gpus.get_mut(gpu as usize) else {
            return false;
        };
        if !g.ceiling_read {
            self.restore_limit(gpu, kept);
            return false;
        }
        g.kept = Some(kept);
        let was = g.ceiling;
        if !kept.left(was) {
            return false;
        }
        g.ceiling = within(&g.setup, kept.ceiling);
        if g.ceiling == was {
            return false;
        }
        let index = gpu_index(gpu);
        self.commands.set_ceiling(index, g.ceiling);
        out.push(Effect::Say(
            Level::Info,
            format!(
                "GPU {gpu}: uncapped limit {} W again, as kept before the restart (the {} W found on it was a cap the agent left)",
                g.ceiling.0, was.0
            ),
        ));
        out.extend(
            power_ceiling(&[(index, g.ceiling, was)])
                .into_iter()
                .map(Effect::Emit),
        );
        true
    }

    /// What the flash is to keep of every GPU: its ceiling and the limit
    /// last read back; nothing for a GPU never read with nothing kept for
    /// it (its ceiling is only the default or the site's then: kept, a
    /// restart would take it for one read from the GPU, and a cap of the
    /// agent's found on it for the agent's own under it).
    pub(super) fn kept_limits(&self) -> Vec<Option<KeptLimit>> {
        self.kept_asking(&[])
    }

    /// As [`Node::kept_limits`], with the limits of `sets` asked for now
    /// (after a failed read-back, the limit asked then and the one read
    /// before it stand for the last asked and the last read).
    fn kept_asking(&self, sets: &[SetLimit]) -> Vec<Option<KeptLimit>> {
        self.gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                if !g.ceiling_read && g.kept.is_none() {
                    return None;
                }
                let asking = sets.iter().find(|s| s.gpu as usize == i).map(|s| s.limit);
                let (asked, before) = match (asking, g.applied, g.unconfirmed, g.kept) {
                    (_, Some(a), ..) => (asking.unwrap_or(a), Some(a)),
                    // The same asked again (a retry): the one before it
                    // stays beside it.
                    (Some(new), None, Some(u), _) if new == u.last() => {
                        let other = u.asked().iter().rev().copied().find(|&w| w != new);
                        (new, u.read().or(other))
                    }
                    (Some(new), None, Some(u), _) => (new, Some(u.last())),
                    (None, None, Some(u), _) => (u.last(), u.read()),
                    // Not read since the start: what was kept holds until
                    // a read (it may be on the GPU still); a set now asks
                    // another, and the one kept that is not the ceiling
                    // stays beside it.
                    (None, None, None, Some(k)) if !g.ceiling_read => match asking {
                        None => (k.asked, k.before),
                        Some(new) if k.asked == k.ceiling => (new, k.before),
                        Some(new) => (new, Some(k.asked)),
                    },
                    (_, None, None, _) => (asking.unwrap_or(g.ceiling), None),
                };
                Some(KeptLimit {
                    ceiling: g.ceiling,
                    asked,
                    before,
                })
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
            // Nothing to set: no GPU was read, none is set.
            self.put_in_force(now, force, &[], out);
        }
    }

    /// A raise of GPU `i` to `limit` not made, its limit not read just
    /// now: tried again after [`RETRY_MS`] (at once for a command), with a
    /// read first; said once per target, and in a pending command's ack.
    fn hold(&mut self, now: Now, i: u8, limit: Watts, out: &mut Vec<Effect>) {
        let g = &mut self.gpus[i as usize];
        let why = format!(
            "GPU {i}: {} W not set: {}; tried again after a read",
            limit.0,
            g.unread_raise(limit)
        );
        if g.retry.is_none_or(|(target, _)| target != limit) {
            out.push(Effect::Say(Level::Warn, why.clone()));
        }
        g.retry = Some((limit, now.steady.0 + RETRY_MS));
        if let Some(p) = self.pending.as_mut() {
            p.failed(i, why);
        }
    }

    /// Every GPU's limit was read ([`Node::limits_read`]; `read`: whether
    /// each one's was): what waited for it goes on.
    pub(super) fn read_done(&mut self, now: Now, read: &[bool], out: &mut Vec<Effect>) {
        match self.after_read.take() {
            Some(AfterRead::Stop) => self.stopping(now, read, out),
            Some(AfterRead::Reconcile { force }) => self.put_in_force(now, force, read, out),
            None => self.put_in_force(now, false, read, out),
        }
    }

    /// Puts the arbiter's targets in force: a limit already read back is
    /// left alone (a new source is said), one that failed waits
    /// [`RETRY_MS`] unless `force` (a command waits for its ack); on a GPU
    /// whose limit was not read just now (`read`), only a cap that goes
    /// down is set, a raise is held ([`Node::hold`]).
    fn put_in_force(&mut self, now: Now, force: bool, read: &[bool], out: &mut Vec<Effect>) {
        // Leases lapse and retries wait on steady time: a step of the
        // wall clock neither hurries nor holds them off.
        let steady = now.steady.0;
        let mut changes = Vec::new();
        let mut sets = Vec::new();
        let mut sources = Vec::new();
        let mut held = Vec::new();
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
            if !was_read(read, i as usize) && !g.settable_unread(t.limit) {
                held.push((i, t.limit));
                continue;
            }
            sets.push(SetLimit {
                gpu: i,
                limit: t.limit,
                read_first: !g.ceiling_read,
            });
            sources.push((i, t.source));
        }
        for (i, limit) in held {
            self.hold(now, i, limit, out);
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
        self.first_reads(results, out);
        if r.restoring {
            return self.restored(results, out);
        }
        for res in results {
            if let Some(range) = res.range {
                self.range_learned(res.gpu, range, out);
            }
        }
        let mut changes = r.changes;
        let mut elsewhere = Vec::new();
        for res in &self.at_targets(now, results, &mut elsewhere) {
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
            out.extend(late_set(res));
            match res.back {
                Ok(b) => {
                    if b != res.limit {
                        elsewhere.push(SetLimit {
                            gpu: res.gpu,
                            limit: res.limit,
                            read_first: false,
                        });
                    }
                    g.applied = Some(b);
                    g.asked_back = b == res.limit;
                    g.unconfirmed = None;
                    g.source = back_source(b, res.limit, before, g.ceiling, source);
                }
                Err(_) => {
                    // The set may have taken, now or late: the GPU holds
                    // a limit asked since the last good read or the one
                    // read before them (a later read finding none finds
                    // an administrator's); the ceiling goes back at the
                    // stop.
                    // Not read since the start: what the flash kept may
                    // be on it still, and is kept beside it.
                    let (u, dropped) = match (g.applied, g.unconfirmed, g.kept) {
                        (None, None, Some(k)) if !g.ceiling_read => {
                            Unconfirmed::from_kept(k, res.limit)
                        }
                        _ => {
                            let read = g.applied.or(g.unconfirmed.and_then(|u| u.read()));
                            let was = g.unconfirmed.filter(|_| g.applied.is_none());
                            Unconfirmed::asking(was, read, res.limit)
                        }
                    };
                    if dropped {
                        out.push(Effect::Say(
                            Level::Warn,
                            format!(
                                "GPU {i}: {ASKED_MAX} limits asked and not read back: the oldest is forgotten (found later, it reads as set outside the agent)"
                            ),
                        ));
                    }
                    g.unconfirmed = Some(u);
                    g.applied = None;
                    g.asked_back = false;
                }
            }
            if let Some(why) = why {
                // Said once per target, not every round.
                if g.retry.is_none_or(|(target, _)| target != res.limit) {
                    out.push(Effect::Say(Level::Error, why.clone()));
                }
                g.retry = Some((res.limit, now.steady.0 + RETRY_MS));
                if let Some(p) = self.pending.as_mut() {
                    p.failed(res.gpu, why);
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
        if !elsewhere.is_empty() {
            // Read back at another limit than asked (set within NVML's
            // constraints instead, say): kept at once beside the one
            // asked, so a restart before the retry finds it the agent's.
            out.push(Effect::KeepLimits(self.kept_asking(&elsewhere)));
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

    /// The ceilings set back at the stop: each confirmed one is said in a
    /// `caps_applied` event, each other one in the log.
    fn restored(&mut self, results: &[LimitResult], out: &mut Vec<Effect>) {
        let mut changes = Vec::new();
        for res in results {
            let Some(g) = self.gpus.get_mut(res.gpu as usize) else {
                continue;
            };
            match (&res.set, &res.back) {
                (_, Ok(b)) if *b == res.limit => {
                    out.extend(late_set(res));
                    g.applied = Some(*b);
                    g.asked_back = true;
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

/// What is said of a set that answered an error (`Err`: past its
/// deadline, say) and took all the same: its read-back is the limit asked.
fn late_set(res: &LimitResult) -> Option<Effect> {
    match (&res.set, &res.back) {
        (Err(e), Ok(b)) if *b == res.limit => Some(Effect::Say(
            Level::Warn,
            format!(
                "GPU {}: setting {} W answered \"{e}\", and it reads back {} W: in force",
                res.gpu, res.limit.0, b.0
            ),
        )),
        _ => None,
    }
}

/// Why a limit is not in force as asked, if it is not (a read-back of
/// the limit asked is in force, whatever the set answered).
fn failure(res: &LimitResult) -> Option<String> {
    let i = res.gpu;
    let limit = res.limit.0;
    match (&res.set, &res.back) {
        // A set that answered an error (past its deadline) and took.
        (_, Ok(b)) if *b == res.limit => None,
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

/// Who a limit read back at `b` after a set of `limit` for `source` is
/// held for: the target's source where it took; where it did not, the
/// source it had where `b` is the limit it held `before` (nothing
/// changed), and below the `ceiling` the target's (or, for a lift, the
/// one before): a GPU below its ceiling is never said uncapped.
fn back_source(
    b: Watts,
    limit: Watts,
    before: (Option<Watts>, Option<CapSource>),
    ceiling: Watts,
    source: Option<CapSource>,
) -> Option<CapSource> {
    match before {
        _ if b == limit => source,
        (Some(was), held) if was == b => held,
        (_, held) if b < ceiling => source.or(held),
        _ => None,
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
