//! The job and the settings of the three policies.
//!
//! A synchronous training job on `gpus` GPUs (`gpus_per_host` to a host)
//! runs for `days` of wall-clock time. It checkpoints every
//! `checkpoint_min` minutes of running: each interval is
//! `checkpoint_min·60 − checkpoint_write_s` seconds of training and then
//! `checkpoint_write_s` seconds of writing, so with no failure the share
//! of time spent training is exactly `1 − W/(C·60)`. After a failure it
//! takes `restart_min` to restart from the last checkpoint. A failed host
//! is replaced by one of `spare_hosts`; it comes back to the pool
//! `repair_hours` later. With the pool empty, the job waits for the first
//! host to come back.
//!
//! Glossary:
//! - *C*, *W*, *R*: the checkpoint interval (minutes), its write
//!   (seconds), the restart (minutes), as in `docs/goodput.md`.
//! - *collective timeout*: how long a hung collective waits before the
//!   job is stopped (NCCL's watchdog; 10 minutes by default).
//! - *triage*: after a failure is found, the time a person or a script
//!   takes to name and exclude the bad host when no agent names it.
//! - *false alarm*: a healthy GPU the health engine flags degraded; it
//!   stays in service, and a drain policy drains it as if it were failing.
//! - *false quarantine*: a healthy GPU the health engine quarantines; the
//!   agent keeps its host out of the next restart, and a drain policy
//!   drains it as any flag.
//! - *quarantine action*: what the site's agent does on a quarantine
//!   (`docs/health.md` section 6). Slurm's DRAIN and a `NoSchedule` taint
//!   keep new work off the host but do not end the job running there; a
//!   hung job then waits for the collective timeout like any other.

use serde::{Deserialize, Serialize};

/// The job (section 1 of `docs/goodput.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// GPUs in the job (G).
    pub gpus: u32,
    /// GPUs to a host.
    pub gpus_per_host: u32,
    /// Spare hosts (S).
    pub spare_hosts: u32,
    /// Wall-clock days the job runs (D).
    pub days: f64,
    /// Minutes of running between two checkpoints, the write included (C).
    pub checkpoint_min: f64,
    /// Seconds the job stops to write a checkpoint (W).
    pub checkpoint_write_s: f64,
    /// Minutes from a failure found (or a drain begun) to training again,
    /// from the last checkpoint (R).
    pub restart_min: f64,
    /// Hours until an excluded host is back in the spare pool.
    pub repair_hours: f64,
}

impl Default for Job {
    /// Llama 3 405B's job (16,384 GPUs, 54 days) with this project's
    /// stated settings (`docs/goodput.md` section 3).
    fn default() -> Self {
        Job {
            gpus: 16_384,
            gpus_per_host: 8,
            spare_hosts: 32,
            days: 54.0,
            checkpoint_min: 15.0,
            checkpoint_write_s: 10.0,
            restart_min: 5.0,
            repair_hours: 72.0,
        }
    }
}

/// How the three policies find failures and what a drain costs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Minutes a hung collective waits before the job stops (every hang,
    /// unless the agent sees it and its quarantine ends the job).
    pub hang_timeout_min: f64,
    /// Minutes a person or a script takes to exclude the bad host once a
    /// failure no agent named is found.
    pub triage_min: f64,
    /// Seconds the host agent takes from a failure it sees to the GPU
    /// quarantined (its XID-to-quarantine latency, its stall detection).
    /// It shortens a hang only where the quarantine ends the job, and
    /// never past the collective timeout.
    pub detection_s: f64,
    /// Healthy GPUs flagged degraded per GPU-day: a degraded GPU stays
    /// in service, so only a drain acts on them (drained as if failing).
    pub false_alarms_per_gpu_day: f64,
    /// Healthy GPUs quarantined per GPU-day. The agent's quarantine keeps
    /// the host out of the next restart (a spare, back after the repair
    /// time), and where the quarantine ends the job it also ends the job
    /// at once; a drain drains it as any flag [default: 0].
    #[serde(default)]
    pub false_quarantines_per_gpu_day: f64,
    /// Whether the site's quarantine action ends the job running on the
    /// host (a `scancel` or a requeue among the actions), so that a hang
    /// the agent sees stops the job in `detection_s` rather than at the
    /// collective timeout [default: no; a drain or a taint does not].
    #[serde(default)]
    pub quarantine_ends_job: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            hang_timeout_min: 10.0,
            triage_min: 0.0,
            detection_s: 4.0,
            false_alarms_per_gpu_day: 0.0,
            false_quarantines_per_gpu_day: 0.0,
            quarantine_ends_job: false,
        }
    }
}

