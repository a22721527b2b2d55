//! Health decisions and quarantines: XIDs from the driver, what the health
//! engine decided (logged, published, kept in flash), and the quarantine
//! actions each on its own task.

use std::time::Duration;

use loopwarden_protocol::{Event, GpuIndex, HealthState, TimestampMs};
use tokio::sync::mpsc;

use super::{health_key, Agent, RECENT_XIDS};
use crate::actions;
use crate::gpu::XidReport;
use crate::health::{fmt_time, Output};

impl Agent {
    pub(super) async fn on_xid(&mut self, x: XidReport) {
        let now = self.clock.wall();
        let t = self.engine_now();
        let Some(gpu) = GpuIndex::new(x.gpu).filter(|g| (g.get() as usize) < self.gpus.len())
        else {
            tracing::warn!("XID {} for unknown GPU {}", x.xid, x.gpu);
            return;
        };
        if let Some(unsaid) = self.xid_log.allow(t.0) {
            if unsaid > 0 {
                tracing::warn!("{unsaid} more XIDs in the last second, not logged one by one");
            }
            tracing::warn!("GPU {}: XID {}", x.gpu, x.xid);
        }
        let g = &mut self.gpus[x.gpu as usize];
        if g.xids.len() == RECENT_XIDS {
            g.xids.pop_front();
        }
        g.xids.push_back((now, x.xid));
        // The decision first: the quarantine is what the hall waits for.
        let outs = self.health.xid(t, x.gpu, x.xid);
        self.on_health(outs, now).await;
        self.emit(Event::Xid { gpu, xid: x.xid }, now).await;
    }

    /// The XID watch stopped (`Some(why)`) or runs again (`None`): while it
    /// is down the host's health says so, since XIDs go unseen.
    pub(super) async fn on_xid_watch(&mut self, down: Option<String>) {
        let now = self.clock.wall();
        let running = down.is_none();
        match down {
            Some(why) => {
                tracing::error!(
                    "the XID watch is down ({why}); XIDs are not seen until it restarts"
                );
                self.xid_watch_down.get_or_insert(now);
            }
            None => {
                tracing::warn!("the XID watch runs again");
                self.xid_watch_down = None;
            }
        }
        if running {
            self.reprobe_gpus().await;
        }
        self.publish_health(now);
        self.emit(Event::XidWatch { running }, now).await;
    }

    /// After the driver came back (a stall ended, the XID watch runs
    /// again): every GPU asks again what answered "not supported", since a
    /// reloaded driver may answer otherwise.
    async fn reprobe_gpus(&self) {
        let deadline = self.config.deadline;
        let asks = self.workers.iter().map(|w| w.reprobe(deadline));
        for (i, r) in futures::future::join_all(asks)
            .await
            .into_iter()
            .enumerate()
        {
            if let Err(e) = r {
                tracing::warn!("GPU {i}: cannot ask again what was not supported: {e}");
            }
        }
    }

    /// Carries out what the health engine decided: log and publish each
    /// change, keep the state in flash, publish the retained health, and
    /// start the quarantine actions.
    pub(super) async fn on_health(&mut self, outs: Vec<Output>, now: TimestampMs) {
        if outs.is_empty() {
            return;
        }
        let mut changed = false;
        for o in outs {
            match o {
                Output::Change(c) => {
                    changed = true;
                    let name = serde_json::to_value(c.reason)
                        .ok()
                        .and_then(|v| v.as_str().map(String::from))
                        .unwrap_or_default();
                    if c.to == HealthState::Quarantined {
                        // WARN, as every GPU fault found: the agent did its
                        // job; ERROR is for what it fails to do.
                        tracing::warn!("GPU {} quarantined ({name}): {}", c.gpu, c.evidence);
                    } else {
                        tracing::warn!(
                            "GPU {}: {} → {} ({name}): {}",
                            c.gpu,
                            c.from,
                            c.to,
                            c.evidence
                        );
                    }
                    // The retained state first: it is what the hall waits
                    // for, and it needs no flash write to go out. Then the
                    // actions, the state in flash, the event.
                    self.publish_health(now);
                    if c.to == HealthState::Quarantined {
                        self.start_actions(c.gpu, &name, &c.evidence);
                    }
                    self.keep_health(c.gpu as usize).await;
                    let ev = Event::HealthChanged {
                        gpu: Self::gpu_index(c.gpu as usize),
                        from: c.from,
                        to: c.to,
                        reason: c.reason,
                    };
                    self.emit(ev, now).await;
                }
                Output::CoolingAttributed { gpus, reason, .. } => {
                    tracing::warn!(
                        "the cooling explains the heat of GPUs {gpus:#06x}; no GPU is marked for it"
                    );
                    self.emit(Event::CoolingAttributed { gpus, reason }, now)
                        .await;
                }
                Output::HostStall { since, gpus, .. } => {
                    tracing::warn!(
                        "every GPU (mask {gpus:#06x}) stopped answering together since {}: \
                         a driver or host stall, no GPU is blamed",
                        fmt_time(since)
                    );
                    self.publish_health(now);
                    self.emit(Event::HostStalled { gpus, since }, now).await;
                }
                Output::HostStallEnded { since, .. } => {
                    tracing::warn!(
                        "the GPUs answer again after a stall since {}",
                        fmt_time(since)
                    );
                    self.publish_health(now);
                    self.emit(
                        Event::HostResumed {
                            stalled_since: since,
                        },
                        now,
                    )
                    .await;
                    self.reprobe_gpus().await;
                }
            }
        }
        let _ = changed;
    }

