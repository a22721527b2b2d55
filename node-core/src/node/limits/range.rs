//! A GPU's settable range learned after the start: NVML's limit
//! constraints, unread when the GPU was described (the board's range
//! stood in), read after NVML refused a limit outside them, or at a late
//! description. The GPU's range, the arbiter's lowest cap and the
//! ceiling follow it, and a set read back at the target the new range
//! makes is in force, not a failure retried every [`RETRY_MS`].
//!
//! Glossary:
//! - *learned range*: the range NVML gave after the start, the GPU's from
//!   then on.
//! - *at its target*: a GPU read back at the limit the arbiter asks of
//!   it now, whatever the set asked.

use loopwarden_protocol::{TimestampMs, Watts};

use super::{power_ceiling, within, LimitResult, SetLimit};
use crate::caps::GpuRange;
#[cfg(doc)]
use crate::node::RETRY_MS;
use crate::node::{gpu_index, Effect, Level, Node, Now};

impl Node {
    /// GPU `gpu`'s settable range is `range` from now on (read from NVML
    /// after the start): the arbiter clamps caps to its lowest limit, and
    /// the ceiling stays within it. What is to be said, emitted and kept.
    pub fn set_range(&mut self, gpu: u8, range: GpuRange) -> Vec<Effect> {
        let mut out = Vec::new();
        self.range_learned(gpu, range, &mut out);
        out
    }

    /// [`Node::set_range`], into `out`; a pending lease that caps the GPU
    /// below its new lowest limit is acked clamped to it.
    pub(super) fn range_learned(&mut self, gpu: u8, range: GpuRange, out: &mut Vec<Effect>) {
        let Some(g) = self.gpus.get_mut(gpu as usize) else {
            return;
        };
        if g.setup.range == range {
            return;
        }
        let was = g.setup.range;
        g.setup.range = range;
        out.push(Effect::Say(
            Level::Info,
            format!(
                "GPU {gpu}: settable from {} to {} W, as NVML says now ({} to {} W stood in until then)",
                range.min.0, range.max.0, was.min.0, was.max.0
            ),
        ));
        let index = gpu_index(gpu);
        self.commands.set_floor(index, range.min);
        self.commands.set_highest(index, range.max);
        let old = g.ceiling;
        g.ceiling = within(&g.setup, old);
        if g.ceiling != old {
            self.commands.set_ceiling(index, g.ceiling);
            out.push(Effect::Say(
                Level::Warn,
                format!(
                    "GPU {gpu}: uncapped limit {} W, the highest it may be set to ({} W before)",
                    g.ceiling.0, old.0
                ),
            ));
            let moved = power_ceiling(&[(index, g.ceiling, old)]);
            out.extend(moved.into_iter().map(Effect::Emit));
            out.push(Effect::KeepLimits(self.kept_limits()));
        }
        if let Some(p) = self.pending.as_mut() {
            p.clamped(gpu, range.min);
        }
    }

    /// `results` judged against the targets now: a set that took and
    /// read back at its GPU's target, not at the limit it asked (set
    /// within a range learned since), is in force as that target; the limit it asked is
    /// kept in flash at once beside it (`elsewhere`), so that a restart
    /// finds the limit read back the agent's.
    pub(super) fn at_targets(
        &mut self,
        now: Now,
        results: &[LimitResult],
        elsewhere: &mut Vec<SetLimit>,
    ) -> Vec<LimitResult> {
        let targets = self.commands.targets(TimestampMs(now.steady.0));
        let target = |gpu: u8| -> Option<Watts> {
            let t = targets.iter().find(|t| t.gpu.get() == gpu)?;
            Some(t.limit)
        };
        results
            .iter()
            .map(|res| match (&res.back, target(res.gpu)) {
                (Ok(b), Some(t)) if res.set.is_ok() && *b == t && t != res.limit => {
                    elsewhere.push(SetLimit {
                        gpu: res.gpu,
                        limit: res.limit,
                        read_first: false,
                    });
                    LimitResult {
                        limit: t,
                        ..res.clone()
                    }
                }
                _ => res.clone(),
            })
            .collect()
    }
}
