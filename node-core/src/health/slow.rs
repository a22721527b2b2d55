//! The slow counters as the agent reads them: every few seconds, not
//! every sample (its NVML schedule). [`SlowCounters`] turns a trace's
//! observations, where every counter is fresh at every sample, into what
//! the engine sees live: retired pages, the row-remap flags and the
//! recovery action as last read, read again once `every_ms` has passed
//! since the last read, and at once at the first sample after the GPU's
//! volatile ECC counts moved or it reported an XID (a page is retired, a
//! row remapped, only after an ECC error, and the driver says so with an
//! XID: 48, 63, 64, 94, 95). So `node-agent replay --slow-counters-s` and
//! the tests score the rules under the schedule the agent runs.
//!
//! The PCIe replay counter rides in the field-value query the agent makes
//! every sample, so it passes through fresh too; only a GPU with no other
//! per-sample field value reads it with the slow counters
//! ([`SlowCounters::pcie_with_slow`] plays that: held between reads, the
//! sample marked [`Observation::pcie_held`], and unknown as its read
//! was: a failed read stays unknown until the next). The volatile ECC
//! counts, the NVLink totals, temperatures, power, clocks and clock-event
//! reasons are read at every sample and pass through. (The per-link NVLink
//! counters are slow too, but read at once whenever the totals move, so
//! they are as fresh as the totals when it matters; traces carry only
//! the totals.)
//!
//! Glossary:
//! - *slow counters*: the fields above that are read every `every_ms`.
//! - *held*: their values as last read.

use loopwarden_protocol::Unsupported;

use super::Observation;

/// The slow counters of every GPU, as last read.
#[derive(Debug, Clone)]
pub struct SlowCounters {
    every_ms: u64,
    /// Per GPU: when last read, and what.
    held: Vec<Option<(u64, Observation)>>,
    /// Per GPU: an XID came since the last read.
    nudged: Vec<bool>,
    /// The PCIe replay counter is read with the slow counters, not every
    /// sample.
    pcie_slow: bool,
}

impl SlowCounters {
    /// Slow counters of `gpus` GPUs read every `every_ms` (0: every
    /// sample).
    pub fn new(gpus: usize, every_ms: u64) -> Self {
        Self {
            every_ms,
            held: vec![None; gpus],
            nudged: vec![false; gpus],
            pcie_slow: false,
        }
    }

    /// The PCIe replay counter read with the slow counters too, held
    /// between their reads, as on a GPU with no other per-sample field
    /// value to carry it.
    pub fn pcie_with_slow(mut self) -> Self {
        self.pcie_slow = true;
        self
    }

    /// GPU `gpu` reported an XID: its slow counters are read at its next
    /// sample.
    pub fn xid(&mut self, gpu: usize) {
        if let Some(n) = self.nudged.get_mut(gpu) {
            *n = true;
        }
    }

