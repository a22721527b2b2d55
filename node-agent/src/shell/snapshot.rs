//! The console's snapshot: after every step the loop copies what the
//! console shows (GPUs, leases, timing) into a
//! [`Snapshot`](crate::console::Snapshot) and replaces the one in the watch
//! channel. The console reads only that; it never reaches into the loop.

use super::Agent;
use crate::console::{GpuView, Snapshot};

impl Agent {
    /// What the console shows, as of now.
    pub(super) fn snapshot(&self) -> Snapshot {
        let gpus = self
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let gpu = i as u8;
                let (missed, unresponsive_reported) = self.node.missed(gpu);
                let (applied, source) = self.node.applied(gpu);
                GpuView {
                    info: g.info.clone(),
                    range: g.range,
                    ceiling: self.node.ceiling(gpu).unwrap_or(g.range.max),
                    last: g.last,
                    sampled_at: g.sampled_at,
                    responsive: g.responsive,
                    missed,
                    unresponsive_reported,
                    last_error: g.last_error.clone(),
                    action_failed: g.action_failed.clone(),
                    applied,
                    source,
                    guard_cap: self.node.guard_cap(gpu),
                    xids: g.xids.iter().copied().collect(),
                    health: self.node.health().status(gpu).cloned(),
                    calls: self.workers[i].call_times(),
                }
            })
            .collect();
        let (xids_queued, xids_dropped) = self.xid_stats.get();
        let flash_refused = self.recorder.refused();
        let flash_refused_at = match self.snapshots.borrow().as_ref() {
            Some(prev) => prev.flash_refused_since(flash_refused, self.clock.wall()),
            None => (flash_refused > 0).then(|| self.clock.wall()),
        };
        Snapshot {
            timing: self.timing.clone(),
            gpus,
            leases: self.node.leases(),
            xids_queued,
            xids_dropped,
            acks_withheld: self.node.acks_withheld(),
            actions: self.site_actions.clone(),
            xid_watch_down: self.node.xid_watch_down(),
            stalled_since: self.node.health().stalled_since(),
            cooling: self.node.cooling_phase(),
            cooling_unknown: self.node.cooling_unknown(),
            wall_offset_ms: self.clock.read().1,
            flash_refused,
            flash_refused_at,
            deadline: self.config.deadline,
            config_lost: self.config_lost_view(),
            stale_indexes: self.stale_indexes_now(),
        }
    }

    /// Replaces the console's snapshot.
    pub(super) fn publish_snapshot(&self) {
        self.snapshots.send_replace(Some(self.snapshot()));
    }
}
