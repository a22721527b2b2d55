//! What the console answers from: the [`Snapshot`] the agent's loop
//! publishes after every step (through a [`watch`] channel, see
//! [`snapshot_channel`]), and the [`Context`] that does not change while
//! the agent runs. The console reads these and never the loop's own state,
//! so a question never waits for the loop.
//!
//! Glossary:
//! - *snapshot*: a plain copy of what the loop knows after a step (GPUs,
//!   leases, timing); replaced, never edited.
//! - *jitter window*: the last [`Timing::jitter_us`] ticks, for the
//!   percentiles.

use std::collections::VecDeque;
use std::time::Duration;

pub use loopwarden_bus::resend::ResendCounts;
use loopwarden_bus::resend::Resender;
use loopwarden_bus::Bus;
use loopwarden_protocol::{CapSource, TimestampMs, Watts};
use tokio::sync::watch;

use crate::config::GpuSourceKind;
use crate::gpu::{GpuInfo, GpuSample};
use loopwarden_store::recorder::Recorder;
use node_core::caps::{GpuRange, LeaseView};
use node_core::health::GpuStatus;

/// Timing of the sampling loop, for the console and the benchmarks.
#[derive(Debug, Clone, Default)]
pub struct Timing {
    /// Sampling rounds run.
    pub samples: u64,
    /// The jitter of the last ticks, µs.
    pub jitter_us: VecDeque<u64>,
    /// The jitter of the last tick, µs.
    pub last_jitter_us: u64,
    /// The most jitter seen, µs.
    pub max_jitter_us: u64,
    /// How long the last round took, µs.
    pub last_sample_us: u64,
    /// The longest round, µs.
    pub max_sample_us: u64,
    /// When the last round ended (steady time): the age of what the
    /// console and `/metrics` show; a loop that is stuck shows by it.
    pub last_round_at: Option<std::time::Instant>,
}

impl Timing {
    /// The `p`-th percentile of the jitter window, µs.
    pub fn jitter_percentile(&self, p: f64) -> u64 {
        let mut v: Vec<u64> = self.jitter_us.iter().copied().collect();
        if v.is_empty() {
            return 0;
        }
        v.sort_unstable();
        let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
        v[i.min(v.len() - 1)]
    }
}

/// The site's commands the agent ran (quarantine actions, cooling-loss
/// steps) and how they ended, since the start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SiteActions {
    /// Quarantine actions that ended well.
    pub quarantine_ok: u64,
    /// Quarantine actions that failed (exit status, timeout, cannot start).
    pub quarantine_failed: u64,
    /// Cooling-loss steps' commands that ended well.
    pub cooling_ok: u64,
    /// Cooling-loss steps' commands that failed.
    pub cooling_failed: u64,
    /// The newest failure of either kind still outstanding: a failure
    /// is outstanding until a later run of the same (its retry: the same
    /// GPU's quarantine, the same cooling-loss step), or of the
    /// cooling-loss step that undoes it (the resume a drain, the power-up
    /// a power-down), ended well ([`SiteActions::ended_well`]) or will
    /// not run again ([`SiteActions::forget`]).
    pub last_failure: Option<ActionFailure>,
    /// The failures outstanding, one per `what` (its newest), oldest
    /// first.
    outstanding: Vec<ActionFailure>,
}

/// A site command that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionFailure {
    /// When it ended (wall clock).
    pub at: TimestampMs,
    /// What it ran for: `quarantine of GPU 3`, `cooling-loss drain`.
    pub what: String,
    /// The program.
    pub program: String,
    /// How it failed (exit status and its output's tail, timeout, cannot start).
    pub detail: String,
}

/// The cooling-loss step whose failure a run for `what` ending well
/// undoes, as [`ActionFailure::what`] names it: the resume undoes the
/// drain (the host takes work again), the power-up the power-down (the
/// GPUs powered again); `None` for anything else. A run of the undoing
/// step that failed undoes nothing: both failures stay outstanding.
fn undone_by(what: &str) -> Option<String> {
    use loopwarden_protocol::CoolingStep::{Drain, PowerDown, PowerUp, Resume};
    [(Resume, Drain), (PowerUp, PowerDown)]
        .into_iter()
        .find(|(undoing, _)| what == format!("cooling-loss {undoing}"))
        .map(|(_, undone)| format!("cooling-loss {undone}"))
}

/// Which of the site's commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionKind {
    /// A quarantine's actions (`[quarantine] actions`).
    Quarantine,
    /// A cooling-loss step's command (`[cooling_loss]`).
    CoolingLoss,
}

