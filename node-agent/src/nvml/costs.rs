//! What each NVML call has cost since the agent started: how many times
//! it was made, its total and its slowest time, per call name, for
//! `/metrics` (`loopwarden_nvml_call_seconds`, `loopwarden_nvml_calls_total`).
//! Shared by every GPU of a source; a lock held for a map update only.
//!
//! Glossary:
//! - *cost*: the calls made, their total time and the slowest one.

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

/// Every call's cost, by NVML's name of it.
#[derive(Debug, Clone, Default)]
pub struct CallCosts(Arc<Mutex<BTreeMap<&'static str, Cost>>>);

impl CallCosts {
    /// Counts one call of `call` that took `took`.
    pub fn record(&self, call: &'static str, took: Duration) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let c = map.entry(call).or_default();
        c.calls += 1;
        c.total += took;
        c.max = c.max.max(took);
    }

    /// Every call's cost so far, by name.
    pub fn snapshot(&self) -> Vec<(&'static str, Cost)> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.iter().map(|(k, v)| (*k, *v)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_summed_and_their_slowest_kept() {
        let c = CallCosts::default();
        let shared = c.clone();
        c.record("nvmlDeviceGetTemperature", Duration::from_micros(40));
        shared.record("nvmlDeviceGetTemperature", Duration::from_micros(90));
        c.record("nvmlDeviceGetPowerUsage", Duration::from_micros(5));
        let s = c.snapshot();
        assert_eq!(s.len(), 2);
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
