//! Reads of GPUs' limits: every GPU's at once (at the start, now and
//! then, before a set and at the stop), and one GPU's just before a set
//! where its ceiling was never read ([`SetLimit::read_first`]): the first
//! limit read from a GPU decides its ceiling, a later one the agent did
//! not leave is an administrator's.
//!
//! Glossary:
//! - *moved*: a GPU whose ceiling a read changed, with the ceiling and
//!   the one before (a `power_ceiling` event).

use loopwarden_protocol::{GpuIndex, Watts};

use super::ceiling::{changed_outside, first_ceiling};
use super::{power_ceiling, LimitResult};
use crate::node::{gpu_index, Effect, GpuCaps, Level, Node};

impl Node {
    /// Every GPU's limit as read at start or now and then: the first one
    /// read decides the GPU's ceiling (kept in flash at once where nothing
    /// was kept: a limit set while the agent is stopped is then told from
    /// its own), a later one that is not the limit last read back was set
    /// by someone else and is the new ceiling. Returns whether each GPU's
    /// limit was read (one that was not is said, and set only lower).
    pub(in crate::node) fn limits_read(
        &mut self,
        read: &[Result<Watts, String>],
        out: &mut Vec<Effect>,
    ) -> Vec<bool> {
        let mut moved = Vec::new();
        let mut unkept = false;
        let mut was_read = Vec::with_capacity(self.gpus.len());
        for i in 0..self.gpus.len() {
            match read.get(i) {
                Some(Ok(found)) => {
                    was_read.push(true);
                    let g = &self.gpus[i];
                    unkept |= !g.ceiling_read && g.kept.is_none();
                    moved.extend(self.read_one(i, *found, out));
                }
                r => {
                    was_read.push(false);
                    let why = match r {
                        Some(Err(e)) => e.as_str(),
                        _ => "no answer",
                    };
                    out.push(Effect::Say(Level::Warn, unreadable(i, &self.gpus[i], why)));
                }
            }
        }
        if !moved.is_empty() || unkept {
            out.push(Effect::KeepLimits(self.kept_limits()));
        }
        out.extend(power_ceiling(&moved).into_iter().map(Effect::Emit));
        was_read
    }

    /// The limits read just before sets on GPUs whose ceiling was never
    /// read ([`LimitResult::first`]): each is their first read, and
    /// decides their ceiling before the sets' read-backs are judged (a
    /// cap of the agent's read back later is then never taken for a
    /// limit it found).
    pub(super) fn first_reads(&mut self, results: &[LimitResult], out: &mut Vec<Effect>) {
        let mut moved = Vec::new();
        for res in results {
            let i = res.gpu as usize;
            let Some(Ok(found)) = res.first else { continue };
            if self.gpus.get(i).is_none_or(|g| g.ceiling_read) {
                continue;
            }
            moved.extend(self.read_one(i, found, out));
        }
        if !moved.is_empty() {
            out.push(Effect::KeepLimits(self.kept_limits()));
            out.extend(power_ceiling(&moved).into_iter().map(Effect::Emit));
        }
    }

    /// GPU `i`'s limit read as `found`: its ceiling decided (the first
    /// read) or moved (a limit the agent did not leave), and what is in
    /// force now. The move, where the ceiling moved.
    fn read_one(
        &mut self,
        i: usize,
        found: Watts,
        out: &mut Vec<Effect>,
    ) -> Option<(GpuIndex, Watts, Watts)> {
        let g = &mut self.gpus[i];
        let was = g.ceiling;
        let first = !g.ceiling_read;
        let changed = if first {
            first_ceiling(i, g, found, out)
        } else if !g.left(found) {
            changed_outside(i, g, found, out)
        } else {
            false
        };
        if g.ceiling < g.setup.range.min && (first || g.ceiling != was) {
            out.push(Effect::Say(Level::Warn, below_min(i, g)));
        }
        g.ceiling_read = true;
        g.applied = Some(found);
        g.unconfirmed = None;
        let ceiling = g.ceiling;
        self.commands.set_ceiling(gpu_index(i as u8), ceiling);
        changed.then_some((gpu_index(i as u8), ceiling, was))
    }
}

/// What is said of GPU `i` (as `g`) whose ceiling is below its
/// configured lowest cap.
fn below_min(i: usize, g: &GpuCaps) -> String {
    format!(
        "GPU {i}: uncapped limit {} W is below its lowest cap {} W (NVML's minimum or the board's min_cap_w): it is not raised, and no cap goes below {} W",
        g.ceiling.0, g.setup.range.min.0, g.ceiling.0
    )
}

/// What is said of GPU `i` (as `g`) whose limit could not be read (`why`).
fn unreadable(i: usize, g: &GpuCaps, why: &str) -> String {
    let sets = match g.lowest_left() {
        Some(low) => format!("it is set no higher than {} W until a read", low.0),
        None => "no limit is set on it until a read".to_string(),
    };
    format!(
        "GPU {i}: cannot read its power limit ({why}); its uncapped limit stays {} W, and {sets}",
        g.ceiling.0
    )
}