impl SiteActions {
    /// Counts one outcome of a `kind` command; a failure becomes the last,
    /// in place of an earlier one for the same thing.
    pub fn count(&mut self, kind: ActionKind, ok: bool, failure: impl FnOnce() -> ActionFailure) {
        let n = match (kind, ok) {
            (ActionKind::Quarantine, true) => &mut self.quarantine_ok,
            (ActionKind::Quarantine, false) => &mut self.quarantine_failed,
            (ActionKind::CoolingLoss, true) => &mut self.cooling_ok,
            (ActionKind::CoolingLoss, false) => &mut self.cooling_failed,
        };
        *n += 1;
        if !ok {
            let f = failure();
            self.outstanding.retain(|o| o.what != f.what);
            self.outstanding.push(f);
            self.last_failure = self.outstanding.last().cloned();
        }
    }

    /// A run for `what` (`quarantine of GPU 3`, `cooling-loss drain`)
    /// ended well, every command of it: `what`'s failure is outstanding no
    /// more, nor that of the cooling-loss step it undoes, if it is one
    /// ([`undone_by`]: a drain that failed is not run again once the
    /// resume has ended well); the newest other one still outstanding is
    /// shown (the counts stay).
    pub fn ended_well(&mut self, what: &str) {
        let undone = undone_by(what);
        self.outstanding
            .retain(|o| o.what != what && undone.as_deref() != Some(o.what.as_str()));
        self.last_failure = self.outstanding.last().cloned();
    }

    /// No run for `what` follows its failure (the GPU released or
    /// quarantined anew): shown no more, as if it ended well.
    pub fn forget(&mut self, what: &str) {
        self.ended_well(what)
    }
}

/// One GPU as the loop last saw it.
#[derive(Debug, Clone)]
pub struct GpuView {
    /// Its identity and limits, read at start.
    pub info: GpuInfo,
    /// Its settable range.
    pub range: GpuRange,
    /// The limit it runs at uncapped (what the site left on it).
    pub ceiling: Watts,
    /// The last sample that answered.
    pub last: Option<GpuSample>,
    /// When the agent got that sample (wall ms); `None` before the first.
    pub sampled_at: Option<TimestampMs>,
    /// Whether the last sample answered.
    pub responsive: bool,
    /// Samples missed in a row.
    pub missed: u32,
    /// Whether it was reported unresponsive.
    pub unresponsive_reported: bool,
    /// Why the last sample failed.
    pub last_error: Option<String>,
    /// The quarantine action of its last quarantine that failed, with how,
    /// until a later run of its actions ends well.
    pub action_failed: Option<String>,
    /// The limit read back after the last set (or at start).
    pub applied: Option<Watts>,
    /// Who set that limit.
    pub source: Option<CapSource>,
    /// The thermal guard's cap, if any.
    pub guard_cap: Option<Watts>,
    /// Recent XIDs, oldest first.
    pub xids: Vec<(TimestampMs, u16)>,
    /// Its health as the engine holds it.
    pub health: Option<GpuStatus>,
    /// How long its sample calls take, and how many answered late.
    pub calls: crate::worker::CallTimes,
}

/// What the loop knows after a step; empty by default (no GPU, no lease,
/// nothing counted).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Timing of the sampling loop.
    pub timing: Timing,
    /// Every GPU, by index.
    pub gpus: Vec<GpuView>,
    /// The leases held.
    pub leases: Vec<LeaseView>,
    /// XID events waiting in the bounded queue.
    pub xids_queued: usize,
    /// XID events the queue dropped in storms since the start.
    pub xids_dropped: u64,
    /// Acks to refused commands withheld by the rate limit since the start.
    pub acks_withheld: u64,
    /// The site's commands run since the start, and how they ended.
    pub actions: SiteActions,
    /// Since when the XID watch has been down, if it is.
    pub xid_watch_down: Option<TimestampMs>,
    /// Since when every GPU has been silent together, if they are.
    pub stalled_since: Option<TimestampMs>,
    /// Where the host is in a cooling loss (times in steady ms).
    pub cooling: node_core::cooling_loss::Phase,
    /// The phase kept before the restart could not be read back and the
    /// CDU has not said since: `cooling` is not known.
    pub cooling_unknown: bool,
    /// The wall clock minus steady time, ms (for showing `cooling`).
    pub wall_offset_ms: i64,
    /// Config values the flash refused to keep since the start
    /// (quarantines, limits, the cooling phase, replay floors).
    pub flash_refused: u64,
    /// When a step first saw the last of them (wall clock).
    pub flash_refused_at: Option<TimestampMs>,
    /// The longest the agent waits for one GPU call (`deadline_ms`).
    pub deadline: Duration,
    /// The config store found lost at this start, its lost mark standing
    /// (every start reads the store as lost until it clears): what the
    /// clear waits for. `None`: found intact, or the mark cleared.
    pub config_lost: Option<ConfigLost>,
    /// Per GPU quarantined, the indexes its quarantine actions ran under
    /// before the GPUs were numbered otherwise: what they left there (a
    /// drain tagged `gpu{was}`) may still stand, to undo by hand.
    pub stale_indexes: Vec<(u8, Vec<u8>)>,
}

