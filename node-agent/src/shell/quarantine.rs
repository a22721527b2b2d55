//! XIDs and quarantines in the shell: XIDs from the driver go to the node
//! (kept for `why` first); a GPU's health is kept in flash as the node
//! asks; the quarantine actions run each on its own task, and their
//! outcomes are logged and published.

use std::time::Duration;

use loopwarden_protocol::Event;
use node_core::node::Input;
use tokio::sync::mpsc;

use super::{health_key, Agent, RECENT_XIDS};
use crate::actions;
use crate::gpu::XidReport;

impl Agent {
    /// An XID from the driver: kept for `why`, and decided by the node.
    pub(super) async fn on_xid(&mut self, x: XidReport) {
        let now = self.clock.wall();
        if let Some(g) = self.gpus.get_mut(x.gpu as usize) {
            if g.xids.len() == RECENT_XIDS {
                g.xids.pop_front();
            }
            g.xids.push_back((now, x.xid));
        }
        self.step(Input::Xid {
            gpu: x.gpu,
            xid: x.xid,
        })
        .await;
    }

    /// The XID watch stopped (`Some(why)`) or runs again (`None`).
    pub(super) async fn on_xid_watch(&mut self, down: Option<String>) {
        self.step(Input::XidWatch(down.as_deref())).await;
    }

    /// After the driver came back (a stall ended, the XID watch runs
    /// again): every GPU asks again what answered "not supported", since a
    /// reloaded driver may answer otherwise.
    pub(super) async fn reprobe_gpus(&self) {
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

    /// Keeps a GPU's health in flash, so a restart does not forget a
    /// quarantine.
    pub(super) fn keep_health(&mut self, gpu: u8) {
        let i = gpu as usize;
        let h = self.node.gpu_health(gpu);
        match postcard::to_allocvec(&h) {
            Ok(bytes) => self.recorder.set(health_key(i), bytes),
            Err(e) => tracing::error!("GPU {i}: health state not encodable: {e}"),
        }
    }

    /// Starts every configured action for a quarantine of `gpu`, each on
    /// its own task; outcomes come back to the loop.
    pub(super) fn start_actions(&mut self, gpu: u8, reason: &str) {
        let vars = actions::Vars {
            host: self.config.host.as_str().to_string(),
            site: self.config.site.as_str().to_string(),
            gpu,
            uuid: self.gpus[gpu as usize].info.uuid.clone(),
            reason: reason.to_string(),
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
