//! The sampling loop: one task that waits on the sampling tick, a frame
//! from the bus, a finished quarantine action or cooling-loss step, an XID
//! (or the XID watch going down or up) and the next lease expiry, and
//! after each publishes a snapshot for the console; and the sampling round
//! itself (every GPU on its own worker, within the deadline), whose
//! readings go to the node.

use std::future::Future;
use std::time::{Duration, Instant};

use loopwarden_bus::Inbound;
use loopwarden_protocol::{GpuFlags, TimestampMs};
use tokio::sync::mpsc;

use node_core::health::Observation;
use node_core::node::{Input, Reading};

use super::{Agent, Outcomes, JITTER_WINDOW};
use crate::gpu::{GpuError, GpuSample};
use crate::worker::Answer;

impl Agent {
    /// Runs the loop until `shutdown` completes.
    pub(super) async fn run_loop(
        &mut self,
        inbound: &mut mpsc::Receiver<Inbound>,
        (actions_rx, cooling_rx): Outcomes<'_>,
        xid_rx: &mut crate::xid_queue::XidQueue,
        shutdown: impl Future<Output = ()>,
    ) {
        let mut tick = tokio::time::interval(self.config.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        tokio::pin!(shutdown);
        loop {
            let expiry = self
                .node
                .next_expiry()
                .map(|t| Duration::from_millis(self.clock.steady().until(t)));
            tokio::select! {
                scheduled = tick.tick() => {
                    let jitter = Instant::now().saturating_duration_since(scheduled.into_std());
                    self.sample_round(jitter).await;
                }
                Some(msg) = inbound.recv() => {
                    if !self.on_inbound(msg).await {
                        continue;
                    }
                }
                Some(done) = actions_rx.recv() => self.on_action(done).await,
                Some(done) = cooling_rx.recv() => self.on_cooling_action(done).await,
                x = xid_rx.recv() => self.on_xid_event(x).await,
                _ = sleep_opt(expiry) => self.step(Input::Expiry).await,
                _ = &mut shutdown => break,
            }
            self.publish_snapshot();
        }
    }

    /// Samples every GPU, each on its own worker, within the deadline,
    /// and gives the node the round.
    async fn sample_round(&mut self, jitter: Duration) {
        let began = Instant::now();
        let results = self.sample_all().await;
        let mut readings = Vec::with_capacity(results.len());
        for (g, r) in self.gpus.iter_mut().zip(results) {
            readings.push(match r {
                Some((Answer::Pending, _)) => Reading::Pending,
                Some((Answer::Now(Ok(s)) | Answer::Late(Ok(s)), answered)) => {
                    g.last = Some(s);
                    // A late answer came up to a period ago: dated then.
                    g.sampled_at = Some(dated(self.clock.wall(), answered));
                    g.responsive = true;
                    Reading::Sample {
                        observation: observation(&s),
                        temp: s.temp,
                        power: s.power,
                    }
                }
                other => {
                    let e = match other {
                        Some((Answer::Now(Err(e)) | Answer::Late(Err(e)), _)) => e,
                        _ => GpuError::Timeout,
                    };
                    g.responsive = false;
                    g.last_error = Some(e.to_string());
                    match e {
                        GpuError::Lost => Reading::Lost(e.to_string()),
                        _ => Reading::Missed(e.to_string()),
                    }
                }
            });
        }
        let now = self.clock.wall();
        self.say_xids_dropped();
        self.step(Input::Round(&readings)).await;
        self.publish_telemetry(now);
        self.seq_floor.keep_ahead(&self.bus, &self.recorder).await;
        self.identify_late().await;

        let t = &mut self.timing;
        let jitter_us = jitter.as_micros() as u64;
        let took_us = began.elapsed().as_micros() as u64;
        t.samples += 1;
        t.last_jitter_us = jitter_us;
        t.max_jitter_us = t.max_jitter_us.max(jitter_us);
        t.last_sample_us = took_us;
        t.max_sample_us = t.max_sample_us.max(took_us);
        t.last_round_at = Some(Instant::now());
        if t.jitter_us.len() == JITTER_WINDOW {
            t.jitter_us.pop_front();
        }
        t.jitter_us.push_back(jitter_us);
    }
}

impl Agent {
    /// One answer per GPU. Workers on threads are asked together, so a
    /// slow GPU costs one deadline, not one each; inline workers answer
    /// at once, one after the other, with no task spawned for them.
    async fn sample_all(&self) -> Vec<Option<(Answer, Instant)>> {
        let deadline = self.config.deadline;
        let mut results: Vec<Option<(Answer, Instant)>> = vec![None; self.gpus.len()];
        let mut set = tokio::task::JoinSet::new();
        let mut tasks = Vec::new();
        for w in &self.workers {
            if w.is_inline() {
                results[w.index() as usize] = Some(w.sample_dated(deadline).await);
            } else {
                let w = w.clone();
                let i = w.index();
                let task = set.spawn(async move { (w.index(), w.sample_dated(deadline).await) });
                tasks.push((task.id(), i));
            }
        }
        while let Some(r) = set.join_next().await {
            match r {
                Ok((i, r)) => results[i as usize] = Some(r),
                Err(e) => {
                    let gpu = tasks.iter().find(|(id, _)| *id == e.id()).map(|t| t.1);
                    let failed = task_failed(gpu, &e);
                    if let Some(i) = gpu {
                        results[i as usize] = Some((Answer::Now(Err(failed)), Instant::now()));
                    }
                }
            }
        }
        results
    }
}

/// The wall-clock time of an answer that came at `answered`, `wall` being
/// now: a late answer is dated when the GPU gave it, not when it was
/// handed over a round later.
fn dated(wall: TimestampMs, answered: Instant) -> TimestampMs {
    let age = answered.elapsed().as_millis();
    TimestampMs(
        wall.0
            .saturating_sub(u64::try_from(age).unwrap_or(u64::MAX)),
    )
}

/// A sampling task that ended without its answer (it panicked, or was
/// cancelled): logged at error level, and the GPU's reading for the round
/// is this error, not a timeout. `gpu` is `None` when the task cannot be
/// matched to its GPU (the GPU's reading is then a miss).
fn task_failed(gpu: Option<u8>, e: &tokio::task::JoinError) -> GpuError {
    let why = if e.is_panic() {
        "panicked"
    } else {
        "was cancelled"
    };
    let which = gpu.map_or_else(
        || "of an unknown GPU".to_string(),
        |i| format!("of GPU {i}"),
    );
    tracing::error!("the sampling task {which} {why}: {e}; its GPU has no sample this round");
    GpuError::Failed {
        what: "GPU sampling task",
        detail: format!("{why}: {e}"),
    }
}

/// A sample as the health engine reads it.
pub fn observation(s: &GpuSample) -> Observation {
    Observation {
        temp: f64::from(s.temp.0),
        power: f64::from(s.power.0),
        power_limit: f64::from(s.power_limit.0),
        sm_clock: f64::from(s.sm_clock.0),
        util: f64::from(s.util.get()),
        sbe_volatile: u64::from(s.ecc.sbe_volatile),
        dbe_volatile: u64::from(s.ecc.dbe_volatile),
        retired_sbe: u64::from(s.repair.retired_sbe),
        retired_dbe: u64::from(s.repair.retired_dbe),
        retired_pending: s.flags.contains(GpuFlags::RETIRED_PENDING),
        remap_pending: s.flags.contains(GpuFlags::REMAP_PENDING),
        remap_failure: s.flags.contains(GpuFlags::REMAP_FAILURE),
        pcie_replay: u64::from(s.pcie_replay),
        nvlink_crc: u64::from(s.nvlink.crc),
        nvlink_replay: u64::from(s.nvlink.replay),
        nvlink_recovery: u64::from(s.nvlink.recovery),
        throttle: s.throttle,
        recovery_action: s.recovery_action.unwrap_or(0),
        nvlink_links: s.nvlink_links,
        unknown: s.unsupported,
        pcie_held: s.pcie_held,
    }
}

async fn sleep_opt(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::{NvlinkErrors, TimestampMs, Unsupported, WholeCelsius};
    use node_core::health::{HealthEngine, Limits, Output, Policy};

    #[test]
    fn fields_not_supported_reach_the_engine_as_unknown_not_as_zeros() {
        let counting = GpuSample {
            temp: WholeCelsius(60),
            pcie_replay: 1_000,
            nvlink: NvlinkErrors {
                replay: 500,
                ..NvlinkErrors::default()
            },
            ..GpuSample::default()
        };
        // The NVLink and PCIe fields stop answering for a while: zeros,
        // flagged.
        let blind = GpuSample {
            unsupported: Unsupported::NVLINK | Unsupported::PCIE,
            temp: WholeCelsius(60),
            ..GpuSample::default()
        };
        assert_eq!(observation(&blind).unknown, blind.unsupported);
        let limits = Limits {
            max_operating_c: 87.0,
        };
        let mut engine = HealthEngine::new(1, limits, Policy::default(), TimestampMs(0));
        let mut changes = Vec::new();
        for (i, s) in [counting, blind, blind, counting, counting]
            .iter()
            .enumerate()
        {
            let t = TimestampMs(1_000 * (i as u64 + 1));
            changes.extend(
                (engine.sample(t, 0, &observation(s)).into_iter())
                    .filter(|o| matches!(o, Output::Change(_))),
            );
        }
        assert!(changes.is_empty(), "{changes:?}");
    }

    #[tokio::test]
    async fn a_sampling_task_that_panicked_is_a_failure_that_says_so_not_a_timeout() {
        let mut set = tokio::task::JoinSet::new();
        set.spawn(async { panic!("boom") });
        let e = set.join_next().await.unwrap().unwrap_err();
        let failed = task_failed(Some(4), &e);
        assert_ne!(failed, GpuError::Timeout);
        let words = failed.to_string();
        assert!(
            words.starts_with("GPU sampling task failed: panicked"),
            "{words}"
        );
        assert!(words.contains("boom"), "{words}");
    }
}
