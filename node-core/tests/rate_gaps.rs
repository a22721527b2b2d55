//! The rate rules across samples that do not know a counter: failed
//! reads of corrected ECC and NVLink CRC counters (read every period),
//! judged only on what the reads before and after the gap prove, and
//! missed samples (a host stall), judged as failed reads of every rate.

use loopwarden_protocol::{HealthState, ReasonCode, TimestampMs, Unsupported};
use node_core::health::{HealthEngine, Limits, Observation, Policy};

/// When GPU 0 is degraded for `reason`, sampled every second, its
/// counters set by `count(ms, o)` and the counter groups `unknown(ms)`
/// not known (their fields zeros, as a failed read sends them); `None`:
/// not before `until` (ms).
fn rate_degraded(
    reason: ReasonCode,
    count: impl Fn(u64, &mut Observation),
    unknown: impl Fn(u64) -> Unsupported,
    until: u64,
) -> Option<u64> {
    let limits = Limits {
        max_operating_c: 87.0,
    };
    let mut e = HealthEngine::new(1, limits, Policy::default(), TimestampMs(0));
    for t in (0..until).step_by(1_000) {
        let mut o = Observation::default();
        count(t, &mut o);
        o.unknown = unknown(t);
        if o.unknown.contains(Unsupported::ECC) {
            o.sbe_volatile = 0;
        }
        if o.unknown.contains(Unsupported::NVLINK) {
            o.nvlink_crc = 0;
        }
        e.sample(TimestampMs(t), 0, &o);
        let s = e.status(0).expect("GPU 0");
        if s.state == HealthState::Degraded && s.reason == reason {
            return Some(t);
        }
    }
    None
}

/// Two bursts just above the minute's limit (101 corrected ECC errors,
/// 6,001 NVLink CRC errors) 119 s apart, each held for 59 s of its
/// 60 s sustain: read throughout, two separate streaks, never degraded.
/// With the reads failing from 62 to 120 s, between the bursts, the
/// streak of the first was carried across the gap (up to 60 s since the
/// last read, the slow counters' grace) and taken on by the second:
/// degraded at 121 s for a rate whose minutes, read, fell to none.
#[test]
fn a_gap_of_failed_reads_between_two_bursts_does_not_join_them_into_one_streak() {
    type Burst = (ReasonCode, Unsupported, fn(u64, &mut Observation));
    let bursts: [Burst; 2] = [
        (ReasonCode::SBE_RATE_RISING, Unsupported::ECC, |t, o| {
            o.sbe_volatile = 101 * u64::from(t >= 1_500) + 101 * u64::from(t >= 120_500)
        }),
        (ReasonCode::NVLINK_ERRORS, Unsupported::NVLINK, |t, o| {
            o.nvlink_crc = 6_001 * u64::from(t >= 1_500) + 6_001 * u64::from(t >= 120_500)
        }),
    ];
    for (reason, group, count) in bursts {
        let read = rate_degraded(reason, count, |_| Unsupported::empty(), 400_000);
        assert_eq!(read, None, "{reason}, read throughout");
        let gap = |t: u64| Unsupported::empty().with(group, (62_000..=120_000).contains(&t));
        let found = rate_degraded(reason, count, gap, 400_000);
        assert_eq!(found, None, "{reason}, reads failing from 62 to 120 s");
    }
}

/// A host stall (both GPUs missing their samples from 30 to 150 s) in a
/// PCIe replay storm (24/min on GPU 0, from the start) counts towards the
/// 2-minute sustain only as a gap of failed reads does: up to 60 s since
/// the last read, not the stall's 120 s. Missed samples did not pause the
/// streak, and the first sample after the stall found it 128 s old and
/// degraded the GPU at once (151 s).
#[test]
fn a_host_stall_does_not_lengthen_a_rate_streak() {
    let limits = Limits {
        max_operating_c: 87.0,
    };
    let mut e = HealthEngine::new(2, limits, Policy::default(), TimestampMs(0));
    let mut found = None;
    for t in (0..400_000).step_by(1_000) {
        for gpu in 0..2u8 {
            if (31_000..=150_000).contains(&t) {
                e.missed(TimestampMs(t), gpu);
                continue;
            }
            let mut o = Observation {
                temp: 60.0,
                power: 300.0,
                power_limit: 700.0,
                sm_clock: 1980.0,
                util: 90.0,
                ..Observation::default()
            };
            if gpu == 0 {
                o.pcie_replay = 24 * t / 60_000;
            }
            e.sample(TimestampMs(t), gpu, &o);
        }
        let s = e.status(0).expect("GPU 0");
        if s.state == HealthState::Degraded && s.reason == ReasonCode::PCIE_REPLAY_RATE {
            found = Some(t);
            break;
        }
    }
    // The streak starts at 23 s (9 replays in the minute), 7 s read
    // before the stall and 60 s across it: 53 s more after it.
    assert!(
        found.is_some_and(|t| (200_000..=210_000).contains(&t)),
        "{found:?}"
    );
}
