//! What a sample does not know. A GPU that answers "not supported" for a
//! group of fields (a driver that stopped answering for a counter, a
//! GPU in a bad state) sends zeros in their place, flagged in
//! [`Observation::unknown`]. Read as values, those zeros would be a
//! reset of every counter, and the real counts when the group answers
//! again a rise of everything the GPU ever counted: a healthy GPU's
//! NVLink replays since boot taken for new errors, and quarantined.
//!
//! So before the rules read a sample ([`settle`]):
//! - a counter group the sample does not know holds the values last
//!   known: no rise and no fall, and a pending page retirement or row
//!   remap stays pending (the rules on it are blind, never told "all
//!   clear");
//! - a group known again after samples that did not know it is judged
//!   from its new values on, as a first sample would be: what piled up
//!   unseen is not one sample's rise. (A rate window, of PCIe replays,
//!   corrected ECC or NVLink CRC errors, takes no point from a sample
//!   that does not know its counter and counts across the gap, its
//!   streak paused: `rules`.) Except the volatile double-bit ECC count: any uncorrectable error
//!   counted since the last known count (or, never known, since the
//!   driver loaded) needs a reset whenever it happened, so it is judged
//!   against the count held, as a first sample is judged above 0.
//!
//! Glossary:
//! - *counter group*: the fields of a sample one [`Unsupported`] bit
//!   covers that the rules read as counts or flags: ECC, retired pages,
//!   row remapping, PCIe replays, NVLink.
//! - *held*: a group's values as last known, standing in for unknown
//!   ones.
//! - *rebased*: a group known again, judged from its new values.

use loopwarden_protocol::Unsupported;

use super::Observation;

/// The groups whose fields the rules read as counts or flags.
const COUNTER_GROUPS: [Unsupported; 5] = [
    Unsupported::ECC,
    Unsupported::RETIRED,
    Unsupported::REMAP,
    Unsupported::PCIE,
    Unsupported::NVLINK,
];

/// A sample settled for the rules ([`settle`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Settled {
    /// The sample, unknown counter groups held from the last known.
    pub now: Observation,
    /// The previous sample to judge a rise against, rebased groups set to
    /// their new values.
    pub prev: Option<Observation>,
}

/// `o` as the rules judge it after `prev` (the previous sample, as
/// settled): each counter group `o` does not know holds `prev`'s values,
/// and each group `o` knows again after `prev` did not is rebased.
pub(super) fn settle(o: &Observation, prev: Option<Observation>) -> Settled {
    let mut now = *o;
    let mut base = prev;
    if let Some(p) = prev {
        for g in COUNTER_GROUPS {
            if o.unknown.contains(g) {
                copy_group(&mut now, &p, g);
            } else if p.unknown.contains(g) {
                let b = base.as_mut().expect("prev is some");
                copy_group(b, o, g);
                if g == Unsupported::ECC {
                    b.dbe_volatile = p.dbe_volatile;
                }
            }
        }
    }
    Settled { now, prev: base }
}