/// Why a job or its settings cannot be simulated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JobError {
    /// A figure outside its range.
    #[error("{name} = {value}: {why}")]
    Out {
        /// The input's name, as the command's flag spells it.
        name: &'static str,
        /// Its value.
        value: f64,
        /// The range it must be in.
        why: &'static str,
    },
}

fn check(name: &'static str, value: f64, ok: bool, why: &'static str) -> Result<(), JobError> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(JobError::Out { name, value, why })
    }
}

impl Job {
    /// Checks every figure is in range.
    pub fn validate(&self) -> Result<(), JobError> {
        let g = f64::from(self.gpus);
        check("gpus", g, self.gpus > 0, "at least 1")?;
        let per = f64::from(self.gpus_per_host);
        check("gpus-per-host", per, self.gpus_per_host > 0, "at least 1")?;
        let whole = self.gpus % self.gpus_per_host.max(1) == 0;
        check("gpus", g, whole, "a whole number of hosts")?;
        check(
            "days",
            self.days,
            self.days > 0.0 && self.days <= 3650.0,
            "above 0, at most 3650",
        )?;
        let c = self.checkpoint_min;
        check(
            "checkpoint-min",
            c,
            c > 0.0 && c <= 1440.0 * 30.0,
            "above 0, at most 30 days",
        )?;
        let w = self.checkpoint_write_s;
        check(
            "checkpoint-write-s",
            w,
            w >= 0.0 && w < c * 60.0,
            "from 0 to below the interval",
        )?;
        let r = self.restart_min;
        check(
            "restart-min",
            r,
            (0.0..=1440.0).contains(&r),
            "from 0 to 1440",
        )?;
        let h = self.repair_hours;
        check(
            "repair-hours",
            h,
            (0.0..=8760.0).contains(&h),
            "from 0 to 8760",
        )
    }

    /// Hosts the job runs on.
    pub fn hosts(&self) -> u32 {
        self.gpus / self.gpus_per_host
    }

    /// The wall-clock run, seconds.
    pub fn horizon_s(&self) -> f64 {
        self.days * 86_400.0
    }

    /// The checkpoint interval, seconds (L).
    pub fn interval_s(&self) -> f64 {
        self.checkpoint_min * 60.0
    }

    /// Seconds of training in one interval (L − W).
    pub fn work_s(&self) -> f64 {
        self.interval_s() - self.checkpoint_write_s
    }

    /// The share of time training with no failure: 1 − W/L.
    pub fn ett_without_failures(&self) -> f64 {
        1.0 - self.checkpoint_write_s / self.interval_s()
    }
}

impl Settings {
    /// Checks every figure is in range.
    pub fn validate(&self) -> Result<(), JobError> {
        let t = self.hang_timeout_min;
        check(
            "hang-timeout-min",
            t,
            (0.0..=1440.0).contains(&t),
            "from 0 to 1440",
        )?;
        let m = self.triage_min;
        check(
            "triage-min",
            m,
            (0.0..=1440.0).contains(&m),
            "from 0 to 1440",
        )?;
        let d = self.detection_s;
        check(
            "detection-s",
            d,
            (0.0..=86_400.0).contains(&d),
            "from 0 to 86400",
        )?;
        let f = self.false_alarms_per_gpu_day;
        check(
            "false-alarms-per-gpu-day",
            f,
            (0.0..=1.0).contains(&f),
            "from 0 to 1",
        )?;
        let q = self.false_quarantines_per_gpu_day;
        check(
            "false-quarantines-per-gpu-day",
            q,
            (0.0..=1.0).contains(&q),
            "from 0 to 1",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_job_is_valid_and_its_overhead_is_w_over_c() {
        let j = Job::default();
        j.validate().unwrap();
        Settings::default().validate().unwrap();
        assert_eq!(j.hosts(), 2048);
        assert!((j.ett_without_failures() - (1.0 - 10.0 / 900.0)).abs() < 1e-15);
    }

    #[test]
    fn a_write_as_long_as_the_interval_is_refused_by_name() {
        let j = Job {
            checkpoint_write_s: 1800.0,
            ..Job::default()
        };
        let e = j.validate().unwrap_err().to_string();
        assert_eq!(e, "checkpoint-write-s = 1800: from 0 to below the interval");
        let j = Job {
            gpus: 12,
            ..Job::default()
        };
        assert!(j
            .validate()
            .unwrap_err()
            .to_string()
            .contains("whole number of hosts"));
    }
}
