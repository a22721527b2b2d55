//! Power limits as the node asks: set each and read it back, or read
//! every GPU's as it is now, each through its worker within the deadline;
//! and each GPU's ceiling kept in flash, under the GPU's UUID, before a
//! set. What the values mean (what is in force, what to retry, what to
//! say) is the node's.

use loopwarden_flash::ConfigStore;
use loopwarden_protocol::Watts;
use loopwarden_store::agent_flash::Flash;
use node_core::node::{KeptLimit, LimitResult, Node, SetLimit};
use serde::{Deserialize, Serialize};

use super::{Agent, GpuState, UNKNOWN_UUID};

/// The config-store key of a GPU's kept limits.
fn limit_key(gpu: usize) -> String {
    format!("limit.{gpu}")
}

/// One GPU's kept limits, with the GPU they belong to.
#[derive(Serialize, Deserialize)]
struct Kept {
    uuid: String,
    limit: KeptLimit,
}

/// Gives `node` the limits kept before a restart, each only for the GPU
/// (by UUID) it was kept for: a GPU swapped since starts from what is
/// found on it.
pub(super) async fn restore(node: &mut Node, gpus: &[GpuState], store: &mut ConfigStore<Flash>) {
    for (i, g) in gpus.iter().enumerate() {
        let mut buf = [0u8; loopwarden_flash::config::MAX_VALUE];
        let kept: Kept = match store.get(&limit_key(i), &mut buf).await {
            Ok(Some(n)) => match postcard::from_bytes(&buf[..n]) {
                Ok(k) => k,
                Err(e) => {
                    tracing::error!("GPU {i}: kept power limits unreadable ({e}); its ceiling is the limit found on it");
                    continue;
                }
            },
            Ok(None) => continue,
            Err(e) => {
                tracing::error!("GPU {i}: kept power limits unreadable ({e:?}); its ceiling is the limit found on it");
                continue;
            }
        };
        if kept.uuid == g.info.uuid && g.info.uuid != UNKNOWN_UUID {
            node.restore_limit(i as u8, kept.limit);
        } else {
            tracing::warn!(
                "GPU {i}: kept limits belong to {} and it is {}: its ceiling is the limit found on it",
                kept.uuid,
                g.info.uuid
            );
        }
    }
}

impl Agent {
    /// Reads every GPU's limit as it is now.
    pub(super) async fn read_limits(&mut self) -> Vec<Result<Watts, String>> {
        let deadline = self.config.deadline;
        let mut read = Vec::with_capacity(self.workers.len());
        for w in &self.workers {
            read.push(w.read_limit(deadline).await.map_err(|e| e.to_string()));
        }
        read
    }

    /// Keeps every GPU's limits in flash, under its UUID, and waits until
    /// they are there (a failure is said; the limits are set anyway: a
    /// cap matters more than the record of it). A GPU whose UUID is
    /// unknown has none kept (said once).
    pub(super) async fn keep_limits(&mut self, limits: Vec<KeptLimit>) {
        let mut last = None;
        let mut unknown = Vec::new();
        for (i, (limit, g)) in limits.into_iter().zip(&self.gpus).enumerate() {
            if g.info.uuid == UNKNOWN_UUID {
                // Not the GPU's record, maybe another's: left as it is.
                unknown.push(i);
                continue;
            }
            let kept = Kept {
                uuid: g.info.uuid.clone(),
                limit,
            };
            match postcard::to_allocvec(&kept) {
                // Handed over in order: waiting for the last waits for
                // them all.
                Ok(bytes) => {
                    if let Some((key, value)) = last.replace((limit_key(i), bytes)) {
                        self.recorder.set(key, value);
                    }
                }
                Err(e) => tracing::error!("GPU {i}: power limits not encodable: {e}"),
            }
        }
        if !unknown.is_empty() && !self.unkept_limits_said {
            self.unkept_limits_said = true;
            for i in unknown {
                tracing::warn!(
                    "GPU {i}: its UUID is unknown: its power limits are not kept in flash (a restart starts it from the limit found on it)"
                );
            }
        }
        let Some((key, value)) = last else { return };
        if let Err(e) = self.recorder.set_sync(key, value).await {
            tracing::error!(
                "power limits not kept in flash ({e}): a restart may take a cap it finds for the site's limit"
            );
        }
    }

    /// Sets each limit and reads it back.
    pub(super) async fn set_limits(&mut self, sets: &[SetLimit]) -> Vec<LimitResult> {
        let deadline = self.config.deadline;
        let mut results = Vec::with_capacity(sets.len());
        for s in sets {
            let Some(w) = self.workers.get(s.gpu as usize) else {
                continue;
            };
            let set = w.set_limit(s.limit, deadline).await;
            let back = w.read_limit(deadline).await;
            results.push(LimitResult {
                gpu: s.gpu,
                limit: s.limit,
                set: set.map_err(|e| e.to_string()),
                back: back.map_err(|e| e.to_string()),
            });
        }
        results
    }
}
