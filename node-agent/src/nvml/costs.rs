//! What each NVML call has cost since the agent started: how many times
//! it was made, its total and its slowest time, and how many times it
//! failed and how, per call name, for `/metrics`
//! (`loopwarden_nvml_call_seconds`, `loopwarden_nvml_calls_total`,
//! `loopwarden_nvml_call_failures_total`). Shared by every GPU of a
//! source and by the NVML it runs on (its handle lookups, the XID
//! watch's registrations); a lock held for a map update only.
//!
//! Glossary:
//! - *cost*: the calls made, their total time and the slowest one.
//! - *failure*: an answer other than success, by its kind (`not_supported`,
//!   `no_permission`, `gpu_lost`, `timeout`, `invalid_argument`, `other`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One call's cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cost {
    /// Times made.
    pub calls: u64,
    /// Their total time.
    pub total: Duration,
    /// The slowest.
    pub max: Duration,
}

/// Every call's cost and failures, by NVML's name of it.
#[derive(Debug, Clone, Default)]
pub struct CallCosts(Arc<Mutex<Book>>);

#[derive(Debug, Default)]
struct Book {
    costs: BTreeMap<&'static str, Cost>,
    failures: BTreeMap<(&'static str, &'static str), u64>,
}

impl CallCosts {
    /// Counts one call of `call` that took `took`, and its failure by
    /// kind where it failed (`failed`).
    pub fn record(&self, call: &'static str, took: Duration, failed: Option<&'static str>) {
        let mut book = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let c = book.costs.entry(call).or_default();
        c.calls += 1;
        c.total += took;
        c.max = c.max.max(took);
        if let Some(kind) = failed {
            *book.failures.entry((call, kind)).or_default() += 1;
        }
    }

    /// Every call's cost so far, by name.
    pub fn snapshot(&self) -> Vec<(&'static str, Cost)> {
        let book = self.0.lock().unwrap_or_else(|p| p.into_inner());
        book.costs.iter().map(|(k, v)| (*k, *v)).collect()
    }

    /// Every call's failures so far: call, kind, how many.
    pub fn failures(&self) -> Vec<(&'static str, &'static str, u64)> {
        let book = self.0.lock().unwrap_or_else(|p| p.into_inner());
        book.failures
            .iter()
            .map(|(&(c, k), &n)| (c, k, n))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_summed_and_their_slowest_kept() {
        let c = CallCosts::default();
        let shared = c.clone();
        c.record("nvmlDeviceGetTemperature", Duration::from_micros(40), None);
        shared.record(
            "nvmlDeviceGetTemperature",
            Duration::from_micros(90),
            Some("timeout"),
        );
        c.record(
            "nvmlDeviceGetPowerUsage",
            Duration::from_micros(5),
            Some("gpu_lost"),
        );
        c.record(
            "nvmlDeviceGetPowerUsage",
            Duration::from_micros(5),
            Some("gpu_lost"),
        );
        let s = c.snapshot();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].1.calls, 2, "failed calls count as calls");
        assert_eq!(
            c.failures(),
            [
                ("nvmlDeviceGetPowerUsage", "gpu_lost", 2),
                ("nvmlDeviceGetTemperature", "timeout", 1)
            ]
        );
        assert_eq!(s[1].0, "nvmlDeviceGetTemperature");
        assert_eq!(
            s[1].1,
            Cost {
                calls: 2,
                total: Duration::from_micros(130),
                max: Duration::from_micros(90)
            }
        );
    }
}
