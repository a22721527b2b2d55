//! XIDs and quarantines in the shell: XIDs from the driver go to the node
//! (kept for `why` first); a GPU's health is kept in flash as the node
//! asks; the quarantine actions run each on its own task, and their
//! outcomes are logged and published.
//!
//! A quarantine's actions are *done* once every one of them ended well:
//! then the quarantine's stamp is kept in flash beside the GPU's health
//! (before the last outcome is published). At the start, a GPU kept
//! quarantined whose quarantine is not known done (the agent was killed
//! while its actions ran or before they started, or one failed) has its
//! actions run again: a drain or a taint run twice does no harm, one never
//! run leaves the scheduler unaware.
//!
//! Glossary:
//! - *run*: the actions of one quarantine (a GPU and its stamp) still
//!   running.

use loopwarden_flash::ConfigStore;
use loopwarden_protocol::{Event, HealthState};
use loopwarden_store::agent_flash::Flash;
use node_core::node::Input;

use super::{health_key, Agent, RECENT_XIDS};
use crate::actions;
use crate::gpu::XidReport;

/// A quarantine action ended.
#[derive(Debug)]
pub(crate) struct ActionDone {
    /// The GPU.
    pub gpu: u8,
    /// The stamp of the quarantine it ran for (wall ms).
    pub since: u64,
    /// How it ended.
    pub outcome: actions::Outcome,
}

/// The actions of one quarantine still running.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    /// How many have not ended.
    left: usize,
    /// Whether every one that ended, ended well.
    ok: bool,
}

/// The config-store key of the stamp of a GPU's last quarantine whose
/// actions are done.
fn done_key(gpu: usize) -> String {
    format!("quarantine_done.{gpu}")
}

/// The GPUs kept quarantined in `store` whose quarantine's actions are not
/// known done (a stamp other than theirs, or none, kept under
/// [`done_key`]).
pub(super) async fn not_done(
    store: &mut ConfigStore<Flash>,
    health: &node_core::health::HealthEngine,
) -> Vec<u8> {
    let mut gpus = Vec::new();
    for gpu in 0..health.len() as u8 {
        let Some(st) = health.status(gpu) else {
            continue;
        };
        if st.state != HealthState::Quarantined {
            continue;
        }
        let mut buf = [0u8; 8];
        let done = match store.get(&done_key(gpu as usize), &mut buf).await {
            Ok(Some(8)) => Some(u64::from_le_bytes(buf)),
            Ok(_) => None,
            Err(e) => {
                tracing::error!("GPU {gpu}: whether its quarantine actions ran is unreadable ({e:?}): taken as not");
                None
            }
        };
        if done != Some(st.since.0) {
            gpus.push(gpu);
        }
    }
    gpus
}

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
        let actions = &self.config.quarantine_actions;
        if actions.is_empty() {
            return;
        }
        let vars = actions::Vars {
            host: self.config.host.as_str().to_string(),
            site: self.config.site.as_str().to_string(),
            gpu,
            uuid: self.gpus[gpu as usize].info.uuid.clone(),
            reason: reason.to_string(),
        };
        let since = self.node.gpu_health(gpu).since.0;
        let run = self
            .quarantine_runs
            .entry((gpu, since))
            .or_insert(Run { left: 0, ok: true });
        run.left += actions.len();
        self.running_actions.retain(|h| !h.is_finished());
        for action in actions {
            let argv = actions::expand(action, &vars);
            let timeout = self.config.quarantine_timeout;
            let tx = self.actions.clone();
            self.running_actions.push(tokio::spawn(async move {
                let outcome = actions::run(&argv, timeout).await;
                let _ = tx
                    .send(ActionDone {
                        gpu,
                        since,
                        outcome,
                    })
                    .await;
            }));
        }
    }

    /// At the start: the actions of each GPU kept quarantined whose
    /// actions are not known done run again.
    pub(super) fn resume_actions(&mut self, gpus: &[u8]) {
        if self.config.quarantine_actions.is_empty() {
            return;
        }
        for &gpu in gpus {
            let Some(st) = self.node.health().status(gpu) else {
                continue;
            };
            let reason = format!("{}: {}", st.reason, st.evidence);
            tracing::warn!(
                "GPU {gpu}: quarantined before the restart, its actions not known to have ended well: running them again"
            );
            self.start_actions(gpu, &reason);
        }
    }

    /// A quarantine action ended: logged, and published; once every action
    /// of its quarantine ended well, the quarantine's stamp is kept in
    /// flash first (so a restart does not run them again).
    pub(super) async fn on_action(&mut self, done: ActionDone) {
        let ActionDone {
            gpu,
            since,
            outcome: o,
        } = done;
        if o.ok {
            tracing::info!("GPU {gpu}: quarantine action {} done", o.program);
        } else {
            tracing::error!(
                "GPU {gpu}: quarantine action {} failed: {}",
                o.program,
                o.detail
            );
        }
        if let Some(run) = self.quarantine_runs.get_mut(&(gpu, since)) {
            run.left = run.left.saturating_sub(1);
            run.ok &= o.ok;
            if run.left == 0 {
                let ok = run.ok;
                self.quarantine_runs.remove(&(gpu, since));
                if ok {
                    self.recorder
                        .set(done_key(gpu as usize), since.to_le_bytes().to_vec());
                } else {
                    tracing::error!(
                        "GPU {gpu}: a quarantine action failed: it is not run again while the agent runs (drain the GPU by hand), and runs again at the next start"
                    );
                }
            }
        }
        let ev = Event::QuarantineAction {
            gpu: Self::gpu_index(gpu as usize),
            ok: o.ok,
            exit_code: o.exit_code,
        };
        self.emit(ev, self.clock.wall()).await;
    }

    /// Says in the log when the XID queue dropped events since it last
    /// said so (at most once a round).
    pub(super) fn say_xids_dropped(&mut self) {
        let (_, dropped) = self.xid_stats.get();
        if dropped > self.xids_dropped_said {
            tracing::warn!(
                "{} XIDs dropped by the full XID queue ({dropped} since the start): repeats in a storm; the first fatal XID of every GPU is kept",
                dropped - self.xids_dropped_said
            );
            self.xids_dropped_said = dropped;
        }
    }
}