/// What the lost mark of a config store found lost at this start still
/// waits for, or why it stays for this run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigLost {
    /// The GPUs whose UUIDs were unknown at the start and not said since.
    pub waiting_for: Vec<u8>,
    /// The cooling-loss phase not known yet: the CDU's word decides it.
    pub phase_unknown: bool,
    /// The cooling-loss phase known (the CDU's word decided it) but not
    /// handed to the flash: kept at its next change.
    pub phase_not_kept: bool,
    /// The GPUs whose records were not kept (their limits when they
    /// said their UUIDs, their health states): the mark stays for this
    /// run.
    pub not_kept: Vec<u8>,
    /// Why the mark stays for this run whatever comes (what the start
    /// took back not kept), if it does.
    pub stays: Option<String>,
    /// All kept: the clear is under way.
    pub clearing: bool,
}

impl Snapshot {
    /// When the flash last refused a config value, given the count now
    /// and the time now: this snapshot's time while the count is the same,
    /// `now` when it rose since (a refusal is dated to the step that saw it).
    pub fn flash_refused_since(&self, refused: u64, now: TimestampMs) -> Option<TimestampMs> {
        if refused > self.flash_refused {
            Some(now)
        } else {
            self.flash_refused_at
        }
    }
}

/// A snapshot channel: the sender goes to the loop, the receiver into the
/// [`Context`]. `None` until the loop has put its first targets in force.
pub fn snapshot_channel() -> (
    watch::Sender<Option<Snapshot>>,
    watch::Receiver<Option<Snapshot>>,
) {
    watch::channel(None)
}

/// What the console answers from.
#[derive(Clone)]
pub struct Context {
    /// Site.
    pub site: String,
    /// This host.
    pub host: String,
    /// Where the GPUs come from.
    pub gpu_source: GpuSourceKind,
    /// How many GPUs the host has (`expected_gpus`), if configured.
    pub expected_gpus: Option<u8>,
    /// The sampling period.
    pub period: Duration,
    /// When the agent started.
    pub started: TimestampMs,
    /// The flash file, `None` when kept in memory.
    pub flash_path: Option<String>,
    /// Commands are checked against the public demonstration key.
    pub demo_key: bool,
    /// The protections switched off on purpose (`commands = "none"`,
    /// `cooling = "not_managed"`, ...), shown as long as the agent runs.
    pub protection_off: Vec<crate::config::OptOut>,
    /// The bus (connection and counters).
    pub bus: Bus,
    /// The event log and the outbox queue.
    pub recorder: Recorder,
    /// The loop's snapshots.
    pub snapshot: watch::Receiver<Option<Snapshot>>,
    /// What each NVML call has cost (`None` on simulated GPUs).
    pub nvml_costs: Option<crate::nvml::CallCosts>,
    /// The console socket's refusals and idle closes.
    pub console_stats: loopwarden_field::listen::ListenStats,
    /// The resender of the host's logged events (only its counts are
    /// read here).
    pub resender: Resender,
}

impl Context {
    /// GPUs configured (`expected_gpus`) but not found, of the `found`;
    /// `None` when no count is configured.
    pub fn gpus_missing(&self, found: usize) -> Option<usize> {
        self.expected_gpus
            .map(|want| usize::from(want).saturating_sub(found))
    }

    /// What the resender has done so far.
    pub fn resends(&self) -> ResendCounts {
        self.resender.counts().snapshot()
    }
}

