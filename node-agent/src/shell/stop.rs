//! The clean stop's wait for the site actions: the quarantine actions
//! running and the cooling-loss steps running or queued end (each within
//! its own timeout), and their outcomes are kept and published, so the
//! next start runs none of them again. The wait is bounded by
//! [`STOP_WAIT`], within systemd's `TimeoutStopSec`; what is still running
//! then is killed and, not known done, runs again at the next start.
//!
//! The XIDs the driver reports meanwhile are decided as they come, and
//! those still queued at the end of the wait before the node's stop:
//! NVML does not report an XID again, so one dropped at the stop would
//! leave a failing GPU in service after the restart. A quarantine so
//! decided is kept in flash (waited for); its actions, started after the
//! wait began, are not waited for: not known done, they run again at the
//! next start.
//!
//! Glossary:
//! - *cut*: killed by the stop before it ended.

use std::time::Duration;

use super::{Agent, Outcomes};
use crate::gpu::XidEvent;
use crate::xid_queue::XidQueue;

/// How long a clean stop waits for the site actions at most: of the
/// unit's `TimeoutStopSec=60`, it leaves 20 s to the rest of the stop
/// (the ceilings put back, a few GPU calls of `deadline_ms` each; the bus
/// left, 6 s at most).
pub(super) const STOP_WAIT: Duration = Duration::from_secs(40);

impl Agent {
    /// At a clean stop: waits (at most [`STOP_WAIT`]) for the running
    /// quarantine actions and the cooling-loss steps running or queued,
    /// handling each outcome and each XID as it comes; cuts what is left.
    pub(super) async fn finish_actions(
        &mut self,
        (actions_rx, cooling_rx): Outcomes<'_>,
        xid_rx: &XidQueue,
    ) {
        let wait = STOP_WAIT;
        let running: Vec<_> = std::mem::take(&mut self.running_actions)
            .into_iter()
            .filter(|h| !h.is_finished())
            .collect();
        let steps = self.cooling.in_runner();
        let runner = self.cooling.close();
        if !running.is_empty() || steps > 0 {
            tracing::info!(
                "stopping: waiting for {} quarantine actions and {steps} cooling-loss steps",
                running.len(),
            );
        }
        let aborts: Vec<_> = running
            .iter()
            .chain(runner.as_ref())
            .map(|h| h.abort_handle())
            .collect();
        let deadline = tokio::time::Instant::now() + wait;
        let ended = async move {
            futures::future::join_all(running).await;
            if let Some(r) = runner {
                let _ = r.await;
            }
        };
        tokio::pin!(ended);
        let mut cut = false;
        loop {
            tokio::select! {
                Some(done) = actions_rx.recv() => self.on_action(done).await,
                Some(done) = cooling_rx.recv() => self.on_cooling_action(done).await,
                x = xid_rx.recv() => self.on_xid_event(x).await,
                _ = &mut ended => break,
                _ = tokio::time::sleep_until(deadline) => {
                    cut = true;
                    break;
                }
            }
        }
        if cut {
            tracing::error!(
                "stopping: site actions still running after {} s are killed; not known done, they run again at the next start",
                wait.as_secs()
            );
            for a in &aborts {
                a.abort();
            }
        }
        // What ended before the cut, or whose outcome waits.
        while let Ok(done) = actions_rx.try_recv() {
            self.on_action(done).await;
        }
        while let Ok(done) = cooling_rx.try_recv() {
            self.on_cooling_action(done).await;
        }
        self.drain_xids(xid_rx).await;
    }

    /// Decides every XID still queued (at the stop, before the node's).
    async fn drain_xids(&mut self, xid_rx: &XidQueue) {
        while let Some(x) = xid_rx.try_recv() {
            self.on_xid_event(x).await;
        }
    }

    /// An XID, or the XID watch going down or up.
    pub(super) async fn on_xid_event(&mut self, x: XidEvent) {
        match x {
            XidEvent::Xid(x) => self.on_xid(x).await,
            XidEvent::WatchDown(why) => self.on_xid_watch(Some(why)).await,
            XidEvent::WatchUp => self.on_xid_watch(None).await,
        }
    }
}
