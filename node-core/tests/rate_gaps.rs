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
    rate_degraded_on(reason, count, unknown, until).map(|(t, _)| t)
}

/// [`rate_degraded`], with the evidence given.
fn rate_degraded_on(
    reason: ReasonCode,
    count: impl Fn(u64, &mut Observation),
    unknown: impl Fn(u64) -> Unsupported,
    until: u64,
) -> Option<(u64, String)> {
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
            return Some((t, s.evidence.clone()));
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

/// A rate just above the minute's limit whose reads fail but for one
/// every so often: each read after a short gap (up to 30 s) whose count
/// across it is above the limit counts the gap as held. The streak was
/// paused over every failed read, so 101 corrected ECC errors a minute
/// with every other read failing was never degraded, and 105 a minute
/// read once every 10 s was at 360 s (read throughout: 120 s; now 224 s
/// and 120 s).
#[test]
fn a_rate_just_above_the_limit_read_only_now_and_then_is_degraded() {
    type Case = (ReasonCode, Unsupported, u64, u64, u64);
    // (reason, group, errors a minute, one read in every n s, degraded by)
    let cases: [Case; 4] = [
        (
            ReasonCode::SBE_RATE_RISING,
            Unsupported::ECC,
            105,
            10,
            180_000,
        ),
        (
            ReasonCode::SBE_RATE_RISING,
            Unsupported::ECC,
            101,
            2,
            600_000,
        ),
        (
            ReasonCode::NVLINK_ERRORS,
            Unsupported::NVLINK,
            6_300,
            10,
            180_000,
        ),
        (
            ReasonCode::NVLINK_ERRORS,
            Unsupported::NVLINK,
            6_060,
            2,
            600_000,
        ),
    ];
    for (reason, group, per_min, n, by) in cases {
        let count = move |t: u64, o: &mut Observation| {
            let v = per_min * t / 60_000;
            if group == Unsupported::ECC {
                o.sbe_volatile = v;
            } else {
                o.nvlink_crc = v;
            }
        };
        let fails = move |t: u64| Unsupported::empty().with(group, (t / 1_000) % n != 0);
        let found = rate_degraded(reason, count, fails, 1_800_000);
        assert!(
            found.is_some_and(|t| t <= by),
            "{reason}, {per_min}/min, one read in {n} s: {found:?}"
        );
    }
}

/// At the limit, read only now and then, the count across no gap is
/// above it: never degraded.
#[test]
fn a_rate_at_the_limit_read_only_now_and_then_is_not_degraded() {
    for n in [2u64, 10, 30] {
        let count = |t: u64, o: &mut Observation| o.sbe_volatile = 100 * t / 60_000;
        let fails = move |t: u64| Unsupported::empty().with(Unsupported::ECC, (t / 1_000) % n != 0);
        let found = rate_degraded(ReasonCode::SBE_RATE_RISING, count, fails, 1_800_000);
        assert_eq!(found, None, "100/min, one read in {n} s");
    }
}

/// A storm the reads prove (300 corrected ECC errors a minute, or 300
/// NVLink CRC errors a second) whose reads then fail for good, from 62 s:
/// the least count the reads prove, the newest read's value held, keeps
/// the minute above the limit past the sustain, so it is degraded as if
/// read (81 s). The streak grew on those samples but none was raised.
#[test]
fn a_storm_the_reads_prove_is_degraded_when_the_reads_then_fail_for_good() {
    type Storm = (ReasonCode, Unsupported, fn(u64, &mut Observation));
    let storms: [Storm; 2] = [
        (ReasonCode::SBE_RATE_RISING, Unsupported::ECC, |t, o| {
            o.sbe_volatile = 300 * t / 60_000
        }),
        (ReasonCode::NVLINK_ERRORS, Unsupported::NVLINK, |t, o| {
            o.nvlink_crc = 300 * t / 1_000
        }),
    ];
    for (reason, group, count) in storms {
        let fails = move |t: u64| Unsupported::empty().with(group, t >= 62_000);
        let found = rate_degraded_on(reason, count, fails, 400_000);
        assert!(
            found
                .as_ref()
                .is_some_and(|(t, why)| (80_000..=82_000).contains(t) && why.contains(" at least ")),
            "{reason}: {found:?}"
        );
    }
}
