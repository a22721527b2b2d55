//! A GPU that could not say its UUID at start (a driver still loading, a
//! description past its deadline) is asked again, every [`ASK_EVERY`]
//! while it answers its samples. Once it says it, the health kept for it
//! before the restart is read from flash and given to the node
//! ([`Input::Identified`]): a GPU quarantined before the restart is
//! quarantined again (the stale indexes kept for that quarantine are
//! re-stamped to it and said, `ctl status` too), a ceiling kept for it
//! comes back where the limit found on it was a cap the agent left, and
//! its health and limits are kept from then on. After a config store
//! lost, the store's lost mark waits for each GPU unknown at the start to
//! say its UUID so
//! (`super::lost_store::PendingClear`).
//!
//! A GPU's settable range (NVML's limit constraints) unread at its
//! description (the board's stood in) and given later, by a late
//! description or after NVML refused a limit outside it (a set that
//! took and read back at another limit than asked has the GPU
//! described again), is the GPU's from then on: the node is given it
//! ([`Node::set_range`](node_core::node::Node::set_range)), and a cap
//! below its lowest limit is acked clamped to it, not failed and
//! retried. NVML's limits that description gives are the GPU's own
//! figures from then on (what the DCGM limit series show, one unread
//! left as it was): the range is the board's within them, never written
//! over them.
//!
//! Glossary:
//! - *identity*: a GPU's UUID (its name comes with it); `unknown` until
//!   it says it.
//! - *range*: the limits a GPU can be set to, NVML's within the board's.
//! - *limits*: NVML's default, lowest and highest limit of a GPU, as it
//!   gave them (`UNREAD_LIMIT` where not).

use std::time::Duration;

use loopwarden_protocol::HealthState;
use node_core::caps::GpuRange;
use node_core::health::GpuStatus;
use node_core::node::{Input, LimitResult};

use super::quarantine::{checked, health_check_key, payload_of, Record};
use super::{identity, Agent, UNKNOWN_UUID};
use crate::config::Config;
use crate::gpu::GpuInfo;
use crate::nvml::UNREAD_LIMIT;
use crate::worker::Worker;

/// How often a GPU whose UUID is unknown is asked again.
pub(super) const ASK_EVERY: Duration = Duration::from_secs(30);

/// The range `info` gives, NVML's within the board's (at the start, the
/// board's figures in place of any unread, and when learned later);
/// `None` where it gives none ([`UNREAD_LIMIT`]: NVML could not say it).
pub(super) fn range_of(info: &GpuInfo, config: &Config) -> Option<GpuRange> {
    if info.min_limit == UNREAD_LIMIT || info.max_limit == UNREAD_LIMIT {
        return None;
    }
    let board = &config.board.power;
    let max = info.max_limit.min(board.max_cap_w);
    let min = info.min_limit.max(board.min_cap_w).min(max);
    Some(GpuRange { min, max })
}

/// The range GPU `w` gives now, within the board's, asked by a
/// description within `deadline` after a set that took and read back at
/// another limit than asked (NVML set it within constraints it read
/// then), with that description (NVML's limits as it gave them, for
/// [`Agent::took_ranges`]); `None` where it gives none, or not in time
/// (said).
pub(super) async fn range_now(
    w: &Worker,
    deadline: Duration,
    config: &Config,
) -> (Option<GpuRange>, Option<GpuInfo>) {
    match w.describe(deadline).await {
        Ok(info) => (range_of(&info, config), Some(info)),
        Err(e) => {
            tracing::warn!(
                "GPU {}: set at another limit than asked, and its limit constraints not read ({e})",
                w.index()
            );
            (None, None)
        }
    }
}

/// Each limit NVML gave in `now` is the GPU's own figure from now on, in
/// `kept` (apart from its range, the board's within NVML's); one it did
/// not give ([`UNREAD_LIMIT`]) stays as it was.
fn take_limits(kept: &mut GpuInfo, now: &GpuInfo) {
    for (kept, now) in [
        (&mut kept.default_limit, now.default_limit),
        (&mut kept.min_limit, now.min_limit),
        (&mut kept.max_limit, now.max_limit),
    ] {
        if now != UNREAD_LIMIT {
            *kept = now;
        }
    }
}

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
        let range = range_of(&info, &self.config);
        let g = &mut self.gpus[gpu as usize];
        // Its late default is shown, never given to the node: the node's
        // default (the board's `tdp_w`) is only the ceiling of a GPU
        // never read, which is not set until a read, and a higher late
        // default would raise it.
        take_limits(&mut g.info, &info);
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
        let limit = super::limits::kept_through(&self.recorder, &uuid).await;
        self.identified_after_loss(gpu, &uuid, &limit).await;
        let limit = limit.unwrap_or_else(|e| {
                tracing::error!("GPU {gpu}: its kept power limits are unreadable ({e}); its ceiling stays the limit found on it");
                None
            });
        // The range only once the records kept before the restart are
        // read: a ceiling it moves is kept at once, under the UUID just
        // learned, and would stand in for the record it overwrites.
        if let Some(range) = range {
            self.took_range(gpu, range).await;
        }
        self.step(Input::Identified {
            gpu,
            kept: kept.as_ref(),
            limit,
        })
        .await;
        // A quarantine put back: its stale indexes, not checked at the
        // start, are its quarantine's in force, put back under a new stamp.
        if let Some(k) = kept.filter(|k| k.state == HealthState::Quarantined) {
            self.stale_put_back(gpu, &uuid, k.since.0).await;
        }
        // Its health kept by that step: the config store's lost mark may
        // have waited for it last.
        self.clear_lost_mark_once_kept();
    }

    /// The ranges learned by `results`' sets ([`range_now`]) are their
    /// GPUs' from now on (the node takes them with the results), and the
    /// limits NVML gave in the same descriptions are the GPUs' own (what
    /// the DCGM limit series show): the range is the board's within
    /// NVML's, never written over NVML's figures.
    pub(super) fn took_ranges(
        &mut self,
        results: Vec<(LimitResult, Option<GpuInfo>)>,
    ) -> Vec<LimitResult> {
        let mut taken = Vec::with_capacity(results.len());
        for (res, described) in results {
            if let Some(g) = self.gpus.get_mut(res.gpu as usize) {
                if let Some(range) = res.range {
                    g.range = range;
                }
                if let Some(info) = &described {
                    take_limits(&mut g.info, info);
                }
            }
            taken.push(res);
        }
        taken
    }

    /// GPU `gpu` gave its range (a late description): it is the GPU's
    /// from now on, the node's too.
    async fn took_range(&mut self, gpu: u8, range: GpuRange) {
        self.gpus[gpu as usize].range = range;
        let effects = self.node.set_range(gpu, range);
        self.carry_out(self.now(), effects, None).await;
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