    /// `o`, GPU `gpu`'s sample at `t`, as the agent would have read it:
    /// its slow counters fresh if a read is due, else as last read.
    pub fn read(&mut self, t: u64, gpu: usize, o: &Observation) -> Observation {
        let (Some(slot), Some(nudged)) = (self.held.get_mut(gpu), self.nudged.get_mut(gpu)) else {
            return *o;
        };
        let nudged = std::mem::take(nudged);
        match slot {
            Some((at, held))
                if t.saturating_sub(*at) < self.every_ms
                    && t >= *at
                    && !nudged
                    && (o.sbe_volatile, o.dbe_volatile)
                        == (held.sbe_volatile, held.dbe_volatile) =>
            {
                let mut seen = *o;
                seen.retired_sbe = held.retired_sbe;
                seen.retired_dbe = held.retired_dbe;
                seen.retired_pending = held.retired_pending;
                seen.remap_pending = held.remap_pending;
                seen.remap_failure = held.remap_failure;
                seen.recovery_action = held.recovery_action;
                if self.pcie_slow {
                    // Known as its read was: a failed read stays unknown
                    // until the next, as the agent holds it.
                    seen.pcie_replay = held.pcie_replay;
                    seen.pcie_held = true;
                    let failed = held.unknown.contains(Unsupported::PCIE);
                    seen.unknown = seen.unknown.with(Unsupported::PCIE, failed);
                }
                seen
            }
            _ => {
                *slot = Some((t, *o));
                *o
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_counters_are_held_between_reads_and_the_rest_passes() {
        let mut s = SlowCounters::new(2, 30_000);
        let o = |t: u64| Observation {
            temp: 60.0 + t as f64 / 1000.0,
            pcie_replay: t / 1000,
            nvlink_replay: t / 1000,
            remap_pending: t >= 5_000,
            ..Observation::default()
        };
        assert_eq!(s.read(0, 0, &o(0)), o(0), "the first is read");
        let seen = s.read(10_000, 0, &o(10_000));
        assert_eq!(seen.pcie_replay, 10, "fresh: read every sample");
        assert!(!seen.pcie_held);
        assert!(!seen.remap_pending, "held");
        assert_eq!(seen.nvlink_replay, 10, "fast");
        assert_eq!(seen.temp, 70.0, "fast");
        assert_eq!(s.read(30_000, 0, &o(30_000)), o(30_000), "read again");
        let moved = Observation {
            sbe_volatile: 1,
            ..o(31_000)
        };
        assert_eq!(
            s.read(31_000, 0, &moved),
            moved,
            "an ECC error: read at once"
        );
        let later = |t: u64| Observation {
            sbe_volatile: 1,
            ..o(t)
        };
        let remapped = |t: u64| Observation {
            retired_sbe: 1,
            ..later(t)
        };
        assert_eq!(
            s.read(32_000, 0, &remapped(32_000)).retired_sbe,
            0,
            "held again"
        );
        s.xid(0);
        assert_eq!(
            s.read(33_000, 0, &remapped(33_000)).retired_sbe,
            1,
            "an XID: read at once"
        );
        assert_eq!(s.read(31_000, 1, &o(31_000)), o(31_000), "each GPU its own");
        let mut every = SlowCounters::new(1, 0);
        assert_eq!(every.read(1, 0, &o(1)), o(1));
        assert_eq!(every.read(2, 0, &o(2)), o(2));
    }

    #[test]
    fn the_pcie_replay_counter_is_held_with_them_only_where_read_with_them() {
        let mut s = SlowCounters::new(1, 30_000).pcie_with_slow();
        let o = |t: u64| Observation {
            pcie_replay: t / 1000,
            ..Observation::default()
        };
        assert_eq!(s.read(0, 0, &o(0)), o(0), "the first is read");
        let seen = s.read(10_000, 0, &o(10_000));
        assert_eq!((seen.pcie_replay, seen.pcie_held), (0, true), "held");
        assert_eq!(s.read(30_000, 0, &o(30_000)), o(30_000), "read again");
    }

    #[test]
    fn a_held_pcie_replay_counter_is_known_as_its_read_was() {
        let mut s = SlowCounters::new(1, 30_000).pcie_with_slow();
        let o = |t: u64, failed: bool| Observation {
            pcie_replay: t / 1000,
            unknown: Unsupported::empty().with(Unsupported::PCIE, failed),
            ..Observation::default()
        };
        assert_eq!(s.read(0, 0, &o(0, true)), o(0, true), "a failed read");
        let seen = s.read(10_000, 0, &o(10_000, false));
        assert!(seen.pcie_held);
        assert!(
            seen.unknown.contains(Unsupported::PCIE),
            "held from a failed read: unknown until read again"
        );
        assert_eq!(s.read(30_000, 0, &o(30_000, false)), o(30_000, false));
        let seen = s.read(40_000, 0, &o(40_000, true));
        assert_eq!((seen.pcie_replay, seen.pcie_held), (30, true));
        assert!(
            !seen.unknown.contains(Unsupported::PCIE),
            "held from a good read: known, not read at this sample"
        );
        // Read every sample, the sample's own read says.
        let mut fresh = SlowCounters::new(1, 30_000);
        assert_eq!(fresh.read(0, 0, &o(0, true)), o(0, true));
        assert_eq!(fresh.read(10_000, 0, &o(10_000, false)), o(10_000, false));
    }
}