    /// Keeps a GPU's health in flash, so a restart does not forget a
    /// quarantine.
    pub(super) async fn keep_health(&mut self, i: usize) {
        let h = self.gpu_health(i);
        match postcard::to_allocvec(&h) {
            Ok(bytes) => self.recorder.set(health_key(i), bytes),
            Err(e) => tracing::error!("GPU {i}: health state not encodable: {e}"),
        }
    }

    /// Starts every configured action for a quarantine of `gpu`, each on
    /// its own task; outcomes come back to the loop.
    pub(super) fn start_actions(&mut self, gpu: u8, reason: &str, evidence: &str) {
        let vars = actions::Vars {
            host: self.config.host.as_str().to_string(),
            site: self.config.site.as_str().to_string(),
            gpu,
            uuid: self.gpus[gpu as usize].info.uuid.clone(),
            reason: format!("{reason}: {evidence}"),
        };
        for action in &self.config.quarantine_actions {
            let argv = actions::expand(action, &vars);
            let timeout = self.config.quarantine_timeout;
            let tx = self.actions.clone();
            self.running_actions.retain(|h| !h.is_finished());
            self.running_actions.push(tokio::spawn(async move {
                let outcome = actions::run(&argv, timeout).await;
                let _ = tx.send((gpu, outcome)).await;
            }));
        }
    }

    pub(super) async fn on_action(&mut self, gpu: u8, o: actions::Outcome) {
        if o.ok {
            tracing::info!("GPU {gpu}: quarantine action {} done", o.program);
        } else {
            tracing::error!(
                "GPU {gpu}: quarantine action {} failed: {}",
                o.program,
                o.detail
            );
        }
        let ev = Event::QuarantineAction {
            gpu: Self::gpu_index(gpu as usize),
            ok: o.ok,
            exit_code: o.exit_code,
        };
        self.emit(ev, self.clock.wall()).await;
    }

    /// At a clean stop: a drain that is running finishes (within its
    /// timeout) and its outcome is logged, so a quarantine kept in flash
    /// does not run its actions again.
    pub(super) async fn finish_actions(
        &mut self,
        actions_rx: &mut mpsc::Receiver<(u8, actions::Outcome)>,
    ) {
        let pending: Vec<_> = std::mem::take(&mut self.running_actions)
            .into_iter()
            .filter(|h| !h.is_finished())
            .collect();
        if !pending.is_empty() {
            tracing::info!("stopping: waiting for {} quarantine actions", pending.len());
            let wait = self.config.quarantine_timeout + Duration::from_secs(1);
            let _ = tokio::time::timeout(wait, futures::future::join_all(pending)).await;
        }
        while let Ok((gpu, outcome)) = actions_rx.try_recv() {
            self.on_action(gpu, outcome).await;
        }
    }
}

/// At most [`XID_LOG_PER_S`] XID lines a second: in a storm of thousands
/// the log says how many it left out instead of writing each (the events,
/// the counts and every decision are kept whatever the log says).
#[derive(Debug, Default)]
pub(crate) struct XidLog {
    /// The second being counted, steady ms.
    window: u64,
    logged: u32,
    unsaid: u64,
}

/// XID lines logged a second at most.
const XID_LOG_PER_S: u32 = 10;

impl XidLog {
    /// Whether to log an XID at `t` (steady ms): `Some(n)` with the count
    /// of those left out since the last line logged.
    fn allow(&mut self, t: u64) -> Option<u64> {
        if t.saturating_sub(self.window) >= 1_000 {
            self.window = t;
            self.logged = 0;
        }
        if self.logged < XID_LOG_PER_S {
            self.logged += 1;
            return Some(std::mem::take(&mut self.unsaid));
        }
        self.unsaid += 1;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::XidLog;

    #[test]
    fn a_storm_logs_ten_lines_a_second_and_says_how_many_it_left_out() {
        let mut l = XidLog::default();
        let logged: Vec<_> = (0..1_000u64).filter_map(|k| l.allow(k)).collect();
        assert_eq!(logged, vec![0; 10], "ten lines in the first second");
        assert_eq!(
            l.allow(1_000),
            Some(990),
            "the next second says what was left out"
        );
    }
}
