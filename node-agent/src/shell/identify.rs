//! A GPU that could not say its UUID at start (a driver still loading, a
//! description past its deadline) is asked again, every [`ASK_EVERY`]
//! while it answers its samples. Once it says it, the health kept for it
//! before the restart is read from flash and given to the node
//! ([`Input::Identified`]): a GPU quarantined before the restart is
//! quarantined again, a ceiling kept for it comes back where the limit
//! found on it was a cap the agent left, and its health and limits are
//! kept from then on.
//!
//! Glossary:
//! - *identity*: a GPU's UUID (its name comes with it); `unknown` until
//!   it says it.

use std::time::Duration;

use node_core::health::GpuStatus;
use node_core::node::Input;

use super::quarantine::{checked, health_check_key, payload_of, Record};
use super::{identity, Agent, UNKNOWN_UUID};
use crate::gpu::GpuInfo;

/// How often a GPU whose UUID is unknown is asked again.
pub(super) const ASK_EVERY: Duration = Duration::from_secs(30);

impl Agent {
    /// Asks every GPU whose UUID is unknown and that answered its last
    /// sample for its description, all at once within the sampling
    /// deadline, at most every [`ASK_EVERY`]; one that says its UUID is
    /// identified.
    pub(super) async fn identify_late(&mut self) {
        let now = self.clock.steady().0;
        if now < self.identify_at {
            return;
        }
        let asked: Vec<usize> = (0..self.gpus.len())
            .filter(|&i| self.gpus[i].info.uuid == UNKNOWN_UUID && self.gpus[i].responsive)
            .collect();
        if asked.is_empty() {
            return;
        }
        self.identify_at = now + ASK_EVERY.as_millis() as u64;
        let deadline = self.config.deadline;
        let answers =
            futures::future::join_all(asked.iter().map(|&i| self.workers[i].describe(deadline)))
                .await;
        for (i, answer) in asked.into_iter().zip(answers) {
            match answer {
                Ok(info) if identity(&info.uuid).is_some() => self.identified(i as u8, info).await,
                Ok(_) => {}
                Err(e) => tracing::debug!("GPU {i}: its UUID still not read ({e})"),
            }
        }
    }

    /// GPU `gpu` said its identity `info`: its name and UUID are taken,
    /// and the node is given its kept health and limits.
    async fn identified(&mut self, gpu: u8, info: GpuInfo) {
        let g = &mut self.gpus[gpu as usize];
        g.info.uuid = info.uuid;
        g.info.name = info.name;
        let uuid = g.info.uuid.clone();
        let kept = match self.kept_health(&uuid).await {
            Ok(Some(k)) => {
                tracing::warn!(
                    "GPU {gpu}: its UUID is {uuid} (not read at start); kept from before the restart: {} ({}): {}",
                    k.state,
                    k.reason,
                    k.evidence
                );
                Some(k)
            }
            Ok(None) => {
                tracing::info!(
                    "GPU {gpu}: its UUID is {uuid} (not read at start); no health kept for it"
                );
                None
            }
            Err(e) => {
                tracing::error!(
                    "GPU {gpu}: its UUID is {uuid} (not read at start); its kept health state is unreadable ({e}): it stays degraded until the quiet period passes without evidence"
                );
                None
            }
        };
        let limit = super::limits::kept_through(&self.recorder, &uuid)
            .await
            .unwrap_or_else(|e| {
                tracing::error!("GPU {gpu}: its kept power limits are unreadable ({e}); its ceiling stays the limit found on it");
                None
            });
        self.step(Input::Identified {
            gpu,
            kept: kept.as_ref(),
            limit,
        })
        .await;
    }

    /// The health kept for the GPU of `uuid`, as the start reads it.
    async fn kept_health(&self, uuid: &str) -> Result<Option<GpuStatus>, String> {
        let Some(id) = identity(uuid) else {
            return Ok(None);
        };
        let key = Record::Health.key(id);
        let value = self.recorder.get(key.clone()).await?;
        let check = self.recorder.get(health_check_key(id)).await?;
        payload_of(&key, checked(&key, value, check)?, id)?
            .map(|bytes| super::startup::kept_status(&bytes))
            .transpose()
    }
}