/// Copies group `g`'s fields from `from` into `to`.
fn copy_group(to: &mut Observation, from: &Observation, g: Unsupported) {
    if g == Unsupported::ECC {
        to.sbe_volatile = from.sbe_volatile;
        to.dbe_volatile = from.dbe_volatile;
    } else if g == Unsupported::RETIRED {
        to.retired_sbe = from.retired_sbe;
        to.retired_dbe = from.retired_dbe;
        to.retired_pending = from.retired_pending;
    } else if g == Unsupported::REMAP {
        to.remap_pending = from.remap_pending;
        to.remap_failure = from.remap_failure;
    } else if g == Unsupported::PCIE {
        to.pcie_replay = from.pcie_replay;
    } else if g == Unsupported::NVLINK {
        to.nvlink_crc = from.nvlink_crc;
        to.nvlink_replay = from.nvlink_replay;
        to.nvlink_recovery = from.nvlink_recovery;
        to.nvlink_links = from.nvlink_links;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counting(n: u64) -> Observation {
        Observation {
            sbe_volatile: n,
            pcie_replay: n,
            nvlink_replay: n,
            remap_pending: true,
            ..Observation::default()
        }
    }

    fn unknown(g: Unsupported) -> Observation {
        Observation {
            unknown: g,
            ..Observation::default()
        }
    }

    #[test]
    fn an_unknown_group_holds_its_last_values_and_the_others_pass() {
        let s = settle(
            &Observation {
                sbe_volatile: 9,
                ..unknown(Unsupported::NVLINK | Unsupported::REMAP)
            },
            Some(counting(5)),
        );
        assert_eq!(s.now.nvlink_replay, 5, "held, not a reset to 0");
        assert!(s.now.remap_pending, "still pending");
        assert_eq!((s.now.sbe_volatile, s.now.pcie_replay), (9, 0), "known");
        assert_eq!(s.prev, Some(counting(5)));
    }

    #[test]
    fn a_group_known_again_is_judged_from_its_new_values() {
        let blind = Observation {
            unknown: Unsupported::NVLINK,
            ..counting(5)
        };
        let s = settle(&counting(800), Some(blind));
        let prev = s.prev.unwrap();
        assert_eq!(prev.nvlink_replay, 800, "no rise across the gap");
        assert_eq!(prev.pcie_replay, 5, "a group known throughout rises");
        assert_eq!(s.now, counting(800));
    }

    use super::super::tests::engine;
    use super::super::Output;
    use loopwarden_protocol::TimestampMs;

    /// A loaded, healthy H200 that counted a little since boot.
    fn loaded() -> Observation {
        Observation {
            temp: 60.0,
            power: 500.0,
            power_limit: 700.0,
            sm_clock: 1_400.0,
            util: 100.0,
            sbe_volatile: 40,
            pcie_replay: 1_000,
            nvlink_crc: 300,
            nvlink_replay: 500,
            nvlink_recovery: 2,
            ..Observation::default()
        }
    }

    /// Four GPUs sampled every `period_ms` for `secs`, GPU 0's sample at
    /// each time from `gpu0`; the state changes, as (GPU, state, reason).
    fn play(period_ms: u64, secs: u64, gpu0: impl Fn(u64) -> Observation) -> Vec<String> {
        let mut e = engine(4);
        let mut changes = Vec::new();
        for t in (period_ms..=secs * 1000).step_by(period_ms as usize) {
            for g in 0..4u8 {
                let o = if g == 0 { gpu0(t) } else { loaded() };
                for out in e.sample(TimestampMs(t + u64::from(g)), g, &o) {
                    if let Output::Change(c) = out {
                        changes.push(format!("gpu {} {:?} {}", c.gpu, c.to, c.reason));
                    }
                }
            }
        }
        changes
    }

    /// GPU 0 says "not supported" for `groups` from 60 s to 120 s (its
    /// fields zeros), else `loaded()`.
    fn blind_a_minute(groups: Unsupported) -> impl Fn(u64) -> Observation {
        move |t| {
            if (60_000..120_000).contains(&t) {
                Observation {
                    unknown: groups,
                    ..Observation::default()
                }
            } else {
                loaded()
            }
        }
    }

    #[test]
    fn counters_that_stop_answering_and_come_back_raise_nothing() {
        let all = COUNTER_GROUPS
            .into_iter()
            .fold(Unsupported::empty(), |a, g| a | g);
        // Read as values, the zeros and then the counts since boot are a
        // rise of 500 NVLink replays: a quarantine.
        assert_eq!(play(1_000, 600, blind_a_minute(all)), Vec::<String>::new());
    }

    #[test]
    fn clocks_not_known_make_no_straggler() {
        let blind = Unsupported::CLOCKS | Unsupported::THROTTLE;
        let gpu0 = |t: u64| Observation {
            unknown: if t < 300_000 {
                blind
            } else {
                Unsupported::empty()
            },
            sm_clock: if t < 300_000 { 0.0 } else { 1_400.0 },
            throttle: Default::default(),
            ..loaded()
        };
        assert_eq!(play(1_000, 400, gpu0), Vec::<String>::new());
        // The same clock, known, is a straggler.
        let known = |_| Observation {
            sm_clock: 700.0,
            ..loaded()
        };
        assert_eq!(play(1_000, 400, known), ["gpu 0 Degraded straggler"]);
    }

    #[test]
    fn a_pending_remap_not_known_for_hours_stays_pending() {
        let gpu0 = |t: u64| Observation {
            remap_pending: t < 60_000,
            unknown: if t < 60_000 {
                Unsupported::empty()
            } else {
                Unsupported::REMAP
            },
            ..loaded()
        };
        // Past the 6 h quiet period, at a 30 s period.
        let changes = play(30_000, 7 * 3_600, gpu0);
        assert_eq!(changes, ["gpu 0 Degraded remap-pending"]);
    }

    /// Double-bit ECC errors counted while ECC was not known, or before
    /// it was ever known, quarantine when it is known again; single-bit
    /// ones (a rate) do not count as a rise across the gap.
    #[test]
    fn uncorrectable_errors_counted_unseen_quarantine_when_seen() {
        let gpu0 = |dbe_from: u64| {
            move |t: u64| Observation {
                unknown: if (60_000..120_000).contains(&t) {
                    Unsupported::ECC
                } else {
                    Unsupported::empty()
                },
                dbe_volatile: u64::from(t >= 120_000 && t >= dbe_from),
                sbe_volatile: if t >= 120_000 { 90_000 } else { 40 },
                ..loaded()
            }
        };
        assert_eq!(
            play(1_000, 300, gpu0(0)),
            ["gpu 0 Quarantined dbe-volatile"]
        );
        // Not known from the start, then known with a count: as a first
        // sample above 0.
        let from_start = |t: u64| Observation {
            unknown: if t < 60_000 {
                Unsupported::ECC
            } else {
                Unsupported::empty()
            },
            dbe_volatile: u64::from(t >= 60_000),
            ..loaded()
        };
        assert_eq!(
            play(1_000, 120, from_start),
            ["gpu 0 Quarantined dbe-volatile"]
        );
        // Known at 0 again: nothing.
        let clean = |t: u64| Observation {
            unknown: if (60_000..120_000).contains(&t) {
                Unsupported::ECC
            } else {
                Unsupported::empty()
            },
            ..loaded()
        };
        assert_eq!(play(1_000, 300, clean), Vec::<String>::new());
    }

    /// Rates below their limits at a period that does not divide the
    /// minute (the window then spans 90 s) raise nothing; above them they
    /// still degrade.
    #[test]
    fn rates_below_the_limit_at_a_45_s_period_raise_nothing() {
        let below = |t: u64| Observation {
            sbe_volatile: 40 + t * 70 / 60_000,
            pcie_replay: 1_000 + t * 6 / 60_000,
            nvlink_crc: 300 + t * 80 / 1_000,
            ..loaded()
        };
        assert_eq!(play(45_000, 600, below), Vec::<String>::new());
        let sbe_above = |t: u64| Observation {
            sbe_volatile: 40 + t * 130 / 60_000,
            ..loaded()
        };
        assert_eq!(
            play(45_000, 600, sbe_above),
            ["gpu 0 Degraded sbe-rate-rising"]
        );
        let pcie_above = |t: u64| Observation {
            pcie_replay: 1_000 + t * 12 / 60_000,
            ..loaded()
        };
        assert_eq!(
            play(45_000, 600, pcie_above),
            ["gpu 0 Degraded pcie-replay-rate"]
        );
    }

    #[test]
    fn a_first_sample_is_taken_as_it_is() {
        let o = unknown(Unsupported::ECC);
        let s = settle(&o, None);
        assert_eq!((s.now, s.prev), (o, None));
    }
}