/// A degraded, capped H200 as the loop shows it, for the tests.
#[cfg(test)]
pub(crate) fn test_view() -> GpuView {
    GpuView {
        info: crate::gpu::GpuInfo {
            name: "NVIDIA H200".into(),
            uuid: "GPU-1234".into(),
            default_limit: Watts(700),
            min_limit: Watts(200),
            max_limit: Watts(700),
            persistence: Some(true),
        },
        range: GpuRange {
            min: Watts(200),
            max: Watts(700),
        },
        ceiling: Watts(700),
        last: Some(crate::gpu::GpuSample {
            temp: loopwarden_protocol::WholeCelsius(71),
            power: Watts(650),
            power_limit: Watts(500),
            throttle: loopwarden_protocol::ThrottleReasons::SW_POWER_CAP,
            unsupported: loopwarden_protocol::Unsupported::NVLINK
                | loopwarden_protocol::Unsupported::MEM_TEMP,
            ..Default::default()
        }),
        sampled_at: Some(TimestampMs(1_700_000_000_000)),
        responsive: true,
        missed: 0,
        unresponsive_reported: false,
        last_error: None,
        action_failed: None,
        applied: Some(Watts(500)),
        source: Some(CapSource::Cooling),
        guard_cap: None,
        xids: vec![(TimestampMs(1), 31), (TimestampMs(2), 48)],
        health: Some(node_core::health::GpuStatus {
            state: loopwarden_protocol::HealthState::Degraded,
            reason: loopwarden_protocol::ReasonCode(1001),
            since: TimestampMs(1_700_000_000_000),
            evidence: String::new(),
        }),
        calls: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(what: &str) -> ActionFailure {
        ActionFailure {
            at: TimestampMs(1_700_000_000_000),
            what: what.into(),
            program: "loopwarden-slurm".into(),
            detail: "exit 1: scontrol show node h07 failed".into(),
        }
    }

    #[test]
    fn a_failure_is_shown_until_a_later_run_for_the_same_thing_ends_well() {
        let mut a = SiteActions::default();
        a.count(ActionKind::Quarantine, false, || {
            failure("quarantine of GPU 3")
        });
        // Another GPU's run, or a cooling-loss step, ending well leaves it.
        a.count(ActionKind::Quarantine, true, || {
            failure("quarantine of GPU 4")
        });
        a.ended_well("quarantine of GPU 4");
        a.ended_well("cooling-loss drain");
        assert_eq!(a.last_failure, Some(failure("quarantine of GPU 3")));
        // Its retry ends well: no failure left to show, the counts kept.
        a.count(ActionKind::Quarantine, true, || {
            failure("quarantine of GPU 3")
        });
        a.ended_well("quarantine of GPU 3");
        assert_eq!(a.last_failure, None);
        assert_eq!((a.quarantine_ok, a.quarantine_failed), (2, 1));
        // The same for a cooling-loss drain.
        a.count(ActionKind::CoolingLoss, false, || {
            failure("cooling-loss drain")
        });
        a.ended_well("cooling-loss drain");
        assert_eq!(a.last_failure, None);
        assert_eq!(a.cooling_failed, 1);
    }

    /// GPU 3's drain fails, then GPU 4's; GPU 4's retry ending well shows
    /// GPU 3's again, still outstanding, not nothing; one that will not
    /// run again (its GPU released) is shown no more.
    #[test]
    fn the_newest_failure_still_outstanding_is_shown() {
        let mut a = SiteActions::default();
        a.count(ActionKind::Quarantine, false, || {
            failure("quarantine of GPU 3")
        });
        a.count(ActionKind::Quarantine, false, || {
            failure("quarantine of GPU 4")
        });
        assert_eq!(a.last_failure, Some(failure("quarantine of GPU 4")));
        a.ended_well("quarantine of GPU 4");
        assert_eq!(a.last_failure, Some(failure("quarantine of GPU 3")));
        // GPU 3 fails again after GPU 4 failed anew: GPU 3's is the newest.
        a.count(ActionKind::Quarantine, false, || {
            failure("quarantine of GPU 4")
        });
        a.count(ActionKind::Quarantine, false, || {
            failure("quarantine of GPU 3")
        });
        a.forget("quarantine of GPU 3");
        assert_eq!(a.last_failure, Some(failure("quarantine of GPU 4")));
        a.forget("quarantine of GPU 4");
        assert_eq!(a.last_failure, None);
        assert_eq!(a.quarantine_failed, 4);
    }

    /// A cooling-loss drain that failed is undone by the resume that ends
    /// well once cooling is back: its row goes with it (it will not run
    /// again). A resume that fails leaves it, the resume's failure shown
    /// first; a power-down that failed goes once the power-up ends well,
    /// not by a resume alone, nor does another kind's failure go.
    #[test]
    fn a_failed_cooling_step_goes_once_the_step_that_undoes_it_ends_well() {
        let mut a = SiteActions::default();
        let drain = || failure("cooling-loss drain");
        a.count(ActionKind::Quarantine, false, || {
            failure("quarantine of GPU 3")
        });
        a.count(ActionKind::CoolingLoss, false, drain);
        a.count(ActionKind::CoolingLoss, false, || {
            failure("cooling-loss resume")
        });
        assert_eq!(a.last_failure, Some(failure("cooling-loss resume")));
        a.ended_well("cooling-loss power-up");
        assert_eq!(a.last_failure, Some(failure("cooling-loss resume")));
        a.ended_well("cooling-loss resume");
        assert_eq!(a.last_failure, Some(failure("quarantine of GPU 3")));
        a.forget("quarantine of GPU 3");
        a.count(ActionKind::CoolingLoss, false, || {
            failure("cooling-loss power-down")
        });
        a.count(ActionKind::CoolingLoss, false, drain);
        a.ended_well("cooling-loss resume");
        assert_eq!(a.last_failure, Some(failure("cooling-loss power-down")));
        a.ended_well("cooling-loss power-up");
        assert_eq!(a.last_failure, None);
        assert_eq!(a.cooling_failed, 4);
    }
}
