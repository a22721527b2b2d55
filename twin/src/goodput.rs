//! The job-level twin: what a large synchronous training job loses to
//! failures, under each way of handling them (`docs/goodput.md`).
//!
//! This module holds the vocabulary the parts share: a class of failure
//! ([`FailureClass`]), what a host agent can know of it before it strikes
//! ([`Precursor`], [`LeadTime`]) and how the job's time is spent
//! ([`Lost`]). The job, the failure mix, the Monte Carlo engine and the
//! policies build on it; the `measured` precursor model comes from
//! replaying generated traces through the real health engine
//! (`loopwarden-hall goodput`).
//!
//! Glossary:
//! - *ETT*: effective training time, the share of wall-clock time the job
//!   makes progress (checkpoint writes and lost work excluded).
//! - *precursor*: a sign a host agent can see before the failure (rising
//!   corrected ECC, pending row remaps, PCIe replay bursts, a warning XID).
//! - *lead time*: from the first precursor the health engine flags to the
//!   failure.
//! - *coverage*: the share of a class's failures that show a precursor
//!   the engine flags.
//! - *quarantined flag*: a flag that is a quarantine rather than a
//!   degrade (`Precursor::quarantined` of the flagged failures).
//!
//! The parts: [`job`] (the job and the policies' settings), [`mix`] (the
//! failure mix, Llama 3's by default, or a TOML file), [`draws`] (one
//! trial's failures, drawn once for every policy), [`engine`] (one
//! policy's replay of a trial, where the time goes) and [`trials`] (N
//! trials from a seed, and their summary).

use serde::{Deserialize, Serialize};

pub mod draws;
pub mod engine;
pub mod job;
pub mod mix;
pub mod trials;

#[cfg(test)]
mod tests;

pub use engine::Policy;
pub use job::{Job, JobError, Settings};
pub use mix::{Mix, MixError};
pub use trials::{run, PolicySummary, Summary};

/// How long before a failure its precursor is flagged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum LeadTime {
    /// Always this many hours.
    Fixed {
        /// Hours before the failure.
        hours: f64,
    },
    /// Exponentially distributed, with this mean in hours.
    Exponential {
        /// Mean hours before the failure.
        mean_hours: f64,
    },
    /// Drawn uniformly from these observations, in hours (the `measured`
    /// model: the lead times the health engine achieved on traces).
    Empirical {
        /// Hours before the failure, one per flagged trace.
        hours: Vec<f64>,
    },
}

/// What a host agent can know of a class's failures before they strike.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Precursor {
    /// Share of the class's failures flagged before they strike, 0 to 1.
    pub coverage: f64,
    /// How long before.
    pub lead: LeadTime,
    /// Share of the flagged failures whose flag is a quarantine (the
    /// rest are marked degraded), 0 to 1, taken as quarantined at the
    /// flag. Where the site's quarantine ends the job, such a flag stops
    /// the job at once under both agent policies, as a failure found at
    /// once would, instead of waiting for a drain [default: 0].
    #[serde(default)]
    pub quarantined: f64,
}

impl Precursor {
    /// No warning at all.
    pub fn none() -> Self {
        Self {
            coverage: 0.0,
            lead: LeadTime::Fixed { hours: 0.0 },
            quarantined: 0.0,
        }
    }
}

/// How a failure shows itself to the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Onset {
    /// The job stops at once (a crash): found at once.
    Crash,
    /// The job hangs until a timeout notices (a collective that never
    /// completes).
    Hang,
}

/// One class of interruption, with its share of all interruptions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureClass {
    /// Its name (`faulty_gpu`, `hbm3`, `network_switch`, …).
    pub name: String,
    /// Share of all interruptions, 0 to 1 (a mix's shares sum to 1).
    pub share: f64,
    /// Whether a host agent sees it (a GPU, its memory, its firmware,
    /// its cooling); a switch, a NIC or a software bug it does not.
    pub host_visible: bool,
    /// How it shows itself to the job.
    pub onset: Onset,
    /// What can be known of it before it strikes [default: nothing].
    #[serde(default = "Precursor::none")]
    pub precursor: Precursor,
    /// Whether the job restarts without the failed host, on a spare (a
    /// broken part); a software bug or a switch does not take a host out
    /// [default: yes].
    #[serde(default = "yes")]
    pub excludes_host: bool,
}

fn yes() -> bool {
    true
}

/// Where a trial's GPU time went besides progress, in GPU-hours.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Lost {
    /// Writing checkpoints.
    pub checkpoints: f64,
    /// Work done since the last checkpoint and lost with it.
    pub rework: f64,
    /// Waiting for a hang to be noticed.
    pub detection: f64,
    /// Restarting (excluding the host, rescheduling, reloading).
    pub restart: f64,
    /// Planned restarts of drains (true and false alarms).
    pub drains: f64,
    /// Waiting for a spare host when the pool is empty (until a repaired
    /// host comes back).
    #[serde(default)]
    pub spares: f64,
}

impl Lost {
    /// Every GPU-hour lost.
    pub fn total(&self) -> f64 {
        self.checkpoints + self.rework + self.detection + self.restart + self.drains + self.spares
    }

    /// Adds `other` to this.
    pub fn add(&mut self, other: &Lost) {
        self.checkpoints += other.checkpoints;
        self.rework += other.rework;
        self.detection += other.detection;
        self.restart += other.restart;
        self.drains += other.drains;
        self.spares += other.spares;
    }

    /// Every part times `k`.
    pub fn scaled(&self, k: f64) -> Lost {
        Lost {
            checkpoints: self.checkpoints * k,
            rework: self.rework * k,
            detection: self.detection * k,
            restart: self.restart * k,
            drains: self.drains * k,
            spares: self.spares * k,
        }
    }
}
